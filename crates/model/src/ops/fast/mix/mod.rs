//! A single-pass CPU kernel for the second half of a HYLA-style mix: the normalisation of the
//! scores (RMSHead, none or softmax), attention dropout and the `mlp_relu` / `mlp_linear` value
//! network, forward and backward.
//!
//! As candle operations ([`super::fused::mlp_value_mix`]) this half is some twenty passes over
//! `[B, H, Q, K]` tensors (transposes, broadcast products, batched matrix products of 36 x 16 by
//! 16 x 4 matrices, their gradients); on the base SRAVEN model each is 2.65 M floats, larger than
//! the caches, and together they took 44 % of a CPU training step (`perf`, base HYLA model, one
//! thread). Here one loop over the queries of each problem does all of it, with every inner loop
//! running over the keys of one row (contiguous, so that it vectorises); the backward pass
//! recomputes the codes and hidden units from the scores instead of reading stored intermediates.
//! With the kernel the mix takes a small share of the step, and a training run of the base HYLA
//! model uses less CPU time. The standard value network of softmax and linear attention is left to
//! candle: there the composed form is a fused softmax, a dropout product and batched 36 x 36 by
//! 36 x 4 matrix products that gemm does well, and the same loop written for it made a CPU step of
//! the base softmax and linear-attention models slower. With softmax normalisation
//! (`softmax-hypatt`) the kernel makes the step faster. `CHANGELOG.md` (2026-11-23) gives the
//! measurements behind these choices, and `docs/performance.md` the current figures.
//! Problems are independent and run in parallel (rayon, on the calling thread when it has one
//! thread: [`super::cpu::for_block_pairs`]); each problem's sums run in a fixed order,
//! so the result does not depend on the number of threads.
//!
//! For each problem `b` and pair `(i, j)` (query, key), with `m[h] = s[b,h,i,j]` where visible and
//! 0 where masked, the latent code `a[h]` is
//! - RMSHead: `a[h] = m[h] r` with `r = 1 / sqrt(mean_h m[h]^2 + eps)` (over the heads of a pair);
//! - none: `a[h] = m[h]`;
//! - softmax: `a[h] = exp(s[b,h,i,j] - max) / sum_j' exp(..)` over the visible keys of row
//!   `(h, i)`, 0 where masked (a row with no visible key is uniform, as the reference's fill with
//!   the lowest float gives);
//!
//! and `a'[h] = a[h] drop[i,j]`. Then
//! - forward: `pre[d] = sum_h a'[h] v[b,h,j,d]`, `hid = relu(pre)` (or `pre`),
//!   `o[b,i,h,d] = sum_j a'[h] hid[d]`;
//! - backward, from `go = dL/do`: `g_hid[d] = sum_h a'[h] go[b,i,h,d]`, `g_pre = g_hid [pre > 0]`,
//!   `g_a'[h] = sum_d go[b,i,h,d] hid[d] + sum_d g_pre[d] v[b,h,j,d]`,
//!   `g_v[b,h,j,d] = sum_i a'[h] g_pre[d]`,
//!
//! and `g_a = g_a' drop[i,j]`, then through the normalisation (0 where masked): RMSHead
//! `g_s[h] = g_a[h] r - m[h] r^3 mean_h(g_a m)`; none `g_s = g_a`; softmax
//! `g_s[j] = a[j] (g_a[j] - sum_j' a[j'] g_a[j'])` along the row.
//!
//! These are the formulas of [`super::fused::mlp_value_mix`] and [`super::fused::softmax_last_dim`]
//! (their tests check them against candle's autodiff), evaluated per pair; the tests (`tests.rs`)
//! check the kernel against candle's float64 autodiff of the composed operations for the five
//! mixers it serves.
//! Source: `docs/spec/models.md` ("Value networks"), the paper's `DotProductAttention` and
//! `linear_hypatt` (`hyla/models/attention.py`).
//!
//! The kernel runs on the CPU in float32 under [`crate::ops::Ops::Fast`], for
//! masks shared by the batch and the heads (`[Q, K]` up to leading axes of 1) and dropout
//! multipliers shared so or one per group of problems (`[G, 1, Q, K]`). On a CUDA device, in a build
//! with the feature `cuda`, the same passes run as CUDA kernels ([`crate::ops::cuda`]; [`mix`]
//! decides for both). The standard value network, other devices and dtypes, and other mask shapes
//! take the candle-operation forms.
//!
//! **This folder is the one home of the portable HYLA mix kernel, for training and for the
//! evaluation engine**: training's custom operation runs [`kernel`]'s forward and backward passes,
//! and [`crate::infer`] runs its value network from given codes ([`value_from_codes_isa`]: the AVX2
//! form, `hyperlens_kernels::avx2::hyla_value`, where the CPU has it, else the portable
//! `value_from_codes`), both on the same [`Plan`] and [`Rows`]. The portable passes stay in this
//! crate rather than in `hyperlens-kernels` because they are built on the model's types (the
//! mixer's normalisation and value network, the plan with its masks and dropout); the row
//! primitives they call (`dot`, `axpy`, RMSHead's scales, the masked softmax of a row) and the AVX2
//! value network are `hyperlens-kernels`'s, and this crate holds no intrinsics.
//!
//! Files: the custom operation (`mix` and its gradient node) and the engine's dispatch here; the
//! plan and the scratch rows of one problem in [`rows`]; the portable per-problem passes in
//! [`kernel`]. What [`crate::infer`] calls is re-exported here.

