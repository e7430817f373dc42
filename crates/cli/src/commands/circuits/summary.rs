//! `summary.json` of `hyperlens circuits` (the run's inputs, the report's findings, timings) and the
//! lines printed at the end.

use hyperlens_analysis::circuits::{CircuitReport, CompositionKind, NamedHead};
use serde_json::{json, Value};

use super::CircuitsArgs;

/// What the summary says about the run besides the report's findings.
pub(super) struct Inputs<'a> {
    pub args: &'a CircuitsArgs,
    pub kind: String,
    pub vocab: usize,
    pub repeated: usize,
    pub prefix: &'a [u32],
    pub fold: bool,
}

/// The summary: inputs, model sizes, findings ([`CircuitReport::summary`]), and seconds per stage.
pub(super) fn summary(
    inputs: &Inputs<'_>,
    report: &CircuitReport,
    timings: &[(&'static str, f64)],
    wall_s: f64,
) -> anyhow::Result<Value> {
    let Inputs {
        args,
        kind,
        vocab,
        repeated: n,
        prefix,
        fold,
    } = inputs;
    let (n, vocab, fold) = (*n, *vocab, *fold);
    let mut summary = json!({
        "producer": format!("hyperlens {} circuits", env!("CARGO_PKG_VERSION")),
        "checkpoint": args.checkpoint,
        "checkpoint_kind": kind.to_string(),
        "model": {
            "n_layers": report.dims.n_layers, "n_heads": report.dims.n_heads, "d_model": report.dims.d_model,
            "d_head": report.dims.d_qk, "d_vocab": vocab, "norms_folded": fold,
        },
        "inputs": {
            "sequences": args.n_seqs, "repeated_segment": n, "prefix": prefix,
            "tokens_per_sequence": prefix.len() + 2 * n, "seed": args.seed,
            "sampler": "hyperlens_tasks::induction::repeated_random_tokens (uniform over the vocabulary)",
        },
    });
    if let (Some(out), serde_json::Value::Object(findings)) =
        (summary.as_object_mut(), report.summary()?)
    {
        out.extend(findings);
        out.insert(
            "timings_s".into(),
            timings
                .iter()
                .map(|(k, v)| json!({"stage": k, "seconds": v}))
                .collect(),
        );
        out.insert("wall_time_s".into(), json!(wall_s));
    }
    Ok(summary)
}

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
