//! The evaluation-mode forward pass of a [`Transformer`] on the CPU, without candle: the path that
//! latent-code extraction (`hyperlens probe`), `eval` and the report take.
//!
//! The maths is that of [`Transformer::forward`] (`docs/spec/models.md`, "The block"; the paper's
//! `hyla/models/transformer.py`), evaluated differently:
//!
//! - **No allocation per operation.** The batch is cut into chunks of [`CHUNK`] problems; each
//!   worker owns one set of buffers (residual stream, normalised rows, Q/K/V, head outputs, MLP
//!   hidden units, one problem's scores and codes) and reuses it for every chunk and layer. As
//!   candle operations every step of a layer is a fresh tensor: a `[B, H, T, T]` score tensor of a
//!   batch of 256 base-model problems is 21 MB, so the allocator served it with a fresh `mmap`
//!   that page-faulted and was zeroed at every layer (`CHANGELOG.md`, performance history).
//! - **Both cores on independent work.** Chunks run in parallel (rayon); within a chunk everything
//!   runs on one thread, so the cores do not wait on each other inside an operation.
//! - **The widest vector units.** The affine maps are `gemm` products with the crate's `x86-v4`
//!   (AVX-512) kernels, chosen at run time where the CPU has them. The per-problem attention loops
//!   run over contiguous keys (keys and values transposed to `[H, d, T]`), and they, LayerNorm, the
//!   bias additions and the GELU run with AVX2 and FMA where the CPU has them (the instruction set
//!   is `hyperlens_kernels::Isa`, detected once per process); their `exp` is a polynomial the
//!   compiler vectorises (`hyperlens_kernels::portable::exp_reduced`) instead of a libm call. In
//!   that copy the scores, the K/V transposes and the value sums are written with the AVX2
//!   intrinsics (`hyperlens_kernels::avx2`'s `scores`, `transpose_kv`, `dots` and `hyla_value`),
//!   in the portable loops' order, so with their bits (a unit test compares the two passes). The
//!   per-problem attention pass itself is `hyperlens_kernels`'s (`Isa::attention_codes`, compiled
//!   portable and with AVX2): the engine holds no hand-written kernel of its own.
//! - **One chunk stays in the caches.** A chunk of 8 base-model problems (288 rows) needs about
//!   1 MB of buffers.
//! - **Hooks.** [`Inference::run`] hands each layer's codes to a function that keeps what it needs
//!   (the probe keeps the site's few codes, not `[B, H, T, T]` per layer);
//!   [`Inference::run_hooked`] can read or replace the codes and the stream entering a block and
//!   start a pass from that stream, or from a block's state ([`Inference::block_state`]) when the
//!   hooks change one query's codes at that block, so that the block is computed for that query
//!   alone (the transplant test: about ten passes per problem and layer from one state).
//!
//! Per chunk and layer: LayerNorm 1, one product for Q, K and V together (the heads' kernels side
//! by side, `[D, 3 H d]`), per problem the scaled scores plus the relative-position bias, the
//! mixer's normalisation and value network (the HYLA value networks by the kernel of
//! `ops::fast::mix`, shared with training), the output projection into the residual stream;
//! LayerNorm 2, the tanh-GELU MLP; at the end the final LayerNorm and the unembedding at the last
//! `F` positions. The operations are the Fast forms' own, in the same order where it matters (the
//! bias added to a product before the product joins the residual stream; candle's LayerNorm with
//! the `E[x^2] - mean^2` variance), so the logits and codes equal [`Transformer::forward`]'s to
//! float32 rounding: the tests hold them within 1e-5 of each array's scale for every mixer, and on
//! the paper checkpoints as close to an independent float64 forward as candle's pass is (6.3e-6
//! against candle's 5.2e-6 on HYLA's layer-3 codes, whose scale is 3.9). Bit equality with candle
//! is not kept: its products sum in another order.
//!
//! The code is in one file per concern:
//!
//! - `pass.rs`: the pass orchestration (`impl Inference`: the weights' layout, the checks, the
//!   chunks in parallel, one block per chunk and layer);
//! - `attention.rs`: the per-problem attention pass (which kernels compute the codes for each
//!   normalisation, and the HYLA value network) and its dispatch on the instruction set;
//! - `buffers.rs`: the workers' buffers and their pool;
//! - `matmul.rs`: the `gemm` product.
//!
//! The hand-written kernels are not here: the vectorisable `exp`, the GELU, LayerNorm, the bias
//! additions, the softmax rows, RMSHead, the K/V transposes, the scores and the standard value
//! network are `hyperlens-kernels`'s (portable and AVX2), beside training's CPU kernels (the dot
//! products, RMSHead's scales and the masked softmax row are the very functions that training's
//! HYLA mix calls; the two GELUs share their argument and differ only in the `exp`); the HYLA value
//! networks are `ops::fast::mix`'s, the one home of that kernel for training and for this engine.

