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
//!   is a polynomial the compiler vectorises (`exp_reduced`) instead of a libm call.
//! - **One chunk stays in the caches.** A chunk of 8 base-model problems (288 rows) needs about
//!   1 MB of buffers.
//! - **Hooks.** [`Inference::run`] hands each layer's codes to a function that keeps what it needs
//!   (the probe keeps the site's few codes, not `[B, H, T, T]` per layer);
//!   [`Inference::run_hooked`] can read or replace the codes and the stream entering a block and
//!   start a pass from that stream (the transplant test).
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
    /// `Start::Inputs(x [B, T, d_in])` or `Start::Stream { resid [B, T, D], layer }`; returns
    /// logits `[B, F, d_out]` and `taken [B, width]`.
    ///
    /// # Errors
    /// [`ModelError::Input`] if the start does not hold `batch` problems of the model's shape,
    /// `batch` is 0, or the start layer is past the last block.
    pub fn run_hooked<H: InferenceHooks>(
        &self,
        start: Start<'_>,
        batch: usize,
        width: usize,
        hooks: &H,
    ) -> Result<InferenceOutput> {
        let cfg = &self.config;
        let (data, per_problem, first) = match start {
            Start::Inputs(x) => (x, cfg.n_tokens * cfg.d_in, None),
            Start::Stream { resid, layer } => {
                if layer >= cfg.n_layers {
                    return Err(ModelError::Input(format!(
                        "a pass from block {layer} of a model with {} blocks",
                        cfg.n_layers
                    )));
                }
                (resid, cfg.n_tokens * cfg.d_model, Some(layer))
            }
        };
        if batch == 0 || data.len() != batch * per_problem {
            return Err(ModelError::Input(format!(
                "the pass must start from batch >= 1 problems of {per_problem} floats ([{}, {}]): got {} floats for {batch}",
                cfg.n_tokens,
                if first.is_some() { cfg.d_model } else { cfg.d_in },
                data.len()
            )));
        }
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
                || Work::new(cfg, self.plan.as_ref()),
                |work, (c, (lg, tk))| {
                    let n = lg.len() / per_logits;
                    let part = &data[c * CHUNK * per_problem..][..n * per_problem];
                    let pass = Pass {
                        first_problem: c * CHUNK,
                        n,
                        width,
                        first,
                    };
                    self.chunk(work, &pass, part, lg, tk, hooks);
                },
            );
        Ok(InferenceOutput { logits, taken })
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

    /// One chunk of problems (`pass`) from `data` (inputs `[n, T, d_in]` or the stream `[n, T, D]`)
    /// into `logits [n, F, d_out]` and `taken [n, width]`.
    fn chunk<H: InferenceHooks>(
        &self,
        w: &mut Work,
        pass: &Pass,
        data: &[f32],
        logits: &mut [f32],
        taken: &mut [f32],
        hooks: &H,
    ) {
        let cfg = &self.config;
        let (t, dm, h, d) = (cfg.n_tokens, cfg.d_model, cfg.n_heads, cfg.d_head);
        let (n, width, f) = (pass.n, pass.width, cfg.n_outputs);
        let (hd, rows) = (h * d, n * t);
        let shape = Shape {
            t,
            tp: padded(t),
            h,
            d,
            scale: (1.0 / (d as f64).sqrt()) as f32,
        };
        let first = match pass.first {
            None => {
                let resid = &mut w.resid[..rows * dm];
                matmul(resid, data, &self.w_e, (rows, cfg.d_in, dm));
                add_rows(resid, &self.b_e);
                0
            }
            Some(layer) => {
                w.resid[..rows * dm].copy_from_slice(data);
                layer
            }
        };
        // Rows per problem in `w.resid` after the last block: all T, or the last block's queries.
        let mut kept = t;
        for (l, lw) in self.layers.iter().enumerate().skip(first) {
            let resid = &mut w.resid[..rows * dm];
            for p in 0..n {
                let row = if width > 0 {
                    &mut taken[p * width..][..width]
                } else {
                    &mut []
                };
                hooks.resid_pre(
                    l,
                    pass.first_problem + p,
                    &mut resid[p * t * dm..][..t * dm],
                    row,
                );
            }
            // The queries this block computes: all, but in the last block only those the logits
            // and the hooks read.
            let q0 = if l + 1 == self.layers.len() {
                hooks.last_block_from_query().min(t - f)
            } else {
                0
            };
            // Attention.
            let xn = &mut w.xn[..rows * dm];
            layer_norm(resid, &lw.ln1, xn);
            let qkv = &mut w.qkv[..rows * 3 * hd];
            matmul(qkv, xn, &lw.w_qkv, (rows, dm, 3 * hd));
            add_rows(qkv, &lw.b_qkv);
            let o = &mut w.o[..rows * hd];
            for p in 0..n {
                let qkv = &qkv[p * t * 3 * hd..][..t * 3 * hd];
                self.kernels.codes(
                    &shape,
                    cfg.mixer.normalisation(),
                    self.visible.as_deref(),
                    q0,
                    qkv,
                    &lw.bias,
                    &mut w.one,
                );
                let row = if width > 0 {
                    &mut taken[p * width..][..width]
                } else {
                    &mut []
                };
                hooks.pattern(l, pass.first_problem + p, &mut w.one.att, row);
                let op = &mut o[p * t * hd..][..t * hd];
                match (&self.plan, &mut w.rows) {
                    (Some(plan), Some(rows)) => self
                        .kernels
                        .mix_value(plan, q0, &w.one.att, &w.one.v, op, rows),
                    _ => self.kernels.value(&shape, q0, &w.one.att, &w.one.vt, op),
                }
            }
            if q0 == 0 {
                self.finish_block(lw, resid, o, rows, &mut w.xn, &mut w.y, &mut w.hid);
            } else {
                // The queries from q0 of every problem, gathered into whole rows.
                kept = t - q0;
                let (resid_c, o_c) = (&mut w.resid_c[..n * kept * dm], &mut w.o_c[..n * kept * hd]);
                for p in 0..n {
                    resid_c[p * kept * dm..][..kept * dm]
                        .copy_from_slice(&resid[(p * t + q0) * dm..][..kept * dm]);
                    o_c[p * kept * hd..][..kept * hd]
                        .copy_from_slice(&o[(p * t + q0) * hd..][..kept * hd]);
                }
                self.finish_block(lw, resid_c, o_c, n * kept, &mut w.xn, &mut w.y, &mut w.hid);
            }
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
        layer_norm(last, &self.ln_final, normed);
        matmul(logits, normed, &self.w_u, (n * f, dm, cfg.d_out));
        add_rows(logits, &self.b_u);
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
        add_biased(resid, y, &lw.b_o);
        layer_norm(resid, &lw.ln2, xn);
        let hid = &mut hid[..rows * cfg.d_mlp];
        matmul(hid, xn, &lw.w_in, (rows, dm, cfg.d_mlp));
        add_rows(hid, &lw.b_in);
        self.kernels.gelu(hid);
        matmul(y, hid, &lw.w_out, (rows, cfg.d_mlp, dm));
        add_biased(resid, y, &lw.b_out);
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
/// of `ops::fast::mix`) and the GELU, compiled twice: for the baseline x86-64 instruction set, and
/// with AVX2 and FMA for CPUs that have them (chosen once, at run time). The loops are the same
/// code, so both give the same bits; FMA is only enabled, never asked for (Rust does not fuse a
/// product and a sum on its own).
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
            Kernels::Baseline => codes_of_problem(shape, norm, visible, q0, qkv, bias, w),
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
    /// set.
    #[allow(unsafe_code)]
    fn mix_value(
        self,
        plan: &Plan,
        q0: usize,
        att: &[f32],
        v: &[f32],
        o: &mut [f32],
        rows: &mut Rows,
    ) {
        match self {
            Kernels::Baseline => value_from_codes(plan, q0, att, v, o, rows),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { mix_value_avx2(plan, q0, att, v, o, rows) },
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
    codes_of_problem(shape, norm, visible, q0, qkv, bias, w);
}

/// [`gelu_in_place`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gelu_avx2(v: &mut [f32]) {
    gelu_in_place(v);
}

/// [`default_value`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn value_avx2(shape: &Shape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
    default_value(shape, q0, att, vt, o);
}

/// [`value_from_codes`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn mix_value_avx2(plan: &Plan, q0: usize, att: &[f32], v: &[f32], o: &mut [f32], rows: &mut Rows) {
    value_from_codes(plan, q0, att, v, o, rows);
}

