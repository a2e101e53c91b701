//! What a write does to an object: the pipeline every create, update, patch, apply and delete goes
//! through (server-owned metadata, subresource rules, decoding, defaults, validation, generation, managed
//! fields), the preconditions it checks, and when a delete stores a deletion timestamp instead of removing.
//!
//! These are methods of the store's [`State`]; [`crate::store`] holds the objects and publishes changes.

use std::sync::Arc;

use gpuop_api::field::FieldErrorKind;
use gpuop_api::schema;
use serde_json::{Map, Value, json};

use crate::causes;
use crate::clock::format_time;
use crate::defaults;
use crate::error::{ApiError, Cause, GroupKind, GroupResource};
use crate::json::text;
use crate::object::Stored;
use crate::patch::{self, PatchType};
use crate::pods;
use crate::registry::ResourceInfo;
use crate::ssa::{self, Applier, Scope, Updater};
use crate::store::{
    DeleteOptions, Deleted, FieldValidation, PodTermination, Propagation, Source, State, Work, WriteOptions,
    Written, finalizers, metadata_mut, not_found, shape_of,
};
use crate::typed;
use crate::validation;

const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// The 400 a POST or PUT gets for unknown fields under `fieldValidation=Strict`.
fn strict_body_error(info: &ResourceInfo, fields: &[String]) -> ApiError {
    ApiError::BadRequest(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        fields.join(", "),
        kind = info.kind,
        version = info.version,
    ))
}

/// The 422 a patch gets for unknown fields under `fieldValidation=Strict`: an invalid `patch` whose value
/// is the patched object (JSON and merge patches) or the patch as Go prints a map (strategic merge).
fn strict_patch_error(kind: PatchType, patch: &Value, patched: &Value, fields: &[String]) -> ApiError {
    let shown = match kind {
        PatchType::Strategic => go_print(patch),
        PatchType::Json | PatchType::Merge | PatchType::Apply => patched.to_string(),
    };
    ApiError::invalid_causes(
        GroupKind {
            group: String::new(),
            kind: String::new(),
        },
        "",
        vec![causes::invalid(
            "patch",
            &Value::from(shown),
            format!("strict decoding error: {}", fields.join(", ")),
        )],
    )
}

/// A JSON value as Go's `%+v` prints the `map[string]interface{}` it decodes to: `map[a:1 b:[x y]]`.
fn go_print(value: &Value) -> String {
    match value {
        Value::Null => "<nil>".to_owned(),
        Value::String(text) => text.clone(),
        Value::Bool(_) | Value::Number(_) => value.to_string(),
        Value::Array(items) => format!("[{}]", items.iter().map(go_print).collect::<Vec<_>>().join(" ")),
        Value::Object(map) => {
            // Go prints map keys sorted, as serde_json's map iterates them.
            let entries: Vec<String> = map.iter().map(|(k, v)| format!("{k}:{}", go_print(v))).collect();
            format!("map[{}]", entries.join(" "))
        }
    }
}
const PROTECTED_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

/// Whether anything outside metadata (and status, when it is a subresource) differs.
fn spec_changed(old: &Value, new: &Value, status_subresource: bool) -> bool {
    let ignored = |key: &str| {
        matches!(key, "metadata" | "apiVersion" | "kind") || (status_subresource && key == "status")
    };
    // Compared key by key, borrowing (and, as maps compare, whatever the keys' order): cloning both
    // objects (a pod's spec, a node's labels) cost more than the comparison.
    let empty = Map::new();
    let old = old.as_object().unwrap_or(&empty);
    let new = new.as_object().unwrap_or(&empty);
    let count = |map: &Map<String, Value>| map.keys().filter(|key| !ignored(key)).count();
    count(old) != count(new)
        || old
            .iter()
            .filter(|(key, _)| !ignored(key))
            .any(|(key, value)| new.get(key) != Some(value))
}

/// Whether `new` (a status write's object) is exactly, key order included, what a status write keeps of
/// it: the stored object `old` with `new`'s status in its place. Both must have a status; then rebuilding
/// that object from a copy of `old` would give `new` back.
fn already_status_only(old: &Value, new: &Value) -> bool {
    let (Some(old), Some(new)) = (old.as_object(), new.as_object()) else {
        return false;
    };
    old.contains_key("status")
        && old.len() == new.len()
        && old
            .iter()
            .zip(new)
            .all(|((old_key, old_value), (new_key, new_value))| {
                old_key == new_key && (old_key == "status" || identical(old_value, new_value))
            })
}

