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

use hyperlens_kernels::Isa;
use linfa::traits::Transformer;
use ndarray::{Array2, ArrayView2, Axis};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
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

impl TsneParams {
    /// The one deterministic setting of hyperlens's code embeddings (`analyze --tsne`, the logic
    /// `analyze` and the report's projections, Python's `viz` t-SNE figures): exact gradients
    /// (`theta` 0, the only t-SNE that gives the same embedding on every run, since bhtsne draws
    /// its Barnes-Hut tree with an unseeded generator), `seed`, 1000 iterations, and perplexity 30
    /// (scikit-learn's default), or for fewer than 91 points the largest whole perplexity that
    /// `n_points` admits, `(n_points - 1) / 3`.
    pub fn deterministic(seed: u64, n_points: usize) -> Self {
        TsneParams {
            seed,
            perplexity: TsneParams::default()
                .perplexity
                .min(((n_points.max(4) - 1) / 3) as f64),
            theta: 0.0,
            ..TsneParams::default()
        }
    }
}

/// A t-SNE embedding of a code set's all-layer codes.
#[derive(Debug, Clone, PartialEq)]
pub struct CodeEmbedding {
    /// The embedding `[n, 2]` of the first `n` problems.
    pub embedding: Array2<f64>,
    /// Their labels `[n]`.
    pub label: ndarray::Array1<i64>,
    /// Trustworthiness (k = 5) of the embedding.
    pub trustworthiness: f64,
}

impl CodeEmbedding {
    /// The embedding of the all-layer codes of the first `min(N, max_points)` problems of `set`
    /// ([`TsneParams::deterministic`] with `seed`), with their labels and its trustworthiness
    /// (k = 5).
    ///
    /// # Shapes
    /// Codes `[N, L, H, Q, K]` -> features `[n, L * H * Q * K]` -> embedding `[n, 2]`.
    ///
    /// # Errors
    /// As [`tsne`] and [`trustworthiness`] (too few problems, fewer than 2 features).
    pub fn of_codes(set: &crate::CodeSet, max_points: usize, seed: u64) -> Result<Self> {
        let codes = set.codes();
        let n = codes.dim().0.min(max_points);
        let width = codes.len() / codes.dim().0.max(1);
        let x = codes
            .slice(ndarray::s![..n, .., .., .., ..])
            .mapv(f64::from)
            .into_shape_with_order((n, width))
            .map_err(|e| AnalysisError::Shape(format!("t-SNE features: {e}")))?;
        let embedding = tsne(x.view(), &TsneParams::deterministic(seed, n))?;
        let trustworthiness = trustworthiness(x.view(), embedding.view(), 5)?;
        Ok(Self {
            embedding,
            label: set.label().slice(ndarray::s![..n]).to_owned(),
            trustworthiness,
        })
    }

    /// The number of embedded problems.
    pub fn n(&self) -> usize {
        self.embedding.nrows()
    }

    /// Writes `tsne.npz` (`hyperlens_io::keys::tsne`: `tsne_all`, `label`).
    ///
    /// # Errors
    /// [`AnalysisError::File`] naming the file.
    pub fn write_npz(&self, path: &std::path::Path) -> Result<()> {
        use hyperlens_io::keys::tsne as keys;
        hyperlens_io::write_npz::<hyperlens_io::IoError, _>(path, |z| {
            z.add(keys::TSNE_ALL, &self.embedding)?;
            z.add(keys::LABEL, &self.label)
        })?;
        Ok(())
    }
}

