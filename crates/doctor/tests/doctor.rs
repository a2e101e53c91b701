//! The doctor, from the outside: planted faults and what it reports about them, the property that more nodes
//! never change or hide anything, `explain pod`, the `kubectl-gpu` binary on snapshot files, and the doctor
//! against a simulated cluster the operator converged, with faults injected.

use gpuop_api::Operand;
use gpuop_doctor::analyze;
use gpuop_doctor::fixture::{ClusterBuilder, NodeFixture};
use gpuop_doctor::report::{CheckStatus, Finding, FindingKind, Link, NodeReport, Report};
use gpuop_doctor::snapshot::{PodFacts, Snapshot};
use k8s_openapi::api::core::v1::Node;

/// A converged cluster: two A100 nodes (one MIG-capable), an H100 node and a CPU node.
fn cluster() -> Snapshot {
    ClusterBuilder::new()
        .with_node(Node::gpu("a100-01").mig_capable())
        .with_node(Node::gpu("a100-02"))
        .with_node(Node::gpu("h100-01").with_gpus("NVIDIA-H100-80GB-HBM3", 8))
        .with_node(Node::cpu("cpu-01"))
        .build()
}

fn node<'r>(report: &'r Report, name: &str) -> &'r NodeReport {
    report
        .nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name} in the report"))
}

/// The findings on a node, as (kind, operand id) pairs.
fn kinds(report: &Report, name: &str) -> Vec<(FindingKind, Option<&'static str>)> {
    node(report, name)
        .findings
        .iter()
        .map(|f| (f.kind, f.operand.map(Operand::id)))
        .collect()
}

fn finding<'r>(report: &'r Report, name: &str, kind: FindingKind, operand: Operand) -> &'r Finding {
    node(report, name)
        .findings
        .iter()
        .find(|f| f.kind == kind && f.operand == Some(operand))
        .unwrap_or_else(|| {
            panic!(
                "no {kind:?} finding for {operand} on {name}: {:#?}",
                node(report, name).findings
            )
        })
}

/// Every node other than `except` has no finding.
fn others_clean(report: &Report, except: &str) {
    for node in &report.nodes {
        if node.name != except {
            assert!(node.findings.is_empty(), "{}: {:#?}", node.name, node.findings);
        }
    }
}

mod faults {
    use super::*;
    use gpuop_api::labels::{GPU_PRESENT, MIG_CONFIG, MIG_CONFIG_STATE, RESOURCE_GPU, UPGRADE_STATE};
    use gpuop_api::placement::daemon_pod_fits;

    #[test]
    fn a_converged_cluster_is_healthy() {
        let report = analyze(&cluster());
        assert!(!report.has_findings(), "{report:#?}");
        assert_eq!(report.summary.nodes, 4);
        assert_eq!(report.summary.gpu_nodes, 3);
        let a100 = node(&report, "a100-01");
        assert_eq!(a100.first_broken_link, None);
        assert!(
            a100.checks.iter().all(|c| c.status == CheckStatus::Pass),
            "{:#?}",
            a100.checks
        );
    }

    /// Mid-rollout the operator does not count a pod of an earlier revision as ready, and neither does the
    /// doctor: it names the revision the pod runs and the DaemonSet's latest.
    #[test]
    fn a_ready_pod_of_an_earlier_revision_is_not_ready() {
        let mut snapshot = cluster();
        snapshot.new_driver_revision();
        let report = analyze(&snapshot);
        for name in ["a100-01", "a100-02", "h100-01"] {
            let outdated = finding(&report, name, FindingKind::NotReady, Operand::Driver);
            assert!(
                outdated.message.contains("is ready but runs revision")
                    && outdated.message.contains("its rollout has not replaced it yet"),
                "{}",
                outdated.message
            );
        }
        assert!(node(&report, "cpu-01").findings.is_empty());
        // The pod replaced by one of the new revision: ready again.
        let driver = snapshot.daemon_set_of(Operand::Driver).unwrap().clone();
        snapshot.remove_pod_of(Operand::Driver, "a100-01").unwrap();
        snapshot
            .pods
            .push(gpuop_doctor::fixture::daemon_pod(&driver, "a100-01"));
        let report = analyze(&snapshot);
        assert!(
            !kinds(&report, "a100-01").contains(&(FindingKind::NotReady, Some("driver"))),
            "{:#?}",
            node(&report, "a100-01").findings
        );
    }

    /// Without NFD, the operator's `--gpu-node-selector` makes a node a GPU node; the doctor given the same
    /// selector judges the same nodes, and without it does not.
    #[test]
    fn the_gpu_node_selector_decides_as_the_operators_does() {
        use gpuop_api::labels::{GpuDetection, NFD_NVIDIA_PCI};
        let mut snapshot = cluster();
        let bare = snapshot.node_mut("a100-02").unwrap();
        *bare = bare
            .clone()
            .without_label(NFD_NVIDIA_PCI[0])
            .with_label("pool", "gpu");
        let nfd_only = analyze(&snapshot);
        assert!(
            !node(&nfd_only, "a100-02").gpu,
            "NFD says the node has no NVIDIA device"
        );
        let detection = GpuDetection::from_selector(Some("pool=gpu".parse().unwrap()));
        let report = gpuop_doctor::analysis::analyze_with(&snapshot, &detection);
        let judged = node(&report, "a100-02");
        assert!(judged.gpu);
        assert_eq!(judged.gpu_evidence, "matches --gpu-node-selector pool=gpu");
        assert!(judged.findings.is_empty(), "{:#?}", judged.findings);
        assert_eq!(report.summary.gpu_nodes, 3);
    }

    #[test]
    fn a_missing_pod_is_missing_on_its_node_only() {
        let mut snapshot = cluster();
        snapshot.remove_pod_of(Operand::DcgmExporter, "a100-02").unwrap();
        let report = analyze(&snapshot);
        assert_eq!(
            kinds(&report, "a100-02"),
            [(FindingKind::Missing, Some("dcgm-exporter"))]
        );
        let missing = finding(&report, "a100-02", FindingKind::Missing, Operand::DcgmExporter);
        assert_eq!(missing.link, Link::Health);
        assert!(
            missing
                .message
                .contains("DaemonSet gpu-operator/nvidia-dcgm-exporter selects the node"),
            "{}",
            missing.message
        );
        assert_eq!(node(&report, "a100-02").first_broken_link, Some(Link::Health));
        others_clean(&report, "a100-02");
    }

    #[test]
    fn a_pod_where_its_daemon_set_does_not_place_it_is_unexpected() {
        // The device plugin was switched off on the node, but its pod is still there.
        let mut snapshot = cluster();
        let node_mut = snapshot.node_mut("a100-02").unwrap();
        *node_mut = node_mut
            .clone()
            .with_label(Operand::DevicePlugin.info().deploy_label, "false");
        let report = analyze(&snapshot);
        let unexpected = finding(&report, "a100-02", FindingKind::Unexpected, Operand::DevicePlugin);
        assert!(
            unexpected
                .message
                .contains("node selector wants nvidia.com/gpu.deploy.device-plugin=true"),
            "{}",
            unexpected.message
        );
        others_clean(&report, "a100-02");
    }

    #[test]
    fn an_operand_on_a_node_without_a_gpu_is_unexpected_even_when_labels_select_it() {
        // Someone labelled the CPU node by hand; the DaemonSet placed its pod there.
        let mut snapshot = cluster();
        let label = Operand::DevicePlugin.info().deploy_label;
        let cpu = snapshot.node_mut("cpu-01").unwrap();
        *cpu = cpu
            .clone()
            .with_label(label, "true")
            .with_label(GPU_PRESENT, "true");
        snapshot.place_pod_of(Operand::DevicePlugin, "cpu-01");
        let report = analyze(&snapshot);
        let unexpected = finding(&report, "cpu-01", FindingKind::Unexpected, Operand::DevicePlugin);
        assert!(
            unexpected.message.contains("without an NVIDIA GPU"),
            "{}",
            unexpected.message
        );
        assert!(
            unexpected.message.contains("set by hand?"),
            "{}",
            unexpected.message
        );
        assert!(
            node(&report, "cpu-01")
                .findings
                .iter()
                .any(|f| f.kind == FindingKind::Contract
                    && f.message.contains("NFD found no NVIDIA PCI device")),
            "the hand-set gpu.present is called out"
        );
        others_clean(&report, "cpu-01");
    }

    #[test]
    fn an_untolerated_taint_hides_a_node_from_the_daemon_set_count_but_not_from_the_doctor() {
        let snapshot = ClusterBuilder::new()
            .with_node(Node::gpu("a100-01"))
            .with_node(Node::gpu("a100-02").with_taint("dedicated", Some("training"), "NoSchedule"))
            .build();
        // What the DaemonSet controller counts: one node, all ready, so its status looks healthy.
        let daemon_set = snapshot.daemon_set_of(Operand::DevicePlugin).unwrap();
        let status = daemon_set.status.as_ref().unwrap();
        assert_eq!(status.desired_number_scheduled, 1);
        assert_eq!(status.number_ready, 1);
        let report = analyze(&snapshot);
        let excluded = finding(&report, "a100-02", FindingKind::Excluded, Operand::DevicePlugin);
        assert!(
            excluded
                .message
                .contains("its taint dedicated=training:NoSchedule is not tolerated"),
            "{}",
            excluded.message
        );
        assert!(
            excluded.message.contains("desiredNumberScheduled"),
            "{}",
            excluded.message
        );
        // Every operand is kept off, the driver first.
        assert_eq!(node(&report, "a100-02").first_broken_link, Some(Link::Driver));
        let excluded_operands: Vec<_> = kinds(&report, "a100-02")
            .into_iter()
            .filter(|(kind, _)| *kind == FindingKind::Excluded)
            .map(|(_, operand)| operand.unwrap())
            .collect();
        assert!(excluded_operands.contains(&"driver") && excluded_operands.contains(&"container-toolkit"));
        // Its GPUs are still advertised from before: pods would land there with no runtime.
        assert!(
            kinds(&report, "a100-02").contains(&(FindingKind::GpuWithoutRuntime, Some("container-toolkit")))
        );
        others_clean(&report, "a100-02");
    }

    #[test]
    fn a_tolerated_taint_and_a_cordon_do_not_keep_operands_off() {
        let snapshot = ClusterBuilder::new()
            .with_node(Node::gpu("a100-01").with_taint(RESOURCE_GPU, Some("present"), "NoSchedule"))
            .with_node(
                Node::gpu("a100-02")
                    .cordoned()
                    .with_label(UPGRADE_STATE, "drain-required"),
            )
            .build();
        let report = analyze(&snapshot);
        assert!(!report.has_findings(), "{report:#?}");
        assert!(
            node(&report, "a100-02")
                .notes
                .iter()
                .any(|n| n.contains("cordoned for a driver upgrade"))
        );
        // A cordon without an upgrade is a finding: GPU pods cannot go there.
        let mut snapshot = snapshot;
        let cordoned = snapshot.node_mut("a100-02").unwrap();
        *cordoned = cordoned.clone().without_label(UPGRADE_STATE);
        let report = analyze(&snapshot);
        assert_eq!(kinds(&report, "a100-02"), [(FindingKind::Contract, None)]);
        assert_eq!(node(&report, "a100-02").first_broken_link, Some(Link::Scheduling));
    }

    #[test]
    fn a_device_plugin_running_without_a_ready_toolkit_is_an_order_violation_and_gpus_without_runtime() {
        let mut snapshot = cluster();
        snapshot
            .pod_of_mut(Operand::ContainerToolkit, "h100-01")
            .unwrap()
            .crash_loop(12);
        let report = analyze(&snapshot);
        let h100 = node(&report, "h100-01");
        assert_eq!(h100.first_broken_link, Some(Link::Toolkit));
        let not_ready = finding(
            &report,
            "h100-01",
            FindingKind::NotReady,
            Operand::ContainerToolkit,
        );
        assert!(
            not_ready.message.contains("CrashLoopBackOff"),
            "{}",
            not_ready.message
        );
        assert!(
            not_ready.message.contains("restarted 12 times"),
            "{}",
            not_ready.message
        );
        let order = finding(&report, "h100-01", FindingKind::Order, Operand::DevicePlugin);
        assert_eq!(
            order.message,
            "device-plugin runs while what it requires is not ready: container-toolkit is CrashLoopBackOff"
        );
        assert_eq!(order.link, Link::Toolkit);
        let danger = finding(
            &report,
            "h100-01",
            FindingKind::GpuWithoutRuntime,
            Operand::ContainerToolkit,
        );
        assert!(danger.message.contains("nvidia.com/gpu=8"), "{}", danger.message);
        assert!(
            danger.message.contains("silently get no GPU"),
            "{}",
            danger.message
        );
        // The validator also needs the device plugin: only operands that passed their gate count.
        let runtime = h100.checks.iter().find(|c| c.check.name() == "runtime").unwrap();
        assert_eq!(runtime.status, CheckStatus::Fail);
        others_clean(&report, "h100-01");
    }

    #[test]
    fn operands_waiting_in_their_init_containers_are_not_order_violations() {
        // A node coming up: the driver is ready, everything after it still waits in its first init container
        // (the toolkit for driver-ready, the device plugin and the others for toolkit-ready). The order holds.
        let mut snapshot = cluster();
        for operand in Operand::all().filter(|o| *o != Operand::Driver) {
            if let Some(pod) = snapshot.pod_of_mut(operand, "a100-02") {
                let first = pod.spec.init_containers[0].name.clone();
                pod.stuck_in_init(&first, None);
            }
        }
        let mut node_mut = snapshot.node_mut("a100-02").unwrap().clone();
        node_mut = node_mut.with_resource(RESOURCE_GPU, None, None);
        *snapshot.node_mut("a100-02").unwrap() = node_mut;
        let report = analyze(&snapshot);
        let found = kinds(&report, "a100-02");
        assert!(
            !found.iter().any(|(kind, _)| *kind == FindingKind::Order),
            "{found:?}"
        );
        assert!(
            !found
                .iter()
                .any(|(kind, _)| *kind == FindingKind::GpuWithoutRuntime),
            "{found:?}"
        );
        // The device plugin waits for toolkit-ready, so its stuck pod points at the toolkit link.
        let plugin = finding(&report, "a100-02", FindingKind::NotReady, Operand::DevicePlugin);
        assert_eq!(plugin.link, Link::Toolkit);
        assert!(
            plugin.message.contains("waits for toolkit-ready"),
            "{}",
            plugin.message
        );
        // And the toolkit waits for the driver.
        assert_eq!(node(&report, "a100-02").first_broken_link, Some(Link::Driver));
    }

    #[test]
    fn gpus_advertised_without_the_toolkit_are_the_dangerous_case() {
        let mut snapshot = cluster();
        snapshot
            .remove_pod_of(Operand::ContainerToolkit, "a100-01")
            .unwrap();
        let report = analyze(&snapshot);
        let found = kinds(&report, "a100-01");
        assert!(
            found.contains(&(FindingKind::Missing, Some("container-toolkit"))),
            "{found:?}"
        );
        let danger = finding(
            &report,
            "a100-01",
            FindingKind::GpuWithoutRuntime,
            Operand::ContainerToolkit,
        );
        assert!(
            danger.message.contains("the container toolkit is missing"),
            "{}",
            danger.message
        );
        others_clean(&report, "a100-01");
    }

    #[test]
    fn a_toolkit_installed_on_the_host_is_said_honestly_not_invented_as_a_fault() {
        let mut snapshot = cluster();
        let label = Operand::ContainerToolkit.info().deploy_label;
        let toolkit = snapshot
            .remove_pod_of(Operand::ContainerToolkit, "a100-02")
            .unwrap();
        drop(toolkit);
        let preinstalled = snapshot.node_mut("a100-02").unwrap();
        *preinstalled = preinstalled.clone().with_label(label, "false");
        let report = analyze(&snapshot);
        assert!(
            node(&report, "a100-02").findings.is_empty(),
            "{:#?}",
            node(&report, "a100-02").findings
        );
        let runtime = node(&report, "a100-02")
            .checks
            .iter()
            .find(|c| c.check.name() == "runtime")
            .unwrap();
        assert_eq!(
            runtime.status,
            CheckStatus::Pass,
            "the validator's toolkit validation passed"
        );
        assert!(
            runtime.message.contains("toolkit validation passed"),
            "{}",
            runtime.message
        );
        // Without a validator, the doctor cannot know and says so.
        snapshot
            .remove_pod_of(Operand::OperatorValidator, "a100-02")
            .unwrap();
        let report = analyze(&snapshot);
        let runtime = node(&report, "a100-02")
            .checks
            .iter()
            .find(|c| c.check.name() == "runtime")
            .unwrap();
        assert_eq!(runtime.status, CheckStatus::Unknown);
        assert!(
            node(&report, "a100-02")
                .notes
                .iter()
                .any(|n| n.contains("not deployed by the operator"))
        );
        assert!(
            !kinds(&report, "a100-02").contains(&(FindingKind::GpuWithoutRuntime, Some("container-toolkit"))),
            "no invented finding"
        );
    }

