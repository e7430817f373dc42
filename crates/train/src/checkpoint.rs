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
//! 3. the manifest `checkpoint.json`, naming that directory, is written under a temporary name,
//!    fsynced and renamed into place (then the run directory is fsynced): this is the commit point;
//! 4. the run directory's own copies of the four files are replaced by hard links to the new ones
//!    (each linked under a temporary name and renamed over the old copy, so every reader of `out/`
//!    as a checkpoint sees whole files), and the previous step directory is removed.
//!
//! A kill at any instant leaves either the previous manifest (the previous checkpoint, complete and
//! untouched) or the new one. `--resume` reads the checkpoint the manifest names; a run directory
//! without a manifest (written before 2026-11-24, and the shipped runs) is read from its own files.
//! Leftovers of a killed write (staging directories, unreferenced step directories, temporary
//! files) are swept, and the run directory's own files re-linked, when the run is resumed. Two
//! kills need more than the manifest: one during the very first checkpoint leaves no checkpoint at
//! all ([`only_leftovers`]: `train` then starts the run again from step 0, with or without
//! `--resume`), and one after the final checkpoint but before `train.json` leaves a complete run
//! without its record (`--resume` then evaluates it and writes `train.json`).
//!
//! Each file operation is reported to the caller (`Event::CheckpointWrite`, [`OPERATIONS`] and
//! [`LINK_OPERATIONS`]: 16 per checkpoint), who may stop the writer right after it as a kill
//! would: the fault-injection test `crates/train/tests/crash.rs` does so at every one of them.

use std::ops::ControlFlow;
use std::path::{Component, Path, PathBuf};

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

/// Syncs a directory so that the renames inside it are durable (`hyperlens_io::sync_dir`).
fn sync_dir(dir: &Path) -> Result<()> {
    Ok(hyperlens_io::sync_dir(dir)?)
}

/// The file operations of one checkpoint, in order, as [`write`] reports them (the `op` of
/// `Event::CheckpointWrite`), except the two per checkpoint file ([`LINK_OPERATIONS`]), which come
/// between the commit of the manifest and the removal of the previous step directory: 16 in all.
pub const OPERATIONS: [&str; 8] = [
    "created the staging directory",
    "staged config.json and model.safetensors",
    "staged optimizer.safetensors",
    "staged train_state.json",
    "renamed the staging directory to its step directory",
    "wrote checkpoint.json under a temporary name",
    "renamed checkpoint.json into place (the commit point)",
    "removed the previous step directory",
];

/// The two operations on the run directory's own copy of each of the [`CHECKPOINT_FILES`], in
/// their order: a hard link (or copy) under a temporary name, then the rename over the old copy.
pub const LINK_OPERATIONS: [[&str; 2]; 4] = [
    [
        "linked config.json under a temporary name",
        "renamed config.json into place",
    ],
    [
        "linked model.safetensors under a temporary name",
        "renamed model.safetensors into place",
    ],
    [
        "linked optimizer.safetensors under a temporary name",
        "renamed optimizer.safetensors into place",
    ],
    [
        "linked train_state.json under a temporary name",
        "renamed train_state.json into place",
    ],
];

