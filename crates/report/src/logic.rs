//! The fuzzy-logic part of the report (Schug et al. 2025, the fuzzy-logic experiments: Table A1,
//! Fig. 2B / 2D / A2; `docs/spec/sraven.md`, "The fuzzy-logic task"). For every logic checkpoint
//! it measures the paper's R² on the ID tasks, on held-out pairs of known terms (OOD) and on pairs
//! of unknown terms; extracts the latent codes of the paper's site (the last token's attention to
//! itself, `[L, H]` per sequence) on fixed-query ID and OOD sets; decodes the task's terms from
//! them (ridge R², per-term F1 with the base-rate and shuffled-label controls); projects them
//! (PCA and t-SNE); and draws the training curves. The section of the page sets the OOD R² beside
//! Table A1.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use hyperlens_analysis::embed::TsneParams;
use hyperlens_analysis::terms::{
    term_decoding, term_decoding_csv, NamedProjection, TermCodes, TermDecodingParams,
    TermDecodingRow,
};
use hyperlens_model::infer::Inference;
use hyperlens_model::Transformer;
use hyperlens_probe::{extract_logic_set, logic_set_name, GeneratedLogicSet, LogicSite, ProbeMeta};
use hyperlens_tasks::logic::{
    fixed_query, logic_chunks, LogicInputs, LogicSet, LogicSplit, LOGIC_SET_CHUNK,
};
use hyperlens_train::logic::{evaluate_chunks, evaluate_chunks_cpu};
use hyperlens_train::metrics::MetricsRow;
use hyperlens_train::{SetMetrics, TrainTask};
use hyperlens_viz::{save_png, LayerAccuracy, PcaScatter, Reference, ScatterPanel, Series};
use serde_json::json;

use crate::discover::{name_of, training_of, RunInfo, Steps, Training};
use crate::doc::{Document, FigureRef};
use crate::error::{ReportError, Result};
use crate::text::{md_escape, thousands};
use crate::Progress;

/// The paper's OOD R² of the fuzzy-logic task per mixer: `(mixer, mean %, standard error %)` over
/// three seeds (Schug et al. 2025, Table A1: sequences of 32, 70 % of the known-term pairs held
/// out, 2 layers, D 128, H 8, 50,000 steps).
pub const PAPER_LOGIC_OOD_R2: [(&str, f64, f64); 3] = [
    ("hyla", 81.1, 7.8),
    ("softmax", 63.3, 2.3),
    ("linear", 59.9, 5.2),
];

/// The paper's training budget of the fuzzy-logic task, in updates.
pub const PAPER_LOGIC_STEPS: u64 = 50_000;

/// Codes embedded with t-SNE per checkpoint (the first ones of the OOD set).
pub const TSNE_POINTS: usize = 1_000;

/// Seconds spent on the stages of one logic checkpoint (`timings.json` only).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LogicSeconds {
    /// Loading and the R² of the three sets.
    pub evaluation: f64,
    /// Extracting the ID and OOD codes.
    pub codes: f64,
    /// Term decoding, projections and their tables.
    pub analysis: f64,
}

/// What the report found for one fuzzy-logic checkpoint.
#[derive(Debug, Clone)]
pub struct LogicEntry {
    /// Directory name.
    pub name: String,
    /// Checkpoint directory.
    pub dir: PathBuf,
    /// Mixer (CLI name).
    pub mixer: String,
    /// The split it was trained and is evaluated on (`seed{N}`).
    pub split: String,
    /// R² (`metric`) and MSE (`loss`) per set, in the order `id`, `ood`, `unknown` (a set without
    /// tasks in the split is left out).
    pub sets: Vec<(&'static str, SetMetrics)>,
    /// Term decoding per layer and for all layers (ID codes train, OOD codes test).
    pub decoding: Vec<TermDecodingRow>,
    /// Trustworthiness (k = 5) of the t-SNE embedding.
    pub tsne_trustworthiness: f64,
    /// Codes embedded with t-SNE.
    pub tsne_points: usize,
    /// Perplexity of the t-SNE (30, or less for fewer than 91 codes).
    pub tsne_perplexity: f64,
    /// The query given to every sequence of the code sets, `[L]`.
    pub fixed_query: Vec<f32>,
    /// The training log, if any.
    pub training: Training,
    /// Updates trained and planned, if recorded.
    pub steps: Option<Steps>,
    /// Seconds per stage.
    pub seconds: LogicSeconds,
}

impl LogicEntry {
    /// The R² of set `name` (`id`, `ood`, `unknown`), if measured.
    pub fn r2(&self, name: &str) -> Option<f64> {
        self.sets
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, m)| m.metric)
    }

    /// The row of all layers of the term decoding.
    pub fn all_layers(&self) -> Option<&TermDecodingRow> {
        self.decoding.iter().find(|r| r.layer.is_none())
    }
}

