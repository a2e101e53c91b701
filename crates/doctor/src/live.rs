//! Reading a live cluster, with the usual kubeconfig resolution (`--kubeconfig`, `$KUBECONFIG`,
//! `~/.kube/config`, in-cluster). It lists exactly what a command reads ([`Reads`]): nodes, DaemonSets, the
//! pods of the operand DaemonSets (by each DaemonSet's own selector), RuntimeClasses and ClusterPolicies;
//! for `explain`, also the pods that ask for GPUs; for `upgrade-plan` and `snapshot`, also NVIDIADrivers, the
//! driver DaemonSets' ControllerRevisions, PodDisruptionBudgets and the pods on nodes a driver upgrade may
//! empty. Lists are paged, and every object goes through the same conversion as a snapshot file
//! ([`crate::load::Loader`]).
//!
//! Every request is bounded by the request timeout ([`Connection::request_timeout`]), so a server that
//! accepts the connection and never answers ends the command instead of hanging it.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ListParams, LogParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{Request, Selector};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::load::{LoadError, Loader, Location, pod_from_json};
use crate::resources::pod_gpu_requests;
use crate::snapshot::{PodFacts, Snapshot};
use crate::upgrade_plan::may_be_upgraded;
use gpuop_api::labels::{MANAGED_BY, MANAGED_BY_VALUE};
use gpuop_api::{ClusterPolicy, NVIDIADriver, Operand};
use kube::Resource;

/// Objects per page of a list.
const PAGE: u32 = 500;

/// The request timeout when none is given. kubectl waits forever by default (`0`); a doctor that hangs on
/// a server that never answers is no help, and 30 s is far beyond what one page of a list takes.
pub const DEFAULT_REQUEST_TIMEOUT: &str = "30s";

/// Parses a request timeout as kubectl does (`--request-timeout`): plain seconds (`30`), or a Go duration
/// (`1m`, `1m30s`, `500ms`, `1.5h`); `0` means none.
pub fn parse_request_timeout(text: &str) -> Result<Option<Duration>, String> {
    let invalid = || {
        format!(
            "invalid timeout {text:?}: give seconds (30), a duration with a unit (500ms, 30s, 1m, 1h30m), or 0 for none"
        )
    };
    let duration = if let Ok(seconds) = text.parse::<u64>() {
        Duration::from_secs(seconds)
    } else {
        if text.is_empty() {
            return Err(invalid());
        }
        let numeric = |c: &char| c.is_ascii_digit() || *c == '.';
        let mut chars = text.chars().peekable();
        let mut total = 0.0_f64;
        while chars.peek().is_some() {
            let number: String = std::iter::from_fn(|| chars.next_if(numeric)).collect();
            let unit: String = std::iter::from_fn(|| chars.next_if(|c| !numeric(c))).collect();
            let number: f64 = number.parse().map_err(|_| invalid())?;
            let seconds = match unit.as_str() {
                "ns" => 1e-9,
                "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
                "ms" => 1e-3,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(invalid()),
            };
            total += number * seconds;
        }
        Duration::try_from_secs_f64(total).map_err(|_| invalid())?
    };
    Ok((!duration.is_zero()).then_some(duration))
}

/// A request timeout given on the command line (`--request-timeout`); `None` waits as long as it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestTimeout(pub Option<Duration>);

impl std::str::FromStr for RequestTimeout {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        parse_request_timeout(text).map(RequestTimeout)
    }
}

