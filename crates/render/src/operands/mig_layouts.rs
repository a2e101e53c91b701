//! The MIG layouts of the default `default-mig-parted-config` ConfigMap: the layout names users put in
//! `nvidia.com/mig.config` (`all-disabled`, `all-balanced`, `all-1g.10gb`, ...) and, per GPU model (PCI
//! device id, `0xDDDDVVVV`), the MIG devices each creates. A layout whose entries are all filtered applies
//! only to those models; mig-parted skips entries whose filter does not match the GPU.
//!
//! This is hardware data: the profiles each GPU supports. Nodes that need other layouts use a ConfigMap of
//! their own (`migManager.config.name`).

/// One entry of a layout: GPUs it applies to (all when empty) and the MIG devices per GPU. An entry with
/// no devices and `enabled: false` turns MIG off.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayoutEntry {
    /// PCI device ids the entry is limited to.
    pub filter: &'static [&'static str],
    /// Whether MIG is on.
    pub enabled: bool,
    /// MIG profile and count per GPU.
    pub devices: &'static [(&'static str, u32)],
}

/// Every layout, in the order they are listed.
pub(crate) const LAYOUTS: &[(&str, &[LayoutEntry])] = &[
    (
        "all-disabled",
        &[LayoutEntry {
            filter: &[],
            enabled: false,
            devices: &[],
        }],
    ),
    (
        "all-enabled",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[],
        }],
    ),
    (
        "all-1g.5gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.5gb", 7)],
        }],
    ),
    (
        "all-1g.5gb.me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.5gb+me", 1)],
        }],
    ),
    (
        "all-2g.10gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.10gb", 3)],
        }],
    ),
    (
        "all-3g.20gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.20gb", 2)],
        }],
    ),
    (
        "all-4g.20gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.20gb", 1)],
        }],
    ),
    (
        "all-7g.40gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.40gb", 1)],
        }],
    ),
    (
        "all-1g.24gb.gfx",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.24gb+gfx", 4)],
        }],
    ),
    (
        "all-1g.24gb.me.all",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.24gb+me.all", 1)],
        }],
    ),
    (
        "all-1g.24gb-me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.24gb-me", 4)],
        }],
    ),
    (
        "all-2g.48gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.48gb", 2)],
        }],
    ),
    (
        "all-2g.48gb.gfx",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.48gb+gfx", 2)],
        }],
    ),
    (
        "all-2g.48gb.me.all",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.48gb+me.all", 1)],
        }],
    ),
    (
        "all-2g.48gb-me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.48gb-me", 2)],
        }],
    ),
    (
        "all-4g.96gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.96gb", 1)],
        }],
    ),
    (
        "all-4g.96gb.gfx",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.96gb+gfx", 1)],
        }],
    ),
    (
        "all-1g.10gb",
        &[
            LayoutEntry {
                filter: &[
                    "0x233010DE",
                    "0x233110DE",
                    "0x232210DE",
                    "0x20B210DE",
                    "0x20B510DE",
                    "0x20F310DE",
                    "0x20F510DE",
                    "0x232410DE",
                ],
                enabled: true,
                devices: &[("1g.10gb", 7)],
            },
            LayoutEntry {
                filter: &["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"],
                enabled: true,
                devices: &[("1g.10gb", 4)],
            },
        ],
    ),
    (
        "all-1g.10gb.me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.10gb+me", 1)],
        }],
    ),
    (
        "all-1g.20gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.20gb", 4)],
        }],
    ),
    (
        "all-1g.23gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.23gb", 7)],
        }],
    ),
    (
        "all-1g.23gb.me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.23gb+me", 1)],
        }],
    ),
    (
        "all-1g.24gb.me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.24gb+me", 1)],
        }],
    ),
    (
        "all-2g.20gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.20gb", 3)],
        }],
    ),
    (
        "all-3g.40gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.40gb", 2)],
        }],
    ),
    (
        "all-4g.40gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.40gb", 1)],
        }],
    ),
    (
        "all-7g.80gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.80gb", 1)],
        }],
    ),
    (
        "all-1g.6gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.6gb", 4)],
        }],
    ),
    (
        "all-1g.6gb.me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.6gb+me", 1)],
        }],
    ),
    (
        "all-2g.12gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.12gb", 2)],
        }],
    ),
    (
        "all-2g.12gb.me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.12gb+me", 1)],
        }],
    ),
    (
        "all-4g.24gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.24gb", 1)],
        }],
    ),
    (
        "all-1g.12gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.12gb", 7)],
        }],
    ),
    (
        "all-1g.12gb.me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.12gb+me", 1)],
        }],
    ),
    (
        "all-1g.24gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.24gb", 4)],
        }],
    ),
    (
        "all-1g.45gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.45gb", 4)],
        }],
    ),
    (
        "all-1g.47gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.47gb", 4)],
        }],
    ),
    (
        "all-2g.24gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.24gb", 3)],
        }],
    ),
    (
        "all-2g.45gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.45gb", 3)],
        }],
    ),
    (
        "all-2g.47gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.47gb", 3)],
        }],
    ),
    (
        "all-3g.47gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.47gb", 2)],
        }],
    ),
    (
        "all-4g.47gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.47gb", 1)],
        }],
    ),
    (
        "all-7g.94gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.94gb", 1)],
        }],
    ),
    (
        "all-3g.48gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.48gb", 2)],
        }],
    ),
    (
        "all-3g.90gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.90gb", 2)],
        }],
    ),
    (
        "all-3g.93gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.93gb", 2)],
        }],
    ),
    (
        "all-3g.95gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.95gb", 2)],
        }],
    ),
    (
        "all-4g.48gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.48gb", 1)],
        }],
    ),
    (
        "all-4g.90gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.90gb", 1)],
        }],
    ),
    (
        "all-4g.93gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.93gb", 1)],
        }],
    ),
    (
        "all-4g.95gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.95gb", 1)],
        }],
    ),
    (
        "all-7g.96gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.96gb", 1)],
        }],
    ),
    (
        "all-7g.180gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.180gb", 1)],
        }],
    ),
    (
        "all-7g.186gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.186gb", 1)],
        }],
    ),
    (
        "all-7g.189gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.189gb", 1)],
        }],
    ),
    (
        "all-balanced",
        &[
            LayoutEntry {
                filter: &["0x294110DE"],
                enabled: true,
                devices: &[("1g.23gb", 2), ("2g.47gb", 1), ("3g.93gb", 1)],
            },
            LayoutEntry {
                filter: &["0x2BB510DE"],
                enabled: true,
                devices: &[("1g.24gb", 2), ("2g.48gb", 1)],
            },
            LayoutEntry {
                filter: &["0x290110DE"],
                enabled: true,
                devices: &[("1g.23gb", 2), ("2g.45gb", 1), ("3g.90gb", 1)],
            },
            LayoutEntry {
                filter: &["0x234810DE"],
                enabled: true,
                devices: &[("1g.18gb", 2), ("2g.36gb", 1), ("3g.72gb", 1)],
            },
            LayoutEntry {
                filter: &["0x233510DE", "0x233B10DE"],
                enabled: true,
                devices: &[("1g.18gb", 2), ("2g.35gb", 1), ("3g.71gb", 1)],
            },
            LayoutEntry {
                filter: &["0x232110DE", "0x233A10DE"],
                enabled: true,
                devices: &[("1g.12gb", 2), ("2g.24gb", 1), ("3g.47gb", 1)],
            },
            LayoutEntry {
                filter: &[
                    "0x233010DE",
                    "0x233110DE",
                    "0x232210DE",
                    "0x20B210DE",
                    "0x20B510DE",
                    "0x20F310DE",
                    "0x20F510DE",
                    "0x232410DE",
                ],
                enabled: true,
                devices: &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
            },
            LayoutEntry {
                filter: &["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"],
                enabled: true,
                devices: &[("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)],
            },
            LayoutEntry {
                filter: &["0x20B710DE"],
                enabled: true,
                devices: &[("1g.6gb", 2), ("2g.12gb", 1)],
            },
            LayoutEntry {
                filter: &["0x234210DE", "0x233D10DE", "0x20B610DE", "0x232910DE"],
                enabled: true,
                devices: &[("1g.12gb", 2), ("2g.24gb", 1), ("3g.48gb", 1)],
            },
            LayoutEntry {
                filter: &["0x318210DE"],
                enabled: true,
                devices: &[("1g.34gb", 2), ("2g.67gb", 1), ("3g.135gb", 1)],
            },
            LayoutEntry {
                filter: &["0x31C210DE"],
                enabled: true,
                devices: &[("1g.35gb", 2), ("2g.70gb", 1), ("3g.139gb", 1)],
            },
        ],
    ),
    (
        "all-1g.18gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.18gb", 7)],
        }],
    ),
    (
        "all-1g.18gb.me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.18gb+me", 1)],
        }],
    ),
    (
        "all-1g.35gb",
        &[
            LayoutEntry {
                filter: &["0x233510DE"],
                enabled: true,
                devices: &[("1g.35gb", 4)],
            },
            LayoutEntry {
                filter: &["0x31C210DE"],
                enabled: true,
                devices: &[("1g.35gb", 7)],
            },
        ],
    ),
    (
        "all-2g.35gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.35gb", 3)],
        }],
    ),
    (
        "all-3g.71gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.71gb", 2)],
        }],
    ),
    (
        "all-4g.71gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.71gb", 1)],
        }],
    ),
    (
        "all-7g.141gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.141gb", 1)],
        }],
    ),
    (
        "all-1g.36gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.36gb", 4)],
        }],
    ),
    (
        "all-2g.36gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.36gb", 3)],
        }],
    ),
    (
        "all-3g.72gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.72gb", 2)],
        }],
    ),
    (
        "all-4g.72gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.72gb", 1)],
        }],
    ),
    (
        "all-7g.144gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.144gb", 1)],
        }],
    ),
    (
        "all-1g.34gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.34gb", 7)],
        }],
    ),
    (
        "all-1g.34gb.me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.34gb+me", 1)],
        }],
    ),
    (
        "all-1g.67gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.67gb", 4)],
        }],
    ),
    (
        "all-2g.67gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.67gb", 3)],
        }],
    ),
    (
        "all-3g.135gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.135gb", 2)],
        }],
    ),
    (
        "all-4g.135gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.135gb", 1)],
        }],
    ),
    (
        "all-7g.269gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.269gb", 1)],
        }],
    ),
    (
        "all-1g.35gb.me",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.35gb+me", 1)],
        }],
    ),
    (
        "all-1g.70gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("1g.70gb", 4)],
        }],
    ),
    (
        "all-2g.70gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("2g.70gb", 3)],
        }],
    ),
    (
        "all-3g.139gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("3g.139gb", 2)],
        }],
    ),
    (
        "all-4g.139gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("4g.139gb", 1)],
        }],
    ),
    (
        "all-7g.278gb",
        &[LayoutEntry {
            filter: &[],
            enabled: true,
            devices: &[("7g.278gb", 1)],
        }],
    ),
];
