//! A problem with one field of an object: where it is, what is wrong, and what would be accepted.
//!
//! The same error prints two ways: for people ([`Display`](std::fmt::Display), used by `gpu-operator check`
//! and status conditions) and the way the Kubernetes API server words it
//! ([`FieldError::apiserver_message`], used by the fake API server's 422 answers).

use std::fmt;

use serde_json::Value;

/// What is wrong with a field.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldErrorKind {
    /// The field must be set.
    Required {
        /// Why it must be set here, when that is not obvious: "when repository and image are set".
        because: Option<String>,
    },
    /// The value is not one of a fixed set.
    Unsupported {
        /// The value given.
        value: Value,
        /// The values accepted.
        supported: Vec<String>,
    },
    /// The value has the wrong JSON type.
    WrongType {
        /// The value given.
        value: Value,
        /// The type accepted: `string`, `boolean`, `integer`, `number`, `object`, `array`.
        expected: String,
    },
    /// The value is not acceptable.
    Invalid {
        /// The value given.
        value: Value,
        /// What would be accepted, phrased to follow the value: "should match '^a$'", "must be at least 1".
        detail: String,
    },
    /// The field is not part of the schema; the API server would drop it without a word.
    Unknown {
        /// A known field with a similar name.
        suggestion: Option<String>,
    },
    /// A rule of the schema (`x-kubernetes-validations`) does not hold.
    Rule {
        /// JSON type of the value the rule is on (the API server names the type, not the value).
        value_type: String,
        /// The rule's message.
        message: String,
    },
    /// The field may not be set (in this combination).
    Forbidden {
        /// Why.
        detail: String,
    },
}

/// A problem with one field.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.driver.env[2].name`.
    pub path: String,
    /// What is wrong.
    pub kind: FieldErrorKind,
}

impl FieldError {
    /// The field must be set.
    pub fn required(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind: FieldErrorKind::Required { because: None },
        }
    }

    /// The field must be set, for the reason given ("when repository and image are set").
    pub fn required_because(path: impl Into<String>, because: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind: FieldErrorKind::Required {
                because: Some(because.into()),
            },
        }
    }

    /// The value is not one of `supported`.
    pub fn unsupported(path: impl Into<String>, value: impl Into<Value>, supported: &[&str]) -> Self {
        let supported = supported.iter().map(|s| (*s).to_owned()).collect();
        Self {
            path: path.into(),
            kind: FieldErrorKind::Unsupported {
                value: value.into(),
                supported,
            },
        }
    }

    /// The value has the wrong type.
    pub fn wrong_type(path: impl Into<String>, value: Value, expected: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind: FieldErrorKind::WrongType {
                value,
                expected: expected.into(),
            },
        }
    }

    /// The value is not acceptable, for the reason given.
    pub fn invalid(path: impl Into<String>, value: impl Into<Value>, detail: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind: FieldErrorKind::Invalid {
                value: value.into(),
                detail: detail.into(),
            },
        }
    }

    /// The field is unknown.
    pub fn unknown(path: impl Into<String>, suggestion: Option<String>) -> Self {
        Self {
            path: path.into(),
            kind: FieldErrorKind::Unknown { suggestion },
        }
    }

    /// The field may not be set.
    pub fn forbidden(path: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind: FieldErrorKind::Forbidden {
                detail: detail.into(),
            },
        }
    }

    /// The `reason` of this cause in a Kubernetes `Status` (`details.causes[].reason`).
    pub fn cause_reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Required { .. } => "FieldValueRequired",
            FieldErrorKind::Unsupported { .. } => "FieldValueNotSupported",
            FieldErrorKind::WrongType { .. } => "FieldValueTypeInvalid",
            FieldErrorKind::Invalid { .. } => "FieldValueInvalid",
            FieldErrorKind::Unknown { .. } | FieldErrorKind::Rule { .. } => "FieldValueInvalid",
            FieldErrorKind::Forbidden { .. } => "FieldValueForbidden",
        }
    }

    /// The message the Kubernetes API server gives for this problem.
    pub fn apiserver_message(&self) -> String {
        let path = &self.path;
        match &self.kind {
            FieldErrorKind::Required { because: None } => format!("{path}: Required value"),
            FieldErrorKind::Required {
                because: Some(because),
            } => format!("{path}: Required value: {because}"),
            FieldErrorKind::Unsupported { value, supported } => {
                let supported: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
                format!(
                    "{path}: Unsupported value: {value}: supported values: {}",
                    supported.join(", ")
                )
            }
            FieldErrorKind::WrongType { value, expected } => format!(
                "{path}: Invalid value: \"{}\": {path} in body must be of type {expected}: \"{}\"",
                json_type(value),
                json_type(value)
            ),
            FieldErrorKind::Invalid { value, detail } => {
                format!("{path}: Invalid value: {value}: {path} in body {detail}")
            }
            FieldErrorKind::Unknown { .. } => format!("{path}: Invalid value: field not declared in schema"),
            FieldErrorKind::Rule { value_type, message } => {
                format!("{path}: Invalid value: \"{value_type}\": {message}")
            }
            FieldErrorKind::Forbidden { detail } => format!("{path}: Forbidden: {detail}"),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = &self.path;
        match &self.kind {
            FieldErrorKind::Required { because: None } => write!(f, "{path}: required field is missing"),
            FieldErrorKind::Required {
                because: Some(because),
            } => write!(f, "{path}: required {because}"),
            FieldErrorKind::Unsupported { value, supported } => {
                write!(f, "{path}: {value} is not one of [{}]", supported.join(", "))
            }
            FieldErrorKind::WrongType { value, expected } => {
                write!(
                    f,
                    "{path}: {value} is {}, expected {}",
                    with_article(json_type(value)),
                    with_article(expected)
                )
            }
            FieldErrorKind::Invalid { value, detail } => write!(f, "{path}: {value} {detail}"),
            FieldErrorKind::Unknown { suggestion } => {
                write!(f, "{path}: unknown field; the API server would silently drop it")?;
                match suggestion {
                    Some(known) => write!(f, " (did you mean {known:?}?)"),
                    None => Ok(()),
                }
            }
            FieldErrorKind::Rule { message, .. } | FieldErrorKind::Forbidden { detail: message } => {
                write!(f, "{path}: {message}")
            }
        }
    }
}

