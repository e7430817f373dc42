//! The portable kernels: the one definition of each hand-written CPU operation, in plain Rust that
//! the compiler vectorises. The copies in [`crate::avx2`] and [`crate::avx512`] do these
//! operations in this order, so they give these bits.
//!
//! - the vectorisable `exp` ([`exp_reduced`]);
//! - the tanh GELU: its argument ([`gelu_tanh_arg`]), training's form with libm's `exp`
//!   ([`gelu_tanh`], [`gelu_tanh_backward`]) and the evaluation engine's with [`exp_reduced`]
//!   ([`gelu_tanh_reduced`], [`gelu_tanh_reduced_in_place`]);
//! - LayerNorm: the engine's forward ([`layer_norm`]) and training's backward
//!   ([`layer_norm_backward`]);
//! - the bias additions ([`add_rows`], [`add_biased`]);
//! - the rows of the attention: [`dot`], [`axpy`], RMSHead ([`rms_head_scales`], [`rms_head`]),
//!   the softmax of a row (masked, [`softmax_row`]; over padded keys, [`softmax_padded`]) and its
//!   gradient ([`softmax_backward`]), the K/V transposes ([`transpose_kv`]), the scores
//!   ([`scores`]) and the standard value network ([`default_value`]);
//! - the analyses' kernels: the blocked squared distances ([`squared_distances`]) and one row of
//!   the exact t-SNE gradient ([`tsne_gradient_row`]);
//! - the language models' kernels (`lm.rs`): [`silu_mul`], [`softmax_prefix`], [`rope_half`],
//!   [`rms_norm`] and [`add_rms_norm`].

use crate::{AttentionScratch, AttentionShape, CodesNorm, DISTANCE_ROWS, LANES};

mod lm;
pub use lm::{add_rms_norm, rms_norm, rope_half, silu_mul, softmax_prefix, NORM_ROWS};

// ---------------------------------------------------------------------------------------------
// The vectorisable exp

/// `exp(x)` in float32, in a form the compiler vectorises:
/// `x = n ln 2 + r` with `n` rounded to the nearest integer (by adding and subtracting `1.5 2^23`,
/// which leaves `n` in the low bits) and `|r| <= ln 2 / 2`, `ln 2` split in two parts so that `r`
/// is exact; `e^r` by the degree-7 Taylor-style polynomial `1 + r + r^2 P(r)` with the minimax
/// coefficients of Cephes's `expf` (Moshier 1984); `2^n` by the exponent bits. The argument is
/// clamped to [-87.3, 88]: below, the result is `e^-87.3` (about 1e-38, nothing next to a softmax
/// row maximum's 1 or a sigmoid's 1); above, `e^88` (1.7e38, whose sigmoid is 0 all the same). NaN
/// stays NaN. Relative error at most 2.5e-7 against `f32::exp` over [-87, 88] (unit test).
#[inline(always)]
pub fn exp_reduced(x: f32) -> f32 {
    let (t, r) = exp_reduce(x);
    exp_finish(t, r)
}

/// The first steps of [`exp_reduced`]: the clamp, then `t` (which holds `n` in its low mantissa
/// bits, so that `2^n` comes from integer operations alone) and the reduced argument `r`.
#[inline(always)]
fn exp_reduce(x: f32) -> (f32, f32) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let x = if x < -87.3 { -87.3 } else { x };
    let x = if x > 88.0 { 88.0 } else { x };
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    (t, x - n * LN2_HI - n * LN2_LO)
}

/// The last steps of [`exp_reduced`]: `e^r` by the polynomial, times `2^n` from `t`'s bits.
#[inline(always)]
fn exp_finish(t: f32, r: f32) -> f32 {
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(t.to_bits().wrapping_add(127) << 23)
}

/// [`exp_reduced`] in place over a block, each step over the whole block before the next, so that
/// the floats' chains overlap (the same operations per float, so the same bits). (The softmax's
/// loop over a row keeps [`exp_reduced`]: blocks made it slower there.)
#[inline(always)]
pub(crate) fn exp_reduced_block<const W: usize>(x: &mut [f32; W]) {
    let (mut t, mut r) = ([0f32; W], [0f32; W]);
    for ((&x, t), r) in x.iter().zip(&mut t).zip(&mut r) {
        (*t, *r) = exp_reduce(x);
    }
    for ((x, &t), &r) in x.iter_mut().zip(&t).zip(&r) {
        *x = exp_finish(t, r);
    }
}

