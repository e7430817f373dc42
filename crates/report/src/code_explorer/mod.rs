//! The latent-space explorer and the attention figure of code sets, built once for every front:
//! the report's `figures/<name>_explorer.svg` and `_attention.svg` (`sraven/explorer.rs`) and
//! Python's `hl.viz.scatter` and `hl.viz.attention` (`crates/py/src/viz.rs`) call these builders,
//! so that the same inputs give the same figure, byte for byte.
//!
//! The builders decide everything a figure shows: the site's query and keys (the probe crate's
//! [`hyperlens_probe::Site`]), the token labels ([`hyperlens_tasks::sraven::token_labels`]), the
//! title, the colourings and hover fields, the problems drawn on click and the command that samples
//! them again, and the projections ([`project_codes`]: the analysis crate's PCA and exact t-SNE).
//! The result owns its data ([`Explorer`]); [`Explorer::figure`] is the interactive figure,
//! [`Explorer::png`] its static scatter. The heatmap panels of a head ablation and of composition
//! scores (titles, colour spans) are built here too ([`head_ablation_panels`],
//! [`composition_panels`]).

mod heatmaps;
mod logic;
mod project;
mod sraven;

pub use heatmaps::{
    composition_panels, composition_title, head_ablation_panels, heatmap_explorer, matrix_panels,
    MatrixSpec, NOT_COMPUTED,
};
pub use logic::{
    logic_explorer, logic_key_names, logic_term_text, term_names, LogicCodes, LogicExplorerSpec,
};
pub use project::{project_codes, Projected, Projection};
pub use sraven::{
    attention_explorer, attention_png, attention_title, panel_values, site_title, sraven_explorer,
    ProblemOrigin, SravenCodes, SravenColor, SravenExplorerSpec, SravenProblemRows, DEFAULT_SET,
};

use hyperlens_viz::{
    render_png, CodeExplorer, Coloring, ExplorerSet, Field, FieldValues, PcaScatter, ScatterPanel,
    SravenProblems,
};
use ndarray::{s, Array3, Array4};

use crate::error::{ReportError, Result};

/// The values of one hover field, owned.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldData {
    /// Integers.
    Int(Vec<i64>),
    /// Class indices and the class names.
    Category(Vec<usize>, Vec<String>),
    /// Yes / no.
    Bool(Vec<bool>),
    /// Finite numbers.
    Float(Vec<f64>),
    /// Text.
    Text(Vec<String>),
}

/// SRAVEN problems drawn on click, owned ([`SravenProblems`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ProblemPanels {
    /// The panels' feature values. # Shapes: `[N, 9, F]`.
    pub values: Array3<i64>,
    /// The answer slot of every row. # Shapes: `[N]`.
    pub slot: Vec<i64>,
    /// The model's answer at the slot. # Shapes: `[N]`.
    pub prediction: Vec<i64>,
    /// The site's key tokens, marked in the panels.
    pub marked: Vec<usize>,
    /// The site's query token.
    pub query: usize,
}

/// One set of the explorer, owned ([`ExplorerSet`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ExplorerData {
    /// The set's name (`ID`, `OOD`, ...).
    pub name: String,
    /// How to get its problems again (a command line), or empty.
    pub reproduce: String,
    /// The projected points. # Shapes: `[P, L, N, 2]` (projection, view, point, x / y).
    pub points: Array4<f64>,
    /// The problem index of every point. # Shapes: `[N]`.
    pub index: Vec<i64>,
    /// One class per point for each colouring. # Shapes: `[C][N]`.
    pub colors: Vec<Vec<usize>>,
    /// The hover fields, by name.
    pub fields: Vec<(String, FieldData)>,
    /// Every point's code per view, heads then keys. # Shapes: `[N, L, H * Q * K]`.
    pub codes: Array3<f32>,
    /// The problems drawn on click, when known.
    pub problems: Option<ProblemPanels>,
}

/// The latent-space explorer of code sets, owned: what [`sraven_explorer`] and
/// [`logic_explorer`] return.
#[derive(Debug, Clone, PartialEq)]
pub struct Explorer {
    /// The figure's title.
    pub title: String,
    /// The view names (layers, or `all`).
    pub layers: Vec<String>,
    /// The projections' names and axis titles, in the order of the sets' `points` axis 0.
    pub projections: Vec<(String, [String; 2])>,
    /// PC1 and PC2's explained-variance ratios per view of the first projection, when it is a
    /// PCA (the PNG's axis titles).
    pub explained: Option<Vec<[f64; 2]>>,
    /// The colourings, the first shown first.
    pub colorings: Vec<Coloring>,
    /// Head labels of the code drawing.
    pub heads: Vec<String>,
    /// Key labels of the code drawing.
    pub keys: Vec<String>,
    /// The sets (the last is shown first).
    pub sets: Vec<ExplorerData>,
    /// The view shown first (the last when `None`).
    pub start_layer: Option<usize>,
}

