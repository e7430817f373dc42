//! Everything the report measures on one checkpoint: ID / OOD accuracy, the latent codes of the
//! paper's site on unpermuted ID and OOD problems (written to `codes/`), their analyses (written
//! to `tables/<name>/`) and the attention of one OOD problem. The only module that runs the model.

use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use hyperlens_analysis::{analyze_pair, CodeSet, LatentAnalysisParams};
use hyperlens_io::keys::attention as keys;
use hyperlens_model::eval::evaluate;
use hyperlens_model::Evaluator;
use hyperlens_probe::extract::argmax_rows;
use hyperlens_probe::{extract, ProbeMeta, ProbeParams, Site};
use hyperlens_tasks::sraven::{sample, SampleStream, Set, Split, SravenParams};
use ndarray::{Array1, Array4};

use crate::data::{AttentionSample, Entry, Progress, StageSeconds};
use crate::discover::{name_of, training_of};
use crate::error::{ReportError, Result};

/// Runs the model on the first problem of the unpermuted OOD set (the problem of row 0 of the OOD
/// codes) and keeps every layer's attention.
///
/// # Shapes
/// Returns `pattern [L, H, T, T]`.
///
/// # Errors
/// Split, model or candle errors.
fn attention_sample(ev: &Evaluator, split: &Split, seed: u64) -> Result<AttentionSample> {
    let cfg = ev.config();
    let problem = sample(split, Set::Ood, 1, seed, true)?;
    let (logits, patterns) = ev.patterns(problem.x.view())?;
    let (l, h, t) = (cfg.n_layers, cfg.n_heads, cfg.n_tokens);
    let pattern = Array4::from_shape_vec((l, h, t, t), patterns).map_err(|e| {
        ReportError::InvalidInput(format!(
            "attention patterns do not have the shape [L, H, T, T]: {e}"
        ))
    })?;
    let prediction: Vec<i64> = argmax_rows(&logits, cfg.d_out)
        .into_iter()
        .map(i64::from)
        .collect();
    let tokens = (0..t)
        .map(|i| {
            problem
                .x
                .slice(ndarray::s![0, i, ..])
                .iter()
                .position(|&v| v > 0.5)
                .map_or(-1, |p| p as i64)
        })
        .collect();
    let sel = Site::Paper
        .resolve(&split.params)?
        .into_iter()
        .next()
        .ok_or_else(|| ReportError::InvalidInput("the paper site has no selection".into()))?;
    Ok(AttentionSample {
        pattern,
        tokens,
        target: problem.y.row(0).to_vec(),
        prediction,
        rules: problem.rules.row(0).to_vec(),
        site: sel.site,
    })
}

/// Writes the attention sample as `.npz` (names in [`hyperlens_io::keys::attention`]):
/// `pattern` float32 `[L, H, T, T]`, `tokens` int64 `[T]`, `target`, `prediction`, `rules` int64
/// `[F]`.
fn write_attention_npz(path: &Path, a: &AttentionSample) -> Result<()> {
    hyperlens_io::write_npz(path, |npz| -> Result<()> {
        npz.add(keys::PATTERN, &a.pattern)?;
        for (name, v) in [
            (keys::TOKENS, &a.tokens),
            (keys::TARGET, &a.target),
            (keys::PREDICTION, &a.prediction),
            (keys::RULES, &a.rules),
        ] {
            npz.add(name, &Array1::from(v.clone()))?;
        }
        Ok(())
    })
}

