//! A single-pass CPU kernel for the second half of a HYLA-style mix: the normalisation of the
//! scores (RMSHead, none or softmax), attention dropout and the `mlp_relu` / `mlp_linear` value
//! network, forward and backward.
//!
//! As candle operations ([`super::fused::mlp_value_mix`]) this half is some twenty passes over
//! `[B, H, Q, K]` tensors (transposes, broadcast products, batched matrix products of 36 x 16 by
//! 16 x 4 matrices, their gradients); on the base SRAVEN model each is 2.65 M floats, larger than
//! the caches, and together they took 44 % of a CPU training step (`perf`, base HYLA model, one
//! thread). Here one loop over the queries of each problem does all of it, with every inner loop
//! running over the keys of one row (contiguous, so that it vectorises); the backward pass
//! recomputes the codes and hidden units from the scores instead of reading stored intermediates.
//! With the kernel the mix takes about 15 % of the step, and a 30-step training run of the base
//! HYLA model uses 12 % less CPU time (user + system, one thread: 17.5 s before, 15.4 s after).
//! The standard value network of softmax and linear attention is left to candle: there the
//! composed form is a fused softmax, a dropout product and batched 36 x 36 by 36 x 4 matrix
//! products that gemm does well, and the same loop written for it made a CPU step of the base
//! softmax model slower (0.45-0.47 s against 0.39-0.41 s, one thread, 2026-11-23) and of linear
//! attention too (0.365 against 0.342 s). With softmax normalisation (`softmax-hypatt`) the kernel
//! takes a step from 0.54 to 0.51 s.
//! Problems are independent and run in parallel (rayon, on the calling thread when it has one
//! thread: [`super::cpu::for_block_pairs`]); each problem's sums run in a fixed order,
//! so the result does not depend on the number of threads.
//!
//! For each problem `b` and pair `(i, j)` (query, key), with `m[h] = s[b,h,i,j]` where visible and
//! 0 where masked, the latent code `a[h]` is
//! - RMSHead: `a[h] = m[h] r` with `r = 1 / sqrt(mean_h m[h]^2 + eps)` (over the heads of a pair);
//! - none: `a[h] = m[h]`;
//! - softmax: `a[h] = exp(s[b,h,i,j] - max) / sum_j' exp(..)` over the visible keys of row
//!   `(h, i)`, 0 where masked (a row with no visible key is uniform, as the reference's fill with
//!   the lowest float gives);
//!
//! and `a'[h] = a[h] drop[i,j]`. Then
//! - forward: `pre[d] = sum_h a'[h] v[b,h,j,d]`, `hid = relu(pre)` (or `pre`),
//!   `o[b,i,h,d] = sum_j a'[h] hid[d]`;
//! - backward, from `go = dL/do`: `g_hid[d] = sum_h a'[h] go[b,i,h,d]`, `g_pre = g_hid [pre > 0]`,
//!   `g_a'[h] = sum_d go[b,i,h,d] hid[d] + sum_d g_pre[d] v[b,h,j,d]`,
//!   `g_v[b,h,j,d] = sum_i a'[h] g_pre[d]`,
//!
//! and `g_a = g_a' drop[i,j]`, then through the normalisation (0 where masked): RMSHead
//! `g_s[h] = g_a[h] r - m[h] r^3 mean_h(g_a m)`; none `g_s = g_a`; softmax
//! `g_s[j] = a[j] (g_a[j] - sum_j' a[j'] g_a[j'])` along the row.
//!
//! These are the formulas of [`super::fused::mlp_value_mix`] and [`super::fused::softmax_last_dim`]
//! (their tests check them against candle's autodiff), evaluated per pair; the tests below check
//! the kernel against candle's float64 autodiff of the composed operations for the five mixers it
//! serves.
//! Source: `docs/spec/models.md` ("Value networks"), the paper's `DotProductAttention` and
//! `linear_hypatt` (`hyla/models/attention.py`).
//!
//! The kernel runs on the CPU in float32 under [`crate::ops::Ops::Fast`], for
//! masks and dropout multipliers shared by the batch and the heads (`[Q, K]` up to leading axes of
//! 1). The standard value network, other devices and dtypes, and other mask shapes take the
//! candle-operation forms.

use candle_core::{DType, Device, Tensor};

use super::cpu::{for_block_pairs, with_tensor};
use super::{attach, Gradient};
use crate::error::Result;
use crate::mixer::{Mixer, Normalisation, ValueNetwork};

