//! The report's judgements of one checkpoint and of the set: which layer decodes the rule best
//! (only a layer above the majority baseline counts), whether a checkpoint is at chance, and the
//! sentences built on them.

use std::fmt::Write as _;

use hyperlens_analysis::codes::report::LayerSel;
use hyperlens_model::EvalMetrics;
use hyperlens_tasks::sraven::SravenParams;

use crate::data::Entry;
use crate::sraven::text::{majority, per_layer};
use crate::words::{md_escape, pct, thousands};

/// The paper's training budget: 156,250 updates of batch 128 (Schug et al. 2025; docs/spec/models.md,
/// "Training recipe").
pub const PAPER_STEPS: u64 = 156_250;

/// The significance level of the chance test: a checkpoint is at chance when guessing would solve
/// at least as many problems with probability at least this.
pub const CHANCE_P: f64 = 1e-3;

/// The most accurate per-layer rule probe of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BestLayer {
    /// The layer.
    pub layer: LayerSel,
    /// Its OOD decoding accuracy.
    pub accuracy: f64,
    /// Whether it beats the majority-class baseline; only then is it called the best layer.
    pub above_baseline: bool,
}

/// The per-layer probe with the highest OOD accuracy (the first of equals), marked whether it is
/// above the majority baseline; `None` without per-layer results.
pub fn best_layer(e: &Entry) -> Option<BestLayer> {
    let maj = majority(e);
    per_layer(e).into_iter().fold(None::<BestLayer>, |best, a| {
        let acc = a.decoding.accuracy;
        match best {
            Some(b) if b.accuracy >= acc => Some(b),
            _ => Some(BestLayer {
                layer: a.layer,
                accuracy: acc,
                above_baseline: acc > maj,
            }),
        }
    })
}

/// The text of the summary table's decoding column: `3 (65.2 %)`, or `none above baseline
/// (max 33.3 %, layer 0)`.
pub fn best_layer_cell(e: &Entry) -> String {
    match best_layer(e) {
        Some(b) if b.above_baseline => format!("{} ({})", b.layer, pct(b.accuracy)),
        Some(b) => format!(
            "none above baseline (max {}, layer {})",
            pct(b.accuracy),
            b.layer
        ),
        None => "-".into(),
    }
}

/// Where a set of problems stands against guessing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chance {
    /// Problems solved (all features right).
    pub solved: u64,
    /// Problems evaluated.
    pub n: u64,
    /// The accuracy of uniform guessing, `(1/M)^F`.
    pub level: f64,
    /// Whether guessing would solve at least `solved` problems with probability at least
    /// [`CHANCE_P`] (an exact binomial test).
    pub at_chance: bool,
}

/// `P(X >= k)` for `X ~ Binomial(n, p)`, summed over the upper tail in log space (no cancellation,
/// no overflow for large `n`).
pub fn binomial_upper_tail(n: u64, k: u64, p: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n || p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    let (lp, lq) = (p.ln(), (1.0 - p).ln());
    // log C(n, k) by a running sum of logs
    let mut log_c = 0.0;
    for i in 0..k {
        log_c += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
    }
    let mut total = 0.0;
    let mut log_pmf = log_c + k as f64 * lp + (n - k) as f64 * lq;
    for i in k..=n {
        total += log_pmf.exp();
        if i < n {
            log_pmf += ((n - i) as f64).ln() - ((i + 1) as f64).ln() + lp - lq;
        }
    }
    total.min(1.0)
}

/// Whether `m` is at chance for problems with `task.features` slots of `task.values` values.
pub fn chance(m: &EvalMetrics, task: SravenParams) -> Chance {
    let level =
        (1.0 / task.values.max(1) as f64).powi(i32::try_from(task.features).unwrap_or(i32::MAX));
    let n = m.n as u64;
    let solved = (m.accuracy * m.n as f64).round().max(0.0) as u64;
    Chance {
        solved,
        n,
        level,
        at_chance: binomial_upper_tail(n, solved, level) >= CHANCE_P,
    }
}

/// Whether a checkpoint is at chance on both ID and OOD problems.
pub fn at_chance(e: &Entry) -> bool {
    chance(&e.id, e.task).at_chance && chance(&e.ood, e.task).at_chance
}