// ---------------------------------------------------------------------------------------------
// The tanh GELU

/// `2 sqrt(2 / pi)`.
const TWO_SQRT_2_OVER_PI: f32 = 1.595_769_2;
/// The cubic coefficient of the tanh GELU.
const GELU_CUBIC: f32 = 0.044715;

/// The argument of the tanh GELU's sigmoid, `z = c (x + 0.044715 x^3)` with `c = 2 sqrt(2 / pi)`:
/// the GELU is `x sigmoid(z)` (the same function as `0.5 x (1 + tanh(z / 2))`,
/// `jax.nn.gelu(approximate=True)`). The one definition that every form of the GELU here uses.
#[inline(always)]
pub fn gelu_tanh_arg(x: f32) -> f32 {
    TWO_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)
}

/// The logistic sigmoid in float32, with libm's `exp`.
#[inline]
pub fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// The tanh GELU of one value, `x sigmoid(z)` with `z` = [`gelu_tanh_arg`] and libm's `exp`:
/// training's form (the forward pass of `hyperlens-model`'s CPU GELU operation).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    x * sigmoid(gelu_tanh_arg(x))
}

/// The gradient of [`gelu_tanh`] times `g`: `g (s + x s (1 - s) c (1 + 3 * 0.044715 x^2))` with
/// `s = sigmoid(z)` (training's backward pass).
#[inline]
pub fn gelu_tanh_backward(x: f32, g: f32) -> f32 {
    let s = sigmoid(gelu_tanh_arg(x));
    let dz = TWO_SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x);
    g * (s + x * s * (1.0 - s) * dz)
}

/// The tanh GELU `x / (1 + e^-z)` with `z` = [`gelu_tanh_arg`] and the `exp` by [`exp_reduced`],
/// so that the loop over a row vectorises: the evaluation engine's form (within 1e-6 of
/// [`gelu_tanh`], unit test).
#[inline(always)]
pub fn gelu_tanh_reduced(x: f32) -> f32 {
    x / (1.0 + exp_reduced(-gelu_tanh_arg(x)))
}

/// [`gelu_tanh_reduced`] in place over a buffer: blocks of [`GELU_BLOCK`] floats step by step
/// (every step over the whole block before the next), then the tail one by one. Each float gets
/// [`gelu_tanh_reduced`]'s operations in its order, so the same bits.
#[inline(always)]
pub fn gelu_tanh_reduced_in_place(v: &mut [f32]) {
    let mut blocks = v.chunks_exact_mut(GELU_BLOCK);
    for block in &mut blocks {
        gelu_block(block.try_into().expect("a block of GELU_BLOCK floats"));
    }
    for v in blocks.into_remainder() {
        *v = gelu_tanh_reduced(*v);
    }
}

/// Floats per step of [`gelu_tanh_reduced_in_place`]: four AVX2 vectors, whose chains of some
/// thirty dependent operations then overlap. One vector at a time, the loop waited on each chain's
/// latency.
pub const GELU_BLOCK: usize = 4 * LANES;

/// [`gelu_tanh_reduced`] of a block, step by step: the argument of the sigmoid, then
/// [`exp_reduced`]'s steps, then the quotient, each over the whole block.
#[inline(always)]
fn gelu_block(v: &mut [f32; GELU_BLOCK]) {
    let mut u = [0f32; GELU_BLOCK];
    for (u, &x) in u.iter_mut().zip(v.iter()) {
        *u = -gelu_tanh_arg(x);
    }
    exp_reduced_block(&mut u);
    for (x, &e) in v.iter_mut().zip(&u) {
        *x /= 1.0 + e;
    }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm and the bias additions

/// LayerNorm over rows of `D = w.len()` entries, as candle's (`E[x^2] - mean^2` variance):
/// `y = (x - mean) / sqrt(var + eps) w + b`; the sums over eight lanes (the evaluation engine's).
#[inline(always)]
pub fn layer_norm(x: &[f32], (w, b): (&[f32], &[f32]), eps: f32, y: &mut [f32]) {
    let dm = w.len();
    for (x, y) in x.chunks_exact(dm).zip(y.chunks_exact_mut(dm)) {
        // Eight partial sums (a fixed order that vectorises), not one serial chain.
        let (mut s1, mut s2) = ([0f32; LANES], [0f32; LANES]);
        let chunks = x.chunks_exact(LANES);
        let (mut sum, mut sum2) = (0f32, 0f32);
        for &v in chunks.remainder() {
            sum += v;
            sum2 += v * v;
        }
        for c in chunks {
            for l in 0..LANES {
                s1[l] += c[l];
                s2[l] += c[l] * c[l];
            }
        }
        let sum = s1.iter().sum::<f32>() + sum;
        let sum2 = s2.iter().sum::<f32>() + sum2;
        let mean = sum / dm as f32;
        let var = sum2 / dm as f32 - mean * mean;
        let inv_std = (var + eps).sqrt().recip();
        for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
            *y = (x - mean) * inv_std * w + b;
        }
    }
}