/// The sizes and the per-pair constants of one mix.
pub(crate) struct Plan {
    /// Heads.
    h: usize,
    /// Queries.
    q: usize,
    /// Keys.
    k: usize,
    /// Head width.
    d: usize,
    /// The normalisation of the scores.
    norm: Normalisation,
    /// ReLU value network (else linear).
    relu: bool,
    /// Visibility per pair `[Q * K]` (none: all visible).
    visible: Option<Vec<bool>>,
    /// Dropout multipliers per pair, one `[Q * K]` mask per group of `per_mask` consecutive
    /// problems, `[G * Q * K]` (none: 1).
    dropout: Option<Vec<f32>>,
    /// Problems that share one dropout mask (all of them for a mask shared by the batch; the
    /// problems of one model in a stacked batch).
    per_mask: usize,
}

impl Plan {
    /// The plan of an evaluation-mode mix (no dropout) of problems with `h` heads, `q` queries, `k`
    /// keys of width `d`, for [`crate::infer`]; `visible` is `[Q * K]` (none: all visible).
    pub(crate) fn evaluation(
        h: usize,
        (q, k): (usize, usize),
        d: usize,
        norm: Normalisation,
        relu: bool,
        visible: Option<Vec<bool>>,
    ) -> Plan {
        Plan {
            h,
            q,
            k,
            d,
            norm,
            relu,
            visible,
            dropout: None,
            per_mask: 1,
        }
    }

    /// The dropout multipliers of problem `n`, `[Q * K]`.
    fn dropout_of(&self, n: usize) -> Option<&[f32]> {
        let qk = self.q * self.k;
        self.dropout
            .as_ref()
            .map(|v| &v[(n / self.per_mask.max(1)) * qk..][..qk])
    }
}

/// `y += a x`, elementwise.
#[inline]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `sum_j x[j] y[j]`, with eight partial sums (so that it vectorises; a fixed order).
#[inline(always)]
pub(crate) fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for l in 0..8 {
            acc[l] += a[l] * b[l];
        }
    }
    let mut tail = 0f32;
    for (a, b) in xr.iter().zip(yr) {
        tail += a * b;
    }
    acc.iter().sum::<f32>() + tail
}

/// Scratch rows of one problem, laid out with the key axis last (`[.., K]`) so that every inner
/// loop runs over contiguous keys. [`crate::infer`] keeps one per worker and refills it per problem
/// ([`Rows::load`]), so that its value networks allocate nothing.
pub(crate) struct Rows {
    /// The values transposed to `[H, d, K]`.
    vt: Vec<f32>,
    /// Masked scores of query `i`, `[H, K]`.
    m: Vec<f32>,
    /// `1 / rms` over heads, `[K]` (ones without RMSHead).
    r: Vec<f32>,
    /// The codes (normalised scores) of query `i`, `[H, K]`.
    a: Vec<f32>,
    /// Codes after dropout, `[H, K]`.
    ad: Vec<f32>,
    /// Hidden units before and after the activation, `[d, K]`.
    pre: Vec<f32>,
    /// See `pre`.
    hid: Vec<f32>,
    /// The hidden units with the keys padded to a multiple of 8, `[d, Kp]`
    /// ([`value_from_codes_avx2`]).
    hid_padded: Vec<f32>,
}

impl Rows {
    /// Buffers for `p`, with the values `v [H, K, d]` of one problem transposed in.
    pub(crate) fn new(p: &Plan, v: &[f32]) -> Rows {
        let (h, k, d) = (p.h, p.k, p.d);
        let mut rows = Rows {
            vt: vec![0f32; h * d * k],
            m: vec![0f32; h * k],
            r: vec![1f32; k],
            a: vec![0f32; h * k],
            ad: vec![0f32; h * k],
            pre: vec![0f32; d * k],
            hid: vec![0f32; d * k],
            hid_padded: vec![0f32; d * k.div_ceil(8) * 8],
        };
        rows.load(p, v);
        rows
    }

    /// Transposes the values `v [H, K, d]` of one problem into `self.vt [H, d, K]`.
    #[inline(always)]
    pub(crate) fn load(&mut self, p: &Plan, v: &[f32]) {
        let (h, k, d) = (p.h, p.k, p.d);
        for hh in 0..h {
            for j in 0..k {
                for e in 0..d {
                    self.vt[(hh * d + e) * k + j] = v[(hh * k + j) * d + e];
                }
            }
        }
    }

    /// The codes and hidden units of query `i` against every key, from the scores `s [H, Q, K]`.
    fn query(&mut self, p: &Plan, s: &[f32], drop: Option<&[f32]>, i: usize) {
        self.codes(p, s, i);
        self.hidden(p, drop, i);
    }

