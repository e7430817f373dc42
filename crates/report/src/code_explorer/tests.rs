//! The builders against independent definitions: the analysis crate's `CodeSet::features` and
//! PCA, the task's one-hot problems, the probe crate's paper site.

use hyperlens_analysis::pca::Pca;
use hyperlens_analysis::CodeSet;
use hyperlens_probe::Site;
use hyperlens_tasks::sraven::{sample, Set, Split, SplitName, SravenParams};
use ndarray::{s, Array1, Array5};

use super::*;
use crate::error::ReportError;

/// Seeded codes `[n, 3, 2, 1, 2]` and rule labels.
fn codes(n: usize, seed: u32) -> (Array5<f32>, Array1<i64>) {
    let c = Array5::from_shape_fn((n, 3, 2, 1, 2), |(i, l, h, _, k)| {
        let x = (i * 31 + l * 7 + h * 5 + k * 3) as u32 ^ seed.wrapping_mul(2_654_435_761);
        (x % 97) as f32 / 97.0 + (i % 4) as f32 * 0.1 * (l + 1) as f32
    });
    let label = Array1::from_shape_fn(n, |i| (i % 8) as i64);
    (c, label)
}

fn set<'a>(name: &str, c: &'a Array5<f32>, label: &'a Array1<i64>) -> SravenCodes<'a> {
    SravenCodes {
        name: name.into(),
        codes: c.view(),
        label: label.view(),
        target: Some(label.view()),
        prediction: Some(label.view()),
        correct: None,
        slot: None,
        problem: None,
    }
}

fn spec() -> SravenExplorerSpec {
    SravenExplorerSpec {
        site: None,
        layers: None,
        color: SravenColor::Rule,
        projection: Projection::Pca,
        title: None,
        start_layer: None,
    }
}

#[test]
fn points_are_the_analysis_pca_fit_on_the_last_set() {
    let (ca, la) = codes(24, 1);
    let (cb, lb) = codes(30, 2);
    let e = sraven_explorer(&[set("ID", &ca, &la), set("OOD", &cb, &lb)], &[], &spec()).unwrap();
    let ood = CodeSet::new(cb.clone(), lb.clone()).unwrap();
    let id = CodeSet::new(ca.clone(), la.clone()).unwrap();
    for layer in 0..3 {
        let fit = Pca::params(2)
            .fit(ood.features(Some(layer)).unwrap().view())
            .unwrap();
        for (d, c) in e.sets.iter().zip([&id, &ood]) {
            let want = fit
                .transform(c.features(Some(layer)).unwrap().view())
                .unwrap();
            let got = d.points.slice(s![0, layer, .., ..]);
            assert_eq!(got, want.slice(s![.., 0..2]));
        }
        let r = fit.explained_variance_ratio();
        assert_eq!(e.explained.as_ref().unwrap()[layer], [r[0], r[1]]);
    }
    assert_eq!(e.layers, ["0", "1", "2"]);
    assert_eq!(e.heads, ["H0", "H1"]);
    // The codes drawn on click: heads then keys of each layer.
    assert_eq!(e.sets[1].codes[[5, 2, 3]], cb[[5, 2, 1, 0, 1]]);
}

#[test]
fn the_paper_site_names_its_tokens_and_draws_the_sampled_problems() {
    let split = Split::of(SplitName::Paper(0), SravenParams::default()).unwrap();
    let p = sample(&split, Set::Ood, 12, 3, true).unwrap();
    let (c, l) = codes(12, 3);
    let origin = ProblemOrigin {
        split: Some("paper-seed0".into()),
        set: Some("ood".into()),
        seed: Some(3),
        unpermuted: true,
        subset: false,
    };
    let rows = SravenProblemRows {
        x: p.x.view(),
        y: p.y.view(),
        origin: origin.clone(),
    };
    let mut sp = spec();
    sp.color = SravenColor::Answer;
    let e = sraven_explorer(&[set("OOD", &c, &l)], &[("OOD".into(), rows)], &sp).unwrap();
    assert_eq!(e.title, "latent codes (query Q3, keys P6s3 and P7s3)");
    assert_eq!(e.keys, ["P6s3", "P7s3"]);
    assert_eq!(e.colorings[0].name, "answer value");
    assert_eq!(e.colorings[1].classes.len(), 8);
    let d = &e.sets[0];
    assert_eq!(
        d.reproduce,
        "hyperlens tasks sample --split paper-seed0 --set ood --n 12 --seed 3 --unpermuted --out problems.npz"
    );
    let panels = d.problems.as_ref().unwrap();
    assert_eq!((panels.query, panels.marked.clone()), (35, vec![27, 31]));
    assert!(panels.slot.iter().all(|&s| s == 3));
    for i in 0..12 {
        for k in 0..4 {
            assert_eq!(panels.values[[i, 8, k]], p.y[[i, k]]);
            for panel in 0..8 {
                let hot = p.x.slice(s![i, panel * 4 + k, ..]);
                let v = panels.values[[i, panel, k]] as usize;
                assert_eq!(hot[v], 1.0);
            }
        }
    }
    // A subset has no command; an unknown origin neither.
    let sub = ProblemOrigin {
        subset: true,
        ..origin
    };
    assert_eq!(sub.command(5), "");
    assert_eq!(ProblemOrigin::default().command(5), "");
}

