//! LayerNorm and the softmax over the last axis: candle's fused kernels forward, the hand-written
//! gradients backward.

use candle_core::{Tensor, D};

use super::super::{attach, cpu, Gradient};
use super::{ops, sum_rows};
use crate::error::Result;

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
pub(super) struct LayerNormGrad {
    /// Epsilon under the square root.
    pub(super) eps: f64,
    /// Whether the CPU kernels run.
    pub(super) cpu_kernels: bool,
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
pub(super) fn layer_norm_backward(
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
pub(super) fn softmax_backward(y: &Tensor, g: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    if cpu_kernels {
        // float32 on the CPU: one pass over the rows.
        return cpu::softmax_backward(y, g);
    }
    let dot = (g * y)?.sum_keepdim(D::Minus1)?;
    Ok((g.broadcast_sub(&dot)? * y)?)
}
