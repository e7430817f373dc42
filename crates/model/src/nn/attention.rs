//! The multi-head attention layer: projections to heads, scaled scores with an optional relative
//! position bias, and the mixer ([`crate::ops::Ops::mix`]: normalisation into the latent codes and
//! the value network), then the output projection. Shared by the SRAVEN transformer and the token
//! language models, and by a stack of SRAVEN transformers (`crate::StackedTransformer`): with a
//! leading model axis `M` on every weight, the projections are batched products over it and the
//! operations without weights (scores, the normalisation, the value network, dropout) fold the
//! model axis into the batch.
//!
//! Source: `docs/spec/models.md` ("The block", "Scores and the three normalisations"); the paper's
//! `MultiHeadDotProductAttention` (`hyla/models/attention.py`). Named output after burn's
//! `MhaOutput`.

use candle_core::{DType, Tensor};

use super::hook_point::HookPoints;
use super::position::relative_position_bias;
use crate::error::{ModelError, Result};
use crate::hooks::mix_hooked;
use crate::mixer::Mixer;
use crate::ops::Ops;

/// One attention sub-layer: per-head projections, optional T5 relative-position table, mixer.
/// For a stack of M models every weight has a leading model axis (`w_q [M, H, D, d]`, ...).
#[derive(Debug, Clone)]
pub struct Attention {
    /// Query kernel `[H, D, d]` (`[M, H, D, d]` for a stack).
    pub w_q: Tensor,
    /// Key kernel `[H, D, d]` (`[M, H, D, d]`).
    pub w_k: Tensor,
    /// Value kernel `[H, D, d]` (`[M, H, D, d]`).
    pub w_v: Tensor,
    /// Query bias `[H, d]` (`[M, H, d]`).
    pub b_q: Tensor,
    /// Key bias `[H, d]` (`[M, H, d]`).
    pub b_k: Tensor,
    /// Value bias `[H, d]` (`[M, H, d]`).
    pub b_v: Tensor,
    /// Output kernel `[H, d, D]` (`[M, H, d, D]`).
    pub w_o: Tensor,
    /// Output bias `[D]` (`[M, D]`).
    pub b_o: Tensor,
    /// T5 relative-position table `[H, n_buckets]` (`[M, H, n_buckets]`; the SRAVEN transformer;
    /// none in token models, which have learned absolute positions).
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
    /// none); for a stack `[M, 1, T, T]`, model `m`'s mask at `[m]`.
    pub dropout: Option<&'a Tensor>,
}

/// What [`Attention::forward`] returns.
#[derive(Debug, Clone)]
pub struct AttentionOutput {
    /// The sub-layer's output `[B, T, D]` (`[M, B, T, D]` for a stack), to be added to the
    /// residual stream.
    pub out: Tensor,
    /// The normalised attention `[B, H, Q, K]` (`[batch, head, query, key]`; `[M * B, H, Q, K]`
    /// for a stack): the latent codes, before dropout (TransformerLens hook
    /// `blocks.{l}.attn.hook_pattern`).
    pub pattern: Tensor,
}

impl Attention {
    /// Whether the weights carry a leading model axis (`w_o [M, H, d, D]`).
    pub fn is_stacked(&self) -> bool {
        self.w_o.rank() == 4
    }

