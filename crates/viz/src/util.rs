//! Internal helpers: input validation, text styles, tick placement, legends and colour bars.

use ndarray::{ArrayView2, ArrayView3};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;

use crate::colour::ColorMap;
use crate::error::{Result, VizError};
use crate::font::{ensure_fonts, FONT_FAMILY};

/// Font size of figure titles, in pixels.
pub(crate) const TITLE_SIZE: f64 = 26.0;
/// Font size of panel captions.
pub(crate) const PANEL_SIZE: f64 = 19.0;
/// Font size of axis descriptions.
pub(crate) const AXIS_SIZE: f64 = 17.0;
/// Font size of tick labels.
pub(crate) const TICK_SIZE: f64 = 14.0;
/// Font size of legend entries.
pub(crate) const LEGEND_SIZE: f64 = 15.0;

/// Light grey for grids and reference marks.
pub(crate) const GRID_GREY: RGBColor = RGBColor(225, 225, 225);
/// Mid grey for reference lines and frames.
pub(crate) const MID_GREY: RGBColor = RGBColor(110, 110, 110);

// ---------------------------------------------------------------- validation

pub(crate) fn same_len(what: &str, expected: usize, got: usize) -> Result<()> {
    if expected != got {
        return Err(VizError::Length {
            what: what.to_string(),
            expected,
            got,
        });
    }
    Ok(())
}

pub(crate) fn finite(what: &str, values: &[f64]) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(VizError::NonFinite {
            what: what.to_string(),
            at: format!("[{i}]"),
            value: values[i],
        }),
        None => Ok(()),
    }
}

pub(crate) fn finite2(what: &str, values: ArrayView2<f64>) -> Result<()> {
    match values.indexed_iter().find(|(_, v)| !v.is_finite()) {
        Some(((i, j), v)) => Err(VizError::NonFinite {
            what: what.to_string(),
            at: format!("[{i}, {j}]"),
            value: *v,
        }),
        None => Ok(()),
    }
}

pub(crate) fn finite3(what: &str, values: ArrayView3<f64>) -> Result<()> {
    match values.indexed_iter().find(|(_, v)| !v.is_finite()) {
        Some(((i, j, k), v)) => Err(VizError::NonFinite {
            what: what.to_string(),
            at: format!("[{i}, {j}, {k}]"),
            value: *v,
        }),
        None => Ok(()),
    }
}

pub(crate) fn within(what: &str, values: &[f64], (lo, hi): (f64, f64)) -> Result<()> {
    finite(what, values)?;
    match values.iter().position(|v| *v < lo || *v > hi) {
        Some(i) => Err(VizError::OutOfRange {
            what: what.to_string(),
            at: format!("[{i}]"),
            value: values[i],
            lo,
            hi,
        }),
        None => Ok(()),
    }
}

/// Checks a user-given colour/axis range: finite and increasing.
pub(crate) fn check_range(name: &str, (lo, hi): (f64, f64)) -> Result<()> {
    if !(lo.is_finite() && hi.is_finite() && hi > lo) {
        return Err(VizError::InvalidOption {
            name: name.to_string(),
            reason: format!("range ({lo}, {hi}) must be finite with low < high"),
        });
    }
    Ok(())
}

/// Checks a canvas size: both sides in 16..=16384 pixels.
pub(crate) fn check_size((w, h): (u32, u32)) -> Result<()> {
    if !(16..=16384).contains(&w) || !(16..=16384).contains(&h) {
        return Err(VizError::InvalidOption {
            name: "size".to_string(),
            reason: format!("{w}x{h} pixels; each side must be within 16..=16384"),
        });
    }
    Ok(())
}

