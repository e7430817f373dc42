//! The direct path: the bigram table `W_E W_U (+ b_U)` of a zero-layer model, and the skip-trigrams
//! "A ... B C" that each head of a one-layer attention-only model adds through its QK and OV circuits.
//!
//! Source: Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits", sections
//! "Zero-Layer Transformers" and "One-Layer Attention-Only Transformers" (skip-trigram tables read
//! from the expanded QK and OV circuits); `docs/spec/circuits.md`. Nothing of size [vocab, vocab] is
//! materialised: rows (bigrams) or source tokens (skip-trigrams) are streamed in blocks.

use ndarray::{s, Array1, Array2, ArrayView1, ArrayView2, Axis};

use super::heads::AttnWeights;
use super::linalg::{check_finite, dot_cols_f64, to_f64};
use super::Real;
use crate::error::{AnalysisError, Result};

/// Top continuations per source token.
///
/// # Shapes
/// `sources` `[n]`; `tokens`, `logits`, `log_probs` [n, k], best first (ties: lower token id first).
#[derive(Debug, Clone, PartialEq)]
pub struct TopTokens {
    /// Source token ids, one per row.
    pub sources: Vec<usize>,
    /// Continuation token ids.
    pub tokens: Array2<usize>,
    /// Their logits `W_E[src] W_U (+ b_U)`.
    pub logits: Array2<f64>,
    /// Their log-probabilities under a softmax over the whole vocabulary.
    pub log_probs: Array2<f64>,
}

/// Indices of the `k` largest entries of `row`, best first, ties broken by lower index.
fn top_k_indices(row: ArrayView1<f64>, k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    let cmp = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx
}