    /// The codes of query `i` against every key (`self.a`), from the scores `s [H, Q, K]`.
    fn codes(&mut self, p: &Plan, s: &[f32], i: usize) {
        let (h, k) = (p.h, p.k);
        let vis = p.visible.as_ref().map(|v| &v[i * k..][..k]);
        for hh in 0..h {
            let row = &s[(hh * p.q + i) * k..][..k];
            let m = &mut self.m[hh * k..][..k];
            match vis {
                Some(vis) => {
                    for ((m, &x), &on) in m.iter_mut().zip(row).zip(vis) {
                        *m = if on { x } else { 0.0 };
                    }
                }
                None => m.copy_from_slice(row),
            }
        }
        match p.norm {
            Normalisation::RmsHead => {
                rms_head_scales(&self.m, k, 0, &mut self.r);
                for (a, m) in self.a.chunks_exact_mut(k).zip(self.m.chunks_exact(k)) {
                    for ((a, &x), &r) in a.iter_mut().zip(m).zip(&self.r) {
                        *a = x * r;
                    }
                }
            }
            Normalisation::None => self.a.copy_from_slice(&self.m),
            Normalisation::Softmax => {
                for hh in 0..h {
                    let row = &s[(hh * p.q + i) * k..][..k];
                    softmax_row(row, vis, &mut self.a[hh * k..][..k]);
                }
            }
        }
    }

    /// The codes after dropout and the hidden units of query `i` from the codes in `self.a`.
    fn hidden(&mut self, p: &Plan, drop: Option<&[f32]>, i: usize) {
        let k = p.k;
        let drop = drop.map(|v| &v[i * k..][..k]);
        match drop {
            Some(dr) => {
                for (ad, a) in self.ad.chunks_exact_mut(k).zip(self.a.chunks_exact(k)) {
                    for ((y, &x), &dr) in ad.iter_mut().zip(a).zip(dr) {
                        *y = x * dr;
                    }
                }
            }
            None => self.ad.copy_from_slice(&self.a),
        }
        Rows::hidden_from(
            p,
            (&self.vt, k),
            (&self.ad, k),
            &mut self.pre,
            &mut self.hid,
        );
    }

    /// The hidden units of one query into `hid [d, K]` (`pre [d, K]` before the activation),
    /// from the values `vt [H, d, Kv]` (rows of `vs = Kv >= K` floats, the keys first: `Rows::vt`
    /// has `Kv = K`, `crate::infer`'s padded values more) and its codes after dropout `ad`, head
    /// `hh`'s `K` codes at `ad[hh * stride..]` (in `Rows::ad`: stride `K`; in codes `[H, Q, K]`:
    /// stride `Q K`).
    // Inlined so that `crate::infer`'s copies compiled for wider vector units cover it.
    #[inline(always)]
    fn hidden_from(
        p: &Plan,
        (vt, vs): (&[f32], usize),
        (ad, stride): (&[f32], usize),
        pre: &mut [f32],
        hid: &mut [f32],
    ) {
        let (h, k, d) = (p.h, p.k, p.d);
        pre.fill(0.0);
        for hh in 0..h {
            let ad = &ad[hh * stride..][..k];
            for e in 0..d {
                let pre = &mut pre[e * k..][..k];
                for ((x, &a), &v) in pre.iter_mut().zip(ad).zip(&vt[(hh * d + e) * vs..][..k]) {
                    *x += a * v;
                }
            }
        }
        for (y, &x) in hid.iter_mut().zip(pre.iter()) {
            *y = if p.relu { x.max(0.0) } else { x };
        }
    }
}

/// RMSHead's scale of every pair (the paper's Eq. 5): for `m`, `H` rows of `stride` scores (one
/// row per head), `r[j - p0] = 1 / sqrt(mean_h m[h, j]^2 + eps)` for the pairs `j` from `p0`, the
/// sum over the heads in order. `r` has `stride - p0` entries.
#[inline(always)]
pub(crate) fn rms_head_scales(m: &[f32], stride: usize, p0: usize, r: &mut [f32]) {
    let h = m.len() / stride;
    r.fill(0.0);
    for head in m.chunks_exact(stride) {
        for (s, &x) in r.iter_mut().zip(&head[p0..]) {
            *s += x * x;
        }
    }
    let eps = crate::ops::reference::RMS_HEAD_EPS as f32;
    for s in r.iter_mut() {
        *s = 1.0 / (*s / h as f32 + eps).sqrt();
    }
}

