//! OV-circuit eigenvalues in the complex plane, one panel per head (Elhage et al. 2021,
//! "A Mathematical Framework for Transformer Circuits", the copying-eigenvalue figure;
//! docs/spec/circuits.md).

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Result, VizError};
use crate::figure::Figure;
use crate::util::{begin, centred_text, text, text_box, FixedTicks, AXIS_SIZE, GRID_GREY};

const CIRCLE_GREY: RGBColor = RGBColor(90, 90, 90);

/// One head's eigenvalues.
#[derive(Debug, Clone)]
pub struct EigenPanel<'a> {
    /// Caption, e.g. "L0H3" (callers may append the copying score).
    pub label: String,
    /// Eigenvalues as (real, imaginary) pairs.
    pub eigenvalues: &'a [(f64, f64)],
}

/// Eigenvalues `lambda / |lambda|` of each head's OV circuit on the unit circle, one small
/// square panel per head. Eigenvalues at or below `1e-9 * max |lambda|` of their head are
/// numerically zero (the OV circuit has rank <= d_head) and are left out.
#[derive(Debug, Clone)]
pub struct EigenvalueGrid<'a> {
    /// Figure title.
    pub title: String,
    /// Panels, row-major.
    pub panels: Vec<EigenPanel<'a>>,
    /// Panels per row (e.g. heads per layer for a [layer x head] grid).
    pub columns: usize,
}

impl<'a> EigenvalueGrid<'a> {
    /// A [layer x head] grid: `eigenvalues[l * n_heads + h]` belongs to head `L{l}H{h}`.
    ///
    /// # Shapes
    /// `eigenvalues`: `n_layers * n_heads` lists of (re, im) pairs.
    ///
    /// # Errors
    /// [`VizError::Length`] if the number of lists is not `n_layers * n_heads`.
    pub fn layers_by_heads(
        title: &str,
        eigenvalues: &'a [Vec<(f64, f64)>],
        n_layers: usize,
        n_heads: usize,
    ) -> Result<Self> {
        crate::util::same_len(
            "eigenvalue lists (n_layers * n_heads)",
            n_layers * n_heads,
            eigenvalues.len(),
        )?;
        let panels = eigenvalues
            .iter()
            .enumerate()
            .map(|(i, e)| EigenPanel {
                label: format!("L{}H{}", i / n_heads.max(1), i % n_heads.max(1)),
                eigenvalues: e,
            })
            .collect();
        Ok(Self {
            title: title.to_string(),
            panels,
            columns: n_heads.max(1),
        })
    }

    fn check(&self) -> Result<()> {
        if self.panels.is_empty() {
            return Err(VizError::Empty {
                what: "eigenvalue panels".into(),
            });
        }
        if self.columns == 0 {
            return Err(VizError::InvalidOption {
                name: "columns".into(),
                reason: "must be at least 1".into(),
            });
        }
        for p in &self.panels {
            if let Some(i) = p
                .eigenvalues
                .iter()
                .position(|(re, im)| !re.is_finite() || !im.is_finite())
            {
                let (re, im) = p.eigenvalues[i];
                return Err(VizError::NonFinite {
                    what: format!("eigenvalues of {}", p.label),
                    at: format!("[{i}]"),
                    value: if re.is_finite() { im } else { re },
                });
            }
        }
        Ok(())
    }

    fn grid(&self) -> (usize, usize) {
        let cols = self.columns.clamp(1, self.panels.len().max(1));
        (self.panels.len().div_ceil(cols), cols)
    }
}

/// `lambda / |lambda|` of the eigenvalues that are not numerically zero.
fn unit_phases(eigenvalues: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let max = eigenvalues
        .iter()
        .map(|(re, im)| re.hypot(*im))
        .fold(0.0f64, f64::max);
    eigenvalues
        .iter()
        .filter_map(|(re, im)| {
            let m = re.hypot(*im);
            (m > 1e-9 * max && m > 0.0).then(|| (re / m, im / m))
        })
        .collect()
}

