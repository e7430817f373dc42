//! `hyperlens cache`: the activations of selected hook points (TransformerLens names;
//! `hyperlens_model::hooks`) over a problem set, streamed in batches to one `.npz` array per hook
//! (`hyperlens_probe::cache_activations`), with a JSON sidecar.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use hyperlens_model::eval::batch_tensor;
use hyperlens_model::{Device, Transformer};
use hyperlens_probe::{cache_activations, CacheParams};
use hyperlens_tasks::logic::{logic_chunks, LOGIC_SET_CHUNK};
use hyperlens_tasks::npz::{load_logic, load_problems};
use hyperlens_tasks::sraven::SampleStream;

use super::common::{progress_bar, sraven_params, ProblemArgs, ProblemSource};
use super::tasks::SetArg;

/// Arguments of `hyperlens cache`.
#[derive(Debug, Args)]
pub struct CacheArgs {
    /// The checkpoint: a SRAVEN or fuzzy-logic directory, or with `--tokens` a language model
    /// (GGUF file, Hugging Face GPT-2 / Llama directory, hyperlens token model).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// A language model's input: comma-separated token ids (one sequence; instead of problems).
    #[arg(long, conflicts_with_all = ["problems", "split", "set", "seed", "unpermuted", "other_split"])]
    pub tokens: Option<String>,
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
    if let Some(tokens) = &args.tokens {
        return run_lm(&args, tokens, &device);
    }
    let model = Transformer::load(&args.checkpoint, &device)?;
    let cfg = model.config().clone();
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
    let logic = hyperlens_report::discover::RunInfo::read(&args.checkpoint)
        .task
        .as_deref()
        == Some("logic");
    super::common::create_parent("--out", &out)?;
    let p = &args.problems;
    let (summary, source) = if logic {
        let settings = super::logic_sets::run_settings(&args.checkpoint)?;
        if let Some(path) = &p.problems {
            let set = load_logic(path, &settings.logic.params())?;
            let n = set.y.len();
            let bar = progress_bar(n as u64, "cache", "sequences");
            let batches = (0..n).step_by(args.batch).map(|s| {
                let x = set
                    .x
                    .slice(ndarray::s![s..(s + args.batch).min(n), .., ..])
                    .to_owned();
                Ok(batch_tensor(&x, &device)?)
            });
            let s = cache_activations(&model, batches, n, &params, &out, |d| {
                bar.set_position(d as u64)
            });
            bar.finish_and_clear();
            (
                s,
                serde_json::json!({"problems": path.display().to_string()}),
            )
        } else {
            let split = super::logic_sets::resolve_split(p, &settings, &args.checkpoint)?;
            let set = super::logic_sets::logic_set(p.set.unwrap_or(SetArg::Ood));
            let n = p.n;
            let bar = progress_bar(n as u64, "cache", "sequences");
            let batches = logic_chunks(&split, set, n, LOGIC_SET_CHUNK, p.seed).flat_map(|c| {
                let parts: Vec<hyperlens_probe::Result<_>> = match c {
                    Err(e) => vec![Err(e.into())],
                    Ok(chunk) => {
                        let len = chunk.y.len();
                        (0..len)
                            .step_by(args.batch)
                            .map(|s| {
                                let x = chunk
                                    .x
                                    .slice(ndarray::s![s..(s + args.batch).min(len), .., ..])
                                    .to_owned();
                                Ok(batch_tensor(&x, &device)?)
                            })
                            .collect()
                    }
                };
                parts
            });
            let s = cache_activations(&model, batches, n, &params, &out, |d| {
                bar.set_position(d as u64)
            });
            bar.finish_and_clear();
            (
                s,
                serde_json::json!({"problems": "generated", "split": format!("seed{}", split.seed),
                    "set": hyperlens_probe::logic_set_name(set), "n": n, "seed": p.seed}),
            )
        }
    } else {
        let sraven = sraven_params(&args.checkpoint, &cfg)?;
        let source = p.resolve(&args.checkpoint, sraven)?;
        let describe = source.describe();
        match source {
            ProblemSource::File(path) => {
                let set = load_problems(&path, &sraven)?;
                let n = set.len();
                let bar = progress_bar(n as u64, "cache", "problems");
                let batches = (0..n).step_by(args.batch).map(|s| {
                    Ok(batch_tensor(
                        &set.slice(s, (s + args.batch).min(n)).x,
                        &device,
                    )?)
                });
                let s = cache_activations(&model, batches, n, &params, &out, |d| {
                    bar.set_position(d as u64)
                });
                bar.finish_and_clear();
                (s, describe)
            }
            ProblemSource::Sampled {
                split,
                set,
                n,
                seed,
                unpermuted,
            } => {
                let stream = SampleStream::new(&split, set, seed, unpermuted)?;
                let bar = progress_bar(n as u64, "cache", "problems");
                let batches = stream
                    .batches(n, args.batch)
                    .map(|b| Ok(batch_tensor(&b?.x, &device)?));
                let s = cache_activations(&model, batches, n, &params, &out, |d| {
                    bar.set_position(d as u64)
                });
                bar.finish_and_clear();
                (s, describe)
            }
        }
    };
    let summary = summary.with_context(|| format!("caching {}", args.checkpoint.display()))?;
    let sidecar = serde_json::json!({
        "producer": format!("hyperlens {} cache", env!("CARGO_PKG_VERSION")),
        "checkpoint": args.checkpoint.display().to_string(),
        "mixer": cfg.mixer.to_string(),
        "source": source,
        "hooks": args.hooks,
        "positions": args.positions,
        "arrays": summary.arrays.iter().map(|(n, s)| (n.clone(), serde_json::json!(s))).collect::<serde_json::Map<_, _>>(),
    });
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

/// `hyperlens cache --tokens`: a language model's activations on one token sequence.
fn run_lm(args: &CacheArgs, tokens: &str, device: &candle_core::Device) -> anyhow::Result<()> {
    let ids = super::attention::parse_tokens(tokens)?;
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
    let sidecar = serde_json::json!({
        "producer": format!("hyperlens {} cache", env!("CARGO_PKG_VERSION")),
        "checkpoint": args.checkpoint.display().to_string(),
        "checkpoint_kind": hyperlens_model::lm::detect(&args.checkpoint)?.to_string(),
        "source": {"tokens": ids},
        "hooks": args.hooks,
        "positions": args.positions,
        "arrays": summary.arrays.iter().map(|(n, s)| (n.clone(), serde_json::json!(s))).collect::<serde_json::Map<_, _>>(),
    });
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
