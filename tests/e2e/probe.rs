//! `hyperlens probe` on a tiny softmax SRAVEN model at the paper's site: the labels, inputs and
//! targets against the problems `tasks sample` writes, the predictions against `eval`'s, the codes
//! the same from a file or a sampled stream and per layer, and its errors.

use hyperlens_model::Mixer;
use ndarray::{ArrayD, Axis};

use crate::util::{
    array, close, hyperlens, in_range, json, s, sraven_checkpoint, tempdir, Csv, TINY_HEADS,
    TINY_LAYERS,
};

const N: usize = 30;

#[test]
fn probe_codes_and_labels_agree_with_the_problems_and_with_eval() {
    let tmp = tempdir();
    let ckpt = tmp.path().join("tiny");
    sraven_checkpoint(&ckpt, Mixer::Softmax, 3);
    let c = s(&ckpt);
    let n = N.to_string();
    let sampled = [
        "--split",
        "paper-seed0",
        "--set",
        "ood",
        "--n",
        &n,
        "--seed",
        "2",
        "--unpermuted",
    ];
    let codes_path = tmp.path().join("codes.npz");
    let mut args = vec![
        "probe",
        "--checkpoint",
        c,
        "--batch",
        "7",
        "--out",
        s(&codes_path),
    ];
    args.extend(sampled);
    let stdout = hyperlens(&args).success().to_string();
    let problems = tmp.path().join("p.npz");
    let mut args = vec!["tasks", "sample", "--out", s(&problems)];
    args.extend(sampled);
    hyperlens(&args).success();

    // Codes [N, L, H, 1 query, 2 keys]: softmax attention weights.
    let codes: ArrayD<f32> = array(&codes_path, "codes");
    assert_eq!(codes.shape(), &[N, TINY_LAYERS, TINY_HEADS, 1, 2]);
    in_range(
        "codes",
        &codes.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        0.0,
        1.0,
    );
    // Labels: the rule of slot 3; inputs: the values of tokens 27 and 31; target: the answer of
    // slot 3 (the problems are unpermuted).
    let x: ArrayD<u8> = array(&problems, "x");
    let y: ArrayD<i64> = array(&problems, "y");
    let rules: ArrayD<i64> = array(&problems, "rules");
    assert_eq!(array::<i64>(&codes_path, "rules"), rules);
    let label: ArrayD<i64> = array(&codes_path, "label");
    let inputs: ArrayD<i64> = array(&codes_path, "inputs");
    let target: ArrayD<i64> = array(&codes_path, "target");
    let prediction: ArrayD<i64> = array(&codes_path, "prediction");
    let correct: ArrayD<bool> = array(&codes_path, "correct");
    assert_eq!(inputs.shape(), &[N, 2]);
    for i in 0..N {
        assert_eq!(label[[i]], rules[[i, 3]]);
        for (j, token) in [27, 31].into_iter().enumerate() {
            let v = (0..8).position(|m| x[[i, token, m]] == 1).unwrap() as i64;
            assert_eq!(inputs[[i, j]], v, "problem {i}, token {token}");
        }
        assert_eq!(target[[i]], y[[i, 3]]);
        assert_eq!(correct[[i]], prediction[[i]] == target[[i]]);
    }
    let acc = correct.iter().filter(|&&c| c).count() as f64 / N as f64;
    assert!(
        stdout.contains(&format!(
            "({N} rows, site paper, softmax mixer); answer-slot accuracy {:.2} %",
            100.0 * acc
        )),
        "{stdout}"
    );

    // The predictions are eval's predictions of slot 3 on the same problems.
    let logits = tmp.path().join("logits.npz");
    hyperlens(&[
        "eval",
        "--checkpoint",
        c,
        "--problems",
        s(&problems),
        "--save-logits",
        s(&logits),
    ])
    .success();
    let pred: ArrayD<i64> = array(&logits, "pred");
    assert_eq!(pred.index_axis(Axis(1), 3), prediction);

    let side = json(&tmp.path().join("codes.json"));
    assert_eq!(side["n_rows"].as_u64(), Some(N as u64));
    assert_eq!(side["selections"][0]["query"], 35);
    assert_eq!(side["selections"][0]["keys"], serde_json::json!([27, 31]));
    assert_eq!(side["layers"], serde_json::json!([0, 1]));
    assert_eq!(side["split"], "paper-seed0");

    // From the file, in one batch: the same codes. One layer: that layer's slice.
    let from_file = tmp.path().join("from-file.npz");
    hyperlens(&[
        "probe",
        "--checkpoint",
        c,
        "--problems",
        s(&problems),
        "--out",
        s(&from_file),
    ])
    .success();
    let again: ArrayD<f32> = array(&from_file, "codes");
    assert_eq!(again.shape(), codes.shape());
    for (a, b) in again.iter().zip(codes.iter()) {
        close("codes from a file", f64::from(*a), f64::from(*b), 1e-6);
    }
    let layer1 = tmp.path().join("layer1.npz");
    hyperlens(&[
        "probe",
        "--checkpoint",
        c,
        "--problems",
        s(&problems),
        "--layers",
        "1",
        "--out",
        s(&layer1),
    ])
    .success();
    let one: ArrayD<f32> = array(&layer1, "codes");
    assert_eq!(one.index_axis(Axis(1), 0), again.index_axis(Axis(1), 1));
}

