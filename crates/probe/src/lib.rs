//! hyperlens-probe: extraction of latent codes (the attention scores of all heads for selected
//! query-key pairs, docs/spec/latent-codes.md) from a checkpoint over a problem set, streamed in batches to
//! `.npz` with labels and a JSON sidecar: SRAVEN problems labelled by rule ([`extract()`]), fuzzy-logic
//! sequences labelled by the task's terms ([`extract_logic`]). This is the only crate that sees both candle tensors and
//! host arrays.

pub mod ablation;
pub mod cache;
pub mod circuits;
pub mod error;
pub mod evaluation;
pub mod extract;
pub mod findings;
pub mod held_sets;
pub mod info;
pub mod inputs;
pub mod lm_transplant;
pub mod logic;
pub mod logic_probe;
pub mod logic_rows;
pub mod npz_stream;
pub mod patch_files;
pub mod patching;
pub mod prompts;
pub mod site;
pub mod transplant;

pub use ablation::{ablation_table, head_ablation, Ablation, AblationReport, HeadAblation};
pub use cache::{cache_activations, cache_lm_activations, CacheParams, CacheSummary};
pub use error::{ProbeError, Result};
pub use evaluation::{evaluate_problems, write_logits};
pub use extract::{extract, ProbeMeta, ProbeParams, ProbeSummary};
pub use findings::{HeadValue, TransplantLine, TransplantSummary};
pub use held_sets::{sample_held, sample_id_ood, sample_patched};
pub use info::{checkpoint_info, CheckpointInfo, TensorStats};
pub use inputs::{
    cache_problems, extract_problems, LogicSequences, RepeatedProblems, SravenProblems,
    TaskProblems,
};
pub use lm_transplant::{
    lm_transplant, lm_transplant_table, write_lm_transplant, LmTransplant, LmTransplantKind,
    LmTransplantParams, LmTransplantRow,
};
pub use logic::{
    describe_inputs, extract_logic, extract_logic_set, GeneratedLogicSet, LogicProbeSummary,
};
pub use logic_probe::{LogicProbe, LogicProbeParams};
pub use logic_rows::{logic_code_rows, LogicRows};
pub use patch_files::{
    transplant_fraction, transplant_table, write_activation_patching, write_dla,
    write_head_ablation, write_transplant, PatchRun, TransplantFractions, TransplantProblems,
};
pub use patching::{
    activation_patching, direct_logit_attribution, dla_table, feature_swap_pairs, patching_table,
    DlaReport, PatchPairs, PatchingReport,
};
pub use prompts::{
    extract_prompts, extract_rows, prompt_inputs, run_prompt_file, PromptFileRun, PromptInputs,
    PromptProbeParams, PromptProbeSources, PromptProbeSummary, PromptRows,
};
pub use site::{Selection, Site};
pub use transplant::{latent_transplant, transplant_site, TransplantKind, TransplantRow};
