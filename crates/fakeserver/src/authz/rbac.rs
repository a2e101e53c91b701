//! The RBAC authorizer, evaluated as Kubernetes' does (`plugin/pkg/auth/authorizer/rbac` and
//! `pkg/registry/rbac/validation`): a pure function of the Roles, ClusterRoles, RoleBindings and
//! ClusterRoleBindings held in an [`RbacIndex`] and a request's [`Attributes`].
//!
//! The index is kept up to date from the store's changes and looks bindings up by subject, so a decision
//! reads only the bindings that name the user or one of its groups. Unlike the real authorizer, which
//! stops at the first rule that allows, [`authorize`] reports every rule that allows the request, so the
//! accounting can tell which granted rules were never needed; the decision itself is the same.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::json;
use crate::selector::LabelSelector;

/// `*`: every verb, group, resource or URL.
const ALL: &str = "*";

/// One rule of a Role or ClusterRole (`rbac.authorization.k8s.io/v1 PolicyRule`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    /// Verbs, or `*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verbs: Vec<String>,
    /// API groups (`""` is core), or `*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    /// Resources, `resource/subresource`, `*/subresource` or `*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// Object names the rule is restricted to; empty for all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    /// Non-resource paths, exact or ending in `*`.
    #[serde(default, rename = "nonResourceURLs", skip_serializing_if = "Vec::is_empty")]
    pub non_resource_urls: Vec<String>,
}

/// The string at `pointer`, owned.
fn text(value: &Value, pointer: &str) -> String {
    json::text(value, pointer).to_owned()
}

impl PolicyRule {
    /// The rule as stored JSON writes it.
    pub fn from_json(value: &Value) -> Self {
        Self {
            verbs: json::strings(value, "/verbs"),
            api_groups: json::strings(value, "/apiGroups"),
            resources: json::strings(value, "/resources"),
            resource_names: json::strings(value, "/resourceNames"),
            non_resource_urls: json::strings(value, "/nonResourceURLs"),
        }
    }

    /// The rules of a Role or ClusterRole object.
    pub fn all_from(object: &Value) -> Vec<Self> {
        object
            .get("rules")
            .and_then(Value::as_array)
            .map(|rules| rules.iter().map(Self::from_json).collect())
            .unwrap_or_default()
    }

    /// Whether the rule allows the request (`RuleAllows`).
    pub fn allows(&self, attrs: &Attributes) -> bool {
        if !verb_matches(&self.verbs, &attrs.verb) {
            return false;
        }
        if !attrs.resource_request {
            return self.non_resource_urls.iter().any(|url| {
                url == ALL
                    || *url == attrs.path
                    || url
                        .strip_suffix('*')
                        .is_some_and(|prefix| attrs.path.starts_with(prefix))
            });
        }
        let group_matches = self.api_groups.iter().any(|g| g == ALL || *g == attrs.api_group);
        group_matches
            && self.resource_matches(&attrs.resource, &attrs.subresource)
            && (self.resource_names.is_empty() || self.resource_names.contains(&attrs.name))
    }

    fn resource_matches(&self, resource: &str, subresource: &str) -> bool {
        let combined = if subresource.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}/{subresource}")
        };
        self.resources.iter().any(|rule| {
            rule == ALL
                || *rule == combined
                || (!subresource.is_empty() && rule.strip_prefix("*/").is_some_and(|sub| sub == subresource))
        })
    }

    /// The rule as the API server prints it in escalation errors (`CompactString`):
    /// `{APIGroups:["apps"], Resources:["daemonsets"], Verbs:["get" "list"]}`.
    pub fn compact_string(&self) -> String {
        let mut parts = Vec::new();
        for (name, values) in [
            ("APIGroups", &self.api_groups),
            ("Resources", &self.resources),
            ("NonResourceURLs", &self.non_resource_urls),
            ("ResourceNames", &self.resource_names),
            ("Verbs", &self.verbs),
        ] {
            if !values.is_empty() {
                parts.push(format!("{name}:{}", go_quote_list(values)));
            }
        }
        format!("{{{}}}", parts.join(", "))
    }
}

fn verb_matches(verbs: &[String], verb: &str) -> bool {
    verbs.iter().any(|v| v == ALL || v == verb)
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
pub(crate) fn go_quote_list(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// Who is asking: the authenticated user's name and groups.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UserInfo {
    /// The user name, e.g. `system:serviceaccount:gpu-operator:gpu-operator`.
    pub name: String,
    /// Its groups, e.g. `system:serviceaccounts`, `system:authenticated`.
    pub groups: Vec<String>,
}

/// The superuser group: the API server allows its members everything before RBAC is asked.
pub const MASTERS: &str = "system:masters";

impl UserInfo {
    /// Whether the user is in `system:masters`.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }
}

/// What a request asks to do, as the API server's `RequestInfoFactory` derives it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection` (or a special verb
    /// such as `escalate`, `bind`).
    pub verb: String,
    /// Whether the path names a resource (else it is a non-resource path such as `/healthz`).
    pub resource_request: bool,
    /// API group, "" for core.
    pub api_group: String,
    /// API version.
    pub api_version: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource, or "".
    pub subresource: String,
    /// Namespace, or "" for cluster scope.
    pub namespace: String,
    /// Object name, or "".
    pub name: String,
    /// The URL path.
    pub path: String,
}