impl Figure for EigenvalueGrid<'_> {
    fn size(&self) -> (u32, u32) {
        let (rows, cols) = self.grid();
        let side = if cols <= 2 { 280 } else { 210 };
        ((cols as u32 * side + 60).max(360), rows as u32 * side + 110)
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        self.check()?;
        let (rows, cols) = self.grid();
        let body = begin(area, &self.title)?;
        let (w, h) = body.dim_in_pixel();
        let axis_h = text_box("Ag", &text(AXIS_SIZE)).1 + 8;
        let side = ((w as i32 - axis_h) / cols as i32)
            .min((h as i32 - axis_h) / rows as i32)
            .max(40);
        let grid_w = side * cols as i32;
        let x_off = axis_h + ((w as i32 - axis_h - grid_w) / 2).max(0);
        let tick_style = text(11.0);
        for (i, panel) in self.panels.iter().enumerate() {
            let (r, c) = (i / cols, i % cols);
            let cell = body.clone().shrink(
                (x_off + c as i32 * side, r as i32 * side),
                (side as u32, side as u32),
            );
            // Caption drawn by hand, then margins that make the plotting area square (so the
            // unit circle is round): plot width = side - 2*4 - 24, height = side - cap - 2*4 - 18.
            let cap = text_box("Ag", &text(15.0)).1 + 6;
            centred_text(
                &cell,
                &panel.label,
                &text(15.0),
                (side / 2, cap / 2 + 1),
                false,
            )?;
            let (pw, ph) = (side - 8 - 24, side - cap - 8 - 18);
            let (extra_w, extra_h) = ((pw - ph).max(0), (ph - pw).max(0));
            let plot = cell.margin(
                cap + 4 + extra_h / 2,
                4 + extra_h - extra_h / 2,
                4 + extra_w / 2,
                4 + extra_w - extra_w / 2,
            );
            let axis = || FixedTicks {
                lo: -1.25,
                hi: 1.25,
                ticks: vec![-1.0, 0.0, 1.0],
                log: false,
            };
            let mut chart = ChartBuilder::on(&plot)
                .x_label_area_size(18)
                .y_label_area_size(24)
                .build_cartesian_2d(axis(), axis())?;
            chart
                .configure_mesh()
                .bold_line_style(GRID_GREY)
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| format!("{v:.0}"))
                .label_style(tick_style.clone())
                .draw()?;
            let (o, e) = (
                chart.backend_coord(&(0.0, 0.0)),
                chart.backend_coord(&(1.0, 0.0)),
            );
            chart.plotting_area().draw(&Circle::new(
                (0.0, 0.0),
                (e.0 - o.0).max(1),
                CIRCLE_GREY.stroke_width(1),
            ))?;
            let phases = unit_phases(panel.eigenvalues);
            chart.draw_series(
                phases
                    .into_iter()
                    .map(|p| Circle::new(p, 4, RGBColor(31, 119, 180).mix(0.55).filled())),
            )?;
        }
        let grid_bottom = rows as i32 * side;
        centred_text(
            &body,
            "Re(λ/|λ|)",
            &text(AXIS_SIZE),
            (x_off + grid_w / 2, grid_bottom + axis_h / 2),
            false,
        )?;
        centred_text(
            &body,
            "Im(λ/|λ|)",
            &text(AXIS_SIZE),
            (axis_h / 2, grid_bottom / 2),
            true,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_unit_and_zeros_dropped() {
        let p = unit_phases(&[(3.0, 4.0), (0.0, 0.0), (-2.0, 0.0), (1e-12, 0.0)]);
        assert_eq!(p.len(), 2);
        assert!((p[0].0 - 0.6).abs() < 1e-12 && (p[0].1 - 0.8).abs() < 1e-12);
        assert_eq!(p[1], (-1.0, 0.0));
    }
}
