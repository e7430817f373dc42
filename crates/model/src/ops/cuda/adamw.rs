//! The CUDA side of [`super::FusedAdamW`]: the parameters' address table, the scalars' buffer and
//! the launch of `hl_adamw_f32` (`kernels.cu`) as an in-place candle operation on the moments.

// The workspace denies `unsafe`; cudarc's launches and uninitialised allocations are `unsafe` (it
// cannot check a kernel's arguments), so this module, like `crate::device`, allows it for them.
#![allow(unsafe_code)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, DevicePtr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{CpuStorage, CudaStorage, DType, Layout, Storage, Tensor};

use super::{adamw_grid, ptx, MODULE};
use crate::error::{ModelError, Result};

/// The fused update's device state (docs of [`super::FusedAdamW`]).
pub(super) struct Kernel {
    device: CudaDevice,
    /// The parameters, held so that the addresses in `table` stay theirs.
    _params: Vec<Tensor>,
    /// The device address of each parameter's first element, `[n_slots]`.
    table: CudaSlice<u64>,
    /// The slots' offsets in a model's row, then `P`, `[n_slots + 1]`.
    offsets: CudaSlice<u32>,
    /// The weight-decay coefficient of each element, `[M * P]` contiguous float32.
    decay: Option<Tensor>,
    /// The device scalars, `[2 + M]` ([`super::adamw_scalars`]).
    scalars: CudaSlice<f32>,
    n_slots: u32,
    p: u32,
    models: u32,
    /// beta1, 1 - beta1, beta2, 1 - beta2, eps, each rounded once to float32 from float64 (the
    /// composed update's affine arguments).
    consts: [f32; 5],
}

/// Checks that `t` is a contiguous float32 tensor on `device` with `len` elements, else a
/// [`ModelError::Input`] naming `what`.
fn check(t: &Tensor, device: &CudaDevice, len: usize, what: &str) -> Result<()> {
    let ok = t.dtype() == DType::F32
        && t.is_contiguous()
        && t.elem_count() == len
        && matches!(t.device(), candle_core::Device::Cuda(d) if d.id() == device.id());
    if ok {
        Ok(())
    } else {
        Err(ModelError::Input(format!(
            "fused AdamW: {what} must be a contiguous float32 tensor of {len} elements on {:?}, \
             got {:?} {:?} on {:?}",
            device,
            t.dtype(),
            t.dims(),
            t.device()
        )))
    }
}

impl Kernel {
    /// The state for `params` (docs of [`super::FusedAdamW::new`]); `None` for a parameter that is
    /// not a whole contiguous float32 tensor of `models * len` elements on the first one's device.
    pub(super) fn new(
        params: &[Tensor],
        offsets: Vec<u32>,
        models: usize,
        decay: Option<&Tensor>,
        (beta1, beta2, eps): (f64, f64, f64),
    ) -> Result<Option<Kernel>> {
        let device = match params[0].device() {
            candle_core::Device::Cuda(d) => d.clone(),
            _ => return Ok(None),
        };
        let stream = device.cuda_stream();
        let p = *offsets.last().expect("offsets has n_slots + 1 entries") as usize;
        if p.checked_mul(models).is_none_or(|n| n > u32::MAX as usize) {
            return Ok(None);
        }
        let mut table = Vec::with_capacity(params.len());
        for (s, t) in params.iter().enumerate() {
            let len = (offsets[s + 1] - offsets[s]) as usize * models;
            let (storage, layout) = t.storage_and_layout();
            let whole = layout.is_contiguous() && layout.start_offset() == 0;
            match (&*storage, whole) {
                (Storage::Cuda(c), true)
                    if t.dtype() == DType::F32
                        && t.elem_count() == len
                        && c.device.id() == device.id() =>
                {
                    let slice = c.as_cuda_slice::<f32>()?;
                    let (ptr, _sync) = slice.device_ptr(&stream);
                    table.push(ptr);
                }
                (Storage::Cuda(_), _) => return Ok(None),
                _ => {
                    return Err(ModelError::Input(
                        "fused AdamW: parameters on different devices".into(),
                    ))
                }
            }
        }
        let decay = match decay {
            Some(d) => {
                check(d, &device, models * p, "the weight decay")?;
                Some(d.contiguous()?)
            }
            None => None,
        };
        let table = stream.clone_htod(&table).w()?;
        let n_slots = (offsets.len() - 1) as u32;
        let offsets = stream.clone_htod(&offsets).w()?;
        let scalars = stream.alloc_zeros::<f32>(2 + models).w()?;
        Ok(Some(Kernel {
            device,
            _params: params.to_vec(),
            table,
            offsets,
            decay,
            scalars,
            n_slots,
            p: p as u32,
            models: models as u32,
            consts: [
                beta1 as f32,
                (1.0 - beta1) as f32,
                beta2 as f32,
                (1.0 - beta2) as f32,
                eps as f32,
            ],
        }))
    }

