//! `hyperlens import jax` on the paper's JAX export of a softmax model (the committed model-test
//! fixture): the tensors land where the flax parameters say, the result equals the shipped import of
//! the same export, and the imported model solves SRAVEN far above chance.

use ndarray::{ArrayD, Axis};

use crate::util::{array, entries, hyperlens, json, repo_path, s, safetensors, tempdir, values};

fn fixture() -> std::path::PathBuf {
    repo_path("crates/model/tests/fixtures/paper-jax/softmax_params.npz")
}

#[test]
fn import_places_every_flax_parameter_and_the_model_solves_sraven() {
    let tmp = tempdir();
    let out = tmp.path().join("softmax");
    let params = fixture();
    let r = hyperlens(&[
        "import",
        "jax",
        "--params",
        s(&params),
        "--mixer",
        "softmax",
        "--out",
        s(&out),
    ]);
    let text = r.success();
    let weights = safetensors(&out.join("model.safetensors"));
    let n_params: usize = weights.values().map(|t| t.elem_count()).sum();
    assert_eq!(n_params, 402_824);
    assert_eq!(
        text.trim(),
        format!(
            "imported {} -> {}: mixer softmax, 4 layers, D 128, H 16, d 4, D_mlp 256, {n_params} parameters",
            params.display(),
            out.display()
        )
    );
    assert_eq!(entries(&out), ["config.json", "model.safetensors"]);

    // Tensors from the flax parameters: the embedding as it is, the query kernel [D, H, d] with
    // its head axis first.
    let w_e: ArrayD<f32> = array(&params, "embedding/kernel");
    let (shape, v) = values(&weights["embed.W_E"]);
    assert_eq!(shape, w_e.shape());
    assert!(v.iter().zip(w_e.iter()).all(|(a, b)| *a == f64::from(*b)));
    let q: ArrayD<f32> = array(&params, "transformer_block_1/sequence_mixer/query/kernel");
    let q = q.permuted_axes(vec![1, 0, 2]);
    let (shape, v) = values(&weights["blocks.1.attn.W_Q"]);
    assert_eq!(shape, q.shape());
    assert!(v.iter().zip(q.iter()).all(|(a, b)| *a == f64::from(*b)));
    assert_eq!(q.len_of(Axis(0)), 16);

    // The same export was imported into data/checkpoints/paper-jax-softmax-seed1.
    let shipped = repo_path("data/checkpoints/paper-jax-softmax-seed1");
    assert_eq!(
        json(&out.join("config.json")),
        json(&shipped.join("config.json"))
    );
    let theirs = safetensors(&shipped.join("model.safetensors"));
    assert_eq!(weights.len(), theirs.len());
    for (name, t) in &weights {
        assert_eq!(values(t), values(&theirs[name]), "{name}");
    }

    // Trained by the paper's code on paper-seed1 (55.8 % OOD on 51,200 problems); chance is 8^-4.
    let e = hyperlens(&[
        "eval",
        "--checkpoint",
        s(&out),
        "--split",
        "paper-seed1",
        "--n",
        "128",
        "--json",
    ]);
    let m: serde_json::Value = serde_json::from_str(e.success()).unwrap();
    let acc = m["accuracy"].as_f64().unwrap();
    assert!(acc > 0.35, "imported model accuracy {acc}");

    // --force overwrites; the mixer given is the one recorded.
    hyperlens(&[
        "import",
        "jax",
        "--params",
        s(&params),
        "--mixer",
        "linear",
        "--out",
        s(&out),
        "--force",
    ])
    .success();
    assert_eq!(json(&out.join("config.json"))["mixer"], "linear");
}

#[test]
fn import_failures_name_the_file() {
    let tmp = tempdir();
    let out = tmp.path().join("ckpt");
    let params = fixture();
    let p = s(&params);
    // An existing output without --force is left alone.
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep"), "x").unwrap();
    hyperlens(&[
        "import",
        "jax",
        "--params",
        p,
        "--mixer",
        "softmax",
        "--out",
        s(&out),
    ])
    .failure(&[s(&out), "already exists (use --force to overwrite)"]);
    assert_eq!(entries(&out), ["keep"]);
    let new = tmp.path().join("new");
    let missing = tmp.path().join("missing.npz");
    hyperlens(&[
        "import",
        "jax",
        "--params",
        s(&missing),
        "--mixer",
        "softmax",
        "--out",
        s(&new),
    ])
    .failure(&[s(&missing)]);
    let readme = repo_path("README.md");
    hyperlens(&[
        "import",
        "jax",
        "--params",
        s(&readme),
        "--mixer",
        "softmax",
        "--out",
        s(&new),
    ])
    .failure(&[s(&readme), "not a readable .npz"]);
    hyperlens(&[
        "import",
        "jax",
        "--params",
        p,
        "--mixer",
        "softmax",
        "--out",
        s(&new),
        "--n-outputs",
        "40",
    ])
    .failure(&["n_outputs", "40"]);
    assert!(!new.exists());
}

#[test]
fn import_usage_errors() {
    let params = fixture();
    hyperlens(&[
        "import",
        "jax",
        "--params",
        s(&params),
        "--mixer",
        "nope",
        "--out",
        "x",
    ])
    .usage_error(&[
        "invalid value 'nope' for '--mixer <MIXER>'",
        "softmax, linear, hyla",
    ]);
    hyperlens(&["import", "jax", "--mixer", "softmax", "--out", "x"])
        .usage_error(&["--params <PARAMS>"]);
    hyperlens(&["import", "flax"]).usage_error(&["unrecognized subcommand 'flax'"]);
}
