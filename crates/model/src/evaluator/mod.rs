//! The evaluation engine of one SRAVEN / fuzzy-logic model: every evaluation-mode operation that
//! the product runs on a loaded [`Transformer`], behind one type that picks its engine once.
//!
//! [`Evaluator::new`] looks at the model's device a single time. On the CPU it builds the host
//! engine ([`crate::infer`]: no candle, the weights copied once, buffers reused); on CUDA or Metal
//! it keeps candle's pass ([`Transformer::forward`] and the hooked pass of [`crate::hooks`]). No
//! caller outside this module tests the device to choose an engine: `eval`, `probe` (SRAVEN and
//! logic), `cache`, `patch`, the transplant test, the report and the Python front all ask the
//! evaluator.
//!
//! The operations, and the engine that runs each:
//!
//! | operation | CPU | CUDA / Metal |
//! |---|---|---|
//! | [`Evaluator::logits`] | host engine | [`Transformer::forward`] |
//! | [`Evaluator::read`] (latent codes at sites, streams entering blocks) | host engine | `forward` with attention, or the hooked pass when streams are read |
//! | [`Evaluator::patterns`] (every head's attention) | host engine | `forward` with attention |
//! | [`Evaluator::block_start`] / [`Evaluator::run_with_site_codes`] (one query's codes replaced at a block) | host engine from the block's state | hooked pass from the block's stream |
//! | [`Evaluator::run_with_hooks`], [`Evaluator::run_with_hooks_from`], [`Evaluator::run_with_cache`] (any TransformerLens hook point) | the hooked pass | the hooked pass |
//!
//! The hooked pass is candle's on every device: it is the one pass that exposes every hook point
//! of the module table in [`crate::hooks`] as a tensor that a hook may read or replace
//! ([`HookFn`], the one hook API). The host engine offers only the codes and the streams entering
//! blocks, which is what the fast operations above read and write.
//!
//! The host engine's logits and codes equal candle's to float32 rounding (the unit tests of
//! `infer` hold every mixer within 1e-5 of each array's scale; `tests/model.rs` holds the
//! evaluator's operations to the reference pass).

mod codes;
mod site;

use std::path::Path;

use candle_core::{Device, Tensor};
use ndarray::ArrayView3;

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::hooks::HookFn;
use crate::infer::{BlockState, Inference};
use crate::transformer::Transformer;

pub use codes::{CodeSite, Readings, Reads};
pub use site::BlockStart;

/// The engine behind an [`Evaluator`], chosen once from the model's device.
enum Engine {
    /// The host engine (CPU).
    Host(Box<Inference>),
    /// candle's passes on the model's device (CUDA, Metal).
    Candle,
}

/// One model's evaluation engine (module docs): logits, latent codes at any sites and layers,
/// attention patterns, runs with TransformerLens-named hooks, and the block state that the
/// interventions start from.
///
/// Built once per model and reused for every batch; it is `Sync`, so batches may run from several
/// threads.
pub struct Evaluator {
    model: Transformer,
    engine: Engine,
}

impl std::fmt::Debug for Evaluator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evaluator")
            .field("config", self.config())
            .field("engine", &self.engine_name())
            .finish()
    }
}

impl Evaluator {
    /// The evaluator of `model` on its device: the host engine on the CPU (a copy of the weights,
    /// 1.6 MB for the base SRAVEN model), candle's passes elsewhere.
    ///
    /// # Errors
    /// [`ModelError::Input`] if the host engine cannot read the model's weights.
    pub fn new(model: Transformer) -> Result<Evaluator> {
        let engine = if model.device().is_cpu() {
            Engine::Host(Box::new(Inference::new(&model)?))
        } else {
            Engine::Candle
        };
        Ok(Evaluator { model, engine })
    }

    /// The evaluator of `model` by candle's passes, whatever its device: the reference that defines
    /// the model (the engine a GPU model gets), for checking the host engine against it. Slower on
    /// the CPU than [`Evaluator::new`]'s engine; the numbers agree to float32 rounding.
    pub fn reference(model: Transformer) -> Evaluator {
        Evaluator {
            model,
            engine: Engine::Candle,
        }
    }

    /// Loads a checkpoint directory ([`Transformer::load`]) and builds its evaluator on `device`.
    ///
    /// # Errors
    /// As [`Transformer::load`] and [`Evaluator::new`].
    pub fn load(dir: &Path, device: &Device) -> Result<Evaluator> {
        Evaluator::new(Transformer::load(dir, device)?)
    }

    /// The model's configuration.
    pub fn config(&self) -> &Config {
        self.model.config()
    }

    /// The model (candle's tensors: the reference pass, the weights, the device).
    pub fn transformer(&self) -> &Transformer {
        &self.model
    }

    /// The device the model's tensors live on.
    pub fn device(&self) -> &Device {
        self.model.device()
    }

