//! The evaluator's two engines against each other on random models of every mixer: the host
//! engine (what a CPU model gets) and candle's passes (what a GPU model gets, here run on the CPU).

use ndarray::Array3;

use super::*;
use crate::ops::test_util::{random_input, random_model};
use crate::Mixer;

/// Largest absolute difference over the largest magnitude of `want`.
fn rel(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

fn input(model: &Transformer, b: usize, seed: u64) -> Array3<f32> {
    let cfg = model.config();
    let x: Vec<f32> = random_input(cfg, b, seed)
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    Array3::from_shape_vec((b, cfg.n_tokens, cfg.d_in), x).unwrap()
}

#[test]
fn host_and_candle_engines_agree_on_every_operation_and_mixer() {
    for (i, mixer) in Mixer::ALL.into_iter().enumerate() {
        let model = random_model(mixer, i % 2 == 1, 70 + i as u64);
        let host = Evaluator::new(model.clone()).unwrap();
        assert_eq!(host.engine_name(), "host");
        let candle = Evaluator::reference(model.clone());
        // 11 problems: a full chunk of 8 and a short one.
        let x = input(&model, 11, i as u64);
        let sites = [
            CodeSite {
                query: 8,
                keys: vec![2, 5],
            },
            CodeSite {
                query: 6,
                keys: vec![0, 6],
            },
        ];
        for (layers, resid_pre) in [(vec![2, 0], false), (vec![1], true), (vec![2, 2], true)] {
            let reads = Reads {
                sites: &sites,
                layers: &layers,
                resid_pre,
            };
            let a = host.read(x.view(), &reads).unwrap();
            let b = candle.read(x.view(), &reads).unwrap();
            assert_eq!(a.codes.len(), 11 * 2 * layers.len() * 3 * 2);
            assert!(rel(&a.codes, &b.codes) < 1e-5, "{mixer} codes");
            assert!(rel(&a.logits, &b.logits) < 1e-5, "{mixer} logits");
            assert_eq!(a.resid_pre.len(), if resid_pre { 3 } else { 0 });
            for (s, t) in a.resid_pre.iter().zip(&b.resid_pre) {
                assert!(rel(s, t) < 1e-5, "{mixer} streams");
            }
            // The plain logits are the read pass's.
            assert_eq!(host.logits(x.view()).unwrap(), a.logits);
        }
        let (la, pa) = host.patterns(x.view()).unwrap();
        let (lb, pb) = candle.patterns(x.view()).unwrap();
        assert_eq!(pa.len(), 11 * 3 * 3 * 9 * 9);
        assert!(
            rel(&pa, &pb) < 1e-5 && rel(&la, &lb) < 1e-5,
            "{mixer} patterns"
        );
        // A pattern row read by the site equals the whole pattern's entry.
        let ra = host
            .read(
                x.view(),
                &Reads {
                    sites: &sites[..1],
                    layers: &[1],
                    resid_pre: false,
                },
            )
            .unwrap();
        // problem 4, head 2, key 5: pattern [B, L, H, T, T] at (4, 1, 2, 8, 5).
        let at = (((4 * 3 + 1) * 3 + 2) * 9 + 8) * 9 + 5;
        assert_eq!(ra.codes[(4 * 3 + 2) * 2 + 1].to_bits(), pa[at].to_bits());
    }
}

#[test]
fn site_codes_replaced_from_a_block_start_match_the_hooked_pass() {
    for (i, mixer) in [Mixer::Softmax, Mixer::Hyla, Mixer::LinearRmsHead]
        .into_iter()
        .enumerate()
    {
        let model = random_model(mixer, false, 90 + i as u64);
        let host = Evaluator::new(model.clone()).unwrap();
        let candle = Evaluator::reference(model.clone());
        let x = input(&model, 10, 5 + i as u64);
        let site = CodeSite {
            query: 7,
            keys: vec![1, 4],
        };
        let sites = [site.clone()];
        let reads = Reads {
            sites: &sites,
            layers: &[0, 1, 2],
            resid_pre: true,
        };
        let plain = host.read(x.view(), &reads).unwrap();
        let layer = 1;
        let problems = [3usize, 3, 9, 0];
        let per = 3 * 2;
        // The pass's own codes at the site (readings [B, 1, 3, H, K]): the plain logits, bit for bit.
        let own: Vec<f32> = problems
            .iter()
            .flat_map(|&p| plain.codes[(p * 3 + layer) * per..][..per].to_vec())
            .collect();
        let start = host
            .block_start(&plain.resid_pre[layer], 10, layer)
            .unwrap();
        assert_eq!((start.layer(), start.batch()), (1, 10));
        let same = host
            .run_with_site_codes(&start, &problems, &site, &own)
            .unwrap();
        let (f, c) = (3, 6);
        for (j, &p) in problems.iter().enumerate() {
            let want = &plain.logits[p * f * c..][..f * c];
            let got = &same[j * f * c..][..f * c];
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{mixer}: identity replacement"
            );
        }
        // Other codes: both engines agree, and the logits move.
        let other: Vec<f32> = (0..problems.len() * per)
            .map(|k| 0.1 + 0.05 * k as f32)
            .collect();
        let a = host
            .run_with_site_codes(&start, &problems, &site, &other)
            .unwrap();
        let cstart = candle
            .block_start(&plain.resid_pre[layer], 10, layer)
            .unwrap();
        let b = candle
            .run_with_site_codes(&cstart, &problems, &site, &other)
            .unwrap();
        assert!(rel(&a, &b) < 1e-5, "{mixer}: replaced codes");
        assert!(
            rel(&a, &same) > 1e-4,
            "{mixer}: the replacement changed nothing"
        );
        // A start of another engine is refused rather than misread.
        assert!(candle
            .run_with_site_codes(&start, &problems, &site, &other)
            .is_err());
    }
}

#[test]
fn bad_reads_are_input_errors() {
    let model = random_model(Mixer::Hyla, false, 3);
    let ev = Evaluator::new(model.clone()).unwrap();
    let x = input(&model, 2, 1);
    let site = |query, keys: Vec<usize>| CodeSite { query, keys };
    let bad: Vec<(Vec<CodeSite>, Vec<usize>)> = vec![
        (vec![], vec![0]),
        (vec![site(9, vec![1])], vec![0]),
        (vec![site(1, vec![9])], vec![0]),
        (vec![site(1, vec![])], vec![0]),
        (vec![site(1, vec![0]), site(2, vec![0, 1])], vec![0]),
        (vec![site(1, vec![0])], vec![3]),
    ];
    for (sites, layers) in bad {
        let reads = Reads {
            sites: &sites,
            layers: &layers,
            resid_pre: false,
        };
        assert!(matches!(
            ev.read(x.view(), &reads),
            Err(ModelError::Input(_))
        ));
    }
    let wrong = Array3::<f32>::zeros((2, 8, 5));
    assert!(matches!(ev.logits(wrong.view()), Err(ModelError::Input(_))));
    let empty = Array3::<f32>::zeros((0, 9, 5));
    assert!(matches!(ev.logits(empty.view()), Err(ModelError::Input(_))));
    assert!(ev.block_start(&[0.0; 10], 1, 0).is_err());
}
