//! The latent-space explorer: an interactive scatter of latent codes (PCA, t-SNE) with hover
//! details, a legend that hides and shows classes, set / layer / projection / colour switches,
//! zoom and pan, and, on click, the problem drawn beside the scatter with the point's code.

use ndarray::{ArrayView3, ArrayView4, Axis};
use serde_json::{json, Value};

use super::encode::{check_finite, floats, ints, quantised, safe_json};
use super::InteractiveFigure;
use crate::colour::categorical;
use crate::error::{Result, VizError};

/// One colouring of the points: a class per point (given per set in [`ExplorerSet::colors`]),
/// shown with a legend whose entries hide and show their points.
#[derive(Debug, Clone, PartialEq)]
pub struct Coloring {
    /// Name in the colour switch and legend heading, e.g. "rule" or "answer value".
    pub name: String,
    /// Class names in index order (at most 64), e.g. "constant", "progression +1", ...
    pub classes: Vec<String>,
}

/// The values of one hover [`Field`], one per point.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValues<'a> {
    /// Integers (problem index, target, prediction), within the `i32` range.
    Int(&'a [i64]),
    /// Class indices into `names` (e.g. the rule).
    Category {
        /// Class of each point, each `< names.len()`.
        labels: &'a [usize],
        /// Class names.
        names: Vec<String>,
    },
    /// Yes / no (e.g. whether the model was right).
    Bool(&'a [bool]),
    /// Finite numbers, shown with 4 significant digits (e.g. a fuzzy-logic target value).
    Float(&'a [f64]),
    /// Free text (e.g. a fuzzy-logic problem's terms).
    Text(Vec<String>),
}

impl FieldValues<'_> {
    fn len(&self) -> usize {
        match self {
            Self::Int(v) => v.len(),
            Self::Category { labels, .. } => labels.len(),
            Self::Bool(v) => v.len(),
            Self::Float(v) => v.len(),
            Self::Text(v) => v.len(),
        }
    }
}

/// One line of the hover box: a name and a value per point.
#[derive(Debug, Clone, PartialEq)]
pub struct Field<'a> {
    /// Name shown before the value, e.g. "target".
    pub name: String,
    /// One value per point.
    pub values: FieldValues<'a>,
}

/// SRAVEN problems to draw on click: the 3 x 3 matrix of panels, one value per feature.
///
/// # Shapes
/// `values`: `[N, 9, F]`: the 8 context panels then the true answer panel, each F feature values
/// (F = 4 for SRAVEN; values 0..=255); `slot`, `prediction`: `[N]`: the answer feature the codes
/// were read for and the model's answer at it (drawn in the answer panel beside the true value).
#[derive(Debug, Clone)]
pub struct SravenProblems<'a> {
    /// Feature values of the 9 panels of every problem, `[N, 9, F]`.
    pub values: ArrayView3<'a, i64>,
    /// Answer feature (slot) of each point, each `< F`.
    pub slot: &'a [i64],
    /// The model's answer at that slot.
    pub prediction: &'a [i64],
    /// Token positions of the site's keys (token t is panel t / F, feature t % F), marked in the
    /// drawing.
    pub marked: Vec<usize>,
    /// Token position of the site's query, marked too.
    pub query: usize,
}

