//! The 2-D projections of the explorer's code sets: the analysis crate's PCA (fit on the last
//! set per layer, every set projected on its axes, as the report's analysis fits the OOD set) or
//! its exact, seeded t-SNE per set and layer (the one deterministic setting,
//! [`TsneParams::deterministic`]).

use std::fmt;
use std::str::FromStr;

use hyperlens_analysis::embed::{tsne, TsneParams};
use hyperlens_analysis::pca::Pca;
use hyperlens_analysis::AnalysisError;
use ndarray::{s, Array2, Array4, ArrayView5, Axis};

use crate::error::{ReportError, Result};

/// How the explorer projects codes to two dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projection {
    /// PCA per layer, fit on the last set (`pca`).
    Pca,
    /// The exact t-SNE of each set per layer, seeded (`tsne` or `t-sne`).
    Tsne {
        /// The t-SNE seed.
        seed: u64,
    },
}

impl Projection {
    /// The projection named `name` (`pca`, `tsne` or `t-sne`), with `seed` for t-SNE.
    ///
    /// # Errors
    /// [`ReportError::InvalidInput`] for another name.
    pub fn parse(name: &str, seed: u64) -> Result<Self> {
        match name {
            "pca" => Ok(Projection::Pca),
            "tsne" | "t-sne" => Ok(Projection::Tsne { seed }),
            other => Err(ReportError::InvalidInput(format!(
                "projection must be \"pca\" or \"tsne\", got {other:?}"
            ))),
        }
    }

    /// The name in the figure's projection switch (`PCA`, `t-SNE`).
    pub fn label(&self) -> &'static str {
        match self {
            Projection::Pca => "PCA",
            Projection::Tsne { .. } => "t-SNE",
        }
    }

    /// The axis titles (`PC1`, `PC2` or `t-SNE 1`, `t-SNE 2`).
    pub fn axes(&self) -> [String; 2] {
        match self {
            Projection::Pca => ["PC1".into(), "PC2".into()],
            Projection::Tsne { .. } => ["t-SNE 1".into(), "t-SNE 2".into()],
        }
    }
}

impl fmt::Display for Projection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for Projection {
    type Err = ReportError;

    /// [`Projection::parse`] with seed 0.
    fn from_str(s: &str) -> Result<Self> {
        Projection::parse(s, 0)
    }
}

/// The projections of every set and the PCA's explained-variance ratio of PC1 and PC2 per layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Projected {
    /// One array per set, `[1, L, N_set, 2]` (one projection, every layer).
    pub points: Vec<Array4<f64>>,
    /// PC1 and PC2's explained-variance ratios per layer (zeros for t-SNE). `[L]`.
    pub explained: Vec<[f64; 2]>,
}

/// The codes of one layer as the float64 features `[N, H * Q * K]` (head, then query, then key:
/// the order of `CodeSet::features`).
fn layer_features(codes: &ArrayView5<'_, f32>, layer: usize) -> Result<Array2<f64>> {
    let (n, _, h, q, k) = codes.dim();
    let data: Vec<f64> = codes
        .index_axis(Axis(1), layer)
        .iter()
        .map(|&v| f64::from(v))
        .collect();
    Array2::from_shape_vec((n, h * q * k), data)
        .map_err(|e| ReportError::InvalidInput(format!("flattening layer {layer}: {e}")))
}

/// Projects every set's codes per layer (module docs). `names` name the sets in errors.
///
/// # Shapes
/// `codes[i]`: `[N_i, L, H, Q, K]`, the same `L, H, Q, K` for every set -> `points[i]`:
/// `[1, L, N_i, 2]`.
///
/// # Errors
/// [`ReportError::InvalidInput`] for no set; [`AnalysisError::Shape`] for sets whose code axes
/// differ (naming the set);
/// the analysis crate's errors of the PCA or t-SNE (too few codes for the t-SNE's perplexity,
/// non-finite codes).
pub fn project_codes(
    codes: &[ArrayView5<'_, f32>],
    names: &[String],
    projection: Projection,
) -> Result<Projected> {
    let last = codes
        .last()
        .ok_or_else(|| ReportError::InvalidInput("no code set given".into()))?;
    let (_, l, h, q, k) = last.dim();
    for (c, name) in codes.iter().zip(names) {
        let (_, cl, ch, cq, ck) = c.dim();
        if (cl, ch, cq, ck) != (l, h, q, k) {
            return Err(ReportError::Analysis(AnalysisError::Shape(format!(
                "{name}: codes of shape {:?}, not [N, {l}, {h}, {q}, {k}] as the other set's",
                c.shape()
            ))));
        }
    }
    let mut points: Vec<Array4<f64>> = codes
        .iter()
        .map(|c| Array4::zeros((1, l, c.dim().0, 2)))
        .collect();
    let mut explained = vec![[0.0, 0.0]; l];
    for (layer, ratio) in explained.iter_mut().enumerate() {
        match projection {
            Projection::Tsne { seed } => {
                for (c, out) in codes.iter().zip(points.iter_mut()) {
                    let x = layer_features(c, layer)?;
                    let emb = tsne(x.view(), &TsneParams::deterministic(seed, x.nrows()))?;
                    out.slice_mut(s![0, layer, .., ..]).assign(&emb);
                }
            }
            Projection::Pca => {
                let fit = Pca::params(2).fit(layer_features(last, layer)?.view())?;
                let r = fit.explained_variance_ratio();
                *ratio = [
                    r.get(0).copied().unwrap_or(0.0),
                    r.get(1).copied().unwrap_or(0.0),
                ];
                for (c, out) in codes.iter().zip(points.iter_mut()) {
                    let p = fit.transform(layer_features(c, layer)?.view())?;
                    if p.ncols() < 2 {
                        return Err(ReportError::InvalidInput(format!(
                            "the PCA of layer {layer} has {} components, not 2",
                            p.ncols()
                        )));
                    }
                    out.slice_mut(s![0, layer, .., ..])
                        .assign(&p.slice(s![.., 0..2]));
                }
            }
        }
    }
    Ok(Projected { points, explained })
}
