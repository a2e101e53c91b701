//! How stored objects go on the wire: as stored, converted to the version the client asked for, or
//! projected to `PartialObjectMetadata` when the client's `Accept` asks for it. List bodies and watch
//! events are assembled from the stored bytes, so a LIST of 50,000 pods serialises nothing.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::object::Stored;
use crate::registry::ResourceInfo;

/// What form objects are sent in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Projection {
    /// The whole object.
    #[default]
    Full,
    /// `meta.k8s.io/v1` `PartialObjectMetadata`: only `metadata`.
    Metadata,
}

impl Projection {
    /// The projection an `Accept` header asks for.
    pub(crate) fn from_accept(accept: Option<&str>) -> Self {
        match accept {
            Some(accept) if accept.contains("as=PartialObjectMetadata") => Self::Metadata,
            _ => Self::Full,
        }
    }
}

/// One object as the client wants it.
pub(crate) fn object(info: &ResourceInfo, stored: &Stored, projection: Projection) -> Bytes {
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
    }
}

/// A list body: `{"apiVersion":..,"kind":"<Kind>List","metadata":{..},"items":[..]}`.
pub(crate) fn list(
    info: &ResourceInfo,
    items: &[Arc<Stored>],
    resource_version: u64,
    continue_token: Option<&str>,
    remaining: Option<usize>,
    projection: Projection,
) -> Bytes {
    let (api_version, kind) = match projection {
        Projection::Full => (info.api_version(), info.list_kind.clone()),
        Projection::Metadata => (
            "meta.k8s.io/v1".to_owned(),
            "PartialObjectMetadataList".to_owned(),
        ),
    };
    let mut metadata = json!({"resourceVersion": resource_version.to_string()});
    if let Some(token) = continue_token {
        metadata["continue"] = Value::from(token);
    }
    if let Some(remaining) = remaining {
        metadata["remainingItemCount"] = Value::from(remaining);
    }
    let head = format!(
        "{{\"apiVersion\":{},\"kind\":{},\"metadata\":{},\"items\":[",
        Value::from(api_version),
        Value::from(kind),
        metadata
    );
    let size: usize = items.iter().map(|i| i.json.len() + 1).sum();
    let mut body = Vec::with_capacity(head.len() + size + 2);
    body.extend_from_slice(head.as_bytes());
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&object(info, item, projection));
    }
    body.extend_from_slice(b"]}");
    Bytes::from(body)
}

/// A BOOKMARK event line; `initial_end` marks the end of `sendInitialEvents`.
pub(crate) fn bookmark(
    info: &ResourceInfo,
    resource_version: u64,
    initial_end: bool,
    projection: Projection,
) -> Bytes {
    let (api_version, kind) = match projection {
        Projection::Full => (info.api_version(), info.kind.clone()),
        Projection::Metadata => ("meta.k8s.io/v1".to_owned(), "PartialObjectMetadata".to_owned()),
    };
    let mut metadata = json!({"resourceVersion": resource_version.to_string(), "creationTimestamp": null});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let object = json!({"kind": kind, "apiVersion": api_version, "metadata": metadata});
    crate::store::event_line("BOOKMARK", &serde_json::to_vec(&object).unwrap_or_default())
}

/// An ERROR event line carrying a `Status`.
pub(crate) fn error_line(error: &ApiError) -> Bytes {
    crate::store::event_line("ERROR", &serde_json::to_vec(&error.status()).unwrap_or_default())
}
