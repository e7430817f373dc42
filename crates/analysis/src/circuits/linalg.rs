//! Small dense linear-algebra helpers shared by the circuits modules: conversions between ndarray
//! and nalgebra, thin QR, SVD and eigenvalues of general real matrices. Products run in ndarray
//! (`matrixmultiply`); decompositions in nalgebra.

use nalgebra::DMatrix;
use ndarray::{s, Array1, Array2, ArrayBase, ArrayView2, Data, Ix2};

use super::Real;
use crate::error::{AnalysisError, Result};

/// Copies an ndarray matrix (any element accepted as input) into an `f64` nalgebra matrix.
pub(crate) fn to_na<S>(a: &ArrayBase<S, Ix2>) -> DMatrix<f64>
where
    S: Data,
    S::Elem: Real,
{
    let (r, c) = a.dim();
    DMatrix::from_fn(r, c, |i, j| a[[i, j]].into())
}

/// Copies an nalgebra matrix into an ndarray matrix.
pub(crate) fn from_na(m: &DMatrix<f64>) -> Array2<f64> {
    Array2::from_shape_fn((m.nrows(), m.ncols()), |(i, j)| m[(i, j)])
}

/// Converts any accepted 2-D input to an owned `f64` array.
pub(crate) fn to_f64<S>(a: &ArrayBase<S, Ix2>) -> Array2<f64>
where
    S: Data,
    S::Elem: Real,
{
    a.mapv(|x| x.into())
}

/// Rows converted to `f64` at a time by the block-wise products below (memory: block x width).
const BLOCK: usize = 4096;

/// `x m` with `x` [n, p] of any accepted element and `m` [p, q], converting `x` to `f64` in row
/// blocks so that no full `f64` copy of a `[vocab, D]` embedding is made.
pub(crate) fn dot_rows_f64<S>(x: &ArrayBase<S, Ix2>, m: ArrayView2<f64>) -> Array2<f64>
where
    S: Data,
    S::Elem: Real,
{
    let n = x.nrows();
    let mut out = Array2::zeros((n, m.ncols()));
    for start in (0..n).step_by(BLOCK) {
        let end = (start + BLOCK).min(n);
        let rows = to_f64(&x.slice(s![start..end, ..]));
        out.slice_mut(s![start..end, ..]).assign(&rows.dot(&m));
    }
    out
}

/// `m x` with `m` [q, p] and `x` [p, n] of any accepted element, converting `x` in column blocks.
pub(crate) fn dot_cols_f64<S>(m: ArrayView2<f64>, x: &ArrayBase<S, Ix2>) -> Array2<f64>
where
    S: Data,
    S::Elem: Real,
{
    let n = x.ncols();
    let mut out = Array2::zeros((m.nrows(), n));
    for start in (0..n).step_by(BLOCK) {
        let end = (start + BLOCK).min(n);
        let cols = to_f64(&x.slice(s![.., start..end]));
        out.slice_mut(s![.., start..end]).assign(&m.dot(&cols));
    }
    out
}

/// `u e` with `u` [p, n] and `e` [n, q] (e.g. `W_U W_E` [D, D] over the vocabulary), summed over
/// blocks of the inner dimension `n`.
pub(crate) fn inner_blocks_f64<S1, S2>(
    u: &ArrayBase<S1, Ix2>,
    e: &ArrayBase<S2, Ix2>,
) -> Array2<f64>
where
    S1: Data,
    S1::Elem: Real,
    S2: Data,
    S2::Elem: Real,
{
    let n = u.ncols();
    let mut out = Array2::zeros((u.nrows(), e.ncols()));
    for start in (0..n).step_by(BLOCK) {
        let end = (start + BLOCK).min(n);
        let a = to_f64(&u.slice(s![.., start..end]));
        let b = to_f64(&e.slice(s![start..end, ..]));
        out += &a.dot(&b);
    }
    out
}

/// Fails with [`AnalysisError::NonFinite`] if `a` holds NaN or infinite values.
pub(crate) fn check_finite<S, D>(a: &ArrayBase<S, D>, name: &str) -> Result<()>
where
    S: Data,
    S::Elem: Real,
    D: ndarray::Dimension,
{
    if a.iter().all(|&x| Into::<f64>::into(x).is_finite()) {
        Ok(())
    } else {
        Err(AnalysisError::NonFinite(name.to_string()))
    }
}

/// Thin QR of `a` [l, m]: `Q` [l, k] with orthonormal columns and `R` [k, m], k = min(l, m),
/// with `a = Q R` (Householder QR of nalgebra).
pub(crate) fn thin_qr(a: ArrayView2<f64>) -> (Array2<f64>, Array2<f64>) {
    let qr = to_na(&a).qr();
    (from_na(&qr.q()), from_na(&qr.r()))
}

