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

use std::fs::File;
use std::io::BufReader;
use std::ops::Range;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use serde_json::{json, Map, Value as Json};
use tokenizers::{Encoding, Token, Tokenizer};

use super::gguf::GgufMeta;
use super::CheckpointKind;
use crate::error::{ModelError, Result};

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
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let content =
            Content::read(&mut BufReader::new(file)).map_err(|e| ModelError::Checkpoint {
                path: path.to_path_buf(),
                msg: format!("not a readable GGUF file: {e}"),
            })?;
        let meta = GgufMeta {
            path,
            map: content.metadata,
        };
        if meta.str_opt("tokenizer.ggml.model")?.is_none() {
            return Ok(None);
        }
        gguf_tokenizer(&meta).map(Some)
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

/// GPT-2's `bytes_to_unicode`: the printable character standing for each byte in a byte-level
/// vocabulary (bytes `!`..`~`, `¡`..`¬`, `®`..`ÿ` stand for themselves, the others for 256 + n in
/// order).
fn bytes_to_unicode() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let keep = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        out[b as usize] = if keep {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\u{FFFD}')
        };
    }
    out
}

/// The regular expression of llama.cpp's `llama3` / `llama-bpe` pre-tokenizer (Llama 3's
/// `tokenizer.json` `Split`), as transformers' GGUF converter applies it.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// An error in the metadata entry `key` of a GGUF file.
fn meta_err(meta: &GgufMeta<'_>, key: &str, msg: String) -> ModelError {
    ModelError::Checkpoint {
        path: meta.path.to_path_buf(),
        msg: format!("metadata `{key}`: {msg}"),
    }
}

/// A boolean metadata entry; `None` when absent.
fn meta_flag(meta: &GgufMeta<'_>, key: &str) -> Result<Option<bool>> {
    match meta.map.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(meta_err(meta, key, "expected a boolean".into())),
    }
}

/// The parts of a `tokenizer.json` that depend on the tokenizer's kind.
struct KindParts {
    /// The vocabulary as the model spells it (id order).
    tokens: Vec<String>,
    model: Json,
    pre_tokenizer: Json,
    decoder: Json,
    /// Whether the BOS is added by default when the file does not say.
    add_bos_default: bool,
}

