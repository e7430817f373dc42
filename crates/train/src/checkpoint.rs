//! Crash-safe checkpoints of a run directory.
//!
//! A checkpoint is four files: `config.json` + `model.safetensors` (the model crate's checkpoint),
//! `optimizer.safetensors` and `train_state.json` (which records the hash of the weights saved with
//! it). They cannot be replaced together by one atomic operation, so a checkpoint is written like
//! this (the usual write-ahead recipe: build completely, then switch one pointer):
//!
//! 1. all four files go into a fresh staging directory `.checkpoint-<step>.tmp-<pid>`, each written
//!    atomically and fsynced;
//! 2. the staging directory is fsynced and renamed to `checkpoints/step-<step>` (then its parent
//!    is fsynced);
//! 3. the manifest `checkpoint.json`, naming that directory, is written atomically: this is the
//!    commit point;
//! 4. the run directory's own copies of the four files are replaced by hard links to the new ones
//!    (each by a rename, so every reader of `out/` as a checkpoint sees whole files), and the
//!    previous step directory is removed.
//!
//! A kill at any instant leaves either the previous manifest (the previous checkpoint, complete and
//! untouched) or the new one. `--resume` reads the checkpoint the manifest names; a run directory
//! without a manifest (written before 2026-11-24, and the shipped runs) is read from its own files.
//! Leftovers of a killed write (staging directories, unreferenced step directories, temporary
//! files) are swept when the run is resumed.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::state::{OPTIMIZER_FILE, STATE_FILE};
use hyperlens_model::checkpoint::{CONFIG_FILE, WEIGHTS_FILE};

/// File name of the manifest that names a run's latest complete checkpoint.
pub const MANIFEST_FILE: &str = "checkpoint.json";
/// Directory (inside the run directory) of the step directories.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// The four files of a checkpoint, in the order the run directory's copies are replaced.
pub const CHECKPOINT_FILES: [&str; 4] = [CONFIG_FILE, WEIGHTS_FILE, OPTIMIZER_FILE, STATE_FILE];

