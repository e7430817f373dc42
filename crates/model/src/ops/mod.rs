//! The operations that have fast forms: the one API the layers of [`crate::nn`] call for them.
//!
//! Each operation has a **reference form** in [`reference`](mod@reference): plain candle maths, differentiated by
//! candle's autodiff. It is the definition of the operation, and the oracle the fast forms are
//! tested against. The **fast forms** in `fast/` compute the same function with fewer graph nodes
//! or fewer passes over memory:
//!
//! - custom operations with hand-written gradients (LayerNorm, softmax, the HYLA value network with
//!   its normalisation): the forward pass is candle's fused kernel, the backward pass written out.
//!   Each tensor of a graph is one kernel launch on a GPU and costs candle a zero-filled gradient
//!   slot in the backward pass, so these matter most there;
//! - CPU kernels in float32: a bias over leading axes, the tanh GELU, the LayerNorm and softmax
//!   gradients as single passes, the whole HYLA mix as one pass over the (query, key) pairs, and
//!   broadcasts written as products with ones (candle's CPU sums over leading axes are slow).
//!
//! Which forms run is an explicit choice, [`Ops`], carried by the model ([`crate::Transformer::with_ops`])
//! and passed to every layer's `forward`. Forms that do not apply to a tensor (another device or
//! dtype) fall back to the next simpler form, so every choice runs everywhere.
//!
//! Source of the maths: `docs/spec/models.md` ("Scores and the three normalisations", "Value
//! networks", "The block").

use candle_core::Tensor;

use crate::error::Result;
use crate::mixer::Mixer;

pub mod cuda;
pub(crate) mod fast;
pub mod reference;

/// Which forms of the operations run (module docs).
///
/// The three give the same function; they differ in float32 rounding (tested to 1e-5 relative on
/// values and gradients, `tests/model.rs`), graph size and speed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Ops {
    /// The plain candle maths of [`reference`](mod@reference) only: the definition and the test oracle.
    Reference,
    /// Custom operations with hand-written gradients where the device is the CPU or CUDA and the
    /// dtype float32 (fewer graph nodes); the reference forms elsewhere. What a GPU runs.
    Fused,
    /// [`Ops::Fused`] plus the CPU kernels in float32 on the CPU (single passes, products with
    /// ones for broadcasts) and, in a build with the feature `cuda`, the fused CUDA kernels of
    /// [`cuda`] on CUDA devices when asked for (the HYLA mix; opt-in, [`cuda::FUSED_CUDA_ENV`] `=1`). The
    /// default: on other devices it is [`Ops::Fused`].
    #[default]
    Fast,
}

impl Ops {
    /// Whether the CPU kernels run on `x` (the CPU, float32, [`Ops::Fast`]).
    fn cpu_kernels(self, x: &Tensor) -> bool {
        self == Ops::Fast && fast::cpu_f32(x)
    }

    /// Whether the custom operations with hand-written gradients run on `x`.
    fn fused(self, x: &Tensor) -> bool {
        self != Ops::Reference && fast::fused_available(x)
    }

    /// `x W + b` over the last axis.
    ///
    /// # Shapes
    /// `x [..., in]`, `w [in, out]`, `b [out]` -> `[..., out]`.
    ///
    /// # Errors
    /// Candle errors on mismatched shapes.
    pub fn linear(self, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        if self.fused(x) {
            return fast::fused::linear(x, w, b, self.cpu_kernels(x));
        }
        reference::linear(self, x, w, b)
    }

    /// The per-head projection of attention: `y[b, h, t, :] = x[b, t] W[h] + bias[h]`.
    ///
    /// # Shapes
    /// `x [B, T, D]`, `w [H, D, d]`, `b [H, d]` -> `[B, H, T, d]` (contiguous).
    ///
    /// # Errors
    /// Candle errors on mismatched shapes.
    pub fn project_heads(self, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        if self.fused(x) {
            return fast::fused::project_heads(x, w, b, self.cpu_kernels(x));
        }
        reference::project_heads(self, x, w, b)
    }

