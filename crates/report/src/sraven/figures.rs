//! The figures of the report (PNG, SVG for the accuracy figure, interactive SVG for the PCA,
//! attention, confusion and similarity figures: [`crate::sraven::explorer`]), each returned as a
//! [`FigureRef`] with its caption and the sentences generated from its numbers.

use std::path::Path;

use hyperlens_analysis::codes::report::LayerSel;
use hyperlens_tasks::sraven::{panel_labels, token_labels};
use hyperlens_train::metrics::METRICS_FILE;
use hyperlens_viz::{
    save_svg, AttentionGrid, BarSeries, ColorMap, GroupedBars, Heatmap, LayerAccuracy, PcaScatter,
    Reference, ScatterPanel, Series,
};
use ndarray::Axis;

use crate::data::Entry;
use crate::discover::Training;
use crate::doc::FigureRef;
use crate::error::Result;
use crate::plots::{save, training_curves_figure};
use crate::sraven::text::{
    attention_text, confusion_text, decoding_text, majority, pca_rule_text, pca_target_text,
    per_layer, rule_name, rule_names, similarity_text, training_text,
};
use crate::sraven::verdict::best_layer;
use crate::words::{md_escape, pct};

/// The figures of one checkpoint, and the sentence said instead of a training-curve figure when
/// it has no training log.
///
/// # Errors
/// [`crate::ReportError::Viz`] for a figure that cannot be drawn or written.
pub fn checkpoint_figures(e: &Entry, out: &Path) -> Result<(Vec<FigureRef>, Option<String>)> {
    let mut made = Vec::new();
    let layers = per_layer(e);
    let name = &e.name;
    // PCA by rule, one panel per layer (the unsupervised set: OOD codes).
    let labels: Vec<usize> = e
        .latent
        .unsupervised_label
        .iter()
        .map(|&l| usize::try_from(l).unwrap_or(0))
        .collect();
    let panels: Vec<ScatterPanel> = layers
        .iter()
        .map(|a| {
            let r = a.pca.explained_variance_ratio();
            ScatterPanel {
                title: format!("layer {}", a.layer),
                points: a.projection.view(),
                explained: [
                    r.get(0).copied().unwrap_or(0.0),
                    r.get(1).copied().unwrap_or(0.0),
                ],
                axes: None,
            }
        })
        .collect();
    let a = &e.attention;
    let title = format!(
        "{name}: latent codes (query {}, keys {}) by rule, OOD",
        a.site.query,
        a.site
            .keys
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let fig = PcaScatter::by_category(&title, panels.clone(), &labels, &rule_names(), "rule");
    let mut pca_rule = save(
        out,
        format!("figures/{name}_pca_rule.png"),
        &fig,
        "PCA by rule",
        "PCA of the OOD codes per layer, coloured by the rule of slot 3".into(),
        pca_rule_text(e),
    )?;
    // In the HTML page: the latent-space explorer, with this PNG as its fallback.
    pca_rule.interactive = Some(crate::sraven::explorer::explorer_figure(e, out)?);
    made.push(pca_rule);
    if let Some(t) = &e.latent.unsupervised_target {
        let values: Vec<f64> = t.iter().map(|&v| v as f64).collect();
        let fig = PcaScatter::by_value(
            &format!("{name}: latent codes by target value, OOD"),
            panels,
            &values,
            "target value",
        );
        made.push(save(
            out,
            format!("figures/{name}_pca_target.png"),
            &fig,
            "PCA by answer",
            "PCA of the OOD codes per layer, coloured by the answer value".into(),
            pca_target_text(e, t),
        )?);
    }
    made.push(decoding_figure(e, out)?);
    if let Some(f) = confusion_figure(e, out)? {
        made.push(f);
    }
    if let Some(last) = layers.last() {
        let sim = &last.similarity;
        // Rules without OOD codes have no mean code: leave their rows and columns out.
        let keep: Vec<usize> = (0..sim.labels.len())
            .filter(|&i| sim.counts[i] > 0)
            .collect();
        let names: Vec<String> = keep.iter().map(|&i| rule_name(sim.labels[i])).collect();
        let cos = sim
            .cosine
            .select(Axis(0), &keep)
            .select(Axis(1), &keep)
            .mapv(|v| if v.is_finite() { v } else { 0.0 });
        let fig = Heatmap::rule_similarity(
            &format!(
                "{name}: cosine similarity of mean codes, layer {}",
                last.layer
            ),
            cos.view(),
            &names,
        )?;
        let mut similarity = save(
            out,
            format!("figures/{name}_similarity.png"),
            &fig,
            "rule similarity",
            "Cosine similarity of the per-rule mean codes (final layer, OOD)".into(),
            similarity_text(sim, last.layer),
        )?;
        similarity.interactive = Some(crate::sraven::explorer::heatmap_figure(
            &fig,
            out,
            format!("figures/{name}_similarity.svg"),
            "rule (row)",
            "rule (column)",
        )?);
        made.push(similarity);
    }
    // Training curves (half a row) before the wide attention grid, so that they can pair up with
    // the similarity heatmap in the HTML page.
    let no_training = match training_figure(e, out)? {
        Ok(fig) => {
            made.push(fig);
            None
        }
        Err(sentence) => Some(sentence),
    };
    let mut attention = attention_figure(e, out)?;
    attention.interactive = Some(crate::sraven::explorer::attention_figure(e, out)?);
    made.push(attention);
    Ok((made, no_training))
}

/// Decoding accuracy per layer with the majority and shuffled-label baselines.
fn decoding_figure(e: &Entry, out: &Path) -> Result<FigureRef> {
    let layers = &e.latent.layers;
    let acc: Vec<f64> = layers.iter().map(|a| a.decoding.accuracy).collect();
    let bal: Vec<f64> = layers
        .iter()
        .map(|a| a.decoding.balanced_accuracy)
        .collect();
    let maj = [if majority(e).is_finite() {
        majority(e)
    } else {
        0.0
    }];
    let shuffled: Vec<f64> = layers
        .iter()
        .map(|a| a.decoding.shuffled_control.unwrap_or(f64::NAN))
        .collect();
    let mut refs = vec![Reference {
        name: "majority class".into(),
        values: &maj,
    }];
    if shuffled.iter().all(|v| v.is_finite()) {
        refs.push(Reference {
            name: "shuffled labels".into(),
            values: &shuffled,
        });
    }
    let fig = LayerAccuracy::new(
        &format!("{}: rule decoding ID -> OOD", e.name),
        per_layer(e).len(),
        vec![
            Series {
                name: "accuracy".into(),
                values: &acc,
            },
            Series {
                name: "balanced accuracy".into(),
                values: &bal,
            },
        ],
        refs,
    );
    save(
        out,
        format!("figures/{}_decoding.png", e.name),
        &fig,
        "rule decoding",
        "Linear decoding of the rule from the codes, trained on ID, tested on OOD".into(),
        decoding_text(e),
    )
}

/// The confusion matrix of the most accurate per-layer probe, row-normalised. Rows are the rules
/// present in the OOD set (an absent rule has no row, not a row of zeros); columns are the rules
/// present or predicted.
fn confusion_figure(e: &Entry, out: &Path) -> Result<Option<FigureRef>> {
    let Some(best) = best_layer(e) else {
        return Ok(None);
    };
    let Some(a) = e.latent.layers.iter().find(|a| a.layer == best.layer) else {
        return Ok(None);
    };
    let d = &a.decoding;
    let is_true = |i: usize| d.confusion.row(i).sum() > 0;
    let cols: Vec<usize> = (0..d.classes.len())
        .filter(|&i| is_true(i) || d.confusion.column(i).sum() > 0)
        .collect();
    let rows: Vec<usize> = (0..cols.len()).filter(|&k| is_true(cols[k])).collect();
    let names: Vec<String> = cols.iter().map(|&i| rule_name(d.classes[i])).collect();
    let counts = d
        .confusion
        .select(Axis(0), &cols)
        .select(Axis(1), &cols)
        .mapv(|v| v as f64);
    let title = format!(
        "{}: rule decoding confusion, layer {} (OOD)",
        e.name, best.layer
    );
    let mut fig = Heatmap::confusion_matrix(&title, counts.view(), &names, true)?;
    if rows.len() < cols.len() {
        fig.values = fig.values.select(Axis(0), &rows);
        fig.options.y_ticks = rows.iter().map(|&k| names[k].clone()).collect();
    }
    let caption = if best.above_baseline {
        format!(
            "Confusion matrix of the best per-layer probe (layer {}), rows: true rule",
            best.layer
        )
    } else {
        format!(
            "Confusion matrix of the most accurate per-layer probe (layer {}, not above the majority baseline), rows: true rule",
            best.layer
        )
    };
    let mut made = save(
        out,
        format!("figures/{}_confusion.png", e.name),
        &fig,
        "confusion matrix",
        caption,
        confusion_text(d, best.layer),
    )?;
    made.interactive = Some(crate::sraven::explorer::heatmap_figure(
        &fig,
        out,
        format!("figures/{}_confusion.svg", e.name),
        "true rule",
        "predicted rule",
    )?);
    Ok(Some(made))
}

/// Training curves of one checkpoint, or (as `Err`) the sentence said when it has no usable log.
fn training_figure(e: &Entry, out: &Path) -> Result<std::result::Result<FigureRef, String>> {
    let rows = match &e.training {
        Training::Log(rows) => rows,
        Training::Missing { trained_by } => {
            return Ok(Err(format!(
                "No training curves: the checkpoint has no `{METRICS_FILE}`{}.",
                trained_by
                    .as_ref()
                    .map(|t| format!(" (it was trained by {})", md_escape(t)))
                    .unwrap_or_default()
            )));
        }
    };
    let curves = crate::plots::TrainingLog {
        rows,
        loss: &[
            ("train loss", |r| r.train_loss),
            ("ID loss", |r| r.id_loss),
            ("OOD loss", |r| r.ood_loss),
        ],
        metric: &[
            ("ID accuracy", |r| r.id_acc),
            ("OOD accuracy", |r| r.ood_acc),
        ],
        metric_label: "accuracy",
    };
    let fig = training_curves_figure(
        out,
        &e.name,
        &curves,
        "training curves",
        "Training curves: loss and ID / OOD accuracy (all features right) against the step".into(),
        training_text(rows),
    )?;
    Ok(fig.ok_or_else(|| {
        format!("No training curves: `{METRICS_FILE}` holds no loss or accuracy value.")
    }))
}

/// The attention of every head of the last layer on the first OOD problem, one label per SRAVEN
/// panel on both axes.
fn attention_figure(e: &Entry, out: &Path) -> Result<FigureRef> {
    let a = &e.attention;
    let (l, _, t, _) = a.pattern.dim();
    let layer = l.saturating_sub(1);
    let features = a.target.len();
    let pattern = a.pattern.index_axis(Axis(0), layer).mapv(f64::from);
    let (lo, hi) = pattern
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(x, y), &v| {
            (x.min(v), y.max(v))
        });
    let ticks = panel_labels(t, features);
    let mut fig = AttentionGrid::new(
        &format!(
            "{}: attention of layer {layer} on one OOD problem ({} mixer)",
            e.name, e.mixer
        ),
        pattern.view(),
        &ticks,
        &ticks,
    );
    fig.separators = Some(features);
    fig.tick_groups = Some(features);
    if lo < 0.0 {
        let m = lo.abs().max(hi.abs()).max(f64::MIN_POSITIVE);
        fig.color_map = ColorMap::BlueWhiteRed;
        fig.range = Some((-m, m));
    }
    save(
        out,
        format!("figures/{}_attention.png", e.name),
        &fig,
        "attention",
        format!(
            "Attention of every head of layer {layer} on the first OOD problem (rows: query, columns: key; P0-P{} = the context panels of {features} slots each, Q = the query tokens; within a panel, slot s is the s-th token)",
            (t / features.max(1)).saturating_sub(2)
        ),
        attention_text(a, layer, &token_labels(t, features)),
    )
}