/// Minimum and maximum of finite values (None when empty).
pub(crate) fn min_max<'a>(values: impl IntoIterator<Item = &'a f64>) -> Option<(f64, f64)> {
    values.into_iter().fold(None, |acc, &v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

/// Pads a data range by `frac` of its span on each side; a zero span becomes +-0.5 (or +-|v|/2).
pub(crate) fn padded((lo, hi): (f64, f64), frac: f64) -> (f64, f64) {
    let span = hi - lo;
    if span > 0.0 {
        (lo - frac * span, hi + frac * span)
    } else {
        let d = if lo != 0.0 { lo.abs() * 0.5 } else { 0.5 };
        (lo - d, hi + d)
    }
}

// ---------------------------------------------------------------- text

/// Text style of the embedded sans-serif font at `size` pixels, black.
///
/// plotters resolves the font when the style is created, so the embedded font is registered
/// first: figure sizes measured before the first drawing then agree with the drawing.
pub(crate) fn text(size: f64) -> TextStyle<'static> {
    let _ = ensure_fonts();
    TextStyle::from((FONT_FAMILY, size).into_font()).color(&BLACK)
}

/// Bold text style.
pub(crate) fn bold(size: f64) -> TextStyle<'static> {
    let _ = ensure_fonts();
    // `FontDesc::style` keeps the regular face; create the bold face directly.
    TextStyle::from(FontDesc::new(
        FontFamily::Name(FONT_FAMILY),
        size,
        FontStyle::Bold,
    ))
    .color(&BLACK)
}

/// Width and height of `s` in pixels when drawn in `style` (unrotated).
pub(crate) fn text_box(s: &str, style: &TextStyle) -> (i32, i32) {
    match style.font.box_size(s) {
        Ok((w, h)) => (w as i32, h as i32),
        // The embedded font measures every string; fall back to a generous estimate otherwise.
        Err(_) => (
            (s.chars().count() as f64 * style.font.get_size() * 0.6) as i32,
            style.font.get_size() as i32,
        ),
    }
}

/// Widest text of `labels` in `style`.
pub(crate) fn max_width<S: AsRef<str>>(labels: &[S], style: &TextStyle) -> i32 {
    labels
        .iter()
        .map(|l| text_box(l.as_ref(), style).0)
        .max()
        .unwrap_or(0)
}

/// Fills the area white, draws the bold title on top and returns the area below it.
pub(crate) fn begin<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
) -> Result<DrawingArea<DB, Shift>> {
    ensure_fonts()?;
    area.fill(&WHITE)?;
    let body = if title.is_empty() {
        area.clone()
    } else {
        // Long titles (e.g. a checkpoint name in front) shrink to the figure width instead of
        // being clipped at both edges.
        let width = area.dim_in_pixel().0 as i32 - 16;
        let mut size = TITLE_SIZE;
        while size > 12.0 && text_box(title, &bold(size)).0 > width {
            size -= 1.0;
        }
        area.margin(6, 0, 0, 0).titled(title, bold(size))?
    };
    Ok(body.margin(6, 6, 8, 8))
}

/// Draws `s` centred at `(x, y)`, optionally rotated to read bottom-to-top.
pub(crate) fn centred_text<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    s: &str,
    style: &TextStyle,
    (x, y): (i32, i32),
    vertical: bool,
) -> Result<()> {
    let mut st = style.pos(Pos::new(HPos::Center, VPos::Center));
    if vertical {
        st = st.transform(FontTransform::Rotate270);
    }
    area.draw_text(s, &st, (x, y))?;
    Ok(())
}

// ---------------------------------------------------------------- ticks and numbers

/// "Nice" tick values (1, 2, 2.5, 5 x 10^k steps) covering `[lo, hi]`, at most about `max_n`.
pub(crate) fn nice_ticks(lo: f64, hi: f64, max_n: usize) -> (Vec<f64>, f64) {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) || max_n < 2 {
        return (vec![lo], 1.0);
    }
    let raw = (hi - lo) / (max_n - 1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag);
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    let ticks = (first..=last).map(|k| k as f64 * step).collect();
    (ticks, step)
}

/// Formats a tick value with as many decimals as the tick step needs; no "-0".
pub(crate) fn fmt_tick(v: f64, step: f64) -> String {
    // Fewest decimals that write every multiple of the step exactly (0.2 -> 1, 0.25 -> 2, 10 -> 0).
    let decimals = (0..=6usize)
        .find(|&d| {
            let x = step.abs() * 10f64.powi(d as i32);
            (x - x.round()).abs() < 1e-6 * x.max(1.0)
        })
        .unwrap_or(6);
    let s = format!("{v:.decimals$}");
    if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') {
        s[1..].to_string()
    } else {
        s
    }
}

