//! String-valued enumerations of the CRDs (`mig.strategy`, `daemonsets.updateStrategy`, ...).
//!
//! The CRD fields stay `Option<String>` so that a policy with a wrong value still parses and
//! [`validate`](crate::validate()) can name the field, the value and what is accepted. Each enumeration is
//! declared once with [`choices!`]; the declaration gives the typed value, the accepted strings and the CRD
//! schema, so the three cannot drift apart.

/// Declares a string enumeration: the enum, its accepted values, parsing and the CRD schema function.
macro_rules! choices {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every value, in the order the CRD lists them.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];
            /// The accepted strings, in the order the CRD lists them.
            pub const VALUES: &'static [&'static str] = &[$($value),+];

            /// The string the CRD uses for this value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $value),+
                }
            }

            /// The value for an accepted string.
            pub fn parse(value: &str) -> Option<Self> {
                match value {
                    $($value => Some(Self::$variant),)+
                    _ => None,
                }
            }

            /// CRD schema of a field holding this enumeration.
            pub fn schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "enum": Self::VALUES })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

choices! {
    /// How MIG devices are advertised (`spec.mig.strategy`).
    pub enum MigStrategy {
        /// MIG devices are not advertised; whole GPUs are.
        None = "none",
        /// All GPUs on a node use the same MIG layout and are advertised as `nvidia.com/gpu`.
        Single = "single",
        /// Each MIG profile is its own resource, `nvidia.com/mig-<profile>`.
        Mixed = "mixed",
    }
}

choices! {
    /// How operand DaemonSets roll out changes (`spec.daemonsets.updateStrategy`).
    pub enum UpdateStrategy {
        /// Pods are replaced automatically, `maxUnavailable` at a time.
        RollingUpdate = "RollingUpdate",
        /// Pods are replaced only when deleted.
        OnDelete = "OnDelete",
    }
}

choices! {
    /// What a GPU node is used for (`nvidia.com/gpu.workload.config`, `spec.sandboxWorkloads.defaultWorkload`).
    pub enum WorkloadConfig {
        /// Containers use the GPUs.
        Container = "container",
        /// GPUs are passed through to virtual machines.
        VmPassthrough = "vm-passthrough",
        /// GPUs are shared with virtual machines as vGPUs.
        VmVgpu = "vm-vgpu",
    }
}

choices! {
    /// Which virtualisation stack runs sandboxed workloads (`spec.sandboxWorkloads.mode`).
    pub enum SandboxMode {
        /// KubeVirt virtual machines.
        KubeVirt = "kubevirt",
        /// Kata containers.
        Kata = "kata",
    }
}

choices! {
    /// Which NVIDIA kernel modules the driver container loads (`spec.driver.kernelModuleType`).
    pub enum KernelModuleType {
        /// The driver container picks the flavour the GPU supports.
        Auto = "auto",
        /// The open GPU kernel modules.
        Open = "open",
        /// The proprietary kernel modules.
        Proprietary = "proprietary",
    }
}

choices! {
    /// Confidential-computing mode set on GPUs by the CC manager (`spec.ccManager.defaultMode`).
    pub enum CcMode {
        /// Confidential computing on.
        On = "on",
        /// Confidential computing off.
        Off = "off",
        /// Developer tools mode.
        DevTools = "devtools",
    }
}

choices! {
    /// MIG layout the operator stamps on MIG-capable nodes (`spec.migManager.config.default`).
    pub enum MigDefault {
        /// Label MIG-capable nodes `nvidia.com/mig.config=all-disabled`.
        AllDisabled = "all-disabled",
        /// Leave `nvidia.com/mig.config` alone.
        Unset = "",
    }
}

choices! {
    /// Kind of driver an NVIDIADriver installs (`spec.driverType`).
    pub enum DriverType {
        /// The data-centre GPU driver.
        Gpu = "gpu",
        /// The vGPU guest driver.
        Vgpu = "vgpu",
        /// The vGPU host manager.
        VgpuHostManager = "vgpu-host-manager",
    }
}

choices! {
    /// Relabelling actions of a Prometheus ServiceMonitor.
    pub enum RelabelAction {
        /// Replace (lower case).
        ReplaceLower = "replace",
        /// Replace.
        Replace = "Replace",
        /// Keep (lower case).
        KeepLower = "keep",
        /// Keep.
        Keep = "Keep",
        /// Drop (lower case).
        DropLower = "drop",
        /// Drop.
        Drop = "Drop",
        /// HashMod (lower case).
        HashModLower = "hashmod",
        /// HashMod.
        HashMod = "HashMod",
        /// LabelMap (lower case).
        LabelMapLower = "labelmap",
        /// LabelMap.
        LabelMap = "LabelMap",
        /// LabelDrop (lower case).
        LabelDropLower = "labeldrop",
        /// LabelDrop.
        LabelDrop = "LabelDrop",
        /// LabelKeep (lower case).
        LabelKeepLower = "labelkeep",
        /// LabelKeep.
        LabelKeep = "LabelKeep",
        /// Lowercase (lower case).
        LowercaseLower = "lowercase",
        /// Lowercase.
        Lowercase = "Lowercase",
        /// Uppercase (lower case).
        UppercaseLower = "uppercase",
        /// Uppercase.
        Uppercase = "Uppercase",
        /// KeepEqual (lower case).
        KeepEqualLower = "keepequal",
        /// KeepEqual.
        KeepEqual = "KeepEqual",
        /// DropEqual (lower case).
        DropEqualLower = "dropequal",
        /// DropEqual.
        DropEqual = "DropEqual",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_parse() {
        for strategy in MigStrategy::ALL {
            assert_eq!(MigStrategy::parse(strategy.as_str()), Some(*strategy));
        }
        assert_eq!(MigStrategy::parse("double"), None);
        assert_eq!(MigStrategy::VALUES, &["none", "single", "mixed"]);
        assert_eq!(MigDefault::parse(""), Some(MigDefault::Unset));
    }

    #[test]
    fn schema_lists_the_accepted_values() {
        let mut generator = schemars::SchemaGenerator::default();
        let schema = UpdateStrategy::schema(&mut generator);
        assert_eq!(
            schema.as_value(),
            &serde_json::json!({ "type": "string", "enum": ["RollingUpdate", "OnDelete"] })
        );
    }
}
