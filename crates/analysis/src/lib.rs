//! hyperlens-analysis: analyses of latent codes (PCA, rule decoding, clustering, similarity) and of
//! weights (QK/OV circuits, copying and composition scores, induction-head detection).
//!
//! Pure `ndarray` / `linfa` / `nalgebra`; this crate never imports candle.

pub mod error;

pub use error::{AnalysisError, Result};
