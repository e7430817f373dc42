//! The operations of the imported language models' blocks (GPT-2 and Llama), each with its hook
//! points ([`HookPoints`]): written once for the plain pass and the hooked pass of each model.
//!
//! GPT-2 and Llama keep their checkpoints' layouts (a fused `c_attn` projection, PyTorch
//! `[out, in]` matrices, grouped key/value heads) and candle-nn's fused LayerNorm, RMSNorm and
//! softmax, so they do not use `crate::nn` (the layers of hyperlens's own models). Without hooks an
//! operation runs in that fused form; with a hook attached, in the decomposed form whose
//! intermediate tensors TransformerLens names (`crate::hooks::norm_hooked`, [`masked_scores`]).

use candle_core::Tensor;

use super::masked_scores;
use crate::error::Result;
use crate::hooks::{at, norm_hooked};
use crate::mixer::Normalisation;
use crate::nn::HookPoints;
use crate::ops::reference::normalise;
use crate::ops::Ops;

/// A norm of a GPT-2 or Llama block.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Norm<'a> {
    /// LayerNorm with its gain and bias `[D]`.
    Layer(&'a Tensor, &'a Tensor),
    /// RMSNorm with its gain `[D]`.
    Rms(&'a Tensor),
}

/// `norm` of `x` with epsilon `eps`, with the hook points `{prefix}.hook_scale` and
/// `{prefix}.hook_normalized` (`prefix()` is called only with a hook attached): candle-nn's fused
/// norm without hooks, `crate::hooks::norm_hooked` with them.
///
/// # Shapes
/// `x [B, T, D]` -> `[B, T, D]`.
///
/// # Errors
/// Candle errors; a hook's error or a replacement of another shape.
pub(crate) fn norm<P: HookPoints + ?Sized>(
    x: &Tensor,
    norm: Norm<'_>,
    eps: f64,
    prefix: impl FnOnce() -> String,
    hooks: &mut P,
) -> Result<Tensor> {
    match (hooks.hooks(), norm) {
        (None, Norm::Layer(w, b)) => Ok(candle_nn::ops::layer_norm(x, w, b, eps as f32)?),
        (None, Norm::Rms(w)) => Ok(candle_nn::ops::rms_norm(x, w, eps as f32)?),
        (Some(h), Norm::Layer(w, b)) => norm_hooked(x, w, Some(b), eps, false, h, &prefix()),
        (Some(h), Norm::Rms(w)) => norm_hooked(x, w, None, eps, true, h, &prefix()),
    }
}

/// The causal softmax attention of block `l`, `softmax(q k^T * scale + mask)`, with the hook
/// points `blocks.{l}.attn.hook_attn_scores` (with a hook attached: the scores with `-inf` above
/// the diagonal, [`masked_scores`], then candle-nn's softmax) and `attn.hook_pattern`; without
/// hooks the masked softmax of `ops::reference::normalise`.
///
/// # Shapes
/// `q [B, H, Q, d]`, `k [B, H, K, d]`, `mask` `u8 [Q, K]` -> pattern `[B, H, Q, K]`.
///
/// # Errors
/// Candle errors; a hook's error or a replacement of another shape.
pub(crate) fn causal_softmax<P: HookPoints + ?Sized>(
    q: &Tensor,
    k: &Tensor,
    scale: f64,
    mask: &Tensor,
    l: usize,
    hooks: &mut P,
) -> Result<Tensor> {
    let pattern = match hooks.hooks() {
        None => {
            let scores = (q.matmul(&k.t()?)? * scale)?;
            normalise(Ops::Fused, &scores, Normalisation::Softmax, Some(mask))?
        }
        Some(h) => {
            let name = format!("blocks.{l}.attn.hook_attn_scores");
            let scores = at(h, &name, masked_scores(q, k, scale, mask)?)?;
            candle_nn::ops::softmax_last_dim(&scores)?
        }
    };
    hooks.at_block(l, "attn.hook_pattern", pattern)
}
