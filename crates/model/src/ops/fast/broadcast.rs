//! CPU forms of broadcasts over leading axes, RMSHead, and a GELU whose gradients stay fast on the CPU.
//!
//! candle 0.11's CPU sum over any axis but the last walks the tensor with two integer divisions per
//! element, so summing a `[4608, 128]` gradient over its rows is about a hundred times slower than
//! over its columns or than a product with a row of ones (`benches/forward.rs` in this crate, group
//! `cpu_fast_paths`; `docs/performance.md` says how to run it). Every bias, LayerNorm scale and
//! relative-position table of the transformer is broadcast over leading axes (batch and tokens),
//! and RMSHead averages over the head axis, so the backward pass of a training step sums over
//! leading axes dozens of times. On the CPU the helpers below write such a broadcast as a product
//! with a column of ones, whose backward pass is a matrix product (gemm); the forward values are
//! exactly those of a broadcast (each entry is `1 * v`). candle's GELU gradient calls `powf` per
//! element; [`gelu_tanh`] writes the same function with a sigmoid on the CPU. Each function here
//! returns `None` (or is not called, see [`crate::ops::Ops`]) off the CPU: there the native
//! reductions are fast, and more operations would mean more kernel launches per step.
//!
//! On the base HYLA model (batch 128, one core) the broadcasts here and the GELU made a training
//! step and the forward pass markedly faster (`hyperlens-train`'s `benches/train_step.rs`, this
//! crate's `benches/forward.rs`; the measurements are in `CHANGELOG.md`'s performance history, the
//! current figures in `docs/performance.md`).

use candle_core::Tensor;

use super::{cpu, cpu_device, cpu_f32};
use crate::error::Result;

/// `v` repeated as `rows` rows by a product with a column of ones (exactly `1 * v` per entry).
///
/// # Shapes
/// `v [N]` (any shape, flattened) -> `[rows, N]`.
///
/// # Errors
/// Candle errors.
fn repeat_rows(v: &Tensor, rows: usize) -> Result<Tensor> {
    let n = v.elem_count();
    Ok(Tensor::ones((rows, 1), v.dtype(), v.device())?.matmul(&v.reshape((1, n))?)?)
}

/// The number of leading rows when `b`'s shape is the trailing shape of `x`.
fn trailing_rows(x: &Tensor, b: &Tensor) -> Option<usize> {
    let (xd, bd) = (x.dims(), b.dims());
    let lead = xd.len().checked_sub(bd.len())?;
    (lead > 0 && xd[lead..] == *bd && b.elem_count() > 0).then(|| xd[..lead].iter().product())
}

/// `x + b` with `b` over the leading axes of `x`, on the CPU: in float32 one pass each way
/// ([`cpu::add_rows`]), else through [`repeat_rows`]. `None` off the CPU or when `b`'s shape is not
/// the trailing shape of `x`.
///
/// # Shapes
/// `x [..., S...]`, `b [S...]` -> the shape of `x`.
///
/// # Errors
/// Candle errors.
pub(crate) fn add_leading(x: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    let Some(rows) = trailing_rows(x, b).filter(|_| cpu_device(x)) else {
        return Ok(None);
    };
    let n = b.elem_count();
    let y = if cpu_f32(x) {
        cpu::add_rows(&x.reshape((rows, n))?, &b.flatten_all()?)?
    } else {
        (x.reshape((rows, n))? + repeat_rows(b, rows)?)?
    };
    Ok(Some(y.reshape(x.shape())?))
}

/// `x * w` with `w` over the leading axes of `x`, on the CPU through [`repeat_rows`]. `None` off
/// the CPU or when `w`'s shape is not the trailing shape of `x`.
///
/// # Shapes
/// As [`add_leading`].
///
/// # Errors
/// Candle errors.
pub(crate) fn mul_leading(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    let Some(rows) = trailing_rows(x, w).filter(|_| cpu_device(x)) else {
        return Ok(None);
    };
    let n = w.elem_count();
    let y = (x.reshape((rows, n))? * repeat_rows(w, rows)?)?;
    Ok(Some(y.reshape(x.shape())?))
}

/// RMSHead over axis 1 (heads), on the CPU: the mean over heads and its broadcast back are
/// products with ones, so that neither pass sums over a leading axis.
///
/// # Shapes
/// `x [B, H, rest...]` -> the shape of `x`.
///
/// # Errors
/// Candle errors (`x` of rank below 2).
pub(crate) fn rms_over_heads(x: &Tensor, eps: f64) -> Result<Tensor> {
    let rms = (mean_over_heads(&x.sqr()?)? + eps)?.sqrt()?; // [B, 1, rest...]
    let (b, h) = (x.dim(0)?, x.dim(1)?);
    let n = x.elem_count() / (b * h).max(1);
    let rep = Tensor::ones((b, h, 1), x.dtype(), x.device())?.matmul(&rms.reshape((b, 1, n))?)?;
    Ok((x.reshape((b, h, n))? / rep)?.reshape(x.shape())?)
}

/// The mean over axis 1 (heads), kept as an axis of 1, as a product with a row of ones.
///
/// # Shapes
/// `x [B, H, rest...]` -> `[B, 1, rest...]`.
///
/// # Errors
/// Candle errors (`x` of rank below 2).
pub(crate) fn mean_over_heads(x: &Tensor) -> Result<Tensor> {
    let (b, h) = (x.dim(0)?, x.dim(1)?);
    let n = x.elem_count() / (b * h).max(1);
    let mut dims = x.dims().to_vec();
    dims[1] = 1;
    let sum = Tensor::ones((b, 1, h), x.dtype(), x.device())?.matmul(&x.reshape((b, h, n))?)?;
    Ok((sum / h as f64)?.reshape(dims)?)
}

