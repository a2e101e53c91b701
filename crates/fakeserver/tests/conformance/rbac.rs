//! The rbac authorization mode: bearer tokens and their 401s, TokenRequests, RBAC decisions with the real
//! server's 403 bodies, privilege-escalation checks, access reviews and the authorization report. The
//! evaluation rules themselves are unit-tested in `authz::rbac`; these tests go through the router.

use std::time::Duration;

use axum::body::Body;
use gpuop_fakeserver::{Authorization, FakeServer, ManualClock};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::support::{assert_contains, call, configmap, failure, json_of, listed};

const NS: &str = "gpu-operator";
const SA_USER: &str = "system:serviceaccount:gpu-operator:gpu-operator";

/// An rbac-mode server with a stopped clock, namespace `gpu-operator` and its service account
/// `gpu-operator`, and node `n1`.
fn rbac_server(clock: &ManualClock) -> FakeServer {
    let server = FakeServer::builder()
        .clock(clock.clone())
        .authorization(Authorization::Rbac)
        .build();
    for object in [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gpu-operator", "namespace": NS}}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
    ] {
        server.insert(object).expect("fixture");
    }
    server
}

fn request(method: &str, uri: &str, token: Option<&str>, body: Option<Value>) -> http::Request<Body> {
    let mut builder = http::Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    let body = match body {
        Some(value) => {
            builder = builder.header(
                "content-type",
                if method == "PATCH" {
                    "application/merge-patch+json"
                } else {
                    "application/json"
                },
            );
            Body::from(value.to_string())
        }
        None => Body::empty(),
    };
    builder.body(body).expect("request")
}

fn cluster_role(name: &str, rules: Value) -> Value {
    let mut role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name}});
    role["rules"] = rules;
    role
}

fn binding_to_sa(kind: &str, namespace: Option<&str>, name: &str, role_kind: &str, role: &str) -> Value {
    let mut metadata = json!({"name": name});
    if let Some(namespace) = namespace {
        metadata["namespace"] = json!(namespace);
    }
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata,
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
           "subjects": [{"kind": "ServiceAccount", "name": "gpu-operator", "namespace": NS}]})
}

#[tokio::test]
async fn requests_without_a_valid_token_get_the_servers_401() {
    let server = rbac_server(&ManualClock::default());
    let unauthorized = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": "Unauthorized", "reason": "Unauthorized", "code": 401});
    for token in [None, Some("not-a-token")] {
        let (code, _, body) = call(&server, request("GET", "/api/v1/nodes", token, None)).await;
        assert_eq!(
            (code, json_of(&body)),
            (401, unauthorized.clone()),
            "token {token:?}"
        );
    }
    let (code, _, _) = call(&server, request("GET", "/version", None, None)).await;
    assert_eq!(
        code, 401,
        "only the health endpoints are open to anonymous requests"
    );
    let (code, _, body) = call(&server, request("GET", "/readyz", None, None)).await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    let admin = server.admin_token().expect("rbac mode has an admin");
    let (code, _, _) = call(&server, request("GET", "/api/v1/nodes", Some(&admin), None)).await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn a_refused_request_gets_the_exact_forbidden_status() {
    let server = rbac_server(&ManualClock::default());
    let token = server.token_for(NS, "gpu-operator").expect("token");
    let (code, _, body) = call(
        &server,
        request("GET", "/api/v1/nodes?limit=500", Some(&token), None),
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        json_of(&body),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("nodes is forbidden: User \"{SA_USER}\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"),
               "reason": "Forbidden", "details": {"kind": "nodes"}, "code": 403})
    );
    let patch = request(
        "PATCH",
        "/api/v1/nodes/n1",
        Some(&token),
        Some(json!({"metadata": {"labels": {"a": "b"}}})),
    );
    let status = json_of(&call(&server, patch).await.2);
    assert_eq!(
        status["message"],
        format!(
            "nodes \"n1\" is forbidden: User \"{SA_USER}\" cannot patch resource \"nodes\" in API group \"\" at the cluster scope"
        )
    );
    assert_eq!(status["details"], json!({"name": "n1", "kind": "nodes"}));
    let evict = request(
        "POST",
        &format!("/api/v1/namespaces/{NS}/pods/p/eviction"),
        Some(&token),
        Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"}})),
    );
    let status = json_of(&call(&server, evict).await.2);
    assert_eq!(
        status["message"],
        format!(
            "pods \"p\" is forbidden: User \"{SA_USER}\" cannot create resource \"pods/eviction\" in API group \"\" in the namespace \"{NS}\""
        )
    );
    let daemonsets = request(
        "GET",
        &format!("/apis/apps/v1/namespaces/{NS}/daemonsets"),
        Some(&token),
        None,
    );
    let status = json_of(&call(&server, daemonsets).await.2);
    assert_eq!(status["details"], json!({"group": "apps", "kind": "daemonsets"}));
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("daemonsets.apps is forbidden"))
    );
    // Discovery is open to every authenticated user, as the bootstrap policy has it.
    let (code, _, _) = call(&server, request("GET", "/apis", Some(&token), None)).await;
    assert_eq!(code, 200);

    let report = server.authorization_report();
    let denied: Vec<(&str, &str, &str)> = report
        .denied_for(SA_USER)
        .map(|d| (d.verb.as_str(), d.resource.as_str(), d.subresource.as_str()))
        .collect();
    assert_eq!(
        denied,
        [
            ("list", "nodes", ""),
            ("patch", "nodes", ""),
            ("create", "pods", "eviction"),
            ("list", "daemonsets", "")
        ]
    );
}

