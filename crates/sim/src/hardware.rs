//! GPU models the simulator knows, with what feature discovery, the device plugin and the MIG manager
//! need of them: product name as NVML reports it (sanitised the way feature discovery labels it), memory,
//! architecture family, PCI device id, and the MIG profiles of MIG-capable parts.
//!
//! Figures come from the reference notes (`operands.md` §2.2 and §4.6); MIG geometry is the common
//! 7-compute / 8-memory slice layout of these parts.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use gpuop_api::labels::RESOURCE_MIG_PREFIX;
use serde::{Deserialize, Serialize};

/// A GPU model a simulated node can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum GpuModel {
    /// NVIDIA A100 SXM4 40 GB.
    #[serde(rename = "A100-40GB")]
    A100_40GB,
    /// NVIDIA A100 SXM4 80 GB.
    #[serde(rename = "A100-80GB")]
    A100_80GB,
    /// NVIDIA H100 80 GB HBM3.
    #[serde(rename = "H100-80GB")]
    H100_80GB,
    /// NVIDIA H200 141 GB.
    #[serde(rename = "H200-141GB")]
    H200_141GB,
    /// NVIDIA L4.
    L4,
    /// Tesla T4.
    T4,
}

/// One MIG profile of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigProfile {
    /// Profile name, e.g. `1g.10gb`.
    pub name: &'static str,
    /// Compute slices it takes (of 7).
    pub compute_slices: u8,
    /// Memory slices it takes (of 8).
    pub memory_slices: u8,
    /// Most instances of it on one GPU.
    pub max: u8,
    /// Memory of one instance in MiB.
    pub memory_mib: u32,
}

const fn profile(
    name: &'static str,
    compute_slices: u8,
    memory_slices: u8,
    max: u8,
    memory_mib: u32,
) -> MigProfile {
    MigProfile {
        name,
        compute_slices,
        memory_slices,
        max,
        memory_mib,
    }
}

const A100_40GB_PROFILES: &[MigProfile] = &[
    profile("1g.5gb", 1, 1, 7, 4864),
    profile("1g.5gb+me", 1, 1, 1, 4864),
    profile("1g.10gb", 1, 2, 4, 9856),
    profile("2g.10gb", 2, 2, 3, 9856),
    profile("3g.20gb", 3, 4, 2, 19968),
    profile("4g.20gb", 4, 4, 1, 19968),
    profile("7g.40gb", 7, 8, 1, 40192),
];

const GB80_PROFILES: &[MigProfile] = &[
    profile("1g.10gb", 1, 1, 7, 9856),
    profile("1g.10gb+me", 1, 1, 1, 9856),
    profile("1g.20gb", 1, 2, 4, 19968),
    profile("2g.20gb", 2, 2, 3, 19968),
    profile("3g.40gb", 3, 4, 2, 40192),
    profile("4g.40gb", 4, 4, 1, 40192),
    profile("7g.80gb", 7, 8, 1, 80384),
];

const H200_PROFILES: &[MigProfile] = &[
    profile("1g.18gb", 1, 1, 7, 16384),
    profile("1g.18gb+me", 1, 1, 1, 16384),
    profile("1g.35gb", 1, 2, 4, 33024),
    profile("2g.35gb", 2, 2, 3, 33024),
    profile("3g.71gb", 3, 4, 2, 71168),
    profile("4g.71gb", 4, 4, 1, 71168),
    profile("7g.141gb", 7, 8, 1, 144384),
];