impl std::error::Error for FieldError {}

/// The JSON type name of a value, as OpenAPI names it.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn with_article(noun: &str) -> String {
    let article = if noun.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {noun}")
}

/// Builds child paths: `spec` + `driver` = `spec.driver`, `env` + 2 = `env[2]`.
pub fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// `path[index]`.
pub fn item(path: &str, index: usize) -> String {
    format!("{path}[{index}]")
}

/// The known name closest to `unknown`, when it is close enough to be a likely typo.
pub fn closest<'a>(unknown: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let unknown_lower = unknown.to_lowercase();
    known
        .into_iter()
        .map(|candidate| {
            (
                edit_distance(&unknown_lower, &candidate.to_lowercase()),
                candidate,
            )
        })
        .filter(|(distance, candidate)| *distance <= (candidate.len().max(unknown.len()) / 3).max(1))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // rows[i][j]: distance between a[..i] and b[..j].
    let mut rows = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn people_and_the_api_server_get_their_own_wording() {
        let error = FieldError::unsupported("spec.mig.strategy", "double", &["none", "single", "mixed"]);
        assert_eq!(
            error.to_string(),
            r#"spec.mig.strategy: "double" is not one of [none, single, mixed]"#
        );
        assert_eq!(
            error.apiserver_message(),
            r#"spec.mig.strategy: Unsupported value: "double": supported values: "none", "single", "mixed""#
        );
        let error = FieldError::wrong_type("spec.dcgm.enabled", json!("yes"), "boolean");
        assert_eq!(
            error.to_string(),
            r#"spec.dcgm.enabled: "yes" is a string, expected a boolean"#
        );
        assert_eq!(
            error.apiserver_message(),
            r#"spec.dcgm.enabled: Invalid value: "string": spec.dcgm.enabled in body must be of type boolean: "string""#
        );
        assert_eq!(
            FieldError::required("spec.gfd").apiserver_message(),
            "spec.gfd: Required value"
        );
        assert_eq!(
            FieldError::wrong_type("a", json!(1), "object").to_string(),
            "a: 1 is an integer, expected an object"
        );
    }

    #[test]
    fn unknown_fields_suggest_a_likely_typo() {
        let known = ["devicePlugin", "driver", "dcgm", "dcgmExporter", "gfd"];
        assert_eq!(closest("devicePlugn", known), Some("devicePlugin"));
        assert_eq!(closest("DevicePlugin", known), Some("devicePlugin"));
        assert_eq!(closest("drivr", known), Some("driver"));
        assert_eq!(
            closest("dcmg", known),
            Some("dcgm"),
            "a swap of neighbours is one edit"
        );
        assert_eq!(closest("somethingElse", known), None);
        let error = FieldError::unknown("spec.devicePlugn", Some("devicePlugin".into()));
        assert_eq!(
            error.to_string(),
            r#"spec.devicePlugn: unknown field; the API server would silently drop it (did you mean "devicePlugin"?)"#
        );
    }
}
