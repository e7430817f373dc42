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
    /// The causal test of the latent code: transplant the mean ID code of another rule into OOD
    /// problems at the paper's site, layer by layer, and count how often the answer becomes that
    /// rule's (with the identity, random-code and off-row controls).
    Transplant(TransplantArgs),
}

/// Arguments of `patch transplant`.
#[derive(Debug, Args)]
pub struct TransplantArgs {
    /// The SRAVEN checkpoint directory.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The split [default: the one the checkpoint was trained on].
    #[arg(long)]
    pub split: Option<String>,
    /// Unpermuted problems per set: ID problems give the donors' mean codes, OOD problems receive
    /// them.
    #[arg(long, default_value_t = 512)]
    pub n: usize,
    /// Seed of the problems and of the random codes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The answer slot whose site is transplanted (the paper's: 3, query 35, keys 27 and 31).
    #[arg(long, default_value_t = 3)]
    pub slot: usize,
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
        PatchCommand::Transplant(a) => transplant(a),
    }
}

fn transplant(a: TransplantArgs) -> anyhow::Result<()> {
    use hyperlens_probe::{latent_transplant, transplant_csv};
    use hyperlens_tasks::sraven::{sample, Set, Split};
    use hyperlens_viz::{BarSeries, GroupedBars};
    if a.batch == 0 || a.n == 0 {
        bail!("--batch and --n must be positive");
    }
    let device = a.device.to_candle()?;
    let model = Transformer::load(&a.checkpoint, &device)?;
    let cfg = model.config().clone();
    let params = sraven_params(&a.checkpoint, &cfg)?;
    let info = hyperlens_report::discover::RunInfo::read(&a.checkpoint);
    if info.task.as_deref().is_some_and(|t| t != "sraven") {
        bail!("{}: not a SRAVEN checkpoint", a.checkpoint.display());
    }
    let split_name = a.split.clone().or(info.split).with_context(|| {
        format!(
            "give --split: {} records no training split",
            a.checkpoint.display()
        )
    })?;
    let split = Split::named_with(&split_name, params).context("--split")?;
    hyperlens_io::budget::check_alloc(
        format!("--n {} (two problem sets are held in memory)", a.n),
        hyperlens_io::budget::bytes_of(4, &[2 * a.n, cfg.n_tokens, cfg.d_in + 8]),
    )?;
    let id = sample(&split, Set::Id, a.n, a.seed, true)?;
    let ood = sample(&split, Set::Ood, a.n, a.seed, true)?;
    let bar = super::common::Stage::start("patch transplant");
    let rows = latent_transplant(&model, &id, &ood, a.slot, a.batch, a.seed)
        .with_context(|| format!("transplanting codes in {}", a.checkpoint.display()))?;
    bar.done(&mut Vec::new());
    std::fs::create_dir_all(&a.out).with_context(|| format!("--out {}", a.out.display()))?;
    hyperlens_io::write_atomic(
        &a.out.join("transplant.csv"),
        transplant_csv(&rows).as_bytes(),
    )?;
    hyperlens_io::write_json(
        &a.out.join("transplant.json"),
        &serde_json::json!({
            "producer": format!("hyperlens {} patch transplant", env!("CARGO_PKG_VERSION")),
            "checkpoint": a.checkpoint.display().to_string(),
            "mixer": cfg.mixer.to_string(),
            "split": split_name,
            "n": a.n,
            "seed": a.seed,
            "slot": a.slot,
            "rows": rows,
        }),
    )?;
    let frac = |kind: &str, changed: bool| -> Vec<f64> {
        (0..cfg.n_layers)
            .map(|l| {
                rows.iter()
                    .find(|r| r.layer == l && r.kind == kind)
                    .map_or(0.0, |r| {
                        let k = if changed {
                            r.to_donor + r.elsewhere
                        } else {
                            r.to_donor
                        };
                        if r.n > 0 {
                            k as f64 / r.n as f64
                        } else {
                            0.0
                        }
                    })
            })
            .collect()
    };
    let (to_donor, changed, off_row, random) = (
        frac("mean_id", false),
        frac("mean_id", true),
        frac("off_row", true),
        frac("random", true),
    );
    let groups: Vec<String> = (0..cfg.n_layers).map(|l| format!("layer {l}")).collect();
    let name = a
        .checkpoint
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut fig = GroupedBars::accuracy(
        &format!("{name}: transplanting another rule's mean code at the answer's site"),
        &groups,
        vec![
            BarSeries {
                name: "answer becomes the donor rule's".into(),
                values: &to_donor,
            },
            BarSeries {
                name: "answer changes (any)".into(),
                values: &changed,
            },
            BarSeries {
                name: "control: donor at the first row's keys".into(),
                values: &off_row,
            },
            BarSeries {
                name: "control: random code, same norm".into(),
                values: &random,
            },
        ],
    );
    fig.y_label = "fraction of problems".into();
    fig.x_label = "layer transplanted".into();
    save_png(a.out.join("transplant.png"), &fig)?;
    let chance = 100.0 / (cfg.d_in as f64 - 1.0);
    for r in rows.iter().filter(|r| r.kind == "mean_id") {
        let changed = r.to_donor + r.elsewhere;
        let share = if changed > 0 {
            format!(
                "; {:.0} % of the changed answers are the donor's ({chance:.0} % by chance)",
                100.0 * r.to_donor as f64 / changed as f64
            )
        } else {
            String::new()
        };
        outln!(
            "layer {}: {} of {} answers become the donor rule's, {} change elsewhere, {} unchanged ({} pairs left out){share}",
            r.layer, r.to_donor, r.n, r.elsewhere, r.unchanged, r.excluded
        )?;
    }
    let ident = rows
        .iter()
        .filter(|r| r.kind == "identity")
        .fold(0.0f64, |m, r| m.max(r.max_logit_change));
    outln!(
        "identity transplant: largest logit change {ident:.1e}; wrote transplant.csv, transplant.json and transplant.png to {}",
        a.out.display()
    )?;
    Ok(())
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
