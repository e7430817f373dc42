//! The latent-space explorer of a logic checkpoint in the HTML page (GitHub issue 36), in place of
//! the projections-by-term PNG: the OOD codes of the first `n` problems (those the t-SNE embeds)
//! on the PCA and t-SNE that the measure stage computed (`tables/<name>/projections.npz`, all
//! layers), coloured by the task's first or second term, with hover for the problem's terms,
//! target and prediction, and on click the problem's code (every layer's heads). It reads what the
//! measure stage wrote (`codes/<name>_ood.npz`); it projects nothing again.

use std::fs::File;
use std::path::Path;

use hyperlens_io::keys;
use hyperlens_viz::{CodeExplorer, Coloring, ExplorerSet, Field, FieldValues};
use ndarray::{s, Array1, Array2, Array3, Array4, Array5, ArrayD, Ix1, Ix2};
use ndarray_npy::NpzReader;

use crate::code_explorer::{logic_key_names, logic_term_text, term_names};
use crate::data::LogicEntry;
use crate::doc::Interactive;
use crate::error::{ReportError, Result};
use crate::sraven::explorer::write_svg;

/// An `.npz` file of the report, open for reading, with its shown name.
struct Npz {
    reader: NpzReader<File>,
    names: Vec<String>,
    shown: String,
}

