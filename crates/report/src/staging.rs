//! Building the report beside its target and swapping it in whole.
//!
//! The staging directory is `.<name>.staging-<pid>` in the target's parent (so that the final
//! rename stays on one file system). The swap renames the old report to `.<name>.old-<pid>`, the
//! staging directory to the target, fsyncs the parent and removes the old report. A kill before
//! the first rename leaves the old report whole; between the two renames the target is briefly
//! absent and the complete old report sits beside it under its `.old` name (the next run renames
//! it back before anything else); after the second, the new report is in place. Other leftovers
//! of killed runs (staging directories, `.old` directories beside a target) whose process is gone
//! are removed by the next run.

use std::path::{Path, PathBuf};

use crate::error::{ReportError, Result};

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The parent directory and the file name of the target.
fn parts(target: &Path) -> Result<(PathBuf, String)> {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            ReportError::InvalidInput(format!("--out {}: not a directory name", target.display()))
        })?;
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

/// Handles the leftovers of killed runs beside the target: a staging directory is removed; an
/// `.old` directory (the previous report, moved aside by a swap that was killed before the new
/// report took its place) is renamed back to the target when the target is missing, and removed
/// otherwise. Only leftovers of processes that are gone (or of this one) are touched.
///
/// # Errors
/// [`ReportError::Io`] naming the directory that could not be listed, renamed or removed.
fn recover(parent: &Path, name: &str, target: &Path) -> Result<()> {
    for e in std::fs::read_dir(parent).map_err(io(parent))?.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some((tag, pid)) = [".staging-", ".old-"].iter().find_map(|tag| {
            file.strip_prefix(&format!(".{name}{tag}"))
                .and_then(|p| p.parse::<u32>().ok())
                .map(|pid| (*tag, pid))
        }) else {
            continue;
        };
        if pid != std::process::id() && hyperlens_io::pid_alive(pid) {
            continue;
        }
        let p = e.path();
        if tag == ".old-" && !target.exists() {
            std::fs::rename(&p, target).map_err(io(target))?;
            hyperlens_io::sync_dir(parent)?;
        } else {
            std::fs::remove_dir_all(&p).map_err(io(&p))?;
        }
    }
    Ok(())
}

/// Restores or removes the leftovers of killed runs ([`recover`]), checks the target, and creates
/// a fresh staging directory.
///
/// # Errors
/// [`ReportError::InvalidInput`] if the target exists and is a file, or a non-empty directory
/// without `summary.json` (not a report, which the swap would delete); [`ReportError::Io`].
pub(crate) fn prepare(target: &Path) -> Result<PathBuf> {
    let (parent, name) = parts(target)?;
    if parent.is_dir() {
        recover(&parent, &name, target)?;
    }
    if target.exists() {
        if !target.is_dir() {
            return Err(ReportError::InvalidInput(format!(
                "--out {} is a file, not a report directory",
                target.display()
            )));
        }
        let empty = std::fs::read_dir(target)
            .map_err(io(target))?
            .next()
            .is_none();
        if !empty && !target.join("summary.json").is_file() {
            return Err(ReportError::InvalidInput(format!(
                "--out {} holds files but no summary.json, so it is not a previous report; the \
                 report replaces its directory as a whole: choose a new or empty directory",
                target.display()
            )));
        }
    }
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let staging = parent.join(format!(".{name}.staging-{}", std::process::id()));
    std::fs::create_dir_all(&staging).map_err(io(&staging))?;
    Ok(staging)
}

/// Swaps the complete staging directory in as the target (see the module documentation).
///
/// # Errors
/// [`ReportError::Io`] naming the directory whose rename failed.
pub(crate) fn swap(staging: &Path, target: &Path) -> Result<()> {
    let (parent, name) = parts(target)?;
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    let had_old = target.exists();
    if had_old {
        std::fs::rename(target, &old).map_err(io(target))?;
    }
    std::fs::rename(staging, target).map_err(io(target))?;
    hyperlens_io::sync_dir(&parent)?;
    if had_old {
        std::fs::remove_dir_all(&old).map_err(io(&old))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_replaces_a_report_whole_and_refuses_other_directories() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("rep");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("notes.txt"), "mine").unwrap();
        let e = prepare(&target).unwrap_err().to_string();
        assert!(e.contains("summary.json"), "{e}");
        std::fs::write(target.join("summary.json"), "{}").unwrap();
        std::fs::write(target.join("stale.csv"), "old").unwrap();
        // A leftover of a killed run (dead pid) is removed; the staging directory is fresh.
        let dead = root.path().join(".rep.staging-4194304");
        std::fs::create_dir_all(&dead).unwrap();
        let staging = prepare(&target).unwrap();
        assert!(!dead.exists());
        std::fs::write(staging.join("summary.json"), "{\"new\": 1}").unwrap();
        swap(&staging, &target).unwrap();
        assert!(!target.join("stale.csv").exists());
        assert_eq!(
            std::fs::read_to_string(target.join("summary.json")).unwrap(),
            "{\"new\": 1}"
        );
        let left: Vec<_> = std::fs::read_dir(root.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "only the report remains");
    }

    #[test]
    fn a_swap_killed_between_its_renames_gets_the_old_report_back() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("rep");
        // The state a kill between the two renames leaves: no target, the old report aside, the
        // complete new one still in staging (4194304 is above Linux's largest pid).
        let old = root.path().join(".rep.old-4194304");
        let staged = root.path().join(".rep.staging-4194304");
        for d in [&old, &staged] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(old.join("summary.json"), "{\"old\": 1}").unwrap();
        std::fs::write(staged.join("summary.json"), "{\"new\": 1}").unwrap();
        if !Path::new("/proc/self").exists() {
            return; // no way to tell a dead pid here: nothing is touched
        }
        let staging = prepare(&target).unwrap();
        assert_eq!(
            std::fs::read_to_string(target.join("summary.json")).unwrap(),
            "{\"old\": 1}"
        );
        assert!(!old.exists() && !staged.exists());
        std::fs::remove_dir_all(staging).unwrap();
    }
}
