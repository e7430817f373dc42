//! Token corpora for the circuits analyses (docs/spec/circuits.md; Elhage et al. 2021, "A Mathematical
//! Framework for Transformer Circuits"; Olsson et al. 2022, "In-context Learning and Induction Heads").
//!
//! [`Corpus`] makes sequences that reward the two mechanisms the circuits work looks for:
//! - **Bigrams (direct path).** Outside repeats, token t+1 is drawn from a fixed, seeded transition
//!   table P(b | a) ([`Corpus::transition_matrix`]). A zero-layer model (W_E W_U) can learn exactly
//!   this table; its best loss is the table's mean conditional entropy ([`Corpus::bigram_entropy`]).
//! - **Induction.** At each position, with probability `repeat_prob`, the sequence copies a segment
//!   (length uniform in `min_repeat..=max_repeat`) that occurred earlier in the same sequence. Inside a
//!   copy, every token after the first is predictable exactly by "find the previous occurrence of the
//!   current token and predict the token that followed it" (an induction head fed by a previous-token
//!   head), so a 2-layer attention-only model can push the loss at those positions towards 0, below
//!   the bigram entropy. Since segments are copied from random earlier positions, the copy's content
//!   is not predictable from bigrams alone.
//!
//! [`repeated_random_tokens`] gives the standard induction test input: uniform random tokens repeated
//! twice (TransformerLens' `generate_repeated_tokens`, without the BOS token).

use ndarray::Array2;
use rand::Rng;

use crate::error::{Result, TasksError};
use crate::rng::{self, Domain};

/// Parameters of an induction corpus.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CorpusParams {
    /// Vocabulary size V (2..=4096).
    pub vocab: usize,
    /// Sequence length T (>= 2).
    pub seq_len: usize,
    /// Seed of the bigram table (batches take their own seed).
    pub seed: u64,
    /// Sharpness of the bigram table: P(b | a) ∝ exp(strength * g_ab) with g_ab standard Gumbel
    /// noise. 0 gives uniform transitions (nothing for the direct path to learn); 2 to 4 gives a few
    /// likely successors per token. Finite and >= 0.
    pub bigram_strength: f64,
    /// Probability, at each position not inside a copy, of starting a copy of an earlier segment.
    /// In [0, 1].
    pub repeat_prob: f64,
    /// Shortest copied segment (>= 2 so that at least one copied token is predictable by induction).
    pub min_repeat: usize,
    /// Longest copied segment (>= `min_repeat`).
    pub max_repeat: usize,
}

impl Default for CorpusParams {
    fn default() -> Self {
        CorpusParams {
            vocab: 64,
            seq_len: 64,
            seed: 0,
            bigram_strength: 3.0,
            repeat_prob: 0.05,
            min_repeat: 4,
            max_repeat: 12,
        }
    }
}

impl CorpusParams {
    /// Validates the parameters.
    ///
    /// # Errors
    /// [`TasksError::InvalidParam`] naming the field.
    pub fn check(&self) -> Result<()> {
        if !(2..=4096).contains(&self.vocab) {
            return Err(TasksError::param(
                "vocab",
                format!("{} is not in 2..=4096", self.vocab),
            ));
        }
        if self.seq_len < 2 {
            return Err(TasksError::param(
                "seq_len",
                format!("{} is less than 2", self.seq_len),
            ));
        }
        if !(self.bigram_strength.is_finite() && self.bigram_strength >= 0.0) {
            return Err(TasksError::param(
                "bigram_strength",
                format!("{} is not finite and >= 0", self.bigram_strength),
            ));
        }
        if !(0.0..=1.0).contains(&self.repeat_prob) {
            return Err(TasksError::param(
                "repeat_prob",
                format!("{} is not in [0, 1]", self.repeat_prob),
            ));
        }
        if self.min_repeat < 2 || self.max_repeat < self.min_repeat {
            return Err(TasksError::param(
                "min_repeat/max_repeat",
                format!(
                    "need 2 <= min_repeat <= max_repeat, got {}..={}",
                    self.min_repeat, self.max_repeat
                ),
            ));
        }
        Ok(())
    }
}

