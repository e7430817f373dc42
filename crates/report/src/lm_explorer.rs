//! The latent-space explorer of a language model's code file (issue 47, item 6): the rows that
//! [`hyperlens_analysis::lm::analyze`] projected, on its PCA per layer and on the analysed layers
//! together, coloured by each factor (the decoded one first) and by whether the model was right,
//! with the prompt's text on hover, its query and keys marked, and its code drawn on click.
//!
//! It lives in the report crate because it joins the analysis (the projections), the tasks crate
//! (the prompt file), the model crate (the tokenizer) and the viz crate (the figure): only this
//! crate and the binary depend on all four (ARCHITECTURE.md), and the binary stays a thin front.
//!
//! # What it shows
//! - **Sets**: the projected rows (the kept, labelled prompts of the split the analysis ran PCA
//!   on), as `seen` (split 0) and `held out` (split 1) when both are among them, else one set.
//! - **Layers**: the analysed model layers, then `all` (the PCA of the layers together).
//! - **Colourings**: the decoded factor, the other factors (each with at most 64 values, a class
//!   `(none)` for prompts without a value; a factor with more stays in the hover only), then
//!   `correct` (`wrong` / `right`) when the file holds it.
//! - **Hover**: the prompt index (the `prompt` array), each factor's value, the target and the
//!   prediction as token text (`-` for a prompt without an answer), `correct`, and `text`: the
//!   prompt's tokens in order, each written as its text in context (the tokenizer's decoding of the
//!   token after its predecessor, less that of the predecessor, so spaces appear as the tokenizer
//!   writes them; a newline as `⏎`), each key token wrapped as `[[tok]]`, each query token as
//!   `<<tok>>` (both: `<<[[tok]]>>`), leading spaces kept outside the marks. A text longer than
//!   [`HOVER_CHARS`] characters is shortened around the sites: the marked tokens and as many of
//!   their neighbours as fit, with ` … ` where tokens are left out ([`LmExplorerSet::marked`] keeps
//!   the whole text).
//! - **Click**: the code of the point at the shown layer, heads by keys (`k0`.. in the order of
//!   the `key_pos` array; `q{i}k{j}` with several queries); at `all`, the mean of the codes over the
//!   analysed layers (one heads-by-keys drawing has no room for every layer of a real model).
//!
//! The prompts' text is re-read from the prompt file and the tokenizer named in the sidecar
//! `codes.json` (`prompts`, and `model`'s tokenizer); a path that is not found as written is
//! looked for beside the code file. When either path is not there (a code file moved to
//! another machine, or written without a prompt file), the explorer is still built, without the
//! `text` line, with the target and prediction as token ids (`id 42`), and
//! [`LmExplorer::note`] says which file was missing (shown under a clicked point, in place of the
//! key to the marks). A model without a tokenizer, an unreadable prompt file, or a prompt file
//! whose tokens no longer fit the code file's `length`, `query_pos` or `key_pos` are errors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use hyperlens_analysis::lm::{LmAnalysis, LmCodeSet, LmProjection};
use hyperlens_model::lm::{require_tokenizer, LmTokenizer};
use hyperlens_tasks::prompts::PromptSet;
use hyperlens_viz::{
    render_png, save_interactive_html, CodeExplorer, Coloring, ExplorerSet, Field, FieldValues,
    PcaScatter, ScatterPanel,
};
use ndarray::{s, Array3, Array4, Axis};

use crate::error::{ReportError, Result};

/// Hover texts longer than this many characters are shortened around the sites (module docs):
/// the hover box of the explorer is one line per field, and this keeps it inside the figure.
pub const HOVER_CHARS: usize = 72;

/// Most classes a colouring may have (the explorer's limit).
const MAX_CLASSES: usize = 64;

/// What the explorer draws of an analysis: the factor, the projections and the prompts of
/// their rows. [`From<&LmAnalysis>`] takes them from an analysis; the Python front builds one from
/// `hl.analysis.LmAnalysis`'s arrays.
///
/// # Shapes
/// `prompts`: `[N_u]`; every projection: `[N_u, C]` with `C >= 1`.
#[derive(Debug, Clone, Copy)]
pub struct LmProjected<'a> {
    /// The decoded factor (coloured first).
    pub factor: &'a str,
    /// The PCA per analysed layer, then the layers together (`layer` None).
    pub projections: &'a [LmProjection],
    /// The prompt index (the `prompt` array) of each projected row.
    pub prompts: &'a [i64],
}