    #[test]
    fn a_crash_looping_validator_names_the_validation_that_fails() {
        let mut snapshot = cluster();
        snapshot
            .pod_of_mut(Operand::OperatorValidator, "a100-01")
            .unwrap()
            .stuck_in_init("cuda-validation", Some(6));
        let report = analyze(&snapshot);
        let validator = finding(
            &report,
            "a100-01",
            FindingKind::NotReady,
            Operand::OperatorValidator,
        );
        assert!(
            validator.message.contains("Init:CrashLoopBackOff"),
            "{}",
            validator.message
        );
        assert!(
            validator.message.contains("init container cuda-validation"),
            "{}",
            validator.message
        );
        assert_eq!(validator.link, Link::Cuda);
        assert_eq!(validator.check.name(), "positive-placement");
        others_clean(&report, "a100-01");

        // Stuck on toolkit validation, the broken link is the toolkit's.
        let mut snapshot = cluster();
        snapshot
            .pod_of_mut(Operand::OperatorValidator, "a100-01")
            .unwrap()
            .stuck_in_init("toolkit-validation", Some(3));
        let report = analyze(&snapshot);
        let validator = finding(
            &report,
            "a100-01",
            FindingKind::NotReady,
            Operand::OperatorValidator,
        );
        assert_eq!(validator.link, Link::Toolkit);
    }

    #[test]
    fn a_failed_mig_layout_is_reported_on_its_node() {
        let mut snapshot = cluster();
        let a100 = snapshot.node_mut("a100-01").unwrap();
        *a100 = a100
            .clone()
            .with_label(MIG_CONFIG, "all-1g.5gb")
            .with_label(MIG_CONFIG_STATE, "failed");
        let report = analyze(&snapshot);
        let failed = finding(&report, "a100-01", FindingKind::Contract, Operand::MigManager);
        assert!(
            failed.message.contains("nvidia.com/mig.config.state=failed"),
            "{}",
            failed.message
        );
        assert!(failed.message.contains("all-1g.5gb"), "{}", failed.message);
        assert_eq!(failed.check.name(), "resource");
        assert_eq!(failed.link, Link::DevicePlugin);
        others_clean(&report, "a100-01");
    }

    #[test]
    fn unhealthy_gpus_and_capacity_that_disagrees_with_the_count_are_resource_and_health_findings() {
        let mut snapshot = cluster();
        let a100 = snapshot.node_mut("a100-02").unwrap();
        *a100 = a100.clone().with_resource(RESOURCE_GPU, Some(8), Some(6));
        let h100 = snapshot.node_mut("h100-01").unwrap();
        *h100 = h100.clone().with_resource(RESOURCE_GPU, Some(4), Some(4));
        let report = analyze(&snapshot);
        let unhealthy = &node(&report, "a100-02").findings[0];
        assert_eq!(unhealthy.link, Link::Health);
        assert_eq!(
            unhealthy.message,
            "2 of 8 nvidia.com/gpu are not allocatable: the device plugin reports them unhealthy"
        );
        let short = &node(&report, "h100-01").findings[0];
        assert_eq!(short.link, Link::DevicePlugin);
        assert!(short.message.contains("nvidia.com/gpu=4"), "{}", short.message);
        assert!(
            short.message.contains("8 GPUs x 1 replicas = 8"),
            "{}",
            short.message
        );
    }

    #[test]
    fn mig_devices_shared_under_their_renamed_name_match_the_count() {
        // Mixed MIG with time-slicing and renameByDefault: the device plugin advertises each profile as
        // `<resource>.shared`, feature discovery counts the devices and their replicas.
        let spec: gpuop_api::ClusterPolicySpec =
            serde_json::from_value(serde_json::json!({"mig": {"strategy": "mixed"}})).unwrap();
        let node = Node::gpu("a100-01")
            .mig_capable()
            .with_label("nvidia.com/mig-1g.10gb.count", "56")
            .with_label("nvidia.com/mig-1g.10gb.replicas", "2")
            .with_resource("nvidia.com/mig-1g.10gb.shared", Some(112), Some(112))
            .with_resource(RESOURCE_GPU, Some(0), Some(0));
        let report = analyze(
            &ClusterBuilder::new()
                .with_policy(spec.clone())
                .with_node(node.clone())
                .build(),
        );
        assert!(node_findings_about(&report, "a100-01", "mig-1g.10gb").is_empty());

        // One instance too many is still caught under the renamed name.
        let short = node.with_resource("nvidia.com/mig-1g.10gb.shared", Some(110), Some(110));
        let report = analyze(&ClusterBuilder::new().with_policy(spec).with_node(short).build());
        let findings = node_findings_about(&report, "a100-01", "mig-1g.10gb");
        assert_eq!(
            findings,
            [
                "the node's capacity has nvidia.com/mig-1g.10gb.shared=110, but feature discovery counts 56 such \
              MIG devices x 2 replicas = 112"
            ]
        );
    }

    fn node_findings_about(report: &Report, node_name: &str, text: &str) -> Vec<String> {
        node(report, node_name)
            .findings
            .iter()
            .filter(|f| f.message.contains(text))
            .map(|f| f.message.clone())
            .collect()
    }

    #[test]
    fn the_runtime_class_must_exist() {
        let snapshot = ClusterBuilder::new()
            .with_node(Node::gpu("a100-01"))
            .without_runtime_class()
            .build();
        let report = analyze(&snapshot);
        let missing = node(&report, "a100-01")
            .findings
            .iter()
            .find(|f| f.kind == FindingKind::Contract && f.message.starts_with("RuntimeClass nvidia"))
            .expect("a finding about the RuntimeClass");
        assert_eq!(missing.link, Link::Toolkit);
    }

    #[test]
    fn deploy_switches_that_the_operator_would_not_leave_are_findings() {
        let mut snapshot = cluster();
        let dp = Operand::DevicePlugin.info().deploy_label;
        let gfd = Operand::GpuFeatureDiscovery.info().deploy_label;
        snapshot.remove_pod_of(Operand::DevicePlugin, "a100-02");
        snapshot.remove_pod_of(Operand::GpuFeatureDiscovery, "a100-02");
        let a100 = snapshot.node_mut("a100-02").unwrap();
        *a100 = a100
            .clone()
            .with_label(dp, "paused-for-driver-upgrade")
            .with_label(gfd, "True");
        let report = analyze(&snapshot);
        let messages: Vec<&str> = node(&report, "a100-02")
            .findings
            .iter()
            .map(|f| f.message.as_str())
            .collect();
        assert!(
            messages
                .iter()
                .any(|m| m.contains("no driver upgrade is in progress")),
            "a pause left behind: {messages:#?}"
        );
        assert!(
            messages
                .iter()
                .any(|m| m
                    .contains("nvidia.com/gpu.deploy.gpu-feature-discovery=True is neither true nor false")),
            "{messages:#?}"
        );
    }

    #[test]
    fn the_helpers_place_pods_with_kubernetes_rules() {
        // The fixtures and the analysis agree on placement: converging never leaves a finding.
        let snapshot = cluster();
        for pod in &snapshot.pods {
            let node = snapshot.node(pod.target_node().unwrap()).unwrap();
            let owner = &pod.metadata.owner_references[0].name;
            let daemon_set = snapshot
                .daemon_sets
                .iter()
                .find(|d| d.metadata.name.as_ref() == Some(owner))
                .unwrap();
            let spec = daemon_set.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
            assert!(daemon_pod_fits(node, spec).is_ok(), "{}", pod.key());
        }
    }

    #[test]
    fn a_daemon_set_pod_the_scheduler_cannot_bind_is_pending_on_its_node() {
        let mut snapshot = cluster();
        snapshot
            .pod_of_mut(Operand::DcgmExporter, "a100-01")
            .unwrap()
            .unbound(
                "0/4 nodes are available: 1 Insufficient cpu, 3 node(s) didn't match Pod's node affinity.",
            );
        let report = analyze(&snapshot);
        let pending = finding(&report, "a100-01", FindingKind::NotReady, Operand::DcgmExporter);
        assert!(
            pending
                .message
                .contains("is Unschedulable: Unschedulable: 0/4 nodes"),
            "{}",
            pending.message
        );
    }

    #[test]
    fn a_missing_daemon_set_of_an_enabled_operand_is_missing_on_every_node_it_should_run_on() {
        let mut snapshot = cluster();
        snapshot
            .daemon_sets
            .retain(|d| d.metadata.name.as_deref() != Some(Operand::GpuFeatureDiscovery.info().daemonset));
        snapshot.pods.retain(|p: &PodFacts| {
            p.metadata.owner_references[0].name != Operand::GpuFeatureDiscovery.info().daemonset
        });
        let report = analyze(&snapshot);
        for name in ["a100-01", "a100-02", "h100-01"] {
            let missing = finding(&report, name, FindingKind::Missing, Operand::GpuFeatureDiscovery);
            assert!(
                missing
                    .message
                    .contains("but no DaemonSet gpu-feature-discovery exists"),
                "{}",
                missing.message
            );
        }
        assert!(node(&report, "cpu-01").findings.is_empty());
    }
}

mod property {
    //! Adding healthy GPU nodes, CPU nodes or unrelated pods never changes the findings of the nodes already
    //! there, and never hides a fault; a generated fault-free cluster has none.

    use super::*;
    use gpuop_api::labels::{GPU_TAINT, RESOURCE_GPU};
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Shape {
        A100 { mig: bool },
        H100,
        L4 { gpus: i64 },
        Tainted,
        Cpu,
    }

    fn shape() -> impl Strategy<Value = Shape> {
        prop_oneof![
            any::<bool>().prop_map(|mig| Shape::A100 { mig }),
            Just(Shape::H100),
            (1_i64..=8).prop_map(|gpus| Shape::L4 { gpus }),
            Just(Shape::Tainted),
            Just(Shape::Cpu),
        ]
    }

    fn build_node(name: &str, shape: &Shape) -> Node {
        match shape {
            Shape::A100 { mig: true } => Node::gpu(name).mig_capable(),
            Shape::A100 { mig: false } => Node::gpu(name),
            Shape::H100 => Node::gpu(name).with_gpus("NVIDIA-H100-80GB-HBM3", 8),
            Shape::L4 { gpus } => Node::gpu(name).with_gpus("NVIDIA-L4", *gpus),
            // A taint the operands tolerate.
            Shape::Tainted => Node::gpu(name).with_taint(GPU_TAINT, Some("present"), "NoSchedule"),
            Shape::Cpu => Node::cpu(name),
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Fault {
        MissingPod(usize),
        CrashLoop(usize),
        StuckInit(usize),
        NoToolkit,
        Unhealthy,
        MigFailed,
        Taint,
    }

    fn fault() -> impl Strategy<Value = Fault> {
        let operand = 0_usize..8;
        prop_oneof![
            operand.clone().prop_map(Fault::MissingPod),
            operand.clone().prop_map(Fault::CrashLoop),
            operand.prop_map(Fault::StuckInit),
            Just(Fault::NoToolkit),
            Just(Fault::Unhealthy),
            Just(Fault::MigFailed),
            Just(Fault::Taint),
        ]
    }

    const OPERANDS: [Operand; 8] = [
        Operand::Driver,
        Operand::ContainerToolkit,
        Operand::OperatorValidator,
        Operand::DevicePlugin,
        Operand::Dcgm,
        Operand::DcgmExporter,
        Operand::GpuFeatureDiscovery,
        Operand::MigManager,
    ];

    /// Plants a fault on a GPU node; returns the kind of finding it must cause there.
    fn plant(snapshot: &mut Snapshot, name: &str, fault: Fault) -> Option<FindingKind> {
        match fault {
            Fault::MissingPod(i) => snapshot
                .remove_pod_of(OPERANDS[i], name)
                .map(|_| FindingKind::Missing),
            Fault::CrashLoop(i) => snapshot.pod_of_mut(OPERANDS[i], name).map(|pod| {
                pod.crash_loop(3);
                FindingKind::NotReady
            }),
            Fault::StuckInit(i) => {
                let pod = snapshot.pod_of_mut(OPERANDS[i], name)?;
                let init = pod.spec.init_containers.first()?.name.clone();
                pod.stuck_in_init(&init, Some(2));
                Some(FindingKind::NotReady)
            }
            Fault::NoToolkit => snapshot
                .remove_pod_of(Operand::ContainerToolkit, name)
                .map(|_| FindingKind::GpuWithoutRuntime),
            Fault::Unhealthy => {
                let node = snapshot.node_mut(name)?;
                *node = node
                    .clone()
                    .with_resource(RESOURCE_GPU, Some(8), Some(7))
                    .with_gpus("x", 8);
                node.status.as_mut()?.allocatable.as_mut()?.insert(
                    RESOURCE_GPU.to_owned(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("7".into()),
                );
                Some(FindingKind::Contract)
            }
            Fault::MigFailed => {
                let node = snapshot.node_mut(name)?;
                *node = node
                    .clone()
                    .with_label(gpuop_api::labels::MIG_CONFIG_STATE, "failed");
                Some(FindingKind::Contract)
            }
            Fault::Taint => {
                let node = snapshot.node_mut(name)?;
                *node = node.clone().with_taint("dedicated", Some("x"), "NoSchedule");
                Some(FindingKind::Excluded)
            }
        }
    }

    fn findings_by_node(report: &Report) -> Vec<(String, Vec<Finding>)> {
        report
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.findings.clone()))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn a_generated_fault_free_cluster_has_no_findings(shapes in proptest::collection::vec(shape(), 1..12)) {
            let snapshot = ClusterBuilder::new()
                .with_nodes(shapes.iter().enumerate().map(|(i, s)| build_node(&format!("node-{i:02}"), s)))
                .build();
            let report = analyze(&snapshot);
            prop_assert!(!report.has_findings(), "{:#?}", report.nodes.iter().flat_map(|n| &n.findings).collect::<Vec<_>>());
        }

        #[test]
        fn more_nodes_and_unrelated_pods_change_nothing_and_hide_nothing(
            shapes in proptest::collection::vec(shape(), 1..8),
            faults in proptest::collection::vec((0_usize..8, fault()), 0..6),
            joining in proptest::collection::vec(shape(), 0..6),
            unrelated in proptest::collection::vec((0_usize..16, 0_i64..3, any::<bool>()), 0..10),
        ) {
            let mut snapshot = ClusterBuilder::new()
                .with_nodes(shapes.iter().enumerate().map(|(i, s)| build_node(&format!("node-{i:02}"), s)))
                .build();
            let mut planted: Vec<(String, FindingKind)> = Vec::new();
            for (index, fault) in faults {
                let index = index % shapes.len();
                let name = format!("node-{index:02}");
                // One fault a node: two on one node may explain each other (a taint keeps a pod off).
                if matches!(shapes[index], Shape::Cpu) || planted.iter().any(|(n, _)| *n == name) {
                    continue;
                }
                if let Some(kind) = plant(&mut snapshot, &name, fault) {
                    planted.push((name, kind));
                }
            }
            let before = analyze(&snapshot);
            for (name, kind) in &planted {
                prop_assert!(
                    node(&before, name).findings.iter().any(|f| f.kind == *kind),
                    "{kind:?} planted on {name} is not found: {:#?}", node(&before, name).findings
                );
            }
            let healthy: Vec<String> = before.nodes.iter().filter(|n| n.findings.is_empty()).map(|n| n.name.clone()).collect();
            for name in &healthy {
                prop_assert!(!planted.iter().any(|(n, _)| n == name), "a planted fault on {name} found nothing");
            }

            let existing = snapshot.nodes.len();
            for (i, shape) in joining.iter().enumerate() {
                snapshot.join(build_node(&format!("joined-{i:02}"), shape));
            }
            for (i, (target, gpus, bound)) in unrelated.iter().enumerate() {
                let mut pod = PodFacts::workload("team-a", &format!("train-{i}")).requesting(RESOURCE_GPU, *gpus);
                if *bound {
                    let node = snapshot.nodes[target % existing].metadata.name.clone().unwrap();
                    pod = pod.running_on(&node);
                } else {
                    pod = pod.unschedulable("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.");
                }
                snapshot.pods.push(pod);
            }
            let after = analyze(&snapshot);
            let after_existing: Vec<(String, Vec<Finding>)> = findings_by_node(&after)
                .into_iter()
                .filter(|(name, _)| !name.starts_with("joined-"))
                .collect();
            prop_assert_eq!(findings_by_node(&before), after_existing);
            for node in after.nodes.iter().filter(|n| n.name.starts_with("joined-")) {
                prop_assert!(node.findings.is_empty(), "{}: {:#?}", node.name, node.findings);
            }
            prop_assert!(after.findings.is_empty());
        }
    }
}

mod reading {
    //! The snapshot reader takes list items straight into their projections, skipping what it does not read;
    //! whatever a file holds (cut short, wrong types, unknown kinds, huge strings, deep nesting) it gives
    //! what reading each document whole as a JSON value gives, or an error naming the item and the field,
    //! and never panics.

