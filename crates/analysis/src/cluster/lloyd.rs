//! The k-means core: scikit-learn's Lloyd iterations (`sklearn.cluster._kmeans._kmeans_single_lloyd`,
//! scikit-learn 1.9) on blocked float32 GEMM distances, with the centres and the inertia
//! accumulated in float64.
//!
//! - Distances: the codes are centred on their mean (distances do not change; the float32
//!   cancellation in `‖x‖² - 2 x·c + ‖c‖²` shrinks) and rounded to float32 once. A block of
//!   [`CHUNK`] points against all centres is one float32 GEMM (`matrixmultiply` through
//!   `ndarray::linalg::general_mat_mul`); each point joins the centre of least `‖c‖² - 2 x·c`
//!   (ties: the first centre), scikit-learn's assignment rule.
//! - Centres: the data mean plus the float64 mean of the centred float32 points of each cluster,
//!   summed in float64 per block in point order and the blocks in order (the block's float32 rows
//!   are in cache from its GEMM, so a pass reads the codes once). An empty cluster takes the point farthest from
//!   its own centre (scikit-learn's `_relocate_empty_clusters_dense`).
//! - Stopping: when no label changed (strict convergence), or when the summed squared shift of the
//!   centres is at most `tol` (the caller passes scikit-learn's `tol * mean(var(X, axis=0))`), or
//!   after `max_iterations`. Without strict convergence the labels are recomputed from the final
//!   centres, as scikit-learn does.
//! - Inertia: `sum ‖x - c‖²` in float64 by direct differences (scikit-learn's `_inertia_dense`),
//!   divided by N.
//!
//! Blocks run on rayon's threads; every block is a fixed range of points and the partial sums are
//! reduced in block order, so the result does not depend on the number of threads.

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2, Axis};
use rayon::prelude::*;

/// Points per block of the distance GEMMs (scikit-learn's lloyd uses 256 too).
pub(crate) const CHUNK: usize = 256;

/// The codes as k-means reads them: float64 rows for the centres and the inertia, a centred
/// float32 copy and its squared row norms for the distances.
pub(crate) struct Codes32<'a> {
    /// `[N, D]`, standard layout.
    pub x: ArrayView2<'a, f64>,
    /// `x - mean`, rounded to float32. `[N, D]`.
    pub x32: Array2<f32>,
    /// Squared norms of the rows of `x32` (summed in float64). `[N]`.
    pub norms: Vec<f32>,
    /// Column means of `x`. `[D]`.
    pub mean: Array1<f64>,
}

impl<'a> Codes32<'a> {
    /// # Shapes
    /// `x`: `[N, D]` in standard layout, N >= 1, finite (checked by the caller).
    pub fn new(x: ArrayView2<'a, f64>) -> Self {
        debug_assert!(x.is_standard_layout());
        let mean = x.mean_axis(Axis(0)).expect("N >= 1");
        let d = x.ncols();
        let flat = x.as_slice().expect("standard layout");
        let mut x32 = vec![0.0f32; flat.len()];
        let mut norms = vec![0.0f32; x.nrows()];
        x32.par_chunks_mut(CHUNK * d)
            .zip(flat.par_chunks(CHUNK * d))
            .zip(norms.par_chunks_mut(CHUNK))
            .for_each(|((dst, src), norms)| {
                for ((d, s), n) in dst.chunks_exact_mut(d).zip(src.chunks_exact(d)).zip(norms) {
                    let mut sq = 0.0f64;
                    for ((d, &s), &m) in d.iter_mut().zip(s).zip(&mean) {
                        *d = (s - m) as f32;
                        sq += f64::from(*d) * f64::from(*d);
                    }
                    *n = sq as f32;
                }
            });
        let x32 = Array2::from_shape_vec(x.dim(), x32).expect("N x D");
        Codes32 {
            x,
            x32,
            norms,
            mean,
        }
    }

    pub fn n(&self) -> usize {
        self.x.nrows()
    }

    /// Centred float32 copies of `centres [k, D]` and their squared norms.
    pub fn centres32(&self, centres: ArrayView2<'_, f64>) -> (Array2<f32>, Vec<f32>) {
        let mut c32 = Array2::<f32>::zeros(centres.dim());
        let mut norms = Vec::with_capacity(centres.nrows());
        for (mut d, s) in c32.rows_mut().into_iter().zip(centres.rows()) {
            let mut sq = 0.0f64;
            for ((d, &s), &m) in d.iter_mut().zip(s).zip(&self.mean) {
                *d = (s - m) as f32;
                sq += f64::from(*d) * f64::from(*d);
            }
            norms.push(sq as f32);
        }
        (c32, norms)
    }

    /// `out[i, j] = x32[i0 + i] · c32[j]` for the block of points starting at `i0`: one GEMM.
    ///
    /// # Shapes
    /// `c32`: `[m, D]`; `out`: `[B, m]` with `i0 + B <= N`.
    pub fn dots(&self, i0: usize, c32: ArrayView2<'_, f32>, out: &mut ArrayViewMut2<'_, f32>) {
        let b = out.nrows();
        let block = self.x32.slice(s![i0..i0 + b, ..]);
        general_mat_mul(1.0, &block, &c32.t(), 0.0, out);
    }
}

