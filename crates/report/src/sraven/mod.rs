//! The SRAVEN part of the report (Schug et al. 2025, Sections 3-4): for every SRAVEN checkpoint
//! the ID / OOD accuracy, the latent codes of the paper's site on unpermuted ID and OOD problems,
//! their analyses (PCA, rule decoding ID -> OOD, k-means, similarity), the training log and the
//! attention of one OOD problem.
//!
//! Split like every section: [`measure`] (the only part that runs the model), then [`figures`],
//! [`text`] with [`verdict`] and [`paper`] (what the numbers say), [`page`] (the part of the page)
//! and [`files`] (`tables/accuracy.csv`). The data types are in [`crate::data`].

pub mod explorer;
pub mod figures;
pub mod files;
pub mod measure;
pub mod page;
pub mod paper;
pub mod text;
pub mod verdict;
