//! What one pod or node watch event costs the operator: each line of `watch_events/pods.jsonl` and
//! `watch_events/nodes.jsonl` (real watch lines, as the fake API server sends them during a rollout: driver
//! and toolkit pods, a GPU node with NFD's labels and managed fields) goes through the operator's own path
//! `--rounds` times: copied into a `String` (kube's `LinesCodec` does), decoded with
//! `serde_json::from_str::<WatchEvent<_>>` (as kube does), and applied to the pod or node table (the
//! projection, and its comparison with the record held). Prints the time per event.
//!
//! ```text
//! cargo run --release -p gpuop-operator --example watch_decode -- 20000
//! ```
//!
//! Other lines can be measured with `-- ROUNDS PODS.jsonl NODES.jsonl` (e.g. captured with
//! `curl -sN "$SERVER/api/v1/namespaces/gpu-operator/pods?watch=true"`).

use std::time::Instant;

use gpuop_operator::caches::{NodeTable, PodTable};
use gpuop_operator::projection::{Interner, WatchedNode, WatchedPod};
use kube::core::WatchEvent;
use kube::runtime::watcher;

const PODS: &str = include_str!("watch_events/pods.jsonl");
const NODES: &str = include_str!("watch_events/nodes.jsonl");

fn event<K>(line: &str) -> watcher::Event<K>
where
    K: serde::de::DeserializeOwned,
{
    // kube's line codec hands each line over as a `String` of its own.
    let line = line.to_owned();
    match serde_json::from_str::<WatchEvent<K>>(&line) {
        Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => watcher::Event::Apply(object),
        Ok(WatchEvent::Deleted(object)) => watcher::Event::Delete(object),
        Ok(_) => panic!("a watch line of a bookmark or an error: {line:.200}"),
        Err(error) => panic!("a watch line that does not decode: {error}"),
    }
}

/// Runs `each` over every line `rounds` times; prints nanoseconds per event.
fn measure(what: &str, lines: &[&str], rounds: u32, mut each: impl FnMut(&str)) {
    for line in lines {
        each(line);
    }
    let start = Instant::now();
    for _ in 0..rounds {
        for line in lines {
            each(line);
        }
    }
    let elapsed = start.elapsed();
    let events = f64::from(rounds) * lines.len() as f64;
    let bytes: usize = lines.iter().map(|l| l.len()).sum();
    println!(
        "{what:<34} {:>8.0} ns/event ({} lines, {:.1} KB a line)",
        elapsed.as_nanos() as f64 / events,
        lines.len(),
        bytes as f64 / lines.len() as f64 / 1000.0,
    );
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.trim().is_empty()).collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: u32 = args.next().and_then(|r| r.parse().ok()).unwrap_or(20_000);
    let read = |path: Option<String>, default: &str| match path {
        Some(path) => std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")),
        None => default.to_owned(),
    };
    let pods_text = read(args.next(), PODS);
    let nodes_text = read(args.next(), NODES);
    let pods = lines(&pods_text);
    let nodes = lines(&nodes_text);

    let mut interner = Interner::default();
    measure("pod: decode", &pods, rounds, |line| {
        drop(event::<WatchedPod>(line));
    });
    let mut table = PodTable::default();
    measure("pod: decode and apply", &pods, rounds, |line| {
        table.apply(&event::<WatchedPod>(line), &mut interner);
    });
    measure("node: decode", &nodes, rounds, |line| {
        drop(event::<WatchedNode>(line));
    });
    let mut table = NodeTable::default();
    measure("node: decode and apply", &nodes, rounds, |line| {
        table.apply(&event::<WatchedNode>(line), &mut interner);
    });
}
