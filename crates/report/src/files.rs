//! The report's own tables beside the page: `tables/accuracy.csv`, `summary.json` (both
//! reproducible: the same checkpoints and parameters give the same bytes) and `timings.json`
//! (seconds, different on every run; not meant to be committed).

use std::path::Path;

use serde_json::json;

use crate::data::{CheckpointFigures, Entry, ReportParams};
use crate::doc::FigureRef;
use crate::error::Result;
use crate::sraven::verdict::{at_chance, best_layer};

/// File name of the timings, beside `index.html`.
pub const TIMINGS_FILE: &str = "timings.json";

fn figure_json(f: &FigureRef) -> serde_json::Value {
    json!({"file": f.src, "caption": f.caption, "text": f.text})
}

/// `summary.json`: the parameters, and per SRAVEN checkpoint its accuracy, verdicts, latent-code
/// summary, attention sample and figures; per logic checkpoint (`logic_checkpoints`) its R², term
/// decoding and figures. No timings.
pub fn summary(
    entries: &[Entry],
    figs: &[CheckpointFigures],
    comparison: Option<&FigureRef>,
    logic: &crate::data::LogicPart<'_>,
    agg: &crate::data::Aggregate,
    params: &ReportParams,
) -> serde_json::Value {
    json!({
        "aggregate": agg.groups.iter().map(|g| json!({
            "task": g.task,
            "group": g.label,
            "settings": g.key.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "runs": g.runs.iter().map(|&i| agg.points[i].name.clone()).collect::<Vec<_>>(),
            "stats": g.stats.iter().map(|(m, mean, se, n)| json!({
                "metric": m,
                "mean": if mean.is_finite() { json!(mean) } else { json!(null) },
                "se": if se.is_finite() { json!(se) } else { json!(null) },
                "n": n,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "logic_checkpoints": crate::logic::summary(logic.entries, logic.figures),
        "version": env!("CARGO_PKG_VERSION"),
        "n": params.n,
        "seed": params.seed,
        "device": params.device.to_string(),
        "comparison_figures": comparison.iter().map(|f| figure_json(f)).collect::<Vec<_>>(),
        "checkpoints": entries.iter().zip(figs).map(|(e, (f, _))| {
            let best = best_layer(e);
            json!({
                "name": e.name,
                "dir": e.dir.display().to_string(),
                "mixer": e.mixer,
                "split": e.split,
                "steps": e.steps.map(|s| s.done),
                "planned_steps": e.steps.and_then(|s| s.planned),
                "at_chance": at_chance(e),
                "id": {"accuracy": e.id.accuracy, "per_feature_accuracy": e.id.per_feature_accuracy, "loss": e.id.loss},
                "ood": {"accuracy": e.ood.accuracy, "per_feature_accuracy": e.ood.per_feature_accuracy, "loss": e.ood.loss},
                "best_decoding_layer": best.filter(|b| b.above_baseline).and_then(|b| b.layer.index()),
                "latent": e.latent.summary(),
                "training_log": matches!(e.training, crate::discover::Training::Log(_)),
                "attention": {
                    "file": format!("codes/{}_attention.npz", e.name),
                    "shape": e.attention.pattern.shape(),
                    "target": e.attention.target,
                    "prediction": e.attention.prediction,
                    "rules": e.attention.rules,
                },
                "figures": f.iter().map(figure_json).collect::<Vec<_>>(),
                "causal": e.causal.as_ref().map(|c| json!({
                    "n": c.n,
                    "slot": c.slot,
                    "query": c.site.query,
                    "keys": c.site.keys,
                    "rows": c.rows,
                })),
            })
        }).collect::<Vec<_>>(),
    })
}

/// `timings.json`: seconds per checkpoint and stage (with the latent-code analysis' own timings),
/// of the figures and of the whole run.
pub fn timings(
    entries: &[Entry],
    logic: &[crate::data::LogicEntry],
    figures_s: f64,
    elapsed_s: f64,
) -> serde_json::Value {
    json!({
        "elapsed_s": elapsed_s,
        "figures_s": figures_s,
        "logic_checkpoints": logic.iter().map(|e| json!({
            "name": e.name,
            "seconds": e.seconds,
        })).collect::<Vec<_>>(),
        "checkpoints": entries.iter().map(|e| json!({
            "name": e.name,
            "seconds": e.seconds,
            "analysis": e.latent.timings(),
        })).collect::<Vec<_>>(),
    })
}

/// Writes `text` to `path` atomically.
///
/// # Errors
/// [`crate::ReportError::File`] naming the path.
pub fn write_text(path: &Path, text: &str) -> Result<()> {
    Ok(hyperlens_io::write_atomic(path, text.as_bytes())?)
}
