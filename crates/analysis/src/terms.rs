//! Decoding the fuzzy-logic task's terms from latent codes (`docs/spec/latent-codes.md`, analysis 6;
//! Schug et al. 2025, Fig. 2B and the fuzzy-logic rows of Table A1).
//!
//! Each task of the fuzzy-logic benchmark is a set of `Kt` terms out of the `2^Lv` conjunctions of
//! `Lv` literals. The latent code of a problem (by default the last token's attention to itself,
//! `[L, H]`) should name those terms. Two read-outs:
//!
//! - **Ridge R²**: ridge regression with an intercept and L2 strength 1.0 (scikit-learn's
//!   `Ridge(alpha=1.0)`) from the flattened code to the flattened term matrix `[Kt * Lv]` (bits),
//!   fitted on the first half of a code set and scored on the second half by the coefficient of
//!   determination averaged over the outputs (`r2_score(multioutput="uniform_average")`; an output
//!   that is constant in the scored half counts 1 if predicted exactly, else 0, as scikit-learn's
//!   `force_finite`). The paper's `r2_attn_latent`.
//! - **Per-term F1**: for every term that appears in both sets, a binary logistic probe "is this
//!   term part of the task" (standardised features, L2, C = 1.0, scikit-learn's
//!   `LogisticRegression` defaults) trained on the in-distribution codes and scored by F1 on the
//!   held-out codes. Two controls beside the mean F1: the base rate (the F1 of answering "yes" for
//!   every problem, `2p / (1 + p)` for a term present in a fraction `p` of the held-out problems)
//!   and the same probe trained on shuffled labels.
//!
//! Both run per layer and on all layers concatenated.

use hyperlens_io::keys;
use linfa::prelude::*;
use linfa_logistic::LogisticRegression;
use nalgebra::DMatrix;
use ndarray::{Array1, Array2, Array3, Array5, ArrayView1, ArrayView2, Axis};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rayon::prelude::*;
use serde::Serialize;

use crate::decode::{LogisticParams, Standardizer};
use crate::error::{AnalysisError, Result};
use crate::table::{Column, Table};

/// A named two-dimensional projection of codes, `(name, [N, 2])`.
pub type NamedProjection = (String, Array2<f64>);

/// Latent codes of fuzzy-logic problems with their tasks' terms (a logic `codes.npz`).
#[derive(Debug, Clone)]
pub struct TermCodes {
    codes: Array5<f32>,
    terms: Array3<i64>,
    term_ids: Array2<i64>,
    target: Option<Array1<f64>>,
}

impl TermCodes {
    /// Codes with their labels.
    ///
    /// # Shapes
    /// `codes [N, L, H, Q, K]`, `terms [N, Kt, Lv]` (bits 0/1), `term_ids [N, Kt]` (indices in
    /// `0..2^Lv`; term `t`'s bits are `t` in binary, variable 0 most significant, as the task's).
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if the three disagree in `N` or `Kt`; [`AnalysisError::InvalidInput`]
    /// naming the array, the index and the value for an empty set, a bit other than 0/1, a term
    /// index outside `0..2^Lv`, terms whose bits are not those of their index, or non-finite codes.
    pub fn new(codes: Array5<f32>, terms: Array3<i64>, term_ids: Array2<i64>) -> Result<Self> {
        let n = codes.dim().0;
        if n == 0 || codes.is_empty() {
            return Err(AnalysisError::InvalidInput("an empty code set".into()));
        }
        if terms.dim().0 != n || term_ids.dim().0 != n || terms.dim().1 != term_ids.dim().1 {
            return Err(AnalysisError::Shape(format!(
                "codes {:?}, terms {:?} and term_ids {:?} disagree",
                codes.shape(),
                terms.shape(),
                term_ids.shape()
            )));
        }
        if let Some((i, b)) = terms.indexed_iter().find(|(_, &b)| b != 0 && b != 1) {
            return Err(AnalysisError::InvalidInput(format!(
                "array `terms`: value {b} at {:?} is not a bit (0 or 1)",
                <[usize; 3]>::from(i)
            )));
        }
        let lv = terms.dim().2;
        // 2^Lv term indices; beyond i64 every non-negative index is in range.
        let n_terms = u32::try_from(lv)
            .ok()
            .and_then(|lv| 1i64.checked_shl(lv))
            .filter(|&n| n > 0)
            .unwrap_or(i64::MAX);
        if let Some(((r, j), t)) = term_ids
            .indexed_iter()
            .find(|(_, &t)| !(0..n_terms).contains(&t))
        {
            return Err(AnalysisError::InvalidInput(format!(
                "array `term_ids`: index {t} at [{r}, {j}] is outside 0..2^{lv} (Lv = {lv} \
                 variables, the last axis of `terms`)"
            )));
        }
        for ((r, j), &t) in term_ids.indexed_iter() {
            let row = terms.slice(ndarray::s![r, j, ..]);
            let bit = |v: usize| {
                let shift = (lv - 1 - v) as u32;
                t.checked_shr(shift).map_or(0, |s| s & 1)
            };
            if let Some(v) = (0..lv).find(|&v| row[v] != bit(v)) {
                return Err(AnalysisError::InvalidInput(format!(
                    "array `terms`: terms[{r}, {j}] = {:?} disagrees with term_ids[{r}, {j}] = \
                     {t} (bit {v} should be {})",
                    row.to_vec(),
                    bit(v)
                )));
            }
        }
        if let Some((i, v)) = codes.indexed_iter().find(|(_, v)| !v.is_finite()) {
            return Err(AnalysisError::InvalidInput(format!(
                "array `codes`: value {v} at {:?} is not finite",
                <[usize; 5]>::from(i)
            )));
        }
        Ok(TermCodes {
            codes,
            terms,
            term_ids,
            target: None,
        })
    }

