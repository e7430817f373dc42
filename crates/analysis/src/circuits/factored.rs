//! A matrix kept as the product of two factors, `M = A B` with `A` [l, m] and `B` [m, r], after
//! TransformerLens `FactoredMatrix`. With a small inner dimension `m` (a head dimension), every
//! quantity below is computed through `m x m` matrices, so `M` ([vocab, vocab] for a full circuit)
//! is never materialised:
//!
//! - eigenvalues: the non-zero eigenvalues of `A B` are those of `B A` [m, m] (TransformerLens
//!   `FactoredMatrix.eigenvalues`);
//! - SVD: thin QR `A = Q_a R_a`, `B^T = Q_b R_b`, SVD of the middle `R_a R_b^T = U_m S V_m^T`, then
//!   `U = Q_a U_m`, `V = Q_b V_m` (TransformerLens uses thin SVDs of `A` and `B` instead of QR; the
//!   result is the same decomposition);
//! - Frobenius norm: `||A B||_F^2 = sum_ij (A^T A)_ij (B B^T)_ij`, from the two `m x m` Gram matrices.

use std::ops::Range;

use ndarray::{s, Array1, Array2, ArrayBase, ArrayView2, Data, Ix2};

use super::linalg::{check_finite, eig_general, svd_small, thin_qr, to_f64};
use super::Real;
use crate::error::{AnalysisError, Result};

/// A low-rank matrix `M = A B`, `A` [l, m], `B` [m, r], stored as its two factors in `f64`.
///
/// Source: TransformerLens `FactoredMatrix`; Elhage et al. (2021), "Transformer Circuits", on
/// reading the low-rank OV and QK circuits through their factors.
#[derive(Debug, Clone, PartialEq)]
pub struct FactoredMatrix {
    a: Array2<f64>,
    b: Array2<f64>,
}

/// Eigenvalues of a real matrix, as real and imaginary parts, sorted by descending modulus (ties:
/// larger real part, then larger imaginary part first; a complex pair appears as `+im` then `-im`).
#[derive(Debug, Clone, PartialEq)]
pub struct Eigenvalues {
    /// Real parts, `[n]`.
    pub re: Array1<f64>,
    /// Imaginary parts, `[n]`.
    pub im: Array1<f64>,
}

impl Eigenvalues {
    /// Builds sorted eigenvalues from unsorted real and imaginary parts of equal length.
    pub(crate) fn from_parts(re: Vec<f64>, im: Vec<f64>) -> Self {
        let mut pairs: Vec<(f64, f64)> = re.into_iter().zip(im).collect();
        pairs.sort_by(|x, y| {
            let mx = x.0.hypot(x.1);
            let my = y.0.hypot(y.1);
            my.total_cmp(&mx)
                .then(y.0.total_cmp(&x.0))
                .then(y.1.total_cmp(&x.1))
        });
        Eigenvalues {
            re: pairs.iter().map(|p| p.0).collect(),
            im: pairs.iter().map(|p| p.1).collect(),
        }
    }

    /// Number of eigenvalues.
    pub fn len(&self) -> usize {
        self.re.len()
    }

    /// Whether there are no eigenvalues.
    pub fn is_empty(&self) -> bool {
        self.re.is_empty()
    }

    /// Moduli `|lambda|`, `[n]`.
    pub fn moduli(&self) -> Array1<f64> {
        Array1::from_iter(self.re.iter().zip(self.im.iter()).map(|(r, i)| r.hypot(*i)))
    }

    /// Copying score `Re(sum lambda) / sum |lambda|`, in [-1, 1]: +1 when every eigenvalue is
    /// positive real (the circuit copies what it reads). Returns 0 when every eigenvalue is 0.
    ///
    /// Source: Elhage et al. (2021), "Summarizing OV/QK matrices" (eigenvalue analysis); the formula of
    /// the TransformerLens main demo (`eigenvalues.sum(-1).real / eigenvalues.abs().sum(-1)`).
    pub fn copying_score(&self) -> f64 {
        let total = self.moduli().sum();
        if total > 0.0 {
            self.re.sum() / total
        } else {
            0.0
        }
    }
}

