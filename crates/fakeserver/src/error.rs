//! Errors the way the Kubernetes API server reports them: a `metav1.Status` with an HTTP code, a `reason`
//! that clients branch on (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `Expired`, ...), and for
//! invalid objects one cause per field.
//!
//! Messages copy the real server's wording, because people and tools match on them.

use std::fmt;

use gpuop_api::field::FieldError;
use serde_json::{Value, json};

/// The resource an error is about, printed the way the API server prints it: `pods`, `daemonsets.apps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupResource {
    /// API group, empty for the core group.
    pub group: String,
    /// Plural resource name.
    pub resource: String,
}

impl GroupResource {
    /// A group and a plural resource name.
    pub fn new(group: impl Into<String>, resource: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            resource: resource.into(),
        }
    }
}

impl fmt::Display for GroupResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_qualified(f, &self.resource, &self.group)
    }
}

/// Writes `name` qualified by `group` as the API server prints it: `pods`, `clusterpolicies.nvidia.com`.
fn write_qualified(f: &mut fmt::Formatter<'_>, name: &str, group: &str) -> fmt::Result {
    if group.is_empty() {
        f.write_str(name)
    } else {
        write!(f, "{name}.{group}")
    }
}

/// A kind qualified by its group, printed as the API server does: `Pod`, `ClusterPolicy.nvidia.com`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupKind {
    /// API group, empty for the core group.
    pub group: String,
    /// Kind.
    pub kind: String,
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_qualified(f, &self.kind, &self.group)
    }
}

/// One cause of a failure, as in `Status.details.causes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// Machine-readable reason: `FieldValueRequired`, `FieldManagerConflict`, ...
    pub reason: String,
    /// What is wrong, without the field path.
    pub message: String,
    /// The field, e.g. `spec.replicas` (or `.spec.replicas` for apply conflicts, as the server writes it).
    pub field: String,
}

impl Cause {
    /// The cause for one invalid field, worded like the API server.
    pub fn from_field_error(error: &FieldError) -> Self {
        let full = error.apiserver_message();
        let prefix = format!("{}: ", error.path);
        let message = full
            .strip_prefix(&prefix)
            .map_or_else(|| full.clone(), str::to_owned);
        Self {
            reason: error.cause_reason().to_owned(),
            message,
            field: error.path.clone(),
        }
    }

    fn full_message(&self) -> String {
        if self.field.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.field, self.message)
        }
    }
}

/// An error answered to a client, carrying everything its `Status` needs.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 404: the object does not exist.
    #[error("{resource} \"{name}\" not found")]
    NotFound {
        /// What was looked for.
        resource: GroupResource,
        /// Its name.
        name: String,
    },
    /// 404: no such path or resource type.
    #[error("the server could not find the requested resource")]
    NoSuchPath,
    /// 409: an object with that name exists already.
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists {
        /// The resource.
        resource: GroupResource,
        /// The name taken.
        name: String,
    },
    /// 409: a precondition (resourceVersion, uid) did not hold, or a state conflict.
    #[error("Operation cannot be fulfilled on {resource} \"{name}\": {detail}")]
    Conflict {
        /// The resource.
        resource: GroupResource,
        /// The object's name.
        name: String,
        /// Why, e.g. "the object has been modified; please apply your changes to the latest version and try again".
        detail: String,
    },
    /// 409: server-side apply would take fields another manager owns.
    #[error("{message}")]
    ApplyConflict {
        /// The resource.
        resource: GroupResource,
        /// The object's name.
        name: String,
        /// "Apply failed with N conflict(s): ...".
        message: String,
        /// One cause per conflicting field, naming the manager.
        causes: Vec<Cause>,
    },
    /// 422: the object is invalid; one cause per field.
    #[error("{}", invalid_message(kind, name, causes))]
    Invalid {
        /// The object's kind.
        kind: GroupKind,
        /// The object's name.
        name: String,
        /// Every problem found.
        causes: Vec<Cause>,
    },
    /// 422 without field causes: a JSON patch that does not apply, for instance.
    #[error("{0}")]
    Unprocessable(String),
    /// 400: the request itself is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// 403: the request is refused in this state.
    #[error("{message}")]
    Forbidden {
        /// The resource.
        resource: GroupResource,
        /// The object's name, if any.
        name: String,
        /// Why.
        message: String,
    },
    /// 401: the request carries no credentials the server accepts.
    #[error("Unauthorized")]
    Unauthorized,
    /// 405: the verb is not supported on this path.
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    /// 406: the client accepts no media type the server can produce.
    #[error(
        "only the following media types are accepted: application/json, application/yaml, \
         application/vnd.kubernetes.protobuf"
    )]
    NotAcceptable,
    /// 413: the body is larger than the limit (in bytes), worded as `NewRequestEntityTooLargeError`.
    #[error("Request entity too large: limit is {0}")]
    TooLarge(usize),
    /// 415: the body's media type is not supported for this request.
    #[error("the body of the request was in an unknown format - accepted media types include: {accepted}")]
    UnsupportedMediaType {
        /// The media types that would be accepted.
        accepted: String,
    },
    /// 410: the resource version asked for is no longer available.
    #[error("{0}")]
    Expired(String),
    /// 429: the client should retry later.
    #[error("{message}")]
    TooManyRequests {
        /// Why.
        message: String,
        /// Seconds to wait, sent as `Retry-After`.
        retry_after_seconds: Option<u64>,
        /// Causes (e.g. a disruption budget).
        causes: Vec<Cause>,
    },
    /// 500: the server failed.
    #[error("{0}")]
    Internal(String),
    /// 500 with no reason: an error the API server passes on unclassified (reason `Unknown`, sent empty),
    /// such as server-side apply's "failed to create typed patch object".
    #[error("{0}")]
    Unclassified(String),
    /// 504: the server could not answer in time.
    #[error("{0}")]
    Timeout(String),
}

