//! The plan of one mix (sizes, normalisation, mask, dropout) and the per-problem scratch rows
//! ([`Rows`]: the codes and hidden units of one query), shared by training and [`crate::infer`].
//! The row primitives they use (RMSHead's scales, the masked softmax of a row) are
//! `hyperlens_kernels::portable`'s, the same functions that the engine's attention calls.

use hyperlens_kernels::portable::{rms_head_scales, softmax_row};

use crate::mixer::Normalisation;
use crate::ops::reference::RMS_HEAD_EPS;

/// The sizes and the per-pair constants of one mix.
pub(crate) struct Plan {
    /// Heads.
    pub(super) h: usize,
    /// Queries.
    pub(super) q: usize,
    /// Keys.
    pub(super) k: usize,
    /// Head width.
    pub(super) d: usize,
    /// The normalisation of the scores.
    pub(super) norm: Normalisation,
    /// ReLU value network (else linear).
    pub(super) relu: bool,
    /// Visibility per pair `[Q * K]` (none: all visible).
    pub(super) visible: Option<Vec<bool>>,
    /// Dropout multipliers per pair, one `[Q * K]` mask per group of `per_mask` consecutive
    /// problems, `[G * Q * K]` (none: 1).
    pub(super) dropout: Option<Vec<f32>>,
    /// Problems that share one dropout mask (all of them for a mask shared by the batch; the
    /// problems of one model in a stacked batch).
    pub(super) per_mask: usize,
}

impl Plan {
    /// The plan of an evaluation-mode mix (no dropout) of problems with `h` heads, `q` queries, `k`
    /// keys of width `d`, for [`crate::infer`]; `visible` is `[Q * K]` (none: all visible).
    pub(crate) fn evaluation(
        h: usize,
        (q, k): (usize, usize),
        d: usize,
        norm: Normalisation,
        relu: bool,
        visible: Option<Vec<bool>>,
    ) -> Plan {
        Plan {
            h,
            q,
            k,
            d,
            norm,
            relu,
            visible,
            dropout: None,
            per_mask: 1,
        }
    }

    /// The dropout multipliers of problem `n`, `[Q * K]`.
    pub(super) fn dropout_of(&self, n: usize) -> Option<&[f32]> {
        let qk = self.q * self.k;
        self.dropout
            .as_ref()
            .map(|v| &v[(n / self.per_mask.max(1)) * qk..][..qk])
    }
}

/// Scratch rows of one problem, laid out with the key axis last (`[.., K]`) so that every inner
/// loop runs over contiguous keys. [`crate::infer`] keeps one per worker and refills it per problem
/// ([`Rows::load`]), so that its value networks allocate nothing.
pub(crate) struct Rows {
    /// The values transposed to `[H, d, K]`.
    pub(super) vt: Vec<f32>,
    /// Masked scores of query `i`, `[H, K]`.
    pub(super) m: Vec<f32>,
    /// `1 / rms` over heads, `[K]` (ones without RMSHead).
    pub(super) r: Vec<f32>,
    /// The codes (normalised scores) of query `i`, `[H, K]`.
    pub(super) a: Vec<f32>,
    /// Codes after dropout, `[H, K]`.
    pub(super) ad: Vec<f32>,
    /// Hidden units before and after the activation, `[d, K]`.
    pub(super) pre: Vec<f32>,
    /// See `pre`.
    pub(super) hid: Vec<f32>,
    /// The hidden units with the keys padded to a multiple of 8, `[d, Kp]`
    /// ([`super::value_from_codes_isa`]'s AVX2 form).
    pub(super) hid_padded: Vec<f32>,
}

impl Rows {
    /// Buffers for `p`, with the values `v [H, K, d]` of one problem transposed in.
    pub(crate) fn new(p: &Plan, v: &[f32]) -> Rows {
        let (h, k, d) = (p.h, p.k, p.d);
        let mut rows = Rows {
            vt: vec![0f32; h * d * k],
            m: vec![0f32; h * k],
            r: vec![1f32; k],
            a: vec![0f32; h * k],
            ad: vec![0f32; h * k],
            pre: vec![0f32; d * k],
            hid: vec![0f32; d * k],
            hid_padded: vec![0f32; d * k.div_ceil(8) * 8],
        };
        rows.load(p, v);
        rows
    }

