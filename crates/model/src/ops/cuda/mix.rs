//! The CUDA branch of the HYLA mix kernel ([`crate::ops::fast::mix`]): `hl_mix_forward_f32` and
//! `hl_mix_backward_f32` (`kernels.cu`) as one candle custom operation, whose forward pass
//! computes the output and the latent codes and whose gradient is the backward kernel.

// The workspace denies `unsafe`; cudarc's launches and uninitialised allocations are `unsafe` (it
// cannot check a kernel's arguments), so this module, like `crate::device`, allows it for them.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, CudaStorage, Layout, Shape, Storage, Tensor};

use super::{mix_launch, ptx, MixLaunch, MODULE};
use crate::error::Result;
use crate::mixer::Normalisation;

/// One mix on CUDA: the sizes, the normalisation and value network, and the mask and dropout
/// multipliers as device tensors (the plan of the CPU kernel, `fast::mix::Plan`, without copying
/// them to the host).
pub(crate) struct Plan {
    /// Problems.
    pub(crate) b: usize,
    /// Heads.
    pub(crate) h: usize,
    /// Queries.
    pub(crate) q: usize,
    /// Keys.
    pub(crate) k: usize,
    /// Head width.
    pub(crate) d: usize,
    /// The normalisation of the scores.
    pub(crate) norm: Normalisation,
    /// ReLU value network (else linear).
    pub(crate) relu: bool,
    /// Visibility per pair, `u8 [Q * K]` contiguous (none: all visible).
    pub(crate) mask: Option<Tensor>,
    /// Dropout multipliers, `f32 [G * Q * K]` contiguous, one `[Q, K]` mask per `per_mask`
    /// consecutive problems (none: 1).
    pub(crate) dropout: Option<Tensor>,
    /// Problems per dropout mask.
    pub(crate) per_mask: usize,
}

/// The kernels' code of a normalisation (`HL_NORM_*` in `kernels.cu`).
fn norm_code(n: Normalisation) -> i32 {
    match n {
        Normalisation::RmsHead => 0,
        Normalisation::None => 1,
        Normalisation::Softmax => 2,
    }
}

/// The mix of `plan` by the kernels, or `None` where a block would need too much shared memory
/// ([`mix_launch`]).
///
/// # Shapes
/// `s [B, H, Q, K]`, `v [B, H, K, d]` float32 on one CUDA device -> `(o [B, Q, H, d], attention
/// [B, H, Q, K])`, differentiable in `s` and `v` (the attention is not).
///
/// # Errors
/// Candle errors: a failed allocation or launch.
pub(crate) fn mix(s: &Tensor, v: &Tensor, plan: Plan) -> Result<Option<(Tensor, Tensor)>> {
    let Some(launch) = mix_launch(plan.h, plan.q, plan.k, plan.d) else {
        return Ok(None);
    };
    if plan.b == 0 || plan.per_mask == 0 || plan.b > i32::MAX as usize / plan.q {
        return Ok(None);
    }
    let (s, v) = (s.contiguous()?, v.contiguous()?);
    let att = Arc::new(Mutex::new(None));
    let op = MixOp {
        plan: Arc::new(plan),
        launch,
        att: att.clone(),
    };
    let (b, h, q, k) = (op.plan.b, op.plan.h, op.plan.q, op.plan.k);
    let o = s.apply_op2(&v, op)?;
    let att = att
        .lock()
        .expect("the forward pass does not panic holding the lock")
        .take()
        .ok_or_else(|| candle_core::Error::Msg("the mix kernel gave no codes".into()))?;
    let att = Tensor::from_storage(Storage::Cuda(att), (b, h, q, k), BackpropOp::none(), false);
    Ok(Some((o, att)))
}

/// The custom operation: forward kernel in `cuda_fwd` (the codes left in `att`), backward kernel
/// in `bwd`.
struct MixOp {
    plan: Arc<Plan>,
    launch: MixLaunch,
    /// The codes of the last forward pass, taken by [`mix`].
    att: Arc<Mutex<Option<CudaStorage>>>,
}

