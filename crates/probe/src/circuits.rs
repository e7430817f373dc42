//! The circuits analysis of one token language model, as `hyperlens circuits` and Python's
//! `hyperlens.circuits.analyze` run it (Elhage et al. 2021; `docs/spec/circuits.md`): the model
//! runs on random token sequences repeated once, one at a time, and every head is scored on their
//! attention patterns (`hyperlens_analysis::circuits::HeadScorer`); then the weights-based
//! analyses run on the head weights (`hyperlens_analysis::circuits::analyze_circuits`). [`run`] is
//! the one definition of the inputs' rules (the repeated segment's length, the prefix) and of the
//! order of the work; [`CircuitSummary`] is `summary.json`.

use std::borrow::Borrow;
use std::ops::ControlFlow;
use std::path::PathBuf;

use hyperlens_analysis::circuits::{
    analyze_circuits, AttnWeights, CircuitFindings, CircuitParams, CircuitReport, CircuitStage,
    HeadScorer,
};
use hyperlens_model::lm::LanguageModel;
use hyperlens_tasks::induction::repeated_random_tokens;
use serde::{Deserialize, Serialize};

use crate::error::{ProbeError, Result};

/// Default length of the repeated random segment (TransformerLens / ARENA induction demo).
pub const DEFAULT_SEQ_LEN: usize = 50;

/// The options of [`run`].
#[derive(Debug, Clone, PartialEq)]
pub struct CircuitRunParams {
    /// Length `n` of the random segment that is repeated once (at least 2; `None`: 50, or half
    /// the model's context if that is shorter).
    pub seq_len: Option<usize>,
    /// Repeated random sequences the head scores are averaged over (at least 1).
    pub n_seqs: usize,
    /// A token id put before every sequence (e.g. the model's BOS token).
    pub bos: Option<u32>,
    /// Whether the norm gains that precede attention (and the final norm) are folded into the
    /// weights.
    pub fold_norm: bool,
    /// The analysis options; `analysis.seed` also draws the token sequences.
    pub analysis: CircuitParams,
}

impl Default for CircuitRunParams {
    fn default() -> Self {
        Self {
            seq_len: None,
            n_seqs: 8,
            bos: None,
            fold_norm: true,
            analysis: CircuitParams::default(),
        }
    }
}

impl CircuitRunParams {
    /// Checks the options that do not depend on the model.
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] naming the option (as its command-line flag and Python
    /// argument).
    pub fn check(&self) -> Result<()> {
        if self.n_seqs == 0 {
            return Err(ProbeError::InvalidInput(
                "--n-seqs (n_seqs) must be at least 1".into(),
            ));
        }
        if let Some(n) = self.seq_len {
            if n < 2 {
                return Err(ProbeError::InvalidInput(format!(
                    "--seq-len must be at least 2 (seq_len {n})"
                )));
            }
        }
        self.analysis
            .check()
            .map_err(|e| ProbeError::InvalidInput(e.to_string()))
    }

    /// The inputs of a run on a model of `n_layers` layers, `vocab` tokens and `max_len`
    /// positions: the prefix and the repeated segment's length (`seq_len`, or the default
    /// clipped to the context).
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] for bad options ([`CircuitRunParams::check`]), a model without
    /// attention layers, a `bos` outside the vocabulary, or a segment the context cannot hold.
    pub fn plan(&self, n_layers: usize, vocab: usize, max_len: usize) -> Result<CircuitPlan> {
        self.check()?;
        let bad = |m: String| Err(ProbeError::InvalidInput(m));
        if n_layers == 0 {
            return bad("a model without attention layers has no heads to analyse".into());
        }
        if let Some(b) = self.bos {
            if b as usize >= vocab {
                return bad(format!(
                    "--bos {b} (bos) is outside the vocabulary of {vocab} tokens"
                ));
            }
        }
        let prefix: Vec<u32> = self.bos.into_iter().collect();
        let p = prefix.len();
        let room = max_len.saturating_sub(p) / 2;
        let seq_len = match self.seq_len {
            Some(n) if 2 * n + p > max_len => {
                return bad(format!(
                    "seq_len {n} (--seq-len {n}): {p} + 2 x {n} tokens exceed the model's \
                     {max_len} positions (at most --seq-len {room})"
                ))
            }
            Some(n) => n,
            None if room < 2 => {
                return bad(format!(
                    "the model's {max_len} positions leave no room for a repeated sequence"
                ))
            }
            None => DEFAULT_SEQ_LEN.min(room),
        };
        Ok(CircuitPlan {
            seq_len,
            prefix,
            n_seqs: self.n_seqs,
        })
    }
}

/// The resolved inputs of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitPlan {
    /// Length `n` of the repeated random segment.
    pub seq_len: usize,
    /// The tokens before every sequence (the BOS token, or none).
    pub prefix: Vec<u32>,
    /// Number of sequences.
    pub n_seqs: usize,
}

