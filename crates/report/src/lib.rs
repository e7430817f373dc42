//! hyperlens-report: the main job of hyperlens. For every SRAVEN checkpoint it measures ID / OOD
//! accuracy, extracts the latent codes of the paper's site (docs/spec/latent-codes.md) on
//! unpermuted ID and OOD problems, runs the latent-code analyses (PCA, rule decoding ID -> OOD,
//! k-means, similarity), reads the training log when there is one, captures the attention of one
//! OOD problem, runs the transplant test of the latent code ([`causal`]), and writes tables, codes, figures and a page in Markdown and HTML that compares
//! the checkpoints side by side and with the paper (Schug et al., "Attention as a Hypernetwork",
//! ICLR 2025). Every figure comes with sentences generated from its numbers. Fuzzy-logic
//! checkpoints get a section of their own ([`logic`]): R² per set, term decoding from the latent
//! codes, projections and training curves, set beside Table A1.
//!
//! The modules, in the order of the job: [`discover`] (which checkpoints, what their run files
//! say), [`evaluate`] and [`logic`] (the only modules that run the model), [`figures`] with [`text`],
//! [`verdict`] and [`paper`] (what the numbers say), [`page`] (the page as a [`doc::Document`]),
//! [`html`] (its HTML; Markdown to HTML is pulldown-cmark's job) and [`files`] (the tables).
//!
//! Output directory (`reports/default` by default): `index.md`, `index.html`, `summary.json`,
//! `aggregate.csv` (mean ± s.e. over seeds per group, [`aggregate`]), `tables/accuracy.csv`
//! (SRAVEN), `tables/causal.csv` (the transplant test), `tables/logic.csv` (logic), `tables/<name>/` (the latent-code
//! tables), `codes/<name>_{id,ood}.npz`
//! with their sidecars, `codes/<name>_attention.npz`, `figures/`; and `timings.json`, the only
//! file that differs between two runs on the same checkpoints.

pub mod aggregate;
pub mod causal;
pub mod discover;
pub mod doc;
pub mod error;
pub mod evaluate;
pub mod figures;
pub mod files;
pub mod html;
pub mod logic;
pub mod page;
pub mod paper;
mod staging;
pub mod text;
pub mod verdict;

use std::path::{Path, PathBuf};
use std::time::Instant;

use hyperlens_model::Device;
use hyperlens_tasks::sraven::Set;
use rayon::prelude::*;

pub use error::{ReportError, Result};

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
    /// The split of checkpoints whose run files do not name one.
    pub split: String,
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

impl Default for ReportParams {
    fn default() -> Self {
        Self {
            checkpoints: Vec::new(),
            checkpoint_root: PathBuf::from("data/checkpoints"),
            out: PathBuf::from("reports/default"),
            n: 2048,
            split: "paper-seed0".into(),
            seed: 0,
            device: Device::Cpu,
            batch: 256,
            causal_n: 128,
            aggregate: false,
        }
    }
}

/// Progress of [`run`], reported to its callback.
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
    /// Figures of `done` of `total` checkpoints drawn.
    Figures {
        /// Checkpoints done.
        done: usize,
        /// Checkpoints in all.
        total: usize,
    },
}

