//! Clustering of latent codes: k-means (scikit-learn's greedy k-means++ seeds and Lloyd
//! iterations on blocked float32 GEMM distances, `cluster/lloyd.rs`) with k = number of labels, and the
//! partition-agreement and separation scores linfa lacks: adjusted Rand index, normalised mutual
//! information and the silhouette score on blocked float64 GEMM distances (`cluster/silhouette.rs`)
//! (`docs/spec/latent-codes.md`, analysis 4).
//!
//! The scores follow scikit-learn's definitions and special cases:
//! - ARI: `adjusted_rand_score`, Hubert & Arabie (1985), computed from the pair confusion matrix;
//! - NMI: `normalized_mutual_info_score` with the arithmetic-mean normalisation (the default),
//!   natural logarithms;
//! - silhouette: `silhouette_score` with the Euclidean metric, Rousseeuw (1987); a point alone in
//!   its cluster scores 0. Exact silhouette costs O(N^2 D), so [`cluster_against_labels`] scores
//!   a seeded uniform subsample of at most `silhouette_max_points` points (5,000 by default) when
//!   N is larger, and reports how many points it used.

mod lloyd;
mod silhouette;

pub(crate) use lloyd::{Codes32, CHUNK};

use std::collections::BTreeMap;

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis, CowArray};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::Serialize;

use crate::decode::check_finite;
use crate::error::{AnalysisError, Result};
use crate::kmeanspp::greedy_kmeans_plusplus;

/// Maps labels of any ordered type to dense indices 0..C (in ascending label order).
fn dense_labels<T: Ord + Clone>(labels: ArrayView1<'_, T>) -> (Vec<usize>, usize) {
    let mut map: BTreeMap<T, usize> = BTreeMap::new();
    for l in labels {
        map.entry(l.clone()).or_insert(0);
    }
    for (i, v) in map.values_mut().enumerate() {
        *v = i;
    }
    let dense = labels.iter().map(|l| map[l]).collect();
    (dense, map.len())
}

/// Contingency table `[C_a, C_b]` of two labelings.
fn contingency<A: Ord + Clone, B: Ord + Clone>(
    a: ArrayView1<'_, A>,
    b: ArrayView1<'_, B>,
) -> Result<Array2<u64>> {
    if a.is_empty() {
        return Err(AnalysisError::InvalidInput("empty labeling".into()));
    }
    if a.len() != b.len() {
        return Err(AnalysisError::Shape(format!(
            "labelings have different lengths: {} and {}",
            a.len(),
            b.len()
        )));
    }
    let (da, ca) = dense_labels(a);
    let (db, cb) = dense_labels(b);
    let mut table = Array2::<u64>::zeros((ca, cb));
    for (&i, &j) in da.iter().zip(db.iter()) {
        table[[i, j]] += 1;
    }
    Ok(table)
}

/// Adjusted Rand index between two labelings (scikit-learn's `adjusted_rand_score`): 1 for
/// identical partitions (whatever the label names), about 0 for independent ones, negative when
/// agreement is below chance.
///
/// # Shapes
/// `a`, `b`: `[N]`, N >= 1.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] if empty; [`AnalysisError::Shape`] if the lengths differ.
pub fn adjusted_rand_index<A: Ord + Clone, B: Ord + Clone>(
    a: ArrayView1<'_, A>,
    b: ArrayView1<'_, B>,
) -> Result<f64> {
    let table = contingency(a, b)?;
    let n = a.len() as u128;
    // pair confusion matrix (scikit-learn's pair_confusion_matrix), exact in integers
    let sum_sq: u128 = table.iter().map(|&c| (c as u128) * (c as u128)).sum();
    let row_sq: u128 = table
        .sum_axis(Axis(1))
        .iter()
        .map(|&c| (c as u128) * (c as u128))
        .sum();
    let col_sq: u128 = table
        .sum_axis(Axis(0))
        .iter()
        .map(|&c| (c as u128) * (c as u128))
        .sum();
    let tp = (sum_sq - n) as f64;
    let fp = (row_sq - sum_sq) as f64; // pairs together in a, apart in b
    let fn_ = (col_sq - sum_sq) as f64; // pairs together in b, apart in a
    let tn = (n * n + sum_sq - row_sq - col_sq) as f64;
    if fn_ == 0.0 && fp == 0.0 {
        return Ok(1.0);
    }
    Ok(2.0 * (tp * tn - fn_ * fp) / ((tp + fn_) * (fn_ + tn) + (tp + fp) * (fp + tn)))
}

