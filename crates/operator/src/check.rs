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

/// Checks the files (a folder stands for its manifest files, as in `kubectl apply -f`; its subfolders too
/// when `recursive`), prints the verdicts and returns the exit status.
pub fn run(files: &[PathBuf], recursive: bool, defaults: &ImageDefaults) -> ExitCode {
    let mut unreadable = false;
    let mut reports = Vec::new();
    for file in files {
        let (found, errors) = manifest_files(file, recursive);
        for (path, error) in errors {
            eprintln!("{}: cannot read: {error}", path.display());
            unreadable = true;
        }
        for file in found {
            match read(&file) {
                Ok(text) => reports.push((file.display().to_string(), check_manifests(&text, defaults))),
                Err(error) => {
                    eprintln!("{}: cannot read: {error}", file.display());
                    unreadable = true;
                }
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

/// The extensions `kubectl apply -f DIR` reads in a folder.
const MANIFEST_EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// The files `path` stands for: itself when it is not a folder (or `-`); for a folder, its files ending in
/// `.yaml`, `.yml` or `.json` in name order and, when `recursive`, those of its subfolders, depth first,
/// as `kubectl apply -f DIR [-R]` reads them. Folders that cannot be listed come back as errors.
pub fn manifest_files(path: &Path, recursive: bool) -> (Vec<PathBuf>, Vec<(PathBuf, std::io::Error)>) {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    if path.as_os_str() == "-" || !path.is_dir() {
        files.push(path.to_owned());
    } else {
        collect_folder(path, recursive, &mut files, &mut errors);
    }
    (files, errors)
}

fn collect_folder(
    folder: &Path,
    recursive: bool,
    files: &mut Vec<PathBuf>,
    errors: &mut Vec<(PathBuf, std::io::Error)>,
) {
    let entries = match std::fs::read_dir(folder) {
        Ok(entries) => entries,
        Err(error) => {
            errors.push((folder.to_owned(), error));
            return;
        }
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|entry| entry.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            if recursive {
                collect_folder(&path, recursive, files, errors);
            }
        } else if path
            .extension()
            .and_then(|extension| extension.to_str())
            .is_some_and(|extension| MANIFEST_EXTENSIONS.contains(&extension))
        {
            files.push(path);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_stands_for_its_manifest_files_sorted_and_subfolders_only_when_recursive() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for file in [
            "b.yml",
            "a.yaml",
            "c.json",
            "notes.txt",
            "README.md",
            "sub/d.yaml",
            "sub/deeper/e.yaml",
        ] {
            let path = root.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        let names = |recursive| {
            let (files, errors) = manifest_files(root, recursive);
            assert!(errors.is_empty());
            files
                .iter()
                .map(|f| f.strip_prefix(root).unwrap().display().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(false), ["a.yaml", "b.yml", "c.json"]);
        assert_eq!(
            names(true),
            ["a.yaml", "b.yml", "c.json", "sub/d.yaml", "sub/deeper/e.yaml"]
        );
        // A file is itself whatever its name, and so is standard input.
        let notes = root.join("notes.txt");
        assert_eq!(manifest_files(&notes, false).0, [notes]);
        assert_eq!(manifest_files(Path::new("-"), true).0, [PathBuf::from("-")]);
    }
}
