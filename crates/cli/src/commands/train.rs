//! `hyperlens train`: train a model with the paper's recipe (SRAVEN, fuzzy logic) or a token model on
//! the induction corpus, into a run directory that is also a checkpoint; `--resume` continues a run
//! exactly.

use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Parser as _};
use hyperlens_model::{Device, Mixer, Task};
use hyperlens_train::{
    new_group, read_settings, resume_group, train, train_group, Combine, EndedRun, Event,
    GroupFile, GroupRun, ModelSize, OutProblem, ProgressText, RunOptions, TrainError,
    TrainSettings, Variation, FAILED_FILE,
};
use indicatif::{ProgressBar, ProgressStyle};

/// Arguments of `hyperlens train`. Unset options take the task's defaults (the paper's recipe) or,
/// with `--resume`, the run's saved settings.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The task: sraven, logic or induction [default: sraven].
    #[arg(long, value_parser = parse_task)]
    pub task: Option<Task>,
    /// The sequence mixer: softmax, linear, hyla, linear-rmshead, hyla-no-rmshead, hyla-linear-value,
    /// hyla-linear-value-no-rmshead, softmax-hypatt [default: hyla; induction softmax].
    #[arg(long)]
    pub mixer: Option<Mixer>,
    /// The split: sraven `paper-seed0|1|2|2024` or `seed{N}` [default: paper-seed0]; logic `seed{N}`
    /// (task shuffle) and induction `seed{N}` (bigram table) [default: seed0].
    #[arg(long, conflicts_with = "splits")]
    pub split: Option<String>,
    /// Several runs trained together in one batched model, one per split (comma-separated);
    /// zipped with the other lists unless --grid. --out is then the group's directory.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub splits: Vec<String>,
    /// Total optimiser updates [default: sraven 156250, logic 50000, induction 3000].
    #[arg(long)]
    pub steps: Option<u64>,
    /// Problems (sequences) per update [default: 128; induction 32].
    #[arg(long)]
    pub batch: Option<usize>,
    /// Seed of the initialisation, the training stream and the dropout masks [default: 0].
    #[arg(long, conflicts_with = "seeds")]
    pub seed: Option<u64>,
    /// Several runs trained together in one batched model, one per seed (comma-separated, e.g.
    /// 0,1,2); zipped with the other lists unless --grid. --out is then the group's directory,
    /// with one ordinary run directory per run.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub seeds: Vec<u64>,
    /// Combine the lists (--seeds, --splits, --lr, --weight-decay) as every combination instead of
    /// zipping them.
    #[arg(long)]
    pub grid: bool,
    /// Compute device: cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// The run directory (created; must be new or empty unless --resume).
    #[arg(long)]
    pub out: PathBuf,
    /// Continue the run in --out exactly where its last checkpoint left it.
    #[arg(long)]
    pub resume: bool,
    /// Peak learning rate (paper grid: 1e-3, 3e-4) [default: 1e-3]; a comma-separated list trains
    /// one run per value together.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub lr: Vec<f64>,
    /// Decoupled weight decay on parameters with >= 2 dims (paper grid: 0.1, 0.3) [default: 0.1];
    /// a comma-separated list trains one run per value together.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub weight_decay: Vec<f64>,
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

/// `hyperlens train`'s arguments alone, for parsing a sweep run's argument list.
#[derive(Debug, clap::Parser)]
#[command(name = "train", no_binary_name = true)]
struct TrainOnly {
    #[command(flatten)]
    args: TrainArgs,
}

/// Parses `args` (a sweep run's `--key value` list, without `--out`) as `hyperlens train`'s
/// arguments with `--out out`, and `--resume` when `resume`.
///
/// # Errors
/// Clap's error as one line (an unknown flag, a bad value).
pub(crate) fn parse_train_args(
    args: &[String],
    out: &Path,
    resume: bool,
) -> anyhow::Result<TrainArgs> {
    let mut all = args.to_vec();
    all.push("--out".into());
    all.push(out.display().to_string());
    if resume {
        all.push("--resume".into());
    }
    all.push("--quiet".into());
    TrainOnly::try_parse_from(&all)
        .map(|t| t.args)
        .map_err(|e| {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            anyhow::anyhow!("{}", first.trim_start_matches("error: "))
        })
}

/// Sets `field` to the flag's value when given.
fn set<T: Clone>(field: &mut T, value: &Option<T>) {
    if let Some(v) = value {
        *field = v.clone();
    }
}

