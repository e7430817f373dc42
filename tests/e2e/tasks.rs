//! `hyperlens tasks splits` and `hyperlens tasks sample`: the split table against the committed
//! split data, and sampled problem sets whose answers are recomputed here from the rules.

use std::collections::BTreeSet;

use ndarray::ArrayD;

use crate::util::{array, entries, hyperlens, json, repo_path, s, tempdir};

/// The held-out task lists of the paper's splits (`data/splits/paper-splits.json`), by name.
fn paper_ood_tasks(name: &str) -> BTreeSet<Vec<i64>> {
    let v = json(&repo_path("data/splits/paper-splits.json"));
    v["splits"][name]
        .as_array()
        .unwrap_or_else(|| panic!("no split {name}"))
        .iter()
        .map(|t| {
            t.as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_i64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn splits_table_matches_the_split_data() {
    let r = hyperlens(&["tasks", "splits"]);
    let out = r.success();
    // The tasks are the multisets of 4 of the 8 rules: C(8 + 4 - 1, 4) = 330; a quarter held out.
    let all = (8..=11).product::<usize>() / (1..=4).product::<usize>();
    assert_eq!(all, 330);
    let mut names = Vec::new();
    for line in out.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (id, ood): (usize, usize) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        assert_eq!(id + ood, all, "{line}");
        if f[0] != "seed{N}" {
            assert_eq!(ood, paper_ood_tasks(f[0]).len(), "{line}");
        }
        assert_eq!(ood, all / 4, "{line}");
        names.push(f[0]);
    }
    assert_eq!(
        names,
        [
            "paper-seed0",
            "paper-seed1",
            "paper-seed2",
            "paper-seed2024",
            "seed{N}"
        ]
    );
}

/// The value of `feature` in `panel` (0..8) of problem `n`: panel p is tokens 4p..4p+4 and slot k
/// of a panel in column c shows feature `perms[n, c, k]`; the token is one-hot.
fn value(x: &ArrayD<u8>, perms: &ArrayD<i64>, n: usize, panel: usize, feature: i64) -> i64 {
    let slot = (0..4)
        .find(|&k| perms[[n, panel % 3, k]] == feature)
        .expect("perms is a permutation");
    let token: Vec<u8> = (0..8).map(|m| x[[n, 4 * panel + slot, m]]).collect();
    assert_eq!(
        token.iter().map(|&b| b as usize).sum::<usize>(),
        1,
        "one-hot {token:?}"
    );
    token.iter().position(|&b| b == 1).unwrap() as i64
}

/// The answer of a row whose first two panels show `a`, `b` under `rule`, values mod 8; `row0` is
/// the first row, which fixes the three symbols of distribute-three.
fn answer(rule: i64, a: i64, b: i64, row0: [i64; 3]) -> i64 {
    let step = |d: i64| {
        assert_eq!((a + d).rem_euclid(8), b, "progression {d}: {a}, {b}");
        (a + 2 * d).rem_euclid(8)
    };
    match rule {
        0 => {
            assert_eq!(a, b, "constant");
            a
        }
        1 => step(1),
        2 => step(2),
        3 => step(-1),
        4 => step(-2),
        5 => (a + b).rem_euclid(8),
        6 => (a - b).rem_euclid(8),
        7 => {
            let rest: Vec<i64> = row0.into_iter().filter(|v| *v != a && *v != b).collect();
            assert_eq!(rest.len(), 1, "distribute-three: {row0:?}, {a}, {b}");
            rest[0]
        }
        _ => panic!("rule {rule}"),
    }
}

/// Checks a written problem set: shapes and dtypes, one-hot context tokens and empty queries, every
/// task in `tasks`, and every answer recomputed from its rule. Returns the rule counts per slot.
fn check_problems(path: &std::path::Path, n: usize, tasks: &BTreeSet<Vec<i64>>) -> Vec<[usize; 8]> {
    let x: ArrayD<u8> = array(path, "x");
    let y: ArrayD<i64> = array(path, "y");
    let rules: ArrayD<i64> = array(path, "rules");
    let perms: ArrayD<i64> = array(path, "perms");
    assert_eq!(x.shape(), &[n, 36, 8]);
    assert_eq!(y.shape(), &[n, 4]);
    assert_eq!(rules.shape(), &[n, 4]);
    assert_eq!(perms.shape(), &[n, 3, 4]);
    let mut counts = vec![[0usize; 8]; 4];
    for i in 0..n {
        // The 4 query tokens are empty.
        assert!((32..36).all(|t| (0..8).all(|m| x[[i, t, m]] == 0)));
        let task: Vec<i64> = (0..4).map(|f| rules[[i, f]]).collect();
        assert!(
            tasks.contains(&task),
            "problem {i}: task {task:?} not in the set"
        );
        for c in 0..3 {
            let p: BTreeSet<i64> = (0..4).map(|k| perms[[i, c, k]]).collect();
            assert_eq!(p, (0..4).collect(), "perms[{i}, {c}]");
        }
        for k in 0..4 {
            // Slot k of the answer panel (column 2) shows feature perms[i, 2, k].
            let f = perms[[i, 2, k]];
            let rule = rules[[i, f as usize]];
            let row0 = [0, 1, 2].map(|p| value(&x, &perms, i, p, f));
            let (a, b) = (value(&x, &perms, i, 6, f), value(&x, &perms, i, 7, f));
            assert_eq!(
                y[[i, k]],
                answer(rule, a, b, row0),
                "problem {i}, slot {k}, rule {rule}"
            );
        }
        for (f, c) in counts.iter_mut().enumerate() {
            c[rules[[i, f]] as usize] += 1;
        }
    }
    counts
}

#[test]
fn sample_writes_problems_whose_answers_follow_their_rules() {
    let tmp = tempdir();
    let out = tmp.path().join("ood.npz");
    let args = [
        "tasks",
        "sample",
        "--split",
        "paper-seed2024",
        "--set",
        "ood",
        "--n",
        "300",
        "--seed",
        "3",
        "--out",
        s(&out),
    ];
    let text = hyperlens(&args).success().to_string();
    let ood = paper_ood_tasks("paper-seed2024");
    let counts = check_problems(&out, 300, &ood);
    // The permutations are not all the identity.
    let perms: ArrayD<i64> = array(&out, "perms");
    assert!(perms.indexed_iter().any(|(ix, &v)| v != ix[2] as i64));

    // The summary agrees with the file: tasks covered, and the rule counts per slot.
    let rules: ArrayD<i64> = array(&out, "rules");
    let covered: BTreeSet<Vec<i64>> = rules
        .outer_iter()
        .map(|r| r.iter().copied().collect())
        .collect();
    assert!(
        text.contains(&format!("tasks covered: {} of 82\n", covered.len())),
        "{text}"
    );
    for (slot, c) in counts.iter().enumerate() {
        let cells: String = c.iter().map(|v| format!("{v:>6}")).collect();
        assert!(
            text.contains(&format!("  slot {slot}: {cells}\n")),
            "{text}"
        );
        assert_eq!(c.iter().sum::<usize>(), 300);
    }
    let side = json(&tmp.path().join("ood.json"));
    assert_eq!(side["split"], "paper-seed2024");
    assert_eq!(side["set"], "ood");
    assert_eq!(
        (side["n"].as_u64(), side["seed"].as_u64()),
        (Some(300), Some(3))
    );
    assert_eq!(side["unpermuted"], false);
    for k in ["answer_differs", "every_feature_differs"] {
        let a = side["ambiguity"][k].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&a), "{k} {a}");
    }

    // The same seed gives the same bytes; another seed other problems.
    let again = tmp.path().join("again.npz");
    let mut a2 = args;
    a2[11] = s(&again);
    hyperlens(&a2).success();
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
    let other = tmp.path().join("other.npz");
    a2[9] = "4";
    a2[11] = s(&other);
    hyperlens(&a2).success();
    assert_ne!(array::<u8>(&out, "x"), array::<u8>(&other, "x"));

    // Unpermuted in-distribution problems: identity permutations, tasks outside the OOD list.
    let id = tmp.path().join("id.npz");
    hyperlens(&[
        "tasks",
        "sample",
        "--split",
        "paper-seed2024",
        "--n",
        "100",
        "--unpermuted",
        "--out",
        s(&id),
    ])
    .success();
    let all: BTreeSet<Vec<i64>> = (0..8)
        .flat_map(|a| {
            (a..8)
                .flat_map(move |b| (b..8).flat_map(move |c| (c..8).map(move |d| vec![a, b, c, d])))
        })
        .collect();
    let id_tasks: BTreeSet<Vec<i64>> = all.difference(&ood).cloned().collect();
    assert_eq!(id_tasks.len(), 248);
    check_problems(&id, 100, &id_tasks);
    let perms: ArrayD<i64> = array(&id, "perms");
    assert!(perms.indexed_iter().all(|(ix, &v)| v == ix[2] as i64));
    assert_eq!(json(&tmp.path().join("id.json"))["unpermuted"], true);
}

