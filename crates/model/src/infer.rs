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
//!   that page-faulted and was zeroed at every layer (`docs/performance.md`).
//! - **Both cores on independent work.** Chunks run in parallel (rayon); within a chunk everything
//!   runs on one thread, so the cores do not wait on each other inside an operation.
//! - **The widest vector units.** The affine maps are `gemm` products with the crate's `x86-v4`
//!   (AVX-512) kernels, chosen at run time where the CPU has them. The per-problem attention loops
//!   run over contiguous keys (keys and values transposed to `[H, d, T]`), and they and the GELU
//!   are compiled a second time with AVX2 and FMA (`Kernels`, chosen at run time); their `exp`
//!   is a polynomial the compiler vectorises (`exp_reduced`) instead of a libm call. In that copy
//!   the scores, the K/V transposes and the value sums are written with the AVX2 intrinsics
//!   (`scores_avx2`, `transpose_kv_avx2`, `ops::fast::mix::value_from_codes_avx2` and `dots_avx2`),
//!   in the portable loops' order, so with their bits (a unit test compares the two passes).
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

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use ndarray::ArrayView3;
use rayon::prelude::*;

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::mixer::{Normalisation, ValueNetwork};
use crate::nn::position::relative_position_bucket;
use crate::ops::fast::mix::{dot, rms_head_scales, softmax_row, value_from_codes, Plan, Rows};
#[cfg(target_arch = "x86_64")]
use crate::ops::fast::mix::{dots_avx2, value_from_codes_avx2};
use crate::transformer::{ForwardOutput, Transformer, LN_EPS};

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
    /// The instruction set of the attention loops and the GELU.
    kernels: Kernels,
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

/// A tensor's values on the host in float32.
fn host(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1()?)
}

