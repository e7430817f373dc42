//! PCA scatter of latent codes per layer (docs/spec/latent-codes.md, analysis 1; paper Figure 5).

use ndarray::ArrayView2;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::colour::{categorical, ColorMap};
use crate::error::{Result, VizError};
use crate::figure::Figure;
use crate::util::{
    begin, check_range, colour_bar_width, draw_colour_bar, draw_legend, finite, finite2, fmt_tick,
    legend_height, legend_width, min_max, padded, same_len, text, FixedTicks, Swatch, AXIS_SIZE,
    GRID_GREY, PANEL_SIZE, TICK_SIZE,
};

/// One panel of a [`PcaScatter`]: the 2-D projection of the codes of one layer.
#[derive(Debug, Clone)]
pub struct ScatterPanel<'a> {
    /// Panel caption, e.g. "layer 0".
    pub title: String,
    /// Projected codes, one row per problem: [N, 2] (PC1, PC2 scores).
    pub points: ArrayView2<'a, f64>,
    /// Fraction of the total variance (over ALL components) explained by PC1 and PC2, each in
    /// [0, 1]; shown in the axis labels as "PC1 (xx.x %)".
    pub explained: [f64; 2],
    /// Axis titles that replace the PCA ones (e.g. "t-SNE 1", "t-SNE 2" for an embedding that
    /// is not a PCA); `explained` is then neither shown nor checked.
    pub axes: Option<[String; 2]>,
}

/// How the points of a [`PcaScatter`] are coloured.
#[derive(Debug, Clone)]
pub enum PointColors<'a> {
    /// By a categorical label (e.g. the rule), with a legend of class names.
    Categories {
        /// Class index of each point, `[N]`, each `< names.len()`.
        labels: &'a [usize],
        /// Class names in index order, e.g. "constant", "progression +1", ...
        names: Vec<String>,
        /// Legend heading, e.g. "rule".
        legend_title: String,
    },
    /// By a numeric value (e.g. the target value 0..7) on a sequential colour map, with a colour bar.
    Values {
        /// Value of each point, `[N]`.
        values: &'a [f64],
        /// Colour-bar label, e.g. "target value".
        label: String,
        /// Colour map (viridis by default).
        color_map: ColorMap,
        /// Colour range; `None` uses the data range.
        range: Option<(f64, f64)>,
    },
}

/// PCA scatter of latent codes: a row of panels (one per layer) sharing one colouring.
///
/// # Shapes
/// Every panel's `points` is [N, 2] with the same N; the colouring holds N labels or values.
#[derive(Debug, Clone)]
pub struct PcaScatter<'a> {
    /// Figure title.
    pub title: String,
    /// One panel per layer, left to right.
    pub panels: Vec<ScatterPanel<'a>>,
    /// Colouring of the points.
    pub colors: PointColors<'a>,
    /// At most this many points per panel are drawn (every k-th point, which keeps the class
    /// proportions); `None` draws all. Keeps SVGs of 51,200 problems small.
    pub max_points: Option<usize>,
    /// Point radius in pixels.
    pub point_size: u32,
}

impl<'a> PcaScatter<'a> {
    /// Points coloured by class (e.g. rule), legend titled `legend_title`; at most 4000 points
    /// per panel drawn.
    pub fn by_category(
        title: &str,
        panels: Vec<ScatterPanel<'a>>,
        labels: &'a [usize],
        names: &[String],
        legend_title: &str,
    ) -> Self {
        Self {
            title: title.to_string(),
            panels,
            colors: PointColors::Categories {
                labels,
                names: names.to_vec(),
                legend_title: legend_title.to_string(),
            },
            max_points: Some(4000),
            point_size: 3,
        }
    }

    /// Points coloured by value (e.g. target value) on viridis with a colour bar labelled `label`.
    pub fn by_value(
        title: &str,
        panels: Vec<ScatterPanel<'a>>,
        values: &'a [f64],
        label: &str,
    ) -> Self {
        Self {
            title: title.to_string(),
            panels,
            colors: PointColors::Values {
                values,
                label: label.to_string(),
                color_map: ColorMap::Viridis,
                range: None,
            },
            max_points: Some(4000),
            point_size: 3,
        }
    }

    /// Checks shapes and values; returns N.
    fn check(&self) -> Result<usize> {
        if self.panels.is_empty() {
            return Err(VizError::Empty {
                what: "PCA scatter panels".into(),
            });
        }
        let n = self.panels[0].points.nrows();
        for (p, panel) in self.panels.iter().enumerate() {
            let what = format!("PCA scatter panel {p} ({}) points", panel.title);
            if panel.points.nrows() == 0 {
                return Err(VizError::Empty { what });
            }
            same_len(
                &format!("{what}: columns (PC1, PC2)"),
                2,
                panel.points.ncols(),
            )?;
            same_len(
                &format!("{what}: rows (must match panel 0)"),
                n,
                panel.points.nrows(),
            )?;
            finite2(&what, panel.points)?;
            if panel.axes.is_none() {
                crate::util::within(
                    &format!("PCA scatter panel {p} explained variance"),
                    &panel.explained,
                    (0.0, 1.0 + 1e-9),
                )?;
            }
        }
        match &self.colors {
            PointColors::Categories { labels, names, .. } => {
                same_len(
                    "PCA scatter category labels (one per point)",
                    n,
                    labels.len(),
                )?;
                if names.is_empty() {
                    return Err(VizError::Empty {
                        what: "PCA scatter category names".into(),
                    });
                }
                if let Some(i) = labels.iter().position(|l| *l >= names.len()) {
                    return Err(VizError::OutOfRange {
                        what: "PCA scatter category labels".into(),
                        at: format!("[{i}]"),
                        value: labels[i] as f64,
                        lo: 0.0,
                        hi: (names.len() - 1) as f64,
                    });
                }
            }
            PointColors::Values { values, range, .. } => {
                same_len("PCA scatter colour values (one per point)", n, values.len())?;
                finite("PCA scatter colour values", values)?;
                if let Some(r) = range {
                    check_range("range", *r)?;
                }
            }
        }
        if self.max_points == Some(0) {
            return Err(VizError::InvalidOption {
                name: "max_points".into(),
                reason: "must be at least 1".into(),
            });
        }
        Ok(n)
    }