#[test]
fn a_prefix_keeps_its_origin_and_other_rows_are_a_subset() {
    // The premise: the first k problems of a sample are the sample of k.
    let split = Split::of(SplitName::Paper(0), SravenParams::default()).unwrap();
    let (all, few) = (
        sample(&split, Set::Ood, 12, 3, true).unwrap(),
        sample(&split, Set::Ood, 5, 3, true).unwrap(),
    );
    assert_eq!(all.x.slice(s![..5, .., ..]), few.x);
    let origin = ProblemOrigin {
        split: Some("paper-seed0".into()),
        set: Some("ood".into()),
        seed: Some(3),
        unpermuted: true,
        subset: false,
    };
    for prefix in [&[][..], &[0], &[0, 1, 2, 3, 4]] {
        assert_eq!(origin.of_rows(prefix), origin, "{prefix:?}");
    }
    for other in [&[1][..], &[0, 2], &[1, 0], &[0, 0]] {
        let o = origin.of_rows(other);
        assert!(o.subset && o.command(other.len()).is_empty(), "{other:?}");
    }
    let sub = origin.of_rows(&[3]);
    assert!(sub.of_rows(&[0]).subset);
}

#[test]
fn bad_input_is_a_clear_error() {
    let (c, l) = codes(12, 4);
    let (c2, l2) = codes(12, 5);
    let narrow = c2.slice(s![.., 0..2, .., .., ..]).to_owned();
    let invalid = |r: Result<Explorer>, what: &str| match r {
        Err(ReportError::InvalidInput(m)) => assert!(m.contains(what), "{m}"),
        other => panic!("{what}: {other:?}"),
    };
    let mut sp = spec();
    sp.start_layer = Some(3);
    invalid(
        sraven_explorer(&[set("OOD", &c, &l)], &[], &sp),
        "`layer` 3 is not below the codes' 3 layers",
    );
    let mut sp = spec();
    sp.site = Some(Site::AllSlots);
    invalid(
        sraven_explorer(&[set("OOD", &c, &l)], &[], &sp),
        "one query",
    );
    let split = Split::of(SplitName::Paper(0), SravenParams::default()).unwrap();
    let p = sample(&split, Set::Id, 4, 0, true).unwrap();
    let rows = SravenProblemRows {
        x: p.x.view(),
        y: p.y.view(),
        origin: ProblemOrigin::default(),
    };
    invalid(
        sraven_explorer(
            &[set("OOD", &c, &l)],
            &[("ID".into(), rows.clone())],
            &spec(),
        ),
        "unknown sets",
    );
    // 12 codes, 4 problems: row 4 has no problem.
    invalid(
        sraven_explorer(&[set("OOD", &c, &l)], &[("OOD".into(), rows)], &spec()),
        "problem index 4",
    );
    assert!(matches!(
        sraven_explorer(&[set("ID", &narrow, &l2), set("OOD", &c, &l)], &[], &spec()),
        Err(ReportError::Analysis(
            hyperlens_analysis::AnalysisError::Shape(_)
        ))
    ));
    assert!(matches!(
        "nope".parse::<SravenColor>(),
        Err(ReportError::InvalidInput(_))
    ));
    assert!(Projection::parse("umap", 0).is_err());
}

#[test]
fn heatmap_panels_are_titled_and_spanned_by_the_library() {
    use ndarray::{array, Array4};
    assert_eq!(
        composition_title("k", Some(0.12345)),
        "K-composition scores (random baseline p99 = 0.123)"
    );
    assert_eq!(composition_title("q", None), "Q-composition scores");
    let acc = array![[0.002, -0.004], [0.0, 0.001]];
    let loss = array![[1.5, 1.0], [1.0, 1.2]];
    let panels = head_ablation_panels("mean", acc.view(), loss.view(), 1.0, None).unwrap();
    assert_eq!(panels[0].0, "accuracy change");
    assert_eq!(
        panels[0].1.options.title,
        "change in accuracy with each head mean-ablated"
    );
    // The accuracy span is at least 0.01; the loss span the largest change, 0.5.
    assert_eq!(panels[0].1.options.range, Some((-0.01, 0.01)));
    assert_eq!(panels[1].1.options.range, Some((-0.5, 0.5)));
    let fig = heatmap_explorer(&panels, Some("loss change"), None).unwrap();
    assert_eq!(fig.start, 1);
    assert!(matches!(
        heatmap_explorer(&panels, Some("nope"), None),
        Err(ReportError::InvalidInput(_))
    ));
    let s = Array4::<f64>::zeros((2, 2, 2, 2));
    let c = composition_panels(&[("v".into(), s.view(), Some(0.5))], None).unwrap();
    assert_eq!(
        c[0].1.options.title,
        "V-composition scores (random baseline p99 = 0.500)"
    );
}
