//! Shell completion, two ways.
//!
//! - `kubectl gpu completion bash|zsh|fish|powershell` prints clap_complete's script for the `kubectl-gpu`
//!   command typed as itself.
//! - `kubectl gpu ...` is completed by kubectl (1.26 and later), which runs a plugin's completion executable,
//!   `kubectl_complete-gpu`, found on the PATH, as `kubectl_complete-gpu ARG... PARTIAL` (the words after
//!   `kubectl gpu`, then the word being completed, maybe empty) and reads one candidate a line
//!   (`candidate<TAB>description`) and a last line `:DIRECTIVE` (Cobra's `ShellCompDirective`). The script
//!   `completion kubectl-plugin` prints ([`KUBECTL_PLUGIN_SCRIPT`]) hands those words to
//!   `kubectl-gpu __complete`, answered by [`complete`] from the same clap definition as the parser, so the
//!   two never disagree.

use clap::ValueEnum;

/// The hidden first argument that asks for kubectl's completion protocol.
pub const COMPLETE: &str = "__complete";

/// What `kubectl gpu completion kubectl-plugin` prints: save it as `kubectl_complete-gpu` on the PATH.
pub const KUBECTL_PLUGIN_SCRIPT: &str = "#!/bin/sh\n\
# kubectl (1.26 and later) runs this, found on the PATH as kubectl_complete-gpu, to complete `kubectl gpu ...`.\n\
exec kubectl-gpu __complete \"$@\"\n";

/// Cobra's `ShellCompDirectiveDefault`: the shell may also offer file names.
const FILES: u32 = 0;
/// Cobra's `ShellCompDirectiveNoFileComp`: only the candidates given.
const NO_FILES: u32 = 4;

/// Where the completion script is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    /// Bash, for `kubectl-gpu ...`.
    Bash,
    /// Zsh, for `kubectl-gpu ...`.
    Zsh,
    /// Fish, for `kubectl-gpu ...`.
    Fish,
    /// PowerShell, for `kubectl-gpu ...`.
    Powershell,
    /// The `kubectl_complete-gpu` script through which kubectl completes `kubectl gpu ...` in any shell
    /// kubectl completes.
    KubectlPlugin,
}

/// The completion script for `shell`.
pub fn script(shell: Shell, command: clap::Command) -> String {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
        Shell::Powershell => clap_complete::Shell::PowerShell,
        Shell::KubectlPlugin => return KUBECTL_PLUGIN_SCRIPT.to_owned(),
    };
    // The scripts complete the command as typed, `kubectl-gpu`; clap_complete's bash script also names its
    // cases by the bin name, which must not be the help's `kubectl gpu` with a space.
    let mut command = command.bin_name("kubectl-gpu");
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, "kubectl-gpu", &mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    if shell == clap_complete::Shell::Bash {
        // clap_complete 4.6 names the bash cases of subcommands by their bin name with every `-` made a
        // separator (`kubectl__subcmd__gpu__subcmd__doctor`) but the state it matches them against with the
        // root's `-` made `__` (`kubectl__gpu__subcmd__doctor`): without this no subcommand's flags complete.
        return text.replace("kubectl__subcmd__gpu", "kubectl__gpu");
    }
    text
}

/// kubectl's plugin completion: `words` are the words after `kubectl gpu`, the last one the word being
/// completed. Answers candidates, one a line with a description after a tab, and the directive.
pub fn complete(mut root: clap::Command, words: &[String]) -> String {
    // Built, the command has what clap adds itself: `help`, `--help`, `--version`.
    root.build();
    let (partial, before) = match words.split_last() {
        Some((partial, before)) => (partial.as_str(), before),
        None => ("", &[][..]),
    };
    let mut command = &root;
    let mut pending: Option<&clap::Arg> = None;
    let mut positionals = 0;
    let mut only_positionals = false;
    for word in before {
        // The value of the flag before.
        if pending.take().is_some() {
            continue;
        }
        if only_positionals {
            positionals += 1;
        } else if word == "--" {
            only_positionals = true;
        } else if let Some(flag) = word.strip_prefix("--") {
            if !flag.contains('=') {
                pending = command
                    .get_arguments()
                    .find(|a| a.get_long() == Some(flag))
                    .filter(|a| takes_value(a));
            }
        } else if let Some(short) = word.strip_prefix('-').filter(|s| s.chars().count() == 1) {
            pending = command
                .get_arguments()
                .find(|a| a.get_short().is_some_and(|c| short.starts_with(c)))
                .filter(|a| takes_value(a));
        } else if word.starts_with('-') {
            // `-ojson` and the like: the value is in the word.
        } else if let Some(sub) = command.find_subcommand(word) {
            command = sub;
            positionals = 0;
        } else {
            positionals += 1;
        }
    }
    let mut out = String::new();
    let mut add = |candidate: &str, help: Option<String>| {
        if candidate.starts_with(partial) {
            out.push_str(candidate);
            if let Some(help) = help.filter(|h| !h.is_empty()) {
                out.push('\t');
                out.push_str(&help);
            }
            out.push('\n');
        }
    };
    let directive = if let Some(arg) = pending {
        let values = arg.get_possible_values();
        for value in &values {
            add(value.get_name(), value.get_help().map(first_line));
        }
        // A flag without a fixed set of values may well want a file (--snapshot, --kubeconfig).
        if values.is_empty() { FILES } else { NO_FILES }
    } else if partial.starts_with('-') {
        for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                add(&format!("--{long}"), arg.get_help().map(first_line));
            }
        }
        NO_FILES
    } else {
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            add(sub.get_name(), sub.get_about().map(first_line));
        }
        let positional = command
            .get_positionals()
            .filter(|a| !a.is_hide_set())
            .nth(positionals);
        if let Some(arg) = positional {
            for value in arg.get_possible_values().iter().filter(|v| !v.is_hide_set()) {
                add(value.get_name(), value.get_help().map(first_line));
            }
        }
        NO_FILES
    };
    out.push_str(&format!(":{directive}\n"));
    out
}

