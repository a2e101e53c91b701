//! Reading snapshots from files and directories of `kubectl get ... -o json` or `-o yaml` output: `v1 List`s
//! (also `NodeList`, `PodList`, ...), single objects, several JSON values one after another, and
//! multi-document YAML. Kinds the doctor does not read are ignored; so are fields it does not read.
//!
//! JSON is read into memory and parsed from there, a list's items one at a time: each item's kind is peeked,
//! and nodes, pods and DaemonSets are read straight from the text into what the doctor keeps of them (no
//! [`Value`] of them is built, fields not kept are skipped unread); other kinds it reads are few and go
//! through a [`Value`]. A snapshot of a large cluster costs what the doctor keeps of it plus the file, which
//! is freed once read. YAML is parsed whole into values first (slower, and all of it at once).

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use gpuop_api::{ClusterPolicy, NVIDIADriver, Operand};
use k8s_openapi::api::apps::v1::DaemonSet;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::analysis::operand_of;
use crate::snapshot::{
    KINDS, NodeIn, PodFacts, SNAPSHOT_FIELD, Snapshot, trim_daemon_set, trim_disruption_budget, trim_pod,
    trim_revision,
};

/// The first bytes of a gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// A tar header block, which says `ustar` at offset 257 (POSIX and GNU alike).
const TAR_BLOCK: usize = 512;

fn is_tar(head: &[u8]) -> bool {
    head.len() >= 262 && &head[257..262] == b"ustar"
}

/// Where an object was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The file (or `-` for standard input, or a name given by the caller).
    pub origin: String,
    /// 1-based number of the document (JSON value or YAML document) in the file.
    pub document: usize,
    /// 0-based index in the `items` of a list.
    pub item: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: document {}", self.origin, self.document)?;
        if let Some(item) = self.item {
            write!(f, ", item {item}")?;
        }
        Ok(())
    }
}

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file or directory could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid JSON or YAML.
    #[error("{origin}: not valid {format}: {message}")]
    Syntax {
        /// The file.
        origin: String,
        /// `JSON` or `YAML`.
        format: &'static str,
        /// The parser's message, with line and column.
        message: String,
    },
    /// An object of a kind the doctor reads has a field it cannot use.
    #[error("{0}")]
    Object(Box<BadObject>),
    /// A tar archive that cannot be read or holds no snapshot.
    #[error("{origin}: {message}")]
    Archive {
        /// The file.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// A path given on the command line holds no JSON or YAML file.
    #[error("{path}: no .json, .yaml or .yml file in it")]
    Empty {
        /// The directory.
        path: PathBuf,
    },
}

/// An object with a field the doctor cannot use.
#[derive(Debug, thiserror::Error)]
#[error("{at} ({kind} {name}): field {field}: {message}")]
pub struct BadObject {
    /// Where.
    pub at: Location,
    /// Its kind.
    pub kind: String,
    /// Its `namespace/name`, or `(unnamed)`.
    pub name: String,
    /// The path of the field, e.g. `spec.taints[0].effect`.
    pub field: String,
    /// What is wrong and what would be accepted.
    pub message: String,
}

/// Accumulates objects from any number of inputs into one snapshot.
#[derive(Debug, Default)]
pub struct Loader {
    snapshot: Snapshot,
    read: BTreeMap<String, usize>,
    ignored: BTreeMap<String, usize>,
    /// The first error met inside the JSON stream (serde can carry only a message).
    failed: Option<LoadError>,
}

/// Reads every path (files, or directories searched recursively for `.json`, `.yaml` and `.yml`).
pub fn load_paths(paths: &[PathBuf]) -> Result<Snapshot, LoadError> {
    let mut loader = Loader::default();
    for path in paths {
        loader.add_path(path)?;
    }
    Ok(loader.finish())
}

impl Loader {
    /// Reads a file, or every JSON and YAML file under a directory.
    pub fn add_path(&mut self, path: &Path) -> Result<(), LoadError> {
        let read_error = |source| LoadError::Read {
            path: path.to_owned(),
            source,
        };
        let metadata = std::fs::metadata(path).map_err(read_error)?;
        if !metadata.is_dir() {
            let file = File::open(path).map_err(read_error)?;
            return self.add_file(BufReader::with_capacity(1 << 20, file), path);
        }
        let mut files = Vec::new();
        collect_files(path, &mut files).map_err(read_error)?;
        if files.is_empty() {
            return Err(LoadError::Empty {
                path: path.to_owned(),
            });
        }
        for file in files {
            self.add_path(&file)?;
        }
        Ok(())
    }

