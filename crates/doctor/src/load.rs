//! Reading snapshots from files and directories of `kubectl get ... -o json` or `-o yaml` output: `v1 List`s
//! (also `NodeList`, `PodList`, ...), single objects, several JSON values one after another, and
//! multi-document YAML. Kinds the doctor does not read are ignored; so are fields it does not read.
//!
//! A file is read with one read. JSON is parsed from memory in one pass: each list item is read straight
//! into what the doctor keeps of it as the parser meets it ([`ItemSeed`]); the fields before an item's `kind`
//! are only found and kept as borrowed text until the kind says what to read them into. Nodes, pods and
//! DaemonSets go into their projections without a [`Value`] (fields not kept are skipped unread); the other
//! kinds the doctor reads are few and go through a [`Value`]. When that pass fails, the text is read again
//! item by item, each item's text found first, so that the error names the item and its field. A snapshot of
//! a large cluster costs what the doctor keeps of it plus the file, which is freed once read; its one list is
//! read on two threads, half each ([`halves`]). YAML is parsed whole into values first (slower, and all of it
//! at once).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use gpuop_api::{ClusterPolicy, NVIDIADriver, Operand};
use k8s_openapi::api::apps::v1::DaemonSet;
use serde::Deserialize;
use serde::de::value::{BorrowedStrDeserializer, MapAccessDeserializer, StringDeserializer};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

