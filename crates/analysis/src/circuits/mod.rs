//! Circuits read straight from the weights: QK/OV circuits, eigenvalue copying scores, composition
//! scores, head detection from attention patterns, and the direct path (bigrams, skip-trigrams).
//!
//! Source: Elhage et al., "A Mathematical Framework for Transformer Circuits" (Anthropic, 2021), and
//! the formulas of TransformerLens (`FactoredMatrix`, `HookedTransformer.all_composition_scores`,
//! `utils.composition_scores`, `head_detector`), as specified in `docs/spec/circuits.md`.
//!
//! Conventions: row vectors (`x W`), so the paper's `W_O W_V` is `W_V W_O` here; per-head weights in
//! TransformerLens layouts (`W_Q`, `W_K`, `W_V` [layer, head, d_model, d_head], `W_O`
//! [layer, head, d_head, d_model], `W_E` [vocab, d_model], `W_U` [d_model, vocab]). Inputs may be
//! `f32` or `f64`; every computation runs in `f64`. No `[vocab, vocab]` or `[D, D]`-per-pair product is
//! ever materialised: per-head circuits are [`FactoredMatrix`] values of rank at most `d_head`.
//!
//! Modules:
//! - [`factored`]: the low-rank matrix `A B` with eigenvalues, SVD and norms through the small middle.
//! - [`heads`]: the weights struct [`AttnWeights`], per-head OV/QK circuits, eigenvalues and copying
//!   scores, grouped-query expansion.
//! - [`composition`]: Q/K/V composition scores of all head pairs and a random-matrix baseline.
//! - [`detect`]: previous-token, duplicate-token and induction head scores from attention patterns.
//! - [`direct`]: bigram table of the direct path and skip-trigrams of one-layer attention-only models.
//! - [`pipeline`]: the whole circuits analysis of one model ([`analyze_circuits`] into a
//!   [`CircuitReport`], which writes its tables), as `hyperlens circuits` runs it.

pub mod composition;
pub mod detect;
pub mod direct;
pub mod factored;
pub mod heads;
mod linalg;
pub mod pipeline;
mod tables;

pub use composition::{
    composition_baseline, composition_memory_bytes, composition_scores, CompositionBaseline,
    CompositionKind, CompositionMethod, CompositionParams, CompositionScores,
};
pub use detect::{
    detection_pattern, head_scores, head_scores_batch, head_scores_prompts, repeated_token_scores,
    DetectOptions, ErrorMeasure, HeadPattern, RepeatedTokenScores,
};
pub use direct::{bigram_top_k, skip_trigrams, SkipTrigram, SkipTrigramParams, TopTokens};
pub use factored::{Eigenvalues, FactoredMatrix, FactoredSvd};
pub use heads::{expand_kv_heads, AttnDims, AttnWeights, HeadEigenvalues};
pub use pipeline::{
    analyze_circuits, head_label, CircuitParams, CircuitReport, CircuitStage, HeadScorer,
    HeadScores, InductionPair, NamedHead, TopPair,
};
pub use tables::{
    CircuitFindings, CompositionFinding, Cut, DetectionOptions, HeadFinding, PairFinding,
    Thresholds, TopInductionFinding,
};

/// A floating-point element accepted as input (`f32` or `f64`); everything is computed in `f64`.
pub trait Real: Copy + Into<f64> + Send + Sync + 'static {}

impl Real for f32 {}
impl Real for f64 {}
