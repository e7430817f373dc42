//! The fuzzy-logic task in `tasks sample` and `eval`: problem sets of `f(x) = max over K terms of
//! min over the L literals` (`docs/spec/sraven.md`, "The fuzzy-logic task"), and MSE and the
//! paper's R² (per sequence `1 - err² / var(targets)`, averaged) of a logic checkpoint.

use std::path::Path;

use anyhow::{bail, Context, Result};
use hyperlens_io::budget::{bytes_of, check_alloc};
use hyperlens_model::Transformer;
use hyperlens_tasks::logic::{
    fix_query, r2, sample_logic, sample_logic_set, LogicParams, LogicSet, LogicSplit, Purpose,
    LOGIC_SET_CHUNK,
};
use hyperlens_tasks::npz::{load_logic, save_logic};
use hyperlens_train::TrainSettings;

use super::eval::EvalArgs;
use super::tasks::{SampleArgs, SetArg};

/// The logic set a `--set` names: `id` the training tasks, `ood` the held-out pairs of known terms,
/// `unknown` the pairs of unknown terms.
fn logic_set(set: SetArg) -> LogicSet {
    match set {
        SetArg::Id => LogicSet::Train,
        SetArg::Ood => LogicSet::Test,
        SetArg::Unknown => LogicSet::Ood,
    }
}

/// The name hyperlens uses for a logic set (`id`, `ood`, `unknown`).
fn set_name(set: LogicSet) -> &'static str {
    match set {
        LogicSet::Train => "id",
        LogicSet::Test => "ood",
        LogicSet::Ood => "unknown",
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
    let problems = sample_logic_set(&split, set, args.n, args.seed)
        .with_context(|| format!("--set {}", set_name(set)))?;
    super::common::create_parent("--out", &args.out)?;
    save_logic(&args.out, &problems)?;
    let sidecar = serde_json::json!({
        "producer": format!("hyperlens {} tasks sample", env!("CARGO_PKG_VERSION")),
        "task": "logic",
        "split": name,
        "set": set_name(set),
        "n": args.n,
        "seed": args.seed,
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
fn run_settings(checkpoint: &Path) -> Result<TrainSettings> {
    if let Ok(s) = hyperlens_train::read_settings(checkpoint) {
        return Ok(s);
    }
    let path = checkpoint.join(hyperlens_train::state::RECORD_FILE);
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "{}: a logic checkpoint needs its run files (train_state.json or train.json) for \
             the task's terms and split",
            checkpoint.display()
        )
    })?;
    let record: serde_json::Value =
        serde_json::from_slice(&bytes).with_context(|| format!("{}", path.display()))?;
    serde_json::from_value(record["settings"].clone())
        .with_context(|| format!("{}: field `settings`", path.display()))
}

/// The logic split a sampling command uses: `--split` if given (refused when it differs from the
/// recorded one without `--other-split`), else the split the checkpoint was trained on.
///
/// # Errors
/// A differing `--split` without `--other-split`; a split that is not `seed{N}`.
fn resolve_split(
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
    use hyperlens_probe::{extract_logic, LogicSite, ProbeMeta, Site};
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
    // With --fixed-query: one query, drawn from --seed, given to every sequence of every set.
    let query = args
        .fixed_query
        .then(|| hyperlens_tasks::logic::fixed_query(&params, p.seed));
    let fix = |mut b: hyperlens_tasks::logic::LogicBatch| -> hyperlens_probe::Result<_> {
        if let Some(q) = &query {
            fix_query(&mut b, q).map_err(|e| {
                hyperlens_probe::ProbeError::InvalidInput(format!("--fixed-query: {e}"))
            })?;
        }
        Ok(b)
    };
    let run = |batches: &mut dyn Iterator<Item = hyperlens_probe::Result<_>>,
               n: usize,
               meta: ProbeMeta| {
        let bar = super::common::progress_bar(n as u64, "probe", "sequences");
        let s = extract_logic(
            model,
            batches,
            n,
            args.batch,
            &layers,
            &site,
            &args.out,
            meta,
            |d| bar.set_position(d as u64),
        );
        bar.finish_and_clear();
        s
    };
    let summary = if let Some(path) = &p.problems {
        let set = load_logic(path, &params)?;
        meta.problems = match &query {
            Some(q) => format!(
                "{}, with the fixed query {q:?} of seed {}",
                path.display(),
                p.seed
            ),
            None => path.display().to_string(),
        };
        let n = set.y.len();
        run(&mut std::iter::once(fix(set)), n, meta)?
    } else {
        if p.unpermuted {
            bail!("--unpermuted applies to SRAVEN checkpoints");
        }
        if p.n == 0 {
            bail!("--n must be positive");
        }
        let split = resolve_split(p, &settings, &args.checkpoint)?;
        let set = logic_set(p.set.unwrap_or(SetArg::Ood));
        if split.tasks(set).is_empty() {
            bail!(
                "--set {}: the split has no tasks in this set",
                set_name(set)
            );
        }
        meta.problems = "generated".into();
        meta.split = Some(format!("seed{}", split.seed));
        meta.set = Some(set_name(set).into());
        meta.seed = Some(p.seed);
        if let Some(q) = &query {
            meta.problems = format!("generated, with the fixed query {q:?} of --seed {}", p.seed);
        }
        let (n, seed) = (p.n, p.seed);
        let mut chunks = (0..n.div_ceil(LOGIC_SET_CHUNK)).map(|i| {
            let b = LOGIC_SET_CHUNK.min(n - i * LOGIC_SET_CHUNK);
            sample_logic(&split, set, Purpose::Eval, b, seed, i as u64)
                .map_err(|e| {
                    hyperlens_probe::ProbeError::InvalidInput(format!(
                        "--set {}: {e}",
                        set_name(set)
                    ))
                })
                .and_then(fix)
        });
        run(&mut chunks, n, meta)?
    };
    Ok(summary)
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
    let mut rows: Vec<(String, f64, f64, usize)> = Vec::new();
    if let Some(path) = &p.problems {
        let set = load_logic(path, &params)?;
        let mut acc = Accumulator::default();
        acc.add(&predict_all(model, &set, args.batch)?, &set)?;
        let (r2, mse) = acc.finish();
        rows.push((path.display().to_string(), r2, mse, set.y.len()));
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
            let (r2, mse) = evaluate_stream(model, &split, set, p.n, args.batch, p.seed)
                .with_context(|| format!("--set {}", set_name(set)))?;
            rows.push((set_name(set).to_string(), r2, mse, p.n));
        }
    }
    let mut stdout = std::io::stdout().lock();
    use std::io::Write as _;
    for (set, r2, mse, n) in rows {
        if args.json {
            let obj =
                serde_json::json!({"task": "logic", "set": set, "r2": r2, "mse": mse, "n": n});
            writeln!(stdout, "{obj}")?;
        } else {
            writeln!(stdout, "{set:<8} R² {r2:.4}  MSE {mse:.6}  ({n} sequences)")?;
        }
    }
    Ok(())
}

