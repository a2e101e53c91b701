//! The Helm chart `deploy/helm/gpu-operator`, rendered by the pinned Helm (`target/tools/helm`):
//! - `compat`: values files written for NVIDIA's chart give the ClusterPolicy and NVIDIADriver specs NVIDIA's
//!   chart gives (`tests/compat/expected/`, produced once with NVIDIA's chart);
//! - `rendering`: `helm lint --strict`, the operator's locked-down pod, the hook Jobs' commands, no RBAC
//!   wildcards, fail-fast values, and `gpu-operator check` on every ClusterPolicy the chart renders;
//! - `values_table`: the README's table of values, generated from the `# --` comments in values.yaml.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use super::{gpu_operator, repo_root, stdout};
use crate::tools::helm;

const RELEASE: &str = "gpu-operator";
const NAMESPACE: &str = "gpu-operator";

fn chart() -> PathBuf {
    repo_root().join("deploy/helm/gpu-operator")
}

fn compat_dir() -> PathBuf {
    chart().join("tests/compat")
}

/// `helm template` of the chart with `args`; the error output when Helm refuses.
fn template(args: &[&str]) -> Result<String, String> {
    let output = Command::new(helm())
        .args(["template", RELEASE])
        .arg(chart())
        .args(["--namespace", NAMESPACE])
        .args(args)
        .output()
        .expect("helm runs");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

fn rendered(args: &[&str]) -> Vec<Value> {
    let text = template(args).unwrap_or_else(|error| panic!("helm template {args:?} failed: {error}"));
    documents(&text)
}

fn documents(text: &str) -> Vec<Value> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text).expect("Helm's output is YAML");
    documents.into_iter().filter(|d| !d.is_null()).collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name:?} rendered"))
}

/// The compatibility values files, sorted by name.
fn compat_values() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(compat_dir().join("values"))
        .expect("tests/compat/values")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

mod compat {
    use super::*;

    /// The one field both charts fill with their own identity: operands are labelled with the chart that
    /// installed the operator (`gpu-operator-v26.7.0` for NVIDIA's, `gpu-operator-0.1.0` for this one).
    const CHART_LABEL: &str = "ClusterPolicy.spec.daemonsets.labels[\"helm.sh/chart\"]";

    /// The spec of every ClusterPolicy and NVIDIADriver, by kind.
    fn specs(objects: &[Value]) -> BTreeMap<String, Value> {
        objects
            .iter()
            .filter(|o| o["kind"] == "ClusterPolicy" || o["kind"] == "NVIDIADriver")
            .map(|o| {
                (
                    o["kind"].as_str().unwrap_or_default().to_owned(),
                    o["spec"].clone(),
                )
            })
            .collect()
    }

    /// Every field path where `ours` and `theirs` differ, with both values.
    fn differences(path: &str, ours: &Value, theirs: &Value, found: &mut Vec<String>) {
        match (ours, theirs) {
            (Value::Object(ours), Value::Object(theirs)) => {
                let keys: std::collections::BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
                for key in keys {
                    let field = if key.contains(['.', '/']) {
                        format!("{path}[{key:?}]")
                    } else {
                        format!("{path}.{key}")
                    };
                    match (ours.get(key), theirs.get(key)) {
                        (Some(a), Some(b)) => differences(&field, a, b, found),
                        (Some(a), None) => found.push(format!("{field}: only in ours ({a})")),
                        (None, Some(b)) => found.push(format!("{field}: missing (NVIDIA's chart has {b})")),
                        (None, None) => {}
                    }
                }
            }
            (Value::Array(ours), Value::Array(theirs)) if ours.len() == theirs.len() => {
                for (index, (a, b)) in ours.iter().zip(theirs).enumerate() {
                    differences(&format!("{path}[{index}]"), a, b, found);
                }
            }
            _ if ours == theirs => {}
            _ => found.push(format!("{path}: ours {ours}, NVIDIA's {theirs}")),
        }
    }

