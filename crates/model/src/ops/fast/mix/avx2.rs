//! The AVX2 form of the evaluation-mode HYLA value network for [`crate::infer`]'s AVX2 kernels:
//! the same sums in the same order as the portable [`super::value_from_codes`] and
//! `hyperlens_kernels::portable::dot`, so the same bits. (It needs the mix's [`Plan`] and
//! [`Rows`], so it lives with the HYLA kernel rather than in `hyperlens_kernels::avx2`, whose
//! `dots` it calls.)

use hyperlens_kernels::avx2::dots;

use super::{value_from_codes, Plan, Rows};

/// [`value_from_codes`] written with the AVX2 intrinsics, for [`crate::infer`]'s AVX2 kernels:
/// the values come transposed and padded, `vt [H, d, Kp]` (`Kp` = `K` rounded up to a multiple of
/// 8, zero past `K`), so that the hidden units are whole vectors of keys (a query's codes past `K`
/// are read as zero by masked loads). Every hidden unit is the same sum over the heads in the same
/// order, and every output the same `dot` (eight lanes over the whole chunks of 8 keys, summed in
/// lane order, plus the remaining keys summed in order), products and sums rounded apart (no FMA):
/// the same bits as [`value_from_codes`]. The portable loops, compiled for AVX2, spent most of
/// their instructions on bounds checks and 4-key tails (`CHANGELOG.md`, performance history).
///
/// Head widths other than 1, 2, 4 and 8 take [`value_from_codes`].
///
/// # Shapes
/// `a [H, Q, K]`, `vt [H, d, Kp]`, `o [Q, H, d]`; the queries from `q0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn value_from_codes_avx2(
    p: &Plan,
    q0: usize,
    a: &[f32],
    vt: &[f32],
    o: &mut [f32],
    rows: &mut Rows,
) {
    match p.d {
        1 => value_rows_avx2::<1>(p, q0, a, vt, o, rows),
        2 => value_rows_avx2::<2>(p, q0, a, vt, o, rows),
        4 => value_rows_avx2::<4>(p, q0, a, vt, o, rows),
        8 => value_rows_avx2::<8>(p, q0, a, vt, o, rows),
        _ => value_from_codes(p, q0, a, (vt, p.k.div_ceil(8) * 8), o, rows),
    }
}

/// [`value_from_codes_avx2`] for head width `D`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn value_rows_avx2<const D: usize>(
    p: &Plan,
    q0: usize,
    a: &[f32],
    vt: &[f32],
    o: &mut [f32],
    rows: &mut Rows,
) {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_cmpgt_epi32, _mm256_loadu_ps, _mm256_maskload_ps,
        _mm256_max_ps, _mm256_mul_ps, _mm256_set1_epi32, _mm256_setr_epi32, _mm256_setzero_ps,
        _mm256_storeu_ps,
    };
    const L: usize = 8;
    let (h, q, k) = (p.h, p.q, p.k);
    let (full, chunks) = (k / L, k.div_ceil(L));
    let kp = chunks * L;
    assert!(
        p.d == D
            && q0 <= q
            && a.len() >= h * q * k
            && vt.len() >= h * D * kp
            && o.len() >= q * h * D
            && rows.hid_padded.len() >= D * kp,
        "value_from_codes_avx2: a plan of {h} heads, {q} queries, {k} keys and width {D} against {} codes, {} values, {} outputs",
        a.len(),
        vt.len(),
        o.len()
    );
    // The lanes of the last, partial chunk that hold keys.
    let tail_mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32((k - full * L) as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let (ap, vp) = (a.as_ptr(), vt.as_ptr());
    let zero = _mm256_setzero_ps();
    for i in q0..q {
        let hid = rows.hid_padded.as_mut_ptr();
        // The hidden units, chunk by chunk: `pre[e, j] = sum_h a[h, i, j] vt[h, e, j]`.
        for c in 0..chunks {
            let mut pre = [zero; D];
            for hh in 0..h {
                let at = (hh * q + i) * k + c * L;
                // SAFETY: a whole chunk `c < full` ends at `(hh q + i) k + 8 c + 8 <= (hh q + i + 1)
                // k <= a.len()`; the partial chunk loads only its `k - 8 full` keys.
                let codes: __m256 = unsafe {
                    if c < full {
                        _mm256_loadu_ps(ap.add(at))
                    } else {
                        _mm256_maskload_ps(ap.add(at), tail_mask)
                    }
                };
                for (e, pre) in pre.iter_mut().enumerate() {
                    // SAFETY: `(hh D + e) Kp + 8 c + 8 <= h D Kp <= vt.len()`.
                    let v = unsafe { _mm256_loadu_ps(vp.add((hh * D + e) * kp + c * L)) };
                    *pre = _mm256_add_ps(*pre, _mm256_mul_ps(codes, v));
                }
            }
            for (e, &pre) in pre.iter().enumerate() {
                let y = if p.relu {
                    _mm256_max_ps(pre, zero)
                } else {
                    pre
                };
                // SAFETY: `e Kp + 8 c + 8 <= D Kp <= rows.hid_padded.len()`.
                unsafe { _mm256_storeu_ps(hid.add(e * kp + c * L), y) };
            }
        }
        // The outputs `o[i, h, e] = dot(a[h, i, ..], hid[e, ..])`.
        for hh in 0..h {
            dots::<D>(
                &a[(hh * q + i) * k..][..k],
                (&rows.hid_padded, kp),
                &mut o[(i * h + hh) * D..][..D],
            );
        }
    }
}
