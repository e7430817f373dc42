//! The interactive figures of a SRAVEN checkpoint in the HTML page (GitHub issue 36): the
//! latent-space explorer in place of the PCA PNG, the attention patterns with a head selector in
//! place of the attention PNG, and the rule-similarity and confusion heatmaps with hover values
//! in place of theirs. All are self-contained SVG files under `figures/`, written by
//! `hyperlens-viz`; `index.md` keeps the PNGs.
//!
//! The explorer reads what the measure stage wrote (`codes/<name>_{id,ood}.npz` and the OOD
//! sidecar, for the split, seed and count that reproduce the problems), samples those problems
//! again (the same as the probe's: [`hyperlens_tasks::sraven::sample`] equals the probe's stream)
//! to draw them on click, and projects the ID codes on the OOD codes' principal axes.

use std::path::Path;

use hyperlens_analysis::codes::report::LayerSel;
use hyperlens_analysis::CodeSet;
use hyperlens_probe::{ProbeMeta, Site};
use hyperlens_tasks::sraven::{sample, token_labels, ProblemSet, Set, Split};
use hyperlens_viz::{save_interactive_svg, Heatmap, HeatmapExplorer, InteractiveFigure};

use crate::code_explorer::{
    attention_explorer, site_title, sraven_explorer, ProblemOrigin, Projection, SravenCodes,
    SravenColor, SravenExplorerSpec, SravenProblemRows,
};
use crate::data::Entry;
use crate::doc::Interactive;
use crate::error::{ReportError, Result};
use crate::sraven::text::per_layer;

/// The seed of the problems of the codes file `codes`, from its sidecar ([`ProbeMeta`]).
fn sidecar_seed(codes: &Path) -> Result<u64> {
    ProbeMeta::read_beside(codes)?
        .and_then(|m| m.seed)
        .ok_or_else(|| {
            ReportError::InvalidInput(format!(
                "{}: no sidecar with an integer `seed`",
                hyperlens_io::sidecar_path(codes).display()
            ))
        })
}

/// The codes of one set of a checkpoint and the problems they were read from (sampled again
/// from the sidecar's seed: [`sample`] equals the probe's stream).
fn set_files(e: &Entry, out: &Path, set: Set) -> Result<(CodeSet, ProblemSet, ProblemOrigin)> {
    let path = out.join("codes").join(format!("{}_{set}.npz", e.name));
    let codes = CodeSet::read_npz(&path)?;
    let seed = sidecar_seed(&path)?;
    let split = Split::of(e.split, e.task)?;
    let problems = sample(&split, set, codes.n_samples(), seed, true)?;
    let origin = ProblemOrigin {
        split: Some(e.split.to_string()),
        set: Some(set.to_string()),
        seed: Some(seed),
        unpermuted: true,
        subset: false,
    };
    Ok((codes, problems, origin))
}

/// Writes `fig` as `out/rel` and returns it as the page's [`Interactive`] figure.
pub(crate) fn write_svg<F: InteractiveFigure>(
    out: &Path,
    rel: String,
    fig: &F,
    hint: &str,
) -> Result<Interactive> {
    save_interactive_svg(out.join(&rel), fig)?;
    Ok(Interactive {
        path: rel,
        size: fig.canvas(),
        hint: hint.into(),
    })
}

/// Writes `fig`, a heatmap of the page, as the interactive heatmap `out/rel` (hover for the row,
/// column and value; `row_name` and `col_name` name the rows and columns in the hover box) and
/// returns it.
///
/// # Errors
/// A heatmap that fails its checks, or a file that cannot be written.
pub fn heatmap_figure(
    fig: &Heatmap,
    out: &Path,
    rel: String,
    row_name: &str,
    col_name: &str,
) -> Result<Interactive> {
    let mut live = HeatmapExplorer::single(fig);
    live.row_name = row_name.into();
    live.col_name = col_name.into();
    write_svg(out, rel, &live, "hover for values")
}

/// Writes `figures/<name>_explorer.svg`, the latent-space explorer of the checkpoint's ID and OOD
/// codes (PCA per layer fit on the OOD codes, coloured by rule or answer value; the builder
/// [`sraven_explorer`] that `hl.viz.scatter` calls), and returns it.
///
/// # Errors
/// A codes file or sidecar that cannot be read, or a figure that cannot be written.
pub fn explorer_figure(e: &Entry, out: &Path) -> Result<Interactive> {
    let files = [
        (Set::Id, set_files(e, out, Set::Id)?),
        (Set::Ood, set_files(e, out, Set::Ood)?),
    ];
    let sets: Vec<SravenCodes<'_>> = files
        .iter()
        .map(|(set, (c, _, _))| SravenCodes {
            name: set.to_string().to_uppercase(),
            codes: c.codes().view(),
            label: c.label().view(),
            target: c.target().map(|v| v.view()),
            prediction: c.prediction().map(|v| v.view()),
            correct: c.correct().map(|v| v.view()),
            slot: None,
            problem: None,
        })
        .collect();
    let problems: Vec<(String, SravenProblemRows<'_>)> = files
        .iter()
        .map(|(set, (_, p, origin))| {
            (
                set.to_string().to_uppercase(),
                SravenProblemRows {
                    x: p.x.view(),
                    y: p.y.view(),
                    origin: origin.clone(),
                },
            )
        })
        .collect();
    let a = &e.attention;
    let tokens = token_labels(a.pattern.dim().2, e.task.features.max(1));
    let spec = SravenExplorerSpec {
        site: Some(Site::Paper),
        layers: Some(
            per_layer(e)
                .iter()
                .filter_map(|a| match a.layer {
                    LayerSel::Layer(l) => Some(l),
                    LayerSel::All => None,
                })
                .collect(),
        ),
        color: SravenColor::Rule,
        projection: Projection::Pca,
        title: Some(format!("{}: {}", e.name, site_title(&a.site, &tokens))),
        start_layer: None,
    };
    let explorer = sraven_explorer(&sets, &problems, &spec)?;
    write_svg(
        out,
        format!("figures/{}_explorer.svg", e.name),
        &explorer.figure(),
        "hover, click, zoom",
    )
}

/// Writes `figures/<name>_attention.svg`, the attention of every head of every layer on the first
/// OOD problem with a layer and head selector and hover values, and returns it.
///
/// # Errors
/// A figure that cannot be written.
pub fn attention_figure(e: &Entry, out: &Path) -> Result<Interactive> {
    let pattern = e.attention.pattern.mapv(f64::from);
    let fig = attention_explorer(
        &format!(
            "{}: attention on the first OOD problem ({} mixer)",
            e.name, e.mixer
        ),
        pattern.view(),
        e.task.features,
        None,
    )?;
    write_svg(
        out,
        format!("figures/{}_attention.svg", e.name),
        &fig,
        "hover, choose the layer and head",
    )
}
