//! The study's figures: Experiment 1's decoding per layer against its controls and its
//! latent-space explorer; Experiment 2's behaviour per operation x domain, its decoding per layer
//! on each split, and its explorer; the transplant's outcomes per kind of code.

use std::path::Path;

use hyperlens_analysis::lm::{LmAnalysis, LmBehaviour};
use hyperlens_viz::{
    BarSeries, ColorMap, GroupedBars, Heatmap, HeatmapOptions, LayerAccuracy, Reference, Series,
    ValueFormat,
};
use ndarray::Array2;

use hyperlens_probe::lm_transplant::LmTransplantRow;

use super::measure::Measured;
use super::verdict::{layer_name, strongest_control, Verdicts};
use crate::doc::FigureRef;
use crate::error::Result;
use crate::lm_explorer::LmExplorer;
use crate::plots::save;
use crate::sraven::explorer::{heatmap_figure, write_svg};
use crate::words::pct;

/// The figures of each part of the page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StudyFigures {
    /// Experiment 1.
    pub relations: Vec<FigureRef>,
    /// Experiment 2.
    pub icl: Vec<FigureRef>,
    /// The transplant.
    pub transplant: Vec<FigureRef>,
}

impl StudyFigures {
    /// Every figure, in page order.
    pub fn all(&self) -> impl Iterator<Item = &FigureRef> {
        self.relations
            .iter()
            .chain(&self.icl)
            .chain(&self.transplant)
    }
}

/// Per-row values of an analysis's decoding (every layer, then all layers together).
fn per_row(a: &LmAnalysis, f: impl Fn(&hyperlens_analysis::lm::LmDecodingRow) -> f64) -> Vec<f64> {
    a.decoding.rows.iter().map(f).collect()
}

/// The decoding per layer of one analysis against its controls.
fn decoding_figure(
    a: &LmAnalysis,
    out: &Path,
    rel: &str,
    title: &str,
    held_out: &str,
    text: String,
) -> Result<FigureRef> {
    let n_layers = a.decoding.rows.len() - 1;
    let codes = per_row(a, |r| r.codes.accuracy);
    let resid = per_row(a, |r| r.resid.map_or(f64::NAN, |s| s.accuracy));
    let shuffled_labels = per_row(a, |r| r.shuffled_labels.accuracy);
    let shuffled_weights = per_row(a, |r| r.shuffled_weights.map_or(f64::NAN, |s| s.accuracy));
    let distance = [a.decoding.distance.accuracy];
    let chance = [a.decoding.chance_max];
    let mut series = vec![Series {
        name: format!("latent codes, {held_out}"),
        values: &codes,
    }];
    if resid.iter().any(|v| v.is_finite()) {
        series.push(Series {
            name: "residual stream at the query".into(),
            values: &resid,
        });
    }
    let mut references = vec![
        Reference {
            name: "shuffled labels".into(),
            values: &shuffled_labels,
        },
        Reference {
            name: "distances only".into(),
            values: &distance,
        },
        Reference {
            name: "chance (largest class)".into(),
            values: &chance,
        },
    ];
    if shuffled_weights.iter().any(|v| v.is_finite()) {
        references.push(Reference {
            name: "shuffled weights".into(),
            values: &shuffled_weights,
        });
    }
    let mut fig = LayerAccuracy::new(title, n_layers, series, references);
    fig.y_label = "held-out accuracy".into();
    save(
        out,
        rel.into(),
        &fig,
        title,
        format!("{title}, per layer and on all layers together"),
        text,
    )
}

/// The explorer of an analysis as a page figure: the PNG fallback and the interactive SVG.
fn explorer_figure(e: &LmExplorer, out: &Path, name: &str, text: String) -> Result<FigureRef> {
    let png = format!("figures/{name}_explorer.png");
    hyperlens_io::write_atomic(&out.join(&png), &e.png()?)?;
    let interactive = write_svg(
        out,
        format!("figures/{name}_explorer.svg"),
        &e.figure(),
        "choose the layer and the colouring, hover a point for its prompt, click for its code",
    )?;
    Ok(FigureRef {
        id: format!("fig-{}-explorer", crate::doc::slug(name)),
        short: format!("{name}: latent space"),
        caption: format!("{}: latent space of the held-out prompts", e.title),
        text,
        src: png,
        width: 900,
        interactive: Some(interactive),
    })
}