/// A two-dimensional t-SNE embedding of the rows of `x` (module docs).
///
/// With `theta > 0` this is linfa-tsne's Barnes-Hut t-SNE. The seed fixes the initial embedding,
/// but not the result: bhtsne 0.4.1 builds its nearest-neighbour tree from vantage points drawn
/// with `rand::thread_rng`, and the different summation orders that follow move the embedding from
/// run to run (its trustworthiness stays within about 0.01).
///
/// With `theta = 0` it is hyperlens's own exact t-SNE (`exact_tsne` in this module): the same
/// algorithm and schedule as bhtsne's exact mode, several times faster, and the same embedding for
/// a seed on any number of threads.
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
    if !(params.perplexity.is_finite() && params.perplexity > 0.0) {
        return Err(AnalysisError::InvalidInput(format!(
            "t-SNE: perplexity must be a positive number, got {}",
            params.perplexity
        )));
    }
    if 3.0 * params.perplexity > n as f64 - 1.0 {
        return Err(AnalysisError::InvalidInput(format!(
            "t-SNE: perplexity {} is too large for {n} points: it must be at most (N - 1) / 3 = {:.3}",
            params.perplexity,
            (n as f64 - 1.0).max(0.0) / 3.0
        )));
    }
    if !(params.theta.is_finite() && params.theta >= 0.0) {
        return Err(AnalysisError::InvalidInput(format!(
            "t-SNE: theta must be a number at least 0, got {}",
            params.theta
        )));
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(AnalysisError::InvalidInput(
            "t-SNE: the codes hold NaN or infinite values".into(),
        ));
    }
    if params.theta == 0.0 {
        return exact_tsne(x, params);
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

/// Exact t-SNE (van der Maaten & Hinton 2008) with bhtsne's schedule and constants: the input is
/// centred and divided by its largest absolute value; each point's Gaussian bandwidth is found by
/// bisection to the target perplexity (tolerance 1e-5 on the entropy, at most 200 steps); the
/// conditional affinities are symmetrised and normalised to sum 1; gradient descent runs
/// `max_iter` steps with learning rate 200, momentum 0.5 then 0.8 and the affinities multiplied by
/// 12 (early exaggeration) until step `min(max_iter / 2, 250)`, per-coordinate gains (+0.2 when the
/// gradient's sign flips, x0.8 otherwise, at least 0.01), and the embedding re-centred after
/// every step. The initial embedding is drawn from N(0, 1e-4^2) with ChaCha8 and `seed`.
///
/// Each step is one pass over the pairs, split over rayon's threads by rows: a row's attractive
/// and repulsive sums run over the points in order and the normaliser `Z` sums the rows in order,
/// so the embedding does not depend on the number of threads.
///
/// # Shapes
/// `x [N, D]` -> `[N, 2]`.
///
/// # Errors
/// [`AnalysisError::Numerical`] if the embedding becomes non-finite. The callers check the input
/// ([`tsne`]).
fn exact_tsne(x: ArrayView2<'_, f64>, params: &TsneParams) -> Result<Array2<f64>> {
    let n = x.nrows();
    // centred, divided by the largest absolute value (bhtsne)
    let mut data = x.as_standard_layout().to_owned();
    if let Some(mean) = data.mean_axis(Axis(0)) {
        data -= &mean;
    }
    let max_abs = data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if max_abs > 0.0 {
        data /= max_abs;
    }
    let p = joint_affinities(data.view(), params.perplexity);

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(params.seed);
    let normal = rand_distr::Normal::new(0.0, 1e-4).expect("a valid normal distribution");
    let mut ys: Vec<[f64; 2]> = (0..n)
        .map(|_| [rng.sample(normal), rng.sample(normal)])
        .collect();
    let mut update = vec![[0.0f64; 2]; n];
    let mut gains = vec![[1.0f64; 2]; n];
    let stop_lying = (params.max_iter / 2).min(250);
    let isa = Isa::detected();
    let mut exaggeration = 12.0;
    let mut momentum = 0.5;
    for iter in 0..params.max_iter {
        let grad = exact_gradient(&p, &ys, exaggeration, isa);
        for i in 0..n {
            for c in 0..2 {
                let g = grad[i][c];
                gains[i][c] = if g.signum() != update[i][c].signum() {
                    gains[i][c] + 0.2
                } else {
                    gains[i][c] * 0.8
                }
                .max(0.01);
                update[i][c] = momentum * update[i][c] - 200.0 * gains[i][c] * g;
                ys[i][c] += update[i][c];
            }
        }
        let mean = ys
            .iter()
            .fold([0.0, 0.0], |m, y| [m[0] + y[0], m[1] + y[1]]);
        let mean = [mean[0] / n as f64, mean[1] / n as f64];
        for y in ys.iter_mut() {
            y[0] -= mean[0];
            y[1] -= mean[1];
        }
        if iter == stop_lying {
            exaggeration = 1.0;
            momentum = 0.8;
        }
    }
    let out = Array2::from_shape_fn((n, 2), |(i, c)| ys[i][c]);
    if out.iter().any(|v| !v.is_finite()) {
        return Err(AnalysisError::Numerical(
            "t-SNE returned non-finite coordinates".into(),
        ));
    }
    Ok(out)
}

/// The symmetrised joint affinities `P` of exact t-SNE, `[N, N]` row-major with a zero diagonal,
/// summing to 1 ([`exact_tsne`]).
fn joint_affinities(x: ArrayView2<'_, f64>, perplexity: f64) -> Vec<f64> {
    let n = x.nrows();
    let d2 = sq_distances(x);
    let target = perplexity.ln();
    let mut p = vec![0.0; n * n];
    p.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let dist = d2.row(i);
        let (mut beta, mut lo, mut hi) = (1.0f64, f64::NEG_INFINITY, f64::INFINITY);
        for _ in 0..200 {
            let mut sum = 0.0;
            let mut weighted = 0.0;
            for (j, (pj, &dj)) in row.iter_mut().zip(dist.iter()).enumerate() {
                *pj = if j == i { 0.0 } else { (-beta * dj).exp() };
                sum += *pj;
                weighted += dj * *pj;
            }
            let sum = sum.max(f64::MIN_POSITIVE);
            // entropy of the row: beta * E[d^2] + ln(sum)
            let h = beta * weighted / sum + sum.ln();
            let diff = h - target;
            if diff.abs() < 1e-5 {
                break;
            }
            if diff > 0.0 {
                lo = beta;
                beta = if hi.is_finite() {
                    (beta + hi) / 2.0
                } else {
                    beta * 2.0
                };
            } else {
                hi = beta;
                beta = if lo.is_finite() {
                    (beta + lo) / 2.0
                } else {
                    beta / 2.0
                };
            }
        }
        let sum: f64 = row.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        row.iter_mut().for_each(|v| *v /= sum);
    });
    // P = (P + P^T) / sum
    for i in 0..n {
        for j in (i + 1)..n {
            let s = p[i * n + j] + p[j * n + i];
            p[i * n + j] = s;
            p[j * n + i] = s;
        }
    }
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|v| *v /= total);
    p
}

