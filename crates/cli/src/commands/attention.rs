//! `hyperlens attention`: the attention patterns of a token language model on one token sequence,
//! written as `pattern` [layer, head, query, key] (float32) to a `.npz` file.
//!
//! `--text` instead of `--tokens` tokenizes with the model's own tokenizer
//! (`hyperlens_model::lm::LmTokenizer`). The checkpoint kind is detected: a hyperlens token-model directory, a Hugging Face Llama or
//! GPT-2 directory, or a llama.cpp `.gguf` file (`hyperlens_model::lm::detect`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use hyperlens_io::keys::attention as keys;
use hyperlens_io::sidecars::{AttentionArrays, AttentionSidecar};
use hyperlens_model::lm;
use hyperlens_model::Device;
use ndarray::{Array1, Array4};

/// Arguments of `hyperlens attention`.
#[derive(Debug, Args)]
pub struct AttentionArgs {
    /// The checkpoint: a token-model, Hugging Face Llama or GPT-2 directory, or a .gguf file.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Token ids, comma-separated (e.g. `1,2,3`).
    #[arg(long, required_unless_present = "text", conflicts_with = "text")]
    pub tokens: Option<String>,
    /// Text instead of token ids, tokenized by the model's own tokenizer (its tokenizer.json, or a
    /// .gguf file's tokenizer.ggml.* metadata) with Hugging Face's default for the BOS token; the
    /// ids are recorded as `--tokens` would be.
    #[arg(long)]
    pub text: Option<String>,
    /// Output `.npz` file: `pattern` [layer, head, query, key] float32 and `tokens` of shape (T) int64; a
    /// JSON sidecar beside it (`attention.npz` -> `attention.json`) says what produced it.
    #[arg(long)]
    pub out: PathBuf,
    /// Compute device: cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
}

/// Parses `--tokens`: comma-separated non-negative integers that fit in u32.
///
/// # Errors
/// An empty list or an entry that is not such an integer (named in the message).
pub fn parse_tokens(s: &str) -> anyhow::Result<Vec<u32>> {
    let mut out = Vec::new();
    for (i, part) in s.split(',').enumerate() {
        let p = part.trim();
        let v: u32 = p.parse().with_context(|| {
            format!("--tokens: entry {i} `{p}` is not a token id (a non-negative integer)")
        })?;
        out.push(v);
    }
    if out.is_empty() {
        bail!("--tokens: no token ids given");
    }
    Ok(out)
}

/// The token ids of `--tokens` or `--text` (one of them; clap makes them exclusive): `--text`
/// tokenized by the checkpoint's tokenizer (`hyperlens_model::lm::LmTokenizer::encode`, Hugging
/// Face's default for the BOS).
///
/// # Errors
/// Bad `--tokens` ([`parse_tokens`]); for `--text`, a model without a tokenizer (one line), an
/// unreadable tokenizer, or a text that gives no token.
pub fn input_ids(
    checkpoint: &Path,
    tokens: Option<&str>,
    text: Option<&str>,
) -> anyhow::Result<Vec<u32>> {
    match (tokens, text) {
        (Some(t), _) => parse_tokens(t),
        (None, Some(text)) => {
            let ids = lm::require_tokenizer(checkpoint)
                .and_then(|tok| tok.encode(text, None))
                .context("--text")?;
            if ids.is_empty() {
                bail!("--text: the text gives no tokens");
            }
            Ok(ids)
        }
        (None, None) => bail!("give --tokens or --text"),
    }
}

fn write_npz(path: &Path, pattern: &Array4<f32>, tokens: &[u32]) -> anyhow::Result<()> {
    let toks: Array1<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    hyperlens_io::write_npz(path, |npz| -> anyhow::Result<()> {
        npz.add(keys::PATTERN, pattern)?;
        npz.add(keys::TOKENS, &toks)?;
        Ok(())
    })
}

/// Runs `hyperlens attention`.
///
/// # Errors
/// An unknown or invalid checkpoint (named with the file and tensor), bad `--tokens` (ids out of
/// the vocabulary, too long), an unavailable device, a failed write.
pub fn run(args: AttentionArgs) -> anyhow::Result<()> {
    let kind = lm::detect(&args.checkpoint)?;
    let tokens = input_ids(
        &args.checkpoint,
        args.tokens.as_deref(),
        args.text.as_deref(),
    )?;
    let device = args.device.to_candle()?;
    let t0 = std::time::Instant::now();
    let model = lm::load(&args.checkpoint, &device)?;
    let load_s = t0.elapsed().as_secs_f64();
    let t1 = std::time::Instant::now();
    let flag = if args.text.is_some() {
        "--text"
    } else {
        "--tokens"
    };
    let pattern = model.attention_patterns(&tokens).context(flag)?;
    let fwd_s = t1.elapsed().as_secs_f64();
    super::common::create_parent("--out", &args.out)?;
    write_npz(&args.out, &pattern, &tokens)?;
    let meta = AttentionSidecar {
        arrays: AttentionArrays {
            pattern: "[layer, head, query, key] float32, softmax (or mixer) attention, causal"
                .into(),
            tokens: "[T] int64".into(),
        },
        checkpoint: args.checkpoint.display().to_string(),
        checkpoint_kind: kind.to_string(),
        device: args.device.to_string(),
        producer: format!("hyperlens {} attention", env!("CARGO_PKG_VERSION")),
        shape: pattern.shape().to_vec(),
        tokens: tokens.clone(),
    };
    hyperlens_io::write_sidecar(&args.out, &meta)?;
    let s = pattern.shape();
    outln!(
        "{} ({kind}): {} layers x {} heads x {} x {} -> {} (load {load_s:.2} s, forward {fwd_s:.2} s)",
        args.checkpoint.display(),
        s[0],
        s[1],
        s[2],
        s[3],
        args.out.display()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_tokens_accepts_lists_and_names_bad_entries() {
        assert_eq!(parse_tokens("1, 2,30").unwrap(), vec![1, 2, 30]);
        let e = parse_tokens("1,x,3").unwrap_err().to_string();
        assert!(e.contains("entry 1") && e.contains("`x`"), "{e}");
        assert!(parse_tokens("").is_err());
        assert!(parse_tokens("-1").is_err());
        assert!(parse_tokens("4294967296").is_err());
    }
}
