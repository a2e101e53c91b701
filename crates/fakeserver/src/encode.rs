//! How stored objects go on the wire: as stored, converted to the version the client asked for, or
//! projected to `PartialObjectMetadata` or printed as a `Table` when the client's `Accept` asks for it. List bodies and watch
//! events are assembled from the stored bytes, so a LIST of 50,000 pods serialises nothing.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::clock::Clock;
use crate::error::ApiError;
use crate::object::Stored;
use crate::registry::ResourceInfo;
use crate::table::{self, IncludeObject, TableOptions};

/// What form objects are sent in.
#[derive(Clone, Debug, Default)]
pub(crate) enum Projection {
    /// The whole object.
    #[default]
    Full,
    /// `meta.k8s.io/v1` `PartialObjectMetadata`: only `metadata`.
    Metadata,
    /// `meta.k8s.io` `Table` (of this version): what `kubectl get` prints.
    Table(&'static str, TableOptions),
}

impl Projection {
    /// The form the `Accept` header asks for: its media ranges in order, the first this server can give
    /// (a `Table` or `PartialObjectMetadata` of `meta.k8s.io` `v1` or `v1beta1`, plain JSON or YAML);
    /// 406 when it can give none. `includeObject` says what a Table's rows carry.
    pub(crate) fn from_request(
        accept: Option<&str>,
        include_object: Option<&str>,
        clock: &Arc<dyn Clock>,
    ) -> Result<Self, ApiError> {
        let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
            return Ok(Self::Full);
        };
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default();
            let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
            let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
            let structured = matches!(
                media,
                "application/json" | "application/yaml" | "*/*" | "application/*"
            );
            if !structured {
                continue;
            }
            let version = match param("v") {
                Some("v1") => "v1",
                Some("v1beta1") => "v1beta1",
                _ => "",
            };
            match param("as") {
                None => return Ok(Self::Full),
                Some("Table") if param("g") == Some("meta.k8s.io") && !version.is_empty() => {
                    let include = IncludeObject::parse(include_object).map_err(|message| {
                        ApiError::BadRequest(format!("Unable to convert to Table as requested: {message}"))
                    })?;
                    return Ok(Self::Table(
                        version,
                        TableOptions {
                            include,
                            clock: clock.clone(),
                        },
                    ));
                }
                Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                    if param("g") == Some("meta.k8s.io") && !version.is_empty() =>
                {
                    return Ok(Self::Metadata);
                }
                Some(_) => {}
            }
        }
        Err(ApiError::NotAcceptable)
    }

    /// Whether objects go as stored.
    pub(crate) fn is_full(&self) -> bool {
        matches!(self, Self::Full)
    }
}

fn table_bytes(table: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(table).unwrap_or_default())
}

/// A Table's `apiVersion`, of the version asked for.
fn table_version(table: &mut Value, version: &str) {
    table["apiVersion"] = Value::from(format!("meta.k8s.io/{version}"));
}

/// One object as the client wants it.
pub(crate) fn object(info: &ResourceInfo, stored: &Stored, projection: &Projection) -> Bytes {
    object_in_stream(info, stored, projection, true)
}

/// One object as [`object`] gives it; a Table without its column definitions unless `with_columns`
/// (a watch sends them with its first event only).
pub(crate) fn object_in_stream(
    info: &ResourceInfo,
    stored: &Stored,
    projection: &Projection,
    with_columns: bool,
) -> Bytes {
    match projection {
        Projection::Full if stored.meta.api_version == info.api_version() => stored.json.clone(),
        Projection::Full => {
            // Custom resources stored at another version: the "None" conversion changes only apiVersion.
            let mut value = stored.value();
            value["apiVersion"] = Value::from(info.api_version());
            Bytes::from(serde_json::to_vec(&value).unwrap_or_default())
        }
        Projection::Metadata => {
            let value = stored.value();
            let partial = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": value.get("metadata").cloned().unwrap_or_default(),
            });
            Bytes::from(serde_json::to_vec(&partial).unwrap_or_default())
        }
        Projection::Table(version, options) => {
            let metadata = json!({"resourceVersion": stored.meta.resource_version.to_string()});
            let mut table = table::table(info, &[stored.value()], metadata, options, with_columns);
            table_version(&mut table, version);
            table_bytes(&table)
        }
    }
}