mod kernel;
mod rows;
#[cfg(test)]
mod tests;

use candle_core::{DType, Device, Tensor};

use super::cpu::{for_block_pairs, with_tensor};
use super::{attach, Gradient};
use crate::error::Result;
use crate::mixer::{Mixer, ValueNetwork};
use kernel::{backward_one, forward_one};

pub(crate) use kernel::value_from_codes;
pub(crate) use rows::{Plan, Rows};

/// The evaluation-mode value network of one problem ([`value_from_codes`]) with the instruction set
/// `isa`: `hyperlens_kernels`'s AVX2 form where `isa` has AVX2 and the head width is 1, 2, 4 or 8
/// ([`hyperlens_kernels::Isa::hyla_value`], the same bits), else the portable one.
///
/// # Shapes
/// As [`value_from_codes`]: `a [H, Q, K]`, `vt [H, d, Kp]` with `Kp` = `vs` (the keys padded to a
/// multiple of 8), `o [Q, H, d]`.
pub(crate) fn value_from_codes_isa(
    isa: hyperlens_kernels::Isa,
    p: &Plan,
    q0: usize,
    a: &[f32],
    (vt, vs): (&[f32], usize),
    o: &mut [f32],
    rows: &mut Rows,
) {
    let shape = hyperlens_kernels::HylaShape {
        h: p.h,
        q: p.q,
        k: p.k,
        d: p.d,
        relu: p.relu,
    };
    if !isa.hyla_value(&shape, q0, a, vt, o, &mut rows.hid_padded) {
        value_from_codes(p, q0, a, (vt, vs), o, rows);
    }
}

/// How a per-pair tensor (mask or dropout multipliers) covers the `B` problems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PairLayout {
    /// One `[Q, K]` for every problem and head (`[..., Q, K]` with leading axes of 1).
    Shared,
    /// `[G, 1, Q, K]`: one `[Q, K]` per group of this many consecutive problems (`B / G`; the
    /// per-model dropout masks of a stacked batch, model-major).
    Groups(usize),
}

impl PairLayout {
    /// The layout of `t` for `b` problems of `q` queries and `k` keys, or `None` for any other
    /// shape (the kernels then decline).
    fn of(t: &Tensor, b: usize, q: usize, k: usize) -> Option<PairLayout> {
        let dims = t.dims();
        if dims.len() >= 2
            && dims[dims.len() - 2..] == [q, k]
            && dims[..dims.len() - 2].iter().all(|&n| n == 1)
        {
            return Some(PairLayout::Shared);
        }
        match *dims {
            [g, 1, tq, tk] if g > 0 && b.is_multiple_of(g) && (tq, tk) == (q, k) => {
                Some(PairLayout::Groups(b / g))
            }
            _ => None,
        }
    }

