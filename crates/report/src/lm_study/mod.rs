//! The study of issue 48: is there a reusable latent code in a pretrained language model's
//! attention? The question of "Attention as a Hypernetwork" (Schug et al., ICLR 2025), asked of a
//! language model with the lens of [`hyperlens_model::lm::LanguageModel::latent_codes`], as a
//! report: `hyperlens study MODEL --out reports/lm/<model>` (or `hl.lm_study` in Python).
//!
//! # What it runs
//! 1. **Experiment 1, the positive control** ([`measure::relations_experiment`]): the `relations` prompts
//!    (previous token, induction target, duplicate token, matching bracket, none) on the model's
//!    own single-token words, the test prompts on a disjoint half of that vocabulary. The relation
//!    of key to query is decoded from the codes of each layer and of all layers together, with the
//!    lens's controls. If it does not pass the thresholds of [`verdict`], the report says that the
//!    pipeline failed its control and stops there (no operation result is claimed).
//! 2. **Experiment 2, the paper's question** ([`measure::icl_experiment`]): the `icl` prompts (operations on
//!    ordered domains, few-shot). The model's accuracy per operation x domain; the combinations it
//!    solves at [`verdict::MIN_COMBINATION_ACCURACY`] or better are kept. The operation is decoded
//!    from the codes of the answer position (query) to the demonstrations' outputs and the test
//!    input (keys), trained on the seen combinations and tested on the held-out ones, on three
//!    hold-out splits of the same prompts (seeds 0, 1, 2 of
//!    [`hyperlens_tasks::prompts::hold_out_combinations`]), per layer and on all layers, with the
//!    shuffled-label, distance, shuffled-weight and residual-stream controls and bootstrap
//!    intervals over prompts; and, for the seen accuracy, trained and tested on two halves of the
//!    seen combinations' prompts.
//! 3. **Is the code causal?** ([`transplant::transplant`]): at the layer with the best mean held-out
//!    decoding, the latent-code transplant of [`hyperlens_probe::lm_transplant::lm_transplant`].
//! 4. **The verdict** ([`verdict`]), written from the numbers against thresholds fixed in the
//!    code before the run.
//!
//! # Files (in `out`)
//! `index.md`, `index.html` (with the interactive latent-space explorers), `summary.json`
//! ([`files::StudySummary`]), `tables/*.csv`, `figures/*.png` and `figures/*.svg`,
//! `prompts/relations.jsonl` and `prompts/icl.jsonl` (the prompts of the run, for
//! `hyperlens probe --prompts`), and `timings.json` (seconds and peak memory: the only file that
//! differs between two runs on the same model and CPU). The report is built in a staging
//! directory and swapped in whole (as the main report): a run stopped at any moment leaves the
//! previous report as it was.

pub mod figures;
pub mod files;
pub mod measure;
pub mod page;
pub mod transplant;
pub mod verdict;

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

use hyperlens_model::Device;

use crate::error::{ReportError, Result};

/// The study's settings. [`LmStudyParams::new`] gives the defaults of the committed report.
#[derive(Debug, Clone, PartialEq)]
pub struct LmStudyParams {
    /// The language model: a GGUF file, or a Hugging Face or hyperlens token-model directory.
    pub model: PathBuf,
    /// The report directory (replaced as a whole; must be a previous study or empty).
    pub out: PathBuf,
    /// Prompts of Experiment 1 (half train, half test on the other vocabulary half).
    pub n_relations: usize,
    /// Prompts of Experiment 2 (cycling through the 30 operation x domain combinations).
    pub n_icl: usize,
    /// Demonstrations per `icl` prompt.
    pub shots: usize,
    /// Seed of the prompts, the analyses and the transplant's random codes.
    pub seed: u64,
    /// Seeds of the held-out combinations of Experiment 2, one split each.
    pub split_seeds: Vec<u64>,
    /// Prompts per forward pass.
    pub batch: usize,
    /// Bootstrap resamples behind every interval.
    pub n_bootstrap: usize,
    /// Most target prompts of the transplant (the held-out prompts the model solves, in order).
    pub transplant_n: usize,
    /// Compute device.
    pub device: Device,
}

impl LmStudyParams {
    /// The settings of the committed SmolLM2-135M report: 500 relations prompts, 600 `icl`
    /// prompts of 5 shots (20 per combination), seed 0, hold-out seeds 0, 1, 2, batch 16, 1000
    /// bootstrap resamples, at most 200 transplant targets, on the CPU.
    pub fn new(model: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        Self {
            model: model.into(),
            out: out.into(),
            n_relations: 500,
            n_icl: 600,
            shots: 5,
            seed: 0,
            split_seeds: vec![0, 1, 2],
            batch: 16,
            n_bootstrap: 1000,
            transplant_n: 200,
            device: Device::Cpu,
        }
    }

