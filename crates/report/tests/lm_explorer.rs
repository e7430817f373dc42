//! The latent-space explorer of a language model's code file on the tiny Llama fixture: the
//! marked text of every point against the one built by hand from the prompt's tokens, the points
//! against the analysis's projected rows, the figure's payload, and the missing and changed
//! prompt file.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use hyperlens_analysis::lm::{analyze, LmAnalysis, LmAnalysisParams};
use hyperlens_model::candle_core::Device;
use hyperlens_model::lm::{CodeForm, LmTokenizer};
use hyperlens_probe::{extract_prompts, PromptProbeParams, PromptProbeSources};
use hyperlens_report::lm_explorer::{lm_explorer, LmExplorer};
use hyperlens_tasks::prompts::PromptSet;
use hyperlens_viz::InteractiveFigure;
use ndarray::{Array1, Array2};
use ndarray_npy::NpzReader;

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/lm/tiny-llama-hf")
}

/// (x, y, x2, op, answer, split): `Q: x A: y Q: x2 A:`.
const ROWS: [(&str, &str, &str, &str, &str, &str); 8] = [
    ("cat", "dog", "sun big", "copy", "moon", "train"),
    ("one", "two", "three", "next", "four", "train"),
    ("red", "blue", "the small tree", "copy", "sky", "test"),
    ("up", "down", "left", "next", "right", "test"),
    ("I", "you", "we", "copy", "they", "train"),
    ("big", "small", "cat dog", "next", "up", "test"),
    ("we", "they", "one", "copy", "two", "test"),
    ("sun", "moon", "red", "next", "blue", "train"),
];

fn prompt_lines() -> Vec<String> {
    ROWS.iter()
        .map(|(x, y, x2, op, a, split)| {
            format!(
                r#"{{"segments": [{{"text": "Q:", "role": "sep"}}, {{"text": "{x}", "role": "x"}}, {{"text": "A:", "role": "sep"}}, {{"text": "{y}", "role": "y"}}, {{"text": "Q:", "role": "sep"}}, {{"text": "{x2}", "role": "x"}}, {{"text": "A:", "role": "sep"}}], "labels": {{"op": "{op}", "size": "{}"}}, "answer": "{a}", "split": "{split}"}}"#,
                if x2.len() < 5 { "s" } else { "l" }
            )
        })
        .collect()
}

/// The code file of the prompts in `dir` (prompts.jsonl, codes.npz with codes.json), the
/// tokenizer and the analysis of `unsupervised_on`.
fn setup(dir: &Path, unsupervised_on: &str) -> (PathBuf, LmTokenizer, LmAnalysis) {
    let lines = prompt_lines();
    let prompts_path = dir.join("prompts.jsonl");
    std::fs::write(&prompts_path, lines.join("\n") + "\n").unwrap();
    let set = PromptSet::load(&prompts_path).expect("prompts");
    let model = hyperlens_model::lm::load(&model_dir(), &Device::Cpu).expect("tiny llama");
    let tok = hyperlens_model::lm::require_tokenizer(&model_dir()).expect("tokenizer.json");
    let codes = dir.join("codes.npz");
    let params = PromptProbeParams {
        sites: "query: last; keys: x, y#0".parse().expect("sites"),
        layers: None,
        form: CodeForm::Pattern,
        batch: 3,
        prepend_bos: None,
        label_factor: Some("op".into()),
        resid: false,
        shuffle_weights: None,
    };
    let sources = PromptProbeSources {
        model: model_dir().display().to_string(),
        model_kind: "hf-llama".into(),
        prompts: prompts_path.display().to_string(),
    };
    extract_prompts(&model, &tok, &set, &params, &sources, &codes, |_, _| {
        ControlFlow::Continue(())
    })
    .expect("extract");
    let a = analyze(
        &LmAnalysisParams {
            n_bootstrap: 20,
            unsupervised_on: unsupervised_on.parse().unwrap(),
            ..LmAnalysisParams::new(&codes)
        },
        &mut |_| ControlFlow::Continue(()),
    )
    .expect("analysis");
    (codes, tok, a)
}

fn data(fig: &LmExplorer) -> serde_json::Value {
    serde_json::from_str(&fig.figure().data_json().expect("payload")).expect("json")
}

