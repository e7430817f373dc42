//! TEMP
use super::measure::IclResult;
use super::{LmStudyParams, OnProgress};
use crate::error::Result;
use hyperlens_analysis::lm::LmCodeSet;
use hyperlens_model::lm::{LanguageModel, LmTokenizer};
use hyperlens_tasks::prompts::PromptSet;
pub fn transplant(
    _model: &LanguageModel,
    _tok: &LmTokenizer,
    _set: &PromptSet,
    _codes: &LmCodeSet,
    _icl: &IclResult,
    _params: &LmStudyParams,
    _progress: &mut OnProgress<'_>,
) -> Result<Option<super::files::TransplantResult>> {
    Ok(None)
}
