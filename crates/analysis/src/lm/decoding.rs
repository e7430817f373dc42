//! Decoding a factor from a language model's codes, trained on the seen combinations (`split` 0)
//! and tested on the held-out ones (`split` 1), per layer and on the selected layers together:
//! the "decoding ID -> OOD" test of Schug et al. (2025, "Attention as a hypernetwork", Figure 5),
//! with the controls a reviewer asks for, each on the same rows:
//!
//! - **shuffled labels**: the same codes, the training labels permuted (seeded);
//! - **distance baseline**: only the query-key position distances `query_pos[q] - key_pos[k]`
//!   (Q*K numbers, no code): a factor that moves the sites is decodable from the sites alone;
//! - **shuffled weights**: the codes of the same prompts from the model with its weights shuffled
//!   within each tensor (a second code file);
//! - **residual stream**: `resid` at the query sites, an upper bound of what the layer holds.
//!
//! Every probe is the crate's [`LogisticProbe`] (standardised features, scikit-learn's
//! `LogisticRegression(C=1)` defaults, as the SRAVEN analysis). Accuracy is the fraction of test
//! prompts decoded right, with a percentile bootstrap 95% interval over the test prompts
//! ([`super::bootstrap`]); chance is the test frequency of the training majority class. A class
//! that occurs only in the test rows can never be predicted: its prompts count as errors, and
//! [`LmDecoding::n_unseen_test`] says how many there are.

use std::collections::BTreeMap;

use ndarray::{Array1, Array2};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::Serialize;

use super::bootstrap::bootstrap_accuracy_ci;
use super::set::LmCodeSet;
use crate::decode::{LogisticParams, LogisticProbe};
use crate::error::{AnalysisError, Result};
use crate::table::{Column, Table};

/// Settings of [`decode_factor`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LmDecodingParams {
    /// The factor to decode (a name from the sidecar's factors).
    pub factor: String,
    /// The layer axes to decode from, as indices into the file's layer axis (the caller maps
    /// model layer numbers to them); each gets a row, and one more row concatenates them all.
    pub layer_axes: Vec<usize>,
    /// The probe's hyperparameters.
    pub logistic: LogisticParams,
    /// Seed of the label permutation and of the bootstrap resamples.
    pub seed: u64,
    /// Bootstrap resamples of the test prompts.
    pub n_bootstrap: usize,
    /// Confidence level of the intervals.
    pub ci_level: f64,
}

/// One probe's held-out result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ProbeScore {
    /// Fraction of the test prompts decoded right.
    pub accuracy: f64,
    /// Lower end of the bootstrap interval.
    pub ci_low: f64,
    /// Upper end of the bootstrap interval.
    pub ci_high: f64,
    /// Accuracy on the training prompts (how well the probe fits).
    pub train_accuracy: f64,
    /// Number of features.
    pub n_features: usize,
    /// Whether the L-BFGS fit met a stopping rule.
    pub converged: bool,
}

/// One row of the decoding: a layer (or the selected layers together) and its probes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LmDecodingRow {
    /// The model layer (the sidecar's layer number); None for the selected layers together.
    pub layer: Option<usize>,
    /// The probe on the codes.
    pub codes: ProbeScore,
    /// The probe on the codes with the training labels permuted.
    pub shuffled_labels: ProbeScore,
    /// The probe on the shuffled-weights codes of the same prompts (when given).
    pub shuffled_weights: Option<ProbeScore>,
    /// The probe on the residual stream at the query sites (when the file holds it).
    pub resid: Option<ProbeScore>,
}

/// The decoding of one factor, seen -> held-out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LmDecoding {
    /// The factor decoded.
    pub factor: String,
    /// Its values (class `i` is `values[i]`).
    pub values: Vec<String>,
    /// Training prompts (kept, labelled, split 0).
    pub n_train: usize,
    /// Test prompts (kept, labelled, split 1).
    pub n_test: usize,
    /// Kept prompts without a value of the factor (index -1), left out.
    pub n_unlabelled: usize,
    /// Test prompts whose class never occurs in training (always errors).
    pub n_unseen_test: usize,
    /// The classes that occur only in the test rows.
    pub unseen_classes: Vec<String>,
    /// The most frequent training class (ties: the smaller index).
    pub majority_class: String,
    /// Chance: the test frequency of `majority_class`.
    pub chance: f64,
    /// The largest test frequency of any class: no prediction made without the features scores
    /// above it in expectation (a probe that guesses can beat `chance` up to here).
    pub chance_max: f64,
    /// The distance baseline (one probe, no layer).
    pub distance: ProbeScore,
    /// One row per selected layer, then the row of the layers together.
    pub rows: Vec<LmDecodingRow>,
    /// Bootstrap resamples behind every interval.
    pub n_bootstrap: usize,
    /// Confidence level of every interval.
    pub ci_level: f64,
}