impl Attributes {
    /// A resource request (for reviews, escalation checks and tests).
    pub fn resource(verb: &str, group: &str, resource: &str, namespace: &str, name: &str) -> Self {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        Self {
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            api_version: "*".into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
            path: String::new(),
        }
    }

    /// A non-resource request.
    pub fn non_resource(verb: &str, path: &str) -> Self {
        Self {
            verb: verb.into(),
            path: path.into(),
            ..Self::default()
        }
    }

    /// `resource` or `resource/subresource`.
    pub fn combined_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// The API server's `forbiddenMessage` for a user denied this request.
    pub fn forbidden_message(&self, user: &str) -> String {
        if !self.resource_request {
            return format!("User {user:?} cannot {} path {:?}", self.verb, self.path);
        }
        let resource = self.combined_resource();
        if self.namespace.is_empty() {
            format!(
                "User {user:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
                self.verb, self.api_group
            )
        } else {
            format!(
                "User {user:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
                self.verb, self.api_group, self.namespace
            )
        }
    }
}

/// `Role` or `ClusterRole`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RoleKind {
    /// A namespaced Role.
    Role,
    /// A ClusterRole.
    ClusterRole,
}

/// A Role or ClusterRole by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RoleId {
    /// Role or ClusterRole.
    pub kind: RoleKind,
    /// The Role's namespace; "" for a ClusterRole.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl RoleId {
    /// The role a binding in `binding_namespace` refers to: a Role in the binding's own namespace, or a
    /// ClusterRole, which has none.
    pub(crate) fn referenced(kind: RoleKind, binding_namespace: &str, name: &str) -> Self {
        let namespace = match kind {
            RoleKind::Role => binding_namespace.to_owned(),
            RoleKind::ClusterRole => String::new(),
        };
        Self {
            kind,
            namespace,
            name: name.to_owned(),
        }
    }
}

/// One rule of one role: the role and the rule's index in its (aggregated, for aggregated ClusterRoles)
/// rules.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RuleId {
    /// The role.
    pub role: RoleId,
    /// Index into its rules.
    pub index: usize,
}

/// `RoleBinding` or `ClusterRoleBinding`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BindingKind {
    /// ClusterRoleBindings are visited first, as the real authorizer does.
    ClusterRoleBinding,
    /// A namespaced RoleBinding.
    RoleBinding,
}

/// A binding by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BindingId {
    /// RoleBinding or ClusterRoleBinding.
    pub kind: BindingKind,
    /// The RoleBinding's namespace; "" for a ClusterRoleBinding.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for BindingId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            BindingKind::ClusterRoleBinding => write!(f, "ClusterRoleBinding/{}", self.name),
            BindingKind::RoleBinding => write!(f, "RoleBinding/{}/{}", self.namespace, self.name),
        }
    }
}

/// A binding's subject.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Subject {
    kind: String,
    name: String,
    namespace: String,
}

impl Subject {
    /// Who the subject is, as the index keys it: service accounts become their user names.
    fn key(&self, binding_namespace: &str) -> Option<SubjectKey> {
        match self.kind.as_str() {
            "User" => Some(SubjectKey::User(self.name.clone())),
            "Group" => Some(SubjectKey::Group(self.name.clone())),
            "ServiceAccount" => {
                let namespace = if self.namespace.is_empty() {
                    binding_namespace
                } else {
                    &self.namespace
                };
                Some(SubjectKey::User(service_account_user(namespace, &self.name)))
            }
            _ => None,
        }
    }

    /// `describeSubject`: `Group "system:masters"`, `ServiceAccount "name/namespace"` (sic: the real
    /// server puts the name first).
    fn describe(&self, binding_namespace: &str) -> String {
        if self.kind == "ServiceAccount" {
            let namespace = if self.namespace.is_empty() {
                binding_namespace
            } else {
                &self.namespace
            };
            format!("{} {:?}", self.kind, format!("{}/{namespace}", self.name))
        } else {
            format!("{} {:?}", self.kind, self.name)
        }
    }
}

/// The user name of a service account.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum SubjectKey {
    User(String),
    Group(String),
}

#[derive(Clone, Debug)]
struct Binding {
    role: RoleId,
    subjects: Vec<Subject>,
}

