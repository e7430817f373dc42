//! The kernels with AVX-512F (x86-64): the analyses' distances and t-SNE gradient, in the
//! [`portable`] code's operation order (no FMA), so with its bits; the product with a packed
//! matrix ([`matmul_packed`]), the fused multiply-adds of [`crate::packed`] in its order.
//!
//! Every function here needs a CPU with AVX-512F: call it through [`crate::Isa`].

use std::mem::MaybeUninit;

use crate::packed::{PackedMatrix, DEPTH, PANEL, TILE_ROWS};
use crate::portable::{self, PaddedTail, TSNE_LANES};

/// [`portable::squared_distances`] compiled with AVX-512F.
///
/// # Safety
/// The CPU must have AVX-512F ([`crate::Isa::avx512`]).
#[target_feature(enable = "avx512f")]
pub fn squared_distances(rows: &[f64], xt: &[f64], out: &mut [f64]) {
    portable::squared_distances(rows, xt, out)
}

/// [`portable::tsne_gradient_row`] with AVX-512F, written with its intrinsics: one register holds
/// the `TSNE_LANES` = 8 lanes of each partial sum, and the operations are
/// [`crate::avx2::tsne_gradient_row`]'s in the same order (no FMA), so the same bits. The portable
/// loop compiled for AVX-512 was left shuffling lanes as the AVX2 one was: on an Intel Xeon with
/// AVX-512 the fuzzy-logic checkpoints' t-SNE in the report was several times slower than with
/// AVX2 on an AMD EPYC (`CHANGELOG.md`, performance history).
///
/// # Safety
/// The CPU must have AVX-512F ([`crate::Isa::avx512`]).
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
pub fn tsne_gradient_row(xi: f64, zi: f64, xs: &[f64], zs: &[f64], prow: &[f64]) -> [f64; 5] {
    use std::arch::x86_64::{
        __m512d, _mm512_add_pd, _mm512_div_pd, _mm512_loadu_pd, _mm512_mul_pd, _mm512_set1_pd,
        _mm512_setzero_pd, _mm512_storeu_pd, _mm512_sub_pd,
    };
    const LANES: usize = TSNE_LANES;
    let n = xs.len();
    let tail = PaddedTail::new(xi, zi, xs, zs, prow);
    let (vxi, vzi, one) = (_mm512_set1_pd(xi), _mm512_set1_pd(zi), _mm512_set1_pd(1.0));
    let mut acc: [__m512d; 5] = [_mm512_setzero_pd(); 5];
    for c in (0..n).step_by(LANES) {
        let (x, z, p) = tail.chunk(c, xs, zs, prow);
        // SAFETY: `x`, `z` and `p` are arrays of LANES = 8 floats, one 512-bit load each.
        let (x, z, p) = unsafe {
            (
                _mm512_loadu_pd(x.as_ptr()),
                _mm512_loadu_pd(z.as_ptr()),
                _mm512_loadu_pd(p.as_ptr()),
            )
        };
        let dx = _mm512_sub_pd(vxi, x);
        let dz = _mm512_sub_pd(vzi, z);
        let d2 = _mm512_add_pd(
            _mm512_add_pd(one, _mm512_mul_pd(dx, dx)),
            _mm512_mul_pd(dz, dz),
        );
        let w = _mm512_div_pd(one, d2);
        let pw = _mm512_mul_pd(p, w);
        let ww = _mm512_mul_pd(w, w);
        acc[0] = _mm512_add_pd(acc[0], _mm512_mul_pd(pw, dx));
        acc[1] = _mm512_add_pd(acc[1], _mm512_mul_pd(pw, dz));
        acc[2] = _mm512_add_pd(acc[2], _mm512_mul_pd(ww, dx));
        acc[3] = _mm512_add_pd(acc[3], _mm512_mul_pd(ww, dz));
        acc[4] = _mm512_add_pd(acc[4], w);
    }
    let mut lanes = [[0.0f64; LANES]; 5];
    for (out, v) in lanes.iter_mut().zip(&acc) {
        // SAFETY: `out` holds LANES = 8 floats, one 512-bit store.
        unsafe { _mm512_storeu_pd(out.as_mut_ptr(), *v) };
    }
    portable::row_sums(&lanes, n)
}