impl GpuModel {
    /// Every model, in the order the cluster spec lists them.
    pub const ALL: &'static [GpuModel] = &[
        Self::A100_40GB,
        Self::A100_80GB,
        Self::H100_80GB,
        Self::H200_141GB,
        Self::L4,
        Self::T4,
    ];

    /// The name used in cluster specs, e.g. `A100-80GB`.
    pub fn spec_name(self) -> &'static str {
        match self {
            Self::A100_40GB => "A100-40GB",
            Self::A100_80GB => "A100-80GB",
            Self::H100_80GB => "H100-80GB",
            Self::H200_141GB => "H200-141GB",
            Self::L4 => "L4",
            Self::T4 => "T4",
        }
    }

    /// `nvidia.com/gpu.product` as feature discovery writes it.
    pub fn product(self) -> &'static str {
        match self {
            Self::A100_40GB => "NVIDIA-A100-SXM4-40GB",
            Self::A100_80GB => "NVIDIA-A100-SXM4-80GB",
            Self::H100_80GB => "NVIDIA-H100-80GB-HBM3",
            Self::H200_141GB => "NVIDIA-H200",
            Self::L4 => "NVIDIA-L4",
            Self::T4 => "Tesla-T4",
        }
    }

    /// Memory of one GPU in MiB (`nvidia.com/gpu.memory`).
    pub fn memory_mib(self) -> u32 {
        match self {
            Self::A100_40GB => 40960,
            Self::A100_80GB => 81920,
            Self::H100_80GB => 81559,
            Self::H200_141GB => 143771,
            Self::L4 => 23034,
            Self::T4 => 15360,
        }
    }

    /// Architecture family (`nvidia.com/gpu.family`).
    pub fn family(self) -> &'static str {
        match self {
            Self::A100_40GB | Self::A100_80GB => "ampere",
            Self::H100_80GB | Self::H200_141GB => "hopper",
            Self::L4 => "ada-lovelace",
            Self::T4 => "turing",
        }
    }

    /// CUDA compute capability.
    pub fn compute_capability(self) -> (u8, u8) {
        match self {
            Self::A100_40GB | Self::A100_80GB => (8, 0),
            Self::H100_80GB | Self::H200_141GB => (9, 0),
            Self::L4 => (8, 9),
            Self::T4 => (7, 5),
        }
    }

    /// PCI device id with the vendor, as MIG configurations' `device-filter` writes it.
    pub fn pci_device_id(self) -> &'static str {
        match self {
            Self::A100_40GB => "0x20B010DE",
            Self::A100_80GB => "0x20B210DE",
            Self::H100_80GB => "0x233010DE",
            Self::H200_141GB => "0x233510DE",
            Self::L4 => "0x27B810DE",
            Self::T4 => "0x1EB810DE",
        }
    }

    /// The server this part ships in, as the simulator models it: Intel Sapphire Rapids hosts for Hopper
    /// (as in DGX H100/H200 and the clouds' H100 and H200 bare-metal shapes), Ice Lake for the rest. (Many
    /// A100 servers carry AMD CPUs; the simulator gives every host an Intel Xeon, which is what the labels
    /// the operator reads have always said.)
    pub fn host_cpu(self) -> HostCpu {
        match self {
            Self::H100_80GB | Self::H200_141GB => HostCpu::SapphireRapids,
            Self::A100_40GB | Self::A100_80GB | Self::L4 | Self::T4 => HostCpu::IceLake,
        }
    }

    /// The instance type (`node.kubernetes.io/instance-type`) of a bare-metal server with `count` of these,
    /// in Oracle Cloud's shape naming: `BM.GPU.H100.8`.
    pub fn instance_type(self, count: u32) -> String {
        let part = match self {
            Self::A100_40GB => "A100-v1",
            Self::A100_80GB => "A100-v2",
            Self::H100_80GB => "H100",
            Self::H200_141GB => "H200",
            Self::L4 => "L4",
            Self::T4 => "T4",
        };
        format!("BM.GPU.{part}.{count}")
    }

    /// MIG profiles, empty for parts without MIG.
    pub fn mig_profiles(self) -> &'static [MigProfile] {
        match self {
            Self::A100_40GB => A100_40GB_PROFILES,
            Self::A100_80GB | Self::H100_80GB => GB80_PROFILES,
            Self::H200_141GB => H200_PROFILES,
            Self::L4 | Self::T4 => &[],
        }
    }

    /// Whether the part supports MIG.
    pub fn mig_capable(self) -> bool {
        !self.mig_profiles().is_empty()
    }

    /// Whether a set of MIG instances (profile name → count) fits on one GPU of this model.
    pub fn fits(self, instances: &BTreeMap<String, u32>) -> Result<(), String> {
        let (mut compute, mut memory) = (0u32, 0u32);
        for (name, count) in instances {
            let profile = self
                .mig_profiles()
                .iter()
                .find(|p| p.name == name)
                .ok_or_else(|| format!("{} has no MIG profile {name}", self.spec_name()))?;
            if *count > u32::from(profile.max) {
                return Err(format!(
                    "{} fits at most {} × {name}, not {count}",
                    self.spec_name(),
                    profile.max
                ));
            }
            compute += u32::from(profile.compute_slices) * count;
            memory += u32::from(profile.memory_slices) * count;
        }
        if compute > 7 || memory > 8 {
            return Err(format!(
                "the instances need {compute} compute and {memory} memory slices; a {} has 7 and 8",
                self.spec_name()
            ));
        }
        Ok(())
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.spec_name())
    }
}