#[derive(Clone, Debug, Default)]
struct RoleEntry {
    rules: Vec<PolicyRule>,
    labels: Vec<(String, String)>,
    aggregation: Option<Vec<LabelSelector>>,
}

/// A rule granted to a user, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The rule.
    pub rule: PolicyRule,
    /// The bindings that grant its role to the user.
    pub bindings: BTreeSet<BindingId>,
    /// Whether its role is part of the server's bootstrap policy (`kubernetes.io/bootstrapping:
    /// rbac-defaults`), such as `system:discovery`.
    pub bootstrap: bool,
}

/// Roles and bindings, with bindings found by subject.
#[derive(Clone, Debug, Default)]
pub struct RbacIndex {
    roles: HashMap<(String, String), RoleEntry>,
    cluster_roles: BTreeMap<String, RoleEntry>,
    bindings: HashMap<BindingId, Binding>,
    by_subject: HashMap<SubjectKey, BTreeSet<BindingId>>,
}

/// The kind of object an [`RbacIndex`] change is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RbacKind {
    /// `roles`.
    Role,
    /// `clusterroles`.
    ClusterRole,
    /// `rolebindings`.
    RoleBinding,
    /// `clusterrolebindings`.
    ClusterRoleBinding,
}

impl RbacKind {
    /// The kind stored under this plural resource of `rbac.authorization.k8s.io`.
    pub fn from_plural(plural: &str) -> Option<Self> {
        Some(match plural {
            "roles" => Self::Role,
            "clusterroles" => Self::ClusterRole,
            "rolebindings" => Self::RoleBinding,
            "clusterrolebindings" => Self::ClusterRoleBinding,
            _ => return None,
        })
    }
}

impl RbacIndex {
    /// Records that `object` (of `kind`) now exists as given.
    pub fn upsert(&mut self, kind: RbacKind, object: &Value) {
        let namespace = text(object, "/metadata/namespace");
        let name = text(object, "/metadata/name");
        match kind {
            RbacKind::Role => {
                self.roles.insert((namespace, name), role_entry(object, false));
            }
            RbacKind::ClusterRole => {
                self.cluster_roles.insert(name, role_entry(object, true));
            }
            RbacKind::RoleBinding | RbacKind::ClusterRoleBinding => {
                let (binding_kind, namespace) = if kind == RbacKind::RoleBinding {
                    (BindingKind::RoleBinding, namespace)
                } else {
                    (BindingKind::ClusterRoleBinding, String::new())
                };
                let id = BindingId {
                    kind: binding_kind,
                    namespace: namespace.clone(),
                    name,
                };
                self.remove_binding(&id);
                let role_kind = if text(object, "/roleRef/kind") == "Role" {
                    RoleKind::Role
                } else {
                    RoleKind::ClusterRole
                };
                let role = RoleId::referenced(role_kind, &namespace, json::text(object, "/roleRef/name"));
                let subjects: Vec<Subject> = json::items(object, "/subjects")
                    .map(|s| Subject {
                        kind: text(s, "/kind"),
                        name: text(s, "/name"),
                        namespace: text(s, "/namespace"),
                    })
                    .collect();
                for subject in &subjects {
                    if let Some(key) = subject.key(&namespace) {
                        self.by_subject.entry(key).or_default().insert(id.clone());
                    }
                }
                self.bindings.insert(id, Binding { role, subjects });
            }
        }
    }

    /// Records that `object` (of `kind`) is gone.
    pub fn remove(&mut self, kind: RbacKind, object: &Value) {
        let namespace = text(object, "/metadata/namespace");
        let name = text(object, "/metadata/name");
        match kind {
            RbacKind::Role => {
                self.roles.remove(&(namespace, name));
            }
            RbacKind::ClusterRole => {
                self.cluster_roles.remove(&name);
            }
            RbacKind::RoleBinding => self.remove_binding(&BindingId {
                kind: BindingKind::RoleBinding,
                namespace,
                name,
            }),
            RbacKind::ClusterRoleBinding => self.remove_binding(&BindingId {
                kind: BindingKind::ClusterRoleBinding,
                namespace: String::new(),
                name,
            }),
        }
    }

    fn remove_binding(&mut self, id: &BindingId) {
        let Some(binding) = self.bindings.remove(id) else {
            return;
        };
        for subject in &binding.subjects {
            if let Some(key) = subject.key(&id.namespace)
                && let Some(ids) = self.by_subject.get_mut(&key)
            {
                ids.remove(id);
                if ids.is_empty() {
                    self.by_subject.remove(&key);
                }
            }
        }
    }