impl<'a> From<&'a LmAnalysis> for LmProjected<'a> {
    fn from(a: &'a LmAnalysis) -> Self {
        Self {
            factor: &a.factor,
            projections: &a.projections,
            prompts: &a.structure_prompts,
        }
    }
}

/// One set of the explorer (seen or held out), owned; [`LmExplorer::figure`] borrows it.
///
/// # Shapes
/// N points, P = 1 projection (PCA), V views (analysed layers + `all`): `points` `[1, V, N, 2]`;
/// `prompt`, `target`, `prediction`, `marked`, `hover_text`, every `colors[c]` and factor
/// label list: `[N]`; `codes` `[N, V, H * Q * K]` (head-major).
#[derive(Debug, Clone, PartialEq)]
pub struct LmExplorerSet {
    /// `seen` or `held out`.
    pub name: String,
    /// The points' PCA coordinates per view.
    pub points: Array4<f64>,
    /// Each point's prompt index.
    pub prompt: Vec<i64>,
    /// Each point's class under each colouring of [`LmExplorer::colorings`].
    pub colors: Vec<Vec<usize>>,
    /// Each factor's value index per point (`values.len()` for a prompt without one), in the
    /// sidecar's factor order.
    pub factor_labels: Vec<Vec<usize>>,
    /// The target token's text per point (`-` without an answer).
    pub target: Vec<String>,
    /// The model's prediction's text per point (`-` without an answer).
    pub prediction: Vec<String>,
    /// Whether the model was right, when the file says.
    pub correct: Option<Vec<bool>>,
    /// The whole marked text of each prompt (module docs); empty without the prompt text.
    pub marked: Vec<String>,
    /// The marked text shortened to [`HOVER_CHARS`] around the sites, shown on hover; empty
    /// without the prompt text.
    pub hover_text: Vec<String>,
    /// The codes drawn on click.
    pub codes: Array3<f32>,
}

/// The explorer of a language model's code file, owned: [`LmExplorer::figure`] is the
/// interactive figure, [`LmExplorer::png`] its static scatter.
#[derive(Debug, Clone, PartialEq)]
pub struct LmExplorer {
    /// The figure's title.
    pub title: String,
    /// View names: the analysed layers, then `all`.
    pub layers: Vec<String>,
    /// PC1 and PC2's explained-variance ratios per view, when known (for the PNG's axes).
    pub explained: Option<Vec<[f64; 2]>>,
    /// The colourings (module docs).
    pub colorings: Vec<Coloring>,
    /// The factors' names and values (hover fields), in the sidecar's order.
    pub factors: Vec<(String, Vec<String>)>,
    /// Head labels of the code drawing (`H0`..).
    pub heads: Vec<String>,
    /// Key labels of the code drawing (`k0`.. or `q0k0`..).
    pub keys: Vec<String>,
    /// The sets, seen first (the last is shown first).
    pub sets: Vec<LmExplorerSet>,
    /// Why the hover has no prompt text, when it has none (shown under a clicked point).
    pub note: Option<String>,
}

