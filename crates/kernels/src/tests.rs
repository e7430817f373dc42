//! The kernels' unit tests: every instruction set's copy against the portable code bit for bit,
//! and the portable code against plain sums and libm.

use std::mem::MaybeUninit;

use crate::portable::{
    exp_reduced, gelu_tanh, gelu_tanh_reduced, softmax_padded, softmax_padded_rows, GELU_BLOCK,
};
use crate::{padded, portable, Isa, DISTANCE_ROWS};

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn the_detected_instruction_set_is_kept_and_supported() {
    let isa = Isa::detected();
    assert_eq!(Isa::detected(), isa);
    let all = Isa::supported();
    assert_eq!(all[0], Isa::PORTABLE);
    assert_eq!(all.last(), Some(&isa));
    assert!(!Isa::PORTABLE.avx2() && !Isa::PORTABLE.avx512());
    assert_eq!(Isa::PORTABLE.to_string(), "portable");
}

#[test]
fn the_vectorised_exp_is_within_float32_rounding_of_libm() {
    let mut worst = 0f64;
    let mut x = -87.0f32;
    while x <= 88.0 {
        let (got, want) = (f64::from(exp_reduced(x)), f64::from(x.exp()));
        worst = worst.max((got - want).abs() / want);
        x += 1.37e-3;
    }
    assert!(worst < 2.5e-7, "relative error {worst}");
    assert_eq!(exp_reduced(0.0), 1.0);
    assert!(exp_reduced(f32::NAN).is_nan());
    assert!(exp_reduced(-1e30) < 1e-37);
    assert!(exp_reduced(1e30) > 1e38 && exp_reduced(1e30).is_finite());
    // The engine's GELU through it, against training's GELU.
    let mut x = -12.0f32;
    while x < 12.0 {
        let (got, want) = (gelu_tanh_reduced(x), gelu_tanh(x));
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1.0),
            "{x}: {got} {want}"
        );
        x += 0.01;
    }
    let (ninf, mut e, mut a) = (f32::NEG_INFINITY, [0f32; 8], [0f32; 3]);
    softmax_padded(
        &[1.0, f32::NAN, 0.0, ninf, ninf, ninf, ninf, ninf],
        &mut e,
        &mut a,
    );
    assert!(a.iter().all(|v| v.is_nan()));
}

#[test]
fn the_gelu_in_blocks_gives_the_gelu_of_each_float_bit_for_bit() {
    // 3 blocks and a tail of 5, over the range that matters plus the clamps, NaN and zeros
    let mut v: Vec<f32> = (0..3 * GELU_BLOCK + 5)
        .map(|i| (i as f32 * 0.731).sin() * 9.0 - 0.5)
        .collect();
    v[7] = f32::NAN;
    v[40] = -0.0;
    v[41] = 200.0;
    v[42] = -200.0;
    let want: Vec<f32> = v.iter().map(|&x| gelu_tanh_reduced(x)).collect();
    for isa in Isa::supported() {
        let mut got = v.clone();
        isa.gelu_tanh_reduced_in_place(&mut got);
        assert_eq!(bits(&got), bits(&want), "{isa}");
    }
}

#[test]
fn the_padded_softmax_is_libms_softmax_over_the_real_keys() {
    for t in [1, 7, 8, 9, 36, 41] {
        let tp = padded(t);
        let mut s = vec![f32::NEG_INFINITY; tp];
        for (j, s) in s[..t].iter_mut().enumerate() {
            *s = ((j * 7919 % 1009) as f32 / 100.0 - 5.0) * if j % 3 == 0 { 4.0 } else { 1.0 };
        }
        let (mut e, mut a) = (vec![0f32; tp], vec![0f32; t]);
        softmax_padded(&s, &mut e, &mut a);
        let mx = s[..t]
            .iter()
            .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
        let z: f64 = s[..t].iter().map(|&x| (f64::from(x) - mx).exp()).sum();
        // float32's rounding of `x - max` (half an ulp of up to 40) and `exp_reduced`'s 2.5e-7
        for (j, &got) in a.iter().enumerate() {
            let want = (f64::from(s[j]) - mx).exp() / z;
            assert!(
                (f64::from(got) - want).abs() <= 3e-6 * want,
                "T {t}, key {j}: {got} against {want}"
            );
        }
        // Two rows side by side give each row's bits alone.
        let s2: Vec<f32> = s.iter().map(|x| x * 0.5 - 1.0).collect();
        let (mut e2, mut a2) = (vec![0f32; tp], vec![0f32; t]);
        softmax_padded(&s2, &mut e2, &mut a2);
        let (mut f, mut f2) = (vec![0f32; tp], vec![0f32; tp]);
        let (mut b, mut b2) = (vec![0f32; t], vec![0f32; t]);
        softmax_padded_rows([&s, &s2], [&mut f, &mut f2], [&mut b, &mut b2]);
        assert_eq!((b, b2), (a, a2), "T {t}");
    }
}

