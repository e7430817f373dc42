//! SRAVEN problem sets: generation, evaluation sets and the training stream (docs/spec/sraven.md,
//! "Feature permutation" and "Tokens, targets, metrics").

use ndarray::{Array2, Array3, ArrayView2, ArrayView3, Axis, Slice};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{Rule, Set, Split, SravenParams, Task};
use crate::error::{Result, TasksError};
use crate::rng::{self, Domain};

/// A batch of SRAVEN problems with their labels.
///
/// # Shapes
/// - `x`: [N, T, M] one-hot, `f32`. Token t < (grid² - 1) * F is panel `t / F`, slot `t % F`
///   (panel index = 3 * row + col); the last F tokens (queries) are all zero. T = 36, M = 8 by default.
/// - `y`: [N, F] answer values (panel 8) in 0..M, in column 2's permuted slot order: `y[n, k]` is the
///   value shown at slot k of the answer panel.
/// - `rules`: [N, F] rule index (0..8) per unpermuted feature slot: the task, sorted.
/// - `perms`: [N, 3, F] per-column permutations: slot k of a panel in column c shows feature
///   `perms[n, c, k]`. Identity for unpermuted problems. `None` when unknown (e.g. a loaded file that
///   did not store them).
#[derive(Debug, Clone, PartialEq)]
pub struct ProblemSet {
    /// [N, T, M] one-hot inputs; the F query tokens are all zero.
    pub x: Array3<f32>,
    /// [N, F] answer values, in column 2's (permuted) order.
    pub y: Array2<i64>,
    /// [N, F] the task's rule per unpermuted slot.
    pub rules: Array2<i64>,
    /// [N, 3, F] per-column permutations.
    pub perms: Option<Array3<i64>>,
    /// The sizes the problems were made with.
    pub params: SravenParams,
}

impl ProblemSet {
    /// Number of problems N.
    pub fn len(&self) -> usize {
        self.x.shape()[0]
    }

    /// Whether the set holds no problem.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Problems `start..end` as a new set ([`ProblemSetView::slice`], copied).
    pub fn slice(&self, start: usize, end: usize) -> ProblemSet {
        self.view().slice(start, end).to_owned()
    }

    /// The set as borrowed views ([`ProblemSetView`]).
    pub fn view(&self) -> ProblemSetView<'_> {
        ProblemSetView {
            x: self.x.view(),
            y: self.y.view(),
            rules: self.rules.view(),
            perms: self.perms.as_ref().map(|p| p.view()),
            params: self.params,
        }
    }

    /// Checks shapes and contents ([`ProblemSetView::validate`]).
    ///
    /// # Errors
    /// [`TasksError::InvalidInput`] naming the array and the first bad problem.
    pub fn validate(&self) -> Result<()> {
        self.view().validate()
    }

    /// Decodes the context tokens back to values.
    ///
    /// # Shapes
    /// Returns [N, grid² - 1, F] (`u8`): `out[n, panel, slot]`, in the permuted slot order as shown.
    ///
    /// # Errors
    /// [`TasksError::InvalidInput`] (array `x`) if `x` has the wrong shape or a context token is not
    /// one-hot.
    pub fn context_values(&self) -> Result<Array3<u8>> {
        let p = &self.params;
        let (f, m) = (p.features, p.values);
        let n = self.len();
        if self.x.shape()[1] != p.n_tokens() || self.x.shape()[2] != m {
            return Err(TasksError::input(
                "x",
                format!(
                    "shape {:?}, expected [N, {}, {m}]",
                    self.x.shape(),
                    p.n_tokens()
                ),
            ));
        }
        let mut out = Array3::<u8>::zeros((n, p.n_context_panels(), f));
        for i in 0..n {
            for tok in 0..p.n_context_tokens() {
                let row = self.x.index_axis(Axis(0), i);
                let row = row.index_axis(Axis(0), tok);
                let mut hot = None;
                for (v, &e) in row.iter().enumerate() {
                    if e == 1.0 && hot.is_none() {
                        hot = Some(v);
                    } else if e != 0.0 {
                        hot = None;
                        break;
                    }
                }
                let v = hot.ok_or_else(|| {
                    TasksError::input(
                        "x",
                        format!("problem {i}, context token {tok} is not one-hot"),
                    )
                })?;
                out[[i, tok / f, tok % f]] = v as u8;
            }
        }
        Ok(out)
    }
}

