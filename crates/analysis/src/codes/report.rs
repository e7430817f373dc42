//! The full latent-code analysis of a pair of code sets (in-distribution train set, OOD test set):
//! per layer and on all layers concatenated, PCA, rule decoding, k-means clustering and mean-code
//! similarity (`docs/spec/latent-codes.md`, analyses 1-5), collected in a [`LatentReport`] that writes
//! the tables users load (`decoding.csv`, `pca.csv`, `pca.npz`, `clusters.csv`,
//! `similarity.csv`, `confusion.csv`, `summary.json`).
//!
//! Which set each analysis sees: decoding always trains on the train set and tests on the test
//! set; the unsupervised analyses (PCA, clustering, similarity) run on one set chosen by
//! [`LatentAnalysisParams::unsupervised_on`], the test (OOD) set by default, since the question is
//! whether the code is structured by rule on compositions the model never saw.

use std::fmt;

use std::ops::ControlFlow;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use ndarray::{Array1, Array2};
use rayon::prelude::*;
use serde::Serialize;

use super::CodeSet;
use crate::cluster::{cluster_against_labels, ClusterReport, KMeansParams};
use crate::decode::{decode, DecodeParams, DecodeResult, LogisticParams};
use crate::error::{AnalysisError, Result};
use crate::pca::Pca;
use crate::similarity::{mean_code_similarity, MeanCodeSimilarity};

/// Which features an analysis row uses: one layer's codes, or all layers concatenated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub enum LayerSel {
    /// The codes of one layer, `[H*Q*K]` features.
    Layer(usize),
    /// All layers concatenated, `[L*H*Q*K]` features.
    All,
}

impl LayerSel {
    /// The layer index for [`CodeSet::features`] (`None` for all layers).
    pub fn index(self) -> Option<usize> {
        match self {
            Self::Layer(l) => Some(l),
            Self::All => None,
        }
    }

    /// The value of the integer `layer` column of the tables: the layer index, or
    /// [`ALL_LAYERS_INDEX`] for all layers concatenated (whose rows also have `all_layers` true).
    pub fn table_index(self) -> i64 {
        match self {
            Self::Layer(l) => i64::try_from(l).unwrap_or(i64::MAX),
            Self::All => ALL_LAYERS_INDEX,
        }
    }
}

/// The `layer` value of the rows for all layers concatenated. The tables keep `layer` an integer
/// column, so that numpy and pandas read it as one, and mark these rows with a boolean column
/// `all_layers` (`true` only on them; `-1` alone would read as the last layer in numpy indexing).
pub const ALL_LAYERS_INDEX: i64 = -1;

impl fmt::Display for LayerSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Layer(l) => write!(f, "{l}"),
            Self::All => write!(f, "all"),
        }
    }
}

impl From<LayerSel> for String {
    fn from(l: LayerSel) -> String {
        l.to_string()
    }
}

/// One of the two code sets of an analysis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CodeSplit {
    /// The training (in-distribution) set.
    Train,
    /// The test (OOD) set.
    Test,
}

impl fmt::Display for CodeSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Train => "train",
            Self::Test => "test",
        })
    }
}

impl FromStr for CodeSplit {
    type Err = AnalysisError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "train" => Ok(Self::Train),
            "test" => Ok(Self::Test),
            other => Err(AnalysisError::InvalidInput(format!(
                "unknown code set `{other}` (expected `train` or `test`)"
            ))),
        }
    }
}

/// Hyperparameters of [`analyze_pair`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatentAnalysisParams {
    /// Seed of the shuffled-label control, k-means initialisation and silhouette subsample.
    pub seed: u64,
    /// PCA components kept for the projections (capped at the number of features).
    pub n_components: usize,
    /// The decoding probe (scikit-learn's LogisticRegression defaults).
    pub logistic: LogisticParams,
    /// Whether to run the shuffled-label control of the decoding.
    pub shuffled_control: bool,
    /// k-means++ restarts per clustering.
    pub kmeans_runs: usize,
    /// Maximum Lloyd iterations per k-means run.
    pub kmeans_max_iterations: u64,
    /// Largest number of points the silhouette scores use (seeded subsample above it).
    pub silhouette_max_points: usize,
    /// The set PCA, clustering and similarity run on.
    pub unsupervised_on: CodeSplit,
}

