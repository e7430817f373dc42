//! Rule decoding: a standardised multinomial logistic-regression probe trained on one set of codes
//! (in-distribution) and tested on another (OOD), with the controls that make its accuracy
//! readable: majority-class baseline, shuffled-label control, balanced accuracy and the confusion
//! matrix (`docs/spec/latent-codes.md`, analysis 2; paper Figure 5).
//!
//! The probe matches scikit-learn's `StandardScaler` + `LogisticRegression(C=1.0)` (L2, lbfgs,
//! multinomial, `tol = 1e-4`, `max_iter = 100`):
//! - features are standardised with the training set's mean and population standard deviation
//!   (ddof 0); a (near-)constant feature gets scale 1, as in scikit-learn;
//! - the model minimises scikit-learn's objective `(1/N) sum_i loss_i + 1 / (2 C N) ||W||^2` with
//!   an unpenalised intercept, by L-BFGS with scipy's stopping rules (largest gradient component
//!   `<= tol`, or no relative decrease of the objective; `crate::multinomial`'s docs).

use std::collections::BTreeMap;

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::error::{AnalysisError, Result};
use crate::multinomial;

/// Per-feature standardisation `(x - mean) / scale` fitted on a training set
/// (scikit-learn's `StandardScaler`: population standard deviation, constant features scale 1).
#[derive(Debug, Clone, PartialEq)]
pub struct Standardizer {
    mean: Array1<f64>,
    scale: Array1<f64>,
}

impl Standardizer {
    /// Fits the mean and scale of every feature of `x`.
    ///
    /// A feature whose standard deviation is below `10 * f64::EPSILON * max(1, |mean|)` (constant
    /// up to rounding) gets scale 1, so it maps to (about) 0 instead of dividing by zero.
    ///
    /// # Shapes
    /// `x`: `[N, D]`, N >= 1; mean and scale are `[D]`.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if `x` has no rows or no columns;
    /// [`AnalysisError::NonFinite`] if it holds NaN or infinity.
    pub fn fit(x: ArrayView2<'_, f64>) -> Result<Self> {
        let (n, d) = x.dim();
        if n == 0 || d == 0 {
            return Err(AnalysisError::InvalidInput(format!(
                "standardisation needs a non-empty matrix, got [{n}, {d}]"
            )));
        }
        check_finite(x, "standardisation input")?;
        // Row-major whatever the caller's layout (a copy only for another layout), so that the
        // sums run in one order and a Fortran-order matrix gives the same bits.
        let x = x.as_standard_layout();
        let mean = x
            .mean_axis(Axis(0))
            .ok_or_else(|| AnalysisError::InvalidInput("empty standardisation input".into()))?;
        let var = x.var_axis(Axis(0), 0.0);
        let scale = Array1::from_iter(mean.iter().zip(var.iter()).map(|(&m, &v)| {
            let s = v.sqrt();
            if s <= 10.0 * f64::EPSILON * m.abs().max(1.0) {
                1.0
            } else {
                s
            }
        }));
        Ok(Self { mean, scale })
    }

    /// Applies the standardisation.
    ///
    /// # Shapes
    /// `x`: `[M, D]`; returns `[M, D]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if D differs from the fit; [`AnalysisError::NonFinite`] for
    /// NaN/infinite input.
    pub fn transform(&self, x: ArrayView2<'_, f64>) -> Result<Array2<f64>> {
        if x.ncols() != self.mean.len() {
            return Err(AnalysisError::Shape(format!(
                "standardiser fitted on {} features, got {}",
                self.mean.len(),
                x.ncols()
            )));
        }
        check_finite(x, "standardisation input")?;
        // Row-major output whatever the caller's layout, for layout-independent products later.
        Ok((&x.as_standard_layout() - &self.mean) / &self.scale)
    }

    /// Per-feature means. # Shapes: `[D]`.
    pub fn mean(&self) -> &Array1<f64> {
        &self.mean
    }
    /// Per-feature scales (standard deviations, 1 for constant features). # Shapes: `[D]`.
    pub fn scale(&self) -> &Array1<f64> {
        &self.scale
    }
}

