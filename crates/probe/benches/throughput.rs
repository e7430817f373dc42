//! Criterion bench `throughput`: problems/s of latent-code extraction (`hyperlens probe`) with the
//! base SRAVEN model (4 layers, width 1: D 128, 16 heads) on the CPU, paper site, batch 256, into
//! an `.npz` in a temporary directory. Two variants per mixer: `extract` (problems generated
//! beforehand, so only the forward passes, the gather and the streaming writer are timed) and
//! `stream` (problems generated batch by batch, as the CLI does).
//!
//! Run: `RAYON_NUM_THREADS=1 cargo bench -p hyperlens-probe --bench throughput -- --sample-size 10`
//! (one thread for both candle's matrix products and, through it, its elementwise operations;
//! `CANDLE_NUM_THREADS` alone sets only the elementwise ones).

// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use candle_core::Device;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hyperlens_model::{Config, Mixer, Transformer};
use hyperlens_probe::{extract, ProbeMeta, ProbeParams, Site};
use hyperlens_tasks::sraven::{sample, SampleStream, Set, Split};

const N: usize = 1024;
const BATCH: usize = 256;

fn bench_probe(c: &mut Criterion) {
    let split = Split::named("paper-seed1").expect("split");
    let problems = sample(&split, Set::Ood, N, 0, true).expect("problems");
    let dir = tempfile::tempdir().expect("temporary directory");
    let out = dir.path().join("codes.npz");
    let params = ProbeParams {
        site: Site::Paper,
        layers: None,
    };
    let mut group = c.benchmark_group("probe");
    group.throughput(Throughput::Elements(N as u64));
    group.sample_size(10);
    for mixer in [Mixer::Softmax, Mixer::Hyla] {
        let (model, _) =
            Transformer::init(&Config::sraven_base(mixer), 0, &Device::Cpu).expect("init");
        let model = hyperlens_model::Evaluator::new(model).expect("evaluator");
        group.bench_function(format!("{mixer}/extract/n{N}/batch{BATCH}"), |b| {
            b.iter(|| {
                let batches = (0..N)
                    .step_by(BATCH)
                    .map(|s| Ok(problems.slice(s, (s + BATCH).min(N))));
                extract(
                    &model,
                    batches,
                    N,
                    &params,
                    &out,
                    ProbeMeta::default(),
                    |_| std::ops::ControlFlow::Continue(()),
                )
                .expect("extract")
            });
        });
        group.bench_function(format!("{mixer}/stream/n{N}/batch{BATCH}"), |b| {
            b.iter(|| {
                let batches = SampleStream::new(&split, Set::Ood, 0, true)
                    .expect("stream")
                    .batches(N, BATCH)
                    .map(|r| r.map_err(Into::into));
                extract(
                    &model,
                    batches,
                    N,
                    &params,
                    &out,
                    ProbeMeta::default(),
                    |_| std::ops::ControlFlow::Continue(()),
                )
                .expect("extract")
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_probe);
criterion_main!(benches);
