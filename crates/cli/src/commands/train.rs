//! `hyperlens train`: train a model with the paper's recipe (SRAVEN, fuzzy logic) or a token model on
//! the induction corpus, into a run directory that is also a checkpoint; `--resume` continues a run
//! exactly.

use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use hyperlens_model::{Device, Mixer};
use hyperlens_train::{
    read_settings, train, Event, ModelSize, ProgressText, RunOptions, TrainSettings, TrainTask,
};
use indicatif::{ProgressBar, ProgressStyle};

/// Arguments of `hyperlens train`. Unset options take the task's defaults (the paper's recipe) or,
/// with `--resume`, the run's saved settings.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The task: sraven, logic or induction [default: sraven].
    #[arg(long)]
    pub task: Option<TrainTask>,
    /// The sequence mixer: softmax, linear, hyla, linear-rmshead, hyla-no-rmshead, hyla-linear-value,
    /// hyla-linear-value-no-rmshead, softmax-hypatt [default: hyla; induction softmax].
    #[arg(long)]
    pub mixer: Option<Mixer>,
    /// The split: sraven `paper-seed0|1|2|2024` or `seed{N}` [default: paper-seed0]; logic `seed{N}`
    /// (task shuffle) and induction `seed{N}` (bigram table) [default: seed0].
    #[arg(long)]
    pub split: Option<String>,
    /// Total optimiser updates [default: sraven 156250, logic 50000, induction 3000].
    #[arg(long)]
    pub steps: Option<u64>,
    /// Problems (sequences) per update [default: 128; induction 32].
    #[arg(long)]
    pub batch: Option<usize>,
    /// Seed of the initialisation, the training stream and the dropout masks [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Compute device: cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// The run directory (created; must be new or empty unless --resume).
    #[arg(long)]
    pub out: PathBuf,
    /// Continue the run in --out exactly where its last checkpoint left it.
    #[arg(long)]
    pub resume: bool,
    /// Peak learning rate (paper grid: 1e-3, 3e-4) [default: 1e-3].
    #[arg(long)]
    pub lr: Option<f64>,
    /// Decoupled weight decay on parameters with >= 2 dims (paper grid: 0.1, 0.3) [default: 0.1].
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Linear warm-up steps (paper grid: 1000, 3000) [default: 1000; logic and induction 100].
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Attention dropout on the normalised scores [default: 0.1; induction 0].
    #[arg(long)]
    pub dropout: Option<f64>,
    /// Number of layers [default: sraven 4, logic 2, induction 2].
    #[arg(long)]
    pub layers: Option<usize>,
    /// Width multiplier (sraven: 1, 2 or 4) [default: 1].
    #[arg(long)]
    pub width: Option<usize>,
    /// Induction: an attention-only token model (no MLP, no LayerNorm; 0, 1 or 2 layers).
    #[arg(long)]
    pub attn_only: bool,
    /// Evaluate every this many steps (and at the end; 0 = only at the end) [default: 2500; induction 500].
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Problems (sequences) per evaluation set [default: 4096; induction 256].
    #[arg(long)]
    pub eval_n: Option<usize>,
    /// Seed of the evaluation sets (never overlapping the training stream) [default: 0].
    #[arg(long)]
    pub eval_seed: Option<u64>,
    /// Checkpoint every this many steps (and at the end; 0 = only at the end) [default: 5000; induction 1000].
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Write a training row to metrics.csv every this many steps [default: 100; induction 50].
    #[arg(long)]
    pub log_every: Option<u64>,
    /// SRAVEN: features per panel F (the paper sweeps it; paper splits need 4) [default: 4].
    #[arg(long)]
    pub features: Option<usize>,
    /// SRAVEN: values per feature M [default: 8].
    #[arg(long)]
    pub values: Option<usize>,
    /// SRAVEN: fraction of the tasks held out as OOD (seed{N} splits) [default: 0.25].
    #[arg(long)]
    pub holdout: Option<f64>,
    /// Explicit model width D instead of the paper's sizes (with --heads, --d-head, --d-mlp; --width 1).
    #[arg(long, requires_all = ["heads", "d_head", "d_mlp"])]
    pub d_model: Option<usize>,
    /// Explicit number of heads H (with --d-model).
    #[arg(long, requires = "d_model")]
    pub heads: Option<usize>,
    /// Explicit per-head width d (with --d-model).
    #[arg(long, requires = "d_model")]
    pub d_head: Option<usize>,
    /// Explicit MLP width (with --d-model).
    #[arg(long, requires = "d_model")]
    pub d_mlp: Option<usize>,
    /// Logic: samples (tokens) per sequence [default: 32].
    #[arg(long)]
    pub logic_samples: Option<usize>,
    /// Logic: fraction of the known-term pairs held out as the OOD set [default: 0.7].
    #[arg(long)]
    pub logic_frac_test: Option<f64>,
    /// Induction: vocabulary size of the corpus [default: 64].
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Induction: sequence length of the corpus [default: 64].
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Induction: strength of the corpus's bigram table (0 = uniform tokens) [default: 3].
    #[arg(long)]
    pub bigram_strength: Option<f64>,
    /// Induction: probability that a copy of an earlier segment starts at a position [default: 0.05].
    #[arg(long)]
    pub repeat_prob: Option<f64>,
    /// Stop after this many updates with a checkpoint, as if interrupted (continue with --resume).
    #[arg(long)]
    pub stop_after: Option<u64>,
    /// No progress bar (evaluations are still printed, one line each, on stdout). Without a
    /// terminal on stderr there is never a progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Sets `field` to the flag's value when given.
