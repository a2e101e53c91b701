//! The fake API server measured against kube-apiserver: every case in `tests/testdata/differential/*.yaml`
//! sends the same requests, in order, to both (the fake server enforcing RBAC, with the simulator playing the
//! controllers a real control plane runs; a real control plane from `KUBE_BINARIES`), and compares what each
//! answered: the status code, the media type, `Warning` headers, and the body once what is the server's own
//! (uids, resource versions, timestamps, tokens, continue tokens) is blanked out. A `Status` body is so
//! compared whole: reason, message, details and causes.
//!
//! Every case that differs must be listed in docs/fakeserver.md's table "Differences the differential suite
//! finds", with its reason, and every case listed there must still differ: the table is the suite's complete
//! output. The test prints how many cases answered identically. A case added to the folder runs on both.
//!
//! A case runs in its own namespace, `diff-<case name>` (`{ns}` in a step). A step is:
//!
//! ```yaml
//! - request: POST /api/v1/namespaces/{ns}/configmaps?fieldValidation=Strict
//!   headers: {Content-Type: application/json}        # default: application/json when there is a body
//!   body: {metadata: {name: a}}                       # sent as JSON; or `raw:` text sent as written
//!   padding: 3200000                                  # adds data.padding of that many characters to body
//!   as: reader                                        # a ServiceAccount of the namespace (else the admin)
//!   setup: true                                       # only the status code is compared
//!   until: {code: 200, pointer: /status/x, equals: 1} # retried (30 s at most) until so, then compared
//! ```
//!
//! `{rv:N}` and `{continue:N}` in a later step stand for `metadata.resourceVersion` and `metadata.continue` of
//! step N's answer on the same server.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuop_sim::cluster_spec::ClusterSpec;
use gpuop_sim::simulation::Simulation;
use gpuop_testkit::Backend;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};
use regex::Regex;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::cluster::{repository_root, testdata};
use crate::operator::playing;

const AGENT: &str = "differential";

/// How long a step with `until` is retried.
const UNTIL_PATIENCE: Duration = Duration::from_secs(30);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    /// What the case checks, for whoever reads a difference.
    #[serde(default)]
    about: String,
    steps: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    request: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: Option<Value>,
    #[serde(default)]
    raw: Option<String>,
    #[serde(default)]
    padding: Option<usize>,
    #[serde(default, rename = "as")]
    account: Option<String>,
    #[serde(default)]
    setup: bool,
    #[serde(default)]
    until: Option<Until>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Until {
    code: u16,
    #[serde(default)]
    pointer: Option<String>,
    #[serde(default)]
    equals: Option<Value>,
}

impl Until {
    fn met(&self, answer: &Answer) -> bool {
        answer.code == self.code
            && match (&self.pointer, &self.equals) {
                (Some(pointer), Some(value)) => answer.raw.pointer(pointer) == Some(value),
                (Some(pointer), None) => answer.raw.pointer(pointer).is_some(),
                _ => true,
            }
    }
}

/// What a server answered to one step.
#[derive(Clone, Debug)]
struct Answer {
    code: u16,
    media_type: String,
    warnings: Vec<String>,
    /// The body as sent: JSON, a watch's events as an array, or a string.
    raw: Value,
}

impl Answer {
    /// What is compared: the body with the server's own values blanked out.
    fn compared(&self, setup: bool) -> Value {
        if setup {
            return json!({ "code": self.code });
        }
        json!({
            "code": self.code,
            "mediaType": self.media_type,
            "warnings": self.warnings,
            "body": normalized(&self.raw, None),
        })
    }
}

fn load_cases() -> Vec<(String, Case)> {
    let dir = testdata("differential");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("case file reads");
        let parsed: Vec<Case> =
            serde_saphyr::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", file.display()));
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        for case in parsed {
            assert!(
                names.insert(case.name.clone()),
                "case {} is named twice",
                case.name
            );
            cases.push((stem.clone(), case));
        }
    }
    cases
}

