//! `hyperlens.viz`: the interactive figures of `hyperlens-viz` (issue 36) for notebooks: the
//! latent-space explorer of code sets, the attention patterns with a head selector, and heatmaps
//! with hover values (composition scores, head ablation, any matrix). The same
//! SVG element as the report's `figures/<name>_explorer.svg`, `_attention.svg`; its HTML fragment
//! is what `_repr_html_` shows. The projections are the analysis crate's PCA (fit on the last set,
//! every set projected on its axes, as the report does) or t-SNE (per set); the PNG is the viz
//! crate's static figure of the same data.

use hyperlens_analysis::embed::{tsne as tsne_fit, TsneParams};
use hyperlens_analysis::lm::LmProjection;
use hyperlens_analysis::pca::PcaParams;
use hyperlens_report::lm_explorer::{lm_explorer_of, LmProjected};
use hyperlens_viz::{
    render_png, CodeExplorer, ColorMap, Coloring, ExplorerSet, Field, FieldValues, Heatmap,
    HeatmapExplorer, HeatmapOptions, InteractiveFigure, PatternExplorer, PcaScatter, ScatterPanel,
    SravenProblems, VizError,
};
use ndarray::{s, Array1, Array2, Array3, Array4, Ix1, Ix2, Ix3, Ix4, Ix5};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::arrays::{shape_error, InDyn};
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

fn need<'py>(d: &Bound<'py, PyDict>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    item(d, name)?.ok_or_else(|| raise(Kind::Input, format!("missing `{name}`")))
}

/// A numpy array argument of `D` dimensions, copied (the figures' data are small).
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

/// One field of the hover box, owned.
enum FieldData {
    Int(Vec<i64>),
    Cat(Vec<usize>, Vec<String>),
    Bool(Vec<bool>),
    Float(Vec<f64>),
    Text(Vec<String>),
}

/// Problems to draw on click, owned.
struct Problems {
    values: Array3<i64>,
    slot: Vec<i64>,
    prediction: Vec<i64>,
    marked: Vec<usize>,
    query: usize,
}

/// One set of the explorer as given from Python, owned.
struct SetIn {
    name: String,
    reproduce: String,
    /// `[N, L, H, Q, K]`.
    codes: ndarray::Array5<f32>,
    index: Vec<i64>,
    colors: Vec<Vec<usize>>,
    fields: Vec<(String, FieldData)>,
    problems: Option<Problems>,
}

fn classes(arg: &str, v: Array1<i64>) -> PyResult<Vec<usize>> {
    v.iter()
        .map(|&x| {
            usize::try_from(x)
                .map_err(|_| raise(Kind::Input, format!("`{arg}`: negative class {x}")))
        })
        .collect()
}

fn set_in(d: &Bound<'_, PyDict>) -> PyResult<SetIn> {
    let name: String = need(d, "name")?.extract()?;
    let codes = array::<f32, Ix5>("codes", &need(d, "codes")?)?;
    let n = codes.dim().0;
    let index = match item(d, "index")? {
        Some(v) => array::<i64, Ix1>("index", &v)?.to_vec(),
        None => (0..n as i64).collect(),
    };
    let mut colors = Vec::new();
    for (k, v) in need(d, "colors")?.try_iter()?.enumerate() {
        colors.push(classes(
            &format!("colors[{k}]"),
            array::<i64, Ix1>("colors", &v?)?,
        )?);
    }
    let mut fields = Vec::new();
    for f in need(d, "fields")?.try_iter()? {
        let f = f?;
        let f = f.cast::<PyDict>()?;
        let fname: String = need(f, "name")?.extract()?;
        let kind: String = need(f, "kind")?.extract()?;
        let v = need(f, "values")?;
        let data = match kind.as_str() {
            "int" => FieldData::Int(array::<i64, Ix1>(&fname, &v)?.to_vec()),
            "cat" => FieldData::Cat(
                classes(&fname, array::<i64, Ix1>(&fname, &v)?)?,
                need(f, "names")?.extract()?,
            ),
            "bool" => FieldData::Bool(array::<bool, Ix1>(&fname, &v)?.to_vec()),
            "float" => FieldData::Float(array::<f64, Ix1>(&fname, &v)?.to_vec()),
            "text" => FieldData::Text(v.extract()?),
            other => {
                return Err(raise(
                    Kind::Input,
                    format!(
                        "field `{fname}`: unknown kind `{other}` (int, cat, bool, float, text)"
                    ),
                ))
            }
        };
        fields.push((fname, data));
    }
    let problems = match item(d, "problems")? {
        None => None,
        Some(p) => {
            let p = p.cast::<PyDict>()?;
            Some(Problems {
                values: array::<i64, Ix3>("problems.values", &need(p, "values")?)?,
                slot: array::<i64, Ix1>("problems.slot", &need(p, "slot")?)?.to_vec(),
                prediction: array::<i64, Ix1>("problems.prediction", &need(p, "prediction")?)?
                    .to_vec(),
                marked: need(p, "marked")?.extract()?,
                query: need(p, "query")?.extract()?,
            })
        }
    };
    Ok(SetIn {
        name,
        reproduce: item(d, "reproduce")?
            .map(|v| v.extract())
            .transpose()?
            .unwrap_or_default(),
        codes,
        index,
        colors,
        fields,
        problems,
    })
}

