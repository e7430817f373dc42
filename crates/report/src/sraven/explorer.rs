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
use hyperlens_tasks::sraven::{sample, token_labels, Set, Split};
use hyperlens_viz::{
    save_interactive_svg, CodeExplorer, Coloring, ExplorerSet, Field, FieldValues, Heatmap,
    HeatmapExplorer, InteractiveFigure, PatternExplorer, SravenProblems,
};
use ndarray::{s, Array3, Array4, Axis};

use crate::data::Entry;
use crate::doc::Interactive;
use crate::error::{ReportError, Result};
use crate::sraven::text::{per_layer, rule_names};

/// What one set of the explorer holds, owned (the figure borrows it).
struct SetData {
    set: Set,
    points: Array4<f64>,
    index: Vec<i64>,
    rule: Vec<usize>,
    target_class: Vec<usize>,
    target: Vec<i64>,
    prediction: Vec<i64>,
    correct: Vec<bool>,
    codes: Array3<f32>,
    values: Array3<i64>,
    slot: Vec<i64>,
    reproduce: String,
}

/// The seed of the problems of a codes file, from its JSON sidecar.
fn sidecar_seed(path: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["seed"].as_u64())
        .ok_or_else(|| ReportError::InvalidInput(format!("{}: no integer `seed`", path.display())))
}

/// The feature values of every panel of every problem, `[N, 9, F]`: the 8 context panels from the
/// one-hot tokens, then the true answer.
fn panel_values(x: ndarray::ArrayView3<'_, f32>, y: ndarray::ArrayView2<'_, i64>) -> Array3<i64> {
    let (n, _, _) = x.dim();
    let f = y.ncols();
    Array3::from_shape_fn((n, 9, f), |(i, p, k)| {
        if p < 8 {
            x.slice(s![i, p * f + k, ..])
                .iter()
                .position(|&v| v > 0.5)
                .map_or(-1, |v| v as i64)
        } else {
            y[[i, k]]
        }
    })
}

