//! Training losses and on-device batch metrics, built only from differentiable candle ops (no fused
//! kernels: candle's fused kernels record no gradient, so a loss built on them would not train).

use candle_core::{DType, Tensor, D};

use crate::error::{Result, TrainError};

/// `log softmax` over the last axis, with the max subtracted (and detached) for stability.
///
/// # Shapes
/// `logits [..., C]` -> `[..., C]`.
fn log_softmax_last(logits: &Tensor) -> Result<Tensor> {
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(shifted.broadcast_sub(&lse)?)
}

/// Softmax cross-entropy, mean over every position: `mean_{b,f} (logsumexp_c z[b,f,c] - z[b,f,y[b,f]])`.
/// For SRAVEN this is the paper's loss (4 separate 8-way classifications at the last 4 positions,
/// mean over batch and features, `docs/spec/sraven.md`); for a token model, next-token cross-entropy.
///
/// # Shapes
/// `logits [B, F, C]` f32; `targets [B, F]` u32 with values in `0..C`. Returns a scalar.
///
/// # Errors
/// [`TrainError::InvalidParam`] if the shapes disagree; candle errors (e.g. a target out of range).
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (b, f, _) = logits.dims3()?;
    if targets.dims() != [b, f] {
        return Err(TrainError::InvalidParam(format!(
            "targets {:?} do not match logits {:?}",
            targets.dims(),
            logits.dims()
        )));
    }
    let logp = log_softmax_last(logits)?;
    let picked = logp.gather(&targets.to_dtype(DType::U32)?.unsqueeze(2)?, 2)?;
    Ok(picked.mean_all()?.neg()?)
}

/// Mean squared error `mean_b (pred[b] - y[b])^2` (the fuzzy-logic loss at the last position).
///
/// # Shapes
/// `pred [B]`, `y [B]`; returns a scalar.
///
/// # Errors
/// [`TrainError::InvalidParam`] if the shapes disagree.
pub fn mse(pred: &Tensor, y: &Tensor) -> Result<Tensor> {
    if pred.dims() != y.dims() {
        return Err(TrainError::InvalidParam(format!(
            "predictions {:?} and targets {:?} differ in shape",
            pred.dims(),
            y.dims()
        )));
    }
    Ok((pred - y)?.sqr()?.mean_all()?)
}

/// Number of rows whose every position is predicted right (argmax = target), as an f32 scalar on the
/// logits' device (no host synchronisation). With `F = 4` this counts SRAVEN problems solved; with
/// `all_positions = false` it counts right positions instead (token accuracy numerator).
///
/// # Shapes
/// `logits [B, F, C]`, `targets [B, F]` u32; returns a scalar.
///
/// # Errors
/// Candle errors on shape mismatches.
pub fn count_correct(logits: &Tensor, targets: &Tensor, all_positions: bool) -> Result<Tensor> {
    let pred = logits.detach().argmax(D::Minus1)?;
    let right = pred
        .eq(&targets.to_dtype(DType::U32)?)?
        .to_dtype(DType::F32)?;
    let right = if all_positions {
        right.min(D::Minus1)?
    } else {
        right
    };
    Ok(right.sum_all()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Float64 cross-entropy written with plain loops.
    fn reference_ce(z: &[f64], y: &[u32], b: usize, f: usize, c: usize) -> f64 {
        let mut total = 0.0;
        for i in 0..b {
            for j in 0..f {
                let row = &z[(i * f + j) * c..(i * f + j + 1) * c];
                let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
                total += lse - row[y[i * f + j] as usize];
            }
        }
        total / (b * f) as f64
    }

    #[test]
    fn cross_entropy_matches_reference_and_has_the_softmax_gradient() {
        let (b, f, c) = (3, 5, 7);
        let z: Vec<f32> = (0..b * f * c)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.31)
            .collect();
        let y: Vec<u32> = (0..b * f).map(|i| (i * 5 % c) as u32).collect();
        let dev = Device::Cpu;
        let zv = Var::from_vec(z.clone(), (b, f, c), &dev).unwrap();
        let yt = Tensor::from_vec(y.clone(), (b, f), &dev).unwrap();
        let loss = cross_entropy(zv.as_tensor(), &yt).unwrap();
        let z64: Vec<f64> = z.iter().map(|&v| v as f64).collect();
        let expect = reference_ce(&z64, &y, b, f, c);
        let got = loss.to_scalar::<f32>().unwrap() as f64;
        assert!((got - expect).abs() < 1e-5, "{got} vs {expect}");
        // d loss / d z = (softmax(z) - onehot(y)) / (B F)
        let g: Vec<f32> = loss
            .backward()
            .unwrap()
            .get(zv.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for r in 0..b * f {
            let row = &z64[r * c..(r + 1) * c];
            let s: f64 = row.iter().map(|v| v.exp()).sum();
            for k in 0..c {
                let onehot = if k == y[r] as usize { 1.0 } else { 0.0 };
                let want = (row[k].exp() / s - onehot) / (b * f) as f64;
                assert!(
                    (g[r * c + k] as f64 - want).abs() < 1e-6,
                    "row {r} class {k}"
                );
            }
        }
        let bad = Tensor::zeros((b, f + 1), DType::U32, &dev).unwrap();
        assert!(cross_entropy(zv.as_tensor(), &bad).is_err());
    }

    #[test]
    fn mse_and_counts() {
        let dev = Device::Cpu;
        let p = Tensor::new(&[0.5f32, 1.0, -2.0], &dev).unwrap();
        let y = Tensor::new(&[0.0f32, 1.0, 1.0], &dev).unwrap();
        let m = mse(&p, &y).unwrap().to_scalar::<f32>().unwrap();
        assert!((m - (0.25 + 0.0 + 9.0) / 3.0).abs() < 1e-6);
        assert!(mse(&p, &Tensor::new(&[0.0f32, 1.0], &dev).unwrap()).is_err());
        // 2 rows x 3 positions x 2 classes; row 0 all right, row 1 one wrong.
        let logits = Tensor::new(
            &[
                [[1.0f32, 0.0], [0.0, 1.0], [2.0, 1.0]],
                [[0.0, 3.0], [1.0, 0.0], [0.0, 1.0]],
            ],
            &dev,
        )
        .unwrap();
        let t = Tensor::new(&[[0u32, 1, 0], [1, 1, 1]], &dev).unwrap();
        assert_eq!(
            count_correct(&logits, &t, true)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            1.0
        );
        assert_eq!(
            count_correct(&logits, &t, false)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            5.0
        );
    }
}
