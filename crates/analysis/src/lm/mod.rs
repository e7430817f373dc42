//! The analyses of a language model's code files (issue 47, items 5 and 6): the model's
//! behaviour per factor combination and the combinations kept ([`mod@behaviour`]), the decoding of a
//! factor seen -> held-out per layer and on all layers with its controls ([`decoding`]: shuffled
//! labels, query-key distances only, shuffled-weights codes, residual stream) and bootstrap
//! intervals ([`bootstrap`]), and PCA / k-means of the codes ([`mod@structure`]). [`analyze`] runs
//! them all from the files and [`LmAnalysis::write`] writes the tables `hyperlens analyze
//! --lm-codes` writes.
//!
//! The input is the file of [`hyperlens_io::keys::lm_codes`] with its sidecar
//! [`hyperlens_io::sidecars::LmCodesSidecar`] beside it, read as an [`LmCodeSet`].

pub mod behaviour;
pub mod bootstrap;
pub mod decoding;
pub mod set;
pub mod structure;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use behaviour::{behaviour, Combination, LmBehaviour};
pub use decoding::{decode_factor, LmDecoding, LmDecodingParams, LmDecodingRow, ProbeScore};
pub use set::LmCodeSet;
pub use structure::{structure, LmProjection, LmStructureParams, LmStructureRow};

use crate::codes::report::CodeSplit;
use crate::decode::LogisticParams;
use crate::error::{AnalysisError, Result};
use crate::table::Table;

/// Settings of [`analyze`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LmAnalysisParams {
    /// The code file (its sidecar `codes.json` beside it).
    pub codes: PathBuf,
    /// The shuffled-weights code file of the same prompts, if any.
    pub shuffled_codes: Option<PathBuf>,
    /// The factor to decode (default: the sidecar's `label_factor`).
    pub factor: Option<String>,
    /// Keep only the factor combinations the model answers with at least this accuracy.
    pub min_accuracy: Option<f64>,
    /// The model layers to analyse (numbers from the sidecar's `layers`; default all).
    pub layers: Option<Vec<usize>>,
    /// Seed of the label permutation, the bootstrap and k-means.
    pub seed: u64,
    /// Bootstrap resamples of the test prompts.
    pub n_bootstrap: usize,
    /// Confidence level of the intervals.
    pub ci_level: f64,
    /// The probe's hyperparameters (scikit-learn's `LogisticRegression` defaults).
    pub logistic: LogisticParams,
    /// Principal components reported in the structure table.
    pub n_components: usize,
    /// k-means++ restarts.
    pub kmeans_runs: usize,
    /// The split PCA and k-means run on (default the held-out one).
    pub unsupervised_on: CodeSplit,
}

impl LmAnalysisParams {
    /// The defaults for a code file: the label factor, every layer, no behaviour filter, seed 0,
    /// 1000 bootstrap resamples at 95%, `C = 1`, 3 principal components, 3 k-means restarts, PCA
    /// and k-means on the held-out split.
    pub fn new(codes: impl Into<PathBuf>) -> Self {
        Self {
            codes: codes.into(),
            shuffled_codes: None,
            factor: None,
            min_accuracy: None,
            layers: None,
            seed: 0,
            n_bootstrap: 1000,
            ci_level: 0.95,
            logistic: LogisticParams::default(),
            n_components: 3,
            kmeans_runs: 3,
            unsupervised_on: CodeSplit::Test,
        }
    }

    /// Checks the settings on their own.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] naming the bad field.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(AnalysisError::InvalidInput(m));
        if let Some(t) = self.min_accuracy {
            if !(0.0..=1.0).contains(&t) {
                return bad(format!("min_accuracy must be in [0, 1], got {t}"));
            }
        }
        if self.n_bootstrap == 0 {
            return bad("n_bootstrap must be at least 1".into());
        }
        if !(self.ci_level > 0.0 && self.ci_level < 1.0) {
            return bad(format!("ci_level must be in (0, 1), got {}", self.ci_level));
        }
        if self.n_components == 0 {
            return bad("n_components must be at least 1".into());
        }
        if self.kmeans_runs == 0 {
            return bad("kmeans_runs must be at least 1".into());
        }
        if let Some(layers) = &self.layers {
            if layers.is_empty() {
                return bad("layers: give at least one layer".into());
            }
            let mut sorted = layers.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != layers.len() {
                return bad(format!("layers: {layers:?} lists a layer twice"));
            }
        }
        if matches!(&self.factor, Some(f) if f.is_empty()) {
            return bad("factor: an empty name".into());
        }
        self.logistic.check()
    }
}

