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
//! `overhead`, prints the counts; `docs/performance.md` has the current ones). On the CPU the step
//! time did not change measurably.
//!
//! The fused forward kernels compute the variance as `E[x^2] - mean^2` in float32, as flax's
//! `LayerNorm` does by default (`use_fast_variance`), where the composed form subtracted the mean
//! first; the two agree to float32 rounding on the model's activations (the tests and the float64
//! references of `tests/model.rs`). Devices other than the CPU and CUDA get the reference forms
//! ([`super::super::Ops`] decides). Each node goes into the graph through [`super::attach`].
//!
//! The operations live by concern: [`affine`] (`linear`, `project_heads`), [`norm`] (LayerNorm,
//! softmax), [`value_mix`] (the HYLA value network) and [`stacked`] (the per-model forms of a stack
//! of models).

mod affine;
mod norm;
mod stacked;
#[cfg(test)]
mod tests;
mod value_mix;

use candle_core::Tensor;

use crate::error::Result;
use crate::ops::Ops;

pub(crate) use affine::{linear, project_heads};
pub(crate) use norm::{layer_norm, softmax_last_dim};
pub(crate) use stacked::{stacked_layer_norm, stacked_linear, stacked_project_heads};
pub(crate) use value_mix::mlp_value_mix;

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