/// A server with what its cases need: the admin's client, and the controllers a real control plane runs.
struct Server {
    backend: Backend,
    admin: Client,
    _simulation: Option<Simulation>,
}

impl Server {
    async fn start(backend: Backend) -> Self {
        let admin = backend.client_as(AGENT).await;
        // The fake server runs no controller: the simulator plays them (no nodes), as kube-controller-manager
        // and kube-scheduler run beside kube-apiserver.
        let simulation = if backend.is_real() {
            None
        } else {
            let (timing, plays) = playing(&backend);
            let spec = ClusterSpec {
                nfd: false,
                node_pools: Vec::new(),
                workloads: Vec::new(),
            };
            Some(
                Simulation::start_playing(backend.client_as("gpu-sim").await, spec, timing, plays)
                    .await
                    .expect("the simulated controllers start"),
            )
        };
        Self {
            backend,
            admin,
            _simulation: simulation,
        }
    }

    async fn run(&self, namespace: &str, case: &Case) -> Vec<Answer> {
        let namespaces: Api<Namespace> = Api::all(self.admin.clone());
        let mut created = Namespace::default();
        created.metadata.name = Some(namespace.to_owned());
        namespaces
            .create(&PostParams::default(), &created)
            .await
            .unwrap_or_else(|error| panic!("namespace {namespace}: {error}"));
        let mut answers: Vec<Answer> = Vec::new();
        for step in &case.steps {
            let client = match &step.account {
                Some(account) => {
                    self.backend
                        .client_for_service_account(namespace, account, AGENT)
                        .await
                }
                None => self.admin.clone(),
            };
            let started = tokio::time::Instant::now();
            let answer = loop {
                let answer = send(&client, step, namespace, &answers).await;
                match &step.until {
                    Some(until) if !until.met(&answer) && started.elapsed() < UNTIL_PATIENCE => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    _ => break answer,
                }
            };
            if started.elapsed() > Duration::from_secs(5) {
                println!("{namespace}: `{}` took {:?}", step.request, started.elapsed());
            }
            answers.push(answer);
        }
        answers
    }
}

/// The step's text with `{ns}`, `{rv:N}` and `{continue:N}` filled in from this server's answers.
fn fill(text: &str, namespace: &str, answers: &[Answer]) -> String {
    let pattern = Regex::new(r"\{(rv|continue):(\d+)\}").expect("pattern");
    let text = text.replace("{ns}", namespace);
    pattern
        .replace_all(&text, |captures: &regex::Captures<'_>| {
            let index: usize = captures[2].parse().unwrap_or(usize::MAX);
            let field = if &captures[1] == "rv" {
                "resourceVersion"
            } else {
                "continue"
            };
            answers
                .get(index)
                .and_then(|a| a.raw.pointer(&format!("/metadata/{field}")))
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("step {index} answered no metadata.{field}"))
                .to_owned()
        })
        .into_owned()
}

async fn send(client: &Client, step: &Step, namespace: &str, answers: &[Answer]) -> Answer {
    let line = fill(&step.request, namespace, answers);
    let (method, path) = line
        .split_once(' ')
        .unwrap_or_else(|| panic!("request {line:?} is not `METHOD /path`"));
    let mut body = step.body.clone().map(|body| {
        let text = fill(&body.to_string(), namespace, answers);
        serde_json::from_str::<Value>(&text).expect("a filled body is JSON")
    });
    if let (Some(size), Some(body)) = (step.padding, body.as_mut()) {
        body["data"]["padding"] = json!("x".repeat(size));
    }
    let bytes = match (&step.raw, &body) {
        (Some(raw), _) => fill(raw, namespace, answers).into_bytes(),
        (None, Some(body)) => body.to_string().into_bytes(),
        (None, None) => Vec::new(),
    };
    let mut request = http::Request::builder().method(method).uri(path);
    let mut has_type = false;
    for (name, value) in &step.headers {
        has_type |= name.eq_ignore_ascii_case("content-type");
        request = request.header(name, value);
    }
    if !has_type && !bytes.is_empty() {
        request = request.header("Content-Type", "application/json");
    }
    let request = request.body(bytes.into()).expect("a request");
    let response = client
        .send(request)
        .await
        .unwrap_or_else(|error| panic!("{line}: {error}"));
    let code = response.status().as_u16();
    let media_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim().to_owned())
        .unwrap_or_default();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    let bytes = response
        .into_body()
        .collect_bytes()
        .await
        .unwrap_or_else(|error| panic!("{line}: reading the answer: {error}"));
    let text = String::from_utf8_lossy(&bytes);
    let raw = match serde_json::from_str::<Value>(&text) {
        Ok(value) => value,
        Err(_) => {
            // A watch: one JSON event after another.
            let events: Result<Vec<Value>, _> = serde_json::Deserializer::from_str(&text)
                .into_iter::<Value>()
                .collect();
            match events {
                Ok(events) if !events.is_empty() => Value::Array(events),
                _ => Value::String(text.into_owned()),
            }
        }
    };
    Answer {
        code,
        media_type,
        warnings,
        raw,
    }
}