impl Default for LatentAnalysisParams {
    fn default() -> Self {
        Self {
            seed: 0,
            n_components: 2,
            logistic: LogisticParams::default(),
            shuffled_control: true,
            kmeans_runs: 3,
            kmeans_max_iterations: 300,
            silhouette_max_points: 5_000,
            unsupervised_on: CodeSplit::Test,
        }
    }
}

impl LatentAnalysisParams {
    /// Checks the hyperparameters on their own.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] naming the bad field.
    pub fn check(&self) -> Result<()> {
        if self.n_components == 0 {
            return Err(AnalysisError::InvalidInput(
                "n_components must be >= 1".into(),
            ));
        }
        self.logistic.check()?;
        self.kmeans_params(2).check()
    }

    fn kmeans_params(&self, k: usize) -> KMeansParams {
        KMeansParams {
            n_clusters: k,
            seed: self.seed,
            n_runs: self.kmeans_runs,
            max_iterations: self.kmeans_max_iterations,
            tolerance: 1e-4,
            silhouette_max_points: self.silhouette_max_points,
        }
    }
}

/// The stages of [`analyze_pair`], reported to its progress callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// PCA of the unsupervised set.
    Pca,
    /// Logistic probe train -> test (and its shuffled control).
    Decoding,
    /// k-means and the ARI / NMI / silhouette scores.
    Clustering,
    /// Mean-code cosine similarity.
    Similarity,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pca => "pca",
            Self::Decoding => "decoding",
            Self::Clustering => "clustering",
            Self::Similarity => "similarity",
        })
    }
}

/// Progress of [`analyze_pair`]: `done` of `total` steps finished; `stage` / `layer` is the step
/// about to run (`None` once everything is done).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The step about to run, if any.
    pub next: Option<(Stage, LayerSel)>,
    /// Steps finished.
    pub done: usize,
    /// Steps in all: 4 per layer plus 4 for all layers.
    pub total: usize,
}

/// Everything computed for one [`LayerSel`].
#[derive(Debug, Clone, PartialEq)]
pub struct LayerAnalysis {
    /// Which features.
    pub layer: LayerSel,
    /// PCA fitted on the unsupervised set.
    pub pca: Pca,
    /// That set projected on the kept components. # Shapes: `[N_u, n_components]`.
    pub projection: Array2<f64>,
    /// Train -> test decoding of the labels.
    pub decoding: DecodeResult,
    /// k-means scores on the unsupervised set (None if it has fewer than 2 distinct labels).
    pub clusters: Option<ClusterReport>,
    /// Mean-code similarity on the unsupervised set, over the union of train and test labels.
    pub similarity: MeanCodeSimilarity,
    /// Wall-clock seconds of the four stages (PCA, decoding, clustering, similarity).
    pub seconds: [f64; 4],
}

/// The result of [`analyze_pair`].
#[derive(Debug, Clone, PartialEq)]
pub struct LatentReport {
    /// The hyperparameters used.
    pub params: LatentAnalysisParams,
    /// Source of the train set (file path).
    pub train_source: String,
    /// Source of the test set (file path).
    pub test_source: String,
    /// Problems in the train set.
    pub n_train: usize,
    /// Problems in the test set.
    pub n_test: usize,
    /// Code axes (L, H, Q, K).
    pub code_dims: (usize, usize, usize, usize),
    /// Union of the train and test labels, sorted.
    pub labels: Vec<i64>,
    /// The model's accuracy on the train set (from its `correct` array), if stored.
    pub train_model_accuracy: Option<f64>,
    /// The model's accuracy on the test set, if stored.
    pub test_model_accuracy: Option<f64>,
    /// Labels of the unsupervised set (for the PCA scatter). # Shapes: `[N_u]`.
    pub unsupervised_label: Array1<i64>,
    /// Targets of the unsupervised set, if stored. # Shapes: `[N_u]`.
    pub unsupervised_target: Option<Array1<i64>>,
    /// Whether the model was correct on the unsupervised set, if stored. # Shapes: `[N_u]`.
    pub unsupervised_correct: Option<Array1<bool>>,
    /// One entry per layer, then one for all layers.
    pub layers: Vec<LayerAnalysis>,
    /// Wall-clock seconds of the analysis (not in the tables: see [`LatentReport::timings`]).
    pub elapsed_s: f64,
}