    #[test]
    fn differences_name_every_field_path() {
        let ours = serde_json::json!({"a": {"b": 1, "c": [1, 2], "x.y": "p"}, "d": true});
        let theirs = serde_json::json!({"a": {"b": 2, "c": [1, 3], "x.y": "q"}, "e": false});
        let mut found = Vec::new();
        differences("spec", &ours, &theirs, &mut found);
        assert_eq!(
            found,
            [
                "spec.a.b: ours 1, NVIDIA's 2",
                "spec.a.c[1]: ours 2, NVIDIA's 3",
                "spec.a[\"x.y\"]: ours \"p\", NVIDIA's \"q\"",
                "spec.d: only in ours (true)",
                "spec.e: missing (NVIDIA's chart has false)",
            ]
        );
    }

    /// A values file written for NVIDIA's chart gives the same ClusterPolicy (and NVIDIADriver) spec here.
    #[test]
    fn nvidia_values_files_render_the_same_specs() {
        let files = compat_values();
        assert!(
            files.len() >= 5,
            "the compatibility values files are missing: {files:?}"
        );
        let mut found = Vec::new();
        for file in &files {
            let name = file_name(file);
            let ours = specs(&rendered(&["-f", file.to_str().expect("utf-8 path")]));
            let expected_path = compat_dir().join("expected").join(&name);
            let expected = std::fs::read_to_string(&expected_path)
                .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
            let theirs = specs(&documents(&expected));
            assert!(
                theirs.contains_key("ClusterPolicy"),
                "{name}: no ClusterPolicy expected"
            );
            let kinds = |specs: &BTreeMap<String, Value>| specs.keys().cloned().collect::<Vec<_>>();
            if kinds(&ours) != kinds(&theirs) {
                found.push(format!(
                    "{name}: renders {:?}, NVIDIA's chart {:?}",
                    kinds(&ours),
                    kinds(&theirs)
                ));
            }
            for (kind, expected) in &theirs {
                let Some(spec) = ours.get(kind) else { continue };
                let mut differing = Vec::new();
                differences(&format!("{kind}.spec"), spec, expected, &mut differing);
                found.extend(
                    differing
                        .into_iter()
                        .filter(|d| !d.starts_with(&format!("{CHART_LABEL}: ours \"gpu-operator-")))
                        .map(|d| format!("{name}: {d}")),
                );
            }
        }
        assert!(
            found.is_empty(),
            "the chart renders NVIDIA's values differently:\n{}",
            found.join("\n")
        );
    }
}

mod rendering {
    use super::*;

