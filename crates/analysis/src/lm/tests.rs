//! Tests of the LM analyses on synthetic code files: a planted signal found at its layer only,
//! controls at chance without one, a signal in the distances found by the distance baseline, the
//! behaviour filter, and bad input.

use std::ops::ControlFlow;

use hyperlens_io::sidecars::{LmCodesSidecar, LmFactor};
use ndarray::{Array1, Array2, Array4, Array5};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use super::*;

const OPS: usize = 4;
const DOMS: usize = 4;
const L: usize = 3;

/// Where the synthetic signal lives.
#[derive(Clone, Copy, PartialEq)]
enum Signal {
    None,
    /// A class mean of the operation in the codes of layer axis 1 (and in `resid` of layer 1).
    Layer1,
    /// The operation moves the key positions.
    Distances,
}

fn sidecar(n: usize) -> LmCodesSidecar {
    let vals = |p: &str, k: usize| (0..k).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
    LmCodesSidecar {
        factors: vec![
            LmFactor {
                name: "domain".into(),
                values: vals("d", DOMS),
            },
            LmFactor {
                name: "operation".into(),
                values: vals("op", OPS),
            },
        ],
        form: "pattern".into(),
        has_resid: false,
        kv_group: vec![0, 1],
        label_factor: "operation".into(),
        layers: vec![2, 5, 7],
        model: "synthetic".into(),
        model_kind: "gguf".into(),
        n_heads: 2,
        n_prompts: n,
        prepend_bos: true,
        prompts: "prompts.jsonl".into(),
        shuffled_weights_seed: None,
        sites: "query: last; keys: demo_output".into(),
        tokenizer: "gguf".into(),
    }
}

/// `n_per` prompts per (domain, operation) combination; the combinations with
/// `(op + dom) % 4 == 0` are held out (split 1), so every operation and domain is seen in
/// training. Codes [N, 3, 2, 1, 4] of standard normal noise plus the signal.
fn synthetic(n_per: usize, signal: Signal, seed: u64) -> LmCodeSet {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = OPS * DOMS * n_per;
    let (h, q, k) = (2, 1, 4);
    // class means, 3 standard deviations apart on average
    let means: Vec<Vec<f32>> = (0..OPS)
        .map(|_| {
            (0..h * q * k)
                .map(|_| 2.0 * rng.sample::<f32, _>(StandardNormal))
                .collect()
        })
        .collect();
    let mut factors = Array2::<i64>::zeros((n, 2));
    let mut split = Array1::<i64>::zeros(n);
    for i in 0..n {
        let combo = i / n_per;
        let (dom, op) = (combo / OPS, combo % OPS);
        factors[[i, 0]] = dom as i64;
        factors[[i, 1]] = op as i64;
        split[i] = i64::from((op + dom) % 4 == 0);
    }
    let mut codes =
        Array5::<f32>::from_shape_fn((n, L, h, q, k), |_| rng.sample::<f32, _>(StandardNormal));
    if signal == Signal::Layer1 {
        for i in 0..n {
            let op = factors[[i, 1]] as usize;
            for (j, v) in codes
                .slice_mut(ndarray::s![i, 1, .., .., ..])
                .iter_mut()
                .enumerate()
            {
                *v += means[op][j];
            }
        }
    }
    let query_pos = Array2::from_shape_fn((n, q), |_| 60 + rng.gen_range(0..3i64));
    let key_pos = Array2::from_shape_fn((n, k), |(i, kk)| {
        let shift = if signal == Signal::Distances {
            12 * factors[[i, 1]]
        } else {
            0
        };
        (kk as i64) * 6 + rng.gen_range(0..3i64) + shift
    });
    LmCodeSet::new(
        codes,
        sidecar(n),
        factors,
        split,
        Array1::from_iter(0..n as i64),
        query_pos,
        key_pos,
    )
    .unwrap()
}

fn no_progress() -> impl FnMut(&LmProgress) -> ControlFlow<()> {
    |_| ControlFlow::Continue(())
}

fn run(set: &LmCodeSet, params: &LmAnalysisParams) -> LmAnalysis {
    analyze_sets(set, None, params, &mut no_progress()).unwrap()
}

fn params() -> LmAnalysisParams {
    LmAnalysisParams {
        factor: Some("operation".into()),
        n_bootstrap: 500,
        ..LmAnalysisParams::new("synthetic.npz")
    }
}

