//! The problem sets that `hyperlens cache` and `hyperlens probe` run a model over, cut into
//! batches in one place: a SRAVEN problem file or sampled stream ([`SravenProblems`]), a
//! fuzzy-logic problem file or sampled set ([`LogicSequences`]), and the two use cases over them,
//! [`cache_problems`] and [`extract_problems`].

use std::ops::ControlFlow;
use std::path::Path;
use std::rc::Rc;

use hyperlens_model::Evaluator;
use hyperlens_tasks::logic::{logic_chunks, LogicBatch, LogicSet, LogicSplit, LOGIC_SET_CHUNK};
use hyperlens_tasks::sraven::{ProblemSet, SampleStream, Set, Split};
use ndarray::{s, Array3};

use crate::ablation::Problems;
use crate::cache::{cache_activations, CacheParams, CacheSummary};
use crate::error::Result;
use crate::extract::{extract, ProbeMeta, ProbeParams, ProbeSummary};

/// SRAVEN problems to run a model over.
pub enum SravenProblems {
    /// A problem set held whole (read from a problem file).
    Set(ProblemSet),
    /// The first `n` problems of a sampled stream, drawn batch by batch.
    Sampled {
        /// The stream.
        stream: SampleStream,
        /// How many problems.
        n: usize,
    },
}

impl SravenProblems {
    /// The number of problems.
    pub fn len(&self) -> usize {
        match self {
            SravenProblems::Set(set) => set.len(),
            SravenProblems::Sampled { n, .. } => *n,
        }
    }

    /// Whether there is no problem.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The problems in batches of `batch` (the last one shorter), in order.
    ///
    /// # Shapes
    /// Each batch: `x [B, T, M]` with `B <= batch`.
    pub fn batches(self, batch: usize) -> Box<dyn Iterator<Item = Result<ProblemSet>>> {
        let batch = batch.max(1);
        match self {
            SravenProblems::Set(set) => {
                let n = set.len();
                Box::new(
                    (0..n)
                        .step_by(batch)
                        .map(move |s| Ok(set.slice(s, (s + batch).min(n)))),
                )
            }
            SravenProblems::Sampled { stream, n } => {
                Box::new(stream.batches(n, batch).map(|b| b.map_err(Into::into)))
            }
        }
    }
}

/// Fuzzy-logic sequences to run a model over.
pub enum LogicSequences<'a> {
    /// A set held whole (read from a problem file).
    Set(Box<LogicBatch>),
    /// `n` sequences of `set` sampled from `split` with `seed`, generated in chunks of
    /// [`LOGIC_SET_CHUNK`] (the sequences `hyperlens tasks sample --task logic` writes).
    Sampled {
        /// The split.
        split: &'a LogicSplit,
        /// The set.
        set: LogicSet,
        /// How many sequences.
        n: usize,
        /// The sample's seed.
        seed: u64,
    },
}

impl LogicSequences<'_> {
    /// The number of sequences.
    pub fn len(&self) -> usize {
        match self {
            LogicSequences::Set(set) => set.y.len(),
            LogicSequences::Sampled { n, .. } => *n,
        }
    }

    /// Whether there is no sequence.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sequences' inputs in batches of at most `batch` (a sampled set's chunks each cut into
    /// batches), in order.
    ///
    /// # Shapes
    /// Each batch: `x [B, T, L + 1]` with `B <= batch`.
    pub fn input_batches<'s>(
        self,
        batch: usize,
    ) -> Box<dyn Iterator<Item = Result<Array3<f32>>> + 's>
    where
        Self: 's,
    {
        let batch = batch.max(1);
        match self {
            LogicSequences::Set(set) => Box::new(rows_of(set.x, batch).map(Ok)),
            LogicSequences::Sampled {
                split,
                set,
                n,
                seed,
            } => Box::new(
                logic_chunks(split, set, n, LOGIC_SET_CHUNK, seed).flat_map(move |c| {
                    let parts: Vec<Result<Array3<f32>>> = match c {
                        Err(e) => vec![Err(e.into())],
                        Ok(chunk) => rows_of(chunk.x, batch).map(Ok).collect(),
                    };
                    parts
                }),
            ),
        }
    }
}