    /// One update (docs of [`super::FusedAdamW::step`]).
    pub(super) fn step(&mut self, moments: &Tensor, g: &Tensor, scalars: &[f32]) -> Result<()> {
        let total = self.p as usize * self.models as usize;
        check(moments, &self.device, 2 * total, "the moments")?;
        check(g, &self.device, total, "the gradients")?;
        if scalars.len() != 2 + self.models as usize {
            return Err(ModelError::Input(format!(
                "fused AdamW: {} scalars for {} models",
                scalars.len(),
                self.models
            )));
        }
        // Into the same buffer every update: the kernel's arguments never change.
        self.device
            .cuda_stream()
            .memcpy_htod(scalars, &mut self.scalars)
            .w()?;
        moments.inplace_op2(g, &Launch { kernel: self })?;
        Ok(())
    }
}

/// The in-place operation that launches the kernel on the moments (the destination) and the
/// gradients.
struct Launch<'a> {
    kernel: &'a Kernel,
}

impl candle_core::InplaceOp2 for Launch<'_> {
    fn name(&self) -> &'static str {
        "hyperlens-fused-adamw"
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<()> {
        candle_core::bail!("the fused AdamW update runs on CUDA devices only")
    }

    fn cuda_fwd(
        &self,
        moments: &mut CudaStorage,
        ml: &Layout,
        g: &CudaStorage,
        gl: &Layout,
    ) -> candle_core::Result<()> {
        let k = self.kernel;
        let total = k.p as usize * k.models as usize;
        let dev = moments.device().clone();
        let func = dev.get_or_load_custom_func("hl_adamw_f32", MODULE, ptx::KERNELS)?;
        let g = g
            .as_cuda_slice::<f32>()?
            .slice(gl.start_offset()..gl.start_offset() + total);
        let m_start = ml.start_offset();
        let mut mv = moments
            .as_cuda_slice_mut::<f32>()?
            .slice_mut(m_start..m_start + 2 * total);
        // The weight decay, read through its tensor's storage (a null address when none).
        let decay_storage = k.decay.as_ref().map(|d| d.storage_and_layout());
        let decay = match &decay_storage {
            Some((s, l)) => match &**s {
                Storage::Cuda(c) => Some(
                    c.as_cuda_slice::<f32>()?
                        .slice(l.start_offset()..l.start_offset() + total),
                ),
                _ => candle_core::bail!("fused AdamW: the weight decay is not on the device"),
            },
            None => None,
        };
        let null = 0u64;
        let [b1, omb1, b2, omb2, eps] = k.consts;
        let (blocks, threads) = adamw_grid(total);
        let mut b = func.builder();
        b.arg(&mut mv);
        b.arg(&g);
        match &decay {
            Some(d) => b.arg(d),
            None => b.arg(&null),
        };
        b.arg(&k.scalars);
        b.arg(&k.table);
        b.arg(&k.offsets);
        b.arg(&k.n_slots);
        b.arg(&k.p);
        b.arg(&k.models);
        b.arg(&b1);
        b.arg(&omb1);
        b.arg(&b2);
        b.arg(&omb2);
        b.arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments are those of `hl_adamw_f32` in order and type (device slices or
        // a null address, then three u32 and five f32); the moments hold 2 M P elements, the gradients and decay M P, the scalars 2 + M, the table and
        // offsets n_slots and n_slots + 1; each table entry is the address of a live parameter of
        // M * len elements (held by the kernel's state), which the kernel alone writes; all on
        // this device's one stream, so the launch is ordered after the writes that made them.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }
}
