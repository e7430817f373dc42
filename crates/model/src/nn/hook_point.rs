//! The hook points of a pass as a type parameter of the layers, as TransformerLens's `HookPoint`:
//! [`NoHooks`] is the identity at every point (the plain forward pass; after inlining nothing of
//! the hooks is left), and a [`HookFn`] reads or replaces the activations by their TransformerLens
//! names (`crate::hooks`, whose module docs list the points).
//!
//! The layers are written once, generic over [`HookPoints`]. Where a hook needs an activation that
//! the fast form of an operation never makes (a LayerNorm's scale, the attention pattern inside
//! the fused mix, HYLA's hidden units), the hooked pass computes that operation in its decomposed
//! reference form (`crate::hooks::layer_norm_hooked`, `crate::hooks::mix_hooked`); without hooks
//! the operation runs in the model's [`crate::Ops`], as it always has.
//!
//! A reader that attaches no hook function (`hooks()` is `None`, so the fast forms stay) may still
//! override [`HookPoints::at_block`] to see the activations the fast forms make (the attention's
//! scores and pattern, the residual stream), and stop the pass early or ask for the logits of a
//! few rows only ([`HookPoints::blocks_to_run`], [`HookPoints::logit_rows`]): the lens of
//! `crate::lm::LanguageModel::latent_codes`.

use candle_core::Tensor;

use crate::error::Result;
use crate::hooks::{at, at_heads, HookFn};

/// The hook points of one pass: the identity ([`NoHooks`]) or a [`HookFn`] (`dyn HookFn`).
pub trait HookPoints {
    /// The hook function, or `None` when nothing is attached (every point is the identity and the
    /// operations keep their fast forms).
    fn hooks(&mut self) -> Option<&mut dyn HookFn>;

    /// The activation `name` after its hook (module docs of `crate::hooks`).
    ///
    /// # Errors
    /// A hook's error; a replacement of another shape or dtype.
    #[inline]
    fn at(&mut self, name: &str, value: Tensor) -> Result<Tensor> {
        match self.hooks() {
            None => Ok(value),
            Some(h) => at(h, name, value),
        }
    }

    /// The activation `blocks.{l}.{point}` after its hook (the name is formatted only when a hook is
    /// attached).
    ///
    /// # Errors
    /// As [`HookPoints::at`].
    #[inline]
    fn at_block(&mut self, l: usize, point: &str, value: Tensor) -> Result<Tensor> {
        match self.hooks() {
            None => Ok(value),
            Some(h) => at(h, &format!("blocks.{l}.{point}"), value),
        }
    }

    /// How many of the model's `n_layers` blocks the pass runs (default: all of them). A reader
    /// that needs only the first blocks' activations (the lens of `crate::lm::lens`) stops the
    /// pass early; a pass that stops early computes no logits (see [`HookPoints::logit_rows`]).
    #[inline]
    fn blocks_to_run(&self, n_layers: usize) -> usize {
        n_layers
    }

    /// Whether the pass needs anything of block `l` after its attention pattern (the value mixing,
    /// the output projection, the MLP and the residual stream after them). Default: yes. A reader
    /// that reads only the pattern or scores of the last block it runs, with no logits and no
    /// residual stream after it (the lens of `crate::lm::LanguageModel::latent_codes`), answers
    /// no for that block, and a pass that supports it (the Llama pass) stops there; the pass then
    /// computes no logits.
    #[inline]
    fn needs_block_output(&self, l: usize) -> bool {
        let _ = l;
        true
    }

    /// The rows of the final residual stream, flattened to `[B·T, D]`, at which the pass
    /// computes logits: `None` (default) at every position, `Some(rows)` only at those (the
    /// final norm and the unembedding then read `R` rows, not `B·T`; no rows computes nothing).
    ///
    /// # Shapes
    /// `rows` u32 `[R]`; the pass's logits are then `[1, R, V]` (`[1, 0, V]` for no rows).
    #[inline]
    fn logit_rows(&self) -> Option<&Tensor> {
        None
    }

    /// [`HookPoints::at_block`] for a tensor held as `[B, H, T, d]` whose hook shape is
    /// `[B, T, H, d]` (`attn.hook_q`, `hook_k`, `hook_v`, `hook_z`).
    ///
    /// # Shapes
    /// `value [B, H, T, d]` -> `[B, H, T, d]`.
    ///
    /// # Errors
    /// As [`HookPoints::at`].
    #[inline]
    fn at_block_heads(&mut self, l: usize, point: &str, value: Tensor) -> Result<Tensor> {
        match self.hooks() {
            None => Ok(value),
            Some(h) => at_heads(h, &format!("blocks.{l}.{point}"), value),
        }
    }
}

/// No hook attached: every hook point is the identity, and a pass generic over [`HookPoints`] is
/// the plain forward pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl HookPoints for NoHooks {
    #[inline(always)]
    fn hooks(&mut self) -> Option<&mut dyn HookFn> {
        None
    }
}

impl<'a> HookPoints for dyn HookFn + 'a {
    #[inline]
    fn hooks(&mut self) -> Option<&mut dyn HookFn> {
        Some(self)
    }
}
