//! `hyperlens.viz`: the interactive figures of `hyperlens-viz` (issue 36) for notebooks: the
//! latent-space explorer of code sets, the attention patterns with a head selector, and heatmaps
//! with hover values (composition scores, head ablation, any matrix). The explorer and the
//! attention figure are built by `hyperlens_report::code_explorer`, the builders of the report's
//! `figures/<name>_explorer.svg` and `_attention.svg` (site, token labels, title, colourings,
//! projections: every decision is the library's); this module converts the Python sets to
//! borrowed views and the figure to `{"svg", "html", "png"}`.

use hyperlens_analysis::circuits::CompositionKind;
use hyperlens_analysis::lm::LmProjection;
use hyperlens_probe::Site;
use hyperlens_report::code_explorer::{
    attention_explorer, attention_png, attention_title, composition_panels, head_ablation_panels,
    heatmap_explorer, matrix_panels, Explorer, LogicCodes, LogicExplorerSpec, MatrixSpec,
    ProblemOrigin, Projection, SravenCodes, SravenExplorerSpec, SravenProblemRows, DEFAULT_SET,
    NOT_COMPUTED,
};
use hyperlens_report::lm_explorer::{lm_explorer_of, LmProjected};
use hyperlens_viz::{render_png, ColorMap, Heatmap, InteractiveFigure, VizError};
use ndarray::{Ix1, Ix2, Ix3, Ix4, Ix5};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::arrays::{shape_error, In, InDyn};
use crate::errors::{detached, raise, to_py, Classify, Kind};

impl Classify for VizError {
    fn kind(&self) -> Kind {
        match self {
            VizError::Length { .. } => Kind::Shape,
            VizError::Empty { .. }
            | VizError::NonFinite { .. }
            | VizError::OutOfRange { .. }
            | VizError::InvalidOption { .. } => Kind::Input,
            _ => Kind::Other,
        }
    }
}

/// The entry `name` of `d`, unless absent or None.
fn item<'py>(d: &Bound<'py, PyDict>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    match d.get_item(name)? {
        Some(v) if !v.is_none() => Ok(Some(v)),
        _ => Ok(None),
    }
}

/// A numpy array argument of `D` dimensions, read in place where its layout allows.
fn view<'py, T, D>(arg: &str, v: &Bound<'py, PyAny>) -> PyResult<In<'py, T, D>>
where
    T: numpy::Element,
    D: ndarray::Dimension,
{
    v.extract().map_err(|_| {
        raise(
            Kind::Input,
            format!(
                "`{arg}` must be a numpy array of {} with {} axes",
                std::any::type_name::<T>(),
                D::NDIM.unwrap_or(0)
            ),
        )
    })
}

/// A numpy array argument of `D` dimensions, copied (for the figures that own their data: a
/// matrix heatmap, the language model's projections).
fn array<T, D>(arg: &str, v: &Bound<'_, PyAny>) -> PyResult<ndarray::Array<T, D>>
where
    T: numpy::Element + Clone,
    D: ndarray::Dimension,
{
    let a: InDyn<'_, T> = v.extract().map_err(|_| {
        raise(
            Kind::Input,
            format!(
                "`{arg}` must be a numpy array of {}",
                std::any::type_name::<T>()
            ),
        )
    })?;
    let view = a.as_array();
    let shape = view.shape().to_vec();
    view.to_owned().into_dimensionality::<D>().map_err(|_| {
        shape_error(
            arg,
            &format!("of {} dimensions", D::NDIM.unwrap_or(0)),
            &shape,
        )
    })
}

/// A numpy attribute `name` of the Python object `obj` (a `CodeSet`, a `ProblemSet`), borrowed
/// where its layout allows; `None` when the attribute is None.
fn attr<'py, T: numpy::Element, D: ndarray::Dimension>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Option<In<'py, T, D>>> {
    let v = obj.getattr(name)?;
    if v.is_none() {
        return Ok(None);
    }
    v.extract().map(Some).map_err(|_| {
        raise(
            Kind::Input,
            format!(
                "`{name}` must be a numpy array of {} with {} axes",
                std::any::type_name::<T>(),
                D::NDIM.unwrap_or(0)
            ),
        )
    })
}

