//! Whole-crate tests of rendering: golden files for the shipped samples under several clusters, and the
//! rules a user would notice, one test each.
//!
//! Golden files live in `tests/golden/`; regenerate them with `UPDATE_GOLDEN=1 cargo test -p gpuop-render`
//! and read the diff: it is what changed for users.

/// Policies and facts, as the tests build them.
mod fixtures {
    use gpuop_api::{
        ClusterPolicy, ImageDefaults, NVIDIADriver, ValidatedDriver, ValidatedPolicy, validate,
        validate_driver_with,
    };
    use gpuop_render::{
        ClusterFacts, ContainerRuntime, Manifest, NvidiaDriverFacts, OsPool, Rendered, render,
        render_nvidia_driver,
    };
    use serde_json::Value;

    /// The default sample policy (NVIDIA's Helm defaults).
    pub const DEFAULT_POLICY: &str = include_str!("../../../deploy/samples/clusterpolicy.yaml");

    /// The ClusterPolicy documents of a manifest (other kinds, like a sample's ConfigMap, are skipped).
    pub fn cluster_policies(text: &str) -> Vec<ClusterPolicy> {
        serde_saphyr::from_multiple::<Value>(text)
            .unwrap()
            .into_iter()
            .filter(|doc| doc["kind"] == "ClusterPolicy")
            .map(|doc| serde_json::from_value(doc).unwrap())
            .collect()
    }

    /// The default sample with a YAML fragment merged over its spec.
    pub fn tweaked(patch: &str) -> ValidatedPolicy {
        let mut value: Value = serde_saphyr::from_str(DEFAULT_POLICY).unwrap();
        let patch: Value = serde_saphyr::from_str(patch).unwrap();
        merge(&mut value["spec"], patch);
        let policy: ClusterPolicy = serde_json::from_value(value).unwrap();
        validate(&policy).unwrap_or_else(|errors| panic!("{errors:#?}"))
    }

    /// The default sample, validated.
    pub fn default_policy() -> ValidatedPolicy {
        tweaked("{}")
    }

    fn merge(target: &mut Value, patch: Value) {
        match (target, patch) {
            (Value::Object(target), Value::Object(patch)) => {
                for (key, value) in patch {
                    merge(target.entry(key).or_insert(Value::Null), value);
                }
            }
            (target, patch) => *target = patch,
        }
    }

    /// Cluster facts, built up.
    #[derive(Clone, Debug)]
    pub struct Facts(pub ClusterFacts);

    impl Facts {
        /// Ubuntu 22.04 GPU nodes on containerd, no Prometheus Operator.
        pub fn ubuntu() -> Self {
            Self(ClusterFacts {
                namespace: "gpu-operator".into(),
                runtime: ContainerRuntime::Containerd,
                driver_pools: vec![pool("ubuntu", "22.04", None)],
                service_monitor_crd: false,
                config_map_keys: Default::default(),
            })
        }

        pub fn runtime(mut self, runtime: ContainerRuntime) -> Self {
            self.0.runtime = runtime;
            self
        }

        pub fn pools(mut self, pools: Vec<OsPool>) -> Self {
            self.0.driver_pools = pools;
            self
        }

        pub fn service_monitors(mut self) -> Self {
            self.0.service_monitor_crd = true;
            self
        }

        pub fn config_map(mut self, name: &str, keys: &[&str]) -> Self {
            self.0
                .config_map_keys
                .insert(name.into(), keys.iter().map(|k| (*k).to_owned()).collect());
            self
        }
    }

    pub fn pool(os_id: &str, os_version: &str, kernel: Option<&str>) -> OsPool {
        OsPool {
            os_id: os_id.into(),
            os_version: os_version.into(),
            kernel: kernel.map(str::to_owned),
        }
    }

    /// Renders, expecting success.
    pub fn rendered(policy: &ValidatedPolicy, facts: &Facts) -> Rendered {
        render(policy, &facts.0).unwrap_or_else(|error| panic!("{error}"))
    }

    /// The object of this kind and name; fails the test if it is missing.
    pub fn object<'a>(rendered: &'a Rendered, kind: &str, name: &str) -> &'a Value {
        &rendered
            .find(kind, name)
            .unwrap_or_else(|| panic!("no {kind} {name} in {:#?}", names(rendered)))
            .object
    }

    /// `Kind/name` of every object, in order.
    pub fn names(rendered: &Rendered) -> Vec<String> {
        rendered
            .objects
            .iter()
            .map(|m| format!("{}/{}", m.kind(), m.name()))
            .collect()
    }

    /// The DaemonSets.
    pub fn daemonsets(rendered: &Rendered) -> Vec<&Manifest> {
        rendered
            .objects
            .iter()
            .filter(|m| m.kind() == "DaemonSet")
            .collect()
    }

    /// A container (or init container) of a DaemonSet by name.
    pub fn container<'a>(daemonset: &'a Value, name: &str) -> &'a Value {
        let spec = &daemonset["spec"]["template"]["spec"];
        spec["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(spec["containers"].as_array().into_iter().flatten())
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no container {name} in {}", daemonset["metadata"]["name"]))
    }

    /// Names of a DaemonSet's init containers, in order.
    pub fn init_names(daemonset: &Value) -> Vec<&str> {
        daemonset["spec"]["template"]["spec"]["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["name"].as_str().unwrap())
            .collect()
    }

    /// Names of a DaemonSet's containers, in order.
    pub fn container_names(daemonset: &Value) -> Vec<&str> {
        daemonset["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect()
    }

    /// A container's literal environment variable, if set.
    pub fn env<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
        container["env"]
            .as_array()?
            .iter()
            .find(|var| var["name"] == name)
            .and_then(|var| var["value"].as_str())
    }

    /// A DaemonSet's pod spec.
    pub fn pod(daemonset: &Value) -> &Value {
        &daemonset["spec"]["template"]["spec"]
    }

    /// The NVIDIADriver samples shipped with the operator.
    pub const DRIVER_SAMPLES: &str = include_str!("../../../deploy/samples/nvidiadrivers.yaml");

    /// The NVIDIADriver documents of a manifest, each with a uid (samples have none; the API server gives
    /// one) derived from its name.
    pub fn nvidia_drivers(text: &str) -> Vec<NVIDIADriver> {
        serde_saphyr::from_multiple::<Value>(text)
            .unwrap()
            .into_iter()
            .filter(|doc| doc["kind"] == "NVIDIADriver")
            .map(|doc| {
                let mut driver: NVIDIADriver = serde_json::from_value(doc).unwrap();
                if driver.metadata.uid.is_none() {
                    driver.metadata.uid =
                        Some(format!("uid-of-{}", driver.metadata.name.as_deref().unwrap()));
                }
                driver
            })
            .collect()
    }

    /// Image defaults from the operator's environment, as the tests' operator has them.
    pub fn image_defaults() -> ImageDefaults {
        ImageDefaults::from_pairs([(
            "DRIVER_MANAGER_IMAGE",
            "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
        )])
    }

    /// A sample NVIDIADriver by name, with a YAML fragment merged over its spec, validated.
    pub fn sample_driver(name: &str, patch: &str) -> ValidatedDriver {
        let driver = nvidia_drivers(DRIVER_SAMPLES)
            .into_iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
            .unwrap();
        let mut value = serde_json::to_value(&driver).unwrap();
        merge(&mut value["spec"], serde_saphyr::from_str(patch).unwrap());
        let driver: NVIDIADriver = serde_json::from_value(value).unwrap();
        validate_driver_with(&driver, &image_defaults()).unwrap_or_else(|errors| panic!("{errors:#?}"))
    }

    /// NVIDIADriver facts: Ubuntu 22.04 nodes routed to it, containerd, host root `/`.
    pub fn driver_facts(pools: Vec<OsPool>) -> NvidiaDriverFacts {
        NvidiaDriverFacts {
            namespace: "gpu-operator".into(),
            runtime: ContainerRuntime::Containerd,
            pools,
            host_root: "/".into(),
            config_map_keys: Default::default(),
        }
    }

    /// Renders an NVIDIADriver, expecting success.
    pub fn rendered_driver(driver: &ValidatedDriver, facts: &NvidiaDriverFacts) -> Rendered {
        render_nvidia_driver(driver, facts).unwrap_or_else(|error| panic!("{error}"))
    }
}

/// Every sample policy under several clusters, compared with the committed golden files.
mod golden {
    use std::path::{Path, PathBuf};

    use gpuop_api::{validate, validate_driver_with};
    use gpuop_render::{ClusterFacts, NvidiaDriverFacts, render, render_nvidia_driver};

    use crate::fixtures::{cluster_policies, image_defaults, nvidia_drivers};

    /// (policy file relative to the crate, facts file in testdata/facts).
    const CASES: &[(&str, &str)] = &[
        ("../../deploy/samples/clusterpolicy.yaml", "containerd-ubuntu"),
        ("../../deploy/samples/clusterpolicy.yaml", "crio-rhel"),
        ("../../deploy/samples/clusterpolicy.yaml", "two-os-pools"),
        ("../../deploy/samples/clusterpolicy.yaml", "no-gpu-nodes"),
        (
            "../../deploy/samples/clusterpolicy-mig-mixed-time-slicing.yaml",
            "containerd-ubuntu",
        ),
        (
            "../../deploy/samples/clusterpolicy-preinstalled-driver.yaml",
            "crio-rhel",
        ),
        ("tests/testdata/policies/precompiled.yaml", "precompiled-kernels"),
        ("tests/testdata/policies/sandbox-kubevirt.yaml", "two-os-pools"),
    ];

    fn crate_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// The golden text of one case: each object as a YAML document, headed by its state and operand.
    fn golden_text(policy_path: &str, facts_name: &str) -> String {
        let dir = crate_dir();
        let policy_text = std::fs::read_to_string(dir.join(policy_path)).unwrap();
        let facts_text =
            std::fs::read_to_string(dir.join(format!("tests/testdata/facts/{facts_name}.yaml"))).unwrap();
        let facts: ClusterFacts = serde_saphyr::from_str(&facts_text).unwrap();
        let mut text = format!(
            "# Rendered from {policy_path} with tests/testdata/facts/{facts_name}.yaml.\n\
             # Regenerate: UPDATE_GOLDEN=1 cargo test -p gpuop-render\n"
        );
        for policy in cluster_policies(&policy_text) {
            let validated = validate(&policy).unwrap_or_else(|errors| panic!("{policy_path}: {errors:#?}"));
            let rendered =
                render(&validated, &facts).unwrap_or_else(|error| panic!("{policy_path}: {error}"));
            for manifest in &rendered.objects {
                let operand = manifest.operand.map_or("-".to_owned(), |o| o.to_string());
                text.push_str(&format!("---\n# {} / {operand}\n", manifest.state));
                text.push_str(&serde_saphyr::to_string(&manifest.object).unwrap());
            }
        }
        text
    }

    fn golden_path(policy_path: &str, facts_name: &str) -> PathBuf {
        let stem = Path::new(policy_path).file_stem().unwrap().to_str().unwrap();
        crate_dir().join(format!("tests/golden/{stem}--{facts_name}.yaml"))
    }

