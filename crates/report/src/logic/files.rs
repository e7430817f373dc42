//! The fuzzy-logic checkpoints' tables beside the page: `tables/logic.csv` and their part of
//! `summary.json`.

use std::fmt::Write as _;

use hyperlens_train::SetMetrics;
use serde_json::json;

use crate::data::LogicEntry;
use crate::discover::Training;
use crate::doc::FigureRef;

/// `tables/logic.csv`: one row per logic checkpoint, columns
/// `checkpoint,mixer,split,id_r2,ood_r2,unknown_r2,id_mse,ood_mse,unknown_mse,n,steps,planned_steps`
/// (empty where not measured or recorded).
pub fn logic_csv(entries: &[LogicEntry]) -> String {
    let mut s = String::from(
        "checkpoint,mixer,split,id_r2,ood_r2,unknown_r2,id_mse,ood_mse,unknown_mse,n,steps,planned_steps\n",
    );
    for e in entries {
        let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        let m = |set: &str, f: fn(&SetMetrics) -> f64| {
            e.sets
                .iter()
                .find(|(n, _)| *n == set)
                .map_or(String::new(), |(_, m)| format!("{:.6}", f(m)))
        };
        let n = e.sets.first().map_or(0, |(_, m)| m.n);
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            e.name,
            e.mixer,
            e.split,
            m("id", |m| m.metric),
            m("ood", |m| m.metric),
            m("unknown", |m| m.metric),
            m("id", |m| m.loss),
            m("ood", |m| m.loss),
            m("unknown", |m| m.loss),
            n,
            opt(e.steps.map(|s| s.done)),
            opt(e.steps.and_then(|s| s.planned)),
        );
    }
    s
}

/// The logic checkpoints' part of `summary.json`.
pub fn summary(
    entries: &[LogicEntry],
    figs: &[(Vec<FigureRef>, Option<String>)],
) -> serde_json::Value {
    json!(entries.iter().zip(figs).map(|(e, (f, _))| json!({
        "name": e.name,
        "dir": e.dir.display().to_string(),
        "mixer": e.mixer,
        "split": e.split,
        "steps": e.steps.map(|s| s.done),
        "planned_steps": e.steps.and_then(|s| s.planned),
        "sets": e.sets.iter().map(|(n, m)| json!({"set": n, "r2": m.metric, "mse": m.loss, "n": m.n})).collect::<Vec<_>>(),
        "fixed_query": e.fixed_query,
        "term_decoding": e.decoding,
        "tsne_points": e.tsne_points,
        "tsne_perplexity": e.tsne_perplexity,
        "tsne_trustworthiness_k5": e.tsne_trustworthiness,
        "training_log": matches!(e.training, Training::Log(_)),
        "figures": f.iter().map(|f| json!({"file": f.src, "caption": f.caption, "text": f.text})).collect::<Vec<_>>(),
    })).collect::<Vec<_>>())
}
