//! Tests of the fused operations: the gradient formulas against candle's float64 autodiff, and the
//! fused forms against the composed operations.

use super::norm::{layer_norm_backward, softmax_backward};
use super::*;
use crate::mixer::Mixer;
use crate::ops::reference;
use crate::ops::test_util::close;
use crate::ops::Ops;
use candle_core::{DType, Device, Tensor, Var, D};

/// The hand-written gradient formulas against candle's autodiff of the composed operations in
/// float64 (only the formulas are compared), with both CPU forms of the leading-axis sums.
#[test]
fn gradient_formulas_match_autodiff_in_float64() {
    let dev = Device::Cpu;
    for fast in [true, false] {
        {
            let x = Var::from_tensor(
                &Tensor::randn(0f64, 1.0, (3, 5, 7), &dev)
                    .unwrap()
                    .affine(2.0, 0.7)
                    .unwrap(),
            )
            .unwrap();
            let w = Var::randn(1f64, 0.3, 7, &dev).unwrap();
            let b = Var::randn(0f64, 0.3, 7, &dev).unwrap();
            let g = Tensor::randn(0f64, 1.0, (3, 5, 7), &dev).unwrap();
            let (xt, wt, bt) = (x.as_tensor(), w.as_tensor(), b.as_tensor());
            let y = reference::layer_norm(ops(fast), xt, wt, bt, 1e-6).unwrap();
            let auto = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
            let (dx, dw, db) = layer_norm_backward(xt, wt, &g, 1e-6, false).unwrap();
            close(&dx, auto.get(xt).unwrap(), 1e-12);
            close(&dw, auto.get(wt).unwrap(), 1e-12);
            close(&db, auto.get(bt).unwrap(), 1e-12);
            let s = candle_nn::ops::softmax(xt, D::Minus1).unwrap();
            let auto = (&s * &g).unwrap().sum_all().unwrap().backward().unwrap();
            close(
                &softmax_backward(&s, &g, false).unwrap(),
                auto.get(xt).unwrap(),
                1e-12,
            );
        }
    }
}

/// The fused float32 path (kernel forward, custom backward) against the composed operations,
/// values and gradients, through a loss that uses both.
#[test]
fn fused_layer_norm_and_softmax_match_the_composed_ops() {
    let dev = Device::Cpu;
    for fast in [true, false] {
        {
            let x = Var::from_tensor(
                &Tensor::randn(0f32, 1.0, (3, 5, 7), &dev)
                    .unwrap()
                    .affine(2.0, 0.7)
                    .unwrap(),
            )
            .unwrap();
            let w = Var::randn(1f32, 0.3, 7, &dev).unwrap();
            let b = Var::randn(0f32, 0.3, 7, &dev).unwrap();
            let c = Tensor::randn(0f32, 1.0, (3, 5, 7), &dev).unwrap();
            let run = |fused: bool| {
                let (xt, wt, bt) = (x.as_tensor(), w.as_tensor(), b.as_tensor());
                let (y, s) = if fused {
                    let y = layer_norm(xt, wt, bt, 1e-6, fast).unwrap();
                    let s = softmax_last_dim(&y, fast).unwrap();
                    (y, s)
                } else {
                    let y = reference::layer_norm(Ops::Reference, xt, wt, bt, 1e-6).unwrap();
                    let s = candle_nn::ops::softmax(&y, D::Minus1).unwrap();
                    (y, s)
                };
                let loss = ((&y * &c).unwrap().sum_all().unwrap()
                    + (&s * &c).unwrap().sqr().unwrap().sum_all().unwrap())
                .unwrap();
                let g = loss.backward().unwrap();
                let get = |v: &Var| g.get(v.as_tensor()).unwrap().clone();
                (y, s, get(&x), get(&w), get(&b))
            };
            let (y1, s1, gx1, gw1, gb1) = run(true);
            let (y0, s0, gx0, gw0, gb0) = run(false);
            close(&y1, &y0, 2e-5);
            close(&s1, &s0, 2e-6);
            close(&gx1, &gx0, 2e-5);
            close(&gw1, &gw0, 2e-5);
            close(&gb1, &gb0, 2e-5);
        }
    }
}

/// The fused HYLA value network (every normalisation, with and without the ReLU, with mask and
/// dropout) against candle's autodiff of the composed operations: output, attention and the
/// gradients of scores and values, with both CPU forms.
#[test]
fn fused_value_network_matches_the_composed_ops() {
    let (mask, drop, s, v, c) = crate::ops::test_util::mix_inputs((2, 3, 5, 4), 5);
    for fast in [true, false] {
        {
            for mixer in [
                Mixer::Hyla,
                Mixer::HylaNoRmsHead,
                Mixer::HylaLinearValue,
                Mixer::SoftmaxHypatt,
            ] {
                for (m, dr) in [(Some(&mask), Some(&drop)), (None, None)] {
                    let run = |fused: bool| {
                        let (o, a) = if fused {
                            mlp_value_mix(s.as_tensor(), v.as_tensor(), mixer, m, dr, fast).unwrap()
                        } else {
                            reference::mix(
                                Ops::Reference,
                                s.as_tensor(),
                                v.as_tensor(),
                                mixer,
                                m,
                                dr,
                            )
                            .unwrap()
                        };
                        let g = (&o * &c).unwrap().sum_all().unwrap().backward().unwrap();
                        let gs = g.get(s.as_tensor()).unwrap().clone();
                        let gv = g.get(v.as_tensor()).unwrap().clone();
                        (o, a, gs, gv)
                    };
                    let (o1, a1, gs1, gv1) = run(true);
                    let (o0, a0, gs0, gv0) = run(false);
                    close(&o1, &o0, 1e-5);
                    close(&a1, &a0, 1e-5);
                    close(&gs1, &gs0, 1e-4);
                    close(&gv1, &gv0, 1e-4);
                }
            }
        }
    }
}

/// Untracked inputs give the fused value without a graph node; a non-contiguous input works.
#[test]
fn fused_ops_on_views_and_without_gradients() {
    let dev = Device::Cpu;
    let x = Tensor::randn(0f32, 1.0, (4, 6, 5), &dev).unwrap();
    let view = x.narrow(1, 2, 3).unwrap();
    assert!(!view.is_contiguous());
    let w = Tensor::ones(5, DType::F32, &dev).unwrap();
    let b = Tensor::zeros(5, DType::F32, &dev).unwrap();
    let y = layer_norm(&view, &w, &b, 1e-6, true).unwrap();
    assert!(!y.track_op());
    close(
        &y,
        &reference::layer_norm(Ops::Reference, &view, &w, &b, 1e-6).unwrap(),
        2e-5,
    );
    let s = softmax_last_dim(&view, true).unwrap();
    close(
        &s,
        &candle_nn::ops::softmax(&view, D::Minus1).unwrap(),
        1e-6,
    );
    let rows: Vec<f32> = s
        .sum_keepdim(D::Minus1)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(rows.iter().all(|r| (r - 1.0).abs() < 1e-6));
}