/// The tanh GELU on the CPU as the identical function `x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))`
/// (`0.5 (1 + tanh z) = sigmoid(2 z)`): forward and backward are several times faster than candle's
/// `gelu`, whose gradient calls `powf` per element (`CHANGELOG.md`, 2026-11-22); values agree with
/// candle's `gelu` to 5e-7. In float32, one operation with its gradient written out
/// ([`cpu::gelu_tanh`]). `None` off the CPU.
///
/// # Shapes
/// Any shape, elementwise.
///
/// # Errors
/// Candle errors.
pub(crate) fn gelu_tanh(x: &Tensor) -> Result<Option<Tensor>> {
    if !cpu_device(x) {
        return Ok(None);
    }
    if cpu_f32(x) {
        return Ok(Some(cpu::gelu_tanh(x)?));
    }
    /// `2 sqrt(2 / pi)`.
    const TWO_SQRT_2_OVER_PI: f64 = 1.595_769_121_605_730_7;
    let inner = (x + ((x.sqr()? * x)? * 0.044715)?)?;
    Ok(Some(
        (x * candle_nn::ops::sigmoid(&(inner * TWO_SQRT_2_OVER_PI)?)?)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::close;
    use crate::ops::Ops;
    use candle_core::{Device, Var};

    /// The product forms give the broadcast's values and the same gradients as the native
    /// broadcast (the reference form), for every helper.
    #[test]
    fn product_forms_match_broadcasts_in_value_and_gradient() {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 1.0, (3, 5, 4, 6), &dev).unwrap();
        let b = Var::randn(0f32, 1.0, (4, 6), &dev).unwrap();
        let c = Tensor::randn(0f32, 1.0, (3, 5, 4, 6), &dev).unwrap();
        let run = |ops: Ops| {
            let y = ops.add_leading(
                &ops.mul_leading(x.as_tensor(), b.as_tensor())?,
                b.as_tensor(),
            )?;
            let z = ops.rms_over_heads(&y, 1e-6)?;
            let g = (&z * &c)?.sum_all()?.backward()?;
            Ok::<_, crate::ModelError>((
                y,
                z,
                g.get(x.as_tensor()).unwrap().clone(),
                g.get(b.as_tensor()).unwrap().clone(),
            ))
        };
        let (y1, z1, gx1, gb1) = run(Ops::Fast).unwrap();
        let (y0, z0, gx0, gb0) = run(Ops::Reference).unwrap();
        assert_eq!(
            y1.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            y0.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            "repeat_rows must give the broadcast's values exactly"
        );
        close(&z1, &z0, 1e-6);
        close(&gx1, &gx0, 1e-5);
        close(&gb1, &gb0, 1e-5);
        // The float64 product form (not the float32 kernel) agrees with the broadcast too.
        let x64 = x.as_tensor().to_dtype(candle_core::DType::F64).unwrap();
        let b64 = b.as_tensor().to_dtype(candle_core::DType::F64).unwrap();
        close(
            &add_leading(&x64, &b64).unwrap().unwrap(),
            &x64.broadcast_add(&b64).unwrap(),
            0.0,
        );
        // Shapes that are not a trailing shape are left to the reference form.
        let col = Tensor::randn(0f32, 1.0, (3, 1, 1, 1), &dev).unwrap();
        assert!(add_leading(x.as_tensor(), &col).unwrap().is_none());
        close(
            &Ops::Fast.add_leading(x.as_tensor(), &col).unwrap(),
            &x.as_tensor().broadcast_add(&col).unwrap(),
            0.0,
        );
        let rms = rms_over_heads(x.as_tensor(), 1e-6).unwrap();
        let ms: Vec<f32> = rms
            .sqr()
            .unwrap()
            .mean_keepdim(1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(ms.iter().all(|m| (m - 1.0).abs() < 1e-4), "{ms:?}");
    }

    #[test]
    fn gelu_forms_agree_in_value_and_gradient() {
        let dev = Device::Cpu;
        let x = Var::from_vec(
            (0..200)
                .map(|i| (i as f32 - 100.0) / 17.0)
                .collect::<Vec<_>>(),
            200,
            &dev,
        )
        .unwrap();
        let c = Tensor::randn(0f32, 1.0, 200, &dev).unwrap();
        let run = |ops: Ops| {
            let y = ops.gelu_tanh(x.as_tensor()).unwrap();
            let g = (&y * &c).unwrap().sum_all().unwrap().backward().unwrap();
            (y, g.get(x.as_tensor()).unwrap().clone())
        };
        let (y1, g1) = run(Ops::Fast);
        let (y0, g0) = run(Ops::Reference);
        close(&y1, &y0, 1e-6);
        // candle's gradient uses 6-digit constants (0.797885, 0.0356774, ...): 1e-5.
        close(&g1, &g0, 1e-5);
        // Against the definition in float64.
        let xs: Vec<f32> = x.as_tensor().to_vec1().unwrap();
        let ys: Vec<f32> = y1.to_vec1().unwrap();
        for (&x, &y) in xs.iter().zip(&ys) {
            let x = x as f64;
            let want = 0.5
                * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
            assert!(
                (y as f64 - want).abs() < 1e-6 * (1.0 + want.abs()),
                "{y} vs {want}"
            );
        }
    }
}