/// One k-means run.
pub(crate) struct LloydRun {
    /// `[N]`.
    pub labels: Array1<usize>,
    /// `[k, D]`, float64, uncentred.
    pub centres: Array2<f64>,
    /// Mean squared distance of the points to their centre.
    pub inertia: f64,
}

/// scikit-learn's Lloyd iterations from `seeds [k, D]` (module docs); `tol` is absolute (the
/// bound on the summed squared centre shift).
pub(crate) fn lloyd(
    codes: &Codes32<'_>,
    seeds: Array2<f64>,
    max_iterations: u64,
    tol: f64,
) -> LloydRun {
    let n = codes.n();
    let mut centres = seeds;
    let mut labels = vec![usize::MAX; n];
    let mut previous = vec![usize::MAX; n];
    let mut strict = false;
    for _ in 0..max_iterations {
        let (sums, counts) = assign_and_sum(codes, centres.view(), &mut labels);
        let next = new_centres(codes, centres.view(), &labels, sums, counts);
        let shift: f64 = centres
            .iter()
            .zip(next.iter())
            .map(|(&a, &b)| (a - b) * (a - b))
            .sum();
        centres = next;
        if labels == previous {
            strict = true;
            break;
        }
        if shift <= tol {
            break;
        }
        previous.copy_from_slice(&labels);
    }
    if !strict {
        assign_and_sum(codes, centres.view(), &mut labels);
    }
    let inertia = inertia(codes.x, centres.view(), &labels) / n as f64;
    LloydRun {
        labels: Array1::from(labels),
        centres,
        inertia,
    }
}

/// The closest centre of every point (into `labels [N]`) and, per cluster, the float64 sum of
/// its centred float32 points `[k, D]` and its size `[k]`.
pub(crate) fn assign_and_sum(
    codes: &Codes32<'_>,
    centres: ArrayView2<'_, f64>,
    labels: &mut [usize],
) -> (Array2<f64>, Vec<usize>) {
    let (k, d) = centres.dim();
    let (c32, cnorms) = codes.centres32(centres);
    let partials: Vec<(Array2<f64>, Vec<usize>)> = labels
        .par_chunks_mut(CHUNK)
        .enumerate()
        .map_init(
            || Array2::<f32>::zeros((CHUNK, k)),
            |dots, (chunk, labels)| {
                let i0 = chunk * CHUNK;
                let b = labels.len();
                let mut out = dots.slice_mut(s![..b, ..]);
                codes.dots(i0, c32.view(), &mut out);
                let mut sums = Array2::<f64>::zeros((k, d));
                let mut counts = vec![0usize; k];
                for (r, (row, label)) in out.rows().into_iter().zip(labels.iter_mut()).enumerate() {
                    let mut best = (f32::INFINITY, 0usize);
                    for (j, (&g, &cn)) in row.iter().zip(&cnorms).enumerate() {
                        let v = cn - 2.0 * g;
                        if v < best.0 {
                            best = (v, j);
                        }
                    }
                    *label = best.1;
                    counts[best.1] += 1;
                    let sum = sums.row_mut(best.1).into_slice().expect("standard layout");
                    let x = codes.x32.row(i0 + r);
                    let x = x.as_slice().expect("standard layout");
                    for (s, &v) in sum.iter_mut().zip(x) {
                        *s += f64::from(v);
                    }
                }
                (sums, counts)
            },
        )
        .collect();
    let mut sums = Array2::<f64>::zeros((k, d));
    let mut counts = vec![0usize; k];
    for (s, c) in partials {
        sums += &s;
        for (t, c) in counts.iter_mut().zip(c) {
            *t += c;
        }
    }
    (sums, counts)
}

/// The means of the clusters, after giving every empty cluster the point farthest from its
/// centre (scikit-learn's `_relocate_empty_clusters_dense`; the labels stay as they are). `sums`
/// are of the centred points; a cluster emptied by a relocation keeps a zero sum, so it lands on
/// the data mean (scikit-learn's, uncentred, lands on the origin).
fn new_centres(
    codes: &Codes32<'_>,
    old: ArrayView2<'_, f64>,
    labels: &[usize],
    mut sums: Array2<f64>,
    mut counts: Vec<usize>,
) -> Array2<f64> {
    let empty: Vec<usize> = (0..counts.len()).filter(|&j| counts[j] == 0).collect();
    if !empty.is_empty() {
        let mut far: Vec<(f64, usize)> = labels
            .iter()
            .enumerate()
            .map(|(i, &l)| (squared_distance(codes.x.row(i), old.row(l)), i))
            .collect();
        // farthest first; equal distances: the later point first (numpy's argpartition/argsort
        // order is unspecified there; this is one fixed choice)
        far.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        for (&j, &(_, i)) in empty.iter().zip(&far) {
            let from = labels[i];
            let x = codes.x32.row(i).mapv(f64::from);
            let mut s = sums.row_mut(from);
            s -= &x;
            sums.row_mut(j).assign(&x);
            counts[from] -= 1;
            counts[j] = 1;
        }
    }
    for (mut row, &c) in sums.rows_mut().into_iter().zip(&counts) {
        if c > 0 {
            row /= c as f64;
        }
        row += &codes.mean;
    }
    sums
}

