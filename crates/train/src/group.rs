//! Groups of runs trained together ([`crate::train_group`]): the runs that lists of seeds, splits,
//! learning rates and weight decays describe (zipped or as a grid), their directory names, and the
//! group directory's `group.json` that lets the group be resumed as one.
//!
//! ```text
//! runs/NAME/group.json                   {"combine": "zip", "runs": ["seed-0_split-paper-seed0", ...]}
//! runs/NAME/seed-0_split-paper-seed0/    an ordinary run directory (readable by every command)
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::settings::TrainSettings;
use crate::state::write_json;

/// The file of a group directory that names its runs.
pub const GROUP_FILE: &str = "group.json";

/// How lists of values combine into runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Combine {
    /// The i-th run takes the i-th value of every list (lists of one value apply to every run;
    /// the others must have one length). The paper couples seed `s` with split `paper-seed{s}`
    /// this way.
    #[default]
    Zip,
    /// Every combination of the lists' values, in the order seeds, splits, learning rates,
    /// weight decays, the first list outermost.
    Grid,
}

/// The values that the runs of a group take (an empty list keeps the base settings' value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Variation {
    /// Seeds (`--seeds`).
    pub seeds: Vec<u64>,
    /// Splits (`--splits`).
    pub splits: Vec<String>,
    /// Peak learning rates (`--lr a,b`).
    pub lrs: Vec<f64>,
    /// Weight decays (`--weight-decay a,b`).
    pub weight_decays: Vec<f64>,
}

/// A number as the shorter of its plain and its exponent form (`0.1`, `3e-4`, `1e30`).
fn short(v: f64) -> String {
    let (plain, exp) = (v.to_string(), format!("{v:e}"));
    if exp.len() < plain.len() {
        exp
    } else {
        plain
    }
}

/// One axis of a variation: its name in run names, and its values as settings edits.
type Axis = (&'static str, Vec<(String, Edit)>);

/// One edit of the settings.
#[derive(Debug, Clone)]
enum Edit {
    Seed(u64),
    Split(String),
    Lr(f64),
    WeightDecay(f64),
}

impl Edit {
    fn apply(&self, s: &mut TrainSettings) {
        match self {
            Edit::Seed(v) => s.seed = *v,
            Edit::Split(v) => s.split.clone_from(v),
            Edit::Lr(v) => s.lr = *v,
            Edit::WeightDecay(v) => s.weight_decay = *v,
        }
    }
}

impl Variation {
    /// The non-empty lists as axes, in the order seeds, splits, learning rates, weight decays.
    fn axes(&self) -> Vec<Axis> {
        let mut axes: Vec<Axis> = Vec::new();
        let mut push = |name: &'static str, values: Vec<(String, Edit)>| {
            if !values.is_empty() {
                axes.push((name, values));
            }
        };
        push(
            "seed",
            self.seeds
                .iter()
                .map(|&v| (v.to_string(), Edit::Seed(v)))
                .collect(),
        );
        push(
            "split",
            self.splits
                .iter()
                .map(|v| (v.clone(), Edit::Split(v.clone())))
                .collect(),
        );
        push(
            "lr",
            self.lrs.iter().map(|&v| (short(v), Edit::Lr(v))).collect(),
        );
        push(
            "wd",
            self.weight_decays
                .iter()
                .map(|&v| (short(v), Edit::WeightDecay(v)))
                .collect(),
        );
        axes
    }

    /// Whether the variation describes a group (any list given).
    pub fn is_group(&self) -> bool {
        !self.axes().is_empty()
    }

    /// The runs of the group: `base` with each combination of the lists' values, and each run's
    /// directory name, which names the values that differ between runs (`seed-1_split-paper-seed1`;
    /// `seed-N` for a group of one run).
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] for no list, lists of unequal lengths in a zip, a value that
    /// appears twice in one list, settings that do not check, or more runs than the memory
    /// budget allows to train together ([`crate::check_memory`], checked before any run is
    /// built).
    pub fn expand(
        &self,
        base: &TrainSettings,
        combine: Combine,
    ) -> Result<Vec<(String, TrainSettings)>> {
        let axes = self.axes();
        if axes.is_empty() {
            return Err(TrainError::InvalidParam(
                "a group needs --seeds, --splits, or a list for --lr or --weight-decay".into(),
            ));
        }
        for (name, values) in &axes {
            let mut seen = std::collections::HashSet::with_capacity(values.len());
            if let Some((v, _)) = values.iter().find(|(v, _)| !seen.insert(v.as_str())) {
                return Err(TrainError::InvalidParam(format!(
                    "{name} {v} is listed twice"
                )));
            }
        }
        // The number of runs, bounded by the memory that many models would take in training
        // before any of them is built.
        let n_runs = match combine {
            Combine::Zip => axes.iter().map(|(_, v)| v.len()).max().unwrap_or(1),
            Combine::Grid => axes
                .iter()
                .fold(1usize, |acc, (_, v)| acc.saturating_mul(v.len())),
        };
        crate::run::check_memory(base, n_runs)?;
        // Each run as the index of its value on every axis.
        let picks: Vec<Vec<usize>> = match combine {
            Combine::Zip => {
                let n = axes.iter().map(|(_, v)| v.len()).max().unwrap_or(1);
                if let Some((name, v)) = axes.iter().find(|(_, v)| v.len() != 1 && v.len() != n) {
                    return Err(TrainError::InvalidParam(format!(
                        "zipped lists must have one length (or one value): {name} has {}, \
                         another list {n}; pass --grid for every combination",
                        v.len()
                    )));
                }
                (0..n)
                    .map(|i| {
                        axes.iter()
                            .map(|(_, v)| if v.len() == 1 { 0 } else { i })
                            .collect()
                    })
                    .collect()
            }
            Combine::Grid => {
                let mut picks = vec![Vec::new()];
                for (_, v) in &axes {
                    picks = picks
                        .into_iter()
                        .flat_map(|p| {
                            (0..v.len()).map(move |i| {
                                let mut q = p.clone();
                                q.push(i);
                                q
                            })
                        })
                        .collect();
                }
                picks
            }
        };
        let varies: Vec<bool> = axes
            .iter()
            .enumerate()
            .map(|(a, _)| picks.iter().any(|p| p[a] != picks[0][a]))
            .collect();
        picks
            .iter()
            .map(|p| {
                let mut s = base.clone();
                let mut parts = Vec::new();
                for (a, (name, values)) in axes.iter().enumerate() {
                    let (label, edit) = &values[p[a]];
                    edit.apply(&mut s);
                    if varies[a] {
                        parts.push(format!("{name}-{label}"));
                    }
                }
                if parts.is_empty() {
                    parts.push(format!("seed-{}", s.seed));
                }
                s.check()?;
                Ok((parts.join("_"), s))
            })
            .collect()
    }
}

