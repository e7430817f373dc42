//! `hyperlens eval`: accuracy (all features right), per-feature accuracy and loss of a checkpoint on
//! a SRAVEN problem set, either read from a `.npz` file or sampled from a split.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::Args;
use hyperlens_io::keys::logits as keys;
use hyperlens_model::eval::evaluate_with;
use hyperlens_model::{Device, Transformer};
use hyperlens_tasks::npz::load_problems;
use hyperlens_tasks::sraven::{sample, ProblemSet, SravenParams};
use ndarray::{Array2, Array3};

use super::common::{progress_bar, ProblemArgs, ProblemSource};

/// Arguments of `hyperlens eval`.
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

fn write_logits(
    path: &Path,
    logits: &Array3<f32>,
    pred: &Array2<i64>,
    y: &Array2<i64>,
) -> anyhow::Result<()> {
    hyperlens_io::write_npz(path, |npz| -> anyhow::Result<()> {
        npz.add(keys::LOGITS, logits)?;
        npz.add(keys::PRED, pred)?;
        npz.add(keys::Y, y)?;
        Ok(())
    })
}

/// Runs `hyperlens eval`.
///
/// # Errors
/// A bad checkpoint, problem file, split or flag; an unavailable device; a failed write.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    if args.batch == 0 {
        bail!("--batch must be positive");
    }
    let device = args.device.to_candle()?;
    let model = Transformer::load(&args.checkpoint, &device)?;
    let cfg = model.config().clone();
    let params = SravenParams {
        features: cfg.n_outputs,
        values: cfg.d_in,
        ..SravenParams::default()
    };
    let (problems, what): (ProblemSet, String) = match args.problems.resolve(params)? {
        ProblemSource::File(path) => (load_problems(&path, &params)?, path.display().to_string()),
        ProblemSource::Sampled {
            split,
            set,
            n,
            seed,
            unpermuted,
        } => {
            let kind = if unpermuted { "unpermuted" } else { "permuted" };
            (
                sample(&split, set, n, seed, unpermuted)?,
                format!("{} {set}, seed {seed}, {kind}", split.name),
            )
        }
    };
    let n = problems.len();
    let bar = progress_bar(n as u64, "eval", "problems");
    let out = evaluate_with(
        &model,
        &problems,
        args.batch,
        args.save_logits.is_some(),
        |done| bar.set_position(done as u64),
    )?;
    bar.finish_and_clear();
    if let (Some(path), Some(logits), Some(pred)) = (&args.save_logits, &out.logits, &out.pred) {
        write_logits(path, logits, pred, &problems.y)?;
    }
    let m = &out.metrics;
    if args.json {
        let obj = serde_json::json!({
            "accuracy": m.accuracy,
            "per_feature_accuracy": m.per_feature_accuracy,
            "loss": m.loss,
            "n": m.n,
        });
        println!("{obj}");
    } else {
        println!(
            "checkpoint   {} ({}, {} parameters)",
            args.checkpoint.display(),
            cfg.mixer,
            cfg.n_params()
        );
        println!("problems     {what}: {n}");
        println!(
            "accuracy     {:.2} % (all {} features right)",
            100.0 * m.accuracy,
            cfg.n_outputs
        );
        let per: Vec<String> = m
            .per_feature_accuracy
            .iter()
            .map(|a| format!("{:.2} %", 100.0 * a))
            .collect();
        println!("per feature  {}", per.join("  "));
        println!("loss         {:.4}", m.loss);
        if let Some(p) = &args.save_logits {
            println!("logits       {}", p.display());
        }
    }
    Ok(())
}