/// The LayerNorm gradient over a block of rows of `D = w.len()` entries (training's backward
/// pass): per row `xhat = (x - mean) r`, `r = 1 / sqrt(var + eps)` (the variance of the centred
/// row), `gh = g w`, `dx = r (gh - mean(gh) - xhat mean(gh xhat))`; returns the block's
/// `(dw, db)` = `(sum_rows g xhat, sum_rows g)`, summed over its rows in order.
///
/// # Shapes
/// `x [rows, D]`, `w [D]`, `g [rows, D]`, `dx [rows, D]` -> `([D], [D])`.
pub fn layer_norm_backward(
    x: &[f32],
    w: &[f32],
    g: &[f32],
    eps: f32,
    dx: &mut [f32],
) -> (Vec<f32>, Vec<f32>) {
    let d = w.len();
    let n = d as f32;
    let (mut dw, mut db) = (vec![0f32; d], vec![0f32; d]);
    let (mut xhat, mut gh) = (vec![0f32; d], vec![0f32; d]);
    for ((x, g), dx) in x
        .chunks_exact(d)
        .zip(g.chunks_exact(d))
        .zip(dx.chunks_exact_mut(d))
    {
        let mean = x.iter().sum::<f32>() / n;
        let var = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / n;
        let r = 1.0 / (var + eps).sqrt();
        for (xh, &v) in xhat.iter_mut().zip(x) {
            *xh = (v - mean) * r;
        }
        let (mut m1, mut m2) = (0f32, 0f32);
        for e in 0..d {
            db[e] += g[e];
            dw[e] += g[e] * xhat[e];
            gh[e] = g[e] * w[e];
            m1 += gh[e];
            m2 += gh[e] * xhat[e];
        }
        let (m1, m2) = (m1 / n, m2 / n);
        for e in 0..d {
            dx[e] = (gh[e] - m1 - xhat[e] * m2) * r;
        }
    }
    (dw, db)
}

/// `x[r, :] += b` for every row.
#[inline(always)]
pub fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (x, &b) in row.iter_mut().zip(b) {
            *x += b;
        }
    }
}