/// What [`run`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSummary {
    /// The HTML page.
    pub index_html: PathBuf,
    /// Checkpoints analysed.
    pub checkpoints: usize,
    /// Wall-clock seconds.
    pub elapsed_s: f64,
}

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
/// holds something other than a report; the errors of [`discover::checkpoints`]; any failure on a
/// checkpoint, as [`ReportError::Checkpoint`] naming it; a failed figure or write.
pub fn run(params: &ReportParams, progress: &mut dyn FnMut(Progress<'_>)) -> Result<ReportSummary> {
    if params.n < 16 {
        return Err(ReportError::InvalidInput(format!(
            "n = {}: the report needs at least 16 problems per set",
            params.n
        )));
    }
    if params.batch == 0 {
        return Err(ReportError::InvalidInput("batch must be positive".into()));
    }
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

/// [`run`] into `params.out`, which is the staging directory.
fn build(params: &StagedParams, progress: &mut dyn FnMut(Progress<'_>)) -> Result<ReportSummary> {
    let start = Instant::now();
    let found = discover::checkpoints(&params.checkpoints, &params.checkpoint_root)?;
    for (dir, task) in &found.skipped {
        progress(Progress::Skipped { dir, task: *task });
    }
    let out = &params.out;
    for sub in ["figures", "tables", "codes"] {
        let d = out.join(sub);
        std::fs::create_dir_all(&d).map_err(|source| ReportError::Io { path: d, source })?;
    }
    let total = found.len();
    // The fuzzy-logic checkpoints run on a second thread beside the SRAVEN ones (both on rayon's
    // pool), so that one's single-threaded stretches (sampling, loading, writing) overlap the
    // other's parallel ones. Only the SRAVEN checkpoints draw progress bars.
    let (entries, logic_entries) = std::thread::scope(|scope| -> Result<_> {
        for (i, dir) in found.logic.iter().enumerate() {
            progress(Progress::Checkpoint {
                dir,
                index: found.sraven.len() + i,
                total,
            });
        }
        let logic = scope.spawn(|| -> Result<Vec<logic::LogicEntry>> {
            found
                .logic
                .iter()
                .map(|dir| {
                    logic::analyse_logic_checkpoint(params, dir, &mut |_| {})
                        .map_err(|e| e.in_checkpoint(dir))
                })
                .collect()
        });
        let mut entries = Vec::with_capacity(found.sraven.len());
        for (index, dir) in found.sraven.iter().enumerate() {
            progress(Progress::Checkpoint { dir, index, total });
            let entry = evaluate::analyse_checkpoint(params, dir, progress)
                .map_err(|e| e.in_checkpoint(dir));
            match entry {
                Ok(entry) => entries.push(entry),
                Err(e) => {
                    let _ = logic.join();
                    return Err(e);
                }
            }
        }
        let logic_entries = logic.join().map_err(|_| {
            ReportError::InvalidInput("the fuzzy-logic checkpoints' thread panicked".into())
        })??;
        Ok((entries, logic_entries))
    })?;
    let t_fig = Instant::now();
    progress(Progress::Figures { done: 0, total });
    // every checkpoint's figures are independent: draw them on rayon's threads
    let (figs, logic_figs) = rayon::join(
        || {
            entries
                .par_iter()
                .map(|e| {
                    figures::checkpoint_figures(e, out).map_err(|err| err.in_checkpoint(&e.dir))
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
    let (figs, logic_figs) = (figs?, logic_figs?);
    progress(Progress::Figures { done: total, total });
    let (accuracy, comparison) = if entries.is_empty() {
        (None, None)
    } else {
        (
            Some(figures::accuracy_figure(
                &entries,
                out,
                verdict::accuracy_text(&entries),
            )?),
            figures::comparison_figure(&entries, out)?,
        )
    };
    let causal_figs = causal::figures(&entries, out)?;
    let agg = aggregate::Aggregate::new(aggregate::points(&entries, &logic_entries));
    let show_aggregate = params.aggregate || agg.has_replicates();
    let agg_figs = if show_aggregate {
        aggregate::figures(&agg, out)?
    } else {
        Vec::new()
    };
    let figures_s = t_fig.elapsed().as_secs_f64();
    let logic = page::LogicPart {
        entries: &logic_entries,
        figures: &logic_figs,
    };
    let summary = files::summary(&entries, &figs, comparison.as_ref(), &logic, &agg, params);
    let doc = page::document(
        &entries,
        &figs,
        page::CrossFigures {
            accuracy,
            comparison,
            causal: &causal_figs,
        },
        &logic,
        show_aggregate.then_some((&agg, agg_figs.as_slice())),
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
            &files::accuracy_csv(&entries),
        )?;
    }
    if entries.iter().any(|e| e.causal.is_some()) {
        files::write_text(&out.join("tables/causal.csv"), &causal::csv(&entries))?;
    }
    if !logic_entries.is_empty() {
        files::write_text(
            &out.join("tables/logic.csv"),
            &logic::logic_csv(&logic_entries),
        )?;
    }
    hyperlens_io::write_json(&out.join("summary.json"), &summary)?;
    let elapsed_s = start.elapsed().as_secs_f64();
    hyperlens_io::write_json(
        &out.join(files::TIMINGS_FILE),
        &files::timings(&entries, &logic_entries, figures_s, elapsed_s),
    )?;
    Ok(ReportSummary {
        index_html: out.join("index.html"),
        checkpoints: total,
        elapsed_s,
    })
}
