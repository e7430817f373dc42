//! The drawing shared by the heatmaps and the attention figures: cell grids with values printed
//! in them, colour ranges, and tick labels along both axes (rotated or thinned to fit).

use ndarray::ArrayView2;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;

use crate::colour::{text_on, ColorMap};
use crate::error::Result;
use crate::heatmap::ValueFormat;
use crate::util::{check_range, max_width, min_max, text, text_box, MID_GREY, TICK_SIZE};

/// A pixel rectangle `[x0, x1) x [y0, y1)` inside a drawing area.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rect {
    pub x0: i32,
    pub y0: i32,
    pub x1: i32,
    pub y1: i32,
}

impl Rect {
    fn col_edge(&self, j: usize, n: usize) -> i32 {
        self.x0 + ((self.x1 - self.x0) as f64 * j as f64 / n as f64).round() as i32
    }
    fn row_edge(&self, i: usize, n: usize) -> i32 {
        self.y0 + ((self.y1 - self.y0) as f64 * i as f64 / n as f64).round() as i32
    }
    pub fn cell_w(&self, n: usize) -> f64 {
        (self.x1 - self.x0) as f64 / n.max(1) as f64
    }
    pub fn cell_h(&self, n: usize) -> f64 {
        (self.y1 - self.y0) as f64 / n.max(1) as f64
    }
}

/// Resolves the colour range: the given one, or the data range (symmetric around 0 for the
/// diverging map).
pub(crate) fn resolve_range(
    values: ArrayView2<f64>,
    cmap: ColorMap,
    range: Option<(f64, f64)>,
) -> Result<(f64, f64)> {
    if let Some(r) = range {
        check_range("range", r)?;
        return Ok(r);
    }
    let (lo, hi) = min_max(values.iter()).unwrap_or((0.0, 1.0));
    Ok(match cmap {
        ColorMap::BlueWhiteRed => {
            let m = lo.abs().max(hi.abs());
            if m > 0.0 {
                (-m, m)
            } else {
                (-1.0, 1.0)
            }
        }
        ColorMap::Viridis => {
            if hi > lo {
                (lo, hi)
            } else {
                (lo - 0.5, hi + 0.5)
            }
        }
    })
}

/// What [`draw_cells`] draws: the matrix, its colouring and its annotations.
pub(crate) struct Cells<'v> {
    /// The matrix, [rows, cols].
    pub values: ArrayView2<'v, f64>,
    /// Masked cells ([rows, cols], `true` = masked), drawn grey without a value.
    pub mask: Option<ArrayView2<'v, bool>>,
    /// Colour map.
    pub cmap: ColorMap,
    /// Colour range.
    pub range: (f64, f64),
    /// Printed values.
    pub fmt: ValueFormat,
    /// A dark line every n cells.
    pub separators: Option<usize>,
}

/// Draws the cells into `rect`, printing values when they fit, with a darker line every
/// `separators` cells and a frame.
pub(crate) fn draw_cells<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    rect: Rect,
    c: &Cells,
) -> Result<()> {
    let Cells {
        values,
        mask,
        cmap,
        range,
        fmt,
        separators,
    } = *c;
    let (rows, cols) = values.dim();
    let masked = |i: usize, j: usize| mask.is_some_and(|m| m[[i, j]]);
    let (cw, ch) = (rect.cell_w(cols), rect.cell_h(rows));
    let gridlines = cw >= 28.0 && ch >= 28.0;
    // Largest font (13 px down to 10 px) at which every printed value fits its cell; values are
    // left out when none does.
    let texts: Vec<Option<String>> = values
        .indexed_iter()
        .map(|((i, j), v)| if masked(i, j) { None } else { fmt.format(*v) })
        .collect();
    let font_size = [13.0, 12.0, 11.0, 10.0].into_iter().find(|&s| {
        let st = text(s);
        ch >= s * 1.15
            && texts
                .iter()
                .flatten()
                .all(|t| (text_box(t, &st).0 as f64) <= cw - 6.0)
    });
    for i in 0..rows {
        let (y0, y1) = (rect.row_edge(i, rows), rect.row_edge(i + 1, rows));
        for j in 0..cols {
            let (x0, x1) = (rect.col_edge(j, cols), rect.col_edge(j + 1, cols));
            let colour = if masked(i, j) {
                MASK_GREY
            } else {
                cmap.map(values[[i, j]], range)
            };
            area.draw(&Rectangle::new(
                [(x0, y0), (x1.max(x0 + 1), y1.max(y0 + 1))],
                colour.filled(),
            ))?;
            if gridlines {
                area.draw(&Rectangle::new([(x0, y0), (x1, y1)], WHITE.stroke_width(1)))?;
            }
            if let (Some(size), Some(s)) = (font_size, &texts[i * cols + j]) {
                let fg = text_on(colour);
                let st = text(size)
                    .color(&fg)
                    .pos(Pos::new(HPos::Center, VPos::Center));
                area.draw_text(s, &st, ((x0 + x1) / 2, (y0 + y1) / 2))?;
            }
        }
    }
    if let Some(k) = separators.filter(|k| *k > 0) {
        // Thin and translucent over small cells (e.g. 36 x 36 attention panels), so that the lines
        // group the cells without hiding them.
        let style = if cw.min(ch) < 12.0 {
            ShapeStyle::from(&RGBColor(40, 40, 40).mix(0.55)).stroke_width(1)
        } else {
            ShapeStyle::from(&RGBColor(40, 40, 40)).stroke_width(2)
        };
        for j in (k..cols).step_by(k) {
            let x = rect.col_edge(j, cols);
            area.draw(&PathElement::new(vec![(x, rect.y0), (x, rect.y1)], style))?;
        }
        for i in (k..rows).step_by(k) {
            let y = rect.row_edge(i, rows);
            area.draw(&PathElement::new(vec![(rect.x0, y), (rect.x1, y)], style))?;
        }
    }
    area.draw(&Rectangle::new(
        [(rect.x0, rect.y0), (rect.x1, rect.y1)],
        ShapeStyle::from(&MID_GREY).stroke_width(1),
    ))?;
    Ok(())
}