/// Normalised mutual information with arithmetic-mean normalisation,
/// `MI(a, b) / ((H(a) + H(b)) / 2)` (scikit-learn's `normalized_mutual_info_score`, including its
/// special cases: 1 when both labelings have a single cluster, 0 when MI is 0).
///
/// # Shapes
/// `a`, `b`: `[N]`, N >= 1.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] if empty; [`AnalysisError::Shape`] if the lengths differ.
pub fn normalized_mutual_info<A: Ord + Clone, B: Ord + Clone>(
    a: ArrayView1<'_, A>,
    b: ArrayView1<'_, B>,
) -> Result<f64> {
    let table = contingency(a, b)?;
    let (ca, cb) = table.dim();
    if ca == 1 && cb == 1 {
        return Ok(1.0);
    }
    let n = a.len() as f64;
    let rows = table.sum_axis(Axis(1)).mapv(|c| c as f64);
    let cols = table.sum_axis(Axis(0)).mapv(|c| c as f64);
    let mut mi = 0.0;
    for ((i, j), &c) in table.indexed_iter() {
        if c > 0 {
            let c = c as f64;
            mi += c / n * ((c * n) / (rows[i] * cols[j])).ln();
        }
    }
    let mi = mi.max(0.0);
    if mi == 0.0 {
        return Ok(0.0);
    }
    let entropy = |counts: &Array1<f64>| -> f64 {
        counts
            .iter()
            .filter(|&&c| c > 0.0)
            .map(|&c| -(c / n) * (c / n).ln())
            .sum()
    };
    let norm = 0.5 * (entropy(&rows) + entropy(&cols));
    Ok(mi / norm.max(f64::EPSILON))
}

/// Silhouette coefficient of every sample under the Euclidean metric (scikit-learn's
/// `silhouette_samples`, Rousseeuw 1987): for sample i, `a` = mean distance to the other members
/// of its cluster, `b` = smallest mean distance to another cluster, `s = (b - a) / max(a, b)`;
/// singleton clusters score 0. Exact, O(N^2 D) time in blocked float64 GEMMs (module
/// `cluster/silhouette.rs`), O(64 N) memory per thread; the result does not depend on the number of
/// threads.
///
/// # Shapes
/// `x`: `[N, D]`; `labels`: `[N]` with 2 <= number of labels <= N - 1; returns `[N]`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for empty input or an invalid number of labels;
/// [`AnalysisError::Shape`] for mismatched lengths; [`AnalysisError::NonFinite`] for NaN/inf.
pub fn silhouette_samples(
    x: ArrayView2<'_, f64>,
    labels: ArrayView1<'_, i64>,
) -> Result<Array1<f64>> {
    let (n, d) = x.dim();
    if n == 0 || d == 0 {
        return Err(AnalysisError::InvalidInput(format!(
            "silhouette needs a non-empty matrix, got [{n}, {d}]"
        )));
    }
    if labels.len() != n {
        return Err(AnalysisError::Shape(format!(
            "silhouette: {n} samples but {} labels",
            labels.len()
        )));
    }
    check_finite(x, "silhouette input")?;
    let (dense, c) = dense_labels(labels);
    if c < 2 || c > n - 1 {
        return Err(AnalysisError::InvalidInput(format!(
            "silhouette needs 2 <= number of labels <= n_samples - 1, got {c} labels for {n} samples"
        )));
    }
    let samples = silhouette::silhouette_samples(x, &[dense]);
    Ok(Array1::from(
        samples.into_iter().next().expect("one labeling"),
    ))
}

