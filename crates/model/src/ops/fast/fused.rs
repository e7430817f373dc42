//! Fused operations with hand-written gradients: LayerNorm, the softmax over the last axis, and the
//! HYLA value network with its normalisation and dropout.
//!
//! candle 0.11 differentiates a composed LayerNorm (`candle_nn::ops::layer_norm_slow`) through its
//! eleven elementary operations, and every one of them costs its backward operations plus a
//! zero-filled gradient slot and an addition (`GradStore::or_insert`). On the base SRAVEN model one
//! LayerNorm made 15 tensors in the forward pass and 66 in the backward pass, and the model has nine
//! of them; the composed softmax was as costly. On a GPU each tensor is a kernel launch, and a
//! training step of this small model is bound by launches (`bench/gpu/README.md`).
//!
//! Here the forward pass is candle's fused kernel (`candle_nn::ops::layer_norm`,
//! `candle_nn::ops::softmax_last_dim`: one kernel each, on the CPU a single pass), computed on
//! detached inputs; a custom operation then puts the result into the graph (one copy) with the
//! gradient written out by hand:
//!
//! - LayerNorm, `y = xhat * w + b` with `xhat = (x - mean) * r`, `r = 1 / sqrt(var + eps)`, per row
//!   of `D` entries: `db = sum_rows g`, `dw = sum_rows g * xhat`, and with `gh = g * w`,
//!   `dx = r * (gh - mean(gh) - xhat * mean(gh * xhat))` (the standard LayerNorm gradient, e.g.
//!   Ba et al. 2016; PyTorch's `native_layer_norm_backward`).
//! - softmax, `dx = y * (g - sum(g * y))` over the last axis.
//! - the HYLA value network with the normalisation and dropout before it (`mlp_value_mix`
//!   documents its gradient); its forward is the same candle operations as
//!   [`crate::ops::reference::mix`], run on detached inputs.
//!
//! With the three, a training step of the base HYLA model creates 2,396 tensors on a GPU instead
//! of 2,889 (softmax: 2,300 instead of 2,753; `benches/train_step.rs` of `hyperlens-train`, group
//! `overhead`, prints the counts; `docs/performance.md` has the current ones). On the CPU the step time did not change measurably.
//!
//! The fused forward kernels compute the variance as `E[x^2] - mean^2` in float32, as flax's
//! `LayerNorm` does by default (`use_fast_variance`), where the composed form subtracted the mean
//! first; the two agree to float32 rounding on the model's activations (tests below and the float64
//! references of `tests/model.rs`). Devices other than the CPU and CUDA get the reference forms
//! ([`super::super::Ops`] decides). Each node goes into the graph through [`super::attach`].

use candle_core::{Tensor, D};

use super::{attach, cpu, Gradient};
use crate::error::Result;
use crate::mixer::{Mixer, Normalisation};
use crate::ops::reference::{self, MlpValueNetwork, RMS_HEAD_EPS};
use crate::ops::Ops;

/// The sum over the rows of a matrix: with the CPU kernels a product with a row of ones (candle's
/// CPU sum over a leading axis is slow), else candle's `sum(0)`.
///
/// # Shapes
/// `x [rows, N]` -> `[N]`.
fn sum_rows(x: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    let (rows, n) = x.dims2()?;
    if !cpu_kernels {
        return Ok(x.sum(0)?);
    }
    Ok(Tensor::ones((1, rows), x.dtype(), x.device())?
        .matmul(x)?
        .reshape(n)?)
}

/// The forms of the pieces that the gradients below compose: the CPU kernels' or the reference.
fn ops(cpu_kernels: bool) -> Ops {
    if cpu_kernels {
        Ops::Fast
    } else {
        Ops::Reference
    }
}

/// `x W + b` over the last axis as one graph node: the forward pass is a matrix product and the
/// bias (on detached inputs), the gradient `dx = g W^T`, `dW = x^T g`, `db = sum_rows g`. As
/// composed candle operations it would be four nodes (two reshapes, the product, the bias), each
/// costing candle's backward pass a zero-filled gradient slot and an addition.
///
/// # Shapes
/// `x [..., in]`, `w [in, out]`, `b [out]` -> `[..., out]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
pub(crate) fn linear(x: &Tensor, w: &Tensor, b: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    let (n_in, n_out) = w.dims2()?;
    let rows = x.elem_count() / n_in.max(1);
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = n_out;
    }
    let y = affine_rows(
        &x.detach().reshape((rows, n_in))?,
        &w.detach(),
        &b.detach(),
        cpu_kernels,
    )?;
    let grad = AffineGrad {
        layout: None,
        cpu_kernels,
    };
    attach(&[x, w, b], y.reshape(dims)?, grad)
}