/// The `R` factor [min(l, m), m] of a thin QR of `a` [l, m], so that `R^T R = a^T a`: the small
/// "square root" through which `||a X||_F = ||R X||_F` for any `X`.
pub(crate) fn qr_r(a: ArrayView2<f64>) -> Array2<f64> {
    from_na(&to_na(&a).qr().r())
}

/// Thin SVD of a small dense matrix `a` [p, q]: `U` [p, k], `s` `[k]` descending, `V` [q, k],
/// k = min(p, q), `a = U diag(s) V^T`.
///
/// # Errors
/// [`AnalysisError::Numerical`] if the iteration does not converge; [`AnalysisError::NonFinite`]
/// if `a` holds NaN or infinite values.
pub(crate) fn svd_small(a: ArrayView2<f64>) -> Result<(Array2<f64>, Array1<f64>, Array2<f64>)> {
    check_finite(&a, "matrix passed to the SVD")?;
    let (p, q) = a.dim();
    let k = p.min(q);
    if k == 0 {
        return Ok((
            Array2::zeros((p, 0)),
            Array1::zeros(0),
            Array2::zeros((q, 0)),
        ));
    }
    let svd = to_na(&a)
        .try_svd(true, true, f64::EPSILON, 100_000)
        .ok_or_else(|| {
            AnalysisError::Numerical(format!("SVD of a {p}x{q} matrix did not converge"))
        })?;
    let (u, v_t) = match (svd.u.as_ref(), svd.v_t.as_ref()) {
        (Some(u), Some(v_t)) => (from_na(u), from_na(v_t)),
        _ => {
            return Err(AnalysisError::Numerical(
                "SVD returned no singular vectors".into(),
            ))
        }
    };
    let s = Array1::from_iter(svd.singular_values.iter().copied());
    // nalgebra's `try_svd` sorts in descending order already; keep the invariant explicit.
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&i, &j| s[j].total_cmp(&s[i]));
    let u = Array2::from_shape_fn((p, k), |(i, c)| u[[i, order[c]]]);
    let v = Array2::from_shape_fn((q, k), |(i, c)| v_t[[order[c], i]]);
    let s = Array1::from_iter(order.iter().map(|&i| s[i]));
    Ok((u, s, v))
}

