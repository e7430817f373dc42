//! A fuzzy-logic problem set as `hyperlens tasks sample --task logic` and Python's
//! `hyperlens.tasks.sample` draw it: the split, the sequences of one set from an evaluation
//! stream, and the inputs variant applied. [`sample_problem_set`] is the one definition both fronts
//! call; [`LogicSetSidecar`] is the JSON sidecar the CLI writes beside the `.npz`.

use serde::{Deserialize, Serialize};

use super::{
    fixed_context, fixed_query, sample_logic_set, LogicBatch, LogicInputs, LogicParams, LogicSet,
    LogicSplit, LOGIC_SET_CHUNK,
};
use crate::error::{Result, TasksError};

/// Which inputs every sequence gets (the paper's callback variants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputsVariant {
    /// Every token's inputs drawn afresh.
    Uniform,
    /// One query, drawn from the set's seed, for every sequence.
    FixedQuery,
    /// One context, drawn from the set's seed, for every sequence.
    FixedContext,
}

impl InputsVariant {
    /// The variant of the fronts' two switches (`--fixed-query`, `--fixed-context`).
    ///
    /// # Errors
    /// [`TasksError::InvalidInput`] when both are set.
    pub fn from_flags(fixed_query: bool, fixed_context: bool) -> Result<Self> {
        match (fixed_query, fixed_context) {
            (true, true) => Err(TasksError::input(
                "fixed_query",
                "fixed_query and fixed_context exclude each other",
            )),
            (true, false) => Ok(Self::FixedQuery),
            (false, true) => Ok(Self::FixedContext),
            (false, false) => Ok(Self::Uniform),
        }
    }
}

impl LogicParams {
    /// These sizes with `samples` and `frac_test` replaced where given (the fronts' options
    /// over a base such as training's defaults).
    pub fn with_overrides(mut self, samples: Option<usize>, frac_test: Option<f64>) -> Self {
        if let Some(n) = samples {
            self.samples = n;
        }
        if let Some(f) = frac_test {
            self.frac_test = f;
        }
        self
    }
}

/// What [`sample_problem_set`] draws.
#[derive(Debug, Clone, PartialEq)]
pub struct ProblemSetParams {
    /// The task's sizes.
    pub params: LogicParams,
    /// The split's seed (split `seed{N}`).
    pub split_seed: u64,
    /// The set.
    pub set: LogicSet,
    /// Sequences (at least 1).
    pub n: usize,
    /// Seed of the evaluation stream (and of a fixed query or context).
    pub seed: u64,
    /// The inputs variant.
    pub inputs: InputsVariant,
}

/// The result of [`sample_problem_set`].
#[derive(Debug, Clone)]
pub struct ProblemSet {
    /// The split.
    pub split: LogicSplit,
    /// The inputs applied.
    pub inputs: LogicInputs,
    /// The sequences.
    pub problems: LogicBatch,
}

/// Draws `p.n` sequences of `p.set` of split `seed{p.split_seed}` from evaluation stream `p.seed`
/// ([`sample_logic_set`], chunks of [`LOGIC_SET_CHUNK`]) and applies the inputs variant
/// ([`fixed_query`] / [`fixed_context`] of `p.seed`).
///
/// # Shapes
/// As [`LogicBatch`] with B = `p.n`.
///
/// # Errors
/// [`TasksError::InvalidInput`] for `n` = 0 (named `n`); [`TasksError::InvalidParam`] from the
/// split's parameters; [`TasksError::Budget`] for a set over the memory budget; a set without
/// tasks.
pub fn sample_problem_set(p: &ProblemSetParams) -> Result<ProblemSet> {
    if p.n == 0 {
        return Err(TasksError::input("n", "must be at least 1"));
    }
    let split = LogicSplit::new(p.params, p.split_seed)?;
    let mut problems = sample_logic_set(&split, p.set, p.n, p.seed)?;
    let inputs = match p.inputs {
        InputsVariant::Uniform => LogicInputs::Uniform,
        InputsVariant::FixedQuery => LogicInputs::FixedQuery(fixed_query(&p.params, p.seed)),
        InputsVariant::FixedContext => LogicInputs::FixedContext(fixed_context(&p.params, p.seed)),
    };
    inputs.apply(&mut problems)?;
    Ok(ProblemSet {
        split,
        inputs,
        problems,
    })
}

/// The task's sizes in a logic set's sidecar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SidecarParams {
    /// Fraction of the known-term pairs held out.
    pub frac_test: f64,
    /// Samples (tokens) per sequence.
    pub samples: usize,
    /// Terms per task.
    pub terms: usize,
    /// Fraction of the terms never trained.
    pub unknown_fraction: f64,
    /// Variables.
    pub variables: usize,
}

