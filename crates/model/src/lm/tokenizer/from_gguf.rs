//! A tokenizer built from a GGUF file's own `tokenizer.ggml.*` metadata (module docs of
//! `super`): the metadata assembled as a `tokenizer.json` document, the way transformers'
//! `convert_gguf_tokenizer` builds it, and read by the `tokenizers` crate.

use serde_json::{json, Map, Value as Json};
use tokenizers::Tokenizer;

use super::LmTokenizer;
use crate::error::{ModelError, Result};
use crate::lm::gguf::GgufMeta;

/// GPT-2's `bytes_to_unicode`: the printable character standing for each byte in a byte-level
/// vocabulary (bytes `!`..`~`, `¡`..`¬`, `®`..`ÿ` stand for themselves, the others for 256 + n in
/// order).
pub(super) fn bytes_to_unicode() -> [char; 256] {
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
pub(super) fn gguf_tokenizer(meta: &GgufMeta<'_>) -> Result<LmTokenizer> {
    let path = meta.path;
    let kind = meta.str_opt("tokenizer.ggml.model")?.unwrap_or_default();
    let tokens = meta
        .strings_opt("tokenizer.ggml.tokens")?
        .ok_or_else(|| meta.err("tokenizer.ggml.tokens", "missing"))?;
    let n = tokens.len();
    let id_of = |key: &str| -> Result<Option<u32>> {
        match meta.usize_opt(key)? {
            Some(id) if id < n => Ok(Some(id as u32)),
            Some(id) => Err(meta.err(key, &format!("id {id} outside the {n} tokens"))),
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
            return Err(meta.err("tokenizer.ggml.model", &format!(
                    "tokenizer kind `{other}` is not supported (supported: gpt2, llama): pass token ids"
                ),
            ))
        }
    };
    let add_bos = meta
        .bool_opt("tokenizer.ggml.add_bos_token")?
        .unwrap_or(parts.add_bos_default);
    let add_eos = meta
        .bool_opt("tokenizer.ggml.add_eos_token")?
        .unwrap_or(false);
    let types = meta.ints_opt("tokenizer.ggml.token_type")?;
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
    let merges: Vec<Json> = meta
        .strings_opt(key)?
        .ok_or_else(|| meta.err(key, "missing (byte-level BPE)"))?
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| meta.err(key, &format!("`{m}` is not `a b`")))
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
            return Err(meta.err(
                "tokenizer.ggml.pre",
                &format!(
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
    let scores = meta
        .floats_opt(key)?
        .ok_or_else(|| meta.err(key, "missing (SentencePiece)"))?;
    if scores.len() != tokens.len() {
        return Err(meta.err(
            key,
            &format!("{} scores for {} tokens", scores.len(), tokens.len()),
        ));
    }
    let merges = match meta.strings_opt("tokenizer.ggml.merges")? {
        Some(m) => m
            .iter()
            .filter_map(|m| m.split_once(' ').map(|(a, b)| json!([a, b])))
            .collect(),
        None => sentencepiece_merges(&tokens, &scores),
    };
    let prefix = meta
        .bool_opt("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);
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
pub(super) fn sentencepiece_merges(tokens: &[String], scores: &[f64]) -> Vec<Json> {
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