/// `group.json`: how the group was combined and its runs' directory names, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupFile {
    /// How the lists were combined.
    pub combine: Combine,
    /// The runs' directory names (subdirectories of the group directory).
    pub runs: Vec<String>,
}

impl GroupFile {
    /// Lays out a new group in `out` (which the caller has found absent or empty) for `members`
    /// (name, settings), combined as `combine`: checks that they can train together
    /// ([`crate::check_group`]) before anything is made, then creates `out` and writes its
    /// `group.json`. Returns the runs, each in `out/<name>`. The one definition of a new group for
    /// `hyperlens train` and `hl.train`.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] from [`crate::check_group`]; I/O errors naming the directory or
    /// file.
    pub fn create(
        out: &Path,
        combine: Combine,
        members: Vec<(String, TrainSettings)>,
    ) -> Result<Vec<crate::GroupRun>> {
        let file = GroupFile {
            combine,
            runs: members.iter().map(|(n, _)| n.clone()).collect(),
        };
        let runs: Vec<crate::GroupRun> = members
            .into_iter()
            .map(|(name, settings)| crate::GroupRun {
                out: out.join(name),
                settings,
            })
            .collect();
        crate::check_group(&runs)?;
        std::fs::create_dir_all(out).map_err(|source| TrainError::Io {
            path: out.display().to_string(),
            source,
        })?;
        file.write(out)?;
        Ok(runs)
    }

