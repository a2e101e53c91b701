//! NVIDIA's operator as an oracle: for each values file of the chart's `tests/compat/`, NVIDIA's operator
//! (built from its source, `shared/nvidia`; `scripts/nvidia-operator` unpacks it) and ours each converge a
//! real control plane of their own, with the same simulated nodes and the same input: the ClusterPolicy
//! (and NVIDIADriver) NVIDIA's chart renders from the values (`tests/compat/expected/`) and the ConfigMaps
//! the chart creates from them. Every object each operator created (everything owned by the ClusterPolicy
//! or an NVIDIADriver, as the API server stored it, defaults included) and the `nvidia.com/` labels and
//! annotations of every node are compared field by field.
//!
//! Every difference must be listed in docs/migrate.md's table "Differences NVIDIA's operator shows", with
//! its reason; a listed difference the run no longer finds fails the test too, so the table is exactly
//! what the oracle finds. `ORACLE_CASES=defaults,...` runs some cases only (and then checks only that what
//! they find is listed); `ORACLE_SHOW=1` prints both sides' values of every difference.
//!
//! The `defaults` case also checks `testdata/nvidia-converged/`, which the migration test replays: what
//! NVIDIA's operator wrote for the sample policy (see [`replay`]); `UPDATE_GOLDEN=1` rewrites it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuop_api::labels::UPGRADE_STATE;
use gpuop_sim::demo::NAMESPACE;
use gpuop_sim::hardware::GpuModel;
use gpuop_testkit::{Backend, ControlPlane, NvidiaOperator, RunningNvidia};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::{Discovery, verbs};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::operator::{Cluster, pool};
use crate::tools::helm;

/// How long one operator has to converge a case; NVIDIA's takes about a minute on this machine.
const PATIENCE: Duration = Duration::from_secs(300);
/// How long the objects must stay the same before they are read for the comparison: longer than the
/// 5 s NVIDIA's operator requeues a policy that is not ready yet.
const QUIET: Duration = Duration::from_secs(12);

fn compat() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/gpu-operator/tests/compat")
}

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The values files, by name without `.yaml`; `ORACLE_CASES` picks some.
fn cases() -> Vec<String> {
    let mut all: Vec<String> = std::fs::read_dir(compat().join("values"))
        .expect("tests/compat/values")
        .filter_map(|entry| {
            let path = entry.expect("an entry").path();
            (path.extension()? == "yaml").then(|| path.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect();
    all.sort();
    if let Ok(chosen) = std::env::var("ORACLE_CASES") {
        let chosen: Vec<&str> = chosen.split(',').map(str::trim).collect();
        all.retain(|case| chosen.contains(&case.as_str()));
    }
    all
}

/// What both operators are given for `case`: the ClusterPolicy and NVIDIADriver NVIDIA's chart renders
/// from the values, the ConfigMaps this chart renders from them (NVIDIA's creates the same ones), and what
/// the values name that a cluster admin creates (a PriorityClass, the driver's repository and certificate
/// ConfigMaps).
fn inputs(case: &str) -> Vec<Value> {
    let expected = std::fs::read_to_string(compat().join(format!("expected/{case}.yaml")))
        .expect("tests/compat/expected/<case>.yaml");
    let mut documents: Vec<Value> = serde_saphyr::from_multiple(&expected).expect("expected/ parses");
    let chart = repository_root().join("deploy/helm/gpu-operator");
    let values = compat().join(format!("values/{case}.yaml"));
    let output = std::process::Command::new(helm())
        .args(["template", "gpu-operator"])
        .arg(&chart)
        .args(["--namespace", NAMESPACE, "-f"])
        .arg(&values)
        .output()
        .expect("helm runs");
    assert!(
        output.status.success(),
        "helm template {}: {}",
        values.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let rendered: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&output.stdout))
        .expect("the chart renders YAML");
    documents.extend(rendered.into_iter().filter(|d| d["kind"] == "ConfigMap"));
    documents.retain(|d| d.is_object());
    // A priority class the values name is the cluster's: without it no operand pod can be created.
    let values: Value = serde_saphyr::from_str(&std::fs::read_to_string(&values).expect("values read"))
        .unwrap_or(Value::Null);
    if let Some(class) = values["daemonsets"]["priorityClassName"].as_str()
        && !class.starts_with("system-")
    {
        documents.push(json!({
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": class},
            "value": 1_000_000,
        }));
    }
    // The driver's package repository and certificate ConfigMaps are the cluster admin's too; NVIDIA's
    // operator reads their keys to mount each file.
    for (name, file, text) in [
        (
            &values["driver"]["repoConfig"]["configMapName"],
            "mirror.list",
            "deb https://registry.example.com/ubuntu jammy main\n",
        ),
        (
            &values["driver"]["certConfig"]["name"],
            "mirror.crt",
            "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
        ),
    ] {
        if let Some(name) = name.as_str().filter(|n| !n.is_empty()) {
            documents.push(json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "data": {file: text},
            }));
        }
    }
    documents
}

