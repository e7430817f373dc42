//! Tests of the kernel: against candle's float64 autodiff of the composed operations, problem
//! independence bit for bit, and the cases it declines.

use super::*;
use crate::mixer::Normalisation;
use crate::ops::reference;
use crate::ops::test_util::{bits, close};
use crate::ops::Ops;
use candle_core::Var;

/// The kernel's output, codes and gradients against candle's autodiff of the composed
/// operations in float64 on the same inputs, for the five mixers it serves (those with an MLP
/// value network), with and without a causal mask and dropout.
#[test]
fn kernel_matches_float64_autodiff_of_the_composed_ops() {
    let (mask, drop, s, v, c) = crate::ops::test_util::mix_inputs((3, 5, 7, 4), 11);
    let s64 = Var::from_tensor(&s.to_dtype(DType::F64).unwrap()).unwrap();
    let v64 = Var::from_tensor(&v.to_dtype(DType::F64).unwrap()).unwrap();
    let c64 = c.to_dtype(DType::F64).unwrap();
    let drop64 = drop.to_dtype(DType::F64).unwrap();
    for mixer in Mixer::ALL {
        if mixer.value_network() == ValueNetwork::Default {
            continue;
        }
        for masked in [true, false] {
            let (m, dr, dr64) = if masked {
                (Some(&mask), Some(&drop), Some(&drop64))
            } else {
                (None, None, None)
            };
            let (o, a) = mix(s.as_tensor(), v.as_tensor(), mixer, m, dr)
                .unwrap()
                .expect("the kernel applies");
            let g = (&o * &c).unwrap().sum_all().unwrap().backward().unwrap();
            let (o64, a64) = reference::mix(
                Ops::Reference,
                s64.as_tensor(),
                v64.as_tensor(),
                mixer,
                m,
                dr64,
            )
            .unwrap();
            let g64 = (&o64 * &c64)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            close(&o, &o64, 1e-5);
            close(&a, &a64, 1e-5);
            close(
                g.get(s.as_tensor()).unwrap(),
                g64.get(s64.as_tensor()).unwrap(),
                1e-4,
            );
            close(
                g.get(v.as_tensor()).unwrap(),
                g64.get(v64.as_tensor()).unwrap(),
                1e-4,
            );
        }
    }
}

/// Each problem's result is that of the problem alone (problems are independent and run in
/// parallel), bit for bit, for HYLA and softmax-hypatt; untracked inputs give no graph node.
#[test]
fn problems_are_independent_bit_for_bit() {
    for mixer in [Mixer::Hyla, Mixer::SoftmaxHypatt] {
        independent_bit_for_bit(mixer);
    }
}

fn independent_bit_for_bit(mixer: Mixer) {
    let dev = Device::Cpu;
    let (b, h, t, d) = (4, 3, 6, 2);
    let s = Var::randn(0f32, 1.0, (b, h, t, t), &dev).unwrap();
    let v = Var::randn(0f32, 1.0, (b, h, t, d), &dev).unwrap();
    let c = Tensor::randn(0f32, 1.0, (b, t, h, d), &dev).unwrap();
    let run = |s: &Tensor, v: &Tensor, c: &Tensor| {
        let (o, _) = mix(s, v, mixer, None, None).unwrap().unwrap();
        let g = (&o * c).unwrap().sum_all().unwrap().backward().unwrap();
        (bits(&o), bits(g.get(s).unwrap()), bits(g.get(v).unwrap()))
    };
    let (o, gs, gv) = run(s.as_tensor(), v.as_tensor(), &c);
    for n in 0..b {
        let one = |x: &Tensor| Var::from_tensor(&x.narrow(0, n, 1).unwrap()).unwrap();
        let (s1, v1) = (one(s.as_tensor()), one(v.as_tensor()));
        let (o1, gs1, gv1) = run(s1.as_tensor(), v1.as_tensor(), &c.narrow(0, n, 1).unwrap());
        assert_eq!(
            o[n * o1.len()..][..o1.len()],
            o1[..],
            "output of problem {n}"
        );
        assert_eq!(
            gs[n * gs1.len()..][..gs1.len()],
            gs1[..],
            "score gradient {n}"
        );
        assert_eq!(
            gv[n * gv1.len()..][..gv1.len()],
            gv1[..],
            "value gradient {n}"
        );
    }
    let (o, _) = mix(
        &s.as_tensor().detach(),
        &v.as_tensor().detach(),
        mixer,
        None,
        None,
    )
    .unwrap()
    .unwrap();
    assert!(!o.track_op());
}

/// The standard value network, float64 and a per-problem mask are left to the other forms, and
/// only [`Ops::Fast`] runs the kernel.
#[test]
fn kernel_declines_what_it_does_not_cover() {
    let dev = Device::Cpu;
    let s = Tensor::randn(0f32, 1.0, (2, 3, 4, 4), &dev).unwrap();
    let v = Tensor::randn(0f32, 1.0, (2, 3, 4, 2), &dev).unwrap();
    let none = |s: &Tensor, v: &Tensor, n, m: Option<&Tensor>| {
        let mixer = if n == Normalisation::Softmax {
            Mixer::SoftmaxHypatt
        } else {
            Mixer::Hyla
        };
        mix(s, v, mixer, m, None).unwrap().is_none()
    };
    assert!(!none(&s, &v, Normalisation::Softmax, None));
    assert!(mix(&s, &v, Mixer::Softmax, None, None).unwrap().is_none());
    let (s64, v64) = (
        s.to_dtype(DType::F64).unwrap(),
        v.to_dtype(DType::F64).unwrap(),
    );
    assert!(none(&s64, &v64, Normalisation::RmsHead, None));
    let per_problem = Tensor::ones((2, 1, 4, 4), DType::U8, &dev).unwrap();
    assert!(none(&s, &v, Normalisation::RmsHead, Some(&per_problem)));
    let shared = Tensor::ones((1, 1, 4, 4), DType::U8, &dev).unwrap();
    assert!(!none(&s, &v, Normalisation::RmsHead, Some(&shared)));
    // Under the other choices the same mix gives the same codes without the kernel.
    let (_, a_fast) = Ops::Fast.mix(&s, &v, Mixer::Hyla, None, None).unwrap();
    let (_, a_ref) = Ops::Reference.mix(&s, &v, Mixer::Hyla, None, None).unwrap();
    close(&a_fast, &a_ref, 1e-5);
}