/// The per-head projection `y[b, h, t, :] = x[b, t] W[h] + bias[h]` as one graph node (the
/// composed form, [`reference::project_heads`], is eight nodes): the heads' kernels side by side
/// as one `[D, H d]` matrix, a product on the rows, heads to axis 1; the gradient reverses the
/// layout changes around that of [`linear`].
///
/// # Shapes
/// `x [B, T, D]`, `w [H, D, d]`, `b [H, d]` -> `[B, H, T, d]` (contiguous).
///
/// # Errors
/// Candle errors on mismatched shapes.
pub(crate) fn project_heads(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    cpu_kernels: bool,
) -> Result<Tensor> {
    let (bsz, t, _) = x.dims3()?;
    let (h, _, d) = w.dims3()?;
    let y = heads_value(&x.detach(), &w.detach(), &b.detach(), cpu_kernels)?;
    let grad = AffineGrad {
        layout: Some((bsz, t, h, d)),
        cpu_kernels,
    };
    attach(&[x, w, b], y, grad)
}

/// The value of [`project_heads`], off the graph: the heads' kernels side by side as one
/// `[D, H d]` matrix, a product on the rows, heads to axis 1.
///
/// # Shapes
/// `x [B, T, D]`, `w [H, D, d]`, `b [H, d]` -> `[B, H, T, d]` (contiguous).
fn heads_value(x: &Tensor, w: &Tensor, b: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    let (bsz, t, dm) = x.dims3()?;
    let (h, _, d) = w.dims3()?;
    let w2 = w.transpose(0, 1)?.reshape((dm, h * d))?;
    let y = affine_rows(
        &x.reshape((bsz * t, dm))?,
        &w2,
        &b.reshape(h * d)?,
        cpu_kernels,
    )?;
    Ok(y.reshape((bsz, t, h, d))?.transpose(1, 2)?.contiguous()?)
}

/// `x W + b` on the rows of a matrix, off the graph.
///
/// # Shapes
/// `x [rows, in]`, `w [in, out]`, `b [out]` -> `[rows, out]`.
fn affine_rows(x: &Tensor, w: &Tensor, b: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    let y = x.matmul(w)?;
    if cpu_kernels {
        return cpu::add_rows(&y, b);
    }
    Ok(y.broadcast_add(b)?)
}

/// The gradient of [`linear`] (`layout: None`) and of [`project_heads`] (`layout: Some((B, T, H,
/// d))`).
struct AffineGrad {
    /// The head layout of [`project_heads`].
    layout: Option<(usize, usize, usize, usize)>,
    /// Whether the CPU kernels run.
    cpu_kernels: bool,
}

impl Gradient for AffineGrad {
    const NAME: &'static str = "hyperlens-affine";

    fn gradients(&self, inputs: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (x, w, b) = (inputs[0], inputs[1], inputs[2]);
        // Everything as the row form `y2 [rows, out] = x2 [rows, in] w2 [in, out] + b2 [out]`.
        let (w2, g2) = match self.layout {
            None => {
                let (_, n_out) = w.dims2()?;
                (
                    w.clone(),
                    g.reshape((g.elem_count() / n_out.max(1), n_out))?,
                )
            }
            Some((bsz, t, h, d)) => {
                let dm = w.dim(1)?;
                let w2 = w.transpose(0, 1)?.reshape((dm, h * d))?;
                let g2 = g.transpose(1, 2)?.contiguous()?.reshape((bsz * t, h * d))?;
                (w2, g2)
            }
        };
        let n_in = w2.dim(0)?;
        let x2 = x.reshape((x.elem_count() / n_in.max(1), n_in))?;
        let dx = g2.matmul(&w2.t()?)?.reshape(x.shape())?;
        let dw2 = x2.t()?.matmul(&g2)?;
        let db = sum_rows(&g2, self.cpu_kernels)?;
        let (dw, db) = match self.layout {
            None => (dw2, db),
            Some((_, _, h, d)) => {
                let dm = dw2.dim(0)?;
                let dw = dw2.reshape((dm, h, d))?.transpose(0, 1)?.contiguous()?;
                (dw, db.reshape((h, d))?)
            }
        };
        Ok(vec![Some(dx), Some(dw), Some(db.reshape(b.shape())?)])
    }
}

