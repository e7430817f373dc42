//! The files of a [`LatentReport`]: the CSV tables, `pca.npz` and `summary.json` that
//! [`LatentReport::write_tables`] writes, and the run's timings, which it does not write.
//!
//! Every CSV starts with the columns `layer` (an integer: the layer, or [`ALL_LAYERS_INDEX`] for all
//! layers concatenated) and `all_layers` (a boolean, `true` only on the rows of all layers). One
//! file per analysis holds both kinds of row, so that the all-layers result sits beside the
//! per-layer ones it is compared with, while pandas and numpy still read `layer` as integers.

use std::path::{Path, PathBuf};

use hyperlens_io::keys::pca as pca_keys;
use serde_json::json;

#[cfg(doc)]
use super::report::ALL_LAYERS_INDEX;
use super::report::{LatentReport, LayerSel};
use crate::error::{AnalysisError, Result};

/// Formats a float for CSV: shortest round-trip decimal, `NaN` for NaN.
fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else {
        format!("{v}")
    }
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
    pub fn decoding_csv(&self) -> String {
        let mut s = String::from(
            "layer,all_layers,accuracy,balanced_accuracy,majority_baseline,shuffled_control,train_accuracy,majority_class,n_train,n_test\n",
        );
        for l in &self.layers {
            let d = &l.decoding;
            s += &format!(
                "{},{},{},{},{},{},{},{},{}\n",
                l.layer.table_columns(),
                num(d.accuracy),
                num(d.balanced_accuracy),
                num(d.majority_baseline),
                d.shuffled_control.map(num).unwrap_or_default(),
                num(d.train_accuracy),
                d.majority_class,
                d.n_train,
                d.n_test
            );
        }
        s
    }

    /// `pca.csv`: `layer,all_layers,component,explained_variance_ratio,explained_variance`, one row per
    /// component (0-based, in decreasing order of variance) over ALL components.
    pub fn pca_csv(&self) -> String {
        let mut s = String::from(
            "layer,all_layers,component,explained_variance_ratio,explained_variance\n",
        );
        for l in &self.layers {
            let ratio = l.pca.explained_variance_ratio();
            let var = l.pca.explained_variance();
            for c in 0..ratio.len() {
                s += &format!(
                    "{},{c},{},{}\n",
                    l.layer.table_columns(),
                    num(ratio[c]),
                    num(var[c])
                );
            }
        }
        s
    }

    /// `clusters.csv`: `layer,all_layers,ari,nmi,silhouette,silhouette_kmeans,k,silhouette_points,inertia`
    /// (`silhouette` partitions the codes by label, `silhouette_kmeans` by k-means cluster; a
    /// layer without clustering, because the set has one label, has NaN scores).
    pub fn clusters_csv(&self) -> String {
        let mut s = String::from(
            "layer,all_layers,ari,nmi,silhouette,silhouette_kmeans,k,silhouette_points,inertia\n",
        );
        for l in &self.layers {
            match &l.clusters {
                Some(c) => {
                    s += &format!(
                        "{},{},{},{},{},{},{},{}\n",
                        l.layer.table_columns(),
                        num(c.ari),
                        num(c.nmi),
                        num(c.silhouette),
                        num(c.silhouette_kmeans),
                        c.k,
                        c.silhouette_points,
                        num(c.inertia)
                    )
                }
                None => s += &format!("{},NaN,NaN,NaN,NaN,1,0,NaN\n", l.layer.table_columns()),
            }
        }
        s
    }

    /// `similarity.csv`: `layer,all_layers,label_a,label_b,cosine`, every ordered pair of labels (NaN for a
    /// label without samples in the set).
    pub fn similarity_csv(&self) -> String {
        let mut s = String::from("layer,all_layers,label_a,label_b,cosine\n");
        for l in &self.layers {
            let sim = &l.similarity;
            for (i, a) in sim.labels.iter().enumerate() {
                for (j, b) in sim.labels.iter().enumerate() {
                    s += &format!(
                        "{},{a},{b},{}\n",
                        l.layer.table_columns(),
                        num(sim.cosine[[i, j]])
                    );
                }
            }
        }
        s
    }

    /// `confusion.csv`: `layer,all_layers,true_label,predicted_label,count`, every pair of the union of
    /// train and test labels.
    pub fn confusion_csv(&self) -> String {
        let mut s = String::from("layer,all_layers,true_label,predicted_label,count\n");
        for l in &self.layers {
            let d = &l.decoding;
            for (i, t) in d.classes.iter().enumerate() {
                for (j, p) in d.classes.iter().enumerate() {
                    s += &format!(
                        "{},{t},{p},{}\n",
                        l.layer.table_columns(),
                        d.confusion[[i, j]]
                    );
                }
            }
        }
        s
    }

    /// `summary.json`: provenance (sources, sizes, code axes, parameters, version) and every
    /// result; `layer` is an integer and `all_layers` a boolean, as in the CSV files. NaN values
    /// appear as `null`. No timings (see [`LatentReport::timings`]), so that the same inputs give
    /// the same file.
    pub fn summary(&self) -> serde_json::Value {
        let (l, h, q, k) = self.code_dims;
        let layers: Vec<serde_json::Value> = self
            .layers
            .iter()
            .map(|a| {
                json!({
                    "layer": a.layer.table_index(),
                    "all_layers": a.layer == LayerSel::All,
                    "n_features": a.pca.mean().len(),
                    "decoding": &a.decoding,
                    "pca": {
                        "n_components": a.projection.ncols(),
                        "explained_variance_ratio": a.pca.explained_variance_ratio().to_vec(),
                    },
                    "clusters": a.clusters,
                    "similarity": {
                        "labels": &a.similarity.labels,
                        "counts": &a.similarity.counts,
                        "cosine": a.similarity.cosine.rows().into_iter().map(|r| r.to_vec()).collect::<Vec<_>>(),
                    },
                })
            })
            .collect();
        json!({
            "tool": "hyperlens-analysis",
            "version": env!("CARGO_PKG_VERSION"),
            "analysis": "latent codes: PCA, rule decoding train -> test, k-means, mean-code similarity",
            "train": {"source": &self.train_source, "n": self.n_train, "model_accuracy": self.train_model_accuracy},
            "test": {"source": &self.test_source, "n": self.n_test, "model_accuracy": self.test_model_accuracy},
            "code_dims": {"layers": l, "heads": h, "queries": q, "keys": k},
            "labels": &self.labels,
            "params": &self.params,
            "files": Self::FILES,
            "layers": layers,
        })
    }

    /// Wall-clock seconds of the analysis: `elapsed_s`, and per selection (`layer`, `all_layers`)
    /// the seconds of the PCA, decoding, clustering and similarity stages. Kept out of the tables
    /// because they change from run to run.
    pub fn timings(&self) -> serde_json::Value {
        let layers: Vec<serde_json::Value> = self
            .layers
            .iter()
            .map(|a| {
                json!({
                    "layer": a.layer.table_index(),
                    "all_layers": a.layer == LayerSel::All,
                    "pca": a.seconds[0],
                    "decoding": a.seconds[1],
                    "clustering": a.seconds[2],
                    "similarity": a.seconds[3],
                })
            })
            .collect();
        json!({"elapsed_s": self.elapsed_s, "layers": layers})
    }

    /// Writes the PCA projections as `.npz`: `layer{l}` and `all` `[N_u, k]` projections,
    /// `components_layer{l}` / `components_all` `[k, D]`, `explained_variance_ratio_layer{l}` /
    /// `explained_variance_ratio_all` `[D]`, and `label` (plus `target`, `correct` when stored)
    /// `[N_u]` of the unsupervised set; the names are [`hyperlens_io::keys::pca`].
    ///
    /// # Errors
    /// [`AnalysisError::File`] naming the path and array.
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
    /// [`AnalysisError::Io`] / [`AnalysisError::Npz`] naming the path that failed.
    pub fn write_tables(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).map_err(|source| AnalysisError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let mut written = Vec::new();
        let texts = [
            ("decoding.csv", self.decoding_csv()),
            ("pca.csv", self.pca_csv()),
            ("clusters.csv", self.clusters_csv()),
            ("similarity.csv", self.similarity_csv()),
            ("confusion.csv", self.confusion_csv()),
        ];
        for (name, text) in texts {
            let path = dir.join(name);
            hyperlens_io::write_atomic(&path, text.as_bytes())?;
            written.push(path);
        }
        let path = dir.join("pca.npz");
        self.write_pca_npz(&path)?;
        written.push(path);
        let path = dir.join("summary.json");
        hyperlens_io::write_json(&path, &self.summary())?;
        written.push(path);
        Ok(written)
    }
}