/// NVIDIADrivers.
fn nvidia_drivers() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nvidia.com", "v1alpha1", "NVIDIADriver"),
        "nvidiadrivers",
    )
}

/// The API resource of an input document's kind.
fn resource(document: &Value) -> (ApiResource, bool) {
    let (group, version, kind, plural, namespaced) = match document["kind"].as_str() {
        Some("ClusterPolicy") => ("nvidia.com", "v1", "ClusterPolicy", "clusterpolicies", false),
        Some("NVIDIADriver") => ("nvidia.com", "v1alpha1", "NVIDIADriver", "nvidiadrivers", false),
        Some("ConfigMap") => ("", "v1", "ConfigMap", "configmaps", true),
        Some("PriorityClass") => (
            "scheduling.k8s.io",
            "v1",
            "PriorityClass",
            "priorityclasses",
            false,
        ),
        other => panic!("an input of kind {other:?}"),
    };
    (
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural),
        namespaced,
    )
}

/// Applies `documents` as a person would with `kubectl apply --server-side`.
async fn apply(client: &Client, documents: &[Value]) {
    for document in documents {
        let (resource, namespaced) = resource(document);
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(client.clone(), NAMESPACE, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        let name = document["metadata"]["name"].as_str().expect("named");
        api.patch(
            name,
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(document),
        )
        .await
        .unwrap_or_else(|e| panic!("{} {name} applies: {e}", resource.kind));
    }
}

/// The simulated nodes of every case: a MIG-capable H100 node, an L4 node, and a node without a GPU, all
/// on the same OS release; with the driver on the hosts where the policy installs none.
fn nodes(inputs: &[Value]) -> Vec<gpuop_sim::cluster_spec::NodePool> {
    let preinstalled = inputs
        .iter()
        .any(|d| d["kind"] == "ClusterPolicy" && d["spec"]["driver"]["enabled"] == false);
    let mut pools = vec![
        pool("h100", 1, Some(GpuModel::H100_80GB)),
        pool("l4", 1, Some(GpuModel::L4)),
        pool("cpu", 1, None),
    ];
    for pool in pools.iter_mut().filter(|p| p.gpu.is_some()) {
        pool.driver_preinstalled = preinstalled;
    }
    pools
}

/// Who converges a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Nvidia,
    Ours,
}

/// What an operator created, by object (see [`created`]).
type Created = BTreeMap<String, Value>;

/// A kind the comparison reads, and whether its objects are namespaced.
type Kinds = Vec<(ApiResource, bool)>;

/// Every kind that can be listed, but those only controllers create from the operators' objects.
async fn kinds(client: &Client) -> Kinds {
    const DERIVED: [&str; 7] = [
        "Pod",
        "ControllerRevision",
        "Event",
        "EndpointSlice",
        "Endpoints",
        "Lease",
        "Node",
    ];
    let discovery = Discovery::new(client.clone()).run().await.expect("discovery");
    discovery
        .groups()
        .flat_map(|group| group.recommended_resources())
        .filter(|(resource, capabilities)| {
            capabilities.supports_operation(verbs::LIST) && !DERIVED.contains(&resource.kind.as_str())
        })
        .map(|(resource, capabilities)| {
            let namespaced = capabilities.scope == kube::discovery::Scope::Namespaced;
            (resource, namespaced)
        })
        .collect()
}

