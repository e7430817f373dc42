//! The thresholds of the study, fixed here before the run, and the verdict written from the
//! numbers against them.
//!
//! - **Experiment 1 passes its control** when the relation decodes on held-out vocabulary at
//!   [`RELATIONS_ALL_LAYERS_MIN`] or better from all layers together, and at
//!   [`RELATIONS_LAYER_MIN`] or better from the best single layer, each with the lower end of its
//!   95% interval above the strongest control ([`strongest_control`]).
//! - **Experiment 2 keeps** the operation x domain combinations the model answers at
//!   [`MIN_COMBINATION_ACCURACY`] or better.
//! - **A layer carries the operation in a form that transfers** on a split when its held-out
//!   accuracy's interval lies above the strongest control and the accuracy exceeds that control
//!   by [`TRANSFER_MARGIN`] or more ([`transfers`]). The finding is **positive** when some layer
//!   does so on every split, **partial** when some layer does on some splits, **negative**
//!   otherwise, and **not testable** when no split could be decoded (the model solves too few
//!   combinations).
//! - **The transplant moves the answer** when the mean donor code turns at least
//!   [`TRANSPLANT_MIN_RATE`] of the (prompt, donor) pairs into the donor operation's answer, and
//!   at least [`TRANSPLANT_CONTROL_FACTOR`] times as many as a random code of the same norm does.

use hyperlens_analysis::lm::{LmAnalysis, LmDecoding, LmDecodingRow};

use hyperlens_probe::lm_transplant::LmTransplantKind;

use super::files::TransplantResult;
use super::measure::Measured;
use crate::words::pct;

/// Experiment 1: the least held-out accuracy of all layers together.
pub const RELATIONS_ALL_LAYERS_MIN: f64 = 0.90;
/// Experiment 1: the least held-out accuracy of the best single layer.
pub const RELATIONS_LAYER_MIN: f64 = 0.75;
/// Experiment 2: the least accuracy of a combination the analysis keeps.
pub const MIN_COMBINATION_ACCURACY: f64 = 0.5;
/// Experiment 2: how far above the strongest control a layer's held-out accuracy must be.
pub const TRANSFER_MARGIN: f64 = 0.10;
/// The transplant: the least fraction of pairs that must follow the donor.
pub const TRANSPLANT_MIN_RATE: f64 = 0.20;
/// The transplant: how many times the random code's rate the donor's must be.
pub const TRANSPLANT_CONTROL_FACTOR: f64 = 3.0;

/// The strongest control of a decoding row: the largest of the chance level a guessing probe can
/// reach (`chance_max`), the shuffled-label probe, the distance baseline and the
/// shuffled-weights probe.
pub fn strongest_control(d: &LmDecoding, row: &LmDecodingRow) -> f64 {
    let mut c = d
        .chance_max
        .max(row.shuffled_labels.accuracy)
        .max(d.distance.accuracy);
    if let Some(s) = &row.shuffled_weights {
        c = c.max(s.accuracy);
    }
    c
}

/// Whether a row's codes decode the factor above its controls (module docs).
pub fn transfers(d: &LmDecoding, row: &LmDecodingRow) -> bool {
    let c = strongest_control(d, row);
    row.codes.ci_low > c && row.codes.accuracy >= c + TRANSFER_MARGIN
}

/// The layer label of a row: `L17`, or `all layers`.
pub fn layer_name(layer: Option<usize>) -> String {
    layer.map_or_else(|| "all layers".to_string(), |l| format!("L{l}"))
}

/// Experiment 1's check.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlCheck {
    /// Whether it passed.
    pub passed: bool,
    /// Held-out accuracy of all layers together.
    pub all_layers: f64,
    /// The best single layer and its held-out accuracy.
    pub best_layer: (usize, f64),
    /// The strongest control of the best layer.
    pub best_layer_control: f64,
    /// What the numbers say, in sentences.
    pub sentence: String,
}

