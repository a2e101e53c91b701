//! Checking ClusterPolicy and NVIDIADriver manifests offline, the way the API server and the operator
//! would judge them: YAML syntax, the CRD schema (wrong types, enums, patterns, unknown fields the API
//! server would silently drop, CEL rules), then the operator's own validation.
//!
//! Input is text holding one or more YAML documents (`---` separated); a `List` document (as
//! `kubectl get -o yaml` prints) is checked item by item. Other kinds are reported as skipped.

use serde_json::Value;

use crate::crd::{cluster_policy_crd, nvidia_driver_crd, openapi_schema};
use crate::field::FieldError;
use crate::labels::dns_subdomain_problem;
use crate::validate::{ImageDefaults, validate_driver, validate_with, warnings};
use crate::{ClusterPolicy, NVIDIADriver};

/// Where in the input an object was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// 1-based number of the YAML document in the input.
    pub document: usize,
    /// 1-based line where the document starts.
    pub line: usize,
    /// 0-based index in `items` when the document is a `List`.
    pub item: Option<usize>,
}

/// The verdict on one object (or on a document that is not one).
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectReport {
    /// Where it is.
    pub location: Location,
    /// Its `kind`, when it has one.
    pub kind: Option<String>,
    /// Its `metadata.name`, when it has one.
    pub name: Option<String>,
    /// Problems that make the object invalid: the API server would refuse it, drop part of it, or the
    /// operator would refuse to act on it.
    pub errors: Vec<Finding>,
    /// Things that are allowed but probably not meant.
    pub warnings: Vec<FieldError>,
    /// Why the object was not checked, when it was not (another kind).
    pub skipped: Option<String>,
}

/// One problem found in a document.
#[derive(Clone, Debug, PartialEq)]
pub enum Finding {
    /// The document is not valid YAML, or not an object.
    Syntax(String),
    /// A field is wrong.
    Field(FieldError),
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Syntax(message) => f.write_str(message),
            Finding::Field(error) => error.fmt(f),
        }
    }
}

impl ObjectReport {
    /// Whether the object passed every check (warnings allowed).
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Checks every document of a manifest.
pub fn check_manifests(text: &str, defaults: &ImageDefaults) -> Vec<ObjectReport> {
    let mut reports = Vec::new();
    for (number, (line, document)) in split_documents(text).into_iter().enumerate() {
        let location = Location {
            document: number + 1,
            line,
            item: None,
        };
        match serde_saphyr::from_str::<Value>(document) {
            Err(error) => reports.push(ObjectReport {
                errors: vec![Finding::Syntax(format!(
                    "not valid YAML: {}",
                    yaml_problem(&error, line)
                ))],
                ..ObjectReport::new(location)
            }),
            Ok(Value::Object(map)) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                let items = map
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for (index, item) in items.into_iter().enumerate() {
                    let location = Location {
                        item: Some(index),
                        ..location.clone()
                    };
                    reports.push(check_object(item, location, defaults));
                }
            }
            Ok(value) => reports.push(check_object(value, location, defaults)),
        }
    }
    reports
}

impl ObjectReport {
    fn new(location: Location) -> Self {
        Self {
            location,
            kind: None,
            name: None,
            errors: Vec::new(),
            warnings: Vec::new(),
            skipped: None,
        }
    }
}