    /// Checks the settings on their own, before any work.
    ///
    /// # Errors
    /// [`ReportError::InvalidInput`] naming the bad setting.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(ReportError::InvalidInput(m));
        if self.n_relations < 50 {
            return bad(format!(
                "n_relations = {}: Experiment 1 needs at least 50 prompts (10 per relation)",
                self.n_relations
            ));
        }
        if self.n_icl < 60 {
            return bad(format!(
                "n_icl = {}: Experiment 2 needs at least 60 prompts (2 per combination)",
                self.n_icl
            ));
        }
        if self.shots == 0 {
            return bad("shots must be at least 1".into());
        }
        if self.split_seeds.is_empty() {
            return bad("split_seeds: give at least one hold-out seed".into());
        }
        if self.batch == 0 {
            return bad("batch must be positive".into());
        }
        if self.n_bootstrap == 0 {
            return bad("n_bootstrap must be at least 1".into());
        }
        Ok(())
    }
}

/// Progress of [`run`]: `done` of `total` units of the step `stage` (e.g. `relations codes`,
/// prompts; `icl split 1 decoding`, analysis steps; `transplant`, target prompts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StudyProgress<'a> {
    /// The step.
    pub stage: &'a str,
    /// Units done.
    pub done: usize,
    /// Units in all.
    pub total: usize,
    /// What a unit is (`prompts`, `steps`).
    pub unit: &'a str,
}

/// What [`run`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct StudyOutcome {
    /// The HTML page.
    pub index_html: PathBuf,
    /// The verdict sentence (also on the page and in `summary.json`).
    pub verdict: String,
    /// Wall-clock seconds.
    pub elapsed_s: f64,
    /// Peak resident memory of the process in bytes, where the OS tells (Linux: `VmHWM`).
    pub peak_rss_bytes: Option<u64>,
}

/// The progress callback of the study's stages.
pub type OnProgress<'a> = dyn FnMut(StudyProgress<'_>) -> ControlFlow<()> + 'a;

/// Runs the study (module docs) and writes the report into `params.out`.
///
/// # Errors
/// [`ReportError::InvalidInput`] for bad settings or an `out` that holds something other than a
/// study; a model that is not a language model or has no tokenizer; [`ReportError::Interrupted`]
/// when `progress` breaks (the previous report stays whole); model, analysis and write errors.
pub fn run(params: &LmStudyParams, progress: &mut OnProgress<'_>) -> Result<StudyOutcome> {
    params.check()?;
    let start = Instant::now();
    let target = params.out.clone();
    let staging = crate::staging::prepare(&target)?;
    let built = build(params, &staging, progress);
    let verdict = match built {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    let elapsed_s = start.elapsed().as_secs_f64();
    let peak_rss_bytes = peak_rss_bytes();
    let timings = files::Timings {
        elapsed_s,
        peak_rss_bytes,
        stages: verdict.1,
    };
    if let Err(e) = hyperlens_io::write_json(&staging.join(files::TIMINGS_FILE), &timings) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e.into());
    }
    crate::staging::swap(&staging, &target)?;
    Ok(StudyOutcome {
        index_html: target.join("index.html"),
        verdict: verdict.0,
        elapsed_s,
        peak_rss_bytes,
    })
}

/// Measures, draws and writes the report into `dir` (the staging directory); returns the
/// verdict sentence and the seconds of each stage.
fn build(
    params: &LmStudyParams,
    dir: &std::path::Path,
    progress: &mut OnProgress<'_>,
) -> Result<(String, Vec<files::StageTime>)> {
    for sub in ["figures", "tables", "prompts"] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).map_err(|source| ReportError::Io { path: d, source })?;
    }
    let work = dir.join(".work");
    std::fs::create_dir_all(&work).map_err(|source| ReportError::Io {
        path: work.clone(),
        source,
    })?;
    let mut times = Vec::new();
    let measured = measure::measure(params, dir, &work, progress, &mut times)?;
    let t = Instant::now();
    let verdicts = verdict::Verdicts::of(&measured);
    let figs = figures::figures(&measured, &verdicts, dir)?;
    let doc = page::document(&measured, &verdicts, &figs, params);
    files::write(&measured, &verdicts, &figs, &doc, params, dir)?;
    times.push(files::StageTime {
        stage: "figures and page".into(),
        seconds: t.elapsed().as_secs_f64(),
    });
    std::fs::remove_dir_all(&work).map_err(|source| ReportError::Io { path: work, source })?;
    Ok((verdicts.sentence.clone(), times))
}

/// The process's peak resident set size (`VmHWM` of `/proc/self/status`), where the OS has it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests;
