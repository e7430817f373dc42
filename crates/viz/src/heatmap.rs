//! Heatmaps with values printed in the cells: rule similarity, confusion matrices, composition
//! scores, head scores. The cell and tick drawing they share with the attention figures is in
//! `cells.rs`.

use ndarray::{Array2, ArrayView2, ArrayView4};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::cells::{
    draw_cells, draw_x_ticks, draw_y_ticks, resolve_range, x_tick_layout, y_tick_layout, Cells,
    Rect,
};
use crate::colour::ColorMap;
use crate::error::{Result, VizError};
use crate::figure::Figure;
use crate::util::{
    begin, centred_text, colour_bar_width, draw_colour_bar, finite2, max_width, same_len, text,
    text_box, AXIS_SIZE, TICK_SIZE,
};

/// How the value of each cell is printed inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueFormat {
    /// No values in the cells (colour only).
    Hidden,
    /// A fixed number of decimals, e.g. `Decimals(2)` prints `0.87` (the default).
    Decimals(usize),
    /// Rounded to an integer (counts).
    Integer,
    /// Multiplied by 100 with this many decimals and a `%` sign.
    Percent(usize),
}

impl Default for ValueFormat {
    fn default() -> Self {
        ValueFormat::Decimals(2)
    }
}

impl ValueFormat {
    /// The printed form of `v`, or `None` when values are hidden.
    pub fn format(&self, v: f64) -> Option<String> {
        let s = match self {
            ValueFormat::Hidden => return None,
            ValueFormat::Decimals(d) => format!("{v:.d$}"),
            ValueFormat::Integer => format!("{}", v.round() as i64),
            ValueFormat::Percent(d) => format!("{:.d$}%", v * 100.0),
        };
        // "-0.00" reads as a sign error; print it as "0.00".
        Some(match s.strip_prefix('-') {
            Some(rest) if rest.chars().all(|c| c == '0' || c == '.' || c == '%') => {
                rest.to_string()
            }
            _ => s,
        })
    }
}

/// Options of a [`Heatmap`].
#[derive(Debug, Clone, PartialEq)]
pub struct HeatmapOptions {
    /// Figure title.
    pub title: String,
    /// Description of the x axis (columns), e.g. "predicted rule"; empty for none.
    pub x_label: String,
    /// Description of the y axis (rows), e.g. "true rule"; empty for none.
    pub y_label: String,
    /// One label per column; empty means column indices `0..cols`.
    pub x_ticks: Vec<String>,
    /// One label per row; empty means row indices `0..rows`.
    pub y_ticks: Vec<String>,
    /// How values are printed in the cells (they are left out when they do not fit).
    pub value_format: ValueFormat,
    /// Colour map of the cells.
    pub color_map: ColorMap,
    /// Value range of the colour map; `None` uses the data range (symmetric around 0 for
    /// [`ColorMap::BlueWhiteRed`]).
    pub range: Option<(f64, f64)>,
    /// Label of the colour bar; the colour bar is drawn unless `show_color_bar` is false.
    pub color_bar_label: String,
    /// Whether to draw the colour bar.
    pub show_color_bar: bool,
    /// Show every n-th tick label; `None` picks the smallest power of two that avoids overlap.
    pub tick_stride: Option<usize>,
    /// Draw a dark separator line every n rows and columns (e.g. n = heads per layer).
    pub separators: Option<usize>,
    /// Cells to leave out ([rows, cols], `true` = masked): drawn light grey without a value, and
    /// allowed to hold NaN. E.g. the structurally zero `l1 >= l2` cells of composition scores.
    pub mask: Option<Array2<bool>>,
}

impl Default for HeatmapOptions {
    fn default() -> Self {
        Self {
            title: String::new(),
            x_label: String::new(),
            y_label: String::new(),
            x_ticks: Vec::new(),
            y_ticks: Vec::new(),
            value_format: ValueFormat::Decimals(2),
            color_map: ColorMap::Viridis,
            range: None,
            color_bar_label: String::new(),
            show_color_bar: true,
            tick_stride: None,
            separators: None,
            mask: None,
        }
    }
}

