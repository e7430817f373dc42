//! Affine layers: `x W + b` over the last axis, with the weight in `[in, out]` layout (flax and
//! TransformerLens `W_in` / `W_U` layout), or a stack of them with a leading model axis.

use candle_core::Tensor;

use crate::error::Result;
use crate::ops::Ops;

/// `x W + b` over the last axis; with a leading model axis on the weights (a stack of M models,
/// `crate::StackedTransformer`), each model's map on its own slice of the input.
#[derive(Debug, Clone)]
pub struct Linear {
    /// Weight `[in, out]`, or `[M, in, out]` for a stack.
    pub w: Tensor,
    /// Bias `[out]`, or `[M, out]` for a stack.
    pub b: Tensor,
}

impl Linear {
    /// A layer from its weight and bias.
    pub fn new(w: Tensor, b: Tensor) -> Self {
        Self { w, b }
    }

    /// Whether the weights carry a leading model axis (`w [M, in, out]`).
    pub fn is_stacked(&self) -> bool {
        self.w.rank() == 3
    }

    /// [`Ops::linear`], or for a stack [`Ops::linear_stacked`] (model `m` maps `x[m]`).
    ///
    /// # Shapes
    /// `x [..., in]` -> `[..., out]`; for a stack `x [M, ..., in]` -> `[M, ..., out]`.
    ///
    /// # Errors
    /// Candle errors on a shape mismatch.
    pub fn forward(&self, ops: Ops, x: &Tensor) -> Result<Tensor> {
        if self.is_stacked() {
            return ops.linear_stacked(x, &self.w, &self.b);
        }
        ops.linear(x, &self.w, &self.b)
    }
}