    /// The same codes with each problem's target value (the last token's `f(x)`).
    ///
    /// # Shapes
    /// `target [N]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] for another length; [`AnalysisError::InvalidInput`] naming the
    /// index and the value for a target that is not a truth value (finite, in [0, 1]).
    pub fn with_target(mut self, target: Array1<f64>) -> Result<Self> {
        if target.len() != self.n_samples() {
            return Err(AnalysisError::Shape(format!(
                "{} targets for {} problems",
                target.len(),
                self.n_samples()
            )));
        }
        if let Some((i, v)) = target
            .indexed_iter()
            .find(|(_, v)| !(0.0..=1.0).contains(*v))
        {
            return Err(AnalysisError::InvalidInput(format!(
                "array `target`: value {v} at [{i}] is not a truth value (finite, in [0, 1])"
            )));
        }
        self.target = Some(target);
        Ok(self)
    }

    /// Each problem's target value, if the codes carry it.
    pub fn target(&self) -> Option<&Array1<f64>> {
        self.target.as_ref()
    }

    /// Reads a logic code file written by `hyperlens probe` (`codes`, `terms`, `term_ids`;
    /// `hyperlens_io::keys::codes`).
    ///
    /// # Errors
    /// [`AnalysisError::Io`] / [`AnalysisError::Npz`] naming the file and the array (missing,
    /// wrong dtype or rank, sizes that do not fit the bytes or the memory budget); as
    /// [`TermCodes::new`].
    pub fn read_npz(path: impl AsRef<std::path::Path>) -> Result<Self> {
        use hyperlens_io::keys::codes as keys;
        let (mut npz, names, shown) = crate::codes::open_npz(
            path.as_ref(),
            &[keys::CODES, keys::TERMS, keys::TERM_IDS, keys::TARGET],
        )?;
        for required in [keys::CODES, keys::TERMS, keys::TERM_IDS] {
            if !names.iter().any(|n| n == required) {
                return Err(AnalysisError::Npz(format!(
                    "{shown}: required array `{required}` of a logic code file is missing \
                     (found: {})",
                    names.join(", ")
                )));
            }
        }
        let codes = crate::codes::read_codes(&mut npz, &shown)?;
        let terms = crate::codes::read_int(&mut npz, &shown, keys::TERMS)?;
        let ndim = terms.ndim();
        let terms: Array3<i64> = terms.into_dimensionality().map_err(|_| {
            AnalysisError::Npz(format!(
                "{shown}: array `terms` must have 3 axes [N, Kt, Lv], found {ndim}"
            ))
        })?;
        let ids = crate::codes::read_int(&mut npz, &shown, keys::TERM_IDS)?;
        let ids = crate::codes::to_2d(ids, &shown, keys::TERM_IDS)?;
        let with_file = |e: AnalysisError| match e {
            AnalysisError::Shape(m) | AnalysisError::InvalidInput(m) => {
                AnalysisError::Npz(format!("{shown}: {m}"))
            }
            other => other,
        };
        let set = TermCodes::new(codes, terms, ids).map_err(with_file)?;
        if !names.iter().any(|n| n == keys::TARGET) {
            return Ok(set);
        }
        let target: Array1<f32> = npz.by_name(keys::TARGET).map_err(|e| {
            AnalysisError::Npz(format!(
                "{shown}: array `target` must be float32 [N] in a logic code file: {e}"
            ))
        })?;
        set.with_target(target.mapv(f64::from)).map_err(with_file)
    }