#[tokio::test]
async fn bindings_grant_through_kube_clients_and_the_report_tells_used_from_unused_rules() {
    let server = rbac_server(&ManualClock::default());
    for object in [
        cluster_role(
            "gpu-operator",
            json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]),
        ),
        binding_to_sa(
            "ClusterRoleBinding",
            None,
            "gpu-operator",
            "ClusterRole",
            "gpu-operator",
        ),
        cluster_role(
            "configmaps",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get"]}]),
        ),
        binding_to_sa("RoleBinding", Some(NS), "configmaps", "ClusterRole", "configmaps"),
    ] {
        server.insert(object).expect("fixture");
    }
    let client = server
        .client_for_service_account(NS, "gpu-operator")
        .expect("service account exists");
    let nodes: Api<Node> = Api::all(client.clone());
    assert_eq!(listed(&nodes).await.len(), 1);
    let patch = Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}));
    let refused = failure(nodes.patch("n1", &PatchParams::default(), &patch).await);
    assert_eq!(refused.reason, "Forbidden");
    let here: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    here.create(&PostParams::default(), &configmap("a"))
        .await
        .expect("a RoleBinding grants in its namespace");
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let refused = failure(elsewhere.create(&PostParams::default(), &configmap("a")).await);
    assert_eq!(refused.code, 403, "and only there");
    // A watch is authorized when it starts.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(client.clone());
    let refused = failure(
        pods.watch(&kube::api::WatchParams::default(), "0")
            .await
            .map(|_| ()),
    );
    assert_eq!(refused.code, 403);

    let report = server.authorization_report();
    assert_eq!(report.mode, "rbac");
    let user = &report.users[SA_USER];
    assert_eq!(user.denied, 3);
    let used: Vec<(String, usize, u64)> = user
        .rules
        .iter()
        .filter(|r| !r.bootstrap)
        .map(|r| (r.role.name.clone(), r.index, r.used))
        .collect();
    assert_eq!(
        used,
        [
            ("configmaps".to_owned(), 0, 1),
            ("gpu-operator".to_owned(), 0, 1),
            ("gpu-operator".to_owned(), 1, 0)
        ]
    );
    let configmaps = user
        .rules
        .iter()
        .find(|r| r.role.name == "configmaps")
        .expect("granted");
    assert_eq!(
        configmaps.used_as.iter().collect::<Vec<_>>(),
        ["create /configmaps"],
        "which of the rule's verbs were used"
    );
    let unused = report.unused_rules(SA_USER);
    assert_eq!(unused.len(), 1);
    assert_eq!(unused[0].rule.resources, ["nodes/status"]);
    assert_eq!(unused[0].bindings, ["ClusterRoleBinding/gpu-operator"]);
}

