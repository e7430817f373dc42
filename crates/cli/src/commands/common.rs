//! Pieces shared by several subcommands: where SRAVEN problems come from, and progress bars. Output
//! files are written by `hyperlens_io` (atomically).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use hyperlens_tasks::sraven::{Set, Split, SravenParams};
use indicatif::{ProgressBar, ProgressStyle};

/// Where the problems come from: a problem-set file, or sampled from a split.
#[derive(Debug, Clone, Args)]
pub struct ProblemArgs {
    /// A problem-set file written by `hyperlens tasks sample` (arrays x, y, rules, perms).
    #[arg(long, conflicts_with_all = ["split", "set", "n", "seed", "unpermuted"])]
    pub problems: Option<PathBuf>,
    /// Sample problems from this split (`paper-seed0|1|2|2024` or `seed{N}`).
    #[arg(long, required_unless_present = "problems")]
    pub split: Option<String>,
    /// Which task list to sample from: `id` (in-distribution) or `ood` (held out).
    #[arg(long, default_value = "ood")]
    pub set: Set,
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

impl ProblemArgs {
    /// Resolves the arguments for a model whose task has `params`.
    ///
    /// # Errors
    /// An unknown split or a zero `--n`.
    pub fn resolve(&self, params: SravenParams) -> anyhow::Result<ProblemSource> {
        match (&self.problems, &self.split) {
            (Some(path), _) => Ok(ProblemSource::File(path.clone())),
            (None, Some(name)) => {
                if self.n == 0 {
                    bail!("--n must be positive");
                }
                Ok(ProblemSource::Sampled {
                    split: Split::named_with(name, params)?,
                    set: self.set,
                    n: self.n,
                    seed: self.seed,
                    unpermuted: self.unpermuted,
                })
            }
            (None, None) => bail!("give --problems FILE or --split NAME"),
        }
    }
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