/// Colour of masked cells.
const MASK_GREY: RGBColor = RGBColor(238, 238, 238);

/// Placement of the x tick labels under a matrix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct XTicks {
    /// Labels read bottom-to-top (rotated) because they are wider than a cell.
    pub rotated: bool,
    /// Every `stride`-th label is shown.
    pub stride: usize,
    /// Height in pixels the labels take below the matrix.
    pub height: i32,
    /// Each shown label is centred under this many cells (1: under its own cell; 4: under a
    /// group of 4 cells that the label names, e.g. a SRAVEN panel of 4 slots).
    pub span: usize,
}

/// Chooses rotation and stride of x tick labels for cells `cell_w` pixels wide.
pub(crate) fn x_tick_layout(labels: &[String], cell_w: f64, stride: Option<usize>) -> XTicks {
    let st = text(TICK_SIZE);
    let widest = max_width(labels, &st) as f64;
    let font_h = text_box("Ag", &st).1 as f64;
    let fits_flat = |s: usize| widest + 6.0 <= cell_w * s as f64;
    match stride {
        Some(s) => {
            let rotated = !fits_flat(s.max(1));
            XTicks {
                rotated,
                stride: s.max(1),
                height: if rotated {
                    widest as i32 + 16
                } else {
                    font_h as i32 + 12
                },
                span: 1,
            }
        }
        None if fits_flat(1) => XTicks {
            rotated: false,
            stride: 1,
            height: font_h as i32 + 12,
            span: 1,
        },
        None => {
            let s = crate::util::auto_stride(cell_w, font_h + 2.0);
            XTicks {
                rotated: true,
                stride: s,
                height: widest as i32 + 16,
                span: 1,
            }
        }
    }
}

/// Draws x tick labels (every `t.stride`-th) below `rect`.
pub(crate) fn draw_x_ticks<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    rect: Rect,
    labels: &[String],
    t: XTicks,
) -> Result<()> {
    let n = labels.len();
    for (j, label) in labels.iter().enumerate().step_by(t.stride) {
        let x = (rect.col_edge(j, n) + rect.col_edge((j + t.span.max(1)).min(n), n)) / 2;
        area.draw(&PathElement::new(
            vec![(x, rect.y1), (x, rect.y1 + 4)],
            MID_GREY.stroke_width(1),
        ))?;
        if t.rotated {
            let st = text(TICK_SIZE)
                .pos(Pos::new(HPos::Right, VPos::Center))
                .transform(FontTransform::Rotate270);
            area.draw_text(label, &st, (x, rect.y1 + 7))?;
        } else {
            let st = text(TICK_SIZE).pos(Pos::new(HPos::Center, VPos::Top));
            area.draw_text(label, &st, (x, rect.y1 + 6))?;
        }
    }
    Ok(())
}

/// Stride and width of y tick labels for cells `cell_h` pixels high.
pub(crate) fn y_tick_layout(labels: &[String], cell_h: f64, stride: Option<usize>) -> (usize, i32) {
    let st = text(TICK_SIZE);
    let font_h = text_box("Ag", &st).1 as f64;
    let s = stride
        .unwrap_or_else(|| crate::util::auto_stride(cell_h, font_h + 1.0))
        .max(1);
    let shown: Vec<String> = labels.iter().step_by(s).cloned().collect();
    (s, max_width(&shown, &st) + 10)
}

/// Draws y tick labels (every `stride`-th), right-aligned left of `rect`.
pub(crate) fn draw_y_ticks<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    rect: Rect,
    labels: &[String],
    stride: usize,
) -> Result<()> {
    draw_y_ticks_spanning(area, rect, labels, stride, 1)
}

/// Draws y tick labels (every `stride`-th), right-aligned left of `rect`, each centred beside
/// `span` rows (see [`XTicks::span`]).
pub(crate) fn draw_y_ticks_spanning<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    rect: Rect,
    labels: &[String],
    stride: usize,
    span: usize,
) -> Result<()> {
    let n = labels.len();
    let st = text(TICK_SIZE).pos(Pos::new(HPos::Right, VPos::Center));
    for (i, label) in labels.iter().enumerate().step_by(stride.max(1)) {
        let y = (rect.row_edge(i, n) + rect.row_edge((i + span.max(1)).min(n), n)) / 2;
        area.draw(&PathElement::new(
            vec![(rect.x0 - 4, y), (rect.x0, y)],
            MID_GREY.stroke_width(1),
        ))?;
        area.draw_text(label, &st, (rect.x0 - 7, y))?;
    }
    Ok(())
}
