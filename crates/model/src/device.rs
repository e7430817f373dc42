//! Run-time device choice: `cpu` (default), `cuda[:N]`, `metal`, mapped to candle devices.
//!
//! CUDA needs the crate feature `cuda` (`cargo build --features cuda`); Metal needs the feature
//! `metal` on macOS. Asking for a device that is not compiled in is a clear error, not a panic.
//!
//! A CUDA device is opened with cudarc's per-allocation event tracking switched off (see
//! [`EVENT_TRACKING_ENV`]): cudarc 0.19 creates two CUDA events for every buffer it allocates and
//! destroys them with the buffer, but uses them only when a context has several streams, and
//! candle's `Device::new_cuda` runs everything on one. A training step of the base model makes
//! about 2,200 tensors on a GPU (`docs/performance.md`), most of them
//! new buffers (in cudarc issue #386, event calls, `cuEventDestroy` among them, showed up as a
//! visible host cost in candle's traces).
//! [`upload_cache`] opens a scope in which candle caches the small uploads it makes per operation
//! (on by default because it made base HYLA training faster on an H100, see `docs/performance.md`;
//! [`UPLOAD_CACHE_ENV`] `=0` turns it off).

use std::fmt;
use std::str::FromStr;

use crate::error::{ModelError, Result};

/// A compute device, parsed from and printed as its CLI name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The host CPU (candle's CPU backend; threads set by `CANDLE_NUM_THREADS`).
    #[default]
    Cpu,
    /// An NVIDIA GPU by ordinal (`cuda` = `cuda:0`).
    Cuda(usize),
    /// The Apple GPU (`metal`).
    Metal,
}

impl Device {
    /// The candle device for this choice.
    ///
    /// # Errors
    /// [`ModelError::DeviceUnavailable`] if the backend was not compiled in (missing cargo feature
    /// `cuda` / `metal`) or the device cannot be opened.
    pub fn to_candle(self) -> Result<candle_core::Device> {
        match self {
            Device::Cpu => Ok(candle_core::Device::Cpu),
            Device::Cuda(ordinal) => cuda_device(ordinal),
            Device::Metal => metal_device(),
        }
    }
}

/// Environment variable that keeps cudarc's per-allocation CUDA events when set to `1` (default `0`:
/// off). The events only matter to programs that run several CUDA streams, which hyperlens does not;
/// the variable is a way back to cudarc's default without a rebuild.
pub const EVENT_TRACKING_ENV: &str = "HYPERLENS_CUDA_EVENT_TRACKING";

/// Environment variable that turns off candle's cache of small host-to-device uploads inside
/// [`upload_cache`] scopes when set to `0` (default `1`: on); see [`UploadCache`].
///
/// On one H100 the base HYLA model trains faster with the cache than without, with the same losses
/// (`docs/performance.md`; the log is `bench/gpu/throughput-h100.log`); the CUDA test
/// (`tests/model.rs`, `cuda_forward_and_gradients_match_cpu`) checks every mixer's gradients with it
/// on and off, and the shipped `sraven-*` runs trained their last 58,750-93,750 steps with it.
pub const UPLOAD_CACHE_ENV: &str = "HYPERLENS_CUDA_UPLOAD_CACHE";

/// A `0` / `1` switch from the value of environment variable `name` (unset or empty: `default`).
///
/// # Errors
/// [`ModelError::DeviceUnavailable`] for any other value.
fn switch_from_env(name: &str, value: Option<&str>, default: bool) -> Result<bool> {
    match value.map(str::trim) {
        None | Some("") => Ok(default),
        Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(ModelError::DeviceUnavailable {
            device: "cuda".into(),
            reason: format!("{name} must be 0 or 1, got `{other}`"),
        }),
    }
}

/// Whether the upload cache is wanted: yes unless [`UPLOAD_CACHE_ENV`] is `0`.
///
/// # Errors
/// [`ModelError::DeviceUnavailable`] for a value other than unset, `0` or `1`.
pub fn upload_cache_requested() -> Result<bool> {
    env_switch(UPLOAD_CACHE_ENV, true)
}

