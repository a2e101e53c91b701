//! Label and field selectors, parsed and matched the way the API server does.
//!
//! Label selectors take the full syntax of `k8s.io/apimachinery/pkg/labels`: `a=b`, `a==b`, `a!=b`,
//! `a in (x,y)`, `a notin (x,y)`, `a`, `!a`, `a>1`, `a<1`, joined by commas (AND). Field selectors take
//! `f=v`, `f==v`, `f!=v` with `\` escapes; which field labels a resource supports is the registry's business.

use serde_json::Value;

use crate::json;

/// A selector that could not be parsed; the API server answers 400 `BadRequest` with this message, worded as
/// `k8s.io/apimachinery`'s `labels.Parse` and `fields.ParseSelector` word theirs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
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
    /// Parses the `labelSelector` query parameter syntax, as `labels.Parse` does: same tokens, same
    /// requirements, same errors.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut parser = Parser {
            tokens: scan(text),
            position: 0,
        };
        Ok(Self {
            requirements: parser.parse()?,
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
        for expression in json::items(selector, "/matchExpressions") {
            let key = json::text(expression, "/key").to_owned();
            let values = json::strings(expression, "/values");
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    Identifier,
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
}

/// Whether `in` and `notin` read as operators (after a key) or as plain identifiers (keys and values).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

/// What the Go lexer treats as blank between tokens.
fn is_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// The tokens of a selector, ending with `End`. An identifier is any run of characters that are neither
/// blank nor special; validation of keys and values comes after. Go's lexer reads bytes and takes a NUL
/// byte for the end of the text; the same rules over characters give the same tokens, since no byte of a
/// multi-byte character is blank, special or NUL.
fn scan(text: &str) -> Vec<(Token, String)> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut at = 0;
    loop {
        while chars.get(at).copied().is_some_and(is_whitespace) {
            at += 1;
        }
        let Some(&first) = chars.get(at).filter(|c| **c != '\0') else {
            tokens.push((Token::End, String::new()));
            return tokens;
        };
        if is_special(first) {
            let double = chars.get(at + 1) == Some(&'=');
            let (token, length) = match first {
                '=' if double => (Token::DoubleEquals, 2),
                '=' => (Token::Equals, 1),
                '!' if double => (Token::NotEquals, 2),
                '!' => (Token::Not, 1),
                '(' => (Token::Open, 1),
                ')' => (Token::Close, 1),
                ',' => (Token::Comma, 1),
                '>' => (Token::GreaterThan, 1),
                _ => (Token::LessThan, 1),
            };
            tokens.push((token, chars[at..at + length].iter().collect()));
            at += length;
            continue;
        }
        let mut word = String::new();
        while let Some(&c) = chars.get(at) {
            if is_special(c) || is_whitespace(c) {
                break;
            }
            at += 1;
            if c == '\0' {
                // Go's lexer reads NUL as the end of the text and does not put it back.
                break;
            }
            word.push(c);
        }
        let token = match word.as_str() {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Identifier,
        };
        tokens.push((token, word));
    }
}

/// A recursive-descent parser over the scanned tokens, a port of `labels.Parser` with its messages.
struct Parser {
    tokens: Vec<(Token, String)>,
    position: usize,
}

impl Parser {
    fn item(&self, position: usize, context: Context) -> (Token, String) {
        let (token, literal) = self
            .tokens
            .get(position)
            .cloned()
            .unwrap_or((Token::End, String::new()));
        let token = match token {
            Token::In | Token::NotIn if context == Context::Values => Token::Identifier,
            other => other,
        };
        (token, literal)
    }

    fn lookahead(&self, context: Context) -> (Token, String) {
        self.item(self.position, context)
    }

    fn consume(&mut self, context: Context) -> (Token, String) {
        let item = self.item(self.position, context);
        // `End` is the last token; reading past it reads `End` again.
        self.position = (self.position + 1).min(self.tokens.len().saturating_sub(1));
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let (token, literal) = self.lookahead(Context::Values);
            match token {
                Token::Identifier | Token::Not => {
                    let requirement = self
                        .requirement()
                        .map_err(|e| SelectorError(format!("unable to parse requirement: {e}")))?;
                    requirements.push(requirement);
                    let (token, literal) = self.consume(Context::Values);
                    match token {
                        Token::End => break,
                        Token::Comma => {
                            let (next, literal) = self.lookahead(Context::Values);
                            if !matches!(next, Token::Identifier | Token::Not) {
                                return Err(SelectorError(format!(
                                    "found '{literal}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(SelectorError(format!(
                                "found '{literal}', expected: ',' or 'end of string'"
                            )));
                        }
                    }
                }
                Token::End => break,
                _ => {
                    return Err(SelectorError(format!(
                        "found '{literal}', expected: !, identifier, or 'end of string'"
                    )));
                }
            }
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(requirements)
    }

    /// One requirement; its error is the message after "unable to parse requirement: ".
    fn requirement(&mut self) -> Result<Requirement, String> {
        let (key, operator) = self.key_and_inferred_operator()?;
        if let Some(operator) = operator {
            return new_requirement(key, operator, Vec::new());
        }
        let operator = self.operator()?;
        let values = match operator {
            Operator::In | Operator::NotIn => self.values()?,
            _ => self.exact_value()?,
        };
        new_requirement(key, operator, values)
    }

    /// The key, and the operator when there is none to read: `!key` is DoesNotExist, a bare key Exists.
    fn key_and_inferred_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let (mut token, mut literal) = self.consume(Context::Values);
        let negated = token == Token::Not;
        if negated {
            (token, literal) = self.consume(Context::Values);
        }
        if token != Token::Identifier {
            return Err(format!("found '{literal}', expected: identifier"));
        }
        let problems = crate::causes::qualified_name_problems(&literal);
        if !problems.is_empty() {
            // Go validates the key with an empty field path here, hence the leading ": ".
            return Err(format!(": Invalid value: {literal:?}: {}", problems.join("; ")));
        }
        let (next, _) = self.lookahead(Context::Values);
        let operator = if negated {
            Some(Operator::DoesNotExist)
        } else if matches!(next, Token::End | Token::Comma) {
            Some(Operator::Exists)
        } else {
            None
        };
        Ok((literal, operator))
    }

    fn operator(&mut self) -> Result<Operator, String> {
        let (token, literal) = self.consume(Context::KeyAndOperator);
        Ok(match token {
            Token::In => Operator::In,
            Token::Equals | Token::DoubleEquals => Operator::Equals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return Err(format!(
                    "found '{literal}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        })
    }

    /// `(a,b,...)`; `()` is the one empty value, as in Go.
    fn values(&mut self) -> Result<Vec<String>, String> {
        let (token, literal) = self.consume(Context::Values);
        if token != Token::Open {
            return Err(format!("found '{literal}' expected: '('"));
        }
        let (token, literal) = self.lookahead(Context::Values);
        match token {
            Token::Identifier | Token::Comma => {
                let values = self.identifiers()?;
                if self.consume(Context::Values).0 != Token::Close {
                    // Go names the token it looked at before the list, not the one it found.
                    return Err(format!("found '{literal}', expected: ')'"));
                }
                Ok(values)
            }
            Token::Close => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(format!("found '{literal}', expected: ',', ')' or identifier")),
        }
    }

    /// A comma-separated list of possibly empty identifiers, up to (not including) `)`.
    fn identifiers(&mut self) -> Result<Vec<String>, String> {
        let mut values: Vec<String> = Vec::new();
        loop {
            let (token, literal) = self.consume(Context::Values);
            match token {
                Token::Identifier => {
                    values.push(literal);
                    let (next, literal) = self.lookahead(Context::Values);
                    match next {
                        Token::Comma => {}
                        Token::Close => return Ok(values),
                        _ => return Err(format!("found '{literal}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if values.is_empty() {
                        values.push(String::new());
                    }
                    match self.lookahead(Context::Values).0 {
                        Token::Close => {
                            values.push(String::new());
                            return Ok(values);
                        }
                        Token::Comma => {
                            self.consume(Context::Values);
                            values.push(String::new());
                        }
                        _ => {}
                    }
                }
                _ => return Err(format!("found '{literal}', expected: ',', or identifier")),
            }
        }
    }

    fn exact_value(&mut self) -> Result<Vec<String>, String> {
        if matches!(self.lookahead(Context::Values).0, Token::End | Token::Comma) {
            return Ok(vec![String::new()]);
        }
        let (token, literal) = self.consume(Context::Values);
        if token == Token::Identifier {
            Ok(vec![literal])
        } else {
            Err(format!("found '{literal}', expected: identifier"))
        }
    }
}

/// A requirement checked as `labels.NewRequirement` checks it: values are a sorted set, every problem is
/// reported (one alone, several in brackets, as Go's aggregate error prints them).
fn new_requirement(key: String, operator: Operator, values: Vec<String>) -> Result<Requirement, String> {
    let mut values = values;
    values.sort();
    values.dedup();
    let mut problems: Vec<String> = Vec::new();
    let key_problems = crate::causes::qualified_name_problems(&key);
    if !key_problems.is_empty() {
        problems.push(format!(
            "key: Invalid value: {key:?}: {}",
            key_problems.join("; ")
        ));
    }
    if matches!(operator, Operator::GreaterThan | Operator::LessThan) {
        for (i, value) in values.iter().enumerate() {
            if value.parse::<i64>().is_err() {
                problems.push(format!(
                    "values[{i}]: Invalid value: {value:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                ));
            }
        }
    }
    for (i, value) in values.iter().enumerate() {
        let value_problems = crate::causes::label_value_problems(value);
        if !value_problems.is_empty() {
            problems.push(format!(
                "values[{i}][{key}]: Invalid value: {value:?}: {}",
                value_problems.join("; ")
            ));
        }
    }
    let mut unique: Vec<String> = Vec::new();
    for problem in problems {
        if !unique.contains(&problem) {
            unique.push(problem);
        }
    }
    match unique.as_slice() {
        [] => Ok(Requirement {
            key,
            operator,
            values,
        }),
        [one] => Err(one.clone()),
        many => Err(format!("[{}]", many.join(", "))),
    }
}

/// A parsed field selector: field label `=`/`==`/`!=` value, all required.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter syntax, as `fields.ParseSelector` does: terms split at
    /// unescaped commas (and sorted, so the first bad one reported is the same), each split at its first
    /// `!=`, `==` or `=`; the field is taken as written, the value unescaped (`\\`, `\,`, `\=`).
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut terms = split_terms(text);
        terms.sort();
        let mut requirements = Vec::new();
        for term in terms.iter().filter(|term| !term.is_empty()) {
            let Some((field, equal, value)) = split_term(term) else {
                return Err(SelectorError(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            requirements.push((field.to_owned(), equal, unescape(value)?));
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

/// The comma-separated terms, escaped commas kept (with their backslash) inside a term.
fn split_terms(text: &str) -> Vec<String> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut terms = vec![String::new()];
    let mut escaped = false;
    for c in text.chars() {
        if !escaped && c == ',' {
            terms.push(String::new());
            continue;
        }
        escaped = !escaped && c == '\\';
        if let Some(term) = terms.last_mut() {
            term.push(c);
        }
    }
    terms
}

/// The field, whether the operator is an equality, and the raw value, split at the first operator found
/// scanning left to right (`!=` before `==` before `=` at each position).
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    term.char_indices().find_map(|(at, _)| {
        let (field, rest) = term.split_at(at);
        [("!=", false), ("==", true), ("=", true)]
            .into_iter()
            .find_map(|(operator, equal)| rest.strip_prefix(operator).map(|value| (field, equal, value)))
    })
}

/// A value with its escapes resolved; an unknown escape, a trailing backslash or a bare `,` or `=` is
/// refused with Go's words (which print the bare character as its code point).
fn unescape(text: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(text.len());
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(SelectorError(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                )));
            }
            out.push(c);
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            ',' | '=' => {
                return Err(SelectorError(format!(
                    "invalid field selector: unescaped character in value: {}",
                    u32::from(c)
                )));
            }
            _ => out.push(c),
        }
    }
    if escaped {
        return Err(SelectorError(
            "invalid field selector: invalid escape sequence: \\".into(),
        ));
    }
    Ok(out)
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

    fn label_error(selector: &str) -> String {
        LabelSelector::parse(selector)
            .map(|_| panic!("{selector:?} should not parse"))
            .unwrap_or_else(|e| e.to_string())
    }

    fn field_error(selector: &str) -> String {
        FieldSelector::parse(selector)
            .map(|_| panic!("{selector:?} should not parse"))
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn label_selector_errors_are_worded_as_labels_parse_words_them() {
        // A multi-byte character is an identifier character, as in Go, refused by validation.
        assert!(label_error("app=\u{e9}").starts_with(
            "unable to parse requirement: values[0][app]: Invalid value: \"\u{e9}\": a valid label must be"
        ));
        assert_eq!(label_error("a,,b"), "found ',', expected: identifier after ','");
        assert_eq!(
            label_error("a=b c"),
            "found 'c', expected: ',' or 'end of string'"
        );
        assert_eq!(
            label_error("=a"),
            "found '=', expected: !, identifier, or 'end of string'"
        );
        assert_eq!(
            label_error("a in b"),
            "unable to parse requirement: found 'b' expected: '('"
        );
        assert_eq!(
            label_error("a in (b"),
            "unable to parse requirement: found '', expected: ',' or ')'"
        );
        assert_eq!(
            label_error("a b"),
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert_eq!(
            label_error("a>b"),
            "unable to parse requirement: values[0]: Invalid value: \"b\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
        assert!(label_error("\u{e9}").starts_with(
            "unable to parse requirement: : Invalid value: \"\u{e9}\": name part must consist of"
        ));
        // `()` is the empty value, not an error; NUL ends the text as in Go's byte lexer.
        assert!(selects("a in ()", &[("a", "")]));
        assert!(selects("a=b \0c=d", &[("a", "b")]));
    }

    #[test]
    fn field_selector_errors_are_worded_as_fields_parse_selector_words_them() {
        assert_eq!(
            field_error("b=1,nonsense"),
            "invalid selector: 'b=1,nonsense'; can't understand 'nonsense'"
        );
        assert_eq!(
            field_error("a=b=c"),
            "invalid field selector: unescaped character in value: 61"
        );
        assert_eq!(
            field_error("a=b\\q"),
            "invalid field selector: invalid escape sequence: \\q"
        );
        assert_eq!(
            field_error("a=b\\"),
            "invalid field selector: invalid escape sequence: \\"
        );
        // Multi-byte characters anywhere are data.
        let selector = FieldSelector::parse("metadata.name=\u{e9}\u{e9},\u{e9}!=x").expect("valid");
        assert_eq!(selector.required("metadata.name"), Some("\u{e9}\u{e9}"));
        assert_eq!(selector.fields().collect::<Vec<_>>(), ["metadata.name", "\u{e9}"]);
    }
}
