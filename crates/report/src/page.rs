//! The report page as a [`Document`]: the introduction, the summary table and accuracy figure,
//! the comparison with the paper, then one section per checkpoint with its findings, decoding
//! table and figures.

use crate::doc::{Document, FigureRef};
use crate::evaluate::Entry;
use crate::text::{all_layers, count, majority, md_escape, pct};
use crate::verdict::{at_chance, best_layer_cell};
use crate::{paper, ReportParams};

/// The figures of one checkpoint and the sentence said instead of a missing training figure.
pub type CheckpointFigures = (Vec<FigureRef>, Option<String>);

/// The fuzzy-logic checkpoints of the report and their figures (in the same order).
#[derive(Debug, Clone, Copy)]
pub struct LogicPart<'a> {
    /// The checkpoints.
    pub entries: &'a [crate::logic::LogicEntry],
    /// Their figures.
    pub figures: &'a [CheckpointFigures],
}

/// `156,250`, or `30,000 of 48,000` for a run stopped before the end of its schedule; `?` when
/// not recorded.
pub fn steps_text(e: &Entry) -> String {
    crate::logic::steps_text(e.steps)
}

/// The SRAVEN figures that span all checkpoints.
#[derive(Debug, Clone, Default)]
pub struct CrossFigures<'a> {
    /// ID and OOD accuracy per checkpoint (`None` without SRAVEN checkpoints).
    pub accuracy: Option<FigureRef>,
    /// Rule decoding per layer, all checkpoints (`None` for fewer than two).
    pub comparison: Option<FigureRef>,
    /// The transplant test's figures ("Is the latent code causal?").
    pub causal: &'a [FigureRef],
}

/// The whole page.
pub fn document(
    entries: &[Entry],
    figs: &[CheckpointFigures],
    cross: CrossFigures<'_>,
    logic: &LogicPart<'_>,
    aggregate: Option<(&crate::aggregate::Aggregate, &[FigureRef])>,
    params: &ReportParams,
) -> Document {
    let mut doc = Document::new();
    doc.heading(1, "hyperlens report");
    if !entries.is_empty() {
        doc.paragraph(format!(
            "{} compared on SRAVEN: accuracy (all 4 answer features right) on {} permuted problems per set; latent codes of the paper's site (query 35, keys 27 and 31, label = rule of slot 3) on {} unpermuted ID and OOD problems (seed {}); the attention of the first OOD problem; training curves where the checkpoint has a training log.",
            count(entries.len(), "checkpoint"),
            params.n,
            params.n,
            params.seed
        ));
    }
    doc.contents();
    if let Some((agg, figs)) = aggregate {
        crate::aggregate::section(&mut doc, agg, figs);
    }
    if let Some(accuracy) = cross.accuracy {
        sraven_part(&mut doc, entries, figs, accuracy, cross.comparison);
        crate::causal::section(&mut doc, entries, cross.causal);
    }
    if !logic.entries.is_empty() {
        crate::logic::section(
            &mut doc,
            logic.entries,
            logic.figures,
            params.n,
            params.seed,
        );
    }
    doc
}

/// The SRAVEN part of the page: summary, comparison with the paper, one section per checkpoint.
fn sraven_part(
    doc: &mut Document,
    entries: &[Entry],
    figs: &[CheckpointFigures],
    accuracy: FigureRef,
    comparison: Option<FigureRef>,
) {
    doc.heading(2, "Summary");
    doc.figure(accuracy);
    let header = [
        "checkpoint",
        "mixer",
        "split",
        "updates trained",
        "ID acc",
        "OOD acc",
        "OOD per-feature",
        "best decoding layer (OOD acc)",
        "decoding, all layers",
        "majority baseline",
    ]
    .map(String::from)
    .to_vec();
    let rows = entries
        .iter()
        .map(|e| {
            let per = e.ood.per_feature_accuracy.iter().sum::<f64>()
                / e.ood.per_feature_accuracy.len().max(1) as f64;
            let name = if at_chance(e) {
                format!("{} (at chance)", md_escape(&e.name))
            } else {
                md_escape(&e.name)
            };
            vec![
                name,
                e.mixer.clone(),
                md_escape(&e.split),
                steps_text(e),
                pct(e.id.accuracy),
                pct(e.ood.accuracy),
                pct(per),
                best_layer_cell(e),
                pct(all_layers(e).map_or(f64::NAN, |a| a.decoding.accuracy)),
                pct(majority(e)),
            ]
        })
        .collect();
    doc.table(header, rows);
    if let Some(fig) = comparison {
        doc.figure(fig);
    }

    let (header, rows) = paper::table(entries);
    if !rows.is_empty() {
        doc.heading(2, "Against the paper");
        doc.paragraph(
            "Schug et al., \"Attention as a Hypernetwork\" (ICLR 2025), set against the checkpoints here. The paper's numbers are means over three seeds of its own runs; each checkpoint here is one seed.",
        );
        doc.table(header, rows);
        for p in paper::paragraphs(entries) {
            doc.paragraph(p);
        }
    }

    for (e, (f, no_training)) in entries.iter().zip(figs) {
        doc.heading(2, &e.name);
        doc.paragraph(format!("Checkpoint `{}`.", e.dir.display()));
        doc.paragraph(crate::verdict::findings(e));
        let header = [
            "layer",
            "decoding acc",
            "balanced acc",
            "majority",
            "shuffled control",
            "ARI",
            "NMI",
            "silhouette",
        ]
        .map(String::from)
        .to_vec();
        let rows = e
            .latent
            .layers
            .iter()
            .map(|a| {
                let (ari, nmi, sil) = a
                    .clusters
                    .as_ref()
                    .map_or((f64::NAN, f64::NAN, f64::NAN), |c| {
                        (c.ari, c.nmi, c.silhouette)
                    });
                vec![
                    a.layer.to_string(),
                    pct(a.decoding.accuracy),
                    pct(a.decoding.balanced_accuracy),
                    pct(a.decoding.majority_baseline),
                    a.decoding.shuffled_control.map_or("-".into(), pct),
                    format!("{ari:.3}"),
                    format!("{nmi:.3}"),
                    format!("{sil:.3}"),
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
            "Tables: `tables/{0}/`; codes: `codes/{0}_id.npz`, `codes/{0}_ood.npz`; attention: `codes/{0}_attention.npz`.",
            e.name
        ));
    }
}
