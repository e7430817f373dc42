//! The scalar maths of the pass, in forms the compiler vectorises: `exp` by a polynomial
//! ([`exp_reduced`]), the tanh GELU, LayerNorm, the bias additions, and the `gemm` product
//! ([`matmul`]).

use super::attention::LANES;
use crate::transformer::LN_EPS;

/// `exp(x)` in float32, in a form the compiler vectorises:
/// `x = n ln 2 + r` with `n` rounded to the nearest integer (by adding and subtracting `1.5 2^23`, which leaves `n` in the low bits)
/// and `|r| <= ln 2 / 2`, `ln 2` split in two parts so that `r` is exact; `e^r` by the degree-7
/// Taylor-style polynomial `1 + r + r^2 P(r)` with the minimax coefficients of Cephes's `expf`
/// (Moshier 1984); `2^n` by the exponent bits. The argument is clamped to [-87.3, 88]: below, the
/// result is `e^-87.3` (about 1e-38, nothing next to a softmax row maximum's 1 or a sigmoid's 1);
/// above, `e^88` (1.7e38, whose sigmoid is 0 all the same). NaN stays NaN. Relative error at most
/// 2.5e-7 against `f32::exp` over [-87, 88] (unit test).
#[inline(always)]
pub(super) fn exp_reduced(x: f32) -> f32 {
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
fn exp_reduced_block<const W: usize>(x: &mut [f32; W]) {
    let (mut t, mut r) = ([0f32; W], [0f32; W]);
    for ((&x, t), r) in x.iter().zip(&mut t).zip(&mut r) {
        (*t, *r) = exp_reduce(x);
    }
    for ((x, &t), &r) in x.iter_mut().zip(&t).zip(&r) {
        *x = exp_finish(t, r);
    }
}

/// The tanh GELU `x sigmoid(c (x + 0.044715 x^3))` (`ops::fast::cpu`'s, `c = 2 sqrt(2 / pi)`) with
/// the sigmoid's `exp` by [`exp_reduced`], so that the loop over a row vectorises.
#[inline(always)]
pub(super) fn gelu_tanh(x: f32) -> f32 {
    x / (1.0 + exp_reduced(gelu_exponent(x)))
}

/// The exponent of [`gelu_tanh`]'s sigmoid, `-c (x + 0.044715 x^3)`.
#[inline(always)]
fn gelu_exponent(x: f32) -> f32 {
    const C: f32 = 1.595_769_2;
    -C * (x + 0.044_715 * x * x * x)
}

/// [`gelu_tanh`] in place over a buffer: blocks of [`GELU_BLOCK`] floats step by step (every
/// step over the whole block before the next), then the tail one by one. Each float gets
/// [`gelu_tanh`]'s operations in its order, so the same bits.
#[inline(always)]
pub(super) fn gelu_in_place(v: &mut [f32]) {
    let mut blocks = v.chunks_exact_mut(GELU_BLOCK);
    for block in &mut blocks {
        gelu_block(block.try_into().expect("a block of GELU_BLOCK floats"));
    }
    for v in blocks.into_remainder() {
        *v = gelu_tanh(*v);
    }
}

/// Floats per step of [`gelu_in_place`]: four AVX2 vectors, whose chains of some thirty dependent
/// operations then overlap. One vector at a time, the loop waited on each chain's latency.
pub(super) const GELU_BLOCK: usize = 4 * LANES;

/// [`gelu_tanh`] of a block, step by step: the argument of the sigmoid, then [`exp_reduced`]'s
/// steps, then the quotient, each over the whole block.
#[inline(always)]
fn gelu_block(v: &mut [f32; GELU_BLOCK]) {
    let mut u = [0f32; GELU_BLOCK];
    for (u, &x) in u.iter_mut().zip(v.iter()) {
        *u = gelu_exponent(x);
    }
    exp_reduced_block(&mut u);
    for (x, &e) in v.iter_mut().zip(&u) {
        *x /= 1.0 + e;
    }
}

/// LayerNorm over rows of `D = w.len()` entries, as candle's (`E[x^2] - mean^2` variance, eps
/// [`LN_EPS`]): `y = (x - mean) / sqrt(var + eps) w + b`; the sums over eight lanes.
#[inline(always)]
pub(super) fn layer_norm(x: &[f32], (w, b): &(Vec<f32>, Vec<f32>), y: &mut [f32]) {
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
        let inv_std = (var + LN_EPS).sqrt().recip();
        for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
            *y = (x - mean) * inv_std * w + b;
        }
    }
}

/// `x[r, :] += b` for every row.
#[inline(always)]
pub(super) fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (x, &b) in row.iter_mut().zip(b) {
            *x += b;
        }
    }
}

/// `resid += y + b` row by row (the bias joins the product before the residual stream, as in
/// the candle forms).
#[inline(always)]
pub(super) fn add_biased(resid: &mut [f32], y: &[f32], b: &[f32]) {
    let n = b.len();
    for (r, y) in resid.chunks_exact_mut(n).zip(y.chunks_exact(n)) {
        for ((r, &y), &b) in r.iter_mut().zip(y).zip(b) {
            *r += y + b;
        }
    }
}

/// `dst [m, n] = a [m, k] b [k, n]`, all row-major, by `gemm` on the calling thread (its AVX-512
/// kernels where the CPU has them).
///
/// # Panics
/// If a slice is shorter than its shape: the callers size every buffer from the model's config.
// The workspace denies `unsafe`; gemm's entry point takes raw pointers and strides.
#[allow(unsafe_code)]
pub(super) fn matmul(dst: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) {
    assert!(
        dst.len() >= m * n && a.len() >= m * k && b.len() >= k * n,
        "matmul: buffers shorter than [{m}, {k}] x [{k}, {n}]"
    );
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the assertion above keeps every element that gemm reads or writes, `a[i k + p]`,
    // `b[p n + j]` and `dst[i n + j]` for `i < m`, `p < k`, `j < n` (row strides `k`, `n`, `n`,
    // column strides 1), inside its slice; `dst` is borrowed mutably, so it aliases neither input.
    // With `read_dst` false gemm writes `dst` without reading it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}
