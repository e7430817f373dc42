//! Products with a constant matrix packed once into column panels ([`PackedMatrix`]), for the
//! projections of a language model whose weights do not change between batches: `y = x W^T` with
//! `W` in PyTorch's `[out, in]` layout, several matrices of the same input stacked into one product
//! (one pass over `x` for a block's Q, K and V, or for an MLP's gate and up projections).
//!
//! Each output is a sum over blocks of [`DEPTH`] consecutive inner indices: per block one chain of
//! fused multiply-adds in order, `s_b = fma(x[i, q1-1], w[j, q1-1], ... fma(x[i, q0], w[j, q0], 0))`,
//! and `y[i, j] = (...(s_0 + s_1) + ...) + s_last` (blocks keep the rounding error of a long inner
//! axis near that of a blocked BLAS, and the panel's rows of `W` in the cache); the copies per
//! instruction set ([`crate::Isa::matmul_packed`]) compute the same (here the fused multiply-add
//! is asked for, `f32::mul_add`, so every copy still gives the portable code's bits).

use crate::huge::HugePageBuffer;

/// Columns of `W^T` (rows of `W`) per panel: three AVX-512 registers of 16 floats.
pub const PANEL: usize = 48;

/// Inner indices per block of the sum (module docs).
pub const DEPTH: usize = 128;

/// Rows of `x` per tile of the portable kernel and the AVX-512 copy (8 rows of 3 registers: 24
/// accumulators).
pub const TILE_ROWS: usize = 8;

/// One or more matrices `W_i [n_i, k]` of the same inner width `k`, packed into panels of
/// [`PANEL`] rows of `W` (columns of the product): panel `p` holds, for each `q < k`, the
/// [`PANEL`] values `W[p * PANEL + c, q]`, contiguous, zero past a matrix's last row. Each matrix
/// starts a new panel.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedMatrix {
    k: usize,
    /// `(n_i, first panel)` of each matrix.
    parts: Vec<(usize, usize)>,
    /// The panels, on huge pages when large ([`HugePageBuffer`]).
    data: HugePageBuffer,
}

impl PackedMatrix {
    /// Packs the matrices `parts` (each row-major `[n_i, k]`, PyTorch's `[out, in]`).
    ///
    /// # Shapes
    /// `parts[i]` of `n_i * k` floats.
    ///
    /// # Errors
    /// A message when `k` is 0, there is no part, or a part is empty or not a whole number of rows
    /// of `k`.
    pub fn new(k: usize, parts: &[&[f32]]) -> Result<Self, String> {
        if k == 0 || parts.is_empty() {
            return Err(format!(
                "packed matrix: inner width {k} with {} parts",
                parts.len()
            ));
        }
        let mut meta = Vec::with_capacity(parts.len());
        let mut panels = 0;
        for (i, w) in parts.iter().enumerate() {
            if w.is_empty() || !w.len().is_multiple_of(k) {
                return Err(format!(
                    "packed matrix: part {i} has {} values, not whole rows of {k}",
                    w.len()
                ));
            }
            let n = w.len() / k;
            meta.push((n, panels));
            panels += n.div_ceil(PANEL);
        }
        let mut data = HugePageBuffer::zeroed(panels * k * PANEL);
        for (w, &(n, first)) in parts.iter().zip(&meta) {
            for (j, row) in w.chunks_exact(k).enumerate().take(n) {
                let panel = &mut data[(first + j / PANEL) * k * PANEL..][..k * PANEL];
                for (q, v) in row.iter().enumerate() {
                    panel[q * PANEL + j % PANEL] = *v;
                }
            }
        }
        Ok(Self {
            k,
            parts: meta,
            data,
        })
    }

    /// The inner width `k`.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The number of matrices.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// The rows `n_i` of matrix `i` (the columns of its product).
    ///
    /// # Panics
    /// When `i` is not below [`PackedMatrix::parts`].
    pub fn rows(&self, i: usize) -> usize {
        self.parts[i].0
    }

