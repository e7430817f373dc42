//! Text in: the tokenizer of a language model, as the Hugging Face ecosystem defines it.
//!
//! [`LmTokenizer`] wraps a `tokenizers::Tokenizer` (Hugging Face's `tokenizers` crate) read from
//! one of two places:
//!
//! - a Hugging Face `tokenizer.json` ([`LmTokenizer::from_file`]), with the special tokens
//!   (`bos_token`, `eos_token`, `pad_token`) from the `tokenizer_config.json` /
//!   `special_tokens_map.json` beside it, as `transformers.AutoTokenizer` reads them;
//! - a llama.cpp GGUF file's own `tokenizer.ggml.*` metadata ([`LmTokenizer::from_gguf`]), built the
//!   way `transformers.integrations.gguf` (`convert_gguf_tokenizer`) builds it:
//!   - `tokenizer.ggml.model = gpt2`: byte-level BPE (GPT-2's `ByteLevel` pre-tokenizer and decoder,
//!     BPE from `tokens` and `merges`);
//!   - `tokenizer.ggml.model = llama`: SentencePiece BPE (`Metaspace` pre-tokenizer with the `▁`
//!     prefix on the first word, byte fallback, merges recovered from `tokens` and `scores` as
//!     transformers' `generate_merges` does);
//!   - the tokens marked control (`token_type` 3) and the BOS / EOS / UNK / PAD tokens are added as
//!     special tokens, the user-defined ones (`token_type` 4) as plain added tokens, so that they
//!     are matched whole when written in the text;
//!   - `tokenizer.ggml.add_bos_token` (default: true for `llama`, false for `gpt2`) and
//!     `add_eos_token` choose the post-processor, as transformers' `update_post_processor`.
//!
//!   Two choices differ from transformers' converter, both to follow the model's own Hugging Face
//!   tokenizer (and llama.cpp) where the converter ignores the file: `tokenizer.ggml.pre = smollm`
//!   splits every numeric character off first (Hugging Face `Digits(individual_digits=True)`, which
//!   SmolLM's `tokenizer.json` has; the converter applies GPT-2's split only, which gives other ids
//!   for characters such as `½`), and `tokenizer.ggml.add_space_prefix = false` turns the `▁`
//!   prefix off.
//!
//! Special tokens follow Hugging Face's default (`add_special_tokens=True`): whatever the tokenizer's
//! post-processor adds (BERT's `[CLS]` / `[SEP]`, Llama's `<s>`, nothing for GPT-2 or SmolLM2).
//! TransformerLens's `to_tokens` prepends a BOS by default instead; here that is
//! `prepend_bos = Some(true)`.

use std::ops::Range;
use std::path::Path;

use serde_json::Value as Json;
use tokenizers::{Encoding, Token, Tokenizer};

use super::gguf::GgufMeta;
use super::CheckpointKind;
use crate::error::{ModelError, Result};

mod from_gguf;
#[cfg(test)]
mod tests;

/// A language model's tokenizer: text to token ids and back, with its beginning-of-sequence token
/// and the Hugging Face default for adding it.
#[derive(Clone)]
pub struct LmTokenizer {
    tok: Tokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    default_bos: bool,
    source: String,
}

impl std::fmt::Debug for LmTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LmTokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("default_bos", &self.default_bos)
            .finish()
    }
}

/// The one-line error of a model without a tokenizer, asked for text.
///
/// `what` says what is missing, e.g. `no tokenizer.json in DIR`.
pub fn no_tokenizer_error(what: &str) -> ModelError {
    ModelError::Input(format!(
        "this model has no tokenizer ({what}): pass token ids"
    ))
}

/// The tokenizer of the checkpoint at `path`, for any kind [`super::detect`] knows: a Hugging
/// Face directory's or a token-model directory's `tokenizer.json`, a GGUF file's
/// `tokenizer.ggml.*` metadata; `None` when the model has none.
///
/// # Errors
/// As [`super::detect`]; [`ModelError::Checkpoint`] naming the file when the tokenizer is
/// present but unreadable or of a kind not supported.
pub fn load_tokenizer(path: &Path) -> Result<Option<LmTokenizer>> {
    match super::detect(path)? {
        CheckpointKind::Gguf => LmTokenizer::gguf_opt(path),
        CheckpointKind::HfGpt2 | CheckpointKind::HfLlama | CheckpointKind::TokenModel => {
            let file = path.join("tokenizer.json");
            if file.is_file() {
                LmTokenizer::from_file(&file).map(Some)
            } else {
                Ok(None)
            }
        }
    }
}