/// Sums of the per-sequence R² (over sequences whose targets vary) and of the squared errors.
#[derive(Debug, Default)]
struct Accumulator {
    r2_sum: f64,
    r2_n: usize,
    se: f64,
    n: usize,
}

impl Accumulator {
    /// Adds the predictions `pred` `[B]` of a batch of sequences.
    fn add(
        &mut self,
        pred: &ndarray::Array1<f32>,
        set: &hyperlens_tasks::logic::LogicBatch,
    ) -> Result<()> {
        for (r, (&p, &y)) in r2(pred.view(), set)?
            .iter()
            .zip(pred.iter().zip(set.y.iter()))
        {
            if r.is_finite() {
                self.r2_sum += r;
                self.r2_n += 1;
            }
            self.se += (p as f64 - y as f64).powi(2);
            self.n += 1;
        }
        Ok(())
    }

    /// Mean R² (NaN when no sequence has one) and MSE.
    fn finish(&self) -> (f64, f64) {
        let r2 = if self.r2_n > 0 {
            self.r2_sum / self.r2_n as f64
        } else {
            f64::NAN
        };
        (r2, self.se / self.n.max(1) as f64)
    }
}

/// Mean R² and MSE on `n` sequences of `set` from the evaluation stream `seed`, drawn in chunks of
/// [`LOGIC_SET_CHUNK`] (the sequences `tasks sample --task logic` writes, whatever `batch` is) and
/// run in batches of `batch`: memory is bounded by the chunk and the batch.
fn evaluate_stream(
    model: &Transformer,
    split: &LogicSplit,
    set: LogicSet,
    n: usize,
    batch: usize,
    seed: u64,
) -> Result<(f64, f64)> {
    let mut acc = Accumulator::default();
    let (mut done, mut index) = (0usize, 0u64);
    while done < n {
        let b = LOGIC_SET_CHUNK.min(n - done);
        let chunk = sample_logic(split, set, Purpose::Eval, b, seed, index)?;
        acc.add(&predict_all(model, &chunk, batch)?, &chunk)?;
        done += b;
        index += 1;
    }
    Ok(acc.finish())
}

/// The model's last-token prediction for every sequence of a set, in batches of `batch`.
///
/// # Shapes
/// `set.x [N, T, L + 1]` -> `[N]`.
fn predict_all(
    model: &Transformer,
    set: &hyperlens_tasks::logic::LogicBatch,
    batch: usize,
) -> Result<ndarray::Array1<f32>> {
    let (n, t, d) = set.x.dim();
    let mut out = Vec::with_capacity(n);
    let mut start = 0;
    while start < n {
        let end = (start + batch).min(n);
        let xb = set.x.slice(ndarray::s![start..end, .., ..]);
        let data: Vec<f32> = xb.iter().copied().collect();
        let x = hyperlens_model::candle_core::Tensor::from_vec(
            data,
            (end - start, t, d),
            model.device(),
        )?;
        let logits = model.forward(&x, false)?.logits;
        out.extend(logits.flatten_all()?.to_vec1::<f32>()?);
        start = end;
    }
    Ok(ndarray::Array1::from_vec(out))
}