    /// Reads a file: JSON or YAML, or (told by their magic bytes, not the name) a gzip stream of either or a
    /// tar archive, gzipped or not, such as `kubectl gpu bundle` writes: of an archive, its `snapshot.json`.
    fn add_file(&mut self, mut reader: impl BufRead, path: &Path) -> Result<(), LoadError> {
        let origin = path.display().to_string();
        let read_error = |source| LoadError::Read {
            path: path.to_owned(),
            source,
        };
        let head = reader.fill_buf().map_err(read_error)?;
        if head.starts_with(&GZIP_MAGIC) {
            let mut reader = BufReader::new(flate2::bufread::MultiGzDecoder::new(reader));
            let mut head = Vec::with_capacity(TAR_BLOCK);
            (&mut reader)
                .take(TAR_BLOCK as u64)
                .read_to_end(&mut head)
                .map_err(read_error)?;
            let tar = is_tar(&head);
            let whole = BufReader::new(std::io::Cursor::new(head).chain(reader));
            return if tar {
                self.add_archive(whole, &origin)
            } else {
                self.add_reader(whole, &origin)
            };
        }
        if is_tar(head) {
            return self.add_archive(reader, &origin);
        }
        // A `.json` file is read as JSON whatever it starts with, so that one that is not JSON is told so
        // with the line and column where it stops being JSON.
        if path.extension().is_some_and(|e| e == "json") {
            return self.add_json(reader, &origin);
        }
        self.add_reader(reader, &origin)
    }

    /// Reads the `snapshot.json` of a tar archive (at its top, or in its one top directory).
    fn add_archive(&mut self, reader: impl Read, origin: &str) -> Result<(), LoadError> {
        let archive_error = |message: String| LoadError::Archive {
            origin: origin.to_owned(),
            message,
        };
        let mut archive = tar::Archive::new(reader);
        let entries = archive.entries().map_err(|e| archive_error(e.to_string()))?;
        for entry in entries {
            let entry = entry.map_err(|e| archive_error(e.to_string()))?;
            let name = entry
                .path()
                .map_err(|e| archive_error(e.to_string()))?
                .to_string_lossy()
                .into_owned();
            let parts: Vec<&str> = name.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
            if matches!(parts.as_slice(), ["snapshot.json"] | [_, "snapshot.json"]) {
                return self.add_reader(BufReader::new(entry), &format!("{origin}: {name}"));
            }
        }
        Err(archive_error(
            "no snapshot.json in it (the bundle could not read the cluster's snapshot; see its index.json)"
                .to_owned(),
        ))
    }

    /// Reads JSON or YAML from a reader; `origin` names it in errors.
    pub fn add_reader(&mut self, mut reader: impl BufRead, origin: &str) -> Result<(), LoadError> {
        let read_error = |source| LoadError::Read {
            path: PathBuf::from(origin),
            source,
        };
        let first = loop {
            let buffer = reader.fill_buf().map_err(read_error)?;
            if buffer.is_empty() {
                return Ok(());
            }
            match buffer.iter().position(|b| !b.is_ascii_whitespace()) {
                Some(position) => break buffer[position],
                None => {
                    let length = buffer.len();
                    reader.consume(length);
                }
            }
        };
        if first == b'{' || first == b'[' {
            self.add_json(reader, origin)
        } else {
            let mut bytes = Vec::new();
            reader.read_to_end(&mut bytes).map_err(read_error)?;
            let text = String::from_utf8(bytes).map_err(|error| LoadError::Syntax {
                origin: origin.to_owned(),
                format: "JSON or YAML",
                message: format!(
                    "not UTF-8 text (byte {} is not)",
                    error.utf8_error().valid_up_to()
                ),
            })?;
            self.add_yaml(&text, origin)
        }
    }

    /// Reads text (JSON or YAML).
    pub fn add_text(&mut self, text: &str, origin: &str) -> Result<(), LoadError> {
        self.add_reader(text.as_bytes(), origin)
    }