#[test]
fn every_instruction_set_gives_the_portable_rows_bit_for_bit() {
    // LayerNorm and the bias additions over rows of 13 (a partial chunk of lanes).
    let d = 13;
    let x: Vec<f32> = (0..5 * d).map(|i| (i as f32 * 0.377).cos() * 3.0).collect();
    let w: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 * 0.1).collect();
    let b: Vec<f32> = (0..d).map(|i| i as f32 * -0.07).collect();
    let (mut y0, mut r0) = (vec![0f32; x.len()], x.clone());
    portable::layer_norm(&x, (&w, &b), 1e-6, &mut y0);
    portable::add_rows(&mut r0, &b);
    portable::add_biased(&mut r0, &x, &w);
    for isa in Isa::supported() {
        let (mut y, mut r) = (vec![0f32; x.len()], x.clone());
        isa.layer_norm(&x, (&w, &b), 1e-6, &mut y);
        isa.add_rows(&mut r, &b);
        isa.add_biased(&mut r, &x, &w);
        assert_eq!((bits(&y), bits(&r)), (bits(&y0), bits(&r0)), "{isa}");
    }
}

#[test]
fn every_distance_kernel_gives_the_plain_loop_bit_for_bit() {
    const ROWS: usize = DISTANCE_ROWS;
    let (n, d) = (37, 5);
    let x: Vec<f64> = (0..n * d)
        .map(|i| ((i * 7919) % 113) as f64 / 17.0 - 3.0)
        .collect();
    let mut xt = vec![0.0; d * n];
    for i in 0..n {
        for k in 0..d {
            xt[k * n + i] = x[i * d + k];
        }
    }
    let rows: Vec<f64> = x[3 * d..(3 + ROWS) * d].to_vec();
    let mut want = vec![0.0; ROWS * n];
    for r in 0..ROWS {
        for j in 0..n {
            let mut s = 0.0;
            for k in 0..d {
                let diff = x[j * d + k] - rows[r * d + k];
                s += diff * diff;
            }
            want[r * n + j] = s;
        }
    }
    for isa in Isa::supported() {
        let mut got = vec![f64::NAN; ROWS * n];
        isa.squared_distances(&rows, &xt, &mut got);
        assert_eq!(got, want, "{isa}");
        // a point's distance to itself is exactly zero
        assert_eq!(got[3], 0.0);
    }
}

#[test]
fn tsne_gradient_rows_agree_on_every_instruction_set_and_with_the_plain_sums() {
    let n = 29; // three full lanes of 8 and a tail
    let xs: Vec<f64> = (0..n).map(|j| ((j * 7) % 11) as f64 * 0.3 - 1.0).collect();
    let zs: Vec<f64> = (0..n).map(|j| ((j * 5) % 13) as f64 * 0.2 - 1.2).collect();
    let prow: Vec<f64> = (0..n).map(|j| ((j * 3) % 7) as f64 * 1e-3).collect();
    let i = 4;
    let mut want = [0.0f64; 5];
    for j in 0..n {
        let (dx, dz) = (xs[i] - xs[j], zs[i] - zs[j]);
        let w = 1.0 / (1.0 + dx * dx + dz * dz);
        want[0] += prow[j] * w * dx;
        want[1] += prow[j] * w * dz;
        want[2] += w * w * dx;
        want[3] += w * w * dz;
        if j != i {
            want[4] += w;
        }
    }
    let reference = portable::tsne_gradient_row(xs[i], zs[i], &xs, &zs, &prow);
    for (a, b) in reference.iter().zip(&want) {
        assert!((a - b).abs() < 1e-12, "{reference:?} vs {want:?}");
    }
    for isa in Isa::supported() {
        assert_eq!(
            isa.tsne_gradient_row(xs[i], zs[i], &xs, &zs, &prow),
            reference,
            "{isa}"
        );
    }
}

