//! `hyperlens cache`: the activations of selected hook points (TransformerLens names;
//! `hyperlens_model::hooks`) over a problem set, streamed in batches to one `.npz` array per hook
//! (`hyperlens_probe::cache_activations`), with a JSON sidecar.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use hyperlens_io::sidecars::ProblemsSource;
use hyperlens_model::{Device, Evaluator};
use hyperlens_probe::{
    cache_problems, CacheParams, CacheSummary, LogicSequences, SravenProblems, TaskProblems,
};
use hyperlens_tasks::npz::{load_logic, load_problems};
use hyperlens_tasks::sraven::SampleStream;
use hyperlens_train::TrainSettings;

use super::common::{progress_bar, sraven_params, ProblemArgs, ProblemSource, SetArg};
use super::dispatch::{logic_set, resolve_split, Checkpoint};

/// Arguments of `hyperlens cache`.
#[derive(Debug, Args)]
pub struct CacheArgs {
    /// The checkpoint: a SRAVEN or fuzzy-logic directory, or with `--tokens` a language model
    /// (GGUF file, Hugging Face GPT-2 / Llama directory, hyperlens token model).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// A language model's input: comma-separated token ids (one sequence; instead of problems).
    #[arg(long, conflicts_with_all = ["problems", "split", "set", "seed", "unpermuted", "other_split", "text"])]
    pub tokens: Option<String>,
    /// A language model's input as text, tokenized by the model's own tokenizer (Hugging Face's
    /// default for the BOS; the ids are recorded as `--tokens` would be).
    #[arg(long, conflicts_with_all = ["problems", "split", "set", "seed", "unpermuted", "other_split"])]
    pub text: Option<String>,
    /// Where the problems come from.
    #[command(flatten)]
    pub problems: ProblemArgs,
    /// Hook-name patterns, comma-separated (`blocks.*.hook_resid_post,blocks.0.attn.hook_pattern`;
    /// `*` matches one name part, `**` anything). `hyperlens cache --list-hooks` lists the names.
    #[arg(long, value_delimiter = ',', required_unless_present = "list_hooks")]
    pub hooks: Vec<String>,
    /// Positions kept along each hook's position axis (the query axis of scores and patterns),
    /// comma-separated [default: all].
    #[arg(long, value_delimiter = ',')]
    pub positions: Option<Vec<usize>>,
    /// Output `.npz`; the sidecar goes beside it with the extension `.json`.
    #[arg(long, required_unless_present = "list_hooks")]
    pub out: Option<PathBuf>,
    /// Compute device: cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Problems per forward pass; memory is bounded by this, not by N.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Print the checkpoint's hook names with their shapes for one problem, and stop.
    #[arg(long)]
    pub list_hooks: bool,
}

/// Runs `hyperlens cache`.
///
/// # Errors
/// A bad checkpoint, problem source, hook pattern or position; an unavailable device; a failed
/// write.
pub fn run(args: CacheArgs) -> anyhow::Result<()> {
    if args.batch == 0 {
        bail!("--batch must be positive");
    }
    let device = args.device.to_candle()?;
    if args.tokens.is_some() || args.text.is_some() {
        return run_lm(&args, &device);
    }
    let ev = Evaluator::load(&args.checkpoint, &device)?;
    let cfg = ev.config().clone();
    if args.list_hooks {
        for name in hyperlens_model::hooks::hook_names(&cfg) {
            outln!("{name}")?;
        }
        return Ok(());
    }
    let Some(out) = args.out.clone() else {
        bail!("--out is required");
    };
    let params = CacheParams {
        hooks: args.hooks.clone(),
        positions: args.positions.clone(),
    };
    let checkpoint = super::dispatch::checkpoint(&args.checkpoint)?;
    super::common::create_parent("--out", &out)?;
    let (summary, source) = match checkpoint {
        Checkpoint::Logic(settings) => cache_logic(&args, &ev, &settings, &params, &out)?,
        Checkpoint::Sraven => cache_sraven(&args, &ev, &params, &out)?,
    };
    let summary = summary.with_context(|| format!("caching {}", args.checkpoint.display()))?;
    let sidecar = summary.problems_sidecar(&args.checkpoint, &params, cfg.mixer, source);
    let side = hyperlens_io::write_sidecar(&out, &sidecar)?;
    outln!(
        "wrote {} ({} problems, {} arrays) and {}",
        out.display(),
        summary.n,
        summary.arrays.len(),
        side.display()
    )?;
    Ok(())
}