fn invalid_message(kind: &GroupKind, name: &str, causes: &[Cause]) -> String {
    let mut messages: Vec<String> = Vec::new();
    for cause in causes {
        let message = cause.full_message();
        if !messages.contains(&message) {
            messages.push(message);
        }
    }
    match messages.as_slice() {
        [] => format!("{kind} \"{name}\" is invalid"),
        [one] => format!("{kind} \"{name}\" is invalid: {one}"),
        many => format!("{kind} \"{name}\" is invalid: [{}]", many.join(", ")),
    }
}

impl ApiError {
    /// A 422 for an object with the given field problems.
    pub fn invalid(kind: GroupKind, name: impl Into<String>, errors: &[FieldError]) -> Self {
        Self::Invalid {
            kind,
            name: name.into(),
            causes: errors.iter().map(Cause::from_field_error).collect(),
        }
    }

    /// A 422 from causes already worded.
    pub fn invalid_causes(kind: GroupKind, name: impl Into<String>, causes: Vec<Cause>) -> Self {
        Self::Invalid {
            kind,
            name: name.into(),
            causes,
        }
    }

    /// The conflict answered when a write's `resourceVersion` is not the stored one.
    pub fn modified(resource: GroupResource, name: impl Into<String>) -> Self {
        Self::Conflict {
            resource,
            name: name.into(),
            detail:
                "the object has been modified; please apply your changes to the latest version and try again"
                    .to_owned(),
        }
    }

    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            Self::NotFound { .. } | Self::NoSuchPath => 404,
            Self::AlreadyExists { .. } | Self::Conflict { .. } | Self::ApplyConflict { .. } => 409,
            Self::Invalid { .. } | Self::Unprocessable(_) => 422,
            Self::BadRequest(_) => 400,
            Self::Forbidden { .. } => 403,
            Self::Unauthorized => 401,
            Self::MethodNotAllowed => 405,
            Self::NotAcceptable => 406,
            Self::TooLarge(_) => 413,
            Self::UnsupportedMediaType { .. } => 415,
            Self::Expired(_) => 410,
            Self::TooManyRequests { .. } => 429,
            Self::Internal(_) | Self::Unclassified(_) => 500,
            Self::Timeout(_) => 504,
        }
    }

    /// The `Status.reason` clients branch on.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } | Self::NoSuchPath => "NotFound",
            Self::AlreadyExists { .. } => "AlreadyExists",
            Self::Conflict { .. } | Self::ApplyConflict { .. } => "Conflict",
            Self::Invalid { .. } | Self::Unprocessable(_) => "Invalid",
            Self::BadRequest(_) => "BadRequest",
            Self::Forbidden { .. } => "Forbidden",
            Self::Unauthorized => "Unauthorized",
            Self::MethodNotAllowed => "MethodNotAllowed",
            Self::NotAcceptable => "NotAcceptable",
            Self::TooLarge(_) => "RequestEntityTooLarge",
            Self::UnsupportedMediaType { .. } => "UnsupportedMediaType",
            Self::Expired(_) => "Expired",
            Self::TooManyRequests { .. } => "TooManyRequests",
            Self::Internal(_) => "InternalError",
            Self::Unclassified(_) => "",
            Self::Timeout(_) => "Timeout",
        }
    }

    /// Seconds the client should wait before retrying, if any.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::TooManyRequests {
                retry_after_seconds, ..
            } => *retry_after_seconds,
            _ => None,
        }
    }

    /// The `metav1.Status` object for this error.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        if self.reason().is_empty() {
            // Go's `omitempty`: an unclassified error has no reason at all.
            status.as_object_mut().map(|s| s.remove("reason"));
        }
        let details = match self {
            Self::NotFound { resource, name }
            | Self::AlreadyExists { resource, name }
            | Self::Conflict { resource, name, .. }
            | Self::Forbidden { resource, name, .. } => Some(resource_details(resource, name, &[])),
            // kube-apiserver names neither the object nor its kind in an apply conflict's details.
            Self::ApplyConflict { causes, .. } => Some(json!({ "causes": causes_json(causes) })),
            Self::Invalid { kind, name, causes } => {
                let mut details = json!({"name": name, "group": kind.group, "kind": kind.kind});
                omit_empty(&mut details);
                details["causes"] = causes_json(causes);
                Some(details)
            }
            // A path no resource serves, or a method it does not take: details with nothing in them.
            Self::NoSuchPath | Self::MethodNotAllowed | Self::Unprocessable(_) => Some(json!({})),
            Self::TooManyRequests {
                retry_after_seconds,
                causes,
                ..
            } => {
                let mut details = json!({});
                if let Some(seconds) = retry_after_seconds {
                    details["retryAfterSeconds"] = json!(seconds);
                }
                if !causes.is_empty() {
                    details["causes"] = causes_json(causes);
                }
                Some(details)
            }
            _ => None,
        };
        if let Some(details) = details {
            status["details"] = details;
        }
        status
    }
}