fn row(a: &LmAnalysis, layer: Option<usize>) -> &LmDecodingRow {
    a.decoding.rows.iter().find(|r| r.layer == layer).unwrap()
}

fn assert_in_ci(s: &ProbeScore) {
    assert!(s.ci_low <= s.accuracy && s.accuracy <= s.ci_high, "{:?}", s);
}

#[test]
fn planted_signal_is_decoded_at_its_layer_only() {
    let set = synthetic(20, Signal::Layer1, 1);
    let a = run(&set, &params());
    let d = &a.decoding;
    assert_eq!((d.n_train, d.n_test), (240, 80));
    // balanced test split, training tie broken to op0: chance is 20 / 80
    assert_eq!(d.chance, 0.25);
    assert_eq!(d.chance_max, 0.25);
    assert_eq!(d.majority_class, "op0");
    assert_eq!(d.n_unseen_test, 0);
    assert_eq!(
        d.rows.iter().map(|r| r.layer).collect::<Vec<_>>(),
        vec![Some(2), Some(5), Some(7), None]
    );
    assert!(
        row(&a, Some(5)).codes.accuracy > 0.9,
        "{:?}",
        row(&a, Some(5))
    );
    assert!(row(&a, None).codes.accuracy > 0.9);
    for l in [2, 7] {
        let s = row(&a, Some(l)).codes;
        assert!(
            s.accuracy < 0.45 && s.ci_low < 0.25 + 0.05,
            "layer {l}: {s:?}"
        );
    }
    for r in &d.rows {
        assert_in_ci(&r.codes);
        assert_in_ci(&r.shuffled_labels);
        assert!(r.shuffled_labels.accuracy < 0.45, "{r:?}");
        assert!(r.shuffled_weights.is_none() && r.resid.is_none());
    }
    assert_in_ci(&d.distance);
    assert!(d.distance.accuracy < 0.45);
    // the PCA / k-means view: the clusters of layer 5 follow the operation
    let s5 = a.structure.iter().find(|r| r.layer == Some(5)).unwrap();
    assert_eq!((s5.n_rows, s5.k), (80, 4));
    assert!(s5.ari.unwrap() > 0.5, "{s5:?}");
    let s2 = a.structure.iter().find(|r| r.layer == Some(2)).unwrap();
    assert!(s2.ari.unwrap() < 0.2, "{s2:?}");
    let total: f64 = s5.explained_variance_ratio.iter().sum();
    assert!(total > 0.0 && total <= 1.0 + 1e-12);
}

#[test]
fn without_a_signal_everything_stays_at_chance() {
    let set = synthetic(20, Signal::None, 2);
    let a = run(&set, &params());
    let d = &a.decoding;
    for s in d
        .rows
        .iter()
        .flat_map(|r| [r.codes, r.shuffled_labels])
        .chain([d.distance])
    {
        assert_in_ci(&s);
        assert!(
            s.ci_low <= d.chance && d.chance <= s.ci_high + 0.05,
            "{s:?}"
        );
    }
}

#[test]
fn a_signal_in_the_distances_is_found_by_the_distance_baseline() {
    let set = synthetic(20, Signal::Distances, 3);
    let a = run(&set, &params());
    assert!(
        a.decoding.distance.accuracy > 0.9,
        "{:?}",
        a.decoding.distance
    );
    assert_eq!(a.decoding.distance.n_features, 4);
    // the codes hold nothing
    assert!(row(&a, None).codes.accuracy < 0.45);
}

#[test]
fn intervals_shrink_with_more_test_prompts() {
    let width = |n_per| {
        let a = run(&synthetic(n_per, Signal::None, 4), &params());
        let s = row(&a, Some(2)).codes;
        assert_in_ci(&s);
        s.ci_high - s.ci_low
    };
    let (small, large) = (width(5), width(60));
    assert!(small > 2.0 * large, "{small} vs {large}");
}