/// The tokenizer of a GGUF file's `tokenizer.ggml.*` metadata, assembled as a `tokenizer.json`
/// document and read by the `tokenizers` crate.
fn gguf_tokenizer(meta: &GgufMeta<'_>) -> Result<LmTokenizer> {
    let path = meta.path;
    let kind = meta.str_opt("tokenizer.ggml.model")?.unwrap_or_default();
    let tokens = string_array(meta, "tokenizer.ggml.tokens")?
        .ok_or_else(|| meta_err(meta, "tokenizer.ggml.tokens", "missing".into()))?;
    let n = tokens.len();
    let id_of = |key: &str| -> Result<Option<u32>> {
        match meta.usize_opt(key)? {
            Some(id) if id < n => Ok(Some(id as u32)),
            Some(id) => Err(meta_err(
                meta,
                key,
                format!("id {id} outside the {n} tokens"),
            )),
            None => Ok(None),
        }
    };
    let bos = id_of("tokenizer.ggml.bos_token_id")?;
    let eos = id_of("tokenizer.ggml.eos_token_id")?;
    let unk = id_of("tokenizer.ggml.unknown_token_id")?;
    let pad = id_of("tokenizer.ggml.padding_token_id")?;
    let parts = match kind {
        "gpt2" => byte_level_parts(meta, tokens)?,
        "llama" => sentencepiece_parts(meta, tokens)?,
        other => {
            return Err(meta_err(
                meta,
                "tokenizer.ggml.model",
                format!(
                    "tokenizer kind `{other}` is not supported (supported: gpt2, llama): pass token ids"
                ),
            ))
        }
    };
    let add_bos = meta_flag(meta, "tokenizer.ggml.add_bos_token")?.unwrap_or(parts.add_bos_default);
    let add_eos = meta_flag(meta, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let types = int_array(meta, "tokenizer.ggml.token_type")?;
    let added = added_tokens(
        &parts.tokens,
        types.as_deref(),
        &[bos, eos, unk, pad],
        kind == "gpt2",
    );
    let post = template(
        &parts.tokens,
        bos.filter(|_| add_bos),
        eos.filter(|_| add_eos),
    );
    let doc = json!({"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": null, "pre_tokenizer": parts.pre_tokenizer,
        "post_processor": post, "decoder": parts.decoder, "model": parts.model});
    let tok: Tokenizer = serde_json::from_value(doc).map_err(|e| ModelError::Checkpoint {
        path: path.to_path_buf(),
        msg: format!("cannot build a tokenizer from its tokenizer.ggml.* metadata: {e}"),
    })?;
    LmTokenizer::new(
        tok,
        bos,
        eos,
        pad,
        format!("{} (tokenizer.ggml.* metadata)", path.display()),
    )
}

/// Byte-level BPE (`tokenizer.ggml.model = gpt2`), as transformers' `byte_level_tokenizer` and
/// `set_split_regex`: tokens written outside the byte alphabet respelled byte by byte, BPE from the
/// merges, GPT-2's `ByteLevel` pre-tokenizer (after SmolLM's digit split for `pre = smollm`, or
/// Llama 3's split for `llama3` / `llama-bpe`) and decoder.
fn byte_level_parts(meta: &GgufMeta<'_>, tokens: Vec<String>) -> Result<KindParts> {
    let spelling = bytes_to_unicode();
    let alphabet: std::collections::HashSet<char> = spelling.iter().copied().collect();
    let spelled: Vec<String> = tokens
        .into_iter()
        .map(|t| {
            if t.chars().all(|c| alphabet.contains(&c)) {
                t
            } else {
                t.bytes().map(|b| spelling[b as usize]).collect()
            }
        })
        .collect();
    let key = "tokenizer.ggml.merges";
    let merges: Vec<Json> = string_array(meta, key)?
        .ok_or_else(|| meta_err(meta, key, "missing (byte-level BPE)".into()))?
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| meta_err(meta, key, format!("`{m}` is not `a b`")))
        })
        .collect::<Result<_>>()?;
    let byte_level = |use_regex: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
               "use_regex": use_regex})
    };
    let pre_tokenizer = match meta.str_opt("tokenizer.ggml.pre")?.unwrap_or("default") {
        "default" | "gpt2" | "gpt-2" => byte_level(true),
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        "llama3" | "llama-v3" | "llama-bpe" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated",
             "invert": false},
            byte_level(false)]}),
        other => {
            return Err(meta_err(
                meta,
                "tokenizer.ggml.pre",
                format!(
                    "pre-tokenizer `{other}` is not supported (supported: default, gpt2, smollm, \
                     llama3, llama-bpe): pass token ids"
                ),
            ))
        }
    };
    let model = json!({"type": "BPE", "dropout": null, "unk_token": null,
        "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
        "byte_fallback": false, "ignore_merges": false,
        "vocab": vocab_json(&spelled), "merges": merges});
    Ok(KindParts {
        tokens: spelled,
        model,
        pre_tokenizer,
        decoder: json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
            "use_regex": true}),
        add_bos_default: false,
    })
}

