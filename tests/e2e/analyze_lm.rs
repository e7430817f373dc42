//! `hyperlens analyze --lm-codes` on a synthetic language-model code file written through the
//! analysis crate's `LmCodeSet` (the keys and sidecar of the contract): the tables against the
//! library's own result, the planted signal found at its layer, and the errors.

use std::ops::ControlFlow;
use std::path::Path;

use hyperlens_analysis::lm::{analyze, LmAnalysisParams, LmCodeSet};
use hyperlens_io::sidecars::{LmCodesSidecar, LmFactor};
use ndarray::{Array1, Array2, Array5};

use crate::util::{close, hyperlens, json, s, tempdir, Csv};

/// A deterministic noise in [-1, 1) (splitmix64 of the index).
fn noise(i: u64) -> f32 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
}

/// 4 operations x 3 domains, `n_per` prompts each, combinations with (op + dom) % 3 == 0 held
/// out; codes [N, 2, 2, 1, 3] of noise, with the operation planted in layer axis 1; `prompt`
/// offset by `prompt_offset`.
fn write_codes(
    path: &Path,
    n_per: usize,
    prompt_offset: i64,
    shuffled_seed: Option<u64>,
    fail_test: bool,
) {
    let (ops, doms) = (4, 3);
    let n = ops * doms * n_per;
    let mut factors = Array2::<i64>::zeros((n, 2));
    let mut split = Array1::<i64>::zeros(n);
    for i in 0..n {
        let c = i / n_per;
        let (op, dom) = (c % ops, c / ops);
        factors[[i, 0]] = op as i64;
        factors[[i, 1]] = dom as i64;
        split[i] = i64::from((op + dom) % 3 == 0);
    }
    let plant = shuffled_seed.is_none();
    let codes = Array5::from_shape_fn((n, 2, 2, 1, 3), |(i, l, h, _, k)| {
        let flat = ((i * 2 + l) * 2 + h) * 3 + k;
        let mean = if plant && l == 1 && h * 3 + k == factors[[i, 0]] as usize {
            4.0
        } else {
            0.0
        };
        mean + noise(flat as u64)
    });
    let sidecar = LmCodesSidecar {
        factors: vec![
            LmFactor {
                name: "operation".into(),
                values: ["copy", "next", "prev", "skip"].map(String::from).to_vec(),
            },
            LmFactor {
                name: "domain".into(),
                values: ["digits", "letters", "months"].map(String::from).to_vec(),
            },
        ],
        form: "pattern".into(),
        has_resid: false,
        kv_group: vec![0, 0],
        label_factor: "operation".into(),
        layers: vec![3, 9],
        model: "synthetic".into(),
        model_kind: "gguf".into(),
        n_heads: 2,
        n_prompts: n,
        prepend_bos: true,
        prompts: "prompts.jsonl".into(),
        shuffled_weights_seed: shuffled_seed,
        sites: "query: last; keys: demo_output".into(),
        tokenizer: "gguf".into(),
    };
    let query_pos = Array2::from_shape_fn((n, 1), |(i, _)| 30 + (i % 5) as i64);
    let key_pos = Array2::from_shape_fn((n, 3), |(i, k)| 4 * k as i64 + (i % 3) as i64);
    let correct = Array1::from_iter((0..n).map(|i| {
        // the model fails every prompt of (op 0, dom 1), combination 4 (and with `fail_test`
        // every held-out prompt)
        i / n_per != 4 && !(fail_test && split[i] == 1)
    }));
    LmCodeSet::new(
        codes,
        sidecar,
        factors,
        split,
        Array1::from_iter((0..n as i64).map(|p| p + prompt_offset)),
        query_pos,
        key_pos,
    )
    .unwrap()
    .with_correct(correct)
    .unwrap()
    .write(path)
    .unwrap();
}

