//! Label selectors in Kubernetes' string syntax (`a=b,c!=d,e in (x,y),f notin (z),g,!h`), parsed once and
//! matched against label maps. Used for the operator's `--gpu-node-selector` on clusters without NFD.

use crate::read::Labels;
use std::fmt;
use std::str::FromStr;

/// A parsed label selector; every requirement must hold. The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` or `key==value`.
    Equals(String, String),
    /// `key!=value` (also true when the key is absent).
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the key is absent).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
}

/// A selector that does not parse, with the part that is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {problem}")]
pub struct SelectorError {
    /// The whole selector.
    pub selector: String,
    /// What is wrong and where.
    pub problem: String,
}

impl LabelSelector {
    /// The selector of an API object (`matchLabels` and `matchExpressions`).
    pub fn from_api(
        selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    ) -> Result<Self, SelectorError> {
        let mut requirements: Vec<Requirement> = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(key, value)| Requirement::Equals(key.clone(), value.clone()))
            .collect();
        for expression in selector.match_expressions.iter().flatten() {
            let key = expression.key.clone();
            let values = expression.values.clone().unwrap_or_default();
            requirements.push(match expression.operator.as_str() {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(SelectorError {
                        selector: format!("{key} {other} ({})", values.join(",")),
                        problem: format!("operator {other:?} must be In, NotIn, Exists or DoesNotExist"),
                    });
                }
            });
        }
        Ok(Self { requirements })
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches(&self, labels: &(impl Labels + ?Sized)) -> bool {
        self.requirements
            .iter()
            .all(|requirement| requirement.matches(labels))
    }

    /// The requirements, in the order given.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

impl Requirement {
    /// The label key it reads.
    pub fn key(&self) -> &str {
        match self {
            Requirement::Equals(key, _)
            | Requirement::NotEquals(key, _)
            | Requirement::In(key, _)
            | Requirement::NotIn(key, _)
            | Requirement::Exists(key)
            | Requirement::DoesNotExist(key) => key,
        }
    }

    /// Whether the labels satisfy this requirement.
    pub fn matches(&self, labels: &(impl Labels + ?Sized)) -> bool {
        match self {
            Requirement::Equals(key, value) => labels.get_label(key) == Some(value.as_str()),
            Requirement::NotEquals(key, value) => labels.get_label(key) != Some(value.as_str()),
            Requirement::In(key, values) => labels
                .get_label(key)
                .is_some_and(|v| values.iter().any(|x| x == v)),
            Requirement::NotIn(key, values) => labels
                .get_label(key)
                .is_none_or(|v| !values.iter().any(|x| x == v)),
            Requirement::Exists(key) => labels.get_label(key).is_some(),
            Requirement::DoesNotExist(key) => labels.get_label(key).is_none(),
        }
    }
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(selector: &str) -> Result<Self, Self::Err> {
        let error = |problem: String| SelectorError {
            selector: selector.to_owned(),
            problem,
        };
        let mut requirements = Vec::new();
        for term in split_terms(selector) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_term(term).map_err(error)?);
        }
        Ok(Self { requirements })
    }
}

/// Splits on commas that are not inside parentheses.
fn split_terms(selector: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (index, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&selector[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms
}

fn parse_term(term: &str) -> Result<Requirement, String> {
    let key_ok = |key: &str| -> Result<String, String> {
        match crate::labels::label_key_problem(key) {
            None => Ok(key.to_owned()),
            Some(problem) => Err(format!("key {key:?} {problem}")),
        }
    };
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_ok(key.trim())?));
    }
    for (operator, negated) in [(" notin ", true), (" in ", false)] {
        if let Some((key, values)) = term.split_once(operator) {
            let values = values
                .trim()
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(|| format!("{term:?}: the values of `{}` go in parentheses", operator.trim()))?;
            let values: Vec<String> = values.split(',').map(|v| v.trim().to_owned()).collect();
            let key = key_ok(key.trim())?;
            return Ok(if negated {
                Requirement::NotIn(key, values)
            } else {
                Requirement::In(key, values)
            });
        }
    }
    for (operator, negated) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = term.split_once(operator) {
            let key = key_ok(key.trim())?;
            let value = value.trim().to_owned();
            if let Some(problem) = crate::labels::label_value_problem(&value) {
                return Err(format!("value {value:?} {problem}"));
            }
            return Ok(if negated {
                Requirement::NotEquals(key, value)
            } else {
                Requirement::Equals(key, value)
            });
        }
    }
    Ok(Requirement::Exists(key_ok(term)?))
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let terms: Vec<String> = self
            .requirements
            .iter()
            .map(|requirement| match requirement {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&terms.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::label_map as labels;

    #[test]
    fn every_operator_matches_as_kubernetes_does() {
        let node = labels(&[("accelerator", "nvidia-a100"), ("pool", "gpu"), ("zone", "a")]);
        let cases = [
            ("", true),
            ("pool=gpu", true),
            ("pool==gpu", true),
            ("pool!=gpu", false),
            ("missing!=x", true),
            ("accelerator in (nvidia-a100,nvidia-h100)", true),
            ("accelerator notin (nvidia-a100)", false),
            ("missing notin (x)", true),
            ("missing in (x)", false),
            ("accelerator", true),
            ("!accelerator", false),
            ("!missing", true),
            ("pool=gpu, zone in (a, b), !missing", true),
            ("pool=gpu,zone=b", false),
        ];
        for (selector, expected) in cases {
            let parsed: LabelSelector = selector.parse().unwrap();
            assert_eq!(parsed.matches(&node), expected, "{selector:?}");
        }
    }

    #[test]
    fn round_trips_through_display() {
        let text = "a=b,c!=d,e in (x,y),f notin (z),g,!h";
        assert_eq!(text.parse::<LabelSelector>().unwrap().to_string(), text);
    }

    #[test]
    fn mistakes_are_named() {
        let error = "pool in gpu".parse::<LabelSelector>().unwrap_err();
        assert_eq!(
            error.problem,
            r#""pool in gpu": the values of `in` go in parentheses"#
        );
        for (text, start) in [
            ("bad key!=x", r#"key "bad key""#),
            ("a=has space", r#"value "has space""#),
        ] {
            let problem = text.parse::<LabelSelector>().unwrap_err().problem;
            assert!(problem.starts_with(start), "{text:?}: {problem}");
        }
    }
}
