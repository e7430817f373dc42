//! The HYLA value network with its normalisation and dropout ([`mlp_value_mix`]) as one graph node
//! with a hand-written gradient.

use candle_core::Tensor;

use super::super::{attach, Gradient};
use super::norm::softmax_backward;
use super::ops;
use crate::error::Result;
use crate::mixer::{Mixer, Normalisation};
use crate::ops::reference::{self, MlpValueNetwork, RMS_HEAD_EPS};

/// The mean over axis 1 (heads), kept as an axis of 1.
///
/// # Shapes
/// `x [B, H, rest...]` -> `[B, 1, rest...]`.
fn mean_over_heads(x: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    if cpu_kernels {
        return super::super::broadcast::mean_over_heads(x);
    }
    Ok(x.mean_keepdim(1)?)
}

/// Normalisation, attention dropout and the HYLA value network (`mlp_relu` / `mlp_linear`) as one
/// graph node with a hand-written gradient; the forward values are those of
/// [`crate::ops::reference::mix`], computed with the same candle operations on detached inputs.
///
/// With `a = normalise(s)` and `a' = a * dropout`: `hidden[b,j,i] = act(sum_h a'[b,h,i,j] v[b,h,j])`,
/// `o[b,i,h] = sum_j a'[b,h,i,j] hidden[b,i,j]` (`docs/spec/models.md`, "Value networks"). Backward,
/// from `go`: `g hidden = a'^T go`, `g a' = go hidden^T` from the second product; through the
/// activation (ReLU: where `hidden > 0`); `g a' += g hidden v^T`, `g v = a'^T g hidden` from the
/// first; `g a = g a' * dropout`; then the normalisation: RMSHead `a = m r`,
/// `r = (mean_h m^2 + eps)^(-1/2)`: `g m = r g a - m r^3 mean_h(g a * m)`; softmax:
/// `g m = a (g a - sum_k g a * a)`; none: `g m = g a`; and the mask (`g s = g m` where visible, 0
/// elsewhere). Every step is checked against candle's autodiff of the composed operations in this
/// module's tests and through the model's float64 and JAX gradient tests.
///
/// # Shapes
/// `s [B, H, Q, K]` (scaled scores with the position bias), `v [B, H, K, d]`, `mask` `u8 [Q, K]`
/// (1 = visible), `dropout` `f32` broadcastable to `[B, H, Q, K]`. Returns `(o [B, Q, H, d],
/// attention [B, H, Q, K])` as [`crate::ops::reference::mix`]; the attention is detached.
///
/// # Errors
/// Candle errors on inconsistent shapes.
pub(crate) fn mlp_value_mix(
    s: &Tensor,
    v: &Tensor,
    mixer: Mixer,
    mask: Option<&Tensor>,
    dropout: Option<&Tensor>,
    cpu_kernels: bool,
) -> Result<(Tensor, Tensor)> {
    let normalisation = mixer.normalisation();
    let relu = mixer.value_network() == crate::mixer::ValueNetwork::MlpRelu;
    let (s, v) = (s.contiguous()?, v.contiguous()?);
    let sd = s.detach();
    // The visibility mask as 0 / 1 floats, for the normalisations other than softmax (whose
    // gradient is already 0 at hidden pairs).
    let mask01 = match normalisation {
        Normalisation::Softmax => None,
        _ => mask.map(|m| m.to_dtype(sd.dtype())).transpose()?,
    };
    // The masked scores (0 where hidden).
    let masked = || -> Result<Tensor> {
        Ok(match &mask01 {
            Some(m01) => sd.broadcast_mul(m01)?,
            None => sd.clone(),
        })
    };
    // What each normalisation's gradient needs.
    let (attention, norm) = match normalisation {
        Normalisation::RmsHead => {
            let m = masked()?;
            let r = (mean_over_heads(&m.sqr()?, cpu_kernels)? + RMS_HEAD_EPS)?
                .sqrt()?
                .recip()?;
            (m.broadcast_mul(&r)?, NormGrad::RmsHead { m, r })
        }
        Normalisation::None => (masked()?, NormGrad::None),
        Normalisation::Softmax => {
            let a = reference::normalise(ops(cpu_kernels), &sd, normalisation, mask)?;
            (a.clone(), NormGrad::Softmax { a })
        }
    };
    let ad = match dropout {
        Some(d) => attention.broadcast_mul(d)?,
        None => attention.clone(),
    };
    let net = reference::mlp_value_network(&ad, &v.detach(), relu)?;
    if !(s.track_op() || v.track_op()) {
        return Ok((net.o, attention));
    }
    let o = net.o.clone();
    let node = MlpValueMixGrad {
        norm,
        relu,
        mask01,
        dropout: dropout.cloned(),
        net,
        cpu_kernels,
    };
    Ok((attach(&[&s, &v], o, node)?, attention))
}

