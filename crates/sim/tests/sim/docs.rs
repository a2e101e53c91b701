//! Every console example in `README.md` and `docs/*.md` run as written, so a documented example cannot
//! break again (issue 12).
//!
//! A console block is a fenced block tagged `sh`, `bash`, `shell` or `console`, or an untagged one with a
//! `$ ` prompt. In a `sh` block every line (joined over trailing `\`) is a command; in a prompt block the
//! lines after `$ ` are commands and the lines under one are its output, which the real output must
//! contain, in order (a shown line matches a real line that holds its text; `...` in a shown line matches
//! anything, and a line of only `...` is skipped). Every command must exit 0 unless the block says
//! otherwise. Untagged blocks without a prompt are output or text, not run.
//!
//! The command text is run with `bash` in a fresh directory that holds links to the repository's top-level
//! entries (so `deploy/samples/...` reads as written and files written land in the directory), with `HOME`
//! there (no kubeconfig of yours is read), and with the repository's debug binaries first on `PATH`:
//! `gpu-sim` (this package's), and `gpu-operator` and `kubectl-gpu` beside it in the target directory,
//! which `cargo test --workspace` builds before any test runs (the operator's and doctor's tests need
//! them; a lone `cargo test -p gpuop-sim` uses whatever is there, so run `cargo build --bins` first).
//! `kubectl gpu` is the real kubectl (`/usr/bin/kubectl`, as in the other tests) finding the
//! `kubectl-gpu` plugin on `PATH`. `export` lines hold for the rest of their block.
//! Rewritten before running, and listed in the summary: `cargo run --release --bin X --` and
//! `target/release/X` become `X`; `/tmp/` becomes the directory's `tmp/`; a command that starts with
//! `cargo build` or `cargo test` is not run (this test run is that build and those tests).
//!
//! A marker, an HTML comment on the last non-blank line before the block, says how to treat a block:
//! - `<!-- docs-test: skip REASON -->`: not run; the reason is printed in the summary;
//! - `<!-- docs-test: expect-exit N -->`: every command of the block exits with N;
//! - `<!-- docs-test: file NAME -->`: the block is not run; its text is written to NAME for later blocks;
//! - `<!-- docs-test: background -->`: the block's commands that run until stopped (`gpu-sim up`/`serve`,
//!   `gpu-operator run`, a trailing `&`) are started in the background and stopped, with what they started,
//!   when the block ends; a `gpu-sim` server is waited for until it prints its address, its first line,
//!   which must hold the output the document shows for it. `helm` is the pinned one (`scripts/tools`);
//! - `<!-- docs-test: cluster -->`: the block runs against a simulated cluster with `KUBECONFIG` set:
//!   `gpu-sim up --instant --with-operator` with `deploy/samples/clusterpolicy.yaml` applied, started on
//!   the first such block of a file and kept for the file's later ones.
//!
//! Commands that would run forever or change a real machine or cluster (`gpu-sim up`/`serve`,
//! `gpu-operator run`, a trailing `&`, `-w`, `helm`, `docker`, `apt-get`, `rustup`) fail the test unless
//! their block is marked `skip` or `background`: nothing is left out silently. Every command is killed after
//! [`COMMAND_TIMEOUT`].

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::cluster::{Cluster, KUBECTL};

/// How long one documented command may run: the demo takes about 12 s in a debug build and gives up by
/// itself after 120 s, which says more than a kill would.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(180);

/// The documents whose console blocks are run.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

/// How a block is treated, from the marker before it.
#[derive(Debug, Clone, PartialEq)]
enum Marker {
    None,
    Skip(String),
    ExpectExit(i32),
    File(String),
    Background,
    Cluster,
}