    /// `x W + b` per model of a stack ([`crate::StackedTransformer`]). With the CPU kernels each
    /// model's product runs as its own [`Ops::linear`] (values and gradients exactly the single
    /// model's; a CPU saves nothing by batching); otherwise one batched product over the model
    /// axis ([`reference::linear_stacked`]), which a GPU launches once for all models.
    ///
    /// # Shapes
    /// `x [M, ..., in]`, `w [M, in, out]`, `b [M, out]` -> `[M, ..., out]`.
    ///
    /// # Errors
    /// Candle errors on mismatched shapes.
    pub fn linear_stacked(self, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        if self.cpu_kernels(x) {
            return fast::fused::stacked_linear(x, w, b, true);
        }
        reference::linear_stacked(x, w, b)
    }

    /// The per-head projection per model of a stack, as [`Ops::linear_stacked`] does
    /// [`Ops::linear`], with the model axis folded into the batch of the result.
    ///
    /// # Shapes
    /// `x [M, B, T, D]`, `w [M, H, D, d]`, `b [M, H, d]` -> `[M * B, H, T, d]` (contiguous).
    ///
    /// # Errors
    /// Candle errors on mismatched shapes.
    pub fn project_heads_stacked(self, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        if self.cpu_kernels(x) {
            return fast::fused::stacked_project_heads(x, w, b, true);
        }
        reference::project_heads_stacked(x, w, b)
    }

    /// LayerNorm per model of a stack, as [`Ops::linear_stacked`] does [`Ops::linear`]
    /// (otherwise the normalisation over the folded batch, then each model's scale and bias).
    ///
    /// # Shapes
    /// `x [M, ..., D]`, `w [M, D]`, `b [M, D]` -> `[M, ..., D]`.
    ///
    /// # Errors
    /// Candle errors on mismatched shapes.
    pub fn layer_norm_stacked(
        self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        eps: f64,
    ) -> Result<Tensor> {
        if self.cpu_kernels(x) {
            return fast::fused::stacked_layer_norm(x, w, b, eps, true);
        }
        reference::layer_norm_stacked(self, x, w, b, eps)
    }

    /// `x + b` with `b` broadcast over the leading axes of `x` (a bias over batch and tokens, a
    /// relative-position table over the batch).
    ///
    /// # Shapes
    /// `x [..., S...]`, `b` broadcastable to `x` (usually `[S...]`, the trailing shape) -> the
    /// shape of `x`.
    ///
    /// # Errors
    /// Candle errors on shapes that do not broadcast.
    pub fn add_leading(self, x: &Tensor, b: &Tensor) -> Result<Tensor> {
        if self == Ops::Fast {
            if let Some(y) = fast::broadcast::add_leading(x, b)? {
                return Ok(y);
            }
        }
        reference::add_leading(x, b)
    }

    /// `x * w` with `w` broadcast over the leading axes of `x` (a LayerNorm scale).
    ///
    /// # Shapes
    /// As [`Ops::add_leading`].
    ///
    /// # Errors
    /// Candle errors on shapes that do not broadcast.
    pub fn mul_leading(self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        if self == Ops::Fast {
            if let Some(y) = fast::broadcast::mul_leading(x, w)? {
                return Ok(y);
            }
        }
        reference::mul_leading(x, w)
    }

    /// LayerNorm over the last axis with scale `w`, bias `b` and `eps` under the square root
    /// (Ba et al. 2016; flax `LayerNorm`).
    ///
    /// # Shapes
    /// `x [..., D]`, `w [D]`, `b [D]` -> `[..., D]`.
    ///
    /// # Errors
    /// Candle errors on mismatched shapes.
    pub fn layer_norm(self, x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
        if self.fused(x) {
            return fast::fused::layer_norm(x, w, b, eps, self.cpu_kernels(x));
        }
        reference::layer_norm(self, x, w, b, eps)
    }

    /// The tanh approximation of GELU, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`
    /// (`jax.nn.gelu(approximate=True)`, the paper's MLP activation).
    ///
    /// # Shapes
    /// Any shape, elementwise.
    ///
    /// # Errors
    /// Candle errors.
    pub fn gelu_tanh(self, x: &Tensor) -> Result<Tensor> {
        if self == Ops::Fast {
            if let Some(y) = fast::broadcast::gelu_tanh(x)? {
                return Ok(y);
            }
        }
        reference::gelu_tanh(x)
    }

