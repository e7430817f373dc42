//! Criterion bench `forward`: problems/s of the base SRAVEN model (4 layers, width 1) at batch 128
//! on the CPU, with and without capturing the attention (latent codes), for softmax and HYLA.
//!
//! Group `broadcast_backward`: the sum over rows that the backward pass of a bias broadcast over
//! batch and tokens computes (`[4608, 128]` = batch 128 x 36 tokens x D), as candle's native
//! reduction over axis 0 and as the product with a row of ones that `hyperlens_model::broadcast`
//! makes the backward pass use on the CPU.
//!
//! Group `mix`: one HYLA mix of the base model's attention (`[128, 16, 36, 4]` queries, keys and
//! values, the relative-position bias, attention dropout), forward and backward, by the CPU kernel
//! of the fast paths and by the candle operations that other devices run.

// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hyperlens_model::{Config, Mixer, Ops, Transformer};
use rand::{Rng, SeedableRng};

const BATCH: usize = 128;

/// Random one-hot SRAVEN-shaped inputs `[B, 36, 8]` with zero query tokens.
fn inputs(cfg: &Config) -> Tensor {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let (t, m) = (cfg.n_tokens, cfg.d_in);
    let mut v = vec![0f32; BATCH * t * m];
    for b in 0..BATCH {
        for tok in 0..t - cfg.n_outputs {
            v[(b * t + tok) * m + rng.gen_range(0..m)] = 1.0;
        }
    }
    Tensor::from_vec(v, (BATCH, t, m), &Device::Cpu).expect("bench input")
}

fn bench_forward(c: &mut Criterion) {
    let mut group = c.benchmark_group("forward");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(10);
    for mixer in [Mixer::Softmax, Mixer::Hyla] {
        let cfg = Config::sraven_base(mixer);
        let (model, _) = Transformer::init(&cfg, 0, &Device::Cpu).expect("init");
        let x = inputs(&cfg);
        for capture in [false, true] {
            let name = format!(
                "{mixer}/batch{BATCH}/{}",
                if capture { "capture" } else { "no-capture" }
            );
            group.bench_function(name, |b| {
                b.iter(|| model.forward(&x, capture).expect("forward"));
            });
        }
    }
    group.finish();
}

fn bench_cpu_fast_paths(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_fast_paths");
    let dev = Device::Cpu;
    let grad = Tensor::randn(0f32, 1.0, (BATCH * 36, 128), &dev).expect("gradient");
    let ones = Tensor::ones((1, BATCH * 36), candle_core::DType::F32, &dev).expect("ones");
    group.bench_function("row_sum_native_4608x128", |b| {
        b.iter(|| grad.sum_keepdim(0).expect("sum"))
    });
    group.bench_function("row_sum_product_4608x128", |b| {
        b.iter(|| ones.matmul(&grad).expect("product"))
    });
    let x = candle_core::Var::randn(0f32, 1.0, (BATCH * 36, 256), &dev).expect("x");
    for (name, sigmoid) in [
        ("gelu_candle_4608x256", false),
        ("gelu_sigmoid_4608x256", true),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let ops = if sigmoid { Ops::Fast } else { Ops::Reference };
                let y = ops.gelu_tanh(x.as_tensor()).expect("gelu");
                y.sum_all().expect("sum").backward().expect("backward")
            })
        });
    }
    group.finish();
}

fn bench_mix(c: &mut Criterion) {
    use candle_core::Var;
    use hyperlens_model::nn::position::dropout_mask;
    let mut group = c.benchmark_group("mix");
    group.sample_size(10);
    let dev = Device::Cpu;
    let (h, t, d) = (16, 36, 4);
    let var = || Var::randn(0f32, 1.0, (BATCH, h, t, d), &dev).expect("input");
    let (q, k, v) = (var(), var(), var());
    let bias = Tensor::randn(0f32, 0.1, (h, t, t), &dev).expect("bias");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let drop = dropout_mask(t, t, 0.1, &mut rng, &dev).expect("dropout");
    let c_out = Tensor::randn(0f32, 1.0, (BATCH, t, h, d), &dev).expect("cotangent");
    for (name, ops) in [("hyla/kernel", Ops::Fast), ("hyla/candle_ops", Ops::Fused)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let scores = q
                    .as_tensor()
                    .matmul(&k.as_tensor().t().expect("t"))
                    .and_then(|s| s / (d as f64).sqrt())
                    .expect("scores");
                let scores = ops.add_leading(&scores, &bias).expect("bias");
                let (o, _) = ops
                    .mix(&scores, v.as_tensor(), Mixer::Hyla, None, Some(&drop))
                    .expect("mix");
                (o * &c_out)
                    .and_then(|l| l.sum_all())
                    .and_then(|l| l.backward())
                    .expect("backward")
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_forward, bench_cpu_fast_paths, bench_mix);
criterion_main!(benches);