/// `checkpoint.json`: which step directory holds the latest complete checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Updates done at that checkpoint.
    pub step: u64,
    /// The step directory, relative to the run directory (`checkpoints/step-00000040`).
    pub dir: String,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Syncs a directory so that the renames inside it are durable (a no-op where directories cannot
/// be synced).
fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let handle = std::fs::File::open(dir).map_err(io(dir))?;
        match handle.sync_all() {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
            other => other.map_err(io(dir)),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// The directory that holds the latest complete checkpoint of a run: the step directory named by
/// its manifest, or the run directory itself when it has no manifest (older and shipped runs).
///
/// # Errors
/// [`TrainError::Resume`] naming the manifest if it is unreadable, malformed, or names a directory
/// that is missing or outside the run directory.
pub fn latest_dir(out: &Path) -> Result<PathBuf> {
    let path = out.join(MANIFEST_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out.to_path_buf()),
        Err(e) => return Err(io(&path)(e)),
    };
    let bad = |msg: String| TrainError::Resume(format!("{}: {msg}", path.display()));
    let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    let rel = Path::new(&m.dir);
    if rel.is_absolute() || rel.components().count() != 2 || !m.dir.starts_with(CHECKPOINTS_DIR) {
        return Err(bad(format!("`dir` {} is not a step directory", m.dir)));
    }
    let dir = out.join(rel);
    if !dir.is_dir() {
        return Err(bad(format!("names {}, which is missing", dir.display())));
    }
    Ok(dir)
}

/// Writes one checkpoint of the run in `out` after `step` updates (see the module documentation).
/// `stage(dir, after)` writes the four files into the staging directory `dir`, calling `after(op)`
/// after each file; `after(op)` is also called after each step of the commit. When `after` returns
/// `Break`, the writer stops right there, as a kill would, and returns [`TrainError::Interrupted`]
/// (the fault-injection tests stop it at every point in turn).
///
/// # Errors
/// The errors of `stage`; [`TrainError::Io`] naming the file or directory that failed;
/// [`TrainError::Interrupted`] when `after` asked to stop.
pub(crate) fn write(
    out: &Path,
    step: u64,
    stage: impl FnOnce(&Path, &mut dyn FnMut(&'static str) -> Result<()>) -> Result<()>,
    after: &mut dyn FnMut(&'static str) -> ControlFlow<()>,
) -> Result<()> {
    let mut point = |op: &'static str| match after(op) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => Err(TrainError::Interrupted(format!(
            "checkpoint of step {step} stopped after: {op}"
        ))),
    };
    let staging = out.join(format!(".checkpoint-{step}.tmp-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
    }
    std::fs::create_dir_all(&staging).map_err(io(&staging))?;
    stage(&staging, &mut point)?;
    sync_dir(&staging)?;
    let steps = out.join(CHECKPOINTS_DIR);
    std::fs::create_dir_all(&steps).map_err(io(&steps))?;
    let name = format!("step-{step:08}");
    let final_dir = steps.join(&name);
    if final_dir.exists() {
        // A step directory that no manifest names (left by a killed write of this same step).
        std::fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
    }
    std::fs::rename(&staging, &final_dir).map_err(io(&final_dir))?;
    sync_dir(&steps)?;
    point("renamed the staging directory to its step directory")?;
    let manifest = Manifest {
        step,
        dir: format!("{CHECKPOINTS_DIR}/{name}"),
    };
    hyperlens_io::write_json(&out.join(MANIFEST_FILE), &manifest)?;
    point("wrote the manifest")?;
    for file in CHECKPOINT_FILES {
        link_into(&final_dir.join(file), &out.join(file))?;
        point(file)?;
    }
    sync_dir(out)?;
    remove_other_steps(out, &name)?;
    point("removed the previous step directory")
}

/// Replaces `dst` by a hard link to `src` (a copy where hard links are not supported), through a
/// temporary name and a rename, so that `dst` is always a whole file.
fn link_into(src: &Path, dst: &Path) -> Result<()> {
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dst.with_file_name(format!(".{name}.{}.link.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(src, &tmp).is_err() {
        std::fs::copy(src, &tmp).map_err(io(&tmp))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, dst).map_err(io(dst))?;
    // When `dst` already is a link to the same file, POSIX rename does nothing and leaves `tmp`.
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

/// Removes every step directory except `keep`.
fn remove_other_steps(out: &Path, keep: &str) -> Result<()> {
    let steps = out.join(CHECKPOINTS_DIR);
    let Ok(entries) = std::fs::read_dir(&steps) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != keep && name.starts_with("step-") {
            std::fs::remove_dir_all(e.path()).map_err(io(&e.path()))?;
        }
    }
    Ok(())
}

/// Whether a file name is a temporary file of ours: `.<name>.<...>.tmp` (hyperlens-io's atomic
/// writes and [`link_into`]) or a checkpoint staging directory `.checkpoint-<step>.tmp-<pid>`.
fn is_leftover(name: &str) -> bool {
    name.starts_with('.')
        && (name.ends_with(".tmp")
            || name.starts_with(".checkpoint-")
            || name.starts_with(".hyperlens-npz-"))
}

/// Sweeps what killed checkpoint writes leave in a run directory, and brings its own copies of the
/// checkpoint files back in line with the manifest: staging directories and temporary files are
/// removed, step directories that the manifest does not name are removed, and the run directory's
/// four files are re-linked to the manifest's. Called by `train --resume`, which owns the directory.
///
/// # Errors
/// [`TrainError::Io`] naming what could not be removed or linked; the errors of [`latest_dir`].
pub fn sweep(out: &Path) -> Result<()> {
    if let Ok(entries) = std::fs::read_dir(out) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if is_leftover(&name) {
                let p = e.path();
                if p.is_dir() {
                    std::fs::remove_dir_all(&p).map_err(io(&p))?;
                } else {
                    std::fs::remove_file(&p).map_err(io(&p))?;
                }
            }
        }
    }
    let latest = latest_dir(out)?;
    if latest != out {
        let keep = latest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        remove_other_steps(out, &keep)?;
        for file in CHECKPOINT_FILES {
            link_into(&latest.join(file), &out.join(file))?;
        }
        sync_dir(out)?;
    } else {
        // No manifest: any step directory is from a write that never committed.
        remove_other_steps(out, "")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_are_recognised_by_our_patterns_only() {
        for ours in [
            ".model.safetensors.abc123.tmp",
            ".checkpoint-40.tmp-1234",
            ".train_state.json.99.link.tmp",
            ".hyperlens-npz-x1y2",
        ] {
            assert!(is_leftover(ours), "{ours}");
        }
        for theirs in ["model.safetensors", "notes.tmp", "checkpoints", ".git"] {
            assert!(!is_leftover(theirs), "{theirs}");
        }
    }

    #[test]
    fn a_manifest_outside_the_run_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(latest_dir(dir.path()).unwrap(), dir.path());
        for bad in [
            r#"{"step": 1, "dir": "/etc"}"#,
            r#"{"step": 1, "dir": "checkpoints/../../x"}"#,
            r#"{"step": 1, "dir": "checkpoints/step-00000001"}"#,
            "not json",
        ] {
            std::fs::write(dir.path().join(MANIFEST_FILE), bad).unwrap();
            let e = latest_dir(dir.path()).unwrap_err().to_string();
            assert!(e.contains(MANIFEST_FILE), "{bad}: {e}");
        }
    }
}
