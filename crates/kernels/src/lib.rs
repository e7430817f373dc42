//! hyperlens-kernels: every hand-written CPU kernel of hyperlens, one module per instruction set,
//! and the one choice of instruction set ([`Isa`], detected once per process).
//!
//! - [`portable`]: the definition of each operation, in plain Rust written so that the compiler
//!   vectorises it (fixed lanes of partial sums, whole vectors of keys): the vectorisable `exp`
//!   ([`portable::exp_reduced`]), the tanh GELU (one argument, [`portable::gelu_tanh_arg`], with
//!   libm's `exp` for training's custom operation and with `exp_reduced` for the evaluation engine),
//!   LayerNorm (the engine's forward, training's backward), the bias additions, the rows of the
//!   attention (dot products, RMSHead's scales, the softmax of a row, masked or over padded keys,
//!   and its gradient; the K/V transposes, the scores, the standard value network; one problem's
//!   codes for each normalisation, [`portable::attention_codes`]), the language models' causal
//!   softmax row ([`portable::softmax_prefix`]), rotary embedding ([`portable::rope_half`]),
//!   SwiGLU ([`portable::silu_mul`]) and RMSNorm, alone or after the residual addition
//!   ([`portable::rms_norm`], [`portable::add_rms_norm`]), the blocked
//!   squared distances of the silhouette and k-means, and one row of the exact t-SNE gradient.
//! - [`avx2`] (x86-64): the same operations with AVX2 and FMA, either the portable code compiled
//!   again with those features or written with the intrinsics, in the portable code's operation
//!   order.
//! - [`avx512`] (x86-64): the distances and the t-SNE gradient with AVX-512F.
//! - [`packed`]: products `x W^T` with a constant matrix packed once into column panels
//!   ([`PackedMatrix`], the language models' projections), one chain of fused multiply-adds per
//!   output, with an AVX2 and an AVX-512 copy ([`Isa::matmul_packed`]); the panels on transparent
//!   huge pages when they fill one (`huge`).
//!
//! **Every copy gives the portable code's bits.** The copies do the same float operations in the
//! same order; FMA is only enabled, never asked for (Rust does not fuse a product and a sum on its
//! own), except in [`packed`], whose portable code asks for it (`f32::mul_add`) as its copies do,
//! so the choice of instruction set never changes a result. Tests hold each copy to the
//! portable one bit for bit (here, and the whole evaluation pass in `hyperlens-model`).
//!
//! Who calls what: `hyperlens-model`'s training operations (`ops/fast/`: the GELU, the LayerNorm and
//! softmax gradients, the HYLA mix) and its evaluation engine (`infer/`) call the portable kernels
//! and, through [`Isa`], their copies; `hyperlens-analysis` calls the distances and the t-SNE
//! gradient. The engine's per-problem attention pass (which row kernels run for each
//! normalisation, [`Isa::attention_codes`]) and the AVX2 form of its HYLA value network
//! ([`Isa::hyla_value`]) are here too, on plain slices and sizes; the model keeps only the portable
//! HYLA mix of training (`ops/fast/mix/`, which needs its plan with dropout and masks) and the
//! choice of which kernel to call. The crate depends on nothing but `std`, and on Linux `libc`
//! for the huge-page advice (no candle, so that `hyperlens-analysis` stays free of it).

mod attention;
mod huge;
mod isa;
pub mod packed;
pub mod portable;

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;

#[cfg(test)]
mod tests;

pub use attention::{AttentionScratch, CodesNorm};
pub use isa::Isa;
pub use packed::PackedMatrix;

/// Lanes of the float32 kernels: one AVX2 register of eight floats. The attention's keys are
/// padded to a multiple of this ([`padded`]), so that every loop over keys runs in whole vectors.
pub const LANES: usize = 8;

/// `t` rounded up to a multiple of [`LANES`].
#[inline]
pub fn padded(t: usize) -> usize {
    t.div_ceil(LANES) * LANES
}

/// Rows of points that [`Isa::squared_distances`] handles together (they share every load of the
/// transposed data).
pub const DISTANCE_ROWS: usize = 4;

/// Sizes of one problem's attention for the attention kernels: tokens, tokens padded to a multiple
/// of [`LANES`] (`Tp`), heads, head width, and the score scale `1 / sqrt(d)`.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Tokens.
    pub t: usize,
    /// Tokens padded to a multiple of [`LANES`].
    pub tp: usize,
    /// Heads.
    pub h: usize,
    /// Head width.
    pub d: usize,
    /// The score scale `1 / sqrt(d)`.
    pub scale: f32,
}

/// Sizes of one problem's HYLA value network ([`Isa::hyla_value`]): heads, queries, keys, head
/// width, and whether the hidden units pass through a ReLU (else linear).
#[derive(Debug, Clone, Copy)]
pub struct HylaShape {
    /// Heads.
    pub h: usize,
    /// Queries.
    pub q: usize,
    /// Keys.
    pub k: usize,
    /// Head width.
    pub d: usize,
    /// ReLU hidden units (else linear).
    pub relu: bool,
}