impl Inference {
    /// Copies `model`'s weights to the host and lays them out for [`Inference::run`].
    ///
    /// # Errors
    /// [`ModelError::Input`] if a weight is missing from the model; candle errors on the copy.
    pub fn new(model: &Transformer) -> Result<Inference> {
        let cfg = model.config().clone();
        let named: HashMap<&str, &Tensor> = model
            .named_tensors()
            .iter()
            .map(|(n, t)| (n.as_str(), t))
            .collect();
        let get = |name: &str| -> Result<Vec<f32>> {
            let t = named
                .get(name)
                .ok_or_else(|| ModelError::Input(format!("the model has no tensor {name}")))?;
            host(t)
        };
        let (dm, h, d, t) = (cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_tokens);
        let hd = h * d;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let p = |s: &str| format!("blocks.{l}.{s}");
            // [H, D, d] kernels -> columns of one [D, 3 H d] matrix.
            let mut w_qkv = vec![0f32; dm * 3 * hd];
            let mut b_qkv = Vec::with_capacity(3 * hd);
            for (part, (w, b)) in [("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")]
                .iter()
                .enumerate()
            {
                let w = get(&p(&format!("attn.{w}")))?;
                for hh in 0..h {
                    for row in 0..dm {
                        let src = &w[(hh * dm + row) * d..][..d];
                        w_qkv[row * 3 * hd + part * hd + hh * d..][..d].copy_from_slice(src);
                    }
                }
                b_qkv.extend(get(&p(&format!("attn.{b}")))?);
            }
            let table = get(&p("attn.rel_pos"))?;
            let tp = padded(t);
            let mut bias = vec![f32::NEG_INFINITY; h * t * tp];
            for hh in 0..h {
                for i in 0..t {
                    for j in 0..t {
                        bias[(hh * t + i) * tp + j] = table
                            [hh * cfg.n_buckets + relative_position_bucket(i, j, cfg.n_buckets)];
                    }
                }
            }
            layers.push(LayerWeights {
                ln1: (get(&p("ln1.w"))?, get(&p("ln1.b"))?),
                w_qkv,
                b_qkv,
                w_o: get(&p("attn.W_O"))?,
                b_o: get(&p("attn.b_O"))?,
                bias,
                ln2: (get(&p("ln2.w"))?, get(&p("ln2.b"))?),
                w_in: get(&p("mlp.W_in"))?,
                b_in: get(&p("mlp.b_in"))?,
                w_out: get(&p("mlp.W_out"))?,
                b_out: get(&p("mlp.b_out"))?,
            });
        }
        let visible = cfg.causal.then(|| {
            (0..t)
                .flat_map(|i| (0..t).map(move |j| j <= i))
                .collect::<Vec<bool>>()
        });
        let plan = match cfg.mixer.value_network() {
            ValueNetwork::Default => None,
            net => Some(Plan::evaluation(
                h,
                (t, t),
                d,
                cfg.mixer.normalisation(),
                net == ValueNetwork::MlpRelu,
                visible.clone(),
            )),
        };
        Ok(Inference {
            w_e: get("embed.W_E")?,
            b_e: get("embed.b_E")?,
            layers,
            ln_final: (get("ln_final.w")?, get("ln_final.b")?),
            w_u: get("unembed.W_U")?,
            b_u: get("unembed.b_U")?,
            visible,
            plan,
            kernels: Kernels::detect(),
            pool: std::sync::Mutex::new(Vec::new()),
            config: cfg,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The forward pass of `batch` problems; for every problem and layer it calls
    /// `take(layer, attention, row)`, where `attention [H, T, T]` is that layer's normalised
    /// attention (the latent codes, hook `blocks.{l}.attn.hook_pattern`) and `row` is the problem's
    /// `width` floats of [`InferenceOutput::taken`] (layers in order, so `take` may write any part
    /// of `row` at any layer). `take` runs on several threads at once, each with its own rows.
    ///
    /// # Shapes
    /// `x [B, T, d_in]` row-major (for SRAVEN one-hot tokens `[B, 36, 8]`); returns logits
    /// `[B, F, d_out]` and `taken [B, width]`.
    ///
    /// # Errors
    /// [`ModelError::Input`] if `x` does not hold `batch` problems of the model's shape or `batch`
    /// is 0.
    pub fn run<F>(&self, x: &[f32], batch: usize, width: usize, take: F) -> Result<InferenceOutput>
    where
        F: Fn(usize, &[f32], &mut [f32]) + Sync,
    {
        self.run_hooked(Start::Inputs(x), batch, width, &TakeCodes(take))
    }

    /// [`Inference::run_hooked`] from the inputs of a problem batch `x [B, T, d_in]` (an
    /// `ndarray` view in any memory layout; copied only where it is not standard).
    ///
    /// # Shapes
    /// `x [B, T, d_in]`; returns logits `[B, F, d_out]` and `taken [B, width]`.
    ///
    /// # Errors
    /// As [`Inference::run_hooked`].
    pub fn run_problems<H: InferenceHooks>(
        &self,
        x: ArrayView3<'_, f32>,
        width: usize,
        hooks: &H,
    ) -> Result<InferenceOutput> {
        let batch = x.dim().0;
        let x = x.as_standard_layout();
        let xs = x
            .as_slice()
            .ok_or_else(|| ModelError::Input("the problem batch is not contiguous".into()))?;
        self.run_hooked(Start::Inputs(xs), batch, width, hooks)
    }

    /// The forward pass of `batch` problems from `start`, with `hooks` (see [`InferenceHooks`]);
    /// each problem's row of [`InferenceOutput::taken`] has `width` floats, zero at the start.
    ///
    /// # Shapes
    /// `Start::Inputs(x [B, T, d_in])`, `Start::Stream { resid [B, T, D], layer }` or
    /// `Start::Query { state, problems [B], query }`; returns logits `[B, F, d_out]` and
    /// `taken [B, width]`.
    ///
    /// # Errors
    /// [`ModelError::Input`] if the start does not hold `batch` problems of the model's shape,
    /// `batch` is 0, the start layer is past the last block, or (`Start::Query`) a problem is
    /// outside the state's batch, the query outside the sequence or the state not of this model's
    /// shape.
    pub fn run_hooked<H: InferenceHooks>(
        &self,
        start: Start<'_>,
        batch: usize,
        width: usize,
        hooks: &H,
    ) -> Result<InferenceOutput> {
        let cfg = &self.config;
        let (t, dm, hd) = (cfg.n_tokens, cfg.d_model, cfg.n_heads * cfg.d_head);
        // What each chunk starts from: the start's floats per problem (0: indices instead).
        let per_problem = match start {
            Start::Inputs(x) => {
                check_floats(x, batch, t * cfg.d_in, "an input", [t, cfg.d_in])?;
                t * cfg.d_in
            }
            Start::Stream { resid, layer } => {
                self.check_layer(layer)?;
                check_floats(resid, batch, t * dm, "a stream", [t, dm])?;
                t * dm
            }
            Start::Query {
                state,
                problems,
                query,
            } => {
                self.check_layer(state.layer)?;
                let b = state.batch;
                if batch == 0
                    || problems.len() != batch
                    || query >= t
                    || problems.iter().any(|&p| p >= b)
                    || state.pre.len() != b * t * dm
                    || state.post.len() != b * t * dm
                    || state.qkv.len() != b * t * 3 * hd
                {
                    return Err(ModelError::Input(format!(
                        "a pass of {batch} problems from a block state of {b} problems at query {query}: give 1 or more problems below {b}, a query below {t} and a state of this model"
                    )));
                }
                0
            }
        };
        let per_logits = cfg.n_outputs * cfg.d_out;
        let mut logits = vec![0f32; batch * per_logits];
        let mut taken = vec![0f32; batch * width];
        let logit_chunks: Vec<&mut [f32]> = logits.chunks_mut(CHUNK * per_logits).collect();
        let taken_chunks: Vec<&mut [f32]> = if width == 0 {
            logit_chunks.iter().map(|_| Default::default()).collect()
        } else {
            taken.chunks_mut(CHUNK * width).collect()
        };
        logit_chunks
            .into_par_iter()
            .zip(taken_chunks)
            .enumerate()
            .for_each_init(
                || self.work(),
                |work, (c, (lg, tk))| {
                    let n = lg.len() / per_logits;
                    let part = c * CHUNK * per_problem..(c * CHUNK + n) * per_problem;
                    let from = match start {
                        Start::Inputs(x) => ChunkStart::Inputs(&x[part]),
                        Start::Stream { resid, layer } => ChunkStart::Stream(&resid[part], layer),
                        Start::Query {
                            state,
                            problems,
                            query,
                        } => ChunkStart::Query(state, &problems[c * CHUNK..][..n], query),
                    };
                    let pass = Pass {
                        first_problem: c * CHUNK,
                        n,
                        width,
                    };
                    self.chunk(work, &pass, from, lg, tk, hooks);
                },
            );
        Ok(InferenceOutput { logits, taken })
    }

    /// A worker's buffers: from the pool, or new when the pool is empty.
    fn work(&self) -> Pooled<'_> {
        let kept = self.pool.lock().ok().and_then(|mut p| p.pop());
        Pooled {
            work: Some(kept.unwrap_or_else(|| Work::new(&self.config, self.plan.as_ref()))),
            pool: &self.pool,
        }
    }

    /// [`ModelError::Input`] unless `layer` is one of the model's blocks.
    fn check_layer(&self, layer: usize) -> Result<()> {
        if layer >= self.config.n_layers {
            return Err(ModelError::Input(format!(
                "a pass from block {layer} of a model with {} blocks",
                self.config.n_layers
            )));
        }
        Ok(())
    }

    /// The state of block `layer` for `batch` problems whose stream entering it is `pre`
    /// (`blocks.{layer}.hook_resid_pre` of a plain pass): the block computed for every query,
    /// without hooks. Passes that change one query's codes at that block start from it
    /// ([`Start::Query`]).
    ///
    /// # Shapes
    /// `pre [B, T, D]`.
    ///
    /// # Errors
    /// [`ModelError::Input`] if `pre` does not hold `batch` streams of the model's shape, `batch`
    /// is 0 or `layer` is past the last block.
    pub fn block_state(&self, pre: &[f32], batch: usize, layer: usize) -> Result<BlockState> {
        let cfg = &self.config;
        let (t, dm, hd) = (cfg.n_tokens, cfg.d_model, cfg.n_heads * cfg.d_head);
        self.check_layer(layer)?;
        check_floats(pre, batch, t * dm, "a stream", [t, dm])?;
        let mut qkv = vec![0f32; batch * t * 3 * hd];
        let mut post = vec![0f32; batch * t * dm];
        post.par_chunks_mut(CHUNK * t * dm)
            .zip(qkv.par_chunks_mut(CHUNK * t * 3 * hd))
            .enumerate()
            .for_each_init(
                || self.work(),
                |w, (c, (post, qkv))| {
                    let n = post.len() / (t * dm);
                    let rows = n * t;
                    w.resid[..rows * dm].copy_from_slice(&pre[c * CHUNK * t * dm..][..rows * dm]);
                    let pass = Pass {
                        first_problem: c * CHUNK,
                        n,
                        width: 0,
                    };
                    self.block(w, layer, 0, &pass, &mut [], &());
                    post.copy_from_slice(&w.resid[..rows * dm]);
                    qkv.copy_from_slice(&w.qkv[..rows * 3 * hd]);
                },
            );
        Ok(BlockState {
            layer,
            batch,
            pre: pre.to_vec(),
            qkv,
            post,
        })
    }

    /// [`Transformer::forward`] by this pass: the same logits and (if `capture_attention`) the
    /// per-layer attention, as CPU tensors.
    ///
    /// # Shapes
    /// `x [B, T, d_in]` float32; returns logits `[B, F, d_out]` and attention `[B, H, T, T]` per
    /// layer.
    ///
    /// # Errors
    /// As [`Inference::run`]; [`ModelError::Input`] for an `x` of the wrong rank or dtype.
    pub fn forward(&self, x: &Tensor, capture_attention: bool) -> Result<ForwardOutput> {
        let cfg = &self.config;
        let (b, t, m) = x.dims3().map_err(|_| {
            ModelError::Input(format!(
                "input must be [batch, {}, {}] f32, got {:?}",
                cfg.n_tokens,
                cfg.d_in,
                x.dims()
            ))
        })?;
        if (t, m) != (cfg.n_tokens, cfg.d_in) || x.dtype() != DType::F32 {
            return Err(ModelError::Input(format!(
                "input must be [batch, {}, {}] f32, got {:?} {:?}",
                cfg.n_tokens,
                cfg.d_in,
                x.dims(),
                x.dtype()
            )));
        }
        let xs = host(x)?;
        let per_layer = cfg.n_heads * t * t;
        let width = if capture_attention {
            cfg.n_layers * per_layer
        } else {
            0
        };
        let out = self.run(&xs, b, width, |l, att, row| {
            row[l * per_layer..][..per_layer].copy_from_slice(att);
        })?;
        let logits = Tensor::from_vec(out.logits, (b, cfg.n_outputs, cfg.d_out), &Device::Cpu)?;
        let attention = if capture_attention {
            // [B, L, H, T, T] -> per layer [B, H, T, T].
            let all = Tensor::from_vec(
                out.taken,
                (b, cfg.n_layers, cfg.n_heads, t, t),
                &Device::Cpu,
            )?;
            Some(
                (0..cfg.n_layers)
                    .map(|l| Ok(all.narrow(1, l, 1)?.squeeze(1)?.contiguous()?))
                    .collect::<Result<Vec<_>>>()?,
            )
        } else {
            None
        };
        Ok(ForwardOutput { logits, attention })
    }

    /// One chunk of problems (`pass`) from `from` into `logits [n, F, d_out]` and
    /// `taken [n, width]`.
    fn chunk<H: InferenceHooks>(
        &self,
        w: &mut Work,
        pass: &Pass,
        from: ChunkStart<'_>,
        logits: &mut [f32],
        taken: &mut [f32],
        hooks: &H,
    ) {
        let cfg = &self.config;
        let (t, dm) = (cfg.n_tokens, cfg.d_model);
        let (n, f) = (pass.n, cfg.n_outputs);
        let rows = n * t;
        let first = match from {
            ChunkStart::Inputs(x) => {
                let resid = &mut w.resid[..rows * dm];
                matmul(resid, x, &self.w_e, (rows, cfg.d_in, dm));
                add_rows(resid, &self.b_e);
                0
            }
            ChunkStart::Stream(resid, layer) => {
                w.resid[..rows * dm].copy_from_slice(resid);
                layer
            }
            ChunkStart::Query(state, problems, query) => {
                self.query_block(w, pass, state, problems, query, taken, hooks);
                state.layer + 1
            }
        };
        // Rows per problem in `w.resid` after the last block: all T, or the last block's queries.
        let mut kept = t;
        for l in first..self.layers.len() {
            // The queries this block computes: all, but in the last block only those the logits
            // and the hooks read.
            let q0 = if l + 1 == self.layers.len() {
                hooks.last_block_from_query().min(t - f)
            } else {
                0
            };
            kept = self.block(w, l, q0, pass, taken, hooks);
        }
        // The last F positions of each problem.
        let resid = if kept == t {
            &w.resid[..rows * dm]
        } else {
            &w.resid_c[..n * kept * dm]
        };
        let last = &mut w.last[..n * f * dm];
        for p in 0..n {
            last[p * f * dm..][..f * dm]
                .copy_from_slice(&resid[(p * kept + kept - f) * dm..][..f * dm]);
        }
        let normed = &mut w.xn[..n * f * dm];
        self.kernels.layer_norm(last, &self.ln_final, normed);
        matmul(logits, normed, &self.w_u, (n * f, dm, cfg.d_out));
        add_rows(logits, &self.b_u);
    }

    /// Block `l` on the chunk's stream in `w.resid`, for the queries from `q0`, with the hooks.
    /// With `q0 = 0` the stream leaving the block replaces `w.resid`; otherwise it is written,
    /// for the queries from `q0` only, to `w.resid_c` (`[n, T - q0, D]`). Returns the rows per
    /// problem of the stream leaving the block (`T - q0`). Q, K and V stay in `w.qkv`.
    fn block<H: InferenceHooks>(
        &self,
        w: &mut Work,
        l: usize,
        q0: usize,
        pass: &Pass,
        taken: &mut [f32],
        hooks: &H,
    ) -> usize {
        let cfg = &self.config;
        let lw = &self.layers[l];
        let (t, dm, hd) = (cfg.n_tokens, cfg.d_model, cfg.n_heads * cfg.d_head);
        let (n, width) = (pass.n, pass.width);
        let rows = n * t;
        let resid = &mut w.resid[..rows * dm];
        for p in 0..n {
            hooks.resid_pre(
                l,
                pass.first_problem + p,
                &mut resid[p * t * dm..][..t * dm],
                taken_row(taken, width, p),
            );
        }
        // Attention.
        let xn = &mut w.xn[..rows * dm];
        self.kernels.layer_norm(resid, &lw.ln1, xn);
        let qkv = &mut w.qkv[..rows * 3 * hd];
        matmul(qkv, xn, &lw.w_qkv, (rows, dm, 3 * hd));
        self.kernels.add_rows(qkv, &lw.b_qkv);
        let o = &mut w.o[..rows * hd];
        for p in 0..n {
            self.attend(
                (&mut w.one, &mut w.rows),
                (l, q0),
                &qkv[p * t * 3 * hd..][..t * 3 * hd],
                (pass.first_problem + p, taken_row(taken, width, p)),
                hooks,
                &mut o[p * t * hd..][..t * hd],
            );
        }
        if q0 == 0 {
            self.finish_block(lw, resid, o, rows, &mut w.xn, &mut w.y, &mut w.hid);
            return t;
        }
        // The queries from q0 of every problem, gathered into whole rows.
        let kept = t - q0;
        let (resid_c, o_c) = (&mut w.resid_c[..n * kept * dm], &mut w.o_c[..n * kept * hd]);
        for p in 0..n {
            resid_c[p * kept * dm..][..kept * dm]
                .copy_from_slice(&resid[(p * t + q0) * dm..][..kept * dm]);
            o_c[p * kept * hd..][..kept * hd].copy_from_slice(&o[(p * t + q0) * hd..][..kept * hd]);
        }
        self.finish_block(lw, resid_c, o_c, n * kept, &mut w.xn, &mut w.y, &mut w.hid);
        kept
    }

    /// The block of a [`Start::Query`] pass for the chunk's `problems` (indices into `state`):
    /// query `query` alone, from the state's Q, K and V, with the hooks' `pattern`; the stream
    /// leaving the block into `w.resid`, the state's except at that query.
    #[allow(clippy::too_many_arguments)]
    fn query_block<H: InferenceHooks>(
        &self,
        w: &mut Work,
        pass: &Pass,
        state: &BlockState,
        problems: &[usize],
        query: usize,
        taken: &mut [f32],
        hooks: &H,
    ) {
        let cfg = &self.config;
        let l = state.layer;
        let lw = &self.layers[l];
        let (t, dm, hd) = (cfg.n_tokens, cfg.d_model, cfg.n_heads * cfg.d_head);
        let n = pass.n;
        let (resid_c, o_c) = (&mut w.resid_c[..n * dm], &mut w.o_c[..n * hd]);
        for (p, &src) in problems.iter().enumerate() {
            let o = &mut w.o[..t * hd];
            self.attend(
                (&mut w.one, &mut w.rows),
                (l, query),
                &state.qkv[src * t * 3 * hd..][..t * 3 * hd],
                (pass.first_problem + p, taken_row(taken, pass.width, p)),
                hooks,
                o,
            );
            o_c[p * hd..][..hd].copy_from_slice(&o[query * hd..][..hd]);
            resid_c[p * dm..][..dm].copy_from_slice(&state.pre[(src * t + query) * dm..][..dm]);
        }
        self.finish_block(lw, resid_c, o_c, n, &mut w.xn, &mut w.y, &mut w.hid);
        for (p, &src) in problems.iter().enumerate() {
            let resid = &mut w.resid[p * t * dm..][..t * dm];
            resid.copy_from_slice(&state.post[src * t * dm..][..t * dm]);
            resid[query * dm..][..dm].copy_from_slice(&w.resid_c[p * dm..][..dm]);
        }
    }

    /// One problem's attention at block `l` for the queries from `q0`: its codes from its Q, K
    /// and V `qkv [T, 3 H d]` (into `one`), the hooks' `pattern` (with the problem's index in the
    /// pass and its row of `taken`), and the value network into `o [T, H d]`.
    fn attend<H: InferenceHooks>(
        &self,
        (one, rows): (&mut Scratch, &mut Option<Rows>),
        (l, q0): (usize, usize),
        qkv: &[f32],
        (problem, row): (usize, &mut [f32]),
        hooks: &H,
        o: &mut [f32],
    ) {
        self.kernels.codes(
            &self.shape(),
            self.config.mixer.normalisation(),
            self.visible.as_deref(),
            q0,
            qkv,
            &self.layers[l].bias,
            one,
        );
        hooks.pattern(l, problem, &mut one.att, row);
        self.value(q0, one, rows, o);
    }

    /// The value network of one problem's codes in `one` (its values too), for the queries from
    /// `q0`, into `o [T, H d]`.
    fn value(&self, q0: usize, one: &mut Scratch, rows: &mut Option<Rows>, o: &mut [f32]) {
        match (&self.plan, rows) {
            (Some(plan), Some(rows)) => self.kernels.mix_value(
                plan,
                q0,
                &one.att,
                (&one.vt, padded(self.config.n_tokens)),
                o,
                rows,
            ),
            _ => self.kernels.value(&self.shape(), q0, &one.att, &one.vt, o),
        }
    }

    /// The sizes of one problem's attention.
    fn shape(&self) -> Shape {
        let cfg = &self.config;
        Shape {
            t: cfg.n_tokens,
            tp: padded(cfg.n_tokens),
            h: cfg.n_heads,
            d: cfg.d_head,
            scale: (1.0 / (cfg.d_head as f64).sqrt()) as f32,
        }
    }

    /// The rest of a block after the value network, on `rows` rows: the output projection of the
    /// heads' outputs `o [rows, H d]` into the stream `resid [rows, D]`, then LayerNorm 2 and the
    /// MLP (scratch `xn`, `y`, `hid`).
    #[allow(clippy::too_many_arguments)]
    fn finish_block(
        &self,
        lw: &LayerWeights,
        resid: &mut [f32],
        o: &[f32],
        rows: usize,
        xn: &mut [f32],
        y: &mut [f32],
        hid: &mut [f32],
    ) {
        let cfg = &self.config;
        let (dm, hd) = (cfg.d_model, cfg.n_heads * cfg.d_head);
        let (resid, o) = (&mut resid[..rows * dm], &o[..rows * hd]);
        let (xn, y) = (&mut xn[..rows * dm], &mut y[..rows * dm]);
        matmul(y, o, &lw.w_o, (rows, hd, dm));
        self.kernels.add_biased(resid, y, &lw.b_o);
        self.kernels.layer_norm(resid, &lw.ln2, xn);
        let hid = &mut hid[..rows * cfg.d_mlp];
        matmul(hid, xn, &lw.w_in, (rows, dm, cfg.d_mlp));
        self.kernels.add_rows(hid, &lw.b_in);
        self.kernels.gelu(hid);
        matmul(y, hid, &lw.w_out, (rows, cfg.d_mlp, dm));
        self.kernels.add_biased(resid, y, &lw.b_out);
    }
}

/// Lanes of the attention loops: keys are padded to a multiple of this, so that every loop over
/// keys runs in whole vectors of eight floats (one AVX2 register), with no scalar tail.
const LANES: usize = 8;

/// `t` rounded up to a multiple of [`LANES`].
fn padded(t: usize) -> usize {
    t.div_ceil(LANES) * LANES
}

/// Sizes of one problem's attention: tokens, tokens padded to a multiple of [`LANES`] (`Tp`),
/// heads, head width, and the score scale `1 / sqrt(d)`.
struct Shape {
    t: usize,
    tp: usize,
    h: usize,
    d: usize,
    scale: f32,
}

/// The per-problem attention loops ([`codes_of_problem`], [`default_value`], the HYLA value network
/// of `ops::fast::mix`), the GELU, LayerNorm and the bias additions, compiled twice: for the
/// baseline x86-64 instruction set, and with AVX2 and FMA for CPUs that have them (chosen once, at
/// run time). The loops are the same code, or in the AVX2 copy (scores, K/V transposes, value sums)
/// intrinsics that do the same operations in the same order, so both give the same bits; FMA is
/// only enabled, never asked for (Rust does not fuse a product and a sum on its own).
#[derive(Debug, Clone, Copy)]
enum Kernels {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernels {
    /// AVX2 with FMA where this CPU has both.
    fn detect() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Kernels::Avx2;
        }
        Kernels::Baseline
    }