/// The lists of a group (`--seeds`, `--splits`, and `--lr` / `--weight-decay` with more than one
/// value).
fn variation(args: &TrainArgs) -> Variation {
    let list = |v: &[f64]| if v.len() > 1 { v.to_vec() } else { Vec::new() };
    Variation {
        seeds: args.seeds.clone(),
        splits: args.splits.clone(),
        lrs: list(&args.lr),
        weight_decays: list(&args.weight_decay),
    }
}

/// Parses `--task` (a training parameter, as the message says).
///
/// # Errors
/// A name that is not a task's.
fn parse_task(name: &str) -> Result<Task, String> {
    name.parse::<Task>()
        .map_err(|e| format!("invalid training parameter: {e}"))
}

/// The settings of the run in `dir`: the task defaults (or the saved settings with `--resume`)
/// overridden by the flags that were given.
pub(crate) fn settings(args: &TrainArgs, dir: &Path) -> anyhow::Result<TrainSettings> {
    let mut s = if args.resume {
        let s = read_settings(dir)
            .with_context(|| format!("--resume: reading the run in {}", dir.display()))?;
        if let Some(t) = args.task {
            if t != s.task {
                bail!("--task {t}: the run in {} trains {}", dir.display(), s.task);
            }
        }
        s
    } else {
        TrainSettings::for_task(args.task.unwrap_or(Task::Sraven))
    };
    set(&mut s.mixer, &args.mixer);
    set(&mut s.split, &args.split);
    set(&mut s.steps, &args.steps);
    set(&mut s.batch, &args.batch);
    set(&mut s.seed, &args.seed);
    if let [lr] = args.lr.as_slice() {
        s.lr = *lr;
    }
    if let [wd] = args.weight_decay.as_slice() {
        s.weight_decay = *wd;
    }
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

/// Runs `hyperlens train`: one run, or with lists (`--seeds`, `--splits`, `--lr a,b`,
/// `--weight-decay a,b`) or `--resume` on a group directory, a group of runs trained together.
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
    let is_group = args.resume && GroupFile::read(&args.out)?.is_some();
    if is_group || variation(&args).is_group() {
        return run_group(args, is_group);
    }
    let settings = settings(&args, &args.out)?;
    let options = RunOptions {
        device: args.device,
        resume: args.resume,
    };
    let bar = progress_bar(args.quiet, settings.steps)?;
    let mut text = ProgressText::new(&settings, &args.out, args.resume);
    let stop_after = args.stop_after;
    let outcome = train(&args.out, &settings, &options, |event| {
        on_event(&bar, &mut text, &settings, stop_after, event, "")
    })?;
    bar.finish_and_clear();
    for line in text.summary(&outcome) {
        let _ = outln!("{line}");
    }
    Ok(())
}

/// The front end's handling of one event of a run: the progress bar, `--stop-after`, and the
/// printed line (prefixed by `prefix`, the run's name in a group).
fn on_event(
    bar: &ProgressBar,
    text: &mut ProgressText,
    settings: &TrainSettings,
    stop_after: Option<u64>,
    event: &Event<'_>,
    prefix: &str,
) -> ControlFlow<()> {
    match event {
        Event::Start { step, .. } => {
            bar.set_position(*step);
            for warning in settings.warnings() {
                bar.suspend(|| eprintln!("warning: {prefix}{warning}"));
            }
        }
        Event::Step { step, .. } => {
            bar.set_position(step + 1);
            if stop_after.is_some_and(|k| step + 1 >= k) {
                return ControlFlow::Break(());
            }
        }
        Event::Row(row) => bar.set_message(format!("{prefix}{}", text.bar_message(row))),
        Event::Evaluated(_) | Event::Checkpoint { .. } | Event::CheckpointWrite { .. } => {}
    }
    if let Some(line) = text.line(event) {
        // A closed stdout (`| head`) must not stop the run: its files are the product.
        bar.suspend(|| {
            let _ = outln!("{prefix}{line}");
        });
    }
    ControlFlow::Continue(())
}

