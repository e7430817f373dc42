//! Integration tests of `hyperlens_analysis::circuits`: the algebra against dense float64 loops on
//! random factors of unusual sizes, and the scores against TransformerLens 3.9.0 on a tiny seeded
//! model (fixture `tests/fixtures/circuits/tl_tiny.npz`, made by `make_tl_fixture.py` there).

use std::fs::File;

use hyperlens_analysis::circuits::{
    bigram_top_k, composition_baseline, composition_scores, detection_pattern, head_scores,
    head_scores_batch, head_scores_prompts, repeated_token_scores, skip_trigrams, AttnWeights,
    CompositionKind, CompositionMethod, CompositionParams, DetectOptions, Eigenvalues,
    ErrorMeasure, FactoredMatrix, HeadPattern, SkipTrigramParams,
};
use ndarray::{s, Array, Array1, Array2, Array3, Array4, Axis, Dimension, Ix0, Ix1, Ix2, Ix4};
use ndarray_npy::NpzReader;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------------------------------------
// Plain-loop float64 references.

fn rand_mat(rng: &mut ChaCha8Rng, r: usize, c: usize) -> Array2<f64> {
    Array2::from_shape_simple_fn((r, c), || rng.gen_range(-1.0..1.0))
}

fn rand4(rng: &mut ChaCha8Rng, shape: (usize, usize, usize, usize)) -> Array4<f64> {
    Array4::from_shape_simple_fn(shape, || rng.gen_range(-1.0..1.0))
}

fn mm(a: &Array2<f64>, b: &Array2<f64>) -> Array2<f64> {
    assert_eq!(a.ncols(), b.nrows());
    let mut c = Array2::zeros((a.nrows(), b.ncols()));
    for i in 0..a.nrows() {
        for j in 0..b.ncols() {
            let mut acc = 0.0;
            for k in 0..a.ncols() {
                acc += a[[i, k]] * b[[k, j]];
            }
            c[[i, j]] = acc;
        }
    }
    c
}

fn frob(a: &Array2<f64>) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn trace(a: &Array2<f64>) -> f64 {
    (0..a.nrows()).map(|i| a[[i, i]]).sum()
}

fn max_abs_diff<D: Dimension>(a: &Array<f64, D>, b: &Array<f64, D>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Power sums `sum_i lambda_i^p` (real part; the imaginary part must vanish) for p = 1..=n.
fn power_sums(e: &Eigenvalues, n: usize) -> Vec<(f64, f64)> {
    (1..=n)
        .map(|p| {
            let (mut re, mut im) = (0.0, 0.0);
            for (&a, &b) in e.re.iter().zip(e.im.iter()) {
                // (a + ib)^p by repeated multiplication.
                let (mut x, mut y) = (1.0, 0.0);
                for _ in 0..p {
                    let nx = x * a - y * b;
                    y = x * b + y * a;
                    x = nx;
                }
                re += x;
                im += y;
            }
            (re, im)
        })
        .collect()
}

/// Checks eigenvalues against the traces of powers of the dense matrix (Newton's identities: the
/// first `m` power sums determine `m` eigenvalues; the dense matrix's extra eigenvalues are 0).
fn assert_eigs_match_dense(e: &Eigenvalues, dense: &Array2<f64>, tol: f64) {
    let m = e.len();
    let mut pow = dense.clone();
    for (p, (re, im)) in power_sums(e, m).into_iter().enumerate() {
        let t = trace(&pow);
        let scale = 1.0 + t.abs();
        assert!(
            (re - t).abs() < tol * scale,
            "power {}: {re} vs trace {t}",
            p + 1
        );
        assert!(
            im.abs() < tol * scale,
            "power {}: imaginary part {im}",
            p + 1
        );
        pow = mm(&pow, dense);
    }
}

fn npz() -> NpzReader<File> {
    let path = manifest_dir().join("tests/fixtures/circuits/tl_tiny.npz");
    NpzReader::new(File::open(path).expect("fixture tl_tiny.npz")).expect("npz")
}

fn get<D: Dimension>(z: &mut NpzReader<File>, name: &str) -> Array<f64, D> {
    z.by_name(name)
        .unwrap_or_else(|e| panic!("fixture array {name}: {e}"))
}

fn tl_weights(z: &mut NpzReader<File>) -> AttnWeights<f64> {
    AttnWeights::new(
        get::<Ix4>(z, "W_Q"),
        get::<Ix4>(z, "W_K"),
        get::<Ix4>(z, "W_V"),
        get::<Ix4>(z, "W_O"),
    )
    .unwrap()
    .with_embeddings(
        Some(get::<Ix2>(z, "W_E")),
        Some(get::<Ix2>(z, "W_U")),
        Some(get::<Ix1>(z, "b_U")),
    )
    .unwrap()
}

/// Sorted (re, im) pairs of one head, for comparing eigenvalue multisets across solvers.
fn sorted_pairs(re: &Array3<f64>, im: &Array3<f64>, l: usize, h: usize) -> Vec<(f64, f64)> {
    let mut v: Vec<(f64, f64)> = re
        .slice(s![l, h, ..])
        .iter()
        .zip(im.slice(s![l, h, ..]).iter())
        .map(|(&a, &b)| (a, b))
        .collect();
    v.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.total_cmp(&y.1)));
    v
}