    /// Writes `group.json` into the group directory `dir` (atomically).
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_json(&dir.join(GROUP_FILE), self)
    }

    /// Reads `group.json` of the group directory `dir`; `None` if it has none.
    ///
    /// # Errors
    /// [`TrainError::Json`] naming the file if it is malformed; [`TrainError::InvalidParam`]
    /// naming the file and the entry if it lists no run, a run twice, or a name that breaks
    /// [`check_run_name`] (a path that would leave the group directory); I/O errors, among them a
    /// `group.json` that is not a regular file (a FIFO is refused, not waited on).
    pub fn read(dir: &Path) -> Result<Option<GroupFile>> {
        let path = dir.join(GROUP_FILE);
        let text = match hyperlens_io::read_regular(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(TrainError::Io {
                    path: path.display().to_string(),
                    source,
                })
            }
        };
        let file: GroupFile = serde_json::from_slice(&text).map_err(|source| TrainError::Json {
            path: path.display().to_string(),
            source,
        })?;
        if file.runs.is_empty() {
            return Err(TrainError::InvalidParam(format!(
                "{}: `runs` is empty; a group has at least one run (the file is damaged)",
                path.display()
            )));
        }
        let mut seen = std::collections::HashSet::with_capacity(file.runs.len());
        for (i, name) in file.runs.iter().enumerate() {
            check_run_name(name).map_err(|why| {
                TrainError::InvalidParam(format!(
                    "{}: runs[{i}] {}: {why}",
                    path.display(),
                    shown_name(name)
                ))
            })?;
            if !seen.insert(name.as_str()) {
                return Err(TrainError::InvalidParam(format!(
                    "{}: runs[{i}] `{name}` is listed twice",
                    path.display()
                )));
            }
        }
        Ok(Some(file))
    }
}

/// The longest run name, in bytes (a directory name on every common file system).
pub const MAX_RUN_NAME: usize = 255;

/// Checks that `name` is a run name of the kind hyperlens writes (the directory of one run inside
/// a group or a sweep: `seed-1_split-paper-seed1`, `mixer-hyla_lr-3e-4`): 1 to [`MAX_RUN_NAME`]
/// bytes of ASCII letters, digits, `_`, `-`, `+` and `.`, not starting with `.`. Such a name is
/// one directory directly inside the group or sweep: never empty, `.`, `..`, absolute, hidden or
/// holding a separator, a space or a control character. Every name read from a file
/// (`group.json`, a sweep's `plan.json`) goes through this check before it is joined to a path.
///
/// # Errors
/// The reason, in words, for a name that breaks the rule.
pub fn check_run_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("an empty run name".into());
    }
    if name.len() > MAX_RUN_NAME {
        return Err(format!(
            "a run name of {} bytes (at most {MAX_RUN_NAME})",
            name.len()
        ));
    }
    if name.starts_with('.') {
        return Err(
            "a run name may not start with `.` (it would leave or hide the run's directory)".into(),
        );
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+' | '.')))
    {
        return Err(format!(
            "a run name holds {c:?}; run names hold only ASCII letters, digits, `_`, `-`, `+` and `.`"
        ));
    }
    Ok(())
}