/// A heatmap of a matrix with names on both axes, values in the cells and a colour bar.
///
/// # Shapes
/// `values`: [rows, cols]; `options.y_ticks` has `rows` labels, `options.x_ticks` `cols` labels
/// (or is empty). Row 0 is drawn at the top (matrix orientation).
#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    /// The matrix, [rows, cols].
    pub values: Array2<f64>,
    /// Labels, colour map and formatting.
    pub options: HeatmapOptions,
}

/// Head labels `L{l}H{h}` in layer-major order (`L0H0, L0H1, ..., L1H0, ...`), the order of a
/// flattened `[layer, head]` axis.
pub fn head_labels(n_layers: usize, n_heads: usize) -> Vec<String> {
    (0..n_layers)
        .flat_map(|l| (0..n_heads).map(move |h| format!("L{l}H{h}")))
        .collect()
}

/// Tick labels and colour range of a heatmap whose input passed the checks.
pub(crate) struct Checked {
    pub(crate) x_ticks: Vec<String>,
    pub(crate) y_ticks: Vec<String>,
    pub(crate) range: (f64, f64),
}

impl Heatmap {
    /// A heatmap of `values` with the given options.
    pub fn new(values: Array2<f64>, options: HeatmapOptions) -> Self {
        Self { values, options }
    }

    /// Cosine similarity between the mean codes of each rule (docs/spec/latent-codes.md, analysis 3):
    /// diverging blue-white-red map on [-1, 1], values with two decimals, rule names on both axes.
    ///
    /// # Shapes
    /// `similarity`: [R, R]; `names`: R rule names.
    ///
    /// # Errors
    /// [`VizError::Length`] if the matrix is not square or `names` has the wrong length.
    pub fn rule_similarity(
        title: &str,
        similarity: ArrayView2<f64>,
        names: &[String],
    ) -> Result<Self> {
        let (r, c) = similarity.dim();
        same_len("rule similarity: columns (must equal rows)", r, c)?;
        same_len("rule similarity: rule names", r, names.len())?;
        Ok(Self::new(
            similarity.to_owned(),
            HeatmapOptions {
                title: title.to_string(),
                x_ticks: names.to_vec(),
                y_ticks: names.to_vec(),
                color_map: ColorMap::BlueWhiteRed,
                range: Some((-1.0, 1.0)),
                color_bar_label: "cosine similarity".to_string(),
                ..HeatmapOptions::default()
            },
        ))
    }

    /// Confusion matrix of a rule decoder (rows: true rule, columns: predicted rule).
    /// With `normalise`, each row is divided by its sum (rows summing to 0 stay 0) and shown with
    /// two decimals on [0, 1]; otherwise counts are shown as integers.
    ///
    /// # Shapes
    /// `counts`: [R, R] non-negative counts; `names`: R class names.
    ///
    /// # Errors
    /// [`VizError::Length`] for a non-square matrix or wrong number of names,
    /// [`VizError::NonFinite`] / [`VizError::OutOfRange`] for NaN or negative counts.
    pub fn confusion_matrix(
        title: &str,
        counts: ArrayView2<f64>,
        names: &[String],
        normalise: bool,
    ) -> Result<Self> {
        let (r, c) = counts.dim();
        same_len("confusion matrix: columns (must equal rows)", r, c)?;
        same_len("confusion matrix: class names", r, names.len())?;
        finite2("confusion matrix", counts)?;
        if let Some(((i, j), v)) = counts.indexed_iter().find(|(_, v)| **v < 0.0) {
            return Err(VizError::OutOfRange {
                what: "confusion matrix".into(),
                at: format!("[{i}, {j}]"),
                value: *v,
                lo: 0.0,
                hi: f64::INFINITY,
            });
        }
        let mut values = counts.to_owned();
        if normalise {
            for mut row in values.rows_mut() {
                let s: f64 = row.sum();
                if s > 0.0 {
                    row.mapv_inplace(|v| v / s);
                }
            }
        }
        Ok(Self::new(
            values,
            HeatmapOptions {
                title: title.to_string(),
                x_label: "predicted".to_string(),
                y_label: "true".to_string(),
                x_ticks: names.to_vec(),
                y_ticks: names.to_vec(),
                value_format: if normalise {
                    ValueFormat::Decimals(2)
                } else {
                    ValueFormat::Integer
                },
                color_map: ColorMap::Viridis,
                range: if normalise { Some((0.0, 1.0)) } else { None },
                color_bar_label: if normalise {
                    "fraction of row".to_string()
                } else {
                    "count".to_string()
                },
                ..HeatmapOptions::default()
            },
        ))
    }