impl LmExplorer {
    /// The interactive figure (hover, click, legend, zoom; [`hyperlens_viz::CodeExplorer`]).
    pub fn figure(&self) -> CodeExplorer<'_> {
        CodeExplorer {
            title: self.title.clone(),
            layers: self.layers.clone(),
            projections: vec![("PCA".into(), ["PC1".into(), "PC2".into()])],
            colorings: self.colorings.clone(),
            heads: self.heads.clone(),
            keys: self.keys.clone(),
            sets: self.sets.iter().map(|s| self.set_figure(s)).collect(),
            start_layer: None,
        }
    }

    fn set_figure<'a>(&'a self, s: &'a LmExplorerSet) -> ExplorerSet<'a> {
        let mut fields = Vec::new();
        for ((name, values), labels) in self.factors.iter().zip(&s.factor_labels) {
            let mut names = values.clone();
            names.push("(none)".into());
            fields.push(Field {
                name: name.clone(),
                values: FieldValues::Category { labels, names },
            });
        }
        let text = |name: &str, v: &[String]| Field {
            name: name.into(),
            values: FieldValues::Text(v.to_vec()),
        };
        fields.push(text("target", &s.target));
        fields.push(text("prediction", &s.prediction));
        if let Some(c) = &s.correct {
            fields.push(Field {
                name: "correct".into(),
                values: FieldValues::Bool(c),
            });
        }
        if !s.hover_text.is_empty() {
            fields.push(text("text", &s.hover_text));
        }
        ExplorerSet {
            name: s.name.clone(),
            reproduce: self.note.clone().unwrap_or_else(|| {
                "text: [[key]] and <<query>> mark the sites; problem = prompt of the prompt file"
                    .into()
            }),
            points: s.points.view(),
            index: &s.prompt,
            colors: s.colors.iter().map(Vec::as_slice).collect(),
            fields,
            codes: Some(s.codes.view()),
            problems: None,
        }
    }

    /// The static figure of the same data: the last set on the `all` view, coloured by the
    /// decoded factor, as PNG bytes.
    ///
    /// # Errors
    /// [`ReportError::Viz`] if the figure cannot be drawn.
    pub fn png(&self) -> Result<Vec<u8>> {
        let set = self
            .sets
            .last()
            .ok_or_else(|| ReportError::InvalidInput("the explorer has no set to draw".into()))?;
        let view = self.layers.len() - 1;
        let (axes, explained) = match self.explained.as_ref().and_then(|e| e.get(view)) {
            Some(e) => (None, *e),
            None => (Some(["PC1".to_string(), "PC2".to_string()]), [0.0, 0.0]),
        };
        let coloring = &self.colorings[0];
        let fig = PcaScatter::by_category(
            &self.title,
            vec![ScatterPanel {
                title: format!("{}, layers {}", set.name, self.layers[view]),
                points: set.points.slice(s![0, view, .., ..]),
                explained,
                axes,
            }],
            &set.colors[0],
            &coloring.classes,
            &coloring.name,
        );
        Ok(render_png(&fig, (900, 560))?)
    }

    /// Writes the figure as a self-contained HTML page, atomically.
    ///
    /// # Errors
    /// [`ReportError::Viz`] naming the file.
    pub fn write_html(&self, path: &Path) -> Result<()> {
        Ok(save_interactive_html(path, &self.figure())?)
    }
}

/// [`lm_explorer_of`] with the projections of `analysis`, which must have run on `codes`.
///
/// # Errors
/// As [`lm_explorer_of`].
pub fn lm_explorer(codes: &Path, analysis: &LmAnalysis) -> Result<LmExplorer> {
    let mut e = lm_explorer_of(codes, &LmProjected::from(analysis))?;
    e.explained = Some(explained(analysis));
    Ok(e)
}

/// [`build`] on the projections of `analysis`, which must have run on `set`, with the variance
/// its first two components explain on each view (what [`lm_explorer`] shows, without files).
///
/// # Errors
/// As [`build`].
pub fn build_for_analysis(
    set: &LmCodeSet,
    text: Option<(&PromptSet, &LmTokenizer)>,
    analysis: &LmAnalysis,
) -> Result<LmExplorer> {
    let mut e = build(set, text, &LmProjected::from(analysis), None)?;
    e.explained = Some(explained(analysis));
    Ok(e)
}

/// The variance ratio of PC1 and PC2 on each view of `analysis` (0 for a missing component).
fn explained(analysis: &LmAnalysis) -> Vec<[f64; 2]> {
    analysis
        .structure
        .iter()
        .map(|r| {
            let v = &r.explained_variance_ratio;
            [
                v.first().copied().unwrap_or(0.0),
                v.get(1).copied().unwrap_or(0.0),
            ]
        })
        .collect()
}