    /// (NVIDIADriver file relative to the crate, NVIDIADriver name, facts file in
    /// testdata/nvidiadriver-facts).
    const DRIVER_CASES: &[(&str, &str, &str)] = &[
        ("../../deploy/samples/nvidiadrivers.yaml", "default", "ubuntu"),
        (
            "../../deploy/samples/nvidiadrivers.yaml",
            "default",
            "two-os-pools",
        ),
        ("../../deploy/samples/nvidiadrivers.yaml", "h100-pool", "ubuntu"),
        (
            "../../deploy/samples/nvidiadrivers.yaml",
            "l4-inference",
            "precompiled-kernels",
        ),
        (
            "tests/testdata/nvidiadrivers/full-spec.yaml",
            "full-spec",
            "custom-root",
        ),
        (
            "tests/testdata/nvidiadrivers/full-spec.yaml",
            "vgpu-hosts",
            "ubuntu",
        ),
    ];

    /// The golden text of one NVIDIADriver case, in the same form as a policy's.
    fn driver_golden_text(driver_path: &str, name: &str, facts_name: &str) -> String {
        let dir = crate_dir();
        let text = std::fs::read_to_string(dir.join(driver_path)).unwrap();
        let facts_text =
            std::fs::read_to_string(dir.join(format!("tests/testdata/nvidiadriver-facts/{facts_name}.yaml")))
                .unwrap();
        let facts: NvidiaDriverFacts = serde_saphyr::from_str(&facts_text).unwrap();
        let driver = nvidia_drivers(&text)
            .into_iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no NVIDIADriver {name} in {driver_path}"));
        let validated = validate_driver_with(&driver, &image_defaults())
            .unwrap_or_else(|errors| panic!("{name}: {errors:#?}"));
        let rendered =
            render_nvidia_driver(&validated, &facts).unwrap_or_else(|error| panic!("{name}: {error}"));
        let mut text = format!(
            "# Rendered from NVIDIADriver {name} in {driver_path} with \
             tests/testdata/nvidiadriver-facts/{facts_name}.yaml.\n\
             # Regenerate: UPDATE_GOLDEN=1 cargo test -p gpuop-render\n"
        );
        for manifest in &rendered.objects {
            let operand = manifest.operand.map_or("-".to_owned(), |o| o.to_string());
            text.push_str(&format!("---\n# {} / {operand}\n", manifest.state));
            text.push_str(&serde_saphyr::to_string(&manifest.object).unwrap());
        }
        text
    }

    fn driver_golden_path(name: &str, facts_name: &str) -> PathBuf {
        crate_dir().join(format!("tests/golden/nvidiadriver-{name}--{facts_name}.yaml"))
    }

    /// Every case's golden path and rendered text.
    fn all_cases() -> Vec<(PathBuf, String)> {
        CASES
            .iter()
            .map(|(policy, facts)| (golden_path(policy, facts), golden_text(policy, facts)))
            .chain(DRIVER_CASES.iter().map(|(file, name, facts)| {
                (
                    driver_golden_path(name, facts),
                    driver_golden_text(file, name, facts),
                )
            }))
            .collect()
    }

    #[test]
    fn rendered_samples_match_the_golden_files() {
        let update = std::env::var_os("UPDATE_GOLDEN").is_some();
        let mut stale = Vec::new();
        for (path, text) in all_cases() {
            if update {
                std::fs::write(&path, &text).unwrap();
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "rendered output differs from {stale:#?}; if the change is intended, run \
             `UPDATE_GOLDEN=1 cargo test -p gpuop-render` and review the diff"
        );
    }

    #[test]
    fn golden_text_is_valid_yaml_with_one_object_per_document() {
        for (path, text) in all_cases() {
            let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
            assert!(documents.len() > 6, "{}", path.display());
            for document in documents {
                assert!(document["apiVersion"].is_string() && document["kind"].is_string());
            }
        }
    }

    #[test]
    fn every_golden_file_belongs_to_a_case() {
        let expected: Vec<PathBuf> = all_cases().into_iter().map(|(path, _)| path).collect();
        for entry in std::fs::read_dir(crate_dir().join("tests/golden")).unwrap() {
            let path = entry.unwrap().path();
            assert!(
                expected.contains(&path),
                "{} is not rendered by any case",
                path.display()
            );
        }
    }
}

/// Which objects a policy renders, and what every object carries.
mod objects {
    use gpuop_api::labels::{COMPONENT, MANAGED_BY, MANAGED_BY_VALUE};
    use gpuop_api::{OPERANDS, Operand};
    use gpuop_render::render;

    use crate::fixtures::*;

    #[test]
    fn a_disabled_operand_renders_nothing() {
        let facts = Facts::ubuntu();
        let all = rendered(&default_policy(), &facts);
        assert!(
            all.objects
                .iter()
                .any(|m| m.operand == Some(Operand::GpuFeatureDiscovery))
        );
        let without = rendered(&tweaked("{gfd: {enabled: false}}"), &facts);
        assert!(
            without
                .objects
                .iter()
                .all(|m| m.operand != Some(Operand::GpuFeatureDiscovery)),
            "{:#?}",
            names(&without)
        );
        assert!(without.find("DaemonSet", "gpu-feature-discovery").is_none());
        assert!(
            without
                .find("ServiceAccount", "nvidia-gpu-feature-discovery")
                .is_none()
        );
        // Everything else is unchanged.
        let others = |r: &gpuop_render::Rendered| -> Vec<serde_json::Value> {
            r.objects
                .iter()
                .filter(|m| m.operand != Some(Operand::GpuFeatureDiscovery))
                .map(|m| m.object.clone())
                .collect()
        };
        assert_eq!(others(&all), others(&without));

        let no_driver = rendered(&tweaked("{driver: {enabled: false}}"), &facts);
        assert!(no_driver.objects.iter().all(|m| m.state != "state-driver"));
        // The driver belongs to NVIDIADriver objects when useNvidiaDriverCRD is set.
        let crd = rendered(&tweaked("{driver: {useNvidiaDriverCRD: true}}"), &facts);
        assert!(crd.objects.iter().all(|m| m.operand != Some(Operand::Driver)));
    }

    #[test]
    fn states_come_in_nvidias_order_with_rbac_before_daemonsets() {
        let rendered = rendered(&default_policy(), &Facts::ubuntu());
        let mut states: Vec<&str> = rendered.objects.iter().map(|m| m.state).collect();
        states.dedup();
        assert_eq!(
            states,
            [
                "pre-requisites",
                "state-operator-metrics",
                "state-driver",
                "state-container-toolkit",
                "state-operator-validation",
                "state-device-plugin",
                "state-mps-control-daemon",
                "state-dcgm-exporter",
                "gpu-feature-discovery",
                "state-mig-manager",
            ]
        );
        for state in &states {
            let kinds: Vec<&str> = rendered
                .objects
                .iter()
                .filter(|m| m.state == *state)
                .map(|m| m.kind())
                .collect();
            if let Some(ds) = kinds.iter().position(|k| *k == "DaemonSet") {
                assert!(
                    kinds[ds..].iter().all(|k| *k == "DaemonSet"),
                    "{state}: {kinds:?}"
                );
                assert_eq!(kinds[0], "ServiceAccount", "{state}");
            }
        }
    }

    #[test]
    fn every_object_is_labelled_managed_by_and_component_and_namespaced_when_namespaced() {
        let policies = [
            default_policy(),
            tweaked("{dcgm: {enabled: true}, nodeStatusExporter: {enabled: true}}"),
        ];
        for policy in &policies {
            let rendered = rendered(policy, &Facts::ubuntu().service_monitors());
            for manifest in &rendered.objects {
                let labels = &manifest.object["metadata"]["labels"];
                assert_eq!(labels[MANAGED_BY], MANAGED_BY_VALUE, "{}", manifest.name());
                let expected = manifest.operand.map_or("gpu-operator", |o| o.info().component);
                assert_eq!(labels[COMPONENT], expected, "{}", manifest.name());
                let cluster_scoped =
                    ["RuntimeClass", "ClusterRole", "ClusterRoleBinding"].contains(&manifest.kind());
                assert_eq!(
                    manifest.object["metadata"]["namespace"].as_str(),
                    (!cluster_scoped).then_some("gpu-operator"),
                    "{}/{}",
                    manifest.kind(),
                    manifest.name()
                );
                if manifest.kind() == "DaemonSet" {
                    // Our labels stay on the object: the pod template is labelled as NVIDIA labels it
                    // (only the driver's pods carry a component), so adopting NVIDIA's DaemonSets
                    // restarts no pod.
                    let pod_labels = &manifest.object["spec"]["template"]["metadata"]["labels"];
                    let driver = manifest.operand == Some(gpuop_api::Operand::Driver);
                    assert_eq!(
                        pod_labels[COMPONENT].as_str(),
                        driver.then_some(expected),
                        "{}",
                        manifest.name()
                    );
                }
            }
        }
    }

    #[test]
    fn output_is_deterministic_whatever_the_order_of_the_facts() {
        let policy = tweaked("{driver: {repoConfig: {configMapName: repos}}}");
        let facts = Facts::ubuntu()
            .pools(vec![pool("ubuntu", "22.04", None), pool("rhel", "9.4", None)])
            .config_map("repos", &["cuda.list", "b.list", "a.list"]);
        let reordered = Facts::ubuntu()
            .pools(vec![pool("rhel", "9.4", None), pool("ubuntu", "22.04", None)])
            .config_map("repos", &["a.list", "cuda.list", "b.list"]);
        let first = rendered(&policy, &facts);
        assert_eq!(first, rendered(&policy, &facts));
        assert_eq!(first, rendered(&policy, &reordered));
        let yaml = |r: &gpuop_render::Rendered| -> Vec<String> {
            r.objects
                .iter()
                .map(|m| serde_json::to_string(&m.object).unwrap())
                .collect()
        };
        assert_eq!(yaml(&first), yaml(&rendered(&policy, &reordered)));
    }

    #[test]
    fn every_daemonset_runs_under_a_rendered_account_bound_to_its_roles() {
        let policy = tweaked(
            "{dcgm: {enabled: true}, nodeStatusExporter: {enabled: true},
              sandboxWorkloads: {enabled: true}, vgpuManager: {enabled: true, repository: r, image: vgpu, version: '1'}}",
        );
        let rendered = rendered(&policy, &Facts::ubuntu());
        for ds in daemonsets(&rendered) {
            let account = pod(&ds.object)["serviceAccountName"].as_str().unwrap();
            rendered
                .find("ServiceAccount", account)
                .unwrap_or_else(|| panic!("{} runs as missing account {account}", ds.name()));
            let binding = object(&rendered, "RoleBinding", account);
            assert_eq!(binding["subjects"][0]["name"], account);
            assert_eq!(binding["subjects"][0]["namespace"], "gpu-operator");
            assert_eq!(binding["roleRef"]["name"], account);
        }
    }

