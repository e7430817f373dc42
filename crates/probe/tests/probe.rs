//! Integration tests of latent-code extraction on a real checkpoint trained by the paper's JAX code.

use std::collections::HashMap;
use std::fs::File;
use std::ops::ControlFlow;
use std::path::PathBuf;

use candle_core::{Device, IndexOp};
use hyperlens_model::eval::batch_tensor;
use hyperlens_model::import::import_jax_npz;
use hyperlens_model::{Evaluator, Mixer, Transformer};
use hyperlens_probe::{extract, ProbeMeta, ProbeParams, Site};
use hyperlens_tasks::sraven::{sample, Set, Split};
use ndarray::{Array1, Array2, Array5};
use ndarray_npy::NpzReader;

/// A progress callback that never stops the work.
fn go(_done: usize, _total: usize) -> ControlFlow<()> {
    ControlFlow::Continue(())
}

fn reference_checkpoint(name: &str) -> PathBuf {
    // The paper's JAX exports, committed as fixtures of the model crate.
    manifest_dir()
        .join("../model/tests/fixtures/paper-jax")
        .join(name)
}

fn load(mixer: Mixer, file: &str) -> Transformer {
    let (cfg, tensors) = import_jax_npz(&reference_checkpoint(file), mixer, 4).expect("import");
    let map: HashMap<_, _> = tensors.into_iter().collect();
    Transformer::from_tensors(&cfg, map, &Device::Cpu).expect("model")
}

#[test]
fn paper_site_codes_equal_the_attention_of_the_forward_pass() {
    let model = load(Mixer::Hyla, "hyla_params.npz");
    let split = Split::named("paper-seed1").expect("split");
    let n = 13;
    let problems = sample(&split, Set::Ood, n, 7, true).expect("problems");
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("codes.npz");
    // Uneven batches of 5, 5, 3 through the streaming path.
    let batches = (0..n)
        .step_by(5)
        .map(|s| Ok(problems.slice(s, (s + 5).min(n))));
    let params = ProbeParams {
        site: Site::Paper,
        layers: None,
    };
    let summary = extract(
        &Evaluator::new(model.clone()).expect("evaluator"),
        batches,
        n,
        &params,
        &out,
        ProbeMeta::default(),
        |_| ControlFlow::Continue(()),
    )
    .expect("extract");
    assert_eq!(summary.n_rows, n);

    let mut r = NpzReader::new(File::open(&out).expect("open")).expect("npz");
    let codes: Array5<f32> = r.by_name("codes.npy").expect("codes");
    let label: Array1<i64> = r.by_name("label.npy").expect("label");
    let inputs: Array2<i64> = r.by_name("inputs.npy").expect("inputs");
    let target: Array1<i64> = r.by_name("target.npy").expect("target");
    assert_eq!(codes.shape(), &[n, 4, 16, 1, 2]);

    // One forward pass over all problems at once: codes must equal its attention at query 35,
    // keys 27 and 31 (positions computed by hand: slot 3 of panels 6 and 7, query token 3).
    let x = batch_tensor(&problems.x, &Device::Cpu).expect("x");
    let att = model
        .forward(&x, true)
        .expect("fwd")
        .attention
        .expect("attention");
    for (l, a) in att.iter().enumerate() {
        for (ki, key) in [27usize, 31].into_iter().enumerate() {
            let col: Vec<Vec<f32>> = a
                .i((.., .., 35, key))
                .expect("index")
                .to_vec2()
                .expect("vec");
            for i in 0..n {
                for h in 0..16 {
                    let got = codes[[i, l, h, 0, ki]];
                    let want = col[i][h];
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "l{l} h{h} i{i}: {got} vs {want}"
                    );
                }
            }
        }
    }
    // HYLA codes are RMSHead-normalised: mean square over heads is 1 for every pair.
    for i in 0..n {
        for l in 0..4 {
            let ms: f32 = (0..16).map(|h| codes[[i, l, h, 0, 0]].powi(2)).sum::<f32>() / 16.0;
            assert!((ms - 1.0).abs() < 1e-3, "mean square {ms}");
        }
    }
    for i in 0..n {
        // Unpermuted: the label is the rule of slot 3, the largest rule of the task.
        assert_eq!(label[i], problems.rules[[i, 3]]);
        assert_eq!(
            label[i],
            *problems.rules.row(i).iter().max().expect("rules")
        );
        assert_eq!(target[i], problems.y[[i, 3]]);
        // The inputs are the values of slot 3 in panels 6 and 7.
        for (ki, key) in [27usize, 31].into_iter().enumerate() {
            let v = problems
                .x
                .slice(ndarray::s![i, key, ..])
                .iter()
                .position(|&v| v > 0.5)
                .expect("one-hot");
            assert_eq!(inputs[[i, ki]], v as i64);
        }
    }
    let meta: ProbeMeta =
        serde_json::from_slice(&std::fs::read(out.with_extension("json")).expect("sidecar"))
            .expect("json");
    assert_eq!(meta.mixer, Some(Mixer::Hyla));
    assert_eq!(
        meta.normalisation,
        Some(hyperlens_model::Normalisation::RmsHead)
    );
    let text = std::fs::read_to_string(out.with_extension("json")).expect("sidecar");
    assert!(text.contains("\"normalisation\": \"rms_head\""), "{text}");
    assert_eq!(meta.selections[0].query, 35);
    assert_eq!(meta.shapes["codes"], vec![n, 4, 16, 1, 2]);
}