    use super::*;
    use gpuop_doctor::load::{Loader, Location};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn written(snapshot: &Snapshot) -> String {
        let mut out = Vec::new();
        snapshot.write_json(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The snapshot read from a text, written back with its notes; or the error.
    fn read(text: &str) -> Result<String, String> {
        let mut loader = Loader::default();
        loader.add_text(text, "test").map_err(|e| e.to_string())?;
        let snapshot = loader.finish();
        Ok(format!("{}{:?}", written(&snapshot), snapshot.notes))
    }

    /// The same, each document read whole as a JSON value and added as one (the way YAML is read).
    fn read_through_values(text: &str) -> Result<String, String> {
        let mut loader = Loader::default();
        let documents = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        for (index, document) in documents.enumerate() {
            let document = document.map_err(|e| format!("test: not valid JSON: {e}"))?;
            let at = Location {
                origin: "test".to_owned(),
                document: index + 1,
                item: None,
            };
            loader.add_value(document, &at).map_err(|e| e.to_string())?;
        }
        let snapshot = loader.finish();
        Ok(format!("{}{:?}", written(&snapshot), snapshot.notes))
    }

    fn faulty_cluster() -> Value {
        let mut snapshot = cluster();
        snapshot
            .pod_of_mut(Operand::DevicePlugin, "a100-01")
            .unwrap()
            .crash_loop(3);
        snapshot
            .pods
            .push(PodFacts::workload("team-a", "train-0").running_on("h100-01"));
        serde_json::from_str(&written(&snapshot)).unwrap()
    }

    /// Walks from an item of the list by the indexes `path` picks, as deep as the item goes.
    fn pick<'v>(
        list: &'v mut Value,
        item: prop::sample::Index,
        path: &[prop::sample::Index],
    ) -> &'v mut Value {
        let items = list["items"].as_array().unwrap();
        let index = item.index(items.len());
        let mut pointer = format!("/items/{index}");
        let mut value = &items[index];
        for step in path {
            value = match value {
                Value::Object(map) if !map.is_empty() => {
                    let (key, value) = map.iter().nth(step.index(map.len())).unwrap();
                    pointer.push('/');
                    pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    value
                }
                Value::Array(array) if !array.is_empty() => {
                    let index = step.index(array.len());
                    pointer.push_str(&format!("/{index}"));
                    &array[index]
                }
                _ => break,
            };
        }
        list.pointer_mut(&pointer).unwrap()
    }

