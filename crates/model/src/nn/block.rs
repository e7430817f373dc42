//! One pre-LayerNorm transformer block, shared by the SRAVEN transformer and the token models:
//! `h += Attn(LN1(h))`, then with an MLP `h += MLP(LN2(h))` (`docs/spec/models.md`, "The block";
//! TransformerLens `TransformerBlock` with `normalization_type = "LN"` or none).

use candle_core::Tensor;

use super::params::Params;
use super::{Attention, LayerNorm, Linear, Mlp};
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

/// One transformer block.
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
    /// The residual stream after the block `[B, T, D]` (`blocks.{l}.hook_resid_post`).
    pub resid: Tensor,
    /// The attention pattern `[B, H, T, T]`: the latent codes (`blocks.{l}.attn.hook_pattern`).
    pub pattern: Tensor,
}

/// An optional LayerNorm: the identity without one.
fn norm(ops: Ops, ln: Option<&LayerNorm>, x: &Tensor) -> Result<Tensor> {
    match ln {
        Some(ln) => ln.forward(ops, x),
        None => Ok(x.clone()),
    }
}

impl Block {
    /// Block `l` from named parameters (TransformerLens names `blocks.{l}.ln1.w`, `.attn.W_Q`, ...).
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

    /// Runs the block on the residual stream `h`.
    ///
    /// # Shapes
    /// `h [B, T, D]`; `buckets`, `mask`, `dropout` as [`Attention::forward`]. Returns
    /// [`BlockOutput`].
    ///
    /// # Errors
    /// Candle errors on shape mismatches.
    pub fn forward(
        &self,
        ops: Ops,
        h: &Tensor,
        buckets: Option<&Tensor>,
        mask: Option<&Tensor>,
        dropout: Option<&Tensor>,
    ) -> Result<BlockOutput> {
        let x = norm(ops, self.ln1.as_ref(), h)?;
        let attn = self.attn.forward(ops, &x, buckets, mask, dropout)?;
        let mut resid = (h + attn.out)?;
        if let Some(mlp) = &self.mlp {
            let x = norm(ops, self.ln2.as_ref(), &resid)?;
            resid = (&resid + mlp.forward(ops, &x)?)?;
        }
        Ok(BlockOutput {
            resid,
            pattern: attn.pattern,
        })
    }
}
