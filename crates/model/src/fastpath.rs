//! CPU fast paths: broadcasts over leading axes and a GELU whose gradients stay fast on the CPU.
//!
//! candle 0.11's CPU sum over any axis but the last walks the tensor with two integer divisions per
//! element: summing a `[4608, 128]` gradient over its rows takes 5.8 ms on one core here, over its
//! columns 0.06 ms, and a product with a row of ones 0.04 ms (`benches/forward.rs` in this crate,
//! group `cpu_fast_paths`). Every bias, LayerNorm scale and relative-position table of the
//! transformer is broadcast over leading axes (batch and tokens), and RMSHead averages over the head
//! axis, so the backward pass of a training step sums over leading axes dozens of times. On the CPU
//! the helpers below write such a broadcast as a product with a column of ones, whose backward pass
//! is a matrix product (gemm); the forward values are exactly those of a broadcast (each entry is
//! `1 * v`). candle's GELU gradient calls `powf` per element; [`gelu_tanh`] writes the same function
//! with a sigmoid on the CPU. On other devices every helper is the plain candle operation: there the
//! native reductions are fast, and more operations would mean more kernel launches per step.
//!
//! Measured on the base HYLA model (batch 128, one core): a training step took 1.84 s with the
//! native operations, 1.13 s with the broadcasts here and 0.83 s with the GELU too; the forward
//! pass alone went from 442 to 607 problems/s (`hyperlens-train`'s `benches/train_step.rs`, this
//! crate's `benches/forward.rs`).

use candle_core::{Tensor, D};

use crate::error::Result;

thread_local! {
    /// This thread's override of the CPU fast paths (`None`: on).
    static CPU_FAST_PATHS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the CPU fast paths of this module switched on or off on the calling thread, and
/// restores the previous setting afterwards (also if `f` panics). Off, the CPU computes exactly the
/// operations that other devices run, so the forms a GPU uses can be tested, and their operations
/// counted, on the CPU. Only the thread that builds the graph decides; candle's worker threads do not.
pub fn with_cpu_fast_paths<R>(on: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CPU_FAST_PATHS.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CPU_FAST_PATHS.with(|c| c.replace(Some(on))));
    f()
}

/// Whether the CPU fast paths are on for `t`: its device is the CPU and [`with_cpu_fast_paths`]
/// has not switched them off on this thread (then, e.g., a broadcast goes through a product with
/// ones).
pub(crate) fn cpu_fast_paths_on(t: &Tensor) -> bool {
    t.device().is_cpu() && CPU_FAST_PATHS.with(|c| c.get()).unwrap_or(true)
}

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

/// `x + b` with `b` broadcast over the leading axes of `x` (a bias over batch and tokens, a
/// relative-position table over the batch).
///
/// # Shapes
/// `x [..., S...]`, `b [S...]` (the trailing shape of `x`) -> the shape of `x`. A `b` of any other
/// shape, and any device but the CPU, gets candle's `broadcast_add`. In float32 the CPU adds the
/// bias in one pass and sums its gradient over the rows directly (`cpu_ops`).
///
/// # Errors
/// Candle errors on shapes that do not broadcast.
pub fn add_leading(x: &Tensor, b: &Tensor) -> Result<Tensor> {
    match trailing_rows(x, b) {
        // Elsewhere the plain broadcast: the product's reshapes would each add backward operations.
        Some(rows) if cpu_fast_paths_on(x) => {
            let n = b.elem_count();
            if crate::cpu_ops::applies(x) {
                // float32: one pass each way (`cpu_ops`).
                let y = crate::cpu_ops::add_rows(&x.reshape((rows, n))?, &b.flatten_all()?)?;
                return Ok(y.reshape(x.shape())?);
            }
            let rep = repeat_rows(b, rows)?;
            Ok((x.reshape((rows, n))? + rep)?.reshape(x.shape())?)
        }
        _ => Ok(x.broadcast_add(b)?),
    }
}