    #[test]
    fn lint_passes_strictly_with_every_values_file() {
        let mut runs = vec![Vec::new()];
        for file in compat_values() {
            runs.push(vec!["-f".to_owned(), file.to_string_lossy().into_owned()]);
        }
        for args in runs {
            let output = Command::new(helm())
                .args(["lint", "--strict"])
                .arg(chart())
                .args(&args)
                .output()
                .expect("helm runs");
            assert!(
                output.status.success(),
                "helm lint --strict {args:?}: {}{}",
                stdout(&output),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    #[test]
    fn the_operator_runs_locked_down_with_leader_election() {
        let objects = rendered(&[]);
        let deployment = find(&objects, "Deployment", "gpu-operator");
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "gpu-operator");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        assert_eq!(pod["priorityClassName"], "system-node-critical");
        let labels = &deployment["spec"]["template"]["metadata"]["labels"];
        assert_eq!(
            labels["app"], "gpu-operator",
            "the operator's metrics Service selects it"
        );
        assert_eq!(labels["nvidia.com/gpu-driver-upgrade-drain.skip"], "true");
        let container = &pod["containers"][0];
        let security = &container["securityContext"];
        assert_eq!(security["runAsNonRoot"], true);
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert!(security.get("privileged").is_none_or(|p| p == false));
        assert_eq!(container["image"], "ghcr.io/gpuop/gpu-operator:0.1.0");
        assert_eq!(
            container["args"],
            serde_json::json!([
                "run",
                "--leader-elect",
                "--namespace=gpu-operator",
                "--metrics-bind-address=0.0.0.0:8080",
                "--health-probe-bind-address=0.0.0.0:8081",
                "--log-format=json"
            ])
        );
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        let health_port = container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == "health")
            .expect("a health port");
        assert_eq!(health_port["containerPort"], 8081);
        let env = container["env"].as_array().cloned().unwrap_or_default();
        let namespace = env
            .iter()
            .find(|e| e["name"] == "OPERATOR_NAMESPACE")
            .expect("OPERATOR_NAMESPACE");
        assert_eq!(
            namespace["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );

        let two = rendered(&["--set", "operator.replicas=2", "--set", "operator.version=v9"]);
        let deployment = find(&two, "Deployment", "gpu-operator");
        assert_eq!(deployment["spec"]["replicas"], 2);
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][0]["image"],
            "ghcr.io/gpuop/gpu-operator:v9"
        );
    }

    /// The contract with the `crd` and `uninstall` subcommands: their arguments, service accounts and hooks.
    /// The uninstall hook runs as the operator's ServiceAccount, a release object: the Job is its only hook
    /// object, so Helm never deletes its permissions while the Job may still run.
    #[test]
    fn hook_jobs_run_the_crd_and_uninstall_subcommands() {
        let objects = rendered(&[]);
        for (job, hook, args, account, hook_account) in [
            (
                "gpu-operator-upgrade-crd",
                "pre-upgrade",
                serde_json::json!(["crd", "--apply"]),
                "gpu-operator-upgrade-crd",
                true,
            ),
            (
                "gpu-operator-uninstall",
                "pre-delete",
                serde_json::json!(["uninstall", "--namespace", "gpu-operator"]),
                "gpu-operator",
                false,
            ),
        ] {
            let rendered_job = find(&objects, "Job", job);
            assert_eq!(
                rendered_job["metadata"]["annotations"]["helm.sh/hook"], hook,
                "{job}"
            );
            let pod = &rendered_job["spec"]["template"]["spec"];
            assert_eq!(pod["serviceAccountName"], account, "{job}");
            assert_eq!(pod["containers"][0]["args"], args, "{job}");
            assert_eq!(pod["containers"][0]["image"], "ghcr.io/gpuop/gpu-operator:0.1.0");
            assert_eq!(
                pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
                true
            );
            let service_account = find(&objects, "ServiceAccount", account);
            assert_eq!(
                service_account["metadata"]["annotations"]["helm.sh/hook"].is_string(),
                hook_account,
                "{job}'s ServiceAccount {account} is a hook object only for the CRD hook"
            );
            if !hook_account {
                let hooks: Vec<String> = objects
                    .iter()
                    .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"] == hook)
                    .map(|o| {
                        format!(
                            "{}/{}",
                            o["kind"].as_str().unwrap_or_default(),
                            o["metadata"]["name"].as_str().unwrap_or_default()
                        )
                    })
                    .collect();
                assert_eq!(hooks, [format!("Job/{job}")], "the {hook} hook's objects");
                continue;
            }
            for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
                let object = find(&objects, kind, account);
                let annotations = &object["metadata"]["annotations"];
                assert_eq!(annotations["helm.sh/hook"], hook, "{kind} {account}");
                let weight: i32 = annotations["helm.sh/hook-weight"]
                    .as_str()
                    .and_then(|w| w.parse().ok())
                    .expect("a hook weight");
                assert!(weight < 0, "{kind} {account} exists before its Job");
            }
        }
        let without = rendered(&["--set", "operator.upgradeCRD=false"]);
        assert!(
            !without
                .iter()
                .any(|o| o["metadata"]["name"] == "gpu-operator-upgrade-crd")
        );
    }

