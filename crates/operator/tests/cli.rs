//! Black-box tests of the `gpu-operator` binary, and of the Helm chart that installs it (`chart`, in
//! `cli/chart.rs`, with the pinned Helm found through `scripts/tools.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gpu_operator(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(args)
        .current_dir(repo_root())
        // Image defaults from the environment would change the verdicts.
        .env_clear()
        .output()
        .expect("gpu-operator runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Asserts that the command exited 0, showing what it printed where it did not.
fn assert_exited_0(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{}{stderr}", stdout(output));
}

#[path = "cli/chart.rs"]
mod chart;
#[path = "../../../scripts/tools.rs"]
mod tools;

mod crd {
    use super::*;

    /// `UPDATE_GOLDEN=1 cargo test -p gpuop-operator` rewrites the committed CRDs: the generated file and
    /// the Helm chart's copy in its `crds/` (Helm installs CRDs only from there, so the chart needs a copy).
    #[test]
    fn committed_crds_match_the_types() {
        let output = gpu_operator(&["crd"]);
        assert!(output.status.success());
        let generated = stdout(&output);
        for committed in [
            "deploy/crds/gpu-operator-crds.yaml",
            "deploy/helm/gpu-operator/crds/gpu-operator-crds.yaml",
        ] {
            let committed_path = repo_root().join(committed);
            if std::env::var_os("UPDATE_GOLDEN").is_some() {
                std::fs::write(&committed_path, &generated).unwrap();
            }
            let text = std::fs::read_to_string(&committed_path).unwrap_or_default();
            assert!(
                text == generated,
                "{committed} is stale; regenerate it with `UPDATE_GOLDEN=1 cargo test -p gpuop-operator`"
            );
        }
        assert_eq!(generated.matches("kind: CustomResourceDefinition").count(), 2);
        assert!(generated.contains("name: clusterpolicies.nvidia.com"));
        assert!(generated.contains("name: nvidiadrivers.nvidia.com"));
    }
}

/// The hook subcommands against a cluster that refuses connections: they fail naming what they could not do.
mod hooks {
    use super::*;

    /// A kubeconfig in `dir` for port 1 on loopback: nothing listens, so every request is refused at once.
    fn unreachable_kubeconfig(dir: &std::path::Path) -> PathBuf {
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:1'}\n\
             users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n\
             current-context: x\n",
        )
        .unwrap();
        kubeconfig
    }

    fn with_unreachable_cluster(args: &[&str]) -> Output {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = unreachable_kubeconfig(dir.path());
        Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .args(args)
            .env_clear()
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::null())
            .output()
            .expect("gpu-operator runs")
    }

    #[test]
    fn crd_apply_names_the_crd_it_could_not_read_and_exits_1() {
        let output = with_unreachable_cluster(&["crd", "--apply", "--timeout-seconds", "5"]);
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("CustomResourceDefinition clusterpolicies.nvidia.com: cannot read"),
            "{stderr}"
        );
        assert_eq!(stdout(&output), "", "nothing was applied");
    }

    #[test]
    fn uninstall_that_cannot_read_the_cluster_exits_2() {
        let output = with_unreachable_cluster(&[
            "uninstall",
            "--namespace",
            "gpu-operator",
            "--timeout-seconds",
            "5",
        ]);
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("gpu-operator uninstall: cannot list ClusterPolicy"),
            "{stderr}"
        );
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// The status line of `GET path`, once something answers on `port`.
    fn http_status(port: u16, path: &str) -> Option<String> {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        response.lines().next().map(str::to_owned)
    }

    /// `run` against a cluster that never answers, stopped with SIGTERM: it never claims to be ready, and
    /// its logs, written to a pipe, carry no colour codes.
    #[test]
    fn run_stopped_before_the_caches_synced_never_says_ready_nor_colours_a_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = unreachable_kubeconfig(dir.path());
        let health = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .args([
                "run",
                "--namespace",
                "gpu-operator",
                "--metrics-bind-address",
                "127.0.0.1:0",
            ])
            .arg("--health-probe-bind-address")
            .arg(format!("127.0.0.1:{health}"))
            .env_clear()
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let readyz = loop {
            if let Some(status) = http_status(health, "/readyz") {
                break status;
            }
            assert!(std::time::Instant::now() < deadline, "/readyz never answered");
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        assert!(readyz.contains(" 503 "), "{readyz}");
        let stopped = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        assert!(stderr.contains("shutting down"), "{stderr}");
        assert!(!stderr.contains("ready"), "it never synced, yet says:\n{stderr}");
        assert!(!stderr.contains('\u{1b}'), "colour codes in a pipe:\n{stderr}");
    }

    #[test]
    fn the_timeout_needs_apply_and_uninstall_needs_a_namespace() {
        assert_eq!(
            gpu_operator(&["crd", "--timeout-seconds", "5"]).status.code(),
            Some(2)
        );
        assert_eq!(gpu_operator(&["uninstall"]).status.code(), Some(2));
    }
}

