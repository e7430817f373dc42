//! The names of the arrays that hyperlens writes into `.npz` archives and reads back: one constant
//! per array, shared by the writer and every reader, each with its dtype and shape. The files are
//! meant for numpy as well (`np.load(path)[name]`).

/// `codes.npz`: the latent codes of `hyperlens probe` (and of `report`'s `codes/<name>_{id,ood}.npz`),
/// one row per problem and selected site (`N` rows). Read by `hyperlens-analysis`' `CodeSet`.
pub mod codes {
    /// float32 `[N, L, H, Q, K]`: attention score of head `h` of layer `l` from the `q`-th
    /// selected query to the `k`-th selected key (the latent code, Schug et al. 2025).
    pub const CODES: &str = "codes";
    /// int64 `[N]`: the rule (0-7) of the feature shown in the row's answer slot.
    pub const LABEL: &str = "label";
    /// int64 `[N, F]`: the task's rule per unpermuted feature slot.
    pub const RULES: &str = "rules";
    /// int64 `[N, K]`: the value shown by each selected key token (-1 for a query token).
    pub const INPUTS: &str = "inputs";
    /// int64 `[N]`: the answer value of the row's slot (logic codes: float32 `[N]`, the last
    /// token's target).
    pub const TARGET: &str = "target";
    /// int64 `[N]`: the model's predicted value of the row's slot (logic codes: float32 `[N]`, the
    /// model's prediction of the last token's target).
    pub const PREDICTION: &str = "prediction";
    /// Logic codes only: int64 `[N, Kt, Lv]`, the task's terms as bits (1: the variable, 0: its
    /// negation), as in the problem set.
    pub const TERMS: &str = "terms";
    /// Logic codes only: int64 `[N, Kt]`, the task's term indices.
    pub const TERM_IDS: &str = "term_ids";
    /// bool `[N]`: `prediction == target`.
    pub const CORRECT: &str = "correct";
    /// int64 `[N]`: the answer slot of the row.
    pub const SLOT: &str = "slot";
    /// int64 `[N]`: the problem index of the row.
    pub const PROBLEM: &str = "problem";
}

/// `codes.npz` of a language model on a prompt file (`hyperlens probe --prompts`, `lm.latent_codes`
/// streamed): one row per prompt, the sidecar [`crate::sidecars::LmCodesSidecar`] beside it.
/// `codes` and `label` keep the names (and meaning) of [`codes`], so the code-set readers and the
/// explorer take these files too.
pub mod lm_codes {
    /// float32 `[N, L, H, Q, K]`: the latent code of each (query, key) site pair, over the query
    /// heads `H` of each selected layer (the form the sidecar names: the attention probabilities,
    /// the pre-softmax scores, or the probabilities renormalised without position 0).
    pub const CODES: &str = "codes";
    /// int64 `[N]`: the value index of the sidecar's `label_factor` (as a column of `factors`).
    pub const LABEL: &str = "label";
    /// int64 `[N, F]`: per prompt, the index of its value of each factor, in the sidecar's
    /// `factors` order (values sorted; -1 when the prompt has no such label).
    pub const FACTORS: &str = "factors";
    /// int64 `[N]`: the prompt's split, 0 = train (seen combinations), 1 = test (held out).
    pub const SPLIT: &str = "split";
    /// int64 `[N]`: the prompt's index (0-based line) in the prompt file.
    pub const PROMPT: &str = "prompt";
    /// int64 `[N]`: the prompt's length in tokens (special tokens included).
    pub const LENGTH: &str = "length";
    /// int64 `[N, Q]`: the token position of each query site.
    pub const QUERY_POS: &str = "query_pos";
    /// int64 `[N, K]`: the token position of each key site.
    pub const KEY_POS: &str = "key_pos";
    /// int64 `[N]`: the first token of the prompt's answer (-1 when it has none).
    pub const TARGET: &str = "target";
    /// int64 `[N]`: the model's next-token prediction (argmax) after the prompt's last token.
    pub const PREDICTION: &str = "prediction";
    /// bool `[N]`: `prediction == target` (false when the prompt has no answer).
    pub const CORRECT: &str = "correct";
    /// float32 `[N, L, Q, D]` (only with `--resid`): the residual stream after each selected
    /// layer (`blocks.{l}.hook_resid_post`) at each query site.
    pub const RESID: &str = "resid";
}

/// SRAVEN problem sets (`hyperlens tasks sample`, read by `eval --problems` and the task crate).
pub mod problems {
    /// uint8 `[N, T, M]` (float32 / float64 accepted on read): one-hot input tokens.
    pub const X: &str = "x";
    /// int64 `[N, F]`: answer values in column 2's slot order.
    pub const Y: &str = "y";
    /// int64 `[N, F]`: rule index per unpermuted feature slot.
    pub const RULES: &str = "rules";
    /// int64 `[N, 3, F]` (optional): the feature permutation of each column.
    pub const PERMS: &str = "perms";
}

