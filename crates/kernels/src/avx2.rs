//! The kernels with AVX2 and FMA (x86-64): each is either the [`portable`] code compiled again
//! with those features, or written with the AVX2 intrinsics doing the portable code's operations
//! in its order (each product and sum rounded on its own: no FMA), so every one gives the portable
//! bits. The portable loops compiled for AVX2 kept their slice bounds and loop state in memory, or
//! left LLVM shuffling lanes (`CHANGELOG.md`, performance history): where that cost, the kernel
//! is written with the intrinsics. The product with a packed matrix ([`matmul_packed`]) asks for
//! the fused multiply-add, as its portable code does ([`crate::packed`]).
//!
//! Every function here needs a CPU with AVX2 and FMA: call it through [`crate::Isa`], or from code
//! compiled with those features after such an `Isa` chose it.

use crate::packed::{PackedMatrix, DEPTH, PANEL};
use crate::portable::{self, PaddedTail, TSNE_LANES};
use crate::{AttentionScratch, AttentionShape, CodesNorm, HylaShape, LANES};

/// [`portable::layer_norm`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn layer_norm(x: &[f32], wb: (&[f32], &[f32]), eps: f32, y: &mut [f32]) {
    portable::layer_norm(x, wb, eps, y);
}

/// [`portable::silu_mul`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    portable::silu_mul(g, u, out);
}

/// [`portable::softmax_prefix`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn softmax_prefix(s: &[f32], n: usize, a: &mut [f32]) {
    portable::softmax_prefix(s, n, a);
}

/// [`portable::rope_half`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn rope_half(x: &[f32], cos: &[f32], sin: &[f32], out: &mut [f32]) {
    portable::rope_half(x, cos, sin, out);
}

/// [`portable::rms_norm`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    portable::rms_norm(x, w, eps, out);
}

/// [`portable::add_rms_norm`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn add_rms_norm(h: &[f32], y: &[f32], w: &[f32], eps: f32, sum: &mut [f32], out: &mut [f32]) {
    portable::add_rms_norm(h, y, w, eps, sum, out);
}

/// [`portable::add_rows`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn add_rows(x: &mut [f32], b: &[f32]) {
    portable::add_rows(x, b);
}

/// [`portable::add_biased`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn add_biased(resid: &mut [f32], y: &[f32], b: &[f32]) {
    portable::add_biased(resid, y, b);
}

/// [`portable::gelu_tanh_reduced_in_place`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn gelu_tanh_reduced_in_place(v: &mut [f32]) {
    portable::gelu_tanh_reduced_in_place(v);
}

