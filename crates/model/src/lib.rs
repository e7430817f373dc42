//! hyperlens model: the SRAVEN transformer with its eight sequence mixers on candle, checkpoints and
//! importers. See `spec/models.md`.

pub mod error;

pub use error::{ModelError, Result};
