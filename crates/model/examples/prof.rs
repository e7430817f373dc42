//! temporary profiling
#![allow(missing_docs)]
use candle_core::{Device, Tensor, D};
use hyperlens_model::{Config, Mixer, Transformer};
use std::time::Instant;
fn t<F: FnMut()>(name: &str, reps: usize, mut f: F) {
    f();
    let t0 = Instant::now();
    for _ in 0..reps { f(); }
    eprintln!("{name}: {:.2} ms", t0.elapsed().as_secs_f64() * 1e3 / reps as f64);
}
fn main() {
    let dev = Device::Cpu;
    for mixer in [Mixer::Softmax, Mixer::Hyla] {
        let cfg = Config::sraven_base(mixer);
        let (m, _) = Transformer::init(&cfg, 0, &dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (128, 36, 8), &dev).unwrap();
        t(&format!("{mixer} forward b128"), 5, || { m.forward(&x, false).unwrap(); });
    }
    let h = Tensor::randn(0f32, 1.0, (128, 36, 128), &dev).unwrap();
    let w = Tensor::randn(0f32, 1.0, (128, 256), &dev).unwrap();
    t("matmul 4608x128x256", 10, || { h.reshape((128*36,128)).unwrap().matmul(&w).unwrap(); });
    let q = Tensor::randn(0f32, 1.0, (128, 16, 36, 4), &dev).unwrap();
    t("scores bmm", 10, || { q.matmul(&q.t().unwrap()).unwrap(); });
    let s = Tensor::randn(0f32, 1.0, (128, 16, 36, 36), &dev).unwrap();
    t("softmax", 10, || { candle_nn::ops::softmax(&s, D::Minus1).unwrap(); });
    t("softmax fused", 10, || { candle_nn::ops::softmax_last_dim(&s).unwrap(); });
    t("a@v", 10, || { s.matmul(&q).unwrap(); });
    let lw = Tensor::ones(128, candle_core::DType::F32, &dev).unwrap();
    t("layernorm slow", 10, || { candle_nn::ops::layer_norm_slow(&h, &lw, &lw, 1e-6).unwrap(); });
    t("layernorm fused", 10, || { candle_nn::ops::layer_norm(&h, &lw, &lw, 1e-6).unwrap(); });
    t("gelu", 10, || { h.gelu().unwrap(); });
    t("permute contiguous", 10, || { s.permute((0,3,2,1)).unwrap().contiguous().unwrap(); });
    let a = s.permute((0,3,2,1)).unwrap().contiguous().unwrap();
    let v = q.transpose(1,2).unwrap().contiguous().unwrap();
    t("hyla bmm1 [B,K,Q,H]x[B,K,H,d]", 10, || { a.matmul(&v).unwrap(); });
}
