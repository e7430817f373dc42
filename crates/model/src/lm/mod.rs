//! Token-sequence language models: causal transformers that read token ids and return next-token
//! logits and, on request, their attention patterns, for the circuits analyses of
//! `docs/spec/circuits.md` (Elhage et al. 2021).
//!
//! - [`Llama`]: Llama-family models (RMSNorm, rotary positions, SwiGLU, grouped-query attention)
//!   from a llama.cpp GGUF file ([`Llama::from_gguf`]) or a Hugging Face directory
//!   ([`Llama::from_hf_dir`]).
//! - [`Gpt2`]: GPT-2 from a Hugging Face directory ([`Gpt2::from_hf_dir`]).
//! - [`TokenModel`]: our own trainable token transformers (learned positions, any of the eight
//!   mixers, causal), with the attention-only 0/1/2-layer presets of the circuits paper
//!   ([`TokenConfig::attn_only`]) and checked checkpoints ([`ckpt`]).
//! - [`LanguageModel`] / [`load`]: any of them, the kind detected from the path ([`detect`]).
//! - [`LmTokenizer`] / [`load_tokenizer`]: their text in and out (a `tokenizer.json` or a GGUF
//!   file's `tokenizer.ggml.*` metadata).
//! - [`LanguageModel::latent_codes`]: the lens, the codes of chosen (query, key) pairs of a batch
//!   in three forms ([`CodeForm`]), computing only what they need (`lens`); with
//!   [`LanguageModel::with_shuffled_weights`], its control.
//!
//! Every model exports its per-head weights in TransformerLens layout as `ndarray` arrays
//! ([`HeadWeights`]).

pub mod ckpt;
mod gguf;
mod gpt2;
mod hf;
mod layers;
mod lens;
mod llama;
mod projection;
mod store;
mod token;
mod tokenizer;
mod weights;

use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use ndarray::Array4;

pub use gguf::{permute_qk_rows, unpermute_qk_rows};
pub use gpt2::{Gpt2, Gpt2Activation, Gpt2Config};
pub use lens::{CodeBatch, CodeForm, CodeRequest, CodeSites};
pub use llama::{Llama, LlamaConfig};
pub use token::{TokenConfig, TokenModel, TOKEN_LN_EPS, TOKEN_MODEL_TYPE};
pub use tokenizer::{
    load_tokenizer, missing_tokenizer, no_tokenizer_error, require_tokenizer, LmTokenizer,
};
pub use weights::HeadWeights;

use crate::error::{ModelError, Result};

/// What a language model's forward pass returns.
#[derive(Debug, Clone)]
pub struct LmOutput {
    /// Next-token logits, [B, T, V].
    pub logits: Tensor,
    /// When requested, one attention pattern per layer, [B, H, T, T] ([batch, head, query, key]),
    /// as `blocks.{l}.attn.hook_pattern` in TransformerLens.
    pub patterns: Option<Vec<Tensor>>,
}

/// Causal attention scores `q·k * scale` with `-inf` above the diagonal (TransformerLens's
/// `hook_attn_scores`, after its causal mask).
///
/// # Shapes
/// `q [B, H, T, d]`, `k [B, H, T, d]`, `mask [T, T]` u8 (1 = allowed) -> `[B, H, T, T]`.
///
/// # Errors
/// Candle errors on a shape mismatch.
pub(crate) fn masked_scores(q: &Tensor, k: &Tensor, scale: f64, mask: &Tensor) -> Result<Tensor> {
    let scores = (q.matmul(&k.t()?)? * scale)?;
    let ninf = Tensor::new(f32::NEG_INFINITY, scores.device())?.broadcast_as(scores.shape())?;
    Ok(mask
        .broadcast_as(scores.shape())?
        .where_cond(&scores, &ninf)?)
}

/// The kinds of checkpoint [`load`] understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointKind {
    /// A hyperlens token-model directory (`config.json` with `model_type` `hyperlens-token`).
    TokenModel,
    /// A llama.cpp GGUF file (architecture `llama`).
    Gguf,
    /// A Hugging Face Llama directory (`config.json` + safetensors).
    HfLlama,
    /// A Hugging Face GPT-2 directory (`config.json` + safetensors).
    HfGpt2,
}

impl std::fmt::Display for CheckpointKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::TokenModel => "token-model",
            Self::Gguf => "gguf",
            Self::HfLlama => "hf-llama",
            Self::HfGpt2 => "hf-gpt2",
        })
    }
}

