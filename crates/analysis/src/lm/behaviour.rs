//! Behaviour before codes (issue 47, item 5): the model's accuracy per combination of the factors,
//! and which combinations an analysis keeps (those the model solves at `min_accuracy` or better).

use std::collections::BTreeMap;

use serde::Serialize;

use super::set::LmCodeSet;
use crate::error::{AnalysisError, Result};
use crate::table::{Column, Table};

/// One combination of the factors' values (value indices in the sidecar's factor order, -1 for a
/// prompt without that label) and the model's behaviour on its prompts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Combination {
    /// The value of each factor, as text (`-` for no label), in the sidecar's factor order.
    pub values: Vec<String>,
    /// The value index of each factor (-1 for no label).
    pub indices: Vec<i64>,
    /// Prompts of the combination.
    pub n_prompts: usize,
    /// Of them, in the train split.
    pub n_train: usize,
    /// Of them, in the test split.
    pub n_test: usize,
    /// Prompts the model answered correctly (None without a `correct` array).
    pub n_correct: Option<usize>,
    /// `n_correct / n_prompts` (None without a `correct` array).
    pub accuracy: Option<f64>,
    /// Whether the analysis keeps the combination's prompts.
    pub kept: bool,
}

/// The behaviour table of a code set and the rows it keeps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LmBehaviour {
    /// The factor names, in the sidecar's order (the columns of `values`).
    pub factors: Vec<String>,
    /// One entry per combination present, in ascending order of the value indices.
    pub combinations: Vec<Combination>,
    /// The threshold used (None: every combination kept).
    pub min_accuracy: Option<f64>,
    /// Whether the file had a `correct` array.
    pub has_correct: bool,
    /// Combinations dropped (accuracy below `min_accuracy`).
    pub n_dropped_combinations: usize,
    /// Prompts of the dropped combinations.
    pub n_dropped_prompts: usize,
    /// How the rows were chosen, in words.
    pub note: String,
    /// Whether each prompt is kept. # Shapes: `[N]`.
    #[serde(skip)]
    pub kept: Vec<bool>,
}

/// Groups the prompts of `set` by the combination of all their factors, scores the model's
/// accuracy (from `correct`) on each, and keeps the combinations with accuracy `>= min_accuracy`.
/// Without a threshold, or without a `correct` array, every combination is kept (and `note`
/// says which).
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for a threshold outside `[0, 1]`.
pub fn behaviour(set: &LmCodeSet, min_accuracy: Option<f64>) -> Result<LmBehaviour> {
    if let Some(t) = min_accuracy {
        if !(0.0..=1.0).contains(&t) {
            return Err(AnalysisError::InvalidInput(format!(
                "min_accuracy must be in [0, 1], got {t}"
            )));
        }
    }
    let factors = set.factors();
    let correct = set.correct();
    let mut groups: BTreeMap<Vec<i64>, Vec<usize>> = BTreeMap::new();
    for i in 0..set.n_prompts() {
        groups.entry(factors.row(i).to_vec()).or_default().push(i);
    }
    let defs = &set.sidecar().factors;
    let mut kept = vec![true; set.n_prompts()];
    let mut combinations = Vec::with_capacity(groups.len());
    let (mut n_dropped_combinations, mut n_dropped_prompts) = (0, 0);
    for (indices, rows) in groups {
        let n_correct = correct.map(|c| rows.iter().filter(|&&i| c[i]).count());
        let accuracy = n_correct.map(|c| c as f64 / rows.len() as f64);
        let keep = match (accuracy, min_accuracy) {
            (Some(a), Some(t)) => a >= t,
            _ => true,
        };
        if !keep {
            n_dropped_combinations += 1;
            n_dropped_prompts += rows.len();
            for &i in &rows {
                kept[i] = false;
            }
        }
        let n_test = rows.iter().filter(|&&i| set.split()[i] == 1).count();
        combinations.push(Combination {
            values: indices
                .iter()
                .zip(defs)
                .map(|(&v, f)| {
                    usize::try_from(v)
                        .ok()
                        .and_then(|v| f.values.get(v))
                        .cloned()
                        .unwrap_or_else(|| "-".to_string())
                })
                .collect(),
            indices,
            n_prompts: rows.len(),
            n_train: rows.len() - n_test,
            n_test,
            n_correct,
            accuracy,
            kept: keep,
        });
    }
    let note = match (min_accuracy, correct.is_some()) {
        (None, _) => "no min_accuracy: every combination kept".to_string(),
        (Some(_), false) => {
            "the file has no `correct` array: every combination kept (no behaviour to filter on)"
                .to_string()
        }
        (Some(t), true) => format!(
            "kept the combinations the model answers with accuracy >= {t}: dropped \
             {n_dropped_combinations} of {} combinations ({n_dropped_prompts} prompts)",
            combinations.len()
        ),
    };
    Ok(LmBehaviour {
        factors: defs.iter().map(|f| f.name.clone()).collect(),
        combinations,
        min_accuracy,
        has_correct: correct.is_some(),
        n_dropped_combinations,
        n_dropped_prompts,
        note,
        kept,
    })
}

impl LmBehaviour {
    /// The table `behaviour.csv`: one row per combination, a text column per factor, then
    /// `n_prompts`, `n_train`, `n_test`, `n_correct` and `accuracy` (empty without `correct`)
    /// and `kept`.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if a factor name or value would need quoting in CSV.
    pub fn table(&self) -> Result<Table> {
        let mut t = Table::new();
        for (j, name) in self.factors.iter().enumerate() {
            t.push(
                name.clone(),
                Column::Text(
                    self.combinations
                        .iter()
                        .map(|c| c.values[j].clone())
                        .collect(),
                ),
            )?;
        }
        let ints = |f: fn(&Combination) -> usize| {
            Column::Int(self.combinations.iter().map(|c| f(c) as i64).collect())
        };
        t.push("n_prompts", ints(|c| c.n_prompts))?;
        t.push("n_train", ints(|c| c.n_train))?;
        t.push("n_test", ints(|c| c.n_test))?;
        t.push(
            "n_correct",
            Column::MaybeInt(
                self.combinations
                    .iter()
                    .map(|c| c.n_correct.map(|v| v as i64))
                    .collect(),
            ),
        )?;
        t.push(
            "accuracy",
            Column::MaybeFloat(self.combinations.iter().map(|c| c.accuracy).collect()),
        )?;
        t.push(
            "kept",
            Column::Bool(self.combinations.iter().map(|c| c.kept).collect()),
        )?;
        Ok(t)
    }
}
