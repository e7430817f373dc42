//! Pieces shared by several subcommands: where SRAVEN problems come from, and progress bars. Output
//! files are written by `hyperlens_io` (atomically).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, ValueEnum};
use hyperlens_io::sidecars::ProblemsSource;
use hyperlens_model::checkpoint::CONFIG_FILE;
use hyperlens_model::{Config, RunRecord, Task};
use hyperlens_tasks::sraven::{Set, Split, SravenParams};

use indicatif::{ProgressBar, ProgressStyle};

/// The parser of a `--task` flag: one of the task names, each listed with its help, as a [`Task`]
/// (`tasks sample` writes `sraven` and `logic` problem sets).
pub fn task_parser() -> impl TypedValueParser<Value = Task> {
    let help = |t: Task| match t {
        Task::Sraven => "Symbolic Raven progressive matrices",
        Task::Logic => "The fuzzy-logic task",
        Task::Induction => "The induction token corpus",
    };
    PossibleValuesParser::new(Task::ALL.map(|t| PossibleValue::new(t.name()).help(help(t))))
        .try_map(|name| name.parse::<Task>())
}

/// Which task list to draw from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SetArg {
    /// In-distribution tasks.
    Id,
    /// Held-out (OOD) tasks: for logic, the held-out pairs of known terms.
    Ood,
    /// Logic only: pairs of terms never seen in training.
    Unknown,
}

/// Where the problems come from: a problem-set file, or sampled from a split (by default the split
/// the checkpoint was trained on).
#[derive(Debug, Clone, Args)]
pub struct ProblemArgs {
    /// A problem-set file written by `hyperlens tasks sample` (arrays x, y, rules, perms).
    #[arg(long, conflicts_with_all = ["split", "set", "n", "seed", "unpermuted", "other_split"])]
    pub problems: Option<PathBuf>,
    /// Sample problems from this split (`paper-seed0|1|2|2024` or `seed{N}`). Default: the split
    /// the checkpoint's run files (train.json, train_state.json) record.
    #[arg(long)]
    pub split: Option<String>,
    /// Allow a --split other than the one the checkpoint was trained on (its OOD tasks are then
    /// partly training tasks of the model, and the reverse).
    #[arg(long)]
    pub other_split: bool,
    /// Which task list to sample from: `id` (in-distribution) or `ood` (held out) [default: ood];
    /// fuzzy-logic checkpoints also take `unknown` (pairs of unknown terms) and evaluate all three
    /// sets when none is given.
    #[arg(long, value_enum)]
    pub set: Option<SetArg>,
    /// Number of problems to sample.
    #[arg(long, default_value_t = 10_000)]
    pub n: usize,
    /// Seed of the sample (domain-separated from training streams).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sample problems without feature permutation (the latent-code analyses use them).
    #[arg(long)]
    pub unpermuted: bool,
}

/// A resolved problem source.
#[derive(Debug, Clone)]
pub enum ProblemSource {
    /// A problem-set file.
    File(PathBuf),
    /// Sampled from a split.
    Sampled {
        /// The split.
        split: Split,
        /// ID or OOD.
        set: Set,
        /// Number of problems.
        n: usize,
        /// Sample seed.
        seed: u64,
        /// Identity permutations.
        unpermuted: bool,
    },
}

impl ProblemSource {
    /// The source as the `source` object of an output's sidecar: `problems` (the file, or
    /// `generated`), and for a sampled set `split`, `set`, `n`, `seed`, `unpermuted`.
    pub fn source(&self) -> ProblemsSource {
        match self {
            ProblemSource::File(path) => ProblemsSource::file(path.display()),
            ProblemSource::Sampled {
                split,
                set,
                n,
                seed,
                unpermuted,
            } => ProblemsSource::sampled(
                split.name.to_string(),
                set.to_string(),
                *n,
                *seed,
                Some(*unpermuted),
            ),
        }
    }
}