/// Tells which kind of checkpoint `path` is: a file starting with the GGUF magic, or a directory
/// whose `config.json` names our token model (`model_type` `hyperlens-token`), a Llama
/// (`model_type` `llama`) or a GPT-2 (`gpt2`) model.
///
/// # Errors
/// [`ModelError::Checkpoint`] naming the path when it does not exist or is none of these kinds.
pub fn detect(path: &Path) -> Result<CheckpointKind> {
    let err = |msg: &str| ModelError::Checkpoint {
        path: path.to_path_buf(),
        msg: msg.to_string(),
    };
    if path.is_file() {
        let mut magic = [0u8; 4];
        let mut f = std::fs::File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let n = f.read(&mut magic).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if n == 4 && &magic == b"GGUF" {
            return Ok(CheckpointKind::Gguf);
        }
        return Err(err(
            "not a GGUF file (no GGUF magic); expected a .gguf file or a checkpoint directory",
        ));
    }
    if !path.is_dir() {
        return Err(err("no such file or directory"));
    }
    if !path.join("config.json").is_file() {
        return Err(err("directory has no config.json"));
    }
    let cfg = hf::HfConfig::read(path)?;
    let names = cfg.kind_names();
    if names.iter().any(|n| n == TOKEN_MODEL_TYPE) {
        Ok(CheckpointKind::TokenModel)
    } else if names
        .iter()
        .any(|n| n == "llama" || n == "llamaforcausallm")
    {
        Ok(CheckpointKind::HfLlama)
    } else if names
        .iter()
        .any(|n| n == "gpt2" || n.starts_with("gpt2lmhead") || n == "gpt2model")
    {
        Ok(CheckpointKind::HfGpt2)
    } else if names.is_empty() {
        Err(ModelError::Checkpoint {
            path: cfg.path.clone(),
            msg: format!(
                "no `model_type`: not a token language model (a SRAVEN / fuzzy-logic checkpoint?); \
                 supported: {TOKEN_MODEL_TYPE}, llama, gpt2 directories and .gguf files"
            ),
        })
    } else {
        Err(ModelError::Checkpoint {
            path: cfg.path.clone(),
            msg: format!(
                "unsupported model kind {names:?} (supported: {TOKEN_MODEL_TYPE}, llama, gpt2)"
            ),
        })
    }
}

/// Any language model [`load`] can return.
#[derive(Debug, Clone)]
pub enum LanguageModel {
    /// A hyperlens token model.
    Token(TokenModel),
    /// A Llama-family model (GGUF or Hugging Face).
    Llama(Llama),
    /// A GPT-2 model.
    Gpt2(Gpt2),
}

/// Loads a language model from a checkpoint path of any kind [`detect`] recognises.
///
/// # Errors
/// As [`detect`] and the loader of that kind; errors name the file and tensor.
pub fn load(path: &Path, device: &Device) -> Result<LanguageModel> {
    Ok(match detect(path)? {
        CheckpointKind::TokenModel => LanguageModel::Token(TokenModel::load(path, device)?),
        CheckpointKind::Gguf => LanguageModel::Llama(Llama::from_gguf(path, device)?),
        CheckpointKind::HfLlama => LanguageModel::Llama(Llama::from_hf_dir(path, device)?),
        CheckpointKind::HfGpt2 => LanguageModel::Gpt2(Gpt2::from_hf_dir(path, device)?),
    })
}

impl LanguageModel {
    /// Runs the model; see [`TokenModel::forward`], [`Llama::forward`] and [`Gpt2::forward`].
    ///
    /// # Shapes
    /// `tokens` [B, T] u32 -> logits [B, T, V], patterns per layer [B, H, T, T].
    ///
    /// # Errors
    /// [`ModelError::Input`] for bad token ids or lengths.
    pub fn forward(&self, tokens: &Tensor, capture: bool) -> Result<LmOutput> {
        match self {
            Self::Token(m) => m.forward(tokens, capture),
            Self::Llama(m) => m.forward(tokens, capture),
            Self::Gpt2(m) => m.forward(tokens, capture),
        }
    }

