//! The portable per-problem passes of the kernel: training's forward and backward pass of one
//! problem, and the evaluation-mode value network from given codes for [`crate::infer`].

use hyperlens_kernels::portable::{axpy, dot};

use super::rows::{Plan, Rows};
use crate::mixer::Normalisation;

/// The forward pass of one problem: `s [H, Q, K]`, `v [H, K, d]`, its dropout multipliers
/// `drop [Q, K]` -> `o [Q, H, d]`, attention `[H, Q, K]` (the codes before dropout).
pub(super) fn forward_one(
    p: &Plan,
    s: &[f32],
    v: &[f32],
    drop: Option<&[f32]>,
    o: &mut [f32],
    att: &mut [f32],
) {
    let (h, q, k, d) = (p.h, p.q, p.k, p.d);
    let mut rows = Rows::new(p, v);
    for i in 0..q {
        rows.query(p, s, drop, i);
        for hh in 0..h {
            att[(hh * q + i) * k..][..k].copy_from_slice(&rows.a[hh * k..][..k]);
            let ad = &rows.ad[hh * k..][..k];
            for e in 0..d {
                o[(i * h + hh) * d + e] = dot(ad, &rows.hid[e * k..][..k]);
            }
        }
    }
}

/// The evaluation-mode value network of one problem from its codes (no dropout): `a [H, Q, K]`
/// and the values transposed, `vt [H, d, Kv]` (rows of `vs = Kv >= K` floats, the keys first:
/// `crate::infer`'s padded values) -> `o [Q, H, d]`; the second half of [`forward_one`], for
/// [`crate::infer`], whose hooks may have changed the codes; the queries from `q0` only. `rows` is
/// scratch made by [`Rows::new`] for `p` (any values).
#[inline(always)]
pub(crate) fn value_from_codes(
    p: &Plan,
    q0: usize,
    a: &[f32],
    (vt, vs): (&[f32], usize),
    o: &mut [f32],
    rows: &mut Rows,
) {
    let (h, q, k, d) = (p.h, p.q, p.k, p.d);
    for i in q0..q {
        // Without dropout the codes after dropout are the codes, read where they are.
        Rows::hidden_from(
            p,
            (vt, vs),
            (&a[i * k..], q * k),
            &mut rows.pre,
            &mut rows.hid,
        );
        for hh in 0..h {
            let ad = &a[(hh * q + i) * k..][..k];
            for e in 0..d {
                o[(i * h + hh) * d + e] = dot(ad, &rows.hid[e * k..][..k]);
            }
        }
    }
}

/// The backward pass of one problem (dropout multipliers `drop [Q, K]`): from `go [Q, H, d]`,
/// `g_s [H, Q, K]` and `g_v [H, K, d]`.
pub(super) fn backward_one(
    p: &Plan,
    s: &[f32],
    v: &[f32],
    drop: Option<&[f32]>,
    go: &[f32],
    gs: &mut [f32],
    gv: &mut [f32],
) {
    let (h, q, k, d) = (p.h, p.q, p.k, p.d);
    let mut rows = Rows::new(p, v);
    let mut gpre = vec![0f32; d * k];
    let mut ga = vec![0f32; h * k];
    let mut gvt = vec![0f32; h * d * k];
    let mut c = vec![0f32; k];
    for i in 0..q {
        rows.query(p, s, drop, i);
        let go = &go[i * h * d..][..h * d];
        gpre.fill(0.0);
        for hh in 0..h {
            for e in 0..d {
                axpy(
                    &mut gpre[e * k..][..k],
                    go[hh * d + e],
                    &rows.ad[hh * k..][..k],
                );
            }
        }
        if p.relu {
            for (g, &x) in gpre.iter_mut().zip(&rows.pre) {
                if x <= 0.0 {
                    *g = 0.0;
                }
            }
        }
        for hh in 0..h {
            let ga = &mut ga[hh * k..][..k];
            ga.fill(0.0);
            for e in 0..d {
                let vt = &rows.vt[(hh * d + e) * k..][..k];
                let hid = &rows.hid[e * k..][..k];
                let gp = &gpre[e * k..][..k];
                let g = go[hh * d + e];
                for (((x, &y), &gp), &vv) in ga.iter_mut().zip(hid).zip(gp).zip(vt) {
                    *x += g * y + gp * vv;
                }
                let ad = &rows.ad[hh * k..][..k];
                for ((x, &a), &gp) in gvt[(hh * d + e) * k..][..k].iter_mut().zip(ad).zip(gp) {
                    *x += a * gp;
                }
            }
        }
        if let Some(drop) = drop.map(|v| &v[i * k..][..k]) {
            for ga in ga.chunks_exact_mut(k) {
                for (x, &dr) in ga.iter_mut().zip(drop) {
                    *x *= dr;
                }
            }
        }
        if p.norm == Normalisation::RmsHead {
            c.fill(0.0);
            for (ga, m) in ga.chunks_exact(k).zip(rows.m.chunks_exact(k)) {
                for ((c, &g), &x) in c.iter_mut().zip(ga).zip(m) {
                    *c += g * x;
                }
            }
            for (c, &r) in c.iter_mut().zip(&rows.r) {
                *c = *c / h as f32 * r * r * r;
            }
        }
        let vis = p.visible.as_ref().map(|v| &v[i * k..][..k]);
        for hh in 0..h {
            let out = &mut gs[(hh * q + i) * k..][..k];
            let ga = &ga[hh * k..][..k];
            match p.norm {
                Normalisation::RmsHead => {
                    let m = &rows.m[hh * k..][..k];
                    for j in 0..k {
                        out[j] = ga[j] * rows.r[j] - m[j] * c[j];
                    }
                }
                Normalisation::None => out.copy_from_slice(ga),
                Normalisation::Softmax => {
                    let a = &rows.a[hh * k..][..k];
                    let t = dot(a, ga);
                    for ((y, &a), &g) in out.iter_mut().zip(a).zip(ga) {
                        *y = a * (g - t);
                    }
                }
            }
            if let Some(vis) = vis {
                for (y, &on) in out.iter_mut().zip(vis) {
                    if !on {
                        *y = 0.0;
                    }
                }
            }
        }
    }
    for hh in 0..h {
        for j in 0..k {
            for e in 0..d {
                gv[(hh * k + j) * d + e] = gvt[(hh * d + e) * k + j];
            }
        }
    }
}
