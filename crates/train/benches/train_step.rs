//! One training update of the paper's base SRAVEN model (4 layers, width 1, batch 128, HYLA and
//! softmax): draw the batch, forward with attention dropout, cross-entropy, backward, AdamW.
//! Run with `RAYON_NUM_THREADS=1` for a figure comparable across machines (one thread for candle's
//! matrix products and, through it, its elementwise operations; `CANDLE_NUM_THREADS` alone sets only
//! the elementwise ones).
//!
//! `batched_step` trains M = 1, 2, 4, 8 base models as one batched model (`hyperlens train
//! --seeds ...`, [`hyperlens_train::Updates`]: seeds 0..M, batch 128 each, dropout 0.1) and reports
//! its throughput in model-steps (criterion's elements): the time per model-step is the time per
//! iteration over M.
//!
//! Two more groups isolate the per-operation overhead that bounds a GPU step (each candle operation is
//! one kernel launch there): `adamw_update` times the optimiser alone on the base model's 74 parameter
//! tensors, and `overhead` runs a whole step of a micro model with the base model's architecture (same
//! layers, same operations) but D 16, H 2, D_mlp 16 and batch 4, so that its time is almost all
//! per-operation cost rather than arithmetic. Before timing, the bench prints how many candle tensors
//! one step of the base model creates in the forward pass, the backward pass and AdamW (each new
//! tensor is one operation; all but views are kernel launches on a GPU), for each form of the
//! operations (`hyperlens_model::Ops`: `Fast` is the CPU's default, `Fused` what a GPU runs,
//! `Reference` the plain candle maths).
#![allow(missing_docs)] // criterion_group! generates an undocumented function

use candle_core::Device;
use criterion::{criterion_group, criterion_main, Criterion};
use hyperlens_model::{Config, Mixer, Ops, Transformer};
use hyperlens_tasks::sraven::{Split, TrainStream};
use hyperlens_train::state::dropout_rng;
use hyperlens_train::{AdamW, AdamWParams, Task, TrainSettings, Updates};

/// The id the next candle tensor will get, read from a fresh tensor (ids count up from 1 per
/// process; `TensorId` exposes no number, only its `Debug` form `TensorId(n)`).
fn next_tensor_id() -> usize {
    let t = candle_core::Tensor::zeros(1, candle_core::DType::F32, &Device::Cpu).expect("zeros");
    let id = format!("{:?}", t.id());
    id.trim_start_matches("TensorId(")
        .trim_end_matches(')')
        .parse()
        .expect("TensorId(n)")
}

/// Prints the tensors created per phase of one base-model training step, for each form of the
/// operations.
fn print_operations_per_step(split: &Split) {
    for ops in [Ops::Fast, Ops::Fused, Ops::Reference] {
        {
            for mixer in [Mixer::Hyla, Mixer::Softmax] {
                let (model, mut opt) = model_and_optimiser(&Config::sraven_base(mixer));
                let model = model.with_ops(ops);
                let problems = TrainStream::at(split, 0, 0).next_batch(128);
                let mut rng = dropout_rng(0, 0);
                // Each probe tensor takes one id itself, hence the `- 1`s.
                let a = next_tensor_id();
                let bl = hyperlens_train::sraven::batch_loss(&model, &problems, 0.1, &mut rng)
                    .expect("loss");
                let b = next_tensor_id();
                let grads = bl.loss.backward().expect("backward");
                let c = next_tensor_id();
                opt.step(&grads, 1e-4).expect("update");
                let d = next_tensor_id();
                eprintln!(
                    "operations per step, base {mixer}, {ops:?}: forward {}, backward {}, AdamW {}",
                    b - a - 1,
                    c - b - 1,
                    d - c - 1
                );
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let split = Split::named("paper-seed0").expect("the embedded paper split");
    print_operations_per_step(&split);
    let mut group = c.benchmark_group("train_step");
    group.sample_size(10);
    for mixer in [Mixer::Hyla, Mixer::Softmax] {
        let cfg = Config::sraven_base(mixer);
        let (model, mut opt) = model_and_optimiser(&cfg);
        let mut step = 0u64;
        group.bench_function(format!("base_{mixer}_batch128"), |b| {
            b.iter(|| {
                train_update(&model, &mut opt, &split, step, 128);
                step += 1;
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("batched_step");
    group.sample_size(10);
    for mixer in [Mixer::Hyla, Mixer::Softmax] {
        for m in [1u64, 2, 4, 8] {
            let settings: Vec<TrainSettings> = (0..m)
                .map(|seed| {
                    let mut s = TrainSettings::for_task(Task::Sraven);
                    s.mixer = mixer;
                    s.seed = seed;
                    s
                })
                .collect();
            let mut updates =
                Updates::fresh(&settings, hyperlens_model::Device::Cpu).expect("models");
            let mut step = 0u64;
            group.throughput(criterion::Throughput::Elements(m));
            group.bench_function(format!("base_{mixer}_models_{m}"), |b| {
                b.iter(|| {
                    updates.apply(step).expect("update");
                    step += 1;
                })
            });
        }
    }
    group.finish();

    let mut group = c.benchmark_group("adamw_update");
    group.sample_size(20);
    let cfg = Config::sraven_base(Mixer::Hyla);
    let (model, mut opt) = model_and_optimiser(&cfg);
    let problems = TrainStream::at(&split, 0, 0).next_batch(128);
    let mut rng = dropout_rng(0, 0);
    let bl = hyperlens_train::sraven::batch_loss(&model, &problems, 0.1, &mut rng).expect("loss");
    let grads = bl.loss.backward().expect("backward");
    group.bench_function("base_hyla_params", |b| {
        b.iter(|| opt.step(&grads, 1e-4).expect("update"))
    });
    group.finish();

    let mut group = c.benchmark_group("overhead");
    group.sample_size(20);
    for mixer in [Mixer::Hyla, Mixer::Softmax] {
        let cfg = Config {
            d_model: 16,
            n_heads: 2,
            d_mlp: 16,
            ..Config::sraven_base(mixer)
        };
        let (model, mut opt) = model_and_optimiser(&cfg);
        let mut step = 0u64;
        group.bench_function(format!("micro_{mixer}_step"), |b| {
            b.iter(|| {
                train_update(&model, &mut opt, &split, step, 4);
                step += 1;
            })
        });
    }
    group.finish();
}

/// A freshly initialised model (seed 0, CPU) and its AdamW.
fn model_and_optimiser(cfg: &Config) -> (Transformer, AdamW) {
    let (model, varmap) = Transformer::init(cfg, 0, &Device::Cpu).expect("init");
    let opt = AdamW::new(named_vars(&varmap), AdamWParams::default()).expect("optimiser");
    (model, opt)
}

/// One training update: draw batch `step`, forward with attention dropout, backward, AdamW.
fn train_update(model: &Transformer, opt: &mut AdamW, split: &Split, step: u64, batch: usize) {
    let problems = TrainStream::at(split, 0, step).next_batch(batch);
    let mut rng = dropout_rng(0, step);
    let bl = hyperlens_train::sraven::batch_loss(model, &problems, 0.1, &mut rng).expect("loss");
    let grads = bl.loss.backward().expect("backward");
    opt.step(&grads, 1e-4).expect("update");
}

fn named_vars(varmap: &candle_nn::VarMap) -> Vec<(String, candle_core::Var)> {
    varmap
        .data()
        .lock()
        .expect("lock")
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

criterion_group!(benches, bench);
criterion_main!(benches);
