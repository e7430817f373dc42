//! `hyperlens cache`: the activations of hook points (TransformerLens names) over a problem set,
//! one array per hook; the pattern at the paper's site equals the latent codes `probe` extracts
//! from the ordinary forward pass, and the logits those of `eval --save-logits`.

use ndarray::{s as sl, ArrayD};

use crate::util::{array, hyperlens, json, s, sraven_checkpoint, tempdir};
use hyperlens_model::Mixer;

#[test]
fn cached_patterns_are_the_probes_latent_codes() {
    let tmp = tempdir();
    let ck = tmp.path().join("ck");
    sraven_checkpoint(&ck, Mixer::Hyla, 3);
    let acts = tmp.path().join("acts.npz");
    let common = [
        "--split",
        "paper-seed0",
        "--set",
        "ood",
        "--n",
        "37",
        "--seed",
        "2",
        "--unpermuted",
    ];
    let mut args = vec!["cache", "--checkpoint", s(&ck)];
    args.extend(common);
    args.extend([
        "--hooks",
        "blocks.*.attn.hook_pattern,hook_embed",
        "--positions",
        "35",
        "--batch",
        "10",
        "--out",
        s(&acts),
    ]);
    let out = hyperlens(&args);
    assert!(out.success().contains("37 problems"), "{}", out.success());
    let codes = tmp.path().join("codes.npz");
    let mut args = vec!["probe", "--checkpoint", s(&ck)];
    args.extend(common);
    args.extend(["--site", "paper", "--out", s(&codes)]);
    hyperlens(&args).success();
    let probe: ArrayD<f32> = array(&codes, "codes"); // [N, L, H, 1, 2]
    let n_layers = probe.shape()[1];
    for l in 0..n_layers {
        let pattern: ArrayD<f32> = array(&acts, &format!("blocks.{l}.attn.hook_pattern"));
        assert_eq!(pattern.shape()[..3], [37, probe.shape()[2], 1]);
        for (k, key) in [27usize, 31].into_iter().enumerate() {
            let a = pattern.slice(sl![.., .., 0, key]);
            let b = probe.slice(sl![.., l, .., 0, k]);
            let d = a
                .iter()
                .zip(b.iter())
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(d < 1e-5, "layer {l} key {key}: {d}");
        }
    }
    let embed: ArrayD<f32> = array(&acts, "hook_embed");
    assert_eq!(embed.shape()[..2], [37, 1]);
    let side = json(&tmp.path().join("acts.json"));
    assert_eq!(side["source"]["set"], "ood");
    assert_eq!(side["arrays"]["logits"], serde_json::json!([37, 4, 8]));
    let names = hyperlens(&["cache", "--checkpoint", s(&ck), "--list-hooks"])
        .success()
        .to_owned();
    assert!(
        names
            .lines()
            .any(|l| l == "blocks.0.attn.hook_value_hidden"),
        "{names}"
    );
}

#[test]
fn cache_errors_name_the_hook_or_position() {
    let tmp = tempdir();
    let ck = tmp.path().join("ck");
    sraven_checkpoint(&ck, Mixer::Softmax, 4);
    let out = tmp.path().join("a.npz");
    let base = [
        "cache",
        "--checkpoint",
        s(&ck),
        "--split",
        "paper-seed0",
        "--n",
        "4",
        "--out",
        s(&out),
    ];
    let mut a = base.to_vec();
    a.extend(["--hooks", "blocks.*.attn.hook_value_hidden"]);
    // Softmax has no value network: the pattern matches nothing.
    hyperlens(&a).failure(&["`blocks.*.attn.hook_value_hidden`", "matches no hook point"]);
    let mut a = base.to_vec();
    a.extend(["--hooks", "hook_embed", "--positions", "99"]);
    hyperlens(&a).failure(&["--positions [99]"]);
    assert!(!out.exists());
    hyperlens(&["cache", "--checkpoint", s(&ck), "--out", s(&out)]).usage_error(&["--hooks"]);
}

/// `cache --tokens` on a language model: the tiny GPT-2 of the model crate's fixtures, whose
/// attention patterns then equal TransformerLens 3.9's (the fixture of `make_tl_hooks_fixture.py`).
#[test]
fn a_language_models_cache_matches_transformer_lens() {
    let tmp = tempdir();
    let fixtures = crate::util::manifest_dir().join("crates/model/tests/fixtures/lm");
    let ck = fixtures.join("tiny-gpt2-hf");
    let acts = tmp.path().join("lm.npz");
    let tokens = "3,17,42,5,9,3,17,42,5,60,1,3";
    let r = hyperlens(&[
        "cache",
        "--checkpoint",
        s(&ck),
        "--tokens",
        tokens,
        "--hooks",
        "blocks.*.attn.hook_pattern,ln_final.hook_normalized",
        "--out",
        s(&acts),
    ]);
    assert!(
        r.success().contains("12 tokens, 5 arrays"),
        "{}",
        r.success()
    );
    let mut tl = ndarray_npy::NpzReader::new(
        std::fs::File::open(fixtures.join("tl_hooks_gpt2.npz")).unwrap(),
    )
    .unwrap();
    for name in [
        "blocks.0.attn.hook_pattern",
        "blocks.1.attn.hook_pattern",
        "ln_final.hook_normalized",
    ] {
        let got: ArrayD<f32> = array(&acts, name);
        let want: ArrayD<f32> = tl.by_name(name).unwrap();
        assert_eq!(&got.shape()[1..], want.shape(), "{name}");
        let d = got
            .iter()
            .zip(want.iter())
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(d < 1e-5, "{name}: {d}");
    }
    let side = json(&tmp.path().join("lm.json"));
    assert_eq!(side["checkpoint_kind"], "hf-gpt2");
    hyperlens(&[
        "cache",
        "--checkpoint",
        s(&ck),
        "--tokens",
        "3,64",
        "--hooks",
        "hook_embed",
        "--out",
        s(&acts),
    ])
    .failure(&["token id 64"]);
}

/// `cache --text` caches the activations of the text's token ids (the tiny Llama fixture's
/// tokenizer), records those ids in the sidecar as `--tokens` does, and excludes `--tokens`.
#[test]
fn cache_text_equals_cache_of_its_token_ids() {
    let tmp = tempdir();
    let ck = crate::util::manifest_dir().join("crates/model/tests/fixtures/lm/tiny-llama-hf");
    let (a, b) = (tmp.path().join("a.npz"), tmp.path().join("b.npz"));
    let base = [
        "cache",
        "--checkpoint",
        s(&ck),
        "--hooks",
        "blocks.*.attn.hook_pattern",
    ];
    let mut by_text = base.to_vec();
    by_text.extend(["--text", "Q: one two A: three", "--out", s(&a)]);
    assert!(hyperlens(&by_text).success().contains("6 tokens"));
    let mut by_ids = base.to_vec();
    by_ids.extend(["--tokens", "1,62,42,43,63,44", "--out", s(&b)]);
    hyperlens(&by_ids).success();
    for name in ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"] {
        let x: ArrayD<f32> = array(&a, name);
        let y: ArrayD<f32> = array(&b, name);
        assert_eq!(x, y, "{name}");
    }
    let (sa, sb) = (
        json(&tmp.path().join("a.json")),
        json(&tmp.path().join("b.json")),
    );
    assert_eq!(sa["source"], sb["source"]);
    let mut both = base.to_vec();
    both.extend(["--text", "one", "--tokens", "1", "--out", s(&a)]);
    hyperlens(&both).usage_error(&["--text", "--tokens"]);
}
