//! The layers of the crate's models, in candle's style (plain structs of tensors, a `forward`
//! taking the [`Ops`](crate::ops::Ops) choice): [`Linear`], [`LayerNorm`], [`Mlp`], [`Attention`]
//! with its positions and masks ([`position`]), and the pre-LayerNorm [`Block`] that the SRAVEN
//! [`crate::Transformer`] and the token models ([`crate::lm::TokenModel`]) share, with one
//! construction and one initialisation path ([`params`]).

pub mod attention;
pub mod block;
pub mod layer_norm;
pub mod linear;
pub mod mlp;
pub mod params;
pub mod position;

pub use attention::{Attention, AttentionOutput};
pub use block::{Block, BlockOutput, BlockSpec};
pub use layer_norm::LayerNorm;
pub use linear::Linear;
pub use mlp::Mlp;
pub use params::{InitRule, Params};