    /// Composition scores (docs/spec/circuits.md) flattened to [L*H, L*H]: row `L{l1}H{h1}` (the
    /// earlier head writing), column `L{l2}H{h2}` (the later head reading), separators between
    /// layers, colour range from 0 to the largest score; cells with `l1 >= l2` (zero by
    /// definition) are masked.
    ///
    /// # Shapes
    /// `scores`: [L, H, L, H] (`[l1, h1, l2, h2]`), zero where `l1 >= l2`.
    ///
    /// # Errors
    /// [`VizError::Length`] if the two head axes disagree, [`VizError::Empty`] for zero heads.
    pub fn composition(title: &str, scores: ArrayView4<f64>) -> Result<Self> {
        let (l1, h1, l2, h2) = scores.dim();
        same_len(
            "composition scores: axis 2 (layers, must equal axis 0)",
            l1,
            l2,
        )?;
        same_len(
            "composition scores: axis 3 (heads, must equal axis 1)",
            h1,
            h2,
        )?;
        if l1 * h1 == 0 {
            return Err(VizError::Empty {
                what: "composition scores".into(),
            });
        }
        let n = l1 * h1;
        let flat = scores
            .to_shape((n, n))
            .map_err(|e| VizError::InvalidOption {
                name: "composition scores".into(),
                reason: e.to_string(),
            })?;
        let labels = head_labels(l1, h1);
        let hi = flat
            .indexed_iter()
            .filter(|((r, c), _)| r / h1 < c / h1)
            .map(|(_, v)| v)
            .fold(0.0f64, |m, v| if v.is_finite() { m.max(*v) } else { m });
        Ok(Self::new(
            flat.to_owned(),
            HeatmapOptions {
                title: title.to_string(),
                x_label: "later head (reads)".to_string(),
                y_label: "earlier head (writes)".to_string(),
                x_ticks: labels.clone(),
                y_ticks: labels,
                color_map: ColorMap::Viridis,
                range: Some((0.0, if hi > 0.0 { hi } else { 1.0 })),
                color_bar_label: "composition score".to_string(),
                separators: if h1 > 1 && l1 > 1 { Some(h1) } else { None },
                mask: Some(Array2::from_shape_fn((n, n), |(r, c)| r / h1 >= c / h1)),
                ..HeatmapOptions::default()
            },
        ))
    }

    /// One score per head, [layer, head], e.g. copying or induction scores: rows `L{l}`,
    /// columns `H{h}`, values with two decimals.
    ///
    /// # Shapes
    /// `scores`: [L, H].
    ///
    /// # Errors
    /// [`VizError::Empty`] for zero layers or heads.
    pub fn head_scores(
        title: &str,
        scores: ArrayView2<f64>,
        score_name: &str,
        color_map: ColorMap,
        range: Option<(f64, f64)>,
    ) -> Result<Self> {
        let (l, h) = scores.dim();
        if l * h == 0 {
            return Err(VizError::Empty {
                what: "head scores".into(),
            });
        }
        Ok(Self::new(
            scores.to_owned(),
            HeatmapOptions {
                title: title.to_string(),
                x_label: "head".to_string(),
                y_label: "layer".to_string(),
                x_ticks: (0..h).map(|i| format!("H{i}")).collect(),
                y_ticks: (0..l).map(|i| format!("L{i}")).collect(),
                color_map,
                range,
                color_bar_label: score_name.to_string(),
                ..HeatmapOptions::default()
            },
        ))
    }

