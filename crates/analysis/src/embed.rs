//! t-SNE embeddings of latent codes and their trustworthiness.
//!
//! The paper projects codes to two dimensions to show that they cluster by rule (Fig. 5; the
//! fuzzy-logic codes by term, Fig. 2D / A2); the projection may be t-SNE. t-SNE itself is the
//! `linfa-tsne` crate (a wrapper of `bhtsne`: Barnes-Hut t-SNE, van der Maaten 2014), seeded. How
//! faithful an embedding is gets measured by the trustworthiness of Venna and Kaski (2001), as
//! scikit-learn's `sklearn.manifold.trustworthiness` computes it: with `r(i, j)` the rank of `j`
//! among `i`'s neighbours in the input space (1 = nearest) and `U_k(i)` the points among `i`'s `k`
//! nearest neighbours in the embedding that are not among its `k` nearest in the input,
//! `T(k) = 1 - 2 / (n k (2n - 3k - 1)) * sum_i sum_{j in U_k(i)} (r(i, j) - k)`; 1 means every
//! embedded neighbourhood is a true one.

use linfa::traits::Transformer;
use ndarray::{Array2, ArrayView2};
use rand::SeedableRng;
use serde::Serialize;

use crate::error::{AnalysisError, Result};

/// Parameters of [`tsne`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TsneParams {
    /// Perplexity (scikit-learn's default 30); must be below `(N - 1) / 3`.
    pub perplexity: f64,
    /// Barnes-Hut threshold theta (0: exact gradients; scikit-learn's `angle`, default 0.5).
    pub theta: f64,
    /// Gradient-descent iterations (scikit-learn's default 1000).
    pub max_iter: usize,
    /// Seed of the initial embedding.
    pub seed: u64,
}

impl Default for TsneParams {
    fn default() -> Self {
        TsneParams {
            perplexity: 30.0,
            theta: 0.5,
            max_iter: 1000,
            seed: 0,
        }
    }
}

/// A two-dimensional t-SNE embedding of the rows of `x` (module docs). The seed fixes the initial
/// embedding, but not the result: with `theta > 0`, bhtsne 0.4.1 builds its nearest-neighbour
/// tree from vantage points drawn with `rand::thread_rng`, and the different summation orders that
/// follow move the embedding from run to run (its trustworthiness stays within about 0.01).
///
/// # Shapes
/// `x [N, D]` with `D >= 2` -> `[N, 2]`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for non-finite values, fewer than 2 features, or a perplexity
/// that is not positive or not below `(N - 1) / 3`; [`AnalysisError::Numerical`] if the library
/// fails or returns non-finite coordinates.
pub fn tsne(x: ArrayView2<'_, f64>, params: &TsneParams) -> Result<Array2<f64>> {
    let (n, d) = x.dim();
    if d < 2 {
        return Err(AnalysisError::InvalidInput(format!(
            "t-SNE to 2 dimensions needs at least 2 features, got {d}"
        )));
    }
    if !(params.perplexity > 0.0 && (n as f64 - 1.0) >= 3.0 * params.perplexity) {
        return Err(AnalysisError::InvalidInput(format!(
            "t-SNE: perplexity {} needs at least {} points, got {n}",
            params.perplexity,
            (3.0 * params.perplexity).ceil() as usize + 1
        )));
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(AnalysisError::InvalidInput(
            "t-SNE: the codes hold NaN or infinite values".into(),
        ));
    }
    let data = x.as_standard_layout().to_owned();
    let rng = rand_chacha::ChaCha8Rng::seed_from_u64(params.seed);
    let p = *params;
    // The library asserts on some inputs; a failure there is an error of this call, not a crash.
    let out = std::panic::catch_unwind(move || {
        linfa_tsne::TSneParams::embedding_size_with_rng(2, rng)
            .perplexity(p.perplexity)
            .approx_threshold(p.theta)
            .max_iter(p.max_iter)
            .transform(data)
    })
    .map_err(|_| AnalysisError::Numerical("t-SNE failed inside linfa-tsne".into()))?
    .map_err(|e| AnalysisError::Numerical(format!("t-SNE: {e}")))?;
    if out.dim() != (n, 2) || out.iter().any(|v| !v.is_finite()) {
        return Err(AnalysisError::Numerical(
            "t-SNE returned non-finite coordinates".into(),
        ));
    }
    Ok(out)
}

/// Squared Euclidean distances between all rows.
fn sq_distances(x: ArrayView2<'_, f64>) -> Array2<f64> {
    let n = x.nrows();
    let mut d = Array2::zeros((n, n));
    for i in 0..n {
        for j in (i + 1)..n {
            let s: f64 = x
                .row(i)
                .iter()
                .zip(x.row(j))
                .map(|(a, b)| (a - b) * (a - b))
                .sum();
            d[[i, j]] = s;
            d[[j, i]] = s;
        }
    }
    d
}

/// Every other point ordered by distance from `i` (ties by index, a stable sort as numpy's
/// `argsort(kind="stable")` would give after removing `i` itself).
fn neighbours(d: &Array2<f64>, i: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..d.nrows()).filter(|&j| j != i).collect();
    order.sort_by(|&a, &b| d[[i, a]].total_cmp(&d[[i, b]]).then(a.cmp(&b)));
    order
}

/// The trustworthiness `T(k)` of the embedding `emb` of the points `x` (module docs;
/// scikit-learn's `trustworthiness` with the Euclidean metric).
///
/// # Shapes
/// `x [N, D]`, `emb [N, E]`, `k < N / 2`.
///
/// # Errors
/// [`AnalysisError::Shape`] if the row counts differ; [`AnalysisError::InvalidInput`] for `k = 0`
/// or `k >= N / 2`.
pub fn trustworthiness(x: ArrayView2<'_, f64>, emb: ArrayView2<'_, f64>, k: usize) -> Result<f64> {
    let n = x.nrows();
    if emb.nrows() != n {
        return Err(AnalysisError::Shape(format!(
            "trustworthiness: {n} points and {} embedded",
            emb.nrows()
        )));
    }
    if k == 0 || 2 * k >= n {
        return Err(AnalysisError::InvalidInput(format!(
            "trustworthiness needs 0 < k < N / 2, got k {k} for N {n}"
        )));
    }
    let (dx, de) = (sq_distances(x), sq_distances(emb));
    let mut penalty = 0f64;
    for i in 0..n {
        let input = neighbours(&dx, i);
        let mut rank = vec![0usize; n];
        for (r, &j) in input.iter().enumerate() {
            rank[j] = r + 1;
        }
        for &j in neighbours(&de, i).iter().take(k) {
            if rank[j] > k {
                penalty += (rank[j] - k) as f64;
            }
        }
    }
    let (n, k) = (n as f64, k as f64);
    Ok(1.0 - penalty * 2.0 / (n * k * (2.0 * n - 3.0 * k - 1.0)))
}
