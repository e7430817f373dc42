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

// ---- sites ----

/// A prompt with segments of the given roles (text irrelevant to the resolution).
fn prompt_of_roles(roles: &[&str]) -> Prompt {
    Prompt {
        segments: roles.iter().map(|r| Segment::new("x", *r)).collect(),
        labels: BTreeMap::new(),
        answer: None,
        split: None,
    }
}

/// Spans tiling `offset..` from per-segment token counts.
fn spans(offset: usize, counts: &[usize]) -> Vec<Range<usize>> {
    segment_spans(counts, offset)
}

#[test]
fn sites_resolve_to_the_positions_computed_by_hand() {
    // roles:  sep  in   sep  out  sep  in   sep  out  sep  qin  sep
    // tokens:  1    2    1    3    2    1    1    2    2    2    1   (after a BOS at 0)
    // spans:  1..2 2..4 4..5 5..8 8..10 10..11 11..12 12..14 14..16 16..18 18..19
    let roles = [
        "separator",
        "demo_input",
        "separator",
        "demo_output",
        "separator",
        "demo_input",
        "separator",
        "demo_output",
        "separator",
        "query_input",
        "separator",
    ];
    let p = prompt_of_roles(&roles);
    let s = spans(1, &[1, 2, 1, 3, 2, 1, 1, 2, 2, 2, 1]);
    assert_eq!(s[0], 1..2);
    assert_eq!(s[3], 5..8);
    assert_eq!(s[10], 18..19);
    let n = 19;
    let r = |spec: &str| {
        SiteSpec::parse(spec)
            .unwrap()
            .resolve(0, &p, &s, n)
            .unwrap()
    };
    assert_eq!(
        r("query: last; keys: demo_output, query_input"),
        (vec![18], vec![7, 13, 17])
    );
    assert_eq!(
        r("keys: demo_output[0]; query: last"),
        (vec![18], vec![5, 12])
    );
    assert_eq!(
        r("query: demo_output[1]; keys: demo_output[-2]"),
        (vec![6, 13], vec![6, 12])
    );
    assert_eq!(
        r("query: demo_output#0; keys: demo_output#-1"),
        (vec![7], vec![13])
    );
    assert_eq!(
        r("query: demo_output#1[0]; keys: demo_output#-2[-3]"),
        (vec![12], vec![5])
    );
    assert_eq!(
        r("query: separator#-1, last; keys: separator[0], demo_input#0[-1]"),
        (vec![18, 18], vec![1, 4, 8, 11, 14, 18, 3])
    );
    assert_eq!(
        r(" query :  last ;keys:query_input[ -2 ] "),
        (vec![18], vec![16])
    );
}

fn resolve_err(spec: &str, roles: &[&str], counts: &[usize], n: usize) -> String {
    let p = prompt_of_roles(roles);
    SiteSpec::parse(spec)
        .unwrap()
        .resolve(7, &p, &spans(0, counts), n)
        .unwrap_err()
        .to_string()
}

#[test]
fn site_errors_name_the_prompt_and_the_item() {
    let roles = ["a", "b", "a"];
    let m = resolve_err("query: last; keys: c", &roles, &[1, 1, 1], 3);
    assert_eq!(
        m,
        "invalid input `prompt 7, site `c``: unknown role `c`; the prompt's roles: a, b"
    );
    let m = resolve_err("query: last; keys: b", &roles, &[1, 0, 1], 2);
    assert!(
        m.contains("prompt 7, site `b`") && m.contains("no tokens"),
        "{m}"
    );
    let m = resolve_err("query: a; keys: b", &roles, &[1, 1, 1], 2);
    assert!(
        m.contains("prompt 7, site `a`") && m.contains("past the end"),
        "{m}"
    );
    let m = resolve_err("query: last; keys: a#2", &roles, &[1, 1, 1], 3);
    assert!(
        m.contains("site `a#2`") && m.contains("segment number 2 is out of range"),
        "{m}"
    );
    let m = resolve_err("query: last; keys: a#-3", &roles, &[1, 1, 1], 3);
    assert!(m.contains("site `a#-3`"), "{m}");
    let m = resolve_err("query: last; keys: b[2]", &roles, &[1, 2, 1], 4);
    assert!(
        m.contains("site `b[2]`") && m.contains("token index 2 is out of range"),
        "{m}"
    );
    let m = resolve_err("query: last; keys: b[-3]", &roles, &[1, 2, 1], 4);
    assert!(m.contains("site `b[-3]`"), "{m}");
    // `a#-2` is the first `a` (in range) and `b[-2]` its first token.
    let p = prompt_of_roles(&roles);
    let ok = SiteSpec::parse("query: a#-2; keys: b[-2]")
        .unwrap()
        .resolve(0, &p, &spans(0, &[1, 2, 1]), 4)
        .unwrap();
    assert_eq!(ok, (vec![0], vec![1]));
    // Spans not one per segment.
    let e = SiteSpec::parse("query: last; keys: a")
        .unwrap()
        .resolve(3, &p, &spans(0, &[1, 1]), 2)
        .unwrap_err();
    assert!(e.to_string().contains("prompt 3"), "{e}");
}

