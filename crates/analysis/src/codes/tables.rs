//! The files of a [`LatentReport`]: the CSV tables, `pca.npz` and `summary.json` that
//! [`LatentReport::write_tables`] writes, and the run's timings, which it does not write.
//!
//! Every CSV starts with the columns `layer` (an integer: the layer, or [`ALL_LAYERS_INDEX`] for all
//! layers concatenated) and `all_layers` (a boolean, `true` only on the rows of all layers). One
//! file per analysis holds both kinds of row, so that the all-layers result sits beside the
//! per-layer ones it is compared with, while pandas and numpy still read `layer` as integers.

use std::path::{Path, PathBuf};

use hyperlens_io::keys::pca as pca_keys;
use serde::Serialize;

use crate::cluster::ClusterReport;
use crate::decode::DecodeResult;

#[cfg(doc)]
use super::report::ALL_LAYERS_INDEX;
use super::report::{LatentReport, LayerSel};
use crate::error::Result;
use crate::table::{Column, Table};

/// `summary.json` of a [`LatentReport`] ([`LatentReport::summary`]). Fields in alphabetical
/// order, the order of the file's keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatentSummary<'a> {
    /// What the analysis is ([`LatentSummary::ANALYSIS`]).
    pub analysis: &'static str,
    /// The code axes.
    pub code_dims: CodeDims,
    /// The files written ([`LatentReport::FILES`]).
    pub files: [&'static str; 7],
    /// The labels of the report, ascending.
    pub labels: &'a [i64],
    /// One entry per layer selection, as in the CSV files.
    pub layers: Vec<LayerSummary<'a>>,
    /// The analysis parameters.
    pub params: &'a crate::LatentAnalysisParams,
    /// The test set.
    pub test: SourceSummary<'a>,
    /// The writer ([`LatentSummary::TOOL`]).
    pub tool: &'static str,
    /// The training set.
    pub train: SourceSummary<'a>,
    /// The crate version that wrote the file.
    pub version: &'static str,
}

impl LatentSummary<'_> {
    /// The `tool` field.
    pub const TOOL: &'static str = "hyperlens-analysis";
    /// The `analysis` field.
    pub const ANALYSIS: &'static str =
        "latent codes: PCA, rule decoding train -> test, k-means, mean-code similarity";
}

/// The axes of the code arrays `[N, L, H, Q, K]` (the `code_dims` of [`LatentSummary`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CodeDims {
    /// `H`.
    pub heads: usize,
    /// `K`.
    pub keys: usize,
    /// `L`.
    pub layers: usize,
    /// `Q`.
    pub queries: usize,
}

/// A code file of [`LatentSummary`]: its path, problem count and the model's accuracy on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceSummary<'a> {
    /// The model's accuracy on the problems, when the file stores `correct`.
    pub model_accuracy: Option<f64>,
    /// Number of problems.
    pub n: usize,
    /// The file's path as given.
    pub source: &'a str,
}

/// One layer selection of [`LatentSummary`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerSummary<'a> {
    /// `true` for all layers concatenated.
    pub all_layers: bool,
    /// The k-means result, when clustering ran.
    pub clusters: Option<&'a ClusterReport>,
    /// The rule decoding result.
    pub decoding: &'a DecodeResult,
    /// The layer, or [`ALL_LAYERS_INDEX`].
    pub layer: i64,
    /// Features per problem of the selection.
    pub n_features: usize,
    /// The PCA.
    pub pca: PcaSummary,
    /// The mean-code similarity.
    pub similarity: SimilaritySummary<'a>,
}

/// The PCA of a [`LayerSummary`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PcaSummary {
    /// Explained variance ratio per component.
    pub explained_variance_ratio: Vec<f64>,
    /// Components kept in the projection.
    pub n_components: usize,
}

/// The mean-code similarity of a [`LayerSummary`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimilaritySummary<'a> {
    /// `[labels, labels]` cosine similarity of the label means, row by row (NaN as `null`).
    pub cosine: Vec<Vec<f64>>,
    /// Problems per label.
    pub counts: &'a [usize],
    /// The labels.
    pub labels: &'a [i64],
}

/// Stage seconds of a [`LatentReport`] ([`LatentReport::timings`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatentTimings {
    /// Wall-clock seconds of the whole analysis.
    pub elapsed_s: f64,
    /// One entry per layer selection.
    pub layers: Vec<LayerTimings>,
}

