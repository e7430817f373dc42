//! The code transplant against the pass's own codes (bit for bit), against the hooked pass with a
//! hook on `blocks.{l}.attn.hook_pattern` that writes the same values (an independent path: the
//! decomposed norms and softmax, one sequence at its full length, the write done on the host),
//! and across batchings, on the tiny GPT-2 and Llama fixtures and a token model.
//!
//! Tolerance against the hooked pass and across batchings: 1e-5 relative to `max(1, |x|)` (the
//! lens's tests' bound for logits, `super::super::tests`); a wrong row, key, head, layer or
//! sequence changes a logit by orders of magnitude more (checked: the written codes move the
//! logits by more than 1e-2).

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use ndarray::{s, Array3};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::CodeSites;
use crate::error::Result;
use crate::hooks::HookFn;
use crate::lm::{load, CodeForm, CodeRequest, LanguageModel, TokenConfig, TokenModel};
use crate::mixer::Mixer;

fn fixture(name: &str) -> LanguageModel {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/lm")
        .join(name);
    load(&dir, &Device::Cpu).unwrap()
}

/// A seeded token model with LayerNorm, an MLP and softmax attention.
fn token_model() -> LanguageModel {
    let cfg = TokenConfig {
        vocab_size: 40,
        n_ctx: 24,
        d_model: 32,
        n_heads: 4,
        d_head: 8,
        n_layers: 3,
        d_mlp: Some(48),
        layer_norm: true,
        mixer: Mixer::Softmax,
    };
    let tensors = TokenModel::init_tensors(&cfg, 11, &Device::Cpu).unwrap();
    LanguageModel::Token(
        TokenModel::from_tensors(&cfg, tensors.into_iter().collect(), &Device::Cpu).unwrap(),
    )
}

fn models() -> Vec<(&'static str, LanguageModel)> {
    vec![
        ("gpt2", fixture("tiny-gpt2-hf")),
        ("llama", fixture("tiny-llama-hf")),
        ("token", token_model()),
    ]
}

/// Sequences of the given lengths, the last position as query and three distinct keys.
struct Batch {
    tokens: Vec<Vec<u32>>,
    query: Vec<usize>,
    keys: Vec<Vec<usize>>,
}

impl Batch {
    fn new(lm: &LanguageModel, lens: &[usize]) -> Batch {
        let v = lm.vocab_size() as u32;
        let tokens = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut rng = ChaCha8Rng::seed_from_u64(50 + i as u64);
                (0..n).map(|_| rng.gen_range(0..v)).collect()
            })
            .collect();
        Batch {
            tokens,
            query: lens.iter().map(|&n| n - 1).collect(),
            keys: lens.iter().map(|&n| vec![n - 2, 1, n / 2]).collect(),
        }
    }

    fn sites(&self) -> CodeSites<'_> {
        CodeSites {
            tokens: &self.tokens,
            query: &self.query,
            keys: &self.keys,
            first_index: 0,
        }
    }

    fn one(&self, b: usize) -> Batch {
        Batch {
            tokens: vec![self.tokens[b].clone()],
            query: vec![self.query[b]],
            keys: vec![self.keys[b].clone()],
        }
    }
}

/// The pass's own codes `[N, H, K]` at `layer` and its next-token logits `[N, V]` (the lens).
fn own(lm: &LanguageModel, batch: &Batch, layer: usize) -> (Array3<f32>, ndarray::Array2<f32>) {
    let query: Vec<Vec<usize>> = batch.query.iter().map(|&q| vec![q]).collect();
    let out = lm
        .latent_codes(&CodeRequest {
            tokens: &batch.tokens,
            query: &query,
            keys: &batch.keys,
            layers: Some(&[layer]),
            form: CodeForm::Pattern,
            last_logits: true,
            resid: false,
            first_index: 0,
        })
        .unwrap();
    let codes = out.codes.slice(s![.., 0, .., 0, ..]).to_owned();
    (codes, out.last_logits.unwrap())
}

