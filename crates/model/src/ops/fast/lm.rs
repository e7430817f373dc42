//! CPU kernels of the imported language models' blocks (`crate::lm::layers`), float32, inference
//! only (no gradient): the causal softmax of a block of attention scores, the SwiGLU of a Llama
//! MLP and the rotary embedding of a strided view, each one pass over its rows in parallel (rayon,
//! `super::fresh`) with the kernels of `hyperlens_kernels` ([`Isa::softmax_prefix`],
//! [`Isa::silu_mul`], [`Isa::rope_half`]); and the RMSNorm of a Llama block, with the residual
//! addition before it in the same pass ([`Isa::add_rms_norm`]). In candle each is several
//! passes: the mask's `where_cond` and the softmax; the SiLU and the product; the copy of the heads
//! and the rotation; the addition and the norm (whose sum of squares is one serial chain per row).
//!
//! Each returns `None` for a tensor that is not float32 on the CPU (the caller then takes candle's
//! form).

// The workspace denies `unsafe`: the rotated heads are written by the tasks through one pointer.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use candle_core::{Device, Tensor};
use hyperlens_kernels::{Isa, PackedMatrix};

use super::cpu::with_tensor;
use super::cpu_f32;
use super::fresh::{fresh, fresh_blocks};
use super::gemm::matmul_packed_then;
use crate::error::Result;

/// Rows of scores per parallel task of [`causal_softmax`].
const SOFTMAX_ROWS: usize = 64;
/// Elements per parallel task of [`swiglu`].
const SWIGLU_ELEMS: usize = 16_384;
/// Rows per parallel task of [`rms_norm`].
const NORM_TASK_ROWS: usize = 32;

/// The RMSNorm of each row of `x` with the gain `w` ([`Isa::rms_norm`], candle-nn's `rms_norm`
/// with its bits), or with `residual` first the residual addition `x + residual` and the RMSNorm
/// of that sum in the same pass ([`Isa::add_rms_norm`]): the two steps between a pre-norm
/// block's sublayers in one pass over the rows.
///
/// # Shapes
/// `x [..., D]`, `residual` of `x`'s shape, `w [D]` -> `(x + residual, its norm)` (or
/// `(x, its norm)` without `residual`), each of `x`'s shape (contiguous).
///
/// # Errors
/// Candle errors; `Ok(None)` when an input is not float32 on the CPU, the shapes differ, or `w`
/// is not `[D]`.
pub(crate) fn rms_norm(
    x: &Tensor,
    residual: Option<&Tensor>,
    w: &Tensor,
    eps: f32,
) -> Result<Option<(Tensor, Tensor)>> {
    let d = w.elem_count();
    let fits = |t: &Tensor| cpu_f32(t) && t.dims().last() == Some(&d);
    if !fits(x) || !cpu_f32(w) || w.rank() != 1 || d == 0 {
        return Ok(None);
    }
    if residual.is_some_and(|r| !cpu_f32(r) || r.shape() != x.shape()) {
        return Ok(None);
    }
    let isa = Isa::detected();
    let block = NORM_TASK_ROWS * d;
    let (sum, normed) = with_tensor(x, |h| {
        with_tensor(w, |w| match residual {
            None => Ok::<_, candle_core::Error>((
                None,
                fresh(h.len(), block, |b, out| {
                    isa.rms_norm(&h[b * block..][..out.len()], w, eps, out);
                }),
            )),
            Some(r) => with_tensor(r, |y| {
                let mut vs = fresh_blocks(&[h.len(), h.len()], &[block, block], |b, outs| {
                    if let [sum, out] = outs {
                        let lo = b * block;
                        let n = sum.len();
                        isa.add_rms_norm(&h[lo..][..n], &y[lo..][..n], w, eps, sum, out);
                    }
                });
                let normed = vs.pop().unwrap_or_default();
                (vs.pop(), normed)
            }),
        })
    })???;
    let normed = Tensor::from_vec(normed, x.shape(), x.device())?;
    let sum = match sum {
        Some(s) => Tensor::from_vec(s, x.shape(), x.device())?,
        None => x.clone(),
    };
    Ok(Some((sum, normed)))
}