/// `value` with what each server makes its own blanked out: uids, resource versions, times, tokens and
/// continue tokens; numbers of three digits or more in messages (resource versions quoted in them). A watch's
/// bookmarks are left out but for the one that ends the initial events: when a server sends the others is
/// its own choice.
fn normalized(value: &Value, key: Option<&str>) -> Value {
    const TIMES: [&str; 10] = [
        "creationTimestamp",
        "deletionTimestamp",
        "time",
        "lastTransitionTime",
        "lastUpdateTime",
        "eventTime",
        "firstTimestamp",
        "lastTimestamp",
        "expirationTimestamp",
        "startTime",
    ];
    match (key, value) {
        (Some("uid" | "resourceVersion" | "token" | "continue"), Value::String(s)) if !s.is_empty() => {
            json!(format!("<{}>", key.unwrap_or_default()))
        }
        (Some(key), Value::String(_)) if TIMES.contains(&key) => json!("<time>"),
        (_, Value::String(s)) => json!(blank_ids(s, key == Some("message"))),
        (_, Value::Array(items)) => Value::Array(
            items
                .iter()
                .filter(|item| !is_ordinary_bookmark(item))
                .map(|item| normalized(item, None))
                .collect(),
        ),
        (_, Value::Object(map)) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), normalized(v, Some(k))))
                .collect(),
        ),
        _ => value.clone(),
    }
}

fn is_ordinary_bookmark(event: &Value) -> bool {
    event["type"] == "BOOKMARK"
        && event
            .pointer("/object/metadata/annotations/k8s.io~1initial-events-end")
            .is_none()
}

fn blank_ids(text: &str, message: bool) -> String {
    let uuid = Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").expect("pattern");
    let text = uuid.replace_all(text, "<uid>");
    if message {
        let number = Regex::new(r"\d{3,}").expect("pattern");
        number.replace_all(&text, "N").into_owned()
    } else {
        text.into_owned()
    }
}

/// Where two values differ, as `path: fake | real`, the first few.
fn differences(fake: &Value, real: &Value, path: &str, found: &mut Vec<String>) {
    const SHOWN: usize = 8;
    if found.len() >= SHOWN || fake == real {
        return;
    }
    match (fake, real) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let at = format!("{path}/{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => differences(x, y, &at, found),
                    // A key one side leaves out is not the same as one it sends as null.
                    (x, y) if found.len() < SHOWN => found.push(format!(
                        "{at}: fake {} | real {}",
                        x.map_or("(absent)".to_owned(), short),
                        y.map_or("(absent)".to_owned(), short)
                    )),
                    _ => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, &format!("{path}/{index}"), found);
            }
        }
        _ => found.push(format!("{path}: fake {} | real {}", short(fake), short(real))),
    }
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(300) {
        Some((end, _)) => format!("{}…", text.get(..end).unwrap_or_default()),
        None => text,
    }
}

