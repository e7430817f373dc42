//! Criterion bench `circuits`: Q, K and V composition scores of all head pairs for a model of
//! SmolLM2-135M's shape (30 layers, 9 query heads with 3 K/V heads expanded, D 576, d 64) on random
//! f32 weights, with the working-memory estimate and the process's peak resident memory.
//!
//! `cargo bench -p hyperlens-analysis --bench circuits -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_main, Criterion};
use hyperlens_analysis::circuits::{
    composition_memory_bytes, composition_scores, expand_kv_heads, AttnWeights, CompositionMethod,
    CompositionParams,
};
use ndarray::Array4;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const LAYERS: usize = 30;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const D_MODEL: usize = 576;
const D_HEAD: usize = 64;

fn smollm2_shaped_weights() -> AttnWeights<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(135);
    let mut rand4 = |shape: (usize, usize, usize, usize)| {
        Array4::<f32>::from_shape_simple_fn(shape, || rng.gen_range(-0.05f32..0.05))
    };
    let w_q = rand4((LAYERS, HEADS, D_MODEL, D_HEAD));
    let w_k = rand4((LAYERS, KV_HEADS, D_MODEL, D_HEAD));
    let w_v = rand4((LAYERS, KV_HEADS, D_MODEL, D_HEAD));
    let w_o = rand4((LAYERS, HEADS, D_HEAD, D_MODEL));
    let w_k = expand_kv_heads(&w_k, HEADS).expect("expand K heads");
    let w_v = expand_kv_heads(&w_v, HEADS).expect("expand V heads");
    AttnWeights::new(w_q, w_k, w_v, w_o).expect("weights")
}

/// Peak resident set size of this process in MiB (Linux `VmHWM`), if available.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn bench_composition(c: &mut Criterion) {
    let w = smollm2_shaped_weights();
    let params = CompositionParams {
        method: CompositionMethod::Gram,
        ..Default::default()
    };
    let weights_mib = 4.0 * (LAYERS * HEADS * D_MODEL * D_HEAD * 4) as f64 / 1048576.0;
    let est = composition_memory_bytes(&w, &params).expect("estimate") as f64 / 1048576.0;
    let before = peak_rss_mib();
    let scores = composition_scores(&w, &params).expect("composition scores");
    let after = peak_rss_mib();
    let q = scores.q.as_ref().expect("q");
    eprintln!(
        "composition (L {LAYERS}, H {HEADS}, D {D_MODEL}, d {D_HEAD}): f32 weights {weights_mib:.0} MiB; \
         estimated working memory {est:.0} MiB; peak RSS before {before:?} MiB, after one run {after:?} MiB; \
         q[0,0,1,0] = {:.4}",
        q[[0, 0, 1, 0]]
    );
    let mut group = c.benchmark_group("circuits");
    group.sample_size(10);
    group.bench_function("composition_qkv_smollm2_shape_gram", |b| {
        b.iter(|| composition_scores(&w, &params).expect("composition scores"))
    });
    group.finish();
}

/// The criterion group (in a private module so the generated function needs no docs).
mod group {
    criterion::criterion_group!(benches, super::bench_composition);
}
criterion_main!(group::benches);