/// Stage seconds of one layer selection ([`LatentTimings`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerTimings {
    /// `true` for all layers concatenated.
    pub all_layers: bool,
    /// Seconds of k-means.
    pub clustering: f64,
    /// Seconds of the rule decoding.
    pub decoding: f64,
    /// The layer, or [`ALL_LAYERS_INDEX`].
    pub layer: i64,
    /// Seconds of the PCA.
    pub pca: f64,
    /// Seconds of the similarity.
    pub similarity: f64,
}

/// The rows' `layer` and `all_layers` columns (see [`LatentReport::FILES`]).
fn layer_columns(t: &mut Table, rows: &[LayerSel]) -> Result<()> {
    t.push(
        "layer",
        Column::Int(rows.iter().map(|l| l.table_index()).collect()),
    )?;
    t.push(
        "all_layers",
        Column::Bool(rows.iter().map(|&l| l == LayerSel::All).collect()),
    )
}

impl LatentReport {
    /// Names of the files [`LatentReport::write_tables`] writes. Every CSV starts with the columns
    /// `layer` (integer: the layer, or [`ALL_LAYERS_INDEX`]) and `all_layers` (boolean: `true` on
    /// the rows of all layers concatenated), so that pandas reads `layer` as integers; the
    /// all-layers rows stay in the same files as the per-layer rows they are compared with.
    /// Nothing in them depends on the machine or the run time (timings are in
    /// [`LatentReport::timings`]).
    pub const FILES: [&'static str; 7] = [
        "decoding.csv",
        "pca.csv",
        "pca.npz",
        "clusters.csv",
        "similarity.csv",
        "confusion.csv",
        "summary.json",
    ];

    /// `decoding.csv`: one row per layer and one for all layers, columns
    /// `layer,all_layers,accuracy,balanced_accuracy,majority_baseline,shuffled_control,train_accuracy,majority_class,n_train,n_test`
    /// (`shuffled_control` empty when not run).
    ///
    /// # Errors
    /// None in practice (the columns have one row per layer).
    pub fn decoding_table(&self) -> Result<Table> {
        let rows: Vec<LayerSel> = self.layers.iter().map(|l| l.layer).collect();
        let d = |f: &dyn Fn(&crate::decode::DecodeResult) -> f64| {
            Column::shortest(self.layers.iter().map(|l| f(&l.decoding)).collect())
        };
        let n = |f: &dyn Fn(&crate::decode::DecodeResult) -> i64| {
            Column::Int(self.layers.iter().map(|l| f(&l.decoding)).collect())
        };
        let mut t = Table::new();
        layer_columns(&mut t, &rows)?;
        t.push("accuracy", d(&|d| d.accuracy))?;
        t.push("balanced_accuracy", d(&|d| d.balanced_accuracy))?;
        t.push("majority_baseline", d(&|d| d.majority_baseline))?;
        t.push(
            "shuffled_control",
            Column::MaybeFloat(
                self.layers
                    .iter()
                    .map(|l| l.decoding.shuffled_control)
                    .collect(),
            ),
        )?;
        t.push("train_accuracy", d(&|d| d.train_accuracy))?;
        t.push("majority_class", n(&|d| d.majority_class))?;
        t.push("n_train", n(&|d| d.n_train as i64))?;
        t.push("n_test", n(&|d| d.n_test as i64))?;
        Ok(t)
    }

    /// `pca.csv`: `layer,all_layers,component,explained_variance_ratio,explained_variance`, one row per
    /// component (0-based, in decreasing order of variance) over ALL components.
    ///
    /// # Errors
    /// None in practice.
    pub fn pca_table(&self) -> Result<Table> {
        let (mut rows, mut comp, mut ratio, mut var) = (vec![], vec![], vec![], vec![]);
        for l in &self.layers {
            let (r, v) = (l.pca.explained_variance_ratio(), l.pca.explained_variance());
            for c in 0..r.len() {
                rows.push(l.layer);
                comp.push(c as i64);
                ratio.push(r[c]);
                var.push(v[c]);
            }
        }
        let mut t = Table::new();
        layer_columns(&mut t, &rows)?;
        t.push("component", Column::Int(comp))?;
        t.push("explained_variance_ratio", Column::shortest(ratio))?;
        t.push("explained_variance", Column::shortest(var))?;
        Ok(t)
    }

