//! `hyperlens.analysis`: the analysis crate's PCA, decoding, k-means, silhouette, t-SNE and the
//! whole latent-code analysis of `hyperlens analyze`, on numpy arrays.

use hyperlens_analysis::cluster::{kmeans as kmeans_fit, silhouette_score, KMeansParams};
use hyperlens_analysis::codes::report::CodeSplit;
use hyperlens_analysis::decode::{decode_with_probe, DecodeParams, LogisticParams};
use hyperlens_analysis::embed::{tsne as tsne_fit, TsneParams};
use hyperlens_analysis::pca::PcaParams;
use hyperlens_analysis::{analyze_pair, CodeSet, LatentAnalysisParams};
use hyperlens_io::keys::pca as pca_keys;
use ndarray::{Array1, Ix5};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::{check_finite_f64, out, In1, In2, InDyn};
use crate::errors::{detached, raise, to_py, Interrupt, Kind};
use crate::records;

/// PCA of `x` float64 [N, D] on `n_components` components.
#[pyfunction]
fn pca<'py>(
    py: Python<'py>,
    x: In2<'py, f64>,
    n_components: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let xv = x.as_array();
    check_finite_f64("X", &xv)?;
    let (fit, proj) = detached(py, || {
        let fit = PcaParams::new(n_components).fit(xv).map_err(to_py)?;
        let proj = fit.transform(xv).map_err(to_py)?;
        Ok((fit, proj))
    })?;
    let d = PyDict::new(py);
    d.set_item("components", out(py, fit.components().clone()))?;
    d.set_item(
        "explained_variance",
        out(py, fit.explained_variance().clone()),
    )?;
    d.set_item(
        "explained_variance_ratio",
        out(py, fit.explained_variance_ratio().clone()),
    )?;
    d.set_item("mean", out(py, fit.mean().clone()))?;
    d.set_item("projection", out(py, proj))?;
    Ok(d)
}

/// Logistic decoding train -> test (the analysis crate's `decode`), plus the probe's predictions
/// on the test set.
#[pyfunction]
#[pyo3(signature = (x_train, y_train, x_test, y_test, c=1.0, max_iter=100, tol=1e-4, shuffled_control=true, seed=0))]
#[allow(clippy::too_many_arguments)]
fn decode<'py>(
    py: Python<'py>,
    x_train: In2<'py, f64>,
    y_train: In1<'py, i64>,
    x_test: In2<'py, f64>,
    y_test: In1<'py, i64>,
    c: f64,
    max_iter: u64,
    tol: f64,
    shuffled_control: bool,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let (xtr, ytr, xte, yte) = (
        x_train.as_array(),
        y_train.as_array(),
        x_test.as_array(),
        y_test.as_array(),
    );
    check_finite_f64("X_train", &xtr)?;
    check_finite_f64("X_test", &xte)?;
    let params = DecodeParams {
        logistic: LogisticParams {
            c,
            max_iterations: max_iter,
            tol,
        },
        shuffled_control,
        seed,
    };
    let decoded = detached(py, || {
        decode_with_probe(xtr, ytr, xte, yte, &params).map_err(to_py)
    })?;
    let (r, pred, probe) = (decoded.result, decoded.predictions, decoded.probe);
    let d = PyDict::new(py);
    d.set_item("accuracy", r.accuracy)?;
    d.set_item("balanced_accuracy", r.balanced_accuracy)?;
    d.set_item("majority_class", r.majority_class)?;
    d.set_item("majority_baseline", r.majority_baseline)?;
    d.set_item("shuffled_control", r.shuffled_control)?;
    d.set_item("train_accuracy", r.train_accuracy)?;
    d.set_item("classes", out(py, Array1::from(r.classes.clone())))?;
    d.set_item("confusion", out(py, r.confusion.mapv(|v| v as i64)))?;
    d.set_item("n_iter", r.iterations)?;
    d.set_item("converged", r.converged)?;
    d.set_item("predictions", out(py, pred))?;
    d.set_item("coef", out(py, probe.coef().clone()))?;
    d.set_item("intercept", out(py, probe.intercept().clone()))?;
    Ok(d)
}