/// Generates `n` problems from `tasks` with `rng` into a new [`ProblemSet`].
///
/// Per problem, in this order of draws: the task (uniform over `tasks`), each feature's grid from its
/// rule ([`Rule::sample_grid`]), then 3 uniform permutations of the F slots (Fisher-Yates), one per
/// column. For `unpermuted` the permutations are still drawn (so the problems equal those of the
/// permuted set with the same RNG) and then replaced by the identity.
///
/// `tasks` must be non-empty and valid for `params` (checked by the callers).
pub(crate) fn generate(
    tasks: &[Task],
    params: &SravenParams,
    rng: &mut ChaCha8Rng,
    n: usize,
    unpermuted: bool,
) -> ProblemSet {
    let (f, m, t) = (params.features, params.values, params.n_tokens());
    let mut x = Array3::<f32>::zeros((n, t, m));
    let mut y = Array2::<i64>::zeros((n, f));
    let mut rules = Array2::<i64>::zeros((n, f));
    let mut perms = Array3::<i64>::zeros((n, 3, f));
    let mut grids = vec![[0u8; 9]; f];
    let mut perm = vec![vec![0usize; f]; 3];
    let rules_all = Rule::ALL;
    {
        // All four arrays are freshly allocated in standard layout, so the slices exist.
        let xs = x.as_slice_mut().unwrap_or(&mut []);
        let ys = y.as_slice_mut().unwrap_or(&mut []);
        let rs = rules.as_slice_mut().unwrap_or(&mut []);
        let ps = perms.as_slice_mut().unwrap_or(&mut []);
        for i in 0..n {
            let task = &tasks[rng.gen_range(0..tasks.len())];
            for (j, &r) in task.iter().enumerate() {
                rules_all[r as usize].sample_grid(m, rng, &mut grids[j]);
                rs[i * f + j] = r as i64;
            }
            for (c, pc) in perm.iter_mut().enumerate() {
                for (k, v) in pc.iter_mut().enumerate() {
                    *v = k;
                }
                for k in (1..f).rev() {
                    let j = rng.gen_range(0..=k);
                    pc.swap(k, j);
                }
                if unpermuted {
                    for (k, v) in pc.iter_mut().enumerate() {
                        *v = k;
                    }
                }
                for (k, &v) in pc.iter().enumerate() {
                    ps[(i * 3 + c) * f + k] = v as i64;
                }
            }
            let xi = &mut xs[i * t * m..(i + 1) * t * m];
            for panel in 0..8 {
                let (row, col) = (panel / 3, panel % 3);
                for k in 0..f {
                    let v = grids[perm[col][k]][3 * row + col] as usize;
                    xi[(panel * f + k) * m + v] = 1.0;
                }
            }
            for k in 0..f {
                ys[i * f + k] = grids[perm[2][k]][8] as i64;
            }
        }
    }
    ProblemSet {
        x,
        y,
        rules,
        perms: Some(perms),
        params: *params,
    }
}

/// A [`ProblemSet`] borrowed: the same arrays as views (of a set, of a slice of one, or of arrays
/// held elsewhere, e.g. numpy's), for the readers that only read a set
/// (`hyperlens_model::eval::evaluate_stream`, `hyperlens_probe::extract::code_rows`).
///
/// # Shapes
/// As [`ProblemSet`].
#[derive(Debug, Clone, Copy)]
pub struct ProblemSetView<'a> {
    /// [N, T, M] one-hot inputs.
    pub x: ArrayView3<'a, f32>,
    /// [N, F] answer values.
    pub y: ArrayView2<'a, i64>,
    /// [N, F] the task's rule per unpermuted slot.
    pub rules: ArrayView2<'a, i64>,
    /// [N, 3, F] per-column permutations.
    pub perms: Option<ArrayView3<'a, i64>>,
    /// The sizes the problems were made with.
    pub params: SravenParams,
}

/// A problem set held ([`ProblemSet`]) or borrowed ([`ProblemSetView`]): what a reader of a set
/// takes, so that either is read without a copy.
pub trait AsProblemSet {
    /// The set as borrowed views.
    fn problems(&self) -> ProblemSetView<'_>;
}

impl AsProblemSet for ProblemSet {
    fn problems(&self) -> ProblemSetView<'_> {
        self.view()
    }
}