    fn add_json(&mut self, mut reader: impl Read, origin: &str) -> Result<(), LoadError> {
        // Parsing from memory is faster than from a reader (which serde_json reads a byte at a time), and
        // lets each list item be a borrowed slice of the text until its kind is known. The text is freed
        // once read: the peak is the projections plus the file.
        let mut text = Vec::new();
        reader.read_to_end(&mut text).map_err(|source| LoadError::Read {
            path: PathBuf::from(origin),
            source,
        })?;
        let mut deserializer = serde_json::Deserializer::from_slice(&text);
        let mut document = 0;
        while deserializer.end().is_err() {
            document += 1;
            let at = Location {
                origin: origin.to_owned(),
                document,
                item: None,
            };
            let outcome = DocumentSeed { loader: self, at }.deserialize(&mut deserializer);
            if let Some(error) = self.failed.take() {
                return Err(error);
            }
            outcome.map_err(|error| LoadError::Syntax {
                origin: origin.to_owned(),
                format: "JSON",
                message: error.to_string(),
            })?;
        }
        Ok(())
    }

    fn add_yaml(&mut self, text: &str, origin: &str) -> Result<(), LoadError> {
        // These are the user's own files, often whole clusters: no budget on their size.
        let mut options = serde_saphyr::Options::default();
        options.budget = None;
        let documents: Vec<serde_saphyr::Spanned<Value>> =
            serde_saphyr::from_multiple_with_options(text, options).map_err(|error| LoadError::Syntax {
                origin: origin.to_owned(),
                format: "YAML",
                message: error.to_string(),
            })?;
        for (index, document) in documents.into_iter().enumerate() {
            let value = document.value;
            // Any text is a YAML scalar: a document that is neither an object nor a list of them is a file
            // that is not what it should be, not an object of a kind the doctor ignores.
            if !matches!(value, Value::Object(_) | Value::Array(_) | Value::Null) {
                let mut shown = value.to_string();
                if shown.len() > 40 {
                    let cut = (0..=40).rev().find(|&i| shown.is_char_boundary(i)).unwrap_or(0);
                    shown.truncate(cut);
                    shown.push_str("...");
                }
                return Err(LoadError::Syntax {
                    origin: origin.to_owned(),
                    format: "JSON or YAML",
                    message: format!(
                        "document {} at line {} column {} is {shown}, not a Kubernetes object or list",
                        index + 1,
                        document.referenced.line(),
                        document.referenced.column()
                    ),
                });
            }
            let at = Location {
                origin: origin.to_owned(),
                document: index + 1,
                item: None,
            };
            self.add_value(value, &at)?;
        }
        Ok(())
    }

    /// Adds one object (or a list of them).
    pub fn add_value(&mut self, value: Value, at: &Location) -> Result<(), LoadError> {
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if kind == "List" || (kind.ends_with("List") && value.get("items").is_some()) {
            let Value::Object(mut map) = value else {
                return Ok(());
            };
            self.note_listed(map.get(SNAPSHOT_FIELD));
            let items = match map.remove("items") {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            };
            for (index, item) in items.into_iter().enumerate() {
                let at = Location {
                    item: Some(index),
                    ..at.clone()
                };
                self.add_value(item, &at)?;
            }
            return Ok(());
        }
        if !KINDS.contains(&kind.as_str()) {
            let kind = if kind.is_empty() {
                "(no kind)".to_owned()
            } else {
                kind
            };
            *self.ignored.entry(kind).or_default() += 1;
            return Ok(());
        }
        let name = object_name(&value);
        let typed = |value: Value| ObjectError {
            at: at.clone(),
            kind: kind.clone(),
            name: name.clone(),
            value,
        };
        match kind.as_str() {
            "Node" => {
                let node: NodeIn = typed(value).parse()?;
                self.snapshot.nodes.push(node.into_node());
            }
            "Pod" => {
                let mut pod: PodFacts = typed(value).parse()?;
                trim_pod(&mut pod);
                self.snapshot.pods.push(pod);
            }
            "DaemonSet" => {
                let mut daemon_set = typed(value).parse()?;
                trim_daemon_set(&mut daemon_set);
                self.snapshot.daemon_sets.push(daemon_set);
            }
            "RuntimeClass" => self.snapshot.runtime_classes.push(typed(value).parse()?),
            "ControllerRevision" => {
                let mut revision = typed(without_data(value)).parse()?;
                trim_revision(&mut revision);
                self.snapshot.controller_revisions.push(revision);
            }
            "PodDisruptionBudget" => {
                let mut budget = typed(value).parse()?;
                trim_disruption_budget(&mut budget);
                self.snapshot.disruption_budgets.push(budget);
            }
            "NVIDIADriver" => {
                let driver: NVIDIADriver = typed(without_status(value)).parse()?;
                self.snapshot.nvidia_drivers.push(driver);
            }
            _ => {
                let policy: ClusterPolicy = typed(without_status(value)).parse()?;
                self.snapshot.cluster_policies.push(policy);
            }
        }
        *self.read.entry(kind).or_default() += 1;
        Ok(())
    }

