//! Line figures: rule-decoding accuracy per layer (docs/spec/latent-codes.md, analysis 2) and
//! training curves (loss, ID/OOD accuracy against the step).

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::colour::categorical;
use crate::error::{Result, VizError};
use crate::figure::Figure;
use crate::util::{
    begin, draw_legend, finite, fmt_step, fmt_tick, legend_height, legend_width, min_max, padded,
    same_len, text, within, FixedTicks, Swatch, AXIS_SIZE, GRID_GREY, LEGEND_SIZE, MID_GREY,
    TICK_SIZE,
};

/// A named series of values, one per x category (e.g. accuracy per layer of one checkpoint).
#[derive(Debug, Clone)]
pub struct Series<'a> {
    /// Legend name, e.g. the checkpoint ("softmax", "hyla").
    pub name: String,
    /// One value per x category.
    pub values: &'a [f64],
}

/// A reference line: a constant (one value) or one value per x category, drawn dashed.
#[derive(Debug, Clone)]
pub struct Reference<'a> {
    /// Legend name, e.g. "majority class", "shuffled labels".
    pub name: String,
    /// One value (a horizontal line) or one value per x category.
    pub values: &'a [f64],
}

/// The x categories of a per-layer figure: "0" .. "L-1", and "all" if `with_all`.
pub fn layer_categories(n_layers: usize, with_all: bool) -> Vec<String> {
    let mut v: Vec<String> = (0..n_layers).map(|l| l.to_string()).collect();
    if with_all {
        v.push("all".to_string());
    }
    v
}

/// Decoding accuracy per layer (x: layer 0..L-1 plus "all"), one line with markers per series
/// (e.g. per checkpoint), and dashed reference lines (majority-class and shuffled-label
/// baselines). The y axis is accuracy on [0, 1].
///
/// # Shapes
/// Each series has one value per category; each reference 1 or one per category.
#[derive(Debug, Clone)]
pub struct LayerAccuracy<'a> {
    /// Figure title.
    pub title: String,
    /// x categories, e.g. from [`layer_categories`].
    pub categories: Vec<String>,
    /// x axis description.
    pub x_label: String,
    /// y axis description.
    pub y_label: String,
    /// Solid series with markers.
    pub series: Vec<Series<'a>>,
    /// Dashed reference lines.
    pub references: Vec<Reference<'a>>,
    /// The last category is not a layer (e.g. "all" layers concatenated): its markers are not
    /// joined to the per-layer lines.
    pub separate_last: bool,
}

impl<'a> LayerAccuracy<'a> {
    /// Per-layer accuracy over `n_layers` layers plus "all" (all layers concatenated, drawn as a
    /// separate marker), x axis "layer", y axis "accuracy".
    pub fn new(
        title: &str,
        n_layers: usize,
        series: Vec<Series<'a>>,
        references: Vec<Reference<'a>>,
    ) -> Self {
        Self {
            title: title.to_string(),
            categories: layer_categories(n_layers, true),
            x_label: "layer".to_string(),
            y_label: "accuracy".to_string(),
            series,
            references,
            separate_last: true,
        }
    }

    fn check(&self) -> Result<()> {
        let n = self.categories.len();
        if n == 0 {
            return Err(VizError::Empty {
                what: "layer accuracy categories".into(),
            });
        }
        if self.series.is_empty() {
            return Err(VizError::Empty {
                what: "layer accuracy series".into(),
            });
        }
        for s in &self.series {
            let what = format!("layer accuracy series {:?}", s.name);
            same_len(
                &format!("{what} (one value per category)"),
                n,
                s.values.len(),
            )?;
            within(&what, s.values, (0.0, 1.0))?;
        }
        for r in &self.references {
            let what = format!("reference {:?}", r.name);
            if r.values.len() != 1 {
                same_len(
                    &format!("{what} (1 value or one per category)"),
                    n,
                    r.values.len(),
                )?;
            }
            within(&what, r.values, (0.0, 1.0))?;
        }
        Ok(())
    }