fn set<T: Clone>(field: &mut T, value: &Option<T>) {
    if let Some(v) = value {
        *field = v.clone();
    }
}

/// The run's settings: the task defaults (or the saved settings with `--resume`) overridden by the
/// flags that were given.
fn settings(args: &TrainArgs) -> anyhow::Result<TrainSettings> {
    let mut s = if args.resume {
        let s = read_settings(&args.out)
            .with_context(|| format!("--resume: reading the run in {}", args.out.display()))?;
        if let Some(t) = args.task {
            if t != s.task {
                bail!(
                    "--task {t}: the run in {} trains {}",
                    args.out.display(),
                    s.task
                );
            }
        }
        s
    } else {
        TrainSettings::for_task(args.task.unwrap_or(TrainTask::Sraven))
    };
    set(&mut s.mixer, &args.mixer);
    set(&mut s.split, &args.split);
    set(&mut s.steps, &args.steps);
    set(&mut s.batch, &args.batch);
    set(&mut s.seed, &args.seed);
    set(&mut s.lr, &args.lr);
    set(&mut s.weight_decay, &args.weight_decay);
    set(&mut s.warmup, &args.warmup);
    set(&mut s.dropout, &args.dropout);
    set(&mut s.layers, &args.layers);
    set(&mut s.width, &args.width);
    set(&mut s.eval_every, &args.eval_every);
    set(&mut s.eval_n, &args.eval_n);
    set(&mut s.eval_seed, &args.eval_seed);
    set(&mut s.checkpoint_every, &args.checkpoint_every);
    set(&mut s.log_every, &args.log_every);
    set(&mut s.sraven.features, &args.features);
    set(&mut s.sraven.values, &args.values);
    set(&mut s.sraven.holdout_fraction, &args.holdout);
    if let (Some(d_model), Some(n_heads), Some(d_head), Some(d_mlp)) =
        (args.d_model, args.heads, args.d_head, args.d_mlp)
    {
        s.size = Some(ModelSize {
            d_model,
            n_heads,
            d_head,
            d_mlp,
        });
    }
    set(&mut s.logic.samples, &args.logic_samples);
    set(&mut s.logic.frac_test, &args.logic_frac_test);
    set(&mut s.induction.vocab, &args.vocab);
    set(&mut s.induction.seq_len, &args.seq_len);
    set(&mut s.induction.bigram_strength, &args.bigram_strength);
    set(&mut s.induction.repeat_prob, &args.repeat_prob);
    if args.attn_only {
        s.attn_only = true;
    }
    s.check()?;
    Ok(s)
}

/// The progress bar of an interactive run: drawn on stderr only when stderr is a terminal and
/// `--quiet` is not given (hidden otherwise, so that a redirected run prints plain lines only).
fn progress_bar(quiet: bool, steps: u64) -> anyhow::Result<ProgressBar> {
    if quiet || !std::io::stderr().is_terminal() {
        return Ok(ProgressBar::hidden());
    }
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} [{elapsed_precise} < {eta_precise}, {per_sec}] {msg}",
        )
        .context("progress bar template")?,
    );
    Ok(bar)
}

/// Runs `hyperlens train`.
///
/// Once the run starts, prints a warning on stderr for valid but suspicious settings (a run shorter
/// than its warm-up); prints the start line, one line per evaluation and the closing summary on
/// stdout, whether or not it is a terminal (the progress bar, on a terminal only, steps aside for
/// them).
///
/// # Errors
/// Bad flags, an `--out` that is not empty without `--resume` (or not a run with it), an unavailable
/// device, a diverged run, I/O errors.
pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    let settings = settings(&args)?;
    let options = RunOptions {
        device: args.device,
        resume: args.resume,
    };
    let bar = progress_bar(args.quiet, settings.steps)?;
    let mut text = ProgressText::new(&settings, &args.out, args.resume);
    let stop_after = args.stop_after;
    let outcome = train(&args.out, &settings, &options, |event| {
        match event {
            Event::Start { step, .. } => {
                bar.set_position(*step);
                for warning in settings.warnings() {
                    bar.suspend(|| eprintln!("warning: {warning}"));
                }
            }
            Event::Step { step, .. } => {
                bar.set_position(step + 1);
                if stop_after.is_some_and(|k| step + 1 >= k) {
                    return ControlFlow::Break(());
                }
            }
            Event::Row(row) => bar.set_message(text.bar_message(row)),
            Event::Evaluated(_) | Event::Checkpoint { .. } | Event::CheckpointWrite { .. } => {}
        }
        if let Some(line) = text.line(event) {
            // A closed stdout (`| head`) must not stop the run: its files are the product.
            bar.suspend(|| {
                let _ = outln!("{line}");
            });
        }
        ControlFlow::Continue(())
    })?;
    bar.finish_and_clear();
    for line in text.summary(&outcome) {
        let _ = outln!("{line}");
    }
    Ok(())
}