#[test]
fn shuffled_weights_and_resid_probes_run_on_the_same_rows() {
    let set = synthetic(10, Signal::Layer1, 5);
    let n = set.n_prompts();
    // resid: the operation written into one dimension of layer axis 0 only
    let resid = Array4::from_shape_fn((n, L, 1, 3), |(i, l, _, d)| {
        let op = set.factors()[[i, 1]] as f32;
        if l == 0 && d == 1 {
            op * 5.0 + (i % 7) as f32 * 0.1
        } else {
            ((i * 31 + l * 7 + d) % 11) as f32
        }
    });
    let set = set.with_resid(resid).unwrap();
    // the shuffled-weights file: same prompts, codes without the signal
    let other = synthetic(10, Signal::None, 6);
    let mut side = other.sidecar().clone();
    side.shuffled_weights_seed = Some(7);
    let other = LmCodeSet::new(
        other.codes().clone(),
        side,
        other.factors().clone(),
        other.split().clone(),
        other.prompt().clone(),
        set.query_pos().clone(),
        set.key_pos().clone(),
    )
    .unwrap();
    let a = analyze_sets(&set, Some(&other), &params(), &mut no_progress()).unwrap();
    let r5 = row(&a, Some(5));
    assert!(r5.codes.accuracy > 0.9);
    assert!(r5.shuffled_weights.unwrap().accuracy < 0.5, "{r5:?}");
    assert!(row(&a, Some(2)).resid.unwrap().accuracy > 0.9);
    assert_eq!(row(&a, Some(2)).resid.unwrap().n_features, 3);
    assert_eq!(row(&a, None).resid.unwrap().n_features, 9);
    // the table holds every probe
    let t = a.decoding.table().unwrap().to_csv();
    let header = t.lines().next().unwrap();
    for c in [
        "codes",
        "shuffled_labels_ci_low",
        "distance_ci_high",
        "shuffled_weights",
        "resid",
    ] {
        assert!(header.split(',').any(|h| h == c), "{header}");
    }

    // other prompts are refused
    let mut wrong = other.prompt().clone();
    wrong[3] = 999;
    let bad = LmCodeSet::new(
        other.codes().clone(),
        other.sidecar().clone(),
        other.factors().clone(),
        other.split().clone(),
        wrong,
        set.query_pos().clone(),
        set.key_pos().clone(),
    )
    .unwrap()
    .with_source_name("shuffled.npz");
    let err = analyze_sets(&set, Some(&bad), &params(), &mut no_progress()).unwrap_err();
    assert!(
        err.to_string().contains("shuffled.npz") && err.to_string().contains("`prompt`"),
        "{err}"
    );
}

#[test]
fn behaviour_drops_exactly_the_combinations_under_the_threshold() {
    let set = synthetic(10, Signal::Layer1, 7);
    let n = set.n_prompts();
    // combination c (= i / 10) has accuracy (c % 5) / 4 capped at 1: 0, .25, .5, .75, 1
    let correct = Array1::from_iter((0..n).map(|i| {
        let c = i / 10;
        let acc10 = ((c % 5) * 10 / 4).min(10);
        i % 10 < acc10
    }));
    let with = set.clone().with_correct(correct).unwrap();
    let p = LmAnalysisParams {
        min_accuracy: Some(0.7),
        ..params()
    };
    let a = run(&with, &p);
    let b = &a.behaviour;
    assert_eq!(b.combinations.len(), 16);
    let expected_dropped: Vec<usize> = (0..16).filter(|c| (c % 5) * 10 / 4 < 7).collect();
    let dropped: Vec<usize> = b
        .combinations
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.kept)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(dropped, expected_dropped);
    assert_eq!(b.n_dropped_combinations, expected_dropped.len());
    assert_eq!(b.n_dropped_prompts, 10 * expected_dropped.len());
    assert!(b.note.contains(&format!(
        "dropped {} of 16 combinations",
        expected_dropped.len()
    )));
    // the combinations are in the order of their value indices (domain, operation)
    assert_eq!(b.combinations[6].indices, vec![1, 2]);
    assert_eq!(b.combinations[6].values, vec!["d1", "op2"]);
    assert_eq!(b.combinations[6].accuracy, Some(0.2));
    // the decoding used only the kept prompts
    let kept_train = (0..n).filter(|&i| b.kept[i] && set.split()[i] == 0).count();
    assert_eq!(a.decoding.n_train, kept_train);
    assert_eq!(
        a.decoding.n_train + a.decoding.n_test,
        n - b.n_dropped_prompts
    );
    // without `correct`: everything kept, and said so
    let a = run(&set, &p);
    assert_eq!(a.behaviour.n_dropped_prompts, 0);
    assert!(a.behaviour.note.contains("no `correct` array"));
    let csv = a.behaviour.table().unwrap().to_csv();
    assert!(csv.starts_with("domain,operation,n_prompts,n_train,n_test,n_correct,accuracy,kept\nd0,op0,10,0,10,,,true\n"), "{csv}");
}

