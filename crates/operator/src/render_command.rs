//! `gpu-operator render`: the objects the operator would create for a ClusterPolicy, printed as YAML.

use std::path::Path;

use gpuop_api::ClusterPolicy;
use gpuop_api::FieldError;
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
        problems: problem_lines(&errors),
    })?;
    let rendered = render(&validated, &facts)?;
    let mut out = String::new();
    for manifest in &rendered.objects {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&manifest.object).expect("JSON values serialize as YAML"));
    }
    Ok(out)
}

/// Why `render --diff-live` could not predict anything.
#[derive(Debug, thiserror::Error)]
pub enum DiffLiveError {
    /// Reading from the cluster failed.
    #[error("cannot read {what}: {source}")]
    Read {
        /// What was being read.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// There is no ClusterPolicy to render.
    #[error("there is no ClusterPolicy in the cluster")]
    NoPolicy,
    /// The live ClusterPolicy is invalid.
    #[error("ClusterPolicy {name:?} is invalid:\n{problems}")]
    Invalid {
        /// The policy.
        name: String,
        /// One problem per line.
        problems: String,
    },
    /// Rendering failed for the cluster's facts.
    #[error("{0}")]
    Render(#[from] gpuop_render::RenderError),
    /// The renderer produced an object the operator cannot address.
    #[error("{0}")]
    Apply(#[from] crate::apply::ApplyError),
    /// Reading a ConfigMap the policy names failed.
    #[error("{0}")]
    Reconcile(#[from] crate::controller::ReconcileError),
}

/// How `render --diff-live` reads the cluster.
#[derive(Clone, Debug)]
pub struct DiffLiveInput<'a> {
    /// The operator namespace, where the operands run.
    pub namespace: &'a str,
    /// How GPU nodes are recognised (as the operator would be run).
    pub detection: &'a gpuop_api::labels::GpuDetection,
    /// Images from the environment.
    pub image_defaults: &'a ImageDefaults,
}

/// Renders the live ClusterPolicy (and NVIDIADrivers) against the live cluster's facts, as the operator
/// would, reads the live objects and the namespace's pods, and predicts what taking over changes
/// ([`crate::diff_live::diff`]). Reads only.
pub async fn diff_live(
    client: &kube::Client,
    input: DiffLiveInput<'_>,
) -> Result<crate::diff_live::DiffReport, DiffLiveError> {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use gpuop_api::NVIDIADriver;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, ListParams};

    use crate::apply::{self, MANAGED_KINDS, Owned};
    use crate::changes::NodeSet;
    use crate::diff_live::{LivePod, desired_objects, diff};
    use crate::facts::FactsInput;
    use crate::index::Judgements;
    use crate::labeler::LabelPolicy;
    use crate::projection::{Interner, NodeKeys, NodeRecord};

    let read = |what: &str| {
        let what = what.to_owned();
        move |source| DiffLiveError::Read { what, source }
    };
    let list = ListParams::default();
    let policies = Api::<ClusterPolicy>::all(client.clone())
        .list(&list)
        .await
        .map_err(read("ClusterPolicies"))?;
    let policy = ClusterPolicy::active(&policies.items).ok_or(DiffLiveError::NoPolicy)?;
    let validated = validate_with(policy, input.image_defaults).map_err(|errors| DiffLiveError::Invalid {
        name: policy.metadata.name.clone().unwrap_or_default(),
        problems: problem_lines(&errors),
    })?;
    let listed_nodes = Api::<Node>::all(client.clone())
        .list(&list)
        .await
        .map_err(read("Nodes"))?
        .items;
    let nvidia_drivers_on = validated.spec.driver.use_nvidia_driver_crd();
    let drivers: Vec<Arc<NVIDIADriver>> = if nvidia_drivers_on {
        Api::<NVIDIADriver>::all(client.clone())
            .list(&list)
            .await
            .map_err(read("NVIDIADrivers"))?
            .items
            .into_iter()
            .map(Arc::new)
            .collect()
    } else {
        Vec::new()
    };
    let mut label_policy = LabelPolicy::from_policy(&validated);
    if nvidia_drivers_on {
        label_policy.nvidia_drivers = Some(drivers.iter().map(|d| (**d).clone()).collect());
    }
    // The nodes as the operator's cache keeps them, with the NFD labels the NVIDIADrivers select on.
    let mut keys = NodeKeys::of_detection(input.detection);
    for driver in &drivers {
        keys.extend(driver.spec.effective_node_selector().keys().map(String::as_str));
    }
    let mut interner = Interner::default();
    let nodes: Vec<Arc<NodeRecord>> = listed_nodes
        .iter()
        .map(|node| Arc::new(NodeRecord::project(node, &keys, &mut interner)))
        .collect();
    let mut judged = Judgements::default();
    judged.refresh_facts(
        &nodes.iter().cloned().collect::<NodeSet>(),
        &label_policy,
        input.detection,
    );
    let service_monitor_crd = crate::run::service_monitor_crd(client).await;
    let (mut facts, _) = judged.cluster(FactsInput {
        namespace: input.namespace,
        precompiled: validated.spec.driver.use_precompiled(),
        service_monitor_crd,
    });
    facts.config_map_keys = crate::controller::read_config_map_keys(
        client,
        input.namespace,
        crate::controller::policy_config_maps(&validated.spec),
    )
    .await?;
    let rendered = render(&validated, &facts)?;
    let routing = if nvidia_drivers_on {
        crate::drivers::routing(&drivers, &nodes, input.detection)
    } else {
        gpuop_api::DriverRouting::default()
    };
    let driver_config_maps = drivers
        .iter()
        .flat_map(|d| crate::drivers::config_maps(d))
        .collect();
    let driver_config_map_keys =
        crate::controller::read_config_map_keys(client, input.namespace, driver_config_maps).await?;
    let host_root = gpuop_render::NvidiaDriverFacts::host_root_of(Some(&validated.spec));
    let plans = crate::drivers::plan(
        &drivers,
        &nodes,
        &judged,
        &routing,
        crate::drivers::DriversInput {
            enabled: nvidia_drivers_on,
            namespace: input.namespace,
            image_defaults: input.image_defaults,
            host_root: &host_root,
            runtime: facts.runtime,
            config_map_keys: &driver_config_map_keys,
            validation_timeout_seconds: gpuop_api::upgrade::DEFAULT_VALIDATION_TIMEOUT_SECONDS,
        },
    );
    let owner = apply::owner_reference(policy);
    let driver_owners: Vec<_> = plans.iter().map(|p| apply::owner_reference(&*p.driver)).collect();
    let mut owned = vec![Owned {
        rendered: &rendered,
        owner: &owner,
    }];
    owned.extend(plans.iter().zip(&driver_owners).map(|(plan, owner)| Owned {
        rendered: &plan.rendered,
        owner,
    }));

    let mut live = BTreeMap::new();
    for set in &owned {
        for manifest in &set.rendered.objects {
            let (kind, namespace, name) =
                apply::key_of(manifest).ok_or_else(|| apply::ApplyError::unknown_kind(manifest))?;
            let managed = MANAGED_KINDS
                .iter()
                .find(|k| k.kind == kind)
                .expect("keys come from MANAGED_KINDS");
            let found = managed
                .api(client.clone(), &namespace)
                .get_opt(&name)
                .await
                .map_err(read(&format!("{kind} {name:?}")))?;
            if let Some(object) = found {
                let value = serde_json::to_value(object).unwrap_or_default();
                live.insert((kind.to_owned(), namespace, name), value);
            }
        }
    }
    let pods: Vec<LivePod> = Api::<Pod>::namespaced(client.clone(), input.namespace)
        .list(&list)
        .await
        .map_err(read("Pods"))?
        .items
        .into_iter()
        .map(|pod| LivePod {
            name: pod.metadata.name.unwrap_or_default(),
            node: pod.spec.and_then(|s| s.node_name).unwrap_or_default(),
            owners: pod
                .metadata
                .owner_references
                .into_iter()
                .flatten()
                .map(|o| o.uid)
                .collect(),
        })
        .collect();
    let mut desired = desired_objects(&owned, &live);
    for ((kind, namespace, name), object) in &mut desired {
        if kind.as_str() == "DaemonSet" && live.contains_key(&(kind.clone(), namespace.clone(), name.clone()))
        {
            object["spec"] = stored_spec(client, namespace, name, object)
                .await
                .map_err(read(&format!("DaemonSet {name:?} (a dry-run create)")))?;
        }
    }
    Ok(diff(&desired, &live, &pods))
}

/// The spec of a DaemonSet as the API server would store it when created as `object` is: a dry-run create
/// under a generated name, so the server's own defaults (whatever its version) fill it in and nothing is
/// written.
/// A policy's validation errors as the commands print them: one a line, indented under the heading.
fn problem_lines(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn stored_spec(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    object: &serde_json::Value,
) -> Result<serde_json::Value, kube::Error> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use kube::api::{Api, PostParams};

    let mut probe: DaemonSet = serde_json::from_value(object.clone()).map_err(kube::Error::SerdeError)?;
    probe.metadata.name = None;
    probe.metadata.generate_name = Some(format!("{name}-"));
    probe.metadata.resource_version = None;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let stored = Api::<DaemonSet>::namespaced(client.clone(), namespace)
        .create(&dry_run, &probe)
        .await?;
    Ok(serde_json::to_value(stored.spec).unwrap_or_default())
}
