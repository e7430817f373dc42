//! k-means and silhouettes against scikit-learn (`tests/fixtures/make_kmeans_reference.py` ->
//! `kmeans_reference.npz`, `kmeans_reference.json`): on the same data, our best-of-10 inertia
//! within 1e-4 relative of `KMeans(n_init=10, algorithm="lloyd")`'s, the ARI and NMI of the
//! clusters against the planted rules within 0.01 of scikit-learn's, and the silhouette of every
//! point within 1e-6 of `silhouette_samples` on the same labels.

use std::fs::File;
use std::path::PathBuf;

use hyperlens_analysis::cluster::{
    adjusted_rand_index, kmeans, normalized_mutual_info, silhouette_samples, silhouette_score,
    KMeansParams,
};
use ndarray::{Array1, Array2};
use ndarray_npy::NpzReader;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

struct Reference {
    npz: NpzReader<File>,
    json: serde_json::Value,
}

impl Reference {
    fn load() -> Self {
        let dir = fixtures();
        let npz = NpzReader::new(File::open(dir.join("kmeans_reference.npz")).unwrap()).unwrap();
        let text = std::fs::read_to_string(dir.join("kmeans_reference.json")).unwrap();
        Self {
            npz,
            json: serde_json::from_str(&text).unwrap(),
        }
    }
    fn x(&mut self, set: &str) -> Array2<f64> {
        let x: Array2<f32> = self.npz.by_name(&format!("{set}_x")).unwrap();
        x.mapv(f64::from)
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
            .unwrap_or_else(|| panic!("kmeans_reference.json lacks {name}"))
    }
}

const SETS: [&str; 3] = ["narrow", "wide", "wide_separated"];

fn median(v: &Array1<f64>) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len().is_multiple_of(2) {
        0.5 * (s[m - 1] + s[m])
    } else {
        s[m]
    }
}

/// Best-of-10 k-means for 8 seeds on each side (scikit-learn: random_state 0..7; ours: seed
/// 0..7): the medians of the inertia within 1e-4 relative, of the ARI and NMI against the rules
/// within 0.01. (One seed against one seed differs by the luck of the draws: scikit-learn's own
/// ARI spans 0.853-0.884 over its 8 seeds on the `wide` set.)
#[test]
fn kmeans_best_of_ten_agrees_with_scikit_learn() {
    let mut r = Reference::load();
    for set in SETS {
        let x = r.x(set);
        let rules = r.i1(&format!("{set}_rules"));
        let k = r.scalar(&format!("{set}_k")) as usize;
        let (mut inertias, mut aris, mut nmis) = (vec![], vec![], vec![]);
        for seed in 0..8 {
            let params = KMeansParams {
                n_runs: 10,
                seed,
                ..KMeansParams::new(k)
            };
            let fit = kmeans(x.view(), &params).unwrap();
            inertias.push(fit.inertia);
            aris.push(adjusted_rand_index(rules.view(), fit.assignments.view()).unwrap());
            nmis.push(normalized_mutual_info(rules.view(), fit.assignments.view()).unwrap());
        }
        let inertia = median(&Array1::from(inertias));
        let ari = median(&Array1::from(aris));
        let nmi = median(&Array1::from(nmis));
        let want = median(&r.f1(&format!("{set}_sk_inertia")));
        let want_ari = median(&r.f1(&format!("{set}_sk_ari")));
        let want_nmi = median(&r.f1(&format!("{set}_sk_nmi")));
        let rel = (inertia - want).abs() / want;
        println!(
            "{set} (medians over 8 seeds): inertia {inertia} vs {want} ({rel:.1e} rel), ARI {ari:.4} vs {want_ari:.4}, NMI {nmi:.4} vs {want_nmi:.4}"
        );
        assert!(
            rel <= 1e-4,
            "{set}: inertia {inertia} vs scikit-learn {want}"
        );
        assert!(
            (ari - want_ari).abs() <= 0.01,
            "{set}: ARI {ari} vs {want_ari}"
        );
        assert!(
            (nmi - want_nmi).abs() <= 0.01,
            "{set}: NMI {nmi} vs {want_nmi}"
        );
        // the clusters are far from trivial (the bounds above would be loose otherwise)
        assert!(want_ari > 0.7 && want_ari < 0.99, "{set}: ARI {want_ari}");
    }
}

#[test]
fn silhouette_samples_agree_with_scikit_learn() {
    let mut r = Reference::load();
    for set in SETS {
        let x = r.x(set);
        for labels in ["rules", "sk_labels"] {
            let l = r.i1(&format!("{set}_{labels}"));
            let want = r.f1(&format!("{set}_sil_{labels}"));
            let got = silhouette_samples(x.view(), l.view()).unwrap();
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(worst <= 1e-6, "{set} {labels}: max |diff| {worst:e}");
            let mean = silhouette_score(x.view(), l.view()).unwrap();
            assert!((mean - want.mean().unwrap()).abs() <= 1e-6);
            println!("{set} {labels}: silhouette max |diff| {worst:.1e}, mean {mean:.6}");
        }
    }
}
