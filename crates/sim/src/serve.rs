//! `gpu-sim serve`: the fake API server on loopback until interrupted.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use gpuop_fakeserver::{FakeServer, Faults, PodTermination};

use crate::cli::{self, ServeArgs};

/// The server the arguments describe, loaded and ready to serve.
pub fn build(args: &ServeArgs) -> anyhow::Result<FakeServer> {
    let mut faults = Faults::new(args.seed);
    for rule in &args.faults {
        faults = faults.rule(rule.clone());
    }
    if let Some(events) = args.drop_watches_after {
        faults = faults.drop_watches_after(events);
    }
    let server = FakeServer::builder()
        .seed(args.seed)
        .history(args.history)
        .bookmark_interval(Duration::from_secs(args.bookmark_seconds.max(1)))
        .pod_termination(match args.pod_termination {
            cli::PodTermination::Immediate => PodTermination::Immediate,
            cli::PodTermination::Kubelet => PodTermination::Kubelet,
        })
        .faults(faults)
        .authorization(args.authorization.into())
        .build();
    if !args.load.is_empty() {
        let count = server.load_paths(&args.load).context("--load")?;
        tracing::info!(count, paths = ?args.load, "loaded objects");
    }
    Ok(server)
}

/// Serves `server` on 127.0.0.1:`port` (0 picks a free one), writing a kubeconfig for it to
/// `kubeconfig_out` when given.
pub async fn listen(
    server: &FakeServer,
    port: u16,
    kubeconfig_out: Option<&Path>,
) -> anyhow::Result<gpuop_fakeserver::Running> {
    let running = server
        .serve(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
        .with_context(|| format!("listening on 127.0.0.1:{port}"))?;
    if let Some(path) = kubeconfig_out {
        running
            .write_kubeconfig(path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(running)
}

/// Serves until SIGINT or SIGTERM.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let server = build(&args)?;
    let running = listen(&server, args.port, args.kubeconfig_out.as_deref()).await?;
    // One line on stdout that scripts can read; logs go to stderr.
    println!("{}", running.url());
    tracing::info!(url = %running.url(), kubeconfig = ?args.kubeconfig_out, "serving the fake API server");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    running.shutdown().await;
    Ok(())
}
