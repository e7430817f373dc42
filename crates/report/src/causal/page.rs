//! The causal section of the page.

use hyperlens_probe::TransplantKind;

use crate::causal::text::sentences;
use crate::data::Entry;
use crate::doc::{Document, FigureRef};
use crate::words::{md_escape, pct};

/// Writes the section: what was done, the figure with its sentences, the table per checkpoint and
/// layer.
pub fn section(doc: &mut Document, entries: &[Entry], figs: &[FigureRef]) {
    let Some(first) = entries.iter().find_map(|e| e.causal.as_ref()) else {
        return;
    };
    doc.heading(2, "Is the latent code causal?");
    doc.paragraph(format!(
        "On {n} unpermuted OOD problems, the latent code at the paper's site of one layer (query {q}; keys {k1} and {k2}: slot {slot} in the answer's row) is replaced by the mean code of another rule at that site over {n} unpermuted ID problems, and the predicted value of slot {slot} is read: does it become what the donor rule gives on the problem's own panels? Pairs where the donor rule gives no value from the panels, or gives the original answer or the model's own prediction, are left out. Controls: the problem's own code (identity), a random code of the same norm, the donor code at the slot's keys in the first row, outside the answer's row, and the zero and mean ablations of the code (a zero code; the mean ID code over all rules), which show how much the answer depends on the code at all (`hyperlens patch transplant` runs the same test with more problems).",
        n = first.n,
        slot = first.slot,
        q = first.site.query,
        k1 = first.site.keys[0],
        k2 = first.site.keys[1],
    ));
    let text = sentences(entries);
    if !figs.is_empty() {
        for f in figs {
            doc.figure(f.clone());
        }
    } else {
        for s in &text.summary {
            doc.paragraph(s.clone());
        }
    }
    if !text.per_checkpoint.is_empty() {
        doc.paragraph("Per checkpoint, at the layer where the transplant works best:");
        doc.paragraph(
            text.per_checkpoint
                .iter()
                .map(|s| format!("- {s}"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    let header = [
        "checkpoint",
        "layer",
        "to donor (mean code)",
        "to donor (donor problem)",
        "changed (mean code)",
        "changed (donor at first row)",
        "changed (random code)",
        "changed (zero code)",
        "changed (mean code, all rules)",
        "pairs",
        "identity: largest logit change",
    ]
    .map(String::from)
    .to_vec();
    let mut rows = Vec::new();
    for e in entries {
        let Some(c) = &e.causal else { continue };
        for l in 0..c.layers() {
            let get = |kind: TransplantKind, changed: bool| c.fraction(l, kind, changed);
            rows.push(vec![
                md_escape(&e.name),
                l.to_string(),
                pct(get(TransplantKind::MeanId, false)),
                pct(get(TransplantKind::DonorProblem, false)),
                pct(get(TransplantKind::MeanId, true)),
                pct(get(TransplantKind::OffRow, true)),
                pct(get(TransplantKind::Random, true)),
                pct(get(TransplantKind::ZeroAblation, true)),
                pct(get(TransplantKind::MeanAblation, true)),
                c.row(l, TransplantKind::MeanId)
                    .map_or(0, |r| r.n)
                    .to_string(),
                format!(
                    "{:.1e}",
                    c.row(l, TransplantKind::Identity)
                        .map_or(f64::NAN, |r| r.max_logit_change)
                ),
            ]);
        }
    }
    doc.table(header, rows);
    doc.paragraph("Table: `tables/causal.csv`.");
}