fn check_object(value: Value, location: Location, defaults: &ImageDefaults) -> ObjectReport {
    let mut report = ObjectReport::new(location);
    if !value.is_object() {
        report.errors.push(Finding::Syntax(format!(
            "expected a Kubernetes object, found {}",
            crate::field::json_type(&value)
        )));
        return report;
    }
    report.kind = value.get("kind").and_then(Value::as_str).map(str::to_owned);
    report.name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (expected_version, crd) = match report.kind.as_deref() {
        Some("ClusterPolicy") => ("nvidia.com/v1", cluster_policy_crd()),
        Some("NVIDIADriver") => ("nvidia.com/v1alpha1", nvidia_driver_crd()),
        Some(other) => {
            report.skipped = Some(format!("kind {other} is neither ClusterPolicy nor NVIDIADriver"));
            return report;
        }
        None => {
            report.errors.push(Finding::Field(FieldError::required("kind")));
            return report;
        }
    };
    if api_version != expected_version {
        report.errors.push(Finding::Field(FieldError::unsupported(
            "apiVersion",
            api_version,
            &[expected_version],
        )));
    }
    match report.name.as_deref() {
        None => report
            .errors
            .push(Finding::Field(FieldError::required("metadata.name"))),
        Some(name) => {
            if let Some(problem) = dns_subdomain_problem(name) {
                report.errors.push(Finding::Field(FieldError::invalid(
                    "metadata.name",
                    name,
                    problem,
                )));
            }
        }
    }

    let schema = openapi_schema(&crd);
    let schema_errors = crate::schema::validate(&schema, &value);
    let rule_errors = crate::schema::check_rules(&schema, &value, None);
    // Wrong types keep the object from parsing. The schema errors already say what they are; the operator's
    // own rules then judge the rest of the object, read without the wrongly typed values, so that every
    // problem is reported at once rather than one per attempt. A rule that complains about a removed value
    // names the same path and is folded into the type error below.
    let parse_failure = |error: serde_json::Error, kind: &str| {
        if schema_errors.is_empty() {
            vec![FieldError::invalid(
                "",
                "",
                format!("does not parse as {kind}: {error}"),
            )]
        } else {
            Vec::new()
        }
    };
    let semantic = match report.kind.as_deref() {
        Some("ClusterPolicy") => match parse_without_wrong_types::<ClusterPolicy>(value, &schema) {
            Ok(policy) => {
                report.warnings = warnings(&policy);
                validate_with(&policy, defaults).err().unwrap_or_default()
            }
            Err(error) => parse_failure(error, "a ClusterPolicy"),
        },
        _ => match parse_without_wrong_types::<NVIDIADriver>(value, &schema) {
            Ok(driver) => validate_driver(&driver).err().unwrap_or_default(),
            Err(error) => parse_failure(error, "an NVIDIADriver"),
        },
    };
    // The schema, its CEL rules and the operator check some things twice; say each problem once, in the
    // most precise words: structure first, then the operator's rules, then CEL rules nothing else covered.
    let mut reported: Vec<String> = Vec::new();
    for error in schema_errors.into_iter().chain(semantic).chain(rule_errors) {
        if !reported.contains(&error.path) {
            reported.push(error.path.clone());
            report.errors.push(Finding::Field(error));
        }
    }
    report
}

/// A YAML error on one line, its line counted in the whole file (the parser counts within the document
/// that starts on `first_line`), without the parser's source excerpt, which would break the report's
/// one-problem-per-line layout.
fn yaml_problem(error: &serde_saphyr::Error, first_line: usize) -> String {
    let message = error.without_snippet().to_string();
    match error.location() {
        Some(at) if at.line() > 0 => {
            let (line, column) = (at.line(), at.column());
            let message = message.replacen(&format!(" at line {line}, column {column}"), "", 1);
            let line = usize::try_from(line).unwrap_or(usize::MAX);
            format!(
                "line {} column {column}: {message}",
                line.saturating_add(first_line - 1)
            )
        }
        _ => message,
    }
}

/// Reads `value` as `T`; when that fails, reads it again without the values whose type the schema does not
/// allow. The first error is returned when neither works.
fn parse_without_wrong_types<T: serde::de::DeserializeOwned>(
    mut value: Value,
    schema: &Value,
) -> Result<T, serde_json::Error> {
    match T::deserialize(&value) {
        Ok(parsed) => Ok(parsed),
        Err(error) => {
            if crate::schema::remove_wrong_types(schema, &mut value) == 0 {
                return Err(error);
            }
            serde_json::from_value(value).map_err(|_| error)
        }
    }
}

