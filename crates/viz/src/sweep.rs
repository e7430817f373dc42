//! A metric against one swept setting, mean ± standard error over seeds, one line per series
//! (e.g. per mixer): the shape of Schug et al.'s Fig. 4 (OOD accuracy against data, width,
//! depth) and Fig. A5 (against the held-out fraction).

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::colour::categorical;
use crate::error::{Result, VizError};
use crate::figure::Figure;
use crate::util::{
    begin, draw_legend, fmt_tick, legend_height, legend_width, same_len, text, FixedTicks, Swatch,
    AXIS_SIZE, GRID_GREY, TICK_SIZE,
};

/// One line of a [`SweepCurves`]: a mean and a standard error per x category (NaN mean: no point;
/// NaN standard error: no bar, e.g. a single seed).
#[derive(Debug, Clone)]
pub struct SweepSeries {
    /// Legend name (e.g. the mixer).
    pub name: String,
    /// Mean per category.
    pub mean: Vec<f64>,
    /// Standard error per category.
    pub se: Vec<f64>,
}

/// Means with error bars (± one standard error) against the categories of a swept setting, one
/// coloured line per series; the y axis spans the values and bars (and 0 and 1 for accuracies when
/// `unit_range`).
///
/// # Shapes
/// Every series has one mean and one standard error per category.
#[derive(Debug, Clone)]
pub struct SweepCurves {
    /// Figure title.
    pub title: String,
    /// x categories (the setting's values, in order).
    pub categories: Vec<String>,
    /// x axis description (the setting).
    pub x_label: String,
    /// y axis description (the metric).
    pub y_label: String,
    /// The lines.
    pub series: Vec<SweepSeries>,
    /// Whether the y axis shows all of [0, 1] (accuracy, R²).
    pub unit_range: bool,
}

impl SweepCurves {
    fn check(&self) -> Result<()> {
        let n = self.categories.len();
        if n == 0 || self.series.is_empty() {
            return Err(VizError::Empty {
                what: "sweep curves (no category or no series)".into(),
            });
        }
        for s in &self.series {
            same_len(&format!("sweep series {:?} means", s.name), n, s.mean.len())?;
            same_len(&format!("sweep series {:?} errors", s.name), n, s.se.len())?;
        }
        if !self
            .series
            .iter()
            .any(|s| s.mean.iter().any(|v| v.is_finite()))
        {
            return Err(VizError::Empty {
                what: "sweep curves (no finite mean)".into(),
            });
        }
        Ok(())
    }

    /// The y range: every finite mean ± error, widened to [0, 1] with `unit_range`.
    fn y_range(&self) -> (f64, f64) {
        let (mut lo, mut hi) = if self.unit_range {
            (0.0f64, 1.0f64)
        } else {
            (f64::INFINITY, f64::NEG_INFINITY)
        };
        for s in &self.series {
            for (m, e) in s.mean.iter().zip(&s.se) {
                if m.is_finite() {
                    let e = if e.is_finite() { *e } else { 0.0 };
                    lo = lo.min(m - e);
                    hi = hi.max(m + e);
                }
            }
        }
        if hi <= lo {
            hi = lo + 1.0;
        }
        let pad = 0.04 * (hi - lo);
        (lo - pad, hi + pad)
    }

    fn legend_entries(&self) -> Vec<(String, Swatch)> {
        self.series
            .iter()
            .enumerate()
            .map(|(k, s)| (s.name.clone(), Swatch::Line(categorical(k))))
            .collect()
    }
}

impl Figure for SweepCurves {
    fn size(&self) -> (u32, u32) {
        let labels: Vec<String> = self.legend_entries().into_iter().map(|e| e.0).collect();
        let lw = legend_width(None, &labels).max(0) as u32;
        (
            (self.categories.len() as u32 * 110).clamp(420, 1400) + lw + 120,
            520,
        )
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        self.check()?;
        let body = begin(area, &self.title)?;
        let entries = self.legend_entries();
        let labels: Vec<String> = entries.iter().map(|e| e.0.clone()).collect();
        let lw = legend_width(None, &labels) + 16;
        let (w, _) = body.dim_in_pixel();
        let (plot_area, legend) = body.split_horizontally((w as i32 - lw).max(50));
        let n = self.categories.len();
        let cats = self.categories.clone();
        let xf = move |v: &f64| {
            let i = v.round();
            if (v - i).abs() < 1e-9 && i >= 0.0 && (i as usize) < cats.len() {
                cats[i as usize].clone()
            } else {
                String::new()
            }
        };
        let (lo, hi) = self.y_range();
        let (y_axis, step) = FixedTicks::nice(lo, hi, 6);
        let yf = move |v: &f64| fmt_tick(*v, step);
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(12)
            .x_label_area_size(52)
            .y_label_area_size(64)
            .build_cartesian_2d(FixedTicks::categories(n), y_axis)?;
        chart
            .configure_mesh()
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .light_line_style(WHITE)
            .bold_line_style(GRID_GREY)
            .label_style(text(TICK_SIZE))
            .axis_desc_style(text(AXIS_SIZE))
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .draw()?;
        let k_all = self.series.len() as f64;
        for (k, s) in self.series.iter().enumerate() {
            let c = categorical(k);
            // Series side by side around each category so that their bars do not hide each other.
            let dx = if k_all > 1.0 {
                (k as f64 - (k_all - 1.0) / 2.0) * (0.25 / k_all)
            } else {
                0.0
            };
            let pts: Vec<(f64, f64)> = s
                .mean
                .iter()
                .enumerate()
                .filter(|(_, m)| m.is_finite())
                .map(|(i, m)| (i as f64 + dx, *m))
                .collect();
            chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 5, c.filled())))?;
            chart.draw_series(
                s.mean
                    .iter()
                    .zip(&s.se)
                    .enumerate()
                    .filter(|(_, (m, e))| m.is_finite() && e.is_finite() && **e > 0.0)
                    .map(|(i, (m, e))| {
                        ErrorBar::new_vertical(
                            i as f64 + dx,
                            m - e,
                            *m,
                            m + e,
                            c.stroke_width(2),
                            10,
                        )
                    }),
            )?;
        }
        let yr = chart.plotting_area().get_pixel_range().1;
        let base = body.get_base_pixel().1;
        let lh = legend_height(None, entries.len());
        let y = ((yr.start + yr.end) / 2 - base - lh / 2).max(0);
        draw_legend(&legend, (6, y), None, &entries)?;
        Ok(())
    }
}
