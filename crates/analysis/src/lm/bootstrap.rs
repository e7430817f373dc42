//! Percentile bootstrap confidence interval of an accuracy over test items (Efron & Tibshirani
//! 1993, ch. 13): resample the items with replacement, score each resample, take the empirical
//! quantiles (linear interpolation between order statistics, numpy's default `percentile`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{AnalysisError, Result};

/// The percentile-bootstrap interval of the mean of `hits` (an accuracy) at confidence `level`,
/// from `n_resamples` resamples of the items drawn with a ChaCha8 generator seeded with `seed`
/// (the same seed resamples the same items, so intervals of several probes on one test set are
/// paired).
///
/// # Shapes
/// `hits`: `[N_test]`, whether each test item was decoded correctly.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for no items, no resamples or a level outside (0, 1).
pub fn bootstrap_accuracy_ci(
    hits: &[bool],
    n_resamples: usize,
    level: f64,
    seed: u64,
) -> Result<(f64, f64)> {
    let n = hits.len();
    if n == 0 {
        return Err(AnalysisError::InvalidInput(
            "bootstrap: no test items".into(),
        ));
    }
    if n_resamples == 0 {
        return Err(AnalysisError::InvalidInput(
            "bootstrap: n_resamples must be at least 1".into(),
        ));
    }
    if !(level > 0.0 && level < 1.0) {
        return Err(AnalysisError::InvalidInput(format!(
            "bootstrap: the confidence level must be in (0, 1), got {level}"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut stats: Vec<f64> = (0..n_resamples)
        .map(|_| {
            let k = (0..n).filter(|_| hits[rng.gen_range(0..n)]).count();
            k as f64 / n as f64
        })
        .collect();
    stats.sort_by(f64::total_cmp);
    let alpha = (1.0 - level) / 2.0;
    Ok((quantile(&stats, alpha), quantile(&stats, 1.0 - alpha)))
}

/// The `p`-quantile of sorted values, linear between order statistics (numpy's `linear`).
fn quantile(sorted: &[f64], p: f64) -> f64 {
    let pos = p * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_matches_numpy_linear() {
        // numpy.percentile([1, 2, 3, 4], [2.5, 50, 97.5]) = [1.075, 2.5, 3.925]
        let v = [1.0, 2.0, 3.0, 4.0];
        assert!((quantile(&v, 0.025) - 1.075).abs() < 1e-12);
        assert!((quantile(&v, 0.5) - 2.5).abs() < 1e-12);
        assert!((quantile(&v, 0.975) - 3.925).abs() < 1e-12);
    }

    #[test]
    fn interval_contains_the_estimate_and_shrinks_with_n() {
        let widths: Vec<f64> = [50usize, 200, 2000]
            .iter()
            .map(|&n| {
                // accuracy 0.7 exactly
                let hits: Vec<bool> = (0..n).map(|i| i % 10 < 7).collect();
                let (lo, hi) = bootstrap_accuracy_ci(&hits, 1000, 0.95, 3).unwrap();
                assert!(lo <= 0.7 && 0.7 <= hi, "n {n}: [{lo}, {hi}]");
                // the binomial standard error sqrt(p (1 - p) / n): a 95% interval is about
                // 2 * 1.96 of them wide
                let se = (0.7f64 * 0.3 / n as f64).sqrt();
                assert!(
                    ((hi - lo) / (2.0 * 1.96 * se) - 1.0).abs() < 0.2,
                    "n {n}: width {} vs {}",
                    hi - lo,
                    2.0 * 1.96 * se
                );
                hi - lo
            })
            .collect();
        assert!(widths[0] > widths[1] && widths[1] > widths[2], "{widths:?}");
        // seeded: the same interval twice
        let hits: Vec<bool> = (0..100).map(|i| i % 3 == 0).collect();
        assert_eq!(
            bootstrap_accuracy_ci(&hits, 500, 0.95, 9).unwrap(),
            bootstrap_accuracy_ci(&hits, 500, 0.95, 9).unwrap()
        );
        assert!(bootstrap_accuracy_ci(&[], 10, 0.95, 0).is_err());
        assert!(bootstrap_accuracy_ci(&hits, 0, 0.95, 0).is_err());
        assert!(bootstrap_accuracy_ci(&hits, 10, 1.0, 0).is_err());
    }
}
