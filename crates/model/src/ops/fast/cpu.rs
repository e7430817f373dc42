//! Two CPU operations with hand-written gradients, each one pass over its tensor in either
//! direction: a bias added over the leading axes, and the tanh GELU; and the backward passes of
//! [`super::fused`]'s LayerNorm and softmax as one pass over the rows.
//!
//! As candle operations a bias over batch and tokens ([`crate::ops::Ops::add_leading`]) costs a
//! product with a column of ones (the repeated bias, written out in full), the addition and, in the
//! backward pass, a second product with ones; GELU ([`crate::ops::Ops::gelu_tanh`]) costs eight
//! elementwise operations forward and their gradients backward. On the base SRAVEN model these
//! passes over `[4608, 128]` and `[4608, 256]` activations took about 12 % of a CPU training step
//! (`perf`, one thread). Here:
//!
//! - bias: `y[r, n] = x[r, n] + b[n]`; `dx = g`, `db[n] = sum_r g[r, n]` (summed per block of
//!   rows, below);
//! - GELU: `y = x sigmoid(z)`, `z = c (x + 0.044715 x^3)`, `c = 2 sqrt(2 / pi)` (the same function as
//!   `0.5 x (1 + tanh(z / 2))`, `jax.nn.gelu(approximate=True)`);
//!   `dx = g (s + x s (1 - s) c (1 + 3 * 0.044715 x^2))` with `s = sigmoid(z)`.
//!
//! Both run in float32 on the CPU under [`crate::ops::Ops::Fast`]; everything else takes the
//! other forms of [`crate::ops`].
//!
//! The arithmetic is `hyperlens_kernels::portable`'s (the GELU of one value, `gelu_tanh`, and its
//! gradient, `gelu_tanh_backward`, whose argument `gelu_tanh_arg` the evaluation engine's GELU
//! shares; the LayerNorm and softmax gradients of a block of rows); this file holds the candle
//! operations around it and runs the blocks.
//!
//! Every operation here runs in parallel (rayon) over fixed blocks of [`BLOCK_ROWS`] rows (or
//! [`BLOCK_ELEMS`] elements); sums over rows are taken per block in row order and the block sums
//! added in block order, so the results do not depend on the number of threads.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use hyperlens_kernels::portable;
use rayon::prelude::*;

use crate::error::Result;

/// Rows per parallel task of the row-wise operations.
const BLOCK_ROWS: usize = 64;
/// Elements per parallel task of the elementwise operations.
const BLOCK_ELEMS: usize = 8192;

/// Runs `f(block index, output block)` over the blocks of `block_len` entries of `out`: in
/// parallel (rayon) when its pool has more than one thread, else in order on this thread (handing
/// each operation to a single worker thread made a one-thread training step 4-8 % slower);
/// returns what `f` returns per block, in block order. `f` reads its inputs at
/// `[index * block_len ..][.. block.len()]`.
pub(crate) fn for_blocks<P: Send>(
    out: &mut [f32],
    block_len: usize,
    f: impl Fn(usize, &mut [f32]) -> P + Sync + Send,
) -> Vec<P> {
    if rayon::current_num_threads() > 1 {
        out.par_chunks_mut(block_len)
            .enumerate()
            .map(|(i, o)| f(i, o))
            .collect()
    } else {
        out.chunks_mut(block_len)
            .enumerate()
            .map(|(i, o)| f(i, o))
            .collect()
    }
}

/// [`for_blocks`] over two outputs at once: `f(index, block of a, block of b)` for the blocks of
/// `a_len` entries of `a` and `b_len` entries of `b` (the mix kernel's per-problem outputs).
pub(crate) fn for_block_pairs(
    a: &mut [f32],
    a_len: usize,
    b: &mut [f32],
    b_len: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
) {
    if rayon::current_num_threads() > 1 {
        a.par_chunks_mut(a_len)
            .zip(b.par_chunks_mut(b_len))
            .enumerate()
            .for_each(|(i, (a, b))| f(i, a, b));
    } else {
        for (i, (a, b)) in a.chunks_mut(a_len).zip(b.chunks_mut(b_len)).enumerate() {
            f(i, a, b);
        }
    }
}

