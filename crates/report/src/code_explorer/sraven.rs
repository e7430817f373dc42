//! The explorer of SRAVEN code sets and the attention figure of a SRAVEN problem.

use std::str::FromStr;

use hyperlens_model::CodeSite;
use hyperlens_probe::Site;
use hyperlens_tasks::sraven::{token_labels, Rule, SravenParams};
use hyperlens_viz::{render_png, AttentionGrid, Coloring, PatternExplorer};
use ndarray::{s, Array3, ArrayView1, ArrayView2, ArrayView3, ArrayView4, ArrayView5};

use super::{
    check_start, classes, flat_codes, project_codes, view_names, Explorer, ExplorerData, FieldData,
    ProblemPanels, Projection,
};
use crate::error::{ReportError, Result};

/// The name of a set given without one (the report's main set).
pub const DEFAULT_SET: &str = "OOD";

/// How a problem set was sampled, as far as known: what [`ProblemOrigin::command`] needs to
/// sample it again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProblemOrigin {
    /// The split (`paper-seed0`, `seed3`, ...).
    pub split: Option<String>,
    /// The set (`id`, `ood`).
    pub set: Option<String>,
    /// The sampling seed.
    pub seed: Option<u64>,
    /// Whether the problems were sampled unpermuted.
    pub unpermuted: bool,
    /// Whether the set is a subset of what was sampled (then no command reproduces it).
    pub subset: bool,
}

impl ProblemOrigin {
    /// Whether the rows `rows` of a sampled set, indices in the order taken, still have the
    /// set's origin: a prefix `0..k` is the set sampled with `n = k` (a sample's first `k`
    /// problems do not depend on `n`: SRAVEN's and the fuzzy-logic task's sets are drawn from one
    /// stream per seed), any other selection is a subset that no command reproduces.
    pub fn keeps_origin(rows: &[i64]) -> bool {
        rows.iter().zip(0i64..).all(|(&r, i)| r == i)
    }

    /// This origin for the rows `rows` of its set ([`ProblemOrigin::keeps_origin`]): itself for a
    /// prefix, else marked `subset`.
    pub fn of_rows(&self, rows: &[i64]) -> ProblemOrigin {
        ProblemOrigin {
            subset: self.subset || !Self::keeps_origin(rows),
            ..self.clone()
        }
    }

    /// The `hyperlens tasks sample` command that samples the `n` problems again, or an empty
    /// string when the split, set or seed is unknown or the set is a subset.
    pub fn command(&self, n: usize) -> String {
        match (&self.split, &self.set, self.seed) {
            (Some(split), Some(set), Some(seed)) if !self.subset => format!(
                "hyperlens tasks sample --split {split} --set {set} --n {n} --seed {seed}{} --out problems.npz",
                if self.unpermuted { " --unpermuted" } else { "" }
            ),
            _ => String::new(),
        }
    }
}

/// A SRAVEN problem set the codes were read from, drawn on click.
#[derive(Debug, Clone)]
pub struct SravenProblemRows<'a> {
    /// One-hot tokens. # Shapes: `[P, T, M]`.
    pub x: ArrayView3<'a, f32>,
    /// The answers. # Shapes: `[P, F]`.
    pub y: ArrayView2<'a, i64>,
    /// How it was sampled.
    pub origin: ProblemOrigin,
}

/// One SRAVEN code set (the arrays of a probe's `codes.npz`).
#[derive(Debug, Clone)]
pub struct SravenCodes<'a> {
    /// The set's name (`ID`, `OOD`, ...).
    pub name: String,
    /// # Shapes: `[N, L, H, Q, K]`.
    pub codes: ArrayView5<'a, f32>,
    /// The rule of every row. # Shapes: `[N]`.
    pub label: ArrayView1<'a, i64>,
    /// The answer in the row's slot. # Shapes: `[N]`.
    pub target: Option<ArrayView1<'a, i64>>,
    /// The model's answer in the row's slot. # Shapes: `[N]`.
    pub prediction: Option<ArrayView1<'a, i64>>,
    /// Whether the model was right. # Shapes: `[N]`.
    pub correct: Option<ArrayView1<'a, bool>>,
    /// The row's answer slot (by default the site's). # Shapes: `[N]`.
    pub slot: Option<ArrayView1<'a, i64>>,
    /// The row's problem index in its problem set (by default the row). # Shapes: `[N]`.
    pub problem: Option<ArrayView1<'a, i64>>,
}