    /// Problems per `[Q, K]` mask (all `b` of them when shared).
    fn per_mask(self, b: usize) -> usize {
        match self {
            PairLayout::Shared => b,
            PairLayout::Groups(n) => n,
        }
    }
}

/// The float32 values of a per-pair tensor, on the host.
fn host_values(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
}

/// The second half of [`crate::attention::mix`] by the kernel (module docs), or `None` where the
/// kernel does not apply (the standard value network, not float32 on the CPU or (with the fused
/// CUDA kernels, [`crate::ops::cuda`]) on a CUDA device, a mask that is not shared by batch and
/// heads, a dropout multiplier that is neither shared nor per group of problems; on CUDA also
/// sizes beyond the kernels' shared memory).
///
/// On the CPU the kernel's passes of [`kernel`] run; on CUDA the same passes as the CUDA kernels
/// of `crate::ops::cuda` (mask and dropout read on the device). Both take the same decisions
/// here, so the operation has one definition.
///
/// # Shapes
/// `scores [B, H, Q, K]` (scaled, with the bias), `v [B, H, K, d]`, `mask` `u8` and `dropout`
/// broadcastable to `[B, H, Q, K]`, or `dropout [G, 1, Q, K]` with one mask per `B / G`
/// consecutive problems ([`crate::ops::Ops::mix`]); returns `(o [B, Q, H, d], attention [B, H, Q, K])` as
/// [`crate::attention::mix`]. Differentiable in `scores` and `v` (the attention is not: it is the
/// latent code, an output).
///
/// # Errors
/// Candle errors on inconsistent shapes; on CUDA, a failed launch.
pub(crate) fn mix(
    scores: &Tensor,
    v: &Tensor,
    mixer: Mixer,
    mask: Option<&Tensor>,
    dropout: Option<&Tensor>,
) -> Result<Option<(Tensor, Tensor)>> {
    let normalisation = mixer.normalisation();
    let relu = match mixer.value_network() {
        ValueNetwork::MlpRelu => true,
        ValueNetwork::MlpLinear => false,
        ValueNetwork::Default => return Ok(None),
    };
    let on_cpu = super::cpu_f32(scores);
    if !on_cpu && !crate::ops::cuda::available(scores)? {
        return Ok(None);
    }
    let (b, h, q, k) = scores.dims4()?;
    let (vb, vh, vk, d) = v.dims4()?;
    let same_device = v.device().same_device(scores.device());
    if (vb, vh, vk) != (b, h, k) || v.dtype() != DType::F32 || !same_device {
        return Ok(None);
    }
    let mask = match mask {
        None => None,
        Some(m) => match PairLayout::of(m, b, q, k) {
            Some(PairLayout::Shared) => Some(m),
            _ => return Ok(None),
        },
    };
    let (dropout, per_mask) = match dropout {
        None => (None, b),
        Some(t) => match PairLayout::of(t, b, q, k) {
            Some(layout) => (Some(t), layout.per_mask(b)),
            None => return Ok(None),
        },
    };
    if !on_cpu {
        return cuda_mix(
            scores,
            v,
            (b, h, q, k, d),
            (normalisation, relu),
            mask,
            dropout,
            per_mask,
        );
    }
    let visible = match mask {
        Some(m) => Some(host_values(m)?.into_iter().map(|x| x != 0.0).collect()),
        None => None,
    };
    let dropout = dropout.map(host_values).transpose()?;
    let plan = Plan {
        h,
        q,
        k,
        d,
        norm: normalisation,
        relu,
        visible,
        dropout,
        per_mask,
    };
    let (s, v) = (scores.contiguous()?, v.contiguous()?);
    let (mut o, mut att) = (vec![0f32; b * q * h * d], vec![0f32; b * h * q * k]);
    with_tensor(&s, |sd| {
        with_tensor(&v, |vd| {
            for_block_pairs(&mut o, q * h * d, &mut att, h * q * k, |n, o, att| {
                let s = &sd[n * h * q * k..][..h * q * k];
                let v = &vd[n * h * k * d..][..h * k * d];
                forward_one(&plan, s, v, plan.dropout_of(n), o, att);
            })
        })
    })??;
    let o = Tensor::from_vec(o, (b, q, h, d), &Device::Cpu)?;
    let att = Tensor::from_vec(att, (b, h, q, k), &Device::Cpu)?;
    let node = MixKernel { plan, b };
    Ok(Some((attach(&[&s, &v], o, node)?, att)))
}

