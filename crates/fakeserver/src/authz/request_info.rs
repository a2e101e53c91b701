//! A request's authorization attributes derived from its method, path and query, as the API server's
//! `RequestInfoFactory` derives them, before any routing: so a request for a path the server does not
//! serve is authorized (and refused) exactly as a real server would.

use http::Method;

use crate::authz::rbac::Attributes;
use crate::selector::FieldSelector;

/// Segments after which a namespace path names a subresource of the namespace, not a resource in it.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// The attributes of a request.
pub fn request_info(method: &Method, path: &str, query: Option<&str>) -> Attributes {
    let non_resource = || Attributes::non_resource(&method_verb(method).to_lowercase(), path);
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    if parts.len() < 3 || !matches!(parts[0], "api" | "apis") {
        return non_resource();
    }
    let mut rest = &parts[1..];
    let mut attrs = Attributes {
        resource_request: true,
        path: path.to_owned(),
        ..Attributes::default()
    };
    if parts[0] == "apis" {
        if rest.len() < 3 {
            return non_resource();
        }
        attrs.api_group = rest[0].to_owned();
        rest = &rest[1..];
    }
    attrs.api_version = rest[0].to_owned();
    rest = &rest[1..];
    let special = matches!(rest.first(), Some(&("watch" | "proxy")));
    if special {
        if rest.len() < 2 {
            // The real server answers "unable to determine kind and namespace from url": treat it as a
            // request for nothing, which no rule but `*` allows.
            attrs.verb = rest[0].to_owned();
            return attrs;
        }
        attrs.verb = rest[0].to_owned();
        rest = &rest[1..];
    } else {
        attrs.verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_owned();
    }
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        attrs.namespace = rest[1].to_owned();
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
            rest = &rest[2..];
        }
    }
    if rest.len() >= 3 && attrs.verb != "proxy" {
        attrs.subresource = rest[2].to_owned();
    }
    if rest.len() >= 2 {
        attrs.name = rest[1].to_owned();
    }
    if let Some(resource) = rest.first() {
        attrs.resource = (*resource).to_owned();
    }
    if attrs.name.is_empty() && attrs.verb == "get" {
        let params: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let param = |key: &str| params.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let watching =
            param("watch").is_some_and(|w| !matches!(w.to_lowercase().as_str(), "false" | "0" | ""));
        attrs.verb = if watching { "watch" } else { "list" }.to_owned();
        if let Some(name) = param("fieldSelector")
            .and_then(|s| FieldSelector::parse(s).ok())
            .and_then(|s| s.required("metadata.name").map(str::to_owned))
            && valid_path_segment(&name)
        {
            attrs.name = name;
        }
    }
    if attrs.name.is_empty() && attrs.verb == "delete" {
        attrs.verb = "deletecollection".to_owned();
    }
    attrs
}

fn method_verb(method: &Method) -> &str {
    method.as_str()
}

/// `path.IsValidPathSegmentName`.
fn valid_path_segment(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &Method, path: &str, query: &str) -> (String, String, String, String, String, String) {
        let a = request_info(method, path, Some(query));
        let resource = a.combined_resource();
        (a.verb, a.api_group, resource, a.namespace, a.name, a.path)
    }

    fn short(method: &Method, path: &str, query: &str) -> [String; 5] {
        let (verb, group, resource, namespace, name, _) = info(method, path, query);
        [verb, group, resource, namespace, name]
    }

    #[test]
    fn verbs_come_from_the_method_and_whether_a_name_is_given() {
        let s = |v: &[&str; 5]| v.map(str::to_owned);
        assert_eq!(
            short(&Method::GET, "/api/v1/nodes", "limit=500"),
            s(&["list", "", "nodes", "", ""])
        );
        assert_eq!(
            short(&Method::GET, "/api/v1/nodes", "watch=true"),
            s(&["watch", "", "nodes", "", ""])
        );
        assert_eq!(
            short(&Method::GET, "/api/v1/nodes", "watch=0"),
            s(&["list", "", "nodes", "", ""])
        );
        assert_eq!(
            short(&Method::GET, "/api/v1/nodes/n1", ""),
            s(&["get", "", "nodes", "", "n1"])
        );
        assert_eq!(
            short(&Method::GET, "/api/v1/watch/namespaces/a/pods", ""),
            s(&["watch", "", "pods", "a", ""])
        );
        assert_eq!(
            short(&Method::POST, "/apis/apps/v1/namespaces/a/daemonsets", ""),
            s(&["create", "apps", "daemonsets", "a", ""])
        );
        assert_eq!(
            short(&Method::PUT, "/apis/apps/v1/namespaces/a/daemonsets/d/status", ""),
            s(&["update", "apps", "daemonsets/status", "a", "d"])
        );
        assert_eq!(
            short(&Method::PATCH, "/api/v1/nodes/n1", ""),
            s(&["patch", "", "nodes", "", "n1"])
        );
        assert_eq!(
            short(&Method::DELETE, "/api/v1/namespaces/a/pods/p", ""),
            s(&["delete", "", "pods", "a", "p"])
        );
        assert_eq!(
            short(&Method::DELETE, "/api/v1/namespaces/a/pods", ""),
            s(&["deletecollection", "", "pods", "a", ""])
        );
        assert_eq!(
            short(&Method::POST, "/api/v1/namespaces/a/pods/p/eviction", ""),
            s(&["create", "", "pods/eviction", "a", "p"])
        );
        assert_eq!(
            short(&Method::POST, "/api/v1/namespaces/a/serviceaccounts/sa/token", ""),
            s(&["create", "", "serviceaccounts/token", "a", "sa"])
        );
    }

    #[test]
    fn namespaces_are_objects_with_their_own_subresources() {
        let s = |v: &[&str; 5]| v.map(str::to_owned);
        assert_eq!(
            short(&Method::GET, "/api/v1/namespaces/a", ""),
            s(&["get", "", "namespaces", "a", "a"])
        );
        assert_eq!(
            short(&Method::PUT, "/api/v1/namespaces/a/finalize", ""),
            s(&["update", "", "namespaces/finalize", "a", "a"])
        );
        assert_eq!(
            short(&Method::GET, "/api/v1/namespaces", ""),
            s(&["list", "", "namespaces", "", ""])
        );
    }

    #[test]
    fn a_metadata_name_field_selector_names_the_object() {
        let (verb, _, _, _, name, _) = info(
            &Method::GET,
            "/api/v1/namespaces/a/configmaps",
            "fieldSelector=metadata.name%3Dx&watch=true",
        );
        assert_eq!((verb.as_str(), name.as_str()), ("watch", "x"));
    }

    #[test]
    fn discovery_and_health_are_non_resource_paths() {
        for path in [
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps",
            "/apis/apps/v1",
            "/healthz",
            "/version",
            "/openapi/v3",
        ] {
            let a = request_info(&Method::GET, path, None);
            assert!(!a.resource_request, "{path}");
            assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", path));
        }
        assert_eq!(
            request_info(&Method::POST, "/fakeserver/compact", None).verb,
            "post"
        );
    }
}