    fn replacement() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("JSON has no NaN", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,12}".prop_map(Value::from),
            Just(json!([])),
            Just(json!({})),
            Just(json!([{"name": 1}, "x", null])),
            Just(json!({"type": 5, "status": [], "metadata": "x"})),
            (1_usize..200_000).prop_map(|n| Value::from("x".repeat(n))),
        ]
    }

    /// A written snapshot reads back the same either way, and the fault planted in it is found.
    #[test]
    fn a_written_snapshot_reads_back_the_same_either_way() {
        let text = faulty_cluster().to_string();
        let fast = read(&text).unwrap();
        assert_eq!(Ok(fast), read_through_values(&text));
        let mut loader = Loader::default();
        loader.add_text(&text, "test").unwrap();
        let report = analyze(&loader.finish());
        finding(&report, "a100-01", FindingKind::NotReady, Operand::DevicePlugin);
        others_clean(&report, "a100-01");
    }

    #[test]
    fn a_wrong_type_in_an_item_names_the_item_and_the_field() {
        let mut list = faulty_cluster();
        let items = list["items"].as_array_mut().unwrap();
        let pod = items
            .iter()
            .position(|item| item["kind"] == "Pod" && item["metadata"]["name"] == "train-0")
            .unwrap();
        items[pod]["status"]["containerStatuses"] = json!([{"name": "main", "restartCount": "three"}]);
        let text = list.to_string();
        let items = list["items"].as_array_mut().unwrap();
        let error = read(&text).unwrap_err();
        assert_eq!(
            error,
            format!(
                "test: document 1, item {pod} (Pod team-a/train-0): field status.containerStatuses[0].restartCount: \
                 invalid type: string \"three\", expected i32"
            )
        );
        let node = items.iter().position(|item| item["kind"] == "Node").unwrap();
        items[node]["spec"]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}, {"key": 7}]);
        let error = read(&list.to_string()).unwrap_err();
        assert!(
            error.starts_with(&format!(
                "test: document 1, item {node} (Node a100-01): field spec.taints[1].key:"
            )),
            "{error}"
        );
    }

    /// A node's images, volumes and managed fields are skipped unread: however they look, they cannot stop
    /// the doctor.
    #[test]
    fn fields_the_doctor_does_not_read_are_skipped_whatever_they_hold() {
        let mut list = faulty_cluster();
        let items = list["items"].as_array_mut().unwrap();
        let node = items.iter().position(|item| item["kind"] == "Node").unwrap();
        items[node]["status"]["images"] = json!([{"names": 5, "sizeBytes": "big"}]);
        items[node]["status"]["volumesInUse"] = json!("not a list");
        items[node]["metadata"]["managedFields"] = json!([{"manager": ["x"], "fieldsV1": 1}]);
        let text = list.to_string();
        let read = read(&text).unwrap();
        assert_eq!(Ok(read.clone()), read_through_values(&text));
        assert!(
            !read.contains("managedFields") && !read.contains("volumesInUse"),
            "{read}"
        );
    }

    #[test]
    fn unknown_kinds_are_counted_and_skipped() {
        let text = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"x": "y".repeat(100_000)}},
            {"kind": "Widget", "spec": [1, 2, {"kind": "Node"}]},
            {"kind": 5},
            {"metadata": {"name": "no-kind"}},
            "a string",
            42,
            {"kind": "NodeList", "items": [{"kind": "Node", "metadata": {"name": "inner"}}]},
            {"kind": "Node", "metadata": {"name": "n\u{e9}\"\\"}}
        ]})
        .to_string();
        let read = read(&text).unwrap();
        assert_eq!(Ok(read.clone()), read_through_values(&text));
        assert!(
            read.ends_with("[\"ignored objects of other kinds: (no kind) x4, ConfigMap x1, Widget x1\"]"),
            "{read}"
        );
        assert!(
            read.contains(r#""name":"inner""#) && read.contains(r#""name":"né\"\\""#),
            "{read}"
        );
    }

    /// The list's text with each item's `kind` written after all its other fields, as a hand-made file or
    /// a tool that sorts nothing may have it.
    fn kind_last(list: &Value) -> String {
        let items: Vec<String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| match item.as_object() {
                Some(map) if map.contains_key("kind") => {
                    let mut rest = map.clone();
                    let kind = rest.remove("kind").unwrap();
                    let rest = Value::Object(rest).to_string();
                    match rest.strip_suffix('}').unwrap() {
                        "{" => format!("{{\"kind\":{kind}}}"),
                        body => format!("{body},\"kind\":{kind}}}"),
                    }
                }
                _ => item.to_string(),
            })
            .collect();
        let mut top = list.as_object().unwrap().clone();
        top.remove("items");
        let top = Value::Object(top).to_string();
        format!(
            "{},\"items\":[{}]}}",
            top.strip_suffix('}').unwrap(),
            items.join(",\n")
        )
    }

    #[test]
    fn an_item_whose_kind_comes_after_its_other_fields_reads_the_same() {
        let list = faulty_cluster();
        let text = kind_last(&list);
        assert!(
            text.contains(r#","kind":"Pod"}"#) && !text.contains(r#""kind":"Pod","#),
            "the kind is last: {text}"
        );
        let read = read(&text).unwrap();
        assert_eq!(Ok(read.clone()), super::reading::read(&list.to_string()));
        assert_eq!(Ok(read), read_through_values(&text));
        let mut loader = Loader::default();
        loader.add_text(&text, "test").unwrap();
        let report = analyze(&loader.finish());
        finding(&report, "a100-01", FindingKind::NotReady, Operand::DevicePlugin);
        others_clean(&report, "a100-01");
    }

    #[test]
    fn an_unknown_kind_after_the_other_fields_is_skipped_and_counted() {
        let text = r#"{"kind": "List", "items": [
            {"metadata": {"name": "c"}, "data": {"x": [[[{"deep": "yes"}]]], "y": 5}, "kind": "ConfigMap"},
            {"metadata": {"name": "a"}, "status": {"images": "not a list"}, "kind": "Node"},
            {"spec": [1, {"kind": "Node"}], "kind": "Widget", "status": "after"},
            {"metadata": {"name": "no-kind"}, "spec": {"kind": "Pod"}}
        ]}"#;
        let read = read(text).unwrap();
        assert_eq!(Ok(read.clone()), read_through_values(text));
        assert!(
            read.ends_with("[\"ignored objects of other kinds: (no kind) x1, ConfigMap x1, Widget x1\"]"),
            "{read}"
        );
        assert!(read.contains(r#""name":"a""#), "{read}");
    }

    #[test]
    fn a_wrong_type_before_the_kind_names_the_item_and_the_field() {
        let text = r#"{"kind": "List", "items": [
            {"metadata": {"name": "a"}, "kind": "Node"},
            {"status": {"containerStatuses": [{"name": "main", "restartCount": "three"}]},
             "metadata": {"name": "p", "namespace": "n"}, "kind": "Pod"}
        ]}"#;
        assert_eq!(
            read(text).unwrap_err(),
            "test: document 1, item 1 (Pod n/p): field status.containerStatuses[0].restartCount: invalid type: \
             string \"three\", expected i32"
        );
        let text = r#"{"kind": "List", "items": [
            {"metadata": {"name": "a"}, "kind": "Node"},
            {"metadata": {"name": "b"}, "kind": "Node", "spec": {"taints": [{"key": "k", "effect": 5}]}}
        ]}"#;
        assert_eq!(
            read(text).unwrap_err(),
            "test: document 1, item 1 (Node b): field spec.taints[0].effect: invalid type: integer `5`, expected \
             a string"
        );
    }

    #[test]
    fn a_cut_file_is_an_error_with_its_line_and_column() {
        let text = faulty_cluster().to_string();
        let cut = text.char_indices().nth(text.len() / 2).unwrap().0;
        let error = read(&text[..cut]).unwrap_err();
        assert!(
            error.starts_with("test: not valid JSON: EOF while parsing"),
            "{error}"
        );
        assert!(error.contains("line 1 column"), "{error}");
    }

    /// A field nested deeper than a JSON value may be (128 levels) is skipped when the doctor does not read
    /// it, and is an error naming the object where it does; nothing overflows the stack.
    #[test]
    fn deep_nesting_is_skipped_unread_or_named() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let text = format!(
            r#"{{"items": [{{"kind": "Widget", "x": {deep}}}, {{"kind": "Node", "metadata": {{"name": "a"}}, "x": {deep}}}]}}"#
        );
        let read = read(&text).unwrap();
        assert!(read.contains(r#""name":"a""#), "{read}");
        let text = format!(
            r#"{{"items": [{{"kind": "Pod", "metadata": {{"name": "p", "namespace": "n", "labels": {deep}}}}}]}}"#
        );
        let error = super::reading::read(&text).unwrap_err();
        assert_eq!(
            error,
            "test: document 1, item 0 (Pod n/p): field (the object): nested more than 128 levels deep, deeper than \
             the doctor reads"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

        /// Any value put anywhere in an item: the same snapshot as through JSON values, or the same error,
        /// which names the item.
        #[test]
        fn any_value_anywhere_reads_as_through_json_values(
            item in any::<prop::sample::Index>(),
            path in proptest::collection::vec(any::<prop::sample::Index>(), 0..7),
            value in replacement(),
        ) {
            let mut list = faulty_cluster();
            *pick(&mut list, item, &path) = value;
            let text = list.to_string();
            let fast = read(&text);
            prop_assert_eq!(&fast, &read_through_values(&text));
            if let Err(error) = fast {
                prop_assert!(error.starts_with("test: document 1, item "), "{}", error);
                prop_assert!(error.contains(": field "), "{}", error);
            }
        }

        /// The same with every item's kind after its other fields: what comes before the kind is read once
        /// the kind is known, with the same result or the same error.
        #[test]
        fn any_value_anywhere_with_the_kind_last_reads_as_through_json_values(
            item in any::<prop::sample::Index>(),
            path in proptest::collection::vec(any::<prop::sample::Index>(), 0..7),
            value in replacement(),
        ) {
            let mut list = faulty_cluster();
            *pick(&mut list, item, &path) = value;
            let text = kind_last(&list);
            let fast = read(&text);
            prop_assert_eq!(&fast, &read_through_values(&text));
            if let Err(error) = fast {
                prop_assert!(error.starts_with("test: document 1, item "), "{}", error);
                prop_assert!(error.contains(": field "), "{}", error);
            }
        }

        /// An unknown kind is skipped, a known one is read as that kind, whatever the item holds.
        #[test]
        fn any_kind_reads_as_through_json_values(item in any::<prop::sample::Index>(), kind in prop_oneof![
            "[A-Za-z]{0,12}",
            Just("Node".to_owned()),
            Just("Pod".to_owned()),
            Just("DaemonSet".to_owned()),
            Just("RuntimeClass".to_owned()),
            Just("ClusterPolicy".to_owned()),
            Just("PodList".to_owned()),
        ]) {
            let mut list = faulty_cluster();
            pick(&mut list, item, &[])["kind"] = Value::from(kind);
            let text = list.to_string();
            prop_assert_eq!(read(&text), read_through_values(&text));
        }

        /// A file cut anywhere is an error, or (cut in the whitespace at its end) the whole file.
        #[test]
        fn a_file_cut_anywhere_never_panics(cut in any::<prop::sample::Index>()) {
            let text = faulty_cluster().to_string();
            let cut = cut.index(text.len());
            let Some(part) = text.get(..cut) else { return Ok(()) };
            match read(part) {
                Ok(_) => prop_assert!(part.trim().is_empty() || serde_json::from_str::<Value>(part).is_ok()),
                Err(error) => prop_assert!(error.starts_with("test: not valid JSON"), "{}", error),
            }
        }
    }
}

mod explain {
    use super::*;
    use gpuop_api::labels::RESOURCE_GPU;
    use gpuop_doctor::explain::explain;

    #[test]
    fn a_pending_gpu_pod_leads_to_the_first_broken_link_on_the_node_that_would_take_it() {
        // Only a100-02 would fit (selector), and its device plugin waits for a toolkit that crash-loops.
        let mut snapshot = cluster();
        snapshot
            .pod_of_mut(Operand::ContainerToolkit, "a100-02")
            .unwrap()
            .crash_loop(5);
        snapshot
            .pod_of_mut(Operand::DevicePlugin, "a100-02")
            .unwrap()
            .stuck_in_init("toolkit-validation", None);
        let a100 = snapshot.node_mut("a100-02").unwrap();
        *a100 = a100
            .clone()
            .with_resource(RESOURCE_GPU, Some(0), Some(0))
            .with_label("pool", "training");
        snapshot.pods.push(
            PodFacts::workload("team-a", "train-0")
                .requesting(RESOURCE_GPU, 1)
                .selecting("pool", "training")
                .unschedulable("0/4 nodes are available: 1 Insufficient nvidia.com/gpu, 3 node(s) didn't match Pod's node affinity/selector."),
        );
        let explanation = explain(&snapshot, "team-a", "train-0").unwrap();
        assert_eq!(explanation.verdict.link, Some(Link::Toolkit));
        assert!(
            explanation
                .verdict
                .sentence
                .starts_with("No node can run the pod; a100-02 would, but advertises no nvidia.com/gpu"),
            "{}",
            explanation.verdict.sentence
        );
        assert!(
            explanation.verdict.sentence.contains("CrashLoopBackOff"),
            "{}",
            explanation.verdict.sentence
        );
        let h100 = explanation.nodes.iter().find(|n| n.name == "h100-01").unwrap();
        assert_eq!(
            h100.reasons,
            ["node selector wants pool=training, the node lacks the label"]
        );
    }

    #[test]
    fn a_pending_pod_when_every_gpu_is_in_use_is_a_scheduling_matter() {
        let mut snapshot = ClusterBuilder::new().with_node(Node::gpu("a100-01")).build();
        snapshot.pods.push(
            PodFacts::workload("team-a", "big")
                .requesting(RESOURCE_GPU, 6)
                .running_on("a100-01"),
        );
        snapshot.pods.push(
            PodFacts::workload("team-a", "late")
                .requesting(RESOURCE_GPU, 4)
                .unschedulable("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."),
        );
        let explanation = explain(&snapshot, "team-a", "late").unwrap();
        assert_eq!(explanation.verdict.link, Some(Link::Scheduling));
        assert!(
            explanation
                .verdict
                .sentence
                .contains("has 2 of 8 nvidia.com/gpu free, the pod asks for 4"),
            "{}",
            explanation.verdict.sentence
        );
    }

    #[test]
    fn a_cpu_node_is_not_where_a_gpu_pod_may_go() {
        let mut snapshot = ClusterBuilder::new()
            .with_node(Node::gpu("a100-01"))
            .with_node(Node::cpu("cpu-01"))
            .build();
        snapshot.pods.push(
            PodFacts::workload("team-a", "big")
                .requesting(RESOURCE_GPU, 6)
                .running_on("a100-01"),
        );
        snapshot.pods.push(
            PodFacts::workload("team-a", "late")
                .requesting(RESOURCE_GPU, 4)
                .unschedulable("0/2 nodes are available: 1 Insufficient nvidia.com/gpu."),
        );
        let explanation = explain(&snapshot, "team-a", "late").unwrap();
        assert_eq!(explanation.verdict.link, Some(Link::Scheduling));
        assert!(
            explanation
                .verdict
                .sentence
                .starts_with("No node the pod may go to has enough free GPUs: a100-01 (has 2 of 8"),
            "{}",
            explanation.verdict.sentence
        );
        assert!(
            !explanation.verdict.sentence.contains("cpu-01"),
            "{}",
            explanation.verdict.sentence
        );
    }

    #[test]
    fn a_pod_asking_for_mig_devices_under_the_single_strategy_is_told_why() {
        let mut snapshot = cluster();
        snapshot.pods.push(
            PodFacts::workload("team-a", "mig")
                .requesting("nvidia.com/mig-1g.5gb", 1)
                .unschedulable("0/4 nodes are available"),
        );
        let explanation = explain(&snapshot, "team-a", "mig").unwrap();
        assert_eq!(explanation.verdict.link, Some(Link::DevicePlugin));
        assert!(
            explanation
                .verdict
                .sentence
                .starts_with("No node advertises nvidia.com/mig-1g.5gb; only the mixed MIG strategy"),
            "{}",
            explanation.verdict.sentence
        );
    }

    #[test]
    fn a_running_pod_on_a_node_whose_toolkit_broke_cannot_see_its_gpu() {
        let mut snapshot = cluster();
        snapshot.pods.push(
            PodFacts::workload("team-a", "infer")
                .requesting(RESOURCE_GPU, 1)
                .running_on("h100-01"),
        );
        let healthy = explain(&snapshot, "team-a", "infer").unwrap();
        assert_eq!(healthy.verdict.link, None, "{}", healthy.verdict.sentence);
        snapshot.remove_pod_of(Operand::ContainerToolkit, "h100-01");
        let broken = explain(&snapshot, "team-a", "infer").unwrap();
        assert_eq!(broken.verdict.link, Some(Link::Toolkit));
        assert!(
            broken
                .verdict
                .sentence
                .starts_with("The pod is on node h100-01, where the chain breaks at toolkit/CDI"),
            "{}",
            broken.verdict.sentence
        );
    }

    #[test]
    fn a_pod_that_asks_for_no_gpu_is_told_so() {
        let mut snapshot = cluster();
        snapshot.pods.push(
            PodFacts::workload("team-a", "cpu-only")
                .requesting("cpu", 1)
                .running_on("a100-01"),
        );
        let explanation = explain(&snapshot, "team-a", "cpu-only").unwrap();
        assert_eq!(explanation.verdict.link, Some(Link::DevicePlugin));
        assert!(
            explanation.verdict.sentence.contains("asks for no GPU resource"),
            "{}",
            explanation.verdict.sentence
        );
    }

    #[test]
    fn an_unknown_pod_is_an_error_that_says_what_a_snapshot_holds() {
        let error = explain(&cluster(), "team-a", "nope").unwrap_err().to_string();
        assert!(
            error.starts_with("pod team-a/nope is not in the snapshot"),
            "{error}"
        );
    }
}

mod cli {
    //! The `kubectl-gpu` binary on snapshot files: exit codes, the JSON schema, the table.

    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};

    fn kubectl_gpu(args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .expect("kubectl-gpu runs")
    }

    fn stdout(output: &Output) -> String {
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn stderr(output: &Output) -> String {
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    fn write(dir: &Path, name: &str, snapshot: &Snapshot) -> PathBuf {
        let path = dir.join(name);
        let mut file = std::fs::File::create(&path).unwrap();
        snapshot.write_json(&mut file).unwrap();
        path
    }

    fn faulty() -> Snapshot {
        let mut snapshot = cluster();
        snapshot
            .pod_of_mut(Operand::ContainerToolkit, "a100-02")
            .unwrap()
            .crash_loop(9);
        snapshot
    }

    #[test]
    fn json_follows_the_documented_schema_and_exit_codes_follow_findings() {
        let dir = tempfile::tempdir().unwrap();
        let healthy = write(dir.path(), "healthy.json", &cluster());
        let output = kubectl_gpu(&["doctor", "--snapshot", healthy.to_str().unwrap(), "-o", "json"]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(json["schema"], "gpu-doctor/v1");
        let nodes = json["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 4);
        for node in nodes {
            assert!(node["name"].is_string());
            assert_eq!(
                node["findings"],
                serde_json::json!([]),
                "a healthy node has no findings"
            );
            assert_eq!(node["checks"].as_array().unwrap().len(), 7);
        }

        let broken = write(dir.path(), "broken.json", &faulty());
        let output = kubectl_gpu(&["doctor", "--snapshot", broken.to_str().unwrap(), "-o", "json"]);
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let node = json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "a100-02")
            .unwrap();
        assert_eq!(node["firstBrokenLink"], "toolkit");
        let findings = node["findings"].as_array().unwrap();
        let kinds: Vec<&str> = findings.iter().map(|f| f["kind"].as_str().unwrap()).collect();
        for kind in ["not-ready", "order", "gpu-without-runtime"] {
            assert!(kinds.contains(&kind), "{kinds:?}");
        }
        for finding in findings {
            assert!(finding["message"].as_str().is_some_and(|m| !m.is_empty()));
            assert!(
                finding["operand"].is_string(),
                "each of these concerns an operand: {finding}"
            );
        }
        assert_eq!(json["summary"]["nodesWithFindings"], 1);
    }

    #[test]
    fn the_table_shows_operands_in_chain_order_and_the_first_broken_link() {
        let dir = tempfile::tempdir().unwrap();
        let broken = write(dir.path(), "broken.json", &faulty());
        let output = kubectl_gpu(&["doctor", "--snapshot", broken.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(1));
        let text = stdout(&output);
        let header = text.lines().next().unwrap();
        assert_eq!(
            header.split_whitespace().collect::<Vec<_>>(),
            [
                "NODE", "GPUS", "DRIVER", "CT", "OV", "DP", "DCGM", "DE", "GFD", "MM", "FIRST", "BROKEN",
                "LINK"
            ]
        );
        let row = text.lines().find(|l| l.starts_with("a100-02")).unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            [
                "a100-02",
                "8",
                "ok",
                "crashloop",
                "ok",
                "ok",
                "ok",
                "ok",
                "ok",
                "-",
                "toolkit/CDI"
            ]
        );
        assert!(
            text.contains("[gpu-without-runtime] container-toolkit:"),
            "{text}"
        );
        assert!(
            text.ends_with("\n4 nodes (3 with GPUs): 7 findings on 1 node\n"),
            "{text}"
        );
    }

    #[test]
    fn one_node_in_detail() {
        let dir = tempfile::tempdir().unwrap();
        let broken = write(dir.path(), "broken.json", &faulty());
        let output = kubectl_gpu(&[
            "doctor",
            "--snapshot",
            broken.to_str().unwrap(),
            "--node",
            "a100-02",
        ]);
        assert_eq!(output.status.code(), Some(1));
        let text = stdout(&output);
        assert!(
            text.starts_with("Node a100-02: GPU, workload container\n"),
            "{text}"
        );
        assert!(text.contains("first broken link: toolkit/CDI"), "{text}");
        for check in [
            "host",
            "runtime",
            "resource",
            "labels",
            "positive-placement",
            "negative-placement",
            "operations",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(check)),
                "{check} missing in {text}"
            );
        }
        let output = kubectl_gpu(&[
            "doctor",
            "--snapshot",
            broken.to_str().unwrap(),
            "--node",
            "a100-01",
        ]);
        assert_eq!(output.status.code(), Some(0), "only the named node counts");
        let output = kubectl_gpu(&["doctor", "--snapshot", broken.to_str().unwrap(), "--node", "nope"]);
        assert_eq!(output.status.code(), Some(2));
        assert!(
            stderr(&output).contains("node nope is not in the cluster (4 nodes)"),
            "{}",
            stderr(&output)
        );
    }

    #[test]
    fn kubectl_yaml_lists_and_directories_are_read_too() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = faulty();
        // Nodes as YAML documents, the rest as one JSON list, in a directory with an unrelated file.
        let mut yaml = String::new();
        for node in &snapshot.nodes {
            yaml.push_str("---\n");
            yaml.push_str(&serde_saphyr::to_string(&serde_json::to_value(node).unwrap()).unwrap());
        }
        std::fs::write(dir.path().join("nodes.yaml"), yaml).unwrap();
        let rest = Snapshot {
            nodes: Vec::new(),
            ..snapshot
        };
        write(dir.path(), "rest.json", &rest);
        std::fs::write(dir.path().join("README.txt"), "not read").unwrap();
        let output = kubectl_gpu(&["doctor", "--snapshot", dir.path().to_str().unwrap(), "-o", "json"]);
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(json["summary"]["nodes"], 4);
        assert_eq!(json["summary"]["nodesWithFindings"], 1);
    }

    #[test]
    fn a_snapshot_it_cannot_read_exits_2_naming_the_file_object_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.json");
        std::fs::write(
            &path,
            r#"{"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "nvidia-dcgm", "namespace": "gpu-operator"},
                 "spec": {"template": {"spec": {"containers": [], "tolerations": [{"key": "k", "tolerationSeconds": "ten"}]}}}}]}"#,
        )
        .unwrap();
        let output = kubectl_gpu(&["doctor", "--snapshot", path.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(2));
        let message = stderr(&output);
        assert!(
            message.contains("bad.json: document 1, item 0 (DaemonSet gpu-operator/nvidia-dcgm)"),
            "{message}"
        );
        assert!(
            message.contains("field spec.template.spec.tolerations[0].tolerationSeconds"),
            "{message}"
        );
        let output = kubectl_gpu(&[
            "doctor",
            "--snapshot",
            dir.path().join("absent.json").to_str().unwrap(),
        ]);
        assert_eq!(output.status.code(), Some(2));
        assert!(stderr(&output).contains("cannot read"), "{}", stderr(&output));
        let empty = dir.path().join("empty.yaml");
        std::fs::write(&empty, "# nothing here\n").unwrap();
        let output = kubectl_gpu(&["doctor", "--snapshot", empty.to_str().unwrap()]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "an empty snapshot is not a healthy cluster"
        );
        assert!(stderr(&output).contains("no Node in"), "{}", stderr(&output));
    }

    #[test]
    fn a_user_error_is_one_line_whatever_rust_backtrace_says() {
        let output = Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
            .args(["doctor", "--snapshot", "/nonexistent/snap.json"])
            .env("RUST_BACKTRACE", "1")
            .env("RUST_LIB_BACKTRACE", "1")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        assert_eq!(
            stderr(&output),
            "error: cannot read /nonexistent/snap.json: No such file or directory (os error 2)\n"
        );
        let garbage = tempfile::tempdir().unwrap();
        let path = garbage.path().join("garbage.json");
        std::fs::write(&path, "<html>not a snapshot</html>\n").unwrap();
        let output = kubectl_gpu(&["doctor", "--snapshot", path.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(2));
        assert_eq!(
            stderr(&output),
            format!(
                "error: {}: not valid JSON: expected value at line 1 column 1\n",
                path.display()
            )
        );
    }

    #[test]
    fn kubectl_output_formats_yaml_and_wide() {
        let dir = tempfile::tempdir().unwrap();
        let broken = write(dir.path(), "broken.json", &faulty());
        let broken = broken.to_str().unwrap();
        let json = kubectl_gpu(&["doctor", "--snapshot", broken, "-o", "json"]);
        let yaml = kubectl_gpu(&["doctor", "--snapshot", broken, "-o", "yaml"]);
        assert_eq!(yaml.status.code(), Some(1), "{}", stderr(&yaml));
        let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        let yaml: serde_json::Value = serde_saphyr::from_str(&stdout(&yaml)).unwrap();
        assert_eq!(yaml, json, "-o yaml is the JSON schema as YAML");

        let wide = kubectl_gpu(&["doctor", "--snapshot", broken, "-o", "wide"]);
        assert_eq!(wide.status.code(), Some(1));
        let text = stdout(&wide);
        let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(header[header.len() - 3..], ["WORKLOAD", "RESOURCES", "FINDINGS"]);
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with("a100-02"))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(row[row.len() - 3..], ["container", "nvidia.com/gpu=8/8", "7"]);
        let cpu: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with("cpu-01"))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(cpu[cpu.len() - 3..], ["-", "-", "0"]);
    }

    #[test]
    fn errors_into_a_pipe_carry_no_colour() {
        let output = Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
            .args(["doctor", "--no-such-flag"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        assert!(stderr(&output).contains("--no-such-flag"), "{}", stderr(&output));
        assert!(!stderr(&output).contains('\x1b'), "{}", stderr(&output));
    }

    #[test]
    fn no_colour_on_a_terminal_with_no_color_set() {
        // util-linux `script` gives the command a terminal.
        let script = tool("script");
        let on_terminal = |no_color: bool| {
            let mut command = Command::new(&script);
            command.args([
                "-qec",
                &format!("{} doctor --no-such-flag", env!("CARGO_BIN_EXE_kubectl-gpu")),
                "/dev/null",
            ]);
            if no_color {
                command.env("NO_COLOR", "1");
            } else {
                command.env_remove("NO_COLOR");
            }
            let output = command.output().unwrap();
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        let coloured = on_terminal(false);
        assert!(
            coloured.contains("--no-such-flag") && coloured.contains('\x1b'),
            "a terminal gets colour, so this test can see it: {coloured:?}"
        );
        let plain = on_terminal(true);
        assert!(plain.contains("--no-such-flag"), "{plain:?}");
        assert!(!plain.contains('\x1b'), "{plain:?}");
    }

    #[test]
    fn explain_pod_on_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let mut snapshot = cluster();
        snapshot.pods.push(
            PodFacts::workload("team-a", "train-0")
                .requesting(gpuop_api::labels::RESOURCE_GPU, 1)
                .selecting("pool", "nowhere")
                .unschedulable(
                    "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector.",
                ),
        );
        let path = write(dir.path(), "snap.json", &snapshot);
        let output = kubectl_gpu(&[
            "explain",
            "pod",
            "team-a/train-0",
            "--snapshot",
            path.to_str().unwrap(),
        ]);
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        let text = stdout(&output);
        assert!(
            text.starts_with("0/4 nodes can run the pod: 4 x node selector wants pool=nowhere"),
            "{text}"
        );
        let output = kubectl_gpu(&[
            "explain",
            "pod",
            "train-0",
            "-n",
            "team-a",
            "--snapshot",
            path.to_str().unwrap(),
            "-o",
            "json",
        ]);
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(json["verdict"]["link"], "scheduling");
        assert_eq!(json["pod"], "team-a/train-0");
        let output = kubectl_gpu(&[
            "explain",
            "pod",
            "team-a/absent",
            "--snapshot",
            path.to_str().unwrap(),
        ]);
        assert_eq!(output.status.code(), Some(2));
    }

    #[test]
    fn kubectl_finds_the_plugin() {
        let kubectl = tool("kubectl");
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "snap.json", &cluster());
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-gpu")).parent().unwrap();
        let search = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let output = Command::new(kubectl)
            .args(["gpu", "doctor", "--snapshot", path.to_str().unwrap()])
            .env("PATH", search)
            .env("KUBECONFIG", dir.path().join("none"))
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert!(
            stdout(&output).contains("4 nodes (3 with GPUs): no findings"),
            "{}",
            stdout(&output)
        );
    }

    #[test]
    fn kubectl_completes_the_plugin_through_kubectl_complete_gpu() {
        let script = kubectl_gpu(&["completion", "kubectl-plugin"]);
        assert_eq!(script.status.code(), Some(0));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubectl_complete-gpu");
        std::fs::write(&path, &script.stdout).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-gpu")).parent().unwrap();
        let search = format!(
            "{}:{}:{}",
            dir.path().display(),
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        // As kubectl runs it: the words after `kubectl gpu`, then the word being completed.
        let output = Command::new(&path)
            .args(["doctor", "-o", ""])
            .env("PATH", &search)
            .output()
            .unwrap();
        let text = stdout(&output);
        let names: Vec<&str> = text.lines().map(|l| l.split('\t').next().unwrap()).collect();
        assert_eq!(
            names,
            ["table", "json", "yaml", "wide", ":4"],
            "{}",
            stderr(&output)
        );

        let kubectl = tool("kubectl");
        let output = Command::new(kubectl)
            .args(["__complete", "gpu", "upg"])
            .env("PATH", &search)
            .env("KUBECONFIG", dir.path().join("none"))
            .output()
            .unwrap();
        assert!(
            stdout(&output).starts_with("upgrade-plan\t"),
            "{}{}",
            stdout(&output),
            stderr(&output)
        );
    }

    /// A program from PATH (kubectl, which `.ci/run` installs; util-linux `script`); the test fails without
    /// it, so a missing tool cannot let it pass.
    fn tool(program: &str) -> PathBuf {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
            .unwrap_or_else(|| panic!("{program} is not on PATH, and this test runs it"))
    }
}

mod live {
    //! The binary against a stub API server: paged lists, the operand pods by their DaemonSets' selectors,
    //! a cluster without the ClusterPolicy CRD, `snapshot -o` read back by `--snapshot`, `explain` and
    //! `--watch`.

    use super::*;
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::Arc;

    use axum::extract::{Path as UrlPath, Query, State};
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::get;
    use axum::{Json, Router};
    use gpuop_api::labels::RESOURCE_GPU;
    use serde_json::{Value, json};

    struct Cluster {
        nodes: Vec<Value>,
        daemon_sets: Vec<Value>,
        runtime_classes: Vec<Value>,
        policies: Vec<Value>,
        revisions: Vec<Value>,
        budgets: Vec<Value>,
        pods: Vec<PodFacts>,
    }

    fn list(items: &[Value], next: Option<&str>) -> Json<Value> {
        Json(json!({"apiVersion": "v1", "kind": "List", "metadata": {"continue": next}, "items": items}))
    }

    /// Nodes come in two pages, as a server with `limit` answers.
    async fn nodes(
        State(cluster): State<Arc<Cluster>>,
        Query(query): Query<HashMap<String, String>>,
    ) -> Json<Value> {
        let half = cluster.nodes.len() / 2;
        match query.get("continue").map(String::as_str) {
            Some("page-2") => list(&cluster.nodes[half..], None),
            _ => list(&cluster.nodes[..half], Some("page-2")),
        }
    }

    /// Pods of a namespace by `app=<daemonset>` (the fixtures' selector); all pods by field selector.
    async fn pods(
        State(cluster): State<Arc<Cluster>>,
        namespace: Option<UrlPath<String>>,
        Query(query): Query<HashMap<String, String>>,
    ) -> Json<Value> {
        let app = query
            .get("labelSelector")
            .and_then(|s| s.strip_prefix("app="))
            .map(str::to_owned);
        let items: Vec<Value> = cluster
            .pods
            .iter()
            .filter(|pod| {
                namespace
                    .as_ref()
                    .is_none_or(|ns| pod.metadata.namespace.as_deref() == Some(ns.0.as_str()))
            })
            .filter(|pod| {
                app.as_ref()
                    .is_none_or(|app| pod.metadata.owner_references.iter().any(|o| &o.name == app))
            })
            .map(|pod| serde_json::to_value(pod).unwrap())
            .collect();
        list(&items, None)
    }

    async fn pod(
        State(cluster): State<Arc<Cluster>>,
        UrlPath((namespace, name)): UrlPath<(String, String)>,
    ) -> Response {
        match cluster.pods.iter().find(|pod| {
            pod.metadata.namespace.as_deref() == Some(namespace.as_str()) && pod.metadata.name == name
        }) {
            Some(pod) => Json(serde_json::to_value(pod).unwrap()).into_response(),
            None => not_found().into_response(),
        }
    }

    fn not_found() -> (StatusCode, Json<Value>) {
        (
            StatusCode::NOT_FOUND,
            Json(
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                        "message": "the server could not find the requested resource"}),
            ),
        )
    }

    /// Serves the cluster on a loopback port; returns a kubeconfig for it.
    fn serve(snapshot: &Snapshot, dir: &std::path::Path) -> std::path::PathBuf {
        let cluster = Arc::new(Cluster {
            nodes: snapshot
                .nodes
                .iter()
                .map(|n| serde_json::to_value(n).unwrap())
                .collect(),
            daemon_sets: snapshot
                .daemon_sets
                .iter()
                .map(|d| serde_json::to_value(d).unwrap())
                .collect(),
            runtime_classes: snapshot
                .runtime_classes
                .iter()
                .map(|r| serde_json::to_value(r).unwrap())
                .collect(),
            policies: snapshot
                .cluster_policies
                .iter()
                .map(|p| serde_json::to_value(p).unwrap())
                .collect(),
            revisions: snapshot
                .controller_revisions
                .iter()
                .map(|r| serde_json::to_value(r).unwrap())
                .collect(),
            budgets: snapshot
                .disruption_budgets
                .iter()
                .map(|b| serde_json::to_value(b).unwrap())
                .collect(),
            pods: snapshot.pods.clone(),
        });
        let mut router = Router::new();
        if !cluster.policies.is_empty() {
            router = router.route(
                "/apis/nvidia.com/v1/clusterpolicies",
                get(|State(c): State<Arc<Cluster>>| async move { list(&c.policies, None) }),
            );
        }
        let router = router
            .route("/api/v1/nodes", get(nodes))
            .route(
                "/apis/apps/v1/daemonsets",
                get(|State(c): State<Arc<Cluster>>| async move { list(&c.daemon_sets, None) }),
            )
            .route(
                "/apis/node.k8s.io/v1/runtimeclasses",
                get(|State(c): State<Arc<Cluster>>| async move { list(&c.runtime_classes, None) }),
            )
            .route(
                "/apis/apps/v1/controllerrevisions",
                get(|State(c): State<Arc<Cluster>>| async move { list(&c.revisions, None) }),
            )
            .route(
                "/apis/policy/v1/poddisruptionbudgets",
                get(|State(c): State<Arc<Cluster>>| async move { list(&c.budgets, None) }),
            )
            .route("/api/v1/pods", get(|state, query| pods(state, None, query)))
            .route(
                "/api/v1/namespaces/{namespace}/pods",
                get(|state, namespace, query| pods(state, Some(namespace), query)),
            )
            .route("/api/v1/namespaces/{namespace}/pods/{name}", get(pod))
            // No ClusterPolicy CRD on this cluster.
            .fallback(|| async { not_found() })
            .with_state(cluster);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, router).await.unwrap();
            });
        });
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: stub\n  cluster: {{server: 'http://127.0.0.1:{port}'}}\n\
                 users:\n- name: stub\n  user: {{}}\ncontexts:\n- name: stub\n  context: {{cluster: stub, user: stub, namespace: team-a}}\n\
                 current-context: stub\n"
            ),
        )
        .unwrap();
        kubeconfig
    }

    fn cluster_with_workload() -> Snapshot {
        let mut snapshot = cluster();
        snapshot.cluster_policies.clear();
        snapshot
            .pod_of_mut(Operand::ContainerToolkit, "a100-02")
            .unwrap()
            .crash_loop(9);
        snapshot.pods.push(
            PodFacts::workload("team-a", "train-0")
                .requesting(RESOURCE_GPU, 2)
                .running_on("a100-02"),
        );
        snapshot
    }

    fn kubectl_gpu(args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
            .args(args)
            .output()
            .unwrap()
    }

    #[test]
    fn the_live_cluster_is_read_like_a_snapshot_and_saved_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = serve(&cluster_with_workload(), dir.path());
        let kubeconfig = kubeconfig.to_str().unwrap();

        let live = kubectl_gpu(&["doctor", "--kubeconfig", kubeconfig, "-o", "json"]);
        assert_eq!(
            live.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&live.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&live.stdout).unwrap();
        assert_eq!(report["summary"]["nodes"], 4, "both pages of nodes are read");
        assert_eq!(report["summary"]["nodesWithFindings"], 1);
        let notes = report["notes"].as_array().unwrap();
        assert!(
            notes
                .iter()
                .any(|n| n == "no ClusterPolicy exists: operands are judged by their DaemonSets alone"),
            "{notes:?}"
        );

        let saved = dir.path().join("saved.json");
        let output = kubectl_gpu(&[
            "snapshot",
            "-o",
            saved.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig,
        ]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let offline = kubectl_gpu(&["doctor", "--snapshot", saved.to_str().unwrap(), "-o", "json"]);
        assert_eq!(offline.status.code(), Some(1));
        let offline: serde_json::Value = serde_json::from_slice(&offline.stdout).unwrap();
        assert_eq!(offline, report, "the snapshot says what the live cluster said");

        // The saved snapshot holds the GPU pod, so explain works on it as it does live.
        let live = kubectl_gpu(&[
            "explain",
            "pod",
            "train-0",
            "--kubeconfig",
            kubeconfig,
            "-o",
            "json",
        ]);
        let snap = kubectl_gpu(&[
            "explain",
            "pod",
            "team-a/train-0",
            "--snapshot",
            saved.to_str().unwrap(),
            "-o",
            "json",
        ]);
        assert_eq!(
            live.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&live.stderr)
        );
        assert_eq!(live.stdout, snap.stdout);
        let explanation: serde_json::Value = serde_json::from_slice(&live.stdout).unwrap();
        assert_eq!(explanation["verdict"]["link"], "toolkit");
        let missing = kubectl_gpu(&["explain", "pod", "absent", "--kubeconfig", kubeconfig]);
        assert_eq!(missing.status.code(), Some(2));
    }

    #[test]
    fn the_upgrade_plan_reads_the_live_cluster_as_its_snapshot() {
        let mut snapshot = cluster();
        snapshot.new_driver_revision();
        snapshot.pods.extend([
            PodFacts::workload("ml", "train-0")
                .requesting(RESOURCE_GPU, 1)
                .labelled("app", "train")
                .running_on("a100-01"),
            // Asks for no GPU, but a drain would move it: the snapshot keeps it.
            PodFacts::workload("ml", "web").running_on("a100-02"),
            // On a node without a driver: nothing to keep it for.
            PodFacts::workload("ml", "batch").running_on("cpu-01"),
        ]);
        snapshot.disruption_budgets = vec![gpuop_doctor::fixture::disruption_budget(
            "ml",
            "train",
            &[("app", "train")],
            0,
        )];
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = serve(&snapshot, dir.path());
        let kubeconfig = kubeconfig.to_str().unwrap();
        let live = kubectl_gpu(&["upgrade-plan", "--kubeconfig", kubeconfig, "-o", "json"]);
        assert_eq!(
            live.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&live.stderr)
        );
        let plan: serde_json::Value = serde_json::from_slice(&live.stdout).unwrap();
        assert_eq!(plan["pools"][0]["batches"][0][0]["node"], "a100-01");
        assert_eq!(
            plan["pools"][0]["batches"][0][0]["blockedBy"][0]["podDisruptionBudget"],
            "ml/train"
        );

        let saved = dir.path().join("saved.json");
        let output = kubectl_gpu(&[
            "snapshot",
            "-o",
            saved.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig,
        ]);
        assert_eq!(output.status.code(), Some(0));
        let text = std::fs::read_to_string(&saved).unwrap();
        assert!(
            text.contains("\"name\":\"web\""),
            "pods on driver nodes are saved"
        );
        assert!(!text.contains("\"name\":\"batch\""), "other pods are not");
        let offline = kubectl_gpu(&[
            "upgrade-plan",
            "--snapshot",
            saved.to_str().unwrap(),
            "-o",
            "json",
        ]);
        assert_eq!(
            offline.stdout, live.stdout,
            "the snapshot plans as the live cluster does"
        );
    }

    /// Waits for the child to exit, at most `limit`; kills it and fails when it does not.
    fn exits_within(child: &mut std::process::Child, limit: std::time::Duration) -> std::process::ExitStatus {
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > limit {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("still running after {limit:?}");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    #[test]
    fn a_server_that_never_answers_ends_every_live_command_within_the_request_timeout() {
        // Accepts connections and holds them, never answering.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                held.push(stream);
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: mute\n  cluster: {{server: 'http://127.0.0.1:{port}'}}\n\
                 users:\n- name: mute\n  user: {{}}\ncontexts:\n- name: mute\n  context: {{cluster: mute, user: mute}}\n\
                 current-context: mute\n"
            ),
        )
        .unwrap();
        let kubeconfig = kubeconfig.to_str().unwrap();
        let saved = dir.path().join("saved.json");
        for command in [
            vec!["doctor"],
            vec!["explain", "pod", "team-a/train-0"],
            vec!["upgrade-plan"],
            vec!["snapshot", "-o", saved.to_str().unwrap()],
        ] {
            let mut child = Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
                .args(&command)
                .args(["--kubeconfig", kubeconfig, "--request-timeout", "1s"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let status = exits_within(&mut child, std::time::Duration::from_secs(15));
            let mut message = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut message).unwrap();
            assert_eq!(status.code(), Some(2), "{command:?}: {message}");
            assert_eq!(
                message,
                format!(
                    "error: cannot list nodes: the server http://127.0.0.1:{port} did not answer within 1s \
                     (--request-timeout)\n"
                ),
                "{command:?}"
            );
        }
        let refused = kubectl_gpu(&["doctor", "--kubeconfig", kubeconfig, "--request-timeout", "soon"]);
        assert_eq!(refused.status.code(), Some(2));
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("invalid timeout \"soon\""),
            "{}",
            String::from_utf8_lossy(&refused.stderr)
        );
    }

    #[test]
    fn a_pod_that_does_not_exist_is_not_found_on_the_server_not_in_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = serve(&cluster_with_workload(), dir.path());
        let missing = kubectl_gpu(&[
            "explain",
            "pod",
            "nope",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ]);
        assert_eq!(missing.status.code(), Some(2));
        assert_eq!(
            String::from_utf8_lossy(&missing.stderr),
            "error: pods \"nope\" not found in namespace \"team-a\"\n"
        );
    }

    #[test]
    fn kubeconfig_comes_from_the_environment_as_kubectl_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = serve(&cluster_with_workload(), dir.path());
        let output = Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
            .args(["doctor", "-o", "json"])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(report["summary"]["nodes"], 4);
    }

    #[test]
    fn a_closed_standard_output_ends_the_command_quietly() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = serve(&cluster_with_workload(), dir.path());
        let kubeconfig = kubeconfig.to_str().unwrap();
        for command in [
            vec!["snapshot", "-o", "-"],
            vec!["doctor"],
            vec!["doctor", "--watch", "--interval", "1"],
            vec!["doctor", "--watch", "--interval", "1", "-o", "json"],
        ] {
            let mut child = Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
                .args(&command)
                .args(["--kubeconfig", kubeconfig])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // The reader goes away before the command has read the cluster, as `| head` does after a line.
            drop(child.stdout.take());
            let status = exits_within(&mut child, std::time::Duration::from_secs(15));
            let mut message = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut message).unwrap();
            assert_eq!((status.code(), message.as_str()), (Some(0), ""), "{command:?}");
        }
    }

    #[test]
    fn watch_into_a_pipe_writes_no_escape_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = serve(&cluster_with_workload(), dir.path());
        let mut child = Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
            .args(["doctor", "--watch", "--interval", "1", "--kubeconfig"])
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines: Vec<String> = BufReader::new(child.stdout.take().unwrap())
            .lines()
            .take(4)
            .map(Result::unwrap)
            .collect();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(lines[0].ends_with("(every 1s, Ctrl-C to stop)"), "{lines:?}");
        assert!(lines[2].starts_with("NODE "), "{lines:?}");
        assert!(lines.iter().all(|l| !l.contains('\x1b')), "{lines:?}");
    }

    #[test]
    fn watch_redraws_until_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = serve(&cluster_with_workload(), dir.path());
        let mut child = Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
            .args([
                "doctor",
                "--watch",
                "--interval",
                "1",
                "-o",
                "json",
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        for _ in 0..2 {
            let line = lines.next().unwrap().unwrap();
            let report: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(report["summary"]["nodesWithFindings"], 1);
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let refused = kubectl_gpu(&["doctor", "--watch", "--snapshot", "x.json"]);
        assert_eq!(refused.status.code(), Some(2), "--watch is for live clusters");
    }
}

mod paged {
    //! The live reader against the fake API server with more objects than a page holds: each list is read
    //! page by page (500 objects and `continue`), and what it reads is the whole cluster.

    use super::*;
    use gpuop_api::labels::RESOURCE_GPU;
    use gpuop_doctor::live::{Connection, Live, Reads};
    use gpuop_fakeserver::{FakeServer, Verb};
    use serde_json::Value;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_larger_than_a_page_is_read_page_by_page() {
        // 1,001 nodes (two GPU nodes with their operands), and 600 GPU workloads that only the cluster-wide
        // pod list finds.
        let mut snapshot = ClusterBuilder::new()
            .with_node(Node::gpu("a100-01"))
            .with_node(Node::gpu("a100-02"))
            .with_nodes((0..999).map(|i| Node::cpu(&format!("cpu-{i:03}"))))
            .build();
        let operand_pods = snapshot.pods.len();
        for i in 0..600 {
            let node = if i % 2 == 0 { "a100-01" } else { "a100-02" };
            // Bare pods: the server's garbage collector deletes the pods of a ReplicaSet it does not have.
            snapshot.pods.push(
                PodFacts::workload("team-a", &format!("train-{i:03}"))
                    .requesting(RESOURCE_GPU, 1)
                    .running_on(node)
                    .unmanaged(),
            );
        }
        let mut written = Vec::new();
        snapshot.write_json(&mut written).unwrap();
        let mut list: Value = serde_json::from_slice(&written).unwrap();

        let server = FakeServer::new();
        gpuop_sim::demo::install(&server.client())
            .await
            .expect("CRDs and namespace install");
        server
            .insert(
                serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
            )
            .unwrap();
        for mut item in list["items"].as_array_mut().unwrap().drain(..) {
            // The API server wants an image; the doctor's projection does not keep it.
            for containers in ["containers", "initContainers"] {
                for container in item["spec"][containers].as_array_mut().into_iter().flatten() {
                    container["image"] = "nvcr.io/nvidia/x:1".into();
                }
            }
            server.insert(item).expect("the fixture is valid");
        }
        let served = server
            .serve(std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)))
            .await
            .expect("the fake API server serves");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        served.write_kubeconfig(&kubeconfig).unwrap();
        let live = Live::connect(&Connection {
            kubeconfig: Some(kubeconfig),
            context: None,
            request_timeout: Some(std::time::Duration::from_secs(30)),
        })
        .await
        .expect("the doctor connects");

        server.reset_requests();
        let read = live.snapshot(Reads::GpuPods).await.expect("the cluster reads");
        assert_eq!(read.nodes.len(), 1001);
        assert_eq!(read.pods.len(), operand_pods + 600);
        for i in 0..600 {
            let pod = read
                .pod("team-a", &format!("train-{i:03}"))
                .expect("every workload is read");
            assert_eq!(pod.spec.containers[0].name, "main");
        }
        let requests = server.requests();
        let lists = |resource: &str, scope: &str| {
            requests.matching(|key| key.verb == Verb::List && key.resource == resource && key.scope == scope)
        };
        assert_eq!(lists("nodes", "cluster"), 3, "1,001 nodes are three pages of 500");
        assert_eq!(
            lists("pods", "cluster"),
            2,
            "{} pods not finished are two pages",
            operand_pods + 600
        );
        let report = analyze(&read);
        assert_eq!(report.nodes.len(), 1001);
    }
}

