//! The reference forms: the operations of [`super::Ops`] as plain candle maths, differentiated by
//! candle's autodiff. They define what every fast form computes, and the tests compare against
//! them.
//!
//! The composed operations ([`layer_norm`], [`mix`]) take an [`Ops`] for their parts, so that a
//! composed form can still use the fast forms of its pieces; with [`Ops::Reference`] every piece
//! is plain candle maths.
//!
//! Source: `docs/spec/models.md` ("Scores and the three normalisations", "Value networks"); the
//! paper's `DotProductAttention` (`hyla/models/attention.py` of smonsays/hypernetwork-attention).

use candle_core::{Tensor, D};

use super::Ops;
use crate::error::Result;
use crate::mixer::{Mixer, Normalisation, ValueNetwork};

/// Epsilon of the RMSHead normalisation (flax `RMSNorm` default).
pub const RMS_HEAD_EPS: f64 = 1e-6;

/// `x W + b` over the last axis, composed: a matrix product on the rows, then the bias through
/// `ops`.
///
/// # Shapes
/// `x [..., in]`, `w [in, out]`, `b [out]` -> `[..., out]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
pub fn linear(ops: Ops, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (n_in, n_out) = w.dims2()?;
    let mut dims = x.dims().to_vec();
    let rows = x.elem_count() / n_in.max(1);
    let y = ops.add_leading(&x.reshape((rows, n_in))?.matmul(w)?, b)?;
    if let Some(last) = dims.last_mut() {
        *last = n_out;
    }
    Ok(y.reshape(dims)?)
}

/// The per-head projection `y[b, h, t, :] = x[b, t] W[h] + bias[h]`, composed: the heads'
/// kernels side by side as one `[D, H d]` matrix, [`linear`], then heads to axis 1.
///
/// # Shapes
/// `x [B, T, D]`, `w [H, D, d]`, `b [H, d]` -> `[B, H, T, d]` (contiguous).
///
/// # Errors
/// Candle errors on mismatched shapes.
pub fn project_heads(ops: Ops, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (bsz, t, dm) = x.dims3()?;
    let (h, _, d) = w.dims3()?;
    let w2 = w.transpose(0, 1)?.reshape((dm, h * d))?;
    let y = linear(ops, x, &w2, &b.reshape(h * d)?)?;
    Ok(y.reshape((bsz, t, h, d))?.transpose(1, 2)?.contiguous()?)
}

/// `x W + b` per model of a stack ([`crate::StackedTransformer`]): one batched matrix product
/// over the model axis, then each model's bias.
///
/// # Shapes
/// `x [M, ..., in]`, `w [M, in, out]`, `b [M, out]` -> `[M, ..., out]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
pub fn linear_stacked(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (m, n_in, n_out) = w.dims3()?;
    let rows = x.elem_count() / (m * n_in).max(1);
    let y = x
        .reshape((m, rows, n_in))?
        .matmul(w)?
        .broadcast_add(&b.unsqueeze(1)?)?;
    let mut shape = x.dims().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = n_out;
    }
    Ok(y.reshape(shape)?)
}

/// The per-head projection per model of a stack ([`linear_stacked`] with the heads' kernels side
/// by side), the model axis folded into the batch of the result.
///
/// # Shapes
/// `x [M, B, T, D]`, `w [M, H, D, d]`, `b [M, H, d]` -> `[M * B, H, T, d]` (contiguous).
///
/// # Errors
/// Candle errors on mismatched shapes.
pub fn project_heads_stacked(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (m, bsz, t, dm) = x.dims4()?;
    let (_, h, _, d) = w.dims4()?;
    let w = w.permute((0, 2, 1, 3))?.reshape((m, dm, h * d))?;
    let y = linear_stacked(&x.reshape((m, bsz * t, dm))?, &w, &b.reshape((m, h * d))?)?;
    Ok(y.reshape((m, bsz, t, h, d))?
        .permute((0, 1, 3, 2, 4))?
        .contiguous()?
        .reshape((m * bsz, h, t, d))?)
}