/// The colouring shown first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SravenColor {
    /// By the row's rule (`rule`).
    Rule,
    /// By the answer value (`target` or `answer value`).
    Answer,
}

impl FromStr for SravenColor {
    type Err = ReportError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "rule" => Ok(SravenColor::Rule),
            "target" | "answer value" => Ok(SravenColor::Answer),
            other => Err(ReportError::InvalidInput(format!(
                "color {other:?}: SRAVEN codes are coloured by \"rule\" or \"target\""
            ))),
        }
    }
}

/// What [`sraven_explorer`] draws besides the sets.
#[derive(Debug, Clone, PartialEq)]
pub struct SravenExplorerSpec {
    /// The codes' site (default `paper`).
    pub site: Option<Site>,
    /// The model's layer of each index along the codes' `L` axis (default `0..L`).
    pub layers: Option<Vec<usize>>,
    /// The colouring shown first.
    pub color: SravenColor,
    /// The projection.
    pub projection: Projection,
    /// The title (default [`site_title`]).
    pub title: Option<String>,
    /// The layer index shown first (default the last).
    pub start_layer: Option<usize>,
}

/// `latent codes (query Q3, keys P6s3 and P7s3)`: the explorer's title for codes at `site`.
pub fn site_title(site: &CodeSite, tokens: &[String]) -> String {
    let name = |t: usize| tokens.get(t).cloned().unwrap_or_else(|| t.to_string());
    format!(
        "latent codes (query {}, keys {})",
        name(site.query),
        site.keys
            .iter()
            .map(|&t| name(t))
            .collect::<Vec<_>>()
            .join(" and ")
    )
}

/// The feature values of every panel of the problems `index` of `x`, `y`: the 8 context panels
/// from the one-hot tokens (-1 where no value is on), then the true answer.
///
/// # Shapes
/// `x [P, T, M]`, `y [P, F]`, `index [N]` -> `[N, 9, F]`.
///
/// # Errors
/// [`ReportError::InvalidInput`] for an index outside `0..P` or tokens fewer than `8 F`.
pub fn panel_values(
    x: ArrayView3<'_, f32>,
    y: ArrayView2<'_, i64>,
    index: &[i64],
) -> Result<Array3<i64>> {
    let (p, t, _) = x.dim();
    let f = y.ncols();
    if y.nrows() != p || t < 8 * f {
        return Err(ReportError::InvalidInput(format!(
            "problems of shapes x {:?}, y {:?}: need [P, T >= 8 F, M] and [P, F]",
            x.shape(),
            y.shape()
        )));
    }
    let rows: Vec<usize> = index
        .iter()
        .map(|&i| {
            usize::try_from(i).ok().filter(|&i| i < p).ok_or_else(|| {
                ReportError::InvalidInput(format!(
                    "problem index {i} is outside the problem set's {p} problems"
                ))
            })
        })
        .collect::<Result<_>>()?;
    Ok(Array3::from_shape_fn(
        (rows.len(), 9, f),
        |(i, panel, k)| {
            let r = rows[i];
            if panel < 8 {
                x.slice(s![r, panel * f + k, ..])
                    .iter()
                    .position(|&v| v > 0.5)
                    .map_or(-1, |v| v as i64)
            } else {
                y[[r, k]]
            }
        },
    ))
}