mod check {
    use super::*;

    /// Runs `gpu-operator check -f` on a file `name` that holds `contents`; returns the file's path as the
    /// report prints it, and the run.
    fn check_written(name: &str, contents: &str) -> (String, Output) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        std::fs::write(&file, contents).unwrap();
        let output = gpu_operator(&["check", "-f", file.to_str().unwrap()]);
        (file.display().to_string(), output)
    }

    /// Asserts that each of `lines` is a whole line of `text`.
    fn assert_lines(text: &str, lines: impl IntoIterator<Item = String>) {
        for line in lines {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn the_samples_are_valid() {
        let output = gpu_operator(&[
            "check",
            "-f",
            "deploy/samples/clusterpolicy.yaml",
            "deploy/samples/clusterpolicy-mig-mixed-time-slicing.yaml",
            "deploy/samples/clusterpolicy-preinstalled-driver.yaml",
            "deploy/samples/nvidiadrivers.yaml",
        ]);
        let text = stdout(&output);
        assert_eq!(output.status.code(), Some(0), "{text}");
        assert!(
            text.contains(
                "deploy/samples/nvidiadrivers.yaml: document 2 (line 28) NVIDIADriver \"h100-pool\": valid"
            ),
            "{text}"
        );
        assert!(
            text.contains("ConfigMap \"time-slicing-config\": skipped"),
            "{text}"
        );
        assert!(
            text.ends_with("6 checked: 6 valid, 0 invalid (0 errors, 0 warnings)\n"),
            "{text}"
        );
    }

    #[test]
    fn problems_are_printed_with_file_document_and_path() {
        let sample = std::fs::read_to_string(repo_root().join("deploy/samples/clusterpolicy.yaml")).unwrap();
        let broken = sample
            .replace("strategy: single", "strategy: double")
            .replace("  psa:\n", "  pas:\n")
            .replace("maxUnavailable: \"1\"", "maxUnavailable: \"0\"");
        let (name, output) = check_written("broken.yaml", &format!("{sample}---\n{broken}"));
        let text = stdout(&output);
        assert_eq!(output.status.code(), Some(1), "{text}");
        let second_document_line = sample.lines().count() + 2;
        let lines = [
            format!("{name}: document 1 (line 1) ClusterPolicy \"cluster-policy\": valid"),
            format!("{name}: document 2 (line {second_document_line}) ClusterPolicy \"cluster-policy\": invalid"),
            r#"  error: spec.mig.strategy: "double" is not one of [none, single, mixed]"#.to_owned(),
            r#"  error: spec.pas: unknown field; the API server would silently drop it (did you mean "psa"?)"#.to_owned(),
            r#"  error: spec.daemonsets.rollingUpdate.maxUnavailable: "0" must not be 0: a DaemonSet could never replace a pod"#.to_owned(),
            "2 checked: 1 valid, 1 invalid (3 errors, 0 warnings)".to_owned(),
        ];
        assert_lines(&text, lines);
    }

    #[test]
    fn standard_input_is_read_for_a_dash() {
        let sample = std::fs::read(repo_root().join("deploy/samples/nvidiadrivers.yaml")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .args(["check", "-f", "-"])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &sample).unwrap();
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
        assert!(stdout(&output).contains("-: document 1 (line 1) NVIDIADriver \"default\": valid"));
    }

    #[test]
    fn an_unreadable_file_exits_2_and_nothing_found_exits_1() {
        let output = gpu_operator(&["check", "-f", "no/such/file.yaml"]);
        assert_eq!(output.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&output.stderr).contains("no/such/file.yaml: cannot read"));

        let namespace = "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n";
        let (_, output) = check_written("ns.yaml", namespace);
        assert_eq!(output.status.code(), Some(1));
        assert!(stdout(&output).ends_with("no ClusterPolicy or NVIDIADriver found\n"));
    }

    /// Issue 12: a wrong type, an operator rule and a warning in one file are all reported, and a YAML
    /// syntax error says where it is in the file.
    #[test]
    fn a_wrong_type_does_not_hide_the_other_problems() {
        let sample = std::fs::read_to_string(repo_root().join("deploy/samples/clusterpolicy.yaml")).unwrap();
        let broken = sample
            .replacen("version: \"595.91.07\"", "version: 595", 1)
            .replacen(
                "    version: v0.20.0\n    imagePullPolicy: IfNotPresent\n",
                "    version: v0.20.0\n    imagePullPolicy: Sometimes\n    config: {default: any}\n",
                1,
            );
        assert_ne!(broken, sample);
        let contents = format!("{broken}---\nkind: ClusterPolicy\nspec: [\n");
        let (name, output) = check_written("policy.yaml", &contents);
        let text = stdout(&output);
        assert_eq!(output.status.code(), Some(1), "{text}");
        let syntax_line = broken.lines().count() + 3;
        let lines = [
            format!("{name}: document 1 (line 1) ClusterPolicy \"cluster-policy\": invalid"),
            "  error: spec.driver.version: 595 is an integer, expected a string".to_owned(),
            "  error: spec.devicePlugin.config.name: required when spec.devicePlugin.config.default is set: the default names a key of that ConfigMap".to_owned(),
            r#"  warning: spec.devicePlugin.imagePullPolicy: "Sometimes" is not Always, Never or IfNotPresent; it is treated as IfNotPresent"#.to_owned(),
            format!("  error: not valid YAML: line {syntax_line} column 7: unclosed bracket '['"),
        ];
        assert_lines(&text, lines);
    }

    #[test]
    fn a_folder_is_read_like_kubectl_apply_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let sample = std::fs::read_to_string(repo_root().join("deploy/samples/clusterpolicy.yaml")).unwrap();
        std::fs::write(dir.path().join("policy.yaml"), &sample).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
        std::fs::create_dir(dir.path().join("drivers")).unwrap();
        std::fs::copy(
            repo_root().join("deploy/samples/nvidiadrivers.yaml"),
            dir.path().join("drivers/nvidiadrivers.yml"),
        )
        .unwrap();
        let folder = dir.path().to_str().unwrap();
        let output = gpu_operator(&["check", "-f", folder]);
        assert_exited_0(&output);
        let text = stdout(&output);
        assert!(
            text.starts_with(&format!(
                "{folder}/policy.yaml: document 1 (line 1) ClusterPolicy"
            )),
            "{text}"
        );
        assert!(
            text.ends_with("1 checked: 1 valid, 0 invalid (0 errors, 0 warnings)\n"),
            "{text}"
        );
        let output = gpu_operator(&["check", "-R", "-f", folder]);
        let text = stdout(&output);
        assert_eq!(output.status.code(), Some(0), "{text}");
        assert!(
            text.contains(&format!(
                "{folder}/drivers/nvidiadrivers.yml: document 1 (line 1) NVIDIADriver"
            )),
            "{text}"
        );
    }

    /// A reader that stops early (`| head`) ends the output; that is no crash, and has no stack trace even
    /// under RUST_BACKTRACE=1.
    #[test]
    fn a_closed_stdout_is_one_line_not_a_stack_trace() {
        let sample = repo_root().join("deploy/samples/clusterpolicy.yaml");
        let sample = sample.to_str().unwrap();
        // The reader is gone before the first write: reports are printed only after every file is checked.
        let files = vec![sample; 3];
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .arg("check")
            .arg("-f")
            .args(&files)
            .env_clear()
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert_eq!(
            stderr.trim_end(),
            "gpu-operator check: cannot write: Broken pipe (os error 32)"
        );
    }

    #[test]
    fn images_may_come_from_the_operators_environment() {
        let dir = tempfile::tempdir().unwrap();
        let sample = std::fs::read_to_string(
            repo_root().join("deploy/samples/clusterpolicy-preinstalled-driver.yaml"),
        )
        .unwrap();
        let file = dir.path().join("no-gfd-image.yaml");
        std::fs::write(&file, sample.replace("  gfd:\n    enabled: true\n    repository: nvcr.io/nvidia\n    image: k8s-device-plugin\n    version: v0.20.0\n", "  gfd:\n    enabled: true\n")).unwrap();
        let path = file.to_str().unwrap();
        let output = gpu_operator(&["check", "-f", path]);
        assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
        assert!(stdout(&output).contains("spec.gfd.image: required (with repository and version) because gpu-feature-discovery is enabled, unless GFD_IMAGE is set"));
        let output = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .args(["check", "-f", path])
            .env_clear()
            .env("GFD_IMAGE", "nvcr.io/nvidia/k8s-device-plugin:v0.20.0")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    }
}

