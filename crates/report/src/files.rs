//! The report's own tables beside the page: `tables/accuracy.csv`, `summary.json` (both
//! reproducible: the same checkpoints and parameters give the same bytes) and `timings.json`
//! (seconds, different on every run; not meant to be committed).

use std::collections::BTreeMap;
use std::path::Path;

use hyperlens_analysis::codes::{LatentSummary, LatentTimings};
use hyperlens_model::{Mixer, Task};
use hyperlens_probe::TransplantRow;
use hyperlens_tasks::sraven::SplitName;
use serde::Serialize;

use crate::data::{CheckpointFigures, Entry, LogicEntry, LogicSeconds, ReportParams, StageSeconds};
use crate::doc::FigureRef;
use crate::error::Result;
use crate::sraven::verdict::{at_chance, best_layer};

/// File name of the timings, beside `index.html`.
pub const TIMINGS_FILE: &str = "timings.json";

/// A figure in `summary.json`: its file, caption and sentences.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryFigure<'a> {
    /// Caption, plain text.
    pub caption: &'a str,
    /// Path of the PNG relative to the page.
    pub file: &'a str,
    /// The sentences beside it (inline Markdown).
    pub text: &'a str,
}

impl<'a> From<&'a FigureRef> for SummaryFigure<'a> {
    fn from(f: &'a FigureRef) -> Self {
        Self {
            caption: &f.caption,
            file: &f.src,
            text: &f.text,
        }
    }
}

/// The figures of `figs` for `summary.json`.
pub(crate) fn summary_figures(figs: &[FigureRef]) -> Vec<SummaryFigure<'_>> {
    figs.iter().map(SummaryFigure::from).collect()
}

/// One metric of an aggregate group: mean and standard error over its runs (`null` where not
/// finite).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryStat<'a> {
    /// The mean (`None`: not finite).
    pub mean: Option<f64>,
    /// The metric's name.
    pub metric: &'a str,
    /// Runs with the metric.
    pub n: usize,
    /// The standard error (`None`: not finite).
    pub se: Option<f64>,
}

/// A group of runs of the aggregate (the runs that share their settings but the seed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryGroup<'a> {
    /// Its label.
    pub group: &'a str,
    /// Its runs' names.
    pub runs: Vec<&'a str>,
    /// The settings that define it.
    pub settings: BTreeMap<&'a str, &'a str>,
    /// Per metric, mean and standard error.
    pub stats: Vec<SummaryStat<'a>>,
    /// SRAVEN or logic.
    pub task: Task,
}

/// Accuracy and loss of one set of a SRAVEN checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummarySet<'a> {
    /// All features right.
    pub accuracy: f64,
    /// Cross-entropy (nats).
    pub loss: f64,
    /// Per output position.
    pub per_feature_accuracy: &'a [f64],
}

/// The attention sample of a SRAVEN checkpoint (its array is in `file`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryAttention<'a> {
    /// The `.npz` of the pattern, relative to the page.
    pub file: String,
    /// The model's answer values.
    pub prediction: &'a [i64],
    /// Rule per feature slot.
    pub rules: &'a [i64],
    /// The pattern's shape `[L, H, T, T]`.
    pub shape: &'a [usize],
    /// The answer values.
    pub target: &'a [i64],
}

/// The transplant test of a SRAVEN checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryCausal<'a> {
    /// The site's key positions.
    pub keys: &'a [usize],
    /// Problems per set.
    pub n: usize,
    /// The site's query position.
    pub query: usize,
    /// Per layer and kind of transplant.
    pub rows: &'a [TransplantRow],
    /// The answer slot transplanted.
    pub slot: usize,
}

/// A SRAVEN checkpoint in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryCheckpoint<'a> {
    /// Whether its OOD accuracy is at chance.
    pub at_chance: bool,
    /// Its attention sample.
    pub attention: SummaryAttention<'a>,
    /// The best decoding layer, when above the baseline.
    pub best_decoding_layer: Option<usize>,
    /// Its transplant test.
    pub causal: Option<SummaryCausal<'a>>,
    /// Its directory.
    pub dir: String,
    /// Its figures.
    pub figures: Vec<SummaryFigure<'a>>,
    /// In-distribution accuracy.
    pub id: SummarySet<'a>,
    /// The latent-code analysis' summary (its own format, `LatentReport::summary`).
    pub latent: LatentSummary<'a>,
    /// Its mixer.
    pub mixer: Mixer,
    /// Its directory's name.
    pub name: &'a str,
    /// OOD accuracy.
    pub ood: SummarySet<'a>,
    /// Updates planned, if recorded.
    pub planned_steps: Option<u64>,
    /// Its split.
    pub split: SplitName,
    /// Updates done, if recorded.
    pub steps: Option<u64>,
    /// Whether a training log was found.
    pub training_log: bool,
}

