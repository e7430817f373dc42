//! The fuzzy-logic task, the second benchmark of Schug et al. 2024 (docs/spec/sraven.md, last section;
//! the authors' `hyla/data/logic.py`).
//!
//! A task is a disjunction of K conjunctive terms over L variables in [0, 1]. A term is a bit vector
//! t in {0,1}^L; its literal for variable i is x_i if t_i = 1 and 1 - x_i otherwise; the term's value is
//! the minimum of its literals and the task's value f(x) the maximum over its terms (Zadeh logic).
//! All 2^L terms are listed in binary order (term index i has bit t_v = (i >> (L - 1 - v)) & 1, so
//! 0000, 0001, ... with variable 0 the most significant bit). The last `int(2^L * unknown_fraction)`
//! terms are never trained ("unknown"); tasks are the K-combinations of the known terms, shuffled with
//! the split seed, of which the first `int(n * frac_test)` are held out as the compositional test set
//! (the OOD set, [`LogicSet::Ood`]); the rest are the training tasks (the ID set, [`LogicSet::Id`]).
//! The unknown set ([`LogicSet::Unknown`]) holds the K-combinations of unknown terms.
//!
//! A sequence holds N samples; token n = (x_1..x_L, f(x)) with the final token's f zeroed: the model
//! predicts it (MSE at the last position). Metric: R² per sequence, 1 - (pred - y)² / var, where var is
//! the variance of the sequence's N targets (the reference's `base_mse`).

use ndarray::{Array1, Array2, Array3, ArrayView1, ArrayView2};
use rand::seq::SliceRandom;
use rand::Rng;

use crate::error::{Result, TasksError};
use crate::rng::{self, Domain};

mod arrays;
mod inputs;
pub mod problem_set;
pub use arrays::LogicArrays;
pub use inputs::{fix_context, fix_query, fixed_context, fixed_query, LogicInputs};
pub use problem_set::{
    sample_problem_set, InputsVariant, LogicSetSidecar, ProblemSet, ProblemSetParams,
};

/// Sizes of the fuzzy-logic task. Defaults: L = 4 variables, K = 2 terms, 25 % unknown terms,
/// 30 % of the known-term tasks held out, N = 16 samples per sequence.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LogicParams {
    /// L: number of variables (1..=12).
    pub variables: usize,
    /// K: terms per task (>= 1).
    pub terms: usize,
    /// Fraction of the 2^L terms (the last ones in binary order) that are never trained, in [0, 1).
    pub unknown_fraction: f64,
    /// Fraction of the known-term tasks held out as the compositional test set (paper: 0.3, 0.5,
    /// 0.7), in [0, 1).
    pub frac_test: f64,
    /// N: samples (tokens) per sequence, the last one being the query (>= 1; paper 16, ablation 32).
    pub samples: usize,
}

impl LogicParams {
    /// The bytes that a [`LogicBatch`] of `n` sequences holds (`x`, `y`, `targets` float32, `terms`
    /// uint8, `term_ids` uint32); saturating, so that a hostile `n` cannot wrap around.
    ///
    /// # Units
    /// Bytes.
    pub fn set_bytes(&self, n: usize) -> u128 {
        let (t, l, k) = (
            self.samples as u128,
            self.variables as u128,
            self.terms as u128,
        );
        let per = 4 * (t * (l + 1) + 1 + t) + k * l + 4 * k;
        per.saturating_mul(n as u128)
    }
}

impl Default for LogicParams {
    fn default() -> Self {
        LogicParams {
            variables: 4,
            terms: 2,
            unknown_fraction: 0.25,
            frac_test: 0.3,
            samples: 16,
        }
    }
}

/// Largest number of tasks a split may enumerate.
const MAX_TASKS: u128 = 10_000_000;

fn binomial(n: usize, k: usize) -> u128 {
    if k > n {
        return 0;
    }
    let mut c: u128 = 1;
    for i in 0..k {
        c = c * (n - i) as u128 / (i + 1) as u128;
        if c > MAX_TASKS * 1000 {
            return c;
        }
    }
    c
}

impl LogicParams {
    /// Number of terms 2^L.
    pub fn n_terms(&self) -> usize {
        1 << self.variables
    }

    /// Number of unknown terms, `int(2^L * unknown_fraction)`.
    pub fn n_unknown(&self) -> usize {
        (self.n_terms() as f64 * self.unknown_fraction).floor() as usize
    }