    #[test]
    fn daemonset_names_and_deploy_labels_come_from_the_catalogue() {
        let policy = tweaked(
            "{dcgm: {enabled: true}, nodeStatusExporter: {enabled: true},
              sandboxWorkloads: {enabled: true}, ccManager: {enabled: true}}",
        );
        let rendered = rendered(&policy, &Facts::ubuntu());
        for info in OPERANDS.iter().filter(|info| (info.enabled)(&policy.spec)) {
            let ds = object(&rendered, "DaemonSet", info.daemonset);
            let selector = &pod(ds)["nodeSelector"];
            assert_eq!(selector[info.deploy_label], "true", "{}", info.id);
            for (key, value) in info.extra_node_selector {
                assert_eq!(selector[*key], *value, "{}", info.id);
            }
        }
    }

    #[test]
    fn service_monitors_need_the_crd_and_for_the_exporter_its_switch() {
        let policy = default_policy(); // dcgmExporter.serviceMonitor.enabled: true
        let without_crd = rendered(&policy, &Facts::ubuntu());
        assert!(without_crd.objects.iter().all(|m| m.kind() != "ServiceMonitor"));
        let with_crd = rendered(&policy, &Facts::ubuntu().service_monitors());
        let monitor = object(&with_crd, "ServiceMonitor", "nvidia-dcgm-exporter");
        assert_eq!(monitor["spec"]["endpoints"][0]["interval"], "15s");
        assert_eq!(monitor["spec"]["endpoints"][0]["scrapeTimeout"], "10s");
        assert_eq!(
            monitor["spec"]["namespaceSelector"]["matchNames"][0],
            "gpu-operator"
        );
        assert!(with_crd.find("ServiceMonitor", "gpu-operator").is_some());

        let off = tweaked(
            "{dcgmExporter: {serviceMonitor: {enabled: false}}, operator: {metrics: {serviceMonitor: {enabled: false}}}}",
        );
        let rendered = rendered(&off, &Facts::ubuntu().service_monitors());
        assert!(rendered.objects.iter().all(|m| m.kind() != "ServiceMonitor"));
        // The exporter's Service stays: something else may scrape it.
        assert!(rendered.find("Service", "nvidia-dcgm-exporter").is_some());
    }

    #[test]
    fn default_mig_config_maps_only_without_custom_names() {
        let facts = Facts::ubuntu();
        let default = rendered(&default_policy(), &facts);
        assert!(default.find("ConfigMap", "default-mig-parted-config").is_some());
        assert!(default.find("ConfigMap", "default-gpu-clients").is_some());
        let manager = object(&default, "DaemonSet", "nvidia-mig-manager");
        let ctr = container(manager, "nvidia-mig-manager");
        assert_eq!(
            env(ctr, "DEFAULT_CONFIG_FILE"),
            Some("/mig-parted-config/config-default.yaml")
        );
        assert_eq!(env(ctr, "CONFIG_FILE"), None);

        let custom = rendered(
            &tweaked("{migManager: {config: {name: my-layouts}, gpuClientsConfig: {name: my-clients}}}"),
            &facts,
        );
        assert!(custom.find("ConfigMap", "default-mig-parted-config").is_none());
        assert!(custom.find("ConfigMap", "default-gpu-clients").is_none());
        let manager = object(&custom, "DaemonSet", "nvidia-mig-manager");
        let ctr = container(manager, "nvidia-mig-manager");
        assert_eq!(env(ctr, "CONFIG_FILE"), Some("/mig-parted-config/config.yaml"));
        assert_eq!(env(ctr, "DEFAULT_CONFIG_FILE"), None);
        let volumes = pod(manager)["volumes"].as_array().unwrap();
        let volume = |name: &str| volumes.iter().find(|v| v["name"] == name).unwrap();
        assert_eq!(volume("mig-parted-config")["configMap"]["name"], "my-layouts");
        assert!(volume("mig-parted-config")["configMap"]["items"].is_null());
        assert_eq!(volume("gpu-clients")["configMap"]["name"], "my-clients");
    }

    #[test]
    fn dcgm_host_engine_gets_a_local_service_and_the_exporter_connects_to_it() {
        let facts = Facts::ubuntu();
        let without = rendered(&default_policy(), &facts);
        let exporter = object(&without, "DaemonSet", "nvidia-dcgm-exporter");
        assert_eq!(
            env(
                container(exporter, "nvidia-dcgm-exporter"),
                "DCGM_REMOTE_HOSTENGINE_INFO"
            ),
            None
        );
        let with = rendered(&tweaked("{dcgm: {enabled: true}}"), &facts);
        let service = object(&with, "Service", "nvidia-dcgm");
        assert_eq!(service["spec"]["internalTrafficPolicy"], "Local");
        assert_eq!(service["spec"]["ports"][0]["port"], 5555);
        let exporter = object(&with, "DaemonSet", "nvidia-dcgm-exporter");
        assert_eq!(
            env(
                container(exporter, "nvidia-dcgm-exporter"),
                "DCGM_REMOTE_HOSTENGINE_INFO"
            ),
            Some("nvidia-dcgm:5555")
        );
    }

    #[test]
    fn exporter_reads_pods_only_when_metrics_carry_pod_metadata() {
        let facts = Facts::ubuntu();
        let plain = rendered(&default_policy(), &facts);
        assert!(
            plain
                .find("ClusterRole", "nvidia-dcgm-exporter-read-pods")
                .is_none()
        );
        assert_eq!(
            pod(object(&plain, "DaemonSet", "nvidia-dcgm-exporter"))["automountServiceAccountToken"],
            false
        );
        for patch in [
            "{dcgmExporter: {enablePodLabels: true}}",
            "{dcgmExporter: {env: [{name: DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID, value: 'True'}]}}",
        ] {
            let rendered = rendered(&tweaked(patch), &facts);
            let binding = object(&rendered, "ClusterRoleBinding", "nvidia-dcgm-exporter-read-pods");
            assert_eq!(binding["subjects"][0]["name"], "nvidia-dcgm-exporter", "{patch}");
            assert_eq!(
                pod(object(&rendered, "DaemonSet", "nvidia-dcgm-exporter"))["automountServiceAccountToken"],
                true,
                "{patch}"
            );
        }
    }

    #[test]
    fn render_refuses_a_policy_whose_images_were_not_resolved() {
        let mut policy = default_policy();
        policy.images.remove(&gpuop_api::ImageSection::DevicePlugin);
        assert_eq!(
            render(&policy, &Facts::ubuntu().0),
            Err(gpuop_render::RenderError::ImageMissing {
                section: gpuop_api::ImageSection::DevicePlugin,
                operand: Operand::DevicePlugin
            })
        );
    }
}

/// The settings every operand DaemonSet shares.
mod daemonsets {
    use gpuop_api::OPERANDS;
    use gpuop_api::labels::VALIDATIONS_DIR;
    use serde_json::json;

    use crate::fixtures::*;

