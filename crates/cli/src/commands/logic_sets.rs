//! The fuzzy-logic task in `tasks sample` and `eval`: problem sets of `f(x) = max over K terms of
//! min over the L literals` (`docs/spec/sraven.md`, "The fuzzy-logic task"), and MSE and the
//! paper's R² (per sequence `1 - err² / var(targets)`, averaged) of a logic checkpoint.

use std::path::Path;

use anyhow::{bail, Context, Result};
use hyperlens_io::budget::{bytes_of, check_alloc};
use hyperlens_model::Transformer;
use hyperlens_tasks::logic::{
    logic_chunks, sample_logic_set, LogicInputs, LogicParams, LogicSet, LogicSplit, LOGIC_SET_CHUNK,
};
use hyperlens_tasks::npz::{load_logic, save_logic};
use hyperlens_train::logic::evaluate_chunks;
use hyperlens_train::{SetMetrics, TrainSettings};

use super::eval::EvalArgs;
use super::tasks::{SampleArgs, SetArg};

/// The logic set a `--set` names: `id` the training tasks, `ood` the held-out pairs of known terms,
/// `unknown` the pairs of unknown terms.
pub(crate) fn logic_set(set: SetArg) -> LogicSet {
    match set {
        SetArg::Id => LogicSet::Train,
        SetArg::Ood => LogicSet::Test,
        SetArg::Unknown => LogicSet::Ood,
    }
}

use hyperlens_probe::logic_set_name as set_name;

/// The inputs of a logic set: one query (`fixed_query`) or one context (`fixed_context`) of
/// seed `seed` for every sequence, else uniform.
fn logic_inputs(
    fixed_query: bool,
    fixed_context: bool,
    params: &LogicParams,
    seed: u64,
) -> LogicInputs {
    if fixed_query {
        LogicInputs::FixedQuery(hyperlens_tasks::logic::fixed_query(params, seed))
    } else if fixed_context {
        LogicInputs::FixedContext(hyperlens_tasks::logic::fixed_context(params, seed))
    } else {
        LogicInputs::Uniform
    }
}

/// The seed N of a logic split name `seed{N}`.
fn split_seed(name: &str) -> Result<u64> {
    name.strip_prefix("seed")
        .and_then(|n| n.parse::<u64>().ok())
        .with_context(|| format!("--split {name}: the logic task takes a split seed{{N}}"))
}

/// Samples a logic problem set to `--out` with its sidecar; returns the printed summary.
///
/// # Errors
/// A bad split or parameter, a size over the memory budget, a failed write.
pub fn sample_to_file(args: &SampleArgs) -> Result<String> {
    if args.unpermuted {
        bail!("--unpermuted applies to --task sraven");
    }
    if args.n == 0 {
        bail!("--n must be at least 1");
    }
    let name = args.split.as_deref().unwrap_or("seed0");
    let seed = split_seed(name)?;
    // The training defaults (`train --task logic`): a set sampled with the same flags fits a
    // model trained with them.
    let mut settings = hyperlens_train::LogicSettings::default();
    if let Some(n) = args.logic_samples {
        settings.samples = n;
    }
    if let Some(f) = args.logic_frac_test {
        settings.frac_test = f;
    }
    let params: LogicParams = settings.params();
    let split = LogicSplit::new(params, seed).context("--split")?;
    let set = logic_set(args.set);
    let (t, l, k) = (params.samples, params.variables, params.terms);
    let per = bytes_of(4, &[t, l + 2]).saturating_add(bytes_of(1, &[k, l + 8]));
    check_alloc(
        format!("--n {} (the whole problem set is held in memory)", args.n),
        per.saturating_mul(2 * args.n as u128),
    )?;
    let mut problems = sample_logic_set(&split, set, args.n, args.seed)
        .with_context(|| format!("--set {}", set_name(set)))?;
    let inputs = logic_inputs(args.fixed_query, args.fixed_context, &params, args.seed);
    inputs
        .apply(&mut problems)
        .with_context(|| format!("--{}", inputs.name().replace('_', "-")))?;
    super::common::create_parent("--out", &args.out)?;
    save_logic(&args.out, &problems)?;
    let sidecar = serde_json::json!({
        "producer": format!("hyperlens {} tasks sample", env!("CARGO_PKG_VERSION")),
        "task": "logic",
        "split": name,
        "set": set_name(set),
        "n": args.n,
        "seed": args.seed,
        "inputs": inputs.name(),
        "stream_chunk": LOGIC_SET_CHUNK,
        "params": {
            "variables": l, "terms": k, "samples": t,
            "unknown_fraction": params.unknown_fraction, "frac_test": params.frac_test,
        },
        "arrays": {"x": "float32 [N, T, L + 1]", "y": "float32 [N]", "targets": "float32 [N, T]",
                   "terms": "uint8 [N, K, L]", "term_ids": "int64 [N, K]"},
    });
    let side = hyperlens_io::write_sidecar(&args.out, &sidecar)?;
    let tasks: std::collections::BTreeSet<Vec<u32>> =
        problems.term_ids.outer_iter().map(|r| r.to_vec()).collect();
    Ok(format!(
        "wrote {} logic problems ({name}, {} set, seed {}) to {} (+ {})\n\
         tasks covered: {} of {} in the set; L {l} variables, K {k} terms, T {t} tokens\n",
        args.n,
        set_name(set),
        args.seed,
        args.out.display(),
        side.display(),
        tasks.len(),
        split.tasks(set).len(),
    ))
}