/// [`portable::transpose_kv`] in blocks of 8 keys x 8 columns, each transposed in registers (AVX2
/// shuffles); the rows of a last, partial block past `T` are zeros, so the padded keys are
/// written as zero. `H d` must be a multiple of [`LANES`] and `Tp` of `LANES`, at least `T`.
///
/// # Panics
/// If the sizes are not so, or a slice is shorter than its shape.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(unsafe_code)]
pub fn transpose_kv(
    qkv: &[f32],
    (t, tp, hd): (usize, usize, usize),
    kt: &mut [f32],
    vt: &mut [f32],
) {
    use std::arch::x86_64::{
        __m256, _mm256_loadu_ps, _mm256_permute2f128_ps, _mm256_setzero_ps, _mm256_shuffle_ps,
        _mm256_storeu_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps,
    };
    assert!(
        hd % LANES == 0
            && tp % LANES == 0
            && t <= tp
            && qkv.len() >= t * 3 * hd
            && kt.len() >= hd * tp
            && vt.len() >= hd * tp,
        "transpose_kv: {t} keys padded to {tp}, {hd} columns, {} / {} / {} floats",
        qkv.len(),
        kt.len(),
        vt.len()
    );
    let src = qkv.as_ptr();
    for (part, dst) in [(1, kt.as_mut_ptr()), (2, vt.as_mut_ptr())] {
        for j0 in (0..t).step_by(LANES) {
            for c0 in (0..hd).step_by(LANES) {
                let mut r = [_mm256_setzero_ps(); LANES];
                for (k, r) in r.iter_mut().enumerate().take(t - j0) {
                    // SAFETY: `j0 + k < T` and `part hd + c0 + LANES <= 3 hd`, inside `qkv`.
                    *r = unsafe { _mm256_loadu_ps(src.add((j0 + k) * 3 * hd + part * hd + c0)) };
                }
                // The 8 x 8 transpose: pairs, then quadruples of lanes, then the 128-bit halves.
                let u: [__m256; LANES] = [
                    _mm256_unpacklo_ps(r[0], r[1]),
                    _mm256_unpackhi_ps(r[0], r[1]),
                    _mm256_unpacklo_ps(r[2], r[3]),
                    _mm256_unpackhi_ps(r[2], r[3]),
                    _mm256_unpacklo_ps(r[4], r[5]),
                    _mm256_unpackhi_ps(r[4], r[5]),
                    _mm256_unpacklo_ps(r[6], r[7]),
                    _mm256_unpackhi_ps(r[6], r[7]),
                ];
                let s: [__m256; LANES] = [
                    _mm256_shuffle_ps::<0x44>(u[0], u[2]),
                    _mm256_shuffle_ps::<0xEE>(u[0], u[2]),
                    _mm256_shuffle_ps::<0x44>(u[1], u[3]),
                    _mm256_shuffle_ps::<0xEE>(u[1], u[3]),
                    _mm256_shuffle_ps::<0x44>(u[4], u[6]),
                    _mm256_shuffle_ps::<0xEE>(u[4], u[6]),
                    _mm256_shuffle_ps::<0x44>(u[5], u[7]),
                    _mm256_shuffle_ps::<0xEE>(u[5], u[7]),
                ];
                let cols: [__m256; LANES] = [
                    _mm256_permute2f128_ps::<0x20>(s[0], s[4]),
                    _mm256_permute2f128_ps::<0x20>(s[1], s[5]),
                    _mm256_permute2f128_ps::<0x20>(s[2], s[6]),
                    _mm256_permute2f128_ps::<0x20>(s[3], s[7]),
                    _mm256_permute2f128_ps::<0x31>(s[0], s[4]),
                    _mm256_permute2f128_ps::<0x31>(s[1], s[5]),
                    _mm256_permute2f128_ps::<0x31>(s[2], s[6]),
                    _mm256_permute2f128_ps::<0x31>(s[3], s[7]),
                ];
                for (m, col) in cols.into_iter().enumerate() {
                    // SAFETY: `c0 + m < hd` and `j0 + LANES <= Tp`, inside `dst [hd, Tp]`.
                    unsafe { _mm256_storeu_ps(dst.add((c0 + m) * tp + j0), col) };
                }
            }
        }
    }
}

/// [`portable::scores`] written with the AVX2 intrinsics: per lane `acc = 0`, then
/// `acc += q[e] kt[e, j]` for `e = 0, 1, ..`, then `acc scale + b[j]`, each product and sum
/// rounded on its own (no FMA), so the same bits as [`portable::scores`]. The usual head widths get
/// a copy with the width known at compile time; other widths take [`portable::scores`].
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub fn scores(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    match q.len() {
        1 => score_row::<1>(q, kt, scale, b, s),
        2 => score_row::<2>(q, kt, scale, b, s),
        4 => score_row::<4>(q, kt, scale, b, s),
        8 => score_row::<8>(q, kt, scale, b, s),
        16 => score_row::<16>(q, kt, scale, b, s),
        _ => portable::scores(q, kt, scale, b, s),
    }
}