/// [`crate::packed::matmul_packed`] with AVX-512F, written with its intrinsics: tiles of up to
/// [`TILE_ROWS`] rows by one panel ([`PANEL`] = three registers of 16 columns) by one block of
/// [`DEPTH`] inner indices, each output the portable code's chains of fused multiply-adds and sums
/// of blocks in the same order, so its bits.
///
/// While the tiles of one panel run, the next panel is prefetched into the L2 cache, a share of
/// its cache lines per tile: a language model's weights are read once per batch, from memory,
/// and without it the first tile of each panel waited on them (on a Xeon with AVX-512, the
/// products of SmolLM2-135M's layers with cold weights ran 15-20 % slower than with weights in
/// the cache). Prefetches change no value.
///
/// Each tile's loop takes four inner indices per turn, with each row's start at hand: on
/// SmolLM2-135M's products (256 rows a thread) one thread's rate went from 103 to 114 GFLOP/s
/// with the weights of 30 layers (from memory), and from 135 to 146 with one layer's (from the
/// L3 cache), interleaved on a 2-core Xeon whose fused multiply-adds peak at 212 GFLOP/s a core
/// (`CHANGELOG.md`). The order of each output's sum is the same. (Walking each panel block by
/// block of the inner axis instead, every row tile per block, was as fast at 256 rows and 24 %
/// slower at the 1,600 rows a thread of `probe`'s batches of 64 prompts: the rows no longer
/// stay in L1 across blocks.)
///
/// The outputs need not be initialised: the first block of each tile stores its sums without
/// reading the output, and the later blocks read only what the first one stored, so every element
/// is written (an output written by this copy needs no zero-fill first).
///
/// # Panics
/// As [`crate::packed::matmul_packed`].
///
/// # Safety
/// The CPU must have AVX-512F ([`crate::Isa::avx512`]).
#[target_feature(enable = "avx512f")]
pub fn matmul_packed(x: &[f32], w: &PackedMatrix, outs: &mut [&mut [MaybeUninit<f32>]]) {
    let m = w.check(x, outs);
    let k = w.k();
    // Tiles (row tiles by depth blocks) per panel, and the next panel's cache lines each one
    // prefetches.
    let tiles = m.div_ceil(TILE_ROWS) * k.div_ceil(DEPTH);
    let share = (k * PANEL).div_ceil(LINE).div_ceil(tiles.max(1));
    for (out, &(n, first)) in outs.iter_mut().zip(w.layout()) {
        for p in 0..n.div_ceil(PANEL) {
            let panel = w.panel(first + p);
            let next = w.panel_opt(first + p + 1).unwrap_or(&[]);
            let (c0, cols) = (p * PANEL, PANEL.min(n - p * PANEL));
            let mut r0 = 0;
            let mut tile = 0;
            while r0 < m {
                let rows = TILE_ROWS.min(m - r0);
                let xs = &x[r0 * k..(r0 + rows) * k];
                let o = &mut out[r0 * n + c0..(r0 + rows - 1) * n + c0 + cols];
                for q0 in (0..k).step_by(DEPTH) {
                    let lo = (tile * share * LINE).min(next.len());
                    let hi = ((tile + 1) * share * LINE).min(next.len());
                    tile += 1;
                    let t = Tile {
                        k,
                        q: q0..k.min(q0 + DEPTH),
                        n,
                        cols,
                        prefetch: Prefetch(&next[lo..hi]),
                    };
                    match rows {
                        8 => packed_tile::<8>(xs, panel, o, t),
                        7 => packed_tile::<7>(xs, panel, o, t),
                        6 => packed_tile::<6>(xs, panel, o, t),
                        5 => packed_tile::<5>(xs, panel, o, t),
                        4 => packed_tile::<4>(xs, panel, o, t),
                        3 => packed_tile::<3>(xs, panel, o, t),
                        2 => packed_tile::<2>(xs, panel, o, t),
                        _ => packed_tile::<1>(xs, panel, o, t),
                    }
                }
                r0 += rows;
            }
        }
    }
}

/// Floats per cache line (64 bytes).
const LINE: usize = 16;

/// The sizes of one tile of [`matmul_packed`]: the inner width `k`, the block `q` of inner indices,
/// the output's row stride `n` and the panel's columns `cols` written; and the floats whose cache
/// lines the tile prefetches.
#[derive(Debug, Clone)]
struct Tile<'a> {
    k: usize,
    q: std::ops::Range<usize>,
    n: usize,
    cols: usize,
    prefetch: Prefetch<'a>,
}