/// Eigenvalues (re, im) of a general real square matrix, through nalgebra's real Schur form. The
/// eigenvalues are read from the quasi-triangular factor here (1x1 and 2x2 diagonal blocks) rather
/// than with `Schur::complex_eigenvalues`, which returns NaN for a 2x2 block whose discriminant is
/// not negative (nalgebra issue #655). If the iteration does not converge on `m`, it is retried on
/// `m^T` (same eigenvalues, different iteration path) before giving up.
///
/// # Errors
/// [`AnalysisError::Shape`] if `m` is not square; [`AnalysisError::NonFinite`] on NaN/inf input;
/// [`AnalysisError::Numerical`] if neither Schur iteration converges.
pub(crate) fn eig_general(m: ArrayView2<f64>) -> Result<(Vec<f64>, Vec<f64>)> {
    let (r, c) = m.dim();
    if r != c {
        return Err(AnalysisError::Shape(format!(
            "eigenvalues need a square matrix, got {r}x{c}"
        )));
    }
    check_finite(&m, "matrix passed to the eigenvalue solver")?;
    if r == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let max_iter = 1000 * r.max(10);
    let schur = to_na(&m)
        .try_schur(f64::EPSILON, max_iter)
        .or_else(|| to_na(&m.t()).try_schur(f64::EPSILON, max_iter))
        .ok_or_else(|| {
            AnalysisError::Numerical(format!(
                "real Schur decomposition of a {r}x{r} matrix did not converge"
            ))
        })?;
    let (_, t) = schur.unpack();
    let n = r;
    let mut re = Vec::with_capacity(n);
    let mut im = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        if i + 1 < n && t[(i + 1, i)] != 0.0 {
            let (a, b, cc, d) = (t[(i, i)], t[(i, i + 1)], t[(i + 1, i)], t[(i + 1, i + 1)]);
            let half_tr = 0.5 * (a + d);
            let half_diff = 0.5 * (a - d);
            let disc = half_diff * half_diff + b * cc;
            if disc >= 0.0 {
                let s = disc.sqrt();
                // Stable pair: the larger-magnitude root directly, the other through the determinant.
                let big = if half_tr >= 0.0 {
                    half_tr + s
                } else {
                    half_tr - s
                };
                let det = a * d - b * cc;
                let small = if big != 0.0 { det / big } else { half_tr - s };
                re.extend([big, small]);
                im.extend([0.0, 0.0]);
            } else {
                let s = (-disc).sqrt();
                re.extend([half_tr, half_tr]);
                im.extend([s, -s]);
            }
            i += 2;
        } else {
            re.push(t[(i, i)]);
            im.push(0.0);
            i += 1;
        }
    }
    Ok((re, im))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn eig_rotation_scaling_is_complex_pair() {
        // 2 * rotation by 30 degrees: eigenvalues 2 e^{+-i pi/6}.
        let (c, s) = (3f64.sqrt(), 1.0);
        let m = array![[c, -s], [s, c]];
        let (re, im) = eig_general(m.view()).unwrap();
        let mut pairs: Vec<(f64, f64)> = re.into_iter().zip(im).collect();
        pairs.sort_by(|a, b| b.1.total_cmp(&a.1));
        assert!((pairs[0].0 - c).abs() < 1e-12 && (pairs[0].1 - 1.0).abs() < 1e-12);
        assert!((pairs[1].0 - c).abs() < 1e-12 && (pairs[1].1 + 1.0).abs() < 1e-12);
    }

    #[test]
    fn eig_of_nalgebra_issue_655_matrix_is_finite() {
        let m = array![[2.5000002, -1.4999999], [-1.4999999, 2.4999998]];
        let (mut re, im) = eig_general(m.view()).unwrap();
        re.sort_by(f64::total_cmp);
        assert!(im.iter().all(|&x| x == 0.0));
        // Symmetric matrix: eigenvalues 2.5 +- sqrt(1e-14 + 1.4999999^2).
        let s = (0.0000002f64.powi(2) + 1.4999999f64.powi(2)).sqrt();
        assert!((re[0] - (2.5 - s)).abs() < 1e-9, "{re:?}");
        assert!((re[1] - (2.5 + s)).abs() < 1e-9, "{re:?}");
    }

    #[test]
    fn svd_small_reconstructs_and_sorts() {
        let a = array![[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]];
        let (u, s, v) = svd_small(a.view()).unwrap();
        assert_eq!((u.dim(), s.len(), v.dim()), ((2, 2), 2, (3, 2)));
        assert!(s[0] >= s[1]);
        let rec = u.dot(&Array2::from_diag(&s)).dot(&v.t());
        assert!((&rec - &a).iter().all(|x| x.abs() < 1e-12));
    }

    #[test]
    fn block_products_cross_block_boundaries() {
        // 2 * BLOCK + 5 rows: three blocks, the last one partial.
        let n = 2 * BLOCK + 5;
        let x = Array2::from_shape_fn((n, 3), |(i, j)| ((i * 7 + j * 3) % 11) as f32 - 5.0);
        let m = array![[1.0, -2.0], [0.5, 0.0], [0.25, 3.0]];
        let got = dot_rows_f64(&x, m.view());
        let xt = x.t().to_owned();
        let got_cols = dot_cols_f64(m.t(), &xt);
        let inner = inner_blocks_f64(&xt, &x);
        let mut want_inner = Array2::<f64>::zeros((3, 3));
        for i in 0..n {
            for a in 0..2 {
                let want: f64 = (0..3).map(|k| f64::from(x[[i, k]]) * m[[k, a]]).sum();
                assert_eq!(got[[i, a]], want);
                assert_eq!(got_cols[[a, i]], want);
            }
            for a in 0..3 {
                for b in 0..3 {
                    want_inner[[a, b]] += f64::from(x[[i, a]]) * f64::from(x[[i, b]]);
                }
            }
        }
        assert!((&inner - &want_inner).iter().all(|d| d.abs() < 1e-9));
    }

    #[test]
    fn qr_r_preserves_gram() {
        let a = array![
            [1.0, 2.0],
            [3.0, -1.0],
            [0.5, 0.25],
            [2.0, 2.0],
            [-1.0, 0.0]
        ];
        let r = qr_r(a.view());
        assert_eq!(r.dim(), (2, 2));
        let g1 = a.t().dot(&a);
        let g2 = r.t().dot(&r);
        assert!((&g1 - &g2).iter().all(|x| x.abs() < 1e-12));
        let (q, r2) = thin_qr(a.view());
        assert_eq!(q.dim(), (5, 2));
        assert!((&q.dot(&r2) - &a).iter().all(|x| x.abs() < 1e-12));
    }
}