/// The softmax of one row of scores over its visible keys (`vis`, none: all), 0 where masked; a
/// row with no visible key is uniform (the reference fills masked scores with the lowest float,
/// so such a row is all equal).
pub(crate) fn softmax_row(row: &[f32], vis: Option<&[bool]>, a: &mut [f32]) {
    let on = |j: usize| vis.is_none_or(|v| v[j]);
    let mut mx = f32::NEG_INFINITY;
    for (j, &x) in row.iter().enumerate() {
        if on(j) && x > mx {
            mx = x;
        }
    }
    if mx == f32::NEG_INFINITY {
        a.fill(1.0 / row.len() as f32);
        return;
    }
    let mut sum = 0f32;
    for (j, (a, &x)) in a.iter_mut().zip(row).enumerate() {
        *a = if on(j) { (x - mx).exp() } else { 0.0 };
        sum += *a;
    }
    let inv = 1.0 / sum;
    for a in a.iter_mut() {
        *a *= inv;
    }
}

/// The forward pass of one problem: `s [H, Q, K]`, `v [H, K, d]`, its dropout multipliers
/// `drop [Q, K]` -> `o [Q, H, d]`, attention `[H, Q, K]` (the codes before dropout).
fn forward_one(
    p: &Plan,
    s: &[f32],
    v: &[f32],
    drop: Option<&[f32]>,
    o: &mut [f32],
    att: &mut [f32],
) {
    let (h, q, k, d) = (p.h, p.q, p.k, p.d);
    let mut rows = Rows::new(p, v);
    for i in 0..q {
        rows.query(p, s, drop, i);
        for hh in 0..h {
            att[(hh * q + i) * k..][..k].copy_from_slice(&rows.a[hh * k..][..k]);
            let ad = &rows.ad[hh * k..][..k];
            for e in 0..d {
                o[(i * h + hh) * d + e] = dot(ad, &rows.hid[e * k..][..k]);
            }
        }
    }
}

/// The evaluation-mode value network of one problem from its codes (no dropout): `a [H, Q, K]`
/// and the values transposed, `vt [H, d, Kv]` (rows of `vs = Kv >= K` floats, the keys first:
/// `crate::infer`'s padded values) -> `o [Q, H, d]`; the second half of [`forward_one`], for
/// [`crate::infer`], whose hooks may have changed the codes; the queries from `q0` only. `rows` is
/// scratch made by [`Rows::new`] for `p` (any values).
#[inline(always)]
pub(crate) fn value_from_codes(
    p: &Plan,
    q0: usize,
    a: &[f32],
    (vt, vs): (&[f32], usize),
    o: &mut [f32],
    rows: &mut Rows,
) {
    let (h, q, k, d) = (p.h, p.q, p.k, p.d);
    for i in q0..q {
        // Without dropout the codes after dropout are the codes, read where they are.
        Rows::hidden_from(
            p,
            (vt, vs),
            (&a[i * k..], q * k),
            &mut rows.pre,
            &mut rows.hid,
        );
        for hh in 0..h {
            let ad = &a[(hh * q + i) * k..][..k];
            for e in 0..d {
                o[(i * h + hh) * d + e] = dot(ad, &rows.hid[e * k..][..k]);
            }
        }
    }
}

/// [`value_from_codes`] written with the AVX2 intrinsics, for [`crate::infer`]'s AVX2 kernels:
/// the values come transposed and padded, `vt [H, d, Kp]` (`Kp` = `K` rounded up to a multiple of
/// 8, zero past `K`), so that the hidden units are whole vectors of keys (a query's codes past `K`
/// are read as zero by masked loads). Every hidden unit is the same sum over the heads in the same
/// order, and every output the same [`dot`] (eight lanes over the whole chunks of 8 keys, summed in
/// lane order, plus the remaining keys summed in order), products and sums rounded apart (no FMA):
/// the same bits as [`value_from_codes`]. The portable loops, compiled for AVX2, spent most of
/// their instructions on bounds checks and 4-key tails (`docs/performance.md`).
///
/// Head widths other than 1, 2, 4 and 8 take [`value_from_codes`].
///
/// # Shapes
/// `a [H, Q, K]`, `vt [H, d, Kp]`, `o [Q, H, d]`; the queries from `q0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn value_from_codes_avx2(
    p: &Plan,
    q0: usize,
    a: &[f32],
    vt: &[f32],
    o: &mut [f32],
    rows: &mut Rows,
) {
    match p.d {
        1 => value_rows_avx2::<1>(p, q0, a, vt, o, rows),
        2 => value_rows_avx2::<2>(p, q0, a, vt, o, rows),
        4 => value_rows_avx2::<4>(p, q0, a, vt, o, rows),
        8 => value_rows_avx2::<8>(p, q0, a, vt, o, rows),
        _ => value_from_codes(p, q0, a, (vt, p.k.div_ceil(8) * 8), o, rows),
    }
}

