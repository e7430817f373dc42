//! The host-side pieces of the fused CUDA kernels, on the CPU: the AdamW scalars' packing, the
//! slots' offsets, the launch sizes and the switch. (The kernels themselves are checked on a GPU
//! by `tests/model.rs`, `cuda_fused_kernels_match_the_cpu`.)

use super::*;

/// The scalars are the composed update's: `1 / (1 - beta^t)` in float64 rounded once, then each
/// model's rate rounded once, in that order.
#[test]
fn adamw_scalars_are_the_bias_corrections_then_the_rates() {
    let (b1, b2) = (0.9f64, 0.999f64);
    for t in [1u64, 2, 7, 1000, 156_250] {
        let lrs = [1e-3, 2.5e-4, 0.0];
        let s = adamw_scalars(b1, b2, t, &lrs);
        assert_eq!(s.len(), 2 + lrs.len());
        assert_eq!(s[0], (1.0 / (1.0 - b1.powf(t as f64))) as f32);
        assert_eq!(s[1], (1.0 / (1.0 - b2.powf(t as f64))) as f32);
        for (x, &lr) in s[2..].iter().zip(&lrs) {
            assert_eq!(*x, lr as f32);
        }
    }
    // The first update's corrections are 1 / (1 - beta): 10 and 1000 (to float32).
    let s = adamw_scalars(b1, b2, 1, &[1.0]);
    assert!(
        (s[0] - 10.0).abs() < 1e-5 && (s[1] - 1000.0).abs() < 1e-2,
        "{s:?}"
    );
    // Late in a run the corrections tend to 1.
    let s = adamw_scalars(b1, b2, 156_250, &[]);
    assert_eq!(s, vec![1.0, 1.0]);
}

