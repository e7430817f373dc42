//! `hyperlens probe`: extract the latent codes of a checkpoint at a site over a problem set, streamed
//! in batches to an `.npz` with labels and a JSON sidecar (docs/spec/latent-codes.md); on a language
//! model, over a prompt file (`--prompts`, `hyperlens_probe::run_prompt_file`; docs/lm-lens.md).

use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use hyperlens_model::lm::CodeForm;
use hyperlens_model::{Device, Evaluator};
use hyperlens_probe::{
    extract_logic, extract_logic_set, extract_problems, run_prompt_file, GeneratedLogicSet,
    LogicProbeParams, LogicProbeSummary, ProbeMeta, ProbeParams, PromptFileRun, PromptProbeParams,
    Site, SravenProblems,
};
use hyperlens_tasks::npz::load_problems;
use hyperlens_tasks::prompts::SiteSpec;
use hyperlens_tasks::sraven::SampleStream;
use hyperlens_train::TrainSettings;

use super::common::{progress_bar, sraven_params, ProblemArgs, ProblemSource, SetArg};
use super::dispatch::{logic_set, resolve_split, Checkpoint};

/// Arguments of `hyperlens probe`. On a fuzzy-logic checkpoint (its train.json says `task:
/// logic`) the codes are labelled by the task's terms ([`probe_logic`]).
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The checkpoint directory (config.json + model.safetensors); with `--prompts`, a language
    /// model (a GGUF file, a Hugging Face GPT-2 / Llama directory, a hyperlens token model).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// A language model's prompt file (JSONL: segments with roles, labels, answer, split; see
    /// `hyperlens tasks prompts` and docs/lm-lens.md): the codes of every prompt at `--sites`.
    #[arg(long, requires = "sites", conflicts_with_all = ["problems", "split", "set", "unpermuted", "other_split", "fixed_query", "fixed_context"])]
    pub prompts: Option<PathBuf>,
    /// With --prompts: the sites by role, e.g. `query: last; keys: demo_output, query_input`.
    #[arg(long, requires = "prompts")]
    pub sites: Option<SiteSpec>,
    /// With --prompts: the form of the code: `pattern` (attention probabilities), `scores`
    /// (pre-softmax) or `no-sink` (probabilities renormalised without position 0).
    #[arg(long, requires = "prompts", default_value = "pattern")]
    pub form: CodeForm,
    /// With --prompts: the factor whose values label the rows (default: the first).
    #[arg(long, requires = "prompts")]
    pub label: Option<String>,
    /// With --prompts: prepend the beginning-of-sequence token, or not (default: the tokenizer's
    /// own default, as Hugging Face's).
    #[arg(long, requires = "prompts")]
    pub prepend_bos: Option<bool>,
    /// With --prompts: keep the residual stream after each layer at the queries (`resid`, the
    /// decoding's upper bound).
    #[arg(long, requires = "prompts")]
    pub resid: bool,
    /// With --prompts: the model with its weights shuffled within each tensor by this seed (the
    /// lens's control).
    #[arg(long, requires = "prompts")]
    pub shuffle_weights: Option<u64>,
    /// Where the problems come from.
    #[command(flatten)]
    pub problems: ProblemArgs,
    /// The site: `paper` (query 35, keys 27 and 31, label = rule of slot 3), `slot:F`, `all-slots`,
    /// or `query:I;keys:J,K,...`. On a logic checkpoint `paper` is the last token's attention to
    /// itself.
    #[arg(long, default_value = "paper")]
    pub site: Site,
    /// Layers to keep, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub layers: Option<Vec<usize>>,
    /// Output `.npz`; the sidecar goes beside it with the extension `.json`.
    #[arg(long)]
    pub out: PathBuf,
    /// Compute device: cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Problems per forward pass; memory is bounded by this, not by N.
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Logic checkpoints: give every sequence one query (the last token's inputs, drawn from
    /// --seed, the same for every --set), so that the codes differ only by the task and the
    /// context.
    #[arg(long, conflicts_with = "fixed_context")]
    pub fixed_query: bool,
    /// Logic checkpoints: give every sequence one context (the first T - 1 tokens' inputs, drawn
    /// from --seed, the same for every --set), so that the codes differ only by the task and the
    /// query.
    #[arg(long)]
    pub fixed_context: bool,
}

