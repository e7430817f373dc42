//! `hyperlens tasks prompts` and `hyperlens tasks check-prompts`: generated prompt files whose
//! answers and splits are re-derived here from the JSON, and bad files, flags and sites reported
//! as one line naming the file, line, prompt or flag.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::util::{hyperlens, s, tempdir};

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The segments' texts with `role`, without the leading space.
fn texts<'a>(p: &'a Value, role: &str) -> Vec<&'a str> {
    p["segments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["role"] == role)
        .map(|s| s["text"].as_str().unwrap().trim_start())
        .collect()
}

#[test]
fn icl_prompts_are_written_with_correct_answers_and_a_held_out_quarter() {
    let dir = tempdir();
    let out = dir.path().join("p/icl.jsonl");
    let r = hyperlens(&[
        "tasks",
        "prompts",
        "--generator",
        "icl",
        "--n",
        "60",
        "--seed",
        "2",
        "--shots",
        "3",
        "--out",
        s(&out),
    ]);
    let line = r.success().trim();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.starts_with(&format!("wrote 60 prompts to {}", out.display())),
        "{line}"
    );
    assert!(
        line.contains("--sites \"query: last; keys: demo_output, query_input\""),
        "{line}"
    );
    let prompts = lines(&out);
    assert_eq!(prompts.len(), 60);
    let digits: Vec<String> = (0..10).map(|d| d.to_string()).collect();
    let (mut train, mut test) = (BTreeSet::new(), BTreeSet::new());
    for p in &prompts {
        let (op, dom) = (
            p["labels"]["operation"].as_str().unwrap(),
            p["labels"]["domain"].as_str().unwrap(),
        );
        let pair = format!("domain={dom},operation={op}");
        match p["split"].as_str().unwrap() {
            "train" => train.insert(pair),
            "test" => test.insert(pair),
            other => panic!("split {other}"),
        };
        assert_eq!(texts(p, "demo_input").len(), 3);
        if dom == "digits" {
            let step = match op {
                "copy" => 0,
                "next" => 1,
                "previous" => -1,
                "skip_forward" => 2,
                _ => -2,
            };
            let q: i64 = texts(p, "query_input")[0].parse().unwrap();
            let want = (q + step).to_string();
            assert!(digits.contains(&want));
            assert_eq!(p["answer"].as_str().unwrap(), format!(" {want}"));
        }
    }
    assert_eq!(test.len(), 8);
    assert!(train.is_disjoint(&test));
    // The printed held-out combinations are the test ones.
    for pair in &test {
        assert!(line.contains(pair.as_str()), "{pair}: {line}");
    }
    // check-prompts reads it back.
    let r = hyperlens(&[
        "tasks",
        "check-prompts",
        s(&out),
        "--sites",
        "query: last; keys: demo_output, query_input",
    ]);
    let text = r.success();
    assert!(text.contains("60 prompts"), "{text}");
    assert!(
        text.contains("1 query and 4 key positions per prompt"),
        "{text}"
    );
    let n_test = prompts.iter().filter(|p| p["split"] == "test").count();
    assert!(
        text.contains(&format!("test={n_test} train={}", 60 - n_test)),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with("2  domain="))
            .count(),
        30
    );
}

#[test]
fn relations_prompts_take_a_word_file() {
    let dir = tempdir();
    let words = dir.path().join("words.txt");
    let list: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
    std::fs::write(&words, list.join("\n")).unwrap();
    let out = dir.path().join("rel.jsonl");
    let r = hyperlens(&[
        "tasks",
        "prompts",
        "--generator",
        "relations",
        "--n",
        "20",
        "--words",
        s(&words),
        "--out",
        s(&out),
    ]);
    let line = r.success();
    assert!(
        line.contains("held out: vocab=b") && line.contains("--sites \"query: query; keys: key\""),
        "{line}"
    );
    let prompts = lines(&out);
    let mut by_vocab = [BTreeSet::new(), BTreeSet::new()];
    for p in &prompts {
        let v = usize::from(p["labels"]["vocab"] == "b");
        for w in p["segments"].as_array().unwrap() {
            let w = w["text"].as_str().unwrap().trim_start();
            if w.starts_with('w') {
                assert!(list.iter().any(|x| x == w));
                by_vocab[v].insert(w.to_string());
            }
        }
    }
    assert!(by_vocab[0].is_disjoint(&by_vocab[1]));
    // A bad word file names the file and line; flags of the other generator are refused.
    std::fs::write(&words, "a\nb c\n").unwrap();
    hyperlens(&[
        "tasks",
        "prompts",
        "--generator",
        "relations",
        "--n",
        "5",
        "--words",
        s(&words),
        "--out",
        s(&out),
    ])
    .failure(&["--words", "words.txt: line 2", "whitespace"]);
    hyperlens(&[
        "tasks",
        "prompts",
        "--generator",
        "relations",
        "--n",
        "5",
        "--shots",
        "2",
        "--out",
        s(&out),
    ])
    .failure(&["--shots"]);
    hyperlens(&[
        "tasks",
        "prompts",
        "--generator",
        "magic",
        "--n",
        "5",
        "--out",
        s(&out),
    ])
    .usage_error(&["magic"]);
}

#[test]
fn bad_prompt_files_and_sites_are_one_line_errors() {
    let dir = tempdir();
    let f = dir.path().join("mine.jsonl");
    std::fs::write(&f, "").unwrap();
    hyperlens(&["tasks", "check-prompts", s(&f)]).failure(&["mine.jsonl", "line 0", "no prompt"]);
    std::fs::write(
        &f,
        "{\"segments\": [{\"text\": \"a\", \"role\": \"x\"}]}\n{\"segments\": [{\"text\": \"a\", \"role\": \"x\"}], \"split\": \"dev\"}\n",
    )
    .unwrap();
    hyperlens(&["tasks", "check-prompts", s(&f)]).failure(&["mine.jsonl", "line 2", "dev"]);
    std::fs::write(
        &f,
        "{\"segments\": [{\"text\": \"a\", \"role\": \"x\"}], \"labels\": {\"k\": \"v\"}}\n",
    )
    .unwrap();
    hyperlens(&[
        "tasks",
        "check-prompts",
        s(&f),
        "--sites",
        "query: last; keys: y",
    ])
    .failure(&["--sites", "prompt 0", "unknown role `y`", "roles: x"]);
    hyperlens(&["tasks", "check-prompts", s(&f), "--sites", "query: last"])
        .failure(&["--sites", "no `keys:`"]);
    let text = hyperlens(&[
        "tasks",
        "check-prompts",
        s(&f),
        "--sites",
        "query: last; keys: x",
    ])
    .success()
    .to_string();
    assert!(
        text.contains("split counts: none=1") && text.contains("factors: k (v)"),
        "{text}"
    );
    hyperlens(&[
        "tasks",
        "check-prompts",
        s(&dir.path().join("absent.jsonl")),
    ])
    .failure(&["absent.jsonl"]);
}
