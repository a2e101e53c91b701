//! The resource types the server knows: the built-ins this project needs and whatever CRDs register.
//!
//! A [`ResourceInfo`] drives routing (group, version, plural, scope), discovery (kind, short names, verbs,
//! subresources), the write rules (status subresource, generation tracking) and the field labels usable in
//! field selectors. Posting a CRD registers its served versions at once; deleting it unregisters them.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::causes::{dns_subdomain_problem, forbidden, invalid, required, unsupported};
use crate::error::Cause;
use crate::json::{self, text};

/// A field label usable in a field selector, and where its value lives in the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldLabel {
    /// The label, e.g. `spec.nodeName`.
    pub label: String,
    /// JSON pointer to the value, e.g. `/spec/nodeName`.
    pub pointer: String,
    /// The value when the field is absent (Go's zero value as a string).
    pub absent: &'static str,
}

impl FieldLabel {
    fn new(label: &str, absent: &'static str) -> Self {
        Self {
            label: label.to_owned(),
            pointer: format!("/{}", label.replace('.', "/")),
            absent,
        }
    }

    /// The field's value in `object`, as the API server compares it.
    pub fn value_of(&self, object: &Value) -> String {
        match object.pointer(&self.pointer) {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Bool(flag)) => flag.to_string(),
            Some(Value::Number(number)) => number.to_string(),
            _ => self.absent.to_owned(),
        }
    }
}

/// What a CRD says about one of its versions.
#[derive(Clone, Debug, PartialEq)]
pub struct CustomInfo {
    /// The version's `openAPIV3Schema`.
    pub schema: Option<Value>,
    /// The CRD's storage version; objects are stored as written and converted (by `apiVersion` only) on read.
    pub storage_version: String,
    /// The CRD's name (`plural.group`).
    pub crd_name: String,
    /// `additionalPrinterColumns`, served in discovery-independent form for tooling.
    pub printer_columns: Vec<Value>,
}

/// One resource type at one version.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceInfo {
    /// API group, empty for core.
    pub group: String,
    /// Version, e.g. `v1`.
    pub version: String,
    /// Kind, e.g. `DaemonSet`.
    pub kind: String,
    /// List kind, e.g. `DaemonSetList`.
    pub list_kind: String,
    /// Plural resource name, used in URLs.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Whether `/status` is a subresource (main writes then ignore `.status`, status writes ignore the rest).
    pub status_subresource: bool,
    /// Other subresources: `eviction`, `binding`, `finalize`.
    pub subresources: Vec<&'static str>,
    /// Short names for kubectl.
    pub short_names: Vec<String>,
    /// Categories for kubectl (`all`).
    pub categories: Vec<String>,
    /// Whether `metadata.generation` is maintained.
    pub generation: bool,
    /// Field labels supported in field selectors (always `metadata.name` and `metadata.namespace`).
    pub field_labels: Vec<FieldLabel>,
    /// Whether the resource is a review answered on `create` and never stored (SubjectAccessReview...).
    pub create_only: bool,
    /// Set for custom resources.
    pub custom: Option<CustomInfo>,
}

impl ResourceInfo {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The group and plural, for error messages.
    pub fn group_resource(&self) -> crate::error::GroupResource {
        crate::error::GroupResource::new(&self.group, &self.plural)
    }

    /// The group and kind, for error messages.
    pub fn group_kind(&self) -> crate::error::GroupKind {
        crate::error::GroupKind {
            group: self.group.clone(),
            kind: self.kind.clone(),
        }
    }

    /// The storage identity: objects of all versions of a resource share one table.
    pub fn storage_key(&self) -> StorageKey {
        StorageKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    /// The field label named `label`, if supported.
    pub fn field_label(&self, label: &str) -> Option<&FieldLabel> {
        self.field_labels.iter().find(|f| f.label == label)
    }

    /// Whether this is the named built-in, e.g. `is("", "Pod")`.
    pub fn is(&self, group: &str, kind: &str) -> bool {
        self.custom.is_none() && self.group == group && self.kind == kind
    }
}

/// Identifies where a resource's objects are stored, across versions.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageKey {
    /// API group.
    pub group: String,
    /// Plural resource name.
    pub plural: String,
}

