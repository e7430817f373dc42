//! Attention patterns: a grid of heads of one layer for one problem, each panel [query, key];
//! or the pattern of one head on a token sequence (docs/spec/circuits.md, head detection).

use ndarray::{ArrayView2, ArrayView3, Axis};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::cells::{
    draw_cells, draw_x_ticks, draw_y_ticks_spanning, resolve_range, x_tick_layout, y_tick_layout,
    Cells, Rect,
};
use crate::colour::ColorMap;
use crate::error::{Result, VizError};
use crate::figure::Figure;
use crate::heatmap::ValueFormat;
use crate::util::{
    begin, centred_text, colour_bar_width, draw_colour_bar, finite3, max_width, same_len, text,
    text_box, AXIS_SIZE, TICK_SIZE,
};

const PANEL_TITLE_SIZE: f64 = 16.0;
const GAP: i32 = 18;

/// Attention patterns of several heads (one panel per head, [query, key]) sharing one colour
/// range and colour bar; query labels on the left column, key labels under the bottom row.
///
/// # Shapes
/// `patterns`: [head, query, key] (the attention layout [batch, head, query, key] for one
/// problem); `query_labels`: Q strings; `key_labels`: K strings (e.g. "P0s0".."P7s3", "Q0".."Q3");
/// `panel_titles`: one per head.
#[derive(Debug, Clone)]
pub struct AttentionGrid<'a> {
    /// Figure title.
    pub title: String,
    /// Attention weights, [head, query, key].
    pub patterns: ArrayView3<'a, f64>,
    /// Label of each query position (rows).
    pub query_labels: Vec<String>,
    /// Label of each key position (columns).
    pub key_labels: Vec<String>,
    /// Caption of each panel, e.g. "head 3".
    pub panel_titles: Vec<String>,
    /// Panels per row.
    pub columns: usize,
    /// Colour map (viridis by default).
    pub color_map: ColorMap,
    /// Colour range shared by all panels; `None` uses the data range.
    pub range: Option<(f64, f64)>,
    /// Show every n-th tick label; `None` picks the smallest power of two that avoids overlap.
    pub tick_stride: Option<usize>,
    /// A dark line every n positions (e.g. 4 = one panel of 4 slots).
    pub separators: Option<usize>,
    /// Label groups of this many positions once each, centred on the group, with the label of
    /// its first position (e.g. 4 with labels "P0" .. "P7", "Q": one label per SRAVEN panel);
    /// overrides `tick_stride`. `None` labels positions.
    pub tick_groups: Option<usize>,
}

impl<'a> AttentionGrid<'a> {
    /// All heads of one layer, captions "head h", about square grid (4 x 4 for 16 heads).
    pub fn new(
        title: &str,
        patterns: ArrayView3<'a, f64>,
        query_labels: &[String],
        key_labels: &[String],
    ) -> Self {
        let h = patterns.len_of(Axis(0));
        Self {
            title: title.to_string(),
            patterns,
            query_labels: query_labels.to_vec(),
            key_labels: key_labels.to_vec(),
            panel_titles: (0..h).map(|i| format!("head {i}")).collect(),
            columns: (h as f64).sqrt().ceil().max(1.0) as usize,
            color_map: ColorMap::Viridis,
            range: None,
            tick_stride: None,
            separators: None,
            tick_groups: None,
        }
    }

    /// The pattern of one head on a token sequence, [query, key], with the tokens as labels on
    /// both axes (e.g. the induction stripe on a repeated random sequence).
    pub fn single_head(title: &str, pattern: ArrayView2<'a, f64>, tokens: &[String]) -> Self {
        let mut g = Self::new(title, pattern.insert_axis(Axis(0)), tokens, tokens);
        g.panel_titles = vec![String::new()];
        g
    }

    fn check(&self) -> Result<(f64, f64)> {
        let (h, q, k) = self.patterns.dim();
        if h == 0 || q == 0 || k == 0 {
            return Err(VizError::Empty {
                what: format!("attention patterns (shape [{h}, {q}, {k}])"),
            });
        }
        same_len(
            "attention query labels (one per query position)",
            q,
            self.query_labels.len(),
        )?;
        same_len(
            "attention key labels (one per key position)",
            k,
            self.key_labels.len(),
        )?;
        same_len(
            "attention panel titles (one per head)",
            h,
            self.panel_titles.len(),
        )?;
        finite3("attention patterns", self.patterns)?;
        if self.columns == 0 || self.tick_stride == Some(0) || self.tick_groups == Some(0) {
            return Err(VizError::InvalidOption {
                name: if self.columns == 0 {
                    "columns"
                } else if self.tick_groups == Some(0) {
                    "tick_groups"
                } else {
                    "tick_stride"
                }
                .into(),
                reason: "must be at least 1".into(),
            });
        }
        let flat = self
            .patterns
            .to_shape((h * q, k))
            .map_err(|e| VizError::InvalidOption {
                name: "patterns".into(),
                reason: e.to_string(),
            })?;
        resolve_range(flat.view(), self.color_map, self.range)
    }

