//! The operations of the imported language models' blocks (GPT-2 and Llama), each with its hook
//! points ([`HookPoints`]): written once for the plain pass and the hooked pass of each model.
//!
//! GPT-2 and Llama keep their checkpoints' layouts (a fused `c_attn` projection, PyTorch
//! `[out, in]` matrices, grouped key/value heads) and candle-nn's fused LayerNorm, RMSNorm and
//! softmax, so they do not use `crate::nn` (the layers of hyperlens's own models). Without hooks an
//! operation runs in that fused form; with a hook attached, in the decomposed form whose
//! intermediate tensors TransformerLens names (`crate::hooks::norm_hooked`, [`masked_scores`]).

use candle_core::{DType, Tensor, TensorId};

use super::masked_scores;
use super::projection::Projection;
use crate::error::{ModelError, Result};
use crate::hooks::{at, norm_hooked};
use crate::mixer::Normalisation;
use crate::nn::HookPoints;
use crate::ops::reference::normalise;
use crate::ops::{fast, Ops};

/// A norm of a GPT-2 or Llama block.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Norm<'a> {
    /// LayerNorm with its gain and bias `[D]`.
    Layer(&'a Tensor, &'a Tensor),
    /// RMSNorm with its gain `[D]`.
    Rms(&'a Tensor),
}

/// `norm` of `x` with epsilon `eps`, with the hook points `{prefix}.hook_scale` and
/// `{prefix}.hook_normalized` (`prefix()` is called only with a hook attached): without hooks
/// candle-nn's fused LayerNorm, and the RMSNorm in one pass over the rows on the CPU in float32
/// (`crate::ops::fast::lm::rms_norm`, candle-nn's elsewhere); `crate::hooks::norm_hooked` with
/// them.
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
        (None, Norm::Rms(w)) => match fast::lm::rms_norm(x, None, w, eps as f32)? {
            Some((_, y)) => Ok(y),
            None => Ok(candle_nn::ops::rms_norm(x, w, eps as f32)?),
        },
        (Some(h), Norm::Layer(w, b)) => norm_hooked(x, w, Some(b), eps, false, h, &prefix()),
        (Some(h), Norm::Rms(w)) => norm_hooked(x, w, None, eps, true, h, &prefix()),
    }
}

/// An RMSNorm computed ahead, with the residual addition that made its input ([`residual`]): the
/// norm `x` of the tensor whose id is `of`.
#[derive(Debug)]
pub(crate) struct Normed {
    of: TensorId,
    x: Tensor,
}

/// The residual addition `h + y` of a pre-norm block, with `next` (an RMSNorm's gain) on the CPU in
/// float32 and without a hook function also the norm of the sum, in the same pass over the rows
/// (`crate::ops::fast::lm::rms_norm`): the input of the next sublayer, read by [`norm_ahead`] if
/// the sum reaches it unchanged by its hook points. With a hook function attached the sum's hooks
/// come before the norm's, so no norm is computed here.
///
/// # Shapes
/// `h`, `y` `[B, T, D]`, `next` `[D]` -> `[B, T, D]` (and the norm of the sum, `[B, T, D]`).
///
/// # Errors
/// Candle errors (mismatched shapes).
pub(crate) fn residual<P: HookPoints + ?Sized>(
    h: &Tensor,
    y: &Tensor,
    next: Option<&Tensor>,
    eps: f64,
    hooks: &mut P,
) -> Result<(Tensor, Option<Normed>)> {
    if let (Some(w), None) = (next, hooks.hooks()) {
        if let Some((sum, x)) = fast::lm::rms_norm(h, Some(y), w, eps as f32)? {
            let of = sum.id();
            return Ok((sum, Some(Normed { of, x })));
        }
    }
    Ok(((h + y)?, None))
}

/// The Q, K and V projections and, when computed with them, the rotated Q and K ([`qkv_rotary`]).
pub(crate) type QkvRotary = ([Tensor; 3], Option<(Tensor, Tensor)>);

/// The Q, K and V projections `[q, k, v]` of a Llama block (`proj`'s three matrices), and
/// without a hook function on the CPU in float32 also the rotary embeddings of Q and K (heads of
/// `d`) in the products' tasks (`crate::ops::fast::lm::packed_qkv_rope`), for [`rotary_after`].
///
/// # Shapes
/// `x [B, T, D]`, `cos`, `sin` `[T, d/2]` -> `[B, T, n_i]` each (and `[B, H, T, d]`,
/// `[B, H_kv, T, d]`).
///
/// # Errors
/// Candle errors; [`ModelError::Input`] for a projection of other than three matrices.
pub(crate) fn qkv_rotary<P: HookPoints + ?Sized>(
    proj: &Projection,
    x: &Tensor,
    (d, cos, sin): (usize, &Tensor, &Tensor),
    hooks: &mut P,
) -> Result<QkvRotary> {
    let (ys, rot) = match hooks.hooks() {
        None => match proj.forward_rotary(x, d, cos, sin)? {
            Some((ys, q, k)) => (ys, Some((q, k))),
            None => (proj.forward(x)?, None),
        },
        Some(_) => (proj.forward(x)?, None),
    };
    let qkv = ys.try_into().map_err(|_| {
        ModelError::Input("llama: the Q/K/V projection gave other than 3 outputs".into())
    })?;
    Ok((qkv, rot))
}