/// The rows and labels one decoding uses.
struct Rows {
    train: Vec<usize>,
    test: Vec<usize>,
    train_y: Array1<i64>,
    test_y: Array1<i64>,
    n_unlabelled: usize,
}

fn select_rows(set: &LmCodeSet, factor: usize, kept: &[bool]) -> Result<Rows> {
    let name = &set.sidecar().factors[factor].name;
    let mut rows = Rows {
        train: Vec::new(),
        test: Vec::new(),
        train_y: Array1::zeros(0),
        test_y: Array1::zeros(0),
        n_unlabelled: 0,
    };
    for (i, _) in kept.iter().enumerate().filter(|(_, &k)| k) {
        if set.factors()[[i, factor]] < 0 {
            rows.n_unlabelled += 1;
        } else if set.split()[i] == 0 {
            rows.train.push(i);
        } else {
            rows.test.push(i);
        }
    }
    let src = set.source();
    if rows.train.is_empty() {
        return Err(AnalysisError::InvalidInput(format!(
            "{src}: no training rows (split 0) with a value of `{name}` among the kept prompts"
        )));
    }
    if rows.test.is_empty() {
        return Err(AnalysisError::InvalidInput(format!(
            "{src}: no test rows (split 1, the held-out combinations) with a value of `{name}` \
             among the kept prompts"
        )));
    }
    let label = |r: &[usize]| Array1::from_iter(r.iter().map(|&i| set.factors()[[i, factor]]));
    rows.train_y = label(&rows.train);
    rows.test_y = label(&rows.test);
    let mut classes = rows.train_y.to_vec();
    classes.sort_unstable();
    classes.dedup();
    if classes.len() < 2 {
        let values = &set.sidecar().factors[factor].values;
        return Err(AnalysisError::InvalidInput(format!(
            "{src}: the kept training rows hold one value of `{name}` ({}); decoding needs two",
            values[classes[0] as usize]
        )));
    }
    Ok(rows)
}

/// Fits one probe and scores it on the test rows, with its bootstrap interval.
fn score(
    train_x: &Array2<f64>,
    train_y: &Array1<i64>,
    test_x: &Array2<f64>,
    test_y: &Array1<i64>,
    params: &LmDecodingParams,
) -> Result<ProbeScore> {
    let probe = LogisticProbe::fit(train_x.view(), train_y.view(), &params.logistic)?;
    let hits: Vec<bool> = probe
        .predict(test_x.view())?
        .iter()
        .zip(test_y)
        .map(|(p, t)| p == t)
        .collect();
    let train_hits = probe
        .predict(train_x.view())?
        .iter()
        .zip(train_y)
        .filter(|(p, t)| p == t)
        .count();
    let (ci_low, ci_high) =
        bootstrap_accuracy_ci(&hits, params.n_bootstrap, params.ci_level, params.seed)?;
    Ok(ProbeScore {
        accuracy: hits.iter().filter(|&&h| h).count() as f64 / hits.len() as f64,
        ci_low,
        ci_high,
        train_accuracy: train_hits as f64 / train_y.len() as f64,
        n_features: train_x.ncols(),
        converged: probe.converged(),
    })
}

/// What one decoding job fits.
#[derive(Clone, Copy)]
enum Probe {
    Codes,
    ShuffledLabels,
    ShuffledWeights,
    Resid,
}