/// One set's data: colours, fields, codes and problems.
fn set_data(
    c: &SravenCodes<'_>,
    problems: Option<&SravenProblemRows<'_>>,
    site: &CodeSite,
    features: usize,
    color: SravenColor,
    points: ndarray::Array4<f64>,
) -> Result<ExplorerData> {
    let n = c.codes.dim().0;
    let rows = |what: &str, len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(ReportError::Analysis(
                hyperlens_analysis::AnalysisError::Shape(format!(
                    "{}: `{what}` has {len} entries for {n} codes",
                    c.name
                )),
            ))
        }
    };
    rows("label", c.label.len())?;
    for (what, v) in [
        ("target", &c.target),
        ("prediction", &c.prediction),
        ("slot", &c.slot),
        ("problem", &c.problem),
    ] {
        if let Some(v) = v {
            rows(what, v.len())?;
        }
    }
    if let Some(v) = &c.correct {
        rows("correct", v.len())?;
    }
    let index: Vec<i64> = match &c.problem {
        Some(p) => p.to_vec(),
        None => (0..n as i64).collect(),
    };
    let rule = classes("label", c.label.iter().copied())?;
    let answer = match &c.target {
        Some(t) => classes("target", t.iter().copied())?,
        None => vec![0; n],
    };
    let colors = match color {
        SravenColor::Rule => vec![rule.clone(), answer],
        SravenColor::Answer => vec![answer, rule.clone()],
    };
    let mut fields = vec![("rule".to_string(), FieldData::Category(rule, rule_names()))];
    if let Some(t) = &c.target {
        fields.push(("target".into(), FieldData::Int(t.to_vec())));
    }
    if let Some(p) = &c.prediction {
        fields.push(("prediction".into(), FieldData::Int(p.to_vec())));
    }
    if let Some(v) = &c.correct {
        fields.push(("correct".into(), FieldData::Bool(v.to_vec())));
    }
    let panels = match problems {
        None => None,
        Some(p) => {
            let prediction = c.prediction.as_ref().ok_or_else(|| {
                ReportError::InvalidInput(format!(
                    "{}: drawing the problems needs the codes' `prediction`",
                    c.name
                ))
            })?;
            Some(ProblemPanels {
                values: panel_values(p.x, p.y, &index)?,
                slot: match &c.slot {
                    Some(s) => s.to_vec(),
                    None => vec![(site.query % features.max(1)) as i64; n],
                },
                prediction: prediction.to_vec(),
                marked: site.keys.clone(),
                query: site.query,
            })
        }
    };
    Ok(ExplorerData {
        name: c.name.clone(),
        reproduce: problems.map_or_else(String::new, |p| p.origin.command(p.x.dim().0)),
        points,
        index,
        colors,
        fields,
        codes: flat_codes(&c.name, &c.codes)?,
        problems: panels,
    })
}

/// The rules' names in index order (the explorer's rule classes).
fn rule_names() -> Vec<String> {
    Rule::ALL.iter().map(|r| r.name().to_string()).collect()
}