/// [`rotary`] of `x`, or `fused` when it was computed from the tensor whose id is `of` and `x`
/// is that very tensor ([`qkv_rotary`]: it passed its hook point unchanged) and no hook function
/// is attached.
///
/// # Shapes
/// As [`rotary`].
///
/// # Errors
/// As [`rotary`].
pub(crate) fn rotary_after<P: HookPoints + ?Sized>(
    x: &Tensor,
    (of, fused): (TensorId, Option<Tensor>),
    cos: &Tensor,
    sin: &Tensor,
    hooks: &mut P,
) -> Result<Tensor> {
    match fused {
        Some(y) if x.id() == of && hooks.hooks().is_none() => Ok(y),
        _ => rotary(x, cos, sin),
    }
}

/// A residual addition and the next RMSNorm computed with the product before them
/// ([`project_residual`]): used by [`residual_after`] only if the product reached the addition
/// unchanged by its hook point (the tensor whose id is `of`).
#[derive(Debug)]
pub(crate) struct FusedResidual {
    of: TensorId,
    sum: Tensor,
    normed: Normed,
}

/// The product of the one-matrix projection `proj` with `x`, and without a hook function and with
/// a next norm `next` on the CPU in float32 also the residual addition `h + y` and the norm of
/// the sum in the product's tasks (`crate::ops::fast::lm::packed_residual_norm`), for
/// [`residual_after`].
///
/// # Shapes
/// `x [B, T, in]`, `h [B, T, D]`, `next [D]` -> `y [B, T, D]` (and the sum and its norm).
///
/// # Errors
/// Candle errors (mismatched shapes).
pub(crate) fn project_residual<P: HookPoints + ?Sized>(
    proj: &Projection,
    x: &Tensor,
    h: &Tensor,
    next: Option<&Tensor>,
    eps: f64,
    hooks: &mut P,
) -> Result<(Tensor, Option<FusedResidual>)> {
    if let (Some(w), None) = (next, hooks.hooks()) {
        if let Some((y, sum, x)) = proj.forward_residual_norm(x, h, w, eps as f32)? {
            let normed = Normed { of: sum.id(), x };
            let of = y.id();
            return Ok((y, Some(FusedResidual { of, sum, normed })));
        }
    }
    Ok((proj.forward1(x)?, None))
}

/// [`residual`] of `h` and `y`, or `fused`'s sum and norm when it was computed from this very
/// `y` ([`project_residual`]: the product passed its hook point unchanged) and no hook function
/// is attached.
///
/// # Shapes
/// As [`residual`].
///
/// # Errors
/// As [`residual`].
pub(crate) fn residual_after<P: HookPoints + ?Sized>(
    h: &Tensor,
    y: &Tensor,
    fused: Option<FusedResidual>,
    next: Option<&Tensor>,
    eps: f64,
    hooks: &mut P,
) -> Result<(Tensor, Option<Normed>)> {
    match fused {
        Some(f) if f.of == y.id() && hooks.hooks().is_none() => Ok((f.sum, Some(f.normed))),
        _ => residual(h, y, next, eps, hooks),
    }
}

/// The SwiGLU computed with the gate and up projections ([`gate_up`]), with the ids of the
/// products it was computed from.
#[derive(Debug)]
pub(crate) struct FusedSwiglu {
    of: (TensorId, TensorId),
    post: Tensor,
}

/// The gate and up projections `(pre, lin)` of a Llama MLP (`proj`'s two matrices), and without
/// a hook function on the CPU in float32 also their SwiGLU in the products' tasks
/// (`crate::ops::fast::lm::packed_swiglu`), for [`swiglu_after`].
///
/// # Shapes
/// `x [B, T, D]` -> `pre`, `lin` `[B, T, n]`.
///
/// # Errors
/// Candle errors; [`ModelError::Input`] for a projection of other than two matrices.
pub(crate) fn gate_up<P: HookPoints + ?Sized>(
    proj: &Projection,
    x: &Tensor,
    hooks: &mut P,
) -> Result<(Tensor, Tensor, Option<FusedSwiglu>)> {
    if hooks.hooks().is_none() {
        if let Some((pre, lin, post)) = proj.forward_swiglu(x)? {
            let of = (pre.id(), lin.id());
            return Ok((pre, lin, Some(FusedSwiglu { of, post })));
        }
    }
    let [pre, lin]: [Tensor; 2] = proj.forward(x)?.try_into().map_err(|_| {
        ModelError::Input("llama: the gate/up projection gave other than 2 outputs".into())
    })?;
    Ok((pre, lin, None))
}

