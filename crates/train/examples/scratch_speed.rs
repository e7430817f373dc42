use candle_core::Device;
use hyperlens_model::{Config, Mixer, Transformer};
use hyperlens_tasks::sraven::{Split, TrainStream};
use hyperlens_train::state::dropout_rng;
use hyperlens_train::{AdamW, AdamWParams};
use std::time::Instant;

fn main() {
    let split = Split::named("paper-seed0").unwrap();
    let args: Vec<String> = std::env::args().collect();
    let d: usize = args[1].parse().unwrap();
    let h: usize = args[2].parse().unwrap();
    let b: usize = args[3].parse().unwrap();
    let layers: usize = args[4].parse().unwrap();
    for mixer in [Mixer::Hyla, Mixer::Softmax] {
        let cfg = Config { d_model: d, n_heads: h, d_head: 4, d_mlp: 2 * d, n_layers: layers, ..Config::sraven_base(mixer) };
        let (model, varmap) = Transformer::init(&cfg, 0, &Device::Cpu).unwrap();
        let vars = varmap.data().lock().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut opt = AdamW::new(vars, AdamWParams::default()).unwrap();
        let (mut tdata, mut tfwd, mut tbwd, mut topt) = (0.0, 0.0, 0.0, 0.0);
        let n = 10;
        for step in 0..n {
            let t0 = Instant::now();
            let problems = TrainStream::at(&split, 0, step).next_batch(b);
            let t1 = Instant::now();
            let mut rng = dropout_rng(0, step);
            let bl = hyperlens_train::sraven::batch_loss(&model, &problems, 0.1, &mut rng).unwrap();
            let _ = bl.loss.to_scalar::<f32>().unwrap();
            let t2 = Instant::now();
            let grads = bl.loss.backward().unwrap();
            let t3 = Instant::now();
            opt.step(&grads, 1e-4).unwrap();
            let t4 = Instant::now();
            tdata += (t1 - t0).as_secs_f64(); tfwd += (t2 - t1).as_secs_f64(); tbwd += (t3 - t2).as_secs_f64(); topt += (t4 - t3).as_secs_f64();
        }
        let n = n as f64;
        println!("{mixer}: data {:.4} fwd {:.4} bwd {:.4} opt {:.4} s/step", tdata / n, tfwd / n, tbwd / n, topt / n);
    }
}
