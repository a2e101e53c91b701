//! Who may do what: the server's authentication and authorization, off by default.
//!
//! In [`Authorization::AlwaysAllow`] mode (the default, which tests and benchmarks use) nothing here runs
//! on a request. In [`Authorization::Rbac`] mode the server behaves like a kube-apiserver started with
//! `--authorization-mode=RBAC` and anonymous access limited to the health endpoints:
//! - a request is authenticated by its bearer token: the admin token (user `kubernetes-admin` in
//!   `system:masters`, as kubeadm's admin.conf) or a service-account token minted by a TokenRequest;
//!   no token (except for `/healthz`, `/livez`, `/readyz`) or an unknown, expired or orphaned one is 401;
//! - `Impersonate-User`/`Impersonate-Group` headers (`kubectl --as`) switch to that identity when the
//!   requester may `impersonate` it;
//! - `system:masters` may do everything; anyone else is asked of [`rbac::authorize`] over the
//!   Roles and bindings in the store, with the bootstrap ClusterRoles and bindings a real server creates;
//! - writes of Roles and bindings are refused when they would grant more than the writer holds, unless it
//!   may `escalate` or `bind` (`Escalation`);
//! - every decision is recorded for the [`report::AuthorizationReport`].
//!
//! `rbac` and `request_info` are pure and tested without a server.

pub mod rbac;
pub mod report;
pub mod request_info;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use http::HeaderMap;
use http::header::AUTHORIZATION;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use crate::clock::{Clock, format_time};
use crate::error::{ApiError, Cause, GroupKind, GroupResource};
use crate::json;
use crate::random::Random;
use crate::registry::ResourceInfo;
use rbac::{Attributes, PolicyRule, RbacIndex, RoleId, RoleKind, UserInfo, service_account_user};
use report::{AuthorizationReport, ReportLog};

/// The one question authentication asks of the store: a service account's uid (its tokens die with it). A
/// trait, so that authorization does not depend on the store that depends on it.
pub(crate) trait ServiceAccounts {
    /// The uid of the service account `namespace/name`, or the API's answer when there is none.
    fn service_account_uid(&self, namespace: &str, name: &str) -> Result<String, ApiError>;
}

/// The API group of Roles and bindings.
pub(crate) const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// The admin's user name, as in kubeadm's `admin.conf`.
pub const ADMIN_USER: &str = "kubernetes-admin";

/// The audience of service-account tokens when a TokenRequest names none.
const DEFAULT_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Paths anonymous requests may reach (they are then authorized as `system:anonymous`).
const ANONYMOUS_PATHS: [&str; 3] = ["/healthz", "/livez", "/readyz"];

/// How the server authorizes requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Authorization {
    /// Every request is allowed, with or without credentials (the default).
    #[default]
    AlwaysAllow,
    /// Bearer-token authentication and RBAC, as a real API server.
    Rbac,
}

impl Authorization {
    /// `always-allow` or `rbac`.
    pub fn name(self) -> &'static str {
        match self {
            Self::AlwaysAllow => "always-allow",
            Self::Rbac => "rbac",
        }
    }
}

#[derive(Debug)]
struct Minted {
    namespace: String,
    name: String,
    uid: String,
    expires: Timestamp,
}

