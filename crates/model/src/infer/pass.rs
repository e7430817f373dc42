//! The pass orchestration: [`Inference`]'s methods (the weights' layout, the checks of a start,
//! the chunks of a batch in parallel, and per chunk the blocks, each through the attention loops
//! of `attention.rs`, the kernels of `hyperlens-kernels` on the detected [`Isa`] and the products
//! of `matmul.rs`).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use ndarray::ArrayView3;
use rayon::prelude::*;

use hyperlens_kernels::{padded, portable, AttentionScratch, AttentionShape, Isa};

use super::attention;
use super::buffers::Work;
use super::matmul::matmul;
use super::{
    BlockState, Inference, InferenceHooks, InferenceOutput, LayerWeights, Start, TakeCodes, CHUNK,
};
use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::mixer::ValueNetwork;
use crate::nn::position::relative_position_bucket;
use crate::ops::fast::mix::{Plan, Rows};
use crate::transformer::{ForwardOutput, Transformer, LN_EPS};

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
            isa: Isa::detected(),
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
                portable::add_rows(resid, &self.b_e);
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
        self.isa
            .layer_norm(last, ln(&self.ln_final), LN_EPS, normed);
        matmul(logits, normed, &self.w_u, (n * f, dm, cfg.d_out));
        portable::add_rows(logits, &self.b_u);
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
        self.isa.layer_norm(resid, ln(&lw.ln1), LN_EPS, xn);
        let qkv = &mut w.qkv[..rows * 3 * hd];
        matmul(qkv, xn, &lw.w_qkv, (rows, dm, 3 * hd));
        self.isa.add_rows(qkv, &lw.b_qkv);
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
        (one, rows): (&mut AttentionScratch, &mut Option<Rows>),
        (l, q0): (usize, usize),
        qkv: &[f32],
        (problem, row): (usize, &mut [f32]),
        hooks: &H,
        o: &mut [f32],
    ) {
        attention::codes(
            self.isa,
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
    fn value(&self, q0: usize, one: &mut AttentionScratch, rows: &mut Option<Rows>, o: &mut [f32]) {
        match (&self.plan, rows) {
            (Some(plan), Some(rows)) => attention::mix_value(
                self.isa,
                plan,
                q0,
                &one.att,
                (&one.vt, padded(self.config.n_tokens)),
                o,
                rows,
            ),
            _ => self
                .isa
                .default_value(&self.shape(), q0, &one.att, &one.vt, o),
        }
    }

    /// The sizes of one problem's attention.
    fn shape(&self) -> AttentionShape {
        let cfg = &self.config;
        AttentionShape {
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
        self.isa.add_biased(resid, y, &lw.b_o);
        self.isa.layer_norm(resid, ln(&lw.ln2), LN_EPS, xn);
        let hid = &mut hid[..rows * cfg.d_mlp];
        matmul(hid, xn, &lw.w_in, (rows, dm, cfg.d_mlp));
        self.isa.add_rows(hid, &lw.b_in);
        self.isa.gelu_tanh_reduced_in_place(hid);
        matmul(y, hid, &lw.w_out, (rows, cfg.d_mlp, dm));
        self.isa.add_biased(resid, y, &lw.b_out);
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

/// A LayerNorm's scale and bias as the kernels take them.
fn ln((w, b): &(Vec<f32>, Vec<f32>)) -> (&[f32], &[f32]) {
    (w, b)
}
