//! The trustworthiness of an embedding (Venna and Kaski 2001; the formula in [`super`]'s docs).

use ndarray::{Array2, ArrayView2};

use crate::error::{AnalysisError, Result};

/// Squared Euclidean distances between all rows.
pub(super) fn sq_distances(x: ArrayView2<'_, f64>) -> Array2<f64> {
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
