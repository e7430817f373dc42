//! The measure stage of the study: the only code of [`crate::lm_study`] that runs the model. It
//! generates the prompts, extracts the codes (with the residual stream, and again from the model
//! with its weights shuffled), runs the analyses of each experiment and split, builds the
//! latent-space explorers and runs the transplant.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use hyperlens_analysis::lm::{analyze_sets, LmAnalysis, LmAnalysisParams, LmCodeSet, LmProgress};
use hyperlens_model::lm::{self, CodeForm, LanguageModel, LmTokenizer};
use hyperlens_probe::prompts::{extract_rows, PromptProbeParams, PromptProbeSources, PromptRows};
use hyperlens_tasks::prompts::{
    apply_hold_out, hold_out_combinations, icl, relations, IclParams, PromptSet, RelationsParams,
    SiteSpec, DEFAULT_HOLD_OUT, ICL_SITES, RELATIONS_SITES,
};
use ndarray::Array1;

use super::files::StageTime;
use super::verdict::MIN_COMBINATION_ACCURACY;
use super::{LmStudyParams, OnProgress, StudyProgress};
use crate::error::{ReportError, Result};
use crate::lm_explorer::{self, LmExplorer};

/// (operation, domain) pairs.
pub type Combinations = Vec<(String, String)>;

/// Shortest single-token words of the model's vocabulary that Experiment 1 uses (letters).
pub const MIN_WORD_LEN: usize = 4;

/// The model the study ran on.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// The model's file or directory name (`SmolLM2-135M-Instruct.Q4_1.gguf`).
    pub name: String,
    /// Its kind (`gguf-llama`, ...).
    pub kind: String,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads per block.
    pub n_heads: usize,
}

/// Experiment 1's result.
#[derive(Debug, Clone)]
pub struct RelationsResult {
    /// Single-token words of the model's vocabulary (both halves).
    pub n_words: usize,
    /// The analysis (factor `relation`, seen vocabulary -> held-out vocabulary).
    pub analysis: LmAnalysis,
    /// The latent-space explorer of the held-out prompts.
    pub explorer: LmExplorer,
}

/// One hold-out split of Experiment 2.
#[derive(Debug, Clone)]
pub struct IclSplit {
    /// The hold-out seed.
    pub seed: u64,
    /// The held-out (operation, domain) combinations.
    pub held_out: Vec<(String, String)>,
    /// The seen -> held-out analysis, or why the operation could not be decoded on this split
    /// (e.g. fewer than two operations among the solved seen combinations).
    pub ood: std::result::Result<LmAnalysis, String>,
    /// The analysis trained and tested on two halves of the seen combinations' prompts (the seen
    /// accuracy), or why it could not run.
    pub seen: std::result::Result<LmAnalysis, String>,
    /// The seen -> held-out analysis of every combination, those the model fails included (no
    /// behaviour filter): a secondary analysis that the verdict reports but does not rest on.
    pub unfiltered: std::result::Result<LmAnalysis, String>,
}

/// Experiment 2's result.
#[derive(Debug, Clone)]
pub struct IclResult {
    /// The model's accuracy per operation x domain (from the first split's analysis: the
    /// behaviour does not depend on the split), with the kept combinations.
    pub behaviour: hyperlens_analysis::lm::LmBehaviour,
    /// The model's accuracy over all prompts.
    pub accuracy: f64,
    /// One entry per hold-out seed.
    pub splits: Vec<IclSplit>,
    /// The latent-space explorer of the first split's held-out prompts (when it decoded).
    pub explorer: Option<LmExplorer>,
}

/// Everything the study measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The model.
    pub model: ModelInfo,
    /// Experiment 1.
    pub relations: RelationsResult,
    /// Experiment 2; `None` when Experiment 1 failed its control (the study stops there).
    pub icl: Option<IclResult>,
    /// The transplant; `None` without Experiment 2 or without a layer that decodes.
    pub transplant: Option<super::files::TransplantResult>,
}

