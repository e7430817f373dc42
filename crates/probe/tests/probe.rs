//! Integration tests of latent-code extraction on a real checkpoint trained by the paper's JAX code.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;

use candle_core::{Device, IndexOp};
use hyperlens_model::eval::batch_tensor;
use hyperlens_model::import::import_jax_npz;
use hyperlens_model::{Mixer, Transformer};
use hyperlens_probe::{extract, ProbeMeta, ProbeParams, Site};
use hyperlens_tasks::sraven::{sample, Set, Split};
use ndarray::{Array1, Array2, Array5};
use ndarray_npy::NpzReader;

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
        &model,
        batches,
        n,
        &params,
        &out,
        ProbeMeta::default(),
        |_| {},
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
    assert_eq!(meta.mixer, "hyla");
    assert_eq!(meta.normalisation, "rms_head");
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
    extract(
        &model,
        [Ok(problems.clone())],
        n,
        &params,
        &out,
        ProbeMeta::default(),
        |_| {},
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
        &model,
        [Ok(problems)],
        n + 1,
        &params,
        &bad,
        ProbeMeta::default(),
        |_| {},
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
    let r = head_ablation(&model, &mut source, Ablation::Zero, |d, t| {
        passes.push((d, t))
    })
    .unwrap();
    assert_eq!(passes.last(), Some(&(7, 7)));
    assert_eq!(r.heads.len(), 6);
    let base = hyperlens_model::evaluate(&model, &problems, 40).unwrap();
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
        let m = hyperlens_model::evaluate(&edited, &problems, 40).unwrap();
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
    let r = head_ablation(&model, &mut single, Ablation::Mean, |_, _| {}).unwrap();
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
    let (model, _) = Transformer::init(&cfg, 12, &Device::Cpu).unwrap();
    let split = Split::named("paper-seed0").unwrap();
    let id = sample(&split, Set::Id, 96, 1, true).unwrap();
    let ood = sample(&split, Set::Ood, 40, 2, true).unwrap();
    let rows = latent_transplant(&model, &id, &ood, 3, 16, 0).unwrap();
    assert_eq!(rows.len(), 4 * 3);
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
    assert!(latent_transplant(&model, &id, &permuted, 3, 16, 0).is_err());
}