    /// [`codes_of_problem`] with this instruction set.
    // The workspace denies `unsafe`; calling a function compiled for more features than the
    // baseline needs it.
    #[allow(unsafe_code, clippy::too_many_arguments)]
    fn codes(
        self,
        shape: &Shape,
        norm: Normalisation,
        visible: Option<&[bool]>,
        q0: usize,
        qkv: &[f32],
        bias: &[f32],
        w: &mut Scratch,
    ) {
        match self {
            Kernels::Baseline => codes_of_problem::<false>(shape, norm, visible, q0, qkv, bias, w),
            // SAFETY: `Kernels::Avx2` is only made by `detect`, after the CPU reported AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { codes_avx2(shape, norm, visible, q0, qkv, bias, w) },
        }
    }

    /// [`gelu_in_place`] with this instruction set.
    #[allow(unsafe_code)]
    fn gelu(self, v: &mut [f32]) {
        match self {
            Kernels::Baseline => gelu_in_place(v),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { gelu_avx2(v) },
        }
    }

    /// [`layer_norm`] with this instruction set.
    #[allow(unsafe_code)]
    fn layer_norm(self, x: &[f32], wb: &(Vec<f32>, Vec<f32>), y: &mut [f32]) {
        match self {
            Kernels::Baseline => layer_norm(x, wb, y),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { layer_norm_avx2(x, wb, y) },
        }
    }

    /// [`add_rows`] with this instruction set.
    #[allow(unsafe_code)]
    fn add_rows(self, x: &mut [f32], b: &[f32]) {
        match self {
            Kernels::Baseline => add_rows(x, b),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { add_rows_avx2(x, b) },
        }
    }

    /// [`add_biased`] with this instruction set.
    #[allow(unsafe_code)]
    fn add_biased(self, resid: &mut [f32], y: &[f32], b: &[f32]) {
        match self {
            Kernels::Baseline => add_biased(resid, y, b),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { add_biased_avx2(resid, y, b) },
        }
    }

    /// [`default_value`] with this instruction set.
    #[allow(unsafe_code)]
    fn value(self, shape: &Shape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
        match self {
            Kernels::Baseline => default_value(shape, q0, att, vt, o),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { value_avx2(shape, q0, att, vt, o) },
        }
    }

    /// `ops::fast::mix`'s [`value_from_codes`] (the HYLA value networks) with this instruction
    /// set, from the values transposed and padded, `vt [H, d, Tp]` with `Tp` = [`padded`]`(T)`
    /// (with AVX2 `value_from_codes_avx2`).
    #[allow(unsafe_code)]
    fn mix_value(
        self,
        plan: &Plan,
        q0: usize,
        att: &[f32],
        (vt, tp): (&[f32], usize),
        o: &mut [f32],
        rows: &mut Rows,
    ) {
        match self {
            Kernels::Baseline => value_from_codes(plan, q0, att, (vt, tp), o, rows),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { value_from_codes_avx2(plan, q0, att, vt, o, rows) },
        }
    }
}

/// [`codes_of_problem`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn codes_avx2(
    shape: &Shape,
    norm: Normalisation,
    visible: Option<&[bool]>,
    q0: usize,
    qkv: &[f32],
    bias: &[f32],
    w: &mut Scratch,
) {
    codes_of_problem::<true>(shape, norm, visible, q0, qkv, bias, w);
}

/// [`layer_norm`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn layer_norm_avx2(x: &[f32], wb: &(Vec<f32>, Vec<f32>), y: &mut [f32]) {
    layer_norm(x, wb, y);
}

/// [`add_rows`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn add_rows_avx2(x: &mut [f32], b: &[f32]) {
    add_rows(x, b);
}

/// [`add_biased`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn add_biased_avx2(resid: &mut [f32], y: &[f32], b: &[f32]) {
    add_biased(resid, y, b);
}

/// [`gelu_in_place`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gelu_avx2(v: &mut [f32]) {
    gelu_in_place(v);
}

