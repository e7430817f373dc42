//! Interactive heatmaps: one or more matrices over the same rows and columns (e.g. a
//! head-ablation's accuracy and loss changes per layer x head, or the Q, K and V composition
//! scores of every pair of heads), one at a time with a switch, with the row, column and value of
//! the cell under the pointer. Each panel is a static [`Heatmap`], the figure the PNG is drawn
//! from, so the interactive figure shows the same cells, colours and colour range.

use serde_json::{json, Value};

use super::encode::{floats, ints, quantised, safe_json};
use super::explorer::hex;
use super::{InteractiveFigure, EXACT_CELLS};
use crate::error::{Result, VizError};
use crate::heatmap::Heatmap;

/// Estimated width of a character of the tick labels (11 px DejaVu Sans), in pixels.
const CHAR: f64 = 6.2;

/// Heatmaps over the same rows and columns, shown one at a time with a switch, with hover values
/// (an [`InteractiveFigure`]).
///
/// Each panel is a [`Heatmap`]: its values, tick labels, colour map, colour range (resolved as the
/// PNG resolves it), mask, separators and colour-bar label (the value's name in the hover box).
/// Values are stored exactly (as `f32`) up to 20,000 cells in all; more are quantised to 8 bits
/// over each panel's range (hover values then carry `≈`). Masked cells are drawn grey and their
/// hover box says [`HeatmapExplorer::masked`].
///
/// # Shapes
/// Every panel's `values`: the same `[R, C]`, with the same tick labels; R and C at most 512.
#[derive(Debug, Clone)]
pub struct HeatmapExplorer<'a> {
    /// The panels: a name in the switch (unused when there is one panel) and the heatmap, whose
    /// title is the figure's title while it is shown.
    pub panels: Vec<(String, &'a Heatmap)>,
    /// Name of the rows in the hover box, e.g. "layer"; empty: the first panel's y label, or
    /// "row".
    pub row_name: String,
    /// Name of the columns in the hover box, e.g. "head"; empty: the first panel's x label, or
    /// "column".
    pub col_name: String,
    /// What the hover box says for a masked cell, e.g. "not computed".
    pub masked: String,
    /// The panel shown first (an index into `panels`).
    pub start: usize,
}

/// Positions of the matrix in the canvas, shared by [`InteractiveFigure::canvas`] and the data.
struct Layout {
    x0: f64,
    y0: f64,
    side: f64,
    width: u32,
    height: u32,
}

impl<'a> HeatmapExplorer<'a> {
    /// Panels named as given, row and column names from the first panel's axis labels, the first
    /// panel shown first.
    pub fn new(panels: Vec<(String, &'a Heatmap)>) -> Self {
        Self {
            panels,
            row_name: String::new(),
            col_name: String::new(),
            masked: "not computed".into(),
            start: 0,
        }
    }

    /// One heatmap alone.
    pub fn single(heatmap: &'a Heatmap) -> Self {
        Self::new(vec![(String::new(), heatmap)])
    }

    fn first(&self) -> Result<&'a Heatmap> {
        self.panels
            .first()
            .map(|p| p.1)
            .ok_or_else(|| VizError::Empty {
                what: "heatmap explorer panels".into(),
            })
    }

    fn names(&self) -> (String, String) {
        let pick = |given: &str, label: Option<&String>, default: &str| {
            if !given.is_empty() {
                given.to_string()
            } else {
                label
                    .filter(|l| !l.is_empty())
                    .cloned()
                    .unwrap_or_else(|| default.to_string())
            }
        };
        let first = self.panels.first().map(|p| &p.1.options);
        (
            pick(&self.row_name, first.map(|o| &o.y_label), "row"),
            pick(&self.col_name, first.map(|o| &o.x_label), "column"),
        )
    }