/// What an operator created, by `Kind name` (`Kind namespace/name` for namespaced objects), each as
/// [`normalized`]; and each node's `nvidia.com/` labels and annotations as `Node name`.
async fn created(client: &Client, kinds: &Kinds) -> Result<BTreeMap<String, Value>, String> {
    let mut objects = BTreeMap::new();
    for (resource, namespaced) in kinds {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            // A kind whose CRD went away, or that the API server lists but serves no more.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 405 => continue,
            Err(error) => return Err(format!("listing {}: {error}", resource.plural)),
        };
        for object in list.items {
            let owned = object
                .owner_references()
                .iter()
                .any(|owner| owner.kind == "ClusterPolicy" || owner.kind == "NVIDIADriver");
            if !owned {
                continue;
            }
            let name = if *namespaced {
                format!("{}/{}", object.namespace().unwrap_or_default(), object.name_any())
            } else {
                object.name_any()
            };
            let value = serde_json::to_value(&object).map_err(|e| e.to_string())?;
            objects.insert(
                format!("{} {name}", resource.kind),
                normalized(&resource.kind, value),
            );
        }
    }
    // A driver DaemonSet of an NVIDIADriver is named after a hash of the NVIDIADriver's uid, which each
    // cluster assigns anew: compared as the uid itself is, by what it stands for.
    let drivers = Api::<DynamicObject>::all_with(client.clone(), &nvidia_drivers())
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items;
    for driver in drivers {
        let hash = gpuop_render::name_hash(&driver.uid().unwrap_or_default());
        let stand_in = format!("HASH({})", driver.name_any());
        let text = serde_json::to_string(&objects).map_err(|e| e.to_string())?;
        objects = serde_json::from_str(&text.replace(&hash, &stand_in)).map_err(|e| e.to_string())?;
    }
    for node in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
    {
        let ours = |map: &BTreeMap<String, String>| -> BTreeMap<String, String> {
            map.iter()
                .filter(|(key, _)| key.starts_with("nvidia.com/"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        objects.insert(
            format!("Node {}", node.name_any()),
            json!({"labels": ours(node.labels()), "annotations": ours(node.annotations())}),
        );
    }
    Ok(objects)
}

/// An object as the comparison sees it: without what the API server assigns anew on every cluster (uid,
/// versions, timestamps, managed fields, allocated cluster IPs, the owner's uid) and without status; data
/// of a ConfigMap that is YAML compared as YAML.
fn normalized(kind: &str, mut object: Value) -> Value {
    if let Some(metadata) = object["metadata"].as_object_mut() {
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
        ] {
            metadata.remove(field);
        }
        for owner in metadata
            .get_mut("ownerReferences")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(owner) = owner.as_object_mut() {
                owner.remove("uid");
            }
        }
    }
    if let Some(object) = object.as_object_mut() {
        object.remove("status");
    }
    if kind == "Service"
        && let Some(spec) = object["spec"].as_object_mut()
    {
        spec.remove("clusterIP");
        spec.remove("clusterIPs");
    }
    if kind == "ConfigMap"
        && let Some(data) = object["data"].as_object_mut()
    {
        for (key, value) in data.iter_mut() {
            let yaml = key.ends_with(".yaml") || key.ends_with(".yml");
            if let (true, Some(text)) = (yaml, value.as_str())
                && let Ok(parsed) = serde_saphyr::from_str::<Value>(text)
            {
                *value = parsed;
            }
        }
    }
    object
}

/// A list item's identity, when every item of its list has one: what the API server merges it by.
fn item_key(item: &Value) -> Option<String> {
    ["name", "key", "mountPath", "containerPort", "devicePath"]
        .iter()
        .find_map(|field| {
            let value = item.get(*field)?;
            Some(value.as_str().map_or_else(|| value.to_string(), str::to_owned))
        })
}

