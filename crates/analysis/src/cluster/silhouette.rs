//! Silhouette coefficients on blocked float64 GEMM distances (scikit-learn's
//! `silhouette_samples`: `pairwise_distances_chunked` with the Euclidean metric, then
//! `_silhouette_reduce`).
//!
//! The points are centred on their mean (distances do not change; the cancellation in
//! `‖x‖² + ‖y‖² - 2 x·y` shrinks). A block of [`ROWS`] points against all points is one float64
//! GEMM; the squared distances are clipped at 0 and a point's distance to itself is set to 0, as
//! scikit-learn does. For point i, `a` = mean distance to the other members of its cluster,
//! `b` = the smallest mean distance to another (non-empty) cluster, `s = (b - a) / max(a, b)`
//! (0 when both are 0, and 0 for a point alone in its cluster). Each point's per-cluster sums run
//! over the points in order and every block is a fixed range of points, so the coefficients do
//! not depend on the number of threads.

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, ArrayView2, Axis};
use rayon::prelude::*;

/// Points per block of the distance GEMMs.
const ROWS: usize = 64;

/// The silhouette coefficient of every point under each labeling, from one pass over the
/// pairwise distances.
///
/// # Shapes
/// `x`: `[N, D]`, N >= 1, finite; each labeling `[N]` with dense labels `0..C`; returns one
/// `[N]` vector per labeling.
pub(crate) fn silhouette_samples(
    x: ArrayView2<'_, f64>,
    labelings: &[Vec<usize>],
) -> Vec<Vec<f64>> {
    let n = x.nrows();
    let mean = x.mean_axis(Axis(0)).expect("N >= 1");
    let xc = &x - &mean;
    let norms: Vec<f64> = xc.rows().into_iter().map(|r| r.dot(&r)).collect();
    let clusters: Vec<Vec<usize>> = labelings
        .iter()
        .map(|dense| {
            let c = dense.iter().max().map_or(0, |&m| m + 1);
            let mut counts = vec![0usize; c];
            for &l in dense {
                counts[l] += 1;
            }
            counts
        })
        .collect();
    let starts: Vec<usize> = (0..n).step_by(ROWS).collect();
    // per block, the coefficient of each row under each labeling (row-major [rows, labelings])
    let per_block: Vec<Vec<f64>> = starts
        .par_iter()
        .map_init(
            || Array2::<f64>::zeros((ROWS, n)),
            |dist, &i0| {
                let b = ROWS.min(n - i0);
                let mut out = dist.slice_mut(s![..b, ..]);
                general_mat_mul(1.0, &xc.slice(s![i0..i0 + b, ..]), &xc.t(), 0.0, &mut out);
                let mut coefficients = Vec::with_capacity(b * labelings.len());
                for (r, mut row) in out.rows_mut().into_iter().enumerate() {
                    let ni = norms[i0 + r];
                    for (v, &nj) in row.iter_mut().zip(&norms) {
                        *v = (ni + nj - 2.0 * *v).max(0.0).sqrt();
                    }
                    row[i0 + r] = 0.0;
                    for (dense, counts) in labelings.iter().zip(&clusters) {
                        let mut sums = vec![0.0; counts.len()];
                        for (&l, &v) in dense.iter().zip(row.iter()) {
                            sums[l] += v;
                        }
                        let own = dense[i0 + r];
                        if counts[own] < 2 {
                            coefficients.push(0.0);
                            continue;
                        }
                        let a = sums[own] / (counts[own] - 1) as f64;
                        let b = (0..counts.len())
                            .filter(|&k| k != own && counts[k] > 0)
                            .map(|k| sums[k] / counts[k] as f64)
                            .fold(f64::INFINITY, f64::min);
                        let m = a.max(b);
                        coefficients.push(if m > 0.0 { (b - a) / m } else { 0.0 });
                    }
                }
                coefficients
            },
        )
        .collect();
    let mut samples = vec![Vec::with_capacity(n); labelings.len()];
    for row in per_block
        .iter()
        .flat_map(|b| b.chunks_exact(labelings.len()))
    {
        for (s, &v) in samples.iter_mut().zip(row) {
            s.push(v);
        }
    }
    samples
}

/// The mean of the coefficients, summed in point order.
pub(crate) fn mean(samples: &[f64]) -> f64 {
    samples.iter().sum::<f64>() / samples.len() as f64
}