impl CircuitPlan {
    /// Tokens per sequence: the prefix and the segment twice.
    pub fn tokens_per_sequence(&self) -> usize {
        self.prefix.len() + 2 * self.seq_len
    }
}

/// Where [`run`] stands, reported to its callback.
#[derive(Debug, Clone, Copy)]
pub enum CircuitStep<'a> {
    /// The inputs are resolved; the sequences start.
    Planned(&'a CircuitPlan),
    /// `done` of `total` sequences have been scored.
    Sequences {
        /// Sequences done.
        done: usize,
        /// All sequences.
        total: usize,
    },
    /// The head weights are being read from the model.
    HeadWeights,
    /// A stage of the weights-based analyses begins.
    Analysis(CircuitStage),
}

/// The result of [`run`].
#[derive(Debug, Clone)]
pub struct CircuitRun {
    /// The resolved inputs.
    pub plan: CircuitPlan,
    /// Vocabulary size of the model.
    pub vocab: usize,
    /// Whether the norm gains were folded into the weights.
    pub fold_norm: bool,
    /// What the analyses found.
    pub report: CircuitReport,
}

/// Runs the circuits analysis of `model`: the head scores on `n_seqs` repeated random sequences
/// (drawn with `params.analysis.seed`, one forward pass at a time, so that one sequence's
/// attention patterns are held at once), then [`analyze_circuits`] on the model's head weights.
/// `model` may be owned (it is dropped once its head weights are read, which bounds the memory of
/// a large model) or borrowed. `progress` is called at every step; `ControlFlow::Break` stops the
/// run with [`ProbeError::Interrupted`].
///
/// # Shapes
/// The report's arrays are `[L, H]` per head, `[L, H, d_head]` eigenvalues and `[L, H, L, H]`
/// composition scores (see [`CircuitReport`]).
///
/// # Errors
/// As [`CircuitRunParams::plan`]; [`ProbeError::Model`] from a forward pass or the head weights;
/// [`ProbeError::Analysis`] from the analyses (an eigen-solve failing); [`ProbeError::Interrupted`].
pub fn run<M: Borrow<LanguageModel>>(
    model: M,
    params: &CircuitRunParams,
    progress: &mut dyn FnMut(CircuitStep<'_>) -> ControlFlow<()>,
) -> Result<CircuitRun> {
    let lm = model.borrow();
    let (nl, nh, vocab) = (lm.n_layers(), lm.n_heads(), lm.vocab_size());
    let plan = params.plan(nl, vocab, lm.max_seq_len())?;
    let mut step = |s: CircuitStep<'_>| match progress(s) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => Err(ProbeError::Interrupted),
    };
    step(CircuitStep::Planned(&plan))?;
    let toks = repeated_random_tokens(vocab, plan.seq_len, plan.n_seqs, params.analysis.seed)?;
    let mut scorer = HeadScorer::new(nl, nh, plan.seq_len, plan.prefix.len())?;
    step(CircuitStep::Sequences {
        done: 0,
        total: plan.n_seqs,
    })?;
    for (i, row) in toks.rows().into_iter().enumerate() {
        let seq: Vec<u32> = plan
            .prefix
            .iter()
            .copied()
            .chain(row.iter().copied())
            .collect();
        scorer.add(lm.attention_patterns(&seq)?, &seq)?;
        step(CircuitStep::Sequences {
            done: i + 1,
            total: plan.n_seqs,
        })?;
    }
    let heads = scorer.finish()?;
    step(CircuitStep::HeadWeights)?;
    let hw = lm.head_weights(params.fold_norm)?;
    drop(model);
    let w = AttnWeights::new(hw.w_q, hw.w_k, hw.w_v, hw.w_o)?.with_embeddings(
        Some(hw.w_e),
        Some(hw.w_u),
        Some(hw.b_u),
    )?;
    let mut stopped = false;
    let report = analyze_circuits(&w, heads, &params.analysis, &mut |s| {
        stopped |= progress(CircuitStep::Analysis(s)).is_break();
    })?;
    if stopped {
        return Err(ProbeError::Interrupted);
    }
    Ok(CircuitRun {
        plan,
        vocab,
        fold_norm: params.fold_norm,
        report,
    })
}

/// The model's sizes in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSizes {
    /// Width of one head's queries and keys.
    pub d_head: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Vocabulary size.
    pub d_vocab: usize,
    /// Heads per layer.
    pub n_heads: usize,
    /// Layers.
    pub n_layers: usize,
    /// Whether the norm gains were folded into the weights.
    pub norms_folded: bool,
}

/// The sequences of a run in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequenceInputs {
    /// The tokens before every sequence.
    pub prefix: Vec<u32>,
    /// Length of the repeated segment.
    pub repeated_segment: usize,
    /// How the tokens were drawn.
    pub sampler: String,
    /// Their seed.
    pub seed: u64,
    /// Number of sequences.
    pub sequences: usize,
    /// Tokens per sequence.
    pub tokens_per_sequence: usize,
}

