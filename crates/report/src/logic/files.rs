//! The fuzzy-logic checkpoints' tables beside the page: `tables/logic.csv` and their part of
//! `summary.json`.

use std::fmt::Write as _;

use hyperlens_analysis::terms::TermDecodingRow;
use hyperlens_model::Mixer;
use hyperlens_tasks::sraven::SplitName;
use hyperlens_train::SetMetrics;
use serde::Serialize;

use crate::data::LogicEntry;
use crate::discover::Training;
use crate::doc::FigureRef;
use crate::files::{summary_figures, SummaryFigure};

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

/// One set's R² and MSE of a logic checkpoint in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogicSetSummary<'a> {
    /// Mean squared error.
    pub mse: f64,
    /// Sequences evaluated.
    pub n: usize,
    /// The paper's R².
    pub r2: f64,
    /// The set's name.
    pub set: &'a str,
}

/// A logic checkpoint in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogicSummary<'a> {
    /// Its directory.
    pub dir: String,
    /// Its figures.
    pub figures: Vec<SummaryFigure<'a>>,
    /// The fixed query of its code sets.
    pub fixed_query: &'a [f32],
    /// Its mixer.
    pub mixer: Mixer,
    /// Its directory's name.
    pub name: &'a str,
    /// Updates planned, if recorded.
    pub planned_steps: Option<u64>,
    /// R² and MSE per set.
    pub sets: Vec<LogicSetSummary<'a>>,
    /// Its split.
    pub split: SplitName,
    /// Updates done, if recorded.
    pub steps: Option<u64>,
    /// The term decoding per layer.
    pub term_decoding: &'a [TermDecodingRow],
    /// Whether a training log was found.
    pub training_log: bool,
    /// The t-SNE's perplexity.
    pub tsne_perplexity: f64,
    /// Codes embedded with t-SNE.
    pub tsne_points: usize,
    /// The t-SNE's trustworthiness (k = 5).
    pub tsne_trustworthiness_k5: f64,
}

/// The logic checkpoints' part of `summary.json`.
pub fn summary<'a>(
    entries: &'a [LogicEntry],
    figs: &'a [(Vec<FigureRef>, Option<String>)],
) -> Vec<LogicSummary<'a>> {
    entries
        .iter()
        .zip(figs)
        .map(|(e, (f, _))| LogicSummary {
            dir: e.dir.display().to_string(),
            figures: summary_figures(f),
            fixed_query: &e.fixed_query,
            mixer: e.mixer,
            name: &e.name,
            planned_steps: e.steps.and_then(|s| s.planned),
            sets: e
                .sets
                .iter()
                .map(|(n, m)| LogicSetSummary {
                    mse: m.loss,
                    n: m.n,
                    r2: m.metric,
                    set: n,
                })
                .collect(),
            split: e.split,
            steps: e.steps.map(|s| s.done),
            term_decoding: &e.decoding,
            training_log: matches!(e.training, Training::Log(_)),
            tsne_perplexity: e.tsne_perplexity,
            tsne_points: e.tsne_points,
            tsne_trustworthiness_k5: e.tsne_trustworthiness,
        })
        .collect()
}
