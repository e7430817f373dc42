//! The repulsive forces of t-SNE by polynomial interpolation on an equispaced grid and FFT
//! convolution (FIt-SNE: Linderman, Rachh, Hoskins, Steinerberger & Kluger 2019, as openTSNE's
//! `estimate_negative_gradient_fft_2d` runs it, with its defaults).
//!
//! With `w_ij = (1 + |y_i - y_j|²)^-1`, the repulsion of point `i` is
//! `F_i = sum_j w_ij² (y_i - y_j)` and the normaliser `Z = sum_{i != j} w_ij`. Both follow from
//! four sums against the kernel `K(y, y') = (1 + |y - y'|²)^-2` with the charges
//! `q_j = (1, y_j1, y_j2, |y_j|²)`: `phi_c(y_i) = sum_j K(y_i, y_j) q_jc`, then
//! `F_i = y_i phi_1 - (phi_2, phi_3)` and
//! `Z = sum_i [(1 + |y_i|²) phi_1 - 2 y_i · (phi_2, phi_3) + phi_4] - N`
//! (`K (1 + |y_i - y_j|²) = w_ij`, and the `N` self-terms are 1).
//!
//! The sums are interpolated: the square `[lo, hi]²` spanned by the embedding is cut into
//! `n × n` boxes, `n = max(50, floor(hi - lo))` rounded up to a product of 2, 3 and 5 (openTSNE's
//! `min_num_intervals = 50`, `ints_in_interval = 1`), with 3 equispaced nodes per box and axis
//! (at `(k + 1/2) / 3` of the box, `n_interpolation_points = 3`). Each point spreads its charges
//! to the 3 × 3 nodes of its box with Lagrange weights; the node potentials are the convolution
//! of the node charges with the kernel on the grid, one zero-padded 2-D FFT product (rustfft; two
//! charges per complex transform, real and imaginary part); each point reads its potentials back
//! with the same weights. The coordinates are taken relative to the centre of the square, which
//! changes none of the differences and keeps `|y|²` small.
//!
//! Spreading runs over the points in order; the transforms, the read-back and the per-point
//! terms run on rayon's threads but each value is computed by one thread in a fixed order, and
//! `Z` is summed over the points in order, so the forces do not depend on the number of threads.

use std::sync::Arc;

use rayon::prelude::*;
use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};

/// Interpolation nodes per box and axis (openTSNE's `n_interpolation_points`).
const NODES: usize = 3;
/// Least number of boxes per axis (openTSNE's `min_num_intervals`).
const MIN_BOXES: usize = 50;
/// Embedding units per box at most, beyond [`MIN_BOXES`] (openTSNE's `ints_in_interval`).
const BOX_UNITS: f64 = 1.0;

/// The repulsive forces and the normaliser of one embedding (module docs).
#[derive(Debug, Clone)]
pub(crate) struct Repulsion {
    /// `F_i = sum_j w_ij² (y_i - y_j)`, `[N]`.
    pub force: Vec<[f64; 2]>,
    /// `Z = sum_{i != j} w_ij`.
    pub z: f64,
}

/// Computes [`Repulsion`]s, keeping its FFT plans between calls.
pub(crate) struct Interpolation {
    planner: FftPlanner<f64>,
}

/// One point's place on the grid: the first node of its box per axis and its 3 weights per axis.
#[derive(Debug, Clone, Copy)]
struct Stencil {
    node: [usize; 2],
    weight: [[f64; NODES]; 2],
}

impl Interpolation {
    pub fn new() -> Self {
        Interpolation {
            planner: FftPlanner::new(),
        }
    }