mod halves;

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
            // One read into a buffer of the file's size: no copying as a growing buffer would, and the
            // JSON parser wants the whole text in memory anyway.
            let bytes = std::fs::read(path).map_err(read_error)?;
            return self.add_file(bytes, path);
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

    /// Reads a file's bytes: JSON or YAML, or (told by their magic bytes, not the name) a gzip stream of
    /// either or a tar archive, gzipped or not, such as `kubectl gpu bundle` writes: of an archive, its
    /// `snapshot.json`.
    fn add_file(&mut self, bytes: Vec<u8>, path: &Path) -> Result<(), LoadError> {
        let origin = path.display().to_string();
        let read_error = |source| LoadError::Read {
            path: path.to_owned(),
            source,
        };
        if bytes.starts_with(&GZIP_MAGIC) {
            let mut reader = BufReader::new(flate2::bufread::MultiGzDecoder::new(bytes.as_slice()));
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
        if is_tar(&bytes) {
            return self.add_archive(bytes.as_slice(), &origin);
        }
        // A `.json` file is read as JSON whatever it starts with, so that one that is not JSON is told so
        // with the line and column where it stops being JSON.
        if path.extension().is_some_and(|e| e == "json") {
            return self.add_json(&bytes, &origin);
        }
        self.add_bytes(bytes, &origin)
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
                return self.add_reader(entry, &format!("{origin}: {name}"));
            }
        }
        Err(archive_error(
            "no snapshot.json in it (the bundle could not read the cluster's snapshot; see its index.json)"
                .to_owned(),
        ))
    }

    /// Reads JSON or YAML from a reader; `origin` names it in errors.
    pub fn add_reader(&mut self, mut reader: impl Read, origin: &str) -> Result<(), LoadError> {
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).map_err(|source| LoadError::Read {
            path: PathBuf::from(origin),
            source,
        })?;
        self.add_bytes(bytes, origin)
    }

    /// Reads JSON or YAML, told by the first byte that is not white space.
    fn add_bytes(&mut self, bytes: Vec<u8>, origin: &str) -> Result<(), LoadError> {
        match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
            None => Ok(()),
            Some(b'{' | b'[') => self.add_json(&bytes, origin),
            Some(_) => {
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
    }

    /// Reads text (JSON or YAML).
    pub fn add_text(&mut self, text: &str, origin: &str) -> Result<(), LoadError> {
        self.add_bytes(text.as_bytes().to_vec(), origin)
    }

    /// Reads JSON text (any number of documents) in one pass: each list item is read straight into what the
    /// doctor keeps of it as the parser goes ([`ItemSeed`]). Should that pass fail (a field of the wrong
    /// type, text that is not JSON, an object nested too deep), what it added is taken back and the text is
    /// read again item by item ([`Pass::Explain`]), which names the item and the field, or reads what the
    /// first pass could not.
    fn add_json(&mut self, text: &[u8], origin: &str) -> Result<(), LoadError> {
        if text.len() >= halves::TWO_THREADS_FROM
            && let Ok(text) = std::str::from_utf8(text)
            && let Some(read) = halves::read_list(text, origin)
        {
            self.absorb(read);
            return Ok(());
        }
        let mark = self.mark();
        match self.add_json_pass(text, origin, Pass::OneGo) {
            Ok(()) => Ok(()),
            // An object of a kind read through a Value, already named.
            Err(error @ LoadError::Object(_)) => Err(error),
            Err(_) => {
                self.rewind(mark);
                self.add_json_pass(text, origin, Pass::Explain)
            }
        }
    }

    fn add_json_pass(&mut self, text: &[u8], origin: &str, pass: Pass) -> Result<(), LoadError> {
        // Text known to be UTF-8 as a whole spares the parser checking each string on its own; text that is
        // not is read as bytes, so that the parser says where it stops being UTF-8.
        match std::str::from_utf8(text) {
            Ok(text) => self.add_json_documents(serde_json::Deserializer::from_str(text), origin, pass),
            Err(_) => self.add_json_documents(serde_json::Deserializer::from_slice(text), origin, pass),
        }
    }

    fn add_json_documents<'de, R: serde_json::de::Read<'de>>(
        &mut self,
        mut deserializer: serde_json::Deserializer<R>,
        origin: &str,
        pass: Pass,
    ) -> Result<(), LoadError> {
        let mut document = 0;
        while deserializer.end().is_err() {
            document += 1;
            let at = Location {
                origin: origin.to_owned(),
                document,
                item: None,
            };
            let outcome = DocumentSeed {
                loader: self,
                at,
                pass,
            }
            .deserialize(&mut deserializer);
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
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let read = ItemSeed {
            loader: self,
            at,
            index: None,
            kind,
        }
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end());
        match read {
            Ok(()) => Ok(()),
            Err(_) => match self.failed.take() {
                Some(error) => Err(error),
                // Read again through a Value, whose reading names the field that is wrong.
                None => match kind {
                    Some(kind) => self.add_item_value(text, Some(kind), at),
                    None => self.add_item_value(text, kind_of(text).as_deref(), at),
                },
            },
        }
    }

    /// Adds an object given as JSON text through [`Value`]; `kind`, when given, replaces its own.
    fn add_item_value(&mut self, text: &str, kind: Option<&str>, at: &Location) -> Result<(), LoadError> {
        let mut value = value_of(text, kind, at)?;
        if let (Some(kind), Some(map)) = (kind, value.as_object_mut()) {
            map.insert("kind".to_owned(), kind.into());
        }
        self.add_value(value, at)
    }

    /// How much the loader holds now, for [`Loader::rewind`].
    fn mark(&self) -> Mark {
        let snapshot = &self.snapshot;
        Mark {
            nodes: snapshot.nodes.len(),
            daemon_sets: snapshot.daemon_sets.len(),
            pods: snapshot.pods.len(),
            runtime_classes: snapshot.runtime_classes.len(),
            cluster_policies: snapshot.cluster_policies.len(),
            nvidia_drivers: snapshot.nvidia_drivers.len(),
            controller_revisions: snapshot.controller_revisions.len(),
            disruption_budgets: snapshot.disruption_budgets.len(),
            listed: snapshot.listed.clone(),
            read: self.read.clone(),
            ignored: self.ignored.clone(),
        }
    }

    /// Takes back what was added since the mark.
    fn rewind(&mut self, mark: Mark) {
        let snapshot = &mut self.snapshot;
        snapshot.nodes.truncate(mark.nodes);
        snapshot.daemon_sets.truncate(mark.daemon_sets);
        snapshot.pods.truncate(mark.pods);
        snapshot.runtime_classes.truncate(mark.runtime_classes);
        snapshot.cluster_policies.truncate(mark.cluster_policies);
        snapshot.nvidia_drivers.truncate(mark.nvidia_drivers);
        snapshot.controller_revisions.truncate(mark.controller_revisions);
        snapshot.disruption_budgets.truncate(mark.disruption_budgets);
        snapshot.listed = mark.listed;
        self.read = mark.read;
        self.ignored = mark.ignored;
    }

    /// Adds what another loader read, after what this one holds.
    fn absorb(&mut self, other: Loader) {
        let Snapshot {
            mut nodes,
            mut daemon_sets,
            mut pods,
            mut runtime_classes,
            mut cluster_policies,
            mut nvidia_drivers,
            mut controller_revisions,
            mut disruption_budgets,
            listed,
            mut notes,
        } = other.snapshot;
        let snapshot = &mut self.snapshot;
        snapshot.nodes.append(&mut nodes);
        snapshot.daemon_sets.append(&mut daemon_sets);
        snapshot.pods.append(&mut pods);
        snapshot.runtime_classes.append(&mut runtime_classes);
        snapshot.cluster_policies.append(&mut cluster_policies);
        snapshot.nvidia_drivers.append(&mut nvidia_drivers);
        snapshot.controller_revisions.append(&mut controller_revisions);
        snapshot.disruption_budgets.append(&mut disruption_budgets);
        snapshot.listed.extend(listed);
        snapshot.notes.append(&mut notes);
        for (kind, count) in other.read {
            *self.read.entry(kind).or_default() += count;
        }
        for (kind, count) in other.ignored {
            *self.ignored.entry(kind).or_default() += count;
        }
    }

    /// Counts an object the doctor does not read.
    fn ignore(&mut self, kind: &str) {
        let kind = if kind.is_empty() { "(no kind)" } else { kind };
        match self.ignored.get_mut(kind) {
            Some(count) => *count += 1,
            None => {
                self.ignored.insert(kind.to_owned(), 1);
            }
        }
    }

    /// Counts an object read.
    fn count_read(&mut self, kind: &str) {
        match self.read.get_mut(kind) {
            Some(count) => *count += 1,
            None => {
                self.read.insert(kind.to_owned(), 1);
            }
        }
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
        // Only the operand DaemonSets' revisions matter: their latest says which operand pods are current.
        let operands: std::collections::BTreeSet<&str> = self
            .snapshot
            .daemon_sets
            .iter()
            .filter(|ds| Operand::of_daemonset(ds).is_some())
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
                    .any(|o| operands.contains(o.uid.as_str()))
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

/// How a JSON text's list items are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Each item straight into its projection as the parser meets it ([`ItemSeed`]).
    OneGo,
    /// Each item's text found first, then read on its own ([`Loader::add_json_item`]), so that an item that
    /// does not read names itself and its field.
    Explain,
}

/// What a loader held at some point (see [`Loader::mark`]).
struct Mark {
    nodes: usize,
    daemon_sets: usize,
    pods: usize,
    runtime_classes: usize,
    cluster_policies: usize,
    nvidia_drivers: usize,
    controller_revisions: usize,
    disruption_budgets: usize,
    listed: std::collections::BTreeSet<String>,
    read: BTreeMap<String, usize>,
    ignored: BTreeMap<String, usize>,
}

/// Reads one JSON document: a list's items one at a time, anything else whole.
struct DocumentSeed<'l> {
    loader: &'l mut Loader,
    at: Location,
    pass: Pass,
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
                    pass: self.pass,
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
            pass: self.pass,
        }
        .visit_seq(seq)
    }
}

