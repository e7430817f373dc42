//! GPT-2 (LayerNorm, learned absolute positions, GELU MLP, fused Conv1D attention projection) loaded
//! offline from a Hugging Face safetensors directory.
//!
//! Source: Hugging Face `transformers` `modeling_gpt2.py` (Conv1D computes `x W + b` with `W`
//! [in, out]; `c_attn` output columns are `[q | k | v]`, each split into heads of width `d`).

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use ndarray::{s, Array2};

use super::hf::{read_weights, HfConfig};
use super::layers::{causal_softmax, no_logits, norm, readout_input, Norm};
use super::store::TensorStore;
use super::weights::{
    fold_final_norm, to_array1, to_array2, HeadCollector, HeadWeights, TorchAttn,
};
use super::{check_tokens, matmul, matmul_t, LmOutput};
use crate::error::{ModelError, Result};
use crate::hooks::{at, lm_hook_names, BlockHooks, HookFn};
use crate::nn::position::causal_mask;
use crate::nn::{HookPoints, NoHooks};

/// The MLP non-linearity of a GPT-2 checkpoint (`activation_function` in `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gpt2Activation {
    /// `gelu_new` / `gelu_pytorch_tanh`: the tanh approximation (GPT-2's own).
    GeluTanh,
    /// `gelu`: the exact erf form.
    GeluErf,
    /// `relu`.
    Relu,
}

/// Hyper-parameters of a [`Gpt2`] model.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpt2Config {
    /// Vocabulary size `V`.
    pub vocab_size: usize,
    /// Number of learned positions (longest sequence).
    pub n_ctx: usize,
    /// Residual width `D`.
    pub d_model: usize,
    /// Number of layers `L`.
    pub n_layers: usize,
    /// Number of heads `H` (divides `D`; `d = D / H`).
    pub n_heads: usize,
    /// MLP hidden width (`n_inner`, default `4 D`).
    pub d_mlp: usize,
    /// LayerNorm epsilon.
    pub ln_eps: f64,
    /// MLP non-linearity.
    pub activation: Gpt2Activation,
}

/// One GPT-2 block; Conv1D matrices in [in, out] layout.
#[derive(Debug, Clone)]
struct Gpt2Layer {
    ln1_w: Tensor,
    ln1_b: Tensor,
    c_attn_w: Tensor,
    c_attn_b: Tensor,
    c_proj_w: Tensor,
    c_proj_b: Tensor,
    ln2_w: Tensor,
    ln2_b: Tensor,
    fc_w: Tensor,
    fc_b: Tensor,
    proj_w: Tensor,
    proj_b: Tensor,
}

/// A GPT-2 language model on candle (float32, inference only).
///
/// ```text
/// h = W_E[tokens] + W_pos[positions]
/// per layer: [q | k | v] = LN1(h) c_attn + b;  a = softmax(q k^T / sqrt(d) + causal mask)
///            h = h + (a v) c_proj + b;  h = h + act(LN2(h) c_fc + b) c_proj + b
/// logits = LN_f(h) W_E^T   (or `lm_head.weight` when present)
/// ```
#[derive(Debug, Clone)]
pub struct Gpt2 {
    config: Gpt2Config,
    wte: Tensor,
    wpe: Tensor,
    layers: Vec<Gpt2Layer>,
    ln_f_w: Tensor,
    ln_f_b: Tensor,
    lm_head: Tensor,
    device: Device,
    source: PathBuf,
}