/// One stage's time in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageTime {
    /// Seconds.
    pub seconds: f64,
    /// The stage's name.
    pub stage: String,
}

/// `summary.json` of `hyperlens circuits`: the run's inputs, the model's sizes, the findings and
/// the time of each stage. Its keys are written in alphabetical order at every level
/// ([`CircuitSummary::to_json`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CircuitSummary {
    /// The checkpoint's path.
    pub checkpoint: PathBuf,
    /// Its kind (`lm::detect`'s name).
    pub checkpoint_kind: String,
    /// The findings.
    #[serde(flatten)]
    pub findings: CircuitFindings,
    /// The sequences.
    pub inputs: SequenceInputs,
    /// The model's sizes.
    pub model: ModelSizes,
    /// `hyperlens {version} circuits`.
    pub producer: String,
    /// Seconds per stage, in order.
    pub timings_s: Vec<StageTime>,
    /// Seconds of the whole command.
    pub wall_time_s: f64,
}

impl CircuitSummary {
    /// The summary of `run` on `checkpoint` (of kind `kind`), with `timings` (stage, seconds).
    ///
    /// # Errors
    /// [`ProbeError::Analysis`] from an empty composition baseline.
    pub fn new(
        run: &CircuitRun,
        params: &CircuitRunParams,
        checkpoint: PathBuf,
        kind: String,
        timings: &[(&str, f64)],
        wall_time_s: f64,
    ) -> Result<Self> {
        let r = &run.report;
        Ok(Self {
            checkpoint,
            checkpoint_kind: kind,
            findings: r.summary()?,
            inputs: SequenceInputs {
                prefix: run.plan.prefix.clone(),
                repeated_segment: run.plan.seq_len,
                sampler: "hyperlens_tasks::induction::repeated_random_tokens (uniform over the \
                          vocabulary)"
                    .into(),
                seed: params.analysis.seed,
                sequences: run.plan.n_seqs,
                tokens_per_sequence: run.plan.tokens_per_sequence(),
            },
            model: ModelSizes {
                d_head: r.dims.d_qk,
                d_model: r.dims.d_model,
                d_vocab: run.vocab,
                n_heads: r.dims.n_heads,
                n_layers: r.dims.n_layers,
                norms_folded: run.fold_norm,
            },
            producer: format!("hyperlens {} circuits", env!("CARGO_PKG_VERSION")),
            timings_s: timings
                .iter()
                .map(|&(stage, seconds)| StageTime {
                    seconds,
                    stage: stage.to_string(),
                })
                .collect(),
            wall_time_s,
        })
    }

    /// The summary as a JSON value whose objects keep their keys in alphabetical order (the
    /// findings' keys among the run's), which is how `summary.json` has always been written.
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] if serialisation fails (it does not for these types).
    pub fn to_json(&self) -> Result<serde_json::Value> {
        serde_json::to_value(self).map_err(|e| ProbeError::InvalidInput(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seq_len: Option<usize>, bos: Option<u32>) -> CircuitRunParams {
        CircuitRunParams {
            seq_len,
            bos,
            n_seqs: 1,
            ..CircuitRunParams::default()
        }
    }

    #[test]
    fn seq_len_fits_the_context() {
        let n = |s, bos, max| params(s, bos).plan(2, 100, max).map(|p| p.seq_len);
        assert_eq!(n(None, None, 64).unwrap(), 32);
        assert_eq!(n(None, Some(1), 64).unwrap(), 31);
        assert_eq!(n(None, Some(1), 8192).unwrap(), 50);
        assert_eq!(n(Some(10), Some(1), 64).unwrap(), 10);
        let e = n(Some(32), Some(1), 64).unwrap_err().to_string();
        assert!(
            e.contains("seq_len 32") && e.contains("at most --seq-len 31"),
            "{e}"
        );
        assert!(n(None, None, 3).is_err());
        assert!(n(Some(1), None, 64)
            .unwrap_err()
            .to_string()
            .contains("at least 2"));
        assert!(n(Some(0), None, 64).is_err());
        let p = params(Some(10), Some(7)).plan(2, 100, 64).unwrap();
        assert_eq!((p.prefix.clone(), p.tokens_per_sequence()), (vec![7], 21));
    }

    #[test]
    fn bad_options_are_named() {
        assert!(params(None, Some(100))
            .plan(2, 100, 64)
            .unwrap_err()
            .to_string()
            .contains("--bos"));
        assert!(params(None, None).plan(0, 100, 64).is_err());
        let mut p = params(None, None);
        p.n_seqs = 0;
        assert!(p.check().unwrap_err().to_string().contains("--n-seqs"));
        let mut p = params(None, None);
        p.analysis.threshold = 1.5;
        assert!(p.check().unwrap_err().to_string().contains("--threshold"));
    }
}
