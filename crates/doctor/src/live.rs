//! Reading a live cluster, with the usual kubeconfig resolution (`--kubeconfig`, `$KUBECONFIG`,
//! `~/.kube/config`, in-cluster). It lists exactly what a command reads ([`Reads`]): nodes, DaemonSets, the
//! pods of the operand DaemonSets (by each DaemonSet's own selector), RuntimeClasses and ClusterPolicies;
//! for `explain`, also the pods that ask for GPUs; for `upgrade-plan` and `snapshot`, also NVIDIADrivers, the
//! driver DaemonSets' ControllerRevisions, PodDisruptionBudgets and the pods on nodes a driver upgrade may
//! empty. Lists are paged, and every object goes through the same conversion as a snapshot file
//! ([`crate::load::Loader`]).

use std::path::PathBuf;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ListParams, LogParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{Request, Selector};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::analysis::operand_of;
use crate::load::{LoadError, Loader, Location};
use crate::resources::pod_gpu_requests;
use crate::snapshot::{PodFacts, Snapshot, null_as_default, trim_pod};
use crate::upgrade_plan::may_be_upgraded;
use gpuop_api::Operand;
use gpuop_api::labels::COMPONENT;

/// Objects per page of a list.
const PAGE: u32 = 500;

/// What a live read covers, each a superset of the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reads {
    /// What `doctor` judges: nodes, DaemonSets, RuntimeClasses, ClusterPolicies and the operand pods.
    Doctor,
    /// Also every pod that asks for GPUs and has not finished (`explain`).
    GpuPods,
    /// Also NVIDIADrivers, the driver DaemonSets' ControllerRevisions, PodDisruptionBudgets, and every pod
    /// that has not finished on a node a driver upgrade may empty (`upgrade-plan`; `snapshot`, so that its
    /// file answers every command).
    UpgradePlan,
}