/// LayerNorm per model of a stack: the normalisation over the folded batch through `ops`, then
/// each model's scale and bias.
///
/// # Shapes
/// `x [M, ..., D]`, `w [M, D]`, `b [M, D]` -> `[M, ..., D]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
pub fn layer_norm_stacked(
    ops: Ops,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    let (m, d) = w.dims2()?;
    let ones = Tensor::ones(d, w.dtype(), x.device())?;
    let zeros = Tensor::zeros(d, w.dtype(), x.device())?;
    let y = ops.layer_norm(x, &ones, &zeros, eps)?;
    let mut shape = vec![1; x.rank()];
    shape[0] = m;
    shape[x.rank() - 1] = d;
    Ok(y.broadcast_mul(&w.reshape(shape.clone())?)?
        .broadcast_add(&b.reshape(shape)?)?)
}

/// `x + b`, `b` broadcast to the shape of `x`.
///
/// # Shapes
/// `b` broadcastable to `x`; returns the shape of `x`.
///
/// # Errors
/// Candle errors on shapes that do not broadcast.
pub fn add_leading(x: &Tensor, b: &Tensor) -> Result<Tensor> {
    Ok(x.broadcast_add(b)?)
}

/// `x * w`, `w` broadcast to the shape of `x`.
///
/// # Shapes
/// `w` broadcastable to `x`; returns the shape of `x`.
///
/// # Errors
/// Candle errors on shapes that do not broadcast.
pub fn mul_leading(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Ok(x.broadcast_mul(w)?)
}

/// LayerNorm over the last axis: `(x - mean) / sqrt(var + eps) * w + b` (the operations of
/// `candle_nn::ops::layer_norm_slow`, with the mean subtracted before the variance), the scale and
/// bias applied through `ops`.
///
/// # Shapes
/// `x [..., D]`, `w [D]`, `b [D]` -> `[..., D]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
pub fn layer_norm(ops: Ops, x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let n = x.dim(D::Minus1)? as f64;
    let xc = x.broadcast_sub(&(x.sum_keepdim(D::Minus1)? / n)?)?;
    let var = (xc.sqr()?.sum_keepdim(D::Minus1)? / n)?;
    let xn = xc.broadcast_div(&(var + eps)?.sqrt()?)?;
    ops.add_leading(&ops.mul_leading(&xn, w)?, b)
}

/// The tanh GELU by candle's `gelu` (one kernel; its gradient calls `powf` per element).
///
/// # Shapes
/// Any shape, elementwise.
///
/// # Errors
/// Candle errors.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    Ok(x.gelu()?)
}

/// The softmax over the last axis, composed (`candle_nn::ops::softmax`).
///
/// # Shapes
/// Any shape of rank >= 1.
///
/// # Errors
/// Candle errors.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::ops::softmax(x, D::Minus1)?)
}

/// RMSHead over axis 1: `x / sqrt(mean_h x^2 + eps)`.
///
/// # Shapes
/// `x [B, H, rest...]` -> the shape of `x`.
///
/// # Errors
/// Candle errors (`x` of rank below 2).
pub fn rms_over_heads(x: &Tensor, eps: f64) -> Result<Tensor> {
    let rms = (x.sqr()?.mean_keepdim(1)? + eps)?.sqrt()?;
    Ok(x.broadcast_div(&rms)?)
}

/// Normalises the scaled scores into the latent codes with the mixer's normalisation.
///
/// With a mask, hidden pairs get `f32::MIN` before the softmax (weight 0 after it) and 0 before
/// the `none` and RMSHead normalisations, as in the paper's code.
///
/// # Shapes
/// `scores [B, H, Q, K]`; `mask` a `u8` tensor broadcastable to `[B, H, Q, K]`, 1 = visible;
/// returns `[B, H, Q, K]`.
///
/// # Errors
/// Candle errors (shape mismatch).
pub fn normalise(
    ops: Ops,
    scores: &Tensor,
    normalisation: Normalisation,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let masked = |fill: f32| -> Result<Tensor> {
        match mask {
            None => Ok(scores.clone()),
            Some(m) => {
                let m = m.broadcast_as(scores.shape())?;
                let fill = Tensor::full(fill, scores.shape(), scores.device())?
                    .to_dtype(scores.dtype())?;
                Ok(m.where_cond(scores, &fill)?)
            }
        }
    };
    match normalisation {
        Normalisation::Softmax => ops.softmax_last_dim(&masked(f32::MIN)?),
        Normalisation::None => masked(0.0),
        Normalisation::RmsHead => ops.rms_over_heads(&masked(0.0)?, RMS_HEAD_EPS),
    }
}