/// Codes unlike any pattern's: positive, not summing to one, different per head and key.
fn odd_codes(n: usize, h: usize, k: usize) -> Array3<f32> {
    Array3::from_shape_fn((n, h, k), |(b, hh, j)| {
        0.05 + 0.3 * ((b * 7 + hh * 3 + j) % 5) as f32
    })
}

fn close(got: f32, want: f32) -> bool {
    (got - want).abs() <= 1e-5 * want.abs().max(1.0)
}

#[test]
fn writing_the_own_codes_back_gives_the_lens_logits() {
    for (name, lm) in models() {
        let batch = Batch::new(&lm, &[9, 14, 6]);
        for layer in 0..lm.n_layers() {
            let (codes, base) = own(&lm, &batch, layer);
            let got = lm
                .last_logits_with_codes(&batch.sites(), layer, codes.view())
                .unwrap();
            assert_eq!(got.dim(), (3, lm.vocab_size()));
            if name == "token" {
                // The hooked, decomposed mixer against the fused one (module docs).
                for (g, b) in got.iter().zip(&base) {
                    assert!(close(*g, *b), "{name} layer {layer}: {g} vs {b}");
                }
            } else {
                assert_eq!(got, base, "{name} layer {layer}: not bit for bit");
            }
        }
    }
}

/// The hooked pass's hook: at each of its layers' patterns, sets `pattern[0, h, query, keys[j]]`
/// to that layer's `codes[h, j]`, on the host.
struct HostWrite {
    query: usize,
    keys: Vec<usize>,
    /// Per written layer, its hook name and its codes `[H, K]`.
    layers: Vec<(String, ndarray::Array2<f32>)>,
}

impl HookFn for HostWrite {
    fn wants(&self, name: &str) -> bool {
        self.layers.iter().any(|(n, _)| n == name)
    }

    fn call(&mut self, name: &str, p: &Tensor) -> Result<Option<Tensor>> {
        let (_, h, t, _) = p.dims4()?;
        let codes = &self.layers.iter().find(|(n, _)| n == name).unwrap().1;
        let mut v: Vec<f32> = p.flatten_all()?.to_vec1()?;
        for hh in 0..h {
            for (j, &k) in self.keys.iter().enumerate() {
                v[(hh * t + self.query) * t + k] = codes[[hh, j]];
            }
        }
        Ok(Some(Tensor::from_vec(v, p.dims(), p.device())?))
    }
}

