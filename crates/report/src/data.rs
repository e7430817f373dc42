//! The report's data types, in one place: its parameters and progress, what the measure stage
//! finds per checkpoint (SRAVEN [`Entry`], fuzzy-logic [`LogicEntry`], the transplant test's
//! [`CausalResult`]), the aggregate over seeds ([`Aggregate`]) and the figures the page receives.
//! Every stage module reads them; this module depends on no stage, so the report has no import
//! circle.

use std::path::{Path, PathBuf};

use hyperlens_analysis::terms::TermDecodingRow;
use hyperlens_analysis::LatentReport;
use hyperlens_model::{Device, EvalMetrics, Mixer, Task};
use hyperlens_probe::{TransplantKind, TransplantRow};
use hyperlens_tasks::sraven::{Set, SplitName, SravenParams};
use hyperlens_train::SetMetrics;
use ndarray::Array4;

use crate::discover::{Steps, Training};
use crate::doc::FigureRef;

/// What the report runs on, and where it writes.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportParams {
    /// Checkpoint directories to compare; empty: every checkpoint under `checkpoint_root`.
    pub checkpoints: Vec<PathBuf>,
    /// Where checkpoints are looked for when none is given.
    pub checkpoint_root: PathBuf,
    /// Output directory (created).
    pub out: PathBuf,
    /// Problems per set (ID and OOD), for the accuracy and for the codes; at least 16.
    pub n: usize,
    /// The split of checkpoints whose run files do not name one ([`DEFAULT_SPLIT`] when `None`).
    /// A checkpoint that names its own split is evaluated on it; a `Some` that differs from it is
    /// an error ([`ReportParams::split_for`]), never silently ignored.
    pub split: Option<SplitName>,
    /// Seed of the evaluation and probe problems.
    pub seed: u64,
    /// Compute device.
    pub device: Device,
    /// Problems per forward pass (memory is bounded by it); at least 1.
    pub batch: usize,
    /// Unpermuted ID and OOD problems of the transplant test ("Is the latent code causal?") per
    /// SRAVEN checkpoint; 0 leaves the section out.
    pub causal_n: usize,
    /// Show the aggregate over seeds even when no group has more than one run (a sweep's
    /// report); otherwise it is shown only when some group has several.
    pub aggregate: bool,
}

/// The split of a checkpoint that names none, when [`ReportParams::split`] is `None`.
pub const DEFAULT_SPLIT: SplitName = SplitName::Paper(0);

impl ReportParams {
    /// The split to evaluate the checkpoint `dir` on, whose run files name `own` (or none): its
    /// own, else the one given, else [`DEFAULT_SPLIT`].
    ///
    /// # Errors
    /// [`crate::ReportError::InvalidInput`] when a split was given and the checkpoint names
    /// another: its ID / OOD sets are those of its own split (another split's OOD set may hold
    /// its training tasks), so the given one cannot apply.
    pub fn split_for(
        &self,
        dir: &std::path::Path,
        own: Option<SplitName>,
    ) -> crate::Result<SplitName> {
        match (own, self.split) {
            (Some(own), Some(given)) if own != given => {
                Err(crate::ReportError::InvalidInput(format!(
                    "split {given}: {} was trained on split {own} and is evaluated on it; the split \
                     applies only to checkpoints whose train.json names none (leave it out, or \
                     report this checkpoint on its own)",
                    dir.display()
                )))
            }
            (Some(own), _) => Ok(own),
            (None, Some(given)) => Ok(given),
            (None, None) => Ok(DEFAULT_SPLIT),
        }
    }
}

impl Default for ReportParams {
    fn default() -> Self {
        Self {
            checkpoints: Vec::new(),
            checkpoint_root: PathBuf::from("data/checkpoints"),
            out: PathBuf::from("reports/default"),
            n: 2048,
            split: None,
            seed: 0,
            device: Device::Cpu,
            batch: 256,
            causal_n: 128,
            aggregate: false,
        }
    }
}

