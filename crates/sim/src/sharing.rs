//! GPU sharing (time-slicing and MPS) per resource, as NVIDIA's device plugin and GPU feature discovery
//! apply the `sharing` section of their shared configuration file (`api/config/v1` in
//! NVIDIA/k8s-device-plugin):
//!
//! - every resource named in the active section (`sharing.mps` when present, else `sharing.timeSlicing`)
//!   is advertised `replicas` times per device; a resource the section does not name is not shared;
//! - with `renameByDefault: true` a shared resource is advertised as `<resource>.shared`. A per-resource
//!   `rename` (and `devices`) is read and then dropped, as the plugin and GFD drop it since they call
//!   `DisableResourceNamingInConfig` ("Setting the 'rename' field ... is not yet supported");
//! - the strategy is `mps` when the MPS section shares anything, else `time-slicing` when the
//!   time-slicing section does, else `none`;
//! - feature discovery labels each resource under its own (unrenamed) name: `<resource>.replicas`,
//!   `<resource>.sharing-strategy` (the strategy only where that resource has more than one replica) and
//!   `<resource>.product` with `-SHARED` appended where it is shared and not renamed.
//!
//! Pure data and functions: the configuration in, resources and labels out.

use std::collections::BTreeMap;

use gpuop_api::labels::{NVIDIA_PREFIX, RESOURCE_GPU};
use serde::Deserialize;

/// The prefix NVIDIA's configuration puts before a resource name written without one.
const RESOURCE_PREFIX: &str = NVIDIA_PREFIX;

/// The suffix `renameByDefault` gives shared resources.
const SHARED_SUFFIX: &str = ".shared";

/// How devices are shared, as feature discovery labels it (`nvidia.com/gpu.sharing-strategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// Devices are not shared.
    #[default]
    None,
    /// Time-slicing: replicas take turns on the device.
    TimeSlicing,
    /// CUDA MPS: replicas run at once, each with a share of the device.
    Mps,
}

impl Strategy {
    /// The label value: `none`, `time-slicing` or `mps`.
    pub fn label(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::TimeSlicing => "time-slicing",
            Self::Mps => "mps",
        }
    }
}

/// One shared resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared {
    /// How many times each device is advertised (at least 2).
    pub replicas: u32,
    /// The name the replicas are advertised under when not the resource's own (`<resource>.shared`).
    pub renamed: Option<String>,
}

/// The device plugin's sharing, read from its configuration: what is shared, how many times, under which
/// name. The default shares nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sharing {
    /// The strategy in force.
    pub strategy: Strategy,
    /// Shared resources by their own name (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`).
    pub resources: BTreeMap<String, Shared>,
    /// Whether a container asking for more than one replica is refused at admission (MPS's default).
    /// Read, not enforced: the simulator has no `Allocate`.
    pub fail_requests_greater_than_one: bool,
}

/// Why the device plugin would refuse a `sharing` section.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SharingError {
    /// A section lists no resources.
    #[error("sharing.{section}.resources: no resources specified")]
    NoResources {
        /// `timeSlicing` or `mps`.
        section: &'static str,
    },
    /// A resource asks for fewer than two replicas.
    #[error("sharing.{section}.resources[{index}].replicas: {replicas} is below 2, the least that shares")]
    TooFewReplicas {
        /// `timeSlicing` or `mps`.
        section: &'static str,
        /// Position in the list.
        index: usize,
        /// What was written.
        replicas: u32,
    },
    /// A resource has no name.
    #[error(
        "sharing.{section}.resources[{index}].name: missing; a resource name such as {}",
        RESOURCE_GPU
    )]
    NoName {
        /// `timeSlicing` or `mps`.
        section: &'static str,
        /// Position in the list.
        index: usize,
    },
}

/// The `sharing` section of a device plugin configuration file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharingConfig {
    time_slicing: Option<ReplicatedConfig>,
    mps: Option<ReplicatedConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReplicatedConfig {
    #[serde(default)]
    rename_by_default: bool,
    fail_requests_greater_than_one: Option<bool>,
    #[serde(default)]
    resources: Vec<ReplicatedResourceConfig>,
}

