//! The per-problem attention pass of the engine and its choice of instruction set: which kernels
//! compute one problem's codes for each normalisation (the K/V transposes, the scaled scores plus
//! the position bias, the softmax over padded keys or over a masked row, RMSHead), and its HYLA
//! value network. The kernels themselves live in `hyperlens-kernels` (the rows of the attention,
//! portable and AVX2) and, for the HYLA value networks, in `ops::fast::mix` (shared with
//! training); this file holds only the order in which the engine calls them and the dispatch on
//! [`Isa`]. The codes' pass is compiled twice, portable ([`codes_of_problem`]`::<false>`) and with
//! AVX2 and FMA ([`codes_avx2`], whose transposes and scores are `hyperlens_kernels::avx2`'s
//! intrinsics), and both give the same bits.

use hyperlens_kernels::{portable, AttentionShape, Isa, LANES};

use super::buffers::Scratch;
use crate::mixer::Normalisation;
#[cfg(target_arch = "x86_64")]
use crate::ops::fast::mix::value_from_codes_avx2;
use crate::ops::fast::mix::{value_from_codes, Plan, Rows};
use crate::ops::reference::RMS_HEAD_EPS;

/// [`codes_of_problem`] with the instruction set `isa` (with AVX2, [`codes_avx2`]).
// The workspace denies `unsafe`; calling a function compiled for more features than the
// baseline needs it.
#[allow(unsafe_code, clippy::too_many_arguments)]
pub(super) fn codes(
    isa: Isa,
    shape: &AttentionShape,
    norm: Normalisation,
    visible: Option<&[bool]>,
    q0: usize,
    qkv: &[f32],
    bias: &[f32],
    w: &mut Scratch,
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: `Isa::avx2` holds only for an instruction set detected on a CPU with AVX2 and
        // FMA.
        return unsafe { codes_avx2(shape, norm, visible, q0, qkv, bias, w) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    codes_of_problem::<false>(shape, norm, visible, q0, qkv, bias, w)
}

/// `ops::fast::mix`'s [`value_from_codes`] (the HYLA value networks) with the instruction set
/// `isa`, from the values transposed and padded, `vt [H, d, Tp]` with `Tp` =
/// [`hyperlens_kernels::padded`]`(T)` (with AVX2 `value_from_codes_avx2`).
#[allow(unsafe_code)]
pub(super) fn mix_value(
    isa: Isa,
    plan: &Plan,
    q0: usize,
    att: &[f32],
    (vt, tp): (&[f32], usize),
    o: &mut [f32],
    rows: &mut Rows,
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in `codes`.
        return unsafe { value_from_codes_avx2(plan, q0, att, vt, o, rows) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    value_from_codes(plan, q0, att, (vt, tp), o, rows)
}

/// [`codes_of_problem`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) fn codes_avx2(
    shape: &AttentionShape,
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
/// `hyperlens_kernels::avx2`'s `transpose_kv` and `scores` (only in [`codes_avx2`], which runs
/// where the CPU has AVX2 and FMA).
#[inline(always)]
pub(super) fn codes_of_problem<const AVX2: bool>(
    shape: &AttentionShape,
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
                portable::softmax_padded_rows([&*s0, &*s1], [&mut *e0, &mut *e1], [a0, a1]);
                i += 2;
            }
            if i < t {
                score_row::<AVX2>(q(i), kt, shape.scale, b(i), s0);
                portable::softmax_padded(s0, e0, &mut w.att[(hh * t + i) * t..][..t]);
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
                (Normalisation::Softmax, vis) => portable::softmax_row(&s[..t], vis, a),
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
        // RMSHead's scales shared with the training kernel (`ops::fast::mix`).
        portable::rms_head(q0 * t, RMS_HEAD_EPS as f32, &mut w.att, &mut w.r);
    }
}

/// One problem's keys and values transposed ([`portable::transpose_kv`]); by
/// `hyperlens_kernels::avx2::transpose_kv` when `AVX2` and `H d` is a multiple of [`LANES`].
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
            hyperlens_kernels::avx2::transpose_kv(qkv, (t, tp, hd), kt, vt);
        }
        return;
    }
    portable::transpose_kv(qkv, (t, tp, hd), kt, vt);
}

/// One row of scaled scores plus bias ([`portable::scores`]); by
/// `hyperlens_kernels::avx2::scores` when `AVX2` (in [`codes_of_problem`]'s AVX2 copy).
#[inline(always)]
fn score_row<const AVX2: bool>(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `codes_of_problem::<true>` is only called from `codes_avx2`, which `codes`
        // calls only after the CPU reported AVX2 and FMA.
        #[allow(unsafe_code)]
        unsafe {
            hyperlens_kernels::avx2::scores(q, kt, scale, b, s);
        }
        return;
    }
    portable::scores(q, kt, scale, b, s);
}