/// `x * w` with `w` broadcast over the leading axes of `x` (a LayerNorm scale).
///
/// # Shapes
/// As [`add_leading`].
///
/// # Errors
/// Candle errors on shapes that do not broadcast.
pub fn mul_leading(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    match trailing_rows(x, w) {
        // Elsewhere the plain broadcast: the product's reshapes would each add backward operations.
        Some(rows) if cpu_fast_paths_on(x) => {
            let n = w.elem_count();
            let rep = repeat_rows(w, rows)?;
            Ok((x.reshape((rows, n))? * rep)?.reshape(x.shape())?)
        }
        _ => Ok(x.broadcast_mul(w)?),
    }
}

/// The sum over the rows of a matrix: on the CPU a product with a row of ones (module docs),
/// elsewhere candle's `sum(0)`.
///
/// # Shapes
/// `x [rows, N]` -> `[N]`.
///
/// # Errors
/// Candle errors (`x` not of rank 2).
pub(crate) fn sum_rows(x: &Tensor) -> Result<Tensor> {
    let (rows, n) = x.dims2()?;
    if !cpu_fast_paths_on(x) {
        return Ok(x.sum(0)?);
    }
    Ok(Tensor::ones((1, rows), x.dtype(), x.device())?
        .matmul(x)?
        .reshape(n)?)
}

/// LayerNorm over the last axis with scale `w` and bias `b`: the operations of candle's
/// differentiable `candle_nn::ops::layer_norm_slow` (the fused op drops gradients, `TOOLCHAIN.md`),
/// with the scale and bias applied through [`mul_leading`] and [`add_leading`]. The model uses
/// [`crate::fused::layer_norm`] (one kernel, hand-written gradient); this composed form is its
/// fallback on other devices and its reference in tests.
///
/// # Shapes
/// `x [..., D]`, `w [D]`, `b [D]` -> `[..., D]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let n = x.dim(D::Minus1)? as f64;
    let xc = x.broadcast_sub(&(x.sum_keepdim(D::Minus1)? / n)?)?;
    let var = (xc.sqr()?.sum_keepdim(D::Minus1)? / n)?;
    let xn = xc.broadcast_div(&(var + eps)?.sqrt()?)?;
    add_leading(&mul_leading(&xn, w)?, b)
}

/// The number of leading rows when `b`'s shape is the trailing shape of `x`.
fn trailing_rows(x: &Tensor, b: &Tensor) -> Option<usize> {
    let (xd, bd) = (x.dims(), b.dims());
    let lead = xd.len().checked_sub(bd.len())?;
    (lead > 0 && xd[lead..] == *bd && b.elem_count() > 0).then(|| xd[..lead].iter().product())
}

/// RMSHead over axis 1 (heads): `x / sqrt(mean_h x^2 + eps)` (flax `RMSNorm` over heads, without
/// scale). On the CPU the mean over heads and its broadcast back are products with ones, so that
/// neither pass sums over a leading axis; elsewhere candle's `mean_keepdim` and `broadcast_div`.
///
/// # Shapes
/// `x [B, H, rest...]` (the scores `[B, H, Q, K]`) -> the shape of `x`.
///
/// # Errors
/// Candle errors (`x` of rank below 2).
pub fn rms_over_heads(x: &Tensor, eps: f64) -> Result<Tensor> {
    let rms = (mean_over_heads(&x.sqr()?)? + eps)?.sqrt()?; // [B, 1, rest...]
    if !cpu_fast_paths_on(x) {
        return Ok(x.broadcast_div(&rms)?);
    }
    let (b, h) = (x.dim(0)?, x.dim(1)?);
    let n = x.elem_count() / (b * h).max(1);
    let rep = Tensor::ones((b, h, 1), x.dtype(), x.device())?.matmul(&rms.reshape((b, 1, n))?)?;
    Ok((x.reshape((b, h, n))? / rep)?.reshape(x.shape())?)
}