/// `sum_d (a_d - b_d)^2` in float64, in feature order.
fn squared_distance(a: ArrayView1<'_, f64>, b: ArrayView1<'_, f64>) -> f64 {
    a.iter().zip(b).map(|(&p, &q)| (p - q) * (p - q)).sum()
}

/// `sum_i ‖x_i - c_{label_i}‖²` in float64, by direct differences (block sums in order).
pub(crate) fn inertia(
    x: ArrayView2<'_, f64>,
    centres: ArrayView2<'_, f64>,
    labels: &[usize],
) -> f64 {
    let partials: Vec<f64> = labels
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(chunk, labels)| {
            labels
                .iter()
                .enumerate()
                .map(|(r, &l)| squared_distance(x.row(chunk * CHUNK + r), centres.row(l)))
                .sum()
        })
        .collect();
    partials.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A plain float64 Lloyd loop (scikit-learn's rules, direct distances) for cross-checking.
    fn naive(x: &Array2<f64>, seeds: &Array2<f64>, max_iterations: u64, tol: f64) -> Vec<usize> {
        let (n, k) = (x.nrows(), seeds.nrows());
        let closest = |c: &Array2<f64>| -> Vec<usize> {
            (0..n)
                .map(|i| {
                    (0..k)
                        .min_by(|&a, &b| {
                            squared_distance(x.row(i), c.row(a))
                                .total_cmp(&squared_distance(x.row(i), c.row(b)))
                        })
                        .unwrap()
                })
                .collect()
        };
        let mut c = seeds.clone();
        let mut labels = vec![usize::MAX; n];
        for _ in 0..max_iterations {
            let new = closest(&c);
            let mut next = Array2::<f64>::zeros(c.dim());
            let mut counts = vec![0.0; k];
            for (i, &l) in new.iter().enumerate() {
                let mut r = next.row_mut(l);
                r += &x.row(i);
                counts[l] += 1.0;
            }
            for (mut r, &m) in next.rows_mut().into_iter().zip(&counts) {
                r /= m;
            }
            let shift: f64 = (&next - &c).mapv(|v| v * v).sum();
            c = next;
            let done = new == labels || shift <= tol;
            labels = new;
            if done {
                break;
            }
        }
        closest(&c)
    }

    #[test]
    fn matches_a_float64_lloyd_on_separated_blobs() {
        // five blobs in 7 features with a large common offset (tests the centring), 1003 points
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let x = Array2::from_shape_fn((1003, 7), |(i, j)| {
            1000.0 + ((i % 5) * (j + 2)) as f64 * 1.5 + rng.gen_range(-1.0..1.0)
        });
        let seeds = x.select(Axis(0), &[0, 1, 2, 3, 4, 10]);
        let codes = Codes32::new(x.view());
        for (max_iterations, tol) in [(300, 1e-9), (2, 0.0), (1, 0.0)] {
            let run = lloyd(&codes, seeds.clone(), max_iterations, tol);
            let want = naive(&x, &seeds, max_iterations, tol);
            assert_eq!(run.labels.to_vec(), want, "{max_iterations} iterations");
            // the centres are the means of their labels (up to the float32 rounding of the centred
            // points, |x - mean| < 30 here: 2e-6 at worst, far less on average)
            for j in 0..seeds.nrows() {
                let members: Vec<usize> = (0..1003).filter(|&i| want[i] == j).collect();
                let mean = x.select(Axis(0), &members).mean_axis(Axis(0)).unwrap();
                if max_iterations == 300 {
                    for (a, b) in mean.iter().zip(run.centres.row(j)) {
                        assert!((a - b).abs() < 1e-6, "centre {j}: {a} vs {b}");
                    }
                }
            }
            let direct: f64 = (0..1003)
                .map(|i| squared_distance(x.row(i), run.centres.row(run.labels[i])))
                .sum::<f64>()
                / 1003.0;
            assert!((run.inertia - direct).abs() <= 1e-12 * direct);
        }
    }

    #[test]
    fn empty_cluster_takes_the_farthest_point() {
        // two seeds on the same point: the second cluster is empty after the first assignment
        let x = ndarray::array![
            [0.0, 0.0],
            [0.1, 0.0],
            [10.0, 0.0],
            [10.2, 0.0],
            [30.0, 0.0]
        ];
        let seeds = ndarray::array![[0.0, 0.0], [0.0, 0.0]];
        let codes = Codes32::new(x.view());
        let run = lloyd(&codes, seeds, 300, 0.0);
        let l = run.labels.to_vec();
        assert_eq!(l[0], l[1]);
        assert_ne!(l[0], l[4]);
        assert!(run.centres.iter().all(|v| v.is_finite()));
    }
}