/// Hyperparameters of the logistic probe, in scikit-learn's terms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LogisticParams {
    /// Inverse L2 regularisation strength `C` (scikit-learn's default 1.0).
    pub c: f64,
    /// Maximum number of L-BFGS iterations (scikit-learn's default 100).
    pub max_iterations: u64,
    /// Gradient tolerance on the per-sample (mean) objective (scikit-learn's default 1e-4).
    pub tol: f64,
}

impl Default for LogisticParams {
    fn default() -> Self {
        Self {
            c: 1.0,
            max_iterations: 100,
            tol: 1e-4,
        }
    }
}

impl LogisticParams {
    /// Checks the hyperparameters.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] unless `c` and `tol` are positive and finite and
    /// `max_iterations >= 1`.
    pub fn check(&self) -> Result<()> {
        if !(self.c.is_finite() && self.c > 0.0) {
            return Err(AnalysisError::InvalidInput(format!(
                "logistic regression: C must be positive and finite, got {}",
                self.c
            )));
        }
        if !(self.tol.is_finite() && self.tol > 0.0) {
            return Err(AnalysisError::InvalidInput(format!(
                "logistic regression: tol must be positive and finite, got {}",
                self.tol
            )));
        }
        if self.max_iterations == 0 {
            return Err(AnalysisError::InvalidInput(
                "logistic regression: max_iterations must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// A fitted multinomial logistic-regression probe including its standardisation.
#[derive(Debug, Clone, PartialEq)]
pub struct LogisticProbe {
    standardizer: Standardizer,
    classes: Vec<i64>,
    coef: Array2<f64>,
    intercept: Array1<f64>,
    iterations: u64,
    converged: bool,
}

impl LogisticProbe {
    /// Standardises `x` and fits a multinomial logistic regression to the labels `y`.
    ///
    /// # Shapes
    /// `x`: `[N, D]`; `y`: `[N]` with at least two distinct labels.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] for an empty set, a single class or bad hyperparameters;
    /// [`AnalysisError::Shape`] if `x` and `y` disagree in N; [`AnalysisError::NonFinite`] for
    /// NaN/infinite features; [`AnalysisError::Numerical`] if the optimiser fails.
    pub fn fit(
        x: ArrayView2<'_, f64>,
        y: ArrayView1<'_, i64>,
        params: &LogisticParams,
    ) -> Result<Self> {
        params.check()?;
        let (n, d) = x.dim();
        if n == 0 || d == 0 {
            return Err(AnalysisError::InvalidInput(format!(
                "logistic regression needs a non-empty training set, got [{n}, {d}]"
            )));
        }
        if y.len() != n {
            return Err(AnalysisError::Shape(format!(
                "training features have {n} rows but training labels have {}",
                y.len()
            )));
        }
        let mut classes: Vec<i64> = y.to_vec();
        classes.sort_unstable();
        classes.dedup();
        if classes.len() < 2 {
            return Err(AnalysisError::InvalidInput(format!(
                "logistic regression needs at least two classes in the training labels, found {:?}",
                classes
            )));
        }
        let standardizer = Standardizer::fit(x)?;
        let xs = standardizer.transform(x)?;
        // dense class indices in ascending label order (`classes` is sorted)
        let dense: Array1<usize> = y
            .iter()
            .map(|l| classes.binary_search(l).unwrap_or(0))
            .collect();
        let fit = multinomial::fit(xs.view(), dense.view(), classes.len(), params)?;
        let (coef, intercept) = (fit.coef, fit.intercept);
        if coef.dim() != (d, classes.len()) || intercept.len() != classes.len() {
            return Err(AnalysisError::Numerical(format!(
                "logistic regression returned weights of shape {:?}",
                coef.shape()
            )));
        }
        Ok(Self {
            standardizer,
            classes,
            coef,
            intercept,
            iterations: fit.iterations,
            converged: fit.converged,
        })
    }

    /// Class scores `standardise(x) W + b` (logits).
    ///
    /// # Shapes
    /// `x`: `[M, D]`; returns `[M, C]` with columns in the order of [`LogisticProbe::classes`].
    ///
    /// # Errors
    /// As [`Standardizer::transform`].
    pub fn decision_function(&self, x: ArrayView2<'_, f64>) -> Result<Array2<f64>> {
        let xs = self.standardizer.transform(x)?;
        Ok(xs.dot(&self.coef) + &self.intercept)
    }

    /// Class probabilities (softmax of the logits).
    ///
    /// # Shapes
    /// `x`: `[M, D]`; returns `[M, C]`.
    ///
    /// # Errors
    /// As [`Standardizer::transform`].
    pub fn predict_proba(&self, x: ArrayView2<'_, f64>) -> Result<Array2<f64>> {
        let mut p = self.decision_function(x)?;
        for mut row in p.rows_mut() {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            row.mapv_inplace(|v| (v - max).exp());
            let s = row.sum();
            row.mapv_inplace(|v| v / s);
        }
        Ok(p)
    }

    /// Predicted labels (the class of largest logit; ties go to the smaller label).
    ///
    /// # Shapes
    /// `x`: `[M, D]`; returns `[M]`.
    ///
    /// # Errors
    /// As [`Standardizer::transform`].
    pub fn predict(&self, x: ArrayView2<'_, f64>) -> Result<Array1<i64>> {
        let scores = self.decision_function(x)?;
        Ok(scores
            .rows()
            .into_iter()
            .map(|row| {
                let mut best = 0;
                for (j, &v) in row.iter().enumerate() {
                    if v > row[best] {
                        best = j;
                    }
                }
                self.classes[best]
            })
            .collect())
    }

    /// The training classes, sorted ascending.
    pub fn classes(&self) -> &[i64] {
        &self.classes
    }
    /// Weights on the standardised features. # Shapes: `[D, C]`.
    pub fn coef(&self) -> &Array2<f64> {
        &self.coef
    }
    /// Intercepts (not penalised, so defined up to a common constant). # Shapes: `[C]`.
    pub fn intercept(&self) -> &Array1<f64> {
        &self.intercept
    }
    /// The standardisation fitted on the training set.
    pub fn standardizer(&self) -> &Standardizer {
        &self.standardizer
    }
    /// L-BFGS iterations the fit ran (scikit-learn's `n_iter_`).
    pub fn iterations(&self) -> u64 {
        self.iterations
    }
    /// Whether the fit met a stopping rule before `max_iterations` (scikit-learn warns with a
    /// `ConvergenceWarning` otherwise).
    pub fn converged(&self) -> bool {
        self.converged
    }
}

/// Hyperparameters of [`decode`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DecodeParams {
    /// The logistic probe's hyperparameters.
    pub logistic: LogisticParams,
    /// Whether to run the shuffled-label control (a second fit).
    pub shuffled_control: bool,
    /// Seed of the permutation of the training labels in the shuffled-label control.
    pub seed: u64,
}

impl Default for DecodeParams {
    fn default() -> Self {
        Self {
            logistic: LogisticParams::default(),
            shuffled_control: true,
            seed: 0,
        }
    }
}

/// Outcome of one decoding run (train on one set, test on another).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeResult {
    /// Union of the training and test labels, sorted; indexes the confusion matrix.
    pub classes: Vec<i64>,
    /// Fraction of test samples decoded correctly.
    pub accuracy: f64,
    /// Mean over the classes present in the test labels of the per-class recall
    /// (scikit-learn's `balanced_accuracy_score`).
    pub balanced_accuracy: f64,
    /// The most frequent training label (ties: the smaller label).
    pub majority_class: i64,
    /// Test accuracy of always predicting `majority_class`.
    pub majority_baseline: f64,
    /// Test accuracy of the same pipeline trained on permuted training labels (None if not run).
    pub shuffled_control: Option<f64>,
    /// Counts of (true, predicted) label pairs on the test set. # Shapes: `[C, C]` (rows true,
    /// columns predicted, both in the order of `classes`). Serialised as a list of rows.
    #[serde(serialize_with = "serialize_rows")]
    pub confusion: Array2<u64>,
    /// Number of training samples.
    pub n_train: usize,
    /// Number of test samples.
    pub n_test: usize,
    /// Accuracy on the training set itself (how well the probe fits).
    pub train_accuracy: f64,
    /// L-BFGS iterations of the probe's fit (scikit-learn's `n_iter_`).
    pub iterations: u64,
    /// Whether the probe's fit met a stopping rule before `max_iterations` (scikit-learn warns
    /// with a `ConvergenceWarning` otherwise).
    pub converged: bool,
}

/// Trains a logistic probe on (`train_x`, `train_y`) and evaluates it on (`test_x`, `test_y`),
/// with the majority-class baseline, a shuffled-label control, balanced accuracy and the
/// confusion matrix (`docs/spec/latent-codes.md`, analysis 2).
///
/// Test labels that never occur in training can never be predicted: they count as errors and
/// appear as extra rows of the confusion matrix, which spans the union of both label sets.
///
/// The figures of [`decode_with_probe`], without the probe.
///
/// # Shapes
/// `train_x`: `[N_train, D]`; `train_y`: `[N_train]`; `test_x`: `[N_test, D]`; `test_y`: `[N_test]`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for an empty set or a single training class;
/// [`AnalysisError::Shape`] for mismatched lengths or feature counts;
/// [`AnalysisError::NonFinite`] for NaN/infinite features; [`AnalysisError::Numerical`] if the
/// optimiser fails.
pub fn decode(
    train_x: ArrayView2<'_, f64>,
    train_y: ArrayView1<'_, i64>,
    test_x: ArrayView2<'_, f64>,
    test_y: ArrayView1<'_, i64>,
    params: &DecodeParams,
) -> Result<DecodeResult> {
    decode_with_probe(train_x, train_y, test_x, test_y, params).map(|d| d.result)
}

/// A decoding run's figures with the probe they come from ([`decode_with_probe`]).
#[derive(Debug, Clone)]
pub struct Decoded {
    /// The figures, as [`decode`] returns them.
    pub result: DecodeResult,
    /// The probe trained on the true training labels.
    pub probe: LogisticProbe,
    /// The probe's predicted label of every test sample. # Shapes: `[N_test]`.
    pub predictions: Array1<i64>,
}

/// [`decode`], also returning the fitted probe and its test predictions (one fit: the Python
/// front's `hyperlens.analysis.decode` returns the weights and predictions beside the figures).
///
/// # Shapes
/// As [`decode`]; `predictions`: `[N_test]`; the probe's `coef`: `[D, C_train]`.
///
/// # Errors
/// As [`decode`].
pub fn decode_with_probe(
    train_x: ArrayView2<'_, f64>,
    train_y: ArrayView1<'_, i64>,
    test_x: ArrayView2<'_, f64>,
    test_y: ArrayView1<'_, i64>,
    params: &DecodeParams,
) -> Result<Decoded> {
    params.logistic.check()?;
    if test_x.nrows() == 0 {
        return Err(AnalysisError::InvalidInput(
            "decoding: the test set is empty".into(),
        ));
    }
    if test_y.len() != test_x.nrows() {
        return Err(AnalysisError::Shape(format!(
            "test features have {} rows but test labels have {}",
            test_x.nrows(),
            test_y.len()
        )));
    }
    if test_x.ncols() != train_x.ncols() {
        return Err(AnalysisError::Shape(format!(
            "training features have {} columns but test features have {}",
            train_x.ncols(),
            test_x.ncols()
        )));
    }
    check_finite(test_x, "test features")?;
    // the shuffled-label control is an independent fit: run it beside the real one
    let control = || -> Option<Result<f64>> {
        params.shuffled_control.then(|| {
            let mut permuted = train_y.to_vec();
            let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
            permuted.shuffle(&mut rng);
            let permuted = Array1::from(permuted);
            let control = LogisticProbe::fit(train_x, permuted.view(), &params.logistic)?;
            let p = control.predict(test_x)?;
            accuracy(test_y, p.view())
        })
    };
    let (fitted, control) = rayon::join(
        || LogisticProbe::fit(train_x, train_y, &params.logistic),
        control,
    );
    let probe = fitted?;
    let shuffled_control = control.transpose()?;
    let predicted = probe.predict(test_x)?;
    let train_pred = probe.predict(train_x)?;
    let train_accuracy = accuracy(train_y, train_pred.view())?;

    let mut classes: Vec<i64> = train_y.iter().chain(test_y.iter()).copied().collect();
    classes.sort_unstable();
    classes.dedup();
    let confusion = confusion_matrix(test_y, predicted.view(), &classes)?;
    let acc = accuracy(test_y, predicted.view())?;
    let balanced = balanced_accuracy(test_y, predicted.view())?;

    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for &label in train_y {
        *counts.entry(label).or_default() += 1;
    }
    // BTreeMap iterates in ascending label order; keep the first maximum (smallest label)
    let mut majority_class = classes[0];
    let mut best = 0;
    for (&label, &count) in &counts {
        if count > best {
            best = count;
            majority_class = label;
        }
    }
    let majority_baseline =
        test_y.iter().filter(|&&l| l == majority_class).count() as f64 / test_y.len() as f64;

    let result = DecodeResult {
        classes,
        accuracy: acc,
        balanced_accuracy: balanced,
        majority_class,
        majority_baseline,
        shuffled_control,
        confusion,
        n_train: train_y.len(),
        n_test: test_y.len(),
        train_accuracy,
        iterations: probe.iterations(),
        converged: probe.converged(),
    };
    Ok(Decoded {
        result,
        probe,
        predictions: predicted,
    })
}

/// Fraction of positions where `y_pred` equals `y_true`.
///
/// # Shapes
/// `y_true`, `y_pred`: `[N]`, N >= 1.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] if empty; [`AnalysisError::Shape`] if lengths differ.
pub fn accuracy(y_true: ArrayView1<'_, i64>, y_pred: ArrayView1<'_, i64>) -> Result<f64> {
    check_pair(y_true.len(), y_pred.len())?;
    let hits = y_true
        .iter()
        .zip(y_pred.iter())
        .filter(|(a, b)| a == b)
        .count();
    Ok(hits as f64 / y_true.len() as f64)
}

/// Balanced accuracy: the mean, over the labels that occur in `y_true`, of the recall of each
/// label (scikit-learn's `balanced_accuracy_score` with `adjusted=False`).
///
/// # Shapes
/// `y_true`, `y_pred`: `[N]`, N >= 1.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] if empty; [`AnalysisError::Shape`] if lengths differ.
pub fn balanced_accuracy(y_true: ArrayView1<'_, i64>, y_pred: ArrayView1<'_, i64>) -> Result<f64> {
    check_pair(y_true.len(), y_pred.len())?;
    let mut per_class: BTreeMap<i64, (usize, usize)> = BTreeMap::new();
    for (&t, &p) in y_true.iter().zip(y_pred.iter()) {
        let e = per_class.entry(t).or_default();
        e.0 += 1;
        if t == p {
            e.1 += 1;
        }
    }
    let sum: f64 = per_class
        .values()
        .map(|&(total, hit)| hit as f64 / total as f64)
        .sum();
    Ok(sum / per_class.len() as f64)
}

/// Confusion matrix over a given label list: entry (i, j) counts samples with true label
/// `labels[i]` predicted as `labels[j]` (scikit-learn's `confusion_matrix(labels=...)`).
///
/// # Shapes
/// `y_true`, `y_pred`: `[N]`; returns `[C, C]` with C = `labels.len()`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] if empty, if `labels` has duplicates, or if a true or
/// predicted label is not in `labels`; [`AnalysisError::Shape`] if lengths differ.
pub fn confusion_matrix(
    y_true: ArrayView1<'_, i64>,
    y_pred: ArrayView1<'_, i64>,
    labels: &[i64],
) -> Result<Array2<u64>> {
    check_pair(y_true.len(), y_pred.len())?;
    let mut index = BTreeMap::new();
    for (i, &l) in labels.iter().enumerate() {
        if index.insert(l, i).is_some() {
            return Err(AnalysisError::InvalidInput(format!(
                "confusion matrix: label {l} listed twice"
            )));
        }
    }
    let mut m = Array2::<u64>::zeros((labels.len(), labels.len()));
    for (&t, &p) in y_true.iter().zip(y_pred.iter()) {
        let (Some(&i), Some(&j)) = (index.get(&t), index.get(&p)) else {
            return Err(AnalysisError::InvalidInput(format!(
                "confusion matrix: label pair ({t}, {p}) not in the label list {labels:?}"
            )));
        };
        m[[i, j]] += 1;
    }
    Ok(m)
}

fn serialize_rows<S: serde::Serializer>(
    m: &Array2<u64>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    let rows: Vec<Vec<u64>> = m.rows().into_iter().map(|r| r.to_vec()).collect();
    rows.serialize(s)
}

fn check_pair(a: usize, b: usize) -> Result<()> {
    if a == 0 {
        return Err(AnalysisError::InvalidInput("empty label array".into()));
    }
    if a != b {
        return Err(AnalysisError::Shape(format!(
            "true labels have {a} entries but predictions have {b}"
        )));
    }
    Ok(())
}

pub(crate) fn check_finite(x: ArrayView2<'_, f64>, what: &str) -> Result<()> {
    if let Some(pos) = x.iter().position(|v| !v.is_finite()) {
        let d = x.ncols().max(1);
        return Err(AnalysisError::NonFinite(format!(
            "{what} (first at row {}, column {})",
            pos / d,
            pos % d
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn metrics_by_hand() {
        let t = array![0, 0, 0, 1, 1, 2, 7];
        let p = array![0, 1, 0, 1, 0, 2, 2];
        assert!((accuracy(t.view(), p.view()).unwrap() - 4.0 / 7.0).abs() < 1e-12);
        // recalls: 0 -> 2/3, 1 -> 1/2, 2 -> 1, 7 -> 0
        let want = (2.0 / 3.0 + 0.5 + 1.0 + 0.0) / 4.0;
        assert!((balanced_accuracy(t.view(), p.view()).unwrap() - want).abs() < 1e-12);
        let m = confusion_matrix(t.view(), p.view(), &[0, 1, 2, 7]).unwrap();
        assert_eq!(
            m,
            array![[2, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 0]]
        );
        assert!(confusion_matrix(t.view(), p.view(), &[0, 1, 2]).is_err());
        assert!(accuracy(t.view(), array![1, 2].view()).is_err());
    }

    #[test]
    fn standardizer_guards_constant_columns() {
        let x = array![[1.0, 5.0, 2.0], [3.0, 5.0, 4.0], [5.0, 5.0, 9.0]];
        let s = Standardizer::fit(x.view()).unwrap();
        assert_eq!(s.scale()[1], 1.0);
        let xs = s.transform(x.view()).unwrap();
        assert!(xs.column(1).iter().all(|&v| v == 0.0));
        // column 0: mean 3, population std sqrt(8/3)
        assert!((xs[[0, 0]] + 2.0 / (8.0f64 / 3.0).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn decode_rejects_bad_inputs() {
        let x = array![[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]];
        let one_class = array![3, 3, 3];
        let err = decode(
            x.view(),
            one_class.view(),
            x.view(),
            one_class.view(),
            &DecodeParams::default(),
        );
        assert!(
            matches!(err, Err(AnalysisError::InvalidInput(ref m)) if m.contains("two classes"))
        );
        let y = array![0, 1, 0];
        let short = array![0, 1];
        assert!(matches!(
            decode(
                x.view(),
                short.view(),
                x.view(),
                y.view(),
                &DecodeParams::default()
            ),
            Err(AnalysisError::Shape(_))
        ));
        let wide = Array2::<f64>::zeros((3, 3));
        assert!(matches!(
            decode(
                x.view(),
                y.view(),
                wide.view(),
                y.view(),
                &DecodeParams::default()
            ),
            Err(AnalysisError::Shape(_))
        ));
        let mut nan = x.clone();
        nan[[2, 1]] = f64::INFINITY;
        assert!(matches!(
            decode(
                nan.view(),
                y.view(),
                x.view(),
                y.view(),
                &DecodeParams::default()
            ),
            Err(AnalysisError::NonFinite(_))
        ));
        let empty = Array2::<f64>::zeros((0, 2));
        let none = Array1::<i64>::zeros(0);
        assert!(decode(
            empty.view(),
            none.view(),
            x.view(),
            y.view(),
            &DecodeParams::default()
        )
        .is_err());
        assert!(decode(
            x.view(),
            y.view(),
            empty.view(),
            none.view(),
            &DecodeParams::default()
        )
        .is_err());
    }
}
