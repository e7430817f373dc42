//! hyperlens's fused CUDA kernels: one AdamW update of every parameter in place
//! ([`FusedAdamW`]), and the HYLA value network with its normalisation and dropout (the second half
//! of a mix), forward and backward, as one kernel each.
//!
//! On CUDA every candle operation is a kernel launch, and a training step of the small SRAVEN
//! models is bound by launches (`bench/gpu/README.md`): the composed AdamW update makes about 324
//! tensors per step (two concatenations, the moments' arithmetic, a copy back into each of the 74
//! parameters), the composed HYLA mix about twenty per layer forward and as many backward
//! (`ops::fast::fused::mlp_value_mix`). Here:
//!
//! - **AdamW** ([`FusedAdamW`], used by `hyperlens_train::AdamW` on CUDA devices): the gradients
//!   are concatenated as before (one tensor), then one kernel updates both moments (one `[2, M,
//!   P]` tensor, written in place through candle's `InplaceOp2`) and writes every parameter in
//!   place through a table of their device addresses, made once. The learning rates and the bias
//!   corrections are **device scalars**: a small buffer of the optimiser ([`adamw_scalars`] packs
//!   it), rewritten in place by one copy before each update, so the kernel's arguments are the
//!   same at every update (what a captured CUDA graph needs) and nothing is recompiled or
//!   allocated per step. Its arithmetic is the composed update's, operation for operation in
//!   float32, so the two agree bit for bit.
//! - **The HYLA mix** (the CUDA branch of `ops::fast::mix`, behind [`crate::Ops::mix`] with
//!   [`crate::Ops::Fast`]): the forward kernel computes the latent codes and the output, one block
//!   per (problem, query); the backward kernel recomputes the codes and hidden units, one block
//!   per problem (its values' gradient is a sum over the queries, kept in shared memory, so no
//!   atomics and a fixed order). It is the CPU kernel of `ops/fast/mix/` ported: the same plan
//!   (normalisation, value network, mask and dropout shared by the batch or per group of
//!   problems) and the same formulas (that module's docs); where that module declines (the
//!   standard value network, other masks) or the sizes need more than 48 KiB of shared memory,
//!   the composed operations run as before.
//!
//! The kernels are `kernels.cu` in this folder, compiled to PTX at build time by the crate's
//! `build.rs` (with `cudaforge`, as candle-kernels builds candle's own) when the feature `cuda` is
//! on, and loaded by candle's `CudaDevice::get_or_load_custom_func` at first use. Without the
//! feature this module keeps only the host-side pieces (the scalars' packing, the launch sizes and
//! the switch), and [`FusedAdamW::new`] answers `None`.
//!
//! **Opt-in.** The kernels have been compiled (`--features cuda`) but never run on a GPU, so they
//! are off unless [`FUSED_CUDA_ENV`] is `1` (read once per process): by default a CUDA device runs
//! the composed candle operations, which have run on H100s (`docs/gpu.md`, `bench/gpu/README.md`).
//! `tests/model.rs` (`cuda_fused_kernels_match_the_cpu`, compiled with the feature, run on a GPU
//! with `HYPERLENS_FUSED_CUDA=1`) checks them against the CPU; once a GPU run has passed it, the
//! default can change. One binary can time both (`bench/gpu/window.sh`).

#[cfg(feature = "cuda")]
mod adamw;
#[cfg(feature = "cuda")]
pub(crate) mod mix;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use candle_core::Tensor;

use crate::error::{ModelError, Result};