impl FromStr for GpuModel {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|model| model.spec_name() == text)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|m| m.spec_name()).collect();
                format!("unknown GPU model {text:?}; known models: {}", known.join(", "))
            })
    }
}

/// The CPU generation of a simulated node's host: what feature discovery's `cpu-cpuid.*` and `cpu-model.*`
/// labels say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCpu {
    /// 3rd-generation Xeon Scalable (family 6, model 106).
    IceLake,
    /// 4th-generation Xeon Scalable (family 6, model 143): AMX, AVX-512 FP16.
    SapphireRapids,
}

impl HostCpu {
    /// `cpu-model.id`, the model number in CPUID (family 6 for both).
    pub fn model_id(self) -> u32 {
        match self {
            Self::IceLake => 106,
            Self::SapphireRapids => 143,
        }
    }
}

/// The MIG resource name of a profile under the mixed strategy: `nvidia.com/mig-1g.10gb`, `+` becoming `.`.
pub fn mig_resource(profile: &str) -> String {
    format!("{RESOURCE_MIG_PREFIX}{}", profile.replace('+', "."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn nvidias_default_layouts_fit_and_overcommitment_does_not() {
        for model in [GpuModel::A100_80GB, GpuModel::H100_80GB] {
            assert_eq!(model.fits(&layout(&[("1g.10gb", 7)])), Ok(()));
            assert_eq!(
                model.fits(&layout(&[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)])),
                Ok(()),
                "all-balanced"
            );
            assert_eq!(model.fits(&layout(&[("3g.40gb", 2)])), Ok(()));
            assert_eq!(model.fits(&layout(&[("7g.80gb", 1)])), Ok(()));
            assert!(model.fits(&layout(&[("1g.10gb", 8)])).is_err());
            assert!(model.fits(&layout(&[("3g.40gb", 2), ("1g.20gb", 1)])).is_err());
        }
        assert_eq!(
            GpuModel::A100_40GB.fits(&layout(&[("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)])),
            Ok(())
        );
        assert_eq!(GpuModel::H200_141GB.fits(&layout(&[("1g.18gb", 7)])), Ok(()));
        let wrong = GpuModel::A100_40GB.fits(&layout(&[("1g.10gb", 7)])).unwrap_err();
        assert_eq!(wrong, "A100-40GB fits at most 4 × 1g.10gb, not 7");
        assert!(
            GpuModel::L4
                .fits(&layout(&[("1g.10gb", 1)]))
                .unwrap_err()
                .contains("no MIG profile")
        );
    }

    #[test]
    fn names_parse_and_print() {
        for model in GpuModel::ALL {
            assert_eq!(model.spec_name().parse::<GpuModel>(), Ok(*model));
        }
        assert!(
            "B200"
                .parse::<GpuModel>()
                .unwrap_err()
                .contains("known models: A100-40GB")
        );
        assert_eq!(mig_resource("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
        assert!(GpuModel::H100_80GB.mig_capable() && !GpuModel::T4.mig_capable());
    }
}