    fn ticks(&self) -> Result<(Vec<String>, Vec<String>)> {
        let (rows, cols) = self.values.dim();
        let o = &self.options;
        let xt = if o.x_ticks.is_empty() {
            (0..cols).map(|j| j.to_string()).collect()
        } else {
            o.x_ticks.clone()
        };
        let yt = if o.y_ticks.is_empty() {
            (0..rows).map(|i| i.to_string()).collect()
        } else {
            o.y_ticks.clone()
        };
        same_len("heatmap x tick labels (one per column)", cols, xt.len())?;
        same_len("heatmap y tick labels (one per row)", rows, yt.len())?;
        Ok((xt, yt))
    }

    /// Checks the input (shapes, tick counts, mask, finite unmasked values) and resolves the
    /// tick labels and the colour range, as the drawing uses them.
    pub(crate) fn check(&self) -> Result<Checked> {
        let (rows, cols) = self.values.dim();
        if rows == 0 || cols == 0 {
            return Err(VizError::Empty {
                what: "heatmap values".into(),
            });
        }
        let (xt, yt) = self.ticks()?;
        let mut shown = self.values.clone();
        if let Some(m) = &self.options.mask {
            if m.dim() != (rows, cols) {
                return Err(VizError::InvalidOption {
                    name: "mask".into(),
                    reason: format!(
                        "shape {:?} differs from the values' shape {:?}",
                        m.dim(),
                        (rows, cols)
                    ),
                });
            }
            // Masked cells may hold NaN; they do not count for the colour range.
            let fill = self
                .values
                .iter()
                .zip(m.iter())
                .find(|(v, m)| !**m && v.is_finite())
                .map_or(0.0, |(v, _)| *v);
            ndarray::Zip::from(&mut shown).and(m).for_each(|v, &m| {
                if m {
                    *v = fill
                }
            });
        }
        finite2("heatmap values", shown.view())?;
        let range = resolve_range(shown.view(), self.options.color_map, self.options.range)?;
        if self.options.tick_stride == Some(0) {
            return Err(VizError::InvalidOption {
                name: "tick_stride".into(),
                reason: "must be at least 1".into(),
            });
        }
        Ok(Checked {
            x_ticks: xt,
            y_ticks: yt,
            range,
        })
    }
}

