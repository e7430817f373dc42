//! Tests of the hold-out rule.

use super::*;

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
