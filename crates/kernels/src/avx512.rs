//! The kernels with AVX-512F (x86-64): the analyses' distances and t-SNE gradient, in the
//! [`portable`] code's operation order (no FMA), so with its bits.
//!
//! Every function here needs a CPU with AVX-512F: call it through [`crate::Isa`].

use crate::portable::{self, PaddedTail, TSNE_LANES};

/// [`portable::squared_distances`] compiled with AVX-512F.
///
/// # Safety
/// The CPU must have AVX-512F ([`crate::Isa::avx512`]).
#[target_feature(enable = "avx512f")]
pub fn squared_distances(rows: &[f64], xt: &[f64], out: &mut [f64]) {
    portable::squared_distances(rows, xt, out)
}

/// [`portable::tsne_gradient_row`] with AVX-512F, written with its intrinsics: one register holds
/// the `TSNE_LANES` = 8 lanes of each partial sum, and the operations are
/// [`crate::avx2::tsne_gradient_row`]'s in the same order (no FMA), so the same bits. The portable
/// loop compiled for AVX-512 was left shuffling lanes as the AVX2 one was: on an Intel Xeon with
/// AVX-512 the fuzzy-logic checkpoints' t-SNE in the report was several times slower than with
/// AVX2 on an AMD EPYC (`CHANGELOG.md`, performance history).
///
/// # Safety
/// The CPU must have AVX-512F ([`crate::Isa::avx512`]).
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
pub fn tsne_gradient_row(xi: f64, zi: f64, xs: &[f64], zs: &[f64], prow: &[f64]) -> [f64; 5] {
    use std::arch::x86_64::{
        __m512d, _mm512_add_pd, _mm512_div_pd, _mm512_loadu_pd, _mm512_mul_pd, _mm512_set1_pd,
        _mm512_setzero_pd, _mm512_storeu_pd, _mm512_sub_pd,
    };
    const LANES: usize = TSNE_LANES;
    let n = xs.len();
    let tail = PaddedTail::new(xi, zi, xs, zs, prow);
    let (vxi, vzi, one) = (_mm512_set1_pd(xi), _mm512_set1_pd(zi), _mm512_set1_pd(1.0));
    let mut acc: [__m512d; 5] = [_mm512_setzero_pd(); 5];
    for c in (0..n).step_by(LANES) {
        let (x, z, p) = tail.chunk(c, xs, zs, prow);
        // SAFETY: `x`, `z` and `p` are arrays of LANES = 8 floats, one 512-bit load each.
        let (x, z, p) = unsafe {
            (
                _mm512_loadu_pd(x.as_ptr()),
                _mm512_loadu_pd(z.as_ptr()),
                _mm512_loadu_pd(p.as_ptr()),
            )
        };
        let dx = _mm512_sub_pd(vxi, x);
        let dz = _mm512_sub_pd(vzi, z);
        let d2 = _mm512_add_pd(
            _mm512_add_pd(one, _mm512_mul_pd(dx, dx)),
            _mm512_mul_pd(dz, dz),
        );
        let w = _mm512_div_pd(one, d2);
        let pw = _mm512_mul_pd(p, w);
        let ww = _mm512_mul_pd(w, w);
        acc[0] = _mm512_add_pd(acc[0], _mm512_mul_pd(pw, dx));
        acc[1] = _mm512_add_pd(acc[1], _mm512_mul_pd(pw, dz));
        acc[2] = _mm512_add_pd(acc[2], _mm512_mul_pd(ww, dx));
        acc[3] = _mm512_add_pd(acc[3], _mm512_mul_pd(ww, dz));
        acc[4] = _mm512_add_pd(acc[4], w);
    }
    let mut lanes = [[0.0f64; LANES]; 5];
    for (out, v) in lanes.iter_mut().zip(&acc) {
        // SAFETY: `out` holds LANES = 8 floats, one 512-bit store.
        unsafe { _mm512_storeu_pd(out.as_mut_ptr(), *v) };
    }
    portable::row_sums(&lanes, n)
}
