//! Label and field selectors, parsed and matched the way the API server does.
//!
//! Label selectors take the full syntax of `k8s.io/apimachinery/pkg/labels`: `a=b`, `a==b`, `a!=b`,
//! `a in (x,y)`, `a notin (x,y)`, `a`, `!a`, `a>1`, `a<1`, joined by commas (AND). Field selectors take
//! `f=v`, `f==v`, `f!=v` with `\` escapes; which field labels a resource supports is the registry's business.

use std::fmt;

use serde_json::Value;

/// A selector that could not be parsed; the API server answers 400 with this message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {0}")]
pub struct SelectorError(String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operator {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    fn matches(&self, value: Option<&str>) -> bool {
        match (self.operator, value) {
            (Operator::Equals | Operator::In, Some(value)) => self.values.iter().any(|v| v == value),
            (Operator::NotEquals | Operator::NotIn, Some(value)) => !self.values.iter().any(|v| v == value),
            (Operator::NotEquals | Operator::NotIn | Operator::DoesNotExist, None) => true,
            (Operator::Exists, Some(_)) => true,
            (Operator::GreaterThan | Operator::LessThan, Some(value)) => {
                let (Ok(have), Some(Ok(bound))) = (
                    value.parse::<i64>(),
                    self.values.first().map(|v| v.parse::<i64>()),
                ) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    have > bound
                } else {
                    have < bound
                }
            }
            _ => false,
        }
    }
}

/// Something labels can be read from.
pub trait Labels {
    /// The value of label `key`, if set.
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for [(String, String)] {
    fn label(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

impl Labels for Vec<(String, String)> {
    fn label(&self, key: &str) -> Option<&str> {
        self.as_slice().label(key)
    }
}

impl Labels for serde_json::Map<String, Value> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    /// A `metav1.LabelSelector` that is null selects nothing, unlike an empty one.
    nothing: bool,
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter syntax.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut lexer = Lexer::new(text);
        let mut requirements = Vec::new();
        loop {
            match lexer.peek() {
                Token::End => break,
                _ => requirements.push(parse_requirement(&mut lexer)?),
            }
            match lexer.next() {
                Token::End => break,
                Token::Comma => {}
                other => {
                    return Err(SelectorError(format!(
                        "found '{other}', expected: ',' or 'end of string'"
                    )));
                }
            }
        }
        Ok(Self {
            requirements,
            nothing: false,
        })
    }

    /// A selector from a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`).
    /// A missing (`None`) selector selects nothing, as in the API's own use of it.
    pub fn from_object(selector: Option<&Value>) -> Result<Self, SelectorError> {
        let Some(selector) = selector.filter(|s| !s.is_null()) else {
            return Ok(Self {
                requirements: Vec::new(),
                nothing: true,
            });
        };
        let mut requirements = Vec::new();
        if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
            for (key, value) in labels {
                let value = value.as_str().unwrap_or_default().to_owned();
                requirements.push(Requirement {
                    key: key.clone(),
                    operator: Operator::Equals,
                    values: vec![value],
                });
            }
        }
        for expression in selector
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = expression
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let values: Vec<String> = expression
                .get("values")
                .and_then(Value::as_array)
                .map(|values| {
                    values
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            let operator = match expression.get("operator").and_then(Value::as_str) {
                Some("In") => Operator::In,
                Some("NotIn") => Operator::NotIn,
                Some("Exists") => Operator::Exists,
                Some("DoesNotExist") => Operator::DoesNotExist,
                other => {
                    return Err(SelectorError(format!(
                        "{other:?} is not a valid label selector operator"
                    )));
                }
            };
            requirements.push(Requirement {
                key,
                operator,
                values,
            });
        }
        Ok(Self {
            requirements,
            nothing: false,
        })
    }

    /// Whether the selector has no requirements (and so matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty() && !self.nothing
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels.label(&r.key)))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Identifier(String),
    Equals,
    DoubleEquals,
    NotEquals,
    Not,
    In,
    NotIn,
    GreaterThan,
    LessThan,
    Open,
    Close,
    Comma,
    End,
    Invalid(char),
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Identifier(text) => f.write_str(text),
            Self::Equals => f.write_str("="),
            Self::DoubleEquals => f.write_str("=="),
            Self::NotEquals => f.write_str("!="),
            Self::Not => f.write_str("!"),
            Self::In => f.write_str("in"),
            Self::NotIn => f.write_str("notin"),
            Self::GreaterThan => f.write_str(">"),
            Self::LessThan => f.write_str("<"),
            Self::Open => f.write_str("("),
            Self::Close => f.write_str(")"),
            Self::Comma => f.write_str(","),
            Self::End => f.write_str("end of string"),
            Self::Invalid(c) => write!(f, "{c}"),
        }
    }
}

struct Lexer<'a> {
    rest: &'a str,
    /// Whether `in`/`notin` read as keywords here (not right after a key's operator position).
    peeked: Option<Token>,
}

