//! The figures of `hyperlens patch`, built from the interventions' results (the probe crate's
//! reports, handed over as arrays): activation patching per layer x position and per head, direct
//! logit attribution per head with the MLPs, the change in accuracy with each head ablated, and the
//! transplant test per layer with its controls.

use ndarray::{Array2, ArrayView2};

use crate::bars::{BarSeries, GroupedBars};
use crate::colour::ColorMap;
use crate::error::{Result, VizError};
use crate::heatmap::{Heatmap, HeatmapOptions, ValueFormat};

/// The hook of each activation patched per position, by its short name: `resid_pre`,
/// `attn_out`, `mlp_out`.
pub fn patching_hook(activation: &str) -> String {
    format!("blocks.{{l}}.hook_{activation}")
}

/// `patching_{activation}.png`: the logit difference restored by patching `activation` at each
/// [layer, position], of the checkpoint `name` at answer slot `slot`.
///
/// # Shapes
/// `grid [L, T]`; `positions` T tick labels.
pub fn patching_positions(
    name: &str,
    activation: &str,
    slot: usize,
    grid: &Array2<f64>,
    positions: &[String],
) -> Heatmap {
    Heatmap::new(
        grid.clone(),
        HeatmapOptions {
            title: format!(
                "{name}: patching {} per position (slot {slot})",
                patching_hook(activation)
            ),
            x_label: "position (P panel s slot; Q query)".into(),
            y_label: "layer".into(),
            x_ticks: positions.to_vec(),
            y_ticks: (0..grid.nrows()).map(|l| format!("L{l}")).collect(),
            value_format: ValueFormat::Hidden,
            color_map: ColorMap::BlueWhiteRed,
            range: Some((-1.0, 1.0)),
            color_bar_label: "logit difference restored".into(),
            ..HeatmapOptions::default()
        },
    )
}

/// `patching_heads.png`: the logit difference restored by patching each head's output.
///
/// # Shapes
/// `head_out [L, H]`.
///
/// # Errors
/// As [`Heatmap::head_scores`] (no head).
pub fn patching_heads(name: &str, head_out: ArrayView2<'_, f64>) -> Result<Heatmap> {
    Heatmap::head_scores(
        &format!("{name}: patching each head's output (hook_z, all positions)"),
        head_out,
        "logit difference restored",
        ColorMap::BlueWhiteRed,
        Some((-1.0, 1.0)),
    )
}

/// `dla.png`: the centred direct logit attribution per [layer, head], the last column the layer's
/// MLP, on a colour scale symmetric about 0.
///
/// # Shapes
/// `heads_centred [L, H]`, `mlp_centred [L]`.
///
/// # Errors
/// [`VizError::Length`] when `mlp_centred` does not have one value per layer; as
/// [`Heatmap::head_scores`].
pub fn dla_heads(
    name: &str,
    heads_centred: ArrayView2<'_, f64>,
    mlp_centred: &[f64],
) -> Result<Heatmap> {
    let (l_n, h_n) = heads_centred.dim();
    if mlp_centred.len() != l_n {
        return Err(VizError::Length {
            what: "MLP attributions (one per layer)".into(),
            expected: l_n,
            got: mlp_centred.len(),
        });
    }
    let with_mlp = Array2::from_shape_fn((l_n, h_n + 1), |(l, j)| {
        if j < h_n {
            heads_centred[[l, j]]
        } else {
            mlp_centred[l]
        }
    });
    let span = with_mlp.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    let mut fig = Heatmap::head_scores(
        &format!("{name}: direct logit attribution to the answer (centred logit, nats)"),
        with_mlp.view(),
        "nats",
        ColorMap::BlueWhiteRed,
        Some((-span, span)),
    )?;
    if let Some(last) = fig.options.x_ticks.last_mut() {
        *last = "MLP".into();
    }
    fig.options.x_label = "head (last column: the layer's MLP)".into();
    Ok(fig)
}

/// `head_ablation.png` (and its hover form): the change in accuracy with each head `ablation`-
/// ablated, on a colour scale symmetric about 0 (at least +-0.01).
///
/// # Shapes
/// `deltas [L, H]`.
///
/// # Errors
/// As [`Heatmap::head_scores`].
pub fn head_ablation(name: &str, ablation: &str, deltas: ArrayView2<'_, f64>) -> Result<Heatmap> {
    let span = deltas.iter().fold(0.01f64, |m, v| m.max(v.abs()));
    Heatmap::head_scores(
        &format!("{name}: change in accuracy with each head {ablation}-ablated"),
        deltas,
        "accuracy change",
        ColorMap::BlueWhiteRed,
        Some((-span, span)),
    )
}