/// Reads and checks the manifest of a run directory: the manifest and the step directory it
/// names, or `None` when the run has no manifest.
///
/// # Errors
/// [`TrainError::Resume`] naming the manifest if it is unreadable, malformed, or names anything
/// but an existing step directory `checkpoints/step-*` of this run.
pub fn read_manifest(out: &Path) -> Result<Option<(Manifest, PathBuf)>> {
    let path = out.join(MANIFEST_FILE);
    let bytes = match hyperlens_io::read_regular(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    let bad = |msg: String| TrainError::Resume(format!("{}: {msg}", path.display()));
    let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    let parts: Vec<Component<'_>> = Path::new(&m.dir).components().collect();
    let step_dir = match parts.as_slice() {
        [Component::Normal(root), Component::Normal(name)]
            if *root == CHECKPOINTS_DIR && name.to_string_lossy().starts_with("step-") =>
        {
            out.join(CHECKPOINTS_DIR).join(name)
        }
        _ => return Err(bad(format!("`dir` {} is not a step directory", m.dir))),
    };
    if !step_dir.is_dir() {
        return Err(bad(format!(
            "names {}, which is missing",
            step_dir.display()
        )));
    }
    Ok(Some((m, step_dir)))
}

/// The directory that holds the latest complete checkpoint of a run: the step directory named by
/// its manifest, or the run directory itself when it has no manifest (older and shipped runs).
///
/// # Errors
/// As [`read_manifest`].
pub fn latest_dir(out: &Path) -> Result<PathBuf> {
    Ok(read_manifest(out)?.map_or_else(|| out.to_path_buf(), |(_, dir)| dir))
}

/// Whether a run directory holds a committed checkpoint: a manifest, or (runs without one) its own
/// `train_state.json`.
pub fn committed(out: &Path) -> bool {
    out.join(MANIFEST_FILE).exists() || out.join(STATE_FILE).exists()
}

/// Whether `out` holds something, and nothing but what a run killed before its first checkpoint
/// was committed leaves: `metrics.csv`, a `checkpoints/` directory, and our temporary files and
/// staging directories (no manifest, no `train_state.json`, no file of anyone else). Such a run
/// has nothing to resume: `train` starts it again from step 0, with or without `resume`.
///
/// # Errors
/// [`TrainError::Io`] if `out` exists but cannot be listed.
pub fn only_leftovers(out: &Path) -> Result<bool> {
    if !out.is_dir() || committed(out) {
        return Ok(false);
    }
    let mut any = false;
    for e in std::fs::read_dir(out).map_err(io(out))? {
        let e = e.map_err(io(out))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let ours = is_leftover(&name)
            || (name == crate::metrics::METRICS_FILE && !dir)
            || (name == CHECKPOINTS_DIR && dir);
        if !ours {
            return Ok(false);
        }
        any = true;
    }
    Ok(any)
}

/// Empties a directory for which [`only_leftovers`] holds, so that the run starts again in an
/// empty directory.
///
/// # Errors
/// [`TrainError::Io`] naming what could not be removed.
pub(crate) fn clear_leftovers(out: &Path) -> Result<()> {
    for e in std::fs::read_dir(out).map_err(io(out))? {
        let e = e.map_err(io(out))?;
        let p = e.path();
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            std::fs::remove_dir_all(&p).map_err(io(&p))?;
        } else {
            std::fs::remove_file(&p).map_err(io(&p))?;
        }
    }
    sync_dir(out)
}

/// Paths a checkpoint write has created and not yet renamed into place: removed when the write
/// fails with a real error, left as they are when the caller stopped it as a kill would.
#[derive(Default)]
struct Pending(Vec<PathBuf>);

impl Pending {
    fn add(&mut self, p: &Path) {
        self.0.push(p.to_path_buf());
    }

    fn done(&mut self, p: &Path) {
        self.0.retain(|q| q != p);
    }

    fn remove_all(&mut self) {
        for p in self.0.drain(..) {
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}

/// Writes one checkpoint of the run in `out` after `step` updates (see the module documentation).
/// `stage(dir, done)` writes the four files into the staging directory `dir`, calling `done()`
/// after each of its three steps (config and weights, optimiser, state). `after(op)` is called
/// after each file operation, `op` naming it ([`OPERATIONS`], [`LINK_OPERATIONS`]). When `after`
/// returns `Break`, the writer stops right there, as a kill would (what it created stays where it
/// is), and returns [`TrainError::Interrupted`]: the fault-injection tests stop it at every point
/// in turn. On any other error the staging directory and temporary files of this write are
/// removed.
///
/// # Errors
/// The errors of `stage`; [`TrainError::Io`] naming the file or directory that failed;
/// [`TrainError::Interrupted`] when `after` asked to stop.
pub(crate) fn write(
    out: &Path,
    step: u64,
    stage: impl FnOnce(&Path, &mut dyn FnMut() -> Result<()>) -> Result<()>,
    after: &mut dyn FnMut(&'static str) -> ControlFlow<()>,
) -> Result<()> {
    let mut pending = Pending::default();
    let r = write_steps(out, step, stage, after, &mut pending);
    if r.as_ref()
        .is_err_and(|e| !matches!(e, TrainError::Interrupted(_)))
    {
        pending.remove_all();
    }
    r
}

fn write_steps(
    out: &Path,
    step: u64,
    stage: impl FnOnce(&Path, &mut dyn FnMut() -> Result<()>) -> Result<()>,
    after: &mut dyn FnMut(&'static str) -> ControlFlow<()>,
    pending: &mut Pending,
) -> Result<()> {
    let mut point = |op: &'static str| match after(op) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => Err(TrainError::Interrupted(format!(
            "checkpoint of step {step} stopped after: {op}"
        ))),
    };
    let [created, staged_model, staged_opt, staged_state, renamed_dir, wrote_manifest, renamed_manifest, removed] =
        OPERATIONS;
    let staging = out.join(format!(".checkpoint-{step}.tmp-{}", std::process::id()));
    if staging.exists() {
        // Left by an earlier write of this process that was stopped part-way.
        std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
    }
    std::fs::create_dir_all(&staging).map_err(io(&staging))?;
    pending.add(&staging);
    point(created)?;
    let mut staged = [staged_model, staged_opt, staged_state].into_iter();
    stage(&staging, &mut || {
        point(staged.next().unwrap_or("staged a file"))
    })?;
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
    pending.done(&staging);
    sync_dir(&steps)?;
    point(renamed_dir)?;