#[test]
fn all_slots_stack_rows_and_layer_subsets_keep_order() {
    let model = load(Mixer::Softmax, "softmax_params.npz");
    let split = Split::named("paper-seed1").expect("split");
    let n = 7;
    let problems = sample(&split, Set::Id, n, 3, false).expect("problems");
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("all.npz");
    let params = ProbeParams {
        site: Site::AllSlots,
        layers: Some(vec![3, 1]),
    };
    let ev = Evaluator::new(model.clone()).expect("evaluator");
    extract(
        &ev,
        [Ok(problems.clone())],
        n,
        &params,
        &out,
        ProbeMeta::default(),
        |_| ControlFlow::Continue(()),
    )
    .expect("extract");
    let mut r = NpzReader::new(File::open(&out).expect("open")).expect("npz");
    let codes: Array5<f32> = r.by_name("codes.npy").expect("codes");
    let label: Array1<i64> = r.by_name("label.npy").expect("label");
    let slot: Array1<i64> = r.by_name("slot.npy").expect("slot");
    assert_eq!(codes.shape(), &[4 * n, 2, 16, 1, 2]);
    let x = batch_tensor(&problems.x, &Device::Cpu).expect("x");
    let att = model
        .forward(&x, true)
        .expect("fwd")
        .attention
        .expect("attention");
    let perms = problems.perms.as_ref().expect("perms");
    for i in 0..n {
        for f in 0..4 {
            let row = 4 * i + f;
            assert_eq!(slot[row], f as i64);
            // Permuted problems: answer slot f shows feature perms[i, 2, f].
            let feature = perms[[i, 2, f]] as usize;
            assert_eq!(label[row], problems.rules[[i, feature]]);
            // Layer axis order follows the selection: [3, 1]. Softmax rows are probabilities.
            let want: f32 = att[1]
                .i((i, 5, 32 + f, 28 + f))
                .expect("i")
                .to_scalar()
                .expect("s");
            assert!((codes[[row, 1, 5, 0, 1]] - want).abs() < 1e-6);
            let want3: f32 = att[3]
                .i((i, 0, 32 + f, 24 + f))
                .expect("i")
                .to_scalar()
                .expect("s");
            assert!((codes[[row, 0, 0, 0, 0]] - want3).abs() < 1e-6);
        }
    }
    // Announcing the wrong number of problems is an error and leaves no file behind.
    let bad = dir.path().join("bad.npz");
    let err = extract(
        &ev,
        [Ok(problems)],
        n + 1,
        &params,
        &bad,
        ProbeMeta::default(),
        |_| ControlFlow::Continue(()),
    );
    assert!(err.is_err());
    assert!(!bad.exists());
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

/// Head ablation at `hook_z` against an independent construction: zeroing head h's output equals
/// zeroing its rows of `W_O` in the weights (`attn_out = sum_h z_h W_O[h] + b_O`); mean ablation
/// over a single problem (its own mean) changes nothing.
#[test]
fn zero_ablation_equals_removing_the_heads_output_weights() {
    use hyperlens_model::{checkpoint, Config};
    use hyperlens_probe::{head_ablation, Ablation};
    let cfg = Config {
        n_layers: 2,
        d_model: 24,
        n_heads: 3,
        d_head: 4,
        d_mlp: 16,
        ..Config::sraven_base(Mixer::Hyla)
    };
    let (model, _) = Transformer::init(&cfg, 11, &Device::Cpu).unwrap();
    let split = Split::named("paper-seed0").unwrap();
    let problems = sample(&split, Set::Ood, 40, 3, false).unwrap();
    let mut source = || -> Box<dyn Iterator<Item = hyperlens_probe::Result<_>> + '_> {
        Box::new(
            (0..40)
                .step_by(16)
                .map(|s| Ok(problems.slice(s, (s + 16).min(40)))),
        )
    };
    let mut passes = Vec::new();
    let ev = Evaluator::new(model.clone()).unwrap();
    let r = head_ablation(&ev, &mut source, Ablation::Zero, |d, t| {
        passes.push((d, t));
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(passes.last(), Some(&(7, 7)));
    assert_eq!(r.heads.len(), 6);
    let base = hyperlens_model::evaluate(&ev, &problems, 40).unwrap();
    assert!((r.base.loss - base.loss).abs() < 1e-5);
    let tmp = tempfile::tempdir().unwrap();
    for h in &r.heads {
        let tensors: Vec<(String, candle_core::Tensor)> = model
            .named_tensors()
            .iter()
            .cloned()
            .map(|(n, t)| {
                if n == format!("blocks.{}.attn.W_O", h.layer) {
                    let keep: Vec<f32> = (0..cfg.n_heads)
                        .map(|i| if i == h.head { 0.0 } else { 1.0 })
                        .collect();
                    let mask =
                        candle_core::Tensor::from_vec(keep, (cfg.n_heads, 1, 1), &Device::Cpu)
                            .unwrap();
                    (n, t.broadcast_mul(&mask).unwrap())
                } else {
                    (n, t)
                }
            })
            .collect();
        let dir = tmp.path().join(format!("L{}H{}", h.layer, h.head));
        checkpoint::save(&dir, &cfg, &tensors).unwrap();
        let edited = Transformer::load(&dir, &Device::Cpu).unwrap();
        let m = hyperlens_model::evaluate(&Evaluator::new(edited).unwrap(), &problems, 40).unwrap();
        assert!(
            (m.loss - h.loss).abs() < 1e-5 && m.accuracy == h.accuracy,
            "L{}H{}: {} / {} vs {} / {}",
            h.layer,
            h.head,
            m.loss,
            m.accuracy,
            h.loss,
            h.accuracy
        );
    }
    assert!(r.heads.iter().any(|h| (h.loss - r.base.loss).abs() > 1e-4));
    let one = problems.slice(0, 1);
    let mut single = || -> Box<dyn Iterator<Item = hyperlens_probe::Result<_>> + '_> {
        Box::new(std::iter::once(Ok(one.clone())))
    };
    let r = head_ablation(&ev, &mut single, Ablation::Mean, |_, _| {
        ControlFlow::Continue(())
    })
    .unwrap();
    for h in &r.heads {
        assert!(
            (h.loss - r.base.loss).abs() < 1e-5,
            "L{}H{}",
            h.layer,
            h.head
        );
    }
}

/// The transplant's controls behave: the identity transplant leaves the logits exactly, and
/// another rule's code, or a random one, at any layer moves them.
#[test]
fn transplants_move_the_logits_and_the_identity_does_not() {
    use hyperlens_model::Config;
    use hyperlens_probe::latent_transplant;
    let cfg = Config {
        n_layers: 3,
        d_model: 24,
        n_heads: 4,
        d_head: 4,
        d_mlp: 16,
        ..Config::sraven_base(Mixer::Hyla)
    };
    let (init, _) = Transformer::init(&cfg, 12, &Device::Cpu).unwrap();
    // At initialisation the biases are zero, so layer 0's query (a zero token) is zero and its
    // codes are the relative-position bias alone, the same in every problem: give every
    // parameter some noise, as training would.
    let tensors = init
        .named_tensors()
        .iter()
        .map(|(n, t)| {
            let k = t.elem_count();
            let v: Vec<f32> = (0..k)
                .map(|i| 0.3 * (i as f32 * 0.731 + 0.2).sin())
                .collect();
            let noise = candle_core::Tensor::from_vec(v, t.dims(), &Device::Cpu).unwrap();
            (n.clone(), (t + noise).unwrap())
        })
        .collect();
    let model = Transformer::from_tensors(&cfg, tensors, &Device::Cpu).unwrap();
    let split = Split::named("paper-seed0").unwrap();
    let id = sample(&split, Set::Id, 96, 1, true).unwrap();
    let ood = sample(&split, Set::Ood, 40, 2, true).unwrap();
    let model = hyperlens_model::Evaluator::new(model).unwrap();
    let rows = latent_transplant(&model, &id, &ood, 3, 16, 0, go).unwrap();
    assert_eq!(rows.len(), 7 * 3);
    for r in &rows {
        match r.kind.as_str() {
            "identity" => {
                assert_eq!(r.max_logit_change, 0.0, "layer {}", r.layer);
                assert_eq!((r.unchanged, r.n), (40, 40));
            }
            kind => assert!(r.max_logit_change > 1e-6, "{kind} layer {}: {r:?}", r.layer),
        }
        assert_eq!(r.to_donor + r.elsewhere + r.unchanged, r.n);
    }
    let permuted = sample(&split, Set::Ood, 8, 2, false).unwrap();
    assert!(latent_transplant(&model, &id, &permuted, 3, 16, 0, go).is_err());
}

/// Feature-swap pairs differ from their clean problems only in the slot's context tokens and take
/// the donor's answer; activation patching leaves what cannot reach the output at exactly 0,
/// restores everything when the whole residual stream is the clean one, and agrees with a patch
/// written here by hand.
#[test]
fn activation_patching_scores_follow_the_forward_pass() {
    use hyperlens_model::hooks::HookFn;
    use hyperlens_model::Config;
    use hyperlens_probe::{activation_patching, feature_swap_pairs, patching_table};
    let cfg = Config {
        n_layers: 2,
        d_model: 24,
        n_heads: 3,
        d_head: 4,
        d_mlp: 16,
        ..Config::sraven_base(Mixer::Softmax)
    };
    let (model, _) = Transformer::init(&cfg, 21, &Device::Cpu).unwrap();
    let split = Split::named("paper-seed0").unwrap();
    let set = sample(&split, Set::Ood, 24, 5, true).unwrap();
    let slot = 2;
    let pairs = feature_swap_pairs(&set, slot).unwrap();
    assert_eq!(pairs.len(), 24);
    for (k, &(i, j)) in pairs.source.iter().enumerate() {
        assert_ne!(i, j);
        assert_eq!(pairs.clean_answer[k], set.y[[i, slot]] as usize);
        assert_eq!(pairs.corrupted_answer[k], set.y[[j, slot]] as usize);
        assert_ne!(pairs.clean_answer[k], pairs.corrupted_answer[k]);
        for p in 0..cfg.n_tokens {
            let same = pairs.clean.slice(ndarray::s![k, p, ..])
                == pairs.corrupted.slice(ndarray::s![k, p, ..]);
            let from_donor =
                pairs.corrupted.slice(ndarray::s![k, p, ..]) == set.x.slice(ndarray::s![j, p, ..]);
            if p < 32 && p % 4 == slot {
                assert!(from_donor, "pair {k} position {p}");
            } else {
                assert!(same, "pair {k} position {p}");
            }
        }
    }
    let mut passes = 0;
    let ev = Evaluator::new(model.clone()).unwrap();
    let r = activation_patching(&ev, &pairs, 10, |d, _| {
        passes = d;
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(passes, 3 * (2 + 2 * (3 * 36 + 3)));
    let (t, f) = (cfg.n_tokens, cfg.n_outputs);
    assert!((r.clean_logit_diff - r.corrupted_logit_diff).abs() > 1e-4);
    // The last layer's attention and MLP outputs at a non-output position reach no logit.
    let last = cfg.n_layers - 1;
    let mlp = r.mlp_out.as_ref().unwrap();
    for p in 0..t - f {
        assert_eq!(r.attn_out[[last, p]], 0.0, "attn_out L{last} pos {p}");
        assert_eq!(mlp[[last, p]], 0.0, "mlp_out L{last} pos {p}");
    }
    // Layer 0's stream differs only at the swapped tokens.
    for p in 0..t {
        if p >= 32 || p % 4 != slot {
            assert_eq!(r.resid_pre[[0, p]], 0.0, "resid_pre L0 pos {p}");
        }
    }
    // Patching the last layer's MLP output at the slot's own output position: by hand.
    struct Put(candle_core::Tensor);
    impl HookFn for Put {
        fn wants(&self, name: &str) -> bool {
            name == "blocks.1.hook_mlp_out"
        }
        fn call(
            &mut self,
            _: &str,
            v: &candle_core::Tensor,
        ) -> hyperlens_model::Result<Option<candle_core::Tensor>> {
            let q = 32 + 2;
            let parts = [
                v.narrow(1, 0, q)?,
                self.0.narrow(1, q, 1)?,
                v.narrow(1, q + 1, 36 - q - 1)?,
            ];
            Ok(Some(candle_core::Tensor::cat(&parts, 1)?))
        }
    }
    let ld = |x: &ndarray::Array3<f32>, hook: &mut dyn HookFn| -> f64 {
        let logits = model
            .run_with_hooks(&batch_tensor(x, &Device::Cpu).unwrap(), hook)
            .unwrap();
        let v: Vec<Vec<Vec<f32>>> = logits.to_vec3().unwrap();
        (0..pairs.len())
            .map(|k| {
                f64::from(v[k][slot][pairs.clean_answer[k]])
                    - f64::from(v[k][slot][pairs.corrupted_answer[k]])
            })
            .sum::<f64>()
            / pairs.len() as f64
    };
    let (_, cache) = model
        .run_with_cache(
            &batch_tensor(&pairs.clean, &Device::Cpu).unwrap(),
            &["blocks.1.hook_mlp_out".to_string()],
        )
        .unwrap();
    let mut none = hyperlens_model::hooks::Cache::default();
    let clean = ld(&pairs.clean, &mut none);
    let corrupted = ld(&pairs.corrupted, &mut none);
    let patched = ld(&pairs.corrupted, &mut Put(cache[0].1.clone()));
    let by_hand = (patched - corrupted) / (clean - corrupted);
    assert!((r.clean_logit_diff - clean).abs() < 1e-5);
    assert!(
        (mlp[[1, 34]] - by_hand).abs() < 1e-4,
        "{} vs {by_hand}",
        mlp[[1, 34]]
    );
    let csv = patching_table(&r).unwrap().to_csv();
    assert_eq!(csv.lines().count(), 1 + 3 * 2 * 36 + 2 * 3);
    // Errors: a permuted set, a slot outside the answer.
    let permuted = sample(&split, Set::Ood, 8, 2, false).unwrap();
    assert!(feature_swap_pairs(&permuted, 0).is_err());
    assert!(feature_swap_pairs(&set, 4).is_err());
}

/// Direct logit attribution: the parts (embedding, every head, every attention bias, every MLP and
/// the constant) add up to the model's answer logit, raw and centred, on the shipped softmax
/// checkpoint; and the trained model's right answer sits above the mean logit.
#[test]
fn direct_logit_attributions_add_up_to_the_answer_logit() {
    use hyperlens_probe::{direct_logit_attribution, dla_table};
    let dir = manifest_dir().join("../../data/checkpoints/sraven-softmax");
    let model = Transformer::load(&dir, &Device::Cpu).unwrap();
    let split = Split::named("paper-seed0").unwrap();
    let set = sample(&split, Set::Ood, 24, 9, false).unwrap();
    let ev = Evaluator::new(model.clone()).unwrap();
    let r = direct_logit_attribution(&ev, &set, &[0, 1, 2, 3], 10, go).unwrap();
    assert_eq!(r.n, 24 * 4);
    assert!(r.max_error < 1e-4, "{}", r.max_error);
    let sum = |heads: &ndarray::Array2<f64>, rest: &[&[f64]], scalars: &[f64]| {
        heads.sum()
            + rest.iter().map(|v| v.iter().sum::<f64>()).sum::<f64>()
            + scalars.iter().sum::<f64>()
    };
    let total = sum(&r.heads, &[&r.mlp, &r.attn_bias], &[r.embed, r.constant]);
    assert!((total - r.logit).abs() < 1e-4, "{total} vs {}", r.logit);
    let total = sum(
        &r.heads_centred,
        &[&r.mlp_centred, &r.attn_bias_centred],
        &[r.embed_centred, r.constant_centred],
    );
    assert!((total - r.logit_centred).abs() < 1e-4);
    assert!(r.logit_centred > 1.0, "{}", r.logit_centred);
    // The mean logit over the set, from the ordinary forward pass.
    let x = batch_tensor(&set.x, &Device::Cpu).unwrap();
    let logits: Vec<Vec<Vec<f32>>> = model.forward(&x, false).unwrap().logits.to_vec3().unwrap();
    let mean: f64 = (0..24)
        .flat_map(|i| (0..4).map(move |f| (i, f)))
        .map(|(i, f)| f64::from(logits[i][f][set.y[[i, f]] as usize]))
        .sum::<f64>()
        / 96.0;
    assert!((mean - r.logit).abs() < 1e-4, "{mean} vs {}", r.logit);
    assert_eq!(
        dla_table(&r).unwrap().to_csv().lines().count(),
        1 + 1 + 16 * 4 + 2 * 4 + 1
    );
    assert!(direct_logit_attribution(&ev, &set, &[4], 10, go).is_err());
    assert!(direct_logit_attribution(&ev, &set.slice(0, 0), &[0], 10, go).is_err());
}

/// `patch acts`' data files: the arrays of `activation_patching.npz` under the names of
/// `hyperlens_io::keys::activation_patching`, in order, with the report's values; the CSV and the
/// JSON beside them.
#[test]
fn activation_patching_files_use_the_shared_array_names() {
    use hyperlens_io::keys::activation_patching as keys;
    use hyperlens_model::Config;
    use hyperlens_probe::{activation_patching, feature_swap_pairs, write_activation_patching};
    let cfg = Config {
        n_layers: 1,
        d_model: 16,
        n_heads: 2,
        d_head: 4,
        d_mlp: 8,
        ..Config::sraven_base(Mixer::Softmax)
    };
    let (model, _) = Transformer::init(&cfg, 5, &Device::Cpu).unwrap();
    let ev = Evaluator::new(model).unwrap();
    let split = Split::named("paper-seed0").unwrap();
    let set = sample(&split, Set::Ood, 6, 1, true).unwrap();
    let pairs = feature_swap_pairs(&set, 0).unwrap();
    let r = activation_patching(&ev, &pairs, 6, go).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let run = hyperlens_probe::PatchRun {
        producer: "test",
        checkpoint: tmp.path(),
        mixer: cfg.mixer,
    };
    let problems =
        hyperlens_io::sidecars::ProblemsSource::sampled("paper-seed0", "ood", 6, 1, Some(true));
    write_activation_patching(tmp.path(), &run, &problems, &pairs, &r).unwrap();
    let mut z =
        NpzReader::new(File::open(tmp.path().join("activation_patching.npz")).unwrap()).unwrap();
    let names: Vec<String> = z
        .names()
        .unwrap()
        .into_iter()
        .map(|n| n.trim_end_matches(".npy").to_string())
        .collect();
    assert_eq!(
        names,
        [
            keys::RESID_PRE,
            keys::ATTN_OUT,
            keys::MLP_OUT,
            keys::HEAD_OUT,
            keys::SOURCE,
            keys::CLEAN_ANSWER,
            keys::CORRUPTED_ANSWER
        ]
    );
    let head: Array2<f64> = z.by_name(keys::HEAD_OUT).unwrap();
    assert_eq!(head, r.head_out);
    let source: Array2<i64> = z.by_name(keys::SOURCE).unwrap();
    assert_eq!(source.dim(), (pairs.len(), 2));
    assert_eq!(source[[0, 1]], pairs.source[0].1 as i64);
    let text = std::fs::read_to_string(tmp.path().join("activation_patching.json")).unwrap();
    let meta: hyperlens_io::sidecars::ActivationPatchingSidecar<Mixer> =
        serde_json::from_str(&text).unwrap();
    assert_eq!(meta.n_pairs, pairs.len());
    assert_eq!(meta.producer, "test");
    assert_eq!(meta.mixer, cfg.mixer);
    assert_eq!(meta.source, problems);
    assert_eq!(meta.clean_logit_diff, r.clean_logit_diff);
    assert!(meta.arrays[keys::CORRUPTED_ANSWER].starts_with("[N]"));
    // The typed file is the layout hyperlens has always written: keys in alphabetical order.
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let names: Vec<&String> = v.as_object().unwrap().keys().collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(text, serde_json::to_string_pretty(&v).unwrap() + "\n");
    let csv = std::fs::read_to_string(tmp.path().join("activation_patching.csv")).unwrap();
    assert_eq!(csv, hyperlens_probe::patching_table(&r).unwrap().to_csv());
}

/// `cache_activations` through the evaluator: one array per matched hook and the logits, cut to
/// the asked positions, and the logits those of the evaluator's own pass; batches that do not add
/// up to the announced count are refused.
#[test]
fn cached_activations_follow_the_evaluator() {
    use hyperlens_io::keys::cache as keys;
    use hyperlens_model::Config;
    use hyperlens_probe::{cache_activations, CacheParams};
    let cfg = Config {
        n_layers: 2,
        d_model: 16,
        n_heads: 2,
        d_head: 4,
        d_mlp: 8,
        ..Config::sraven_base(Mixer::Hyla)
    };
    let (model, _) = Transformer::init(&cfg, 8, &Device::Cpu).unwrap();
    let ev = Evaluator::new(model).unwrap();
    let split = Split::named("paper-seed0").unwrap();
    let set = sample(&split, Set::Ood, 10, 2, false).unwrap();
    let params = CacheParams {
        hooks: vec![
            "blocks.*.hook_resid_post".into(),
            "blocks.1.attn.hook_pattern".into(),
        ],
        positions: Some(vec![35, 3]),
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("acts.npz");
    let batches = (0..10)
        .step_by(4)
        .map(|s| Ok(set.slice(s, (s + 4).min(10)).x));
    let mut seen = Vec::new();
    let summary = cache_activations(&ev, batches, 10, &params, &out, |d| seen.push(d)).unwrap();
    assert_eq!(seen, [4, 8, 10]);
    let names: Vec<&str> = summary.arrays.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "blocks.0.hook_resid_post",
            "blocks.1.attn.hook_pattern",
            "blocks.1.hook_resid_post",
            keys::LOGITS
        ]
    );
    let mut z = NpzReader::new(File::open(&out).unwrap()).unwrap();
    let pattern: ndarray::Array4<f32> = z.by_name("blocks.1.attn.hook_pattern").unwrap();
    assert_eq!(pattern.dim(), (10, cfg.n_heads, 2, cfg.n_tokens));
    let logits: ndarray::Array3<f32> = z.by_name(keys::LOGITS).unwrap();
    let own = ev.logits(set.x.view()).unwrap();
    let scale = own.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
    for (a, b) in logits.iter().zip(&own) {
        assert!((a - b).abs() <= 1e-5 * scale, "{a} vs {b}");
    }
    let short = (0..8).step_by(4).map(|s| Ok(set.slice(s, s + 4).x));
    let e = cache_activations(&ev, short, 10, &params, &out, |_| {}).unwrap_err();
    assert!(e.to_string().contains("not the announced 10"), "{e}");
}

/// Every long function of the crate stops at the step where its progress callback breaks, with
/// `ProbeError::Interrupted`, having made exactly that many steps, and leaves no output file.
#[test]
fn a_breaking_progress_callback_stops_each_long_function() {
    use hyperlens_model::Config;
    use hyperlens_probe::{
        activation_patching, direct_logit_attribution, feature_swap_pairs, head_ablation,
        latent_transplant, Ablation, ProbeError,
    };
    let cfg = Config {
        n_layers: 2,
        d_model: 16,
        n_heads: 2,
        d_head: 4,
        d_mlp: 8,
        ..Config::sraven_base(Mixer::Softmax)
    };
    let (model, _) = Transformer::init(&cfg, 3, &Device::Cpu).unwrap();
    let ev = Evaluator::new(model).unwrap();
    let split = Split::named("paper-seed0").unwrap();
    let set = sample(&split, Set::Ood, 12, 2, true).unwrap();
    let id = sample(&split, Set::Id, 12, 3, true).unwrap();
    // Breaks at the third step; counts the calls.
    fn stop_at_3(calls: &mut usize) -> impl FnMut(usize, usize) -> ControlFlow<()> + '_ {
        move |done, _total| {
            *calls += 1;
            assert_eq!(done, *calls, "steps are counted from 1");
            if done == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    }
    let interrupted = |r: Result<(), ProbeError>, calls: usize, what: &str| {
        assert!(matches!(r, Err(ProbeError::Interrupted)), "{what}: {r:?}");
        assert_eq!(calls, 3, "{what} went on after the break");
    };

    let mut calls = 0;
    let pairs = feature_swap_pairs(&set, 1).unwrap();
    let r = activation_patching(&ev, &pairs, 4, |d, _| {
        // the clean and corrupted passes count 2 at once
        calls = d;
        if d >= 3 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    interrupted(r.map(|_| ()), calls, "activation_patching");

    let mut calls = 0;
    let r = direct_logit_attribution(&ev, &set, &[0], 2, stop_at_3(&mut calls));
    interrupted(r.map(|_| ()), calls, "direct_logit_attribution");

    let mut calls = 0;
    let r = latent_transplant(&ev, &id, &set, 1, 4, 0, stop_at_3(&mut calls));
    interrupted(r.map(|_| ()), calls, "latent_transplant");

    let mut calls = 0;
    let mut stream = || -> Box<dyn Iterator<Item = hyperlens_probe::Result<_>>> {
        Box::new((0..12).step_by(4).map(|s| Ok(set.slice(s, s + 4))))
    };
    let r = head_ablation(&ev, &mut stream, Ablation::Mean, stop_at_3(&mut calls));
    interrupted(r.map(|_| ()), calls, "head_ablation");

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("codes.npz");
    let mut calls = 0;
    let batches = (0..12).step_by(2).map(|s| Ok(set.slice(s, s + 2)));
    let params = ProbeParams {
        site: Site::Paper,
        layers: None,
    };
    let r = {
        let mut stop = stop_at_3(&mut calls);
        extract(&ev, batches, 12, &params, &out, ProbeMeta::default(), |d| {
            stop(d / 2, 0)
        })
    };
    interrupted(r.map(|_| ()), calls, "extract");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "an interrupted extraction leaves no file"
    );
}

/// The tiny Llama fixture (word-level tokenizer.json that prepends `<s>`) with a hand-made prompt
/// set: two labelled factors, answers, both splits.
fn tiny_llama_prompts() -> (
    PathBuf,
    hyperlens_model::lm::LanguageModel,
    hyperlens_model::lm::LmTokenizer,
    hyperlens_tasks::prompts::PromptSet,
) {
    let dir = manifest_dir().join("../model/tests/fixtures/lm/tiny-llama-hf");
    let model = hyperlens_model::lm::load(&dir, &Device::Cpu).expect("tiny llama");
    let tok = hyperlens_model::lm::require_tokenizer(&dir).expect("its tokenizer.json");
    let line = |x: &str, y: &str, x2: &str, op: &str, answer: &str, split: &str| {
        format!(
            r#"{{"segments": [{{"text": "Q:", "role": "sep"}}, {{"text": "{x}", "role": "x"}}, {{"text": "A:", "role": "sep"}}, {{"text": "{y}", "role": "y"}}, {{"text": "Q:", "role": "sep"}}, {{"text": "{x2}", "role": "x"}}, {{"text": "A:", "role": "sep"}}], "labels": {{"op": "{op}", "size": "s"}}, "answer": "{answer}", "split": "{split}"}}"#
        )
    };
    let items = [
        line("cat", "dog", "sun big", "copy", "moon", "train"),
        line("one", "two", "three", "next", "four", "train"),
        line("red", "blue", "the small tree", "copy", "sky", "test"),
        line("up", "down", "left", "next", "right", "test"),
        line("I", "you", "we", "copy", "they", "train"),
    ];
    let set =
        hyperlens_tasks::prompts::PromptSet::from_json_items(&items, "test").expect("prompts");
    (dir, model, tok, set)
}

#[test]
fn prompt_codes_are_the_lens_at_the_resolved_sites_with_the_behaviour() {
    use hyperlens_io::keys::lm_codes as k;
    use hyperlens_model::lm::{CodeForm, CodeRequest};
    use hyperlens_probe::{extract_prompts, PromptProbeParams, PromptProbeSources};

    let (dir, model, tok, set) = tiny_llama_prompts();
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("codes.npz");
    let params = PromptProbeParams {
        sites: "query: last; keys: x, y#0".parse().expect("sites"),
        layers: None,
        form: CodeForm::Pattern,
        batch: 2,
        prepend_bos: None,
        label_factor: Some("op".into()),
        resid: true,
        shuffle_weights: None,
    };
    let sources = PromptProbeSources {
        model: dir.display().to_string(),
        model_kind: "hf-llama".into(),
        prompts: "test".into(),
    };
    let s = extract_prompts(&model, &tok, &set, &params, &sources, &out, go).expect("extract");
    assert_eq!((s.n_prompts, s.n_answered), (5, 5));
    let mut z = NpzReader::new(File::open(&out).unwrap()).unwrap();
    let codes: Array5<f32> = z.by_name(k::CODES).unwrap();
    let qp: Array2<i64> = z.by_name(k::QUERY_POS).unwrap();
    let kp: Array2<i64> = z.by_name(k::KEY_POS).unwrap();
    let label: Array1<i64> = z.by_name(k::LABEL).unwrap();
    let split: Array1<i64> = z.by_name(k::SPLIT).unwrap();
    let target: Array1<i64> = z.by_name(k::TARGET).unwrap();
    let pred: Array1<i64> = z.by_name(k::PREDICTION).unwrap();
    let correct: Array1<bool> = z.by_name(k::CORRECT).unwrap();
    let resid: ndarray::Array4<f32> = z.by_name(k::RESID).unwrap();
    // <s> Q: cat A: dog Q: sun big A:  -> query 8 (last), keys: x's last tokens 2 and 7, y#0's 4.
    assert_eq!(qp.row(0).to_vec(), vec![8]);
    assert_eq!(kp.row(0).to_vec(), vec![2, 7, 4]);
    // <s> Q: red A: blue Q: the small tree A: -> query 9, keys 2, 8, 4.
    assert_eq!(qp.row(2).to_vec(), vec![9]);
    assert_eq!(kp.row(2).to_vec(), vec![2, 8, 4]);
    assert_eq!(label.to_vec(), vec![0, 1, 0, 1, 0]);
    assert_eq!(split.to_vec(), vec![0, 0, 1, 1, 0]);
    let (l, h) = (model.n_layers(), model.n_heads());
    assert_eq!(codes.dim(), (5, l, h, 1, 3));
    let mut n_correct = 0;
    for (i, p) in set.prompts.iter().enumerate() {
        let texts: Vec<&str> = p.segments.iter().map(|s| s.text.as_str()).collect();
        let (ids, _) = tok.encode_segments(&texts, None).unwrap();
        let q = vec![qp[[i, 0]] as usize];
        let kk: Vec<usize> = kp.row(i).iter().map(|&x| x as usize).collect();
        // The prompt alone, through the lens: the file's row (batched with another) equals it.
        let one = model
            .latent_codes(&CodeRequest {
                tokens: std::slice::from_ref(&ids),
                query: std::slice::from_ref(&q),
                keys: std::slice::from_ref(&kk),
                layers: None,
                form: CodeForm::Pattern,
                last_logits: false,
                resid: true,
                first_index: 0,
            })
            .unwrap();
        let row = codes.index_axis(ndarray::Axis(0), i);
        let diff = (&row - &one.codes.index_axis(ndarray::Axis(0), 0)).mapv(f32::abs);
        assert!(diff.iter().all(|&d| d < 1e-6), "prompt {i}: codes differ");
        let rd = (&resid.index_axis(ndarray::Axis(0), i)
            - &one.resid.as_ref().unwrap().index_axis(ndarray::Axis(0), 0))
            .mapv(f32::abs);
        assert!(rd.iter().all(|&d| d < 1e-4), "prompt {i}: resid differs");
        // The behaviour: the full forward's argmax after the last token, against the answer.
        let x = candle_core::Tensor::from_slice(&ids, (1, ids.len()), &Device::Cpu).unwrap();
        let logits = model.forward(&x, false).unwrap().logits;
        let last = logits
            .i((0, ids.len() - 1))
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let argmax = hyperlens_probe::extract::argmax_rows(&last, last.len())[0];
        assert_eq!(pred[i], i64::from(argmax), "prompt {i}");
        let answer = tok
            .encode(p.answer.as_deref().unwrap(), Some(false))
            .unwrap();
        assert_eq!(target[i], i64::from(answer[0]), "prompt {i}");
        assert_eq!(correct[i], target[i] == pred[i]);
        n_correct += usize::from(correct[i]);
    }
    assert_eq!(s.accuracy, Some(n_correct as f64 / 5.0));
    let side: hyperlens_io::sidecars::LmCodesSidecar =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("codes.json")).unwrap())
            .unwrap();
    assert_eq!(side.label_factor, "op");
    assert_eq!(side.factors[0].values, vec!["copy", "next"]);
    assert_eq!(side.sites, "query: last; keys: x, y#0");
    assert!(side.prepend_bos && side.has_resid);
    assert_eq!(side.layers, (0..l).collect::<Vec<_>>());
}

#[test]
fn prompt_extraction_refuses_bad_sites_and_stops_leaving_no_file() {
    use hyperlens_model::lm::CodeForm;
    use hyperlens_probe::{extract_prompts, ProbeError, PromptProbeParams, PromptProbeSources};

    let (dir, model, tok, set) = tiny_llama_prompts();
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("codes.npz");
    let sources = PromptProbeSources {
        model: dir.display().to_string(),
        model_kind: "hf-llama".into(),
        prompts: "test".into(),
    };
    let params = |sites: &str| PromptProbeParams {
        sites: sites.parse().expect("sites"),
        layers: None,
        form: CodeForm::Pattern,
        batch: 2,
        prepend_bos: None,
        label_factor: None,
        resid: false,
        shuffle_weights: None,
    };
    let err = |p: &PromptProbeParams| {
        extract_prompts(&model, &tok, &set, p, &sources, &out, go)
            .unwrap_err()
            .to_string()
    };
    let e = err(&params("query: last; keys: demo_output"));
    assert!(e.contains("prompt 0") && e.contains("demo_output"), "{e}");
    // A key after its query: the model is causal.
    let e = err(&params("query: x#0; keys: last"));
    assert!(e.contains("0") && e.contains("after"), "{e}");
    let mut p = params("query: last; keys: x");
    p.label_factor = Some("colour".into());
    let e = err(&p);
    assert!(e.contains("colour") && e.contains("op, size"), "{e}");
    // Stopped after the first batch: an error, and no file at all.
    let r = extract_prompts(
        &model,
        &tok,
        &set,
        &params("query: last; keys: x"),
        &sources,
        &out,
        |d, _| {
            if d >= 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        },
    );
    assert!(matches!(r, Err(ProbeError::Interrupted)));
    assert!(!out.exists() && !tmp.path().join("codes.json").exists());
}