/// [`switch_from_env`] on the current value of environment variable `name`.
fn env_switch(name: &str, default: bool) -> Result<bool> {
    switch_from_env(name, std::env::var(name).ok().as_deref(), default)
}

/// A scope in which candle 0.11's CUDA backend reuses its host-to-device uploads (the guard of
/// `CudaDevice::enable_cuda_graph_htod_cache`, made for CUDA-graph capture).
///
/// Without it, every CUDA operation on a non-contiguous layout and every reduction allocates a small
/// device buffer and copies its dims and strides from pageable host memory into it; a training
/// step of the base model does so hundreds of times. Inside the scope the dims-and-strides buffers
/// are cached per layout (a bounded set for a fixed model), and any other upload of at most 4 KiB
/// is cached by its bytes for the life of the thread, so a scope must not upload per-step data
/// (batches, targets, dropout masks): the training loop opens it around the backward pass and the
/// optimizer update only, which upload nothing. Dropping the value ends the scope. On the CPU, or
/// when not asked for, it does nothing.
///
/// Source: candle-core 0.11.1, `cuda_backend::device` (`CUDA_GRAPH_HTOD_CACHE`) and
/// `SlicePtrOrNull::params_from_vec`.
///
/// On every device the scope is also recorded for this thread, and [`upload`] counts the uploads
/// made while one is open ([`uploads_in_scopes`]): on the CPU this is the mock of the CUDA cache by
/// which a test proves that a loop uploads nothing inside the scope (each such upload would be a
/// device buffer kept for the thread's life on CUDA).
pub struct UploadCache {
    guard: Option<Box<dyn std::any::Any>>,
    recorded: bool,
}

impl UploadCache {
    /// Whether the scope is active (a CUDA device and the cache asked for).
    pub fn is_active(&self) -> bool {
        self.guard.is_some()
    }
}

impl Drop for UploadCache {
    fn drop(&mut self) {
        if self.recorded {
            SCOPE_OPEN.with(|s| s.set(false));
        }
    }
}