    /// The repulsion of the embedding `ys` (module docs).
    ///
    /// # Shapes
    /// `ys [N]` points, finite.
    pub fn repulsion(&mut self, ys: &[[f64; 2]]) -> Repulsion {
        let n = ys.len();
        let (lo, hi) = ys
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), y| {
                (l.min(y[0]).min(y[1]), h.max(y[0]).max(y[1]))
            });
        let centre = 0.5 * (lo + hi);
        let span = if hi > lo { hi - lo } else { 1.0 };
        let boxes = smooth_at_least(MIN_BOXES.max((span / BOX_UNITS) as usize));
        let box_width = span / boxes as f64;
        let m = boxes * NODES;
        let spacing = box_width / NODES as f64;
        let start = centre - 0.5 * span;

        // relative coordinates, and where each point falls on the grid
        let rel: Vec<[f64; 2]> = ys.iter().map(|y| [y[0] - centre, y[1] - centre]).collect();
        let stencils: Vec<Stencil> = ys
            .par_iter()
            .map(|y| stencil(y, start, box_width, boxes))
            .collect();

        // charges (1, y1) and (y2, |y|²) as two complex grids, zero-padded to 2m x 2m
        let len = 2 * m;
        let mut grids = [
            vec![Complex::new(0.0, 0.0); len * len],
            vec![Complex::new(0.0, 0.0); len * len],
        ];
        for (s, y) in stencils.iter().zip(&rel) {
            let charges = [
                Complex::new(1.0, y[0]),
                Complex::new(y[1], y[0] * y[0] + y[1] * y[1]),
            ];
            for a in 0..NODES {
                for b in 0..NODES {
                    let w = s.weight[0][a] * s.weight[1][b];
                    let at = (s.node[0] + a) * len + s.node[1] + b;
                    for (grid, q) in grids.iter_mut().zip(charges) {
                        grid[at] += q * w;
                    }
                }
            }
        }

        let forward = self.planner.plan_fft_forward(len);
        let inverse = self.planner.plan_fft_inverse(len);
        let kernel = kernel_spectrum(&forward, m, spacing);
        let scale = 1.0 / (len * len) as f64;
        for grid in grids.iter_mut() {
            fft2(&forward, grid, len, m);
            grid.par_iter_mut()
                .zip(&kernel)
                .for_each(|(g, k)| *g *= k * scale);
            ifft2(&inverse, grid, len, m);
        }

        // read back: phi = (phi_1, phi_2, phi_3, phi_4) per point
        let terms: Vec<([f64; 2], f64)> = stencils
            .par_iter()
            .zip(&rel)
            .map(|(s, y)| {
                let mut phi = [0.0f64; 4];
                for a in 0..NODES {
                    for b in 0..NODES {
                        let w = s.weight[0][a] * s.weight[1][b];
                        let at = (s.node[0] + a) * len + s.node[1] + b;
                        phi[0] += w * grids[0][at].re;
                        phi[1] += w * grids[0][at].im;
                        phi[2] += w * grids[1][at].re;
                        phi[3] += w * grids[1][at].im;
                    }
                }
                let force = [y[0] * phi[0] - phi[1], y[1] * phi[0] - phi[2]];
                let z = (1.0 + y[0] * y[0] + y[1] * y[1]) * phi[0]
                    - 2.0 * (y[0] * phi[1] + y[1] * phi[2])
                    + phi[3];
                (force, z)
            })
            .collect();
        let z = terms.iter().map(|t| t.1).sum::<f64>() - n as f64;
        Repulsion {
            force: terms.into_iter().map(|t| t.0).collect(),
            z,
        }
    }
}

/// The smallest number at least `n` whose only prime factors are 2, 3 and 5 (fast FFT lengths).
fn smooth_at_least(n: usize) -> usize {
    (n.max(1)..)
        .find(|&c| {
            let mut c = c;
            for p in [2, 3, 5] {
                while c % p == 0 {
                    c /= p;
                }
            }
            c == 1
        })
        .expect("2, 3, 5-smooth numbers are unbounded")
}

/// The box of `y` on the grid that starts at `start` with `boxes` boxes of `width` per axis, and
/// the Lagrange weights of its 3 nodes at `y`.
fn stencil(y: &[f64; 2], start: f64, width: f64, boxes: usize) -> Stencil {
    let mut node = [0usize; 2];
    let mut weight = [[0.0; NODES]; 2];
    for c in 0..2 {
        let u = (y[c] - start) / width;
        let b = (u.floor().max(0.0) as usize).min(boxes - 1);
        let t = u - b as f64;
        node[c] = b * NODES;
        weight[c] = lagrange(t);
    }
    Stencil { node, weight }
}

/// The Lagrange basis of the nodes `(k + 1/2) / 3`, `k = 0, 1, 2`, at `t` (in box units).
fn lagrange(t: f64) -> [f64; NODES] {
    let node = |k: usize| (k as f64 + 0.5) / NODES as f64;
    let mut out = [1.0; NODES];
    for (k, o) in out.iter_mut().enumerate() {
        for l in 0..NODES {
            if l != k {
                *o *= (t - node(l)) / (node(k) - node(l));
            }
        }
    }
    out
}

/// The 2-D spectrum, in [`fft2`]'s transposed layout, of the kernel `(1 + d²)^-2` sampled at the
/// node offsets of an `m x m` grid with `spacing`, wrapped around a `2m x 2m` circle (offset
/// `-o` at `2m - o`; the unused offset `m` is 0).
fn kernel_spectrum(forward: &Arc<dyn Fft<f64>>, m: usize, spacing: f64) -> Vec<Complex<f64>> {
    let len = 2 * m;
    let offset = |a: usize| -> Option<f64> {
        match a {
            a if a < m => Some(a as f64 * spacing),
            a if a > m => Some((len - a) as f64 * spacing),
            _ => None,
        }
    };
    let mut k = vec![Complex::new(0.0, 0.0); len * len];
    k.par_chunks_mut(len).enumerate().for_each(|(a, row)| {
        if let Some(dx) = offset(a) {
            for (b, v) in row.iter_mut().enumerate() {
                if let Some(dy) = offset(b) {
                    let w = 1.0 / (1.0 + dx * dx + dy * dy);
                    *v = Complex::new(w * w, 0.0);
                }
            }
        }
    });
    fft2(forward, &mut k, len, len);
    k
}