/// [`scores`] for head width `D`: `q [D]`, `kt [D, Tp]`, `b [Tp]` (`Tp` a multiple of
/// [`LANES`]) into `s [W]`, `W <= Tp` (the last chunk's lanes past `W` are not written).
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn score_row<const D: usize>(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_cmpgt_epi32, _mm256_loadu_ps, _mm256_maskstore_ps, _mm256_mul_ps,
        _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let (tp, width) = (b.len(), s.len());
    assert!(
        q.len() == D && tp % LANES == 0 && width <= tp && kt.len() >= D * tp,
        "scores: a query of {} floats, {} keys, {width} scores, {} key floats",
        q.len(),
        tp,
        kt.len()
    );
    let mut qv = [_mm256_setzero_ps(); D];
    for (v, &x) in qv.iter_mut().zip(q) {
        *v = _mm256_set1_ps(x);
    }
    let vscale = _mm256_set1_ps(scale);
    let (kp, bp, sp) = (kt.as_ptr(), b.as_ptr(), s.as_mut_ptr());
    let full = width / LANES;
    for c in 0..width.div_ceil(LANES) {
        let at = c * LANES;
        let mut acc = _mm256_setzero_ps();
        for (e, &qe) in qv.iter().enumerate() {
            // SAFETY: `e < D` and `at + LANES <= Tp`, so `e Tp + at + LANES <= D Tp <= kt.len()`.
            let k = unsafe { _mm256_loadu_ps(kp.add(e * tp + at)) };
            acc = _mm256_add_ps(acc, _mm256_mul_ps(qe, k));
        }
        // SAFETY: `at + LANES <= Tp = b.len()`.
        let bias = unsafe { _mm256_loadu_ps(bp.add(at)) };
        let v = _mm256_add_ps(_mm256_mul_ps(acc, vscale), bias);
        if c < full {
            // SAFETY: `c < full`, so `at + LANES <= W = s.len()`.
            unsafe { _mm256_storeu_ps(sp.add(at), v) };
        } else {
            // The last `W - at < LANES` scores: lanes below that count are stored, the others
            // neither read nor written.
            let mask = _mm256_cmpgt_epi32(
                _mm256_set1_epi32((width - at) as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            // SAFETY: only the lanes `l < W - at` are stored, at `at + l < W = s.len()`.
            unsafe { _mm256_maskstore_ps(sp.add(at), mask, v) };
        }
    }
}

/// `out[e] = dot(x, y[e Ys..][..K])` for the `D` rows of `y` (row stride `Ys`), summed as
/// [`portable::dot`] sums (eight lanes over the whole chunks of 8, the lanes in order, plus the
/// remaining products in order; products and sums rounded apart), so the same bits, with the AVX2
/// intrinsics; `x` is loaded once for the `D` rows.
///
/// # Shapes
/// `x [K]`, `y [D, Ys]` with `Ys >= K`, `out [D]`.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(unsafe_code)]
pub fn dots<const D: usize>(x: &[f32], (y, ys): (&[f32], usize), out: &mut [f32]) {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    const L: usize = 8;
    let k = x.len();
    assert!(
        out.len() == D && ys >= k && (D == 0 || y.len() >= (D - 1) * ys + k),
        "dots: {D} rows of {k} against {} floats with stride {ys}",
        y.len()
    );
    let full = k / L;
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = [_mm256_setzero_ps(); D];
    for c in 0..full {
        // SAFETY: `8 c + 8 <= K` inside `x`, and `e Ys + 8 c + 8 <= (D - 1) Ys + K <= y.len()`.
        let xv = unsafe { _mm256_loadu_ps(xp.add(c * L)) };
        for (e, acc) in acc.iter_mut().enumerate() {
            let yv = unsafe { _mm256_loadu_ps(yp.add(e * ys + c * L)) };
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(xv, yv));
        }
    }
    for ((e, acc), out) in acc.iter().enumerate().zip(out) {
        let mut lanes = [0f32; L];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *acc) };
        let mut tail = 0f32;
        for (&a, &b) in x[full * L..].iter().zip(&y[e * ys + full * L..e * ys + k]) {
            tail += a * b;
        }
        *out = lanes.iter().sum::<f32>() + tail;
    }
}

/// [`portable::default_value`] with AVX2: each query's `d` dots per head by [`dots`] (the same
/// bits), for the head widths with a copy of their own; others compile
/// [`portable::default_value`] with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn default_value(shape: &AttentionShape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
    /// The loops for head width `D`.
    #[target_feature(enable = "avx2,fma")]
    fn of_width<const D: usize>(
        shape: &AttentionShape,
        q0: usize,
        att: &[f32],
        vt: &[f32],
        o: &mut [f32],
    ) {
        let (t, tp, h) = (shape.t, shape.tp, shape.h);
        for i in q0..t {
            for hh in 0..h {
                dots::<D>(
                    &att[(hh * t + i) * t..][..t],
                    (&vt[hh * D * tp..][..D * tp], tp),
                    &mut o[(i * h + hh) * D..][..D],
                );
            }
        }
    }
    match shape.d {
        1 => of_width::<1>(shape, q0, att, vt, o),
        2 => of_width::<2>(shape, q0, att, vt, o),
        4 => of_width::<4>(shape, q0, att, vt, o),
        8 => of_width::<8>(shape, q0, att, vt, o),
        _ => portable::default_value(shape, q0, att, vt, o),
    }
}

