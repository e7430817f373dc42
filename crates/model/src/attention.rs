//! The mixer maths, reusable by every model of the workspace: T5 relative-position buckets, the three
//! attention normalisations, attention dropout, and the default / HYLA value networks.
//!
//! Source: `spec/models.md` ("Relative position bias", "Scores and the three normalisations",
//! "Value networks"), read off the paper's code (`hyla/models/attention.py`, `position.py` of
//! `smonsays/hypernetwork-attention`; the bucketing is T5X's `RelativePositionBiases`).

use candle_core::{Device, Tensor};
use rand::Rng;

use crate::error::{ModelError, Result};
use crate::mixer::{Mixer, Normalisation, ValueNetwork};

/// Epsilon of the RMSHead normalisation (flax `RMSNorm` default).
pub const RMS_HEAD_EPS: f64 = 1e-6;

/// The T5 relative-position bucket of a (query, key) pair, unidirectional.
///
/// `n = max(q - k, 0)` (keys at or after the query fall into bucket 0); with
/// `max_exact = n_buckets / 2`, `n < max_exact` gives bucket `n`, otherwise
/// `max_exact + floor(ln(n / max_exact + eps) / ln(max_distance / max_exact) * (n_buckets - max_exact))`
/// capped at `n_buckets - 1`, with `max_distance = n_buckets` and the float32 `eps` of the reference.
/// Computed in float32 like the reference.
///
/// Source: `spec/models.md`, "Relative position bias"; T5X `_relative_position_bucket`.
/// `n_buckets` must be at least 2 ([`crate::Config::check`] ensures it).
pub fn relative_position_bucket(query: usize, key: usize, n_buckets: usize) -> usize {
    let n = query.saturating_sub(key);
    let max_exact = (n_buckets / 2).max(1);
    if n < max_exact {
        return n;
    }
    let max_distance = n_buckets as f32;
    let ratio = (n as f32 / max_exact as f32 + f32::EPSILON).ln();
    let scale = (max_distance / max_exact as f32).ln();
    let large = max_exact + (ratio / scale * (n_buckets - max_exact) as f32) as usize;
    large.min(n_buckets - 1)
}

/// The bucket index of every (query, key) pair, row-major.
///
/// # Shapes
/// Returns a `u32` tensor `[n_query, n_key]` on `device`.
///
/// # Errors
/// Candle errors (allocation on the device).
pub fn bucket_matrix(
    n_query: usize,
    n_key: usize,
    n_buckets: usize,
    device: &Device,
) -> Result<Tensor> {
    let v: Vec<u32> = (0..n_query)
        .flat_map(|q| (0..n_key).map(move |k| relative_position_bucket(q, k, n_buckets) as u32))
        .collect();
    Ok(Tensor::from_vec(v, (n_query, n_key), device)?)
}

/// The relative-position bias of one layer: `bias[h, q, k] = table[h, bucket(q, k)]`.
///
/// # Shapes
/// `table [H, n_buckets]`, `buckets` a `u32 [Q, K]` from [`bucket_matrix`]; returns `[H, Q, K]`.
/// Differentiable in `table`.
///
/// # Errors
/// Candle errors (shape mismatch, bucket out of range).
pub fn relative_position_bias(table: &Tensor, buckets: &Tensor) -> Result<Tensor> {
    let (h, _) = table.dims2()?;
    let (q, k) = buckets.dims2()?;
    let flat = buckets.flatten_all()?;
    Ok(table.index_select(&flat, 1)?.reshape((h, q, k))?)
}

/// A causal mask: 1 where the key is at or before the query, 0 after.
///
/// # Shapes
/// Returns `u8 [T, T]` (broadcastable to `[batch, head, query, key]`).
///
/// # Errors
/// Candle errors.
pub fn causal_mask(n_tokens: usize, device: &Device) -> Result<Tensor> {
    let v: Vec<u8> = (0..n_tokens)
        .flat_map(|q| (0..n_tokens).map(move |k| u8::from(k <= q)))
        .collect();
    Ok(Tensor::from_vec(v, (n_tokens, n_tokens), device)?)
}

/// An attention-dropout multiplier: one Bernoulli keep mask over (query, key) shared by the whole
/// batch and every head, scaled by `1 / (1 - p)` (flax `broadcast_dropout=True`,
/// `spec/models.md`, "Training recipe").
///
/// # Shapes
/// Returns `f32 [1, 1, Q, K]`.
///
/// # Errors
/// [`ModelError::Input`] if `p` is not in `[0, 1)`; candle errors.
pub fn dropout_mask<R: Rng + ?Sized>(
    n_query: usize,
    n_key: usize,
    p: f64,
    rng: &mut R,
    device: &Device,
) -> Result<Tensor> {
    if !(0.0..1.0).contains(&p) {
        return Err(ModelError::Input(format!(
            "attention dropout rate must be in [0, 1), got {p}"
        )));
    }
    let keep = 1.0 - p;
    let scale = (1.0 / keep) as f32;
    let v: Vec<f32> = (0..n_query * n_key)
        .map(|_| if rng.gen::<f64>() < keep { scale } else { 0.0 })
        .collect();
    Ok(Tensor::from_vec(v, (1, 1, n_query, n_key), device)?)
}

