//! The language models' portable kernels: the SwiGLU of a Llama MLP, the causal softmax of a
//! prefix, the half-split rotary embedding and RMSNorm (with the residual addition before it).
//! Part of [`super`], whose rules they follow (the copies in `crate::avx2` and `crate::avx512` do
//! these operations in this order).

use super::{exp_reduced, exp_reduced_block, GELU_BLOCK};
use crate::LANES;

/// The SwiGLU of a Llama MLP, `out = silu(g) u = g / (1 + exp(-g)) u` elementwise, with
/// [`exp_reduced`]; blocks of [`GELU_BLOCK`] floats step by step (so that the chains overlap), then
/// the tail one by one, each float with the same operations in the same order.
///
/// # Panics
/// If `u` or `out` is shorter than `g`.
#[inline(always)]
pub fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = g.len();
    let (u, out) = (&u[..n], &mut out[..n]);
    let whole = n - n % GELU_BLOCK;
    for ((g, u), out) in g[..whole]
        .chunks_exact(GELU_BLOCK)
        .zip(u[..whole].chunks_exact(GELU_BLOCK))
        .zip(out[..whole].chunks_exact_mut(GELU_BLOCK))
    {
        let mut e = [0f32; GELU_BLOCK];
        for (e, &g) in e.iter_mut().zip(g) {
            *e = -g;
        }
        exp_reduced_block(&mut e);
        for (((o, &e), &g), &u) in out.iter_mut().zip(&e).zip(g).zip(u) {
            *o = g / (1.0 + e) * u;
        }
    }
    for ((o, &g), &u) in out[whole..].iter_mut().zip(&g[whole..]).zip(&u[whole..]) {
        *o = g / (1.0 + exp_reduced(-g)) * u;
    }
}

/// The softmax of the first `n` scores of a row (a causal row: the keys up to the query), 0 at the
/// others: `a[j] = exp(s[j] - max) / sum exp(s[. ] - max)` for `j < n` by [`exp_reduced`], the
/// maximum and the sum over [`LANES`] lanes plus the tail (a fixed order). A row with a NaN gives
/// NaN.
///
/// # Panics
/// If `n` is 0 or more than `s.len()`, or `a` is shorter than `s`.
#[inline(always)]
pub fn softmax_prefix(s: &[f32], n: usize, a: &mut [f32]) {
    let (row, rest) = a[..s.len()].split_at_mut(n);
    let s = &s[..n];
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = s.chunks_exact(LANES);
    let mut mx = f32::NEG_INFINITY;
    for &x in chunks.remainder() {
        mx = if x > mx { x } else { mx };
    }
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = if x > *l { x } else { *l };
        }
    }
    for &x in &lanes {
        mx = if x > mx { x } else { mx };
    }
    for (e, &x) in row.iter_mut().zip(s) {
        *e = exp_reduced(x - mx);
    }
    let mut acc = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let mut tail = 0f32;
    for &x in chunks.remainder() {
        tail += x;
    }
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    let mut sum = 0f32;
    for &x in &acc {
        sum += x;
    }
    let inv = 1.0 / (sum + tail);
    for a in row.iter_mut() {
        *a *= inv;
    }
    rest.fill(0.0);
}

/// The rotary embedding of one head's row of `d = x.len()` entries in the half-split convention
/// (Hugging Face `rotate_half`, candle-nn's `rope`, whose operations and order these are): for
/// `i < d / 2`, `out[i] = x[i] cos[i] - x[i + d/2] sin[i]` and
/// `out[i + d/2] = x[i] sin[i] + x[i + d/2] cos[i]`.
///
/// # Panics
/// If `cos`, `sin` are shorter than `d / 2` or `out` than `d`.
#[inline(always)]
pub fn rope_half(x: &[f32], cos: &[f32], sin: &[f32], out: &mut [f32]) {
    let h = x.len() / 2;
    let (x1, x2) = x.split_at(h);
    let (o1, o2) = out[..2 * h].split_at_mut(h);
    let (cos, sin) = (&cos[..h], &sin[..h]);
    for i in 0..h {
        o1[i] = x1[i] * cos[i] - x2[i] * sin[i];
        o2[i] = x1[i] * sin[i] + x2[i] * cos[i];
    }
}

/// Rows of [`rms_norm`] whose sums of squares run side by side (independent chains).
pub const NORM_ROWS: usize = 8;

/// RMSNorm over rows of `D = w.len()` entries, candle-nn's `rms_norm` (Hugging Face `LlamaRMSNorm`
/// in float32) with its bits: per row `m = sqrt(sum(x^2) / D + eps)`, the sum one chain in order,
/// and `out = x / m * w`. The chains of [`NORM_ROWS`] rows run side by side (one chain alone waits
/// on each addition's latency), the tail rows one by one.
///
/// # Panics
/// If `out` is shorter than `x`.
#[inline(always)]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let dm = w.len();
    if dm == 0 {
        return;
    }
    let n = x.len() / dm;
    let whole = n - n % NORM_ROWS;
    for (x, out) in x[..whole * dm]
        .chunks_exact(NORM_ROWS * dm)
        .zip(out.chunks_exact_mut(NORM_ROWS * dm))
    {
        let mut sums = [0f32; NORM_ROWS];
        for j in 0..dm {
            for (r, s) in sums.iter_mut().enumerate() {
                let v = x[r * dm + j];
                *s += v * v;
            }
        }
        for ((x, out), &s) in x.chunks_exact(dm).zip(out.chunks_exact_mut(dm)).zip(&sums) {
            scale_row(x, w, s, eps, out);
        }
    }
    for (x, out) in x[whole * dm..n * dm]
        .chunks_exact(dm)
        .zip(out[whole * dm..].chunks_exact_mut(dm))
    {
        let mut s = 0f32;
        for &v in x {
            s += v * v;
        }
        scale_row(x, w, s, eps, out);
    }
}

/// The residual addition of a pre-norm block and the next norm in one pass over the rows:
/// `sum = h + y` and `out = rms_norm(sum)` ([`rms_norm`]), over rows of `D = w.len()` entries.
///
/// # Panics
/// If `y`, `sum` or `out` is shorter than `h`.
#[inline(always)]
pub fn add_rms_norm(h: &[f32], y: &[f32], w: &[f32], eps: f32, sum: &mut [f32], out: &mut [f32]) {
    let n = h.len();
    for ((s, &a), &b) in sum[..n].iter_mut().zip(h).zip(&y[..n]) {
        *s = a + b;
    }
    rms_norm(&sum[..n], w, eps, out);
}

/// One row of [`rms_norm`] from its sum of squares `s`.
#[inline(always)]
fn scale_row(x: &[f32], w: &[f32], s: f32, eps: f32, out: &mut [f32]) {
    let m = (s / w.len() as f32 + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v / m * g;
    }
}
