//! The field-level causes of a 422 and the name and label rules behind them, in kube-apiserver's words: what
//! validation, the registry's CRD checks and label selectors all report with. Imports nothing of the crate but
//! its error type.

use serde_json::Value;

use crate::error::Cause;

const QUALIFIED_NAME: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start \
and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is \
'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' \
or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex \
used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const DNS_SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' \
or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is \
'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start \
with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for \
validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const DNS_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and \
must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is \
'[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// `Invalid value: <value>: <detail>` at `field`.
pub(crate) fn invalid(field: &str, value: &Value, detail: impl Into<String>) -> Cause {
    Cause {
        reason: "FieldValueInvalid".into(),
        message: format!("Invalid value: {}: {}", value, detail.into()),
        field: field.into(),
    }
}

pub(crate) fn required(field: &str, detail: &str) -> Cause {
    let message = if detail.is_empty() {
        "Required value".to_owned()
    } else {
        format!("Required value: {detail}")
    };
    Cause {
        reason: "FieldValueRequired".into(),
        message,
        field: field.into(),
    }
}

/// `Forbidden: detail` at `field`.
pub(crate) fn forbidden(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden".into(),
        message: format!("Forbidden: {detail}"),
        field: field.into(),
    }
}

pub(crate) fn duplicate(field: &str, value: &Value) -> Cause {
    Cause {
        reason: "FieldValueDuplicate".into(),
        message: format!("Duplicate value: {value}"),
        field: field.into(),
    }
}

pub(crate) fn unsupported(field: &str, value: &Value, supported: &[&str]) -> Cause {
    let supported: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
    Cause {
        reason: "FieldValueNotSupported".into(),
        message: format!(
            "Unsupported value: {value}: supported values: {}",
            supported.join(", ")
        ),
        field: field.into(),
    }
}

pub(crate) fn immutable(field: &str, value: &Value) -> Cause {
    invalid(field, value, "field is immutable")
}

pub(crate) fn is_alphanumeric(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// Why `key` is not a qualified name (`[prefix/]name`, as label and annotation keys are): every reason,
/// as kube-apiserver lists them (`IsQualifiedName`).
pub(crate) fn qualified_name_problems(key: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                problems.push("prefix part must be non-empty".into());
            } else {
                problems.extend(
                    dns_subdomain_problems(prefix)
                        .into_iter()
                        .map(|p| format!("prefix part {p}")),
                );
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                QUALIFIED_NAME.trim_start_matches("name part ")
            )];
        }
    };
    if name.is_empty() {
        problems.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        problems.push("name part must be no more than 63 characters".into());
    }
    if !simple_name(name) {
        problems.push(QUALIFIED_NAME.into());
    }
    problems
}

/// The first reason `key` is not a qualified name, if it is not.
pub(crate) fn qualified_name_problem(key: &str) -> Option<String> {
    qualified_name_problems(key).into_iter().next()
}

pub(crate) fn simple_name(name: &str) -> bool {
    name.starts_with(is_alphanumeric)
        && name.ends_with(is_alphanumeric)
        && name
            .chars()
            .all(|c| is_alphanumeric(c) || matches!(c, '-' | '_' | '.'))
}

/// Why `value` is not a valid label value: every reason (`IsValidLabelValue`).
pub(crate) fn label_value_problems(value: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if value.len() > 63 {
        problems.push("must be no more than 63 characters".into());
    }
    if !value.is_empty() && !simple_name(value) {
        problems.push(LABEL_VALUE.into());
    }
    problems
}

/// Why `name` is not a DNS-1123 subdomain: every reason (`IsDNS1123Subdomain`).
pub(crate) fn dns_subdomain_problems(name: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if name.len() > 253 {
        problems.push("must be no more than 253 characters".into());
    }
    let ok = !name.is_empty()
        && name.split('.').all(|part| {
            part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        });
    if !ok {
        problems.push(DNS_SUBDOMAIN.into());
    }
    problems
}

/// The first reason `name` is not a DNS-1123 subdomain, if it is not.
pub(crate) fn dns_subdomain_problem(name: &str) -> Option<String> {
    dns_subdomain_problems(name).into_iter().next()
}

/// Why `name` is not a DNS-1123 label: every reason (`IsDNS1123Label`).
pub(crate) fn dns_label_problems(name: &str) -> Vec<String> {
    label_problems(name, |c| c.is_ascii_lowercase() || c.is_ascii_digit(), DNS_LABEL)
}

/// The first reason `name` is not a DNS-1123 label, if it is not.
pub(crate) fn dns_label_problem(name: &str) -> Option<String> {
    dns_label_problems(name).into_iter().next()
}

/// Why `name` is not a DNS-1035 label (Service names: a letter first): every reason (`IsDNS1035Label`).
pub(crate) fn dns1035_label_problems(name: &str) -> Vec<String> {
    label_problems(name, |c| c.is_ascii_lowercase(), DNS1035_LABEL)
}

/// Why `name` is not a DNS label of the kind whose first character `first` accepts and whose format
/// `rule` words: at most 63 lower-case alphanumerics or '-', ending alphanumeric. Every reason.
fn label_problems(name: &str, first: fn(char) -> bool, rule: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if name.len() > 63 {
        problems.push("must be no more than 63 characters".into());
    }
    let ok = name.starts_with(first)
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        problems.push(rule.into());
    }
    problems
}

pub(crate) fn path_segment_problem(name: &str) -> Option<String> {
    match name {
        "." | ".." => Some(format!("may not be '{name}'")),
        _ if name.contains('/') => Some("may not contain '/'".into()),
        _ if name.contains('%') => Some("may not contain '%'".into()),
        _ => None,
    }
}