/// [`attr`] of an attribute that must be there.
fn attr_req<'py, T: numpy::Element, D: ndarray::Dimension>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<In<'py, T, D>> {
    attr(obj, name)?.ok_or_else(|| raise(Kind::Input, format!("missing `{name}`")))
}

/// A set's name, or the default set's when none is given (one set alone).
fn set_name(name: Option<String>) -> String {
    name.unwrap_or_else(|| DEFAULT_SET.to_string())
}

/// The Python `CodeSet`'s arrays (borrowed), by attribute.
struct SravenIn<'py> {
    name: String,
    codes: In<'py, f32, Ix5>,
    label: In<'py, i64, Ix1>,
    target: Option<In<'py, i64, Ix1>>,
    prediction: Option<In<'py, i64, Ix1>>,
    correct: Option<In<'py, bool, Ix1>>,
    slot: Option<In<'py, i64, Ix1>>,
    problem: Option<In<'py, i64, Ix1>>,
}

impl<'py> SravenIn<'py> {
    fn new(name: Option<String>, c: &Bound<'py, PyAny>) -> PyResult<Self> {
        Ok(Self {
            name: set_name(name),
            codes: attr_req(c, "codes")?,
            label: attr_req(c, "label")?,
            target: attr(c, "target")?,
            prediction: attr(c, "prediction")?,
            correct: attr(c, "correct")?,
            slot: attr(c, "slot")?,
            problem: attr(c, "problem")?,
        })
    }

    fn view(&self) -> SravenCodes<'_> {
        SravenCodes {
            name: self.name.clone(),
            codes: self.codes.as_array(),
            label: self.label.as_array(),
            target: self.target.as_ref().map(|v| v.as_array()),
            prediction: self.prediction.as_ref().map(|v| v.as_array()),
            correct: self.correct.as_ref().map(|v| v.as_array()),
            slot: self.slot.as_ref().map(|v| v.as_array()),
            problem: self.problem.as_ref().map(|v| v.as_array()),
        }
    }
}

/// The Python `ProblemSet`'s arrays (borrowed) and its `meta` as a [`ProblemOrigin`].
struct ProblemsIn<'py> {
    name: String,
    x: In<'py, f32, Ix3>,
    y: In<'py, i64, Ix2>,
    origin: ProblemOrigin,
}

impl<'py> ProblemsIn<'py> {
    fn new(name: Option<String>, p: &Bound<'py, PyAny>) -> PyResult<Self> {
        let mut origin = ProblemOrigin::default();
        if let Ok(meta) = p.getattr("meta") {
            if let Ok(m) = meta.cast::<PyDict>() {
                origin.split = item(m, "split")?.map(|v| v.extract()).transpose()?;
                origin.set = item(m, "set")?.map(|v| v.extract()).transpose()?;
                origin.seed = item(m, "seed")?.map(|v| v.extract()).transpose()?;
                origin.unpermuted = item(m, "unpermuted")?.map_or(Ok(false), |v| v.is_truthy())?;
                origin.subset = item(m, "subset")?.map_or(Ok(false), |v| v.is_truthy())?;
            }
        }
        Ok(Self {
            name: set_name(name),
            x: attr_req(p, "x")?,
            y: attr_req(p, "y")?,
            origin,
        })
    }
}

/// The Python `LogicCodeSet`'s arrays (borrowed).
struct LogicIn<'py> {
    name: String,
    codes: In<'py, f32, Ix5>,
    term_ids: In<'py, i64, Ix2>,
    target: Option<In<'py, f32, Ix1>>,
    prediction: Option<In<'py, f32, Ix1>>,
    problem: Option<In<'py, i64, Ix1>>,
}