/// Splits a YAML stream into documents with the 1-based line each starts on; blank documents are dropped.
fn split_documents(text: &str) -> Vec<(usize, &str)> {
    let mut documents = Vec::new();
    let mut start = 0;
    let mut start_line = 1;
    let mut offset = 0;
    for (number, line) in text.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_end();
        let is_separator = trimmed == "---" || trimmed.starts_with("--- ") || trimmed == "...";
        if is_separator {
            documents.push((start_line, &text[start..offset]));
            start = offset + line.len();
            start_line = number + 2;
        }
        offset += line.len();
    }
    documents.push((start_line, &text[start..]));
    documents
        .into_iter()
        .filter(|(_, document)| {
            document.lines().any(|line| {
                let line = line.trim();
                !line.is_empty() && !line.starts_with('#') && !line.starts_with('%')
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata:
  name: cluster-policy
spec:
  operator: {}
  daemonsets: {}
  driver: {repository: nvcr.io/nvidia, image: driver, version: '595.91.07', manager: {image: registry.example/dm:1}}
  toolkit: {image: registry.example/toolkit:1}
  devicePlugin: {image: registry.example/dp:1}
  dcgmExporter: {image: registry.example/exporter:1}
  dcgm: {enabled: false}
  nodeStatusExporter: {}
  gfd: {image: registry.example/gfd:1}
  migManager: {image: registry.example/mig:1}
  validator: {image: registry.example/validator:1}
";

    fn messages(text: &str) -> Vec<String> {
        check_manifests(text, &ImageDefaults::default())
            .iter()
            .flat_map(|report| report.errors.iter().map(ToString::to_string))
            .collect()
    }

    #[test]
    fn a_complete_policy_passes() {
        let reports = check_manifests(MINIMAL, &ImageDefaults::default());
        assert_eq!(reports.len(), 1);
        assert!(reports[0].is_valid(), "{:#?}", reports[0].errors);
        assert_eq!(reports[0].name.as_deref(), Some("cluster-policy"));
    }

    #[test]
    fn documents_are_numbered_with_their_starting_line() {
        let text = format!(
            "# policies\n---\n{MINIMAL}---\n\n---\nkind: Namespace\napiVersion: v1\nmetadata: {{name: x}}\n"
        );
        let reports = check_manifests(&text, &ImageDefaults::default());
        let locations: Vec<_> = reports
            .iter()
            .map(|r| (r.location.document, r.location.line))
            .collect();
        assert_eq!(locations, [(1, 3), (2, 22)]);
        assert!(
            reports[1]
                .skipped
                .as_deref()
                .is_some_and(|why| why.contains("Namespace"))
        );
    }

    #[test]
    fn each_kind_of_mistake_gets_a_precise_message() {
        let text = MINIMAL
            .replace(
                "  operator: {}\n",
                "  operator: {}\n  mig: {strategy: double}\n  devicePlugn: {}\n",
            )
            .replace("dcgm: {enabled: false}", "dcgm: {enabled: 'no'}")
            .replace(
                "daemonsets: {}",
                "daemonsets: {rollingUpdate: {maxUnavailable: '0'}}",
            )
            .replace(
                "version: '595.91.07', ",
                "version: '595.91.07', startupProbe: {periodSeconds: -5}, ",
            )
            .replace(
                "toolkit: {image: registry.example/toolkit:1}",
                "toolkit: {repository: nvcr.io/nvidia/k8s, image: container-toolkit}",
            );
        crate::schema::assert_reports(
            &messages(&text),
            &[
                r#"spec.mig.strategy: "double" is not one of [none, single, mixed]"#,
                r#"spec.devicePlugn: unknown field; the API server would silently drop it (did you mean "devicePlugin"?)"#,
                r#"spec.dcgm.enabled: "no" is a string, expected a boolean"#,
                "spec.driver.startupProbe.periodSeconds: -5 should be greater than or equal to 1",
            ],
        );
        // With the type error fixed, the operator's own rules speak too.
        let text = text.replace("dcgm: {enabled: 'no'}", "dcgm: {enabled: false}");
        let found = messages(&text);
        crate::schema::assert_reports(
            &found,
            &[
                r#"spec.daemonsets.rollingUpdate.maxUnavailable: "0" must not be 0: a DaemonSet could never replace a pod"#,
                "spec.toolkit.version: required when any of repository, image and version is set (or give image alone as a full reference)",
            ],
        );
        // The enum is reported once even though both the schema and the operator check it.
        assert_eq!(
            found
                .iter()
                .filter(|m| m.starts_with("spec.mig.strategy"))
                .count(),
            1
        );
    }

    #[test]
    fn a_wrong_type_does_not_hide_the_operators_findings() {
        let text = MINIMAL.replace("version: '595.91.07'", "version: 595").replace(
            "devicePlugin: {image: registry.example/dp:1}",
            "devicePlugin: {image: registry.example/dp:1, imagePullPolicy: Sometimes, config: {default: any}}",
        );
        let reports = check_manifests(&text, &ImageDefaults::default());
        let errors: Vec<String> = reports[0].errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "spec.driver.version: 595 is an integer, expected a string",
                "spec.devicePlugin.config.name: required when spec.devicePlugin.config.default is set: the default names a key of that ConfigMap",
            ]
        );
        let warnings: Vec<String> = reports[0].warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            warnings,
            [
                r#"spec.devicePlugin.imagePullPolicy: "Sometimes" is not Always, Never or IfNotPresent; it is treated as IfNotPresent"#
            ]
        );
    }

    #[test]
    fn enabled_components_without_an_image_are_named() {
        let text = MINIMAL.replace("  gfd: {image: registry.example/gfd:1}\n", "  gfd: {}\n");
        let found = messages(&text);
        assert_eq!(
            found,
            [
                "spec.gfd.image: required (with repository and version) because gpu-feature-discovery is enabled, unless GFD_IMAGE is set in the operator's environment"
            ]
        );
        let defaults = ImageDefaults::from_pairs([("GFD_IMAGE", "nvcr.io/nvidia/k8s-device-plugin:v0.20.0")]);
        assert!(check_manifests(&text, &defaults)[0].is_valid());
        let disabled = MINIMAL.replace(
            "  gfd: {image: registry.example/gfd:1}\n",
            "  gfd: {enabled: false}\n",
        );
        assert_eq!(messages(&disabled), Vec::<String>::new());
    }

    #[test]
    fn syntax_errors_wrong_api_versions_and_missing_names() {
        let found = messages("kind: ClusterPolicy\napiVersion: nvidia.com/v2\nspec: [\n");
        assert_eq!(found, ["not valid YAML: line 3 column 7: unclosed bracket '['"]);
        // Lines count in the file, not in the document.
        let found = messages("# a comment\n---\nkind: ClusterPolicy\napiVersion: nvidia.com/v2\nspec: [\n");
        assert_eq!(found, ["not valid YAML: line 5 column 7: unclosed bracket '['"]);
        let found = messages(
            &MINIMAL
                .replace("nvidia.com/v1", "nvidia.com/v2")
                .replace("  name: cluster-policy\n", "  labels: {}\n"),
        );
        assert!(
            found.contains(&r#"apiVersion: "nvidia.com/v2" is not one of [nvidia.com/v1]"#.to_owned()),
            "{found:?}"
        );
        assert!(
            found.contains(&"metadata.name: required field is missing".to_owned()),
            "{found:?}"
        );
        assert_eq!(
            messages("- a\n- b\n"),
            ["expected a Kubernetes object, found array"]
        );
    }

    #[test]
    fn lists_are_checked_item_by_item() {
        let item = MINIMAL
            .lines()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n");
        let text = format!("apiVersion: v1\nkind: List\nitems:\n- {}\n", item.trim_start());
        let reports = check_manifests(&text, &ImageDefaults::default());
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].location.item, Some(0));
        assert!(reports[0].is_valid(), "{:#?}", reports[0].errors);
    }

    #[test]
    fn nvidia_driver_rules() {
        let text = "apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: pool-a}
spec:
  default: true
  driverType: gpu
  image: driver
  repository: nvcr.io/nvidia
  version: '595.91.07'
  nodeSelector: {pool: a}
";
        assert_eq!(
            messages(text),
            [
                "spec.nodeSelector: must be empty on the default NVIDIADriver: it serves the GPU nodes no other NVIDIADriver selects"
            ]
        );
        assert_eq!(
            messages(&text.replace("default: true", "default: false")),
            Vec::<String>::new()
        );
        let found = messages(
            &text
                .replace("driverType: gpu", "driverType: cpu")
                .replace("default: true", "default: false"),
        );
        assert_eq!(
            found,
            [r#"spec.driverType: "cpu" is not one of [gpu, vgpu, vgpu-host-manager]"#]
        );
    }
}