impl AsProblemSet for ProblemSetView<'_> {
    fn problems(&self) -> ProblemSetView<'_> {
        // Reborrowed views (a view's lifetime is invariant, so a clone would not shorten it).
        ProblemSetView {
            x: self.x.view(),
            y: self.y.view(),
            rules: self.rules.view(),
            perms: self.perms.as_ref().map(|p| p.view()),
            params: self.params,
        }
    }
}

impl<'a> ProblemSetView<'a> {
    /// Problems `start..end` as views of the same arrays. Bounds are clamped to `0..=len` (an
    /// empty range gives an empty set), so this never panics.
    pub fn slice(&self, start: usize, end: usize) -> ProblemSetView<'a> {
        let end = end.min(self.len());
        let start = start.min(end);
        let rows = Slice::from(start..end);
        ProblemSetView {
            x: self.x.slice_axis_move(Axis(0), rows),
            y: self.y.slice_axis_move(Axis(0), rows),
            rules: self.rules.slice_axis_move(Axis(0), rows),
            perms: self.perms.map(|p| p.slice_axis_move(Axis(0), rows)),
            params: self.params,
        }
    }

    /// The problems as a set of their own (a copy).
    pub fn to_owned(&self) -> ProblemSet {
        ProblemSet {
            x: self.x.to_owned(),
            y: self.y.to_owned(),
            rules: self.rules.to_owned(),
            perms: self.perms.as_ref().map(|p| p.to_owned()),
            params: self.params,
        }
    }

    /// Number of problems N.
    pub fn len(&self) -> usize {
        self.x.shape()[0]
    }

    /// Whether the set holds no problem.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks shapes and contents: `x` [N, T, M] with one-hot context tokens (exactly one 1, the rest
    /// 0) and all-zero query tokens; `y` [N, F] in 0..M; `rules` [N, F] in 0..8; `perms` [N, 3, F]
    /// with each row a permutation of 0..F.
    ///
    /// # Errors
    /// [`TasksError::InvalidInput`] naming the array and the first bad problem.
    pub fn validate(&self) -> Result<()> {
        let p = &self.params;
        p.check()?;
        let (f, m, t) = (p.features, p.values, p.n_tokens());
        let n = self.len();
        let shape_err = |name: &str, want: String, got: &[usize]| {
            TasksError::input(name, format!("shape {got:?}, expected {want}"))
        };
        if self.x.shape() != [n, t, m] {
            return Err(shape_err("x", format!("[N, {t}, {m}]"), self.x.shape()));
        }
        if self.y.shape() != [n, f] {
            return Err(shape_err("y", format!("[{n}, {f}]"), self.y.shape()));
        }
        if self.rules.shape() != [n, f] {
            return Err(shape_err(
                "rules",
                format!("[{n}, {f}]"),
                self.rules.shape(),
            ));
        }
        if let Some(pm) = &self.perms {
            if pm.shape() != [n, 3, f] {
                return Err(shape_err("perms", format!("[{n}, 3, {f}]"), pm.shape()));
            }
        }
        let ctx = p.n_context_tokens();
        for (i, prob) in self.x.outer_iter().enumerate() {
            for (tok, row) in prob.outer_iter().enumerate() {
                let (mut ones, mut others) = (0usize, 0usize);
                for &v in row.iter() {
                    if v == 1.0 {
                        ones += 1;
                    } else if v != 0.0 {
                        others += 1;
                    }
                }
                if tok < ctx && (ones != 1 || others != 0) {
                    return Err(TasksError::input(
                        "x",
                        format!("problem {i}, context token {tok} is not a one-hot vector of length {m}"),
                    ));
                }
                if tok >= ctx && (ones != 0 || others != 0) {
                    return Err(TasksError::input(
                        "x",
                        format!("problem {i}, query token {tok} is not all zero"),
                    ));
                }
            }
        }
        let range_check = |name: &str, a: &ArrayView2<'_, i64>, hi: usize| -> Result<()> {
            if let Some(((i, k), v)) = a.indexed_iter().find(|(_, &v)| v < 0 || v as usize >= hi) {
                return Err(TasksError::input(
                    name,
                    format!("problem {i}, slot {k}: value {v} is not in 0..{hi}"),
                ));
            }
            Ok(())
        };
        range_check("y", &self.y, m)?;
        range_check("rules", &self.rules, Rule::COUNT)?;
        if let Some(pm) = &self.perms {
            for ((i, c), row) in pm.outer_iter().enumerate().flat_map(|(i, pr)| {
                pr.outer_iter()
                    .enumerate()
                    .map(move |(c, r)| ((i, c), r.to_owned()))
                    .collect::<Vec<_>>()
            }) {
                let mut seen = vec![false; f];
                for &v in row.iter() {
                    if v < 0 || v as usize >= f || seen[v as usize] {
                        return Err(TasksError::input(
                            "perms",
                            format!(
                                "problem {i}, column {c}: {row} is not a permutation of 0..{f}"
                            ),
                        ));
                    }
                    seen[v as usize] = true;
                }
            }
        }
        Ok(())
    }
}