/// The mean over axis 1 (heads), kept as an axis of 1: on the CPU a product with a row of ones
/// (module docs), elsewhere candle's `mean_keepdim(1)`.
///
/// # Shapes
/// `x [B, H, rest...]` -> `[B, 1, rest...]`.
///
/// # Errors
/// Candle errors (`x` of rank below 2).
pub(crate) fn mean_over_heads(x: &Tensor) -> Result<Tensor> {
    if !cpu_fast_paths_on(x) {
        return Ok(x.mean_keepdim(1)?);
    }
    let (b, h) = (x.dim(0)?, x.dim(1)?);
    let n = x.elem_count() / (b * h).max(1);
    let mut dims = x.dims().to_vec();
    dims[1] = 1;
    let sum = Tensor::ones((b, 1, h), x.dtype(), x.device())?.matmul(&x.reshape((b, h, n))?)?;
    Ok((sum / h as f64)?.reshape(dims)?)
}

/// RMSHead's factor `1 / sqrt(mean_h x^2 + eps)` over axis 1 (heads), kept as an axis of 1, so that
/// `x * factor` is [`rms_over_heads`].
///
/// # Shapes
/// `x [B, H, rest...]` -> `[B, 1, rest...]`.
///
/// # Errors
/// Candle errors (`x` of rank below 2).
pub(crate) fn rms_factor_over_heads(x: &Tensor, eps: f64) -> Result<Tensor> {
    Ok((mean_over_heads(&x.sqr()?)? + eps)?.sqrt()?.recip()?)
}