/// In-place 2-D FFT of the `len x len` grid whose rows `rows..` are zero; the result is
/// transposed (`out[v * len + u]` is frequency `(u, v)`).
fn fft2(fft: &Arc<dyn Fft<f64>>, grid: &mut [Complex<f64>], len: usize, rows: usize) {
    transform_rows(fft, &mut grid[..rows * len], len);
    transpose(grid, len);
    transform_rows(fft, grid, len);
}

/// The inverse of [`fft2`] (unnormalised), of which only the rows `..rows` of the result are
/// computed; the others hold intermediate values.
fn ifft2(fft: &Arc<dyn Fft<f64>>, grid: &mut [Complex<f64>], len: usize, rows: usize) {
    transform_rows(fft, grid, len);
    transpose(grid, len);
    transform_rows(fft, &mut grid[..rows * len], len);
}

/// One 1-D FFT of every row of length `len`, rows on rayon's threads.
fn transform_rows(fft: &Arc<dyn Fft<f64>>, rows: &mut [Complex<f64>], len: usize) {
    let scratch = fft.get_inplace_scratch_len();
    rows.par_chunks_mut(len).for_each_init(
        || vec![Complex::new(0.0, 0.0); scratch],
        |s, row| fft.process_with_scratch(row, s),
    );
}

/// Transposes the `len x len` grid in place (through a copy).
fn transpose(grid: &mut [Complex<f64>], len: usize) {
    let src = grid.to_vec();
    grid.par_chunks_mut(len).enumerate().for_each(|(v, row)| {
        for (u, out) in row.iter_mut().enumerate() {
            *out = src[u * len + v];
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Direct O(N²) sums.
    fn direct(ys: &[[f64; 2]]) -> Repulsion {
        let mut z = 0.0;
        let force = ys
            .iter()
            .enumerate()
            .map(|(i, yi)| {
                let mut f = [0.0; 2];
                for (j, yj) in ys.iter().enumerate() {
                    if i != j {
                        let d = [yi[0] - yj[0], yi[1] - yj[1]];
                        let w = 1.0 / (1.0 + d[0] * d[0] + d[1] * d[1]);
                        z += w;
                        f[0] += w * w * d[0];
                        f[1] += w * w * d[1];
                    }
                }
                f
            })
            .collect();
        Repulsion { force, z }
    }

    #[test]
    fn lagrange_weights_reproduce_quadratics() {
        for t in [0.0, 0.1, 0.5, 0.77, 1.0] {
            let w = lagrange(t);
            let nodes = [1.0 / 6.0, 0.5, 5.0 / 6.0];
            let at =
                |f: &dyn Fn(f64) -> f64| w.iter().zip(nodes).map(|(w, s)| w * f(s)).sum::<f64>();
            assert!((at(&|_| 1.0) - 1.0f64).abs() < 1e-14);
            assert!((at(&|s| s) - t).abs() < 1e-14);
            assert!((at(&|s| 3.0 * s * s - s) - (3.0 * t * t - t)).abs() < 1e-13);
        }
        assert_eq!(smooth_at_least(50), 50);
        assert_eq!(smooth_at_least(61), 64);
        assert_eq!(smooth_at_least(7), 8);
    }

    /// The interpolation error shrinks with the boxes (3 nodes: about the cube of their width):
    /// the same clusters spread over about 46 units (50 boxes, nearly 1 unit wide: t-SNE's grid),
    /// then shrunk 4 and 10 times (the same 50 boxes, 4 and 10 times narrower).
    #[test]
    fn matches_the_direct_sums() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for spread in [0.5, 8.0] {
            let base: Vec<[f64; 2]> = (0..600)
                .map(|i| {
                    let c = [[-15.0, 3.0], [10.0, -12.0], [4.0, 14.0]][i % 3];
                    [
                        c[0] + spread * rng.gen_range(-1.0..1.0),
                        c[1] + spread * rng.gen_range(-1.0..1.0),
                    ]
                })
                .collect();
            // (shrink, bound on the force error / largest force, bound on Z's relative error)
            for (shrink, force_tol, z_tol) in
                [(1.0, 0.1, 1e-2), (0.25, 1e-3, 1e-4), (0.1, 1e-4, 1e-5)]
            {
                let ys: Vec<[f64; 2]> = base
                    .iter()
                    .map(|y| [y[0] * shrink, y[1] * shrink])
                    .collect();
                let want = direct(&ys);
                let got = Interpolation::new().repulsion(&ys);
                let rel_z = (got.z - want.z).abs() / want.z;
                assert!(
                    rel_z < z_tol,
                    "Z {} vs {} (spread {spread}, shrink {shrink})",
                    got.z,
                    want.z
                );
                let largest = want
                    .force
                    .iter()
                    .map(|f| f[0].hypot(f[1]))
                    .fold(0.0f64, f64::max);
                let err = got
                    .force
                    .iter()
                    .zip(&want.force)
                    .map(|(a, b)| (a[0] - b[0]).hypot(a[1] - b[1]))
                    .fold(0.0f64, f64::max);
                assert!(
                    err < force_tol * largest,
                    "force error {err} of {largest} (spread {spread}, shrink {shrink})"
                );
            }
        }
    }
}
