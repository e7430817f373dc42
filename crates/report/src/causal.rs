//! The report's section "Is the latent code causal?": the transplant test of
//! [`hyperlens_probe::latent_transplant`] on every SRAVEN checkpoint (another rule's latent code put
//! at the paper's site of one layer; does the answer become that rule's?), with its controls, as a
//! figure, a table (`tables/causal.csv`) and sentences generated from the numbers.

use hyperlens_model::Evaluator;
use hyperlens_probe::{latent_transplant, TransplantRow};
use hyperlens_tasks::sraven::{sample, Set, Split};
use hyperlens_viz::{BarSeries, GroupedBars};

use crate::doc::{Document, FigureRef};
use crate::error::Result;
use crate::evaluate::Entry;
use crate::text::{md_escape, pct};

/// The transplant test of one checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct CausalResult {
    /// Unpermuted problems per set (ID donors, OOD receivers).
    pub n: usize,
    /// The answer slot whose site is transplanted (the paper's: the last).
    pub slot: usize,
    /// The site's query position (`8 F + slot`).
    pub query: usize,
    /// The site's key positions, the slot's tokens in the answer's row (`6 F + slot`, `7 F + slot`).
    pub keys: [usize; 2],
    /// Values per feature (the chance level of a changed answer is `1 / (M - 1)`).
    pub values: usize,
    /// Per layer: `mean_id`, `donor_problem`, `off_row`, `random`, `zero_ablation`,
    /// `mean_ablation`, `identity` ([`TransplantRow::kind`]).
    pub rows: Vec<TransplantRow>,
}

impl CausalResult {
    /// The row of `layer` and `kind`.
    pub fn row(&self, layer: usize, kind: &str) -> Option<&TransplantRow> {
        self.rows
            .iter()
            .find(|r| r.layer == layer && r.kind == kind)
    }

    /// Layers tested.
    pub fn layers(&self) -> usize {
        self.rows.iter().map(|r| r.layer + 1).max().unwrap_or(0)
    }

    /// The fraction of `kind`'s pairs at `layer` whose answer became the donor rule's, or with
    /// `changed` whose answer changed at all (NaN without the row or a pair).
    pub fn fraction(&self, layer: usize, kind: &str, changed: bool) -> f64 {
        self.row(layer, kind).map_or(f64::NAN, |r| {
            let k = if changed {
                r.to_donor + r.elsewhere
            } else {
                r.to_donor
            };
            frac(k, r.n)
        })
    }

    /// The largest logit change of the identity transplant over all layers.
    pub fn identity_change(&self) -> f64 {
        self.rows
            .iter()
            .filter(|r| r.kind == "identity")
            .fold(0.0, |m, r| m.max(r.max_logit_change))
    }
}

/// Fraction `k / n` (NaN for no pair).
fn frac(k: usize, n: usize) -> f64 {
    if n == 0 {
        f64::NAN
    } else {
        k as f64 / n as f64
    }
}

/// Runs the transplant test on `model` with `n` unpermuted ID and OOD problems of `split` (seed
/// `seed`), at the last answer slot, in batches of `batch`.
///
/// # Errors
/// Sampling and transplant errors.
pub(crate) fn run(
    model: &Evaluator,
    split: &Split,
    n: usize,
    seed: u64,
    batch: usize,
) -> Result<CausalResult> {
    let cfg = model.config();
    let slot = cfg.n_outputs - 1;
    let id = sample(split, Set::Id, n, seed, true)?;
    let ood = sample(split, Set::Ood, n, seed, true)?;
    let rows = latent_transplant(model, &id, &ood, slot, batch, seed)?;
    let f = cfg.n_outputs;
    Ok(CausalResult {
        n,
        slot,
        query: 8 * f + slot,
        keys: [6 * f + slot, 7 * f + slot],
        values: cfg.d_in,
        rows,
    })
}

/// The fraction of pairs whose answer became the donor rule's, per layer (`kind` `mean_id` or
/// `donor_problem`), or whose answer changed (`changed`).
fn per_layer(c: &CausalResult, kind: &str, changed: bool) -> Vec<f64> {
    (0..c.layers())
        .map(|l| c.fraction(l, kind, changed))
        .collect()
}