/// The tanh approximation of GELU (`jax.nn.gelu(approximate=True)`, the paper's MLP activation):
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
///
/// On the CPU it is computed as the identical function `x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))`
/// (`0.5 (1 + tanh z) = sigmoid(2 z)`), whose forward and backward passes take 21 ms on a
/// `[4608, 256]` tensor against 84 ms for candle's `gelu`, whose gradient calls `powf` per element;
/// values agree with candle's `gelu` to 5e-7. In float32 the CPU runs the same function as one
/// operation with its gradient written out (`cpu_ops`: one pass each way). Elsewhere it is candle's
/// `gelu` (one kernel).
///
/// # Shapes
/// Any shape, elementwise.
///
/// # Errors
/// Candle errors.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    if !cpu_fast_paths_on(x) {
        return Ok(x.gelu()?);
    }
    if crate::cpu_ops::applies(x) {
        // float32: one pass each way (`cpu_ops`).
        return crate::cpu_ops::gelu_tanh(x);
    }
    /// `2 sqrt(2 / pi)`.
    const TWO_SQRT_2_OVER_PI: f64 = 1.595_769_121_605_730_7;
    let inner = (x + ((x.sqr()? * x)? * 0.044715)?)?;
    Ok((x * candle_nn::ops::sigmoid(&(inner * TWO_SQRT_2_OVER_PI)?)?)?)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Random inputs of one mix for the gradient tests of `fused` and `mix_kernel`: a causal mask
    /// `[t, t]`, a dropout multiplier (rate 0.3, from `seed`), scores `[b, h, t, t]` and values
    /// `[b, h, t, d]` as variables, and a cotangent of the output `[b, t, h, d]`.
    pub(crate) fn mix_inputs(
        (b, h, t, d): (usize, usize, usize, usize),
        seed: u64,
    ) -> (Tensor, Tensor, Var, Var, Tensor) {
        use rand::SeedableRng;
        let dev = Device::Cpu;
        let mask = crate::attention::causal_mask(t, &dev).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let drop = crate::attention::dropout_mask(t, t, 0.3, &mut rng, &dev).unwrap();
        let s = Var::randn(0f32, 1.0, (b, h, t, t), &dev).unwrap();
        let v = Var::randn(0f32, 1.0, (b, h, t, d), &dev).unwrap();
        let c = Tensor::randn(0f32, 1.0, (b, t, h, d), &dev).unwrap();
        (mask, drop, s, v, c)
    }

    /// The bits of a float32 tensor's values, for bitwise comparisons (shared with `cpu_ops`' and
    /// `mix_kernel`'s tests).
    pub(crate) fn bits(t: &Tensor) -> Vec<u32> {
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        v.into_iter().map(f32::to_bits).collect()
    }

    /// Asserts `|a - b| <= tol (1 + |b|)` elementwise (compared in float64; shared with
    /// `fused`'s tests).
    pub(crate) fn close(a: &Tensor, b: &Tensor, tol: f64) {
        let values = |t: &Tensor| -> Vec<f64> {
            t.flatten_all()
                .unwrap()
                .to_dtype(candle_core::DType::F64)
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let (a, b) = (values(a), values(b));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    /// The product forms give the broadcast's values and the same gradients as the native
    /// broadcast (the form used on the GPU), for every helper.
    #[test]
    fn product_forms_match_broadcasts_in_value_and_gradient() {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 1.0, (3, 5, 4, 6), &dev).unwrap();
        let b = Var::randn(0f32, 1.0, (4, 6), &dev).unwrap();
        let c = Tensor::randn(0f32, 1.0, (3, 5, 4, 6), &dev).unwrap();
        // Fast paths on: the product forms; off: the plain operations other devices run.
        let run = |fast: bool| {
            with_cpu_fast_paths(fast, || {
                let y = add_leading(&mul_leading(x.as_tensor(), b.as_tensor())?, b.as_tensor())?;
                let z = rms_over_heads(&y, 1e-6)?;
                let g = (&z * &c)?.sum_all()?.backward()?;
                Ok::<_, crate::ModelError>((
                    y,
                    z,
                    g.get(x.as_tensor()).unwrap().clone(),
                    g.get(b.as_tensor()).unwrap().clone(),
                ))
            })
            .unwrap()
        };
        let (y1, z1, gx1, gb1) = run(true);
        let (y0, z0, gx0, gb0) = run(false);
        assert_eq!(
            y1.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            y0.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            "repeat_rows must give the broadcast's values exactly"
        );
        close(&z1, &z0, 1e-6);
        close(&gx1, &gx0, 1e-5);
        close(&gb1, &gb0, 1e-5);
        // The public helpers choose the product form on the CPU and agree with the broadcasts.
        let xt = x.as_tensor();
        close(
            &add_leading(xt, b.as_tensor()).unwrap(),
            &xt.broadcast_add(b.as_tensor()).unwrap(),
            0.0,
        );
        close(
            &mul_leading(xt, b.as_tensor()).unwrap(),
            &xt.broadcast_mul(b.as_tensor()).unwrap(),
            0.0,
        );
        // Shapes that are not a trailing shape fall back to the native broadcast.
        let col = Tensor::randn(0f32, 1.0, (3, 1, 1, 1), &dev).unwrap();
        close(
            &add_leading(xt, &col).unwrap(),
            &xt.broadcast_add(&col).unwrap(),
            0.0,
        );
        let rms = rms_over_heads(xt, 1e-6).unwrap();
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
        let run = |fast: bool| {
            with_cpu_fast_paths(fast, || {
                let y = gelu_tanh(x.as_tensor()).unwrap();
                let g = (&y * &c).unwrap().sum_all().unwrap().backward().unwrap();
                (y, g.get(x.as_tensor()).unwrap().clone())
            })
        };
        let (y1, g1) = run(true);
        let (y0, g0) = run(false);
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

    #[test]
    fn fast_paths_switch_off_per_thread_and_restore() {
        let x = Tensor::ones((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(cpu_fast_paths_on(&x));
        with_cpu_fast_paths(false, || {
            assert!(!cpu_fast_paths_on(&x));
            with_cpu_fast_paths(true, || assert!(cpu_fast_paths_on(&x)));
            assert!(!cpu_fast_paths_on(&x));
            // Other threads keep their own setting.
            std::thread::spawn({
                let x = x.clone();
                move || assert!(cpu_fast_paths_on(&x))
            })
            .join()
            .unwrap();
        });
        assert!(cpu_fast_paths_on(&x));
        let caught = std::panic::catch_unwind(|| with_cpu_fast_paths(false, || panic!("inside")));
        assert!(caught.is_err());
        assert!(cpu_fast_paths_on(&x), "restored after a panic");
    }
}
