//! The sparse input affinities `P` of the large-N t-SNE ([`super::interpolated`]), openTSNE's
//! `PerplexityBasedNN` (`openTSNE.affinity.joint_probabilities_nn`):
//!
//! - each point's conditional affinities over its `k` nearest neighbours,
//!   `p_{j|i} ∝ exp(-beta_i d²_ij)`, with the precision `beta_i` found by bisection so that the
//!   entropy (in nats) is `ln(perplexity)` within 1e-8, at most 200 steps (openTSNE's
//!   `compute_gaussian_perplexity`); the exponent is shifted by the nearest neighbour's distance,
//!   which cancels in the normalisation and keeps far neighbours from underflowing to 0;
//! - symmetrised, `p_ij = p_{j|i} + p_{i|j}` on the union of the neighbour graphs, and normalised to
//!   sum 1.
//!
//! Rows run on rayon's threads; every row's sums run over its entries in order, and the total is
//! summed row by row in order, so `P` does not depend on the number of threads.

use rayon::prelude::*;

use super::knn::Neighbours;

/// A symmetric sparse matrix in compressed rows (columns ascending in each row).
#[derive(Debug, Clone)]
pub(crate) struct SparseP {
    /// `[N + 1]`: row `i` holds the entries `indptr[i]..indptr[i + 1]`.
    pub indptr: Vec<usize>,
    /// Column of each entry.
    pub indices: Vec<usize>,
    /// Value of each entry.
    pub values: Vec<f64>,
}

impl SparseP {
    /// Row `i`: its columns and values.
    pub fn row(&self, i: usize) -> (&[usize], &[f64]) {
        let r = self.indptr[i]..self.indptr[i + 1];
        (&self.indices[r.clone()], &self.values[r])
    }
}

/// The joint affinities of the points whose neighbours are `nb` (module docs).
///
/// # Shapes
/// `nb`: `N` points with `k >= 1` neighbours each; `perplexity > 0`.
pub(crate) fn joint_affinities_nn(nb: &Neighbours, perplexity: f64) -> SparseP {
    let k = nb.k;
    let n = nb.index.len() / k;
    let mut cond = vec![0.0f64; n * k];
    cond.par_chunks_mut(k)
        .zip(nb.dist2.par_chunks(k))
        .for_each(|(row, d2)| conditional_row(d2, perplexity.ln(), row));

    // P + P^T: row i holds its own k entries and one for every j that has i among its neighbours
    let mut count = vec![k; n];
    for &j in &nb.index {
        count[j] += 1;
    }
    let mut start = vec![0usize; n + 1];
    for i in 0..n {
        start[i + 1] = start[i] + count[i];
    }
    let mut fill = start[..n].to_vec();
    let mut entries = vec![(0usize, 0.0f64); start[n]];
    for (i, (cols, vals)) in nb.index.chunks(k).zip(cond.chunks(k)).enumerate() {
        for (&j, &v) in cols.iter().zip(vals) {
            entries[fill[i]] = (j, v);
            fill[i] += 1;
            entries[fill[j]] = (i, v);
            fill[j] += 1;
        }
    }
    // per row: sort by column, merge the pairs (a + b is the same for either order)
    let rows: Vec<Vec<(usize, f64)>> = (0..n)
        .into_par_iter()
        .map(|i| {
            let mut row = entries[start[i]..start[i + 1]].to_vec();
            row.sort_by_key(|e| e.0);
            let mut merged: Vec<(usize, f64)> = Vec::with_capacity(row.len());
            for (j, v) in row {
                match merged.last_mut() {
                    Some(last) if last.0 == j => last.1 += v,
                    _ => merged.push((j, v)),
                }
            }
            merged
        })
        .collect();
    let total: f64 = rows
        .iter()
        .map(|r| r.iter().map(|e| e.1).sum::<f64>())
        .sum();
    let mut indptr = Vec::with_capacity(n + 1);
    indptr.push(0);
    let mut indices = Vec::new();
    let mut values = Vec::new();
    for row in rows {
        for (j, v) in row {
            indices.push(j);
            values.push(v / total);
        }
        indptr.push(indices.len());
    }
    SparseP {
        indptr,
        indices,
        values,
    }
}

/// One point's conditional affinities `p_{j|i}` over its neighbours' squared distances `d2`
/// (ascending), at entropy `target` nats (module docs), written to `out`.
/// One step of the bisection on a row's Gaussian precision `beta` (bhtsne's and openTSNE's rule):
/// the row's entropy is `diff` above its target, so `beta` must grow (doubling until an upper
/// bound is known, then halving the bracket) or, below the target, shrink. Returns the new
/// `(beta, lo, hi)`; the bracket starts as `(-inf, +inf)`.
pub(super) fn bisect_precision(diff: f64, beta: f64, lo: f64, hi: f64) -> (f64, f64, f64) {
    if diff > 0.0 {
        let next = if hi.is_finite() {
            (beta + hi) / 2.0
        } else {
            beta * 2.0
        };
        (next, beta, hi)
    } else {
        let next = if lo.is_finite() {
            (beta + lo) / 2.0
        } else {
            beta / 2.0
        };
        (next, lo, beta)
    }
}

fn conditional_row(d2: &[f64], target: f64, out: &mut [f64]) {
    let shift = d2.first().copied().unwrap_or(0.0);
    let (mut beta, mut lo, mut hi) = (1.0f64, f64::NEG_INFINITY, f64::INFINITY);
    for _ in 0..200 {
        let mut sum = 0.0;
        let mut weighted = 0.0;
        for (o, &d) in out.iter_mut().zip(d2) {
            let d = d - shift;
            *o = (-beta * d).exp();
            sum += *o;
            weighted += d * *o;
        }
        // entropy of the row: beta * E[d²] + ln(sum)
        let h = beta * weighted / sum + sum.ln();
        let diff = h - target;
        if diff.abs() < 1e-8 {
            break;
        }
        (beta, lo, hi) = bisect_precision(diff, beta, lo, hi);
    }
    let sum: f64 = out.iter().sum();
    out.iter_mut().for_each(|v| *v /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_reach_the_perplexity_and_p_is_symmetric() {
        // 6 points on a line, 3 neighbours each
        let x: Vec<f64> = vec![0.0, 0.5, 1.1, 2.0, 3.2, 3.3];
        let k = 3;
        let mut index = Vec::new();
        let mut dist2 = Vec::new();
        for (i, &xi) in x.iter().enumerate() {
            let mut others: Vec<(f64, usize)> = x
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(j, &xj)| ((xi - xj) * (xi - xj), j))
                .collect();
            others.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for &(d, j) in &others[..k] {
                index.push(j);
                dist2.push(d);
            }
        }
        let nb = Neighbours { k, index, dist2 };
        let perplexity = 2.0;
        let mut row = vec![0.0; k];
        conditional_row(&nb.dist2[..k], f64::ln(perplexity), &mut row);
        let h: f64 = -row.iter().map(|p| p * p.ln()).sum::<f64>();
        assert!(
            (h.exp() - perplexity).abs() < 1e-6,
            "perplexity {}",
            h.exp()
        );

        let p = joint_affinities_nn(&nb, perplexity);
        let total: f64 = p.values.iter().sum();
        assert!((total - 1.0).abs() < 1e-12);
        let get = |i: usize, j: usize| {
            let (c, v) = p.row(i);
            c.iter().position(|&c| c == j).map_or(0.0, |s| v[s])
        };
        for i in 0..x.len() {
            for j in 0..x.len() {
                assert_eq!(get(i, j), get(j, i), "({i}, {j})");
            }
            assert_eq!(get(i, i), 0.0);
        }
    }
}