    /// The rules of a role, aggregated ones filled in as the cluster-role aggregation controller does:
    /// for each selector in order, the rules of the matching ClusterRoles by name, each rule once.
    /// `Err` is the lister's not-found message.
    pub fn role_rules(&self, role: &RoleId) -> Result<Vec<PolicyRule>, String> {
        let entry = match role.kind {
            RoleKind::Role => self.roles.get(&(role.namespace.clone(), role.name.clone())),
            RoleKind::ClusterRole => self.cluster_roles.get(&role.name),
        };
        let Some(entry) = entry else {
            let singular = match role.kind {
                RoleKind::Role => "role",
                RoleKind::ClusterRole => "clusterrole",
            };
            return Err(format!(
                "{singular}.rbac.authorization.k8s.io {:?} not found",
                role.name
            ));
        };
        let Some(selectors) = &entry.aggregation else {
            return Ok(entry.rules.clone());
        };
        let mut rules: Vec<PolicyRule> = Vec::new();
        for selector in selectors {
            for (name, other) in &self.cluster_roles {
                if *name == role.name || !selector.matches(other.labels.as_slice()) {
                    continue;
                }
                for rule in &other.rules {
                    if !rules.contains(rule) {
                        rules.push(rule.clone());
                    }
                }
            }
        }
        Ok(rules)
    }

    fn is_bootstrap(&self, role: &RoleId) -> bool {
        let entry = match role.kind {
            RoleKind::Role => self.roles.get(&(role.namespace.clone(), role.name.clone())),
            RoleKind::ClusterRole => self.cluster_roles.get(&role.name),
        };
        entry.is_some_and(|e| {
            e.labels
                .iter()
                .any(|(k, v)| k == "kubernetes.io/bootstrapping" && v == "rbac-defaults")
        })
    }

    /// The bindings that apply to `user` in `namespace` ("" for cluster scope: ClusterRoleBindings only),
    /// ClusterRoleBindings first, each with the first subject that names the user.
    fn bindings_for<'a>(
        &'a self,
        user: &'a UserInfo,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a BindingId, &'a Binding, &'a Subject)> + 'a {
        let mut ids: BTreeSet<&BindingId> = BTreeSet::new();
        let keys = std::iter::once(SubjectKey::User(user.name.clone()))
            .chain(user.groups.iter().cloned().map(SubjectKey::Group));
        for key in keys {
            if let Some(found) = self.by_subject.get(&key) {
                ids.extend(found);
            }
        }
        ids.into_iter().filter_map(move |id| {
            let in_scope = match (id.kind, namespace) {
                (BindingKind::ClusterRoleBinding, _) => true,
                (BindingKind::RoleBinding, None) => true,
                (BindingKind::RoleBinding, Some(ns)) => !ns.is_empty() && id.namespace == ns,
            };
            if !in_scope {
                return None;
            }
            let binding = self.bindings.get(id)?;
            let subject = binding
                .subjects
                .iter()
                .find(|s| applies(s, user, &id.namespace))?;
            Some((id, binding, subject))
        })
    }

    /// Every rule granted to `user` by any binding in any namespace.
    pub fn granted(&self, user: &UserInfo) -> BTreeMap<RuleId, Granted> {
        let mut granted: BTreeMap<RuleId, Granted> = BTreeMap::new();
        for (id, binding, _) in self.bindings_for(user, None) {
            let Ok(rules) = self.role_rules(&binding.role) else {
                continue;
            };
            let bootstrap = self.is_bootstrap(&binding.role);
            for (index, rule) in rules.into_iter().enumerate() {
                let rule_id = RuleId {
                    role: binding.role.clone(),
                    index,
                };
                granted
                    .entry(rule_id)
                    .or_insert_with(|| Granted {
                        rule,
                        bindings: BTreeSet::new(),
                        bootstrap,
                    })
                    .bindings
                    .insert(id.clone());
            }
        }
        granted
    }

    /// The rules `user` holds in `namespace` ("" for cluster-wide), and the resolution errors met
    /// (`RulesFor`).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> (Vec<PolicyRule>, Vec<String>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        for (_, binding, _) in self.bindings_for(user, Some(namespace)) {
            match self.role_rules(&binding.role) {
                Ok(found) => rules.extend(found),
                Err(error) => errors.push(error),
            }
        }
        (rules, errors)
    }
}

fn role_entry(object: &Value, cluster: bool) -> RoleEntry {
    let labels = json::string_entries(object, "/metadata/labels");
    let aggregation = cluster
        .then(|| object.pointer("/aggregationRule/clusterRoleSelectors"))
        .flatten()
        .and_then(Value::as_array)
        .map(|selectors| {
            selectors
                .iter()
                .filter_map(|s| LabelSelector::from_object(Some(s)).ok())
                .collect()
        });
    RoleEntry {
        rules: PolicyRule::all_from(object),
        labels,
        aggregation,
    }
}

fn applies(subject: &Subject, user: &UserInfo, binding_namespace: &str) -> bool {
    match subject.key(binding_namespace) {
        Some(SubjectKey::User(name)) => name == user.name,
        Some(SubjectKey::Group(group)) => user.groups.contains(&group),
        None => false,
    }
}