impl StorageKey {
    /// Where the objects of the resource a CustomResourceDefinition object defines are stored.
    pub(crate) fn of_crd(crd: &Value) -> Self {
        Self {
            group: text(crd, "/spec/group").to_owned(),
            plural: text(crd, "/spec/names/plural").to_owned(),
        }
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    status: bool,
    generation: bool,
    short_names: &'static [&'static str],
    subresources: &'static [&'static str],
    fields: &'static [(&'static str, &'static str)],
    create_only: bool,
}

const fn builtin(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
) -> Builtin {
    Builtin {
        group,
        version,
        kind,
        plural,
        namespaced,
        status: false,
        generation: false,
        short_names: &[],
        subresources: &[],
        fields: &[],
        create_only: false,
    }
}

impl Builtin {
    const fn status(mut self) -> Self {
        self.status = true;
        self
    }
    const fn generation(mut self) -> Self {
        self.generation = true;
        self
    }
    const fn short(mut self, names: &'static [&'static str]) -> Self {
        self.short_names = names;
        self
    }
    const fn subresources(mut self, names: &'static [&'static str]) -> Self {
        self.subresources = names;
        self
    }
    const fn fields(mut self, fields: &'static [(&'static str, &'static str)]) -> Self {
        self.fields = fields;
        self
    }
    const fn create_only(mut self) -> Self {
        self.create_only = true;
        self
    }
}

const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject.kind", ""),
    ("involvedObject.namespace", ""),
    ("involvedObject.name", ""),
    ("involvedObject.uid", ""),
    ("involvedObject.apiVersion", ""),
    ("involvedObject.resourceVersion", ""),
    ("involvedObject.fieldPath", ""),
    ("reason", ""),
    ("reportingComponent", ""),
    ("source.component", ""),
    ("type", ""),
];

const NEW_EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding.kind", ""),
    ("regarding.namespace", ""),
    ("regarding.name", ""),
    ("regarding.uid", ""),
    ("regarding.apiVersion", ""),
    ("regarding.resourceVersion", ""),
    ("regarding.fieldPath", ""),
    ("reason", ""),
    ("reportingController", ""),
    ("type", ""),
];

const POD_FIELDS: &[(&str, &str)] = &[
    ("spec.nodeName", ""),
    ("spec.restartPolicy", ""),
    ("spec.schedulerName", ""),
    ("spec.serviceAccountName", ""),
    ("spec.hostNetwork", "false"),
    ("status.phase", ""),
    ("status.podIP", ""),
    ("status.nominatedNodeName", ""),
];