/// Progress events from the worker threads of [`analyze_pair`].
enum Event {
    Start(Stage, LayerSel),
    Finished,
}

/// What every selection of [`analyze_pair`] shares.
struct SelectionJob<'a> {
    train: &'a CodeSet,
    test: &'a CodeSet,
    params: &'a LatentAnalysisParams,
    labels: &'a [i64],
    n_unsup_labels: usize,
}

impl SelectionJob<'_> {
    /// PCA, decoding, clustering and similarity of one selection, reporting each stage.
    fn run(&self, sel: LayerSel, report: &dyn Fn(Event) -> Result<()>) -> Result<LayerAnalysis> {
        let params = self.params;
        let train_x = self.train.features(sel.index())?;
        let test_x = self.test.features(sel.index())?;
        let (unsup, unsup_x) = match params.unsupervised_on {
            CodeSplit::Train => (self.train, &train_x),
            CodeSplit::Test => (self.test, &test_x),
        };
        let context = |e: AnalysisError, stage: Stage| match e {
            AnalysisError::InvalidInput(m) => {
                AnalysisError::InvalidInput(format!("{stage} of layer {sel}: {m}"))
            }
            AnalysisError::Numerical(m) => {
                AnalysisError::Numerical(format!("{stage} of layer {sel}: {m}"))
            }
            other => other,
        };
        let mut seconds = [0.0; 4];

        report(Event::Start(Stage::Pca, sel))?;
        let t = Instant::now();
        let k = params.n_components.min(unsup_x.ncols());
        let pca = Pca::params(k)
            .fit(unsup_x.view())
            .map_err(|e| context(e, Stage::Pca))?;
        let projection = pca.transform(unsup_x.view())?;
        seconds[0] = t.elapsed().as_secs_f64();
        report(Event::Finished)?;

        report(Event::Start(Stage::Decoding, sel))?;
        let t = Instant::now();
        let decode_params = DecodeParams {
            logistic: params.logistic,
            shuffled_control: params.shuffled_control,
            seed: params.seed,
        };
        let decoding = decode(
            train_x.view(),
            self.train.label().view(),
            test_x.view(),
            self.test.label().view(),
            &decode_params,
        )
        .map_err(|e| context(e, Stage::Decoding))?;
        seconds[1] = t.elapsed().as_secs_f64();
        report(Event::Finished)?;

        report(Event::Start(Stage::Clustering, sel))?;
        let t = Instant::now();
        let clusters = if self.n_unsup_labels >= 2 {
            Some(
                cluster_against_labels(
                    unsup_x.view(),
                    unsup.label().view(),
                    &params.kmeans_params(self.n_unsup_labels),
                )
                .map_err(|e| context(e, Stage::Clustering))?,
            )
        } else {
            None
        };
        seconds[2] = t.elapsed().as_secs_f64();
        report(Event::Finished)?;

        report(Event::Start(Stage::Similarity, sel))?;
        let t = Instant::now();
        let similarity =
            mean_code_similarity(unsup_x.view(), unsup.label().view(), Some(self.labels))
                .map_err(|e| context(e, Stage::Similarity))?;
        seconds[3] = t.elapsed().as_secs_f64();
        report(Event::Finished)?;

        Ok(LayerAnalysis {
            layer: sel,
            pca,
            projection,
            decoding,
            clusters,
            similarity,
            seconds,
        })
    }
}

