//! Request bodies in the Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`), for the
//! kinds kubectl's typed clients send that way: `kubectl create configmap|secret|namespace|serviceaccount`
//! `kubectl drain` (evictions, delete options), `kubectl create token` (TokenRequest) and
//! `kubectl auth can-i|whoami` (access reviews) and `kubectl create [cluster]role[binding]`. Answers are always JSON, which those clients accept.
//!
//! The encoding is the `k8s\0` magic, then a `runtime.Unknown` envelope (type meta, raw message); the raw
//! message is decoded with the field numbers of the Kubernetes `generated.proto` files for these kinds
//! only. Other kinds are refused with 415, naming what is accepted.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// The media type.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

#[derive(Clone, Copy, Debug)]
enum Field {
    Text(&'static str),
    Integer(&'static str),
    Flag(&'static str),
    TextMap(&'static str),
    BytesMap(&'static str),
    TextList(&'static str),
    Message(&'static str, &'static [(u64, Field)]),
    Messages(&'static str, &'static [(u64, Field)]),
}

const OWNER_REFERENCE: &[(u64, Field)] = &[
    (1, Field::Text("kind")),
    (3, Field::Text("name")),
    (4, Field::Text("uid")),
    (5, Field::Text("apiVersion")),
    (6, Field::Flag("controller")),
    (7, Field::Flag("blockOwnerDeletion")),
];

const OBJECT_META: &[(u64, Field)] = &[
    (1, Field::Text("name")),
    (2, Field::Text("generateName")),
    (3, Field::Text("namespace")),
    (5, Field::Text("uid")),
    (6, Field::Text("resourceVersion")),
    (11, Field::TextMap("labels")),
    (12, Field::TextMap("annotations")),
    (13, Field::Messages("ownerReferences", OWNER_REFERENCE)),
    (14, Field::TextList("finalizers")),
];

const OBJECT_REFERENCE: &[(u64, Field)] = &[
    (1, Field::Text("kind")),
    (2, Field::Text("namespace")),
    (3, Field::Text("name")),
    (4, Field::Text("uid")),
    (5, Field::Text("apiVersion")),
];

const PRECONDITIONS: &[(u64, Field)] = &[(1, Field::Text("uid")), (2, Field::Text("resourceVersion"))];

const DELETE_OPTIONS: &[(u64, Field)] = &[
    (1, Field::Integer("gracePeriodSeconds")),
    (2, Field::Message("preconditions", PRECONDITIONS)),
    (3, Field::Flag("orphanDependents")),
    (4, Field::Text("propagationPolicy")),
    (5, Field::TextList("dryRun")),
];

const CONFIG_MAP: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (2, Field::TextMap("data")),
    (3, Field::BytesMap("binaryData")),
    (4, Field::Flag("immutable")),
];

const SECRET: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (2, Field::BytesMap("data")),
    (3, Field::Text("type")),
    (4, Field::TextMap("stringData")),
    (5, Field::Flag("immutable")),
];

const NAMESPACE: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (2, Field::Message("spec", &[(1, Field::TextList("finalizers"))])),
];

const SERVICE_ACCOUNT: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (2, Field::Messages("secrets", OBJECT_REFERENCE)),
    (
        3,
        Field::Messages("imagePullSecrets", &[(1, Field::Text("name"))]),
    ),
    (4, Field::Flag("automountServiceAccountToken")),
];

const EVICTION: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (2, Field::Message("deleteOptions", DELETE_OPTIONS)),
];

const POLICY_RULE: &[(u64, Field)] = &[
    (1, Field::TextList("verbs")),
    (2, Field::TextList("apiGroups")),
    (3, Field::TextList("resources")),
    (4, Field::TextList("resourceNames")),
    (5, Field::TextList("nonResourceURLs")),
];

const LABEL_SELECTOR: &[(u64, Field)] = &[
    (1, Field::TextMap("matchLabels")),
    (
        2,
        Field::Messages(
            "matchExpressions",
            &[
                (1, Field::Text("key")),
                (2, Field::Text("operator")),
                (3, Field::TextList("values")),
            ],
        ),
    ),
];

/// What `kubectl create role|clusterrole` sends.
const ROLE: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (2, Field::Messages("rules", POLICY_RULE)),
    (
        3,
        Field::Message(
            "aggregationRule",
            &[(1, Field::Messages("clusterRoleSelectors", LABEL_SELECTOR))],
        ),
    ),
];

/// What `kubectl create rolebinding|clusterrolebinding` sends.
const ROLE_BINDING: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (
        2,
        Field::Messages(
            "subjects",
            &[
                (1, Field::Text("kind")),
                (2, Field::Text("apiGroup")),
                (3, Field::Text("name")),
                (4, Field::Text("namespace")),
            ],
        ),
    ),
    (
        3,
        Field::Message(
            "roleRef",
            &[
                (1, Field::Text("apiGroup")),
                (2, Field::Text("kind")),
                (3, Field::Text("name")),
            ],
        ),
    ),
];