#[test]
fn classes_seen_only_in_test_count_as_errors() {
    let set = synthetic(10, Signal::Layer1, 8);
    // move every op3 prompt to the test split: op3 is never seen in training
    let split = Array1::from_iter(
        (0..set.n_prompts()).map(|i| i64::from(set.factors()[[i, 1]] == 3 || set.split()[i] == 1)),
    );
    let set = LmCodeSet::new(
        set.codes().clone(),
        set.sidecar().clone(),
        set.factors().clone(),
        split,
        set.prompt().clone(),
        set.query_pos().clone(),
        set.key_pos().clone(),
    )
    .unwrap();
    let a = run(&set, &params());
    let d = &a.decoding;
    assert_eq!(d.unseen_classes, vec!["op3"]);
    // test: op3 in 4 combinations (40 prompts), each other op in one held-out combination
    assert_eq!(d.chance_max, 40.0 / 70.0);
    assert_eq!(d.n_unseen_test, 40);
    // at most the seen test prompts can be right
    let seen = (d.n_test - d.n_unseen_test) as f64 / d.n_test as f64;
    assert!(row(&a, Some(5)).codes.accuracy <= seen + 1e-12);
    assert!(row(&a, Some(5)).codes.accuracy > 0.9 * seen);
}

#[test]
fn files_round_trip_and_bad_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("codes.npz");
    let set = synthetic(3, Signal::Layer1, 9)
        .with_correct(Array1::from_elem(48, true))
        .unwrap()
        .with_length(Array1::from_elem(48, 50))
        .unwrap();
    set.write(&path).unwrap();
    assert!(dir.path().join("codes.json").is_file());
    let back = LmCodeSet::read(&path).unwrap();
    assert_eq!(back.codes(), set.codes());
    assert_eq!(back.factors(), set.factors());
    assert_eq!(back.correct(), set.correct());
    assert_eq!(back.sidecar(), set.sidecar());
    let shown = path.display().to_string();

    // the whole analysis from files, and its outputs
    let p = LmAnalysisParams {
        n_bootstrap: 50,
        ..LmAnalysisParams::new(&path)
    };
    let a = analyze(&p, &mut no_progress()).unwrap();
    assert_eq!(a.factor, "operation");
    let out = dir.path().join("out");
    let written = a.write(&out).unwrap();
    assert_eq!(written.len(), 4);
    for f in [
        "decoding.csv",
        "behaviour.csv",
        "structure.csv",
        "summary.json",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }

    // an unknown factor lists the file's factors
    let err = analyze(
        &LmAnalysisParams {
            factor: Some("colour".into()),
            ..p.clone()
        },
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("colour") && err.contains("domain, operation"),
        "{err}"
    );
    // an unknown layer lists the file's layers
    let err = analyze(
        &LmAnalysisParams {
            layers: Some(vec![3]),
            ..p.clone()
        },
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("no layer 3") && err.contains("[2, 5, 7]"),
        "{err}"
    );
    // no test rows
    let all_train = LmCodeSet::new(
        set.codes().clone(),
        set.sidecar().clone(),
        set.factors().clone(),
        Array1::zeros(48),
        set.prompt().clone(),
        set.query_pos().clone(),
        set.key_pos().clone(),
    )
    .unwrap();
    let err = analyze_sets(&all_train, None, &params(), &mut no_progress())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no test rows"), "{err}");

    // a sidecar of another file
    let mut side = set.sidecar().clone();
    side.n_prompts = 47;
    let err = LmCodeSet::new(
        set.codes().clone(),
        side,
        set.factors().clone(),
        set.split().clone(),
        set.prompt().clone(),
        set.query_pos().clone(),
        set.key_pos().clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("n_prompts = 47"), "{err}");

    // a missing sidecar
    std::fs::rename(dir.path().join("codes.json"), dir.path().join("x.json")).unwrap();
    let err = LmCodeSet::read(&path).unwrap_err().to_string();
    assert!(err.contains(&shown) && err.contains("sidecar"), "{err}");
    std::fs::rename(dir.path().join("x.json"), dir.path().join("codes.json")).unwrap();

    // wrong shapes: key_pos with another K, factors with a bad index, a split of 2
    let write_with = |name: &str, f: &dyn Fn(&mut ndarray_npy::NpzWriter<std::fs::File>)| {
        let p = dir.path().join(format!("{name}.npz"));
        let mut npz = ndarray_npy::NpzWriter::new(std::fs::File::create(&p).unwrap());
        f(&mut npz);
        npz.finish().unwrap();
        std::fs::copy(dir.path().join("codes.json"), p.with_extension("json")).unwrap();
        p
    };
    let base = |npz: &mut ndarray_npy::NpzWriter<std::fs::File>, skip: &str| {
        let arrays: [(&str, ndarray::ArrayD<i64>); 5] = [
            ("label", set.label().clone().into_dyn()),
            ("factors", set.factors().clone().into_dyn()),
            ("split", set.split().clone().into_dyn()),
            ("prompt", set.prompt().clone().into_dyn()),
            ("query_pos", set.query_pos().clone().into_dyn()),
        ];
        npz.add_array("codes", set.codes()).unwrap();
        for (name, a) in arrays {
            if name != skip {
                npz.add_array(name, &a).unwrap();
            }
        }
    };
    let p1 = write_with("k", &|npz| {
        base(npz, "");
        npz.add_array("key_pos", &Array2::<i64>::zeros((48, 3)))
            .unwrap();
    });
    let err = LmCodeSet::read(&p1).unwrap_err().to_string();
    assert!(err.contains("k.npz") && err.contains("`key_pos`"), "{err}");
    let p2 = write_with("f", &|npz| {
        base(npz, "factors");
        let mut f = set.factors().clone();
        f[[4, 0]] = 9;
        npz.add_array("factors", &f).unwrap();
        npz.add_array("key_pos", set.key_pos()).unwrap();
    });
    let err = LmCodeSet::read(&p2).unwrap_err().to_string();
    assert!(
        err.contains("`factors`") && err.contains("row 4") && err.contains("`domain`"),
        "{err}"
    );
    let p3 = write_with("s", &|npz| {
        base(npz, "split");
        npz.add_array("split", &Array1::<i64>::from_elem(48, 2))
            .unwrap();
        npz.add_array("key_pos", set.key_pos()).unwrap();
    });
    let err = LmCodeSet::read(&p3).unwrap_err().to_string();
    assert!(err.contains("`split`"), "{err}");
    let p4 = write_with("m", &|npz| base(npz, "prompt"));
    let err = LmCodeSet::read(&p4).unwrap_err().to_string();
    assert!(err.contains("m.npz") && err.contains("`prompt`"), "{err}");
    assert!(analyze(&p, &mut |_| ControlFlow::Break(())).is_err());
}