    #[test]
    fn no_rbac_rule_uses_a_wildcard() {
        let objects = rendered(&[]);
        let mut roles = 0;
        for role in objects
            .iter()
            .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole")
        {
            roles += 1;
            for rule in role["rules"].as_array().into_iter().flatten() {
                for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                    for value in rule[field].as_array().into_iter().flatten() {
                        assert!(
                            !value.as_str().unwrap_or_default().contains('*'),
                            "{} {}: wildcard in {field}: {rule}",
                            role["kind"],
                            role["metadata"]["name"]
                        );
                    }
                }
            }
        }
        assert!(roles >= 4, "{roles} roles rendered");
    }

    #[test]
    fn impossible_values_fail_naming_the_value() {
        for (set, message) in [
            (
                "nfd.enabled=true",
                "nfd.enabled=true: this chart does not bundle Node Feature Discovery",
            ),
            ("gpuCluster.deployCR=true", "gpuCluster.deployCR=true"),
            (
                "operator.cleanupCRD=true",
                "operator.cleanupCRD=true is not supported",
            ),
            (
                "devicePlugin.config.create=true",
                "devicePlugin.config.create=true needs devicePlugin.config.name",
            ),
            (
                "mig.strategy=double",
                "mig.strategy=\"double\" must be none, single or mixed",
            ),
        ] {
            let error = template(&["--set", set]).expect_err(set);
            assert!(error.contains(message), "--set {set}: {error}");
        }
    }

    #[test]
    fn config_maps_are_created_from_values() {
        let file = compat_dir().join("values/mig-mixed-time-slicing.yaml");
        let objects = rendered(&["-f", file.to_str().expect("utf-8 path")]);
        let config = find(&objects, "ConfigMap", "time-slicing-config");
        assert_eq!(config["metadata"]["namespace"], NAMESPACE);
        assert!(
            config["data"]["a100-80gb"]
                .as_str()
                .unwrap_or_default()
                .contains("replicas: 4")
        );
        let policy = find(&objects, "ClusterPolicy", "cluster-policy");
        assert_eq!(
            policy["spec"]["devicePlugin"]["config"]["name"],
            "time-slicing-config"
        );
    }

    /// Every ClusterPolicy and NVIDIADriver the chart renders passes the operator's own offline check.
    #[test]
    fn rendered_policies_pass_gpu_operator_check() {
        let dir = tempfile::tempdir().expect("temporary folder");
        let mut files = Vec::new();
        for values in compat_values() {
            let objects = rendered(&["-f", values.to_str().expect("utf-8 path")]);
            let mut yaml = String::new();
            for object in objects
                .iter()
                .filter(|o| o["kind"] == "ClusterPolicy" || o["kind"] == "NVIDIADriver")
            {
                yaml.push_str("---\n");
                yaml.push_str(&serde_saphyr::to_string(object).expect("YAML"));
            }
            let path = dir.path().join(file_name(&values));
            std::fs::write(&path, yaml).expect("written");
            files.push(path.to_string_lossy().into_owned());
        }
        let mut args = vec!["check", "-f"];
        args.extend(files.iter().map(String::as_str));
        let output = gpu_operator(&args);
        let text = stdout(&output);
        assert_eq!(output.status.code(), Some(0), "{text}");
        assert!(text.contains("NVIDIADriver \"default\": valid"), "{text}");
        assert!(text.contains(" invalid (0 errors"), "{text}");
    }
}

mod values_table {
    //! values.yaml documents every key with `# -- description` lines directly above it (helm-docs style).
    //! A key whose block holds documented keys is a section; any other documented key is a value, and the
    //! keys inside it (a map or list default) need no comment of their own.

    use super::*;

    const START: &str = "<!-- values-table:start -->";
    const END: &str = "<!-- values-table:end -->";

    /// A documented key.
    #[derive(Debug, PartialEq)]
    struct Row {
        path: String,
        default: String,
        description: String,
    }

    struct Key {
        line: usize,
        path: Vec<String>,
        parent: Option<usize>,
        description: Option<String>,
        inline: String,
    }

