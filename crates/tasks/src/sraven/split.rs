//! Tasks and in-distribution / OOD splits (docs/spec/sraven.md, "Tasks and the split").

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::str::FromStr;

use rand::seq::SliceRandom;
use serde::Deserialize;

use super::{Rule, SravenParams};
use crate::error::{Result, TasksError};
use crate::rng::{self, Domain};

/// A task: a sorted (non-decreasing) multiset of F rule indices. Feature slot j (unpermuted) carries
/// the j-th smallest rule of the task.
pub type Task = Vec<u8>;

/// All tasks for `params.features` = F: the combinations with replacement of the 8 rules taken F, in
/// lexicographic order (as Python's `itertools.combinations_with_replacement`, which the reference
/// code uses). 330 tasks for F = 4.
pub fn all_tasks(params: &SravenParams) -> Vec<Task> {
    let f = params.features;
    let mut out = Vec::new();
    if f == 0 {
        return out;
    }
    let mut cur = vec![0u8; f];
    loop {
        out.push(cur.clone());
        // Next non-decreasing tuple: bump the right-most position that can grow, reset the tail.
        let Some(pos) = (0..f).rev().find(|&i| (cur[i] as usize) < Rule::COUNT - 1) else {
            break;
        };
        let v = cur[pos] + 1;
        for c in cur.iter_mut().skip(pos) {
            *c = v;
        }
    }
    out
}

/// Which task list a problem set draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Set {
    /// In-distribution tasks (the ones training sees).
    Id,
    /// Held-out (out-of-distribution) tasks.
    Ood,
}

impl Set {
    /// Both sets, ID first.
    pub const ALL: [Set; 2] = [Set::Id, Set::Ood];

    /// The CLI name: "id" or "ood".
    pub fn name(self) -> &'static str {
        match self {
            Set::Id => "id",
            Set::Ood => "ood",
        }
    }
}

impl fmt::Display for Set {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Set {
    type Err = TasksError;

    /// Parses "id" (or "in-distribution") and "ood" (or "out-of-distribution"), case-insensitively.
    fn from_str(s: &str) -> Result<Set> {
        match s.trim().to_ascii_lowercase().as_str() {
            "id" | "in-distribution" => Ok(Set::Id),
            "ood" | "out-of-distribution" => Ok(Set::Ood),
            _ => Err(TasksError::UnknownVariant {
                what: "set",
                value: s.to_string(),
                valid: "id, ood".to_string(),
            }),
        }
    }
}

/// The serde form of a set: its name ([`Set::name`]), read by [`FromStr`].
impl serde::Serialize for Set {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Set {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The seeds of the paper's splits, `paper-seed{N}` ([`Split::paper_names`]).
const PAPER_SEEDS: [u64; 4] = [0, 1, 2, 2024];

/// The name of a split, parsed from and printed as the name the CLI, `train.json` and the
/// sidecars use: `paper-seed{N}` (the paper's held-out lists, N in 0, 1, 2, 2024) or `seed{N}` (our
/// own seeded permutation; the only form the fuzzy-logic task takes). The one parser of split names:
/// [`FromStr`], also behind its serde form (the name as a string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SplitName {
    /// `paper-seed{N}`: the paper's held-out task list of the reference code's seed N.
    Paper(u64),
    /// `seed{N}`: tasks held out by our permutation with seed N (SRAVEN), or the fuzzy-logic
    /// split of seed N.
    Seed(u64),
}

impl SplitName {
    /// The seed of a `seed{N}` split (`None` for a paper split), as the fuzzy-logic task takes it.
    pub fn seed(self) -> Option<u64> {
        match self {
            SplitName::Seed(n) => Some(n),
            SplitName::Paper(_) => None,
        }
    }
}

impl fmt::Display for SplitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitName::Paper(n) => write!(f, "paper-seed{n}"),
            SplitName::Seed(n) => write!(f, "seed{n}"),
        }
    }
}

impl FromStr for SplitName {
    type Err = TasksError;