    /// Per-head weights in TransformerLens layout; see [`Llama::head_weights`] and
    /// [`Gpt2::head_weights`].
    ///
    /// # Errors
    /// [`ModelError::Candle`] when copying from the device fails.
    pub fn head_weights(&self, fold_norm: bool) -> Result<HeadWeights> {
        match self {
            Self::Token(m) => m.head_weights(fold_norm),
            Self::Llama(m) => m.head_weights(fold_norm),
            Self::Gpt2(m) => m.head_weights(fold_norm),
        }
    }

    /// The model's hook points in pass order (TransformerLens 3.x names; [`Gpt2::run_with_hooks`],
    /// [`Llama::run_with_hooks`], [`TokenModel::run_with_hooks`]).
    pub fn hook_names(&self) -> Vec<String> {
        match self {
            Self::Token(m) => m.hook_names(),
            Self::Llama(m) => m.hook_names(),
            Self::Gpt2(m) => m.hook_names(),
        }
    }

    /// The forward pass with a hook at every hook point; returns the logits.
    ///
    /// # Shapes
    /// `tokens` [B, T] u32 -> logits [B, T, V].
    ///
    /// # Errors
    /// As [`LanguageModel::forward`]; a hook's error; a replacement of another shape.
    pub fn run_with_hooks(
        &self,
        tokens: &Tensor,
        hooks: &mut dyn crate::hooks::HookFn,
    ) -> Result<Tensor> {
        match self {
            Self::Token(m) => m.run_with_hooks(tokens, hooks),
            Self::Llama(m) => m.run_with_hooks(tokens, hooks),
            Self::Gpt2(m) => m.run_with_hooks(tokens, hooks),
        }
    }

    /// The hook points matching any of `patterns` (`*` one name part, `**` anything), in pass
    /// order.
    ///
    /// # Errors
    /// [`ModelError::Input`] naming a pattern that matches no hook point.
    pub fn select_hooks(&self, patterns: &[String]) -> Result<Vec<String>> {
        crate::hooks::select_from(self.hook_names(), patterns)
    }

    /// [`LanguageModel::run_with_hooks`] with a cache of the hook points matching `patterns`: the
    /// logits and the activations by name, in pass order (TransformerLens `run_with_cache`).
    ///
    /// # Shapes
    /// `tokens` [B, T] u32 -> logits [B, T, V]; activations batch axis first.
    ///
    /// # Errors
    /// As [`LanguageModel::select_hooks`] and [`LanguageModel::run_with_hooks`].
    pub fn run_with_cache(
        &self,
        tokens: &Tensor,
        patterns: &[String],
    ) -> Result<(Tensor, Vec<(String, Tensor)>)> {
        let mut cache = crate::hooks::Cache::new(self.select_hooks(patterns)?);
        let logits = self.run_with_hooks(tokens, &mut cache)?;
        Ok((logits, cache.values))
    }

    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        match self {
            Self::Token(m) => m.config().n_layers,
            Self::Llama(m) => m.config().n_layers,
            Self::Gpt2(m) => m.config().n_layers,
        }
    }

    /// Number of (query) heads per layer.
    pub fn n_heads(&self) -> usize {
        match self {
            Self::Token(m) => m.config().n_heads,
            Self::Llama(m) => m.config().n_heads,
            Self::Gpt2(m) => m.config().n_heads,
        }
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Token(m) => m.config().vocab_size,
            Self::Llama(m) => m.config().vocab_size,
            Self::Gpt2(m) => m.config().vocab_size,
        }
    }

    /// Longest sequence the model accepts.
    pub fn max_seq_len(&self) -> usize {
        match self {
            Self::Token(m) => m.config().n_ctx,
            Self::Llama(m) => m.config().max_seq_len,
            Self::Gpt2(m) => m.config().n_ctx,
        }
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        match self {
            Self::Token(m) => m.device(),
            Self::Llama(m) => m.device(),
            Self::Gpt2(m) => m.device(),
        }
    }

    /// The file or directory a Llama / GPT-2 model was loaded from (`None` for a token model,
    /// which does not record it).
    pub fn source(&self) -> Option<PathBuf> {
        match self {
            Self::Token(_) => None,
            Self::Llama(m) => Some(m.source().to_path_buf()),
            Self::Gpt2(m) => Some(m.source().to_path_buf()),
        }
    }

    /// Attention patterns of every layer and head for one token sequence.
    ///
    /// # Shapes
    /// `tokens` `[T]` -> `[L, H, T, T]` float32 ([layer, head, query, key]).
    ///
    /// # Errors
    /// [`ModelError::Input`] for bad token ids or lengths, or a length whose patterns exceed the
    /// memory budget (`hyperlens_io::budget`; the patterns are held twice: per layer on the device
    /// and stacked on the host, plus the scores of one layer).
    pub fn attention_patterns(&self, tokens: &[u32]) -> Result<Array4<f32>> {
        let t = tokens.len();
        let per_layer = hyperlens_io::budget::bytes_of(4, &[self.n_heads(), t, t]);
        let layers = self.n_layers() as u128;
        hyperlens_io::budget::check_alloc(
            format!(
                "attention patterns of {t} tokens ({} layers x {} heads x {t} x {t} float32)",
                self.n_layers(),
                self.n_heads()
            ),
            per_layer.saturating_mul(layers.saturating_mul(2).saturating_add(2)),
        )
        .map_err(|e| ModelError::Input(e.to_string()))?;
        let x = Tensor::from_slice(tokens, (1, t), self.device())?;
        let out = self.forward(&x, true)?;
        let pats = out.patterns.unwrap_or_default();
        stack_patterns(&pats, self.n_heads(), t)
    }
}

