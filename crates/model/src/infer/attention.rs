//! The per-problem attention loops: the keys and values transposed, the scaled scores plus the
//! position bias, the softmax over padded keys, RMSHead and the standard value network, each in
//! its portable form and, beside it, its AVX2 form (the same operations in the same order, so the
//! same bits).

use super::buffers::Scratch;
use super::maths::exp_reduced;
use crate::mixer::Normalisation;
#[cfg(target_arch = "x86_64")]
use crate::ops::fast::mix::dots_avx2;
use crate::ops::fast::mix::{dot, rms_head_scales, softmax_row};

/// Lanes of the attention loops: keys are padded to a multiple of this, so that every loop over
/// keys runs in whole vectors of eight floats (one AVX2 register), with no scalar tail.
pub(super) const LANES: usize = 8;

/// `t` rounded up to a multiple of [`LANES`].
pub(super) fn padded(t: usize) -> usize {
    t.div_ceil(LANES) * LANES
}

/// Sizes of one problem's attention: tokens, tokens padded to a multiple of [`LANES`] (`Tp`),
/// heads, head width, and the score scale `1 / sqrt(d)`.
pub(super) struct Shape {
    pub(super) t: usize,
    pub(super) tp: usize,
    pub(super) h: usize,
    pub(super) d: usize,
    pub(super) scale: f32,
}

/// [`codes_of_problem`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) fn codes_avx2(
    shape: &Shape,
    norm: Normalisation,
    visible: Option<&[bool]>,
    q0: usize,
    qkv: &[f32],
    bias: &[f32],
    w: &mut Scratch,
) {
    codes_of_problem::<true>(shape, norm, visible, q0, qkv, bias, w);
}

/// One problem's codes at one layer, from its Q, K and V rows `qkv [T, 3 H d]` and the layer's
/// padded position bias `[H, T, Tp]`: keys and values transposed to `w.kt`, `w.vt` `[H, d, Tp]`
/// (so that the loops run over contiguous keys; the padded keys stay zero);
/// per head and query the scaled scores plus bias,
/// `s[j] = (sum_e q[i, h, e] k[h, e, j]) / sqrt(d) + bias[h, i, j]`, over the `Tp` padded keys
/// (`-inf` on the padding), normalised at once into the codes `w.att [H, T, T]` (the reference's
/// `normalise`): softmax over the visible keys; none (0 where masked); RMSHead
/// `m / sqrt(mean_h m^2 + eps)` over the heads of each pair. Only the queries from `q0` are
/// computed; the rows of earlier ones are NaN. `AVX2`: the transposes and the scores by
/// [`transpose_kv_avx2`] and [`scores_avx2`] (only in [`codes_avx2`], which runs where the CPU
/// has AVX2 and FMA).
#[inline(always)]
pub(super) fn codes_of_problem<const AVX2: bool>(
    shape: &Shape,
    norm: Normalisation,
    visible: Option<&[bool]>,
    q0: usize,
    qkv: &[f32],
    bias: &[f32],
    w: &mut Scratch,
) {
    let (t, tp, h, d) = (shape.t, shape.tp, shape.h, shape.d);
    let hd = h * d;
    transpose_kv::<AVX2>(qkv, (t, tp, hd), &mut w.kt, &mut w.vt);
    for hh in 0..h {
        w.att[hh * t * t..][..q0 * t].fill(f32::NAN);
        let kt = &w.kt[hh * d * tp..][..d * tp];
        if norm == Normalisation::Softmax && visible.is_none() {
            // Two queries at a time, so that the two rows' chains of dependent steps (maximum,
            // `exp`, sum, scaling) overlap; each row's arithmetic is that of one row alone.
            let q = |i: usize| &qkv[i * 3 * hd + hh * d..][..d];
            let b = |i: usize| &bias[(hh * t + i) * tp..][..tp];
            let (s0, s1) = w.s.split_at_mut(tp);
            let (e0, e1) = w.e.split_at_mut(tp);
            let mut i = q0;
            while i + 1 < t {
                score_row::<AVX2>(q(i), kt, shape.scale, b(i), s0);
                score_row::<AVX2>(q(i + 1), kt, shape.scale, b(i + 1), s1);
                let (a0, a1) = w.att[(hh * t + i) * t..][..2 * t].split_at_mut(t);
                softmax_padded_rows([&*s0, &*s1], [&mut *e0, &mut *e1], [a0, a1]);
                i += 2;
            }
            if i < t {
                score_row::<AVX2>(q(i), kt, shape.scale, b(i), s0);
                softmax_padded(s0, e0, &mut w.att[(hh * t + i) * t..][..t]);
            }
            continue;
        }
        for i in q0..t {
            let q = &qkv[i * 3 * hd + hh * d..][..d];
            let b = &bias[(hh * t + i) * tp..][..tp];
            let a = &mut w.att[(hh * t + i) * t..][..t];
            let vis = visible.map(|v| &v[i * t..][..t]);
            if norm != Normalisation::Softmax && vis.is_none() {
                // The scores are the codes (RMSHead scales them below): straight into the row.
                score_row::<AVX2>(q, kt, shape.scale, b, a);
                continue;
            }
            let s = &mut w.s[..tp];
            score_row::<AVX2>(q, kt, shape.scale, b, s);
            // (Softmax with every key visible took the two-row path above.)
            match (norm, vis) {
                (Normalisation::Softmax, vis) => softmax_row(&s[..t], vis, a),
                (_, None) => a.copy_from_slice(&s[..t]),
                (_, Some(vis)) => {
                    for ((a, &x), &on) in a.iter_mut().zip(&s[..t]).zip(vis) {
                        *a = if on { x } else { 0.0 };
                    }
                }
            }
        }
    }
    if norm == Normalisation::RmsHead {
        rms_head(q0 * t, &mut w.att, &mut w.r);
    }
}

