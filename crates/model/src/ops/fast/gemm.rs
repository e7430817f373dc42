//! `x W^T` for a PyTorch-layout matrix on the CPU in float32, its rows split evenly over the
//! threads (rayon), each part one single-threaded call of the `gemm` crate (candle's own products
//! hand gemm its threads instead). Inference only (no gradient).

// The workspace denies `unsafe`; `gemm::gemm` takes raw pointers and strides.
#![allow(unsafe_code)]

use candle_core::Tensor;
use gemm::{gemm, Parallelism};
use rayon::prelude::*;

use super::cpu::with_tensor;
use super::cpu_f32;
use crate::error::Result;

/// Fewest rows per thread for the split (below it candle's product runs).
const MIN_ROWS: usize = 64;

/// `x W^T` over the last axis of `x`.
///
/// # Shapes
/// `x [..., K]`, `w [N, K]` -> `[..., N]` (contiguous).
///
/// # Errors
/// Candle errors; `Ok(None)` when the inputs are not float32 on the CPU, the sizes do not match,
/// or there are fewer than 64 rows per thread.
pub(crate) fn matmul_t(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    let threads = rayon::current_num_threads().max(1);
    let Ok((n, k)) = w.dims2() else {
        return Ok(None);
    };
    let dims = x.dims();
    if !cpu_f32(x) || !cpu_f32(w) || dims.last() != Some(&k) || k == 0 || n == 0 {
        return Ok(None);
    }
    let m = x.elem_count() / k;
    if m < MIN_ROWS * threads {
        return Ok(None);
    }
    let per = m.div_ceil(threads);
    let y = with_tensor(x, |x| {
        with_tensor(w, |w| {
            let mut y = vec![0f32; m * n];
            y.par_chunks_mut(per * n)
                .zip(x.par_chunks(per * k))
                .for_each(|(y, x)| {
                    let rows = y.len() / n;
                    // SAFETY: `x` holds `rows` rows of `k`, `w` `n` rows of `k` (read as the
                    // `k x n` matrix `W^T`: column stride `k`, row stride 1), `y` `rows` rows of
                    // `n`; every pointer stays inside its slice and `y` is written only here.
                    unsafe {
                        gemm(
                            rows,
                            n,
                            k,
                            y.as_mut_ptr(),
                            1,
                            n as isize,
                            false,
                            x.as_ptr(),
                            1,
                            k as isize,
                            w.as_ptr(),
                            k as isize,
                            1,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            Parallelism::None,
                        )
                    }
                });
            y
        })
    })??;
    let mut out = dims.to_vec();
    if let Some(last) = out.last_mut() {
        *last = n;
    }
    Ok(Some(Tensor::from_vec(y, out, x.device())?))
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    #[test]
    fn the_split_product_equals_candles() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (3, 101, 40), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (24, 40), &dev).unwrap();
        let want = x
            .reshape((303, 40))
            .unwrap()
            .matmul(&w.t().unwrap())
            .unwrap();
        let got = matmul_t(&x, &w).unwrap();
        let threads = rayon::current_num_threads();
        if 303 < MIN_ROWS * threads {
            assert!(got.is_none());
            return;
        }
        let got = got.unwrap().reshape((303, 24)).unwrap();
        let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-4);
    }
}
