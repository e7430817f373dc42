//! Blocked pairwise squared Euclidean distances, the inner loop of the silhouette score.
//!
//! Each distance is `sum_d (x_jd - x_id)^2`, summed over `d` in order: the differences, not the
//! norm expansion `|x_i|^2 + |x_j|^2 - 2 x_i.x_j`, so there is no cancellation, and a point's
//! distance to itself is exactly 0. The loop is compiled three times (baseline, AVX2, AVX-512F)
//! and chosen at run time; Rust never fuses a product and a sum on its own, so every copy gives
//! the same bits, whatever the CPU.

/// Rows of `x` handled together (they share every load of the transposed data).
pub(crate) const ROWS: usize = 4;
/// Columns per register tile.
const TILE: usize = 16;

/// The instruction set [`squared_distances`] runs with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kernels {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernels {
    /// The widest of AVX-512F and AVX2 this CPU has.
    pub(crate) fn detect() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Kernels::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Kernels::Avx2;
            }
        }
        Kernels::Baseline
    }

    /// Squared distances from [`ROWS`] points to all N points.
    ///
    /// # Shapes
    /// `rows`: `[ROWS, D]` row-major; `xt`: `[D, N]` row-major (the data transposed);
    /// `out`: `[ROWS, N]` row-major.
    // The workspace denies `unsafe`; calling a function compiled for more features than the
    // baseline needs it.
    #[allow(unsafe_code)]
    pub(crate) fn squared_distances(self, rows: &[f64], xt: &[f64], out: &mut [f64]) {
        match self {
            Kernels::Baseline => squared_distances(rows, xt, out),
            // SAFETY: `Kernels::Avx2` is only made by `detect`, after the CPU reported AVX2.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { squared_distances_avx2(rows, xt, out) },
            // SAFETY: `Kernels::Avx512` is only made by `detect`, after the CPU reported AVX-512F.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512 => unsafe { squared_distances_avx512(rows, xt, out) },
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn squared_distances_avx2(rows: &[f64], xt: &[f64], out: &mut [f64]) {
    squared_distances(rows, xt, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn squared_distances_avx512(rows: &[f64], xt: &[f64], out: &mut [f64]) {
    squared_distances(rows, xt, out)
}

#[inline(always)]
fn squared_distances(rows: &[f64], xt: &[f64], out: &mut [f64]) {
    let d = rows.len() / ROWS;
    let n = out.len() / ROWS;
    debug_assert!(rows.len() == ROWS * d && xt.len() == d * n && out.len() == ROWS * n);
    let mut j0 = 0;
    // register tiles: [ROWS, TILE] accumulators, one pass over the features
    while j0 + TILE <= n {
        let mut acc = [[0.0f64; TILE]; ROWS];
        for k in 0..d {
            let col: &[f64; TILE] = xt[k * n + j0..k * n + j0 + TILE]
                .try_into()
                .expect("a tile of TILE columns");
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let v = rows[r * d + k];
                for (a, &c) in acc_r.iter_mut().zip(col) {
                    let diff = c - v;
                    *a += diff * diff;
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            out[r * n + j0..r * n + j0 + TILE].copy_from_slice(acc_r);
        }
        j0 += TILE;
    }
    // the last columns, with the same summation order
    for j in j0..n {
        for r in 0..ROWS {
            let mut s = 0.0;
            for k in 0..d {
                let diff = xt[k * n + j] - rows[r * d + k];
                s += diff * diff;
            }
            out[r * n + j] = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_gives_the_plain_loop_bit_for_bit() {
        let (n, d) = (37, 5);
        let x: Vec<f64> = (0..n * d)
            .map(|i| ((i * 7919) % 113) as f64 / 17.0 - 3.0)
            .collect();
        let mut xt = vec![0.0; d * n];
        for i in 0..n {
            for k in 0..d {
                xt[k * n + i] = x[i * d + k];
            }
        }
        let rows: Vec<f64> = x[3 * d..(3 + ROWS) * d].to_vec();
        let mut want = vec![0.0; ROWS * n];
        for r in 0..ROWS {
            for j in 0..n {
                let mut s = 0.0;
                for k in 0..d {
                    let diff = x[j * d + k] - rows[r * d + k];
                    s += diff * diff;
                }
                want[r * n + j] = s;
            }
        }
        let mut kernels = vec![Kernels::Baseline];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                kernels.push(Kernels::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                kernels.push(Kernels::Avx512);
            }
        }
        for k in kernels {
            let mut got = vec![f64::NAN; ROWS * n];
            k.squared_distances(&rows, &xt, &mut got);
            assert_eq!(got, want, "{k:?}");
            // a point's distance to itself is exactly zero
            assert_eq!(got[3], 0.0);
        }
    }
}