/// Decodes `params.factor` seen -> held-out from the codes of `set` (only its `kept` prompts),
/// per layer axis in `params.layer_axes` and on them together, with the controls of the module
/// docs. `shuffled` is the shuffled-weights code file of the same prompts, if any. `progress` is
/// called after each row with (rows done, rows in all).
///
/// # Shapes
/// `kept`: `[N]`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for an unknown factor (listing the file's factors), a layer
/// axis out of range, no kept training or test rows with a value of the factor, a single
/// training class, a shuffled file of other prompts ([`LmCodeSet::check_same_prompts`]);
/// [`AnalysisError::Interrupted`] when `progress` breaks; the probe's errors.
pub fn decode_factor(
    set: &LmCodeSet,
    shuffled: Option<&LmCodeSet>,
    kept: &[bool],
    params: &LmDecodingParams,
    progress: &mut dyn FnMut(usize, usize) -> std::ops::ControlFlow<()>,
) -> Result<LmDecoding> {
    params.logistic.check()?;
    let factor = set.factor_index(&params.factor)?;
    if kept.len() != set.n_prompts() {
        return Err(AnalysisError::Shape(format!(
            "{}: {} kept flags for {} prompts",
            set.source(),
            kept.len(),
            set.n_prompts()
        )));
    }
    if let Some(&bad) = params.layer_axes.iter().find(|&&l| l >= set.n_layers()) {
        return Err(AnalysisError::InvalidInput(format!(
            "{}: layer axis {bad} requested but the file has {} layers",
            set.source(),
            set.n_layers()
        )));
    }
    if params.layer_axes.is_empty() {
        return Err(AnalysisError::InvalidInput(
            "decoding: no layer selected".into(),
        ));
    }
    if let Some(other) = shuffled {
        set.check_same_prompts(other)?;
    }
    let rows = select_rows(set, factor, kept)?;
    let values = set.sidecar().factors[factor].values.clone();

    let mut permuted = rows.train_y.to_vec();
    permuted.shuffle(&mut ChaCha8Rng::seed_from_u64(params.seed));
    let permuted = Array1::from(permuted);

    let (train_d, test_d) = (
        set.distance_features(&rows.train),
        set.distance_features(&rows.test),
    );
    let distance = score(&train_d, &rows.train_y, &test_d, &rows.test_y, params)?;

    let mut selections: Vec<Option<usize>> = params.layer_axes.iter().map(|&l| Some(l)).collect();
    selections.push(None);
    let total = selections.len();
    let mut out_rows = Vec::with_capacity(total);
    for (done, sel) in selections.into_iter().enumerate() {
        if progress(done, total).is_break() {
            return Err(AnalysisError::Interrupted);
        }
        let axes: Vec<usize> = sel.map_or_else(|| params.layer_axes.clone(), |l| vec![l]);
        let mut jobs = vec![Probe::Codes, Probe::ShuffledLabels];
        if shuffled.is_some() {
            jobs.push(Probe::ShuffledWeights);
        }
        if set.resid().is_some() {
            jobs.push(Probe::Resid);
        }
        let codes = (
            set.code_features(&rows.train, &axes),
            set.code_features(&rows.test, &axes),
        );
        let scores: Vec<Result<ProbeScore>> = jobs
            .par_iter()
            .map(|job| match job {
                Probe::Codes => score(&codes.0, &rows.train_y, &codes.1, &rows.test_y, params),
                Probe::ShuffledLabels => score(&codes.0, &permuted, &codes.1, &rows.test_y, params),
                Probe::ShuffledWeights => {
                    let other = shuffled.ok_or_else(|| {
                        AnalysisError::InvalidInput("no shuffled-weights codes".into())
                    })?;
                    let tr = other.code_features(&rows.train, &axes);
                    let te = other.code_features(&rows.test, &axes);
                    score(&tr, &rows.train_y, &te, &rows.test_y, params)
                }
                Probe::Resid => {
                    let (Some(tr), Some(te)) = (
                        set.resid_features(&rows.train, &axes),
                        set.resid_features(&rows.test, &axes),
                    ) else {
                        return Err(AnalysisError::InvalidInput("no resid".into()));
                    };
                    score(&tr, &rows.train_y, &te, &rows.test_y, params)
                }
            })
            .collect();
        let mut scores = scores.into_iter();
        let mut next = || {
            scores
                .next()
                .unwrap_or_else(|| Err(AnalysisError::Numerical("missing probe".into())))
        };
        let codes_score = next()?;
        let shuffled_labels = next()?;
        let shuffled_weights = shuffled.is_some().then(&mut next).transpose()?;
        let resid = set.resid().is_some().then(&mut next).transpose()?;
        out_rows.push(LmDecodingRow {
            layer: sel.map(|l| set.sidecar().layers[l]),
            codes: codes_score,
            shuffled_labels,
            shuffled_weights,
            resid,
        });
    }
    if progress(total, total).is_break() {
        return Err(AnalysisError::Interrupted);
    }

    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for &c in &rows.train_y {
        *counts.entry(c).or_default() += 1;
    }
    let (mut majority, mut best) = (0, 0);
    for (&c, &n) in &counts {
        if n > best {
            (majority, best) = (c, n);
        }
    }
    let chance =
        rows.test_y.iter().filter(|&&c| c == majority).count() as f64 / rows.test_y.len() as f64;
    let mut test_counts: BTreeMap<i64, usize> = BTreeMap::new();
    for &c in &rows.test_y {
        *test_counts.entry(c).or_default() += 1;
    }
    let chance_max =
        test_counts.values().copied().max().unwrap_or(0) as f64 / rows.test_y.len() as f64;
    let unseen: Vec<i64> = {
        let mut u: Vec<i64> = rows
            .test_y
            .iter()
            .copied()
            .filter(|c| !counts.contains_key(c))
            .collect();
        u.sort_unstable();
        u.dedup();
        u
    };
    let n_unseen_test = rows
        .test_y
        .iter()
        .filter(|c| !counts.contains_key(c))
        .count();
    let name = |c: i64| values[c as usize].clone();
    Ok(LmDecoding {
        factor: params.factor.clone(),
        n_train: rows.train.len(),
        n_test: rows.test.len(),
        n_unlabelled: rows.n_unlabelled,
        n_unseen_test,
        unseen_classes: unseen.into_iter().map(name).collect(),
        majority_class: name(majority),
        chance,
        chance_max,
        distance,
        rows: out_rows,
        n_bootstrap: params.n_bootstrap,
        ci_level: params.ci_level,
        values,
    })
}

