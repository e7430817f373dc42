//! `x W^T` for a PyTorch-layout matrix on the CPU in float32, its rows split evenly over the
//! threads (rayon), and batched products, the batch split over the threads; each part one
//! single-threaded call of the `gemm` crate (candle's own products hand gemm its threads instead);
//! and products with a matrix packed once ([`hyperlens_kernels::PackedMatrix`], the language
//! models' constant projections), their rows split over the threads, each part one call of
//! [`Isa::matmul_packed`]. Inference only (no gradient).

// The workspace denies `unsafe`; `gemm::gemm` takes raw pointers and strides.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use candle_core::{Device, Tensor};
use gemm::{gemm, Parallelism};
use hyperlens_kernels::packed::TILE_ROWS;
use hyperlens_kernels::{Isa, PackedMatrix};
use rayon::prelude::*;

use super::cpu::with_tensor;
use super::cpu_f32;
use crate::error::Result;

/// One task of [`matmul_packed_then`]: its first row, its rows of `x`, and its blocks of the
/// (uninitialised) products and of the epilogue's outputs.
type Task<'a> = (
    usize,
    &'a [f32],
    Vec<&'a mut [MaybeUninit<f32>]>,
    Vec<&'a mut [MaybeUninit<f32>]>,
);

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
                    // `w` is `n` rows of `k`, read as the `k x n` matrix `W^T`
                    strided_product(rows, n, k, y, n, x, w, 1, k, 1.0);
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

/// `x W_i^T` for every matrix of the packed `w` over the last axis of `x`, the rows of `x` split
/// evenly over the threads (rayon; whole tiles of [`TILE_ROWS`] rows), each part one call of
/// [`Isa::matmul_packed`] (no packing per call, no copy of the weights per thread):
/// [`matmul_packed_then`] without an epilogue.
///
/// # Shapes
/// `x [..., K]` float32 on the CPU, `w` of inner width `K` -> one `[..., n_i]` per matrix of `w`
/// (contiguous, on `device`).
///
/// # Errors
/// Candle errors; [`crate::ModelError::Input`] when `x` is not float32 on the CPU or its last
/// axis is not `K`.
pub(crate) fn matmul_packed(x: &Tensor, w: &PackedMatrix, device: &Device) -> Result<Vec<Tensor>> {
    Ok(matmul_packed_then(x, w, device, &[], |_, _, _| {})?.0)
}