#[test]
fn probe_failures_name_the_layer_site_or_flag() {
    let tmp = tempdir();
    let ckpt = tmp.path().join("tiny");
    sraven_checkpoint(&ckpt, Mixer::Hyla, 1);
    let out = tmp.path().join("codes.npz");
    let base = [
        "probe",
        "--checkpoint",
        s(&ckpt),
        "--split",
        "paper-seed0",
        "--n",
        "4",
        "--out",
        s(&out),
    ];
    let with = |extra: &[&'static str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        hyperlens(&a)
    };
    with(&["--layers", "5"]).failure(&["layer 5 out of range", "2 layers"]);
    with(&["--layers", "0,0"]).failure(&["layer 0 selected twice"]);
    with(&["--site", "slot:7"]).failure(&["slot 7 out of range", "4 feature slots"]);
    with(&["--site", "query:40;keys:1"]).failure(&["position 40 out of range", "36 tokens"]);
    with(&["--batch", "0"]).failure(&["--batch must be positive"]);
    assert!(!out.exists());
    let missing = tmp.path().join("nope");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&missing),
        "--split",
        "paper-seed0",
        "--out",
        s(&out),
    ])
    .failure(&[s(&missing)]);
    let no_dir = tmp.path().join("no-dir");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&ckpt),
        "--split",
        "paper-seed0",
        "--n",
        "4",
        "--out",
        s(&no_dir.join("codes.npz")),
    ])
    .success();
    // `--out` follows the one rule of every command: a missing parent directory is created.
    assert!(no_dir.join("codes.npz").is_file());
}

#[test]
fn probe_usage_errors() {
    let base = [
        "probe",
        "--checkpoint",
        "x",
        "--split",
        "paper-seed0",
        "--out",
        "c.npz",
    ];
    let with = |extra: &[&'static str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        hyperlens(&a)
    };
    with(&["--site", "bogus"]).usage_error(&[
        "invalid value 'bogus' for '--site <SITE>'",
        "paper, slot:F, all-slots",
    ]);
    with(&["--layers", "x"]).usage_error(&["invalid value 'x' for '--layers <LAYERS>'"]);
    with(&["--device", "gpu"]).usage_error(&["invalid value 'gpu' for '--device <DEVICE>'"]);
    hyperlens(&["probe", "--checkpoint", "x", "--split", "paper-seed0"])
        .usage_error(&["--out <OUT>"]);
}