impl<'a> Lexer<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            rest: text,
            peeked: None,
        }
    }

    fn peek(&mut self) -> Token {
        if self.peeked.is_none() {
            self.peeked = Some(self.read());
        }
        self.peeked.clone().unwrap_or(Token::End)
    }

    fn next(&mut self) -> Token {
        self.peeked.take().unwrap_or_else(|| self.read())
    }

    fn read(&mut self) -> Token {
        self.rest = self.rest.trim_start();
        let mut chars = self.rest.chars();
        let Some(first) = chars.next() else {
            return Token::End;
        };
        let two = &self.rest[..self.rest.len().min(2)];
        let (token, length) = match first {
            '=' if two == "==" => (Token::DoubleEquals, 2),
            '=' => (Token::Equals, 1),
            '!' if two == "!=" => (Token::NotEquals, 2),
            '!' => (Token::Not, 1),
            '>' => (Token::GreaterThan, 1),
            '<' => (Token::LessThan, 1),
            '(' => (Token::Open, 1),
            ')' => (Token::Close, 1),
            ',' => (Token::Comma, 1),
            c if is_identifier_char(c) => {
                let length = self
                    .rest
                    .find(|c: char| !is_identifier_char(c))
                    .unwrap_or(self.rest.len());
                let word = &self.rest[..length];
                let token = match word {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Identifier(word.to_owned()),
                };
                (token, length)
            }
            c => (Token::Invalid(c), c.len_utf8()),
        };
        self.rest = &self.rest[length..];
        token
    }
}

fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

fn parse_requirement(lexer: &mut Lexer<'_>) -> Result<Requirement, SelectorError> {
    let negated = lexer.peek() == Token::Not;
    if negated {
        lexer.next();
    }
    let key = match lexer.next() {
        Token::Identifier(key) => key,
        // Keywords are valid keys too.
        Token::In => "in".to_owned(),
        Token::NotIn => "notin".to_owned(),
        other => return Err(SelectorError(format!("found '{other}', expected: identifier"))),
    };
    check_key(&key)?;
    if negated {
        return Ok(Requirement {
            key,
            operator: Operator::DoesNotExist,
            values: Vec::new(),
        });
    }
    let operator = match lexer.peek() {
        Token::End | Token::Comma => {
            return Ok(Requirement {
                key,
                operator: Operator::Exists,
                values: Vec::new(),
            });
        }
        Token::Equals | Token::DoubleEquals => Operator::Equals,
        Token::NotEquals => Operator::NotEquals,
        Token::In => Operator::In,
        Token::NotIn => Operator::NotIn,
        Token::GreaterThan => Operator::GreaterThan,
        Token::LessThan => Operator::LessThan,
        other => {
            return Err(SelectorError(format!(
                "found '{other}', expected: in, notin, =, ==, !=, gt, lt"
            )));
        }
    };
    lexer.next();
    let values = match operator {
        Operator::In | Operator::NotIn => parse_set(lexer)?,
        _ => {
            let value = match lexer.peek() {
                Token::Identifier(value) => {
                    lexer.next();
                    value
                }
                Token::In | Token::NotIn => lexer.next().to_string(),
                Token::End | Token::Comma => String::new(),
                other => return Err(SelectorError(format!("found '{other}', expected: identifier"))),
            };
            if matches!(operator, Operator::GreaterThan | Operator::LessThan) && value.parse::<i64>().is_err()
            {
                return Err(SelectorError(format!(
                    "{key}: Invalid value: \"{value}\": for 'Gt', 'Lt' operators, the value must be an integer"
                )));
            }
            vec![value]
        }
    };
    for value in &values {
        check_value(&key, value)?;
    }
    Ok(Requirement {
        key,
        operator,
        values,
    })
}

fn parse_set(lexer: &mut Lexer<'_>) -> Result<Vec<String>, SelectorError> {
    match lexer.next() {
        Token::Open => {}
        other => return Err(SelectorError(format!("found '{other}', expected: '('"))),
    }
    let mut values = Vec::new();
    loop {
        match lexer.next() {
            Token::Identifier(value) => values.push(value),
            Token::In => values.push("in".into()),
            Token::NotIn => values.push("notin".into()),
            Token::Close if values.is_empty() => {
                return Err(SelectorError(
                    "for 'in', 'notin' operators, values set can't be empty".into(),
                ));
            }
            other => return Err(SelectorError(format!("found '{other}', expected: identifier"))),
        }
        match lexer.next() {
            Token::Comma => {}
            Token::Close => return Ok(values),
            other => return Err(SelectorError(format!("found '{other}', expected: ',' or ')'"))),
        }
    }
}

fn check_key(key: &str) -> Result<(), SelectorError> {
    crate::validation::qualified_name_problem(key).map_or(Ok(()), |problem| {
        Err(SelectorError(format!("key: Invalid value: \"{key}\": {problem}")))
    })
}

fn check_value(key: &str, value: &str) -> Result<(), SelectorError> {
    crate::validation::label_value_problem(value).map_or(Ok(()), |problem| {
        Err(SelectorError(format!(
            "values[0][{key}]: Invalid value: \"{value}\": {problem}"
        )))
    })
}

