//! Run-time device choice: `cpu` (default), `cuda[:N]`, `metal`, mapped to candle devices.
//!
//! CUDA needs the crate feature `cuda` (`cargo build --features cuda`); Metal needs the feature
//! `metal` on macOS. Asking for a device that is not compiled in is a clear error, not a panic.

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

#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize) -> Result<candle_core::Device> {
    candle_core::Device::new_cuda(ordinal).map_err(|e| ModelError::DeviceUnavailable {
        device: Device::Cuda(ordinal).to_string(),
        reason: e.to_string(),
    })
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

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_feature_is_a_clear_error() {
        let e = Device::Cuda(0).to_candle().unwrap_err().to_string();
        assert!(e.contains("--features cuda"), "{e}");
    }
}