/// What [`load_tokenizer`] looked for at `path`, for [`no_tokenizer_error`]: `no tokenizer.json in
/// DIR` or `no tokenizer.ggml.* metadata in FILE`.
pub fn missing_tokenizer(path: &Path) -> String {
    if path.is_file() {
        format!("no tokenizer.ggml.* metadata in {}", path.display())
    } else {
        format!("no tokenizer.json in {}", path.display())
    }
}

/// [`load_tokenizer`], with a model that has none as the one-line error of
/// [`no_tokenizer_error`].
///
/// # Errors
/// As [`load_tokenizer`], and [`ModelError::Input`] when the model has no tokenizer.
pub fn require_tokenizer(path: &Path) -> Result<LmTokenizer> {
    load_tokenizer(path)?.ok_or_else(|| no_tokenizer_error(&missing_tokenizer(path)))
}

impl LmTokenizer {
    /// Reads a Hugging Face `tokenizer.json`; the BOS, EOS and PAD tokens come from the
    /// `tokenizer_config.json` (else `special_tokens_map.json`) in the same directory, as
    /// transformers reads them (none when neither names them). A truncation or padding stored in
    /// the file is switched off, as transformers does when called without them.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] naming the file when it, or a config beside it, is unreadable.
    pub fn from_file(path: &Path) -> Result<Self> {
        let mut tok = Tokenizer::from_file(path).map_err(|e| ModelError::Checkpoint {
            path: path.to_path_buf(),
            msg: format!("not a readable tokenizer.json: {e}"),
        })?;
        tok.with_padding(None);
        tok.with_truncation(None)
            .map_err(|e| ModelError::Checkpoint {
                path: path.to_path_buf(),
                msg: format!("tokenizer: {e}"),
            })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let names = SpecialNames::read(dir)?;
        let id = |name: &Option<String>| name.as_deref().and_then(|n| tok.token_to_id(n));
        let (bos, eos, pad) = (id(&names.bos), id(&names.eos), id(&names.pad));
        Self::new(tok, bos, eos, pad, path.display().to_string())
    }

