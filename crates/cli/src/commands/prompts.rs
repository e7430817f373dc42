//! `hyperlens tasks prompts` (write a generated JSONL prompt file) and `hyperlens tasks
//! check-prompts` (validate one and summarise it); the format, the sites and the generators are
//! `hyperlens_tasks::prompts`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use hyperlens_tasks::prompts::{
    icl, relations, words::read_words, IclParams, PromptSet, RelationsParams, SiteSpec,
};

/// The prompt generators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Generator {
    /// Few-shot operations on domains (`Q: x` / `A: y`), a quarter of the operation x domain
    /// combinations held out.
    Icl,
    /// Structural relations of a key word to the query word, held out on a disjoint half of the
    /// vocabulary.
    Relations,
}

/// Arguments of `hyperlens tasks prompts`.
#[derive(Debug, Args)]
pub struct PromptsArgs {
    /// The generator.
    #[arg(long)]
    pub generator: Generator,
    /// Number of prompts.
    #[arg(long)]
    pub n: usize,
    /// Seed of the prompts and of the held-out part.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// icl: demonstrations per prompt [default: 5].
    #[arg(long)]
    pub shots: Option<usize>,
    /// relations: a word list, one word per line (e.g. a model's single-token words) [default: the
    /// project's 64 common words].
    #[arg(long)]
    pub words: Option<PathBuf>,
    /// Output JSONL prompt file.
    #[arg(long)]
    pub out: PathBuf,
}

/// Arguments of `hyperlens tasks check-prompts`.
#[derive(Debug, Args)]
pub struct CheckPromptsArgs {
    /// The JSONL prompt file.
    pub file: PathBuf,
    /// A site spec to check against the prompts' roles (e.g. "query: last; keys: demo_output,
    /// query_input"); token indices are checked once the prompts are tokenized.
    #[arg(long)]
    pub sites: Option<String>,
}

/// The factors of a set as `name (values: v1, v2)`, `;`-separated.
fn factors_line(set: &PromptSet) -> String {
    set.factors()
        .iter()
        .map(|f| format!("{} ({})", f.name, f.values.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs `tasks prompts`: generates, writes the file, returns the one summary line.
///
/// # Errors
/// A flag that does not apply to the generator, a bad parameter or word file, or a file that
/// cannot be written.
pub fn generate(args: &PromptsArgs) -> Result<String> {
    let set = match args.generator {
        Generator::Icl => {
            if args.words.is_some() {
                bail!("--words applies to --generator relations");
            }
            icl(&IclParams {
                n: args.n,
                seed: args.seed,
                shots: args.shots.unwrap_or(IclParams::default().shots),
                ..IclParams::default()
            })?
        }
        Generator::Relations => {
            if args.shots.is_some() {
                bail!("--shots applies to --generator icl");
            }
            let words = match &args.words {
                Some(p) => Some(read_words(p).context("--words")?),
                None => None,
            };
            relations(&RelationsParams {
                n: args.n,
                seed: args.seed,
                words,
                ..RelationsParams::default()
            })?
        }
    };
    super::common::create_parent("--out", &args.out)?;
    set.save(&args.out)?;
    let held = set.unseen_in_training();
    let sites = set
        .sites
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    Ok(format!(
        "wrote {} prompts to {}; factors: {}; held out: {}; --sites \"{sites}\"",
        set.len(),
        args.out.display(),
        factors_line(&set),
        if held.is_empty() {
            "none".to_string()
        } else {
            held.join(" ")
        },
    ))
}

/// Runs `tasks check-prompts`: loads and validates the file (and the sites' roles), returns the
/// summary: factors, counts per split and per label combination, what training never shows.
///
/// # Errors
/// The file's first bad line; a bad site spec or one naming a role a prompt lacks.
pub fn check(args: &CheckPromptsArgs) -> Result<String> {
    let set = PromptSet::load(&args.file)?;
    let (per_split, per_combo) = set.counts();
    let mut out = format!("{}: {} prompts\n", args.file.display(), set.len());
    out += &format!("factors: {}\n", factors_line(&set));
    out += "split counts:";
    for (s, c) in &per_split {
        out += &format!(" {s}={c}");
    }
    out += "\n";
    let held = set.unseen_in_training();
    if !held.is_empty() {
        out += &format!("unseen in training: {}\n", held.join(" "));
    }
    if let Some(spec) = &args.sites {
        let spec = SiteSpec::parse(spec).context("--sites")?;
        let (q, k) = spec.check_segments(&set).context("--sites")?;
        out += &format!("sites \"{spec}\": {q} query and {k} key positions per prompt\n");
    }
    out += "prompts per label combination:\n";
    for (combo, c) in &per_combo {
        let combo = if combo.is_empty() {
            "(no labels)"
        } else {
            combo
        };
        out += &format!("{c:>8}  {combo}\n");
    }
    Ok(out.trim_end().to_string())
}
