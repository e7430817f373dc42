//! The lines `hyperlens circuits` prints at the end (its `summary.json` is
//! `hyperlens_probe::circuits::CircuitSummary`).

use hyperlens_analysis::circuits::{CircuitReport, CompositionKind, NamedHead};

/// The lines printed at the end: the named heads and the strongest pair.
pub(super) fn print_findings(report: &CircuitReport) -> anyhow::Result<()> {
    let names = |v: &[NamedHead]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            let v: Vec<String> = v
                .iter()
                .map(|h| format!("{} ({:.2})", h.label(), h.score))
                .collect();
            v.join(", ")
        }
    };
    let cut = report.params.threshold;
    outln!(
        "induction heads (>= {cut}): {}",
        names(&report.induction_heads)
    )?;
    outln!(
        "previous-token heads (>= {cut}): {}",
        names(&report.previous_token_heads)
    )?;
    if let Some(p) = &report.strongest_pair {
        let k_p99 = report.baseline.percentile(CompositionKind::K, 99.0)?;
        outln!(
            "strongest pair: {} -> {}: K-composition {:.3} (baseline percentile {:.1}, p99 {k_p99:.3})",
            p.previous_token.label(),
            p.induction.label(),
            p.k_composition,
            p.baseline_percentile,
        )?;
    }
    Ok(())
}
