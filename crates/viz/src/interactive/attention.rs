//! Interactive attention patterns and heatmaps: one matrix at a time, chosen with a layer and a
//! head selector, with the value of the cell under the pointer (as CircuitsVis's
//! `attention_patterns` offers). A single heatmap (similarity, composition scores, head ablation)
//! is the case of one layer and one head.

use ndarray::ArrayView4;
use serde_json::json;

use super::encode::{check_finite, floats, quantised, safe_json};
use super::explorer::hex;
use super::{InteractiveFigure, EXACT_CELLS};
use crate::colour::ColorMap;
use crate::error::{Result, VizError};

/// Matrices chosen by layer and head, drawn one at a time with hover values (an
/// [`InteractiveFigure`]).
///
/// # Shapes
/// `values`: `[L, H, R, C]`, e.g. the attention pattern `[layer, head, query, key]` of one problem,
/// or `[1, 1, R, C]` for one heatmap; `layers`: L names; `heads`: H names; `row_labels`: R;
/// `col_labels`: C.
#[derive(Debug, Clone)]
pub struct PatternExplorer<'a> {
    /// Title above the matrix.
    pub title: String,
    /// The matrices, `[L, H, R, C]`; finite.
    pub values: ArrayView4<'a, f64>,
    /// Names of the layers (the first selector), e.g. "layer 0".
    pub layers: Vec<String>,
    /// Names of the heads (the second selector), e.g. "H0".
    pub heads: Vec<String>,
    /// Row labels (queries).
    pub row_labels: Vec<String>,
    /// Column labels (keys).
    pub col_labels: Vec<String>,
    /// Name of the rows in the hover box, e.g. "query".
    pub row_name: String,
    /// Name of the columns in the hover box, e.g. "key".
    pub col_name: String,
    /// Name of the value, e.g. "attention".
    pub value_name: String,
    /// Colour map.
    pub color_map: ColorMap,
    /// Colour range; `None` uses the data's range.
    pub range: Option<(f64, f64)>,
    /// The layer shown first (an index along axis 0); `None` shows the last.
    pub start_layer: Option<usize>,
}

impl<'a> PatternExplorer<'a> {
    /// The attention of every head of every layer on one sequence, `[L, H, T, T]`, labelled
    /// `L{l}H{h}`, viridis over `[0, max]` (blue-white-red, symmetric, when a value is negative,
    /// as the codes of an unnormalised mixer are).
    pub fn attention(title: &str, pattern: ArrayView4<'a, f64>, tokens: &[String]) -> Self {
        let (l, h, _, _) = pattern.dim();
        let (lo, hi) = pattern
            .iter()
            .fold((0.0f64, 0.0f64), |(a, b), &v| (a.min(v), b.max(v)));
        let (color_map, range) = if lo < 0.0 {
            let m = lo.abs().max(hi.abs()).max(f64::MIN_POSITIVE);
            (ColorMap::BlueWhiteRed, Some((-m, m)))
        } else {
            (ColorMap::Viridis, Some((0.0, hi.max(f64::MIN_POSITIVE))))
        };
        Self {
            title: title.to_string(),
            values: pattern,
            layers: (0..l).map(|i| format!("layer {i}")).collect(),
            heads: (0..h).map(|i| format!("H{i}")).collect(),
            row_labels: tokens.to_vec(),
            col_labels: tokens.to_vec(),
            row_name: "query".into(),
            col_name: "key".into(),
            value_name: "attention".into(),
            color_map,
            range,
            start_layer: None,
        }
    }

    fn check(&self) -> Result<(f64, f64)> {
        let (l, h, r, c) = self.values.dim();
        for (what, exp, got) in [
            (
                "pattern explorer layers (axis 0 of values)",
                self.layers.len(),
                l,
            ),
            (
                "pattern explorer heads (axis 1 of values)",
                self.heads.len(),
                h,
            ),
            (
                "pattern explorer row labels (axis 2 of values)",
                self.row_labels.len(),
                r,
            ),
            (
                "pattern explorer column labels (axis 3 of values)",
                self.col_labels.len(),
                c,
            ),
        ] {
            if exp != got {
                return Err(VizError::Length {
                    what: what.into(),
                    expected: exp,
                    got,
                });
            }
        }
        if self.values.is_empty() {
            return Err(VizError::Empty {
                what: "pattern explorer values".into(),
            });
        }
        if r > 512 || c > 512 {
            return Err(VizError::InvalidOption {
                name: "values".into(),
                reason: format!("at most 512 rows and columns are drawn, got {r} x {c}"),
            });
        }
        check_finite("pattern explorer values", self.values.iter().copied())?;
        if let Some(s) = self.start_layer.filter(|&s| s >= l) {
            return Err(VizError::InvalidOption {
                name: "start_layer".into(),
                reason: format!("{s} is not below the {l} layers"),
            });
        }
        let range = match self.range {
            Some((lo, hi)) if lo.is_finite() && hi.is_finite() && hi > lo => (lo, hi),
            Some((lo, hi)) => {
                return Err(VizError::InvalidOption {
                    name: "range".into(),
                    reason: format!("must be finite and increasing, got ({lo}, {hi})"),
                })
            }
            None => {
                let (lo, hi) = self
                    .values
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
                        (a.min(v), b.max(v))
                    });
                if hi > lo {
                    (lo, hi)
                } else {
                    (lo - 0.5, hi + 0.5)
                }
            }
        };
        Ok(range)
    }
}

impl InteractiveFigure for PatternExplorer<'_> {
    fn kind(&self) -> &'static str {
        "patterns"
    }

    fn canvas(&self) -> (u32, u32) {
        (1040, 640)
    }

    fn data_json(&self) -> Result<String> {
        let (lo, hi) = self.check()?;
        let flat: Vec<f64> = self.values.iter().copied().collect();
        let values = if flat.len() <= EXACT_CELLS {
            json!({"exact": floats(flat.iter().copied())})
        } else {
            let (q, r) = quantised(&flat, 8);
            json!({"q": q, "r": r})
        };
        let lut: Vec<String> = (0..64)
            .map(|k| hex(self.color_map.at(f64::from(k) / 63.0)))
            .collect();
        let (l, h, r, c) = self.values.dim();
        Ok(safe_json(&json!({
            "title": self.title,
            "shape": [l, h, r, c],
            "layers": self.layers,
            "heads": self.heads,
            "rows": self.row_labels,
            "cols": self.col_labels,
            "rowName": self.row_name,
            "colName": self.col_name,
            "valueName": self.value_name,
            "range": [lo, hi],
            "lut": lut,
            "values": values,
            "start": self.start_layer.unwrap_or(l - 1),
        })))
    }
}