/// The projections of every set (`[P = 1, L, N, 2]` each) and the PCA's explained variance ratio of
/// PC1 and PC2 per layer (zeros for t-SNE).
type Projections = (Vec<Array4<f64>>, Vec<[f64; 2]>);

/// The 2-D projections of every set: PCA fit on the last set's codes per layer (every set
/// projected on its axes), or the exact t-SNE of each set per layer (`hl.analysis.tsne` with
/// `theta=0`).
fn project(sets: &[SetIn], tsne: bool, seed: u64) -> PyResult<Projections> {
    let last = sets
        .last()
        .ok_or_else(|| raise(Kind::Input, "no code set given"))?;
    let (_, l, h, q, k) = last.codes.dim();
    let features = |s: &SetIn, layer: usize| -> PyResult<Array2<f64>> {
        let (n, sl, sh, sq, sk) = s.codes.dim();
        if (sl, sh, sq, sk) != (l, h, q, k) {
            return Err(shape_error(
                &format!("{}: codes", s.name),
                &format!("[N, {l}, {h}, {q}, {k}] as the other set's"),
                s.codes.shape(),
            ));
        }
        let x = s.codes.slice(s![.., layer, .., .., ..]).mapv(f64::from);
        x.into_shape_with_order((n, h * q * k))
            .map_err(|e| raise(Kind::Shape, e.to_string()))
    };
    let mut out: Vec<Array4<f64>> = sets
        .iter()
        .map(|s| Array4::zeros((1, l, s.codes.dim().0, 2)))
        .collect();
    let mut explained = vec![[0.0, 0.0]; l];
    for (layer, ratio) in explained.iter_mut().enumerate() {
        if tsne {
            for (s, o) in sets.iter().zip(out.iter_mut()) {
                let x = features(s, layer)?;
                // The report's deterministic setting (exact gradients, seeded).
                let params = TsneParams::deterministic(seed, x.nrows());
                let emb = tsne_fit(x.view(), &params).map_err(to_py)?;
                o.slice_mut(s![0, layer, .., ..]).assign(&emb);
            }
        } else {
            let fit = PcaParams::new(2)
                .fit(features(last, layer)?.view())
                .map_err(to_py)?;
            let r = fit.explained_variance_ratio();
            *ratio = [
                r.get(0).copied().unwrap_or(0.0),
                r.get(1).copied().unwrap_or(0.0),
            ];
            for (s, o) in sets.iter().zip(out.iter_mut()) {
                let p = fit.transform(features(s, layer)?.view()).map_err(to_py)?;
                o.slice_mut(s![0, layer, .., ..])
                    .assign(&p.slice(s![.., 0..2]));
            }
        }
    }
    Ok((out, explained))
}

