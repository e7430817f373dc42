//! Grouped bar chart: ID and OOD accuracy per checkpoint (docs/spec/latent-codes.md, analysis 5).

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;

use crate::colour::categorical;
use crate::error::{Result, VizError};
use crate::figure::Figure;
use crate::heatmap::ValueFormat;
use crate::util::{
    begin, check_range, draw_legend, fmt_tick, legend_height, legend_width, max_width, min_max,
    same_len, text, text_box, within, FixedTicks, Swatch, AXIS_SIZE, GRID_GREY, TICK_SIZE,
};

/// One series of bars: one value per group (e.g. OOD accuracy of every checkpoint).
#[derive(Debug, Clone)]
pub struct BarSeries<'a> {
    /// Legend name, e.g. "ID", "OOD".
    pub name: String,
    /// One value per group.
    pub values: &'a [f64],
}

/// Grouped bars: groups (e.g. checkpoints) on the x axis, one bar per series in each group,
/// the value printed on every bar.
///
/// # Shapes
/// `groups`: G names; every series has G values.
#[derive(Debug, Clone)]
pub struct GroupedBars<'a> {
    /// Figure title.
    pub title: String,
    /// Group names on the x axis.
    pub groups: Vec<String>,
    /// Bar series, drawn side by side within each group.
    pub series: Vec<BarSeries<'a>>,
    /// x axis description, e.g. "checkpoint".
    pub x_label: String,
    /// y axis description, e.g. "accuracy".
    pub y_label: String,
    /// y range; `None` uses [min(0, data), 1.1 max]. Values outside a given range are an error.
    pub y_range: Option<(f64, f64)>,
    /// Format of the values printed on the bars.
    pub value_format: ValueFormat,
}

impl<'a> GroupedBars<'a> {
    /// Accuracy bars: y axis "accuracy" on [0, 1], values with two decimals.
    pub fn accuracy(title: &str, groups: &[String], series: Vec<BarSeries<'a>>) -> Self {
        Self {
            title: title.to_string(),
            groups: groups.to_vec(),
            series,
            x_label: "checkpoint".to_string(),
            y_label: "accuracy".to_string(),
            y_range: Some((0.0, 1.0)),
            value_format: ValueFormat::Decimals(2),
        }
    }

    fn check(&self) -> Result<(f64, f64)> {
        if self.groups.is_empty() {
            return Err(VizError::Empty {
                what: "bar chart groups".into(),
            });
        }
        if self.series.is_empty() {
            return Err(VizError::Empty {
                what: "bar chart series".into(),
            });
        }
        for s in &self.series {
            let what = format!("bar series {:?}", s.name);
            same_len(
                &format!("{what} (one value per group)"),
                self.groups.len(),
                s.values.len(),
            )?;
            crate::util::finite(&what, s.values)?;
            if let Some(r) = self.y_range {
                check_range("y_range", r)?;
                within(&what, s.values, r)?;
            }
        }
        Ok(self.y_range.unwrap_or_else(|| {
            let (lo, hi) =
                min_max(self.series.iter().flat_map(|s| s.values.iter())).unwrap_or((0.0, 1.0));
            let (lo, hi) = (lo.min(0.0), hi.max(0.0));
            if hi > lo {
                (lo * 1.1, hi * 1.1)
            } else {
                (0.0, 1.0)
            }
        }))
    }

    fn legend_entries(&self) -> Vec<(String, Swatch)> {
        self.series
            .iter()
            .enumerate()
            .map(|(k, s)| (s.name.clone(), Swatch::Block(categorical(k))))
            .collect()
    }
}

