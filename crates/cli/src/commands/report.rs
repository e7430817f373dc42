//! `hyperlens report`: the main job, run by `hyperlens_report::run` (accuracy, latent codes and
//! their analyses for every checkpoint, figures, and a Markdown + HTML page). This file turns the
//! flags into [`ReportParams`], draws the progress and prints where the page is.

use std::ops::ControlFlow;
use std::path::PathBuf;

use clap::Args;
use hyperlens_model::Device;
use hyperlens_report::{run as run_report, Progress, ReportParams};
use indicatif::ProgressBar;

use super::common::progress_bar;

/// Arguments of `hyperlens report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Checkpoint directories to compare (default: every checkpoint under `data/checkpoints/`).
    #[arg(long, conflicts_with = "sweep")]
    pub checkpoint: Vec<PathBuf>,
    /// A sweep directory (`hyperlens sweep plan`): the report of its finished runs, with the
    /// aggregate over seeds (unfinished runs are listed and left out).
    #[arg(long)]
    pub sweep: Option<PathBuf>,
    /// Output directory [default: reports/default; with --sweep, DIR/report].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Problems per set (ID and OOD, for accuracy and for the codes).
    #[arg(long, default_value_t = 2048)]
    pub n: usize,
    /// Split used for checkpoints that do not name theirs in `train.json` [default: paper-seed0];
    /// a checkpoint that names another is an error (it is evaluated on its own split).
    #[arg(long)]
    pub split: Option<String>,
    /// Seed of the evaluation and probe problems.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Compute device: cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Problems per forward pass.
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Unpermuted ID and OOD problems per SRAVEN checkpoint for the transplant test of the section
    /// "Is the latent code causal?"; 0 leaves the section out.
    #[arg(long, default_value_t = 128)]
    pub causal_n: usize,
    /// With --sweep: list every unfinished run that is left out, one per line (by default one
    /// line counts them).
    #[arg(long)]
    pub verbose: bool,
}

impl ReportArgs {
    /// The library's parameters.
    ///
    /// # Errors
    /// An unknown `--split`.
    fn params(&self) -> anyhow::Result<ReportParams> {
        Ok(ReportParams {
            checkpoints: self.checkpoint.clone(),
            out: self.out.clone().unwrap_or_else(|| match &self.sweep {
                Some(dir) => dir.join("report"),
                None => PathBuf::from("reports/default"),
            }),
            n: self.n,
            split: self.split.as_deref().map(str::parse).transpose()?,
            seed: self.seed,
            device: self.device,
            batch: self.batch,
            causal_n: self.causal_n,
            ..ReportParams::default()
        })
    }
}

/// One progress bar at a time, labelled with the stage (hidden when stderr is not a terminal).
#[derive(Default)]
struct Bars {
    current: Option<(String, ProgressBar)>,
}

impl Bars {
    fn show(&mut self, label: String, done: usize, total: usize, unit: &str) {
        if self.current.as_ref().is_none_or(|(l, _)| *l != label) {
            self.clear();
            let bar = progress_bar(total as u64, &label, unit);
            self.current = Some((label, bar));
        }
        if let Some((_, bar)) = &self.current {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    }

    fn clear(&mut self) {
        if let Some((_, bar)) = self.current.take() {
            bar.finish_and_clear();
        }
    }

    /// Shows `p`; never stops the report (Ctrl-C ends the process, and the staging directory keeps
    /// the previous report whole).
    fn on(&mut self, p: Progress<'_>) -> ControlFlow<()> {
        match p {
            Progress::Skipped { dir, task } => {
                self.clear();
                eprintln!(
                    "report: skipping {} (a {task} checkpoint; the report analyses SRAVEN and \
                     fuzzy-logic checkpoints)",
                    dir.display()
                );
            }
            Progress::Checkpoint { dir, .. } => {
                self.clear();
                eprintln!("report: {}", dir.display());
            }
            Progress::Codes {
                name,
                set,
                done,
                total,
            } => self.show(format!("{name} codes {set}"), done, total, "problems"),
            Progress::LogicCodes {
                name,
                set,
                done,
                total,
            } => self.show(format!("{name} codes {set}"), done, total, "sequences"),
            Progress::Analysis { name, done, total } => {
                self.show(format!("{name} analysis"), done, total, "stages");
            }
            Progress::Causal { name, done, total } => {
                self.show(format!("{name} transplant"), done, total, "steps");
            }
            Progress::Figures { done, total } => {
                self.show("figures".into(), done, total, "checkpoints");
            }
        }
        ControlFlow::Continue(())
    }
}

/// Runs `hyperlens report`.
///
/// # Errors
/// A bad `--n` or `--batch`, no checkpoint, a bad checkpoint (named), an unavailable device, a
/// failed analysis or write.
pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    if args.n < 16 || args.batch == 0 {
        anyhow::bail!("--n must be at least 16 and --batch positive");
    }
    let mut params = args.params()?;
    if let Some(dir) = &args.sweep {
        params.checkpoints = sweep_checkpoints(dir, args.verbose)?;
        params.aggregate = true;
    }
    let mut bars = Bars::default();
    let summary = run_report(&params, &mut |p| bars.on(p));
    bars.clear();
    let summary = summary?;
    let n = summary.checkpoints;
    outln!(
        "wrote {} ({n} checkpoint{}, {:.0} s)",
        summary.index_html.display(),
        if n == 1 { "" } else { "s" },
        summary.elapsed_s
    )?;
    Ok(())
}

/// The finished runs of the sweep in `dir`, in plan order; the others are counted on stderr in one
/// line (listed one per line with `verbose`).
///
/// # Errors
/// A directory without a plan (or with a damaged one); a sweep with no finished run.
fn sweep_checkpoints(dir: &std::path::Path, verbose: bool) -> anyhow::Result<Vec<PathBuf>> {
    use hyperlens_sweep::{sweep_status, Plan, RunState};
    let plan = Plan::read(dir)?;
    let mut out = Vec::new();
    let mut left = Vec::new();
    for s in sweep_status(dir, &plan)? {
        if s.state == RunState::Finished {
            out.push(Plan::run_dir(dir, &s.name));
        } else {
            left.push(s);
        }
    }
    if !out.is_empty() && !left.is_empty() {
        if verbose {
            for s in &left {
                eprintln!("report: leaving out {} ({})", s.name, s.state);
            }
        } else {
            let mut counts: Vec<(RunState, usize)> = Vec::new();
            for s in &left {
                match counts.iter_mut().find(|(st, _)| *st == s.state) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((s.state, 1)),
                }
            }
            let counts: Vec<String> = counts.iter().map(|(st, n)| format!("{n} {st}")).collect();
            eprintln!(
                "report: leaving out {} of {} runs that are not finished ({}); --verbose lists them",
                left.len(),
                plan.runs.len(),
                counts.join(", ")
            );
        }
    }
    if out.is_empty() {
        anyhow::bail!(
            "--sweep {}: no run is finished yet (see `hyperlens sweep status {}`)",
            dir.display(),
            dir.display()
        );
    }
    Ok(out)
}
