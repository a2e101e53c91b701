//! `gpu-operator render`: the objects the operator would create for a ClusterPolicy, printed as YAML.

use std::path::Path;

use gpuop_api::ClusterPolicy;
use gpuop_api::validate::{ImageDefaults, validate_with};
use gpuop_render::{ClusterFacts, ContainerRuntime, OsPool, render};

/// Why nothing could be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderCommandError {
    /// A file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The policy or facts file does not parse.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The policy is invalid.
    #[error("{path}: the ClusterPolicy is invalid:\n{problems}")]
    Invalid {
        /// The file.
        path: String,
        /// One problem per line.
        problems: String,
    },
    /// Rendering failed for these facts.
    #[error("{0}")]
    Render(#[from] gpuop_render::RenderError),
}

/// The facts used when none are given: one pool of Ubuntu 22.04 GPU nodes on containerd.
pub fn default_facts() -> ClusterFacts {
    ClusterFacts {
        namespace: "gpu-operator".into(),
        runtime: ContainerRuntime::Containerd,
        driver_pools: vec![OsPool {
            os_id: "ubuntu".into(),
            os_version: "22.04".into(),
            kernel: None,
        }],
        service_monitor_crd: false,
        config_map_keys: Default::default(),
    }
}

/// Renders the policy in `file` for the facts in `facts` (or the defaults) as multi-document YAML.
pub fn render_files(
    file: &Path,
    facts: Option<&Path>,
    defaults: &ImageDefaults,
) -> Result<String, RenderCommandError> {
    let read = |path: &Path| -> Result<String, RenderCommandError> {
        if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|source| {
                RenderCommandError::Read {
                    path: "-".into(),
                    source,
                }
            })?;
            Ok(text)
        } else {
            std::fs::read_to_string(path).map_err(|source| RenderCommandError::Read {
                path: path.display().to_string(),
                source,
            })
        }
    };
    let policy_path = file.display().to_string();
    let policy: ClusterPolicy =
        serde_saphyr::from_str(&read(file)?).map_err(|error| RenderCommandError::Parse {
            path: policy_path.clone(),
            message: error.to_string(),
        })?;
    let facts = match facts {
        Some(path) => serde_saphyr::from_str(&read(path)?).map_err(|error| RenderCommandError::Parse {
            path: path.display().to_string(),
            message: error.to_string(),
        })?,
        None => default_facts(),
    };
    let validated = validate_with(&policy, defaults).map_err(|errors| RenderCommandError::Invalid {
        path: policy_path,
        problems: errors
            .iter()
            .map(|e| format!("  {e}"))
            .collect::<Vec<_>>()
            .join("\n"),
    })?;
    let rendered = render(&validated, &facts)?;
    let mut out = String::new();
    for manifest in &rendered.objects {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&manifest.object).expect("JSON values serialize as YAML"));
    }
    Ok(out)
}