/// The latent-space explorer of SRAVEN code sets (the last shown first, fixing the PCA's axes).
///
/// `problems` pairs a set's name with the problems its codes were read from. The task's shape
/// (tokens, values, features) is the first problem set's, or the default task's. The site
/// resolves to one query and its keys (the title's, the marked tokens'); colourings: rule and
/// answer value, `spec.color` first; hover: rule, and target, prediction, correct where given.
///
/// # Shapes
/// As [`SravenCodes`]; every set has the same `L, H, Q, K`.
///
/// # Errors
/// [`ReportError::InvalidInput`] for no set, problems of an unknown set, a site that is not one
/// query (`all-slots`) or out of the task's tokens, a start layer outside the codes' layers,
/// problems without the codes' `prediction`, a negative label or target, a problem index outside
/// its set; [`ReportError::Analysis`] for arrays whose lengths or code axes disagree, and the
/// projection's errors.
pub fn sraven_explorer(
    sets: &[SravenCodes<'_>],
    problems: &[(String, SravenProblemRows<'_>)],
    spec: &SravenExplorerSpec,
) -> Result<Explorer> {
    let first = sets
        .first()
        .ok_or_else(|| ReportError::InvalidInput("no code set given".into()))?;
    let names: Vec<String> = sets.iter().map(|s| s.name.clone()).collect();
    let unknown: Vec<&String> = problems
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !names.contains(n))
        .collect();
    if !unknown.is_empty() {
        return Err(ReportError::InvalidInput(format!(
            "problems for unknown sets {unknown:?} (code sets: {names:?})"
        )));
    }
    let l = first.codes.dim().1;
    check_start(spec.start_layer, l)?;
    let params = match problems.first() {
        Some((_, p)) => SravenParams {
            features: p.y.ncols(),
            values: p.x.dim().2,
            ..SravenParams::default()
        },
        None => SravenParams::default(),
    };
    let selections = spec.site.clone().unwrap_or(Site::Paper).resolve(&params)?;
    let [sel] = selections.as_slice() else {
        return Err(ReportError::InvalidInput(format!(
            "the explorer draws a site of one query, not {} (`all-slots`)",
            selections.len()
        )));
    };
    let site = &sel.site;
    let tokens = token_labels(params.n_tokens(), params.features);
    let projected = project_codes(
        &sets.iter().map(|s| s.codes).collect::<Vec<_>>(),
        &names,
        spec.projection,
    )?;
    let mut colorings = vec![
        Coloring {
            name: "rule".into(),
            classes: rule_names(),
        },
        Coloring {
            name: "answer value".into(),
            classes: (0..params.values).map(|v| v.to_string()).collect(),
        },
    ];
    if spec.color == SravenColor::Answer {
        colorings.reverse();
    }
    let data = sets
        .iter()
        .zip(projected.points)
        .map(|(c, points)| {
            let p = problems.iter().find(|(n, _)| *n == c.name).map(|(_, p)| p);
            set_data(c, p, site, params.features, spec.color, points)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Explorer {
        title: spec
            .title
            .clone()
            .unwrap_or_else(|| site_title(site, &tokens)),
        layers: view_names(spec.layers.as_deref(), l),
        projections: vec![(spec.projection.label().into(), spec.projection.axes())],
        explained: (spec.projection == Projection::Pca).then_some(projected.explained),
        colorings,
        heads: (0..first.codes.dim().2).map(|h| format!("H{h}")).collect(),
        keys: site
            .keys
            .iter()
            .map(|&t| tokens.get(t).cloned().unwrap_or_else(|| t.to_string()))
            .collect(),
        sets: data,
        start_layer: spec.start_layer,
    })
}

/// `attention on problem {index} ({mixer} mixer)`: the attention figure's title in a notebook.
pub fn attention_title(index: usize, mixer: Option<&str>) -> String {
    match mixer {
        Some(m) => format!("attention on problem {index} ({m} mixer)"),
        None => format!("attention on problem {index}"),
    }
}

/// The attention of every head of every layer on one SRAVEN problem of `features` answer slots,
/// with a layer and head selector ([`PatternExplorer::attention`]; tokens labelled by
/// [`token_labels`], layers `layer {l}`, heads `H{h}`).
///
/// # Shapes
/// `pattern [L, H, T, T]`.
///
/// # Errors
/// [`ReportError::InvalidInput`] for a start layer outside `0..L`.
pub fn attention_explorer<'a>(
    title: &str,
    pattern: ArrayView4<'a, f64>,
    features: usize,
    start_layer: Option<usize>,
) -> Result<PatternExplorer<'a>> {
    let (l, h, t, _) = pattern.dim();
    if let Some(x) = start_layer.filter(|&x| x >= l) {
        return Err(ReportError::InvalidInput(format!(
            "`layer` {x} is not below the model's {l} layers"
        )));
    }
    let tokens = token_labels(t, features.max(1));
    let mut fig = PatternExplorer::attention(title, pattern, &tokens);
    fig.heads = (0..h).map(|i| format!("H{i}")).collect();
    fig.start_layer = start_layer;
    Ok(fig)
}

/// The static figure of an attention explorer: the attention grid of the layer shown first, as
/// PNG bytes.
///
/// # Errors
/// [`ReportError::Viz`] if it cannot be drawn.
pub fn attention_png(fig: &PatternExplorer<'_>) -> Result<Vec<u8>> {
    let l = fig.values.dim().0;
    let shown = fig
        .start_layer
        .unwrap_or(l.saturating_sub(1))
        .min(l.saturating_sub(1));
    let mut grid = AttentionGrid::new(
        &fig.title,
        fig.values.slice(s![shown, .., .., ..]),
        &fig.row_labels,
        &fig.col_labels,
    );
    grid.panel_titles = fig.heads.clone();
    if let Some(r) = fig.range {
        grid.range = Some(r);
    }
    grid.color_map = fig.color_map;
    let size = hyperlens_viz::Figure::size(&grid);
    Ok(render_png(&grid, size)?)
}