    /// Runs the sub-layer of block `l` on (normalised) input:
    /// `s[b,h,i,j] = q[b,h,i] . k[b,h,j] / sqrt(d) + bias[h,i,j]`, then [`Ops::mix`], then
    /// `out = sum_h o[h] W_O[h] + b_O`, with the hook points `blocks.{l}.attn.hook_q`, `hook_k`,
    /// `hook_v`, `hook_attn_scores`, `hook_pattern` (and `hook_value_hidden`), `hook_z`. With
    /// [`super::NoHooks`] they are the identity; with a hook attached the mix runs in its
    /// decomposed reference form (`crate::hooks::mix_hooked`), where the pattern and `z` exist.
    /// For a stack, model `m` runs on `x[m]` with its own weights (and reads `q`, `k`, `v`, the
    /// scores and the pattern with the model axis folded into the batch).
    ///
    /// # Shapes
    /// `x [B, T, D]` (`[M, B, T, D]` for a stack); `inputs` as [`AttentionInputs`]. Returns
    /// [`AttentionOutput`].
    ///
    /// # Errors
    /// Candle errors on shape mismatches; a hook's error or a replacement of another shape;
    /// [`ModelError::Input`] for dropout in a hooked pass, or a hook attached to a stack.
    pub fn forward<P: HookPoints + ?Sized>(
        &self,
        ops: Ops,
        x: &Tensor,
        l: usize,
        inputs: AttentionInputs<'_>,
        hooks: &mut P,
    ) -> Result<AttentionOutput> {
        if self.is_stacked() && hooks.hooks().is_some() {
            return Err(ModelError::Input(
                "hooks attach to one model, not to a stack".into(),
            ));
        }
        let d = self.w_o.dim(self.w_o.rank() - 2)?;
        let q = self.project(ops, x, &self.w_q, &self.b_q)?;
        let q = hooks.at_block_heads(l, "attn.hook_q", q)?;
        let k = self.project(ops, x, &self.w_k, &self.b_k)?;
        let k = hooks.at_block_heads(l, "attn.hook_k", k)?;
        let v = self.project(ops, x, &self.w_v, &self.b_v)?;
        let v = hooks.at_block_heads(l, "attn.hook_v", v)?;
        let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
        let scores = match (&self.rel_pos, inputs.buckets) {
            (Some(table), Some(buckets)) => self.add_position_bias(ops, scores, table, buckets)?,
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
        let out = self.output(ops, x, &o)?;
        Ok(AttentionOutput { out, pattern })
    }

    /// One per-head projection ([`Ops::project_heads`], or for a stack
    /// [`Ops::project_heads_stacked`]).
    ///
    /// # Shapes
    /// `x [B, T, D]` -> `[B, H, T, d]`; for a stack `x [M, B, T, D]` -> `[M * B, H, T, d]`.
    fn project(&self, ops: Ops, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        if self.is_stacked() {
            return ops.project_heads_stacked(x, w, b);
        }
        ops.project_heads(x, w, b)
    }

    /// The scores plus the relative-position bias `table[h, bucket(q, k)]` (each model's own table
    /// for a stack), broadcast over the batch.
    ///
    /// # Shapes
    /// `scores [B, H, T, T]` (`[M * B, H, T, T]`), `table [H, n_buckets]` (`[M, H, n_buckets]`),
    /// `buckets` `u32 [T, T]` -> the shape of `scores`.
    fn add_position_bias(
        &self,
        ops: Ops,
        scores: Tensor,
        table: &Tensor,
        buckets: &Tensor,
    ) -> Result<Tensor> {
        if !self.is_stacked() {
            return ops.add_leading(&scores, &relative_position_bias(table, buckets)?);
        }
        let (m, h, nb) = table.dims3()?;
        let (mb, _, t, _) = scores.dims4()?;
        let bsz = mb / m;
        let s = h * t * t;
        // As `[M * H, n_buckets]`: the single model's gather along the last axis of a rank-2 table.
        let bias = table
            .reshape((m * h, nb))?
            .index_select(&buckets.flatten_all()?, 1)?
            .reshape((m, 1, s))?;
        // Each model's bias over its batch. On the CPU as a product with a column of ones, as the
        // single model's `Ops::add_leading` does (exactly `1 * v`; its gradient is a batched gemm,
        // where candle's sum over the batch axis of a broadcast is slow).
        let bias = if ops == Ops::Fast && scores.device().is_cpu() {
            Tensor::ones((m, bsz, 1), DType::F32, scores.device())?.matmul(&bias)?
        } else {
            bias.broadcast_as((m, bsz, s))?
        };
        Ok((scores.reshape((m, bsz, s))? + bias)?.reshape((mb, h, t, t))?)
    }

    /// The output projection `sum_h o[h] W_O[h] + b_O` of the mixed heads.
    ///
    /// # Shapes
    /// `x` the sub-layer's input `[B, T, D]` (`[M, B, T, D]`), `o [B, T, H, d]`
    /// (`[M * B, T, H, d]`) -> the shape of `x`.
    fn output(&self, ops: Ops, x: &Tensor, o: &Tensor) -> Result<Tensor> {
        if self.is_stacked() {
            let (m, bsz, t, _) = x.dims4()?;
            let (_, h, d, dm) = self.w_o.dims4()?;
            return ops.linear_stacked(
                &o.reshape((m, bsz, t, h * d))?,
                &self.w_o.reshape((m, h * d, dm))?,
                &self.b_o,
            );
        }
        let (bsz, t, _) = x.dims3()?;
        let (h, d, dm) = self.w_o.dims3()?;
        ops.linear(
            &o.reshape((bsz, t, h * d))?,
            &self.w_o.reshape((h * d, dm))?,
            &self.b_o,
        )
    }
}