#[derive(Debug, Default, Deserialize)]
struct ReplicatedResourceConfig {
    #[serde(default)]
    name: String,
    #[serde(default)]
    replicas: u32,
}

impl ReplicatedConfig {
    fn shares(&self) -> bool {
        self.resources.iter().any(|r| r.replicas > 1)
    }
}

impl Sharing {
    /// Reads a `sharing` section the way the device plugin does, refusing what it refuses.
    pub fn from_config(config: &SharingConfig) -> Result<Self, SharingError> {
        for (section, replicated) in [("timeSlicing", &config.time_slicing), ("mps", &config.mps)] {
            if let Some(replicated) = replicated {
                validate(section, replicated)?;
            }
        }
        let strategy = match (&config.mps, &config.time_slicing) {
            (Some(mps), _) if mps.shares() => Strategy::Mps,
            (_, Some(slicing)) if slicing.shares() => Strategy::TimeSlicing,
            _ => Strategy::None,
        };
        // The plugin takes its replicated resources from the MPS section whenever there is one, shared
        // or not (`Sharing.ReplicatedResources`).
        let (active, mps) = match (&config.mps, &config.time_slicing) {
            (Some(mps), _) => (mps, true),
            (None, Some(slicing)) => (slicing, false),
            (None, None) => return Ok(Self::default()),
        };
        let resources = active
            .resources
            .iter()
            .map(|resource| {
                let name = qualified(&resource.name);
                let renamed = active.rename_by_default.then(|| format!("{name}{SHARED_SUFFIX}"));
                (
                    name,
                    Shared {
                        replicas: resource.replicas,
                        renamed,
                    },
                )
            })
            .collect();
        Ok(Self {
            strategy,
            resources,
            fail_requests_greater_than_one: active.fail_requests_greater_than_one.unwrap_or(mps),
        })
    }

    /// How many times each device of `resource` is advertised: 1 unless the resource is shared.
    pub fn replicas(&self, resource: &str) -> u32 {
        self.resources.get(resource).map_or(1, |shared| shared.replicas)
    }

    /// Whether `resource` is shared and advertised under another name.
    fn renamed(&self, resource: &str) -> bool {
        self.resources
            .get(resource)
            .is_some_and(|shared| shared.renamed.is_some())
    }

    /// The strategy `resource` is shared with: the one in force where the resource has replicas, else
    /// `none`.
    pub fn strategy_of(&self, resource: &str) -> Strategy {
        if self.replicas(resource) > 1 {
            self.strategy
        } else {
            Strategy::None
        }
    }

    /// The resources the device plugin advertises for `devices` (healthy devices per resource name):
    /// each shared resource's devices times its replicas, under its advertised name. A resource with no
    /// devices keeps its own name at 0, as the kubelet keeps a resource whose devices went.
    pub fn advertise(&self, devices: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
        let mut advertised = BTreeMap::new();
        for (resource, count) in devices {
            let name = match self.resources.get(resource) {
                Some(Shared {
                    renamed: Some(renamed),
                    ..
                }) if *count > 0 => renamed.clone(),
                _ => resource.clone(),
            };
            *advertised.entry(name).or_insert(0) += count * u64::from(self.replicas(resource));
        }
        advertised
    }

    /// The product label value for `resource` from its parts (model, then `MIG` and the profile for MIG
    /// devices), with `-SHARED` where the resource is shared under its own name.
    pub fn product(&self, resource: &str, parts: &[&str]) -> String {
        let mut product = parts.join("-");
        if self.replicas(resource) > 1 && !self.renamed(resource) {
            product.push_str("-SHARED");
        }
        product
    }