/// The explorer of the code file `codes` (its `codes.json` beside it) on the projections of
/// `projected` (module docs for what it shows). Reads the code file, the prompt file and the
/// tokenizer the sidecar names.
///
/// # Errors
/// [`ReportError::Analysis`] for an unreadable code file; [`ReportError::InvalidInput`] for a
/// prompt file or model that is not there (one line naming the sidecar's path), projections that
/// do not fit the prompts (naming the view), a prompt index not in the code file or the prompt
/// file, a prompt whose tokens no longer fit the file's sites (naming the prompt), an unknown
/// factor; the tokenizer's and the prompt file's errors.
pub fn lm_explorer_of(codes: &Path, projected: &LmProjected<'_>) -> Result<LmExplorer> {
    let set = LmCodeSet::read(codes)?;
    let side = set.sidecar();
    let sidecar = codes.with_extension("json");
    let prompts_path = locate(codes, &side.prompts);
    let model_path = locate(codes, &side.model);
    let (Some(prompts_path), Some(model_path)) = (prompts_path, model_path) else {
        let what = if locate(codes, &side.prompts).is_none() {
            format!("the prompt file {}", side.prompts)
        } else {
            format!("the model {}", side.model)
        };
        let note = format!(
            "no prompt text: {what} named in {} is not there",
            sidecar.display()
        );
        return build(&set, None, projected, Some(note));
    };
    let prompts = PromptSet::load(&prompts_path)?;
    let tok = require_tokenizer(&model_path)?;
    build(&set, Some((&prompts, &tok)), projected, None)
}

/// `path` as written if it exists, else relative to the code file's folder.
fn locate(codes: &Path, path: &str) -> Option<PathBuf> {
    let p = PathBuf::from(path);
    if p.exists() {
        return Some(p);
    }
    let beside = codes.parent()?.join(&p);
    (p.is_relative() && beside.exists()).then_some(beside)
}

/// The files of [`analyze_lm_to_dir`]: the analysis and the paths written.
#[derive(Debug, Clone)]
pub struct LmAnalysisFiles {
    /// The analysis.
    pub analysis: LmAnalysis,
    /// The files written, in order: the tables, `summary.json`, then `explorer.html` if asked.
    pub written: Vec<PathBuf>,
}

/// `hyperlens analyze --lm-codes`: [`hyperlens_analysis::lm::analyze`], its tables and
/// `summary.json` written into `out` ([`LmAnalysis::write`]), then, with `explorer`, the
/// explorer of its projections written as the self-contained page `out/explorer.html`
/// (atomically).
///
/// # Errors
/// The analysis's and [`LmAnalysis::write`]'s errors; [`lm_explorer`]'s (a missing prompt file
/// or tokenizer among them); a failed write, naming the file.
pub fn analyze_lm_to_dir(
    params: &hyperlens_analysis::lm::LmAnalysisParams,
    out: &Path,
    explorer: bool,
    progress: &mut dyn FnMut(&hyperlens_analysis::lm::LmProgress) -> std::ops::ControlFlow<()>,
) -> Result<LmAnalysisFiles> {
    let analysis = hyperlens_analysis::lm::analyze(params, progress)?;
    let mut written = analysis.write(out)?;
    if explorer {
        let path = out.join("explorer.html");
        lm_explorer(&params.codes, &analysis)?.write_html(&path)?;
        written.push(path);
    }
    Ok(LmAnalysisFiles { analysis, written })
}