    /// Adds one object given as JSON text, straight into its projection when it is a node, pod or DaemonSet
    /// (no [`Value`] of it is built); `kind` is the kind of a list's items that carry none (as the API
    /// server lists them), and wins over the item's own. An object that does not read as its type goes the
    /// way of [`Loader::add_value`], whose error names the field; so does a list within the list, and any
    /// object of the kinds that are few in a cluster.
    pub fn add_json_item(&mut self, text: &str, kind: Option<&str>, at: &Location) -> Result<(), LoadError> {
        let kind = match kind {
            Some(kind) => kind,
            None => match kind_of(text) {
                Some(kind) => kind,
                // Not an object, or a kind that is no plain string: the slow way says what it is.
                None => return self.add_item_value(text, None, at),
            },
        };
        match kind {
            "Node" => match serde_json::from_str::<NodeIn>(text) {
                Ok(node) => self.snapshot.nodes.push(node.into_node()),
                Err(_) => return self.add_item_value(text, Some(kind), at),
            },
            "Pod" => self.snapshot.pods.push(pod_from_json(text, at)?),
            "DaemonSet" => match serde_json::from_str::<DaemonSet>(text) {
                Ok(mut daemon_set) => {
                    trim_daemon_set(&mut daemon_set);
                    self.snapshot.daemon_sets.push(daemon_set);
                }
                Err(_) => return self.add_item_value(text, Some(kind), at),
            },
            kind if KINDS.contains(&kind) || kind.ends_with("List") => {
                return self.add_item_value(text, Some(kind), at);
            }
            kind => {
                let kind = if kind.is_empty() { "(no kind)" } else { kind };
                *self.ignored.entry(kind.to_owned()).or_default() += 1;
                return Ok(());
            }
        }
        *self.read.entry(kind.to_owned()).or_default() += 1;
        Ok(())
    }

    /// Adds an object given as JSON text through [`Value`]; `kind`, when given, replaces its own.
    fn add_item_value(&mut self, text: &str, kind: Option<&str>, at: &Location) -> Result<(), LoadError> {
        let mut value = value_of(text, kind, at)?;
        if let (Some(kind), Some(map)) = (kind, value.as_object_mut()) {
            map.insert("kind".to_owned(), kind.into());
        }
        self.add_value(value, at)
    }

