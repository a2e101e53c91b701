//! Serving the router on a loopback socket, with a kubeconfig for it, so that kubectl and the project's
//! binaries connect as to any cluster.

use std::io;
use std::net::SocketAddr;
use std::path::Path;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Why a client for a running server could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The kubeconfig was not understood.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// The client could not be built.
    #[error("client: {0}")]
    Client(#[from] kube::Error),
}

/// A kubeconfig for a server at `url`, with context `fake` and namespace `default`.
pub fn kubeconfig_yaml(url: &str) -> String {
    kubeconfig_with_token(url, None)
}

/// A kubeconfig for a server at `url` whose user presents `token` (the admin's, in rbac mode).
pub fn kubeconfig_with_token(url: &str, token: Option<&str>) -> String {
    let user = match token {
        Some(token) => format!("{{token: {token}}}"),
        None => "{}".to_owned(),
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {url}
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
    namespace: default
current-context: fake
users:
- name: fake
  user: {user}
preferences: {{}}
"
    )
}

/// A server listening on a socket; stops when [`Running::shutdown`] is called or it is dropped.
#[derive(Debug)]
pub struct Running {
    addr: SocketAddr,
    kubeconfig: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl Running {
    pub(crate) async fn start(
        router: axum::Router,
        addr: SocketAddr,
        token: Option<String>,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        let kubeconfig = kubeconfig_with_token(&format!("http://{addr}"), token.as_deref());
        Ok(Self {
            addr,
            kubeconfig,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig pointing at this server.
    pub fn kubeconfig(&self) -> &str {
        &self.kubeconfig
    }

    /// Writes the kubeconfig to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, &self.kubeconfig)
    }

    /// A client connecting through the socket with the kubeconfig, as a binary would.
    pub async fn client(&self) -> Result<kube::Client, ConnectError> {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig)?;
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Runs until the server fails (it never stops by itself).
    pub async fn wait(mut self) -> io::Result<()> {
        match self.task.take() {
            Some(task) => task.await.map_err(io::Error::other)?,
            None => Ok(()),
        }
    }

    /// Stops accepting connections and closes open ones, watches included.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            // Open watches would hold a graceful shutdown forever: give connections a moment, then cut them.
            let abort = task.abort_handle();
            if tokio::time::timeout(std::time::Duration::from_millis(500), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