/// A server-side apply that creates the object needs `create` as well as `patch`, as the real API server's
/// patch handler demands; one that changes an existing object needs `patch` only.
#[tokio::test]
async fn a_server_side_apply_that_creates_is_authorized_as_create_too() {
    let server = rbac_server(&ManualClock::default());
    for object in [
        cluster_role(
            "patch-only",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"]}]),
        ),
        binding_to_sa("RoleBinding", Some(NS), "patch-only", "ClusterRole", "patch-only"),
    ] {
        server.insert(object).expect("fixture");
    }
    let client = server
        .client_for_service_account(NS, "gpu-operator")
        .expect("service account exists");
    let configmaps: Api<ConfigMap> = Api::namespaced(client, NS);
    let apply = PatchParams::apply("gpu-operator");
    let refused = failure(configmaps.patch("a", &apply, &Patch::Apply(configmap("a"))).await);
    assert_eq!(refused.code, 403);
    assert_contains(&refused.message, "cannot create resource \"configmaps\"");
    server
        .insert(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b", "namespace": NS}}))
        .expect("fixture");
    configmaps
        .patch("b", &apply, &Patch::Apply(configmap("b")))
        .await
        .expect("an apply to an existing object is a patch");
}

#[tokio::test]
async fn token_requests_mint_tokens_that_expire_and_die_with_their_service_account() {
    let clock = ManualClock::default();
    let server = rbac_server(&clock);
    let admin = server.admin_token().expect("admin");
    let uri = format!("/api/v1/namespaces/{NS}/serviceaccounts/gpu-operator/token");
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}});
    let (code, _, answer) = call(&server, request("POST", &uri, Some(&admin), Some(body))).await;
    assert_eq!(code, 201, "{answer}");
    let answer = json_of(&answer);
    assert_eq!(answer["kind"], "TokenRequest");
    assert_eq!(answer["spec"]["expirationSeconds"], 600);
    assert!(answer["status"]["expirationTimestamp"].as_str().is_some());
    let token = answer["status"]["token"].as_str().expect("token").to_owned();
    let discovery = || request("GET", "/api", Some(&token), None);
    assert_eq!(call(&server, discovery()).await.0, 200);
    clock.advance(Duration::from_secs(601));
    assert_eq!(call(&server, discovery()).await.0, 401, "expired");

    let token = server.token_for(NS, "gpu-operator").expect("token");
    let probe = request("GET", "/api", Some(&token), None);
    assert_eq!(call(&server, probe).await.0, 200);
    let delete = request(
        "DELETE",
        &format!("/api/v1/namespaces/{NS}/serviceaccounts/gpu-operator"),
        Some(&admin),
        None,
    );
    assert_eq!(call(&server, delete).await.0, 200);
    let probe = request("GET", "/api", Some(&token), None);
    assert_eq!(call(&server, probe).await.0, 401, "its service account is gone");

    let (code, _, missing) = call(&server, request("POST", &uri, Some(&admin), Some(json!({})))).await;
    assert_eq!(code, 404);
    assert_eq!(
        json_of(&missing)["message"],
        "serviceaccounts \"gpu-operator\" not found"
    );
    let short = json!({"spec": {"expirationSeconds": 10}});
    let uri = format!("/api/v1/namespaces/{NS}/serviceaccounts/default/token");
    assert_eq!(
        call(&server, request("POST", &uri, Some(&admin), Some(short)))
            .await
            .0,
        422
    );
    // Minting a token is itself authorized: `create` on `serviceaccounts/token`.
    let other = server.token_for(NS, "default").expect("token");
    let (code, _, body) = call(&server, request("POST", &uri, Some(&other), Some(json!({})))).await;
    assert_eq!(code, 403);
    assert!(
        json_of(&body)["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot create resource \"serviceaccounts/token\""))
    );
}

#[tokio::test]
async fn roles_and_bindings_that_grant_more_than_the_writer_holds_are_refused() {
    let server = rbac_server(&ManualClock::default());
    server
        .insert(cluster_role(
            "rbac-writer",
            json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["create", "update"]},
                   {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
        ))
        .expect("fixture");
    server
        .insert(binding_to_sa(
            "RoleBinding",
            Some(NS),
            "rbac-writer",
            "ClusterRole",
            "rbac-writer",
        ))
        .expect("fixture");
    server
        .insert(cluster_role(
            "secrets",
            json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
        ))
        .expect("fixture");
    let token = server.token_for(NS, "gpu-operator").expect("token");
    let roles = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles");
    let role = |name: &str, resource: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
               "rules": [{"apiGroups": [""], "resources": [resource], "verbs": ["get"]}]})
    };
    let held = request("POST", &roles, Some(&token), Some(role("cm", "configmaps")));
    assert_eq!(
        call(&server, held).await.0,
        201,
        "a role within what the writer holds"
    );
    let (code, _, body) = call(
        &server,
        request("POST", &roles, Some(&token), Some(role("s", "secrets"))),
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        json_of(&body)["message"],
        format!(
            "roles.rbac.authorization.k8s.io \"s\" is forbidden: user \"{SA_USER}\" (groups=[\"system:serviceaccounts\" \
             \"system:serviceaccounts:{NS}\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n\
             {{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\"]}}"
        )
    );
    let bindings = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "s"},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "secrets"},
                         "subjects": [{"kind": "User", "name": "bob"}]});
    let (code, _, body) = call(
        &server,
        request("POST", &bindings, Some(&token), Some(binding.clone())),
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(server.authorization_report().denied_for(SA_USER).count(), 2);

    server
        .insert(cluster_role(
            "delegate",
            json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]},
                   {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"],
                    "resourceNames": ["secrets"]}]),
        ))
        .expect("fixture");
    server
        .insert(binding_to_sa(
            "RoleBinding",
            Some(NS),
            "delegate",
            "ClusterRole",
            "delegate",
        ))
        .expect("fixture");
    let (code, _, body) = call(
        &server,
        request("POST", &roles, Some(&token), Some(role("s", "secrets"))),
    )
    .await;
    assert_eq!(code, 201, "escalate allows it: {body}");
    let (code, _, body) = call(&server, request("POST", &bindings, Some(&token), Some(binding))).await;
    assert_eq!(code, 201, "bind on that ClusterRole allows it: {body}");
}