impl Explorer {
    /// The interactive figure ([`CodeExplorer`]), borrowing this explorer's data.
    pub fn figure(&self) -> CodeExplorer<'_> {
        CodeExplorer {
            title: self.title.clone(),
            layers: self.layers.clone(),
            projections: self.projections.clone(),
            colorings: self.colorings.clone(),
            heads: self.heads.clone(),
            keys: self.keys.clone(),
            sets: self.sets.iter().map(set_figure).collect(),
            start_layer: self.start_layer,
        }
    }

    /// The static figure of the same data: the last set at the view shown first, by the first
    /// colouring and the first projection, as PNG bytes (900 x 560).
    ///
    /// # Errors
    /// [`ReportError::InvalidInput`] for an explorer without a set, view or colouring;
    /// [`ReportError::Viz`] if the figure cannot be drawn.
    pub fn png(&self) -> Result<Vec<u8>> {
        let set = self
            .sets
            .last()
            .ok_or_else(|| ReportError::InvalidInput("the explorer has no set to draw".into()))?;
        let (coloring, colors) = self
            .colorings
            .first()
            .zip(set.colors.first())
            .ok_or_else(|| ReportError::InvalidInput("the explorer has no colouring".into()))?;
        let views = self.layers.len();
        if views == 0 || self.projections.is_empty() {
            return Err(ReportError::InvalidInput(
                "the explorer has no view to draw".into(),
            ));
        }
        let shown = self.start_layer.unwrap_or(views - 1).min(views - 1);
        let (explained, axes) = match self.explained.as_ref().and_then(|e| e.get(shown)) {
            Some(e) => (*e, None),
            None => ([0.0, 0.0], Some(self.projections[0].1.clone())),
        };
        let fig = PcaScatter::by_category(
            &self.title,
            vec![ScatterPanel {
                title: format!("layer {}", self.layers[shown]),
                points: set.points.slice(s![0, shown, .., ..]),
                explained,
                axes,
            }],
            colors,
            &coloring.classes,
            &coloring.name,
        );
        Ok(render_png(&fig, (900, 560))?)
    }
}

/// The figure's view of one owned set.
fn set_figure(d: &ExplorerData) -> ExplorerSet<'_> {
    ExplorerSet {
        name: d.name.clone(),
        reproduce: d.reproduce.clone(),
        points: d.points.view(),
        index: &d.index,
        colors: d.colors.iter().map(Vec::as_slice).collect(),
        fields: d
            .fields
            .iter()
            .map(|(name, f)| Field {
                name: name.clone(),
                values: match f {
                    FieldData::Int(v) => FieldValues::Int(v),
                    FieldData::Category(v, names) => FieldValues::Category {
                        labels: v,
                        names: names.clone(),
                    },
                    FieldData::Bool(v) => FieldValues::Bool(v),
                    FieldData::Float(v) => FieldValues::Float(v),
                    FieldData::Text(v) => FieldValues::Text(v.clone()),
                },
            })
            .collect(),
        codes: Some(d.codes.view()),
        problems: d.problems.as_ref().map(|p| SravenProblems {
            values: p.values.view(),
            slot: &p.slot,
            prediction: &p.prediction,
            marked: p.marked.clone(),
            query: p.query,
        }),
    }
}

/// Class indices of integer labels, refusing a negative one (naming `what`).
fn classes(what: &str, v: impl Iterator<Item = i64>) -> Result<Vec<usize>> {
    v.map(|x| {
        usize::try_from(x)
            .map_err(|_| ReportError::InvalidInput(format!("`{what}`: negative class {x}")))
    })
    .collect()
}

/// The view names of codes with `l` layers: `layers` (the model's layer of each index along the
/// codes' `L` axis) when it has `l` entries, else `0..l`.
fn view_names(layers: Option<&[usize]>, l: usize) -> Vec<String> {
    match layers {
        Some(v) if v.len() == l => v.iter().map(ToString::to_string).collect(),
        _ => (0..l).map(|i| i.to_string()).collect(),
    }
}

/// Checks the view shown first against the codes' `l` layers.
fn check_start(layer: Option<usize>, l: usize) -> Result<()> {
    match layer {
        Some(x) if x >= l => Err(ReportError::InvalidInput(format!(
            "`layer` {x} is not below the codes' {l} layers"
        ))),
        _ => Ok(()),
    }
}

/// The codes `[N, L, H, Q, K]` as `[N, L, H * Q * K]` (heads, then queries, then keys).
fn flat_codes(name: &str, codes: &ndarray::ArrayView5<'_, f32>) -> Result<Array3<f32>> {
    let (n, l, h, q, k) = codes.dim();
    codes
        .to_shape((n, l, h * q * k))
        .map(|v| v.to_owned())
        .map_err(|e| ReportError::InvalidInput(format!("{name}: codes: {e}")))
}

#[cfg(test)]
mod tests;
