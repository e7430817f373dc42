//! The report page as a [`Document`]: the introduction, the summary table and accuracy figure,
//! the comparison with the paper, then one section per checkpoint with its findings, decoding
//! table and figures.

use crate::data::{CheckpointFigures, CrossFigures, Entry, LogicPart, ReportParams};
use crate::doc::{Document, FigureRef};
use crate::words::count;

/// The whole page.
pub fn document(
    entries: &[Entry],
    figs: &[CheckpointFigures],
    cross: CrossFigures<'_>,
    logic: &LogicPart<'_>,
    aggregate: Option<(&crate::data::Aggregate, &[FigureRef])>,
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
        crate::sraven::page::sraven_part(&mut doc, entries, figs, accuracy, cross.comparison);
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