/// Experiment 1's check (module docs).
pub fn relations_pass(a: &LmAnalysis) -> ControlCheck {
    let d = &a.decoding;
    let all = d.rows.iter().find(|r| r.layer.is_none());
    let best = d
        .rows
        .iter()
        .filter(|r| r.layer.is_some())
        .max_by(|x, y| x.codes.accuracy.total_cmp(&y.codes.accuracy));
    let (Some(all), Some(best)) = (all, best) else {
        return ControlCheck {
            passed: false,
            all_layers: f64::NAN,
            best_layer: (0, f64::NAN),
            best_layer_control: f64::NAN,
            sentence: "Experiment 1 has no decoding row: the pipeline failed its control.".into(),
        };
    };
    let ok = |r: &LmDecodingRow, min: f64| {
        r.codes.accuracy >= min && r.codes.ci_low > strongest_control(d, r)
    };
    let passed = ok(all, RELATIONS_ALL_LAYERS_MIN) && ok(best, RELATIONS_LAYER_MIN);
    let layer = best.layer.unwrap_or(0);
    let control = strongest_control(d, best);
    let numbers = format!(
        "the relation of key to query decodes on held-out vocabulary at {} from all layers \
         together and at {} from the best single layer, {} (strongest control there {}; chance {})",
        pct(all.codes.accuracy),
        pct(best.codes.accuracy),
        layer_name(best.layer),
        pct(control),
        pct(d.chance_max),
    );
    let sentence = if passed {
        format!(
            "The positive control passes: {numbers}, above the thresholds of {} and {} fixed \
             before the run.",
            pct(RELATIONS_ALL_LAYERS_MIN),
            pct(RELATIONS_LAYER_MIN)
        )
    } else {
        format!(
            "The positive control FAILS: {numbers}, below the thresholds of {} (all layers) \
             and {} (best layer) fixed before the run. The lens or the prompts are wrong on this \
             model, so the study stops here and claims nothing about operations.",
            pct(RELATIONS_ALL_LAYERS_MIN),
            pct(RELATIONS_LAYER_MIN)
        )
    };
    ControlCheck {
        passed,
        all_layers: all.codes.accuracy,
        best_layer: (layer, best.codes.accuracy),
        best_layer_control: control,
        sentence,
    }
}

/// The finding of Experiment 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// Some layer transfers on every split.
    Positive,
    /// Some layer transfers on some splits, none on all.
    Partial,
    /// No layer transfers on any split.
    Negative,
    /// No split could be decoded.
    NotTestable,
}

/// One layer (or all layers) of Experiment 2 over the splits.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LayerOverSplits {
    /// The model layer; `None` for all layers together.
    pub layer: Option<usize>,
    /// Mean held-out accuracy over the decoded splits.
    pub mean_held_out: f64,
    /// Mean strongest control over the decoded splits.
    pub mean_control: f64,
    /// Mean residual-stream accuracy over the decoded splits (`None` without it).
    pub mean_resid: Option<f64>,
    /// Splits on which the layer transfers ([`transfers`]).
    pub splits_transferring: usize,
}

/// Experiment 2's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct IclVerdict {
    /// The finding.
    pub finding: Finding,
    /// Splits that could be decoded.
    pub n_decoded: usize,
    /// Splits in all.
    pub n_splits: usize,
    /// Every layer, then all layers together, over the decoded splits.
    pub layers: Vec<LayerOverSplits>,
    /// The single layer with the best mean held-out accuracy (the transplant's layer).
    pub best_layer: Option<usize>,
    /// What the numbers say, in sentences.
    pub sentence: String,
    /// The secondary analysis without the behaviour filter, per layer over its decoded splits.
    pub unfiltered: Vec<LayerOverSplits>,
    /// Its sentence (empty when it decoded no split).
    pub unfiltered_sentence: String,
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        s / n as f64
    }
}

/// Every layer (then all layers together) of the first analysis, averaged over `decoded`.
fn over_splits(decoded: &[&LmAnalysis]) -> Vec<LayerOverSplits> {
    let Some(first) = decoded.first() else {
        return Vec::new();
    };
    first
        .decoding
        .rows
        .iter()
        .map(|r0| {
            let rows: Vec<(&LmDecoding, &LmDecodingRow)> = decoded
                .iter()
                .filter_map(|a| {
                    a.decoding
                        .rows
                        .iter()
                        .find(|r| r.layer == r0.layer)
                        .map(|r| (&a.decoding, r))
                })
                .collect();
            let resid: Vec<f64> = rows
                .iter()
                .filter_map(|(_, r)| r.resid.map(|s| s.accuracy))
                .collect();
            LayerOverSplits {
                layer: r0.layer,
                mean_held_out: mean(rows.iter().map(|(_, r)| r.codes.accuracy)),
                mean_control: mean(rows.iter().map(|(d, r)| strongest_control(d, r))),
                mean_resid: (resid.len() == rows.len()).then(|| mean(resid.into_iter())),
                splits_transferring: rows.iter().filter(|(d, r)| transfers(d, r)).count(),
            }
        })
        .collect()
}

