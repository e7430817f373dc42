//! The transplant test of one checkpoint: the only part of the causal section that runs the model.

use std::ops::ControlFlow;

use hyperlens_model::Evaluator;
use hyperlens_probe::{latent_transplant, transplant_site};
use hyperlens_tasks::sraven::{sample, Set, Split};

use crate::data::CausalResult;
use crate::error::Result;

/// Runs the transplant test on `model` with `n` unpermuted ID and OOD problems of `split` (seed
/// `seed`), at the last answer slot, in batches of `batch`; `progress(done, total)` after each step
/// of the transplant (its `ControlFlow::Break` stops it).
///
/// # Errors
/// Sampling and transplant errors; the transplant's interruption.
pub(crate) fn run(
    model: &Evaluator,
    split: &Split,
    n: usize,
    seed: u64,
    batch: usize,
    progress: &mut dyn FnMut(usize, usize) -> ControlFlow<()>,
) -> Result<CausalResult> {
    let cfg = model.config();
    let slot = cfg.n_outputs - 1;
    let id = sample(split, Set::Id, n, seed, true)?;
    let ood = sample(split, Set::Ood, n, seed, true)?;
    let rows = latent_transplant(model, &id, &ood, slot, batch, seed, progress)?;
    Ok(CausalResult {
        n,
        slot,
        site: transplant_site(cfg, slot),
        values: cfg.d_in,
        rows,
    })
}