/// Equality that also compares the order of object keys (`==` on maps does not), so that two values
/// serialise to the same bytes.
fn identical(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|((a_key, a_value), (b_key, b_value))| a_key == b_key && identical(a_value, b_value))
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| identical(a, b))
        }
        _ => a == b,
    }
}

/// Whether an object may go now: no finalizers left (and, for namespaces, no `spec.finalizers`).
fn releasable(value: &Value) -> bool {
    finalizers(value).is_empty()
        && value
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty())
}

/// A delete's uid precondition that does not hold, as kube-apiserver's delete words it (an update's is the
/// storage layer's `Precondition failed: UID in precondition: ...`): the object named by its kind.
fn uid_precondition_failed(info: &ResourceInfo, name: &str, sent: &str, stored: &str) -> ApiError {
    ApiError::Conflict {
        resource: GroupResource::new(&info.group, &info.kind),
        name: name.to_owned(),
        detail: format!(
            "the UID in the precondition ({sent}) does not match the UID in record ({stored}). The object might \
             have been deleted and then recreated"
        ),
    }
}

fn apply_conflict(info: &ResourceInfo, name: &str, conflicts: &[ssa::Conflict]) -> ApiError {
    // Conflicts grouped by manager, in the order met: (how kube-apiserver names the manager, fields).
    let mut by_manager: Vec<(String, Vec<String>)> = Vec::new();
    for conflict in conflicts {
        let field = crate::fieldset::display(&conflict.path);
        let who = conflict.who();
        match by_manager.iter_mut().find(|(w, _)| *w == who) {
            Some((_, fields)) => fields.push(field),
            None => by_manager.push((who, vec![field])),
        }
    }
    let count = conflicts.len();
    let message = if count == 1 {
        let (who, fields) = &by_manager[0];
        format!("Apply failed with 1 conflict: conflict with {who}: {}", fields[0])
    } else {
        let groups: Vec<String> = by_manager
            .iter()
            .map(|(who, fields)| {
                let lines: Vec<String> = fields.iter().map(|f| format!("- {f}")).collect();
                format!("conflicts with {who}:\n{}", lines.join("\n"))
            })
            .collect();
        format!("Apply failed with {count} conflicts: {}", groups.join("\n"))
    };
    let causes = conflicts
        .iter()
        .map(|c| Cause {
            reason: "FieldManagerConflict".into(),
            message: format!("conflict with {}", c.who()),
            field: crate::fieldset::display(&c.path),
        })
        .collect();
    ApiError::ApplyConflict {
        resource: info.group_resource(),
        name: name.to_owned(),
        message,
        causes,
    }
}

/// Server-side apply types its configuration against the schema before merging, and refuses what the type
/// does not declare with an unclassified 500, whatever `fieldValidation` says (kube-apiserver's
/// `failed to create typed patch object`). `live` is the stored object (or the skeleton of a new one).
fn refuse_undeclared(
    info: &ResourceInfo,
    config: &Value,
    live: &Value,
    applier: &Applier<'_>,
) -> Result<(), ApiError> {
    let shape = shape_of(info);
    let mut paths = Vec::new();
    // Metadata is an ObjectMeta for every kind, and most of it is not merged by apply: type it alone.
    if let Some(metadata) = config.get("metadata") {
        let decoded = json!({"metadata": typed::object_meta(info, metadata)?});
        paths.extend(typed::undeclared(&json!({"metadata": metadata}), &decoded, shape));
    }
    // The rest is typed as merged into the live object with every field applied, status included: a
    // scope ignores fields, it does not make them unknown.
    let everything = Applier {
        scope: Scope::Main {
            status_subresource: false,
        },
        force: true,
        ..*applier
    };
    if let Ok(merged) = ssa::apply(live, config, &everything) {
        let mut decoded = typed::normalize(info, &merged)?.object;
        if let Some(schema) = info.custom.as_ref().and_then(|c| c.schema.as_ref()) {
            schema::prune(schema, &mut decoded);
        }
        let mut body = config.clone();
        body.as_object_mut().map(|b| b.remove("metadata"));
        paths.extend(typed::undeclared(&body, &decoded, shape));
    }
    let errors = match paths.as_slice() {
        [] => return Ok(()),
        [one] => format!("{one}: field not declared in schema"),
        many => {
            let lines: Vec<String> = many
                .iter()
                .map(|p| format!("  {p}: field not declared in schema"))
                .collect();
            format!("errors:\n{}", lines.join("\n"))
        }
    };
    Err(ApiError::Unclassified(format!(
        "failed to create typed patch object ({}/{}; {}/{}, Kind={}): {errors}",
        text(config, "/metadata/namespace"),
        text(config, "/metadata/name"),
        info.group,
        info.version,
        info.kind,
    )))
}

