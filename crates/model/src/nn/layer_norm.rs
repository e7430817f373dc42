//! LayerNorm with a learned scale and bias (Ba et al. 2016): eps 1e-6 in the SRAVEN transformer
//! (flax default), 1e-5 in the token models (TransformerLens default).

use candle_core::Tensor;

use crate::error::Result;
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
}
