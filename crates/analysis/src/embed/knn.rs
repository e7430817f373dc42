//! Exact k nearest neighbours (Euclidean) of every point, for the affinities of the large-N
//! t-SNE ([`super::interpolated`]).
//!
//! The candidates come from blocked float32 GEMMs, as k-means computes its distances
//! (`crate::cluster::Codes32`: the codes centred, rounded to float32 once, `‖x‖² - 2 x·y + ‖y‖²`
//! clipped at 0): a block of [`CHUNK`] points against a tile of [`TILE`] points is one GEMM, and
//! each point keeps its `k` closest others in a sorted list (ties: the lower index). The
//! distances of the `k` chosen neighbours are then recomputed in float64 from the codes by direct
//! differences, and the list re-sorted by them (ties: the lower index). Float32 rounding can only
//! swap neighbours whose distances agree to about float32 precision.
//!
//! Blocks of points run on rayon's threads and every point's list is built from the tiles in
//! order, so the neighbours do not depend on the number of threads.

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, ArrayView2};
use rayon::prelude::*;

use crate::cluster::{Codes32, CHUNK};

/// Points per tile of the candidate GEMMs (the column side of a block's distance matrix).
const TILE: usize = 2048;

/// The `k` nearest neighbours of each of `N` points.
#[derive(Debug, Clone)]
pub(crate) struct Neighbours {
    /// Neighbours per point.
    pub k: usize,
    /// `[N * k]`: point `i`'s neighbours at `i * k..(i + 1) * k`, nearest first.
    pub index: Vec<usize>,
    /// `[N * k]`: the float64 squared distances to them.
    pub dist2: Vec<f64>,
}

/// The exact `k` nearest neighbours of every row of `x` (module docs).
///
/// # Shapes
/// `x [N, D]`, finite, `1 <= k < N` (checked by the caller).
pub(crate) fn nearest_neighbours(x: ArrayView2<'_, f64>, k: usize) -> Neighbours {
    let x = x.as_standard_layout();
    let n = x.nrows();
    let x = x.view();
    let codes = Codes32::new(x);
    let mut index = vec![0usize; n * k];
    let mut dist2 = vec![0.0f64; n * k];
    index
        .par_chunks_mut(CHUNK * k)
        .zip(dist2.par_chunks_mut(CHUNK * k))
        .enumerate()
        .for_each(|(block, (index, dist2))| {
            let i0 = block * CHUNK;
            let rows = index.len() / k;
            let lists = candidates(&codes, i0, rows, k);
            for (r, list) in lists.into_iter().enumerate() {
                let i = i0 + r;
                let mut exact: Vec<(f64, usize)> = list
                    .into_iter()
                    .map(|(_, j)| (squared_distance(&x, i, j as usize), j as usize))
                    .collect();
                exact.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                for (s, (d, j)) in exact.into_iter().enumerate() {
                    index[r * k + s] = j;
                    dist2[r * k + s] = d;
                }
            }
        });
    Neighbours { k, index, dist2 }
}

/// The `k` closest others by float32 GEMM distance of the points `i0..i0 + rows`, per point a
/// list sorted by (distance, index).
fn candidates(codes: &Codes32<'_>, i0: usize, rows: usize, k: usize) -> Vec<Vec<(f32, u32)>> {
    let n = codes.n();
    let mut lists: Vec<Vec<(f32, u32)>> = vec![Vec::with_capacity(k + 1); rows];
    let mut dots = Array2::<f32>::zeros((rows, TILE.min(n)));
    let block = codes.x32.slice(s![i0..i0 + rows, ..]);
    for j0 in (0..n).step_by(TILE) {
        let cols = TILE.min(n - j0);
        let tile = codes.x32.slice(s![j0..j0 + cols, ..]);
        let mut out = dots.slice_mut(s![.., ..cols]);
        general_mat_mul(1.0, &block, &tile.t(), 0.0, &mut out);
        for (r, (list, row)) in lists.iter_mut().zip(out.rows()).enumerate() {
            let i = i0 + r;
            let ni = codes.norms[i];
            for (c, &dot) in row.iter().enumerate() {
                let j = j0 + c;
                if j == i {
                    continue;
                }
                let d = (ni + codes.norms[j] - 2.0 * dot).max(0.0);
                // j increases, so an equal distance never displaces an earlier (lower) index
                if list.len() == k && d >= list[k - 1].0 {
                    continue;
                }
                let at = list.partition_point(|&(e, _)| e <= d);
                list.insert(at, (d, j as u32));
                list.truncate(k);
            }
        }
    }
    lists
}

/// `‖x_i - x_j‖²` in float64 by direct differences.
fn squared_distance(x: &ArrayView2<'_, f64>, i: usize, j: usize) -> f64 {
    x.row(i)
        .iter()
        .zip(x.row(j))
        .map(|(a, b)| (a - b) * (a - b))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn matches_a_brute_force_search() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        // more than one block and one tile, with a few exact duplicates (ties by index)
        let n = 2600;
        let mut x = Array2::from_shape_fn((n, 7), |_| rng.gen_range(-1.0..1.0) + 5.0);
        for i in 0..20 {
            let row = x.row(i).to_owned();
            x.row_mut(i + 100).assign(&row);
        }
        let k = 12;
        let nb = nearest_neighbours(x.view(), k);
        for i in (0..n).step_by(37).chain(0..20).chain(100..120) {
            let mut all: Vec<(f64, usize)> = (0..n)
                .filter(|&j| j != i)
                .map(|j| (squared_distance(&x.view(), i, j), j))
                .collect();
            all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let want: Vec<usize> = all[..k].iter().map(|p| p.1).collect();
            assert_eq!(&nb.index[i * k..(i + 1) * k], want.as_slice(), "point {i}");
            for (s, p) in all[..k].iter().enumerate() {
                assert_eq!(nb.dist2[i * k + s], p.0);
            }
        }
    }
}
