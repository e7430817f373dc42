//! Affine layers: `x W + b` over the last axis, with the weight in `[in, out]` layout (flax and
//! TransformerLens `W_in` / `W_U` layout).

use candle_core::Tensor;

use crate::error::Result;
use crate::ops::Ops;

/// `x W + b` over the last axis.
#[derive(Debug, Clone)]
pub struct Linear {
    /// Weight `[in, out]`.
    pub w: Tensor,
    /// Bias `[out]`.
    pub b: Tensor,
}

impl Linear {
    /// A layer from its weight and bias.
    pub fn new(w: Tensor, b: Tensor) -> Self {
        Self { w, b }
    }

    /// # Shapes
    /// `x [..., in]` -> `[..., out]`.
    ///
    /// # Errors
    /// Candle errors on a shape mismatch.
    pub fn forward(&self, ops: Ops, x: &Tensor) -> Result<Tensor> {
        ops.linear(x, &self.w, &self.b)
    }
}
