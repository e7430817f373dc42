//! `hyperlens attention` on the shipped 2-layer attention-only token model: the layer-0 patterns
//! recomputed here from its weights (embedding plus position, then causal softmax of q k / sqrt(d)),
//! every pattern a causal distribution, and its errors.

use hyperlens_model::Mixer;
use ndarray::{Array2, ArrayD};

use crate::util::{
    array, close, entries, hyperlens, json, repo_path, s, safetensors, sraven_checkpoint, tempdir,
    values,
};

/// A tensor of the checkpoint as a matrix: its last two axes (a vector is one row), at index
/// `head` of the first axis of a 3-d tensor.
fn matrix(t: &hyperlens_model::candle_core::Tensor, head: Option<usize>) -> Array2<f64> {
    let (shape, v) = values(t);
    let (rows, cols) = match shape.as_slice() {
        [c] => (1, *c),
        [.., r, c] => (*r, *c),
        [] => panic!("a scalar"),
    };
    let start = head.unwrap_or(0) * rows * cols;
    Array2::from_shape_vec((rows, cols), v[start..start + rows * cols].to_vec()).unwrap()
}

#[test]
fn attention_patterns_match_a_recomputation_from_the_weights() {
    let tmp = tempdir();
    let model = repo_path("data/induction/attn-only-2l");
    let out = tmp.path().join("att.npz");
    let tokens = [7usize, 100, 42, 255, 0, 7, 100, 42];
    let list: Vec<String> = tokens.iter().map(ToString::to_string).collect();
    let list = list.join(",");
    let r = hyperlens(&[
        "attention",
        "--checkpoint",
        s(&model),
        "--tokens",
        &list,
        "--out",
        s(&out),
    ]);
    let stdout = r.success();
    let t = tokens.len();
    assert!(
        stdout.starts_with(&format!(
            "{} (token-model): 2 layers x 4 heads x {t} x {t} -> {}",
            model.display(),
            out.display()
        )),
        "{stdout}"
    );
    let pattern: ArrayD<f32> = array(&out, "pattern");
    assert_eq!(pattern.shape(), &[2, 4, t, t]);
    let toks: ArrayD<i64> = array(&out, "tokens");
    assert_eq!(toks.iter().map(|&v| v as usize).collect::<Vec<_>>(), tokens);
    // Every row a distribution over the keys up to the query.
    for l in 0..2 {
        for h in 0..4 {
            for q in 0..t {
                let row: Vec<f64> = (0..t).map(|k| f64::from(pattern[[l, h, q, k]])).collect();
                assert!(
                    row[q + 1..].iter().all(|&v| v == 0.0),
                    "L{l}H{h} query {q}: {row:?}"
                );
                assert!(row.iter().all(|&v| v >= 0.0));
                close(
                    &format!("L{l}H{h} query {q} sum"),
                    row.iter().sum(),
                    1.0,
                    1e-5,
                );
            }
        }
    }

    // Layer 0 from the weights: x = W_E[tokens] + W_pos[0..T]; q, k = x W + b per head.
    let w = safetensors(&model.join("model.safetensors"));
    let w_e = matrix(&w["embed.W_E"], None);
    let w_pos = matrix(&w["pos_embed.W_pos"], None);
    let x = Array2::from_shape_fn((t, w_e.ncols()), |(i, j)| {
        w_e[[tokens[i], j]] + w_pos[[i, j]]
    });
    for h in 0..4 {
        let q = x.dot(&matrix(&w["blocks.0.attn.W_Q"], Some(h)))
            + matrix(&w["blocks.0.attn.b_Q"], None).row(h);
        let k = x.dot(&matrix(&w["blocks.0.attn.W_K"], Some(h)))
            + matrix(&w["blocks.0.attn.b_K"], None).row(h);
        let scores = q.dot(&k.t()) / (q.ncols() as f64).sqrt();
        for i in 0..t {
            let max = (0..=i)
                .map(|j| scores[[i, j]])
                .fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = (0..=i).map(|j| (scores[[i, j]] - max).exp()).sum();
            for j in 0..=i {
                let p = (scores[[i, j]] - max).exp() / z;
                close(
                    &format!("L0H{h} [{i}, {j}]"),
                    f64::from(pattern[[0, h, i, j]]),
                    p,
                    1e-5,
                );
            }
        }
    }

    let side = json(&tmp.path().join("att.json"));
    assert_eq!(side["checkpoint_kind"], "token-model");
    assert_eq!(side["shape"], serde_json::json!([2, 4, t, t]));
    assert_eq!(side["tokens"], serde_json::json!(tokens));
    assert_eq!(entries(tmp.path()), ["att.json", "att.npz"]);
}