/// A scenario's cluster simulated on a served fake API server, with the operator running in-process, the
/// default policy applied, and the doctor connected through a kubeconfig as `kubectl gpu` connects.
struct Converged {
    server: gpuop_fakeserver::FakeServer,
    served: gpuop_fakeserver::Running,
    /// Holds the kubeconfig.
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    client: kube::Client,
    simulation: gpuop_sim::simulation::Simulation,
    operator: gpuop_operator::run::Running,
    live: gpuop_doctor::live::Live,
}

impl Converged {
    async fn start(scenario: &gpuop_sim::scenario::Scenario) -> Self {
        Self::start_with(scenario, gpuop_sim::kubelet::Timing::instant()).await
    }

    async fn start_with(
        scenario: &gpuop_sim::scenario::Scenario,
        timing: gpuop_sim::kubelet::Timing,
    ) -> Self {
        use gpuop_sim::demo::{DEFAULT_POLICY, NAMESPACE, apply_policy, install};
        let server = gpuop_fakeserver::FakeServer::new();
        let served = server
            .serve(std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)))
            .await
            .expect("the fake API server serves");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        served.write_kubeconfig(&kubeconfig).unwrap();
        let client = server.client_as(gpuop_sim::USER_AGENT);
        install(&client).await.expect("CRDs and namespace install");
        let simulation = gpuop_sim::simulation::Simulation::start(client.clone(), scenario.cluster(), timing)
            .await
            .expect("the simulation starts");
        let operator = gpuop_operator::run::start(
            server.client_as(gpuop_operator::USER_AGENT),
            gpuop_operator::run::Config::in_process(NAMESPACE),
        )
        .await
        .expect("the operator starts");
        apply_policy(&client, DEFAULT_POLICY)
            .await
            .expect("the policy applies");
        let live = gpuop_doctor::live::Live::connect(&gpuop_doctor::live::Connection {
            kubeconfig: Some(kubeconfig.clone()),
            context: None,
            request_timeout: Some(std::time::Duration::from_secs(30)),
        })
        .await
        .expect("the doctor connects");
        Self {
            server,
            served,
            dir,
            kubeconfig,
            client,
            simulation,
            operator,
            live,
        }
    }
}

