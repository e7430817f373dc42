//! The circuits pipeline of one model, shaped like the latent-code pipeline
//! ([`crate::codes::report`]): the caller runs the model and feeds attention patterns to a
//! [`HeadScorer`], one sequence at a time; [`analyze_circuits`] then reads the weights (OV
//! eigenvalues and copying scores, Q/K/V composition with a random baseline), names the induction
//! and previous-token heads and the K-composition between them, and returns a [`CircuitReport`]
//! that writes its own tables (`circuits/tables.rs`).
//!
//! Source: Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"; Olsson et al.
//! 2022, "In-context Learning and Induction Heads" (repeated random tokens, cut-off 0.4);
//! TransformerLens `head_detector` and `all_composition_scores`; `docs/spec/circuits.md`.
//!
//! Memory is bounded by one sequence's attention `[L, H, T, T]` plus the per-head tables: the
//! scorer keeps sums, not patterns (except the first sequence's, for the figure).

use ndarray::{Array2, Array4, Axis};

use super::composition::{
    composition_baseline, composition_memory_bytes, composition_scores, CompositionBaseline,
    CompositionKind, CompositionParams, CompositionScores, MAX_THREADS,
};
use super::detect::{head_scores, repeated_token_scores, DetectOptions, ErrorMeasure, HeadPattern};
use super::heads::{AttnDims, AttnWeights, HeadEigenvalues};
use super::Real;
use crate::error::{AnalysisError, Result};

/// Head label `L{layer}H{head}` (TransformerLens' `L1H4` style).
pub fn head_label(layer: usize, head: usize) -> String {
    format!("L{layer}H{head}")
}

/// The (pattern, measure) pairs of the TransformerLens head detector that the pipeline scores:
/// previous-token, duplicate-token and induction, each with the "mul" and "abs" measures.
pub fn detector_kinds() -> Vec<(HeadPattern, ErrorMeasure)> {
    let mut v = Vec::new();
    for p in [
        HeadPattern::PreviousToken,
        HeadPattern::DuplicateToken,
        HeadPattern::Induction,
    ] {
        for m in [ErrorMeasure::Mul, ErrorMeasure::Abs] {
            v.push((p.clone(), m));
        }
    }
    v
}

/// Scores of every head on repeated random token sequences, averaged over the sequences.
///
/// # Shapes
/// Every score array is `[L, H]`; `first_pattern` is `[L, H, T, T]` with `T = prefix + 2 n`.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadScores {
    /// Head-detector scores per (pattern, measure), in the order of [`detector_kinds`].
    pub detect: Vec<(HeadPattern, ErrorMeasure, Array2<f64>)>,
    /// Repeated-random-tokens induction stripe (offset `-(n - 1)` in the second copy).
    pub rep_induction: Array2<f64>,
    /// Repeated-random-tokens previous-token stripe (offset -1).
    pub rep_previous: Array2<f64>,
    /// Repeated-random-tokens duplicate-token stripe (offset `-n` in the second copy).
    pub rep_duplicate: Array2<f64>,
    /// Attention of the first sequence (for the figure).
    pub first_pattern: Array4<f32>,
    /// Tokens of the first sequence, prefix included.
    pub first_tokens: Vec<u32>,
    /// Sequences averaged over.
    pub sequences: usize,
    /// Length `n` of the repeated segment.
    pub repeated: usize,
    /// Tokens before the first copy (e.g. a BOS token).
    pub prefix: usize,
}

impl HeadScores {
    /// The head-detector scores of `pattern` under `measure`, `[L, H]`; `None` if not scored.
    pub fn detector(&self, pattern: &HeadPattern, measure: ErrorMeasure) -> Option<&Array2<f64>> {
        self.detect
            .iter()
            .find(|(p, m, _)| p == pattern && *m == measure)
            .map(|(_, _, a)| a)
    }
}

/// Accumulates [`HeadScores`] over sequences, one attention pattern at a time.
#[derive(Debug, Clone)]
pub struct HeadScorer {
    dims: (usize, usize),
    repeated: usize,
    prefix: usize,
    detect: Vec<(HeadPattern, ErrorMeasure, Array2<f64>)>,
    rep: [Array2<f64>; 3],
    first: Option<(Array4<f32>, Vec<u32>)>,
    sequences: usize,
}