fn parse_marker(line: &str) -> Result<Option<Marker>, String> {
    let Some(rest) = line.trim().strip_prefix("<!-- docs-test:") else {
        return Ok(None);
    };
    let body = rest
        .strip_suffix("-->")
        .ok_or_else(|| format!("marker not closed on its line: {line:?}"))?
        .trim();
    let (word, argument) = body.split_once(' ').unwrap_or((body, ""));
    let argument = argument.trim();
    let marker = match word {
        "skip" if !argument.is_empty() => Marker::Skip(argument.to_owned()),
        "expect-exit" => Marker::ExpectExit(
            argument
                .parse()
                .map_err(|_| format!("expect-exit needs a number: {line:?}"))?,
        ),
        "file" if !argument.is_empty() => Marker::File(argument.to_owned()),
        "background" => Marker::Background,
        "cluster" => Marker::Cluster,
        _ => {
            return Err(format!(
                "unknown marker {line:?}: expected skip REASON, expect-exit N, file NAME, background or cluster"
            ));
        }
    };
    Ok(Some(marker))
}

/// One command of a block and the output the document shows for it.
#[derive(Debug, Clone, PartialEq)]
struct Step {
    command: String,
    shown: Vec<String>,
}

#[derive(Debug)]
struct Block {
    /// `file:line` of the opening fence.
    place: String,
    marker: Marker,
    /// The block's text, for `file` markers.
    text: String,
    steps: Vec<Step>,
}

/// The blocks of one document that a marker or a console tag makes the runner's business.
fn blocks(name: &str, markdown: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut found = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let trimmed = lines[index].trim_start();
        let Some(tag) = trimmed.strip_prefix("```") else {
            index += 1;
            continue;
        };
        let indent = lines[index].len() - trimmed.len();
        let tag = tag.trim();
        let start = index;
        let mut end = index + 1;
        while end < lines.len() && lines[end].trim() != "```" {
            end += 1;
        }
        let body: Vec<&str> = lines[start + 1..end.min(lines.len())]
            .iter()
            .map(|line| line.get(indent..).unwrap_or(line.trim_start()))
            .collect();
        index = end + 1;

        let marker = lines[..start]
            .iter()
            .rev()
            .find(|line| !line.trim().is_empty())
            .map(|line| parse_marker(line))
            .transpose()
            .map_err(|error| format!("{name}:{start}: {error}"))?
            .flatten();
        let prompt = body.iter().any(|line| line.starts_with("$ "));
        let console = matches!(tag, "sh" | "bash" | "shell" | "console") || (tag.is_empty() && prompt);
        if !console && marker.is_none() {
            continue;
        }
        let steps = if prompt {
            prompt_steps(&body)
        } else {
            script_steps(&body)
        };
        found.push(Block {
            place: format!("{name}:{}", start + 1),
            marker: marker.unwrap_or(Marker::None),
            text: body.iter().map(|line| format!("{line}\n")).collect(),
            steps,
        });
    }
    Ok(found)
}

/// A `sh` block: every line a command, continued over a trailing `\`; blank lines and comments dropped.
fn script_steps(body: &[&str]) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut current = String::new();
    for line in body {
        if current.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        current.push_str(line);
        if line.ends_with('\\') {
            current.push('\n');
        } else {
            steps.push(Step {
                command: std::mem::take(&mut current),
                shown: Vec::new(),
            });
        }
    }
    if !current.is_empty() {
        steps.push(Step {
            command: current,
            shown: Vec::new(),
        });
    }
    steps
}

/// A prompt block: `$ ` lines are commands (continued over a trailing `\`), the others their output.
fn prompt_steps(body: &[&str]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut continued = false;
    for line in body {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: command.to_owned(),
                shown: Vec::new(),
            });
            continued = command.ends_with('\\');
        } else if continued {
            let step = steps.last_mut().expect("a continued command");
            step.command.push('\n');
            step.command.push_str(line);
            continued = line.ends_with('\\');
        } else if let Some(step) = steps.last_mut() {
            step.shown.push((*line).to_owned());
        }
    }
    steps
}

