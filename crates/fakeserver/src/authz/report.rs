//! What the authorizer decided, kept for tests: every refused request, and for each user every RBAC rule
//! its bindings grant with how many allowed requests it allowed. Read in-process with
//! [`crate::FakeServer::authorization_report`] or as JSON from `GET /fake/authorization`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::authz::rbac::{self, Attributes, PolicyRule, RbacIndex, RoleId, RuleId, UserInfo};

/// How many refusals are kept; later ones are only counted (`deniedDropped`).
const DENIALS_KEPT: usize = 10_000;

/// The authorization report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationReport {
    /// `always-allow` or `rbac`.
    pub mode: String,
    /// Refused requests (403), in order, the first 10,000.
    pub denied: Vec<Denial>,
    /// Refusals beyond those kept.
    pub denied_dropped: u64,
    /// Per user name: every user that made an authenticated request or was given a token, except members
    /// of `system:masters` (allowed everything before RBAC is asked).
    pub users: BTreeMap<String, UserReport>,
}

impl AuthorizationReport {
    /// The refusals of `user`.
    pub fn denied_for<'a>(&'a self, user: &'a str) -> impl Iterator<Item = &'a Denial> + 'a {
        self.denied.iter().filter(move |d| d.user == user)
    }

    /// The report of requests another API server decided (a real kube-apiserver, read from its audit log):
    /// each allowed one credited to every rule of `index` that allows it, each refused one listed with the
    /// message it was answered. Members of `system:masters` are left out, as this server leaves them out.
    pub fn of_decisions(mode: &str, index: &RbacIndex, decisions: impl IntoIterator<Item = Decided>) -> Self {
        let mut log = ReportLog::default();
        for decided in decisions {
            if decided.user.is_master() {
                continue;
            }
            match &decided.refused {
                Some(message) => log.denied(&decided.user, &decided.attrs, message),
                None => {
                    let matched = rbac::authorize(index, &decided.user, &decided.attrs).matched;
                    log.allowed(&decided.user, &decided.attrs, &matched);
                }
            }
        }
        log.report(mode, index)
    }

    /// The rules granted to `user` that allowed none of its requests, leaving out the bootstrap policy's
    /// (discovery, self-review) that every authenticated user has.
    pub fn unused_rules(&self, user: &str) -> Vec<&GrantedRule> {
        self.users
            .get(user)
            .map(|u| u.rules.iter().filter(|r| r.used == 0 && !r.bootstrap).collect())
            .unwrap_or_default()
    }
}

/// A request and what an authorizer decided about it, for [`AuthorizationReport::of_decisions`].
#[derive(Clone, Debug)]
pub struct Decided {
    /// Who asked.
    pub user: UserInfo,
    /// What it asked to do.
    pub attrs: Attributes,
    /// The message of the 403 it was answered, or `None` when it was allowed.
    pub refused: Option<String>,
}

/// One refused request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Denial {
    /// The user name.
    pub user: String,
    /// Its groups.
    pub groups: Vec<String>,
    /// The verb (`list`, `patch`, `escalate`...; for non-resource paths the lower-case HTTP method).
    pub verb: String,
    /// API group ("" for core).
    pub api_group: String,
    /// Plural resource ("" for non-resource paths).
    pub resource: String,
    /// Subresource or "".
    pub subresource: String,
    /// Namespace or "".
    pub namespace: String,
    /// Object name or "".
    pub name: String,
    /// The URL path.
    pub path: String,
    /// The `message` of the 403 answered.
    pub message: String,
}

/// What one user was granted and used.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserReport {
    /// The user's groups.
    pub groups: Vec<String>,
    /// Requests allowed.
    pub allowed: u64,
    /// Requests refused.
    pub denied: u64,
    /// Every rule granted to the user through any binding, in any namespace, as the bindings stand when the
    /// report is made.
    pub rules: Vec<GrantedRule>,
}

