//! Cosine similarity between the mean latent codes of each label (`docs/spec/latent-codes.md`,
//! analysis 3; the paper's 8 x 8 rule-by-rule matrix, where addition and subtraction share nearly
//! the same code).
//!
//! Conventions: a label listed in `label_set` but with no samples has a NaN mean, and a NaN row
//! and column in the similarity matrix (it is kept so that matrices of different sets line up).
//! A mean code of zero norm has cosine 0 with everything, itself included (scikit-learn's
//! `cosine_similarity` convention).

use std::collections::BTreeMap;

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use crate::decode::check_finite;
use crate::error::{AnalysisError, Result};

/// Mean code per label and the cosine similarity between them.
#[derive(Debug, Clone, PartialEq)]
pub struct MeanCodeSimilarity {
    /// The labels, in the order of the rows and columns.
    pub labels: Vec<i64>,
    /// Number of samples of every label. # Shapes: `[C]`.
    pub counts: Vec<usize>,
    /// Mean code of every label (NaN rows for labels without samples). # Shapes: `[C, D]`.
    pub means: Array2<f64>,
    /// Cosine similarity of the mean codes. # Shapes: `[C, C]`, symmetric.
    pub cosine: Array2<f64>,
}

/// Computes the mean code of every label and the cosine similarity between them.
///
/// `label_set`: the labels (and their order) to report, e.g. all 8 rules so that the matrix is
/// always 8 x 8; `None` uses the labels present, sorted. Every label of `labels` must be in the
/// set.
///
/// # Shapes
/// `x`: `[N, D]`; `labels`: `[N]`; returns means `[C, D]` and cosine `[C, C]`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for empty input, duplicates in `label_set` or a sample whose
/// label is not in `label_set`; [`AnalysisError::Shape`] for mismatched lengths;
/// [`AnalysisError::NonFinite`] for NaN/inf.
pub fn mean_code_similarity(
    x: ArrayView2<'_, f64>,
    labels: ArrayView1<'_, i64>,
    label_set: Option<&[i64]>,
) -> Result<MeanCodeSimilarity> {
    let (n, d) = x.dim();
    if n == 0 || d == 0 {
        return Err(AnalysisError::InvalidInput(format!(
            "similarity needs a non-empty matrix, got [{n}, {d}]"
        )));
    }
    if labels.len() != n {
        return Err(AnalysisError::Shape(format!(
            "similarity: {n} samples but {} labels",
            labels.len()
        )));
    }
    check_finite(x, "similarity input")?;
    let order: Vec<i64> = match label_set {
        Some(set) => set.to_vec(),
        None => {
            let mut v = labels.to_vec();
            v.sort_unstable();
            v.dedup();
            v
        }
    };
    let mut index = BTreeMap::new();
    for (i, &l) in order.iter().enumerate() {
        if index.insert(l, i).is_some() {
            return Err(AnalysisError::InvalidInput(format!(
                "similarity: label {l} listed twice in the label set"
            )));
        }
    }
    let c = order.len();
    let mut sums = Array2::<f64>::zeros((c, d));
    let mut counts = vec![0usize; c];
    for (row, l) in x.rows().into_iter().zip(labels.iter()) {
        let Some(&i) = index.get(l) else {
            return Err(AnalysisError::InvalidInput(format!(
                "similarity: label {l} is not in the label set {order:?}"
            )));
        };
        let mut s = sums.row_mut(i);
        s += &row;
        counts[i] += 1;
    }
    let mut means = sums;
    for (mut row, &count) in means.rows_mut().into_iter().zip(counts.iter()) {
        if count == 0 {
            row.fill(f64::NAN);
        } else {
            row /= count as f64;
        }
    }
    let norms: Array1<f64> = means.rows().into_iter().map(|r| r.dot(&r).sqrt()).collect();
    let mut cosine = Array2::<f64>::zeros((c, c));
    for i in 0..c {
        for j in 0..c {
            cosine[[i, j]] = if counts[i] == 0 || counts[j] == 0 {
                f64::NAN
            } else if norms[i] == 0.0 || norms[j] == 0.0 {
                0.0
            } else {
                (means.row(i).dot(&means.row(j)) / (norms[i] * norms[j])).clamp(-1.0, 1.0)
            };
        }
    }
    Ok(MeanCodeSimilarity {
        labels: order,
        counts,
        means,
        cosine,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn means_and_cosines_by_hand() {
        let x = array![
            [1.0, 0.0, 0.0],
            [3.0, 0.0, 0.0],
            [0.0, 2.0, 0.0],
            [1.0, 1.0, 0.0],
            [0.0, 0.0, 0.0]
        ];
        let l = array![7, 7, 2, 5, 9];
        let sim = mean_code_similarity(x.view(), l.view(), Some(&[2, 5, 7, 9, 11])).unwrap();
        assert_eq!(sim.counts, vec![1, 1, 2, 1, 0]);
        assert_eq!(sim.means.row(2).to_vec(), vec![2.0, 0.0, 0.0]);
        let s = &sim.cosine;
        assert!((s[[0, 2]]).abs() < 1e-12); // (0,2,0) vs (2,0,0)
        assert!((s[[1, 2]] - 1.0 / 2f64.sqrt()).abs() < 1e-12);
        assert!((s[[1, 0]] - s[[0, 1]]).abs() < 1e-15);
        assert!((s[[2, 2]] - 1.0).abs() < 1e-12);
        assert_eq!(s[[3, 3]], 0.0); // zero mean code
        assert!(s[[4, 0]].is_nan() && s[[1, 4]].is_nan() && sim.means[[4, 0]].is_nan());
        // a label outside the set, duplicate set entries, mismatched lengths
        assert!(mean_code_similarity(x.view(), l.view(), Some(&[2, 5, 7])).is_err());
        assert!(mean_code_similarity(x.view(), l.view(), Some(&[2, 5, 7, 9, 9])).is_err());
        assert!(mean_code_similarity(x.view(), array![1, 2].view(), None).is_err());
        let auto = mean_code_similarity(x.view(), l.view(), None).unwrap();
        assert_eq!(auto.labels, vec![2, 5, 7, 9]);
    }
}