/// Tokens, the RBAC index and the decision record.
#[derive(Debug)]
pub(crate) struct Authz {
    mode: Authorization,
    admin_token: String,
    tokens: Mutex<HashMap<String, Minted>>,
    random: Mutex<Random>,
    pub(crate) index: Arc<RwLock<RbacIndex>>,
    log: Mutex<ReportLog>,
    clock: Arc<dyn Clock>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Authz {
    pub(crate) fn new(mode: Authorization, seed: u64, clock: Arc<dyn Clock>) -> Self {
        let mut random = Random::new(seed ^ 0x7a7b_0c0d_1e2f_3a4b);
        let admin_token = format!("admin-{:016x}{:016x}", random.next_u64(), random.next_u64());
        Self {
            mode,
            admin_token,
            tokens: Mutex::new(HashMap::new()),
            random: Mutex::new(random),
            index: Arc::new(RwLock::new(RbacIndex::default())),
            log: Mutex::new(ReportLog::default()),
            clock,
        }
    }

    pub(crate) fn enforcing(&self) -> bool {
        self.mode == Authorization::Rbac
    }

    pub(crate) fn mode(&self) -> Authorization {
        self.mode
    }

    /// The admin's bearer token, in rbac mode.
    pub(crate) fn admin_token(&self) -> Option<&str> {
        self.enforcing().then_some(self.admin_token.as_str())
    }

    fn admin() -> UserInfo {
        UserInfo {
            name: ADMIN_USER.into(),
            groups: vec![rbac::MASTERS.into(), "system:authenticated".into()],
        }
    }

    /// The user a request's credentials name; `None` answers 401.
    pub(crate) fn authenticate(
        &self,
        store: &dyn ServiceAccounts,
        headers: &HeaderMap,
        path: &str,
    ) -> Option<UserInfo> {
        let Some(value) = headers.get(AUTHORIZATION) else {
            return ANONYMOUS_PATHS.contains(&path).then(|| UserInfo {
                name: "system:anonymous".into(),
                groups: vec!["system:unauthenticated".into()],
            });
        };
        let value = value.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let token = token.trim();
        if token == self.admin_token {
            return Some(Self::admin());
        }
        let (namespace, name) = {
            let tokens = lock(&self.tokens);
            let minted = tokens.get(token)?;
            if self.clock.now() >= minted.expires {
                return None;
            }
            // A deleted (or deleted and recreated) service account's tokens are no longer valid.
            let uid = store.service_account_uid(&minted.namespace, &minted.name).ok()?;
            if uid != minted.uid {
                return None;
            }
            (minted.namespace.clone(), minted.name.clone())
        };
        Some(service_account(&namespace, &name))
    }

    /// The user a request acts as: `user`, or whom its `Impersonate-User` and `Impersonate-Group` headers
    /// name if `user` may `impersonate` them (as the real server's impersonation filter decides).
    pub(crate) fn impersonate(&self, user: UserInfo, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
        let values = |name: &str| -> Vec<String> {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::to_owned)
                .collect()
        };
        let names = values("impersonate-user");
        let groups = values("impersonate-group");
        let Some(name) = names.first().cloned() else {
            if groups.is_empty() {
                return Ok(user);
            }
            return Err(ApiError::BadRequest(format!(
                "requested {groups:?} without impersonating a user"
            )));
        };
        let account = name
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'));
        let as_user = match account {
            Some((namespace, account)) => {
                Attributes::resource("impersonate", "", "serviceaccounts", namespace, account)
            }
            None => Attributes::resource("impersonate", "", "users", "", &name),
        };
        self.authorize(&user, &as_user)?;
        for group in &groups {
            self.authorize(
                &user,
                &Attributes::resource("impersonate", "", "groups", "", group),
            )?;
        }
        let mut impersonated = UserInfo {
            name: name.clone(),
            groups: groups.clone(),
        };
        if let Some((namespace, _)) = account
            && groups.is_empty()
        {
            impersonated.groups = vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
            ];
        }
        if name == "system:anonymous" {
            if !impersonated.groups.iter().any(|g| g == "system:unauthenticated") {
                impersonated.groups.push("system:unauthenticated".into());
            }
        } else if !impersonated
            .groups
            .iter()
            .any(|g| g == "system:authenticated" || g == "system:unauthenticated")
        {
            impersonated.groups.push("system:authenticated".into());
        }
        Ok(impersonated)
    }

    /// Whether `user` may make the request; records the decision. `Err` is the 403 to answer.
    pub(crate) fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), ApiError> {
        if user.is_master() {
            return Ok(());
        }
        let decision = {
            let index = self.index.read().unwrap_or_else(PoisonError::into_inner);
            rbac::authorize(&index, user, attrs)
        };
        if decision.allowed {
            lock(&self.log).allowed(user, attrs, &decision.matched);
            return Ok(());
        }
        let error = forbidden(attrs, &user.name, &decision.reason);
        lock(&self.log).denied(user, attrs, &error.to_string());
        Err(error)
    }

    /// The 403 for a path only `system:masters` may read, recorded as any refusal.
    pub(crate) fn masters_only(&self, user: Option<&UserInfo>, attrs: &Attributes) -> Result<(), ApiError> {
        match user {
            Some(user) if self.enforcing() && !user.is_master() => {
                let error = forbidden(attrs, &user.name, "");
                lock(&self.log).denied(user, attrs, &error.to_string());
                Err(error)
            }
            _ => Ok(()),
        }
    }

    /// Answers a TokenRequest for the service account `namespace/name` (`POST .../token`).
    pub(crate) fn token_request(
        &self,
        store: &dyn ServiceAccounts,
        namespace: &str,
        name: &str,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let seconds = body
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(3600);
        let too = if seconds < 600 {
            Some("may not specify a duration less than 10 minutes")
        } else if seconds > 1 << 32 {
            Some("may not specify a duration larger than 2^32 seconds")
        } else {
            None
        };
        if let Some(problem) = too {
            return Err(ApiError::invalid_causes(
                GroupKind {
                    group: "authentication.k8s.io".into(),
                    kind: "TokenRequest".into(),
                },
                // kube-apiserver validates the TokenRequest as sent, which names no object.
                "",
                vec![Cause {
                    reason: "FieldValueInvalid".into(),
                    message: format!("Invalid value: {seconds}: {problem}"),
                    field: "spec.expirationSeconds".into(),
                }],
            ));
        }
        let (token, expires) = self.mint(store, namespace, name, seconds)?;
        let audiences = body
            .pointer("/spec/audiences")
            .filter(|a| a.as_array().is_some_and(|a| !a.is_empty()))
            .cloned()
            .unwrap_or_else(|| json!([DEFAULT_AUDIENCE]));
        Ok(json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": format_time(self.clock.now())},
            "spec": {"audiences": audiences, "expirationSeconds": seconds,
                     "boundObjectRef": body.pointer("/spec/boundObjectRef").cloned().unwrap_or(Value::Null)},
            "status": {"token": token, "expirationTimestamp": format_time(expires)},
        }))
    }

    /// A token for an existing service account, valid for `seconds`.
    pub(crate) fn mint(
        &self,
        store: &dyn ServiceAccounts,
        namespace: &str,
        name: &str,
        seconds: i64,
    ) -> Result<(String, Timestamp), ApiError> {
        let uid = store.service_account_uid(namespace, name)?;
        let expires = self
            .clock
            .now()
            .checked_add(SignedDuration::from_secs(seconds))
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let token = {
            let mut random = lock(&self.random);
            format!("sa-{:016x}{:016x}", random.next_u64(), random.next_u64())
        };
        lock(&self.tokens).insert(
            token.clone(),
            Minted {
                namespace: namespace.into(),
                name: name.into(),
                uid,
                expires,
            },
        );
        if self.enforcing() {
            lock(&self.log).seen(&service_account(namespace, name));
        }
        Ok((token, expires))
    }

    /// Answers a SelfSubjectAccessReview (`user` asks about itself) or a SubjectAccessReview (`user` is
    /// `None`: the spec names the subject), from the same authorizer, recording nothing.
    pub(crate) fn review(
        &self,
        user: Option<&UserInfo>,
        body: &Value,
        kind: &str,
    ) -> Result<Value, ApiError> {
        let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
        let subject = match user {
            Some(user) => user.clone(),
            None => UserInfo {
                name: json::text(&spec, "/user").to_owned(),
                groups: json::strings(&spec, "/groups"),
            },
        };
        let attrs = match (spec.get("resourceAttributes"), spec.get("nonResourceAttributes")) {
            (Some(r), None) => {
                let mut attrs = Attributes::resource(
                    json::text(r, "/verb"),
                    json::text(r, "/group"),
                    json::text(r, "/resource"),
                    json::text(r, "/namespace"),
                    json::text(r, "/name"),
                );
                attrs.subresource = json::text(r, "/subresource").to_owned();
                attrs
            }
            (None, Some(n)) => Attributes::non_resource(json::text(n, "/verb"), json::text(n, "/path")),
            _ => {
                return Err(ApiError::invalid_causes(
                    GroupKind {
                        group: "authorization.k8s.io".into(),
                        kind: kind.into(),
                    },
                    "",
                    vec![Cause {
                        reason: "FieldValueInvalid".into(),
                        message:
                            "exactly one of nonResourceAttributes or resourceAttributes must be specified"
                                .into(),
                        field: "spec.resourceAttributes".into(),
                    }],
                ));
            }
        };
        let (allowed, reason) = if !self.enforcing() || subject.is_master() {
            (true, String::new())
        } else {
            let index = self.index.read().unwrap_or_else(PoisonError::into_inner);
            let decision = rbac::authorize(&index, &subject, &attrs);
            (decision.allowed, decision.reason)
        };
        let mut status = json!({"allowed": allowed});
        if !reason.is_empty() {
            status["reason"] = json!(reason);
        }
        Ok(json!({
            "kind": kind,
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": status,
        }))
    }

    /// Answers a SelfSubjectRulesReview (`kubectl auth can-i --list`): the rules `user` holds in
    /// `spec.namespace`, split into resource and non-resource rules as the real server lists them.
    pub(crate) fn rules_review(&self, user: &UserInfo, body: &Value) -> Value {
        let namespace = json::text(body, "/spec/namespace");
        let (rules, errors) = if !self.enforcing() || user.is_master() {
            let everything = vec![
                PolicyRule::from_json(&json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})),
                PolicyRule::from_json(&json!({"verbs": ["*"], "nonResourceURLs": ["*"]})),
            ];
            (everything, Vec::new())
        } else {
            let index = self.index.read().unwrap_or_else(PoisonError::into_inner);
            index.rules_for(user, namespace)
        };
        let resource_rules: Vec<Value> = rules
            .iter()
            .filter(|r| !r.resources.is_empty())
            .map(|r| {
                let mut rule = json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources});
                if !r.resource_names.is_empty() {
                    rule["resourceNames"] = json!(r.resource_names);
                }
                rule
            })
            .collect();
        let non_resource_rules: Vec<Value> = rules
            .iter()
            .filter(|r| !r.non_resource_urls.is_empty())
            .map(|r| json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}))
            .collect();
        let mut status = json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules,
                                "incomplete": false});
        if !errors.is_empty() {
            status["evaluationError"] = json!(errors.join(", "));
        }
        json!({
            "kind": "SelfSubjectRulesReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": {"namespace": namespace},
            "status": status,
        })
    }

    /// The report of every decision so far.
    pub(crate) fn report(&self) -> AuthorizationReport {
        let index = self.index.read().unwrap_or_else(PoisonError::into_inner);
        lock(&self.log).report(self.mode.name(), &index)
    }

    pub(crate) fn reset_report(&self) {
        lock(&self.log).clear();
    }
}