    /// `clusters.csv`: `layer,all_layers,ari,nmi,silhouette,silhouette_kmeans,k,silhouette_points,inertia`
    /// (`silhouette` partitions the codes by label, `silhouette_kmeans` by k-means cluster; a
    /// layer without clustering, because the set has one label, has NaN scores, k 1 and 0
    /// silhouette points).
    ///
    /// # Errors
    /// None in practice.
    pub fn clusters_table(&self) -> Result<Table> {
        let rows: Vec<LayerSel> = self.layers.iter().map(|l| l.layer).collect();
        let f = |g: &dyn Fn(&crate::cluster::ClusterReport) -> f64| {
            Column::shortest(
                self.layers
                    .iter()
                    .map(|l| l.clusters.as_ref().map_or(f64::NAN, g))
                    .collect(),
            )
        };
        let mut t = Table::new();
        layer_columns(&mut t, &rows)?;
        t.push("ari", f(&|c| c.ari))?;
        t.push("nmi", f(&|c| c.nmi))?;
        t.push("silhouette", f(&|c| c.silhouette))?;
        t.push("silhouette_kmeans", f(&|c| c.silhouette_kmeans))?;
        let ints = |g: &dyn Fn(Option<&crate::cluster::ClusterReport>) -> usize| {
            Column::Int(
                self.layers
                    .iter()
                    .map(|l| g(l.clusters.as_ref()) as i64)
                    .collect(),
            )
        };
        t.push("k", ints(&|c| c.map_or(1, |c| c.k)))?;
        t.push(
            "silhouette_points",
            ints(&|c| c.map_or(0, |c| c.silhouette_points)),
        )?;
        t.push("inertia", f(&|c| c.inertia))?;
        Ok(t)
    }

    /// `similarity.csv`: `layer,all_layers,label_a,label_b,cosine`, every ordered pair of labels (NaN for a
    /// label without samples in the set).
    ///
    /// # Errors
    /// None in practice.
    pub fn similarity_table(&self) -> Result<Table> {
        let (mut rows, mut a_col, mut b_col, mut cos) = (vec![], vec![], vec![], vec![]);
        for l in &self.layers {
            let sim = &l.similarity;
            for (i, &a) in sim.labels.iter().enumerate() {
                for (j, &b) in sim.labels.iter().enumerate() {
                    rows.push(l.layer);
                    a_col.push(a);
                    b_col.push(b);
                    cos.push(sim.cosine[[i, j]]);
                }
            }
        }
        let mut t = Table::new();
        layer_columns(&mut t, &rows)?;
        t.push("label_a", Column::Int(a_col))?;
        t.push("label_b", Column::Int(b_col))?;
        t.push("cosine", Column::shortest(cos))?;
        Ok(t)
    }

    /// `confusion.csv`: `layer,all_layers,true_label,predicted_label,count`, every pair of the union of
    /// train and test labels.
    ///
    /// # Errors
    /// None in practice.
    pub fn confusion_table(&self) -> Result<Table> {
        let (mut rows, mut t_col, mut p_col, mut count) = (vec![], vec![], vec![], vec![]);
        for l in &self.layers {
            let d = &l.decoding;
            for (i, &tl) in d.classes.iter().enumerate() {
                for (j, &pl) in d.classes.iter().enumerate() {
                    rows.push(l.layer);
                    t_col.push(tl);
                    p_col.push(pl);
                    count.push(d.confusion[[i, j]] as i64);
                }
            }
        }
        let mut t = Table::new();
        layer_columns(&mut t, &rows)?;
        t.push("true_label", Column::Int(t_col))?;
        t.push("predicted_label", Column::Int(p_col))?;
        t.push("count", Column::Int(count))?;
        Ok(t)
    }

    /// The CSV tables by file name, in [`LatentReport::FILES`]' order.
    ///
    /// # Errors
    /// None in practice.
    pub fn tables(&self) -> Result<Vec<(&'static str, Table)>> {
        Ok(vec![
            ("decoding.csv", self.decoding_table()?),
            ("pca.csv", self.pca_table()?),
            ("clusters.csv", self.clusters_table()?),
            ("similarity.csv", self.similarity_table()?),
            ("confusion.csv", self.confusion_table()?),
        ])
    }

