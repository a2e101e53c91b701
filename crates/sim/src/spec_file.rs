//! Reading cluster specs and scenarios from YAML: every mistake, whether the YAML does not fit the types
//! or a value does not fit the cluster, is named by file, line, column and field path
//! (`deploy/scenarios/x.yaml:4:5: timeline[2].xid.gpu: ...`).
//!
//! serde-saphyr knows where a value is but not its path; a pure check knows the path but not where it is.
//! [`Places`] records both for every key and sequence item of the document, so either kind of mistake is
//! reported the same way.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, MessageFormatter, Spanned};

/// A mistake in a YAML file, and where it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct FileError {
    /// The file, when the text came from one.
    pub file: Option<String>,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
    /// The field path: `timeline[0]`, `cluster.nodePools[1].os`; empty for the document itself.
    pub path: String,
    /// What was found and what is accepted.
    pub problem: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `file:line:column:` is what editors and terminals turn into a link.
        match &self.file {
            Some(file) => write!(f, "{file}:{}:{}: ", self.line, self.column)?,
            None => write!(f, "line {} column {}: ", self.line, self.column)?,
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.problem)
    }
}

impl FileError {
    /// The same mistake, in `file`.
    #[must_use]
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        self.file = Some(file.into());
        self
    }
}

/// A mistake a check found in a parsed value, by field path (`timeline[3].xid.gpu`): placed in the file
/// by [`Places::error`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// The field path.
    pub path: String,
    /// What is wrong and what is accepted.
    pub problem: String,
}

impl Invalid {
    /// A mistake at `path`.
    pub fn at(path: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

/// Every key and sequence item of a YAML document with its path and where it starts, in document order.
#[derive(Clone, Debug, Default)]
pub struct Places {
    entries: Vec<(String, u32, u32)>,
}

impl Places {
    /// The places of `text`'s keys and items, or the YAML syntax error.
    pub fn of(text: &str) -> Result<Self, FileError> {
        let root: Spanned<Node> =
            serde_saphyr::from_str(text).map_err(|e| Self::default().parse_error(&e))?;
        let mut places = Self::default();
        places.walk("", &root.value);
        places.entries.sort_by_key(|(_, line, column)| (*line, *column));
        Ok(places)
    }

    fn walk(&mut self, path: &str, node: &Node) {
        match node {
            Node::Scalar => {}
            Node::Seq(items) => {
                for (index, item) in items.iter().enumerate() {
                    let path = format!("{path}[{index}]");
                    self.push(&path, item.referenced);
                    self.walk(&path, &item.value);
                }
            }
            Node::Map(entries) => {
                for (key, value) in entries {
                    let path = if path.is_empty() {
                        key.value.0.clone()
                    } else {
                        format!("{path}.{}", key.value.0)
                    };
                    self.push(&path, key.referenced);
                    self.walk(&path, &value.value);
                }
            }
        }
    }

    fn push(&mut self, path: &str, location: Location) {
        self.entries
            .push((path.to_owned(), location.line() as u32, location.column() as u32));
    }

    /// The path of the innermost key or item that starts at or before `line`:`column`.
    fn path_at(&self, line: u32, column: u32) -> String {
        self.entries
            .iter()
            .rev()
            .find(|(_, l, c)| (*l, *c) <= (line, column))
            .map(|(path, _, _)| path.clone())
            .unwrap_or_default()
    }

    /// A mistake found by a check, at the place of its path (or of the closest enclosing one).
    pub fn error(&self, invalid: Invalid) -> FileError {
        let mut path = invalid.path.as_str();
        let (line, column) = loop {
            if let Some((_, line, column)) = self.entries.iter().find(|(p, _, _)| p == path) {
                break (*line, *column);
            }
            match path.rfind(['.', '[']) {
                Some(end) => path = &path[..end],
                None => break (1, 1),
            }
        };
        FileError {
            file: None,
            line,
            column,
            path: invalid.path,
            problem: invalid.problem,
        }
    }

    /// serde-saphyr's error with its path added and its location split out.
    pub fn parse_error(&self, error: &serde_saphyr::Error) -> FileError {
        let error = error.without_snippet();
        let (line, column) = error
            .location()
            .map_or((1, 1), |l| (l.line() as u32, l.column() as u32));
        let problem = serde_saphyr::DefaultMessageFormatter
            .format_message(error)
            .into_owned();
        FileError {
            file: None,
            line,
            column,
            path: self.path_at(line, column),
            problem,
        }
    }
}

/// Parses `text` as a `T`, then runs `check` over it; either's mistake is placed in the text.
pub fn parse<T: DeserializeOwned>(
    text: &str,
    check: impl FnOnce(&T) -> Result<(), Invalid>,
) -> Result<T, FileError> {
    let places = Places::of(text)?;
    let value: T = serde_saphyr::from_str(text).map_err(|e| places.parse_error(&e))?;
    check(&value).map_err(|invalid| places.error(invalid))?;
    Ok(value)
}

/// A YAML node's shape, with where its keys and items start.
enum Node {
    Scalar,
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<KeyText>, Spanned<Node>)>),
}

/// A mapping key as text, whatever scalar it is.
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Ok(KeyText(match value {
            serde_json::Value::String(text) => text,
            other => other.to_string(),
        }))
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_none<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
                Node::deserialize(deserializer)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key()? {
                    entries.push((key, map.next_value()?));
                }
                Ok(Node::Map(entries))
            }
        }
        deserializer.deserialize_any(NodeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_items_are_placed_by_path() {
        let text = "cluster:\n  nodePools:\n    - name: a\n      os: debian\ntimeline:\n  - {at: 1s, xid: {node: a-0, gpu: 9}}\n";
        let places = Places::of(text).unwrap();
        let place = |path: &str| {
            let error = places.error(Invalid::at(path, "x"));
            (error.line, error.column)
        };
        assert_eq!(place("cluster.nodePools[0].os"), (4, 7));
        assert_eq!(place("timeline[0]"), (6, 5));
        assert_eq!(place("timeline[0].xid.gpu"), (6, 31));
        // A path the document does not have is placed at its closest enclosing one.
        assert_eq!(place("timeline[0].xid.code"), (6, 14));
        assert_eq!(places.path_at(6, 33), "timeline[0].xid.gpu");
    }

    #[test]
    fn an_error_names_the_file_line_column_and_path() {
        let error = FileError {
            file: None,
            line: 2,
            column: 5,
            path: "timeline[0]".into(),
            problem: "bad".into(),
        };
        assert_eq!(error.to_string(), "line 2 column 5: timeline[0]: bad");
        assert_eq!(
            error.in_file("s.yaml").to_string(),
            "s.yaml:2:5: timeline[0]: bad"
        );
    }
}