impl HeadScorer {
    /// A scorer for a model of `n_layers` x `n_heads` on sequences of `prefix + 2 repeated`
    /// tokens.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] for zero layers, heads or a repeated segment shorter than 2.
    pub fn new(n_layers: usize, n_heads: usize, repeated: usize, prefix: usize) -> Result<Self> {
        if n_layers == 0 || n_heads == 0 || repeated < 2 {
            return Err(AnalysisError::InvalidInput(format!(
                "head scores need layers, heads and a repeated segment of at least 2 tokens, got {n_layers} x {n_heads}, n = {repeated}"
            )));
        }
        let z = || Array2::<f64>::zeros((n_layers, n_heads));
        Ok(Self {
            dims: (n_layers, n_heads),
            repeated,
            prefix,
            detect: detector_kinds()
                .into_iter()
                .map(|(p, m)| (p, m, z()))
                .collect(),
            rep: [z(), z(), z()],
            first: None,
            sequences: 0,
        })
    }

    /// Adds the attention of one sequence.
    ///
    /// # Shapes
    /// `pattern` `[L, H, T, T]` (normalised attention, query by key), `tokens` `[T]` with
    /// `T = prefix + 2 n`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] for a pattern of other layers, heads or length;
    /// [`AnalysisError::NonFinite`] on NaN/inf attention.
    pub fn add(&mut self, pattern: Array4<f32>, tokens: &[u32]) -> Result<()> {
        let (nl, nh, t, _) = pattern.dim();
        if (nl, nh) != self.dims || t != self.prefix + 2 * self.repeated {
            return Err(AnalysisError::Shape(format!(
                "attention pattern [{nl}, {nh}, {t}, _], expected [{}, {}, {}, _]",
                self.dims.0,
                self.dims.1,
                self.prefix + 2 * self.repeated
            )));
        }
        let rep = repeated_token_scores(
            &pattern.view().insert_axis(Axis(0)),
            self.repeated,
            self.prefix,
        )?;
        self.rep[0] += &rep.induction;
        self.rep[1] += &rep.previous_token;
        self.rep[2] += &rep.duplicate_token;
        for (p, m, acc) in self.detect.iter_mut() {
            let opts = DetectOptions {
                measure: *m,
                ..DetectOptions::default()
            };
            *acc += &head_scores(&pattern, tokens, p, &opts)?;
        }
        if self.first.is_none() {
            self.first = Some((pattern, tokens.to_vec()));
        }
        self.sequences += 1;
        Ok(())
    }

    /// The means over the sequences added.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if no sequence was added.
    pub fn finish(self) -> Result<HeadScores> {
        let (first_pattern, first_tokens) = self.first.ok_or_else(|| {
            AnalysisError::InvalidInput("no sequence was scored (at least one is needed)".into())
        })?;
        let k = self.sequences as f64;
        let [ri, rp, rd] = self.rep;
        Ok(HeadScores {
            detect: self
                .detect
                .into_iter()
                .map(|(p, m, a)| (p, m, a / k))
                .collect(),
            rep_induction: ri / k,
            rep_previous: rp / k,
            rep_duplicate: rd / k,
            first_pattern,
            first_tokens,
            sequences: self.sequences,
            repeated: self.repeated,
            prefix: self.prefix,
        })
    }
}

/// Options of [`analyze_circuits`].
#[derive(Debug, Clone, PartialEq)]
pub struct CircuitParams {
    /// Cut-off on the repeated-tokens induction and previous-token scores that names a head
    /// (default 0.4, Olsson et al. 2022).
    pub threshold: f64,
    /// Random matrix pairs per composition kind in the baseline (at least 100).
    pub baseline_samples: usize,
    /// Seed of the baseline.
    pub seed: u64,
    /// Head pairs per composition kind in the top list (at least 1).
    pub top: usize,
    /// Worker threads of the composition scores (0 = all cores).
    pub threads: usize,
}

impl Default for CircuitParams {
    fn default() -> Self {
        Self {
            threshold: 0.4,
            baseline_samples: 1000,
            seed: 0,
            top: 20,
            threads: 0,
        }
    }
}

impl CircuitParams {
    /// Checks the options.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] naming the option (as its command-line flag).
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(AnalysisError::InvalidInput(m));
        if !(self.threshold.is_finite() && (0.0..=1.0).contains(&self.threshold)) {
            return bad(format!("--threshold {} must lie in [0, 1]", self.threshold));
        }
        if self.baseline_samples < 100 {
            return bad(format!(
                "--baseline-samples {} is too few for a 99th percentile (at least 100)",
                self.baseline_samples
            ));
        }
        if self.top == 0 {
            return bad("--top must be at least 1".into());
        }
        if self.threads > MAX_THREADS {
            return bad(format!(
                "--threads {} is more than {MAX_THREADS} worker threads",
                self.threads
            ));
        }
        Ok(())
    }
}

