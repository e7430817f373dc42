//! The fuzzy-logic part of the report (Schug et al. 2025, the fuzzy-logic experiments: Table A1,
//! Fig. 2B / 2D / A2; `docs/spec/sraven.md`, "The fuzzy-logic task"). For every logic checkpoint
//! it measures the paper's R² on the ID tasks, on held-out pairs of known terms (OOD) and on pairs
//! of unknown terms; extracts the latent codes of the paper's site (the last token's attention to
//! itself, `[L, H]` per sequence) on fixed-query ID and OOD sets; decodes the task's terms from
//! them (ridge R², per-term F1 with the base-rate and shuffled-label controls); projects them
//! (PCA and t-SNE); and draws the training curves. The section of the page sets the OOD R² beside
//! Table A1.
//!
//! Split by concern like the SRAVEN part: `measure` (evaluation, codes and their analyses: the
//! only part that runs the model), then `figures`, `text` (the sentences and small formatting
//! helpers), `page` (the section of the page) and `files` (`tables/logic.csv` and the part of
//! `summary.json`). This module holds the entry's data types and the paper's numbers.

use std::path::PathBuf;

use hyperlens_analysis::terms::TermDecodingRow;
use hyperlens_train::SetMetrics;

use crate::discover::{Steps, Training};

mod figures;
mod files;
mod measure;
mod page;
mod text;

pub use figures::{logic_figures, write_projection_figures};
pub use files::{logic_csv, summary};
pub(crate) use measure::analyse_logic_checkpoint;
pub use page::section;
pub(crate) use text::steps_text;
pub use text::{decoding_text, paper_paragraphs};

/// The paper's OOD R² of the fuzzy-logic task per mixer: `(mixer, mean %, standard error %)` over
/// three seeds (Schug et al. 2025, Table A1: sequences of 32, 70 % of the known-term pairs held
/// out, 2 layers, D 128, H 8, 50,000 steps).
pub const PAPER_LOGIC_OOD_R2: [(&str, f64, f64); 3] = [
    ("hyla", 81.1, 7.8),
    ("softmax", 63.3, 2.3),
    ("linear", 59.9, 5.2),
];

/// The paper's training budget of the fuzzy-logic task, in updates.
pub const PAPER_LOGIC_STEPS: u64 = 50_000;

/// Codes embedded with t-SNE per checkpoint (the first ones of the OOD set).
pub const TSNE_POINTS: usize = 1_000;

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
    /// Mixer (CLI name).
    pub mixer: String,
    /// The split it was trained and is evaluated on (`seed{N}`).
    pub split: String,
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
