//! A Llama-family decoder (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention) loaded
//! offline from a GGUF file or a Hugging Face safetensors directory, for reading attention patterns
//! and per-head weights of real language models.
//!
//! Source: Hugging Face `transformers` `modeling_llama.py` and candle-transformers `models/llama.rs`
//! (same computation); llama.cpp for the GGUF names and layout.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use ndarray::Array1;

use super::gguf::{read_gguf, unpermute_qk_rows};
use super::hf::{read_weights, HfConfig};
use super::layers::{
    causal_softmax, gate_up, linear, mix_values, no_logits, norm, norm_ahead, project_residual,
    qkv_rotary, readout_input, residual_after, rotary_after, swiglu_after, Norm,
};
use super::projection::Projection;
use super::store::TensorStore;
use super::weights::{
    fold_final_norm, to_array1, to_array2, HeadCollector, HeadWeights, TorchAttn,
};
use super::{check_tokens, LmOutput};
use crate::error::{ModelError, Result};
use crate::hooks::{lm_hook_names, BlockHooks, HookFn};
use crate::nn::position::causal_mask;
use crate::nn::{HookPoints, NoHooks};

/// Hyper-parameters of a [`Llama`] model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size `V`.
    pub vocab_size: usize,
    /// Residual width `D`.
    pub d_model: usize,
    /// Number of decoder layers `L`.
    pub n_layers: usize,
    /// Number of query heads `H`.
    pub n_heads: usize,
    /// Number of key/value heads `H_kv` (divides `H`; `H_kv < H` is grouped-query attention).
    pub n_kv_heads: usize,
    /// Head width `d` (even).
    pub d_head: usize,
    /// Hidden width of the SwiGLU MLP.
    pub d_mlp: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// Rotary base `theta` (frequencies `theta^(-2i/d)`).
    pub rope_theta: f64,
    /// Longest supported sequence.
    pub max_seq_len: usize,
    /// Whether the unembedding is the transposed token embedding.
    pub tied_embeddings: bool,
}