/// The explorer of `set` from its prompts and tokenizer (module docs).
///
/// # Errors
/// As [`lm_explorer_of`], without the file errors.
pub fn build(
    set: &LmCodeSet,
    text: Option<(&PromptSet, &LmTokenizer)>,
    projected: &LmProjected<'_>,
    note: Option<String>,
) -> Result<LmExplorer> {
    let bad = |m: String| ReportError::InvalidInput(format!("{}: {m}", set.source()));
    let n_u = projected.prompts.len();
    if n_u == 0 || projected.projections.is_empty() {
        return Err(bad("the analysis projected no prompt".into()));
    }
    for p in projected.projections {
        let (r, c) = p.projection.dim();
        if r != n_u || c == 0 {
            return Err(bad(format!(
                "the projection of layer {} is [{r}, {c}], not [{n_u}, >= 1]",
                p.layer.map_or_else(|| "all".into(), |l| l.to_string())
            )));
        }
    }
    let side = set.sidecar();
    let f_decoded = set.factor_index(projected.factor)?;
    let row_of: HashMap<i64, usize> = set
        .prompt()
        .iter()
        .enumerate()
        .map(|(r, &p)| (p, r))
        .collect();
    let rows: Vec<usize> = projected
        .prompts
        .iter()
        .map(|p| {
            row_of
                .get(p)
                .copied()
                .ok_or_else(|| bad(format!("prompt {p} of the projections is not in the file")))
        })
        .collect::<Result<_>>()?;
    // The views: the analysed layers, then all; the layer axes of the per-layer views.
    let views: Vec<String> = projected
        .projections
        .iter()
        .map(|p| p.layer.map_or_else(|| "all".into(), |l| l.to_string()))
        .collect();
    let axes: Vec<Option<usize>> = projected
        .projections
        .iter()
        .map(|p| {
            p.layer
                .map(|l| {
                    side.layers
                        .iter()
                        .position(|&x| x == l)
                        .ok_or_else(|| bad(format!("no layer {l} in the file")))
                })
                .transpose()
        })
        .collect::<Result<_>>()?;
    let analysed: Vec<usize> = axes.iter().flatten().copied().collect();
    let all_axes: Vec<usize> = if analysed.is_empty() {
        (0..set.n_layers()).collect()
    } else {
        analysed.clone()
    };
    // Colourings: the decoded factor first, the others, then correct.
    let mut order: Vec<usize> = vec![f_decoded];
    order.extend((0..side.factors.len()).filter(|&f| f != f_decoded));
    let factor_label = |f: usize, r: usize| -> usize {
        usize::try_from(set.factors()[[r, f]]).unwrap_or(side.factors[f].values.len())
    };
    let mut colorings = Vec::new();
    let mut color_of: Vec<Box<dyn Fn(usize) -> usize + '_>> = Vec::new();
    for &f in &order {
        let fac = &side.factors[f];
        let none = rows.iter().any(|&r| set.factors()[[r, f]] < 0);
        let n_classes = fac.values.len() + usize::from(none);
        if n_classes == 0 || n_classes > MAX_CLASSES {
            continue;
        }
        let mut classes = fac.values.clone();
        if none {
            classes.push("(none)".into());
        }
        colorings.push(Coloring {
            name: fac.name.clone(),
            classes,
        });
        color_of.push(Box::new(move |r| factor_label(f, r)));
    }
    if let Some(c) = set.correct() {
        colorings.push(Coloring {
            name: "correct".into(),
            classes: vec!["wrong".into(), "right".into()],
        });
        color_of.push(Box::new(move |r| usize::from(c[r])));
    }
    if colorings.is_empty() {
        return Err(bad(format!(
            "no factor with 1 to {MAX_CLASSES} values and no `correct` array to colour by"
        )));
    }
    // The prompts' marked texts, checked against the file's sites.
    let token_text = |id: i64| -> Result<String> {
        match (u32::try_from(id), text) {
            (Ok(id), Some((_, tok))) => Ok(shown(&tok.decode(&[id])?)),
            (Ok(id), None) => Ok(format!("id {id}")),
            (Err(_), _) => Ok("-".into()),
        }
    };
    let mut marked = HashMap::new();
    for &r in rows.iter().filter(|_| text.is_some()) {
        let Some((prompts, tok)) = text else { break };
        let p = set.prompt()[r];
        let prompt = usize::try_from(p)
            .ok()
            .and_then(|i| prompts.prompts.get(i))
            .ok_or_else(|| {
                bad(format!(
                    "prompt {p} is not in the prompt file ({} prompts)",
                    prompts.len()
                ))
            })?;
        let texts: Vec<&str> = prompt.segments.iter().map(|s| s.text.as_str()).collect();
        let (ids, _) = tok.encode_segments(&texts, Some(side.prepend_bos))?;
        let pieces = token_pieces(tok, &ids)?;
        let query: Vec<usize> = set.query_pos().row(r).iter().map(|&q| q as usize).collect();
        let keys: Vec<usize> = set.key_pos().row(r).iter().map(|&k| k as usize).collect();
        let length = set.length().map(|l| l[r]);
        let past = query.iter().chain(&keys).any(|&t| t >= ids.len());
        if past || length.is_some_and(|l| l != ids.len() as i64) {
            return Err(bad(format!(
                "prompt {p}: the prompt file gives {} tokens, but the code file has length {} \
                 and sites at {query:?} and {keys:?}: the prompt file changed since the probe",
                ids.len(),
                length.map_or_else(|| "-".into(), |l| l.to_string())
            )));
        }
        marked.insert(
            r,
            (
                marked_text(&pieces, &query, &keys),
                shortened(&pieces, &query, &keys, HOVER_CHARS),
            ),
        );
    }
    // The sets: seen (split 0) and held out (split 1), those present.
    let (_, _, h, q, k) = set.codes().dim();
    let mut sets = Vec::new();
    for (split, name) in [(0, "seen"), (1, "held out")] {
        let idx: Vec<usize> = (0..n_u)
            .filter(|&i| set.split()[rows[i]] == split)
            .collect();
        if idx.is_empty() {
            continue;
        }
        let n = idx.len();
        let mut points = Array4::zeros((1, views.len(), n, 2));
        for (v, p) in projected.projections.iter().enumerate() {
            for (j, &i) in idx.iter().enumerate() {
                points[[0, v, j, 0]] = p.projection[[i, 0]];
                points[[0, v, j, 1]] = p.projection.get([i, 1]).copied().unwrap_or(0.0);
            }
        }
        let mut codes = Array3::<f32>::zeros((n, views.len(), h * q * k));
        for (j, &i) in idx.iter().enumerate() {
            let c = set.codes().index_axis(Axis(0), rows[i]);
            for (v, axis) in axes.iter().enumerate() {
                let flat: Vec<f32> = match axis {
                    Some(l) => c.index_axis(Axis(0), *l).iter().copied().collect(),
                    None => {
                        let mut sum = vec![0f32; h * q * k];
                        for &l in &all_axes {
                            for (s, x) in sum.iter_mut().zip(c.index_axis(Axis(0), l).iter()) {
                                *s += x;
                            }
                        }
                        sum.iter().map(|s| s / all_axes.len() as f32).collect()
                    }
                };
                codes
                    .slice_mut(s![j, v, ..])
                    .assign(&ndarray::Array1::from(flat));
            }
        }
        let answer = |a: Option<&ndarray::Array1<i64>>| -> Result<Vec<String>> {
            idx.iter()
                .map(|&i| match a {
                    Some(a) if a[rows[i]] >= 0 => token_text(a[rows[i]]),
                    _ => Ok("-".into()),
                })
                .collect()
        };
        sets.push(LmExplorerSet {
            name: name.into(),
            points,
            prompt: idx.iter().map(|&i| set.prompt()[rows[i]]).collect(),
            colors: color_of
                .iter()
                .map(|c| idx.iter().map(|&i| c(rows[i])).collect())
                .collect(),
            factor_labels: (0..side.factors.len())
                .map(|f| idx.iter().map(|&i| factor_label(f, rows[i])).collect())
                .collect(),
            target: answer(set.target())?,
            prediction: answer(set.prediction())?,
            correct: set
                .correct()
                .map(|c| idx.iter().map(|&i| c[rows[i]]).collect()),
            marked: idx
                .iter()
                .filter_map(|&i| marked.get(&rows[i]).map(|m| m.0.clone()))
                .collect(),
            hover_text: idx
                .iter()
                .filter_map(|&i| marked.get(&rows[i]).map(|m| m.1.clone()))
                .collect(),
            codes,
        });
    }
    let keys: Vec<String> = if q == 1 {
        (0..k).map(|j| format!("k{j}")).collect()
    } else {
        (0..q)
            .flat_map(|i| (0..k).map(move |j| format!("q{i}k{j}")))
            .collect()
    };
    Ok(LmExplorer {
        title: format!(
            "{}: latent codes ({}), {} by `{}`",
            Path::new(&side.model)
                .file_name()
                .map_or_else(|| side.model.clone(), |n| n.to_string_lossy().into_owned()),
            side.sites,
            side.form,
            projected.factor
        ),
        note,
        layers: views,
        explained: None,
        colorings,
        factors: side
            .factors
            .iter()
            .map(|f| (f.name.clone(), f.values.clone()))
            .collect(),
        heads: (0..h).map(|i| format!("H{i}")).collect(),
        keys,
        sets,
    })
}

