//! Exact principal component analysis through the covariance matrix.
//!
//! Method: centre the data, form the sample covariance `C = Xc^T Xc / (n - 1)`, and take its
//! symmetric eigendecomposition with nalgebra's `SymmetricEigen` (Householder tridiagonalisation
//! and implicit QR). Eigenvalues are the explained variances (scikit-learn's `PCA.explained_variance_`,
//! which also divides by `n - 1`), sorted in decreasing order; tiny negative eigenvalues from
//! rounding on rank-deficient data are clamped to 0. Components follow scikit-learn's sign
//! convention (`svd_flip(u_based_decision=False)`): the entry of largest absolute value of every
//! component is positive.
//!
//! Reproducible to the last bit on every machine: the means, the covariance and the projections
//! are plain loops in a fixed order, and the eigensolver runs on plain loops too. ndarray's `dot`
//! (the `matrixmultiply` crate) is avoided on purpose: it picks its kernel by the CPU's features
//! (AVX-512, FMA, AVX) at run time, and the kernels round differently, so the last digits of a PCA
//! then depend on the machine; `linfa_linalg::eigh` was dropped for the same reason (its
//! tridiagonalisation calls `general_mat_mul`).
//!
//! linfa-reduction's `Pca` is not used: it panicked on data with a few dominant directions and
//! scales its explained variance by the number of components.
//! Used for `docs/spec/latent-codes.md`, analysis 1 (paper Figure 5).

use nalgebra::{DMatrix, SymmetricEigen};
use ndarray::{Array1, Array2, ArrayView2, Axis, Slice};

use crate::error::{AnalysisError, Result};

/// Hyperparameters of [`Pca`]: the number of components kept for projection.
///
/// Explained-variance ratios are always reported for ALL components, not only the kept ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcaParams {
    n_components: usize,
}

impl PcaParams {
    /// Keeps `n_components` components for [`Pca::transform`].
    pub fn new(n_components: usize) -> Self {
        Self { n_components }
    }

    /// The number of components kept.
    pub fn n_components(&self) -> usize {
        self.n_components
    }