    /// Whether the `.npz` at `path` is a logic code file (it holds `terms`).
    pub fn is_logic_file(path: impl AsRef<std::path::Path>) -> bool {
        std::fs::File::open(path)
            .ok()
            .and_then(|f| ndarray_npy::NpzReader::new(f).ok())
            .and_then(|mut z| z.names().ok())
            .is_some_and(|n| n.iter().any(|n| n == hyperlens_io::keys::codes::TERMS))
    }

    /// Problems N.
    pub fn n_samples(&self) -> usize {
        self.codes.dim().0
    }

    /// The term indices, `[N, Kt]`.
    pub fn term_ids(&self) -> &Array2<i64> {
        &self.term_ids
    }

    /// PCA (2 components) of each layer's codes and of all layers, and a t-SNE embedding of all
    /// layers' codes of the first `max_tsne` problems, with its trustworthiness (k = 5): the
    /// projections of the paper's Fig. 2D / A2, coloured by term downstream.
    ///
    /// # Shapes
    /// Returns `(name, [N or n_tsne, 2])` pairs, `pca_layer{l}` and `pca_all` over all problems,
    /// `tsne_all` over the first `min(N, max_tsne)`, and the trustworthiness.
    ///
    /// # Errors
    /// As [`crate::pca::PcaParams::fit`] and [`crate::embed::tsne`] (too few problems for the
    /// perplexity, fewer than 2 features).
    pub fn projections(
        &self,
        max_tsne: usize,
        tsne: &crate::embed::TsneParams,
    ) -> Result<(Vec<NamedProjection>, f64)> {
        let mut out = Vec::new();
        let selections: Vec<Option<usize>> = (0..self.n_layers())
            .map(Some)
            .chain(std::iter::once(None))
            .collect();
        for layer in selections {
            let x = self.features(layer);
            let k = 2.min(x.ncols()).min(x.nrows());
            let pca = crate::pca::PcaParams::new(k).fit(x.view())?;
            let name = keys::pca::name(keys::projections::PCA_PREFIX, layer);
            out.push((name, pca.transform(x.view())?));
        }
        let all = self.features(None);
        let m = all.nrows().min(max_tsne);
        let sub = all.slice(ndarray::s![..m, ..]);
        let emb = crate::embed::tsne(sub, tsne)?;
        let trust = crate::embed::trustworthiness(sub, emb.view(), 5)?;
        out.push((keys::projections::TSNE_ALL.to_string(), emb));
        Ok((out, trust))
    }

    /// Layers L.
    pub fn n_layers(&self) -> usize {
        self.codes.dim().1
    }

    /// The features of layer `l` (`None`: all layers), flattened per problem.
    ///
    /// # Shapes
    /// `[N, H * Q * K]` for a layer, `[N, L * H * Q * K]` for all.
    fn features(&self, layer: Option<usize>) -> Array2<f64> {
        let n = self.n_samples();
        let view = match layer {
            Some(l) => self.codes.index_axis(Axis(1), l).to_owned().into_dyn(),
            None => self.codes.clone().into_dyn(),
        };
        let d = view.len() / n;
        Array2::from_shape_vec((n, d), view.iter().map(|&v| v as f64).collect())
            .unwrap_or_else(|_| Array2::zeros((n, 0)))
    }

    /// The term matrices flattened per problem, `[N, Kt * Lv]` as float.
    fn term_matrix(&self) -> Array2<f64> {
        let (n, kt, lv) = self.terms.dim();
        Array2::from_shape_vec((n, kt * lv), self.terms.iter().map(|&b| b as f64).collect())
            .unwrap_or_else(|_| Array2::zeros((n, 0)))
    }