/// `f` of each block of `block_len` entries of `data`, in block order; in parallel as
/// [`for_blocks`].
fn map_blocks<P: Send>(
    data: &[f32],
    block_len: usize,
    f: impl Fn(&[f32]) -> P + Sync + Send,
) -> Vec<P> {
    if rayon::current_num_threads() > 1 {
        data.par_chunks(block_len).map(f).collect()
    } else {
        data.chunks(block_len).map(f).collect()
    }
}

/// The sum of per-block partial sums, added in block order (so that a sum over rows does not
/// depend on how many threads computed the blocks).
fn add_in_order<'a>(blocks: impl Iterator<Item = &'a Vec<f32>>, n: usize) -> Vec<f32> {
    let mut total = vec![0f32; n];
    for block in blocks {
        for (t, &x) in total.iter_mut().zip(block) {
            *t += x;
        }
    }
    total
}

/// The float32 data of a CPU storage under a contiguous layout.
///
/// # Errors
/// A candle error if the storage is not float32 or the layout not contiguous.
fn data<'a>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    let all = s.as_slice::<f32>()?;
    match l.contiguous_offsets() {
        Some((lo, hi)) => Ok(&all[lo..hi]),
        None => candle_core::bail!("cpu op: input is not contiguous"),
    }
}

/// Runs `f` on the float32 data of a CPU tensor (made contiguous first).
///
/// # Errors
/// A candle error if `t` is not a float32 CPU tensor.
pub(crate) fn with_tensor<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(s) => Ok(f(data(s, layout)?)),
        _ => candle_core::bail!("cpu op: not a CPU tensor"),
    }
}

/// `x + b` with `b` added to every row: one pass forward, the bias gradient a sum over rows.
///
/// # Shapes
/// `x [rows, N]`, `b [N]` -> `[rows, N]`.
///
/// # Errors
/// Candle errors (shapes, a device other than the CPU, a dtype other than float32).
pub(crate) fn add_rows(x: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (_, n) = x.dims2()?;
    if b.dims() != [n] {
        return Err(crate::ModelError::Input(format!(
            "add_rows: a bias of shape {:?} for rows of {n}",
            b.dims()
        )));
    }
    Ok(x.contiguous()?.apply_op2(&b.contiguous()?, AddRows)?)
}

/// The graph node of [`add_rows`].
struct AddRows;

impl CustomOp2 for AddRows {
    fn name(&self) -> &'static str {
        "hyperlens-add-rows"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, b) = (data(xs, xl)?, data(bs, bl)?);
        let n = b.len();
        let mut y = vec![0f32; x.len()];
        let len = BLOCK_ROWS * n;
        for_blocks(&mut y, len, |i, y| {
            let x = &x[i * len..][..y.len()];
            for (y, x) in y.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
                for ((y, &x), &b) in y.iter_mut().zip(x).zip(b) {
                    *y = x + b;
                }
            }
        });
        Ok((CpuStorage::F32(y), xl.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let n = b.elem_count();
        let blocks: Vec<Vec<f32>> = with_tensor(g, |g| {
            map_blocks(g, BLOCK_ROWS * n, |g| {
                let mut db = vec![0f32; n];
                for row in g.chunks_exact(n) {
                    for (s, &x) in db.iter_mut().zip(row) {
                        *s += x;
                    }
                }
                db
            })
        })?;
        let db = add_in_order(blocks.iter(), n);
        let db = Tensor::from_vec(db, b.shape(), b.device())?;
        Ok((Some(g.clone()), Some(db)))
    }
}

/// The tanh GELU (module docs): one pass forward, one backward.
///
/// # Shapes
/// Any shape, elementwise.
///
/// # Errors
/// Candle errors (a device other than the CPU, a dtype other than float32).
pub(crate) fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    Ok(x.contiguous()?.apply_op1(GeluTanh)?)
}

/// The graph node of [`gelu_tanh`].
struct GeluTanh;