    /// Parses `paper-seed{0,1,2,2024}` (exactly) or `seed{N}` (N as [`u64`]'s [`FromStr`] reads it).
    ///
    /// # Errors
    /// [`TasksError::UnknownSplit`] listing the valid names.
    fn from_str(s: &str) -> Result<SplitName> {
        if let Some(rest) = s.strip_prefix("paper-seed") {
            return PAPER_SEEDS
                .into_iter()
                .find(|n| rest == n.to_string())
                .map(SplitName::Paper)
                .ok_or_else(|| unknown_split(s));
        }
        match s.strip_prefix("seed").map(str::parse::<u64>) {
            Some(Ok(n)) => Ok(SplitName::Seed(n)),
            _ => Err(unknown_split(s)),
        }
    }
}

impl serde::Serialize for SplitName {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for SplitName {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A split of all tasks into in-distribution and held-out (OOD) tasks.
///
/// `ood_tasks` keeps the order in which the split's permutation lists them (for the paper splits, the
/// order of `paper-splits.json`); `id_tasks` are the remaining tasks in lexicographic order.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// The split's name: `paper-seed0` ... or `seed{N}`.
    pub name: SplitName,
    /// The sizes the tasks are for.
    pub params: SravenParams,
    /// In-distribution tasks (248 for the defaults).
    pub id_tasks: Vec<Task>,
    /// Held-out tasks (82 for the defaults).
    pub ood_tasks: Vec<Task>,
}

/// The paper's held-out task lists, in `data/splits/paper-splits.json` (from the reference JAX code, seeds
/// 0, 1, 2, 2024; F = 4, M = 8, 25 % held out).
const PAPER_SPLITS_JSON: &str = include_str!("../../../../data/splits/paper-splits.json");

const PAPER_NAMES: [&str; 4] = [
    "paper-seed0",
    "paper-seed1",
    "paper-seed2",
    "paper-seed2024",
];

#[derive(Deserialize)]
struct PaperSplitsFile {
    splits: BTreeMap<String, Vec<Vec<i64>>>,
}

impl Split {
    /// A split drawn from our own seeded permutation of [`all_tasks`]: the first
    /// `int(n_tasks * holdout_fraction)` tasks of the permutation are OOD (docs/spec/sraven.md). Named
    /// `seed{seed}`.
    ///
    /// # Errors
    /// [`TasksError::InvalidParam`] if `params.check()` fails.
    pub fn seeded(params: SravenParams, seed: u64) -> Result<Split> {
        params.check()?;
        let mut perm = all_tasks(&params);
        perm.shuffle(&mut rng::stream(
            seed,
            Domain::SravenSplit,
            params.features as u64,
            0,
        ));
        let n_ood = params.n_ood_tasks();
        let ood_tasks = perm[..n_ood].to_vec();
        let mut id_tasks = perm[n_ood..].to_vec();
        id_tasks.sort_unstable();
        Ok(Split {
            name: SplitName::Seed(seed),
            params,
            id_tasks,
            ood_tasks,
        })
    }

    /// A split by name with the default [`SravenParams`]: one of [`Split::paper_names`] (the paper's
    /// exact held-out lists, embedded and validated on every load) or `seed{N}` (see [`Split::seeded`]).
    ///
    /// # Errors
    /// [`TasksError::UnknownSplit`] listing the valid names; [`TasksError::InvalidSplit`] if the
    /// embedded data were corrupt.
    pub fn named(name: &str) -> Result<Split> {
        Split::named_with(name, SravenParams::default())
    }

    /// Like [`Split::named`] with explicit sizes. The paper splits exist only for F = 4 and a 25 %
    /// hold-out (any M).
    ///
    /// # Errors
    /// As [`Split::named`]; [`TasksError::InvalidParam`] if `params` fail `check()` or do not fit a
    /// paper split.
    pub fn named_with(name: &str, params: SravenParams) -> Result<Split> {
        params.check()?;
        Split::of(name.parse()?, params)
    }

    /// The split `name` for the sizes `params` (see [`Split::named_with`]).
    ///
    /// # Errors
    /// [`TasksError::InvalidParam`] if `params` fail `check()` or do not fit a paper split;
    /// [`TasksError::InvalidSplit`] if the embedded data were corrupt.
    pub fn of(name: SplitName, params: SravenParams) -> Result<Split> {
        params.check()?;
        match name {
            SplitName::Seed(seed) => Split::seeded(params, seed),
            SplitName::Paper(_) => {
                let default = SravenParams::default();
                if params.features != default.features
                    || params.n_ood_tasks() != default.n_ood_tasks()
                {
                    return Err(TasksError::param(
                        "features/holdout_fraction",
                        format!("the paper split `{name}` exists only for F = 4 features with 25 % held out"),
                    ));
                }
                let ood_tasks = paper_split(&name.to_string())?;
                let held: HashSet<&Task> = ood_tasks.iter().collect();
                let id_tasks = all_tasks(&params)
                    .into_iter()
                    .filter(|t| !held.contains(t))
                    .collect();
                Ok(Split {
                    name,
                    params,
                    id_tasks,
                    ood_tasks,
                })
            }
        }
    }