/// The built-in resources, in discovery order.
const BUILTINS: &[Builtin] = &[
    builtin("", "v1", "Namespace", "namespaces", false)
        .status()
        .short(&["ns"])
        .subresources(&["finalize"])
        .fields(&[("status.phase", "")]),
    builtin("", "v1", "Node", "nodes", false)
        .status()
        .short(&["no"])
        .fields(&[("spec.unschedulable", "false")]),
    builtin("", "v1", "Pod", "pods", true)
        .status()
        .short(&["po"])
        .subresources(&["eviction", "binding", "log"])
        .fields(POD_FIELDS),
    builtin("", "v1", "ConfigMap", "configmaps", true).short(&["cm"]),
    builtin("", "v1", "Secret", "secrets", true).fields(&[("type", "")]),
    builtin("", "v1", "Service", "services", true)
        .status()
        .short(&["svc"]),
    builtin("", "v1", "ServiceAccount", "serviceaccounts", true)
        .short(&["sa"])
        .subresources(&["token"]),
    builtin("", "v1", "Event", "events", true)
        .short(&["ev"])
        .fields(EVENT_FIELDS),
    builtin("apps", "v1", "DaemonSet", "daemonsets", true)
        .status()
        .generation()
        .short(&["ds"]),
    builtin("apps", "v1", "Deployment", "deployments", true)
        .status()
        .generation()
        .short(&["deploy"]),
    builtin("apps", "v1", "ReplicaSet", "replicasets", true)
        .status()
        .generation()
        .short(&["rs"]),
    builtin("apps", "v1", "ControllerRevision", "controllerrevisions", true),
    builtin("batch", "v1", "Job", "jobs", true).status().generation(),
    builtin("events.k8s.io", "v1", "Event", "events", true)
        .short(&["ev"])
        .fields(NEW_EVENT_FIELDS),
    builtin("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
    builtin(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        false,
    )
    .create_only(),
    builtin(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectRulesReview",
        "selfsubjectrulesreviews",
        false,
    )
    .create_only(),
    builtin(
        "authorization.k8s.io",
        "v1",
        "SubjectAccessReview",
        "subjectaccessreviews",
        false,
    )
    .create_only(),
    builtin(
        "authentication.k8s.io",
        "v1",
        "SelfSubjectReview",
        "selfsubjectreviews",
        false,
    )
    .create_only(),
    builtin(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        true,
    ),
    builtin(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        false,
    ),
    builtin(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
    ),
    builtin(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
    )
    .status()
    .generation()
    .short(&["pdb"]),
    builtin(
        "scheduling.k8s.io",
        "v1",
        "PriorityClass",
        "priorityclasses",
        false,
    )
    .short(&["pc"]),
    builtin("coordination.k8s.io", "v1", "Lease", "leases", true),
    // Dynamic Resource Allocation (GA in v1.34), stored as sent: no typed decoding (the library takes
    // k8s-openapi without a version), so unknown fields are kept, not refused.
    builtin("resource.k8s.io", "v1", "DeviceClass", "deviceclasses", false).generation(),
    builtin("resource.k8s.io", "v1", "ResourceSlice", "resourceslices", false)
        .generation()
        .fields(&[("spec.nodeName", ""), ("spec.driver", "")]),
    builtin("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", true).status(),
    builtin(
        "resource.k8s.io",
        "v1",
        "ResourceClaimTemplate",
        "resourceclaimtemplates",
        true,
    ),
    builtin("node.k8s.io", "v1", "RuntimeClass", "runtimeclasses", false),
    builtin(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
    )
    .status()
    .generation()
    .short(&["crd", "crds"]),
];

fn base_fields() -> Vec<FieldLabel> {
    // Cluster-scoped objects answer `metadata.namespace=` with "" too.
    vec![
        FieldLabel::new("metadata.name", ""),
        FieldLabel::new("metadata.namespace", ""),
    ]
}

/// All resource types currently served.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    resources: Vec<Arc<ResourceInfo>>,
}

impl Registry {
    /// The built-in resources only.
    pub fn builtin() -> Self {
        let resources = BUILTINS
            .iter()
            .map(|b| {
                let mut field_labels = base_fields();
                field_labels.extend(
                    b.fields
                        .iter()
                        .map(|(label, absent)| FieldLabel::new(label, absent)),
                );
                Arc::new(ResourceInfo {
                    group: b.group.to_owned(),
                    version: b.version.to_owned(),
                    kind: b.kind.to_owned(),
                    list_kind: format!("{}List", b.kind),
                    plural: b.plural.to_owned(),
                    singular: b.kind.to_lowercase(),
                    namespaced: b.namespaced,
                    status_subresource: b.status,
                    subresources: b.subresources.to_vec(),
                    short_names: b.short_names.iter().map(|s| (*s).to_owned()).collect(),
                    categories: if matches!(
                        b.plural,
                        "pods" | "services" | "daemonsets" | "deployments" | "replicasets"
                    ) {
                        vec!["all".to_owned()]
                    } else {
                        Vec::new()
                    },
                    generation: b.generation,
                    field_labels,
                    create_only: b.create_only,
                    custom: None,
                })
            })
            .collect();
        Self { resources }
    }

    /// The resource served at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    }