    /// Matrix `i` unpacked, row-major `[n_i, k]` (the inverse of [`PackedMatrix::new`]).
    ///
    /// # Panics
    /// When `i` is not below [`PackedMatrix::parts`].
    pub fn unpack(&self, i: usize) -> Vec<f32> {
        let (n, first) = self.parts[i];
        let k = self.k;
        let mut w = vec![0f32; n * k];
        for (j, row) in w.chunks_exact_mut(k).enumerate() {
            let panel = self.panel(first + j / PANEL);
            for (q, v) in row.iter_mut().enumerate() {
                *v = panel[q * PANEL + j % PANEL];
            }
        }
        w
    }

    /// Panel `p`, `k * PANEL` floats.
    pub(crate) fn panel(&self, p: usize) -> &[f32] {
        &self.data[p * self.k * PANEL..][..self.k * PANEL]
    }

    /// Panel `p` if there is one (the panels of all the matrices in order): the next panel of a
    /// product, which a copy may prefetch while it computes the current one.
    pub(crate) fn panel_opt(&self, p: usize) -> Option<&[f32]> {
        self.data.get(p * self.k * PANEL..(p + 1) * self.k * PANEL)
    }

    /// For each matrix: its rows `n_i` and first panel.
    pub(crate) fn layout(&self) -> &[(usize, usize)] {
        &self.parts
    }

    /// Checks the sizes of a product of `x` with every part into `outs`, returning the rows `m` of
    /// `x`.
    ///
    /// # Panics
    /// When `x` is not whole rows of `k`, or `outs` is not one `[m, n_i]` slice per part.
    pub(crate) fn check<T>(&self, x: &[f32], outs: &[&mut [T]]) -> usize {
        assert!(
            x.len().is_multiple_of(self.k),
            "packed product: {} inputs, not rows of {}",
            x.len(),
            self.k
        );
        let m = x.len() / self.k;
        assert_eq!(outs.len(), self.parts.len(), "packed product: outputs");
        for (o, &(n, _)) in outs.iter().zip(&self.parts) {
            assert_eq!(o.len(), m * n, "packed product: output of {n} columns");
        }
        m
    }
}

/// `outs[i] = x W_i^T` for every matrix of `w`, each output the sum of blocks of [`DEPTH`] chains
/// of fused multiply-adds (module docs), in tiles of [`TILE_ROWS`] rows by one panel.
///
/// # Shapes
/// `x [m, k]` row-major; `outs[i] [m, n_i]` row-major.
///
/// # Panics
/// When the sizes do not match (`x` not whole rows of `k`, not one output of `m * n_i` per part).
pub fn matmul_packed(x: &[f32], w: &PackedMatrix, outs: &mut [&mut [f32]]) {
    let m = w.check(x, outs);
    let k = w.k();
    for (out, &(n, first)) in outs.iter_mut().zip(w.layout()) {
        for p in 0..n.div_ceil(PANEL) {
            let panel = w.panel(first + p);
            let (c0, cols) = (p * PANEL, PANEL.min(n - p * PANEL));
            for r0 in (0..m).step_by(TILE_ROWS) {
                let rows = TILE_ROWS.min(m - r0);
                for q0 in (0..k).step_by(DEPTH) {
                    let mut acc = [[0f32; PANEL]; TILE_ROWS];
                    for q in q0..k.min(q0 + DEPTH) {
                        let wq = &panel[q * PANEL..][..PANEL];
                        for (r, acc) in acc.iter_mut().enumerate().take(rows) {
                            let a = x[(r0 + r) * k + q];
                            for (acc, w) in acc.iter_mut().zip(wq) {
                                *acc = a.mul_add(*w, *acc);
                            }
                        }
                    }
                    for (r, acc) in acc.iter().enumerate().take(rows) {
                        let o = &mut out[(r0 + r) * n + c0..][..cols];
                        if q0 == 0 {
                            o.copy_from_slice(&acc[..cols]);
                        } else {
                            for (o, a) in o.iter_mut().zip(acc) {
                                *o += *a;
                            }
                        }
                    }
                }
            }
        }
    }
}