/// The gradient of a stacked operation computed model by model: each model's slice of the
/// inputs and of the output's cotangent goes through `inner`, the gradient of the single-model
/// operation, so each model's gradients are those of its own single operation, bit for bit.
struct PerModel<G> {
    /// The single-model gradient.
    inner: G,
    /// Models M (the leading axis of every input).
    models: usize,
    /// The shape of one model's output.
    out_shape: Vec<usize>,
}

impl<G: Gradient> Gradient for PerModel<G> {
    const NAME: &'static str = G::NAME;

    fn gradients(&self, inputs: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let mut shape = vec![self.models];
        shape.extend(&self.out_shape);
        let g = g.reshape(shape)?;
        let mut per_input: Vec<Vec<Tensor>> = vec![Vec::with_capacity(self.models); inputs.len()];
        for m in 0..self.models {
            let slices = inputs
                .iter()
                .map(|t| Ok(t.get(m)?))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = slices.iter().collect();
            for (i, grad) in self
                .inner
                .gradients(&refs, &g.get(m)?)?
                .into_iter()
                .enumerate()
            {
                per_input[i].push(grad.ok_or_else(|| {
                    crate::ModelError::Input(format!("{}: no gradient for input {i}", G::NAME))
                })?);
            }
        }
        per_input
            .into_iter()
            .zip(inputs)
            .map(|(grads, x)| Ok(Some(Tensor::stack(&grads, 0)?.reshape(x.shape())?)))
            .collect()
    }
}

