//! The report's section "Is the latent code causal?": the transplant test of
//! [`hyperlens_probe::latent_transplant`] on every SRAVEN checkpoint (another rule's latent code put
//! at the paper's site of one layer; does the answer become that rule's?), with its controls, as a
//! figure, a table (`tables/causal.csv`) and sentences generated from the numbers.
//!
//! Split like every section: [`measure`] (the only part that runs the model), then
//! [`mod@figures`], [`text`], [`page`] and [`files`] (`tables/causal.csv`); the data type is
//! [`crate::data::CausalResult`].

pub mod figures;
pub mod files;
pub mod measure;
pub mod page;
pub mod text;

pub use figures::figures;
pub use files::csv;
pub(crate) use measure::run;
pub use page::section;
pub use text::{sentences, Sentences};