fn assert_same_spectrum(
    got: (&Array3<f64>, &Array3<f64>),
    want: (&Array3<f64>, &Array3<f64>),
    tol: f64,
) {
    let (l, h, _) = got.0.dim();
    for li in 0..l {
        for hi in 0..h {
            let mut want_left = sorted_pairs(want.0, want.1, li, hi);
            for (a, b) in sorted_pairs(got.0, got.1, li, hi) {
                // Greedy nearest match (robust to order differences of near-equal real parts).
                let (idx, dist) = want_left
                    .iter()
                    .enumerate()
                    .map(|(i, &(x, y))| (i, (x - a).hypot(y - b)))
                    .min_by(|p, q| p.1.total_cmp(&q.1))
                    .unwrap();
                assert!(
                    dist < tol,
                    "L{li}H{hi}: eigenvalue {a}+{b}i unmatched (dist {dist})"
                );
                want_left.remove(idx);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// FactoredMatrix algebra against dense float64.

#[test]
fn factored_eigenvalues_match_dense_power_sums() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for &(l, m) in &[(11usize, 4usize), (9, 5), (7, 7)] {
        let a = rand_mat(&mut rng, l, m);
        let b = rand_mat(&mut rng, m, l);
        let f = FactoredMatrix::new(&a, &b).unwrap();
        let e = f.eigenvalues().unwrap();
        assert_eq!(e.len(), m);
        assert_eigs_match_dense(&e, &mm(&a, &b), 1e-9);
        // Sorted by descending modulus.
        let md = e.moduli();
        assert!(md.windows(2).into_iter().all(|w| w[0] >= w[1] - 1e-15));
    }
}

#[test]
fn factored_svd_and_norm_match_dense() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    // (l, m, r): small middle; middle larger than one side; l < m.
    for &(l, m, r) in &[(13usize, 5usize, 9usize), (6, 8, 5), (3, 6, 7), (10, 1, 4)] {
        let a = rand_mat(&mut rng, l, m);
        let b = rand_mat(&mut rng, m, r);
        let dense = mm(&a, &b);
        let f = FactoredMatrix::new(&a, &b).unwrap();
        let svd = f.svd().unwrap();
        let k = l.min(m).min(r);
        assert_eq!((svd.u.dim(), svd.s.len(), svd.v.dim()), ((l, k), k, (r, k)));
        assert!(svd.s.windows(2).into_iter().all(|w| w[0] >= w[1]));
        assert!(svd.s.iter().all(|&x| x >= 0.0));
        let utu = mm(&svd.u.t().to_owned(), &svd.u);
        let vtv = mm(&svd.v.t().to_owned(), &svd.v);
        assert!(max_abs_diff(&utu, &Array2::eye(k)) < 1e-10);
        assert!(max_abs_diff(&vtv, &Array2::eye(k)) < 1e-10);
        let us = Array2::from_shape_fn((l, k), |(i, j)| svd.u[[i, j]] * svd.s[j]);
        let rec = mm(&us, &svd.v.t().to_owned());
        assert!(
            max_abs_diff(&rec, &dense) < 1e-10,
            "({l},{m},{r}) reconstruction"
        );
        let fro = frob(&dense);
        assert!((f.frobenius_norm() - fro).abs() < 1e-10 * fro);
        let s2: f64 = svd.s.iter().map(|x| x * x).sum();
        assert!((s2.sqrt() - fro).abs() < 1e-10 * fro);
        // collapse_l keeps left-product norms: ||X A B|| = ||X' S V^T|| for X' = X U.
        let cl = f.collapse_l().unwrap();
        assert_eq!(cl.dim(), (k, r));
        assert!((frob(&cl) - fro).abs() < 1e-10 * fro);
        // Row blocks of the dense product.
        assert!(
            max_abs_diff(
                &f.rows(1..l).unwrap(),
                &dense.slice(s![1..l, ..]).to_owned()
            ) < 1e-12
        );
    }
}

#[test]
fn factored_products_and_transpose_match_dense() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let a = rand_mat(&mut rng, 9, 3);
    let b = rand_mat(&mut rng, 3, 7);
    let c = rand_mat(&mut rng, 7, 11);
    let d = rand_mat(&mut rng, 5, 9);
    let f = FactoredMatrix::new(&a, &b).unwrap();
    let ab = mm(&a, &b);
    assert!(max_abs_diff(&f.transpose().to_dense(), &ab.t().to_owned()) < 1e-12);
    let fc = f.matmul(&c).unwrap();
    assert_eq!((fc.shape(), fc.mdim()), ((9, 11), 3));
    assert!(max_abs_diff(&fc.to_dense(), &mm(&ab, &c)) < 1e-12);
    let df = f.rmatmul(&d).unwrap();
    assert_eq!((df.shape(), df.mdim()), ((5, 7), 3));
    assert!(max_abs_diff(&df.to_dense(), &mm(&d, &ab)) < 1e-12);
    let g = FactoredMatrix::new(&rand_mat(&mut rng, 7, 2), &rand_mat(&mut rng, 2, 4)).unwrap();
    let fg = f.matmul_factored(&g).unwrap();
    assert!(max_abs_diff(&fg.to_dense(), &mm(&ab, &g.to_dense())) < 1e-12);
    assert!(f.matmul(&d).is_err());
}

// ---------------------------------------------------------------------------------------------
// Per-head circuits, copying and composition scores against dense float64.

fn random_weights(
    rng: &mut ChaCha8Rng,
    l: usize,
    h: usize,
    d: usize,
    dqk: usize,
    dv: usize,
) -> AttnWeights<f64> {
    AttnWeights::new(
        rand4(rng, (l, h, d, dqk)),
        rand4(rng, (l, h, d, dqk)),
        rand4(rng, (l, h, d, dv)),
        rand4(rng, (l, h, dv, d)),
    )
    .unwrap()
}

fn head(w: &Array4<f64>, l: usize, h: usize) -> Array2<f64> {
    w.slice(s![l, h, .., ..]).to_owned()
}

/// Dense reference of the composition score of (l1, h1) into (l2, h2).
fn dense_composition(
    w: &AttnWeights<f64>,
    kind: CompositionKind,
    a: (usize, usize),
    b: (usize, usize),
) -> f64 {
    let ov1 = mm(&head(&w.w_v, a.0, a.1), &head(&w.w_o, a.0, a.1));
    let qk2 = mm(
        &head(&w.w_q, b.0, b.1),
        &head(&w.w_k, b.0, b.1).t().to_owned(),
    );
    let m = match kind {
        CompositionKind::Q => qk2,
        CompositionKind::K => qk2.t().to_owned(),
        CompositionKind::V => mm(&head(&w.w_v, b.0, b.1), &head(&w.w_o, b.0, b.1)),
    };
    frob(&mm(&ov1, &m)) / (frob(&ov1) * frob(&m))
}

#[test]
fn composition_scores_match_dense_for_every_method() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    // L 3, H 2, D 11, d_qk 3, d_v 4: distinct sizes so a swapped axis fails.
    let w = random_weights(&mut rng, 3, 2, 11, 3, 4);
    let settings = [
        (CompositionMethod::Gram, 1usize, 1usize), // one D-row per chunk
        (CompositionMethod::Gram, 3, 11 * 6 * 8 * 4), // 4 rows per chunk, 3 threads
        (CompositionMethod::Gram, 2, 1 << 30),     // one chunk
        (CompositionMethod::Direct, 1, 0),
        (CompositionMethod::Direct, 4, 0),
        (CompositionMethod::Auto, 0, 16 << 20),
    ];
    for (method, threads, chunk) in settings {
        let params = CompositionParams {
            kinds: CompositionKind::ALL.to_vec(),
            method,
            threads,
            chunk_bytes: chunk.max(1),
        };
        let sc = composition_scores(&w, &params).unwrap();
        for kind in CompositionKind::ALL {
            let got = sc.get(kind).unwrap();
            assert_eq!(got.dim(), (3, 2, 3, 2));
            for ((l1, h1, l2, h2), &x) in got.indexed_iter() {
                if l1 >= l2 {
                    assert_eq!(x, 0.0, "{kind} {method:?}: masked entry");
                } else {
                    let want = dense_composition(&w, kind, (l1, h1), (l2, h2));
                    assert!(
                        (x - want).abs() < 1e-10,
                        "{kind} {method:?} t{threads}: L{l1}H{h1}->L{l2}H{h2} {x} vs {want}"
                    );
                }
            }
        }
    }
    // Q and K differ on random weights (a swapped M would make them equal).
    let sc = composition_scores(&w, &CompositionParams::default()).unwrap();
    assert!(max_abs_diff(sc.q.as_ref().unwrap(), sc.k.as_ref().unwrap()) > 1e-3);
    // Only the requested kinds are computed.
    let only_v = CompositionParams {
        kinds: vec![CompositionKind::V],
        ..Default::default()
    };
    let sc = composition_scores(&w, &only_v).unwrap();
    assert!(sc.q.is_none() && sc.k.is_none() && sc.v.is_some());
}

