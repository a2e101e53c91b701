//! The node labeller's decisions: which labels a node should carry, as a pure function of the node's labels
//! and annotations and the active policy. The node-label controller patches exactly the difference.
//!
//! NVIDIA's semantics (reference section 3) with two deliberate improvements:
//! - **A value a person set survives.** The operator records the labels it wrote, with their values, in
//!   the annotation [`OWNED_LABELS`]; it only ever removes or rewrites a label whose value is still the one
//!   it wrote. A person's `nvidia.com/gpu.deploy.device-plugin=false` therefore outlives a transient loss of
//!   `nvidia.com/gpu.present` (NVIDIA's issue #2288).
//! - **Uninstall cleans up.** With no policy, every label the operator owns is removed (NVIDIA's #1391),
//!   and so are deploy switches an operand paused (`paused-for-driver-upgrade`, `paused-for-mig-change`),
//!   which nothing would resume.
//!
//! Labels the operator would write that a node already carries with the same value (for example from
//! NVIDIA's operator, before a migration) are adopted: they become owned without a write.
//!
//! A node whose driver switch the labeller turns on gets, in the same write, the upgrade state the
//! upgrade controller would give it once its driver pod shows: see [`desired_labels`].

use std::collections::{BTreeMap, HashMap};

use gpuop_api::catalogue::deploy_labels_for;
use gpuop_api::choice::WorkloadConfig;
use gpuop_api::labels::{
    DEPLOY_OPERANDS, DEPLOY_PREFIX, DRIVER_OWNER, GPU_PRESENT, GpuDetection, LEGACY_DEPLOY_LABELS,
    MIG_CONFIG, OWNED_LABELS, PAUSED_FOR_DRIVER_UPGRADE, PAUSED_FOR_MIG_CHANGE, UPGRADE_ENABLED_ANNOTATION,
    UPGRADE_STATE, is_mig_capable,
};
use gpuop_api::read::Labels;
use gpuop_api::upgrade::{DEFAULT_VALIDATION_TIMEOUT_SECONDS, UpgradePolicy, UpgradeState};
use gpuop_api::validate::{Sandbox, ValidatedPolicy};
use gpuop_api::{NVIDIADriver, Operand, route_nodes};

use crate::projection::{LabelTable, NodeRecord};

/// What the labeller needs from the policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelPolicy {
    /// Sandbox settings, when sandbox workloads are on.
    pub sandbox: Option<Sandbox>,
    /// Whether the MIG manager is deployed.
    pub mig_manager: bool,
    /// Layout stamped on MIG-capable nodes that have none.
    pub mig_default_layout: Option<String>,
    /// With NVIDIADriver objects managing the driver, the live ones: each GPU node's
    /// `nvidia.com/gpu-operator.driver.owner` names the one that serves it.
    pub nvidia_drivers: Option<Vec<NVIDIADriver>>,
    /// Whether the ClusterPolicy deploys the driver and upgrades it automatically (without NVIDIADrivers).
    pub driver_upgrades: bool,
}

impl LabelPolicy {
    /// The labeller's view of a validated policy.
    pub fn from_policy(policy: &ValidatedPolicy) -> Self {
        Self {
            sandbox: policy.sandbox,
            mig_manager: policy.spec.mig_manager_enabled(),
            mig_default_layout: policy.mig_default_layout.clone(),
            nvidia_drivers: None,
            // The timeout does not make a policy usable or not.
            driver_upgrades: policy.spec.driver.is_enabled()
                && !policy.spec.driver.use_nvidia_driver_crd()
                && UpgradePolicy::of_cluster_policy(policy, DEFAULT_VALIDATION_TIMEOUT_SECONDS)
                    .is_some_and(|usable| usable.is_ok()),
        }
    }

    /// Whether the pool of the NVIDIADriver `owner` (`None`: the ClusterPolicy's) upgrades automatically.
    fn upgrades_automatically(&self, owner: Option<&str>) -> bool {
        match (&self.nvidia_drivers, owner) {
            (None, _) => self.driver_upgrades,
            (Some(drivers), Some(owner)) => drivers.iter().any(|driver| {
                driver.metadata.name.as_deref() == Some(owner)
                    && UpgradePolicy::of_nvidia_driver(driver, DEFAULT_VALIDATION_TIMEOUT_SECONDS)
                        .is_some_and(|usable| usable.is_ok())
            }),
            // With NVIDIADrivers, a node none serves runs no driver.
            (Some(_), None) => false,
        }
    }
}