/// The points of one problem set (e.g. ID or OOD) of a [`CodeExplorer`].
///
/// # Shapes
/// N points (problems, or problem x slot rows of a code file); P projections, L layers:
/// `points` `[P, L, N, 2]`; `index`, every `colors[c]` and every field: `[N]`; `codes` `[N, L, C]`
/// with
/// C = heads x keys, head-major; `problems.values` `[N, 9, F]`.
#[derive(Debug, Clone)]
pub struct ExplorerSet<'a> {
    /// Name in the set switch, e.g. "OOD".
    pub name: String,
    /// How to reproduce the problems, shown under the problem drawing, e.g.
    /// `hyperlens tasks sample --split paper-seed0 --set ood --n 2048 --seed 0 --unpermuted`.
    pub reproduce: String,
    /// 2-D coordinates of every point, per projection and layer, `[P, L, N, 2]`; finite.
    pub points: ArrayView4<'a, f64>,
    /// Problem index of every point in its problem set, `[N]`.
    pub index: &'a [i64],
    /// Class of every point under each colouring of the explorer, in the explorer's order.
    pub colors: Vec<&'a [usize]>,
    /// Hover lines after the set, problem index and layer.
    pub fields: Vec<Field<'a>>,
    /// Each point's latent code per layer, `[N, L, heads x keys]`, drawn on click; finite.
    pub codes: Option<ArrayView3<'a, f32>>,
    /// The problems, drawn on click.
    pub problems: Option<SravenProblems<'a>>,
}

/// The latent-space explorer (an [`InteractiveFigure`]).
///
/// Positions are stored quantised to 16 bits per axis over their range (an error below 1/65,535
/// of the range), codes to 4 bits per set and layer over their range (16 levels: enough for the
/// colours of the code drawing; the hover value of a code cell is the dequantised one, marked
/// `≈`, within 1/30 of the range), small integers (labels, panel values) to 4 bits.
#[derive(Debug, Clone)]
pub struct CodeExplorer<'a> {
    /// Title above the scatter.
    pub title: String,
    /// Layer names in the layer switch, e.g. "0", "1", ..., L of them.
    pub layers: Vec<String>,
    /// Projection names and their axis titles, e.g. `("PCA", ["PC1", "PC2"])`, P of them.
    pub projections: Vec<(String, [String; 2])>,
    /// The colourings, the first one shown first.
    pub colorings: Vec<Coloring>,
    /// Head labels of the code drawing (`L3H0`, or `H0`, ...).
    pub heads: Vec<String>,
    /// Key labels of the code drawing (e.g. `k27`, `k31`).
    pub keys: Vec<String>,
    /// The sets, the last one shown first (by convention OOD).
    pub sets: Vec<ExplorerSet<'a>>,
    /// The layer shown first (an index into `layers`); `None` shows the last.
    pub start_layer: Option<usize>,
}