/// Mean silhouette coefficient of all samples (scikit-learn's `silhouette_score`): the mean of
/// [`silhouette_samples`], summed in sample order.
///
/// # Shapes
/// `x`: `[N, D]`; `labels`: `[N]` with 2 <= number of labels <= N - 1.
///
/// # Errors
/// As [`silhouette_samples`].
pub fn silhouette_score(x: ArrayView2<'_, f64>, labels: ArrayView1<'_, i64>) -> Result<f64> {
    let samples = silhouette_samples(x, labels)?;
    Ok(silhouette::mean(samples.as_slice().expect("contiguous")))
}

/// [`silhouette_score`] on a seeded uniform subsample (without replacement) of at most
/// `max_points` samples; all samples when N <= `max_points`. Returns the score and the number of
/// samples used.
///
/// # Shapes
/// `x`: `[N, D]`; `labels`: `[N]`.
///
/// # Errors
/// As [`silhouette_score`] (evaluated on the subsample), plus [`AnalysisError::InvalidInput`]
/// if `max_points < 2`.
pub fn silhouette_score_sampled(
    x: ArrayView2<'_, f64>,
    labels: ArrayView1<'_, i64>,
    max_points: usize,
    seed: u64,
) -> Result<(f64, usize)> {
    if max_points < 2 {
        return Err(AnalysisError::InvalidInput(format!(
            "silhouette subsample size must be at least 2, got {max_points}"
        )));
    }
    let n = x.nrows();
    if labels.len() != n {
        return Err(AnalysisError::Shape(format!(
            "silhouette: {n} samples but {} labels",
            labels.len()
        )));
    }
    match subsample(n, max_points, seed) {
        None => Ok((silhouette_score(x, labels)?, n)),
        Some(idx) => {
            let xs = x.select(Axis(0), &idx);
            let ls = labels.select(Axis(0), &idx);
            Ok((silhouette_score(xs.view(), ls.view())?, max_points))
        }
    }
}

/// The sorted indices of a seeded uniform subsample (without replacement) of `max_points` of `n`
/// points (ChaCha8), or `None` when `n <= max_points`.
fn subsample(n: usize, max_points: usize, seed: u64) -> Option<Vec<usize>> {
    if n <= max_points {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut idx = rand::seq::index::sample(&mut rng, n, max_points).into_vec();
    idx.sort_unstable();
    Some(idx)
}

/// Hyperparameters of [`kmeans`] and [`cluster_against_labels`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KMeansParams {
    /// Number of clusters k (>= 1).
    pub n_clusters: usize,
    /// Seed of the k-means++ initialisation (and of the silhouette subsample).
    pub seed: u64,
    /// Independent k-means++ restarts; the run of lowest inertia is kept.
    pub n_runs: usize,
    /// Maximum Lloyd iterations per run.
    pub max_iterations: u64,
    /// Convergence tolerance in scikit-learn's definition: a run stops when no label changes or
    /// when the summed squared shift of the centroids is at most `tolerance` times the mean
    /// per-feature variance of the data (`tol * mean(var(X, axis=0))`).
    pub tolerance: f64,
    /// Largest number of points the silhouette is computed on (seeded subsample above it).
    pub silhouette_max_points: usize,
}

impl KMeansParams {
    /// Defaults for `n_clusters` clusters: seed 0, 3 runs, 300 iterations, tolerance 1e-4,
    /// silhouette on at most 5,000 points.
    pub fn new(n_clusters: usize) -> Self {
        Self {
            n_clusters,
            seed: 0,
            n_runs: 3,
            max_iterations: 300,
            tolerance: 1e-4,
            silhouette_max_points: 5_000,
        }
    }