    fn legend_entries(&self) -> Vec<(String, Swatch)> {
        let mut e: Vec<(String, Swatch)> = self
            .series
            .iter()
            .enumerate()
            .map(|(k, s)| (s.name.clone(), Swatch::Line(categorical(k))))
            .collect();
        e.extend(
            self.references
                .iter()
                .enumerate()
                .map(|(k, r)| (r.name.clone(), Swatch::Dashed(reference_colour(k)))),
        );
        e
    }
}

/// Colours of reference lines: greys and muted tones distinct from the series palette.
fn reference_colour(k: usize) -> RGBColor {
    [
        RGBColor(90, 90, 90),
        RGBColor(170, 60, 60),
        RGBColor(60, 120, 170),
        RGBColor(150, 150, 150),
    ][k % 4]
}

impl Figure for LayerAccuracy<'_> {
    fn size(&self) -> (u32, u32) {
        let labels: Vec<String> = self.legend_entries().into_iter().map(|e| e.0).collect();
        let lw = legend_width(None, &labels).max(0) as u32;
        (
            (self.categories.len() as u32 * 90).clamp(420, 1400) + lw + 120,
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
            if i >= 0.0 && (i as usize) < cats.len() {
                cats[i as usize].clone()
            } else {
                String::new()
            }
        };
        let x_coord = FixedTicks::categories(n);
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(12)
            .x_label_area_size(52)
            .y_label_area_size(64)
            .build_cartesian_2d(x_coord, FixedTicks::accuracy())?;
        chart
            .configure_mesh()
            .x_label_formatter(&xf)
            .y_label_formatter(&|v| fmt_tick(*v, 0.2))
            .light_line_style(WHITE)
            .bold_line_style(GRID_GREY)
            .label_style(text(TICK_SIZE))
            .axis_desc_style(text(AXIS_SIZE))
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .draw()?;
        let xs_full = |v: &[f64]| -> Vec<(f64, f64)> {
            if v.len() == 1 {
                vec![(-0.5, v[0]), (n as f64 - 0.5, v[0])]
            } else {
                v.iter().enumerate().map(|(i, y)| (i as f64, *y)).collect()
            }
        };
        for (k, r) in self.references.iter().enumerate() {
            let c = reference_colour(k);
            let pts = xs_full(r.values);
            if self.separate_last && r.values.len() == n && n > 1 {
                let (x, y) = pts[n - 1];
                chart.draw_series(DashedLineSeries::new(
                    pts[..n - 1].to_vec(),
                    8,
                    5,
                    c.stroke_width(2),
                ))?;
                chart.draw_series(DashedLineSeries::new(
                    vec![(x - 0.3, y), (x + 0.3, y)],
                    8,
                    5,
                    c.stroke_width(2),
                ))?;
            } else {
                chart.draw_series(DashedLineSeries::new(pts, 8, 5, c.stroke_width(2)))?;
            }
        }
        for (k, s) in self.series.iter().enumerate() {
            let c = categorical(k);
            let pts = xs_full(s.values);
            let joined = if self.separate_last {
                &pts[..pts.len() - 1]
            } else {
                &pts[..]
            };
            chart.draw_series(LineSeries::new(joined.to_vec(), c.stroke_width(2)))?;
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 5, c.filled())))?;
        }
        let yr = chart.plotting_area().get_pixel_range().1;
        let base = body.get_base_pixel().1;
        let lh = legend_height(None, entries.len());
        let y = ((yr.start + yr.end) / 2 - base - lh / 2).max(0);
        draw_legend(&legend, (6, y), None, &entries)?;
        Ok(())
    }
}

/// A training curve: values against the step.
#[derive(Debug, Clone)]
pub struct Curve<'a> {
    /// Legend name, e.g. "train loss", "ID accuracy", "OOD accuracy".
    pub name: String,
    /// Training steps, `[T]`.
    pub steps: &'a [f64],
    /// Values at those steps, `[T]`.
    pub values: &'a [f64],
}

