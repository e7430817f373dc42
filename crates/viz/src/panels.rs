//! Several figures side by side under one title, e.g. the induction, previous-token and
//! duplicate-token head scores of one model (docs/spec/circuits.md, head detection).

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Result, VizError};
use crate::figure::Figure;
use crate::util::begin;

/// A row of figures of the same type, each drawn into its own column, under a common title.
/// Each column's width is proportional to its figure's default width; the row's default size
/// is the sum of the widths and the largest height (plus the title).
///
/// # Shapes
/// `panels`: one or more figures, drawn left to right.
#[derive(Debug, Clone)]
pub struct FigureRow<F: Figure> {
    /// Title over the whole row (empty for none).
    pub title: String,
    /// The figures, left to right.
    pub panels: Vec<F>,
}

impl<F: Figure> FigureRow<F> {
    /// A row of `panels` under `title`.
    pub fn new(title: &str, panels: Vec<F>) -> Self {
        Self {
            title: title.to_string(),
            panels,
        }
    }
}

const TITLE_H: u32 = 40;

impl<F: Figure> Figure for FigureRow<F> {
    fn size(&self) -> (u32, u32) {
        let w: u32 = self.panels.iter().map(|p| p.size().0).sum();
        let h = self.panels.iter().map(|p| p.size().1).max().unwrap_or(300);
        let title = if self.title.is_empty() { 0 } else { TITLE_H };
        (w.clamp(200, 8000), (h + title).clamp(200, 8000))
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        if self.panels.is_empty() {
            return Err(VizError::Empty {
                what: "figure row panels".into(),
            });
        }
        let body = begin(area, &self.title)?;
        let (w, _) = body.dim_in_pixel();
        let widths: Vec<f64> = self.panels.iter().map(|p| p.size().0 as f64).collect();
        let total: f64 = widths.iter().sum::<f64>().max(1.0);
        let mut acc = 0.0;
        let breaks: Vec<i32> = widths[..widths.len() - 1]
            .iter()
            .map(|x| {
                acc += x;
                (acc / total * w as f64).round() as i32
            })
            .collect();
        let cols = body.split_by_breakpoints(breaks, Vec::<i32>::new());
        for (panel, col) in self.panels.iter().zip(cols.iter()) {
            panel.draw(col)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{render_png, Heatmap, HeatmapOptions};
    use ndarray::array;

    #[test]
    fn row_sizes_add_up_and_empty_rows_fail() {
        let a = Heatmap::new(array![[0.1, 0.2], [0.3, 0.4]], HeatmapOptions::default());
        let row = FigureRow::new("two", vec![a.clone(), a.clone()]);
        let (w, h) = row.size();
        assert_eq!(w, 2 * a.size().0);
        assert_eq!(h, a.size().1 + TITLE_H);
        let png = render_png(&row, row.size()).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let empty: FigureRow<Heatmap> = FigureRow::new("none", vec![]);
        assert!(render_png(&empty, (300, 300)).is_err());
    }
}