/// One problem's keys and values transposed, from its rows `qkv [T, 3 H d]` into `kt`, `vt`
/// `[H d, Tp]` (column `c` of the keys, `qkv[j, H d + c]`, into row `c` of `kt`; the padded keys
/// `T..Tp` are left as they are, zero). By [`transpose_kv_avx2`] when `AVX2` and `H d` is a multiple
/// of [`LANES`].
#[inline(always)]
fn transpose_kv<const AVX2: bool>(
    qkv: &[f32],
    (t, tp, hd): (usize, usize, usize),
    kt: &mut [f32],
    vt: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 && hd % LANES == 0 {
        // SAFETY: as in `score_row`.
        #[allow(unsafe_code)]
        unsafe {
            transpose_kv_avx2(qkv, (t, tp, hd), kt, vt);
        }
        return;
    }
    for j in 0..t {
        let row = &qkv[j * 3 * hd..][..3 * hd];
        for c in 0..hd {
            kt[c * tp + j] = row[hd + c];
            vt[c * tp + j] = row[2 * hd + c];
        }
    }
}

/// [`transpose_kv`] in blocks of 8 keys x 8 columns, each transposed in registers (AVX2 shuffles);
/// the rows of a last, partial block past `T` are zeros, so the padded keys are written as zero.
/// `H d` must be a multiple of [`LANES`] and `Tp` of `LANES`, at least `T`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn transpose_kv_avx2(
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

/// [`scores`], by [`scores_avx2`] when `AVX2` (in [`codes_of_problem`]'s AVX2 copy).
#[inline(always)]
fn score_row<const AVX2: bool>(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `codes_of_problem::<true>` is only called from `codes_avx2`, which
        // `Kernels::codes` calls only after the CPU reported AVX2 and FMA.
        #[allow(unsafe_code)]
        unsafe {
            scores_avx2(q, kt, scale, b, s);
        }
        return;
    }
    scores(q, kt, scale, b, s);
}

/// [`scores`] written with the AVX2 intrinsics: per lane `acc = 0`, then `acc += q[e] kt[e, j]`
/// for `e = 0, 1, ..`, then `acc scale + b[j]`, each product and sum rounded on its own (no FMA),
/// so the same bits as [`scores`]. The portable loop, compiled for AVX2, kept its slice bounds and
/// loop state in memory (`CHANGELOG.md`, performance history). The usual head widths get a copy
/// with the width known at compile time; other widths take [`scores`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn scores_avx2(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    match q.len() {
        1 => score_row_avx2::<1>(q, kt, scale, b, s),
        2 => score_row_avx2::<2>(q, kt, scale, b, s),
        4 => score_row_avx2::<4>(q, kt, scale, b, s),
        8 => score_row_avx2::<8>(q, kt, scale, b, s),
        16 => score_row_avx2::<16>(q, kt, scale, b, s),
        _ => scores(q, kt, scale, b, s),
    }
}