/// [`portable::squared_distances`] compiled with AVX2.
///
/// # Safety
/// The CPU must have AVX2 ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2")]
pub fn squared_distances(rows: &[f64], xt: &[f64], out: &mut [f64]) {
    portable::squared_distances(rows, xt, out)
}

/// [`portable::tsne_gradient_row`] with AVX2, written with its intrinsics: the same operations in
/// the same order (no FMA), so the same bits. Compiled from the portable code, the loop left LLVM
/// shuffling lanes and keeping the forty partial sums in memory.
///
/// # Safety
/// The CPU must have AVX2 ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2")]
#[allow(unsafe_code)]
pub fn tsne_gradient_row(xi: f64, zi: f64, xs: &[f64], zs: &[f64], prow: &[f64]) -> [f64; 5] {
    use std::arch::x86_64::{
        __m256d, _mm256_add_pd, _mm256_div_pd, _mm256_loadu_pd, _mm256_mul_pd, _mm256_set1_pd,
        _mm256_setzero_pd, _mm256_storeu_pd, _mm256_sub_pd,
    };
    const LANES: usize = TSNE_LANES;
    let n = xs.len();
    let tail = PaddedTail::new(xi, zi, xs, zs, prow);
    let (vxi, vzi, one) = (_mm256_set1_pd(xi), _mm256_set1_pd(zi), _mm256_set1_pd(1.0));
    // lanes 0..4 and 4..8 of each of the five sums
    let mut acc: [[__m256d; 2]; 5] = [[_mm256_setzero_pd(); 2]; 5];
    for c in (0..n).step_by(LANES) {
        let (x, z, p) = tail.chunk(c, xs, zs, prow);
        for (half, at) in [0usize, 4].into_iter().enumerate() {
            // SAFETY: `x`, `z` and `p` are arrays of LANES = 8 floats, and `at + 4 <= 8`.
            let (x, z, p) = unsafe {
                (
                    _mm256_loadu_pd(x.as_ptr().add(at)),
                    _mm256_loadu_pd(z.as_ptr().add(at)),
                    _mm256_loadu_pd(p.as_ptr().add(at)),
                )
            };
            let dx = _mm256_sub_pd(vxi, x);
            let dz = _mm256_sub_pd(vzi, z);
            let d2 = _mm256_add_pd(
                _mm256_add_pd(one, _mm256_mul_pd(dx, dx)),
                _mm256_mul_pd(dz, dz),
            );
            let w = _mm256_div_pd(one, d2);
            let pw = _mm256_mul_pd(p, w);
            let ww = _mm256_mul_pd(w, w);
            let a = &mut acc;
            a[0][half] = _mm256_add_pd(a[0][half], _mm256_mul_pd(pw, dx));
            a[1][half] = _mm256_add_pd(a[1][half], _mm256_mul_pd(pw, dz));
            a[2][half] = _mm256_add_pd(a[2][half], _mm256_mul_pd(ww, dx));
            a[3][half] = _mm256_add_pd(a[3][half], _mm256_mul_pd(ww, dz));
            a[4][half] = _mm256_add_pd(a[4][half], w);
        }
    }
    let mut lanes = [[0.0f64; LANES]; 5];
    for (out, sums) in lanes.iter_mut().zip(&acc) {
        for (at, v) in [0usize, 4].into_iter().zip(sums) {
            // SAFETY: `out` holds LANES = 8 floats, and `at + 4 <= 8`.
            unsafe { _mm256_storeu_pd(out.as_mut_ptr().add(at), *v) };
        }
    }
    portable::row_sums(&lanes, n)
}

