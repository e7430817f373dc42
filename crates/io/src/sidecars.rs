//! The JSON sidecars of the command outputs (`hyperlens cache`, `hyperlens attention`, the four
//! `hyperlens patch` summaries, a language model's `codes.json`), and the `source` object that
//! every sidecar of an output computed over problems holds. One struct per file, shared by the writer and any reader.
//!
//! The fields are declared in alphabetical order: the order in which hyperlens has always written
//! them, so that the files stay byte for byte what they were.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where the problems of an output came from: a problem file (`problems` is its path), or sampled
/// (`problems` is `generated`, with the split, set, count, seed, and for SRAVEN whether the
/// features were left unpermuted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemsSource {
    /// Problems sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<usize>,
    /// The problem file's path, or `generated`.
    pub problems: String,
    /// The sample's seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The set sampled (`id`, `ood`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<String>,
    /// The split's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// Whether the features were left unpermuted (SRAVEN samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpermuted: Option<bool>,
}

/// The `problems` of a sampled [`ProblemsSource`].
pub const GENERATED: &str = "generated";

impl ProblemsSource {
    /// Problems read from the file `path` (as displayed).
    pub fn file(path: impl std::fmt::Display) -> ProblemsSource {
        ProblemsSource {
            n: None,
            problems: path.to_string(),
            seed: None,
            set: None,
            split: None,
            unpermuted: None,
        }
    }

    /// `n` problems sampled from set `set` of split `split` with seed `seed`; `unpermuted` for a
    /// SRAVEN sample (`None` for a task without feature permutations).
    pub fn sampled(
        split: impl Into<String>,
        set: impl Into<String>,
        n: usize,
        seed: u64,
        unpermuted: Option<bool>,
    ) -> ProblemsSource {
        ProblemsSource {
            n: Some(n),
            problems: GENERATED.into(),
            seed: Some(seed),
            set: Some(set.into()),
            split: Some(split.into()),
            unpermuted,
        }
    }
}

/// What the activations of a cache file were computed on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CacheSource {
    /// A language model's prompt, as token ids.
    Tokens {
        /// The ids.
        tokens: Vec<u32>,
    },
    /// Problems of a SRAVEN or fuzzy-logic checkpoint.
    Problems(ProblemsSource),
}

/// The sidecar of a cache file (`hyperlens cache --out X.npz` writes `X.json`). `M` is the
/// model crate's `Mixer` (this crate depends on no other hyperlens crate), written as its name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheSidecar<M> {
    /// Each array's shape, by its name (the hook's).
    pub arrays: BTreeMap<String, Vec<usize>>,
    /// The checkpoint's path.
    pub checkpoint: String,
    /// The kind of a language model's checkpoint (`hyperlens-token`, `gpt2`, `llama`, `gguf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_kind: Option<String>,
    /// The hook-name patterns asked for.
    pub hooks: Vec<String>,
    /// The mixer of a SRAVEN or fuzzy-logic checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixer: Option<M>,
    /// The positions kept (`null`: all).
    pub positions: Option<Vec<usize>>,
    /// `hyperlens <version> cache`.
    pub producer: String,
    /// What the activations were computed on.
    pub source: CacheSource,
}

/// The `arrays` of an [`AttentionSidecar`]: what each array of the file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionArrays {
    /// The pattern's layout.
    pub pattern: String,
    /// The tokens' layout.
    pub tokens: String,
}

/// The sidecar of an attention file (`hyperlens attention --out X.npz` writes `X.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionSidecar {
    /// What each array holds.
    pub arrays: AttentionArrays,
    /// The checkpoint's path.
    pub checkpoint: String,
    /// The kind of the checkpoint (`hyperlens-token`, `gpt2`, `llama`, `gguf`).
    pub checkpoint_kind: String,
    /// The device it ran on.
    pub device: String,
    /// `hyperlens <version> attention`.
    pub producer: String,
    /// The pattern's shape `[layer, head, query, key]`.
    pub shape: Vec<usize>,
    /// The token ids.
    pub tokens: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_written_in_the_files_layout() {
        let f = serde_json::to_string(&ProblemsSource::file("p.npz")).unwrap();
        assert_eq!(f, r#"{"problems":"p.npz"}"#);
        let s = ProblemsSource::sampled("seed3", "ood", 12, 7, Some(false));
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(
            text,
            r#"{"n":12,"problems":"generated","seed":7,"set":"ood","split":"seed3","unpermuted":false}"#
        );
        assert_eq!(serde_json::from_str::<ProblemsSource>(&text).unwrap(), s);
        let logic = ProblemsSource::sampled("seed3", "ood", 12, 7, None);
        assert!(!serde_json::to_string(&logic)
            .unwrap()
            .contains("unpermuted"));
        let t = CacheSource::Tokens { tokens: vec![3, 1] };
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(text, r#"{"tokens":[3,1]}"#);
        assert_eq!(serde_json::from_str::<CacheSource>(&text).unwrap(), t);
        let p: CacheSource = serde_json::from_str(r#"{"problems":"generated","n":2}"#).unwrap();
        assert!(matches!(
            p,
            CacheSource::Problems(ProblemsSource { n: Some(2), .. })
        ));
    }
}

/// One labelled factor of a prompt file (`operation`, `domain`, `relation`, ...) and its values,
/// sorted: a value's index is its position here (the `factors` / `label` arrays of
/// [`crate::keys::lm_codes`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LmFactor {
    /// The factor's name.
    pub name: String,
    /// Its values, sorted.
    pub values: Vec<String>,
}

/// `codes.json`, the sidecar of a language model's code file ([`crate::keys::lm_codes`]): what
/// the codes are and where they came from. Written by the probe crate's prompt extraction, read by
/// the analyses and the explorer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LmCodesSidecar {
    /// The factors of the prompt file, in the column order of `factors`.
    pub factors: Vec<LmFactor>,
    /// The form of the code: `pattern` (attention probabilities, `hook_pattern`), `scores`
    /// (pre-softmax, `hook_attn_scores`) or `no-sink` (probabilities renormalised without
    /// position 0).
    pub form: String,
    /// Whether the file holds `resid`.
    pub has_resid: bool,
    /// Per query head, the key/value head it reads (`h / (H / H_kv)`; `h` without grouping).
    pub kv_group: Vec<usize>,
    /// The factor whose value indices are the `label` array.
    pub label_factor: String,
    /// The selected layers, in the order of the codes' layer axis.
    pub layers: Vec<usize>,
    /// The model's checkpoint path, as given.
    pub model: String,
    /// The model's kind (`gguf`, `hf-llama`, `hf-gpt2`, `token-model`).
    pub model_kind: String,
    /// Query heads per layer.
    pub n_heads: usize,
    /// Rows of the file.
    pub n_prompts: usize,
    /// Whether a beginning-of-sequence token was prepended.
    pub prepend_bos: bool,
    /// The prompt file's path, as given (the explorer reads the prompts' text from it).
    pub prompts: String,
    /// When the codes are those of the model with its weights shuffled within each tensor (the
    /// control of the lens), the shuffle's seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffled_weights_seed: Option<u64>,
    /// The sites, as written (`query: last; keys: demo_output, query_input`).
    pub sites: String,
    /// Where the tokenizer came from (a `tokenizer.json` path or the GGUF's metadata).
    pub tokenizer: String,
}

