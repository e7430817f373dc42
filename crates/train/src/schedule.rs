//! Learning-rate schedule of the paper's training recipe.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// Linear warm-up followed by cosine decay, then constant: the schedule the paper's code builds with
/// `optax.warmup_cosine_decay_schedule(init 0, peak, warmup_steps W, decay_steps total - W, end)`.
///
/// optax counts the warm-up inside `decay_steps`, so the cosine runs from step `W` to step `total - W`
/// and the last `W` steps run at `end` (docs/spec/models.md, "Training recipe"). Step numbers are 0-based update counts: the first update uses
/// `lr(0) = 0`, as in optax.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WarmupCosine {
    /// Peak learning rate reached at the end of warm-up.
    pub peak: f64,
    /// Number of linear warm-up steps `W`.
    pub warmup: u64,
    /// Total number of training steps.
    pub total: u64,
    /// Final learning rate as a fraction of `peak` (0.1 in the paper).
    pub end_fraction: f64,
}

impl WarmupCosine {
    /// The paper's schedule for `total` steps: peak `lr`, warm-up `warmup`, end at 0.1 x peak.
    pub fn paper(lr: f64, warmup: u64, total: u64) -> Self {
        Self {
            peak: lr,
            warmup,
            total,
            end_fraction: 0.1,
        }
    }

    /// Validates the parameters once.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] if the peak is not positive and finite, the end fraction is outside
    /// [0, 1], or the total is zero.
    pub fn check(&self) -> Result<()> {
        if !(self.peak.is_finite() && self.peak > 0.0) {
            return Err(TrainError::InvalidParam(format!(
                "learning rate must be positive, got {}",
                self.peak
            )));
        }
        if !(0.0..=1.0).contains(&self.end_fraction) {
            return Err(TrainError::InvalidParam(format!(
                "end fraction must be in [0, 1], got {}",
                self.end_fraction
            )));
        }
        if self.total == 0 {
            return Err(TrainError::InvalidParam("steps must be at least 1".into()));
        }
        Ok(())
    }

    /// Learning rate used by update number `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        let end = self.peak * self.end_fraction;
        if step < self.warmup {
            return self.peak * step as f64 / self.warmup as f64;
        }
        let decay_end = self.total.saturating_sub(self.warmup);
        if step >= decay_end {
            return end;
        }
        let progress = (step - self.warmup) as f64 / (decay_end - self.warmup) as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        end + (self.peak - end) * cosine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_schedule_points() {
        // Samples of optax.warmup_cosine_decay_schedule(0, 1e-3, 1000, 155_250, 1e-4).
        let s = WarmupCosine::paper(1e-3, 1000, 156_250);
        assert_eq!(s.lr(0), 0.0);
        assert!((s.lr(500) - 5e-4).abs() < 1e-15);
        assert!((s.lr(1000) - 1e-3).abs() < 1e-15);
        // Half-way through the cosine: end + (peak - end) / 2.
        let mid = 1000 + (155_250 - 1000) / 2;
        assert!((s.lr(mid) - 5.5e-4).abs() < 1e-9);
        assert!((s.lr(155_250) - 1e-4).abs() < 1e-15);
        assert!((s.lr(156_249) - 1e-4).abs() < 1e-15);
        // Monotone decay after warm-up.
        let mut last = s.lr(1000);
        for step in (1001..155_250).step_by(997) {
            let lr = s.lr(step);
            assert!(lr <= last);
            last = lr;
        }
    }

    #[test]
    fn short_runs_are_well_defined() {
        let s = WarmupCosine::paper(1e-3, 1000, 500);
        for step in 0..600 {
            let lr = s.lr(step);
            assert!(lr.is_finite() && (0.0..=1e-3).contains(&lr));
        }
        assert!(WarmupCosine::paper(0.0, 10, 100).check().is_err());
        assert!(WarmupCosine::paper(1e-3, 10, 0).check().is_err());
    }
}