/// The HYLA value network of one problem in evaluation mode (no dropout), head width `D`, with the
/// AVX2 intrinsics: the hidden units `hid[e, j] = act(sum_h a[h, i, j] vt[h, e, j])` over whole
/// vectors of keys (a query's codes past `K` read as zero by masked loads), then the outputs
/// `o[i, h, e] = dot(a[h, i, ..], hid[e, ..])` by [`dots`]. Every hidden unit is the same sum over
/// the heads in the same order as `hyperlens-model`'s portable `value_from_codes`, and every output
/// the same `dot` (eight lanes over the whole chunks of 8 keys, summed in lane order, plus the
/// remaining keys summed in order), products and sums rounded apart (no FMA): the same bits. The
/// portable loops, compiled for AVX2, spent most of their instructions on bounds checks and 4-key
/// tails (`CHANGELOG.md`, performance history). [`crate::Isa::hyla_value`] calls it for `D` 1, 2,
/// 4 and 8.
///
/// # Shapes
/// `a [H, Q, K]`, `vt [H, D, Kp]` (`Kp` = `K` rounded up to a multiple of 8, zero past `K`),
/// `o [Q, H, D]`, `hid_padded [D, Kp]` (scratch); the queries from `q0`.
///
/// # Panics
/// If `p.d != D` or a slice is shorter than its shape.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
pub fn hyla_value<const D: usize>(
    p: &HylaShape,
    q0: usize,
    a: &[f32],
    vt: &[f32],
    o: &mut [f32],
    hid_padded: &mut [f32],
) {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_cmpgt_epi32, _mm256_loadu_ps, _mm256_maskload_ps,
        _mm256_max_ps, _mm256_mul_ps, _mm256_set1_epi32, _mm256_setr_epi32, _mm256_setzero_ps,
        _mm256_storeu_ps,
    };
    const L: usize = 8;
    let (h, q, k) = (p.h, p.q, p.k);
    let (full, chunks) = (k / L, k.div_ceil(L));
    let kp = chunks * L;
    assert!(
        p.d == D
            && q0 <= q
            && a.len() >= h * q * k
            && vt.len() >= h * D * kp
            && o.len() >= q * h * D
            && hid_padded.len() >= D * kp,
        "hyla_value: {h} heads, {q} queries, {k} keys and width {D} against {} codes, {} values, {} outputs",
        a.len(),
        vt.len(),
        o.len()
    );
    // The lanes of the last, partial chunk that hold keys.
    let tail_mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32((k - full * L) as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let (ap, vp) = (a.as_ptr(), vt.as_ptr());
    let zero = _mm256_setzero_ps();
    for i in q0..q {
        let hid = hid_padded.as_mut_ptr();
        // The hidden units, chunk by chunk: `pre[e, j] = sum_h a[h, i, j] vt[h, e, j]`.
        for c in 0..chunks {
            let mut pre = [zero; D];
            for hh in 0..h {
                let at = (hh * q + i) * k + c * L;
                // SAFETY: a whole chunk `c < full` ends at `(hh q + i) k + 8 c + 8 <= (hh q + i + 1)
                // k <= a.len()`; the partial chunk loads only its `k - 8 full` keys.
                let codes: __m256 = unsafe {
                    if c < full {
                        _mm256_loadu_ps(ap.add(at))
                    } else {
                        _mm256_maskload_ps(ap.add(at), tail_mask)
                    }
                };
                for (e, pre) in pre.iter_mut().enumerate() {
                    // SAFETY: `(hh D + e) Kp + 8 c + 8 <= h D Kp <= vt.len()`.
                    let v = unsafe { _mm256_loadu_ps(vp.add((hh * D + e) * kp + c * L)) };
                    *pre = _mm256_add_ps(*pre, _mm256_mul_ps(codes, v));
                }
            }
            for (e, &pre) in pre.iter().enumerate() {
                let y = if p.relu {
                    _mm256_max_ps(pre, zero)
                } else {
                    pre
                };
                // SAFETY: `e Kp + 8 c + 8 <= D Kp <= hid_padded.len()`.
                unsafe { _mm256_storeu_ps(hid.add(e * kp + c * L), y) };
            }
        }
        // The outputs `o[i, h, e] = dot(a[h, i, ..], hid[e, ..])`.
        for hh in 0..h {
            dots::<D>(
                &a[(hh * q + i) * k..][..k],
                (&*hid_padded, kp),
                &mut o[(i * h + hh) * D..][..D],
            );
        }
    }
}

/// [`portable::attention_codes`] compiled with AVX2 and FMA, with the K/V transposes and the scores
/// by [`transpose_kv`] and [`scores`]: the same bits.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn attention_codes(
    shape: &AttentionShape,
    norm: CodesNorm,
    visible: Option<&[bool]>,
    q0: usize,
    qkv: &[f32],
    bias: &[f32],
    w: &mut AttentionScratch,
) {
    crate::attention::codes::<true>(shape, norm, visible, q0, qkv, bias, w);
}

/// Rows of `x` per tile of the AVX2 [`matmul_packed`] (4 rows of 3 registers, half a panel: 12
/// accumulators of the 16 registers).
const AVX2_TILE_ROWS: usize = 4;