fn resource_details(resource: &GroupResource, name: &str, causes: &[Cause]) -> Value {
    let mut details = json!({"name": name, "group": resource.group, "kind": resource.resource});
    omit_empty(&mut details);
    if !causes.is_empty() {
        details["causes"] = causes_json(causes);
    }
    details
}

/// Go's `omitempty` on `StatusDetails`: an empty name, group or kind is left out (a Forbidden for a
/// collection has no name, one for a path no kind either).
fn omit_empty(details: &mut Value) {
    if let Some(fields) = details.as_object_mut() {
        fields.retain(|_, value| value.as_str().is_none_or(|text| !text.is_empty()));
    }
}

fn causes_json(causes: &[Cause]) -> Value {
    Value::Array(
        causes
            .iter()
            .map(|cause| {
                let mut cause =
                    json!({"reason": cause.reason, "message": cause.message, "field": cause.field});
                omit_empty(&mut cause);
                cause
            })
            .collect(),
    )
}

/// A successful `Status`, as answered by deletes that do not return the object.
pub fn success_status(details: Option<Value>) -> Value {
    let mut status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"});
    if let Some(details) = details {
        status["details"] = details;
    }
    status
}

/// The `Status` an eviction or a binding is answered with: created, with its code.
pub fn created_status() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_names_the_qualified_resource() {
        let error = ApiError::NotFound {
            resource: GroupResource::new("apps", "daemonsets"),
            name: "x".into(),
        };
        assert_eq!(error.to_string(), r#"daemonsets.apps "x" not found"#);
        let status = error.status();
        assert_eq!(status["code"], 404);
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(
            status["details"],
            json!({"name": "x", "group": "apps", "kind": "daemonsets"})
        );
    }

    #[test]
    fn invalid_lists_every_field_once_and_brackets_only_many() {
        let kind = GroupKind {
            group: "nvidia.com".into(),
            kind: "ClusterPolicy".into(),
        };
        let one = ApiError::invalid(kind.clone(), "p", &[FieldError::required("spec.driver")]);
        assert_eq!(
            one.to_string(),
            r#"ClusterPolicy.nvidia.com "p" is invalid: spec.driver: Required value"#
        );
        let two = ApiError::invalid(
            kind,
            "p",
            &[
                FieldError::required("spec.driver"),
                FieldError::unsupported("spec.mode", "x", &["a", "b"]),
            ],
        );
        assert_eq!(
            two.to_string(),
            r#"ClusterPolicy.nvidia.com "p" is invalid: [spec.driver: Required value, spec.mode: Unsupported value: "x": supported values: "a", "b"]"#
        );
        let status = two.status();
        assert_eq!(status["code"], 422);
        assert_eq!(status["details"]["kind"], "ClusterPolicy");
        assert_eq!(
            status["details"]["causes"][1],
            json!({"reason": "FieldValueNotSupported", "message": r#"Unsupported value: "x": supported values: "a", "b""#, "field": "spec.mode"})
        );
    }
}
