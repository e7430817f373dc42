//! The sentences of the fuzzy-logic section, generated from its numbers: term decoding, the
//! training log and the comparison with Table A1; and the small formatting helpers they share.

use std::fmt::Write as _;

use hyperlens_analysis::terms::TermDecodingRow;
use hyperlens_model::Mixer;
use hyperlens_train::metrics::MetricsRow;

use crate::data::LogicEntry;
use crate::logic::{PAPER_LOGIC_OOD_R2, PAPER_LOGIC_STEPS};
use crate::words::{md_escape, steps_text, thousands};

/// `0.931`, or `-` for a value not measured.
pub(super) fn r2_text(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

/// Sentences on one checkpoint's term decoding: the best layer's F1 against its controls, and the
/// ridge R² of the term matrix.
pub fn decoding_text(e: &LogicEntry) -> String {
    let mut s = String::new();
    let where_ = |r: &TermDecodingRow| {
        r.layer
            .map_or_else(|| "all layers".to_string(), |l| format!("layer {l}"))
    };
    // The best of the layers and of all layers together (on a tie, the first: a single layer).
    let Some(best) = e
        .decoding
        .iter()
        .rev()
        .max_by(|a, b| a.f1_mean.total_cmp(&b.f1_mean))
    else {
        return s;
    };
    let control = best.f1_base_rate.max(best.f1_shuffled);
    let layer = where_(best);
    let _ = write!(
        s,
        "The per-term probes, trained on the ID tasks' codes and tested on held-out pairs of known terms, reach their best mean F1 at {layer}: {:.3} against {:.3} for answering yes everywhere (base rate) and {:.3} for probes trained on shuffled labels ({} terms scored).",
        best.f1_mean, best.f1_base_rate, best.f1_shuffled, best.n_terms
    );
    let margin = best.f1_mean - control;
    if margin > 0.05 {
        let _ = write!(
            s,
            " The codes name the terms beyond the controls, by {margin:.3} in F1."
        );
    } else if margin >= -0.05 {
        s.push_str(" That is within 0.05 of the better control: the probes do no better than the controls.");
    } else {
        let _ = write!(
            s,
            " That is {:.3} below the better control: the probes do worse than a constant guess.",
            -margin
        );
    }
    let ridge: Vec<String> = e
        .decoding
        .iter()
        .map(|r| {
            format!(
                "{} {:.3}",
                r.layer
                    .map_or_else(|| "all layers".into(), |l| format!("layer {l}")),
                r.ridge_r2
            )
        })
        .collect();
    let _ = write!(
        s,
        " The ridge regression from the code to the term matrix (fit on one half of the OOD codes, scored on the other) has R² {}.",
        ridge.join(", ")
    );
    // The verdict weighs both measures: a linear map can recover the term matrix from a code whose
    // per-term yes/no probes fail (and the reverse).
    let top = e
        .decoding
        .iter()
        .rev()
        .max_by(|a, b| a.ridge_r2.total_cmp(&b.ridge_r2))
        .map(|r| (r.ridge_r2, where_(r)));
    match top {
        Some((r2, l)) if r2 > 0.1 && margin <= 0.05 => {
            let _ = write!(
                s,
                " So the codes carry the terms in part (R² {r2:.3} at {l}), in a form that the per-term yes/no probes do not use."
            );
        }
        Some((r2, l)) if r2 > 0.1 => {
            let _ = write!(
                s,
                " Both measures find the terms in the codes (R² {r2:.3} at {l})."
            );
        }
        Some((_, _)) if margin > 0.05 => {
            s.push_str(
                " Only the probes find the terms; the regression does not (R² at most 0.1).",
            );
        }
        Some(_) if margin <= 0.05 => {
            s.push_str(" Neither measure finds the terms in these codes.");
        }
        _ => {}
    }
    s
}

/// Sentences on one checkpoint's training log (R² at the last and best evaluation).
pub(super) fn training_text(rows: &[MetricsRow]) -> String {
    let mut s = String::new();
    let last_step = rows.iter().map(|r| r.step).max().unwrap_or(0);
    let _ = write!(s, "The log covers {} steps.", thousands(last_step));
    let ood: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| r.ood_acc.map(|v| (r.step, v)))
        .collect();
    if let (Some(last), Some(best)) = (ood.last(), ood.iter().max_by(|a, b| a.1.total_cmp(&b.1))) {
        let _ = write!(
            s,
            " At the last evaluation (step {}) the OOD R² is {:.3}",
            thousands(last.0),
            last.1
        );
        if best.0 != last.0 && best.1 > last.1 {
            let _ = write!(
                s,
                "; the best was {:.3} at step {}",
                best.1,
                thousands(best.0)
            );
        }
        s.push('.');
    }
    s
}

