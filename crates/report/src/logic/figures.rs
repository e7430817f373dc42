//! The figures of one logic checkpoint: term decoding per layer, the projections of its codes by
//! term and by target, and the training curves, each returned as a [`FigureRef`] with its caption
//! and the sentences generated from its numbers.

use std::path::Path;

use hyperlens_analysis::terms::{NamedProjection, TermCodes};
use hyperlens_io::keys;
use hyperlens_train::metrics::MetricsRow;
use hyperlens_viz::{save_png, LayerAccuracy, PcaScatter, Reference, ScatterPanel, Series};

use super::text::{decoding_text, training_text};
use crate::data::LogicEntry;
use crate::discover::Training;
use crate::doc::FigureRef;
use crate::error::{ReportError, Result};

/// Draws the projections of logic codes (the paper's Fig. 2D / A2): the PCA of all layers and the
/// t-SNE side by side over the first `n` codes, coloured by the task's first term (binary term
/// index, `term_png`) and, when the codes carry it, by the target value (`target_png`). `title`
/// names the checkpoint or file. Returns whether the target figure was written.
///
/// # Shapes
/// `projections` holds `pca_all [N, 2]` and `tsne_all [n, 2]` ([`TermCodes::projections`]).
///
/// # Errors
/// [`ReportError::InvalidInput`] if a projection is missing or shorter than `n`; a failed render
/// or write.
pub fn write_projection_figures(
    codes: &TermCodes,
    projections: &[NamedProjection],
    n: usize,
    title: &str,
    term_png: &Path,
    target_png: &Path,
) -> Result<bool> {
    let find = |name: &str| {
        projections
            .iter()
            .find(|(p, _)| p == name)
            .map(|(_, a)| a)
            .ok_or_else(|| ReportError::InvalidInput(format!("no projection `{name}`")))
    };
    let pca_all = keys::pca::name(keys::projections::PCA_PREFIX, None);
    let (pca, tsne) = (find(&pca_all)?, find(keys::projections::TSNE_ALL)?);
    let ids = codes.term_ids();
    if pca.nrows() < n || tsne.nrows() < n || ids.nrows() < n {
        return Err(ReportError::InvalidInput(format!(
            "projections of {} / {} codes for {n} points",
            pca.nrows(),
            tsne.nrows()
        )));
    }
    let pca = pca.slice(ndarray::s![..n, ..]);
    let tsne = tsne.slice(ndarray::s![..n, ..]);
    let panels = || {
        vec![
            ScatterPanel {
                title: "PCA, all layers".into(),
                points: pca,
                explained: [0.0, 0.0],
                axes: Some(["PC1".into(), "PC2".into()]),
            },
            ScatterPanel {
                title: "t-SNE, all layers".into(),
                points: tsne,
                explained: [0.0, 0.0],
                axes: Some(["t-SNE 1".into(), "t-SNE 2".into()]),
            },
        ]
    };
    let bits = (ids.iter().copied().max().unwrap_or(0) as f64 + 1.0)
        .log2()
        .ceil()
        .max(1.0) as usize;
    let first: Vec<usize> = (0..n).map(|i| ids[[i, 0]].max(0) as usize).collect();
    let n_terms = first.iter().copied().max().unwrap_or(0) + 1;
    let names: Vec<String> = (0..n_terms).map(|t| format!("{t:0bits$b}")).collect();
    let fig = PcaScatter::by_category(
        &format!("{title}: latent codes coloured by the task's first term"),
        panels(),
        &first,
        &names,
        "first term",
    );
    save_png(term_png, &fig)?;
    let Some(target) = codes.target() else {
        return Ok(false);
    };
    let values: Vec<f64> = target.iter().take(n).copied().collect();
    let fig = PcaScatter::by_value(
        &format!("{title}: latent codes coloured by the target f(x)"),
        panels(),
        &values,
        "target f(x)",
    );
    save_png(target_png, &fig)?;
    Ok(true)
}

