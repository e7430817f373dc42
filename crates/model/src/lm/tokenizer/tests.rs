//! Unit tests of the tokenizer (the GGUF builder's merges, segments and special tokens, the
//! no-tokenizer error); the ids against transformers are in `tests/lm.rs`.

use super::from_gguf::{bytes_to_unicode, sentencepiece_merges};
use serde_json::json;

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
    assert!(e.contains("no tokenizer.json in /nonexistent/dir") && e.ends_with("pass token ids"));
}
