//! The causal section's sentences, generated from the transplant test's numbers.

use hyperlens_probe::TransplantKind;

use crate::data::{frac, Entry};
use crate::words::{md_escape, pct};

/// Sentences generated from the numbers: per checkpoint, the layer where the transplant moves the
/// answer to the donor rule's most, with the controls; the share of changed answers that are the
/// donor's against chance; the identity transplant.
pub fn sentences(entries: &[Entry]) -> Sentences {
    let mut out = Vec::new();
    // Per checkpoint at its best layer: (name, fraction to the donor, share of the changed
    // answers that are the donor's, chance share, changed answers).
    let mut best: Vec<(&str, f64, f64, f64, usize)> = Vec::new();
    // Per checkpoint at its best layer: the fraction of answers a zero code changes.
    let mut zero: Vec<f64> = Vec::new();
    let mut ident = 0.0f64;
    for e in entries {
        let Some(c) = &e.causal else { continue };
        ident = ident.max(c.identity_change());
        let top = (0..c.layers())
            .filter_map(|l| c.row(l, TransplantKind::MeanId).map(|r| (l, r)))
            .max_by(|a, b| frac(a.1.to_donor, a.1.n).total_cmp(&frac(b.1.to_donor, b.1.n)));
        let Some((l, r)) = top else { continue };
        let f = frac(r.to_donor, r.n);
        let changed = r.to_donor + r.elsewhere;
        let chance = 1.0 / (c.values as f64 - 1.0);
        best.push((&e.name, f, frac(r.to_donor, changed), chance, changed));
        if c.row(l, TransplantKind::ZeroAblation).is_some() {
            zero.push(c.fraction(l, TransplantKind::ZeroAblation, true));
        }
        let ctrl = |kind: TransplantKind| c.fraction(l, kind, true);
        let share = if changed > 0 {
            format!(
                "; {} of the changed answers are the donor rule's, where a change to a random other value would give {}",
                pct(frac(r.to_donor, changed)),
                pct(chance)
            )
        } else {
            String::new()
        };
        let problem = c.fraction(l, TransplantKind::DonorProblem, false);
        out.push(format!(
            "**{}**, layer {l}: the answer becomes the donor rule's in {} of {} pairs ({}; {} with one donor problem's own code instead of the mean) and changes at all in {}{share}. Controls at that layer: a random code of the same norm changes {}, the mean donor code at the first row's keys {}, a zero code {}.",
            md_escape(&e.name),
            r.to_donor,
            r.n,
            pct(f),
            pct(problem),
            pct(frac(changed, r.n)),
            pct(ctrl(TransplantKind::Random)),
            pct(ctrl(TransplantKind::OffRow)),
            pct(ctrl(TransplantKind::ZeroAblation)),
        ));
    }
    if best.is_empty() {
        return Sentences {
            summary: Vec::new(),
            per_checkpoint: out,
        };
    }
    let (lo, hi) = best.iter().fold((f64::INFINITY, 0.0f64), |(a, b), x| {
        (a.min(x.1), b.max(x.1))
    });
    let headline = if hi < 0.05 {
        format!(
            "No checkpoint's answer follows a transplanted code in as many as 5 % of the pairs (at most {}): at the paper's site, the latent code alone does not set the operation the model applies.",
            pct(hi)
        )
    } else {
        // Steered: the donor's value is at least twice as common among the changed answers as
        // a random other value would be. Fewer than MIN_CHANGED changed answers tell nothing.
        const MIN_CHANGED: usize = 20;
        let names = |steered: bool| -> Vec<String> {
            best.iter()
                .filter(|x| x.1 >= 0.05 && x.4 >= MIN_CHANGED && (x.2 >= 2.0 * x.3) == steered)
                .map(|x| format!("{} ({})", md_escape(x.0), pct(x.2)))
                .collect()
        };
        let (steered, disrupted) = (names(true), names(false));
        let few: Vec<String> = best
            .iter()
            .filter(|x| x.1 >= 0.05 && x.4 < MIN_CHANGED)
            .map(|x| md_escape(x.0))
            .collect();
        let mut h = format!(
            "At the layer where it works best, the transplant makes the answer the donor rule's in {} to {} of the pairs.",
            pct(lo),
            pct(hi)
        );
        if !zero.is_empty() {
            let (zl, zh) = zero
                .iter()
                .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
            h += &format!(
                " A zero code at that layer changes {} to {} of the answers: how much each model reads the code there.",
                pct(zl),
                pct(zh)
            );
        }
        if !steered.is_empty() {
            h += &format!(
                " The answer is steered towards the donor rule, at least twice as often as chance among the changed answers, in {}.",
                steered.join(", ")
            );
        }
        if !few.is_empty() {
            h += &format!(
                " In {}, fewer than {MIN_CHANGED} answers changed: too few to tell steering from disruption (`--causal-n` or `hyperlens patch transplant --n` test more problems).",
                few.join(", ")
            );
        }
        if !disrupted.is_empty() {
            h += &format!(
                " In {}, the changed answers are the donor rule's hardly more often than a random other value would be: the code there is read, but a foreign code disrupts the answer more than it specifies another operation.",
                disrupted.join(", ")
            );
        }
        h
    };
    Sentences {
        summary: vec![
            headline,
            format!(
                "The identity transplant (each problem's own code) leaves every logit as it was: the largest change is {ident:.1e}."
            ),
        ],
        per_checkpoint: out,
    }
}

/// The generated text of the section.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sentences {
    /// What the checkpoints show together, and the identity control (the figure's text).
    pub summary: Vec<String>,
    /// One sentence per checkpoint at the layer where the transplant works best, with the controls.
    pub per_checkpoint: Vec<String>,
}