/// One problem's codes at one layer, from its Q, K and V rows `qkv [T, 3 H d]` and the layer's
/// padded position bias `[H, T, Tp]`: keys and values transposed to `w.kt`, `w.vt` `[H, d, Tp]`
/// (so that the loops run over contiguous keys; the padded keys stay zero) and `w.v` `[H, T, d]`;
/// per head and query the scaled scores plus bias `s[j] = (sum_e q[i, h, e] k[h, e, j]) / sqrt(d)
/// + bias[h, i, j]` over the `Tp` padded keys (`-inf` on the padding), normalised at once into the
/// codes `w.att [H, T, T]` (the reference's `normalise`): softmax over the visible keys; none (0
/// where masked); RMSHead `m / sqrt(mean_h m^2 + eps)` over the heads of each pair. Only the
/// queries from `q0` are computed; the rows of earlier ones are NaN.
#[inline(always)]
fn codes_of_problem(
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
    for j in 0..t {
        let row = &qkv[j * 3 * hd..][..3 * hd];
        for c in 0..hd {
            w.kt[c * tp + j] = row[hd + c];
            w.vt[c * tp + j] = row[2 * hd + c];
        }
        for hh in 0..h {
            w.v[(hh * t + j) * d..][..d].copy_from_slice(&row[2 * hd + hh * d..][..d]);
        }
    }
    for hh in 0..h {
        w.att[hh * t * t..][..q0 * t].fill(f32::NAN);
        let kt = &w.kt[hh * d * tp..][..d * tp];
        for i in q0..t {
            let q = &qkv[i * 3 * hd + hh * d..][..d];
            scores(
                q,
                kt,
                shape.scale,
                &bias[(hh * t + i) * tp..][..tp],
                &mut w.s,
            );
            let a = &mut w.att[(hh * t + i) * t..][..t];
            match (norm, visible.map(|v| &v[i * t..][..t])) {
                (Normalisation::Softmax, None) => softmax_padded(&w.s, &mut w.e, a),
                (Normalisation::Softmax, Some(vis)) => softmax_row(&w.s[..t], Some(vis), a),
                (_, None) => a.copy_from_slice(&w.s[..t]),
                (_, Some(vis)) => {
                    for ((a, &x), &on) in a.iter_mut().zip(&w.s[..t]).zip(vis) {
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

/// One row of scaled scores plus bias over the padded keys: `s[j] = (sum_e q[e] kt[e, j]) scale +
/// b[j]` for `q [d]`, `kt [d, Tp]`, `b [Tp]` into `s [Tp]`, eight keys at a time with the sum over
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
    score_chunks(&q, &kt[..D * s.len()], scale, b, s);
}

/// The loops of [`scores`].
#[inline(always)]
fn score_chunks(q: &[f32], kt: &[f32], scale: f32, b: &[f32], s: &mut [f32]) {
    let tp = s.len();
    for (c, (s, b)) in s
        .chunks_exact_mut(LANES)
        .zip(b.chunks_exact(LANES))
        .enumerate()
    {
        let mut acc = [0f32; LANES];
        for (e, &qe) in q.iter().enumerate() {
            let k = &kt[e * tp + c * LANES..][..LANES];
            for l in 0..LANES {
                acc[l] += qe * k[l];
            }
        }
        for l in 0..LANES {
            s[l] = acc[l] * scale + b[l];
        }
    }
}

/// The softmax of a row of scores over padded keys with every real key visible, `a = exp(x - max)
/// / sum exp(x - max)`, by [`exp_reduced`] in whole vectors: `s [Tp]` (a multiple of [`LANES`],
/// `-inf` on the padding), `e [Tp]` scratch, into `a [T]`. The padding's `exp` is that of the
/// clamp, about 1e-38, below the rounding of the sum (at least 1, the maximum's term). A row with
/// a NaN gives NaN (the `exp` of NaN is NaN and the sum with it).
#[inline(always)]
fn softmax_padded(s: &[f32], e: &mut [f32], a: &mut [f32]) {
    // The maximum and the sum over eight lanes (reductions in a fixed order that vectorise).
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for c in s.chunks_exact(LANES) {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = if x > *l { x } else { *l };
        }
    }
    let mx = lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    // (Separate loops: fused, the `exp` did not vectorise.)
    for (e, &x) in e.iter_mut().zip(s) {
        *e = exp_reduced(x - mx);
    }
    let mut acc = [0f32; LANES];
    for c in e.chunks_exact(LANES) {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    let inv = 1.0 / acc.iter().sum::<f32>();
    for (a, &v) in a.iter_mut().zip(e.iter()) {
        *a = v * inv;
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
    /// The block the pass starts at when it starts from the stream.
    first: Option<usize>,
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
/// codes `[H, T, T]`, RMSHead's scales `[T * T]`, values `[H, T, d]`, keys and values transposed
/// and padded `[H, d, Tp]` (the padding is zero and never written).
struct Scratch {
    s: Vec<f32>,
    e: Vec<f32>,
    att: Vec<f32>,
    r: Vec<f32>,
    v: Vec<f32>,
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
                s: vec![0.0; tp],
                e: vec![0.0; tp],
                att: vec![0.0; cfg.n_heads * t * t],
                r: vec![0.0; t * t],
                v: vec![0.0; t * hd],
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
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let x = if x < -87.3 { -87.3 } else { x };
    let x = if x > 88.0 { 88.0 } else { x };
    // `t` holds n in its low mantissa bits, so that 2^n comes from integer operations alone.
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(t.to_bits().wrapping_add(127) << 23)
}

/// The tanh GELU `x sigmoid(c (x + 0.044715 x^3))` (`ops::fast::cpu`'s, `c = 2 sqrt(2 / pi)`) with
/// the sigmoid's `exp` by [`exp_reduced`], so that the loop over a row vectorises.
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 1.595_769_2;
    x / (1.0 + exp_reduced(-C * (x + 0.044_715 * x * x * x)))
}

/// [`gelu_tanh`] in place over a buffer.
#[inline(always)]
fn gelu_in_place(v: &mut [f32]) {
    for v in v.iter_mut() {
        *v = gelu_tanh(*v);
    }
}

/// LayerNorm over rows of `D = w.len()` entries, as candle's (`E[x^2] - mean^2` variance, eps
/// [`LN_EPS`]): `y = (x - mean) / sqrt(var + eps) w + b`; the sums over eight lanes.
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
fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (x, &b) in row.iter_mut().zip(b) {
            *x += b;
        }
    }
}

/// `resid += y + b` row by row (the bias joins the product before the residual stream, as in
/// the candle forms).
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