/// One head and its score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NamedHead {
    /// Layer index.
    pub layer: usize,
    /// Head index within the layer.
    pub head: usize,
    /// The score that named it.
    pub score: f64,
}

impl NamedHead {
    /// `L{layer}H{head}`.
    pub fn label(&self) -> String {
        head_label(self.layer, self.head)
    }
}

/// A previous-token head and a later induction head, with the K-composition between them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InductionPair {
    /// The writer: a previous-token head.
    pub previous_token: NamedHead,
    /// The reader: an induction head in a later layer.
    pub induction: NamedHead,
    /// K-composition score of the pair.
    pub k_composition: f64,
    /// Percentile (0-100) of the score in the random baseline.
    pub baseline_percentile: f64,
    /// Whether the score exceeds the baseline's 99th percentile.
    pub above_baseline_p99: bool,
}

/// One row of `composition_top.csv`: a writer-reader head pair ranked by its score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopPair {
    /// Composition kind.
    pub kind: CompositionKind,
    /// 1-based rank within the kind.
    pub rank: usize,
    /// Writer head (earlier layer).
    pub writer: (usize, usize),
    /// Reader head (later layer).
    pub reader: (usize, usize),
    /// Composition score.
    pub score: f64,
    /// Percentile (0-100) of the score in the random baseline.
    pub percentile: f64,
    /// The baseline's 99th percentile.
    pub p99: f64,
}

/// Everything the circuits pipeline found for one model.
///
/// # Shapes
/// Copying scores `[L, H]`; eigenvalues `[L, H, d_head]`; composition scores `[L, H, L, H]`.
#[derive(Debug, Clone)]
pub struct CircuitReport {
    /// Sizes of the analysed weights.
    pub dims: AttnDims,
    /// OV-circuit eigenvalues per head.
    pub ov: HeadEigenvalues,
    /// Full-OV-circuit (`W_E W_V W_O W_U`) eigenvalues per head.
    pub full_ov: HeadEigenvalues,
    /// OV copying scores `Re(sum λ) / sum |λ|`.
    pub ov_copying: Array2<f64>,
    /// Full-OV copying scores.
    pub full_ov_copying: Array2<f64>,
    /// Q-, K- and V-composition scores.
    pub composition: CompositionScores,
    /// Their random-matrix baseline.
    pub baseline: CompositionBaseline,
    /// Estimated working memory of the composition scores, bytes.
    pub composition_memory_bytes: usize,
    /// The top pairs per kind.
    pub top_pairs: Vec<TopPair>,
    /// Head scores on repeated random tokens.
    pub heads: HeadScores,
    /// Heads whose repeated-tokens induction score reaches the threshold, strongest first.
    pub induction_heads: Vec<NamedHead>,
    /// Heads whose previous-token score reaches the threshold, strongest first.
    pub previous_token_heads: Vec<NamedHead>,
    /// Every (previous-token head, later induction head) pair among the named heads.
    pub induction_circuits: Vec<InductionPair>,
    /// The strongest induction head in layers >= 1 (layer 0 in a one-layer model).
    pub top_induction_head: Option<NamedHead>,
    /// The strongest previous-token head.
    pub top_previous_token_head: Option<NamedHead>,
    /// The strongest previous-token head below the top induction head, paired with it.
    pub strongest_pair: Option<InductionPair>,
    /// The options used.
    pub params: CircuitParams,
}

/// Stages of [`analyze_circuits`], reported as each begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitStage {
    /// OV and full-OV eigenvalues.
    Eigenvalues,
    /// Q/K/V composition scores.
    Composition,
    /// The random baseline.
    Baseline,
}

impl CircuitStage {
    /// A short name for progress lines.
    pub fn name(self) -> &'static str {
        match self {
            Self::Eigenvalues => "OV eigenvalues",
            Self::Composition => "composition scores",
            Self::Baseline => "composition baseline",
        }
    }
}