/// SentencePiece BPE (`tokenizer.ggml.model = llama`), as transformers' `LlamaTokenizer`: BPE with
/// byte fallback from the merges, or from the merges the scores imply, the `Metaspace`
/// pre-tokenizer (`▁` before the first word unless `add_space_prefix` is false) and its decoder.
fn sentencepiece_parts(meta: &GgufMeta<'_>, tokens: Vec<String>) -> Result<KindParts> {
    let key = "tokenizer.ggml.scores";
    let scores = float_array(meta, key)?
        .ok_or_else(|| meta_err(meta, key, "missing (SentencePiece)".into()))?;
    if scores.len() != tokens.len() {
        return Err(meta_err(
            meta,
            key,
            format!("{} scores for {} tokens", scores.len(), tokens.len()),
        ));
    }
    let merges = match string_array(meta, "tokenizer.ggml.merges")? {
        Some(m) => m
            .iter()
            .filter_map(|m| m.split_once(' ').map(|(a, b)| json!([a, b])))
            .collect(),
        None => sentencepiece_merges(&tokens, &scores),
    };
    let prefix = meta_flag(meta, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let model = json!({"type": "BPE", "dropout": null, "unk_token": null,
        "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
        "byte_fallback": true, "ignore_merges": false,
        "vocab": vocab_json(&tokens), "merges": merges});
    Ok(KindParts {
        tokens,
        model,
        pre_tokenizer: json!({"type": "Metaspace", "replacement": "▁",
            "prepend_scheme": if prefix { "first" } else { "never" }, "split": false}),
        decoder: json!({"type": "Sequence", "decoders": decoders}),
        add_bos_default: true,
    })
}

/// The added tokens, as transformers' `add_gguf_special_tokens` and its special-token arguments:
/// control tokens (`token_type` 3; in a byte-level vocabulary only those spelled in the byte
/// alphabet) and the `named` ones (BOS, EOS, UNK, PAD) as special, user-defined ones (4) as plain.
fn added_tokens(
    tokens: &[String],
    types: Option<&[i64]>,
    named: &[Option<u32>],
    byte_level: bool,
) -> Vec<Json> {
    let alphabet: Option<std::collections::HashSet<char>> =
        byte_level.then(|| bytes_to_unicode().into_iter().collect());
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let ty = types.and_then(|v| v.get(i)).copied();
        let spelled = alphabet
            .as_ref()
            .is_none_or(|a| t.chars().all(|c| a.contains(&c)));
        let special = (ty == Some(3) && spelled) || named.contains(&Some(i as u32));
        if special || ty == Some(4) {
            added.push(
                json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special}),
            );
        }
    }
    added
}

/// `{token: id}`; a token listed twice keeps its last id, as a Python dict built in order.
fn vocab_json(tokens: &[String]) -> Json {
    let mut m = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        m.insert(t.clone(), json!(i));
    }
    Json::Object(m)
}

/// A `TemplateProcessing` adding `bos` before and `eos` after the text (transformers'
/// `update_post_processor`); none when neither is added.
fn template(tokens: &[String], bos: Option<u32>, eos: Option<u32>) -> Json {
    if bos.is_none() && eos.is_none() {
        return Json::Null;
    }
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Map::new();
    let special = |id: u32, specials: &mut Map<String, Json>| {
        let t = tokens[id as usize].clone();
        specials.insert(t.clone(), json!({"id": t, "ids": [id], "tokens": [t]}));
        json!({"SpecialToken": {"id": tokens[id as usize], "type_id": 0}})
    };
    if let Some(b) = bos {
        single.push(special(b, &mut specials));
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if let Some(e) = eos {
        single.push(special(e, &mut specials));
    }
    pair.extend(single.iter().cloned());
    if let Some(b) = bos {
        pair.push(json!({"SpecialToken": {"id": tokens[b as usize], "type_id": 1}}));
    }
    pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
    if let Some(e) = eos {
        pair.push(json!({"SpecialToken": {"id": tokens[e as usize], "type_id": 1}}));
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair,
        "special_tokens": specials})
}

