//! Pieces shared by several subcommands: where SRAVEN problems come from, progress bars, and atomic
//! writes of output files.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
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

/// `path` with `.tmp` appended: where an output is written before it is renamed into place.
fn tmp_path(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

/// Writes `bytes` to `path` atomically (`path.tmp`, then rename); the temporary file is removed if
/// either step fails.
///
/// # Errors
/// The failed write or rename, naming the file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = tmp_path(path);
    let res = std::fs::write(&tmp, bytes)
        .with_context(|| format!("writing {}", tmp.display()))
        .and_then(|()| rename(&tmp, path));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Writes an uncompressed `.npz` (numpy.savez layout) atomically: `fill` adds the arrays to a writer
/// on `path.tmp`, which is then renamed to `path`; the temporary file is removed on failure.
///
/// # Errors
/// A failed create, array write, finish or rename, naming the file.
pub fn write_npz_atomic(
    path: &Path,
    fill: impl FnOnce(&mut ndarray_npy::NpzWriter<File>) -> Result<(), ndarray_npy::WriteNpzError>,
) -> anyhow::Result<()> {
    let tmp = tmp_path(path);
    let res = File::create(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))
        .and_then(|file| {
            let mut npz = ndarray_npy::NpzWriter::new(file);
            fill(&mut npz).with_context(|| format!("writing {}", tmp.display()))?;
            npz.finish()
                .with_context(|| format!("writing {}", tmp.display()))?;
            rename(&tmp, path)
        });
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

fn rename(tmp: &Path, path: &Path) -> anyhow::Result<()> {
    std::fs::rename(tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}