#[test]
fn composition_accepts_f32_weights() {
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let w64 = random_weights(&mut rng, 2, 3, 7, 2, 2)
        .w_q
        .mapv(|x| x as f32);
    let w32 = AttnWeights::new(
        w64.clone(),
        w64.mapv(|x| x * 0.5 + 0.1),
        w64.mapv(|x| -x + 0.2),
        w64.clone()
            .permuted_axes([0, 1, 3, 2])
            .as_standard_layout()
            .to_owned(),
    )
    .unwrap();
    let w_f64 = AttnWeights::new(
        w32.w_q.mapv(f64::from),
        w32.w_k.mapv(f64::from),
        w32.w_v.mapv(f64::from),
        w32.w_o.mapv(f64::from),
    )
    .unwrap();
    let a = composition_scores(&w32, &CompositionParams::default()).unwrap();
    let b = composition_scores(&w_f64, &CompositionParams::default()).unwrap();
    for kind in CompositionKind::ALL {
        assert!(max_abs_diff(a.get(kind).unwrap(), b.get(kind).unwrap()) < 1e-12);
        let x = a.get(kind).unwrap()[[0, 1, 1, 2]];
        let want = dense_composition(&w_f64, kind, (0, 1), (1, 2));
        assert!((x - want).abs() < 1e-10);
    }
}