/// [`default_value`] with AVX2: each query's `d` dots per head by [`dots_avx2`] (the same bits),
/// for the head widths with a copy of their own; others compile [`default_value`] with AVX2 and
/// FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn value_avx2(shape: &Shape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
    /// The loops for head width `D`.
    #[target_feature(enable = "avx2,fma")]
    fn of_width<const D: usize>(shape: &Shape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
        let (t, tp, h) = (shape.t, shape.tp, shape.h);
        for i in q0..t {
            for hh in 0..h {
                dots_avx2::<D>(
                    &att[(hh * t + i) * t..][..t],
                    (&vt[hh * D * tp..][..D * tp], tp),
                    &mut o[(i * h + hh) * D..][..D],
                );
            }
        }
    }
    match shape.d {
        1 => of_width::<1>(shape, q0, att, vt, o),
        2 => of_width::<2>(shape, q0, att, vt, o),
        4 => of_width::<4>(shape, q0, att, vt, o),
        8 => of_width::<8>(shape, q0, att, vt, o),
        _ => default_value(shape, q0, att, vt, o),
    }
}

/// One problem's codes at one layer, from its Q, K and V rows `qkv [T, 3 H d]` and the layer's
/// padded position bias `[H, T, Tp]`: keys and values transposed to `w.kt`, `w.vt` `[H, d, Tp]`
/// (so that the loops run over contiguous keys; the padded keys stay zero);
/// per head and query the scaled scores plus bias,
/// `s[j] = (sum_e q[i, h, e] k[h, e, j]) / sqrt(d) + bias[h, i, j]`, over the `Tp` padded keys
/// (`-inf` on the padding), normalised at once into the codes `w.att [H, T, T]` (the reference's
/// `normalise`): softmax over the visible keys; none (0 where masked); RMSHead
/// `m / sqrt(mean_h m^2 + eps)` over the heads of each pair. Only the queries from `q0` are
/// computed; the rows of earlier ones are NaN. `AVX2`: the transposes and the scores by
/// [`transpose_kv_avx2`] and [`scores_avx2`] (only in [`codes_avx2`], which runs where the CPU
/// has AVX2 and FMA).
#[inline(always)]
fn codes_of_problem<const AVX2: bool>(
    shape: &Shape,
    norm: Normalisation,
    visible: Option<&[bool]>,
    q0: usize,
    qkv: &[f32],
    bias: &[f32],
    w: &mut Scratch,
) {
    let (t, tp, h, d) = (shape.t, shape.tp, shape.h, shape.d);
    let hd = h * d;
    transpose_kv::<AVX2>(qkv, (t, tp, hd), &mut w.kt, &mut w.vt);
    for hh in 0..h {
        w.att[hh * t * t..][..q0 * t].fill(f32::NAN);
        let kt = &w.kt[hh * d * tp..][..d * tp];
        if norm == Normalisation::Softmax && visible.is_none() {
            // Two queries at a time, so that the two rows' chains of dependent steps (maximum,
            // `exp`, sum, scaling) overlap; each row's arithmetic is that of one row alone.
            let q = |i: usize| &qkv[i * 3 * hd + hh * d..][..d];
            let b = |i: usize| &bias[(hh * t + i) * tp..][..tp];
            let (s0, s1) = w.s.split_at_mut(tp);
            let (e0, e1) = w.e.split_at_mut(tp);
            let mut i = q0;
            while i + 1 < t {
                score_row::<AVX2>(q(i), kt, shape.scale, b(i), s0);
                score_row::<AVX2>(q(i + 1), kt, shape.scale, b(i + 1), s1);
                let (a0, a1) = w.att[(hh * t + i) * t..][..2 * t].split_at_mut(t);
                softmax_padded_rows([&*s0, &*s1], [&mut *e0, &mut *e1], [a0, a1]);
                i += 2;
            }
            if i < t {
                score_row::<AVX2>(q(i), kt, shape.scale, b(i), s0);
                softmax_padded(s0, e0, &mut w.att[(hh * t + i) * t..][..t]);
            }
            continue;
        }
        for i in q0..t {
            let q = &qkv[i * 3 * hd + hh * d..][..d];
            let b = &bias[(hh * t + i) * tp..][..tp];
            let a = &mut w.att[(hh * t + i) * t..][..t];
            let vis = visible.map(|v| &v[i * t..][..t]);
            if norm != Normalisation::Softmax && vis.is_none() {
                // The scores are the codes (RMSHead scales them below): straight into the row.
                score_row::<AVX2>(q, kt, shape.scale, b, a);
                continue;
            }
            let s = &mut w.s[..tp];
            score_row::<AVX2>(q, kt, shape.scale, b, s);
            // (Softmax with every key visible took the two-row path above.)
            match (norm, vis) {
                (Normalisation::Softmax, vis) => softmax_row(&s[..t], vis, a),
                (_, None) => a.copy_from_slice(&s[..t]),
                (_, Some(vis)) => {
                    for ((a, &x), &on) in a.iter_mut().zip(&s[..t]).zip(vis) {
                        *a = if on { x } else { 0.0 };
                    }
                }
            }
        }
    }
    if norm == Normalisation::RmsHead {
        rms_head(q0 * t, &mut w.att, &mut w.r);
    }
}

/// One problem's keys and values transposed, from its rows `qkv [T, 3 H d]` into `kt`, `vt`
/// `[H d, Tp]` (column `c` of the keys, `qkv[j, H d + c]`, into row `c` of `kt`; the padded keys
/// `T..Tp` are left as they are, zero). By [`transpose_kv_avx2`] when `AVX2` and `H d` is a multiple
/// of [`LANES`].
#[inline(always)]
fn transpose_kv<const AVX2: bool>(
    qkv: &[f32],
    (t, tp, hd): (usize, usize, usize),
    kt: &mut [f32],
    vt: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 && hd % LANES == 0 {
        // SAFETY: as in `score_row`.
        #[allow(unsafe_code)]
        unsafe {
            transpose_kv_avx2(qkv, (t, tp, hd), kt, vt);
        }
        return;
    }
    for j in 0..t {
        let row = &qkv[j * 3 * hd..][..3 * hd];
        for c in 0..hd {
            kt[c * tp + j] = row[hd + c];
            vt[c * tp + j] = row[2 * hd + c];
        }
    }
}

/// [`transpose_kv`] in blocks of 8 keys x 8 columns, each transposed in registers (AVX2 shuffles);
/// the rows of a last, partial block past `T` are zeros, so the padded keys are written as zero.
/// `H d` must be a multiple of [`LANES`] and `Tp` of `LANES`, at least `T`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn transpose_kv_avx2(
    qkv: &[f32],
    (t, tp, hd): (usize, usize, usize),
    kt: &mut [f32],
    vt: &mut [f32],
) {
    use std::arch::x86_64::{
        __m256, _mm256_loadu_ps, _mm256_permute2f128_ps, _mm256_setzero_ps, _mm256_shuffle_ps,
        _mm256_storeu_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps,
    };
    assert!(
        hd % LANES == 0
            && tp % LANES == 0
            && t <= tp
            && qkv.len() >= t * 3 * hd
            && kt.len() >= hd * tp
            && vt.len() >= hd * tp,
        "transpose_kv: {t} keys padded to {tp}, {hd} columns, {} / {} / {} floats",
        qkv.len(),
        kt.len(),
        vt.len()
    );
    let src = qkv.as_ptr();
    for (part, dst) in [(1, kt.as_mut_ptr()), (2, vt.as_mut_ptr())] {
        for j0 in (0..t).step_by(LANES) {
            for c0 in (0..hd).step_by(LANES) {
                let mut r = [_mm256_setzero_ps(); LANES];
                for (k, r) in r.iter_mut().enumerate().take(t - j0) {
                    // SAFETY: `j0 + k < T` and `part hd + c0 + LANES <= 3 hd`, inside `qkv`.
                    *r = unsafe { _mm256_loadu_ps(src.add((j0 + k) * 3 * hd + part * hd + c0)) };
                }
                // The 8 x 8 transpose: pairs, then quadruples of lanes, then the 128-bit halves.
                let u: [__m256; LANES] = [
                    _mm256_unpacklo_ps(r[0], r[1]),
                    _mm256_unpackhi_ps(r[0], r[1]),
                    _mm256_unpacklo_ps(r[2], r[3]),
                    _mm256_unpackhi_ps(r[2], r[3]),
                    _mm256_unpacklo_ps(r[4], r[5]),
                    _mm256_unpackhi_ps(r[4], r[5]),
                    _mm256_unpacklo_ps(r[6], r[7]),
                    _mm256_unpackhi_ps(r[6], r[7]),
                ];
                let s: [__m256; LANES] = [
                    _mm256_shuffle_ps::<0x44>(u[0], u[2]),
                    _mm256_shuffle_ps::<0xEE>(u[0], u[2]),
                    _mm256_shuffle_ps::<0x44>(u[1], u[3]),
                    _mm256_shuffle_ps::<0xEE>(u[1], u[3]),
                    _mm256_shuffle_ps::<0x44>(u[4], u[6]),
                    _mm256_shuffle_ps::<0xEE>(u[4], u[6]),
                    _mm256_shuffle_ps::<0x44>(u[5], u[7]),
                    _mm256_shuffle_ps::<0xEE>(u[5], u[7]),
                ];
                let cols: [__m256; LANES] = [
                    _mm256_permute2f128_ps::<0x20>(s[0], s[4]),
                    _mm256_permute2f128_ps::<0x20>(s[1], s[5]),
                    _mm256_permute2f128_ps::<0x20>(s[2], s[6]),
                    _mm256_permute2f128_ps::<0x20>(s[3], s[7]),
                    _mm256_permute2f128_ps::<0x31>(s[0], s[4]),
                    _mm256_permute2f128_ps::<0x31>(s[1], s[5]),
                    _mm256_permute2f128_ps::<0x31>(s[2], s[6]),
                    _mm256_permute2f128_ps::<0x31>(s[3], s[7]),
                ];
                for (m, col) in cols.into_iter().enumerate() {
                    // SAFETY: `c0 + m < hd` and `j0 + LANES <= Tp`, inside `dst [hd, Tp]`.
                    unsafe { _mm256_storeu_ps(dst.add((c0 + m) * tp + j0), col) };
                }
            }
        }
    }
}

