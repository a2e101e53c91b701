//! Discovery documents (`/version`, `/api`, `/apis`, `/apis/{group}`, `/api/v1`, `/apis/{group}/{version}`)
//! and the part of OpenAPI v3 that kubectl reads before `apply`, built from the registry so that a CRD
//! shows up the moment it is created.
//!
//! kubectl asks for aggregated discovery first; the legacy documents served here are its fallback and work
//! unchanged. The OpenAPI v3 documents carry, per resource, the PATCH operation with its
//! `x-kubernetes-group-version-kind` and the `fieldValidation` parameter: that is what kubectl checks to
//! leave validation to the server, so `kubectl apply` (client- or server-side) needs no `--validate=false`.
//! They carry no schemas, so kubectl computes strategic merge patches from its compiled-in types, as it
//! does against servers without OpenAPI.

use serde_json::{Map, Value, json};

use crate::random::mix;
use crate::registry::{Registry, ResourceInfo};

/// The Kubernetes version the server claims to be.
pub(crate) const VERSION: (&str, &str) = ("1", "33");

/// `/version`.
pub(crate) fn version() -> Value {
    json!({
        "major": VERSION.0,
        "minor": VERSION.1,
        "emulationMajor": VERSION.0,
        "emulationMinor": VERSION.1,
        "gitVersion": format!("v{}.{}.0-gpuop-fakeserver", VERSION.0, VERSION.1),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": versions, "preferredVersion": versions.first().cloned().unwrap_or_default()})
}

/// `/apis`.
pub(crate) fn groups(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .filter(|(name, _)| !name.is_empty())
        .map(|(name, versions)| group_json(name, versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`, if the group exists.
pub(crate) fn group(registry: &Registry, name: &str) -> Option<Value> {
    registry
        .groups()
        .into_iter()
        .find(|(g, _)| g == name && !g.is_empty())
        .map(|(g, versions)| {
            let mut group = group_json(&g, &versions);
            group["kind"] = json!("APIGroup");
            group["apiVersion"] = json!("v1");
            group
        })
}

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn resources_of<'a>(
    registry: &'a Registry,
    group: &'a str,
    version: &'a str,
) -> impl Iterator<Item = &'a ResourceInfo> {
    registry
        .all()
        .iter()
        .map(AsRef::as_ref)
        .filter(move |r| r.group == group && r.version == version)
}

/// `/api/v1` or `/apis/{group}/{version}`, if that group version exists.
pub(crate) fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for info in resources_of(registry, group, version) {
        let mut resource = json!({
            "name": info.plural,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": if info.create_only { &["create"][..] } else { &VERBS[..] },
        });
        if !info.short_names.is_empty() {
            resource["shortNames"] = json!(info.short_names);
        }
        if !info.categories.is_empty() {
            resource["categories"] = json!(info.categories);
        }
        resources.push(resource);
        let sub = |name: &str, kind: &str, verbs: &[&str]| {
            json!({"name": format!("{}/{name}", info.plural), "singularName": "", "namespaced": info.namespaced,
                   "kind": kind, "verbs": verbs})
        };
        if info.status_subresource {
            resources.push(sub("status", &info.kind, &["get", "patch", "update"]));
        }
        for extra in &info.subresources {
            let mut entry = match *extra {
                "eviction" => sub("eviction", "Eviction", &["create"]),
                "binding" => sub("binding", "Binding", &["create"]),
                "finalize" => sub("finalize", "Namespace", &["update"]),
                "token" => sub("token", "TokenRequest", &["create"]),
                "log" => sub("log", "Pod", &["get"]),
                _ => continue,
            };
            let group = match *extra {
                "eviction" => "policy",
                "token" => "authentication.k8s.io",
                _ => "",
            };
            if !group.is_empty() {
                entry["group"] = json!(group);
                entry["version"] = json!("v1");
            }
            resources.push(entry);
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}

fn path_of(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: one entry per group version, with a hash that changes when its resources do.
pub(crate) fn openapi_root(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let path = path_of(&group, &version);
            let hash = openapi_hash(registry, &group, &version);
            paths.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
            );
        }
    }
    json!({"paths": paths})
}

fn openapi_hash(registry: &Registry, group: &str, version: &str) -> String {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for info in resources_of(registry, group, version) {
        for byte in format!("{info:?}").bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{:016X}", mix(hash))
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/{group}/{version}`, if that group version exists.
pub(crate) fn openapi_group_version(registry: &Registry, path: &str) -> Option<Value> {
    let (group, version) = match path.trim_matches('/').split('/').collect::<Vec<_>>().as_slice() {
        ["api", version] => (String::new(), (*version).to_owned()),
        ["apis", group, version] => ((*group).to_owned(), (*version).to_owned()),
        _ => return None,
    };
    let mut paths = Map::new();
    for info in resources_of(registry, &group, &version) {
        let prefix = format!("/{}", path_of(&group, &version));
        let collection = if info.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", info.plural)
        } else {
            format!("{prefix}/{}", info.plural)
        };
        let gvk = json!({"group": info.group, "version": info.version, "kind": info.kind});
        let query = |name: &str, kind: &str| json!({"name": name, "in": "query", "schema": {"type": kind, "uniqueItems": true}});
        let mut content = Map::new();
        let mut patch_types = vec![
            "application/apply-patch+yaml",
            "application/json-patch+json",
            "application/merge-patch+json",
        ];
        if info.custom.is_none() {
            patch_types.push("application/strategic-merge-patch+json");
        }
        for media in patch_types {
            content.insert(media.to_owned(), json!({"schema": {"type": "object"}}));
        }
        let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}});
        let object_path = json!({
            "get": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "get", "responses": ok},
            "put": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "put", "responses": ok,
                    "parameters": [query("dryRun", "string"), query("fieldManager", "string"), query("fieldValidation", "string")]},
            "patch": {
                "x-kubernetes-group-version-kind": gvk,
                "x-kubernetes-action": "patch",
                "parameters": [query("dryRun", "string"), query("fieldManager", "string"),
                               query("fieldValidation", "string"), query("force", "boolean")],
                "requestBody": {"content": content},
                "responses": ok,
            },
            "delete": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "delete", "responses": ok},
        });
        paths.insert(format!("{collection}/{{name}}"), object_path);
        paths.insert(
            collection,
            json!({
                "get": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "list", "responses": ok},
                "post": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "post", "responses": ok,
                         "parameters": [query("dryRun", "string"), query("fieldManager", "string"), query("fieldValidation", "string")]},
            }),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", VERSION.0, VERSION.1)},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_lists_carry_subresources_and_short_names() {
        let registry = Registry::builtin();
        let core = resource_list(&registry, "", "v1").expect("core");
        let names: Vec<&str> = crate::json::items(&core, "/resources")
            .filter_map(|r| r["name"].as_str())
            .collect();
        for expected in [
            "pods",
            "pods/status",
            "pods/eviction",
            "pods/binding",
            "nodes/status",
            "namespaces/finalize",
            "serviceaccounts/token",
        ] {
            assert!(names.contains(&expected), "{expected} missing from {names:?}");
        }
        let pods = core["resources"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == "pods"))
            .expect("pods");
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert!(resource_list(&registry, "nvidia.com", "v1").is_none());
    }

    #[test]
    fn openapi_names_every_patch_operation_and_its_field_validation() {
        let registry = Registry::builtin();
        let root = openapi_root(&registry);
        assert!(
            root["paths"]["apis/apps/v1"]["serverRelativeURL"]
                .as_str()
                .is_some_and(|u| u.starts_with("/openapi/v3/apis/apps/v1?hash="))
        );
        let apps = openapi_group_version(&registry, "apis/apps/v1").expect("apps");
        let patch = &apps["paths"]["/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "apps", "version": "v1", "kind": "DaemonSet"})
        );
        assert!(
            patch["parameters"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p["name"] == "fieldValidation"))
        );
    }
}