/// What the gradient of a normalisation needs from the forward pass.
enum NormGrad {
    /// RMSHead: the masked scores `m [B, H, Q, K]` and `r = 1 / rms` over heads `[B, 1, Q, K]`.
    RmsHead {
        /// Masked scores.
        m: Tensor,
        /// `1 / sqrt(mean_h m^2 + eps)`.
        r: Tensor,
    },
    /// Softmax: the attention `a [B, H, Q, K]` (before dropout).
    Softmax {
        /// The softmax output.
        a: Tensor,
    },
    /// No normalisation.
    None,
}

/// The graph node of [`mlp_value_mix`]: the intermediates its gradient needs.
struct MlpValueMixGrad {
    /// The normalisation and what its gradient needs.
    norm: NormGrad,
    /// Whether the value network has the ReLU (`mlp_relu`).
    relu: bool,
    /// The visibility mask as 0 / 1 floats `[Q, K]` (none for softmax).
    mask01: Option<Tensor>,
    /// The dropout multiplier, broadcastable to `[B, H, Q, K]`.
    dropout: Option<Tensor>,
    /// The value network's products on the dropped-out attention, with the output.
    net: MlpValueNetwork,
    /// Whether the CPU kernels run.
    cpu_kernels: bool,
}

impl MlpValueMixGrad {
    /// The gradients of the scores and the values from that of the output (docs of
    /// [`mlp_value_mix`]).
    fn score_and_value_gradients(&self, go: &Tensor) -> Result<(Tensor, Tensor)> {
        let go = go.contiguous()?;
        let g_a_ihj = go.matmul(&self.net.hidden_ijd.t()?)?; // [B, Q, H, K]
        let g_hidden_ijd = self.net.a_ihj.t()?.matmul(&go)?; // [B, Q, K, d]
        let mut g_hidden = g_hidden_ijd.transpose(1, 2)?; // [B, K, Q, d]
        if self.relu {
            let on = self.net.hidden.gt(0f64)?.to_dtype(go.dtype())?;
            g_hidden = (g_hidden * on)?;
        }
        let g_hidden = g_hidden.contiguous()?;
        let g_a_jih = g_hidden.matmul(&self.net.v_jhd.t()?)?; // [B, K, Q, H]
        let g_v = self.net.a_jih.t()?.matmul(&g_hidden)?.transpose(1, 2)?; // [B, H, K, d]
        let g_ad = (g_a_ihj.transpose(1, 2)? + g_a_jih.permute((0, 3, 2, 1))?)?; // [B, H, Q, K]
        let g_a = match &self.dropout {
            Some(d) => g_ad.broadcast_mul(d)?,
            None => g_ad,
        };
        let g_s = match &self.norm {
            NormGrad::RmsHead { m, r } => {
                let dot = mean_over_heads(&(&g_a * m)?, self.cpu_kernels)?;
                let r3 = (r.sqr()? * r)?;
                mask_gradient(
                    (g_a.broadcast_mul(r)? - m.broadcast_mul(&(dot * r3)?)?)?,
                    self.mask01.as_ref(),
                )?
            }
            NormGrad::None => mask_gradient(g_a, self.mask01.as_ref())?,
            // Hidden pairs have a = 0, so the softmax gradient is already 0 there.
            NormGrad::Softmax { a } => softmax_backward(a, &g_a, self.cpu_kernels)?,
        };
        Ok((g_s, g_v))
    }
}

/// The gradient through the mask of the `none` / RMSHead normalisations: 0 at hidden pairs.
fn mask_gradient(g: Tensor, mask01: Option<&Tensor>) -> Result<Tensor> {
    Ok(match mask01 {
        Some(m01) => g.broadcast_mul(m01)?,
        None => g,
    })
}

impl Gradient for MlpValueMixGrad {
    const NAME: &'static str = "hyperlens-mlp-value-mix";

    fn gradients(&self, _: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (g_s, g_v) = self.score_and_value_gradients(g)?;
        Ok(vec![Some(g_s), Some(g_v)])
    }
}
