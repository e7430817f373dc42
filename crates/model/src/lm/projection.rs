//! The projections of an imported language model's block that read the same input, `x W_i^T` for
//! PyTorch-layout matrices `W_i [n_i, in]` (a Llama block's Q, K and V; its gate and up
//! projections; or one matrix alone): on the CPU in float32 the matrices are packed once at load
//! into one [`PackedMatrix`] (in place of the tensors, so no more memory) and each call is one
//! product over the threads (`crate::ops::fast::gemm::matmul_packed`); elsewhere the tensors
//! stay and each product is [`super::layers::linear`].

use std::sync::Arc;

use candle_core::{Device, Tensor};
use hyperlens_kernels::PackedMatrix;

use super::layers::linear;
use crate::error::{ModelError, Result};
use crate::ops::fast;

/// One or more weight matrices applied to the same input (module docs).
#[derive(Debug, Clone)]
pub(crate) struct Projection(Weights);

/// How a [`Projection`] holds its matrices.
#[derive(Debug, Clone)]
enum Weights {
    /// Packed on the CPU in float32 (shared between clones, as a tensor's storage is).
    Packed(Arc<PackedMatrix>, Device),
    /// The tensors, on another device or of another dtype.
    Tensors(Vec<Tensor>),
}

impl Projection {
    /// The projection by the matrices `ws` (each `[n_i, in]`, one `in`), packed when they are all
    /// float32 on the CPU.
    ///
    /// # Errors
    /// [`ModelError::Input`] for no matrix, or matrices that are not 2-D of one input width;
    /// candle errors.
    pub(crate) fn new(ws: Vec<Tensor>) -> Result<Self> {
        let k = match ws.first().map(|w| w.dims2()) {
            Some(Ok((_, k))) => k,
            _ => return Err(ModelError::Input("projection: no 2-D weight matrix".into())),
        };
        if ws.iter().any(|w| w.dims2().ok().map(|(_, c)| c) != Some(k)) {
            return Err(ModelError::Input(format!(
                "projection: matrices {:?} do not share the input width {k}",
                ws.iter().map(|w| w.dims().to_vec()).collect::<Vec<_>>()
            )));
        }
        if !ws.iter().all(fast::cpu_f32) {
            return Ok(Self(Weights::Tensors(ws)));
        }
        let data = ws
            .iter()
            .map(|w| Ok(w.flatten_all()?.to_vec1::<f32>()?))
            .collect::<Result<Vec<_>>>()?;
        let parts: Vec<&[f32]> = data.iter().map(Vec::as_slice).collect();
        let packed = PackedMatrix::new(k, &parts).map_err(ModelError::Input)?;
        Ok(Self(Weights::Packed(Arc::new(packed), Device::Cpu)))
    }