struct ItemsSeed<'l, 'a> {
    loader: &'l mut Loader,
    at: &'a Location,
    pass: Pass,
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
        if self.pass == Pass::OneGo {
            let mut index = 0;
            while seq
                .next_element_seed(ItemSeed {
                    loader: &mut *self.loader,
                    at: self.at,
                    index: Some(index),
                    kind: None,
                })?
                .is_some()
            {
                index += 1;
            }
            return Ok(());
        }
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

/// The `kind` of an object given as JSON text, to name it in an error; `None` when it is no object or its
/// kind is no string.
fn kind_of(text: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Kinded<'a> {
        #[serde(default, borrow)]
        kind: Option<Cow<'a, str>>,
    }
    serde_json::from_str::<Kinded<'_>>(text)
        .ok()
        .and_then(|object| object.kind)
        .map(Cow::into_owned)
}

/// Reads one list item in one pass, straight into what the doctor keeps of it. The fields before the
/// item's `kind` (its `apiVersion`, as Kubernetes writes objects; in a hand-made file perhaps all of them) are
/// only found, kept as borrowed text, and read once the kind says into what; the fields after it are read as
/// the parser meets them. Nodes, pods and DaemonSets are read into their projections, skipping what those do
/// not hold; the few other kinds the doctor reads go through a [`Value`]; any other kind is skipped unread.
/// Something that is no object is skipped as an object without a kind. An item is added only once it has
/// been read whole; an error leaves the loader as it was, except for a list within the list.
struct ItemSeed<'l, 'a> {
    loader: &'l mut Loader,
    at: &'a Location,
    /// The item's place in its list, when `at` is the list's.
    index: Option<usize>,
    /// The kind of a list's items that carry none, as the API server lists them; wins over the item's own.
    kind: Option<&'a str>,
}