/// `hyperlens train` for a group: the runs of the lists in subdirectories of `--out` (with
/// `group.json`), trained together; or, with `--resume` on a group directory, the group's
/// unfinished runs continued together (finished and failed runs are skipped and listed).
///
/// # Errors
/// As [`run`]; lists given with `--resume` on a group; an error when any run of the group
/// diverged (after the others finished).
fn run_group(args: TrainArgs, is_group: bool) -> anyhow::Result<()> {
    let out = args.out.clone();
    let runs: Vec<GroupRun> = if is_group {
        if variation(&args).is_group() {
            bail!(
                "--resume: {} is a group (its runs are listed in {}); resume it without \
                 --seeds, --splits or lists of --lr / --weight-decay",
                out.display(),
                hyperlens_train::GROUP_FILE
            );
        }
        let runs = resume_group(&out, |dir| settings(&args, dir), print_ended)?.unwrap_or_default();
        if runs.is_empty() {
            let _ = outln!(
                "nothing to resume in {}: every run of the group ended",
                out.display()
            );
            return Ok(());
        }
        runs
    } else {
        if args.resume {
            bail!(
                "--resume with lists: {} has no {}; to continue one run, give its directory \
                 without the lists",
                out.display(),
                hyperlens_train::GROUP_FILE
            );
        }
        let combine = if args.grid {
            Combine::Grid
        } else {
            Combine::Zip
        };
        match new_group(&out, &settings(&args, &out)?, &variation(&args), combine) {
            Err(TrainError::GroupOut { path, problem }) => {
                let path = path.display();
                match problem {
                    OutProblem::File => bail!("--out {path} is a file, not a directory"),
                    OutProblem::NotEmpty => bail!(
                        "--out {path} is not empty: pass --resume to continue the group there, or \
                         choose another directory"
                    ),
                    OutProblem::Unreadable(e) => {
                        return Err(anyhow::Error::new(e).context(format!("--out {path}")))
                    }
                }
            }
            runs => runs?,
        }
    };
    let options = RunOptions {
        device: args.device,
        resume: args.resume,
    };
    train_together(&runs, &options, args.quiet, args.stop_after, &out)
}

/// Prints the line of a run of a resumed group that had already ended.
fn print_ended(run: &EndedRun) {
    match run {
        EndedRun::Complete { name, record } => {
            let _ = outln!("{name}: complete ({})", record.display());
        }
        EndedRun::Diverged { name, failed } => {
            let dir = failed.parent().unwrap_or(failed);
            let _ = outln!(
                "{name}: diverged earlier ({}); not resumed (resume it alone with --out {} \
                 --resume to retry)",
                failed.display(),
                dir.display()
            );
        }
    }
}

/// Trains `runs` together in one batched model (one run: the ordinary loop), printing each run's
/// lines prefixed by its name; `out` names the group in the messages.
///
/// # Errors
/// As [`hyperlens_train::train_group`]; an error naming the runs that diverged (after the others
/// finished).
pub(crate) fn train_together(
    runs: &[GroupRun],
    options: &RunOptions,
    quiet: bool,
    stop_after: Option<u64>,
    out: &Path,
) -> anyhow::Result<()> {
    let Some(first) = runs.first() else {
        return Ok(());
    };
    let steps = first.settings.steps;
    let bar = progress_bar(quiet, steps)?;
    let names: Vec<String> = runs
        .iter()
        .map(|r| {
            r.out
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect();
    let prefixes: Vec<String> = names.iter().map(|n| format!("[{n}] ")).collect();
    let mut texts: Vec<ProgressText> = runs
        .iter()
        .map(|r| ProgressText::new(&r.settings, &r.out, options.resume))
        .collect();
    if runs.len() > 1 {
        let _ = outln!(
            "training {} runs together in one batched model -> {}",
            runs.len(),
            out.display()
        );
    }
    let results = train_group(runs, options, |i, event| {
        on_event(
            &bar,
            &mut texts[i],
            &runs[i].settings,
            stop_after,
            event,
            &prefixes[i],
        )
    })?;
    bar.finish_and_clear();
    let mut failed = Vec::new();
    let mut stopped = None;
    for (i, result) in results.iter().enumerate() {
        match result {
            Ok(outcome) if outcome.record.is_none() => stopped = Some(outcome.step),
            Ok(outcome) => {
                for line in texts[i].summary(outcome) {
                    let _ = outln!("{}{line}", prefixes[i]);
                }
            }
            Err(e) => {
                let file = runs[i].out.join(FAILED_FILE);
                failed.push(format!("{} ({e}; {})", names[i], file.display()));
            }
        }
    }
    if let Some(step) = stopped {
        let what = if runs.len() > 1 { " the group" } else { "" };
        let _ = outln!(
            "stopped at step {step} of {steps}; continue{what} with: hyperlens train --out {} --resume",
            out.display()
        );
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} runs diverged: {}; the others finished",
            failed.len(),
            runs.len(),
            failed.join(", ")
        );
    }
    Ok(())
}