/// What RBAC decided about a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Whether some rule allows it.
    pub allowed: bool,
    /// As the real authorizer words it: `RBAC: allowed by ClusterRoleBinding "x" of ClusterRole "y" to
    /// Group "z"` when allowed; when denied, `RBAC: ` and the roles that could not be found, or "".
    pub reason: String,
    /// Every rule that allows the request.
    pub matched: Vec<RuleId>,
}

/// Decides a request the way the RBAC authorizer does, listing every rule that allows it.
pub fn authorize(index: &RbacIndex, user: &UserInfo, attrs: &Attributes) -> Decision {
    let mut decision = Decision::default();
    let mut errors = Vec::new();
    for (id, binding, subject) in index.bindings_for(user, Some(&attrs.namespace)) {
        let rules = match index.role_rules(&binding.role) {
            Ok(rules) => rules,
            Err(error) => {
                errors.push(error);
                continue;
            }
        };
        for (index, rule) in rules.iter().enumerate() {
            if !rule.allows(attrs) {
                continue;
            }
            if !decision.allowed {
                decision.allowed = true;
                let role_kind = match binding.role.kind {
                    RoleKind::Role => "Role",
                    RoleKind::ClusterRole => "ClusterRole",
                };
                let binding_name = match id.kind {
                    BindingKind::ClusterRoleBinding => format!("ClusterRoleBinding {:?}", id.name),
                    // Name first, then namespace, as the real server prints it.
                    BindingKind::RoleBinding => {
                        format!("RoleBinding {:?}", format!("{}/{}", id.name, id.namespace))
                    }
                };
                decision.reason = format!(
                    "RBAC: allowed by {binding_name} of {role_kind} {:?} to {}",
                    binding.role.name,
                    subject.describe(&id.namespace)
                );
            }
            let rule_id = RuleId {
                role: binding.role.clone(),
                index,
            };
            if !decision.matched.contains(&rule_id) {
                decision.matched.push(rule_id);
            }
        }
    }
    if !decision.allowed && !errors.is_empty() {
        decision.reason = format!("RBAC: {}", aggregate(&errors));
    }
    decision
}

/// Go's `utilerrors.NewAggregate(...).Error()`.
fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// Each rule split into one rule per group, resource, verb and name (`BreakdownRule`).
fn breakdown(rule: &PolicyRule) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    for group in &rule.api_groups {
        for resource in &rule.resources {
            for verb in &rule.verbs {
                let one = |names: Vec<String>| PolicyRule {
                    verbs: vec![verb.clone()],
                    api_groups: vec![group.clone()],
                    resources: vec![resource.clone()],
                    resource_names: names,
                    non_resource_urls: Vec::new(),
                };
                if rule.resource_names.is_empty() {
                    out.push(one(Vec::new()));
                } else {
                    out.extend(rule.resource_names.iter().map(|n| one(vec![n.clone()])));
                }
            }
        }
    }
    for url in &rule.non_resource_urls {
        for verb in &rule.verbs {
            out.push(PolicyRule {
                verbs: vec![verb.clone()],
                non_resource_urls: vec![url.clone()],
                ..PolicyRule::default()
            });
        }
    }
    out
}

fn has_all(owner: &[String], wanted: &[String]) -> bool {
    wanted.iter().all(|w| owner.contains(w))
}

/// Whether one owner rule covers a broken-down rule (`ruleCovers`).
fn rule_covers(owner: &PolicyRule, sub: &PolicyRule) -> bool {
    let verbs = owner.verbs.iter().any(|v| v == ALL) || has_all(&owner.verbs, &sub.verbs);
    let groups = owner.api_groups.iter().any(|g| g == ALL) || has_all(&owner.api_groups, &sub.api_groups);
    let resources = owner.resources.iter().any(|r| r == ALL)
        || sub.resources.iter().all(|wanted| {
            owner.resources.contains(wanted)
                || wanted
                    .split_once('/')
                    .is_some_and(|(_, subresource)| owner.resources.contains(&format!("*/{subresource}")))
        });
    let urls = sub.non_resource_urls.iter().all(|wanted| {
        owner.non_resource_urls.iter().any(|have| {
            have == wanted
                || have
                    .strip_suffix('*')
                    .is_some_and(|prefix| wanted.starts_with(prefix))
        })
    });
    let names = if sub.resource_names.is_empty() {
        owner.resource_names.is_empty()
    } else {
        owner.resource_names.is_empty() || has_all(&owner.resource_names, &sub.resource_names)
    };
    verbs && groups && resources && urls && names
}