/// Thin SVD of a [`FactoredMatrix`] `M` [l, r]: `M = U diag(s) V^T` with `k = min(l, m, r)`
/// singular values in descending order.
#[derive(Debug, Clone, PartialEq)]
pub struct FactoredSvd {
    /// Left singular vectors, [l, k], orthonormal columns.
    pub u: Array2<f64>,
    /// Singular values, `[k]`, descending, non-negative.
    pub s: Array1<f64>,
    /// Right singular vectors, [r, k], orthonormal columns (TransformerLens calls this `Vh`, but it
    /// holds `V`, not `V^T`).
    pub v: Array2<f64>,
}

impl FactoredMatrix {
    /// Builds `A B` from two factors (copied to `f64`).
    ///
    /// # Shapes
    /// `a` [l, m], `b` [m, r]; the matrix represented is [l, r].
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if `a.ncols() != b.nrows()`; [`AnalysisError::NonFinite`] if a
    /// factor holds NaN or infinite values.
    pub fn new<S1, S2>(a: &ArrayBase<S1, Ix2>, b: &ArrayBase<S2, Ix2>) -> Result<Self>
    where
        S1: Data,
        S1::Elem: Real,
        S2: Data,
        S2::Elem: Real,
    {
        Self::from_owned(to_f64(a), to_f64(b))
    }

    /// Builds `A B` from owned `f64` factors without copying.
    ///
    /// # Shapes
    /// `a` [l, m], `b` [m, r].
    ///
    /// # Errors
    /// As [`FactoredMatrix::new`].
    pub fn from_owned(a: Array2<f64>, b: Array2<f64>) -> Result<Self> {
        if a.ncols() != b.nrows() {
            return Err(AnalysisError::Shape(format!(
                "factored matrix: A is {:?} but B is {:?} (A's columns must equal B's rows)",
                a.dim(),
                b.dim()
            )));
        }
        check_finite(&a, "factor A")?;
        check_finite(&b, "factor B")?;
        Ok(FactoredMatrix { a, b })
    }