    /// Validates the parameters.
    ///
    /// # Errors
    /// [`TasksError::InvalidParam`] naming the field: `variables` outside 1..=12, `terms` 0 or more
    /// than the known terms, fractions outside [0, 1), `samples` 0, fewer than one training task, or
    /// more than 10 million tasks.
    pub fn check(&self) -> Result<()> {
        if !(1..=12).contains(&self.variables) {
            return Err(TasksError::param(
                "variables",
                format!("{} is not in 1..=12", self.variables),
            ));
        }
        for (name, v) in [
            ("unknown_fraction", self.unknown_fraction),
            ("frac_test", self.frac_test),
        ] {
            if !(v.is_finite() && (0.0..1.0).contains(&v)) {
                return Err(TasksError::param(name, format!("{v} is not in [0, 1)")));
            }
        }
        let known = self.n_terms() - self.n_unknown();
        if self.terms == 0 || self.terms > known {
            return Err(TasksError::param(
                "terms",
                format!("{} is not in 1..={known} (the known terms)", self.terms),
            ));
        }
        if self.samples == 0 {
            return Err(TasksError::param("samples", "must be at least 1"));
        }
        let n = binomial(known, self.terms) + binomial(self.n_unknown(), self.terms);
        if n > MAX_TASKS {
            return Err(TasksError::param(
                "terms",
                format!("{n} tasks is more than {MAX_TASKS}"),
            ));
        }
        let n_known = binomial(known, self.terms) as usize;
        if n_known - (n_known as f64 * self.frac_test).floor() as usize == 0 {
            return Err(TasksError::param(
                "frac_test",
                "no training task would remain",
            ));
        }
        Ok(())
    }

    /// The bits of term `index` (binary order, variable 0 most significant).
    pub fn term_bits(&self, index: usize) -> Vec<u8> {
        (0..self.variables)
            .map(|v| ((index >> (self.variables - 1 - v)) & 1) as u8)
            .collect()
    }
}

/// Which task list a batch draws from. The names (`id`, `ood`, `unknown`) are the CLI's `--set`
/// and those of every file that names a set. The discriminant keys the set's random stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogicSet {
    /// The training tasks (pairs of known terms not held out): in distribution.
    Id = 0,
    /// Held-out pairs of known terms (compositional generalisation): out of distribution.
    Ood = 1,
    /// Pairs of unknown terms (never seen in training).
    Unknown = 2,
}

impl LogicSet {
    /// Every set, in the order `id`, `ood`, `unknown`.
    pub const ALL: [LogicSet; 3] = [LogicSet::Id, LogicSet::Ood, LogicSet::Unknown];