/// [`scores`], by [`scores_avx2`] when `AVX2` (in [`codes_of_problem`]'s AVX2 copy).
#[inline(always)]
fn score_row<const AVX2: bool>(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `codes_of_problem::<true>` is only called from `codes_avx2`, which
        // `Kernels::codes` calls only after the CPU reported AVX2 and FMA.
        #[allow(unsafe_code)]
        unsafe {
            scores_avx2(q, kt, scale, b, s);
        }
        return;
    }
    scores(q, kt, scale, b, s);
}

/// [`scores`] written with the AVX2 intrinsics: per lane `acc = 0`, then `acc += q[e] kt[e, j]`
/// for `e = 0, 1, ..`, then `acc scale + b[j]`, each product and sum rounded on its own (no FMA),
/// so the same bits as [`scores`]. The portable loop, compiled for AVX2, kept its slice bounds and
/// loop state in memory (`docs/performance.md`). The usual head widths get a copy with the width
/// known at compile time; other widths take [`scores`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn scores_avx2(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    match q.len() {
        1 => score_row_avx2::<1>(q, kt, scale, b, s),
        2 => score_row_avx2::<2>(q, kt, scale, b, s),
        4 => score_row_avx2::<4>(q, kt, scale, b, s),
        8 => score_row_avx2::<8>(q, kt, scale, b, s),
        16 => score_row_avx2::<16>(q, kt, scale, b, s),
        _ => scores(q, kt, scale, b, s),
    }
}

/// [`scores_avx2`] for head width `D`: `q [D]`, `kt [D, Tp]`, `b [Tp]` (`Tp` a multiple of
/// [`LANES`]) into `s [W]`, `W <= Tp` (the last chunk's lanes past `W` are not written).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn score_row_avx2<const D: usize>(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_cmpgt_epi32, _mm256_loadu_ps, _mm256_maskstore_ps, _mm256_mul_ps,
        _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let (tp, width) = (b.len(), s.len());
    assert!(
        q.len() == D && tp % LANES == 0 && width <= tp && kt.len() >= D * tp,
        "scores: a query of {} floats, {} keys, {width} scores, {} key floats",
        q.len(),
        tp,
        kt.len()
    );
    let mut qv = [_mm256_setzero_ps(); D];
    for (v, &x) in qv.iter_mut().zip(q) {
        *v = _mm256_set1_ps(x);
    }
    let vscale = _mm256_set1_ps(scale);
    let (kp, bp, sp) = (kt.as_ptr(), b.as_ptr(), s.as_mut_ptr());
    let full = width / LANES;
    for c in 0..width.div_ceil(LANES) {
        let at = c * LANES;
        let mut acc = _mm256_setzero_ps();
        for (e, &qe) in qv.iter().enumerate() {
            // SAFETY: `e < D` and `at + LANES <= Tp`, so `e Tp + at + LANES <= D Tp <= kt.len()`.
            let k = unsafe { _mm256_loadu_ps(kp.add(e * tp + at)) };
            acc = _mm256_add_ps(acc, _mm256_mul_ps(qe, k));
        }
        // SAFETY: `at + LANES <= Tp = b.len()`.
        let bias = unsafe { _mm256_loadu_ps(bp.add(at)) };
        let v = _mm256_add_ps(_mm256_mul_ps(acc, vscale), bias);
        if c < full {
            // SAFETY: `c < full`, so `at + LANES <= W = s.len()`.
            unsafe { _mm256_storeu_ps(sp.add(at), v) };
        } else {
            // The last `W - at < LANES` scores: lanes below that count are stored, the others
            // neither read nor written.
            let mask = _mm256_cmpgt_epi32(
                _mm256_set1_epi32((width - at) as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            // SAFETY: only the lanes `l < W - at` are stored, at `at + l < W = s.len()`.
            unsafe { _mm256_maskstore_ps(sp.add(at), mask, v) };
        }
    }
}

/// One row of scaled scores plus bias over the padded keys: `s[j] = (sum_e q[e] kt[e, j]) scale +
/// b[j]` for `q [d]`, `kt [d, Tp]`, `b [Tp]` into `s [Tp]` (or into the `T` real keys' `s [T]`),
/// eight keys at a time with the sum over
/// `e` in a register (the sum runs in the order `e = 0, 1, ..`). The usual head widths get a copy
/// with `d` known at compile time, so that the loop over `e` is unrolled.
#[inline(always)]
fn scores(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    match q.len() {
        1 => scores_of_width::<1>(q, kt, scale, b, s),
        2 => scores_of_width::<2>(q, kt, scale, b, s),
        4 => scores_of_width::<4>(q, kt, scale, b, s),
        8 => scores_of_width::<8>(q, kt, scale, b, s),
        16 => scores_of_width::<16>(q, kt, scale, b, s),
        _ => score_chunks(q, kt, scale, b, s),
    }
}

/// [`scores`] for head width `D` (the length of `q` known to the compiler).
#[inline(always)]
fn scores_of_width<const D: usize>(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    let q: [f32; D] = q.try_into().expect("a query row of the head width");
    score_chunks(&q, &kt[..D * b.len()], scale, b, s);
}

/// The loops of [`scores`]; `s` may also be a row of `T` scores, shorter than the padded `b`
/// (`Tp`): its last chunk is then written lane by lane.
#[inline(always)]
fn score_chunks(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    let tp = b.len();
    let mut out = s.chunks_exact_mut(LANES);
    let mut c = 0;
    for s in &mut out {
        let s: &mut [f32; LANES] = s.try_into().expect("a chunk of LANES");
        *s = score_chunk(q, kt, tp, scale, b, c);
        c += 1;
    }
    let tail = out.into_remainder();
    if !tail.is_empty() {
        let last = score_chunk(q, kt, tp, scale, b, c);
        for (s, &v) in tail.iter_mut().zip(&last) {
            *s = v;
        }
    }
}

/// Chunk `c` (keys `8 c .. 8 c + 8`) of [`score_chunks`], with the sum over the head width in a
/// register.
// A function, not a closure: a closure is compiled on its own, without the AVX2 of its caller.
#[inline(always)]
fn score_chunk(q: &[f32], kt: &[f32], tp: usize, scale: f32, b: &[f32], c: usize) -> [f32; LANES] {
    let mut acc = [0f32; LANES];
    for (e, &qe) in q.iter().enumerate() {
        let k = &kt[e * tp + c * LANES..][..LANES];
        for l in 0..LANES {
            acc[l] += qe * k[l];
        }
    }
    let b = &b[c * LANES..][..LANES];
    for l in 0..LANES {
        acc[l] = acc[l] * scale + b[l];
    }
    acc
}

/// The softmax of a row of scores over padded keys with every real key visible, `a = exp(x - max)
/// / sum exp(x - max)`, by [`exp_reduced`] in whole vectors: `s [Tp]` (a multiple of [`LANES`],
/// `-inf` on the padding), `e [Tp]` scratch, into `a [T]`. The padding's `exp` is that of the
/// clamp, about 1e-38, below the rounding of the sum (at least 1, the maximum's term). A row with
/// a NaN gives NaN (the `exp` of NaN is NaN and the sum with it).
#[inline(always)]
fn softmax_padded(s: &[f32], e: &mut [f32], a: &mut [f32]) {
    softmax_padded_rows([s], [e], [a]);
}

/// [`softmax_padded`] of `R` rows side by side: each step runs over all the rows before the
/// next, so that their dependency chains overlap; every row's arithmetic, and so its bits, are
/// those of the row alone.
#[inline(always)]
fn softmax_padded_rows<const R: usize>(s: [&[f32]; R], e: [&mut [f32]; R], a: [&mut [f32]; R]) {
    // The maximum and the sum over eight lanes (reductions in a fixed order that vectorise).
    let mut lanes = [[f32::NEG_INFINITY; LANES]; R];
    for (lanes, s) in lanes.iter_mut().zip(&s) {
        for c in s.chunks_exact(LANES) {
            for (l, &x) in lanes.iter_mut().zip(c) {
                *l = if x > *l { x } else { *l };
            }
        }
    }
    let mut mx = [f32::NEG_INFINITY; R];
    for (m, lanes) in mx.iter_mut().zip(&lanes) {
        for &x in lanes {
            *m = if x > *m { x } else { *m };
        }
    }
    // (Separate loops: fused, the `exp` did not vectorise.)
    let mut e = e;
    for ((e, s), &mx) in e.iter_mut().zip(&s).zip(&mx) {
        for (e, &x) in e.iter_mut().zip(s.iter()) {
            *e = exp_reduced(x - mx);
        }
    }
    let mut acc = [[0f32; LANES]; R];
    for (acc, e) in acc.iter_mut().zip(&e) {
        for c in e.chunks_exact(LANES) {
            for l in 0..LANES {
                acc[l] += c[l];
            }
        }
    }
    let mut inv = [0f32; R];
    for (inv, acc) in inv.iter_mut().zip(&acc) {
        let mut sum = 0f32;
        for &x in acc {
            sum += x;
        }
        *inv = 1.0 / sum;
    }
    for ((a, e), &inv) in a.into_iter().zip(&e).zip(&inv) {
        for (a, &v) in a.iter_mut().zip(e.iter()) {
            *a = v * inv;
        }
    }
}

/// RMSHead in place on one problem's masked scores `a [H, T, T]`, for the pairs from `p0` (pair
/// `i T + j`): every pair's scores times [`rms_head_scales`] (the paper's Eq. 5, shared with the
/// training kernel), with `r [T * T]` scratch; the loops run over contiguous pairs.
#[inline(always)]
fn rms_head(p0: usize, a: &mut [f32], r: &mut [f32]) {
    let tt = r.len();
    let r = &mut r[p0..];
    rms_head_scales(a, tt, p0, r);
    for head in a.chunks_exact_mut(tt) {
        for (x, &r) in head[p0..].iter_mut().zip(r.iter()) {
            *x *= r;
        }
    }
}

/// The standard value network of one problem: `o[i, h, e] = sum_j a[h, i, j] v[h, e, j]`, from the
/// codes `att [H, T, T]` and the values `vt [H, d, Tp]` into `o [T, H, d]`, for the queries from
/// `q0`.
#[inline(always)]
fn default_value(shape: &Shape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
    let (t, tp, h, d) = (shape.t, shape.tp, shape.h, shape.d);
    for i in q0..t {
        for hh in 0..h {
            let arow = &att[(hh * t + i) * t..][..t];
            for e in 0..d {
                o[(i * h + hh) * d + e] = dot(arow, &vt[(hh * d + e) * tp..][..t]);
            }
        }
    }
}

/// The part of a pass one chunk does.
struct Pass {
    /// Index in the batch of the chunk's first problem.
    first_problem: usize,
    /// Problems in the chunk.
    n: usize,
    /// Floats per problem of [`InferenceOutput::taken`].
    width: usize,
}

/// What one chunk starts from: its inputs `[n, T, d_in]`, its stream `[n, T, D]` entering a
/// block, or a block state with its problems and query ([`Start`]).
#[derive(Clone, Copy)]
enum ChunkStart<'a> {
    Inputs(&'a [f32]),
    Stream(&'a [f32], usize),
    Query(&'a BlockState, &'a [usize], usize),
}

/// Problem `p`'s row of a chunk's `taken` (`width` floats each; empty for width 0).
fn taken_row(taken: &mut [f32], width: usize, p: usize) -> &mut [f32] {
    if width > 0 {
        &mut taken[p * width..][..width]
    } else {
        &mut []
    }
}

/// [`ModelError::Input`] unless `data` holds `batch >= 1` problems of `per` floats (`shape`, for
/// the message).
fn check_floats(
    data: &[f32],
    batch: usize,
    per: usize,
    what: &str,
    shape: [usize; 2],
) -> Result<()> {
    if batch == 0 || data.len() != batch * per {
        return Err(ModelError::Input(format!(
            "the pass must start from batch >= 1 problems, each {what} of {per} floats ([{}, {}]): got {} floats for {batch}",
            shape[0],
            shape[1],
            data.len()
        )));
    }
    Ok(())
}

/// A worker's buffers on loan from [`Inference`]'s pool, returned when dropped.
struct Pooled<'a> {
    work: Option<Work>,
    pool: &'a std::sync::Mutex<Vec<Work>>,
}

impl std::ops::Deref for Pooled<'_> {
    type Target = Work;
    fn deref(&self) -> &Work {
        self.work
            .as_ref()
            .expect("the buffers are returned only on drop")
    }
}