#[test]
fn select_and_with_split_keep_rows_aligned() {
    let set = synthetic(3, Signal::Layer1, 5);
    let rows = [7usize, 2, 2, 40];
    let sub = set.select(&rows).unwrap();
    assert_eq!(sub.n_prompts(), 4);
    assert_eq!(sub.sidecar().n_prompts, 4);
    for (j, &r) in rows.iter().enumerate() {
        assert_eq!(sub.prompt()[j], r as i64);
        assert_eq!(sub.factors().row(j), set.factors().row(r));
        assert_eq!(sub.key_pos().row(j), set.key_pos().row(r));
        assert_eq!(
            sub.codes().index_axis(ndarray::Axis(0), j),
            set.codes().index_axis(ndarray::Axis(0), r)
        );
    }
    assert!(set.select(&[]).is_err());
    let err = set.select(&[set.n_prompts()]).unwrap_err().to_string();
    assert!(err.contains("outside"), "{err}");
    let flipped = sub
        .clone()
        .with_split(Array1::from(vec![1, 0, 1, 0]))
        .unwrap();
    assert_eq!(flipped.split().to_vec(), vec![1, 0, 1, 0]);
    let err = sub
        .clone()
        .with_split(Array1::from(vec![0, 2, 0, 0]))
        .unwrap_err();
    assert!(err.to_string().contains("row 1 is 2"), "{err}");
    assert!(sub.with_split(Array1::from(vec![0, 1])).is_err());
}
