//! `hyperlens eval` on a fuzzy-logic checkpoint: MSE and the paper's R² per set, with the number
//! of sequences whose R² is defined, on a problem file or on sampled sets. `hl`'s logic
//! evaluation counts through [`evaluate_counted`] too.

use std::path::Path;

use hyperlens_model::Evaluator;
use hyperlens_tasks::logic::{logic_chunks, r2, LogicBatch, LogicSet, LogicSplit, LOGIC_SET_CHUNK};
use hyperlens_tasks::npz::load_logic;

use crate::error::{Result, TrainError};
use crate::logic::evaluate_chunks;
use crate::metrics::SetMetrics;
use crate::settings::TrainSettings;

/// One evaluated set.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicSetEval {
    /// The set: its name (`id`, `ood`, ...) or the problem file's path.
    pub set: String,
    /// R² (`metric`), MSE (`loss`) and the sequences (`n`).
    pub metrics: SetMetrics,
    /// The sequences whose R² is defined (whose targets vary), those the R² averages.
    pub n_r2: usize,
}

/// Where the sequences of a logic evaluation come from.
#[derive(Debug, Clone, Copy)]
pub enum LogicEvalSource<'a> {
    /// A problem file (`hyperlens tasks sample --task logic`).
    File(&'a Path),
    /// `n` sequences sampled from `split` with `seed`: of `set`, or of every set of the split
    /// that has tasks.
    Sampled {
        /// The split.
        split: &'a LogicSplit,
        /// One set, or all.
        set: Option<LogicSet>,
        /// Sequences per set.
        n: usize,
        /// The sample's seed.
        seed: u64,
    },
}

/// The sequences of `batch` whose R² is defined: those whose targets vary
/// ([`hyperlens_tasks::logic::r2`] of the targets themselves is finite).
///
/// # Errors
/// As [`hyperlens_tasks::logic::r2`] (inconsistent array lengths).
pub fn r2_defined(batch: &LogicBatch) -> Result<usize> {
    let r = r2(batch.y.view(), batch)?;
    Ok(r.iter().filter(|v| v.is_finite()).count())
}

/// [`evaluate_chunks`] over `chunks`, also counting the sequences whose R² is defined
/// ([`r2_defined`]) as they pass.
///
/// # Errors
/// As [`evaluate_chunks`] and [`r2_defined`].
pub fn evaluate_counted<I>(ev: &Evaluator, chunks: I, batch: usize) -> Result<(SetMetrics, usize)>
where
    I: IntoIterator<Item = Result<LogicBatch>>,
{
    let mut defined = 0usize;
    let chunks = chunks.into_iter().map(|c| {
        let c = c?;
        defined += r2_defined(&c)?;
        Ok(c)
    });
    let m = evaluate_chunks(ev, chunks, batch)?;
    Ok((m, defined))
}

/// Evaluates the logic model `ev` trained with `settings` on `source`, in batches of `batch`:
/// one row for a file, one per set when sampled (in chunks of [`LOGIC_SET_CHUNK`], the sequences
/// `hyperlens tasks sample --task logic` writes).
///
/// # Errors
/// A bad problem file; [`TrainError::InSet`] naming the set around a sampled set's errors; model
/// errors.
pub fn evaluate_logic(
    ev: &Evaluator,
    settings: &TrainSettings,
    source: LogicEvalSource<'_>,
    batch: usize,
) -> Result<Vec<LogicSetEval>> {
    match source {
        LogicEvalSource::File(path) => {
            let set = load_logic(path, &settings.logic.params())?;
            let (metrics, n_r2) = evaluate_counted(ev, std::iter::once(Ok(set)), batch)?;
            Ok(vec![LogicSetEval {
                set: path.display().to_string(),
                metrics,
                n_r2,
            }])
        }
        LogicEvalSource::Sampled {
            split,
            set,
            n,
            seed,
        } => {
            let sets: Vec<LogicSet> = match set {
                Some(s) => vec![s],
                None => LogicSet::ALL
                    .into_iter()
                    .filter(|s| !split.tasks(*s).is_empty())
                    .collect(),
            };
            sets.into_iter()
                .map(|set| {
                    let chunks = logic_chunks(split, set, n, LOGIC_SET_CHUNK, seed)
                        .map(|c| c.map_err(Into::into));
                    let (metrics, n_r2) =
                        evaluate_counted(ev, chunks, batch).map_err(|e| TrainError::InSet {
                            set: set.to_string(),
                            source: Box::new(e),
                        })?;
                    Ok(LogicSetEval {
                        set: set.to_string(),
                        metrics,
                        n_r2,
                    })
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyperlens_tasks::logic::LogicParams;

    #[test]
    fn defined_r2_counts_the_sequences_whose_targets_vary() {
        let split = LogicSplit::new(LogicParams::default(), 0).unwrap();
        let mut c = logic_chunks(&split, LogicSet::Ood, 6, 6, 0)
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(r2_defined(&c).unwrap(), 6);
        // Constant targets in sequence 0: its R² is undefined.
        c.targets.row_mut(0).fill(0.5);
        c.y[0] = 0.5;
        assert_eq!(r2_defined(&c).unwrap(), 5);
    }
}
