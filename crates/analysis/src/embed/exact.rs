//! hyperlens's exact t-SNE: O(N^2) per step, bhtsne's exact mode (the small-N form of
//! [`super::tsne`]).

use hyperlens_kernels::Isa;
use ndarray::{Array2, ArrayView2, Axis};
use rayon::prelude::*;

use super::affinity::bisect_precision;
use super::trust::sq_distances;
use super::TsneParams;
use crate::error::{AnalysisError, Result};

/// Exact t-SNE (van der Maaten & Hinton 2008) with bhtsne's schedule and constants, except the
/// learning rate: the input is centred and divided by its largest absolute value; each point's
/// Gaussian bandwidth is found by bisection to the target perplexity (tolerance 1e-5 on the
/// entropy, at most 200 steps); the conditional affinities are symmetrised and normalised to sum 1;
/// gradient descent runs `max_iter` steps with momentum 0.5 then 0.8 and the affinities multiplied
/// by 12 (early exaggeration) until step `min(max_iter / 2, 250)`, per-coordinate gains (+0.2 when
/// the gradient's sign flips, x0.8 otherwise, at least 0.01), and the embedding re-centred after
/// every step. The initial embedding is drawn from N(0, 1e-4^2) with ChaCha8 and `seed`.
///
/// The learning rate is `N / e` on openTSNE's scale of the gradient (Belkina et al. 2019;
/// openTSNE's `learning_rate="auto"`, the rule of [`super::tsne_interpolated`]), which is
/// `N / (4 e)` on this gradient's scale (t-SNE's factor 4, as bhtsne and scikit-learn): `N / 48`
/// while exaggerated, `N / 4` after. With bhtsne's constant 200 the embeddings of a thousand codes
/// were less trustworthy than scikit-learn's exact t-SNE's (0.701 against 0.740 on the wide
/// fixture codes; now 0.738, test `the_exact_form_is_as_trustworthy_as_scikit_learns_exact_tsne`).
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
pub(super) fn exact_tsne(x: ArrayView2<'_, f64>, params: &TsneParams) -> Result<Array2<f64>> {
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

    let mut ys = super::initial_embedding(n, params.seed);
    let mut update = vec![[0.0f64; 2]; n];
    let mut gains = vec![[1.0f64; 2]; n];
    let stop_lying = (params.max_iter / 2).min(250);
    let isa = Isa::detected();
    let mut exaggeration = 12.0;
    let mut momentum = 0.5;
    let mut learning_rate = n as f64 / (4.0 * exaggeration);
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
                update[i][c] = momentum * update[i][c] - learning_rate * gains[i][c] * g;
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
            learning_rate = n as f64 / 4.0;
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
pub(super) fn joint_affinities(x: ArrayView2<'_, f64>, perplexity: f64) -> Vec<f64> {
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
            (beta, lo, hi) = bisect_precision(diff, beta, lo, hi);
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
pub(super) fn exact_gradient(
    p: &[f64],
    ys: &[[f64; 2]],
    exaggeration: f64,
    isa: Isa,
) -> Vec<[f64; 2]> {
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