/// A contiguous float32 CUDA storage's elements from its layout's offset, `len` of them.
fn view<'a>(s: &'a CudaStorage, l: &Layout, len: usize) -> candle_core::Result<CudaView<'a, f32>> {
    if !l.is_contiguous() {
        candle_core::bail!("hyperlens mix kernel: a non-contiguous input");
    }
    Ok(s.as_cuda_slice::<f32>()?
        .slice(l.start_offset()..l.start_offset() + len))
}

impl candle_core::CustomOp2 for MixOp {
    fn name(&self) -> &'static str {
        "hyperlens-mix-kernel-cuda"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("the CUDA mix kernel runs on CUDA devices only")
    }

    fn cuda_fwd(
        &self,
        s: &CudaStorage,
        sl: &Layout,
        v: &CudaStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let p = &*self.plan;
        let (b, h, q, k, d) = (p.b, p.h, p.q, p.k, p.d);
        let dev = s.device().clone();
        let s = view(s, sl, b * h * q * k)?;
        let v = view(v, vl, b * h * k * d)?;
        // SAFETY: the kernel writes every element of both (one per (problem, query, head, unit)
        // of `o`, one per (problem, head, query, key) of the codes).
        let mut o = unsafe { dev.alloc::<f32>(b * q * h * d)? };
        let mut att = unsafe { dev.alloc::<f32>(b * h * q * k)? };
        let func = dev.get_or_load_custom_func("hl_mix_forward_f32", MODULE, ptx::KERNELS)?;
        let mask_storage = p.mask.as_ref().map(|t| t.storage_and_layout());
        let drop_storage = p.dropout.as_ref().map(|t| t.storage_and_layout());
        let mask = optional::<u8>(mask_storage.as_ref().map(|(s, l)| (&**s, *l)), q * k)?;
        let drop = optional::<f32>(
            drop_storage.as_ref().map(|(s, l)| (&**s, *l)),
            (b / p.per_mask).max(1) * q * k,
        )?;
        let null = 0u64;
        let ints = self.ints();
        let mut args = func.builder();
        args.arg(&s);
        args.arg(&v);
        match &mask {
            Some(m) => args.arg(m),
            None => args.arg(&null),
        };
        match &drop {
            Some(dr) => args.arg(dr),
            None => args.arg(&null),
        };
        args.arg(&mut o);
        args.arg(&mut att);
        for x in &ints {
            args.arg(x);
        }
        let eps = crate::ops::reference::RMS_HEAD_EPS as f32;
        args.arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: ((b * q) as u32, 1, 1),
            block_dim: (self.launch.threads, 1, 1),
            shared_mem_bytes: self.launch.forward_shared,
        };
        // SAFETY: the arguments are those of `hl_mix_forward_f32` in order and type (five
        // device buffers or null addresses, two outputs, seven ints, one float); the buffers hold
        // the plan's sizes (checked by `view` and `optional`), the mask and dropout are
        // contiguous (`fast::mix` made them so), the shared memory is what `mix_launch` sized
        // for these dimensions, and every launch is on this device's one stream.
        unsafe { args.launch(cfg) }.w()?;
        *self.att.lock().expect("not poisoned") =
            Some(CudaStorage::wrap_cuda_slice(att, dev.clone()));
        Ok((
            CudaStorage::wrap_cuda_slice(o, dev),
            Shape::from((b, q, h, d)),
        ))
    }

    fn bwd(
        &self,
        s: &Tensor,
        v: &Tensor,
        _: &Tensor,
        go: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let p = &*self.plan;
        let (b, h, q, k, d) = (p.b, p.h, p.q, p.k, p.d);
        let go = go.contiguous()?;
        let (ss, sl) = s.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (gs_, gl) = go.storage_and_layout();
        let (Storage::Cuda(ss), Storage::Cuda(vs), Storage::Cuda(gos)) = (&*ss, &*vs, &*gs_) else {
            candle_core::bail!("the CUDA mix kernel's gradient: inputs not on a CUDA device")
        };
        let dev = ss.device().clone();
        let sv = view(ss, sl, b * h * q * k)?;
        let vv = view(vs, vl, b * h * k * d)?;
        let gov = view(gos, gl, b * q * h * d)?;
        // SAFETY: the kernel writes every element of both (every (problem, head, query, key) of
        // the scores' gradient, every (problem, head, key, unit) of the values').
        let mut gs = unsafe { dev.alloc::<f32>(b * h * q * k)? };
        let mut gv = unsafe { dev.alloc::<f32>(b * h * k * d)? };
        let func = dev.get_or_load_custom_func("hl_mix_backward_f32", MODULE, ptx::KERNELS)?;
        let mask_storage = p.mask.as_ref().map(|t| t.storage_and_layout());
        let drop_storage = p.dropout.as_ref().map(|t| t.storage_and_layout());
        let mask = optional::<u8>(mask_storage.as_ref().map(|(s, l)| (&**s, *l)), q * k)?;
        let drop = optional::<f32>(
            drop_storage.as_ref().map(|(s, l)| (&**s, *l)),
            (b / p.per_mask).max(1) * q * k,
        )?;
        let null = 0u64;
        let ints = self.ints();
        let mut args = func.builder();
        args.arg(&sv);
        args.arg(&vv);
        match &mask {
            Some(m) => args.arg(m),
            None => args.arg(&null),
        };
        match &drop {
            Some(dr) => args.arg(dr),
            None => args.arg(&null),
        };
        args.arg(&gov);
        args.arg(&mut gs);
        args.arg(&mut gv);
        for x in &ints {
            args.arg(x);
        }
        let eps = crate::ops::reference::RMS_HEAD_EPS as f32;
        args.arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (b as u32, 1, 1),
            block_dim: (self.launch.threads, 1, 1),
            shared_mem_bytes: self.launch.backward_shared,
        };
        // SAFETY: as in `cuda_fwd`, for `hl_mix_backward_f32` (six device buffers or null
        // addresses, two outputs, seven ints, one float).
        unsafe { args.launch(cfg) }.w()?;
        let gs = Storage::Cuda(CudaStorage::wrap_cuda_slice(gs, dev.clone()));
        let gv = Storage::Cuda(CudaStorage::wrap_cuda_slice(gv, dev));
        Ok((
            Some(Tensor::from_storage(
                gs,
                (b, h, q, k),
                BackpropOp::none(),
                false,
            )),
            Some(Tensor::from_storage(
                gv,
                (b, h, k, d),
                BackpropOp::none(),
                false,
            )),
        ))
    }
}

impl MixOp {
    /// The kernels' integer arguments after the buffers: `h, q, k, d, norm, relu, per_mask`.
    fn ints(&self) -> [i32; 7] {
        let p = &*self.plan;
        [
            p.h as i32,
            p.q as i32,
            p.k as i32,
            p.d as i32,
            norm_code(p.norm),
            i32::from(p.relu),
            p.per_mask.min(i32::MAX as usize) as i32,
        ]
    }
}

/// The first `len` elements of an optional contiguous tensor's CUDA storage (locked by the
/// caller).
fn optional<'a, T: candle_core::cuda_backend::CudaDType>(
    t: Option<(&'a Storage, &Layout)>,
    len: usize,
) -> candle_core::Result<Option<CudaView<'a, T>>> {
    let Some((s, l)) = t else { return Ok(None) };
    let Storage::Cuda(c) = s else {
        candle_core::bail!("hyperlens mix kernel: the mask or dropout is not on the device")
    };
    if !l.is_contiguous() {
        candle_core::bail!("hyperlens mix kernel: a non-contiguous mask or dropout");
    }
    Ok(Some(
        c.as_cuda_slice::<T>()?
            .slice(l.start_offset()..l.start_offset() + len),
    ))
}