    /// The labels feature discovery writes for one resource: `<resource>.product`, `.count`,
    /// `.replicas` and `.sharing-strategy`.
    pub fn resource_labels(&self, resource: &str, count: u64, parts: &[&str]) -> BTreeMap<String, String> {
        BTreeMap::from([
            (format!("{resource}.product"), self.product(resource, parts)),
            (format!("{resource}.count"), count.to_string()),
            (
                format!("{resource}.replicas"),
                self.replicas(resource).to_string(),
            ),
            (
                format!("{resource}.sharing-strategy"),
                self.strategy_of(resource).label().to_owned(),
            ),
        ])
    }
}

/// The labels feature discovery writes for a resource it labels "without sharing" (full GPUs that have
/// MIG enabled): replicas 0, strategy `none`, no `-SHARED`, whatever the configuration says.
pub fn unshared_resource_labels(resource: &str, count: u64, parts: &[&str]) -> BTreeMap<String, String> {
    let mut labels = Sharing::default().resource_labels(resource, count, parts);
    labels.insert(format!("{resource}.replicas"), "0".to_owned());
    labels
}

fn qualified(name: &str) -> String {
    if name.starts_with(RESOURCE_PREFIX) {
        name.to_owned()
    } else {
        format!("{RESOURCE_PREFIX}{name}")
    }
}