    /// Builds the tokenizer a GGUF file's `tokenizer.ggml.*` metadata describes (see the module
    /// documentation).
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] naming the file when it is unreadable or its tokenizer metadata
    /// is malformed or of a kind not supported; [`ModelError::Input`] (the one line of
    /// [`no_tokenizer_error`]) when it has none.
    pub fn from_gguf(path: &Path) -> Result<Self> {
        Self::gguf_opt(path)?.ok_or_else(|| no_tokenizer_error(&missing_tokenizer(path)))
    }

    fn gguf_opt(path: &Path) -> Result<Option<Self>> {
        let meta = GgufMeta::read(path)?;
        if meta.str_opt("tokenizer.ggml.model")?.is_none() {
            return Ok(None);
        }
        from_gguf::gguf_tokenizer(&meta).map(Some)
    }

    /// Wraps a tokenizer, learning the Hugging Face default for the BOS from its post-processor.
    fn new(
        tok: Tokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
        pad: Option<u32>,
        source: String,
    ) -> Result<Self> {
        let mut me = Self {
            tok,
            bos,
            eos,
            pad,
            default_bos: false,
            source,
        };
        let (ids, start) = me.post_process(&[0])?;
        me.default_bos = start > 0 && bos.is_some() && ids.first().copied() == bos;
        Ok(me)
    }

    /// Where the tokenizer came from: the `tokenizer.json` path, or `FILE.gguf (tokenizer.ggml.*
    /// metadata)`.
    pub fn source(&self) -> String {
        self.source.clone()
    }

    /// The wrapped `tokenizers::Tokenizer`.
    pub fn inner(&self) -> &Tokenizer {
        &self.tok
    }

    /// The beginning-of-sequence token's id, if the tokenizer has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token's id, if the tokenizer has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether Hugging Face's default (`add_special_tokens=True`) puts a BOS first.
    pub fn adds_bos_by_default(&self) -> bool {
        self.default_bos
    }

    /// The id used to pad batches of unequal length: the pad token if the tokenizer has one, else
    /// the EOS token, else 0 (padded positions are masked or cut by their length, so the value only
    /// needs to be a valid id; TransformerLens pads with the pad token, set to EOS when missing).
    pub fn pad_id(&self) -> u32 {
        self.pad.or(self.eos).unwrap_or(0)
    }

    /// The number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tok.get_vocab_size(true)
    }

    /// Tokenizes one text.
    ///
    /// `prepend_bos`: `None` = Hugging Face's default (`add_special_tokens=True`: what the
    /// tokenizer's post-processor adds, e.g. BERT's `[CLS]` / `[SEP]`, Llama's `<s>`, nothing for
    /// GPT-2 or SmolLM2); `Some(true)` = that, with a BOS first if the default puts none there
    /// (TransformerLens's `prepend_bos=True`; a BOS written in the text does not count);
    /// `Some(false)` = that, without a BOS the default would put first.
    ///
    /// # Errors
    /// [`ModelError::Input`] when `Some(true)` is asked of a tokenizer without a BOS, or the
    /// tokenizer fails on the text.
    pub fn encode(&self, text: &str, prepend_bos: Option<bool>) -> Result<Vec<u32>> {
        Ok(self.encode_segments(&[text], prepend_bos)?.0)
    }

    /// Tokenizes a batch of texts, as TransformerLens's `to_tokens`: each text as
    /// [`LmTokenizer::encode`], right-padded with [`LmTokenizer::pad_id`] to the longest.
    ///
    /// # Shapes
    /// `texts` N -> ids u32 `[N, T]` (T the longest length) and the lengths `[N]`.
    ///
    /// # Errors
    /// [`ModelError::Input`] for an empty batch, and as [`LmTokenizer::encode`] (naming the text's
    /// index).
    pub fn encode_batch(
        &self,
        texts: &[&str],
        prepend_bos: Option<bool>,
    ) -> Result<(ndarray::Array2<u32>, Vec<usize>)> {
        if texts.is_empty() {
            return Err(ModelError::Input(
                "no text to tokenize (an empty list)".into(),
            ));
        }
        let seqs = texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                self.encode(t, prepend_bos).map_err(|e| match e {
                    ModelError::Input(m) => ModelError::Input(format!("text {i}: {m}")),
                    e => e,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lengths: Vec<usize> = seqs.iter().map(Vec::len).collect();
        let t = lengths.iter().copied().max().unwrap_or(0);
        let mut ids = ndarray::Array2::from_elem((seqs.len(), t), self.pad_id());
        for (mut row, seq) in ids.rows_mut().into_iter().zip(&seqs) {
            for (x, &id) in row.iter_mut().zip(seq) {
                *x = id;
            }
        }
        Ok((ids, lengths))
    }

    /// Tokenizes a prompt given as segments, the definition the prompt format uses: each segment
    /// tokenized on its own without special tokens, the ids concatenated in order, then the
    /// special tokens added as [`LmTokenizer::encode`] adds them (a BOS before, BERT's `[SEP]`
    /// after). Returns the ids and each segment's range of positions in them (an empty segment or
    /// one that yields no token: an empty range at its place).
    ///
    /// Segment-wise tokenization can differ from tokenizing the joined text at the seams (a BPE
    /// merge across two segments does not happen; a SentencePiece `▁` prefix goes to the first
    /// segment only when it starts the text), so a segment's tokens are always its own.
    ///
    /// # Errors
    /// As [`LmTokenizer::encode`].
    pub fn encode_segments(
        &self,
        segments: &[&str],
        prepend_bos: Option<bool>,
    ) -> Result<(Vec<u32>, Vec<Range<usize>>)> {
        let mut content = Vec::new();
        let mut ranges = Vec::with_capacity(segments.len());
        for (i, seg) in segments.iter().enumerate() {
            let enc = self.tok.encode(*seg, false).map_err(|e| {
                ModelError::Input(format!(
                    "cannot tokenize segment {i} with {}: {e}",
                    self.source
                ))
            })?;
            let start = content.len();
            content.extend_from_slice(enc.get_ids());
            ranges.push(start..content.len());
        }
        let (mut ids, mut start) = self.post_process(&content)?;
        let leading_bos = start > 0 && self.bos.is_some() && ids.first().copied() == self.bos;
        match prepend_bos {
            Some(true) if !leading_bos => {
                let bos = self.bos.ok_or_else(|| {
                    ModelError::Input(format!(
                        "prepend_bos=True, but the tokenizer ({}) has no beginning-of-sequence token",
                        self.source
                    ))
                })?;
                ids.insert(0, bos);
                start += 1;
            }
            Some(false) if leading_bos => {
                ids.remove(0);
                start -= 1;
            }
            _ => {}
        }
        let ranges = ranges
            .into_iter()
            .map(|r| r.start + start..r.end + start)
            .collect();
        Ok((ids, ranges))
    }

    /// The post-processor's special tokens around `content`: the ids and the position where the
    /// content starts in them.
    fn post_process(&self, content: &[u32]) -> Result<(Vec<u32>, usize)> {
        // An empty content would leave no mark of where it goes: place one token, then drop it.
        let probe = if content.is_empty() {
            &[0][..]
        } else {
            content
        };
        let tokens = probe
            .iter()
            .map(|&id| Token::new(id, String::new(), (0, 0)))
            .collect();
        let enc = Encoding::from_tokens(tokens, 0);
        let out = self.tok.post_process(enc, None, true).map_err(|e| {
            ModelError::Input(format!("tokenizer {}: post-processor: {e}", self.source))
        })?;
        // The content keeps special-token mask 0; what the post-processor added has 1.
        let mask = out.get_special_tokens_mask();
        let start = mask.iter().position(|&m| m == 0).unwrap_or(0);
        let mut ids = out.get_ids().to_vec();
        if content.is_empty() {
            ids.remove(start);
        }
        Ok((ids, start))
    }

    /// Decodes token ids to text (the tokenizer's decoder, special tokens kept, as transformers'
    /// `decode` without its clean-up of spaces).
    ///
    /// # Errors
    /// [`ModelError::Input`] naming an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.check_ids(ids)?;
        self.tok
            .decode(ids, false)
            .map_err(|e| ModelError::Input(format!("tokenizer {}: decode: {e}", self.source)))
    }

    /// Each id decoded alone, as TransformerLens's `to_str_tokens`. A token holding part of a
    /// UTF-8 character decodes to U+FFFD (lossily) rather than failing.
    ///
    /// # Errors
    /// [`ModelError::Input`] naming an id outside the vocabulary.
    pub fn str_tokens(&self, ids: &[u32]) -> Result<Vec<String>> {
        self.check_ids(ids)?;
        Ok(ids
            .iter()
            .map(|&id| {
                self.tok
                    .decode(&[id], false)
                    .unwrap_or_else(|_| char::REPLACEMENT_CHARACTER.to_string())
            })
            .collect())
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let v = self.vocab_size();
        match ids.iter().find(|&&id| id as usize >= v) {
            Some(bad) => Err(ModelError::Input(format!(
                "token id {bad} is outside the vocabulary 0..{v} of {}",
                self.source
            ))),
            None => Ok(()),
        }
    }

    /// The words of ASCII lowercase letters, at least `min_len` long, that are one token of this
    /// tokenizer after a space and decode back to themselves, each with its leading space
    /// (`" house"`), sorted: a model-vocabulary word list. A word `w` is kept when some id decodes
    /// alone to `" " + w` (or `w`, where the decoder strips the space of a lone token) and
    /// tokenizing `"x " + w` gives the ids of `"x"` followed by that one id (the context makes the
    /// test the same for byte-level BPE, where the token is `Ġw`, and SentencePiece, where it is
    /// `▁w`).
    pub fn single_token_words(&self, min_len: usize) -> Vec<String> {
        let Ok(base) = self.tok.encode("x", false) else {
            return Vec::new();
        };
        let base = base.get_ids().to_vec();
        let mut words: Vec<String> = (0..self.vocab_size() as u32)
            .filter_map(|id| {
                let s = self.tok.decode(&[id], false).ok()?;
                let w = s.strip_prefix(' ').unwrap_or(&s);
                let ok = w.len() >= min_len.max(1) && w.bytes().all(|b| b.is_ascii_lowercase());
                if !ok {
                    return None;
                }
                let text = format!("x {w}");
                let enc = self.tok.encode(text.as_str(), false).ok()?;
                let ids = enc.get_ids();
                let one = ids.len() == base.len() + 1 && ids[..base.len()] == base[..];
                (one && ids[base.len()] == id).then(|| format!(" {w}"))
            })
            .collect();
        words.sort();
        words.dedup();
        words
    }
}

/// The special tokens' names in a Hugging Face directory's `tokenizer_config.json` or
/// `special_tokens_map.json`.
#[derive(Default)]
struct SpecialNames {
    bos: Option<String>,
    eos: Option<String>,
    pad: Option<String>,
}

impl SpecialNames {
    fn read(dir: &Path) -> Result<Self> {
        let mut names = Self::default();
        for file in ["special_tokens_map.json", "tokenizer_config.json"] {
            let path = dir.join(file);
            if !path.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
                path: path.clone(),
                source,
            })?;
            let json: Json = serde_json::from_str(&text).map_err(|source| ModelError::Json {
                path: path.clone(),
                source,
            })?;
            // A token is written as a string or as an AddedToken object with `content`.
            let get = |key: &str| match json.get(key) {
                Some(Json::String(s)) => Some(s.clone()),
                Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).map(String::from),
                _ => None,
            };
            // tokenizer_config.json, read last, wins, as in transformers.
            names.bos = get("bos_token").or(names.bos);
            names.eos = get("eos_token").or(names.eos);
            names.pad = get("pad_token").or(names.pad);
        }
        Ok(names)
    }
}