/// The settings a logic checkpoint was trained with (its `train_state.json`, else `train.json`).
pub(crate) fn run_settings(checkpoint: &Path) -> Result<TrainSettings> {
    hyperlens_train::run_settings(checkpoint).with_context(|| {
        format!(
            "{}: a logic checkpoint needs its run files for the task's terms and split",
            checkpoint.display()
        )
    })
}

/// The logic split a sampling command uses: `--split` if given (refused when it differs from the
/// recorded one without `--other-split`), else the split the checkpoint was trained on.
///
/// # Errors
/// A differing `--split` without `--other-split`; a split that is not `seed{N}`.
pub(crate) fn resolve_split(
    p: &super::common::ProblemArgs,
    settings: &TrainSettings,
    checkpoint: &Path,
) -> Result<LogicSplit> {
    let recorded = settings.split.clone();
    let name = match &p.split {
        Some(given) if given != &recorded && !p.other_split => bail!(
            "--split {given} differs from the split {recorded} that {} was trained on; pass \
             --other-split to use it anyway",
            checkpoint.display()
        ),
        Some(given) => given.clone(),
        None => recorded,
    };
    LogicSplit::new(settings.logic.params(), split_seed(&name)?).context("--split")
}

/// `hyperlens probe` on a fuzzy-logic checkpoint: the latent codes at `site` (by default the
/// paper's: the last token's attention to itself) with the task's terms, from a problem file or
/// sampled (`--set`, default `ood`: held-out pairs of known terms) in chunks of
/// [`LOGIC_SET_CHUNK`] (the sequences `tasks sample --task logic` writes).
///
/// # Errors
/// Missing run files, a bad split, site, layer list or problem file, model errors, a failed write.
pub fn probe(
    args: &super::probe::ProbeArgs,
    model: &Transformer,
) -> Result<hyperlens_probe::LogicProbeSummary> {
    use hyperlens_probe::{
        describe_inputs, extract_logic, extract_logic_set, GeneratedLogicSet, LogicSite, ProbeMeta,
        Site,
    };
    let settings = run_settings(&args.checkpoint)?;
    let params = settings.logic.params();
    let cfg = model.config();
    let site = match &args.site {
        Site::Paper => LogicSite::paper(cfg.n_tokens),
        Site::Explicit { query, keys } => LogicSite {
            query: *query,
            keys: keys.clone(),
        },
        other => bail!(
            "--site {other} is a SRAVEN site; a logic checkpoint takes `paper` (the last token's \
             attention to itself) or `query:I;keys:J,K,...`"
        ),
    };
    let layers: Vec<usize> = args
        .layers
        .clone()
        .unwrap_or_else(|| (0..cfg.n_layers).collect());
    let mut meta = ProbeMeta {
        checkpoint: args.checkpoint.display().to_string(),
        ..ProbeMeta::default()
    };
    let p = &args.problems;
    // With --fixed-query / --fixed-context: one query / context, drawn from --seed, given to
    // every sequence of every set.
    let inputs = logic_inputs(args.fixed_query, args.fixed_context, &params, p.seed);
    let bar = super::common::progress_bar(p.n as u64, "probe", "sequences");
    let summary = if let Some(path) = &p.problems {
        let mut set = load_logic(path, &params)?;
        inputs
            .apply(&mut set)
            .with_context(|| format!("--{}", inputs.name().replace('_', "-")))?;
        meta.problems = describe_inputs(&path.display().to_string(), &inputs, p.seed);
        let n = set.y.len();
        bar.set_length(n as u64);
        extract_logic(
            model,
            std::iter::once(Ok(set)),
            n,
            args.batch,
            &layers,
            &site,
            &args.out,
            meta,
            |d| bar.set_position(d as u64),
        )
    } else {
        if p.unpermuted {
            bail!("--unpermuted applies to SRAVEN checkpoints");
        }
        let source = GeneratedLogicSet {
            split: &resolve_split(p, &settings, &args.checkpoint)?,
            set: logic_set(p.set.unwrap_or(SetArg::Ood)),
            n: p.n,
            seed: p.seed,
            inputs: &inputs,
        };
        extract_logic_set(
            model,
            source,
            args.batch,
            &layers,
            &site,
            &args.out,
            meta,
            |d| bar.set_position(d as u64),
        )
    };
    bar.finish_and_clear();
    Ok(summary?)
}

