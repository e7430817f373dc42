//! The stacked forms (one leading model axis) of the affine maps and LayerNorm: one graph node
//! whose value and gradient are computed model by model with the single-model operation.

use candle_core::Tensor;

use super::super::{attach, Gradient};
use super::affine::{affine_rows, heads_value, AffineGrad};
use super::norm::LayerNormGrad;
use crate::error::Result;

/// The gradient of a stacked operation computed model by model: each model's slice of the
/// inputs and of the output's cotangent goes through `inner`, the gradient of the single-model
/// operation, so each model's gradients are those of its own single operation, bit for bit.
struct PerModel<G> {
    /// The single-model gradient.
    inner: G,
    /// Models M (the leading axis of every input).
    models: usize,
    /// The shape of one model's output.
    out_shape: Vec<usize>,
}

impl<G: Gradient> Gradient for PerModel<G> {
    const NAME: &'static str = G::NAME;

    fn gradients(&self, inputs: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let mut shape = vec![self.models];
        shape.extend(&self.out_shape);
        let g = g.reshape(shape)?;
        let mut per_input: Vec<Vec<Tensor>> = vec![Vec::with_capacity(self.models); inputs.len()];
        for m in 0..self.models {
            let slices = inputs
                .iter()
                .map(|t| Ok(t.get(m)?))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = slices.iter().collect();
            for (i, grad) in self
                .inner
                .gradients(&refs, &g.get(m)?)?
                .into_iter()
                .enumerate()
            {
                per_input[i].push(grad.ok_or_else(|| {
                    crate::ModelError::Input(format!("{}: no gradient for input {i}", G::NAME))
                })?);
            }
        }
        per_input
            .into_iter()
            .zip(inputs)
            .map(|(grads, x)| Ok(Some(Tensor::stack(&grads, 0)?.reshape(x.shape())?)))
            .collect()
    }
}

/// [`linear`] per model of a stack, as one graph node whose value and gradient are computed
/// model by model with the single-model operation (so each model gets exactly its single
/// operation's numbers; on the CPU there is no launch cost to save by batching).
///
/// # Shapes
/// `x [M, ..., in]`, `w [M, in, out]`, `b [M, out]` -> `[M, ..., out]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
///
/// [`linear`]: super::linear
pub(crate) fn stacked_linear(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    cpu_kernels: bool,
) -> Result<Tensor> {
    let (m, n_in, n_out) = w.dims3()?;
    let rows = x.elem_count() / (m * n_in).max(1);
    let (xd, wd, bd) = (x.detach(), w.detach(), b.detach());
    let ys = (0..m)
        .map(|i| {
            affine_rows(
                &xd.get(i)?.reshape((rows, n_in))?,
                &wd.get(i)?,
                &bd.get(i)?,
                cpu_kernels,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out_shape = x.dims()[1..].to_vec();
    if let Some(last) = out_shape.last_mut() {
        *last = n_out;
    }
    let mut dims = vec![m];
    dims.extend(&out_shape);
    let grad = PerModel {
        inner: AffineGrad {
            layout: None,
            cpu_kernels,
        },
        models: m,
        out_shape,
    };
    attach(&[x, w, b], Tensor::stack(&ys, 0)?.reshape(dims)?, grad)
}

/// [`project_heads`] per model of a stack (as [`stacked_linear`]), the model axis folded into the
/// batch of the result.
///
/// # Shapes
/// `x [M, B, T, D]`, `w [M, H, D, d]`, `b [M, H, d]` -> `[M * B, H, T, d]` (contiguous).
///
/// # Errors
/// Candle errors on mismatched shapes.
///
/// [`project_heads`]: super::project_heads
pub(crate) fn stacked_project_heads(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    cpu_kernels: bool,
) -> Result<Tensor> {
    let (m, bsz, t, _) = x.dims4()?;
    let (_, h, _, d) = w.dims4()?;
    let (xd, wd, bd) = (x.detach(), w.detach(), b.detach());
    let ys = (0..m)
        .map(|i| heads_value(&xd.get(i)?, &wd.get(i)?, &bd.get(i)?, cpu_kernels))
        .collect::<Result<Vec<_>>>()?;
    let grad = PerModel {
        inner: AffineGrad {
            layout: Some((bsz, t, h, d)),
            cpu_kernels,
        },
        models: m,
        out_shape: vec![bsz, h, t, d],
    };
    attach(&[x, w, b], Tensor::cat(&ys, 0)?, grad)
}

/// [`layer_norm`] per model of a stack (as [`stacked_linear`]).
///
/// # Shapes
/// `x [M, ..., D]`, `w [M, D]`, `b [M, D]` -> `[M, ..., D]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
///
/// [`layer_norm`]: super::layer_norm
pub(crate) fn stacked_layer_norm(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
    cpu_kernels: bool,
) -> Result<Tensor> {
    let m = w.dim(0)?;
    let x = x.contiguous()?;
    let (w, b) = (w.contiguous()?, b.contiguous()?);
    let (xd, wd, bd) = (x.detach(), w.detach(), b.detach());
    let ys = (0..m)
        .map(|i| {
            Ok(candle_nn::ops::layer_norm(
                &xd.get(i)?,
                &wd.get(i)?,
                &bd.get(i)?,
                eps as f32,
            )?)
        })
        .collect::<Result<Vec<_>>>()?;
    let grad = PerModel {
        inner: LayerNormGrad { eps, cpu_kernels },
        models: m,
        out_shape: x.dims()[1..].to_vec(),
    };
    attach(&[&x, &w, &b], Tensor::stack(&ys, 0)?, grad)
}