/// Progress of [`analyze`]: `done` of `total` steps finished, the next one in `stage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LmProgress {
    /// `decoding` or `structure` (`done` once finished).
    pub stage: &'static str,
    /// Steps finished.
    pub done: usize,
    /// Steps in all (one per decoding row, one for the structure).
    pub total: usize,
}

/// Everything [`analyze`] computes.
#[derive(Debug, Clone, PartialEq)]
pub struct LmAnalysis {
    /// The settings used.
    pub params: LmAnalysisParams,
    /// The factor decoded.
    pub factor: String,
    /// The code set's sidecar facts: form, model, the selected model layers.
    pub form: String,
    /// The model's checkpoint, from the sidecar.
    pub model: String,
    /// The selected model layers.
    pub layers: Vec<usize>,
    /// Prompts in the file.
    pub n_prompts: usize,
    /// Behaviour per factor combination, and the kept prompts.
    pub behaviour: LmBehaviour,
    /// The decoding and its controls.
    pub decoding: LmDecoding,
    /// PCA and k-means per layer.
    pub structure: Vec<LmStructureRow>,
    /// The PCA projections behind `structure`.
    pub projections: Vec<LmProjection>,
    /// The prompt indices (the `prompt` array) of the rows of the projections. # Shapes: `[N_u]`.
    pub structure_prompts: Vec<i64>,
    /// The factor's value index of those rows. # Shapes: `[N_u]`.
    pub structure_labels: Vec<i64>,
}

/// `summary.json` of `hyperlens analyze --lm-codes`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LmSummary {
    /// The code file.
    pub codes: String,
    /// The shuffled-weights code file, if any.
    pub shuffled_codes: Option<String>,
    /// The model, from the sidecar.
    pub model: String,
    /// The form of the code.
    pub form: String,
    /// The factor decoded and its values.
    pub factor: String,
    /// The analysed model layers.
    pub layers: Vec<usize>,
    /// Prompts in the file.
    pub n_prompts: usize,
    /// Factor combinations in the file.
    pub n_combinations: usize,
    /// Combinations dropped by the behaviour filter.
    pub n_dropped_combinations: usize,
    /// Prompts dropped by the behaviour filter.
    pub n_dropped_prompts: usize,
    /// How the prompts were chosen, in words.
    pub behaviour_note: String,
    /// The decoding (every probe and interval).
    pub decoding: LmDecoding,
    /// PCA and k-means per layer.
    pub structure: Vec<LmStructureRow>,
    /// The settings.
    pub params: LmAnalysisParams,
}

/// Reads the code file (and the shuffled-weights file) of `params` and runs
/// [`analyze_sets`].
///
/// # Errors
/// Those of [`LmCodeSet::read`] (naming the file and array) and of [`analyze_sets`].
pub fn analyze(
    params: &LmAnalysisParams,
    progress: &mut dyn FnMut(&LmProgress) -> ControlFlow<()>,
) -> Result<LmAnalysis> {
    params.check()?;
    let set = LmCodeSet::read(&params.codes)?;
    let shuffled = params
        .shuffled_codes
        .as_ref()
        .map(LmCodeSet::read)
        .transpose()?;
    analyze_sets(&set, shuffled.as_ref(), params, progress)
}