#[test]
fn every_point_shows_its_prompt_with_the_sites_marked() {
    let tmp = tempfile::tempdir().unwrap();
    let (codes, tok, a) = setup(tmp.path(), "test");
    let e = lm_explorer(&codes, &a).expect("explorer");
    let mut z = NpzReader::new(std::fs::File::open(&codes).unwrap()).unwrap();
    let qp: Array2<i64> = z.by_name("query_pos").unwrap();
    let kp: Array2<i64> = z.by_name("key_pos").unwrap();
    let prompt: Array1<i64> = z.by_name("prompt").unwrap();
    let split: Array1<i64> = z.by_name("split").unwrap();
    let set = PromptSet::load(&tmp.path().join("prompts.jsonl")).unwrap();

    // Only held-out rows are projected by default: one set, one point per projected row.
    assert_eq!(e.sets.len(), 1);
    let s = &e.sets[0];
    assert_eq!(s.name, "held out");
    assert_eq!(s.prompt, a.structure_prompts);
    assert_eq!(s.prompt, [2, 3, 5, 6]);
    // Built by hand from the word-level tokens (`<s>` first, keys: the x segments' last token
    // and y's first, query: the last token).
    assert_eq!(
        s.marked[0],
        "<s> Q: [[red]] A: [[blue]] Q: the small [[tree]] <<A:>>"
    );
    assert_eq!(
        s.marked[2],
        "<s> Q: [[big]] A: [[small]] Q: cat [[dog]] <<A:>>"
    );
    // And from the tokens and the file's sites for every point (the word-level tokenizer's
    // tokens joined by spaces are the text).
    for (j, &p) in s.prompt.iter().enumerate() {
        let r = prompt.iter().position(|&x| x == p).unwrap();
        assert_eq!(split[r], 1);
        let texts: Vec<&str> = set.prompts[p as usize]
            .segments
            .iter()
            .map(|g| g.text.as_str())
            .collect();
        let (ids, _) = tok.encode_segments(&texts, Some(true)).unwrap();
        let want: Vec<String> = tok
            .str_tokens(&ids)
            .unwrap()
            .iter()
            .enumerate()
            .map(|(t, w)| {
                let t = t as i64;
                let w = if kp.row(r).iter().any(|&k| k == t) {
                    format!("[[{w}]]")
                } else {
                    w.clone()
                };
                if qp.row(r).iter().any(|&q| q == t) {
                    format!("<<{w}>>")
                } else {
                    w
                }
            })
            .collect();
        assert_eq!(s.marked[j], want.join(" "), "prompt {p}");
        // Short prompts are shown whole.
        assert_eq!(s.hover_text[j], s.marked[j]);
    }
    // The colourings: the decoded factor first, with its labels; then size, then correct.
    let names: Vec<&str> = e.colorings.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["op", "size", "correct"]);
    assert_eq!(e.colorings[0].classes, ["copy", "next"]);
    let labels: Vec<usize> = a.structure_labels.iter().map(|&l| l as usize).collect();
    assert_eq!(s.colors[0], labels);
    assert_eq!(s.colors[0], [0, 1, 1, 0]);
    // Views: layers 0, 1, then all; points are the analysis's PCA.
    assert_eq!(e.layers, ["0", "1", "all"]);
    for (v, p) in a.projections.iter().enumerate() {
        for j in 0..4 {
            assert_eq!(s.points[[0, v, j, 0]], p.projection[[j, 0]]);
            assert_eq!(s.points[[0, v, j, 1]], p.projection[[j, 1]]);
        }
    }
    // Target and prediction as token text.
    assert_eq!(s.target, ["sky", "right", "up", "two"]);

    // The figure's payload: one point per projected row, the text field as written.
    let d = data(&e);
    let sets = d["sets"].as_array().unwrap();
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0]["n"], 4);
    let text = sets[0]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "text")
        .expect("text field");
    assert_eq!(text["kind"], "text");
    assert_eq!(
        text["v"][0],
        "<s> Q: [[red]] A: [[blue]] Q: the small [[tree]] <<A:>>"
    );
    assert_eq!(d["colorings"][0]["name"], "op");
    assert_eq!(d["layers"], serde_json::json!(["0", "1", "all"]));
    assert_eq!(e.png().unwrap()[..4], *b"\x89PNG");
}

