//! `hyperlens patch`: interventions on a SRAVEN checkpoint through its hook points. `patch heads`
//! ablates every attention head in turn (zero or mean, at `blocks.{l}.attn.hook_z`) and writes the
//! change in accuracy and loss per head (`hyperlens_probe::head_ablation`); `patch transplant`
//! runs the causal test of the latent code; `patch acts` patches clean activations into corrupted
//! problems; `patch dla` attributes the answer logit to heads and MLPs. Each loads one
//! `Evaluator`, calls the probe crate's intervention and its writer of the data files
//! (`hyperlens_probe::patch_files`), and draws the figures here (`hyperlens-viz` sits above the
//! probe crate).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hyperlens_io::sidecars::ProblemsSource;
use hyperlens_model::{Config, Device, Evaluator, RunRecord, Task};
use hyperlens_probe::{
    activation_patching, direct_logit_attribution, feature_swap_pairs, head_ablation,
    latent_transplant, sample_held, sample_id_ood, sample_patched, write_activation_patching,
    write_dla, write_head_ablation, write_transplant, Ablation, HeadValue, PatchRun,
    RepeatedProblems, TransplantKind, TransplantLine, TransplantProblems, TransplantRow,
    TransplantSummary,
};
use hyperlens_report::intervention_figures::{
    checkpoint_name, draw_dla, draw_head_ablation, draw_patching, draw_transplant,
};
use hyperlens_tasks::npz::load_problems;
use hyperlens_tasks::sraven::{ProblemSet, Set, Split, SravenParams};

use super::common::{progress_bar, sraven_params, ProblemArgs, ProblemSource, SetArg};

/// `hyperlens patch` subcommands.
#[derive(Debug, Subcommand)]
pub enum PatchCommand {
    /// Ablate each attention head in turn (zero or mean at `blocks.{l}.attn.hook_z`) and measure
    /// accuracy and loss: head_ablation.csv, head_ablation.json and a heatmap (PNG, and SVG with
    /// hover values).
    Heads(HeadsArgs),
    /// The causal test of the latent code: transplant the mean ID code of another rule into OOD
    /// problems at the paper's site, layer by layer, and count how often the answer becomes that
    /// rule's (with the identity, random-code and off-row controls).
    Transplant(TransplantArgs),
    /// Activation patching: clean activations put into corrupted problems (the answer slot's
    /// feature swapped in from another problem), per layer x position and per layer x head,
    /// scored by the restored logit difference (TransformerLens `get_act_patch_*`).
    Acts(ActsArgs),
    /// Direct logit attribution of every head, attention bias and MLP to the answer logit, with
    /// the final LayerNorm's scale frozen (TransformerLens `apply_ln_to_stack`).
    Dla(DlaArgs),
}