/// [`linear`] per model of a stack, as one graph node whose value and gradient are computed
/// model by model with the single-model operation (so each model gets exactly its single
/// operation's numbers; on the CPU there is no launch cost to save by batching).
///
/// # Shapes
/// `x [M, ..., in]`, `w [M, in, out]`, `b [M, out]` -> `[M, ..., out]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
pub(crate) fn stacked_linear(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    cpu_kernels: bool,
) -> Result<Tensor> {
    let (m, n_in, n_out) = w.dims3()?;
    let rows = x.elem_count() / (m * n_in).max(1);
    let (xd, wd, bd) = (x.detach(), w.detach(), b.detach());
    let ys = (0..m)
        .map(|i| {
            affine_rows(
                &xd.get(i)?.reshape((rows, n_in))?,
                &wd.get(i)?,
                &bd.get(i)?,
                cpu_kernels,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out_shape = x.dims()[1..].to_vec();
    if let Some(last) = out_shape.last_mut() {
        *last = n_out;
    }
    let mut dims = vec![m];
    dims.extend(&out_shape);
    let grad = PerModel {
        inner: AffineGrad {
            layout: None,
            cpu_kernels,
        },
        models: m,
        out_shape,
    };
    attach(&[x, w, b], Tensor::stack(&ys, 0)?.reshape(dims)?, grad)
}

/// [`project_heads`] per model of a stack (as [`stacked_linear`]), the model axis folded into the
/// batch of the result.
///
/// # Shapes
/// `x [M, B, T, D]`, `w [M, H, D, d]`, `b [M, H, d]` -> `[M * B, H, T, d]` (contiguous).
///
/// # Errors
/// Candle errors on mismatched shapes.
pub(crate) fn stacked_project_heads(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    cpu_kernels: bool,
) -> Result<Tensor> {
    let (m, bsz, t, _) = x.dims4()?;
    let (_, h, _, d) = w.dims4()?;
    let (xd, wd, bd) = (x.detach(), w.detach(), b.detach());
    let ys = (0..m)
        .map(|i| heads_value(&xd.get(i)?, &wd.get(i)?, &bd.get(i)?, cpu_kernels))
        .collect::<Result<Vec<_>>>()?;
    let grad = PerModel {
        inner: AffineGrad {
            layout: Some((bsz, t, h, d)),
            cpu_kernels,
        },
        models: m,
        out_shape: vec![bsz, h, t, d],
    };
    attach(&[x, w, b], Tensor::cat(&ys, 0)?, grad)
}

/// [`layer_norm`] per model of a stack (as [`stacked_linear`]).
///
/// # Shapes
/// `x [M, ..., D]`, `w [M, D]`, `b [M, D]` -> `[M, ..., D]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
pub(crate) fn stacked_layer_norm(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
    cpu_kernels: bool,
) -> Result<Tensor> {
    let m = w.dim(0)?;
    let x = x.contiguous()?;
    let (w, b) = (w.contiguous()?, b.contiguous()?);
    let (xd, wd, bd) = (x.detach(), w.detach(), b.detach());
    let ys = (0..m)
        .map(|i| {
            Ok(candle_nn::ops::layer_norm(
                &xd.get(i)?,
                &wd.get(i)?,
                &bd.get(i)?,
                eps as f32,
            )?)
        })
        .collect::<Result<Vec<_>>>()?;
    let grad = PerModel {
        inner: LayerNormGrad { eps, cpu_kernels },
        models: m,
        out_shape: x.dims()[1..].to_vec(),
    };
    attach(&[&x, &w, &b], Tensor::stack(&ys, 0)?, grad)
}

/// LayerNorm over the last axis with scale `w` and bias `b`: candle's fused kernel forward, the
/// hand-written gradient backward (module docs); with `cpu_kernels` the gradient is one pass over
/// the rows ([`cpu::layer_norm_backward`]). Numerically the flax `LayerNorm` of the paper's code
/// (`E[x^2] - mean^2` variance).
///
/// # Shapes
/// `x [..., D]`, `w [D]`, `b [D]` -> `[..., D]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
pub(crate) fn layer_norm(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
    cpu_kernels: bool,
) -> Result<Tensor> {
    let x = x.contiguous()?;
    let (w, b) = (w.contiguous()?, b.contiguous()?);
    let y = candle_nn::ops::layer_norm(&x.detach(), &w.detach(), &b.detach(), eps as f32)?;
    attach(&[&x, &w, &b], y, LayerNormGrad { eps, cpu_kernels })
}

/// The gradient of [`layer_norm`].
struct LayerNormGrad {
    /// Epsilon under the square root.
    eps: f64,
    /// Whether the CPU kernels run.
    cpu_kernels: bool,
}

impl Gradient for LayerNormGrad {
    const NAME: &'static str = "hyperlens-layer-norm";

    fn gradients(&self, inputs: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (dx, dw, db) =
            layer_norm_backward(inputs[0], inputs[1], g, self.eps, self.cpu_kernels)?;
        Ok(vec![Some(dx), Some(dw), Some(db)])
    }
}

/// The LayerNorm gradient (module docs): `(dx, dw, db)` from the input, the scale and the gradient of
/// the output.
///
/// # Shapes
/// `x [..., D]`, `w [D]`, `g [..., D]` -> `([..., D], [D], [D])`.
///
/// # Errors
/// Candle errors.
fn layer_norm_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    eps: f64,
    cpu_kernels: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let d = x.dim(D::Minus1)?;
    let rows = x.elem_count() / d.max(1);
    let x2 = x.reshape((rows, d))?;
    let g2 = g.reshape((rows, d))?;
    if cpu_kernels {
        // float32 on the CPU: one pass over the rows.
        let (dx, dw, db) = cpu::layer_norm_backward(&x2, w, &g2, eps)?;
        return Ok((dx.reshape(x.shape())?, dw, db));
    }
    let xc = x2.broadcast_sub(&x2.mean_keepdim(1)?)?;
    let r = (xc.sqr()?.mean_keepdim(1)? + eps)?.sqrt()?.recip()?;
    let xhat = xc.broadcast_mul(&r)?;
    let db = sum_rows(&g2, cpu_kernels)?;
    let dw = sum_rows(&(&g2 * &xhat)?, cpu_kernels)?;
    let gh = ops(cpu_kernels).mul_leading(&g2, w)?;
    let m1 = gh.mean_keepdim(1)?;
    let m2 = (&gh * &xhat)?.mean_keepdim(1)?;
    let dx = (gh.broadcast_sub(&m1)? - xhat.broadcast_mul(&m2)?)?.broadcast_mul(&r)?;
    Ok((dx.reshape(x.shape())?, dw, db))
}

/// The softmax over the last axis: candle's fused kernel forward, `dx = y * (g - sum(g * y))`
/// backward (with `cpu_kernels`, one pass over the rows).
///
/// # Shapes
/// Any shape of rank >= 1; normalises over the last axis.
///
/// # Errors
/// Candle errors.
pub(crate) fn softmax_last_dim(x: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    let x = x.contiguous()?;
    let y = candle_nn::ops::softmax_last_dim(&x.detach())?;
    attach(&[&x], y.clone(), SoftmaxGrad { y, cpu_kernels })
}

/// The gradient of [`softmax_last_dim`].
struct SoftmaxGrad {
    /// The forward result.
    y: Tensor,
    /// Whether the CPU kernels run.
    cpu_kernels: bool,
}

impl Gradient for SoftmaxGrad {
    const NAME: &'static str = "hyperlens-softmax-last-dim";

    fn gradients(&self, _: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(softmax_backward(&self.y, g, self.cpu_kernels)?)])
    }
}