/// The cases docs/fakeserver.md lists as differing: the names in the first column of its table under
/// "Differences the differential suite finds" (a row may name several, each in backquotes).
fn documented_differences() -> BTreeSet<String> {
    let doc =
        std::fs::read_to_string(repository_root().join("docs/fakeserver.md")).expect("docs/fakeserver.md");
    let section = doc
        .split_once("### Differences the differential suite finds")
        .map(|(_, rest)| rest)
        .expect("docs/fakeserver.md has the section \"Differences the differential suite finds\"");
    let section = section.split("\n#").next().unwrap_or_default();
    section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .filter_map(|line| line.strip_prefix("| ")?.split_once(" | ").map(|(cell, _)| cell))
        .flat_map(|cell| cell.split('`').skip(1).step_by(2).map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a real control plane: set KUBE_BINARIES and run `cargo test -- --ignored real_control_plane`"]
async fn the_fake_server_answers_as_kube_apiserver_real_control_plane() {
    let cases = load_cases();
    assert!(!cases.is_empty(), "no case in tests/testdata/differential");
    let fake = Server::start(Backend::fake_rbac()).await;
    let real = Server::start(Backend::real().await).await;
    let mut identical = 0;
    let mut differing: BTreeMap<String, String> = BTreeMap::new();
    for (file, case) in &cases {
        let namespace = format!("diff-{}", case.name);
        let started = tokio::time::Instant::now();
        let (on_fake, on_real) = (fake.run(&namespace, case).await, real.run(&namespace, case).await);
        let took = started.elapsed();
        if took > Duration::from_secs(5) {
            println!("case {} took {took:?}", case.name);
        }
        // DIFFERENTIAL_SHOW=<case>,<case> prints what each server answered, whole.
        if std::env::var("DIFFERENTIAL_SHOW").is_ok_and(|show| show.split(',').any(|c| c == case.name)) {
            for (index, (a, b)) in on_fake.iter().zip(&on_real).enumerate() {
                println!(
                    "step {index}\n  fake: {} {}\n  real: {} {}",
                    a.code, a.raw, b.code, b.raw
                );
            }
        }
        let mut report = Vec::new();
        for (index, ((step, a), b)) in case.steps.iter().zip(&on_fake).zip(&on_real).enumerate() {
            let (a, b) = (a.compared(step.setup), b.compared(step.setup));
            let mut found = Vec::new();
            differences(&a, &b, "", &mut found);
            if !found.is_empty() {
                report.push(format!(
                    "  step {index} `{}`:\n    {}",
                    step.request,
                    found.join("\n    ")
                ));
            }
        }
        if report.is_empty() {
            identical += 1;
        } else {
            differing.insert(
                case.name.clone(),
                format!(
                    "{file}.yaml {} ({}):\n{}",
                    case.name,
                    case.about,
                    report.join("\n")
                ),
            );
        }
    }
    println!(
        "differential suite: {identical} of {} cases answered identically by the fake server and kube-apiserver",
        cases.len()
    );
    for report in differing.values() {
        println!("{report}");
    }
    let found: BTreeSet<String> = differing.keys().cloned().collect();
    let documented = documented_differences();
    let undocumented: Vec<&String> = found.difference(&documented).collect();
    let stale: Vec<&String> = documented.difference(&found).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "docs/fakeserver.md's differences are not what the suite finds: differing but not listed: \
         {undocumented:?}; listed but answered identically (or no such case): {stale:?}"
    );
}

/// Without a control plane: every case reads, and every case docs/fakeserver.md lists as differing exists.
#[test]
fn the_documented_differences_name_cases_of_the_suite() {
    let cases: BTreeSet<String> = load_cases().into_iter().map(|(_, case)| case.name).collect();
    let documented = documented_differences();
    assert!(!documented.is_empty(), "the table lists no case");
    let unknown: Vec<&String> = documented.difference(&cases).collect();
    assert!(
        unknown.is_empty(),
        "docs/fakeserver.md lists cases the suite does not have: {unknown:?}"
    );
}
