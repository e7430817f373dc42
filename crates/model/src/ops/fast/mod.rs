//! The fast forms behind [`super::Ops`]: custom operations with hand-written gradients
//! ([`fused`], [`mix`]), CPU kernels ([`cpu`]) and broadcasts as products with ones ([`broadcast`]).
//!
//! Most of them compute their value off the graph (on detached inputs, with candle's fused kernels
//! or a CPU kernel) and then put it into the graph as one node whose gradient is written by hand.
//! [`attach`] is that one helper: a [`Gradient`] says how to differentiate, and the node's forward
//! pass is a copy of the precomputed value.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Shape, Storage, Tensor};

use crate::error::Result;

pub(crate) mod broadcast;
pub(crate) mod cpu;
pub(crate) mod fresh;
pub(crate) mod fused;
pub(crate) mod gemm;
pub(crate) mod lm;
pub(crate) mod mix;

/// Whether `x` is on the CPU.
pub(crate) fn cpu_device(x: &Tensor) -> bool {
    x.device().is_cpu()
}

/// Whether `x` is a float32 tensor on the CPU (where the CPU kernels run).
pub(crate) fn cpu_f32(x: &Tensor) -> bool {
    cpu_device(x) && x.dtype() == DType::F32
}

/// Whether the custom operations of [`fused`] run on `x`'s device and dtype: CPU or CUDA, float32
/// (candle's fused CPU LayerNorm has no float64).
pub(crate) fn fused_available(x: &Tensor) -> bool {
    (x.device().is_cpu() || x.device().is_cuda()) && x.dtype() == DType::F32
}

/// A hand-written gradient: the cotangents of a node's inputs from that of its output.
pub(crate) trait Gradient: Send + Sync {
    /// The node's name in candle's graph.
    const NAME: &'static str;

    /// The inputs' cotangents (`None`: no gradient flows to that input).
    ///
    /// # Shapes
    /// `inputs` as given to [`attach`]; `g` the shape of the node's value; one entry per input,
    /// each of its input's shape.
    ///
    /// # Errors
    /// Candle errors.
    fn gradients(&self, inputs: &[&Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>>;
}

/// Puts `value`, computed off the graph from `inputs` (one to three), into the graph as their
/// function, differentiated by `grad`. Without a tracked input, returns `value` itself.
///
/// # Shapes
/// Any; the node has the shape of `value`.
///
/// # Errors
/// Candle errors; a count of inputs other than 1 to 3.
pub(crate) fn attach<G: Gradient + 'static>(
    inputs: &[&Tensor],
    value: Tensor,
    grad: G,
) -> Result<Tensor> {
    if !inputs.iter().any(|t| t.track_op()) {
        return Ok(value);
    }
    let value = value.contiguous()?;
    let node = Node { value, grad };
    Ok(match inputs {
        [a] => a.apply_op1(node)?,
        [a, b] => a.apply_op2(b, node)?,
        [a, b, c] => a.apply_op3(b, c, node)?,
        _ => {
            return Err(crate::ModelError::Input(format!(
                "attach: {} inputs (1 to 3 supported)",
                inputs.len()
            )))
        }
    })
}

/// The graph node of [`attach`].
struct Node<G> {
    /// The precomputed value.
    value: Tensor,
    /// How to differentiate.
    grad: G,
}

impl<G: Gradient> Node<G> {
    /// A copy of the precomputed value's CPU storage.
    fn cpu_value(&self) -> candle_core::Result<(CpuStorage, Shape)> {
        let (storage, layout) = self.value.storage_and_layout();
        match &*storage {
            Storage::Cpu(s) if whole(layout) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => candle_core::bail!("{}: the value is not a whole CPU tensor", G::NAME),
        }
    }

    /// A copy of the precomputed value's CUDA storage.
    #[cfg(feature = "cuda")]
    fn cuda_value(&self) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (storage, layout) = self.value.storage_and_layout();
        match &*storage {
            Storage::Cuda(s) if whole(layout) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => candle_core::bail!("{}: the value is not a whole CUDA tensor", G::NAME),
        }
    }

    /// The `n` input cotangents, detached, from the gradient.
    fn backward(&self, inputs: &[&Tensor], g: &Tensor) -> candle_core::Result<Vec<Option<Tensor>>> {
        let detached: Vec<Tensor> = inputs.iter().map(|t| t.detach()).collect();
        let refs: Vec<&Tensor> = detached.iter().collect();
        let mut out = self
            .grad
            .gradients(&refs, &g.detach())
            .map_err(candle_core::Error::wrap)?;
        out.resize(inputs.len(), None);
        Ok(out)
    }
}

/// Whether a layout covers its storage from offset 0, contiguously (what `try_clone` copies).
fn whole(layout: &Layout) -> bool {
    layout.is_contiguous() && layout.start_offset() == 0
}

impl<G: Gradient> candle_core::CustomOp1 for Node<G> {
    fn name(&self) -> &'static str {
        G::NAME
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        self.cpu_value()
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        self.cuda_value()
    }

    fn bwd(&self, a: &Tensor, _: &Tensor, g: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(self.backward(&[a], g)?.swap_remove(0))
    }
}

impl<G: Gradient> candle_core::CustomOp2 for Node<G> {
    fn name(&self) -> &'static str {
        G::NAME
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.cpu_value()
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        self.cuda_value()
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _: &Tensor,
        g: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let mut v = self.backward(&[a, b], g)?.into_iter();
        Ok((v.next().flatten(), v.next().flatten()))
    }
}

impl<G: Gradient> candle_core::CustomOp3 for Node<G> {
    fn name(&self) -> &'static str {
        G::NAME
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.cpu_value()
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        self.cuda_value()
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        _: &Tensor,
        g: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let mut v = self.backward(&[a, b, c], g)?.into_iter();
        Ok((v.next().flatten(), v.next().flatten(), v.next().flatten()))
    }
}
