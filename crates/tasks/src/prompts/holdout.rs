//! The hold-out rule for prompts without a split: a seeded fraction of the combinations of two
//! factors held out, every value of each factor still seen in training (as SRAVEN's seeded splits
//! hold out a quarter of the tasks, `docs/spec/sraven.md`).

use std::collections::{BTreeMap, BTreeSet};

use rand::seq::SliceRandom;

use super::format::{PromptSet, PromptSplit};
use crate::error::{Result, TasksError};
use crate::rng::{self, Domain};

/// The default fraction of combinations held out: a quarter, as SRAVEN's splits.
pub const DEFAULT_HOLD_OUT: f64 = 0.25;

/// The number of combinations held out of `n_a * n_b`: `round(fraction * n_a * n_b)` (halves
/// round up).
pub fn n_held_out(fraction: f64, n_a: usize, n_b: usize) -> usize {
    (fraction * (n_a * n_b) as f64).round() as usize
}

/// Draws the held-out `(a, b)` value pairs of factors `factor_a` and `factor_b`.
///
/// Of the `n_a * n_b` combinations of the two factors' values ([`PromptSet::factors`]),
/// [`n_held_out`] are held out, drawn among those the set's prompts have, so that every value of
/// `factor_a` and every value of `factor_b` keeps at least one combination seen in training. The
/// draw is a seeded shuffle of the present combinations (`seed`, a stream of its own), taken in
/// order, a combination held out unless it is the last seen one of its `a` or `b` value; if that
/// leaves fewer than asked, the next of 64 reshuffles is tried.
///
/// # Errors
/// [`TasksError::InvalidParam`] for a fraction outside `[0, 1)`; [`TasksError::InvalidInput`]
/// for a factor no prompt has, the same factor twice, or a count that cannot keep every value
/// seen (more than the present combinations minus `max(n_a, n_b)`).
pub fn hold_out_combinations(
    set: &PromptSet,
    factor_a: &str,
    factor_b: &str,
    fraction: f64,
    seed: u64,
) -> Result<Vec<(String, String)>> {
    if !(0.0..1.0).contains(&fraction) {
        return Err(TasksError::param(
            "fraction",
            format!("must be in [0, 1), got {fraction}"),
        ));
    }
    if factor_a == factor_b {
        return Err(TasksError::input(
            "factors",
            format!("hold out combinations of two different factors, got `{factor_a}` twice"),
        ));
    }
    let factors = set.factors();
    let values = |name: &str| {
        factors
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.values.len())
            .ok_or_else(|| {
                TasksError::input(
                    format!("factor `{name}`"),
                    format!(
                        "no prompt has this label; the set's factors: {}",
                        factors
                            .iter()
                            .map(|f| f.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
    };
    let (n_a, n_b) = (values(factor_a)?, values(factor_b)?);
    let present: Vec<(String, String)> = set
        .prompts
        .iter()
        .filter_map(|p| {
            Some((
                p.labels.get(factor_a)?.clone(),
                p.labels.get(factor_b)?.clone(),
            ))
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let k = n_held_out(fraction, n_a, n_b);
    if k + n_a.max(n_b) > present.len() {
        return Err(TasksError::input(
            format!("factors `{factor_a}` x `{factor_b}`"),
            format!(
                "cannot hold out {k} of the {} combinations present ({n_a} x {n_b} values) and \
                 keep every value seen in training (at most {})",
                present.len(),
                present.len().saturating_sub(n_a.max(n_b))
            ),
        ));
    }
    for attempt in 0..64 {
        let mut order = present.clone();
        order.shuffle(&mut rng::stream(seed, Domain::PromptHoldOut, 0, attempt));
        let mut seen_a: BTreeMap<&str, usize> = BTreeMap::new();
        let mut seen_b: BTreeMap<&str, usize> = BTreeMap::new();
        for (a, b) in &present {
            *seen_a.entry(a).or_insert(0) += 1;
            *seen_b.entry(b).or_insert(0) += 1;
        }
        let mut held = Vec::with_capacity(k);
        for (a, b) in &order {
            if held.len() == k {
                break;
            }
            if seen_a[a.as_str()] > 1 && seen_b[b.as_str()] > 1 {
                *seen_a.get_mut(a.as_str()).unwrap_or(&mut 0) -= 1;
                *seen_b.get_mut(b.as_str()).unwrap_or(&mut 0) -= 1;
                held.push((a.clone(), b.clone()));
            }
        }
        if held.len() == k {
            held.sort();
            return Ok(held);
        }
    }
    Err(TasksError::input(
        format!("factors `{factor_a}` x `{factor_b}`"),
        format!("found no way to hold out {k} combinations keeping every value seen in 64 draws"),
    ))
}

/// Sets the split of every prompt that has none: `test` if its `(factor_a, factor_b)` labels are
/// a pair of `held_out`, `train` otherwise (a prompt lacking either label included). Prompts that
/// have a split keep it. Returns the number of prompts set to `test`.
pub fn apply_hold_out(
    set: &mut PromptSet,
    factor_a: &str,
    factor_b: &str,
    held_out: &[(String, String)],
) -> usize {
    let held: BTreeSet<(&str, &str)> = held_out
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let mut n_test = 0;
    for p in &mut set.prompts {
        if p.split.is_some() {
            continue;
        }
        let pair = p
            .labels
            .get(factor_a)
            .zip(p.labels.get(factor_b))
            .map(|(a, b)| (a.as_str(), b.as_str()));
        let test = pair.is_some_and(|pair| held.contains(&pair));
        n_test += usize::from(test);
        p.split = Some(if test {
            PromptSplit::Test
        } else {
            PromptSplit::Train
        });
    }
    n_test
}