/// [`scores_avx2`] for head width `D`: `q [D]`, `kt [D, Tp]`, `b [Tp]` (`Tp` a multiple of
/// [`LANES`]) into `s [W]`, `W <= Tp` (the last chunk's lanes past `W` are not written).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn score_row_avx2<const D: usize>(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
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

/// One row of scaled scores plus bias over the padded keys: `s[j] = (sum_e q[e] kt[e, j]) scale +
/// b[j]` for `q [d]`, `kt [d, Tp]`, `b [Tp]` into `s [Tp]` (or into the `T` real keys' `s [T]`),
/// eight keys at a time with the sum over
/// `e` in a register (the sum runs in the order `e = 0, 1, ..`). The usual head widths get a copy
/// with `d` known at compile time, so that the loop over `e` is unrolled.
#[inline(always)]
fn scores(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    match q.len() {
        1 => scores_of_width::<1>(q, kt, scale, b, s),
        2 => scores_of_width::<2>(q, kt, scale, b, s),
        4 => scores_of_width::<4>(q, kt, scale, b, s),
        8 => scores_of_width::<8>(q, kt, scale, b, s),
        16 => scores_of_width::<16>(q, kt, scale, b, s),
        _ => score_chunks(q, kt, scale, b, s),
    }
}

/// [`scores`] for head width `D` (the length of `q` known to the compiler).
#[inline(always)]
fn scores_of_width<const D: usize>(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    let q: [f32; D] = q.try_into().expect("a query row of the head width");
    score_chunks(&q, &kt[..D * b.len()], scale, b, s);
}

/// The loops of [`scores`]; `s` may also be a row of `T` scores, shorter than the padded `b`
/// (`Tp`): its last chunk is then written lane by lane.
#[inline(always)]
fn score_chunks(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    let tp = b.len();
    let mut out = s.chunks_exact_mut(LANES);
    let mut c = 0;
    for s in &mut out {
        let s: &mut [f32; LANES] = s.try_into().expect("a chunk of LANES");
        *s = score_chunk(q, kt, tp, scale, b, c);
        c += 1;
    }
    let tail = out.into_remainder();
    if !tail.is_empty() {
        let last = score_chunk(q, kt, tp, scale, b, c);
        for (s, &v) in tail.iter_mut().zip(&last) {
            *s = v;
        }
    }
}

/// Chunk `c` (keys `8 c .. 8 c + 8`) of [`score_chunks`], with the sum over the head width in a
/// register.
// A function, not a closure: a closure is compiled on its own, without the AVX2 of its caller.
#[inline(always)]
fn score_chunk(q: &[f32], kt: &[f32], tp: usize, scale: f32, b: &[f32], c: usize) -> [f32; LANES] {
    let mut acc = [0f32; LANES];
    for (e, &qe) in q.iter().enumerate() {
        let k = &kt[e * tp + c * LANES..][..LANES];
        for l in 0..LANES {
            acc[l] += qe * k[l];
        }
    }
    let b = &b[c * LANES..][..LANES];
    for l in 0..LANES {
        acc[l] = acc[l] * scale + b[l];
    }
    acc
}

/// The softmax of a row of scores over padded keys with every real key visible, `a = exp(x - max)
/// / sum exp(x - max)`, by [`exp_reduced`] in whole vectors: `s [Tp]` (a multiple of [`LANES`],
/// `-inf` on the padding), `e [Tp]` scratch, into `a [T]`. The padding's `exp` is that of the
/// clamp, about 1e-38, below the rounding of the sum (at least 1, the maximum's term). A row with
/// a NaN gives NaN (the `exp` of NaN is NaN and the sum with it).
#[inline(always)]
pub(super) fn softmax_padded(s: &[f32], e: &mut [f32], a: &mut [f32]) {
    softmax_padded_rows([s], [e], [a]);
}