    /// Checks the hyperparameters on their own.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] for k = 0, zero runs or iterations, a non-positive
    /// tolerance or a silhouette subsample below 2.
    pub fn check(&self) -> Result<()> {
        if self.n_clusters == 0 || self.n_runs == 0 || self.max_iterations == 0 {
            return Err(AnalysisError::InvalidInput(format!(
                "k-means: n_clusters ({}), n_runs ({}) and max_iterations ({}) must be >= 1",
                self.n_clusters, self.n_runs, self.max_iterations
            )));
        }
        if !(self.tolerance.is_finite() && self.tolerance > 0.0) {
            return Err(AnalysisError::InvalidInput(format!(
                "k-means: tolerance must be positive, got {}",
                self.tolerance
            )));
        }
        if self.silhouette_max_points < 2 {
            return Err(AnalysisError::InvalidInput(
                "silhouette_max_points must be at least 2".into(),
            ));
        }
        Ok(())
    }
}

/// A k-means clustering.
#[derive(Debug, Clone, PartialEq)]
pub struct KMeansFit {
    /// Cluster of every sample. # Shapes: `[N]`.
    pub assignments: Array1<usize>,
    /// Cluster centres. # Shapes: `[k, D]`.
    pub centroids: Array2<f64>,
    /// Mean squared distance of the samples to their centre.
    pub inertia: f64,
}

/// k-means: `n_runs` restarts from greedy k-means++ seeds (`crate::kmeanspp`, scikit-learn's
/// seeding), each refined by scikit-learn's Lloyd iterations (module `cluster/lloyd.rs`: blocked float32
/// GEMM distances, float64 centres and inertia, scikit-learn's stopping rule with `tolerance`
/// relative to the mean per-feature variance); the run of lowest inertia is kept (ties: the
/// first run). Run `r` draws its seeds from ChaCha8 with `seed` on stream `r`; the restarts run
/// in parallel and the result does not depend on the number of threads. Same data and settings
/// as scikit-learn's `KMeans(algorithm="lloyd")` reach the same best-of-n inertia on clustered
/// data (within 1e-4 relative in `tests/kmeans.rs`), not the same bits: the random draws differ.
///
/// The assignments and the inertia are those of the final centres (scikit-learn's `labels_` and
/// `inertia_ / N`).
///
/// # Shapes
/// `x`: `[N, D]` with N >= k; returns assignments `[N]` and centroids `[k, D]`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for bad hyperparameters, an empty matrix or N < k;
/// [`AnalysisError::NonFinite`] for NaN/inf; [`AnalysisError::Numerical`] for non-finite centres.
pub fn kmeans(x: ArrayView2<'_, f64>, params: &KMeansParams) -> Result<KMeansFit> {
    params.check()?;
    let (n, d) = x.dim();
    if n == 0 || d == 0 {
        return Err(AnalysisError::InvalidInput(format!(
            "k-means needs a non-empty matrix, got [{n}, {d}]"
        )));
    }
    let k = params.n_clusters;
    if n < k {
        return Err(AnalysisError::InvalidInput(format!(
            "k-means: {k} clusters requested for {n} samples"
        )));
    }
    check_finite(x, "k-means input")?;
    let x = x.as_standard_layout();
    let codes = Codes32::new(x.view());
    let mean_var = x.var_axis(Axis(0), 0.0).mean().unwrap_or(0.0);
    let tol = params.tolerance * mean_var;
    let runs: Vec<Result<KMeansFit>> = (0..params.n_runs)
        .into_par_iter()
        .map(|run| {
            let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
            rng.set_stream(run as u64);
            let seeds = greedy_kmeans_plusplus(&codes, k, &mut rng);
            let fit = lloyd::lloyd(&codes, seeds, params.max_iterations, tol);
            if fit.centres.iter().any(|v| !v.is_finite()) || !fit.inertia.is_finite() {
                return Err(AnalysisError::Numerical(
                    "k-means returned invalid centroids".into(),
                ));
            }
            Ok(KMeansFit {
                assignments: fit.labels,
                centroids: fit.centres,
                inertia: fit.inertia,
            })
        })
        .collect();
    let mut best: Option<KMeansFit> = None;
    for run in runs {
        let run = run?;
        if best.as_ref().is_none_or(|b| run.inertia < b.inertia) {
            best = Some(run);
        }
    }
    best.ok_or_else(|| AnalysisError::Numerical("k-means ran no restart".into()))
}