/// `hyperlens eval` on a fuzzy-logic checkpoint: MSE and mean R² of the last token's prediction,
/// on a problem file or on sampled sets (all three, or the one `--set` names), streamed in batches.
///
/// # Errors
/// Missing run files, a split other than the recorded one without `--other-split`, a bad problem
/// file, model errors.
pub fn eval(args: &EvalArgs, model: &Transformer) -> Result<()> {
    let settings = run_settings(&args.checkpoint)?;
    let params = settings.logic.params();
    let p = &args.problems;
    // (set, metrics, sequences whose R² is defined: those whose targets vary).
    let mut rows: Vec<(String, SetMetrics, usize)> = Vec::new();
    if let Some(path) = &p.problems {
        let set = load_logic(path, &params)?;
        let defined = r2_defined(&set)?;
        rows.push((
            path.display().to_string(),
            evaluate_chunks(model, std::iter::once(Ok(set)), args.batch)?,
            defined,
        ));
    } else {
        if p.n == 0 {
            bail!("--n must be positive");
        }
        let split = resolve_split(p, &settings, &args.checkpoint)?;
        let sets: Vec<LogicSet> = match p.set {
            Some(s) => vec![logic_set(s)],
            None => vec![LogicSet::Train, LogicSet::Test, LogicSet::Ood]
                .into_iter()
                .filter(|s| !split.tasks(*s).is_empty())
                .collect(),
        };
        for set in sets {
            // Chunks of LOGIC_SET_CHUNK: the sequences `tasks sample --task logic` writes.
            let mut defined = 0usize;
            let chunks = logic_chunks(&split, set, p.n, LOGIC_SET_CHUNK, p.seed).map(
                |c| -> hyperlens_train::Result<_> {
                    let c = c?;
                    defined += r2_defined(&c)?;
                    Ok(c)
                },
            );
            let m = evaluate_chunks(model, chunks, args.batch)
                .with_context(|| format!("--set {}", set_name(set)))?;
            rows.push((set_name(set).to_string(), m, defined));
        }
    }
    let mut stdout = std::io::stdout().lock();
    use std::io::Write as _;
    for (set, m, n_r2) in rows {
        let (r2, mse, n) = (m.metric, m.loss, m.n);
        if args.json {
            // `n`: the sequences the MSE averages; `n_r2`: those the R² averages (a sequence whose
            // targets are all equal has no R²).
            let obj = serde_json::json!({
                "task": "logic", "set": set, "r2": r2, "mse": mse, "n": n, "n_r2": n_r2,
            });
            writeln!(stdout, "{obj}")?;
        } else if n_r2 == n {
            writeln!(stdout, "{set:<8} R² {r2:.4}  MSE {mse:.6}  ({n} sequences)")?;
        } else {
            writeln!(
                stdout,
                "{set:<8} R² {r2:.4}  MSE {mse:.6}  ({n} sequences; R² over the {n_r2} whose \
                 targets vary)"
            )?;
        }
    }
    Ok(())
}

/// The sequences of `set` that have an R² (`hyperlens_tasks::logic::r2` is finite for a perfect
/// prediction: the targets vary).
///
/// # Errors
/// As `hyperlens_tasks::logic::r2` (inconsistent array lengths).
fn r2_defined(set: &hyperlens_tasks::logic::LogicBatch) -> hyperlens_tasks::Result<usize> {
    let r = hyperlens_tasks::logic::r2(set.y.view(), set)?;
    Ok(r.iter().filter(|v| v.is_finite()).count())
}
