//! Integration tests of the latent-code analyses against scikit-learn reference values
//! (`tests/fixtures/make_reference.py` -> `reference.npz`, `reference.json`), on degenerate inputs,
//! and end to end through `analyze_pair` and the written tables.

use std::fs::File;
use std::path::PathBuf;

use hyperlens_analysis::cluster::{
    adjusted_rand_index, cluster_against_labels, kmeans, normalized_mutual_info, silhouette_score,
    silhouette_score_sampled, KMeansParams,
};
use hyperlens_analysis::codes::report::{CodeSplit, LayerSel, Stage};
use hyperlens_analysis::decode::{decode, DecodeParams, LogisticParams, LogisticProbe};
use hyperlens_analysis::pca::Pca;
use hyperlens_analysis::similarity::mean_code_similarity;
use hyperlens_analysis::{analyze_pair, AnalysisError, CodeSet, LatentAnalysisParams};
use ndarray::{Array1, Array2, Array5, ArrayD, Axis, Slice};
use ndarray_npy::NpzReader;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn fixtures() -> PathBuf {
    manifest_dir().join("tests/fixtures")
}

struct Reference {
    npz: NpzReader<File>,
    json: serde_json::Value,
}

impl Reference {
    fn load() -> Self {
        let npz = NpzReader::new(File::open(fixtures().join("reference.npz")).unwrap()).unwrap();
        let text = std::fs::read_to_string(fixtures().join("reference.json")).unwrap();
        Self {
            npz,
            json: serde_json::from_str(&text).unwrap(),
        }
    }
    fn f2(&mut self, name: &str) -> Array2<f64> {
        self.npz.by_name(name).unwrap()
    }
    fn f1(&mut self, name: &str) -> Array1<f64> {
        self.npz.by_name(name).unwrap()
    }
    fn i1(&mut self, name: &str) -> Array1<i64> {
        self.npz.by_name(name).unwrap()
    }
    fn scalar(&self, name: &str) -> f64 {
        self.json[name]
            .as_f64()
            .unwrap_or_else(|| panic!("reference.json lacks {name}"))
    }
}

fn close(a: f64, b: f64, tol: f64, what: &str) {
    assert!(
        (a - b).abs() <= tol,
        "{what}: {a} vs reference {b} (tol {tol})"
    );
}

#[test]
fn ari_and_nmi_match_sklearn() {
    let mut r = Reference::load();
    let a = r.i1("part_a");
    for (other, key) in [
        ("part_b", "ab"),
        ("part_noisy", "noisy"),
        ("part_relabel", "relabel"),
    ] {
        let b = r.i1(other);
        let ari = adjusted_rand_index(a.view(), b.view()).unwrap();
        let nmi = normalized_mutual_info(a.view(), b.view()).unwrap();
        close(
            ari,
            r.scalar(&format!("ari_{key}")),
            1e-12,
            &format!("ARI {key}"),
        );
        close(
            nmi,
            r.scalar(&format!("nmi_{key}")),
            1e-12,
            &format!("NMI {key}"),
        );
    }
    // identical and relabelled partitions: exactly 1; symmetric in its arguments
    let relabel = r.i1("part_relabel");
    assert_eq!(adjusted_rand_index(a.view(), a.view()).unwrap(), 1.0);
    close(
        adjusted_rand_index(a.view(), relabel.view()).unwrap(),
        1.0,
        1e-12,
        "ARI relabel",
    );
    close(
        normalized_mutual_info(relabel.view(), a.view()).unwrap(),
        1.0,
        1e-12,
        "NMI relabel",
    );
    let noisy = r.i1("part_noisy");
    close(
        adjusted_rand_index(noisy.view(), a.view()).unwrap(),
        r.scalar("ari_noisy"),
        1e-12,
        "ARI symmetric",
    );
    // large independent partitions: near 0, and equal to sklearn
    let (ba, bb) = (r.i1("part_big_a"), r.i1("part_big_b"));
    let ari = adjusted_rand_index(ba.view(), bb.view()).unwrap();
    assert!(ari.abs() < 0.005, "random ARI {ari}");
    close(ari, r.scalar("ari_big"), 1e-12, "ARI big");
    close(
        normalized_mutual_info(ba.view(), bb.view()).unwrap(),
        r.scalar("nmi_big"),
        1e-12,
        "NMI big",
    );
    // labels of a different type (cluster indices) work too
    let as_usize = a.mapv(|v| v as usize);
    assert_eq!(adjusted_rand_index(a.view(), as_usize.view()).unwrap(), 1.0);
}