impl Npz {
    fn open(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let bad = |e: &dyn std::fmt::Display| ReportError::InvalidInput(format!("{shown}: {e}"));
        let file = File::open(path).map_err(|source| ReportError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut reader = NpzReader::new(file).map_err(|e| bad(&e))?;
        let names = reader.names().map_err(|e| bad(&e))?;
        Ok(Self {
            reader,
            names,
            shown,
        })
    }

    fn has(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    fn get<T: ndarray_npy::ReadableElement, D: ndarray::Dimension>(
        &mut self,
        name: &str,
    ) -> Result<ndarray::Array<T, D>> {
        let a: ArrayD<T> = self.reader.by_name(name).map_err(|e| {
            ReportError::InvalidInput(format!("{}: array `{name}`: {e}", self.shown))
        })?;
        let dims = a.shape().to_vec();
        a.into_dimensionality::<D>().map_err(|_| {
            ReportError::InvalidInput(format!(
                "{}: array `{name}` has shape {dims:?}, not {} axes",
                self.shown,
                D::NDIM.unwrap_or(0)
            ))
        })
    }
}

/// Writes `figures/<name>_explorer.svg`, the explorer of the logic checkpoint's OOD codes, and
/// returns it; `None` when the terms need more than 64 colours.
///
/// # Shapes
/// Reads `codes` float32 `[N, L, H, Q, K]`, `term_ids` int64 `[N, Kt]`, `target` and
/// `prediction` float32 `[N]` (when present), `problem` int64 `[N]` (when present) of
/// `codes/<name>_ood.npz`; `pca_all` float64 `[N, 2]` and `tsne_all` float64 `[n, 2]` of
/// `tables/<name>/projections.npz`.
///
/// # Errors
/// A file or array that cannot be read or does not fit the others, or a figure that cannot be
/// written.
pub fn explorer_figure(e: &LogicEntry, out: &Path) -> Result<Option<Interactive>> {
    let name = &e.name;
    let codes_path = out.join("codes").join(format!("{name}_ood.npz"));
    let mut z = Npz::open(&codes_path)?;
    let codes: Array5<f32> = z.get(keys::codes::CODES)?;
    let ids: Array2<i64> = z.get(keys::codes::TERM_IDS)?;
    let float = |z: &mut Npz, key: &str| -> Result<Option<Vec<f64>>> {
        if !z.has(key) {
            return Ok(None);
        }
        let a: Array1<f32> = z.get::<f32, Ix1>(key)?;
        Ok(Some(a.iter().map(|&v| f64::from(v)).collect()))
    };
    let target = float(&mut z, keys::codes::TARGET)?;
    let prediction = float(&mut z, keys::codes::PREDICTION)?;
    let problem: Option<Array1<i64>> = if z.has(keys::codes::PROBLEM) {
        Some(z.get(keys::codes::PROBLEM)?)
    } else {
        None
    };
    let proj_path = out.join("tables").join(name).join("projections.npz");
    let mut p = Npz::open(&proj_path)?;
    let pca: Array2<f64> =
        p.get::<f64, Ix2>(&keys::pca::name(keys::projections::PCA_PREFIX, None))?;
    let tsne: Array2<f64> = p.get::<f64, Ix2>(keys::projections::TSNE_ALL)?;
    let (big_n, l, h, q, k) = codes.dim();
    let n = tsne.nrows();
    // Every array has a row per code, and the t-SNE embeds the first n <= N of them.
    let fits = |what: &str, rows: usize| {
        if rows == big_n && n <= big_n {
            Ok(())
        } else {
            Err(ReportError::InvalidInput(format!(
                "{} and {}: `{what}` has {rows} rows for {big_n} codes and {n} t-SNE points",
                codes_path.display(),
                proj_path.display(),
            )))
        }
    };
    fits("pca_all", pca.nrows())?;
    fits(keys::codes::TERM_IDS, ids.nrows())?;
    for v in [&target, &prediction].into_iter().flatten() {
        fits("target / prediction", v.len())?;
    }
    if let Some(pr) = &problem {
        fits(keys::codes::PROBLEM, pr.len())?;
    }
    if n == 0 || pca.ncols() < 2 || tsne.ncols() < 2 || ids.ncols() == 0 {
        return Err(ReportError::InvalidInput(format!(
            "{}: no projection to draw",
            proj_path.display()
        )));
    }
    let n_terms = ids.iter().copied().max().unwrap_or(0).max(0) as usize + 1;
    if n_terms > 64 {
        return Ok(None);
    }
    let mut points = Array4::<f64>::zeros((2, 1, n, 2));
    points
        .slice_mut(s![0, 0, .., ..])
        .assign(&pca.slice(s![..n, 0..2]));
    points
        .slice_mut(s![1, 0, .., ..])
        .assign(&tsne.slice(s![..n, 0..2]));
    let names = term_names(n_terms);
    let kt = ids.ncols().min(2);
    let labels: Vec<Vec<usize>> = (0..kt)
        .map(|j| (0..n).map(|i| ids[[i, j]].max(0) as usize).collect())
        .collect();
    let terms = logic_term_text(ids.slice(s![..n, ..]), &names);
    let index: Vec<i64> = match &problem {
        Some(pr) => pr.iter().take(n).copied().collect(),
        None => (0..n as i64).collect(),
    };
    // Every layer's heads side by side: [n, 1, L * H * Q * K], layer-major.
    let flat: Array3<f32> = codes
        .slice(s![..n, .., .., .., ..])
        .to_owned()
        .into_shape_with_order((n, 1, l * h * q * k))
        .map_err(|err| {
            ReportError::InvalidInput(format!("{}: codes: {err}", codes_path.display()))
        })?;
    let heads: Vec<String> = (0..l)
        .flat_map(|li| (0..h).map(move |hi| format!("L{li}H{hi}")))
        .collect();
    // The paper's logic site: the last token's attention to itself, one key.
    let keys = logic_key_names(q, k);
    let mut fields = vec![Field {
        name: "terms".into(),
        values: FieldValues::Text(terms),
    }];
    if let Some(t) = &target {
        fields.push(Field {
            name: "target".into(),
            values: FieldValues::Float(&t[..n]),
        });
    }
    if let Some(pr) = &prediction {
        fields.push(Field {
            name: "prediction".into(),
            values: FieldValues::Float(&pr[..n]),
        });
    }
    let colorings: Vec<Coloring> = ["first term", "second term"][..kt]
        .iter()
        .map(|c| Coloring {
            name: (*c).into(),
            classes: names.clone(),
        })
        .collect();
    let fig = CodeExplorer {
        title: format!("{name}: latent codes of the OOD set, all layers (the first {n})"),
        layers: vec!["all".into()],
        projections: vec![
            ("PCA".into(), ["PC1".into(), "PC2".into()]),
            ("t-SNE".into(), ["t-SNE 1".into(), "t-SNE 2".into()]),
        ],
        colorings,
        heads,
        keys,
        sets: vec![ExplorerSet {
            name: "OOD".into(),
            reproduce: format!("codes/{name}_ood.npz, row = problem"),
            points: points.view(),
            index: &index,
            colors: labels.iter().map(Vec::as_slice).collect(),
            fields,
            codes: Some(flat.view()),
            problems: None,
        }],
        start_layer: None,
    };
    write_svg(
        out,
        format!("figures/{name}_explorer.svg"),
        &fig,
        "hover, click, zoom, PCA or t-SNE",
    )
    .map(Some)
}