/// The parts of `requested` that no rule of `owner` covers (`Covers`), broken down.
pub fn uncovered(owner: &[PolicyRule], requested: &[PolicyRule]) -> Vec<PolicyRule> {
    requested
        .iter()
        .flat_map(breakdown)
        .filter(|sub| !owner.iter().any(|o| rule_covers(o, sub)))
        .collect()
}

/// Merges rules for one group and resource that differ only by verb (`CompactRules`).
fn compact(rules: Vec<PolicyRule>) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = Vec::new();
    let mut simple: HashMap<(String, String, Option<String>), usize> = HashMap::new();
    for rule in rules {
        let is_simple = rule.resource_names.len() <= 1
            && rule.non_resource_urls.is_empty()
            && rule.api_groups.len() == 1
            && rule.resources.len() == 1;
        if !is_simple {
            out.push(rule);
            continue;
        }
        let key = (
            rule.api_groups[0].clone(),
            rule.resources[0].clone(),
            rule.resource_names.first().cloned(),
        );
        match simple.get(&key) {
            Some(&at) => {
                for verb in rule.verbs {
                    if !out[at].verbs.contains(&verb) {
                        out[at].verbs.push(verb);
                    }
                }
            }
            None => {
                simple.insert(key, out.len());
                out.push(rule);
            }
        }
    }
    out
}