    /// Whether each problem's task holds term `t`, `[N]`.
    fn has_term(&self, t: i64) -> Array1<bool> {
        self.term_ids
            .outer_iter()
            .map(|row| row.iter().any(|&x| x == t))
            .collect()
    }
}

/// Ridge regression `y = x W + b` with L2 strength `alpha` on `W` (not on the intercept), by the
/// normal equations `(Xc^T Xc + alpha I) W = Xc^T Yc` on centred data, solved by Cholesky.
///
/// # Shapes
/// `x [N, D]`, `y [N, P]`; returns `(W [D, P], b [P])`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for no rows or a non-positive `alpha`;
/// [`AnalysisError::Numerical`] if the system cannot be factorised.
pub fn ridge_fit(
    x: ArrayView2<'_, f64>,
    y: ArrayView2<'_, f64>,
    alpha: f64,
) -> Result<(Array2<f64>, Array1<f64>)> {
    let (n, d) = x.dim();
    let p = y.dim().1;
    if n == 0 || y.dim().0 != n {
        return Err(AnalysisError::InvalidInput(format!(
            "ridge regression needs rows, got x {:?} and y {:?}",
            x.shape(),
            y.shape()
        )));
    }
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(AnalysisError::InvalidInput(format!(
            "ridge regression: alpha must be positive, got {alpha}"
        )));
    }
    let xm = x.mean_axis(Axis(0)).unwrap_or_else(|| Array1::zeros(d));
    let ym = y.mean_axis(Axis(0)).unwrap_or_else(|| Array1::zeros(p));
    let xc = &x - &xm;
    let yc = &y - &ym;
    let a = DMatrix::from_fn(d, d, |i, j| {
        let s: f64 = (0..n).map(|r| xc[[r, i]] * xc[[r, j]]).sum();
        if i == j {
            s + alpha
        } else {
            s
        }
    });
    let b = DMatrix::from_fn(d, p, |i, j| (0..n).map(|r| xc[[r, i]] * yc[[r, j]]).sum());
    let chol = a.cholesky().ok_or_else(|| {
        AnalysisError::Numerical(
            "ridge regression: the normal equations are not positive definite".into(),
        )
    })?;
    let w = chol.solve(&b);
    let w = Array2::from_shape_fn((d, p), |(i, j)| w[(i, j)]);
    let intercept = &ym - &xm.dot(&w);
    Ok((w, intercept))
}

/// The coefficient of determination averaged over outputs (scikit-learn's `r2_score` with
/// `multioutput="uniform_average"` and `force_finite=True`: an output constant in `y` scores 1 if
/// predicted exactly, else 0).
///
/// # Shapes
/// `y`, `pred` `[N, P]` with `N >= 1`.
///
/// # Errors
/// [`AnalysisError::Shape`] if the shapes differ or are empty.
pub fn r2_score(y: ArrayView2<'_, f64>, pred: ArrayView2<'_, f64>) -> Result<f64> {
    if y.dim() != pred.dim() || y.is_empty() {
        return Err(AnalysisError::Shape(format!(
            "r2: targets {:?} and predictions {:?}",
            y.shape(),
            pred.shape()
        )));
    }
    let p = y.dim().1;
    let mut total = 0.0;
    for j in 0..p {
        let (yc, pc) = (y.column(j), pred.column(j));
        let mean = yc.mean().unwrap_or(0.0);
        let ss_tot: f64 = yc.iter().map(|v| (v - mean).powi(2)).sum();
        let ss_res: f64 = yc.iter().zip(pc).map(|(a, b)| (a - b).powi(2)).sum();
        total += if ss_tot > 0.0 {
            1.0 - ss_res / ss_tot
        } else if ss_res == 0.0 {
            1.0
        } else {
            0.0
        };
    }
    Ok(total / p as f64)
}

/// Ridge R² of the term matrix from the codes: fit on the first `N / 2` problems, scored on the
/// rest (module docs).
///
/// # Shapes
/// `x [N, D]`, `y [N, P]`, `N >= 4`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for fewer than 4 problems; as [`ridge_fit`].
pub fn ridge_r2_halves(x: ArrayView2<'_, f64>, y: ArrayView2<'_, f64>, alpha: f64) -> Result<f64> {
    let n = x.dim().0;
    if n < 4 {
        return Err(AnalysisError::InvalidInput(format!(
            "ridge R² on halves needs at least 4 problems, got {n}"
        )));
    }
    let h = n / 2;
    let (w, b) = ridge_fit(
        x.slice(ndarray::s![..h, ..]),
        y.slice(ndarray::s![..h, ..]),
        alpha,
    )?;
    let pred = x.slice(ndarray::s![h.., ..]).dot(&w) + &b;
    r2_score(y.slice(ndarray::s![h.., ..]), pred.view())
}

