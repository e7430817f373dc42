//! The instruction set the kernels run with: [`Isa`], detected once per process, and the
//! dispatch of the kernels that have a copy per instruction set.

use std::mem::MaybeUninit;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use crate::{avx2, avx512};
use crate::{packed, portable, AttentionScratch, AttentionShape, CodesNorm, HylaShape};

/// The widest instruction set the kernels may use on this CPU.
///
/// A value is either [`Isa::PORTABLE`] (the baseline, on every CPU) or one that this CPU was found
/// to support ([`Isa::detected`], [`Isa::supported`]), so a dispatch through it never runs an
/// instruction the CPU lacks. The levels:
///
/// - portable: the baseline instruction set of the target;
/// - AVX2: AVX2 and FMA (x86-64);
/// - AVX-512: AVX-512F, with AVX2 and FMA (x86-64).
///
/// Each level includes the ones below it: on an AVX-512 CPU the kernels with only an AVX2 copy
/// take that copy. Every copy gives the portable code's bits (crate docs), so the choice changes
/// speed only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Isa(Level);

/// The levels of [`Isa`], in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Level {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The baseline instruction set, valid on every CPU (the kernels of [`portable`]).
    pub const PORTABLE: Isa = Isa(Level::Portable);

    /// The widest instruction set of this CPU, detected on the first call and kept for the
    /// process.
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(detect)
    }

    /// Every instruction set this CPU supports, from [`Isa::PORTABLE`] up to [`Isa::detected`]
    /// (for tests that hold each copy to the portable one).
    pub fn supported() -> Vec<Isa> {
        let top = Isa::detected();
        let mut all = vec![Isa::PORTABLE];
        #[cfg(target_arch = "x86_64")]
        for level in [Level::Avx2, Level::Avx512] {
            if level <= top.0 {
                all.push(Isa(level));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = top;
        all
    }

    /// Whether the AVX2 copies (AVX2 and FMA) may run.
    #[inline]
    pub fn avx2(self) -> bool {
        self.0 > Level::Portable
    }

    /// Whether the AVX-512 copies (AVX-512F) may run.
    #[inline]
    pub fn avx512(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return self.0 >= Level::Avx512;
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The name of the level: `portable`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self.0 {
            Level::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => "avx512",
        }
    }

    /// [`portable::gelu_tanh_reduced_in_place`] with this instruction set.
    // The workspace denies `unsafe`; calling a function compiled for more features than the
    // baseline needs it.
    #[inline]
    #[allow(unsafe_code)]
    pub fn gelu_tanh_reduced_in_place(self, v: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: `avx2()` holds only for a level detected on a CPU with AVX2 and FMA.
            return unsafe { avx2::gelu_tanh_reduced_in_place(v) };
        }
        portable::gelu_tanh_reduced_in_place(v)
    }

    /// [`portable::layer_norm`] with this instruction set.
    #[inline]
    #[allow(unsafe_code)]
    pub fn layer_norm(self, x: &[f32], wb: (&[f32], &[f32]), eps: f32, y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::layer_norm(x, wb, eps, y) };
        }
        portable::layer_norm(x, wb, eps, y)
    }

    /// [`packed::matmul_packed`] (`outs[i] = x W_i^T` with a [`packed::PackedMatrix`]) with this
    /// instruction set.
    ///
    /// # Shapes
    /// `x [m, k]`; `outs[i] [m, n_i]`.
    ///
    /// # Panics
    /// When the sizes do not match.
    #[inline]
    #[allow(unsafe_code)]
    pub fn matmul_packed(self, x: &[f32], w: &packed::PackedMatrix, outs: &mut [&mut [f32]]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx512() {
            let mut un: Vec<&mut [MaybeUninit<f32>]> = outs
                .iter_mut()
                .map(|o| {
                    let (ptr, len) = (o.as_mut_ptr(), o.len());
                    // SAFETY: `MaybeUninit<f32>` has the layout of `f32`; the slice reborrows
                    // `o`, and the AVX-512 copy writes only floats into it (never uninitialised
                    // values), so `o` stays initialised.
                    unsafe { std::slice::from_raw_parts_mut(ptr.cast::<MaybeUninit<f32>>(), len) }
                })
                .collect();
            // SAFETY: `avx512()` holds only for a level detected on a CPU with AVX-512F.
            return unsafe { avx512::matmul_packed(x, w, &mut un) };
        }
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::matmul_packed(x, w, outs) };
        }
        packed::matmul_packed(x, w, outs)
    }

    /// [`Isa::matmul_packed`] into outputs not yet initialised; on return every element of `outs`
    /// is written. The AVX-512 copy writes them directly (no zero-fill first); the others after
    /// zeroing them.
    ///
    /// # Shapes
    /// `x [m, k]`; `outs[i] [m, n_i]`.
    ///
    /// # Panics
    /// When the sizes do not match.
    #[inline]
    #[allow(unsafe_code)]
    pub fn matmul_packed_uninit(
        self,
        x: &[f32],
        w: &packed::PackedMatrix,
        outs: &mut [&mut [MaybeUninit<f32>]],
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.avx512() {
            // SAFETY: `avx512()` holds only for a level detected on a CPU with AVX-512F.
            return unsafe { avx512::matmul_packed(x, w, outs) };
        }
        let mut init: Vec<&mut [f32]> = outs
            .iter_mut()
            .map(|o| {
                o.fill(MaybeUninit::new(0.0));
                let (ptr, len) = (o.as_mut_ptr(), o.len());
                // SAFETY: every element of `o` was just initialised, and `MaybeUninit<f32>` has
                // the layout of `f32`; the slice reborrows `o`.
                unsafe { std::slice::from_raw_parts_mut(ptr.cast::<f32>(), len) }
            })
            .collect();
        self.matmul_packed(x, w, &mut init)
    }

    /// [`portable::silu_mul`] with this instruction set.
    #[inline]
    #[allow(unsafe_code)]
    pub fn silu_mul(self, g: &[f32], u: &[f32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::silu_mul(g, u, out) };
        }
        portable::silu_mul(g, u, out)
    }

    /// [`portable::softmax_prefix`] with this instruction set.
    #[inline]
    #[allow(unsafe_code)]
    pub fn softmax_prefix(self, s: &[f32], n: usize, a: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::softmax_prefix(s, n, a) };
        }
        portable::softmax_prefix(s, n, a)
    }

    /// [`portable::rope_half`] with this instruction set.
    #[inline]
    #[allow(unsafe_code)]
    pub fn rope_half(self, x: &[f32], cos: &[f32], sin: &[f32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::rope_half(x, cos, sin, out) };
        }
        portable::rope_half(x, cos, sin, out)
    }

    /// [`portable::rms_norm`] with this instruction set.
    #[inline]
    #[allow(unsafe_code)]
    pub fn rms_norm(self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::rms_norm(x, w, eps, out) };
        }
        portable::rms_norm(x, w, eps, out)
    }

    /// [`portable::add_rms_norm`] with this instruction set.
    #[inline]
    #[allow(unsafe_code)]
    pub fn add_rms_norm(
        self,
        h: &[f32],
        y: &[f32],
        w: &[f32],
        eps: f32,
        sum: &mut [f32],
        out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::add_rms_norm(h, y, w, eps, sum, out) };
        }
        portable::add_rms_norm(h, y, w, eps, sum, out)
    }

    /// [`portable::add_rows`] with this instruction set.
    #[inline]
    #[allow(unsafe_code)]
    pub fn add_rows(self, x: &mut [f32], b: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::add_rows(x, b) };
        }
        portable::add_rows(x, b)
    }

    /// [`portable::add_biased`] with this instruction set.
    #[inline]
    #[allow(unsafe_code)]
    pub fn add_biased(self, resid: &mut [f32], y: &[f32], b: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::add_biased(resid, y, b) };
        }
        portable::add_biased(resid, y, b)
    }

    /// [`portable::default_value`] (the standard value network of one problem) with this
    /// instruction set.
    #[inline]
    #[allow(unsafe_code)]
    pub fn default_value(
        self,
        shape: &AttentionShape,
        q0: usize,
        att: &[f32],
        vt: &[f32],
        o: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::default_value(shape, q0, att, vt, o) };
        }
        portable::default_value(shape, q0, att, vt, o)
    }

    /// [`portable::attention_codes`] (one problem's codes at one layer) with this instruction set.
    ///
    /// # Shapes
    /// As [`portable::attention_codes`].
    #[inline]
    #[allow(unsafe_code, clippy::too_many_arguments)]
    pub fn attention_codes(
        self,
        shape: &AttentionShape,
        norm: CodesNorm,
        visible: Option<&[bool]>,
        q0: usize,
        qkv: &[f32],
        bias: &[f32],
        w: &mut AttentionScratch,
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            return unsafe { avx2::attention_codes(shape, norm, visible, q0, qkv, bias, w) };
        }
        portable::attention_codes(shape, norm, visible, q0, qkv, bias, w)
    }

    /// The HYLA value network of one problem by [`avx2::hyla_value`] where this instruction set has
    /// AVX2 and the head width is 1, 2, 4 or 8; returns whether it ran. Where it does not, the
    /// caller runs the portable form, `hyperlens-model`'s `ops::fast::mix::value_from_codes` (the
    /// same bits), which belongs to the HYLA mix of training.
    ///
    /// # Shapes
    /// As [`avx2::hyla_value`].
    #[inline]
    #[allow(unsafe_code)]
    pub fn hyla_value(
        self,
        p: &HylaShape,
        q0: usize,
        a: &[f32],
        vt: &[f32],
        o: &mut [f32],
        hid_padded: &mut [f32],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self.avx2() {
            // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
            unsafe {
                match p.d {
                    1 => avx2::hyla_value::<1>(p, q0, a, vt, o, hid_padded),
                    2 => avx2::hyla_value::<2>(p, q0, a, vt, o, hid_padded),
                    4 => avx2::hyla_value::<4>(p, q0, a, vt, o, hid_padded),
                    8 => avx2::hyla_value::<8>(p, q0, a, vt, o, hid_padded),
                    _ => return false,
                }
            }
            return true;
        }
        let _ = (p, q0, a, vt, o, hid_padded);
        false
    }

    /// [`portable::squared_distances`] with this instruction set (AVX-512F, AVX2 or portable).
    ///
    /// # Shapes
    /// `rows [DISTANCE_ROWS, D]`, `xt [D, N]` (the data transposed), `out [DISTANCE_ROWS, N]`,
    /// all row-major.
    #[inline]
    #[allow(unsafe_code)]
    pub fn squared_distances(self, rows: &[f64], xt: &[f64], out: &mut [f64]) {
        #[cfg(target_arch = "x86_64")]
        {
            if self.avx512() {
                // SAFETY: `avx512()` holds only for a level detected on a CPU with AVX-512F.
                return unsafe { avx512::squared_distances(rows, xt, out) };
            }
            if self.avx2() {
                // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
                return unsafe { avx2::squared_distances(rows, xt, out) };
            }
        }
        portable::squared_distances(rows, xt, out)
    }

    /// [`portable::tsne_gradient_row`] with this instruction set (AVX-512F, AVX2 or portable).
    #[inline]
    #[allow(unsafe_code)]
    pub fn tsne_gradient_row(
        self,
        xi: f64,
        zi: f64,
        xs: &[f64],
        zs: &[f64],
        prow: &[f64],
    ) -> [f64; 5] {
        #[cfg(target_arch = "x86_64")]
        {
            if self.avx512() {
                // SAFETY: as in `Isa::squared_distances`.
                return unsafe { avx512::tsne_gradient_row(xi, zi, xs, zs, prow) };
            }
            if self.avx2() {
                // SAFETY: as in `Isa::gelu_tanh_reduced_in_place`.
                return unsafe { avx2::tsne_gradient_row(xi, zi, xs, zs, prow) };
            }
        }
        portable::tsne_gradient_row(xi, zi, xs, zs, prow)
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The widest level this CPU supports.
fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        if avx2 && std::arch::is_x86_feature_detected!("avx512f") {
            return Isa(Level::Avx512);
        }
        if avx2 {
            return Isa(Level::Avx2);
        }
    }
    Isa::PORTABLE
}
