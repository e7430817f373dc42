//! One training update of the paper's base SRAVEN model (4 layers, width 1, batch 128, HYLA and
//! softmax): draw the batch, forward with attention dropout, cross-entropy, backward, AdamW.
//! Run with `CANDLE_NUM_THREADS=1` for a figure comparable across machines.
#![allow(missing_docs)] // criterion_group! generates an undocumented function

use candle_core::Device;
use criterion::{criterion_group, criterion_main, Criterion};
use hyperlens_model::{Config, Mixer, Transformer};
use hyperlens_tasks::sraven::{Split, TrainStream};
use hyperlens_train::state::dropout_rng;
use hyperlens_train::{AdamW, AdamWParams};

fn bench(c: &mut Criterion) {
    let split = Split::named("paper-seed0").expect("the embedded paper split");
    let mut group = c.benchmark_group("train_step");
    group.sample_size(10);
    for mixer in [Mixer::Hyla, Mixer::Softmax] {
        let cfg = Config::sraven_base(mixer);
        let (model, varmap) = Transformer::init(&cfg, 0, &Device::Cpu).expect("init");
        let vars = varmap
            .data()
            .lock()
            .expect("lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut opt = AdamW::new(vars, AdamWParams::default()).expect("optimiser");
        let mut step = 0u64;
        group.bench_function(format!("base_{mixer}_batch128"), |b| {
            b.iter(|| {
                let problems = TrainStream::at(&split, 0, step).next_batch(128);
                let mut rng = dropout_rng(0, step);
                let bl = hyperlens_train::sraven::batch_loss(&model, &problems, 0.1, &mut rng)
                    .expect("loss");
                let grads = bl.loss.backward().expect("backward");
                opt.step(&grads, 1e-4).expect("update");
                step += 1;
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
