//! The heatmap panels of an intervention or circuits result, as a notebook shows them: the head
//! ablation's accuracy and loss changes, and the Q, K and V composition scores titled with their
//! random baseline (the titles and colour spans are decided here, not by the fronts).

use hyperlens_viz::{ColorMap, Heatmap, HeatmapExplorer, HeatmapOptions};
use ndarray::{Array2, ArrayView2, ArrayView4, ArrayViewD, Ix2};

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

/// The options of the matrix heatmaps of [`matrix_panels`]; every panel gets the same.
#[derive(Debug, Clone, Default)]
pub struct MatrixSpec {
    /// The rows' labels (`None`: their indices `0..R`).
    pub row_labels: Option<Vec<String>>,
    /// The columns' labels (`None`: their indices `0..C`).
    pub col_labels: Option<Vec<String>>,
    /// The title.
    pub title: String,
    /// The value's name, under the colour bar and in the hover box.
    pub value_name: String,
    /// The x axis' title.
    pub x_label: String,
    /// The y axis' title.
    pub y_label: String,
    /// The colour map (`None`: blue-white-red when a value of the panel is negative, else
    /// viridis).
    pub color_map: Option<ColorMap>,
    /// The colour range (`None`: the data's).
    pub range: Option<(f64, f64)>,
    /// Cells drawn grey and left out of the range. # Shapes: `[R, C]`.
    pub mask: Option<Array2<bool>>,
}

/// Matrix heatmaps over the same rows and columns, one panel per named matrix, with the
/// options of `spec` ([`Heatmap::new`]).
///
/// # Shapes
/// Each matrix `[R, C]`, all of the same shape.
///
/// # Errors
/// [`ReportError::InvalidInput`] for no matrix, a matrix that is not 2-D, or one whose shape
/// differs from the first's (naming it).
pub fn matrix_panels(
    values: &[(String, ArrayViewD<'_, f64>)],
    spec: &MatrixSpec,
) -> Result<Vec<(String, Heatmap)>> {
    let Some((_, first)) = values.first() else {
        return Err(ReportError::InvalidInput("no matrix given".into()));
    };
    let shape = first.shape().to_vec();
    let indices = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
    values
        .iter()
        .map(|(name, v)| {
            let shown = if name.is_empty() { "values" } else { name };
            let v = v.view().into_dimensionality::<Ix2>().map_err(|_| {
                ReportError::InvalidInput(format!(
                    "heatmap {shown}: need a 2-D array [rows, cols], got shape {:?}",
                    v.shape()
                ))
            })?;
            if v.shape() != shape.as_slice() {
                return Err(ReportError::InvalidInput(format!(
                    "heatmap {shown}: shape {:?} differs from the first panel's {shape:?}",
                    v.shape()
                )));
            }
            let color_map = spec.color_map.unwrap_or(if v.iter().any(|&x| x < 0.0) {
                ColorMap::BlueWhiteRed
            } else {
                ColorMap::Viridis
            });
            let options = HeatmapOptions {
                title: spec.title.clone(),
                x_label: spec.x_label.clone(),
                y_label: spec.y_label.clone(),
                x_ticks: spec
                    .col_labels
                    .clone()
                    .unwrap_or_else(|| indices(v.ncols())),
                y_ticks: spec
                    .row_labels
                    .clone()
                    .unwrap_or_else(|| indices(v.nrows())),
                color_map,
                range: spec.range,
                color_bar_label: spec.value_name.clone(),
                mask: spec.mask.clone(),
                ..HeatmapOptions::default()
            };
            Ok((name.clone(), Heatmap::new(v.to_owned(), options)))
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