fn log_sum_exp(row: ArrayView1<f64>) -> f64 {
    let m = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
    if !m.is_finite() {
        return m;
    }
    m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

fn check_sources(sources: &[usize], vocab: usize) -> Result<()> {
    if let Some(&bad) = sources.iter().find(|&&t| t >= vocab) {
        return Err(AnalysisError::InvalidInput(format!(
            "source token {bad} outside the vocabulary of {vocab}"
        )));
    }
    Ok(())
}

/// Top-`k` continuations of each source token under the direct path `W_E W_U + b_U`: the bigram
/// table of a zero-layer model (and the direct term of any model without layer norm).
///
/// # Shapes
/// `w_e` [vocab, D], `w_u` [D, vocab], `b_u` `[vocab]`; `sources` token ids (default: every token);
/// returns [n_sources, k] arrays (see [`TopTokens`]). Rows are computed in blocks of `block_rows`, so
/// memory is `block_rows x vocab` numbers plus one `f64` copy of `W_U`.
///
/// # Errors
/// [`AnalysisError::Shape`] on inconsistent shapes; [`AnalysisError::InvalidInput`] if `k` is 0 or
/// exceeds the vocabulary, `block_rows` is 0, or a source id is out of range;
/// [`AnalysisError::NonFinite`] on NaN/inf weights.
pub fn bigram_top_k<A: Real>(
    w_e: ArrayView2<A>,
    w_u: ArrayView2<A>,
    b_u: Option<ArrayView1<A>>,
    k: usize,
    sources: Option<&[usize]>,
    block_rows: usize,
) -> Result<TopTokens> {
    let (vocab, d) = w_e.dim();
    if w_u.nrows() != d || w_u.ncols() != vocab {
        return Err(AnalysisError::Shape(format!(
            "W_E is {:?} and W_U is {:?}; expected [vocab, D] and [D, vocab]",
            w_e.dim(),
            w_u.dim()
        )));
    }
    if let Some(b) = &b_u {
        if b.len() != vocab {
            return Err(AnalysisError::Shape(format!(
                "b_U has length {} but the vocabulary is {vocab}",
                b.len()
            )));
        }
        check_finite(b, "b_U")?;
    }
    if k == 0 || k > vocab || block_rows == 0 {
        return Err(AnalysisError::InvalidInput(format!(
            "bigram top-k needs 1 <= k <= vocab ({vocab}) and block_rows >= 1, got k {k}, block_rows {block_rows}"
        )));
    }
    check_finite(&w_e, "W_E")?;
    check_finite(&w_u, "W_U")?;
    let all: Vec<usize>;
    let sources = match sources {
        Some(s) => {
            check_sources(s, vocab)?;
            s
        }
        None => {
            all = (0..vocab).collect();
            &all
        }
    };
    let w_u = to_f64(&w_u);
    let b_u: Option<Array1<f64>> = b_u.map(|b| b.mapv(|x| x.into()));
    let n = sources.len();
    let mut tokens = Array2::zeros((n, k));
    let mut logits = Array2::zeros((n, k));
    let mut log_probs = Array2::zeros((n, k));
    for (blk, ids) in sources.chunks(block_rows).enumerate() {
        let rows = w_e.select(Axis(0), ids).mapv(|x| x.into());
        let mut z = rows.dot(&w_u); // [blk, vocab]
        if let Some(b) = &b_u {
            z += b;
        }
        for (r, row) in z.outer_iter().enumerate() {
            let out = blk * block_rows + r;
            let lse = log_sum_exp(row);
            for (c, t) in top_k_indices(row, k).into_iter().enumerate() {
                tokens[[out, c]] = t;
                logits[[out, c]] = row[t];
                log_probs[[out, c]] = row[t] - lse;
            }
        }
    }
    Ok(TopTokens {
        sources: sources.to_vec(),
        tokens,
        logits,
        log_probs,
    })
}

/// One skip-trigram "A ... B C" of a head: when the destination token B attends to an earlier source
/// token A, the head raises the logit of the output token C.
#[derive(Debug, Clone, PartialEq)]
pub struct SkipTrigram {
    /// Source token A (attended to; key side).
    pub source: usize,
    /// Destination token B (the current token; query side).
    pub dest: usize,
    /// Output token C (whose logit the head raises).
    pub out: usize,
    /// Centred full QK entry: `W_E[B] W_Q W_K^T (W_E[A] - mean_A' W_E[A'])^T`, the attention score of
    /// B on A relative to B's mean score over all sources (softmax is invariant to that shift).
    pub qk: f64,
    /// Centred full OV entry: `W_E[A] W_V W_O (W_U[:, C] - mean_C' W_U[:, C'])`, the logit boost of C
    /// relative to the mean boost over all outputs (softmax is invariant to that shift).
    pub ov: f64,
    /// Ranking score `qk * ov` (both positive).
    pub score: f64,
}

/// Parameters of [`skip_trigrams`].
#[derive(Debug, Clone, PartialEq)]
pub struct SkipTrigramParams {
    /// Number of skip-trigrams returned (default 20).
    pub top_k: usize,
    /// Source tokens A to consider (default: every token).
    pub sources: Option<Vec<usize>>,
    /// Source tokens processed per block (default 256); memory is about `2 x block x vocab` numbers.
    pub block: usize,
}

impl Default for SkipTrigramParams {
    fn default() -> Self {
        SkipTrigramParams {
            top_k: 20,
            sources: None,
            block: 256,
        }
    }
}

impl SkipTrigramParams {
    /// Validates the parameters.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if `top_k` or `block` is 0.
    pub fn check(&self) -> Result<()> {
        if self.top_k == 0 || self.block == 0 {
            return Err(AnalysisError::InvalidInput(format!(
                "skip-trigrams need top_k >= 1 and block >= 1, got {} and {}",
                self.top_k, self.block
            )));
        }
        Ok(())
    }
}

/// The top skip-trigrams of head `(layer, head)` read from its full QK and OV circuits (positional
/// embeddings and layer norms ignored; exact for a one-layer attention-only model without layer norm,
/// the direct path through this head otherwise).
///
/// Ranking: a skip-trigram needs B to attend to A (centred QK entry > 0) and A to raise C (centred OV
/// entry > 0); triples are ranked by the product `qk * ov` of the two centred entries, both positive
/// (after Elhage et al. 2021, who read the largest entries of the expanded QK and OV matrices; the
/// centring removes the per-row shifts to which the softmaxes are blind). The result is exact: for
/// each source A only the `top_k` best B and C can enter the global top `top_k`.
///
/// # Shapes
/// Needs `W_E` [vocab, D] and `W_U` [D, vocab]; returns at most `top_k` triples, best first.
/// Cost: `2 vocab^2 d` multiply-adds per head.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] if `W_E`/`W_U` is missing, the head is out of range, a source id
/// is out of range or the parameters are invalid; as [`AttnWeights::check`].
pub fn skip_trigrams<A: Real>(
    w: &AttnWeights<A>,
    layer: usize,
    head: usize,
    params: &SkipTrigramParams,
) -> Result<Vec<SkipTrigram>> {
    params.check()?;
    let dims = w.check()?;
    if layer >= dims.n_layers || head >= dims.n_heads {
        return Err(AnalysisError::InvalidInput(format!(
            "head L{layer}H{head} outside a model of {} layers x {} heads",
            dims.n_layers, dims.n_heads
        )));
    }
    let (w_e, w_u) = match (&w.w_e, &w.w_u) {
        (Some(e), Some(u)) => (e, u),
        _ => {
            return Err(AnalysisError::InvalidInput(
                "skip-trigrams need W_E and W_U".into(),
            ))
        }
    };
    let vocab = w_e.nrows();
    let all: Vec<usize>;
    let sources: &[usize] = match &params.sources {
        Some(s) => {
            check_sources(s, vocab)?;
            s
        }
        None => {
            all = (0..vocab).collect();
            &all
        }
    };
    let wq = AttnWeights::head_f64(&w.w_q, layer, head);
    let wk = AttnWeights::head_f64(&w.w_k, layer, head);
    let wv = AttnWeights::head_f64(&w.w_v, layer, head);
    let wo = AttnWeights::head_f64(&w.w_o, layer, head);
    // Destination side: W_E W_Q [vocab, d_qk], streamed from W_E in blocks.
    let mut eq = Array2::<f64>::zeros((vocab, dims.d_qk));
    let mut e_mean = Array1::<f64>::zeros(dims.d_model);
    for start in (0..vocab).step_by(params.block) {
        let end = (start + params.block).min(vocab);
        let rows = to_f64(&w_e.slice(s![start..end, ..]));
        eq.slice_mut(s![start..end, ..]).assign(&rows.dot(&wq));
        e_mean += &rows.sum_axis(Axis(0));
    }
    e_mean /= vocab as f64;
    // Output side: W_O W_U [d_v, vocab], centred over outputs.
    let mut ou = dot_cols_f64(wo.view(), w_u);
    let ou_mean = ou
        .mean_axis(Axis(1))
        .unwrap_or_else(|| Array1::zeros(ou.nrows()));
    ou -= &ou_mean.insert_axis(Axis(1));
    let k = params.top_k;
    let mut best: Vec<SkipTrigram> = Vec::new();
    for ids in sources.chunks(params.block) {
        let rows = w_e.select(Axis(0), ids).mapv(|x| x.into()); // [blk, D]
        let keys = (&rows - &e_mean).dot(&wk); // [blk, d_qk]
        let qk = eq.dot(&keys.t()); // [vocab (dest), blk]
        let ov = rows.dot(&wv).dot(&ou); // [blk, vocab (out)]
        for (j, &a) in ids.iter().enumerate() {
            let col = qk.column(j);
            let row = ov.row(j);
            let dests: Vec<usize> = top_k_indices(col, k.min(vocab))
                .into_iter()
                .filter(|&b| col[b] > 0.0)
                .collect();
            let outs: Vec<usize> = top_k_indices(row, k.min(vocab))
                .into_iter()
                .filter(|&c| row[c] > 0.0)
                .collect();
            for &b in &dests {
                for &c in &outs {
                    best.push(SkipTrigram {
                        source: a,
                        dest: b,
                        out: c,
                        qk: col[b],
                        ov: row[c],
                        score: col[b] * row[c],
                    });
                }
            }
            if best.len() > 8 * k {
                rank_and_truncate(&mut best, k);
            }
        }
    }
    rank_and_truncate(&mut best, k);
    Ok(best)
}

fn rank_and_truncate(v: &mut Vec<SkipTrigram>, k: usize) {
    v.sort_by(|x, y| {
        y.score
            .total_cmp(&x.score)
            .then(x.source.cmp(&y.source))
            .then(x.dest.cmp(&y.dest))
            .then(x.out.cmp(&y.out))
    });
    v.truncate(k);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn top_k_breaks_ties_by_index() {
        let row = array![1.0, 3.0, 3.0, -1.0, 2.0];
        assert_eq!(top_k_indices(row.view(), 3), vec![1, 2, 4]);
        assert_eq!(top_k_indices(row.view(), 5), vec![1, 2, 4, 0, 3]);
    }

    #[test]
    fn bigram_rejects_bad_input() {
        let e = Array2::<f64>::zeros((5, 3));
        let u = Array2::<f64>::zeros((3, 5));
        assert!(bigram_top_k(e.view(), u.view(), None, 0, None, 4).is_err());
        assert!(bigram_top_k(e.view(), u.view(), None, 6, None, 4).is_err());
        assert!(bigram_top_k(e.view(), u.t(), None, 2, None, 4).is_err());
        assert!(bigram_top_k(e.view(), u.view(), None, 2, Some(&[5]), 4).is_err());
        let b = Array1::<f64>::zeros(4);
        assert!(bigram_top_k(e.view(), u.view(), Some(b.view()), 2, None, 4).is_err());
    }
}