mod render {
    use super::*;

    /// The facts file example in docs/render.md, the YAML block after its `facts-example` marker.
    fn documented_facts() -> String {
        let doc = std::fs::read_to_string(repo_root().join("docs/render.md")).unwrap();
        let after = doc
            .split("<!-- facts-example")
            .nth(1)
            .expect("docs/render.md has the facts example");
        let block = after.split("```yaml\n").nth(1).unwrap();
        block.split("```").next().unwrap().to_owned()
    }

    /// Renders the sample ClusterPolicy with a facts file that holds `facts`.
    fn render_with_facts(facts: &str) -> Output {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("facts.yaml");
        std::fs::write(&file, facts).unwrap();
        let file = file.to_str().unwrap();
        gpu_operator(&[
            "render",
            "-f",
            "deploy/samples/clusterpolicy.yaml",
            "--facts",
            file,
        ])
    }

    #[test]
    fn the_documented_facts_file_renders() {
        let output = render_with_facts(&documented_facts());
        assert_exited_0(&output);
        let text = stdout(&output);
        // Two OS pools, CRI-O, the ServiceMonitor CRD: each fact shows in what is rendered.
        assert!(text.contains("name: nvidia-driver-daemonset-rhel9"), "{text}");
        assert!(
            text.contains("name: nvidia-driver-daemonset-ubuntu22.04"),
            "{text}"
        );
        assert!(text.contains("value: crio"), "{text}");
        assert!(text.contains("kind: ServiceMonitor"), "{text}");
    }

    #[test]
    fn an_unknown_facts_key_is_named_with_its_place_and_the_accepted_keys() {
        let output = render_with_facts(&documented_facts().replace("runtime: crio", "runtme: crio"));
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(
                "line 2 column 1: unknown field `runtme`, expected one of namespace, runtime, driverPools, serviceMonitorCrd, configMapKeys"
            ),
            "{stderr}"
        );
        let output = render_with_facts(&documented_facts().replace("kernel:", "kernl:"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("unknown field `kernl`, expected one of osId, osVersion, kernel"),
            "{stderr}"
        );
    }
}

mod diff_live {
    use super::*;

    #[test]
    fn without_a_cluster_it_exits_2_and_says_why() {
        let output = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .args(["render", "--diff-live"])
            .env_clear()
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("cannot reach the cluster"), "{stderr}");
    }

    #[test]
    fn a_policy_file_and_the_live_cluster_are_not_both_rendered() {
        let output = gpu_operator(&["render", "--diff-live", "-f", "deploy/samples/clusterpolicy.yaml"]);
        assert_eq!(output.status.code(), Some(2), "a usage error");
    }
}