/// An evaluation or probe set of `n` problems of `set`'s tasks.
///
/// Deterministic in `(set, n, seed)` and the split's task list; a set of n problems is the first n
/// problems of any larger set with the same arguments. The RNG stream is domain-separated from the
/// training stream ([`TrainStream`]), so evaluation never reuses the training problems of the same seed
/// (unlike the reference code, whose ID "test" stream repeats its first training batches;
/// docs/spec/sraven.md, "Known quirk"). `unpermuted = true` gives the same problems as `false` but with
/// identity column permutations (the latent-code analysis uses them).
///
/// # Shapes
/// Returns `x` [n, T, M], `y` and `rules` [n, F], `perms` [n, 3, F] (see [`ProblemSet`]).
///
/// # Errors
/// [`TasksError::InvalidSplit`] if the split is invalid or `set` has no task (e.g. OOD with a 0 %
/// hold-out); [`TasksError::Budget`] if the set would not fit the memory budget (checked before
/// anything is allocated).
pub fn sample(
    split: &Split,
    set: Set,
    n: usize,
    seed: u64,
    unpermuted: bool,
) -> Result<ProblemSet> {
    hyperlens_io::budget::check_alloc(
        format!("a problem set of n = {n} problems"),
        split.params.set_bytes(n),
    )?;
    let mut stream = SampleStream::new(split, set, seed, unpermuted)?;
    Ok(stream.next_chunk(n))
}

/// The problems of [`sample`] drawn in chunks, so that a consumer (the latent-code probe) holds one
/// batch at a time: the concatenation of the chunks equals `sample(split, set, n, seed, unpermuted)`
/// for the same total `n`, whatever the chunk sizes.
#[derive(Debug, Clone)]
pub struct SampleStream {
    tasks: Vec<Task>,
    params: SravenParams,
    rng: ChaCha8Rng,
    unpermuted: bool,
}

impl SampleStream {
    /// A stream of `set`'s problems with sample seed `seed`.
    ///
    /// # Errors
    /// As [`sample`].
    pub fn new(split: &Split, set: Set, seed: u64, unpermuted: bool) -> Result<SampleStream> {
        split.check()?;
        let tasks = split.tasks(set);
        if tasks.is_empty() {
            return Err(TasksError::InvalidSplit {
                split: split.name.to_string(),
                reason: format!("the {set} set has no task"),
            });
        }
        let sub = match set {
            Set::Id => 0,
            Set::Ood => 1,
        };
        Ok(SampleStream {
            tasks: tasks.to_vec(),
            params: split.params,
            rng: rng::stream(seed, Domain::SravenEval, sub, 0),
            unpermuted,
        })
    }

    /// The next `n` problems.
    ///
    /// # Shapes
    /// `x [n, T, M]`, `y [n, F]`, `rules [n, F]`, `perms [n, 3, F]`.
    pub fn next_chunk(&mut self, n: usize) -> ProblemSet {
        generate(&self.tasks, &self.params, &mut self.rng, n, self.unpermuted)
    }

    /// An iterator over `n` problems in chunks of `batch` (the last one shorter), in the `Result`
    /// form that streaming consumers take. A `batch` of 0, or a chunk too large for the memory
    /// budget ([`TasksError::Budget`], checked before it is allocated), yields one error item.
    pub fn batches(mut self, n: usize, batch: usize) -> impl Iterator<Item = Result<ProblemSet>> {
        let mut done = 0usize;
        let mut failed = false;
        std::iter::from_fn(move || {
            if failed || done >= n {
                return None;
            }
            if batch == 0 {
                failed = true;
                return Some(Err(TasksError::InvalidParam {
                    name: "batch",
                    reason: "must be positive".into(),
                }));
            }
            let b = batch.min(n - done);
            if let Err(e) = hyperlens_io::budget::check_alloc(
                format!("a batch of {b} problems"),
                self.params.set_bytes(b),
            ) {
                failed = true;
                return Some(Err(e.into()));
            }
            done += b;
            Some(Ok(self.next_chunk(b)))
        })
    }
}

