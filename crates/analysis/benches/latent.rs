//! Criterion bench `latent`: the full latent-code analysis at the paper's scale, 51,200 problems in
//! each of the train (ID) and test (OOD) sets, 8 rule classes, codes [N, 2, 16, 1, 2] (32 features
//! per layer, 64 for all layers), plus every stage alone on the 51,200 x 64 all-layer matrix.
//!
//! Run: `cargo bench -p hyperlens-analysis --bench latent -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_main, Criterion};
use hyperlens_analysis::cluster::{cluster_against_labels, KMeansParams};
use hyperlens_analysis::decode::{decode, DecodeParams};
use hyperlens_analysis::pca::Pca;
use hyperlens_analysis::similarity::mean_code_similarity;
use hyperlens_analysis::{analyze_pair, CodeSet, LatentAnalysisParams};
use ndarray::{Array1, Array5};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const N: usize = 51_200;
const CLASSES: usize = 8;

/// Synthetic codes: every class has a prototype code per layer; samples are the prototype plus
/// Gaussian-like noise, less noisy in the deeper layer (the code becomes structured by rule).
fn synthetic(seed: u64, prototypes: &Array5<f32>) -> CodeSet {
    let (_, l, h, q, k) = prototypes.dim();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let label: Array1<i64> = (0..N).map(|_| rng.gen_range(0..CLASSES as i64)).collect();
    let codes = Array5::from_shape_fn((N, l, h, q, k), |(n, li, hi, qi, ki)| {
        let noise: f32 = (0..3).map(|_| rng.gen::<f32>() - 0.5).sum();
        let scale = if li == 0 { 1.5 } else { 0.6 };
        prototypes[[label[n] as usize, li, hi, qi, ki]] + scale * noise
    });
    match CodeSet::new(codes, label) {
        Ok(set) => set,
        Err(e) => panic!("synthetic codes: {e}"),
    }
}

fn bench(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let prototypes = Array5::from_shape_fn((CLASSES, 2, 16, 1, 2), |_| rng.gen::<f32>());
    let train = synthetic(1, &prototypes);
    let test = synthetic(2, &prototypes);
    let params = LatentAnalysisParams::default();

    let mut group = c.benchmark_group("latent");
    group.sample_size(10);
    group.bench_function("analyze_pair 2x51200 [2,16,1,2]", |b| {
        b.iter(|| {
            let report = analyze_pair(&train, &test, &params, &mut |_| {
                std::ops::ControlFlow::Continue(())
            });
            black_box(report.map(|r| r.layers.len()).unwrap_or(0))
        })
    });

    let (Ok(x_train), Ok(x_test)) = (train.features(None), test.features(None)) else {
        panic!("features");
    };
    let (y_train, y_test) = (train.label().view(), test.label().view());
    group.bench_function("pca 51200x64", |b| {
        b.iter(|| black_box(Pca::params(2).fit(x_test.view()).map(|p| p.n_samples())))
    });
    group.bench_function("decode 51200x64 (+shuffled control)", |b| {
        b.iter(|| {
            black_box(
                decode(
                    x_train.view(),
                    y_train,
                    x_test.view(),
                    y_test,
                    &DecodeParams::default(),
                )
                .map(|d| d.accuracy),
            )
        })
    });
    group.bench_function("kmeans+scores 51200x64", |b| {
        b.iter(|| {
            black_box(
                cluster_against_labels(x_test.view(), y_test, &KMeansParams::new(CLASSES))
                    .map(|r| r.ari),
            )
        })
    });
    group.bench_function("similarity 51200x64", |b| {
        b.iter(|| black_box(mean_code_similarity(x_test.view(), y_test, None).map(|s| s.counts)))
    });
    group.finish();
}

/// The criterion group (in a private module so the generated function needs no docs).
mod group {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
