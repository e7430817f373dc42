//! What the report measures on one logic checkpoint: the R² of each set, the latent codes of the
//! fixed-query ID and OOD sets (written to `codes/`), and their analyses, term decoding and
//! projections (written to `tables/<name>/`, the projection figures to `figures/`). The only part
//! of the fuzzy-logic section that runs the model.

use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use hyperlens_analysis::embed::TsneParams;
use hyperlens_analysis::terms::{
    term_decoding, term_decoding_csv, TermCodes, TermDecodingParams, TermDecodingRow,
};
use hyperlens_model::{Evaluator, RunRecord, Task};
use hyperlens_probe::{extract_logic_set, GeneratedLogicSet, ProbeMeta};
use hyperlens_tasks::logic::{
    fixed_query, logic_chunks, LogicInputs, LogicSet, LogicSplit, LOGIC_SET_CHUNK,
};
use hyperlens_tasks::sraven::SplitName;
use hyperlens_train::logic::evaluate_chunks;
use hyperlens_train::SetMetrics;

use crate::data::{LogicEntry, LogicSeconds, Progress};
use crate::discover::{name_of, training_of};
use crate::error::{tell, ReportError, Result};
use crate::logic::figures::write_projection_figures;
use crate::logic::TSNE_POINTS;

/// Measures, extracts, analyses and writes everything of the logic checkpoint in `dir` (codes into
/// `out/codes/{name}_{id,ood}.npz`, tables into `out/tables/{name}/`: `term_decoding.csv`,
/// `projections.npz`).
///
/// # Errors
/// Run files without the training settings, a checkpoint of another task, and any failure of
/// loading, evaluation, extraction, analysis or writing (the caller names the checkpoint).
pub(crate) fn analyse_logic_checkpoint(
    params: &crate::data::StagedParams,
    dir: &Path,
    progress: &mut dyn FnMut(Progress<'_>) -> ControlFlow<()>,
) -> Result<LogicEntry> {
    let name = name_of(dir);
    let t0 = Instant::now();
    let settings = hyperlens_train::run_settings(dir)?;
    if settings.task != Task::Logic {
        return Err(ReportError::Unsupported {
            dir: dir.to_path_buf(),
            reason: format!("a {} checkpoint, not a logic one", settings.task),
        });
    }
    let task = settings.logic.params();
    let split_seed = settings.split_seed()?;
    let split_name = params.split_for(dir, Some(SplitName::Seed(split_seed)))?;
    let split = LogicSplit::new(task, split_seed)?;
    let device = params.device.to_candle()?;
    let model = Evaluator::load(dir, &device)?;
    let cfg = model.config().clone();
    let info = RunRecord::read(dir)?;
    let training = training_of(dir, &info)?;
    let sets = evaluate_sets(params, &split, &model)?;
    let mut seconds = LogicSeconds {
        evaluation: t0.elapsed().as_secs_f64(),
        ..LogicSeconds::default()
    };

    let t0 = Instant::now();
    let query = fixed_query(&task, params.seed);
    let inputs = LogicInputs::FixedQuery(query.clone());
    let codes = extract_codes(params, dir, &name, &split, &inputs, &model, progress)?;
    seconds.codes = t0.elapsed().as_secs_f64();
    drop(model);

    let t0 = Instant::now();
    let analysis = analyse_codes(params, &name, &codes, progress)?;
    seconds.analysis = t0.elapsed().as_secs_f64();
    Ok(LogicEntry {
        name,
        dir: dir.to_path_buf(),
        mixer: cfg.mixer,
        split: split_name,
        sets,
        decoding: analysis.decoding,
        tsne_trustworthiness: analysis.trust,
        tsne_points: analysis.tsne_points,
        tsne_perplexity: analysis.tsne_perplexity,
        fixed_query: query,
        training,
        steps: info.steps,
        seconds,
    })
}

/// The R² (`metric`) and MSE (`loss`) of each set with tasks in the split, in the order `id`,
/// `ood`, `unknown`.
fn evaluate_sets(
    params: &crate::data::StagedParams,
    split: &LogicSplit,
    model: &Evaluator,
) -> Result<Vec<(&'static str, SetMetrics)>> {
    let mut sets = Vec::new();
    for set in LogicSet::ALL {
        if split.tasks(set).is_empty() {
            continue;
        }
        let chunks = logic_chunks(split, set, params.n, LOGIC_SET_CHUNK, params.seed)
            .map(|c| c.map_err(Into::into));
        let metrics = evaluate_chunks(model, chunks, params.batch)?;
        sets.push((set.name(), metrics));
    }
    Ok(sets)
}

/// Extracts the codes of the paper's site on the ID and OOD sets given `inputs`, writes them to
/// `out/codes/{name}_{id,ood}.npz` and reads them back, in that order.
fn extract_codes(
    params: &crate::data::StagedParams,
    dir: &Path,
    name: &str,
    split: &LogicSplit,
    inputs: &LogicInputs,
    model: &Evaluator,
    progress: &mut dyn FnMut(Progress<'_>) -> ControlFlow<()>,
) -> Result<Vec<TermCodes>> {
    let out = &params.out;
    let cfg = model.config();
    let site = hyperlens_model::CodeSite::last_token(cfg.n_tokens);
    let layers: Vec<usize> = (0..cfg.n_layers).collect();
    let mut codes = Vec::new();
    for set in [LogicSet::Id, LogicSet::Ood] {
        let set_name = set.name();
        let path = out.join("codes").join(format!("{name}_{set_name}.npz"));
        let meta = ProbeMeta {
            checkpoint: dir.display().to_string(),
            ..ProbeMeta::default()
        };
        let source = GeneratedLogicSet {
            split,
            set,
            n: params.n,
            seed: params.seed,
            inputs,
        };
        let total = params.n;
        extract_logic_set(
            model,
            source,
            params.batch,
            &layers,
            &site,
            &path,
            meta,
            |done| {
                progress(Progress::LogicCodes {
                    name,
                    set: set_name,
                    done,
                    total,
                })
            },
        )?;
        codes.push(TermCodes::read_npz(&path)?);
    }
    Ok(codes)
}

/// What [`analyse_codes`] found.
struct CodeAnalysis {
    /// Term decoding per layer and for all layers.
    decoding: Vec<TermDecodingRow>,
    /// Trustworthiness (k = 5) of the t-SNE embedding.
    trust: f64,
    /// Codes embedded with t-SNE.
    tsne_points: usize,
    /// Perplexity of the t-SNE.
    tsne_perplexity: f64,
}

/// Decodes the terms from the codes (`codes[0]` ID, training; `codes[1]` OOD, test) and projects
/// the OOD codes; writes `out/tables/{name}/term_decoding.csv`, `projections.npz` and the two
/// projection figures.
fn analyse_codes(
    params: &crate::data::StagedParams,
    name: &str,
    codes: &[TermCodes],
    progress: &mut dyn FnMut(Progress<'_>) -> ControlFlow<()>,
) -> Result<CodeAnalysis> {
    let out = &params.out;
    tell(
        progress,
        Progress::Analysis {
            name,
            done: 0,
            total: 2,
        },
    )?;
    let test = &codes[1];
    let tsne_points = TSNE_POINTS.min(test.n_samples());
    // The one deterministic setting (exact gradients, seeded; perplexity 30 or what fits).
    let tsne = TsneParams::deterministic(params.seed, tsne_points);
    let tsne_perplexity = tsne.perplexity;
    // The probes and the t-SNE (one thread) side by side.
    let (decoding, projected) = rayon::join(
        || {
            term_decoding(
                &codes[0],
                test,
                &TermDecodingParams {
                    seed: params.seed,
                    ..TermDecodingParams::default()
                },
            )
        },
        || test.projections(TSNE_POINTS, &tsne),
    );
    let (decoding, (projections, trust)) = (decoding?, projected?);
    tell(
        progress,
        Progress::Analysis {
            name,
            done: 1,
            total: 2,
        },
    )?;
    let tables = out.join("tables").join(name);
    std::fs::create_dir_all(&tables).map_err(|source| ReportError::Io {
        path: tables.clone(),
        source,
    })?;
    hyperlens_io::write_atomic(
        &tables.join("term_decoding.csv"),
        term_decoding_csv(&decoding)?.as_bytes(),
    )?;
    hyperlens_io::write_npz::<hyperlens_io::IoError, _>(&tables.join("projections.npz"), |z| {
        for (name, a) in &projections {
            z.add(name, a)?;
        }
        z.add(hyperlens_io::keys::projections::TERM_IDS, test.term_ids())
    })?;
    write_projection_figures(
        test,
        &projections,
        tsne_points,
        name,
        &out.join(format!("figures/{name}_projections_term.png")),
        &out.join(format!("figures/{name}_projections_target.png")),
    )?;
    tell(
        progress,
        Progress::Analysis {
            name,
            done: 2,
            total: 2,
        },
    )?;
    Ok(CodeAnalysis {
        decoding,
        trust,
        tsne_points,
        tsne_perplexity,
    })
}