#[test]
fn silu_mul_is_within_float32_rounding_of_the_f64_formula_on_every_instruction_set() {
    // 3 blocks and a tail of 7, from the clamps to large values, with NaN and zeros
    let n = 3 * GELU_BLOCK + 7;
    let mut g: Vec<f32> = (0..n).map(|i| (i as f32 - 50.0) * 0.37).collect();
    g[5] = 0.0;
    g[6] = -200.0;
    g[n - 1] = f32::NAN;
    let u: Vec<f32> = (0..n).map(|i| ((i * 13) % 7) as f32 * 0.5 - 1.5).collect();
    let mut want = vec![0f32; n];
    portable::silu_mul(&g, &u, &mut want);
    for i in 0..n - 1 {
        let (x, y) = (f64::from(g[i]), f64::from(u[i]));
        let exact = x / (1.0 + (-x).exp()) * y;
        let err = (f64::from(want[i]) - exact).abs();
        // (below the clamp of `exp`, -88, the SiLU is within 1e-35 of 0 rather than relatively)
        assert!(
            err <= 1e-6 * exact.abs() + 1e-30,
            "{i}: {} vs {exact}",
            want[i]
        );
    }
    assert!(want[n - 1].is_nan());
    for isa in Isa::supported() {
        let mut got = vec![f32::NAN; n];
        isa.silu_mul(&g, &u, &mut got);
        assert_eq!(bits(&got), bits(&want), "{isa}");
    }
}

#[test]
fn softmax_prefix_is_the_softmax_of_the_visible_keys_with_zeros_after_on_every_instruction_set() {
    let t = 21; // two lanes of 8 and a tail
    let s: Vec<f32> = (0..t).map(|j| ((j * 7) % 11) as f32 * 0.9 - 3.0).collect();
    for n in [1, 5, 8, 16, 17, t] {
        let mut want = vec![f32::NAN; t];
        portable::softmax_prefix(&s, n, &mut want);
        let mx = s[..n]
            .iter()
            .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
        let z: f64 = s[..n].iter().map(|&x| (f64::from(x) - mx).exp()).sum();
        for j in 0..t {
            if j < n {
                let exact = (f64::from(s[j]) - mx).exp() / z;
                assert!(
                    (f64::from(want[j]) - exact).abs() < 1e-6 * exact.max(1e-3),
                    "{n} {j}"
                );
            } else {
                assert_eq!(want[j], 0.0);
            }
        }
        let total: f32 = want.iter().sum();
        assert!((total - 1.0).abs() < 1e-5);
        for isa in Isa::supported() {
            let mut got = vec![f32::NAN; t];
            isa.softmax_prefix(&s, n, &mut got);
            assert_eq!(bits(&got), bits(&want), "{isa} {n}");
        }
    }
}

#[test]
fn rope_half_rotates_each_pair_by_its_angle_on_every_instruction_set() {
    let d = 20; // pairs (i, i + 10)
    let x: Vec<f32> = (0..d).map(|i| (i as f32 - 7.0) * 0.3).collect();
    let ang: Vec<f32> = (0..d / 2).map(|i| 0.7 * i as f32 + 0.1).collect();
    let (cos, sin): (Vec<f32>, Vec<f32>) = ang.iter().map(|a| (a.cos(), a.sin())).unzip();
    let mut want = vec![0f32; d];
    portable::rope_half(&x, &cos, &sin, &mut want);
    for i in 0..d / 2 {
        let (a, b) = (f64::from(x[i]), f64::from(x[i + d / 2]));
        let (c, s) = (f64::from(ang[i]).cos(), f64::from(ang[i]).sin());
        assert!((f64::from(want[i]) - (a * c - b * s)).abs() < 1e-6);
        assert!((f64::from(want[i + d / 2]) - (a * s + b * c)).abs() < 1e-6);
        // a rotation keeps the pair's length
        let n0 = a * a + b * b;
        let n1 = f64::from(want[i]).powi(2) + f64::from(want[i + d / 2]).powi(2);
        assert!((n0 - n1).abs() < 1e-5 * n0.max(1.0));
    }
    for isa in Isa::supported() {
        let mut got = vec![f32::NAN; d];
        isa.rope_half(&x, &cos, &sin, &mut got);
        assert_eq!(bits(&got), bits(&want), "{isa}");
    }
}

