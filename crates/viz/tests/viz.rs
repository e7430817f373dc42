//! Integration tests: every figure renders to PNG and SVG; the files decode at the right size,
//! are not blank, and the SVG carries the title and legend strings; bad input is a clear error.
//!
//! Set `VIZ_EXAMPLES_DIR=/some/dir` to keep a copy of every PNG and SVG for looking at.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use hyperlens_viz::*;
use ndarray::{Array2, Array3, Array4};
use std::f64::consts::PI;

const RULES: [&str; 8] = [
    "constant",
    "progression +1",
    "progression +2",
    "progression -1",
    "progression -2",
    "addition",
    "subtraction",
    "distribute-three",
];

/// Default minimum non-white fraction of a figure.
const INK: f64 = 0.05;

fn rule_names() -> Vec<String> {
    RULES.iter().map(|s| s.to_string()).collect()
}

/// A small deterministic pseudo-random generator (64-bit LCG) so the tests need no rand crate.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.next().max(1e-12), self.next());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

struct Out {
    dir: tempfile::TempDir,
}

impl Out {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Decodes a PNG, checks its size and that it is not blank; returns (distinct colours, non-white fraction).
fn check_png(path: &Path, size: (u32, u32), min_colours: usize, min_ink: f64) -> (usize, f64) {
    assert!(path.exists(), "{} missing", path.display());
    if let Ok(dir) = std::env::var("VIZ_EXAMPLES_DIR") {
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::copy(
            path,
            Path::new(&dir).join(path.file_name().unwrap_or_default()),
        );
    }
    let dir = path.parent().expect("a figure path has a directory");
    assert!(
        std::fs::read_dir(dir)
            .expect("list the figure directory")
            .all(|e| !e
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp")),
        "temporary file left behind"
    );
    let bytes = std::fs::read(path).expect("read png");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    let img = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png)
        .expect("decode png")
        .to_rgb8();
    assert_eq!(img.dimensions(), size, "{}", path.display());
    let mut colours = HashSet::new();
    let mut ink = 0usize;
    for p in img.pixels() {
        colours.insert(p.0);
        if p.0 != [255, 255, 255] {
            ink += 1;
        }
    }
    let frac = ink as f64 / (size.0 as f64 * size.1 as f64);
    assert!(
        colours.len() >= min_colours,
        "{}: only {} colours",
        path.display(),
        colours.len()
    );
    assert!(
        frac >= min_ink,
        "{}: non-white fraction {frac}",
        path.display()
    );
    (colours.len(), frac)
}

fn check_svg(path: &Path, size: (u32, u32), must_contain: &[&str]) -> String {
    let svg = std::fs::read_to_string(path).expect("read svg");
    assert!(svg.starts_with("<svg"), "not an SVG document");
    assert!(
        svg.contains(&format!("width=\"{}\"", size.0))
            && svg.contains(&format!("height=\"{}\"", size.1))
    );
    for s in must_contain {
        assert!(svg.contains(s), "{}: missing {s:?}", path.display());
    }
    svg
}

/// Renders a figure to PNG and SVG at its default size and runs the checks.
/// `min_colours` distinct colours and a non-white fraction of at least `min_ink` are required.
fn render_both<F: Figure>(
    out: &Out,
    name: &str,
    fig: &F,
    (min_colours, min_ink): (usize, f64),
    must_contain: &[&str],
) -> (usize, f64) {
    let size = fig.size();
    let png = out.path(&format!("{name}.png"));
    let svg = out.path(&format!("{name}.svg"));
    save_png(&png, fig).expect("save png");
    save_svg(&svg, fig).expect("save svg");
    if let Ok(dir) = std::env::var("VIZ_EXAMPLES_DIR") {
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::copy(&svg, Path::new(&dir).join(format!("{name}.svg")));
    }
    check_svg(&svg, size, must_contain);
    check_png(&png, size, min_colours, min_ink)
}

/// Cosine similarity of 8 synthetic rule codes: addition and subtraction nearly equal.
fn similarity() -> Array2<f64> {
    let mut rng = Lcg(7);
    let mut codes = Array2::from_shape_fn((8, 13), |_| rng.normal());
    for k in 0..13 {
        codes[[6, k]] = codes[[5, k]] + 0.1 * rng.normal();
    }
    Array2::from_shape_fn((8, 8), |(i, j)| {
        let (a, b) = (codes.row(i), codes.row(j));
        a.dot(&b) / (a.dot(&a).sqrt() * b.dot(&b).sqrt())
    })
}

#[test]
fn rule_similarity_heatmap() {
    let out = Out::new();
    let fig = Heatmap::rule_similarity(
        "Rule similarity, layer 3",
        similarity().view(),
        &rule_names(),
    )
    .unwrap();
    let (colours, _) = render_both(
        &out,
        "rule_similarity",
        &fig,
        (30, INK),
        &[
            "Rule similarity, layer 3",
            "distribute-three",
            "cosine similarity",
            "1.00",
        ],
    );
    assert!(colours > 30);
    // Mismatched names and NaN are errors, not panics.
    let e = Heatmap::rule_similarity("x", similarity().view(), &rule_names()[..7]).unwrap_err();
    assert!(matches!(e, VizError::Length { .. }), "{e}");
    let mut bad = similarity();
    bad[[2, 5]] = f64::NAN;
    let fig = Heatmap::rule_similarity("x", bad.view(), &rule_names()).unwrap();
    let p = out.path("nan.png");
    let e = save_png(&p, &fig).unwrap_err();
    assert!(e.to_string().contains("[2, 5]"), "{e}");
    assert!(!p.exists());
}

#[test]
fn confusion_matrix_heatmap() {
    let out = Out::new();
    let mut rng = Lcg(11);
    let counts = Array2::from_shape_fn((8, 8), |(i, j)| {
        if i == j {
            40.0 + (rng.next() * 30.0).floor()
        } else {
            (rng.next() * 9.0).floor()
        }
    });
    let fig = Heatmap::confusion_matrix(
        "Confusion matrix, OOD, layer 3",
        counts.view(),
        &rule_names(),
        false,
    )
    .unwrap();
    render_both(
        &out,
        "confusion_counts",
        &fig,
        (20, INK),
        &[
            "Confusion matrix, OOD, layer 3",
            "predicted",
            "count",
            "subtraction",
        ],
    );
    let fig = Heatmap::confusion_matrix(
        "Confusion matrix (row-normalised)",
        counts.view(),
        &rule_names(),
        true,
    )
    .unwrap();
    render_both(
        &out,
        "confusion_normalised",
        &fig,
        (20, INK),
        &["row-normalised", "fraction of row"],
    );
}

#[test]
fn composition_and_head_score_heatmaps() {
    let out = Out::new();
    let (l, h) = (3, 4);
    let mut rng = Lcg(3);
    let comp = Array4::from_shape_fn((l, h, l, h), |(l1, _, l2, _)| {
        if l1 < l2 {
            0.05 + 0.3 * rng.next()
        } else {
            0.0
        }
    });
    let fig = Heatmap::composition("K-composition scores", comp.view()).unwrap();
    render_both(
        &out,
        "composition",
        &fig,
        (20, INK),
        &["K-composition scores", "L2H3", "composition score"],
    );
    // A bigger model: 4 layers x 8 heads = 32 x 32 cells.
    let big = Array4::from_shape_fn((4, 8, 4, 8), |(l1, h1, l2, h2)| {
        if l1 < l2 {
            ((l1 + h1 * h2) % 7) as f64 / 20.0
        } else {
            0.0
        }
    });
    let fig_big =
        Heatmap::composition("Q-composition scores, 4 layers x 8 heads", big.view()).unwrap();
    render_both(
        &out,
        "composition_large",
        &fig_big,
        (10, INK),
        &["L3H7", "L0H0"],
    );
    // The mask must match the values; masked cells may hold NaN.
    let mut masked = fig.clone();
    masked.values[[11, 0]] = f64::NAN;
    assert!(render_png(&masked, (500, 400)).is_ok());
    masked.options.mask = Some(Array2::from_elem((3, 3), false));
    let e = render_png(&masked, (500, 400)).unwrap_err();
    assert!(
        matches!(e, VizError::InvalidOption { .. }) && e.to_string().contains("mask"),
        "{e}"
    );
    let wrong = Array4::<f64>::zeros((3, 4, 2, 4));
    assert!(matches!(
        Heatmap::composition("x", wrong.view()),
        Err(VizError::Length { .. })
    ));
    let scores = Array2::from_shape_fn((l, h), |_| 2.0 * rng.next() - 1.0);
    let fig = Heatmap::head_scores(
        "Copying scores",
        scores.view(),
        "copying score",
        ColorMap::BlueWhiteRed,
        Some((-1.0, 1.0)),
    )
    .unwrap();
    render_both(
        &out,
        "head_scores",
        &fig,
        (20, INK),
        &["Copying scores", "H3", "L2", "copying score"],
    );
}

/// Synthetic projections: rules separate more with depth, the target value dominates early.
fn pca_data(n: usize, layers: usize) -> (Vec<Array2<f64>>, Vec<usize>, Vec<f64>) {
    let mut rng = Lcg(5);
    let labels: Vec<usize> = (0..n).map(|_| (rng.next() * 8.0) as usize).collect();
    let targets: Vec<f64> = (0..n).map(|i| ((i * 3 + i / 7) % 8) as f64).collect();
    let points = (0..layers)
        .map(|l| {
            let sep = 0.5 + 2.0 * l as f64;
            Array2::from_shape_fn((n, 2), |(i, d)| {
                let angle = labels[i] as f64 * PI / 4.0;
                let centre = if d == 0 { angle.cos() } else { angle.sin() } * sep;
                let target = if d == 0 {
                    targets[i] * (3.0 - l as f64).max(0.0) * 0.4
                } else {
                    0.0
                };
                centre + target + 0.4 * rng.normal()
            })
        })
        .collect();
    (points, labels, targets)
}

fn panels(points: &[Array2<f64>]) -> Vec<ScatterPanel<'_>> {
    points
        .iter()
        .enumerate()
        .map(|(l, p)| ScatterPanel {
            title: format!("layer {l}"),
            points: p.view(),
            explained: [0.412 - 0.05 * l as f64, 0.187],
            axes: None,
        })
        .collect()
}

