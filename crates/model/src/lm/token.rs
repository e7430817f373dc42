//! Trainable token-sequence transformers for the circuits analyses: token embedding, learned
//! absolute positions, causally masked attention with any of the eight mixers, optional MLP and
//! LayerNorm, unembedding. The attention-only presets with 0, 1 or 2 layers are the toy models of
//! Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits" (`docs/spec/circuits.md`).
//!
//! Parameter names and layouts are those of TransformerLens (`HookedTransformer`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use ndarray::{Array2, Axis};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::ckpt::{load_dir, read_config_json, save_dir};
use super::layers::{no_logits, readout_input};
use super::weights::{
    fold_final_norm, to_array1, to_array2, HeadCollector, HeadWeights, TorchAttn,
};
use super::{check_tokens, LmOutput};
use crate::error::{ModelError, Result};
use crate::hooks::{at, lm_hook_names, BlockHooks, HookFn};
use crate::mixer::Mixer;
use crate::mixer::ValueNetwork;
use crate::nn::params::{check_var_count, seeded_tensors, varmap_from};
use crate::nn::position::{causal_mask, dropout_mask};
use crate::nn::{
    AttentionInputs, Block, BlockSpec, HookPoints, InitRule, LayerNorm, Linear, NoHooks, Params,
};
use crate::ops::Ops;

/// The `model_type` written into a token model's `config.json` (how [`super::detect`] knows it).
pub const TOKEN_MODEL_TYPE: &str = "hyperlens-token";

/// LayerNorm epsilon of token models (TransformerLens default).
pub const TOKEN_LN_EPS: f32 = 1e-5;

/// Architecture of a [`TokenModel`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Vocabulary size `V`.
    pub vocab_size: usize,
    /// Number of learned positions (longest sequence).
    pub n_ctx: usize,
    /// Residual width `D`.
    pub d_model: usize,
    /// Heads per layer `H`.
    pub n_heads: usize,
    /// Head width `d` of queries, keys and values.
    pub d_head: usize,
    /// Number of layers (0 gives the direct path `W_E W_U` only).
    pub n_layers: usize,
    /// MLP hidden width; `None` for an attention-only model.
    pub d_mlp: Option<usize>,
    /// Pre-LayerNorm before attention and MLP, and a final LayerNorm (eps 1e-5).
    pub layer_norm: bool,
    /// The sequence mixer of every layer (always causally masked).
    pub mixer: Mixer,
}

impl TokenConfig {
    /// The attention-only toy model of Elhage et al. with `n_layers` in {0, 1, 2}: no MLP, no
    /// LayerNorm, softmax attention, `D = 64`, 4 heads of width 16.
    ///
    /// # Errors
    /// [`ModelError::Config`] when `n_layers > 2` or a size is zero.
    pub fn attn_only(n_layers: usize, vocab_size: usize, n_ctx: usize) -> Result<Self> {
        if n_layers > 2 {
            return Err(ModelError::Config(format!(
                "the attention-only presets have 0, 1 or 2 layers, got {n_layers}"
            )));
        }
        let c = Self {
            vocab_size,
            n_ctx,
            d_model: 64,
            n_heads: 4,
            d_head: 16,
            n_layers,
            d_mlp: None,
            layer_norm: false,
            mixer: Mixer::Softmax,
        };
        c.check()?;
        Ok(c)
    }