#[cfg(feature = "cuda")]
mod ptx {
    #![allow(missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

/// The name under which candle caches the module of [`ptx::KERNELS`].
#[cfg(feature = "cuda")]
const MODULE: &str = "hyperlens-fused";

/// Environment variable that turns the fused CUDA kernels on when set to `1` (default `0`: off,
/// since they have not yet run on a GPU; module docs): off, the AdamW update and the HYLA mix run
/// as composed candle operations.
pub const FUSED_CUDA_ENV: &str = "HYPERLENS_FUSED_CUDA";

/// A `0` / `1` switch from the value of [`FUSED_CUDA_ENV`] (unset or empty: off).
///
/// # Errors
/// [`ModelError::DeviceUnavailable`] for any other value.
fn parse_switch(value: Option<&str>) -> Result<bool> {
    match value.map(str::trim) {
        Some("1") => Ok(true),
        None | Some("") | Some("0") => Ok(false),
        Some(other) => Err(ModelError::DeviceUnavailable {
            device: "cuda".into(),
            reason: format!("{FUSED_CUDA_ENV} must be 0 or 1, got `{other}`"),
        }),
    }
}

/// Whether the fused CUDA kernels were asked for (read from [`FUSED_CUDA_ENV`] once per process;
/// off unless it is `1`).
///
/// # Errors
/// [`ModelError::DeviceUnavailable`] for a value other than unset, `0` or `1`.
pub fn fused_cuda_requested() -> Result<bool> {
    static ON: OnceLock<std::result::Result<bool, String>> = OnceLock::new();
    ON.get_or_init(|| {
        parse_switch(std::env::var(FUSED_CUDA_ENV).ok().as_deref()).map_err(|e| e.to_string())
    })
    .clone()
    .map_err(|reason| ModelError::DeviceUnavailable {
        device: "cuda".into(),
        reason,
    })
}

/// Whether the fused CUDA kernels run on `x`: a float32 tensor on a CUDA device, in a build with
/// the feature `cuda`, and asked for ([`fused_cuda_requested`]).
///
/// # Errors
/// As [`fused_cuda_requested`].
pub(crate) fn available(x: &Tensor) -> Result<bool> {
    Ok(cfg!(feature = "cuda")
        && x.device().is_cuda()
        && x.dtype() == candle_core::DType::F32
        && fused_cuda_requested()?)
}

/// The device scalars of one AdamW update, as the kernel reads them: `[1 / (1 - beta1^t),
/// 1 / (1 - beta2^t), lr_0, ..., lr_{M-1}]` in float32, for update `t` (1-based) with learning
/// rate `lrs[m]` for model `m`. Each is computed in float64 and rounded once, as the composed
/// update's scalar arguments are (candle's affine operations round them to the tensor's dtype).
///
/// # Shapes
/// `lrs [M]` -> `[2 + M]`.
pub fn adamw_scalars(beta1: f64, beta2: f64, t: u64, lrs: &[f64]) -> Vec<f32> {
    let t = t as f64;
    let mut s = Vec::with_capacity(2 + lrs.len());
    s.push((1.0 / (1.0 - beta1.powf(t))) as f32);
    s.push((1.0 / (1.0 - beta2.powf(t))) as f32);
    s.extend(lrs.iter().map(|&lr| lr as f32));
    s
}

/// The first element of each parameter slot in a model's row of the flat AdamW state, then the row
/// length `P`: the prefix sums of `lens`, as `u32` for the kernel; `None` if `P` does not fit.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn slot_offsets(lens: &[usize]) -> Option<Vec<u32>> {
    let mut offsets = Vec::with_capacity(lens.len() + 1);
    let mut at = 0usize;
    offsets.push(0);
    for &len in lens {
        at = at.checked_add(len)?;
        offsets.push(u32::try_from(at).ok()?);
    }
    Some(offsets)
}

/// Threads per block of the AdamW kernel.
const ADAMW_THREADS: u32 = 256;

/// The most blocks of the AdamW kernel: each thread loops over the elements, so a bound keeps a
/// launch cheap for any size.
const ADAMW_MAX_BLOCKS: usize = 4096;

/// The grid of an AdamW update of `total` elements: `(blocks, threads per block)`, at least one
/// block.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn adamw_grid(total: usize) -> (u32, u32) {
    let blocks = total
        .div_ceil(ADAMW_THREADS as usize)
        .clamp(1, ADAMW_MAX_BLOCKS);
    (blocks as u32, ADAMW_THREADS)
}

/// The shared memory a block may use without asking the driver for more (48 KiB on every GPU
/// since Kepler).
const MAX_SHARED_BYTES: usize = 48 * 1024;

/// How the mix kernels are launched for `h` heads, `q` queries, `k` keys and head width `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct MixLaunch {
    /// Threads per block (a multiple of 32: the softmax reduces over one warp per head).
    pub(crate) threads: u32,
    /// Dynamic shared memory of a forward block, bytes: codes and codes after dropout `[H, K]`,
    /// hidden units `[d, K]`.
    pub(crate) forward_shared: u32,
    /// Dynamic shared memory of a backward block, bytes: four `[H, K]` rows, two `[K]`, three
    /// `[d, K]`, the output gradient `[H, d]`, `[H]`, and the values' gradient `[H, K, d]`.
    pub(crate) backward_shared: u32,
}

