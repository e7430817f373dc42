//! The task of a checkpoint, read once from its run files (`hyperlens_model::RunRecord`), which the
//! commands that run a SRAVEN or fuzzy-logic model (`eval`, `probe`, `cache`) dispatch on; and the
//! pieces that their fuzzy-logic paths and `tasks sample --task logic` share: the recorded
//! settings, the split, the set and the inputs of a logic problem set (`docs/spec/sraven.md`, "The
//! fuzzy-logic task").

use std::path::Path;

use anyhow::{bail, Context, Result};
use hyperlens_model::{RunRecord, Task};
use hyperlens_tasks::logic::{LogicSet, LogicSplit};
use hyperlens_train::TrainSettings;

use super::common::{ProblemArgs, SetArg};

/// A checkpoint as the commands that run a SRAVEN or fuzzy-logic model see it.
#[derive(Debug, Clone)]
pub(crate) enum Checkpoint {
    /// A SRAVEN checkpoint, or one whose run files name no task (the imported paper checkpoints),
    /// or one of another task (the SRAVEN path refuses its config).
    Sraven,
    /// A fuzzy-logic checkpoint, with the settings it was trained with (the task's terms and
    /// split).
    Logic(Box<TrainSettings>),
}

/// Reads which task the checkpoint in `dir` has, and for a fuzzy-logic one its settings.
///
/// # Errors
/// A run file that cannot be read or parsed (naming it); a fuzzy-logic checkpoint without the run
/// files that hold its settings.
pub(crate) fn checkpoint(dir: &Path) -> Result<Checkpoint> {
    Ok(match RunRecord::read(dir)?.task_or_sraven() {
        Task::Logic => Checkpoint::Logic(Box::new(run_settings(dir)?)),
        Task::Sraven | Task::Induction => Checkpoint::Sraven,
    })
}

/// The settings a logic checkpoint was trained with (its `train_state.json`, else `train.json`).
///
/// # Errors
/// Neither run file holds the settings (the message names the checkpoint).
pub(crate) fn run_settings(checkpoint: &Path) -> Result<TrainSettings> {
    hyperlens_train::run_settings(checkpoint).with_context(|| {
        format!(
            "{}: a logic checkpoint needs its run files for the task's terms and split",
            checkpoint.display()
        )
    })
}

/// The logic set a `--set` names (the same names: `id` the training tasks, `ood` the held-out
/// pairs of known terms, `unknown` the pairs of unknown terms).
pub(crate) fn logic_set(set: SetArg) -> LogicSet {
    match set {
        SetArg::Id => LogicSet::Id,
        SetArg::Ood => LogicSet::Ood,
        SetArg::Unknown => LogicSet::Unknown,
    }
}

/// The seed N of a logic split name `seed{N}`.
///
/// # Errors
/// A name that is not `seed{N}`, naming `--split`.
pub(crate) fn split_seed(name: &str) -> Result<u64> {
    name.parse::<hyperlens_tasks::sraven::SplitName>()
        .ok()
        .and_then(hyperlens_tasks::sraven::SplitName::seed)
        .with_context(|| format!("--split {name}: the logic task takes a split seed{{N}}"))
}

/// The logic split a sampling command uses: `--split` if given (refused when it differs from the
/// recorded one without `--other-split`), else the split the checkpoint was trained on.
///
/// # Errors
/// A differing `--split` without `--other-split`; a split that is not `seed{N}`.
pub(crate) fn resolve_split(
    p: &ProblemArgs,
    settings: &TrainSettings,
    checkpoint: &Path,
) -> Result<LogicSplit> {
    let recorded = settings.split.clone();
    let name = match &p.split {
        Some(given) if given != &recorded && !p.other_split => bail!(
            "--split {given} differs from the split {recorded} that {} was trained on; pass \
             --other-split to use it anyway",
            checkpoint.display()
        ),
        Some(given) => given.clone(),
        None => recorded,
    };
    LogicSplit::new(settings.logic.params(), split_seed(&name)?).context("--split")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_dispatch_on_their_recorded_task() {
        let dir = tempfile::tempdir().unwrap();
        // No run files: an imported checkpoint, SRAVEN.
        assert!(matches!(
            checkpoint(dir.path()).unwrap(),
            Checkpoint::Sraven
        ));
        let record = dir.path().join(hyperlens_model::task::RECORD_FILE);
        let mut settings = TrainSettings::for_task(Task::Logic);
        settings.split = "seed4".into();
        // A record that keeps only what the reader needs (the settings), as a shipped one may.
        let text = format!(
            r#"{{"task": "logic", "settings": {}}}"#,
            serde_json::to_string(&settings).unwrap()
        );
        std::fs::write(&record, text).unwrap();
        match checkpoint(dir.path()).unwrap() {
            Checkpoint::Logic(s) => assert_eq!(*s, settings),
            other => panic!("{other:?}"),
        }
        // A logic record without the settings: refused, naming the checkpoint.
        std::fs::write(&record, r#"{"task": "logic"}"#).unwrap();
        let e = format!("{:#}", checkpoint(dir.path()).unwrap_err());
        assert!(e.contains("a logic checkpoint needs its run files"), "{e}");
        // A task that is none of hyperlens': refused, naming the file.
        std::fs::write(&record, r#"{"task": "raven"}"#).unwrap();
        let e = format!("{:#}", checkpoint(dir.path()).unwrap_err());
        assert!(
            e.contains(&record.display().to_string()) && e.contains("unknown task `raven`"),
            "{e}"
        );
        let names: Vec<&str> = [SetArg::Id, SetArg::Ood, SetArg::Unknown]
            .into_iter()
            .map(|s| logic_set(s).name())
            .collect();
        assert_eq!(names, ["id", "ood", "unknown"]);
        assert_eq!(split_seed("seed12").unwrap(), 12);
        assert!(split_seed("paper-seed0").is_err());
    }
}
