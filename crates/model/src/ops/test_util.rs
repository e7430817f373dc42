//! Helpers shared by the unit tests of the fast forms.

use candle_core::{Device, Tensor, Var};

/// Random inputs of one mix for the gradient tests of the fused value network and the mix kernel: a causal mask
/// `[t, t]`, a dropout multiplier (rate 0.3, from `seed`), scores `[b, h, t, t]` and values
/// `[b, h, t, d]` as variables, and a cotangent of the output `[b, t, h, d]`.
pub(crate) fn mix_inputs(
    (b, h, t, d): (usize, usize, usize, usize),
    seed: u64,
) -> (Tensor, Tensor, Var, Var, Tensor) {
    use rand::SeedableRng;
    let dev = Device::Cpu;
    let mask = crate::nn::position::causal_mask(t, &dev).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let drop = crate::nn::position::dropout_mask(t, t, 0.3, &mut rng, &dev).unwrap();
    let s = Var::randn(0f32, 1.0, (b, h, t, t), &dev).unwrap();
    let v = Var::randn(0f32, 1.0, (b, h, t, d), &dev).unwrap();
    let c = Tensor::randn(0f32, 1.0, (b, t, h, d), &dev).unwrap();
    (mask, drop, s, v, c)
}

/// The bits of a float32 tensor's values, for bitwise comparisons.
pub(crate) fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    v.into_iter().map(f32::to_bits).collect()
}

/// Asserts `|a - b| <= tol (1 + |b|)` elementwise (compared in float64).
pub(crate) fn close(a: &Tensor, b: &Tensor, tol: f64) {
    let values = |t: &Tensor| -> Vec<f64> {
        t.flatten_all()
            .unwrap()
            .to_dtype(candle_core::DType::F64)
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let (a, b) = (values(a), values(b));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{x} vs {y}");
    }
}

/// A random model input `[b, T, d_in]` for `cfg`, uniform in [-1, 1), seeded.
pub(crate) fn random_input(cfg: &crate::Config, b: usize, seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let v: Vec<f32> = (0..b * cfg.n_tokens * cfg.d_in)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    Tensor::from_vec(v, (b, cfg.n_tokens, cfg.d_in), &Device::Cpu).unwrap()
}

/// A small model whose every weight (biases, LayerNorm scales and position tables included)
/// is drawn at random, so that no term of the forward pass is zero or one by construction.
pub(crate) fn random_model(
    mixer: crate::Mixer,
    causal: bool,
    seed: u64,
) -> crate::transformer::Transformer {
    let cfg = crate::config::Config {
        d_in: 5,
        n_tokens: 9,
        n_outputs: 3,
        d_model: 24,
        n_heads: 3,
        d_head: 4,
        n_layers: 3,
        d_mlp: 20,
        d_out: 6,
        n_buckets: 7,
        causal,
        mixer,
    };
    let tensors = crate::nn::params::seeded_tensors(
        cfg.tensor_shapes(),
        seed,
        |_| crate::nn::InitRule::Normal(0.5),
        &Device::Cpu,
    )
    .unwrap();
    crate::transformer::Transformer::from_tensors(&cfg, tensors.into_iter().collect(), &Device::Cpu)
        .unwrap()
}