fn validate(section: &'static str, replicated: &ReplicatedConfig) -> Result<(), SharingError> {
    if replicated.resources.is_empty() {
        return Err(SharingError::NoResources { section });
    }
    for (index, resource) in replicated.resources.iter().enumerate() {
        if resource.name.is_empty() {
            return Err(SharingError::NoName { section, index });
        }
        if resource.replicas < 2 {
            return Err(SharingError::TooFewReplicas {
                section,
                index,
                replicas: resource.replicas,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_api::labels::RESOURCE_GPU;

    fn sharing(yaml: &str) -> Result<Sharing, SharingError> {
        let config: SharingConfig = serde_saphyr::from_str(yaml).expect("the section parses");
        Sharing::from_config(&config)
    }

    /// The sharing section of `deploy/samples/clusterpolicy-mig-mixed-time-slicing.yaml`.
    const MIXED: &str = "timeSlicing:
  renameByDefault: false
  resources:
    - name: nvidia.com/gpu
      replicas: 4
    - name: nvidia.com/mig-1g.10gb
      replicas: 2
    - name: nvidia.com/mig-2g.20gb
      replicas: 4
";

    fn devices(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn each_resource_is_replicated_by_its_own_count() {
        let sharing = sharing(MIXED).unwrap();
        assert_eq!(sharing.strategy, Strategy::TimeSlicing);
        let advertised = sharing.advertise(&devices(&[
            ("nvidia.com/gpu", 0),
            ("nvidia.com/mig-1g.10gb", 56),
            ("nvidia.com/mig-3g.40gb", 2),
        ]));
        assert_eq!(
            advertised,
            devices(&[
                ("nvidia.com/gpu", 0),
                ("nvidia.com/mig-1g.10gb", 112),
                ("nvidia.com/mig-3g.40gb", 2),
            ]),
            "1g.10gb twice, 3g.40gb (not listed) once, not all by the largest count"
        );
        assert_eq!(
            sharing.advertise(&devices(&[("nvidia.com/gpu", 8)])),
            devices(&[("nvidia.com/gpu", 32)])
        );
    }

    #[test]
    fn rename_by_default_advertises_shared_resources_as_dot_shared() {
        let sharing = sharing(
            "timeSlicing:
  renameByDefault: true
  resources:
    - {name: gpu, replicas: 3}
    - {name: nvidia.com/mig-1g.10gb, replicas: 2, rename: my-slices}
",
        )
        .unwrap();
        assert_eq!(
            sharing.advertise(&devices(&[
                ("nvidia.com/gpu", 8),
                ("nvidia.com/mig-1g.10gb", 7),
                ("nvidia.com/mig-2g.20gb", 3),
            ])),
            devices(&[
                ("nvidia.com/gpu.shared", 24),
                ("nvidia.com/mig-1g.10gb.shared", 14),
                ("nvidia.com/mig-2g.20gb", 3),
            ]),
            "a name without prefix gets nvidia.com/; an explicit rename is dropped, as the plugin drops it"
        );
        assert_eq!(
            sharing.product("nvidia.com/gpu", &["NVIDIA-H100-80GB-HBM3"]),
            "NVIDIA-H100-80GB-HBM3",
            "a renamed resource carries no -SHARED"
        );
        let explicit_only = sharing_of_rename_without_default();
        assert_eq!(
            explicit_only.advertise(&devices(&[("nvidia.com/gpu", 2)])),
            devices(&[("nvidia.com/gpu", 4)]),
            "without renameByDefault a rename is ignored"
        );
    }

    fn sharing_of_rename_without_default() -> Sharing {
        sharing("timeSlicing:\n  resources:\n    - {name: nvidia.com/gpu, replicas: 2, rename: gpu-half}\n")
            .unwrap()
    }

    #[test]
    fn feature_discovery_labels_each_resource_by_its_own_sharing() {
        let sharing = sharing(MIXED).unwrap();
        let mig = sharing.resource_labels(
            "nvidia.com/mig-1g.10gb",
            56,
            &["NVIDIA-A100-SXM4-80GB", "MIG", "1g.10gb"],
        );
        assert_eq!(mig["nvidia.com/mig-1g.10gb.replicas"], "2");
        assert_eq!(
            mig["nvidia.com/mig-1g.10gb.product"],
            "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED"
        );
        assert_eq!(mig["nvidia.com/mig-1g.10gb.sharing-strategy"], "time-slicing");
        assert_eq!(mig["nvidia.com/mig-1g.10gb.count"], "56");
        let unlisted = sharing.resource_labels(
            "nvidia.com/mig-3g.40gb",
            2,
            &["NVIDIA-A100-SXM4-80GB", "MIG", "3g.40gb"],
        );
        assert_eq!(unlisted["nvidia.com/mig-3g.40gb.replicas"], "1");
        assert_eq!(unlisted["nvidia.com/mig-3g.40gb.sharing-strategy"], "none");
        assert_eq!(
            unlisted["nvidia.com/mig-3g.40gb.product"],
            "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"
        );
        let gpu = sharing.resource_labels(RESOURCE_GPU, 8, &["NVIDIA-H100-80GB-HBM3"]);
        assert_eq!(gpu["nvidia.com/gpu.replicas"], "4");
        assert_eq!(gpu["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3-SHARED");
        let unshared = unshared_resource_labels(RESOURCE_GPU, 8, &["NVIDIA-A100-SXM4-80GB"]);
        assert_eq!(unshared["nvidia.com/gpu.replicas"], "0");
        assert_eq!(unshared["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
    }

    #[test]
    fn mps_wins_and_refuses_requests_for_more_than_one_by_default() {
        let both = sharing(
            "timeSlicing:\n  resources: [{name: nvidia.com/gpu, replicas: 4}]\nmps:\n  resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
        )
        .unwrap();
        assert_eq!(both.strategy, Strategy::Mps);
        assert_eq!(both.replicas("nvidia.com/gpu"), 2);
        assert!(both.fail_requests_greater_than_one);
        let slicing = sharing(
            "timeSlicing:\n  failRequestsGreaterThanOne: true\n  resources: [{name: nvidia.com/gpu, replicas: 4}]\n",
        )
        .unwrap();
        assert!(slicing.fail_requests_greater_than_one);
        assert!(!sharing(MIXED).unwrap().fail_requests_greater_than_one);
        assert_eq!(sharing("{}").unwrap(), Sharing::default());
    }

    #[test]
    fn what_the_plugin_refuses_is_refused_with_the_field() {
        let error =
            sharing("timeSlicing:\n  resources: [{name: nvidia.com/gpu, replicas: 1}]\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "sharing.timeSlicing.resources[0].replicas: 1 is below 2, the least that shares"
        );
        assert!(matches!(
            sharing("mps:\n  resources: []\n"),
            Err(SharingError::NoResources { section: "mps" })
        ));
    }
}