#[test]
fn ov_eigenvalues_and_copying_scores_match_dense() {
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let (l, h, d, dqk, dv, vocab) = (2, 3, 9, 2, 4, 13);
    let w = random_weights(&mut rng, l, h, d, dqk, dv)
        .with_embeddings(
            Some(rand_mat(&mut rng, vocab, d)),
            Some(rand_mat(&mut rng, d, vocab)),
            None,
        )
        .unwrap();
    let ov = w.ov_eigenvalues().unwrap();
    let full = w.full_ov_eigenvalues().unwrap();
    assert_eq!(ov.re.dim(), (l, h, dv));
    assert!(ov.head(l, 0).is_err());
    let w_e = w.w_e.clone().unwrap();
    let w_u = w.w_u.clone().unwrap();
    for li in 0..l {
        for hi in 0..h {
            let dense_ov = mm(&head(&w.w_v, li, hi), &head(&w.w_o, li, hi)); // [D, D]
            assert_eigs_match_dense(&ov.head(li, hi).unwrap(), &dense_ov, 1e-9);
            let dense_full = mm(&mm(&w_e, &dense_ov), &w_u); // [vocab, vocab]
            assert_eigs_match_dense(&full.head(li, hi).unwrap(), &dense_full, 1e-9);
            // The factored circuits represent the same matrices.
            assert!(max_abs_diff(&w.ov_circuit(li, hi).unwrap().to_dense(), &dense_ov) < 1e-12);
            assert!(
                max_abs_diff(&w.full_ov_circuit(li, hi).unwrap().to_dense(), &dense_full) < 1e-10
            );
            let dense_qk = mm(&head(&w.w_q, li, hi), &head(&w.w_k, li, hi).t().to_owned());
            assert!(max_abs_diff(&w.qk_circuit(li, hi).unwrap().to_dense(), &dense_qk) < 1e-12);
            let dense_full_qk = mm(&mm(&w_e, &dense_qk), &w_e.t().to_owned());
            assert!(
                max_abs_diff(
                    &w.full_qk_circuit(li, hi).unwrap().to_dense(),
                    &dense_full_qk
                ) < 1e-10
            );
        }
    }
    // Copying score = Re(sum lambda) / sum |lambda| of the returned eigenvalues; sum re = trace.
    let cs = w.ov_copying_scores().unwrap();
    for li in 0..l {
        for hi in 0..h {
            let e = ov.head(li, hi).unwrap();
            let tr = trace(&mm(&head(&w.w_v, li, hi), &head(&w.w_o, li, hi)));
            let want = tr / e.moduli().sum();
            assert!((cs[[li, hi]] - want).abs() < 1e-10);
            assert!(cs[[li, hi]].abs() <= 1.0 + 1e-12);
        }
    }

    // Planted: W_O = W_V^T makes W_OV = V V^T positive semi-definite (copying score +1);
    // W_O = -W_V^T gives -1.
    let v = rand4(&mut rng, (1, 2, 8, 3));
    let mut o = v
        .clone()
        .permuted_axes([0, 1, 3, 2])
        .as_standard_layout()
        .to_owned();
    o.slice_mut(s![0, 1, .., ..]).mapv_inplace(|x| -x);
    let q = rand4(&mut rng, (1, 2, 8, 3));
    let planted = AttnWeights::new(q.clone(), q, v, o).unwrap();
    let cs = planted.ov_copying_scores().unwrap();
    assert!((cs[[0, 0]] - 1.0).abs() < 1e-12, "{cs}");
    assert!((cs[[0, 1]] + 1.0).abs() < 1e-12, "{cs}");
}