/// On a fuzzy-logic checkpoint, `probe` writes the codes at the paper's site (the last token's
/// attention to itself) with the task's terms, the same whether the sequences are sampled or read
/// from the file `tasks sample --task logic` writes with the same flags; `analyze` on two such
/// files writes the term decoding per layer and `all`. SRAVEN sites are refused by name.
#[test]
fn logic_probe_labels_codes_with_the_tasks_terms() {
    let tmp = tempdir();
    let run = tmp.path().join("run");
    hyperlens(&[
        "train",
        "--task",
        "logic",
        "--layers",
        "2",
        "--steps",
        "4",
        "--batch",
        "8",
        "--warmup",
        "2",
        "--eval-every",
        "0",
        "--eval-n",
        "16",
        "--out",
        s(&run),
    ])
    .success();
    let sampled = tmp.path().join("sampled.npz");
    let r = hyperlens(&[
        "probe",
        "--checkpoint",
        s(&run),
        "--set",
        "id",
        "--n",
        "300",
        "--batch",
        "64",
        "--out",
        s(&sampled),
    ]);
    assert!(r.success().contains("300 rows, logic"), "{}", r.success());
    let file = tmp.path().join("id.npz");
    hyperlens(&[
        "tasks",
        "sample",
        "--task",
        "logic",
        "--set",
        "id",
        "--n",
        "300",
        "--out",
        s(&file),
    ])
    .success();
    let read = tmp.path().join("read.npz");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&run),
        "--problems",
        s(&file),
        "--out",
        s(&read),
    ])
    .success();
    let codes: ndarray::ArrayD<f32> = array(&sampled, "codes");
    assert_eq!(codes.shape(), &[300, 2, 8, 1, 1]);
    assert_eq!(codes, array::<f32>(&read, "codes"));
    let terms: ndarray::ArrayD<i64> = array(&sampled, "terms");
    let file_terms: ndarray::ArrayD<u8> = array(&file, "terms");
    assert_eq!(terms, file_terms.mapv(i64::from));
    assert_eq!(
        array::<i64>(&sampled, "term_ids"),
        array::<i64>(&file, "term_ids")
    );
    assert_eq!(array::<f32>(&sampled, "target"), array::<f32>(&file, "y"));
    let side = json(&tmp.path().join("sampled.json"));
    assert_eq!(side["site"], "query:31;keys:31");
    // HYLA codes are RMSHead-normalised over the heads: the mean square over heads is 1.
    for row in codes.outer_iter().take(5) {
        for l in 0..2 {
            let ms: f32 = (0..8).map(|h| row[[l, h, 0, 0]].powi(2)).sum::<f32>() / 8.0;
            assert!((ms - 1.0).abs() < 1e-3, "{ms}");
        }
    }
    let ood = tmp.path().join("ood.npz");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&run),
        "--n",
        "200",
        "--out",
        s(&ood),
    ])
    .success();
    let out = tmp.path().join("analysis");
    let stdout = hyperlens(&[
        "analyze",
        "--train",
        s(&sampled),
        "--test",
        s(&ood),
        "--out",
        s(&out),
    ])
    .success()
    .to_owned();
    assert!(stdout.contains("ridge_r2"), "{stdout}");
    let csv = Csv::read(&out.join("term_decoding.csv"));
    assert_eq!(csv.strings("layer"), ["0", "1", "all"]);
    for col in [
        "ridge_r2",
        "f1_mean",
        "f1_base_rate",
        "f1_shuffled",
        "n_terms",
    ] {
        assert_eq!(csv.strings(col).len(), 3, "{col}");
    }
    let summary = json(&out.join("summary.json"));
    assert_eq!(summary["task"], "logic");
    let trust = summary["projections"]["tsne_trustworthiness_k5"]
        .as_f64()
        .unwrap();
    assert!((0.5..=1.0).contains(&trust), "{trust}");
    let proj = out.join("projections.npz");
    for name in ["pca_layer0", "pca_layer1", "pca_all", "tsne_all"] {
        assert_eq!(array::<f64>(&proj, name).shape(), &[200, 2], "{name}");
    }
    assert_eq!(
        array::<i64>(&proj, "term_ids"),
        array::<i64>(&ood, "term_ids")
    );
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&run),
        "--site",
        "all-slots",
        "--out",
        s(&ood),
    ])
    .failure(&["--site all-slots is a SRAVEN site"]);
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&run),
        "--site",
        "query:40;keys:31",
        "--out",
        s(&ood),
    ])
    .failure(&["query 40", "32 tokens"]);

    // The fixed-context variant: one context for every sequence, in `tasks sample` and in the
    // probe's generated sets alike.
    let fc_file = tmp.path().join("fc.npz");
    hyperlens(&[
        "tasks",
        "sample",
        "--task",
        "logic",
        "--set",
        "ood",
        "--n",
        "40",
        "--seed",
        "2",
        "--fixed-context",
        "--out",
        s(&fc_file),
    ])
    .success();
    let x: ndarray::ArrayD<f32> = array(&fc_file, "x");
    let first = x.index_axis(ndarray::Axis(0), 0).to_owned();
    for row in x.outer_iter() {
        // Context tokens (inputs and targets' inputs) equal; queries differ.
        assert_eq!(
            row.slice(ndarray::s![..31, ..4]),
            first.slice(ndarray::s![..31, ..4])
        );
    }
    assert_ne!(
        x.slice(ndarray::s![0, 31, ..4]),
        x.slice(ndarray::s![1, 31, ..4])
    );
    assert_eq!(json(&tmp.path().join("fc.json"))["inputs"], "fixed_context");
    let fc_probe = tmp.path().join("fc_probe.npz");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&run),
        "--set",
        "ood",
        "--n",
        "40",
        "--seed",
        "2",
        "--fixed-context",
        "--out",
        s(&fc_probe),
    ])
    .success();
    let fc_read = tmp.path().join("fc_read.npz");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&run),
        "--problems",
        s(&fc_file),
        "--out",
        s(&fc_read),
    ])
    .success();
    assert_eq!(
        array::<f32>(&fc_probe, "codes"),
        array::<f32>(&fc_read, "codes")
    );
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&run),
        "--fixed-query",
        "--fixed-context",
        "--out",
        s(&fc_read),
    ])
    .usage_error(&["--fixed-query", "--fixed-context"]);
}

