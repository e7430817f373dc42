//! hyperlens's large-N t-SNE: sparse affinities over exact nearest neighbours, attractive forces
//! over them, repulsive forces by FFT-accelerated interpolation, and openTSNE's optimiser
//! (the large-N form of [`super::tsne`]).

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use super::affinity::{joint_affinities_nn, SparseP};
use super::interp::Interpolation;
use super::knn::nearest_neighbours;
use super::TsneParams;
use crate::error::{AnalysisError, Result};

/// Early-exaggeration factor (openTSNE's `early_exaggeration="auto"` for exaggeration 1).
const EXAGGERATION: f64 = 12.0;
/// Early-exaggeration steps at most (openTSNE's `early_exaggeration_iter`).
const EXAGGERATION_STEPS: usize = 250;
/// Momentum in both phases (openTSNE 1.0's `initial_momentum` and `final_momentum`).
const MOMENTUM: f64 = 0.8;
/// Least gain (openTSNE's `min_gain`).
const MIN_GAIN: f64 = 0.01;
/// Longest step of one point (openTSNE's `max_step_norm`).
const MAX_STEP: f64 = 5.0;

/// A two-dimensional t-SNE embedding of the rows of `x` for large `N`: FIt-SNE's interpolated
/// gradient (Linderman et al. 2019) with openTSNE 1.0's defaults, deterministic.
///
/// - Affinities: the `k = min(N - 1, floor(3 perplexity))` exact nearest neighbours of each point
///   (float32 GEMM candidates, float64 distances), Gaussian conditional affinities calibrated to
///   the perplexity, symmetrised and normalised to sum 1 (openTSNE's `PerplexityBasedNN`, which
///   finds its neighbours approximately with Annoy for large `N`).
/// - Gradient (openTSNE's scale, without t-SNE's factor 4):
///   `g_i = e sum_j p_ij w_ij (y_i - y_j) - F_i / Z`, `w_ij = (1 + |y_i - y_j|²)^-1`, the
///   repulsion `F_i` and the normaliser `Z` by polynomial interpolation on a grid and FFT
///   convolution (3 nodes per box, at least 50 boxes per axis, boxes at most 1 unit wide).
/// - Schedule: `min(250, max_iter / 2)` steps with the affinities exaggerated `e = 12` and
///   learning rate `N / 12`, then the remaining steps of `max_iter` with `e = 1` and learning rate
///   `N` (openTSNE's `learning_rate="auto"`); momentum 0.8 throughout (openTSNE 1.0's default;
///   openTSNE 0.x and bhtsne start at 0.5); per-coordinate gains `+0.2` when the gradient's sign
///   differs from the last step's, `x0.8 + 0.01` otherwise; each point's step clipped to length
///   5 (`max_step_norm`); the embedding re-centred after every step. openTSNE's defaults of
///   250 + 500 steps are `max_iter = 750`.
/// - Initial embedding: N(0, 1e-4²) drawn with ChaCha8 and `seed`, as the exact form's (openTSNE
///   defaults to a rescaled PCA).
///
/// Every sum runs in a fixed order (the modules `knn`, `affinity`, `interp`), so a seed gives the
/// same embedding, bit for bit, on any number of threads.
///
/// # Shapes
/// `x [N, D]` with `D >= 2` -> `[N, 2]`.
///
/// # Errors
/// As [`super::tsne`]: [`AnalysisError::InvalidInput`] for non-finite values, fewer than 2
/// features, or a perplexity that is not positive or not below `(N - 1) / 3`;
/// [`AnalysisError::Numerical`] if the embedding becomes non-finite.
pub fn tsne_interpolated(x: ArrayView2<'_, f64>, params: &TsneParams) -> Result<Array2<f64>> {
    super::check(x, params)?;
    let n = x.nrows();
    let k = ((3.0 * params.perplexity) as usize).clamp(1, n - 1);
    let p = joint_affinities_nn(&nearest_neighbours(x, k), params.perplexity);

    let mut ys = super::initial_embedding(n, params.seed);
    let mut update = vec![[0.0f64; 2]; n];
    let mut gains = vec![[1.0f64; 2]; n];
    let mut interp = Interpolation::new();
    let exaggerated = EXAGGERATION_STEPS.min(params.max_iter / 2);
    for step in 0..params.max_iter {
        let e = if step < exaggerated {
            EXAGGERATION
        } else {
            1.0
        };
        let rate = n as f64 / e;
        let grad = gradient(&p, &ys, e, &mut interp);
        ys.par_iter_mut()
            .zip(update.par_iter_mut())
            .zip(gains.par_iter_mut())
            .zip(grad.par_iter())
            .for_each(|(((y, u), g), d)| {
                for c in 0..2 {
                    g[c] = if sign(d[c]) != sign(u[c]) {
                        g[c] + 0.2
                    } else {
                        g[c] * 0.8 + MIN_GAIN
                    };
                    u[c] = MOMENTUM * u[c] - rate * g[c] * d[c];
                }
                let norm = u[0].hypot(u[1]);
                if norm > MAX_STEP {
                    u[0] = u[0] / norm * MAX_STEP;
                    u[1] = u[1] / norm * MAX_STEP;
                }
                y[0] += u[0];
                y[1] += u[1];
            });
        let sum = ys
            .iter()
            .fold([0.0, 0.0], |m, y| [m[0] + y[0], m[1] + y[1]]);
        let mean = [sum[0] / n as f64, sum[1] / n as f64];
        ys.par_iter_mut().for_each(|y| {
            y[0] -= mean[0];
            y[1] -= mean[1];
        });
        if !mean[0].is_finite() || !mean[1].is_finite() {
            return Err(AnalysisError::Numerical(format!(
                "t-SNE: the embedding became non-finite at step {step}"
            )));
        }
    }
    Ok(Array2::from_shape_fn((n, 2), |(i, c)| ys[i][c]))
}