/// The softmax of each query row of `scores` over its keys up to the query (key `j <= i` for
/// query `i`), 0 above the diagonal: the causal softmax attention's pattern.
///
/// # Shapes
/// `scores [..., T, T]` -> `[..., T, T]` (contiguous).
///
/// # Errors
/// Candle errors; `Ok(None)` when `scores` is not float32 on the CPU or not square in its last two
/// axes.
pub(crate) fn causal_softmax(scores: &Tensor) -> Result<Option<Tensor>> {
    let dims = scores.dims();
    let r = dims.len();
    if !cpu_f32(scores) || r < 2 || dims[r - 1] != dims[r - 2] || dims[r - 1] == 0 {
        return Ok(None);
    }
    let t = dims[r - 1];
    let isa = Isa::detected();
    let out = with_tensor(scores, |s| {
        let len = SOFTMAX_ROWS * t;
        fresh(s.len(), len, |b, a| {
            let s = &s[b * len..][..a.len()];
            for (row, (s, a)) in s.chunks_exact(t).zip(a.chunks_exact_mut(t)).enumerate() {
                let i = (b * SOFTMAX_ROWS + row) % t;
                isa.softmax_prefix(s, i + 1, a);
            }
        })
    })?;
    Ok(Some(Tensor::from_vec(
        out,
        scores.shape(),
        scores.device(),
    )?))
}

/// The SwiGLU of a Llama MLP, `silu(pre) * lin` elementwise.
///
/// # Shapes
/// `pre`, `lin` of one shape -> that shape (contiguous).
///
/// # Errors
/// Candle errors; `Ok(None)` when the inputs are not float32 on the CPU or differ in shape.
pub(crate) fn swiglu(pre: &Tensor, lin: &Tensor) -> Result<Option<Tensor>> {
    if !cpu_f32(pre) || !cpu_f32(lin) || pre.shape() != lin.shape() {
        return Ok(None);
    }
    let isa = Isa::detected();
    let out = with_tensor(pre, |g| {
        with_tensor(lin, |u| {
            fresh(g.len(), SWIGLU_ELEMS, |b, y| {
                let lo = b * SWIGLU_ELEMS;
                isa.silu_mul(&g[lo..][..y.len()], &u[lo..][..y.len()], y);
            })
        })
    })??;
    Ok(Some(Tensor::from_vec(out, pre.shape(), pre.device())?))
}

/// The rotary embedding of every head row of `x` in the half-split convention
/// ([`Isa::rope_half`], candle-nn's `rope`), reading `x` through its strides (a view of the
/// projection's output, `[B, T, H, d]` transposed, needs no copy first).
///
/// # Shapes
/// `x [B, H, T, d]` (any strides, the last 1), `cos`, `sin` `[T, d/2]` -> `[B, H, T, d]`
/// (contiguous).
///
/// # Errors
/// Candle errors; `Ok(None)` when the inputs are not float32 on the CPU, `x`'s last stride is not
/// 1, or the tables are not `[T, d/2]`.
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Option<Tensor>> {
    let Ok((b, h, t, d)) = x.dims4() else {
        return Ok(None);
    };
    let half = [t, d / 2];
    if !cpu_f32(x) || !cpu_f32(cos) || !cpu_f32(sin) || cos.dims() != half || sin.dims() != half {
        return Ok(None);
    }
    let (storage, layout) = x.storage_and_layout();
    let candle_core::Storage::Cpu(storage) = &*storage else {
        return Ok(None);
    };
    let st = layout.stride();
    if st[3] != 1 && d > 1 {
        return Ok(None);
    }
    let all = storage.as_slice::<f32>()?;
    let start = layout.start_offset();
    let isa = Isa::detected();
    let out = with_tensor(cos, |cos| {
        with_tensor(sin, |sin| {
            fresh(b * h * t * d, t * d, |bh, y| {
                let base = start + (bh / h) * st[0] + (bh % h) * st[1];
                for (p, y) in y.chunks_exact_mut(d).enumerate() {
                    let row = &all[base + p * st[2]..][..d];
                    let cs = p * (d / 2)..(p + 1) * (d / 2);
                    isa.rope_half(row, &cos[cs.clone()], &sin[cs], y);
                }
            })
        })
    })??;
    Ok(Some(Tensor::from_vec(out, (b, h, t, d), x.device())?))
}