/// Fuzzy-logic problem sets (`hyperlens tasks sample --task logic`): N sequences of T tokens over
/// L variables, tasks of K terms.
pub mod logic_problems {
    /// float32 `[N, T, L + 1]`: the inputs (L values in [0, 1), then the previous token's target;
    /// 0 in the last token, whose target the model predicts).
    pub const X: &str = "x";
    /// float32 `[N]`: the target of the last token.
    pub const Y: &str = "y";
    /// float32 `[N, T]`: the target of every token (the R² denominator is their variance).
    pub const TARGETS: &str = "targets";
    /// uint8 `[N, K, L]`: the task's terms as bits (1: the variable, 0: its negation).
    pub const TERMS: &str = "terms";
    /// int64 `[N, K]`: the task's term indices (binary order of the bits).
    pub const TERM_IDS: &str = "term_ids";
}

/// `pca.npz` of the latent-code tables (`hyperlens analyze`, `report`'s `tables/<name>/pca.npz`).
/// Per-selection arrays are named by a prefix and the selection: `layer{l}` for layer `l`, `all` for
/// all layers concatenated (see [`pca::selection`]). `N_u` is the size of the set the PCA ran on
/// (the OOD set by default), `k` the components kept, `D` the features of the selection.
pub mod pca {
    /// Prefix of the projections: float64 `[N_u, k]` under `layer{l}` / `all` (no prefix).
    pub const PROJECTION_PREFIX: &str = "";
    /// Prefix of the principal axes: float64 `[k, D]` under `components_layer{l}` / `components_all`.
    pub const COMPONENTS_PREFIX: &str = "components_";
    /// Prefix of the explained-variance ratios of all components: float64 `[min(N_u, D)]` under
    /// `explained_variance_ratio_layer{l}` / `explained_variance_ratio_all`.
    pub const EXPLAINED_VARIANCE_RATIO_PREFIX: &str = "explained_variance_ratio_";
    /// The selection part of a name for all layers concatenated.
    pub const ALL_LAYERS: &str = "all";
    /// int64 `[N_u]`: the rule label of each projected code.
    pub const LABEL: &str = "label";
    /// int64 `[N_u]` (when the codes hold it): the answer value of each projected code.
    pub const TARGET: &str = "target";
    /// bool `[N_u]` (when the codes hold it): whether the model was right on the row.
    pub const CORRECT: &str = "correct";

    /// The selection part of a name: `layer{l}` for `Some(l)`, [`ALL_LAYERS`] for `None`.
    pub fn selection(layer: Option<usize>) -> String {
        layer.map_or_else(|| ALL_LAYERS.to_string(), |l| format!("layer{l}"))
    }

    /// The selection of a selection part, the inverse of [`selection`]: `Some(Some(l))` for
    /// `layer{l}`, `Some(None)` for [`ALL_LAYERS`], `None` for any other name.
    pub fn parse_selection(name: &str) -> Option<Option<usize>> {
        if name == ALL_LAYERS {
            return Some(None);
        }
        let l = name.strip_prefix("layer")?;
        let n: usize = l.parse().ok()?;
        // `layer+1` or `layer01` are not names `selection` writes.
        (n.to_string() == l).then_some(Some(n))
    }

    /// The full name of a per-selection array: `prefix` followed by [`selection`].
    pub fn name(prefix: &str, layer: Option<usize>) -> String {
        format!("{prefix}{}", selection(layer))
    }
}

/// `tsne.npz` of `hyperlens analyze --tsne` (SRAVEN codes): `n` is the number of codes embedded
/// (the first `min(N, --tsne-points)` of the `--unsupervised-on` set).
pub mod tsne {
    /// float64 `[n, 2]`: the t-SNE embedding of the all-layer codes.
    pub const TSNE_ALL: &str = "tsne_all";
    /// int64 `[n]`: the rule label of each embedded code.
    pub const LABEL: &str = "label";
}

/// `projections.npz` of fuzzy-logic codes (`hyperlens analyze` on logic codes, `report`'s
/// `tables/<name>/projections.npz`): `N` codes, of which the first `n` are embedded by t-SNE.
pub mod projections {
    /// Prefix of the PCA projections: float64 `[N, 2]` under `pca_layer{l}` and `pca_all` (the
    /// selection part as in [`super::pca::selection`]; [`super::pca::name`] joins them).
    pub const PCA_PREFIX: &str = "pca_";
    /// float64 `[n, 2]`: the t-SNE embedding of the all-layer codes of the first `n` codes.
    pub const TSNE_ALL: &str = "tsne_all";
    /// int64 `[N, Kt]`: the task's term indices of each code (the codes' `term_ids`).
    pub const TERM_IDS: &str = "term_ids";
}

/// `hyperlens cache`: one float32 array per cached hook point, named by the hook
/// (`blocks.{l}.hook_resid_post`, TransformerLens names; `N` problems, or 1 for a language
/// model's token sequence), beside these.
pub mod cache {
    /// float32 `[N, F, d_out]` (SRAVEN and fuzzy-logic models) or `[1, T, V]` (language models):
    /// the logits of the cached pass.
    pub const LOGITS: &str = "logits";
    /// Language models only: int64 `[T]`, the token ids of the sequence.
    pub const TOKENS: &str = "tokens";
}