impl<'a> SummaryCheckpoint<'a> {
    /// The record of `e` with its figures `figs`.
    fn new(e: &'a Entry, figs: &'a [FigureRef]) -> Self {
        let set = |m: &'a hyperlens_model::EvalMetrics| SummarySet {
            accuracy: m.accuracy,
            loss: m.loss,
            per_feature_accuracy: &m.per_feature_accuracy,
        };
        Self {
            at_chance: at_chance(e),
            attention: SummaryAttention {
                file: format!("codes/{}_attention.npz", e.name),
                prediction: &e.attention.prediction,
                rules: &e.attention.rules,
                shape: e.attention.pattern.shape(),
                target: &e.attention.target,
            },
            best_decoding_layer: best_layer(e)
                .filter(|b| b.above_baseline)
                .and_then(|b| b.layer.index()),
            causal: e.causal.as_ref().map(|c| SummaryCausal {
                keys: &c.site.keys,
                n: c.n,
                query: c.site.query,
                rows: &c.rows,
                slot: c.slot,
            }),
            dir: e.dir.display().to_string(),
            figures: summary_figures(figs),
            id: set(&e.id),
            latent: e.latent.summary(),
            mixer: e.mixer,
            name: &e.name,
            ood: set(&e.ood),
            planned_steps: e.steps.and_then(|s| s.planned),
            split: e.split,
            steps: e.steps.map(|s| s.done),
            training_log: matches!(e.training, crate::discover::Training::Log(_)),
        }
    }
}

/// `summary.json`: the parameters, and per SRAVEN checkpoint its accuracy, verdicts, latent-code
/// summary, attention sample and figures; per logic checkpoint (`logic_checkpoints`) its R², term
/// decoding and figures; the aggregate's groups. No timings. Written with every object's keys in
/// alphabetical order ([`hyperlens_io::write_json_sorted`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryJson<'a> {
    /// The aggregate's groups.
    pub aggregate: Vec<SummaryGroup<'a>>,
    /// The SRAVEN checkpoints.
    pub checkpoints: Vec<SummaryCheckpoint<'a>>,
    /// The figures that compare the checkpoints.
    pub comparison_figures: Vec<SummaryFigure<'a>>,
    /// The device the report ran on.
    pub device: String,
    /// The logic checkpoints.
    pub logic_checkpoints: Vec<crate::logic::LogicSummary<'a>>,
    /// Problems per set.
    pub n: usize,
    /// The sampling seed.
    pub seed: u64,
    /// hyperlens's version.
    pub version: &'static str,
}

/// The report's [`SummaryJson`].
pub fn summary<'a>(
    entries: &'a [Entry],
    figs: &'a [CheckpointFigures],
    comparison: Option<&'a FigureRef>,
    logic: &crate::data::LogicPart<'a>,
    agg: &'a crate::data::Aggregate,
    params: &ReportParams,
) -> SummaryJson<'a> {
    let finite = |v: f64| v.is_finite().then_some(v);
    SummaryJson {
        aggregate: agg
            .groups
            .iter()
            .map(|g| SummaryGroup {
                group: &g.label,
                runs: g
                    .runs
                    .iter()
                    .map(|&i| agg.points[i].name.as_str())
                    .collect(),
                settings: g
                    .key
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect(),
                stats: g
                    .stats
                    .iter()
                    .map(|(m, mean, se, n)| SummaryStat {
                        mean: finite(*mean),
                        metric: m,
                        n: *n,
                        se: finite(*se),
                    })
                    .collect(),
                task: g.task,
            })
            .collect(),
        checkpoints: entries
            .iter()
            .zip(figs)
            .map(|(e, (f, _))| SummaryCheckpoint::new(e, f))
            .collect(),
        comparison_figures: comparison.into_iter().map(SummaryFigure::from).collect(),
        device: params.device.to_string(),
        logic_checkpoints: crate::logic::summary(logic.entries, logic.figures),
        n: params.n,
        seed: params.seed,
        version: env!("CARGO_PKG_VERSION"),
    }
}

/// The seconds of one SRAVEN checkpoint in `timings.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointTimings<'a> {
    /// The latent-code analysis' own timings (`LatentReport::timings`).
    pub analysis: LatentTimings,
    /// Its directory's name.
    pub name: &'a str,
    /// Seconds per stage.
    pub seconds: StageSeconds,
}

/// The seconds of one logic checkpoint in `timings.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogicTimings<'a> {
    /// Its directory's name.
    pub name: &'a str,
    /// Seconds per stage.
    pub seconds: LogicSeconds,
}

/// `timings.json`: seconds per checkpoint and stage (with the latent-code analysis' own
/// timings), of the figures and of the whole run (written with sorted keys too).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimingsJson<'a> {
    /// The SRAVEN checkpoints.
    pub checkpoints: Vec<CheckpointTimings<'a>>,
    /// The whole run.
    pub elapsed_s: f64,
    /// The figures.
    pub figures_s: f64,
    /// The logic checkpoints.
    pub logic_checkpoints: Vec<LogicTimings<'a>>,
}

/// The report's [`TimingsJson`].
pub fn timings<'a>(
    entries: &'a [Entry],
    logic: &'a [LogicEntry],
    figures_s: f64,
    elapsed_s: f64,
) -> TimingsJson<'a> {
    TimingsJson {
        checkpoints: entries
            .iter()
            .map(|e| CheckpointTimings {
                analysis: e.latent.timings(),
                name: &e.name,
                seconds: e.seconds,
            })
            .collect(),
        elapsed_s,
        figures_s,
        logic_checkpoints: logic
            .iter()
            .map(|e| LogicTimings {
                name: &e.name,
                seconds: e.seconds,
            })
            .collect(),
    }
}

/// Writes `text` to `path` atomically.
///
/// # Errors
/// [`crate::ReportError::File`] naming the path.
pub fn write_text(path: &Path, text: &str) -> Result<()> {
    Ok(hyperlens_io::write_atomic(path, text.as_bytes())?)
}
