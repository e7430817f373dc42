//! hyperlens model: the transformer of "Attention as a Hypernetwork" (Schug et al. 2024) with its
//! eight sequence mixers on candle; checkpoints (safetensors + `config.json`, TransformerLens names);
//! the importer of the paper's JAX exports; batched evaluation. See `docs/spec/models.md`.
//!
//! Where to start reading: [`Transformer::forward`] (the forward pass) runs the blocks of [`nn`]
//! ([`nn::Block::forward`], [`nn::Attention::forward`]); the operations with fast forms go through
//! [`ops::Ops`], whose reference forms ([`ops::reference`]) are the definition.
//!
//! ```no_run
//! use hyperlens_model::{Config, Mixer, Transformer};
//! # fn main() -> hyperlens_model::Result<()> {
//! let cfg = Config::sraven_base(Mixer::Hyla);
//! let (model, _varmap) = Transformer::init(&cfg, 0, &candle_core::Device::Cpu)?;
//! assert_eq!(model.n_params(), 402_824);
//! # Ok(()) }
//! ```

pub mod checkpoint;
pub mod config;
pub mod device;
pub mod error;
pub mod eval;
pub mod evaluator;
pub mod hooks;
pub mod import;
pub mod infer;
pub mod lm;
pub mod mixer;
pub mod nn;
pub mod ops;
pub mod st_header;
pub mod stacked;
pub mod task;
pub mod transformer;

/// The candle crates this crate is built on, re-exported so that dependants use the same copies.
pub use candle_core;
pub use candle_nn;

pub use config::Config;
pub use device::Device;
pub use error::{ModelError, Result};
pub use eval::{evaluate, EvalMetrics};
pub use evaluator::{BlockStart, CodeSite, Evaluator, Readings, Reads};
pub use hooks::{Cache, HookFn};
pub use infer::{Inference, InferenceOutput};
pub use mixer::{Mixer, Normalisation, ValueNetwork};
pub use ops::Ops;
pub use stacked::StackedTransformer;
pub use task::{RunRecord, Steps, Task};
pub use transformer::{ForwardOutput, Transformer};
