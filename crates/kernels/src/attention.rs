//! One problem's latent codes at one layer: the attention pass of `hyperlens-model`'s evaluation
//! engine (`infer`), which row kernels run for each normalisation and in which order (the K/V
//! transposes, the scaled scores plus the position bias, the softmax over padded keys or over a
//! masked row, RMSHead). Written once ([`codes`]), generic over whether the transposes and the
//! scores are [`crate::avx2`]'s intrinsics, and compiled twice: [`crate::portable::attention_codes`]
//! and [`crate::avx2::attention_codes`] (with AVX2 and FMA), which give the same bits;
//! [`crate::Isa::attention_codes`] picks one.

#[cfg(target_arch = "x86_64")]
use crate::LANES;
use crate::{padded, portable, AttentionShape};

/// How [`attention_codes`](crate::portable::attention_codes) turns a row of scores into codes (the
/// model's normalisations).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CodesNorm {
    /// Softmax over the visible keys.
    Softmax,
    /// None: the scores are the codes (0 where masked; linear attention).
    Identity,
    /// RMSHead `m / sqrt(mean_h m^2 + eps)` over the heads of each (query, key) pair, with this
    /// `eps`.
    RmsHead(f32),
}

/// One problem's attention buffers for [`attention_codes`](crate::portable::attention_codes): a row
/// of scores and its `exp` over the padded keys, two rows each `[2 Tp]`; the codes `[H, T, T]`;
/// RMSHead's scales `[T * T]`; keys and values transposed and padded `[H, d, Tp]` (the padding stays
/// zero).
#[derive(Debug, Clone)]
pub struct AttentionScratch {
    /// Scores of one or two rows over the padded keys.
    pub s: Vec<f32>,
    /// Their `exp`.
    pub e: Vec<f32>,
    /// The codes `[H, T, T]`.
    pub att: Vec<f32>,
    /// RMSHead's scales `[T * T]`.
    pub r: Vec<f32>,
    /// The keys transposed and padded, `[H, d, Tp]`.
    pub kt: Vec<f32>,
    /// The values transposed and padded, `[H, d, Tp]`.
    pub vt: Vec<f32>,
}

impl AttentionScratch {
    /// Zeroed buffers for `t` tokens, `h` heads of width `d`.
    pub fn new(t: usize, h: usize, d: usize) -> AttentionScratch {
        let tp = padded(t);
        AttentionScratch {
            s: vec![0.0; 2 * tp],
            e: vec![0.0; 2 * tp],
            att: vec![0.0; h * t * t],
            r: vec![0.0; t * t],
            kt: vec![0.0; tp * h * d],
            vt: vec![0.0; tp * h * d],
        }
    }
}

/// One problem's codes at one layer, from its Q, K and V rows `qkv [T, 3 H d]` and the layer's
/// padded position bias `[H, T, Tp]`: keys and values transposed to `w.kt`, `w.vt` `[H, d, Tp]`
/// (so that the loops run over contiguous keys; the padded keys stay zero);
/// per head and query the scaled scores plus bias,
/// `s[j] = (sum_e q[i, h, e] k[h, e, j]) / sqrt(d) + bias[h, i, j]`, over the `Tp` padded keys
/// (`-inf` on the padding), normalised at once into the codes `w.att [H, T, T]` (the model's
/// reference `normalise`): softmax over the visible keys; none (0 where masked); RMSHead over the
/// heads of each pair. Only the queries from `q0` are computed; the rows of earlier ones are NaN.
/// `AVX2`: the transposes and the scores by [`crate::avx2::transpose_kv`] and
/// [`crate::avx2::scores`] (only in [`crate::avx2::attention_codes`], which runs where the CPU has
/// AVX2 and FMA).
///
/// # Shapes
/// `visible [T * T]` (none: every key visible), `qkv [T, 3 H d]`, `bias [H, T, Tp]`.
#[inline(always)]
pub(crate) fn codes<const AVX2: bool>(
    shape: &AttentionShape,
    norm: CodesNorm,
    visible: Option<&[bool]>,
    q0: usize,
    qkv: &[f32],
    bias: &[f32],
    w: &mut AttentionScratch,
) {
    let (t, tp, h, d) = (shape.t, shape.tp, shape.h, shape.d);
    let hd = h * d;
    transpose_kv::<AVX2>(qkv, (t, tp, hd), &mut w.kt, &mut w.vt);
    for hh in 0..h {
        w.att[hh * t * t..][..q0 * t].fill(f32::NAN);
        let kt = &w.kt[hh * d * tp..][..d * tp];
        if norm == CodesNorm::Softmax && visible.is_none() {
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
            if norm != CodesNorm::Softmax && vis.is_none() {
                // The scores are the codes (RMSHead scales them below): straight into the row.
                score_row::<AVX2>(q, kt, shape.scale, b, a);
                continue;
            }
            let s = &mut w.s[..tp];
            score_row::<AVX2>(q, kt, shape.scale, b, s);
            // (Softmax with every key visible took the two-row path above.)
            match (norm, vis) {
                (CodesNorm::Softmax, vis) => portable::softmax_row(&s[..t], vis, a),
                (_, None) => a.copy_from_slice(&s[..t]),
                (_, Some(vis)) => {
                    for ((a, &x), &on) in a.iter_mut().zip(&s[..t]).zip(vis) {
                        *a = if on { x } else { 0.0 };
                    }
                }
            }
        }
    }
    if let CodesNorm::RmsHead(eps) = norm {
        // RMSHead's scales, shared with the model's training kernel.
        portable::rms_head(q0 * t, eps, &mut w.att, &mut w.r);
    }
}

/// One problem's keys and values transposed ([`portable::transpose_kv`]); by
/// [`crate::avx2::transpose_kv`] when `AVX2` and `H d` is a multiple of [`crate::LANES`].
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
            crate::avx2::transpose_kv(qkv, (t, tp, hd), kt, vt);
        }
        return;
    }
    portable::transpose_kv(qkv, (t, tp, hd), kt, vt);
}

/// One row of scaled scores plus bias ([`portable::scores`]); by [`crate::avx2::scores`] when
/// `AVX2` (in [`codes`]'s AVX2 copy).
#[inline(always)]
fn score_row<const AVX2: bool>(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `codes::<true>` is only called from `avx2::attention_codes`, which runs only
        // where the CPU has AVX2 and FMA (`Isa::attention_codes`).
        #[allow(unsafe_code)]
        unsafe {
            crate::avx2::scores(q, kt, scale, b, s);
        }
        return;
    }
    portable::scores(q, kt, scale, b, s);
}