/// [`value_from_codes_avx2`] for head width `D`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn value_rows_avx2<const D: usize>(
    p: &Plan,
    q0: usize,
    a: &[f32],
    vt: &[f32],
    o: &mut [f32],
    rows: &mut Rows,
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
            && rows.hid_padded.len() >= D * kp,
        "value_from_codes_avx2: a plan of {h} heads, {q} queries, {k} keys and width {D} against {} codes, {} values, {} outputs",
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
        let hid = rows.hid_padded.as_mut_ptr();
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
                // SAFETY: `e Kp + 8 c + 8 <= D Kp <= rows.hid_padded.len()`.
                unsafe { _mm256_storeu_ps(hid.add(e * kp + c * L), y) };
            }
        }
        // The outputs `o[i, h, e] = dot(a[h, i, ..], hid[e, ..])`.
        for hh in 0..h {
            dots_avx2::<D>(
                &a[(hh * q + i) * k..][..k],
                (&rows.hid_padded, kp),
                &mut o[(i * h + hh) * D..][..D],
            );
        }
    }
}

/// `out[e] = dot(x, y[e Ys..][..K])` for the `D` rows of `y` (row stride `Ys`), summed as [`dot`]
/// sums (eight lanes over the whole chunks of 8, the lanes in order, plus the remaining products in
/// order; products and sums rounded apart), so the same bits, with the AVX2 intrinsics; `x` is
/// loaded once for the `D` rows.
///
/// # Shapes
/// `x [K]`, `y [D, Ys]` with `Ys >= K`, `out [D]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(unsafe_code)]
pub(crate) fn dots_avx2<const D: usize>(x: &[f32], (y, ys): (&[f32], usize), out: &mut [f32]) {
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

/// The backward pass of one problem (dropout multipliers `drop [Q, K]`): from `go [Q, H, d]`,
/// `g_s [H, Q, K]` and `g_v [H, K, d]`.
fn backward_one(
    p: &Plan,
    s: &[f32],
    v: &[f32],
    drop: Option<&[f32]>,
    go: &[f32],
    gs: &mut [f32],
    gv: &mut [f32],
) {
    let (h, q, k, d) = (p.h, p.q, p.k, p.d);
    let mut rows = Rows::new(p, v);
    let mut gpre = vec![0f32; d * k];
    let mut ga = vec![0f32; h * k];
    let mut gvt = vec![0f32; h * d * k];
    let mut c = vec![0f32; k];
    for i in 0..q {
        rows.query(p, s, drop, i);
        let go = &go[i * h * d..][..h * d];
        gpre.fill(0.0);
        for hh in 0..h {
            for e in 0..d {
                axpy(
                    &mut gpre[e * k..][..k],
                    go[hh * d + e],
                    &rows.ad[hh * k..][..k],
                );
            }
        }
        if p.relu {
            for (g, &x) in gpre.iter_mut().zip(&rows.pre) {
                if x <= 0.0 {
                    *g = 0.0;
                }
            }
        }
        for hh in 0..h {
            let ga = &mut ga[hh * k..][..k];
            ga.fill(0.0);
            for e in 0..d {
                let vt = &rows.vt[(hh * d + e) * k..][..k];
                let hid = &rows.hid[e * k..][..k];
                let gp = &gpre[e * k..][..k];
                let g = go[hh * d + e];
                for (((x, &y), &gp), &vv) in ga.iter_mut().zip(hid).zip(gp).zip(vt) {
                    *x += g * y + gp * vv;
                }
                let ad = &rows.ad[hh * k..][..k];
                for ((x, &a), &gp) in gvt[(hh * d + e) * k..][..k].iter_mut().zip(ad).zip(gp) {
                    *x += a * gp;
                }
            }
        }
        if let Some(drop) = drop.map(|v| &v[i * k..][..k]) {
            for ga in ga.chunks_exact_mut(k) {
                for (x, &dr) in ga.iter_mut().zip(drop) {
                    *x *= dr;
                }
            }
        }
        if p.norm == Normalisation::RmsHead {
            c.fill(0.0);
            for (ga, m) in ga.chunks_exact(k).zip(rows.m.chunks_exact(k)) {
                for ((c, &g), &x) in c.iter_mut().zip(ga).zip(m) {
                    *c += g * x;
                }
            }
            for (c, &r) in c.iter_mut().zip(&rows.r) {
                *c = *c / h as f32 * r * r * r;
            }
        }
        let vis = p.visible.as_ref().map(|v| &v[i * k..][..k]);
        for hh in 0..h {
            let out = &mut gs[(hh * q + i) * k..][..k];
            let ga = &ga[hh * k..][..k];
            match p.norm {
                Normalisation::RmsHead => {
                    let m = &rows.m[hh * k..][..k];
                    for j in 0..k {
                        out[j] = ga[j] * rows.r[j] - m[j] * c[j];
                    }
                }
                Normalisation::None => out.copy_from_slice(ga),
                Normalisation::Softmax => {
                    let a = &rows.a[hh * k..][..k];
                    let t = dot(a, ga);
                    for ((y, &a), &g) in out.iter_mut().zip(a).zip(ga) {
                        *y = a * (g - t);
                    }
                }
            }
            if let Some(vis) = vis {
                for (y, &on) in out.iter_mut().zip(vis) {
                    if !on {
                        *y = 0.0;
                    }
                }
            }
        }
    }
    for hh in 0..h {
        for j in 0..k {
            for e in 0..d {
                gv[(hh * k + j) * d + e] = gvt[(hh * d + e) * k + j];
            }
        }
    }
}

/// A per-pair tensor (mask or dropout) as `Q * K` floats, if it is shared by batch and heads.
fn per_pair(t: &Tensor, q: usize, k: usize) -> Result<Option<Vec<f32>>> {
    let dims = t.dims();
    let shared = dims.len() >= 2
        && dims[dims.len() - 2..] == [q, k]
        && dims[..dims.len() - 2].iter().all(|&n| n == 1);
    if !shared {
        return Ok(None);
    }
    Ok(Some(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?))
}

/// Per-group multipliers `[G, 1, Q, K]` with `G` dividing the `B` problems (the per-model dropout
/// masks of a stacked batch, model-major): the `G * Q * K` floats and the problems per group.
fn per_group(t: &Tensor, b: usize, q: usize, k: usize) -> Result<Option<(Vec<f32>, usize)>> {
    match t.dims() {
        &[g, 1, tq, tk] if g > 0 && b.is_multiple_of(g) && (tq, tk) == (q, k) => Ok(Some((
            t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
            b / g,
        ))),
        _ => Ok(None),
    }
}

/// The second half of [`crate::attention::mix`] by the kernel (module docs), or `None` where the
/// kernel does not apply (the standard value network, not the CPU in float32 with the fast paths
/// on, a mask or dropout multiplier that is not shared by batch and heads).
///
/// # Shapes
/// `scores [B, H, Q, K]` (scaled, with the bias), `v [B, H, K, d]`, `mask` `u8` and `dropout`
/// broadcastable to `[B, H, Q, K]`, or `dropout [G, 1, Q, K]` with one mask per `B / G`
/// consecutive problems ([`crate::ops::Ops::mix`]); returns `(o [B, Q, H, d], attention [B, H, Q, K])` as
/// [`crate::attention::mix`]. Differentiable in `scores` and `v` (the attention is not: it is the
/// latent code, an output).
///
/// # Errors
/// Candle errors on inconsistent shapes.
pub(crate) fn mix(
    scores: &Tensor,
    v: &Tensor,
    mixer: Mixer,
    mask: Option<&Tensor>,
    dropout: Option<&Tensor>,
) -> Result<Option<(Tensor, Tensor)>> {
    let normalisation = mixer.normalisation();
    let relu = match mixer.value_network() {
        ValueNetwork::MlpRelu => true,
        ValueNetwork::MlpLinear => false,
        ValueNetwork::Default => return Ok(None),
    };
    if !super::cpu_f32(scores) {
        return Ok(None);
    }
    let (b, h, q, k) = scores.dims4()?;
    let (vb, vh, vk, d) = v.dims4()?;
    if (vb, vh, vk) != (b, h, k) || v.dtype() != DType::F32 || !v.device().is_cpu() {
        return Ok(None);
    }
    let visible = match mask.map(|m| per_pair(m, q, k)).transpose()? {
        Some(None) => return Ok(None),
        Some(Some(m)) => Some(m.into_iter().map(|x| x != 0.0).collect()),
        None => None,
    };
    let (dropout, per_mask) = match dropout {
        None => (None, b),
        Some(t) => match per_pair(t, q, k)? {
            Some(m) => (Some(m), b),
            None => match per_group(t, b, q, k)? {
                Some((m, per_mask)) => (Some(m), per_mask),
                None => return Ok(None),
            },
        },
    };
    let plan = Plan {
        h,
        q,
        k,
        d,
        norm: normalisation,
        relu,
        visible,
        dropout,
        per_mask,
    };
    let (s, v) = (scores.contiguous()?, v.contiguous()?);
    let (mut o, mut att) = (vec![0f32; b * q * h * d], vec![0f32; b * h * q * k]);
    with_tensor(&s, |sd| {
        with_tensor(&v, |vd| {
            for_block_pairs(&mut o, q * h * d, &mut att, h * q * k, |n, o, att| {
                let s = &sd[n * h * q * k..][..h * q * k];
                let v = &vd[n * h * k * d..][..h * k * d];
                forward_one(&plan, s, v, plan.dropout_of(n), o, att);
            })
        })
    })??;
    let o = Tensor::from_vec(o, (b, q, h, d), &Device::Cpu)?;
    let att = Tensor::from_vec(att, (b, h, q, k), &Device::Cpu)?;
    let node = MixKernel { plan, b };
    Ok(Some((attach(&[&s, &v], o, node)?, att)))
}

/// The gradient of [`mix`]: the plan; the backward pass is the kernel's second pass.
struct MixKernel {
    /// Sizes, mask and dropout.
    plan: Plan,
    /// Problems.
    b: usize,
}

impl Gradient for MixKernel {
    const NAME: &'static str = "hyperlens-mix-kernel";

    fn gradients(&self, inputs: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (s, v) = (inputs[0], inputs[1]);
        let p = &self.plan;
        let (b, h, q, k, d) = (self.b, p.h, p.q, p.k, p.d);
        let (mut gs, mut gv) = (vec![0f32; b * h * q * k], vec![0f32; b * h * k * d]);
        with_tensor(s, |sd| {
            with_tensor(v, |vd| {
                with_tensor(g, |gd| {
                    for_block_pairs(&mut gs, h * q * k, &mut gv, h * k * d, |n, gs, gv| {
                        let s = &sd[n * h * q * k..][..h * q * k];
                        let v = &vd[n * h * k * d..][..h * k * d];
                        let go = &gd[n * q * h * d..][..q * h * d];
                        backward_one(p, s, v, p.dropout_of(n), go, gs, gv);
                    })
                })
            })
        })???;
        let gs = Tensor::from_vec(gs, (b, h, q, k), &Device::Cpu)?;
        let gv = Tensor::from_vec(gv, (b, h, k, d), &Device::Cpu)?;
        Ok(vec![Some(gs), Some(gv)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::reference;
    use crate::ops::test_util::{bits, close};
    use crate::ops::Ops;
    use candle_core::Var;

    /// The kernel's output, codes and gradients against candle's autodiff of the composed
    /// operations in float64 on the same inputs, for the five mixers it serves (those with an MLP
    /// value network), with and without a causal mask and dropout.
    #[test]
    fn kernel_matches_float64_autodiff_of_the_composed_ops() {
        let (mask, drop, s, v, c) = crate::ops::test_util::mix_inputs((3, 5, 7, 4), 11);
        let s64 = Var::from_tensor(&s.to_dtype(DType::F64).unwrap()).unwrap();
        let v64 = Var::from_tensor(&v.to_dtype(DType::F64).unwrap()).unwrap();
        let c64 = c.to_dtype(DType::F64).unwrap();
        let drop64 = drop.to_dtype(DType::F64).unwrap();
        for mixer in Mixer::ALL {
            if mixer.value_network() == ValueNetwork::Default {
                continue;
            }
            for masked in [true, false] {
                let (m, dr, dr64) = if masked {
                    (Some(&mask), Some(&drop), Some(&drop64))
                } else {
                    (None, None, None)
                };
                let (o, a) = mix(s.as_tensor(), v.as_tensor(), mixer, m, dr)
                    .unwrap()
                    .expect("the kernel applies");
                let g = (&o * &c).unwrap().sum_all().unwrap().backward().unwrap();
                let (o64, a64) = reference::mix(
                    Ops::Reference,
                    s64.as_tensor(),
                    v64.as_tensor(),
                    mixer,
                    m,
                    dr64,
                )
                .unwrap();
                let g64 = (&o64 * &c64)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                close(&o, &o64, 1e-5);
                close(&a, &a64, 1e-5);
                close(
                    g.get(s.as_tensor()).unwrap(),
                    g64.get(s64.as_tensor()).unwrap(),
                    1e-4,
                );
                close(
                    g.get(v.as_tensor()).unwrap(),
                    g64.get(v64.as_tensor()).unwrap(),
                    1e-4,
                );
            }
        }
    }

    /// Each problem's result is that of the problem alone (problems are independent and run in
    /// parallel), bit for bit, for HYLA and softmax-hypatt; untracked inputs give no graph node.
    #[test]
    fn problems_are_independent_bit_for_bit() {
        for mixer in [Mixer::Hyla, Mixer::SoftmaxHypatt] {
            independent_bit_for_bit(mixer);
        }
    }

    fn independent_bit_for_bit(mixer: Mixer) {
        let dev = Device::Cpu;
        let (b, h, t, d) = (4, 3, 6, 2);
        let s = Var::randn(0f32, 1.0, (b, h, t, t), &dev).unwrap();
        let v = Var::randn(0f32, 1.0, (b, h, t, d), &dev).unwrap();
        let c = Tensor::randn(0f32, 1.0, (b, t, h, d), &dev).unwrap();
        let run = |s: &Tensor, v: &Tensor, c: &Tensor| {
            let (o, _) = mix(s, v, mixer, None, None).unwrap().unwrap();
            let g = (&o * c).unwrap().sum_all().unwrap().backward().unwrap();
            (bits(&o), bits(g.get(s).unwrap()), bits(g.get(v).unwrap()))
        };
        let (o, gs, gv) = run(s.as_tensor(), v.as_tensor(), &c);
        for n in 0..b {
            let one = |x: &Tensor| Var::from_tensor(&x.narrow(0, n, 1).unwrap()).unwrap();
            let (s1, v1) = (one(s.as_tensor()), one(v.as_tensor()));
            let (o1, gs1, gv1) = run(s1.as_tensor(), v1.as_tensor(), &c.narrow(0, n, 1).unwrap());
            assert_eq!(
                o[n * o1.len()..][..o1.len()],
                o1[..],
                "output of problem {n}"
            );
            assert_eq!(
                gs[n * gs1.len()..][..gs1.len()],
                gs1[..],
                "score gradient {n}"
            );
            assert_eq!(
                gv[n * gv1.len()..][..gv1.len()],
                gv1[..],
                "value gradient {n}"
            );
        }
        let (o, _) = mix(
            &s.as_tensor().detach(),
            &v.as_tensor().detach(),
            mixer,
            None,
            None,
        )
        .unwrap()
        .unwrap();
        assert!(!o.track_op());
    }

    /// The standard value network, float64 and a per-problem mask are left to the other forms, and
    /// only [`Ops::Fast`] runs the kernel.
    #[test]
    fn kernel_declines_what_it_does_not_cover() {
        let dev = Device::Cpu;
        let s = Tensor::randn(0f32, 1.0, (2, 3, 4, 4), &dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (2, 3, 4, 2), &dev).unwrap();
        let none = |s: &Tensor, v: &Tensor, n, m: Option<&Tensor>| {
            let mixer = if n == Normalisation::Softmax {
                Mixer::SoftmaxHypatt
            } else {
                Mixer::Hyla
            };
            mix(s, v, mixer, m, None).unwrap().is_none()
        };
        assert!(!none(&s, &v, Normalisation::Softmax, None));
        assert!(mix(&s, &v, Mixer::Softmax, None, None).unwrap().is_none());
        let (s64, v64) = (
            s.to_dtype(DType::F64).unwrap(),
            v.to_dtype(DType::F64).unwrap(),
        );
        assert!(none(&s64, &v64, Normalisation::RmsHead, None));
        let per_problem = Tensor::ones((2, 1, 4, 4), DType::U8, &dev).unwrap();
        assert!(none(&s, &v, Normalisation::RmsHead, Some(&per_problem)));
        let shared = Tensor::ones((1, 1, 4, 4), DType::U8, &dev).unwrap();
        assert!(!none(&s, &v, Normalisation::RmsHead, Some(&shared)));
        // Under the other choices the same mix gives the same codes without the kernel.
        let (_, a_fast) = Ops::Fast.mix(&s, &v, Mixer::Hyla, None, None).unwrap();
        let (_, a_ref) = Ops::Reference.mix(&s, &v, Mixer::Hyla, None, None).unwrap();
        close(&a_fast, &a_ref, 1e-5);
    }
}