/// Changes to one node's metadata; `None` removes a key. Empty when the node is as it should be.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodePatch {
    /// Label changes.
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotation changes.
    pub annotations: BTreeMap<String, Option<String>>,
}

impl NodePatch {
    /// Whether nothing needs to change.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }

    /// The JSON merge patch that makes these changes and touches nothing else.
    pub fn to_merge_patch(&self) -> serde_json::Value {
        let mut metadata = serde_json::Map::new();
        if !self.labels.is_empty() {
            metadata.insert(
                "labels".into(),
                serde_json::to_value(&self.labels).expect("strings serialize"),
            );
        }
        if !self.annotations.is_empty() {
            metadata.insert(
                "annotations".into(),
                serde_json::to_value(&self.annotations).expect("strings serialize"),
            );
        }
        serde_json::json!({ "metadata": metadata })
    }
}

/// The desired patch ([`desired_labels`]) of each pair of label and annotation tables seen under one
/// labelling policy. The nodes of one kind share their tables ([`LabelTable`] is interned), so a
/// rollout's tens of thousands of node events work out each kind's patch once, not once per event. The
/// tables are kept with their patch: an address is not reused while its entry holds the table.
#[derive(Debug, Default)]
pub struct DesiredPatches {
    inputs: Option<(Option<LabelPolicy>, GpuDetection)>,
    patches: HashMap<(usize, usize), (LabelTable, LabelTable, NodePatch)>,
}

/// Pairs of tables remembered at most, then forgotten all at once: far more kinds than a fleet has, and a
/// bound on the tables kept alive after their nodes moved on (each at most a few kilobytes).
const DESIRED_KEPT: usize = 1024;

impl DesiredPatches {
    /// The patch that [`desired_labels`] makes of `node` under `policy` and `detection`.
    pub fn of(
        &mut self,
        node: &NodeRecord,
        policy: Option<&LabelPolicy>,
        detection: &GpuDetection,
    ) -> NodePatch {
        let same_inputs = self
            .inputs
            .as_ref()
            .is_some_and(|(p, d)| p.as_ref() == policy && d == detection);
        if !same_inputs {
            self.patches.clear();
            self.inputs = Some((policy.cloned(), detection.clone()));
        }
        let key = (node.labels.address(), node.annotations.address());
        if let Some((_, _, patch)) = self.patches.get(&key) {
            return patch.clone();
        }
        let patch = desired_labels(&node.labels, &node.annotations, policy, detection);
        if self.patches.len() >= DESIRED_KEPT {
            self.patches.clear();
        }
        self.patches.insert(
            key,
            (node.labels.clone(), node.annotations.clone(), patch.clone()),
        );
        patch
    }
}