/// The model's accuracy per operation (rows) x domain (columns).
fn behaviour_figure(b: &LmBehaviour, out: &Path, text: String) -> Result<Option<FigureRef>> {
    let (Some(fo), Some(fd)) = (
        b.factors.iter().position(|f| f == "operation"),
        b.factors.iter().position(|f| f == "domain"),
    ) else {
        return Ok(None);
    };
    let mut ops: Vec<String> = b
        .combinations
        .iter()
        .map(|c| c.values[fo].clone())
        .collect();
    let mut doms: Vec<String> = b
        .combinations
        .iter()
        .map(|c| c.values[fd].clone())
        .collect();
    ops.sort();
    ops.dedup();
    doms.sort();
    doms.dedup();
    let mut values = Array2::from_elem((ops.len(), doms.len()), f64::NAN);
    let mut mask = Array2::from_elem((ops.len(), doms.len()), true);
    for c in &b.combinations {
        let (Some(i), Some(j)) = (
            ops.iter().position(|o| *o == c.values[fo]),
            doms.iter().position(|d| *d == c.values[fd]),
        ) else {
            continue;
        };
        if let Some(a) = c.accuracy {
            values[[i, j]] = a;
            mask[[i, j]] = false;
        }
    }
    let fig = Heatmap::new(
        values,
        HeatmapOptions {
            title: "The model's accuracy per operation and domain".into(),
            x_label: "domain".into(),
            y_label: "operation".into(),
            x_ticks: doms,
            y_ticks: ops,
            value_format: ValueFormat::Percent(0),
            color_map: ColorMap::Viridis,
            range: Some((0.0, 1.0)),
            color_bar_label: "accuracy".into(),
            mask: Some(mask),
            ..HeatmapOptions::default()
        },
    );
    let rel = "figures/icl_behaviour.png".to_string();
    let mut f = save(
        out,
        rel,
        &fig,
        "Behaviour",
        "The model's next-token accuracy on the icl prompts, per operation x domain".into(),
        text,
    )?;
    f.interactive = Some(heatmap_figure(
        &fig,
        out,
        "figures/icl_behaviour.svg".into(),
        "operation",
        "domain",
    )?);
    Ok(Some(f))
}

/// Experiment 2's decoding per layer: the held-out accuracy of each decoded split, the seen
/// accuracy of the first, and the strongest control and the residual stream averaged over the
/// splits.
fn icl_decoding_figure(m: &Measured, v: &Verdicts, out: &Path) -> Result<Option<FigureRef>> {
    let (Some(icl), Some(iv)) = (&m.icl, &v.icl) else {
        return Ok(None);
    };
    let decoded: Vec<(usize, &LmAnalysis)> = icl
        .splits
        .iter()
        .enumerate()
        .filter_map(|(j, s)| s.ood.as_ref().ok().map(|a| (j, a)))
        .collect();
    let Some((_, first)) = decoded.first() else {
        return Ok(None);
    };
    let n_layers = first.decoding.rows.len() - 1;
    let held: Vec<(String, Vec<f64>)> = decoded
        .iter()
        .map(|(j, a)| {
            (
                format!("held-out combinations, split {}", j + 1),
                per_row(a, |r| r.codes.accuracy),
            )
        })
        .collect();
    let seen: Option<Vec<f64>> = icl.splits[decoded[0].0].seen.as_ref().ok().map(|s| {
        first
            .decoding
            .rows
            .iter()
            .map(|r| {
                s.decoding
                    .rows
                    .iter()
                    .find(|x| x.layer == r.layer)
                    .map_or(f64::NAN, |x| x.codes.accuracy)
            })
            .collect()
    });
    let unfiltered: Vec<f64> = iv.unfiltered.iter().map(|l| l.mean_held_out).collect();
    let control: Vec<f64> = iv.layers.iter().map(|l| l.mean_control).collect();
    let resid: Vec<f64> = iv
        .layers
        .iter()
        .map(|l| l.mean_resid.unwrap_or(f64::NAN))
        .collect();
    let mut series: Vec<Series> = held
        .iter()
        .map(|(n, v)| Series {
            name: n.clone(),
            values: v,
        })
        .collect();
    if let Some(s) = &seen {
        series.push(Series {
            name: format!("seen combinations (halves), split {}", decoded[0].0 + 1),
            values: s,
        });
    }
    if unfiltered.len() == control.len() {
        series.push(Series {
            name: "all combinations, held out (mean over splits)".into(),
            values: &unfiltered,
        });
    }
    let references = vec![
        Reference {
            name: "strongest control (mean over splits)".into(),
            values: &control,
        },
        Reference {
            name: "residual stream (mean over splits)".into(),
            values: &resid,
        },
    ];
    let title = "Decoding the operation from the latent code at the answer position";
    let mut fig = LayerAccuracy::new(title, n_layers, series, references);
    fig.y_label = "accuracy".into();
    Ok(Some(save(
        out,
        "figures/icl_decoding.png".into(),
        &fig,
        "Operation decoding",
        "The operation decoded from the latent code, trained on the seen combinations and tested \
         on the held-out ones, per layer and split"
            .into(),
        iv.sentence.clone(),
    )?))
}

