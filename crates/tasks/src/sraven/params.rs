//! SRAVEN sizes (docs/spec/sraven.md, "Sizes").

use serde::{Deserialize, Serialize};

use crate::error::{Result, TasksError};

/// Sizes of the SRAVEN benchmark. Defaults are the paper's: F = 4 features, M = 8 values, a 3 x 3 grid
/// and 25 % of the tasks held out.
///
/// The rules are defined on rows of three panels, so `grid` must be 3; it is a field so that files and
/// reports state it explicitly.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SravenParams {
    /// F: features per panel (the paper's K). 1..=16.
    pub features: usize,
    /// M: values per feature, 0..M-1; arithmetic is modulo M (the paper's F). 3..=255.
    pub values: usize,
    /// Grid side: 3 (panels 0..7 are the context, panel 8 the answer).
    pub grid: usize,
    /// Fraction of the tasks held out as OOD: `int(n_tasks * holdout_fraction)` tasks. In [0, 1).
    pub holdout_fraction: f64,
}

impl Default for SravenParams {
    fn default() -> Self {
        SravenParams {
            features: 4,
            values: 8,
            grid: 3,
            holdout_fraction: 0.25,
        }
    }
}

impl SravenParams {
    /// Validates the parameters once (linfa style).
    ///
    /// # Errors
    /// [`TasksError::InvalidParam`] naming the field: `features` outside 1..=16, `values` outside
    /// 3..=255 (distribute-three needs 3 distinct symbols; values are stored as `u8`), `grid` != 3, or
    /// `holdout_fraction` outside [0, 1) or leaving no in-distribution task.
    pub fn check(&self) -> Result<()> {
        if !(1..=16).contains(&self.features) {
            return Err(TasksError::param(
                "features",
                format!("{} is not in 1..=16", self.features),
            ));
        }
        if !(3..=255).contains(&self.values) {
            return Err(TasksError::param(
                "values",
                format!(
                    "{} is not in 3..=255 (distribute-three needs 3 distinct symbols)",
                    self.values
                ),
            ));
        }
        if self.grid != 3 {
            return Err(TasksError::param(
                "grid",
                format!(
                    "{} is not supported: the SRAVEN rules are defined on rows of 3 panels",
                    self.grid
                ),
            ));
        }
        if !(self.holdout_fraction.is_finite() && (0.0..1.0).contains(&self.holdout_fraction)) {
            return Err(TasksError::param(
                "holdout_fraction",
                format!("{} is not in [0, 1)", self.holdout_fraction),
            ));
        }
        if self.n_ood_tasks() >= self.n_tasks() {
            return Err(TasksError::param(
                "holdout_fraction",
                "no in-distribution task would remain",
            ));
        }
        Ok(())
    }

    /// Number of panels, grid * grid (9).
    pub fn n_panels(&self) -> usize {
        self.grid * self.grid
    }

    /// Number of context panels, grid * grid - 1 (8).
    pub fn n_context_panels(&self) -> usize {
        self.n_panels() - 1
    }

    /// Number of context tokens, (grid * grid - 1) * F (32).
    pub fn n_context_tokens(&self) -> usize {
        self.n_context_panels() * self.features
    }

    /// Tokens per problem T = (grid * grid - 1) * F + F (36): the context tokens, then F query tokens.
    pub fn n_tokens(&self) -> usize {
        self.n_context_tokens() + self.features
    }

    /// The bytes that a [`ProblemSet`](crate::sraven::ProblemSet) of `n` problems holds: `x` float32
    /// [n, T, M], `y` and `rules` int64 [n, F], `perms` int64 [n, 3, F]; saturating, so that a
    /// hostile `n` cannot wrap around into a small size.
    ///
    /// # Units
    /// Bytes.
    pub fn set_bytes(&self, n: usize) -> u128 {
        let per_problem =
            4 * (self.n_tokens() * self.values) as u128 + 8 * 5 * self.features as u128;
        per_problem.saturating_mul(n as u128)
    }

    /// Number of tasks: multisets of F rules out of 8, C(8 + F - 1, F) (330 for F = 4).
    pub fn n_tasks(&self) -> usize {
        // C(n, k) with n = 8 + F - 1, k = F, computed incrementally (exact in u128 for F <= 16).
        let (n, k) = (
            crate::sraven::Rule::COUNT + self.features - 1,
            self.features,
        );
        let mut c: u128 = 1;
        for i in 0..k {
            c = c * (n - i) as u128 / (i + 1) as u128;
        }
        c as usize
    }

    /// Number of held-out (OOD) tasks, `int(n_tasks * holdout_fraction)` (82 for the defaults), as the
    /// reference code computes it.
    pub fn n_ood_tasks(&self) -> usize {
        (self.n_tasks() as f64 * self.holdout_fraction).floor() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_spec() {
        let p = SravenParams::default();
        p.check().unwrap();
        assert_eq!(p.n_tokens(), 36);
        assert_eq!(p.n_context_tokens(), 32);
        assert_eq!(p.n_tasks(), 330);
        assert_eq!(p.n_ood_tasks(), 82);
        let p5 = SravenParams { features: 5, ..p };
        assert_eq!(p5.n_tasks(), 792);
        assert_eq!(p5.n_tokens(), 45);
    }

    #[test]
    fn bad_params_name_the_field() {
        let p = SravenParams::default();
        for (bad, field) in [
            (SravenParams { features: 0, ..p }, "features"),
            (SravenParams { values: 2, ..p }, "values"),
            (SravenParams { grid: 4, ..p }, "grid"),
            (
                SravenParams {
                    holdout_fraction: 1.0,
                    ..p
                },
                "holdout_fraction",
            ),
            (
                SravenParams {
                    holdout_fraction: f64::NAN,
                    ..p
                },
                "holdout_fraction",
            ),
        ] {
            let e = bad.check().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