#[test]
fn site_specs_parse_display_and_refuse_bad_text() {
    let s = SiteSpec::parse("keys:demo_output , query_input#-1[0];query:last").unwrap();
    assert_eq!(
        s.to_string(),
        "query: last; keys: demo_output, query_input#-1[0]"
    );
    assert_eq!(SiteSpec::parse(&s.to_string()).unwrap(), s);
    assert_eq!(
        "query: last; keys: key"
            .parse::<SiteSpec>()
            .unwrap()
            .to_string(),
        "query: last; keys: key"
    );
    for (bad, needle) in [
        ("query: last", "no `keys:`"),
        ("keys: a", "no `query:`"),
        ("query: last; keys: a; query: b", "twice"),
        ("query: last; key: a", "unknown section `key`"),
        ("query: last; keys: a,,b", "empty item"),
        ("query: last; keys: a#x", "segment number `x`"),
        ("query: last; keys: a[1", "`[` without"),
        ("query: last; keys: a[z]", "token index `z`"),
        ("query: last; keys: #1", "names no role"),
        ("query: last; keys: a b", "contains ` `"),
        ("query last; keys: a", "lacks `query:`"),
    ] {
        let e = SiteSpec::parse(bad).unwrap_err().to_string();
        assert!(e.contains(needle) && e.contains(bad), "{bad}: {e}");
    }
}

#[test]
fn a_set_must_give_the_same_numbers_of_sites_everywhere() {
    let p0 = prompt_of_roles(&["x", "k", "k", "q"]);
    let p1 = prompt_of_roles(&["k", "x", "k", "q"]);
    let p2 = prompt_of_roles(&["k", "q", "k", "k", "q"]);
    let spec = SiteSpec::parse("query: q; keys: k").unwrap();
    let set = PromptSet::new(vec![p0.clone(), p1.clone()], "t").unwrap();
    let sp = vec![spans(1, &[1, 1, 2, 1]), spans(0, &[2, 1, 1, 1])];
    let r = spec.resolve_set(&set, &sp, &[6, 5]).unwrap();
    assert_eq!(r.query.shape(), [2, 1]);
    assert_eq!(r.query.column(0).to_vec(), [5, 4]);
    assert_eq!(r.keys.row(0).to_vec(), [2, 4]);
    assert_eq!(r.keys.row(1).to_vec(), [1, 3]);
    let set = PromptSet::new(vec![p0, p1, p2], "t").unwrap();
    let sp = vec![
        spans(0, &[1, 1, 1, 1]),
        spans(0, &[1, 1, 1, 1]),
        spans(0, &[1, 1, 1, 1, 1]),
    ];
    let e = spec
        .resolve_set(&set, &sp, &[4, 4, 5])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid input `prompt 2`"), "{e}");
    assert!(
        e.contains("2 query and 3 key") && e.contains("prompt 0 gives 1 and 2"),
        "{e}"
    );
}

// ---- hold-out ----

fn grid_set(n_a: usize, n_b: usize, copies: usize) -> PromptSet {
    let mut prompts = Vec::new();
    for c in 0..copies {
        for a in 0..n_a {
            for b in 0..n_b {
                let mut p = prompt_of_roles(&["r"]);
                p.labels.insert("fa".into(), format!("a{a}"));
                p.labels.insert("fb".into(), format!("b{b}"));
                p.labels.insert("copy".into(), c.to_string());
                prompts.push(p);
            }
        }
    }
    PromptSet::new(prompts, "grid").unwrap()
}