/// `resid += y + b` row by row (the bias joins the product before the residual stream, as in
/// the candle forms).
#[inline(always)]
pub fn add_biased(resid: &mut [f32], y: &[f32], b: &[f32]) {
    let n = b.len();
    for (r, y) in resid.chunks_exact_mut(n).zip(y.chunks_exact(n)) {
        for ((r, &y), &b) in r.iter_mut().zip(y).zip(b) {
            *r += y + b;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rows of the attention

/// `y += a x`, elementwise.
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `sum_j x[j] y[j]`, with eight partial sums (so that it vectorises; a fixed order): the lanes
/// over the whole chunks of 8, summed in lane order, plus the remaining products summed in order.
#[inline(always)]
pub fn dot(x: &[f32], y: &[f32]) -> f32 {
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

/// RMSHead's scale of every pair (the paper's Eq. 5): for `m`, `H` rows of `stride` scores (one
/// row per head), `r[j - p0] = 1 / sqrt(mean_h m[h, j]^2 + eps)` for the pairs `j` from `p0`, the
/// sum over the heads in order. `r` has `stride - p0` entries.
#[inline(always)]
pub fn rms_head_scales(m: &[f32], stride: usize, p0: usize, eps: f32, r: &mut [f32]) {
    let h = m.len() / stride;
    r.fill(0.0);
    for head in m.chunks_exact(stride) {
        for (s, &x) in r.iter_mut().zip(&head[p0..]) {
            *s += x * x;
        }
    }
    for s in r.iter_mut() {
        *s = 1.0 / (*s / h as f32 + eps).sqrt();
    }
}

/// RMSHead in place on one problem's masked scores `a [H, T, T]`, for the pairs from `p0` (pair
/// `i T + j`): every pair's scores times [`rms_head_scales`], with `r [T * T]` scratch; the loops
/// run over contiguous pairs.
#[inline(always)]
pub fn rms_head(p0: usize, eps: f32, a: &mut [f32], r: &mut [f32]) {
    let tt = r.len();
    let r = &mut r[p0..];
    rms_head_scales(a, tt, p0, eps, r);
    for head in a.chunks_exact_mut(tt) {
        for (x, &r) in head[p0..].iter_mut().zip(r.iter()) {
            *x *= r;
        }
    }
}

/// The softmax of one row of scores over its visible keys (`vis`, none: all), with libm's `exp`,
/// 0 where masked; a row with no visible key is uniform (the reference fills masked scores with
/// the lowest float, so such a row is all equal).
#[inline]
pub fn softmax_row(row: &[f32], vis: Option<&[bool]>, a: &mut [f32]) {
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

/// The softmax of a row of scores over padded keys with every real key visible, `a = exp(x - max)
/// / sum exp(x - max)`, by [`exp_reduced`] in whole vectors: `s [Tp]` (a multiple of [`LANES`],
/// `-inf` on the padding), `e [Tp]` scratch, into `a [T]`. The padding's `exp` is that of the
/// clamp, about 1e-38, below the rounding of the sum (at least 1, the maximum's term). A row with
/// a NaN gives NaN (the `exp` of NaN is NaN and the sum with it).
#[inline(always)]
pub fn softmax_padded(s: &[f32], e: &mut [f32], a: &mut [f32]) {
    softmax_padded_rows([s], [e], [a]);
}

/// [`softmax_padded`] of `R` rows side by side: each step runs over all the rows before the
/// next, so that their dependency chains overlap; every row's arithmetic, and so its bits, are
/// those of the row alone.
#[inline(always)]
pub fn softmax_padded_rows<const R: usize>(s: [&[f32]; R], e: [&mut [f32]; R], a: [&mut [f32]; R]) {
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

/// The softmax gradient over rows of `n` entries, `dx = (g - sum(g y)) y` per row, the sum in
/// order (training's backward pass).
///
/// # Shapes
/// `y`, `g`, `dx` of `rows * n` floats.
#[inline]
pub fn softmax_backward(y: &[f32], g: &[f32], n: usize, dx: &mut [f32]) {
    for ((y, g), dx) in y
        .chunks_exact(n)
        .zip(g.chunks_exact(n))
        .zip(dx.chunks_exact_mut(n))
    {
        let dot = g.iter().zip(y).map(|(g, y)| g * y).sum::<f32>();
        for ((dx, &g), &y) in dx.iter_mut().zip(g).zip(y) {
            *dx = (g - dot) * y;
        }
    }
}

/// One problem's keys and values transposed, from its rows `qkv [T, 3 H d]` into `kt`, `vt`
/// `[H d, Tp]` (column `c` of the keys, `qkv[j, H d + c]`, into row `c` of `kt`; the padded keys
/// `T..Tp` are left as they are).
#[inline(always)]
pub fn transpose_kv(
    qkv: &[f32],
    (t, tp, hd): (usize, usize, usize),
    kt: &mut [f32],
    vt: &mut [f32],
) {
    for j in 0..t {
        let row = &qkv[j * 3 * hd..][..3 * hd];
        for c in 0..hd {
            kt[c * tp + j] = row[hd + c];
            vt[c * tp + j] = row[2 * hd + c];
        }
    }
}

/// One row of scaled scores plus bias over the padded keys: `s[j] = (sum_e q[e] kt[e, j]) scale +
/// b[j]` for `q [d]`, `kt [d, Tp]`, `b [Tp]` into `s [Tp]` (or into the `T` real keys' `s [T]`),
/// eight keys at a time with the sum over `e` in a register (the sum runs in the order
/// `e = 0, 1, ..`). The usual head widths get a copy with `d` known at compile time, so that the
/// loop over `e` is unrolled.
#[inline(always)]
pub fn scores(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
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

/// The standard value network of one problem: `o[i, h, e] = sum_j a[h, i, j] v[h, e, j]` (each a
/// [`dot`]), from the codes `att [H, T, T]` and the values `vt [H, d, Tp]` into `o [T, H, d]`, for
/// the queries from `q0`.
#[inline(always)]
pub fn default_value(shape: &AttentionShape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
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

// ---------------------------------------------------------------------------------------------
// The analyses' kernels

/// Columns per register tile of [`squared_distances`].
const TILE: usize = 16;

/// Squared Euclidean distances from [`DISTANCE_ROWS`] points to all `N` points (the inner loop of
/// the silhouette score and of k-means): each `sum_d (x_jd - x_id)^2`, summed over `d` in order.
/// The differences, not the norm expansion `|x_i|^2 + |x_j|^2 - 2 x_i.x_j`, so there is no
/// cancellation, and a point's distance to itself is exactly 0.
///
/// # Shapes
/// `rows [DISTANCE_ROWS, D]`, `xt [D, N]` (the data transposed), `out [DISTANCE_ROWS, N]`, all
/// row-major.
#[inline(always)]
pub fn squared_distances(rows: &[f64], xt: &[f64], out: &mut [f64]) {
    const ROWS: usize = DISTANCE_ROWS;
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

/// Lanes of the t-SNE gradient's sums: the sums run in `TSNE_LANES` interleaved partial sums,
/// added up in order at the end, so the compiler can vectorise them and every instruction set
/// gives the same bits.
pub(crate) const TSNE_LANES: usize = 8;

/// One row of the exact t-SNE gradient (`hyperlens-analysis`'s `embed`):
/// `[attractive x, attractive y, repulsive x, repulsive y, Z_i]` for the point `(xi, zi)` against
/// all points `(xs, zs)` with affinities `prow`, where with `w_ij = (1 + |y_i - y_j|^2)^-1` the
/// attractive sum is `sum_j p_ij w_ij (y_i - y_j)`, the repulsive `sum_j w_ij^2 (y_i - y_j)` and
/// `Z_i = sum_{j != i} w_ij`. The point itself must be among `(xs, zs)` (its `w` is 1, removed
/// from `Z_i`).
#[inline(always)]
pub fn tsne_gradient_row(xi: f64, zi: f64, xs: &[f64], zs: &[f64], prow: &[f64]) -> [f64; 5] {
    const LANES: usize = TSNE_LANES;
    // one accumulator array per sum, lane l taking the points j with j % LANES == l
    let mut acc = [[0.0f64; LANES]; 5];
    let chunks = xs.len() / LANES * LANES;
    for ((x8, z8), p8) in xs[..chunks]
        .chunks_exact(LANES)
        .zip(zs[..chunks].chunks_exact(LANES))
        .zip(prow[..chunks].chunks_exact(LANES))
    {
        gradient_lanes((xi, zi), as8(x8), as8(z8), as8(p8), &mut acc);
    }
    // the tail, padded with points that add nothing (zero affinity, and w subtracted below)
    let tail = xs.len() - chunks;
    if tail > 0 {
        let (mut x8, mut z8, p8) = ([xi; LANES], [zi; LANES], {
            let mut p8 = [0.0; LANES];
            p8[..tail].copy_from_slice(&prow[chunks..]);
            p8
        });
        x8[..tail].copy_from_slice(&xs[chunks..]);
        z8[..tail].copy_from_slice(&zs[chunks..]);
        gradient_lanes((xi, zi), &x8, &z8, &p8, &mut acc);
    }
    row_sums(&acc, xs.len())
}

/// The row's five sums from the lanes of their partial sums `acc` over `n` points padded to a
/// multiple of `TSNE_LANES` (the lanes added in order).
#[inline(always)]
pub(crate) fn row_sums(acc: &[[f64; TSNE_LANES]; 5], n: usize) -> [f64; 5] {
    let sum = |a: &[f64; TSNE_LANES]| a.iter().sum::<f64>();
    // w_ii = 1 exactly, and so is every padding point's w (it sits on the point itself)
    let padding = (n.div_ceil(TSNE_LANES) * TSNE_LANES - n) as f64;
    [
        sum(&acc[0]),
        sum(&acc[1]),
        sum(&acc[2]),
        sum(&acc[3]),
        sum(&acc[4]) - 1.0 - padding,
    ]
}

/// A slice of `TSNE_LANES` floats as an array.
#[inline(always)]
pub(crate) fn as8(c: &[f64]) -> &[f64; TSNE_LANES] {
    c.try_into().expect("a chunk of TSNE_LANES")
}

/// [`tsne_gradient_row`]'s partial sums over one chunk of `TSNE_LANES` points `(x8, z8)` with
/// affinities `p8`, into `acc` = `[attractive x, attractive y, repulsive x, repulsive y, w]` per
/// lane.
// A function, not a closure: a closure is compiled on its own for the baseline instruction set,
// even when called from a copy of `tsne_gradient_row` compiled for AVX2.
#[inline(always)]
fn gradient_lanes(
    (xi, zi): (f64, f64),
    x8: &[f64; TSNE_LANES],
    z8: &[f64; TSNE_LANES],
    p8: &[f64; TSNE_LANES],
    acc: &mut [[f64; TSNE_LANES]; 5],
) {
    const LANES: usize = TSNE_LANES;
    let mut dx = [0.0f64; LANES];
    let mut dz = [0.0f64; LANES];
    let mut w = [0.0f64; LANES];
    for l in 0..LANES {
        dx[l] = xi - x8[l];
        dz[l] = zi - z8[l];
        w[l] = 1.0 / (1.0 + dx[l] * dx[l] + dz[l] * dz[l]);
    }
    for l in 0..LANES {
        let pw = p8[l] * w[l];
        let ww = w[l] * w[l];
        acc[0][l] += pw * dx[l];
        acc[1][l] += pw * dz[l];
        acc[2][l] += ww * dx[l];
        acc[3][l] += ww * dz[l];
        acc[4][l] += w[l];
    }
}

/// The last, partial chunk of a t-SNE gradient row's points, padded with points that add nothing
/// (on the point itself, with zero affinity), as in [`tsne_gradient_row`]; for the copies written
/// with intrinsics.
#[cfg(target_arch = "x86_64")]
pub(crate) struct PaddedTail {
    /// Points before the partial chunk (a multiple of `TSNE_LANES`).
    full: usize,
    x8: [f64; TSNE_LANES],
    z8: [f64; TSNE_LANES],
    p8: [f64; TSNE_LANES],
}

#[cfg(target_arch = "x86_64")]
impl PaddedTail {
    #[inline(always)]
    pub(crate) fn new(xi: f64, zi: f64, xs: &[f64], zs: &[f64], prow: &[f64]) -> PaddedTail {
        let n = xs.len();
        let full = n / TSNE_LANES * TSNE_LANES;
        let (mut x8, mut z8, mut p8) = ([xi; TSNE_LANES], [zi; TSNE_LANES], [0.0; TSNE_LANES]);
        x8[..n - full].copy_from_slice(&xs[full..]);
        z8[..n - full].copy_from_slice(&zs[full..]);
        p8[..n - full].copy_from_slice(&prow[full..]);
        PaddedTail { full, x8, z8, p8 }
    }

    /// The chunk of points from `c` (a multiple of `TSNE_LANES`): from the rows, or the padded
    /// tail.
    #[allow(clippy::type_complexity)]
    #[inline(always)]
    pub(crate) fn chunk<'a>(
        &'a self,
        c: usize,
        xs: &'a [f64],
        zs: &'a [f64],
        prow: &'a [f64],
    ) -> (
        &'a [f64; TSNE_LANES],
        &'a [f64; TSNE_LANES],
        &'a [f64; TSNE_LANES],
    ) {
        if c < self.full {
            (
                as8(&xs[c..][..TSNE_LANES]),
                as8(&zs[c..][..TSNE_LANES]),
                as8(&prow[c..][..TSNE_LANES]),
            )
        } else {
            (&self.x8, &self.z8, &self.p8)
        }
    }
}

/// One problem's attention codes at one layer for each normalisation (`attention`'s `codes`: the
/// K/V transposes, the scores plus bias, the softmax or RMSHead), portable.
///
/// # Shapes
/// `visible [T * T]` (none: every key visible), `qkv [T, 3 H d]`, `bias [H, T, Tp]`; the codes
/// into `w.att [H, T, T]`, the queries from `q0` (earlier rows NaN).
#[inline]
pub fn attention_codes(
    shape: &AttentionShape,
    norm: CodesNorm,
    visible: Option<&[bool]>,
    q0: usize,
    qkv: &[f32],
    bias: &[f32],
    w: &mut AttentionScratch,
) {
    crate::attention::codes::<false>(shape, norm, visible, q0, qkv, bias, w);
}