/// A progress callback of one stage, in the study's terms.
fn stage<'a, 'b: 'a>(
    progress: &'a mut OnProgress<'b>,
    name: &'a str,
    unit: &'a str,
) -> impl FnMut(usize, usize) -> ControlFlow<()> + use<'a, 'b> {
    move |done, total| {
        progress(StudyProgress {
            stage: name,
            done,
            total,
            unit,
        })
    }
}

/// The code set of `prompts` from `model` (with the residual stream) and from the model with
/// its weights shuffled (`seed`), extracted into `work` and read back.
#[allow(clippy::too_many_arguments)]
fn codes_of(
    model: &LanguageModel,
    tok: &LmTokenizer,
    prompts: &PromptSet,
    sites: &SiteSpec,
    label: &str,
    params: &LmStudyParams,
    work: &Path,
    name: &str,
    progress: &mut OnProgress<'_>,
) -> Result<(LmCodeSet, LmCodeSet)> {
    let probe = PromptProbeParams {
        sites: sites.clone(),
        layers: None,
        form: CodeForm::Pattern,
        batch: params.batch,
        prepend_bos: None,
        label_factor: Some(label.to_string()),
        resid: true,
        shuffle_weights: None,
    };
    let rows = PromptRows::new(tok, prompts, &probe)?;
    let sources = PromptProbeSources {
        model: params.model.display().to_string(),
        model_kind: lm::detect(&params.model)?.to_string(),
        prompts: work.join(format!("{name}.jsonl")).display().to_string(),
    };
    prompts.save(&work.join(format!("{name}.jsonl")))?;
    let path = work.join(format!("{name}.npz"));
    let stage_name = format!("{name}: codes");
    extract_rows(
        model,
        tok,
        &rows,
        &probe,
        &sources,
        &path,
        stage(progress, &stage_name, "prompts"),
    )?;
    let shuffled_probe = PromptProbeParams {
        resid: false,
        shuffle_weights: Some(params.seed),
        ..probe.clone()
    };
    let shuffled_path = work.join(format!("{name}_shuffled_weights.npz"));
    let stage_name = format!("{name}: codes of the shuffled-weights model");
    extract_rows(
        model,
        tok,
        &rows,
        &shuffled_probe,
        &sources,
        &shuffled_path,
        stage(progress, &stage_name, "prompts"),
    )?;
    Ok((
        LmCodeSet::read(&path)?.with_source_name(format!("{name} codes")),
        LmCodeSet::read(&shuffled_path)?
            .with_source_name(format!("{name} codes of the shuffled-weights model")),
    ))
}

/// The analysis settings of the study for `factor`.
/// The analysis settings of the study for `factor` of the code file `codes` (a name: the file
/// lives in the run's working directory, removed when the report is complete).
fn analysis_params(
    params: &LmStudyParams,
    codes: &str,
    factor: &str,
    min_accuracy: Option<f64>,
) -> LmAnalysisParams {
    LmAnalysisParams {
        factor: Some(factor.to_string()),
        min_accuracy,
        seed: params.seed,
        n_bootstrap: params.n_bootstrap,
        ..LmAnalysisParams::new(codes)
    }
}

/// [`analyze_sets`] with the study's progress.
fn analyse(
    set: &LmCodeSet,
    shuffled: &LmCodeSet,
    aparams: &LmAnalysisParams,
    name: &str,
    progress: &mut OnProgress<'_>,
) -> Result<LmAnalysis> {
    let mut on = |p: &LmProgress| {
        let stage_name = format!("{name}: {}", p.stage);
        progress(StudyProgress {
            stage: &stage_name,
            done: p.done,
            total: p.total,
            unit: "steps",
        })
    };
    Ok(analyze_sets(set, Some(shuffled), aparams, &mut on)?)
}

/// An analysis whose input error (e.g. one class among the kept training rows) is a finding of
/// the study, kept as its message; every other error stops the study.
fn finding(r: Result<LmAnalysis>) -> Result<std::result::Result<LmAnalysis, String>> {
    match r {
        Ok(a) => Ok(Ok(a)),
        Err(ReportError::Analysis(hyperlens_analysis::AnalysisError::InvalidInput(m))) => {
            Ok(Err(m))
        }
        Err(e) => Err(e),
    }
}

