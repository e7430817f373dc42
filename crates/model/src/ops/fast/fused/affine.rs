//! The affine maps as single graph nodes: [`linear`] (`x W + b`) and [`project_heads`] (the
//! per-head projection), with their shared gradient.

use candle_core::Tensor;

use super::super::{attach, cpu, Gradient};
use super::sum_rows;
use crate::error::Result;

/// `x W + b` over the last axis as one graph node: the forward pass is a matrix product and the
/// bias (on detached inputs), the gradient `dx = g W^T`, `dW = x^T g`, `db = sum_rows g`. As
/// composed candle operations it would be four nodes (two reshapes, the product, the bias), each
/// costing candle's backward pass a zero-filled gradient slot and an addition.
///
/// # Shapes
/// `x [..., in]`, `w [in, out]`, `b [out]` -> `[..., out]`.
///
/// # Errors
/// Candle errors on mismatched shapes.
pub(crate) fn linear(x: &Tensor, w: &Tensor, b: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    let (n_in, n_out) = w.dims2()?;
    let rows = x.elem_count() / n_in.max(1);
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = n_out;
    }
    let y = affine_rows(
        &x.detach().reshape((rows, n_in))?,
        &w.detach(),
        &b.detach(),
        cpu_kernels,
    )?;
    let grad = AffineGrad {
        layout: None,
        cpu_kernels,
    };
    attach(&[x, w, b], y.reshape(dims)?, grad)
}

/// The per-head projection `y[b, h, t, :] = x[b, t] W[h] + bias[h]` as one graph node (the
/// composed form, [`reference::project_heads`], is eight nodes): the heads' kernels side by side
/// as one `[D, H d]` matrix, a product on the rows, heads to axis 1; the gradient reverses the
/// layout changes around that of [`linear`].
///
/// # Shapes
/// `x [B, T, D]`, `w [H, D, d]`, `b [H, d]` -> `[B, H, T, d]` (contiguous).
///
/// # Errors
/// Candle errors on mismatched shapes.
///
/// [`reference::project_heads`]: crate::ops::reference::project_heads
pub(crate) fn project_heads(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    cpu_kernels: bool,
) -> Result<Tensor> {
    let (bsz, t, _) = x.dims3()?;
    let (h, _, d) = w.dims3()?;
    let y = heads_value(&x.detach(), &w.detach(), &b.detach(), cpu_kernels)?;
    let grad = AffineGrad {
        layout: Some((bsz, t, h, d)),
        cpu_kernels,
    };
    attach(&[x, w, b], y, grad)
}

/// The value of [`project_heads`], off the graph: the heads' kernels side by side as one
/// `[D, H d]` matrix, a product on the rows, heads to axis 1.
///
/// # Shapes
/// `x [B, T, D]`, `w [H, D, d]`, `b [H, d]` -> `[B, H, T, d]` (contiguous).
pub(super) fn heads_value(x: &Tensor, w: &Tensor, b: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    let (bsz, t, dm) = x.dims3()?;
    let (h, _, d) = w.dims3()?;
    let w2 = w.transpose(0, 1)?.reshape((dm, h * d))?;
    let y = affine_rows(
        &x.reshape((bsz * t, dm))?,
        &w2,
        &b.reshape(h * d)?,
        cpu_kernels,
    )?;
    Ok(y.reshape((bsz, t, h, d))?.transpose(1, 2)?.contiguous()?)
}

/// `x W + b` on the rows of a matrix, off the graph.
///
/// # Shapes
/// `x [rows, in]`, `w [in, out]`, `b [out]` -> `[rows, out]`.
pub(super) fn affine_rows(x: &Tensor, w: &Tensor, b: &Tensor, cpu_kernels: bool) -> Result<Tensor> {
    let y = x.matmul(w)?;
    if cpu_kernels {
        return cpu::add_rows(&y, b);
    }
    Ok(y.broadcast_add(b)?)
}

/// The gradient of [`linear`] (`layout: None`) and of [`project_heads`] (`layout: Some((B, T, H,
/// d))`).
pub(super) struct AffineGrad {
    /// The head layout of [`project_heads`].
    pub(super) layout: Option<(usize, usize, usize, usize)>,
    /// Whether the CPU kernels run.
    pub(super) cpu_kernels: bool,
}

impl Gradient for AffineGrad {
    const NAME: &'static str = "hyperlens-affine";

    fn gradients(&self, inputs: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (x, w, b) = (inputs[0], inputs[1], inputs[2]);
        // Everything as the row form `y2 [rows, out] = x2 [rows, in] w2 [in, out] + b2 [out]`.
        let (w2, g2) = match self.layout {
            None => {
                let (_, n_out) = w.dims2()?;
                (
                    w.clone(),
                    g.reshape((g.elem_count() / n_out.max(1), n_out))?,
                )
            }
            Some((bsz, t, h, d)) => {
                let dm = w.dim(1)?;
                let w2 = w.transpose(0, 1)?.reshape((dm, h * d))?;
                let g2 = g.transpose(1, 2)?.contiguous()?.reshape((bsz * t, h * d))?;
                (w2, g2)
            }
        };
        let n_in = w2.dim(0)?;
        let x2 = x.reshape((x.elem_count() / n_in.max(1), n_in))?;
        let dx = g2.matmul(&w2.t()?)?.reshape(x.shape())?;
        let dw2 = x2.t()?.matmul(&g2)?;
        let db = sum_rows(&g2, self.cpu_kernels)?;
        let (dw, db) = match self.layout {
            None => (dw2, db),
            Some((_, _, h, d)) => {
                let dm = dw2.dim(0)?;
                let dw = dw2.reshape((dm, h, d))?.transpose(0, 1)?.contiguous()?;
                (dw, db.reshape((h, d))?)
            }
        };
        Ok(vec![Some(dx), Some(dw), Some(db.reshape(b.shape())?)])
    }
}