/// The secondary analysis without the behaviour filter, in one sentence (empty when no split
/// decoded).
fn unfiltered_sentence(icl: &super::measure::IclResult) -> (Vec<LayerOverSplits>, String) {
    let decoded: Vec<&LmAnalysis> = icl
        .splits
        .iter()
        .filter_map(|s| s.unfiltered.as_ref().ok())
        .collect();
    let layers = over_splits(&decoded);
    let best = layers
        .iter()
        .filter(|l| l.layer.is_some())
        .max_by(|a, b| a.mean_held_out.total_cmp(&b.mean_held_out));
    let Some(b) = best else {
        return (layers, String::new());
    };
    let n_every = layers
        .iter()
        .filter(|l| l.layer.is_some() && l.splits_transferring == icl.splits.len())
        .count();
    let s = format!(
        "Without the behaviour filter (all {} combinations, those the model fails included; a \
         secondary analysis the verdict does not rest on), the best layer, {}, decodes the \
         operation on held-out combinations at {} against {} for the strongest control, and {} \
         layer{} pass the same rule on every split.",
        icl.behaviour.combinations.len(),
        layer_name(b.layer),
        pct(b.mean_held_out),
        pct(b.mean_control),
        n_every,
        if n_every == 1 { "" } else { "s" }
    );
    (layers, s)
}

/// What the behaviour filter kept, in a sentence: the model's accuracy, the kept combinations and
/// the operations among them.
fn kept_operations(icl: &super::measure::IclResult) -> String {
    let b = &icl.behaviour;
    let kept: Vec<_> = b.combinations.iter().filter(|c| c.kept).collect();
    let mut ops: Vec<String> = b
        .factors
        .iter()
        .position(|f| f == "operation")
        .map(|f| kept.iter().map(|c| c.values[f].clone()).collect())
        .unwrap_or_default();
    ops.sort();
    ops.dedup();
    format!(
        "The model answers {} of the prompts; {} of the {} combinations reach {} and are kept, \
         holding {} operation{} ({}).",
        pct(icl.accuracy),
        kept.len(),
        b.combinations.len(),
        pct(MIN_COMBINATION_ACCURACY),
        ops.len(),
        if ops.len() == 1 { "" } else { "s" },
        ops.join(", ")
    )
}

