//! The SRAVEN part of the page: summary, comparison with the paper, one section per checkpoint.

use crate::data::{CheckpointFigures, Entry};
use crate::doc::{Document, FigureRef};
use crate::sraven::paper;
use crate::sraven::text::{all_layers, majority};
use crate::sraven::verdict::{at_chance, best_layer_cell};
use crate::words::{md_escape, pct};

/// The SRAVEN part of the page: summary, comparison with the paper, one section per checkpoint.
pub(crate) fn sraven_part(
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
                e.mixer.to_string(),
                md_escape(&e.split.to_string()),
                crate::words::steps_text(e.steps),
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
        doc.paragraph(crate::sraven::verdict::findings(e));
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