/// What `kubectl create token` sends.
const TOKEN_REQUEST: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (
        2,
        Field::Message(
            "spec",
            &[
                (1, Field::TextList("audiences")),
                (4, Field::Integer("expirationSeconds")),
                (
                    3,
                    Field::Message(
                        "boundObjectRef",
                        &[
                            (1, Field::Text("kind")),
                            (2, Field::Text("apiVersion")),
                            (3, Field::Text("name")),
                            (4, Field::Text("uid")),
                        ],
                    ),
                ),
            ],
        ),
    ),
];

const RESOURCE_ATTRIBUTES: &[(u64, Field)] = &[
    (1, Field::Text("namespace")),
    (2, Field::Text("verb")),
    (3, Field::Text("group")),
    (4, Field::Text("version")),
    (5, Field::Text("resource")),
    (6, Field::Text("subresource")),
    (7, Field::Text("name")),
];

const NON_RESOURCE_ATTRIBUTES: &[(u64, Field)] = &[(1, Field::Text("path")), (2, Field::Text("verb"))];

/// What `kubectl auth can-i` sends.
const SELF_SUBJECT_ACCESS_REVIEW: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (
        2,
        Field::Message(
            "spec",
            &[
                (1, Field::Message("resourceAttributes", RESOURCE_ATTRIBUTES)),
                (
                    2,
                    Field::Message("nonResourceAttributes", NON_RESOURCE_ATTRIBUTES),
                ),
            ],
        ),
    ),
];

const SUBJECT_ACCESS_REVIEW: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (
        2,
        Field::Message(
            "spec",
            &[
                (1, Field::Message("resourceAttributes", RESOURCE_ATTRIBUTES)),
                (
                    2,
                    Field::Message("nonResourceAttributes", NON_RESOURCE_ATTRIBUTES),
                ),
                (3, Field::Text("user")),
                (4, Field::TextList("groups")),
                (6, Field::Text("uid")),
            ],
        ),
    ),
];

/// What `kubectl auth can-i --list` sends.
const SELF_SUBJECT_RULES_REVIEW: &[(u64, Field)] = &[
    (1, Field::Message("metadata", OBJECT_META)),
    (2, Field::Message("spec", &[(1, Field::Text("namespace"))])),
];

/// What `kubectl auth whoami` sends.
const SELF_SUBJECT_REVIEW: &[(u64, Field)] = &[(1, Field::Message("metadata", OBJECT_META))];

fn schema(api_version: &str, kind: &str) -> Option<&'static [(u64, Field)]> {
    Some(match (api_version, kind) {
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("policy/v1" | "policy/v1beta1", "Eviction") => EVICTION,
        ("meta.k8s.io/v1" | "v1", "DeleteOptions") => DELETE_OPTIONS,
        ("authentication.k8s.io/v1", "TokenRequest") => TOKEN_REQUEST,
        ("rbac.authorization.k8s.io/v1", "Role" | "ClusterRole") => ROLE,
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => ROLE_BINDING,
        ("authentication.k8s.io/v1", "SelfSubjectReview") => SELF_SUBJECT_REVIEW,
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => SELF_SUBJECT_ACCESS_REVIEW,
        ("authorization.k8s.io/v1", "SubjectAccessReview") => SUBJECT_ACCESS_REVIEW,
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => SELF_SUBJECT_RULES_REVIEW,
        _ => return None,
    })
}

fn malformed(what: &str) -> ApiError {
    ApiError::BadRequest(format!("the protobuf request body is malformed: {what}"))
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ApiError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self
                .bytes
                .split_first()
                .ok_or_else(|| malformed("truncated varint"))?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(malformed("varint too long"))
    }

    /// The next field: its number and its value (a varint, or the bytes of a length-delimited field).
    fn field(&mut self) -> Result<Option<(u64, Wire<'a>)>, ApiError> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let wire = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            2 => {
                let length = usize::try_from(self.varint()?).map_err(|_| malformed("length"))?;
                if length > self.bytes.len() {
                    return Err(malformed("truncated field"));
                }
                let (value, rest) = self.bytes.split_at(length);
                self.bytes = rest;
                Wire::Bytes(value)
            }
            1 => {
                let rest = self
                    .bytes
                    .get(8..)
                    .ok_or_else(|| malformed("truncated fixed64"))?;
                self.bytes = rest;
                Wire::Skipped
            }
            5 => {
                let rest = self
                    .bytes
                    .get(4..)
                    .ok_or_else(|| malformed("truncated fixed32"))?;
                self.bytes = rest;
                Wire::Skipped
            }
            other => return Err(malformed(&format!("unsupported wire type {other}"))),
        };
        Ok(Some((key >> 3, wire)))
    }
}

enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Skipped,
}

fn text(bytes: &[u8]) -> Result<String, ApiError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| malformed("a string is not UTF-8"))
}

fn base64(bytes: &[u8]) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).unwrap_or(Value::Null)
}

fn map_entry(bytes: &[u8]) -> Result<(String, &[u8]), ApiError> {
    let mut reader = Reader { bytes };
    let (mut key, mut value) = (String::new(), &[][..]);
    while let Some((number, wire)) = reader.field()? {
        match (number, wire) {
            (1, Wire::Bytes(bytes)) => key = text(bytes)?,
            (2, Wire::Bytes(bytes)) => value = bytes,
            _ => {}
        }
    }
    Ok((key, value))
}

