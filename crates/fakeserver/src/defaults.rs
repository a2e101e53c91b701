//! The defaults the API server fills into built-in objects on every write, and the status a new object
//! starts with.
//!
//! This matters to an operator more than it seems: a DaemonSet read back from a real cluster carries
//! `updateStrategy`, `revisionHistoryLimit`, `imagePullPolicy`, `terminationMessagePath` and friends that the
//! operator never sent, and code that compares desired with live state must cope. Only the kinds this
//! project writes are covered; the values are those of Kubernetes 1.33.

use serde_json::{Map, Value, json};

use crate::json;
use crate::registry::ResourceInfo;

fn set(map: &mut Map<String, Value>, key: &str, value: Value) {
    map.entry(key.to_owned()).or_insert(value);
}

fn object_at<'a>(value: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    value.get_mut(key).and_then(Value::as_object_mut)
}

/// What a kind's strategy sets once the writer's managed fields are recorded, so that no manager owns it:
/// a Namespace's `kubernetes` finalizer.
pub(crate) fn strategy(info: &ResourceInfo, object: &mut Value) {
    if info.is("", "Namespace")
        && let Some(namespace) = object.as_object_mut()
    {
        let spec = namespace.entry("spec").or_insert_with(|| json!({}));
        if let Some(spec) = spec.as_object_mut() {
            set(spec, "finalizers", json!(["kubernetes"]));
        }
    }
}

/// A device request asks for exactly one device unless it says otherwise (`allocationMode: ExactCount`,
/// `count: 1`), and so does each of its alternatives.
fn device_requests(requests: Option<&mut Value>) {
    let one_device = |request: &mut Map<String, Value>| {
        set(request, "allocationMode", json!("ExactCount"));
        if request.get("allocationMode").and_then(Value::as_str) == Some("ExactCount") {
            set(request, "count", json!(1));
        }
    };
    for request in json::objects_mut(requests) {
        if let Some(exactly) = request.get_mut("exactly").and_then(Value::as_object_mut) {
            one_device(exactly);
        }
        for alternative in json::objects_mut(request.get_mut("firstAvailable")) {
            one_device(alternative);
        }
    }
}