/// The identity of a service account's tokens.
fn service_account(namespace: &str, name: &str) -> UserInfo {
    UserInfo {
        name: service_account_user(namespace, name),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".into(),
        ],
    }
}

/// The API server's 403 for a refused request: `nodes "n1" is forbidden: User "u" cannot patch resource
/// "nodes" in API group "" at the cluster scope`, with the authorizer's reason appended if it gave one.
pub(crate) fn forbidden(attrs: &Attributes, user: &str, reason: &str) -> ApiError {
    let mut why = attrs.forbidden_message(user);
    if !reason.is_empty() {
        why = format!("{why}: {reason}");
    }
    let resource = GroupResource::new(&attrs.api_group, &attrs.resource);
    let message = if attrs.resource.is_empty() && attrs.api_group.is_empty() {
        format!("forbidden: {why}")
    } else if attrs.name.is_empty() {
        format!("{resource} is forbidden: {why}")
    } else {
        format!("{resource} {:?} is forbidden: {why}", attrs.name)
    };
    ApiError::Forbidden {
        resource,
        name: attrs.name.clone(),
        message,
    }
}

/// The `create` authorization a server-side apply by a user outside `system:masters` must also pass when it
/// creates the object.
#[derive(Debug)]
pub(crate) struct CreateOnApply {
    pub(crate) authz: Arc<Authz>,
    pub(crate) user: UserInfo,
    /// The apply request's attributes, with verb `create`.
    pub(crate) attrs: Attributes,
}