    fn note_listed(&mut self, field: Option<&Value>) {
        let kinds = field
            .and_then(|f| f.get("listed"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        self.snapshot.listed.extend(kinds.map(str::to_owned));
    }

    /// The snapshot read so far, with a note on what was ignored. ControllerRevisions of DaemonSets other
    /// than the driver's are dropped: nothing reads them.
    pub fn finish(mut self) -> Snapshot {
        self.snapshot.dedup_pods();
        let drivers: std::collections::BTreeSet<&str> = self
            .snapshot
            .daemon_sets
            .iter()
            .filter(|ds| operand_of(ds) == Some(Operand::Driver))
            .filter_map(|ds| ds.metadata.uid.as_deref())
            .collect();
        let revisions = std::mem::take(&mut self.snapshot.controller_revisions);
        self.snapshot.controller_revisions = revisions
            .into_iter()
            .filter(|r| {
                r.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| drivers.contains(o.uid.as_str()))
            })
            .collect();
        if !self.ignored.is_empty() {
            let ignored: Vec<String> = self
                .ignored
                .iter()
                .map(|(kind, count)| format!("{kind} x{count}"))
                .collect();
            self.snapshot
                .notes
                .push(format!("ignored objects of other kinds: {}", ignored.join(", ")));
        }
        self.snapshot
    }
}

/// A pod given as JSON text, projected and trimmed; an error names the pod and the field.
pub fn pod_from_json(text: &str, at: &Location) -> Result<PodFacts, LoadError> {
    let mut pod = match serde_json::from_str::<PodFacts>(text) {
        Ok(pod) => pod,
        // Read again through a Value, whose reading names the field that is wrong.
        Err(_) => {
            let value = value_of(text, Some("Pod"), at)?;
            ObjectError {
                at: at.clone(),
                kind: "Pod".to_owned(),
                name: object_name(&value),
                value,
            }
            .parse()?
        }
    };
    trim_pod(&mut pod);
    Ok(pod)
}

/// An object given as JSON text (which parsed) as a [`Value`]. That fails only for an object nested deeper
/// than serde_json builds values (128 levels; skipping a field needs no depth): the error names the object.
fn value_of(text: &str, kind: Option<&str>, at: &Location) -> Result<Value, LoadError> {
    serde_json::from_str(text).map_err(|error| {
        #[derive(serde::Deserialize)]
        struct Named<'a> {
            #[serde(default, borrow)]
            metadata: Option<Meta<'a>>,
        }
        #[derive(serde::Deserialize)]
        struct Meta<'a> {
            #[serde(default, borrow)]
            name: Option<&'a str>,
            #[serde(default, borrow)]
            namespace: Option<&'a str>,
        }
        let meta = serde_json::from_str::<Named<'_>>(text)
            .ok()
            .and_then(|n| n.metadata);
        let name = match meta {
            Some(Meta {
                name: Some(name),
                namespace: Some(namespace),
            }) => format!("{namespace}/{name}"),
            Some(Meta { name: Some(name), .. }) => name.to_owned(),
            _ => "(unnamed)".to_owned(),
        };
        LoadError::Object(Box::new(BadObject {
            at: at.clone(),
            kind: kind.map_or_else(|| "(unknown kind)".to_owned(), str::to_owned),
            name,
            field: "(the object)".to_owned(),
            message: match error.classify() {
                serde_json::error::Category::Syntax => {
                    "nested more than 128 levels deep, deeper than the doctor reads".to_owned()
                }
                _ => error.to_string(),
            },
        }))
    })
}

/// The object without its status: the doctor reads a custom resource's spec, and a status written by
/// another operator version must not stop it.
fn without_status(mut value: Value) -> Value {
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
    }
    value
}

/// A ControllerRevision without its data (a whole pod template, never read).
fn without_data(mut value: Value) -> Value {
    if let Some(map) = value.as_object_mut() {
        map.remove("data");
    }
    value
}

/// An object on its way to its type, with what names it in an error.
struct ObjectError {
    at: Location,
    kind: String,
    name: String,
    value: Value,
}

impl ObjectError {
    fn parse<T: serde::de::DeserializeOwned>(self) -> Result<T, LoadError> {
        serde_path_to_error::deserialize(self.value).map_err(|error| {
            LoadError::Object(Box::new(BadObject {
                at: self.at,
                kind: self.kind,
                name: self.name,
                field: match error.path().to_string() {
                    path if path == "." => "(the object)".to_owned(),
                    path => path,
                },
                message: error.into_inner().to_string(),
            }))
        })
    }
}

fn object_name(value: &Value) -> String {
    let meta = value.get("metadata");
    let name = meta.and_then(|m| m.get("name")).and_then(Value::as_str);
    let namespace = meta.and_then(|m| m.get("namespace")).and_then(Value::as_str);
    match (namespace, name) {
        (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
        (None, Some(name)) => name.to_owned(),
        _ => "(unnamed)".to_owned(),
    }
}

fn collect_files(directory: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(directory)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for path in entries {
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            collect_files(&path, files)?;
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("json" | "yaml" | "yml")
        ) {
            files.push(path);
        }
    }
    Ok(())
}