/// Heads whose score is at least `cut`, strongest first.
///
/// # Shapes
/// `scores` `[L, H]`.
pub fn heads_above(scores: &Array2<f64>, cut: f64) -> Vec<NamedHead> {
    let mut v: Vec<NamedHead> = scores
        .indexed_iter()
        .filter(|(_, &x)| x >= cut)
        .map(|((layer, head), &score)| NamedHead { layer, head, score })
        .collect();
    v.sort_by(|a, b| b.score.total_cmp(&a.score));
    v
}

/// The strongest head among the layers in `layers`; `None` if the range is empty.
///
/// # Shapes
/// `scores` `[L, H]`.
pub fn top_head(scores: &Array2<f64>, layers: std::ops::Range<usize>) -> Option<NamedHead> {
    scores
        .indexed_iter()
        .filter(|((l, _), _)| layers.contains(l))
        .map(|((layer, head), &score)| NamedHead { layer, head, score })
        .max_by(|a, b| a.score.total_cmp(&b.score))
}

/// The `top` strongest writer-reader pairs (writer in an earlier layer) of every kind, with their
/// baseline percentile.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] from an empty baseline.
pub fn top_pairs(
    scores: &CompositionScores,
    baseline: &CompositionBaseline,
    top: usize,
) -> Result<Vec<TopPair>> {
    let mut out = Vec::new();
    for kind in CompositionKind::ALL {
        let Some(a) = scores.get(kind) else { continue };
        let p99 = baseline.percentile(kind, 99.0)?;
        let mut pairs: Vec<((usize, usize, usize, usize), f64)> = a
            .indexed_iter()
            .filter(|((l1, _, l2, _), _)| l1 < l2)
            .map(|(i, &x)| (i, x))
            .collect();
        pairs.sort_by(|x, y| y.1.total_cmp(&x.1));
        for (rank, ((l1, h1, l2, h2), score)) in pairs.into_iter().take(top).enumerate() {
            out.push(TopPair {
                kind,
                rank: rank + 1,
                writer: (l1, h1),
                reader: (l2, h2),
                score,
                percentile: 100.0 * baseline.fraction_below(kind, score),
                p99,
            });
        }
    }
    Ok(out)
}

/// Runs the weights-based analyses on `weights` and names the induction circuit from `heads`.
///
/// # Shapes
/// `weights` per-head TransformerLens layouts with `W_E` and `W_U` (see [`AttnWeights`]); `heads`
/// of the same `[L, H]`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for bad options or weights without embeddings;
/// [`AnalysisError::Shape`] when `heads` disagrees with the weights; [`AnalysisError::Numerical`]
/// from an eigen-solve.
pub fn analyze_circuits<A: Real>(
    weights: &AttnWeights<A>,
    heads: HeadScores,
    params: &CircuitParams,
    progress: &mut dyn FnMut(CircuitStage),
) -> Result<CircuitReport> {
    params.check()?;
    let dims = weights.check()?;
    if heads.rep_induction.dim() != (dims.n_layers, dims.n_heads) {
        return Err(AnalysisError::Shape(format!(
            "head scores are {:?}, the weights have {} layers x {} heads",
            heads.rep_induction.dim(),
            dims.n_layers,
            dims.n_heads
        )));
    }
    progress(CircuitStage::Eigenvalues);
    let ov = weights.ov_eigenvalues()?;
    let full_ov = weights.full_ov_eigenvalues()?;
    let (ov_copying, full_ov_copying) = (ov.copying_scores(), full_ov.copying_scores());

    progress(CircuitStage::Composition);
    let cp = CompositionParams {
        threads: params.threads,
        ..CompositionParams::default()
    };
    let composition_memory_bytes = composition_memory_bytes(weights, &cp)?;
    let composition = composition_scores(weights, &cp)?;

    progress(CircuitStage::Baseline);
    let baseline = composition_baseline(
        dims.d_model,
        dims.d_qk,
        dims.d_v,
        params.baseline_samples,
        params.seed,
    )?;
    let top = top_pairs(&composition, &baseline, params.top)?;

    let k_scores = composition.get(CompositionKind::K).ok_or_else(|| {
        AnalysisError::InvalidInput("K-composition scores were not computed".into())
    })?;
    let k_p99 = baseline.percentile(CompositionKind::K, 99.0)?;
    let pair = |previous_token: NamedHead, induction: NamedHead| {
        let x = k_scores[[
            previous_token.layer,
            previous_token.head,
            induction.layer,
            induction.head,
        ]];
        InductionPair {
            previous_token,
            induction,
            k_composition: x,
            baseline_percentile: 100.0 * baseline.fraction_below(CompositionKind::K, x),
            above_baseline_p99: x > k_p99,
        }
    };
    let cut = params.threshold;
    let induction_heads = heads_above(&heads.rep_induction, cut);
    let previous_token_heads = heads_above(&heads.rep_previous, cut);
    let mut induction_circuits = Vec::new();
    for &ind in &induction_heads {
        for &prev in &previous_token_heads {
            if prev.layer < ind.layer {
                induction_circuits.push(pair(prev, ind));
            }
        }
    }
    let nl = dims.n_layers;
    let top_induction_head = top_head(&heads.rep_induction, 1.min(nl - 1)..nl);
    let strongest_pair = top_induction_head
        .and_then(|ind| top_head(&heads.rep_previous, 0..ind.layer).map(|prev| pair(prev, ind)));
    let top_previous_token_head = top_head(&heads.rep_previous, 0..nl);
    Ok(CircuitReport {
        dims,
        ov,
        full_ov,
        ov_copying,
        full_ov_copying,
        composition,
        baseline,
        composition_memory_bytes,
        top_pairs: top,
        heads,
        induction_heads,
        previous_token_heads,
        induction_circuits,
        top_induction_head,
        top_previous_token_head,
        strongest_pair,
        params: params.clone(),
    })
}