fn takes_value(arg: &clap::Arg) -> bool {
    arg.get_action().takes_values()
}

fn first_line(help: &clap::builder::StyledStr) -> String {
    help.to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches('.')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::CommandFactory;

    fn candidates(words: &[&str]) -> (Vec<String>, String) {
        let words: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
        let answer = complete(Cli::command(), &words);
        let mut lines: Vec<String> = answer.lines().map(str::to_owned).collect();
        let directive = lines.pop().unwrap();
        let names = lines
            .iter()
            .map(|l| l.split('\t').next().unwrap().to_owned())
            .collect();
        (names, directive)
    }

    #[test]
    fn kubectl_is_answered_with_subcommands_flags_and_values() {
        let (names, directive) = candidates(&[""]);
        assert_eq!(
            names,
            [
                "doctor",
                "explain",
                "upgrade-plan",
                "snapshot",
                "bundle",
                "completion",
                "help"
            ]
        );
        assert_eq!(directive, ":4");
        assert_eq!(candidates(&["up"]).0, ["upgrade-plan"]);
        let (flags, _) = candidates(&["doctor", "--"]);
        for flag in [
            "--snapshot",
            "--kubeconfig",
            "--context",
            "--request-timeout",
            "--gpu-node-selector",
            "--output",
            "--node",
        ] {
            assert!(flags.contains(&flag.to_owned()), "{flag}: {flags:?}");
        }
        assert_eq!(
            candidates(&["doctor", "-o", ""]).0,
            ["table", "json", "yaml", "wide"]
        );
        assert_eq!(candidates(&["doctor", "--output", "j"]).0, ["json"]);
        assert_eq!(
            candidates(&["doctor", "--snapshot", ""]),
            (vec![], ":0".to_owned()),
            "a path is left to the shell"
        );
        assert_eq!(
            candidates(&["explain", "--snapshot", "x.json", ""]).0,
            ["pod", "pods", "po"]
        );
        assert_eq!(
            candidates(&["completion", ""]).0,
            ["bash", "zsh", "fish", "powershell", "kubectl-plugin"]
        );
        let answer = complete(Cli::command(), &["doc".to_owned()]);
        assert!(
            answer.starts_with("doctor\tAudit every node"),
            "candidates carry their help after a tab: {answer}"
        );
    }

    /// What bash offers for `kubectl-gpu WORDS...` with the script sourced.
    fn bash_offers(words: &[&str]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubectl-gpu.bash");
        std::fs::write(&path, script(Shell::Bash, Cli::command())).unwrap();
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let program = format!(
            "source '{}'; COMP_WORDS=(kubectl-gpu {}); COMP_CWORD={}; _kubectl__gpu kubectl-gpu '{}' '{}'; \
             echo \"${{COMPREPLY[@]}}\"",
            path.display(),
            quoted.join(" "),
            words.len(),
            words.last().unwrap(),
            words.len().checked_sub(2).map_or("kubectl-gpu", |i| words[i]),
        );
        let output = std::process::Command::new("bash")
            .args(["-c", &program])
            .output()
            .expect("bash runs");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    #[test]
    fn the_bash_script_completes_subcommands_their_flags_and_values() {
        assert_eq!(bash_offers(&["up"]), "upgrade-plan");
        assert_eq!(bash_offers(&["doctor", "-o", ""]), "table json yaml wide");
        assert_eq!(bash_offers(&["upgrade-plan", "--req"]), "--request-timeout");
    }

    #[test]
    fn every_shell_gets_a_script_for_kubectl_gpu() {
        for shell in Shell::value_variants() {
            let text = script(*shell, Cli::command());
            assert!(text.contains("kubectl-gpu"), "{shell:?}: {text}");
        }
        assert!(KUBECTL_PLUGIN_SCRIPT.starts_with("#!/bin/sh\n"));
    }
}
