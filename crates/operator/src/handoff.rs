//! What the policy reconciler decides for the other two controllers, and the channels that carry it: the
//! labeller's inputs and the upgrade controller's pools. Plain data; it imports no controller.

use gpuop_api::upgrade::UpgradePolicy;
use gpuop_api::upgrade::observe::PoolScope;
use tokio::sync::watch;

use crate::labeler::LabelPolicy;

/// Nodes upgraded under one policy.
#[derive(Clone, Debug, PartialEq)]
pub struct UpgradePool {
    /// `ClusterPolicy/<name>` or `NVIDIADriver/<name>`, for logs.
    pub owner: String,
    /// Its nodes and driver DaemonSets.
    pub scope: PoolScope,
    /// The policy; `None` when automatic upgrades are off (the state labels are then removed, as NVIDIA's
    /// operator does, and drivers change only when a person deletes their pods).
    pub policy: Option<UpgradePolicy>,
}

/// What the policy reconciler tells the upgrade controller.
#[derive(Clone, Debug, PartialEq)]
pub enum Upgrades {
    /// The pools of the active ClusterPolicy and its NVIDIADrivers.
    Pools(Vec<UpgradePool>),
    /// No ClusterPolicy is active (it was deleted: the operator is being uninstalled): every node's upgrade
    /// state goes, and nodes the upgrade cordoned are uncordoned ([`gpuop_api::upgrade::release`]).
    NoPolicy,
}

/// What the policy reconciler tells the upgrade controller; `None` until its first pass.
pub type Pools = watch::Sender<Option<Upgrades>>;

/// What the policy reconciler tells the labeller: `None` until its first pass, then the active policy's
/// labelling inputs (`None` with no active policy: every label the operator owns goes).
pub type Labelling = watch::Sender<Option<Option<LabelPolicy>>>;