/// numpy's `sign`: -1, 0 or 1.
fn sign(v: f64) -> f64 {
    if v > 0.0 {
        1.0
    } else if v < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// The gradient `g_i = e sum_j p_ij w_ij (y_i - y_j) - F_i / Z` ([`tsne_interpolated`]): the
/// attractive sums over each row of `p` in order, the repulsion interpolated.
///
/// # Shapes
/// `p` `N x N`, `ys [N]` -> `[N]`.
fn gradient(p: &SparseP, ys: &[[f64; 2]], e: f64, interp: &mut Interpolation) -> Vec<[f64; 2]> {
    let rep = interp.repulsion(ys);
    (0..ys.len())
        .into_par_iter()
        .map(|i| {
            let (cols, vals) = p.row(i);
            let yi = ys[i];
            let mut attr = [0.0f64; 2];
            for (&j, &pij) in cols.iter().zip(vals) {
                let d = [yi[0] - ys[j][0], yi[1] - ys[j][1]];
                let w = pij / (1.0 + d[0] * d[0] + d[1] * d[1]);
                attr[0] += w * d[0];
                attr[1] += w * d[1];
            }
            [
                e * attr[0] - rep.force[i][0] / rep.z,
                e * attr[1] - rep.force[i][1] / rep.z,
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyperlens_kernels::Isa;
    use rand::{Rng, SeedableRng};

    /// The interpolated gradient against the exact form's gradient (`exact_gradient`, which
    /// carries t-SNE's factor 4) on the same affinities, made dense.
    #[test]
    fn interpolated_gradient_is_close_to_the_exact_gradient() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let n = 500;
        let x = Array2::from_shape_fn((n, 5), |(i, _)| (i % 4) as f64 * 3.0 + rng.gen::<f64>());
        let k = 30;
        let p = joint_affinities_nn(&nearest_neighbours(x.view(), k), 10.0);
        let mut dense = vec![0.0; n * n];
        for i in 0..n {
            let (c, v) = p.row(i);
            for (&j, &pij) in c.iter().zip(v) {
                dense[i * n + j] = pij;
            }
        }
        // an embedding of the size t-SNE reaches: four groups over a span of about 30
        let ys: Vec<[f64; 2]> = (0..n)
            .map(|i| {
                let g = (i % 4) as f64;
                [
                    g * 8.0 - 12.0 + rng.gen_range(-3.0..3.0),
                    g * g - 4.0 + rng.gen_range(-3.0..3.0),
                ]
            })
            .collect();
        for e in [1.0, 12.0] {
            let got = gradient(&p, &ys, e, &mut Interpolation::new());
            let want = crate::embed::exact::exact_gradient(&dense, &ys, e, Isa::detected());
            let scale = want
                .iter()
                .map(|g| g[0].hypot(g[1]) / 4.0)
                .fold(0.0, f64::max);
            let mut worst = 0.0f64;
            for (a, b) in got.iter().zip(&want) {
                let err = (a[0] - b[0] / 4.0).hypot(a[1] - b[1] / 4.0);
                worst = worst.max(err / scale);
            }
            // FIt-SNE's accuracy on a grid of boxes about 0.7 units wide (interp's tests)
            assert!(
                worst < 1e-2,
                "gradient error {worst} of the largest (e {e})"
            );
        }
    }
}