/// Why the live cluster could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// No usable kubeconfig or in-cluster configuration.
    #[error("cannot connect to the cluster")]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A list or get failed.
    #[error("cannot {verb} {what}")]
    Request {
        /// `list` or `get`.
        verb: &'static str,
        /// What, e.g. `nodes` or `pods in gpu-operator`.
        what: String,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// An object the API returned cannot be used.
    #[error(transparent)]
    Object(#[from] LoadError),
}

/// Where the kubeconfig comes from.
#[derive(Clone, Debug, Default)]
pub struct Connection {
    /// A kubeconfig file instead of the usual resolution.
    pub kubeconfig: Option<PathBuf>,
    /// A context instead of the current one.
    pub context: Option<String>,
}

/// A connection to a live cluster.
#[derive(Clone)]
pub struct Live {
    client: kube::Client,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
struct Page<T> {
    #[serde(default)]
    metadata: PageMeta,
    #[serde(default = "Vec::new", deserialize_with = "null_as_default")]
    items: Vec<T>,
}

#[derive(Default, Deserialize)]
struct PageMeta {
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

impl Live {
    /// Connects with the usual kubeconfig resolution, or the given file and context.
    pub async fn connect(connection: &Connection) -> Result<Live, LiveError> {
        let options = KubeConfigOptions {
            context: connection.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match (&connection.kubeconfig, &connection.context) {
            (Some(path), _) => {
                let kubeconfig = Kubeconfig::read_from(path).map_err(|e| LiveError::Connect(e.into()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| LiveError::Connect(e.into()))?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| LiveError::Connect(e.into()))?,
            (None, None) => kube::Config::infer()
                .await
                .map_err(|e| LiveError::Connect(e.into()))?,
        };
        let client = kube::Client::try_from(config).map_err(|e| LiveError::Connect(e.into()))?;
        Ok(Live { client })
    }

    /// The namespace of the kubeconfig's context (`default` when it names none).
    pub fn default_namespace(&self) -> &str {
        self.client.default_namespace()
    }

    /// Reads what a command needs.
    pub async fn snapshot(&self, reads: Reads) -> Result<Snapshot, LiveError> {
        let mut loader = Loader::default();
        self.add_all(&mut loader, "/api/v1/nodes", "Node", "nodes")
            .await?;
        self.add_all(&mut loader, "/apis/apps/v1/daemonsets", "DaemonSet", "daemonsets")
            .await?;
        self.add_all(
            &mut loader,
            "/apis/node.k8s.io/v1/runtimeclasses",
            "RuntimeClass",
            "runtimeclasses",
        )
        .await?;
        match self
            .add_all(
                &mut loader,
                "/apis/nvidia.com/v1/clusterpolicies",
                "ClusterPolicy",
                "clusterpolicies",
            )
            .await
        {
            // Without the CRD there is no ClusterPolicy; the doctor still judges the DaemonSets it finds.
            Err(LiveError::Request {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 404 => {}
            other => other?,
        }
        let mut listed = vec!["Node", "DaemonSet", "RuntimeClass", "ClusterPolicy"];
        if reads == Reads::UpgradePlan {
            match self
                .add_all(
                    &mut loader,
                    "/apis/nvidia.com/v1alpha1/nvidiadrivers",
                    "NVIDIADriver",
                    "nvidiadrivers",
                )
                .await
            {
                // Without the CRD there is no NVIDIADriver.
                Err(LiveError::Request {
                    source: kube::Error::Api(status),
                    ..
                }) if status.code == 404 => {}
                other => other?,
            }
            // A DaemonSet's ControllerRevisions carry its pod template's labels, the component among them.
            self.add_listed(
                &mut loader,
                "/apis/apps/v1/controllerrevisions",
                ListParams::default().labels(&format!("{COMPONENT}={}", Operand::Driver.info().component)),
                "ControllerRevision",
                "controllerrevisions",
            )
            .await?;
            self.add_all(
                &mut loader,
                "/apis/policy/v1/poddisruptionbudgets",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
            )
            .await?;
            listed.extend(["NVIDIADriver", "ControllerRevision", "PodDisruptionBudget"]);
        }
        let mut snapshot = loader.finish();
        snapshot
            .listed
            .extend(listed.iter().map(|kind| (*kind).to_owned()));

        // The operand pods, by each operand DaemonSet's own selector.
        let mut selectors: Vec<(String, LabelSelector)> = snapshot
            .daemon_sets
            .iter()
            .filter(|daemon_set| operand_of(daemon_set).is_some())
            .filter_map(|daemon_set| {
                Some((
                    daemon_set.metadata.namespace.clone()?,
                    daemon_set.spec.as_ref()?.selector.clone(),
                ))
            })
            .collect();
        selectors.dedup();
        for (namespace, selector) in selectors {
            let params = match Selector::try_from(selector) {
                Ok(selector) => ListParams::default().labels(&selector.to_string()),
                // A selector kube cannot render: list the namespace; ownership is checked in the analysis.
                Err(_) => ListParams::default(),
            };
            let path = format!("/api/v1/namespaces/{namespace}/pods");
            let pods: Vec<PodFacts> = self.list(&path, params, &format!("pods in {namespace}")).await?;
            snapshot.pods.extend(pods);
        }
        if reads >= Reads::GpuPods {
            // Nodes a driver upgrade may empty: every pod there may have to go (drain).
            let emptied = match reads {
                Reads::UpgradePlan => may_be_upgraded(&snapshot),
                _ => Default::default(),
            };
            let params = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
            let pods: Vec<PodFacts> = self
                .list_keeping("/api/v1/pods", params, "pods", |pod: &PodFacts| {
                    !pod_gpu_requests(pod).is_empty()
                        || pod
                            .spec
                            .node_name
                            .as_ref()
                            .is_some_and(|node| emptied.contains(node))
                })
                .await?;
            snapshot.pods.extend(pods);
        }
        snapshot.pods.iter_mut().for_each(trim_pod);
        snapshot.dedup_pods();
        Ok(snapshot)
    }

    /// One pod, or `None` when it does not exist.
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodFacts>, LiveError> {
        let request = Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
            .get(name, &Default::default())
            .map_err(|e| LiveError::Request {
                verb: "get",
                what: format!("pod {namespace}/{name}"),
                source: kube::Error::BuildRequest(e),
            })?;
        match self.client.request::<PodFacts>(request).await {
            Ok(pod) => Ok(Some(pod)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(source) => Err(LiveError::Request {
                verb: "get",
                what: format!("pod {namespace}/{name}"),
                source,
            }),
        }
    }

    /// Every object of a list, as JSON (list items carry no `kind`).
    pub async fn list_values(
        &self,
        path: &str,
        params: ListParams,
        what: &str,
    ) -> Result<Vec<Value>, LiveError> {
        self.list(path, params, what).await
    }

    /// Every pod of a namespace.
    pub async fn pods_in(&self, namespace: &str) -> Result<Vec<PodFacts>, LiveError> {
        self.list(
            &format!("/api/v1/namespaces/{namespace}/pods"),
            ListParams::default(),
            &format!("pods in {namespace}"),
        )
        .await
    }

    /// A container's log (`pods/log`), as the server bounds it with `params`: bytes, as the container wrote
    /// them (a log need not be UTF-8).
    pub async fn log(&self, namespace: &str, pod: &str, params: &LogParams) -> Result<Vec<u8>, LiveError> {
        let error = |source| LiveError::Request {
            verb: "get",
            what: format!(
                "the log of container {} of pod {namespace}/{pod}",
                params.container.as_deref().unwrap_or_default()
            ),
            source,
        };
        let request = Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
            .logs(pod, params)
            .map_err(|e| error(kube::Error::BuildRequest(e)))?;
        let mut stream = self.client.request_stream(request).await.map_err(error)?;
        let mut log = Vec::new();
        futures::AsyncReadExt::read_to_end(&mut stream, &mut log)
            .await
            .map_err(|e| error(kube::Error::ReadEvents(e)))?;
        Ok(log)
    }

    async fn add_all(
        &self,
        loader: &mut Loader,
        path: &str,
        kind: &str,
        what: &str,
    ) -> Result<(), LiveError> {
        self.add_listed(loader, path, ListParams::default(), kind, what)
            .await
    }

    async fn add_listed(
        &self,
        loader: &mut Loader,
        path: &str,
        params: ListParams,
        kind: &str,
        what: &str,
    ) -> Result<(), LiveError> {
        let items: Vec<Value> = self.list(path, params, what).await?;
        let at = Location {
            origin: format!("{path} (live)"),
            document: 1,
            item: None,
        };
        for (index, mut item) in items.into_iter().enumerate() {
            // List items carry no kind.
            if let Some(map) = item.as_object_mut() {
                map.insert("kind".to_owned(), kind.into());
            }
            let at = Location {
                item: Some(index),
                ..at.clone()
            };
            loader.add_value(item, &at)?;
        }
        Ok(())
    }

    async fn list<T: DeserializeOwned>(
        &self,
        path: &str,
        params: ListParams,
        what: &str,
    ) -> Result<Vec<T>, LiveError> {
        self.list_keeping(path, params, what, |_: &T| true).await
    }

    /// Lists every page, keeping the items `keep` accepts as each page comes (a cluster's pods are many).
    async fn list_keeping<T: DeserializeOwned>(
        &self,
        path: &str,
        params: ListParams,
        what: &str,
        mut keep: impl FnMut(&T) -> bool,
    ) -> Result<Vec<T>, LiveError> {
        let error = |source| LiveError::Request {
            verb: "list",
            what: what.to_owned(),
            source,
        };
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut page_params = params.clone().limit(PAGE);
            if let Some(token) = &token {
                page_params = page_params.continue_token(token);
            }
            let request = Request::new(path)
                .list(&page_params)
                .map_err(|e| error(kube::Error::BuildRequest(e)))?;
            let page: Page<T> = self.client.request(request).await.map_err(error)?;
            items.extend(page.items.into_iter().filter(|item| keep(item)));
            match page.metadata.continue_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(items),
            }
        }
    }
}
