//! The causal section's figures.

use hyperlens_viz::{BarSeries, GroupedBars};

use hyperlens_probe::TransplantKind;

use crate::causal::text::sentences;
use crate::data::{CausalResult, Entry};
use crate::doc::FigureRef;
use crate::error::Result;
use crate::words::pct;

/// The fraction of pairs whose answer became the donor rule's, per layer (`kind` `mean_id` or
/// `donor_problem`), or whose answer changed (`changed`).
fn per_layer(c: &CausalResult, kind: TransplantKind, changed: bool) -> Vec<f64> {
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
        .map(|(_, c)| per_layer(c, TransplantKind::MeanId, false))
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
    let mut figs = vec![crate::plots::save(
        out,
        "figures/causal_transplant.png".into(),
        &fig,
        "Transplanted codes",
        "Answers that follow a transplanted latent code, per layer and checkpoint".into(),
        text,
    )?];
    // The last layer, with the controls.
    let last = layers - 1;
    let at = |kind: TransplantKind, changed: bool| -> Vec<f64> {
        tested
            .iter()
            .map(|(_, c)| c.fraction(last, kind, changed))
            .collect()
    };
    let cols = [
        (
            "answer becomes the donor rule's",
            at(TransplantKind::MeanId, false),
        ),
        (
            "answer changes: mean donor code",
            at(TransplantKind::MeanId, true),
        ),
        (
            "answer changes: random code, same norm",
            at(TransplantKind::Random, true),
        ),
        (
            "answer changes: donor code at the first row",
            at(TransplantKind::OffRow, true),
        ),
        (
            "answer changes: zero code (ablation)",
            at(TransplantKind::ZeroAblation, true),
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
    figs.push(crate::plots::save(
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
