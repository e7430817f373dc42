//! The study's causal test: the latent-code transplant of
//! [`hyperlens_probe::lm_transplant::lm_transplant`] at the layer where the operation decodes best on held-out
//! combinations (mean over the splits), on the first split: the donors' mean codes per operation
//! come from the seen combinations' prompts the model answers correctly, the targets are the
//! held-out combinations' prompts it answers correctly (at most `transplant_n`, in file order),
//! and the answer under another operation is [`hyperlens_tasks::prompts::icl_answer_under`].

use hyperlens_analysis::lm::LmCodeSet;
use hyperlens_model::lm::{LanguageModel, LmTokenizer};
use hyperlens_probe::lm_transplant::{lm_transplant, LmTransplantParams};
use hyperlens_tasks::prompts::{icl_answer_under, PromptSet, SiteSpec, ICL_SITES};

use super::files::TransplantResult;
use super::measure::{hold_out, IclResult};
use super::{LmStudyParams, OnProgress, StudyProgress};
use crate::error::Result;

/// Runs the transplant (module docs); `None` when no split decoded (no best layer), or when there
/// is no donor or no target.
///
/// # Errors
/// The transplant's and the model's errors; an interruption.
pub fn transplant(
    model: &LanguageModel,
    tok: &LmTokenizer,
    set: &PromptSet,
    codes: &LmCodeSet,
    icl: &IclResult,
    params: &LmStudyParams,
    progress: &mut OnProgress<'_>,
) -> Result<Option<TransplantResult>> {
    let Some(layer) = super::verdict::icl_verdict(icl).best_layer else {
        return Ok(None);
    };
    let (Some(correct), Some(&seed)) = (codes.correct(), params.split_seeds.first()) else {
        return Ok(None);
    };
    let (split, _) = hold_out(set, seed)?;
    let solved = |want: i64| -> Vec<usize> {
        (0..set.len())
            .filter(|&i| split[i] == want && correct[i])
            .collect()
    };
    let donors = solved(0);
    let mut targets = solved(1);
    targets.truncate(params.transplant_n);
    if donors.is_empty() || targets.is_empty() {
        return Ok(None);
    }
    let tp = LmTransplantParams {
        sites: SiteSpec::parse(ICL_SITES)?,
        layers: vec![layer],
        together: false,
        label_factor: "operation".into(),
        donors: donors.clone(),
        targets: targets.clone(),
        seed: params.seed,
        batch: params.batch,
        prepend_bos: None,
    };
    let result = lm_transplant(model, tok, set, &tp, icl_answer_under, |done, total| {
        progress(StudyProgress {
            stage: "transplant",
            done,
            total,
            unit: "steps",
        })
    })?;
    Ok(Some(TransplantResult {
        layer,
        n_targets: targets.len(),
        n_donors: donors.len(),
        transplant: result,
    }))
}
