//! `hyperlens eval`: accuracy (all features right), per-feature accuracy and loss of a checkpoint on
//! a SRAVEN problem set, either read from a `.npz` file or sampled from a split; on a fuzzy-logic
//! checkpoint, MSE and the paper's R² (per sequence `1 - err² / var(targets)`, averaged) per set.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use hyperlens_model::{Config, Device, Evaluator, Task};
use hyperlens_probe::evaluation::check_logits_budget;
use hyperlens_probe::{evaluate_problems, write_logits, SravenProblems};
use hyperlens_tasks::npz::load_problems;
use hyperlens_tasks::sraven::SampleStream;
use hyperlens_train::logic_eval::{evaluate_logic, LogicEvalSource, LogicSetEval};
use hyperlens_train::TrainSettings;
use std::io::Write as _;

use super::common::{progress_bar, sraven_params, ProblemArgs, ProblemSource};
use super::dispatch::{logic_set, resolve_split, Checkpoint};

/// Arguments of `hyperlens eval`. On a fuzzy-logic checkpoint (its train.json says `task: logic`)
/// it prints MSE and R² per set instead ([`eval_logic`]).
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The checkpoint directory (config.json + model.safetensors).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Where the problems come from (a file, or sampled from a split).
    #[command(flatten)]
    pub problems: ProblemArgs,
    /// Compute device: cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Problems per forward pass (memory is bounded by this).
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Print one JSON object: accuracy, per_feature_accuracy, loss, n.
    #[arg(long)]
    pub json: bool,
    /// Write logits [N, F, M] (f32), pred [N, F] and y [N, F] (i64) to this `.npz` file.
    #[arg(long)]
    pub save_logits: Option<PathBuf>,
}

/// Runs `hyperlens eval`. Sampled problems are streamed in batches, so memory is bounded by
/// `--batch` (plus the logits when `--save-logits` keeps them, which the memory budget checks).
///
/// # Errors
/// A bad checkpoint, problem file, split or flag; an unavailable device; a size over the memory
/// budget; a failed write.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    if args.batch == 0 {
        bail!("--batch must be positive");
    }
    let device = args.device.to_candle()?;
    let model = Evaluator::load(&args.checkpoint, &device)?;
    let cfg = model.config().clone();
    if let Checkpoint::Logic(settings) = super::dispatch::checkpoint(&args.checkpoint)? {
        return eval_logic(&args, &model, &settings);
    }
    let params = sraven_params(&args.checkpoint, &cfg)?;
    let source = args.problems.resolve(&args.checkpoint, params)?;
    let keep = args.save_logits.is_some();
    if let Some(path) = &args.save_logits {
        super::common::create_parent("--save-logits", path)?;
    }
    let (problems, what) = match source {
        ProblemSource::File(path) => (
            SravenProblems::Set(load_problems(&path, &params)?),
            path.display().to_string(),
        ),
        ProblemSource::Sampled {
            split,
            set,
            n,
            seed,
            unpermuted,
        } => {
            check_logits_budget_if(keep, n, &cfg)?;
            let kind = if unpermuted { "unpermuted" } else { "permuted" };
            let what = format!("{} {set}, seed {seed}, {kind}", split.name);
            let stream = SampleStream::new(&split, set, seed, unpermuted)?;
            (SravenProblems::Sampled { stream, n }, what)
        }
    };
    let n = problems.len();
    let bar = progress_bar(n as u64, "eval", "problems");
    let out = evaluate_problems(&model, problems, args.batch, keep, |done| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    if let Some(path) = &args.save_logits {
        write_logits(path, &out)?;
    }
    let m = &out.metrics;
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let line = SravenLine {
            accuracy: m.accuracy,
            loss: m.loss,
            n: m.n,
            per_feature_accuracy: &m.per_feature_accuracy,
        };
        writeln!(stdout, "{}", serde_json::to_string(&line)?)?;
    } else {
        writeln!(
            stdout,
            "checkpoint   {} ({}, {} parameters)",
            args.checkpoint.display(),
            cfg.mixer,
            cfg.n_params()
        )?;
        writeln!(stdout, "problems     {what}: {n}")?;
        writeln!(
            stdout,
            "accuracy     {:.2} % (all {} features right)",
            100.0 * m.accuracy,
            cfg.n_outputs
        )?;
        let per: Vec<String> = m
            .per_feature_accuracy
            .iter()
            .map(|a| format!("{:.2} %", 100.0 * a))
            .collect();
        writeln!(stdout, "per feature  {}", per.join("  "))?;
        writeln!(stdout, "loss         {:.4}", m.loss)?;
        if let Some(p) = &args.save_logits {
            writeln!(stdout, "logits       {}", p.display())?;
        }
    }
    Ok(())
}

/// The line `hyperlens eval --json` prints for a SRAVEN checkpoint (the fields in the order they
/// have always been printed).
#[derive(serde::Serialize)]
struct SravenLine<'a> {
    accuracy: f64,
    loss: f64,
    n: usize,
    per_feature_accuracy: &'a [f64],
}

/// The line `hyperlens eval --json` prints per set for a fuzzy-logic checkpoint: `n`, the
/// sequences the MSE averages; `n_r2`, those the R² averages (a sequence whose targets are all
/// equal has no R²).
#[derive(serde::Serialize)]
struct LogicLine<'a> {
    mse: f64,
    n: usize,
    n_r2: usize,
    r2: f64,
    set: &'a str,
    task: Task,
}

/// Checks `--save-logits` for `n` sampled problems against the memory budget before the stream
/// is made ([`check_logits_budget`]).
fn check_logits_budget_if(keep: bool, n: usize, cfg: &Config) -> anyhow::Result<()> {
    if keep {
        check_logits_budget(n, cfg)?;
    }
    Ok(())
}

/// `hyperlens eval` on a fuzzy-logic checkpoint trained with `settings`: MSE and mean R² of the last
/// token's prediction, on a problem file or on sampled sets (all three, or the one `--set` names)
/// ([`evaluate_logic`]).
///
/// # Errors
/// A split other than the recorded one without `--other-split`, a bad problem file, model errors.
fn eval_logic(args: &EvalArgs, model: &Evaluator, settings: &TrainSettings) -> anyhow::Result<()> {
    let p = &args.problems;
    let split;
    let source = match &p.problems {
        Some(path) => LogicEvalSource::File(path),
        None => {
            if p.n == 0 {
                bail!("--n must be positive");
            }
            split = resolve_split(p, settings, &args.checkpoint)?;
            LogicEvalSource::Sampled {
                split: &split,
                set: p.set.map(logic_set),
                n: p.n,
                seed: p.seed,
            }
        }
    };
    let rows = evaluate_logic(model, settings, source, args.batch)?;
    let mut stdout = std::io::stdout().lock();
    for LogicSetEval { set, metrics, n_r2 } in rows {
        let (r2, mse, n) = (metrics.metric, metrics.loss, metrics.n);
        if args.json {
            let line = LogicLine {
                mse,
                n,
                n_r2,
                r2,
                set: &set,
                task: Task::Logic,
            };
            writeln!(stdout, "{}", serde_json::to_string(&line)?)?;
        } else if n_r2 == n {
            writeln!(stdout, "{set:<8} R² {r2:.4}  MSE {mse:.6}  ({n} sequences)")?;
        } else {
            writeln!(
                stdout,
                "{set:<8} R² {r2:.4}  MSE {mse:.6}  ({n} sequences; R² over the {n_r2} whose \
                 targets vary)"
            )?;
        }
    }
    Ok(())
}