mod simulated {
    //! The operator converges a simulated cluster on the fake API server; a scenario, in the format
    //! `gpu-sim up --scenario` plays, then breaks things the way real clusters break, and the doctor,
    //! reading the live API as `kubectl gpu doctor` does, must name exactly those nodes and links.

    use super::*;
    use std::time::Duration;

    use gpuop_doctor::live::Live;
    use gpuop_doctor::pod_state::StateName;
    use gpuop_sim::scenario::Scenario;

    /// A failure guard on a loaded two-core machine, not a performance assertion.
    const PATIENCE: Duration = Duration::from_secs(90);

    /// Four T4 nodes; once the operator has converged them, each of the first three breaks differently.
    const SCENARIO: &str = r#"
cluster:
  nfd: true
  nodePools:
    - name: gpu
      count: 4
      gpu: {model: T4, count: 4}
      os: ubuntu-22.04
      runtime: containerd-1.7
timeline:
  # The metrics exporter crash-loops: a not-ready operand at the health link.
  - at: 0s
    crashLoop: {node: gpu-0, operand: dcgm-exporter}
  # The toolkit crash-loops under a running device plugin: broken order, GPUs without a runtime.
  - at: 0s
    crashLoop: {node: gpu-1, operand: container-toolkit}
  # A NoExecute taint the operands do not tolerate drives them off the node.
  - at: 0s
    taint: {node: gpu-2, key: maintenance, value: disk, effect: NoExecute}
"#;

