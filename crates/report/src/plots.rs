//! Figure helpers every section uses: saving a figure as PNG with its [`FigureRef`], and the
//! training curves of a log.

use std::path::Path;

use hyperlens_train::metrics::MetricsRow;
use hyperlens_viz::{save_png, Curve, Figure, TrainingCurves};

use crate::doc::FigureRef;
use crate::error::Result;

/// Saves `fig` as `out/rel` (PNG) and returns its [`FigureRef`].
pub(crate) fn save<F: Figure>(
    out: &Path,
    rel: String,
    fig: &F,
    short: &str,
    caption: String,
    text: String,
) -> Result<FigureRef> {
    save_png(out.join(&rel), fig)?;
    let id = rel
        .trim_start_matches("figures/")
        .trim_end_matches(".png")
        .replace('_', "-");
    Ok(FigureRef {
        id: format!("fig-{}", crate::doc::slug(&id)),
        short: short.to_string(),
        caption,
        text,
        src: rel,
        width: fig.size().0,
        interactive: None,
    })
}

/// Draws the training curves of `log` as `figures/{name}_training.png` (a log-scale loss axis
/// when the loss spans more than a factor 20); `None` when the log holds no value of any column.
///
/// # Errors
/// A figure that cannot be drawn or written.
pub(crate) fn training_curves_figure(
    out: &Path,
    name: &str,
    log: &TrainingLog<'_>,
    short: &str,
    caption: String,
    text: String,
) -> Result<Option<FigureRef>> {
    let series = |f: fn(&MetricsRow) -> Option<f64>, clip: bool| -> (Vec<f64>, Vec<f64>) {
        log.rows
            .iter()
            .filter_map(|r| f(r).filter(|v| v.is_finite()).map(|v| (r.step as f64, v)))
            .map(|(s, v)| (s, if clip { v.clamp(0.0, 1.0) } else { v }))
            .unzip()
    };
    let loss_data: Vec<NamedSeries> = log
        .loss
        .iter()
        .map(|(n, f)| (*n, series(*f, false)))
        .collect();
    let metric_data: Vec<NamedSeries> = log
        .metric
        .iter()
        .map(|(n, f)| (*n, series(*f, true)))
        .collect();
    fn curves<'a>(data: &'a [NamedSeries]) -> Vec<Curve<'a>> {
        data.iter()
            .filter(|(_, (s, _))| !s.is_empty())
            .map(|(n, (s, v))| Curve {
                name: n.to_string(),
                steps: s.as_slice(),
                values: v.as_slice(),
            })
            .collect()
    }
    let (loss, metric) = (curves(&loss_data), curves(&metric_data));
    if loss.is_empty() && metric.is_empty() {
        return Ok(None);
    }
    let mut fig = TrainingCurves::new(&format!("{name}: training curves"), loss, metric);
    fig.metric_label = log.metric_label.to_string();
    let (lo, hi) = fig
        .loss
        .iter()
        .flat_map(|c| c.values.iter().copied())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    fig.log_loss = lo > 0.0 && hi / lo > 20.0;
    Ok(Some(save(
        out,
        format!("figures/{name}_training.png"),
        &fig,
        short,
        caption,
        text,
    )?))
}

/// A curve's legend name with its steps and values.
pub(crate) type NamedSeries = (&'static str, (Vec<f64>, Vec<f64>));

/// A column of a training log: a curve's legend name and its value in a row.
pub(crate) type LogColumn = (&'static str, fn(&MetricsRow) -> Option<f64>);

/// The curves of a training log to draw: loss columns (left panel) and metric columns (right
/// panel, on [0, 1]; values outside it, such as an early negative R², are drawn at its edge).
pub(crate) struct TrainingLog<'a> {
    /// The log's rows.
    pub(crate) rows: &'a [MetricsRow],
    /// Loss curves.
    pub(crate) loss: &'a [LogColumn],
    /// Metric curves.
    pub(crate) metric: &'a [LogColumn],
    /// The metric panel's axis label ("accuracy", "R²").
    pub(crate) metric_label: &'a str,
}