/// A rule granted to a user.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantedRule {
    /// The Role or ClusterRole holding it.
    pub role: RoleId,
    /// Its index in the role's rules.
    pub index: usize,
    /// The rule.
    pub rule: PolicyRule,
    /// The bindings granting the role to the user (`ClusterRoleBinding/name`, `RoleBinding/ns/name`).
    pub bindings: Vec<String>,
    /// How many of the user's allowed requests this rule allowed (every matching rule counts, not only the
    /// first).
    pub used: u64,
    /// The permissions those requests exercised, each as `verb group/resource` (`list /nodes`,
    /// `create /pods/eviction`, `get nonResourceURL /version`), so a test can tell which of a rule's verbs
    /// and resources were never needed.
    pub used_as: BTreeSet<String>,
    /// Whether the role is part of the server's bootstrap policy (`system:discovery`, ...), granted to every
    /// authenticated user rather than by a chart.
    pub bootstrap: bool,
}

#[derive(Debug, Default)]
struct UserLog {
    groups: Vec<String>,
    allowed: u64,
    denied: u64,
    used: HashMap<RuleId, (u64, BTreeSet<String>)>,
}

/// The live record behind the report.
#[derive(Debug, Default)]
pub(crate) struct ReportLog {
    denied: Vec<Denial>,
    dropped: u64,
    users: BTreeMap<String, UserLog>,
}

impl ReportLog {
    fn user(&mut self, user: &UserInfo) -> &mut UserLog {
        let log = self.users.entry(user.name.clone()).or_default();
        if log.groups.is_empty() {
            log.groups.clone_from(&user.groups);
        }
        log
    }

    pub(crate) fn seen(&mut self, user: &UserInfo) {
        if !user.is_master() {
            self.user(user);
        }
    }

    pub(crate) fn allowed(&mut self, user: &UserInfo, attrs: &Attributes, matched: &[RuleId]) {
        if user.is_master() {
            return;
        }
        let permission = permission(attrs);
        let log = self.user(user);
        log.allowed += 1;
        for rule in matched {
            let (count, uses) = log.used.entry(rule.clone()).or_default();
            *count += 1;
            if !uses.contains(&permission) {
                uses.insert(permission.clone());
            }
        }
    }

    pub(crate) fn denied(&mut self, user: &UserInfo, attrs: &Attributes, message: &str) {
        self.user(user).denied += 1;
        if self.denied.len() >= DENIALS_KEPT {
            self.dropped += 1;
            return;
        }
        self.denied.push(Denial {
            user: user.name.clone(),
            groups: user.groups.clone(),
            verb: attrs.verb.clone(),
            api_group: attrs.api_group.clone(),
            resource: attrs.resource.clone(),
            subresource: attrs.subresource.clone(),
            namespace: attrs.namespace.clone(),
            name: attrs.name.clone(),
            path: attrs.path.clone(),
            message: message.to_owned(),
        });
    }

    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }

    pub(crate) fn report(&self, mode: &str, index: &RbacIndex) -> AuthorizationReport {
        let users = self
            .users
            .iter()
            .map(|(name, log)| {
                let user = UserInfo {
                    name: name.clone(),
                    groups: log.groups.clone(),
                };
                let rules = index
                    .granted(&user)
                    .into_iter()
                    .map(|(id, granted)| GrantedRule {
                        used: log.used.get(&id).map_or(0, |(count, _)| *count),
                        used_as: log
                            .used
                            .get(&id)
                            .map(|(_, uses)| uses.clone())
                            .unwrap_or_default(),
                        role: id.role,
                        index: id.index,
                        rule: granted.rule,
                        bindings: granted.bindings.iter().map(ToString::to_string).collect(),
                        bootstrap: granted.bootstrap,
                    })
                    .collect();
                let report = UserReport {
                    groups: log.groups.clone(),
                    allowed: log.allowed,
                    denied: log.denied,
                    rules,
                };
                (name.clone(), report)
            })
            .collect();
        AuthorizationReport {
            mode: mode.to_owned(),
            denied: self.denied.clone(),
            denied_dropped: self.dropped,
            users,
        }
    }
}

/// A request's permission as [`GrantedRule::used_as`] spells it.
fn permission(attrs: &Attributes) -> String {
    if !attrs.resource_request {
        return format!("{} nonResourceURL {}", attrs.verb, attrs.path);
    }
    if attrs.subresource.is_empty() {
        format!("{} {}/{}", attrs.verb, attrs.api_group, attrs.resource)
    } else {
        format!(
            "{} {}/{}/{}",
            attrs.verb, attrs.api_group, attrs.resource, attrs.subresource
        )
    }
}
