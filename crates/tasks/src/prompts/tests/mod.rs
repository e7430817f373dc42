//! Tests of the prompt format, sites, hold-out rule and generators (values computed by hand or by
//! independent small functions here).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;

use super::*;
use crate::error::TasksError;

/// The three-line example of the module documentation.
const EXAMPLE: &str = r#"{"segments": [{"text": "Q:", "role": "separator"}, {"text": " a", "role": "demo_input"}, {"text": "\nA:", "role": "separator"}, {"text": " b", "role": "demo_output"}, {"text": "\n\nQ:", "role": "separator"}, {"text": " c", "role": "query_input"}, {"text": "\nA:", "role": "separator"}], "labels": {"operation": "next", "domain": "lower"}, "answer": " d", "split": "train"}
{"segments": [{"text": "Q:", "role": "separator"}, {"text": " 3", "role": "demo_input"}, {"text": "\nA:", "role": "separator"}, {"text": " 2", "role": "demo_output"}, {"text": "\n\nQ:", "role": "separator"}, {"text": " 8", "role": "query_input"}, {"text": "\nA:", "role": "separator"}], "labels": {"operation": "previous", "domain": "digits"}, "answer": " 7", "split": "test"}
{"segments": [{"text": "The cat sat on the", "role": "context"}, {"text": " mat", "role": "key"}, {"text": ". The", "role": "context"}, {"text": " cat", "role": "query"}], "labels": {"relation": "duplicate"}}
"#;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn the_documented_example_loads_with_its_factors_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "p.jsonl", EXAMPLE);
    let set = PromptSet::load(&path).unwrap();
    assert_eq!(set.len(), 3);
    assert_eq!(set.texts()[0], "Q: a\nA: b\n\nQ: c\nA:");
    assert_eq!(set.texts()[2], "The cat sat on the mat. The cat");
    assert_eq!(
        set.splits(),
        vec![Some(PromptSplit::Train), Some(PromptSplit::Test), None]
    );
    let f = set.factors();
    let names: Vec<&str> = f.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["domain", "operation", "relation"]);
    assert_eq!(f[0].values, ["digits", "lower"]);
    assert_eq!(f[1].values, ["next", "previous"]);
    assert_eq!(f[2].values, ["duplicate"]);
    let m = set.factor_matrix();
    assert_eq!(m.shape(), [3, 3]);
    assert_eq!(m.row(0).to_vec(), [1, 0, -1]);
    assert_eq!(m.row(1).to_vec(), [0, 1, -1]);
    assert_eq!(m.row(2).to_vec(), [-1, -1, 0]);
    // Round trip: save, load, same prompts; saving again gives the same bytes.
    let out = dir.path().join("out.jsonl");
    set.save(&out).unwrap();
    let again = PromptSet::load(&out).unwrap();
    assert_eq!(again.prompts, set.prompts);
    let out2 = dir.path().join("out2.jsonl");
    again.save(&out2).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&out2).unwrap());
}

#[test]
fn a_round_trip_keeps_unicode_whitespace_and_every_field() {
    let p = Prompt {
        segments: vec![
            Segment::new("  héllo\t\"wörld\"\n", "a b"),
            Segment::new("", "empty"),
            Segment::new("日本 ✓\\", "x"),
        ],
        labels: [("k".to_string(), "".to_string()), ("é".into(), "ü".into())]
            .into_iter()
            .collect(),
        answer: Some(" \n".into()),
        split: Some(PromptSplit::Test),
    };
    let q = Prompt {
        segments: vec![Segment::new("x", "r")],
        labels: BTreeMap::new(),
        answer: None,
        split: None,
    };
    let set = PromptSet::new(vec![p, q], "test").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rt.jsonl");
    set.save(&path).unwrap();
    let back = PromptSet::load(&path).unwrap();
    assert_eq!(back.prompts, set.prompts);
    // Absent optional fields are not written.
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text.lines().nth(1).unwrap(),
        r#"{"segments":[{"text":"x","role":"r"}]}"#
    );
}