    /// The softmax over the last axis.
    ///
    /// # Shapes
    /// Any shape of rank >= 1.
    ///
    /// # Errors
    /// Candle errors.
    pub fn softmax_last_dim(self, x: &Tensor) -> Result<Tensor> {
        if self.fused(x) {
            return fast::fused::softmax_last_dim(x, self.cpu_kernels(x));
        }
        reference::softmax_last_dim(x)
    }

    /// RMSHead: `x / sqrt(mean_h x^2 + eps)` over axis 1, the heads (flax `RMSNorm` over heads,
    /// without scale; the paper's HYLA normalisation).
    ///
    /// # Shapes
    /// `x [B, H, rest...]` -> the shape of `x`.
    ///
    /// # Errors
    /// Candle errors (`x` of rank below 2).
    pub fn rms_over_heads(self, x: &Tensor, eps: f64) -> Result<Tensor> {
        if self == Ops::Fast && fast::cpu_device(x) {
            return fast::broadcast::rms_over_heads(x, eps);
        }
        reference::rms_over_heads(x, eps)
    }

    /// The second half of one multi-head mixing step: normalisation of the scaled scores into the
    /// latent codes, attention dropout, and the mixer's value network. The definition is
    /// [`reference::mix`]; its docs give the maths.
    ///
    /// # Shapes
    /// `scores [B, H, Q, K]` (scaled, with any position bias), `v [B, H, K, d]`, `mask` `u8`
    /// broadcastable to `[B, H, Q, K]` (1 = visible), `dropout` `f32` broadcastable to
    /// `[B, H, Q, K]`, or `[G, 1, Q, K]` with `G` dividing `B`: one mask per group of `B / G`
    /// consecutive problems (the per-model masks of a stacked batch,
    /// [`crate::stacked::StackedTransformer`]). Returns `(o [B, Q, H, d], attention [B, H, Q, K])`: the per-head output
    /// before the output projection, and the latent codes (before dropout).
    ///
    /// # Errors
    /// Candle errors on inconsistent shapes.
    pub fn mix(
        self,
        scores: &Tensor,
        v: &Tensor,
        mixer: Mixer,
        mask: Option<&Tensor>,
        dropout: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        if self.cpu_kernels(scores) || (self == Ops::Fast && cuda::available(scores)?) {
            // On the CPU: one pass over the (query, key) pairs, forward and backward; on CUDA the
            // same passes as one kernel each.
            if let Some(out) = fast::mix::mix(scores, v, mixer, mask, dropout)? {
                return Ok(out);
            }
        }
        let grouped;
        let dropout = match dropout {
            Some(d) => match group_dropout(d, scores.dims())? {
                Some(expanded) => {
                    grouped = expanded;
                    Some(&grouped)
                }
                None => Some(d),
            },
            None => None,
        };
        let tracked = scores.track_op() || v.track_op();
        if mixer.value_network().is_mlp() && tracked && self.fused(scores) {
            // Training: one graph node with a hand-written gradient.
            return fast::fused::mlp_value_mix(
                scores,
                v,
                mixer,
                mask,
                dropout,
                self.cpu_kernels(scores),
            );
        }
        reference::mix(self, scores, v, mixer, mask, dropout)
    }
}

/// Per-group dropout masks `[G, 1, Q, K]` (`1 < G < B`, `G` dividing `B`) expanded to the scores'
/// shape `[B, H, Q, K]` for the forms that broadcast (a same-shape product is a fast contiguous pass
/// on the CPU, where a broadcast over the middle axes is not); `None` for any other shape.
///
/// # Errors
/// Candle errors.
fn group_dropout(d: &Tensor, scores: &[usize]) -> Result<Option<Tensor>> {
    let &[b, h, q, k] = scores else {
        return Ok(None);
    };
    match d.dims() {
        &[g, 1, dq, dk] if g > 1 && g != b && b % g == 0 && (dq, dk) == (q, k) => Ok(Some(
            d.reshape((g, 1, 1, q, k))?
                .broadcast_as((g, b / g, h, q, k))?
                .contiguous()?
                .reshape((b, h, q, k))?,
        )),
        _ => Ok(None),
    }
}

#[cfg(test)]
pub(crate) mod test_util;