/// The labels the operator wants on a node and the change that gets it there.
///
/// `policy` is `None` when no ClusterPolicy is active: the operator then removes what it owns.
pub fn desired_labels(
    labels: &(impl Labels + ?Sized),
    annotations: &(impl Labels + ?Sized),
    policy: Option<&LabelPolicy>,
    detection: &GpuDetection,
) -> NodePatch {
    let owned: BTreeMap<&str, &str> = annotations
        .get_label(OWNED_LABELS)
        .map(|pairs| pairs.split(',').filter_map(|pair| pair.split_once('=')).collect())
        .unwrap_or_default();
    let ours_unchanged = |key: &str, value: &str| owned.get(key) == Some(&value);
    let wanted = wanted_labels(labels, policy, detection);

    let mut patch = NodePatch::default();
    let mut now_owned: BTreeMap<&str, &str> = BTreeMap::new();
    for (key, value) in &wanted {
        let current = labels.get_label(key).filter(|v| !v.is_empty());
        let write = match current {
            // Absent or empty (treated as absent): write it.
            None => true,
            // Already right: own it without a write (adopts what an earlier operator wrote).
            Some(existing) if existing == value => false,
            // Still what the operator wrote, or one of the operator's own protocol labels: rewrite it.
            Some(existing) if ours_unchanged(key, existing) || key == GPU_PRESENT || key == DRIVER_OWNER => {
                true
            }
            // A value someone else chose wins, and the label is no longer the operator's.
            Some(_) => continue,
        };
        if write {
            patch.labels.insert(key.clone(), Some(value.clone()));
        }
        now_owned.insert(key, value);
    }
    let kill_switch = labels.get_label(DEPLOY_OPERANDS) == Some("false");
    for (key, value) in labels.each_label() {
        if wanted.contains_key(key) {
            continue;
        }
        // Deploy switches set to "true" schedule operands: with the kill switch on, or for keys no operand
        // uses any more, they go even when the operator did not write them.
        let stray_switch = value == "true"
            && key != DEPLOY_OPERANDS
            && (LEGACY_DEPLOY_LABELS.contains(&key) || (kill_switch && key.starts_with(DEPLOY_PREFIX)));
        // A switch the driver or MIG manager paused was the operator's; with no policy nobody will ever
        // resume it, and no person writes these values.
        let paused_switch = policy.is_none()
            && key.starts_with(DEPLOY_PREFIX)
            && (value == PAUSED_FOR_DRIVER_UPGRADE || value == PAUSED_FOR_MIG_CHANGE);
        // The routing label is the operator's alone (NVIDIADrivers may not select on it): a node no
        // NVIDIADriver serves has none, whoever wrote it.
        if ours_unchanged(key, value) || stray_switch || paused_switch || key == DRIVER_OWNER {
            patch.labels.insert(key.to_owned(), None);
        }
    }

    // The node's driver switch turns on now, so its driver pod will come from the DaemonSet's latest
    // revision: in a pool that upgrades automatically, the node starts `upgrade-done` (with the annotation
    // that says the operator upgrades it), which the upgrade controller would write once that pod shows
    // (NVIDIA's does), here in the same write as the switch. These are the upgrade controller's keys: not
    // recorded as the labeller's, never removed by it, and left alone on a node that has a state already.
    let driver_switch = Operand::Driver.info().deploy_label;
    if let Some(policy) = policy
        && patch.labels.get(driver_switch) == Some(&Some("true".to_owned()))
        && labels.get_label(UPGRADE_STATE).is_none()
        && policy.upgrades_automatically(wanted.get(DRIVER_OWNER).map(String::as_str))
    {
        patch.labels.insert(
            UPGRADE_STATE.to_owned(),
            Some(UpgradeState::Done.label().to_owned()),
        );
        if annotations.get_label(UPGRADE_ENABLED_ANNOTATION) != Some("true") {
            patch
                .annotations
                .insert(UPGRADE_ENABLED_ANNOTATION.to_owned(), Some("true".to_owned()));
        }
    }

    let record: Vec<String> = now_owned
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    let record = (!record.is_empty()).then(|| record.join(","));
    if annotations.get_label(OWNED_LABELS) != record.as_deref() {
        patch.annotations.insert(OWNED_LABELS.to_owned(), record);
    }
    patch
}