fn message(bytes: &[u8], schema: &[(u64, Field)]) -> Result<Map<String, Value>, ApiError> {
    let mut out = Map::new();
    let mut reader = Reader { bytes };
    while let Some((number, wire)) = reader.field()? {
        let Some((_, field)) = schema.iter().find(|(n, _)| *n == number) else {
            continue;
        };
        match (*field, wire) {
            (Field::Text(name), Wire::Bytes(bytes)) => {
                let value = text(bytes)?;
                // Non-pointer strings are always encoded; Go's JSON would omit the empty ones.
                if !value.is_empty() {
                    out.insert(name.into(), Value::from(value));
                }
            }
            (Field::Integer(name), Wire::Varint(value)) => {
                out.insert(name.into(), Value::from(value as i64));
            }
            (Field::Flag(name), Wire::Varint(value)) => {
                out.insert(name.into(), Value::from(value != 0));
            }
            (Field::TextMap(name), Wire::Bytes(bytes)) => {
                let (key, value) = map_entry(bytes)?;
                let map = out.entry(name).or_insert_with(|| Value::Object(Map::new()));
                map[key] = Value::from(text(value)?);
            }
            (Field::BytesMap(name), Wire::Bytes(bytes)) => {
                let (key, value) = map_entry(bytes)?;
                let map = out.entry(name).or_insert_with(|| Value::Object(Map::new()));
                map[key] = base64(value);
            }
            (Field::TextList(name), Wire::Bytes(bytes)) => {
                let list = out.entry(name).or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(items) = list {
                    items.push(Value::from(text(bytes)?));
                }
            }
            (Field::Message(name, inner), Wire::Bytes(bytes)) => {
                out.insert(name.into(), Value::Object(message(bytes, inner)?));
            }
            (Field::Messages(name, inner), Wire::Bytes(bytes)) => {
                let list = out.entry(name).or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(items) = list {
                    items.push(Value::Object(message(bytes, inner)?));
                }
            }
            _ => return Err(malformed(&format!("field {number} has an unexpected wire type"))),
        }
    }
    Ok(out)
}

/// Decodes a protobuf request body into the JSON object it encodes.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let envelope = body
        .strip_prefix(b"k8s\0")
        .ok_or_else(|| malformed("missing the k8s magic prefix"))?;
    let mut reader = Reader { bytes: envelope };
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    while let Some((number, wire)) = reader.field()? {
        match (number, wire) {
            (1, Wire::Bytes(type_meta)) => {
                let meta = message(
                    type_meta,
                    &[(1, Field::Text("apiVersion")), (2, Field::Text("kind"))],
                )?;
                api_version = meta
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                kind = meta
                    .get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
            }
            (2, Wire::Bytes(bytes)) => raw = bytes,
            _ => {}
        }
    }
    let schema = schema(&api_version, &kind).ok_or_else(|| ApiError::UnsupportedMediaType {
        accepted: format!(
            "application/json, application/yaml ({MEDIA_TYPE} only for ConfigMap, Secret, Namespace, \
                           ServiceAccount, Eviction, DeleteOptions, TokenRequest, RBAC objects and access \
                           reviews, not \
                           {api_version} {kind})"
        ),
    })?;
    let mut object = message(raw, schema)?;
    if kind != "DeleteOptions" {
        object.insert("apiVersion".into(), Value::from(api_version));
        object.insert("kind".into(), Value::from(kind));
    }
    Ok(Value::Object(object))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3 | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    /// What `kubectl create configmap x --from-literal=a=b` sends, byte for byte.
    fn kubectl_configmap() -> Vec<u8> {
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let metadata = [
            field(1, b"x"),
            field(2, b""),
            field(3, b""),
            vec![0x38, 0],
            field(8, b""),
        ]
        .concat();
        let data_entry = [field(1, b"a"), field(2, b"b")].concat();
        let raw = [field(1, &metadata), field(2, &data_entry)].concat();
        [
            b"k8s\0".to_vec(),
            field(1, &type_meta),
            field(2, &raw),
            field(3, b""),
            field(4, b""),
        ]
        .concat()
    }

    #[test]
    fn a_kubectl_configmap_decodes_to_its_json() {
        assert_eq!(
            decode(&kubectl_configmap()).expect("decodes"),
            json!({"metadata": {"name": "x"}, "data": {"a": "b"}, "apiVersion": "v1", "kind": "ConfigMap"})
        );
    }

    #[test]
    fn other_kinds_and_garbage_are_refused() {
        let type_meta = [field(1, b"apps/v1"), field(2, b"Deployment")].concat();
        let deployment = [b"k8s\0".to_vec(), field(1, &type_meta)].concat();
        assert_eq!(decode(&deployment).map_err(|e| e.code()), Err(415));
        assert_eq!(decode(b"{}").map_err(|e| e.code()), Err(400));
        let truncated = &kubectl_configmap()[..20];
        assert_eq!(decode(truncated).map_err(|e| e.code()), Err(400));
    }
}
