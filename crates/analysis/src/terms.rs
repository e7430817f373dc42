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
    /// `0..2^Lv`).
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if the three disagree in `N` or `Kt`; [`AnalysisError::InvalidInput`]
    /// for an empty set, a bit other than 0/1, a negative term index or non-finite codes.
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
        if terms.iter().any(|&b| b != 0 && b != 1) {
            return Err(AnalysisError::InvalidInput(
                "terms must be bits (0 or 1)".into(),
            ));
        }
        if term_ids.iter().any(|&t| t < 0) {
            return Err(AnalysisError::InvalidInput(
                "term_ids must be non-negative".into(),
            ));
        }
        if codes.iter().any(|v| !v.is_finite()) {
            return Err(AnalysisError::InvalidInput(
                "codes hold NaN or infinite values".into(),
            ));
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
    /// [`AnalysisError::Shape`] for another length; [`AnalysisError::InvalidInput`] for
    /// non-finite values.
    pub fn with_target(mut self, target: Array1<f64>) -> Result<Self> {
        if target.len() != self.n_samples() {
            return Err(AnalysisError::Shape(format!(
                "{} targets for {} problems",
                target.len(),
                self.n_samples()
            )));
        }
        if target.iter().any(|v| !v.is_finite()) {
            return Err(AnalysisError::InvalidInput("targets must be finite".into()));
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
        let (mut npz, names, shown) = crate::codes::open_npz(path.as_ref())?;
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
            let name = layer.map_or_else(|| "pca_all".to_string(), |l| format!("pca_layer{l}"));
            out.push((name, pca.transform(x.view())?));
        }
        let all = self.features(None);
        let m = all.nrows().min(max_tsne);
        let sub = all.slice(ndarray::s![..m, ..]);
        let emb = crate::embed::tsne(sub, tsne)?;
        let trust = crate::embed::trustworthiness(sub, emb.view(), 5)?;
        out.push(("tsne_all".to_string(), emb));
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
    let max_id = train
        .term_ids
        .iter()
        .chain(test.term_ids.iter())
        .copied()
        .max()
        .unwrap_or(0);
    // Terms present in some but not all training problems (a probe needs both classes) and in
    // some held-out problem (F1 needs a positive).
    let scored: Vec<(i64, Array1<bool>, Array1<bool>)> = (0..=max_id)
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

/// `term_decoding.csv`: the columns `layer,ridge_r2,f1_mean,f1_base_rate,f1_shuffled,n_terms`,
/// one row per layer and `all`.
pub fn term_decoding_csv(rows: &[TermDecodingRow]) -> String {
    let mut s = String::from("layer,ridge_r2,f1_mean,f1_base_rate,f1_shuffled,n_terms\n");
    for r in rows {
        let layer = r.layer.map_or_else(|| "all".to_string(), |l| l.to_string());
        s.push_str(&format!(
            "{layer},{},{},{},{},{}\n",
            r.ridge_r2, r.f1_mean, r.f1_base_rate, r.f1_shuffled, r.n_terms
        ));
    }
    s
}
