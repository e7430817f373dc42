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
//! only part that runs the model), then `figures` (with `explorer`, the interactive explorer of
//! the codes from the files `measure` wrote), `text` (the sentences and small formatting
//! helpers), `page` (the section of the page) and `files` (`tables/logic.csv` and the part of
//! `summary.json`). This module holds the paper's numbers; the entry's data types are in
//! [`crate::data`].

mod analyze;

mod explorer;

mod figures;

mod files;

mod measure;

mod page;

mod text;

pub use analyze::{analyze_terms_to_dir, TermAnalysis, TermProjections, TermSummary};
pub use figures::{logic_figures, write_projection_figures};
pub use files::{logic_csv, summary, LogicSetSummary, LogicSummary};
pub(crate) use measure::analyse_logic_checkpoint;
pub use page::section;
pub use text::{decoding_text, paper_paragraphs};

/// The paper's OOD R² of the fuzzy-logic task per mixer: `(mixer, mean %, standard error %)` over
/// three seeds (Schug et al. 2025, Table A1: sequences of 32, 70 % of the known-term pairs held
/// out, 2 layers, D 128, H 8, 50,000 steps).
pub const PAPER_LOGIC_OOD_R2: [(hyperlens_model::Mixer, f64, f64); 3] = [
    (hyperlens_model::Mixer::Hyla, 81.1, 7.8),
    (hyperlens_model::Mixer::Softmax, 63.3, 2.3),
    (hyperlens_model::Mixer::Linear, 59.9, 5.2),
];

/// The paper's training budget of the fuzzy-logic task, in updates.
pub const PAPER_LOGIC_STEPS: u64 = 50_000;

/// Codes embedded with t-SNE per checkpoint (the first ones of the OOD set).
pub const TSNE_POINTS: usize = 1_000;