/// The softmax gradient `dx = y * (g - sum(g * y))` over the last axis.
///
/// # Shapes
/// `y`, `g` of one shape -> that shape.
///
/// # Errors
/// Candle errors.
fn softmax_backward(y: &Tensor, g: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    if cpu_kernels {
        // float32 on the CPU: one pass over the rows.
        return cpu::softmax_backward(y, g);
    }
    let dot = (g * y)?.sum_keepdim(D::Minus1)?;
    Ok((g.broadcast_sub(&dot)? * y)?)
}

/// The mean over axis 1 (heads), kept as an axis of 1.
///
/// # Shapes
/// `x [B, H, rest...]` -> `[B, 1, rest...]`.
fn mean_over_heads(x: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    if cpu_kernels {
        return super::broadcast::mean_over_heads(x);
    }
    Ok(x.mean_keepdim(1)?)
}

/// Normalisation, attention dropout and the HYLA value network (`mlp_relu` / `mlp_linear`) as one
/// graph node with a hand-written gradient; the forward values are those of
/// [`crate::ops::reference::mix`], computed with the same candle operations on detached inputs.
///
/// With `a = normalise(s)` and `a' = a * dropout`: `hidden[b,j,i] = act(sum_h a'[b,h,i,j] v[b,h,j])`,
/// `o[b,i,h] = sum_j a'[b,h,i,j] hidden[b,i,j]` (`docs/spec/models.md`, "Value networks"). Backward,
/// from `go`: `g hidden = a'^T go`, `g a' = go hidden^T` from the second product; through the
/// activation (ReLU: where `hidden > 0`); `g a' += g hidden v^T`, `g v = a'^T g hidden` from the
/// first; `g a = g a' * dropout`; then the normalisation: RMSHead `a = m r`,
/// `r = (mean_h m^2 + eps)^(-1/2)`: `g m = r g a - m r^3 mean_h(g a * m)`; softmax:
/// `g m = a (g a - sum_k g a * a)`; none: `g m = g a`; and the mask (`g s = g m` where visible, 0
/// elsewhere). Every step is checked against candle's autodiff of the composed operations in this
/// module's tests and through the model's float64 and JAX gradient tests.
///
/// # Shapes
/// `s [B, H, Q, K]` (scaled scores with the position bias), `v [B, H, K, d]`, `mask` `u8 [Q, K]`
/// (1 = visible), `dropout` `f32` broadcastable to `[B, H, Q, K]`. Returns `(o [B, Q, H, d],
/// attention [B, H, Q, K])` as [`crate::ops::reference::mix`]; the attention is detached.
///
/// # Errors
/// Candle errors on inconsistent shapes.
pub(crate) fn mlp_value_mix(
    s: &Tensor,
    v: &Tensor,
    mixer: Mixer,
    mask: Option<&Tensor>,
    dropout: Option<&Tensor>,
    cpu_kernels: bool,
) -> Result<(Tensor, Tensor)> {
    let normalisation = mixer.normalisation();
    let relu = mixer.value_network() == crate::mixer::ValueNetwork::MlpRelu;
    let (s, v) = (s.contiguous()?, v.contiguous()?);
    let sd = s.detach();
    // The visibility mask as 0 / 1 floats, for the normalisations other than softmax (whose
    // gradient is already 0 at hidden pairs).
    let mask01 = match normalisation {
        Normalisation::Softmax => None,
        _ => mask.map(|m| m.to_dtype(sd.dtype())).transpose()?,
    };
    // The masked scores (0 where hidden).
    let masked = || -> Result<Tensor> {
        Ok(match &mask01 {
            Some(m01) => sd.broadcast_mul(m01)?,
            None => sd.clone(),
        })
    };
    // What each normalisation's gradient needs.
    let (attention, norm) = match normalisation {
        Normalisation::RmsHead => {
            let m = masked()?;
            let r = (mean_over_heads(&m.sqr()?, cpu_kernels)? + RMS_HEAD_EPS)?
                .sqrt()?
                .recip()?;
            (m.broadcast_mul(&r)?, NormGrad::RmsHead { m, r })
        }
        Normalisation::None => (masked()?, NormGrad::None),
        Normalisation::Softmax => {
            let a = reference::normalise(ops(cpu_kernels), &sd, normalisation, mask)?;
            (a.clone(), NormGrad::Softmax { a })
        }
    };
    let ad = match dropout {
        Some(d) => attention.broadcast_mul(d)?,
        None => attention.clone(),
    };
    let net = reference::mlp_value_network(&ad, &v.detach(), relu)?;
    if !(s.track_op() || v.track_op()) {
        return Ok((net.o, attention));
    }
    let o = net.o.clone();
    let node = MlpValueMixGrad {
        norm,
        relu,
        mask01,
        dropout: dropout.cloned(),
        net,
        cpu_kernels,
    };
    Ok((attach(&[&s, &v], o, node)?, attention))
}