impl LmDecoding {
    /// The table `decoding.csv`: one row per layer (`layer` the model layer; the selected layers
    /// together have `layer` -1 and `all_layers` true), with `n_train`, `n_test`, `chance`,
    /// `chance_max`, then
    /// for each probe (`codes`, `shuffled_labels`, `distance`, `shuffled_weights`, `resid`) its
    /// accuracy and interval as `<probe>`, `<probe>_ci_low`, `<probe>_ci_high` (empty cells for a
    /// probe not run), and `codes_train_accuracy`. The distance baseline has no layer: its row
    /// values repeat.
    ///
    /// # Errors
    /// None in practice (columns of equal length).
    pub fn table(&self) -> Result<Table> {
        let mut t = Table::new();
        let n = self.rows.len();
        t.push(
            "layer",
            Column::Int(
                self.rows
                    .iter()
                    .map(|r| r.layer.map_or(-1, |l| l as i64))
                    .collect(),
            ),
        )?;
        t.push(
            "all_layers",
            Column::Bool(self.rows.iter().map(|r| r.layer.is_none()).collect()),
        )?;
        t.push("n_train", Column::Int(vec![self.n_train as i64; n]))?;
        t.push("n_test", Column::Int(vec![self.n_test as i64; n]))?;
        t.push("chance", Column::shortest(vec![self.chance; n]))?;
        t.push("chance_max", Column::shortest(vec![self.chance_max; n]))?;
        let probes: [(&str, Vec<Option<ProbeScore>>); 5] = [
            ("codes", self.rows.iter().map(|r| Some(r.codes)).collect()),
            (
                "shuffled_labels",
                self.rows.iter().map(|r| Some(r.shuffled_labels)).collect(),
            ),
            ("distance", vec![Some(self.distance); n]),
            (
                "shuffled_weights",
                self.rows.iter().map(|r| r.shuffled_weights).collect(),
            ),
            ("resid", self.rows.iter().map(|r| r.resid).collect()),
        ];
        for (name, scores) in probes {
            let col = |f: fn(&ProbeScore) -> f64| {
                Column::MaybeFloat(scores.iter().map(|s| s.as_ref().map(f)).collect())
            };
            t.push(name, col(|s| s.accuracy))?;
            t.push(format!("{name}_ci_low"), col(|s| s.ci_low))?;
            t.push(format!("{name}_ci_high"), col(|s| s.ci_high))?;
        }
        t.push(
            "codes_train_accuracy",
            Column::shortest(self.rows.iter().map(|r| r.codes.train_accuracy).collect()),
        )?;
        Ok(t)
    }
}
