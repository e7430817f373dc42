//! Criterion benchmarks of SRAVEN generation (51,200 problems, one core) and of the ambiguity checker
//! (10,000 problems).

use criterion::Criterion;
use hyperlens_tasks::ambiguity::{ambiguity_rate, Criterion as Ambiguity};
use hyperlens_tasks::sraven::{sample, Set, Split, TrainStream};

fn generation(c: &mut Criterion) {
    let split = Split::named("paper-seed0").expect("embedded split");
    let mut g = c.benchmark_group("sraven");
    g.sample_size(10);
    g.bench_function("generate_51200_train", |b| {
        let mut stream = TrainStream::new(&split, 0);
        b.iter(|| stream.next_batch(51_200))
    });
    let set = sample(&split, Set::Id, 10_000, 1, false).expect("sample");
    g.bench_function("ambiguity_10000", |b| {
        b.iter(|| ambiguity_rate(&set, Ambiguity::AnswerDiffers).expect("rate"))
    });
    g.finish();
}

/// Runs the benchmarks (what `criterion_main!` would generate, written out so it carries docs).
fn main() {
    let mut c = Criterion::default().configure_from_args();
    generation(&mut c);
    c.final_summary();
}