/// Analyses a pair of code sets: for every layer and for all layers concatenated, PCA, rule
/// decoding train -> test (with baseline, shuffled control, balanced accuracy, confusion),
/// k-means against the labels and mean-code cosine similarity (`docs/spec/latent-codes.md`).
///
/// Selections (layers and `all`) are analysed concurrently on rayon's thread pool
/// (`RAYON_NUM_THREADS`), and so are each decoding's shuffled control, the k-means restarts and the
/// silhouette's rows; results do not depend on the number of threads. `progress` is called on the
/// calling thread before every step and once at the end; its `ControlFlow::Break` stops the work
/// (every selection stops at its next step).
///
/// # Shapes
/// Both sets hold codes `[N, L, H, Q, K]` with the same (L, H, Q, K).
///
/// # Errors
/// [`AnalysisError::Shape`] if the code axes differ; the errors of the analyses (e.g.
/// [`AnalysisError::InvalidInput`] if the train set has a single label);
/// [`AnalysisError::Interrupted`] when `progress` breaks.
pub fn analyze_pair(
    train: &CodeSet,
    test: &CodeSet,
    params: &LatentAnalysisParams,
    progress: &mut dyn FnMut(&Progress) -> ControlFlow<()>,
) -> Result<LatentReport> {
    params.check()?;
    let start = Instant::now();
    if train.code_dims() != test.code_dims() {
        return Err(AnalysisError::Shape(format!(
            "train codes {} have (L, H, Q, K) = {:?} but test codes {} have {:?}",
            train.source(),
            train.code_dims(),
            test.source(),
            test.code_dims()
        )));
    }
    let unsup = match params.unsupervised_on {
        CodeSplit::Train => train,
        CodeSplit::Test => test,
    };
    let mut labels: Vec<i64> = train
        .label()
        .iter()
        .chain(test.label().iter())
        .copied()
        .collect();
    labels.sort_unstable();
    labels.dedup();
    let n_unsup_labels = {
        let mut v = unsup.label().to_vec();
        v.sort_unstable();
        v.dedup();
        v.len()
    };

    let mut selections: Vec<LayerSel> = (0..train.n_layers()).map(LayerSel::Layer).collect();
    selections.push(LayerSel::All);
    let total = selections.len() * 4;
    let mut done = 0;
    let job = SelectionJob {
        train,
        test,
        params,
        labels: &labels,
        n_unsup_labels,
    };
    // independent selections run on rayon's threads (and so do each decoding's shuffled control,
    // the k-means restarts and the silhouette rows); progress events come back to this thread,
    // which calls `progress`
    let (tx, rx) = mpsc::channel::<Event>();
    let stopped = AtomicBool::new(false);
    let mut results: Vec<Option<Result<LayerAnalysis>>> = Vec::new();
    std::thread::scope(|scope| {
        let (job, selections, stopped) = (&job, &selections, &stopped);
        let worker = scope.spawn(move || -> Vec<Option<Result<LayerAnalysis>>> {
            selections
                .par_iter()
                .map(|&sel| {
                    Some(job.run(sel, &|e| {
                        if stopped.load(Ordering::Relaxed) {
                            return Err(AnalysisError::Interrupted);
                        }
                        let _ = tx.send(e);
                        Ok(())
                    }))
                })
                .collect()
        });
        for event in rx {
            match event {
                Event::Start(stage, sel) if !stopped.load(Ordering::Relaxed) => {
                    let step = progress(&Progress {
                        next: Some((stage, sel)),
                        done,
                        total,
                    });
                    if step.is_break() {
                        stopped.store(true, Ordering::Relaxed);
                    }
                }
                Event::Start(..) => {}
                Event::Finished => done += 1,
            }
        }
        results = worker.join().unwrap_or_else(|_| {
            vec![Some(Err(AnalysisError::Numerical(
                "an analysis worker thread panicked".into(),
            )))]
        });
    });
    if stopped.into_inner() {
        return Err(AnalysisError::Interrupted);
    }
    // the first error in selection order wins; every selection must have a result otherwise
    let mut layers = Vec::with_capacity(selections.len());
    let mut missing = false;
    for r in results {
        match r {
            Some(Ok(a)) => layers.push(a),
            Some(Err(e)) => return Err(e),
            None => missing = true,
        }
    }
    if missing || layers.len() != selections.len() {
        return Err(AnalysisError::Numerical(
            "an analysis step did not complete".into(),
        ));
    }
    // the last call says the work is done: there is nothing left to stop
    let _ = progress(&Progress {
        next: None,
        done,
        total,
    });
    Ok(LatentReport {
        params: *params,
        train_source: train.source().to_string(),
        test_source: test.source().to_string(),
        n_train: train.n_samples(),
        n_test: test.n_samples(),
        code_dims: train.code_dims(),
        labels,
        train_model_accuracy: train.model_accuracy(),
        test_model_accuracy: test.model_accuracy(),
        unsupervised_label: unsup.label().clone(),
        unsupervised_target: unsup.target().cloned(),
        unsupervised_correct: unsup.correct().cloned(),
        layers,
        elapsed_s: start.elapsed().as_secs_f64(),
    })
}