impl Gpt2 {
    /// Loads a Hugging Face GPT-2 directory: `config.json` (`model_type` `gpt2`; `n_embd`, `n_head`,
    /// `n_layer`, `n_positions`, `vocab_size`, `n_inner`, `layer_norm_epsilon`,
    /// `activation_function`) and `model.safetensors` with tensors `wte.weight`, `wpe.weight`,
    /// `h.{l}.ln_1.{weight,bias}`, `h.{l}.attn.c_attn.{weight [D, 3D], bias}`,
    /// `h.{l}.attn.c_proj.{weight, bias}`, `h.{l}.ln_2.*`, `h.{l}.mlp.c_fc.*`, `h.{l}.mlp.c_proj.*`,
    /// `ln_f.*` (optionally all prefixed `transformer.`, plus an optional `lm_head.weight`). The
    /// causal-mask buffers `h.{l}.attn.bias` / `masked_bias` of older exports are ignored.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] naming `config.json` for a missing key or unsupported feature
    /// (another activation, `scale_attn_by_inverse_layer_idx`, `scale_attn_weights` false);
    /// [`ModelError::Tensor`] naming the file and tensor for a missing or misshapen tensor.
    pub fn from_hf_dir(dir: &Path, device: &Device) -> Result<Self> {
        let cfg = HfConfig::read(dir)?;
        let config = gpt2_config(&cfg)?;
        let c = &config;
        let mut store = read_weights(dir)?;
        let p = if store.contains("transformer.wte.weight") {
            "transformer."
        } else {
            ""
        };
        let held = store.layer_count(&format!("{p}h."));
        if held != c.n_layers {
            return Err(ModelError::Checkpoint {
                path: cfg.path.clone(),
                msg: format!(
                    "key `n_layer`: {}, but the weights hold {held} layer(s) (config and weights \
                     disagree)",
                    c.n_layers
                ),
            });
        }
        check_budget(c, &cfg)?;
        let dm = c.d_model;
        let wte = store.take(&format!("{p}wte.weight"), &[c.vocab_size, dm], device)?;
        let wpe = store.take(&format!("{p}wpe.weight"), &[c.n_ctx, dm], device)?;
        let mut layers = Vec::new(); // n_layers comes from a file: never trusted for an allocation
        for l in 0..c.n_layers {
            layers.push(take_layer(&mut store, &format!("{p}h.{l}."), c, device)?);
        }
        let ln_f_w = store.take(&format!("{p}ln_f.weight"), &[dm], device)?;
        let ln_f_b = store.take(&format!("{p}ln_f.bias"), &[dm], device)?;
        let lm_head = store
            .take_opt("lm_head.weight", &[c.vocab_size, dm], device)?
            .unwrap_or_else(|| wte.clone());
        let extra: Vec<String> = store
            .remaining()
            .into_iter()
            .filter(|n| !(n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias")))
            .collect();
        if !extra.is_empty() {
            return Err(ModelError::Checkpoint {
                path: store.path().to_path_buf(),
                msg: format!(
                    "unsupported: unexpected tensors for a GPT-2 model: {}",
                    extra.join(", ")
                ),
            });
        }
        Ok(Self {
            config,
            wte,
            wpe,
            layers,
            ln_f_w,
            ln_f_b,
            lm_head,
            device: device.clone(),
            source: dir.to_path_buf(),
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Gpt2Config {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The directory the model was loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Runs the model on a batch of token sequences.
    ///
    /// # Shapes
    /// `tokens` [B, T] u32 -> logits [B, T, V]; with `capture`, one softmax attention pattern per
    /// layer, [B, H, T, T] ([batch, head, query, key]).
    ///
    /// # Errors
    /// [`ModelError::Input`] when `tokens` is not [B, T] u32, is empty, longer than `n_ctx`, or holds
    /// an id >= V.
    pub fn forward(&self, tokens: &Tensor, capture: bool) -> Result<LmOutput> {
        self.pass(tokens, capture, &mut NoHooks)
    }

    /// The hook points of [`Gpt2::run_with_hooks`], in pass order: `hook_embed`, `hook_pos_embed`,
    /// per block the points of the SRAVEN transformer's blocks (`crate::hooks`), `ln_final.*`,
    /// `unembed.hook_in`, `unembed.hook_out`.
    pub fn hook_names(&self) -> Vec<String> {
        let kinds = BlockHooks {
            norm: true,
            rotary: false,
            value_hidden: false,
            mlp: true,
            gated: false,
        };
        lm_hook_names(self.config.n_layers, kinds, true, true)
    }

    /// The forward pass with TransformerLens 3.x's hook points (names, shapes and meanings of
    /// `HookedTransformer` on GPT-2 without weight processing; checked against TransformerLens 3.9
    /// in `tests/lm.rs`): `hook_embed` and `hook_pos_embed` `[B, T, D]` (`W_E[tokens]`,
    /// `W_pos[..T]`); per block `hook_resid_pre`, `ln1.hook_scale` `[B, T, 1]`,
    /// `ln1.hook_normalized` (before the LayerNorm's weight and bias), `attn.hook_q`, `hook_k`,
    /// `hook_v` `[B, T, H, d]` (with their biases), `attn.hook_attn_scores` `[B, H, Q, K]`
    /// (`q·k/√d`, `-inf` above the diagonal), `attn.hook_pattern`, `attn.hook_z` `[B, T, H, d]`,
    /// `hook_attn_out` (with `b_O`), `hook_resid_mid`, `ln2.*`, `mlp.hook_pre` (with `b_in`),
    /// `mlp.hook_post`, `hook_mlp_out`, `hook_resid_post`; then `ln_final.hook_scale`,
    /// `ln_final.hook_normalized`, `unembed.hook_in` (the final LayerNorm's output) and
    /// `unembed.hook_out` (the logits).
    ///
    /// # Shapes
    /// `tokens` [B, T] u32 -> logits [B, T, V].
    ///
    /// # Errors
    /// As [`Gpt2::forward`]; a hook's error; a replacement of another shape (naming the hook).
    pub fn run_with_hooks(&self, tokens: &Tensor, hooks: &mut dyn HookFn) -> Result<Tensor> {
        Ok(self.pass(tokens, false, hooks)?.logits)
    }

    /// The forward body with the hook-point reader `hooks` (`super::lens`); returns the logits.
    ///
    /// # Errors
    /// As [`Gpt2::forward`]; the reader's error.
    pub(crate) fn pass_with<P: HookPoints + ?Sized>(
        &self,
        tokens: &Tensor,
        hooks: &mut P,
    ) -> Result<Tensor> {
        Ok(self.pass(tokens, false, hooks)?.logits)
    }

    /// The same model with every weight tensor `w` replaced by `f(w)`, in a fixed order (token
    /// and position embeddings, per layer its tensors in declaration order, the final norm, the
    /// unembedding unless tied to the token embedding, which then stays tied).
    ///
    /// # Errors
    /// `f`'s errors.
    pub(crate) fn map_weights(&self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<Self> {
        let wte = f(&self.wte)?;
        let wpe = f(&self.wpe)?;
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(Gpt2Layer {
                ln1_w: f(&l.ln1_w)?,
                ln1_b: f(&l.ln1_b)?,
                c_attn_w: f(&l.c_attn_w)?,
                c_attn_b: f(&l.c_attn_b)?,
                c_proj_w: f(&l.c_proj_w)?,
                c_proj_b: f(&l.c_proj_b)?,
                ln2_w: f(&l.ln2_w)?,
                ln2_b: f(&l.ln2_b)?,
                fc_w: f(&l.fc_w)?,
                fc_b: f(&l.fc_b)?,
                proj_w: f(&l.proj_w)?,
                proj_b: f(&l.proj_b)?,
            });
        }
        let ln_f_w = f(&self.ln_f_w)?;
        let ln_f_b = f(&self.ln_f_b)?;
        let lm_head = if self.lm_head.id() == self.wte.id() {
            wte.clone()
        } else {
            f(&self.lm_head)?
        };
        Ok(Self {
            config: self.config.clone(),
            wte,
            wpe,
            layers,
            ln_f_w,
            ln_f_b,
            lm_head,
            device: self.device.clone(),
            source: self.source.clone(),
        })
    }

    /// The model's one forward body, generic over its hook points: [`NoHooks`] for
    /// [`Gpt2::forward`], a [`HookFn`] for [`Gpt2::run_with_hooks`] (the norms and the attention's
    /// softmax then take the decomposed forms whose intermediate tensors the hooks see,
    /// `super::layers`).
    ///
    /// # Shapes
    /// `tokens` [B, T] u32. Returns [`LmOutput`] (the patterns after their hooks).
    ///
    /// # Errors
    /// As [`Gpt2::forward`]; a hook's error; a replacement of another shape.
    fn pass<P: HookPoints + ?Sized>(
        &self,
        tokens: &Tensor,
        capture: bool,
        hooks: &mut P,
    ) -> Result<LmOutput> {
        let c = &self.config;
        let (b, t) = check_tokens(tokens, c.vocab_size, c.n_ctx)?;
        let tokens = tokens.to_device(&self.device)?;
        let (hh, d, dm) = (c.n_heads, c.d_model / c.n_heads, c.d_model);
        let eps = c.ln_eps;
        let mask = causal_mask(t, &self.device)?;
        let scale = 1.0 / (d as f64).sqrt();
        let emb = self
            .wte
            .index_select(&tokens.flatten_all()?, 0)?
            .reshape((b, t, dm))?;
        let mut h = match hooks.hooks() {
            None => emb.broadcast_add(&self.wpe.narrow(0, 0, t)?)?,
            Some(hk) => {
                let emb = at(hk, "hook_embed", emb)?;
                let pos = self
                    .wpe
                    .narrow(0, 0, t)?
                    .unsqueeze(0)?
                    .broadcast_as((b, t, dm))?
                    .contiguous()?;
                let pos = at(hk, "hook_pos_embed", pos)?;
                (emb + pos)?
            }
        };
        let mut patterns = Vec::new();
        let ran = hooks.blocks_to_run(c.n_layers).min(c.n_layers);
        for (l, layer) in self.layers.iter().enumerate().take(ran) {
            h = hooks.at_block(l, "hook_resid_pre", h)?;
            let ln1 = Norm::Layer(&layer.ln1_w, &layer.ln1_b);
            let x = norm(&h, ln1, eps, || format!("blocks.{l}.ln1"), hooks)?;
            let qkv = matmul(&x, &layer.c_attn_w)?.broadcast_add(&layer.c_attn_b)?;
            let part = |i: usize| -> Result<Tensor> {
                Ok(qkv
                    .narrow(2, i * dm, dm)?
                    .reshape((b, t, hh, d))?
                    .transpose(1, 2)?
                    .contiguous()?)
            };
            let q = hooks.at_block_heads(l, "attn.hook_q", part(0)?)?;
            let k = hooks.at_block_heads(l, "attn.hook_k", part(1)?)?;
            let v = hooks.at_block_heads(l, "attn.hook_v", part(2)?)?;
            let a = causal_softmax(&q, &k, scale, &mask, l, hooks)?;
            let z = hooks.at_block_heads(l, "attn.hook_z", a.matmul(&v)?)?;
            if capture {
                patterns.push(a);
            }
            let o = z.transpose(1, 2)?.reshape((b, t, dm))?;
            let attn_out = matmul(&o, &layer.c_proj_w)?.broadcast_add(&layer.c_proj_b)?;
            let attn_out = hooks.at_block(l, "hook_attn_out", attn_out)?;
            h = hooks.at_block(l, "hook_resid_mid", (h + attn_out)?)?;
            let ln2 = Norm::Layer(&layer.ln2_w, &layer.ln2_b);
            let x = norm(&h, ln2, eps, || format!("blocks.{l}.ln2"), hooks)?;
            let pre = matmul(&x, &layer.fc_w)?.broadcast_add(&layer.fc_b)?;
            let pre = hooks.at_block(l, "mlp.hook_pre", pre)?;
            let post = match c.activation {
                Gpt2Activation::GeluTanh => pre.gelu()?,
                Gpt2Activation::GeluErf => pre.gelu_erf()?,
                Gpt2Activation::Relu => pre.relu()?,
            };
            let post = hooks.at_block(l, "mlp.hook_post", post)?;
            let out = matmul(&post, &layer.proj_w)?.broadcast_add(&layer.proj_b)?;
            let out = hooks.at_block(l, "hook_mlp_out", out)?;
            h = hooks.at_block(l, "hook_resid_post", (h + out)?)?;
        }
        let logits = match readout_input(h, ran, c.n_layers, hooks)? {
            None => no_logits(c.vocab_size, &self.device)?,
            Some(h) => {
                let ln_f = Norm::Layer(&self.ln_f_w, &self.ln_f_b);
                let h = norm(&h, ln_f, eps, || "ln_final".into(), hooks)?;
                let h = hooks.at("unembed.hook_in", h)?;
                hooks.at("unembed.hook_out", matmul_t(&h, &self.lm_head)?)?
            }
        };
        Ok(LmOutput {
            logits,
            patterns: capture.then_some(patterns),
        })
    }

    /// Exports per-head weights in TransformerLens layout ([`HeadWeights`]): `W_Q[l, h] =
    /// c_attn.weight[:, h*d..(h+1)*d]` (K and V from the column blocks at `D` and `2D`),
    /// `b_Q[l, h]` likewise from `c_attn.bias`, `W_O[l, h] = c_proj.weight[h*d..(h+1)*d, :]`,
    /// `b_O = c_proj.bias`, `W_E = wte`, `W_pos = wpe`, `W_U = lm_head^T` (tied: `wte^T`), `b_U = 0`.
    /// With `fold_norm`, `ln_1` is folded into Q/K/V (`diag(g) W`, `b + beta W`) and `ln_f` into
    /// `W_U`, `b_U`, as TransformerLens' `fold_ln` (without its weight centring).
    ///
    /// # Shapes
    /// See [`HeadWeights`].
    ///
    /// # Errors
    /// [`ModelError::Candle`] when copying from the device fails.
    pub fn head_weights(&self, fold_norm: bool) -> Result<HeadWeights> {
        let c = &self.config;
        let (hh, dm) = (c.n_heads, c.d_model);
        let mut col = HeadCollector::new(hh, dm / hh, dm);
        for layer in &self.layers {
            // Conv1D [in, out] -> torch layout [out, in].
            let w: Array2<f32> = to_array2(&layer.c_attn_w)?.reversed_axes();
            let bias = to_array1(&layer.c_attn_b)?;
            let o = to_array2(&layer.c_proj_w)?.reversed_axes();
            let bo = to_array1(&layer.c_proj_b)?;
            let g = to_array1(&layer.ln1_w)?;
            let beta = to_array1(&layer.ln1_b)?;
            let bslice = |i: usize| bias.slice(s![i * dm..(i + 1) * dm]).to_vec();
            let (bq, bk, bv) = (bslice(0), bslice(1), bslice(2));
            col.push(
                &TorchAttn {
                    q: w.slice(s![0..dm, ..]),
                    k: w.slice(s![dm..2 * dm, ..]),
                    v: w.slice(s![2 * dm..3 * dm, ..]),
                    o: o.view(),
                    b_q: Some(&bq),
                    b_k: Some(&bk),
                    b_v: Some(&bv),
                    b_o: bo.as_slice(),
                    gain: if fold_norm { g.as_slice() } else { None },
                    beta: if fold_norm { beta.as_slice() } else { None },
                },
                hh,
            );
        }
        let w_e = to_array2(&self.wte)?;
        let w_pos = to_array2(&self.wpe)?;
        let mut w_u = to_array2(&self.lm_head)?
            .reversed_axes()
            .as_standard_layout()
            .into_owned();
        let mut b_u = ndarray::Array1::zeros(c.vocab_size);
        if fold_norm {
            let g = to_array1(&self.ln_f_w)?.to_vec();
            let beta = to_array1(&self.ln_f_b)?.to_vec();
            fold_final_norm(&mut w_u, &mut b_u, &g, Some(&beta));
        }
        col.finish(w_e, Some(w_pos), w_u, b_u)
    }
}

/// The hyper-parameters of a Hugging Face GPT-2 `config.json`, checked (module docs of
/// [`Gpt2Model::from_hf_dir`]).
///
/// # Errors
/// [`ModelError::Checkpoint`] naming `config.json` for a missing key, a zero size or an
/// unsupported feature.
fn gpt2_config(cfg: &HfConfig) -> Result<Gpt2Config> {
    if !cfg
        .kind_names()
        .iter()
        .any(|n| n == "gpt2" || n.starts_with("gpt2lmhead") || n == "gpt2model")
    {
        return Err(cfg.unsupported("model_type / architectures is not gpt2"));
    }
    if cfg
        .bool_opt("scale_attn_by_inverse_layer_idx")?
        .unwrap_or(false)
    {
        return Err(cfg.unsupported("scale_attn_by_inverse_layer_idx"));
    }
    if !cfg.bool_opt("scale_attn_weights")?.unwrap_or(true) {
        return Err(cfg.unsupported("scale_attn_weights = false"));
    }
    let activation = match cfg.str_opt("activation_function")?.unwrap_or("gelu_new") {
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Gpt2Activation::GeluTanh,
        "gelu" => Gpt2Activation::GeluErf,
        "relu" => Gpt2Activation::Relu,
        other => return Err(cfg.unsupported(&format!("activation_function `{other}`"))),
    };
    let d_model = cfg.usize("n_embd")?;
    let n_ctx = match cfg.usize_opt("n_positions")? {
        Some(n) => n,
        None => cfg.usize("n_ctx")?,
    };
    let config = Gpt2Config {
        vocab_size: cfg.usize("vocab_size")?,
        n_ctx,
        d_model,
        n_layers: cfg.usize("n_layer")?,
        n_heads: cfg.usize("n_head")?,
        d_mlp: cfg
            .usize_opt("n_inner")?
            .unwrap_or(d_model.saturating_mul(4)),
        ln_eps: cfg.f64_opt("layer_norm_epsilon")?.unwrap_or(1e-5),
        activation,
    };
    let c = &config;
    let bad = [
        ("n_embd", c.d_model),
        ("n_head", c.n_heads),
        ("n_layer", c.n_layers),
        ("vocab_size", c.vocab_size),
        ("n_positions", c.n_ctx),
    ];
    if let Some((k, _)) = bad.iter().find(|(_, v)| *v == 0) {
        return Err(ModelError::Checkpoint {
            path: cfg.path.clone(),
            msg: format!("key `{k}` must be positive"),
        });
    }
    if d_model % c.n_heads != 0 {
        return Err(ModelError::Checkpoint {
            path: cfg.path.clone(),
            msg: format!("n_embd {d_model} is not a multiple of n_head {}", c.n_heads),
        });
    }
    Ok(config)
}

/// Bounds the weights the sizes of `config.json` imply by the memory budget, before any tensor is
/// checked against them.
///
/// # Errors
/// [`ModelError::Checkpoint`] naming `config.json` when the budget refuses them.
fn check_budget(c: &Gpt2Config, cfg: &HfConfig) -> Result<()> {
    let (v, t, dm, f, l) = [c.vocab_size, c.n_ctx, c.d_model, c.d_mlp, c.n_layers]
        .map(|x| x as u128)
        .into();
    let per_layer = (4 * dm)
        .saturating_mul(dm)
        .saturating_add((2 * dm).saturating_mul(f));
    let params = (v + t)
        .saturating_mul(dm)
        .saturating_add(l.saturating_mul(per_layer));
    hyperlens_io::budget::check_alloc(
        format!(
            "n_embd = {}, n_inner = {}, vocab_size = {}, n_positions = {}",
            c.d_model, c.d_mlp, c.vocab_size, c.n_ctx
        ),
        params.saturating_mul(4),
    )
    .map_err(|e| ModelError::Checkpoint {
        path: cfg.path.clone(),
        msg: e.to_string(),
    })
}

/// The weights of one block, `{prefix}ln_1.weight` ... `{prefix}mlp.c_proj.bias`.
///
/// # Errors
/// [`ModelError::Tensor`] for a missing or misshapen tensor.
fn take_layer(
    store: &mut TensorStore,
    prefix: &str,
    c: &Gpt2Config,
    device: &Device,
) -> Result<Gpt2Layer> {
    let (dm, f) = (c.d_model, c.d_mlp);
    let mut t = |n: &str, dims: &[usize]| store.take(&format!("{prefix}{n}"), dims, device);
    Ok(Gpt2Layer {
        ln1_w: t("ln_1.weight", &[dm])?,
        ln1_b: t("ln_1.bias", &[dm])?,
        c_attn_w: t("attn.c_attn.weight", &[dm, 3 * dm])?,
        c_attn_b: t("attn.c_attn.bias", &[3 * dm])?,
        c_proj_w: t("attn.c_proj.weight", &[dm, dm])?,
        c_proj_b: t("attn.c_proj.bias", &[dm])?,
        ln2_w: t("ln_2.weight", &[dm])?,
        ln2_b: t("ln_2.bias", &[dm])?,
        fc_w: t("mlp.c_fc.weight", &[dm, f])?,
        fc_b: t("mlp.c_fc.bias", &[f])?,
        proj_w: t("mlp.c_proj.weight", &[f, dm])?,
        proj_b: t("mlp.c_proj.bias", &[dm])?,
    })
}