    /// `id`, `ood` or `unknown`.
    pub fn name(self) -> &'static str {
        match self {
            LogicSet::Id => "id",
            LogicSet::Ood => "ood",
            LogicSet::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for LogicSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for LogicSet {
    type Err = crate::error::TasksError;

    /// Parses a set's [`name`](LogicSet::name): `id`, `ood` or `unknown`.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        LogicSet::ALL
            .into_iter()
            .find(|set| set.name() == s)
            .ok_or_else(|| crate::error::TasksError::UnknownVariant {
                what: "set",
                value: s.to_string(),
                valid: "id, ood, unknown".to_string(),
            })
    }
}

/// A SRAVEN set as the set of the same name (`id`, `ood`): the vocabulary of the files that
/// name a set of either task (a codes file's sidecar).
impl From<crate::sraven::Set> for LogicSet {
    fn from(s: crate::sraven::Set) -> Self {
        match s {
            crate::sraven::Set::Id => LogicSet::Id,
            crate::sraven::Set::Ood => LogicSet::Ood,
        }
    }
}

/// The serde form of a set: its [`name`](LogicSet::name).
impl serde::Serialize for LogicSet {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for LogicSet {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Whether a batch belongs to the training stream or to an evaluation stream. The two are keyed
/// differently, so evaluating on training tasks (`LogicSet::Id`, `Purpose::Eval`) never reuses
/// training sequences of the same seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// The training stream.
    Train,
    /// Evaluation / probing.
    Eval,
}

/// The tasks of one fuzzy-logic split; each task is a sorted list of K term indices.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicSplit {
    /// The sizes.
    pub params: LogicParams,
    /// The seed of the task shuffle.
    pub seed: u64,
    /// Training tasks (the ID set).
    pub id: Vec<Vec<usize>>,
    /// Held-out known-term tasks (the OOD set: the first `int(n * frac_test)` of the shuffle).
    pub ood: Vec<Vec<usize>>,
    /// Tasks made of unknown terms only (the unknown set).
    pub unknown: Vec<Vec<usize>>,
}

impl LogicSplit {
    /// The split's name, `seed{N}`.
    pub fn name(&self) -> crate::sraven::SplitName {
        crate::sraven::SplitName::Seed(self.seed)
    }
}

/// K-combinations of `items` in lexicographic order.
fn combinations(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    let n = items.len();
    let mut out = Vec::new();
    if k == 0 || k > n {
        return out;
    }
    let mut idx: Vec<usize> = (0..k).collect();
    loop {
        out.push(idx.iter().map(|&i| items[i]).collect());
        let Some(pos) = (0..k).rev().find(|&i| idx[i] < n - k + i) else {
            break;
        };
        idx[pos] += 1;
        for i in pos + 1..k {
            idx[i] = idx[i - 1] + 1;
        }
    }
    out
}

impl LogicSplit {
    /// Builds the split: known-term K-combinations shuffled with `seed`, the first
    /// `int(n * frac_test)` held out (as the reference code does).
    ///
    /// # Errors
    /// [`TasksError::InvalidParam`] if `params.check()` fails.
    pub fn new(params: LogicParams, seed: u64) -> Result<LogicSplit> {
        params.check()?;
        let n_terms = params.n_terms();
        let n_known = n_terms - params.n_unknown();
        let known: Vec<usize> = (0..n_known).collect();
        let unknown: Vec<usize> = (n_known..n_terms).collect();
        let mut tasks = combinations(&known, params.terms);
        tasks.shuffle(&mut rng::stream(
            seed,
            Domain::LogicSplit,
            params.variables as u64,
            params.terms as u64,
        ));
        let n_test = (tasks.len() as f64 * params.frac_test).floor() as usize;
        let train = tasks.split_off(n_test);
        Ok(LogicSplit {
            params,
            seed,
            id: train,
            ood: tasks,
            unknown: combinations(&unknown, params.terms),
        })
    }