    #[test]
    fn the_gpu_taint_is_tolerated_unless_the_policy_lists_tolerations_which_replace_it() {
        let default = rendered(&tweaked("{daemonsets: {tolerations: []}}"), &Facts::ubuntu());
        for ds in daemonsets(&default) {
            assert_eq!(
                pod(&ds.object)["tolerations"],
                json!([{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]),
                "{}",
                ds.name()
            );
        }
        let custom = rendered(
            &tweaked(
                "{daemonsets: {tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoExecute}]}}",
            ),
            &Facts::ubuntu(),
        );
        for ds in daemonsets(&custom) {
            assert_eq!(
                pod(&ds.object)["tolerations"],
                json!([{"effect": "NoExecute", "key": "dedicated", "operator": "Equal", "value": "gpu"}]),
                "{}",
                ds.name()
            );
        }
    }

    #[test]
    fn priority_class_defaults_to_system_node_critical() {
        for (patch, expected) in [
            ("{daemonsets: {priorityClassName: ''}}", "system-node-critical"),
            ("{daemonsets: {priorityClassName: gpu-critical}}", "gpu-critical"),
        ] {
            let rendered = rendered(&tweaked(patch), &Facts::ubuntu());
            for ds in daemonsets(&rendered) {
                assert_eq!(pod(&ds.object)["priorityClassName"], expected, "{}", ds.name());
            }
        }
    }

    #[test]
    fn the_driver_is_always_on_delete_and_the_others_follow_the_policy() {
        let facts = Facts::ubuntu();
        let rolling = rendered(
            &tweaked("{daemonsets: {updateStrategy: RollingUpdate, rollingUpdate: {maxUnavailable: '20%'}}}"),
            &facts,
        );
        for ds in daemonsets(&rolling) {
            let strategy = &ds.object["spec"]["updateStrategy"];
            if ds.name().starts_with("nvidia-driver-daemonset") {
                assert_eq!(*strategy, json!({"type": "OnDelete"}));
            } else {
                assert_eq!(
                    *strategy,
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "20%"}}),
                    "{}",
                    ds.name()
                );
            }
        }
        let count = rendered(
            &tweaked("{daemonsets: {rollingUpdate: {maxUnavailable: '3'}}}"),
            &facts,
        );
        let plugin = object(&count, "DaemonSet", "nvidia-device-plugin-daemonset");
        assert_eq!(
            plugin["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
            3
        );
        let on_delete = rendered(&tweaked("{daemonsets: {updateStrategy: OnDelete}}"), &facts);
        for ds in daemonsets(&on_delete) {
            assert_eq!(
                ds.object["spec"]["updateStrategy"],
                json!({"type": "OnDelete"}),
                "{}",
                ds.name()
            );
        }
    }

    #[test]
    fn policy_labels_and_annotations_reach_pods_but_never_selector_keys() {
        let policy = tweaked(
            "{daemonsets: {labels: {team: ml, app: hijack, app.kubernetes.io/part-of: other,
                                    app.kubernetes.io/component: other},
                           annotations: {owner: ml-platform}}}",
        );
        let rendered = rendered(&policy, &Facts::ubuntu());
        let plain = rendered_default();
        for ds in daemonsets(&rendered) {
            let template = &ds.object["spec"]["template"]["metadata"];
            assert_eq!(template["labels"]["team"], "ml", "{}", ds.name());
            assert_eq!(template["annotations"]["owner"], "ml-platform", "{}", ds.name());
            assert_ne!(template["labels"]["app"], "hijack", "{}", ds.name());
            assert_ne!(
                template["labels"]["app.kubernetes.io/part-of"],
                "other",
                "{}",
                ds.name()
            );
            // As in NVIDIA's operator, the policy's labels reach pod templates; only the driver's own
            // component label, by which its pods are found, wins over them.
            let expected = if ds.name().starts_with("nvidia-driver-daemonset") {
                "nvidia-driver"
            } else {
                "other"
            };
            assert_eq!(
                template["labels"]["app.kubernetes.io/component"],
                expected,
                "{}",
                ds.name()
            );
            assert_ne!(
                ds.object["metadata"]["labels"]["app.kubernetes.io/component"],
                "other"
            );
            assert_eq!(ds.object["metadata"]["labels"]["team"], "ml");
            assert_eq!(ds.object["metadata"]["annotations"]["owner"], "ml-platform");
            // A selector cannot change, so labels in the policy never reach it.
            let before = object(&plain, "DaemonSet", ds.name());
            assert_eq!(
                ds.object["spec"]["selector"],
                before["spec"]["selector"],
                "{}",
                ds.name()
            );
            let selector = ds.object["spec"]["selector"]["matchLabels"].as_object().unwrap();
            for (key, value) in selector {
                assert_eq!(
                    &template["labels"][key],
                    value,
                    "{} pods must match their selector",
                    ds.name()
                );
            }
            assert_eq!(
                template["labels"]["app"],
                selector.get("app").cloned().unwrap_or(ds.name().into())
            );
        }
    }

    fn rendered_default() -> gpuop_render::Rendered {
        rendered(&default_policy(), &Facts::ubuntu())
    }

    #[test]
    fn pods_wait_for_the_status_files_the_catalogue_lists() {
        let policy = tweaked("{dcgm: {enabled: true}}");
        let rendered = rendered(&policy, &Facts::ubuntu());
        for info in OPERANDS.iter().filter(|info| (info.enabled)(&policy.spec)) {
            let ds = object(&rendered, "DaemonSet", info.daemonset);
            let inits = init_names(ds);
            for file in info.waits_for {
                // NVIDIA's MIG manager waits for the driver in its entrypoint script, not an init container.
                if info.operand == gpuop_api::Operand::MigManager && *file == "driver-ready" {
                    continue;
                }
                let name = format!("{}-validation", file.trim_end_matches("-ready"));
                assert!(
                    inits.contains(&name.as_str()),
                    "{} lacks {name}: {inits:?}",
                    info.id
                );
                let wait = container(ds, &name);
                let mount = wait["volumeMounts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    // NVIDIA's assets mount the directory, or `/run/nvidia` above it.
                    .find(|m| m["mountPath"] == VALIDATIONS_DIR || m["mountPath"] == "/run/nvidia")
                    .unwrap_or_else(|| panic!("{} {name} does not mount {VALIDATIONS_DIR}", info.id));
                assert!(
                    ["HostToContainer", "Bidirectional"]
                        .contains(&mount["mountPropagation"].as_str().unwrap()),
                    "{}",
                    info.id
                );
                let volume = pod(ds)["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|v| v["name"] == mount["name"])
                    .unwrap();
                assert_eq!(volume["hostPath"]["path"], mount["mountPath"]);
                assert_eq!(
                    wait["image"], "nvcr.io/nvidia/gpu-operator:v26.7.0",
                    "{}",
                    info.id
                );
            }
        }
        // The device plugin cannot start before the toolkit works; its wait comes first.
        let plugin = object(&rendered, "DaemonSet", "nvidia-device-plugin-daemonset");
        assert_eq!(init_names(plugin)[0], "toolkit-validation");
        let script = container(plugin, "toolkit-validation")["args"][0]
            .as_str()
            .unwrap();
        assert!(
            script.contains("[ -f /run/nvidia/validations/toolkit-ready ]"),
            "{script}"
        );
    }

    #[test]
    fn images_pull_policies_and_secrets_come_from_the_policy() {
        let policy = tweaked(
            "{devicePlugin: {repository: registry.local/nv, image: plugin, version: '1.2', imagePullPolicy: Always,
                             imagePullSecrets: [plugin-pull]},
              validator: {imagePullSecrets: [validator-pull]},
              gfd: {version: sha256:0123abcd}}",
        );
        let rendered = rendered(&policy, &Facts::ubuntu());
        let plugin = object(&rendered, "DaemonSet", "nvidia-device-plugin-daemonset");
        let main = container(plugin, "nvidia-device-plugin");
        assert_eq!(main["image"], "registry.local/nv/plugin:1.2");
        assert_eq!(main["imagePullPolicy"], "Always");
        assert_eq!(
            pod(plugin)["imagePullSecrets"],
            json!([{"name": "validator-pull"}, {"name": "plugin-pull"}])
        );
        let gfd = object(&rendered, "DaemonSet", "gpu-feature-discovery");
        assert_eq!(
            container(gfd, "gpu-feature-discovery")["image"],
            "nvcr.io/nvidia/k8s-device-plugin@sha256:0123abcd"
        );
        assert_eq!(
            container(gfd, "gpu-feature-discovery")["imagePullPolicy"],
            "IfNotPresent"
        );
    }

    #[test]
    fn section_resources_args_env_and_host_network_reach_the_main_container() {
        let policy = tweaked(
            "{gfd: {args: [--oneshot], env: [{name: GFD_SLEEP_INTERVAL, value: 10s}, {name: EXTRA, value: x}],
                    resources: {limits: {memory: 100Mi}}, hostNetwork: true}}",
        );
        let rendered = rendered(&policy, &Facts::ubuntu());
        let gfd = object(&rendered, "DaemonSet", "gpu-feature-discovery");
        let main = container(gfd, "gpu-feature-discovery");
        assert_eq!(main["args"], json!(["--oneshot"]));
        assert_eq!(env(main, "GFD_SLEEP_INTERVAL"), Some("10s"));
        assert_eq!(env(main, "EXTRA"), Some("x"));
        assert_eq!(main["resources"]["limits"]["memory"], "100Mi");
        assert_eq!(pod(gfd)["hostNetwork"], true);
        assert_eq!(pod(gfd)["dnsPolicy"], "ClusterFirstWithHostNet");
    }

    #[test]
    fn pod_security_context_applies_to_every_operand_pod() {
        let rendered = rendered(
            &tweaked("{daemonsets: {podSecurityContext: {runAsNonRoot: false, fsGroup: 1000}}}"),
            &Facts::ubuntu(),
        );
        for ds in daemonsets(&rendered) {
            assert_eq!(
                pod(&ds.object)["securityContext"]["fsGroup"],
                1000,
                "{}",
                ds.name()
            );
        }
    }
}

/// RuntimeClasses, CDI and the NRI plugin: how operand pods get GPUs, and how the toolkit configures the
/// runtime.
mod runtime {
    use gpuop_render::ContainerRuntime;

    use crate::fixtures::*;

    /// DaemonSets whose pods use GPUs through the NVIDIA runtime.
    const GPU_PODS: &[&str] = &[
        "nvidia-operator-validator",
        "nvidia-device-plugin-daemonset",
        "nvidia-device-plugin-mps-control-daemon",
        "nvidia-dcgm",
        "nvidia-dcgm-exporter",
        "gpu-feature-discovery",
        "nvidia-mig-manager",
    ];
    /// DaemonSets whose pods never name a RuntimeClass.
    const PLAIN_PODS: &[&str] = &["nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset"];