/// Experiment 1 (module docs of [`crate::lm_study`]).
///
/// # Errors
/// A vocabulary too small for the prompts; model, analysis and write errors; an interruption.
pub fn relations_experiment(
    model: &LanguageModel,
    tok: &LmTokenizer,
    params: &LmStudyParams,
    out: &Path,
    work: &Path,
    progress: &mut OnProgress<'_>,
) -> Result<RelationsResult> {
    // The tokenizer gives each word with its leading space; the generator adds the spaces.
    let words: Vec<String> = tok
        .single_token_words(MIN_WORD_LEN)
        .iter()
        .map(|w| w.trim_start().to_string())
        .collect();
    let n_words = words.len();
    let set = relations(&RelationsParams {
        n: params.n_relations,
        seed: params.seed,
        words: Some(words),
        ..RelationsParams::default()
    })?;
    set.save(&out.join("prompts/relations.jsonl"))?;
    let sites = SiteSpec::parse(RELATIONS_SITES)?;
    let (codes, shuffled) = codes_of(
        model,
        tok,
        &set,
        &sites,
        "relation",
        params,
        work,
        "relations",
        progress,
    )?;
    let analysis = analyse(
        &codes,
        &shuffled,
        &analysis_params(params, "relations.npz", "relation", None),
        "relations",
        progress,
    )?;
    let explorer = lm_explorer::build_for_analysis(&codes, Some((&set, tok)), &analysis)?;
    Ok(RelationsResult {
        n_words,
        analysis,
        explorer,
    })
}

/// The split array of `set` under the hold-out seed `seed` (1 for the held-out combinations),
/// with those combinations.
pub(crate) fn hold_out(set: &PromptSet, seed: u64) -> Result<(Array1<i64>, Combinations)> {
    let held = hold_out_combinations(set, "operation", "domain", DEFAULT_HOLD_OUT, seed)?;
    // `apply_hold_out` keeps a split a prompt already has (the generator's): clear them first.
    let mut split_set = set.clone();
    for p in &mut split_set.prompts {
        p.split = None;
    }
    apply_hold_out(&mut split_set, "operation", "domain", &held);
    let split = split_set
        .splits()
        .iter()
        .map(|s| i64::from(*s == Some(hyperlens_tasks::prompts::PromptSplit::Test)))
        .collect();
    Ok((split, held))
}

/// The seen prompts of `set` (split 0), every other prompt of each combination moved to the
/// test split: the rows of the seen accuracy.
fn seen_halves(set: &LmCodeSet) -> Result<(Vec<usize>, Array1<i64>)> {
    let rows: Vec<usize> = (0..set.n_prompts())
        .filter(|&i| set.split()[i] == 0)
        .collect();
    let mut count: BTreeMap<Vec<i64>, usize> = BTreeMap::new();
    let split = rows
        .iter()
        .map(|&i| {
            let c = count.entry(set.factors().row(i).to_vec()).or_default();
            *c += 1;
            i64::from(c.is_multiple_of(2))
        })
        .collect();
    Ok((rows, split))
}