/// [`matmul_packed`], then in each thread's task, on the rows it has just computed (while they
/// are still in its cache, and without another fork-join over the whole activation), the
/// epilogue `then(first row, products, outputs)`: `products[i]` the task's rows of product `i`
/// (`[rows, n_i]`), `outputs[j]` its rows of the new output `j` (`[rows, widths[j]]`, zeroed
/// first), `first row` the index of the task's first row in the flattened `x`. The elementwise
/// step after a product (a SwiGLU, a residual addition and norm) then runs where its input was
/// made.
///
/// # Shapes
/// `x [..., K]` float32 on the CPU, `w` of inner width `K` -> (one `[..., n_i]` per matrix of
/// `w`, one `[..., widths[j]]` per output), contiguous, on `device`.
///
/// # Errors
/// As [`matmul_packed`].
pub(crate) fn matmul_packed_then(
    x: &Tensor,
    w: &PackedMatrix,
    device: &Device,
    widths: &[usize],
    then: impl Fn(usize, &[&[f32]], &mut [&mut [f32]]) + Sync,
) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let k = w.k();
    let dims = x.dims();
    if !cpu_f32(x) || dims.last() != Some(&k) {
        return Err(crate::ModelError::Input(format!(
            "packed product: input {:?} {:?}, expected float32 on the CPU with last axis {k}",
            dims,
            x.dtype()
        )));
    }
    let m = x.elem_count() / k;
    let threads = rayon::current_num_threads().max(1);
    let per = m.div_ceil(threads).div_ceil(TILE_ROWS).max(1) * TILE_ROWS;
    let ns: Vec<usize> = (0..w.parts()).map(|i| w.rows(i)).collect();
    let isa = Isa::detected();
    // The outputs, uninitialised: `Isa::matmul_packed_uninit` writes every element (with
    // AVX-512 without a zero-fill first; `super::fresh`), the epilogue's are zeroed in the task.
    let mut ys: Vec<Vec<f32>> = ns.iter().map(|n| Vec::with_capacity(m * n)).collect();
    let mut es: Vec<Vec<f32>> = widths.iter().map(|n| Vec::with_capacity(m * n)).collect();
    with_tensor(x, |x| {
        // Per task: its first row, its rows of `x`, of every product and of every output.
        let mut tasks: Vec<Task<'_>> = x
            .chunks(per * k)
            .enumerate()
            .map(|(i, x)| (i * per, x, Vec::new(), Vec::new()))
            .collect();
        for (y, n) in ys.iter_mut().zip(&ns) {
            let spare = &mut y.spare_capacity_mut()[..m * n];
            for (task, y) in tasks.iter_mut().zip(spare.chunks_mut(per * n)) {
                task.2.push(y);
            }
        }
        for (e, n) in es.iter_mut().zip(widths) {
            let spare = &mut e.spare_capacity_mut()[..m * n];
            for (task, e) in tasks.iter_mut().zip(spare.chunks_mut((per * n).max(1))) {
                task.3.push(e);
            }
        }
        tasks.into_par_iter().for_each(|(row, x, mut outs, extra)| {
            isa.matmul_packed_uninit(x, w, &mut outs);
            // SAFETY: `matmul_packed_uninit` wrote every element of each block (its contract),
            // `MaybeUninit<f32>` has the layout of `f32`, and the slices reborrow the blocks.
            let ins: Vec<&[f32]> = outs
                .iter()
                .map(|o| unsafe { std::slice::from_raw_parts(o.as_ptr().cast::<f32>(), o.len()) })
                .collect();
            let mut news: Vec<&mut [f32]> = extra
                .into_iter()
                .map(|e| {
                    e.fill(MaybeUninit::new(0.0));
                    // SAFETY: every element of `e` was just initialised (to 0.0); as above.
                    unsafe { std::slice::from_raw_parts_mut(e.as_mut_ptr().cast::<f32>(), e.len()) }
                })
                .collect();
            then(row, &ins, &mut news);
        });
    })?;
    for (y, n) in ys.iter_mut().zip(&ns).chain(es.iter_mut().zip(widths)) {
        // SAFETY: the capacity is `m * n`, and the tasks' blocks of the spare capacity cover it
        // (`per * n` floats each, `x`'s rows in blocks of `per`); `matmul_packed_uninit` wrote
        // every element of each product's block and each task zeroed its outputs' blocks, and
        // all the tasks have returned.
        unsafe { y.set_len(m * n) };
    }
    let tensors = |vs: Vec<Vec<f32>>, ns: &[usize]| -> Result<Vec<Tensor>> {
        let mut shape = dims.to_vec();
        vs.into_iter()
            .zip(ns)
            .map(|(y, &n)| {
                if let Some(last) = shape.last_mut() {
                    *last = n;
                }
                Ok(Tensor::from_vec(y, shape.as_slice(), device)?)
            })
            .collect()
    };
    Ok((tensors(ys, &ns)?, tensors(es, widths)?))
}

/// Batched products `y[i] = (a[i] x[i]) * scale`, the batch split over the threads (rayon), each
/// product one single-threaded gemm call (candle's batched product hands gemm both threads for
/// every one of the small products of an attention), the scale gemm's factor of the product (the
/// bits of the product multiplied by `scale` after it, without a pass of its own).
///
/// # Shapes
/// `a [..., M, K]` (made contiguous), `x [..., K, N]` with the same leading axes, read through its
/// strides (one stride per leading axis that steps the flattened batch evenly, as a contiguous
/// tensor or its transpose has) -> `[..., M, N]` (contiguous).
///
/// # Errors
/// Candle errors; `Ok(None)` when the inputs are not float32 on the CPU, the shapes do not match,
/// or `x`'s batch is not evenly strided.
pub(crate) fn batched_matmul(a: &Tensor, x: &Tensor, scale: f64) -> Result<Option<Tensor>> {
    let (ad, xd) = (a.dims(), x.dims());
    let r = ad.len();
    if !cpu_f32(a) || !cpu_f32(x) || r < 3 || xd.len() != r || ad[..r - 2] != xd[..r - 2] {
        return Ok(None);
    }
    let (m, k, n) = (ad[r - 2], ad[r - 1], xd[r - 1]);
    if xd[r - 2] != k || m == 0 || k == 0 || n == 0 {
        return Ok(None);
    }
    let batch: usize = ad[..r - 2].iter().product();
    let (storage, layout) = x.storage_and_layout();
    let candle_core::Storage::Cpu(storage) = &*storage else {
        return Ok(None);
    };
    let st = layout.stride();
    // The flattened batch must step evenly: each leading axis's stride is the next one's times
    // its size.
    let b_stride = st[r - 3];
    if (0..r - 3).any(|i| st[i] != st[i + 1] * xd[i + 1]) {
        return Ok(None);
    }
    let (x_rs, x_cs) = (st[r - 2], st[r - 1]);
    let all = storage.as_slice::<f32>()?;
    let start = layout.start_offset();
    // The last element any product reads must lie inside the storage.
    let last = start + (batch - 1) * b_stride + (k - 1) * x_rs + (n - 1) * x_cs;
    if last >= all.len() {
        return Ok(None);
    }
    let beta = scale as f32;
    let y = with_tensor(a, |a| {
        let mut y = vec![0f32; batch * m * n];
        y.par_chunks_mut(m * n)
            .zip(a.par_chunks(m * k))
            .enumerate()
            .for_each(|(i, (y, a))| {
                let xp = &all[start + i * b_stride..];
                strided_product(m, n, k, y, n, a, xp, x_rs, x_cs, beta);
            });
        y
    })?;
    let mut out = xd.to_vec();
    out[r - 2] = m;
    Ok(Some(Tensor::from_vec(y, out, x.device())?))
}