    /// The task list of one set.
    pub fn tasks(&self, set: LogicSet) -> &[Vec<usize>] {
        match set {
            LogicSet::Id => &self.id,
            LogicSet::Ood => &self.ood,
            LogicSet::Unknown => &self.unknown,
        }
    }
}

/// A batch of fuzzy-logic sequences.
///
/// # Shapes
/// - `x`: [B, N, L + 1]: token n = (x_1..x_L, f(x)); the last token's f is 0.
/// - `y`: `[B]` the target f(x) of the last token.
/// - `targets`: [B, N] f(x) of every token (the last equals `y`), for the R² baseline.
/// - `terms`: [B, K, L] the task's term bits (the latent to decode).
/// - `term_ids`: [B, K] the task's term indices (binary order).
#[derive(Debug, Clone, PartialEq)]
pub struct LogicBatch {
    /// [B, N, L + 1] inputs.
    pub x: Array3<f32>,
    /// `[B]` targets of the last token.
    pub y: Array1<f32>,
    /// [B, N] targets of all tokens.
    pub targets: Array2<f32>,
    /// [B, K, L] term bits.
    pub terms: Array3<u8>,
    /// [B, K] term indices.
    pub term_ids: Array2<u32>,
}

/// Value of a disjunction of conjunctive terms at `x` (Zadeh: min for AND, max for OR, 1 - x for NOT).
///
/// # Shapes
/// `terms`: [K, L] bits; `x`: `[L]` values in [0, 1]. Source: reference `apply_fuzzy_logic`.
///
/// # Errors
/// [`TasksError::InvalidInput`] if the L of `terms` and `x` differ or K = 0.
pub fn fuzzy_value(terms: ArrayView2<u8>, x: ArrayView1<f32>) -> Result<f32> {
    if terms.ncols() != x.len() || terms.nrows() == 0 {
        return Err(TasksError::input(
            "terms",
            format!(
                "shape {:?} does not fit x of length {} (need [K >= 1, L])",
                terms.shape(),
                x.len()
            ),
        ));
    }
    Ok(terms
        .outer_iter()
        .map(|t| {
            t.iter()
                .zip(x.iter())
                .map(|(&b, &v)| if b != 0 { v } else { 1.0 - v })
                .fold(f32::INFINITY, f32::min)
        })
        .fold(f32::NEG_INFINITY, f32::max))
}

/// Draws batch `index` of `set` for `purpose`: `batch` sequences, each of a task drawn uniformly from
/// the set with N inputs uniform in [0, 1)^L. Deterministic in (split, set, purpose, seed, index,
/// batch).
///
/// # Errors
/// [`TasksError::InvalidSplit`] if the set has no task (e.g. `Ood` with `frac_test = 0`).
pub fn sample_logic(
    split: &LogicSplit,
    set: LogicSet,
    purpose: Purpose,
    batch: usize,
    seed: u64,
    index: u64,
) -> Result<LogicBatch> {
    let p = &split.params;
    p.check()?;
    let tasks = split.tasks(set);
    if tasks.is_empty() {
        return Err(TasksError::InvalidSplit {
            split: format!("logic seed {}", split.seed),
            reason: format!("the {} set has no task", set.name()),
        });
    }
    let (l, k, n) = (p.variables, p.terms, p.samples);
    let domain = match purpose {
        Purpose::Train => Domain::LogicTrain,
        Purpose::Eval => Domain::LogicEval,
    };
    let mut rng = rng::stream(seed, domain, set as u64, index);
    let mut x = Array3::<f32>::zeros((batch, n, l + 1));
    let mut y = Array1::<f32>::zeros(batch);
    let mut targets = Array2::<f32>::zeros((batch, n));
    let mut terms = Array3::<u8>::zeros((batch, k, l));
    let mut term_ids = Array2::<u32>::zeros((batch, k));
    for b in 0..batch {
        let task = &tasks[rng.gen_range(0..tasks.len())];
        if task.len() != k || task.iter().any(|&t| t >= p.n_terms()) {
            return Err(TasksError::InvalidSplit {
                split: format!("logic seed {}", split.seed),
                reason: format!(
                    "task {task:?} is not {k} term indices below {}",
                    p.n_terms()
                ),
            });
        }
        for (j, &t) in task.iter().enumerate() {
            term_ids[[b, j]] = t as u32;
            for (v, bit) in p.term_bits(t).into_iter().enumerate() {
                terms[[b, j, v]] = bit;
            }
        }
        let tb = terms.index_axis(ndarray::Axis(0), b).to_owned();
        for s in 0..n {
            for v in 0..l {
                x[[b, s, v]] = rng.gen::<f32>();
            }
            let xs = x.index_axis(ndarray::Axis(0), b);
            let row = xs.index_axis(ndarray::Axis(0), s);
            let f = fuzzy_value(
                tb.view(),
                row.slice_axis(ndarray::Axis(0), ndarray::Slice::from(0..l)),
            )?;
            targets[[b, s]] = f;
            if s + 1 < n {
                x[[b, s, l]] = f;
            } else {
                y[b] = f;
            }
        }
    }
    Ok(LogicBatch {
        x,
        y,
        targets,
        terms,
        term_ids,
    })
}

/// The sequences per stream index of [`sample_logic_set`]: the evaluation batch that training's
/// evaluation and `hyperlens eval --batch 256` draw, so that a written set holds the same sequences.
pub const LOGIC_SET_CHUNK: usize = 256;

/// The evaluation stream `seed` of `set` as chunks: `n` sequences in chunks of `chunk` (the last
/// one cut to size; a `chunk` of 0 counts as 1), chunk `i` being
/// `sample_logic(split, set, Purpose::Eval, .., seed, i)`. With `chunk` = [`LOGIC_SET_CHUNK`] they
/// are the sequences of [`sample_logic_set`] (what `tasks sample --task logic` writes), drawn
/// lazily: memory is bounded by the chunk.
///
/// # Shapes
/// Each item as [`LogicBatch`] with B = `chunk` (the last one `n mod chunk` if that is not 0).
///
/// # Errors
/// Each item as [`sample_logic`].
pub fn logic_chunks<'a>(
    split: &'a LogicSplit,
    set: LogicSet,
    n: usize,
    chunk: usize,
    seed: u64,
) -> impl Iterator<Item = Result<LogicBatch>> + 'a {
    let chunk = chunk.max(1);
    (0..n.div_ceil(chunk)).map(move |i| {
        let b = chunk.min(n - i * chunk);
        sample_logic(split, set, Purpose::Eval, b, seed, i as u64)
    })
}

