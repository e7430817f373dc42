//! The input variants of a logic problem set (the paper's callback sets): the training distribution,
//! one query for every sequence, or one context for every sequence, with the targets recomputed for
//! each sequence's task (docs/spec/sraven.md, last section; the authors' `hyla/data/logic.py`).

use ndarray::{Array2, ArrayView2};
use rand::Rng;

use super::{fuzzy_value, LogicBatch, LogicParams};
use crate::error::{Result, TasksError};
use crate::rng::{self, Domain};

/// The fixed query of seed `seed`: `L` values uniform in [0, 1), the same for every set (so that
/// codes of the ID and the held-out tasks are taken at one query).
///
/// # Shapes
/// Returns `[L]`.
pub fn fixed_query(params: &LogicParams, seed: u64) -> Vec<f32> {
    let mut rng = rng::stream(seed, Domain::LogicFixedQuery, 0, 0);
    (0..params.variables).map(|_| rng.gen::<f32>()).collect()
}

/// Gives every sequence of `batch` the same query: the last token's `L` inputs become `query`, and
/// its target (`y` and the last column of `targets`) is recomputed for each sequence's task. The
/// context tokens are left as they are, so the latent codes of a fixed-query set differ only by
/// the task and the context (a "fixed query" set for decoding the task's terms).
///
/// # Shapes
/// `query [L]` with values in [0, 1].
///
/// # Errors
/// [`TasksError::InvalidInput`] if `query` has another length than `L`, holds a value outside
/// [0, 1], or the batch is malformed.
pub fn fix_query(batch: &mut LogicBatch, query: &[f32]) -> Result<()> {
    let (b, n, d) = batch.x.dim();
    let l = d.saturating_sub(1);
    if query.len() != l || n == 0 {
        return Err(TasksError::input(
            "query",
            format!(
                "{} values for {l} variables (sequences of {n} tokens)",
                query.len()
            ),
        ));
    }
    if query.iter().any(|v| !(0.0..=1.0).contains(v)) {
        return Err(TasksError::input(
            "query",
            "values must lie in [0, 1]".to_string(),
        ));
    }
    let q = ndarray::ArrayView1::from(query);
    for i in 0..b {
        for (v, &x) in query.iter().enumerate() {
            batch.x[[i, n - 1, v]] = x;
        }
        let f = fuzzy_value(batch.terms.index_axis(ndarray::Axis(0), i), q)?;
        batch.y[i] = f;
        batch.targets[[i, n - 1]] = f;
    }
    Ok(())
}

/// The fixed context of seed `seed`: `T - 1` context inputs of `L` values uniform in [0, 1), the
/// same for every sequence and every set (the paper's `fixed_context` callback set: the tasks'
/// codes are then taken on one context, and differ only by the task and the query).
///
/// # Shapes
/// Returns `[T - 1, L]` (`T` = `params.samples`).
pub fn fixed_context(params: &LogicParams, seed: u64) -> Array2<f32> {
    let mut rng = rng::stream(seed, Domain::LogicFixedContext, 0, 0);
    let (t, l) = (params.samples.saturating_sub(1), params.variables);
    Array2::from_shape_simple_fn((t, l), || rng.gen::<f32>())
}

/// Gives every sequence of `batch` the same context: the inputs of the first `T - 1` tokens become
/// `context`, and their targets (the last input column and `targets`) are recomputed for each
/// sequence's task. The query and its target are left as they are.
///
/// # Shapes
/// `context [T - 1, L]` with values in [0, 1].
///
/// # Errors
/// [`TasksError::InvalidInput`] if `context` is not `[T - 1, L]`, holds a value outside [0, 1], or
/// the batch is malformed.
pub fn fix_context(batch: &mut LogicBatch, context: ArrayView2<f32>) -> Result<()> {
    let (b, n, d) = batch.x.dim();
    let l = d.saturating_sub(1);
    if n == 0 || context.dim() != (n - 1, l) {
        return Err(TasksError::input(
            "context",
            format!(
                "{:?} values for {} context tokens of {l} variables",
                context.shape(),
                n.saturating_sub(1)
            ),
        ));
    }
    if context.iter().any(|v| !(0.0..=1.0).contains(v)) {
        return Err(TasksError::input(
            "context",
            "values must lie in [0, 1]".to_string(),
        ));
    }
    for i in 0..b {
        let terms = batch.terms.index_axis(ndarray::Axis(0), i).to_owned();
        for (t, row) in context.outer_iter().enumerate() {
            let f = fuzzy_value(terms.view(), row)?;
            for (v, &x) in row.iter().enumerate() {
                batch.x[[i, t, v]] = x;
            }
            batch.x[[i, t, l]] = f;
            batch.targets[[i, t]] = f;
        }
    }
    Ok(())
}

/// The inputs of a logic problem set: the training distribution, or one of the paper's callback
/// variants that hold part of every sequence fixed.
#[derive(Debug, Clone, PartialEq)]
pub enum LogicInputs {
    /// Every token's inputs drawn afresh (the training and evaluation distribution).
    Uniform,
    /// One query for every sequence ([`fixed_query`], [`fix_query`]), `[L]`.
    FixedQuery(Vec<f32>),
    /// One context for every sequence ([`fixed_context`], [`fix_context`]), `[T - 1, L]`.
    FixedContext(Array2<f32>),
}

impl LogicInputs {
    /// Applies the variant to a batch drawn from the uniform distribution.
    ///
    /// # Errors
    /// As [`fix_query`] / [`fix_context`].
    pub fn apply(&self, batch: &mut LogicBatch) -> Result<()> {
        match self {
            LogicInputs::Uniform => Ok(()),
            LogicInputs::FixedQuery(q) => fix_query(batch, q),
            LogicInputs::FixedContext(c) => fix_context(batch, c.view()),
        }
    }

    /// The name of the variant: `uniform`, `fixed_query` or `fixed_context` (the paper's names).
    pub fn name(&self) -> &'static str {
        match self {
            LogicInputs::Uniform => "uniform",
            LogicInputs::FixedQuery(_) => "fixed_query",
            LogicInputs::FixedContext(_) => "fixed_context",
        }
    }
}