    fn layout(&self) -> Layout {
        let longest = |v: &[String]| v.iter().map(|s| s.chars().count()).max().unwrap_or(1);
        let Some(h) = self.panels.first().map(|p| p.1) else {
            return Layout {
                x0: 0.0,
                y0: 0.0,
                side: 0.0,
                width: 320,
                height: 240,
            };
        };
        let (rows, cols) = h.values.dim();
        let o = &h.options;
        let row_chars = if o.y_ticks.is_empty() {
            rows.to_string().len()
        } else {
            longest(&o.y_ticks)
        };
        let col_chars = if o.x_ticks.is_empty() {
            cols.to_string().len()
        } else {
            longest(&o.x_ticks)
        };
        let label_w = (8.0 + CHAR * row_chars as f64).min(150.0).round();
        let x0 = 16.0 + if o.y_label.is_empty() { 0.0 } else { 20.0 } + label_w;
        let y0 = if self.panels.len() > 1 { 76.0 } else { 44.0 };
        let n = rows.max(cols).max(1) as f64;
        let side = (60.0 * n).min(500.0);
        let cell = side / n;
        let (w, hgt) = (cell * cols as f64, cell * rows as f64);
        // Column labels are rotated by 60 degrees.
        let col_ext = 8.0 + CHAR * col_chars.min(24) as f64 * 0.87;
        let x_label = if o.x_label.is_empty() { 0.0 } else { 22.0 };
        let value_chars = self
            .panels
            .iter()
            .map(|p| p.1.options.color_bar_label.chars().count().max(5))
            .max()
            .unwrap_or(5);
        let bar = (14.0 + 8.0 + 64.0f64).max(6.6 * value_chars as f64);
        let title_chars = self
            .panels
            .iter()
            .map(|p| p.1.options.title.chars().count())
            .max()
            .unwrap_or(0);
        let switch_chars: usize = self.panels.iter().map(|p| p.0.chars().count() + 3).sum();
        let width = (x0 + w + 20.0 + bar + 16.0)
            .max(24.0 + 9.4 * title_chars as f64)
            .max(80.0 + 7.0 * switch_chars as f64)
            .max(320.0);
        let height = (y0 + hgt.max(230.0) + col_ext + x_label + 12.0).max(240.0);
        Layout {
            x0,
            y0,
            side,
            width: width.ceil() as u32,
            height: height.ceil() as u32,
        }
    }

    fn panel_json(&self, name: &str, h: &Heatmap, exact: bool) -> Result<Value> {
        let c = h.check()?;
        let (lo, hi) = c.range;
        let mask = h.options.mask.as_ref();
        let flat: Vec<f64> = match mask {
            Some(m) => h
                .values
                .iter()
                .zip(m.iter())
                .map(|(&v, &m)| if m || !v.is_finite() { lo } else { v })
                .collect(),
            None => h.values.iter().copied().collect(),
        };
        let values = if exact {
            json!({"exact": floats(flat.iter().copied())})
        } else {
            let (q, r) = quantised(&flat, 8);
            json!({"q": q, "r": r})
        };
        let mask = match mask {
            Some(m) if m.iter().any(|&x| x) => {
                ints("heatmap mask", m.iter().map(|&x| i64::from(x)))?
            }
            _ => Value::Null,
        };
        let lut: Vec<String> = (0..64)
            .map(|k| hex(h.options.color_map.at(f64::from(k) / 63.0)))
            .collect();
        let value_name = if h.options.color_bar_label.is_empty() {
            "value".to_string()
        } else {
            h.options.color_bar_label.clone()
        };
        Ok(json!({
            "name": name,
            "title": h.options.title,
            "valueName": value_name,
            "range": [lo, hi],
            "lut": lut,
            "values": values,
            "mask": mask,
        }))
    }
}