impl CodeExplorer<'_> {
    fn check(&self) -> Result<()> {
        let empty = |what: &str| VizError::Empty { what: what.into() };
        if self.sets.is_empty() {
            return Err(empty("explorer sets"));
        }
        if self.layers.is_empty() {
            return Err(empty("explorer layers"));
        }
        if self.projections.is_empty() {
            return Err(empty("explorer projections"));
        }
        if self.colorings.is_empty() {
            return Err(empty("explorer colourings"));
        }
        if let Some(l) = self.start_layer.filter(|&l| l >= self.layers.len()) {
            return Err(VizError::InvalidOption {
                name: "start_layer".into(),
                reason: format!("{l} is not below the {} layers", self.layers.len()),
            });
        }
        for c in &self.colorings {
            if c.classes.is_empty() || c.classes.len() > 64 {
                return Err(VizError::InvalidOption {
                    name: format!("colouring `{}`", c.name),
                    reason: format!("needs 1 to 64 classes, has {}", c.classes.len()),
                });
            }
        }
        let (p, l) = (self.projections.len(), self.layers.len());
        for s in &self.sets {
            let n = s.index.len();
            let what = |x: &str| format!("explorer set `{}` {x}", s.name);
            if n == 0 {
                return Err(empty(&what("points")));
            }
            let (pp, ll, nn, two) = s.points.dim();
            for (name, exp, got) in [
                ("points: projections (axis 0)", p, pp),
                ("points: layers (axis 1)", l, ll),
                ("points: points (axis 2, one per index)", n, nn),
                ("points: coordinates (axis 3)", 2, two),
            ] {
                if exp != got {
                    return Err(VizError::Length {
                        what: what(name),
                        expected: exp,
                        got,
                    });
                }
            }
            check_finite(&what("points"), s.points.iter().copied())?;
            if s.colors.len() != self.colorings.len() {
                return Err(VizError::Length {
                    what: what("colours (one label array per colouring)"),
                    expected: self.colorings.len(),
                    got: s.colors.len(),
                });
            }
            for (c, labels) in self.colorings.iter().zip(&s.colors) {
                same(&what(&format!("`{}` labels", c.name)), n, labels.len())?;
                in_classes(
                    &what(&format!("`{}` labels", c.name)),
                    labels,
                    c.classes.len(),
                )?;
            }
            for f in &s.fields {
                same(&what(&format!("field `{}`", f.name)), n, f.values.len())?;
                match &f.values {
                    FieldValues::Category { labels, names } => {
                        in_classes(&what(&format!("field `{}`", f.name)), labels, names.len())?;
                    }
                    FieldValues::Float(v) => {
                        check_finite(&what(&format!("field `{}`", f.name)), v.iter().copied())?;
                    }
                    _ => {}
                }
            }
            if let Some(c) = &s.codes {
                let (cn, cl, cc) = c.dim();
                let hk = self.heads.len() * self.keys.len();
                for (name, exp, got) in [
                    ("codes: points (axis 0)", n, cn),
                    ("codes: layers (axis 1)", l, cl),
                    ("codes: heads x keys (axis 2)", hk, cc),
                ] {
                    if exp != got || got == 0 {
                        return Err(VizError::Length {
                            what: what(name),
                            expected: exp,
                            got,
                        });
                    }
                }
                check_finite(&what("codes"), c.iter().map(|&v| f64::from(v)))?;
            }
            if let Some(pr) = &s.problems {
                let (vn, panels, f) = pr.values.dim();
                same(&what("problems: points (axis 0)"), n, vn)?;
                same(&what("problems: panels (axis 1)"), 9, panels)?;
                if f == 0 {
                    return Err(empty(&what("problems: features")));
                }
                same(&what("problems: slot"), n, pr.slot.len())?;
                same(&what("problems: prediction"), n, pr.prediction.len())?;
                if let Some(i) = pr.slot.iter().position(|&x| x < 0 || x as usize >= f) {
                    return Err(VizError::OutOfRange {
                        what: what("problems: slot"),
                        at: format!("[{i}]"),
                        value: pr.slot[i] as f64,
                        lo: 0.0,
                        hi: (f - 1) as f64,
                    });
                }
                if let Some(i) = pr.values.iter().position(|&x| !(0..=255).contains(&x)) {
                    return Err(VizError::OutOfRange {
                        what: what("problems: values"),
                        at: format!("(flat index {i})"),
                        value: pr.values.iter().nth(i).copied().unwrap_or(0) as f64,
                        lo: 0.0,
                        hi: 255.0,
                    });
                }
                if let Some(&t) = pr.marked.iter().chain([&pr.query]).find(|&&t| t >= 9 * f) {
                    return Err(VizError::OutOfRange {
                        what: what("problems: marked token"),
                        at: "(site)".into(),
                        value: t as f64,
                        lo: 0.0,
                        hi: (9 * f - 1) as f64,
                    });
                }
            }
        }
        Ok(())
    }

    fn set_json(&self, s: &ExplorerSet<'_>) -> Result<Value> {
        let n = s.index.len();
        let xy: Vec<Value> = s
            .points
            .outer_iter()
            .map(|proj| {
                proj.outer_iter()
                    .map(|layer| {
                        let xs: Vec<f64> = layer.column(0).to_vec();
                        let ys: Vec<f64> = layer.column(1).to_vec();
                        let (x, rx) = quantised(&xs, 16);
                        let (y, ry) = quantised(&ys, 16);
                        json!({"x": x, "y": y, "rx": rx, "ry": ry})
                    })
                    .collect()
            })
            .collect();
        let colors: Vec<Value> = s
            .colors
            .iter()
            .map(|c| ints("colours", c.iter().map(|&v| v as i64)))
            .collect::<Result<_>>()?;
        let mut fields = Vec::new();
        for f in &s.fields {
            let v = match &f.values {
                FieldValues::Int(v) => {
                    json!({"kind": "int", "v": ints(&f.name, v.iter().copied())?})
                }
                FieldValues::Category { labels, names } => json!({
                    "kind": "cat",
                    "v": ints(&f.name, labels.iter().map(|&v| v as i64))?,
                    "names": names,
                }),
                FieldValues::Bool(v) => {
                    json!({"kind": "bool", "v": ints(&f.name, v.iter().map(|&b| i64::from(b)))?})
                }
                FieldValues::Float(v) => {
                    json!({"kind": "float", "v": floats(v.iter().copied())})
                }
                FieldValues::Text(v) => json!({"kind": "text", "v": v}),
            };
            let mut v = v;
            v["name"] = json!(f.name);
            fields.push(v);
        }
        let codes = match &s.codes {
            Some(c) => Value::Array(
                c.axis_iter(Axis(1))
                    .map(|layer| {
                        let flat: Vec<f64> = layer.iter().map(|&v| f64::from(v)).collect();
                        let (q, r) = quantised(&flat, 4);
                        json!({"q": q, "r": r, "top": 15})
                    })
                    .collect(),
            ),
            None => Value::Null,
        };
        let problems = match &s.problems {
            Some(p) => json!({
                "values": ints("problem values", p.values.iter().copied())?,
                "features": p.values.dim().2,
                "slot": ints("problem slot", p.slot.iter().copied())?,
                "prediction": ints("problem prediction", p.prediction.iter().copied())?,
                "marked": p.marked,
                "query": p.query,
            }),
            None => Value::Null,
        };
        Ok(json!({
            "name": s.name,
            "reproduce": s.reproduce,
            "n": n,
            "index": ints("problem index", s.index.iter().copied())?,
            "colors": colors,
            "fields": fields,
            "xy": xy,
            "codes": codes,
            "problems": problems,
        }))
    }
}

