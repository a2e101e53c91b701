//! A stored object: its JSON bytes, served as they are by GET, LIST and watch without re-serialising, and the
//! few facts that selectors, garbage collection and finalizers need, read once at write time.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::json;
use crate::registry::ResourceInfo;
use crate::selector::Labels;

/// An owner reference, as garbage collection needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) uid: String,
    pub(crate) api_version: String,
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) block_owner_deletion: bool,
}

/// What is read out of an object at write time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) resource_version: u64,
    pub(crate) api_version: String,
    pub(crate) labels: Vec<(String, String)>,
    /// Field-selector values that differ from the field's zero value.
    pub(crate) fields: Vec<(String, String)>,
    pub(crate) owners: Vec<Owner>,
    pub(crate) finalizers: Vec<String>,
    pub(crate) deleting: bool,
}

/// An object as stored.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) json: Bytes,
    pub(crate) meta: Meta,
}

impl Stored {
    /// Serialises `object` (of resource `info`) and indexes it.
    pub(crate) fn new(object: &Value, info: &ResourceInfo) -> Arc<Self> {
        let mut json = serde_json::to_vec(object).unwrap_or_default();
        // A grown Vec keeps up to twice its length; a stored object lives as long as it is current or in
        // the history, so it holds only its bytes.
        json.shrink_to_fit();
        let json = Bytes::from(json);
        Arc::new(Self {
            json,
            meta: Meta::read(object, info),
        })
    }

    /// Serialises `object` inside its watch event line `{"type":"<kind>","object":<object>}\n`; the stored
    /// object's bytes are a slice of that line, so the two share one allocation.
    pub(crate) fn with_event_line(object: &Value, info: &ResourceInfo, kind: &str) -> (Arc<Self>, Bytes) {
        let mut line = Vec::with_capacity(4096);
        line.extend_from_slice(b"{\"type\":\"");
        line.extend_from_slice(kind.as_bytes());
        line.extend_from_slice(b"\",\"object\":");
        let start = line.len();
        // Writing a `Value` into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut line, object);
        let end = line.len();
        line.extend_from_slice(b"}\n");
        // The line lives as long as the change is in the history: only its bytes, not the Vec's growth room.
        line.shrink_to_fit();
        let line = Bytes::from(line);
        let stored = Arc::new(Self {
            json: line.slice(start..end),
            meta: Meta::read(object, info),
        });
        (stored, line)
    }

    /// The object as JSON.
    pub(crate) fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    /// The value of a field label, or its zero value.
    pub(crate) fn field<'a>(&'a self, info: &'a ResourceInfo, label: &str) -> Option<&'a str> {
        match label {
            "metadata.name" => Some(&self.meta.name),
            "metadata.namespace" => Some(&self.meta.namespace),
            _ => self
                .meta
                .fields
                .iter()
                .find(|(l, _)| l == label)
                .map(|(_, v)| v.as_str())
                .or_else(|| info.field_label(label).map(|f| f.absent)),
        }
    }
}

impl Labels for Stored {
    fn label(&self, key: &str) -> Option<&str> {
        self.meta.labels.label(key)
    }
}

impl Meta {
    pub(crate) fn read(object: &Value, info: &ResourceInfo) -> Self {
        let text = |pointer: &str| json::text(object, pointer).to_owned();
        let labels = json::string_entries(object, "/metadata/labels");
        let fields = info
            .field_labels
            .iter()
            .filter(|f| !f.label.starts_with("metadata."))
            .map(|f| (f.label.clone(), f.value_of(object)))
            .filter(|(label, value)| info.field_label(label).is_none_or(|f| f.absent != value))
            .collect();
        let owners = json::items(object, "/metadata/ownerReferences")
            .map(|owner| {
                let text = |pointer: &str| json::text(owner, pointer).to_owned();
                Owner {
                    uid: text("/uid"),
                    api_version: text("/apiVersion"),
                    kind: text("/kind"),
                    name: text("/name"),
                    block_owner_deletion: owner.get("blockOwnerDeletion").and_then(Value::as_bool)
                        == Some(true),
                }
            })
            .collect();
        Self {
            namespace: text("/metadata/namespace"),
            name: text("/metadata/name"),
            uid: text("/metadata/uid"),
            resource_version: text("/metadata/resourceVersion").parse().unwrap_or(0),
            api_version: text("/apiVersion"),
            labels,
            fields,
            owners,
            finalizers: json::strings(object, "/metadata/finalizers"),
            deleting: object
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|t| !t.is_null()),
        }
    }
}