#[test]
fn silhouette_matches_sklearn_on_blobs() {
    let mut r = Reference::load();
    let labels = r.i1("blob_labels");
    for (x, key) in [
        ("blobs", "silhouette_blobs"),
        ("wide_blobs", "silhouette_wide"),
    ] {
        let x = r.f2(x);
        let got = silhouette_score(x.view(), labels.view()).unwrap();
        close(got, r.scalar(key), 1e-10, key);
    }
    // the well-separated blobs score far higher than the overlapping ones
    assert!(r.scalar("silhouette_blobs") > r.scalar("silhouette_wide") + 0.2);
}

#[test]
fn silhouette_subsample_is_seeded_and_close_to_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let n = 5_301;
    let labels: Array1<i64> = (0..n).map(|i| (i % 3) as i64).collect();
    let x = Array2::from_shape_fn((n, 3), |(i, j)| {
        (if j == (i % 3) { 4.0 } else { 0.0 }) + rng.gen::<f64>()
    });
    let exact = silhouette_score(x.view(), labels.view()).unwrap();
    let (sampled, used) = silhouette_score_sampled(x.view(), labels.view(), 2_000, 11).unwrap();
    let (again, _) = silhouette_score_sampled(x.view(), labels.view(), 2_000, 11).unwrap();
    assert_eq!(used, 2_000);
    assert_eq!(sampled, again);
    assert!((sampled - exact).abs() < 0.02, "{sampled} vs {exact}");
    // below the limit it is the exact score
    let (all, used) = silhouette_score_sampled(x.view(), labels.view(), 10_000, 11).unwrap();
    assert_eq!((all, used), (exact, n));
}

#[test]
fn pca_matches_sklearn_and_known_covariance() {
    let mut r = Reference::load();
    let x = r.f2("pca_x");
    let pca = Pca::params(2).fit(x.view()).unwrap();
    let ratio = r.f1("pca_ratio");
    let var = r.f1("pca_var");
    assert_eq!(
        pca.explained_variance_ratio().len(),
        7,
        "ratios over ALL components"
    );
    for c in 0..7 {
        close(pca.explained_variance_ratio()[c], ratio[c], 1e-10, "ratio");
        close(
            pca.explained_variance()[c],
            var[c],
            1e-9 * var[c].max(1.0),
            "variance",
        );
    }
    close(
        pca.explained_variance_ratio().sum(),
        1.0,
        1e-12,
        "ratios sum",
    );
    // the population variances the data were drawn with (sampling error about sqrt(2/503) = 6%)
    let truth = r.f1("pca_true_var");
    for c in 0..7 {
        let rel = (pca.explained_variance()[c] - truth[c]).abs() / truth[c];
        assert!(
            rel < 0.2,
            "component {c}: {} vs true {}",
            pca.explained_variance()[c],
            truth[c]
        );
    }
    let comps = r.f2("pca_components");
    for c in 0..7 {
        for j in 0..7 {
            close(
                pca.all_components()[[c, j]],
                comps[[c, j]],
                1e-7,
                "component (same sign rule)",
            );
        }
    }
    let proj = pca.transform(x.view()).unwrap();
    let want = r.f2("pca_proj");
    assert_eq!(proj.dim(), (503, 2));
    for (a, b) in proj.iter().zip(want.iter()) {
        close(*a, *b, 1e-8, "projection");
    }
}

#[test]
fn pca_rank_deficient_with_constant_column() {
    let mut r = Reference::load();
    let x = r.f2("pca_def_x");
    let pca = Pca::params(2).fit(x.view()).unwrap();
    let ratio = r.f1("pca_def_ratio");
    for c in 0..9 {
        close(
            pca.explained_variance_ratio()[c],
            ratio[c],
            1e-10,
            "rank-deficient ratio",
        );
    }
    // rank 3: everything after the third component is (numerically) zero, never negative
    assert!(pca.explained_variance().iter().all(|&v| v >= 0.0));
    assert!(
        pca.explained_variance_ratio()
            .slice_axis(Axis(0), Slice::from(3..))
            .sum()
            < 1e-12
    );
    let proj = pca.transform(x.view()).unwrap();
    let want = r.f2("pca_def_proj");
    for (a, b) in proj.iter().zip(want.iter()) {
        close(*a, *b, 1e-7, "rank-deficient projection");
    }
}