/// Normalisation, dropout and value network: the definition of [`Ops::mix`].
///
/// `a = normalise(s)`; with dropout `a' = a * dropout` is what the value network sees; then
/// - default: `o[b,i,h] = sum_j a'[b,h,i,j] v[b,h,j]`,
/// - `mlp_relu` (HYLA): `hidden[b,i,j] = ReLU(sum_h a'[b,h,i,j] v[b,h,j])`,
///   `o[b,i,h] = sum_j a'[b,h,i,j] hidden[b,i,j]`,
/// - `mlp_linear`: the same without the ReLU.
///
/// # Shapes
/// As [`Ops::mix`]: returns `(o [B, Q, H, d], attention [B, H, Q, K])`.
///
/// # Errors
/// Candle errors on inconsistent shapes.
pub fn mix(
    ops: Ops,
    scores: &Tensor,
    v: &Tensor,
    mixer: Mixer,
    mask: Option<&Tensor>,
    dropout: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let attention = normalise(ops, scores, mixer.normalisation(), mask)?;
    let a = match dropout {
        Some(m) => attention.broadcast_mul(m)?,
        None => attention.clone(),
    };
    let o = match mixer.value_network() {
        ValueNetwork::Default => a.matmul(&v.contiguous()?)?.transpose(1, 2)?.contiguous()?,
        ValueNetwork::MlpRelu | ValueNetwork::MlpLinear => {
            mlp_value_network(&a, v, mixer.value_network() == ValueNetwork::MlpRelu)?.o
        }
    };
    Ok((o, attention))
}

/// The HYLA value network's products and the intermediates their gradients need.
pub(crate) struct MlpValueNetwork {
    /// `a` as `[B, K, Q, H]`.
    pub a_jih: Tensor,
    /// `v` as `[B, K, H, d]`.
    pub v_jhd: Tensor,
    /// The hidden units `[B, K, Q, d]`, after the activation.
    pub hidden: Tensor,
    /// The hidden units as `[B, Q, K, d]`.
    pub hidden_ijd: Tensor,
    /// `a` as `[B, Q, H, K]`.
    pub a_ihj: Tensor,
    /// The output `[B, Q, H, d]`.
    pub o: Tensor,
}

/// The `mlp_relu` (`relu`) / `mlp_linear` value network on attention `a` (after dropout):
/// `hidden[b,j,i] = act(sum_h a[b,h,i,j] v[b,h,j])`, `o[b,i,h] = sum_j a[b,h,i,j] hidden[b,i,j]`.
///
/// # Shapes
/// `a [B, H, Q, K]`, `v [B, H, K, d]`; see [`MlpValueNetwork`].
///
/// # Errors
/// Candle errors on inconsistent shapes.
pub(crate) fn mlp_value_network(a: &Tensor, v: &Tensor, relu: bool) -> Result<MlpValueNetwork> {
    // hidden[b, j, i, :] = sum_h a[b, h, i, j] v[b, h, j, :]: batch over (b, j).
    let a_jih = a.permute((0, 3, 2, 1))?.contiguous()?;
    let v_jhd = v.transpose(1, 2)?.contiguous()?;
    let hidden = a_jih.matmul(&v_jhd)?;
    let hidden = if relu { hidden.relu()? } else { hidden };
    // o[b, i, h, :] = sum_j a[b, h, i, j] hidden[b, i, j, :]: batch over (b, i).
    let hidden_ijd = hidden.transpose(1, 2)?.contiguous()?;
    let a_ihj = a.transpose(1, 2)?.contiguous()?;
    let o = a_ihj.matmul(&hidden_ijd)?;
    Ok(MlpValueNetwork {
        a_jih,
        v_jhd,
        hidden,
        hidden_ijd,
        a_ihj,
        o,
    })
}