/// k-means with k-means++ restarts: labels int64 [N], centroids float64 [k, D], inertia.
#[pyfunction]
#[pyo3(signature = (x, k, n_init=3, seed=0, max_iter=300, tol=1e-4))]
fn kmeans<'py>(
    py: Python<'py>,
    x: In2<'py, f64>,
    k: usize,
    n_init: usize,
    seed: u64,
    max_iter: u64,
    tol: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let xv = x.as_array();
    check_finite_f64("X", &xv)?;
    let params = KMeansParams {
        n_clusters: k,
        seed,
        n_runs: n_init,
        max_iterations: max_iter,
        tolerance: tol,
        ..KMeansParams::new(k)
    };
    let fit = detached(py, || kmeans_fit(xv, &params).map_err(to_py))?;
    let d = PyDict::new(py);
    d.set_item("labels", out(py, fit.assignments.mapv(|v| v as i64)))?;
    d.set_item("centroids", out(py, fit.centroids))?;
    d.set_item("inertia", fit.inertia)?;
    Ok(d)
}

/// The mean silhouette coefficient of `labels` on `x` (all points).
#[pyfunction]
fn silhouette(py: Python<'_>, x: In2<'_, f64>, labels: In1<'_, i64>) -> PyResult<f64> {
    let (xv, lv) = (x.as_array(), labels.as_array());
    check_finite_f64("X", &xv)?;
    detached(py, || silhouette_score(xv, lv).map_err(to_py))
}

/// A 2-D t-SNE embedding, float64 [N, 2].
#[pyfunction]
#[pyo3(signature = (x, perplexity=30.0, theta=0.5, max_iter=1000, seed=0))]
fn tsne<'py>(
    py: Python<'py>,
    x: In2<'py, f64>,
    perplexity: f64,
    theta: f64,
    max_iter: usize,
    seed: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let xv = x.as_array();
    check_finite_f64("X", &xv)?;
    let params = TsneParams {
        perplexity,
        theta,
        max_iter,
        seed,
    };
    let emb = detached(py, || tsne_fit(xv, &params).map_err(to_py))?;
    Ok(out(py, emb))
}

/// The entry `name` of `d`, unless absent or None.
fn item<'py>(d: &Bound<'py, PyDict>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    match d.get_item(name)? {
        Some(v) if !v.is_none() => Ok(Some(v)),
        _ => Ok(None),
    }
}

/// An analysis crate code set of a Python code set's arrays.
fn code_set(arg: &str, d: &Bound<'_, PyDict>) -> PyResult<CodeSet> {
    let get = |name: &str| item(d, name);
    let codes: InDyn<'_, f32> = get("codes")?
        .ok_or_else(|| raise(Kind::Input, format!("`{arg}` has no `codes`")))?
        .extract()?;
    let label: In1<'_, i64> = get("label")?
        .ok_or_else(|| raise(Kind::Input, format!("`{arg}` has no `label`")))?
        .extract()?;
    let opt2 = |name: &str| -> PyResult<Option<In2<'_, i64>>> {
        get(name)?.map(|v| v.extract()).transpose()
    };
    let opt1 = |name: &str| -> PyResult<Option<In1<'_, i64>>> {
        get(name)?.map(|v| v.extract()).transpose()
    };
    let correct: Option<In1<'_, bool>> = get("correct")?.map(|v| v.extract()).transpose()?;
    validated_code_set(
        arg,
        &codes,
        &label,
        CodeArrays {
            rules: opt2("rules")?.as_ref(),
            inputs: opt2("inputs")?.as_ref(),
            target: opt1("target")?.as_ref(),
            prediction: opt1("prediction")?.as_ref(),
            correct: correct.as_ref(),
        },
    )
}

/// The optional arrays of a code set, as numpy arguments.
pub(crate) struct CodeArrays<'a, 'py> {
    /// int64 `[N, F]`.
    pub rules: Option<&'a In2<'py, i64>>,
    /// int64 `[N, K]`.
    pub inputs: Option<&'a In2<'py, i64>>,
    /// int64 `[N]`.
    pub target: Option<&'a In1<'py, i64>>,
    /// int64 `[N]`.
    pub prediction: Option<&'a In1<'py, i64>>,
    /// bool `[N]`.
    pub correct: Option<&'a In1<'py, bool>>,
}