/// The launch of the mix kernels ([`MixLaunch`]), or `None` where a block would need more than
/// 48 KiB of shared memory (large heads or many keys: the composed operations run instead) or a
/// size does not fit the kernels' `int` indices.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn mix_launch(h: usize, q: usize, k: usize, d: usize) -> Option<MixLaunch> {
    if [h, q, k, d].contains(&0) {
        return None;
    }
    let f = std::mem::size_of::<f32>();
    let forward = (2 * h * k + d * k).checked_mul(f)?;
    let backward = (4 * h * k + 2 * k + 3 * d * k + h * d + h + h * k * d).checked_mul(f)?;
    let biggest = h.checked_mul(q)?.checked_mul(k)?.max(h * k * d);
    if forward.max(backward) > MAX_SHARED_BYTES || biggest > i32::MAX as usize {
        return None;
    }
    let work = (h * k).max(d * k).max(h * d);
    let threads = work.div_ceil(32).clamp(1, 8) * 32;
    Some(MixLaunch {
        threads: threads as u32,
        forward_shared: forward as u32,
        backward_shared: backward as u32,
    })
}

/// AdamW's update of every parameter in one kernel, in place (module docs): the CUDA form of
/// the composed update of `hyperlens_train::AdamW`, which builds one per optimiser on a CUDA
/// device and keeps the composed update elsewhere.
///
/// It holds the parameters (so that the device addresses in its table stay valid: candle writes a
/// variable in place, `Var::set`, and never moves its storage), the table, the slots' offsets,
/// the weight-decay coefficients and its scalars' buffer.
pub struct FusedAdamW {
    #[cfg(feature = "cuda")]
    inner: adamw::Kernel,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

impl FusedAdamW {
    /// The fused update of `params` (one tensor per slot, `models * lens[s]` elements each: model
    /// `m`'s elements of slot `s` are `m * lens[s]..`), with each element's weight-decay
    /// coefficient `decay` and the constants `beta1`, `beta2`, `eps`; `None` where it does not
    /// run: not a CUDA device, a build without the feature `cuda`, [`FUSED_CUDA_ENV`] not `1`, no
    /// parameters, a parameter that is not a whole contiguous float32 tensor, or more elements
    /// than 32-bit offsets hold.
    ///
    /// # Shapes
    /// `params[s]` any shape of `models * lens[s]` elements; `decay [M, P]` or `[P]` (`P` the sum
    /// of `lens`), float32.
    ///
    /// # Errors
    /// [`ModelError::Input`] for parameters on different devices or a `decay` of the wrong size;
    /// [`FUSED_CUDA_ENV`] set to something other than `0` / `1`; a failed device allocation or
    /// copy.
    pub fn new(
        params: &[Tensor],
        lens: &[usize],
        models: usize,
        decay: Option<&Tensor>,
        (beta1, beta2, eps): (f64, f64, f64),
    ) -> Result<Option<FusedAdamW>> {
        let Some(first) = params.first() else {
            return Ok(None);
        };
        if !available(first)? {
            return Ok(None);
        }
        if params.len() != lens.len() || models == 0 {
            return Err(ModelError::Input(format!(
                "fused AdamW: {} parameters, {} lengths, {models} models",
                params.len(),
                lens.len()
            )));
        }
        #[cfg(feature = "cuda")]
        {
            let Some(offsets) = slot_offsets(lens) else {
                return Ok(None);
            };
            Ok(
                adamw::Kernel::new(params, offsets, models, decay, (beta1, beta2, eps))?
                    .map(|inner| FusedAdamW { inner }),
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (decay, beta1, beta2, eps);
            Ok(None)
        }
    }

    /// Applies one update: the moments `[2, M, P]` (first, then second) in place, and every
    /// parameter, from the gradients `g` and the scalars of [`adamw_scalars`] (copied into the
    /// kernel's device buffer first).
    ///
    /// # Shapes
    /// `moments` `2 M P` contiguous float32 elements, `g` `M P` (in the slots' order, model-major),
    /// `scalars [2 + M]`.
    ///
    /// # Errors
    /// [`ModelError::Input`] for tensors of the wrong size, dtype or device; a failed copy or
    /// launch.
    pub fn step(&mut self, moments: &Tensor, g: &Tensor, scalars: &[f32]) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            self.inner.step(moments, g, scalars)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (moments, g, scalars);
            match self.never {}
        }
    }
}
