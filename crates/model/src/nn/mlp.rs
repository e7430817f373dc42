//! The MLP sub-layer of a block: `Linear(D, D_mlp) -> GELU (tanh) -> Linear(D_mlp, D)`
//! (`docs/spec/models.md`, "The block"; TransformerLens `mlp.W_in`, `mlp.W_out`).

use candle_core::Tensor;

use super::Linear;
use crate::error::Result;
use crate::ops::Ops;

/// The MLP sub-layer.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// `W_in [D, D_mlp]`, `b_in [D_mlp]`.
    pub input: Linear,
    /// `W_out [D_mlp, D]`, `b_out [D]`.
    pub output: Linear,
}

impl Mlp {
    /// # Shapes
    /// `x [..., D]` -> `[..., D]`.
    ///
    /// # Errors
    /// Candle errors on shape mismatches.
    pub fn forward(&self, ops: Ops, x: &Tensor) -> Result<Tensor> {
        let h = ops.gelu_tanh(&self.input.forward(ops, x)?)?;
        self.output.forward(ops, &h)
    }
}
