//! The multi-head attention layer: projections to heads, scaled scores with an optional relative
//! position bias, and the mixer ([`crate::ops::Ops::mix`]: normalisation into the latent codes and
//! the value network), then the output projection. Shared by the SRAVEN transformer and the token
//! language models.
//!
//! Source: `docs/spec/models.md` ("The block", "Scores and the three normalisations"); the paper's
//! `MultiHeadDotProductAttention` (`hyla/models/attention.py`). Named output after burn's
//! `MhaOutput`.

use candle_core::Tensor;

use super::hook_point::HookPoints;
use super::position::relative_position_bias;
use crate::error::{ModelError, Result};
use crate::hooks::mix_hooked;
use crate::mixer::Mixer;
use crate::ops::Ops;

/// One attention sub-layer: per-head projections, optional T5 relative-position table, mixer.
#[derive(Debug, Clone)]
pub struct Attention {
    /// Query kernel `[H, D, d]`.
    pub w_q: Tensor,
    /// Key kernel `[H, D, d]`.
    pub w_k: Tensor,
    /// Value kernel `[H, D, d]`.
    pub w_v: Tensor,
    /// Query bias `[H, d]`.
    pub b_q: Tensor,
    /// Key bias `[H, d]`.
    pub b_k: Tensor,
    /// Value bias `[H, d]`.
    pub b_v: Tensor,
    /// Output kernel `[H, d, D]`.
    pub w_o: Tensor,
    /// Output bias `[D]`.
    pub b_o: Tensor,
    /// T5 relative-position table `[H, n_buckets]` (the SRAVEN transformer; none in token models,
    /// which have learned absolute positions).
    pub rel_pos: Option<Tensor>,
    /// The sequence mixer.
    pub mixer: Mixer,
}

/// The positional and masking inputs of an attention sub-layer, shared by the blocks of a pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionInputs<'a> {
    /// `u32 [T, T]` relative-position buckets ([`super::position::bucket_matrix`]), used with the
    /// relative-position table.
    pub buckets: Option<&'a Tensor>,
    /// `u8` mask broadcastable to `[B, H, T, T]` (1 = visible).
    pub mask: Option<&'a Tensor>,
    /// `f32` attention dropout broadcastable to `[B, H, T, T]` (training; the hooked pass has
    /// none).
    pub dropout: Option<&'a Tensor>,
}

/// What [`Attention::forward`] returns.
#[derive(Debug, Clone)]
pub struct AttentionOutput {
    /// The sub-layer's output `[B, T, D]`, to be added to the residual stream.
    pub out: Tensor,
    /// The normalised attention `[B, H, Q, K]` (`[batch, head, query, key]`): the latent codes,
    /// before dropout (TransformerLens hook `blocks.{l}.attn.hook_pattern`).
    pub pattern: Tensor,
}

impl Attention {
    /// Runs the sub-layer of block `l` on (normalised) input:
    /// `s[b,h,i,j] = q[b,h,i] . k[b,h,j] / sqrt(d) + bias[h,i,j]`, then [`Ops::mix`], then
    /// `out = sum_h o[h] W_O[h] + b_O`, with the hook points `blocks.{l}.attn.hook_q`, `hook_k`,
    /// `hook_v`, `hook_attn_scores`, `hook_pattern` (and `hook_value_hidden`), `hook_z`. With
    /// [`super::NoHooks`] they are the identity; with a hook attached the mix runs in its
    /// decomposed reference form (`crate::hooks::mix_hooked`), where the pattern and `z` exist.
    ///
    /// # Shapes
    /// `x [B, T, D]`; `inputs` as [`AttentionInputs`]. Returns [`AttentionOutput`].
    ///
    /// # Errors
    /// Candle errors on shape mismatches; a hook's error or a replacement of another shape;
    /// [`ModelError::Input`] for dropout in a hooked pass.
    pub fn forward<P: HookPoints + ?Sized>(
        &self,
        ops: Ops,
        x: &Tensor,
        l: usize,
        inputs: AttentionInputs<'_>,
        hooks: &mut P,
    ) -> Result<AttentionOutput> {
        let (bsz, t, _) = x.dims3()?;
        let (h, d, dm) = self.w_o.dims3()?;
        let q = ops.project_heads(x, &self.w_q, &self.b_q)?;
        let q = hooks.at_block_heads(l, "attn.hook_q", q)?;
        let k = ops.project_heads(x, &self.w_k, &self.b_k)?;
        let k = hooks.at_block_heads(l, "attn.hook_k", k)?;
        let v = ops.project_heads(x, &self.w_v, &self.b_v)?;
        let v = hooks.at_block_heads(l, "attn.hook_v", v)?;
        let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
        let scores = match (&self.rel_pos, inputs.buckets) {
            (Some(table), Some(buckets)) => {
                ops.add_leading(&scores, &relative_position_bias(table, buckets)?)?
            }
            _ => scores,
        };
        let scores = hooks.at_block(l, "attn.hook_attn_scores", scores)?;
        let (o, pattern) = match hooks.hooks() {
            None => {
                let (o, pattern) = ops.mix(&scores, &v, self.mixer, inputs.mask, inputs.dropout)?;
                (o, hooks.at_block(l, "attn.hook_pattern", pattern)?)
            }
            Some(_) if inputs.dropout.is_some() => {
                return Err(ModelError::Input(
                    "the hooked pass runs in evaluation mode, without attention dropout".into(),
                ))
            }
            Some(hooks) => mix_hooked(ops, &scores, &v, self.mixer, inputs.mask, hooks, l)?,
        };
        let out = ops.linear(
            &o.reshape((bsz, t, h * d))?,
            &self.w_o.reshape((h * d, dm))?,
            &self.b_o,
        )?;
        Ok(AttentionOutput { out, pattern })
    }
}