#[test]
fn baseline_places_a_planted_composition_above_its_99th_percentile() {
    let mut rng = ChaCha8Rng::seed_from_u64(24);
    let (d, dh) = (17, 3);
    let mut w = random_weights(&mut rng, 2, 2, d, dh, dh);
    // K-composition planted: W_K(L1H0) = W_O(L0H1)^T, so W_OV(L0H1) W_K W_Q^T contains O O^T.
    let o = head(&w.w_o, 0, 1);
    w.w_k.slice_mut(s![1, 0, .., ..]).assign(&o.t());
    let sc = composition_scores(&w, &CompositionParams::default()).unwrap();
    let k = sc.k.unwrap();
    let base = composition_baseline(d, dh, dh, 2000, 5).unwrap();
    let p99 = base.percentile(CompositionKind::K, 99.0).unwrap();
    let p50 = base.percentile(CompositionKind::K, 50.0).unwrap();
    assert!(p50 < p99 && p99 < 1.0);
    assert!(
        k[[0, 1, 1, 0]] > p99,
        "planted {} vs p99 {p99}",
        k[[0, 1, 1, 0]]
    );
    let above = base.exceeds(CompositionKind::K, &k, 99.0).unwrap();
    assert!(above[[0, 1, 1, 0]]);
    assert!(base.fraction_below(CompositionKind::K, k[[0, 1, 1, 0]]) > 0.99);
    // The median random pair of the model sits near the baseline median, not above its 99th.
    let mut real: Vec<f64> = Vec::new();
    for ((l1, h1, l2, h2), &x) in k.indexed_iter() {
        if l1 < l2 && !(h1 == 1 && h2 == 0) {
            real.push(x);
        }
    }
    assert!(real.iter().all(|&x| x < p99 * 1.5));
}

// ---------------------------------------------------------------------------------------------
// Against TransformerLens 3.9.0.

#[test]
fn transformer_lens_composition_scores() {
    let mut z = npz();
    let w = tl_weights(&mut z);
    for method in [CompositionMethod::Gram, CompositionMethod::Direct] {
        let params = CompositionParams {
            method,
            ..Default::default()
        };
        let sc = composition_scores(&w, &params).unwrap();
        for kind in CompositionKind::ALL {
            let want: Array4<f64> = get(&mut z, &format!("comp_{kind}"));
            let got = sc.get(kind).unwrap();
            assert!(
                max_abs_diff(got, &want) < 1e-9,
                "{kind} {method:?}: {got} vs {want}"
            );
            assert!(want.iter().any(|&x| x > 0.05), "fixture {kind} not trivial");
        }
    }
}