#[test]
fn the_hold_out_rule_keeps_every_value_seen() {
    for (n_a, n_b, frac) in [
        (5, 6, 0.25),
        (2, 2, 0.25),
        (3, 7, 0.5),
        (4, 4, 0.75),
        (1, 5, 0.0),
    ] {
        for seed in 0..10 {
            let set = grid_set(n_a, n_b, 2);
            let held = hold_out_combinations(&set, "fa", "fb", frac, seed).unwrap();
            let k = n_held_out(frac, n_a, n_b);
            assert_eq!(held.len(), k);
            assert_eq!(held.iter().collect::<BTreeSet<_>>().len(), k);
            for a in 0..n_a {
                let a = format!("a{a}");
                assert!(
                    held.iter().filter(|h| h.0 == a).count() < n_b,
                    "{a} never seen"
                );
            }
            for b in 0..n_b {
                let b = format!("b{b}");
                assert!(
                    held.iter().filter(|h| h.1 == b).count() < n_a,
                    "{b} never seen"
                );
            }
            assert_eq!(
                held,
                hold_out_combinations(&set, "fa", "fb", frac, seed).unwrap()
            );
            let mut set = set;
            let n_test = apply_hold_out(&mut set, "fa", "fb", &held);
            assert_eq!(n_test, 2 * k);
            for p in &set.prompts {
                let pair = (p.labels["fa"].clone(), p.labels["fb"].clone());
                let test = held.contains(&pair);
                assert_eq!(
                    p.split,
                    Some(if test {
                        PromptSplit::Test
                    } else {
                        PromptSplit::Train
                    })
                );
            }
        }
    }
    assert_eq!(n_held_out(0.25, 5, 6), 8);
    // Different seeds give different draws (5 x 6: C(30, 8) choices).
    let set = grid_set(5, 6, 1);
    let draws: BTreeSet<_> = (0..5)
        .map(|s| hold_out_combinations(&set, "fa", "fb", 0.25, s).unwrap())
        .collect();
    assert!(draws.len() > 1);
}

#[test]
fn impossible_hold_outs_are_refused() {
    let set = grid_set(3, 3, 1);
    // 9 combinations, 3 must stay: 7 (round(0.75 * 9)) cannot be held out.
    let e = hold_out_combinations(&set, "fa", "fb", 0.75, 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot hold out 7") && e.contains("at most 6"),
        "{e}"
    );
    assert_eq!(
        hold_out_combinations(&set, "fa", "fb", 0.6, 0)
            .unwrap()
            .len(),
        5
    );
    let e = hold_out_combinations(&set, "fa", "nope", 0.25, 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("factor `nope`") && e.contains("copy, fa, fb"),
        "{e}"
    );
    assert!(hold_out_combinations(&set, "fa", "fa", 0.25, 0).is_err());
    assert!(hold_out_combinations(&set, "fa", "fb", 1.0, 0).is_err());
    // Prompts that have a split keep it.
    let mut set = grid_set(2, 2, 1);
    set.prompts[0].split = Some(PromptSplit::Test);
    let held = vec![("a1".to_string(), "b1".to_string())];
    apply_hold_out(&mut set, "fa", "fb", &held);
    let splits: Vec<_> = set.splits().into_iter().map(|s| s.unwrap()).collect();
    use PromptSplit::{Test, Train};
    assert_eq!(splits, [Test, Train, Train, Test]);
}

// ---- icl ----

/// The answer re-derived from the labels and the query input, independently of the generator:
/// the domains written out here as strings and the operation's step as a number.
fn icl_answer(operation: &str, domain: &str, input: &str) -> Option<String> {
    let list: Vec<String> = match domain {
        "lower" => ('a'..='z').map(String::from).collect(),
        "upper" => ('A'..='Z').map(String::from).collect(),
        "digits" => (0..10).map(|d| d.to_string()).collect(),
        "number_words" => {
            "one two three four five six seven eight nine ten eleven twelve thirteen \
             fourteen fifteen sixteen seventeen eighteen nineteen twenty"
                .split(' ')
                .map(String::from)
                .collect()
        }
        "weekdays" => "Monday Tuesday Wednesday Thursday Friday Saturday Sunday"
            .split(' ')
            .map(String::from)
            .collect(),
        "months" => {
            "January February March April May June July August September October November December"
                .split(' ')
                .map(String::from)
                .collect()
        }
        _ => return None,
    };
    let step: i64 = match operation {
        "copy" => 0,
        "next" => 1,
        "previous" => -1,
        "skip_forward" => 2,
        "skip_back" => -2,
        _ => return None,
    };
    let i = list.iter().position(|v| v == input)? as i64 + step;
    list.get(usize::try_from(i).ok()?).cloned()
}