/// Experiment 2 (module docs of [`crate::lm_study`]).
///
/// # Errors
/// Model, analysis and write errors; an interruption.
pub fn icl_experiment(
    model: &LanguageModel,
    tok: &LmTokenizer,
    params: &LmStudyParams,
    out: &Path,
    work: &Path,
    progress: &mut OnProgress<'_>,
) -> Result<(IclResult, PromptSet, LmCodeSet)> {
    let set = icl(&IclParams {
        n: params.n_icl,
        seed: params.seed,
        shots: params.shots,
        hold_out: DEFAULT_HOLD_OUT,
    })?;
    set.save(&out.join("prompts/icl.jsonl"))?;
    let sites = SiteSpec::parse(ICL_SITES)?;
    let (codes, shuffled) = codes_of(
        model,
        tok,
        &set,
        &sites,
        "operation",
        params,
        work,
        "icl",
        progress,
    )?;
    let aparams = analysis_params(
        params,
        "icl.npz",
        "operation",
        Some(MIN_COMBINATION_ACCURACY),
    );
    let unfiltered_params = analysis_params(params, "icl.npz", "operation", None);
    let mut splits = Vec::with_capacity(params.split_seeds.len());
    let mut behaviour = None;
    let mut explorer = None;
    for (j, &seed) in params.split_seeds.iter().enumerate() {
        let (split, held_out) = hold_out(&set, seed)?;
        let c = codes.clone().with_split(split.clone())?;
        let s = shuffled.clone().with_split(split)?;
        let name = format!("icl split {}", j + 1);
        let ood = finding(analyse(&c, &s, &aparams, &name, progress))?;
        let (rows, halves) = seen_halves(&c)?;
        let seen = finding(
            c.select(&rows)
                .and_then(|x| x.with_split(halves.clone()))
                .map_err(ReportError::from)
                .and_then(|cs| {
                    let ss = s.select(&rows)?.with_split(halves)?;
                    analyse(&cs, &ss, &aparams, &format!("{name} (seen)"), progress)
                }),
        )?;
        let unfiltered = finding(analyse(
            &c,
            &s,
            &unfiltered_params,
            &format!("{name} (all combinations)"),
            progress,
        ))?;
        if j == 0 {
            if let Ok(a) = &ood {
                behaviour = Some(a.behaviour.clone());
                explorer = Some(lm_explorer::build_for_analysis(&c, Some((&set, tok)), a)?);
            }
        }
        splits.push(IclSplit {
            seed,
            held_out,
            ood,
            seen,
            unfiltered,
        });
    }
    let behaviour = match behaviour {
        Some(b) => b,
        None => hyperlens_analysis::lm::behaviour(&codes, Some(MIN_COMBINATION_ACCURACY))?,
    };
    let correct = codes
        .correct()
        .map_or(0, |c| c.iter().filter(|&&x| x).count());
    Ok((
        IclResult {
            behaviour,
            accuracy: correct as f64 / codes.n_prompts() as f64,
            splits,
            explorer,
        },
        set,
        codes,
    ))
}

/// Loads the model and its tokenizer, runs Experiment 1, and Experiment 2 and the transplant
/// when Experiment 1 passes its control ([`super::verdict::relations_pass`]); records the seconds
/// of each stage in `times`.
///
/// # Errors
/// A model that is not a language model or has no tokenizer; the errors of the experiments.
pub fn measure(
    params: &LmStudyParams,
    out: &Path,
    work: &Path,
    progress: &mut OnProgress<'_>,
    times: &mut Vec<StageTime>,
) -> Result<Measured> {
    let mut t = Instant::now();
    let mut lap = |name: &str, times: &mut Vec<StageTime>| {
        times.push(StageTime {
            stage: name.into(),
            seconds: t.elapsed().as_secs_f64(),
        });
        t = Instant::now();
    };
    let kind = lm::detect(&params.model)?;
    let tok = lm::require_tokenizer(&params.model)?;
    let model = lm::load(&params.model, &params.device.to_candle()?)?;
    let info = ModelInfo {
        name: params.model.file_name().map_or_else(
            || params.model.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        kind: kind.to_string(),
        n_layers: model.n_layers(),
        n_heads: model.n_heads(),
    };
    lap("load the model", times);
    let relations = relations_experiment(&model, &tok, params, out, work, progress)?;
    lap("experiment 1 (relations)", times);
    if !super::verdict::relations_pass(&relations.analysis).passed {
        return Ok(Measured {
            model: info,
            relations,
            icl: None,
            transplant: None,
        });
    }
    let (icl, set, codes) = icl_experiment(&model, &tok, params, out, work, progress)?;
    lap("experiment 2 (icl)", times);
    let transplant =
        super::transplant::transplant(&model, &tok, &set, &codes, &icl, params, progress)?;
    lap("transplant", times);
    Ok(Measured {
        model: info,
        relations,
        icl: Some(icl),
        transplant,
    })
}