/// The output directory, device and batch of every `patch` subcommand.
#[derive(Debug, Args)]
pub struct RunArgs {
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

/// Arguments of `patch acts`.
#[derive(Debug, Args)]
pub struct ActsArgs {
    /// The SRAVEN checkpoint directory.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Unpermuted problems from a file of `hyperlens tasks sample --unpermuted` (instead of
    /// sampling).
    #[arg(long, conflicts_with_all = ["split", "set", "n", "seed"])]
    pub problems: Option<PathBuf>,
    /// The split to sample from [default: the one the checkpoint was trained on].
    #[arg(long)]
    pub split: Option<String>,
    /// Which task list: `id` or `ood`.
    #[arg(long, value_enum, default_value = "ood")]
    pub set: SetArg,
    /// Clean problems to sample (unpermuted); each is paired with a corrupted twin.
    #[arg(long, default_value_t = 256)]
    pub n: usize,
    /// Seed of the sample.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The answer slot whose feature is swapped and whose logits are scored.
    #[arg(long, default_value_t = 3)]
    pub slot: usize,
    /// Where and how it runs.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Arguments of `patch dla`.
#[derive(Debug, Args)]
pub struct DlaArgs {
    /// The SRAVEN checkpoint directory.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Where the problems come from.
    #[command(flatten)]
    pub problems: ProblemArgs,
    /// Attribute only this answer slot [default: all slots, averaged].
    #[arg(long)]
    pub slot: Option<usize>,
    /// Where and how it runs.
    #[command(flatten)]
    pub run: RunArgs,
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
    /// Where and how it runs.
    #[command(flatten)]
    pub run: RunArgs,
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
    /// Where and how it runs.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Runs `hyperlens patch`.
///
/// # Errors
/// A bad checkpoint or problem source, a logic checkpoint, a failed write.
pub fn run(c: PatchCommand) -> anyhow::Result<()> {
    match c {
        PatchCommand::Heads(a) => heads(a),
        PatchCommand::Transplant(a) => transplant(a),
        PatchCommand::Acts(a) => acts(a),
        PatchCommand::Dla(a) => dla(a),
    }
}

/// Loads a SRAVEN checkpoint's evaluator for an intervention, refusing a checkpoint of another
/// task.
fn sraven_model(checkpoint: &Path, device: &Device, command: &str) -> anyhow::Result<Evaluator> {
    let task = RunRecord::read(checkpoint)?.task;
    if let Some(task) = task.filter(|&t| t != Task::Sraven) {
        bail!(
            "{}: a {task} checkpoint; `{command}` works on SRAVEN checkpoints",
            checkpoint.display()
        );
    }
    Ok(Evaluator::load(checkpoint, &device.to_candle()?)?)
}

/// `--split`, or the split the checkpoint's run files record: its name and the split.
fn resolve_split(
    checkpoint: &Path,
    given: Option<&str>,
    params: SravenParams,
) -> anyhow::Result<(String, Split)> {
    let name = match given {
        Some(g) => g.to_string(),
        None => RunRecord::read(checkpoint)?
            .split
            .with_context(|| {
                format!(
                    "give --split: {} records no training split",
                    checkpoint.display()
                )
            })?
            .to_string(),
    };
    let split = Split::named_with(&name, params).context("--split")?;
    Ok((name, split))
}

/// The `producer` of a subcommand's JSON files: `hyperlens <version> <command>`.
fn producer(command: &str) -> String {
    format!("hyperlens {} {command}", env!("CARGO_PKG_VERSION"))
}

/// Creates `--out`.
fn create_out(out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("--out {}", out.display()))
}

/// The problems of `--problems`, or sampled from the resolved source, held in memory (a sample's
/// size is checked against the memory budget first).
fn load_set(
    source: ProblemSource,
    params: &SravenParams,
    cfg: &Config,
) -> anyhow::Result<ProblemSet> {
    Ok(match source {
        ProblemSource::File(path) => load_problems(&path, params)?,
        ProblemSource::Sampled {
            split,
            set,
            n,
            seed,
            unpermuted,
        } => sample_held(&split, set, n, seed, unpermuted, cfg)?,
    })
}

/// The unpermuted problems of `patch acts` (`--problems`, or sampled) and their `source`.
fn acts_problems(
    a: &ActsArgs,
    params: SravenParams,
    cfg: &Config,
) -> anyhow::Result<(ProblemSet, ProblemsSource)> {
    if let Some(path) = &a.problems {
        return Ok((
            load_problems(path, &params)?,
            ProblemsSource::file(path.display()),
        ));
    }
    let (split_name, split) = resolve_split(&a.checkpoint, a.split.as_deref(), params)?;
    let which = match a.set {
        SetArg::Id => Set::Id,
        SetArg::Ood => Set::Ood,
        SetArg::Unknown => {
            bail!("--set unknown applies to fuzzy-logic checkpoints (sraven has id and ood)")
        }
    };
    Ok((
        sample_patched(&split, which, a.n, a.seed, cfg)?,
        ProblemsSource::sampled(
            split_name.to_string(),
            which.to_string(),
            a.n,
            a.seed,
            Some(true),
        ),
    ))
}

fn acts(a: ActsArgs) -> anyhow::Result<()> {
    if a.run.batch == 0 || a.n == 0 {
        bail!("--batch and --n must be positive");
    }
    let ev = sraven_model(&a.checkpoint, &a.run.device, "patch acts")?;
    let cfg = ev.config().clone();
    let params = sraven_params(&a.checkpoint, &cfg)?;
    let (set, describe) = acts_problems(&a, params, &cfg)?;
    let pairs = feature_swap_pairs(&set, a.slot)
        .with_context(|| format!("pairing the problems at --slot {}", a.slot))?;
    let bar = progress_bar(0, "patch acts", "passes");
    let r = activation_patching(&ev, &pairs, a.run.batch, |d, t| {
        bar.set_length(t as u64);
        bar.set_position(d as u64);
        ControlFlow::Continue(())
    })
    .with_context(|| format!("patching activations of {}", a.checkpoint.display()))?;
    bar.finish_and_clear();
    create_out(&a.run.out)?;
    let producer = producer("patch acts");
    let run = PatchRun {
        producer: &producer,
        checkpoint: &a.checkpoint,
        mixer: cfg.mixer,
    };
    write_activation_patching(&a.run.out, &run, &describe, &pairs, &r)?;
    draw_patching(&a.run.out, &checkpoint_name(&a.checkpoint), &cfg, &r)?;
    let best = r.best_head().map(|HeadValue { layer, head, value }| {
        format!("L{layer}H{head} restores {:.0} %", 100.0 * value)
    });
    outln!(
        "{} pairs at slot {}: logit difference {:.3} clean, {:.3} corrupted; the head that restores most: {}",
        r.n,
        a.slot,
        r.clean_logit_diff,
        r.corrupted_logit_diff,
        best.unwrap_or_default()
    )?;
    outln!(
        "wrote activation_patching.csv, .npz, .json and patching_*.png to {}",
        a.run.out.display()
    )?;
    Ok(())
}

fn dla(a: DlaArgs) -> anyhow::Result<()> {
    if a.run.batch == 0 {
        bail!("--batch must be positive");
    }
    let ev = sraven_model(&a.checkpoint, &a.run.device, "patch dla")?;
    let cfg = ev.config().clone();
    let params = sraven_params(&a.checkpoint, &cfg)?;
    let slots: Vec<usize> = match a.slot {
        Some(s) if s >= cfg.n_outputs => {
            bail!("--slot {s}: the model has {} answer slots", cfg.n_outputs)
        }
        Some(s) => vec![s],
        None => (0..cfg.n_outputs).collect(),
    };
    let source = a.problems.resolve(&a.checkpoint, params)?;
    let describe = source.source();
    let set = load_set(source, &params, &cfg)?;
    let bar = progress_bar(0, "patch dla", "batches");
    let r = direct_logit_attribution(&ev, &set, &slots, a.run.batch, |d, t| {
        bar.set_length(t as u64);
        bar.set_position(d as u64);
        ControlFlow::Continue(())
    })
    .with_context(|| format!("attributing the logits of {}", a.checkpoint.display()))?;
    bar.finish_and_clear();
    create_out(&a.run.out)?;
    let producer = producer("patch dla");
    let run = PatchRun {
        producer: &producer,
        checkpoint: &a.checkpoint,
        mixer: cfg.mixer,
    };
    write_dla(&a.run.out, &run, &describe, &r)?;
    draw_dla(&a.run.out, &checkpoint_name(&a.checkpoint), &r)?;
    let top = r
        .top_head()
        .map(|HeadValue { layer, head, value }| format!("L{layer}H{head} ({value:+.2})"));
    outln!(
        "{} (problem, slot) pairs: answer logit {:.2} above the mean logit; the head writing most of it: {}; largest decomposition error {:.1e}",
        r.n,
        r.logit_centred,
        top.unwrap_or_default(),
        r.max_error
    )?;
    outln!(
        "wrote dla.csv, dla.json and dla.png to {}",
        a.run.out.display()
    )?;
    Ok(())
}

fn transplant(a: TransplantArgs) -> anyhow::Result<()> {
    if a.run.batch == 0 || a.n == 0 {
        bail!("--batch and --n must be positive");
    }
    let ev = sraven_model(&a.checkpoint, &a.run.device, "patch transplant")?;
    let cfg = ev.config().clone();
    let params = sraven_params(&a.checkpoint, &cfg)?;
    let (split_name, split) = resolve_split(&a.checkpoint, a.split.as_deref(), params)?;
    let (id, ood) = sample_id_ood(&split, a.n, a.seed, &cfg)?;
    let bar = progress_bar(0, "patch transplant", "steps");
    let rows = latent_transplant(&ev, &id, &ood, a.slot, a.run.batch, a.seed, |d, t| {
        bar.set_length(t as u64);
        bar.set_position(d as u64);
        ControlFlow::Continue(())
    })
    .with_context(|| format!("transplanting codes in {}", a.checkpoint.display()))?;
    bar.finish_and_clear();
    create_out(&a.run.out)?;
    let producer = producer("patch transplant");
    let run = PatchRun {
        producer: &producer,
        checkpoint: &a.checkpoint,
        mixer: cfg.mixer,
    };
    let problems = TransplantProblems {
        split: &split_name,
        n: a.n,
        seed: a.seed,
        slot: a.slot,
    };
    write_transplant(&a.run.out, &run, &problems, &rows)?;
    draw_transplant(
        &a.run.out,
        &checkpoint_name(&a.checkpoint),
        cfg.n_layers,
        &rows,
    )?;
    print_transplant(&rows, &cfg, &a.run.out)
}

/// Prints the transplant's summary ([`TransplantSummary`]): per layer, the answers that became
/// the donor's, and the identity transplant's largest logit change.
fn print_transplant(rows: &[TransplantRow], cfg: &Config, out: &Path) -> anyhow::Result<()> {
    let summary = TransplantSummary::new(rows, cfg.d_in);
    let chance = summary.chance;
    for TransplantLine {
        row: r,
        donor_share,
    } in &summary.lines
    {
        let share = donor_share.map_or_else(String::new, |d| {
            format!("; {d:.0} % of the changed answers are the donor's ({chance:.0} % by chance)")
        });
        outln!(
            "layer {} ({}): {} of {} answers become the donor rule's, {} change elsewhere, {} unchanged ({} pairs left out){share}",
            r.layer,
            if r.kind == TransplantKind::MeanId { "mean ID code" } else { "a donor problem's code" },
            r.to_donor, r.n, r.elsewhere, r.unchanged, r.excluded
        )?;
    }
    outln!(
        "identity transplant: largest logit change {:.1e}; wrote transplant.csv, transplant.json and transplant.png to {}",
        summary.identity_max_change,
        out.display()
    )?;
    Ok(())
}

/// The problems of `patch heads` as passes that start again (one per head,
/// [`RepeatedProblems::passes`]), in batches of `batch`; `describe` gets the number of problems of
/// a file.
fn heads_stream(
    source: ProblemSource,
    params: &SravenParams,
    batch: usize,
    describe: &mut ProblemsSource,
) -> anyhow::Result<Box<hyperlens_probe::ablation::Problems<'static>>> {
    let problems = match source {
        ProblemSource::File(path) => {
            let set = load_problems(&path, params)?;
            let n = set.len();
            if n == 0 {
                bail!("--problems {}: no problem", path.display());
            }
            describe.n = Some(n);
            RepeatedProblems::Set(Box::new(set))
        }
        ProblemSource::Sampled {
            split,
            set,
            n,
            seed,
            unpermuted,
        } => RepeatedProblems::Sampled {
            split,
            set,
            n,
            seed,
            unpermuted,
        },
    };
    Ok(problems.passes(batch))
}

fn heads(a: HeadsArgs) -> anyhow::Result<()> {
    if a.run.batch == 0 {
        bail!("--batch must be positive");
    }
    let ev = sraven_model(&a.checkpoint, &a.run.device, "patch heads")?;
    let cfg = ev.config().clone();
    let params = sraven_params(&a.checkpoint, &cfg)?;
    let source = a.problems.resolve(&a.checkpoint, params)?;
    let mut describe = source.source();
    let mut stream = heads_stream(source, &params, a.run.batch, &mut describe)?;
    let bar = progress_bar(0, "patch heads", "passes");
    let report = head_ablation(&ev, &mut stream, a.ablation, |d, t| {
        bar.set_length(t as u64);
        bar.set_position(d as u64);
        ControlFlow::Continue(())
    })
    .with_context(|| format!("ablating the heads of {}", a.checkpoint.display()))?;
    bar.finish_and_clear();
    create_out(&a.run.out)?;
    let producer = producer("patch heads");
    let run = PatchRun {
        producer: &producer,
        checkpoint: &a.checkpoint,
        mixer: cfg.mixer,
    };
    write_head_ablation(&a.run.out, &run, &describe, &report)?;
    draw_head_ablation(&a.run.out, &checkpoint_name(&a.checkpoint), &cfg, &report)?;
    let worst = report.largest_drop();
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
        "wrote head_ablation.csv, head_ablation.json, head_ablation.png and head_ablation.svg to {}",
        a.run.out.display()
    )?;
    Ok(())
}