/// The arrays of a logic set's `.npz`, with their dtypes and shapes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SidecarArrays {
    /// `targets`.
    pub targets: String,
    /// `term_ids`.
    pub term_ids: String,
    /// `terms`.
    pub terms: String,
    /// `x`.
    pub x: String,
    /// `y`.
    pub y: String,
}

/// The JSON sidecar of a logic problem set written by `hyperlens tasks sample --task logic` (keys
/// in alphabetical order, as the file has always had them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogicSetSidecar {
    /// What each array holds.
    pub arrays: SidecarArrays,
    /// The inputs variant's name.
    pub inputs: String,
    /// Sequences.
    pub n: usize,
    /// The task's sizes.
    pub params: SidecarParams,
    /// `hyperlens {version} tasks sample`.
    pub producer: String,
    /// Seed of the evaluation stream.
    pub seed: u64,
    /// The set's name.
    pub set: String,
    /// The split's name.
    pub split: String,
    /// Sequences per stream index.
    pub stream_chunk: usize,
    /// The task's name, `logic`.
    pub task: String,
}

impl LogicSetSidecar {
    /// The sidecar of `set` drawn with `p` from split `split` by `producer`.
    pub fn new(set: &ProblemSet, p: &ProblemSetParams, split: &str, producer: String) -> Self {
        let q = &p.params;
        let s = |t: &str| t.to_string();
        Self {
            arrays: SidecarArrays {
                targets: s("float32 [N, T]"),
                term_ids: s("int64 [N, K]"),
                terms: s("uint8 [N, K, L]"),
                x: s("float32 [N, T, L + 1]"),
                y: s("float32 [N]"),
            },
            inputs: set.inputs.name().to_string(),
            n: p.n,
            params: SidecarParams {
                frac_test: q.frac_test,
                samples: q.samples,
                terms: q.terms,
                unknown_fraction: q.unknown_fraction,
                variables: q.variables,
            },
            producer,
            seed: p.seed,
            set: p.set.name().to_string(),
            split: split.to_string(),
            stream_chunk: LOGIC_SET_CHUNK,
            task: s("logic"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n: usize, inputs: InputsVariant) -> ProblemSetParams {
        ProblemSetParams {
            params: LogicParams::default(),
            split_seed: 1,
            set: LogicSet::Id,
            n,
            seed: 3,
            inputs,
        }
    }

    #[test]
    fn the_set_is_the_stream_with_the_variant_applied() {
        let p = params(300, InputsVariant::FixedQuery);
        let got = sample_problem_set(&p).unwrap();
        let split = LogicSplit::new(p.params, 1).unwrap();
        let mut want = sample_logic_set(&split, LogicSet::Id, 300, 3).unwrap();
        let q = fixed_query(&p.params, 3);
        LogicInputs::FixedQuery(q.clone()).apply(&mut want).unwrap();
        assert_eq!(got.problems.x, want.x);
        assert_eq!(got.problems.y, want.y);
        assert_eq!(got.problems.term_ids, want.term_ids);
        assert_eq!(got.inputs, LogicInputs::FixedQuery(q));
        let uniform = sample_logic_set(&split, LogicSet::Id, 300, 3).unwrap();
        assert_ne!(got.problems.x, uniform.x);
    }

    #[test]
    fn bad_requests_are_named() {
        let e = sample_problem_set(&params(0, InputsVariant::Uniform)).unwrap_err();
        assert!(e.to_string().contains('n'), "{e}");
        assert!(InputsVariant::from_flags(true, true).is_err());
        assert_eq!(
            InputsVariant::from_flags(false, true).unwrap(),
            InputsVariant::FixedContext
        );
    }

    #[test]
    fn the_sidecar_has_the_files_keys_in_order() {
        let p = params(2, InputsVariant::Uniform);
        let set = sample_problem_set(&p).unwrap();
        let side = LogicSetSidecar::new(&set, &p, "seed1", "x".into());
        let v = serde_json::to_value(&side).unwrap();
        assert_eq!(v["inputs"], "uniform");
        assert_eq!(v["params"]["samples"], 16);
        assert_eq!(v["stream_chunk"], 256);
        let text = serde_json::to_string(&side).unwrap();
        let keys = [
            "\"arrays\"",
            "\"inputs\"",
            "\"n\"",
            "\"params\"",
            "\"producer\"",
            "\"seed\"",
            "\"set\"",
            "\"split\"",
            "\"stream_chunk\"",
            "\"task\"",
        ];
        let pos: Vec<usize> = keys.iter().map(|k| text.find(k).unwrap()).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{text}");
    }
}