/// The paths where `nvidia` and `ours` differ, with both values.
fn differences(nvidia: &Value, ours: &Value, path: &str, found: &mut Vec<(String, Value, Value)>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    // A map or keyed list one side lacks compares as an empty one: each key is a difference of its own.
    let empty_object = Value::Object(serde_json::Map::new());
    let empty_array = Value::Array(Vec::new());
    let (nvidia, ours) = match (nvidia, ours) {
        (Value::Null, b @ Value::Object(_)) => (&empty_object, b),
        (a @ Value::Object(_), Value::Null) => (a, &empty_object),
        (Value::Null, b @ Value::Array(_)) => (&empty_array, b),
        (a @ Value::Array(_), Value::Null) => (a, &empty_array),
        other => other,
    };
    match (nvidia, ours) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let (x, y) = (
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                );
                differences(x, y, &join(key), found);
            }
        }
        (Value::Array(a), Value::Array(b))
            if a.iter().chain(b).next().is_some() && a.iter().chain(b).all(|i| item_key(i).is_some()) =>
        {
            let keyed = |items: &Vec<Value>| -> Vec<(String, Value)> {
                items
                    .iter()
                    .map(|i| (item_key(i).unwrap_or_default(), i.clone()))
                    .collect()
            };
            let (a, b) = (keyed(a), keyed(b));
            let order = |items: &[(String, Value)], other: &[(String, Value)]| -> Vec<String> {
                items
                    .iter()
                    .map(|(k, _)| k.clone())
                    .filter(|k| other.iter().any(|(o, _)| o == k))
                    .collect()
            };
            if order(&a, &b) != order(&b, &a) {
                found.push((
                    format!("{path} (order)"),
                    json!(order(&a, &b)),
                    json!(order(&b, &a)),
                ));
            }
            let mut keys: Vec<&String> = a.iter().map(|(k, _)| k).collect();
            keys.extend(
                b.iter()
                    .map(|(k, _)| k)
                    .filter(|k| !a.iter().any(|(o, _)| o == *k)),
            );
            for key in keys {
                let find = |items: &[(String, Value)]| {
                    items
                        .iter()
                        .find(|(k, _)| k == key)
                        .map_or(Value::Null, |(_, v)| v.clone())
                };
                differences(&find(&a), &find(&b), &format!("{path}[{key}]"), found);
            }
        }
        (a, b) if a != b => found.push((path.to_owned(), a.clone(), b.clone())),
        _ => {}
    }
}

/// Converges `case` with `side`'s operator on a control plane of its own; what it created, once settled,
/// and, for NVIDIA's operator on [`REPLAYED_CASE`], the files of [`replay`].
async fn converge(side: Side, case: &str, nvidia: &NvidiaOperator) -> Converged {
    let inputs = inputs(case);
    let mut cluster = Cluster::on(Backend::real().await, nodes(&inputs)).await;
    let client = cluster.client.clone();
    if side == Side::Nvidia {
        nvidia
            .install_crds(&client)
            .await
            .unwrap_or_else(|error| panic!("{error}"));
    }
    apply(&client, &inputs).await;
    let running = match side {
        Side::Nvidia => {
            let plane: &ControlPlane = match &cluster.backend {
                Backend::Real(plane) => plane,
                Backend::Fake(_) => unreachable!("the oracle runs on real control planes"),
            };
            Some(nvidia.start(plane, NAMESPACE).expect("NVIDIA's operator starts"))
        }
        Side::Ours => {
            cluster.start_operator().await;
            None
        }
    };
    let settled = settled(&client, running, case, side).await;
    let replay = if side == Side::Nvidia && case == REPLAYED_CASE {
        Some(replay(&client).await)
    } else {
        None
    };
    cluster.stop().await;
    Converged {
        created: settled,
        replay,
    }
}