    fn runtime_classes(r: &gpuop_render::Rendered) -> Vec<(String, String)> {
        r.objects
            .iter()
            .filter(|m| m.kind() == "RuntimeClass")
            .map(|m| {
                (
                    m.name().to_owned(),
                    m.object["handler"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    fn class_of<'a>(r: &'a gpuop_render::Rendered, ds: &str) -> Option<&'a str> {
        pod(object(r, "DaemonSet", ds))["runtimeClassName"].as_str()
    }

    #[test]
    fn with_cdi_on_containerd_gpu_pods_use_the_configured_runtime_class() {
        let rendered = rendered(
            &tweaked("{dcgm: {enabled: true}, operator: {runtimeClass: nvidia-gpu}}"),
            &Facts::ubuntu(),
        );
        assert_eq!(
            runtime_classes(&rendered),
            [
                ("nvidia-gpu".into(), "nvidia-gpu".into()),
                ("nvidia-legacy".into(), "nvidia-legacy".into()),
                ("nvidia-cdi".into(), "nvidia-cdi".into()),
            ]
        );
        for ds in GPU_PODS {
            assert_eq!(class_of(&rendered, ds), Some("nvidia-gpu"), "{ds}");
        }
        for ds in PLAIN_PODS {
            assert_eq!(class_of(&rendered, ds), None, "{ds}");
        }
        let toolkit = object(&rendered, "DaemonSet", "nvidia-container-toolkit-daemonset");
        let ctr = container(toolkit, "nvidia-container-toolkit-ctr");
        assert_eq!(env(ctr, "CONTAINERD_RUNTIME_CLASS"), Some("nvidia-gpu"));
        let validator = object(&rendered, "DaemonSet", "nvidia-operator-validator");
        assert_eq!(
            env(container(validator, "cuda-validation"), "VALIDATOR_RUNTIME_CLASS"),
            Some("nvidia-gpu")
        );
    }

    #[test]
    fn without_cdi_only_the_nvidia_runtime_class_and_crio_uses_the_oci_hook() {
        let policy = tweaked("{cdi: {enabled: false}}");
        let containerd = rendered(&policy, &Facts::ubuntu());
        assert_eq!(runtime_classes(&containerd), [("nvidia".into(), "nvidia".into())]);
        assert_eq!(
            class_of(&containerd, "nvidia-device-plugin-daemonset"),
            Some("nvidia")
        );

        let crio = rendered(&policy, &Facts::ubuntu().runtime(ContainerRuntime::Crio));
        for ds in GPU_PODS.iter().filter(|ds| **ds != "nvidia-dcgm") {
            assert_eq!(
                class_of(&crio, ds),
                None,
                "{ds}: CRI-O without CDI injects through the OCI hook"
            );
        }
        let toolkit = object(&crio, "DaemonSet", "nvidia-container-toolkit-daemonset");
        let ctr = container(toolkit, "nvidia-container-toolkit-ctr");
        assert_eq!(env(ctr, "CRIO_CONFIG_MODE"), Some("hook"));
        assert_eq!(env(ctr, "CDI_ENABLED"), None);
        assert_eq!(env(ctr, "RUNTIME"), Some("crio"));
        assert_eq!(env(ctr, "CONTAINERD_RUNTIME_CLASS"), None);
        let hooks = pod(toolkit)["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "crio-hooks")
            .unwrap();
        assert_eq!(hooks["hostPath"]["path"], "/usr/share/containers/oci/hooks.d");
        let validator = object(&crio, "DaemonSet", "nvidia-operator-validator");
        assert_eq!(
            env(container(validator, "cuda-validation"), "VALIDATOR_RUNTIME_CLASS"),
            None
        );
    }

    #[test]
    fn cdi_sets_the_toolkit_and_device_plugin_environment() {
        let moved = rendered(&tweaked("{toolkit: {installDir: /opt/nvidia}}"), &Facts::ubuntu());
        let toolkit = object(&moved, "DaemonSet", "nvidia-container-toolkit-daemonset");
        let ctr = container(toolkit, "nvidia-container-toolkit-ctr");
        for (name, value) in [
            ("CDI_ENABLED", "true"),
            ("NVIDIA_RUNTIME_SET_AS_DEFAULT", "false"),
            ("NVIDIA_CONTAINER_RUNTIME_MODE", "cdi"),
            ("CRIO_CONFIG_MODE", "config"),
            ("RUNTIME", "containerd"),
            ("ROOT", "/opt/nvidia"),
            ("CONTAINERD_CONFIG", "/runtime/config-dir/config.toml"),
            (
                "RUNTIME_DROP_IN_CONFIG_HOST_PATH",
                "/etc/containerd/conf.d/99-nvidia.toml",
            ),
            ("CONTAINERD_SOCKET", "/runtime/sock-dir/containerd.sock"),
        ] {
            assert_eq!(env(ctr, name), Some(value), "{name}");
        }
        assert_eq!(env(ctr, "ENABLE_NRI_PLUGIN"), None);
        let plugin = object(&moved, "DaemonSet", "nvidia-device-plugin-daemonset");
        let ctr = container(plugin, "nvidia-device-plugin");
        assert_eq!(env(ctr, "CDI_ENABLED"), Some("true"));
        assert_eq!(env(ctr, "DEVICE_LIST_STRATEGY"), Some("cdi-annotations,cdi-cri"));
        assert_eq!(env(ctr, "CDI_ANNOTATION_PREFIX"), Some("cdi.k8s.io/"));
        assert_eq!(
            env(ctr, "NVIDIA_CDI_HOOK_PATH"),
            Some("/opt/nvidia/toolkit/nvidia-cdi-hook")
        );

        // A toolkit installed outside the operator: no hook path the operator could know.
        let preinstalled = rendered(&tweaked("{toolkit: {enabled: false}}"), &Facts::ubuntu());
        let plugin = object(&preinstalled, "DaemonSet", "nvidia-device-plugin-daemonset");
        assert_eq!(
            env(container(plugin, "nvidia-device-plugin"), "NVIDIA_CDI_HOOK_PATH"),
            None
        );

        let off = rendered(&tweaked("{cdi: {enabled: false}}"), &Facts::ubuntu());
        let plugin = object(&off, "DaemonSet", "nvidia-device-plugin-daemonset");
        assert_eq!(
            env(container(plugin, "nvidia-device-plugin"), "DEVICE_LIST_STRATEGY"),
            Some("envvar")
        );
    }

    #[test]
    fn the_nri_plugin_replaces_runtime_classes_by_annotations_and_leaves_the_runtime_config_alone() {
        let rendered = rendered(&tweaked("{cdi: {nriPluginEnabled: true}}"), &Facts::ubuntu());
        assert!(runtime_classes(&rendered).is_empty());
        for (ds, ctr) in [
            ("nvidia-device-plugin-daemonset", "nvidia-device-plugin"),
            ("gpu-feature-discovery", "gpu-feature-discovery"),
            ("nvidia-operator-validator", "toolkit-validation"),
        ] {
            let object = object(&rendered, "DaemonSet", ds);
            assert_eq!(pod(object)["runtimeClassName"], serde_json::Value::Null, "{ds}");
            assert_eq!(
                object["spec"]["template"]["metadata"]["annotations"]
                    [format!("nvidia.cdi.k8s.io/container.{ctr}")],
                "management.nvidia.com/gpu=all",
                "{ds}"
            );
        }
        let toolkit = object(&rendered, "DaemonSet", "nvidia-container-toolkit-daemonset");
        let ctr = container(toolkit, "nvidia-container-toolkit-ctr");
        assert_eq!(env(ctr, "ENABLE_NRI_PLUGIN"), Some("true"));
        assert_eq!(env(ctr, "NRI_SOCKET"), Some("/runtime/nri-sock-dir/nri.sock"));
        assert_eq!(env(ctr, "CONTAINERD_CONFIG"), None);
        let volumes: Vec<&str> = pod(toolkit)["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert!(
            volumes.contains(&"nri-socket") && !volumes.contains(&"containerd-config"),
            "{volumes:?}"
        );
    }

    #[test]
    fn runtime_paths_can_be_moved_through_toolkit_env() {
        let rendered = rendered(
            &tweaked(
                "{toolkit: {env: [{name: CONTAINERD_CONFIG, value: /var/lib/rancher/k3s/agent/etc/containerd/config.toml},
                                  {name: CONTAINERD_SOCKET, value: /run/k3s/containerd/containerd.sock}]}}",
            ),
            &Facts::ubuntu(),
        );
        let toolkit = object(&rendered, "DaemonSet", "nvidia-container-toolkit-daemonset");
        let ctr = container(toolkit, "nvidia-container-toolkit-ctr");
        assert_eq!(
            env(ctr, "CONTAINERD_CONFIG"),
            Some("/runtime/config-dir/config.toml")
        );
        assert_eq!(
            env(ctr, "CONTAINERD_SOCKET"),
            Some("/runtime/sock-dir/containerd.sock")
        );
        let volumes = pod(toolkit)["volumes"].as_array().unwrap();
        let path = |name: &str| {
            volumes.iter().find(|v| v["name"] == name).unwrap()["hostPath"]["path"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(
            path("containerd-config"),
            "/var/lib/rancher/k3s/agent/etc/containerd"
        );
        assert_eq!(path("containerd-socket"), "/run/k3s/containerd");
    }
}

/// MIG, sharing and validation settings of the GPU operands.
mod gpu_operands {
    use crate::fixtures::*;

    #[test]
    fn mig_strategy_reaches_plugin_discovery_and_validation() {
        let facts = Facts::ubuntu();
        for (patch, strategy, monitor) in [
            ("{mig: {strategy: single}}", Some("single"), Some("all")),
            ("{mig: {strategy: mixed}}", Some("mixed"), Some("all")),
            ("{mig: {strategy: none}}", Some("none"), None),
            ("{mig: {strategy: ''}}", None, Some("all")),
        ] {
            let rendered = rendered(&tweaked(patch), &facts);
            for (ds, ctr) in [
                ("nvidia-device-plugin-daemonset", "nvidia-device-plugin"),
                ("gpu-feature-discovery", "gpu-feature-discovery"),
                (
                    "nvidia-device-plugin-mps-control-daemon",
                    "mps-control-daemon-ctr",
                ),
            ] {
                let ctr = container(object(&rendered, "DaemonSet", ds), ctr);
                assert_eq!(env(ctr, "MIG_STRATEGY"), strategy, "{patch} {ds}");
                assert_eq!(env(ctr, "NVIDIA_MIG_MONITOR_DEVICES"), monitor, "{patch} {ds}");
            }
            let validator = object(&rendered, "DaemonSet", "nvidia-operator-validator");
            // Always set on the validator; an empty strategy is a variable without a value, as
            // kube-apiserver stores `value: ""`.
            let validation = container(validator, "plugin-validation");
            assert!(
                validation["env"]
                    .as_array()
                    .is_some_and(|env| env.iter().any(|e| e["name"] == "MIG_STRATEGY")),
                "{patch}"
            );
            assert_eq!(env(validation, "MIG_STRATEGY"), strategy, "{patch}");
        }
    }

    #[test]
    fn the_config_manager_runs_only_with_a_device_plugin_config() {
        let facts = Facts::ubuntu();
        let plain = rendered(&default_policy(), &facts);
        for ds in [
            "nvidia-device-plugin-daemonset",
            "gpu-feature-discovery",
            "nvidia-device-plugin-mps-control-daemon",
        ] {
            let object = object(&plain, "DaemonSet", ds);
            assert!(!init_names(object).contains(&"config-manager-init"), "{ds}");
            assert!(!container_names(object).contains(&"config-manager"), "{ds}");
        }
        let configured = rendered(
            &tweaked("{devicePlugin: {config: {name: sharing, default: a100}}}"),
            &facts,
        );
        for (ds, main, process) in [
            (
                "nvidia-device-plugin-daemonset",
                "nvidia-device-plugin",
                "nvidia-device-plugin",
            ),
            (
                "gpu-feature-discovery",
                "gpu-feature-discovery",
                "gpu-feature-discovery",
            ),
            (
                "nvidia-device-plugin-mps-control-daemon",
                "mps-control-daemon-ctr",
                "/usr/bin/mps-control-daemon",
            ),
        ] {
            let object = object(&configured, "DaemonSet", ds);
            assert_eq!(init_names(object).last(), Some(&"config-manager-init"), "{ds}");
            assert_eq!(container_names(object), [main, "config-manager"], "{ds}");
            assert_eq!(
                env(container(object, main), "CONFIG_FILE"),
                Some("/config/config.yaml")
            );
            let sidecar = container(object, "config-manager");
            assert_eq!(env(sidecar, "DEFAULT_CONFIG"), Some("a100"));
            assert_eq!(env(sidecar, "PROCESS_TO_SIGNAL"), Some(process));
            assert_eq!(
                env(sidecar, "NODE_LABEL"),
                Some("nvidia.com/device-plugin.config")
            );
            assert_eq!(
                env(container(object, "config-manager-init"), "ONESHOT"),
                Some("true")
            );
            let volume = pod(object)["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == "sharing")
                .unwrap();
            assert_eq!(volume["configMap"]["name"], "sharing");
            // The sidecar signals the main process, so they share a PID namespace unless the pod has the host's.
            let shared = pod(object)["shareProcessNamespace"].as_bool();
            let host_pid = pod(object)["hostPID"].as_bool();
            assert!(shared == Some(true) || host_pid == Some(true), "{ds}");
        }
    }

    #[test]
    fn plugin_validation_is_left_out_without_a_device_plugin() {
        let facts = Facts::ubuntu();
        let with = rendered(&default_policy(), &facts);
        assert_eq!(
            init_names(object(&with, "DaemonSet", "nvidia-operator-validator")),
            [
                "driver-validation",
                "toolkit-validation",
                "cuda-validation",
                "plugin-validation"
            ]
        );
        let without = rendered(&tweaked("{devicePlugin: {enabled: false}}"), &facts);
        assert_eq!(
            init_names(object(&without, "DaemonSet", "nvidia-operator-validator")),
            ["driver-validation", "toolkit-validation", "cuda-validation"]
        );
        let validator = object(&with, "DaemonSet", "nvidia-operator-validator");
        for (name, component) in [
            ("driver-validation", "driver"),
            ("toolkit-validation", "toolkit"),
            ("cuda-validation", "cuda"),
            ("plugin-validation", "plugin"),
        ] {
            let ctr = container(validator, name);
            assert_eq!(env(ctr, "COMPONENT"), Some(component));
            assert_eq!(ctr["securityContext"]["runAsUser"], 0);
        }
        assert_eq!(
            env(container(validator, "driver-validation"), "WITH_WAIT"),
            Some("true")
        );
        assert_eq!(
            env(container(validator, "plugin-validation"), "WITH_WORKLOAD"),
            Some("false")
        );
    }

    #[test]
    fn validator_env_sections_reach_their_steps() {
        let rendered = rendered(
            &tweaked(
                "{validator: {driver: {env: [{name: DISABLE_DEV_CHAR_SYMLINK_CREATION, value: 'true'}]},
                              plugin: {env: [{name: WITH_WORKLOAD, value: 'true'}]}}}",
            ),
            &Facts::ubuntu(),
        );
        let validator = object(&rendered, "DaemonSet", "nvidia-operator-validator");
        assert_eq!(
            env(container(validator, "plugin-validation"), "WITH_WORKLOAD"),
            Some("true")
        );
        assert_eq!(
            env(
                container(validator, "driver-validation"),
                "DISABLE_DEV_CHAR_SYMLINK_CREATION"
            ),
            Some("true")
        );
        // The toolkit runs the same driver step.
        let toolkit = object(&rendered, "DaemonSet", "nvidia-container-toolkit-daemonset");
        assert_eq!(
            env(
                container(toolkit, "driver-validation"),
                "DISABLE_DEV_CHAR_SYMLINK_CREATION"
            ),
            Some("true")
        );
    }

    #[test]
    fn host_paths_move_the_host_root_and_the_driver_install_dir() {
        let rendered = rendered(
            &tweaked(
                "{hostPaths: {rootFS: /host-root, driverInstallDir: /opt/nvidia/driver, kubeletRootDir: /var/lib/k0s/kubelet}}",
            ),
            &Facts::ubuntu(),
        );
        let validator = object(&rendered, "DaemonSet", "nvidia-operator-validator");
        let volumes = pod(validator)["volumes"].as_array().unwrap();
        let path =
            |name: &str| volumes.iter().find(|v| v["name"] == name).unwrap()["hostPath"]["path"].clone();
        assert_eq!(path("host-root"), "/host-root");
        assert_eq!(path("host-dev-char"), "/host-root/dev/char");
        assert_eq!(path("driver-install-dir"), "/opt/nvidia/driver");
        let driver_step = container(validator, "driver-validation");
        assert_eq!(env(driver_step, "HOST_ROOT"), Some("/host-root"));
        assert_eq!(env(driver_step, "DRIVER_INSTALL_DIR"), Some("/opt/nvidia/driver"));
        assert_eq!(
            env(driver_step, "DRIVER_INSTALL_DIR_CTR_PATH"),
            Some("/opt/nvidia/driver")
        );
        assert!(
            driver_step["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == "driver-install-dir" && m["mountPath"] == "/opt/nvidia/driver")
        );
        assert_eq!(
            env(container(validator, "nvidia-operator-validator"), "HOST_ROOT"),
            Some("/host-root")
        );
        let exporter = object(&rendered, "DaemonSet", "nvidia-dcgm-exporter");
        let resources = pod(exporter)["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "pod-gpu-resources")
            .unwrap();
        assert_eq!(
            resources["hostPath"]["path"],
            "/var/lib/k0s/kubelet/pod-resources"
        );
    }
}

/// The driver DaemonSets: pools, image tags, precompiled drivers, add-ons and errors.
mod driver {
    use gpuop_api::labels::{COMPONENT, NFD_KERNEL_VERSION, NFD_OS_ID, NFD_OS_VERSION, NFD_OS_VERSION_MAJOR};
    use gpuop_render::{RenderError, render};

    use crate::fixtures::*;

    fn driver_daemonsets(r: &gpuop_render::Rendered) -> Vec<&serde_json::Value> {
        r.objects
            .iter()
            .filter(|m| m.kind() == "DaemonSet" && m.name().starts_with("nvidia-driver-daemonset"))
            .map(|m| &m.object)
            .collect()
    }

    #[test]
    fn one_os_pool_renders_exactly_nvidias_driver_daemonset_with_the_os_in_the_tag() {
        for (os_id, version, tag) in [
            ("ubuntu", "22.04", "595.91.07-ubuntu22.04"),
            ("rhel", "9.4", "595.91.07-rhel9"),
            ("rocky", "8.10", "595.91.07-rocky8"),
            ("sles", "15.6", "595.91.07-sles15.6"),
        ] {
            let rendered = rendered(
                &default_policy(),
                &Facts::ubuntu().pools(vec![pool(os_id, version, None)]),
            );
            let all = driver_daemonsets(&rendered);
            assert_eq!(all.len(), 1, "{os_id}");
            let ds = all[0];
            assert_eq!(ds["metadata"]["name"], "nvidia-driver-daemonset");
            assert_eq!(
                container(ds, "nvidia-driver-ctr")["image"],
                format!("nvcr.io/nvidia/driver:{tag}")
            );
            assert_eq!(
                pod(ds)["nodeSelector"],
                serde_json::json!({"nvidia.com/gpu.deploy.driver": "true"})
            );
            assert_eq!(
                ds["spec"]["template"]["metadata"]["labels"][COMPONENT],
                "nvidia-driver"
            );
            assert_eq!(
                ds["spec"]["template"]["metadata"]["labels"]["nvidia.com/precompiled"],
                "false"
            );
        }
    }

    #[test]
    fn several_os_pools_get_one_daemonset_each_selecting_their_nodes() {
        let rendered = rendered(
            &default_policy(),
            &Facts::ubuntu().pools(vec![
                pool("ubuntu", "22.04", None),
                pool("ubuntu", "24.04", None),
                pool("rhel", "9.4", None),
            ]),
        );
        let found: Vec<(String, String, serde_json::Value)> = driver_daemonsets(&rendered)
            .into_iter()
            .map(|ds| {
                (
                    ds["metadata"]["name"].as_str().unwrap().to_owned(),
                    container(ds, "nvidia-driver-ctr")["image"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                    pod(ds)["nodeSelector"].clone(),
                )
            })
            .collect();
        assert_eq!(found.len(), 3);
        assert_eq!(found[0].0, "nvidia-driver-daemonset-rhel9");
        assert_eq!(found[0].1, "nvcr.io/nvidia/driver:595.91.07-rhel9");
        assert_eq!(found[0].2[NFD_OS_ID], "rhel");
        assert_eq!(found[0].2[NFD_OS_VERSION_MAJOR], "9");
        assert_eq!(found[1].0, "nvidia-driver-daemonset-ubuntu22.04");
        assert_eq!(found[1].2[NFD_OS_VERSION], "22.04");
        assert_eq!(found[2].0, "nvidia-driver-daemonset-ubuntu24.04");
        assert_eq!(found[2].1, "nvcr.io/nvidia/driver:595.91.07-ubuntu24.04");
        for ds in driver_daemonsets(&rendered) {
            assert_eq!(pod(ds)["nodeSelector"]["nvidia.com/gpu.deploy.driver"], "true");
            assert_eq!(ds["spec"]["updateStrategy"]["type"], "OnDelete");
            // Pods of different pools never share a selector, and only one driver pod runs per node.
            assert_eq!(
                ds["spec"]["selector"]["matchLabels"]["app"],
                ds["metadata"]["name"]
            );
            let anti =
                &pod(ds)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
            assert_eq!(
                anti["labelSelector"]["matchExpressions"][0]["values"][0],
                "nvidia-driver"
            );
        }
    }

    #[test]
    fn no_known_gpu_node_means_no_driver_daemonset_but_the_rest_of_the_state() {
        let rendered = rendered(&default_policy(), &Facts::ubuntu().pools(vec![]));
        assert!(driver_daemonsets(&rendered).is_empty());
        assert!(
            rendered
                .find("ConfigMap", "nvidia-driver-startup-probe")
                .is_some()
        );
        assert!(rendered.find("ServiceAccount", "nvidia-driver").is_some());
        assert!(
            rendered
                .find("DaemonSet", "nvidia-container-toolkit-daemonset")
                .is_some()
        );
    }

    #[test]
    fn precompiled_drivers_get_one_daemonset_per_kernel_named_as_nvidia_names_them() {
        let policy = tweaked("{driver: {usePrecompiled: true, version: '580'}}");
        let rendered = rendered(
            &policy,
            &Facts::ubuntu().pools(vec![
                pool("ubuntu", "22.04", Some("5.15.0-105-generic")),
                pool("ubuntu", "22.04", Some("6.8.0-45-generic")),
                pool("rhel", "9.4", Some("5.14.0-427.13.1.el9_4.x86_64")),
            ]),
        );
        let found: Vec<(&str, &str, &str)> = driver_daemonsets(&rendered)
            .into_iter()
            .map(|ds| {
                (
                    ds["metadata"]["name"].as_str().unwrap(),
                    container(ds, "nvidia-driver-ctr")["image"].as_str().unwrap(),
                    pod(ds)["nodeSelector"][NFD_KERNEL_VERSION].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            found,
            [
                (
                    "nvidia-driver-daemonset-5.14.0-427.13.1.el9.4-rhel9.4",
                    "nvcr.io/nvidia/driver:580-5.14.0-427.13.1.el9_4.x86_64-rhel9",
                    "5.14.0-427.13.1.el9_4.x86_64",
                ),
                (
                    "nvidia-driver-daemonset-5.15.0-105-generic-ubuntu22.04",
                    "nvcr.io/nvidia/driver:580-5.15.0-105-generic-ubuntu22.04",
                    "5.15.0-105-generic",
                ),
                (
                    "nvidia-driver-daemonset-6.8.0-45-generic-ubuntu22.04",
                    "nvcr.io/nvidia/driver:580-6.8.0-45-generic-ubuntu22.04",
                    "6.8.0-45-generic",
                ),
            ]
        );
        for ds in driver_daemonsets(&rendered) {
            assert_eq!(ds["metadata"]["labels"]["nvidia.com/precompiled"], "true");
            assert_eq!(
                ds["spec"]["selector"]["matchLabels"]["app"],
                "nvidia-driver-daemonset"
            );
            assert_eq!(
                ds["spec"]["template"]["metadata"]["labels"][COMPONENT],
                "nvidia-driver"
            );
        }
    }

    #[test]
    fn digests_are_used_as_they_are() {
        let rendered = rendered(
            &tweaked("{driver: {version: 'sha256:0123456789abcdef'}}"),
            &Facts::ubuntu(),
        );
        let ds = driver_daemonsets(&rendered)[0];
        assert_eq!(
            container(ds, "nvidia-driver-ctr")["image"],
            "nvcr.io/nvidia/driver@sha256:0123456789abcdef"
        );
    }

    #[test]
    fn render_names_what_is_missing_or_ambiguous() {
        let cases: Vec<(gpuop_api::ValidatedPolicy, Facts, RenderError)> = vec![
            (
                default_policy(),
                Facts::ubuntu().pools(vec![pool("ubuntu", "", None)]),
                RenderError::PoolWithoutOs {
                    section: gpuop_api::ImageSection::Driver,
                    os_id: "ubuntu".into(),
                    os_version: String::new(),
                },
            ),
            (
                tweaked("{driver: {usePrecompiled: true, version: '580'}}"),
                Facts::ubuntu(),
                RenderError::PoolWithoutKernel {
                    os_id: "ubuntu".into(),
                    os_version: "22.04".into(),
                },
            ),
            (
                tweaked(
                    "{driver: {usePrecompiled: true, image: 'registry.local/driver@sha256:abc', repository: '', version: ''}}",
                ),
                Facts::ubuntu().pools(vec![pool("ubuntu", "22.04", Some("6.8.0"))]),
                RenderError::PrecompiledDigest {
                    image: "registry.local/driver@sha256:abc".into(),
                },
            ),
            (
                tweaked("{driver: {usePrecompiled: true, version: '580'}}"),
                Facts::ubuntu().pools(vec![
                    pool("ubuntu", "22.04", Some("6.8.0")),
                    pool("debian", "12", Some("6.8.0")),
                ]),
                RenderError::KernelOnSeveralOs {
                    kernel: "6.8.0".into(),
                    first: "debian12".into(),
                    second: "ubuntu22.04".into(),
                },
            ),
            (
                tweaked("{driver: {repoConfig: {configMapName: repos}}}"),
                Facts::ubuntu(),
                RenderError::ConfigMapUnknown {
                    field: "spec.driver.repoConfig.configMapName",
                    name: "repos".into(),
                    namespace: "gpu-operator".into(),
                },
            ),
            (
                tweaked("{driver: {certConfig: {name: certs}}}"),
                Facts::ubuntu()
                    .pools(vec![pool("arch", "rolling", None)])
                    .config_map("certs", &["ca.pem"]),
                RenderError::UnsupportedOsForConfig {
                    field: "spec.driver.certConfig.name",
                    os_id: "arch".into(),
                },
            ),
        ];
        for (policy, facts, expected) in cases {
            let error = render(&policy, &facts.0).unwrap_err();
            assert_eq!(error, expected);
            assert!(!error.to_string().is_empty());
        }
    }

    #[test]
    fn driver_config_maps_are_mounted_key_by_key_where_each_os_expects_them() {
        let policy = tweaked(
            "{driver: {repoConfig: {configMapName: repos}, certConfig: {name: certs},
                       kernelModuleConfig: {name: modules}}}",
        );
        let rendered = rendered(
            &policy,
            &Facts::ubuntu()
                .pools(vec![pool("ubuntu", "22.04", None), pool("rhel", "9.4", None)])
                .config_map("repos", &["cuda.repo"])
                .config_map("certs", &["corp-ca.crt"])
                .config_map("modules", &["nvidia.conf"]),
        );
        let mounts = |name: &str| -> Vec<(String, String)> {
            let ds = object(&rendered, "DaemonSet", name);
            container(ds, "nvidia-driver-ctr")["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["subPath"].is_string() && m["name"] != "driver-startup-probe-script")
                .map(|m| {
                    (
                        m["mountPath"].as_str().unwrap().to_owned(),
                        m["subPath"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        };
        assert_eq!(
            mounts("nvidia-driver-daemonset-ubuntu22.04"),
            [
                ("/drivers/nvidia.conf".to_owned(), "nvidia.conf".to_owned()),
                (
                    "/etc/apt/sources.list.d/cuda.repo".to_owned(),
                    "cuda.repo".to_owned()
                ),
                (
                    "/usr/local/share/ca-certificates/corp-ca.crt".to_owned(),
                    "corp-ca.crt".to_owned()
                ),
            ]
        );
        assert_eq!(
            mounts("nvidia-driver-daemonset-rhel9"),
            [
                ("/drivers/nvidia.conf".to_owned(), "nvidia.conf".to_owned()),
                ("/etc/yum.repos.d/cuda.repo".to_owned(), "cuda.repo".to_owned()),
                (
                    "/etc/pki/ca-trust/extracted/pem/corp-ca.crt".to_owned(),
                    "corp-ca.crt".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn the_config_digest_follows_install_settings_only() {
        let facts = Facts::ubuntu();
        let digest = |policy: &gpuop_api::ValidatedPolicy| -> String {
            let rendered = rendered(policy, &facts);
            let ds = driver_daemonsets(&rendered)[0];
            let driver = env(container(ds, "nvidia-driver-ctr"), "DRIVER_CONFIG_DIGEST")
                .unwrap()
                .to_owned();
            let manager = env(container(ds, "k8s-driver-manager"), "DRIVER_CONFIG_DIGEST").unwrap();
            assert_eq!(driver, manager);
            driver
        };
        let base = digest(&default_policy());
        assert!(base.parse::<u32>().is_ok(), "{base}");
        assert_eq!(base, digest(&default_policy()));
        // Settings the driver does not depend on keep the digest, so no reinstall.
        assert_eq!(
            base,
            digest(&tweaked(
                "{daemonsets: {labels: {team: ml}}, gfd: {enabled: false}}"
            ))
        );
        // Settings it does depend on change it.
        for patch in [
            "{driver: {version: '595.100.01'}}",
            "{driver: {kernelModuleType: open}}",
            "{driver: {env: [{name: EXTRA, value: '1'}]}}",
            "{driver: {rdma: {enabled: true}}}",
            "{hostPaths: {rootFS: /host}}",
        ] {
            assert_ne!(base, digest(&tweaked(patch)), "{patch}");
        }
    }

    #[test]
    fn kernel_module_type_and_addons_reach_the_driver_pod() {
        let rendered = rendered(
            &tweaked(
                "{driver: {kernelModuleType: open, rdma: {enabled: true}}, gds: {enabled: true}, gdrcopy: {enabled: true}}",
            ),
            &Facts::ubuntu(),
        );
        let ds = driver_daemonsets(&rendered)[0];
        let driver = container(ds, "nvidia-driver-ctr");
        assert_eq!(env(driver, "KERNEL_MODULE_TYPE"), Some("open"));
        assert_eq!(env(driver, "OPEN_KERNEL_MODULES_ENABLED"), Some("true"));
        assert_eq!(env(driver, "GDS_ENABLED"), Some("true"));
        assert_eq!(env(driver, "GDRCOPY_ENABLED"), Some("true"));
        assert_eq!(env(driver, "GPU_DIRECT_RDMA_ENABLED"), Some("true"));
        assert_eq!(
            container_names(ds),
            [
                "nvidia-driver-ctr",
                "nvidia-peermem-ctr",
                "nvidia-fs-ctr",
                "nvidia-gdrcopy-ctr"
            ]
        );
        assert_eq!(
            container(ds, "nvidia-fs-ctr")["image"],
            "nvcr.io/nvidia/cloud-native/nvidia-fs:2.29.4-ubuntu22.04"
        );
        assert_eq!(
            container(ds, "nvidia-gdrcopy-ctr")["image"],
            "nvcr.io/nvidia/cloud-native/gdrdrv:v2.6-ubuntu22.04"
        );
        let plugin = object(&rendered, "DaemonSet", "nvidia-device-plugin-daemonset");
        let plugin = container(plugin, "nvidia-device-plugin");
        assert_eq!(env(plugin, "GDS_ENABLED"), Some("true"));
        assert_eq!(env(plugin, "GDRCOPY_ENABLED"), Some("true"));
        let plain = rendered_plain();
        assert_eq!(
            container_names(driver_daemonsets(&plain)[0]),
            ["nvidia-driver-ctr"]
        );
    }

    fn rendered_plain() -> gpuop_render::Rendered {
        rendered(&default_policy(), &Facts::ubuntu())
    }

    #[test]
    fn startup_probe_timing_follows_the_policy() {
        let rendered = rendered(
            &tweaked("{driver: {startupProbe: {initialDelaySeconds: 5, failureThreshold: 300}}}"),
            &Facts::ubuntu(),
        );
        let probe = &container(driver_daemonsets(&rendered)[0], "nvidia-driver-ctr")["startupProbe"];
        assert_eq!(probe["initialDelaySeconds"], 5);
        assert_eq!(probe["failureThreshold"], 300);
        assert_eq!(probe["periodSeconds"], 10);
        assert_eq!(probe["exec"]["command"][1], "/usr/local/bin/startup-probe.sh");
    }
}

/// ConfigMaps the operands read at start, and per-operand settings not covered above.
mod operand_files {
    use crate::fixtures::*;

    #[test]
    fn entrypoints_wait_for_the_driver_then_start_the_operand() {
        let rendered = rendered(&default_policy(), &Facts::ubuntu());
        for (config_map, daemonset, binary) in [
            (
                "nvidia-container-toolkit-entrypoint",
                "nvidia-container-toolkit-daemonset",
                "nvidia-toolkit",
            ),
            (
                "nvidia-device-plugin-entrypoint",
                "nvidia-device-plugin-daemonset",
                "nvidia-device-plugin",
            ),
            (
                "nvidia-mig-manager-entrypoint",
                "nvidia-mig-manager",
                "nvidia-mig-manager",
            ),
        ] {
            let script = object(&rendered, "ConfigMap", config_map)["data"]["entrypoint.sh"]
                .as_str()
                .unwrap();
            let wait = script
                .find("[ -f /run/nvidia/validations/driver-ready ]")
                .unwrap();
            let source = script.find(". /run/nvidia/validations/driver-ready").unwrap();
            let start = script.find(&format!("exec {binary}\n")).unwrap();
            assert!(wait < source && source < start, "{config_map}");
            let ds = object(&rendered, "DaemonSet", daemonset);
            let volume = pod(ds)["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["configMap"]["name"] == config_map)
                .unwrap();
            assert_eq!(volume["configMap"]["defaultMode"], 0o700);
        }
        let mig = object(&rendered, "ConfigMap", "nvidia-mig-manager-entrypoint")["data"]["entrypoint.sh"]
            .as_str()
            .unwrap();
        assert!(
            mig.contains("WITH_SHUTDOWN_HOST_GPU_CLIENTS=$IS_HOST_DRIVER"),
            "{mig}"
        );
        let probe = object(&rendered, "ConfigMap", "nvidia-driver-startup-probe")["data"]["startup-probe.sh"]
            .as_str()
            .unwrap();
        assert!(
            probe.contains(".driver-ctr-ready") && probe.contains("nvidia-smi"),
            "{probe}"
        );
    }

    #[test]
    fn a_custom_mps_root_moves_the_mps_directories() {
        let rendered = rendered(
            &tweaked("{devicePlugin: {mps: {root: /var/mps}}}"),
            &Facts::ubuntu(),
        );
        for ds in [
            "nvidia-device-plugin-daemonset",
            "nvidia-device-plugin-mps-control-daemon",
        ] {
            let object = object(&rendered, "DaemonSet", ds);
            let volumes = pod(object)["volumes"].as_array().unwrap();
            let path =
                |name: &str| volumes.iter().find(|v| v["name"] == name).unwrap()["hostPath"]["path"].clone();
            assert_eq!(path("mps-root"), "/var/mps", "{ds}");
            assert_eq!(path("mps-shm"), "/var/mps/shm", "{ds}");
        }
        let plugin = object(&rendered, "DaemonSet", "nvidia-device-plugin-daemonset");
        assert_eq!(
            env(container(plugin, "nvidia-device-plugin"), "MPS_ROOT"),
            Some("/var/mps")
        );
    }

    #[test]
    fn vgpu_licensing_is_mounted_from_the_named_secret() {
        let rendered = rendered(
            &tweaked("{driver: {licensingConfig: {secretName: licensing, nlsEnabled: true}}}"),
            &Facts::ubuntu(),
        );
        let ds = object(&rendered, "DaemonSet", "nvidia-driver-daemonset");
        let volume = pod(ds)["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "licensing-config")
            .unwrap();
        assert_eq!(volume["secret"]["secretName"], "licensing");
        let mounts: Vec<&str> = container(ds, "nvidia-driver-ctr")["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["name"] == "licensing-config")
            .map(|m| m["mountPath"].as_str().unwrap())
            .collect();
        assert_eq!(
            mounts,
            [
                "/drivers/gridd.conf",
                "/drivers/ClientConfigToken/client_configuration_token.tok"
            ]
        );
    }
}

/// An NVIDIADriver's objects: NVIDIA's names and selection, one DaemonSet per pool, and the errors a user
/// can cause.
mod nvidia_driver {
    use gpuop_render::{RenderError, render_nvidia_driver};
    use serde_json::Value;

    use crate::fixtures::{
        container, daemonsets, driver_facts, env, names, pod, pool, rendered_driver, sample_driver,
    };

    fn ubuntu() -> Vec<gpuop_render::OsPool> {
        vec![pool("ubuntu", "22.04", None)]
    }

    fn only_daemonset(rendered: &gpuop_render::Rendered) -> &Value {
        let sets = daemonsets(rendered);
        assert_eq!(sets.len(), 1, "{:#?}", names(rendered));
        &sets[0].object
    }

    #[test]
    fn names_follow_nvidia_and_every_object_names_its_nvidia_driver() {
        let rendered = rendered_driver(&sample_driver("h100-pool", "{}"), &driver_facts(ubuntu()));
        let account = "nvidia-gpu-driver-h100-pool-ubuntu22.04";
        let ds = only_daemonset(&rendered);
        let name = ds["metadata"]["name"].as_str().unwrap();
        assert!(
            name.starts_with("nvidia-gpu-driver-ubuntu22.04-") && name.len() <= 63,
            "{name}"
        );
        assert_eq!(ds["spec"]["selector"]["matchLabels"]["app"], name);
        assert_eq!(pod(ds)["serviceAccountName"], account);
        for kind in [
            "ServiceAccount",
            "Role",
            "ClusterRole",
            "RoleBinding",
            "ClusterRoleBinding",
        ] {
            assert!(rendered.find(kind, account).is_some(), "{kind} {account}");
        }
        for manifest in &rendered.objects {
            let labels = &manifest.object["metadata"]["labels"];
            assert_eq!(
                labels["nvidia.com/nvidiadriver"],
                "h100-pool",
                "{}",
                manifest.name()
            );
            assert_eq!(labels["app.kubernetes.io/managed-by"], "gpu-operator");
            assert_eq!(labels["app.kubernetes.io/component"], "nvidia-driver");
        }
        // The pods carry NVIDIA's labels only, so that taking over NVIDIA's DaemonSet replaces no pod.
        let template = &ds["spec"]["template"]["metadata"]["labels"];
        assert_eq!(template["app.kubernetes.io/component"], "nvidia-driver");
        assert!(template.get("nvidia.com/nvidiadriver").is_none(), "{template}");
        assert!(
            template.get("app.kubernetes.io/managed-by").is_none(),
            "{template}"
        );
    }

    #[test]
    fn pods_select_the_routed_nodes_of_their_pool() {
        let rendered = rendered_driver(
            &sample_driver("h100-pool", "{}"),
            &driver_facts(vec![pool("rhel", "9.4", None), pool("ubuntu", "22.04", None)]),
        );
        let selectors: Vec<&Value> = daemonsets(&rendered)
            .iter()
            .map(|m| &pod(&m.object)["nodeSelector"])
            .collect();
        assert_eq!(selectors.len(), 2);
        for selector in &selectors {
            assert_eq!(selector["nvidia.com/gpu.deploy.driver"], "true");
            assert_eq!(selector["nvidia.com/gpu.present"], "true");
            assert_eq!(selector["nvidia.com/gpu-operator.driver.owner"], "h100-pool");
            assert_eq!(selector["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
        }
        assert_eq!(
            selectors[0]["feature.node.kubernetes.io/system-os_release.VERSION_ID.major"],
            "9"
        );
        assert_eq!(
            selectors[1]["feature.node.kubernetes.io/system-os_release.VERSION_ID"],
            "22.04"
        );
        let images: Vec<&str> = daemonsets(&rendered)
            .iter()
            .map(|m| {
                container(&m.object, "nvidia-driver-ctr")["image"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(
            images,
            [
                "nvcr.io/nvidia/driver:595.91.07-rhel9",
                "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"
            ]
        );
    }

    #[test]
    fn precompiled_pools_are_per_kernel_and_share_the_os_account() {
        let rendered = rendered_driver(
            &sample_driver("l4-inference", "{}"),
            &driver_facts(vec![
                pool("ubuntu", "22.04", Some("5.15.0-105-generic")),
                pool("ubuntu", "22.04", Some("5.15.0-113-generic")),
            ]),
        );
        let sets = daemonsets(&rendered);
        assert_eq!(sets.len(), 2);
        assert_ne!(
            sets[0].name(),
            sets[1].name(),
            "the kernel is part of the name hash"
        );
        let ds = &sets[0].object;
        assert_eq!(
            container(ds, "nvidia-driver-ctr")["image"],
            "nvcr.io/nvidia/driver:580-5.15.0-105-generic-ubuntu22.04"
        );
        assert_eq!(
            pod(ds)["nodeSelector"]["feature.node.kubernetes.io/kernel-version.full"],
            "5.15.0-105-generic"
        );
        assert_eq!(ds["metadata"]["labels"]["nvidia.com/precompiled"], "true");
        assert_eq!(
            container(ds, "nvidia-driver-ctr")["startupProbe"]["initialDelaySeconds"],
            5,
            "precompiled modules are probed sooner, as NVIDIA does"
        );
        let accounts = rendered
            .objects
            .iter()
            .filter(|m| m.kind() == "ServiceAccount")
            .count();
        assert_eq!(accounts, 1);
    }

    #[test]
    fn tolerations_add_to_the_gpu_taint_and_args_follow_init() {
        let driver = sample_driver(
            "l4-inference",
            "{args: [--debug], labels: {team: ml, app: x, app.kubernetes.io/part-of: x}}",
        );
        let rendered = rendered_driver(
            &driver,
            &driver_facts(vec![pool("ubuntu", "22.04", Some("6.8.0"))]),
        );
        let ds = only_daemonset(&rendered);
        let keys: Vec<&str> = pod(ds)["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, ["nvidia.com/gpu", "inference-only"]);
        assert_eq!(
            container(ds, "nvidia-driver-ctr")["args"],
            serde_json::json!(["init", "--debug"])
        );
        let labels = &ds["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["team"], "ml");
        assert_ne!(labels["app"], "x");
        assert!(labels.get("app.kubernetes.io/part-of").is_none());
    }

    #[test]
    fn the_driver_runs_on_delete_with_the_config_digest_and_runc() {
        let rendered = rendered_driver(&sample_driver("default", "{}"), &driver_facts(ubuntu()));
        let ds = only_daemonset(&rendered);
        assert_eq!(ds["spec"]["updateStrategy"]["type"], "OnDelete");
        let digest = env(container(ds, "k8s-driver-manager"), "DRIVER_CONFIG_DIGEST").unwrap();
        assert_eq!(
            env(container(ds, "nvidia-driver-ctr"), "DRIVER_CONFIG_DIGEST"),
            Some(digest)
        );
        assert_eq!(
            env(container(ds, "nvidia-driver-ctr"), "NVIDIA_VISIBLE_DEVICES"),
            Some("void")
        );
        let changed = rendered_driver(
            &sample_driver("default", "{env: [{name: X, value: '1'}]}"),
            &driver_facts(ubuntu()),
        );
        let other = env(
            container(only_daemonset(&changed), "nvidia-driver-ctr"),
            "DRIVER_CONFIG_DIGEST",
        );
        assert_ne!(other, Some(digest), "driver env is part of the install");
        let values = &pod(ds)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0]["labelSelector"]["matchExpressions"][0]["values"];
        assert_eq!(
            values,
            &serde_json::json!(["nvidia-driver", "nvidia-vgpu-manager"])
        );
    }

    #[test]
    fn the_host_root_comes_from_the_facts() {
        let mut facts = driver_facts(ubuntu());
        facts.host_root = "/host".into();
        let rendered = rendered_driver(&sample_driver("default", "{}"), &facts);
        let volume = pod(only_daemonset(&rendered))["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "host-root")
            .unwrap()
            .clone();
        assert_eq!(volume["hostPath"]["path"], "/host");
        assert_eq!(
            gpuop_render::NvidiaDriverFacts::host_root_of(None),
            "/",
            "without a ClusterPolicy NVIDIA mounts /"
        );
    }

    #[test]
    fn no_routed_node_renders_nothing() {
        let rendered = rendered_driver(&sample_driver("default", "{}"), &driver_facts(Vec::new()));
        assert!(rendered.objects.is_empty());
    }

    #[test]
    fn errors_name_the_nvidia_driver_and_the_field() {
        let facts = driver_facts(ubuntu());
        let message = |driver, facts: &gpuop_render::NvidiaDriverFacts| {
            render_nvidia_driver(&driver, facts).unwrap_err().to_string()
        };
        let mut no_uid = sample_driver("default", "{}");
        no_uid.uid = None;
        assert!(message(no_uid, &facts).starts_with("NVIDIADriver default: metadata.uid is missing"));

        let mut no_manager = sample_driver("default", "{}");
        no_manager.manager_image = None;
        assert_eq!(
            message(no_manager, &facts),
            "NVIDIADriver default: spec.manager.image resolves to no image: set repository, image and \
             version, or DRIVER_MANAGER_IMAGE in the operator's environment"
        );

        // Validation refuses this too; rendering does not trust that it ran.
        let mut precompiled_gds = sample_driver("l4-inference", "{}");
        precompiled_gds.spec.gds = Some(serde_json::from_str(r#"{"enabled": true}"#).unwrap());
        assert!(
            message(
                precompiled_gds,
                &driver_facts(vec![pool("ubuntu", "22.04", Some("6.8.0"))])
            )
            .starts_with("NVIDIADriver l4-inference: spec.gds.enabled cannot be true with usePrecompiled")
        );

        let repo = sample_driver("default", "{repoConfig: {name: missing}}");
        let error = render_nvidia_driver(&repo, &facts).unwrap_err();
        assert!(matches!(
            &error,
            RenderError::InNvidiaDriver { driver, source }
                if driver == "default"
                    && matches!(**source, RenderError::ConfigMapUnknown { field: "spec.repoConfig.name", .. })
        ));

        assert!(
            message(sample_driver("l4-inference", "{}"), &facts)
                .contains("spec.usePrecompiled is true but GPU nodes with OS ubuntu22.04 have no")
        );
    }

    #[test]
    fn the_vgpu_host_manager_runs_on_vgpu_manager_nodes_without_a_startup_probe() {
        let driver = sample_driver(
            "default",
            "{driverType: vgpu-host-manager, image: vgpu-manager, repository: registry.example.com/nvidia}",
        );
        let rendered = rendered_driver(&driver, &driver_facts(ubuntu()));
        let ds = only_daemonset(&rendered);
        assert!(
            ds["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("nvidia-vgpu-host-manager-driver-ubuntu22.04-")
        );
        assert_eq!(
            pod(ds)["serviceAccountName"],
            "nvidia-vgpu-manager-default-ubuntu22.04"
        );
        assert_eq!(
            pod(ds)["nodeSelector"]["nvidia.com/gpu.deploy.vgpu-manager"],
            "true"
        );
        assert!(
            pod(ds)["nodeSelector"]
                .get("nvidia.com/gpu.deploy.driver")
                .is_none()
        );
        assert_eq!(
            ds["metadata"]["labels"]["app.kubernetes.io/component"],
            "nvidia-vgpu-host-manager"
        );
        assert!(container(ds, "nvidia-driver-ctr").get("startupProbe").is_none());
        assert_eq!(pod(ds)["terminationGracePeriodSeconds"], 120);
    }
}