thread_local! {
    /// Whether an [`UploadCache`] scope is open on this thread.
    static SCOPE_OPEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Uploads through [`upload`] made inside a scope on this thread, since the thread began.
    static UPLOADS_IN_SCOPES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Opens an [`UploadCache`] scope on `device` when `on` (from [`upload_cache_requested`]): candle's
/// cache on a CUDA device, and on every device the record that [`upload`] counts against.
pub fn upload_cache(device: &candle_core::Device, on: bool) -> UploadCache {
    let recorded = on && !SCOPE_OPEN.with(|s| s.replace(true));
    #[cfg(feature = "cuda")]
    if let (true, candle_core::Device::Cuda(cuda)) = (on, device) {
        return UploadCache {
            guard: Some(Box::new(cuda.enable_cuda_graph_htod_cache())),
            recorded,
        };
    }
    let _ = device;
    UploadCache {
        guard: None,
        recorded,
    }
}

/// Copies host values to `device` as a tensor of `shape`: the one way the training loop uploads
/// per-step values, counted when an [`UploadCache`] scope is open ([`uploads_in_scopes`]).
///
/// # Shapes
/// `data` holds `shape`'s element count.
///
/// # Errors
/// [`ModelError::Candle`] for a length that does not fit `shape` or a failed copy.
pub fn upload<S: Into<candle_core::Shape>>(
    data: Vec<f32>,
    shape: S,
    device: &candle_core::Device,
) -> Result<candle_core::Tensor> {
    if SCOPE_OPEN.with(|s| s.get()) {
        UPLOADS_IN_SCOPES.with(|n| n.set(n.get() + 1));
    }
    Ok(candle_core::Tensor::from_vec(data, shape, device)?)
}

/// How many [`upload`]s this thread made inside [`UploadCache`] scopes (on CUDA, each one a
/// buffer that candle keeps for the thread's life). Training must make none.
pub fn uploads_in_scopes() -> u64 {
    UPLOADS_IN_SCOPES.with(|n| n.get())
}

// The workspace denies `unsafe`; this is its one use: cudarc offers no safe way to switch the events off.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
fn cuda_device(ordinal: usize) -> Result<candle_core::Device> {
    let keep_events = env_switch(EVENT_TRACKING_ENV, false)?;
    let device =
        candle_core::Device::new_cuda(ordinal).map_err(|e| ModelError::DeviceUnavailable {
            device: Device::Cuda(ordinal).to_string(),
            reason: e.to_string(),
        })?;
    if let (false, candle_core::Device::Cuda(cuda)) = (keep_events, &device) {
        // SAFETY: cudarc's contract asks the caller to synchronise several streams by hand once the
        // events are off. candle's `Device::new_cuda` runs every operation of this device on one
        // stream and never calls `CudaContext::new_stream`, so cudarc's context stays out of
        // multi-stream mode, where alone it records or waits on these events
        // (`is_managing_stream_synchronization`): switching them off only stops their creation.
        // It is called before this device allocates any tensor.
        unsafe { cuda.disable_event_tracking() };
    }
    Ok(device)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(ordinal: usize) -> Result<candle_core::Device> {
    Err(ModelError::DeviceUnavailable {
        device: Device::Cuda(ordinal).to_string(),
        reason: "this build has no CUDA support; rebuild with `--features cuda`".into(),
    })
}

#[cfg(all(feature = "metal", target_os = "macos"))]
fn metal_device() -> Result<candle_core::Device> {
    candle_core::Device::new_metal(0).map_err(|e| ModelError::DeviceUnavailable {
        device: "metal".into(),
        reason: e.to_string(),
    })
}

#[cfg(not(all(feature = "metal", target_os = "macos")))]
fn metal_device() -> Result<candle_core::Device> {
    Err(ModelError::DeviceUnavailable {
        device: "metal".into(),
        reason: "this build has no Metal support; Metal needs macOS and `--features metal`".into(),
    })
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(0) => f.write_str("cuda"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Metal => f.write_str("metal"),
        }
    }
}

impl FromStr for Device {
    type Err = ModelError;

    /// Parses `cpu`, `cuda`, `cuda:N` or `metal`.
    ///
    /// # Errors
    /// [`ModelError::UnknownDevice`] for anything else.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            "metal" => Ok(Device::Metal),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(Device::Cuda)
                .ok_or_else(|| ModelError::UnknownDevice(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        for (s, d) in [
            ("cpu", Device::Cpu),
            ("cuda", Device::Cuda(0)),
            ("cuda:3", Device::Cuda(3)),
            ("metal", Device::Metal),
        ] {
            assert_eq!(s.parse::<Device>().unwrap(), d);
            assert_eq!(d.to_string(), s);
        }
        assert!("tpu".parse::<Device>().is_err());
        assert!("cuda:x".parse::<Device>().is_err());
        assert!(Device::Cpu.to_candle().unwrap().is_cpu());
    }

    #[test]
    fn env_switch_values() {
        for default in [false, true] {
            let on = |v| switch_from_env(EVENT_TRACKING_ENV, v, default);
            assert_eq!(on(None).unwrap(), default);
            assert_eq!(on(Some("")).unwrap(), default);
            assert!(!on(Some("0")).unwrap());
            assert!(on(Some(" 1 ")).unwrap());
            let e = on(Some("yes")).unwrap_err().to_string();
            assert!(e.contains(EVENT_TRACKING_ENV) && e.contains("`yes`"), "{e}");
        }
    }

    #[test]
    fn upload_cache_is_a_no_op_on_the_cpu() {
        assert!(!upload_cache(&candle_core::Device::Cpu, true).is_active());
        assert!(!upload_cache(&candle_core::Device::Cpu, false).is_active());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_feature_is_a_clear_error() {
        let e = Device::Cuda(0).to_candle().unwrap_err().to_string();
        assert!(e.contains("--features cuda"), "{e}");
    }
}