    /// The documented keys of a values file in order, or every key that lacks a description.
    fn rows(text: &str) -> Result<Vec<Row>, Vec<String>> {
        let parsed: Value = serde_saphyr::from_str(text).unwrap_or(Value::Null);
        let mut keys: Vec<Key> = Vec::new();
        // Open keys, innermost last: (indent, index into `keys`).
        let mut open: Vec<(usize, usize)> = Vec::new();
        let mut pending: Option<String> = None;
        let mut in_comment = false;
        for (number, line) in text.lines().enumerate() {
            let content = line.trim_start_matches(' ');
            let indent = line.chars().count() - content.chars().count();
            let content = content.trim_end();
            if content.is_empty() {
                pending = None;
                in_comment = false;
                continue;
            }
            if let Some(description) = content.strip_prefix("# --") {
                pending = Some(description.trim().to_owned());
                in_comment = true;
                continue;
            }
            if let Some(more) = content.strip_prefix('#') {
                match (&mut pending, in_comment) {
                    (Some(description), true) if !more.trim().is_empty() => {
                        description.push(' ');
                        description.push_str(more.trim());
                    }
                    _ => {}
                }
                continue;
            }
            in_comment = false;
            let description = pending.take();
            while open.last().is_some_and(|(open_indent, _)| *open_indent >= indent) {
                open.pop();
            }
            // A list item belongs to the value of the key above it.
            if content == "-" || content.starts_with("- ") {
                continue;
            }
            let Some((name, inline)) = content.split_once(':') else {
                continue;
            };
            let name = name.trim().trim_matches('"').trim_matches('\'').to_owned();
            let parent = open.last().map(|(_, index)| *index);
            let mut path = parent.map(|p| keys[p].path.clone()).unwrap_or_default();
            path.push(name);
            open.push((indent, keys.len()));
            keys.push(Key {
                line: number + 1,
                path,
                parent,
                description,
                inline: inline.trim().to_owned(),
            });
        }
        let mut section = vec![false; keys.len()];
        for key in &keys {
            if let (Some(parent), Some(_)) = (key.parent, &key.description) {
                section[parent] = true;
            }
        }
        // Whether a key is inside a documented value (a default map or list).
        let mut inside = vec![false; keys.len()];
        let mut rows = Vec::new();
        let mut problems = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            let parent_is_value = key.parent.is_some_and(|p| {
                inside.get(p).copied().unwrap_or(false)
                    || (keys[p].description.is_some() && !section.get(p).copied().unwrap_or(false))
            });
            inside[index] = parent_is_value;
            if parent_is_value {
                continue;
            }
            let is_section = section.get(index).copied().unwrap_or(false);
            let path = key.path.join(".");
            match &key.description {
                None if is_section => {}
                None => problems.push(format!(
                    "line {}: `{path}` has no `# -- description` above it",
                    key.line
                )),
                Some(description) => rows.push(Row {
                    default: if is_section {
                        String::new()
                    } else if key.inline.is_empty() {
                        lookup(&parsed, &key.path)
                            .map(|value| value.to_string())
                            .unwrap_or_default()
                    } else {
                        key.inline.clone()
                    },
                    path,
                    description: description.clone(),
                }),
            }
        }
        if problems.is_empty() {
            Ok(rows)
        } else {
            Err(problems)
        }
    }

    fn lookup<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
        path.iter().try_fold(value, |value, key| value.get(key))
    }

    fn cell(text: &str) -> String {
        text.replace('|', "\\|").replace('\n', " ")
    }

    fn table(rows: &[Row]) -> String {
        let mut table = String::from("| Key | Default | Description |\n|---|---|---|\n");
        for row in rows {
            let default = if row.default.is_empty() {
                String::new()
            } else {
                format!("`{}`", cell(&row.default))
            };
            table.push_str(&format!(
                "| `{}` | {default} | {} |\n",
                cell(&row.path),
                cell(&row.description)
            ));
        }
        table
    }

    #[test]
    fn sections_values_and_their_contents_are_told_apart() {
        let text = "# header\n\nop:\n  # -- The image.\n  # More words.\n  image: x\n  # -- Tolerations.\n  \
                    tolerations:\n    - key: a\n      operator: Exists\n  # -- Resources.\n  resources:\n    \
                    limits:\n      cpu: 1\n# -- Extra.\nextra: []\n";
        let rows = rows(text).expect("documented");
        let summary: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.path.as_str(), r.default.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                ("op.image", "x"),
                ("op.tolerations", r#"[{"key":"a","operator":"Exists"}]"#),
                ("op.resources", r#"{"limits":{"cpu":1}}"#),
                ("extra", "[]"),
            ]
        );
        assert_eq!(rows[0].description, "The image. More words.");
    }

    #[test]
    fn an_undocumented_key_is_named_and_odd_input_does_not_panic() {
        let problems = rows("a:\n  # -- Documented.\n  b: 1\n  c: 2\n").expect_err("c is undocumented");
        assert_eq!(problems, ["line 4: `a.c` has no `# -- description` above it"]);
        for odd in [
            "",
            ":",
            "- a",
            "  : x\n:\n# --",
            "a: |\n  b: c\n",
            "é: ü\n   ä:\n\tx: 1",
            "# -- lone",
        ] {
            let _ = rows(odd);
        }
    }

    /// README.md's values table is generated from values.yaml; `UPDATE_GOLDEN=1` rewrites it.
    #[test]
    fn the_readme_table_matches_values_yaml() {
        let values = std::fs::read_to_string(chart().join("values.yaml")).expect("values.yaml");
        let rows = rows(&values)
            .unwrap_or_else(|problems| panic!("values.yaml has undocumented keys:\n{}", problems.join("\n")));
        assert!(rows.iter().any(|r| r.path == "driver.upgradePolicy.autoUpgrade"));
        let table = table(&rows);
        let readme_path = chart().join("README.md");
        let readme = std::fs::read_to_string(&readme_path).expect("README.md");
        let (Some((before, rest)), true) = (readme.split_once(START), readme.contains(END)) else {
            panic!("README.md lacks the markers {START} and {END} around the values table");
        };
        let after = rest.split_once(END).map(|(_, after)| after).unwrap_or_default();
        let generated = format!("{before}{START}\n{table}{END}{after}");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&readme_path, &generated).expect("README.md written");
        }
        let readme = std::fs::read_to_string(&readme_path).expect("README.md");
        assert!(
            readme == generated,
            "deploy/helm/gpu-operator/README.md's values table is stale; regenerate it with \
             `UPDATE_GOLDEN=1 cargo test -p gpuop-operator --test cli chart::values_table`"
        );
    }
}