impl ItemSeed<'_, '_> {
    /// Something that is no object: skipped as an object without a kind, unless its kind was given, when
    /// the caller's slower reading says what it makes of it.
    fn not_an_object<E: serde::de::Error>(self, what: serde::de::Unexpected<'_>) -> Result<(), E> {
        if self.kind.is_some() {
            return Err(E::invalid_type(what, &"a Kubernetes object"));
        }
        self.loader.ignore("");
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut before: Vec<(Cow<'de, str>, &'de RawValue)> = Vec::new();
        let own_kind: Cow<'de, str>;
        let kind: &str = match self.kind {
            Some(kind) => kind,
            None => loop {
                let Some(key) = map.next_key_seed(TextSeed)? else {
                    // No kind: nothing to read it as.
                    self.loader.ignore("");
                    return Ok(());
                };
                let value: &'de RawValue = map.next_value()?;
                let is_kind = key == "kind";
                before.push((key, value));
                if is_kind {
                    // A kind that is no string is no kind.
                    own_kind = value.deserialize_str(TextSeed).unwrap_or_default();
                    break &own_kind;
                }
            },
        };
        let loader = self.loader;
        let read_whole = KINDS.contains(&kind) || kind.ends_with("List");
        if !read_whole {
            while map.next_key::<serde::de::IgnoredAny>()?.is_some() {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
            loader.ignore(kind);
            return Ok(());
        }
        let object = MapAccessDeserializer::new(Replay {
            before: before.into_iter(),
            value: None,
            rest: map,
        });
        match kind {
            "Node" => {
                let node = NodeIn::deserialize(object)?;
                loader.snapshot.nodes.push(node.into_node());
            }
            "Pod" => {
                let mut pod = PodFacts::deserialize(object)?;
                trim_pod(&mut pod);
                loader.snapshot.pods.push(pod);
            }
            "DaemonSet" => {
                let mut daemon_set = DaemonSet::deserialize(object)?;
                trim_daemon_set(&mut daemon_set);
                loader.snapshot.daemon_sets.push(daemon_set);
            }
            // Few in a cluster, and read with their own rules.
            _ => {
                let mut value = Value::deserialize(object)?;
                if let (Some(kind), Some(map)) = (self.kind, value.as_object_mut()) {
                    map.insert("kind".to_owned(), kind.into());
                }
                let at = Location {
                    item: self.index.or(self.at.item),
                    ..self.at.clone()
                };
                return loader.add_value(value, &at).map_err(|error| loader.fail(error));
            }
        }
        loader.count_read(kind);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.kind.is_some() {
            return self.not_an_object(serde::de::Unexpected::Seq);
        }
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        self.not_an_object(serde::de::Unexpected::Seq)
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<(), E> {
        self.not_an_object(serde::de::Unexpected::Str(text))
    }

    fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<(), E> {
        self.not_an_object(serde::de::Unexpected::Bool(value))
    }

    fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<(), E> {
        self.not_an_object(serde::de::Unexpected::Signed(value))
    }

    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<(), E> {
        self.not_an_object(serde::de::Unexpected::Unsigned(value))
    }

    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<(), E> {
        self.not_an_object(serde::de::Unexpected::Float(value))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.not_an_object(serde::de::Unexpected::Unit)
    }
}

/// An object's entries: first those already found (as text), then the rest from the parser.
struct Replay<'de, A> {
    before: std::vec::IntoIter<(Cow<'de, str>, &'de RawValue)>,
    /// The value of the entry whose key was just given from `before`.
    value: Option<&'de RawValue>,
    rest: A,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Replay<'de, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        let Some((key, value)) = self.before.next() else {
            return self.rest.next_key_seed(seed);
        };
        self.value = Some(value);
        match key {
            Cow::Borrowed(key) => seed.deserialize(BorrowedStrDeserializer::new(key)).map(Some),
            Cow::Owned(key) => seed.deserialize(StringDeserializer::new(key)).map(Some),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        match self.value.take() {
            Some(value) => seed.deserialize(value).map_err(serde::de::Error::custom),
            None => self.rest.next_value_seed(seed),
        }
    }
}

/// A string as it is in the text when it holds no escape (no allocation), or unescaped.
struct TextSeed;

impl<'de> DeserializeSeed<'de> for TextSeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Cow<'de, str>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for TextSeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, text: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(text))
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(text.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(text))
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