/// A name for an error message: quoted with its control characters escaped, and cut to 80
/// characters.
pub fn shown_name(name: &str) -> String {
    let mut s: String = name.chars().take(80).collect();
    if s.len() < name.len() {
        s.push_str("...");
    }
    format!("{s:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Task;

    fn base() -> TrainSettings {
        TrainSettings::for_task(Task::Sraven)
    }

    #[test]
    fn zip_couples_seeds_and_splits_and_names_what_differs() {
        let v = Variation {
            seeds: vec![0, 1, 2],
            splits: vec![
                "paper-seed0".into(),
                "paper-seed1".into(),
                "paper-seed2".into(),
            ],
            lrs: vec![3e-4],
            ..Default::default()
        };
        let runs = v.expand(&base(), Combine::Zip).unwrap();
        let names: Vec<&str> = runs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "seed-0_split-paper-seed0",
                "seed-1_split-paper-seed1",
                "seed-2_split-paper-seed2"
            ]
        );
        assert_eq!(
            (runs[2].1.seed, runs[2].1.split.as_str()),
            (2, "paper-seed2")
        );
        assert!(runs.iter().all(|(_, s)| s.lr == 3e-4));
        // A group of one run is named by its seed.
        let one = Variation {
            seeds: vec![7],
            ..Default::default()
        };
        assert_eq!(one.expand(&base(), Combine::Zip).unwrap()[0].0, "seed-7");
    }

    #[test]
    fn grid_takes_every_combination_and_bad_lists_are_refused() {
        let v = Variation {
            seeds: vec![0, 1],
            lrs: vec![1e-3, 3e-4],
            weight_decays: vec![0.1],
            ..Default::default()
        };
        let runs = v.expand(&base(), Combine::Grid).unwrap();
        let names: Vec<&str> = runs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "seed-0_lr-1e-3",
                "seed-0_lr-3e-4",
                "seed-1_lr-1e-3",
                "seed-1_lr-3e-4"
            ]
        );
        assert!(v.expand(&base(), Combine::Zip).is_ok());
        let bad = Variation {
            seeds: vec![0, 1, 2],
            lrs: vec![1e-3, 3e-4],
            ..Default::default()
        };
        let err = bad.expand(&base(), Combine::Zip).unwrap_err().to_string();
        assert!(err.contains("--grid"), "{err}");
        let twice = Variation {
            seeds: vec![1, 1],
            ..Default::default()
        };
        assert!(twice.expand(&base(), Combine::Zip).is_err());
        assert!(Variation::default().expand(&base(), Combine::Zip).is_err());
        let bad_split = Variation {
            splits: vec!["nope".into()],
            ..Default::default()
        };
        assert!(bad_split.expand(&base(), Combine::Zip).is_err());
    }

    #[test]
    fn group_file_round_trip_and_names_inside_the_group() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(GroupFile::read(dir.path()).unwrap(), None);
        let g = GroupFile {
            combine: Combine::Grid,
            runs: vec!["seed-0".into(), "seed-1".into()],
        };
        g.write(dir.path()).unwrap();
        assert_eq!(GroupFile::read(dir.path()).unwrap(), Some(g));
        std::fs::write(
            dir.path().join(GROUP_FILE),
            r#"{"combine":"zip","runs":["../elsewhere"]}"#,
        )
        .unwrap();
        assert!(GroupFile::read(dir.path()).is_err());
        // Damage is refused with the entry at fault, never read as "nothing to do".
        for (text, needle) in [
            (r#"{"combine":"zip","runs":[]}"#, "`runs` is empty"),
            (r#"{"combine":"zip","runs":["seed-0",""]}"#, "runs[1]"),
            (r#"{"combine":"zip","runs":["/abs"]}"#, "runs[0]"),
            (r#"{"combine":"zip","runs":[".."]}"#, "runs[0]"),
            (r#"{"combine":"zip","runs":["a\nb"]}"#, "runs[0]"),
            (
                r#"{"combine":"zip","runs":["seed-0","seed-0"]}"#,
                "listed twice",
            ),
        ] {
            std::fs::write(dir.path().join(GROUP_FILE), text).unwrap();
            let e = GroupFile::read(dir.path()).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains(GROUP_FILE), "{text}: {e}");
        }
    }

    #[test]
    fn run_names_are_single_directories_of_the_names_hyperlens_writes() {
        for ok in [
            "seed-0",
            "seed-1_split-paper-seed1",
            "mixer-hyla_lr-3e-4",
            "lr-1e+30",
            "a.b",
        ] {
            assert_eq!(check_run_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "", ".", "..", ".x", "../x", "/x", "a/b", "a\\b", "a b", "a\nb", "\u{e9}",
        ] {
            assert!(check_run_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_run_name(&"a".repeat(256)).is_err());
        assert!(check_run_name(&"a".repeat(255)).is_ok());
        // Every name a group expands to passes.
        let v = Variation {
            seeds: vec![0, 1],
            lrs: vec![1e-3, 3e-4, 1e30],
            weight_decays: vec![0.0, 0.1],
            splits: vec!["paper-seed0".into()],
        };
        for (name, _) in v.expand(&base(), Combine::Grid).unwrap() {
            assert_eq!(check_run_name(&name), Ok(()), "{name}");
        }
    }

    #[test]
    fn a_group_larger_than_the_memory_budget_is_refused_before_it_is_built() {
        // 10^4 x 10^4 x 10^4 combinations: the old expansion allocated them all first.
        let v = Variation {
            seeds: (0..10_000).collect(),
            lrs: (1..=10_000).map(|i| i as f64 * 1e-7).collect(),
            weight_decays: (0..10_000).map(|i| i as f64 * 1e-5).collect(),
            ..Default::default()
        };
        let e = v.expand(&base(), Combine::Grid).unwrap_err().to_string();
        assert!(
            e.contains("1000000000000 runs trained together") && e.contains("memory budget"),
            "{e}"
        );
    }
}