    /// The names of the paper splits: "paper-seed0", "paper-seed1", "paper-seed2", "paper-seed2024".
    pub fn paper_names() -> &'static [&'static str] {
        &PAPER_NAMES
    }

    /// The task list of one set.
    pub fn tasks(&self, set: Set) -> &[Task] {
        match set {
            Set::Id => &self.id_tasks,
            Set::Ood => &self.ood_tasks,
        }
    }

    /// Whether `task` is one of the held-out tasks.
    pub fn is_ood(&self, task: &[u8]) -> bool {
        self.ood_tasks.iter().any(|t| t.as_slice() == task)
    }

    /// Checks that the split is usable for sampling: valid params; every task a non-decreasing tuple
    /// of F rule indices; ID and OOD disjoint; at least one ID task.
    ///
    /// # Errors
    /// [`TasksError::InvalidSplit`] naming the split and the first problem found.
    pub fn check(&self) -> Result<()> {
        self.params.check()?;
        let bad = |reason: String| TasksError::InvalidSplit {
            split: self.name.to_string(),
            reason,
        };
        for (list, which) in [(&self.id_tasks, "id"), (&self.ood_tasks, "ood")] {
            for t in list.iter() {
                validate_task(t, self.params.features)
                    .map_err(|r| bad(format!("{which} task {t:?}: {r}")))?;
            }
        }
        if self.id_tasks.is_empty() {
            return Err(bad("no in-distribution task".to_string()));
        }
        let ood: HashSet<&Task> = self.ood_tasks.iter().collect();
        if let Some(t) = self.id_tasks.iter().find(|t| ood.contains(t)) {
            return Err(bad(format!("task {t:?} is both in-distribution and OOD")));
        }
        Ok(())
    }
}

fn unknown_split(name: &str) -> TasksError {
    TasksError::UnknownSplit {
        name: name.to_string(),
        valid: format!("{}, seed{{N}} (e.g. seed0)", PAPER_NAMES.join(", ")),
    }
}

/// Checks one task: length F, rule indices < 8, non-decreasing.
fn validate_task(t: &[u8], features: usize) -> std::result::Result<(), String> {
    if t.len() != features {
        return Err(format!("has {} rules, expected {features}", t.len()));
    }
    if let Some(r) = t.iter().find(|&&r| r as usize >= Rule::COUNT) {
        return Err(format!("rule index {r} is not in 0..=7"));
    }
    if t.windows(2).any(|w| w[0] > w[1]) {
        return Err("is not sorted".to_string());
    }
    Ok(())
}

/// Parses and validates the embedded paper splits: each of the four names present, 82 distinct
/// sorted 4-tuples of rule indices 0..=7.
/// The held-out tasks of the paper split `name`, from the embedded splits parsed once per process
/// (checking every run of a large sweep asks for a split once per run).
fn paper_split(name: &str) -> Result<Vec<Task>> {
    type Parsed = std::result::Result<BTreeMap<String, Vec<Task>>, String>;
    static PARSED: std::sync::OnceLock<Parsed> = std::sync::OnceLock::new();
    let all = PARSED
        .get_or_init(|| parse_paper_splits(PAPER_SPLITS_JSON).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|reason| TasksError::InvalidSplit {
            split: "paper-splits.json".to_string(),
            reason: reason.clone(),
        })?;
    all.get(name).cloned().ok_or_else(|| unknown_split(name))
}