mod escalation {
    //! Kubernetes lets the operator write a Role or ClusterRole, or bind one, only when it holds every
    //! permission that role grants (RBAC escalation prevention). The operands' roles come from the
    //! renderer; these tests hold the chart's rules to every rule the renderer grants.

    use super::*;

    /// One grantable permission: API group, resource, verb, and the resource name when restricted.
    type Permission = (String, String, String, Option<String>);

    fn strings(value: &Value) -> Vec<String> {
        value
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    }

    fn permissions(rule: &Value) -> Vec<Permission> {
        let names = strings(&rule["resourceNames"]);
        let names: Vec<Option<String>> = if names.is_empty() {
            vec![None]
        } else {
            names.into_iter().map(Some).collect()
        };
        let mut all = Vec::new();
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    for name in &names {
                        all.push((group.clone(), resource.clone(), verb.clone(), name.clone()));
                    }
                }
            }
        }
        all
    }

    /// Whether `rules` allow `permission` (a rule without resourceNames allows every name).
    fn holds(rules: &[Value], (group, resource, verb, name): &Permission) -> bool {
        rules.iter().any(|rule| {
            let names = strings(&rule["resourceNames"]);
            strings(&rule["apiGroups"]).contains(group)
                && strings(&rule["resources"]).contains(resource)
                && strings(&rule["verbs"]).contains(verb)
                && (names.is_empty() || name.as_ref().is_some_and(|n| names.contains(n)))
        })
    }

    fn rules_of(objects: &[Value], kind: &str, name: &str) -> Vec<Value> {
        find(objects, kind, name)["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Every operand Role and ClusterRole: the renderer's golden files (every driver pool and sandbox
    /// variant), and what `gpu-operator render` makes of each ClusterPolicy the chart renders.
    fn operand_roles() -> Vec<Value> {
        let mut texts = Vec::new();
        let golden = repo_root().join("crates/render/tests/golden");
        for entry in std::fs::read_dir(&golden).expect("render goldens").flatten() {
            texts.push(std::fs::read_to_string(entry.path()).expect("golden"));
        }
        let dir = tempfile::tempdir().expect("temporary folder");
        let mut variants: Vec<Vec<String>> = compat_values()
            .iter()
            .map(|file| vec!["-f".to_owned(), file.to_string_lossy().into_owned()])
            .collect();
        variants.push(
            [
                "--set",
                "sandboxWorkloads.enabled=true",
                "--set",
                "sandboxWorkloads.mode=kata",
            ]
            .map(str::to_owned)
            .to_vec(),
        );
        // The ConfigMaps the mirror values name (a driver mounts them file by file, so the renderer needs
        // their keys).
        let facts = dir.path().join("facts.yaml");
        std::fs::write(
            &facts,
            "namespace: gpu-operator\nruntime: containerd\ndriverPools:\n  - osId: ubuntu\n    osVersion: \"22.04\"\n\
             serviceMonitorCrd: true\nconfigMapKeys:\n  repo-config: [cuda.list]\n  mirror-certs: [ca.crt]\n",
        )
        .expect("facts written");
        for (index, args) in variants.iter().enumerate() {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let objects = rendered(&args);
            let policy = find(&objects, "ClusterPolicy", "cluster-policy");
            let path = dir.path().join(format!("policy-{index}.yaml"));
            std::fs::write(&path, serde_saphyr::to_string(policy).expect("YAML")).expect("written");
            let output = gpu_operator(&[
                "render",
                "-f",
                path.to_str().expect("utf-8 path"),
                "--facts",
                facts.to_str().expect("utf-8 path"),
            ]);
            assert!(
                output.status.success(),
                "render {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            texts.push(stdout(&output));
        }
        texts
            .iter()
            .flat_map(|text| documents(text))
            .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole")
            .collect()
    }

    #[test]
    fn the_operator_holds_every_permission_it_grants_to_operands() {
        let chart = rendered(&[]);
        let cluster_rules = rules_of(&chart, "ClusterRole", "gpu-operator");
        let mut namespace_rules = rules_of(&chart, "Role", "gpu-operator");
        // In its namespace the operator holds its Role's rules and its ClusterRole's.
        namespace_rules.extend(cluster_rules.iter().cloned());
        let roles = operand_roles();
        let names: std::collections::BTreeSet<&str> = roles
            .iter()
            .filter_map(|r| r["metadata"]["name"].as_str())
            .collect();
        for expected in [
            "nvidia-driver",
            "nvidia-sandbox-device-plugin",
            "nvidia-cc-manager",
            "nvidia-dcgm-exporter-read-pods",
        ] {
            assert!(
                names.contains(expected),
                "no operand role {expected} among {names:?}"
            );
        }
        let mut missing = std::collections::BTreeSet::new();
        for role in &roles {
            let held = if role["kind"] == "ClusterRole" {
                &cluster_rules
            } else {
                &namespace_rules
            };
            for rule in role["rules"].as_array().into_iter().flatten() {
                for permission in permissions(rule) {
                    if !holds(held, &permission) {
                        missing.insert(format!(
                            "{} {}: {permission:?}",
                            role["kind"].as_str().unwrap_or_default(),
                            role["metadata"]["name"].as_str().unwrap_or_default()
                        ));
                    }
                }
            }
        }
        assert!(
            missing.is_empty(),
            "the chart's RBAC lacks permissions the operator grants (the API server would refuse to write \
             these roles):\n{}",
            missing.into_iter().collect::<Vec<_>>().join("\n")
        );
    }

    #[test]
    fn a_permission_is_held_only_by_a_rule_that_names_it() {
        let rule = serde_json::json!({"apiGroups": [""], "resources": ["leases"], "verbs": ["get"], "resourceNames": ["a"]});
        let held = [rule];
        let get = |name: Option<&str>| {
            (
                String::new(),
                "leases".to_owned(),
                "get".to_owned(),
                name.map(str::to_owned),
            )
        };
        assert!(holds(&held, &get(Some("a"))));
        assert!(!holds(&held, &get(Some("b"))));
        assert!(!holds(&held, &get(None)));
    }
}