#[test]
fn rms_norm_and_its_residual_form_are_the_serial_formula_on_every_instruction_set() {
    // two groups of side-by-side rows and a tail of 3 rows, rows of 19 entries, one row of zeros
    // (the epsilon alone)
    let (rows, d, eps) = (2 * portable::NORM_ROWS + 3, 19, 1e-5f32);
    let h: Vec<f32> = (0..rows * d).map(|i| noise(i, 3) * 4.0).collect();
    let mut y: Vec<f32> = (0..rows * d).map(|i| noise(i, 4)).collect();
    let w: Vec<f32> = (0..d).map(|i| 0.5 + noise(i, 5)).collect();
    for (yi, hi) in y[..d].iter_mut().zip(&h[..d]) {
        *yi = -hi;
    }
    let (mut sum, mut want) = (vec![0f32; rows * d], vec![0f32; rows * d]);
    portable::add_rms_norm(&h, &y, &w, eps, &mut sum, &mut want);
    for r in 0..rows {
        let s: Vec<f32> = (0..d).map(|j| h[r * d + j] + y[r * d + j]).collect();
        // candle-nn's `rms_norm`, written out: one serial sum, the root, a division
        let m = (s.iter().map(|v| v * v).fold(0f32, |a, b| a + b) / d as f32 + eps).sqrt();
        let ms = (s.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / d as f64 + f64::from(eps))
            .sqrt();
        for j in 0..d {
            assert_eq!(sum[r * d + j].to_bits(), s[j].to_bits());
            assert_eq!(
                want[r * d + j].to_bits(),
                (s[j] / m * w[j]).to_bits(),
                "{r} {j}"
            );
            let exact = f64::from(s[j]) / ms * f64::from(w[j]);
            let got = f64::from(want[r * d + j]);
            assert!((got - exact).abs() <= 1e-6 * exact.abs() + 1e-12, "{r} {j}");
        }
    }
    assert!(want[..d].iter().all(|&v| v == 0.0));
    for isa in Isa::supported() {
        let (mut s2, mut got) = (vec![f32::NAN; rows * d], vec![f32::NAN; rows * d]);
        isa.add_rms_norm(&h, &y, &w, eps, &mut s2, &mut got);
        assert_eq!(bits(&s2), bits(&sum), "{isa}");
        assert_eq!(bits(&got), bits(&want), "{isa}");
        let mut got = vec![f32::NAN; rows * d];
        isa.rms_norm(&sum, &w, eps, &mut got);
        assert_eq!(bits(&got), bits(&want), "{isa}");
    }
}

/// A deterministic pseudo-random float in [-1, 1) from an index (no dependency).
fn noise(i: usize, seed: u32) -> f32 {
    let h = (i as u32 ^ seed)
        .wrapping_mul(0x9E37_79B9)
        .rotate_left(13)
        .wrapping_mul(0x85EB_CA6B);
    (h >> 8) as f32 / (1u32 << 23) as f32 - 1.0
}