impl State {
    /// Writes a change the server makes itself (garbage collector, binding, namespace controller): no
    /// validation, but managed fields are recorded, and an object without finalizers left that is being
    /// deleted goes.
    pub(crate) fn system_update(
        &mut self,
        info: &ResourceInfo,
        old: &Arc<Stored>,
        mut value: Value,
        manager: &str,
        scope: Scope,
    ) -> Arc<Stored> {
        typed::drop_empty_metadata(&mut value);
        let old_value = old.value();
        if value == old_value {
            return old.clone();
        }
        let now = self.now();
        let api_version = info.api_version();
        let updater = Updater {
            manager,
            scope,
            shape: shape_of(info),
            api_version: &api_version,
            now: &now,
        };
        ssa::record_update(Some(&old_value), &mut value, &updater);
        if old.meta.deleting && releasable(&value) {
            self.remove(info, value, old)
        } else {
            self.commit(info, value, Some(old.clone()))
        }
    }

    fn generate_name(&mut self, info: &ResourceInfo, namespace: &str, prefix: &str) -> String {
        loop {
            let name = format!("{prefix}{}", self.random.name_suffix());
            if self.lookup(info, namespace, &name).is_none() {
                return name;
            }
        }
    }

    pub(crate) fn create(
        &mut self,
        info: &Arc<ResourceInfo>,
        namespace: Option<&str>,
        mut body: Value,
        opts: &WriteOptions,
        source: Source<'_>,
    ) -> Result<Written, ApiError> {
        if !body.is_object() {
            return Err(unrecognized(info, &body));
        }
        let mut name = text(&body, "/metadata/name").to_owned();
        let namespace = if info.namespaced {
            let namespace = namespace.unwrap_or("default");
            let sent = text(&body, "/metadata/namespace");
            if !sent.is_empty() && sent != namespace {
                return Err(ApiError::BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request"
                        .into(),
                ));
            }
            let namespaces = self.registry.find("", "v1", "namespaces").expect("built in");
            let Some(owner) = self.lookup(&namespaces, "", namespace) else {
                return Err(ApiError::NotFound {
                    resource: GroupResource::new("", "namespaces"),
                    name: namespace.into(),
                });
            };
            if owner.meta.deleting {
                let shown = if name.is_empty() {
                    text(&body, "/metadata/generateName").to_owned()
                } else {
                    name.clone()
                };
                return Err(ApiError::Forbidden {
                    resource: info.group_resource(),
                    name: shown.clone(),
                    message: format!(
                        "{} \"{shown}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                        info.group_resource()
                    ),
                });
            }
            metadata_mut(&mut body).insert("namespace".into(), Value::from(namespace));
            namespace.to_owned()
        } else {
            metadata_mut(&mut body).remove("namespace");
            String::new()
        };
        if let Some(custom) = &info.custom {
            let definition = self
                .registry
                .find("apiextensions.k8s.io", "v1", "customresourcedefinitions");
            if definition
                .and_then(|d| self.lookup(&d, "", &custom.crd_name))
                .is_some_and(|d| d.meta.deleting)
            {
                return Err(ApiError::MethodNotAllowed);
            }
        }
        if name.is_empty() {
            let prefix = text(&body, "/metadata/generateName").to_owned();
            if !prefix.is_empty() {
                name = self.generate_name(info, &namespace, &prefix);
                metadata_mut(&mut body).insert("name".into(), Value::from(name.as_str()));
            }
        }
        if !name.is_empty() && self.lookup(info, &namespace, &name).is_some() {
            return Err(ApiError::AlreadyExists {
                resource: info.group_resource(),
                name,
            });
        }
        let (mut value, warnings) = self.prepare(info, None, body, opts, source)?;
        if info.is("", "Pod") {
            let class_name = text(&value, "/spec/priorityClassName").to_owned();
            let classes = self
                .registry
                .find("scheduling.k8s.io", "v1", "priorityclasses")
                .expect("built in");
            let class = (!class_name.is_empty())
                .then(|| self.lookup(&classes, "", &class_name))
                .flatten();
            pods::admit(&mut value, class.map(|c| c.value()).as_ref())?;
        }
        if info.is("", "Service") {
            self.allocate_cluster_ip(&mut value);
        }
        if info.is("apiextensions.k8s.io", "CustomResourceDefinition") {
            let now = self.now();
            value["status"] = crate::registry::crd_status(&value, &now);
            let finalizers = metadata_mut(&mut value)
                .entry("finalizers")
                .or_insert_with(|| json!([]));
            if let Some(list) = finalizers.as_array_mut()
                && !list.iter().any(|f| f == CRD_CLEANUP_FINALIZER)
            {
                list.push(json!(CRD_CLEANUP_FINALIZER));
            }
        }
        if opts.dry_run {
            return Ok(Written {
                object: Stored::new(&value, info),
                created: true,
                warnings,
            });
        }
        let stored = self.commit(info, value.clone(), None);
        if info.is("apiextensions.k8s.io", "CustomResourceDefinition") {
            self.registry.register_crd(&value);
        }
        if info.is("", "Namespace") {
            let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                                 "metadata": {"name": "default", "namespace": name}});
            let accounts = self.registry.find("", "v1", "serviceaccounts").expect("built in");
            let system = WriteOptions {
                manager: "kube-controller-manager".into(),
                ..WriteOptions::default()
            };
            self.create(&accounts, Some(&name), account, &system, Source::Server)?;
        }
        Ok(Written {
            object: stored,
            created: true,
            warnings,
        })
    }

    fn allocate_cluster_ip(&mut self, service: &mut Value) {
        let kind = text(service, "/spec/type");
        let current = text(service, "/spec/clusterIP");
        if kind == "ExternalName" || current == "None" {
            return;
        }
        let ip = if current.is_empty() {
            self.next_ip += 1;
            format!("10.96.{}.{}", (self.next_ip >> 8) & 0xFF, self.next_ip & 0xFF)
        } else {
            current.to_owned()
        };
        service["spec"]["clusterIP"] = json!(ip);
        service["spec"]["clusterIPs"] = json!([ip]);
        service["spec"]["ipFamilies"] = json!(["IPv4"]);
        service["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    }

    /// Turns a request body into the object to store: server-owned metadata, subresource rules, decoding,
    /// defaults, validation, generation and managed fields.
    fn prepare(
        &mut self,
        info: &ResourceInfo,
        old: Option<&Value>,
        mut new: Value,
        opts: &WriteOptions,
        source: Source<'_>,
    ) -> Result<(Value, Vec<String>), ApiError> {
        let now = self.now();
        // What a strict patch refusal shows: the patched object as it came, before the server touched it.
        let patched = matches!(
            (opts.validation, source),
            (FieldValidation::Strict, Source::Patch(..))
        )
        .then(|| new.clone());
        // An update's body, or what a patch made of the object, may be any JSON value.
        if !new.is_object() {
            return Err(unrecognized(info, &new));
        }
        for (key, expected) in [("apiVersion", info.api_version()), ("kind", info.kind.clone())] {
            let sent = text(&new, &format!("/{key}"));
            if !sent.is_empty() && sent != expected {
                let what = if key == "kind" { "kind" } else { "API version" };
                return Err(ApiError::BadRequest(format!(
                    "the {what} in the data ({sent}) does not match the expected {what} ({expected})"
                )));
            }
            new[key] = Value::from(expected);
        }
        metadata_mut(&mut new);
        match old {
            None => {
                let meta = metadata_mut(&mut new);
                if !(opts.keep_identity
                    && meta
                        .get("uid")
                        .is_some_and(|u| u.as_str().is_some_and(|u| !u.is_empty())))
                {
                    let uid = self.random.uid();
                    metadata_mut(&mut new).insert("uid".into(), Value::from(uid));
                }
                let meta = metadata_mut(&mut new);
                if !(opts.keep_identity && meta.get("creationTimestamp").is_some_and(Value::is_string)) {
                    meta.insert("creationTimestamp".into(), Value::from(now.as_str()));
                }
                for key in [
                    "resourceVersion",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "selfLink",
                ] {
                    meta.remove(key);
                }
                if info.generation {
                    meta.insert("generation".into(), json!(1));
                } else {
                    meta.remove("generation");
                }
                if info.status_subresource && !info.is("", "Node") {
                    defaults::initial_status(info, &mut new);
                    if info.custom.is_some()
                        && let Some(map) = new.as_object_mut()
                    {
                        map.remove("status");
                    }
                }
            }
            Some(old_value) => {
                if opts.status {
                    // A status write that changed nothing but the status (most do) is kept as it is:
                    // rebuilding it from a copy of the stored object would give it back.
                    if !already_status_only(old_value, &new) {
                        let mut only_status = old_value.clone();
                        match new.get("status") {
                            Some(status) => only_status["status"] = status.clone(),
                            None => {
                                only_status.as_object_mut().map(|o| o.remove("status"));
                            }
                        }
                        if let Some(fields) = new.pointer("/metadata/managedFields") {
                            metadata_mut(&mut only_status).insert("managedFields".into(), fields.clone());
                        }
                        new = only_status;
                    }
                } else if info.status_subresource {
                    match old_value.get("status") {
                        // A write that left the status as stored (most do) keeps it where it is.
                        Some(status) if new.get("status").is_some_and(|sent| identical(sent, status)) => {}
                        Some(status) => new["status"] = status.clone(),
                        None => {
                            new.as_object_mut().map(|o| o.remove("status"));
                        }
                    }
                }
                let no_meta = Value::Null;
                let old_meta = old_value.get("metadata").unwrap_or(&no_meta);
                let meta = metadata_mut(&mut new);
                for key in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                    "name",
                    "namespace",
                    "resourceVersion",
                ] {
                    match old_meta.get(key) {
                        Some(value) => meta.insert(key.into(), value.clone()),
                        None => meta.remove(key),
                    };
                }
            }
        }

        let normalized = match old {
            Some(old) => typed::normalize_update(info, old, &new)?,
            None => typed::normalize(info, &new)?,
        };
        let mut unknown = normalized.unknown;
        new = normalized.object;
        let schema = info.custom.as_ref().and_then(|c| c.schema.as_ref());
        if let Some(schema) = schema {
            unknown.extend(schema::prune(schema, &mut new));
            schema::apply_defaults(schema, &mut new);
        }
        defaults::apply(info, &mut new);
        let mut fields: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
        if matches!(source, Source::Body) {
            fields.extend(opts.duplicates.iter().map(|f| format!("duplicate field \"{f}\"")));
        }
        let warnings = match (opts.validation, source) {
            _ if fields.is_empty() => Vec::new(),
            (FieldValidation::Ignore, _) | (_, Source::Apply | Source::Server) => Vec::new(),
            (FieldValidation::Warn, _) => fields,
            (FieldValidation::Strict, Source::Body) => return Err(strict_body_error(info, &fields)),
            (FieldValidation::Strict, Source::Patch(kind, patch)) => {
                return Err(strict_patch_error(
                    kind,
                    patch,
                    patched.as_ref().unwrap_or(&Value::Null),
                    &fields,
                ));
            }
        };

        let old_value = old;
        // The RBAC registry refuses an escalating Role or binding before it validates it.
        if let Some(escalation) = &opts.escalation {
            escalation.check(info, old_value, &new)?;
        }
        let mut causes = validation::metadata(info, &new);
        causes.extend(validation::builtin(info, &new, old_value));
        if let Some(schema) = schema {
            let errors: Vec<_> = schema::validate(schema, &new)
                .into_iter()
                .filter(|e| !matches!(e.kind, FieldErrorKind::Unknown { .. }))
                .collect();
            causes.extend(errors.iter().map(Cause::from_field_error));
            // CEL rules (`x-kubernetes-validations`, with `oldSelf` on updates) run on a well-typed object.
            if errors.is_empty() {
                let broken = schema::check_rules(schema, &new, old_value);
                causes.extend(broken.iter().map(Cause::from_field_error));
            }
        }
        if let Some(old_value) = old_value
            && old_value
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|t| !t.is_null())
        {
            let before = finalizers(old_value);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                causes.push(causes::forbidden(
                    "metadata.finalizers",
                    &format!("no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"),
                ));
            }
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid_causes(
                info.group_kind(),
                text(&new, "/metadata/name"),
                causes,
            ));
        }

        if let Some(old_value) = old_value
            && info.generation
            && spec_changed(old_value, &new, info.status_subresource)
        {
            let generation = old_value
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            metadata_mut(&mut new).insert("generation".into(), json!(generation + 1));
        }
        if info.is("apiextensions.k8s.io", "CustomResourceDefinition")
            && let Some(old_value) = old_value
            && old_value.get("spec") != new.get("spec")
        {
            new["status"] = crate::registry::crd_status(&new, &now);
        }
        if !matches!(source, Source::Apply) {
            let scope = if opts.status {
                Scope::Status
            } else {
                Scope::Main {
                    status_subresource: info.status_subresource,
                }
            };
            let api_version = info.api_version();
            let updater = Updater {
                manager: &opts.manager,
                scope,
                shape: shape_of(info),
                api_version: &api_version,
                now: &now,
            };
            ssa::record_update(old_value, &mut new, &updater);
        }
        defaults::strategy(info, &mut new);
        Ok((new, warnings))
    }

    /// Stores an update of `old` to `new`, unless nothing changed; removes the object when it was being
    /// deleted and its last finalizer went.
    fn finish_update(
        &mut self,
        info: &Arc<ResourceInfo>,
        old: &Arc<Stored>,
        old_value: &Value,
        new: Value,
        opts: &WriteOptions,
        warnings: Vec<String>,
    ) -> Result<Written, ApiError> {
        if new == *old_value {
            return Ok(Written {
                object: old.clone(),
                created: false,
                warnings,
            });
        }
        if opts.dry_run {
            return Ok(Written {
                object: Stored::new(&new, info),
                created: false,
                warnings,
            });
        }
        let object = if old.meta.deleting && releasable(&new) {
            self.remove(info, new, old)
        } else {
            if info.is("apiextensions.k8s.io", "CustomResourceDefinition") && !old.meta.deleting {
                self.registry.register_crd(&new);
            }
            self.commit(info, new, Some(old.clone()))
        };
        Ok(Written {
            object,
            created: false,
            warnings,
        })
    }

    fn existing(&self, info: &ResourceInfo, namespace: &str, name: &str) -> Result<Arc<Stored>, ApiError> {
        self.lookup(info, namespace, name)
            .ok_or_else(|| not_found(info, name))
    }

    fn check_identity(info: &ResourceInfo, name: &str, old: &Stored, body: &Value) -> Result<(), ApiError> {
        let sent_name = text(body, "/metadata/name");
        if !sent_name.is_empty() && sent_name != name {
            return Err(ApiError::BadRequest(format!(
                "the name of the object ({sent_name}) does not match the name on the URL ({name})"
            )));
        }
        let sent_namespace = text(body, "/metadata/namespace");
        if info.namespaced && !sent_namespace.is_empty() && sent_namespace != old.meta.namespace {
            return Err(ApiError::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request"
                    .into(),
            ));
        }
        let sent_version = text(body, "/metadata/resourceVersion");
        if !sent_version.is_empty() && sent_version != old.meta.resource_version.to_string() {
            return Err(ApiError::modified(info.group_resource(), name));
        }
        let sent_uid = text(body, "/metadata/uid");
        if !sent_uid.is_empty() && sent_uid != old.meta.uid {
            return Err(ApiError::Conflict {
                resource: info.group_resource(),
                name: name.to_owned(),
                detail: format!(
                    "Precondition failed: UID in precondition: {sent_uid}, UID in object meta: {}",
                    old.meta.uid
                ),
            });
        }
        Ok(())
    }

    pub(crate) fn update(
        &mut self,
        info: &Arc<ResourceInfo>,
        namespace: &str,
        name: &str,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let old = self.existing(info, namespace, name)?;
        Self::check_identity(info, name, &old, &body)?;
        let old_value = old.value();
        let versioned = !matches!(text(&body, "/metadata/resourceVersion"), "" | "0");
        let (new, warnings) = self.prepare(info, Some(&old_value), body, opts, Source::Body)?;
        // A custom resource is never replaced unconditionally (its strategy does not allow it): a PUT must
        // name the version it replaces. kube-apiserver names the resource, not the kind, here.
        if info.custom.is_some() && !versioned {
            return Err(ApiError::invalid_causes(
                GroupKind {
                    group: info.group.clone(),
                    kind: info.plural.clone(),
                },
                name,
                vec![Cause {
                    reason: "FieldValueInvalid".into(),
                    message: "Invalid value: 0: must be specified for an update".into(),
                    field: "metadata.resourceVersion".into(),
                }],
            ));
        }

        self.finish_update(info, &old, &old_value, new, opts, warnings)
    }

    pub(crate) fn patch(
        &mut self,
        info: &Arc<ResourceInfo>,
        namespace: &str,
        name: &str,
        kind: PatchType,
        patch: &Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let old = self.existing(info, namespace, name)?;
        let old_value = old.value();
        let mut new = old_value.clone();
        patch::apply(kind, &mut new, patch, info)?;
        if text(&new, "/metadata/name") != name {
            return Err(ApiError::invalid_causes(
                info.group_kind(),
                name,
                vec![causes::invalid(
                    "metadata.name",
                    &Value::from(text(&new, "/metadata/name")),
                    "field is immutable",
                )],
            ));
        }
        Self::check_identity(info, name, &old, &new)?;
        let (new, warnings) = self.prepare(info, Some(&old_value), new, opts, Source::Patch(kind, patch))?;
        self.finish_update(info, &old, &old_value, new, opts, warnings)
    }

    pub(crate) fn apply(
        &mut self,
        info: &Arc<ResourceInfo>,
        namespace: &str,
        name: &str,
        config: &Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        if opts.manager.is_empty() {
            let kind = GroupKind {
                group: "meta.k8s.io".into(),
                kind: "PatchOptions".into(),
            };
            return Err(ApiError::invalid_causes(
                kind,
                "",
                vec![causes::required("fieldManager", "is required for apply patch")],
            ));
        }
        if !config.is_object() {
            return Err(ApiError::BadRequest(
                "an apply patch must be a YAML or JSON object".into(),
            ));
        }
        for key in ["apiVersion", "kind"] {
            if text(config, &format!("/{key}")).is_empty() {
                return Err(ApiError::BadRequest(format!(
                    "invalid object type: {key} must be set in an apply patch (want {} {})",
                    info.api_version(),
                    info.kind
                )));
            }
        }
        if config
            .pointer("/metadata/managedFields")
            .is_some_and(|m| !m.is_null())
        {
            return Err(ApiError::BadRequest("metadata.managedFields must be nil".into()));
        }
        let sent_name = text(config, "/metadata/name");
        if !sent_name.is_empty() && sent_name != name {
            return Err(ApiError::BadRequest(format!(
                "the name of the object ({sent_name}) does not match the name on the URL ({name})"
            )));
        }
        let now = self.now();
        let api_version = info.api_version();
        let scope = if opts.status {
            Scope::Status
        } else {
            Scope::Main {
                status_subresource: info.status_subresource,
            }
        };
        let applier = Applier {
            manager: &opts.manager,
            force: opts.force,
            scope,
            shape: shape_of(info),
            api_version: &api_version,
            now: &now,
        };
        match self.lookup(info, namespace, name) {
            None => {
                if opts.status {
                    return Err(not_found(info, name));
                }
                if let Some(create) = &opts.create_on_apply {
                    create.check()?;
                }
                let mut skeleton =
                    json!({"apiVersion": api_version, "kind": info.kind, "metadata": {"name": name}});
                if info.namespaced {
                    skeleton["metadata"]["namespace"] = json!(namespace);
                }
                refuse_undeclared(info, config, &skeleton, &applier)?;
                let result =
                    ssa::apply(&skeleton, config, &applier).map_err(|c| apply_conflict(info, name, &c))?;
                self.create(info, Some(namespace), result, opts, Source::Apply)
            }
            Some(old) => {
                Self::check_identity(info, name, &old, config)?;
                let old_value = old.value();
                refuse_undeclared(info, config, &old_value, &applier)?;
                let result =
                    ssa::apply(&old_value, config, &applier).map_err(|c| apply_conflict(info, name, &c))?;
                let (new, warnings) = self.prepare(info, Some(&old_value), result, opts, Source::Apply)?;
                self.finish_update(info, &old, &old_value, new, opts, warnings)
            }
        }
    }

    pub(crate) fn delete(
        &mut self,
        info: &Arc<ResourceInfo>,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let old = self.existing(info, namespace, name)?;
        if let Some(uid) = opts.uid.as_deref().filter(|u| !u.is_empty())
            && uid != old.meta.uid
        {
            return Err(uid_precondition_failed(info, name, uid, &old.meta.uid));
        }
        if let Some(version) = opts.resource_version.as_deref().filter(|v| !v.is_empty())
            && version != old.meta.resource_version.to_string()
        {
            return Err(ApiError::Conflict {
                resource: info.group_resource(),
                name: name.to_owned(),
                detail: format!(
                    "Precondition failed: ResourceVersion in precondition: {version}, ResourceVersion in object meta: {}",
                    old.meta.resource_version
                ),
            });
        }
        if info.is("", "Namespace") && PROTECTED_NAMESPACES.contains(&name) {
            return Err(ApiError::Forbidden {
                resource: info.group_resource(),
                name: name.to_owned(),
                message: format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted"),
            });
        }

        let mut value = old.value();
        let mut wanted = finalizers(&value);
        match opts.propagation {
            Some(Propagation::Orphan) if !wanted.iter().any(|f| f == "orphan") => {
                wanted.push("orphan".into())
            }
            Some(Propagation::Foreground) if !wanted.iter().any(|f| f == "foregroundDeletion") => {
                wanted.push("foregroundDeletion".into());
            }
            _ => {}
        }
        let kubelet_grace = (info.is("", "Pod")
            && self.options.pod_termination == PodTermination::Kubelet
            && !text(&value, "/spec/nodeName").is_empty())
        .then(|| {
            opts.grace_period_seconds
                .or_else(|| {
                    value
                        .pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30)
        })
        .filter(|grace| *grace > 0);
        let is_namespace = info.is("", "Namespace");
        let pending = !wanted.is_empty() || kubelet_grace.is_some() || (is_namespace && !releasable(&value));
        if !pending {
            if opts.dry_run {
                return Ok(Deleted::Gone(old));
            }
            return Ok(Deleted::Gone(self.remove(info, value, &old)));
        }
        let meta = metadata_mut(&mut value);
        if !old.meta.deleting {
            let grace = kubelet_grace.unwrap_or(0);
            let at = self
                .clock
                .now()
                .checked_add(jiff::SignedDuration::from_secs(grace))
                .unwrap_or(self.clock.now());
            meta.insert("deletionTimestamp".into(), Value::from(format_time(at)));
            meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
            if let Some(generation) = meta.get("generation").and_then(Value::as_i64) {
                meta.insert("generation".into(), json!(generation + 1));
            }
        }
        if !wanted.is_empty() {
            meta.insert("finalizers".into(), json!(wanted));
        }
        if is_namespace {
            value["status"]["phase"] = json!("Terminating");
        }
        if opts.dry_run {
            return Ok(Deleted::Pending(Stored::new(&value, info)));
        }
        let stored = if value == old.value() {
            old
        } else {
            self.commit(info, value, Some(old))
        };
        let uid = stored.meta.uid.clone();
        if stored.meta.finalizers.iter().any(|f| f == "orphan") {
            self.gc.push_back(Work::Orphan { uid: uid.clone() });
        }
        if stored.meta.finalizers.iter().any(|f| f == "foregroundDeletion") {
            self.gc.push_back(Work::Foreground { uid });
        }
        if is_namespace {
            self.gc.push_back(Work::Namespace {
                name: name.to_owned(),
            });
        }
        if info.is("apiextensions.k8s.io", "CustomResourceDefinition") {
            self.gc.push_back(Work::Definition {
                name: name.to_owned(),
            });
        }
        Ok(Deleted::Pending(stored))
    }
}

/// kube-apiserver's 400 for a body that is not a JSON object: its decoder finds no kind in it
/// (`transformDecodeError` with the start of the body, as `summarizeData` shows it).
pub(crate) fn unrecognized(info: &ResourceInfo, body: &Value) -> ApiError {
    let why = match body {
        Value::Null => "unexpected end of JSON input".to_owned(),
        other => {
            let kind = match other {
                Value::Array(_) => "array",
                Value::String(_) => "string",
                Value::Number(_) => "number",
                Value::Bool(_) => "bool",
                _ => "object",
            };
            format!(
                "json: cannot unmarshal {kind} into Go value of type struct {{ APIVersion string \"json:\\\"apiVersion,omitempty\\\"\"; Kind string \"json:\\\"kind,omitempty\\\"\" }}"
            )
        }
    };
    let summary = match body {
        Value::Null => "<empty>".to_owned(),
        other => {
            let text = other.to_string();
            let bytes = text.as_bytes();
            let shown: String = bytes.iter().take(30).map(|b| format!("{b:02x}")).collect();
            if bytes.len() > 30 {
                format!("{shown} ...")
            } else {
                shown
            }
        }
    };
    ApiError::BadRequest(format!(
        "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: {why} ({summary})",
        info.kind
    ))
}