#[test]
fn icl_answers_are_correct_and_held_out_combinations_never_train() {
    for (seed, shots) in [(0, 5), (1, 3), (7, 8)] {
        let set = icl(&IclParams {
            n: 300,
            seed,
            shots,
            ..IclParams::default()
        })
        .unwrap();
        assert_eq!(set.len(), 300);
        assert_eq!(set.sites.as_ref().unwrap().to_string(), ICL_SITES);
        let mut train = BTreeSet::new();
        let mut test = BTreeSet::new();
        for p in &set.prompts {
            let (op, dom) = (p.labels["operation"].as_str(), p.labels["domain"].as_str());
            let seg = |role: &str| -> Vec<&str> {
                p.segments
                    .iter()
                    .filter(|s| s.role == role)
                    .map(|s| s.text.strip_prefix(' ').unwrap())
                    .collect()
            };
            let (ins, outs, q) = (seg("demo_input"), seg("demo_output"), seg("query_input"));
            assert_eq!((ins.len(), outs.len(), q.len()), (shots, shots, 1));
            for (x, y) in ins.iter().zip(&outs) {
                assert_eq!(icl_answer(op, dom, x).as_deref(), Some(*y), "{op} {dom}");
            }
            let want = icl_answer(op, dom, q[0]).unwrap();
            assert_eq!(p.answer.as_deref(), Some(format!(" {want}").as_str()));
            // The format: `Q: x\nA: y\n\n` per shot, then `Q: x\nA:`.
            let mut text = String::new();
            for (x, y) in ins.iter().zip(&outs) {
                text += &format!("Q: {x}\nA: {y}\n\n");
            }
            text += &format!("Q: {}\nA:", q[0]);
            assert_eq!(p.text(), text);
            assert_eq!(p.segments.last().unwrap().role, "separator");
            match p.split.unwrap() {
                PromptSplit::Train => train.insert((op.to_string(), dom.to_string())),
                PromptSplit::Test => test.insert((op.to_string(), dom.to_string())),
            };
        }
        assert_eq!(test.len(), 8, "a quarter of 30, rounded");
        assert_eq!(train.len(), 22);
        assert!(train.is_disjoint(&test));
        let ops: BTreeSet<_> = train.iter().map(|c| c.0.as_str()).collect();
        let doms: BTreeSet<_> = train.iter().map(|c| c.1.as_str()).collect();
        assert_eq!(ops.len(), 5);
        assert_eq!(doms.len(), 6);
        // Balanced: 10 prompts per combination.
        let (_, per_combo) = set.counts();
        assert_eq!(per_combo.len(), 30);
        assert!(per_combo.values().all(|&c| c == 10));
        // The held-out combinations are what the training prompts never show.
        let unseen: BTreeSet<String> = set.unseen_in_training().into_iter().collect();
        let expect: BTreeSet<String> = test
            .iter()
            .map(|(o, d)| format!("domain={d},operation={o}"))
            .collect();
        assert_eq!(unseen, expect);
    }
}

#[test]
fn icl_sites_give_one_query_and_shots_plus_one_keys() {
    let set = icl(&IclParams::default()).unwrap();
    let spec = set.sites.clone().unwrap();
    // One token per segment: the spans are 0..1, 1..2, ...
    let sp: Vec<Vec<Range<usize>>> = set
        .prompts
        .iter()
        .map(|p| spans(0, &vec![1; p.segments.len()]))
        .collect();
    let n: Vec<usize> = set.prompts.iter().map(|p| p.segments.len()).collect();
    let r = spec.resolve_set(&set, &sp, &n).unwrap();
    assert_eq!(r.query.shape(), [300, 1]);
    assert_eq!(r.keys.shape(), [300, 6]);
    // Segments: Q: in \nA: out \n\nQ: ... ; demo output s at 4s + 3, the query input at 4 * 5 + 1.
    assert_eq!(r.keys.row(0).to_vec(), [3, 7, 11, 15, 19, 21]);
    assert_eq!(r.query[[0, 0]], 22);
}