    /// Polls the doctor until `done` holds for its report; panics with the last report after [`PATIENCE`].
    async fn doctor_until(live: &Live, what: &str, done: impl Fn(&Report) -> bool) -> Report {
        let started = tokio::time::Instant::now();
        loop {
            let report = analyze(
                &live
                    .snapshot(gpuop_doctor::live::Reads::GpuPods)
                    .await
                    .expect("the doctor reads the cluster"),
            );
            if done(&report) {
                return report;
            }
            if started.elapsed() > PATIENCE {
                let findings: Vec<_> = report.nodes.iter().map(|n| (&n.name, &n.findings)).collect();
                panic!("{what}: not so after {PATIENCE:?}; findings: {findings:#?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn has(report: &Report, node: &str, kind: FindingKind, operand: Option<Operand>) -> bool {
        report.nodes.iter().any(|n| {
            n.name == node
                && n.findings
                    .iter()
                    .any(|f| f.kind == kind && (operand.is_none() || f.operand == operand))
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_doctor_agrees_with_the_faults_a_scenario_injected() {
        let scenario = Scenario::from_yaml(SCENARIO).expect("the scenario parses");
        // Every part is held to the end of the test: the server, its kubeconfig and the client go with it.
        let Converged {
            server: _server,
            served: _served,
            dir: _dir,
            kubeconfig: _kubeconfig,
            client: _client,
            simulation,
            operator,
            live,
        } = Converged::start(&scenario).await;
        let healthy = doctor_until(&live, "a converged cluster is clean", |report| {
            report.summary.gpu_nodes == 4
                && !report.has_findings()
                && report.nodes.iter().all(|n| {
                    n.operands
                        .iter()
                        .any(|o| o.operand == Operand::DevicePlugin && o.state == StateName::Ready)
                })
        })
        .await;
        assert_eq!(healthy.cluster_policy.as_deref(), Some("cluster-policy"));

        for event in &scenario.timeline {
            simulation.apply(&event.action).await.expect("the event plays");
        }
        let report = doctor_until(&live, "the doctor sees every injected fault", |report| {
            has(
                report,
                "gpu-0",
                FindingKind::NotReady,
                Some(Operand::DcgmExporter),
            ) && has(report, "gpu-1", FindingKind::Order, Some(Operand::DevicePlugin))
                && has(
                    report,
                    "gpu-2",
                    FindingKind::Excluded,
                    Some(Operand::DevicePlugin),
                )
        })
        .await;
        assert_eq!(node(&report, "gpu-0").first_broken_link, Some(Link::Health));
        assert_eq!(node(&report, "gpu-1").first_broken_link, Some(Link::Toolkit));
        assert!(
            has(&report, "gpu-1", FindingKind::GpuWithoutRuntime, None),
            "gpu-1 advertises GPUs without a runtime: {:#?}",
            node(&report, "gpu-1").findings
        );
        assert!(
            node(&report, "gpu-3").findings.is_empty(),
            "the untouched node is clean: {:#?}",
            node(&report, "gpu-3").findings
        );

        operator.stop().await;
        simulation.stop().await;
    }
}

mod agreement {
    //! The doctor and the ClusterPolicy's status judge one snapshot alike. The operator converges six
    //! simulated nodes; then a device plugin rollout, a driver upgrade node by node and a node failing play,
    //! and at every moment sampled meanwhile one read of the cluster is judged twice: by the doctor, and by
    //! the operator's own readiness judge as the status computes it. Per operand, the nodes it should run on
    //! and the nodes where it is not ready must be the same.

    use super::*;
    use std::collections::BTreeSet;
    use std::time::Duration;

    use gpuop_api::labels::{GpuDetection, UPGRADE_STATE};
    use gpuop_api::upgrade::UpgradeState;
    use gpuop_doctor::live::{Live, Reads};
    use gpuop_doctor::report::Expectation;
    use gpuop_operator::readiness::{Templates, observe_objects};
    use gpuop_sim::kubelet::Timing;
    use gpuop_sim::scenario::Scenario;

    /// A failure guard on a loaded two-core machine, not a performance assertion.
    const PATIENCE: Duration = Duration::from_secs(120);

    const SCENARIO: &str = r#"
cluster:
  nfd: true
  nodePools:
    - name: gpu
      count: 6
      gpu: {model: T4, count: 4}
      os: ubuntu-22.04
      runtime: containerd-1.7
timeline:
  # A rollout: the device plugin's pod template changes.
  - at: 0s
    patch:
      apiVersion: nvidia.com/v1
      kind: ClusterPolicy
      name: cluster-policy
      merge: {spec: {devicePlugin: {env: [{name: FAIL_ON_INIT_ERROR, value: "false"}]}}}
  # A driver upgrade, one node at a time (the sample policy's maxParallelUpgrades).
  - at: 0s
    patch:
      apiVersion: nvidia.com/v1
      kind: ClusterPolicy
      name: cluster-policy
      merge: {spec: {driver: {version: 580.95.05}}}
  # A node fails.
  - at: 0s
    nodeNotReady: gpu-3
"#;

    /// One moment of the cluster: one read, the doctor's report of it, and how many operand placements
    /// the status counts not ready.
    struct Moment {
        snapshot: Snapshot,
        report: Report,
        not_ready: usize,
    }

    /// Reads the cluster once and judges the read both ways; panics when the two disagree.
    async fn moment(live: &Live) -> Moment {
        let snapshot = live
            .snapshot(Reads::Doctor)
            .await
            .expect("the doctor reads the cluster");
        let report = analyze(&snapshot);
        let pods: Vec<_> = snapshot.pods.iter().map(PodFacts::to_pod).collect();
        let status = observe_objects(
            &Templates::of_daemonsets(&snapshot.daemon_sets),
            &snapshot.nodes,
            &pods,
            &snapshot.daemon_sets,
            &snapshot.controller_revisions,
            &GpuDetection::Nfd,
        );
        let nodes_where = |operand: Operand, ready: Option<bool>| -> BTreeSet<String> {
            report
                .nodes
                .iter()
                .filter(|node| {
                    let rows: Vec<_> = node
                        .operands
                        .iter()
                        .filter(|o| o.operand == operand && o.placement == Expectation::Expected)
                        .collect();
                    !rows.is_empty() && ready.is_none_or(|ready| rows.iter().any(|o| o.ready) == ready)
                })
                .map(|node| node.name.clone())
                .collect()
        };
        // Per operand, the nodes where it is not ready (the status lists them all below 20 nodes), where it
        // should run, and where it is ready.
        for observation in &status {
            let operand = observation.operand.expect("a policy operand");
            let listed: BTreeSet<String> = observation.not_ready.iter().cloned().collect();
            assert_eq!(
                nodes_where(operand, Some(false)),
                listed,
                "{operand}: the doctor and the status disagree on one snapshot"
            );
            assert_eq!(
                observation.expected,
                nodes_where(operand, None).len(),
                "{operand}: the nodes it should run on"
            );
            assert_eq!(
                observation.ready,
                nodes_where(operand, Some(true)).len(),
                "{operand}: the nodes where it is ready"
            );
        }
        let not_ready = status.iter().map(|o| o.not_ready.len()).sum();
        Moment {
            snapshot,
            report,
            not_ready,
        }
    }

    /// Judges moments until `done` holds for one.
    async fn until(live: &Live, what: &str, done: impl Fn(&Moment) -> bool) {
        let started = tokio::time::Instant::now();
        loop {
            let moment = moment(live).await;
            if done(&moment) {
                return;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "{what}: not so after {PATIENCE:?}: {:#?}",
                moment.report
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every operand ready wherever it should run, on all six nodes.
    fn all_ready(moment: &Moment) -> bool {
        moment.report.summary.gpu_nodes == 6 && moment.not_ready == 0
    }

    /// Every node's driver upgrade is done.
    fn upgraded(moment: &Moment) -> bool {
        moment.snapshot.nodes.iter().all(|node| {
            let state = node
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(UPGRADE_STATE));
            UpgradeState::from_label(state.map(String::as_str)) == UpgradeState::Done
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_doctor_and_the_status_agree_through_a_rollout_an_upgrade_and_a_node_failure() {
        let scenario = Scenario::from_yaml(SCENARIO).expect("the scenario parses");
        let timing = Timing {
            image_pull: Duration::from_millis(150),
            ready_after: Duration::from_millis(100),
            crash_backoff: Duration::from_secs(1),
            poll: Duration::from_millis(50),
            heartbeats: None,
        };
        let Converged {
            server: _server,
            served: _served,
            dir: _dir,
            kubeconfig: _kubeconfig,
            client: _client,
            simulation,
            operator,
            live,
        } = Converged::start_with(&scenario, timing).await;
        until(&live, "the cluster converges", |m| all_ready(m) && upgraded(m)).await;

        // Each change is judged from the moment it reaches a node (something not ready) until it is done.
        let [rollout, upgrade, failure] = [0, 1, 2].map(|i| &scenario.timeline[i].action);
        simulation.apply(rollout).await.expect("the rollout starts");
        until(&live, "the rollout reaches a node", |m| m.not_ready > 0).await;
        until(&live, "the rollout finishes", all_ready).await;

        simulation.apply(upgrade).await.expect("the upgrade starts");
        until(&live, "the upgrade reaches a node", |m| m.not_ready > 0).await;
        until(&live, "the upgrade finishes", |m| all_ready(m) && upgraded(m)).await;

        simulation.apply(failure).await.expect("the node fails");
        until(&live, "the doctor sees the failed node", |m| {
            !node(&m.report, "gpu-3").findings.is_empty()
        })
        .await;
        // The failed node stays failed: more moments, judged alike.
        for _ in 0..20 {
            moment(&live).await;
        }
        operator.stop().await;
        simulation.stop().await;
    }
}

mod upgrade_plan {
    //! `kubectl gpu upgrade-plan` on snapshot files: the table a user reads, the JSON, the exit status, and
    //! an NVIDIADriver as its own pool with its own budget.

    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};

    use gpuop_api::labels::{RESOURCE_GPU, UPGRADE_SKIP, UPGRADE_STATE};
    use gpuop_doctor::fixture::disruption_budget;

    fn kubectl_gpu(args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .expect("kubectl-gpu runs")
    }

    fn write(dir: &Path, snapshot: &Snapshot) -> PathBuf {
        let path = dir.join("snap.json");
        let mut file = std::fs::File::create(&path).unwrap();
        snapshot.write_json(&mut file).unwrap();
        path
    }

    fn plan(snapshot: &Snapshot, json: bool) -> (Option<i32>, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), snapshot);
        let mut args = vec!["upgrade-plan", "--snapshot", path.to_str().unwrap()];
        if json {
            args.extend(["-o", "json"]);
        }
        let output = kubectl_gpu(&args);
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Six GPU nodes on the driver's old revision under maxParallelUpgrades 2 and maxUnavailable 50%: one
    /// node already being upgraded, one skipped, a GPU pod a PodDisruptionBudget protects, one a budget
    /// with room covers, a bare GPU pod, and a pod that asks for no GPU.
    fn outdated_cluster(auto_upgrade: bool) -> Snapshot {
        let spec: gpuop_api::ClusterPolicySpec = serde_json::from_value(serde_json::json!({
            "driver": {"upgradePolicy": {
                "autoUpgrade": auto_upgrade, "maxParallelUpgrades": 2, "maxUnavailable": "50%"}}
        }))
        .unwrap();
        let mut snapshot = ClusterBuilder::new()
            .with_policy(spec)
            .with_nodes((1..=5).map(|i| Node::gpu(&format!("gpu-0{i}"))))
            .with_node(Node::gpu("gpu-06").with_label(UPGRADE_SKIP, "true"))
            .with_node(Node::cpu("cpu-01"))
            .build();
        snapshot.new_driver_revision();
        let busy = snapshot.node_mut("gpu-05").unwrap();
        *busy = std::mem::take(busy)
            .with_label(UPGRADE_STATE, "pod-restart-required")
            .cordoned();
        let gpu_pod = |name: &str, app: &str, node: &str| {
            PodFacts::workload("ml", name)
                .requesting(RESOURCE_GPU, 1)
                .labelled("app", app)
                .running_on(node)
        };
        snapshot.pods.extend([
            gpu_pod("train-0", "train", "gpu-01"),
            gpu_pod("serve-0", "serve", "gpu-02"),
            gpu_pod("notebook", "notebook", "gpu-03").unmanaged(),
            PodFacts::workload("ml", "web")
                .labelled("app", "web")
                .running_on("gpu-04"),
            gpu_pod("train-1", "train", "gpu-06"),
        ]);
        snapshot.disruption_budgets = vec![
            disruption_budget("ml", "train", &[("app", "train")], 0),
            disruption_budget("ml", "serve", &[("app", "serve")], 1),
            // Same labels, another namespace: it does not cover ml's pods.
            disruption_budget("other", "train", &[("app", "train")], 0),
        ];
        snapshot
    }

    #[test]
    fn the_table_shows_batches_evictions_blockers_refusals_and_skips() {
        let (code, text, stderr) = plan(&outdated_cluster(true), false);
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(
            text,
            "\
ClusterPolicy/cluster-policy (driver DaemonSets gpu-operator/nvidia-driver-daemonset; 6 node(s))
  budget: 2 node(s) at once, at most 3 unavailable
  up to date: 0 node(s)
  in progress: gpu-05 (pod-restart-required)
  batch 1:
    gpu-01: evict ml/train-0
      blocked by PodDisruptionBudget ml/train (no disruption allowed now): ml/train-0
  batch 2:
    gpu-02: evict ml/serve-0
    gpu-03: evict ml/notebook
      cannot evict ml/notebook (no controller; needs podDeletion.force): the node would fail
  batch 3:
    gpu-04: no GPU pods to evict
  skipped: gpu-06: nvidia.com/gpu-driver-upgrade.skip=true
"
        );

        let (code, text, _) = plan(&outdated_cluster(false), false);
        assert_eq!(code, Some(0));
        assert!(
            text.lines().nth(1) == Some(&format!("  {}", gpuop_doctor::upgrade_plan::AUTO_UPGRADE_OFF)),
            "said first when automatic upgrades are off:\n{text}"
        );
        assert!(
            text.contains("  batch 1:\n    gpu-01: evict ml/train-0\n"),
            "{text}"
        );
    }

    #[test]
    fn nodes_on_the_latest_revision_are_up_to_date() {
        let mut snapshot = outdated_cluster(true);
        // The driver pods of gpu-01 and gpu-02 were replaced from the latest revision.
        for node in ["gpu-01", "gpu-02"] {
            snapshot.remove_pod_of(Operand::Driver, node).unwrap();
            snapshot.place_pod_of(Operand::Driver, node);
        }
        let (code, text, stderr) = plan(&snapshot, false);
        assert_eq!(code, Some(0), "{stderr}");
        assert!(text.contains("  up to date: 2 node(s)\n"), "{text}");
        assert!(
            text.contains("  batch 1:\n    gpu-03: evict ml/notebook\n"),
            "{text}"
        );
        assert!(!text.contains("gpu-01:"), "{text}");
    }

    #[test]
    fn json_follows_the_documented_schema() {
        let (code, text, stderr) = plan(&outdated_cluster(false), true);
        assert_eq!(code, Some(0), "{stderr}");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["schema"], "gpu-upgrade-plan/v1");
        assert_eq!(json["notes"], serde_json::json!([]));
        let pools = json["pools"].as_array().unwrap();
        assert_eq!(pools.len(), 1);
        let pool = &pools[0];
        assert_eq!(pool["pool"], "ClusterPolicy/cluster-policy");
        assert_eq!(pool["kind"], "ClusterPolicy");
        assert_eq!(pool["name"], "cluster-policy");
        assert_eq!(
            pool["daemonSets"],
            serde_json::json!(["gpu-operator/nvidia-driver-daemonset"])
        );
        assert_eq!(pool["nodes"], 6);
        assert_eq!(pool["autoUpgrade"], false);
        assert_eq!(
            pool["notes"],
            serde_json::json!([gpuop_doctor::upgrade_plan::AUTO_UPGRADE_OFF])
        );
        assert_eq!(pool["error"], serde_json::Value::Null);
        assert_eq!(
            pool["budget"],
            serde_json::json!({"maxParallelUpgrades": 2, "maxUnavailable": 3})
        );
        assert_eq!(pool["upToDate"], 0);
        assert_eq!(
            pool["inProgress"],
            serde_json::json!([{"node": "gpu-05", "state": "pod-restart-required"}])
        );
        assert_eq!(pool["failed"], serde_json::json!([]));
        let batches: Vec<Vec<&str>> = pool["batches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                b.as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n["node"].as_str().unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(
            batches,
            [vec!["gpu-01"], vec!["gpu-02", "gpu-03"], vec!["gpu-04"]]
        );
        assert_eq!(
            pool["batches"][0][0],
            serde_json::json!({"node": "gpu-01", "restartOnly": false, "evict": ["ml/train-0"],
                "blockedBy": [{"podDisruptionBudget": "ml/train", "pods": ["ml/train-0"]}], "refused": []})
        );
        assert_eq!(
            pool["batches"][1][1]["refused"],
            serde_json::json!([{"pod": "ml/notebook", "reason": "no controller; needs podDeletion.force"}])
        );
        assert_eq!(pool["batches"][1][0]["blockedBy"], serde_json::json!([]));
        assert_eq!(
            pool["skipped"],
            serde_json::json!([{"node": "gpu-06", "reason": "nvidia.com/gpu-driver-upgrade.skip=true"}])
        );
    }

    #[test]
    fn each_nvidia_driver_is_its_own_pool_with_its_own_budget() {
        let spec: gpuop_api::ClusterPolicySpec =
            serde_json::from_value(serde_json::json!({"driver": {"useNvidiaDriverCRD": true}})).unwrap();
        let mut snapshot = ClusterBuilder::new()
            .with_policy(spec)
            .with_nodes((1..=4).map(|i| Node::gpu(&format!("gpu-0{i}"))))
            .build();
        let driver = |policy: serde_json::Value| -> gpuop_api::NVIDIADriverSpec {
            serde_json::from_value(serde_json::json!({
                "driverType": "gpu", "image": "nvcr.io/nvidia/driver", "upgradePolicy": policy}))
            .unwrap()
        };
        snapshot.add_nvidia_driver(
            "a100",
            driver(serde_json::json!({"maxParallelUpgrades": 3, "maxUnavailable": "100%"})),
            &["gpu-01", "gpu-02"],
        );
        snapshot.add_nvidia_driver("h100", driver(serde_json::json!({})), &["gpu-03", "gpu-04"]);
        snapshot.new_driver_revision();
        let (code, text, stderr) = plan(&snapshot, false);
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(
            text,
            "\
NVIDIADriver/a100 (driver DaemonSets gpu-operator/nvidia-gpu-driver-ubuntu22.04-a100; 2 node(s))
  budget: 3 node(s) at once, at most 2 unavailable
  up to date: 0 node(s)
  batch 1:
    gpu-01: no GPU pods to evict
    gpu-02: no GPU pods to evict

NVIDIADriver/h100 (driver DaemonSets gpu-operator/nvidia-gpu-driver-ubuntu22.04-h100; 2 node(s))
  budget: 1 node(s) at once, at most 1 unavailable
  up to date: 0 node(s)
  batch 1:
    gpu-03: no GPU pods to evict
  batch 2:
    gpu-04: no GPU pods to evict
"
        );
    }

    #[test]
    fn a_plan_that_cannot_be_made_exits_2() {
        let mut snapshot = outdated_cluster(true);
        snapshot.controller_revisions.clear();
        snapshot.listed.remove("ControllerRevision");
        let (code, text, stderr) = plan(&snapshot, false);
        assert_eq!(code, Some(2), "{text}");
        assert!(text.is_empty());
        assert!(
            stderr.contains("the snapshot holds no ControllerRevision"),
            "{stderr}"
        );
        let missing = kubectl_gpu(&["upgrade-plan", "--snapshot", "/nonexistent/snap.json"]);
        assert_eq!(missing.status.code(), Some(2));
    }

    #[test]
    fn without_disruption_budgets_the_plan_says_it_cannot_see_them() {
        let mut snapshot = outdated_cluster(true);
        snapshot.disruption_budgets.clear();
        snapshot.listed.remove("PodDisruptionBudget");
        let (code, text, _) = plan(&snapshot, false);
        assert_eq!(code, Some(0));
        assert!(!text.contains("blocked by"), "{text}");
        assert!(
            text.ends_with(
                "\nNotes:\n  the snapshot holds no PodDisruptionBudget, so none is shown blocking an eviction: add \
                 poddisruptionbudgets to `kubectl get`, or use `kubectl gpu snapshot`\n"
            ),
            "{text}"
        );
    }
}

mod bundle {
    //! `kubectl gpu bundle` against a simulated cluster the operator converged, with a crash-looping toolkit
    //! and containers that wrote output: the archive's files and index, logs bounded and the previous run of
    //! the restarted container, no Secret, and `--snapshot BUNDLE.tar.gz` answering as the live cluster did.

    use super::*;
    use std::collections::BTreeMap;
    use std::io::Read;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::path::Path;
    use std::process::{Command, Output};
    use std::time::Duration;

    use gpuop_doctor::bundle::{Bounds, collect};
    use gpuop_doctor::live::{Live, Reads};
    use gpuop_doctor::pod_state::StateName;
    use gpuop_fakeserver::faults::{Faults, InjectedError};
    use gpuop_fakeserver::{FakeServer, LogStream, Verb};
    use gpuop_sim::demo::NAMESPACE;
    use gpuop_sim::scenario::Scenario;
    use serde_json::{Value, json};

    /// A failure guard on a loaded two-core machine, not a performance assertion.
    const PATIENCE: Duration = Duration::from_secs(90);

    const SCENARIO: &str = r#"
cluster:
  nfd: true
  nodePools:
    - name: gpu
      count: 2
      gpu: {model: T4, count: 4}
      os: ubuntu-22.04
      runtime: containerd-1.7
timeline:
  - at: 0s
    crashLoop: {node: gpu-1, operand: container-toolkit}
"#;

    /// The base64 of a Secret's value: found nowhere in a bundle.
    const SECRET_DATA: &str = "bmdjLWFwaS1rZXktZG8tbm90LXNoaXA=";

    async fn kubectl_gpu(args: &[&str]) -> Output {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_kubectl-gpu"))
                .args(&args)
                .output()
                .expect("kubectl-gpu runs")
        })
        .await
        .unwrap()
    }

    fn stderr(output: &Output) -> String {
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// The archive's files by path below its one top directory.
    fn unpack(archive: &Path) -> BTreeMap<String, Vec<u8>> {
        let file = std::fs::File::open(archive).unwrap();
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
        let mut files = BTreeMap::new();
        let mut tops = std::collections::BTreeSet::new();
        for entry in tar.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let (top, rest) = path.split_once('/').expect("one top directory");
            tops.insert(top.to_owned());
            let mut content = Vec::new();
            entry.read_to_end(&mut content).unwrap();
            files.insert(rest.to_owned(), content);
        }
        assert_eq!(tops.len(), 1, "{tops:?}");
        assert!(tops.first().unwrap().starts_with("gpu-bundle-"));
        files
    }

    async fn until(live: &Live, what: &str, done: impl Fn(&Snapshot) -> bool) {
        let started = tokio::time::Instant::now();
        loop {
            let snapshot = live
                .snapshot(Reads::Doctor)
                .await
                .expect("the doctor reads the cluster");
            if done(&snapshot) {
                return;
            }
            assert!(started.elapsed() < PATIENCE, "{what}: not so after {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bundle_holds_what_support_needs_bounded_and_no_secret() {
        let scenario = Scenario::from_yaml(SCENARIO).expect("the scenario parses");
        let Converged {
            server,
            served: _served,
            dir,
            kubeconfig,
            client: _client,
            simulation,
            operator,
            live,
        } = Converged::start(&scenario).await;
        let kubeconfig_arg = kubeconfig.to_str().unwrap().to_owned();
        until(&live, "the operator converges", |snapshot| {
            let report = analyze(snapshot);
            report.summary.gpu_nodes == 2
                && report.nodes.iter().all(|n| {
                    n.operands
                        .iter()
                        .any(|o| o.operand == Operand::DevicePlugin && o.state == StateName::Ready)
                })
        })
        .await;
        for event in &scenario.timeline {
            simulation.apply(&event.action).await.expect("the event plays");
        }
        until(&live, "the toolkit restarts", |snapshot| {
            snapshot
                .pod_of(Operand::ContainerToolkit, "gpu-1")
                .is_some_and(|pod| pod.status.container_statuses.iter().any(|s| s.restart_count > 0))
        })
        .await;
        // Frozen from here, so that the live cluster and the bundle are read in the same state.
        operator.stop().await;
        simulation.stop().await;

        let snapshot = live.snapshot(Reads::Doctor).await.unwrap();
        let toolkit = snapshot
            .pod_of(Operand::ContainerToolkit, "gpu-1")
            .unwrap()
            .clone();
        let plugin = snapshot.pod_of(Operand::DevicePlugin, "gpu-0").unwrap().clone();
        let (toolkit_container, plugin_container) = (
            toolkit.spec.containers[0].name.clone(),
            plugin.spec.containers[0].name.clone(),
        );
        // The crashed run wrote long lines (cut by limitBytes), the plugin many short ones (cut by tailLines).
        let long: String = (0..3_000)
            .map(|i| format!("{i:06} {}\n", "x".repeat(193)))
            .collect();
        server.set_log(
            NAMESPACE,
            &toolkit.metadata.name,
            &toolkit_container,
            LogStream::Previous,
            &long,
        );
        let short: String = (0..8_000).map(|i| format!("plugin line {i}\n")).collect();
        server.set_log(
            NAMESPACE,
            &plugin.metadata.name,
            &plugin_container,
            LogStream::Current,
            &short,
        );
        for (name, namespace, regarding) in [
            (
                "gpu-1.toolkit",
                "default",
                json!({"kind": "Node", "name": "gpu-1", "apiVersion": "v1"}),
            ),
            (
                "cpu.unrelated",
                "default",
                json!({"kind": "Node", "name": "not-a-gpu-node", "apiVersion": "v1"}),
            ),
            (
                "toolkit.backoff",
                NAMESPACE,
                json!({"kind": "Pod", "name": toolkit.metadata.name, "namespace": NAMESPACE}),
            ),
        ] {
            server
                .insert(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                    "metadata": {"name": name, "namespace": namespace}, "regarding": regarding,
                    "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "kubelet",
                    "reportingInstance": "gpu-1", "action": "Restart", "reason": "BackOff", "type": "Warning",
                    "note": format!("event {name}")}))
                .unwrap();
        }
        server
            .insert(json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "ngc-api-key", "namespace": NAMESPACE}, "data": {"key": SECRET_DATA}}))
            .unwrap();

        let archive = dir.path().join("support.tar.gz");
        let output = kubectl_gpu(&[
            "bundle",
            "-o",
            archive.to_str().unwrap(),
            "--kubeconfig",
            &kubeconfig_arg,
        ])
        .await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert!(stderr(&output).contains("wrote "), "{}", stderr(&output));

        // The archive answers as the live cluster does, read by its magic bytes whatever its name.
        let renamed = dir.path().join("bundle.data");
        std::fs::copy(&archive, &renamed).unwrap();
        let live_json = kubectl_gpu(&["doctor", "--kubeconfig", &kubeconfig_arg, "-o", "json"]).await;
        let offline_json =
            kubectl_gpu(&["doctor", "--snapshot", renamed.to_str().unwrap(), "-o", "json"]).await;
        assert_eq!(live_json.status.code(), Some(1), "{}", stderr(&live_json));
        assert_eq!(offline_json.status.code(), Some(1), "{}", stderr(&offline_json));
        assert_eq!(
            String::from_utf8_lossy(&offline_json.stdout),
            String::from_utf8_lossy(&live_json.stdout)
        );
        let live_table = kubectl_gpu(&["doctor", "--kubeconfig", &kubeconfig_arg]).await;
        let live_plan = kubectl_gpu(&["upgrade-plan", "--kubeconfig", &kubeconfig_arg, "-o", "json"]).await;
        let offline_plan = kubectl_gpu(&[
            "upgrade-plan",
            "--snapshot",
            archive.to_str().unwrap(),
            "-o",
            "json",
        ])
        .await;
        assert_eq!(offline_plan.status.code(), Some(0), "{}", stderr(&offline_plan));
        assert_eq!(offline_plan.stdout, live_plan.stdout);

        let files = unpack(&archive);
        assert_eq!(
            files["doctor.json"], live_json.stdout,
            "the report as `doctor -o json` prints it"
        );
        assert_eq!(
            files["doctor.txt"], live_table.stdout,
            "the report as `doctor` prints it"
        );
        for expected in [
            "README.txt",
            "snapshot.json",
            "upgrade-plan.txt",
            "upgrade-plan.json",
            "objects/clusterpolicies.json",
            "objects/nvidiadrivers.json",
            "events/gpu-operator.json",
            "events/gpu-nodes.json",
        ] {
            assert!(
                files.contains_key(expected),
                "{expected} missing from {:?}",
                files.keys()
            );
        }
        let notes = |path: &str| -> Vec<String> {
            let events: Value = serde_json::from_slice(&files[path]).unwrap();
            events["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["note"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            notes("events/gpu-nodes.json"),
            ["event gpu-1.toolkit"],
            "GPU nodes' events only"
        );
        assert_eq!(notes("events/gpu-operator.json"), ["event toolkit.backoff"]);
        let policies: Value = serde_json::from_slice(&files["objects/clusterpolicies.json"]).unwrap();
        assert_eq!(policies["items"][0]["kind"], "ClusterPolicy");
        assert!(
            policies["items"][0]["status"]["state"].is_string(),
            "with its status: {}",
            policies["items"][0]["status"]
        );

        // The index lists every file, with its size, and says what was cut and what is missing.
        let index: Value = serde_json::from_slice(&files["index.json"]).unwrap();
        assert_eq!(index["schema"], "gpu-bundle/v1");
        assert_eq!(index["namespace"], NAMESPACE);
        let listed: BTreeMap<String, &Value> = index["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["path"].as_str().unwrap().to_owned(), f))
            .collect();
        let archived: Vec<&String> = files.keys().filter(|p| *p != "index.json").collect();
        assert_eq!(
            listed.keys().collect::<Vec<_>>(),
            archived,
            "every file, and only those"
        );
        for (path, entry) in &listed {
            assert_eq!(entry["bytes"], files[path].len(), "{path}");
            assert!(entry["what"].as_str().is_some_and(|w| !w.is_empty()), "{path}");
        }
        let bounds = Bounds::default();
        let logs: Vec<&String> = files.keys().filter(|p| p.starts_with("logs/")).collect();
        assert!(logs.len() > 10, "every operand container's log: {logs:?}");
        for path in &logs {
            assert!(
                files[*path].len() as i64 <= bounds.limit_bytes,
                "{path} is bounded"
            );
        }
        let previous = format!(
            "logs/{NAMESPACE}/{}/{toolkit_container}.previous.log",
            toolkit.metadata.name
        );
        let crashed = &files[&previous];
        assert_eq!(crashed.len() as i64, bounds.limit_bytes, "cut at limitBytes");
        assert!(crashed.starts_with(b"001000 "), "from the last tailLines lines");
        assert!(listed[&previous]["cut"].as_str().unwrap().contains("limitBytes"));
        let current = previous.replace(".previous.log", ".log");
        assert!(
            !files.contains_key(&current),
            "a container waiting to restart has one log, its last run's"
        );
        let plugin_log = format!("logs/{NAMESPACE}/{}/{plugin_container}.log", plugin.metadata.name);
        let text = String::from_utf8(files[&plugin_log].clone()).unwrap();
        assert_eq!(text.lines().count() as i64, bounds.tail_lines);
        assert!(text.ends_with("plugin line 7999\n"), "the end of the log is kept");
        assert!(listed[&plugin_log]["cut"].as_str().unwrap().contains("tailLines"));
        let quiet = format!(
            "logs/{NAMESPACE}/{}/{plugin_container}.log",
            snapshot
                .pod_of(Operand::DevicePlugin, "gpu-1")
                .unwrap()
                .metadata
                .name
        );
        assert!(
            files[&quiet].is_empty(),
            "a container that wrote nothing has an empty log"
        );
        assert!(listed[&quiet].get("cut").is_none());

        // No Secret: not its kind, not its data, anywhere.
        for (path, content) in &files {
            let text = String::from_utf8_lossy(content);
            assert!(!text.contains(SECRET_DATA), "{path} holds the Secret's data");
            assert!(
                !text.contains("\"kind\":\"Secret\"") && !text.contains("\"kind\": \"Secret\""),
                "{path} holds a Secret"
            );
        }

        // `-o -` writes the archive to standard output.
        let piped = kubectl_gpu(&["bundle", "-o", "-", "--kubeconfig", &kubeconfig_arg]).await;
        assert_eq!(piped.status.code(), Some(0), "{}", stderr(&piped));
        assert!(piped.stdout.starts_with(&[0x1f, 0x8b]), "gzip on stdout");

        // The total bound: once spent, further logs are listed as not collected.
        let small = Bounds {
            total_log_bytes: bounds.limit_bytes + 1_000,
            ..bounds
        };
        let bundle = collect(&live, NAMESPACE, &gpuop_api::labels::GpuDetection::Nfd, small)
            .await
            .unwrap();
        let log_bytes: usize = bundle
            .index
            .files
            .iter()
            .filter(|f| f.path.starts_with("logs/"))
            .map(|f| f.bytes)
            .sum();
        assert!(log_bytes as i64 <= small.total_log_bytes, "{log_bytes}");
        assert!(
            bundle
                .index
                .missing
                .iter()
                .any(|m| m.why.contains("logs are spent")),
            "{:?}",
            bundle.index.missing
        );

        // Logs refused: still an archive (exit 0), each refusal listed with the server's answer.
        // What only upgrade-plan reads refused too: the snapshot still holds what the doctor reads.
        server.set_faults(
            Faults::new(1)
                .error(Some(Verb::Get), Some("pods"), 1.0, InjectedError::Internal)
                .error(
                    Some(Verb::List),
                    Some("poddisruptionbudgets"),
                    1.0,
                    InjectedError::Internal,
                ),
        );
        let refused = dir.path().join("refused.tar.gz");
        let output = kubectl_gpu(&[
            "bundle",
            "-o",
            refused.to_str().unwrap(),
            "--kubeconfig",
            &kubeconfig_arg,
        ])
        .await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert!(
            stderr(&output).contains("could not be collected"),
            "{}",
            stderr(&output)
        );
        let files = unpack(&refused);
        assert_eq!(
            files["doctor.json"], live_json.stdout,
            "the doctor's reads were not refused"
        );
        assert!(!files.contains_key("upgrade-plan.json"));
        let index: Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let missing = index["missing"].as_array().unwrap();
        for what in ["what upgrade-plan reads", "the upgrade plan"] {
            assert!(
                missing.iter().any(|m| m["what"].as_str().unwrap().contains(what)),
                "{what}: {missing:?}"
            );
        }
        assert!(
            missing
                .iter()
                .any(|m| m["what"].as_str().unwrap().starts_with("log of container")
                    && m["why"].as_str().unwrap().starts_with("500 ")),
            "{missing:?}"
        );

        // Nothing readable: exit 2 and no archive.
        server.set_faults(Faults::new(1).error(None, None, 1.0, InjectedError::Internal));
        let nothing = dir.path().join("nothing.tar.gz");
        let output = kubectl_gpu(&[
            "bundle",
            "-o",
            nothing.to_str().unwrap(),
            "--kubeconfig",
            &kubeconfig_arg,
        ])
        .await;
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert!(
            stderr(&output).contains("nothing could be read"),
            "{}",
            stderr(&output)
        );
        assert!(!nothing.exists());
    }

    /// A user who may read everything but `pods/log`: the archive is still written, and each log it could not
    /// read is listed with the server's 403.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn logs_refused_by_rbac_are_listed_with_the_servers_answer() {
        let server = FakeServer::builder()
            .authorization(gpuop_fakeserver::Authorization::Rbac)
            .build();
        let served = server
            .serve(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .expect("the fake API server serves");
        for object in [
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0",
                "labels": {"feature.node.kubernetes.io/pci-10de.present": "true"}}}),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-operator-0", "namespace": NAMESPACE},
                "spec": {"containers": [{"name": "operator", "image": "gpu-operator"}]}}),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "support", "namespace": "default"}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "support"},
                "rules": [{"apiGroups": ["", "apps", "node.k8s.io", "policy", "nvidia.com", "events.k8s.io"],
                    "resources": ["nodes", "pods", "daemonsets", "runtimeclasses", "controllerrevisions",
                        "poddisruptionbudgets", "clusterpolicies", "nvidiadrivers", "events"],
                    "verbs": ["get", "list"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "support"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "support"},
                "subjects": [{"kind": "ServiceAccount", "name": "support", "namespace": "default"}]}),
        ] {
            server.insert(object).expect("the fixture is valid");
        }
        let token = server.token_for("default", "support").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            gpuop_fakeserver::kubeconfig_with_token(&served.url(), Some(&token)),
        )
        .unwrap();
        let archive = dir.path().join("bundle.tar.gz");
        let output = kubectl_gpu(&[
            "bundle",
            "-o",
            archive.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ])
        .await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let files = unpack(&archive);
        assert!(files.contains_key("doctor.json"), "{:?}", files.keys());
        let index: Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let missing = index["missing"].as_array().unwrap();
        let refused = missing
            .iter()
            .find(|m| m["what"] == "log of container operator of pod gpu-operator/gpu-operator-0")
            .unwrap_or_else(|| panic!("{missing:?}"));
        assert!(
            refused["why"].as_str().unwrap().starts_with("403 Forbidden: "),
            "{refused}"
        );
        assert!(stderr(&output).contains("403 Forbidden"), "{}", stderr(&output));
    }
}