fn same(what: &str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(VizError::Length {
            what: what.to_string(),
            expected,
            got,
        })
    }
}

fn in_classes(what: &str, labels: &[usize], classes: usize) -> Result<()> {
    match labels.iter().position(|&c| c >= classes) {
        None => Ok(()),
        Some(i) => Err(VizError::OutOfRange {
            what: what.to_string(),
            at: format!("[{i}]"),
            value: labels[i] as f64,
            lo: 0.0,
            hi: classes.saturating_sub(1) as f64,
        }),
    }
}

/// `#rrggbb` of a plotters colour (the PNG figures' palette, so both agree).
pub(super) fn hex(c: plotters::style::RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

impl InteractiveFigure for CodeExplorer<'_> {
    fn kind(&self) -> &'static str {
        "explorer"
    }

    fn canvas(&self) -> (u32, u32) {
        (1040, 640)
    }

    fn data_json(&self) -> Result<String> {
        self.check()?;
        let colorings: Vec<Value> = self
            .colorings
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "classes": c.classes,
                    "colors": (0..c.classes.len()).map(|k| hex(categorical(k))).collect::<Vec<_>>(),
                })
            })
            .collect();
        let sets: Vec<Value> = self
            .sets
            .iter()
            .map(|s| self.set_json(s))
            .collect::<Result<_>>()?;
        Ok(safe_json(&json!({
            "title": self.title,
            "layers": self.layers,
            "projections": self.projections.iter().map(|(n, a)| json!({"name": n, "axes": a})).collect::<Vec<_>>(),
            "colorings": colorings,
            "heads": self.heads,
            "keys": self.keys,
            "sets": sets,
            "start": self.start_layer.unwrap_or(self.layers.len() - 1),
        })))
    }
}