/// The series of the transplant figure, one value per layer: fractions of the counted problems
/// (NaN where a layer has none).
#[derive(Debug, Clone, Copy)]
pub struct TransplantSeries<'a> {
    /// Answers that become the donor rule's, with the mean ID code.
    pub to_donor: &'a [f64],
    /// Answers that change, with the mean ID code.
    pub changed: &'a [f64],
    /// Answers that become the donor rule's, with one donor problem's code.
    pub donor_problem: &'a [f64],
    /// Answers that change with the donor at the first row's keys (control).
    pub off_row: &'a [f64],
    /// Answers that change with a random code of the same norm (control).
    pub random: &'a [f64],
    /// Answers that change with a zero code (ablation control).
    pub zero: &'a [f64],
}

/// The bars of `transplant.png`: the series with a missing fraction (NaN: a layer without a
/// counted problem) drawn at height 0, since a bar chart takes finite values only.
#[derive(Debug, Clone, PartialEq)]
pub struct TransplantBars {
    layers: usize,
    series: Vec<(&'static str, Vec<f64>)>,
}

impl TransplantBars {
    /// The bars of `s`, one group per layer.
    pub fn new(s: &TransplantSeries<'_>) -> Self {
        let drawn = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .map(|&x| if x.is_nan() { 0.0 } else { x })
                .collect()
        };
        Self {
            layers: s.to_donor.len(),
            series: vec![
                ("answer becomes the donor rule's", drawn(s.to_donor)),
                ("answer changes (any)", drawn(s.changed)),
                (
                    "answer becomes the donor rule's (one donor problem's code)",
                    drawn(s.donor_problem),
                ),
                ("control: donor at the first row's keys", drawn(s.off_row)),
                ("control: random code, same norm", drawn(s.random)),
                ("control: zero code (ablation)", drawn(s.zero)),
            ],
        }
    }

    /// `transplant.png` of the checkpoint `name`: per layer, the fraction of problems whose
    /// answer becomes the donor rule's or changes, for the transplant and its controls.
    pub fn figure(&self, name: &str) -> GroupedBars<'_> {
        let groups: Vec<String> = (0..self.layers).map(|l| format!("layer {l}")).collect();
        let mut fig = GroupedBars::accuracy(
            &format!("{name}: transplanting another rule's mean code at the answer's site"),
            &groups,
            self.series
                .iter()
                .map(|(n, values)| BarSeries {
                    name: (*n).into(),
                    values,
                })
                .collect(),
        );
        fig.y_label = "fraction of problems".into();
        fig.x_label = "layer transplanted".into();
        fig
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figure::render_png;
    use ndarray::array;

    #[test]
    fn the_transplant_figure_draws_a_missing_layer_at_zero() {
        let v = [0.5, f64::NAN];
        let s = TransplantSeries {
            to_donor: &v,
            changed: &v,
            donor_problem: &v,
            off_row: &v,
            random: &v,
            zero: &v,
        };
        let bars = TransplantBars::new(&s);
        let fig = bars.figure("m");
        assert_eq!(fig.groups, vec!["layer 0", "layer 1"]);
        assert_eq!(fig.series.len(), 6);
        assert_eq!(fig.series[0].values, &[0.5, 0.0]);
        assert!(render_png(&fig, (400, 300)).is_ok());
    }

    #[test]
    fn dla_adds_the_mlp_column_on_a_symmetric_scale() {
        let heads = array![[0.1, -0.4], [0.2, 0.0]];
        let fig = dla_heads("m", heads.view(), &[0.3, -0.05]).unwrap();
        assert_eq!(fig.options.x_ticks.last().map(String::as_str), Some("MLP"));
        assert_eq!(fig.options.range, Some((-0.4, 0.4)));
        assert!(dla_heads("m", heads.view(), &[0.3]).is_err());
        let p = patching_positions("m", "attn_out", 2, &heads, &["P0F0".into(), "Q0".into()]);
        assert!(
            p.options.title.contains("blocks.{l}.hook_attn_out")
                && p.options.title.contains("slot 2")
        );
        let h = head_ablation("m", "mean", array![[0.001, -0.002]].view()).unwrap();
        assert_eq!(h.options.range, Some((-0.01, 0.01)));
    }
}