    let manifest = Manifest {
        step,
        dir: format!("{CHECKPOINTS_DIR}/{name}"),
    };
    let manifest_path = out.join(MANIFEST_FILE);
    let bytes = hyperlens_io::json_bytes(&manifest_path, &manifest)?;
    let tmp = temp_name(&manifest_path);
    pending.add(&tmp);
    write_synced(&tmp, &bytes)?;
    point(wrote_manifest)?;
    std::fs::rename(&tmp, &manifest_path).map_err(io(&manifest_path))?;
    pending.done(&tmp);
    sync_dir(out)?;
    point(renamed_manifest)?;

    for (file, [linked, renamed]) in CHECKPOINT_FILES.iter().zip(LINK_OPERATIONS) {
        let dst = out.join(file);
        let tmp = temp_name(&dst);
        pending.add(&tmp);
        link_or_copy(&final_dir.join(file), &tmp)?;
        point(linked)?;
        std::fs::rename(&tmp, &dst).map_err(io(&dst))?;
        // Where `dst` already was a link to the same file, POSIX rename did nothing and left `tmp`.
        pending.remove_all();
        point(renamed)?;
    }
    sync_dir(out)?;
    remove_other_steps(out, &name)?;
    point(removed)
}

/// `.<name>.<pid>.ckpt.tmp` beside `path`: a temporary name of this process (removed by [`sweep`],
/// and by hyperlens-io's pid-based sweep at the next atomic write of the same file).
fn temp_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.ckpt.tmp", std::process::id()))
}

/// Writes `bytes` to a new file `path` and syncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let _ = std::fs::remove_file(path);
    std::fs::File::create(path)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        .map_err(io(path))
}

/// Makes `tmp` a hard link to `src` (a synced copy where hard links are not supported).
fn link_or_copy(src: &Path, tmp: &Path) -> Result<()> {
    let _ = std::fs::remove_file(tmp);
    if std::fs::hard_link(src, tmp).is_err() {
        // A source that cannot be read is reported under its own name, not the temporary one.
        std::fs::File::open(src).map_err(io(src))?;
        std::fs::copy(src, tmp).map_err(io(tmp))?;
        std::fs::File::open(tmp)
            .and_then(|f| f.sync_all())
            .map_err(io(tmp))?;
    }
    Ok(())
}

