//! The aggregate's numbers and sentences as text.

use crate::data::Group;
use crate::words::md_escape;

/// A number as short as it is exact (`0.0003` -> `3e-4`).
pub(crate) fn num(f: f64) -> String {
    let plain = format!("{f}");
    let exp = format!("{f:e}");
    if exp.len() < plain.len() {
        exp
    } else {
        plain
    }
}

/// `0.712 ± 0.031 (3)`, `0.712 (1)`, or `-`.
pub(crate) fn stat_text(stat: Option<(f64, f64, usize)>, pct: bool) -> String {
    let scale = if pct { 100.0 } else { 1.0 };
    match stat {
        Some((m, s, n)) if m.is_finite() && s.is_finite() => {
            if pct {
                format!("{:.1} ± {:.1} % ({n})", m * scale, s * scale)
            } else {
                format!("{m:.3} ± {s:.3} ({n})")
            }
        }
        Some((m, _, n)) if m.is_finite() => {
            if pct {
                format!("{:.1} % ({n})", m * scale)
            } else {
                format!("{m:.3} ({n})")
            }
        }
        _ => "-".into(),
    }
}

/// A sentence on a sweep figure: the best and worst group on the metric.
pub(crate) fn sweep_text(groups: &[&Group], axis: &str, metric: &str, label: &str) -> String {
    let scored: Vec<(&Group, f64)> = groups
        .iter()
        .filter_map(|g| g.stat(metric).map(|(m, ..)| (*g, m)))
        .filter(|(_, m)| m.is_finite())
        .collect();
    let (Some(best), Some(worst)) = (
        scored.iter().max_by(|a, b| a.1.total_cmp(&b.1)),
        scored.iter().min_by(|a, b| a.1.total_cmp(&b.1)),
    ) else {
        return String::new();
    };
    format!(
        "Across {axis}, the highest mean {label} is {:.3} ({}), the lowest {:.3} ({}); error bars are one standard error over seeds (none for a single seed).",
        best.1,
        md_escape(&best.0.label),
        worst.1,
        md_escape(&worst.0.label)
    )
}