impl std::ops::DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Work {
        self.work
            .as_mut()
            .expect("the buffers are returned only on drop")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let (Some(work), Ok(mut pool)) = (self.work.take(), self.pool.lock()) {
            pool.push(work);
        }
    }
}

/// One worker's buffers, sized for a chunk of [`CHUNK`] problems.
struct Work {
    resid: Vec<f32>,
    xn: Vec<f32>,
    qkv: Vec<f32>,
    o: Vec<f32>,
    y: Vec<f32>,
    hid: Vec<f32>,
    last: Vec<f32>,
    /// One problem's attention buffers.
    one: Scratch,
    /// The HYLA value networks' scratch (mixers with one).
    rows: Option<Rows>,
    /// The stream and the heads' outputs of the last block's computed queries, gathered.
    resid_c: Vec<f32>,
    /// See `resid_c`.
    o_c: Vec<f32>,
}

/// One problem's attention buffers: a row of scores and its `exp` over the padded keys `[Tp]`, the
/// codes `[H, T, T]`, RMSHead's scales `[T * T]`, keys and values transposed and padded
/// `[H, d, Tp]` (the padding is zero).
struct Scratch {
    s: Vec<f32>,
    e: Vec<f32>,
    att: Vec<f32>,
    r: Vec<f32>,
    kt: Vec<f32>,
    vt: Vec<f32>,
}

impl Work {
    fn new(cfg: &Config, plan: Option<&Plan>) -> Work {
        let rows = CHUNK * cfg.n_tokens;
        let (t, tp) = (cfg.n_tokens, padded(cfg.n_tokens));
        let (dm, hd) = (cfg.d_model, cfg.n_heads * cfg.d_head);
        Work {
            resid: vec![0.0; rows * dm],
            xn: vec![0.0; rows * dm],
            qkv: vec![0.0; rows * 3 * hd],
            o: vec![0.0; rows * hd],
            y: vec![0.0; rows * dm],
            hid: vec![0.0; rows * cfg.d_mlp],
            last: vec![0.0; CHUNK * cfg.n_outputs * dm],
            one: Scratch {
                s: vec![0.0; 2 * tp],
                e: vec![0.0; 2 * tp],
                att: vec![0.0; cfg.n_heads * t * t],
                r: vec![0.0; t * t],
                kt: vec![0.0; tp * hd],
                vt: vec![0.0; tp * hd],
            },
            rows: plan.map(|p| Rows::new(p, &vec![0.0; t * hd])),
            resid_c: vec![0.0; rows * dm],
            o_c: vec![0.0; rows * hd],
        }
    }
}

/// `exp(x)` in float32, in a form the compiler vectorises:
/// `x = n ln 2 + r` with `n` rounded to the nearest integer (by adding and subtracting `1.5 2^23`, which leaves `n` in the low bits)
/// and `|r| <= ln 2 / 2`, `ln 2` split in two parts so that `r` is exact; `e^r` by the degree-7
/// Taylor-style polynomial `1 + r + r^2 P(r)` with the minimax coefficients of Cephes's `expf`
/// (Moshier 1984); `2^n` by the exponent bits. The argument is clamped to [-87.3, 88]: below, the
/// result is `e^-87.3` (about 1e-38, nothing next to a softmax row maximum's 1 or a sigmoid's 1);
/// above, `e^88` (1.7e38, whose sigmoid is 0 all the same). NaN stays NaN. Relative error at most
/// 2.5e-7 against `f32::exp` over [-87, 88] (unit test).
#[inline(always)]
fn exp_reduced(x: f32) -> f32 {
    let (t, r) = exp_reduce(x);
    exp_finish(t, r)
}

/// The first steps of [`exp_reduced`]: the clamp, then `t` (which holds `n` in its low mantissa
/// bits, so that `2^n` comes from integer operations alone) and the reduced argument `r`.
#[inline(always)]
fn exp_reduce(x: f32) -> (f32, f32) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let x = if x < -87.3 { -87.3 } else { x };
    let x = if x > 88.0 { 88.0 } else { x };
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    (t, x - n * LN2_HI - n * LN2_LO)
}

/// The last steps of [`exp_reduced`]: `e^r` by the polynomial, times `2^n` from `t`'s bits.
#[inline(always)]
fn exp_finish(t: f32, r: f32) -> f32 {
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(t.to_bits().wrapping_add(127) << 23)
}

/// [`exp_reduced`] in place over a block, each step over the whole block before the next, so that
/// the floats' chains overlap (the same operations per float, so the same bits). (The softmax's
/// loop over a row keeps [`exp_reduced`]: blocks made it slower there.)
#[inline(always)]
fn exp_reduced_block<const W: usize>(x: &mut [f32; W]) {
    let (mut t, mut r) = ([0f32; W], [0f32; W]);
    for ((&x, t), r) in x.iter().zip(&mut t).zip(&mut r) {
        (*t, *r) = exp_reduce(x);
    }
    for ((x, &t), &r) in x.iter_mut().zip(&t).zip(&r) {
        *x = exp_finish(t, r);
    }
}

/// The tanh GELU `x sigmoid(c (x + 0.044715 x^3))` (`ops::fast::cpu`'s, `c = 2 sqrt(2 / pi)`) with
/// the sigmoid's `exp` by [`exp_reduced`], so that the loop over a row vectorises.
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    x / (1.0 + exp_reduced(gelu_exponent(x)))
}

/// The exponent of [`gelu_tanh`]'s sigmoid, `-c (x + 0.044715 x^3)`.
#[inline(always)]
fn gelu_exponent(x: f32) -> f32 {
    const C: f32 = 1.595_769_2;
    -C * (x + 0.044_715 * x * x * x)
}

/// [`gelu_tanh`] in place over a buffer: blocks of [`GELU_BLOCK`] floats step by step (every
/// step over the whole block before the next), then the tail one by one. Each float gets
/// [`gelu_tanh`]'s operations in its order, so the same bits.
#[inline(always)]
fn gelu_in_place(v: &mut [f32]) {
    let mut blocks = v.chunks_exact_mut(GELU_BLOCK);
    for block in &mut blocks {
        gelu_block(block.try_into().expect("a block of GELU_BLOCK floats"));
    }
    for v in blocks.into_remainder() {
        *v = gelu_tanh(*v);
    }
}

/// Floats per step of [`gelu_in_place`]: four AVX2 vectors, whose chains of some thirty dependent
/// operations then overlap. One vector at a time, the loop waited on each chain's latency.
const GELU_BLOCK: usize = 4 * LANES;

/// [`gelu_tanh`] of a block, step by step: the argument of the sigmoid, then [`exp_reduced`]'s
/// steps, then the quotient, each over the whole block.
#[inline(always)]
fn gelu_block(v: &mut [f32; GELU_BLOCK]) {
    let mut u = [0f32; GELU_BLOCK];
    for (u, &x) in u.iter_mut().zip(v.iter()) {
        *u = gelu_exponent(x);
    }
    exp_reduced_block(&mut u);
    for (x, &e) in v.iter_mut().zip(&u) {
        *x /= 1.0 + e;
    }
}

/// LayerNorm over rows of `D = w.len()` entries, as candle's (`E[x^2] - mean^2` variance, eps
/// [`LN_EPS`]): `y = (x - mean) / sqrt(var + eps) w + b`; the sums over eight lanes.
#[inline(always)]
fn layer_norm(x: &[f32], (w, b): &(Vec<f32>, Vec<f32>), y: &mut [f32]) {
    let dm = w.len();
    for (x, y) in x.chunks_exact(dm).zip(y.chunks_exact_mut(dm)) {
        // Eight partial sums (a fixed order that vectorises), not one serial chain.
        let (mut s1, mut s2) = ([0f32; LANES], [0f32; LANES]);
        let chunks = x.chunks_exact(LANES);
        let (mut sum, mut sum2) = (0f32, 0f32);
        for &v in chunks.remainder() {
            sum += v;
            sum2 += v * v;
        }
        for c in chunks {
            for l in 0..LANES {
                s1[l] += c[l];
                s2[l] += c[l] * c[l];
            }
        }
        let sum = s1.iter().sum::<f32>() + sum;
        let sum2 = s2.iter().sum::<f32>() + sum2;
        let mean = sum / dm as f32;
        let var = sum2 / dm as f32 - mean * mean;
        let inv_std = (var + LN_EPS).sqrt().recip();
        for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
            *y = (x - mean) * inv_std * w + b;
        }
    }
}

