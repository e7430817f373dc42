//! `hyperlens patch`: interventions on a SRAVEN checkpoint through its hook points. `patch heads`
//! ablates every attention head in turn (zero or mean, at `blocks.{l}.attn.hook_z`) and writes the
//! change in accuracy and loss per head (`hyperlens_probe::head_ablation`).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hyperlens_model::{Device, Transformer};
use hyperlens_probe::{ablation_csv, head_ablation, Ablation};
use hyperlens_tasks::npz::load_problems;
use hyperlens_tasks::sraven::SampleStream;
use hyperlens_viz::{save_png, ColorMap, Heatmap};
use ndarray::Array2;

use super::common::{progress_bar, sraven_params, ProblemArgs, ProblemSource};

/// `hyperlens patch` subcommands.
#[derive(Debug, Subcommand)]
pub enum PatchCommand {
    /// Ablate each attention head in turn (zero or mean at `blocks.{l}.attn.hook_z`) and measure
    /// accuracy and loss: head_ablation.csv, head_ablation.json and a heatmap.
    Heads(HeadsArgs),
}

/// Arguments of `patch heads`.
#[derive(Debug, Args)]
pub struct HeadsArgs {
    /// The SRAVEN checkpoint directory.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Where the problems come from.
    #[command(flatten)]
    pub problems: ProblemArgs,
    /// What replaces a head's output: `zero`, or `mean` (its mean over the problems, per position).
    #[arg(long, default_value = "mean")]
    pub ablation: Ablation,
    /// Output directory (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Compute device: cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Problems per forward pass.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
}

/// Runs `hyperlens patch`.
///
/// # Errors
/// A bad checkpoint or problem source, a logic checkpoint, a failed write.
pub fn run(c: PatchCommand) -> anyhow::Result<()> {
    match c {
        PatchCommand::Heads(a) => heads(a),
    }
}

fn heads(a: HeadsArgs) -> anyhow::Result<()> {
    if a.batch == 0 {
        bail!("--batch must be positive");
    }
    let task = hyperlens_report::discover::RunInfo::read(&a.checkpoint).task;
    if task.as_deref().is_some_and(|t| t != "sraven") {
        bail!(
            "{}: a {} checkpoint; `patch heads` measures SRAVEN accuracy",
            a.checkpoint.display(),
            task.unwrap_or_default()
        );
    }
    let device = a.device.to_candle()?;
    let model = Transformer::load(&a.checkpoint, &device)?;
    let cfg = model.config().clone();
    let params = sraven_params(&a.checkpoint, &cfg)?;
    let source = a.problems.resolve(&a.checkpoint, params)?;
    let batch = a.batch;
    let (describe, mut stream): (serde_json::Value, Box<hyperlens_probe::ablation::Problems>) =
        match source {
            ProblemSource::File(path) => {
                let set = std::rc::Rc::new(load_problems(&path, &params)?);
                let n = set.len();
                if n == 0 {
                    bail!("--problems {}: no problem", path.display());
                }
                (
                    serde_json::json!({"problems": path.display().to_string(), "n": n}),
                    Box::new(move || {
                        let set = std::rc::Rc::clone(&set);
                        Box::new(
                            (0..n)
                                .step_by(batch)
                                .map(move |s| Ok(set.slice(s, (s + batch).min(n)))),
                        )
                    }),
                )
            }
            ProblemSource::Sampled {
                split,
                set,
                n,
                seed,
                unpermuted,
            } => {
                let describe = serde_json::json!({"problems": "generated", "split": split.name,
                    "set": set.to_string(), "n": n, "seed": seed, "unpermuted": unpermuted});
                (
                    describe,
                    Box::new(
                        move || match SampleStream::new(&split, set, seed, unpermuted) {
                            Ok(s) => Box::new(s.batches(n, batch).map(|b| b.map_err(Into::into))),
                            Err(e) => Box::new(std::iter::once(Err(e.into()))),
                        },
                    ),
                )
            }
        };
    let total = 1 + usize::from(a.ablation == Ablation::Mean) + cfg.n_layers * cfg.n_heads;
    let bar = progress_bar(total as u64, "patch heads", "passes");
    let report = head_ablation(&model, &mut stream, a.ablation, |d, _| {
        bar.set_position(d as u64)
    })
    .with_context(|| format!("ablating the heads of {}", a.checkpoint.display()))?;
    bar.finish_and_clear();
    std::fs::create_dir_all(&a.out).with_context(|| format!("--out {}", a.out.display()))?;
    hyperlens_io::write_atomic(
        &a.out.join("head_ablation.csv"),
        ablation_csv(&report).as_bytes(),
    )?;
    let summary = serde_json::json!({
        "producer": format!("hyperlens {} patch heads", env!("CARGO_PKG_VERSION")),
        "checkpoint": a.checkpoint.display().to_string(),
        "mixer": cfg.mixer.to_string(),
        "hook": "blocks.{l}.attn.hook_z",
        "source": describe,
        "report": report,
    });
    hyperlens_io::write_json(&a.out.join("head_ablation.json"), &summary)?;
    let deltas = Array2::from_shape_fn((cfg.n_layers, cfg.n_heads), |(l, h)| {
        report.heads[l * cfg.n_heads + h].accuracy - report.base.accuracy
    });
    let span = deltas.iter().fold(0.01f64, |m, v| m.max(v.abs()));
    let fig = Heatmap::head_scores(
        &format!(
            "{}: change in accuracy with each head {}-ablated",
            a.checkpoint
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            a.ablation
        ),
        deltas.view(),
        "accuracy change",
        ColorMap::BlueWhiteRed,
        Some((-span, span)),
    )?;
    save_png(a.out.join("head_ablation.png"), &fig)?;
    let worst = report
        .heads
        .iter()
        .min_by(|x, y| x.accuracy.total_cmp(&y.accuracy));
    outln!(
        "accuracy {:.2} % without ablation; {} ablation of one head at a time: {}",
        100.0 * report.base.accuracy,
        a.ablation,
        worst.map_or_else(String::new, |w| format!(
            "the largest drop is L{}H{} ({:.2} %)",
            w.layer,
            w.head,
            100.0 * w.accuracy
        ))
    )?;
    outln!(
        "wrote head_ablation.csv, head_ablation.json and head_ablation.png to {}",
        a.out.display()
    )?;
    Ok(())
}