impl Figure for GroupedBars<'_> {
    fn size(&self) -> (u32, u32) {
        let labels: Vec<String> = self.series.iter().map(|s| s.name.clone()).collect();
        let per_group = 60 * self.series.len().max(1) as u32 + 40;
        let w = (per_group * self.groups.len() as u32).clamp(420, 1800);
        // Rotated group names need their length in height.
        let widest = max_width(&self.groups, &text(TICK_SIZE)).max(0) as u32;
        let extra = if widest + 8 > w / self.groups.len().max(1) as u32 {
            widest
        } else {
            0
        };
        (
            w + legend_width(None, &labels).max(0) as u32 + 120,
            520 + extra,
        )
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let (lo, hi) = self.check()?;
        let body = begin(area, &self.title)?;
        let entries = self.legend_entries();
        let labels: Vec<String> = entries.iter().map(|e| e.0.clone()).collect();
        let lw = legend_width(None, &labels) + 16;
        let (w, _) = body.dim_in_pixel();
        let (plot_area, legend) = body.split_horizontally((w as i32 - lw).max(50));
        let g = self.groups.len();
        // Group names wider than a group are drawn rotated (reading upwards) by hand.
        let tick = text(TICK_SIZE);
        let widest = max_width(&self.groups, &tick);
        let group_px = (plot_area.dim_in_pixel().0 as i32 - 12 * 2 - 64) / g as i32;
        let rotated = widest + 8 > group_px;
        let names = self.groups.clone();
        let xf = move |v: &f64| {
            let i = v.round();
            if !rotated && i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].clone()
            } else {
                String::new()
            }
        };
        let y_top = hi + 0.06 * (hi - lo); // room for the value labels above the tallest bar
        let (yaxis, ystep) = FixedTicks::nice(lo, y_top, 7);
        let yaxis = FixedTicks {
            ticks: yaxis
                .ticks
                .into_iter()
                .filter(|t| *t <= hi + 1e-9)
                .collect(),
            ..yaxis
        };
        let yf = move |v: &f64| fmt_tick(*v, ystep);
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(12)
            .x_label_area_size(if rotated { widest + 44 } else { 52 })
            .y_label_area_size(64)
            .build_cartesian_2d(FixedTicks::categories(g), yaxis)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .light_line_style(WHITE)
            .bold_line_style(GRID_GREY)
            .label_style(text(TICK_SIZE))
            .axis_desc_style(text(AXIS_SIZE))
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .draw()?;
        let s = self.series.len() as f64;
        let bar_w = 0.8 / s;
        let px_per_unit = {
            let r = chart.plotting_area().get_pixel_range().0;
            (r.end - r.start) as f64 / g as f64
        };
        let label_size = [13.0, 12.0, 11.0, 10.0].into_iter().find(|&sz| {
            self.series.iter().flat_map(|s| s.values.iter()).all(|v| {
                self.value_format
                    .format(*v)
                    .is_none_or(|t| text_box(&t, &text(sz)).0 as f64 <= bar_w * px_per_unit + 6.0)
            })
        });
        for (k, series) in self.series.iter().enumerate() {
            let colour = categorical(k);
            let bars = series.values.iter().enumerate().map(|(i, v)| {
                let x0 = i as f64 - 0.4 + k as f64 * bar_w;
                Rectangle::new(
                    [(x0 + 0.01, 0.0f64.max(lo)), (x0 + bar_w - 0.01, *v)],
                    colour.filled(),
                )
            });
            chart.draw_series(bars)?;
            if let Some(sz) = label_size {
                for (i, v) in series.values.iter().enumerate() {
                    if let Some(t) = self.value_format.format(*v) {
                        let xc = i as f64 - 0.4 + (k as f64 + 0.5) * bar_w;
                        let (px, py) = chart.backend_coord(&(xc, *v));
                        let base = plot_area.get_base_pixel();
                        let (anchor, dy) = if *v >= 0.0 {
                            (VPos::Bottom, -3)
                        } else {
                            (VPos::Top, 3)
                        };
                        plot_area.draw_text(
                            &t,
                            &text(sz).pos(Pos::new(HPos::Center, anchor)),
                            (px - base.0, py - base.1 + dy),
                        )?;
                    }
                }
            }
        }
        if rotated {
            let base = plot_area.get_base_pixel();
            let st = tick
                .pos(Pos::new(HPos::Right, VPos::Center))
                .transform(FontTransform::Rotate270);
            for (i, name) in self.groups.iter().enumerate() {
                let (px, py) = chart.backend_coord(&(i as f64, lo));
                plot_area.draw_text(name, &st, (px - base.0, py - base.1 + 8))?;
            }
        }
        let yr = chart.plotting_area().get_pixel_range().1;
        let base = body.get_base_pixel().1;
        let lh = legend_height(None, entries.len());
        let y = ((yr.start + yr.end) / 2 - base - lh / 2).max(0);
        draw_legend(&legend, (6, y), None, &entries)?;
        Ok(())
    }
}