impl CustomOp1 for GeluTanh {
    fn name(&self) -> &'static str {
        "hyperlens-gelu-tanh"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = data(s, l)?;
        let mut y = vec![0f32; x.len()];
        for_blocks(&mut y, BLOCK_ELEMS, |i, y| {
            for (y, &x) in y.iter_mut().zip(&x[i * BLOCK_ELEMS..]) {
                *y = portable::gelu_tanh(x);
            }
        });
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let mut dx = vec![0f32; x.elem_count()];
        with_tensor(x, |x| {
            with_tensor(g, |g| {
                for_blocks(&mut dx, BLOCK_ELEMS, |i, dx| {
                    let (x, g) = (&x[i * BLOCK_ELEMS..], &g[i * BLOCK_ELEMS..]);
                    for ((dx, &x), &g) in dx.iter_mut().zip(x).zip(g) {
                        *dx = portable::gelu_tanh_backward(x, g);
                    }
                });
            })
        })??;
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

/// The LayerNorm gradient of [`super::fused::layer_norm`] in one pass over the rows: per row of
/// `D` entries, `xhat = (x - mean) r`, `r = 1 / sqrt(var + eps)` (the variance of the centred
/// row), `gh = g w`, `dx = r (gh - mean(gh) - xhat mean(gh xhat))`; `dw = sum_rows g xhat`,
/// `db = sum_rows g`, summed per block of rows (module docs).
///
/// # Shapes
/// `x [rows, D]`, `w [D]`, `g [rows, D]` -> `([rows, D], [D], [D])`.
///
/// # Errors
/// Candle errors (a device other than the CPU, a dtype other than float32, shapes).
pub(crate) fn layer_norm_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (rows, d) = x.dims2()?;
    if g.dims() != [rows, d] || w.dims() != [d] {
        return Err(crate::ModelError::Input(format!(
            "layer_norm_backward: x {:?}, w {:?}, g {:?}",
            x.dims(),
            w.dims(),
            g.dims()
        )));
    }
    let mut dx = vec![0f32; rows * d];
    // Per block of rows: `dx` of its rows, and its partial sums of `dw` and `db`.
    let blocks: Vec<(Vec<f32>, Vec<f32>)> = with_tensor(x, |x| {
        with_tensor(w, |w| {
            with_tensor(g, |g| {
                let len = BLOCK_ROWS * d;
                for_blocks(&mut dx, len, |i, dx| {
                    let (x, g) = (&x[i * len..][..dx.len()], &g[i * len..][..dx.len()]);
                    portable::layer_norm_backward(x, w, g, eps as f32, dx)
                })
            })
        })
    })???;
    let dw = add_in_order(blocks.iter().map(|b| &b.0), d);
    let db = add_in_order(blocks.iter().map(|b| &b.1), d);
    let dev = x.device();
    Ok((
        Tensor::from_vec(dx, (rows, d), dev)?,
        Tensor::from_vec(dw, d, dev)?,
        Tensor::from_vec(db, d, dev)?,
    ))
}

