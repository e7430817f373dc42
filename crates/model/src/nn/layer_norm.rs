//! LayerNorm with a learned scale and bias (Ba et al. 2016): eps 1e-6 in the SRAVEN transformer
//! (flax default), 1e-5 in the token models (TransformerLens default); with a leading model axis
//! on its scale and bias for a stack of models (`crate::StackedTransformer`).

use candle_core::Tensor;

use super::hook_point::HookPoints;
use crate::error::{ModelError, Result};
use crate::hooks::layer_norm_hooked;
use crate::ops::Ops;

/// LayerNorm over the last axis: `(x - mean) / sqrt(var + eps) * w + b` (for a stack, model `m`'s
/// scale and bias on `x[m]`).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// Scale `[D]`, or `[M, D]` for a stack.
    pub w: Tensor,
    /// Bias `[D]`, or `[M, D]` for a stack.
    pub b: Tensor,
    /// Epsilon under the square root.
    pub eps: f64,
}

impl LayerNorm {
    /// Whether the scale and bias carry a leading model axis (`w [M, D]`).
    pub fn is_stacked(&self) -> bool {
        self.w.rank() == 2
    }

    /// [`Ops::layer_norm`], or for a stack [`Ops::layer_norm_stacked`].
    ///
    /// # Shapes
    /// `x [..., D]` -> `[..., D]`; for a stack `x [M, ..., D]` -> `[M, ..., D]`.
    ///
    /// # Errors
    /// Candle errors on a shape mismatch.
    pub fn forward(&self, ops: Ops, x: &Tensor) -> Result<Tensor> {
        if self.is_stacked() {
            return ops.layer_norm_stacked(x, &self.w, &self.b, self.eps);
        }
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
    /// Candle errors on a shape mismatch; a hook's error or a replacement of another shape;
    /// [`ModelError::Input`] for a hook attached to a stack (hooks read one model).
    pub fn forward_hooked<P: HookPoints + ?Sized>(
        &self,
        ops: Ops,
        x: &Tensor,
        prefix: impl FnOnce() -> String,
        hooks: &mut P,
    ) -> Result<Tensor> {
        match hooks.hooks() {
            None => self.forward(ops, x),
            Some(_) if self.is_stacked() => Err(ModelError::Input(
                "hooks attach to one model, not to a stack".into(),
            )),
            Some(h) => layer_norm_hooked(ops, self, x, h, &prefix()),
        }
    }
}