#[test]
fn logistic_decoding_matches_sklearn() {
    let mut r = Reference::load();
    let (xtr, ytr) = (r.f2("lr_x_train"), r.i1("lr_y_train"));
    let (xte, yte) = (r.f2("lr_x_test"), r.i1("lr_y_test"));
    let params = DecodeParams {
        seed: 5,
        ..DecodeParams::default()
    };
    let res = decode(xtr.view(), ytr.view(), xte.view(), yte.view(), &params).unwrap();
    let sk_acc = r.scalar("lr_accuracy");
    eprintln!(
        "decoding: accuracy {} (sklearn {sk_acc}), balanced {} (sklearn {}), shuffled {:?}",
        res.accuracy,
        res.balanced_accuracy,
        r.scalar("lr_balanced_accuracy"),
        res.shuffled_control
    );
    assert!(
        (res.accuracy - sk_acc).abs() <= 0.01,
        "accuracy {} vs sklearn {sk_acc}",
        res.accuracy
    );
    let sk_bal = r.scalar("lr_balanced_accuracy");
    assert!(
        (res.balanced_accuracy - sk_bal).abs() <= 0.01,
        "balanced {} vs {sk_bal}",
        res.balanced_accuracy
    );
    close(
        res.train_accuracy,
        r.scalar("lr_train_accuracy"),
        0.01,
        "train accuracy",
    );
    // labels: union of train (0..4) and test (adds 9), confusion over the union
    assert_eq!(res.classes, r.i1("lr_labels").to_vec());
    assert_eq!(res.confusion.dim(), (6, 6));
    let sk_conf = r
        .npz
        .by_name::<ndarray::OwnedRepr<i64>, ndarray::Ix2>("lr_confusion")
        .unwrap();
    assert_eq!(
        res.confusion.sum_axis(Axis(1)),
        sk_conf.sum_axis(Axis(1)).mapv(|v| v as u64)
    );
    assert_eq!(res.confusion.row(5).sum(), 11, "label 9 (test only) row");
    assert_eq!(
        res.confusion.column(5).sum(),
        0,
        "label 9 can never be predicted"
    );
    let diag: u64 = (0..6).map(|i| res.confusion[[i, i]]).sum();
    close(
        diag as f64 / 397.0,
        res.accuracy,
        1e-12,
        "accuracy = trace / N",
    );
    // majority baseline: the train majority label evaluated on the test labels
    let mut counts = [0usize; 5];
    ytr.iter().for_each(|&y| counts[y as usize] += 1);
    let maj = (0..5)
        .max_by_key(|&c| (counts[c], std::cmp::Reverse(c)))
        .unwrap() as i64;
    assert_eq!(res.majority_class, maj);
    let base = yte.iter().filter(|&&y| y == maj).count() as f64 / 397.0;
    close(res.majority_baseline, base, 1e-12, "majority baseline");
    // shuffled-label control: near chance, far below the real probe, reproducible
    let shuffled = res.shuffled_control.unwrap();
    assert!(
        shuffled < 0.35 && shuffled < res.accuracy - 0.2,
        "shuffled control {shuffled}"
    );
    let again = decode(xtr.view(), ytr.view(), xte.view(), yte.view(), &params).unwrap();
    assert_eq!(again.shuffled_control, res.shuffled_control);
    // predictions agree with sklearn's on nearly every test point
    let probe = LogisticProbe::fit(xtr.view(), ytr.view(), &LogisticParams::default()).unwrap();
    let pred = probe.predict(xte.view()).unwrap();
    let sk_pred = r.i1("lr_pred");
    let agree = pred
        .iter()
        .zip(sk_pred.iter())
        .filter(|(a, b)| a == b)
        .count();
    eprintln!("{agree}/397 predictions agree with sklearn");
    assert!(
        agree as f64 >= 0.98 * 397.0,
        "only {agree}/397 predictions agree with sklearn"
    );
}

#[test]
fn logistic_converged_weights_match_sklearn() {
    // at convergence both minimise the same strictly convex objective (alpha = 1 / C on the summed
    // loss), so the weights agree; a wrong alpha scaling (e.g. per mean loss) fails this
    let mut r = Reference::load();
    let (xtr, ytr) = (r.f2("lr_x_train"), r.i1("lr_y_train"));
    let tight = LogisticParams {
        c: 1.0,
        max_iterations: 5_000,
        tol: 1e-9,
    };
    let probe = LogisticProbe::fit(xtr.view(), ytr.view(), &tight).unwrap();
    let coef = r.f2("lr_coef"); // [classes, features]
    let intercept = r.f1("lr_intercept"); // centred
    assert_eq!(probe.coef().dim(), (13, 5));
    let mut max_err: f64 = 0.0;
    for c in 0..5 {
        for f in 0..13 {
            max_err = max_err.max((probe.coef()[[f, c]] - coef[[c, f]]).abs());
        }
    }
    eprintln!("converged weights: max |coef - sklearn| = {max_err}");
    assert!(max_err < 1e-4, "max |coef - sklearn| = {max_err}");
    let mean_b = probe.intercept().mean().unwrap();
    for c in 0..5 {
        close(
            probe.intercept()[c] - mean_b,
            intercept[c],
            1e-4,
            "centred intercept",
        );
    }
    // probabilities are a proper distribution
    let p = probe
        .predict_proba(xtr.slice_axis(Axis(0), Slice::from(..7)))
        .unwrap();
    for row in p.rows() {
        close(row.sum(), 1.0, 1e-12, "probabilities sum");
    }
}