/// A seeded token corpus with bigram structure and repeated segments (see the module docs).
#[derive(Debug, Clone)]
pub struct Corpus {
    params: CorpusParams,
    /// [V, V] row-stochastic transition table P(next = b | current = a).
    probs: Array2<f32>,
    /// [V * V] cumulative rows of `probs`, for sampling.
    cdf: Vec<f32>,
}

/// One batch with, per position, whether the token was copied from an earlier segment.
#[derive(Debug, Clone, PartialEq)]
pub struct CorpusBatch {
    /// [B, T] token ids.
    pub tokens: Array2<u32>,
    /// [B, T] true where the token is part of a copied segment.
    pub copied: Array2<bool>,
    /// [B, T] for copied tokens, the position they were copied from (else `u32::MAX`).
    pub source: Array2<u32>,
}

impl Corpus {
    /// Builds the bigram table from `params.seed`.
    ///
    /// # Errors
    /// [`TasksError::InvalidParam`] if `params.check()` fails.
    pub fn new(params: CorpusParams) -> Result<Corpus> {
        params.check()?;
        let v = params.vocab;
        let mut rng = rng::stream(params.seed, Domain::InductionTable, v as u64, 0);
        let mut probs = Array2::<f32>::zeros((v, v));
        let mut cdf = vec![0f32; v * v];
        let mut row = vec![0f64; v];
        for a in 0..v {
            for r in row.iter_mut() {
                // Standard Gumbel: -ln(-ln u), u in (0, 1).
                let u: f64 = rng.gen_range(f64::EPSILON..1.0);
                *r = params.bigram_strength * -(-u.ln()).ln();
            }
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = row.iter().map(|&l| (l - max).exp()).sum();
            let mut acc = 0f64;
            for b in 0..v {
                let p = (row[b] - max).exp() / z;
                probs[[a, b]] = p as f32;
                acc += p;
                cdf[a * v + b] = acc as f32;
            }
            cdf[a * v + v - 1] = 1.0;
        }
        Ok(Corpus { params, probs, cdf })
    }

    /// The parameters.
    pub fn params(&self) -> &CorpusParams {
        &self.params
    }

    /// The bigram transition table.
    ///
    /// # Shapes
    /// [V, V], row a = P(next | current = a); rows sum to 1.
    pub fn transition_matrix(&self) -> &Array2<f32> {
        &self.probs
    }

    /// Mean conditional entropy of the bigram table in nats, averaged over current tokens uniformly:
    /// the loss a perfect bigram (direct-path) model reaches at non-copied positions, up to the
    /// deviation of the token distribution from uniform.
    pub fn bigram_entropy(&self) -> f64 {
        let v = self.params.vocab;
        let h: f64 = self
            .probs
            .iter()
            .map(|&p| {
                if p > 0.0 {
                    -(p as f64) * (p as f64).ln()
                } else {
                    0.0
                }
            })
            .sum();
        h / v as f64
    }

    /// Batch `index` of the stream `seed`: `batch` sequences of `seq_len` token ids.
    ///
    /// # Shapes
    /// Returns [B, T] token ids in 0..V. Deterministic in (table, seed, index, batch).
    pub fn batch(&self, seed: u64, index: u64, batch: usize) -> Array2<u32> {
        self.batch_with_copies(seed, index, batch).tokens
    }