/// What [`converge`] gives.
struct Converged {
    created: Created,
    replay: Option<Replay>,
}

/// The case whose objects from NVIDIA's operator the migration test replays (`testdata/nvidia-converged/`):
/// the chart's defaults, which are `deploy/samples/clusterpolicy.yaml`.
const REPLAYED_CASE: &str = "defaults";

/// The kinds the migration test replays; the others (RuntimeClasses, Services) our operator creates or takes
/// over by name, and restart no pod.
const REPLAYED_KINDS: [&str; 7] = [
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "DaemonSet",
];

/// The values that differ on every cluster, and their stand-ins in the replayed files: the owner's uid (the
/// migration test puts its policy's there) and NVIDIA's hash of what it last wrote, which covers the owner's
/// uid (two runs give two hashes; the driver's `DRIVER_CONFIG_DIGEST` stays the same, and stays).
const STAND_INS: [(&str, &str); 2] = [
    ("/metadata/ownerReferences/0/uid", "CLUSTER-POLICY-UID"),
    (
        "/metadata/annotations/nvidia.com~1last-applied-hash",
        "NVIDIA-LAST-APPLIED-HASH",
    ),
];

/// Files by name: `<kind>-<name>.yaml`.
type Replay = BTreeMap<String, String>;

fn replay_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/nvidia-converged")
}

/// What NVIDIA's operator wrote: each object of [`REPLAYED_KINDS`] owned by the policy, cut down to the
/// fields its managed fields give it (what it sent, and what kube-apiserver defaulted in that request, which
/// it attributes to the writer: no status, nothing another writer set), its identity, and [`STAND_INS`] for
/// what differs on every cluster.
async fn replay(client: &Client) -> Replay {
    let mut files = Replay::new();
    for (resource, namespaced) in kinds(client).await {
        if !REPLAYED_KINDS.contains(&resource.kind.as_str()) {
            continue;
        }
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        for object in api.list(&ListParams::default()).await.expect("list").items {
            let owned = object
                .owner_references()
                .iter()
                .any(|o| o.kind == "ClusterPolicy");
            if !owned || (namespaced && object.namespace().as_deref() != Some(NAMESPACE)) {
                continue;
            }
            let name = object.name_any();
            let mut sent = json!({});
            for entry in object.metadata.managed_fields.iter().flatten() {
                // NVIDIA's operator writes as its user agent's product token.
                if entry.manager.as_deref() == Some(gpuop_testkit::nvidia::USER_AGENT)
                    && entry.subresource.is_none()
                    && let Some(fields) = &entry.fields_v1
                {
                    merge(&mut sent, &fields.0);
                }
            }
            let whole = serde_json::to_value(&object).expect("an object");
            // Identity first, as a person writes a manifest; managed fields do not name it.
            let mut written = json!({
                "apiVersion": resource.api_version,
                "kind": resource.kind,
                "metadata": { "name": name },
            });
            if namespaced {
                written["metadata"]["namespace"] = json!(NAMESPACE);
            }
            for (key, value) in sent_part(&whole, &sent).as_object().into_iter().flatten() {
                match (key.as_str(), value.as_object()) {
                    ("metadata", Some(metadata)) => {
                        for (field, value) in metadata {
                            written["metadata"][field] = value.clone();
                        }
                    }
                    _ => written[key] = value.clone(),
                }
            }
            for (pointer, stand_in) in STAND_INS {
                if let Some(value) = written.pointer_mut(pointer) {
                    *value = json!(stand_in);
                }
            }
            let yaml = serde_saphyr::to_string(&written).expect("YAML");
            files.insert(
                format!("{}-{name}.yaml", resource.kind.to_lowercase()),
                format!("{REPLAY_HEADER}{yaml}"),
            );
        }
    }
    files
}

/// The first line of every replayed file.
const REPLAY_HEADER: &str =
    "# Written by the oracle test from what NVIDIA's operator created; see README.md.\n";