/// The command as run here, or why it is not run.
fn rewrite(command: &str, work: &Path) -> Result<String, &'static str> {
    let trimmed = command.trim_start();
    if trimmed.starts_with("cargo build") {
        return Err("built by this test run");
    }
    if trimmed.starts_with("cargo test") {
        return Err("this test run is that run");
    }
    if without_comment(trimmed).starts_with("kill %") {
        // Each command runs in a shell of its own, without job control.
        return Err("the block's background commands are stopped when it ends");
    }
    let mut command = command.to_owned();
    for bin in ["gpu-sim", "gpu-operator", "kubectl-gpu"] {
        command = command
            .replace(&format!("cargo run --release --bin {bin} --"), bin)
            .replace(&format!("./target/release/{bin}"), bin)
            .replace(&format!("target/release/{bin}"), bin);
    }
    Ok(command.replace("/tmp/", &format!("{}/tmp/", work.display())))
}

/// The command without a trailing `# comment` (a `#` after a blank, outside quotes), trimmed at the end.
fn without_comment(command: &str) -> &str {
    let mut quote = None;
    let mut previous = ' ';
    for (at, character) in command.char_indices() {
        match (quote, character) {
            (None, '\'' | '"') => quote = Some(character),
            (Some(open), _) if character == open => quote = None,
            (None, '#') if previous.is_whitespace() => return command[..at].trim_end(),
            _ => {}
        }
        previous = character;
    }
    command.trim_end()
}

const RUNS_UNTIL_STOPPED: &str = "runs until stopped";

/// Why a command cannot run unmarked: it would run forever or change a real machine or cluster.
fn needs_marker(command: &str) -> Option<&'static str> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let has = |pair: [&str; 2]| words.windows(2).any(|window| window == pair);
    if has(["gpu-sim", "up"]) || has(["gpu-sim", "serve"]) || has(["gpu-operator", "run"]) {
        return Some(RUNS_UNTIL_STOPPED);
    }
    if without_comment(command).ends_with('&') || words.contains(&"-w") || words.contains(&"--watch") {
        return Some(RUNS_UNTIL_STOPPED);
    }
    if ["helm", "docker", "apt-get", "rustup"]
        .iter()
        .any(|tool| words.contains(tool))
    {
        return Some("installs into a real cluster or machine");
    }
    None
}

/// Whether the real output holds every shown line, in order; `Err` names the first line it lacks.
fn contains_shown(actual: &str, shown: &[String]) -> Result<(), String> {
    let mut lines = actual.lines();
    for expected in shown {
        let expected = expected.trim_end();
        if expected.trim().is_empty() || expected.trim() == "..." {
            continue;
        }
        let parts: Vec<&str> = expected.split("...").filter(|part| !part.is_empty()).collect();
        let matches = |line: &str| {
            let mut rest = line;
            parts.iter().all(|part| match rest.find(part) {
                Some(at) => {
                    rest = &rest[at + part.len()..];
                    true
                }
                None => false,
            })
        };
        if !lines.by_ref().any(matches) {
            return Err(expected.to_owned());
        }
    }
    Ok(())
}

