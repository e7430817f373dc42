//! The heatmap panels of an intervention or circuits result, as a notebook shows them: the head
//! ablation's accuracy and loss changes, and the Q, K and V composition scores titled with their
//! random baseline (the titles and colour spans are decided here, not by the fronts).

use hyperlens_viz::{ColorMap, Heatmap, HeatmapExplorer};
use ndarray::{ArrayView2, ArrayView4};

use crate::error::{ReportError, Result};

/// What the hover box says of a composition pair that is not computed.
pub const NOT_COMPUTED: &str = "not computed (the reading head is not in a later layer)";

/// `K-composition scores (random baseline p99 = 0.123)`: the title of one composition kind
/// (`q`, `k`, `v`), as `hyperlens circuits` titles `composition_{q,k,v}.png`; without the
/// baseline's 99th percentile when it is unknown.
pub fn composition_title(kind: &str, p99: Option<f64>) -> String {
    let mut t = format!("{}-composition scores", kind.to_uppercase());
    if let Some(p) = p99 {
        t.push_str(&format!(" (random baseline p99 = {p:.3})"));
    }
    t
}

/// The composition panels: one [`Heatmap::composition`] per kind, named by the kind and titled
/// by `title` or [`composition_title`].
///
/// # Shapes
/// Each score array `[L, H, L, H]`.
///
/// # Errors
/// As [`Heatmap::composition`].
pub fn composition_panels(
    scores: &[(String, ArrayView4<'_, f64>, Option<f64>)],
    title: Option<&str>,
) -> Result<Vec<(String, Heatmap)>> {
    scores
        .iter()
        .map(|(kind, s, p99)| {
            let t = title.map_or_else(|| composition_title(kind, *p99), str::to_string);
            Ok((kind.clone(), Heatmap::composition(&t, *s)?))
        })
        .collect()
}

/// The head ablation's panels: the change in accuracy and the change in loss (nats, `loss -
/// base_loss`) with each head `ablation`-ablated, on a blue-white-red scale symmetric about 0
/// spanning the largest change (at least 0.01 for accuracy, 0.001 for loss).
///
/// # Shapes
/// `delta_accuracy`, `loss`: `[L, H]`.
///
/// # Errors
/// [`ReportError::InvalidInput`] for arrays of different shapes; as [`Heatmap::head_scores`].
pub fn head_ablation_panels(
    ablation: &str,
    delta_accuracy: ArrayView2<'_, f64>,
    loss: ArrayView2<'_, f64>,
    base_loss: f64,
    title: Option<&str>,
) -> Result<Vec<(String, Heatmap)>> {
    if delta_accuracy.dim() != loss.dim() {
        return Err(ReportError::InvalidInput(format!(
            "head ablation: accuracy changes {:?} and losses {:?} differ in shape",
            delta_accuracy.shape(),
            loss.shape()
        )));
    }
    let delta_loss = loss.mapv(|v| v - base_loss);
    [
        (
            "accuracy change",
            delta_accuracy.to_owned(),
            "accuracy",
            0.01,
        ),
        ("loss change", delta_loss, "loss (nats)", 1e-3),
    ]
    .into_iter()
    .map(|(name, delta, unit, least)| {
        let span = delta.iter().fold(least, |m: f64, v| m.max(v.abs()));
        let t = title.map_or_else(
            || format!("change in {unit} with each head {ablation}-ablated"),
            str::to_string,
        );
        let fig = Heatmap::head_scores(
            &t,
            delta.view(),
            name,
            ColorMap::BlueWhiteRed,
            Some((-span, span)),
        )?;
        Ok((name.to_string(), fig))
    })
    .collect()
}

/// The interactive heatmap of `panels` with the panel named `start` shown first (the first when
/// `None`), and `masked` as the hover text of masked cells.
///
/// # Errors
/// [`ReportError::InvalidInput`] for a `start` that names no panel.
pub fn heatmap_explorer<'a>(
    panels: &'a [(String, Heatmap)],
    start: Option<&str>,
    masked: Option<&str>,
) -> Result<HeatmapExplorer<'a>> {
    let names: Vec<&String> = panels.iter().map(|(n, _)| n).collect();
    let first = match start {
        None => 0,
        Some(p) => names.iter().position(|n| *n == p).ok_or_else(|| {
            ReportError::InvalidInput(format!("panel {p:?}: the panels are {names:?}"))
        })?,
    };
    let mut fig = HeatmapExplorer::new(panels.iter().map(|(n, h)| (n.clone(), h)).collect());
    if let Some(m) = masked {
        fig.masked = m.into();
    }
    fig.start = first;
    Ok(fig)
}