/// `head_ablation.json` (`hyperlens patch heads`): the run, the hook ablated, the problems and
/// the whole report. `M` is the mixer's type and `R` the report's (the probe crate's `Mixer` and
/// `AblationReport`; this crate sits below them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadAblationSidecar<M, R> {
    /// The checkpoint directory, as given.
    pub checkpoint: String,
    /// The hook ablated (`blocks.{l}.attn.hook_z`).
    pub hook: String,
    /// The model's sequence mixer.
    pub mixer: M,
    /// `hyperlens <version> patch heads`.
    pub producer: String,
    /// The ablation's report.
    pub report: R,
    /// Where the problems came from.
    pub source: ProblemsSource,
}

/// `activation_patching.json` (`hyperlens patch acts`): the run, the problems, the method and the
/// mean logit differences; the scores are in `activation_patching.npz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActivationPatchingSidecar<M> {
    /// What each array of `activation_patching.npz` holds, by its name.
    pub arrays: BTreeMap<String, String>,
    /// The checkpoint directory, as given.
    pub checkpoint: String,
    /// The mean logit difference on the clean problems.
    pub clean_logit_diff: f64,
    /// The mean logit difference on the corrupted problems.
    pub corrupted_logit_diff: f64,
    /// How the corrupted problems are made.
    pub corruption: String,
    /// The score restored by a patch.
    pub metric: String,
    /// The model's sequence mixer.
    pub mixer: M,
    /// Clean / corrupted pairs.
    pub n_pairs: usize,
    /// `hyperlens <version> patch acts`.
    pub producer: String,
    /// The answer slot.
    pub slot: usize,
    /// Where the problems came from.
    pub source: ProblemsSource,
}

/// `dla.json` (`hyperlens patch dla`): the run, the problems, the method and every attribution
/// (nats; means over problems and slots).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DlaSidecar<M> {
    /// Each layer's attention biases' attribution.
    pub attn_bias: Vec<f64>,
    /// The same, centred.
    pub attn_bias_centred: Vec<f64>,
    /// The checkpoint directory, as given.
    pub checkpoint: String,
    /// The constant parts' attribution, then centred.
    pub constant: [f64; 2],
    /// The embedding's attribution, then centred.
    pub embed: [f64; 2],
    /// Each head's attribution. # Shapes: `[L][H]`.
    pub heads: Vec<Vec<f64>>,
    /// The same, centred. # Shapes: `[L][H]`.
    pub heads_centred: Vec<Vec<f64>>,
    /// The answer's logit.
    pub logit: f64,
    /// The answer's logit, centred.
    pub logit_centred: f64,
    /// The largest difference between the logit and the sum of the parts.
    pub max_error: f64,
    /// How the parts are attributed.
    pub method: String,
    /// The model's sequence mixer.
    pub mixer: M,
    /// Each layer's MLP's attribution.
    pub mlp: Vec<f64>,
    /// The same, centred.
    pub mlp_centred: Vec<f64>,
    /// Problems.
    pub n: usize,
    /// `hyperlens <version> patch dla`.
    pub producer: String,
    /// The answer slots attributed.
    pub slots: Vec<usize>,
    /// Where the problems came from.
    pub source: ProblemsSource,
    /// The unit of the attributions.
    pub units: String,
}

/// `transplant.json` (`hyperlens patch transplant`): the run, the problems and the rows (`R`: the
/// probe crate's `TransplantRow`s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransplantSidecar<M, R> {
    /// The checkpoint directory, as given.
    pub checkpoint: String,
    /// The model's sequence mixer.
    pub mixer: M,
    /// Unpermuted problems per set.
    pub n: usize,
    /// `hyperlens <version> patch transplant`.
    pub producer: String,
    /// One row per layer and kind.
    pub rows: R,
    /// The seed of the problems and of the random codes.
    pub seed: u64,
    /// The answer slot whose site is transplanted.
    pub slot: usize,
    /// The split's name.
    pub split: String,
}