impl CreateOnApply {
    /// Whether the requester may create the object its apply is about to create; records the decision like
    /// any other.
    pub(crate) fn check(&self) -> Result<(), ApiError> {
        self.authz.authorize(&self.user, &self.attrs)
    }
}

/// The check a write of a Role, ClusterRole, RoleBinding or ClusterRoleBinding by a user outside
/// `system:masters` must pass, run by the store on the object about to be stored.
#[derive(Debug)]
pub(crate) struct Escalation {
    pub(crate) authz: Arc<Authz>,
    pub(crate) user: UserInfo,
    /// The write request's attributes (the name is empty for a create).
    pub(crate) attrs: Attributes,
}

/// Only the fields garbage collection touches differ (`IsOnlyMutatingGCFields`, which the server lets
/// through unchecked).
fn only_gc_fields_differ(old: &Value, new: &Value) -> bool {
    let strip = |value: &Value| {
        let mut value = value.clone();
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            for key in [
                "ownerReferences",
                "finalizers",
                "managedFields",
                "resourceVersion",
                "generation",
            ] {
                meta.remove(key);
            }
        }
        value
    };
    strip(old) == strip(new)
}

impl Escalation {
    fn allowed_to(&self, verb: &str, resource: &str, namespace: &str, name: &str) -> bool {
        let attrs = Attributes::resource(verb, RBAC_GROUP, resource, namespace, name);
        let index = self.authz.index.read().unwrap_or_else(PoisonError::into_inner);
        rbac::authorize(&index, &self.user, &attrs).allowed
    }