/// A ten-line prompt file of a researcher's own task on the tiny Llama fixture (word-level
/// tokenizer that prepends `<s>`): `probe --prompts` then `analyze --lm-codes`, and the prompt
/// errors, each one line naming what is wrong.
#[test]
fn probe_prompts_writes_the_codes_of_a_written_task_and_refuses_bad_prompts() {
    let tmp = tempdir();
    let model = crate::util::repo_path("crates/model/tests/fixtures/lm/tiny-llama-hf");
    let m = s(&model);
    let words = [
        ("cat", "dog"),
        ("sun", "moon"),
        ("red", "blue"),
        ("one", "two"),
        ("up", "down"),
    ];
    let mut lines = Vec::new();
    for (i, (x, y)) in words.iter().enumerate() {
        for (op, split) in [
            ("same", "train"),
            ("swap", if i < 2 { "test" } else { "train" }),
        ] {
            let answer = if op == "same" { x } else { y };
            lines.push(format!(
                r#"{{"segments": [{{"text": "Q:", "role": "sep"}}, {{"text": "{x}", "role": "x"}}, {{"text": "A:", "role": "sep"}}], "labels": {{"op": "{op}"}}, "answer": "{answer}", "split": "{split}"}}"#
            ));
        }
    }
    let prompts = tmp.path().join("task.jsonl");
    std::fs::write(&prompts, lines.join("\n") + "\n").unwrap();
    let out = tmp.path().join("codes.npz");
    let p = s(&prompts);
    let line = hyperlens(&[
        "probe",
        "--checkpoint",
        m,
        "--prompts",
        p,
        "--sites",
        "query: last; keys: x, sep#0",
        "--out",
        s(&out),
        "--batch",
        "3",
    ])
    .success()
    .to_string();
    assert!(
        line.contains("10 prompts") && line.contains(", 1, 2]") && line.contains("form pattern"),
        "{line}"
    );
    // <s> Q: x A: -> query 3, keys 2 (x) and 1 (the first `sep`).
    let kp: ArrayD<i64> = array(&out, "key_pos");
    let qp: ArrayD<i64> = array(&out, "query_pos");
    assert!(kp.outer_iter().all(|r| r.iter().copied().eq([2, 1])));
    assert!(qp.iter().all(|&q| q == 3));
    let split: ArrayD<i64> = array(&out, "split");
    assert_eq!(split.iter().sum::<i64>(), 2);
    let side = json(&tmp.path().join("codes.json"));
    assert_eq!(side["label_factor"], "op");
    assert_eq!(side["sites"], "query: last; keys: x, sep#0");
    let an = tmp.path().join("an");
    hyperlens(&[
        "analyze",
        "--lm-codes",
        s(&out),
        "--factor",
        "op",
        "--out",
        s(&an),
    ])
    .success();
    assert!(an.join("decoding.csv").is_file());

    let run = |file: &std::path::Path, sites: &str| {
        hyperlens(&[
            "probe",
            "--checkpoint",
            m,
            "--prompts",
            s(file),
            "--sites",
            sites,
            "--out",
            s(&tmp.path().join("bad.npz")),
        ])
    };
    run(&prompts, "query: last; keys: demo_output").failure(&["prompt 0", "demo_output"]);
    run(&prompts, "query: x; keys: last").failure(&["after"]);
    let empty = tmp.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    run(&empty, "query: last; keys: x").failure(&["empty.jsonl"]);
    let no_tok = crate::util::repo_path("data/induction/attn-only-2l");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&no_tok),
        "--prompts",
        p,
        "--sites",
        "query: last; keys: x",
        "--out",
        s(&tmp.path().join("bad.npz")),
    ])
    .failure(&["no tokenizer"]);
    assert!(!tmp.path().join("bad.npz").exists());
}