/// The offsets are the prefix sums of the slots' lengths, ending with the row length; a row
/// that 32-bit offsets cannot hold gives none.
#[test]
fn slot_offsets_are_prefix_sums() {
    assert_eq!(slot_offsets(&[6, 3, 0, 4]), Some(vec![0, 6, 9, 9, 13]));
    assert_eq!(slot_offsets(&[]), Some(vec![0]));
    assert_eq!(slot_offsets(&[u32::MAX as usize, 1]), None);
    // The kernel's search (the last slot whose offset is <= i) on the host: every element falls
    // in the slot that holds it, empty slots included.
    let lens = [6usize, 3, 0, 4, 1];
    let off = slot_offsets(&lens).unwrap();
    let n = lens.len();
    for i in 0..off[n] {
        let (mut lo, mut hi) = (0usize, n);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if off[mid] <= i {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        assert!(off[lo] <= i && i < off[lo + 1], "element {i} in slot {lo}");
    }
}

/// The AdamW grid covers small updates with one block and bounds the blocks of large ones (the
/// kernel loops over the rest).
#[test]
fn adamw_grid_is_bounded() {
    assert_eq!(adamw_grid(0), (1, 256));
    assert_eq!(adamw_grid(1), (1, 256));
    assert_eq!(adamw_grid(257), (2, 256));
    assert_eq!(adamw_grid(400_000), (1563, 256));
    assert_eq!(adamw_grid(16 * 400_000), (4096, 256));
}

/// The mix kernels' launch: whole warps, the shared memory of `kernels.cu`'s layouts, and no
/// launch where a block would need more than 48 KiB.
#[test]
fn mix_launch_sizes() {
    // The base SRAVEN model: 16 heads, 36 tokens, head width 4.
    let l = mix_launch(16, 36, 36, 4).unwrap();
    assert_eq!(l.threads, 256);
    assert_eq!(l.forward_shared, 4 * (2 * 16 * 36 + 4 * 36));
    assert_eq!(
        l.backward_shared,
        4 * (4 * 16 * 36 + 2 * 36 + 3 * 4 * 36 + 16 * 4 + 16 + 16 * 36 * 4)
    );
    // Tiny problems still get a whole warp.
    let l = mix_launch(1, 1, 1, 1).unwrap();
    assert_eq!(l.threads, 32);
    assert!(l.threads.is_multiple_of(32));
    // Wide heads over many keys do not fit: the composed operations run.
    assert_eq!(mix_launch(8, 512, 512, 64), None);
    assert_eq!(mix_launch(0, 4, 4, 4), None);
}

/// `HYPERLENS_FUSED_CUDA`: opt-in. Unset, empty and `0` are off (the composed operations that have
/// run on a GPU), `1` on, anything else an error naming the variable.
#[test]
fn the_switch_is_off_unless_1() {
    assert!(!parse_switch(None).unwrap());
    assert!(!parse_switch(Some("")).unwrap());
    assert!(!parse_switch(Some("0")).unwrap());
    assert!(parse_switch(Some(" 1 ")).unwrap());
    assert!(parse_switch(Some("1")).unwrap());
    let e = parse_switch(Some("off")).unwrap_err().to_string();
    assert!(e.contains(FUSED_CUDA_ENV) && e.contains("`off`"), "{e}");
}

/// On the CPU (and in any build without the feature) nothing fused runs: the fused AdamW is
/// `None` and the mix keeps the CPU kernel.
#[test]
fn nothing_fused_runs_on_the_cpu() {
    let w = Tensor::zeros((2, 3), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    assert!(!available(&w).unwrap());
    assert!(FusedAdamW::new(&[w], &[6], 1, None, (0.9, 0.999, 1e-8))
        .unwrap()
        .is_none());
    assert!(FusedAdamW::new(&[], &[], 1, None, (0.9, 0.999, 1e-8))
        .unwrap()
        .is_none());
}

/// `hl_adamw_f32`'s arithmetic for one element, written out in Rust (float32, each operation
/// rounded once, as the kernel's `_rn` intrinsics do): `(theta, m, v)` after the update.
fn kernel_element(
    (theta, m, v, g): (f32, f32, f32, f32),
    decay: Option<f32>,
    (scale_m, scale_v, lr): (f32, f32, f32),
    [b1, omb1, b2, omb2, eps]: [f32; 5],
) -> (f32, f32, f32) {
    let m = (m * b1 + 0.0) + (g * omb1 + 0.0);
    let v = (v * b2 + 0.0) + ((g * g) * omb2 + 0.0);
    let num = m * scale_m + 0.0;
    let den = (v * scale_v + 0.0).sqrt() + eps;
    let mut u = num / den;
    if let Some(d) = decay {
        u += theta * d;
    }
    (theta - u * lr, m, v)
}

/// The kernel's order of operations gives the composed candle update's bits (the operations of
/// `hyperlens_train::AdamW::step_with` on its `[M, P]` state, here on the CPU), for two models
/// with their own rates and decays over three updates: the claim the CUDA test checks on a GPU.
#[test]
fn the_kernels_arithmetic_is_the_composed_updates() {
    use candle_core::{Device, Tensor};
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8f64);
    let consts = [
        b1 as f32,
        (1.0 - b1) as f32,
        b2 as f32,
        (1.0 - b2) as f32,
        eps as f32,
    ];
    let (models, p) = (2usize, 13usize);
    let lrs = [1e-2, 3e-3];
    let wave = |seed: f32, scale: f32| -> Vec<f32> {
        (0..models * p)
            .map(|i| scale * ((i as f32 * 0.731 + seed).sin()))
            .collect()
    };
    let decay: Vec<f32> = (0..models * p)
        .map(|i| if i % p < 6 { [0.1, 0.3][i / p] } else { 0.0 })
        .collect();
    let t = |v: &[f32]| Tensor::from_vec(v.to_vec(), (models, p), &Device::Cpu).unwrap();
    let (mut theta, mut m, mut v) = (wave(0.3, 1.0), wave(1.1, 0.01), wave(2.0, 1e-4));
    for x in v.iter_mut() {
        *x = x.abs();
    }
    let (mut tt, mut tm, mut tv) = (t(&theta), t(&m), t(&v));
    let lr_col = Tensor::from_vec(
        lrs.iter().map(|&x| x as f32).collect::<Vec<_>>(),
        (models, 1),
        &Device::Cpu,
    )
    .unwrap();
    let td = t(&decay);
    for step in 1..=3u64 {
        let g = wave(step as f32, 0.5);
        // The composed update.
        let tg = t(&g);
        let tf = step as f64;
        let (sm, sv) = (1.0 / (1.0 - b1.powf(tf)), 1.0 / (1.0 - b2.powf(tf)));
        tm = ((&tm * b1).unwrap() + (&tg * (1.0 - b1)).unwrap()).unwrap();
        tv = ((&tv * b2).unwrap() + (tg.sqr().unwrap() * (1.0 - b2)).unwrap()).unwrap();
        let update =
            ((&tm * sm).unwrap() / ((&tv * sv).unwrap().sqrt().unwrap() + eps).unwrap()).unwrap();
        let update = (update + (&tt * &td).unwrap()).unwrap();
        tt = (&tt - update.broadcast_mul(&lr_col).unwrap()).unwrap();
        // The kernel's arithmetic, element by element, from the packed scalars.
        let s = adamw_scalars(b1, b2, step, &lrs);
        for i in 0..models * p {
            let row = i / p;
            (theta[i], m[i], v[i]) = kernel_element(
                (theta[i], m[i], v[i], g[i]),
                Some(decay[i]),
                (s[0], s[1], s[2 + row]),
                consts,
            );
        }
    }
    let bits = |x: &Tensor| -> Vec<u32> {
        let x: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        x.iter().map(|y| y.to_bits()).collect()
    };
    let own = |x: &[f32]| -> Vec<u32> { x.iter().map(|y| y.to_bits()).collect() };
    assert_eq!(bits(&tt), own(&theta), "parameters");
    assert_eq!(bits(&tm), own(&m), "first moments");
    assert_eq!(bits(&tv), own(&v), "second moments");
}