/// [`ReportParams`] as the stages of a run see them: `out` is the staging directory the report is
/// built in, `shown_out` the directory it will be swapped into (the paths the report records).
#[derive(Debug, Clone)]
pub(crate) struct StagedParams {
    /// The user's parameters, with `out` the staging directory.
    pub(crate) params: ReportParams,
    /// The final output directory.
    pub(crate) shown_out: PathBuf,
}

impl std::ops::Deref for StagedParams {
    type Target = ReportParams;
    fn deref(&self) -> &ReportParams {
        &self.params
    }
}

/// Progress of [`crate::run`], reported to its callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress<'a> {
    /// A checkpoint under the root was left out: it was trained on another task.
    Skipped {
        /// The checkpoint.
        dir: &'a Path,
        /// Its task.
        task: hyperlens_model::Task,
    },
    /// Checkpoint `index` (0-based) of `total` is about to be analysed.
    Checkpoint {
        /// The checkpoint.
        dir: &'a Path,
        /// Its position.
        index: usize,
        /// How many there are.
        total: usize,
    },
    /// Codes extracted so far for one set of a fuzzy-logic checkpoint.
    LogicCodes {
        /// The checkpoint's name.
        name: &'a str,
        /// `id` or `ood`.
        set: &'a str,
        /// Sequences done.
        done: usize,
        /// Sequences in the set.
        total: usize,
    },
    /// Codes extracted so far for one set of a checkpoint.
    Codes {
        /// The checkpoint's name.
        name: &'a str,
        /// ID or OOD.
        set: Set,
        /// Problems done.
        done: usize,
        /// Problems in the set.
        total: usize,
    },
    /// Latent-code analysis steps done for a checkpoint.
    Analysis {
        /// The checkpoint's name.
        name: &'a str,
        /// Steps done.
        done: usize,
        /// Steps in all.
        total: usize,
    },
    /// Steps of a checkpoint's latent-code transplant done (`hyperlens_probe::latent_transplant`'s
    /// steps: an ID batch read for the donors, or one layer of an OOD batch).
    Causal {
        /// The checkpoint's name.
        name: &'a str,
        /// Steps done.
        done: usize,
        /// Steps in all.
        total: usize,
    },
    /// Figures of `done` of `total` checkpoints drawn.
    Figures {
        /// Checkpoints done.
        done: usize,
        /// Checkpoints in all.
        total: usize,
    },
}

/// What [`crate::run`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSummary {
    /// The HTML page.
    pub index_html: PathBuf,
    /// Checkpoints analysed.
    pub checkpoints: usize,
    /// Wall-clock seconds.
    pub elapsed_s: f64,
}

/// The attention of one OOD problem (the first of the OOD probe set, so row 0 of
/// `codes/{name}_ood.npz` is `pattern[.., .., query, keys]` of the paper's site).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSample {
    /// Normalised attention. # Shapes: `[L, H, T, T]` (`[layer, head, query, key]`).
    pub pattern: Array4<f32>,
    /// Value shown by each token, -1 for the query tokens. # Shapes: `[T]`.
    pub tokens: Vec<i64>,
    /// Answer values in column-2 slot order. # Shapes: `[F]`.
    pub target: Vec<i64>,
    /// The model's predicted answer values. # Shapes: `[F]`.
    pub prediction: Vec<i64>,
    /// Rule per feature slot. # Shapes: `[F]`.
    pub rules: Vec<i64>,
    /// The paper's site (`Site::Paper` resolved for the checkpoint's task).
    pub site: hyperlens_model::CodeSite,
}

/// Seconds spent on the stages of one checkpoint (not in the committed files: `timings.json`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StageSeconds {
    /// Loading the checkpoint and measuring ID / OOD accuracy.
    pub evaluation: f64,
    /// Extracting the ID and OOD codes.
    pub codes: f64,
    /// The attention sample.
    pub attention: f64,
    /// The latent-code analyses and their tables.
    pub analysis: f64,
    /// The transplant test of the section "Is the latent code causal?".
    pub causal: f64,
}