/// The transplant's outcomes per kind of code.
fn transplant_figure(m: &Measured, v: &Verdicts, out: &Path) -> Result<Option<FigureRef>> {
    let (Some(t), Some((_, sentence))) = (&m.transplant, &v.transplant) else {
        return Ok(None);
    };
    let rows = &t.transplant.rows;
    let kinds: Vec<String> = rows.iter().map(|x| x.kind.as_str().to_string()).collect();
    let frac = |f: fn(&LmTransplantRow) -> usize| -> Vec<f64> {
        rows.iter()
            .map(|x| {
                if x.n == 0 {
                    0.0
                } else {
                    f(x) as f64 / x.n as f64
                }
            })
            .collect()
    };
    let (to, elsewhere, unchanged) = (
        frac(|x| x.to_donor),
        frac(|x| x.elsewhere),
        frac(|x| x.unchanged),
    );
    let mut fig = GroupedBars::accuracy(
        &format!(
            "Transplanting latent codes at L{} (answer position)",
            t.layer
        ),
        &kinds,
        vec![
            BarSeries {
                name: "answer becomes the donor operation's".into(),
                values: &to,
            },
            BarSeries {
                name: "answer changes otherwise".into(),
                values: &elsewhere,
            },
            BarSeries {
                name: "answer stays".into(),
                values: &unchanged,
            },
        ],
    );
    fig.x_label = "code written at the answer position".into();
    fig.y_label = "fraction of (prompt, donor) pairs".into();
    fig.value_format = ValueFormat::Percent(0);
    Ok(Some(save(
        out,
        "figures/transplant.png".into(),
        &fig,
        "Transplant",
        format!("Outcomes of the latent-code transplant at L{}", t.layer),
        sentence.clone(),
    )?))
}

/// Every figure of the study.
///
/// # Errors
/// A figure that cannot be drawn or written.
pub fn figures(m: &Measured, v: &Verdicts, out: &Path) -> Result<StudyFigures> {
    let r = &m.relations.analysis;
    let mut figs = StudyFigures::default();
    figs.relations.push(decoding_figure(
        r,
        out,
        "figures/relations_decoding.png",
        "Decoding the relation of key to query",
        "held-out vocabulary",
        v.relations.sentence.clone(),
    )?);
    let best = r
        .decoding
        .rows
        .iter()
        .find(|x| x.layer == Some(v.relations.best_layer.0));
    figs.relations.push(explorer_figure(
        &m.relations.explorer,
        out,
        "relations",
        format!(
            "Each point is a held-out prompt's code at one layer; at {} the relation decodes at {} \
             (strongest control {}).",
            layer_name(Some(v.relations.best_layer.0)),
            pct(v.relations.best_layer.1),
            pct(best.map_or(f64::NAN, |b| strongest_control(&r.decoding, b)))
        ),
    )?);
    if let Some(icl) = &m.icl {
        let kept = icl.behaviour.combinations.iter().filter(|c| c.kept).count();
        let text = format!(
            "The model answers {} of the prompts; {kept} of the {} combinations reach the threshold \
             of {} and are kept for the decoding.",
            pct(icl.accuracy),
            icl.behaviour.combinations.len(),
            pct(super::verdict::MIN_COMBINATION_ACCURACY)
        );
        if let Some(f) = behaviour_figure(&icl.behaviour, out, text)? {
            figs.icl.push(f);
        }
        if let Some(f) = icl_decoding_figure(m, v, out)? {
            figs.icl.push(f);
        }
        if let Some(e) = &icl.explorer {
            figs.icl.push(explorer_figure(
                e,
                out,
                "icl",
                "Each point is a held-out prompt of split 1 (kept combinations); colour by \
                 operation, domain or whether the model was right."
                    .into(),
            )?);
        }
    }
    if let Some(f) = transplant_figure(m, v, out)? {
        figs.transplant.push(f);
    }
    Ok(figs)
}