#[tokio::test]
async fn access_reviews_answer_from_the_same_authorizer() {
    let server = rbac_server(&ManualClock::default());
    server
        .insert(cluster_role(
            "nodes",
            json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]),
        ))
        .expect("fixture");
    server
        .insert(binding_to_sa(
            "ClusterRoleBinding",
            None,
            "nodes",
            "ClusterRole",
            "nodes",
        ))
        .expect("fixture");
    let token = server.token_for(NS, "gpu-operator").expect("token");
    let review = |verb: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
               "spec": {"resourceAttributes": {"verb": verb, "resource": "nodes"}}})
    };
    let uri = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    let (code, _, body) = call(&server, request("POST", uri, Some(&token), Some(review("list")))).await;
    assert_eq!(code, 201);
    let body = json_of(&body);
    assert_eq!(body["status"]["allowed"], true);
    assert_eq!(
        body["status"]["reason"],
        "RBAC: allowed by ClusterRoleBinding \"nodes\" of ClusterRole \"nodes\" to ServiceAccount \"gpu-operator/gpu-operator\""
    );
    let (_, _, body) = call(&server, request("POST", uri, Some(&token), Some(review("patch")))).await;
    assert_eq!(json_of(&body)["status"]["allowed"], false);
    let admin = server.admin_token().expect("admin");
    let sar = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                     "spec": {"user": SA_USER, "groups": ["system:authenticated"], "resourceAttributes": {"verb": "list", "resource": "nodes"}}});
    let uri = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let (code, _, body) = call(&server, request("POST", uri, Some(&admin), Some(sar.clone()))).await;
    assert_eq!(
        (code, json_of(&body)["status"]["allowed"].clone()),
        (201, json!(true))
    );
    let (code, _, _) = call(&server, request("POST", uri, Some(&token), Some(sar))).await;
    assert_eq!(code, 403, "SubjectAccessReview is not for everyone");
    // Reviews are answers, not uses: the rule stays unused.
    let report = server.authorization_report();
    let nodes = report.users[SA_USER]
        .rules
        .iter()
        .find(|r| r.role.name == "nodes")
        .expect("granted");
    assert_eq!(nodes.used, 0);
}