    /// Transposes the values `v [H, K, d]` of one problem into `self.vt [H, d, K]`.
    #[inline(always)]
    pub(crate) fn load(&mut self, p: &Plan, v: &[f32]) {
        let (h, k, d) = (p.h, p.k, p.d);
        for hh in 0..h {
            for j in 0..k {
                for e in 0..d {
                    self.vt[(hh * d + e) * k + j] = v[(hh * k + j) * d + e];
                }
            }
        }
    }

    /// The codes and hidden units of query `i` against every key, from the scores `s [H, Q, K]`.
    pub(super) fn query(&mut self, p: &Plan, s: &[f32], drop: Option<&[f32]>, i: usize) {
        self.codes(p, s, i);
        self.hidden(p, drop, i);
    }

    /// The codes of query `i` against every key (`self.a`), from the scores `s [H, Q, K]`.
    fn codes(&mut self, p: &Plan, s: &[f32], i: usize) {
        let (h, k) = (p.h, p.k);
        let vis = p.visible.as_ref().map(|v| &v[i * k..][..k]);
        for hh in 0..h {
            let row = &s[(hh * p.q + i) * k..][..k];
            let m = &mut self.m[hh * k..][..k];
            match vis {
                Some(vis) => {
                    for ((m, &x), &on) in m.iter_mut().zip(row).zip(vis) {
                        *m = if on { x } else { 0.0 };
                    }
                }
                None => m.copy_from_slice(row),
            }
        }
        match p.norm {
            Normalisation::RmsHead => {
                rms_head_scales(&self.m, k, 0, RMS_HEAD_EPS as f32, &mut self.r);
                for (a, m) in self.a.chunks_exact_mut(k).zip(self.m.chunks_exact(k)) {
                    for ((a, &x), &r) in a.iter_mut().zip(m).zip(&self.r) {
                        *a = x * r;
                    }
                }
            }
            Normalisation::None => self.a.copy_from_slice(&self.m),
            Normalisation::Softmax => {
                for hh in 0..h {
                    let row = &s[(hh * p.q + i) * k..][..k];
                    softmax_row(row, vis, &mut self.a[hh * k..][..k]);
                }
            }
        }
    }

    /// The codes after dropout and the hidden units of query `i` from the codes in `self.a`.
    fn hidden(&mut self, p: &Plan, drop: Option<&[f32]>, i: usize) {
        let k = p.k;
        let drop = drop.map(|v| &v[i * k..][..k]);
        match drop {
            Some(dr) => {
                for (ad, a) in self.ad.chunks_exact_mut(k).zip(self.a.chunks_exact(k)) {
                    for ((y, &x), &dr) in ad.iter_mut().zip(a).zip(dr) {
                        *y = x * dr;
                    }
                }
            }
            None => self.ad.copy_from_slice(&self.a),
        }
        Rows::hidden_from(
            p,
            (&self.vt, k),
            (&self.ad, k),
            &mut self.pre,
            &mut self.hid,
        );
    }

    /// The hidden units of one query into `hid [d, K]` (`pre [d, K]` before the activation),
    /// from the values `vt [H, d, Kv]` (rows of `vs = Kv >= K` floats, the keys first: `Rows::vt`
    /// has `Kv = K`, `crate::infer`'s padded values more) and its codes after dropout `ad`, head
    /// `hh`'s `K` codes at `ad[hh * stride..]` (in `Rows::ad`: stride `K`; in codes `[H, Q, K]`:
    /// stride `Q K`).
    // Inlined so that `crate::infer`'s copies compiled for wider vector units cover it.
    #[inline(always)]
    pub(super) fn hidden_from(
        p: &Plan,
        (vt, vs): (&[f32], usize),
        (ad, stride): (&[f32], usize),
        pre: &mut [f32],
        hid: &mut [f32],
    ) {
        let (h, k, d) = (p.h, p.k, p.d);
        pre.fill(0.0);
        for hh in 0..h {
            let ad = &ad[hh * stride..][..k];
            for e in 0..d {
                let pre = &mut pre[e * k..][..k];
                for ((x, &a), &v) in pre.iter_mut().zip(ad).zip(&vt[(hh * d + e) * vs..][..k]) {
                    *x += a * v;
                }
            }
        }
        for (y, &x) in hid.iter_mut().zip(pre.iter()) {
            *y = if p.relu { x.max(0.0) } else { x };
        }
    }
}