#[test]
fn icl_is_seeded_and_refuses_bad_parameters() {
    let a = icl(&IclParams::default()).unwrap();
    let b = icl(&IclParams::default()).unwrap();
    assert_eq!(a.prompts, b.prompts);
    let c = icl(&IclParams {
        seed: 1,
        ..IclParams::default()
    })
    .unwrap();
    assert_ne!(a.prompts, c.prompts);
    for bad in [
        IclParams {
            n: 29,
            ..IclParams::default()
        },
        IclParams {
            shots: 0,
            ..IclParams::default()
        },
        IclParams {
            hold_out: 0.9,
            ..IclParams::default()
        },
    ] {
        assert!(
            matches!(icl(&bad), Err(TasksError::InvalidParam { .. })),
            "{bad:?}"
        );
    }
}

// ---- relations ----

/// The words of a relations prompt (segments without their leading space), the key position and
/// the query position.
fn words_of(p: &Prompt) -> (Vec<&str>, usize, usize) {
    let words: Vec<&str> = p.segments.iter().map(|s| s.text.trim_start()).collect();
    let key = p.segments.iter().position(|s| s.role == "key").unwrap();
    let query = p.segments.iter().position(|s| s.role == "query").unwrap();
    assert_eq!(p.segments.iter().filter(|s| s.role == "key").count(), 1);
    assert_eq!(p.segments.iter().filter(|s| s.role == "query").count(), 1);
    (words, key, query)
}

/// Which relations hold between position `k` and position `q` of `w` (an independent check).
fn relations_holding(w: &[&str], k: usize, q: usize) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    if k + 1 == q {
        out.insert("previous");
    }
    // (A closing quote repeats its opening one: counted as the bracket relation only.)
    if k < q && w[k] == w[q] && w[q] != "\"" {
        out.insert("duplicate");
    }
    // Induction: the key follows an earlier occurrence of the query word.
    if k >= 1 && k < q && w[k - 1] == w[q] {
        out.insert("induction");
    }
    let closes = |o: &str, c: &str| matches!((o, c), ("(", ")") | ("[", "]") | ("\"", "\""));
    if k < q && closes(w[k], w[q]) {
        out.insert("bracket");
    }
    out
}

#[test]
fn relations_hold_exactly_and_the_vocabulary_halves_are_disjoint() {
    let params = RelationsParams {
        n: 400,
        seed: 3,
        ..RelationsParams::default()
    };
    let set = relations(&params).unwrap();
    assert_eq!(set.sites.as_ref().unwrap().to_string(), RELATIONS_SITES);
    let mut words_by_vocab: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut count: BTreeMap<(String, PromptSplit), usize> = BTreeMap::new();
    let symbols = ["(", ")", "[", "]", "\""];
    for p in &set.prompts {
        let (w, k, q) = words_of(p);
        let rel = p.labels["relation"].as_str();
        let vocab = p.labels["vocab"].as_str();
        assert!((8..=16).contains(&w.len()));
        assert_eq!(q, w.len() - 1, "the query is the last word");
        assert!(k < q);
        let holding = relations_holding(&w, k, q);
        if rel == "none" {
            assert!(holding.is_empty(), "{w:?} {k} {q}: {holding:?}");
            assert!(!w[..q].contains(&w[q]), "the query word is new");
        } else {
            assert_eq!(holding, BTreeSet::from([rel]), "{rel}: {w:?} {k} {q}");
        }
        if rel == "induction" {
            // A repeated random sequence: w[q - m + 1 ..= q] repeats w[0 ..] for m = q - k + 1.
            let m = q - k + 1;
            for i in m..w.len() {
                assert_eq!(w[i], w[i - m], "{w:?}");
            }
        }
        let split = p.split.unwrap();
        assert_eq!(
            vocab,
            if split == PromptSplit::Train {
                "a"
            } else {
                "b"
            }
        );
        for x in &w {
            if !symbols.contains(x) {
                words_by_vocab.entry(vocab).or_default().insert(x);
            }
        }
        *count.entry((rel.to_string(), split)).or_insert(0) += 1;
        // The first word has no leading space, the others one.
        assert!(!p.segments[0].text.starts_with(' '));
        assert!(p.segments[1..].iter().all(|s| s.text.starts_with(' ')));
    }
    assert!(words_by_vocab["a"].is_disjoint(&words_by_vocab["b"]));
    let (a, b) = vocabulary_halves(
        &words::COMMON_WORDS
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
        3,
    );
    assert_eq!((a.len(), b.len()), (32, 32));
    assert!(words_by_vocab["a"].iter().all(|w| a.iter().any(|x| x == w)));
    assert!(words_by_vocab["b"].iter().all(|w| b.iter().any(|x| x == w)));
    // Balanced: 200 train and 200 test prompts, 40 per relation in each.
    assert_eq!(count.len(), 10);
    assert!(count.values().all(|&c| c == 40), "{count:?}");
    // The test split's vocabulary is what the training prompts never show.
    assert_eq!(set.unseen_in_training(), ["vocab=b"]);
}