/// The attention's value mixing with its output in token-major layout: `y[b, q, h] = a[b, h, q]
/// v[b, h / (H / H_kv)]` (query head `h` reads key/value head `h / (H / H_kv)`), one single-threaded
/// gemm call per query head writing its columns of `y` through their strides, the batch split
/// over the threads (rayon). `v` is read through its strides (the head view of a projection's
/// output needs no copy), and `y` is already the `[B, T, H d]` input of the output projection
/// (no transpose copy).
///
/// # Shapes
/// `a [B, H, Q, K]` (made contiguous), `v [B, H_kv, K, N]` (any strides) -> `[B, Q, H, N]`
/// (contiguous).
///
/// # Errors
/// Candle errors; `Ok(None)` when the inputs are not float32 on the CPU, the shapes do not match
/// or `H_kv` does not divide `H`.
pub(crate) fn head_values(a: &Tensor, v: &Tensor) -> Result<Option<Tensor>> {
    let (Ok((b, h, q, k)), Ok((vb, hkv, vk, n))) = (a.dims4(), v.dims4()) else {
        return Ok(None);
    };
    if !cpu_f32(a) || !cpu_f32(v) || vb != b || vk != k || hkv == 0 || h % hkv != 0 {
        return Ok(None);
    }
    if b * h * q * k * n == 0 {
        return Ok(None);
    }
    let group = h / hkv;
    let (storage, layout) = v.storage_and_layout();
    let candle_core::Storage::Cpu(storage) = &*storage else {
        return Ok(None);
    };
    let st = layout.stride();
    let all = storage.as_slice::<f32>()?;
    let start = layout.start_offset();
    // The last element any product reads must lie inside the storage.
    let last = start + (b - 1) * st[0] + (hkv - 1) * st[1] + (k - 1) * st[2] + (n - 1) * st[3];
    if last >= all.len() {
        return Ok(None);
    }
    let a = a.contiguous()?;
    let y = with_tensor(&a, |a| {
        let mut y = vec![0f32; b * q * h * n];
        y.par_chunks_mut(q * h * n)
            .zip(a.par_chunks(h * q * k))
            .enumerate()
            .for_each(|(bi, (y, a))| {
                for hh in 0..h {
                    let a = &a[hh * q * k..][..q * k];
                    let vp = &all[start + bi * st[0] + (hh / group) * st[1]..];
                    let yp = &mut y[hh * n..];
                    // this batch's `q` rows of `h n`, head `hh`'s `n` columns of each
                    strided_product(q, n, k, yp, h * n, a, vp, st[2], st[3], 1.0);
                }
            });
        y
    })?;
    Ok(Some(Tensor::from_vec(y, (b, q, h, n), v.device())?))
}

