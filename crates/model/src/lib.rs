//! hyperlens model: the transformer of "Attention as a Hypernetwork" (Schug et al. 2024) with its
//! eight sequence mixers on candle; checkpoints (safetensors + `config.json`, TransformerLens names);
//! the importer of the paper's JAX exports; batched evaluation. See `spec/models.md`.
//!
//! ```no_run
//! use hyperlens_model::{Config, Mixer, Transformer};
//! # fn main() -> hyperlens_model::Result<()> {
//! let cfg = Config::sraven_base(Mixer::Hyla);
//! let (model, _varmap) = Transformer::init(&cfg, 0, &candle_core::Device::Cpu)?;
//! assert_eq!(model.n_params(), 402_824);
//! # Ok(()) }
//! ```

pub mod attention;
pub mod checkpoint;
pub mod config;
mod cpu_ops;
pub mod device;
pub mod error;
pub mod eval;
pub mod fastpath;
pub mod fused;
pub mod import;
pub mod lm;
mod mix_kernel;
pub mod mixer;
pub mod transformer;

/// The candle crates this crate is built on, re-exported so that dependants use the same copies.
pub use candle_core;
pub use candle_nn;

pub use config::Config;
pub use device::Device;
pub use error::{ModelError, Result};
pub use eval::{evaluate, EvalMetrics};
pub use mixer::{Mixer, Normalisation, ValueNetwork};
pub use transformer::{ForwardOutput, Transformer};
