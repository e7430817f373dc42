//! hyperlens-report: the main job of hyperlens. For every SRAVEN checkpoint it measures ID / OOD
//! accuracy, extracts the latent codes of the paper's site (docs/spec/latent-codes.md) on
//! unpermuted ID and OOD problems, runs the latent-code analyses (PCA, rule decoding ID -> OOD,
//! k-means, similarity), reads the training log when there is one, captures the attention of one
//! OOD problem, runs the transplant test of the latent code ([`causal`]), and writes tables,
//! codes, figures and a page in Markdown and HTML that compares the checkpoints side by side and with the paper (Schug et al., "Attention as a Hypernetwork",
//! ICLR 2025). Every figure comes with sentences generated from its numbers. Fuzzy-logic
//! checkpoints get a section of their own ([`logic`]): R² per set, term decoding from the latent
//! codes, projections and training curves, set beside Table A1.
//!
//! Every section follows one layout, in the order of the job: `measure` (the only code that runs
//! the model), then `figures`, `text` (what the numbers say), `page` (its part of the page as a
//! [`doc::Document`]) and `files` (its tables). The sections are [`sraven`], [`causal`] (the
//! transplant test of the latent code), [`logic`] and [`aggregate`] (statistics over seeds). Around
//! them: [`discover`] (which checkpoints, what their run files say), [`data`] (every data type the
//! stages pass on, so that no module imports its producer's module and the crate has no import
//! circle), [`words`] and [`plots`] (formatting and figure helpers shared by the sections),
//! [`page`] (the whole page), [`html`] (its HTML; Markdown to HTML is pulldown-cmark's job) and
//! [`files`] (`summary.json`, `timings.json`, atomic writes).
//!
//! Output directory (`reports/default` by default): `index.md`, `index.html`, `summary.json`,
//! `aggregate.csv` (mean ± s.e. over seeds per group, [`aggregate`]), `tables/accuracy.csv`
//! (SRAVEN), `tables/causal.csv` (the transplant test), `tables/logic.csv` (logic),
//! `tables/<name>/` (the latent-code tables), `codes/<name>_{id,ood}.npz` with their sidecars, `codes/<name>_attention.npz`, `figures/`; and `timings.json`, the only
//! file that differs between two runs on the same checkpoints.

pub mod aggregate;
pub mod causal;
pub mod circuit_figures;
pub mod code_explorer;
pub mod data;
pub mod discover;
pub mod doc;
pub mod error;
pub mod files;
pub mod html;
pub mod intervention_figures;
pub mod lm_explorer;
pub mod lm_study;
pub mod logic;
pub mod page;
pub mod plots;
pub mod sraven;
mod staging;
pub mod words;

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use data::{
    Aggregate, CheckpointFigures, CrossFigures, Entry, LogicEntry, LogicPart, StagedParams,
};
use doc::FigureRef;
use rayon::prelude::*;

pub use data::{Progress, ReportParams, ReportSummary};
use error::tell;
pub use error::{ReportError, Result};