/// The behaviour filter, the decoding with its controls and PCA / k-means of `set` (the paths
/// in `params` are only recorded).
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for bad settings, an unknown factor (listing the file's
/// factors) or layer (listing the file's layers), no kept training or test rows, a single
/// training class, a shuffled-weights file of other prompts; [`AnalysisError::Interrupted`]
/// when `progress` breaks; the probe's, PCA's and k-means' errors.
pub fn analyze_sets(
    set: &LmCodeSet,
    shuffled: Option<&LmCodeSet>,
    params: &LmAnalysisParams,
    progress: &mut dyn FnMut(&LmProgress) -> ControlFlow<()>,
) -> Result<LmAnalysis> {
    params.check()?;
    let side = set.sidecar();
    let factor = params
        .factor
        .clone()
        .unwrap_or_else(|| side.label_factor.clone());
    let f = set.factor_index(&factor)?;
    let layer_axes: Vec<usize> = match &params.layers {
        None => (0..set.n_layers()).collect(),
        Some(layers) => layers
            .iter()
            .map(|l| {
                side.layers.iter().position(|x| x == l).ok_or_else(|| {
                    AnalysisError::InvalidInput(format!(
                        "{}: no layer {l} in the file; its layers are {:?}",
                        set.source(),
                        side.layers
                    ))
                })
            })
            .collect::<Result<_>>()?,
    };
    let behaviour = behaviour::behaviour(set, params.min_accuracy)?;
    let total = layer_axes.len() + 2;
    let dparams = LmDecodingParams {
        factor: factor.clone(),
        layer_axes: layer_axes.clone(),
        logistic: params.logistic,
        seed: params.seed,
        n_bootstrap: params.n_bootstrap,
        ci_level: params.ci_level,
    };
    let decoding = decode_factor(set, shuffled, &behaviour.kept, &dparams, &mut |done, _| {
        progress(&LmProgress {
            stage: "decoding",
            done,
            total,
        })
    })?;
    if progress(&LmProgress {
        stage: "structure",
        done: total - 1,
        total,
    })
    .is_break()
    {
        return Err(AnalysisError::Interrupted);
    }
    let want_split = match params.unsupervised_on {
        CodeSplit::Train => 0,
        CodeSplit::Test => 1,
    };
    let rows: Vec<usize> = (0..set.n_prompts())
        .filter(|&i| {
            behaviour.kept[i] && set.split()[i] == want_split && set.factors()[[i, f]] >= 0
        })
        .collect();
    let labels: Vec<i64> = rows.iter().map(|&i| set.factors()[[i, f]]).collect();
    let (structure, projections) = structure::structure(
        set,
        &rows,
        &labels,
        &layer_axes,
        &LmStructureParams {
            n_components: params.n_components,
            on: params.unsupervised_on,
            kmeans_runs: params.kmeans_runs,
            seed: params.seed,
        },
    )?;
    // The finished state is only reported; stopping now would discard a finished result.
    let _ = progress(&LmProgress {
        stage: "done",
        done: total,
        total,
    });
    Ok(LmAnalysis {
        params: params.clone(),
        factor,
        form: side.form.clone(),
        model: side.model.clone(),
        layers: layer_axes.iter().map(|&l| side.layers[l]).collect(),
        n_prompts: set.n_prompts(),
        behaviour,
        decoding,
        structure,
        projections,
        structure_prompts: rows.iter().map(|&i| set.prompt()[i]).collect(),
        structure_labels: labels,
    })
}

impl LmAnalysis {
    /// The tables, by file name: `decoding.csv`, `behaviour.csv`, `structure.csv`.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if a factor name or value would need quoting in CSV.
    pub fn tables(&self) -> Result<Vec<(&'static str, Table)>> {
        Ok(vec![
            ("decoding.csv", self.decoding.table()?),
            ("behaviour.csv", self.behaviour.table()?),
            (
                "structure.csv",
                structure::structure_table(&self.structure, self.params.n_components)?,
            ),
        ])
    }

    /// The record of `summary.json`.
    pub fn summary(&self) -> LmSummary {
        LmSummary {
            codes: self.params.codes.display().to_string(),
            shuffled_codes: self
                .params
                .shuffled_codes
                .as_ref()
                .map(|p| p.display().to_string()),
            model: self.model.clone(),
            form: self.form.clone(),
            factor: self.factor.clone(),
            layers: self.layers.clone(),
            n_prompts: self.n_prompts,
            n_combinations: self.behaviour.combinations.len(),
            n_dropped_combinations: self.behaviour.n_dropped_combinations,
            n_dropped_prompts: self.behaviour.n_dropped_prompts,
            behaviour_note: self.behaviour.note.clone(),
            decoding: self.decoding.clone(),
            structure: self.structure.clone(),
            params: self.params.clone(),
        }
    }

    /// Writes the tables and `summary.json` into `dir` (created if missing), each atomically;
    /// returns the paths written.
    ///
    /// # Errors
    /// [`AnalysisError::Io`] if `dir` cannot be created; [`AnalysisError::File`] naming the path
    /// if a write fails; the errors of [`LmAnalysis::tables`].
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let mut written = crate::table::write_tables(dir, self.tables()?)?;
        let path = dir.join("summary.json");
        hyperlens_io::write_json(&path, &self.summary())?;
        written.push(path);
        Ok(written)
    }
}

#[cfg(test)]
mod tests;