#[test]
fn degenerate_inputs_error_or_work_never_panic() {
    // constant columns and a duplicated (rank-deficient) column: decoding still works
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let n = 131;
    let y: Array1<i64> = (0..n).map(|i| (i % 3) as i64).collect();
    let x = Array2::from_shape_fn((n, 5), |(i, j)| match j {
        0 => y[i] as f64 + 0.3 * rng.gen::<f64>(),
        1 => 7.25,
        2 => 0.0,
        _ => rng.gen::<f64>(),
    });
    let mut x = x;
    let col0 = x.column(0).to_owned();
    x.column_mut(4).assign(&col0);
    let res = decode(
        x.view(),
        y.view(),
        x.view(),
        y.view(),
        &DecodeParams::default(),
    )
    .unwrap();
    assert!(
        res.accuracy > 0.95,
        "separable through column 0: {}",
        res.accuracy
    );
    let pca = Pca::params(2).fit(x.view()).unwrap();
    assert!(pca
        .explained_variance_ratio()
        .iter()
        .all(|v| v.is_finite() && *v >= 0.0));

    // one class: a clear error, no panic
    let one = Array1::<i64>::from_elem(n, 4);
    let err = decode(
        x.view(),
        one.view(),
        x.view(),
        y.view(),
        &DecodeParams::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err, AnalysisError::InvalidInput(ref m) if m.contains("two classes")),
        "{err}"
    );
    assert!(cluster_against_labels(x.view(), one.view(), &KMeansParams::new(2)).is_err());
    assert!(silhouette_score(x.view(), one.view()).is_err());
    // NaN anywhere: NonFinite
    let mut bad = x.clone();
    bad[[17, 3]] = f64::NAN;
    assert!(matches!(
        decode(
            bad.view(),
            y.view(),
            x.view(),
            y.view(),
            &DecodeParams::default()
        ),
        Err(AnalysisError::NonFinite(_))
    ));
    assert!(matches!(
        decode(
            x.view(),
            y.view(),
            bad.view(),
            y.view(),
            &DecodeParams::default()
        ),
        Err(AnalysisError::NonFinite(_))
    ));
    assert!(matches!(
        Pca::params(2).fit(bad.view()),
        Err(AnalysisError::NonFinite(_))
    ));
    assert!(matches!(
        kmeans(bad.view(), &KMeansParams::new(3)),
        Err(AnalysisError::NonFinite(_))
    ));
    assert!(matches!(
        silhouette_score(bad.view(), y.view()),
        Err(AnalysisError::NonFinite(_))
    ));
    assert!(matches!(
        mean_code_similarity(bad.view(), y.view(), None),
        Err(AnalysisError::NonFinite(_))
    ));
    // empty sets and mismatched lengths
    let empty = Array2::<f64>::zeros((0, 5));
    let none = Array1::<i64>::zeros(0);
    assert!(kmeans(empty.view(), &KMeansParams::new(2)).is_err());
    assert!(Pca::params(1).fit(empty.view()).is_err());
    assert!(mean_code_similarity(empty.view(), none.view(), None).is_err());
    assert!(silhouette_score(x.view(), y.slice_axis(Axis(0), Slice::from(..10))).is_err());
    assert!(cluster_against_labels(
        x.view(),
        y.slice_axis(Axis(0), Slice::from(..10)),
        &KMeansParams::new(3)
    )
    .is_err());
    // more clusters than points
    assert!(kmeans(
        x.slice_axis(Axis(0), Slice::from(..2)),
        &KMeansParams::new(3)
    )
    .is_err());
    // every point identical: k-means and the scores still return (silhouette 0, not NaN)
    let same = Array2::<f64>::from_elem((12, 3), 0.5);
    let labels: Array1<i64> = (0..12).map(|i| (i % 2) as i64).collect();
    let rep = cluster_against_labels(same.view(), labels.view(), &KMeansParams::new(2)).unwrap();
    assert_eq!(rep.silhouette, 0.0);
    assert!(rep.ari.is_finite() && rep.nmi.is_finite());
}