#[test]
fn attention_failures_name_the_token_or_checkpoint() {
    let tmp = tempdir();
    let model = repo_path("data/induction/attn-only-2l");
    let m = s(&model);
    let out = tmp.path().join("att.npz");
    let o = s(&out);
    hyperlens(&[
        "attention",
        "--checkpoint",
        m,
        "--tokens",
        "1,999",
        "--out",
        o,
    ])
    .failure(&["--tokens", "token id 999", "vocabulary of 256"]);
    hyperlens(&[
        "attention",
        "--checkpoint",
        m,
        "--tokens",
        "1,x,3",
        "--out",
        o,
    ])
    .failure(&["--tokens: entry 1 `x` is not a token id"]);
    let long = vec!["1"; 65].join(",");
    hyperlens(&[
        "attention",
        "--checkpoint",
        m,
        "--tokens",
        &long,
        "--out",
        o,
    ])
    .failure(&["--tokens", "65 tokens is longer than the model's 64"]);
    let sraven = tmp.path().join("sraven");
    sraven_checkpoint(&sraven, Mixer::Softmax, 0);
    hyperlens(&[
        "attention",
        "--checkpoint",
        s(&sraven),
        "--tokens",
        "1",
        "--out",
        o,
    ])
    .failure(&[s(&sraven), "not a token language model"]);
    let missing = tmp.path().join("missing");
    hyperlens(&[
        "attention",
        "--checkpoint",
        s(&missing),
        "--tokens",
        "1",
        "--out",
        o,
    ])
    .failure(&[s(&missing), "no such file or directory"]);
    assert_eq!(entries(tmp.path()), ["sraven"]);
}

#[test]
fn attention_usage_errors() {
    let model = repo_path("data/induction/attn-only-2l");
    hyperlens(&["attention", "--checkpoint", s(&model), "--out", "a.npz"])
        .usage_error(&["--tokens <TOKENS>"]);
    hyperlens(&[
        "attention",
        "--checkpoint",
        s(&model),
        "--tokens",
        "1",
        "--out",
        "a.npz",
        "--device",
        "tpu",
    ])
    .usage_error(&["invalid value 'tpu' for '--device <DEVICE>'"]);
}

/// `--text` tokenizes with the model's own tokenizer (the tiny Llama fixture's `tokenizer.json`,
/// whose Hugging Face ids are in `tokenizer_ids.json`: `<s>` = 1 first) and then runs as
/// `--tokens` with those ids; it excludes `--tokens`; a model without a tokenizer says so in one
/// line.
#[test]
fn attention_text_runs_as_its_token_ids() {
    let tmp = tempdir();
    let model = crate::util::manifest_dir().join("crates/model/tests/fixtures/lm/tiny-llama-hf");
    let m = s(&model);
    let by_text = tmp.path().join("text.npz");
    let by_ids = tmp.path().join("ids.npz");
    let text = "the cat sat on the mat .";
    let ids = [1i64, 3, 4, 5, 6, 3, 7, 58];
    hyperlens(&[
        "attention",
        "--checkpoint",
        m,
        "--text",
        text,
        "--out",
        s(&by_text),
    ])
    .success();
    let list: Vec<String> = ids.iter().map(ToString::to_string).collect();
    hyperlens(&[
        "attention",
        "--checkpoint",
        m,
        "--tokens",
        &list.join(","),
        "--out",
        s(&by_ids),
    ])
    .success();
    let toks: ArrayD<i64> = array(&by_text, "tokens");
    assert_eq!(toks.iter().copied().collect::<Vec<_>>(), ids);
    let a: ArrayD<f32> = array(&by_text, "pattern");
    let b: ArrayD<f32> = array(&by_ids, "pattern");
    assert_eq!(a, b);
    assert_eq!(
        json(&tmp.path().join("text.json"))["tokens"],
        serde_json::json!(ids)
    );

    hyperlens(&[
        "attention",
        "--checkpoint",
        m,
        "--text",
        "a",
        "--tokens",
        "1",
        "--out",
        s(&by_text),
    ])
    .usage_error(&["--tokens", "--text"]);
    let induction = repo_path("data/induction/attn-only-2l");
    let e = hyperlens(&[
        "attention",
        "--checkpoint",
        s(&induction),
        "--text",
        "hello",
        "--out",
        s(&by_text),
    ])
    .failure(&[
        "--text",
        "this model has no tokenizer",
        "no tokenizer.json in",
        "pass token ids",
    ])
    .to_string();
    assert_eq!(e.trim().lines().count(), 1, "{e}");
}