/// What the report found for one checkpoint.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Directory name.
    pub name: String,
    /// Checkpoint directory.
    pub dir: PathBuf,
    /// Mixer.
    pub mixer: Mixer,
    /// Split the checkpoint was trained (and is evaluated) on.
    pub split: SplitName,
    /// Task shape: feature slots `F` and values `M` (for the chance level).
    pub task: SravenParams,
    /// In-distribution accuracy and loss.
    pub id: EvalMetrics,
    /// OOD accuracy and loss.
    pub ood: EvalMetrics,
    /// The latent-code analyses (ID codes train the probes, OOD codes test them).
    pub latent: LatentReport,
    /// The training log, if any.
    pub training: Training,
    /// Updates trained and planned, if recorded.
    pub steps: Option<Steps>,
    /// The attention of the first OOD problem.
    pub attention: AttentionSample,
    /// The transplant test (`None` when the report runs it on no problem).
    pub causal: Option<crate::data::CausalResult>,
    /// Seconds per stage.
    pub seconds: StageSeconds,
}

/// The transplant test of one checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct CausalResult {
    /// Unpermuted problems per set (ID donors, OOD receivers).
    pub n: usize,
    /// The answer slot whose site is transplanted (the paper's: the last).
    pub slot: usize,
    /// The site ([`hyperlens_probe::transplant_site`]): query `8 F + slot`, keys the slot's
    /// tokens in the answer's row (`6 F + slot`, `7 F + slot`).
    pub site: hyperlens_model::CodeSite,
    /// Values per feature (the chance level of a changed answer is `1 / (M - 1)`).
    pub values: usize,
    /// Per layer, one row per [`TransplantKind`] (in the order of [`TransplantKind::ALL`]).
    pub rows: Vec<TransplantRow>,
}

impl CausalResult {
    /// The row of `layer` and `kind`.
    pub fn row(&self, layer: usize, kind: TransplantKind) -> Option<&TransplantRow> {
        self.rows
            .iter()
            .find(|r| r.layer == layer && r.kind == kind)
    }

    /// Layers tested.
    pub fn layers(&self) -> usize {
        self.rows.iter().map(|r| r.layer + 1).max().unwrap_or(0)
    }

    /// The fraction of `kind`'s pairs at `layer` whose answer became the donor rule's, or with
    /// `changed` whose answer changed at all (NaN without the row or a pair), by
    /// [`hyperlens_probe::transplant_fraction`].
    pub fn fraction(&self, layer: usize, kind: TransplantKind, changed: bool) -> f64 {
        hyperlens_probe::transplant_fraction(&self.rows, layer, kind, changed)
    }

    /// The largest logit change of the identity transplant over all layers.
    pub fn identity_change(&self) -> f64 {
        self.rows
            .iter()
            .filter(|r| r.kind == TransplantKind::Identity)
            .fold(0.0, |m, r| m.max(r.max_logit_change))
    }
}

/// Fraction `k / n` (NaN for no pair).
pub(crate) fn frac(k: usize, n: usize) -> f64 {
    if n == 0 {
        f64::NAN
    } else {
        k as f64 / n as f64
    }
}

/// Seconds spent on the stages of one logic checkpoint (`timings.json` only).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LogicSeconds {
    /// Loading and the R² of the three sets.
    pub evaluation: f64,
    /// Extracting the ID and OOD codes.
    pub codes: f64,
    /// Term decoding, projections and their tables.
    pub analysis: f64,
}