/// Fills in the defaults of a built-in object.
pub(crate) fn apply(info: &ResourceInfo, object: &mut Value) {
    if info.custom.is_some() {
        return;
    }
    match (info.group.as_str(), info.kind.as_str()) {
        ("", "Pod") => {
            if let Some(spec) = object_at(object, "spec") {
                pod_spec(spec);
            }
        }
        ("apps", "DaemonSet") => {
            if let Some(spec) = object_at(object, "spec") {
                rolling_update(spec, "updateStrategy", json!(1), json!(0));
                set(spec, "revisionHistoryLimit", json!(10));
                template(spec);
            }
        }
        ("apps", "Deployment") => {
            if let Some(spec) = object_at(object, "spec") {
                set(spec, "replicas", json!(1));
                rolling_update(spec, "strategy", json!("25%"), json!("25%"));
                set(spec, "revisionHistoryLimit", json!(10));
                set(spec, "progressDeadlineSeconds", json!(600));
                template(spec);
            }
        }
        ("batch", "Job") => {
            if let Some(spec) = object_at(object, "spec") {
                set(spec, "parallelism", json!(1));
                set(spec, "completions", json!(1));
                set(spec, "backoffLimit", json!(6));
                set(spec, "completionMode", json!("NonIndexed"));
                set(spec, "suspend", json!(false));
                set(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
                template(spec);
            }
        }
        ("apps", "ReplicaSet") => {
            if let Some(spec) = object_at(object, "spec") {
                set(spec, "replicas", json!(1));
                template(spec);
            }
        }
        ("", "Service") => {
            if let Some(spec) = object_at(object, "spec") {
                set(spec, "type", json!("ClusterIP"));
                set(spec, "sessionAffinity", json!("None"));
                if spec.get("type") != Some(&json!("ExternalName")) {
                    set(spec, "internalTrafficPolicy", json!("Cluster"));
                }
                for port in json::objects_mut(spec.get_mut("ports")) {
                    set(port, "protocol", json!("TCP"));
                    if let Some(number) = port.get("port").cloned() {
                        set(port, "targetPort", number);
                    }
                }
            }
        }
        ("", "Secret") => {
            if let Some(secret) = object.as_object_mut() {
                set(secret, "type", json!("Opaque"));
                if let Some(Value::Object(plain)) = secret.remove("stringData") {
                    let data = secret.entry("data").or_insert_with(|| json!({}));
                    if let Some(data) = data.as_object_mut() {
                        for (key, value) in plain {
                            let bytes = value.as_str().unwrap_or_default().as_bytes().to_vec();
                            let encoded =
                                serde_json::to_value(k8s_openapi::ByteString(bytes)).unwrap_or_default();
                            data.insert(key, encoded);
                        }
                    }
                }
            }
        }
        ("", "Namespace") => {
            let name = json::text(object, "/metadata/name").to_owned();
            if let Some(metadata) = object_at(object, "metadata") {
                let labels = metadata.entry("labels").or_insert_with(|| json!({}));
                if let Some(labels) = labels.as_object_mut() {
                    labels.insert("kubernetes.io/metadata.name".into(), json!(name));
                }
            }
        }
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            for subject in json::objects_mut(object.get_mut("subjects")) {
                if matches!(
                    subject.get("kind").and_then(Value::as_str),
                    Some("User" | "Group")
                ) {
                    set(subject, "apiGroup", json!("rbac.authorization.k8s.io"));
                }
            }
        }
        ("scheduling.k8s.io", "PriorityClass") => {
            if let Some(class) = object.as_object_mut() {
                set(class, "preemptionPolicy", json!("PreemptLowerPriority"));
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => crate::registry::default_crd(object),
        ("resource.k8s.io", "ResourceClaim") => device_requests(object.pointer_mut("/spec/devices/requests")),
        ("resource.k8s.io", "ResourceClaimTemplate") => {
            device_requests(object.pointer_mut("/spec/spec/devices/requests"));
        }
        _ => {}
    }
}

fn template(spec: &mut Map<String, Value>) {
    if let Some(pod) = spec
        .get_mut("template")
        .and_then(|t| t.get_mut("spec"))
        .and_then(Value::as_object_mut)
    {
        pod_spec(pod);
    }
}

/// A workload's update strategy under `key` (a DaemonSet's `updateStrategy`, a Deployment's `strategy`):
/// `RollingUpdate` unless another type is set, and then the rolling update's limits.
fn rolling_update(spec: &mut Map<String, Value>, key: &str, max_unavailable: Value, max_surge: Value) {
    let Some(strategy) = spec.entry(key).or_insert_with(|| json!({})).as_object_mut() else {
        return;
    };
    set(strategy, "type", json!("RollingUpdate"));
    if strategy.get("type") == Some(&json!("RollingUpdate")) {
        let rolling = strategy.entry("rollingUpdate").or_insert_with(|| json!({}));
        if let Some(rolling) = rolling.as_object_mut() {
            set(rolling, "maxUnavailable", max_unavailable);
            set(rolling, "maxSurge", max_surge);
        }
    }
}

fn pod_spec(spec: &mut Map<String, Value>) {
    set(spec, "restartPolicy", json!("Always"));
    set(spec, "terminationGracePeriodSeconds", json!(30));
    set(spec, "dnsPolicy", json!("ClusterFirst"));
    set(spec, "securityContext", json!({}));
    set(spec, "schedulerName", json!("default-scheduler"));
    set(spec, "enableServiceLinks", json!(true));
    if let Some(account) = spec.get("serviceAccountName").cloned() {
        set(spec, "serviceAccount", account);
    }
    for list in ["initContainers", "containers"] {
        for container in json::objects_mut(spec.get_mut(list)) {
            self::container(container);
        }
    }
    for volume in json::objects_mut(spec.get_mut("volumes")) {
        for source in ["configMap", "secret", "projected", "downwardAPI"] {
            if let Some(source) = volume.get_mut(source).and_then(Value::as_object_mut) {
                set(source, "defaultMode", json!(420));
            }
        }
        if let Some(host_path) = volume.get_mut("hostPath").and_then(Value::as_object_mut) {
            set(host_path, "type", json!(""));
        }
    }
}

fn container(container: &mut Map<String, Value>) {
    set(container, "terminationMessagePath", json!("/dev/termination-log"));
    set(container, "terminationMessagePolicy", json!("File"));
    set(container, "resources", json!({}));
    let image = container.get("image").and_then(Value::as_str).unwrap_or_default();
    set(container, "imagePullPolicy", json!(pull_policy(image)));
    for port in json::objects_mut(container.get_mut("ports")) {
        set(port, "protocol", json!("TCP"));
    }
    for variable in json::objects_mut(container.get_mut("env")) {
        if let Some(field) = variable
            .get_mut("valueFrom")
            .and_then(|from| from.get_mut("fieldRef"))
            .and_then(Value::as_object_mut)
        {
            set(field, "apiVersion", json!("v1"));
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(probe) = container.get_mut(probe).and_then(Value::as_object_mut) {
            set(probe, "timeoutSeconds", json!(1));
            set(probe, "periodSeconds", json!(10));
            set(probe, "successThreshold", json!(1));
            set(probe, "failureThreshold", json!(3));
            if let Some(get) = probe.get_mut("httpGet").and_then(Value::as_object_mut) {
                set(get, "scheme", json!("HTTP"));
            }
        }
    }
}

/// `Always` for `:latest` or untagged images, else `IfNotPresent`.
fn pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains('@') {
        return "IfNotPresent";
    }
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// The status a new object starts with, for kinds whose status the server resets on create.
pub(crate) fn initial_status(info: &ResourceInfo, object: &mut Value) {
    let status = match (info.group.as_str(), info.kind.as_str()) {
        _ if info.custom.is_some() => None,
        ("", "Pod") => Some(json!({"phase": "Pending", "qosClass": qos_class(object)})),
        ("apps", "DaemonSet") => Some(json!({
            "currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0, "numberReady": 0
        })),
        ("apps", "Deployment") => Some(json!({})),
        ("apps", "ReplicaSet") => Some(json!({"replicas": 0})),
        ("batch", "Job") => Some(json!({})),
        ("", "Service") => Some(json!({"loadBalancer": {}})),
        ("policy", "PodDisruptionBudget") => Some(
            json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}),
        ),
        ("", "Namespace") => Some(json!({"phase": "Active"})),
        ("resource.k8s.io", "ResourceClaim") => Some(json!({})),
        _ => return,
    };
    if let Some(map) = object.as_object_mut() {
        match status {
            Some(status) => map.insert("status".into(), status),
            None => map.remove("status"),
        };
    }
}

/// The pod's quality-of-service class from its containers' requests and limits.
fn qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .filter_map(|list| pod.pointer(&format!("/spec/{list}")).and_then(Value::as_array))
        .flatten()
        .collect();
    let mut any = false;
    let mut guaranteed = !containers.is_empty();
    for container in containers {
        let requests = container
            .pointer("/resources/requests")
            .and_then(Value::as_object);
        let limits = container.pointer("/resources/limits").and_then(Value::as_object);
        any |= requests.is_some_and(|r| !r.is_empty()) || limits.is_some_and(|l| !l.is_empty());
        for resource in ["cpu", "memory"] {
            let limit = limits.and_then(|l| l.get(resource));
            let request = requests.and_then(|r| r.get(resource)).or(limit);
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    fn defaulted(plural: &str, group: &str, mut object: Value) -> Value {
        let registry = Registry::builtin();
        let info = registry.find(group, "v1", plural).expect("known");
        apply(&info, &mut object);
        object
    }

    #[test]
    fn a_daemonset_reads_back_with_the_servers_defaults() {
        let ds = defaulted(
            "daemonsets",
            "apps",
            json!({"spec": {"template": {"spec": {"containers": [
                {"name": "c", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0", "ports": [{"containerPort": 1}]},
                {"name": "d", "image": "busybox"}
            ], "volumes": [{"name": "v", "hostPath": {"path": "/run"}}]}}}}),
        );
        assert_eq!(
            ds["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
        );
        assert_eq!(ds["spec"]["revisionHistoryLimit"], 10);
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Always");
        assert_eq!(pod["containers"][0]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(pod["containers"][1]["imagePullPolicy"], "Always");
        assert_eq!(pod["containers"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(
            pod["containers"][0]["terminationMessagePath"],
            "/dev/termination-log"
        );
        assert_eq!(pod["volumes"][0]["hostPath"]["type"], "");
    }

    #[test]
    fn defaults_never_overwrite_what_was_sent() {
        let ds = defaulted(
            "daemonsets",
            "apps",
            json!({"spec": {"updateStrategy": {"type": "OnDelete"}, "revisionHistoryLimit": 3}}),
        );
        assert_eq!(ds["spec"]["updateStrategy"], json!({"type": "OnDelete"}));
        assert_eq!(ds["spec"]["revisionHistoryLimit"], 3);
    }

    #[test]
    fn secrets_fold_string_data_into_data() {
        let secret = defaulted("secrets", "", json!({"stringData": {"a": "hi"}}));
        assert_eq!(secret, json!({"type": "Opaque", "data": {"a": "aGk="}}));
    }

    #[test]
    fn new_pods_start_pending_with_a_qos_class() {
        let registry = Registry::builtin();
        let pods = registry.find("", "v1", "pods").expect("pods");
        let mut pod = json!({"spec": {"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]},
                             "status": {"phase": "Running"}});
        initial_status(&pods, &mut pod);
        assert_eq!(
            pod["status"],
            json!({"phase": "Pending", "qosClass": "Guaranteed"})
        );
        let mut best = json!({"spec": {"containers": [{}]}});
        initial_status(&pods, &mut best);
        assert_eq!(best["status"]["qosClass"], "BestEffort");
    }
}
