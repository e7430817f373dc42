//! hyperlens-analysis: analyses of latent codes (PCA, rule decoding, clustering, similarity) and of
//! weights (QK/OV circuits, copying and composition scores, induction-head detection).
//!
//! Pure `ndarray` / `linfa` / `nalgebra`; this crate never imports candle.
//!
//! Latent codes (`docs/spec/latent-codes.md`): [`codes::CodeSet`] reads the probe's `.npz`,
//! [`pca`], [`decode`], [`cluster`] and [`similarity`] hold the analyses, and
//! [`codes::report::analyze_pair`] runs them all on an in-distribution / OOD pair and writes the
//! tables.

pub mod circuits;
pub mod cluster;
pub mod codes;
pub mod decode;
pub mod embed;
pub mod error;
mod kmeanspp;
pub mod lm;
mod multinomial;
pub mod pca;
pub mod similarity;
pub mod table;
pub mod terms;

pub use codes::report::{analyze_pair, LatentAnalysisParams, LatentReport};
pub use codes::CodeSet;
pub use error::{AnalysisError, Result};