/// The merges a SentencePiece vocabulary implies (transformers' `generate_merges` with scores):
/// every split of a piece into two pieces of the vocabulary, with the piece's score; within a
/// piece ordered by the two parts' ids, then all by score, then by the parts' lengths, highest
/// first, ties kept in vocabulary order.
fn sentencepiece_merges(tokens: &[String], scores: &[f64]) -> Vec<Json> {
    let mut vocab: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut score_of: Vec<(&str, f64)> = Vec::new();
    let mut pos: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.as_str(), i);
        match pos.get(t.as_str()) {
            Some(&p) => score_of[p].1 = scores[i],
            None => {
                pos.insert(t.as_str(), score_of.len());
                score_of.push((t.as_str(), scores[i]));
            }
        }
    }
    struct M<'a> {
        l: &'a str,
        r: &'a str,
        score: f64,
        ll: usize,
        lr: usize,
    }
    let mut merges: Vec<M<'_>> = Vec::new();
    for &(piece, score) in &score_of {
        let mut local: Vec<M<'_>> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = piece.split_at(at);
                (vocab.contains_key(l) && vocab.contains_key(r)).then(|| M {
                    l,
                    r,
                    score,
                    ll: l.chars().count(),
                    lr: r.chars().count(),
                })
            })
            .collect();
        local.sort_by_key(|m| (vocab[m.l], vocab[m.r]));
        merges.extend(local);
    }
    // Python's sorted(..., reverse=True) is stable: equal keys keep their order.
    merges.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.ll.cmp(&a.ll))
            .then(b.lr.cmp(&a.lr))
    });
    merges.into_iter().map(|m| json!([m.l, m.r])).collect()
}

fn array<'m>(meta: &'m GgufMeta<'_>, key: &str) -> Result<Option<&'m Vec<Value>>> {
    match meta.map.get(key) {
        None => Ok(None),
        Some(Value::Array(v)) => Ok(Some(v)),
        Some(_) => Err(ModelError::Checkpoint {
            path: meta.path.to_path_buf(),
            msg: format!("metadata `{key}`: expected an array"),
        }),
    }
}

fn bad_item(meta: &GgufMeta<'_>, key: &str, i: usize, what: &str) -> ModelError {
    ModelError::Checkpoint {
        path: meta.path.to_path_buf(),
        msg: format!("metadata `{key}`: item {i} is not {what}"),
    }
}