/// A code set of numpy arrays, validated by the analysis crate's one validation of a code set
/// ([`CodeSet::named`] and its setters, which the file reader uses too); errors name `arg`.
///
/// # Errors
/// `ShapeError` unless `codes` is `[N, L, H, Q, K]`; the analysis crate's errors (empty axes,
/// non-finite codes, row counts, labels and rules outside `0..8`); `BudgetError` for the copies.
pub(crate) fn validated_code_set(
    arg: &str,
    codes: &InDyn<'_, f32>,
    label: &In1<'_, i64>,
    more: CodeArrays<'_, '_>,
) -> PyResult<CodeSet> {
    let shape = codes.as_array().shape().to_vec();
    let codes = codes
        .owned(&format!("{arg}.codes"))?
        .into_dimensionality::<Ix5>()
        .map_err(|_| {
            crate::arrays::shape_error(&format!("{arg}.codes"), "[N, L, H, Q, K]", &shape)
        })?;
    let name = |a: &str| format!("{arg}.{a}");
    let mut set = CodeSet::named(arg, codes, label.owned(&name("label"))?).map_err(to_py)?;
    if let Some(a) = more.rules {
        set = set.with_rules(a.owned(&name("rules"))?).map_err(to_py)?;
    }
    if let Some(a) = more.inputs {
        set = set.with_inputs(a.owned(&name("inputs"))?).map_err(to_py)?;
    }
    if let Some(a) = more.target {
        set = set.with_target(a.owned(&name("target"))?).map_err(to_py)?;
    }
    if let Some(a) = more.prediction {
        set = set
            .with_prediction(a.owned(&name("prediction"))?)
            .map_err(to_py)?;
    }
    if let Some(a) = more.correct {
        set = set
            .with_correct(a.owned(&name("correct"))?)
            .map_err(to_py)?;
    }
    Ok(set)
}

/// The latent-code analysis of `hyperlens analyze` on two code sets (dicts of arrays): the tables
/// by name (`decoding`, `pca`, `clusters`, `similarity`, `confusion`) as dicts of columns, their
/// files' text (`csv`, by file name), `summary.json` as a dict, and `pca.npz`'s arrays.
#[pyfunction]
#[pyo3(signature = (train, test, seed=0, n_components=2, shuffled_control=true, kmeans_runs=3, unsupervised_on="test"))]
#[allow(clippy::too_many_arguments)]
fn analyze<'py>(
    py: Python<'py>,
    train: &Bound<'py, PyDict>,
    test: &Bound<'py, PyDict>,
    seed: u64,
    n_components: usize,
    shuffled_control: bool,
    kmeans_runs: usize,
    unsupervised_on: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let train = code_set("train", train)?;
    let test = code_set("test", test)?;
    let params = LatentAnalysisParams {
        seed,
        n_components,
        shuffled_control,
        kmeans_runs,
        unsupervised_on: unsupervised_on.parse::<CodeSplit>().map_err(to_py)?,
        ..LatentAnalysisParams::default()
    };
    let rep = detached(py, || {
        let stop = Interrupt::default();
        let r = analyze_pair(&train, &test, &params, &mut |_| stop.check());
        stop.finish(r)
    })?;
    let d = PyDict::new(py);
    let csv = PyDict::new(py);
    for (file, table) in rep.tables().map_err(to_py)? {
        let name = file.trim_end_matches(".csv");
        d.set_item(name, records::table(py, &table)?)?;
        csv.set_item(file, table.to_csv())?;
    }
    d.set_item("csv", csv)?;
    d.set_item("summary", records::record(py, &rep.summary())?)?;
    let arrays = PyDict::new(py);
    for a in &rep.layers {
        let sel = a.layer.index();
        let name = |prefix: &str| pca_keys::name(prefix, sel);
        arrays.set_item(
            name(pca_keys::PROJECTION_PREFIX),
            out(py, a.projection.clone()),
        )?;
        arrays.set_item(
            name(pca_keys::COMPONENTS_PREFIX),
            out(py, a.pca.components().clone()),
        )?;
        arrays.set_item(
            name(pca_keys::EXPLAINED_VARIANCE_RATIO_PREFIX),
            out(py, a.pca.explained_variance_ratio().clone()),
        )?;
    }
    arrays.set_item(pca_keys::LABEL, out(py, rep.unsupervised_label.clone()))?;
    if let Some(t) = &rep.unsupervised_target {
        arrays.set_item(pca_keys::TARGET, out(py, t.clone()))?;
    }
    if let Some(c) = &rep.unsupervised_correct {
        arrays.set_item(pca_keys::CORRECT, out(py, c.clone()))?;
    }
    d.set_item("pca_arrays", arrays)?;
    Ok(d)
}