/// Every label the operator wants to own on the node, with its value.
fn wanted_labels(
    labels: &(impl Labels + ?Sized),
    policy: Option<&LabelPolicy>,
    detection: &GpuDetection,
) -> BTreeMap<String, String> {
    let mut wanted = BTreeMap::new();
    let Some(policy) = policy else { return wanted };
    let has_gpu = detection.has_gpu(labels);
    if has_gpu {
        wanted.insert(GPU_PRESENT.to_owned(), "true".to_owned());
    } else if labels.get_label(GPU_PRESENT).is_some() {
        // The GPU went away: say so (flip, do not delete), as NVIDIA's operator does.
        wanted.insert(GPU_PRESENT.to_owned(), "false".to_owned());
    }
    if !has_gpu {
        return wanted;
    }
    if let Some(drivers) = &policy.nvidia_drivers {
        let live: Vec<&NVIDIADriver> = drivers.iter().collect();
        let name = "node";
        let routing = route_nodes([(name, labels)], &live);
        let owner = match routing.owner(name) {
            Some(owner) => Some(owner),
            // Claimed by several: fail closed, the node keeps what it has.
            None if routing.conflicts.contains_key(name) => labels.get_label(DRIVER_OWNER),
            None => None,
        };
        if let Some(owner) = owner {
            wanted.insert(DRIVER_OWNER.to_owned(), owner.to_owned());
        }
    }
    if labels.get_label(DEPLOY_OPERANDS) == Some("false") {
        return wanted;
    }
    let (workload, mode) = Sandbox::node_workload(policy.sandbox, labels);
    let mig_capable = is_mig_capable(labels);
    for key in deploy_labels_for(workload, mode, mig_capable) {
        wanted.insert(key.to_owned(), "true".to_owned());
    }
    if workload == WorkloadConfig::Container
        && policy.mig_manager
        && mig_capable
        && let Some(layout) = &policy.mig_default_layout
        && labels
            .get_label(MIG_CONFIG)
            .is_none_or(|current| current.is_empty() || current == layout)
    {
        wanted.insert(MIG_CONFIG.to_owned(), layout.clone());
    }
    wanted
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_api::choice::SandboxMode;
    use gpuop_api::labels::WORKLOAD_CONFIG;
    use gpuop_api::labels::{GPU_PRODUCT, MIG_CAPABLE, VGPU_HOST_DRIVER_VERSION};

    const NFD_GPU: &str = "feature.node.kubernetes.io/pci-10de.present";

    /// The deploy-label ids of a container workload on a GPU node that is not MIG-capable: the catalogue's
    /// table, which `gpuop-api`'s `workload_tables_match_nvidias_labeller` holds to NVIDIA's labeller.
    fn container_ids() -> Vec<&'static str> {
        let table = deploy_labels_for(WorkloadConfig::Container, SandboxMode::KubeVirt, false);
        table
            .iter()
            .map(|label| label.trim_start_matches(DEPLOY_PREFIX))
            .collect()
    }

    /// A node's metadata, evolving as the labeller's patches are applied to it.
    #[derive(Clone, Debug, Default)]
    struct Node {
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
    }

    impl Node {
        fn gpu() -> Self {
            Self::default().with(NFD_GPU, "true")
        }

        fn with(mut self, key: &str, value: &str) -> Self {
            self.labels.insert(key.to_owned(), value.to_owned());
            self
        }

        fn without(mut self, key: &str) -> Self {
            self.labels.remove(key);
            self
        }

        fn patch(&self, policy: Option<&LabelPolicy>) -> NodePatch {
            desired_labels(&self.labels, &self.annotations, policy, &GpuDetection::Nfd)
        }

        /// Applies the labeller's patch, asserting that a second pass changes nothing.
        fn reconciled(mut self, policy: Option<&LabelPolicy>) -> Self {
            let patch = self.patch(policy);
            for (key, value) in patch.labels {
                match value {
                    Some(value) => self.labels.insert(key, value),
                    None => self.labels.remove(&key),
                };
            }
            for (key, value) in patch.annotations {
                match value {
                    Some(value) => self.annotations.insert(key, value),
                    None => self.annotations.remove(&key),
                };
            }
            assert_eq!(
                self.patch(policy),
                NodePatch::default(),
                "a second pass must not write"
            );
            self
        }

        fn label(&self, key: &str) -> Option<&str> {
            self.labels.get(key).map(String::as_str)
        }

        fn deploy(&self, id: &str) -> Option<&str> {
            self.label(&format!("{DEPLOY_PREFIX}{id}"))
        }

        fn deployed(&self) -> Vec<&str> {
            self.labels
                .iter()
                .filter(|(k, v)| k.starts_with(DEPLOY_PREFIX) && *v == "true")
                .map(|(k, _)| k.trim_start_matches(DEPLOY_PREFIX))
                .collect()
        }
    }

    fn policy() -> LabelPolicy {
        LabelPolicy {
            sandbox: None,
            mig_manager: true,
            mig_default_layout: Some("all-disabled".into()),
            nvidia_drivers: None,
            driver_upgrades: false,
        }
    }

    fn sorted(ids: &[&str]) -> Vec<String> {
        let mut ids: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
        ids.sort();
        ids
    }

    fn owned(node: &Node) -> Vec<&str> {
        node.annotations
            .get(OWNED_LABELS)
            .map(|v| v.split(',').map(|pair| pair.split_once('=').unwrap().0).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_node_whose_driver_switch_turns_on_starts_upgrade_done_in_the_same_write() {
        let upgrading = LabelPolicy {
            driver_upgrades: true,
            ..policy()
        };
        let patch = Node::gpu().patch(Some(&upgrading));
        assert_eq!(patch.labels[UPGRADE_STATE].as_deref(), Some("upgrade-done"));
        assert_eq!(
            patch.annotations[UPGRADE_ENABLED_ANNOTATION].as_deref(),
            Some("true")
        );
        let node = Node::gpu().reconciled(Some(&upgrading));
        assert!(!owned(&node).contains(&UPGRADE_STATE), "{:?}", owned(&node));
        // The upgrade controller's keys stay its own: the labeller neither removes nor rewrites them.
        let moved = node.clone().with(UPGRADE_STATE, "upgrade-required");
        assert_eq!(moved.patch(Some(&upgrading)), NodePatch::default());
        assert_eq!(
            node.clone().without(UPGRADE_STATE).patch(Some(&upgrading)),
            NodePatch::default()
        );
        let off = node.patch(Some(&policy()));
        assert!(!off.labels.contains_key(UPGRADE_STATE) && off.annotations.is_empty());
        // A node that has its driver switch (adopted, or from before) is the upgrade controller's to mark;
        // so is one with a state, whose switch comes back.
        let switched = Node::gpu().with(&format!("{DEPLOY_PREFIX}driver"), "true");
        assert!(
            !switched
                .patch(Some(&upgrading))
                .labels
                .contains_key(UPGRADE_STATE)
        );
        let stated = Node::gpu().with(UPGRADE_STATE, "upgrade-failed");
        assert!(!stated.patch(Some(&upgrading)).labels.contains_key(UPGRADE_STATE));
        // No marks without automatic upgrades, or on a node that gets no driver.
        assert!(
            !Node::gpu()
                .patch(Some(&policy()))
                .labels
                .contains_key(UPGRADE_STATE)
        );
        let no_driver = Node::gpu().with(DEPLOY_OPERANDS, "false");
        assert!(
            !no_driver
                .patch(Some(&upgrading))
                .labels
                .contains_key(UPGRADE_STATE)
        );
    }

    #[test]
    fn the_cluster_policy_upgrades_automatically_only_when_it_can() {
        let sample: serde_json::Value =
            serde_saphyr::from_str(include_str!("../../../deploy/samples/clusterpolicy.yaml")).unwrap();
        let upgrades = |pointer: &str, value: serde_json::Value| {
            let mut policy = sample.clone();
            *policy.pointer_mut(pointer).unwrap() = value;
            let policy: gpuop_api::ClusterPolicy = serde_json::from_value(policy).unwrap();
            LabelPolicy::from_policy(&gpuop_api::validate::validate(&policy).unwrap()).driver_upgrades
        };
        let auto = "/spec/driver/upgradePolicy/autoUpgrade";
        assert!(upgrades(auto, true.into()), "the sample turns them on");
        assert!(!upgrades(auto, false.into()));
        assert!(!upgrades("/spec/driver/enabled", false.into()));
        assert!(!upgrades("/spec/driver/useNvidiaDriverCRD", true.into()));
        assert!(!upgrades("/spec/sandboxWorkloads/enabled", true.into()));
    }

    #[test]
    fn nvidia_drivers_route_gpu_nodes_with_the_owner_label() {
        let driver = |name: &str, yaml: &str| -> NVIDIADriver {
            let mut driver: NVIDIADriver = serde_saphyr::from_str(&format!(
                "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {{name: {name}}}\nspec: {yaml}"
            ))
            .unwrap();
            driver.metadata.name = Some(name.to_owned());
            driver
        };
        let routed = LabelPolicy {
            nvidia_drivers: Some(vec![
                driver("default", "{default: true, driverType: gpu, image: driver}"),
                driver(
                    "h100",
                    "{driverType: gpu, image: driver, nodeSelector: {pool: h100}}",
                ),
            ]),
            ..policy()
        };
        let node = Node::gpu().reconciled(Some(&routed));
        assert_eq!(
            node.label(DRIVER_OWNER),
            Some("default"),
            "the default serves the rest"
        );
        let h100 = node.with("pool", "h100").reconciled(Some(&routed));
        assert_eq!(h100.label(DRIVER_OWNER), Some("h100"));
        // Each NVIDIADriver's pool upgrades automatically unless its policy says not: the node that one
        // serves starts `upgrade-done`, one that one with upgrades off serves does not.
        let manual = LabelPolicy {
            nvidia_drivers: Some(vec![driver(
                "default",
                "{default: true, driverType: gpu, image: driver, upgradePolicy: {autoUpgrade: false}}",
            )]),
            ..policy()
        };
        let fresh = Node::gpu().with("pool", "h100").patch(Some(&routed));
        assert_eq!(fresh.labels[UPGRADE_STATE].as_deref(), Some("upgrade-done"));
        assert!(
            !Node::gpu()
                .patch(Some(&manual))
                .labels
                .contains_key(UPGRADE_STATE)
        );

        // Two drivers claim the node: it keeps its owner (fail closed) and nothing else moves.
        let overlapping = LabelPolicy {
            nvidia_drivers: Some(vec![
                driver(
                    "h100",
                    "{driverType: gpu, image: driver, nodeSelector: {pool: h100}}",
                ),
                driver(
                    "fast",
                    "{driverType: gpu, image: driver, nodeSelector: {pool: h100}}",
                ),
            ]),
            ..policy()
        };
        assert!(!h100.patch(Some(&overlapping)).labels.contains_key(DRIVER_OWNER));

        // Back to the ClusterPolicy's driver: the routing label goes.
        let back = h100.reconciled(Some(&policy()));
        assert_eq!(back.label(DRIVER_OWNER), None);
        assert!(
            Node::default()
                .reconciled(Some(&routed))
                .label(DRIVER_OWNER)
                .is_none(),
            "no GPU, no owner"
        );
    }

    #[test]
    fn a_new_gpu_node_gets_the_container_switches_once() {
        let node = Node::gpu().reconciled(Some(&policy()));
        assert_eq!(node.label(GPU_PRESENT), Some("true"));
        assert_eq!(node.deployed(), sorted(&container_ids()));
        assert_eq!(node.label(MIG_CONFIG), None, "not MIG-capable");
        assert!(owned(&node).contains(&GPU_PRESENT));
    }

    #[test]
    fn a_node_without_a_gpu_is_left_alone() {
        let node = Node::default().with("kubernetes.io/os", "linux");
        assert_eq!(node.patch(Some(&policy())), NodePatch::default());
    }

    #[test]
    fn mig_capable_nodes_get_the_mig_manager_and_the_default_layout() {
        let a100 = Node::gpu()
            .with(GPU_PRODUCT, "NVIDIA-A100-SXM4-80GB")
            .reconciled(Some(&policy()));
        assert_eq!(a100.deploy("mig-manager"), Some("true"));
        assert_eq!(a100.label(MIG_CONFIG), Some("all-disabled"));
        // A layout a person chose is never replaced.
        let chosen = Node::gpu()
            .with(MIG_CAPABLE, "true")
            .with(MIG_CONFIG, "all-1g.10gb")
            .reconciled(Some(&policy()));
        assert_eq!(chosen.label(MIG_CONFIG), Some("all-1g.10gb"));
        // `default: ""` in the policy stamps no layout; vGPU hosts are never MIG-capable.
        let no_default = LabelPolicy {
            mig_default_layout: None,
            ..policy()
        };
        // A MIG-capable GPU node, as the labeller leaves it under `policy`.
        let mig_capable =
            |policy: &LabelPolicy| Node::gpu().with(MIG_CAPABLE, "true").reconciled(Some(policy));
        assert_eq!(mig_capable(&no_default).label(MIG_CONFIG), None);
        let vgpu_host = Node::gpu()
            .with(GPU_PRODUCT, "A100")
            .with(VGPU_HOST_DRIVER_VERSION, "550.54")
            .reconciled(Some(&policy()));
        assert_eq!(vgpu_host.deploy("mig-manager"), None);
        let disabled = LabelPolicy {
            mig_manager: false,
            ..policy()
        };
        assert_eq!(mig_capable(&disabled).label(MIG_CONFIG), None);
    }

    #[test]
    fn values_a_person_set_are_honoured_and_empty_means_absent() {
        let node = Node::gpu()
            .with(&format!("{DEPLOY_PREFIX}driver"), "false")
            .with(&format!("{DEPLOY_PREFIX}device-plugin"), "")
            .with(&format!("{DEPLOY_PREFIX}dcgm"), "paused-for-driver-upgrade")
            .reconciled(Some(&policy()));
        assert_eq!(node.deploy("driver"), Some("false"));
        assert_eq!(node.deploy("device-plugin"), Some("true"));
        assert_eq!(node.deploy("dcgm"), Some("paused-for-driver-upgrade"));
        assert!(!owned(&node).contains(&"nvidia.com/gpu.deploy.driver"));
    }

    #[test]
    fn a_persons_false_survives_a_transient_loss_of_the_gpu() {
        let policy = policy();
        let node = Node::gpu()
            .reconciled(Some(&policy))
            .with(&format!("{DEPLOY_PREFIX}device-plugin"), "false");
        let node = node.reconciled(Some(&policy));
        // NFD loses the GPU for a while: gpu.present flips to false and the operator's switches go.
        let lost = node.without(NFD_GPU).reconciled(Some(&policy));
        assert_eq!(lost.label(GPU_PRESENT), Some("false"));
        assert_eq!(lost.deployed(), Vec::<&str>::new());
        assert_eq!(
            lost.deploy("device-plugin"),
            Some("false"),
            "the person's choice stays"
        );
        // The GPU comes back: everything returns but the device plugin stays off.
        let back = lost.with(NFD_GPU, "true").reconciled(Some(&policy));
        assert_eq!(back.label(GPU_PRESENT), Some("true"));
        assert_eq!(back.deploy("device-plugin"), Some("false"));
        let mut expected: Vec<&str> = container_ids()
            .into_iter()
            .filter(|id| *id != "device-plugin")
            .collect();
        expected.sort_unstable();
        assert_eq!(back.deployed(), expected);
    }

    #[test]
    fn the_kill_switch_empties_the_node_and_lifting_it_restores_it() {
        let policy = policy();
        let node = Node::gpu()
            .with(&format!("{DEPLOY_PREFIX}dcgm"), "false")
            .reconciled(Some(&policy))
            .with(DEPLOY_OPERANDS, "false");
        let off = node
            .with(&format!("{DEPLOY_PREFIX}sandbox-validator"), "true")
            .reconciled(Some(&policy));
        assert_eq!(
            off.deployed(),
            Vec::<&str>::new(),
            "no operand may run, the driver included"
        );
        assert_eq!(off.deploy("dcgm"), Some("false"));
        assert_eq!(
            off.label(DEPLOY_OPERANDS),
            Some("false"),
            "the person's switch is not touched"
        );
        let on = off.without(DEPLOY_OPERANDS).reconciled(Some(&policy));
        assert_eq!(
            on.deploy("dcgm"),
            Some("false"),
            "a person's false outlives the kill switch"
        );
        assert_eq!(on.deploy("driver"), Some("true"));
    }

    #[test]
    fn switching_workload_swaps_the_operands() {
        let sandbox = LabelPolicy {
            sandbox: Some(Sandbox {
                mode: SandboxMode::KubeVirt,
                default_workload: WorkloadConfig::Container,
            }),
            ..policy()
        };
        let container = Node::gpu().reconciled(Some(&sandbox));
        assert_eq!(container.deployed(), sorted(&container_ids()));
        let passthrough = container
            .with(WORKLOAD_CONFIG, "vm-passthrough")
            .reconciled(Some(&sandbox));
        assert_eq!(
            passthrough.deployed(),
            sorted(&[
                "sandbox-validator",
                "vfio-manager",
                "sandbox-device-plugin",
                "cc-manager"
            ])
        );
        let vgpu = passthrough
            .with(WORKLOAD_CONFIG, "vm-vgpu")
            .reconciled(Some(&sandbox));
        assert!(vgpu.deployed().contains(&"vgpu-manager"));
        // An invalid workload label falls back to the policy's default.
        let invalid = Node::gpu()
            .with(WORKLOAD_CONFIG, "bare-metal")
            .reconciled(Some(&sandbox));
        assert_eq!(invalid.deployed(), sorted(&container_ids()));
    }

    #[test]
    fn deleting_the_policy_removes_what_the_operator_added_and_nothing_else() {
        let node = Node::gpu()
            .with(GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3")
            .with(&format!("{DEPLOY_PREFIX}driver"), "false")
            .reconciled(Some(&policy()));
        let removed = node.clone().reconciled(None);
        assert_eq!(removed.label(GPU_PRESENT), None);
        assert_eq!(removed.label(MIG_CONFIG), None);
        assert_eq!(removed.deployed(), Vec::<&str>::new());
        assert_eq!(removed.deploy("driver"), Some("false"));
        assert_eq!(removed.label(GPU_PRODUCT), Some("NVIDIA-H100-80GB-HBM3"));
        assert!(removed.annotations.is_empty());

        // The driver manager paused a switch for an upgrade when the policy went: nothing will resume it.
        let paused = node
            .with(&format!("{DEPLOY_PREFIX}dcgm"), PAUSED_FOR_DRIVER_UPGRADE)
            .with(&format!("{DEPLOY_PREFIX}mig-manager"), PAUSED_FOR_MIG_CHANGE)
            .reconciled(None);
        assert_eq!(paused.deploy("dcgm"), None);
        assert_eq!(paused.deploy("mig-manager"), None);
        assert_eq!(paused.deploy("driver"), Some("false"));
    }

    #[test]
    fn labels_from_nvidias_operator_are_adopted_without_relabelling() {
        let mut node = Node::gpu()
            .with(GPU_PRESENT, "true")
            .with("nvidia.com/gpu.deploy.client", "true");
        for id in container_ids() {
            node = node.with(&format!("{DEPLOY_PREFIX}{id}"), "true");
        }
        let patch = node.patch(Some(&policy()));
        assert_eq!(
            patch.labels,
            BTreeMap::from([("nvidia.com/gpu.deploy.client".to_owned(), None)]),
            "only the unused legacy switch changes"
        );
        assert_eq!(patch.annotations.len(), 1);
        // After adoption, uninstalling removes them.
        assert_eq!(
            node.reconciled(Some(&policy())).reconciled(None).deployed(),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn a_selector_finds_gpu_nodes_without_nfd() {
        let detection = GpuDetection::NfdOrSelector("cloud.google.com/gke-accelerator".parse().unwrap());
        let node = Node::default().with("cloud.google.com/gke-accelerator", "nvidia-l4");
        let patch = desired_labels(&node.labels, &node.annotations, Some(&policy()), &detection);
        assert_eq!(patch.labels.get(GPU_PRESENT), Some(&Some("true".to_owned())));
        assert!(
            Node::gpu()
                .patch(Some(&policy()))
                .labels
                .contains_key(GPU_PRESENT),
            "NFD still counts"
        );
    }

    #[test]
    fn the_merge_patch_touches_only_what_changes() {
        let node = Node::gpu().reconciled(Some(&policy())).without(NFD_GPU);
        let patch = node.patch(Some(&policy())).to_merge_patch();
        let labels = patch["metadata"]["labels"].as_object().unwrap();
        assert_eq!(labels[GPU_PRESENT], "false");
        assert_eq!(labels["nvidia.com/gpu.deploy.driver"], serde_json::Value::Null);
        assert_eq!(labels.len(), 1 + container_ids().len());
    }
}

#[cfg(test)]
mod desired_patches_tests {
    use super::*;
    use crate::index::tests::node;
    use crate::projection::{Interner, NodeKeys};
    use gpuop_api::labels::MIG_CAPABLE;

    fn record(name: &str, labels: &[(&str, &str)], interner: &mut Interner) -> NodeRecord {
        NodeRecord::project(&node(name, labels), &NodeKeys::default(), interner)
    }

    /// Nodes of one kind share one entry; every answer is what `desired_labels` says for the node and the
    /// policy of the call, even after the policy changed.
    #[test]
    fn each_kind_of_node_is_worked_out_once_per_policy() {
        let gpu = ("feature.node.kubernetes.io/pci-10de.present", "true");
        let mut interner = Interner::default();
        let plain: Vec<NodeRecord> = (0..100)
            .map(|i| record(&format!("gpu-{i}"), &[gpu], &mut interner))
            .collect();
        let mig = record("gpu-mig", &[gpu, (MIG_CAPABLE, "true")], &mut interner);
        let detection = GpuDetection::Nfd;
        let fresh = |node: &NodeRecord, policy: &LabelPolicy| {
            desired_labels(&node.labels, &node.annotations, Some(policy), &detection)
        };
        let mut desired = DesiredPatches::default();
        for policy in [LabelPolicy::default(), layout()] {
            for node in plain.iter().chain([&mig]) {
                assert_eq!(desired.of(node, Some(&policy), &detection), fresh(node, &policy));
            }
            assert_eq!(desired.patches.len(), 2, "one entry per kind of node");
        }
        // The default MIG layout follows the policy of the call, not the one remembered.
        let without = desired.of(&mig, Some(&LabelPolicy::default()), &detection);
        assert!(!without.labels.contains_key(MIG_CONFIG));
        let with = desired.of(&mig, Some(&layout()), &detection);
        assert_eq!(
            with.labels.get(MIG_CONFIG),
            Some(&Some("all-disabled".to_owned()))
        );
    }

    fn layout() -> LabelPolicy {
        LabelPolicy {
            mig_manager: true,
            mig_default_layout: Some("all-disabled".into()),
            ..LabelPolicy::default()
        }
    }
}