/// What the report found for one fuzzy-logic checkpoint.
#[derive(Debug, Clone)]
pub struct LogicEntry {
    /// Directory name.
    pub name: String,
    /// Checkpoint directory.
    pub dir: PathBuf,
    /// Mixer.
    pub mixer: Mixer,
    /// The split it was trained and is evaluated on (`seed{N}`).
    pub split: SplitName,
    /// R² (`metric`) and MSE (`loss`) per set, in the order `id`, `ood`, `unknown` (a set without
    /// tasks in the split is left out).
    pub sets: Vec<(&'static str, SetMetrics)>,
    /// Term decoding per layer and for all layers (ID codes train, OOD codes test).
    pub decoding: Vec<TermDecodingRow>,
    /// Trustworthiness (k = 5) of the t-SNE embedding.
    pub tsne_trustworthiness: f64,
    /// Codes embedded with t-SNE.
    pub tsne_points: usize,
    /// Perplexity of the t-SNE (30, or less for fewer than 91 codes).
    pub tsne_perplexity: f64,
    /// The query given to every sequence of the code sets, `[L]`.
    pub fixed_query: Vec<f32>,
    /// The training log, if any.
    pub training: Training,
    /// Updates trained and planned, if recorded.
    pub steps: Option<Steps>,
    /// Seconds per stage.
    pub seconds: LogicSeconds,
}

impl LogicEntry {
    /// The R² of set `name` (`id`, `ood`, `unknown`), if measured.
    pub fn r2(&self, name: &str) -> Option<f64> {
        self.sets
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, m)| m.metric)
    }

    /// The row of all layers of the term decoding.
    pub fn all_layers(&self) -> Option<&TermDecodingRow> {
        self.decoding.iter().find(|r| r.layer.is_none())
    }
}

/// One run's numbers, as the aggregate sees them.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPoint {
    /// The checkpoint's name.
    pub name: String,
    /// SRAVEN or logic.
    pub task: Task,
    /// Its group's key: `(setting, value)` pairs.
    pub key: Vec<(String, String)>,
    /// Its seed, if recorded.
    pub seed: Option<u64>,
    /// Metric name and value, in a fixed order per task (module docs of [`crate::aggregate::metric_names`]).
    pub metrics: Vec<(String, f64)>,
}

/// One group of runs that differ only in seed (and split).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// SRAVEN or logic.
    pub task: Task,
    /// The settings that define it.
    pub key: Vec<(String, String)>,
    /// Its label: the settings that vary between the groups of its task (`mixer=hyla, steps=40`),
    /// or the mixer when nothing else varies.
    pub label: String,
    /// Indices of its runs in the points.
    pub runs: Vec<usize>,
    /// Per metric ([`crate::aggregate::metric_names`]): `(name, mean, se, n)`.
    pub stats: Vec<(String, f64, f64, usize)>,
}

impl Group {
    /// The value of setting `key` in this group.
    pub fn setting(&self, key: &str) -> Option<&str> {
        self.key
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `(mean, se, n)` of `metric`.
    pub fn stat(&self, metric: &str) -> Option<(f64, f64, usize)> {
        self.stats
            .iter()
            .find(|(m, ..)| m == metric)
            .map(|&(_, m, s, n)| (m, s, n))
    }
}

/// The groups of the report, per task in order of first appearance, and the settings that vary
/// between groups of the same task (the swept axes, mixer first).
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    /// The runs.
    pub points: Vec<RunPoint>,
    /// The groups.
    pub groups: Vec<Group>,
    /// Per task, the settings that vary between its groups.
    pub axes: Vec<(Task, Vec<String>)>,
}

/// The figures of one checkpoint and the sentence said instead of a missing training figure.
pub type CheckpointFigures = (Vec<FigureRef>, Option<String>);

/// The fuzzy-logic checkpoints of the report and their figures (in the same order).
#[derive(Debug, Clone, Copy)]
pub struct LogicPart<'a> {
    /// The checkpoints.
    pub entries: &'a [crate::data::LogicEntry],
    /// Their figures.
    pub figures: &'a [CheckpointFigures],
}

/// The SRAVEN figures that span all checkpoints.
#[derive(Debug, Clone, Default)]
pub struct CrossFigures<'a> {
    /// ID and OOD accuracy per checkpoint (`None` without SRAVEN checkpoints).
    pub accuracy: Option<FigureRef>,
    /// Rule decoding per layer, all checkpoints (`None` for fewer than two).
    pub comparison: Option<FigureRef>,
    /// The transplant test's figures ("Is the latent code causal?").
    pub causal: &'a [FigureRef],
}
