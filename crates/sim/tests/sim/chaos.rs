//! `gpu-sim chaos` on a few short seeds: two operator replicas (the `gpu-operator` binary beside
//! `gpu-sim`, which `cargo test --workspace` builds; for this package alone run `cargo build --bins`
//! first) under injected faults, every invariant held and the cluster converged at the end. The seeds run
//! side by side, each its own `gpu-sim` with its own API server and replicas.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Instant;

/// The seeds and how long each injects faults. Each run lasts its duration, then at least 30 s more (the
/// operator's writes are judged over a calm window that starts 20 s after the last change).
///
/// Between them they drop watches and force 410s, hang the leading replica's Lease requests past its lease
/// (seeds 1, 2 and 9: it must stop writing before the other takes over, and lead again afterwards), kill
/// a replica, fail drivers and raise an XID, taint and remove nodes, edit managed DaemonSets' images (seeds
/// 1, 2 and 11: the edit is reverted), delete a managed DaemonSet, edit the policy and answer 500 and 429.
const SEEDS: [u64; 4] = [1, 2, 9, 11];
const DURATION: &str = "20s";

fn gpu_sim() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpu-sim"))
}

fn operator() -> PathBuf {
    let binary = gpu_sim().with_file_name("gpu-operator");
    assert!(
        binary.exists(),
        "{} is missing: `cargo test --workspace` builds it; for this package alone run `cargo build --bins` first",
        binary.display()
    );
    binary
}

fn text(output: &Output) -> String {
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn short_seeds_hold_every_invariant_and_converge() {
    let operator = operator();
    let started = Instant::now();
    let runs: Vec<(u64, std::thread::JoinHandle<Output>)> = SEEDS
        .iter()
        .map(|seed| {
            let operator = operator.clone();
            let seed = *seed;
            let run = std::thread::spawn(move || {
                Command::new(gpu_sim())
                    .args(["chaos", "--seed", &seed.to_string(), "--duration", DURATION])
                    .arg("--operator")
                    .arg(&operator)
                    .output()
                    .expect("gpu-sim chaos runs")
            });
            (seed, run)
        })
        .collect();
    let mut failures = Vec::new();
    for (seed, run) in runs {
        let output = run.join().expect("the run's thread");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let passed = output.status.success()
            && stdout.contains(&format!("gpu-sim chaos: seed {seed},"))
            && stdout.contains(&format!("chaos: passed, seed {seed}:"))
            && stdout.contains(&format!(
                "replay: gpu-sim chaos --seed {seed} --duration 20s --nodes 4"
            ))
            && stdout.contains("inject: ");
        if !passed {
            failures.push(format!("seed {seed}:\n{}", text(&output)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!(
        "{} seeds of {DURATION} passed in {:.0}s",
        SEEDS.len(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_missing_operator_binary_is_named_with_the_way_out() {
    let output = Command::new(gpu_sim())
        .args([
            "chaos",
            "--seed",
            "1",
            "--duration",
            "1",
            "--operator",
            "/nonexistent/gpu-operator",
        ])
        .output()
        .expect("gpu-sim runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        stderr.contains("the operator binary /nonexistent/gpu-operator does not exist")
            && stderr.contains("--operator PATH"),
        "{}",
        text(&output)
    );
}