#[test]
fn kmeans_restarts_and_silhouette_do_not_depend_on_the_number_of_threads() {
    // overlapping blobs, so that restarts end in different local minima
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let x = Array2::from_shape_fn((601, 4), |(i, _)| (i % 6) as f64 + rng.gen_range(-2.0..2.0));
    let labels: Array1<i64> = (0..601).map(|i| (i % 6) as i64).collect();
    let params = KMeansParams {
        n_runs: 7,
        silhouette_max_points: 400,
        ..KMeansParams::new(6)
    };
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| {
                (
                    kmeans(x.view(), &params).unwrap(),
                    cluster_against_labels(x.view(), labels.view(), &params).unwrap(),
                )
            })
    };
    let (one, one_report) = run(1);
    let (three, three_report) = run(3);
    assert_eq!(one, three);
    assert_eq!(one_report, three_report);
    // run r draws from stream r, so 20 restarts include these 7 and keep one at least as good
    let more = kmeans(
        x.view(),
        &KMeansParams {
            n_runs: 20,
            ..params
        },
    )
    .unwrap();
    assert!(
        more.inertia <= one.inertia,
        "20 restarts keep the best of the first 7"
    );
    // inertia is the mean squared distance to the assigned centre, which is the closest one
    let mut total = 0.0;
    for (row, &a) in x.rows().into_iter().zip(one.assignments.iter()) {
        let dist = |c: usize| {
            row.iter()
                .zip(one.centroids.row(c))
                .map(|(p, q)| (p - q) * (p - q))
                .sum::<f64>()
        };
        assert!((0..6).all(|c| dist(a) <= dist(c)));
        total += dist(a);
    }
    close(one.inertia, total / 601.0, 1e-9, "inertia");
    // both silhouettes equal the single-labeling score on the same subsample
    let (alone, used) =
        silhouette_score_sampled(x.view(), labels.view(), 400, params.seed).unwrap();
    assert_eq!(used, one_report.silhouette_points);
    close(
        one_report.silhouette,
        alone,
        1e-12,
        "silhouette of the labels",
    );
    let assigned = one.assignments.mapv(|a| a as i64);
    let (alone, _) = silhouette_score_sampled(x.view(), assigned.view(), 400, params.seed).unwrap();
    close(
        one_report.silhouette_kmeans,
        alone,
        1e-12,
        "silhouette of the clusters",
    );
}

/// Synthetic code sets [N, L=3, H=5, Q=1, K=2]: labels 0..6 in train, 1..7 in test (7 is OOD-only,
/// 0 train-only); layer 0 is noise, layer 1 weakly and layer 2 strongly structured by label.
fn synthetic(n: usize, seed: u64, lo: i64, hi: i64) -> CodeSet {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut proto_rng = ChaCha8Rng::seed_from_u64(1234);
    let protos = Array2::from_shape_fn((8, 10), |_| proto_rng.gen::<f32>() * 2.0);
    let label: Array1<i64> = (0..n).map(|_| rng.gen_range(lo..=hi)).collect();
    let target: Array1<i64> = (0..n).map(|_| rng.gen_range(0..8)).collect();
    let codes = Array5::from_shape_fn((n, 3, 5, 1, 2), |(i, l, h, _, k)| {
        let p = protos[[label[i] as usize, h * 2 + k]];
        let noise = rng.gen::<f32>() - 0.5;
        match l {
            0 => noise,
            1 => 0.3 * p + noise,
            _ => p + 0.3 * noise,
        }
    });
    let correct: Array1<bool> = (0..n).map(|i| i % 4 != 0).collect();
    CodeSet::new(codes, label)
        .unwrap()
        .with_target(target)
        .unwrap()
        .with_correct(correct)
        .unwrap()
}