/// The hooked pass of sequence `b` alone with `HostWrite` at `layers` (codes `[N, H, K]` each):
/// its next-token logits after its last token.
fn hooked(
    lm: &LanguageModel,
    batch: &Batch,
    b: usize,
    layers: &[(usize, &Array3<f32>)],
) -> Vec<f32> {
    let toks = &batch.tokens[b];
    let mut hook = HostWrite {
        query: batch.query[b],
        keys: batch.keys[b].clone(),
        layers: layers
            .iter()
            .map(|(l, c)| {
                (
                    format!("blocks.{l}.attn.hook_pattern"),
                    c.index_axis(ndarray::Axis(0), b).to_owned(),
                )
            })
            .collect(),
    };
    let x = Tensor::from_slice(toks, (1, toks.len()), &Device::Cpu).unwrap();
    let logits = lm.run_with_hooks(&x, &mut hook).unwrap();
    logits
        .get(0)
        .unwrap()
        .get(toks.len() - 1)
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn the_transplant_equals_the_hooked_pass_writing_the_same_pattern_entries() {
    for (name, lm) in models() {
        let batch = Batch::new(&lm, &[9, 14, 6]);
        let h = lm.n_heads();
        let codes = odd_codes(3, h, 3);
        for layer in 0..lm.n_layers() {
            let got = lm
                .last_logits_with_codes(&batch.sites(), layer, codes.view())
                .unwrap();
            let (_, base) = own(&lm, &batch, layer);
            let mut moved = 0f32;
            for b in 0..batch.tokens.len() {
                let want = hooked(&lm, &batch, b, &[(layer, &codes)]);
                for (v, w) in want.iter().enumerate() {
                    let g = got[[b, v]];
                    assert!(
                        close(g, *w),
                        "{name} layer {layer} seq {b} logit {v}: {g} vs {w}"
                    );
                    moved = moved.max((g - base[[b, v]]).abs());
                }
            }
            assert!(
                moved > 1e-2,
                "{name} layer {layer}: the codes hardly moved the logits"
            );
        }
    }
}

#[test]
fn writing_two_layers_at_once_equals_the_hooked_pass_writing_both() {
    for (name, lm) in models() {
        let batch = Batch::new(&lm, &[9, 14, 6]);
        let h = lm.n_heads();
        let (first, last) = (0, lm.n_layers() - 1);
        let a = odd_codes(3, h, 3);
        let b = a.mapv(|x| 0.9 - x);
        let both = ndarray::stack![ndarray::Axis(1), b, a];
        let got = lm
            .last_logits_with_layer_codes(&batch.sites(), &[last, first], both.view())
            .unwrap();
        let only_last = lm
            .last_logits_with_codes(&batch.sites(), last, b.view())
            .unwrap();
        let mut apart = 0f32;
        for s in 0..3 {
            let want = hooked(&lm, &batch, s, &[(first, &a), (last, &b)]);
            for (v, w) in want.iter().enumerate() {
                let g = got[[s, v]];
                assert!(close(g, *w), "{name} seq {s} logit {v}: {g} vs {w}");
                apart = apart.max((g - only_last[[s, v]]).abs());
            }
        }
        assert!(apart > 1e-2, "{name}: the first layer's write did nothing");
        let e = lm
            .last_logits_with_layer_codes(&batch.sites(), &[last, last], both.view())
            .unwrap_err()
            .to_string();
        assert!(e.contains("selected twice"), "{e}");
    }
}

#[test]
fn batching_and_padding_do_not_change_the_transplant() {
    for (name, lm) in models() {
        let batch = Batch::new(&lm, &[13, 8, 5]);
        let codes = odd_codes(3, lm.n_heads(), 3);
        let layer = lm.n_layers() - 1;
        let all = lm
            .last_logits_with_codes(&batch.sites(), layer, codes.view())
            .unwrap();
        for b in 0..3 {
            let one = batch.one(b);
            let alone = lm
                .last_logits_with_codes(&one.sites(), layer, codes.slice(s![b..=b, .., ..]))
                .unwrap();
            for (x, y) in alone.row(0).iter().zip(all.row(b)) {
                assert!(close(*x, *y), "{name} seq {b}: {x} vs {y}");
            }
        }
    }
}

#[test]
fn bad_writes_are_clear_errors() {
    let lm = fixture("tiny-llama-hf");
    let batch = Batch::new(&lm, &[9, 6]);
    let h = lm.n_heads();
    let codes = odd_codes(2, h, 3);
    let err = |sites: CodeSites<'_>, layer: usize, codes: &Array3<f32>| -> String {
        lm.last_logits_with_codes(&sites, layer, codes.view())
            .unwrap_err()
            .to_string()
    };
    let e = err(batch.sites(), lm.n_layers(), &codes);
    assert!(e.contains("out of range"), "{e}");
    let e = err(batch.sites(), 0, &odd_codes(2, h, 2));
    assert!(
        e.contains("expected [sequences, layers, heads, keys]"),
        "{e}"
    );
    let mut nan = codes.clone();
    nan[[1, 0, 2]] = f32::NAN;
    let e = err(batch.sites(), 0, &nan);
    assert!(
        e.contains("sequence 1") && e.contains("not a finite"),
        "{e}"
    );
    let twice = vec![vec![7, 1, 4], vec![2, 3, 2]];
    let e = err(
        CodeSites {
            keys: &twice,
            ..batch.sites()
        },
        0,
        &codes,
    );
    assert!(
        e.contains("sequence 1: key position 2 is given twice"),
        "{e}"
    );
    let early = [8usize, 2];
    let e = err(
        CodeSites {
            query: &early,
            ..batch.sites()
        },
        0,
        &codes,
    );
    assert!(e.contains("after query position 2"), "{e}");
    let e = err(
        CodeSites {
            query: &early[..1],
            ..batch.sites()
        },
        0,
        &codes,
    );
    assert!(e.contains("2 sequences but 1 query"), "{e}");
}