#[test]
fn transformer_lens_eigenvalues_copying_and_svd() {
    let mut z = npz();
    let w = tl_weights(&mut z);
    let ov = w.ov_eigenvalues().unwrap();
    let want_re: Array3<f64> = get(&mut z, "ov_eig_re");
    let want_im: Array3<f64> = get(&mut z, "ov_eig_im");
    assert_same_spectrum((&ov.re, &ov.im), (&want_re, &want_im), 1e-9);
    let want: Array2<f64> = get(&mut z, "ov_copying");
    assert!(max_abs_diff(&ov.copying_scores(), &want) < 1e-9);

    let full = w.full_ov_eigenvalues().unwrap();
    let want_re: Array3<f64> = get(&mut z, "full_ov_eig_re");
    let want_im: Array3<f64> = get(&mut z, "full_ov_eig_im");
    let scale = want_re
        .iter()
        .chain(want_im.iter())
        .fold(0.0f64, |a, &b| a.max(b.abs()));
    assert_same_spectrum(
        (&full.re, &full.im),
        (&want_re, &want_im),
        1e-9 * scale.max(1.0),
    );
    let want: Array2<f64> = get(&mut z, "full_ov_copying");
    assert!(max_abs_diff(&full.copying_scores(), &want) < 1e-9);

    let sv: Array3<f64> = get(&mut z, "ov_singular_values");
    let fnorm: Array2<f64> = get(&mut z, "full_ov_norm");
    for l in 0..2 {
        for h in 0..3 {
            let s = w.ov_circuit(l, h).unwrap().singular_values().unwrap();
            let want = sv.slice(s![l, h, ..]).to_owned();
            assert!(max_abs_diff(&s, &want) < 1e-10, "L{l}H{h}: {s} vs {want}");
            let n = w.full_ov_circuit(l, h).unwrap().frobenius_norm();
            assert!((n - fnorm[[l, h]]).abs() < 1e-9 * fnorm[[l, h]]);
        }
    }
}

#[test]
fn transformer_lens_head_detector() {
    let mut z = npz();
    let patterns: Array4<f64> = get(&mut z, "patterns");
    let tokens: Array1<i64> = z.by_name("tokens").unwrap();
    let tokens = tokens.to_vec();
    let before = patterns.clone();
    for (kind, short) in [
        (HeadPattern::PreviousToken, "previous_token"),
        (HeadPattern::DuplicateToken, "duplicate_token"),
        (HeadPattern::Induction, "induction"),
    ] {
        let want_pat: Array2<f64> = get(&mut z, &format!("detpat_{short}"));
        assert_eq!(
            detection_pattern(&kind, &tokens).unwrap(),
            want_pat,
            "{short}"
        );
        for (measure, tol) in [(ErrorMeasure::Mul, 1e-12), (ErrorMeasure::Abs, 5.1e-4)] {
            // TransformerLens rounds "abs" to 3 decimals; we do not.
            for (bos, cur) in [(false, false), (true, true), (true, false)] {
                let opts = DetectOptions {
                    measure,
                    exclude_bos: bos,
                    exclude_current_token: cur,
                };
                let got = head_scores(&patterns, &tokens, &kind, &opts).unwrap();
                let name = format!("det_{short}_{measure}_{}{}", bos as u8, cur as u8);
                let want: Array2<f64> = get(&mut z, &name);
                assert!(max_abs_diff(&got, &want) < tol, "{name}: {got} vs {want}");
            }
        }
    }
    // Never mutates the caller's pattern (TransformerLens' "mul" mode once zeroed it in place).
    assert_eq!(patterns, before);

    // Repeated-random-token stripes against numpy's diagonals.
    let n: Array<i64, Ix0> = z.by_name("rep_n").unwrap();
    let n = n.into_scalar() as usize;
    let rep = repeated_token_scores(&patterns.clone().insert_axis(Axis(0)), n, 1).unwrap();
    for (got, name) in [
        (&rep.induction, "rep_induction"),
        (&rep.previous_token, "rep_previous"),
        (&rep.duplicate_token, "rep_duplicate"),
    ] {
        let want: Array2<f64> = get(&mut z, name);
        assert!(max_abs_diff(got, &want) < 1e-12, "{name}");
    }
    assert!(repeated_token_scores(&patterns.clone().insert_axis(Axis(0)), n, 0).is_err());
}

// ---------------------------------------------------------------------------------------------
// Head detection: lists of prompts and batches honour every option.

/// Random causal attention patterns [L, H, S, S] with rows summing to 1.
fn causal_patterns(rng: &mut ChaCha8Rng, l: usize, h: usize, s: usize) -> Array4<f64> {
    let mut p = Array4::zeros((l, h, s, s));
    for li in 0..l {
        for hi in 0..h {
            for q in 0..s {
                let row: Vec<f64> = (0..=q)
                    .map(|_| rng.gen_range(0.0..1.0f64).powi(3))
                    .collect();
                let sum: f64 = row.iter().sum();
                for (k, x) in row.into_iter().enumerate() {
                    p[[li, hi, q, k]] = x / sum;
                }
            }
        }
    }
    p
}

