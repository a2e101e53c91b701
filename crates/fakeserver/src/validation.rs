//! What the API server refuses with 422 before storing an object: metadata rules every object obeys (names,
//! labels, annotations, finalizers, owner references) and, for the built-in kinds this project writes, the
//! rules an operator is most likely to break in a real cluster (selectors that must match templates,
//! immutable fields, containers that must have names and images).
//!
//! Custom resources are checked against their CRD schema by `gpuop_api::schema`, called from the store.

use serde_json::Value;

use crate::causes::{
    dns_label_problem, dns_label_problems, dns_subdomain_problems, dns1035_label_problems, duplicate,
    forbidden, immutable, invalid, label_value_problems, path_segment_problem, qualified_name_problem,
    qualified_name_problems, required, unsupported,
};
use crate::error::Cause;
use crate::json;
use crate::registry::ResourceInfo;
use crate::selector::LabelSelector;

/// `Required value[: detail]` at `field`.
/// The rules of a Role or ClusterRole, as `ValidatePolicyRule` checks them.
fn policy_rules(object: &Value, namespaced: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let list = |rule: &Value, key: &str| {
        rule.get(key)
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    };
    for (i, rule) in json::items(object, "/rules").enumerate() {
        let field = |key: &str| format!("rules[{i}].{key}");
        if !list(rule, "verbs") {
            causes.push(required(&field("verbs"), "verbs must contain at least one value"));
        }
        if list(rule, "nonResourceURLs") {
            let urls = rule.get("nonResourceURLs").unwrap_or(&Value::Null);
            if namespaced {
                causes.push(invalid(
                    &field("nonResourceURLs"),
                    urls,
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if list(rule, "apiGroups") || list(rule, "resources") || list(rule, "resourceNames") {
                causes.push(invalid(
                    &field("nonResourceURLs"),
                    urls,
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if !list(rule, "apiGroups") {
            causes.push(required(
                &field("apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if !list(rule, "resources") {
            causes.push(required(
                &field("resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
    if let Some(rule) = object.get("aggregationRule").filter(|r| !r.is_null())
        && rule
            .get("clusterRoleSelectors")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
    {
        causes.push(required(
            "aggregationRule.clusterRoleSelectors",
            "at least one clusterRoleSelector required if aggregationRule is non-nil",
        ));
    }
    causes
}

/// A binding's role reference and subjects, as `ValidateRoleBinding` and `ValidateRoleBindingSubject`
/// check them.
fn binding_refs(object: &Value, namespaced: bool) -> Vec<Cause> {
    const GROUP: &str = "rbac.authorization.k8s.io";
    let mut causes = Vec::new();
    let group = json::text(object, "/roleRef/apiGroup");
    if group != GROUP {
        causes.push(unsupported("roleRef.apiGroup", &Value::from(group), &[GROUP]));
    }
    let kind = json::text(object, "/roleRef/kind");
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    if !kind.is_empty() && !kinds.contains(&kind) {
        causes.push(unsupported("roleRef.kind", &Value::from(kind), kinds));
    }
    for (i, subject) in json::items(object, "/subjects").enumerate() {
        let field = |key: &str| format!("subjects[{i}].{key}");
        if json::text(subject, "/name").is_empty() {
            causes.push(required(&field("name"), ""));
        }
        let api_group = json::text(subject, "/apiGroup");
        match json::text(subject, "/kind") {
            "ServiceAccount" => {
                if !api_group.is_empty() {
                    causes.push(unsupported(&field("apiGroup"), &Value::from(api_group), &[""]));
                }
                if !namespaced && json::text(subject, "/namespace").is_empty() {
                    causes.push(required(&field("namespace"), ""));
                }
            }
            "User" | "Group" => {
                if api_group != GROUP {
                    causes.push(unsupported(&field("apiGroup"), &Value::from(api_group), &[GROUP]));
                }
            }
            other => causes.push(unsupported(
                &field("kind"),
                &Value::from(other),
                &["ServiceAccount", "User", "Group"],
            )),
        }
    }
    causes
}

/// How a resource's object names are checked: every reason a name is refused, in kube-apiserver's words.
fn name_problems(info: &ResourceInfo, name: &str) -> Vec<String> {
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "namespaces") => dns_label_problems(name),
        ("", "services") => dns1035_label_problems(name),
        // core/v1 events and RBAC objects only need names that fit in a URL path.
        ("", "events") | ("rbac.authorization.k8s.io", _) => path_segment_problem(name).into_iter().collect(),
        _ => dns_subdomain_problems(name),
    }
}

/// Checks the metadata every object has. `generate_name` tells whether a name was generated.
pub(crate) fn metadata(info: &ResourceInfo, object: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let no_meta = Value::Null;
    let meta = object.get("metadata").unwrap_or(&no_meta);
    let name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        causes.push(required("metadata.name", "name or generateName is required"));
    } else {
        for problem in name_problems(info, name) {
            causes.push(invalid("metadata.name", &Value::from(name), problem));
        }
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (key, value) in labels {
            for problem in qualified_name_problems(key) {
                causes.push(invalid("metadata.labels", &Value::from(key.as_str()), problem));
            }
            match value.as_str() {
                Some(text) => {
                    for problem in label_value_problems(text) {
                        causes.push(invalid("metadata.labels", value, problem));
                    }
                }
                None => causes.push(invalid("metadata.labels", value, "label values must be strings")),
            }
        }
    }
    if let Some(annotations) = meta.get("annotations").and_then(Value::as_object) {
        let mut total = 0;
        for (key, value) in annotations {
            // Annotation keys are qualified names in any case.
            for problem in qualified_name_problems(&key.to_lowercase()) {
                causes.push(invalid(
                    "metadata.annotations",
                    &Value::from(key.as_str()),
                    problem,
                ));
            }
            total += key.len() + value.as_str().map_or(0, str::len);
        }
        if total > 256 * 1024 {
            causes.push(Cause {
                reason: "FieldValueTooLong".into(),
                message: format!("Too long: may not be more than {} bytes", 256 * 1024),
                field: "metadata.annotations".into(),
            });
        }
    }
    for (index, finalizer) in json::items(meta, "/finalizers").enumerate() {
        let text = finalizer.as_str().unwrap_or_default();
        if let Some(problem) = qualified_name_problem(text) {
            causes.push(invalid(
                &format!("metadata.finalizers[{index}]"),
                finalizer,
                problem,
            ));
        }
    }
    let mut controllers = 0;
    for (index, owner) in json::items(meta, "/ownerReferences").enumerate() {
        let at = format!("metadata.ownerReferences[{index}]");
        for key in ["apiVersion", "kind", "name", "uid"] {
            if owner.get(key).and_then(Value::as_str).is_none_or(str::is_empty) {
                let detail = if key == "uid" { "uid must not be empty" } else { "" };
                let field = format!("{at}.{key}");
                causes.push(if detail.is_empty() {
                    required(&field, "")
                } else {
                    invalid(&field, &Value::from(""), detail)
                });
            }
        }
        if owner.get("controller").and_then(Value::as_bool) == Some(true) {
            controllers += 1;
        }
    }
    if controllers > 1 {
        causes.push(invalid(
            "metadata.ownerReferences",
            meta.get("ownerReferences").unwrap_or(&Value::Null),
            "Only one reference can have Controller set to true",
        ));
    }
    causes
}

/// A ResourceSlice names its driver and pool, and where its devices are: exactly one of a node, a node
/// selector, all nodes, or per device.
fn resource_slice(object: &Value, causes: &mut Vec<Cause>) {
    let spec = object.get("spec").unwrap_or(&Value::Null);
    let placements = ["nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection"]
        .iter()
        .filter(|field| match spec.get(**field) {
            None | Some(Value::Null) => false,
            Some(Value::String(text)) => !text.is_empty(),
            Some(Value::Bool(set)) => *set,
            Some(_) => true,
        })
        .count();
    if placements != 1 {
        let detail =
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required";
        if placements == 0 {
            causes.push(required("spec", detail));
        } else {
            causes.push(invalid("spec", spec, detail));
        }
    }
    for (pointer, field) in [("/driver", "spec.driver"), ("/pool/name", "spec.pool.name")] {
        if spec
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty()
        {
            causes.push(required(field, ""));
        }
    }
}

/// Each device request asks for a class: directly (`exactly.deviceClassName`), or in each of its
/// alternatives (`firstAvailable[j].deviceClassName`).
fn device_requests(requests: Option<&Value>, field: &str, causes: &mut Vec<Cause>) {
    let named = |request: &Value| {
        !request
            .get("deviceClassName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty()
    };
    for (index, request) in requests
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(exactly) = request.get("exactly")
            && !named(exactly)
        {
            causes.push(required(&format!("{field}[{index}].exactly.deviceClassName"), ""));
        }
        let alternatives = request.get("firstAvailable").and_then(Value::as_array);
        for (choice, alternative) in alternatives.into_iter().flatten().enumerate() {
            if !named(alternative) {
                causes.push(required(
                    &format!("{field}[{index}].firstAvailable[{choice}].deviceClassName"),
                    "",
                ));
            }
        }
    }
}

/// Checks a built-in kind's own rules; `old` is the stored object on update.
pub(crate) fn builtin(info: &ResourceInfo, object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    match (info.group.as_str(), info.kind.as_str()) {
        ("", "Pod") => {
            pod_spec(object.get("spec"), "spec", &mut causes);
            if let Some(old) = old {
                pod_immutables(object, old, &mut causes);
            }
        }
        ("apps", "DaemonSet" | "Deployment") => workload(object, old, &mut causes),
        ("batch", "Job") => {
            let template = object.pointer("/spec/template/spec");
            pod_spec(template, "spec.template.spec", &mut causes);
            let restart = template
                .and_then(|spec| spec.get("restartPolicy"))
                .cloned()
                .unwrap_or(Value::Null);
            if !matches!(restart.as_str(), Some("OnFailure" | "Never")) {
                causes.push(unsupported(
                    "spec.template.spec.restartPolicy",
                    &restart,
                    &["OnFailure", "Never"],
                ));
            }
        }
        ("", "ConfigMap" | "Secret") => {
            for section in ["data", "binaryData", "stringData"] {
                for key in object
                    .get(section)
                    .and_then(Value::as_object)
                    .into_iter()
                    .flat_map(|m| m.keys())
                {
                    let ok = !key.is_empty()
                        && key
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
                    if !ok {
                        causes.push(invalid(
                            &format!("{section}[{key}]"),
                            &Value::from(key.as_str()),
                            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. \
                             'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
                        ));
                    }
                }
            }
        }
        ("rbac.authorization.k8s.io", kind @ ("Role" | "ClusterRole")) => {
            causes.extend(policy_rules(object, kind == "Role"));
        }
        ("rbac.authorization.k8s.io", kind @ ("RoleBinding" | "ClusterRoleBinding")) => {
            let role_ref = object.get("roleRef");
            for key in ["kind", "name"] {
                if role_ref
                    .and_then(|r| r.get(key))
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    causes.push(required(&format!("roleRef.{key}"), ""));
                }
            }
            causes.extend(binding_refs(object, kind == "RoleBinding"));
            if let Some(old) = old
                && old.get("roleRef") != role_ref
            {
                causes.push(invalid(
                    "roleRef",
                    role_ref.unwrap_or(&Value::Null),
                    "cannot change roleRef",
                ));
            }
        }
        ("node.k8s.io", "RuntimeClass") => {
            let handler = object.get("handler").and_then(Value::as_str).unwrap_or_default();
            if handler.is_empty() {
                causes.push(required("handler", ""));
            } else if let Some(problem) = dns_label_problem(handler) {
                causes.push(invalid("handler", &Value::from(handler), problem));
            }
            if let Some(old) = old
                && old.get("handler") != object.get("handler")
            {
                causes.push(immutable(
                    "handler",
                    object.get("handler").unwrap_or(&Value::Null),
                ));
            }
        }
        ("scheduling.k8s.io", "PriorityClass") => {
            if !object.get("value").is_some_and(Value::is_i64) {
                causes.push(required("value", ""));
            }
            if let Some(old) = old
                && old.get("value") != object.get("value")
            {
                causes.push(forbidden("value", "may not be changed in an update."));
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            crate::registry::validate_crd(object, old, &mut causes)
        }
        ("resource.k8s.io", "ResourceSlice") => resource_slice(object, &mut causes),
        ("resource.k8s.io", "ResourceClaim") => {
            device_requests(
                object.pointer("/spec/devices/requests"),
                "spec.devices.requests",
                &mut causes,
            );
            if let Some(old) = old
                && old.get("spec") != object.get("spec")
            {
                causes.push(invalid(
                    "spec",
                    object.get("spec").unwrap_or(&Value::Null),
                    "field is immutable",
                ));
            }
        }
        ("resource.k8s.io", "ResourceClaimTemplate") => device_requests(
            object.pointer("/spec/spec/devices/requests"),
            "spec.spec.devices.requests",
            &mut causes,
        ),
        ("", "Event") => event(&EventFields::read(object, &EventLayout::CORE), &mut causes),
        ("events.k8s.io", "Event") => {
            let fields = EventFields::read(object, &EventLayout::EVENTS_V1);
            event(&fields, &mut causes);
            if old.is_none() {
                event_v1_create(object, &fields, &mut causes);
            }
        }
        _ => {}
    }
    causes
}

/// An event's fields under the names of kube-apiserver's internal `core.Event`, which both event APIs are
/// validated as: errors name `message` (events.k8s.io's `note`), `reportingController`, `involvedObject`.
struct EventFields<'a> {
    namespace: &'a str,
    involved_namespace: &'a str,
    event_time: bool,
    reporting_controller: &'a str,
    reporting_instance: &'a str,
    action: &'a str,
    reason: &'a str,
    message: &'a str,
}

/// Where an event API keeps the fields that the two APIs name differently.
struct EventLayout {
    involved_namespace: &'static str,
    reporting_controller: &'static str,
    message: &'static str,
}

impl EventLayout {
    /// core/v1 `Event`.
    const CORE: EventLayout = EventLayout {
        involved_namespace: "/involvedObject/namespace",
        reporting_controller: "/reportingComponent",
        message: "/message",
    };

    /// events.k8s.io/v1 `Event`.
    const EVENTS_V1: EventLayout = EventLayout {
        involved_namespace: "/regarding/namespace",
        reporting_controller: "/reportingController",
        message: "/note",
    };
}

impl<'a> EventFields<'a> {
    fn read(object: &'a Value, layout: &EventLayout) -> Self {
        let text = |pointer: &str| json::text(object, pointer);
        Self {
            namespace: text("/metadata/namespace"),
            involved_namespace: text(layout.involved_namespace),
            event_time: object.get("eventTime").is_some_and(|t| !t.is_null()),
            reporting_controller: text(layout.reporting_controller),
            reporting_instance: text("/reportingInstance"),
            action: text("/action"),
            reason: text("/reason"),
            message: text(layout.message),
        }
    }
}

/// What every event must be (`legacyValidateEvent`): the limits apply to events with an `eventTime` (every
/// events.k8s.io event, and core/v1 events written the new way); an old-style core/v1 event has none.
fn event(event: &EventFields<'_>, causes: &mut Vec<Cause>) {
    let mismatch = || {
        invalid(
            "involvedObject.namespace",
            &Value::from(event.involved_namespace),
            "does not match event.namespace",
        )
    };
    if !event.event_time {
        let matches = if event.involved_namespace.is_empty() {
            matches!(event.namespace, "" | "default")
        } else {
            event.namespace == event.involved_namespace
        };
        if !matches {
            causes.push(mismatch());
        }
    } else {
        if event.involved_namespace.is_empty() && !matches!(event.namespace, "default" | "kube-system") {
            causes.push(mismatch());
        }
        if event.reporting_controller.is_empty() {
            causes.push(required("reportingController", ""));
        }
        for problem in qualified_name_problems(event.reporting_controller) {
            causes.push(invalid(
                "reportingController",
                &Value::from(event.reporting_controller),
                problem,
            ));
        }
        for (field, value, limit) in [
            ("reportingInstance", event.reporting_instance, 128),
            ("action", event.action, 128),
            ("reason", event.reason, 128),
        ] {
            if value.is_empty() {
                causes.push(required(field, ""));
            }
            if value.len() > limit {
                causes.push(invalid(
                    field,
                    &Value::from(""),
                    format!("can have at most {limit} characters"),
                ));
            }
        }
        if event.message.len() > 1024 {
            causes.push(invalid(
                "message",
                &Value::from(""),
                "can have at most 1024 characters",
            ));
        }
    }
    for problem in dns_subdomain_problems(event.namespace) {
        causes.push(invalid("namespace", &Value::from(event.namespace), problem));
    }
}

/// What an event created through events.k8s.io/v1 must be besides (`ValidateEventCreate`).
fn event_v1_create(object: &Value, event: &EventFields<'_>, causes: &mut Vec<Cause>) {
    if let Some(series) = object.get("series").filter(|s| !s.is_null()) {
        if series.get("count").and_then(Value::as_i64).unwrap_or(0) < 2 {
            causes.push(invalid("series.count", &Value::from(""), "should be at least 2"));
        }
        if series.get("lastObservedTime").is_none_or(Value::is_null) {
            causes.push(required("series.lastObservedTime", ""));
        }
    }
    if !event.event_time {
        causes.push(required("eventTime", ""));
    }
    let kind = object.get("type").and_then(Value::as_str).unwrap_or_default();
    if !matches!(kind, "Normal" | "Warning") {
        causes.push(invalid(
            "type",
            &Value::from(""),
            format!("has invalid value: {kind}"),
        ));
    }
    let set = |key: &str| object.get(key).is_some_and(|v| !v.is_null());
    for (key, field) in [
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
    ] {
        if set(key) {
            causes.push(invalid(field, &Value::from(""), "needs to be unset"));
        }
    }
    if object.get("deprecatedCount").and_then(Value::as_i64).unwrap_or(0) != 0 {
        causes.push(invalid("count", &Value::from(""), "needs to be unset"));
    }
    if !json::text(object, "/deprecatedSource/component").is_empty()
        || !json::text(object, "/deprecatedSource/host").is_empty()
    {
        causes.push(invalid("source", &Value::from(""), "needs to be unset"));
    }
}

fn workload(object: &Value, old: Option<&Value>, causes: &mut Vec<Cause>) {
    let spec = object.get("spec");
    let selector = spec.and_then(|s| s.get("selector"));
    match selector {
        None | Some(Value::Null) => causes.push(required("spec.selector", "")),
        Some(selector) => match LabelSelector::from_object(Some(selector)) {
            Ok(parsed) if parsed.is_empty() => {
                causes.push(invalid(
                    "spec.selector",
                    selector,
                    "empty selector is invalid for deployment",
                ));
            }
            Ok(parsed) => {
                let labels = spec
                    .and_then(|s| s.pointer("/template/metadata/labels"))
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                if !parsed.matches(&labels) {
                    causes.push(invalid(
                        "spec.template.metadata.labels",
                        &Value::Object(labels),
                        "`selector` does not match template `labels`",
                    ));
                }
            }
            Err(error) => causes.push(invalid("spec.selector", selector, error.to_string())),
        },
    }
    let template = spec.and_then(|s| s.get("template")).and_then(|t| t.get("spec"));
    pod_spec(template, "spec.template.spec", causes);
    if let Some(policy) = template
        .and_then(|t| t.get("restartPolicy"))
        .and_then(Value::as_str)
        && policy != "Always"
    {
        causes.push(unsupported(
            "spec.template.spec.restartPolicy",
            &Value::from(policy),
            &["Always"],
        ));
    }
    if let Some(old) = old {
        let old_selector = old.pointer("/spec/selector");
        if old_selector != selector {
            causes.push(immutable("spec.selector", selector.unwrap_or(&Value::Null)));
        }
    }
}

fn pod_spec(spec: Option<&Value>, at: &str, causes: &mut Vec<Cause>) {
    let null = Value::Null;
    let spec = spec.unwrap_or(&null);
    let containers = spec.get("containers").and_then(Value::as_array);
    if containers.is_none_or(Vec::is_empty) {
        causes.push(required(&format!("{at}.containers"), ""));
    }
    let mut names: Vec<&str> = Vec::new();
    for (field, container) in all_containers(spec, at) {
        match container.get("name").and_then(Value::as_str) {
            None | Some("") => causes.push(required(&format!("{field}.name"), "")),
            Some(name) => {
                if let Some(problem) = dns_label_problem(name) {
                    causes.push(invalid(&format!("{field}.name"), &Value::from(name), problem));
                }
                if names.contains(&name) {
                    causes.push(duplicate(&format!("{field}.name"), &Value::from(name)));
                }
                names.push(name);
            }
        }
        if container
            .get("image")
            .and_then(Value::as_str)
            .is_none_or(|i| i.trim().is_empty())
        {
            causes.push(required(&format!("{field}.image"), ""));
        }
    }
    let volumes: Vec<&str> = json::items(spec, "/volumes")
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .collect();
    for (field, container) in all_containers(spec, at) {
        for (m, mount) in json::items(container, "/volumeMounts").enumerate() {
            let name = json::text(mount, "/name");
            if !volumes.contains(&name) {
                causes.push(Cause {
                    reason: "FieldValueNotFound".into(),
                    message: format!("Not found: {name:?}"),
                    field: format!("{field}.volumeMounts[{m}].name"),
                });
            }
        }
    }
}

/// The init containers and then the containers of a pod spec, each with its field path
/// (`{at}.initContainers[0]`).
fn all_containers<'v>(spec: &'v Value, at: &'v str) -> impl Iterator<Item = (String, &'v Value)> {
    ["initContainers", "containers"]
        .into_iter()
        .flat_map(move |list| {
            json::items(spec, &format!("/{list}"))
                .enumerate()
                .map(move |(index, container)| (format!("{at}.{list}[{index}]"), container))
        })
}

fn pod_immutables(object: &Value, old: &Value, causes: &mut Vec<Cause>) {
    let (Some(new_spec), Some(old_spec)) = (object.get("spec"), old.get("spec")) else {
        return;
    };
    // Most pod writes (status, labels) leave the spec as it was: nothing to strip and compare.
    if new_spec == old_spec {
        return;
    }
    // Only images, activeDeadlineSeconds, tolerations (additions) and scheduling gates may change.
    let strip = |spec: &Value| {
        let mut spec = spec.clone();
        if let Some(map) = spec.as_object_mut() {
            map.remove("activeDeadlineSeconds");
            map.remove("tolerations");
            map.remove("schedulingGates");
            for list in ["containers", "initContainers"] {
                for container in json::objects_mut(map.get_mut(list)) {
                    container.remove("image");
                }
            }
        }
        spec
    };
    if strip(new_spec) != strip(old_spec) {
        causes.push(forbidden(
            "spec",
            "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,\
             `spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),\
             `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::causes::*;
    use crate::registry::Registry;
    use serde_json::json;

    fn messages(causes: &[Cause]) -> Vec<String> {
        causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn names_and_labels_follow_the_api_rules() {
        assert_eq!(qualified_name_problem("nvidia.com/gpu.present"), None);
        assert!(qualified_name_problem("Nvidia.com/gpu").is_some());
        assert!(qualified_name_problem("a/b/c").is_some());
        assert!(label_value_problems("").is_empty());
        assert!(!label_value_problems(&"a".repeat(64)).is_empty());
        assert!(dns_label_problem("a.b").is_some());
        assert_eq!(dns_subdomain_problem("a.b-c"), None);
    }

    #[test]
    fn metadata_problems_name_their_field() {
        let registry = Registry::builtin();
        let pods = registry.find("", "v1", "pods").expect("pods");
        let object = json!({"metadata": {"name": "Bad_Name", "labels": {"ok": "x", "bad": "-x"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n"}]}});
        let found = messages(&metadata(&pods, &object));
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(
            found[0]
                .starts_with(r#"metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain"#)
        );
        assert!(found[1].starts_with(r#"metadata.labels: Invalid value: "-x": a valid label"#));
        assert_eq!(
            found[2],
            r#"metadata.ownerReferences[0].uid: Invalid value: "": uid must not be empty"#
        );
    }

    #[test]
    fn a_daemonset_selector_must_match_its_template_and_never_change() {
        let registry = Registry::builtin();
        let daemonsets = registry.find("apps", "v1", "daemonsets").expect("daemonsets");
        let ds = |selector: &str, label: &str| {
            json!({"spec": {"selector": {"matchLabels": {"app": selector}},
                "template": {"metadata": {"labels": {"app": label}},
                             "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
        };
        assert!(builtin(&daemonsets, &ds("a", "a"), None).is_empty());
        assert_eq!(
            messages(&builtin(&daemonsets, &ds("a", "b"), None)),
            [
                r#"spec.template.metadata.labels: Invalid value: {"app":"b"}: `selector` does not match template `labels`"#
            ]
        );
        assert_eq!(
            messages(&builtin(&daemonsets, &ds("b", "b"), Some(&ds("a", "a")))),
            [r#"spec.selector: Invalid value: {"matchLabels":{"app":"b"}}: field is immutable"#]
        );
    }

    #[test]
    fn containers_need_names_and_images() {
        let registry = Registry::builtin();
        let pods = registry.find("", "v1", "pods").expect("pods");
        let pod = json!({"spec": {"containers": [{"name": "a", "image": "i"}, {"name": "a"}]}});
        assert_eq!(
            messages(&builtin(&pods, &pod, None)),
            [
                r#"spec.containers[1].name: Duplicate value: "a""#,
                "spec.containers[1].image: Required value"
            ]
        );
        assert_eq!(
            messages(&builtin(&pods, &json!({"spec": {}}), None)),
            ["spec.containers: Required value"]
        );
    }
}