/// The section's figures: per layer, the fraction of pairs whose answer became the donor rule's
/// with the mean ID code transplanted, one series per checkpoint; and, at each checkpoint's last
/// layer, that fraction beside how often the answer changed at all under the transplant and under
/// its controls. Empty without results or when the checkpoints differ in depth.
///
/// # Errors
/// A failed drawing or write.
pub fn figures(entries: &[Entry], out: &std::path::Path) -> Result<Vec<FigureRef>> {
    let tested: Vec<(&Entry, &CausalResult)> = entries
        .iter()
        .filter_map(|e| e.causal.as_ref().map(|c| (e, c)))
        .collect();
    let Some(layers) = tested.first().map(|(_, c)| c.layers()) else {
        return Ok(Vec::new());
    };
    if layers == 0 || tested.iter().any(|(_, c)| c.layers() != layers) {
        return Ok(Vec::new());
    }
    let values: Vec<Vec<f64>> = tested
        .iter()
        .map(|(_, c)| per_layer(c, "mean_id", false))
        .collect();
    let groups: Vec<String> = (0..layers).map(|l| format!("layer {l}")).collect();
    let series = tested
        .iter()
        .zip(&values)
        .map(|((e, _), v)| BarSeries {
            name: e.name.clone(),
            values: v,
        })
        .collect();
    let mut fig = GroupedBars::accuracy(
        "Transplanting another rule's mean latent code at the paper's site: answers that become that rule's",
        &groups,
        series,
    );
    fig.y_range = None;
    fig.value_format = hyperlens_viz::ValueFormat::Percent(1);
    fig.y_label = "fraction of (problem, donor rule) pairs".into();
    fig.x_label = "layer whose code is replaced".into();
    let text = sentences(entries).summary.join(" ");
    let mut figs = vec![crate::figures::save(
        out,
        "figures/causal_transplant.png".into(),
        &fig,
        "Transplanted codes",
        "Answers that follow a transplanted latent code, per layer and checkpoint".into(),
        text,
    )?];
    // The last layer, with the controls.
    let last = layers - 1;
    let at = |kind: &str, changed: bool| -> Vec<f64> {
        tested
            .iter()
            .map(|(_, c)| c.fraction(last, kind, changed))
            .collect()
    };
    let cols = [
        ("answer becomes the donor rule's", at("mean_id", false)),
        ("answer changes: mean donor code", at("mean_id", true)),
        ("answer changes: random code, same norm", at("random", true)),
        (
            "answer changes: donor code at the first row",
            at("off_row", true),
        ),
        (
            "answer changes: zero code (ablation)",
            at("zero_ablation", true),
        ),
    ];
    let names: Vec<String> = tested.iter().map(|(e, _)| e.name.clone()).collect();
    let mut fig = GroupedBars::accuracy(
        &format!("Layer {last}: the transplant against its controls"),
        &names,
        cols.iter()
            .map(|(n, v)| BarSeries {
                name: (*n).into(),
                values: v,
            })
            .collect(),
    );
    fig.value_format = hyperlens_viz::ValueFormat::Percent(0);
    fig.y_label = "fraction of pairs (controls: of problems)".into();
    let random_hi = cols[2].1.iter().copied().fold(0.0f64, f64::max);
    let changed_hi = cols[1].1.iter().copied().fold(0.0f64, f64::max);
    figs.push(crate::figures::save(
        out,
        "figures/causal_controls.png".into(),
        &fig,
        "Transplant controls",
        format!("The transplant at layer {last} against its controls, per checkpoint"),
        format!(
            "At layer {last}, the mean donor code changes the answer in up to {} of the pairs, and a random code of the same norm in up to {} of the problems; the donor code put at the first row's keys, outside the answer's row, changes few answers.",
            pct(changed_hi),
            pct(random_hi)
        ),
    )?);
    Ok(figs)
}

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
            .filter_map(|l| c.row(l, "mean_id").map(|r| (l, r)))
            .max_by(|a, b| frac(a.1.to_donor, a.1.n).total_cmp(&frac(b.1.to_donor, b.1.n)));
        let Some((l, r)) = top else { continue };
        let f = frac(r.to_donor, r.n);
        let changed = r.to_donor + r.elsewhere;
        let chance = 1.0 / (c.values as f64 - 1.0);
        best.push((&e.name, f, frac(r.to_donor, changed), chance, changed));
        if c.row(l, "zero_ablation").is_some() {
            zero.push(c.fraction(l, "zero_ablation", true));
        }
        let ctrl = |kind: &str| c.fraction(l, kind, true);
        let share = if changed > 0 {
            format!(
                "; {} of the changed answers are the donor rule's, where a change to a random other value would give {}",
                pct(frac(r.to_donor, changed)),
                pct(chance)
            )
        } else {
            String::new()
        };
        let problem = c.fraction(l, "donor_problem", false);
        out.push(format!(
            "**{}**, layer {l}: the answer becomes the donor rule's in {} of {} pairs ({}; {} with one donor problem's own code instead of the mean) and changes at all in {}{share}. Controls at that layer: a random code of the same norm changes {}, the mean donor code at the first row's keys {}, a zero code {}.",
            md_escape(&e.name),
            r.to_donor,
            r.n,
            pct(f),
            pct(problem),
            pct(frac(changed, r.n)),
            pct(ctrl("random")),
            pct(ctrl("off_row")),
            pct(ctrl("zero_ablation")),
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

/// `tables/causal.csv`: `checkpoint,mixer,layer,kind,n,to_donor,elsewhere,unchanged,excluded,frac_to_donor,frac_changed,max_logit_change`.
pub fn csv(entries: &[Entry]) -> String {
    let mut s = String::from(
        "checkpoint,mixer,layer,kind,n,to_donor,elsewhere,unchanged,excluded,frac_to_donor,frac_changed,max_logit_change\n",
    );
    for e in entries {
        let Some(c) = &e.causal else { continue };
        for r in &c.rows {
            s.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{:.6},{:.6},{:e}\n",
                e.name,
                e.mixer,
                r.layer,
                r.kind,
                r.n,
                r.to_donor,
                r.elsewhere,
                r.unchanged,
                r.excluded,
                frac(r.to_donor, r.n),
                frac(r.to_donor + r.elsewhere, r.n),
                r.max_logit_change
            ));
        }
    }
    s
}