#[test]
fn prompts_and_batches_honour_options() {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let toks_a: Vec<u32> = vec![3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5];
    let toks_b: Vec<u32> = vec![2, 7, 1, 8, 2, 8, 1];
    let pa = causal_patterns(&mut rng, 2, 3, toks_a.len());
    let pb = causal_patterns(&mut rng, 2, 3, toks_b.len());
    for kind in [
        HeadPattern::DuplicateToken,
        HeadPattern::Induction,
        HeadPattern::PreviousToken,
    ] {
        for measure in [ErrorMeasure::Mul, ErrorMeasure::Abs] {
            let opts = DetectOptions {
                measure,
                exclude_bos: true,
                exclude_current_token: true,
            };
            let sa = head_scores(&pa, &toks_a, &kind, &opts).unwrap();
            let sb = head_scores(&pb, &toks_b, &kind, &opts).unwrap();
            let list = head_scores_prompts(
                &[(pa.view(), toks_a.clone()), (pb.view(), toks_b.clone())],
                &kind,
                &opts,
            )
            .unwrap();
            assert!(max_abs_diff(&list, &((&sa + &sb) / 2.0)) < 1e-14);
            // The options change the result, so dropping them would fail this test.
            let plain = head_scores_prompts(
                &[(pa.view(), toks_a.clone()), (pb.view(), toks_b.clone())],
                &kind,
                &DetectOptions {
                    measure,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(max_abs_diff(&list, &plain) > 1e-3, "{kind:?} {measure}");
        }
    }
    // Batch of equal lengths = mean of single sequences; plain-loop check of "mul".
    let toks_c: Vec<u32> = vec![1, 2, 3, 1, 2, 3, 7, 7, 1, 2, 3];
    let pc = causal_patterns(&mut rng, 2, 3, toks_c.len());
    let batch = ndarray::stack(Axis(0), &[pa.view(), pc.view()]).unwrap();
    let toks = Array2::from_shape_vec((2, 11), [toks_a.clone(), toks_c.clone()].concat()).unwrap();
    let opts = DetectOptions::default();
    let got = head_scores_batch(&batch, &toks, &HeadPattern::Induction, &opts).unwrap();
    let mut want = Array2::<f64>::zeros((2, 3));
    for (p, t) in [(&pa, &toks_a), (&pc, &toks_c)] {
        for l in 0..2 {
            for h in 0..3 {
                let (mut num, mut den) = (0.0, 0.0);
                for i in 0..11 {
                    for j in 0..11 {
                        let a = p[[l, h, i, j]];
                        den += a;
                        // Induction: key j follows an earlier copy of token i.
                        if j >= 1 && j - 1 < i && t[j - 1] == t[i] {
                            num += a;
                        }
                    }
                }
                want[[l, h]] += num / den / 2.0;
            }
        }
    }
    assert!(max_abs_diff(&got, &want) < 1e-14);
    assert!(head_scores_batch(
        &batch,
        &toks.slice(s![..1, ..]),
        &HeadPattern::Induction,
        &opts
    )
    .is_err());
}

// ---------------------------------------------------------------------------------------------
// Direct path: bigrams and skip-trigrams against brute force.

#[test]
fn bigram_top_k_matches_full_table() {
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let (vocab, d, k) = (13, 5, 4);
    let w_e = rand_mat(&mut rng, vocab, d);
    let w_u = rand_mat(&mut rng, d, vocab);
    let b_u = Array1::from_shape_simple_fn(vocab, || rng.gen_range(-1.0..1.0));
    let table = mm(&w_e, &w_u) + &b_u;
    let top = bigram_top_k(w_e.view(), w_u.view(), Some(b_u.view()), k, None, 4).unwrap();
    assert_eq!(top.tokens.dim(), (vocab, k));
    for src in 0..vocab {
        let row = table.row(src);
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let lse = row.iter().map(|x| x.exp()).sum::<f64>().ln();
        for c in 0..k {
            assert_eq!(top.tokens[[src, c]], order[c]);
            assert!((top.logits[[src, c]] - row[order[c]]).abs() < 1e-12);
            assert!((top.log_probs[[src, c]] - (row[order[c]] - lse)).abs() < 1e-12);
        }
    }
    let sub = bigram_top_k(
        w_e.view(),
        w_u.view(),
        Some(b_u.view()),
        k,
        Some(&[7, 2]),
        1,
    )
    .unwrap();
    assert_eq!(sub.sources, vec![7, 2]);
    assert_eq!(sub.tokens.row(0), top.tokens.row(7));
    assert_eq!(sub.tokens.row(1), top.tokens.row(2));
    // f32 input gives the same ranking.
    let top32 = bigram_top_k(
        w_e.mapv(|x| x as f32).view(),
        w_u.mapv(|x| x as f32).view(),
        Some(b_u.mapv(|x| x as f32).view()),
        k,
        None,
        5,
    )
    .unwrap();
    assert_eq!(top32.tokens.column(0), top.tokens.column(0));
}

#[test]
fn skip_trigrams_match_brute_force() {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let (vocab, d, dh) = (11, 6, 2);
    let w = random_weights(&mut rng, 1, 2, d, dh, dh)
        .with_embeddings(
            Some(rand_mat(&mut rng, vocab, d)),
            Some(rand_mat(&mut rng, d, vocab)),
            None,
        )
        .unwrap();
    let w_e = w.w_e.clone().unwrap();
    let w_u = w.w_u.clone().unwrap();
    for h in 0..2 {
        let qk = mm(
            &mm(&w_e, &head(&w.w_q, 0, h)),
            &mm(&head(&w.w_k, 0, h).t().to_owned(), &w_e.t().to_owned()),
        );
        let ov = mm(
            &mm(&w_e, &head(&w.w_v, 0, h)),
            &mm(&head(&w.w_o, 0, h), &w_u),
        );
        // Centre QK over sources (per destination row) and OV over outputs (per source row).
        let qkc = &qk - &qk.mean_axis(Axis(1)).unwrap().insert_axis(Axis(1));
        let ovc = &ov - &ov.mean_axis(Axis(1)).unwrap().insert_axis(Axis(1));
        let mut all: Vec<(f64, usize, usize, usize)> = Vec::new();
        for a in 0..vocab {
            for b in 0..vocab {
                for c in 0..vocab {
                    if qkc[[b, a]] > 0.0 && ovc[[a, c]] > 0.0 {
                        all.push((qkc[[b, a]] * ovc[[a, c]], a, b, c));
                    }
                }
            }
        }
        all.sort_by(|x, y| {
            y.0.total_cmp(&x.0)
                .then((x.1, x.2, x.3).cmp(&(y.1, y.2, y.3)))
        });
        let params = SkipTrigramParams {
            top_k: 15,
            sources: None,
            block: 3,
        };
        let got = skip_trigrams(&w, 0, h, &params).unwrap();
        assert_eq!(got.len(), 15);
        for (g, want) in got.iter().zip(all.iter()) {
            assert_eq!(
                (g.source, g.dest, g.out),
                (want.1, want.2, want.3),
                "head {h}"
            );
            assert!((g.score - want.0).abs() < 1e-12);
            assert!((g.qk - qkc[[g.dest, g.source]]).abs() < 1e-12);
            assert!((g.ov - ovc[[g.source, g.out]]).abs() < 1e-12);
        }
        // Restricting the sources keeps only their triples, in the same order.
        let only: Vec<_> = all.iter().filter(|t| t.1 == 4).take(5).collect();
        let got = skip_trigrams(
            &w,
            0,
            h,
            &SkipTrigramParams {
                top_k: 5,
                sources: Some(vec![4]),
                block: 2,
            },
        )
        .unwrap();
        assert_eq!(got.len(), only.len());
        for (g, want) in got.iter().zip(only) {
            assert_eq!((g.source, g.dest, g.out), (want.1, want.2, want.3));
        }
    }
    assert!(skip_trigrams(&w, 1, 0, &SkipTrigramParams::default()).is_err());
}

#[test]
fn detection_errors_are_clear() {
    let p = Array4::<f64>::zeros((1, 2, 4, 4));
    let err = head_scores(
        &p,
        &[1, 2, 3],
        &HeadPattern::Induction,
        &DetectOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("query = key = 3"), "{err}");
    let mut bad = p.clone();
    bad[[0, 1, 2, 1]] = f64::NAN;
    assert!(head_scores(
        &bad,
        &[1, 2, 3, 4],
        &HeadPattern::Induction,
        &DetectOptions::default()
    )
    .is_err());
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