impl LlamaConfig {
    /// Checks that the sizes are positive and consistent.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the offending field.
    pub fn check(&self) -> Result<()> {
        let pos = [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("d_head", self.d_head),
            ("d_mlp", self.d_mlp),
            ("max_seq_len", self.max_seq_len),
        ];
        for (name, v) in pos {
            if v == 0 {
                return Err(ModelError::Config(format!(
                    "llama: {name} must be positive"
                )));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(ModelError::Config(format!(
                "llama: n_kv_heads {} does not divide n_heads {}",
                self.n_kv_heads, self.n_heads
            )));
        }
        if !self.d_head.is_multiple_of(2) {
            return Err(ModelError::Config(format!(
                "llama: d_head {} must be even for rotary positions",
                self.d_head
            )));
        }
        let positive = |x: f64| x > 0.0 && x.is_finite();
        if !positive(self.rms_eps) || !positive(self.rope_theta) {
            return Err(ModelError::Config(
                "llama: rms_eps and rope_theta must be positive and finite".into(),
            ));
        }
        Ok(())
    }
}

/// One decoder layer; matrices in PyTorch layout [out, in] (`y = x W^T`), those that read the
/// same input in one [`Projection`] (Q, K and V; the gate and the up projection).
#[derive(Debug, Clone)]
struct LlamaLayer {
    attn_norm: Tensor,
    /// `W_Q [H d, D]`, `W_K`, `W_V` `[H_kv d, D]`.
    qkv: Projection,
    /// `W_O [D, H d]`.
    o: Projection,
    mlp_norm: Tensor,
    /// `W_gate`, `W_up` `[d_mlp, D]`.
    gate_up: Projection,
    /// `W_down [D, d_mlp]`.
    down: Projection,
}

/// A Llama-family language model on candle (float32, inference only).
///
/// ```text
/// h = W_E[tokens]
/// per layer: x = RMSNorm(h); q, k = RoPE(x W_Q^T), RoPE(x W_K^T); v = x W_V^T
///            a = softmax(q k^T / sqrt(d) + causal mask)      (K/V heads shared by H / H_kv query heads)
///            h = h + (a v) W_O^T;  x = RMSNorm(h);  h = h + (silu(x W_gate^T) * (x W_up^T)) W_down^T
/// logits = RMSNorm(h) W_U^T
/// ```
/// Rotary positions rotate the two halves of each head (Hugging Face `rotate_half`) by angles
/// `p * theta^(-2i/d)`, `i < d/2`.
#[derive(Debug, Clone)]
pub struct Llama {
    config: LlamaConfig,
    embed: Tensor,
    layers: Vec<LlamaLayer>,
    norm: Tensor,
    lm_head: Tensor,
    device: Device,
    source: PathBuf,
}

impl Llama {
    /// Loads a llama.cpp GGUF file (architecture `llama`), dequantising every tensor to float32 and
    /// undoing llama.cpp's permutation of the Q/K rows ([`super::gguf::unpermute_qk_rows`]).
    ///
    /// Reads `llama.block_count`, `.embedding_length`, `.feed_forward_length`,
    /// `.attention.head_count`, `.attention.head_count_kv`, `.attention.key_length`,
    /// `.attention.layer_norm_rms_epsilon`, `.rope.freq_base`, `.rope.dimension_count`,
    /// `.context_length`, and the tensors `token_embd.weight`, `blk.{l}.{attn_norm, attn_q, attn_k,
    /// attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}.weight`, `output_norm.weight` and
    /// `output.weight` (absent: tied to the embedding).
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] for an unreadable file, missing metadata or an unsupported
    /// architecture (another `general.architecture`, partial rotary, rotary scaling, extra tensors
    /// such as biases); [`ModelError::Tensor`] naming the file and tensor for a missing or misshapen
    /// tensor.
    pub fn from_gguf(path: &Path, device: &Device) -> Result<Self> {
        let (meta, mut store) = read_gguf(path)?;
        let unsupported = |msg: String| ModelError::Checkpoint {
            path: path.to_path_buf(),
            msg: format!("unsupported: {msg}"),
        };
        let arch = meta.str_opt("general.architecture")?.unwrap_or("");
        if arch != "llama" {
            return Err(unsupported(format!(
                "general.architecture `{arch}` (supported: llama)"
            )));
        }
        let key = |k: &str| format!("llama.{k}");
        let n_heads = meta.usize(&key("attention.head_count"))?;
        let d_model = meta.usize(&key("embedding_length"))?;
        let d_head = meta
            .usize_opt(&key("attention.key_length"))?
            .unwrap_or(d_model.checked_div(n_heads).unwrap_or(0));
        if let Some(dv) = meta.usize_opt(&key("attention.value_length"))? {
            if dv != d_head {
                return Err(unsupported(format!(
                    "value head width {dv} != key head width {d_head}"
                )));
            }
        }
        if let Some(rd) = meta.usize_opt(&key("rope.dimension_count"))? {
            if rd != d_head {
                return Err(unsupported(format!(
                    "partial rotary embedding ({rd} of {d_head} dimensions)"
                )));
            }
        }
        if let Some(s) = meta.str_opt(&key("rope.scaling.type"))? {
            if s != "none" {
                return Err(unsupported(format!("rotary scaling `{s}`")));
            }
        }
        if store.contains("rope_freqs.weight") {
            return Err(unsupported(
                "rotary frequency factors (rope_freqs.weight)".into(),
            ));
        }
        let vocab_size = store
            .dims("token_embd.weight")?
            .first()
            .copied()
            .unwrap_or(0);
        let config = LlamaConfig {
            vocab_size,
            d_model,
            n_layers: meta.usize(&key("block_count"))?,
            n_heads,
            n_kv_heads: meta
                .usize_opt(&key("attention.head_count_kv"))?
                .unwrap_or(n_heads),
            d_head,
            d_mlp: meta.usize(&key("feed_forward_length"))?,
            rms_eps: meta
                .f64_opt(&key("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5),
            rope_theta: meta.f64_opt(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            max_seq_len: meta.usize_opt(&key("context_length"))?.unwrap_or(2048),
            tied_embeddings: !store.contains("output.weight"),
        };
        config.check().map_err(|e| ModelError::Checkpoint {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        let names = Names {
            embed: "token_embd.weight".into(),
            norm: "output_norm.weight".into(),
            lm_head: "output.weight".into(),
            layer: Box::new(|l, w| {
                let n = match w {
                    W::AttnNorm => "attn_norm",
                    W::Q => "attn_q",
                    W::K => "attn_k",
                    W::V => "attn_v",
                    W::O => "attn_output",
                    W::MlpNorm => "ffn_norm",
                    W::Gate => "ffn_gate",
                    W::Up => "ffn_up",
                    W::Down => "ffn_down",
                };
                format!("blk.{l}.{n}.weight")
            }),
        };
        Self::build(config, &mut store, &names, true, device, path, &|_| false)
    }

    /// Loads a Hugging Face Llama directory: `config.json` (`model_type` `llama` or architecture
    /// `LlamaForCausalLM`) and `model.safetensors` (or shards with `model.safetensors.index.json`),
    /// tensors `model.embed_tokens.weight`, `model.layers.{l}.input_layernorm.weight`,
    /// `.self_attn.{q,k,v,o}_proj.weight`, `.post_attention_layernorm.weight`,
    /// `.mlp.{gate,up,down}_proj.weight`, `model.norm.weight`, `lm_head.weight` (unless
    /// `tie_word_embeddings`). Any float dtype is converted to float32.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] / [`ModelError::Json`] naming `config.json` for a missing key or an
    /// unsupported feature (rotary scaling, attention or MLP biases, an activation other than silu);
    /// [`ModelError::Tensor`] naming the file and tensor for a missing or misshapen tensor.
    pub fn from_hf_dir(dir: &Path, device: &Device) -> Result<Self> {
        let cfg = HfConfig::read(dir)?;
        if !cfg
            .kind_names()
            .iter()
            .any(|n| n == "llama" || n == "llamaforcausallm")
        {
            return Err(cfg.unsupported("model_type / architectures is not llama"));
        }
        if cfg.json.get("rope_scaling").is_some_and(|v| !v.is_null()) {
            return Err(cfg.unsupported("rope_scaling"));
        }
        // transformers 5 writes `rope_parameters: {rope_theta, rope_type}` instead of `rope_theta`.
        let rope_parameters = cfg.json.get("rope_parameters").filter(|v| !v.is_null());
        let mut rope_theta = cfg.f64_opt("rope_theta")?;
        if let Some(p) = rope_parameters {
            match p.get("rope_type").and_then(|t| t.as_str()) {
                None | Some("default") => {}
                Some(other) => {
                    return Err(cfg.unsupported(&format!("rope_parameters.rope_type `{other}`")))
                }
            }
            if rope_theta.is_none() {
                rope_theta = match p.get("rope_theta") {
                    None => None,
                    Some(v) => Some(v.as_f64().ok_or_else(|| ModelError::Checkpoint {
                        path: cfg.path.clone(),
                        msg: "key `rope_parameters.rope_theta`: expected a number".into(),
                    })?),
                };
            }
        }
        if cfg.bool_opt("attention_bias")?.unwrap_or(false)
            || cfg.bool_opt("mlp_bias")?.unwrap_or(false)
        {
            return Err(cfg.unsupported("attention_bias / mlp_bias"));
        }
        if let Some(act) = cfg.str_opt("hidden_act")? {
            if act != "silu" {
                return Err(cfg.unsupported(&format!("hidden_act `{act}` (supported: silu)")));
            }
        }
        let d_model = cfg.usize("hidden_size")?;
        let n_heads = cfg.usize("num_attention_heads")?;
        let config = LlamaConfig {
            vocab_size: cfg.usize("vocab_size")?,
            d_model,
            n_layers: cfg.usize("num_hidden_layers")?,
            n_heads,
            n_kv_heads: cfg.usize_opt("num_key_value_heads")?.unwrap_or(n_heads),
            d_head: cfg
                .usize_opt("head_dim")?
                .unwrap_or(d_model.checked_div(n_heads).unwrap_or(0)),
            d_mlp: cfg.usize("intermediate_size")?,
            rms_eps: cfg.f64_opt("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(10_000.0),
            max_seq_len: cfg.usize_opt("max_position_embeddings")?.unwrap_or(2048),
            tied_embeddings: cfg.bool_opt("tie_word_embeddings")?.unwrap_or(false),
        };
        config.check().map_err(|e| ModelError::Checkpoint {
            path: cfg.path.clone(),
            msg: e.to_string(),
        })?;
        let mut store = read_weights(dir)?;
        if config.tied_embeddings {
            // A tied checkpoint may still carry a copy of the embedding as `lm_head.weight`.
            let _ = store.take_opt(
                "lm_head.weight",
                &[config.vocab_size, config.d_model],
                &Device::Cpu,
            )?;
        }
        let names = Names {
            embed: "model.embed_tokens.weight".into(),
            norm: "model.norm.weight".into(),
            lm_head: "lm_head.weight".into(),
            layer: Box::new(|l, w| {
                let n = match w {
                    W::AttnNorm => "input_layernorm",
                    W::Q => "self_attn.q_proj",
                    W::K => "self_attn.k_proj",
                    W::V => "self_attn.v_proj",
                    W::O => "self_attn.o_proj",
                    W::MlpNorm => "post_attention_layernorm",
                    W::Gate => "mlp.gate_proj",
                    W::Up => "mlp.up_proj",
                    W::Down => "mlp.down_proj",
                };
                format!("model.layers.{l}.{n}.weight")
            }),
        };
        Self::build(
            config,
            &mut store,
            &names,
            false,
            device,
            dir,
            &|n: &str| n.ends_with("rotary_emb.inv_freq"),
        )
    }

    fn build(
        config: LlamaConfig,
        store: &mut TensorStore,
        names: &Names,
        gguf_layout: bool,
        device: &Device,
        source: &Path,
        ignorable: &dyn Fn(&str) -> bool,
    ) -> Result<Self> {
        let c = &config;
        let (dm, qd, kvd) = (c.d_model, c.n_heads * c.d_head, c.n_kv_heads * c.d_head);
        let embed = store.take(&names.embed, &[c.vocab_size, dm], device)?;
        let mut layers = Vec::new(); // n_layers comes from a file: never trusted for an allocation
        for l in 0..c.n_layers {
            let n = |w: W| (names.layer)(l, w);
            let mut w_q = store.take(&n(W::Q), &[qd, dm], device)?;
            let mut w_k = store.take(&n(W::K), &[kvd, dm], device)?;
            if gguf_layout {
                w_q = unpermute_qk_rows(&w_q, c.n_heads)?;
                w_k = unpermute_qk_rows(&w_k, c.n_kv_heads)?;
            }
            let w_v = store.take(&n(W::V), &[kvd, dm], device)?;
            layers.push(LlamaLayer {
                attn_norm: store.take(&n(W::AttnNorm), &[dm], device)?,
                qkv: Projection::new(vec![w_q, w_k, w_v])?,
                o: Projection::new(vec![store.take(&n(W::O), &[dm, qd], device)?])?,
                mlp_norm: store.take(&n(W::MlpNorm), &[dm], device)?,
                gate_up: Projection::new(vec![
                    store.take(&n(W::Gate), &[c.d_mlp, dm], device)?,
                    store.take(&n(W::Up), &[c.d_mlp, dm], device)?,
                ])?,
                down: Projection::new(vec![store.take(&n(W::Down), &[dm, c.d_mlp], device)?])?,
            });
        }
        let norm = store.take(&names.norm, &[dm], device)?;
        let lm_head = if c.tied_embeddings {
            embed.clone()
        } else {
            store.take(&names.lm_head, &[c.vocab_size, dm], device)?
        };
        let extra: Vec<String> = store
            .remaining()
            .into_iter()
            .filter(|n| !ignorable(n))
            .collect();
        if !extra.is_empty() {
            return Err(ModelError::Checkpoint {
                path: store.path().to_path_buf(),
                msg: format!(
                    "unsupported: unexpected tensors for a Llama model: {}",
                    extra.join(", ")
                ),
            });
        }
        Ok(Self {
            config,
            embed,
            layers,
            norm,
            lm_head,
            device: device.clone(),
            source: source.to_path_buf(),
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The file or directory the model was loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Cosine and sine tables of the rotary embedding, [T, d/2] each, computed in float64.
    fn rope_tables(&self, t: usize) -> Result<(Tensor, Tensor)> {
        let d = self.config.d_head;
        let mut cos = Vec::with_capacity(t * d / 2);
        let mut sin = Vec::with_capacity(t * d / 2);
        for p in 0..t {
            for i in 0..d / 2 {
                let ang = p as f64 * self.config.rope_theta.powf(-2.0 * i as f64 / d as f64);
                cos.push(ang.cos() as f32);
                sin.push(ang.sin() as f32);
            }
        }
        Ok((
            Tensor::from_vec(cos, (t, d / 2), &self.device)?,
            Tensor::from_vec(sin, (t, d / 2), &self.device)?,
        ))
    }

    /// Runs the model on a batch of token sequences.
    ///
    /// # Shapes
    /// `tokens` [B, T] u32 -> logits [B, T, V]; with `capture`, one softmax attention pattern per
    /// layer, [B, H, T, T] ([batch, head, query, key]; rows sum to 1, zero above the diagonal).
    ///
    /// # Errors
    /// [`ModelError::Input`] when `tokens` is not [B, T] u32, is empty, longer than `max_seq_len`, or
    /// holds an id >= V.
    pub fn forward(&self, tokens: &Tensor, capture: bool) -> Result<LmOutput> {
        self.pass(tokens, capture, &mut NoHooks)
    }

    /// The hook points of [`Llama::run_with_hooks`], in pass order: `hook_embed`, per block the
    /// points of the SRAVEN transformer's blocks (`crate::hooks`) with `attn.hook_rot_q`,
    /// `attn.hook_rot_k` and `mlp.hook_pre_linear`, then `ln_final.*`, `unembed.hook_in`,
    /// `unembed.hook_out`.
    pub fn hook_names(&self) -> Vec<String> {
        let kinds = BlockHooks {
            norm: true,
            rotary: true,
            value_hidden: false,
            mlp: true,
            gated: true,
        };
        lm_hook_names(self.config.n_layers, kinds, false, true)
    }

    /// The forward pass with TransformerLens 3.x's hook points (names, shapes and meanings of
    /// `HookedTransformer` on Llama without weight processing; checked against TransformerLens 3.9
    /// in `tests/lm.rs`): `hook_embed` `[B, T, D]`; per block `hook_resid_pre`, `ln1.hook_scale`
    /// `[B, T, 1]` (`sqrt(mean(x²) + eps)`), `ln1.hook_normalized` (`x / scale`, before the
    /// RMSNorm's gain), `attn.hook_q` `[B, T, H, d]` and `attn.hook_k`, `hook_v` `[B, T, H_kv, d]`
    /// (before the rotary embedding; key/value heads not repeated), `attn.hook_rot_q`,
    /// `attn.hook_rot_k` (after it, half-split convention), `attn.hook_attn_scores` `[B, H, Q, K]`
    /// (`-inf` above the diagonal), `attn.hook_pattern`, `attn.hook_z` `[B, T, H, d]` (query head
    /// `h` reads key/value head `h / (H / H_kv)`), `hook_attn_out`, `hook_resid_mid`, `ln2.*`,
    /// `mlp.hook_pre` (the gate's pre-activation), `mlp.hook_pre_linear` (the up projection),
    /// `mlp.hook_post` (`silu(pre) * pre_linear`), `hook_mlp_out`, `hook_resid_post`; then
    /// `ln_final.*`, `unembed.hook_in` and `unembed.hook_out` (the logits).
    ///
    /// # Shapes
    /// `tokens` [B, T] u32 -> logits [B, T, V].
    ///
    /// # Errors
    /// As [`Llama::forward`]; a hook's error; a replacement of another shape (naming the hook).
    pub fn run_with_hooks(&self, tokens: &Tensor, hooks: &mut dyn HookFn) -> Result<Tensor> {
        Ok(self.pass(tokens, false, hooks)?.logits)
    }

    /// The forward body with the hook-point reader `hooks` (`super::lens`); returns the logits.
    ///
    /// # Errors
    /// As [`Llama::forward`]; the reader's error.
    pub(crate) fn pass_with<P: HookPoints + ?Sized>(
        &self,
        tokens: &Tensor,
        hooks: &mut P,
    ) -> Result<Tensor> {
        Ok(self.pass(tokens, false, hooks)?.logits)
    }

    /// The same model with every weight tensor `w` replaced by `f(w)`, in a fixed order (the
    /// embedding, per layer its norms and matrices in declaration order, the final norm, the
    /// unembedding unless tied to the embedding, which then stays tied).
    ///
    /// # Errors
    /// `f`'s errors.
    pub(crate) fn map_weights(&self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<Self> {
        let embed = f(&self.embed)?;
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(LlamaLayer {
                attn_norm: f(&l.attn_norm)?,
                qkv: l.qkv.map(f)?,
                o: l.o.map(f)?,
                mlp_norm: f(&l.mlp_norm)?,
                gate_up: l.gate_up.map(f)?,
                down: l.down.map(f)?,
            });
        }
        let norm = f(&self.norm)?;
        let lm_head = if self.lm_head.id() == self.embed.id() {
            embed.clone()
        } else {
            f(&self.lm_head)?
        };
        Ok(Self {
            config: self.config.clone(),
            embed,
            layers,
            norm,
            lm_head,
            device: self.device.clone(),
            source: self.source.clone(),
        })
    }

    /// The model's one forward body, generic over its hook points: [`NoHooks`] for
    /// [`Llama::forward`], a [`HookFn`] for [`Llama::run_with_hooks`] (the RMSNorms and the
    /// attention's softmax then take the decomposed forms whose intermediate tensors the hooks
    /// see, `super::layers`).
    ///
    /// # Shapes
    /// `tokens` [B, T] u32. Returns [`LmOutput`] (the patterns after their hooks).
    ///
    /// # Errors
    /// As [`Llama::forward`]; a hook's error; a replacement of another shape.
    fn pass<P: HookPoints + ?Sized>(
        &self,
        tokens: &Tensor,
        capture: bool,
        hooks: &mut P,
    ) -> Result<LmOutput> {
        let c = &self.config;
        let (b, t) = check_tokens(tokens, c.vocab_size, c.max_seq_len)?;
        let tokens = tokens.to_device(&self.device)?;
        let (h_, hkv, d) = (c.n_heads, c.n_kv_heads, c.d_head);
        let eps = c.rms_eps;
        let (cos, sin) = self.rope_tables(t)?;
        let mask = causal_mask(t, &self.device)?;
        let scale = 1.0 / (d as f64).sqrt();
        let emb = self
            .embed
            .index_select(&tokens.flatten_all()?, 0)?
            .reshape((b, t, c.d_model))?;
        let mut h = hooks.at("hook_embed", emb)?;
        let mut patterns = Vec::new();
        let ran = hooks.blocks_to_run(c.n_layers).min(c.n_layers);
        // The next norm's output, computed with the residual addition before it (`residual`).
        let mut ahead = None;
        for (l, layer) in self.layers.iter().enumerate().take(ran) {
            h = hooks.at_block(l, "hook_resid_pre", h)?;
            let ln1 = Norm::Rms(&layer.attn_norm);
            let ln1_name = || format!("blocks.{l}.ln1");
            let x = norm_ahead(&h, ahead.take(), ln1, eps, ln1_name, hooks)?;
            // Views [B, H, T, d] of the projections, one product for the three (no copy: the
            // rotary embedding reads them through their strides, `super::layers::rotary`).
            // The rotary embeddings in the product's tasks, used if Q and K pass their hook
            // points unchanged (`super::layers::rotary_after`).
            let ([q, k, v], rot) = qkv_rotary(&layer.qkv, &x, (d, &cos, &sin), hooks)?;
            let (q_rot, k_rot) = rot.unzip();
            let heads = |y: Tensor, n: usize| -> Result<Tensor> {
                Ok(y.reshape((b, t, n, d))?.transpose(1, 2)?)
            };
            let (q, k) = (heads(q, h_)?, heads(k, hkv)?);
            let (q_of, k_of) = (q.id(), k.id());
            let q = hooks.at_block_heads(l, "attn.hook_q", q)?;
            let k = hooks.at_block_heads(l, "attn.hook_k", k)?;
            let v = hooks.at_block_heads(l, "attn.hook_v", heads(v, hkv)?)?;
            let q = rotary_after(&q, (q_of, q_rot), &cos, &sin, hooks)?;
            let q = hooks.at_block_heads(l, "attn.hook_rot_q", q)?;
            let k = rotary_after(&k, (k_of, k_rot), &cos, &sin, hooks)?;
            let k = hooks.at_block_heads(l, "attn.hook_rot_k", k)?;
            // Query head `h` reads key/value head `h / (H / H_kv)`: products per key/value head,
            // no repeated copies (`super::layers::grouped_product`).
            let a = causal_softmax(&q, &k, scale, &mask, l, hooks)?;
            if !hooks.needs_block_output(l) {
                // The reader has what it needs of the pass (its docs): no value mixing, MLP
                // or logits.
                break;
            }
            let z = hooks.at_block_heads(l, "attn.hook_z", mix_values(&a, &v)?)?;
            if capture {
                patterns.push(a);
            }
            let o = z.transpose(1, 2)?.reshape((b, t, h_ * d))?;
            // The output projection with the residual addition and the MLP's norm in its tasks,
            // used if nothing changes the product at its hook point (`residual_after`).
            let ln2_w = Some(&layer.mlp_norm);
            let (attn_out, fused) = project_residual(&layer.o, &o, &h, ln2_w, eps, hooks)?;
            let attn_out = hooks.at_block(l, "hook_attn_out", attn_out)?;
            let (mid, mid_x) = residual_after(&h, &attn_out, fused, ln2_w, eps, hooks)?;
            h = hooks.at_block(l, "hook_resid_mid", mid)?;
            let ln2 = Norm::Rms(&layer.mlp_norm);
            let x = norm_ahead(&h, mid_x, ln2, eps, || format!("blocks.{l}.ln2"), hooks)?;
            // The SwiGLU in the gate/up product's tasks, used if neither product changes at its
            // hook point (`swiglu_after`).
            let (pre, lin, fused) = gate_up(&layer.gate_up, &x, hooks)?;
            let pre = hooks.at_block(l, "mlp.hook_pre", pre)?;
            let lin = hooks.at_block(l, "mlp.hook_pre_linear", lin)?;
            let post = swiglu_after(&pre, &lin, fused, hooks)?;
            let post = hooks.at_block(l, "mlp.hook_post", post)?;
            let next = self.layers.get(l + 1).filter(|_| l + 1 < ran);
            let ln1_w = next.map(|n| &n.attn_norm);
            let (out, fused) = project_residual(&layer.down, &post, &h, ln1_w, eps, hooks)?;
            let out = hooks.at_block(l, "hook_mlp_out", out)?;
            let (post, next_x) = residual_after(&h, &out, fused, ln1_w, eps, hooks)?;
            ahead = next_x;
            h = hooks.at_block(l, "hook_resid_post", post)?;
        }
        let logits = match readout_input(h, ran, c.n_layers, hooks)? {
            None => no_logits(c.vocab_size, &self.device)?,
            Some(h) => {
                let h = norm(&h, Norm::Rms(&self.norm), eps, || "ln_final".into(), hooks)?;
                let h = hooks.at("unembed.hook_in", h)?;
                hooks.at("unembed.hook_out", linear(&h, &self.lm_head)?)?
            }
        };
        Ok(LmOutput {
            logits,
            patterns: capture.then_some(patterns),
        })
    }

    /// Exports per-head weights in TransformerLens layout ([`HeadWeights`]): `W_Q[l, h] = q_proj[h*d..(h+1)*d, :]^T`,
    /// `W_K[l, h]` / `W_V[l, h]` from key/value head `h / (H / H_kv)`, `W_O[l, h] = o_proj[:, h*d..(h+1)*d]^T`,
    /// `W_E` = the embedding, `W_U` = the unembedding transposed; biases are zero. Q/K rows are in the
    /// Hugging Face (half-split rotary) layout whatever the source file. With `fold_norm`, each
    /// layer's input RMSNorm gain is folded into `W_Q`, `W_K`, `W_V` and the final gain into `W_U`.
    ///
    /// # Shapes
    /// See [`HeadWeights`]; `w_pos` is `None` (rotary positions).
    ///
    /// # Errors
    /// [`ModelError::Candle`] when copying from the device fails.
    pub fn head_weights(&self, fold_norm: bool) -> Result<HeadWeights> {
        let c = &self.config;
        let mut col = HeadCollector::new(c.n_heads, c.d_head, c.d_model);
        for layer in &self.layers {
            let qkv = layer.qkv.weights()?;
            let w_o = layer.o.weights()?;
            let (Some(w_q), Some(w_k), Some(w_v), Some(w_o)) =
                (qkv.first(), qkv.get(1), qkv.get(2), w_o.first())
            else {
                return Err(ModelError::Input(
                    "llama: a layer without its Q/K/V/O".into(),
                ));
            };
            let (q, k, v, o) = (
                to_array2(w_q)?,
                to_array2(w_k)?,
                to_array2(w_v)?,
                to_array2(w_o)?,
            );
            let gain = layer.attn_norm.to_vec1::<f32>()?;
            col.push(
                &TorchAttn {
                    q: q.view(),
                    k: k.view(),
                    v: v.view(),
                    o: o.view(),
                    b_q: None,
                    b_k: None,
                    b_v: None,
                    b_o: None,
                    gain: fold_norm.then_some(gain.as_slice()),
                    beta: None,
                },
                c.n_kv_heads,
            );
        }
        let w_e = to_array2(&self.embed)?;
        let mut w_u = to_array2(&self.lm_head)?
            .reversed_axes()
            .as_standard_layout()
            .into_owned();
        let mut b_u = Array1::zeros(c.vocab_size);
        if fold_norm {
            fold_final_norm(&mut w_u, &mut b_u, &to_array1(&self.norm)?.to_vec(), None);
        }
        col.finish(w_e, None, w_u, b_u)
    }
}

/// Which weight of a layer (for the per-format naming closures).
#[derive(Debug, Clone, Copy)]
enum W {
    AttnNorm,
    Q,
    K,
    V,
    O,
    MlpNorm,
    Gate,
    Up,
    Down,
}

/// Tensor names of one checkpoint format.
struct Names {
    embed: String,
    norm: String,
    lm_head: String,
    layer: Box<dyn Fn(usize, W) -> String>,
}

#[cfg(test)]
#[path = "llama_tests.rs"]
mod tests;
