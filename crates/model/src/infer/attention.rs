//! The per-problem attention pass of the engine and its choice of instruction set: one problem's
//! codes at one layer (`hyperlens_kernels`'s [`Isa::attention_codes`], which runs the row kernels
//! for each normalisation, portable or with AVX2, the same bits) and its HYLA value network
//! (`ops::fast::mix`'s [`value_from_codes_isa`]). The kernels themselves live in
//! `hyperlens-kernels` (and, for the portable HYLA value networks shared with training, in
//! `ops::fast::mix`); this file maps the model's normalisation onto the kernels' and hands them
//! the instruction set.

use hyperlens_kernels::{AttentionScratch, AttentionShape, CodesNorm, Isa};

use crate::mixer::Normalisation;
use crate::ops::fast::mix::{value_from_codes_isa, Plan, Rows};
use crate::ops::reference::RMS_HEAD_EPS;

/// One problem's codes at one layer with the instruction set `isa`
/// ([`hyperlens_kernels::portable::attention_codes`]: keys and values transposed into `w.kt`,
/// `w.vt`, the scaled scores plus bias normalised into `w.att [H, T, T]`, the queries from `q0`).
///
/// # Shapes
/// `visible [T * T]` (none: every key visible), `qkv [T, 3 H d]`, `bias [H, T, Tp]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn codes(
    isa: Isa,
    shape: &AttentionShape,
    norm: Normalisation,
    visible: Option<&[bool]>,
    q0: usize,
    qkv: &[f32],
    bias: &[f32],
    w: &mut AttentionScratch,
) {
    let norm = match norm {
        Normalisation::Softmax => CodesNorm::Softmax,
        Normalisation::None => CodesNorm::Identity,
        Normalisation::RmsHead => CodesNorm::RmsHead(RMS_HEAD_EPS as f32),
    };
    isa.attention_codes(shape, norm, visible, q0, qkv, bias, w);
}

/// The HYLA value network of one problem from its codes with the instruction set `isa`
/// ([`value_from_codes_isa`]), from the values transposed and padded, `vt [H, d, Tp]` with `Tp` =
/// [`hyperlens_kernels::padded`]`(T)`.
///
/// # Shapes
/// `att [H, T, T]`, `o [T, H, d]`; the queries from `q0`.
pub(super) fn mix_value(
    isa: Isa,
    plan: &Plan,
    q0: usize,
    att: &[f32],
    (vt, tp): (&[f32], usize),
    o: &mut [f32],
    rows: &mut Rows,
) {
    value_from_codes_isa(isa, plan, q0, att, (vt, tp), o, rows);
}