fn string_array(meta: &GgufMeta<'_>, key: &str) -> Result<Option<Vec<String>>> {
    let Some(v) = array(meta, key)? else {
        return Ok(None);
    };
    v.iter()
        .enumerate()
        .map(|(i, x)| match x {
            Value::String(s) => Ok(s.clone()),
            _ => Err(bad_item(meta, key, i, "a string")),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn float_array(meta: &GgufMeta<'_>, key: &str) -> Result<Option<Vec<f64>>> {
    let Some(v) = array(meta, key)? else {
        return Ok(None);
    };
    v.iter()
        .enumerate()
        .map(|(i, x)| match x {
            Value::F32(f) => Ok(f64::from(*f)),
            Value::F64(f) => Ok(*f),
            _ => Err(bad_item(meta, key, i, "a float")),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn int_array(meta: &GgufMeta<'_>, key: &str) -> Result<Option<Vec<i64>>> {
    let Some(v) = array(meta, key)? else {
        return Ok(None);
    };
    v.iter()
        .enumerate()
        .map(|(i, x)| match x {
            Value::I32(n) => Ok(i64::from(*n)),
            Value::U32(n) => Ok(i64::from(*n)),
            Value::I8(n) => Ok(i64::from(*n)),
            Value::U8(n) => Ok(i64::from(*n)),
            Value::I16(n) => Ok(i64::from(*n)),
            Value::U16(n) => Ok(i64::from(*n)),
            Value::I64(n) => Ok(*n),
            _ => Err(bad_item(meta, key, i, "an integer")),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_to_unicode_is_gpt2s_table() {
        let t = bytes_to_unicode();
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0], 'Ā');
        let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn sentencepiece_merges_follow_scores_then_lengths() {
        let toks: Vec<String> = ["a", "b", "c", "ab", "abc", "bc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -1.0, -3.0, -2.0];
        let m = sentencepiece_merges(&toks, &scores);
        // ab (-1), bc (-2), then abc (-3) split as (ab, c) before (a, bc): longer left first.
        assert_eq!(
            m,
            vec![
                json!(["a", "b"]),
                json!(["b", "c"]),
                json!(["ab", "c"]),
                json!(["a", "bc"])
            ]
        );
    }

    fn one(r: Range<usize>) -> Vec<Range<usize>> {
        vec![r]
    }

    /// A WordLevel tokenizer with a BERT-like template, to test the special-token rules.
    fn word_level(template: bool, bos: Option<u32>) -> LmTokenizer {
        let vocab = json!({"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3, "b": 4, "c": 5});
        let post = if template {
            json!({"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]},
                                   "[SEP]": {"id": "[SEP]", "ids": [2], "tokens": ["[SEP]"]}}})
        } else {
            Json::Null
        };
        let doc = json!({"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [], "normalizer": null,
            "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": post,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}});
        let tok: Tokenizer = serde_json::from_value(doc).unwrap();
        LmTokenizer::new(tok, bos, Some(2), None, "test".into()).unwrap()
    }

    #[test]
    fn segments_and_special_tokens() {
        // BERT-like, [CLS] as the BOS: the default adds it, Some(false) drops it.
        let t = word_level(true, Some(1));
        assert!(t.adds_bos_by_default());
        let (ids, r) = t.encode_segments(&["a b", "", "c"], None).unwrap();
        assert_eq!(ids, vec![1, 3, 4, 5, 2]);
        assert_eq!(r, vec![1..3, 3..3, 3..4]);
        assert_eq!(t.encode("a b c", None).unwrap(), ids);
        assert_eq!(t.encode("a", Some(true)).unwrap(), vec![1, 3, 2]);
        assert_eq!(t.encode("a", Some(false)).unwrap(), vec![3, 2]);
        let (ids, r) = t.encode_segments(&["", ""], None).unwrap();
        assert_eq!((ids, r), (vec![1, 2], vec![1..1, 1..1]));
        // A [CLS] written in the text is content: Some(true) still prepends one.
        let (ids, r) = t.encode_segments(&["[CLS]"], Some(true)).unwrap();
        assert_eq!((ids, r), (vec![1, 1, 2], one(1..2)));
        assert_eq!(t.pad_id(), 2);
        // No post-processor, no BOS: the default adds nothing; Some(true) is an error.
        let t = word_level(false, None);
        assert!(!t.adds_bos_by_default());
        assert_eq!(t.encode("a c", None).unwrap(), vec![3, 5]);
        assert_eq!(t.encode("a c", Some(false)).unwrap(), vec![3, 5]);
        let e = t.encode("a", Some(true)).unwrap_err().to_string();
        assert!(e.contains("no beginning-of-sequence token"), "{e}");
        assert_eq!(t.encode("", None).unwrap(), Vec::<u32>::new());
        // BOS known but not added by default: Some(true) prepends it.
        let t = word_level(false, Some(1));
        assert_eq!(
            t.encode_segments(&["b"], Some(true)).unwrap(),
            (vec![1, 4], one(1..2))
        );
        assert!(t
            .decode(&[9])
            .unwrap_err()
            .to_string()
            .contains("token id 9"));
        assert!(t.str_tokens(&[6]).is_err());
        // A batch is right-padded with the pad id (here EOS, 2) and reports the lengths.
        let (ids, len) = t.encode_batch(&["a b c", "", "c"], None).unwrap();
        assert_eq!(ids, ndarray::array![[3, 4, 5], [2, 2, 2], [5, 2, 2]]);
        assert_eq!(len, vec![3, 0, 1]);
        assert!(t.encode_batch(&[], None).is_err());
    }

    #[test]
    fn no_tokenizer_error_is_one_line() {
        let e = no_tokenizer_error(&missing_tokenizer(Path::new("/nonexistent/dir"))).to_string();
        assert!(!e.contains('\n'));
        assert!(
            e.contains("no tokenizer.json in /nonexistent/dir") && e.ends_with("pass token ids")
        );
    }
}