/// Measures, extracts, analyses and writes everything of the logic checkpoint in `dir` (codes into
/// `out/codes/{name}_{id,ood}.npz`, tables into `out/tables/{name}/`: `term_decoding.csv`,
/// `projections.npz`).
///
/// # Errors
/// Run files without the training settings, a checkpoint of another task, and any failure of
/// loading, evaluation, extraction, analysis or writing (the caller names the checkpoint).
pub(crate) fn analyse_logic_checkpoint(
    params: &crate::StagedParams,
    dir: &Path,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<LogicEntry> {
    let out = &params.out;
    let name = name_of(dir);
    let t0 = Instant::now();
    let settings = hyperlens_train::run_settings(dir)?;
    if settings.task != TrainTask::Logic {
        return Err(ReportError::Unsupported {
            dir: dir.to_path_buf(),
            reason: format!("a {} checkpoint, not a logic one", settings.task),
        });
    }
    let task = settings.logic.params();
    let split = LogicSplit::new(task, settings.split_seed()?)?;
    let device = params.device.to_candle()?;
    let model = Transformer::load(dir, &device)?;
    let cfg = model.config().clone();
    let info = RunInfo::read(dir);
    let training = training_of(dir, &info)?;
    // On the CPU, the evaluation pass without candle (whose thread pool spins beside the SRAVEN
    // checkpoints that run at the same time).
    let inference = device
        .is_cpu()
        .then(|| Inference::new(&model))
        .transpose()?;
    let mut sets = Vec::new();
    for set in [LogicSet::Train, LogicSet::Test, LogicSet::Ood] {
        if split.tasks(set).is_empty() {
            continue;
        }
        let chunks = logic_chunks(&split, set, params.n, LOGIC_SET_CHUNK, params.seed)
            .map(|c| c.map_err(Into::into));
        let metrics = match &inference {
            Some(inference) => evaluate_chunks_cpu(inference, chunks, params.batch)?,
            None => evaluate_chunks(&model, chunks, params.batch)?,
        };
        sets.push((logic_set_name(set), metrics));
    }
    let mut seconds = LogicSeconds {
        evaluation: t0.elapsed().as_secs_f64(),
        ..LogicSeconds::default()
    };

    let t0 = Instant::now();
    let query = fixed_query(&task, params.seed);
    let inputs = LogicInputs::FixedQuery(query.clone());
    let site = LogicSite::paper(cfg.n_tokens);
    let layers: Vec<usize> = (0..cfg.n_layers).collect();
    let mut codes = Vec::new();
    for set in [LogicSet::Train, LogicSet::Test] {
        let set_name = logic_set_name(set);
        let path = out.join("codes").join(format!("{name}_{set_name}.npz"));
        let meta = ProbeMeta {
            checkpoint: dir.display().to_string(),
            ..ProbeMeta::default()
        };
        let source = GeneratedLogicSet {
            split: &split,
            set,
            n: params.n,
            seed: params.seed,
            inputs: &inputs,
        };
        let total = params.n;
        extract_logic_set(
            &model,
            source,
            params.batch,
            &layers,
            &site,
            &path,
            meta,
            |done| {
                progress(Progress::LogicCodes {
                    name: &name,
                    set: set_name,
                    done,
                    total,
                })
            },
        )?;
        codes.push(TermCodes::read_npz(&path)?);
    }
    seconds.codes = t0.elapsed().as_secs_f64();
    drop(model);

    let t0 = Instant::now();
    progress(Progress::Analysis {
        name: &name,
        done: 0,
        total: 2,
    });
    let test = &codes[1];
    let tsne_points = TSNE_POINTS.min(test.n_samples());
    // Perplexity 30 (scikit-learn's default) needs 91 points; fewer get the largest that fits.
    let tsne_perplexity = TsneParams::default()
        .perplexity
        .min(((tsne_points.max(4) - 1) / 3) as f64);
    let tsne = TsneParams {
        seed: params.seed,
        perplexity: tsne_perplexity,
        // Exact gradients: bhtsne draws its Barnes-Hut tree with an unseeded generator, so only
        // theta = 0 gives the same embedding on every run (and the report the same bytes).
        theta: 0.0,
        ..TsneParams::default()
    };
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
    progress(Progress::Analysis {
        name: &name,
        done: 1,
        total: 2,
    });
    let tables = out.join("tables").join(&name);
    std::fs::create_dir_all(&tables).map_err(|source| ReportError::Io {
        path: tables.clone(),
        source,
    })?;
    crate::files::write_text(
        &tables.join("term_decoding.csv"),
        &term_decoding_csv(&decoding),
    )?;
    hyperlens_io::write_npz::<hyperlens_io::IoError, _>(&tables.join("projections.npz"), |z| {
        for (name, a) in &projections {
            z.add(name, a)?;
        }
        z.add("term_ids", test.term_ids())
    })?;
    write_projection_figures(
        test,
        &projections,
        tsne_points,
        &name,
        &out.join(format!("figures/{name}_projections_term.png")),
        &out.join(format!("figures/{name}_projections_target.png")),
    )?;
    progress(Progress::Analysis {
        name: &name,
        done: 2,
        total: 2,
    });
    seconds.analysis = t0.elapsed().as_secs_f64();
    Ok(LogicEntry {
        name,
        dir: dir.to_path_buf(),
        mixer: cfg.mixer.to_string(),
        split: settings.split.clone(),
        sets,
        decoding,
        tsne_trustworthiness: trust,
        tsne_points,
        tsne_perplexity,
        fixed_query: query,
        training,
        steps: info.steps,
        seconds,
    })
}

/// Draws the projections of logic codes (the paper's Fig. 2D / A2): the PCA of all layers and the
/// t-SNE side by side over the first `n` codes, coloured by the task's first term (binary term
/// index, `term_png`) and, when the codes carry it, by the target value (`target_png`). `title`
/// names the checkpoint or file. Returns whether the target figure was written.
///
/// # Shapes
/// `projections` holds `pca_all [N, 2]` and `tsne_all [n, 2]` ([`TermCodes::projections`]).
///
/// # Errors
/// [`ReportError::InvalidInput`] if a projection is missing or shorter than `n`; a failed render
/// or write.
pub fn write_projection_figures(
    codes: &TermCodes,
    projections: &[NamedProjection],
    n: usize,
    title: &str,
    term_png: &Path,
    target_png: &Path,
) -> Result<bool> {
    let find = |name: &str| {
        projections
            .iter()
            .find(|(p, _)| p == name)
            .map(|(_, a)| a)
            .ok_or_else(|| ReportError::InvalidInput(format!("no projection `{name}`")))
    };
    let (pca, tsne) = (find("pca_all")?, find("tsne_all")?);
    let ids = codes.term_ids();
    if pca.nrows() < n || tsne.nrows() < n || ids.nrows() < n {
        return Err(ReportError::InvalidInput(format!(
            "projections of {} / {} codes for {n} points",
            pca.nrows(),
            tsne.nrows()
        )));
    }
    let pca = pca.slice(ndarray::s![..n, ..]);
    let tsne = tsne.slice(ndarray::s![..n, ..]);
    let panels = || {
        vec![
            ScatterPanel {
                title: "PCA, all layers".into(),
                points: pca,
                explained: [0.0, 0.0],
                axes: Some(["PC1".into(), "PC2".into()]),
            },
            ScatterPanel {
                title: "t-SNE, all layers".into(),
                points: tsne,
                explained: [0.0, 0.0],
                axes: Some(["t-SNE 1".into(), "t-SNE 2".into()]),
            },
        ]
    };
    let bits = (ids.iter().copied().max().unwrap_or(0) as f64 + 1.0)
        .log2()
        .ceil()
        .max(1.0) as usize;
    let first: Vec<usize> = (0..n).map(|i| ids[[i, 0]].max(0) as usize).collect();
    let n_terms = first.iter().copied().max().unwrap_or(0) + 1;
    let names: Vec<String> = (0..n_terms).map(|t| format!("{t:0bits$b}")).collect();
    let fig = PcaScatter::by_category(
        &format!("{title}: latent codes coloured by the task's first term"),
        panels(),
        &first,
        &names,
        "first term",
    );
    save_png(term_png, &fig)?;
    let Some(target) = codes.target() else {
        return Ok(false);
    };
    let values: Vec<f64> = target.iter().take(n).copied().collect();
    let fig = PcaScatter::by_value(
        &format!("{title}: latent codes coloured by the target f(x)"),
        panels(),
        &values,
        "target f(x)",
    );
    save_png(target_png, &fig)?;
    Ok(true)
}

/// `0.931`, or `-` for a value not measured.
fn r2_text(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

/// `45,000 of 50,000` for a run stopped before the end of its schedule, or `50,000`; `?` when not
/// recorded.
pub(crate) fn steps_text(steps: Option<Steps>) -> String {
    match steps {
        None => "?".into(),
        Some(s) => match s.planned.filter(|&p| p > s.done) {
            Some(p) => format!("{} of {}", thousands(s.done), thousands(p)),
            None => thousands(s.done),
        },
    }
}

/// Sentences on one checkpoint's term decoding: the best layer's F1 against its controls, and the
/// ridge R² of the term matrix.
pub fn decoding_text(e: &LogicEntry) -> String {
    let mut s = String::new();
    let where_ = |r: &TermDecodingRow| {
        r.layer
            .map_or_else(|| "all layers".to_string(), |l| format!("layer {l}"))
    };
    // The best of the layers and of all layers together (on a tie, the first: a single layer).
    let Some(best) = e
        .decoding
        .iter()
        .rev()
        .max_by(|a, b| a.f1_mean.total_cmp(&b.f1_mean))
    else {
        return s;
    };
    let control = best.f1_base_rate.max(best.f1_shuffled);
    let layer = where_(best);
    let _ = write!(
        s,
        "The per-term probes, trained on the ID tasks' codes and tested on held-out pairs of known terms, reach their best mean F1 at {layer}: {:.3} against {:.3} for answering yes everywhere (base rate) and {:.3} for probes trained on shuffled labels ({} terms scored).",
        best.f1_mean, best.f1_base_rate, best.f1_shuffled, best.n_terms
    );
    let margin = best.f1_mean - control;
    if margin > 0.05 {
        let _ = write!(
            s,
            " The codes name the terms beyond the controls, by {margin:.3} in F1."
        );
    } else if margin >= -0.05 {
        s.push_str(" That is within 0.05 of the better control: the probes do no better than the controls.");
    } else {
        let _ = write!(
            s,
            " That is {:.3} below the better control: the probes do worse than a constant guess.",
            -margin
        );
    }
    let ridge: Vec<String> = e
        .decoding
        .iter()
        .map(|r| {
            format!(
                "{} {:.3}",
                r.layer
                    .map_or_else(|| "all layers".into(), |l| format!("layer {l}")),
                r.ridge_r2
            )
        })
        .collect();
    let _ = write!(
        s,
        " The ridge regression from the code to the term matrix (fit on one half of the OOD codes, scored on the other) has R² {}.",
        ridge.join(", ")
    );
    // The verdict weighs both measures: a linear map can recover the term matrix from a code whose
    // per-term yes/no probes fail (and the reverse).
    let top = e
        .decoding
        .iter()
        .rev()
        .max_by(|a, b| a.ridge_r2.total_cmp(&b.ridge_r2))
        .map(|r| (r.ridge_r2, where_(r)));
    match top {
        Some((r2, l)) if r2 > 0.1 && margin <= 0.05 => {
            let _ = write!(
                s,
                " So the codes carry the terms in part (R² {r2:.3} at {l}), in a form that the per-term yes/no probes do not use."
            );
        }
        Some((r2, l)) if r2 > 0.1 => {
            let _ = write!(
                s,
                " Both measures find the terms in the codes (R² {r2:.3} at {l})."
            );
        }
        Some((_, _)) if margin > 0.05 => {
            s.push_str(
                " Only the probes find the terms; the regression does not (R² at most 0.1).",
            );
        }
        Some(_) if margin <= 0.05 => {
            s.push_str(" Neither measure finds the terms in these codes.");
        }
        _ => {}
    }
    s
}

/// Sentences on one checkpoint's training log (R² at the last and best evaluation).
fn training_text(rows: &[MetricsRow]) -> String {
    let mut s = String::new();
    let last_step = rows.iter().map(|r| r.step).max().unwrap_or(0);
    let _ = write!(s, "The log covers {} steps.", thousands(last_step));
    let ood: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| r.ood_acc.map(|v| (r.step, v)))
        .collect();
    if let (Some(last), Some(best)) = (ood.last(), ood.iter().max_by(|a, b| a.1.total_cmp(&b.1))) {
        let _ = write!(
            s,
            " At the last evaluation (step {}) the OOD R² is {:.3}",
            thousands(last.0),
            last.1
        );
        if best.0 != last.0 && best.1 > last.1 {
            let _ = write!(
                s,
                "; the best was {:.3} at step {}",
                best.1,
                thousands(best.0)
            );
        }
        s.push('.');
    }
    s
}

/// The figures of one logic checkpoint: term decoding per layer, the two projections (written by
/// `analyse_logic_checkpoint`) and the training curves; and the sentence said instead of the
/// training figure when there is no log.
///
/// # Errors
/// [`ReportError::Viz`] for a figure that cannot be drawn or written.
pub fn logic_figures(e: &LogicEntry, out: &Path) -> Result<(Vec<FigureRef>, Option<String>)> {
    let name = &e.name;
    let mut made = Vec::new();
    // Term decoding per layer: F1 and the ridge R² (clipped at 0), with the two F1 controls.
    let f1: Vec<f64> = e
        .decoding
        .iter()
        .map(|r| r.f1_mean.clamp(0.0, 1.0))
        .collect();
    let ridge: Vec<f64> = e
        .decoding
        .iter()
        .map(|r| r.ridge_r2.clamp(0.0, 1.0))
        .collect();
    let base = [e
        .decoding
        .first()
        .map_or(0.0, |r| r.f1_base_rate.clamp(0.0, 1.0))];
    let shuffled: Vec<f64> = e
        .decoding
        .iter()
        .map(|r| r.f1_shuffled.clamp(0.0, 1.0))
        .collect();
    let n_layers = e.decoding.iter().filter(|r| r.layer.is_some()).count();
    let mut fig = LayerAccuracy::new(
        &format!("{name}: term decoding from the latent codes"),
        n_layers,
        vec![
            Series {
                name: "F1, ID -> OOD tasks".into(),
                values: &f1,
            },
            Series {
                name: "ridge R² of the terms".into(),
                values: &ridge,
            },
        ],
        vec![
            Reference {
                name: "F1 base rate".into(),
                values: &base,
            },
            Reference {
                name: "F1 shuffled labels".into(),
                values: &shuffled,
            },
        ],
    );
    fig.y_label = "F1 / R²".into();
    made.push(save_figure(
        out,
        format!("figures/{name}_term_decoding.png"),
        &fig,
        &format!("{name}: term decoding"),
        "Term decoding per layer: mean F1 of per-term probes (ID tasks to held-out tasks) and ridge R² of the term matrix (R² below 0 drawn at 0)".into(),
        decoding_text(e),
    )?);
    made.push(FigureRef {
        id: format!("fig-{}", crate::doc::slug(&format!("{name}-projections-term"))),
        short: format!("{name}: projections by term"),
        caption: format!(
            "PCA and t-SNE of the OOD codes (all layers; t-SNE of the first {}, perplexity {}), coloured by the task's first term",
            e.tsne_points, e.tsne_perplexity
        ),
        text: format!(
            "The t-SNE embedding keeps the neighbourhoods of the codes with trustworthiness {:.3} (k = 5; 1 is perfect).",
            e.tsne_trustworthiness
        ),
        src: format!("figures/{name}_projections_term.png"),
        width: PROJECTION_WIDTH,
    });
    made.push(FigureRef {
        id: format!("fig-{}", crate::doc::slug(&format!("{name}-projections-target"))),
        short: format!("{name}: projections by target"),
        caption: "The same projections coloured by the target value f(x) of the fixed query".into(),
        text: "Colour by target shows whether the code at the query varies with the answer rather than with the task's terms.".into(),
        src: format!("figures/{name}_projections_target.png"),
        width: PROJECTION_WIDTH,
    });
    let no_training = match &e.training {
        Training::Missing { .. } => Some(format!(
            "No training curves: the checkpoint has no `{}`.",
            hyperlens_train::metrics::METRICS_FILE
        )),
        Training::Log(rows) => match training_figure(e, rows, out)? {
            Some(f) => {
                made.push(f);
                None
            }
            None => Some("No training curves: the log holds no value.".into()),
        },
    };
    Ok((made, no_training))
}

/// The width of the projection figures ([`PcaScatter`] with two panels).
const PROJECTION_WIDTH: u32 = 1100;

/// Saves `fig` as `out/rel` (PNG) and returns its [`FigureRef`].
fn save_figure<F: hyperlens_viz::Figure>(
    out: &Path,
    rel: String,
    fig: &F,
    short: &str,
    caption: String,
    text: String,
) -> Result<FigureRef> {
    crate::figures::save(out, rel, fig, short, caption, text)
}

/// Loss (MSE) and R² curves of a logic training log (R² below 0, early in training, at 0).
fn training_figure(e: &LogicEntry, rows: &[MetricsRow], out: &Path) -> Result<Option<FigureRef>> {
    let log = crate::figures::TrainingLog {
        rows,
        loss: &[
            ("train MSE", |r| r.train_loss),
            ("ID MSE", |r| r.id_loss),
            ("OOD MSE", |r| r.ood_loss),
        ],
        metric: &[
            ("ID R²", |r| r.id_acc),
            ("OOD R²", |r| r.ood_acc),
            ("unknown-term R²", |r| {
                r.extra.get("unknown").and_then(|(_, m)| *m)
            }),
        ],
        metric_label: "R²",
    };
    crate::figures::training_curves_figure(
        out,
        &e.name,
        &log,
        &format!("{}: training curves", e.name),
        "Training curves: MSE and the R² of the ID, OOD and unknown-term sets against the step (R² below 0 drawn at 0)".into(),
        training_text(rows),
    )
}

/// The paragraphs setting the OOD R² beside Table A1: each mixer's number against the paper's,
/// the training budget, and whether HYLA leads as in the paper.
pub fn paper_paragraphs(entries: &[LogicEntry]) -> Vec<String> {
    let mut out = Vec::new();
    let mean_of = |mixer: &str| {
        let v: Vec<f64> = entries
            .iter()
            .filter(|e| e.mixer == mixer)
            .filter_map(|e| e.r2("ood"))
            .filter(|v| v.is_finite())
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let mut parts = Vec::new();
    for (mixer, mean, se) in PAPER_LOGIC_OOD_R2 {
        if let Some(here) = mean_of(mixer) {
            let verdict = if (here * 100.0 - mean).abs() <= 2.0 * se {
                "within two standard errors of it"
            } else if here * 100.0 > mean {
                "above it"
            } else {
                "below it"
            };
            parts.push(format!(
                "{mixer} {:.1} % against the paper's {mean:.1} ± {se:.1} % ({verdict})",
                here * 100.0
            ));
        }
    }
    if parts.is_empty() {
        return out;
    }
    let budgets: Vec<String> = entries
        .iter()
        .map(|e| format!("{} {}", md_escape(&e.name), steps_text(e.steps)))
        .collect();
    out.push(format!(
        "**Fuzzy logic, OOD R².** On held-out pairs of known terms the checkpoints here reach {}. The paper's numbers are means ± standard errors over three seeds after {} updates; each checkpoint here is one seed, trained for: {}.",
        parts.join("; "),
        thousands(PAPER_LOGIC_STEPS),
        budgets.join(", ")
    ));
    if let Some(hyla) = mean_of("hyla") {
        let others: Vec<(&str, f64)> = ["softmax", "linear"]
            .into_iter()
            .filter_map(|m| mean_of(m).map(|v| (m, v)))
            .collect();
        if !others.is_empty() {
            let leads = others.iter().all(|(_, v)| hyla > *v);
            let list: Vec<String> = others.iter().map(|(m, v)| format!("{m} {v:.3}")).collect();
            out.push(if leads {
                format!(
                    "As in the paper, HYLA leads: its OOD R² {hyla:.3} is above {}.",
                    list.join(" and ")
                )
            } else {
                format!(
                    "Unlike the paper, HYLA does not lead here: its OOD R² {hyla:.3} against {}.",
                    list.join(" and ")
                )
            });
        }
    }
    out
}

/// Adds the fuzzy-logic section to `doc`: the R² table beside Table A1, the comparison paragraphs,
/// then one subsection per checkpoint with its term-decoding table and figures.
pub fn section(
    doc: &mut Document,
    entries: &[LogicEntry],
    figs: &[(Vec<FigureRef>, Option<String>)],
    n: usize,
    seed: u64,
) {
    doc.heading(2, "Fuzzy-logic task");
    doc.paragraph(format!(
        "{} on the fuzzy-logic task (f(x) = max over the task's terms of the min over their literals): the paper's R² (per sequence 1 - (prediction - target)² / var(targets), averaged) on {n} sequences per set (seed {seed}) of the ID tasks, of held-out pairs of known terms (OOD) and of pairs of unknown terms; latent codes of the paper's site (the last token's attention to itself, one value per layer and head) on {n} ID and {n} OOD sequences that all share one fixed query (seed {seed}), labelled by the task's terms.",
        crate::text::count(entries.len(), "checkpoint")
    ));
    let paper = |mixer: &str| {
        PAPER_LOGIC_OOD_R2
            .iter()
            .find(|(m, _, _)| *m == mixer)
            .map_or_else(|| "-".into(), |(_, m, s)| format!("{m:.1} ± {s:.1} %"))
    };
    let header = [
        "checkpoint",
        "mixer",
        "split",
        "updates trained",
        "ID R²",
        "OOD R²",
        "unknown-term R²",
        "paper OOD R² (Table A1)",
        "term F1, all layers (base rate)",
    ]
    .map(String::from)
    .to_vec();
    let rows = entries
        .iter()
        .map(|e| {
            vec![
                md_escape(&e.name),
                e.mixer.clone(),
                md_escape(&e.split),
                steps_text(e.steps),
                r2_text(e.r2("id")),
                r2_text(e.r2("ood")),
                r2_text(e.r2("unknown")),
                paper(&e.mixer),
                e.all_layers().map_or_else(
                    || "-".into(),
                    |r| format!("{:.3} ({:.3})", r.f1_mean, r.f1_base_rate),
                ),
            ]
        })
        .collect();
    doc.table(header, rows);
    for p in paper_paragraphs(entries) {
        doc.paragraph(p);
    }
    for (e, (f, no_training)) in entries.iter().zip(figs) {
        doc.heading(3, &e.name);
        doc.paragraph(format!(
            "Checkpoint `{}`; fixed query {}.",
            e.dir.display(),
            e.fixed_query
                .iter()
                .map(|v| format!("{v:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let header = [
            "layer",
            "ridge R²",
            "F1 (mean over terms)",
            "F1 base rate",
            "F1 shuffled labels",
            "terms scored",
        ]
        .map(String::from)
        .to_vec();
        let rows = e
            .decoding
            .iter()
            .map(|r| {
                vec![
                    r.layer.map_or_else(|| "all".into(), |l| l.to_string()),
                    format!("{:.3}", r.ridge_r2),
                    format!("{:.3}", r.f1_mean),
                    format!("{:.3}", r.f1_base_rate),
                    format!("{:.3}", r.f1_shuffled),
                    r.n_terms.to_string(),
                ]
            })
            .collect();
        doc.table(header, rows);
        for fig in f {
            doc.figure(fig.clone());
        }
        if let Some(s) = no_training {
            doc.paragraph(s.clone());
        }
        doc.paragraph(format!(
            "Tables: `tables/{0}/term_decoding.csv`, `tables/{0}/projections.npz`; codes: `codes/{0}_id.npz`, `codes/{0}_ood.npz`.",
            e.name
        ));
    }
}

/// `tables/logic.csv`: one row per logic checkpoint, columns
/// `checkpoint,mixer,split,id_r2,ood_r2,unknown_r2,id_mse,ood_mse,unknown_mse,n,steps,planned_steps`
/// (empty where not measured or recorded).
pub fn logic_csv(entries: &[LogicEntry]) -> String {
    let mut s = String::from(
        "checkpoint,mixer,split,id_r2,ood_r2,unknown_r2,id_mse,ood_mse,unknown_mse,n,steps,planned_steps\n",
    );
    for e in entries {
        let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        let m = |set: &str, f: fn(&SetMetrics) -> f64| {
            e.sets
                .iter()
                .find(|(n, _)| *n == set)
                .map_or(String::new(), |(_, m)| format!("{:.6}", f(m)))
        };
        let n = e.sets.first().map_or(0, |(_, m)| m.n);
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            e.name,
            e.mixer,
            e.split,
            m("id", |m| m.metric),
            m("ood", |m| m.metric),
            m("unknown", |m| m.metric),
            m("id", |m| m.loss),
            m("ood", |m| m.loss),
            m("unknown", |m| m.loss),
            n,
            opt(e.steps.map(|s| s.done)),
            opt(e.steps.and_then(|s| s.planned)),
        );
    }
    s
}

/// The logic checkpoints' part of `summary.json`.
pub fn summary(
    entries: &[LogicEntry],
    figs: &[(Vec<FigureRef>, Option<String>)],
) -> serde_json::Value {
    json!(entries.iter().zip(figs).map(|(e, (f, _))| json!({
        "name": e.name,
        "dir": e.dir.display().to_string(),
        "mixer": e.mixer,
        "split": e.split,
        "steps": e.steps.map(|s| s.done),
        "planned_steps": e.steps.and_then(|s| s.planned),
        "sets": e.sets.iter().map(|(n, m)| json!({"set": n, "r2": m.metric, "mse": m.loss, "n": m.n})).collect::<Vec<_>>(),
        "fixed_query": e.fixed_query,
        "term_decoding": e.decoding,
        "tsne_points": e.tsne_points,
        "tsne_perplexity": e.tsne_perplexity,
        "tsne_trustworthiness_k5": e.tsne_trustworthiness,
        "training_log": matches!(e.training, Training::Log(_)),
        "figures": f.iter().map(|f| json!({"file": f.src, "caption": f.caption, "text": f.text})).collect::<Vec<_>>(),
    })).collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(rows: &[(Option<usize>, f64, f64)]) -> LogicEntry {
        LogicEntry {
            name: "x".into(),
            dir: PathBuf::from("x"),
            mixer: "hyla".into(),
            split: "seed0".into(),
            sets: Vec::new(),
            decoding: rows
                .iter()
                .map(|&(layer, ridge_r2, f1_mean)| TermDecodingRow {
                    layer,
                    ridge_r2,
                    f1_mean,
                    f1_base_rate: 0.284,
                    f1_shuffled: 0.0,
                    n_terms: 12,
                })
                .collect(),
            tsne_trustworthiness: 0.0,
            tsne_points: 0,
            tsne_perplexity: 0.0,
            fixed_query: Vec::new(),
            training: Training::Missing { trained_by: None },
            steps: None,
            seconds: LogicSeconds::default(),
        }
    }

    /// The verdict weighs the ridge R² beside the probes' F1: F1 below the base rate with a ridge
    /// R² above 0.1 says the codes carry the terms in part; both low says neither finds them.
    #[test]
    fn term_decoding_verdicts_weigh_both_measures() {
        let t = decoding_text(&entry(&[(Some(0), -0.003, 0.0), (Some(1), 0.213, 0.225)]));
        assert!(t.contains("0.059 below the better control"), "{t}");
        assert!(
            t.contains("carry the terms in part (R² 0.213 at layer 1)"),
            "{t}"
        );
        let t = decoding_text(&entry(&[(Some(0), 0.01, 0.20), (Some(1), 0.02, 0.25)]));
        assert!(t.contains("Neither measure finds the terms"), "{t}");
        let t = decoding_text(&entry(&[(Some(0), 0.3, 0.5), (None, 0.35, 0.55)]));
        assert!(
            t.contains("best mean F1 at all layers: 0.550")
                && t.contains("Both measures find the terms in the codes (R² 0.350 at all layers)"),
            "{t}"
        );
        let t = decoding_text(&entry(&[(Some(0), 0.04, 0.25), (None, 0.13, 0.342)]));
        assert!(
            t.contains("Both measures") && t.contains("by 0.058 in F1"),
            "{t}"
        );
        let t = decoding_text(&entry(&[(Some(0), 0.04, 0.25), (None, 0.05, 0.40)]));
        assert!(t.contains("Only the probes find the terms"), "{t}");
    }
}