/// Loads `text` and returns the error message, which must name the file and `line`.
fn load_error(text: &str, line: usize) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "bad.jsonl", text);
    let e = PromptSet::load(&path).unwrap_err();
    assert!(
        matches!(&e, TasksError::PromptLine { line: l, .. } if *l == line),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("bad.jsonl"), "{msg}");
    assert!(msg.contains(&format!("line {line}:")), "{msg}");
    msg
}

#[test]
fn every_load_error_names_the_file_and_the_line() {
    let good = r#"{"segments": [{"text": "a", "role": "r"}]}"#;
    let m = load_error(&format!("{good}\n{{not json\n"), 2);
    assert!(m.contains("key must be a string"), "{m}");
    let m = load_error(
        &format!("{good}\n\n{good}\n{{\"segments\": [], \"labels\": {{}}}}\n"),
        4,
    );
    assert!(m.contains("no segment"), "{m}");
    let m = load_error(
        &format!("{{\"segments\": [{{\"text\": \"a\", \"role\": \"\"}}]}}\n{good}"),
        1,
    );
    assert!(m.contains("empty role"), "{m}");
    let m = load_error(
        &format!("{good}\n{{\"segments\": [{{\"text\": \"\", \"role\": \"r\"}}]}}"),
        2,
    );
    assert!(m.contains("text is empty"), "{m}");
    let m = load_error(
        &format!(
            "{good}\n{{\"segments\": [{{\"text\": \"a\", \"role\": \"r\"}}], \"split\": \"val\"}}"
        ),
        2,
    );
    assert!(
        m.contains("unknown variant `val`") && m.contains("train"),
        "{m}"
    );
    let m = load_error(
        r#"{"segments": [{"text": "a", "role": "r"}], "lables": {}}"#,
        1,
    );
    assert!(m.contains("unknown field `lables`"), "{m}");
    let m = load_error(r#"{"segments": [{"text": "a", "rol": "r"}]}"#, 1);
    assert!(m.contains("unknown field `rol`"), "{m}");
    let m = load_error(
        r#"{"segments": [{"text": "a", "role": "r"}], "labels": {"op": 3}}"#,
        1,
    );
    assert!(m.contains("expected a string"), "{m}");
    let m = load_error("", 0);
    assert!(m.contains("no prompt"), "{m}");
    load_error("\n  \n", 0);
    // A missing file names the file.
    let e = PromptSet::load(Path::new("/nonexistent/p.jsonl")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/p.jsonl"), "{e}");
}

#[test]
fn built_prompts_are_checked_and_named_by_index() {
    let e = PromptSet::from_json_items(
        &[
            r#"{"segments": [{"text": "a", "role": "r"}]}"#,
            r#"{"segments": []}"#,
        ],
        "py",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid input `prompt 1`: the prompt has no segment (`segments` is empty)"
    );
    let e = PromptSet::from_json_items::<&str>(&[], "py").unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    let e = PromptSet::from_json_items(
        &[r#"{"segments": [{"text": "a", "role": "r"}], "split": "dev"}"#],
        "py",
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("invalid input `prompt 0`: unknown variant `dev`"),
        "{e}"
    );
}

/// A prompt with segments of the given roles (text irrelevant to the resolution).
pub(super) fn prompt_of_roles(roles: &[&str]) -> Prompt {
    Prompt {
        segments: roles.iter().map(|r| Segment::new("x", *r)).collect(),
        labels: BTreeMap::new(),
        answer: None,
        split: None,
    }
}

/// Spans tiling `offset..` from per-segment token counts.
pub(super) fn spans(offset: usize, counts: &[usize]) -> Vec<Range<usize>> {
    segment_spans(counts, offset)
}

mod generators;
mod holdout;
mod sites;