#[test]
fn pca_scatter_by_rule_and_by_target() {
    let out = Out::new();
    let (points, labels, targets) = pca_data(307, 4);
    let fig = PcaScatter::by_category(
        "Latent codes by rule (OOD)",
        panels(&points),
        &labels,
        &rule_names(),
        "rule",
    );
    assert!(fig.size().0 > 4 * 300);
    render_both(
        &out,
        "pca_by_rule",
        &fig,
        (40, INK),
        &[
            "Latent codes by rule (OOD)",
            "layer 3",
            "PC1 (41.2 %)",
            "progression +1",
            "distribute-three",
            "rule",
        ],
    );
    let fig = PcaScatter::by_value(
        "Latent codes by target value",
        panels(&points),
        &targets,
        "target value",
    );
    render_both(
        &out,
        "pca_by_target",
        &fig,
        (40, INK),
        &[
            "Latent codes by target value",
            "target value",
            "PC2 (18.7 %)",
        ],
    );

    // Bad input: mismatched labels, a label beyond the names, NaN points, empty panels.
    let p = out.path("bad.png");
    let e = save_png(
        &p,
        &PcaScatter::by_category("x", panels(&points), &labels[..300], &rule_names(), "rule"),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            VizError::Length {
                expected: 307,
                got: 300,
                ..
            }
        ),
        "{e}"
    );
    let mut big = labels.clone();
    big[9] = 8;
    let e = save_png(
        &p,
        &PcaScatter::by_category("x", panels(&points), &big, &rule_names(), "rule"),
    )
    .unwrap_err();
    assert!(
        matches!(e, VizError::OutOfRange { .. }) && e.to_string().contains("[9]"),
        "{e}"
    );
    let mut nan = points.clone();
    nan[2][[4, 1]] = f64::NAN;
    let e = save_svg(&p, &PcaScatter::by_value("x", panels(&nan), &targets, "t")).unwrap_err();
    assert!(
        e.to_string().contains("panel 2") && e.to_string().contains("[4, 1]"),
        "{e}"
    );
    let e = save_png(&p, &PcaScatter::by_value("x", Vec::new(), &targets, "t")).unwrap_err();
    assert!(matches!(e, VizError::Empty { .. }), "{e}");
    let wrong_cols = Array2::<f64>::zeros((307, 3));
    let bad_panel = vec![ScatterPanel {
        title: "l0".into(),
        points: wrong_cols.view(),
        explained: [0.5, 0.2],
        axes: None,
    }];
    assert!(matches!(
        save_png(&p, &PcaScatter::by_value("x", bad_panel, &targets, "t")),
        Err(VizError::Length { .. })
    ));
    assert!(!p.exists());
}