/// Replaces `dst` by a hard link to `src` (a copy where hard links are not supported), through a
/// temporary name and a rename, so that `dst` is always a whole file.
fn link_into(src: &Path, dst: &Path) -> Result<()> {
    let tmp = temp_name(dst);
    let r = link_or_copy(src, &tmp).and_then(|()| std::fs::rename(&tmp, dst).map_err(io(dst)));
    // Also where `dst` already is a link to the same file: POSIX rename then does nothing.
    let _ = std::fs::remove_file(&tmp);
    r
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
/// writes and this module's temporary names) or a checkpoint staging directory
/// `.checkpoint-<step>.tmp-<pid>`.
fn is_leftover(name: &str) -> bool {
    name.starts_with('.')
        && (name.ends_with(".tmp")
            || name.starts_with(".checkpoint-")
            || name.starts_with(".hyperlens-npz-"))
}

/// Sweeps what killed checkpoint writes leave in a run directory, and brings its own copies of the
/// checkpoint files back in line with the manifest: staging directories and temporary files are
/// removed (in the run directory and in `checkpoints/`), step directories that the manifest does
/// not name are removed, and the run directory's four files are re-linked to the manifest's.
/// Called by `train --resume`, which owns the directory.
///
/// # Errors
/// [`TrainError::Resume`] naming a file of the latest checkpoint that is missing (nothing is
/// linked then); [`TrainError::Io`] naming what could not be removed or linked; the errors of
/// [`latest_dir`].
pub fn sweep(out: &Path) -> Result<()> {
    for dir in [out.to_path_buf(), out.join(CHECKPOINTS_DIR)] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if is_leftover(&name) {
                let p = e.path();
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
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
        // Every file of the checkpoint must be there before any is linked over the run's copy (a
        // missing one would otherwise be reported under the temporary name of its link).
        for file in CHECKPOINT_FILES {
            let src = latest.join(file);
            if !src.is_file() {
                return Err(TrainError::Resume(format!(
                    "{}: the checkpoint's file is missing (or not a file); {} names {} as the \
                     latest checkpoint",
                    src.display(),
                    out.join(MANIFEST_FILE).display(),
                    latest.display()
                )));
            }
        }
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
            r#"{"step": 1, "dir": "checkpoints/.."}"#,
            r#"{"step": 1, "dir": "checkpointsX/step-00000001"}"#,
            r#"{"step": 1, "dir": "checkpoints/step-00000001"}"#,
            "not json",
        ] {
            std::fs::write(dir.path().join(MANIFEST_FILE), bad).unwrap();
            let e = latest_dir(dir.path()).unwrap_err().to_string();
            assert!(e.contains(MANIFEST_FILE), "{bad}: {e}");
        }
    }

    #[test]
    fn a_run_killed_before_its_first_checkpoint_is_only_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        assert!(!only_leftovers(&out).unwrap(), "a missing directory");
        std::fs::create_dir_all(out.join(CHECKPOINTS_DIR).join("step-00000000")).unwrap();
        std::fs::create_dir_all(out.join(".checkpoint-0.tmp-4194304")).unwrap();
        std::fs::write(out.join(crate::metrics::METRICS_FILE), "step\n").unwrap();
        std::fs::write(out.join(".checkpoint.json.4194304.ckpt.tmp"), "{").unwrap();
        assert!(only_leftovers(&out).unwrap());
        // Anything else (a committed checkpoint, a file of the user's) is not ours to remove.
        std::fs::write(out.join("notes.txt"), "mine").unwrap();
        assert!(!only_leftovers(&out).unwrap());
        std::fs::remove_file(out.join("notes.txt")).unwrap();
        std::fs::write(out.join(STATE_FILE), "{}").unwrap();
        assert!(!only_leftovers(&out).unwrap());
        std::fs::remove_file(out.join(STATE_FILE)).unwrap();
        clear_leftovers(&out).unwrap();
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
        assert!(!only_leftovers(&out).unwrap(), "an empty directory");
    }

    #[test]
    fn a_missing_checkpoint_file_is_named_on_resume() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let step = out.join(CHECKPOINTS_DIR).join("step-00000004");
        std::fs::create_dir_all(&step).unwrap();
        for f in CHECKPOINT_FILES {
            std::fs::write(step.join(f), f).unwrap();
            std::fs::write(out.join(f), "old").unwrap();
        }
        std::fs::write(
            out.join(MANIFEST_FILE),
            r#"{"step": 4, "dir": "checkpoints/step-00000004"}"#,
        )
        .unwrap();
        std::fs::remove_file(step.join(OPTIMIZER_FILE)).unwrap();
        let e = sweep(&out).unwrap_err().to_string();
        assert!(
            e.contains(&step.join(OPTIMIZER_FILE).display().to_string()) && !e.contains("ckpt.tmp"),
            "{e}"
        );
        // Nothing was re-linked: the run's own copies are untouched.
        assert_eq!(
            std::fs::read_to_string(out.join(STATE_FILE)).unwrap(),
            "old"
        );
        // The copy fallback names the source too.
        let e = link_or_copy(&step.join(OPTIMIZER_FILE), &out.join(".x.tmp"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("step-00000004") && !e.contains(".x.tmp"), "{e}");
    }
}