/// The directory commands run in: links to the repository's top-level entries, `tmp/`, and `bin/` with
/// the binaries.
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new(root: &Path) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        for entry in std::fs::read_dir(root).expect("repository root") {
            let entry = entry.expect("root entry");
            let name = entry.file_name();
            if name == "target" || name == ".git" {
                continue;
            }
            std::os::unix::fs::symlink(entry.path(), dir.path().join(&name)).expect("link");
        }
        std::fs::create_dir(dir.path().join("tmp")).expect("tmp/");
        let bin = dir.path().join(".docs-test-bin");
        std::fs::create_dir(&bin).expect("bin/");
        let gpu_sim = PathBuf::from(env!("CARGO_BIN_EXE_gpu-sim"));
        let target = gpu_sim.parent().expect("target directory");
        // The kubectl the other tests use, when it is there; `kubectl gpu` finds its plugin on `PATH`.
        if Path::new(KUBECTL).exists() {
            std::os::unix::fs::symlink(KUBECTL, bin.join("kubectl")).expect("link kubectl");
        }
        for name in ["gpu-sim", "gpu-operator", "kubectl-gpu"] {
            let binary = target.join(name);
            assert!(
                binary.exists(),
                "{} is missing: `cargo test --workspace` builds it; for this package alone run `cargo build --bins` first",
                binary.display()
            );
            std::os::unix::fs::symlink(&binary, bin.join(name)).expect("link binary");
        }
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, text: &str, kubeconfig: Option<&Path>) -> Command {
        let helm = self.path().join(".docs-test-bin/helm");
        if text.split_whitespace().any(|word| word == "helm") && !helm.exists() {
            std::os::unix::fs::symlink(super::tools::helm(), &helm).expect("link helm");
        }
        let path = format!(
            "{}:{}",
            self.path().join(".docs-test-bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("bash");
        command
            .arg("-o")
            .arg("pipefail")
            .arg("-c")
            .arg(text)
            .current_dir(self.path())
            .env("PATH", path)
            .env("HOME", self.path())
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .env_remove("KUBECONFIG")
            // What the reader sees: no backtraces unless they asked for them.
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .stdin(Stdio::null());
        if let Some(kubeconfig) = kubeconfig {
            command.env("KUBECONFIG", kubeconfig);
        }
        command
    }
}

/// Stops a command's whole process group: the shell and what it started.
fn stop_group(child: &mut Child) {
    let _ = Command::new("kill")
        .arg("--")
        .arg(format!("-{}", child.id()))
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `command` to completion or [`COMMAND_TIMEOUT`]; returns its exit code (None when killed) and its
/// stdout and stderr together.
fn run_to_end(mut command: Command) -> (Option<i32>, String) {
    let output_file = tempfile::NamedTempFile::new().expect("output file");
    let mut child = command
        .stdout(output_file.reopen().expect("output"))
        .stderr(output_file.reopen().expect("output"))
        .process_group(0)
        .spawn()
        .expect("bash runs");
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if Instant::now() > deadline {
            stop_group(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = std::fs::read_to_string(output_file.path()).unwrap_or_default();
    (status, output)
}

/// A command of a `background` block, stopped (with what it started) when the block ends.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        stop_group(&mut self.0);
    }
}

/// Starts a command of a `background` block. A `gpu-sim` server is ready once it prints its address, and
/// that first line is returned; anything else must still be running after two seconds.
fn start_background(mut command: Command, server: bool) -> Result<(Background, String), String> {
    let output_file = tempfile::NamedTempFile::new().expect("output file");
    let child = command
        .stdout(Stdio::piped())
        .stderr(output_file.reopen().expect("output"))
        .process_group(0)
        .spawn()
        .map_err(|error| error.to_string())?;
    let mut started = Background(child);
    let stdout = started.0.stdout.take().expect("stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().and_then(Result::ok);
        let _ = sender.send(first);
        // Keep reading so that the command never blocks on a full pipe.
        for _ in lines {}
    });
    let stderr = || std::fs::read_to_string(output_file.path()).unwrap_or_default();
    if server {
        return match receiver.recv_timeout(Duration::from_secs(30)) {
            Ok(Some(line)) => Ok((started, line)),
            Ok(None) => Err(format!(
                "stopped before printing its address; it printed:\n{}",
                indent(&stderr())
            )),
            Err(_) => Err(format!(
                "printed nothing in 30 s; it printed:\n{}",
                indent(&stderr())
            )),
        };
    }
    std::thread::sleep(Duration::from_secs(2));
    match started.0.try_wait().expect("wait") {
        None => Ok((started, String::new())),
        Some(status) => Err(format!(
            "stopped at once ({status}); it printed:\n{}",
            indent(&stderr())
        )),
    }
}

/// The simulated cluster of `cluster` blocks: `gpu-sim up --instant --with-operator` and the sample policy.
fn start_cluster(workspace: &Workspace) -> Result<Cluster, String> {
    let cluster = Cluster::up(&["--with-operator"]);
    let kubeconfig = cluster.kubeconfig();
    let apply = "kubectl apply --server-side -f deploy/samples/clusterpolicy.yaml";
    // `gpu-sim up` prints its address before the operator has installed the CRDs, so the first applies
    // can be refused; this is the runner's setup, not a documented step, so it waits.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, output) = run_to_end(workspace.command(apply, Some(&kubeconfig)));
        if status == Some(0) {
            return Ok(cluster);
        }
        if Instant::now() > deadline {
            return Err(format!("`{apply}` failed for 30 s: {output}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[derive(Default)]
struct Summary {
    ran: Vec<String>,
    skipped: Vec<String>,
    failed: Vec<String>,
}

fn run_document(root: &Path, document: &Path, summary: &mut Summary) {
    let name = document
        .strip_prefix(root)
        .expect("under the root")
        .display()
        .to_string();
    let markdown = std::fs::read_to_string(document).expect("document readable");
    let found = match blocks(&name, &markdown) {
        Ok(found) => found,
        Err(error) => {
            summary.failed.push(error);
            return;
        }
    };
    let workspace = Workspace::new(root);
    let mut cluster: Option<Cluster> = None;
    for block in found {
        let place = &block.place;
        match &block.marker {
            Marker::Skip(reason) => {
                summary.skipped.push(format!("{place}: {reason}"));
                continue;
            }
            Marker::File(file) => {
                std::fs::write(workspace.path().join(file), &block.text).expect("write file");
                summary.ran.push(format!("{place}: written to {file}"));
                continue;
            }
            Marker::Cluster if cluster.is_none() => match start_cluster(&workspace) {
                Ok(started) => cluster = Some(started),
                Err(error) => {
                    summary
                        .failed
                        .push(format!("{place}: the simulated cluster: {error}"));
                    continue;
                }
            },
            _ => {}
        }
        let kubeconfig = match block.marker {
            Marker::Cluster => cluster.as_ref().map(Cluster::kubeconfig),
            _ => None,
        };
        let expected_exit = match block.marker {
            Marker::ExpectExit(code) => code,
            _ => 0,
        };
        let mut notes = Vec::new();
        let mut failure = None;
        let mut servers = Vec::new();
        // `export` lines hold for the rest of the block, as in the reader's shell.
        let mut exports = String::new();
        for step in &block.steps {
            let command = match rewrite(&step.command, workspace.path()) {
                Ok(command) => command,
                Err(why) => {
                    notes.push(format!("`{}` not run: {why}", step.command));
                    continue;
                }
            };
            let lasting = needs_marker(&command) == Some(RUNS_UNTIL_STOPPED);
            if block.marker != Marker::Background
                && let Some(why) = needs_marker(&command)
            {
                failure = Some(format!(
                    "`{}` {why}: mark the block `skip REASON` or `background`",
                    step.command
                ));
                break;
            }
            let script = format!("{exports}{}", without_comment(&command).trim_end_matches('&'));
            if command.trim_start().starts_with("export ") {
                exports.push_str(&command);
                exports.push('\n');
            }
            if lasting && block.marker == Marker::Background {
                // A server whose output the document sends to a file is waited for by the document's own
                // next command (`until [ -s FILE ] ...`), not by its address on stdout.
                let server =
                    command.trim_start().starts_with("gpu-sim ") && !without_comment(&command).contains('>');
                match start_background(workspace.command(&script, kubeconfig.as_deref()), server) {
                    Ok((started, line)) => {
                        servers.push(started);
                        if let Err(missing) = contains_shown(&line, &step.shown) {
                            failure = Some(format!(
                                "`{}` printed {line:?}; the document shows {missing:?}",
                                step.command
                            ));
                            break;
                        }
                    }
                    Err(error) => {
                        failure = Some(format!("`{}` {error}", step.command));
                        break;
                    }
                }
                continue;
            }
            let (status, output) = run_to_end(workspace.command(&script, kubeconfig.as_deref()));
            if status != Some(expected_exit) {
                let status = status.map_or(format!("ran past {COMMAND_TIMEOUT:?}"), |code| {
                    format!("exit {code}")
                });
                failure = Some(format!(
                    "`{}`: {status}, the document expects exit {expected_exit}; output:\n{}",
                    step.command,
                    indent(&output)
                ));
                break;
            }
            if let Err(missing) = contains_shown(&output, &step.shown) {
                failure = Some(format!(
                    "`{}` does not print the document's line {missing:?}; it printed:\n{}",
                    step.command,
                    indent(&output)
                ));
                break;
            }
        }
        drop(servers);
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join("; "))
        };
        match failure {
            Some(failure) => summary.failed.push(format!("{place}: {failure}")),
            None => summary
                .ran
                .push(format!("{place}: {} command(s){notes}", block.steps.len())),
        }
    }
}

fn indent(text: &str) -> String {
    text.lines().fold(String::new(), |mut out, line| {
        let _ = writeln!(out, "    | {line}");
        out
    })
}

#[test]
fn every_console_block_in_the_docs_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().expect("repository root");
    let mut summary = Summary::default();
    for document in documents(&root) {
        run_document(&root, &document, &mut summary);
    }
    let mut report = format!(
        "docs: ran {} block(s), skipped {}, failed {}\n",
        summary.ran.len(),
        summary.skipped.len(),
        summary.failed.len()
    );
    for (label, lines) in [
        ("ran", &summary.ran),
        ("skipped", &summary.skipped),
        ("FAILED", &summary.failed),
    ] {
        for line in lines {
            let _ = writeln!(report, "  {label} {line}");
        }
    }
    eprintln!("{report}");
    assert!(summary.failed.is_empty(), "{report}");
}

#[test]
fn the_parser_reads_prompts_output_and_markers() {
    let markdown = "text\n\n<!-- docs-test: expect-exit 1 -->\n```console\n$ a \\\n  --b\nshown\n...\n$ c\n```\n\n```\nplain text\n```\n\n   ```sh\n   x # why\n   # note\n   y \\\n     z\n   ```\n";
    let found = blocks("doc.md", markdown).expect("parses");
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].marker, Marker::ExpectExit(1));
    assert_eq!(found[0].place, "doc.md:4");
    assert_eq!(
        found[0].steps,
        vec![
            Step {
                command: "a \\\n  --b".into(),
                shown: vec!["shown".into(), "...".into()]
            },
            Step {
                command: "c".into(),
                shown: vec![]
            },
        ]
    );
    assert_eq!(found[1].marker, Marker::None);
    let commands: Vec<&str> = found[1].steps.iter().map(|step| step.command.as_str()).collect();
    assert_eq!(commands, ["x # why", "y \\\n  z"]);
    assert!(blocks("doc.md", "<!-- docs-test: maybe -->\n```sh\nx\n```\n").is_err());
}

