//! LayerNorm with a learned scale and bias (Ba et al. 2016): eps 1e-6 in the SRAVEN transformer
//! (flax default), 1e-5 in the token models (TransformerLens default).

use candle_core::Tensor;

use super::hook_point::HookPoints;
use crate::error::Result;
use crate::hooks::layer_norm_hooked;
use crate::ops::Ops;

/// LayerNorm over the last axis: `(x - mean) / sqrt(var + eps) * w + b`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// Scale `[D]`.
    pub w: Tensor,
    /// Bias `[D]`.
    pub b: Tensor,
    /// Epsilon under the square root.
    pub eps: f64,
}

impl LayerNorm {
    /// # Shapes
    /// `x [..., D]` -> `[..., D]`.
    ///
    /// # Errors
    /// Candle errors on a shape mismatch.
    pub fn forward(&self, ops: Ops, x: &Tensor) -> Result<Tensor> {
        ops.layer_norm(x, &self.w, &self.b, self.eps)
    }

    /// [`LayerNorm::forward`] with the hook points `{prefix}.hook_scale` and
    /// `{prefix}.hook_normalized` (`prefix()` is called only when a hook is attached, which also
    /// makes the LayerNorm run in its decomposed form, `crate::hooks::layer_norm_hooked`).
    ///
    /// # Shapes
    /// `x [B, T, D]` -> `[B, T, D]`.
    ///
    /// # Errors
    /// Candle errors on a shape mismatch; a hook's error or a replacement of another shape.
    pub fn forward_hooked<P: HookPoints + ?Sized>(
        &self,
        ops: Ops,
        x: &Tensor,
        prefix: impl FnOnce() -> String,
        hooks: &mut P,
    ) -> Result<Tensor> {
        match hooks.hooks() {
            None => self.forward(ops, x),
            Some(h) => layer_norm_hooked(ops, self, x, h, &prefix()),
        }
    }
}