/// The CUDA branch of [`mix`]: the mask as `u8` and the dropout multipliers as float32, flat and
/// contiguous on the device, handed to the CUDA kernels (`crate::ops::cuda::mix`).
#[cfg(feature = "cuda")]
fn cuda_mix(
    scores: &Tensor,
    v: &Tensor,
    (b, h, q, k, d): (usize, usize, usize, usize, usize),
    (norm, relu): (crate::mixer::Normalisation, bool),
    mask: Option<&Tensor>,
    dropout: Option<&Tensor>,
    per_mask: usize,
) -> Result<Option<(Tensor, Tensor)>> {
    let flat = |t: &Tensor, dtype: DType| -> Result<Tensor> {
        Ok(t.to_dtype(dtype)?.flatten_all()?.contiguous()?)
    };
    let plan = crate::ops::cuda::mix::Plan {
        b,
        h,
        q,
        k,
        d,
        norm,
        relu,
        mask: mask.map(|m| flat(m, DType::U8)).transpose()?,
        dropout: dropout.map(|t| flat(t, DType::F32)).transpose()?,
        per_mask,
    };
    crate::ops::cuda::mix::mix(scores, v, plan)
}

/// Without the feature `cuda` there is no CUDA branch ([`crate::ops::cuda::available`] is false).
#[cfg(not(feature = "cuda"))]
fn cuda_mix(
    _: &Tensor,
    _: &Tensor,
    _: (usize, usize, usize, usize, usize),
    _: (crate::mixer::Normalisation, bool),
    _: Option<&Tensor>,
    _: Option<&Tensor>,
    _: usize,
) -> Result<Option<(Tensor, Tensor)>> {
    Ok(None)
}

/// The gradient of [`mix`]: the plan; the backward pass is the kernel's second pass.
struct MixKernel {
    /// Sizes, mask and dropout.
    plan: Plan,
    /// Problems.
    b: usize,
}

impl Gradient for MixKernel {
    const NAME: &'static str = "hyperlens-mix-kernel";

    fn gradients(&self, inputs: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (s, v) = (inputs[0], inputs[1]);
        let p = &self.plan;
        let (b, h, q, k, d) = (self.b, p.h, p.q, p.k, p.d);
        let (mut gs, mut gv) = (vec![0f32; b * h * q * k], vec![0f32; b * h * k * d]);
        with_tensor(s, |sd| {
            with_tensor(v, |vd| {
                with_tensor(g, |gd| {
                    for_block_pairs(&mut gs, h * q * k, &mut gv, h * k * d, |n, gs, gv| {
                        let s = &sd[n * h * q * k..][..h * q * k];
                        let v = &vd[n * h * k * d..][..h * k * d];
                        let go = &gd[n * q * h * d..][..q * h * d];
                        backward_one(p, s, v, p.dropout_of(n), go, gs, gv);
                    })
                })
            })
        })???;
        let gs = Tensor::from_vec(gs, (b, h, q, k), &Device::Cpu)?;
        let gv = Tensor::from_vec(gv, (b, h, k, d), &Device::Cpu)?;
        Ok(vec![Some(gs), Some(gv)])
    }
}