    fn grid(&self) -> (usize, usize) {
        let h = self.patterns.len_of(Axis(0));
        let cols = self.columns.clamp(1, h.max(1));
        (h.div_ceil(cols), cols)
    }

    fn has_titles(&self) -> bool {
        self.panel_titles.iter().any(|t| !t.is_empty())
    }
}

impl Figure for AttentionGrid<'_> {
    fn size(&self) -> (u32, u32) {
        let (_, q, k) = self.patterns.dim();
        let (rows, cols) = self.grid();
        let panel_w: u32 = if cols == 1 { 640 } else { 300 };
        let panel_h = ((panel_w as f64 * q as f64 / k.max(1) as f64) as u32).clamp(90, panel_w);
        let title_h = if self.has_titles() { 26 } else { 0 };
        let left = 60 + max_width(&self.query_labels, &text(TICK_SIZE)).max(0) as u32;
        let bottom = 60 + max_width(&self.key_labels, &text(TICK_SIZE)).max(0) as u32;
        let w = left + cols as u32 * (panel_w + GAP as u32) + 140;
        let h = 60 + rows as u32 * (panel_h + title_h + GAP as u32) + bottom;
        (w.clamp(400, 3000), h.clamp(300, 3000))
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let range = self.check()?;
        let (heads, q, k) = self.patterns.dim();
        let (rows, cols) = self.grid();
        let body = begin(area, &self.title)?;
        let (w, h) = body.dim_in_pixel();
        let (w, h) = (w as i32, h as i32);
        let axis_h = text_box("Ag", &text(AXIS_SIZE)).1 + 8;
        let title_h = if self.has_titles() {
            text_box("Ag", &text(PANEL_TITLE_SIZE)).1 + 8
        } else {
            0
        };
        let cb_label = "attention weight";
        let cb_w = colour_bar_width(range, cb_label) + 10;
        let stride = self.tick_groups.or(self.tick_stride);
        let span = self.tick_groups.unwrap_or(1);
        let (_, yt_all) = y_tick_layout(&self.query_labels, f64::INFINITY, Some(1));
        let panel_w = |left: i32| {
            ((w - left - cb_w - 10 - GAP * (cols as i32 - 1)) / cols as i32).max(k as i32)
        };
        let mut xt = x_tick_layout(
            &self.key_labels,
            panel_w(axis_h + yt_all) as f64 / k as f64,
            stride,
        );
        xt.span = span;
        let bottom = xt.height + axis_h + 4;
        let panel_h = ((h - bottom - 4 - rows as i32 * title_h - GAP * (rows as i32 - 1))
            / rows as i32)
            .max(q as i32);
        let (ys, yt_w) = y_tick_layout(&self.query_labels, panel_h as f64 / q as f64, stride);
        let left = axis_h + yt_w;
        let pw = panel_w(left);
        let mut grid_bottom = 0;
        for head in 0..heads {
            let (r, c) = (head / cols, head % cols);
            let x0 = left + c as i32 * (pw + GAP);
            let y0 = r as i32 * (panel_h + title_h + GAP) + title_h;
            let rect = Rect {
                x0,
                y0,
                x1: x0 + pw,
                y1: y0 + panel_h,
            };
            grid_bottom = grid_bottom.max(rect.y1);
            if title_h > 0 {
                centred_text(
                    &body,
                    &self.panel_titles[head],
                    &text(PANEL_TITLE_SIZE),
                    ((x0 + rect.x1) / 2, y0 - title_h / 2),
                    false,
                )?;
            }
            let cells = Cells {
                values: self.patterns.index_axis(Axis(0), head),
                mask: None,
                cmap: self.color_map,
                range,
                fmt: ValueFormat::Hidden,
                separators: self.separators,
            };
            draw_cells(&body, rect, &cells)?;
            if c == 0 {
                draw_y_ticks_spanning(&body, rect, &self.query_labels, ys, span)?;
            }
            if head + cols >= heads {
                draw_x_ticks(&body, rect, &self.key_labels, xt)?;
            }
        }
        let grid_right = left + cols as i32 * (pw + GAP) - GAP;
        centred_text(
            &body,
            "key",
            &text(AXIS_SIZE),
            (
                (left + grid_right) / 2,
                grid_bottom + xt.height + axis_h / 2,
            ),
            false,
        )?;
        centred_text(
            &body,
            "query",
            &text(AXIS_SIZE),
            (axis_h / 2, (title_h + grid_bottom) / 2),
            true,
        )?;
        draw_colour_bar(
            &body,
            (grid_right + 10, title_h, grid_bottom),
            self.color_map,
            range,
            cb_label,
        )?;
        Ok(())
    }
}