/// Training curves from a metrics log: a loss panel (left) and an accuracy panel (right, y in
/// [0, 1]), each with several series and a legend. Either panel is left out when it has no
/// curves.
#[derive(Debug, Clone)]
pub struct TrainingCurves<'a> {
    /// Figure title.
    pub title: String,
    /// Loss curves (e.g. train loss, ID loss).
    pub loss: Vec<Curve<'a>>,
    /// Accuracy curves on [0, 1] (e.g. ID and OOD accuracy).
    pub accuracy: Vec<Curve<'a>>,
    /// Log-scale loss axis (all loss values must then be positive).
    pub log_loss: bool,
    /// x axis description, e.g. "step".
    pub x_label: String,
    /// y axis description of the accuracy panel: "accuracy", or the task's metric on [0, 1]
    /// ("R²" for the fuzzy-logic task, whose values below 0 the caller clips).
    pub metric_label: String,
}

impl<'a> TrainingCurves<'a> {
    /// Loss and accuracy curves against "step", linear loss axis.
    pub fn new(title: &str, loss: Vec<Curve<'a>>, accuracy: Vec<Curve<'a>>) -> Self {
        Self {
            title: title.to_string(),
            loss,
            accuracy,
            log_loss: false,
            x_label: "step".to_string(),
            metric_label: "accuracy".to_string(),
        }
    }