/// Runs the report: discovers the checkpoints, analyses each, draws the figures and writes the
/// page and tables into `params.out` (see the crate documentation for the files). Two runs with
/// the same checkpoints and parameters write the same bytes, except `timings.json`.
///
/// The report is built in a staging directory beside `params.out` (`.<name>.staging-<pid>`) and
/// swapped in only when complete, so a killed run leaves the previous report whole (and perhaps
/// a staging directory, which the next run removes), never a mix of old and new files. An existing
/// `params.out` is replaced as a whole, so it must be a previous report (it holds `summary.json`)
/// or empty.
///
/// # Errors
/// [`ReportError::InvalidInput`] for `n < 16` or `batch == 0` (before any work), or an `out` that
/// holds something other than a report; [`ReportError::Tasks`] for an unknown `split` or problem
/// sets over the memory budget (before any work); the errors of [`discover::checkpoints`]; any failure on a
/// checkpoint, as [`ReportError::Checkpoint`] naming it; a failed figure or write;
/// [`ReportError::Interrupted`] when `progress` breaks (it is called at every stage, every batch of
/// codes and every analysis and transplant step; the fuzzy-logic checkpoints, measured on a second
/// thread, stop at their next batch or step).
pub fn run(
    params: &ReportParams,
    progress: &mut dyn FnMut(Progress<'_>) -> ControlFlow<()>,
) -> Result<ReportSummary> {
    if params.n < 16 {
        return Err(ReportError::InvalidInput(format!(
            "n = {}: the report needs at least 16 problems per set",
            params.n
        )));
    }
    if params.batch == 0 {
        return Err(ReportError::InvalidInput("batch must be positive".into()));
    }
    // Each SRAVEN checkpoint holds its n ID and n OOD problems at once (and the transplant test
    // its causal_n of each): refused here, before any work, when they cannot fit the budget.
    let task = hyperlens_tasks::sraven::SravenParams::default();
    hyperlens_io::budget::check_alloc(
        format!(
            "the report's problem sets (n = {}, causal_n = {})",
            params.n, params.causal_n
        ),
        task.set_bytes(params.n.max(params.causal_n))
            .saturating_mul(2),
    )
    .map_err(hyperlens_tasks::error::TasksError::from)?;
    let target = params.out.clone();
    let staging = staging::prepare(&target)?;
    let staged = StagedParams {
        params: ReportParams {
            out: staging.clone(),
            ..params.clone()
        },
        shown_out: target.clone(),
    };
    let summary = build(&staged, progress);
    let summary = match summary {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    staging::swap(&staging, &target)?;
    Ok(ReportSummary {
        index_html: target.join("index.html"),
        ..summary
    })
}

/// [`run`] into `params.out`, which is the staging directory: measure every checkpoint, draw the
/// figures, write the page and the tables.
fn build(
    params: &StagedParams,
    progress: &mut dyn FnMut(Progress<'_>) -> ControlFlow<()>,
) -> Result<ReportSummary> {
    let start = Instant::now();
    let found = discover::checkpoints(&params.checkpoints, &params.checkpoint_root)?;
    for (dir, task) in &found.skipped {
        tell(progress, Progress::Skipped { dir, task: *task })?;
    }
    let out = &params.out;
    for sub in ["figures", "tables", "codes"] {
        let d = out.join(sub);
        std::fs::create_dir_all(&d).map_err(|source| ReportError::Io { path: d, source })?;
    }
    let (entries, logic_entries) = measure(params, &found, progress)?;
    let t_fig = Instant::now();
    let total = found.len();
    tell(progress, Progress::Figures { done: 0, total })?;
    let figures = draw(&entries, &logic_entries, params)?;
    tell(progress, Progress::Figures { done: total, total })?;
    let figures_s = t_fig.elapsed().as_secs_f64();
    write(&entries, &logic_entries, &figures, params)?;
    let elapsed_s = start.elapsed().as_secs_f64();
    hyperlens_io::write_json_sorted(
        &out.join(files::TIMINGS_FILE),
        &files::timings(&entries, &logic_entries, figures_s, elapsed_s),
    )?;
    Ok(ReportSummary {
        index_html: out.join("index.html"),
        checkpoints: total,
        elapsed_s,
    })
}

/// The measure stage of every checkpoint. The fuzzy-logic checkpoints run on a second thread beside
/// the SRAVEN ones (both on rayon's pool), so that one's single-threaded stretches (sampling,
/// loading, writing) overlap the other's parallel ones. Only the SRAVEN checkpoints draw progress
/// bars; the logic thread stops at its next step once the SRAVEN side has stopped or failed.
///
/// # Errors
/// The first checkpoint's failure, as [`ReportError::Checkpoint`] naming it;
/// [`ReportError::Interrupted`] when `progress` breaks.
fn measure(
    params: &StagedParams,
    found: &discover::Discovered,
    progress: &mut dyn FnMut(Progress<'_>) -> ControlFlow<()>,
) -> Result<(Vec<Entry>, Vec<LogicEntry>)> {
    let total = found.len();
    for (i, dir) in found.logic.iter().enumerate() {
        let index = found.sraven.len() + i;
        tell(progress, Progress::Checkpoint { dir, index, total })?;
    }
    let stopped = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<_> {
        let logic = scope.spawn(|| -> Result<Vec<LogicEntry>> {
            let mut go_on = |_: Progress<'_>| {
                if stopped.load(Ordering::Relaxed) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            };
            found
                .logic
                .iter()
                .map(|dir| {
                    logic::analyse_logic_checkpoint(params, dir, &mut go_on)
                        .map_err(|e| e.in_checkpoint(dir))
                })
                .collect()
        });
        let mut entries = Vec::with_capacity(found.sraven.len());
        for (index, dir) in found.sraven.iter().enumerate() {
            let entry = tell(progress, Progress::Checkpoint { dir, index, total })
                .and_then(|()| sraven::measure::analyse_checkpoint(params, dir, progress))
                .map_err(|e| e.in_checkpoint(dir));
            match entry {
                Ok(entry) => entries.push(entry),
                Err(e) => {
                    stopped.store(true, Ordering::Relaxed);
                    let _ = logic.join();
                    return Err(e);
                }
            }
        }
        let logic_entries = logic.join().map_err(|_| {
            ReportError::InvalidInput("the fuzzy-logic checkpoints' thread panicked".into())
        })??;
        Ok((entries, logic_entries))
    })
}

/// Every figure of the report, as the page receives them.
struct Figures {
    /// Per SRAVEN checkpoint.
    sraven: Vec<CheckpointFigures>,
    /// Per fuzzy-logic checkpoint.
    logic: Vec<CheckpointFigures>,
    /// ID and OOD accuracy of all SRAVEN checkpoints.
    accuracy: Option<FigureRef>,
    /// Rule decoding per layer of all SRAVEN checkpoints.
    comparison: Option<FigureRef>,
    /// The transplant test's.
    causal: Vec<FigureRef>,
    /// The aggregate over seeds, and its figures when the page shows it.
    aggregate: Aggregate,
    /// The aggregate's figures; `None` when the page leaves the aggregate out.
    aggregate_figures: Option<Vec<FigureRef>>,
}

/// The figures stage: every checkpoint's figures (independent, drawn on rayon's threads), then
/// the figures across checkpoints.
///
/// # Errors
/// A figure that cannot be drawn or written (a checkpoint's as [`ReportError::Checkpoint`]).
fn draw(entries: &[Entry], logic_entries: &[LogicEntry], params: &StagedParams) -> Result<Figures> {
    let out = &params.out;
    let (sraven_figs, logic_figs) = rayon::join(
        || {
            entries
                .par_iter()
                .map(|e| {
                    sraven::figures::checkpoint_figures(e, out)
                        .map_err(|err| err.in_checkpoint(&e.dir))
                })
                .collect::<Result<Vec<_>>>()
        },
        || {
            logic_entries
                .par_iter()
                .map(|e| logic::logic_figures(e, out).map_err(|err| err.in_checkpoint(&e.dir)))
                .collect::<Result<Vec<_>>>()
        },
    );
    let (accuracy, comparison) = if entries.is_empty() {
        (None, None)
    } else {
        (
            Some(sraven::figures::accuracy_figure(
                entries,
                out,
                sraven::verdict::accuracy_text(entries),
            )?),
            sraven::figures::comparison_figure(entries, out)?,
        )
    };
    let aggregate = Aggregate::new(aggregate::points(entries, logic_entries));
    let aggregate_figures = if params.aggregate || aggregate.has_replicates() {
        Some(aggregate::figures(&aggregate, out)?)
    } else {
        None
    };
    Ok(Figures {
        sraven: sraven_figs?,
        logic: logic_figs?,
        accuracy,
        comparison,
        causal: causal::figures(entries, out)?,
        aggregate,
        aggregate_figures,
    })
}

/// The page and files stage: `index.md`, `index.html`, `summary.json`, `aggregate.csv` and the
/// tables.
///
/// # Errors
/// A failed write.
fn write(
    entries: &[Entry],
    logic_entries: &[LogicEntry],
    figures: &Figures,
    params: &StagedParams,
) -> Result<()> {
    let out = &params.out;
    let logic = LogicPart {
        entries: logic_entries,
        figures: &figures.logic,
    };
    let agg = &figures.aggregate;
    let summary = files::summary(
        entries,
        &figures.sraven,
        figures.comparison.as_ref(),
        &logic,
        agg,
        params,
    );
    let doc = page::document(
        entries,
        &figures.sraven,
        CrossFigures {
            accuracy: figures.accuracy.clone(),
            comparison: figures.comparison.clone(),
            causal: &figures.causal,
        },
        &logic,
        figures.aggregate_figures.as_deref().map(|f| (agg, f)),
        params,
    );
    files::write_text(&out.join(aggregate::AGGREGATE_FILE), &agg.csv())?;
    files::write_text(&out.join("index.md"), &doc.to_markdown())?;
    files::write_text(
        &out.join("index.html"),
        &html::to_html(&doc, "hyperlens report"),
    )?;
    if !entries.is_empty() {
        files::write_text(
            &out.join("tables/accuracy.csv"),
            &sraven::files::accuracy_csv(entries),
        )?;
    }
    if entries.iter().any(|e| e.causal.is_some()) {
        files::write_text(&out.join("tables/causal.csv"), &causal::csv(entries))?;
    }
    if !logic_entries.is_empty() {
        files::write_text(
            &out.join("tables/logic.csv"),
            &logic::logic_csv(logic_entries),
        )?;
    }
    hyperlens_io::write_json_sorted(&out.join("summary.json"), &summary)?;
    Ok(())
}
