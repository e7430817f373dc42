//! The latent codes of one batch of fuzzy-logic sequences in memory, with the task's terms as
//! labels: the rows of a logic codes file ([`crate::extract_logic`]) without the file, for callers
//! that keep them (the Python front's `Model.latent_codes`), as [`crate::extract::code_rows`] is
//! for SRAVEN.

use hyperlens_model::{CodeSite, Evaluator, Reads};
use hyperlens_tasks::logic::LogicBatch;

use crate::error::{ProbeError, Result};
use crate::logic::LogicSite;

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

/// The codes of the logic model of `ev` at `site` for `layers` on the sequences of `batch`
/// ([`Evaluator::read`], one pass), with their labels: the rows [`crate::extract_logic`] writes,
/// the first sequence numbered `first_problem`.
///
/// # Shapes
/// `batch.x [B, T, Lv + 1]`, `y [B]`, `terms [B, Kt, Lv]`, `term_ids [B, Kt]`; see [`LogicRows`].
///
/// # Errors
/// [`ProbeError::InvalidInput`] for a site outside the sequence or without a key, or a batch that
/// does not fit the model; the evaluator's errors (an empty, repeated or out-of-range layer list).
pub fn logic_code_rows(
    ev: &Evaluator,
    batch: &LogicBatch,
    layers: &[usize],
    site: &LogicSite,
    first_problem: usize,
) -> Result<LogicRows> {
    let cfg = ev.config();
    let t = cfg.n_tokens;
    if site.keys.is_empty() || site.query >= t || site.keys.iter().any(|&k| k >= t) {
        return Err(ProbeError::InvalidInput(format!(
            "site query {} keys {:?}: positions must be below the model's {t} tokens, with at \
             least one key",
            site.query, site.keys
        )));
    }
    let (b, bt, d) = batch.x.dim();
    let kt = batch.terms.dim().1;
    if bt != t
        || d != cfg.d_in
        || batch.y.len() != b
        || batch.terms.dim().0 != b
        || batch.term_ids.dim() != (b, kt)
        || cfg.d_out != 1
    {
        return Err(ProbeError::InvalidInput(format!(
            "logic batch x {:?}, y [{}], terms {:?} does not fit the model (T {t}, input {}, \
             output {})",
            batch.x.shape(),
            batch.y.len(),
            batch.terms.shape(),
            cfg.d_in,
            cfg.d_out
        )));
    }
    let sites = [CodeSite {
        query: site.query,
        keys: site.keys.clone(),
    }];
    let reads = Reads {
        sites: &sites,
        layers,
        resid_pre: false,
    };
    let read = ev.read(batch.x.view(), &reads)?;
    Ok(LogicRows {
        codes: read.codes,
        terms: batch.terms.iter().map(|&v| i64::from(v)).collect(),
        term_ids: batch.term_ids.iter().map(|&v| i64::from(v)).collect(),
        target: batch.y.to_vec(),
        prediction: read.logits,
        problem: (first_problem..first_problem + b)
            .map(|p| p as i64)
            .collect(),
    })
}