/// A parsed field selector: field label `=`/`==`/`!=` value, all required.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter syntax.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_unescaped(text, ',') {
            if term.is_empty() {
                continue;
            }
            let (field, equal, value) = if let Some(at) = find_unescaped(&term, "!=") {
                (&term[..at], false, &term[at + 2..])
            } else if let Some(at) = find_unescaped(&term, "==") {
                (&term[..at], true, &term[at + 2..])
            } else if let Some(at) = find_unescaped(&term, "=") {
                (&term[..at], true, &term[at + 1..])
            } else {
                return Err(SelectorError(format!("invalid field selector: '{term}'")));
            };
            requirements.push((unescape(field.trim()), equal, unescape(value)));
        }
        Ok(Self { requirements })
    }

    /// A selector requiring `field=value`.
    pub fn equals(field: &str, value: &str) -> Self {
        Self {
            requirements: vec![(field.to_owned(), true, value.to_owned())],
        }
    }

    /// The field labels this selector uses.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.requirements.iter().map(|(field, _, _)| field.as_str())
    }

    /// Whether the selector has no requirements.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The value this selector requires for `field` with `=`, if any (used to narrow lookups).
    pub fn required(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|(f, equal, _)| f == field && *equal)
            .map(|(_, _, value)| value.as_str())
    }

    /// Whether the object's field values (looked up by `value_of`; absent fields read as "") match.
    pub fn matches<'a>(&self, value_of: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements
            .iter()
            .all(|(field, equal, value)| (value_of(field).unwrap_or("") == value) == *equal)
    }
}

fn split_unescaped(text: &str, separator: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            if let Some(part) = parts.last_mut() {
                part.push('\\');
                part.push(c);
            }
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == separator {
            parts.push(String::new());
        } else {
            if let Some(part) = parts.last_mut() {
                part.push(c);
            }
        }
    }
    parts
}

fn find_unescaped(text: &str, operator: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if text[i..].starts_with(operator) {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut escaped = false;
    for c in text.chars() {
        if escaped || c != '\\' {
            out.push(c);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn selects(selector: &str, pairs: &[(&str, &str)]) -> bool {
        LabelSelector::parse(selector)
            .unwrap_or_else(|e| panic!("{selector}: {e}"))
            .matches(&labels(pairs))
    }

    #[test]
    fn equality_and_inequality() {
        assert!(selects("app=gpu", &[("app", "gpu")]));
        assert!(selects("app==gpu", &[("app", "gpu")]));
        assert!(!selects("app=gpu", &[("app", "cpu")]));
        assert!(!selects("app=gpu", &[]));
        // `!=` also selects objects without the label, as the API server does.
        assert!(selects("app!=gpu", &[]));
        assert!(!selects("app!=gpu", &[("app", "gpu")]));
        // An empty value is a value.
        assert!(selects("app=", &[("app", "")]));
        assert!(!selects("app=", &[]));
    }

    #[test]
    fn sets_existence_and_numbers() {
        let gpu = &[("nvidia.com/gpu.present", "true"), ("tier", "b"), ("count", "4")];
        assert!(selects("tier in (a, b)", gpu));
        assert!(!selects("tier notin (a,b)", gpu));
        assert!(selects("zone notin (a)", gpu));
        assert!(selects("nvidia.com/gpu.present", gpu));
        assert!(!selects("!nvidia.com/gpu.present", gpu));
        assert!(selects("!missing,tier in (b),count>3,count<5", gpu));
        assert!(!selects("count>4", gpu));
        assert!(selects("", gpu));
        // Keywords may be keys and values.
        assert!(selects("in in (in)", &[("in", "in")]));
    }

    #[test]
    fn malformed_selectors_are_refused() {
        for bad in [
            "app in a",
            "app in ()",
            "app=a b",
            "=a",
            "a,,b",
            "app in (a",
            "a>b",
            "bad key=x",
            "a=-x-",
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn label_selector_objects() {
        let selector = serde_json::json!({
            "matchLabels": {"app": "gpu"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]
        });
        let selector = LabelSelector::from_object(Some(&selector)).expect("valid");
        assert!(selector.matches(&labels(&[("app", "gpu"), ("tier", "a")])));
        assert!(!selector.matches(&labels(&[("app", "gpu")])));
        assert!(
            !LabelSelector::from_object(None)
                .expect("valid")
                .matches(&labels(&[]))
        );
        assert!(
            LabelSelector::from_object(Some(&serde_json::json!({})))
                .expect("valid")
                .matches(&labels(&[]))
        );
    }

    #[test]
    fn field_selectors_with_escapes() {
        let selector = FieldSelector::parse(r"metadata.name=a\,b,spec.nodeName!=n1").expect("valid");
        let values = |field: &str| match field {
            "metadata.name" => Some("a,b"),
            "spec.nodeName" => Some("n2"),
            _ => None,
        };
        assert!(selector.matches(values));
        assert_eq!(selector.required("metadata.name"), Some("a,b"));
        assert!(
            !FieldSelector::parse("spec.nodeName=")
                .expect("valid")
                .matches(values)
        );
        assert!(
            FieldSelector::parse("spec.nodeName=")
                .expect("valid")
                .matches(|_| None)
        );
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