/// Formats a training step compactly: 1500 -> "1.5k", 150000 -> "150k", 2000000 -> "2M".
pub(crate) fn fmt_step(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 || (a >= 1e3 && (v / 1e3).fract().abs() < 1e-9) {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = if (x - x.round()).abs() < 1e-9 {
        format!("{}", x.round() as i64)
    } else {
        format!("{x:.1}")
    };
    format!("{s}{suffix}")
}

/// Smallest stride in {1, 2, 4, 8, ...} so that labels `label_px` long fit into cells `cell_px` wide.
pub(crate) fn auto_stride(cell_px: f64, label_px: f64) -> usize {
    let mut s = 1usize;
    while (s as f64) * cell_px < label_px && s < (1 << 20) {
        s *= 2;
    }
    s
}

// ---------------------------------------------------------------- fixed-tick axis

/// A linear f64 axis on `[lo, hi]` whose tick marks are exactly `ticks` (category centres,
/// or -1/0/1): plotters' own `with_key_points` combinator loses the f64 value formatter.
#[derive(Debug, Clone)]
pub(crate) struct FixedTicks {
    pub lo: f64,
    pub hi: f64,
    pub ticks: Vec<f64>,
    /// Logarithmic mapping (`lo > 0` required).
    pub log: bool,
}

impl FixedTicks {
    /// Nice ticks (see [`nice_ticks`]) on `[lo, hi]`; returns the axis and the tick step.
    pub fn nice(lo: f64, hi: f64, max_n: usize) -> (Self, f64) {
        let (ticks, step) = nice_ticks(lo, hi, max_n);
        (
            Self {
                lo,
                hi,
                ticks,
                log: false,
            },
            step,
        )
    }

    /// A log axis on `[lo, hi]` (`0 < lo < hi`) with ticks at 1, 2, 5 x 10^k (only 10^k when the
    /// range spans more than three decades).
    pub fn log(lo: f64, hi: f64) -> Self {
        let (k0, k1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        let mantissas: &[f64] = if k1 - k0 > 3 {
            &[1.0]
        } else {
            &[1.0, 2.0, 5.0]
        };
        let ticks = (k0..=k1)
            .flat_map(|k| mantissas.iter().map(move |m| m * 10f64.powi(k)))
            .filter(|t| *t >= lo * (1.0 - 1e-9) && *t <= hi * (1.0 + 1e-9))
            .collect();
        Self {
            lo,
            hi,
            ticks,
            log: true,
        }
    }

    /// An accuracy axis: [-0.02, 1.02] with ticks 0, 0.2, ..., 1 (tick step 0.2).
    pub fn accuracy() -> Self {
        Self {
            lo: -0.02,
            hi: 1.02,
            ticks: (0..=5).map(|k| k as f64 * 0.2).collect(),
            log: false,
        }
    }

    /// Categories `0..n` centred on integers, the axis spanning `[-0.5, n - 0.5]`.
    pub fn categories(n: usize) -> Self {
        Self {
            lo: -0.5,
            hi: n as f64 - 0.5,
            ticks: (0..n).map(|i| i as f64).collect(),
            log: false,
        }
    }
}

impl plotters::coord::ranged1d::Ranged for FixedTicks {
    type FormatOption = plotters::coord::ranged1d::NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let t = if self.log {
            (value.max(f64::MIN_POSITIVE).ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (value - self.lo) / (self.hi - self.lo)
        };
        limit.0 + (t * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

impl plotters::coord::ranged1d::ValueFormatter<f64> for FixedTicks {
    fn format(value: &f64) -> String {
        format!("{value}")
    }
}

// ---------------------------------------------------------------- legends

/// What a legend entry shows left of its label.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Swatch {
    /// A filled dot (scatter points).
    Dot(RGBColor),
    /// A solid line with a dot (line series with markers).
    Line(RGBColor),
    /// A dashed line (reference lines).
    Dashed(RGBColor),
    /// A filled box (bars).
    Block(RGBColor),
}

const SWATCH_W: i32 = 30;
const ROW_H: i32 = 24;

/// Width in pixels a vertical legend needs.
pub(crate) fn legend_width(title: Option<&str>, labels: &[String]) -> i32 {
    let st = text(LEGEND_SIZE);
    let t = title
        .map(|t| text_box(t, &bold(LEGEND_SIZE)).0)
        .unwrap_or(0);
    (max_width(labels, &st) + SWATCH_W + 22).max(t + 14)
}

/// Height in pixels a vertical legend needs.
pub(crate) fn legend_height(title: Option<&str>, n: usize) -> i32 {
    (n as i32 + i32::from(title.is_some())) * ROW_H + 12
}

/// Draws a vertical legend with its top-left corner at `(x, y)` of `area`, framed.
pub(crate) fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    title: Option<&str>,
    entries: &[(String, Swatch)],
) -> Result<()> {
    let labels: Vec<String> = entries.iter().map(|e| e.0.clone()).collect();
    let w = legend_width(title, &labels);
    let h = legend_height(title, entries.len());
    area.draw(&Rectangle::new([(x, y), (x + w, y + h)], WHITE.filled()))?;
    area.draw(&Rectangle::new(
        [(x, y), (x + w, y + h)],
        ShapeStyle::from(&MID_GREY).stroke_width(1),
    ))?;
    let mut row = y + 6 + ROW_H / 2;
    if let Some(t) = title {
        area.draw_text(
            t,
            &bold(LEGEND_SIZE).pos(Pos::new(HPos::Left, VPos::Center)),
            (x + 8, row),
        )?;
        row += ROW_H;
    }
    let st = text(LEGEND_SIZE).pos(Pos::new(HPos::Left, VPos::Center));
    for (label, swatch) in entries {
        let (sx0, sx1) = (x + 8, x + 8 + SWATCH_W);
        match *swatch {
            Swatch::Dot(c) => {
                area.draw(&Circle::new(((sx0 + sx1) / 2, row), 5, c.filled()))?;
            }
            Swatch::Line(c) => {
                area.draw(&PathElement::new(
                    vec![(sx0, row), (sx1, row)],
                    c.stroke_width(2),
                ))?;
                area.draw(&Circle::new(((sx0 + sx1) / 2, row), 4, c.filled()))?;
            }
            Swatch::Dashed(c) => {
                let mut xx = sx0;
                while xx < sx1 {
                    let xe = (xx + 6).min(sx1);
                    area.draw(&PathElement::new(
                        vec![(xx, row), (xe, row)],
                        c.stroke_width(2),
                    ))?;
                    xx += 10;
                }
            }
            Swatch::Block(c) => {
                area.draw(&Rectangle::new(
                    [(sx0 + 4, row - 7), (sx1 - 4, row + 7)],
                    c.filled(),
                ))?;
            }
        }
        area.draw_text(label, &st, (sx1 + 8, row))?;
        row += ROW_H;
    }
    Ok(())
}

// ---------------------------------------------------------------- colour bar

/// Width in pixels a vertical colour bar with its ticks and label needs.
pub(crate) fn colour_bar_width((lo, hi): (f64, f64), label: &str) -> i32 {
    let (ticks, step) = nice_ticks(lo, hi, 6);
    let labels: Vec<String> = ticks.iter().map(|t| fmt_tick(*t, step)).collect();
    let lab = if label.is_empty() {
        0
    } else {
        text_box(label, &text(AXIS_SIZE)).1 + 10
    };
    10 + 20 + 8 + max_width(&labels, &text(TICK_SIZE)) + 8 + lab
}

/// Draws a vertical colour bar between pixel rows `y0` (top, = `hi`) and `y1` (bottom, = `lo`),
/// starting at column `x`, with tick labels on its right and a rotated `label` beyond them.
pub(crate) fn draw_colour_bar<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y0, y1): (i32, i32, i32),
    cmap: ColorMap,
    (lo, hi): (f64, f64),
    label: &str,
) -> Result<()> {
    let (bx0, bx1) = (x + 10, x + 30);
    let h = (y1 - y0).max(1);
    for k in 0..h {
        let t = 1.0 - (k as f64 + 0.5) / h as f64;
        area.draw(&Rectangle::new(
            [(bx0, y0 + k), (bx1, y0 + k + 1)],
            cmap.at(t).filled(),
        ))?;
    }
    area.draw(&Rectangle::new(
        [(bx0, y0), (bx1, y1)],
        ShapeStyle::from(&MID_GREY).stroke_width(1),
    ))?;
    let (ticks, step) = nice_ticks(lo, hi, 6);
    let st = text(TICK_SIZE).pos(Pos::new(HPos::Left, VPos::Center));
    let mut widest = 0;
    for t in ticks {
        let yy = y1 - ((t - lo) / (hi - lo) * h as f64).round() as i32;
        area.draw(&PathElement::new(
            vec![(bx1, yy), (bx1 + 5, yy)],
            MID_GREY.stroke_width(1),
        ))?;
        let s = fmt_tick(t, step);
        widest = widest.max(text_box(&s, &st).0);
        area.draw_text(&s, &st, (bx1 + 8, yy))?;
    }
    if !label.is_empty() {
        let lx = bx1 + 8 + widest + 8 + text_box(label, &text(AXIS_SIZE)).1 / 2;
        centred_text(area, label, &text(AXIS_SIZE), (lx, (y0 + y1) / 2), true)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ticks_cover_the_range_with_round_steps() {
        let (t, s) = nice_ticks(0.0, 1.0, 6);
        assert_eq!(s, 0.2);
        assert_eq!(t.len(), 6);
        assert!((t[5] - 1.0).abs() < 1e-12);
        let (t, s) = nice_ticks(-1.0, 1.0, 6);
        assert_eq!(s, 0.5);
        assert_eq!(t.len(), 5);
        let (t, s) = nice_ticks(0.0, 7.0, 9);
        assert_eq!(s, 1.0);
        assert_eq!(t, (0..=7).map(f64::from).collect::<Vec<_>>());
        let (_, s) = nice_ticks(0.0, 13.0, 6);
        assert_eq!(s, 5.0);
    }

    #[test]
    fn tick_and_step_formats() {
        assert_eq!(fmt_tick(0.4, 0.2), "0.4");
        assert_eq!(fmt_tick(-0.0, 0.5), "0.0");
        assert_eq!(fmt_tick(0.25, 0.25), "0.25");
        assert_eq!(fmt_tick(20.0, 10.0), "20");
        assert_eq!(fmt_step(150_000.0), "150k");
        assert_eq!(fmt_step(1_500.0), "1500");
        assert_eq!(fmt_step(2_000.0), "2k");
        assert_eq!(fmt_step(2_500_000.0), "2.5M");
        assert_eq!(fmt_step(700.0), "700");
    }

    #[test]
    fn log_axis_ticks_and_mapping() {
        let a = FixedTicks::log(0.08, 2.6);
        assert_eq!(a.ticks, vec![0.1, 0.2, 0.5, 1.0, 2.0]);
        use plotters::coord::ranged1d::Ranged;
        // Equal ratios map to equal pixel distances.
        let (p1, p2, p3) = (
            a.map(&0.1, (0, 1000)),
            a.map(&1.0, (0, 1000)),
            a.map(&10.0, (0, 1000)),
        );
        assert!(((p2 - p1) - (p3 - p2)).abs() <= 1);
        assert_eq!(FixedTicks::log(1e-4, 10.0).ticks.len(), 6);
    }

    #[test]
    fn strides_are_powers_of_two() {
        assert_eq!(auto_stride(20.0, 15.0), 1);
        assert_eq!(auto_stride(5.0, 15.0), 4);
        assert_eq!(auto_stride(3.0, 20.0), 8);
    }

    #[test]
    fn validation_names_the_input() {
        let e = finite("loss", &[1.0, f64::NAN]).unwrap_err().to_string();
        assert!(e.contains("loss") && e.contains("[1]"), "{e}");
        let e = within("acc", &[0.5, 1.5], (0.0, 1.0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("acc") && e.contains("1.5"), "{e}");
        assert!(check_range("range", (1.0, 1.0)).is_err());
        assert!(check_size((0, 10)).is_err());
        assert_eq!(padded((2.0, 2.0), 0.05), (1.0, 3.0));
    }
}