#[tokio::test]
async fn the_report_is_served_to_masters_only_and_the_bootstrap_policy_is_listed() {
    let server = rbac_server(&ManualClock::default());
    let token = server.token_for(NS, "gpu-operator").expect("token");
    let _ = call(&server, request("GET", "/api/v1/nodes", Some(&token), None)).await;
    let admin = server.admin_token().expect("admin");
    let (code, _, body) = call(&server, request("GET", "/fake/authorization", Some(&admin), None)).await;
    assert_eq!(code, 200);
    let report: gpuop_fakeserver::AuthorizationReport = serde_json::from_str(&body).expect("a report");
    assert_eq!(report, server.authorization_report());
    assert_eq!(
        report.denied[0].message,
        format!(
            "nodes is forbidden: User \"{SA_USER}\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        )
    );
    let (code, _, body) = call(&server, request("GET", "/fake/authorization", Some(&token), None)).await;
    assert_eq!(code, 403);
    assert_eq!(
        json_of(&body)["message"],
        format!("forbidden: User \"{SA_USER}\" cannot get path \"/fake/authorization\"")
    );
    let (code, _, _) = call(
        &server,
        request("DELETE", "/fake/authorization", Some(&admin), None),
    )
    .await;
    assert_eq!(code, 200);
    assert!(server.authorization_report().denied.is_empty());

    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(server.client());
    // The in-process client is the admin.
    let names: Vec<String> = listed(&roles)
        .await
        .into_iter()
        .filter_map(|r| r.metadata.name)
        .collect();
    for bootstrap in [
        "cluster-admin",
        "system:basic-user",
        "system:discovery",
        "system:public-info-viewer",
    ] {
        assert!(
            names.iter().any(|n| n == bootstrap),
            "{bootstrap} missing from {names:?}"
        );
    }
}

#[tokio::test]
async fn in_rbac_mode_the_socket_speaks_tls_and_the_kubeconfig_is_the_admins() {
    let server = rbac_server(&ManualClock::default());
    let running = server
        .serve(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("serving");
    assert!(
        running.url().starts_with("https://127.0.0.1:"),
        "{}",
        running.url()
    );
    assert!(running.kubeconfig().contains("certificate-authority-data:"));
    let client = running.client().await.expect("a client from the kubeconfig");
    let nodes: Api<Node> = Api::all(client);
    assert_eq!(listed(&nodes).await.len(), 1, "the admin lists nodes");
    running.shutdown().await;
}

#[tokio::test]
async fn impersonation_acts_as_whom_the_headers_name_when_the_requester_may() {
    let server = rbac_server(&ManualClock::default());
    let admin = server.admin_token().expect("admin");
    let as_sa = |token: &str| {
        http::Request::get("/api/v1/nodes")
            .header("authorization", format!("Bearer {token}"))
            .header("impersonate-user", SA_USER)
            .body(Body::empty())
            .expect("request")
    };
    let (code, _, body) = call(&server, as_sa(&admin)).await;
    assert_eq!(
        code, 403,
        "the admin, acting as the service account, has its rights only"
    );
    assert!(
        json_of(&body)["message"]
            .as_str()
            .is_some_and(|m| m.contains(SA_USER))
    );
    let token = server.token_for(NS, "default").expect("token");
    let (code, _, body) = call(&server, as_sa(&token)).await;
    assert_eq!(code, 403);
    assert_eq!(
        json_of(&body)["message"],
        format!(
            "serviceaccounts \"gpu-operator\" is forbidden: User \"system:serviceaccount:{NS}:default\" cannot \
             impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"{NS}\""
        )
    );
}

#[tokio::test]
async fn roles_and_bindings_are_validated_as_the_api_server_does() {
    let server = super::support::server();
    let refused = |object: Value| {
        let error = server.insert(object).expect_err("invalid");
        error.to_string()
    };
    assert_eq!(
        refused(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                       "metadata": {"name": "r", "namespace": "default"},
                       "rules": [{"apiGroups": [""], "resources": ["pods"]}, {"verbs": ["get"], "nonResourceURLs": ["/x"]}]})
        ),
        "Role.rbac.authorization.k8s.io \"r\" is invalid: [rules[0].verbs: Required value: verbs must contain at least \
         one value, rules[1].nonResourceURLs: Invalid value: [\"/x\"]: namespaced rules cannot apply to non-resource URLs]"
    );
    let binding = |role_kind: &str, subject: Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "b"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": "r"},
               "subjects": [subject]})
    };
    let message = refused(binding("Role", json!({"kind": "ServiceAccount", "name": "sa"})));
    assert!(
        message.contains("roleRef.kind: Unsupported value: \"Role\""),
        "{message}"
    );
    assert!(
        message.contains("subjects[0].namespace: Required value"),
        "{message}"
    );
    let message = refused(binding("ClusterRole", json!({"kind": "Robot", "name": "r2"})));
    assert!(
        message.contains("subjects[0].kind: Unsupported value: \"Robot\""),
        "{message}"
    );
    server
        .insert(binding("ClusterRole", json!({"kind": "User", "name": "alice"})))
        .expect("a User subject gets its apiGroup by default");
}

#[tokio::test]
async fn always_allow_mode_asks_for_no_credentials() {
    let server = super::support::server();
    assert_eq!(server.admin_token(), None);
    let (code, _, _) = call(&server, request("GET", "/api/v1/nodes", None, None)).await;
    assert_eq!(code, 200);
    let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                        "spec": {"resourceAttributes": {"verb": "delete", "resource": "nodes"}}});
    let (code, _, body) = call(
        &server,
        request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            None,
            Some(review),
        ),
    )
    .await;
    assert_eq!(
        (code, json_of(&body)["status"]["allowed"].clone()),
        (201, json!(true))
    );
    let report = server.authorization_report();
    assert_eq!((report.mode.as_str(), report.users.len()), ("always-allow", 0));
}