/// The rows of `x` in blocks of `batch`.
///
/// # Shapes
/// `x [N, T, M]` -> blocks `[B, T, M]`.
fn rows_of(x: Array3<f32>, batch: usize) -> impl Iterator<Item = Array3<f32>> {
    let n = x.shape()[0];
    (0..n)
        .step_by(batch)
        .map(move |s| x.slice(s![s..(s + batch).min(n), .., ..]).to_owned())
}

/// SRAVEN problems passed over several times (`hyperlens patch heads`: once per head).
pub enum RepeatedProblems {
    /// A set held whole (read from a problem file).
    Set(Box<ProblemSet>),
    /// `n` problems sampled from `split`'s `set` with `seed`, drawn afresh at every pass.
    Sampled {
        /// The split.
        split: Split,
        /// ID or OOD.
        set: Set,
        /// How many problems.
        n: usize,
        /// The sample's seed.
        seed: u64,
        /// Identity permutations.
        unpermuted: bool,
    },
}

impl RepeatedProblems {
    /// The passes over the problems: each call starts them again, in batches of `batch`, in
    /// order. A sample's stream is made at each pass, so that its errors come out of the pass.
    ///
    /// # Shapes
    /// Each batch: `x [B, T, M]` with `B <= batch`.
    pub fn passes(self, batch: usize) -> Box<Problems<'static>> {
        let batch = batch.max(1);
        match self {
            RepeatedProblems::Set(set) => {
                let set: Rc<ProblemSet> = Rc::from(set);
                let n = set.len();
                Box::new(move || {
                    let set = Rc::clone(&set);
                    Box::new(
                        (0..n)
                            .step_by(batch)
                            .map(move |s| Ok(set.slice(s, (s + batch).min(n)))),
                    )
                })
            }
            RepeatedProblems::Sampled {
                split,
                set,
                n,
                seed,
                unpermuted,
            } => Box::new(
                move || match SampleStream::new(&split, set, seed, unpermuted) {
                    Ok(s) => Box::new(s.batches(n, batch).map(|b| b.map_err(Into::into))),
                    Err(e) => Box::new(std::iter::once(Err(e.into()))),
                },
            ),
        }
    }
}

/// The problems of a checkpoint's task that `hyperlens cache` runs over.
pub enum TaskProblems<'a> {
    /// SRAVEN problems.
    Sraven(Box<SravenProblems>),
    /// Fuzzy-logic sequences.
    Logic(LogicSequences<'a>),
}

impl TaskProblems<'_> {
    /// The number of problems (sequences).
    pub fn len(&self) -> usize {
        match self {
            TaskProblems::Sraven(p) => p.len(),
            TaskProblems::Logic(p) => p.len(),
        }
    }

    /// Whether there is no problem.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `hyperlens cache` over a problem set: the activations of the hooks of `params` over
/// `problems`, run in batches of `batch` ([`cache_activations`]); `progress(done)` after each.
///
/// # Errors
/// As [`cache_activations`]; the problems' generation errors.
pub fn cache_problems(
    ev: &Evaluator,
    problems: TaskProblems<'_>,
    batch: usize,
    params: &CacheParams,
    out: &Path,
    progress: impl FnMut(usize),
) -> Result<CacheSummary> {
    let n = problems.len();
    match problems {
        TaskProblems::Sraven(p) => {
            let batches = (*p).batches(batch).map(|b| Ok(b?.x));
            cache_activations(ev, batches, n, params, out, progress)
        }
        TaskProblems::Logic(p) => {
            cache_activations(ev, p.input_batches(batch), n, params, out, progress)
        }
    }
}

