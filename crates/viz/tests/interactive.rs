//! The interactive figures' output: the data they embed decodes back to the inputs, the same
//! inputs give the same bytes, nothing refers to the network, and bad input is an error.

use hyperlens_viz::{
    CodeExplorer, Coloring, ExplorerSet, Field, FieldValues, InteractiveFigure, PatternExplorer,
    SravenProblems, VizError,
};
use ndarray::{Array3, Array4};
use serde_json::Value;

fn unbase64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let n = chunk
            .iter()
            .filter(|&&c| c != b'=')
            .enumerate()
            .fold(0u32, |n, (k, &c)| n | (u32::from(val(c)) << (18 - 6 * k)));
        let real = chunk.iter().filter(|&&c| c != b'=').count();
        for k in 0..real - 1 {
            out.push((n >> (16 - 8 * k)) as u8);
        }
    }
    out
}

/// The numbers of an encoded array `{t, n, b}`.
fn decode(a: &Value) -> Vec<f64> {
    let b = unbase64(a["b"].as_str().unwrap());
    let n = a["n"].as_u64().unwrap() as usize;
    let v: Vec<f64> = match a["t"].as_str().unwrap() {
        "u4" => (0..n)
            .map(|j| f64::from((b[j / 2] >> ((j % 2) * 4)) & 15))
            .collect(),
        "u8" => b.iter().map(|&x| f64::from(x)).collect(),
        "u16" => b
            .chunks(2)
            .map(|c| f64::from(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        "i32" => b
            .chunks(4)
            .map(|c| f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        "f32" => b
            .chunks(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        t => panic!("type {t}"),
    };
    assert_eq!(v.len(), a["n"].as_u64().unwrap() as usize);
    v
}

fn data_of(svg: &str) -> Value {
    let start = svg.find("class=\"hl-data\">").unwrap() + "class=\"hl-data\">".len();
    let end = start + svg[start..].find("</script>").unwrap();
    serde_json::from_str(&svg[start..end]).unwrap()
}

struct Inputs {
    points: Array4<f64>,
    index: Vec<i64>,
    rule: Vec<usize>,
    target: Vec<i64>,
    correct: Vec<bool>,
    codes: Array3<f32>,
    values: Array3<i64>,
    slot: Vec<i64>,
}

/// 13 points, 2 projections, 3 layers, 4 heads x 2 keys; seeded arbitrary values.
fn inputs() -> Inputs {
    let n = 13;
    let f =
        |i: usize, k: u64| ((i as u64 * 2_654_435_761 + k * 40_503) % 1000) as f64 / 100.0 - 5.0;
    Inputs {
        points: Array4::from_shape_fn((2, 3, n, 2), |(p, l, i, c)| {
            f(i, (p * 7 + l * 3 + c) as u64) * (1.0 + l as f64)
        }),
        index: (0..n as i64).map(|i| 100 + 3 * i).collect(),
        rule: (0..n).map(|i| (i * 5) % 8).collect(),
        target: (0..n as i64).map(|i| (i * 3) % 8).collect(),
        correct: (0..n).map(|i| i % 3 != 0).collect(),
        codes: Array3::from_shape_fn((n, 3, 8), |(i, l, c)| {
            (f(i, (l * 8 + c) as u64) / 5.0) as f32
        }),
        values: Array3::from_shape_fn((n, 9, 4), |(i, p, k)| ((i + 2 * p + 3 * k) % 8) as i64),
        slot: vec![3; n],
    }
}

fn rule_names() -> Vec<String> {
    (0..8).map(|k| format!("rule{k}")).collect()
}

fn explorer(d: &Inputs) -> CodeExplorer<'_> {
    CodeExplorer {
        title: "codes <by rule> & more".into(),
        layers: vec!["0".into(), "1".into(), "2".into()],
        projections: vec![
            ("PCA".into(), ["PC1".into(), "PC2".into()]),
            ("t-SNE".into(), ["t-SNE 1".into(), "t-SNE 2".into()]),
        ],
        colorings: vec![Coloring {
            name: "rule".into(),
            classes: rule_names(),
        }],
        heads: (0..4).map(|h| format!("H{h}")).collect(),
        keys: vec!["k27".into(), "k31".into()],
        sets: vec![ExplorerSet {
            name: "OOD".into(),
            reproduce: "hyperlens tasks sample --set ood --seed 0".into(),
            points: d.points.view(),
            index: &d.index,
            colors: vec![&d.rule],
            fields: vec![
                Field {
                    name: "rule".into(),
                    values: FieldValues::Category {
                        labels: &d.rule,
                        names: rule_names(),
                    },
                },
                Field {
                    name: "target".into(),
                    values: FieldValues::Int(&d.target),
                },
                Field {
                    name: "correct".into(),
                    values: FieldValues::Bool(&d.correct),
                },
            ],
            codes: Some(d.codes.view()),
            problems: Some(SravenProblems {
                values: d.values.view(),
                slot: &d.slot,
                prediction: &d.target,
                marked: vec![27, 31],
                query: 35,
            }),
        }],
        start_layer: None,
    }
}

#[test]
fn explorer_embeds_its_data_once_and_it_decodes_to_the_inputs() {
    let d = inputs();
    let svg = explorer(&d).svg_document().unwrap();
    // Same inputs, same bytes.
    assert_eq!(svg, explorer(&d).svg_document().unwrap());
    // One data object, one script; the title's markup characters are escaped in the JSON.
    assert_eq!(svg.matches("class=\"hl-data\"").count(), 1);
    assert_eq!(
        svg.matches("// hyperlens interactive figures").count(),
        1,
        "the script, once"
    );
    let data = data_of(&svg);
    assert_eq!(data["title"], "codes <by rule> & more");
    let set = &data["sets"][0];
    assert_eq!(
        decode(&set["index"]),
        d.index.iter().map(|&v| v as f64).collect::<Vec<_>>()
    );
    assert_eq!(
        decode(&set["colors"][0]),
        d.rule.iter().map(|&v| v as f64).collect::<Vec<_>>()
    );
    // Positions: 16-bit over each axis's range, so within half a step of the input.
    for p in 0..2 {
        for l in 0..3 {
            let a = &set["xy"][p][l];
            for (c, key, r) in [(0, "x", "rx"), (1, "y", "ry")] {
                let q = decode(&a[key]);
                let lo = a[r][0].as_f64().unwrap();
                let hi = a[r][1].as_f64().unwrap();
                for (i, qv) in q.iter().enumerate() {
                    let back = lo + qv * (hi - lo) / 65535.0;
                    let want = d.points[[p, l, i, c]];
                    assert!(
                        (back - want).abs() <= (hi - lo) / 65535.0,
                        "p{p} l{l} i{i}: {back} vs {want}"
                    );
                }
            }
        }
    }
    // Codes: 4 bits per layer, point-major then head-major then key.
    for l in 0..3 {
        let c = &set["codes"][l];
        let q = decode(&c["q"]);
        let (lo, hi) = (c["r"][0].as_f64().unwrap(), c["r"][1].as_f64().unwrap());
        for i in 0..13 {
            for k in 0..8 {
                let back = lo + q[i * 8 + k] * (hi - lo) / 15.0;
                assert!((back - f64::from(d.codes[[i, l, k]])).abs() <= (hi - lo) / 30.0 + 1e-9);
            }
        }
    }
    let pr = &set["problems"];
    assert_eq!(
        decode(&pr["values"]),
        d.values.iter().map(|&v| v as f64).collect::<Vec<_>>()
    );
    assert_eq!(pr["marked"], serde_json::json!([27, 31]));
    assert_eq!(set["fields"][2]["kind"], "bool");
    assert_eq!(decode(&set["fields"][2]["v"])[0], 0.0, "point 0 is wrong");
    // No network: the only URL is the SVG namespace (of the element and of the script).
    assert_eq!(
        svg.replace("http://www.w3.org/2000/svg", "")
            .matches("http")
            .count(),
        0
    );
    assert!(svg.contains("xmlns=\"http://www.w3.org/2000/svg\""));
    // The HTML fragment is the same element.
    let html = explorer(&d).html().unwrap();
    assert!(html.contains(explorer(&d).svg_element().unwrap().as_str()));
}

#[test]
fn script_survives_cdata_and_has_no_network() {
    let js = hyperlens_viz::interactive::SCRIPT;
    assert!(!js.contains("]]>"));
    let js = js.replace("http://www.w3.org/2000/svg", "");
    for word in ["http", "fetch(", "XMLHttpRequest", "import(", "eval("] {
        assert!(!js.contains(word), "{word}");
    }
}

#[test]
fn explorer_rejects_bad_input_by_name() {
    let d = inputs();
    let mut e = explorer(&d);
    let short = vec![0usize; 5];
    e.sets[0].colors = vec![&short];
    match e.data_json() {
        Err(VizError::Length {
            what,
            expected: 13,
            got: 5,
        }) => assert!(what.contains("rule"), "{what}"),
        other => panic!("{other:?}"),
    }
    let mut e = explorer(&d);
    let big = vec![9usize; 13];
    e.sets[0].colors = vec![&big];
    assert!(matches!(e.data_json(), Err(VizError::OutOfRange { .. })));
    let mut pts = d.points.clone();
    pts[[1, 2, 4, 0]] = f64::NAN;
    let mut e = explorer(&d);
    e.sets[0].points = pts.view();
    assert!(matches!(e.data_json(), Err(VizError::NonFinite { .. })));
    let mut e = explorer(&d);
    e.layers.pop();
    assert!(matches!(
        e.data_json(),
        Err(VizError::Length {
            expected: 2,
            got: 3,
            ..
        })
    ));
    let mut e = explorer(&d);
    e.heads.pop();
    assert!(matches!(e.data_json(), Err(VizError::Length { .. })));
    let mut e = explorer(&d);
    e.sets.clear();
    assert!(matches!(e.data_json(), Err(VizError::Empty { .. })));
}

#[test]
fn patterns_store_small_matrices_exactly_and_large_ones_quantised() {
    let small = Array4::from_shape_fn((2, 3, 5, 7), |(l, h, i, j)| {
        ((l * 31 + h * 17 + i * 5 + j) % 11) as f64 / 10.0 - 0.3
    });
    let tokens: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
    let cols: Vec<String> = (0..7).map(|i| format!("c{i}")).collect();
    let mut fig = PatternExplorer::attention("attn", small.view(), &tokens);
    fig.col_labels = cols.clone();
    let data = data_of(&fig.svg_document().unwrap());
    assert_eq!(data["shape"], serde_json::json!([2, 3, 5, 7]));
    let exact = decode(&data["values"]["exact"]);
    for (a, b) in exact.iter().zip(small.iter()) {
        assert_eq!(*a, f64::from(*b as f32));
    }
    // A negative value: symmetric diverging range.
    let r = &data["range"];
    assert_eq!(r[0].as_f64().unwrap(), -0.7);
    assert_eq!(r[1].as_f64().unwrap(), 0.7);
    assert_eq!(data["lut"].as_array().unwrap().len(), 64);

    let big = Array4::from_shape_fn((2, 16, 36, 36), |(l, h, i, j)| {
        ((l + h + i * j) % 9) as f64 / 8.0
    });
    let t36: Vec<String> = (0..36).map(|i| format!("t{i}")).collect();
    let data = data_of(
        &PatternExplorer::attention("a", big.view(), &t36)
            .svg_document()
            .unwrap(),
    );
    let q = decode(&data["values"]["q"]);
    let (lo, hi) = (
        data["values"]["r"][0].as_f64().unwrap(),
        data["values"]["r"][1].as_f64().unwrap(),
    );
    for (qv, want) in q.iter().zip(big.iter()) {
        assert!((lo + qv * (hi - lo) / 255.0 - want).abs() <= (hi - lo) / 510.0 + 1e-12);
    }
    // Labels must match the matrix.
    let mut bad = PatternExplorer::attention("a", big.view(), &t36);
    bad.row_labels.pop();
    assert!(matches!(
        bad.data_json(),
        Err(VizError::Length {
            expected: 35,
            got: 36,
            ..
        })
    ));
}

#[test]
fn files_are_written_atomically_and_whole() {
    let d = inputs();
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("e.svg");
    let html = dir.path().join("e.html");
    hyperlens_viz::save_interactive_svg(&svg, &explorer(&d)).unwrap();
    hyperlens_viz::save_interactive_html(&html, &explorer(&d)).unwrap();
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<?xml") && s.trim_end().ends_with("</svg>"));
    let h = std::fs::read_to_string(&html).unwrap();
    assert!(h.starts_with("<!DOCTYPE html>") && h.contains(&explorer(&d).svg_element().unwrap()));
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "no temporary file left"
    );
}

/// With `HYPERLENS_VIZ_DEMO_DIR` set, writes the test figures there (`explorer.svg`,
/// `explorer.html`, `patterns.svg`) for a person or a browser to look at.
#[test]
fn demo_files_when_asked() {
    let Ok(dir) = std::env::var("HYPERLENS_VIZ_DEMO_DIR") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let d = inputs();
    hyperlens_viz::save_interactive_svg(dir.join("explorer.svg"), &explorer(&d)).unwrap();
    hyperlens_viz::save_interactive_html(dir.join("explorer.html"), &explorer(&d)).unwrap();
    let p = Array4::from_shape_fn((2, 4, 9, 9), |(l, h, i, j)| {
        if j <= i {
            ((l + h + i * j) % 7) as f64 / 6.0
        } else {
            0.0
        }
    });
    let t: Vec<String> = (0..9).map(|i| format!("tok{i}")).collect();
    hyperlens_viz::save_interactive_svg(
        dir.join("patterns.svg"),
        &PatternExplorer::attention("demo attention", p.view(), &t),
    )
    .unwrap();
}
