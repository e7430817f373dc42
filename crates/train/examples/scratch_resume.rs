use std::ops::ControlFlow;
use hyperlens_train::{train, Event, ModelSize, RunOptions, TrainSettings, TrainTask};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mut s = TrainSettings::for_task(TrainTask::Sraven);
    s.size = Some(ModelSize { d_model: 32, n_heads: 4, d_head: 4, d_mlp: 64 });
    s.layers = 2;
    s.steps = a[1].parse().unwrap();
    s.batch = a[2].parse().unwrap();
    let stop: u64 = a[3].parse().unwrap();
    s.dropout = a[4].parse().unwrap();
    s.warmup = 30; s.lr = 3e-3; s.eval_every = 0; s.eval_n = 64; s.checkpoint_every = 0; s.log_every = 1;
    let dir = tempfile::tempdir().unwrap();
    let (x, y, z) = (dir.path().join("x"), dir.path().join("y"), dir.path().join("z"));
    let o = RunOptions::default();
    train(&x, &s, &o, |_| ControlFlow::Continue(())).unwrap();
    train(&y, &s, &o, |_| ControlFlow::Continue(())).unwrap();
    train(&z, &s, &o, |e| match e { Event::Step { step, .. } if *step + 1 == stop => ControlFlow::Break(()), _ => ControlFlow::Continue(()) }).unwrap();
    train(&z, &s, &RunOptions { resume: true, ..o }, |_| ControlFlow::Continue(())).unwrap();
    let r = |p: &std::path::Path| std::fs::read(p.join("model.safetensors")).unwrap();
    println!("straight==straight {} straight==resumed {}", r(&x) == r(&y), r(&x) == r(&z));
    let m = |p: &std::path::Path| std::fs::read_to_string(p.join("metrics.csv")).unwrap();
    for ((a, b), c) in m(&x).lines().zip(m(&y).lines()).zip(m(&z).lines()) {
        let f = |l: &str| l.split(',').take(3).collect::<Vec<_>>().join(",");
        println!("{} | {} | {}", f(a), f(b), f(c));
    }
}