fn set_data(e: &Entry, out: &Path, set: Set) -> Result<SetData> {
    let path = out.join("codes").join(format!("{}_{set}.npz", e.name));
    let codes = CodeSet::read_npz(&path)?;
    let seed = sidecar_seed(&path.with_extension("json"))?;
    let n = codes.n_samples();
    let (l, h, q, k) = codes.code_dims();
    let layers = per_layer(e);
    let mut points = Array4::zeros((1, layers.len(), n, 2));
    for (li, a) in layers.iter().enumerate() {
        let LayerSel::Layer(layer) = a.layer else {
            continue;
        };
        let proj = if set == Set::Ood {
            a.projection.clone()
        } else {
            a.pca.transform(codes.features(Some(layer))?.view())?
        };
        if proj.ncols() < 2 || proj.nrows() != n {
            return Err(ReportError::InvalidInput(format!(
                "{}: the PCA projection of layer {layer} is {:?}, not [{n}, 2]",
                path.display(),
                proj.dim()
            )));
        }
        points
            .slice_mut(s![0, li, .., ..])
            .assign(&proj.slice(s![.., 0..2]));
    }
    let missing =
        |what: &str| ReportError::InvalidInput(format!("{}: no `{what}` array", path.display()));
    let label = codes.label().to_vec();
    let target = codes.target().ok_or_else(|| missing("target"))?.to_vec();
    let prediction = codes
        .prediction()
        .ok_or_else(|| missing("prediction"))?
        .to_vec();
    let correct = codes.correct().ok_or_else(|| missing("correct"))?.to_vec();
    let class =
        |v: &[i64]| -> Vec<usize> { v.iter().map(|&x| usize::try_from(x).unwrap_or(0)).collect() };
    let split = Split::of(e.split, e.task)?;
    let problems = sample(&split, set, n, seed, true)?;
    let values = panel_values(problems.x.view(), problems.y.view());
    let features = problems.y.ncols().max(1);
    // [N, L, H, Q, K] -> [N, L, H*Q*K], head-major (Q = 1 at the paper's site).
    let flat = codes
        .codes()
        .to_shape((n, l, h * q * k))
        .map_err(|err| ReportError::InvalidInput(format!("{}: codes: {err}", path.display())))?
        .to_owned();
    Ok(SetData {
        set,
        points,
        index: (0..n as i64).collect(),
        rule: class(&label),
        target_class: class(&target),
        target,
        prediction,
        correct,
        codes: flat,
        values,
        slot: vec![(e.attention.site.query % features) as i64; n],
        reproduce: format!(
            "hyperlens tasks sample --split {} --set {set} --n {n} --seed {seed} --unpermuted --out problems.npz",
            e.split
        ),
    })
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
/// codes (PCA per layer, coloured by rule or answer value), and returns it.
///
/// # Errors
/// A codes file or sidecar that cannot be read, or a figure that cannot be written.
pub fn explorer_figure(e: &Entry, out: &Path) -> Result<Interactive> {
    let sets = [set_data(e, out, Set::Id)?, set_data(e, out, Set::Ood)?];
    let a = &e.attention;
    let features = e.task.features.max(1);
    let tokens = token_labels(a.pattern.dim().2, features);
    let values = e.task.values.max(1);
    let h = a.pattern.dim().1;
    let title = format!(
        "{}: latent codes (query {}, keys {})",
        e.name,
        tokens.get(a.site.query).map_or("?", String::as_str),
        a.site
            .keys
            .iter()
            .map(|&t| tokens.get(t).map_or("?", String::as_str))
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let fig = CodeExplorer {
        title,
        layers: per_layer(e)
            .iter()
            .map(|a| match a.layer {
                LayerSel::Layer(l) => l.to_string(),
                LayerSel::All => "all".into(),
            })
            .collect(),
        projections: vec![("PCA".into(), ["PC1".into(), "PC2".into()])],
        colorings: vec![
            Coloring {
                name: "rule".into(),
                classes: rule_names(),
            },
            Coloring {
                name: "answer value".into(),
                classes: (0..values).map(|v| v.to_string()).collect(),
            },
        ],
        heads: (0..h).map(|i| format!("H{i}")).collect(),
        keys: a
            .site
            .keys
            .iter()
            .map(|&t| tokens.get(t).cloned().unwrap_or_else(|| t.to_string()))
            .collect(),
        sets: sets
            .iter()
            .map(|d| ExplorerSet {
                name: d.set.to_string().to_uppercase(),
                reproduce: d.reproduce.clone(),
                points: d.points.view(),
                index: &d.index,
                colors: vec![&d.rule, &d.target_class],
                fields: vec![
                    Field {
                        name: "rule".into(),
                        values: FieldValues::Category {
                            labels: &d.rule,
                            names: rule_names(),
                        },
                    },
                    Field {
                        name: "target".into(),
                        values: FieldValues::Int(&d.target),
                    },
                    Field {
                        name: "prediction".into(),
                        values: FieldValues::Int(&d.prediction),
                    },
                    Field {
                        name: "correct".into(),
                        values: FieldValues::Bool(&d.correct),
                    },
                ],
                codes: Some(d.codes.view()),
                problems: Some(SravenProblems {
                    values: d.values.view(),
                    slot: &d.slot,
                    prediction: &d.prediction,
                    marked: a.site.keys.clone(),
                    query: a.site.query,
                }),
            })
            .collect(),
        start_layer: None,
    };
    write_svg(
        out,
        format!("figures/{}_explorer.svg", e.name),
        &fig,
        "hover, click, zoom",
    )
}

/// Writes `figures/<name>_attention.svg`, the attention of every head of every layer on the first
/// OOD problem with a layer and head selector and hover values, and returns it.
///
/// # Errors
/// A figure that cannot be written.
pub fn attention_figure(e: &Entry, out: &Path) -> Result<Interactive> {
    let a = &e.attention;
    let t = a.pattern.dim().2;
    let tokens = token_labels(t, e.task.features.max(1));
    let pattern = a.pattern.mapv(f64::from);
    let mut fig = PatternExplorer::attention(
        &format!(
            "{}: attention on the first OOD problem ({} mixer)",
            e.name, e.mixer
        ),
        pattern.view(),
        &tokens,
    );
    fig.heads = (0..pattern.len_of(Axis(1)))
        .map(|h| format!("H{h}"))
        .collect();
    write_svg(
        out,
        format!("figures/{}_attention.svg", e.name),
        &fig,
        "hover, choose the layer and head",
    )
}