/// F1 of binary predictions (scikit-learn's `f1_score`, 0 when there is no positive and no
/// predicted positive).
///
/// # Shapes
/// `y`, `pred` `[N]`.
pub fn f1(y: ArrayView1<'_, bool>, pred: ArrayView1<'_, bool>) -> f64 {
    let (mut tp, mut fp, mut fneg) = (0usize, 0usize, 0usize);
    for (&a, &b) in y.iter().zip(pred) {
        match (a, b) {
            (true, true) => tp += 1,
            (false, true) => fp += 1,
            (true, false) => fneg += 1,
            _ => {}
        }
    }
    if tp + fp + fneg == 0 {
        0.0
    } else {
        2.0 * tp as f64 / (2 * tp + fp + fneg) as f64
    }
}

/// A binary logistic probe (standardised features, L2 with `C`, scikit-learn's binary
/// `LogisticRegression`) fitted on `x`, `y`; returns the predictions on `x_test`.
///
/// # Errors
/// [`AnalysisError::Numerical`] if the optimiser fails; as [`Standardizer::fit`].
fn binary_probe(
    x: ArrayView2<'_, f64>,
    y: ArrayView1<'_, bool>,
    x_test: ArrayView2<'_, f64>,
    params: &LogisticParams,
) -> Result<Array1<bool>> {
    let st = Standardizer::fit(x)?;
    let xs = st.transform(x)?;
    let labels: Array1<usize> = y.iter().map(|&b| usize::from(b)).collect();
    let data = DatasetBase::new(xs, labels);
    let model = LogisticRegression::default()
        .alpha(1.0 / params.c)
        .max_iterations(params.max_iterations)
        .gradient_tolerance(params.tol * x.dim().0 as f64)
        .fit(&data)
        .map_err(|e| AnalysisError::Numerical(format!("logistic regression: {e}")))?;
    let pred = model.predict(&st.transform(x_test)?);
    Ok(pred.iter().map(|&c| c == 1).collect())
}

/// The term decoding of one selection of layers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TermDecodingRow {
    /// The layer, or `None` for all layers concatenated (`all` in the CSV).
    pub layer: Option<usize>,
    /// Ridge R² of the term matrix on the held-out set's halves.
    pub ridge_r2: f64,
    /// Mean F1 over the scored terms of the probes trained on the in-distribution codes.
    pub f1_mean: f64,
    /// Mean F1 of answering "yes" for every problem (the base-rate control).
    pub f1_base_rate: f64,
    /// Mean F1 of the probes trained on shuffled labels (the shuffled-label control).
    pub f1_shuffled: f64,
    /// Terms scored: present in some but not all training problems, and in some held-out problem.
    pub n_terms: usize,
}

/// Parameters of [`term_decoding`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TermDecodingParams {
    /// L2 strength of the ridge regression (the paper: 1.0).
    pub ridge_alpha: f64,
    /// The logistic probes' hyperparameters.
    pub logistic: LogisticParams,
    /// Seed of the shuffled-label control's permutation.
    pub seed: u64,
}

impl Default for TermDecodingParams {
    fn default() -> Self {
        TermDecodingParams {
            ridge_alpha: 1.0,
            logistic: LogisticParams::default(),
            seed: 0,
        }
    }
}