/// What the gradient of a normalisation needs from the forward pass.
enum NormGrad {
    /// RMSHead: the masked scores `m [B, H, Q, K]` and `r = 1 / rms` over heads `[B, 1, Q, K]`.
    RmsHead {
        /// Masked scores.
        m: Tensor,
        /// `1 / sqrt(mean_h m^2 + eps)`.
        r: Tensor,
    },
    /// Softmax: the attention `a [B, H, Q, K]` (before dropout).
    Softmax {
        /// The softmax output.
        a: Tensor,
    },
    /// No normalisation.
    None,
}

/// The graph node of [`mlp_value_mix`]: the intermediates its gradient needs.
struct MlpValueMixGrad {
    /// The normalisation and what its gradient needs.
    norm: NormGrad,
    /// Whether the value network has the ReLU (`mlp_relu`).
    relu: bool,
    /// The visibility mask as 0 / 1 floats `[Q, K]` (none for softmax).
    mask01: Option<Tensor>,
    /// The dropout multiplier, broadcastable to `[B, H, Q, K]`.
    dropout: Option<Tensor>,
    /// The value network's products on the dropped-out attention, with the output.
    net: MlpValueNetwork,
    /// Whether the CPU kernels run.
    cpu_kernels: bool,
}

impl MlpValueMixGrad {
    /// The gradients of the scores and the values from that of the output (docs of
    /// [`mlp_value_mix`]).
    fn score_and_value_gradients(&self, go: &Tensor) -> Result<(Tensor, Tensor)> {
        let go = go.contiguous()?;
        let g_a_ihj = go.matmul(&self.net.hidden_ijd.t()?)?; // [B, Q, H, K]
        let g_hidden_ijd = self.net.a_ihj.t()?.matmul(&go)?; // [B, Q, K, d]
        let mut g_hidden = g_hidden_ijd.transpose(1, 2)?; // [B, K, Q, d]
        if self.relu {
            let on = self.net.hidden.gt(0f64)?.to_dtype(go.dtype())?;
            g_hidden = (g_hidden * on)?;
        }
        let g_hidden = g_hidden.contiguous()?;
        let g_a_jih = g_hidden.matmul(&self.net.v_jhd.t()?)?; // [B, K, Q, H]
        let g_v = self.net.a_jih.t()?.matmul(&g_hidden)?.transpose(1, 2)?; // [B, H, K, d]
        let g_ad = (g_a_ihj.transpose(1, 2)? + g_a_jih.permute((0, 3, 2, 1))?)?; // [B, H, Q, K]
        let g_a = match &self.dropout {
            Some(d) => g_ad.broadcast_mul(d)?,
            None => g_ad,
        };
        let g_s = match &self.norm {
            NormGrad::RmsHead { m, r } => {
                let dot = mean_over_heads(&(&g_a * m)?, self.cpu_kernels)?;
                let r3 = (r.sqr()? * r)?;
                mask_gradient(
                    (g_a.broadcast_mul(r)? - m.broadcast_mul(&(dot * r3)?)?)?,
                    self.mask01.as_ref(),
                )?
            }
            NormGrad::None => mask_gradient(g_a, self.mask01.as_ref())?,
            // Hidden pairs have a = 0, so the softmax gradient is already 0 there.
            NormGrad::Softmax { a } => softmax_backward(a, &g_a, self.cpu_kernels)?,
        };
        Ok((g_s, g_v))
    }
}