#[test]
fn sample_refuses_bad_values_and_writes_nothing() {
    let tmp = tempdir();
    let out = tmp.path().join("p.npz");
    let o = s(&out);
    hyperlens(&["tasks", "sample", "--n", "0", "--out", o]).failure(&["--n must be at least 1"]);
    hyperlens(&["tasks", "sample", "--split", "paper-seed7", "--out", o]).failure(&[
        "--split",
        "paper-seed7",
        "seed{N}",
    ]);
    hyperlens(&["tasks", "sample", "--task", "induction", "--out", o])
        .failure(&["--task induction"]);
    hyperlens(&[
        "tasks",
        "sample",
        "--task",
        "logic",
        "--split",
        "paper-seed0",
        "--out",
        o,
    ])
    .failure(&["--split paper-seed0", "seed{N}"]);
    hyperlens(&["tasks", "sample", "--set", "unknown", "--out", o]).failure(&["--set unknown"]);
    assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
    // `--out` follows the one rule of every command: a missing parent directory is created.
    let missing = tmp.path().join("no-such-dir/p.npz");
    hyperlens(&["tasks", "sample", "--n", "4", "--out", s(&missing)]).success();
    assert!(missing.is_file());
}

#[test]
fn sample_usage_errors() {
    hyperlens(&["tasks", "sample", "--set", "foo", "--out", "p.npz"])
        .usage_error(&["invalid value 'foo' for '--set <SET>'", "id, ood"]);
    hyperlens(&["tasks", "sample", "--n", "many", "--out", "p.npz"])
        .usage_error(&["invalid value 'many' for '--n <N>'"]);
    hyperlens(&["tasks", "sample", "--n", "4"]).usage_error(&["--out <OUT>"]);
    hyperlens(&["tasks", "nope"]).usage_error(&["unrecognized subcommand 'nope'"]);
}