#[test]
fn shown_output_matches_in_order_with_ellipses() {
    let actual = "first line\nwith a uid 1234 in it\nlast\n";
    assert!(
        contains_shown(
            actual,
            &[
                "first line".into(),
                "with a uid ... in it".into(),
                "...".into(),
                "last".into()
            ]
        )
        .is_ok()
    );
    assert_eq!(
        contains_shown(actual, &["last".into(), "first line".into()]),
        Err("first line".to_owned())
    );
    assert_eq!(
        contains_shown(actual, &["with a uid 99 in it".into()]),
        Err("with a uid 99 in it".to_owned())
    );
}

#[test]
fn commands_become_the_debug_binaries_and_servers_need_a_marker() {
    let work = Path::new("/w");
    assert_eq!(
        rewrite("cargo run --release --bin gpu-sim -- demo", work),
        Ok("gpu-sim demo".to_owned())
    );
    assert_eq!(
        rewrite("./target/release/gpu-sim up --kubeconfig-out /tmp/k", work),
        Ok("gpu-sim up --kubeconfig-out /w/tmp/k".to_owned())
    );
    assert!(rewrite("cargo build --release -p gpuop-doctor && cp x y", work).is_err());
    assert!(needs_marker("gpu-sim serve --port 6443").is_some());
    assert!(needs_marker("kubectl get nodes -w").is_some());
    assert!(needs_marker("helm install x y").is_some());
    assert!(needs_marker("gpu-operator check -f policy.yaml").is_none());
    assert!(needs_marker("kubectl-gpu snapshot &   # in the background").is_some());
    assert_eq!(
        without_comment("a 'b # c' \"#d\" e#f # g"),
        "a 'b # c' \"#d\" e#f"
    );
}