/// A built explorer as the Python side receives it.
fn explorer_out(e: &Explorer) -> PyResult<(String, String, Vec<u8>)> {
    let fig = e.figure();
    Ok((
        fig.svg_document().map_err(to_py)?,
        fig.html().map_err(to_py)?,
        e.png().map_err(to_py)?,
    ))
}

/// The latent-space explorer of SRAVEN code sets
/// (`hyperlens_report::code_explorer::sraven_explorer`, the builder of the report's
/// `figures/<name>_explorer.svg`): `{"svg", "html", "png"}`.
///
/// `sets`: (name or None, `CodeSet`) pairs, the last shown first; `problems`: (name or None,
/// `ProblemSet`) pairs; a None name is the default set's (`OOD`). `site` (CLI form) and `layers`
/// are the codes'; `color`, `projection`, `title`, `layer`, `seed` as `hl.viz.scatter`.
#[pyfunction]
#[pyo3(signature = (sets, problems, site=None, layers=None, color="rule", projection="pca", title=None, layer=None, seed=0))]
#[allow(clippy::too_many_arguments)]
fn sraven_explorer<'py>(
    py: Python<'py>,
    sets: Vec<(Option<String>, Bound<'py, PyAny>)>,
    problems: Vec<(Option<String>, Bound<'py, PyAny>)>,
    site: Option<&str>,
    layers: Option<Vec<usize>>,
    color: &str,
    projection: &str,
    title: Option<String>,
    layer: Option<usize>,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let spec = SravenExplorerSpec {
        color: color.parse().map_err(to_py)?,
        projection: Projection::parse(projection, seed).map_err(to_py)?,
        site: site.map(str::parse::<Site>).transpose().map_err(to_py)?,
        layers,
        title,
        start_layer: layer,
    };
    let sets: Vec<SravenIn<'py>> = sets
        .iter()
        .map(|(n, c)| SravenIn::new(n.clone(), c))
        .collect::<PyResult<_>>()?;
    let problems: Vec<ProblemsIn<'py>> = problems
        .iter()
        .map(|(n, p)| ProblemsIn::new(n.clone(), p))
        .collect::<PyResult<_>>()?;
    let views: Vec<SravenCodes<'_>> = sets.iter().map(SravenIn::view).collect();
    let rows: Vec<(String, SravenProblemRows<'_>)> = problems
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                SravenProblemRows {
                    x: p.x.as_array(),
                    y: p.y.as_array(),
                    origin: p.origin.clone(),
                },
            )
        })
        .collect();
    let (svg, html, png) = detached(py, || {
        let e = hyperlens_report::code_explorer::sraven_explorer(&views, &rows, &spec)
            .map_err(to_py)?;
        explorer_out(&e)
    })?;
    figure_dict(py, svg, html, &png)
}

/// The latent-space explorer of fuzzy-logic code sets
/// (`hyperlens_report::code_explorer::logic_explorer`): `{"svg", "html", "png"}`. `sets`:
/// (name or None, `LogicCodeSet`) pairs; the rest as [`sraven_explorer`].
#[pyfunction]
#[pyo3(signature = (sets, layers=None, color="term", projection="pca", title=None, layer=None, seed=0))]
#[allow(clippy::too_many_arguments)]
fn logic_explorer<'py>(
    py: Python<'py>,
    sets: Vec<(Option<String>, Bound<'py, PyAny>)>,
    layers: Option<Vec<usize>>,
    color: &str,
    projection: &str,
    title: Option<String>,
    layer: Option<usize>,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let spec = LogicExplorerSpec {
        color: color.to_string(),
        projection: Projection::parse(projection, seed).map_err(to_py)?,
        layers,
        title,
        start_layer: layer,
    };
    let sets: Vec<LogicIn<'py>> = sets
        .iter()
        .map(|(n, c)| {
            Ok(LogicIn {
                name: set_name(n.clone()),
                codes: attr_req(c, "codes")?,
                term_ids: attr_req(c, "term_ids")?,
                target: attr(c, "target")?,
                prediction: attr(c, "prediction")?,
                problem: attr(c, "problem")?,
            })
        })
        .collect::<PyResult<_>>()?;
    let views: Vec<LogicCodes<'_>> = sets
        .iter()
        .map(|s| LogicCodes {
            name: s.name.clone(),
            codes: s.codes.as_array(),
            term_ids: s.term_ids.as_array(),
            target: s.target.as_ref().map(|v| v.as_array()),
            prediction: s.prediction.as_ref().map(|v| v.as_array()),
            problem: s.problem.as_ref().map(|v| v.as_array()),
        })
        .collect();
    let (svg, html, png) = detached(py, || {
        let e = hyperlens_report::code_explorer::logic_explorer(&views, &spec).map_err(to_py)?;
        explorer_out(&e)
    })?;
    figure_dict(py, svg, html, &png)
}