/// [`crate::packed::matmul_packed`] with AVX2 and FMA, written with the intrinsics: tiles of up
/// to 4 rows by half a panel (24 columns, three registers) by one block of [`DEPTH`] inner
/// indices, each output the portable code's chains of fused multiply-adds and sums of blocks in
/// the same order, so its bits.
///
/// # Panics
/// As [`crate::packed::matmul_packed`].
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`crate::Isa::avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn matmul_packed(x: &[f32], w: &PackedMatrix, outs: &mut [&mut [f32]]) {
    let m = w.check(x, outs);
    let k = w.k();
    for (out, &(n, first)) in outs.iter_mut().zip(w.layout()) {
        for p in 0..n.div_ceil(PANEL) {
            let panel = w.panel(first + p);
            for half in 0..2 {
                let c0 = p * PANEL + half * (PANEL / 2);
                if c0 >= n {
                    break;
                }
                let cols = (PANEL / 2).min(n - c0);
                let mut r0 = 0;
                while r0 < m {
                    let rows = AVX2_TILE_ROWS.min(m - r0);
                    let xs = &x[r0 * k..(r0 + rows) * k];
                    for q0 in (0..k).step_by(DEPTH) {
                        let q = q0..k.min(q0 + DEPTH);
                        let tile = match rows {
                            4 => packed_tile::<4>(xs, k, q, panel, half),
                            3 => packed_tile::<3>(xs, k, q, panel, half),
                            2 => packed_tile::<2>(xs, k, q, panel, half),
                            _ => packed_tile::<1>(xs, k, q, panel, half),
                        };
                        for (r, t) in tile.chunks_exact(PANEL / 2).take(rows).enumerate() {
                            let o = &mut out[(r0 + r) * n + c0..][..cols];
                            if q0 == 0 {
                                o.copy_from_slice(&t[..cols]);
                            } else {
                                for (o, t) in o.iter_mut().zip(t) {
                                    *o += *t;
                                }
                            }
                        }
                    }
                    r0 += rows;
                }
            }
        }
    }
}

/// One tile of the AVX2 [`matmul_packed`]: `R` rows of `x` (`x [R, k]`) by half `half` of one
/// panel (`panel [k, PANEL]`) over the inner indices `q`, returned as
/// `[AVX2_TILE_ROWS, PANEL / 2]` (rows past `R` zero).
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn packed_tile<const R: usize>(
    x: &[f32],
    k: usize,
    q: std::ops::Range<usize>,
    panel: &[f32],
    half: usize,
) -> [f32; AVX2_TILE_ROWS * PANEL / 2] {
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps,
        _mm256_storeu_ps,
    };
    assert!(x.len() == R * k && panel.len() == k * PANEL && half < 2 && R <= AVX2_TILE_ROWS);
    assert!(q.end <= k);
    let (xp, wp) = (x.as_ptr(), panel.as_ptr());
    let mut acc: [[__m256; 3]; R] = [[_mm256_setzero_ps(); 3]; R];
    for q in q {
        // SAFETY: `q < k`, `half < 2` (asserted): the three loads read `panel[q * PANEL + half * 24..][..24]`
        // and the broadcasts `x[r * k + q]`, `r < R`, inside the slices (asserted above).
        unsafe {
            let w = wp.add(q * PANEL + half * (PANEL / 2));
            let (w0, w1, w2) = (
                _mm256_loadu_ps(w),
                _mm256_loadu_ps(w.add(8)),
                _mm256_loadu_ps(w.add(16)),
            );
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = _mm256_set1_ps(*xp.add(r * k + q));
                acc[0] = _mm256_fmadd_ps(a, w0, acc[0]);
                acc[1] = _mm256_fmadd_ps(a, w1, acc[1]);
                acc[2] = _mm256_fmadd_ps(a, w2, acc[2]);
            }
        }
    }
    let mut tile = [0f32; AVX2_TILE_ROWS * PANEL / 2];
    for (row, acc) in tile.chunks_exact_mut(PANEL / 2).zip(&acc) {
        for (v, acc) in acc.iter().enumerate() {
            // SAFETY: `row` holds 24 floats: lanes `v * 8 .. v * 8 + 8`, `v < 3`.
            unsafe { _mm256_storeu_ps(row.as_mut_ptr().add(v * 8), *acc) };
        }
    }
    tile
}