    /// The left factor `A` [l, m].
    pub fn a(&self) -> ArrayView2<'_, f64> {
        self.a.view()
    }

    /// The right factor `B` [m, r].
    pub fn b(&self) -> ArrayView2<'_, f64> {
        self.b.view()
    }

    /// Shape `(l, r)` of the represented matrix.
    pub fn shape(&self) -> (usize, usize) {
        (self.a.nrows(), self.b.ncols())
    }

    /// Inner dimension `m`.
    pub fn mdim(&self) -> usize {
        self.a.ncols()
    }

    /// The transpose `(A B)^T = B^T A^T`, kept factored.
    ///
    /// # Shapes
    /// [l, r] -> [r, l].
    pub fn transpose(&self) -> FactoredMatrix {
        FactoredMatrix {
            a: self.b.t().to_owned(),
            b: self.a.t().to_owned(),
        }
    }

    /// Right product `(A B) C`, kept factored: `A (B C)` when `r > m` (the inner dimension stays
    /// `m`), else `(A B) C` with inner dimension `r` (TransformerLens `FactoredMatrix.__matmul__`).
    ///
    /// # Shapes
    /// `c` [r, n] -> [l, n].
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if `c.nrows() != r`; [`AnalysisError::NonFinite`] on NaN/inf in `c`.
    pub fn matmul<S>(&self, c: &ArrayBase<S, Ix2>) -> Result<FactoredMatrix>
    where
        S: Data,
        S::Elem: Real,
    {
        let (_, r) = self.shape();
        if c.nrows() != r {
            return Err(AnalysisError::Shape(format!(
                "factored matmul: matrix is {:?}, right operand is {:?}",
                self.shape(),
                c.dim()
            )));
        }
        let c = to_f64(c);
        check_finite(&c, "right operand")?;
        if r > self.mdim() {
            Ok(FactoredMatrix {
                a: self.a.clone(),
                b: self.b.dot(&c),
            })
        } else {
            Ok(FactoredMatrix {
                a: self.a.dot(&self.b),
                b: c,
            })
        }
    }

    /// Left product `C (A B)`, kept factored: `(C A) B` when `l > m`, else `C (A B)`
    /// (TransformerLens `FactoredMatrix.__rmatmul__`).
    ///
    /// # Shapes
    /// `c` [n, l] -> [n, r].
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if `c.ncols() != l`; [`AnalysisError::NonFinite`] on NaN/inf in `c`.
    pub fn rmatmul<S>(&self, c: &ArrayBase<S, Ix2>) -> Result<FactoredMatrix>
    where
        S: Data,
        S::Elem: Real,
    {
        let (l, _) = self.shape();
        if c.ncols() != l {
            return Err(AnalysisError::Shape(format!(
                "factored rmatmul: left operand is {:?}, matrix is {:?}",
                c.dim(),
                self.shape()
            )));
        }
        let c = to_f64(c);
        check_finite(&c, "left operand")?;
        if l > self.mdim() {
            Ok(FactoredMatrix {
                a: c.dot(&self.a),
                b: self.b.clone(),
            })
        } else {
            Ok(FactoredMatrix {
                a: c,
                b: self.a.dot(&self.b),
            })
        }
    }

    /// Product of two factored matrices, `(A1 B1)(A2 B2) = ((A1 B1) A2) B2`, kept factored
    /// (TransformerLens: `(self @ other.A) @ other.B`).
    ///
    /// # Shapes
    /// [l, r] x [r, n] -> [l, n].
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if the inner shapes disagree.
    pub fn matmul_factored(&self, other: &FactoredMatrix) -> Result<FactoredMatrix> {
        self.matmul(&other.a)?.matmul(&other.b)
    }

    /// The small product `B A` [m, m] (requires `l == r`), whose eigenvalues are the non-zero
    /// eigenvalues of `A B`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if the matrix is not square.
    pub fn ba(&self) -> Result<Array2<f64>> {
        let (l, r) = self.shape();
        if l != r {
            return Err(AnalysisError::Shape(format!(
                "eigenvalues need a square factored matrix, got {l}x{r}"
            )));
        }
        Ok(self.b.dot(&self.a))
    }

    /// The `m` eigenvalues of `B A`, i.e. the eigenvalues of `A B` apart from its `l - m` extra
    /// zeros (TransformerLens `FactoredMatrix.eigenvalues`), sorted by descending modulus.
    ///
    /// # Shapes
    /// Returns `m` eigenvalues.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if the matrix is not square; [`AnalysisError::Numerical`] if the
    /// Schur iteration does not converge.
    pub fn eigenvalues(&self) -> Result<Eigenvalues> {
        let ba = self.ba()?;
        let (re, im) = eig_general(ba.view())?;
        Ok(Eigenvalues::from_parts(re, im))
    }

    /// Thin SVD through thin QRs of the factors and an SVD of the small middle matrix; see the module
    /// documentation.
    ///
    /// # Shapes
    /// `u` [l, k], `s` `[k]`, `v` [r, k], k = min(l, m, r).
    ///
    /// # Errors
    /// [`AnalysisError::Numerical`] if the middle SVD does not converge.
    pub fn svd(&self) -> Result<FactoredSvd> {
        let (qa, ra) = thin_qr(self.a.view()); // [l, ka], [ka, m]
        let (qb, rb) = thin_qr(self.b.t()); // [r, kb], [kb, m]
        let middle = ra.dot(&rb.t()); // [ka, kb]
        let (um, s, vm) = svd_small(middle.view())?;
        Ok(FactoredSvd {
            u: qa.dot(&um),
            s,
            v: qb.dot(&vm),
        })
    }

    /// Singular values only, [min(l, m, r)], descending.
    ///
    /// # Errors
    /// As [`FactoredMatrix::svd`].
    pub fn singular_values(&self) -> Result<Array1<f64>> {
        Ok(self.svd()?.s)
    }

    /// Frobenius norm `||A B||_F`, from the Gram matrices `A^T A` and `B B^T` [m, m]:
    /// `||A B||_F^2 = sum_ij (A^T A)_ij (B B^T)_ij` (equal to the sum of squared singular values).
    pub fn frobenius_norm(&self) -> f64 {
        let ga = self.a.t().dot(&self.a);
        let gb = self.b.dot(&self.b.t());
        (ga * gb).sum().max(0.0).sqrt()
    }

    /// `S V^T` [k, r]: the smaller matrix with the same left products' norms as `A B`, since
    /// `||X A B||_F = ||X U S V^T||_F` (TransformerLens `collapse_l`).
    ///
    /// # Errors
    /// As [`FactoredMatrix::svd`].
    pub fn collapse_l(&self) -> Result<Array2<f64>> {
        let FactoredSvd { s, v, .. } = self.svd()?;
        Ok(Array2::from_shape_fn((s.len(), v.nrows()), |(i, j)| {
            s[i] * v[[j, i]]
        }))
    }

    /// `U S` [l, k] (TransformerLens `collapse_r`).
    ///
    /// # Errors
    /// As [`FactoredMatrix::svd`].
    pub fn collapse_r(&self) -> Result<Array2<f64>> {
        let FactoredSvd { u, s, .. } = self.svd()?;
        Ok(u * &s)
    }

    /// Rows `rows` of the dense product, `A[rows] B` [rows.len(), r]; use blocks of rows to stream
    /// through a large matrix.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if the range leaves `0..l`.
    pub fn rows(&self, rows: Range<usize>) -> Result<Array2<f64>> {
        let (l, _) = self.shape();
        if rows.start > rows.end || rows.end > l {
            return Err(AnalysisError::InvalidInput(format!(
                "row range {rows:?} outside 0..{l} of a factored matrix"
            )));
        }
        Ok(self.a.slice(s![rows, ..]).dot(&self.b))
    }

    /// The dense product `A B` [l, r]. Only for small matrices: a full circuit through the
    /// embedding is [vocab, vocab].
    pub fn to_dense(&self) -> Array2<f64> {
        self.a.dot(&self.b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn shapes_and_errors() {
        let a = Array2::<f64>::zeros((5, 2));
        let b = Array2::<f64>::zeros((3, 4));
        assert!(matches!(
            FactoredMatrix::new(&a, &b),
            Err(AnalysisError::Shape(_))
        ));
        let b = Array2::<f32>::ones((2, 4));
        let m = FactoredMatrix::new(&a, &b).unwrap();
        assert_eq!((m.shape(), m.mdim()), ((5, 4), 2));
        assert_eq!(m.transpose().shape(), (4, 5));
        assert!(m.eigenvalues().is_err());
        assert!(m.rows(3..6).is_err());
        let mut bad = Array2::<f64>::zeros((5, 2));
        bad[[1, 1]] = f64::NAN;
        assert!(matches!(
            FactoredMatrix::new(&bad, &b),
            Err(AnalysisError::NonFinite(_))
        ));
    }

    #[test]
    fn copying_score_of_known_spectra() {
        let e = Eigenvalues::from_parts(vec![2.0, 1.0, 1.0], vec![0.0, 1.0, -1.0]);
        // Sorted by modulus: 2, then the pair 1 +- i (modulus sqrt 2), +im first.
        assert_eq!(e.re.to_vec(), vec![2.0, 1.0, 1.0]);
        assert_eq!(e.im.to_vec(), vec![0.0, 1.0, -1.0]);
        let expect = 4.0 / (2.0 + 2.0 * 2f64.sqrt());
        assert!((e.copying_score() - expect).abs() < 1e-15);
        let neg = Eigenvalues::from_parts(vec![-3.0], vec![0.0]);
        assert_eq!(neg.copying_score(), -1.0);
        let zero = Eigenvalues::from_parts(vec![0.0, 0.0], vec![0.0, 0.0]);
        assert_eq!(zero.copying_score(), 0.0);
    }

    #[test]
    fn matmul_keeps_small_inner_dimension() {
        let a = array![[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
        let b = array![[1.0, 2.0, 3.0], [0.0, 1.0, -1.0]];
        let m = FactoredMatrix::new(&a, &b).unwrap();
        let c = array![
            [1.0, 0.0, 2.0, 1.0],
            [0.0, 1.0, 0.0, 1.0],
            [1.0, 1.0, 1.0, 0.0]
        ];
        let mc = m.matmul(&c).unwrap();
        assert_eq!(mc.mdim(), 2);
        let dense = a.dot(&b).dot(&c);
        assert!((&mc.to_dense() - &dense).iter().all(|x| x.abs() < 1e-12));
        let cm = m.rmatmul(&c.t()).unwrap();
        assert_eq!(cm.mdim(), 2);
        let dense = c.t().dot(&a).dot(&b);
        assert!((&cm.to_dense() - &dense).iter().all(|x| x.abs() < 1e-12));
    }
}