/// The attention of every head of every layer on problem `index` of a SRAVEN model with
/// `features` answer slots (`hyperlens_report::code_explorer::attention_explorer`, the builder of
/// the report's `figures/<name>_attention.svg`): `{"svg", "html", "png"}`. `pattern`: float64
/// `[L, H, T, T]`; the title by default `attention_title(index, mixer)`.
#[pyfunction]
#[pyo3(signature = (pattern, features, index, mixer=None, title=None, layer=None))]
fn attention<'py>(
    py: Python<'py>,
    pattern: In<'py, f64, Ix4>,
    features: usize,
    index: usize,
    mixer: Option<String>,
    title: Option<String>,
    layer: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let v = pattern.as_array();
    let title = title.unwrap_or_else(|| attention_title(index, mixer.as_deref()));
    let (svg, html, png) = detached(py, || {
        let fig = attention_explorer(&title, v, features, layer).map_err(to_py)?;
        Ok((
            fig.svg_document().map_err(to_py)?,
            fig.html().map_err(to_py)?,
            attention_png(&fig).map_err(to_py)?,
        ))
    })?;
    figure_dict(py, svg, html, &png)
}

/// The SRAVEN token labels (`hyperlens_tasks::sraven::token_labels`): `P{panel}s{slot}` for the
/// context tokens, `Q{slot}` for the queries.
#[pyfunction]
fn token_labels(n_tokens: usize, features: usize) -> Vec<String> {
    hyperlens_tasks::sraven::token_labels(n_tokens, features)
}

/// Matrix heatmaps with hover values and a panel switch
/// (`hyperlens_report::code_explorer::matrix_panels`: the default labels and colour map, the
/// shape checks): `{"svg", "html", "png"}` (the PNG: the static heatmap of the panel shown
/// first). `values`: (name, float64 `[R, C]`) per panel; `cmap`: `viridis` or `blue-white-red`;
/// `mask`: bool `[R, C]`; `panel`: the name of the panel shown first.
#[pyfunction]
#[pyo3(signature = (values, row_labels=None, col_labels=None, title=String::new(), value_name=String::new(), row_name=String::new(), col_name=String::new(), x_label=String::new(), y_label=String::new(), cmap=None, range=None, mask=None, panel=None))]
#[allow(clippy::too_many_arguments)]
fn matrix_heatmap<'py>(
    py: Python<'py>,
    values: Vec<(String, InDyn<'py, f64>)>,
    row_labels: Option<Vec<String>>,
    col_labels: Option<Vec<String>>,
    title: String,
    value_name: String,
    row_name: String,
    col_name: String,
    x_label: String,
    y_label: String,
    cmap: Option<String>,
    range: Option<(f64, f64)>,
    mask: Option<Bound<'py, PyAny>>,
    panel: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let color_map = match cmap.as_deref() {
        None => None,
        Some("viridis") => Some(ColorMap::Viridis),
        Some("blue-white-red" | "bwr") => Some(ColorMap::BlueWhiteRed),
        Some(other) => {
            return Err(raise(
                Kind::Input,
                format!("cmap must be \"viridis\" or \"blue-white-red\", got {other:?}"),
            ))
        }
    };
    let spec = MatrixSpec {
        row_labels,
        col_labels,
        title,
        value_name,
        x_label,
        y_label,
        color_map,
        range,
        mask: mask.map(|m| array::<bool, Ix2>("mask", &m)).transpose()?,
    };
    let views: Vec<(String, ndarray::ArrayViewD<'_, f64>)> = values
        .iter()
        .map(|(n, v)| (n.clone(), v.as_array()))
        .collect();
    let panels = matrix_panels(&views, &spec).map_err(to_py)?;
    heatmap_out(py, &panels, panel.as_deref(), None, (&row_name, &col_name))
}

/// A heatmap explorer of `panels` as `{"svg", "html", "png"}` (the PNG: the static heatmap of
/// the panel shown first); `axes`: the names of the rows and the columns in the hover box.
fn heatmap_out<'py>(
    py: Python<'py>,
    panels: &[(String, Heatmap)],
    start: Option<&str>,
    masked: Option<&str>,
    axes: (&str, &str),
) -> PyResult<Bound<'py, PyDict>> {
    let (svg, html, png) = detached(py, || {
        let mut fig = heatmap_explorer(panels, start, masked).map_err(to_py)?;
        fig.row_name = axes.0.to_string();
        fig.col_name = axes.1.to_string();
        let svg = fig.svg_document().map_err(to_py)?;
        let html = fig.html().map_err(to_py)?;
        let shown = &panels[fig.start].1;
        let size = hyperlens_viz::Figure::size(shown);
        let png = render_png(shown, size).map_err(to_py)?;
        Ok((svg, html, png))
    })?;
    figure_dict(py, svg, html, &png)
}