/// The API server's refusal of a role or binding that grants more than its writer holds
/// (`ConfirmNoEscalation`), or `None` when `held` covers `requested`.
pub fn escalation_error(
    user: &UserInfo,
    held: &[PolicyRule],
    resolution_errors: &[String],
    requested: &[PolicyRule],
) -> Option<String> {
    let missing = uncovered(held, requested);
    if missing.is_empty() {
        return None;
    }
    let described: BTreeSet<String> = compact(missing).iter().map(PolicyRule::compact_string).collect();
    let mut message = format!(
        "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        user.name,
        go_quote_list(&user.groups),
        described.into_iter().collect::<Vec<_>>().join("\n")
    );
    if !resolution_errors.is_empty() {
        // `RulesFor` returns one aggregate error, printed inside a `[]error`.
        let _ = write!(message, "; resolution errors: [{}]", aggregate(resolution_errors));
    }
    Some(message)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    fn sa_user(namespace: &str, name: &str) -> UserInfo {
        user(
            &service_account_user(namespace, name),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{namespace}"),
                "system:authenticated",
            ],
        )
    }

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Value {
        json!({"verbs": verbs, "apiGroups": groups, "resources": resources})
    }

    fn cluster_role(name: &str, rules: Vec<Value>) -> Value {
        let mut role = json!({"metadata": {"name": name}});
        role["rules"] = Value::Array(rules);
        role
    }

    fn role(namespace: &str, name: &str, rules: Vec<Value>) -> Value {
        let mut role = json!({"metadata": {"name": name, "namespace": namespace}});
        role["rules"] = Value::Array(rules);
        role
    }

    fn binding(namespace: Option<&str>, name: &str, role_kind: &str, role: &str, subjects: Value) -> Value {
        let mut metadata = json!({"name": name});
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        let mut binding = json!({"metadata": metadata, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
               "subjects": null});
        binding["subjects"] = subjects;
        binding
    }

    /// Binds the ClusterRole `role` to `subjects` cluster-wide, in a binding of the same name.
    fn bind_cluster_role(index: &mut RbacIndex, role: &str, subjects: Value) {
        index.upsert(
            RbacKind::ClusterRoleBinding,
            &binding(None, role, "ClusterRole", role, subjects),
        );
    }

    fn sa(namespace: &str, name: &str) -> Value {
        json!([{"kind": "ServiceAccount", "name": name, "namespace": namespace}])
    }

    fn allowed(index: &RbacIndex, user: &UserInfo, attrs: &Attributes) -> bool {
        authorize(index, user, attrs).allowed
    }

    #[test]
    fn verbs_groups_resources_and_subresources_match_as_kubernetes_does() {
        let mut index = RbacIndex::default();
        index.upsert(
            RbacKind::ClusterRole,
            &cluster_role(
                "op",
                vec![
                    rule(&["get", "list", "watch"], &[""], &["nodes"]),
                    rule(&["patch"], &[""], &["nodes/status"]),
                    rule(&["create"], &[""], &["*/eviction"]),
                    rule(&["*"], &["apps"], &["daemonsets"]),
                ],
            ),
        );
        bind_cluster_role(&mut index, "op", sa("gpu-operator", "gpu-operator"));
        let me = sa_user("gpu-operator", "gpu-operator");
        let at = |verb: &str, group: &str, resource: &str, ns: &str, name: &str| {
            allowed(
                &index,
                &me,
                &Attributes::resource(verb, group, resource, ns, name),
            )
        };
        assert!(at("list", "", "nodes", "", ""));
        assert!(at("watch", "", "nodes", "", ""));
        assert!(
            !at("patch", "", "nodes", "", "n1"),
            "nodes/status does not grant nodes"
        );
        assert!(at("patch", "", "nodes/status", "", "n1"));
        assert!(!at("get", "", "nodes/status", "", "n1"));
        assert!(at("create", "", "pods/eviction", "ns", "p"), "*/eviction");
        assert!(
            !at("create", "", "pods", "ns", ""),
            "*/eviction does not grant pods"
        );
        assert!(at("deletecollection", "apps", "daemonsets", "x", ""), "* verbs");
        assert!(!at("list", "extensions", "daemonsets", "x", ""), "other group");
        assert!(
            !at("list", "apps", "daemonsets/status", "x", ""),
            "subresource needs naming"
        );
        let other = sa_user("gpu-operator", "other");
        assert!(!allowed(
            &index,
            &other,
            &Attributes::resource("list", "", "nodes", "", "")
        ));
    }

    #[test]
    fn resource_names_restrict_only_requests_that_name_an_object() {
        let mut index = RbacIndex::default();
        index.upsert(
            RbacKind::ClusterRole,
            &cluster_role(
                "cp",
                vec![
                    json!({"verbs": ["get", "list", "watch", "create", "update"], "apiGroups": ["nvidia.com"],
                            "resources": ["clusterpolicies"], "resourceNames": ["cluster-policy"]}),
                ],
            ),
        );
        bind_cluster_role(&mut index, "cp", json!([{"kind": "User", "name": "alice"}]));
        let alice = user("alice", &["system:authenticated"]);
        let at = |verb: &str, name: &str| {
            allowed(
                &index,
                &alice,
                &Attributes::resource(verb, "nvidia.com", "clusterpolicies", "", name),
            )
        };
        assert!(at("get", "cluster-policy"));
        assert!(at("update", "cluster-policy"));
        assert!(!at("get", "other"));
        assert!(!at("list", ""), "a list names nothing");
        assert!(
            at("list", "cluster-policy"),
            "list with fieldSelector metadata.name"
        );
        assert!(!at("create", ""), "create cannot be restricted by name");
    }

    #[test]
    fn role_bindings_grant_only_in_their_namespace_and_may_reference_cluster_roles() {
        let mut index = RbacIndex::default();
        index.upsert(
            RbacKind::ClusterRole,
            &cluster_role("cm-reader", vec![rule(&["get"], &[""], &["configmaps"])]),
        );
        index.upsert(
            RbacKind::Role,
            &role("a", "secrets", vec![rule(&["get"], &[""], &["secrets"])]),
        );
        index.upsert(
            RbacKind::RoleBinding,
            &binding(
                Some("a"),
                "read",
                "ClusterRole",
                "cm-reader",
                json!([{"kind": "ServiceAccount", "name": "sa"}]),
            ),
        );
        index.upsert(
            RbacKind::RoleBinding,
            &binding(
                Some("a"),
                "secrets",
                "Role",
                "secrets",
                json!([{"kind": "Group", "name": "system:serviceaccounts:a"}]),
            ),
        );
        let me = sa_user("a", "sa");
        let at = |index: &RbacIndex, resource: &str, ns: &str| {
            allowed(index, &me, &Attributes::resource("get", "", resource, ns, "x"))
        };
        assert!(
            at(&index, "configmaps", "a"),
            "ServiceAccount subject defaults to the binding's namespace"
        );
        assert!(!at(&index, "configmaps", "b"));
        assert!(
            !at(&index, "configmaps", ""),
            "a RoleBinding grants nothing cluster-wide"
        );
        assert!(at(&index, "secrets", "a"), "Group subject");
        assert!(!allowed(
            &index,
            &sa_user("b", "sa"),
            &Attributes::resource("get", "", "configmaps", "a", "x")
        ));
        let decision = authorize(
            &index,
            &me,
            &Attributes::resource("get", "", "configmaps", "a", "x"),
        );
        assert_eq!(
            decision.reason,
            r#"RBAC: allowed by RoleBinding "read/a" of ClusterRole "cm-reader" to ServiceAccount "sa/a""#
        );
        index.remove(
            RbacKind::RoleBinding,
            &binding(Some("a"), "read", "ClusterRole", "cm-reader", json!([])),
        );
        assert!(!at(&index, "configmaps", "a"), "deleting the binding revokes");
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_trailing_star() {
        let mut index = RbacIndex::default();
        index.upsert(
            RbacKind::ClusterRole,
            &cluster_role(
                "d",
                vec![json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/apis/*"]})],
            ),
        );
        bind_cluster_role(
            &mut index,
            "d",
            json!([{"kind": "Group", "name": "system:authenticated"}]),
        );
        let me = user("bob", &["system:authenticated"]);
        assert!(allowed(&index, &me, &Attributes::non_resource("get", "/healthz")));
        assert!(!allowed(
            &index,
            &me,
            &Attributes::non_resource("get", "/healthz/etcd")
        ));
        assert!(allowed(
            &index,
            &me,
            &Attributes::non_resource("get", "/apis/apps/v1")
        ));
        assert!(!allowed(
            &index,
            &me,
            &Attributes::non_resource("post", "/healthz")
        ));
        assert!(!allowed(
            &index,
            &me,
            &Attributes::non_resource("get", "/metrics")
        ));
    }

    #[test]
    fn every_matching_rule_is_reported_and_missing_roles_are_the_reason() {
        let mut index = RbacIndex::default();
        index.upsert(
            RbacKind::ClusterRole,
            &cluster_role(
                "r",
                vec![rule(&["list"], &[""], &["nodes"]), rule(&["*"], &["*"], &["*"])],
            ),
        );
        bind_cluster_role(&mut index, "r", json!([{"kind": "User", "name": "u"}]));
        bind_cluster_role(&mut index, "gone", json!([{"kind": "User", "name": "v"}]));
        let decision = authorize(
            &index,
            &user("u", &[]),
            &Attributes::resource("list", "", "nodes", "", ""),
        );
        assert!(decision.allowed);
        assert_eq!(
            decision.matched.iter().map(|r| r.index).collect::<Vec<_>>(),
            [0, 1]
        );
        let denied = authorize(
            &index,
            &user("v", &[]),
            &Attributes::resource("list", "", "nodes", "", ""),
        );
        assert!(!denied.allowed);
        assert_eq!(
            denied.reason,
            r#"RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found"#
        );
    }

    #[test]
    fn aggregated_cluster_roles_take_the_rules_of_the_roles_they_select() {
        let mut index = RbacIndex::default();
        index.upsert(
            RbacKind::ClusterRole,
            &json!({"metadata": {"name": "view"},
                    "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "view"}}]}, "rules": []}),
        );
        index.upsert(
            RbacKind::ClusterRole,
            &json!({"metadata": {"name": "gpu-view", "labels": {"agg": "view"}},
                    "rules": [rule(&["get"], &["nvidia.com"], &["clusterpolicies"])]}),
        );
        index.upsert(
            RbacKind::ClusterRoleBinding,
            &binding(
                None,
                "v",
                "ClusterRole",
                "view",
                json!([{"kind": "User", "name": "u"}]),
            ),
        );
        let at = |resource: &str| {
            allowed(
                &index,
                &user("u", &[]),
                &Attributes::resource("get", "nvidia.com", resource, "", "p"),
            )
        };
        assert!(at("clusterpolicies"));
        assert!(!at("nvidiadrivers"));
    }

    #[test]
    fn escalation_names_what_is_not_held_in_the_servers_words() {
        let held = vec![PolicyRule::from_json(&rule(&["get", "list"], &[""], &["nodes"]))];
        let me = user("alice", &["dev", "system:authenticated"]);
        assert_eq!(
            escalation_error(
                &me,
                &held,
                &[],
                &[PolicyRule::from_json(&rule(&["list"], &[""], &["nodes"]))]
            ),
            None
        );
        let message = escalation_error(
            &me,
            &held,
            &[],
            &[
                PolicyRule::from_json(&rule(&["get", "patch", "update"], &[""], &["nodes"])),
                PolicyRule::from_json(&json!({"verbs": ["get"], "nonResourceURLs": ["/metrics"]})),
            ],
        )
        .expect("escalates");
        assert_eq!(
            message,
            "user \"alice\" (groups=[\"dev\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n\
             {APIGroups:[\"\"], Resources:[\"nodes\"], Verbs:[\"patch\" \"update\"]}\n\
             {NonResourceURLs:[\"/metrics\"], Verbs:[\"get\"]}"
        );
        let wildcard = vec![PolicyRule::from_json(&rule(&["*"], &["*"], &["*/status"]))];
        assert!(
            uncovered(
                &wildcard,
                &[PolicyRule::from_json(&rule(&["patch"], &[""], &["nodes/status"]))]
            )
            .is_empty()
        );
        let named = vec![PolicyRule::from_json(
            &json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["a"]}),
        )];
        assert!(
            !uncovered(
                &named,
                &[PolicyRule::from_json(&rule(&["get"], &[""], &["secrets"]))]
            )
            .is_empty()
        );
    }

    #[test]
    fn forbidden_messages_name_scope_and_subresource() {
        let attrs = Attributes::resource("create", "", "pods/eviction", "gpu-operator", "p");
        assert_eq!(
            attrs.forbidden_message("u"),
            r#"User "u" cannot create resource "pods/eviction" in API group "" in the namespace "gpu-operator""#
        );
        assert_eq!(
            Attributes::non_resource("get", "/metrics").forbidden_message("u"),
            r#"User "u" cannot get path "/metrics""#
        );
    }
}