#[test]
fn decoding_accuracy_per_layer() {
    let out = Out::new();
    let softmax = [0.21, 0.34, 0.52, 0.71, 0.74];
    let hyla = [0.25, 0.45, 0.66, 0.88, 0.9];
    let majority = [0.125];
    let shuffled = [0.12, 0.13, 0.11, 0.125, 0.13];
    let fig = LayerAccuracy::new(
        "Rule decoding ID -> OOD",
        4,
        vec![
            Series {
                name: "softmax".into(),
                values: &softmax,
            },
            Series {
                name: "hyla".into(),
                values: &hyla,
            },
        ],
        vec![
            Reference {
                name: "majority class".into(),
                values: &majority,
            },
            Reference {
                name: "shuffled labels".into(),
                values: &shuffled,
            },
        ],
    );
    assert_eq!(fig.categories, vec!["0", "1", "2", "3", "all"]);
    render_both(
        &out,
        "decoding_accuracy",
        &fig,
        (20, 0.02),
        &[
            "Rule decoding ID -&gt; OOD",
            "majority class",
            "shuffled labels",
            "hyla",
            "all",
            "layer",
        ],
    );
    let bad = [0.2, 0.3, 1.2, 0.5, 0.5];
    let e = save_png(
        out.path("bad.png"),
        &LayerAccuracy::new(
            "x",
            4,
            vec![Series {
                name: "s".into(),
                values: &bad,
            }],
            vec![],
        ),
    )
    .unwrap_err();
    assert!(matches!(e, VizError::OutOfRange { .. }), "{e}");
    let short = [0.2, 0.3];
    let e = save_png(
        out.path("bad.png"),
        &LayerAccuracy::new(
            "x",
            4,
            vec![Series {
                name: "s".into(),
                values: &short,
            }],
            vec![],
        ),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            VizError::Length {
                expected: 5,
                got: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn sweep_curves_with_error_bars() {
    let out = Out::new();
    let fig = SweepCurves {
        title: "OOD accuracy against holdout".into(),
        categories: vec!["0.1".into(), "0.3".into(), "0.5".into(), "0.7".into()],
        x_label: "holdout".into(),
        y_label: "OOD accuracy".into(),
        series: vec![
            SweepSeries {
                name: "hyla".into(),
                mean: vec![0.8, 0.74, 0.61, 0.4],
                se: vec![0.02, 0.03, f64::NAN, 0.05],
            },
            SweepSeries {
                name: "softmax".into(),
                mean: vec![0.6, f64::NAN, 0.41, 0.3],
                se: vec![0.04, f64::NAN, 0.02, 0.01],
            },
        ],
        unit_range: true,
    };
    render_both(
        &out,
        "sweep_curves",
        &fig,
        (8, 0.02),
        &[
            "OOD accuracy against holdout",
            "hyla",
            "softmax",
            "0.7",
            "holdout",
        ],
    );
    let mut short = fig.clone();
    short.series[1].se.pop();
    let e = save_png(out.path("bad.png"), &short).unwrap_err();
    assert!(
        matches!(
            e,
            VizError::Length {
                expected: 4,
                got: 3,
                ..
            }
        ),
        "{e}"
    );
    let mut empty = fig.clone();
    for s in &mut empty.series {
        s.mean = vec![f64::NAN; 4];
    }
    let e = save_png(out.path("bad.png"), &empty).unwrap_err();
    assert!(matches!(e, VizError::Empty { .. }), "{e}");
}

fn token_labels() -> Vec<String> {
    let mut v: Vec<String> = (0..8)
        .flat_map(|p| (0..4).map(move |s| format!("P{p}s{s}")))
        .collect();
    v.extend((0..4).map(|s| format!("Q{s}")));
    v
}

/// Causal softmax patterns [heads, 36, 36] with a different stripe per head.
fn attention(heads: usize) -> Array3<f64> {
    let mut rng = Lcg(17);
    let t = 36;
    let mut a = Array3::<f64>::zeros((heads, t, t));
    for h in 0..heads {
        for q in 0..t {
            let mut row: Vec<f64> = (0..=q)
                .map(|k| {
                    let stripe = if q >= h % 9 && k == q - h % 9 {
                        4.0
                    } else {
                        0.0
                    };
                    (stripe + rng.normal()).exp()
                })
                .collect();
            let s: f64 = row.iter().sum();
            row.iter_mut().for_each(|v| *v /= s);
            for (k, v) in row.into_iter().enumerate() {
                a[[h, q, k]] = v;
            }
        }
    }
    a
}

#[test]
fn attention_grid_of_sixteen_heads() {
    let out = Out::new();
    let a = attention(16);
    let labels = token_labels();
    let fig = AttentionGrid::new("Attention, layer 2, problem 0", a.view(), &labels, &labels);
    assert_eq!(fig.columns, 4);
    render_both(
        &out,
        "attention_grid",
        &fig,
        (40, INK),
        &[
            "Attention, layer 2, problem 0",
            "head 15",
            "P0s0",
            "attention weight",
        ],
    );
    // The slot-3 query rows only (Q = 1 row per head) still render.
    let q_only = a
        .slice_axis(ndarray::Axis(1), ndarray::Slice::from(35..36))
        .to_owned();
    let fig = AttentionGrid::new("Query Q3 only", q_only.view(), &labels[35..], &labels);
    render_both(
        &out,
        "attention_query_row",
        &fig,
        (20, INK),
        &["Query Q3 only"],
    );
    let e = save_png(
        out.path("bad.png"),
        &AttentionGrid::new("x", a.view(), &labels[..35], &labels),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            VizError::Length {
                expected: 36,
                got: 35,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn single_head_induction_pattern() {
    let out = Out::new();
    // A random sequence of n = 9 tokens repeated twice plus BOS; the induction head attends from
    // position n+1+i to i+2 (the token after the earlier copy).
    let n = 9;
    let mut rng = Lcg(23);
    let seq: Vec<usize> = (0..n).map(|_| (rng.next() * 50.0) as usize).collect();
    let mut tokens = vec!["BOS".to_string()];
    tokens.extend(seq.iter().chain(seq.iter()).map(|t| format!("t{t}")));
    let len = tokens.len();
    let p = Array2::from_shape_fn((len, len), |(q, k)| {
        if q > n && k == q - n + 1 {
            0.9
        } else if k == 0 {
            if q > n {
                0.1
            } else {
                1.0
            }
        } else {
            0.0
        }
    });
    let fig = AttentionGrid::single_head(
        "Induction head L1H4 on a repeated sequence",
        p.view(),
        &tokens,
    );
    render_both(
        &out,
        "induction_head",
        &fig,
        (10, INK),
        &["Induction head L1H4", "BOS", "t"],
    );
}

#[test]
fn training_curves_loss_and_accuracy() {
    let out = Out::new();
    let mut rng = Lcg(29);
    let steps: Vec<f64> = (0..=60).map(|i| i as f64 * 2500.0).collect();
    let loss: Vec<f64> = steps
        .iter()
        .map(|s| 2.1 * (-s / 40000.0).exp() + 0.05 + 0.03 * rng.next())
        .collect();
    let eval_loss: Vec<f64> = steps
        .iter()
        .step_by(5)
        .map(|s| 2.2 * (-s / 45000.0).exp() + 0.08)
        .collect();
    let eval_steps: Vec<f64> = steps.iter().step_by(5).copied().collect();
    let id: Vec<f64> = eval_steps
        .iter()
        .map(|s| 1.0 / (1.0 + (-(s - 50000.0) / 12000.0).exp()))
        .collect();
    let ood: Vec<f64> = id.iter().map(|a| 0.8 * a).collect();
    let fig = TrainingCurves::new(
        "Training softmax-s0",
        vec![
            Curve {
                name: "train loss".into(),
                steps: &steps,
                values: &loss,
            },
            Curve {
                name: "ID loss".into(),
                steps: &eval_steps,
                values: &eval_loss,
            },
        ],
        vec![
            Curve {
                name: "ID accuracy".into(),
                steps: &eval_steps,
                values: &id,
            },
            Curve {
                name: "OOD accuracy".into(),
                steps: &eval_steps,
                values: &ood,
            },
        ],
    );
    render_both(
        &out,
        "training_curves",
        &fig,
        (20, 0.02),
        &[
            "Training softmax-s0",
            "train loss",
            "OOD accuracy",
            "step",
            "150k",
        ],
    );
    let mut log = fig.clone();
    log.log_loss = true;
    log.accuracy.clear();
    render_both(
        &out,
        "training_loss_log",
        &log,
        (10, 0.02),
        &["loss (log scale)"],
    );
    let e = save_png(
        out.path("bad.png"),
        &TrainingCurves::new(
            "x",
            vec![Curve {
                name: "l".into(),
                steps: &steps[..3],
                values: &loss,
            }],
            vec![],
        ),
    )
    .unwrap_err();
    assert!(matches!(e, VizError::Length { .. }), "{e}");
    let e = save_png(
        out.path("bad.png"),
        &TrainingCurves::new("x", vec![], vec![]),
    )
    .unwrap_err();
    assert!(matches!(e, VizError::Empty { .. }), "{e}");
}

#[test]
fn grouped_accuracy_bars() {
    let out = Out::new();
    let names: Vec<String> = [
        "softmax-s0",
        "softmax-s1",
        "linear-s0",
        "hyla-s0",
        "hyla-s1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let id = [0.97, 0.96, 0.81, 0.98, 0.99];
    let ood = [0.52, 0.49, 0.33, 0.71, 0.74];
    let fig = GroupedBars::accuracy(
        "Accuracy per checkpoint",
        &names,
        vec![
            BarSeries {
                name: "ID".into(),
                values: &id,
            },
            BarSeries {
                name: "OOD".into(),
                values: &ood,
            },
        ],
    );
    render_both(
        &out,
        "accuracy_bars",
        &fig,
        (10, INK),
        &["Accuracy per checkpoint", "hyla-s1", "OOD", "0.74", "0.97"],
    );
    // Many checkpoints with long names: the names are drawn rotated and still appear.
    let many: Vec<String> = (0..13)
        .map(|i| format!("hyla-seed{i}-step156250"))
        .collect();
    let vals: Vec<f64> = (0..13).map(|i| 0.3 + 0.05 * i as f64).collect();
    let fig = GroupedBars::accuracy(
        "OOD accuracy, 13 checkpoints",
        &many,
        vec![BarSeries {
            name: "OOD".into(),
            values: &vals,
        }],
    );
    render_both(
        &out,
        "accuracy_bars_many",
        &fig,
        (5, INK),
        &["hyla-seed12-step156250", "0.90"],
    );
    let nan = [0.5, f64::NAN, 0.5, 0.5, 0.5];
    let e = save_svg(
        out.path("bad.svg"),
        &GroupedBars::accuracy(
            "x",
            &names,
            vec![BarSeries {
                name: "ID".into(),
                values: &nan,
            }],
        ),
    )
    .unwrap_err();
    assert!(
        matches!(e, VizError::NonFinite { .. }) && e.to_string().contains("[1]"),
        "{e}"
    );
    assert!(!out.path("bad.svg").exists());
}

#[test]
fn ov_eigenvalues_per_head() {
    let out = Out::new();
    let (l, h, d) = (2, 4, 7);
    let mut rng = Lcg(31);
    // Head L0H0 copies (positive real eigenvalues), others random complex pairs.
    let eig: Vec<Vec<(f64, f64)>> = (0..l * h)
        .map(|i| {
            (0..d)
                .map(|_| {
                    if i == 0 {
                        (0.5 + rng.next(), 0.05 * rng.normal())
                    } else {
                        (rng.normal(), rng.normal())
                    }
                })
                .chain(std::iter::once((0.0, 0.0)))
                .collect()
        })
        .collect();
    let fig = EigenvalueGrid::layers_by_heads("OV eigenvalues", &eig, l, h).unwrap();
    render_both(
        &out,
        "ov_eigenvalues",
        &fig,
        (10, 0.02),
        &["OV eigenvalues", "L1H3", "Re(λ/|λ|)"],
    );
    assert!(matches!(
        EigenvalueGrid::layers_by_heads("x", &eig, 3, 4),
        Err(VizError::Length { .. })
    ));
    let mut bad = eig.clone();
    bad[5][2] = (f64::INFINITY, 0.0);
    let e = save_png(
        out.path("bad.png"),
        &EigenvalueGrid::layers_by_heads("x", &bad, l, h).unwrap(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("L1H1"), "{e}");
}

#[test]
fn figures_draw_on_any_backend_and_size() {
    // The Figure trait draws onto a caller's drawing area; a non-default size lays out again.
    let sim = similarity();
    let fig = Heatmap::rule_similarity("Rule similarity", sim.view(), &rule_names()).unwrap();
    let png = render_png(&fig, (613, 419)).unwrap();
    let img = image::load_from_memory(&png).unwrap();
    assert_eq!((img.width(), img.height()), (613, 419));
    let mut buf = vec![0u8; 300 * 200 * 3];
    {
        use plotters::prelude::*;
        let root = BitMapBackend::with_buffer(&mut buf, (300, 200)).into_drawing_area();
        fig.draw(&root).unwrap();
    }
    assert!(buf.iter().any(|b| *b != 255));
    assert!(matches!(
        render_png(&fig, (0, 100)),
        Err(VizError::InvalidOption { .. })
    ));
    // Writing into a missing directory is a clear error naming the file.
    let e = save_png("/nonexistent-dir-hyperlens/x.png", &fig).unwrap_err();
    assert!(
        e.to_string().contains("/nonexistent-dir-hyperlens/x.png"),
        "{e}"
    );
}