/// Scores of a k-means clustering against reference labels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClusterReport {
    /// Number of clusters k (the number of distinct labels).
    pub k: usize,
    /// Adjusted Rand index of the k-means clusters against the labels.
    pub ari: f64,
    /// Normalised mutual information (arithmetic) of the clusters against the labels.
    pub nmi: f64,
    /// Silhouette score of the codes partitioned by the LABELS (how well the labels separate in
    /// code space, independent of k-means).
    pub silhouette: f64,
    /// Silhouette score of the codes partitioned by the k-means clusters (NaN if k-means used
    /// fewer than 2 clusters).
    pub silhouette_kmeans: f64,
    /// Number of points the silhouette scores were computed on (a seeded subsample if N was
    /// larger than the limit).
    pub silhouette_points: usize,
    /// k-means inertia (mean squared distance to the closest centre).
    pub inertia: f64,
}

/// Runs k-means with k = the number of distinct labels on `x` and scores the clusters against the
/// labels (ARI, NMI), plus the silhouette score of the labels and of the clusters
/// (`docs/spec/latent-codes.md`, analysis 4). `params.n_clusters` is ignored (set to k).
///
/// # Shapes
/// `x`: `[N, D]`; `labels`: `[N]` with at least 2 distinct labels.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for fewer than 2 distinct labels or empty input;
/// [`AnalysisError::Shape`] for mismatched lengths; [`AnalysisError::NonFinite`] for NaN/inf;
/// the errors of [`kmeans`].
pub fn cluster_against_labels(
    x: ArrayView2<'_, f64>,
    labels: ArrayView1<'_, i64>,
    params: &KMeansParams,
) -> Result<ClusterReport> {
    if labels.len() != x.nrows() {
        return Err(AnalysisError::Shape(format!(
            "clustering: {} samples but {} labels",
            x.nrows(),
            labels.len()
        )));
    }
    let (_, k) = dense_labels(labels);
    if k < 2 {
        return Err(AnalysisError::InvalidInput(format!(
            "clustering against labels needs at least 2 distinct labels, found {k}"
        )));
    }
    let params = KMeansParams {
        n_clusters: k,
        ..*params
    };
    let fit = kmeans(x, &params)?;
    let ari = adjusted_rand_index(labels, fit.assignments.view())?;
    let nmi = normalized_mutual_info(labels, fit.assignments.view())?;
    // both silhouettes on the same subsample, from one pass over its distances
    check_finite(x, "silhouette input")?;
    let idx = subsample(x.nrows(), params.silhouette_max_points, params.seed);
    let (xs, ls, assigned) = match &idx {
        Some(idx) => (
            CowArray::from(x.select(Axis(0), idx)),
            labels.select(Axis(0), idx),
            idx.iter()
                .map(|&i| fit.assignments[i])
                .collect::<Array1<usize>>(),
        ),
        None => (
            CowArray::from(x),
            labels.to_owned(),
            fit.assignments.clone(),
        ),
    };
    let points = xs.nrows();
    let (dense_labels_sub, c_labels) = dense_labels(ls.view());
    if c_labels < 2 || c_labels > points - 1 {
        return Err(AnalysisError::InvalidInput(format!(
            "silhouette needs 2 <= number of labels <= n_samples - 1, got {c_labels} labels for {points} samples"
        )));
    }
    let (dense_assigned, c_assigned) = dense_labels(assigned.view());
    let kmeans_valid = (2..points).contains(&c_assigned);
    let mut labelings = vec![dense_labels_sub];
    if kmeans_valid {
        labelings.push(dense_assigned);
    }
    let samples = silhouette::silhouette_samples(xs.view(), &labelings);
    let silhouette = silhouette::mean(&samples[0]);
    let silhouette_kmeans = if kmeans_valid {
        silhouette::mean(&samples[1])
    } else {
        f64::NAN
    };
    Ok(ClusterReport {
        k,
        ari,
        nmi,
        silhouette,
        silhouette_kmeans,
        silhouette_points: points,
        inertia: fit.inertia,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    /// Plain O(N^2) silhouette in float64 for cross-checking.
    fn naive_silhouette(x: &Array2<f64>, l: &[i64]) -> f64 {
        let n = x.nrows();
        let dist = |i: usize, j: usize| {
            x.row(i)
                .iter()
                .zip(x.row(j).iter())
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>()
                .sqrt()
        };
        let mut labels: Vec<i64> = l.to_vec();
        labels.sort();
        labels.dedup();
        let mut total = 0.0;
        for i in 0..n {
            let own: Vec<usize> = (0..n).filter(|&j| j != i && l[j] == l[i]).collect();
            if own.is_empty() {
                continue;
            }
            let a = own.iter().map(|&j| dist(i, j)).sum::<f64>() / own.len() as f64;
            let b = labels
                .iter()
                .filter(|&&c| c != l[i])
                .map(|&c| {
                    let m: Vec<usize> = (0..n).filter(|&j| l[j] == c).collect();
                    m.iter().map(|&j| dist(i, j)).sum::<f64>() / m.len() as f64
                })
                .fold(f64::INFINITY, f64::min);
            total += (b - a) / a.max(b);
        }
        total / n as f64
    }

    #[test]
    fn silhouette_matches_naive_loops() {
        let x = Array2::from_shape_fn((13, 3), |(i, j)| {
            ((i * 7 + j * 3) % 11) as f64 + 0.1 * j as f64
        });
        let l: Vec<i64> = (0..13).map(|i| [4, 9, -1][i % 3]).collect();
        // one singleton cluster exercises the s = 0 rule
        let mut l2 = l.clone();
        l2[12] = 100;
        for labels in [l, l2] {
            let got = silhouette_score(x.view(), Array1::from(labels.clone()).view()).unwrap();
            assert!((got - naive_silhouette(&x, &labels)).abs() < 1e-9);
        }
    }

    #[test]
    fn ari_nmi_by_hand() {
        // a = {0,1,2},{3,4,5}; b = {0,1},{2,3},{4,5}
        let a = array![0, 0, 0, 1, 1, 1];
        let b = array![0, 0, 1, 1, 2, 2];
        // contingency [[2,1,0],[0,1,2]]: sum C(nij,2) = 2, rows 3+3 = 6, cols 1+1+1 = 3, C(6,2)=15
        // expected = 6*3/15 = 1.2, max = 4.5 -> ARI = (2 - 1.2)/(4.5 - 1.2)
        let want = (2.0 - 1.2) / (4.5 - 1.2);
        assert!((adjusted_rand_index(a.view(), b.view()).unwrap() - want).abs() < 1e-12);
        // MI = sum p_ij ln(p_ij/(p_i p_j)); H(a) = ln 2, H(b) = ln 3
        let p = |c: f64, r: f64, k: f64| c / 6.0 * ((c / 6.0) / (r / 6.0 * k / 6.0)).ln();
        let mi = 2.0 * p(2.0, 3.0, 2.0) + 2.0 * p(1.0, 3.0, 2.0);
        let want = mi / (0.5 * (2f64.ln() + 3f64.ln()));
        assert!((normalized_mutual_info(a.view(), b.view()).unwrap() - want).abs() < 1e-12);
        // one cluster each: both 1; one vs many: NMI 0, ARI 0
        let ones = array![5, 5, 5, 5];
        assert_eq!(adjusted_rand_index(ones.view(), ones.view()).unwrap(), 1.0);
        assert_eq!(
            normalized_mutual_info(ones.view(), ones.view()).unwrap(),
            1.0
        );
        let many = array![0, 1, 2, 3];
        assert_eq!(
            normalized_mutual_info(ones.view(), many.view()).unwrap(),
            0.0
        );
        assert_eq!(adjusted_rand_index(ones.view(), many.view()).unwrap(), 0.0);
        assert!(adjusted_rand_index(a.view(), many.view()).is_err());
        let empty = Array1::<i64>::zeros(0);
        assert!(normalized_mutual_info(empty.view(), empty.view()).is_err());
    }
}