    /// `summary.json`: provenance (sources, sizes, code axes, parameters, version) and every
    /// result; `layer` is an integer and `all_layers` a boolean, as in the CSV files. NaN values
    /// appear as `null`. No timings (see [`LatentReport::timings`]), so that the same inputs give
    /// the same file. Written with [`hyperlens_io::write_json_sorted`] (keys in alphabetical order).
    pub fn summary(&self) -> LatentSummary<'_> {
        let (layers, heads, queries, keys) = self.code_dims;
        LatentSummary {
            analysis: LatentSummary::ANALYSIS,
            code_dims: CodeDims {
                heads,
                keys,
                layers,
                queries,
            },
            files: Self::FILES,
            labels: &self.labels,
            layers: self
                .layers
                .iter()
                .map(|a| LayerSummary {
                    all_layers: a.layer == LayerSel::All,
                    clusters: a.clusters.as_ref(),
                    decoding: &a.decoding,
                    layer: a.layer.table_index(),
                    n_features: a.pca.mean().len(),
                    pca: PcaSummary {
                        explained_variance_ratio: a.pca.explained_variance_ratio().to_vec(),
                        n_components: a.projection.ncols(),
                    },
                    similarity: SimilaritySummary {
                        cosine: a
                            .similarity
                            .cosine
                            .rows()
                            .into_iter()
                            .map(|r| r.to_vec())
                            .collect(),
                        counts: &a.similarity.counts,
                        labels: &a.similarity.labels,
                    },
                })
                .collect(),
            params: &self.params,
            test: SourceSummary {
                model_accuracy: self.test_model_accuracy,
                n: self.n_test,
                source: &self.test_source,
            },
            tool: LatentSummary::TOOL,
            train: SourceSummary {
                model_accuracy: self.train_model_accuracy,
                n: self.n_train,
                source: &self.train_source,
            },
            version: env!("CARGO_PKG_VERSION"),
        }
    }

    /// Wall-clock seconds of the analysis: `elapsed_s`, and per selection (`layer`, `all_layers`)
    /// the seconds of the PCA, decoding, clustering and similarity stages. Kept out of the tables
    /// because they change from run to run.
    pub fn timings(&self) -> LatentTimings {
        LatentTimings {
            elapsed_s: self.elapsed_s,
            layers: self
                .layers
                .iter()
                .map(|a| LayerTimings {
                    all_layers: a.layer == LayerSel::All,
                    clustering: a.seconds[2],
                    decoding: a.seconds[1],
                    layer: a.layer.table_index(),
                    pca: a.seconds[0],
                    similarity: a.seconds[3],
                })
                .collect(),
        }
    }

    /// Writes the PCA projections as `.npz`: `layer{l}` and `all` `[N_u, k]` projections,
    /// `components_layer{l}` / `components_all` `[k, D]`, `explained_variance_ratio_layer{l}` /
    /// `explained_variance_ratio_all` `[D]`, and `label` (plus `target`, `correct` when stored)
    /// `[N_u]` of the unsupervised set; the names are [`hyperlens_io::keys::pca`].
    ///
    /// # Errors
    /// [`AnalysisError::File`](crate::error::AnalysisError::File) naming the path and array.
    pub fn write_pca_npz(&self, path: &Path) -> Result<()> {
        hyperlens_io::write_npz(path, |npz| -> Result<()> {
            for a in &self.layers {
                let sel = a.layer.index();
                let name = |prefix: &str| pca_keys::name(prefix, sel);
                npz.add(&name(pca_keys::PROJECTION_PREFIX), &a.projection)?;
                npz.add(&name(pca_keys::COMPONENTS_PREFIX), a.pca.components())?;
                npz.add(
                    &name(pca_keys::EXPLAINED_VARIANCE_RATIO_PREFIX),
                    a.pca.explained_variance_ratio(),
                )?;
            }
            npz.add(pca_keys::LABEL, &self.unsupervised_label)?;
            if let Some(t) = &self.unsupervised_target {
                npz.add(pca_keys::TARGET, t)?;
            }
            if let Some(c) = &self.unsupervised_correct {
                npz.add(pca_keys::CORRECT, c)?;
            }
            Ok(())
        })
    }

    /// Writes all tables ([`LatentReport::FILES`]) into `dir` (created if missing), each
    /// atomically. Returns the paths written.
    ///
    /// # Errors
    /// [`AnalysisError::Io`](crate::error::AnalysisError::Io) / [`AnalysisError::Npz`](crate::error::AnalysisError::Npz)
    /// naming the path that failed.
    pub fn write_tables(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let mut written = crate::table::write_tables(dir, self.tables()?)?;
        let path = dir.join("pca.npz");
        self.write_pca_npz(&path)?;
        written.push(path);
        let path = dir.join("summary.json");
        hyperlens_io::write_json_sorted(&path, &self.summary())?;
        written.push(path);
        Ok(written)
    }
}