/// The latent-space explorer of code sets: `{"svg": document, "html": fragment, "png": bytes}`.
///
/// `sets`: dicts with `name`, `codes` float32 `[N, L, H, Q, K]`, `colors` (one int64 `[N]` per
/// colouring), `fields` (hover lines: dicts `name`, `kind` in int / cat / bool / float / text,
/// `values`, `names` for cat), and optional `index` int64 `[N]`, `reproduce`, `problems` (dict:
/// `values` int64 `[N, 9, F]`, `slot`, `prediction` int64 `[N]`, `marked` token list, `query`).
/// `colorings`: (name, class names) pairs. The PNG is the static scatter of the last set at
/// `layer`, coloured by the first colouring.
#[pyfunction]
#[pyo3(signature = (title, sets, colorings, layer_names, key_names, projection="pca", layer=None, seed=0))]
#[allow(clippy::too_many_arguments)]
fn explorer<'py>(
    py: Python<'py>,
    title: String,
    sets: Vec<Bound<'py, PyDict>>,
    colorings: Vec<(String, Vec<String>)>,
    layer_names: Vec<String>,
    key_names: Vec<String>,
    projection: &str,
    layer: Option<usize>,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let tsne = match projection {
        "pca" => false,
        "tsne" | "t-sne" => true,
        other => {
            return Err(raise(
                Kind::Input,
                format!("projection must be \"pca\" or \"tsne\", got {other:?}"),
            ))
        }
    };
    let sets: Vec<SetIn> = sets.iter().map(set_in).collect::<PyResult<_>>()?;
    let (svg, html, png) = detached(py, || {
        let (points, explained) = project(&sets, tsne, seed)?;
        let heads = sets.last().map_or(0, |s| s.codes.dim().2);
        let codes: Vec<Array3<f32>> = sets
            .iter()
            .map(|s| {
                let (n, l, h, q, k) = s.codes.dim();
                s.codes
                    .to_shape((n, l, h * q * k))
                    .map(|v| v.to_owned())
                    .map_err(|e| raise(Kind::Shape, e.to_string()))
            })
            .collect::<PyResult<_>>()?;
        let axes: [String; 2] = if tsne {
            ["t-SNE 1".into(), "t-SNE 2".into()]
        } else {
            ["PC1".into(), "PC2".into()]
        };
        let fig = CodeExplorer {
            title: title.clone(),
            layers: layer_names.clone(),
            projections: vec![(if tsne { "t-SNE" } else { "PCA" }.into(), axes.clone())],
            colorings: colorings
                .iter()
                .map(|(name, classes)| Coloring {
                    name: name.clone(),
                    classes: classes.clone(),
                })
                .collect(),
            heads: (0..heads).map(|h| format!("H{h}")).collect(),
            keys: key_names.clone(),
            sets: sets
                .iter()
                .zip(&points)
                .zip(&codes)
                .map(|((s, p), c)| ExplorerSet {
                    name: s.name.clone(),
                    reproduce: s.reproduce.clone(),
                    points: p.view(),
                    index: &s.index,
                    colors: s.colors.iter().map(Vec::as_slice).collect(),
                    fields: s
                        .fields
                        .iter()
                        .map(|(name, f)| Field {
                            name: name.clone(),
                            values: match f {
                                FieldData::Int(v) => FieldValues::Int(v),
                                FieldData::Cat(v, names) => FieldValues::Category {
                                    labels: v,
                                    names: names.clone(),
                                },
                                FieldData::Bool(v) => FieldValues::Bool(v),
                                FieldData::Float(v) => FieldValues::Float(v),
                                FieldData::Text(v) => FieldValues::Text(v.clone()),
                            },
                        })
                        .collect(),
                    codes: Some(c.view()),
                    problems: s.problems.as_ref().map(|p| SravenProblems {
                        values: p.values.view(),
                        slot: &p.slot,
                        prediction: &p.prediction,
                        marked: p.marked.clone(),
                        query: p.query,
                    }),
                })
                .collect(),
            start_layer: layer,
        };
        let svg = fig.svg_document().map_err(to_py)?;
        let html = fig.html().map_err(to_py)?;
        // The PNG: the last set at the shown layer, by the first colouring.
        let (last, lp) = (sets.len() - 1, points.len() - 1);
        let shown = layer.unwrap_or(layer_names.len().saturating_sub(1));
        let panel_points = points[lp].slice(s![
            0,
            shown.min(layer_names.len().saturating_sub(1)),
            ..,
            ..
        ]);
        let names: Vec<String> = colorings.first().map(|c| c.1.clone()).unwrap_or_default();
        let first = sets[last].colors.first().cloned().unwrap_or_default();
        let png = render_png(
            &PcaScatter::by_category(
                &title,
                vec![ScatterPanel {
                    title: format!(
                        "layer {}",
                        layer_names.get(shown).map_or("?", String::as_str)
                    ),
                    points: panel_points,
                    explained: explained.get(shown).copied().unwrap_or([0.0, 0.0]),
                    axes: if tsne { Some(axes) } else { None },
                }],
                &first,
                &names,
                colorings.first().map_or("", |c| c.0.as_str()),
            ),
            (900, 560),
        )
        .map_err(to_py)?;
        Ok((svg, html, png))
    })?;
    figure_dict(py, svg, html, &png)
}

