//! The operations of the imported language models' blocks (GPT-2 and Llama), each with its hook
//! points ([`HookPoints`]): written once for the plain pass and the hooked pass of each model.
//!
//! GPT-2 and Llama keep their checkpoints' layouts (a fused `c_attn` projection, PyTorch
//! `[out, in]` matrices, grouped key/value heads) and candle-nn's fused LayerNorm, RMSNorm and
//! softmax, so they do not use `crate::nn` (the layers of hyperlens's own models). Without hooks an
//! operation runs in that fused form; with a hook attached, in the decomposed form whose
//! intermediate tensors TransformerLens names (`crate::hooks::norm_hooked`, [`masked_scores`]).

use candle_core::{DType, Tensor};

use super::masked_scores;
use crate::error::{ModelError, Result};
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
/// hooks the masked softmax of `ops::reference::normalise` (its scores, unmasked, still pass
/// through [`HookPoints::at_block`], which a reader without a hook function may override).
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
            // Unmasked here (the mask enters the fused softmax); a reader of the point sees the
            // same values as the hooked pass's at every allowed (query, key) pair.
            let scores = (q.matmul(&k.t()?)? * scale)?;
            let scores = hooks.at_block(l, "attn.hook_attn_scores", scores)?;
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

/// The input of the final norm and the unembedding: the residual stream `h` at every position, or
/// only at the rows [`HookPoints::logit_rows`] asks for; `None` when no row is wanted (the pass
/// then returns [`no_logits`]).
///
/// # Shapes
/// `h [B, T, D]` -> `[B, T, D]` (every position) or `[1, R, D]` (`R` chosen rows of `[B·T, D]`).
///
/// # Errors
/// [`ModelError::Input`] when logits are wanted from a pass that ran only `ran` of its `n_layers`
/// blocks ([`HookPoints::blocks_to_run`]); candle errors for a row out of range.
pub(crate) fn readout_input<P: HookPoints + ?Sized>(
    h: Tensor,
    ran: usize,
    n_layers: usize,
    hooks: &P,
) -> Result<Option<Tensor>> {
    let rows = hooks.logit_rows();
    if rows.is_some_and(|r| r.elem_count() == 0) {
        return Ok(None);
    }
    if ran < n_layers {
        return Err(ModelError::Input(format!(
            "logits need all {n_layers} blocks, but the pass ran only {ran}"
        )));
    }
    match rows {
        None => Ok(Some(h)),
        Some(rows) => {
            let (b, t, d) = h.dims3()?;
            Ok(Some(
                h.reshape((b * t, d))?.index_select(rows, 0)?.unsqueeze(0)?,
            ))
        }
    }
}

/// The logits of a pass that computes none ([`readout_input`] returned `None`).
///
/// # Shapes
/// `[1, 0, V]` float32.
///
/// # Errors
/// Candle errors.
pub(crate) fn no_logits(vocab: usize, device: &candle_core::Device) -> Result<Tensor> {
    Ok(Tensor::zeros((1, 0, vocab), DType::F32, device)?)
}