/// Term decoding per layer and on all layers (module docs): probes trained on `train` (the
/// in-distribution tasks' codes), scored on `test` (held-out tasks); the ridge R² on `test`'s
/// halves.
///
/// # Errors
/// [`AnalysisError::Shape`] if the sets differ in layers, features or term shape;
/// [`AnalysisError::InvalidInput`] if no term can be scored or `test` has fewer than 4 problems;
/// numerical errors of the fits.
pub fn term_decoding(
    train: &TermCodes,
    test: &TermCodes,
    params: &TermDecodingParams,
) -> Result<Vec<TermDecodingRow>> {
    if train.codes.shape()[1..] != test.codes.shape()[1..]
        || train.terms.shape()[1..] != test.terms.shape()[1..]
    {
        return Err(AnalysisError::Shape(format!(
            "train codes {:?} / terms {:?} and test codes {:?} / terms {:?} differ",
            train.codes.shape(),
            train.terms.shape(),
            test.codes.shape(),
            test.terms.shape()
        )));
    }
    // The terms that occur, in increasing order (not every index below the largest: an index is
    // at most 2^Lv, which may be far more than the problems).
    let ids: std::collections::BTreeSet<i64> = train
        .term_ids
        .iter()
        .chain(test.term_ids.iter())
        .copied()
        .collect();
    // Terms present in some but not all training problems (a probe needs both classes) and in
    // some held-out problem (F1 needs a positive).
    let scored: Vec<(i64, Array1<bool>, Array1<bool>)> = ids
        .into_iter()
        .filter_map(|t| {
            let (ytr, yte) = (train.has_term(t), test.has_term(t));
            let pos = ytr.iter().filter(|&&b| b).count();
            (pos > 0 && pos < ytr.len() && yte.iter().any(|&b| b)).then_some((t, ytr, yte))
        })
        .collect();
    if scored.is_empty() {
        return Err(AnalysisError::InvalidInput(
            "no term can be scored: none appears in both sets with both classes in training".into(),
        ));
    }
    let y_ridge = test.term_matrix();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(params.seed);
    let shuffled: Vec<Array1<bool>> = scored
        .iter()
        .map(|(_, ytr, _)| {
            let mut v = ytr.to_vec();
            v.shuffle(&mut rng);
            Array1::from_vec(v)
        })
        .collect();
    let base_rate = scored
        .iter()
        .map(|(_, _, yte)| {
            let p = yte.iter().filter(|&&b| b).count() as f64 / yte.len() as f64;
            2.0 * p / (1.0 + p)
        })
        .sum::<f64>()
        / scored.len() as f64;
    let selections: Vec<Option<usize>> = (0..train.n_layers())
        .map(Some)
        .chain(std::iter::once(None))
        .collect();
    selections
        .into_iter()
        .map(|layer| {
            let (xtr, xte) = (train.features(layer), test.features(layer));
            let ridge_r2 = ridge_r2_halves(xte.view(), y_ridge.view(), params.ridge_alpha)?;
            // The probes of the terms in parallel (rayon); the sums in term order.
            let scores = scored
                .par_iter()
                .zip(&shuffled)
                .map(|((_, ytr, yte), ysh)| -> Result<(f64, f64)> {
                    let pred = binary_probe(xtr.view(), ytr.view(), xte.view(), &params.logistic)?;
                    let real = f1(yte.view(), pred.view());
                    let has_both = ysh.iter().any(|&b| b) && ysh.iter().any(|&b| !b);
                    let control = if has_both {
                        let pred =
                            binary_probe(xtr.view(), ysh.view(), xte.view(), &params.logistic)?;
                        f1(yte.view(), pred.view())
                    } else {
                        0.0
                    };
                    Ok((real, control))
                })
                .collect::<Result<Vec<_>>>()?;
            let (mut f1_sum, mut f1_shuf) = (0.0, 0.0);
            for (real, control) in scores {
                f1_sum += real;
                f1_shuf += control;
            }
            let k = scored.len() as f64;
            Ok(TermDecodingRow {
                layer,
                ridge_r2,
                f1_mean: f1_sum / k,
                f1_base_rate: base_rate,
                f1_shuffled: f1_shuf / k,
                n_terms: scored.len(),
            })
        })
        .collect()
}

/// `term_decoding.csv`: `layer,ridge_r2,f1_mean,f1_base_rate,f1_shuffled,n_terms`, one row per
/// layer and one for all layers (`layer` `all`), floats in Rust's shortest round-trip text.
///
/// # Errors
/// None in practice (every column has one value per row).
pub fn term_decoding_table(rows: &[TermDecodingRow]) -> Result<Table> {
    let f = |g: &dyn Fn(&TermDecodingRow) -> f64| Column::shortest(rows.iter().map(g).collect());
    let mut t = Table::new();
    t.push(
        "layer",
        Column::Text(
            rows.iter()
                .map(|r| r.layer.map_or_else(|| "all".to_string(), |l| l.to_string()))
                .collect(),
        ),
    )?;
    t.push("ridge_r2", f(&|r| r.ridge_r2))?;
    t.push("f1_mean", f(&|r| r.f1_mean))?;
    t.push("f1_base_rate", f(&|r| r.f1_base_rate))?;
    t.push("f1_shuffled", f(&|r| r.f1_shuffled))?;
    t.push(
        "n_terms",
        Column::Int(rows.iter().map(|r| r.n_terms as i64).collect()),
    )?;
    Ok(t)
}