/// A list body: `{"apiVersion":..,"kind":"<Kind>List","metadata":{..},"items":[..]}`.
pub(crate) fn list(
    info: &ResourceInfo,
    items: &[Arc<Stored>],
    resource_version: u64,
    continue_token: Option<&str>,
    remaining: Option<usize>,
    projection: &Projection,
) -> Bytes {
    let mut metadata = json!({"resourceVersion": resource_version.to_string()});
    if let Some(token) = continue_token {
        metadata["continue"] = Value::from(token);
    }
    if let Some(remaining) = remaining {
        metadata["remainingItemCount"] = Value::from(remaining);
    }
    let (api_version, kind) = match projection {
        Projection::Full => (info.api_version(), info.list_kind.clone()),
        Projection::Metadata => (
            "meta.k8s.io/v1".to_owned(),
            "PartialObjectMetadataList".to_owned(),
        ),
        Projection::Table(version, options) => {
            let objects: Vec<Value> = items.iter().map(|item| item.value()).collect();
            let mut table = table::table(info, &objects, metadata, options, true);
            table_version(&mut table, version);
            return table_bytes(&table);
        }
    };
    let head = format!(
        "{{\"apiVersion\":{},\"kind\":{},\"metadata\":{},\"items\":[",
        Value::from(api_version),
        Value::from(kind),
        metadata
    );
    let size: usize = items.iter().map(|i| i.json.len() + 1).sum();
    let mut body = Vec::with_capacity(head.len() + size + 2);
    body.extend_from_slice(head.as_bytes());
    // kube-apiserver lists built-in objects without their `apiVersion` and `kind` (the list says them once);
    // custom resources keep theirs.
    let type_meta = (info.custom.is_none() && matches!(projection, Projection::Full)).then(|| {
        format!(
            "{{\"apiVersion\":{},\"kind\":{},",
            Value::from(info.api_version()),
            Value::from(info.kind.as_str())
        )
    });
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        let encoded = object(info, item, projection);
        match &type_meta {
            Some(prefix) => body.extend_from_slice(&without_type_meta(&encoded, prefix)),
            None => body.extend_from_slice(&encoded),
        }
    }
    body.extend_from_slice(b"]}");
    Bytes::from(body)
}

/// An object's JSON without its leading `apiVersion` and `kind` (`prefix`, as stored objects begin), or
/// re-encoded without them where they are elsewhere.
fn without_type_meta(encoded: &[u8], prefix: &str) -> Vec<u8> {
    if let Some(rest) = encoded.strip_prefix(prefix.as_bytes()) {
        let mut out = Vec::with_capacity(rest.len() + 1);
        out.push(b'{');
        out.extend_from_slice(rest);
        return out;
    }
    match serde_json::from_slice::<Value>(encoded) {
        Ok(Value::Object(mut map)) => {
            map.remove("apiVersion");
            map.remove("kind");
            serde_json::to_vec(&map).unwrap_or_default()
        }
        _ => encoded.to_vec(),
    }
}

/// A BOOKMARK event line; `initial_end` marks the end of `sendInitialEvents`.
pub(crate) fn bookmark(
    info: &ResourceInfo,
    resource_version: u64,
    initial_end: bool,
    projection: &Projection,
    with_columns: bool,
) -> Bytes {
    // kube-apiserver v1.36 sends no `creationTimestamp: null` in a bookmark's metadata (older ones did).
    let mut metadata = json!({"resourceVersion": resource_version.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let (api_version, kind) = match projection {
        Projection::Full => (info.api_version(), info.kind.clone()),
        Projection::Metadata => ("meta.k8s.io/v1".to_owned(), "PartialObjectMetadata".to_owned()),
        // As kube-apiserver sends it: a Table of one row printed from the bookmark's empty object.
        Projection::Table(version, options) => {
            let object = json!({"metadata": metadata});
            let mut table = table::table(
                info,
                &[object],
                json!({"resourceVersion": resource_version.to_string()}),
                options,
                with_columns,
            );
            table_version(&mut table, version);
            return crate::store::event_line("BOOKMARK", &serde_json::to_vec(&table).unwrap_or_default());
        }
    };
    let object = json!({"kind": kind, "apiVersion": api_version, "metadata": metadata});
    crate::store::event_line("BOOKMARK", &serde_json::to_vec(&object).unwrap_or_default())
}

/// An ERROR event line carrying a `Status`.
pub(crate) fn error_line(error: &ApiError) -> Bytes {
    crate::store::event_line("ERROR", &serde_json::to_vec(&error.status()).unwrap_or_default())
}