/// The gate and up projections of a Llama MLP (the packed `w`'s two matrices) and the SwiGLU
/// of them, `silu(pre) * lin` ([`Isa::silu_mul`], [`swiglu`]'s bits), each thread's rows of the
/// SwiGLU computed in the product's task ([`super::gemm::matmul_packed_then`]).
///
/// # Shapes
/// `x [..., K]`, `w` two matrices `[n, K]` -> `(pre, lin, silu(pre) * lin)`, each `[..., n]`.
///
/// # Errors
/// Candle errors; `Ok(None)` when `w` is not two matrices of one height or `x` is not float32
/// on the CPU with last axis `K`.
pub(crate) fn packed_swiglu(
    x: &Tensor,
    w: &PackedMatrix,
    device: &Device,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    if w.parts() != 2 || w.rows(0) != w.rows(1) || !cpu_f32(x) || x.dims().last() != Some(&w.k()) {
        return Ok(None);
    }
    let isa = Isa::detected();
    let (ys, mut post) = matmul_packed_then(x, w, device, &[w.rows(0)], |_, ins, outs| {
        if let ([g, u], [y]) = (ins, outs) {
            isa.silu_mul(g, u, y);
        }
    })?;
    match (<[Tensor; 2]>::try_from(ys), post.pop()) {
        (Ok([pre, lin]), Some(post)) => Ok(Some((pre, lin, post))),
        _ => Ok(None),
    }
}

/// The product `x W^T` of a one-matrix packed projection (a block's output projection), then the
/// residual addition `h + y` and the RMSNorm of the sum with the gain `g` ([`rms_norm`]'s bits,
/// [`Isa::add_rms_norm`]), each thread's rows computed in the product's task
/// ([`super::gemm::matmul_packed_then`]).
///
/// # Shapes
/// `x [..., K]`, `w` one matrix `[D, K]`, `h [..., D]` (`x`'s leading axes), `g [D]` -> `(y, h +
/// y, its norm)`, each `[..., D]`.
///
/// # Errors
/// Candle errors; `Ok(None)` when an input is not float32 on the CPU or the shapes do not fit.
pub(crate) fn packed_residual_norm(
    x: &Tensor,
    w: &PackedMatrix,
    device: &Device,
    h: &Tensor,
    g: &Tensor,
    eps: f32,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    let d = g.elem_count();
    let (xd, hd) = (x.dims(), h.dims());
    let fits = w.parts() == 1
        && w.rows(0) == d
        && d > 0
        && g.rank() == 1
        && [x, h, g].iter().all(|t| cpu_f32(t))
        && xd.last() == Some(&w.k())
        && hd.last() == Some(&d)
        && xd[..xd.len() - 1] == hd[..hd.len() - 1];
    if !fits {
        return Ok(None);
    }
    let isa = Isa::detected();
    let (mut ys, mut outs) = with_tensor(h, |h| {
        with_tensor(g, |g| {
            matmul_packed_then(x, w, device, &[d, d], |row, ins, outs| {
                if let ([y], [sum, out]) = (ins, outs) {
                    let h = &h[row * d..][..y.len()];
                    isa.add_rms_norm(h, y, g, eps, sum, out);
                }
            })
        })
    })???;
    match (ys.pop(), outs.pop(), outs.pop()) {
        (Some(y), Some(normed), Some(sum)) => Ok(Some((y, sum, normed))),
        _ => Ok(None),
    }
}

/// The start of an output that several tasks write, each at elements of its own (the rotated
/// heads of [`packed_qkv_rope`], token rows scattered over `[B, H, T, d]`).
#[derive(Clone, Copy)]
struct Shared(*mut f32);