/// Stacks per-layer patterns of batch item 0 into one host array.
///
/// # Shapes
/// `pats` L x [B, H, T, T] -> [L, H, T, T].
pub(crate) fn stack_patterns(pats: &[Tensor], n_heads: usize, t: usize) -> Result<Array4<f32>> {
    let mut data = Vec::with_capacity(pats.len() * n_heads * t * t);
    for p in pats {
        data.extend(
            p.get(0)?
                .to_device(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        );
    }
    Array4::from_shape_vec((pats.len(), n_heads, t, t), data)
        .map_err(|e| ModelError::Input(format!("attention patterns: {e}")))
}

/// Checks a token batch: rank 2, u32, non-empty, at most `max_len` long, ids below `vocab`.
///
/// # Shapes
/// `tokens` [B, T] -> (B, T).
pub(crate) fn check_tokens(
    tokens: &Tensor,
    vocab: usize,
    max_len: usize,
) -> Result<(usize, usize)> {
    if tokens.dtype() != DType::U32 {
        return Err(ModelError::Input(format!(
            "tokens must be u32, got {:?}",
            tokens.dtype()
        )));
    }
    let (b, t) = tokens.dims2().map_err(|_| {
        ModelError::Input(format!(
            "tokens must be [batch, time], got shape {:?}",
            tokens.dims()
        ))
    })?;
    if b == 0 || t == 0 {
        return Err(ModelError::Input("empty token batch".into()));
    }
    if t > max_len {
        return Err(ModelError::Input(format!(
            "sequence of {t} tokens is longer than the model's {max_len}"
        )));
    }
    let max = tokens.flatten_all()?.max(0)?.to_scalar::<u32>()?;
    if max as usize >= vocab {
        return Err(ModelError::Input(format!(
            "token id {max} is out of range for a vocabulary of {vocab}"
        )));
    }
    Ok((b, t))
}

/// `x W` for a matrix `W` [in, out] applied to the last axis of `x` [..., in].
pub(crate) fn matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let (n_in, n_out) = w.dims2()?;
    let rows = x.elem_count() / n_in.max(1);
    let y = x.reshape((rows, n_in))?.matmul(w)?;
    let mut out = dims;
    if let Some(last) = out.last_mut() {
        *last = n_out;
    }
    Ok(y.reshape(out)?)
}

/// `x W^T` for a PyTorch-layout matrix `W` [out, in] applied to the last axis of `x` [..., in].
pub(crate) fn matmul_t(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    matmul(x, &w.t()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_tokens_rejects_bad_batches() {
        let dev = Device::Cpu;
        let ok = Tensor::new(&[[1u32, 4, 2]], &dev).unwrap();
        assert_eq!(check_tokens(&ok, 5, 3).unwrap(), (1, 3));
        assert!(check_tokens(&ok, 4, 3)
            .unwrap_err()
            .to_string()
            .contains("token id 4"));
        assert!(check_tokens(&ok, 5, 2).is_err());
        assert!(check_tokens(&ok.to_dtype(DType::I64).unwrap(), 5, 3).is_err());
        assert!(check_tokens(&Tensor::new(&[1u32, 2], &dev).unwrap(), 5, 3).is_err());
    }
}