/// Draws `n` sequences of `set` from the evaluation stream `seed` as one batch: stream indices 0, 1,
/// ... of [`LOGIC_SET_CHUNK`] sequences each (the last one cut to size), concatenated.
///
/// # Shapes
/// As [`LogicBatch`] with B = `n`.
///
/// # Errors
/// As [`sample_logic`]; [`TasksError::InvalidInput`] for `n = 0`.
pub fn sample_logic_set(
    split: &LogicSplit,
    set: LogicSet,
    n: usize,
    seed: u64,
) -> Result<LogicBatch> {
    if n == 0 {
        return Err(TasksError::input(
            "n",
            "the problem set would be empty (n = 0)",
        ));
    }
    hyperlens_io::budget::check_alloc(
        format!("a fuzzy-logic problem set of n = {n} sequences"),
        split.params.set_bytes(n).saturating_mul(2),
    )?;
    let parts = logic_chunks(split, set, n, LOGIC_SET_CHUNK, seed).collect::<Result<Vec<_>>>()?;
    let cat = |e: ndarray::ShapeError| TasksError::input("batch", e.to_string());
    let ax = ndarray::Axis(0);
    Ok(LogicBatch {
        x: ndarray::concatenate(ax, &parts.iter().map(|p| p.x.view()).collect::<Vec<_>>())
            .map_err(cat)?,
        y: ndarray::concatenate(ax, &parts.iter().map(|p| p.y.view()).collect::<Vec<_>>())
            .map_err(cat)?,
        targets: ndarray::concatenate(
            ax,
            &parts.iter().map(|p| p.targets.view()).collect::<Vec<_>>(),
        )
        .map_err(cat)?,
        terms: ndarray::concatenate(
            ax,
            &parts.iter().map(|p| p.terms.view()).collect::<Vec<_>>(),
        )
        .map_err(cat)?,
        term_ids: ndarray::concatenate(
            ax,
            &parts.iter().map(|p| p.term_ids.view()).collect::<Vec<_>>(),
        )
        .map_err(cat)?,
    })
}

/// R² per sequence: 1 - (pred - y)² / var(targets), var over the sequence's N targets (population
/// variance, the reference's `base_mse`). A sequence whose targets are all equal gets NaN.
///
/// # Shapes
/// `pred`: `[B]` predictions for the last token; returns `[B]`.
///
/// # Errors
/// [`TasksError::InvalidInput`] if `pred` does not have B entries.
pub fn r2(pred: ArrayView1<f32>, batch: &LogicBatch) -> Result<Array1<f64>> {
    let b = batch.y.len();
    if pred.len() != b || batch.targets.nrows() != b {
        return Err(TasksError::input(
            "pred",
            format!("length {}, expected {b}", pred.len()),
        ));
    }
    Ok(Array1::from_iter((0..b).map(|i| {
        let t = batch.targets.row(i);
        let n = t.len() as f64;
        let mean = t.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = t.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        let err = (pred[i] as f64 - batch.y[i] as f64).powi(2);
        if var > 0.0 {
            1.0 - err / var
        } else {
            f64::NAN
        }
    })))
}

