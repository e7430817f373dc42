//! SRAVEN problem sets that an intervention holds whole in memory (`patch heads` over a sample,
//! `patch acts`, `patch dla`, `patch transplant`): sampled only after their size is checked
//! against the memory budget ([`hyperlens_io::budget`]), naming `--n`.

use hyperlens_io::budget::{bytes_of, check_alloc};
use hyperlens_model::Config;
use hyperlens_tasks::sraven::{sample, ProblemSet, Set, Split};

use crate::error::Result;

/// `n` problems of `set` sampled from `split` with `seed` (unpermuted or not), held in memory.
///
/// # Errors
/// [`crate::ProbeError::Budget`] naming `--n` when `[n, T, M + 4]` float32 values are over the
/// memory budget; the sampler's errors.
pub fn sample_held(
    split: &Split,
    set: Set,
    n: usize,
    seed: u64,
    unpermuted: bool,
    cfg: &Config,
) -> Result<ProblemSet> {
    check_alloc(
        format!("--n {n} (the problems are held in memory)"),
        bytes_of(4, &[n, cfg.n_tokens, cfg.d_in + 4]),
    )?;
    Ok(sample(split, set, n, seed, unpermuted)?)
}

/// `n` unpermuted problems of `set` for activation patching, whose clean and corrupted copies
/// are held in memory beside them.
///
/// # Errors
/// [`crate::ProbeError::Budget`] naming `--n` when `[3n, T, M + 8]` float32 values are over the
/// memory budget; the sampler's errors.
pub fn sample_patched(
    split: &Split,
    set: Set,
    n: usize,
    seed: u64,
    cfg: &Config,
) -> Result<ProblemSet> {
    check_alloc(
        format!("--n {n} (clean and corrupted problems are held in memory)"),
        bytes_of(4, &[3 * n, cfg.n_tokens, cfg.d_in + 8]),
    )?;
    Ok(sample(split, set, n, seed, true)?)
}

/// `n` unpermuted problems of each of `split`'s ID and OOD sets, with the same seed, for the
/// latent transplant.
///
/// # Errors
/// [`crate::ProbeError::Budget`] naming `--n` when `[2n, T, M + 8]` float32 values are over the
/// memory budget; the sampler's errors.
pub fn sample_id_ood(
    split: &Split,
    n: usize,
    seed: u64,
    cfg: &Config,
) -> Result<(ProblemSet, ProblemSet)> {
    check_alloc(
        format!("--n {n} (two problem sets are held in memory)"),
        bytes_of(4, &[2 * n, cfg.n_tokens, cfg.d_in + 8]),
    )?;
    Ok((
        sample(split, Set::Id, n, seed, true)?,
        sample(split, Set::Ood, n, seed, true)?,
    ))
}
