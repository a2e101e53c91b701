//! No input brings the server down, and every bad one is refused as kube-apiserver refuses it: the requests
//! a panic was found with, the corpus of kube-apiserver's answers in `testdata/kube-apiserver-errors.yaml`,
//! and properties over arbitrary selectors and paging parameters. The byte-level fuzz target is in
//! `fuzz.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use gpuop_fakeserver::FakeServer;
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::support::{LIST_PARAMETERS, call, json_of, seeded_server, status_problem};

fn get(uri: &str) -> http::Request<Body> {
    http::Request::get(uri).body(Body::empty()).expect("request")
}

/// A request the server must answer with a failure `Status`: its code, reason and message.
async fn refused(server: &FakeServer, uri: &str) -> (u16, String, String) {
    let (code, _, body) = call(server, get(uri)).await;
    assert!(!(200..300).contains(&code), "{uri} should be refused: {body}");
    if let Some(problem) = status_problem(code, &body) {
        panic!("{uri}: {problem}");
    }
    let status = json_of(&body);
    (
        code,
        status["reason"].as_str().unwrap_or_default().to_owned(),
        status["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The server still answers a plain list of nodes with the three it holds.
async fn still_serves(server: &FakeServer) {
    let (code, _, body) = call(server, get("/api/v1/nodes")).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        json_of(&body)["items"].as_array().map(Vec::len),
        Some(3),
        "{body}"
    );
}

#[tokio::test]
async fn selectors_with_multibyte_characters_are_answered_not_dropped() {
    let server = seeded_server();
    let (code, reason, message) = refused(&server, "/api/v1/nodes?labelSelector=app%3D%C3%A9").await;
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
    assert!(
        message
            .starts_with(r#"unable to parse requirement: values[0][app]: Invalid value: "é": a valid label"#),
        "{message}"
    );
    let (code, _, body) = call(&server, get("/api/v1/nodes?fieldSelector=metadata.name%3D%C3%A9")).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(json_of(&body)["items"], json!([]));
    still_serves(&server).await;
}

/// The list's continue token with its start moved to `offset` (the token is base64url JSON, as
/// kube-apiserver's).
fn with_offset(token: &str, offset: &str) -> String {
    let mut decoded: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token).expect("base64url")).expect("JSON");
    let start = decoded["start"].as_str().expect("start").to_owned();
    let (snapshot, _) = start.split_once('/').expect("snapshot/offset");
    decoded["start"] = json!(format!("{snapshot}/{offset}"));
    URL_SAFE_NO_PAD.encode(decoded.to_string())
}

#[tokio::test]
async fn a_crafted_continue_offset_lists_nothing_past_the_end() {
    let server = seeded_server();
    let (code, _, body) = call(&server, get("/api/v1/nodes?limit=1")).await;
    assert_eq!(code, 200, "{body}");
    let first = json_of(&body);
    let token = first["metadata"]["continue"].as_str().expect("a continue token");
    // An offset at the end of the address space, where `offset + limit` overflowed.
    let crafted = with_offset(token, &usize::MAX.to_string());
    let (code, _, body) = call(&server, get(&format!("/api/v1/nodes?limit=2&continue={crafted}"))).await;
    assert_eq!(code, 200, "{body}");
    let page = json_of(&body);
    assert_eq!(page["items"], json!([]));
    assert_eq!(page["metadata"].get("continue"), None, "{page}");
    // A token for nodes is no token for configmaps.
    let (code, reason, message) = refused(
        &server,
        &format!("/api/v1/namespaces/default/configmaps?limit=1&continue={token}"),
    )
    .await;
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (
            400,
            "BadRequest",
            "invalid continue token: continue key is not valid"
        )
    );
    still_serves(&server).await;
}

#[tokio::test]
async fn a_watch_timeout_past_the_clock_is_no_timeout() {
    let server = seeded_server();
    let uri = format!("/api/v1/nodes?watch=true&timeoutSeconds={}", i64::MAX);
    let response = server.router().oneshot(get(&uri)).await.expect("infallible");
    assert_eq!(response.status(), 200);
    // The stream is open and sends the nodes it holds.
    let mut body = response.into_body().into_data_stream();
    let first = tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut body))
        .await
        .expect("an event within 10 s")
        .expect("a frame")
        .expect("bytes");
    let event: Value =
        serde_json::from_slice(first.split(|b| *b == b'\n').next().expect("one line")).expect("a JSON event");
    assert_eq!(event["type"], "ADDED");
    still_serves(&server).await;
}

/// One request of the corpus, as written in the YAML.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CaseRequest {
    method: String,
    path: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Option<String>,
    /// A body of this many bytes (`a`), for the size limit.
    body_bytes: Option<usize>,
}

/// What kube-apiserver answers: a `Status` (reason, message or its beginning) or a list.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Expect {
    code: u16,
    reason: Option<String>,
    message: Option<String>,
    message_prefix: Option<String>,
    kind: Option<String>,
    items: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    source: String,
    request: CaseRequest,
    expect: Expect,
}

const CORPUS: &str = include_str!("testdata/kube-apiserver-errors.yaml");

