//! Serving the router on a loopback socket, with a kubeconfig for it, so that kubectl and the project's
//! binaries connect as to any cluster.
//!
//! In always-allow mode the socket speaks plain HTTP. In rbac mode it speaks HTTPS with a fixed
//! self-signed certificate for `127.0.0.1` (committed under `src/tls/`; it protects nothing, the key is
//! public), because client-go, and so kubectl and Helm, sends credentials only over TLS. The kubeconfig
//! written carries the certificate as its certificate authority and the admin's token.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

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

/// The certificate the server presents in rbac mode (PEM), self-signed for `127.0.0.1` and `localhost`.
pub const CERTIFICATE_PEM: &str = include_str!("tls/cert.pem");

/// A kubeconfig for a server at `url` whose user presents `token` (the admin's, in rbac mode). An
/// `https` URL gets the server's certificate as its certificate authority.
pub fn kubeconfig_with_token(url: &str, token: Option<&str>) -> String {
    let user = match token {
        Some(token) => format!("{{token: {token}}}"),
        None => "{}".to_owned(),
    };
    let authority = if url.starts_with("https://") {
        format!(
            "\n    certificate-authority-data: {}",
            base64::engine::general_purpose::STANDARD.encode(CERTIFICATE_PEM)
        )
    } else {
        String::new()
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {url}{authority}
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
    url: String,
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
        let (task, url) = if token.is_some() {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config()?));
            let task = tokio::spawn(serve_tls(listener, router, acceptor, stopped));
            (task, format!("https://{addr}"))
        } else {
            let task = tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await
            });
            (task, format!("http://{addr}"))
        };
        let kubeconfig = kubeconfig_with_token(&url, token.as_deref());
        Ok(Self {
            addr,
            url,
            kubeconfig,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (`https://` in rbac mode).
    pub fn url(&self) -> String {
        self.url.clone()
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

fn tls_config() -> io::Result<rustls::ServerConfig> {
    let certificate = CertificateDer::from(include_bytes!("tls/cert.der").to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(include_bytes!("tls/key.der").to_vec()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(vec![certificate], key)
        .map_err(io::Error::other)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves HTTP/1.1 over TLS until told to stop; open connections (watches) are cut when it returns.
async fn serve_tls(
    listener: TcpListener,
    router: axum::Router,
    acceptor: tokio_rustls::TlsAcceptor,
    mut stopped: oneshot::Receiver<()>,
) -> io::Result<()> {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => return Ok(()),
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let acceptor = acceptor.clone();
                let service = hyper_util::service::TowerToHyperService::new(router.clone());
                connections.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .with_upgrades()
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
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