/// The paragraphs setting the OOD R² beside Table A1: each mixer's number against the paper's,
/// the training budget, and whether HYLA leads as in the paper.
pub fn paper_paragraphs(entries: &[LogicEntry]) -> Vec<String> {
    let mut out = Vec::new();
    let mean_of = |mixer: Mixer| {
        let v: Vec<f64> = entries
            .iter()
            .filter(|e| e.mixer == mixer)
            .filter_map(|e| e.r2("ood"))
            .filter(|v| v.is_finite())
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let mut parts = Vec::new();
    for (mixer, mean, se) in PAPER_LOGIC_OOD_R2 {
        if let Some(here) = mean_of(mixer) {
            let verdict = if (here * 100.0 - mean).abs() <= 2.0 * se {
                "within two standard errors of it"
            } else if here * 100.0 > mean {
                "above it"
            } else {
                "below it"
            };
            parts.push(format!(
                "{mixer} {:.1} % against the paper's {mean:.1} ± {se:.1} % ({verdict})",
                here * 100.0
            ));
        }
    }
    if parts.is_empty() {
        return out;
    }
    let budgets: Vec<String> = entries
        .iter()
        .map(|e| format!("{} {}", md_escape(&e.name), steps_text(e.steps)))
        .collect();
    out.push(format!(
        "**Fuzzy logic, OOD R².** On held-out pairs of known terms the checkpoints here reach {}. The paper's numbers are means ± standard errors over three seeds after {} updates; each checkpoint here is one seed, trained for: {}.",
        parts.join("; "),
        thousands(PAPER_LOGIC_STEPS),
        budgets.join(", ")
    ));
    if let Some(hyla) = mean_of(Mixer::Hyla) {
        let others: Vec<(Mixer, f64)> = [Mixer::Softmax, Mixer::Linear]
            .into_iter()
            .filter_map(|m| mean_of(m).map(|v| (m, v)))
            .collect();
        if !others.is_empty() {
            let leads = others.iter().all(|(_, v)| hyla > *v);
            let list: Vec<String> = others.iter().map(|(m, v)| format!("{m} {v:.3}")).collect();
            out.push(if leads {
                format!(
                    "As in the paper, HYLA leads: its OOD R² {hyla:.3} is above {}.",
                    list.join(" and ")
                )
            } else {
                format!(
                    "Unlike the paper, HYLA does not lead here: its OOD R² {hyla:.3} against {}.",
                    list.join(" and ")
                )
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::data::LogicSeconds;
    use crate::discover::Training;

    fn entry(rows: &[(Option<usize>, f64, f64)]) -> LogicEntry {
        LogicEntry {
            name: "x".into(),
            dir: PathBuf::from("x"),
            mixer: Mixer::Hyla,
            split: hyperlens_tasks::sraven::SplitName::Seed(0),
            sets: Vec::new(),
            decoding: rows
                .iter()
                .map(|&(layer, ridge_r2, f1_mean)| TermDecodingRow {
                    layer,
                    ridge_r2,
                    f1_mean,
                    f1_base_rate: 0.284,
                    f1_shuffled: 0.0,
                    n_terms: 12,
                })
                .collect(),
            tsne_trustworthiness: 0.0,
            tsne_points: 0,
            tsne_perplexity: 0.0,
            fixed_query: Vec::new(),
            training: Training::Missing { trained_by: None },
            steps: None,
            seconds: LogicSeconds::default(),
        }
    }

    /// The verdict weighs the ridge R² beside the probes' F1: F1 below the base rate with a ridge
    /// R² above 0.1 says the codes carry the terms in part; both low says neither finds them.
    #[test]
    fn term_decoding_verdicts_weigh_both_measures() {
        let t = decoding_text(&entry(&[(Some(0), -0.003, 0.0), (Some(1), 0.213, 0.225)]));
        assert!(t.contains("0.059 below the better control"), "{t}");
        assert!(
            t.contains("carry the terms in part (R² 0.213 at layer 1)"),
            "{t}"
        );
        let t = decoding_text(&entry(&[(Some(0), 0.01, 0.20), (Some(1), 0.02, 0.25)]));
        assert!(t.contains("Neither measure finds the terms"), "{t}");
        let t = decoding_text(&entry(&[(Some(0), 0.3, 0.5), (None, 0.35, 0.55)]));
        assert!(
            t.contains("best mean F1 at all layers: 0.550")
                && t.contains("Both measures find the terms in the codes (R² 0.350 at all layers)"),
            "{t}"
        );
        let t = decoding_text(&entry(&[(Some(0), 0.04, 0.25), (None, 0.13, 0.342)]));
        assert!(
            t.contains("Both measures") && t.contains("by 0.058 in F1"),
            "{t}"
        );
        let t = decoding_text(&entry(&[(Some(0), 0.04, 0.25), (None, 0.05, 0.40)]));
        assert!(t.contains("Only the probes find the terms"), "{t}");
    }
}
