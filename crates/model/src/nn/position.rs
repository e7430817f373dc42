//! Positions and masks of the attention layers: T5 relative-position buckets and their bias, the
//! causal mask (the one mask convention of the crate: `u8`, 1 = visible), and attention dropout.
//!
//! Source: `docs/spec/models.md` ("Relative position bias", "Training recipe"), read off the
//! paper's code (`position.py` of smonsays/hypernetwork-attention; the bucketing is T5X's
//! `RelativePositionBiases`).

use candle_core::{Device, Tensor};
use rand::Rng;

use crate::error::{ModelError, Result};

/// The T5 relative-position bucket of a (query, key) pair, unidirectional.
///
/// `n = max(q - k, 0)` (keys at or after the query fall into bucket 0); with
/// `max_exact = n_buckets / 2`, `n < max_exact` gives bucket `n`, otherwise
/// `max_exact + floor(ln(n / max_exact + eps) / ln(max_distance / max_exact) * (n_buckets - max_exact))`
/// capped at `n_buckets - 1`, with `max_distance = n_buckets` and the float32 `eps` of the reference.
/// Computed in float32 like the reference.
///
/// Source: `docs/spec/models.md`, "Relative position bias"; T5X `_relative_position_bucket`.
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
/// `docs/spec/models.md`, "Training recipe").
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