/// A token's text as the explorer shows it: a newline as `⏎`, other control characters as a
/// space.
fn shown(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' => '⏎',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect()
}

/// Each token's text in context: the decoding of the token after its predecessor less that of
/// the predecessor (the token alone where that is not a prefix, as inside a UTF-8 character),
/// so that the pieces joined read as the decoded text with the tokenizer's spaces.
///
/// # Errors
/// The tokenizer's, for an id outside its vocabulary.
pub fn token_pieces(tok: &LmTokenizer, ids: &[u32]) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(ids.len());
    let mut prev = String::new();
    for (t, &id) in ids.iter().enumerate() {
        let alone = tok.decode(&[id])?;
        let piece = if t == 0 {
            alone.clone()
        } else {
            let pair = tok.decode(&[ids[t - 1], id])?;
            pair.strip_prefix(prev.as_str())
                .map_or_else(|| alone.clone(), ToString::to_string)
        };
        out.push(shown(&piece));
        prev = alone;
    }
    Ok(out)
}

/// Token `t`'s piece with its marks: leading spaces, then `<<[[tok]]>>` as it is a query and / or
/// a key.
fn mark(piece: &str, is_query: bool, is_key: bool) -> String {
    let body = piece.trim_start_matches(' ');
    let lead = &piece[..piece.len() - body.len()];
    let mut s = body.to_string();
    if is_key {
        s = format!("[[{s}]]");
    }
    if is_query {
        s = format!("<<{s}>>");
    }
    format!("{lead}{s}")
}