/// `activation_patching.npz` of `hyperlens patch acts`: `L` layers, `T` tokens, `H` heads, `N`
/// clean / corrupted pairs. Each score is the share of the clean logit difference that the patch
/// restores (`crates/probe/src/patching/`).
pub mod activation_patching {
    /// float64 `[L, T]`: `blocks.{l}.hook_resid_pre` patched at one position.
    pub const RESID_PRE: &str = "resid_pre";
    /// float64 `[L, T]`: `blocks.{l}.hook_attn_out` patched at one position.
    pub const ATTN_OUT: &str = "attn_out";
    /// float64 `[L, T]` (models with MLPs only): `blocks.{l}.hook_mlp_out` patched at one
    /// position.
    pub const MLP_OUT: &str = "mlp_out";
    /// float64 `[L, H]`: one head's `blocks.{l}.attn.hook_z` patched at every position.
    pub const HEAD_OUT: &str = "head_out";
    /// int64 `[N, 2]`: the (clean, donor) problem indices of each pair.
    pub const SOURCE: &str = "source";
    /// int64 `[N]`: the clean answer value at the slot.
    pub const CLEAN_ANSWER: &str = "clean_answer";
    /// int64 `[N]`: the corrupted answer value at the slot.
    pub const CORRUPTED_ANSWER: &str = "corrupted_answer";
}

/// The attention of one problem or token sequence: `hyperlens attention --out` and `report`'s
/// `codes/<name>_attention.npz`.
pub mod attention {
    /// float32 `[L, H, T, T]` (`[layer, head, query, key]`): the normalised attention.
    pub const PATTERN: &str = "pattern";
    /// int64 `[T]`: the token ids (`attention`), or the value each SRAVEN token shows, -1 for a
    /// query token (`report`).
    pub const TOKENS: &str = "tokens";
    /// int64 `[F]` (`report` only): the answer values.
    pub const TARGET: &str = "target";
    /// int64 `[F]` (`report` only): the model's predicted answer values.
    pub const PREDICTION: &str = "prediction";
    /// int64 `[F]` (`report` only): the rule of each feature slot.
    pub const RULES: &str = "rules";
}

/// `hyperlens eval --save-logits`.
pub mod logits {
    /// float32 `[N, F, M]`: the logits of every answer slot.
    pub const LOGITS: &str = "logits";
    /// int64 `[N, F]`: the predicted values (argmax of the logits).
    pub const PRED: &str = "pred";
    /// int64 `[N, F]`: the answer values.
    pub const Y: &str = "y";
}

/// `eigenvalues.npz` of `hyperlens circuits`.
pub mod eigenvalues {
    /// float64 `[L, H, d_head]`: real parts of the OV-circuit eigenvalues (descending modulus).
    pub const OV_RE: &str = "ov_re";
    /// float64 `[L, H, d_head]`: imaginary parts of the OV-circuit eigenvalues.
    pub const OV_IM: &str = "ov_im";
    /// float64 `[L, H, d_head]`: real parts of the full-OV-circuit (`W_E W_OV W_U`) eigenvalues.
    pub const FULL_OV_RE: &str = "full_ov_re";
    /// float64 `[L, H, d_head]`: imaginary parts of the full-OV-circuit eigenvalues.
    pub const FULL_OV_IM: &str = "full_ov_im";
    /// float64 `[L, H]`: OV copying score `Re(sum λ) / sum |λ|`.
    pub const OV_COPYING: &str = "ov_copying";
    /// float64 `[L, H]`: full-OV copying score.
    pub const FULL_OV_COPYING: &str = "full_ov_copying";
}

/// `composition_{q,k,v}.npz` of `hyperlens circuits`.
pub mod composition {
    /// float64 `[L, H, L, H]`: the composition score of writer head `[l1, h1]` into reader head
    /// `[l2, h2]` (zero where `l1 >= l2`).
    pub const SCORES: &str = "scores";
    /// float64 `[samples]`, sorted: the scores of random matrix pairs (the baseline).
    pub const BASELINE: &str = "baseline";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pca_names() {
        assert_eq!(pca::name(pca::PROJECTION_PREFIX, Some(2)), "layer2");
        assert_eq!(pca::name(pca::PROJECTION_PREFIX, None), "all");
        for layer in [None, Some(0), Some(12)] {
            assert_eq!(pca::parse_selection(&pca::selection(layer)), Some(layer));
        }
        for bad in ["layer", "layer01", "layer+1", "layer-1", "Layer1", "all_"] {
            assert_eq!(pca::parse_selection(bad), None, "{bad}");
        }
        assert_eq!(
            pca::name(pca::COMPONENTS_PREFIX, Some(0)),
            "components_layer0"
        );
        assert_eq!(
            pca::name(pca::EXPLAINED_VARIANCE_RATIO_PREFIX, None),
            "explained_variance_ratio_all"
        );
        assert_eq!(pca::name(projections::PCA_PREFIX, Some(1)), "pca_layer1");
        assert_eq!(pca::name(projections::PCA_PREFIX, None), "pca_all");
    }
}