/// The SRAVEN task a checkpoint's config describes: F = `n_outputs` features, M = `d_in` values,
/// and T = 9 F tokens (`docs/spec/sraven.md`, "Tokens, targets, metrics").
///
/// # Errors
/// A config that does not describe a SRAVEN model, naming `config.json` of `checkpoint` and the
/// field.
pub fn sraven_params(checkpoint: &Path, cfg: &Config) -> anyhow::Result<SravenParams> {
    let file = checkpoint.join(CONFIG_FILE);
    let params = SravenParams {
        features: cfg.n_outputs,
        values: cfg.d_in,
        ..SravenParams::default()
    };
    if let Err(e) = params.check() {
        bail!(
            "{}: n_outputs = {} (features) and d_in = {} (values) do not describe a SRAVEN task: {e}",
            file.display(),
            cfg.n_outputs,
            cfg.d_in
        );
    }
    if cfg.n_tokens != params.n_tokens() || cfg.d_out != cfg.d_in {
        bail!(
            "{}: n_tokens = {} and d_out = {}, but a SRAVEN model with n_outputs = {} and d_in = {} \
             reads {} tokens and answers over {} values (is this a fuzzy-logic or token model?)",
            file.display(),
            cfg.n_tokens,
            cfg.d_out,
            cfg.n_outputs,
            cfg.d_in,
            params.n_tokens(),
            cfg.d_in
        );
    }
    Ok(params)
}

impl ProblemArgs {
    /// Resolves the arguments for the checkpoint in `checkpoint`, whose task has `params`. Without
    /// `--problems` or `--split`, the split is the one the checkpoint's run files record; a
    /// `--split` that differs from it needs `--other-split`.
    ///
    /// # Errors
    /// An unknown split, a split that does not fit the model's config (naming `config.json` and
    /// the field), a split other than the recorded one, no split at all, a zero `--n`, or run files
    /// that cannot be read (naming them).
    pub fn resolve(
        &self,
        checkpoint: &Path,
        params: SravenParams,
    ) -> anyhow::Result<ProblemSource> {
        if let Some(path) = &self.problems {
            return Ok(ProblemSource::File(path.clone()));
        }
        let recorded = RunRecord::read(checkpoint)?.split.map(|s| s.to_string());
        let name = match (&self.split, &recorded) {
            (Some(given), Some(rec)) if given != rec && !self.other_split => bail!(
                "--split {given} differs from the split {rec} that {} was trained on (its run \
                 files say so): the held-out tasks of one are training tasks of the other; pass \
                 --other-split to use it anyway",
                checkpoint.display()
            ),
            (Some(given), _) => given.clone(),
            (None, Some(rec)) => rec.clone(),
            (None, None) => bail!(
                "give --problems FILE or --split NAME: {} records no training split",
                checkpoint.display()
            ),
        };
        if self.n == 0 {
            bail!("--n must be positive");
        }
        let split = Split::named_with(&name, params).map_err(|e| {
            if Split::paper_names().contains(&name.as_str()) {
                anyhow::anyhow!(
                    "{}: n_outputs = {} features, but the paper split `{name}` is defined for 4 \
                     features; use a seeded split (seed{{N}}): {e}",
                    checkpoint.join(CONFIG_FILE).display(),
                    params.features
                )
            } else {
                anyhow::Error::from(e).context(format!("--split {name}"))
            }
        })?;
        let set = match self.set {
            None | Some(SetArg::Ood) => Set::Ood,
            Some(SetArg::Id) => Set::Id,
            Some(SetArg::Unknown) => {
                bail!("--set unknown applies to fuzzy-logic checkpoints (sraven has id and ood)")
            }
        };
        Ok(ProblemSource::Sampled {
            split,
            set,
            n: self.n,
            seed: self.seed,
            unpermuted: self.unpermuted,
        })
    }
}

/// The one rule for `--out` (and `--save-logits`) paths in every command: a missing parent
/// directory is created, as `mkdir -p` would; an existing file in the way is an error naming the
/// flag.
///
/// # Errors
/// The directory cannot be created (naming `flag` and the directory).
pub fn create_parent(flag: &str, path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| {
            anyhow::anyhow!(
                "{flag} {}: cannot create {}: {e}",
                path.display(),
                parent.display()
            )
        })?;
    }
    Ok(())
}

/// A progress bar over `len` items with a short label, drawn on stderr (hidden when not a terminal).
pub fn progress_bar(len: u64, label: &str, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let template = format!(
        "{{spinner}} {label} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{per_sec}}, eta {{eta}})"
    );
    bar.set_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// A spinner for one stage; `done` prints the stage's time.
pub struct Stage {
    bar: ProgressBar,
    name: &'static str,
    t0: Instant,
}

impl Stage {
    pub fn start(name: &'static str) -> Self {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(name);
        bar.enable_steady_tick(Duration::from_millis(120));
        Self {
            bar,
            name,
            t0: Instant::now(),
        }
    }

    pub fn done(self, timings: &mut Vec<(&'static str, f64)>) {
        let s = self.t0.elapsed().as_secs_f64();
        self.bar.finish_and_clear();
        eprintln!("  {:<28} {s:>8.2} s", self.name);
        timings.push((self.name, s));
    }
}