// SAFETY: the tasks that share it write disjoint elements, and the vector outlives them.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    /// The pointer (a method, so that closures capture the `Shared`, not its field).
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// The Q, K and V projections of a Llama block (the packed `w`'s three matrices) and the rotary
/// embedding of Q and K ([`Isa::rope_half`], [`rope`]'s bits), each thread's token rows rotated
/// in the product's task ([`super::gemm::matmul_packed_then`]) into the head-major layout the
/// attention reads.
///
/// # Shapes
/// `x [B, T, K]`, `w` three matrices `[H d, K]`, `[H_kv d, K]`, `[H_kv d, K]`, `cos`, `sin`
/// `[T, d/2]` -> `([q, k, v] [B, T, n_i], q rotated [B, H, T, d], k rotated [B, H_kv, T, d])`.
///
/// # Errors
/// Candle errors; `Ok(None)` when the shapes do not fit or an input is not float32 on the CPU.
pub(crate) fn packed_qkv_rope(
    x: &Tensor,
    w: &PackedMatrix,
    device: &Device,
    d: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Option<(Vec<Tensor>, Tensor, Tensor)>> {
    let Ok((b, t, k)) = x.dims3() else {
        return Ok(None);
    };
    let half = [t, d / 2];
    let fits = w.parts() == 3
        && d > 0
        && d.is_multiple_of(2)
        && k == w.k()
        && w.rows(0).is_multiple_of(d)
        && w.rows(1).is_multiple_of(d)
        && [x, cos, sin].iter().all(|t| cpu_f32(t))
        && cos.dims() == half
        && sin.dims() == half;
    if !fits {
        return Ok(None);
    }
    let (hq, hk) = (w.rows(0) / d, w.rows(1) / d);
    let isa = Isa::detected();
    let mut qr: Vec<f32> = Vec::with_capacity(b * hq * t * d);
    let mut kr: Vec<f32> = Vec::with_capacity(b * hk * t * d);
    let (qp, kp) = (Shared(qr.as_mut_ptr()), Shared(kr.as_mut_ptr()));
    let ys = with_tensor(cos, |cos| {
        with_tensor(sin, |sin| {
            // Token row `row0 + i` of `src` (`heads` heads of `d`) into `[B, heads, T, d]`.
            let rotate = |row0: usize, src: &[f32], dst: Shared, heads: usize| {
                for (i, row) in src.chunks_exact(heads * d).enumerate() {
                    let (bb, p) = ((row0 + i) / t, (row0 + i) % t);
                    let cs = p * (d / 2)..(p + 1) * (d / 2);
                    for (hh, x) in row.chunks_exact(d).enumerate() {
                        let at = ((bb * heads + hh) * t + p) * d;
                        // SAFETY: `at + d <= B heads T d`, the vector's capacity; each (batch,
                        // head, position) row belongs to one token row, so to one task.
                        let y: &mut [MaybeUninit<f32>] =
                            unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(at).cast(), d) };
                        y.fill(MaybeUninit::new(0.0));
                        // SAFETY: every element of `y` was just initialised; `MaybeUninit<f32>`
                        // has the layout of `f32`, and the slice reborrows `y`.
                        let y = unsafe { std::slice::from_raw_parts_mut(y.as_mut_ptr().cast(), d) };
                        isa.rope_half(x, &cos[cs.clone()], &sin[cs.clone()], y);
                    }
                }
            };
            matmul_packed_then(x, w, device, &[], |row0, ins, _| {
                if let [q, k, _] = ins {
                    rotate(row0, q, qp, hq);
                    rotate(row0, k, kp, hk);
                }
            })
        })
    })???;
    // SAFETY: the capacities are `B H T d` and `B H_kv T d`; every token row of the product was
    // rotated by one task, which initialised each of its `d` elements per head, and all the tasks
    // have returned.
    unsafe {
        qr.set_len(b * hq * t * d);
        kr.set_len(b * hk * t * d);
    }
    let q = Tensor::from_vec(qr, (b, hq, t, d), device)?;
    let k = Tensor::from_vec(kr, (b, hk, t, d), device)?;
    Ok(Some((ys.0, q, k)))
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    #[test]
    fn causal_softmax_matches_the_masked_candle_softmax() {
        let dev = Device::Cpu;
        let (b, t) = (3, 70); // rows over two parallel blocks, a tail past the lanes
        let s = Tensor::randn(0f32, 2.0, (b, t, t), &dev).unwrap();
        let got = causal_softmax(&s).unwrap().unwrap();
        let mask = crate::nn::position::causal_mask(t, &dev).unwrap();
        let ninf = Tensor::full(f32::NEG_INFINITY, (b, t, t), &dev).unwrap();
        let masked = mask
            .broadcast_as((b, t, t))
            .unwrap()
            .where_cond(&s, &ninf)
            .unwrap();
        let want = candle_nn::ops::softmax_last_dim(&masked).unwrap();
        let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
        assert!(
            causal_softmax(&s.to_dtype(candle_core::DType::F64).unwrap())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn rope_of_a_strided_view_matches_candle_nn_rope_of_its_copy() {
        let dev = Device::Cpu;
        let (b, t, h, d) = (2, 5, 3, 8);
        let x = Tensor::randn(0f32, 1.0, (b, t, h, d), &dev)
            .unwrap()
            .transpose(1, 2)
            .unwrap();
        let cos = Tensor::randn(0f32, 1.0, (t, d / 2), &dev).unwrap();
        let sin = Tensor::randn(0f32, 1.0, (t, d / 2), &dev).unwrap();
        let got = rope(&x, &cos, &sin).unwrap().unwrap();
        let want = candle_nn::rotary_emb::rope(&x.contiguous().unwrap(), &cos, &sin).unwrap();
        let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
    }

    #[test]
    fn rms_norm_and_its_residual_form_have_candles_bits() {
        let dev = Device::Cpu;
        // 3 x 37 rows: two parallel blocks and a tail; rows of 576 (SmolLM2's width)
        let h = Tensor::randn(0f32, 3.0, (3, 37, 576), &dev).unwrap();
        let y = Tensor::randn(0f32, 1.0, (3, 37, 576), &dev).unwrap();
        let w = Tensor::randn(1f32, 0.3, 576, &dev).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        let (same, x) = rms_norm(&h, None, &w, 1e-5).unwrap().unwrap();
        assert_eq!(same.id(), h.id());
        let want = candle_nn::ops::rms_norm(&h, &w, 1e-5).unwrap();
        assert_eq!(bits(&x), bits(&want));
        let (sum, x) = rms_norm(&h, Some(&y), &w, 1e-5).unwrap().unwrap();
        let want_sum = (&h + &y).unwrap();
        assert_eq!(bits(&sum), bits(&want_sum));
        let want = candle_nn::ops::rms_norm(&want_sum, &w, 1e-5).unwrap();
        assert_eq!(bits(&x), bits(&want));
        // another device's or dtype's tensors, or a gain of another width, are left to candle
        let h64 = h.to_dtype(candle_core::DType::F64).unwrap();
        assert!(rms_norm(&h64, None, &w, 1e-5).unwrap().is_none());
        let w2 = Tensor::ones(575, candle_core::DType::F32, &dev).unwrap();
        assert!(rms_norm(&h, None, &w2, 1e-5).unwrap().is_none());
    }

    #[test]
    fn the_products_with_their_epilogues_have_the_bits_of_the_separate_steps() {
        let dev = Device::Cpu;
        let bits = |t: &Tensor| -> Vec<u32> {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        let pack = |ws: &[&Tensor]| -> PackedMatrix {
            let data: Vec<Vec<f32>> = ws
                .iter()
                .map(|w| w.flatten_all().unwrap().to_vec1::<f32>().unwrap())
                .collect();
            let parts: Vec<&[f32]> = data.iter().map(Vec::as_slice).collect();
            PackedMatrix::new(ws[0].dim(1).unwrap(), &parts).unwrap()
        };
        // 3 x 37 rows (tasks of whole tiles and a tail); SmolLM2's widths
        let x = Tensor::randn(0f32, 1.0, (3, 37, 576), &dev).unwrap();
        let g = Tensor::randn(0f32, 0.1, (1536, 576), &dev).unwrap();
        let u = Tensor::randn(0f32, 0.1, (1536, 576), &dev).unwrap();
        let w = pack(&[&g, &u]);
        let (pre, lin, post) = packed_swiglu(&x, &w, &dev).unwrap().unwrap();
        let ys = super::super::gemm::matmul_packed(&x, &w, &dev).unwrap();
        assert_eq!(bits(&pre), bits(&ys[0]));
        assert_eq!(bits(&lin), bits(&ys[1]));
        assert_eq!(bits(&post), bits(&swiglu(&ys[0], &ys[1]).unwrap().unwrap()));
        let down = Tensor::randn(0f32, 0.1, (576, 1536), &dev).unwrap();
        let wd = pack(&[&down]);
        let h = Tensor::randn(0f32, 3.0, (3, 37, 576), &dev).unwrap();
        let gain = Tensor::randn(1f32, 0.3, 576, &dev).unwrap();
        let (y, sum, normed) = packed_residual_norm(&post, &wd, &dev, &h, &gain, 1e-5)
            .unwrap()
            .unwrap();
        let want_y = super::super::gemm::matmul_packed(&post, &wd, &dev).unwrap();
        assert_eq!(bits(&y), bits(&want_y[0]));
        let (want_sum, want_x) = rms_norm(&h, Some(&y), &gain, 1e-5).unwrap().unwrap();
        assert_eq!(bits(&sum), bits(&want_sum));
        assert_eq!(bits(&normed), bits(&want_x));
        // two matrices of other heights, a residual of another shape: left to the caller
        let w2 = pack(&[
            &g,
            &down
                .t()
                .unwrap()
                .contiguous()
                .unwrap()
                .narrow(0, 0, 8)
                .unwrap(),
        ]);
        assert!(packed_swiglu(&x, &w2, &dev).unwrap().is_none());
        let h2 = h.narrow(1, 0, 36).unwrap();
        assert!(packed_residual_norm(&post, &wd, &dev, &h2, &gain, 1e-5)
            .unwrap()
            .is_none());
    }

    #[test]
    fn the_rotated_heads_of_the_qkv_product_have_ropes_bits() {
        let dev = Device::Cpu;
        let (b, t, hq, hk, d, k) = (3, 37, 9, 3, 64, 576);
        let x = Tensor::randn(0f32, 1.0, (b, t, k), &dev).unwrap();
        let ws: Vec<Vec<f32>> = [hq * d, hk * d, hk * d]
            .iter()
            .map(|&n| {
                let w = Tensor::randn(0f32, 0.1, (n, k), &dev).unwrap();
                w.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            })
            .collect();
        let parts: Vec<&[f32]> = ws.iter().map(Vec::as_slice).collect();
        let w = PackedMatrix::new(k, &parts).unwrap();
        let cos = Tensor::randn(0f32, 1.0, (t, d / 2), &dev).unwrap();
        let sin = Tensor::randn(0f32, 1.0, (t, d / 2), &dev).unwrap();
        let (ys, q, kr) = packed_qkv_rope(&x, &w, &dev, d, &cos, &sin)
            .unwrap()
            .unwrap();
        let want = super::super::gemm::matmul_packed(&x, &w, &dev).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        for (y, want) in ys.iter().zip(&want) {
            assert_eq!(bits(y), bits(want));
        }
        let heads =
            |y: &Tensor, n: usize| y.reshape((b, t, n, d)).unwrap().transpose(1, 2).unwrap();
        let want_q = rope(&heads(&want[0], hq), &cos, &sin).unwrap().unwrap();
        let want_k = rope(&heads(&want[1], hk), &cos, &sin).unwrap().unwrap();
        assert_eq!(q.dims(), &[b, hq, t, d]);
        assert_eq!(bits(&q), bits(&want_q));
        assert_eq!(bits(&kr), bits(&want_k));
        // tables of another length: left to the caller
        let short = cos.narrow(0, 0, t - 1).unwrap();
        assert!(packed_qkv_rope(&x, &w, &dev, d, &short, &short)
            .unwrap()
            .is_none());
    }

    #[test]
    fn swiglu_matches_candle_silu_times_the_linear_part() {
        let dev = Device::Cpu;
        let g = Tensor::randn(0f32, 3.0, (5, 9001), &dev).unwrap();
        let u = Tensor::randn(0f32, 1.0, (5, 9001), &dev).unwrap();
        let got = swiglu(&g, &u).unwrap().unwrap();
        let want = (candle_nn::ops::silu(&g).unwrap() * &u).unwrap();
        let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-5);
    }
}
