//! The choice of instruction set: [`Kernels`], detected once at run time, dispatches the attention
//! loops, the GELU, LayerNorm and the bias additions to their baseline x86-64 copies or to copies
//! compiled with AVX2 and FMA (for the GELU, LayerNorm and the bias additions the wrappers below;
//! the attention loops' AVX2 forms are beside their portable ones, in `attention.rs`).

#[cfg(doc)]
use super::attention::padded;
#[cfg(target_arch = "x86_64")]
use super::attention::{codes_avx2, value_avx2};
use super::attention::{codes_of_problem, default_value, Shape};
use super::buffers::Scratch;
use super::maths::{add_biased, add_rows, gelu_in_place, layer_norm};
use crate::mixer::Normalisation;
#[cfg(target_arch = "x86_64")]
use crate::ops::fast::mix::value_from_codes_avx2;
use crate::ops::fast::mix::{value_from_codes, Plan, Rows};

/// The per-problem attention loops ([`codes_of_problem`], [`default_value`], the HYLA value network
/// of `ops::fast::mix`), the GELU, LayerNorm and the bias additions, compiled twice: for the
/// baseline x86-64 instruction set, and with AVX2 and FMA for CPUs that have them (chosen once, at
/// run time). The loops are the same code, or in the AVX2 copy (scores, K/V transposes, value sums)
/// intrinsics that do the same operations in the same order, so both give the same bits; FMA is
/// only enabled, never asked for (Rust does not fuse a product and a sum on its own).
#[derive(Debug, Clone, Copy)]
pub(super) enum Kernels {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernels {
    /// AVX2 with FMA where this CPU has both.
    pub(super) fn detect() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Kernels::Avx2;
        }
        Kernels::Baseline
    }

    /// [`codes_of_problem`] with this instruction set.
    // The workspace denies `unsafe`; calling a function compiled for more features than the
    // baseline needs it.
    #[allow(unsafe_code, clippy::too_many_arguments)]
    pub(super) fn codes(
        self,
        shape: &Shape,
        norm: Normalisation,
        visible: Option<&[bool]>,
        q0: usize,
        qkv: &[f32],
        bias: &[f32],
        w: &mut Scratch,
    ) {
        match self {
            Kernels::Baseline => codes_of_problem::<false>(shape, norm, visible, q0, qkv, bias, w),
            // SAFETY: `Kernels::Avx2` is only made by `detect`, after the CPU reported AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { codes_avx2(shape, norm, visible, q0, qkv, bias, w) },
        }
    }

    /// [`gelu_in_place`] with this instruction set.
    #[allow(unsafe_code)]
    pub(super) fn gelu(self, v: &mut [f32]) {
        match self {
            Kernels::Baseline => gelu_in_place(v),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { gelu_avx2(v) },
        }
    }

    /// [`layer_norm`] with this instruction set.
    #[allow(unsafe_code)]
    pub(super) fn layer_norm(self, x: &[f32], wb: &(Vec<f32>, Vec<f32>), y: &mut [f32]) {
        match self {
            Kernels::Baseline => layer_norm(x, wb, y),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { layer_norm_avx2(x, wb, y) },
        }
    }

    /// [`add_rows`] with this instruction set.
    #[allow(unsafe_code)]
    pub(super) fn add_rows(self, x: &mut [f32], b: &[f32]) {
        match self {
            Kernels::Baseline => add_rows(x, b),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { add_rows_avx2(x, b) },
        }
    }

    /// [`add_biased`] with this instruction set.
    #[allow(unsafe_code)]
    pub(super) fn add_biased(self, resid: &mut [f32], y: &[f32], b: &[f32]) {
        match self {
            Kernels::Baseline => add_biased(resid, y, b),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { add_biased_avx2(resid, y, b) },
        }
    }

    /// [`default_value`] with this instruction set.
    #[allow(unsafe_code)]
    pub(super) fn value(self, shape: &Shape, q0: usize, att: &[f32], vt: &[f32], o: &mut [f32]) {
        match self {
            Kernels::Baseline => default_value(shape, q0, att, vt, o),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { value_avx2(shape, q0, att, vt, o) },
        }
    }

    /// `ops::fast::mix`'s [`value_from_codes`] (the HYLA value networks) with this instruction
    /// set, from the values transposed and padded, `vt [H, d, Tp]` with `Tp` = [`padded`]`(T)`
    /// (with AVX2 `value_from_codes_avx2`).
    #[allow(unsafe_code)]
    pub(super) fn mix_value(
        self,
        plan: &Plan,
        q0: usize,
        att: &[f32],
        (vt, tp): (&[f32], usize),
        o: &mut [f32],
        rows: &mut Rows,
    ) {
        match self {
            Kernels::Baseline => value_from_codes(plan, q0, att, (vt, tp), o, rows),
            // SAFETY: as in `Kernels::codes`.
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => unsafe { value_from_codes_avx2(plan, q0, att, vt, o, rows) },
        }
    }
}

/// [`layer_norm`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn layer_norm_avx2(x: &[f32], wb: &(Vec<f32>, Vec<f32>), y: &mut [f32]) {
    layer_norm(x, wb, y);
}

/// [`add_rows`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn add_rows_avx2(x: &mut [f32], b: &[f32]) {
    add_rows(x, b);
}

/// [`add_biased`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn add_biased_avx2(resid: &mut [f32], y: &[f32], b: &[f32]) {
    add_biased(resid, y, b);
}

/// [`gelu_in_place`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gelu_avx2(v: &mut [f32]) {
    gelu_in_place(v);
}