    /// Like [`Corpus::batch`], also returning which positions are copies and of where.
    ///
    /// Generation per sequence: token 0 is uniform; at each later position not inside a copy, with
    /// probability `repeat_prob` (and if a segment of the chosen length fits before it) a copy starts:
    /// a length L uniform in `min_repeat..=max_repeat` and a source start s uniform among positions with
    /// s + L <= current position; the next L tokens (truncated at T) are the tokens s..s+L. Otherwise
    /// the token is drawn from the bigram table given the previous token.
    ///
    /// # Shapes
    /// All three arrays are [B, T].
    pub fn batch_with_copies(&self, seed: u64, index: u64, batch: usize) -> CorpusBatch {
        let p = &self.params;
        let (v, t) = (p.vocab, p.seq_len);
        let mut rng = rng::stream(seed, Domain::InductionSeq, self.params.seed, index);
        let mut tokens = Array2::<u32>::zeros((batch, t));
        let mut copied = Array2::<bool>::from_elem((batch, t), false);
        let mut source = Array2::<u32>::from_elem((batch, t), u32::MAX);
        let mut seq = vec![0u32; t];
        for b in 0..batch {
            seq[0] = rng.gen_range(0..v) as u32;
            let mut i = 1;
            while i < t {
                if rng.gen_bool(p.repeat_prob) {
                    let len = rng.gen_range(p.min_repeat..=p.max_repeat);
                    if len <= i {
                        let s = rng.gen_range(0..=i - len);
                        for off in 0..len.min(t - i) {
                            seq[i + off] = seq[s + off];
                            copied[[b, i + off]] = true;
                            source[[b, i + off]] = (s + off) as u32;
                        }
                        i += len;
                        continue;
                    }
                }
                let prev = seq[i - 1] as usize;
                let u: f32 = rng.gen();
                let row = &self.cdf[prev * v..(prev + 1) * v];
                seq[i] = row.partition_point(|&c| c <= u).min(v - 1) as u32;
                i += 1;
            }
            for (j, &tok) in seq.iter().enumerate() {
                tokens[[b, j]] = tok;
            }
        }
        CorpusBatch {
            tokens,
            copied,
            source,
        }
    }
}

/// Uniform random tokens repeated twice: row b = (r_1..r_n, r_1..r_n), the input on which
/// TransformerLens scores induction heads (an induction head at query n + i attends key i + 1; the
/// stripe at offset -(n - 1)). No BOS token is prepended.
///
/// # Shapes
/// Returns [batch, 2n] token ids in 0..vocab.
///
/// # Errors
/// [`TasksError::InvalidParam`] if `vocab` is 0 or above `u32::MAX`.
pub fn repeated_random_tokens(
    vocab: usize,
    n: usize,
    batch: usize,
    seed: u64,
) -> Result<Array2<u32>> {
    if vocab == 0 || vocab as u64 > u32::MAX as u64 {
        return Err(TasksError::param(
            "vocab",
            format!("{vocab} is not in 1..=u32::MAX"),
        ));
    }
    let mut rng = rng::stream(seed, Domain::RepeatedTokens, vocab as u64, n as u64);
    let mut out = Array2::<u32>::zeros((batch, 2 * n));
    for b in 0..batch {
        for i in 0..n {
            let tok = rng.gen_range(0..vocab) as u32;
            out[[b, i]] = tok;
            out[[b, n + i]] = tok;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_are_distributions_and_strength_zero_is_uniform() {
        let c = Corpus::new(CorpusParams {
            vocab: 13,
            ..Default::default()
        })
        .unwrap();
        for row in c.transition_matrix().outer_iter() {
            assert!((row.sum() - 1.0).abs() < 1e-5);
        }
        assert!(c.bigram_entropy() < (13f64).ln() - 0.3);
        let u = Corpus::new(CorpusParams {
            vocab: 13,
            bigram_strength: 0.0,
            ..Default::default()
        })
        .unwrap();
        assert!((u.bigram_entropy() - (13f64).ln()).abs() < 1e-5);
    }

    #[test]
    fn bad_params_error() {
        for p in [
            CorpusParams {
                vocab: 1,
                ..Default::default()
            },
            CorpusParams {
                seq_len: 1,
                ..Default::default()
            },
            CorpusParams {
                repeat_prob: 1.5,
                ..Default::default()
            },
            CorpusParams {
                min_repeat: 1,
                ..Default::default()
            },
            CorpusParams {
                bigram_strength: f64::NAN,
                ..Default::default()
            },
        ] {
            assert!(Corpus::new(p).is_err());
        }
        assert!(repeated_random_tokens(0, 5, 2, 0).is_err());
    }
}