    /// Checks the hyperparameters on their own.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if `n_components` is 0.
    pub fn check(&self) -> Result<()> {
        if self.n_components == 0 {
            return Err(AnalysisError::InvalidInput(
                "PCA: n_components must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Fits the PCA to `x`.
    ///
    /// # Shapes
    /// `x`: `[N, D]` with N >= 2 and 1 <= n_components <= D.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] for fewer than 2 samples, no features or
    /// `n_components > D`; [`AnalysisError::NonFinite`] if `x` holds NaN or infinity;
    /// [`AnalysisError::Numerical`] if the covariance overflows or the eigendecomposition fails.
    pub fn fit(&self, x: ArrayView2<'_, f64>) -> Result<Pca> {
        self.check()?;
        let (n, d) = x.dim();
        if n < 2 {
            return Err(AnalysisError::InvalidInput(format!(
                "PCA needs at least 2 samples, got {n}"
            )));
        }
        if d == 0 {
            return Err(AnalysisError::InvalidInput(
                "PCA input has no features".into(),
            ));
        }
        if self.n_components > d {
            return Err(AnalysisError::InvalidInput(format!(
                "PCA: n_components = {} exceeds the number of features {d}",
                self.n_components
            )));
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(AnalysisError::NonFinite("PCA input".into()));
        }
        let mean = column_means(x);
        let cov = covariance(x, &mean);
        if cov.iter().any(|v| !v.is_finite()) {
            return Err(AnalysisError::Numerical(
                "PCA: the covariance matrix overflowed (values too large)".into(),
            ));
        }
        let eigen = SymmetricEigen::try_new(
            DMatrix::from_fn(d, d, |i, j| cov[[i, j]]),
            f64::EPSILON,
            EIGEN_MAX_ITERATIONS,
        )
        .ok_or_else(|| {
            AnalysisError::Numerical(format!(
                "PCA eigendecomposition did not converge in {EIGEN_MAX_ITERATIONS} iterations"
            ))
        })?;
        let (values, vectors) = (&eigen.eigenvalues, &eigen.eigenvectors);
        if values.iter().any(|v| !v.is_finite()) || vectors.iter().any(|v| !v.is_finite()) {
            return Err(AnalysisError::Numerical(
                "PCA eigendecomposition returned non-finite values".into(),
            ));
        }
        let mut order: Vec<usize> = (0..d).collect();
        order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));

        let explained_variance: Array1<f64> = order.iter().map(|&i| values[i].max(0.0)).collect();
        let mut all_components = Array2::<f64>::zeros((d, d));
        for (row, &i) in order.iter().enumerate() {
            let v: Array1<f64> = vectors.column(i).iter().copied().collect();
            // scikit-learn's svd_flip on rows of Vt: the largest |entry| is positive
            let mut best = 0;
            for j in 1..d {
                if v[j].abs() > v[best].abs() {
                    best = j;
                }
            }
            let sign = if v[best] < 0.0 { -1.0 } else { 1.0 };
            all_components.row_mut(row).assign(&(&v * sign));
        }
        let total: f64 = explained_variance.sum();
        let explained_variance_ratio = if total > 0.0 {
            &explained_variance / total
        } else {
            Array1::zeros(d)
        };
        let components = all_components
            .slice_axis(Axis(0), Slice::from(..self.n_components))
            .to_owned();
        Ok(Pca {
            mean,
            components,
            all_components,
            explained_variance,
            explained_variance_ratio,
            n_samples: n,
        })
    }
}

/// Iteration cap of the implicit-QR eigensolver (it converges in a few sweeps per eigenvalue).
const EIGEN_MAX_ITERATIONS: usize = 100_000;

/// Column means, summed row by row in order.
///
/// # Shapes
/// `x`: `[N, D]` with N >= 1; returns `[D]`.
fn column_means(x: ArrayView2<'_, f64>) -> Array1<f64> {
    let mut sum = Array1::<f64>::zeros(x.ncols());
    for row in x.rows() {
        for (s, &v) in sum.iter_mut().zip(row.iter()) {
            *s += v;
        }
    }
    sum / x.nrows() as f64
}

/// The sample covariance `Xc^T Xc / (n - 1)` of the centred data, exactly symmetric: every entry
/// of the upper triangle is a sum over the rows in order, mirrored to the lower one.
///
/// # Shapes
/// `x`: `[N, D]` with N >= 2, `mean`: `[D]`; returns `[D, D]`.
fn covariance(x: ArrayView2<'_, f64>, mean: &Array1<f64>) -> Array2<f64> {
    let d = x.ncols();
    let mut acc = vec![0.0f64; d * d];
    let mut centred = vec![0.0f64; d];
    for row in x.rows() {
        for (c, (&v, &m)) in centred.iter_mut().zip(row.iter().zip(mean.iter())) {
            *c = v - m;
        }
        for i in 0..d {
            let xi = centred[i];
            let out = &mut acc[i * d + i..(i + 1) * d];
            for (o, &xj) in out.iter_mut().zip(&centred[i..]) {
                *o += xi * xj;
            }
        }
    }
    let scale = 1.0 / (x.nrows() as f64 - 1.0);
    let mut cov = Array2::<f64>::zeros((d, d));
    for i in 0..d {
        for j in i..d {
            let v = acc[i * d + j] * scale;
            cov[[i, j]] = v;
            cov[[j, i]] = v;
        }
    }
    cov
}

/// A fitted PCA.
#[derive(Debug, Clone, PartialEq)]
pub struct Pca {
    mean: Array1<f64>,
    components: Array2<f64>,
    all_components: Array2<f64>,
    explained_variance: Array1<f64>,
    explained_variance_ratio: Array1<f64>,
    n_samples: usize,
}

impl Pca {
    /// Hyperparameters keeping `n_components` components (the paper projects to 2).
    pub fn params(n_components: usize) -> PcaParams {
        PcaParams::new(n_components)
    }

    /// Projects `x` onto the kept components: `(x - mean) V_k^T`.
    ///
    /// # Shapes
    /// `x`: `[M, D]` (D as in the fit); returns `[M, n_components]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if D differs from the fit; [`AnalysisError::NonFinite`] if `x`
    /// holds NaN or infinity.
    pub fn transform(&self, x: ArrayView2<'_, f64>) -> Result<Array2<f64>> {
        if x.ncols() != self.mean.len() {
            return Err(AnalysisError::Shape(format!(
                "PCA was fitted on {} features, transform got {}",
                self.mean.len(),
                x.ncols()
            )));
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(AnalysisError::NonFinite("PCA transform input".into()));
        }
        let (m, k) = (x.nrows(), self.components.nrows());
        let mut out = Array2::<f64>::zeros((m, k));
        for (r, row) in x.rows().into_iter().enumerate() {
            for c in 0..k {
                let comp = self.components.row(c);
                let mut acc = 0.0;
                for j in 0..row.len() {
                    acc += (row[j] - self.mean[j]) * comp[j];
                }
                out[[r, c]] = acc;
            }
        }
        Ok(out)
    }

    /// Column means of the training data. # Shapes: `[D]`.
    pub fn mean(&self) -> &Array1<f64> {
        &self.mean
    }
    /// The kept components, one per row, unit norm. # Shapes: `[n_components, D]`.
    pub fn components(&self) -> &Array2<f64> {
        &self.components
    }
    /// All D components, one per row, in decreasing order of variance. # Shapes: `[D, D]`.
    pub fn all_components(&self) -> &Array2<f64> {
        &self.all_components
    }
    /// Variance along every component (divisor n - 1), decreasing. # Shapes: `[D]`.
    pub fn explained_variance(&self) -> &Array1<f64> {
        &self.explained_variance
    }
    /// Fraction of the total variance along every component (sums to 1; all zeros when the data
    /// have no variance at all). # Shapes: `[D]`.
    pub fn explained_variance_ratio(&self) -> &Array1<f64> {
        &self.explained_variance_ratio
    }
    /// Number of samples the PCA was fitted on.
    pub fn n_samples(&self) -> usize {
        self.n_samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn eigh_columns_are_eigenvectors_and_sorted() {
        let x = array![
            [1.0, 2.0, 0.5],
            [2.0, 1.0, -1.0],
            [0.0, 4.0, 2.0],
            [3.0, 3.0, 0.0],
            [1.5, -1.0, 1.0],
            [-2.0, 0.5, 0.3],
            [0.7, 0.1, 0.9]
        ];
        let pca = Pca::params(2).fit(x.view()).unwrap();
        // reference covariance by plain loops
        let n = x.nrows() as f64;
        let mean: Vec<f64> = (0..3).map(|j| x.column(j).sum() / n).collect();
        let mut cov = [[0.0; 3]; 3];
        for r in x.rows() {
            for a in 0..3 {
                for b in 0..3 {
                    cov[a][b] += (r[a] - mean[a]) * (r[b] - mean[b]) / (n - 1.0);
                }
            }
        }
        let var = pca.explained_variance();
        assert!(var[0] >= var[1] && var[1] >= var[2]);
        let trace: f64 = (0..3).map(|a| cov[a][a]).sum();
        assert!((var.sum() - trace).abs() < 1e-10);
        for (c, comp) in pca.all_components().rows().into_iter().enumerate() {
            for a in 0..3 {
                let cv: f64 = (0..3).map(|b| cov[a][b] * comp[b]).sum();
                assert!((cv - var[c] * comp[a]).abs() < 1e-9);
            }
            let big = comp
                .iter()
                .cloned()
                .fold(0.0_f64, |m, v| if v.abs() > m.abs() { v } else { m });
            assert!(big > 0.0);
        }
        let proj = pca.transform(x.view()).unwrap();
        assert_eq!(proj.dim(), (7, 2));
        // projected variance along component 0 equals its eigenvalue
        let v0: f64 = proj.column(0).iter().map(|p| p * p).sum::<f64>() / (n - 1.0);
        assert!((v0 - var[0]).abs() < 1e-9);
    }

    #[test]
    fn degenerate_inputs() {
        // all columns constant: zero variance, ratios zero, projections zero, no panic
        let x = Array2::from_elem((5, 3), 2.5);
        let pca = Pca::params(2).fit(x.view()).unwrap();
        assert!(pca.explained_variance_ratio().iter().all(|&r| r == 0.0));
        assert!(pca.transform(x.view()).unwrap().iter().all(|&p| p == 0.0));
        // a single sample, NaN, too many components, wrong width
        assert!(Pca::params(1).fit(Array2::zeros((1, 3)).view()).is_err());
        let mut bad = Array2::<f64>::zeros((4, 3));
        bad[[1, 1]] = f64::NAN;
        assert!(matches!(
            Pca::params(1).fit(bad.view()),
            Err(AnalysisError::NonFinite(_))
        ));
        assert!(Pca::params(4).fit(Array2::zeros((6, 3)).view()).is_err());
        assert!(Pca::params(0).fit(Array2::zeros((6, 3)).view()).is_err());
        assert!(pca.transform(Array2::zeros((2, 4)).view()).is_err());
    }
}