    /// Validates the sizes.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the zero field.
    pub fn check(&self) -> Result<()> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("n_ctx", self.n_ctx),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("d_head", self.d_head),
            ("d_mlp", self.d_mlp.unwrap_or(1)),
        ];
        for (name, v) in sizes {
            if v == 0 {
                return Err(ModelError::Config(format!(
                    "token model: `{name}` must be positive"
                )));
            }
        }
        // Sizes come from a file or a flag: bound the weights by the memory budget before
        // anything is built.
        hyperlens_io::budget::check_alloc(
            format!(
                "token model: a model with vocab_size = {}, d_model = {}, n_layers = {}",
                self.vocab_size, self.d_model, self.n_layers
            ),
            self.weights_bound().saturating_mul(4),
        )
        .map_err(|e| ModelError::Config(e.to_string()))?;
        Ok(())
    }

    /// An upper bound of the number of parameters in closed form (the embedding, unembedding and
    /// positions, and per layer Q, K, V, O and the MLP; norms and biases left out), saturating
    /// instead of overflowing, so that sizes read from a file or a flag can be checked before
    /// anything is built from them.
    pub fn weights_bound(&self) -> u128 {
        let [v, t, dm, hd, l, f] = [
            self.vocab_size,
            self.n_ctx,
            self.d_model,
            self.n_heads.saturating_mul(self.d_head),
            self.n_layers,
            self.d_mlp.unwrap_or(0),
        ]
        .map(|x| x as u128);
        let m = |a: u128, b: u128| a.saturating_mul(b);
        let per_layer = m(m(4, hd), dm).saturating_add(m(m(2, dm), f));
        m(m(2, v), dm)
            .saturating_add(m(t, dm))
            .saturating_add(m(l, per_layer))
    }

    /// The name and shape of every parameter in canonical order (TransformerLens names).
    ///
    /// # Shapes
    /// `embed.W_E [V, D]`, `pos_embed.W_pos [n_ctx, D]`; per layer `blocks.{l}.ln1.w/.b [D]` (with
    /// LayerNorm), `attn.W_Q/W_K/W_V [H, D, d]`, `attn.b_Q/b_K/b_V [H, d]`, `attn.W_O [H, d, D]`,
    /// `attn.b_O [D]`, `ln2.w/.b [D]` and `mlp.W_in [D, D_mlp]`, `mlp.b_in`, `mlp.W_out
    /// [D_mlp, D]`, `mlp.b_out` (with an MLP); `ln_final.w/.b [D]` (with LayerNorm);
    /// `unembed.W_U [D, V]`, `unembed.b_U [V]`.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (dm, h, d, v) = (self.d_model, self.n_heads, self.d_head, self.vocab_size);
        let mut out: Vec<(String, Vec<usize>)> = vec![
            ("embed.W_E".into(), vec![v, dm]),
            ("pos_embed.W_pos".into(), vec![self.n_ctx, dm]),
        ];
        for l in 0..self.n_layers {
            let p = |s: &str| format!("blocks.{l}.{s}");
            if self.layer_norm {
                out.push((p("ln1.w"), vec![dm]));
                out.push((p("ln1.b"), vec![dm]));
            }
            for w in ["W_Q", "W_K", "W_V"] {
                out.push((p(&format!("attn.{w}")), vec![h, dm, d]));
            }
            for b in ["b_Q", "b_K", "b_V"] {
                out.push((p(&format!("attn.{b}")), vec![h, d]));
            }
            out.push((p("attn.W_O"), vec![h, d, dm]));
            out.push((p("attn.b_O"), vec![dm]));
            if let Some(f) = self.d_mlp {
                if self.layer_norm {
                    out.push((p("ln2.w"), vec![dm]));
                    out.push((p("ln2.b"), vec![dm]));
                }
                out.push((p("mlp.W_in"), vec![dm, f]));
                out.push((p("mlp.b_in"), vec![f]));
                out.push((p("mlp.W_out"), vec![f, dm]));
                out.push((p("mlp.b_out"), vec![dm]));
            }
        }
        if self.layer_norm {
            out.push(("ln_final.w".into(), vec![dm]));
            out.push(("ln_final.b".into(), vec![dm]));
        }
        out.push(("unembed.W_U".into(), vec![dm, v]));
        out.push(("unembed.b_U".into(), vec![v]));
        out
    }

    /// Total number of parameters.
    pub fn n_params(&self) -> usize {
        self.tensor_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    /// The config as it is written to `config.json` (with `model_type` = [`TOKEN_MODEL_TYPE`]).
    ///
    /// # Errors
    /// [`ModelError::Input`] if serialisation fails.
    pub fn to_json(&self) -> Result<serde_json::Value> {
        let mut v = serde_json::to_value(self)
            .map_err(|e| ModelError::Input(format!("token config: {e}")))?;
        if let serde_json::Value::Object(m) = &mut v {
            m.insert(
                "model_type".into(),
                serde_json::Value::String(TOKEN_MODEL_TYPE.into()),
            );
        }
        Ok(v)
    }

    /// Parses and checks a `config.json` written by [`TokenConfig::to_json`]; `path` names it in
    /// errors.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when `model_type` is not [`TOKEN_MODEL_TYPE`] or the config fails
    /// [`TokenConfig::check`]; [`ModelError::Json`] for unknown or missing fields.
    pub fn from_json(mut v: serde_json::Value, path: &Path) -> Result<Self> {
        let ty = match &mut v {
            serde_json::Value::Object(m) => m.remove("model_type"),
            _ => None,
        };
        if ty.as_ref().and_then(|t| t.as_str()) != Some(TOKEN_MODEL_TYPE) {
            return Err(ModelError::Checkpoint {
                path: path.to_path_buf(),
                msg: format!("`model_type` is {ty:?}, expected \"{TOKEN_MODEL_TYPE}\""),
            });
        }
        let c: Self = serde_json::from_value(v).map_err(|source| ModelError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        c.check().map_err(|e| ModelError::Checkpoint {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        Ok(c)
    }
}

/// A token-sequence transformer on candle, trainable.
///
/// ```text
/// h = W_E[tokens] + W_pos[0..T]
/// per layer: x = LN1(h) (or h); q, k, v = x W_{Q,K,V}[h] + b; (o, a) = mix(q, k, v, causal, mixer)
///            h = h + sum_h o[h] W_O[h] + b_O;  with an MLP: h = h + GELU(LN2(h) W_in + b_in) W_out + b_out
/// logits = LN_final(h) W_U + b_U
/// ```
/// The blocks are [`crate::nn::Block`]s (the SRAVEN transformer's), `mix` is
/// [`crate::ops::Ops::mix`] (any of the eight mixers); masked (future) keys get weight 0.
#[derive(Debug, Clone)]
pub struct TokenModel {
    config: TokenConfig,
    w_e: Tensor,
    w_pos: Tensor,
    blocks: Vec<Block>,
    ln_final: Option<LayerNorm>,
    unembed: Linear,
    params: Vec<(String, Tensor)>,
    device: Device,
    ops: Ops,
}

/// Initialisation of one parameter (TransformerLens `init_weights` with its default
/// `initializer_range = 0.8 / sqrt(D)`): weight matrices normal with that std, biases 0,
/// LayerNorm scales 1.
fn init_rule(cfg: &TokenConfig, name: &str) -> InitRule {
    let last = name.rsplit('.').next().unwrap_or(name);
    if last.starts_with("W_") {
        InitRule::Normal(0.8 / (cfg.d_model as f64).sqrt())
    } else if last == "w" {
        InitRule::Const(1.0)
    } else {
        InitRule::Const(0.0)
    }
}

impl TokenModel {
    /// Builds the model from a `VarBuilder`, fetching every tensor of
    /// [`TokenConfig::tensor_shapes`] by name (over a fresh `VarMap`, missing tensors are created
    /// as trainable `Var`s with the TransformerLens initialisation, unseeded).
    ///
    /// # Errors
    /// [`ModelError::Config`] for an invalid config; candle errors for a missing tensor or a shape
    /// mismatch.
    pub fn new(config: &TokenConfig, vb: VarBuilder) -> Result<Self> {
        config.check()?;
        let device = vb.device().clone();
        let p = Params::fetch(&vb, config.tensor_shapes(), |n| init_rule(config, n))?;
        let eps = config.layer_norm.then_some(TOKEN_LN_EPS as f64);
        let spec = BlockSpec {
            ln_eps: eps,
            mlp: config.d_mlp.is_some(),
            rel_pos: false,
            mixer: config.mixer,
        };
        let blocks = (0..config.n_layers)
            .map(|l| Block::from_params(&p, l, spec))
            .collect::<Result<Vec<_>>>()?;
        let ln_final = eps
            .map(|eps| -> Result<LayerNorm> {
                Ok(LayerNorm {
                    w: p.get("ln_final.w")?,
                    b: p.get("ln_final.b")?,
                    eps,
                })
            })
            .transpose()?;
        Ok(Self {
            config: config.clone(),
            w_e: p.get("embed.W_E")?,
            w_pos: p.get("pos_embed.W_pos")?,
            blocks,
            ln_final,
            unembed: Linear::new(p.get("unembed.W_U")?, p.get("unembed.b_U")?),
            params: p.ordered().to_vec(),
            device,
            ops: Ops::default(),
        })
    }

    /// Seeded parameters with the TransformerLens initialisation, in canonical order.
    ///
    /// # Errors
    /// [`ModelError::Config`] for an invalid config; candle errors.
    pub fn init_tensors(
        config: &TokenConfig,
        seed: u64,
        device: &Device,
    ) -> Result<Vec<(String, Tensor)>> {
        config.check()?;
        seeded_tensors(
            config.tensor_shapes(),
            seed,
            |n| init_rule(config, n),
            device,
        )
    }

    /// A trainable model with seeded initialisation ([`TokenModel::init_tensors`]); its
    /// parameters are the `Var`s of the returned `VarMap`.
    ///
    /// # Errors
    /// As [`TokenModel::trainable_from_tensors`].
    pub fn init(config: &TokenConfig, seed: u64, device: &Device) -> Result<(Self, VarMap)> {
        let t = Self::init_tensors(config, seed, device)?;
        Self::trainable_from_tensors(config, t, device)
    }

    /// A trainable model starting from the given named tensors (e.g. a checkpoint to resume).
    ///
    /// # Errors
    /// [`ModelError::Input`] when the tensors are not exactly the config's parameters; candle
    /// errors on a shape mismatch.
    pub fn trainable_from_tensors(
        config: &TokenConfig,
        tensors: impl IntoIterator<Item = (String, Tensor)>,
        device: &Device,
    ) -> Result<(Self, VarMap)> {
        let varmap = varmap_from(tensors, device)?;
        let model = Self::new(config, VarBuilder::from_varmap(&varmap, DType::F32, device))?;
        check_var_count(&varmap, model.params.len())?;
        Ok((model, varmap))
    }

    /// A frozen model from named tensors.
    ///
    /// # Errors
    /// As [`TokenModel::new`].
    pub fn from_tensors(
        config: &TokenConfig,
        tensors: HashMap<String, Tensor>,
        device: &Device,
    ) -> Result<Self> {
        Self::new(
            config,
            VarBuilder::from_tensors(tensors, DType::F32, device),
        )
    }

    /// Loads a checkpoint directory written by [`TokenModel::save`] (checked: every tensor present,
    /// of the shape the config implies, finite, none extra).
    ///
    /// # Errors
    /// As [`super::ckpt::load_dir`] and [`TokenConfig::from_json`]; errors name the file and tensor.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let config = TokenConfig::from_json(
            read_config_json(dir)?,
            &dir.join(crate::checkpoint::CONFIG_FILE),
        )?;
        let tensors = load_dir(dir, config.n_layers, || config.tensor_shapes(), device)?;
        Self::from_tensors(&config, tensors, device)
    }

    /// Saves the model as a checkpoint directory (`config.json` + `model.safetensors`, atomically).
    ///
    /// # Errors
    /// As [`super::ckpt::save_dir`].
    pub fn save(&self, dir: &Path) -> Result<()> {
        save_dir(
            dir,
            &self.config.to_json()?,
            &self.config.tensor_shapes(),
            &self.params,
        )
    }

    /// The configuration.
    pub fn config(&self) -> &TokenConfig {
        &self.config
    }

    /// The device holding the parameters.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Every parameter by TransformerLens name, in canonical order.
    pub fn named_tensors(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// The same model computing with the given forms of the operations ([`Ops`]).
    pub fn with_ops(mut self, ops: Ops) -> Self {
        self.ops = ops;
        self
    }

    /// Evaluation-mode forward pass.
    ///
    /// # Shapes
    /// `tokens` [B, T] u32 -> logits [B, T, V] and, with `capture`, the normalised attention of
    /// every layer [B, H, T, T] ([batch, head, query, key]; zero above the diagonal).
    ///
    /// # Errors
    /// [`ModelError::Input`] when `tokens` is not [B, T] u32, is empty, longer than `n_ctx`, or holds
    /// an id >= V.
    pub fn forward(&self, tokens: &Tensor, capture: bool) -> Result<LmOutput> {
        self.forward_with(tokens, None, capture)
    }

    /// The hook points of [`TokenModel::run_with_hooks`], in pass order: `hook_embed`,
    /// `hook_pos_embed`, per block those of the SRAVEN transformer's blocks (`crate::hooks`; the
    /// norms and the MLP when the model has them), `ln_final.*` (with LayerNorm),
    /// `unembed.hook_in`, `unembed.hook_out`.
    pub fn hook_names(&self) -> Vec<String> {
        let c = &self.config;
        let kinds = BlockHooks {
            norm: self.ln_final.is_some(),
            rotary: false,
            value_hidden: c.mixer.value_network() != ValueNetwork::Default,
            mlp: c.d_mlp.is_some(),
            gated: false,
        };
        lm_hook_names(c.n_layers, kinds, true, self.ln_final.is_some())
    }

    /// The forward pass with TransformerLens's hook points: `hook_embed` (`W_E[tokens]`) and
    /// `hook_pos_embed` (`W_pos[..T]`) `[B, T, D]`, the blocks' points with the shapes and meanings
    /// of the SRAVEN transformer's (`crate::hooks`), then the final LayerNorm's, `unembed.hook_in`
    /// and `unembed.hook_out` (the logits). `attn.hook_attn_scores` is before the causal mask,
    /// which each mixer's normalisation applies in its own way (softmax: `-inf`; the others: 0).
    ///
    /// # Shapes
    /// `tokens` [B, T] u32 -> logits [B, T, V].
    ///
    /// # Errors
    /// As [`TokenModel::forward`]; a hook's error; a replacement of another shape.
    pub fn run_with_hooks(&self, tokens: &Tensor, hooks: &mut dyn HookFn) -> Result<Tensor> {
        Ok(self.pass(tokens, None, false, hooks)?.logits)
    }

    /// Training-mode forward pass with attention dropout `p` (one mask per layer shared over batch
    /// and heads, [`dropout_mask`]); `p = 0` equals [`TokenModel::forward`].
    ///
    /// # Shapes
    /// As [`TokenModel::forward`].
    ///
    /// # Errors
    /// As [`TokenModel::forward`]; [`ModelError::Input`] when `p` is not in [0, 1).
    pub fn forward_train<R: Rng + ?Sized>(
        &self,
        tokens: &Tensor,
        p: f64,
        rng: &mut R,
        capture: bool,
    ) -> Result<LmOutput> {
        if !(0.0..1.0).contains(&p) {
            return Err(ModelError::Input(format!(
                "attention dropout rate must be in [0, 1), got {p}"
            )));
        }
        if p == 0.0 {
            return self.forward_with(tokens, None, capture);
        }
        let t = tokens
            .dim(1)
            .map_err(|_| ModelError::Input("tokens must be [batch, time]".into()))?;
        let masks = (0..self.blocks.len())
            .map(|_| dropout_mask(t, t, p, rng, &self.device))
            .collect::<Result<Vec<_>>>()?;
        self.forward_with(tokens, Some(&masks), capture)
    }

    fn forward_with(
        &self,
        tokens: &Tensor,
        dropout: Option<&[Tensor]>,
        capture: bool,
    ) -> Result<LmOutput> {
        self.pass(tokens, dropout, capture, &mut NoHooks)
    }

    /// The forward body in evaluation mode with the hook-point reader `hooks` (`super::lens`);
    /// returns the logits.
    ///
    /// # Errors
    /// As [`TokenModel::forward`]; the reader's error.
    pub(crate) fn pass_with<P: HookPoints + ?Sized>(
        &self,
        tokens: &Tensor,
        hooks: &mut P,
    ) -> Result<Tensor> {
        Ok(self.pass(tokens, None, false, hooks)?.logits)
    }

    /// The same model (and [`Ops`]) with every parameter `w` replaced by `f(w)`, in canonical
    /// order ([`TokenModel::named_tensors`]).
    ///
    /// # Errors
    /// `f`'s errors; as [`TokenModel::from_tensors`].
    pub(crate) fn map_weights(&self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<Self> {
        let mut tensors = HashMap::with_capacity(self.params.len());
        for (name, t) in &self.params {
            tensors.insert(name.clone(), f(t)?);
        }
        Ok(Self::from_tensors(&self.config, tensors, &self.device)?.with_ops(self.ops))
    }

    /// The model's one forward body, generic over its hook points: [`NoHooks`] for the plain and
    /// training passes, a [`HookFn`] for [`TokenModel::run_with_hooks`] (the blocks are
    /// [`Block::forward`]; with a hook attached the positional sum and the final LayerNorm take
    /// the forms whose intermediate tensors the hooks see).
    ///
    /// # Shapes
    /// `tokens [B, T]` u32; `dropout` one mask per layer. Returns [`LmOutput`].
    ///
    /// # Errors
    /// As [`TokenModel::forward`]; a hook's error; a replacement of another shape.
    fn pass<P: HookPoints + ?Sized>(
        &self,
        tokens: &Tensor,
        dropout: Option<&[Tensor]>,
        capture: bool,
        hooks: &mut P,
    ) -> Result<LmOutput> {
        let c = &self.config;
        let (b, t) = check_tokens(tokens, c.vocab_size, c.n_ctx)?;
        let tokens = tokens.to_device(&self.device)?;
        let ops = self.ops;
        let mask = causal_mask(t, &self.device)?;
        let emb = self
            .w_e
            .index_select(&tokens.flatten_all()?, 0)?
            .reshape((b, t, c.d_model))?;
        let mut h = match hooks.hooks() {
            None => ops.add_leading(&emb, &self.w_pos.narrow(0, 0, t)?)?,
            Some(hk) => {
                let emb = at(hk, "hook_embed", emb)?;
                let pos = self
                    .w_pos
                    .narrow(0, 0, t)?
                    .unsqueeze(0)?
                    .broadcast_as((b, t, c.d_model))?
                    .contiguous()?;
                let pos = at(hk, "hook_pos_embed", pos)?;
                (emb + pos)?
            }
        };
        let mut patterns = Vec::new();
        let ran = hooks.blocks_to_run(c.n_layers).min(c.n_layers);
        for (l, blk) in self.blocks.iter().enumerate().take(ran) {
            let inputs = AttentionInputs {
                buckets: None,
                mask: Some(&mask),
                dropout: dropout.and_then(|m| m.get(l)),
            };
            let out = blk.forward(ops, &h, l, inputs, hooks)?;
            h = out.resid;
            if capture {
                patterns.push(out.pattern);
            }
        }
        let logits = match readout_input(h, ran, c.n_layers, hooks)? {
            None => no_logits(c.vocab_size, &self.device)?,
            Some(mut h) => {
                if let Some(ln) = &self.ln_final {
                    h = ln.forward_hooked(ops, &h, || "ln_final".into(), hooks)?;
                }
                let h = hooks.at("unembed.hook_in", h)?;
                hooks.at("unembed.hook_out", self.unembed.forward(ops, &h)?)?
            }
        };
        Ok(LmOutput {
            logits,
            patterns: capture.then_some(patterns),
        })
    }

    /// Exports per-head weights ([`HeadWeights`]); the parameters are already in TransformerLens
    /// layout. With `fold_norm` and LayerNorm, `ln1` is folded into `W_Q`, `W_K`, `W_V`, `b_Q`,
    /// `b_K`, `b_V` and `ln_final` into `W_U`, `b_U` (TransformerLens `fold_ln` without centring).
    ///
    /// # Shapes
    /// See [`HeadWeights`]; `w_pos` is `pos_embed.W_pos`.
    ///
    /// # Errors
    /// [`ModelError::Candle`] when copying from the device fails.
    pub fn head_weights(&self, fold_norm: bool) -> Result<HeadWeights> {
        let c = &self.config;
        let (hh, d, dm) = (c.n_heads, c.d_head, c.d_model);
        let mut col = HeadCollector::new(hh, d, dm);
        // [H, D, d] -> torch layout [H*d, D]
        let torch = |w: &Tensor| -> Result<Array2<f32>> {
            to_array2(&w.permute((0, 2, 1))?.reshape((hh * d, dm))?)
        };
        for blk in &self.blocks {
            let a = &blk.attn;
            let (q, k, v) = (torch(&a.w_q)?, torch(&a.w_k)?, torch(&a.w_v)?);
            let o = to_array2(&a.w_o.reshape((hh * d, dm))?)?.reversed_axes();
            let (bq, bk, bv) = (
                a.b_q.flatten_all()?.to_vec1::<f32>()?,
                a.b_k.flatten_all()?.to_vec1::<f32>()?,
                a.b_v.flatten_all()?.to_vec1::<f32>()?,
            );
            let bo = a.b_o.to_vec1::<f32>()?;
            let (g, beta) = match (&blk.ln1, fold_norm) {
                (Some(ln), true) => (Some(ln.w.to_vec1::<f32>()?), Some(ln.b.to_vec1::<f32>()?)),
                _ => (None, None),
            };
            col.push(
                &TorchAttn {
                    q: q.view(),
                    k: k.view(),
                    v: v.view(),
                    o: o.view(),
                    b_q: Some(&bq),
                    b_k: Some(&bk),
                    b_v: Some(&bv),
                    b_o: Some(&bo),
                    gain: g.as_deref(),
                    beta: beta.as_deref(),
                },
                hh,
            );
        }
        let mut w_u = to_array2(&self.unembed.w)?;
        let mut b_u = to_array1(&self.unembed.b)?;
        if let (Some(ln), true) = (&self.ln_final, fold_norm) {
            fold_final_norm(
                &mut w_u,
                &mut b_u,
                &ln.w.to_vec1::<f32>()?,
                Some(&ln.b.to_vec1::<f32>()?),
            );
        }
        debug_assert_eq!(w_u.len_of(Axis(1)), c.vocab_size);
        col.finish(
            to_array2(&self.w_e)?,
            Some(to_array2(&self.w_pos)?),
            w_u,
            b_u,
        )
    }
}