/// Merges the field set `more` (a managed fields entry's `fieldsV1`) into `into`.
fn merge(into: &mut Value, more: &Value) {
    match (into.as_object_mut(), more.as_object()) {
        (Some(into), Some(more)) => {
            for (key, value) in more {
                merge(into.entry(key.clone()).or_insert_with(|| json!({})), value);
            }
        }
        _ => *into = more.clone(),
    }
}

/// The part of `value` that the field set `fields` names (`f:` map fields, `k:` keyed list items, `v:` set
/// members, `i:` indices); a field named without children is kept whole (a leaf, or atomic).
fn sent_part(value: &Value, fields: &Value) -> Value {
    let Some(fields) = fields.as_object() else {
        return value.clone();
    };
    match value {
        Value::Object(map) if fields.keys().any(|k| k.starts_with("f:")) => Value::Object(
            map.iter()
                .filter_map(|(key, child)| {
                    let sub = fields.get(&format!("f:{key}"))?;
                    Some((key.clone(), sent_part(child, sub)))
                })
                .collect(),
        ),
        Value::Array(items) if fields.keys().any(|k| k != ".") => Value::Array(
            items
                .iter()
                .enumerate()
                .filter_map(|(index, item)| {
                    let (_, sub) = fields.iter().find(|(key, _)| names_item(key, index, item))?;
                    Some(sent_part(item, sub))
                })
                .collect(),
        ),
        _ => value.clone(),
    }
}

/// Whether a list item's key in a field set (`k:{"name":"x"}`, `v:"x"`, `i:0`) names `item`.
fn names_item(key: &str, index: usize, item: &Value) -> bool {
    if let Some(fields) = key.strip_prefix("k:") {
        serde_json::from_str::<serde_json::Map<String, Value>>(fields)
            .is_ok_and(|fields| fields.iter().all(|(field, value)| item.get(field) == Some(value)))
    } else if let Some(member) = key.strip_prefix("v:") {
        serde_json::from_str::<Value>(member).is_ok_and(|member| &member == item)
    } else if let Some(at) = key.strip_prefix("i:") {
        at.parse() == Ok(index)
    } else {
        false
    }
}

/// Compares the replayed files with `testdata/nvidia-converged/`, or writes them there with
/// `UPDATE_GOLDEN=1`. Gives what is stale.
fn check_replay(replay: &Replay) -> Vec<String> {
    let dir = replay_dir();
    let committed: BTreeMap<String, String> = std::fs::read_dir(&dir)
        .expect("testdata/nvidia-converged")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .map(|path| {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("a name")
                .to_owned();
            (name, std::fs::read_to_string(&path).expect("reads"))
        })
        .collect();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        for name in committed.keys().filter(|name| !replay.contains_key(*name)) {
            std::fs::remove_file(dir.join(name)).expect("removes a stale file");
        }
        for (name, text) in replay {
            std::fs::write(dir.join(name), text).expect("writes");
        }
        return Vec::new();
    }
    let names: BTreeSet<&String> = committed.keys().chain(replay.keys()).collect();
    names
        .into_iter()
        .filter(|name| committed.get(*name) != replay.get(*name))
        .map(|name| match (committed.get(name), replay.get(name)) {
            (Some(_), None) => format!("{name}: NVIDIA's operator no longer creates it"),
            (None, Some(_)) => format!("{name}: missing"),
            _ => format!("{name}: differs"),
        })
        .collect()
}

