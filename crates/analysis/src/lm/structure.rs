//! The unsupervised view of a language model's codes, per layer and on the selected layers
//! together: PCA's explained variance ([`crate::pca`]) and k-means with k the number of values of
//! the factor present, scored against the factor by ARI, NMI and silhouette
//! ([`crate::cluster::cluster_against_labels`]; `docs/spec/latent-codes.md`, analyses 1 and 4).
//! They run on the kept, labelled prompts of one split (the held-out ones by default, as the
//! SRAVEN analysis).

use ndarray::Array2;
use serde::Serialize;

use super::set::LmCodeSet;
use crate::cluster::{cluster_against_labels, KMeansParams};
use crate::codes::report::CodeSplit;
use crate::error::{AnalysisError, Result};
use crate::pca::PcaParams;
use crate::table::{Column, Table};

/// One row of the structure table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LmStructureRow {
    /// The model layer; None for the selected layers together.
    pub layer: Option<usize>,
    /// Prompts the row ran on.
    pub n_rows: usize,
    /// Explained-variance ratio of the first `n_components` principal components.
    pub explained_variance_ratio: Vec<f64>,
    /// Distinct values of the factor among the rows (the k of k-means).
    pub k: usize,
    /// Adjusted Rand index of the k-means clusters against the factor (None if k < 2).
    pub ari: Option<f64>,
    /// Normalised mutual information of the clusters against the factor (None if k < 2).
    pub nmi: Option<f64>,
    /// Silhouette of the factor's values as clusters (None if k < 2).
    pub silhouette: Option<f64>,
}

/// The PCA projections of one selection, for a scatter or the explorer.
#[derive(Debug, Clone, PartialEq)]
pub struct LmProjection {
    /// The model layer; None for the selected layers together.
    pub layer: Option<usize>,
    /// The rows' codes on the kept components. # Shapes: `[N_u, n_components]`.
    pub projection: Array2<f64>,
}

/// Settings of [`structure`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LmStructureParams {
    /// Principal components reported (capped at the features and rows).
    pub n_components: usize,
    /// The split the analyses run on.
    pub on: CodeSplit,
    /// k-means++ restarts.
    pub kmeans_runs: usize,
    /// Seed of k-means and the silhouette subsample.
    pub seed: u64,
}

/// PCA and k-means of the codes of `rows` (the kept, labelled prompts of the chosen split; the
/// caller picks them) per layer axis and on the axes together, against the value indices
/// `labels` of the factor.
///
/// # Shapes
/// `rows`, `labels`: `[N_u]`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for fewer than 2 rows; the errors of PCA and k-means.
pub fn structure(
    set: &LmCodeSet,
    rows: &[usize],
    labels: &[i64],
    layer_axes: &[usize],
    params: &LmStructureParams,
) -> Result<(Vec<LmStructureRow>, Vec<LmProjection>)> {
    if rows.len() < 2 {
        return Err(AnalysisError::InvalidInput(format!(
            "{}: PCA and k-means need at least 2 kept {} prompts with a value of the factor, \
             got {}",
            set.source(),
            params.on,
            rows.len()
        )));
    }
    let y = ndarray::Array1::from(labels.to_vec());
    let mut distinct = labels.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let k = distinct.len();
    let mut sels: Vec<Option<usize>> = layer_axes.iter().map(|&l| Some(l)).collect();
    sels.push(None);
    let mut out = Vec::with_capacity(sels.len());
    let mut projections = Vec::with_capacity(sels.len());
    for sel in sels {
        let axes = sel.map_or_else(|| layer_axes.to_vec(), |l| vec![l]);
        let x = set.code_features(rows, &axes);
        let n_comp = params.n_components.min(x.ncols()).min(rows.len());
        let pca = PcaParams::new(n_comp).fit(x.view())?;
        let ratio = pca.explained_variance_ratio();
        let clusters = if k >= 2 && rows.len() > k {
            let kp = KMeansParams {
                n_runs: params.kmeans_runs,
                seed: params.seed,
                ..KMeansParams::new(k)
            };
            Some(cluster_against_labels(x.view(), y.view(), &kp)?)
        } else {
            None
        };
        let layer = sel.map(|l| set.sidecar().layers[l]);
        projections.push(LmProjection {
            layer,
            projection: pca.transform(x.view())?,
        });
        out.push(LmStructureRow {
            layer,
            n_rows: rows.len(),
            explained_variance_ratio: ratio.iter().take(n_comp).copied().collect(),
            k,
            ari: clusters.map(|c| c.ari),
            nmi: clusters.map(|c| c.nmi),
            silhouette: clusters.map(|c| c.silhouette),
        });
    }
    Ok((out, projections))
}

/// The table `structure.csv`: `layer` (-1 and `all_layers` true for the layers together),
/// `n_rows`, `pc1` .. `pc{n}` (explained-variance ratios; empty where fewer components exist),
/// `k`, `ari`, `nmi`, `silhouette`.
///
/// # Errors
/// None in practice.
pub fn structure_table(rows: &[LmStructureRow], n_components: usize) -> Result<Table> {
    let mut t = Table::new();
    t.push(
        "layer",
        Column::Int(
            rows.iter()
                .map(|r| r.layer.map_or(-1, |l| l as i64))
                .collect(),
        ),
    )?;
    t.push(
        "all_layers",
        Column::Bool(rows.iter().map(|r| r.layer.is_none()).collect()),
    )?;
    t.push(
        "n_rows",
        Column::Int(rows.iter().map(|r| r.n_rows as i64).collect()),
    )?;
    for c in 0..n_components {
        t.push(
            format!("pc{}", c + 1),
            Column::MaybeFloat(
                rows.iter()
                    .map(|r| r.explained_variance_ratio.get(c).copied())
                    .collect(),
            ),
        )?;
    }
    t.push("k", Column::Int(rows.iter().map(|r| r.k as i64).collect()))?;
    t.push(
        "ari",
        Column::MaybeFloat(rows.iter().map(|r| r.ari).collect()),
    )?;
    t.push(
        "nmi",
        Column::MaybeFloat(rows.iter().map(|r| r.nmi).collect()),
    )?;
    t.push(
        "silhouette",
        Column::MaybeFloat(rows.iter().map(|r| r.silhouette).collect()),
    )?;
    Ok(t)
}