/// Measures, extracts, analyses and writes everything of the checkpoint in `dir` (codes into
/// `out/codes/`, tables into `out/tables/<name>/`).
///
/// # Errors
/// Any failure of loading, evaluation, extraction, analysis or writing (the caller names the
/// checkpoint); an interruption when `progress` breaks.
pub(crate) fn analyse_checkpoint(
    params: &crate::data::StagedParams,
    dir: &Path,
    progress: &mut dyn FnMut(Progress<'_>) -> ControlFlow<()>,
) -> Result<Entry> {
    let out = &params.out;
    let name = name_of(dir);
    let t0 = Instant::now();
    let device = params.device.to_candle()?;
    let model = Evaluator::load(dir, &device)?;
    let cfg = model.config().clone();
    let task = SravenParams {
        features: cfg.n_outputs,
        values: cfg.d_in,
        ..SravenParams::default()
    };
    let info = hyperlens_model::RunRecord::read(dir)?;
    let split_name = params.split_for(dir, info.split)?;
    let split = Split::of(split_name, task)?;
    let training = training_of(dir, &info)?;
    let mut metrics = Vec::new();
    for set in [Set::Id, Set::Ood] {
        let problems = sample(&split, set, params.n, params.seed, false)?;
        metrics.push(evaluate(&model, &problems, params.batch)?);
    }
    let mut seconds = StageSeconds {
        evaluation: t0.elapsed().as_secs_f64(),
        ..StageSeconds::default()
    };

    let t0 = Instant::now();
    let codes_dir = out.join("codes");
    let mut sets = Vec::new();
    for set in [Set::Id, Set::Ood] {
        let path = codes_dir.join(format!("{name}_{set}.npz"));
        let meta = ProbeMeta {
            checkpoint: dir.display().to_string(),
            problems: "generated".into(),
            split: Some(split_name),
            set: Some(set.into()),
            seed: Some(params.seed),
            unpermuted: Some(true),
            ..ProbeMeta::default()
        };
        let batches = SampleStream::new(&split, set, params.seed, true)?
            .batches(params.n, params.batch)
            .map(|b| b.map_err(Into::into));
        let probe = ProbeParams {
            site: Site::Paper,
            layers: None,
        };
        let total = params.n;
        extract(&model, batches, params.n, &probe, &path, meta, |done| {
            progress(Progress::Codes {
                name: &name,
                set,
                done,
                total,
            })
        })?;
        // The report is built in a staging directory (lib.rs): name the codes by where they end up.
        let shown = params
            .shown_out
            .join("codes")
            .join(format!("{name}_{set}.npz"));
        sets.push(CodeSet::read_npz(&path)?.with_source_name(shown.display().to_string()));
    }
    seconds.codes = t0.elapsed().as_secs_f64();

    let t0 = Instant::now();
    let attention = attention_sample(&model, &split, params.seed)?;
    write_attention_npz(&codes_dir.join(format!("{name}_attention.npz")), &attention)?;
    seconds.attention = t0.elapsed().as_secs_f64();

    let t0 = Instant::now();
    let causal = if params.causal_n > 0 {
        Some(crate::causal::run(
            &model,
            &split,
            params.causal_n,
            params.seed,
            params.batch,
            &mut |done, total| {
                progress(Progress::Causal {
                    name: &name,
                    done,
                    total,
                })
            },
        )?)
    } else {
        None
    };
    seconds.causal = t0.elapsed().as_secs_f64();
    drop(model);

    let t0 = Instant::now();
    let latent = analyze_pair(
        &sets[0],
        &sets[1],
        &LatentAnalysisParams::default(),
        &mut |p| {
            progress(Progress::Analysis {
                name: &name,
                done: p.done,
                total: p.total,
            })
        },
    )?;
    latent.write_tables(&out.join("tables").join(&name))?;
    seconds.analysis = t0.elapsed().as_secs_f64();
    let (Some(ood), Some(id)) = (metrics.pop(), metrics.pop()) else {
        return Err(ReportError::InvalidInput(
            "the ID / OOD evaluation returned no metrics".into(),
        ));
    };
    Ok(Entry {
        name,
        dir: dir.to_path_buf(),
        mixer: cfg.mixer,
        split: split_name,
        task,
        id,
        ood,
        latent,
        training,
        steps: info.steps,
        attention,
        causal,
        seconds,
    })
}
