//! The unit tests of the pass: against candle's forward, the hooks, the passes from a stream or a
//! block state, and the AVX2 kernels against the portable ones bit for bit (the kernels' own
//! tests are `hyperlens-kernels`'s).

use candle_core::{Device, Tensor};

use hyperlens_kernels::Isa;

use super::*;
use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::nn::params::seeded_tensors;
use crate::nn::InitRule;
use crate::ops::test_util::{random_input, random_model};
use crate::transformer::Transformer;
use crate::Mixer;

/// The largest difference relative to the largest magnitude of `want`.
fn rel_diff(got: &Tensor, want: &Tensor) -> f32 {
    let g: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
    let w: Vec<f32> = want.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(g.len(), w.len());
    let scale = w.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    g.iter()
        .zip(&w)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

#[test]
fn matches_the_candle_forward_for_every_mixer_with_and_without_a_causal_mask() {
    // 19 problems: two full chunks and a short one.
    for (s, mixer) in Mixer::ALL.into_iter().enumerate() {
        for causal in [false, true] {
            let model = random_model(mixer, causal, s as u64);
            let x = random_input(model.config(), 19, 3);
            let want = model.forward(&x, true).unwrap();
            let got = Inference::new(&model).unwrap().forward(&x, true).unwrap();
            let d = rel_diff(&got.logits, &want.logits);
            assert!(d < 1e-5, "{mixer} causal {causal}: logits differ by {d}");
            for (l, (g, w)) in got
                .attention
                .unwrap()
                .iter()
                .zip(want.attention.unwrap().iter())
                .enumerate()
            {
                let d = rel_diff(g, w);
                assert!(
                    d < 1e-5,
                    "{mixer} causal {causal} layer {l}: codes differ by {d}"
                );
            }
        }
    }
}

#[test]
fn the_last_block_computed_for_the_read_queries_alone_gives_the_full_passs_outputs() {
    // T 9, F 3: without hooks the last block runs queries 6..9; with codes read from query 4,
    // queries 4..9. Logits against candle's forward and against the full pass of `run`.
    for (s, mixer) in Mixer::ALL.into_iter().enumerate() {
        for causal in [false, true] {
            let model = random_model(mixer, causal, 40 + s as u64);
            let inf = Inference::new(&model).unwrap();
            let x = random_input(model.config(), 19, 5);
            let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
            let full = inf.run(&xs, 19, 27, |l, att, row| {
                if l == 2 {
                    row.copy_from_slice(&att[4 * 9..][..27]);
                }
            });
            let full = full.unwrap();
            let plain = inf.run_hooked(Start::Inputs(&xs), 19, 0, &()).unwrap();
            assert_eq!(plain.logits, full.logits, "{mixer} causal {causal}");
            let read = TakeCodesFrom {
                first_query: 4,
                take: |l: usize, att: &[f32], row: &mut [f32]| {
                    if l == 2 {
                        assert!(att[3 * 9..][..9].iter().all(|v| v.is_nan()));
                        row.copy_from_slice(&att[4 * 9..][..27]);
                    }
                },
            };
            let part = inf.run_hooked(Start::Inputs(&xs), 19, 27, &read).unwrap();
            assert_eq!(part.logits, full.logits, "{mixer} causal {causal}");
            assert_eq!(part.taken, full.taken, "{mixer} causal {causal}");
            let want = model.forward(&x, false).unwrap().logits;
            let got = Tensor::from_vec(plain.logits, want.dims(), &Device::Cpu).unwrap();
            assert!(rel_diff(&got, &want) < 1e-5, "{mixer} causal {causal}");
        }
    }
}

/// Reads the stream entering block 1 into the row; at block 1 sets head 0's code of query 4
/// to key 2 to 0.75.
struct Edit;

impl InferenceHooks for Edit {
    fn resid_pre(&self, layer: usize, _: usize, resid: &mut [f32], row: &mut [f32]) {
        if layer == 1 {
            row.copy_from_slice(resid);
        }
    }
    fn pattern(&self, layer: usize, _: usize, codes: &mut [f32], _: &mut [f32]) {
        if layer == 1 {
            codes[4 * 9 + 2] = 0.75;
        }
    }
}

/// The same edit by candle's hooked pass.
struct CandleEdit;

impl crate::HookFn for CandleEdit {
    fn wants(&self, name: &str) -> bool {
        name == "blocks.1.attn.hook_pattern"
    }
    fn call(&mut self, _: &str, p: &Tensor) -> Result<Option<Tensor>> {
        let mut v: Vec<f32> = p.flatten_all()?.to_vec1()?;
        let (b, h, t, _) = p.dims4()?;
        for bi in 0..b {
            v[((bi * h) * t + 4) * t + 2] = 0.75;
        }
        Ok(Some(Tensor::from_vec(v, p.shape(), p.device())?))
    }
}

#[test]
fn hooks_edit_the_codes_and_a_pass_from_the_stream_repeats_the_full_pass() {
    for mixer in [Mixer::Hyla, Mixer::Softmax] {
        let model = random_model(mixer, false, 5);
        let inf = Inference::new(&model).unwrap();
        let x = random_input(model.config(), 11, 6);
        let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        let width = 9 * 24;
        let edited = inf
            .run_hooked(Start::Inputs(&xs), 11, width, &Edit)
            .unwrap();
        let want = model.run_with_hooks(&x, &mut CandleEdit).unwrap();
        let d = rel_diff(
            &Tensor::from_vec(edited.logits.clone(), want.shape(), &Device::Cpu).unwrap(),
            &want,
        );
        assert!(d < 1e-5, "{mixer}: edited logits differ by {d}");
        // The edit moved the logits, and a pass from the captured stream repeats them exactly.
        let plain = inf.run(&xs, 11, 0, |_, _, _| {}).unwrap();
        assert!(plain.logits != edited.logits);
        let start = Start::Stream {
            resid: &edited.taken,
            layer: 1,
        };
        let again = inf.run_hooked(start, 11, width, &Edit).unwrap();
        assert_eq!(again.logits, edited.logits);
        assert_eq!(again.taken, edited.taken);
        let past = Start::Stream {
            resid: &edited.taken,
            layer: 3,
        };
        assert!(matches!(
            inf.run_hooked(past, 11, 0, &Edit),
            Err(ModelError::Input(_))
        ));
    }
}

/// Reads the stream entering block `0` into the row.
struct ReadPre(usize);

impl InferenceHooks for ReadPre {
    fn resid_pre(&self, layer: usize, _: usize, resid: &mut [f32], row: &mut [f32]) {
        if layer == self.0 {
            row.copy_from_slice(resid);
        }
    }
}

/// At block `layer` writes `0.1 (p + k + 1)` into head 1's code of query `query` to key `k`,
/// for the problem `p` of the pass.
struct QueryEdit {
    layer: usize,
    query: usize,
}

impl InferenceHooks for QueryEdit {
    fn pattern(&self, layer: usize, problem: usize, codes: &mut [f32], _: &mut [f32]) {
        if layer == self.layer {
            for k in 0..9 {
                codes[(9 + self.query) * 9 + k] = 0.1 * (problem + k + 1) as f32;
            }
        }
    }

    fn last_block_from_query(&self) -> usize {
        self.query
    }
}

#[test]
fn a_pass_from_a_block_state_repeats_the_pass_from_the_stream_bit_for_bit() {
    // 13 problems; passes of 11 (a chunk of 8 and one of 3, out of order, one repeated) and
    // of 1, at every block, at the last query and at query 2 (before the logits' rows).
    for (s, mixer) in Mixer::ALL.into_iter().enumerate() {
        for causal in [false, true] {
            let model = random_model(mixer, causal, 60 + s as u64);
            let inf = Inference::new(&model).unwrap();
            let (b, t, dm) = (13, 9, 24);
            let x = random_input(model.config(), b, 8);
            let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
            let plain = inf.run_hooked(Start::Inputs(&xs), b, 0, &()).unwrap();
            for layer in 0..3 {
                let pre = inf
                    .run_hooked(Start::Inputs(&xs), b, t * dm, &ReadPre(layer))
                    .unwrap()
                    .taken;
                let state = inf.block_state(&pre, b, layer).unwrap();
                assert_eq!((state.layer(), state.batch()), (layer, b));
                for problems in [vec![12, 0, 5, 5, 3, 1, 7, 8, 9, 10, 11], vec![4]] {
                    let n = problems.len();
                    let stream: Vec<f32> = problems
                        .iter()
                        .flat_map(|&p| pre[p * t * dm..][..t * dm].iter().copied())
                        .collect();
                    let logits_of = |p: usize| &plain.logits[p * 18..][..18];
                    // No edit: the plain pass's logits.
                    let start = Start::Query {
                        state: &state,
                        problems: &problems,
                        query: t - 1,
                    };
                    let same = inf.run_hooked(start, n, 0, &()).unwrap();
                    for (i, &p) in problems.iter().enumerate() {
                        assert_eq!(&same.logits[i * 18..][..18], logits_of(p));
                    }
                    for query in [t - 1, 2] {
                        let edit = QueryEdit { layer, query };
                        let want = inf
                            .run_hooked(
                                Start::Stream {
                                    resid: &stream,
                                    layer,
                                },
                                n,
                                0,
                                &edit,
                            )
                            .unwrap();
                        let start = Start::Query {
                            state: &state,
                            problems: &problems,
                            query,
                        };
                        let got = inf.run_hooked(start, n, 0, &edit).unwrap();
                        let what =
                            format!("{mixer} causal {causal} block {layer} query {query} of {n}");
                        assert_eq!(got.logits, want.logits, "{what}");
                        if query == t - 1 {
                            assert!(got.logits[..18] != *logits_of(problems[0]), "{what}");
                        }
                    }
                }
                // Bad input: a problem outside the state, a query past the sequence, a batch
                // that is not the problems'.
                for (problems, query, n) in [(vec![13], 8, 1), (vec![0], 9, 1), (vec![0, 1], 8, 1)]
                {
                    let start = Start::Query {
                        state: &state,
                        problems: &problems,
                        query,
                    };
                    assert!(matches!(
                        inf.run_hooked(start, n, 0, &()),
                        Err(ModelError::Input(_))
                    ));
                }
            }
            assert!(inf.block_state(&xs, b, 0).is_err());
            assert!(inf.block_state(&vec![0.0; b * t * dm], b, 3).is_err());
        }
    }
}

#[test]
fn the_avx2_kernels_give_the_baseline_pass_bit_for_bit() {
    // Shapes that take every path: keys a multiple of 8 or not (partial chunks and masked
    // loads), head widths with a copy of their own (2, 4, 8) or not (3), H d a multiple of 8
    // (the transposes in register blocks) or not; every mixer, causal or not.
    if !Isa::detected().avx2() {
        eprintln!("skipped: this CPU has no AVX2 and FMA, so only the portable kernels run");
        return;
    }
    for (s, (t, h, d)) in [(9, 3, 4), (17, 4, 2), (16, 2, 8), (12, 2, 3)]
        .into_iter()
        .enumerate()
    {
        for mixer in Mixer::ALL {
            for causal in [false, true] {
                let cfg = Config {
                    d_in: 5,
                    n_tokens: t,
                    n_outputs: 3,
                    d_model: 24,
                    n_heads: h,
                    d_head: d,
                    n_layers: 2,
                    d_mlp: 20,
                    d_out: 6,
                    n_buckets: t.min(7),
                    causal,
                    mixer,
                };
                let tensors = seeded_tensors(
                    cfg.tensor_shapes(),
                    90 + s as u64,
                    |_| InitRule::Normal(0.5),
                    &Device::Cpu,
                )
                .unwrap();
                let model =
                    Transformer::from_tensors(&cfg, tensors.into_iter().collect(), &Device::Cpu)
                        .unwrap();
                let x = random_input(model.config(), 11, 3 + s as u64);
                let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
                let per_layer = h * t * t;
                let take = TakeCodes(|layer: usize, codes: &[f32], row: &mut [f32]| {
                    row[layer * per_layer..][..per_layer].copy_from_slice(codes);
                });
                let mut inf = Inference::new(&model).unwrap();
                let avx2 = inf.run_hooked(Start::Inputs(&xs), 11, 2 * per_layer, &take);
                inf.isa = Isa::PORTABLE;
                let base = inf.run_hooked(Start::Inputs(&xs), 11, 2 * per_layer, &take);
                let (avx2, base) = (avx2.unwrap(), base.unwrap());
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let case = format!("{mixer} causal {causal}, T {t}, H {h}, d {d}");
                assert_eq!(bits(&avx2.logits), bits(&base.logits), "logits: {case}");
                assert_eq!(bits(&avx2.taken), bits(&base.taken), "codes: {case}");
            }
        }
    }
}

#[test]
fn take_sees_every_layer_and_bad_input_is_an_error() {
    let model = random_model(Mixer::Hyla, false, 9);
    let inf = Inference::new(&model).unwrap();
    let x = random_input(model.config(), 10, 4);
    let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
    // Row = one code per layer: layer 2's code of query 8 to key 0, head 1.
    let out = inf
        .run(&xs, 10, 3, |l, att, row| row[l] = att[(9 + 8) * 9])
        .unwrap();
    let want = model.forward(&x, true).unwrap().attention.unwrap();
    for (l, want) in want.iter().enumerate() {
        let w: Vec<f32> = want
            .narrow(1, 1, 1)
            .unwrap()
            .narrow(2, 8, 1)
            .unwrap()
            .narrow(3, 0, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for (p, w) in w.iter().enumerate() {
            assert!((out.taken[p * 3 + l] - w).abs() < 1e-5);
        }
    }
    assert!(matches!(
        inf.run(&xs[1..], 10, 0, |_, _, _| {}),
        Err(ModelError::Input(_))
    ));
    assert!(matches!(
        inf.run(&[], 0, 0, |_, _, _| {}),
        Err(ModelError::Input(_))
    ));
}