fn parse_paper_splits(json: &str) -> Result<BTreeMap<String, Vec<Task>>> {
    let file: PaperSplitsFile =
        serde_json::from_str(json).map_err(|e| TasksError::InvalidSplit {
            split: "paper-splits.json".to_string(),
            reason: e.to_string(),
        })?;
    let n_ood = SravenParams::default().n_ood_tasks();
    let mut out = BTreeMap::new();
    for name in PAPER_NAMES {
        let bad = |reason: String| TasksError::InvalidSplit {
            split: name.to_string(),
            reason,
        };
        let raw = file
            .splits
            .get(name)
            .ok_or_else(|| bad("missing from paper-splits.json".to_string()))?;
        if raw.len() != n_ood {
            return Err(bad(format!("has {} tasks, expected {n_ood}", raw.len())));
        }
        let mut tasks = Vec::with_capacity(raw.len());
        let mut seen = HashSet::new();
        for t in raw {
            let task: Task = t
                .iter()
                .map(|&r| {
                    u8::try_from(r)
                        .map_err(|_| bad(format!("task {t:?}: rule index {r} is not in 0..=7")))
                })
                .collect::<Result<_>>()?;
            validate_task(&task, 4).map_err(|r| bad(format!("task {t:?}: {r}")))?;
            if !seen.insert(task.clone()) {
                return Err(bad(format!("task {t:?} is listed twice")));
            }
            tasks.push(task);
        }
        out.insert(name.to_string(), tasks);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_tasks_are_sorted_distinct_lexicographic() {
        let p = SravenParams::default();
        let t = all_tasks(&p);
        assert_eq!(t.len(), 330);
        assert_eq!(t[0], vec![0, 0, 0, 0]);
        assert_eq!(t[1], vec![0, 0, 0, 1]);
        assert_eq!(t[8], vec![0, 0, 1, 1]);
        assert_eq!(t[329], vec![7, 7, 7, 7]);
        assert!(t.windows(2).all(|w| w[0] < w[1]));
        let p3 = SravenParams { features: 3, ..p };
        assert_eq!(all_tasks(&p3).len(), 120);
    }

    #[test]
    fn corrupt_paper_data_is_rejected() {
        let ok = PAPER_SPLITS_JSON;
        assert!(parse_paper_splits(ok).is_ok());
        // Unsorted task, duplicate task, out-of-range rule, missing split, wrong count, not JSON.
        let unsorted = ok.replacen("[2, 3, 4, 7]", "[3, 2, 4, 7]", 1);
        let dup = ok.replacen("[2, 2, 2, 7]", "[2, 3, 4, 7]", 1);
        let range = ok.replacen("[2, 3, 4, 7]", "[2, 3, 4, 8]", 1);
        let missing = ok.replacen("\"paper-seed1\"", "\"paper-seedX\"", 1);
        let short = ok.replacen("[2, 3, 4, 7], ", "", 1);
        for (bad, needle) in [
            (unsorted, "not sorted"),
            (dup, "twice"),
            (range, "not in 0..=7"),
            (missing, "missing"),
            (short, "expected 82"),
            ("{".to_string(), "paper-splits.json"),
        ] {
            let e = parse_paper_splits(&bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn split_names_parse_print_and_serialise_as_their_strings() -> Result<()> {
        for (text, name) in [
            ("paper-seed0", SplitName::Paper(0)),
            ("paper-seed2024", SplitName::Paper(2024)),
            ("seed0", SplitName::Seed(0)),
            ("seed17", SplitName::Seed(17)),
        ] {
            assert_eq!(text.parse::<SplitName>()?, name);
            assert_eq!(name.to_string(), text);
            let json = serde_json::to_string(&name)
                .map_err(|e| TasksError::param("json", e.to_string()))?;
            assert_eq!(json, format!("\"{text}\""));
            let back: SplitName = serde_json::from_str(&json)
                .map_err(|e| TasksError::param("json", e.to_string()))?;
            assert_eq!(back, name);
            assert_eq!(Split::named(text)?.name, name);
        }
        assert_eq!(SplitName::Seed(3).seed(), Some(3));
        assert_eq!(SplitName::Paper(1).seed(), None);
        for bad in [
            "paper-seed3",
            "paper-seed01",
            "seedx",
            "seed",
            "",
            "Seed0",
            "paper",
        ] {
            let e = bad.parse::<SplitName>().unwrap_err().to_string();
            assert!(e.contains("paper-seed2024"), "{bad}: {e}");
        }
        assert!(serde_json::from_str::<SplitName>("\"paper-seed5\"").is_err());
        Ok(())
    }
}