/// The figures of one logic checkpoint: term decoding per layer, the two projections (written by
/// `analyse_logic_checkpoint`) and the training curves; and the sentence said instead of the
/// training figure when there is no log.
///
/// # Errors
/// [`ReportError::Viz`] for a figure that cannot be drawn or written.
pub fn logic_figures(e: &LogicEntry, out: &Path) -> Result<(Vec<FigureRef>, Option<String>)> {
    let name = &e.name;
    let mut made = Vec::new();
    // Term decoding per layer: F1 and the ridge R² (clipped at 0), with the two F1 controls.
    let f1: Vec<f64> = e
        .decoding
        .iter()
        .map(|r| r.f1_mean.clamp(0.0, 1.0))
        .collect();
    let ridge: Vec<f64> = e
        .decoding
        .iter()
        .map(|r| r.ridge_r2.clamp(0.0, 1.0))
        .collect();
    let base = [e
        .decoding
        .first()
        .map_or(0.0, |r| r.f1_base_rate.clamp(0.0, 1.0))];
    let shuffled: Vec<f64> = e
        .decoding
        .iter()
        .map(|r| r.f1_shuffled.clamp(0.0, 1.0))
        .collect();
    let n_layers = e.decoding.iter().filter(|r| r.layer.is_some()).count();
    let mut fig = LayerAccuracy::new(
        &format!("{name}: term decoding from the latent codes"),
        n_layers,
        vec![
            Series {
                name: "F1, ID -> OOD tasks".into(),
                values: &f1,
            },
            Series {
                name: "ridge R² of the terms".into(),
                values: &ridge,
            },
        ],
        vec![
            Reference {
                name: "F1 base rate".into(),
                values: &base,
            },
            Reference {
                name: "F1 shuffled labels".into(),
                values: &shuffled,
            },
        ],
    );
    fig.y_label = "F1 / R²".into();
    made.push(crate::plots::save(
        out,
        format!("figures/{name}_term_decoding.png"),
        &fig,
        &format!("{name}: term decoding"),
        "Term decoding per layer: mean F1 of per-term probes (ID tasks to held-out tasks) and ridge R² of the term matrix (R² below 0 drawn at 0)".into(),
        decoding_text(e),
    )?);
    made.push(FigureRef {
        id: format!("fig-{}", crate::doc::slug(&format!("{name}-projections-term"))),
        short: format!("{name}: projections by term"),
        caption: format!(
            "PCA and t-SNE of the OOD codes (all layers; t-SNE of the first {}, perplexity {}), coloured by the task's first term",
            e.tsne_points, e.tsne_perplexity
        ),
        text: format!(
            "The t-SNE embedding keeps the neighbourhoods of the codes with trustworthiness {:.3} (k = 5; 1 is perfect).",
            e.tsne_trustworthiness
        ),
        src: format!("figures/{name}_projections_term.png"),
        width: PROJECTION_WIDTH,
        // In the HTML page: the latent-space explorer of the same codes and projections.
        interactive: super::explorer::explorer_figure(e, out)?,
    });
    made.push(FigureRef {
        id: format!("fig-{}", crate::doc::slug(&format!("{name}-projections-target"))),
        short: format!("{name}: projections by target"),
        caption: "The same projections coloured by the target value f(x) of the fixed query".into(),
        text: "Colour by target shows whether the code at the query varies with the answer rather than with the task's terms.".into(),
        src: format!("figures/{name}_projections_target.png"),
        width: PROJECTION_WIDTH,
        interactive: None,
    });
    let no_training = match &e.training {
        Training::Missing { .. } => Some(format!(
            "No training curves: the checkpoint has no `{}`.",
            hyperlens_train::metrics::METRICS_FILE
        )),
        Training::Log(rows) => match training_figure(e, rows, out)? {
            Some(f) => {
                made.push(f);
                None
            }
            None => Some("No training curves: the log holds no value.".into()),
        },
    };
    Ok((made, no_training))
}

/// The width of the projection figures ([`PcaScatter`] with two panels).
const PROJECTION_WIDTH: u32 = 1100;

/// Loss (MSE) and R² curves of a logic training log (R² below 0, early in training, at 0).
fn training_figure(e: &LogicEntry, rows: &[MetricsRow], out: &Path) -> Result<Option<FigureRef>> {
    let log = crate::plots::TrainingLog {
        rows,
        loss: &[
            ("train MSE", |r| r.train_loss),
            ("ID MSE", |r| r.id_loss),
            ("OOD MSE", |r| r.ood_loss),
        ],
        metric: &[
            ("ID R²", |r| r.id_acc),
            ("OOD R²", |r| r.ood_acc),
            ("unknown-term R²", |r| {
                r.extra.get("unknown").and_then(|(_, m)| *m)
            }),
        ],
        metric_label: "R²",
    };
    crate::plots::training_curves_figure(
        out,
        &e.name,
        &log,
        &format!("{}: training curves", e.name),
        "Training curves: MSE and the R² of the ID, OOD and unknown-term sets against the step (R² below 0 drawn at 0)".into(),
        training_text(rows),
    )
}