/// What caching returned, and the `source` of the sidecar. The caching error is handed back rather
/// than raised so that the caller names the checkpoint; errors of reading the problems are raised.
type Cached = (hyperlens_probe::Result<CacheSummary>, ProblemsSource);

/// Caches over `problems` ([`cache_problems`]) with a progress bar counting `unit`.
fn cache_over(
    args: &CacheArgs,
    ev: &Evaluator,
    problems: TaskProblems<'_>,
    params: &CacheParams,
    out: &Path,
    unit: &str,
) -> hyperlens_probe::Result<CacheSummary> {
    let bar = progress_bar(problems.len() as u64, "cache", unit);
    let s = cache_problems(ev, problems, args.batch, params, out, |d| {
        bar.set_position(d as u64)
    });
    bar.finish_and_clear();
    s
}

/// Caches a fuzzy-logic checkpoint's activations over the sequences of `--problems` or of a
/// sampled logic set.
fn cache_logic(
    args: &CacheArgs,
    ev: &Evaluator,
    settings: &TrainSettings,
    params: &CacheParams,
    out: &Path,
) -> anyhow::Result<Cached> {
    let p = &args.problems;
    if let Some(path) = &p.problems {
        let set = load_logic(path, &settings.logic.params())?;
        let problems = TaskProblems::Logic(LogicSequences::Set(Box::new(set)));
        let s = cache_over(args, ev, problems, params, out, "sequences");
        return Ok((s, ProblemsSource::file(path.display())));
    }
    let split = resolve_split(p, settings, &args.checkpoint)?;
    let set = logic_set(p.set.unwrap_or(SetArg::Ood));
    let problems = TaskProblems::Logic(LogicSequences::Sampled {
        split: &split,
        set,
        n: p.n,
        seed: p.seed,
    });
    let s = cache_over(args, ev, problems, params, out, "sequences");
    Ok((
        s,
        ProblemsSource::sampled(split.name().to_string(), set.name(), p.n, p.seed, None),
    ))
}

/// Caches a SRAVEN checkpoint's activations over the problems of `--problems` or of a sampled
/// set.
fn cache_sraven(
    args: &CacheArgs,
    ev: &Evaluator,
    params: &CacheParams,
    out: &Path,
) -> anyhow::Result<Cached> {
    let sraven = sraven_params(&args.checkpoint, ev.config())?;
    let source = args.problems.resolve(&args.checkpoint, sraven)?;
    let describe = source.source();
    let problems = match source {
        ProblemSource::File(path) => SravenProblems::Set(load_problems(&path, &sraven)?),
        ProblemSource::Sampled {
            split,
            set,
            n,
            seed,
            unpermuted,
        } => SravenProblems::Sampled {
            stream: SampleStream::new(&split, set, seed, unpermuted)?,
            n,
        },
    };
    let s = cache_over(
        args,
        ev,
        TaskProblems::Sraven(Box::new(problems)),
        params,
        out,
        "problems",
    );
    Ok((s, describe))
}

/// `hyperlens cache --tokens / --text`: a language model's activations on one token sequence.
fn run_lm(args: &CacheArgs, device: &candle_core::Device) -> anyhow::Result<()> {
    let ids = super::attention::input_ids(
        &args.checkpoint,
        args.tokens.as_deref(),
        args.text.as_deref(),
    )?;
    let model = hyperlens_model::lm::load(&args.checkpoint, device)?;
    if args.list_hooks {
        for name in model.hook_names() {
            outln!("{name}")?;
        }
        return Ok(());
    }
    let Some(out) = args.out.clone() else {
        bail!("--out is required");
    };
    super::common::create_parent("--out", &out)?;
    let params = CacheParams {
        hooks: args.hooks.clone(),
        positions: args.positions.clone(),
    };
    let summary = hyperlens_probe::cache_lm_activations(&model, &ids, &params, &out)
        .with_context(|| format!("caching {}", args.checkpoint.display()))?;
    let sidecar = summary.tokens_sidecar(&args.checkpoint, &params, &ids)?;
    let side = hyperlens_io::write_sidecar(&out, &sidecar)?;
    outln!(
        "wrote {} ({} tokens, {} arrays) and {}",
        out.display(),
        ids.len(),
        summary.arrays.len(),
        side.display()
    )?;
    Ok(())
}