impl InteractiveFigure for HeatmapExplorer<'_> {
    fn kind(&self) -> &'static str {
        "heatmap"
    }

    fn canvas(&self) -> (u32, u32) {
        let l = self.layout();
        (l.width, l.height)
    }

    fn data_json(&self) -> Result<String> {
        let first = self.first()?;
        let c = first.check()?;
        let (rows, cols) = first.values.dim();
        if rows > 512 || cols > 512 {
            return Err(VizError::InvalidOption {
                name: "values".into(),
                reason: format!("at most 512 rows and columns are drawn, got {rows} x {cols}"),
            });
        }
        if self.start >= self.panels.len() {
            return Err(VizError::InvalidOption {
                name: "start".into(),
                reason: format!(
                    "{} is not below the {} panels",
                    self.start,
                    self.panels.len()
                ),
            });
        }
        for (name, h) in &self.panels[1..] {
            let other = h.check()?;
            if h.values.dim() != (rows, cols) {
                return Err(VizError::Length {
                    what: format!("heatmap explorer panel `{name}`: cells (rows x columns, as the first panel's)"),
                    expected: rows * cols,
                    got: h.values.len(),
                });
            }
            if other.x_ticks != c.x_ticks || other.y_ticks != c.y_ticks {
                return Err(VizError::InvalidOption {
                    name: format!("heatmap explorer panel `{name}`"),
                    reason: "its tick labels differ from the first panel's".into(),
                });
            }
        }
        let exact = self.panels.len() * rows * cols <= EXACT_CELLS;
        let panels: Vec<Value> = self
            .panels
            .iter()
            .map(|(name, h)| self.panel_json(name, h, exact))
            .collect::<Result<_>>()?;
        let (row_name, col_name) = self.names();
        let l = self.layout();
        let o = &first.options;
        Ok(safe_json(&json!({
            "rows": c.y_ticks,
            "cols": c.x_ticks,
            "rowName": row_name,
            "colName": col_name,
            "xLabel": o.x_label,
            "yLabel": o.y_label,
            "separators": o.separators.filter(|&n| n > 0 && n < rows.max(cols)),
            "masked": self.masked,
            "layout": {"x0": l.x0, "y0": l.y0, "s": l.side},
            "panels": panels,
            "start": self.start,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::colour::ColorMap;
    use crate::heatmap::HeatmapOptions;
    use ndarray::{array, Array4};

    fn data(fig: &HeatmapExplorer<'_>) -> Value {
        serde_json::from_str(&fig.data_json().unwrap()).unwrap()
    }

    fn f32s(a: &Value) -> Vec<f32> {
        let s = a["b"].as_str().unwrap();
        let dec = |c: u8| -> u32 {
            match c {
                b'A'..=b'Z' => u32::from(c - b'A'),
                b'a'..=b'z' => u32::from(c - b'a') + 26,
                b'0'..=b'9' => u32::from(c - b'0') + 52,
                b'+' => 62,
                _ => 63,
            }
        };
        let mut bytes = Vec::new();
        for ch in s.as_bytes().chunks(4) {
            let pad = ch.iter().filter(|&&c| c == b'=').count();
            let n = ch
                .iter()
                .fold(0u32, |n, &c| (n << 6) | if c == b'=' { 0 } else { dec(c) });
            bytes.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
        }
        bytes
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    #[test]
    fn head_scores_keep_their_values_ticks_and_range() {
        let v = array![[0.5, -0.25, 0.0], [1.0, 0.125, -1.0]];
        let h = Heatmap::head_scores(
            "ablation",
            v.view(),
            "accuracy change",
            ColorMap::BlueWhiteRed,
            None,
        )
        .unwrap();
        let fig = HeatmapExplorer::single(&h);
        let d = data(&fig);
        assert_eq!(d["rows"], json!(["L0", "L1"]));
        assert_eq!(d["cols"], json!(["H0", "H1", "H2"]));
        assert_eq!(d["rowName"], "layer");
        assert_eq!(d["colName"], "head");
        let p = &d["panels"][0];
        assert_eq!(p["valueName"], "accuracy change");
        assert_eq!(p["title"], "ablation");
        // The PNG's range: symmetric for the diverging map.
        assert_eq!(p["range"], json!([-1.0, 1.0]));
        assert_eq!(
            f32s(&p["values"]["exact"]),
            vec![0.5, -0.25, 0.0, 1.0, 0.125, -1.0]
        );
        assert_eq!(p["mask"], Value::Null);
        assert_eq!(p["lut"].as_array().unwrap().len(), 64);
        // Deterministic: the same inputs give the same bytes.
        assert_eq!(fig.svg_document().unwrap(), fig.svg_document().unwrap());
        assert!(fig
            .svg_element()
            .unwrap()
            .contains("data-hl-kind=\"heatmap\""));
    }

    #[test]
    fn composition_panels_share_labels_and_mask_the_lower_layers() {
        let mut s = Array4::<f64>::zeros((2, 2, 2, 2));
        s[[0, 1, 1, 0]] = 0.75;
        s[[0, 0, 0, 1]] = f64::NAN; // masked: same layer
        let q = Heatmap::composition("Q", s.view()).unwrap();
        let k = Heatmap::composition("K", (&s * 0.5).view()).unwrap();
        let mut fig = HeatmapExplorer::new(vec![("Q".into(), &q), ("K".into(), &k)]);
        fig.start = 1;
        let d = data(&fig);
        assert_eq!(d["rows"], json!(["L0H0", "L0H1", "L1H0", "L1H1"]));
        assert_eq!(d["separators"], 2);
        assert_eq!(d["start"], 1);
        let p = &d["panels"][1];
        assert_eq!(p["title"], "K");
        assert_eq!(p["range"], json!([0.0, 0.375]));
        // Row L0H1 (1), column L1H0 (2): the score; masked cells (the later head not in a later
        // layer) hold the range's low end, and the mask marks them.
        let v = f32s(&p["values"]["exact"]);
        assert_eq!(v[4 + 2], 0.375);
        assert_eq!(v[1], 0.0);
        assert_eq!(p["mask"]["t"], "u4");
        assert_eq!(p["mask"]["n"], 16);
    }

    #[test]
    fn bad_panels_are_errors() {
        let a = Heatmap::new(ndarray::Array2::zeros((2, 2)), HeatmapOptions::default());
        let b = Heatmap::new(ndarray::Array2::zeros((2, 3)), HeatmapOptions::default());
        let fig = HeatmapExplorer::new(vec![("a".into(), &a), ("b".into(), &b)]);
        assert!(matches!(fig.data_json(), Err(VizError::Length { .. })));
        let mut fig = HeatmapExplorer::single(&a);
        fig.start = 1;
        assert!(matches!(
            fig.data_json(),
            Err(VizError::InvalidOption { .. })
        ));
        assert!(matches!(
            HeatmapExplorer::new(Vec::new()).data_json(),
            Err(VizError::Empty { .. })
        ));
        let nan = Heatmap::new(array![[f64::NAN]], HeatmapOptions::default());
        assert!(matches!(
            HeatmapExplorer::single(&nan).data_json(),
            Err(VizError::NonFinite { .. })
        ));
    }
}