    fn refuse(&self, info: &ResourceInfo, name: &str, why: &str) -> ApiError {
        let resource = GroupResource::new(RBAC_GROUP, &info.plural);
        let error = ApiError::Forbidden {
            message: format!("{resource} {name:?} is forbidden: {why}"),
            resource,
            name: name.to_owned(),
        };
        lock(&self.authz.log).denied(&self.user, &self.attrs, &error.to_string());
        error
    }

    /// `Ok` when the writer holds what the object grants, or may escalate or bind.
    pub(crate) fn check(
        &self,
        info: &ResourceInfo,
        old: Option<&Value>,
        new: &Value,
    ) -> Result<(), ApiError> {
        if info.group != RBAC_GROUP || info.custom.is_some() || self.user.is_master() {
            return Ok(());
        }
        if old.is_some_and(|old| only_gc_fields_differ(old, new)) {
            return Ok(());
        }
        let name = json::text(new, "/metadata/name");
        let namespace = &self.attrs.namespace;
        let held = |namespace: &str| {
            let index = self.authz.index.read().unwrap_or_else(PoisonError::into_inner);
            index.rules_for(&self.user, namespace)
        };
        match info.plural.as_str() {
            "roles" | "clusterroles" => {
                if self.allowed_to("escalate", &info.plural, namespace, &self.attrs.name) {
                    return Ok(());
                }
                let (rules, errors) = held(namespace);
                let requested = PolicyRule::all_from(new);
                if let Some(why) = rbac::escalation_error(&self.user, &rules, &errors, &requested) {
                    return Err(self.refuse(info, name, &why));
                }
                if info.plural == "clusterroles" && new.get("aggregationRule").is_some_and(|a| !a.is_null()) {
                    let full = [
                        PolicyRule::from_json(
                            &json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}),
                        ),
                        PolicyRule::from_json(&json!({"verbs": ["*"], "nonResourceURLs": ["*"]})),
                    ];
                    if rbac::escalation_error(&self.user, &rules, &errors, &full).is_some() {
                        return Err(self.refuse(
                            info,
                            name,
                            "must have cluster-admin privileges to use the aggregationRule",
                        ));
                    }
                }
                Ok(())
            }
            "rolebindings" | "clusterrolebindings" => {
                let role_name = json::text(new, "/roleRef/name");
                let (role_kind, role_resource) = match json::text(new, "/roleRef/kind") {
                    "Role" => (RoleKind::Role, "roles"),
                    "ClusterRole" => (RoleKind::ClusterRole, "clusterroles"),
                    // Validation refuses other kinds.
                    _ => return Ok(()),
                };
                if self.allowed_to("bind", role_resource, namespace, role_name) {
                    return Ok(());
                }
                let role = RoleId::referenced(role_kind, namespace, role_name);
                let requested = {
                    let index = self.authz.index.read().unwrap_or_else(PoisonError::into_inner);
                    index.role_rules(&role).map_err(ApiError::BadRequest)?
                };
                let (rules, errors) = held(namespace);
                match rbac::escalation_error(&self.user, &rules, &errors, &requested) {
                    Some(why) => Err(self.refuse(info, name, &why)),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

fn bootstrap_labels() -> Value {
    json!({"labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
           "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
}

fn cluster_role(name: &str, rules: Value) -> Value {
    let mut metadata = bootstrap_labels();
    metadata["name"] = json!(name);
    let mut role =
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": metadata});
    role["rules"] = rules;
    role
}

fn cluster_role_binding(name: &str, groups: &[&str]) -> Value {
    let mut metadata = bootstrap_labels();
    metadata["name"] = json!(name);
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}))
        .collect();
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": metadata,
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
           "subjects": subjects})
}

/// The bootstrap ClusterRoles and ClusterRoleBindings of a real API server that matter to a client:
/// `cluster-admin` for `system:masters`, and discovery, self-review and public information for every
/// authenticated user (the last also for anonymous health checks).
pub(crate) fn bootstrap_policy() -> Vec<Value> {
    vec![
        cluster_role(
            "cluster-admin",
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                   {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        ),
        cluster_role(
            "system:discovery",
            json!([{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                                        "/openapi/*", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
        ),
        cluster_role(
            "system:basic-user",
            json!([{"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
                   {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}]),
        ),
        cluster_role(
            "system:public-info-viewer",
            json!([{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
        ),
        cluster_role_binding("cluster-admin", &["system:masters"]),
        cluster_role_binding("system:discovery", &["system:authenticated"]),
        cluster_role_binding("system:basic-user", &["system:authenticated"]),
        cluster_role_binding(
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
    ]
}