    fn check(&self) -> Result<()> {
        if self.loss.is_empty() && self.accuracy.is_empty() {
            return Err(VizError::Empty {
                what: "training curves (no loss and no accuracy curve)".into(),
            });
        }
        for (kind, curves) in [("loss", &self.loss), ("accuracy", &self.accuracy)] {
            for c in curves.iter() {
                let what = format!("{kind} curve {:?}", c.name);
                if c.steps.is_empty() {
                    return Err(VizError::Empty {
                        what: format!("{what} steps"),
                    });
                }
                same_len(
                    &format!("{what}: values (one per step)"),
                    c.steps.len(),
                    c.values.len(),
                )?;
                finite(&format!("{what} steps"), c.steps)?;
                if kind == "accuracy" {
                    within(&what, c.values, (0.0, 1.0))?;
                } else {
                    finite(&what, c.values)?;
                    if self.log_loss {
                        if let Some(i) = c.values.iter().position(|v| *v <= 0.0) {
                            return Err(VizError::OutOfRange {
                                what: format!("{what} (log scale)"),
                                at: format!("[{i}]"),
                                value: c.values[i],
                                lo: f64::MIN_POSITIVE,
                                hi: f64::INFINITY,
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn step_range(curves: &[Curve]) -> (f64, f64) {
    let (lo, hi) = min_max(curves.iter().flat_map(|c| c.steps.iter())).unwrap_or((0.0, 1.0));
    if hi > lo {
        (lo, hi)
    } else {
        padded((lo, hi), 0.05)
    }
}

/// Texts and placement of one curve panel.
struct PanelSpec<'s> {
    x_label: &'s str,
    y_label: &'s str,
    /// Index of the first series colour (so the two panels do not reuse colours).
    colour_offset: usize,
    /// Preferred legend corner (kept unless another corner covers fewer curve points).
    legend_pos: SeriesLabelPosition,
    /// The y axis is logarithmic (for placing the legend).
    log_y: bool,
}

/// The corner of a curve panel whose legend box covers the fewest points of the curves (each
/// segment sampled at 16 points), `preferred` on ties. The box is sized from the number of
/// entries: about 30 % of the width and 7 % of the height per entry.
///
/// # Shapes
/// `x` and `y` are the axis ranges in data units; `log_y` measures y on a log10 scale.
fn legend_corner(
    curves: &[Curve],
    x: (f64, f64),
    y: (f64, f64),
    log_y: bool,
    preferred: SeriesLabelPosition,
) -> SeriesLabelPosition {
    let fy = |v: f64| {
        if log_y {
            v.max(f64::MIN_POSITIVE).log10()
        } else {
            v
        }
    };
    let (ylo, yhi) = (fy(y.0), fy(y.1));
    let frac = |v: f64, lo: f64, hi: f64| if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
    let mut pts = Vec::new();
    for c in curves {
        let p: Vec<(f64, f64)> = c
            .steps
            .iter()
            .zip(c.values)
            .map(|(&s, &v)| (frac(s, x.0, x.1), frac(fy(v), ylo, yhi)))
            .collect();
        pts.extend(p.iter().copied());
        for w in p.windows(2) {
            for k in 1..16 {
                let t = k as f64 / 16.0;
                pts.push((
                    w[0].0 + t * (w[1].0 - w[0].0),
                    w[0].1 + t * (w[1].1 - w[0].1),
                ));
            }
        }
    }
    let (bw, bh) = (0.32, (0.07 * curves.len() as f64 + 0.06).min(0.6));
    let corners = [
        (SeriesLabelPosition::UpperRight, 1.0 - bw, 1.0 - bh),
        (SeriesLabelPosition::LowerRight, 1.0 - bw, 0.0),
        (SeriesLabelPosition::UpperLeft, 0.0, 1.0 - bh),
        (SeriesLabelPosition::LowerLeft, 0.0, 0.0),
    ];
    let count = |(_, cx, cy): &(SeriesLabelPosition, f64, f64)| {
        pts.iter()
            .filter(|(px, py)| *px >= *cx && *px <= cx + bw && *py >= *cy && *py <= cy + bh)
            .count()
    };
    let first = corners
        .iter()
        .find(|c| std::mem::discriminant(&c.0) == std::mem::discriminant(&preferred))
        .map_or(usize::MAX, count);
    let best = corners.iter().min_by_key(|c| count(c));
    match best {
        Some(b) if count(b) < first => b.0.clone(),
        _ => preferred,
    }
}

/// Draws one panel of curves with y coordinate `y` (linear or log).
fn curve_panel<DB, Y>(
    area: &DrawingArea<DB, Shift>,
    curves: &[Curve],
    spec: PanelSpec,
    y: Y,
    y_fmt: &dyn Fn(&f64) -> String,
) -> Result<()>
where
    DB: DrawingBackend,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let (x0, x1) = step_range(curves);
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(52)
        .y_label_area_size(64)
        .build_cartesian_2d(FixedTicks::nice(x0, x1, 6).0, y)?;
    chart
        .configure_mesh()
        .y_labels(6)
        .x_label_formatter(&|v| fmt_step(*v))
        .y_label_formatter(y_fmt)
        .light_line_style(WHITE)
        .bold_line_style(GRID_GREY)
        .label_style(text(TICK_SIZE))
        .axis_desc_style(text(AXIS_SIZE))
        .x_desc(spec.x_label)
        .y_desc(spec.y_label)
        .draw()?;
    for (k, c) in curves.iter().enumerate() {
        let colour = categorical(k + spec.colour_offset);
        let pts: Vec<(f64, f64)> = c
            .steps
            .iter()
            .copied()
            .zip(c.values.iter().copied())
            .collect();
        let marker = pts.len() == 1;
        chart
            .draw_series(
                LineSeries::new(pts.clone(), colour.stroke_width(2)).point_size(if marker {
                    4
                } else {
                    0
                }),
            )?
            .label(c.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(2))
            });
    }
    let (xr, yr) = (chart.x_range(), chart.y_range());
    let pos = legend_corner(
        curves,
        (xr.start, xr.end),
        (yr.start, yr.end),
        spec.log_y,
        spec.legend_pos,
    );
    chart
        .configure_series_labels()
        .position(pos)
        .margin(10)
        .legend_area_size(30)
        .label_font(text(LEGEND_SIZE))
        .background_style(WHITE.mix(0.9))
        .border_style(MID_GREY)
        .draw()?;
    Ok(())
}

impl Figure for TrainingCurves<'_> {
    fn size(&self) -> (u32, u32) {
        let panels = u32::from(!self.loss.is_empty()) + u32::from(!self.accuracy.is_empty());
        (panels.max(1) * 620, 480)
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        self.check()?;
        let body = begin(area, &self.title)?;
        let panels = usize::from(!self.loss.is_empty()) + usize::from(!self.accuracy.is_empty());
        let cells = body.split_evenly((1, panels));
        let mut cell = cells.iter();
        if !self.loss.is_empty() {
            let Some(a) = cell.next() else { return Ok(()) };
            let (lo, hi) =
                min_max(self.loss.iter().flat_map(|c| c.values.iter())).unwrap_or((0.0, 1.0));
            if self.log_loss {
                let (lo, hi) = if hi > lo {
                    (lo, hi)
                } else {
                    (lo / 2.0, hi * 2.0)
                };
                let (lo, hi) = (lo / 1.15, hi * 1.15);
                let f = |v: &f64| {
                    let d = (-(v.log10() + 1e-9).floor()).clamp(0.0, 6.0) as usize;
                    format!("{v:.d$}")
                };
                let spec = PanelSpec {
                    x_label: &self.x_label,
                    y_label: "loss (log scale)",
                    colour_offset: 0,
                    legend_pos: SeriesLabelPosition::UpperRight,
                    log_y: true,
                };
                curve_panel(a, &self.loss, spec, FixedTicks::log(lo, hi), &f)?;
            } else {
                let lo = lo.min(0.0);
                let hi = if hi > lo {
                    hi + 0.05 * (hi - lo)
                } else {
                    lo + 1.0
                };
                let (axis, step) = FixedTicks::nice(lo, hi, 6);
                let f = move |v: &f64| fmt_tick(*v, step);
                let spec = PanelSpec {
                    x_label: &self.x_label,
                    y_label: "loss",
                    colour_offset: 0,
                    legend_pos: SeriesLabelPosition::UpperRight,
                    log_y: false,
                };
                curve_panel(a, &self.loss, spec, axis, &f)?;
            }
        }
        if !self.accuracy.is_empty() {
            let Some(a) = cell.next() else { return Ok(()) };
            let f = |v: &f64| fmt_tick(*v, 0.2);
            let spec = PanelSpec {
                x_label: &self.x_label,
                y_label: &self.metric_label,
                colour_offset: self.loss.len(),
                legend_pos: SeriesLabelPosition::LowerRight,
                log_y: false,
            };
            curve_panel(a, &self.accuracy, spec, FixedTicks::accuracy(), &f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is(p: &SeriesLabelPosition, q: SeriesLabelPosition) -> bool {
        std::mem::discriminant(p) == std::mem::discriminant(&q)
    }

    /// Where the legend of one curve over steps 0, 50, 100 goes, preferring the upper right.
    fn corner(values: &[f64; 3], y_range: (f64, f64), log_y: bool) -> SeriesLabelPosition {
        let steps = [0.0, 50.0, 100.0];
        let c = vec![Curve {
            name: "a".into(),
            steps: &steps,
            values,
        }];
        legend_corner(
            &c,
            (0.0, 100.0),
            y_range,
            log_y,
            SeriesLabelPosition::UpperRight,
        )
    }

    #[test]
    fn legend_goes_to_the_emptiest_corner() {
        // A flat curve along the top: the upper corners are covered, the lower right is free.
        let p = corner(&[0.98, 0.99, 1.0], (0.0, 1.0), false);
        assert!(is(&p, SeriesLabelPosition::LowerRight), "{p:?}");
        // A curve along the bottom keeps the preferred upper right.
        let p = corner(&[0.0, 0.01, 0.02], (0.0, 1.0), false);
        assert!(is(&p, SeriesLabelPosition::UpperRight), "{p:?}");
        // Rising from the lower left to the upper right: a left/right corner off the diagonal.
        let p = corner(&[0.0, 0.5, 1.0], (0.0, 1.0), false);
        assert!(is(&p, SeriesLabelPosition::LowerRight), "{p:?}");
        // On a log axis 1 .. 100, a curve at 10 sits in the middle, not at the bottom.
        let p = corner(&[10.0, 10.0, 10.0], (1.0, 100.0), true);
        assert!(is(&p, SeriesLabelPosition::UpperRight), "{p:?}");
    }
}
