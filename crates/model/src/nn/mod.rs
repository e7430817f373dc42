//! The layers of the crate's models, in candle's style (plain structs of tensors, a `forward`
//! taking the [`Ops`](crate::ops::Ops) choice): [`Linear`], [`LayerNorm`], [`Mlp`], [`Attention`]
//! with its positions and masks ([`position`]), and the pre-LayerNorm [`Block`] that the SRAVEN
//! [`crate::Transformer`] and hyperlens's token models ([`crate::lm::TokenModel`]) share, with one
//! construction and one initialisation path ([`params`]). The block is written once, generic over
//! its hook points ([`hook_point`]: [`NoHooks`] for the plain pass, a [`crate::HookFn`] for the
//! hooked one). The same layers run a stack of M models ([`crate::StackedTransformer`], the batched
//! model of `hyperlens train --seeds`): with a leading model axis on their weights (`[M, ...]`)
//! they run model `m` on its own slice of the activations (`[M, B, T, D]`), the affine maps as
//! batched products over the model axis and the operations without weights with it folded into
//! the batch.

pub mod attention;
pub mod block;
pub mod hook_point;
pub mod layer_norm;
pub mod linear;
pub mod mlp;
pub mod params;
pub mod position;

pub use attention::{Attention, AttentionInputs, AttentionOutput};
pub use block::{Block, BlockOutput, BlockSpec};
pub use hook_point::{HookPoints, NoHooks};
pub use layer_norm::LayerNorm;
pub use linear::Linear;
pub use mlp::Mlp;
pub use params::{InitRule, Params};