/// One paragraph on a checkpoint: accuracy (and whether it is at chance), the decoding verdict
/// and the clustering of the final layer.
pub fn findings(e: &Entry) -> String {
    let mut s = String::new();
    let name = md_escape(&e.name);
    let gap = e.ood.accuracy - e.id.accuracy;
    let _ = write!(
        s,
        "{name} ({}) solves {} of in-distribution and {} of OOD problems ({}).",
        e.mixer,
        pct(e.id.accuracy),
        pct(e.ood.accuracy),
        if gap.abs() < 0.02 {
            "no generalisation gap".to_string()
        } else {
            format!("a gap of {:+.1} points", 100.0 * gap)
        }
    );
    if at_chance(e) {
        let c = chance(&e.ood, e.task);
        let _ = write!(
            s,
            " **It is at chance**: {} of {} OOD problems solved is no more than guessing would get (chance {:.3} %, exact binomial test at p = {}), so its codes show an untrained model, not a solution.",
            c.solved,
            c.n,
            100.0 * c.level,
            CHANCE_P
        );
    }
    match best_layer(e) {
        Some(b) if b.above_baseline => {
            let _ = write!(
                s,
                " A linear probe trained on ID codes decodes the rule of OOD problems best at layer {} ({} against a majority baseline of {}).",
                b.layer,
                pct(b.accuracy),
                pct(majority(e))
            );
        }
        Some(b) => {
            let _ = write!(
                s,
                " No layer's linear probe decodes the rule of OOD problems above the majority baseline of {}: the most accurate, layer {}, reaches {}, so the codes do not carry the rule in a linearly readable form.",
                pct(majority(e)),
                b.layer,
                pct(b.accuracy)
            );
        }
        None => {}
    }
    if let Some(c) = per_layer(e).last().and_then(|a| a.clusters.as_ref()) {
        let _ = write!(
            s,
            " k-means on the final layer's codes recovers the rules with ARI {:.2} and NMI {:.2}.",
            c.ari, c.nmi
        );
    }
    s
}

/// Sentences for the accuracy bar chart comparing the checkpoints.
pub fn accuracy_text(entries: &[Entry]) -> String {
    let hi_lo = |f: fn(&Entry) -> f64| {
        let hi = entries.iter().max_by(|a, b| f(a).total_cmp(&f(b)));
        let lo = entries.iter().min_by(|a, b| f(a).total_cmp(&f(b)));
        (hi, lo)
    };
    let mut s = String::new();
    match entries {
        [] => {}
        [e] => {
            let _ = write!(
                s,
                "{} solves {} of in-distribution and {} of OOD problems.",
                md_escape(&e.name),
                pct(e.id.accuracy),
                pct(e.ood.accuracy)
            );
        }
        _ => {
            if let (Some(hi), Some(lo)) = hi_lo(|e| e.ood.accuracy) {
                let _ = write!(
                    s,
                    "OOD accuracy ranges from {} ({}) to {} ({}).",
                    pct(lo.ood.accuracy),
                    md_escape(&lo.name),
                    pct(hi.ood.accuracy),
                    md_escape(&hi.name)
                );
            }
            if let (Some(g), _) = hi_lo(|e| (e.id.accuracy - e.ood.accuracy).abs()) {
                let _ = write!(
                    s,
                    " The largest difference between OOD and ID accuracy is {:+.1} points ({}).",
                    100.0 * (g.ood.accuracy - g.id.accuracy),
                    md_escape(&g.name)
                );
            }
        }
    }
    let names = |pred: &dyn Fn(&Entry) -> bool| -> Vec<String> {
        entries
            .iter()
            .filter(|e| pred(e))
            .map(|e| md_escape(&e.name))
            .collect()
    };
    let chance_names = names(&|e| at_chance(e));
    if !chance_names.is_empty() {
        let _ = write!(
            s,
            " {} {} at chance (no more problems solved than guessing would get).",
            chance_names.join(", "),
            if chance_names.len() == 1 { "is" } else { "are" }
        );
    }
    let short = names(&|e| e.steps.is_some_and(|st| st.done < PAPER_STEPS));
    if !short.is_empty() {
        let _ = write!(
            s,
            " {} trained for fewer updates than the paper's {} (column \"updates trained\"), so {} accuracies are not the paper's comparison.",
            short.join(", "),
            thousands(PAPER_STEPS),
            if short.len() == 1 { "its" } else { "their" }
        );
    }
    s.trim_start().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_tail_matches_hand_values() {
        assert_eq!(binomial_upper_tail(10, 0, 0.3), 1.0);
        assert_eq!(binomial_upper_tail(10, 11, 0.3), 0.0);
        // P(X >= 1) = 1 - 0.7^10
        let t = binomial_upper_tail(10, 1, 0.3);
        assert!((t - (1.0 - 0.7f64.powi(10))).abs() < 1e-12, "{t}");
        // P(X = 10) = 0.3^10
        let t = binomial_upper_tail(10, 10, 0.3);
        assert!((t - 0.3f64.powi(10)).abs() < 1e-18, "{t}");
        // large n without overflow: a quarter of 100,000 at p = 1/8 is far in the tail
        assert!(binomial_upper_tail(100_000, 25_000, 0.125) < 1e-100);
    }

    #[test]
    fn chance_is_an_exact_test_against_guessing() {
        let task = SravenParams::default();
        let m = |acc: f64| EvalMetrics {
            n: 2048,
            accuracy: acc,
            per_feature_accuracy: vec![acc; 4],
            loss: 2.0,
        };
        // (1/8)^4 = 0.024 %: about half a problem in 2048 by guessing
        assert!(chance(&m(0.0), task).at_chance);
        assert!(chance(&m(1.0 / 2048.0), task).at_chance);
        assert!(!chance(&m(8.0 / 2048.0), task).at_chance);
        assert!(!chance(&m(0.55), task).at_chance);
        let c = chance(&m(0.5), task);
        assert_eq!((c.solved, c.n), (1024, 2048));
        assert!((c.level - 1.0 / 4096.0).abs() < 1e-15);
    }
}