#[test]
fn seen_and_held_out_sets_and_a_missing_or_changed_prompt_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (codes, _, a) = setup(tmp.path(), "train");
    let e = lm_explorer(&codes, &a).expect("explorer");
    assert_eq!(e.sets.len(), 1);
    assert_eq!(e.sets[0].name, "seen");
    assert_eq!(e.sets[0].prompt, [0, 1, 4, 7]);

    // A changed prompt file: an error naming the prompt.
    let mut lines = prompt_lines();
    lines[1] = lines[1].replace("\"three\"", "\"the small tree\"");
    std::fs::write(tmp.path().join("prompts.jsonl"), lines.join("\n") + "\n").unwrap();
    let err = lm_explorer(&codes, &a).unwrap_err().to_string();
    assert!(
        err.contains("prompt 1") && err.contains("changed since the probe"),
        "{err}"
    );

    // No prompt file: the explorer without the text, saying why.
    std::fs::remove_file(tmp.path().join("prompts.jsonl")).unwrap();
    let e = lm_explorer(&codes, &a).expect("explorer without text");
    let note = e.note.clone().expect("a note");
    assert!(
        note.contains("prompts.jsonl") && note.contains("not there"),
        "{note}"
    );
    assert!(e.sets[0].marked.is_empty());
    let d = data(&e);
    let fields: Vec<&str> = d["sets"][0]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["op", "size", "target", "prediction", "correct"]);
    assert_eq!(d["sets"][0]["reproduce"], note.as_str());
    assert!(e.sets[0].target[0].starts_with("id "));
}

/// Each token's text in context, joined, is the decoded text (byte-level BPE: spaces inside the
/// tokens, newlines shown as `⏎`); on the word-level tiny Llama, whose tokens decode alone
/// without their spaces, they are the words with one space between them.
#[test]
fn token_pieces_join_to_the_decoded_text() {
    use hyperlens_report::lm_explorer::token_pieces;
    let tok = hyperlens_model::lm::require_tokenizer(&model_dir()).unwrap();
    let ids = tok.encode("Q: the small tree A:", Some(true)).unwrap();
    assert_eq!(
        token_pieces(&tok, &ids).unwrap(),
        ["<s>", " Q:", " the", " small", " tree", " A:"]
    );
    let Ok(path) = std::env::var("HYPERLENS_SMOLLM2_GGUF") else {
        eprintln!("skipped the SmolLM2 half: set HYPERLENS_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf");
        return;
    };
    let tok = hyperlens_model::lm::require_tokenizer(Path::new(&path)).unwrap();
    let text = "Q: Monday\nA: Tuesday\n\nQ: März → ½, 12345 héllo\nA:";
    let ids = tok.encode(text, None).unwrap();
    let pieces = token_pieces(&tok, &ids).unwrap();
    assert_eq!(pieces.len(), ids.len());
    assert_eq!(pieces.concat(), text.replace('\n', "⏎"));
}

/// Rows of both splits (a caller's own projection of every prompt): a `seen` and a `held out`
/// set, each point at its own row's coordinates, in every view.
#[test]
fn rows_of_both_splits_make_a_seen_and_a_held_out_set() {
    use hyperlens_analysis::lm::LmProjection;
    use hyperlens_report::lm_explorer::{lm_explorer_of, LmProjected};
    let tmp = tempfile::tempdir().unwrap();
    let (codes, _, _) = setup(tmp.path(), "test");
    // Prompts in a shuffled order; coordinates (10 p + v, -p) identify prompt p in view v.
    let prompts: Vec<i64> = vec![5, 0, 7, 2, 1, 6, 3, 4];
    let projections: Vec<LmProjection> = [Some(0), Some(1), None]
        .into_iter()
        .enumerate()
        .map(|(v, layer)| LmProjection {
            layer,
            projection: Array2::from_shape_fn((8, 2), |(i, c)| {
                if c == 0 {
                    10.0 * prompts[i] as f64 + v as f64
                } else {
                    -(prompts[i] as f64)
                }
            }),
        })
        .collect();
    let e = lm_explorer_of(
        &codes,
        &LmProjected {
            factor: "size",
            projections: &projections,
            prompts: &prompts,
        },
    )
    .unwrap();
    let names: Vec<&str> = e.sets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["seen", "held out"]);
    assert_eq!(e.sets[0].prompt, [0, 7, 1, 4]);
    assert_eq!(e.sets[1].prompt, [5, 2, 6, 3]);
    for s in &e.sets {
        for (j, &p) in s.prompt.iter().enumerate() {
            for v in 0..3 {
                assert_eq!(s.points[[0, v, j, 0]], 10.0 * p as f64 + v as f64);
                assert_eq!(s.points[[0, v, j, 1]], -(p as f64));
            }
            // `size` decoded: coloured first ("l" = 0 for the long third question).
            let long = ROWS[p as usize].2.len() >= 5;
            assert_eq!(s.colors[0][j], usize::from(!long), "prompt {p}");
        }
    }
    assert_eq!(e.colorings[0].name, "size");
    assert_eq!(
        e.sets[1].marked[1],
        "<s> Q: [[red]] A: [[blue]] Q: the small [[tree]] <<A:>>"
    );
}