/// Attention patterns (or any stack of matrices) with a layer and head selector and hover values:
/// `{"svg", "html", "png"}`. `values`: float64 `[L, H, T, T]`; `tokens`: T labels. The PNG is the
/// viz crate's attention grid of the shown layer.
#[pyfunction]
#[pyo3(signature = (title, values, tokens, layer_names, head_names=None, layer=None))]
fn patterns<'py>(
    py: Python<'py>,
    title: String,
    values: Bound<'py, PyAny>,
    tokens: Vec<String>,
    layer_names: Vec<String>,
    head_names: Option<Vec<String>>,
    layer: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let v = array::<f64, Ix4>("values", &values)?;
    let (svg, html, png) = detached(py, || {
        let mut fig = PatternExplorer::attention(&title, v.view(), &tokens);
        fig.layers = layer_names.clone();
        if let Some(h) = &head_names {
            fig.heads = h.clone();
        }
        fig.start_layer = layer;
        let svg = fig.svg_document().map_err(to_py)?;
        let html = fig.html().map_err(to_py)?;
        let shown = layer
            .unwrap_or(v.dim().0.saturating_sub(1))
            .min(v.dim().0.saturating_sub(1));
        let mut grid = hyperlens_viz::AttentionGrid::new(
            &title,
            v.slice(s![shown, .., .., ..]),
            &tokens,
            &tokens,
        );
        grid.panel_titles = fig.heads.clone();
        if let Some(r) = fig.range {
            grid.range = Some(r);
        }
        grid.color_map = fig.color_map;
        let size = hyperlens_viz::Figure::size(&grid);
        let png = render_png(&grid, size).map_err(to_py)?;
        Ok((svg, html, png))
    })?;
    figure_dict(py, svg, html, &png)
}

/// One panel of [`heatmap`]: the static [`Heatmap`] built by the constructor the CLI and the
/// report use for its kind.
fn heatmap_panel(
    d: &Bound<'_, PyDict>,
    rows: &Option<Vec<String>>,
    cols: &Option<Vec<String>>,
) -> PyResult<(String, Heatmap)> {
    let name: String = item(d, "name")?
        .map(|v| v.extract())
        .transpose()?
        .unwrap_or_default();
    let kind: String = item(d, "kind")?
        .map(|v| v.extract())
        .transpose()?
        .unwrap_or_else(|| "matrix".into());
    let text = |key: &str| -> PyResult<String> {
        Ok(item(d, key)?
            .map(|v| v.extract())
            .transpose()?
            .unwrap_or_default())
    };
    let title = text("title")?;
    let value_name = text("value_name")?;
    let range: Option<(f64, f64)> = item(d, "range")?.map(|v| v.extract()).transpose()?;
    let values = need(d, "values")?;
    let cmap = |values: &Array2<f64>| -> PyResult<ColorMap> {
        match item(d, "cmap")?
            .map(|v| v.extract::<String>())
            .transpose()?
            .as_deref()
        {
            Some("viridis") => Ok(ColorMap::Viridis),
            Some("blue-white-red" | "bwr") => Ok(ColorMap::BlueWhiteRed),
            Some(other) => Err(raise(
                Kind::Input,
                format!("cmap must be \"viridis\" or \"blue-white-red\", got {other:?}"),
            )),
            // Diverging when a value is negative (as the patterns' default).
            None if values.iter().any(|&v| v < 0.0) => Ok(ColorMap::BlueWhiteRed),
            None => Ok(ColorMap::Viridis),
        }
    };
    let fig = match kind.as_str() {
        "composition" => {
            let v = array::<f64, Ix4>("values", &values)?;
            Heatmap::composition(&title, v.view()).map_err(to_py)?
        }
        "head_scores" => {
            let v = array::<f64, Ix2>("values", &values)?;
            let map = cmap(&v)?;
            Heatmap::head_scores(&title, v.view(), &value_name, map, range).map_err(to_py)?
        }
        "matrix" => {
            let v = array::<f64, Ix2>("values", &values)?;
            let mask = item(d, "mask")?
                .map(|m| array::<bool, Ix2>("mask", &m))
                .transpose()?;
            let color_map = cmap(&v)?;
            Heatmap::new(
                v,
                HeatmapOptions {
                    title,
                    x_label: text("x_label")?,
                    y_label: text("y_label")?,
                    x_ticks: cols.clone().unwrap_or_default(),
                    y_ticks: rows.clone().unwrap_or_default(),
                    color_map,
                    range,
                    color_bar_label: value_name,
                    separators: item(d, "separators")?.map(|v| v.extract()).transpose()?,
                    mask,
                    ..HeatmapOptions::default()
                },
            )
        }
        other => {
            return Err(raise(
                Kind::Input,
                format!(
                    "panel `{name}`: unknown kind `{other}` (matrix, head_scores, composition)"
                ),
            ))
        }
    };
    Ok((name, fig))
}

