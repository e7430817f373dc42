use std::ops::ControlFlow;
use hyperlens_model::Mixer;
use hyperlens_train::{train, Event, ModelSize, RunOptions, TrainSettings, TrainTask};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mut s = TrainSettings::for_task(TrainTask::Sraven);
    s.mixer = a[1].parse::<Mixer>().unwrap();
    let d: usize = a[2].parse().unwrap();
    s.size = Some(ModelSize { d_model: d, n_heads: a[3].parse().unwrap(), d_head: 4, d_mlp: 2 * d });
    s.layers = a[4].parse().unwrap();
    s.batch = a[5].parse().unwrap();
    s.steps = a[6].parse().unwrap();
    s.lr = a[7].parse().unwrap();
    s.warmup = a[8].parse().unwrap();
    s.eval_every = a[9].parse().unwrap();
    s.dropout = a[10].parse().unwrap();
    s.eval_n = 512;
    s.sraven.features = a[11].parse().unwrap();
    s.sraven.values = a[12].parse().unwrap();
    s.split = a[13].clone();
    s.log_every = s.eval_every;
    s.checkpoint_every = 0;
    let dir = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    train(&dir.path().join("r"), &s, &RunOptions::default(), |e| {
        if let Event::Row(r) = e {
            println!("{:>5} loss {:.4} acc {:.3} | ood loss {:.4} acc {:.3} | {:.1}s", r.step, r.train_loss.unwrap_or(f64::NAN), r.train_acc.unwrap_or(f64::NAN), r.ood_loss.unwrap_or(f64::NAN), r.ood_acc.unwrap_or(f64::NAN), t.elapsed().as_secs_f64());
        }
        if let Event::Evaluated(ev) = e { println!("      ood per-feature {:?} id {:.3}", ev.ood.per_feature, ev.id.metric); }
        ControlFlow::Continue(())
    }).unwrap();
}
