//! Greedy k-means++ seeding (Arthur & Vassilvitskii 2007, with the local trials of
//! scikit-learn's `_kmeans_plusplus`), which linfa-clustering lacks: its k-means++ draws one
//! candidate per centre, and on attention codes its best of 10 restarts stayed at a higher
//! inertia than scikit-learn's (all-layer softmax codes: 0.928 against 0.904 per point).
//!
//! The first centre is a uniformly drawn point. Each further centre draws `2 + floor(ln k)`
//! candidates with probability proportional to their squared distance to the closest centre so
//! far, and keeps the candidate that leaves the smallest total squared distance (the potential).

use ndarray::Array2;
use rand::Rng;

use hyperlens_kernels::{Isa, DISTANCE_ROWS as ROWS};

/// The data in the two layouts the distance kernel reads.
pub(crate) struct Points<'a> {
    /// `[N, D]` row-major.
    pub rows: &'a [f64],
    /// `[D, N]` row-major (the transpose).
    pub columns: &'a [f64],
    pub n: usize,
    pub d: usize,
}

/// `k` initial centres drawn by greedy k-means++ (module docs).
///
/// # Shapes
/// Returns `[k, D]`; `1 <= k <= N`.
pub(crate) fn greedy_kmeans_plusplus<R: Rng>(
    points: &Points<'_>,
    k: usize,
    kernels: Isa,
    rng: &mut R,
) -> Array2<f64> {
    let (n, d) = (points.n, points.d);
    let row = |i: usize| &points.rows[i * d..(i + 1) * d];
    let trials = 2 + (k as f64).ln().floor() as usize;
    let mut centres = Array2::<f64>::zeros((k, d));
    let mut candidates = vec![0.0; ROWS * d];
    let mut dist = vec![0.0; ROWS * n];

    let first = rng.gen_range(0..n);
    centres.row_mut(0).assign(&ndarray::aview1(row(first)));
    for r in 0..ROWS {
        candidates[r * d..(r + 1) * d].copy_from_slice(row(first));
    }
    kernels.squared_distances(&candidates, points.columns, &mut dist);
    let mut closest: Vec<f64> = dist[..n].to_vec();
    let mut potential: f64 = closest.iter().sum();

    let mut cumulative = vec![0.0; n];
    let mut ids = vec![0usize; trials];
    let mut pots = vec![0.0; trials];
    for c in 1..k {
        let mut acc = 0.0;
        for (s, &v) in cumulative.iter_mut().zip(&closest) {
            acc += v;
            *s = acc;
        }
        for id in ids.iter_mut() {
            let target = rng.gen::<f64>() * potential;
            // the first point whose cumulative potential reaches the target (numpy's searchsorted)
            *id = cumulative.partition_point(|&s| s < target).min(n - 1);
        }
        // potentials after adding each candidate, ROWS candidates per pass over the data
        for (group, group_ids) in ids.chunks(ROWS).enumerate() {
            for r in 0..ROWS {
                let i = group_ids[r.min(group_ids.len() - 1)];
                candidates[r * d..(r + 1) * d].copy_from_slice(row(i));
            }
            kernels.squared_distances(&candidates, points.columns, &mut dist);
            for r in 0..group_ids.len() {
                pots[group * ROWS + r] = dist[r * n..(r + 1) * n]
                    .iter()
                    .zip(&closest)
                    .map(|(&a, &b)| a.min(b))
                    .sum();
            }
        }
        // the first candidate of least potential (numpy's argmin)
        let mut best = 0;
        for t in 1..trials {
            if pots[t] < pots[best] {
                best = t;
            }
        }
        let chosen = ids[best];
        centres.row_mut(c).assign(&ndarray::aview1(row(chosen)));
        // distances to the chosen candidate: recompute its row (it may not be in the last group)
        for r in 0..ROWS {
            candidates[r * d..(r + 1) * d].copy_from_slice(row(chosen));
        }
        kernels.squared_distances(&candidates, points.columns, &mut dist);
        for (m, &v) in closest.iter_mut().zip(&dist[..n]) {
            *m = m.min(v);
        }
        potential = pots[best];
    }
    centres
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// Twelve tight blobs far apart: sampling by squared distance puts one seed in each blob
    /// (uniform sampling would almost surely put two in one), and with 3 local trials per centre
    /// this holds for every seed tried.
    #[test]
    fn one_seed_per_well_separated_blob() {
        let (k, per, d) = (12, 40, 3);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut rows = Vec::new();
        for c in 0..k {
            for _ in 0..per {
                for j in 0..d {
                    let centre = if j == c % d {
                        100.0 * c as f64
                    } else {
                        -50.0 * c as f64
                    };
                    rows.push(centre + rng.gen_range(-1.0..1.0));
                }
            }
        }
        let n = k * per;
        let mut columns = vec![0.0; d * n];
        for i in 0..n {
            for j in 0..d {
                columns[j * n + i] = rows[i * d + j];
            }
        }
        let points = Points {
            rows: &rows,
            columns: &columns,
            n,
            d,
        };
        for seed in 0..20 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let centres = greedy_kmeans_plusplus(&points, k, Isa::detected(), &mut rng);
            let mut blobs: Vec<usize> = centres
                .rows()
                .into_iter()
                .map(|c| {
                    // the blob whose first point is closest
                    (0..k)
                        .min_by(|&a, &b| {
                            let dist = |blob: usize| {
                                let p = &rows[blob * per * d..blob * per * d + d];
                                c.iter().zip(p).map(|(x, y)| (x - y) * (x - y)).sum::<f64>()
                            };
                            dist(a).total_cmp(&dist(b))
                        })
                        .unwrap()
                })
                .collect();
            blobs.sort_unstable();
            assert_eq!(blobs, (0..k).collect::<Vec<_>>(), "seed {seed}");
        }
    }
}
