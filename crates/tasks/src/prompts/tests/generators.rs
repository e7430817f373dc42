//! Tests of the `icl` and `relations` generators and the word lists, against independent small functions.

use super::*;

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

#[test]
fn icl_answer_under_another_operation_follows_the_domain() {
    let set = icl(&IclParams::default()).unwrap();
    let mut defined = 0;
    for p in &set.prompts {
        let dom = p.labels["domain"].as_str();
        let q = p.segments.iter().find(|s| s.role == "query_input").unwrap();
        let input = q.text.strip_prefix(' ').unwrap();
        // Its own operation gives its own answer.
        assert_eq!(
            icl_answer_under(p, &p.labels["operation"]),
            p.answer.clone()
        );
        for op in Operation::ALL {
            let want = icl_answer(op.as_str(), dom, input).map(|a| format!(" {a}"));
            defined += usize::from(want.is_some());
            assert_eq!(icl_answer_under(p, op.as_str()), want, "{op} {dom} {input}");
        }
        assert_eq!(icl_answer_under(p, "twice"), None);
    }
    // Some answers fall outside their domain (no wrapping), most do not.
    assert!(defined > 1000 && defined < 1500, "{defined}");
    // By hand: `c` under skip_back is `a`; `b` has none; July under next is August.
    let mut p = icl(&IclParams::default()).unwrap().prompts[0].clone();
    let seg = p
        .segments
        .iter_mut()
        .find(|s| s.role == "query_input")
        .unwrap();
    seg.text = " c".into();
    p.labels.insert("domain".into(), "lower".into());
    assert_eq!(icl_answer_under(&p, "skip_back").as_deref(), Some(" a"));
    assert_eq!(icl_answer_under(&p, "copy").as_deref(), Some(" c"));
    p.segments
        .iter_mut()
        .find(|s| s.role == "query_input")
        .unwrap()
        .text = " b".into();
    assert_eq!(icl_answer_under(&p, "skip_back"), None);
    p.segments
        .iter_mut()
        .find(|s| s.role == "query_input")
        .unwrap()
        .text = " July".into();
    p.labels.insert("domain".into(), "months".into());
    assert_eq!(icl_answer_under(&p, "next").as_deref(), Some(" August"));
    // Not defined: a value outside the domain, an unknown domain, no domain label.
    assert_eq!(icl_answer_under(&p, "previous").as_deref(), Some(" June"));
    p.labels.insert("domain".into(), "digits".into());
    assert_eq!(icl_answer_under(&p, "next"), None);
    p.labels.insert("domain".into(), "colours".into());
    assert_eq!(icl_answer_under(&p, "next"), None);
    p.labels.remove("domain");
    assert_eq!(icl_answer_under(&p, "next"), None);
}