#[test]
fn analyze_pair_end_to_end_and_tables() {
    let dir = tempfile::tempdir().unwrap();
    // through the .npz reader, as the CLI does
    synthetic(301, 1, 0, 6)
        .write_npz(dir.path().join("id.npz"))
        .unwrap();
    synthetic(197, 2, 1, 7)
        .write_npz(dir.path().join("ood.npz"))
        .unwrap();
    let train = CodeSet::read_npz(dir.path().join("id.npz")).unwrap();
    let test = CodeSet::read_npz(dir.path().join("ood.npz")).unwrap();
    let params = LatentAnalysisParams {
        seed: 3,
        ..LatentAnalysisParams::default()
    };
    let mut steps = Vec::new();
    let report = analyze_pair(&train, &test, &params, &mut |p| {
        steps.push(*p);
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();

    // progress: every stage of every selection announced once (in any order across
    // selections, which may run concurrently), `done` never decreases, then a final call
    assert_eq!(steps.len(), 17);
    let sels = [
        LayerSel::Layer(0),
        LayerSel::Layer(1),
        LayerSel::Layer(2),
        LayerSel::All,
    ];
    for sel in sels {
        for stage in [
            Stage::Pca,
            Stage::Decoding,
            Stage::Clustering,
            Stage::Similarity,
        ] {
            assert_eq!(
                steps
                    .iter()
                    .filter(|p| p.next == Some((stage, sel)))
                    .count(),
                1
            );
        }
    }
    assert!(steps
        .windows(2)
        .all(|w| w[0].done <= w[1].done && w[0].total == 16));
    assert_eq!((steps[16].next, steps[16].done), (None, 16));

    // a progress callback that breaks at its third call stops the analysis: no further step
    // starts, and the error says it was interrupted
    let mut calls = 0;
    let err = analyze_pair(&train, &test, &params, &mut |_| {
        calls += 1;
        if calls >= 3 {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    })
    .unwrap_err();
    assert!(matches!(err, AnalysisError::Interrupted), "{err}");
    assert_eq!(calls, 3, "no step is announced after the break");

    assert_eq!(report.labels, (0..8).collect::<Vec<i64>>());
    let sels: Vec<LayerSel> = report.layers.iter().map(|l| l.layer).collect();
    assert_eq!(
        sels,
        vec![
            LayerSel::Layer(0),
            LayerSel::Layer(1),
            LayerSel::Layer(2),
            LayerSel::All
        ]
    );
    let acc: Vec<f64> = report.layers.iter().map(|l| l.decoding.accuracy).collect();
    // label 7 (about 1/7 of the test set) can never be decoded, so the ceiling is about 0.86
    assert!(acc[0] < 0.35, "noise layer decodes at {}", acc[0]);
    assert!(
        acc[2] > 0.75 && acc[2] > acc[1] && acc[1] > acc[0],
        "accuracy by depth {acc:?}"
    );
    for l in &report.layers {
        assert_eq!(l.decoding.classes, report.labels);
        assert_eq!(
            l.decoding.confusion.row(7).sum() as usize,
            test.label().iter().filter(|&&v| v == 7).count()
        );
        assert_eq!(l.decoding.confusion.column(7).sum(), 0);
        assert_eq!(l.projection.dim(), (197, 2));
        // similarity on the test set: label 0 is absent there -> NaN row; others finite
        assert_eq!(l.similarity.counts[0], 0);
        assert!(l.similarity.cosine[[0, 3]].is_nan());
        assert!(l.similarity.cosine[[2, 3]].is_finite());
        let c = l.clusters.unwrap();
        assert_eq!(c.k, 7);
    }
    assert!(report.layers[2].clusters.unwrap().ari > report.layers[0].clusters.unwrap().ari + 0.3);
    assert_eq!(report.layers[3].pca.explained_variance_ratio().len(), 30);
    // the `all` row is exactly the decode() of the concatenated features
    let direct = decode(
        train.features(None).unwrap().view(),
        train.label().view(),
        test.features(None).unwrap().view(),
        test.label().view(),
        &DecodeParams {
            seed: 3,
            ..DecodeParams::default()
        },
    )
    .unwrap();
    assert_eq!(direct, report.layers[3].decoding);
    close(
        report.test_model_accuracy.unwrap(),
        147.0 / 197.0,
        1e-12,
        "model accuracy",
    );

    let out = dir.path().join("tables");
    let written = report.write_tables(&out).unwrap();
    assert_eq!(written.len(), 7);
    assert!(std::fs::read_dir(&out).unwrap().all(|e| !e
        .unwrap()
        .path()
        .to_string_lossy()
        .ends_with(".tmp")));
    let decoding = std::fs::read_to_string(out.join("decoding.csv")).unwrap();
    let lines: Vec<&str> = decoding.lines().collect();
    assert_eq!(lines.len(), 5);
    assert!(lines[0].starts_with(
        "layer,all_layers,accuracy,balanced_accuracy,majority_baseline,shuffled_control"
    ));
    // `layer` stays an integer column; the all-layers row is marked by `all_layers`.
    assert!(lines[1].starts_with("0,false,"), "{}", lines[1]);
    assert!(lines[4].starts_with("-1,true,"), "{}", lines[4]);
    let acc_all: f64 = lines[4].split(',').nth(2).unwrap().parse().unwrap();
    assert_eq!(acc_all, report.layers[3].decoding.accuracy);
    let pca_csv = std::fs::read_to_string(out.join("pca.csv")).unwrap();
    assert_eq!(pca_csv.lines().count(), 1 + 3 * 10 + 30);
    let confusion = std::fs::read_to_string(out.join("confusion.csv")).unwrap();
    assert_eq!(confusion.lines().count(), 1 + 4 * 64);
    let similarity = std::fs::read_to_string(out.join("similarity.csv")).unwrap();
    assert_eq!(similarity.lines().count(), 1 + 4 * 64);
    assert!(similarity.contains("\n0,false,0,3,NaN\n"));
    let clusters = std::fs::read_to_string(out.join("clusters.csv")).unwrap();
    assert_eq!(clusters.lines().count(), 5);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["code_dims"]["heads"], 5);
    assert_eq!(summary["params"]["unsupervised_on"], "test");
    assert_eq!(summary["layers"].as_array().unwrap().len(), 4);
    assert_eq!(summary["layers"][3]["layer"], -1);
    assert_eq!(summary["layers"][3]["all_layers"], true);
    assert_eq!(summary["layers"][2]["layer"], 2);
    assert!(
        summary.get("elapsed_s").is_none(),
        "timings stay out of the tables"
    );
    assert_eq!(report.timings().layers.len(), 4);
    let mut npz = NpzReader::new(File::open(out.join("pca.npz")).unwrap()).unwrap();
    let p2: Array2<f64> = npz.by_name("layer2").unwrap();
    assert_eq!(p2, report.layers[2].projection);
    let all: Array2<f64> = npz.by_name("all").unwrap();
    assert_eq!(all.dim(), (197, 2));
    let lab: Array1<i64> = npz.by_name("label").unwrap();
    assert_eq!(&lab, test.label());
    let tgt: ArrayD<i64> = npz.by_name("target").unwrap();
    assert_eq!(tgt.len(), 197);

    // unsupervised analyses on the train set instead
    let on_train = LatentAnalysisParams {
        unsupervised_on: CodeSplit::Train,
        shuffled_control: false,
        ..params
    };
    let rep2 = analyze_pair(&train, &test, &on_train, &mut |_| {
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(rep2.layers[0].projection.nrows(), 301);
    assert_eq!(rep2.layers[0].similarity.counts[7], 0);
    assert_eq!(rep2.layers[0].decoding.shuffled_control, None);

    // incompatible code axes: a shape error naming both sets
    let other = CodeSet::new(Array5::zeros((5, 2, 5, 1, 2)), Array1::zeros(5)).unwrap();
    let err = analyze_pair(&train, &other, &params, &mut |_| {
        std::ops::ControlFlow::Continue(())
    })
    .unwrap_err();
    assert!(matches!(err, AnalysisError::Shape(_)), "{err}");
}

/// The package directory, read at run time: cargo sets `CARGO_MANIFEST_DIR` for the test binaries it
/// runs, so a test binary reused from a target directory that was built in a clone at another path
/// still finds its fixtures (the compile-time `env!` value would point into that other clone).
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || env!("CARGO_MANIFEST_DIR").into(),
        std::path::PathBuf::from,
    )
}

/// Term decoding of fuzzy-logic codes (`terms.rs`) against scikit-learn on the arrays of
/// `tests/fixtures/make_terms_reference.py`: ridge R² (`Ridge(alpha=1.0)` on halves,
/// `r2_score`), per-term logistic F1 (`StandardScaler` + `LogisticRegression(C=1.0)`,
/// `f1_score`) and the base-rate control, per layer and on all layers. Tolerances: the ridge
/// solution is exact up to the conditioning of the 8 x 8 normal equations, so R² agrees to 1e-9;
/// the logistic fits stop at a gradient tolerance (lbfgs, tol 1e-4, as scikit-learn's), so a
/// prediction near 0.5 may flip: the mean F1 over 12 terms may move by one flipped problem in a
/// term, at most about 0.01 here. The shuffled-label control must sit far below the real probe.
#[test]
fn term_decoding_matches_scikit_learn() {
    use hyperlens_analysis::terms::{term_decoding, TermCodes, TermDecodingParams};
    use ndarray::{Array3, Array5};
    let mut npz =
        NpzReader::new(File::open(fixtures().join("terms_reference.npz")).unwrap()).unwrap();
    let text = std::fs::read_to_string(fixtures().join("terms_reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut set = |p: &str| {
        let codes: Array5<f32> = npz.by_name(&format!("{p}_codes")).unwrap();
        let terms: Array3<i64> = npz.by_name(&format!("{p}_terms")).unwrap();
        let ids: Array2<i64> = npz.by_name(&format!("{p}_term_ids")).unwrap();
        TermCodes::new(codes, terms, ids).unwrap()
    };
    let (train, test) = (set("train"), set("test"));
    let rows = term_decoding(&train, &test, &TermDecodingParams::default()).unwrap();
    let want = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), want.len());
    for (r, w) in rows.iter().zip(want) {
        let what = format!("layer {:?}", r.layer);
        assert_eq!(
            r.layer.map_or("all".to_string(), |l| l.to_string()),
            w["layer"].to_string().trim_matches('"')
        );
        close(
            r.ridge_r2,
            w["ridge_r2"].as_f64().unwrap(),
            1e-9,
            &format!("{what} ridge R²"),
        );
        close(
            r.f1_mean,
            w["f1_mean"].as_f64().unwrap(),
            0.01,
            &format!("{what} F1"),
        );
        close(
            r.f1_base_rate,
            w["f1_base_rate"].as_f64().unwrap(),
            1e-12,
            &format!("{what} base rate"),
        );
        assert_eq!(r.n_terms as u64, w["n_terms"].as_u64().unwrap());
    }
    // Layer 1 carries the terms: its probes beat the shuffled-label control by far.
    assert!(rows[1].f1_mean > rows[1].f1_shuffled + 0.3, "{:?}", rows[1]);
    // Bad input: sets of different shapes, bits that are not bits.
    let other = TermCodes::new(
        Array5::zeros((4, 1, 8, 1, 1)),
        Array3::zeros((4, 2, 4)),
        Array2::zeros((4, 2)),
    )
    .unwrap();
    assert!(term_decoding(&train, &other, &TermDecodingParams::default()).is_err());
    assert!(TermCodes::new(
        Array5::zeros((2, 1, 1, 1, 1)),
        Array3::from_elem((2, 1, 1), 2),
        Array2::zeros((2, 1))
    )
    .is_err());
}

/// Trustworthiness (k = 5) equals scikit-learn's on a fixed embedding, and a t-SNE embedding of
/// the fixture's layer-1 codes (linfa-tsne, perplexity 30) is about as trustworthy as
/// scikit-learn's `TSNE` of them (0.996): within 0.03, the spread between seeds of either
/// implementation on 203 points being about 0.01. Degenerate inputs are errors.
#[test]
fn tsne_trustworthiness_matches_scikit_learn() {
    use hyperlens_analysis::embed::{trustworthiness, tsne, TsneParams};
    use ndarray::Array5;
    let mut npz =
        NpzReader::new(File::open(fixtures().join("terms_reference.npz")).unwrap()).unwrap();
    let text = std::fs::read_to_string(fixtures().join("terms_reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let codes: Array5<f32> = npz.by_name("test_codes").unwrap();
    let n = codes.dim().0;
    let x = Array2::from_shape_vec(
        (n, codes.dim().2),
        codes
            .index_axis(Axis(1), 1)
            .iter()
            .map(|&v| v as f64)
            .collect(),
    )
    .unwrap();
    let emb: Array2<f64> = npz.by_name("emb_check").unwrap();
    let t = trustworthiness(x.view(), emb.view(), 5).unwrap();
    close(
        t,
        json["trust_check"].as_f64().unwrap(),
        1e-12,
        "trustworthiness",
    );
    let e = tsne(x.view(), &TsneParams::default()).unwrap();
    assert_eq!(e.dim(), (n, 2));
    let t = trustworthiness(x.view(), e.view(), 5).unwrap();
    let want = json["tsne_trust_sklearn"].as_f64().unwrap();
    assert!(
        t >= want - 0.03,
        "t-SNE trustworthiness {t} vs scikit-learn's {want}"
    );
    // A second run (bhtsne's neighbour tree is not seeded, so the coordinates differ) is as good.
    let again = tsne(x.view(), &TsneParams::default()).unwrap();
    let t2 = trustworthiness(x.view(), again.view(), 5).unwrap();
    assert!(t2 >= want - 0.03, "second t-SNE: trustworthiness {t2}");
    // exact t-SNE (theta 0, hyperlens's own): as trustworthy, and the same embedding on any
    // number of threads
    let exact = TsneParams {
        theta: 0.0,
        ..TsneParams::default()
    };
    let on = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| tsne(x.view(), &exact).unwrap())
    };
    let (one, two) = (on(1), on(2));
    assert_eq!(one, two);
    let t = trustworthiness(x.view(), one.view(), 5).unwrap();
    assert!(
        t >= want - 0.03,
        "exact t-SNE trustworthiness {t} vs scikit-learn's {want}"
    );
    let few = x.slice(ndarray::s![..50, ..]).to_owned();
    assert!(tsne(few.view(), &TsneParams::default()).is_err());
    assert!(tsne(few.view(), &exact).is_err());
    assert!(trustworthiness(x.view(), emb.view(), 150).is_err());
    assert!(tsne(x.slice(ndarray::s![.., ..1]), &TsneParams::default()).is_err());
}
