//! `gpu-sim serve` (or `up`) as a child process with its own kubeconfig, shared by the tests that drive it
//! with real command-line tools (kubectl, helm).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

pub(crate) const KUBECTL: &str = "/usr/bin/kubectl";

/// The repository's root, where the documentation's commands run.
pub(crate) fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata")
        .join(name)
}

/// The stdout of `tool` run with `args`, failing the test with both its streams if it failed.
pub(crate) fn succeeded(tool: &str, args: &[&str], output: &Output) -> String {
    assert!(
        output.status.success(),
        "{tool} {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The first line `output` gives, newline and all, sent once read by a thread of its own (so that the
/// caller can stop waiting for it).
pub(crate) fn first_line(output: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(output).read_line(&mut line);
        let _ = sender.send(line);
    });
    receiver
}

/// How long a test waits for what it expects before failing: a guard against hanging, not a timing.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// Runs `check` until it succeeds; fails the test with what it saw last once [`PATIENCE`] is spent.
pub(crate) fn eventually<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        match check() {
            Ok(value) => return value,
            Err(seen) => assert!(
                std::time::Instant::now() < deadline,
                "{what}: still not so after {PATIENCE:?}; last seen: {seen}"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `gpu-sim serve` (or `up`) in a temporary directory, with kubectl pointed at it; stopped when dropped.
/// Or kubectl pointed at an API server the test runs itself ([`Cluster::attached`]).
pub(crate) struct Cluster {
    server: Option<Child>,
    dir: TempDir,
}

impl Cluster {
    /// Starts `gpu-sim serve` for a test that drives it with kubectl; fails when kubectl is missing.
    pub(crate) fn start(extra: &[&str]) -> Self {
        Self::launch(&["serve", "--port", "0"], extra)
    }

    /// Starts `gpu-sim serve --authorization rbac`: its kubeconfig is the admin's (`kubernetes-admin` in
    /// `system:masters`); other identities come from `kubectl create token`.
    pub(crate) fn start_rbac(extra: &[&str]) -> Self {
        Self::launch(&["serve", "--port", "0", "--authorization", "rbac"], extra)
    }

    /// Starts `gpu-sim up --instant --authorization rbac`.
    pub(crate) fn up_rbac(extra: &[&str]) -> Self {
        Self::launch(&["up", "--instant", "--authorization", "rbac"], extra)
    }

    /// Starts `gpu-sim up --instant` (the demo cluster unless `extra` names a scenario) for a test that
    /// drives it with kubectl; fails when kubectl is missing.
    pub(crate) fn up(extra: &[&str]) -> Self {
        Self::launch(&["up", "--instant"], extra)
    }

    /// kubectl (and helm) pointed at an API server the test runs, through `kubeconfig`.
    pub(crate) fn attached(kubeconfig: &str) -> Self {
        assert!(Path::new(KUBECTL).exists(), "{KUBECTL} is not installed");
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join("kubeconfig"), kubeconfig).expect("kubeconfig written");
        Self { server: None, dir }
    }

    fn launch(command: &[&str], extra: &[&str]) -> Self {
        assert!(
            Path::new(KUBECTL).exists(),
            "{KUBECTL} is not installed: this test drives gpu-sim with the real kubectl; `.ci/run` installs it \
             (or: apt-get install kubectl)"
        );
        Self::spawn(command, extra)
    }

    /// Starts `gpu-sim serve` whatever tools are installed, for tests that require theirs and fail
    /// without it.
    pub(crate) fn serve(extra: &[&str]) -> Self {
        Self::spawn(&["serve", "--port", "0"], extra)
    }

    fn spawn(command: &[&str], extra: &[&str]) -> Self {
        Self::spawn_from(Path::new("."), command, extra)
    }

    /// Starts a `gpu-sim` command line as a documentation page shows it (`args` after `gpu-sim`, with
    /// `--kubeconfig-out` and its file left out), run from the repository's root as the page's paths
    /// assume.
    pub(crate) fn documented(args: &[&str]) -> Self {
        assert!(Path::new(KUBECTL).exists(), "{KUBECTL} is not installed");
        Self::spawn_from(&repository_root(), args, &[])
    }

    fn spawn_from(cwd: &Path, command: &[&str], extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let kubeconfig = dir.path().join("kubeconfig");
        let mut server = Command::new(env!("CARGO_BIN_EXE_gpu-sim"))
            .current_dir(cwd)
            .args(command)
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("gpu-sim starts");
        let stdout = server.stdout.take().expect("stdout");
        let url = first_line(stdout)
            .recv_timeout(Duration::from_secs(30))
            .expect("gpu-sim prints its address");
        assert!(
            url.starts_with("http://127.0.0.1:") || url.starts_with("https://127.0.0.1:"),
            "unexpected first line {url:?}"
        );
        assert!(
            kubeconfig.exists(),
            "the kubeconfig is written before the address is printed"
        );
        Self {
            server: Some(server),
            dir,
        }
    }

    /// The kubeconfig kubectl and helm use.
    pub(crate) fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The cluster's temporary directory, removed with it.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(KUBECTL);
        command
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .arg("--request-timeout=30s")
            .args(args);
        command
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("kubectl runs")
    }

    /// Runs kubectl and returns its stdout, failing the test if it fails.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        succeeded("kubectl", args, &self.run(args))
    }

    pub(crate) fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&args)).expect("kubectl prints JSON")
    }

    /// The items of `kubectl get <what> -o json`.
    pub(crate) fn items(&self, args: &[&str]) -> Vec<Value> {
        self.json(args)["items"].as_array().cloned().unwrap_or_default()
    }

    pub(crate) fn write(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("written");
        path.display().to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(server) = &mut self.server {
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}