/// `dst = scale · lhs rhs` by one single-threaded call of the `gemm` crate: `lhs` is `m`
/// contiguous rows of `k`, `rhs` the `k x n` matrix read at `rhs[p * rhs_rs + c * rhs_cs]`, and
/// row `r` of the product is written to `dst[r * dst_rs..][..n]` (the rest of `dst` untouched).
///
/// # Shapes
/// `lhs [m, k]`; `rhs` `k x n` through its strides; `dst` `m` rows of stride `dst_rs >= n`.
///
/// # Panics
/// When a slice is too short for its reads or writes, or `dst_rs < n` (rows that would overlap):
/// callers size them, so a panic is a bug here, never bad input.
#[allow(clippy::too_many_arguments)]
fn strided_product(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    lhs: &[f32],
    rhs: &[f32],
    rhs_rs: usize,
    rhs_cs: usize,
    scale: f32,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(
        lhs.len() >= m * k
            && rhs.len() > (k - 1) * rhs_rs + (n - 1) * rhs_cs
            && dst_rs >= n
            && dst.len() >= (m - 1) * dst_rs + n,
        "strided_product: slices too short for a {m} x {k} by {k} x {n} product"
    );
    // SAFETY: `lhs` holds `m` rows of `k` (row stride `k`, column stride 1); `rhs` is read at
    // `p * rhs_rs + c * rhs_cs` for `p < k`, `c < n`, the last inside it; `dst` is written at
    // `r * dst_rs + c` for `r < m`, `c < n`, the last at `(m - 1) dst_rs + n - 1`, inside it, and
    // `dst_rs >= n` keeps the rows apart (all checked above); `dst` is borrowed mutably, so
    // nothing else reads or writes it meanwhile.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            false,
            lhs.as_ptr(),
            1,
            k as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            0.0,
            scale,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    #[test]
    fn batched_products_equal_candles_for_a_transposed_and_a_contiguous_right_side() {
        let dev = Device::Cpu;
        let a = Tensor::randn(0f32, 1.0, (2, 3, 12, 5), &dev).unwrap();
        let k = Tensor::randn(0f32, 1.0, (2, 3, 7, 5), &dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (2, 3, 5, 4), &dev).unwrap();
        for x in [k.t().unwrap(), v] {
            let got = batched_matmul(&a, &x, 1.0).unwrap().unwrap();
            let want = a.matmul(&x).unwrap();
            // the scale is the product's factor: the bits of the product, then the scaling
            let scaled = batched_matmul(&a, &x, 0.125).unwrap().unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                v.iter().map(|x| x.to_bits()).collect()
            };
            assert_eq!(bits(&scaled), bits(&(&got * 0.125).unwrap()));
            assert_eq!(got.dims(), want.dims());
            let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap();
            assert!(diff.to_scalar::<f32>().unwrap() < 1e-5);
        }
        // a batch that does not step evenly (a transposed batch) is left to candle
        let x = Tensor::randn(0f32, 1.0, (3, 2, 5, 4), &dev)
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        assert!(batched_matmul(&a, &x, 1.0).unwrap().is_none());
    }

    #[test]
    fn head_values_are_the_grouped_products_in_token_major_layout() {
        let dev = Device::Cpu;
        // 6 query heads on 2 key/value heads; `v` a transposed view, as the projection's heads
        let a = Tensor::randn(0f32, 1.0, (2, 6, 5, 7), &dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (2, 7, 2, 4), &dev)
            .unwrap()
            .transpose(1, 2)
            .unwrap();
        let got = head_values(&a, &v).unwrap().unwrap();
        assert_eq!(got.dims(), &[2, 5, 6, 4]);
        for bi in 0..2 {
            for hh in 0..6 {
                let want = a
                    .get(bi)
                    .unwrap()
                    .get(hh)
                    .unwrap()
                    .matmul(
                        &v.get(bi)
                            .unwrap()
                            .get(hh / 3)
                            .unwrap()
                            .contiguous()
                            .unwrap(),
                    )
                    .unwrap();
                let g = got
                    .get(bi)
                    .unwrap()
                    .narrow(1, hh, 1)
                    .unwrap()
                    .squeeze(1)
                    .unwrap();
                let diff = (g - want).unwrap().abs().unwrap().max_all().unwrap();
                assert!(diff.to_scalar::<f32>().unwrap() < 1e-5, "{bi} {hh}");
            }
        }
        // key/value heads that do not divide the query heads are left to the caller
        let v3 = Tensor::randn(0f32, 1.0, (2, 4, 7, 4), &dev).unwrap();
        assert!(head_values(&a, &v3).unwrap().is_none());
    }

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
