//! Black-box tests of the `gpu-operator` binary.

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

mod crd {
    use super::*;

    /// `UPDATE_GOLDEN=1 cargo test -p gpuop-operator` rewrites the committed CRDs.
    #[test]
    fn committed_crds_match_the_types() {
        let output = gpu_operator(&["crd"]);
        assert!(output.status.success());
        let generated = stdout(&output);
        let committed_path = repo_root().join("deploy/crds/gpu-operator-crds.yaml");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&committed_path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
        assert!(
            committed == generated,
            "deploy/crds/gpu-operator-crds.yaml is stale; regenerate it with `UPDATE_GOLDEN=1 cargo test -p gpuop-operator`"
        );
        assert_eq!(generated.matches("kind: CustomResourceDefinition").count(), 2);
        assert!(generated.contains("name: clusterpolicies.nvidia.com"));
        assert!(generated.contains("name: nvidiadrivers.nvidia.com"));
    }
}

mod check {
    use super::*;

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
        let dir = tempfile::tempdir().unwrap();
        let sample = std::fs::read_to_string(repo_root().join("deploy/samples/clusterpolicy.yaml")).unwrap();
        let broken = sample
            .replace("strategy: single", "strategy: double")
            .replace("  psa:\n", "  pas:\n")
            .replace("maxUnavailable: \"1\"", "maxUnavailable: \"0\"");
        let file = dir.path().join("broken.yaml");
        std::fs::write(&file, format!("{sample}---\n{broken}")).unwrap();
        let output = gpu_operator(&["check", "-f", file.to_str().unwrap()]);
        let text = stdout(&output);
        assert_eq!(output.status.code(), Some(1), "{text}");
        let name = file.display();
        let second_document_line = sample.lines().count() + 2;
        for line in [
            format!("{name}: document 1 (line 1) ClusterPolicy \"cluster-policy\": valid"),
            format!("{name}: document 2 (line {second_document_line}) ClusterPolicy \"cluster-policy\": invalid"),
            r#"  error: spec.mig.strategy: "double" is not one of [none, single, mixed]"#.to_owned(),
            r#"  error: spec.pas: unknown field; the API server would silently drop it (did you mean "psa"?)"#.to_owned(),
            r#"  error: spec.daemonsets.rollingUpdate.maxUnavailable: "0" must not be 0: a DaemonSet could never replace a pod"#.to_owned(),
            "2 checked: 1 valid, 1 invalid (3 errors, 0 warnings)".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
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

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ns.yaml");
        std::fs::write(&file, "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n").unwrap();
        let output = gpu_operator(&["check", "-f", file.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(1));
        assert!(stdout(&output).ends_with("no ClusterPolicy or NVIDIADriver found\n"));
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