    /// The resource for an object's `apiVersion` and `kind`.
    pub fn find_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceInfo>> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
            .cloned()
    }

    /// Every served resource, built-ins first.
    pub fn all(&self) -> &[Arc<ResourceInfo>] {
        &self.resources
    }

    /// The API groups with their versions, preferred (storage, else first) version first.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for resource in &self.resources {
            match groups.iter_mut().find(|(g, _)| *g == resource.group) {
                Some((_, versions)) => {
                    if !versions.contains(&resource.version) {
                        versions.push(resource.version.clone());
                    }
                }
                None => groups.push((resource.group.clone(), vec![resource.version.clone()])),
            }
        }
        for (group, versions) in &mut groups {
            let preferred = self
                .resources
                .iter()
                .find(|r| {
                    r.group == *group && r.custom.as_ref().is_some_and(|c| c.storage_version == r.version)
                })
                .map(|r| r.version.clone());
            if let Some(preferred) = preferred
                && let Some(at) = versions.iter().position(|v| *v == preferred)
            {
                let version = versions.remove(at);
                versions.insert(0, version);
            }
        }
        groups
    }

    /// Registers (or re-registers) the served versions of a CRD object.
    pub fn register_crd(&mut self, crd: &Value) {
        let Some(spec) = crd.get("spec") else { return };
        let group = text(spec, "/group");
        let names = spec.get("names").cloned().unwrap_or_default();
        let plural = text(&names, "/plural");
        let kind = text(&names, "/kind");
        self.resources
            .retain(|r| !(r.custom.is_some() && r.group == group && r.plural == plural));
        let namespaced = text(spec, "/scope") != "Cluster";
        let versions: Vec<&Value> = json::items(spec, "/versions").collect();
        let storage_version = versions
            .iter()
            .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .map(|v| text(v, "/name"))
            .unwrap_or_default();
        for version in versions
            .iter()
            .filter(|v| v.get("served").and_then(Value::as_bool) != Some(false))
        {
            let mut field_labels = base_fields();
            for selectable in json::items(version, "/selectableFields") {
                let path = text(selectable, "/jsonPath");
                field_labels.push(FieldLabel::new(path.trim_start_matches('.'), ""));
            }
            let singular = names
                .get("singular")
                .and_then(Value::as_str)
                .map_or_else(|| kind.to_lowercase(), str::to_owned);
            self.resources.push(Arc::new(ResourceInfo {
                group: group.to_owned(),
                version: text(version, "/name").to_owned(),
                kind: kind.to_owned(),
                list_kind: names
                    .get("listKind")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("{kind}List"), str::to_owned),
                plural: plural.to_owned(),
                singular,
                namespaced,
                status_subresource: version.pointer("/subresources/status").is_some(),
                subresources: Vec::new(),
                short_names: json::strings(&names, "/shortNames"),
                categories: json::strings(&names, "/categories"),
                generation: true,
                field_labels,
                create_only: false,
                custom: Some(CustomInfo {
                    schema: version.pointer("/schema/openAPIV3Schema").cloned(),
                    storage_version: storage_version.to_owned(),
                    crd_name: text(crd, "/metadata/name").to_owned(),
                    printer_columns: version
                        .get("additionalPrinterColumns")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                }),
            }));
        }
    }

    /// Removes every version of a CRD's resource.
    pub fn unregister_crd(&mut self, crd: &Value) {
        let group = text(crd, "/spec/group");
        let plural = text(crd, "/spec/names/plural");
        self.resources
            .retain(|r| !(r.custom.is_some() && r.group == group && r.plural == plural));
    }
}

/// Fills in what the API server defaults in a CRD: singular and list kind, conversion strategy.
pub(crate) fn default_crd(crd: &mut Value) {
    let kind = text(crd, "/spec/names/kind").to_owned();
    let Some(names) = crd.pointer_mut("/spec/names").and_then(Value::as_object_mut) else {
        return;
    };
    names
        .entry("singular")
        .or_insert_with(|| Value::from(kind.to_lowercase()));
    names
        .entry("listKind")
        .or_insert_with(|| Value::from(format!("{kind}List")));
    if let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("conversion")
            .or_insert_with(|| json!({"strategy": "None"}));
    }
}

/// The status the API server's CRD controllers would settle on: names accepted, established.
pub(crate) fn crd_status(crd: &Value, now: &str) -> Value {
    let storage: Vec<Value> = json::items(crd, "/spec/versions")
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let condition = |kind: &str, reason: &str, message: &str| json!({"type": kind, "status": "True", "lastTransitionTime": now, "reason": reason, "message": message});
    json!({
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or_default(),
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "storedVersions": storage,
    })
}