impl CircuitReport {
    /// The previous-token head a figure shows beside the top induction head: the strongest one
    /// below the induction head's layer (the pair of the circuit), else the strongest overall.
    pub fn shown_previous_token_head(&self) -> Option<NamedHead> {
        self.strongest_pair
            .map(|p| p.previous_token)
            .or(self.top_previous_token_head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn heads_are_named_strongest_first() {
        let s = array![[0.1, 0.5, 0.45], [0.9, 0.39, 0.4]];
        let names: Vec<String> = heads_above(&s, 0.4).iter().map(|h| h.label()).collect();
        assert_eq!(names, ["L1H0", "L0H1", "L0H2", "L1H2"]);
        let at = |r: std::ops::Range<usize>| top_head(&s, r).map(|h| (h.layer, h.head));
        assert_eq!(at(0..1), Some((0, 1)));
        assert_eq!(at(1..2), Some((1, 0)));
        assert_eq!(at(2..2), None);
    }

    #[test]
    fn options_are_checked() {
        assert!(CircuitParams::default().check().is_ok());
        let p = CircuitParams {
            threshold: 1.5,
            ..CircuitParams::default()
        };
        assert!(p.check().unwrap_err().to_string().contains("--threshold"));
        let p = CircuitParams {
            baseline_samples: 10,
            ..CircuitParams::default()
        };
        assert!(p.check().is_err());
        let p = CircuitParams {
            threads: 100_000,
            ..CircuitParams::default()
        };
        assert!(p
            .check()
            .unwrap_err()
            .to_string()
            .contains("--threads 100000"));
        assert!(HeadScorer::new(1, 1, 1, 0).is_err());
        assert!(HeadScorer::new(1, 1, 2, 0).unwrap().finish().is_err());
    }

    /// A perfect induction pattern scores 1 on the induction stripe and the scorer's mean over
    /// two identical sequences equals the single-sequence score.
    #[test]
    fn scorer_averages_sequences() {
        let n = 3;
        let t = 2 * n;
        let mut p = Array4::<f32>::zeros((1, 1, t, t));
        for q in 0..t {
            // Second-copy query n+i attends to key i+1 (the induction stripe); the rest to
            // themselves.
            let k = if q >= n { q + 1 - n } else { q };
            p[[0, 0, q, k]] = 1.0;
        }
        let tokens = [5u32, 6, 7, 5, 6, 7];
        let mut s = HeadScorer::new(1, 1, n, 0).unwrap();
        s.add(p.clone(), &tokens).unwrap();
        s.add(p, &tokens).unwrap();
        let h = s.finish().unwrap();
        assert_eq!(h.sequences, 2);
        let single =
            repeated_token_scores(&h.first_pattern.view().insert_axis(Axis(0)), n, 0).unwrap();
        assert_eq!(h.rep_induction, single.induction);
        assert_eq!(h.rep_induction[[0, 0]], 1.0);
        assert_eq!(h.rep_previous[[0, 0]], 0.0);
        let mut bad = HeadScorer::new(2, 1, n, 0).unwrap();
        assert!(bad.add(Array4::zeros((1, 1, t, t)), &tokens).is_err());
    }
}