/// Writes the section: what was done, the figure with its sentences, the table per checkpoint and
/// layer.
pub fn section(doc: &mut Document, entries: &[Entry], figs: &[FigureRef]) {
    let Some(first) = entries.iter().find_map(|e| e.causal.as_ref()) else {
        return;
    };
    doc.heading(2, "Is the latent code causal?");
    doc.paragraph(format!(
        "On {n} unpermuted OOD problems, the latent code at the paper's site of one layer (query {q}; keys {k1} and {k2}: slot {slot} in the answer's row) is replaced by the mean code of another rule at that site over {n} unpermuted ID problems, and the predicted value of slot {slot} is read: does it become what the donor rule gives on the problem's own panels? Pairs where the donor rule gives no value from the panels, or gives the original answer or the model's own prediction, are left out. Controls: the problem's own code (identity), a random code of the same norm, the donor code at the slot's keys in the first row, outside the answer's row, and the zero and mean ablations of the code (a zero code; the mean ID code over all rules), which show how much the answer depends on the code at all (`hyperlens patch transplant` runs the same test with more problems).",
        n = first.n,
        slot = first.slot,
        q = first.query,
        k1 = first.keys[0],
        k2 = first.keys[1],
    ));
    let text = sentences(entries);
    if !figs.is_empty() {
        for f in figs {
            doc.figure(f.clone());
        }
    } else {
        for s in &text.summary {
            doc.paragraph(s.clone());
        }
    }
    if !text.per_checkpoint.is_empty() {
        doc.paragraph("Per checkpoint, at the layer where the transplant works best:");
        doc.paragraph(
            text.per_checkpoint
                .iter()
                .map(|s| format!("- {s}"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    let header = [
        "checkpoint",
        "layer",
        "to donor (mean code)",
        "to donor (donor problem)",
        "changed (mean code)",
        "changed (donor at first row)",
        "changed (random code)",
        "changed (zero code)",
        "changed (mean code, all rules)",
        "pairs",
        "identity: largest logit change",
    ]
    .map(String::from)
    .to_vec();
    let mut rows = Vec::new();
    for e in entries {
        let Some(c) = &e.causal else { continue };
        for l in 0..c.layers() {
            let get = |kind: &str, changed: bool| c.fraction(l, kind, changed);
            rows.push(vec![
                md_escape(&e.name),
                l.to_string(),
                pct(get("mean_id", false)),
                pct(get("donor_problem", false)),
                pct(get("mean_id", true)),
                pct(get("off_row", true)),
                pct(get("random", true)),
                pct(get("zero_ablation", true)),
                pct(get("mean_ablation", true)),
                c.row(l, "mean_id").map_or(0, |r| r.n).to_string(),
                format!(
                    "{:.1e}",
                    c.row(l, "identity")
                        .map_or(f64::NAN, |r| r.max_logit_change)
                ),
            ]);
        }
    }
    doc.table(header, rows);
    doc.paragraph("Table: `tables/causal.csv`.");
}