/// The checks the API server makes on a CRD, enough to refuse what it would refuse.
pub(crate) fn validate_crd(crd: &Value, old: Option<&Value>, causes: &mut Vec<Cause>) {
    let group = text(crd, "/spec/group");
    let plural = text(crd, "/spec/names/plural");
    let kind = text(crd, "/spec/names/kind");
    let name = text(crd, "/metadata/name");
    if group.is_empty() {
        causes.push(required("spec.group", ""));
    } else if !group.contains('.') {
        causes.push(invalid(
            "spec.group",
            &Value::from(group),
            "should be a domain with at least one dot",
        ));
    } else if let Some(problem) = dns_subdomain_problem(group) {
        causes.push(invalid("spec.group", &Value::from(group), problem));
    }
    if plural.is_empty() {
        causes.push(required("spec.names.plural", ""));
    }
    if kind.is_empty() {
        causes.push(required("spec.names.kind", ""));
    }
    if name != format!("{plural}.{group}") {
        causes.push(invalid(
            "metadata.name",
            &Value::from(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let scope = text(crd, "/spec/scope");
    if !matches!(scope, "Namespaced" | "Cluster") {
        causes.push(unsupported(
            "spec.scope",
            &Value::from(scope),
            &["Cluster", "Namespaced"],
        ));
    }
    let versions: Vec<&Value> = json::items(crd, "/spec/versions").collect();
    if versions.is_empty() {
        causes.push(invalid(
            "spec.versions",
            &json!([]),
            "must have exactly one version marked as storage version",
        ));
    } else {
        let storage = versions
            .iter()
            .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .count();
        if storage != 1 {
            causes.push(invalid(
                "spec.versions",
                &Value::from(storage),
                "must have exactly one version marked as storage version",
            ));
        }
    }
    for (index, version) in versions.iter().enumerate() {
        if version.pointer("/schema/openAPIV3Schema").is_none() {
            causes.push(required(
                &format!("spec.versions[{index}].schema.openAPIV3Schema"),
                "schemas are required",
            ));
        }
        if version
            .get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push(required(&format!("spec.versions[{index}].name"), ""));
        }
    }
    if let Some(old) = old {
        if text(old, "/spec/group") != group {
            causes.push(invalid("spec.group", &Value::from(group), "field is immutable"));
        }
        if text(old, "/spec/scope") != scope {
            causes.push(forbidden("spec.scope", "field is immutable"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "clusterpolicies.nvidia.com"},
            "spec": {
                "group": "nvidia.com", "scope": "Cluster",
                "names": {"plural": "clusterpolicies", "kind": "ClusterPolicy", "shortNames": ["cp"]},
                "versions": [
                    {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                     "schema": {"openAPIV3Schema": {"type": "object"}},
                     "selectableFields": [{"jsonPath": ".spec.mode"}]},
                    {"name": "v1alpha1", "served": false, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object"}}}
                ]
            }
        })
    }

    #[test]
    fn a_crd_registers_its_served_versions() {
        let mut registry = Registry::builtin();
        registry.register_crd(&crd());
        let info = registry
            .find("nvidia.com", "v1", "clusterpolicies")
            .expect("registered");
        assert!(!info.namespaced);
        assert!(info.status_subresource);
        assert_eq!(info.short_names, ["cp"]);
        assert_eq!(info.singular, "clusterpolicy");
        assert_eq!(info.list_kind, "ClusterPolicyList");
        assert!(info.field_label("spec.mode").is_some());
        assert!(
            registry
                .find("nvidia.com", "v1alpha1", "clusterpolicies")
                .is_none(),
            "not served"
        );
        assert!(registry.find_kind("nvidia.com/v1", "ClusterPolicy").is_some());
        registry.unregister_crd(&crd());
        assert!(registry.find("nvidia.com", "v1", "clusterpolicies").is_none());
    }

    #[test]
    fn crd_problems_are_named() {
        let mut bad = crd();
        bad["metadata"]["name"] = json!("wrong");
        bad["spec"]["versions"][0]["storage"] = json!(false);
        let mut causes = Vec::new();
        validate_crd(&bad, None, &mut causes);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["metadata.name", "spec.versions"]);
    }

    #[test]
    fn field_labels_read_go_zero_values() {
        let registry = Registry::builtin();
        let pods = registry.find("", "v1", "pods").expect("pods");
        let pod = json!({"spec": {"nodeName": "n1"}});
        assert_eq!(
            pods.field_label("spec.nodeName").expect("label").value_of(&pod),
            "n1"
        );
        assert_eq!(
            pods.field_label("spec.hostNetwork")
                .expect("label")
                .value_of(&pod),
            "false"
        );
        assert_eq!(
            pods.field_label("status.phase").expect("label").value_of(&pod),
            ""
        );
    }
}
