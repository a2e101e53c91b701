//! What a real control plane's RBAC granted and refused, in the fake server's [`AuthorizationReport`]: the
//! requests and kube-apiserver's decisions from its audit log, each allowed one credited to every rule of
//! the cluster's Roles and ClusterRoles that allows it, so that a test judges a chart's RBAC ("no request
//! refused, every granted rule used or justified") the same way on both backends.

use gpuop_fakeserver::authz::rbac::{Attributes, RbacIndex, RbacKind};
use gpuop_fakeserver::{AuthorizationReport, Decided};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ListParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::audit::AuditEvent;
use crate::control_plane::ControlPlane;
use crate::error::{Error, client_error};

impl ControlPlane {
    /// The authorization report of every request in the audit log so far, with the rules of the cluster's
    /// roles and bindings as they stand now (a rule deleted since allowed nothing in the report: take it
    /// while the roles a test judges exist).
    pub async fn authorization_report(&self) -> Result<AuthorizationReport, Error> {
        let admin = self.admin().await?;
        let mut index = RbacIndex::default();
        add_listed(
            Api::<ClusterRole>::all(admin.clone()),
            RbacKind::ClusterRole,
            &mut index,
        )
        .await?;
        add_listed(
            Api::<ClusterRoleBinding>::all(admin.clone()),
            RbacKind::ClusterRoleBinding,
            &mut index,
        )
        .await?;
        add_listed(Api::<Role>::all(admin.clone()), RbacKind::Role, &mut index).await?;
        add_listed(
            Api::<RoleBinding>::all(admin.clone()),
            RbacKind::RoleBinding,
            &mut index,
        )
        .await?;
        let events = self.requests_so_far().await?;
        Ok(AuthorizationReport::of_decisions(
            "rbac",
            &index,
            events.iter().flat_map(decided),
        ))
    }
}

async fn add_listed<K>(api: Api<K>, kind: RbacKind, index: &mut RbacIndex) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + Serialize + DeserializeOwned,
{
    let listed = api
        .list(&ListParams::default())
        .await
        .map_err(|e| client_error(format!("listing {}", K::plural(&())))(e.into()))?;
    for object in &listed.items {
        let object = serde_json::to_value(object)
            .map_err(|e| client_error(format!("reading {}", K::plural(&())))(e.into()))?;
        index.upsert(kind, &object);
    }
    Ok(())
}

/// What the authorizer decided about a request, as the audit log shows it: nothing for one it was not asked
/// about (refused before, as unauthenticated). A patch or update that created its object (answered 201) was
/// authorized twice, as itself and as `create`, and the log records it once: both are returned.
fn decided(event: &AuditEvent) -> Vec<Decided> {
    let refused = match event.decision.as_str() {
        "allow" => None,
        "forbid" => Some(event.message.clone()),
        _ => return Vec::new(),
    };
    let user = event.user.clone();
    let mut decided = vec![Decided {
        user: user.clone(),
        attrs: event.attrs.clone(),
        refused,
    }];
    if event.attrs.resource_request
        && matches!(event.attrs.verb.as_str(), "patch" | "update")
        && event.code == 201
    {
        let attrs = Attributes {
            verb: "create".to_owned(),
            ..event.attrs.clone()
        };
        decided.push(Decided {
            user,
            attrs,
            refused: None,
        });
    }
    decided
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_fakeserver::authz::rbac::UserInfo;

    fn event(verb: &str, code: u16, decision: &str) -> AuditEvent {
        let path = "/apis/apps/v1/namespaces/gpu-operator/daemonsets/x";
        AuditEvent {
            user: UserInfo {
                name: "system:serviceaccount:gpu-operator:gpu-operator".to_owned(),
                groups: vec!["system:serviceaccounts".to_owned()],
            },
            user_agent: "gpu-operator".to_owned(),
            attrs: Attributes {
                api_version: "v1".to_owned(),
                path: path.to_owned(),
                ..Attributes::resource(verb, "apps", "daemonsets", "gpu-operator", "x")
            },
            code,
            reason: String::new(),
            message: if decision == "forbid" {
                "forbidden".to_owned()
            } else {
                String::new()
            },
            decision: decision.to_owned(),
            uri: format!("{path}?fieldManager=gpu-operator"),
            received: jiff::Timestamp::UNIX_EPOCH,
        }
    }

    fn verbs(decided: &[Decided]) -> Vec<(&str, Option<&str>)> {
        decided
            .iter()
            .map(|d| (d.attrs.verb.as_str(), d.refused.as_deref()))
            .collect()
    }

    #[test]
    fn an_apply_that_created_its_object_was_also_authorized_as_create() {
        assert_eq!(
            verbs(&decided(&event("patch", 201, "allow"))),
            [("patch", None), ("create", None)]
        );
        assert_eq!(verbs(&decided(&event("patch", 200, "allow"))), [("patch", None)]);
        let refused = decided(&event("patch", 403, "forbid"));
        assert_eq!(verbs(&refused), [("patch", Some("forbidden"))]);
        assert_eq!(
            refused[0].attrs.path,
            "/apis/apps/v1/namespaces/gpu-operator/daemonsets/x"
        );
        assert!(decided(&event("get", 401, "")).is_empty(), "never authorized");
    }
}