/// `x[r, :] += b` for every row.
#[inline(always)]
fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (x, &b) in row.iter_mut().zip(b) {
            *x += b;
        }
    }
}

/// `resid += y + b` row by row (the bias joins the product before the residual stream, as in
/// the candle forms).
#[inline(always)]
fn add_biased(resid: &mut [f32], y: &[f32], b: &[f32]) {
    let n = b.len();
    for (r, y) in resid.chunks_exact_mut(n).zip(y.chunks_exact(n)) {
        for ((r, &y), &b) in r.iter_mut().zip(y).zip(b) {
            *r += y + b;
        }
    }
}

/// `dst [m, n] = a [m, k] b [k, n]`, all row-major, by `gemm` on the calling thread (its AVX-512
/// kernels where the CPU has them).
///
/// # Panics
/// If a slice is shorter than its shape: the callers size every buffer from the model's config.
// The workspace denies `unsafe`; gemm's entry point takes raw pointers and strides.
#[allow(unsafe_code)]
fn matmul(dst: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) {
    assert!(
        dst.len() >= m * n && a.len() >= m * k && b.len() >= k * n,
        "matmul: buffers shorter than [{m}, {k}] x [{k}, {n}]"
    );
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the assertion above keeps every element that gemm reads or writes, `a[i k + p]`,
    // `b[p n + j]` and `dst[i n + j]` for `i < m`, `p < k`, `j < n` (row strides `k`, `n`, `n`,
    // column strides 1), inside its slice; `dst` is borrowed mutably, so it aliases neither input.
    // With `read_dst` false gemm writes `dst` without reading it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::params::seeded_tensors;
    use crate::nn::InitRule;
    use crate::ops::fast::cpu::gelu_tanh_value;
    use crate::ops::test_util::random_input;
    use crate::Mixer;

    /// A small model whose every weight (biases, LayerNorm scales and position tables included)
    /// is drawn at random, so that no term of the forward pass is zero or one by construction.
    fn random_model(mixer: Mixer, causal: bool, seed: u64) -> Transformer {
        let cfg = Config {
            d_in: 5,
            n_tokens: 9,
            n_outputs: 3,
            d_model: 24,
            n_heads: 3,
            d_head: 4,
            n_layers: 3,
            d_mlp: 20,
            d_out: 6,
            n_buckets: 7,
            causal,
            mixer,
        };
        let tensors = seeded_tensors(
            cfg.tensor_shapes(),
            seed,
            |_| InitRule::Normal(0.5),
            &Device::Cpu,
        )
        .unwrap();
        Transformer::from_tensors(&cfg, tensors.into_iter().collect(), &Device::Cpu).unwrap()
    }

    /// The largest difference relative to the largest magnitude of `want`.
    fn rel_diff(got: &Tensor, want: &Tensor) -> f32 {
        let g: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
        let w: Vec<f32> = want.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(g.len(), w.len());
        let scale = w.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
        g.iter()
            .zip(&w)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
            / scale
    }

    #[test]
    fn matches_the_candle_forward_for_every_mixer_with_and_without_a_causal_mask() {
        // 19 problems: two full chunks and a short one.
        for (s, mixer) in Mixer::ALL.into_iter().enumerate() {
            for causal in [false, true] {
                let model = random_model(mixer, causal, s as u64);
                let x = random_input(model.config(), 19, 3);
                let want = model.forward(&x, true).unwrap();
                let got = Inference::new(&model).unwrap().forward(&x, true).unwrap();
                let d = rel_diff(&got.logits, &want.logits);
                assert!(d < 1e-5, "{mixer} causal {causal}: logits differ by {d}");
                for (l, (g, w)) in got
                    .attention
                    .unwrap()
                    .iter()
                    .zip(want.attention.unwrap().iter())
                    .enumerate()
                {
                    let d = rel_diff(g, w);
                    assert!(
                        d < 1e-5,
                        "{mixer} causal {causal} layer {l}: codes differ by {d}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_last_block_computed_for_the_read_queries_alone_gives_the_full_passs_outputs() {
        // T 9, F 3: without hooks the last block runs queries 6..9; with codes read from query 4,
        // queries 4..9. Logits against candle's forward and against the full pass of `run`.
        for (s, mixer) in Mixer::ALL.into_iter().enumerate() {
            for causal in [false, true] {
                let model = random_model(mixer, causal, 40 + s as u64);
                let inf = Inference::new(&model).unwrap();
                let x = random_input(model.config(), 19, 5);
                let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
                let full = inf.run(&xs, 19, 27, |l, att, row| {
                    if l == 2 {
                        row.copy_from_slice(&att[4 * 9..][..27]);
                    }
                });
                let full = full.unwrap();
                let plain = inf.run_hooked(Start::Inputs(&xs), 19, 0, &()).unwrap();
                assert_eq!(plain.logits, full.logits, "{mixer} causal {causal}");
                let read = TakeCodesFrom {
                    first_query: 4,
                    take: |l: usize, att: &[f32], row: &mut [f32]| {
                        if l == 2 {
                            assert!(att[3 * 9..][..9].iter().all(|v| v.is_nan()));
                            row.copy_from_slice(&att[4 * 9..][..27]);
                        }
                    },
                };
                let part = inf.run_hooked(Start::Inputs(&xs), 19, 27, &read).unwrap();
                assert_eq!(part.logits, full.logits, "{mixer} causal {causal}");
                assert_eq!(part.taken, full.taken, "{mixer} causal {causal}");
                let want = model.forward(&x, false).unwrap().logits;
                let got = Tensor::from_vec(plain.logits, want.dims(), &Device::Cpu).unwrap();
                assert!(rel_diff(&got, &want) < 1e-5, "{mixer} causal {causal}");
            }
        }
    }

    /// Reads the stream entering block 1 into the row; at block 1 sets head 0's code of query 4
    /// to key 2 to 0.75.
    struct Edit;

    impl InferenceHooks for Edit {
        fn resid_pre(&self, layer: usize, _: usize, resid: &mut [f32], row: &mut [f32]) {
            if layer == 1 {
                row.copy_from_slice(resid);
            }
        }
        fn pattern(&self, layer: usize, _: usize, codes: &mut [f32], _: &mut [f32]) {
            if layer == 1 {
                codes[4 * 9 + 2] = 0.75;
            }
        }
    }

    /// The same edit by candle's hooked pass.
    struct CandleEdit;

    impl crate::HookFn for CandleEdit {
        fn wants(&self, name: &str) -> bool {
            name == "blocks.1.attn.hook_pattern"
        }
        fn call(&mut self, _: &str, p: &Tensor) -> Result<Option<Tensor>> {
            let mut v: Vec<f32> = p.flatten_all()?.to_vec1()?;
            let (b, h, t, _) = p.dims4()?;
            for bi in 0..b {
                v[((bi * h) * t + 4) * t + 2] = 0.75;
            }
            Ok(Some(Tensor::from_vec(v, p.shape(), p.device())?))
        }
    }

    #[test]
    fn hooks_edit_the_codes_and_a_pass_from_the_stream_repeats_the_full_pass() {
        for mixer in [Mixer::Hyla, Mixer::Softmax] {
            let model = random_model(mixer, false, 5);
            let inf = Inference::new(&model).unwrap();
            let x = random_input(model.config(), 11, 6);
            let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
            let width = 9 * 24;
            let edited = inf
                .run_hooked(Start::Inputs(&xs), 11, width, &Edit)
                .unwrap();
            let want = model.run_with_hooks(&x, &mut CandleEdit).unwrap();
            let d = rel_diff(
                &Tensor::from_vec(edited.logits.clone(), want.shape(), &Device::Cpu).unwrap(),
                &want,
            );
            assert!(d < 1e-5, "{mixer}: edited logits differ by {d}");
            // The edit moved the logits, and a pass from the captured stream repeats them exactly.
            let plain = inf.run(&xs, 11, 0, |_, _, _| {}).unwrap();
            assert!(plain.logits != edited.logits);
            let start = Start::Stream {
                resid: &edited.taken,
                layer: 1,
            };
            let again = inf.run_hooked(start, 11, width, &Edit).unwrap();
            assert_eq!(again.logits, edited.logits);
            assert_eq!(again.taken, edited.taken);
            let past = Start::Stream {
                resid: &edited.taken,
                layer: 3,
            };
            assert!(matches!(
                inf.run_hooked(past, 11, 0, &Edit),
                Err(ModelError::Input(_))
            ));
        }
    }

    /// Reads the stream entering block `0` into the row.
    struct ReadPre(usize);

    impl InferenceHooks for ReadPre {
        fn resid_pre(&self, layer: usize, _: usize, resid: &mut [f32], row: &mut [f32]) {
            if layer == self.0 {
                row.copy_from_slice(resid);
            }
        }
    }

    /// At block `layer` writes `0.1 (p + k + 1)` into head 1's code of query `query` to key `k`,
    /// for the problem `p` of the pass.
    struct QueryEdit {
        layer: usize,
        query: usize,
    }

    impl InferenceHooks for QueryEdit {
        fn pattern(&self, layer: usize, problem: usize, codes: &mut [f32], _: &mut [f32]) {
            if layer == self.layer {
                for k in 0..9 {
                    codes[(9 + self.query) * 9 + k] = 0.1 * (problem + k + 1) as f32;
                }
            }
        }

        fn last_block_from_query(&self) -> usize {
            self.query
        }
    }

    #[test]
    fn a_pass_from_a_block_state_repeats_the_pass_from_the_stream_bit_for_bit() {
        // 13 problems; passes of 11 (a chunk of 8 and one of 3, out of order, one repeated) and
        // of 1, at every block, at the last query and at query 2 (before the logits' rows).
        for (s, mixer) in Mixer::ALL.into_iter().enumerate() {
            for causal in [false, true] {
                let model = random_model(mixer, causal, 60 + s as u64);
                let inf = Inference::new(&model).unwrap();
                let (b, t, dm) = (13, 9, 24);
                let x = random_input(model.config(), b, 8);
                let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
                let plain = inf.run_hooked(Start::Inputs(&xs), b, 0, &()).unwrap();
                for layer in 0..3 {
                    let pre = inf
                        .run_hooked(Start::Inputs(&xs), b, t * dm, &ReadPre(layer))
                        .unwrap()
                        .taken;
                    let state = inf.block_state(&pre, b, layer).unwrap();
                    assert_eq!((state.layer(), state.batch()), (layer, b));
                    for problems in [vec![12, 0, 5, 5, 3, 1, 7, 8, 9, 10, 11], vec![4]] {
                        let n = problems.len();
                        let stream: Vec<f32> = problems
                            .iter()
                            .flat_map(|&p| pre[p * t * dm..][..t * dm].iter().copied())
                            .collect();
                        let logits_of = |p: usize| &plain.logits[p * 18..][..18];
                        // No edit: the plain pass's logits.
                        let start = Start::Query {
                            state: &state,
                            problems: &problems,
                            query: t - 1,
                        };
                        let same = inf.run_hooked(start, n, 0, &()).unwrap();
                        for (i, &p) in problems.iter().enumerate() {
                            assert_eq!(&same.logits[i * 18..][..18], logits_of(p));
                        }
                        for query in [t - 1, 2] {
                            let edit = QueryEdit { layer, query };
                            let want = inf
                                .run_hooked(
                                    Start::Stream {
                                        resid: &stream,
                                        layer,
                                    },
                                    n,
                                    0,
                                    &edit,
                                )
                                .unwrap();
                            let start = Start::Query {
                                state: &state,
                                problems: &problems,
                                query,
                            };
                            let got = inf.run_hooked(start, n, 0, &edit).unwrap();
                            let what = format!(
                                "{mixer} causal {causal} block {layer} query {query} of {n}"
                            );
                            assert_eq!(got.logits, want.logits, "{what}");
                            if query == t - 1 {
                                assert!(got.logits[..18] != *logits_of(problems[0]), "{what}");
                            }
                        }
                    }
                    // Bad input: a problem outside the state, a query past the sequence, a batch
                    // that is not the problems'.
                    for (problems, query, n) in
                        [(vec![13], 8, 1), (vec![0], 9, 1), (vec![0, 1], 8, 1)]
                    {
                        let start = Start::Query {
                            state: &state,
                            problems: &problems,
                            query,
                        };
                        assert!(matches!(
                            inf.run_hooked(start, n, 0, &()),
                            Err(ModelError::Input(_))
                        ));
                    }
                }
                assert!(inf.block_state(&xs, b, 0).is_err());
                assert!(inf.block_state(&vec![0.0; b * t * dm], b, 3).is_err());
            }
        }
    }

    #[test]
    fn the_vectorised_exp_is_within_float32_rounding_of_libm() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let (got, want) = (f64::from(exp_reduced(x)), f64::from(x.exp()));
            worst = worst.max((got - want).abs() / want);
            x += 1.37e-3;
        }
        assert!(worst < 2.5e-7, "relative error {worst}");
        assert_eq!(exp_reduced(0.0), 1.0);
        assert!(exp_reduced(f32::NAN).is_nan());
        assert!(exp_reduced(-1e30) < 1e-37);
        assert!(exp_reduced(1e30) > 1e38 && exp_reduced(1e30).is_finite());
        // The GELU through it, against the candle forms' GELU.
        let mut x = -12.0f32;
        while x < 12.0 {
            let (got, want) = (gelu_tanh(x), gelu_tanh_value(x));
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{x}: {got} {want}"
            );
            x += 0.01;
        }
        let (ninf, mut e, mut a) = (f32::NEG_INFINITY, [0f32; 8], [0f32; 3]);
        softmax_padded(
            &[1.0, f32::NAN, 0.0, ninf, ninf, ninf, ninf, ninf],
            &mut e,
            &mut a,
        );
        assert!(a.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn the_avx2_kernels_give_the_baseline_pass_bit_for_bit() {
        // Shapes that take every path: keys a multiple of 8 or not (partial chunks and masked
        // loads), head widths with a copy of their own (2, 4, 8) or not (3), H d a multiple of 8
        // (the transposes in register blocks) or not; every mixer, causal or not.
        #[cfg(target_arch = "x86_64")]
        let Kernels::Avx2 = Kernels::detect() else {
            eprintln!("skipped: this CPU has no AVX2 and FMA, so only the baseline kernels run");
            return;
        };
        #[cfg(not(target_arch = "x86_64"))]
        return;
        #[cfg(target_arch = "x86_64")]
        for (s, (t, h, d)) in [(9, 3, 4), (17, 4, 2), (16, 2, 8), (12, 2, 3)]
            .into_iter()
            .enumerate()
        {
            for mixer in Mixer::ALL {
                for causal in [false, true] {
                    let cfg = Config {
                        d_in: 5,
                        n_tokens: t,
                        n_outputs: 3,
                        d_model: 24,
                        n_heads: h,
                        d_head: d,
                        n_layers: 2,
                        d_mlp: 20,
                        d_out: 6,
                        n_buckets: t.min(7),
                        causal,
                        mixer,
                    };
                    let tensors = seeded_tensors(
                        cfg.tensor_shapes(),
                        90 + s as u64,
                        |_| InitRule::Normal(0.5),
                        &Device::Cpu,
                    )
                    .unwrap();
                    let model = Transformer::from_tensors(
                        &cfg,
                        tensors.into_iter().collect(),
                        &Device::Cpu,
                    )
                    .unwrap();
                    let x = random_input(model.config(), 11, 3 + s as u64);
                    let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
                    let per_layer = h * t * t;
                    let take = TakeCodes(|layer: usize, codes: &[f32], row: &mut [f32]| {
                        row[layer * per_layer..][..per_layer].copy_from_slice(codes);
                    });
                    let mut inf = Inference::new(&model).unwrap();
                    let avx2 = inf.run_hooked(Start::Inputs(&xs), 11, 2 * per_layer, &take);
                    inf.kernels = Kernels::Baseline;
                    let base = inf.run_hooked(Start::Inputs(&xs), 11, 2 * per_layer, &take);
                    let (avx2, base) = (avx2.unwrap(), base.unwrap());
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    let case = format!("{mixer} causal {causal}, T {t}, H {h}, d {d}");
                    assert_eq!(bits(&avx2.logits), bits(&base.logits), "logits: {case}");
                    assert_eq!(bits(&avx2.taken), bits(&base.taken), "codes: {case}");
                }
            }
        }
    }

    #[test]
    fn the_gelu_in_blocks_gives_the_gelu_of_each_float_bit_for_bit() {
        // 3 blocks and a tail of 5, over the range that matters plus the clamps, NaN and zeros
        let mut v: Vec<f32> = (0..3 * GELU_BLOCK + 5)
            .map(|i| (i as f32 * 0.731).sin() * 9.0 - 0.5)
            .collect();
        v[7] = f32::NAN;
        v[40] = -0.0;
        v[41] = 200.0;
        v[42] = -200.0;
        let want: Vec<f32> = v.iter().map(|&x| gelu_tanh(x)).collect();
        #[allow(unused_mut)]
        let mut kernels = vec![Kernels::Baseline];
        #[cfg(target_arch = "x86_64")]
        if let k @ Kernels::Avx2 = Kernels::detect() {
            kernels.push(k);
        }
        for k in kernels {
            let mut got = v.clone();
            k.gelu(&mut got);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{k:?}");
        }
    }

    #[test]
    fn the_padded_softmax_is_libms_softmax_over_the_real_keys() {
        for t in [1, 7, 8, 9, 36, 41] {
            let tp = padded(t);
            let mut s = vec![f32::NEG_INFINITY; tp];
            for (j, s) in s[..t].iter_mut().enumerate() {
                *s = ((j * 7919 % 1009) as f32 / 100.0 - 5.0) * if j % 3 == 0 { 4.0 } else { 1.0 };
            }
            let (mut e, mut a) = (vec![0f32; tp], vec![0f32; t]);
            softmax_padded(&s, &mut e, &mut a);
            let mx = s[..t]
                .iter()
                .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
            let z: f64 = s[..t].iter().map(|&x| (f64::from(x) - mx).exp()).sum();
            // float32's rounding of `x - max` (half an ulp of up to 40) and `exp_reduced`'s 2.5e-7
            for (j, &got) in a.iter().enumerate() {
                let want = (f64::from(s[j]) - mx).exp() / z;
                assert!(
                    (f64::from(got) - want).abs() <= 3e-6 * want,
                    "T {t}, key {j}: {got} against {want}"
                );
            }
            // Two rows side by side give each row's bits alone.
            let s2: Vec<f32> = s.iter().map(|x| x * 0.5 - 1.0).collect();
            let (mut e2, mut a2) = (vec![0f32; tp], vec![0f32; t]);
            softmax_padded(&s2, &mut e2, &mut a2);
            let (mut f, mut f2) = (vec![0f32; tp], vec![0f32; tp]);
            let (mut b, mut b2) = (vec![0f32; t], vec![0f32; t]);
            softmax_padded_rows([&s, &s2], [&mut f, &mut f2], [&mut b, &mut b2]);
            assert_eq!((b, b2), (a, a2), "T {t}");
        }
    }

    #[test]
    fn take_sees_every_layer_and_bad_input_is_an_error() {
        let model = random_model(Mixer::Hyla, false, 9);
        let inf = Inference::new(&model).unwrap();
        let x = random_input(model.config(), 10, 4);
        let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        // Row = one code per layer: layer 2's code of query 8 to key 0, head 1.
        let out = inf
            .run(&xs, 10, 3, |l, att, row| row[l] = att[(9 + 8) * 9])
            .unwrap();
        let want = model.forward(&x, true).unwrap().attention.unwrap();
        for (l, want) in want.iter().enumerate() {
            let w: Vec<f32> = want
                .narrow(1, 1, 1)
                .unwrap()
                .narrow(2, 8, 1)
                .unwrap()
                .narrow(3, 0, 1)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            for (p, w) in w.iter().enumerate() {
                assert!((out.taken[p * 3 + l] - w).abs() < 1e-5);
            }
        }
        assert!(matches!(
            inf.run(&xs[1..], 10, 0, |_, _, _| {}),
            Err(ModelError::Input(_))
        ));
        assert!(matches!(
            inf.run(&[], 0, 0, |_, _, _| {}),
            Err(ModelError::Input(_))
        ));
    }
}
