//! One pre-LayerNorm transformer block, shared by the SRAVEN transformer and hyperlens's token
//! models: `h += Attn(LN1(h))`, then with an MLP `h += MLP(LN2(h))` (`docs/spec/models.md`, "The
//! block"; TransformerLens `TransformerBlock` with `normalization_type = "LN"` or none). Written
//! once, generic over its hook points ([`super::hook_point`]): the plain pass, training's pass and
//! the hooked pass (`crate::hooks`) are this body, and so is the pass of a stack of M models
//! (`crate::StackedTransformer`, `hyperlens train --seeds`), whose weights carry a leading model
//! axis (the layers then run each model on its own slice of `[M, B, T, D]`).

use candle_core::Tensor;

use super::hook_point::HookPoints;
use super::params::Params;
use super::{Attention, AttentionInputs, LayerNorm, Linear, Mlp};
use crate::error::Result;
use crate::mixer::Mixer;
use crate::ops::Ops;

/// The architecture of one block: which parts it has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockSpec {
    /// The LayerNorms' epsilon; `None` for a block without LayerNorm.
    pub ln_eps: Option<f64>,
    /// Whether the block has an MLP.
    pub mlp: bool,
    /// Whether the attention has a T5 relative-position table `attn.rel_pos`.
    pub rel_pos: bool,
    /// The sequence mixer.
    pub mixer: Mixer,
}

/// One transformer block (or a stack of M, every weight with a leading model axis).
#[derive(Debug, Clone)]
pub struct Block {
    /// LayerNorm before attention (`blocks.{l}.ln1`), if the model has LayerNorms.
    pub ln1: Option<LayerNorm>,
    /// Attention sub-layer (`blocks.{l}.attn`).
    pub attn: Attention,
    /// LayerNorm before the MLP (`blocks.{l}.ln2`), if the model has LayerNorms and MLPs.
    pub ln2: Option<LayerNorm>,
    /// MLP sub-layer (`blocks.{l}.mlp`), if the model has MLPs.
    pub mlp: Option<Mlp>,
}

/// What [`Block::forward`] returns.
#[derive(Debug, Clone)]
pub struct BlockOutput {
    /// The residual stream after the block `[B, T, D]` (`blocks.{l}.hook_resid_post`;
    /// `[M, B, T, D]` for a stack).
    pub resid: Tensor,
    /// The attention pattern `[B, H, T, T]`: the latent codes (`blocks.{l}.attn.hook_pattern`;
    /// `[M * B, H, T, T]` for a stack).
    pub pattern: Tensor,
}

impl Block {
    /// Block `l` from named parameters (TransformerLens names `blocks.{l}.ln1.w`, `.attn.W_Q`, ...),
    /// at their shapes or all with a leading model axis (a stack).
    ///
    /// # Errors
    /// [`crate::ModelError::Input`] naming a missing tensor.
    pub fn from_params(p: &Params, l: usize, spec: BlockSpec) -> Result<Block> {
        let get = |s: &str| p.get(&format!("blocks.{l}.{s}"));
        let ln = |s: &str| -> Result<Option<LayerNorm>> {
            spec.ln_eps
                .map(|eps| {
                    Ok(LayerNorm {
                        w: get(&format!("{s}.w"))?,
                        b: get(&format!("{s}.b"))?,
                        eps,
                    })
                })
                .transpose()
        };
        let attn = Attention {
            w_q: get("attn.W_Q")?,
            w_k: get("attn.W_K")?,
            w_v: get("attn.W_V")?,
            b_q: get("attn.b_Q")?,
            b_k: get("attn.b_K")?,
            b_v: get("attn.b_V")?,
            w_o: get("attn.W_O")?,
            b_o: get("attn.b_O")?,
            rel_pos: spec.rel_pos.then(|| get("attn.rel_pos")).transpose()?,
            mixer: spec.mixer,
        };
        let mlp = if spec.mlp {
            Some(Mlp {
                input: Linear::new(get("mlp.W_in")?, get("mlp.b_in")?),
                output: Linear::new(get("mlp.W_out")?, get("mlp.b_out")?),
            })
        } else {
            None
        };
        Ok(Block {
            ln1: ln("ln1")?,
            attn,
            ln2: if spec.mlp { ln("ln2")? } else { None },
            mlp,
        })
    }

    /// Runs block `l` on the residual stream `h`, with its hook points (`crate::hooks`'s module
    /// docs: `blocks.{l}.hook_resid_pre`, `ln1.*`, the attention's, `hook_attn_out`,
    /// `hook_resid_mid`, `ln2.*`, the MLP's, `hook_mlp_out`, `hook_resid_post`); with
    /// [`super::NoHooks`] every point is the identity and this is the plain forward pass. For a
    /// stack, model `m` runs on `h[m]` with its own weights.
    ///
    /// # Shapes
    /// `h [B, T, D]` (`[M, B, T, D]` for a stack); `inputs` as [`AttentionInputs`]. Returns
    /// [`BlockOutput`].
    ///
    /// # Errors
    /// Candle errors on shape mismatches; a hook's error or a replacement of another shape;
    /// [`crate::ModelError::Input`] for a hook attached to a stack.
    pub fn forward<P: HookPoints + ?Sized>(
        &self,
        ops: Ops,
        h: &Tensor,
        l: usize,
        inputs: AttentionInputs<'_>,
        hooks: &mut P,
    ) -> Result<BlockOutput> {
        let h = hooks.at_block(l, "hook_resid_pre", h.clone())?;
        let x = match &self.ln1 {
            Some(ln) => ln.forward_hooked(ops, &h, || format!("blocks.{l}.ln1"), hooks)?,
            None => h.clone(),
        };
        let attn = self.attn.forward(ops, &x, l, inputs, hooks)?;
        let attn_out = hooks.at_block(l, "hook_attn_out", attn.out)?;
        let mut resid = (h + attn_out)?;
        if let Some(mlp) = &self.mlp {
            resid = hooks.at_block(l, "hook_resid_mid", resid)?;
            let x = match &self.ln2 {
                Some(ln) => ln.forward_hooked(ops, &resid, || format!("blocks.{l}.ln2"), hooks)?,
                None => resid.clone(),
            };
            let out = mlp.forward(ops, &x, l, hooks)?;
            let out = hooks.at_block(l, "hook_mlp_out", out)?;
            resid = (&resid + out)?;
        }
        let resid = hooks.at_block(l, "hook_resid_post", resid)?;
        Ok(BlockOutput {
            resid,
            pattern: attn.pattern,
        })
    }
}