/// A logic code set of the arrays (`codes` float32 `[N, L, H, Q, K]`, `terms` int64
/// `[N, Kt, Lv]`, `term_ids` int64 `[N, Kt]`), checked by the analysis crate.
fn term_codes(
    arg: &str,
    codes: InDyn<'_, f32>,
    terms: InDyn<'_, i64>,
    term_ids: In2<'_, i64>,
) -> PyResult<hyperlens_analysis::terms::TermCodes> {
    let c = codes
        .owned(&format!("{arg}.codes"))?
        .into_dimensionality::<Ix5>()
        .map_err(|_| {
            crate::arrays::shape_error(
                &format!("{arg}.codes"),
                "[N, L, H, Q, K]",
                codes.as_array().shape(),
            )
        })?;
    let t = terms
        .owned(&format!("{arg}.terms"))?
        .into_dimensionality::<ndarray::Ix3>()
        .map_err(|_| {
            crate::arrays::shape_error(
                &format!("{arg}.terms"),
                "[N, Kt, Lv]",
                terms.as_array().shape(),
            )
        })?;
    hyperlens_analysis::terms::TermCodes::new(c, t, term_ids.owned(&format!("{arg}.term_ids"))?)
        .map_err(to_py)
}

/// `hyperlens analyze` on logic code sets: term decoding per layer and on all layers (ridge R² of
/// the terms on the test set's halves, per-term logistic F1 trained on `train`, with the base-rate
/// and shuffled-label controls): `term_decoding.csv` as a dict of its columns (`layer` a list of
/// `str`, `0`... and `all`; `ridge_r2`, `f1_mean`, `f1_base_rate`, `f1_shuffled` float64;
/// `n_terms` int64).
#[pyfunction]
#[pyo3(signature = (train_codes, train_terms, train_term_ids, test_codes, test_terms, test_term_ids, seed = 0, c = 1.0, max_iter = 100))]
#[allow(clippy::too_many_arguments)]
fn term_decoding<'py>(
    py: Python<'py>,
    train_codes: InDyn<'_, f32>,
    train_terms: InDyn<'_, i64>,
    train_term_ids: In2<'_, i64>,
    test_codes: InDyn<'_, f32>,
    test_terms: InDyn<'_, i64>,
    test_term_ids: In2<'_, i64>,
    seed: u64,
    c: f64,
    max_iter: u64,
) -> PyResult<Bound<'py, PyDict>> {
    use hyperlens_analysis::terms::{
        term_decoding as decode_terms, term_decoding_table, TermDecodingParams,
    };
    let train = term_codes("train", train_codes, train_terms, train_term_ids)?;
    let test = term_codes("test", test_codes, test_terms, test_term_ids)?;
    let params = TermDecodingParams {
        seed,
        logistic: LogisticParams {
            c,
            max_iterations: max_iter,
            ..LogisticParams::default()
        },
        ..TermDecodingParams::default()
    };
    let table = detached(py, || {
        let rows = decode_terms(&train, &test, &params).map_err(to_py)?;
        term_decoding_table(&rows).map_err(to_py)
    })?;
    records::table(py, &table)
}

/// Registers the functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pca, m)?)?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(kmeans, m)?)?;
    m.add_function(wrap_pyfunction!(silhouette, m)?)?;
    m.add_function(wrap_pyfunction!(tsne, m)?)?;
    m.add_function(wrap_pyfunction!(analyze, m)?)?;
    m.add_function(wrap_pyfunction!(term_decoding, m)?)?;
    Ok(())
}
