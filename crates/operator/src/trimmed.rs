//! Watched objects decoded without the parts that no decision reads, skipped unread rather than built and
//! dropped.
//!
//! A DaemonSet's status moves with every pod its controller counts, and nothing here reads it:
//! [`Statusless`] decodes an object without its `status`. Of the managed objects (every kind the operator
//! applies) only the kind and the metadata are kept: [`MetadataOnly`] reads those, where a
//! `DynamicObject` would first build its whole body as a `serde_json::Value`.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, TypeMeta};
use kube::core::DynamicResourceScope;
use kube::runtime::watcher;
use serde::de::value::{BorrowedStrDeserializer, MapAccessDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::projection::Str;

/// An object decoded without its `status`.
#[derive(Clone, Debug)]
pub struct Statusless<K>(pub K);

impl<'de, K: Deserialize<'de>> Deserialize<'de> for Statusless<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object<K>(PhantomData<K>);

        impl<'de, K: Deserialize<'de>> Visitor<'de> for Object<K> {
            type Value = Statusless<K>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                K::deserialize(MapAccessDeserializer::new(Without { map, key: "status" })).map(Statusless)
            }
        }

        deserializer.deserialize_map(Object(PhantomData))
    }
}

impl<K: kube::Resource> kube::Resource for Statusless<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

/// An object of any kind, of which only `apiVersion`, `kind` and `metadata` are read (its `data` is
/// `null`).
#[derive(Clone, Debug)]
pub struct MetadataOnly(pub DynamicObject);

impl<'de> Deserialize<'de> for MetadataOnly {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object;

        impl<'de> Visitor<'de> for Object {
            type Value = MetadataOnly;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut api_version, mut kind, mut metadata) = (None, None, None);
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    match &*key.0 {
                        "apiVersion" => api_version = Some(map.next_value::<String>()?),
                        "kind" => kind = Some(map.next_value::<String>()?),
                        "metadata" => metadata = Some(map.next_value::<ObjectMeta>()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let metadata = metadata.ok_or_else(|| de::Error::missing_field("metadata"))?;
                let types = match (api_version, kind) {
                    (Some(api_version), Some(kind)) => Some(TypeMeta { api_version, kind }),
                    _ => None,
                };
                Ok(MetadataOnly(DynamicObject {
                    types,
                    metadata,
                    data: serde_json::Value::Null,
                }))
            }
        }

        deserializer.deserialize_map(Object)
    }
}

impl kube::Resource for MetadataOnly {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::kind(dt)
    }

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::group(dt)
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::version(dt)
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::api_version(dt)
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// A watch event of the decoded type, as one of the kept type.
pub fn unwrap_event<W, K>(event: watcher::Event<W>, unwrap: fn(W) -> K) -> watcher::Event<K> {
    match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(unwrap(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(unwrap(object)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(unwrap(object)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// A map without one of its keys, whose value is skipped unread.
struct Without<A> {
    map: A,
    key: &'static str,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Without<A> {
    type Error = A::Error;

    fn next_key_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, A::Error> {
        while let Some(key) = self.map.next_key::<Str<'de>>()? {
            if key.0 == self.key {
                self.map.next_value::<IgnoredAny>()?;
                continue;
            }
            return match key.0 {
                Cow::Borrowed(key) => seed.deserialize(BorrowedStrDeserializer::new(key)),
                Cow::Owned(key) => seed.deserialize(StringDeserializer::new(key)),
            }
            .map(Some);
        }
        Ok(None)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSet;
    use serde_json::json;

    fn daemonset() -> serde_json::Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-driver-daemonset", "namespace": "gpu-operator", "resourceVersion": "7",
                         "managedFields": [{"manager": "gpu-operator", "operation": "Apply",
                                            "fieldsV1": {"f:spec": {}}}]},
            "spec": {"selector": {"matchLabels": {"app": "a"}},
                     "template": {"metadata": {"labels": {"app": "a"}},
                                  "spec": {"containers": [{"name": "c", "image": "i"}]}}},
            "status": {"currentNumberScheduled": 3, "desiredNumberScheduled": 4, "numberMisscheduled": 0,
                       "numberReady": 2}
        })
    }

    #[test]
    fn a_statusless_object_is_the_object_without_its_status() {
        let text = daemonset().to_string();
        let Statusless(lean) = serde_json::from_str::<Statusless<DaemonSet>>(&text).unwrap();
        let mut full: DaemonSet = serde_json::from_str(&text).unwrap();
        assert!(full.status.is_some());
        full.status = None;
        assert_eq!(lean, full);
    }

    #[test]
    fn a_statusless_object_still_refuses_what_its_type_refuses() {
        let mut object = daemonset();
        object["spec"]["selector"] = json!("app=a");
        let error = serde_json::from_str::<Statusless<DaemonSet>>(&object.to_string()).unwrap_err();
        assert!(error.to_string().contains("invalid type: string"), "{error}");
        // A malformed status is skipped unread, as it is not kept.
        let mut object = daemonset();
        object["status"] = json!({"numberReady": "two"});
        assert!(serde_json::from_str::<Statusless<DaemonSet>>(&object.to_string()).is_ok());
    }

    #[test]
    fn metadata_only_keeps_the_kind_and_metadata_of_any_object() {
        let text = daemonset().to_string();
        let MetadataOnly(lean) = serde_json::from_str::<MetadataOnly>(&text).unwrap();
        let full: DynamicObject = serde_json::from_str(&text).unwrap();
        assert_eq!(lean.types, full.types);
        assert_eq!(lean.metadata, full.metadata);
        assert_eq!(lean.data, serde_json::Value::Null);
        let error = serde_json::from_str::<MetadataOnly>(r#"{"kind": "DaemonSet"}"#).unwrap_err();
        assert!(error.to_string().contains("missing field `metadata`"), "{error}");
    }
}