/// The Q, K and V composition scores of a circuits analysis as heatmaps
/// (`hyperlens_report::code_explorer::composition_panels`, titled as `hyperlens circuits` titles
/// them): `{"svg", "html", "png"}`, one panel per kind in the order Q, K, V
/// (`CompositionKind::ALL`). `composition`: float64 `[L, H, L, H]` by kind name (`q`, `k`,
/// `v`); `baseline_p99`: the random baseline's 99th percentile by kind name (a kind without one
/// is titled without it); `panel`: the kind shown first.
///
/// # Errors
/// `InputError` for a kind missing from `composition`.
#[pyfunction]
#[pyo3(signature = (composition, baseline_p99, title=None, panel=None))]
fn composition_heatmap<'py>(
    py: Python<'py>,
    composition: std::collections::HashMap<String, Bound<'py, PyAny>>,
    baseline_p99: std::collections::HashMap<String, f64>,
    title: Option<String>,
    panel: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let arrays: Vec<(String, In<'py, f64, Ix4>, Option<f64>)> = CompositionKind::ALL
        .iter()
        .map(|kind| {
            let k = kind.name();
            let v = composition
                .get(k)
                .ok_or_else(|| raise(Kind::Input, format!("no `{k}` composition scores")))?;
            Ok((
                k.to_string(),
                view::<f64, Ix4>(k, v)?,
                baseline_p99.get(k).copied(),
            ))
        })
        .collect::<PyResult<_>>()?;
    let views: Vec<(String, ndarray::ArrayView4<'_, f64>, Option<f64>)> = arrays
        .iter()
        .map(|(k, v, p)| (k.clone(), v.as_array(), *p))
        .collect();
    let panels = composition_panels(&views, title.as_deref()).map_err(to_py)?;
    heatmap_out(py, &panels, panel.as_deref(), Some(NOT_COMPUTED), ("", ""))
}

/// The change in accuracy and in loss with each head ablated, as heatmaps
/// (`hyperlens_report::code_explorer::head_ablation_panels`): `{"svg", "html", "png"}`.
/// `delta_accuracy` and `loss`: float64 `[L, H]`; `base_loss`: the loss without ablation.
#[pyfunction]
#[pyo3(signature = (ablation, delta_accuracy, loss, base_loss, title=None, panel=None))]
#[allow(clippy::too_many_arguments)]
fn head_ablation_heatmap<'py>(
    py: Python<'py>,
    ablation: &str,
    delta_accuracy: In<'py, f64, Ix2>,
    loss: In<'py, f64, Ix2>,
    base_loss: f64,
    title: Option<String>,
    panel: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let panels = head_ablation_panels(
        ablation,
        delta_accuracy.as_array(),
        loss.as_array(),
        base_loss,
        title.as_deref(),
    )
    .map_err(to_py)?;
    heatmap_out(py, &panels, panel.as_deref(), None, ("", ""))
}