impl Figure for Heatmap {
    fn size(&self) -> (u32, u32) {
        let (rows, cols) = self.values.dim();
        let n = rows.max(cols).max(1) as f64;
        let cell = (640.0 / n).clamp(30.0, 80.0);
        let (xt, yt) = self.ticks().unwrap_or_default();
        let left = 40 + max_width(&yt, &text(TICK_SIZE)) as u32;
        let bottom = 50 + max_width(&xt, &text(TICK_SIZE)).min(200) as u32;
        let w = left + (cell * cols as f64) as u32 + 150;
        let h = 70 + (cell * rows as f64) as u32 + bottom;
        (w.clamp(420, 2400), h.clamp(320, 2400))
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let Checked {
            x_ticks: xt,
            y_ticks: yt,
            range,
        } = self.check()?;
        let o = &self.options;
        let (rows, cols) = self.values.dim();
        let body = begin(area, &o.title)?;
        let (w, h) = body.dim_in_pixel();
        let (w, h) = (w as i32, h as i32);
        let axis_h = text_box("Ag", &text(AXIS_SIZE)).1 + 8;
        let cb_w = if o.show_color_bar {
            colour_bar_width(range, &o.color_bar_label) + 10
        } else {
            0
        };
        let y_axis_w = if o.y_label.is_empty() { 0 } else { axis_h };
        // The y tick width depends on the stride, which depends on the cell height: estimate the
        // height first with the x tick area of a flat layout, then settle.
        let (_, yt_w_all) = y_tick_layout(&yt, f64::INFINITY, Some(1));
        let left = y_axis_w + yt_w_all;
        let pw = (w - left - cb_w - 10).max(cols as i32);
        let xt_layout = x_tick_layout(&xt, pw as f64 / cols as f64, o.tick_stride);
        let bottom = xt_layout.height + if o.x_label.is_empty() { 0 } else { axis_h } + 4;
        let ph = (h - bottom - 8).max(rows as i32);
        let (ys, yt_w) = y_tick_layout(&yt, ph as f64 / rows as f64, o.tick_stride);
        let left = y_axis_w + yt_w;
        let pw = (w - left - cb_w - 10).max(cols as i32);
        let rect = Rect {
            x0: left,
            y0: 8,
            x1: left + pw,
            y1: 8 + ph,
        };
        let cells = Cells {
            values: self.values.view(),
            mask: o.mask.as_ref().map(|m| m.view()),
            cmap: o.color_map,
            range,
            fmt: o.value_format,
            separators: o.separators,
        };
        draw_cells(&body, rect, &cells)?;
        draw_x_ticks(&body, rect, &xt, xt_layout)?;
        draw_y_ticks(&body, rect, &yt, ys)?;
        if !o.x_label.is_empty() {
            let y = rect.y1 + xt_layout.height + axis_h / 2;
            centred_text(
                &body,
                &o.x_label,
                &text(AXIS_SIZE),
                ((rect.x0 + rect.x1) / 2, y),
                false,
            )?;
        }
        if !o.y_label.is_empty() {
            centred_text(
                &body,
                &o.y_label,
                &text(AXIS_SIZE),
                (axis_h / 2, (rect.y0 + rect.y1) / 2),
                true,
            )?;
        }
        if o.show_color_bar {
            draw_colour_bar(
                &body,
                (rect.x1 + 10, rect.y0, rect.y1),
                o.color_map,
                range,
                &o.color_bar_label,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, Array4};

    #[test]
    fn value_formats() {
        assert_eq!(ValueFormat::Decimals(2).format(0.8666), Some("0.87".into()));
        assert_eq!(ValueFormat::Decimals(1).format(-0.01), Some("0.0".into()));
        assert_eq!(ValueFormat::Integer.format(12.6), Some("13".into()));
        assert_eq!(ValueFormat::Percent(1).format(0.4567), Some("45.7%".into()));
        assert_eq!(ValueFormat::Hidden.format(1.0), None);
    }

    #[test]
    fn confusion_rows_are_normalised() {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let counts = array![[3.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 2.0, 4.0]];
        let hm = Heatmap::confusion_matrix("c", counts.view(), &names, true).unwrap();
        assert_eq!(hm.values.row(0).to_vec(), vec![0.75, 0.25, 0.0]);
        assert_eq!(hm.values.row(1).to_vec(), vec![0.0, 0.0, 0.0]);
        assert_eq!(hm.values.row(2).to_vec(), vec![0.25, 0.25, 0.5]);
        let neg = array![[1.0, -1.0], [0.0, 1.0]];
        assert!(Heatmap::confusion_matrix("c", neg.view(), &names[..2], false).is_err());
    }

    #[test]
    fn composition_flattens_layer_major() {
        // [L=3, H=2, L=3, H=2]; value encodes the four indices.
        let s = Array4::from_shape_fn((3, 2, 3, 2), |(a, b, c, d)| {
            (a * 1000 + b * 100 + c * 10 + d) as f64
        });
        let hm = Heatmap::composition("k", s.view()).unwrap();
        assert_eq!(hm.values.dim(), (6, 6));
        // Row L1H0 = index 2, column L2H1 = index 5.
        assert_eq!(hm.values[[2, 5]], 1021.0);
        assert_eq!(hm.options.y_ticks[3], "L1H1");
        assert_eq!(hm.options.separators, Some(2));
    }

    #[test]
    fn ranges_resolve() {
        let v = array![[-0.2, 0.5], [0.1, 0.3]];
        assert_eq!(
            resolve_range(v.view(), ColorMap::BlueWhiteRed, None).unwrap(),
            (-0.5, 0.5)
        );
        assert_eq!(
            resolve_range(v.view(), ColorMap::Viridis, None).unwrap(),
            (-0.2, 0.5)
        );
        assert!(resolve_range(v.view(), ColorMap::Viridis, Some((1.0, 0.0))).is_err());
        assert_eq!(head_labels(2, 3)[4], "L1H1");
    }
}