#[tokio::test]
async fn the_kube_apiserver_corpus_replays() {
    let cases: Vec<Case> = serde_saphyr::from_str(CORPUS).expect("the corpus parses");
    assert!(cases.len() >= 30, "the corpus lost cases: {}", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let server = seeded_server();
        let mut request = http::Request::builder()
            .method(case.request.method.as_str())
            .uri(case.request.path.as_str());
        for (name, value) in &case.request.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let body = match (&case.request.body, case.request.body_bytes) {
            (_, Some(size)) => Body::from(vec![b'a'; size]),
            (Some(text), None) => Body::from(text.clone()),
            (None, None) => Body::empty(),
        };
        let (code, _, body) = call(&server, request.body(body).expect("request")).await;
        let expect = &case.expect;
        let problem = if code != expect.code {
            Some(format!("answered {code}, not {}: {body}", expect.code))
        } else if (200..300).contains(&code) {
            let list = json_of(&body);
            if expect.kind.as_deref().is_some_and(|kind| list["kind"] != kind)
                || expect
                    .items
                    .is_some_and(|n| list["items"].as_array().map(Vec::len) != Some(n))
            {
                Some(format!(
                    "expected {:?} with {:?} items: {body}",
                    expect.kind, expect.items
                ))
            } else {
                None
            }
        } else if let Some(problem) = status_problem(code, &body) {
            Some(problem)
        } else {
            let status = json_of(&body);
            let message = status["message"].as_str().unwrap_or_default();
            if expect.reason.as_deref().is_some_and(|r| status["reason"] != r) {
                Some(format!("reason {} is not {:?}", status["reason"], expect.reason))
            } else if expect.message.as_deref().is_some_and(|m| message != m) {
                Some(format!("message {message:?} is not {:?}", expect.message))
            } else if expect
                .message_prefix
                .as_deref()
                .is_some_and(|m| !message.starts_with(m))
            {
                Some(format!(
                    "message {message:?} does not start {:?}",
                    expect.message_prefix
                ))
            } else {
                None
            }
        };
        if let Some(problem) = problem {
            failures.push(format!("{} ({}): {problem}", case.name, case.source));
        }
        still_serves(&server).await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Cases per property: `PROPTEST_CASES` if set, else 64; a fixed seed unless `FAKESERVER_FUZZ_SEED`
/// gives one, so CI runs the same inputs every time.
fn config() -> ProptestConfig {
    let seed = std::env::var("FAKESERVER_FUZZ_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(0x5eed_f00d);
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Text mixing selector syntax, escapes, multi-byte characters and anything at all.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        prop::sample::select(vec![
            "a",
            "app",
            "=",
            "==",
            "!=",
            "!",
            "in",
            "notin",
            "(",
            ")",
            ",",
            " ",
            ">",
            "<",
            "\\",
            "\\,",
            "\\=",
            "é",
            "日本",
            "\u{0}",
            "%",
            "metadata.name",
            "spec.nodeName",
            "-1",
            "0",
            "9223372036854775807",
            "18446744073709551616",
            "c-0-18446744073709551615",
        ])
        .prop_map(str::to_owned),
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..12).prop_map(|pieces| pieces.concat())
}

fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

proptest! {
    #![proptest_config(config())]

    /// Any value of any list parameter is a list or a well-formed refusal, never a dropped connection;
    /// a watch with it is a stream or a refusal.
    #[test]
    fn list_parameters_are_answered(
        values in prop::collection::vec((prop::sample::select(LIST_PARAMETERS), text()), 1..4),
        watch in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let server = seeded_server();
            let query: Vec<String> = values.iter().map(|(k, v)| format!("{k}={}", encode(v))).collect();
            let uri = format!("/api/v1/nodes?{}{}", query.join("&"), if watch { "&watch=1" } else { "" });
            let response = server.router().oneshot(get(&uri)).await.expect("infallible");
            let code = response.status().as_u16();
            if !(200..300).contains(&code) {
                let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
                let body = String::from_utf8_lossy(&bytes);
                prop_assert!(matches!(code, 400 | 410 | 422 | 504), "{uri}: {code} {body}");
                prop_assert_eq!(status_problem(code, &body), None, "{}", uri);
            }
            still_serves(&server).await;
            Ok(())
        })?;
    }

    /// Whatever the selector, a label selector is refused only with 400 `BadRequest`, and one that is
    /// accepted selects only nodes whose labels it matches (all three carry `app=gpu`).
    #[test]
    fn label_selectors_parse_or_are_refused(selector in text()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let server = seeded_server();
            let uri = format!("/api/v1/nodes?labelSelector={}", encode(&selector));
            let (code, _, body) = call(&server, get(&uri)).await;
            match code {
                200 => {
                    let items = json_of(&body)["items"].as_array().map_or(0, Vec::len);
                    prop_assert!(items == 0 || items == 3, "{selector:?}: {items} of 3 identical nodes");
                }
                400 => prop_assert_eq!(status_problem(code, &body), None, "{:?}", selector),
                other => prop_assert!(false, "{selector:?}: {other} {body}"),
            }
            Ok(())
        })?;
    }
}