#[test]
fn relations_take_a_word_list_and_refuse_bad_parameters() {
    let words: Vec<String> = (0..12).map(|i| format!("w{i}")).collect();
    let set = relations(&RelationsParams {
        n: 50,
        min_len: 5,
        max_len: 6,
        words: Some(words.clone()),
        ..RelationsParams::default()
    })
    .unwrap();
    for p in &set.prompts {
        let (w, _, _) = words_of(p);
        assert!((5..=6).contains(&w.len()));
        assert!(w
            .iter()
            .all(|x| words.iter().any(|y| y == x) || "()[]\"".contains(*x)));
    }
    let bad = |p: RelationsParams| relations(&p).unwrap_err().to_string();
    let base = RelationsParams::default();
    assert!(bad(RelationsParams {
        n: 0,
        ..base.clone()
    })
    .contains("`n`"));
    assert!(bad(RelationsParams {
        min_len: 4,
        ..base.clone()
    })
    .contains("`min_len`"));
    assert!(bad(RelationsParams {
        max_len: 7,
        ..base.clone()
    })
    .contains("`max_len`"));
    assert!(bad(RelationsParams {
        test_fraction: 1.0,
        ..base.clone()
    })
    .contains("`test_fraction`"));
    let m = bad(RelationsParams {
        words: Some(words.clone()),
        ..base.clone()
    });
    assert!(m.contains("`words`") && m.contains("at least 32"), "{m}");
    let m = bad(RelationsParams {
        words: Some(vec!["a b".into(); 40]),
        ..base.clone()
    });
    assert!(m.contains("whitespace"), "{m}");
    let mut dup: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
    dup[5] = "w1".into();
    assert!(bad(RelationsParams {
        words: Some(dup),
        ..base
    })
    .contains("duplicate"));
    // Seeded.
    let again = relations(&RelationsParams {
        n: 50,
        min_len: 5,
        max_len: 6,
        words: Some(words),
        ..RelationsParams::default()
    })
    .unwrap();
    assert_eq!(again.prompts, set.prompts);
}

#[test]
fn the_word_list_is_64_distinct_lowercase_words() {
    assert_eq!(words::COMMON_WORDS.len(), 64);
    words::check_words(words::COMMON_WORDS).unwrap();
    assert!(words::COMMON_WORDS
        .iter()
        .all(|w| w.chars().all(|c| c.is_ascii_lowercase())));
}

#[test]
fn sites_are_checked_on_segments_before_tokenization() {
    let set = icl(&IclParams::default()).unwrap();
    let spec =
        SiteSpec::parse("query: last, query_input[5]; keys: demo_output, separator#0").unwrap();
    assert_eq!(spec.check_segments(&set).unwrap(), (2, 6));
    let e = SiteSpec::parse("query: last; keys: demo_output#5")
        .unwrap()
        .check_segments(&set)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("prompt 0, site `demo_output#5`") && e.contains("out of range"),
        "{e}"
    );
    let e = SiteSpec::parse("query: last; keys: answer")
        .unwrap()
        .check_segments(&set)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown role `answer`; the prompt's roles: separator, demo_input, demo_output, query_input"),
        "{e}"
    );
}

#[test]
fn word_files_are_read_and_checked_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "w.txt", " apple\n\nbanana \ncherry\n");
    assert_eq!(
        words::read_words(&p).unwrap(),
        ["apple", "banana", "cherry"]
    );
    let p = write(dir.path(), "bad.txt", "apple\nbanana\n\nto be\n");
    let e = words::read_words(&p).unwrap_err().to_string();
    assert!(
        e.contains("bad.txt: line 4:") && e.contains("whitespace"),
        "{e}"
    );
    let p = write(dir.path(), "dup.txt", "apple\napple\n");
    let e = words::read_words(&p).unwrap_err().to_string();
    assert!(
        e.contains("dup.txt: line 2:") && e.contains("duplicate"),
        "{e}"
    );
    let p = write(dir.path(), "empty.txt", "\n");
    assert!(words::read_words(&p)
        .unwrap_err()
        .to_string()
        .contains("line 0"));
}
