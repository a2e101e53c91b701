//! `gpu-operator check`: reads manifest files and prints what the API server and the operator would say
//! about every ClusterPolicy and NVIDIADriver in them.

use std::fmt::Write as _;
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use gpuop_api::ImageDefaults;
use gpuop_api::manifest::{ObjectReport, check_manifests};

/// The image defaults the operator would take from this process's environment.
pub fn image_defaults_from_env() -> ImageDefaults {
    ImageDefaults::from_pairs(
        ImageDefaults::variable_names()
            .into_iter()
            .filter_map(|name| std::env::var(name).ok().map(|value| (name, value))),
    )
}

/// Checks the files, prints the verdicts and returns the exit status.
pub fn run(files: &[PathBuf], defaults: &ImageDefaults) -> ExitCode {
    let mut unreadable = false;
    let mut reports = Vec::new();
    for file in files {
        match read(file) {
            Ok(text) => reports.push((file.display().to_string(), check_manifests(&text, defaults))),
            Err(error) => {
                eprintln!("{}: cannot read: {error}", file.display());
                unreadable = true;
            }
        }
    }
    let (text, verdict) = render(&reports);
    // Say what was found in the readable files, but not that nothing was found.
    let text = if unreadable && verdict == Verdict::NothingChecked {
        ""
    } else {
        text.as_str()
    };
    // `print!` would panic (with a stack trace under RUST_BACKTRACE) when stdout is closed, as by `| head`.
    if let Err(error) = std::io::stdout().lock().write_all(text.as_bytes()) {
        eprintln!("gpu-operator check: cannot write: {error}");
        return ExitCode::from(2);
    }
    match verdict {
        _ if unreadable => ExitCode::from(2),
        Verdict::AllValid => ExitCode::SUCCESS,
        Verdict::Problems | Verdict::NothingChecked => ExitCode::from(1),
    }
}

fn read(file: &Path) -> std::io::Result<String> {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        Ok(text)
    } else {
        std::fs::read_to_string(file)
    }
}

/// Overall outcome of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// At least one object was checked and none has a problem.
    AllValid,
    /// Some object has a problem.
    Problems,
    /// No ClusterPolicy or NVIDIADriver was found.
    NothingChecked,
}

/// The report a person reads, one block per object, and the verdict.
pub fn render(files: &[(String, Vec<ObjectReport>)]) -> (String, Verdict) {
    let mut out = String::new();
    let (mut checked, mut invalid, mut errors, mut warnings) = (0, 0, 0, 0);
    for (file, reports) in files {
        for report in reports {
            let location = &report.location;
            let mut place = format!("{file}: document {} (line {})", location.document, location.line);
            if let Some(item) = location.item {
                let _ = write!(place, " item {item}");
            }
            let what = match (&report.kind, &report.name) {
                (Some(kind), Some(name)) => format!("{kind} {name:?}"),
                (Some(kind), None) => kind.clone(),
                _ => "document".to_owned(),
            };
            if let Some(reason) = &report.skipped {
                let _ = writeln!(out, "{place} {what}: skipped, {reason}");
                continue;
            }
            checked += 1;
            let status = if report.is_valid() { "valid" } else { "invalid" };
            let _ = writeln!(out, "{place} {what}: {status}");
            for error in &report.errors {
                let _ = writeln!(out, "  error: {error}");
            }
            for warning in &report.warnings {
                let _ = writeln!(out, "  warning: {warning}");
            }
            errors += report.errors.len();
            warnings += report.warnings.len();
            invalid += usize::from(!report.is_valid());
        }
    }
    let verdict = match (checked, invalid) {
        (0, _) => Verdict::NothingChecked,
        (_, 0) => Verdict::AllValid,
        _ => Verdict::Problems,
    };
    if verdict == Verdict::NothingChecked {
        out.push_str("no ClusterPolicy or NVIDIADriver found\n");
    } else {
        let _ = writeln!(
            out,
            "{checked} checked: {} valid, {invalid} invalid ({errors} {}, {warnings} {})",
            checked - invalid,
            plural(errors, "error", "errors"),
            plural(warnings, "warning", "warnings"),
        );
    }
    (out, verdict)
}

fn plural<'a>(count: usize, one: &'a str, many: &'a str) -> &'a str {
    if count == 1 { one } else { many }
}