/// Reads one JSON document: a list's items one at a time, anything else whole.
struct DocumentSeed<'l> {
    loader: &'l mut Loader,
    at: Location,
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object or list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut fields = serde_json::Map::new();
        let mut listed = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" {
                listed = true;
                map.next_value_seed(ItemsSeed {
                    loader: &mut *self.loader,
                    at: &self.at,
                })?;
            } else {
                let value: Value = map.next_value()?;
                fields.insert(key, value);
            }
        }
        if listed {
            self.loader.note_listed(fields.get(SNAPSHOT_FIELD));
            return Ok(());
        }
        self.loader
            .add_value(Value::Object(fields), &self.at)
            .map_err(|error| self.loader.fail(error))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        ItemsSeed {
            loader: self.loader,
            at: &self.at,
        }
        .visit_seq(seq)
    }
}

struct ItemsSeed<'l, 'a> {
    loader: &'l mut Loader,
    at: &'a Location,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of Kubernetes objects")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0;
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            let at = Location {
                item: Some(index),
                ..self.at.clone()
            };
            self.loader
                .add_json_item(item.get(), None, &at)
                .map_err(|error| self.loader.fail(error))?;
            index += 1;
        }
        Ok(())
    }
}

/// The `kind` of an object given as JSON text (`""` when it has none), read without reading the rest of the
/// object: the kind comes first or second in what `kubectl` and the API server write. `None` when the text
/// is no object, or its kind is no string or holds an escape. With two `kind` fields (which no Kubernetes
/// client writes) the first one counts.
fn kind_of(text: &str) -> Option<&str> {
    let mut kind = None;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    match deserializer.deserialize_map(KindVisitor { kind: &mut kind }) {
        Ok(()) => Some(kind.unwrap_or_default()),
        // Stopped at the kind.
        Err(_) => kind,
    }
}

/// Reads map entries up to `kind`, then stops reading with an error; skips every other value unread.
struct KindVisitor<'k, 'de> {
    kind: &'k mut Option<&'de str>,
}

impl<'de> Visitor<'de> for KindVisitor<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(IsKind)? {
            if key {
                *self.kind = Some(map.next_value::<&'de str>()?);
                return Err(serde::de::Error::custom("the kind is read"));
            }
            map.next_value::<serde::de::IgnoredAny>()?;
        }
        Ok(())
    }
}

/// Whether a map key is `kind`, without allocating it.
struct IsKind;

impl<'de> DeserializeSeed<'de> for IsKind {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for IsKind {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == "kind")
    }
}

