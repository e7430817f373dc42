//! The fuzzy-logic section of the page: the R² table beside Table A1, the comparison paragraphs,
//! and one subsection per checkpoint with its term-decoding table and figures.

use hyperlens_model::Mixer;

use crate::data::LogicEntry;
use crate::doc::{Document, FigureRef};
use crate::logic::text::{paper_paragraphs, r2_text};
use crate::logic::PAPER_LOGIC_OOD_R2;
use crate::words::{md_escape, steps_text};

/// Adds the fuzzy-logic section to `doc`: the R² table beside Table A1, the comparison paragraphs,
/// then one subsection per checkpoint with its term-decoding table and figures.
pub fn section(
    doc: &mut Document,
    entries: &[LogicEntry],
    figs: &[(Vec<FigureRef>, Option<String>)],
    n: usize,
    seed: u64,
) {
    doc.heading(2, "Fuzzy-logic task");
    doc.paragraph(format!(
        "{} on the fuzzy-logic task (f(x) = max over the task's terms of the min over their literals): the paper's R² (per sequence 1 - (prediction - target)² / var(targets), averaged) on {n} sequences per set (seed {seed}) of the ID tasks, of held-out pairs of known terms (OOD) and of pairs of unknown terms; latent codes of the paper's site (the last token's attention to itself, one value per layer and head) on {n} ID and {n} OOD sequences that all share one fixed query (seed {seed}), labelled by the task's terms.",
        crate::words::count(entries.len(), "checkpoint")
    ));
    let paper = |mixer: Mixer| {
        PAPER_LOGIC_OOD_R2
            .iter()
            .find(|(m, _, _)| *m == mixer)
            .map_or_else(|| "-".into(), |(_, m, s)| format!("{m:.1} ± {s:.1} %"))
    };
    let header = [
        "checkpoint",
        "mixer",
        "split",
        "updates trained",
        "ID R²",
        "OOD R²",
        "unknown-term R²",
        "paper OOD R² (Table A1)",
        "term F1, all layers (base rate)",
    ]
    .map(String::from)
    .to_vec();
    let rows = entries
        .iter()
        .map(|e| {
            vec![
                md_escape(&e.name),
                e.mixer.to_string(),
                md_escape(&e.split.to_string()),
                steps_text(e.steps),
                r2_text(e.r2("id")),
                r2_text(e.r2("ood")),
                r2_text(e.r2("unknown")),
                paper(e.mixer),
                e.all_layers().map_or_else(
                    || "-".into(),
                    |r| format!("{:.3} ({:.3})", r.f1_mean, r.f1_base_rate),
                ),
            ]
        })
        .collect();
    doc.table(header, rows);
    for p in paper_paragraphs(entries) {
        doc.paragraph(p);
    }
    for (e, (f, no_training)) in entries.iter().zip(figs) {
        doc.heading(3, &e.name);
        doc.paragraph(format!(
            "Checkpoint `{}`; fixed query {}.",
            e.dir.display(),
            e.fixed_query
                .iter()
                .map(|v| format!("{v:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let header = [
            "layer",
            "ridge R²",
            "F1 (mean over terms)",
            "F1 base rate",
            "F1 shuffled labels",
            "terms scored",
        ]
        .map(String::from)
        .to_vec();
        let rows = e
            .decoding
            .iter()
            .map(|r| {
                vec![
                    r.layer.map_or_else(|| "all".into(), |l| l.to_string()),
                    format!("{:.3}", r.ridge_r2),
                    format!("{:.3}", r.f1_mean),
                    format!("{:.3}", r.f1_base_rate),
                    format!("{:.3}", r.f1_shuffled),
                    r.n_terms.to_string(),
                ]
            })
            .collect();
        doc.table(header, rows);
        for fig in f {
            doc.figure(fig.clone());
        }
        if let Some(s) = no_training {
            doc.paragraph(s.clone());
        }
        doc.paragraph(format!(
            "Tables: `tables/{0}/term_decoding.csv`, `tables/{0}/projections.npz`; codes: `codes/{0}_id.npz`, `codes/{0}_ood.npz`.",
            e.name
        ));
    }
}