#[test]
fn the_packed_product_is_the_ordered_fused_sum_on_every_instruction_set() {
    use crate::packed::{self as pk, PackedMatrix, DEPTH, PANEL, TILE_ROWS};
    // rows past a tile, parts past a panel (one shorter than a half panel), an inner width of
    // two blocks and an odd tail
    let (m, k) = (2 * TILE_ROWS + 5, 2 * DEPTH + 37);
    let ns = [PANEL + 7, 13, 2 * PANEL];
    let x: Vec<f32> = (0..m * k).map(|i| noise(i, 1)).collect();
    let ws: Vec<Vec<f32>> = ns
        .iter()
        .enumerate()
        .map(|(p, &n)| (0..n * k).map(|i| noise(i, 7 + p as u32)).collect())
        .collect();
    let parts: Vec<&[f32]> = ws.iter().map(|w| w.as_slice()).collect();
    let packed = PackedMatrix::new(k, &parts).unwrap();
    assert_eq!(packed.parts(), 3);
    for (i, w) in ws.iter().enumerate() {
        assert_eq!(packed.rows(i), ns[i]);
        assert_eq!(&packed.unpack(i), w, "unpack inverts pack");
    }
    // the plain formula: per block of DEPTH, s_b = fma(x[i, q1-1], w[j, q1-1], ... fma(x[i, q0],
    // w[j, q0], 0)); y[i, j] = s_0 + s_1 + ... in order
    let want: Vec<Vec<f32>> = ws
        .iter()
        .zip(ns)
        .map(|(w, n)| {
            let mut y = vec![0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    let mut y_ij = 0f32;
                    for q0 in (0..k).step_by(DEPTH) {
                        let mut s = 0f32;
                        for q in q0..k.min(q0 + DEPTH) {
                            s = x[i * k + q].mul_add(w[j * k + q], s);
                        }
                        y_ij = if q0 == 0 { s } else { y_ij + s };
                    }
                    y[i * n + j] = y_ij;
                }
            }
            y
        })
        .collect();
    // and within float32 rounding of the sum in float64
    for (w, (y, n)) in ws.iter().zip(want.iter().zip(ns)) {
        for i in 0..m {
            for j in 0..n {
                let terms = (0..k).map(|q| f64::from(x[i * k + q]) * f64::from(w[j * k + q]));
                let (s, abs): (f64, f64) = (terms.clone().sum(), terms.map(f64::abs).sum());
                assert!((f64::from(y[i * n + j]) - s).abs() <= 1e-6 * abs);
            }
        }
    }
    let mut got: Vec<Vec<f32>> = ns.iter().map(|n| vec![f32::NAN; m * n]).collect();
    let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|g| g.as_mut_slice()).collect();
    pk::matmul_packed(&x, &packed, &mut outs);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(bits(g), bits(w), "portable");
    }
    for isa in Isa::supported() {
        let mut got: Vec<Vec<f32>> = ns.iter().map(|n| vec![f32::NAN; m * n]).collect();
        let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|g| g.as_mut_slice()).collect();
        isa.matmul_packed(&x, &packed, &mut outs);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(bits(g), bits(w), "{isa}");
        }
        // into outputs not yet written (NaN here, so that any element left unwritten shows)
        let mut got: Vec<Vec<MaybeUninit<f32>>> = ns
            .iter()
            .map(|n| vec![MaybeUninit::new(f32::NAN); m * n])
            .collect();
        let mut outs: Vec<&mut [MaybeUninit<f32>]> =
            got.iter_mut().map(|g| g.as_mut_slice()).collect();
        isa.matmul_packed_uninit(&x, &packed, &mut outs);
        for (g, w) in got.iter().zip(&want) {
            // SAFETY: every element was initialised (to NaN) before the call, which writes only
            // floats.
            #[allow(unsafe_code)]
            let g: Vec<f32> = g.iter().map(|v| unsafe { v.assume_init() }).collect();
            assert_eq!(bits(&g), bits(w), "{isa} uninit");
        }
    }
    assert!(PackedMatrix::new(0, &parts).is_err());
    assert!(PackedMatrix::new(k, &[]).is_err());
    assert!(PackedMatrix::new(k, &[&x[..k + 1]]).is_err());
}

#[test]
fn a_packed_matrix_past_a_huge_page_starts_on_one_and_computes_the_same() {
    use crate::huge::{HugePageBuffer, HUGE_PAGE};
    use crate::packed::{self as pk, PackedMatrix, PANEL};
    // a buffer of 1.5 huge pages: zeros, starting on a 2 MiB page on Linux; small and empty ones
    let v = HugePageBuffer::zeroed(HUGE_PAGE * 3 / 8);
    assert!(v.len() == HUGE_PAGE * 3 / 8 && v.iter().all(|&x| x == 0.0));
    if cfg!(target_os = "linux") {
        assert_eq!((v.as_ptr() as usize) % HUGE_PAGE, 0);
    }
    let mut small = HugePageBuffer::zeroed(100);
    small[99] = 1.0;
    assert_eq!((small.len(), small[98], small.clone()[99]), (100, 0.0, 1.0));
    assert!(HugePageBuffer::zeroed(0).is_empty());
    // a matrix of 2.4 MB: unpacked as given, equal to another packing and to its copy, and the
    // product of every instruction set that of the portable code
    let (m, k, n) = (3, 1024, 2 * PANEL * 6 + 5);
    let w: Vec<f32> = (0..n * k).map(|i| noise(i, 3)).collect();
    let x: Vec<f32> = (0..m * k).map(|i| noise(i, 4)).collect();
    let packed = PackedMatrix::new(k, &[&w]).unwrap();
    assert_eq!(packed.unpack(0), w);
    assert_eq!(packed, PackedMatrix::new(k, &[&w]).unwrap());
    assert_eq!(packed.clone(), packed);
    assert_ne!(packed, PackedMatrix::new(k, &[&x, &w]).unwrap());
    let mut want = vec![f32::NAN; m * n];
    pk::matmul_packed(&x, &packed, &mut [&mut want]);
    for isa in Isa::supported() {
        let mut got = vec![f32::NAN; m * n];
        isa.matmul_packed(&x, &packed, &mut [&mut got]);
        assert_eq!(bits(&got), bits(&want), "{isa}");
    }
}
