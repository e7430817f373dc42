//! The aggregate's figures: each metric against every setting that varies between groups.

use std::path::Path;

use hyperlens_model::Task;
use hyperlens_viz::{SweepCurves, SweepSeries};

use crate::aggregate::text::sweep_text;
use crate::data::{Aggregate, Group};
use crate::doc::FigureRef;
use crate::error::Result;

/// Draws the OOD metric of each task against every varying setting (one line per mixer, mean ±
/// s.e.), as `figures/aggregate_<task>_<setting>.png`.
///
/// # Errors
/// A figure that cannot be drawn or written.
pub fn figures(agg: &Aggregate, out: &Path) -> Result<Vec<FigureRef>> {
    let mut made = Vec::new();
    for (task, varying) in &agg.axes {
        let groups: Vec<&Group> = agg.groups.iter().filter(|g| g.task == *task).collect();
        let (metric, label) = match task {
            Task::Logic => ("ood_r2", "OOD R²"),
            Task::Sraven | Task::Induction => ("ood_acc", "OOD accuracy"),
        };
        let mut axes: Vec<&String> = varying.iter().filter(|k| *k != "mixer").collect();
        let mixer_axis = String::from("mixer");
        if axes.is_empty() && varying.iter().any(|k| k == "mixer") {
            axes.push(&mixer_axis);
        }
        for axis in axes {
            let mut cats: Vec<String> = Vec::new();
            for g in &groups {
                if let Some(v) = g.setting(axis) {
                    if !cats.iter().any(|c| c == v) {
                        cats.push(v.to_string());
                    }
                }
            }
            // Numeric settings in numeric order.
            if cats.iter().all(|c| c.parse::<f64>().is_ok()) {
                cats.sort_by(|a, b| {
                    a.parse::<f64>()
                        .unwrap_or(0.0)
                        .total_cmp(&b.parse::<f64>().unwrap_or(0.0))
                });
            }
            // One series per value of the other varying settings (usually: per mixer).
            let others: Vec<&String> = varying.iter().filter(|k| *k != axis).collect();
            let mut series: Vec<SweepSeries> = Vec::new();
            for g in &groups {
                let name = if others.is_empty() {
                    label.to_string()
                } else {
                    others
                        .iter()
                        .map(|k| g.setting(k).unwrap_or("-").to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let Some(x) = g
                    .setting(axis)
                    .and_then(|v| cats.iter().position(|c| c == v))
                else {
                    continue;
                };
                let idx = match series.iter().position(|s| s.name == name) {
                    Some(i) => i,
                    None => {
                        series.push(SweepSeries {
                            name: name.clone(),
                            mean: vec![f64::NAN; cats.len()],
                            se: vec![f64::NAN; cats.len()],
                        });
                        series.len() - 1
                    }
                };
                if let Some((m, s, _)) = g.stat(metric) {
                    series[idx].mean[x] = m;
                    series[idx].se[x] = s;
                }
            }
            let fig = SweepCurves {
                title: format!("{task}: {label} against {axis} (mean ± s.e. over seeds)"),
                categories: cats,
                x_label: axis.clone(),
                y_label: label.to_string(),
                series,
                unit_range: *task != Task::Logic,
            };
            let rel = format!("figures/aggregate_{task}_{axis}.png");
            made.push(crate::plots::save(
                out,
                rel,
                &fig,
                &format!("{task}: {label} against {axis}"),
                format!(
                    "{label} against {axis}, mean ± standard error over the seeds of each group"
                ),
                sweep_text(&groups, axis, metric, label),
            )?);
        }
    }
    Ok(made)
}