#[test]
fn analyze_lm_codes_tables_and_errors() {
    let tmp = tempdir();
    let codes = tmp.path().join("codes.npz");
    let shuffled = tmp.path().join("shuffled").join("codes.npz");
    std::fs::create_dir_all(shuffled.parent().unwrap()).unwrap();
    write_codes(&codes, 12, 0, None, false);
    write_codes(&shuffled, 12, 0, Some(5), false);
    let out = tmp.path().join("tables");
    let r = hyperlens(&[
        "analyze",
        "--lm-codes",
        s(&codes),
        "--factor",
        "operation",
        "--shuffled-codes",
        s(&shuffled),
        "--min-accuracy",
        "0.5",
        "--bootstrap",
        "200",
        "--out",
        s(&out),
        "--quiet",
    ]);
    let stdout = r.success().to_string();
    assert_eq!(r.stderr, "");
    assert!(
        stdout.contains("dropped 1 of 12 combinations (12 prompts)"),
        "{stdout}"
    );

    // the tables are the library's result for the same settings
    let lib = analyze(
        &LmAnalysisParams {
            factor: Some("operation".into()),
            shuffled_codes: Some(shuffled.clone()),
            min_accuracy: Some(0.5),
            n_bootstrap: 200,
            n_components: 2,
            ..LmAnalysisParams::new(&codes)
        },
        &mut |_| ControlFlow::Continue(()),
    )
    .unwrap();
    let dec = Csv::read(&out.join("decoding.csv"));
    assert_eq!(dec.strings("layer"), vec!["3", "9", "-1"]);
    let acc = dec.column("codes");
    for (i, r) in lib.decoding.rows.iter().enumerate() {
        close("codes accuracy", acc[i], r.codes.accuracy, 1e-12);
        close(
            "shuffled weights",
            dec.column("shuffled_weights")[i],
            r.shuffled_weights.unwrap().accuracy,
            1e-12,
        );
        close(
            "ci low",
            dec.column("codes_ci_low")[i],
            r.codes.ci_low,
            1e-12,
        );
    }
    // the signal is in layer 9 only; the controls stay low
    assert!(acc[1] > 0.9 && acc[2] > 0.9, "{acc:?}");
    assert!(acc[0] < 0.6, "{acc:?}");
    assert!(dec.column("shuffled_weights")[1] < 0.6);
    assert!(dec.strings("resid").iter().all(|v| v.is_empty()));
    // 9 held-out combinations of 12 prompts minus the dropped one (op 0, dom 1 is a train one)
    assert_eq!(lib.decoding.n_test, 4 * 12);
    let beh = Csv::read(&out.join("behaviour.csv"));
    assert_eq!(
        beh.strings("kept")
            .iter()
            .filter(|k| **k == "false")
            .count(),
        1
    );
    let summary = json(&out.join("summary.json"));
    assert_eq!(summary["factor"], "operation");
    assert_eq!(summary["n_dropped_prompts"], 12);
    assert!(out.join("structure.csv").is_file());
    // the printed table: one line per layer with the interval
    let line = stdout.lines().find(|l| l.starts_with("9 ")).unwrap();
    assert!(
        line.contains(&format!("{:.3} [", lib.decoding.rows[1].codes.accuracy)),
        "{line}"
    );

    // errors: one line naming the thing
    let args = |extra: &[&str]| {
        let mut v = vec![
            "analyze",
            "--lm-codes",
            s(&codes),
            "--out",
            s(&out),
            "--quiet",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        v.extend(extra.iter().map(|e| e.to_string()));
        v
    };
    hyperlens(&args(&["--factor", "colour"])).failure(&["colour", "operation, domain"]);
    hyperlens(&args(&["--layers", "4"])).failure(&["no layer 4", "[3, 9]"]);
    let other = tmp.path().join("other").join("codes.npz");
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    write_codes(&other, 12, 1000, Some(5), false);
    hyperlens(&args(&["--shuffled-codes", s(&other)])).failure(&["other", "`prompt`"]);
    let lone = tmp.path().join("lone.npz");
    std::fs::copy(&codes, &lone).unwrap();
    hyperlens(&[
        "analyze",
        "--lm-codes",
        s(&lone),
        "--out",
        s(&out),
        "--quiet",
    ])
    .failure(&["lone.npz", "sidecar"]);
    // every held-out combination is dropped: no test rows
    let failing = tmp.path().join("failing.npz");
    write_codes(&failing, 12, 0, None, true);
    hyperlens(&[
        "analyze",
        "--lm-codes",
        s(&failing),
        "--min-accuracy",
        "0.5",
        "--out",
        s(&out),
        "--quiet",
    ])
    .failure(&["failing.npz", "no test rows"]);
    hyperlens(&args(&["--min-accuracy", "2"])).failure(&["min_accuracy"]);
    // usage: LM flags need --lm-codes; --train conflicts with it
    hyperlens(&["analyze", "--factor", "x", "--out", s(&out)]).usage_error(&["--lm-codes"]);
    hyperlens(&args(&["--train", s(&codes)])).usage_error(&["--train"]);
}

/// `hyperlens probe --prompts` on the tiny Llama, then `analyze --lm-codes`: `explorer.html`, a
/// self-contained page whose hover text is each held-out prompt with its query and keys marked;
/// `--no-explorer` skips it and the tables stay the same.
#[test]
fn analyze_lm_codes_writes_the_explorer_with_the_prompts_text() {
    let tmp = tempdir();
    let model = crate::util::repo_path("crates/model/tests/fixtures/lm/tiny-llama-hf");
    let line = |x: &str, y: &str, x2: &str, op: &str, split: &str| {
        format!(
            r#"{{"segments": [{{"text": "Q:", "role": "sep"}}, {{"text": "{x}", "role": "x"}}, {{"text": "A:", "role": "sep"}}, {{"text": "{y}", "role": "y"}}, {{"text": "Q:", "role": "sep"}}, {{"text": "{x2}", "role": "x"}}, {{"text": "A:", "role": "sep"}}], "labels": {{"op": "{op}"}}, "answer": "sky", "split": "{split}"}}"#
        )
    };
    let lines = [
        line("cat", "dog", "sun big", "copy", "train"),
        line("one", "two", "three", "next", "train"),
        line("red", "blue", "the small tree", "copy", "test"),
        line("up", "down", "left", "next", "test"),
    ];
    let prompts = tmp.path().join("prompts.jsonl");
    std::fs::write(&prompts, lines.join("\n") + "\n").unwrap();
    let codes = tmp.path().join("codes.npz");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&model),
        "--prompts",
        s(&prompts),
        "--sites",
        "query: last; keys: x, y#0",
        "--out",
        s(&codes),
    ])
    .success();
    let out = tmp.path().join("an");
    let r = hyperlens(&[
        "analyze",
        "--lm-codes",
        s(&codes),
        "--bootstrap",
        "20",
        "--out",
        s(&out),
        "--quiet",
    ]);
    let stdout = r.success().to_string();
    assert!(stdout.contains("wrote 5 files"), "{stdout}");
    let page = std::fs::read_to_string(out.join("explorer.html")).unwrap();
    // Self-contained: nothing fetched (the SVG namespace is its only URL).
    assert!(
        page.starts_with("<!DOCTYPE html>") && !page.contains("src=") && !page.contains("https://")
    );
    for text in [
        "<s> Q: [[red]] A: [[blue]] Q: the small [[tree]] <<A:>>",
        "<s> Q: [[up]] A: [[down]] Q: [[left]] <<A:>>",
    ] {
        // The payload is JSON in the page, with `<` and `>` escaped.
        let escaped = serde_json::to_string(text)
            .unwrap()
            .replace('<', "\\u003c")
            .replace('>', "\\u003e");
        assert!(page.contains(&escaped), "{escaped} not in explorer.html");
    }
    let bare = tmp.path().join("bare");
    hyperlens(&[
        "analyze",
        "--lm-codes",
        s(&codes),
        "--bootstrap",
        "20",
        "--out",
        s(&bare),
        "--quiet",
        "--no-explorer",
    ])
    .success();
    assert!(!bare.join("explorer.html").exists());
    for f in ["decoding.csv", "behaviour.csv", "structure.csv"] {
        assert_eq!(
            std::fs::read(out.join(f)).unwrap(),
            std::fs::read(bare.join(f)).unwrap(),
            "{f}"
        );
    }
}