/// The gradient through the mask of the `none` / RMSHead normalisations: 0 at hidden pairs.
fn mask_gradient(g: Tensor, mask01: Option<&Tensor>) -> Result<Tensor> {
    Ok(match mask01 {
        Some(m01) => g.broadcast_mul(m01)?,
        None => g,
    })
}

impl Gradient for MlpValueMixGrad {
    const NAME: &'static str = "hyperlens-mlp-value-mix";

    fn gradients(&self, _: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (g_s, g_v) = self.score_and_value_gradients(g)?;
        Ok(vec![Some(g_s), Some(g_v)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::close;
    use crate::ops::Ops;
    use candle_core::{DType, Device, Var};

    /// The hand-written gradient formulas against candle's autodiff of the composed operations in
    /// float64 (only the formulas are compared), with both CPU forms of the leading-axis sums.
    #[test]
    fn gradient_formulas_match_autodiff_in_float64() {
        let dev = Device::Cpu;
        for fast in [true, false] {
            {
                let x = Var::from_tensor(
                    &Tensor::randn(0f64, 1.0, (3, 5, 7), &dev)
                        .unwrap()
                        .affine(2.0, 0.7)
                        .unwrap(),
                )
                .unwrap();
                let w = Var::randn(1f64, 0.3, 7, &dev).unwrap();
                let b = Var::randn(0f64, 0.3, 7, &dev).unwrap();
                let g = Tensor::randn(0f64, 1.0, (3, 5, 7), &dev).unwrap();
                let (xt, wt, bt) = (x.as_tensor(), w.as_tensor(), b.as_tensor());
                let y = reference::layer_norm(ops(fast), xt, wt, bt, 1e-6).unwrap();
                let auto = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
                let (dx, dw, db) = layer_norm_backward(xt, wt, &g, 1e-6, false).unwrap();
                close(&dx, auto.get(xt).unwrap(), 1e-12);
                close(&dw, auto.get(wt).unwrap(), 1e-12);
                close(&db, auto.get(bt).unwrap(), 1e-12);
                let s = candle_nn::ops::softmax(xt, D::Minus1).unwrap();
                let auto = (&s * &g).unwrap().sum_all().unwrap().backward().unwrap();
                close(
                    &softmax_backward(&s, &g, false).unwrap(),
                    auto.get(xt).unwrap(),
                    1e-12,
                );
            }
        }
    }

    /// The fused float32 path (kernel forward, custom backward) against the composed operations,
    /// values and gradients, through a loss that uses both.
    #[test]
    fn fused_layer_norm_and_softmax_match_the_composed_ops() {
        let dev = Device::Cpu;
        for fast in [true, false] {
            {
                let x = Var::from_tensor(
                    &Tensor::randn(0f32, 1.0, (3, 5, 7), &dev)
                        .unwrap()
                        .affine(2.0, 0.7)
                        .unwrap(),
                )
                .unwrap();
                let w = Var::randn(1f32, 0.3, 7, &dev).unwrap();
                let b = Var::randn(0f32, 0.3, 7, &dev).unwrap();
                let c = Tensor::randn(0f32, 1.0, (3, 5, 7), &dev).unwrap();
                let run = |fused: bool| {
                    let (xt, wt, bt) = (x.as_tensor(), w.as_tensor(), b.as_tensor());
                    let (y, s) = if fused {
                        let y = layer_norm(xt, wt, bt, 1e-6, fast).unwrap();
                        let s = softmax_last_dim(&y, fast).unwrap();
                        (y, s)
                    } else {
                        let y = reference::layer_norm(Ops::Reference, xt, wt, bt, 1e-6).unwrap();
                        let s = candle_nn::ops::softmax(&y, D::Minus1).unwrap();
                        (y, s)
                    };
                    let loss = ((&y * &c).unwrap().sum_all().unwrap()
                        + (&s * &c).unwrap().sqr().unwrap().sum_all().unwrap())
                    .unwrap();
                    let g = loss.backward().unwrap();
                    let get = |v: &Var| g.get(v.as_tensor()).unwrap().clone();
                    (y, s, get(&x), get(&w), get(&b))
                };
                let (y1, s1, gx1, gw1, gb1) = run(true);
                let (y0, s0, gx0, gw0, gb0) = run(false);
                close(&y1, &y0, 2e-5);
                close(&s1, &s0, 2e-6);
                close(&gx1, &gx0, 2e-5);
                close(&gw1, &gw0, 2e-5);
                close(&gb1, &gb0, 2e-5);
            }
        }
    }

    /// The fused HYLA value network (every normalisation, with and without the ReLU, with mask and
    /// dropout) against candle's autodiff of the composed operations: output, attention and the
    /// gradients of scores and values, with both CPU forms.
    #[test]
    fn fused_value_network_matches_the_composed_ops() {
        let (mask, drop, s, v, c) = crate::ops::test_util::mix_inputs((2, 3, 5, 4), 5);
        for fast in [true, false] {
            {
                for mixer in [
                    Mixer::Hyla,
                    Mixer::HylaNoRmsHead,
                    Mixer::HylaLinearValue,
                    Mixer::SoftmaxHypatt,
                ] {
                    for (m, dr) in [(Some(&mask), Some(&drop)), (None, None)] {
                        let run = |fused: bool| {
                            let (o, a) = if fused {
                                mlp_value_mix(s.as_tensor(), v.as_tensor(), mixer, m, dr, fast)
                                    .unwrap()
                            } else {
                                reference::mix(
                                    Ops::Reference,
                                    s.as_tensor(),
                                    v.as_tensor(),
                                    mixer,
                                    m,
                                    dr,
                                )
                                .unwrap()
                            };
                            let g = (&o * &c).unwrap().sum_all().unwrap().backward().unwrap();
                            let gs = g.get(s.as_tensor()).unwrap().clone();
                            let gv = g.get(v.as_tensor()).unwrap().clone();
                            (o, a, gs, gv)
                        };
                        let (o1, a1, gs1, gv1) = run(true);
                        let (o0, a0, gs0, gv0) = run(false);
                        close(&o1, &o0, 1e-5);
                        close(&a1, &a0, 1e-5);
                        close(&gs1, &gs0, 1e-4);
                        close(&gv1, &gv0, 1e-4);
                    }
                }
            }
        }
    }

    /// Untracked inputs give the fused value without a graph node; a non-contiguous input works.
    #[test]
    fn fused_ops_on_views_and_without_gradients() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (4, 6, 5), &dev).unwrap();
        let view = x.narrow(1, 2, 3).unwrap();
        assert!(!view.is_contiguous());
        let w = Tensor::ones(5, DType::F32, &dev).unwrap();
        let b = Tensor::zeros(5, DType::F32, &dev).unwrap();
        let y = layer_norm(&view, &w, &b, 1e-6, true).unwrap();
        assert!(!y.track_op());
        close(
            &y,
            &reference::layer_norm(Ops::Reference, &view, &w, &b, 1e-6).unwrap(),
            2e-5,
        );
        let s = softmax_last_dim(&view, true).unwrap();
        close(
            &s,
            &candle_nn::ops::softmax(&view, D::Minus1).unwrap(),
            1e-6,
        );
        let rows: Vec<f32> = s
            .sum_keepdim(D::Minus1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(rows.iter().all(|r| (r - 1.0).abs() < 1e-6));
    }
}