/// The ID / OOD accuracy bar chart of all checkpoints (PNG and SVG).
///
/// # Errors
/// [`crate::ReportError::Viz`].
pub fn accuracy_figure(entries: &[Entry], out: &Path, text: String) -> Result<FigureRef> {
    let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    let id: Vec<f64> = entries.iter().map(|e| e.id.accuracy).collect();
    let ood: Vec<f64> = entries.iter().map(|e| e.ood.accuracy).collect();
    let bars = GroupedBars::accuracy(
        "SRAVEN accuracy per checkpoint (all 4 features right)",
        &names,
        vec![
            BarSeries {
                name: "in-distribution".into(),
                values: &id,
            },
            BarSeries {
                name: "OOD".into(),
                values: &ood,
            },
        ],
    );
    save_svg(out.join("figures/accuracy.svg"), &bars)?;
    save(
        out,
        "figures/accuracy.png".into(),
        &bars,
        "accuracy",
        "ID and OOD accuracy per checkpoint".into(),
        text,
    )
}

/// Decoding accuracy per layer of every checkpoint in one figure (when there are several and they
/// have the same number of layers), with the largest majority-class baseline as reference.
///
/// # Errors
/// [`crate::ReportError::Viz`].
pub fn comparison_figure(entries: &[Entry], out: &Path) -> Result<Option<FigureRef>> {
    let n_sel = entries.first().map_or(0, |e| e.latent.layers.len());
    if entries.len() < 2 || n_sel < 2 || entries.iter().any(|e| e.latent.layers.len() != n_sel) {
        return Ok(None);
    }
    let acc: Vec<Vec<f64>> = entries
        .iter()
        .map(|e| {
            e.latent
                .layers
                .iter()
                .map(|a| a.decoding.accuracy)
                .collect()
        })
        .collect();
    let maj = [entries
        .iter()
        .map(majority)
        .filter(|m| m.is_finite())
        .fold(0.0, f64::max)];
    let series = entries
        .iter()
        .zip(&acc)
        .map(|(e, v)| Series {
            name: e.name.clone(),
            values: v,
        })
        .collect();
    let fig = LayerAccuracy::new(
        "Rule decoding ID -> OOD per layer, all checkpoints",
        n_sel - 1,
        series,
        vec![Reference {
            name: "majority class (largest)".into(),
            values: &maj,
        }],
    );
    let at = |k: usize| {
        let it = || entries.iter().zip(&acc);
        (
            it().max_by(|a, b| a.1[k].total_cmp(&b.1[k])),
            it().min_by(|a, b| a.1[k].total_cmp(&b.1[k])),
        )
    };
    let mut text = String::new();
    let last = n_sel - 2;
    let layer = entries[0].latent.layers[last].layer;
    if let (Some(hi), Some(lo)) = at(last) {
        text += &format!(
            "At layer {layer} the rule decodes best from {} ({}) and worst from {} ({})",
            md_escape(&hi.0.name),
            pct(hi.1[last]),
            md_escape(&lo.0.name),
            pct(lo.1[last])
        );
    }
    if entries[0].latent.layers[n_sel - 1].layer == LayerSel::All {
        if let (Some(hi), Some(lo)) = at(n_sel - 1) {
            text += &format!(
                "; with all layers concatenated accuracies range from {} to {}",
                pct(lo.1[n_sel - 1]),
                pct(hi.1[n_sel - 1])
            );
        }
    }
    text += &format!(", against a majority baseline of at most {}.", pct(maj[0]));
    Ok(Some(save(
        out,
        "figures/decoding_comparison.png".into(),
        &fig,
        "decoding, all checkpoints",
        "Rule decoding per layer, all checkpoints".into(),
        text,
    )?))
}
