//! The MLP sub-layer of a block: `Linear(D, D_mlp) -> GELU (tanh) -> Linear(D_mlp, D)`
//! (`docs/spec/models.md`, "The block"; TransformerLens `mlp.W_in`, `mlp.W_out`).

use candle_core::Tensor;

use super::hook_point::HookPoints;
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
    /// The MLP of block `l`, with its hook points `blocks.{l}.mlp.hook_pre` and `mlp.hook_post`
    /// (the identity with [`super::NoHooks`]).
    ///
    /// # Shapes
    /// `x [..., D]` -> `[..., D]`; for a stack (weights with a leading model axis) `x [M, ..., D]`.
    ///
    /// # Errors
    /// Candle errors on shape mismatches; a hook's error or a replacement of another shape.
    pub fn forward<P: HookPoints + ?Sized>(
        &self,
        ops: Ops,
        x: &Tensor,
        l: usize,
        hooks: &mut P,
    ) -> Result<Tensor> {
        let pre = hooks.at_block(l, "mlp.hook_pre", self.input.forward(ops, x)?)?;
        let post = hooks.at_block(l, "mlp.hook_post", ops.gelu_tanh(&pre)?)?;
        self.output.forward(ops, &post)
    }
}