/// `hyperlens probe` over SRAVEN problems: the latent codes at `params`' site over `problems`,
/// run in batches of `batch` ([`extract`]), with `meta` in the sidecar.
///
/// # Errors
/// As [`extract`]; the problems' generation errors.
pub fn extract_problems(
    ev: &Evaluator,
    problems: SravenProblems,
    batch: usize,
    params: &ProbeParams,
    out: &Path,
    meta: ProbeMeta,
    progress: impl FnMut(usize) -> ControlFlow<()>,
) -> Result<ProbeSummary> {
    let n = problems.len();
    extract(ev, problems.batches(batch), n, params, out, meta, progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyperlens_tasks::logic::LogicParams;

    #[test]
    fn sraven_batches_cover_the_problems_in_order() {
        let split = Split::named("paper-seed0").unwrap();
        let all = SampleStream::new(&split, Set::Ood, 3, false)
            .unwrap()
            .batches(10, 10)
            .next()
            .unwrap()
            .unwrap();
        for p in [
            SravenProblems::Set(all.clone()),
            SravenProblems::Sampled {
                stream: SampleStream::new(&split, Set::Ood, 3, false).unwrap(),
                n: 10,
            },
        ] {
            assert_eq!(p.len(), 10);
            let parts: Vec<ProblemSet> = p.batches(4).map(|b| b.unwrap()).collect();
            let sizes: Vec<usize> = parts.iter().map(|b| b.len()).collect();
            assert_eq!(sizes, vec![4, 4, 2]);
            let views: Vec<_> = parts.iter().map(|b| b.x.view()).collect();
            let joined = ndarray::concatenate(ndarray::Axis(0), &views).unwrap();
            assert_eq!(joined, all.x);
        }
    }

    #[test]
    fn every_pass_gives_the_same_batches() {
        let split = Split::named("paper-seed0").unwrap();
        let held = SampleStream::new(&split, Set::Id, 5, true)
            .unwrap()
            .batches(9, 9)
            .next()
            .unwrap()
            .unwrap();
        for problems in [
            RepeatedProblems::Set(Box::new(held.clone())),
            RepeatedProblems::Sampled {
                split: split.clone(),
                set: Set::Id,
                n: 9,
                seed: 5,
                unpermuted: true,
            },
        ] {
            let mut passes = problems.passes(4);
            for _ in 0..2 {
                let parts: Vec<ProblemSet> = passes().map(|b| b.unwrap()).collect();
                assert_eq!(
                    parts.iter().map(ProblemSet::len).collect::<Vec<_>>(),
                    [4, 4, 1]
                );
                let views: Vec<_> = parts.iter().map(|b| b.x.view()).collect();
                let joined = ndarray::concatenate(ndarray::Axis(0), &views).unwrap();
                assert_eq!(joined, held.x);
            }
        }
    }

    #[test]
    fn logic_batches_cut_every_chunk_and_keep_the_order() {
        let split = LogicSplit::new(LogicParams::default(), 0).unwrap();
        let n = LOGIC_SET_CHUNK + 5;
        let whole: Vec<LogicBatch> = logic_chunks(&split, LogicSet::Ood, n, LOGIC_SET_CHUNK, 1)
            .map(|c| c.unwrap())
            .collect();
        let views: Vec<_> = whole.iter().map(|c| c.x.view()).collect();
        let all = ndarray::concatenate(ndarray::Axis(0), &views).unwrap();
        let sampled = LogicSequences::Sampled {
            split: &split,
            set: LogicSet::Ood,
            n,
            seed: 1,
        };
        assert_eq!(sampled.len(), n);
        let parts: Vec<Array3<f32>> = sampled.input_batches(100).map(|b| b.unwrap()).collect();
        // 256 = 100 + 100 + 56, then the chunk of 5.
        let sizes: Vec<usize> = parts.iter().map(|b| b.shape()[0]).collect();
        assert_eq!(sizes, vec![100, 100, 56, 5]);
        let views: Vec<_> = parts.iter().map(|b| b.view()).collect();
        assert_eq!(ndarray::concatenate(ndarray::Axis(0), &views).unwrap(), all);
        let held = LogicSequences::Set(Box::new(whole[1].clone()));
        let sizes: Vec<usize> = held
            .input_batches(2)
            .map(|b| b.unwrap().shape()[0])
            .collect();
        assert_eq!(sizes, vec![2, 2, 1]);
    }
}