/// The exact t-SNE gradient `4 sum_j (e p_ij - q_ij) (1 + |y_i - y_j|^2)^-1 (y_i - y_j)` with
/// exaggeration `e`, in one pass: per row the attractive sum `sum_j p_ij w_ij (y_i - y_j)` and
/// the repulsive sum `sum_j w_ij^2 (y_i - y_j)` with `w_ij = (1 + |y_i - y_j|^2)^-1`, and
/// `Z = sum_{i != j} w_ij`, so that `q_ij = w_ij / Z`.
///
/// The rows are `hyperlens_kernels`'s [`Isa::tsne_gradient_row`] (portable, AVX2 or AVX-512F,
/// with the same bits on each).
fn exact_gradient(p: &[f64], ys: &[[f64; 2]], exaggeration: f64, isa: Isa) -> Vec<[f64; 2]> {
    let n = ys.len();
    let xs: Vec<f64> = ys.iter().map(|y| y[0]).collect();
    let zs: Vec<f64> = ys.iter().map(|y| y[1]).collect();
    // per row: attractive (2), repulsive (2), sum of w without the diagonal
    let rows: Vec<[f64; 5]> = (0..n)
        .into_par_iter()
        .map(|i| isa.tsne_gradient_row(xs[i], zs[i], &xs, &zs, &p[i * n..(i + 1) * n]))
        .collect();
    let z: f64 = rows.iter().map(|r| r[4]).sum();
    rows.iter()
        .map(|r| {
            [
                4.0 * (exaggeration * r[0] - r[2] / z),
                4.0 * (exaggeration * r[1] - r[3] / z),
            ]
        })
        .collect()
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