/// The training stream: in-distribution, permuted problems. Batch `i` depends only on
/// `(seed, i, batch size)` and the split's ID tasks (its own ChaCha stream `i`), so a resumed run
/// continues exactly by constructing the stream at the saved position with [`TrainStream::at`].
#[derive(Debug, Clone)]
pub struct TrainStream {
    tasks: Vec<Task>,
    params: SravenParams,
    seed: u64,
    position: u64,
    valid: bool,
}

impl TrainStream {
    /// A stream at position 0.
    ///
    /// A split that fails [`Split::check`] (only possible for a hand-built `Split`) yields empty
    /// batches; call [`TrainStream::check`] to get the reason.
    pub fn new(split: &Split, seed: u64) -> TrainStream {
        TrainStream::at(split, seed, 0)
    }

    /// A stream positioned after `position` batches: its next batch is the one that
    /// `TrainStream::new` would give after `position` calls of `next_batch`.
    pub fn at(split: &Split, seed: u64, position: u64) -> TrainStream {
        TrainStream {
            tasks: split.id_tasks.clone(),
            params: split.params,
            seed,
            position,
            valid: split.check().is_ok(),
        }
    }

    /// Whether the stream can produce problems.
    ///
    /// # Errors
    /// [`TasksError::InvalidSplit`] if its split has no valid ID task list or invalid params.
    pub fn check(&self) -> Result<()> {
        if self.valid {
            Ok(())
        } else {
            Err(TasksError::InvalidSplit {
                split: "train stream".to_string(),
                reason:
                    "the split failed its check (invalid params or no valid in-distribution task)"
                        .to_string(),
            })
        }
    }

    /// The next batch of `batch` problems (permuted, ID tasks); advances the position by one.
    ///
    /// # Shapes
    /// Returns `x` [batch, T, M], `y` and `rules` [batch, F], `perms` [batch, 3, F] (see
    /// [`ProblemSet`]); 0 problems if the split failed its check.
    pub fn next_batch(&mut self, batch: usize) -> ProblemSet {
        let n = if self.valid { batch } else { 0 };
        let mut rng = rng::stream(self.seed, Domain::SravenTrain, 0, self.position);
        self.position += 1;
        if n == 0 || self.tasks.is_empty() {
            let p = &self.params;
            return ProblemSet {
                x: Array3::zeros((0, p.n_tokens(), p.values)),
                y: Array2::zeros((0, p.features)),
                rules: Array2::zeros((0, p.features)),
                perms: Some(Array3::zeros((0, 3, p.features))),
                params: *p,
            };
        }
        generate(&self.tasks, &self.params, &mut rng, n, false)
    }

    /// Batches drawn so far (including the starting position given to [`TrainStream::at`]).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The stream's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;

    #[test]
    fn chunks_concatenate_to_the_whole_sample() -> Result<()> {
        let split = Split::named("paper-seed0")?;
        let whole = sample(&split, Set::Ood, 23, 9, false)?;
        let chunks: Vec<ProblemSet> = SampleStream::new(&split, Set::Ood, 9, false)?
            .batches(23, 7)
            .collect::<Result<_>>()?;
        assert_eq!(
            chunks.iter().map(ProblemSet::len).collect::<Vec<_>>(),
            vec![7, 7, 7, 2]
        );
        let mut start = 0;
        for c in &chunks {
            let part = whole.slice(start, start + c.len());
            assert_eq!(c.x, part.x);
            assert_eq!(c.y, part.y);
            assert_eq!(c.rules, part.rules);
            assert_eq!(c.perms, part.perms);
            start += c.len();
        }
        let bad: Vec<_> = SampleStream::new(&split, Set::Id, 1, true)?
            .batches(5, 0)
            .collect();
        assert_eq!(bad.len(), 1);
        assert!(bad[0].is_err());
        Ok(())
    }
}