/// A timeout as a person wrote it: `30s`, `1m30s`, `500ms`.
struct Shown(Duration);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        if !millis.is_multiple_of(1000) {
            return write!(f, "{millis}ms");
        }
        let seconds = millis / 1000;
        match (seconds / 60, seconds % 60) {
            (0, s) => write!(f, "{s}s"),
            (m, 0) => write!(f, "{m}m"),
            (m, s) => write!(f, "{m}m{s}s"),
        }
    }
}

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
    /// The server did not answer a request within the request timeout.
    #[error(
        "cannot {verb} {what}: the server {server} did not answer within {} (--request-timeout)",
        Shown(*timeout)
    )]
    Timeout {
        /// `list` or `get`.
        verb: &'static str,
        /// What, e.g. `nodes`.
        what: String,
        /// The API server's URL.
        server: String,
        /// The timeout that ran out.
        timeout: Duration,
    },
    /// The pod asked for does not exist (kubectl: `Error from server (NotFound): pods "x" not found`).
    #[error("pods {name:?} not found in namespace {namespace:?}")]
    PodNotFound {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// An object the API returned cannot be used.
    #[error(transparent)]
    Object(#[from] LoadError),
}

/// Where the kubeconfig comes from, and how long a request may take.
#[derive(Clone, Debug, Default)]
pub struct Connection {
    /// A kubeconfig file instead of the usual resolution.
    pub kubeconfig: Option<PathBuf>,
    /// A context instead of the current one.
    pub context: Option<String>,
    /// How long one request may take, connecting included; `None`: as long as it takes.
    pub request_timeout: Option<Duration>,
}

/// The command-line arguments that say how to reach the live cluster (`--kubeconfig`, `--context`,
/// `--request-timeout`), shared by every command that reads it.
#[derive(Debug, clap::Args)]
pub struct ConnectionArgs {
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current one).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// How long to wait for one server request before giving up: seconds, or a duration with a unit
    /// (500ms, 30s, 1m); 0 waits forever.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_REQUEST_TIMEOUT)]
    pub request_timeout: RequestTimeout,
}

impl ConnectionArgs {
    /// The connection the arguments ask for.
    pub fn connection(&self) -> Connection {
        Connection {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            request_timeout: self.request_timeout.0,
        }
    }
}