/// Normalises the scaled scores into the latent codes.
///
/// With a mask, masked pairs get `f32::MIN` before the softmax (weight 0 after it) or 0 before
/// the `none` / RMSHead normalisations, as in the reference.
///
/// # Shapes
/// `scores [B, H, Q, K]`; `mask` a `u8` tensor broadcastable to `[B, H, Q, K]`, 1 = visible;
/// returns `[B, H, Q, K]`.
///
/// # Errors
/// Candle errors (shape mismatch).
pub fn normalise(
    scores: &Tensor,
    normalisation: Normalisation,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let masked = |fill: f32| -> Result<Tensor> {
        match mask {
            None => Ok(scores.clone()),
            Some(m) => {
                let m = m.broadcast_as(scores.shape())?;
                let fill = Tensor::full(fill, scores.shape(), scores.device())?
                    .to_dtype(scores.dtype())?;
                Ok(m.where_cond(scores, &fill)?)
            }
        }
    };
    Ok(match normalisation {
        Normalisation::Softmax => crate::fused::softmax_last_dim(&masked(f32::MIN)?)?,
        Normalisation::None => masked(0.0)?,
        Normalisation::RmsHead => crate::fastpath::rms_over_heads(&masked(0.0)?, RMS_HEAD_EPS)?,
    })
}

/// One multi-head sequence-mixing step: scores, bias, normalisation, dropout, value network.
///
/// `s[b,h,i,j] = q[b,h,i] . k[b,h,j] / sqrt(d) + bias[h,i,j]`; `a = normalise(s)`; with dropout
/// `a' = a * dropout` is used by the value network; then
/// - default: `o[b,i,h] = sum_j a'[b,h,i,j] v[b,h,j]`,
/// - `mlp_relu` (HYLA): `hidden[b,i,j] = ReLU(sum_h a'[b,h,i,j] v[b,h,j])`,
///   `o[b,i,h] = sum_j a'[b,h,i,j] hidden[b,i,j]`,
/// - `mlp_linear`: the same without the ReLU.
///
/// Source: `spec/models.md`; the paper's `DotProductAttention` / `MultiHeadDotProductAttention`.
///
/// # Shapes
/// `q [B, H, Q, d]`, `k [B, H, K, d]`, `v [B, H, K, d]`; `bias` broadcastable to `[B, H, Q, K]`
/// (e.g. `[H, Q, K]` from [`relative_position_bias`]); `mask` `u8` broadcastable to `[B, H, Q, K]`
/// (1 = visible, e.g. [`causal_mask`]); `dropout` `f32` broadcastable to `[B, H, Q, K]` (e.g.
/// [`dropout_mask`]). Returns `(o [B, Q, H, d], attention [B, H, Q, K])`: the per-head output
/// before the output projection, and the normalised attention (the latent codes) before dropout.
///
/// # Errors
/// Candle errors on inconsistent shapes.
pub fn mix(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    mask: Option<&Tensor>,
    mixer: Mixer,
    dropout: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let (_, _, _, d) = q.dims4()?;
    let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
    let scores = match bias {
        Some(b) => crate::fastpath::add_leading(&scores, b)?,
        None => scores,
    };
    // On the CPU: one pass over the (query, key) pairs, forward and backward.
    if let Some(out) = crate::mix_kernel::mix(
        &scores,
        v,
        mixer.normalisation(),
        mixer.value_network(),
        mask,
        dropout,
    )? {
        return Ok(out);
    }
    let mlp = matches!(
        mixer.value_network(),
        ValueNetwork::MlpRelu | ValueNetwork::MlpLinear
    );
    if mlp && (scores.track_op() || v.track_op()) && crate::fused::available(&scores) {
        // Training: one graph node with a hand-written gradient; the same function (to float32
        // rounding: RMSHead multiplies by 1 / rms there).
        return crate::fused::mlp_value_mix(
            &scores,
            v,
            mixer.normalisation(),
            mixer.value_network() == ValueNetwork::MlpRelu,
            mask,
            dropout,
        );
    }
    normalise_and_mix(&scores, v, mixer, mask, dropout)
}