/// The prompt's text with its sites marked: the pieces joined, each key token as `[[tok]]`,
/// each query token as `<<tok>>` (module docs).
pub fn marked_text(pieces: &[String], query: &[usize], keys: &[usize]) -> String {
    (0..pieces.len())
        .map(|t| mark(&pieces[t], query.contains(&t), keys.contains(&t)))
        .collect()
}

/// [`marked_text`] within `max` characters where it can: the marked tokens, then their
/// neighbours one step further out at a time while the text fits, ` … ` where tokens are left
/// out (the marked tokens are always kept, even past `max`).
pub fn shortened(pieces: &[String], query: &[usize], keys: &[usize], max: usize) -> String {
    let full = marked_text(pieces, query, keys);
    if full.chars().count() <= max {
        return full;
    }
    let marked: Vec<String> = (0..pieces.len())
        .map(|t| mark(&pieces[t], query.contains(&t), keys.contains(&t)))
        .collect();
    let sites: Vec<usize> = query
        .iter()
        .chain(keys)
        .copied()
        .filter(|&t| t < pieces.len())
        .collect();
    let render = |keep: &[bool]| -> String {
        let mut s = String::new();
        let mut skipped = false;
        for (t, m) in marked.iter().enumerate() {
            if !keep[t] {
                skipped = true;
                continue;
            }
            if skipped {
                s.push_str(if s.is_empty() { "… " } else { " … " });
                s.push_str(m.trim_start());
                skipped = false;
            } else {
                s.push_str(m);
            }
        }
        if skipped {
            s.push_str(" …");
        }
        s
    };
    let mut keep = vec![false; pieces.len()];
    for &t in &sites {
        keep[t] = true;
    }
    let mut best = render(&keep);
    for r in 1..pieces.len() {
        let mut next = keep.clone();
        for &t in &sites {
            if t >= r {
                next[t - r] = true;
            }
            if t + r < pieces.len() {
                next[t + r] = true;
            }
        }
        let text = render(&next);
        if text.chars().count() > max {
            break;
        }
        keep = next;
        best = text;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::{marked_text, shortened};

    fn pieces(s: &[&str]) -> Vec<String> {
        s.iter().map(|p| (*p).to_string()).collect()
    }

    #[test]
    fn sites_are_marked_with_spaces_outside() {
        let p = pieces(&["<s>", " Q:", " cat", " A:", " dog"]);
        assert_eq!(
            marked_text(&p, &[3], &[2, 4]),
            "<s> Q: [[cat]] <<A:>> [[dog]]"
        );
        assert_eq!(marked_text(&p, &[1], &[1]), "<s> <<[[Q:]]>> cat A: dog");
    }

    #[test]
    fn long_texts_keep_the_sites_and_their_nearest_neighbours() {
        let words: Vec<String> = (0..40).map(|i| format!(" w{i:02}")).collect();
        // Sites at 5 (key) and 30 (query); max 40 characters.
        let s = shortened(&words, &[30], &[5], 40);
        assert!(s.chars().count() <= 40, "{s}");
        assert!(s.contains("[[w05]]") && s.contains("<<w30>>"), "{s}");
        // Neighbours grow symmetrically: w04 and w06 are kept before w03 or w07.
        assert!(s.contains("w04") && s.contains("w06") && s.contains("w29") && s.contains("w31"));
        assert!(
            s.starts_with("… ") && s.ends_with(" …") && s.contains(" … "),
            "{s}"
        );
        // Short enough: unchanged.
        assert_eq!(
            shortened(&words[..3], &[0], &[2], 40),
            marked_text(&words[..3], &[0], &[2])
        );
    }
}