/// Mean R² over the sequences with a finite R² (NaN if none).
///
/// # Errors
/// As [`r2`].
pub fn mean_r2(pred: ArrayView1<f32>, batch: &LogicBatch) -> Result<f64> {
    let r = r2(pred, batch)?;
    let finite: Vec<f64> = r.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return Ok(f64::NAN);
    }
    Ok(finite.iter().sum::<f64>() / finite.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::arr2;

    #[test]
    fn default_split_sizes_match_reference_arithmetic() {
        let s = LogicSplit::new(LogicParams::default(), 0).unwrap();
        // 16 terms, 4 unknown, C(12, 2) = 66 known pairs, int(66 * 0.3) = 19 held out (OOD),
        // C(4, 2) = 6 of unknown terms.
        assert_eq!((s.id.len(), s.ood.len(), s.unknown.len()), (47, 19, 6));
        assert!(s.unknown.iter().flatten().all(|&t| t >= 12));
        assert!(s.id.iter().chain(&s.ood).flatten().all(|&t| t < 12));
        let p = LogicParams::default();
        assert_eq!(p.term_bits(1), vec![0, 0, 0, 1]);
        assert_eq!(p.term_bits(12), vec![1, 1, 0, 0]);
    }

    #[test]
    fn sets_have_one_name_and_a_fixed_stream_key() {
        let names: Vec<String> = LogicSet::ALL.iter().map(|s| s.to_string()).collect();
        assert_eq!(names, ["id", "ood", "unknown"]);
        let keys: Vec<u64> = LogicSet::ALL.iter().map(|&s| s as u64).collect();
        assert_eq!(keys, [0, 1, 2]);
        let split = LogicSplit::new(
            LogicParams {
                frac_test: 0.0,
                ..LogicParams::default()
            },
            0,
        )
        .unwrap();
        let e = sample_logic(&split, LogicSet::Ood, Purpose::Eval, 2, 0, 0).unwrap_err();
        assert!(e.to_string().contains("the ood set has no task"), "{e}");
    }

    #[test]
    fn fuzzy_value_matches_hand_computation() {
        // terms 01 and 11 over x = (0.2, 0.7): min(0.8, 0.7) = 0.7; min(0.2, 0.7) = 0.2; max = 0.7.
        let t = arr2(&[[0u8, 1], [1, 1]]);
        let v = fuzzy_value(t.view(), ndarray::arr1(&[0.2f32, 0.7]).view()).unwrap();
        assert!((v - 0.7).abs() < 1e-6);
        assert!(fuzzy_value(t.view(), ndarray::arr1(&[0.2f32]).view()).is_err());
    }

    #[test]
    fn a_fixed_query_recomputes_the_last_target_only() {
        let split = LogicSplit::new(LogicParams::default(), 1).unwrap();
        let mut b = sample_logic(&split, LogicSet::Ood, Purpose::Eval, 9, 3, 0).unwrap();
        let before = b.clone();
        let q = [0.9f32, 0.1, 0.8, 0.3];
        fix_query(&mut b, &q).unwrap();
        let n = b.x.dim().1;
        for i in 0..9 {
            assert_eq!(b.x.slice(ndarray::s![i, n - 1, ..4]).to_vec(), q.to_vec());
            assert_eq!(b.x[[i, n - 1, 4]], 0.0);
            let want = fuzzy_value(
                b.terms.index_axis(ndarray::Axis(0), i),
                ndarray::ArrayView1::from(&q[..]),
            )
            .unwrap();
            assert_eq!((b.y[i], b.targets[[i, n - 1]]), (want, want));
            assert_eq!(
                b.x.slice(ndarray::s![i, ..n - 1, ..]),
                before.x.slice(ndarray::s![i, ..n - 1, ..])
            );
        }
        assert!(fix_query(&mut b, &q[..3]).is_err());
        assert!(fix_query(&mut b, &[0.5, 0.5, 1.5, 0.0]).is_err());
    }

    #[test]
    fn a_fixed_context_recomputes_the_context_targets_only() {
        let params = LogicParams::default();
        let split = LogicSplit::new(params, 2).unwrap();
        let mut b = sample_logic(&split, LogicSet::Id, Purpose::Eval, 7, 4, 0).unwrap();
        let before = b.clone();
        let c = fixed_context(&params, 5);
        let n = b.x.dim().1;
        assert_eq!(c.dim(), (n - 1, 4));
        assert_eq!(c, fixed_context(&params, 5));
        assert_ne!(c, fixed_context(&params, 6));
        LogicInputs::FixedContext(c.clone()).apply(&mut b).unwrap();
        for i in 0..7 {
            for t in 0..n - 1 {
                assert_eq!(b.x.slice(ndarray::s![i, t, ..4]), c.row(t));
                // Zadeh by hand: max over terms of min over literals (x or 1 - x).
                let want = (0..b.terms.dim().1)
                    .map(|k| {
                        (0..4)
                            .map(|v| {
                                if b.terms[[i, k, v]] == 1 {
                                    c[[t, v]]
                                } else {
                                    1.0 - c[[t, v]]
                                }
                            })
                            .fold(f32::INFINITY, f32::min)
                    })
                    .fold(f32::NEG_INFINITY, f32::max);
                assert_eq!((b.x[[i, t, 4]], b.targets[[i, t]]), (want, want));
            }
            // The query and its target are untouched.
            assert_eq!(
                b.x.slice(ndarray::s![i, n - 1, ..]),
                before.x.slice(ndarray::s![i, n - 1, ..])
            );
            assert_eq!(
                (b.y[i], b.targets[[i, n - 1]]),
                (before.y[i], before.targets[[i, n - 1]])
            );
        }
        assert!(fix_context(&mut b, c.slice(ndarray::s![..3, ..])).is_err());
        let mut bad = c.clone();
        bad[[0, 0]] = 1.5;
        assert!(LogicInputs::FixedContext(bad).apply(&mut b).is_err());
        assert_eq!(LogicInputs::Uniform.name(), "uniform");
    }
}