/// Floats to bring into the L2 cache (the next panel's share of a tile): one cache line per inner
/// index of the tile, the first lines first (a share longer than the tile's inner indices is cut
/// there).
#[derive(Debug, Clone)]
struct Prefetch<'a>(&'a [f32]);

/// One tile of [`matmul_packed`]: `R` rows of `x` (`x [R, k]`) by one panel (`panel [k, PANEL]`)
/// over the block `t.q`, the first `t.cols` columns stored to `out` (row `r` at `r * t.n`) for
/// the first block and added to it for the others.
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
fn packed_tile<const R: usize>(
    x: &[f32],
    panel: &[f32],
    out: &mut [MaybeUninit<f32>],
    t: Tile<'_>,
) {
    use std::arch::x86_64::{
        __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_storeu_ps,
        _mm512_maskz_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm_prefetch, _MM_HINT_T1,
    };
    let Tile {
        k,
        q,
        n,
        cols,
        prefetch: Prefetch(ahead),
    } = t;
    assert!(x.len() == R * k && panel.len() == k * PANEL && cols <= PANEL && cols > 0);
    assert!(out.len() == (R - 1) * n + cols && q.end <= k);
    let first = q.start == 0;
    // The tile's cache lines of the next panel, asked for at once (no test per inner index).
    for line in ahead.chunks(LINE).take(q.len()) {
        _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast::<i8>());
    }
    let wp = panel.as_ptr();
    // Each row's start, so that a row's element `q` is one address (no address arithmetic per
    // row and inner index).
    let xs: [*const f32; R] = std::array::from_fn(|r| x[r * k..].as_ptr());
    let mut acc: [[__m512; 3]; R] = [[_mm512_setzero_ps(); 3]; R];
    // One inner index `q`: the panel's row `q` (three registers) times `x[r, q]` of every row.
    let step = |acc: &mut [[__m512; 3]; R], q: usize| {
        // SAFETY: every call has `q < k` (the tile's block, asserted inside `0..k`), so the three
        // loads read `panel[q * PANEL..(q + 1) * PANEL]` and the broadcasts `x[r * k + q]`,
        // `r < R`, inside the slices (asserted above).
        unsafe {
            let w = wp.add(q * PANEL);
            let (w0, w1, w2) = (
                _mm512_loadu_ps(w),
                _mm512_loadu_ps(w.add(16)),
                _mm512_loadu_ps(w.add(32)),
            );
            for (acc, row) in acc.iter_mut().zip(&xs) {
                let a = _mm512_set1_ps(*row.add(q));
                acc[0] = _mm512_fmadd_ps(a, w0, acc[0]);
                acc[1] = _mm512_fmadd_ps(a, w1, acc[1]);
                acc[2] = _mm512_fmadd_ps(a, w2, acc[2]);
            }
        }
    };
    // Four inner indices per turn (fewer loop and address instructions beside the 96 fused
    // multiply-adds), each output's chain still in the order of `q`.
    let mut q = q.start..q.end;
    while q.len() >= 4 {
        let q0 = q.start;
        step(&mut acc, q0);
        step(&mut acc, q0 + 1);
        step(&mut acc, q0 + 2);
        step(&mut acc, q0 + 3);
        q.start += 4;
    }
    for q in q {
        step(&mut acc, q);
    }
    for (r, acc) in acc.iter().enumerate() {
        let row = &mut out[r * n..][..cols];
        for (v, acc) in acc.iter().enumerate() {
            let lanes = cols.saturating_sub(v * 16).min(16);
            if lanes > 0 {
                let mask = (((1u32 << lanes) - 1) & 0xffff) as u16;
                let p = row.as_mut_ptr().cast::<f32>().wrapping_add(v * 16);
                // SAFETY: lanes `v * 16 .. v * 16 + lanes` of `row` (length `cols`) are read and
                // written, the masked-off ones neither; they are read only after the first block
                // (`q.start == 0`, the first call for this tile) stored them.
                unsafe {
                    let sum = if first {
                        *acc
                    } else {
                        _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), *acc)
                    };
                    _mm512_mask_storeu_ps(p, mask, sum)
                };
            }
        }
    }
}