    /// The engine's name, for logs and sidecars: `host` (the CPU engine) or `candle`.
    pub fn engine_name(&self) -> &'static str {
        match self.engine {
            Engine::Host(_) => "host",
            Engine::Candle => "candle",
        }
    }

    /// The host engine, when the model is on the CPU.
    fn host(&self) -> Option<&Inference> {
        match &self.engine {
            Engine::Host(inf) => Some(inf),
            Engine::Candle => None,
        }
    }

    /// A problem batch as a tensor on the model's device (for the hooked pass).
    ///
    /// # Shapes
    /// `x [B, T, d_in]` -> `[B, T, d_in]` f32.
    ///
    /// # Errors
    /// [`ModelError::Input`] for a batch of another shape than the model reads; candle errors.
    pub fn input(&self, x: ArrayView3<'_, f32>) -> Result<Tensor> {
        self.check_input(x)?;
        let (b, t, m) = x.dim();
        let data: Vec<f32> = x.as_standard_layout().iter().copied().collect();
        Ok(Tensor::from_vec(data, (b, t, m), self.device())?)
    }

    /// [`ModelError::Input`] unless `x` holds one or more problems of the model's shape;
    /// [`ModelError::Budget`] when a forward pass of that many problems would exceed the memory
    /// budget ([`Evaluator::forward_bytes`]), before anything is allocated.
    fn check_input(&self, x: ArrayView3<'_, f32>) -> Result<()> {
        let cfg = self.config();
        let (b, t, m) = x.dim();
        if b == 0 || t != cfg.n_tokens || m != cfg.d_in {
            return Err(ModelError::Input(format!(
                "input must be [batch >= 1, {}, {}] f32, got {:?}",
                cfg.n_tokens,
                cfg.d_in,
                x.shape()
            )));
        }
        hyperlens_io::budget::check_alloc(
            format!("a forward pass of a batch of {b} problems"),
            self.forward_bytes(b),
        )?;
        Ok(())
    }

    /// The memory a forward pass of `b` problems works in, estimated from above: twice one
    /// layer's activations (residual stream and its normalisation, attention output, queries,
    /// keys and values, scores and probabilities of every head, MLP hidden units) plus the input;
    /// saturating.
    ///
    /// # Units
    /// Bytes.
    pub fn forward_bytes(&self, b: usize) -> u128 {
        let c = self.config();
        let per_token =
            4 * c.d_model + 3 * c.n_heads * c.d_head + c.d_mlp + 2 * c.n_heads * c.n_tokens;
        let per_problem = (c.n_tokens as u128)
            .saturating_mul(2 * per_token as u128 + c.d_in as u128)
            .saturating_mul(4);
        per_problem.saturating_mul(b as u128)
    }

    /// The logits of a problem batch (evaluation mode: no dropout).
    ///
    /// # Shapes
    /// `x [B, T, d_in]` (SRAVEN: one-hot tokens `[B, 36, 8]`) -> `[B, F, d_out]`, row-major.
    ///
    /// # Errors
    /// [`ModelError::Input`] for a batch of another shape; candle errors.
    pub fn logits(&self, x: ArrayView3<'_, f32>) -> Result<Vec<f32>> {
        self.check_input(x)?;
        match self.host() {
            Some(inf) => Ok(inf.run_problems(x, 0, &())?.logits),
            None => {
                let xt = self.input(x)?;
                Ok(self
                    .model
                    .forward(&xt, false)?
                    .logits
                    .flatten_all()?
                    .to_vec1()?)
            }
        }
    }

    /// The hooked pass (every hook point of [`crate::hooks`], TransformerLens names) with `hooks`
    /// reading or replacing activations: [`Transformer::run_with_hooks`].
    ///
    /// # Shapes
    /// `x [B, T, d_in]` on the model's device ([`Evaluator::input`]) -> logits `[B, F, d_out]`.
    ///
    /// # Errors
    /// As [`Transformer::run_with_hooks`].
    pub fn run_with_hooks(&self, x: &Tensor, hooks: &mut dyn HookFn) -> Result<Tensor> {
        self.model.run_with_hooks(x, hooks)
    }

    /// The hooked pass from the stream entering block `layer`: [`Transformer::run_with_hooks_from`].
    ///
    /// # Shapes
    /// `resid [B, T, D]` -> logits `[B, F, d_out]`.
    ///
    /// # Errors
    /// As [`Transformer::run_with_hooks_from`].
    pub fn run_with_hooks_from(
        &self,
        resid: &Tensor,
        layer: usize,
        hooks: &mut dyn HookFn,
    ) -> Result<Tensor> {
        self.model.run_with_hooks_from(resid, layer, hooks)
    }

    /// The hooked pass keeping the activations whose names match `patterns` (names or globs,
    /// [`crate::hooks::select_hooks`]): [`Transformer::run_with_cache`].
    ///
    /// # Shapes
    /// `x [B, T, d_in]` -> logits `[B, F, d_out]` and each activation in the shape of the hook
    /// table, in pass order.
    ///
    /// # Errors
    /// As [`Transformer::run_with_cache`].
    pub fn run_with_cache(
        &self,
        x: &Tensor,
        patterns: &[String],
    ) -> Result<(Tensor, Vec<(String, Tensor)>)> {
        self.model.run_with_cache(x, patterns)
    }

    /// The host engine's block state, when the model is on the CPU.
    fn host_state<'a>(&'a self, start: &'a BlockStart) -> Option<(&'a Inference, &'a BlockState)> {
        match (&self.engine, start.host_state()) {
            (Engine::Host(inf), Some(state)) => Some((inf, state)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