mod krew {
    //! The krew manifest: rendered by `deploy/krew/render.sh` from release archives, it parses as a krew
    //! `Plugin` named `gpu` whose every platform installs `kubectl-gpu`, with the archives' real sha256.

    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn render_script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/krew/render.sh")
    }

    fn archives(dir: &Path, version: &str, platforms: &[(&str, &str)]) {
        for (os, arch) in platforms {
            // Each archive differs, so that a checksum given to the wrong platform shows.
            std::fs::write(dir.join("kubectl-gpu"), format!("#!/bin/sh\necho {os}/{arch}\n")).unwrap();
            let status = Command::new("tar")
                .arg("-czf")
                .arg(dir.join(format!("kubectl-gpu_{version}_{os}_{arch}.tar.gz")))
                .args(["-C", dir.to_str().unwrap(), "kubectl-gpu"])
                .status()
                .unwrap();
            assert!(status.success());
        }
    }

    fn sha256(path: &Path) -> String {
        let output = Command::new("sha256sum").arg(path).output().unwrap();
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    }

    const ALL: [(&str, &str); 4] = [
        ("linux", "amd64"),
        ("linux", "arm64"),
        ("darwin", "amd64"),
        ("darwin", "arm64"),
    ];

    #[test]
    fn the_manifest_rendered_from_the_archives_installs_kubectl_gpu_everywhere() {
        let dir = tempfile::tempdir().unwrap();
        archives(dir.path(), "v1.2.3", &ALL);
        let output = Command::new("bash")
            .arg(render_script())
            .args(["v1.2.3", "https://releases.example/v1.2.3/"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8(output.stdout).unwrap();
        assert!(!text.contains('@'), "nothing left unrendered: {text}");
        let manifest: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(
            manifest["apiVersion"],
            "krew.googlecontainertools.github.com/v1alpha2"
        );
        assert_eq!(manifest["kind"], "Plugin");
        assert_eq!(manifest["metadata"]["name"], "gpu");
        assert_eq!(manifest["spec"]["version"], "v1.2.3");
        assert!(
            manifest["spec"]["shortDescription"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        );
        assert!(
            manifest["spec"]["description"]
                .as_str()
                .is_some_and(|s| s.len() > 100)
        );
        let platforms = manifest["spec"]["platforms"].as_array().unwrap();
        assert_eq!(platforms.len(), 4);
        for ((os, arch), platform) in ALL.iter().zip(platforms) {
            let name = format!("kubectl-gpu_v1.2.3_{os}_{arch}.tar.gz");
            assert_eq!(platform["selector"]["matchLabels"]["os"], *os);
            assert_eq!(platform["selector"]["matchLabels"]["arch"], *arch);
            assert_eq!(platform["uri"], format!("https://releases.example/v1.2.3/{name}"));
            assert_eq!(platform["sha256"], sha256(&dir.path().join(&name)));
            assert_eq!(platform["bin"], "kubectl-gpu");
            assert_eq!(platform["files"][0]["from"], "kubectl-gpu");
        }
    }

    #[test]
    fn no_manifest_without_every_archive() {
        let dir = tempfile::tempdir().unwrap();
        archives(dir.path(), "v1.2.3", &ALL[..3]);
        let output = Command::new("bash")
            .arg(render_script())
            .args(["v1.2.3", "https://releases.example/v1.2.3"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1));
        assert!(output.stdout.is_empty(), "no half manifest");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(
            message.contains("kubectl-gpu_v1.2.3_darwin_arm64.tar.gz does not exist"),
            "{message}"
        );
        let output = Command::new("bash")
            .arg(render_script())
            .args(["1.2.3", "https://releases.example", "."])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "krew wants a leading v");
    }
}