use crate::config::Config;
use crate::ops::fast::mix::Plan;
#[cfg(doc)]
use crate::transformer::Transformer;
#[cfg(doc)]
use buffers::Pooled;
use buffers::Work;
use hyperlens_kernels::Isa;
#[cfg(doc)]
use hyperlens_kernels::LANES;

mod attention;
mod buffers;
mod matmul;
mod pass;
#[cfg(test)]
mod tests;

/// Problems per chunk: the unit of parallel work and of buffer reuse.
pub const CHUNK: usize = 8;

/// The weights of one block, on the host, laid out for row-major products.
struct LayerWeights {
    /// LayerNorm 1 scale and bias `[D]`.
    ln1: (Vec<f32>, Vec<f32>),
    /// Q, K and V kernels side by side `[D, 3 H d]` (column `s H d + h d + e` for part `s`).
    w_qkv: Vec<f32>,
    /// Their biases `[3 H d]`.
    b_qkv: Vec<f32>,
    /// Output projection `[H d, D]` and bias `[D]`.
    w_o: Vec<f32>,
    /// See `w_o`.
    b_o: Vec<f32>,
    /// The relative-position bias `[H, T, Tp]`, each row padded with `-inf` to `Tp` keys (the
    /// number of keys rounded up to a multiple of [`LANES`]), so that padded keys score `-inf`.
    bias: Vec<f32>,
    /// LayerNorm 2 scale and bias `[D]`.
    ln2: (Vec<f32>, Vec<f32>),
    /// MLP input kernel `[D, d_mlp]` and bias.
    w_in: Vec<f32>,
    /// See `w_in`.
    b_in: Vec<f32>,
    /// MLP output kernel `[d_mlp, D]` and bias.
    w_out: Vec<f32>,
    /// See `w_out`.
    b_out: Vec<f32>,
}

/// A frozen copy of a [`Transformer`] for evaluation-mode forward passes on the CPU (module docs).
///
/// Built once per model ([`Inference::new`], a copy of the weights: 1.6 MB for the base SRAVEN
/// model); [`Inference::run`] then takes batches of any size.
pub struct Inference {
    config: Config,
    /// Embedding `[d_in, D]` and bias `[D]`.
    w_e: Vec<f32>,
    b_e: Vec<f32>,
    layers: Vec<LayerWeights>,
    /// Final LayerNorm scale and bias `[D]`.
    ln_final: (Vec<f32>, Vec<f32>),
    /// Unembedding `[D, d_out]` and bias `[d_out]`.
    w_u: Vec<f32>,
    b_u: Vec<f32>,
    /// Visibility per (query, key) pair `[T * T]` of a causal model.
    visible: Option<Vec<bool>>,
    /// The HYLA-style mix of `ops::fast::mix` (for the MLP value networks).
    plan: Option<Plan>,
    /// The instruction set of the kernels (`Isa::detected`; the tests set the portable one).
    isa: Isa,
    /// Workers' buffers kept between passes ([`Pooled`]): at most one set per rayon thread is
    /// made, however many passes run (the transplant test runs thousands of small ones).
    pool: std::sync::Mutex<Vec<Work>>,
}

impl std::fmt::Debug for Inference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inference")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What [`Inference::run`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceOutput {
    /// Logits `[B, F, d_out]`.
    pub logits: Vec<f32>,
    /// What the `take` function wrote, `[B, width]`.
    pub taken: Vec<f32>,
}