/// [`swiglu`] of `pre` and `lin`, or `fused`'s when it was computed from these very tensors
/// ([`gate_up`]: they passed their hook points unchanged) and no hook function is attached.
///
/// # Shapes
/// As [`swiglu`].
///
/// # Errors
/// As [`swiglu`].
pub(crate) fn swiglu_after<P: HookPoints + ?Sized>(
    pre: &Tensor,
    lin: &Tensor,
    fused: Option<FusedSwiglu>,
    hooks: &mut P,
) -> Result<Tensor> {
    match fused {
        Some(f) if f.of == (pre.id(), lin.id()) && hooks.hooks().is_none() => Ok(f.post),
        _ => swiglu(pre, lin),
    }
}

/// The RMSNorm `norm` of `h` ([`norm`]), or `ahead`'s when it was computed from this very tensor
/// ([`residual`]: the sum passed its hook points unchanged).
///
/// # Shapes
/// `h [B, T, D]` -> `[B, T, D]`.
///
/// # Errors
/// As [`norm`].
pub(crate) fn norm_ahead<P: HookPoints + ?Sized>(
    h: &Tensor,
    ahead: Option<Normed>,
    norm_: Norm<'_>,
    eps: f64,
    prefix: impl FnOnce() -> String,
    hooks: &mut P,
) -> Result<Tensor> {
    match ahead {
        Some(n) if n.of == h.id() && hooks.hooks().is_none() => Ok(n.x),
        _ => norm(h, norm_, eps, prefix, hooks),
    }
}

/// The causal softmax attention of block `l`, `softmax(q k^T * scale + mask)`, with the hook
/// points `blocks.{l}.attn.hook_attn_scores` (with a hook attached: the scores with `-inf` above
/// the diagonal, [`masked_scores`] on the key heads repeated for each query head
/// ([`repeat_kv`]), then candle-nn's softmax) and `attn.hook_pattern`; without hooks the products
/// of each key head with its group of query heads, scaled in the product ([`grouped_product`], no
/// copy of the keys, no pass for the scale), then
/// the masked softmax: one pass over the rows on the CPU in float32
/// (`crate::ops::fast::lm::causal_softmax`), `ops::reference::normalise` elsewhere (its scores,
/// unmasked, still pass through [`HookPoints::at_block`], which a reader without a hook function
/// may override).
///
/// # Shapes
/// `q [B, H, Q, d]`, `k [B, H_kv, K, d]` (`H_kv` divides `H`; query head `h` reads key head
/// `h / (H / H_kv)`), `mask` `u8 [Q, K]` -> pattern `[B, H, Q, K]`.
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
            let scores = grouped_product(q, &k.t()?, scale)?;
            let scores = hooks.at_block(l, "attn.hook_attn_scores", scores)?;
            // The kernel's mask is the causal one, which `mask` is (checked on its size only).
            let d = scores.dims();
            let causal = d.len() >= 2 && mask.dims() == &d[d.len() - 2..];
            let fast = if causal {
                fast::lm::causal_softmax(&scores)?
            } else {
                None
            };
            match fast {
                Some(p) => p,
                _ => normalise(Ops::Fused, &scores, Normalisation::Softmax, Some(mask))?,
            }
        }
        Some(h) => {
            let (hq, hk) = (q.dim(1)?, k.dim(1)?);
            let k = repeat_kv(k, hq / hk.max(1))?;
            let name = format!("blocks.{l}.attn.hook_attn_scores");
            let scores = at(h, &name, masked_scores(q, &k, scale, mask)?)?;
            candle_nn::ops::softmax_last_dim(&scores)?
        }
    };
    hooks.at_block(l, "attn.hook_pattern", pattern)
}