/// Waits until the policy is ready, every DaemonSet rolled out, and what the operator created has stayed
/// the same for [`QUIET`]; returns it. Panics after [`PATIENCE`], or when NVIDIA's operator exits.
async fn settled(
    client: &Client,
    mut running: Option<RunningNvidia>,
    case: &str,
    side: Side,
) -> BTreeMap<String, Value> {
    let kinds = kinds(client).await;
    let started = Instant::now();
    let mut last: Option<(BTreeMap<String, Value>, Instant)> = None;
    loop {
        if let Some(error) = running.as_mut().and_then(RunningNvidia::exited) {
            panic!("{error}");
        }
        let why = match rolled_out(client).await {
            Ok(()) => match created(client, &kinds).await {
                Ok(now) => match last.take() {
                    Some((before, since)) if before == now => {
                        if since.elapsed() >= QUIET {
                            return now;
                        }
                        last = Some((before, since));
                        "quiet, not for long enough yet".to_owned()
                    }
                    _ => {
                        last = Some((now, Instant::now()));
                        "the objects changed".to_owned()
                    }
                },
                Err(error) => error,
            },
            Err(error) => {
                last = None;
                error
            }
        };
        assert!(
            started.elapsed() < PATIENCE,
            "{side:?}'s operator did not converge {case} within {PATIENCE:?}: {why}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Whether the policy says ready and every DaemonSet of the namespace runs its latest revision, ready, on
/// every node it selects (and some DaemonSet has pods).
async fn rolled_out(client: &Client) -> Result<(), String> {
    let (policy, ready) = gpuop_sim::real_bench::rolled_out(client).await?;
    if ready.values().sum::<i32>() == 0 {
        return Err("no DaemonSet has pods yet".to_owned());
    }
    // Both operators mark a node whose driver pod runs with its upgrade state (NVIDIA's upgrade controller
    // on its own schedule, up to minutes after the pod is ready), but with sandbox workloads, where neither
    // upgrades drivers.
    if policy.data["spec"]["sandboxWorkloads"]["enabled"] == true {
        return Ok(());
    }
    let drivers = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/component=nvidia-driver"))
        .await
        .map_err(|e| e.to_string())?
        .items;
    for pod in drivers {
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        let node = Api::<Node>::all(client.clone())
            .get(&node)
            .await
            .map_err(|e| e.to_string())?;
        if !node.labels().contains_key(UPGRADE_STATE) {
            return Err(format!(
                "{} runs a driver pod and has no upgrade state yet",
                node.name_any()
            ));
        }
    }
    Ok(())
}

/// One difference: `Kind name path`, or `Kind name (NVIDIA's only)` / `(ours only)` for an object only one
/// side created.
fn lines(nvidia: &BTreeMap<String, Value>, ours: &BTreeMap<String, Value>) -> Vec<(String, Value, Value)> {
    let mut found = Vec::new();
    let names: BTreeSet<&String> = nvidia.keys().chain(ours.keys()).collect();
    for name in names {
        match (nvidia.get(name), ours.get(name)) {
            (Some(_), None) => found.push((format!("{name} (NVIDIA's only)"), Value::Null, Value::Null)),
            (None, Some(_)) => found.push((format!("{name} (ours only)"), Value::Null, Value::Null)),
            (Some(a), Some(b)) => {
                let mut paths = Vec::new();
                differences(a, b, "", &mut paths);
                found.extend(
                    paths
                        .into_iter()
                        .map(|(path, x, y)| (format!("{name} {path}"), x, y)),
                );
            }
            (None, None) => {}
        }
    }
    found
}

/// A row of docs/migrate.md's table: a pattern (`*` stands for any text), the cases it applies to.
#[derive(Debug)]
struct Listed {
    pattern: String,
    cases: Vec<String>,
}

impl Listed {
    fn matches(&self, case: &str, line: &str) -> bool {
        (self.cases.iter().any(|c| c == "all" || c == case)) && glob(&self.pattern, line)
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any text.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = rest.get(at + part.len()..).unwrap_or_default(),
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The rows of docs/migrate.md's table "Differences NVIDIA's operator shows": first column the pattern in
/// backticks, second the cases (`all`, or values file names).
fn listed() -> Vec<Listed> {
    let text = std::fs::read_to_string(repository_root().join("docs/migrate.md")).expect("docs/migrate.md");
    let section = text
        .split("### Differences NVIDIA's operator shows")
        .nth(1)
        .expect("docs/migrate.md has the section \"Differences NVIDIA's operator shows\"");
    section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let pattern = cells.get(1)?.trim_matches('`').to_owned();
            let cases = cells
                .get(2)?
                .split(',')
                .map(|c| c.trim().trim_matches('`').to_owned())
                .collect();
            Some(Listed { pattern, cases })
        })
        .collect()
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(160).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a real control plane with NVIDIA's operator: set KUBE_BINARIES and NVIDIA_OPERATOR \
            (scripts/control-plane, scripts/nvidia-operator) and run `cargo test -- --ignored real_control_plane`"]
async fn nvidias_operator_and_ours_create_the_same_objects_real_control_plane() {
    let nvidia = NvidiaOperator::from_env().unwrap_or_else(|error| panic!("{error}"));
    let table = listed();
    let show = std::env::var_os("ORACLE_SHOW").is_some();
    let all_cases = std::env::var_os("ORACLE_CASES").is_none();
    let mut unlisted = Vec::new();
    let mut used = vec![false; table.len()];
    let mut report = String::new();
    // The cases at once: most of a case is waiting for NVIDIA's upgrade controller's two-minute requeue.
    let runs: Vec<(String, Converged, Converged)> =
        futures::future::join_all(cases().into_iter().map(|case| {
            let nvidia = &nvidia;
            async move {
                let (theirs, ours) = tokio::join!(
                    converge(Side::Nvidia, &case, nvidia),
                    converge(Side::Ours, &case, nvidia)
                );
                (case, theirs, ours)
            }
        }))
        .await;
    let mut stale_replay = Vec::new();
    for (case, theirs, ours) in runs {
        if let Some(replay) = &theirs.replay {
            stale_replay = check_replay(replay);
        }
        let (theirs, ours) = (theirs.created, ours.created);
        let found = lines(&theirs, &ours);
        report.push_str(&format!(
            "{case}: {} objects from NVIDIA's operator, {} from ours, {} differences\n",
            theirs.len(),
            ours.len(),
            found.len()
        ));
        for (line, a, b) in found {
            let row = table.iter().position(|row| row.matches(&case, &line));
            if show {
                report.push_str(&format!(
                    "  {line}\n    NVIDIA's: {}\n    ours:     {}\n",
                    short(&a),
                    short(&b)
                ));
            }
            match row {
                Some(row) => used[row] = true,
                None => unlisted.push(format!(
                    "{case}: {line}\n    NVIDIA's: {}\n    ours:     {}",
                    short(&a),
                    short(&b)
                )),
            }
        }
    }
    eprintln!("{report}");
    assert!(
        stale_replay.is_empty(),
        "testdata/nvidia-converged/ is not what NVIDIA's operator creates for the sample policy \
         (`UPDATE_GOLDEN=1` rewrites it): {stale_replay:?}"
    );
    assert!(
        unlisted.is_empty(),
        "differences from NVIDIA's operator that docs/migrate.md does not list:\n{}",
        unlisted.join("\n")
    );
    if all_cases {
        let stale: Vec<&str> = table
            .iter()
            .zip(&used)
            .filter(|(_, used)| !**used)
            .map(|(row, _)| row.pattern.as_str())
            .collect();
        assert!(
            stale.is_empty(),
            "docs/migrate.md lists differences the oracle no longer finds: {stale:?}"
        );
    }
}

/// Without a control plane: the table parses, each row names known cases, and the patterns match as meant.
#[test]
fn the_listed_differences_name_cases_of_the_oracle() {
    let known = cases();
    let table = listed();
    assert!(!table.is_empty(), "docs/migrate.md's table has rows");
    for row in &table {
        for case in &row.cases {
            assert!(
                case == "all" || known.contains(case),
                "docs/migrate.md: `{}` names the case {case:?}, not a values file of tests/compat/",
                row.pattern
            );
        }
    }
    assert!(glob(
        "DaemonSet */x metadata.*",
        "DaemonSet gpu-operator/x metadata.labels.a"
    ));
    assert!(!glob(
        "DaemonSet */x metadata.*",
        "DaemonSet gpu-operator/y metadata.labels.a"
    ));
    assert!(glob("a*", "a") && glob("*", "") && !glob("a", "ab") && glob("a*c", "abc"));
}