/// Runs `hyperlens probe`.
///
/// # Errors
/// A bad checkpoint, problem source, site or layer list; an unavailable device; a failed write.
pub fn run(args: ProbeArgs) -> anyhow::Result<()> {
    if args.batch == 0 {
        bail!("--batch must be positive");
    }
    let device = args.device.to_candle()?;
    if let Some(prompts) = &args.prompts {
        return probe_prompts(&args, prompts, &device);
    }
    let model = Evaluator::load(&args.checkpoint, &device)?;
    let cfg = model.config().clone();
    if let Checkpoint::Logic(settings) = super::dispatch::checkpoint(&args.checkpoint)? {
        super::common::create_parent("--out", &args.out)?;
        let summary = probe_logic(&args, &model, &settings)
            .with_context(|| format!("probing {}", args.checkpoint.display()))?;
        outln!(
            "wrote {} ({} rows, logic, {} mixer); MSE of the last token's prediction {:.6}",
            args.out.display(),
            summary.n_rows,
            cfg.mixer,
            summary.mse
        )?;
        return Ok(());
    }
    if args.fixed_query || args.fixed_context {
        bail!("--fixed-query and --fixed-context apply to fuzzy-logic checkpoints");
    }
    let params = sraven_params(&args.checkpoint, &cfg)?;
    let probe = ProbeParams {
        site: args.site.clone(),
        layers: args.layers.clone(),
    };
    let source = args.problems.resolve(&args.checkpoint, params)?;
    super::common::create_parent("--out", &args.out)?;
    let (problems, meta) = match source {
        ProblemSource::File(path) => (
            SravenProblems::Set(load_problems(&path, &params)?),
            ProbeMeta::for_sraven_file(&args.checkpoint, &path),
        ),
        ProblemSource::Sampled {
            split,
            set,
            n,
            seed,
            unpermuted,
        } => (
            SravenProblems::Sampled {
                stream: SampleStream::new(&split, set, seed, unpermuted)?,
                n,
            },
            ProbeMeta::for_sraven_sampled(&args.checkpoint, split.name, set, seed, unpermuted),
        ),
    };
    let bar = progress_bar(problems.len() as u64, "probe", "problems");
    let summary = extract_problems(&model, problems, args.batch, &probe, &args.out, meta, |d| {
        bar.set_position(d as u64);
        ControlFlow::Continue(())
    });
    bar.finish_and_clear();
    let summary = summary.with_context(|| format!("probing {}", args.checkpoint.display()))?;
    outln!(
        "wrote {} ({} rows, site {}, {} mixer); answer-slot accuracy {:.2} %",
        args.out.display(),
        summary.n_rows,
        args.site,
        cfg.mixer,
        100.0 * summary.slot_accuracy
    )?;
    Ok(())
}

/// `hyperlens probe --prompts`: a language model's codes over a prompt file.
///
/// # Errors
/// A bad prompt file, sites, layers or model; a model without a tokenizer; a failed write.
fn probe_prompts(
    args: &ProbeArgs,
    prompts: &std::path::Path,
    device: &candle_core::Device,
) -> anyhow::Result<()> {
    let Some(sites) = args.sites.clone() else {
        bail!("--prompts needs --sites");
    };
    super::common::create_parent("--out", &args.out)?;
    let run = PromptFileRun {
        checkpoint: args.checkpoint.clone(),
        prompts: prompts.to_path_buf(),
        params: PromptProbeParams {
            sites,
            layers: args.layers.clone(),
            form: args.form,
            batch: args.batch,
            prepend_bos: args.prepend_bos,
            label_factor: args.label.clone(),
            resid: args.resid,
            shuffle_weights: args.shuffle_weights,
        },
        out: args.out.clone(),
    };
    let bar = progress_bar(0, "probe", "prompts");
    let summary = run_prompt_file(&run, device, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        ControlFlow::Continue(())
    });
    bar.finish_and_clear();
    let s = summary.with_context(|| format!("probing {}", args.checkpoint.display()))?;
    let [l, h, q, k] = s.code_shape;
    let behaviour = match s.accuracy {
        Some(a) => format!(
            "next-token accuracy {:.2} % on {} prompts with an answer",
            100.0 * a,
            s.n_answered
        ),
        None => "no prompt has an answer".into(),
    };
    outln!(
        "wrote {} ({} prompts, codes [{}, {l}, {h}, {q}, {k}], form {}); {behaviour}",
        args.out.display(),
        s.n_prompts,
        s.n_prompts,
        args.form
    )?;
    Ok(())
}

/// `hyperlens probe` on a fuzzy-logic checkpoint trained with `settings`: the latent codes at
/// `--site` (by default the paper's: the last token's attention to itself) with the task's terms,
/// from a problem file or sampled (`--set`, default `ood`: held-out pairs of known terms) in chunks
/// of [`hyperlens_tasks::logic::LOGIC_SET_CHUNK`] (the sequences `tasks sample --task logic`
/// writes).
///
/// # Errors
/// A bad split, site, layer list or problem file, model errors, a failed write.
fn probe_logic(
    args: &ProbeArgs,
    model: &Evaluator,
    settings: &TrainSettings,
) -> anyhow::Result<LogicProbeSummary> {
    let params = settings.logic.params();
    let p = &args.problems;
    let probe = LogicProbeParams {
        site: args.site.clone(),
        layers: args.layers.clone(),
        fixed_query: args.fixed_query,
        fixed_context: args.fixed_context,
        seed: p.seed,
    }
    .resolve(model.config(), &params)?;
    let bar = progress_bar(p.n as u64, "probe", "sequences");
    let summary = if let Some(path) = &p.problems {
        let (set, meta) = probe.load_file(&args.checkpoint, path, &params, p.seed)?;
        let n = set.y.len();
        bar.set_length(n as u64);
        extract_logic(
            model,
            std::iter::once(Ok(set)),
            n,
            args.batch,
            &probe.layers,
            &probe.site,
            &args.out,
            meta,
            |d| {
                bar.set_position(d as u64);
                ControlFlow::Continue(())
            },
        )
    } else {
        if p.unpermuted {
            bail!("--unpermuted applies to SRAVEN checkpoints");
        }
        let source = GeneratedLogicSet {
            split: &resolve_split(p, settings, &args.checkpoint)?,
            set: logic_set(p.set.unwrap_or(SetArg::Ood)),
            n: p.n,
            seed: p.seed,
            inputs: &probe.inputs,
        };
        extract_logic_set(
            model,
            source,
            args.batch,
            &probe.layers,
            &probe.site,
            &args.out,
            ProbeMeta::for_checkpoint(&args.checkpoint),
            |d| {
                bar.set_position(d as u64);
                ControlFlow::Continue(())
            },
        )
    };
    bar.finish_and_clear();
    Ok(summary?)
}
