//! The explorer of fuzzy-logic code sets, and the labels it shares with the report's logic
//! explorer (`logic/explorer.rs`): the terms' binary names, the problems' terms as text and the
//! code drawing's key names.

use hyperlens_viz::Coloring;
use ndarray::{ArrayView1, ArrayView2, ArrayView5};

use super::{
    check_start, classes, flat_codes, project_codes, view_names, Explorer, ExplorerData, FieldData,
    Projection,
};
use crate::error::{ReportError, Result};

/// Binary names of term indices `0..n` with the bits the largest needs (the PNG's legend).
pub fn term_names(n: usize) -> Vec<String> {
    let bits = ((n.max(2) as f64).log2().ceil() as usize).max(1);
    (0..n).map(|t| format!("{t:0bits$b}")).collect()
}

/// Each problem's terms as text (`01, 10`), by `names`.
///
/// # Shapes
/// `ids [N, Kt]` -> `[N]`.
pub fn logic_term_text(ids: ArrayView2<'_, i64>, names: &[String]) -> Vec<String> {
    ids.rows()
        .into_iter()
        .map(|row| {
            row.iter()
                .map(|&t| {
                    usize::try_from(t)
                        .ok()
                        .and_then(|t| names.get(t).cloned())
                        .unwrap_or_default()
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect()
}

/// The key labels of a logic code drawing with `q` queries and `k` keys: `self` at the paper's
/// site (the last token's attention to itself), else `k0`, `k1`, ...
pub fn logic_key_names(q: usize, k: usize) -> Vec<String> {
    if q * k == 1 {
        vec!["self".into()]
    } else {
        (0..q * k).map(|j| format!("k{j}")).collect()
    }
}

/// The colourings by the first and second term (as many as the terms per problem, at most 2).
fn term_colorings(kt: usize, names: &[String]) -> Vec<Coloring> {
    ["first term", "second term"][..kt.min(2)]
        .iter()
        .map(|c| Coloring {
            name: (*c).into(),
            classes: names.to_vec(),
        })
        .collect()
}

/// One fuzzy-logic code set (the arrays of a probe's logic `codes.npz`).
#[derive(Debug, Clone)]
pub struct LogicCodes<'a> {
    /// The set's name.
    pub name: String,
    /// # Shapes: `[N, L, H, Q, K]`.
    pub codes: ArrayView5<'a, f32>,
    /// The terms' indices. # Shapes: `[N, Kt]`.
    pub term_ids: ArrayView2<'a, i64>,
    /// The last token's target. # Shapes: `[N]`.
    pub target: Option<ArrayView1<'a, f32>>,
    /// The model's prediction. # Shapes: `[N]`.
    pub prediction: Option<ArrayView1<'a, f32>>,
    /// The sequence's index in its set (by default the row). # Shapes: `[N]`.
    pub problem: Option<ArrayView1<'a, i64>>,
}

/// What [`logic_explorer`] draws besides the sets.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicExplorerSpec {
    /// The colouring shown first: `term` (the first term) is the only one.
    pub color: String,
    /// The model's layer of each index along the codes' `L` axis (default `0..L`).
    pub layers: Option<Vec<usize>>,
    /// The projection.
    pub projection: Projection,
    /// The title (default `latent codes`).
    pub title: Option<String>,
    /// The layer index shown first (default the last).
    pub start_layer: Option<usize>,
}

/// The latent-space explorer of fuzzy-logic code sets per layer (the last set shown first,
/// fixing the PCA's axes), coloured by the first and second term ([`term_names`]), with hover
/// for the terms, target and prediction.
///
/// # Shapes
/// As [`LogicCodes`]; every set has the same `L, H, Q, K`.
///
/// # Errors
/// [`ReportError::InvalidInput`] for no set, a colour other than `term`, a start layer outside the
/// codes' layers, a negative term, more than 64 terms or no term per problem;
/// [`ReportError::Analysis`] for arrays whose lengths or code axes disagree, and the
/// projection's errors.
pub fn logic_explorer(sets: &[LogicCodes<'_>], spec: &LogicExplorerSpec) -> Result<Explorer> {
    if spec.color != "term" {
        return Err(ReportError::InvalidInput(format!(
            "color {:?}: logic codes are coloured by \"term\"",
            spec.color
        )));
    }
    let first = sets
        .first()
        .ok_or_else(|| ReportError::InvalidInput("no code set given".into()))?;
    let (_, l, h, q, k) = first.codes.dim();
    check_start(spec.start_layer, l)?;
    let kt = first.term_ids.ncols();
    let mut n_terms = 0;
    for s in sets {
        let t = classes("term_ids", s.term_ids.iter().copied())?;
        n_terms = n_terms.max(t.iter().max().map_or(0, |m| m + 1));
        if s.term_ids.ncols() != kt || kt == 0 {
            return Err(ReportError::InvalidInput(format!(
                "{}: `term_ids` has {} terms per problem, not {kt} (at least 1)",
                s.name,
                s.term_ids.ncols()
            )));
        }
    }
    if n_terms > 64 {
        return Err(ReportError::InvalidInput(format!(
            "{n_terms} terms: the explorer colours at most 64"
        )));
    }
    let names = term_names(n_terms);
    let set_names: Vec<String> = sets.iter().map(|s| s.name.clone()).collect();
    let projected = project_codes(
        &sets.iter().map(|s| s.codes).collect::<Vec<_>>(),
        &set_names,
        spec.projection,
    )?;
    let data = sets
        .iter()
        .zip(projected.points)
        .map(|(s, points)| logic_set(s, &names, kt, points))
        .collect::<Result<Vec<_>>>()?;
    Ok(Explorer {
        title: spec.title.clone().unwrap_or_else(|| "latent codes".into()),
        layers: view_names(spec.layers.as_deref(), l),
        projections: vec![(spec.projection.label().into(), spec.projection.axes())],
        explained: (spec.projection == Projection::Pca).then_some(projected.explained),
        colorings: term_colorings(kt, &names),
        heads: (0..h).map(|i| format!("H{i}")).collect(),
        keys: logic_key_names(q, k),
        sets: data,
        start_layer: spec.start_layer,
    })
}

/// One logic set's data.
fn logic_set(
    s: &LogicCodes<'_>,
    names: &[String],
    kt: usize,
    points: ndarray::Array4<f64>,
) -> Result<ExplorerData> {
    let n = s.codes.dim().0;
    let rows = |what: &str, len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(ReportError::Analysis(
                hyperlens_analysis::AnalysisError::Shape(format!(
                    "{}: `{what}` has {len} entries for {n} codes",
                    s.name
                )),
            ))
        }
    };
    rows("term_ids", s.term_ids.nrows())?;
    let mut fields = vec![(
        "terms".to_string(),
        FieldData::Text(logic_term_text(s.term_ids, names)),
    )];
    for (what, v) in [("target", &s.target), ("prediction", &s.prediction)] {
        if let Some(v) = v {
            rows(what, v.len())?;
            fields.push((
                what.to_string(),
                FieldData::Float(v.iter().map(|&x| f64::from(x)).collect()),
            ));
        }
    }
    let index = match &s.problem {
        Some(p) => {
            rows("problem", p.len())?;
            p.to_vec()
        }
        None => (0..n as i64).collect(),
    };
    let colors = (0..kt.min(2))
        .map(|j| classes("term_ids", s.term_ids.column(j).iter().copied()))
        .collect::<Result<Vec<_>>>()?;
    Ok(ExplorerData {
        name: s.name.clone(),
        reproduce: String::new(),
        points,
        index,
        colors,
        fields,
        codes: flat_codes(&s.name, &s.codes)?,
        problems: None,
    })
}

#[cfg(test)]
mod tests {
    use super::{logic_key_names, logic_term_text, term_names};
    use ndarray::array;

    #[test]
    fn term_names_are_the_pngs_binary_labels() {
        assert_eq!(term_names(4), ["00", "01", "10", "11"]);
        assert_eq!(term_names(5)[4], "100");
        assert_eq!(term_names(1), ["0"]);
    }

    #[test]
    fn terms_and_keys_are_named_as_the_report_names_them() {
        let names = term_names(4);
        assert_eq!(
            logic_term_text(array![[0i64, 3], [2, 1]].view(), &names),
            ["00, 11", "10, 01"]
        );
        assert_eq!(logic_key_names(1, 1), ["self"]);
        assert_eq!(logic_key_names(1, 3), ["k0", "k1", "k2"]);
    }
}