/// The second half of [`mix`] as composed candle operations (differentiated by candle's autodiff):
/// normalisation, dropout and the value network.
///
/// # Shapes
/// `scores [B, H, Q, K]` (scaled, with the bias) and the rest as [`mix`].
///
/// # Errors
/// Candle errors on inconsistent shapes.
pub(crate) fn normalise_and_mix(
    scores: &Tensor,
    v: &Tensor,
    mixer: Mixer,
    mask: Option<&Tensor>,
    dropout: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let attention = normalise(scores, mixer.normalisation(), mask)?;
    let a = match dropout {
        Some(m) => attention.broadcast_mul(m)?,
        None => attention.clone(),
    };
    let o = match mixer.value_network() {
        ValueNetwork::Default => a.matmul(&v.contiguous()?)?.transpose(1, 2)?.contiguous()?,
        ValueNetwork::MlpRelu | ValueNetwork::MlpLinear => {
            mlp_value_network(&a, v, mixer.value_network() == ValueNetwork::MlpRelu)?.o
        }
    };
    Ok((o, attention))
}

/// The HYLA value network's products and the intermediates their gradients need.
pub(crate) struct MlpValueNetwork {
    /// `a` as `[B, K, Q, H]`.
    pub a_jih: Tensor,
    /// `v` as `[B, K, H, d]`.
    pub v_jhd: Tensor,
    /// The hidden units `[B, K, Q, d]`, after the activation.
    pub hidden: Tensor,
    /// The hidden units as `[B, Q, K, d]`.
    pub hidden_ijd: Tensor,
    /// `a` as `[B, Q, H, K]`.
    pub a_ihj: Tensor,
    /// The output `[B, Q, H, d]`.
    pub o: Tensor,
}

/// The `mlp_relu` (`relu`) / `mlp_linear` value network on attention `a` (after dropout):
/// `hidden[b,j,i] = act(sum_h a[b,h,i,j] v[b,h,j])`, `o[b,i,h] = sum_j a[b,h,i,j] hidden[b,i,j]`.
///
/// # Shapes
/// `a [B, H, Q, K]`, `v [B, H, K, d]`; see [`MlpValueNetwork`].
///
/// # Errors
/// Candle errors on inconsistent shapes.
pub(crate) fn mlp_value_network(a: &Tensor, v: &Tensor, relu: bool) -> Result<MlpValueNetwork> {
    // hidden[b, j, i, :] = sum_h a[b, h, i, j] v[b, h, j, :]: batch over (b, j).
    let a_jih = a.permute((0, 3, 2, 1))?.contiguous()?;
    let v_jhd = v.transpose(1, 2)?.contiguous()?;
    let hidden = a_jih.matmul(&v_jhd)?;
    let hidden = if relu { hidden.relu()? } else { hidden };
    // o[b, i, h, :] = sum_j a[b, h, i, j] hidden[b, i, j, :]: batch over (b, i).
    let hidden_ijd = hidden.transpose(1, 2)?.contiguous()?;
    let a_ihj = a.transpose(1, 2)?.contiguous()?;
    let o = a_ihj.matmul(&hidden_ijd)?;
    Ok(MlpValueNetwork {
        a_jih,
        v_jhd,
        hidden,
        hidden_ijd,
        a_ihj,
        o,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_row_of_the_spec() {
        let expect = [
            35, 34, 33, 32, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 20, 19, 18, 17, 16, 15, 14,
            13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0,
        ];
        let row: Vec<usize> = (0..36)
            .map(|k| relative_position_bucket(35, k, 36))
            .collect();
        assert_eq!(row, expect);
        // keys at or after the query are bucket 0
        assert_eq!(relative_position_bucket(3, 10, 36), 0);
        let m = bucket_matrix(36, 36, 36, &Device::Cpu).unwrap();
        let m: Vec<Vec<u32>> = m.to_vec2().unwrap();
        assert_eq!(
            m[35].iter().map(|&b| b as usize).collect::<Vec<_>>(),
            expect
        );
    }

    #[test]
    fn dropout_mask_scales_and_rejects_bad_rate() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let m = dropout_mask(37, 41, 0.25, &mut rng, &Device::Cpu).unwrap();
        assert_eq!(m.dims(), &[1, 1, 37, 41]);
        let v: Vec<f32> = m.flatten_all().unwrap().to_vec1().unwrap();
        let kept = v.iter().filter(|&&x| x != 0.0).count() as f64 / v.len() as f64;
        assert!((kept - 0.75).abs() < 0.04, "{kept}");
        assert!(v.iter().all(|&x| x == 0.0 || (x - 1.0 / 0.75).abs() < 1e-6));
        assert!(dropout_mask(2, 2, 1.0, &mut rng, &Device::Cpu).is_err());
    }
}