impl Loader {
    /// Keeps the error for the caller and gives serde a message to stop with.
    fn fail<E: serde::de::Error>(&mut self, error: LoadError) -> E {
        let message = error.to_string();
        self.failed = Some(error);
        E::custom(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Snapshot, LoadError> {
        let mut loader = Loader::default();
        loader.add_text(text, "test")?;
        Ok(loader.finish())
    }

    #[test]
    fn reads_lists_single_objects_and_concatenated_json() {
        let text = r#"
            {"apiVersion": "v1", "items": [
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}},
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
            ], "kind": "List", "metadata": {"resourceVersion": ""}}
            {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
             "handler": "nvidia", "unknownField": 1}
            [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n"}}]
        "#;
        let snapshot = load(text).unwrap();
        assert_eq!(snapshot.nodes.len(), 1);
        assert_eq!(snapshot.runtime_classes.len(), 1);
        assert_eq!(snapshot.pods.len(), 1);
        assert_eq!(snapshot.notes, ["ignored objects of other kinds: ConfigMap x1"]);
    }

    #[test]
    fn reads_multi_document_yaml() {
        let text = "apiVersion: v1\nkind: Node\nmetadata:\n  name: a\n  labels:\n    nvidia.com/gpu.present: 'true'\n\
                    ---\napiVersion: v1\nkind: NodeList\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {name: b}\n\
                    ---\napiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cluster-policy}\n\
                    spec:\n  operator: {}\n  daemonsets: {}\n  driver: {}\n  toolkit: {}\n  devicePlugin: {}\n\
                    \x20 dcgmExporter: {}\n  dcgm: {}\n  nodeStatusExporter: {}\n  gfd: {}\n\
                    status: {state: something-new}\n";
        let snapshot = load(text).unwrap();
        assert_eq!(snapshot.nodes.len(), 2);
        assert_eq!(
            snapshot.cluster_policies.len(),
            1,
            "an unknown status does not stop the doctor"
        );
    }

    #[test]
    fn a_bad_field_names_the_file_object_and_field() {
        let text = r#"{"kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}},
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "b"},
             "spec": {"taints": [{"key": "k", "effect": 5}]}}]}"#;
        let error = load(text).unwrap_err().to_string();
        assert_eq!(
            error,
            "test: document 1, item 1 (Node b): field spec.taints[0].effect: invalid type: integer `5`, expected a string"
        );
        let error = load("{\"kind\": \"Node\", ").unwrap_err().to_string();
        assert!(
            error.starts_with("test: not valid JSON: EOF while parsing"),
            "{error}"
        );
    }

    fn tar(files: &[(&str, &str)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, text) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(text.len() as u64);
            header.set_mode(0o644);
            builder.append_data(&mut header, path, text.as_bytes()).unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut encoder, bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn load_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<Snapshot, LoadError> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        load_paths(&[path])
    }

    #[test]
    fn archives_and_gzip_are_told_by_their_bytes_and_only_the_snapshot_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let node = r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}}"#;
        let other = r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "not-the-snapshot"}}"#;
        let archive = tar(&[
            ("gpu-bundle-x/index.json", "{}"),
            ("gpu-bundle-x/snapshot.json", node),
            ("gpu-bundle-x/objects/nodes.json", other),
        ]);
        for (name, bytes) in [
            ("bundle.tar.gz", gzip(&archive)),
            ("bundle.json", gzip(&archive)),
            ("plain.tar", archive.clone()),
            ("snap.json.gz", gzip(node.as_bytes())),
        ] {
            let snapshot = load_file(dir.path(), name, &bytes).unwrap();
            let names: Vec<_> = snapshot.nodes.iter().map(|n| n.metadata.name.clone()).collect();
            assert_eq!(names, [Some("a".to_owned())], "{name}");
        }
        let error = load_file(dir.path(), "empty.tar.gz", &gzip(&tar(&[("x/index.json", "{}")])))
            .unwrap_err()
            .to_string();
        assert!(
            error.ends_with("empty.tar.gz: no snapshot.json in it (the bundle could not read the cluster's snapshot; see its index.json)"),
            "{error}"
        );
    }

    #[test]
    fn text_that_is_no_object_is_a_syntax_error_with_its_line_and_column() {
        let error = load("# a comment\nthis is not a snapshot\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "test: not valid JSON or YAML: document 1 at line 2 column 1 is \"this is not a snapshot\", not a \
             Kubernetes object or list"
        );
        let error = load("kind: Node\n---\n42\n").unwrap_err().to_string();
        assert!(error.contains("document 2 at line 3 column 1 is 42,"), "{error}");
        let error = load("kind: Node\nmetadata: {name: [a\n").unwrap_err().to_string();
        assert!(
            error.starts_with("test: not valid YAML:") && error.contains("line"),
            "{error}"
        );
    }

    #[test]
    fn a_json_file_is_read_as_json_whatever_it_starts_with() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("garbage.json");
        std::fs::write(&path, "\n\ngarbage, not json\n").unwrap();
        let error = load_paths(&[path]).unwrap_err().to_string();
        assert!(
            error.ends_with("garbage.json: not valid JSON: expected value at line 3 column 1"),
            "{error}"
        );
        let path = dir.path().join("binary.yaml");
        std::fs::write(&path, b"kind: \xff\xfe\n").unwrap();
        let error = load_paths(&[path]).unwrap_err().to_string();
        assert!(
            error.ends_with("binary.yaml: not valid JSON or YAML: not UTF-8 text (byte 6 is not)"),
            "{error}"
        );
    }

    #[test]
    fn a_snapshot_says_which_kinds_it_lists_whole() {
        let mut snapshot = Snapshot::default();
        snapshot.listed.insert("RuntimeClass".to_owned());
        let mut text = Vec::new();
        snapshot.write_json(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        let read = load(&text).unwrap();
        assert!(
            read.knows_all("RuntimeClass"),
            "an empty but listed kind is known to be empty"
        );
        assert!(!read.knows_all("ClusterPolicy"));
    }
}
