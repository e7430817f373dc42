//! The latent codes of one batch of fuzzy-logic sequences in memory, with the task's terms as
//! labels: the rows of a logic codes file ([`crate::extract_logic`]) without the file, for callers
//! that keep them (the Python front's `Model.latent_codes`), as [`crate::extract::code_rows`] is
//! for SRAVEN.

use std::ops::Range;

use hyperlens_model::{CodeSite, Evaluator, Reads};
use hyperlens_tasks::logic::LogicBatch;
use ndarray::s;

use crate::error::{ProbeError, Result};
use crate::logic::{check_fits, check_site};

/// The rows of a logic codes file for one batch of B sequences, flat in row-major order.
///
/// # Shapes
/// `codes` `[B, L', H, 1, K]` (layers read, heads, the query, the keys), `terms` `[B, Kt, Lv]`,
/// `term_ids` `[B, Kt]`, `target`, `prediction` and `problem` `[B]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogicRows {
    /// The codes, float32 `[B, L', H, 1, K]`.
    pub codes: Vec<f32>,
    /// The task's terms as bits, `[B, Kt, Lv]`.
    pub terms: Vec<i64>,
    /// The task's term indices, `[B, Kt]`.
    pub term_ids: Vec<i64>,
    /// The last token's target, `[B]`.
    pub target: Vec<f32>,
    /// The model's prediction of the last token's target, `[B]`.
    pub prediction: Vec<f32>,
    /// The sequence's index in the set, `[B]`.
    pub problem: Vec<i64>,
}

impl LogicRows {
    /// Appends `other`'s rows after these.
    pub fn extend(&mut self, other: LogicRows) {
        self.codes.extend(other.codes);
        self.terms.extend(other.terms);
        self.term_ids.extend(other.term_ids);
        self.target.extend(other.target);
        self.prediction.extend(other.prediction);
        self.problem.extend(other.problem);
    }
}

/// The codes of the logic model of `ev` at `site` for `layers` on the sequences `rows` of `batch`
/// ([`Evaluator::read`], one pass), with their labels: the rows [`crate::extract_logic`] writes,
/// sequence `rows.start` of the batch numbered `first_problem + rows.start`.
///
/// # Shapes
/// `batch.x [B, T, Lv + 1]`, `y [B]`, `terms [B, Kt, Lv]`, `term_ids [B, Kt]`; `rows` within
/// `0..B`; see [`LogicRows`] (one row per sequence of `rows`).
///
/// # Errors
/// [`ProbeError::InvalidInput`] for a site outside the sequence or without a key, a batch that
/// does not fit the model or rows outside it; the evaluator's errors (an empty, repeated or
/// out-of-range layer list).
pub fn logic_code_rows(
    ev: &Evaluator,
    batch: &LogicBatch,
    rows: Range<usize>,
    layers: &[usize],
    site: &CodeSite,
    first_problem: usize,
) -> Result<LogicRows> {
    let cfg = ev.config();
    check_site(site, cfg.n_tokens)?;
    check_fits(batch, cfg)?;
    let b = batch.x.dim().0;
    if rows.start > rows.end || rows.end > b {
        return Err(ProbeError::InvalidInput(format!(
            "rows {rows:?} of a batch of {b} sequences"
        )));
    }
    let (start, end) = (rows.start, rows.end);
    let sites = [site.clone()];
    let reads = Reads {
        sites: &sites,
        layers,
        resid_pre: false,
    };
    let read = ev.read(batch.x.slice(s![start..end, .., ..]), &reads)?;
    Ok(LogicRows {
        codes: read.codes,
        terms: batch
            .terms
            .slice(s![start..end, .., ..])
            .iter()
            .map(|&v| i64::from(v))
            .collect(),
        term_ids: batch
            .term_ids
            .slice(s![start..end, ..])
            .iter()
            .map(|&v| i64::from(v))
            .collect(),
        target: batch.y.slice(s![start..end]).to_vec(),
        prediction: read.logits,
        problem: (first_problem + start..first_problem + end)
            .map(|p| p as i64)
            .collect(),
    })
}