/// Where a pass of [`Inference::run_hooked`] starts.
#[derive(Debug, Clone, Copy)]
pub enum Start<'a> {
    /// From the inputs `x [B, T, d_in]`.
    Inputs(&'a [f32]),
    /// From the residual stream `[B, T, D]` entering block `layer` (hook
    /// `blocks.{layer}.hook_resid_pre`): blocks before it are not run. From the stream that a
    /// full pass produced there, the result is that pass's, bit for bit.
    Stream {
        /// The stream `[B, T, D]`.
        resid: &'a [f32],
        /// The first block run.
        layer: usize,
    },
    /// From the state of block `state.layer()` ([`Inference::block_state`]) for the problems
    /// `problems` (indices into the state's batch, in the pass's order; repeats allowed), when the
    /// hooks change the codes of that block at query `query` alone: the block is computed for that
    /// query only (its keys and values are the state's), and the stream leaving it elsewhere is
    /// the state's. At that block [`InferenceHooks::pattern`] gets codes whose rows of earlier
    /// queries are NaN, and [`InferenceHooks::resid_pre`] is not called. The result is that of
    /// [`Start::Stream`] from the state's stream with the same hooks, bit for bit, for hooks that
    /// keep to the query (the transplant test's passes: several per problem and layer, from one
    /// state).
    Query {
        /// The block's state.
        state: &'a BlockState,
        /// The problems of the pass.
        problems: &'a [usize],
        /// The query whose codes the hooks may change.
        query: usize,
    },
}

/// The state of one block for a batch of problems ([`Inference::block_state`]): the stream
/// entering it (`blocks.{l}.hook_resid_pre`), its Q, K and V, and the stream leaving it
/// (`blocks.{l}.hook_resid_post`), from which [`Start::Query`] passes start.
///
/// # Shapes
/// Streams `[B, T, D]`; Q, K and V side by side `[B, T, 3 H d]`.
#[derive(Debug, Clone)]
pub struct BlockState {
    layer: usize,
    batch: usize,
    pre: Vec<f32>,
    qkv: Vec<f32>,
    post: Vec<f32>,
}

impl BlockState {
    /// The block.
    pub fn layer(&self) -> usize {
        self.layer
    }

    /// Problems in the state's batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The stream leaving the block, `[B, T, D]` (the next block's `hook_resid_pre`).
    pub fn post(&self) -> &[f32] {
        &self.post
    }
}

/// Hook points of [`Inference::run_hooked`]: each is called per problem and layer, in layer
/// order, with the problem's index in the batch and its row of [`InferenceOutput::taken`]; each
/// may read or change the activation (TransformerLens's read and replace hooks, at two points).
/// Calls come from several threads at once, for different problems.
pub trait InferenceHooks: Sync {
    /// The residual stream entering block `layer`, `[T, D]` (`blocks.{layer}.hook_resid_pre`).
    fn resid_pre(&self, _layer: usize, _problem: usize, _resid: &mut [f32], _row: &mut [f32]) {}

    /// The normalised attention of block `layer`, `[H, T, T]` (the latent codes,
    /// `blocks.{layer}.attn.hook_pattern`), before the value network reads it.
    fn pattern(&self, _layer: usize, _problem: usize, _codes: &mut [f32], _row: &mut [f32]) {}

    /// The first query whose codes [`InferenceHooks::pattern`] reads or writes at the last block;
    /// `usize::MAX` for none. The pass computes the last block only for the queries from there and
    /// for the last `F` positions (the rows the logits read): nothing else of that block reaches
    /// an output. At the last block `pattern` then gets codes whose rows of earlier queries are
    /// NaN. The default, 0, computes every query.
    fn last_block_from_query(&self) -> usize {
        0
    }
}

/// No hooks: a plain pass (the last block only for the positions the logits read).
impl InferenceHooks for () {
    fn last_block_from_query(&self) -> usize {
        usize::MAX
    }
}

/// [`Inference::run`]'s `take(layer, codes [H, T, T], row)` as hooks: reads each layer's codes into
/// the problem's row.
pub struct TakeCodes<F>(pub F);

impl<F: Fn(usize, &[f32], &mut [f32]) + Sync> InferenceHooks for TakeCodes<F> {
    fn pattern(&self, layer: usize, _: usize, codes: &mut [f32], row: &mut [f32]) {
        (self.0)(layer, codes, row);
    }
}

/// [`TakeCodes`] for a `take` that reads, at the last block, only the codes of the queries from
/// `first_query` (`usize::MAX`: none), so that the pass computes no more of that block than the
/// logits and `take` need ([`InferenceHooks::last_block_from_query`]).
pub struct TakeCodesFrom<F> {
    /// The first query whose codes `take` reads at the last block.
    pub first_query: usize,
    /// `take(layer, codes [H, T, T], row)`, as for [`TakeCodes`].
    pub take: F,
}

impl<F: Fn(usize, &[f32], &mut [f32]) + Sync> InferenceHooks for TakeCodesFrom<F> {
    fn pattern(&self, layer: usize, _: usize, codes: &mut [f32], row: &mut [f32]) {
        (self.take)(layer, codes, row);
    }

    fn last_block_from_query(&self) -> usize {
        self.first_query
    }
}