/// A figure as the Python side receives it: `{"svg": str, "html": str, "png": bytes}`.
fn figure_dict<'py>(
    py: Python<'py>,
    svg: String,
    html: String,
    png: &[u8],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("svg", svg)?;
    d.set_item("html", html)?;
    d.set_item("png", PyBytes::new(py, png))?;
    Ok(d)
}

/// Writes `data` to `path` atomically (a temporary file in its folder, then a rename), creating
/// the folder.
#[pyfunction]
fn write(py: Python<'_>, path: std::path::PathBuf, data: Vec<u8>) -> PyResult<()> {
    detached(py, || {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| raise(Kind::Other, format!("cannot create {}: {e}", dir.display())))?;
        }
        hyperlens_io::write_atomic(&path, &data).map_err(to_py)
    })
}

/// The latent-space explorer of a language model's code file `codes`
/// (`hyperlens_report::lm_explorer::lm_explorer_of`, as `hyperlens analyze --lm-codes` writes
/// `explorer.html`): `{"svg", "html", "png"}`. `projections`: `(name, float64 [N_u, C])` in the
/// analysis's order (`layer{l}` for the analysed layers, then `all`: the names of
/// `hyperlens_io::keys::pca::selection`); `prompts`: int64 `[N_u]`, the projected rows' prompt
/// indices; `factor`: the decoded factor.
#[pyfunction]
#[pyo3(signature = (codes, factor, projections, prompts))]
fn lm_explorer<'py>(
    py: Python<'py>,
    codes: std::path::PathBuf,
    factor: String,
    projections: Vec<(String, Bound<'py, PyAny>)>,
    prompts: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let projections: Vec<LmProjection> = projections
        .iter()
        .map(|(name, v)| {
            let layer = hyperlens_io::keys::pca::parse_selection(name).ok_or_else(|| {
                raise(
                    Kind::Input,
                    format!("projection `{name}`: expected `layer{{l}}` or `all`"),
                )
            })?;
            Ok(LmProjection {
                layer,
                projection: array::<f64, Ix2>("projections", v)?,
            })
        })
        .collect::<PyResult<_>>()?;
    let prompts = array::<i64, Ix1>("prompts", &prompts)?.to_vec();
    let (svg, html, png) = detached(py, || {
        let e = lm_explorer_of(
            &codes,
            &LmProjected {
                factor: &factor,
                projections: &projections,
                prompts: &prompts,
            },
        )
        .map_err(to_py)?;
        let fig = e.figure();
        Ok((
            fig.svg_document().map_err(to_py)?,
            fig.html().map_err(to_py)?,
            e.png().map_err(to_py)?,
        ))
    })?;
    figure_dict(py, svg, html, &png)
}

/// Registers `hyperlens._core.viz`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sraven_explorer, m)?)?;
    m.add_function(wrap_pyfunction!(logic_explorer, m)?)?;
    m.add_function(wrap_pyfunction!(lm_explorer, m)?)?;
    m.add_function(wrap_pyfunction!(attention, m)?)?;
    m.add_function(wrap_pyfunction!(token_labels, m)?)?;
    m.add_function(wrap_pyfunction!(matrix_heatmap, m)?)?;
    m.add_function(wrap_pyfunction!(composition_heatmap, m)?)?;
    m.add_function(wrap_pyfunction!(head_ablation_heatmap, m)?)?;
    m.add_function(wrap_pyfunction!(write, m)?)?;
    Ok(())
}
