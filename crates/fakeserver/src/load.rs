//! Loading objects from YAML or JSON files (`gpu-sim serve --load DIR`, test fixtures): every document of
//! every `*.yaml`, `*.yml` and `*.json` file in a directory, `List`s expanded, namespaces and CRDs first so
//! that what depends on them finds them.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::ApiError;
use crate::json;
use crate::store::{Store, WriteOptions};

/// Why objects could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file or directory could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file is not YAML or JSON objects.
    #[error("{source_name}: {message}")]
    Parse {
        /// The file (or "input").
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// The server refused an object.
    #[error("{source_name}: {kind} {name:?}: {source}")]
    Refused {
        /// The file (or "input").
        source_name: String,
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The server's answer.
        #[source]
        source: Box<ApiError>,
    },
}

/// The objects in a YAML (multi-document) or JSON text, `List`s expanded.
pub(crate) fn documents(text: &str, source_name: &str) -> Result<Vec<Value>, LoadError> {
    let parsed: Vec<Value> = match serde_json::from_str::<Value>(text) {
        Ok(value) => vec![value],
        Err(_) => serde_saphyr::from_multiple::<Value>(text).map_err(|e| LoadError::Parse {
            source_name: source_name.to_owned(),
            message: e.to_string(),
        })?,
    };
    let mut objects = Vec::new();
    for value in parsed {
        match value {
            Value::Null => {}
            Value::Object(ref map)
                if map
                    .get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List")) =>
            {
                objects.extend(
                    map.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            Value::Object(_) => objects.push(value),
            other => {
                return Err(LoadError::Parse {
                    source_name: source_name.to_owned(),
                    message: format!(
                        "expected an object, found {}",
                        gpuop_api::field::json_type(&other)
                    ),
                });
            }
        }
    }
    Ok(objects)
}

fn rank(object: &Value) -> u8 {
    match object.get("kind").and_then(Value::as_str) {
        Some("Namespace") => 0,
        Some("CustomResourceDefinition") => 1,
        Some("PriorityClass") => 2,
        _ => 3,
    }
}

/// Creates `objects` (namespaces and CRDs first); returns how many.
pub(crate) fn create_all(store: &Store, mut objects: Vec<(String, Value)>) -> Result<usize, LoadError> {
    objects.sort_by_key(|(_, object)| rank(object));
    let opts = WriteOptions {
        manager: "gpu-sim-load".into(),
        keep_identity: true,
        ..WriteOptions::default()
    };
    let count = objects.len();
    for (source_name, mut object) in objects {
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            for key in ["resourceVersion", "managedFields", "generation"] {
                meta.remove(key);
            }
        }
        let text = |pointer: &str| json::text(&object, pointer).to_owned();
        let (kind, name) = (text("/kind"), text("/metadata/name"));
        store
            .create_object(object, &opts)
            .map_err(|source| LoadError::Refused {
                source_name,
                kind,
                name,
                source: Box::new(source),
            })?;
    }
    Ok(count)
}

/// Every object in a YAML or JSON file, or in a directory's (see [`read_dir`]).
pub(crate) fn read_path(path: &Path) -> Result<Vec<(String, Value)>, LoadError> {
    if path.is_dir() {
        return read_dir(path);
    }
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })?;
    let name = path.display().to_string();
    Ok(documents(&text, &name)?
        .into_iter()
        .map(|object| (name.clone(), object))
        .collect())
}

/// Every object in the directory's YAML and JSON files, in file-name order.
pub(crate) fn read_dir(dir: &Path) -> Result<Vec<(String, Value)>, LoadError> {
    let read_error = |path: &Path, source| LoadError::Read {
        path: path.to_owned(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| read_error(dir, e))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml" || ext == "json")
        })
        .collect();
    files.sort();
    let mut objects = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| read_error(&file, e))?;
        let name = file.display().to_string();
        objects.extend(
            documents(&text, &name)?
                .into_iter()
                .map(|object| (name.clone(), object)),
        );
    }
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_from_several_paths_are_created_in_dependency_order() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let config_maps = dir.path().join("config.yaml");
        std::fs::write(
            &config_maps,
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: ops}\n",
        )
        .expect("written");
        let namespaces = dir.path().join("namespaces");
        std::fs::create_dir(&namespaces).expect("created");
        std::fs::write(
            namespaces.join("ns.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: ops}\n",
        )
        .expect("written");
        let server = crate::FakeServer::new();
        let error = server.load_paths(&[&config_maps]).expect_err("no namespace");
        assert!(
            error
                .to_string()
                .ends_with(r#"config.yaml: ConfigMap "c": namespaces "ops" not found"#),
            "{error}"
        );
        // The namespace comes first although its path is named last.
        assert_eq!(server.load_paths(&[&config_maps, &namespaces]).expect("loads"), 2);
        assert!(server.get("v1", "ConfigMap", "ops", "c").is_some());
    }

    #[test]
    fn documents_and_lists_are_expanded() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}\n";
        let objects = documents(text, "x.yaml").expect("parses");
        let names: Vec<&str> = objects
            .iter()
            .filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str))
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert!(documents("- 1\n", "y.yaml").is_err());
    }
}