    fn value_range(values: &[f64], range: Option<(f64, f64)>) -> (f64, f64) {
        range.unwrap_or_else(|| {
            let (lo, hi) = min_max(values).unwrap_or((0.0, 1.0));
            if hi > lo {
                (lo, hi)
            } else {
                (lo - 0.5, hi + 0.5)
            }
        })
    }

    fn side_width(&self) -> i32 {
        match &self.colors {
            PointColors::Categories {
                names,
                legend_title,
                ..
            } => legend_width(Some(legend_title), names) + 16,
            PointColors::Values {
                values,
                label,
                range,
                ..
            } => colour_bar_width(Self::value_range(values, *range), label) + 16,
        }
    }
}

impl Figure for PcaScatter<'_> {
    fn size(&self) -> (u32, u32) {
        let n = self.panels.len().max(1) as u32;
        (n * 400 + self.side_width().max(0) as u32 + 20, 500)
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let n = self.check()?;
        let stride = self.max_points.map_or(1, |m| n.div_ceil(m).max(1));
        let body = begin(area, &self.title)?;
        let (w, h) = body.dim_in_pixel();
        let side = self.side_width();
        let (plots, legend) = body.split_horizontally((w as i32 - side).max(50));
        let colour_of: Box<dyn Fn(usize) -> RGBColor> = match &self.colors {
            PointColors::Categories { labels, .. } => Box::new(move |i| categorical(labels[i])),
            PointColors::Values {
                values,
                color_map,
                range,
                ..
            } => {
                let r = Self::value_range(values, *range);
                let cm = *color_map;
                Box::new(move |i| cm.map(values[i], r))
            }
        };
        let mut plot_top_bottom = (0, h as i32);
        for (panel, cell) in self
            .panels
            .iter()
            .zip(plots.split_evenly((1, self.panels.len())))
        {
            let xs = panel.points.column(0);
            let ys = panel.points.column(1);
            let xr = padded(min_max(xs.iter()).unwrap_or((0.0, 1.0)), 0.05);
            let yr = padded(min_max(ys.iter()).unwrap_or((0.0, 1.0)), 0.05);
            let (xaxis, xstep) = FixedTicks::nice(xr.0, xr.1, 6);
            let (yaxis, ystep) = FixedTicks::nice(yr.0, yr.1, 6);
            let mut chart = ChartBuilder::on(&cell)
                .caption(&panel.title, text(PANEL_SIZE))
                .margin(10)
                .x_label_area_size(48)
                .y_label_area_size(64)
                .build_cartesian_2d(xaxis, yaxis)?;
            let xf = move |v: &f64| fmt_tick(*v, xstep);
            let yf = move |v: &f64| fmt_tick(*v, ystep);
            chart
                .configure_mesh()
                .x_label_formatter(&xf)
                .y_label_formatter(&yf)
                .light_line_style(WHITE)
                .bold_line_style(GRID_GREY)
                .label_style(text(TICK_SIZE))
                .axis_desc_style(text(AXIS_SIZE))
                .x_desc(match &panel.axes {
                    Some([x, _]) => x.clone(),
                    None => format!("PC1 ({:.1} %)", 100.0 * panel.explained[0]),
                })
                .y_desc(match &panel.axes {
                    Some([_, y]) => y.clone(),
                    None => format!("PC2 ({:.1} %)", 100.0 * panel.explained[1]),
                })
                .draw()?;
            let r = self.point_size as i32;
            chart.draw_series(
                (0..n)
                    .step_by(stride)
                    .map(|i| Circle::new((xs[i], ys[i]), r, colour_of(i).mix(0.75).filled())),
            )?;
            let yrange = chart.plotting_area().get_pixel_range().1;
            let top = yrange.start - body.get_base_pixel().1;
            plot_top_bottom = (top, yrange.end - body.get_base_pixel().1);
        }
        match &self.colors {
            PointColors::Categories {
                names,
                legend_title,
                ..
            } => {
                let entries: Vec<(String, Swatch)> = names
                    .iter()
                    .enumerate()
                    .map(|(k, name)| (name.clone(), Swatch::Dot(categorical(k))))
                    .collect();
                let lh = legend_height(Some(legend_title), entries.len());
                let y = ((plot_top_bottom.0 + plot_top_bottom.1) / 2 - lh / 2).max(0);
                draw_legend(&legend, (6, y), Some(legend_title), &entries)?;
            }
            PointColors::Values {
                values,
                label,
                color_map,
                range,
            } => {
                let r = Self::value_range(values, *range);
                draw_colour_bar(
                    &legend,
                    (0, plot_top_bottom.0, plot_top_bottom.1),
                    *color_map,
                    r,
                    label,
                )?;
            }
        }
        Ok(())
    }
}