    /// `x W_i^T` for each matrix, in order.
    ///
    /// # Shapes
    /// `x [..., in]` -> one `[..., n_i]` per matrix.
    ///
    /// # Errors
    /// Candle errors (mismatched shapes, `x` on another device than the weights).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match &self.0 {
            Weights::Packed(w, device) if fast::cpu_f32(x) => {
                fast::gemm::matmul_packed(x, w, device)
            }
            Weights::Packed(..) => Err(ModelError::Input(format!(
                "projection: input of dtype {:?} on {:?}, weights float32 on the CPU",
                x.dtype(),
                x.device()
            ))),
            Weights::Tensors(ws) => ws.iter().map(|w| linear(x, w)).collect(),
        }
    }

    /// The one product of a projection with one matrix.
    ///
    /// # Shapes
    /// `x [..., in]` -> `[..., n]`.
    ///
    /// # Errors
    /// As [`Projection::forward`].
    pub(crate) fn forward1(&self, x: &Tensor) -> Result<Tensor> {
        self.forward(x)?
            .pop()
            .ok_or_else(|| ModelError::Input("projection: no matrix".into()))
    }

    /// The gate and up projections (this projection's two matrices) and the SwiGLU of them in
    /// the products' tasks (`crate::ops::fast::lm::packed_swiglu`): `Some((pre, lin, post))`
    /// when packed, else `None` (the caller takes [`Projection::forward`] and its own SwiGLU).
    ///
    /// # Shapes
    /// `x [..., in]` -> three `[..., n]`.
    ///
    /// # Errors
    /// Candle errors.
    pub(crate) fn forward_swiglu(&self, x: &Tensor) -> Result<Option<(Tensor, Tensor, Tensor)>> {
        match &self.0 {
            Weights::Packed(w, device) => fast::lm::packed_swiglu(x, w, device),
            Weights::Tensors(_) => Ok(None),
        }
    }

    /// The Q, K and V projections (this projection's three matrices) and the rotary embedding
    /// of Q and K with heads of `d` in the products' tasks
    /// (`crate::ops::fast::lm::packed_qkv_rope`): `Some(([q, k, v], q rotated, k rotated))`
    /// when packed, else `None`.
    ///
    /// # Shapes
    /// `x [B, T, in]`, `cos`, `sin` `[T, d/2]` -> `[B, T, n_i]` each, `[B, H, T, d]`,
    /// `[B, H_kv, T, d]`.
    ///
    /// # Errors
    /// Candle errors.
    pub(crate) fn forward_rotary(
        &self,
        x: &Tensor,
        d: usize,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<Option<(Vec<Tensor>, Tensor, Tensor)>> {
        match &self.0 {
            Weights::Packed(w, device) => fast::lm::packed_qkv_rope(x, w, device, d, cos, sin),
            Weights::Tensors(_) => Ok(None),
        }
    }

    /// The product with this projection's one matrix, then the residual addition `h + y` and the
    /// RMSNorm of the sum with the gain `g`, in the product's tasks
    /// (`crate::ops::fast::lm::packed_residual_norm`): `Some((y, h + y, its norm))` when packed,
    /// else `None`.
    ///
    /// # Shapes
    /// `x [..., in]`, `h [..., D]`, `g [D]` -> three `[..., D]`.
    ///
    /// # Errors
    /// Candle errors.
    pub(crate) fn forward_residual_norm(
        &self,
        x: &Tensor,
        h: &Tensor,
        g: &Tensor,
        eps: f32,
    ) -> Result<Option<(Tensor, Tensor, Tensor)>> {
        match &self.0 {
            Weights::Packed(w, device) => fast::lm::packed_residual_norm(x, w, device, h, g, eps),
            Weights::Tensors(_) => Ok(None),
        }
    }

    /// The matrices as tensors `[n_i, in]` (unpacked copies on the CPU), in order.
    ///
    /// # Errors
    /// Candle errors.
    pub(crate) fn weights(&self) -> Result<Vec<Tensor>> {
        match &self.0 {
            Weights::Packed(w, device) => (0..w.parts())
                .map(|i| Ok(Tensor::from_vec(w.unpack(i), (w.rows(i), w.k()), device)?))
                .collect(),
            Weights::Tensors(ws) => Ok(ws.clone()),
        }
    }

    /// The same projection with each matrix `w` replaced by `f(w)`, in order.
    ///
    /// # Errors
    /// `f`'s errors; as [`Projection::new`].
    pub(crate) fn map(&self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<Self> {
        let ws = self
            .weights()?
            .iter()
            .map(&mut *f)
            .collect::<Result<Vec<_>>>()?;
        Self::new(ws)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;

    use super::*;

    #[test]
    fn a_packed_projection_equals_the_products_of_its_matrices() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (3, 50, 40), &dev).unwrap();
        let ws: Vec<Tensor> = [72, 8, 100]
            .iter()
            .map(|&n| Tensor::randn(0f32, 1.0, (n, 40), &dev).unwrap())
            .collect();
        let p = Projection::new(ws.clone()).unwrap();
        assert!(matches!(p.0, Weights::Packed(..)));
        let got = p.forward(&x).unwrap();
        for ((y, w), back) in got.iter().zip(&ws).zip(p.weights().unwrap()) {
            let want = x.broadcast_matmul(&w.t().unwrap()).unwrap();
            assert_eq!(y.dims(), want.dims());
            let diff = (y - want).unwrap().abs().unwrap().max_all().unwrap();
            assert!(diff.to_scalar::<f32>().unwrap() < 1e-4);
            let same = (back - w).unwrap().abs().unwrap().max_all().unwrap();
            assert_eq!(same.to_scalar::<f32>().unwrap(), 0.0);
        }
        // float64 weights stay tensors; mismatched widths are an error naming the projection
        let w64 = ws[0].to_dtype(DType::F64).unwrap();
        assert!(matches!(
            Projection::new(vec![w64]).unwrap().0,
            Weights::Tensors(_)
        ));
        let bad = Tensor::zeros((4, 39), DType::F32, &dev).unwrap();
        let err = Projection::new(vec![ws[0].clone(), bad]).unwrap_err();
        assert!(err.to_string().contains("projection"));
    }
}