/// A connection to a live cluster.
#[derive(Clone)]
pub struct Live {
    client: kube::Client,
    server: String,
    timeout: Option<Duration>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

/// One page of a list: its items as JSON text, read into their projections one at a time.
#[derive(Deserialize)]
struct Page<'a> {
    #[serde(default)]
    metadata: PageMeta,
    #[serde(default, borrow)]
    items: Option<Vec<&'a RawValue>>,
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
        let mut config = match (&connection.kubeconfig, &connection.context) {
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
        // The whole request is bounded below; these bound each step the same way, and with no timeout
        // kube's own read timeout (295 s) must not cut a request the person allowed to take longer.
        config.read_timeout = connection.request_timeout;
        config.write_timeout = connection.request_timeout;
        if connection.request_timeout.is_some() {
            config.connect_timeout = connection.request_timeout;
        }
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config).map_err(|e| LiveError::Connect(e.into()))?;
        Ok(Live {
            client,
            server: server.trim_end_matches('/').to_owned(),
            timeout: connection.request_timeout,
        })
    }

    /// Sends a request, bounded by the request timeout; the answer's body.
    async fn send_text(
        &self,
        request: http::Request<Vec<u8>>,
        verb: &'static str,
        what: &str,
    ) -> Result<String, LiveError> {
        let answer = self.client.request_text(request);
        let answer = match self.timeout {
            Some(timeout) => tokio::time::timeout(timeout, answer)
                .await
                .map_err(|_| LiveError::Timeout {
                    verb,
                    what: what.to_owned(),
                    server: self.server.clone(),
                    timeout,
                })?,
            None => answer.await,
        };
        answer.map_err(|source| LiveError::Request {
            verb,
            what: what.to_owned(),
            source,
        })
    }

    /// What `explain pod` reads: [`Reads::GpuPods`], and the pod itself whatever it asks for.
    pub async fn snapshot_with_pod(&self, namespace: &str, name: &str) -> Result<Snapshot, LiveError> {
        let mut snapshot = self.snapshot(Reads::GpuPods).await?;
        if snapshot.pod(namespace, name).is_none() {
            let pod = self
                .pod(namespace, name)
                .await?
                .ok_or_else(|| LiveError::PodNotFound {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })?;
            snapshot.pods.push(pod);
        }
        Ok(snapshot)
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
        // Without the CRD there is no ClusterPolicy; the doctor still judges the DaemonSets it finds.
        self.add_all_custom::<ClusterPolicy>(&mut loader).await?;
        let mut listed = vec!["Node", "DaemonSet", "RuntimeClass", "ClusterPolicy"];
        if reads == Reads::UpgradePlan {
            self.add_all_custom::<NVIDIADriver>(&mut loader).await?;
            self.add_all(
                &mut loader,
                "/apis/policy/v1/poddisruptionbudgets",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
            )
            .await?;
            listed.extend(["NVIDIADriver", "PodDisruptionBudget"]);
        }
        // The operand DaemonSets' latest revisions: a pod of an earlier one does not count as ready. A
        // DaemonSet's ControllerRevisions carry its pod template's labels, `managed-by` among them. Without
        // the permission to list them (only `upgrade-plan` needs it), every pod counts as current.
        match self
            .add_listed(
                &mut loader,
                "/apis/apps/v1/controllerrevisions",
                ListParams::default().labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}")),
                "ControllerRevision",
                "controllerrevisions",
            )
            .await
        {
            Err(LiveError::Request {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 403 && reads != Reads::UpgradePlan => {}
            other => {
                other?;
                listed.push("ControllerRevision");
            }
        }
        let mut snapshot = loader.finish();
        snapshot
            .listed
            .extend(listed.iter().map(|kind| (*kind).to_owned()));

        // The operand pods, by each operand DaemonSet's own selector.
        let mut selectors: Vec<(String, LabelSelector)> = snapshot
            .daemon_sets
            .iter()
            .filter(|daemon_set| Operand::of_daemonset(daemon_set).is_some())
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
            let pods = self
                .list_pods(&path, params, &format!("pods in {namespace}"), |_| true)
                .await?;
            snapshot.pods.extend(pods);
        }
        if reads >= Reads::GpuPods {
            // Nodes a driver upgrade may empty: every pod there may have to go (drain).
            let emptied = match reads {
                Reads::UpgradePlan => may_be_upgraded(&snapshot),
                _ => Default::default(),
            };
            let params = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
            let pods = self
                .list_pods("/api/v1/pods", params, "pods", |pod: &PodFacts| {
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
        let at = Location {
            origin: format!("pod {namespace}/{name} (live)"),
            document: 1,
            item: None,
        };
        match self
            .send_text(request, "get", &format!("pod {namespace}/{name}"))
            .await
        {
            Ok(text) => Ok(Some(pod_from_json(&text, &at)?)),
            Err(LiveError::Request {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 404 => Ok(None),
            Err(error) => Err(error),
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
        self.list_pods(
            &format!("/api/v1/namespaces/{namespace}/pods"),
            ListParams::default(),
            &format!("pods in {namespace}"),
            |_| true,
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

    /// [`Self::add_all`] for a custom resource: where its CRD is not installed (404), there is none to add.
    async fn add_all_custom<K: Resource<DynamicType = ()>>(
        &self,
        loader: &mut Loader,
    ) -> Result<(), LiveError> {
        let listed = self
            .add_all(loader, &K::url_path(&(), None), &K::kind(&()), &K::plural(&()))
            .await;
        match listed {
            Err(LiveError::Request {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 404 => Ok(()),
            other => other,
        }
    }

    /// Adds every object of a list to the loader as each page comes, each straight into its projection.
    async fn add_listed(
        &self,
        loader: &mut Loader,
        path: &str,
        params: ListParams,
        kind: &str,
        what: &str,
    ) -> Result<(), LiveError> {
        let at = Location {
            origin: format!("{path} (live)"),
            document: 1,
            item: None,
        };
        self.pages(path, params, what, |index, item| {
            let at = Location {
                item: Some(index),
                ..at.clone()
            };
            // List items carry no kind.
            Ok(loader.add_json_item(item, Some(kind), &at)?)
        })
        .await
    }

    /// Every pod of a list that `keep` accepts, projected and trimmed as each page comes: a cluster's pods
    /// are many, and no whole Pod is kept.
    async fn list_pods(
        &self,
        path: &str,
        params: ListParams,
        what: &str,
        mut keep: impl FnMut(&PodFacts) -> bool,
    ) -> Result<Vec<PodFacts>, LiveError> {
        let at = Location {
            origin: format!("{path} (live)"),
            document: 1,
            item: None,
        };
        let mut pods = Vec::new();
        self.pages(path, params, what, |index, item| {
            let at = Location {
                item: Some(index),
                ..at.clone()
            };
            let pod = pod_from_json(item, &at)?;
            if keep(&pod) {
                pods.push(pod);
            }
            Ok(())
        })
        .await?;
        Ok(pods)
    }

    /// Every object of a list, as `T`.
    async fn list<T: DeserializeOwned>(
        &self,
        path: &str,
        params: ListParams,
        what: &str,
    ) -> Result<Vec<T>, LiveError> {
        let mut items = Vec::new();
        self.pages(path, params, what, |_, item| {
            let item = serde_json::from_str(item).map_err(|error| LiveError::Request {
                verb: "list",
                what: what.to_owned(),
                source: kube::Error::SerdeError(error),
            })?;
            items.push(item);
            Ok(())
        })
        .await?;
        Ok(items)
    }

    /// Lists every page ([`PAGE`] objects each, `limit` and `continue`), handing each item's JSON text and
    /// its index in the whole list to `item` as the page comes; a page is dropped before the next is asked.
    async fn pages(
        &self,
        path: &str,
        params: ListParams,
        what: &str,
        mut item: impl FnMut(usize, &str) -> Result<(), LiveError>,
    ) -> Result<(), LiveError> {
        let error = |source| LiveError::Request {
            verb: "list",
            what: what.to_owned(),
            source,
        };
        let mut index = 0;
        let mut token: Option<String> = None;
        loop {
            let mut page_params = params.clone().limit(PAGE);
            if let Some(token) = &token {
                page_params = page_params.continue_token(token);
            }
            let request = Request::new(path)
                .list(&page_params)
                .map_err(|e| error(kube::Error::BuildRequest(e)))?;
            let text = self.send_text(request, "list", what).await?;
            let page: Page<'_> =
                serde_json::from_str(&text).map_err(|e| error(kube::Error::SerdeError(e)))?;
            for raw in page.items.into_iter().flatten() {
                item(index, raw.get())?;
                index += 1;
            }
            match page.metadata.continue_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_timeouts_read_as_kubectl_reads_them() {
        let secs = |s: u64| Ok(Some(Duration::from_secs(s)));
        assert_eq!(parse_request_timeout("0"), Ok(None));
        assert_eq!(parse_request_timeout("0s"), Ok(None));
        assert_eq!(parse_request_timeout("30"), secs(30));
        assert_eq!(parse_request_timeout("30s"), secs(30));
        assert_eq!(parse_request_timeout("1m"), secs(60));
        assert_eq!(parse_request_timeout("1h30m"), secs(5400));
        assert_eq!(parse_request_timeout("1.5m"), secs(90));
        assert_eq!(
            parse_request_timeout("500ms"),
            Ok(Some(Duration::from_millis(500)))
        );
        for bad in ["", "s", "ten", "5x", "-1", "1m-"] {
            let error = parse_request_timeout(bad).unwrap_err();
            assert!(error.contains("or 0 for none"), "{bad}: {error}");
        }
        assert_eq!(Shown(Duration::from_secs(90)).to_string(), "1m30s");
        assert_eq!(Shown(Duration::from_secs(120)).to_string(), "2m");
        assert_eq!(Shown(Duration::from_millis(1500)).to_string(), "1500ms");
    }
}