/// [`softmax_padded`] of `R` rows side by side: each step runs over all the rows before the
/// next, so that their dependency chains overlap; every row's arithmetic, and so its bits, are
/// those of the row alone.
#[inline(always)]
pub(super) fn softmax_padded_rows<const R: usize>(
    s: [&[f32]; R],
    e: [&mut [f32]; R],
    a: [&mut [f32]; R],
) {
    // The maximum and the sum over eight lanes (reductions in a fixed order that vectorise).
    let mut lanes = [[f32::NEG_INFINITY; LANES]; R];
    for (lanes, s) in lanes.iter_mut().zip(&s) {
        for c in s.chunks_exact(LANES) {
            for (l, &x) in lanes.iter_mut().zip(c) {
                *l = if x > *l { x } else { *l };
            }
        }
    }
    let mut mx = [f32::NEG_INFINITY; R];
    for (m, lanes) in mx.iter_mut().zip(&lanes) {
        for &x in lanes {
            *m = if x > *m { x } else { *m };
        }
    }
    // (Separate loops: fused, the `exp` did not vectorise.)
    let mut e = e;
    for ((e, s), &mx) in e.iter_mut().zip(&s).zip(&mx) {
        for (e, &x) in e.iter_mut().zip(s.iter()) {
            *e = exp_reduced(x - mx);
        }
    }
    let mut acc = [[0f32; LANES]; R];
    for (acc, e) in acc.iter_mut().zip(&e) {
        for c in e.chunks_exact(LANES) {
            for l in 0..LANES {
                acc[l] += c[l];
            }
        }
    }
    let mut inv = [0f32; R];
    for (inv, acc) in inv.iter_mut().zip(&acc) {
        let mut sum = 0f32;
        for &x in acc {
            sum += x;
        }
        *inv = 1.0 / sum;
    }
    for ((a, e), &inv) in a.into_iter().zip(&e).zip(&inv) {
        for (a, &v) in a.iter_mut().zip(e.iter()) {
            *a = v * inv;
        }
    }
}

/// RMSHead in place on one problem's masked scores `a [H, T, T]`, for the pairs from `p0` (pair
/// `i T + j`): every pair's scores times [`rms_head_scales`] (the paper's Eq. 5, shared with the
/// training kernel), with `r [T * T]` scratch; the loops run over contiguous pairs.
#[inline(always)]
fn rms_head(p0: usize, a: &mut [f32], r: &mut [f32]) {
    let tt = r.len();
    let r = &mut r[p0..];
    rms_head_scales(a, tt, p0, r);
    for head in a.chunks_exact_mut(tt) {
        for (x, &r) in head[p0..].iter_mut().zip(r.iter()) {
            *x *= r;
        }
    }
}

/// The standard value network of one problem: `o[i, h, e] = sum_j a[h, i, j] v[h, e, j]`, from the
/// codes `att [H, T, T]` and the values `vt [H, d, Tp]` into `o [T, H, d]`, for the queries from
/// `q0`.
#[inline(always)]
pub(super) fn default_value(shape: &Shape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
    let (t, tp, h, d) = (shape.t, shape.tp, shape.h, shape.d);
    for i in q0..t {
        for hh in 0..h {
            let arow = &att[(hh * t + i) * t..][..t];
            for e in 0..d {
                o[(i * h + hh) * d + e] = dot(arow, &vt[(hh * d + e) * tp..][..t]);
            }
        }
    }
}

/// [`default_value`] with AVX2: each query's `d` dots per head by [`dots_avx2`] (the same bits),
/// for the head widths with a copy of their own; others compile [`default_value`] with AVX2 and
/// FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) fn value_avx2(shape: &Shape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
    /// The loops for head width `D`.
    #[target_feature(enable = "avx2,fma")]
    fn of_width<const D: usize>(shape: &Shape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
        let (t, tp, h) = (shape.t, shape.tp, shape.h);
        for i in q0..t {
            for hh in 0..h {
                dots_avx2::<D>(
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
        _ => default_value(shape, q0, att, vt, o),
    }
}