/// Experiment 2's verdict (module docs) from its split analyses.
pub fn icl_verdict(icl: &super::measure::IclResult) -> IclVerdict {
    let decoded: Vec<&LmAnalysis> = icl
        .splits
        .iter()
        .filter_map(|s| s.ood.as_ref().ok())
        .collect();
    let n_splits = icl.splits.len();
    let (unfiltered, unfiltered_sentence) = unfiltered_sentence(icl);
    if decoded.is_empty() {
        let why = icl
            .splits
            .iter()
            .filter_map(|s| s.ood.as_ref().err())
            .next()
            .cloned()
            .unwrap_or_default();
        return IclVerdict {
            finding: Finding::NotTestable,
            n_decoded: 0,
            n_splits,
            layers: Vec::new(),
            best_layer: None,
            unfiltered,
            unfiltered_sentence,
            sentence: format!(
                "The question cannot be tested on this model: no split could be decoded ({why}). \
                 The model solves {} of the icl prompts, and only {} of the 30 operation x domain \
                 combinations reach the threshold of {}.",
                pct(icl.accuracy),
                icl.behaviour.combinations.iter().filter(|c| c.kept).count(),
                pct(MIN_COMBINATION_ACCURACY)
            ),
        };
    }
    let layers = over_splits(&decoded);
    let best = layers
        .iter()
        .filter(|l| l.layer.is_some())
        .max_by(|a, b| a.mean_held_out.total_cmp(&b.mean_held_out));
    let single = |l: &&LayerOverSplits| l.layer.is_some();
    let everywhere: Vec<usize> = layers
        .iter()
        .filter(single)
        .filter(|l| l.splits_transferring == n_splits && decoded.len() == n_splits)
        .filter_map(|l| l.layer)
        .collect();
    let somewhere: Vec<usize> = layers
        .iter()
        .filter(single)
        .filter(|l| l.splits_transferring > 0)
        .filter_map(|l| l.layer)
        .collect();
    let finding = if !everywhere.is_empty() {
        Finding::Positive
    } else if !somewhere.is_empty() {
        Finding::Partial
    } else {
        Finding::Negative
    };
    let list = |v: &[usize]| {
        v.iter()
            .map(|l| format!("L{l}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let best_words = best.map_or_else(String::new, |b| {
        let resid = b.mean_resid.map_or_else(String::new, |r| {
            format!(
                ", and the residual stream at the answer position {}",
                pct(r)
            )
        });
        format!(
            "the best layer, {}, decodes the operation on held-out combinations at {} (mean over \
             {} decoded split{}) against {} for the strongest control{resid}",
            layer_name(b.layer),
            pct(b.mean_held_out),
            decoded.len(),
            if decoded.len() == 1 { "" } else { "s" },
            pct(b.mean_control),
        )
    });
    let rule = format!(
        "(a layer counts when its 95% interval lies above every control and it beats the \
         strongest by {} points or more, on every split; thresholds fixed before the run)",
        (TRANSFER_MARGIN * 100.0).round()
    );
    let kept = kept_operations(icl);
    let sentence = match finding {
        Finding::Positive => format!(
            "Positive: the latent code carries the operation in a form that transfers to held-out \
             operation x domain combinations at {} on all {n_splits} splits; {best_words} {rule}. \
             {kept}",
            list(&everywhere)
        ),
        Finding::Partial => format!(
            "Partial: some layers ({}) carry the operation above the controls on some splits, but \
             none on all {n_splits}; {best_words} {rule}. {kept}",
            list(&somewhere)
        ),
        Finding::Negative => format!(
            "Negative: no layer's latent code carries the operation in a form that transfers to \
             held-out operation x domain combinations; {best_words} {rule}. {kept}"
        ),
        Finding::NotTestable => unreachable!("handled above"),
    };
    IclVerdict {
        finding,
        n_decoded: decoded.len(),
        n_splits,
        best_layer: best.and_then(|b| b.layer),
        layers,
        sentence,
        unfiltered,
        unfiltered_sentence,
    }
}

/// The transplant's verdict: whether it moves the answer (module docs), in a sentence.
pub fn transplant_sentence(t: &TransplantResult) -> (bool, String) {
    let donor = t.rate(LmTransplantKind::MeanDonor);
    let random = t.rate(LmTransplantKind::Random);
    let moved = donor >= TRANSPLANT_MIN_RATE && donor >= TRANSPLANT_CONTROL_FACTOR * random;
    let identity = t.identity_max_logit_change().map_or_else(String::new, |c| {
        format!(" (the identity transplant changes the logits by at most {c:.1e})")
    });
    let s = format!(
        "At L{}, transplanting another operation's mean code at the answer position turns {} of \
         the (prompt, donor) pairs into the donor operation's answer, against {} for a random \
         code of the same norm and {} for the code of the prompt's own operation{identity}: the \
         transplant {} the answer (threshold: {} of pairs and {}x the random code's rate).",
        t.layer,
        pct(donor),
        pct(random),
        pct(t.rate(LmTransplantKind::SameLabel)),
        if moved { "moves" } else { "does not move" },
        pct(TRANSPLANT_MIN_RATE),
        TRANSPLANT_CONTROL_FACTOR
    );
    (moved, s)
}

/// Every verdict of the study, and the one sentence that sums it up.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdicts {
    /// Experiment 1.
    pub relations: ControlCheck,
    /// Experiment 2 (`None` when Experiment 1 failed).
    pub icl: Option<IclVerdict>,
    /// The transplant: whether it moved the answer, and the sentence.
    pub transplant: Option<(bool, String)>,
    /// The summary sentence (the page's verdict).
    pub sentence: String,
}

impl Verdicts {
    /// The verdicts of `m`.
    pub fn of(m: &Measured) -> Verdicts {
        let relations = relations_pass(&m.relations.analysis);
        let icl = m.icl.as_ref().map(icl_verdict);
        let transplant = m.transplant.as_ref().map(transplant_sentence);
        let mut sentence = format!("{}: ", m.model.name);
        match &icl {
            None => sentence.push_str(&relations.sentence),
            Some(v) => {
                sentence.push_str(&v.sentence);
                if !v.unfiltered_sentence.is_empty() {
                    sentence.push(' ');
                    sentence.push_str(&v.unfiltered_sentence);
                }
                if let Some((_, t)) = &transplant {
                    sentence.push(' ');
                    sentence.push_str(t);
                }
            }
        }
        Verdicts {
            relations,
            icl,
            transplant,
            sentence,
        }
    }
}