/// The softmax gradient over the last axis, `dx = (g - sum(g y)) y` per row, in one pass.
///
/// # Shapes
/// `y`, `g` of one shape (rank >= 1) -> that shape.
///
/// # Errors
/// Candle errors (a device other than the CPU, a dtype other than float32, shapes).
pub(crate) fn softmax_backward(y: &Tensor, g: &Tensor) -> Result<Tensor> {
    if y.dims() != g.dims() || y.rank() == 0 {
        return Err(crate::ModelError::Input(format!(
            "softmax_backward: y {:?}, g {:?}",
            y.dims(),
            g.dims()
        )));
    }
    let n = y.dim(candle_core::D::Minus1)?;
    let mut dx = vec![0f32; y.elem_count()];
    with_tensor(y, |y| {
        with_tensor(g, |g| {
            let len = BLOCK_ROWS * n;
            for_blocks(&mut dx, len, |i, dx| {
                let (y, g) = (&y[i * len..][..dx.len()], &g[i * len..][..dx.len()]);
                portable::softmax_backward(y, g, n, dx);
            });
        })
    })??;
    Ok(Tensor::from_vec(dx, y.shape(), y.device())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::{bits, close};
    use candle_core::DType;
    use candle_core::{Device, Var};

    /// Values and gradients of both operations against candle's autodiff of the composed forms in
    /// float64 (candle's `gelu`, `broadcast_add`) on the same inputs.
    #[test]
    fn ops_match_float64_autodiff() {
        let dev = Device::Cpu;
        let x = Var::from_tensor(
            &Tensor::randn(0f32, 1.0, (37, 11), &dev)
                .unwrap()
                .affine(3.0, -0.5)
                .unwrap(),
        )
        .unwrap();
        let b = Var::randn(0f32, 1.0, 11, &dev).unwrap();
        let c = Tensor::randn(0f32, 1.0, (37, 11), &dev).unwrap();
        let y = gelu_tanh(&add_rows(x.as_tensor(), b.as_tensor()).unwrap()).unwrap();
        let g = (&y * &c).unwrap().sum_all().unwrap().backward().unwrap();
        let f64v = |t: &Tensor| Var::from_tensor(&t.to_dtype(DType::F64).unwrap()).unwrap();
        let (x64, b64) = (f64v(x.as_tensor()), f64v(b.as_tensor()));
        let c64 = c.to_dtype(DType::F64).unwrap();
        let y64 = x64.broadcast_add(&b64).unwrap().gelu().unwrap();
        let g64 = (&y64 * &c64)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        close(&y, &y64, 1e-6);
        close(
            g.get(x.as_tensor()).unwrap(),
            g64.get(x64.as_tensor()).unwrap(),
            1e-5,
        );
        close(
            g.get(b.as_tensor()).unwrap(),
            g64.get(b64.as_tensor()).unwrap(),
            1e-5,
        );
    }

    /// A bias of the wrong length is an error, not a panic; large inputs do not overflow.
    #[test]
    fn bad_bias_and_extreme_inputs() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((3, 4), DType::F32, &dev).unwrap();
        assert!(add_rows(&x, &Tensor::zeros(5, DType::F32, &dev).unwrap()).is_err());
        let x = Tensor::new(&[-200f32, -30.0, 0.0, 30.0, 200.0], &dev).unwrap();
        let y: Vec<f32> = gelu_tanh(&x).unwrap().to_vec1().unwrap();
        assert_eq!(y, [-0.0, -0.0, 0.0, 30.0, 200.0]);
    }

    /// On inputs of several blocks, every operation gives the same bits on one thread and on
    /// three (blocks are fixed, block sums added in order), and the parallel sums over rows are
    /// those of one pass in row order to float32 rounding.
    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let dev = Device::Cpu;
        let (rows, d) = (3 * BLOCK_ROWS + 7, 48);
        assert!(rows * d > BLOCK_ELEMS);
        let x = Var::randn(0f32, 1.0, (rows, d), &dev).unwrap();
        let b = Var::randn(0f32, 1.0, d, &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, d, &dev).unwrap();
        let g = Tensor::randn(0f32, 1.0, (rows, d), &dev).unwrap();
        let y = candle_nn::ops::softmax_last_dim(&g).unwrap();
        let run = || {
            let out = gelu_tanh(&add_rows(x.as_tensor(), b.as_tensor()).unwrap()).unwrap();
            let grads = (&out * &g).unwrap().sum_all().unwrap().backward().unwrap();
            let (dx, dw, db) = layer_norm_backward(x.as_tensor(), &w, &g, 1e-5).unwrap();
            let ds = softmax_backward(&y, &x.as_tensor().detach()).unwrap();
            [
                out,
                grads.get(x.as_tensor()).unwrap().clone(),
                grads.get(b.as_tensor()).unwrap().clone(),
                dx,
                dw,
                db,
                ds,
            ]
            .map(|t| bits(&t))
        };
        let pool = |n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        };
        let one = pool(1).install(run);
        let three = pool(3).install(run);
        for (i, (a, b)) in one.iter().zip(&three).enumerate() {
            assert!(a == b, "output {i} differs between 1 and 3 threads");
        }
        // The bias gradient (a sum over rows in blocks) against a plain sum in row order.
        let db: Vec<f32> = one[2].iter().map(|&u| f32::from_bits(u)).collect();
        let gsum: Vec<f32> = (&gelu_grad(x.as_tensor(), b.as_tensor()) * &g)
            .unwrap()
            .sum(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        for (a, b) in db.iter().zip(&gsum) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }

    /// `d gelu(x + b) / dx` by candle's own operations (float64), as float32.
    fn gelu_grad(x: &Tensor, b: &Tensor) -> Tensor {
        let z = x
            .to_dtype(DType::F64)
            .unwrap()
            .broadcast_add(&b.to_dtype(DType::F64).unwrap())
            .unwrap();
        let v = Var::from_tensor(&z).unwrap();
        let g = v
            .as_tensor()
            .gelu()
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        g.get(v.as_tensor()).unwrap().to_dtype(DType::F32).unwrap()
    }
}