/// [`term_decoding_table`] as CSV text, as `term_decoding.csv` holds it.
///
/// # Errors
/// As [`term_decoding_table`].
pub fn term_decoding_csv(rows: &[TermDecodingRow]) -> Result<String> {
    Ok(term_decoding_table(rows)?.to_csv())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{arr1, arr2, Array3, Array5};

    /// Two problems of Kt = 2 terms over Lv = 3 variables: terms 5 (101) and 2 (010), 0 and 7.
    fn valid() -> (Array5<f32>, Array3<i64>, Array2<i64>) {
        let ids = arr2(&[[5i64, 2], [0, 7]]);
        let terms = Array3::from_shape_fn((2, 2, 3), |(r, j, v)| (ids[[r, j]] >> (2 - v)) & 1);
        (Array5::from_elem((2, 1, 1, 1, 1), 0.5), terms, ids)
    }

    fn err(codes: Array5<f32>, terms: Array3<i64>, ids: Array2<i64>) -> String {
        TermCodes::new(codes, terms, ids).unwrap_err().to_string()
    }

    #[test]
    fn term_indices_must_be_below_two_to_the_variables() {
        let (c, t, _) = valid();
        assert!(TermCodes::new(c.clone(), t.clone(), valid().2).is_ok());
        for bad in [8i64, 1 << 40, i64::MAX, -1] {
            let mut ids = valid().2;
            ids[[1, 1]] = bad;
            let e = err(c.clone(), t.clone(), ids);
            assert!(
                e.contains("`term_ids`") && e.contains(&bad.to_string()) && e.contains("[1, 1]"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn terms_must_be_bits_and_agree_with_their_indices() {
        let (c, mut t, ids) = valid();
        t[[0, 1, 2]] = 2;
        let e = err(c.clone(), t, ids.clone());
        assert!(e.contains("`terms`") && e.contains("[0, 1, 2]"), "{e}");
        // Term 2 (010) given the bits of 3 (011): each array valid alone.
        let (_, mut t, _) = valid();
        t[[0, 1, 2]] = 1;
        let e = err(c.clone(), t, ids.clone());
        assert!(e.contains("term_ids[0, 1] = 2"), "{e}");
        let mut c = c;
        c[[1, 0, 0, 0, 0]] = f32::NAN;
        let e = err(c, valid().1, ids);
        assert!(e.contains("`codes`") && e.contains("NaN"), "{e}");
    }

    #[test]
    fn targets_must_be_truth_values() {
        let (c, t, ids) = valid();
        let set = TermCodes::new(c, t, ids).unwrap();
        assert!(set.clone().with_target(arr1(&[0.0, 1.0])).is_ok());
        for bad in [f64::NAN, f64::INFINITY, 1.5, -0.5] {
            let e = set
                .clone()
                .with_target(arr1(&[0.25, bad]))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("`target`") && e.contains("[1]") && e.contains(&bad.to_string()),
                "{e}"
            );
        }
    }

    #[test]
    fn a_huge_term_index_does_not_make_decoding_loop_over_every_index() {
        // Lv = 40: indices up to 2^40 are valid; decoding visits only the indices that occur.
        let lv = 40;
        let n = 8;
        let ids = Array2::from_shape_fn((n, 1), |(r, _)| if r % 2 == 0 { 1i64 << 39 } else { 3 });
        let terms =
            Array3::from_shape_fn((n, 1, lv), |(r, j, v)| (ids[[r, j]] >> (lv - 1 - v)) & 1);
        let codes = Array5::from_shape_fn((n, 1, 2, 1, 1), |(r, _, h, _, _)| {
            (r % 2) as f32 + 0.1 * h as f32 + 0.01 * r as f32
        });
        let set = TermCodes::new(codes, terms, ids).unwrap();
        let rows = term_decoding(&set, &set, &TermDecodingParams::default()).unwrap();
        assert_eq!(rows[0].n_terms, 2);
    }
}
