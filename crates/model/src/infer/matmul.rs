//! The `gemm` product of the pass ([`matmul`]): every affine map of a block. (The hand-written
//! kernels of the pass are `hyperlens-kernels`'s and, for the HYLA value networks,
//! `ops::fast::mix`'s; `attention.rs` says which the attention calls.)

/// `dst [m, n] = a [m, k] b [k, n]`, all row-major, by `gemm` on the calling thread (its AVX-512
/// kernels where the CPU has them).
///
/// # Panics
/// If a slice is shorter than its shape: the callers size every buffer from the model's config.
// The workspace denies `unsafe`; gemm's entry point takes raw pointers and strides.
#[allow(unsafe_code)]
pub(super) fn matmul(dst: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) {
    assert!(
        dst.len() >= m * n && a.len() >= m * k && b.len() >= k * n,
        "matmul: buffers shorter than [{m}, {k}] x [{k}, {n}]"
    );
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the assertion above keeps every element that gemm reads or writes, `a[i k + p]`,
    // `b[p n + j]` and `dst[i n + j]` for `i < m`, `p < k`, `j < n` (row strides `k`, `n`, `n`,
    // column strides 1), inside its slice; `dst` is borrowed mutably, so it aliases neither input.
    // With `read_dst` false gemm writes `dst` without reading it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}