/// Per key/value head, the product of its group of query heads' rows with it, times `scale`:
/// `out[b, h] = (a[b, h] x[b, h / (H / H_kv)]) * scale`, computed as one product per key head on the query heads' rows
/// stacked (`a` reshaped to `[B, H_kv, (H / H_kv) Q, K]`), so the key or value heads are never
/// repeated; on the CPU in float32 the batch of products split over the threads
/// (`crate::ops::fast::gemm::batched_matmul`).
///
/// # Shapes
/// `a [B, H, Q, K]`, `x [B, H_kv, K, N]` (any strides) -> `[B, H, Q, N]`.
///
/// # Errors
/// Candle errors (`H_kv` not dividing `H`, mismatched sizes).
pub(crate) fn grouped_product(a: &Tensor, x: &Tensor, scale: f64) -> Result<Tensor> {
    let (b, h, q, k) = a.dims4()?;
    let (_, hkv, _, n) = x.dims4()?;
    if hkv == 0 || h % hkv != 0 {
        return Err(ModelError::Input(format!(
            "attention: {hkv} key/value heads do not divide {h} query heads"
        )));
    }
    let a = a.contiguous()?.reshape((b, hkv, (h / hkv) * q, k))?;
    let y = match fast::gemm::batched_matmul(&a, x, scale)? {
        Some(y) => y,
        None if scale == 1.0 => a.matmul(x)?,
        None => (a.matmul(x)? * scale)?,
    };
    Ok(y.reshape((b, h, q, n))?)
}

/// The value mixing of an attention, `z[b, h] = a[b, h] v[b, h / (H / H_kv)]`, as the view of
/// a token-major tensor: on the CPU in float32 written as `[B, Q, H, N]` and read `v` through its
/// strides (`crate::ops::fast::gemm::head_values`), so that neither `v` nor `z` is copied to
/// another layout (`z.transpose(1, 2)` is the output projection's contiguous input); elsewhere
/// [`grouped_product`] of a contiguous `v`.
///
/// # Shapes
/// `a [B, H, Q, K]`, `v [B, H_kv, K, N]` (any strides) -> `[B, H, Q, N]`.
///
/// # Errors
/// Candle errors (`H_kv` not dividing `H`, mismatched sizes).
pub(crate) fn mix_values(a: &Tensor, v: &Tensor) -> Result<Tensor> {
    match fast::gemm::head_values(a, v)? {
        Some(y) => Ok(y.transpose(1, 2)?),
        None => grouped_product(a, &v.contiguous()?, 1.0),
    }
}

/// Expands key/value heads for grouped-query attention: head `h` of the result is head
/// `h / n_rep` of the input (Hugging Face `repeat_kv`).
///
/// # Shapes
/// `x` [B, H_kv, T, d] -> [B, H_kv * n_rep, T, d].
///
/// # Errors
/// Candle errors.
pub(crate) fn repeat_kv(x: &Tensor, n_rep: usize) -> Result<Tensor> {
    if n_rep <= 1 {
        return Ok(x.clone());
    }
    let (b, hkv, t, d) = x.dims4()?;
    Ok(x.unsqueeze(2)?
        .expand((b, hkv, n_rep, t, d))?
        .reshape((b, hkv * n_rep, t, d))?)
}

/// The rotary embedding in the half-split convention (candle-nn's `rope`): on the CPU in float32
/// one pass reading `x` through its strides (`crate::ops::fast::lm::rope`), else candle-nn's on a
/// contiguous copy.
///
/// # Shapes
/// `x [B, H, T, d]`, `cos`, `sin` `[T, d/2]` -> `[B, H, T, d]` (contiguous).
///
/// # Errors
/// Candle errors (mismatched shapes).
pub(crate) fn rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    match fast::lm::rope(x, cos, sin)? {
        Some(y) => Ok(y),
        None => Ok(candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin)?),
    }
}

/// `x W^T` for a PyTorch-layout matrix `W [out, in]`: on the CPU in float32 with its rows split
/// over the threads (`crate::ops::fast::gemm::matmul_t`, for 64 rows a thread or more), else
/// `super::matmul_t`.
///
/// # Shapes
/// `x [..., in]`, `w [out, in]` -> `[..., out]`.
///
/// # Errors
/// Candle errors (mismatched shapes).
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    match fast::gemm::matmul_t(x, w)? {
        Some(y) => Ok(y),
        None => super::matmul_t(x, w),
    }
}

/// The SwiGLU of a Llama MLP, `silu(pre) * lin`: one pass on the CPU in float32
/// (`crate::ops::fast::lm::swiglu`), candle-nn's SiLU and a product elsewhere.
///
/// # Shapes
/// `pre`, `lin` of one shape -> that shape.
///
/// # Errors
/// Candle errors (mismatched shapes).
pub(crate) fn swiglu(pre: &Tensor, lin: &Tensor) -> Result<Tensor> {
    match fast::lm::swiglu(pre, lin)? {
        Some(y) => Ok(y),
        None => Ok((candle_nn::ops::silu(pre)? * lin)?),
    }
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