/// Heatmaps with hover values and a panel switch: `{"svg", "html", "png"}` (the PNG: the viz
/// crate's static heatmap of the panel shown first).
///
/// `panels`: dicts with `values` and optional `name` (in the switch), `kind` (`matrix`: float64
/// `[R, C]` with `row_labels` R and `col_labels` C, `x_label`, `y_label`, `mask` bool `[R, C]`,
/// `separators`; `head_scores`: float64 `[L, H]`, labelled `L{l}` x `H{h}`; `composition`:
/// float64 `[L, H, L, H]`, as `hyperlens circuits` draws it), `title`, `value_name`, `cmap`
/// (`viridis`, `blue-white-red`; by default diverging when a value is negative), `range`.
#[pyfunction]
#[pyo3(signature = (panels, row_labels=None, col_labels=None, row_name=String::new(), col_name=String::new(), masked=None, start=0))]
#[allow(clippy::too_many_arguments)]
fn heatmap<'py>(
    py: Python<'py>,
    panels: Vec<Bound<'py, PyDict>>,
    row_labels: Option<Vec<String>>,
    col_labels: Option<Vec<String>>,
    row_name: String,
    col_name: String,
    masked: Option<String>,
    start: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let figs: Vec<(String, Heatmap)> = panels
        .iter()
        .map(|d| heatmap_panel(d, &row_labels, &col_labels))
        .collect::<PyResult<_>>()?;
    let (svg, html, png) = detached(py, || {
        let mut fig = HeatmapExplorer::new(figs.iter().map(|(n, h)| (n.clone(), h)).collect());
        fig.row_name = row_name.clone();
        fig.col_name = col_name.clone();
        if let Some(m) = &masked {
            fig.masked = m.clone();
        }
        fig.start = start;
        let svg = fig.svg_document().map_err(to_py)?;
        let html = fig.html().map_err(to_py)?;
        let shown = &figs[start.min(figs.len().saturating_sub(1))].1;
        let size = hyperlens_viz::Figure::size(shown);
        let png = render_png(shown, size).map_err(to_py)?;
        Ok((svg, html, png))
    })?;
    figure_dict(py, svg, html, &png)
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
/// `explorer.html`): `{"svg", "html", "png"}`. `projections`: `(layer or None, float64
/// [N_u, C])` in the analysis's order (the analysed layers, then all); `prompts`: int64 `[N_u]`,
/// the projected rows' prompt indices; `factor`: the decoded factor.
#[pyfunction]
#[pyo3(signature = (codes, factor, projections, prompts))]
fn lm_explorer<'py>(
    py: Python<'py>,
    codes: std::path::PathBuf,
    factor: String,
    projections: Vec<(Option<usize>, Bound<'py, PyAny>)>,
    prompts: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let projections: Vec<LmProjection> = projections
        .iter()
        .map(|(layer, v)| {
            Ok(LmProjection {
                layer: *layer,
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
    m.add_function(wrap_pyfunction!(explorer, m)?)?;
    m.add_function(wrap_pyfunction!(lm_explorer, m)?)?;
    m.add_function(wrap_pyfunction!(patterns, m)?)?;
    m.add_function(wrap_pyfunction!(heatmap, m)?)?;
    m.add_function(wrap_pyfunction!(write, m)?)?;
    Ok(())
}
