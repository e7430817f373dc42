//! Composition scores of every pair of heads (Q-, K- and V-composition) and a random-matrix baseline.
//!
//! For an earlier head h1 (layer l1) and a later head h2 (layer l2 > l1),
//! `score = ||W_OV(h1) M(h2)||_F / (||W_OV(h1)||_F ||M(h2)||_F)` with `M = W_QK(h2)` (Q),
//! `W_QK(h2)^T` (K) or `W_OV(h2)` (V); zero where `l1 >= l2`.
//! Source: Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits", section
//! "Virtual Weights and Composition"; TransformerLens `HookedTransformer.all_composition_scores` and
//! `utils.composition_scores`; `docs/spec/circuits.md`.
//!
//! # How it stays small
//! TransformerLens broadcasts `[L, H, 1, 1, D, D] x [1, 1, L, H, D, D]` factored products and ran out
//! of 24 GiB on a model of D 576, 30 layers, 9 heads. Here each head is first reduced to `d`-sized
//! factors with the same norms, using thin QR "square roots" (`R^T R = X^T X`):
//! - left (OV of h1): `W_OV = V O = Q_V (R_V O)`, so `||W_OV X||_F = ||L X||_F` with `L = R_V O` [d, D];
//! - right: `M M^T = R R^T` with `R = W_Q R_K^T` (Q), `W_K R_Q^T` (K), `W_V R_O^T` (V), each [D, d]
//!   (`R_O` from the QR of `W_O^T`);
//!
//! so `||W_OV(h1) M(h2)||_F^2 = ||L(h1) R(h2)||_F^2 = <L^T L, R R^T>_F`. Two exact methods follow:
//! - [`CompositionMethod::Direct`]: the `[d, d]` products `L(h1) R(h2)`, `D d^2` per pair;
//! - [`CompositionMethod::Gram`]: inner products of the `[D, D]` Gram matrices, `D (D + 1) / 2` per
//!   pair (symmetric half), built in row chunks of the `D` axis for all heads at once so that only
//!   `chunk x D` slices of the Gram matrices are ever held. Cheaper when `D < 2 d^2` (D 576, d 64).
//!
//! Memory: the reduced factors (`L H D d` numbers per side) plus, per thread, one chunk buffer per side
//! of at most [`CompositionParams::chunk_bytes`]; see [`composition_memory_bytes`].

use std::fmt;
use std::str::FromStr;

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, Array4, ArrayView2, ArrayViewMut2};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::heads::{AttnDims, AttnWeights};
use super::linalg::qr_r;
use super::Real;
use crate::error::{AnalysisError, Result};

/// Which side of the later head the earlier head's output feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompositionKind {
    /// Q-composition: `W_OV(h1) W_QK(h2)` (the later head's queries read h1's output).
    Q,
    /// K-composition: `W_OV(h1) W_QK(h2)^T` (the later head's keys read h1's output).
    K,
    /// V-composition: `W_OV(h1) W_OV(h2)` (the later head's values read h1's output).
    V,
}

impl CompositionKind {
    /// The three kinds, in the order Q, K, V.
    pub const ALL: [CompositionKind; 3] =
        [CompositionKind::Q, CompositionKind::K, CompositionKind::V];

    /// CLI / file name: `"q"`, `"k"` or `"v"`.
    pub fn name(self) -> &'static str {
        match self {
            CompositionKind::Q => "q",
            CompositionKind::K => "k",
            CompositionKind::V => "v",
        }
    }

    fn index(self) -> usize {
        match self {
            CompositionKind::Q => 0,
            CompositionKind::K => 1,
            CompositionKind::V => 2,
        }
    }
}

impl fmt::Display for CompositionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CompositionKind {
    type Err = AnalysisError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "q" => Ok(CompositionKind::Q),
            "k" => Ok(CompositionKind::K),
            "v" => Ok(CompositionKind::V),
            other => Err(AnalysisError::InvalidInput(format!(
                "unknown composition kind {other:?} (expected q, k or v)"
            ))),
        }
    }
}

/// How the pairwise norms are computed (both exact; they differ in cost only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompositionMethod {
    /// `Gram` when `D < 2 d_left d_right`, else `Direct`.
    #[default]
    Auto,
    /// Chunked inner products of `[D, D]` Gram matrices (see the module documentation).
    Gram,
    /// Small `[d, d]` products per pair.
    Direct,
}

impl fmt::Display for CompositionMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CompositionMethod::Auto => "auto",
            CompositionMethod::Gram => "gram",
            CompositionMethod::Direct => "direct",
        })
    }
}

impl FromStr for CompositionMethod {
    type Err = AnalysisError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(CompositionMethod::Auto),
            "gram" => Ok(CompositionMethod::Gram),
            "direct" => Ok(CompositionMethod::Direct),
            other => Err(AnalysisError::InvalidInput(format!(
                "unknown composition method {other:?} (expected auto, gram or direct)"
            ))),
        }
    }
}

/// The most worker threads [`composition_scores`] starts (each is an OS thread; more than this would
/// only fail to spawn or thrash).
pub const MAX_THREADS: usize = 1024;

/// Parameters of [`composition_scores`].
#[derive(Debug, Clone, PartialEq)]
pub struct CompositionParams {
    /// Kinds to compute (default Q, K and V). They share the left factors.
    pub kinds: Vec<CompositionKind>,
    /// Method (default [`CompositionMethod::Auto`]).
    pub method: CompositionMethod,
    /// Worker threads; 0 = the machine's available parallelism.
    pub threads: usize,
    /// Upper bound in bytes of one chunk buffer of the Gram method (one per side and thread);
    /// default 16 MiB. At least one row of the `D` axis is always taken.
    pub chunk_bytes: usize,
}

impl Default for CompositionParams {
    fn default() -> Self {
        CompositionParams {
            kinds: CompositionKind::ALL.to_vec(),
            method: CompositionMethod::Auto,
            threads: 0,
            chunk_bytes: 16 << 20,
        }
    }
}

impl CompositionParams {
    /// Validates the parameters.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if `kinds` is empty or repeats a kind, `chunk_bytes` is 0, or
    /// `threads` exceeds [`MAX_THREADS`].
    pub fn check(&self) -> Result<()> {
        if self.kinds.is_empty() {
            return Err(AnalysisError::InvalidInput(
                "composition: no kind requested (q, k, v)".into(),
            ));
        }
        for (i, k) in self.kinds.iter().enumerate() {
            if self.kinds[..i].contains(k) {
                return Err(AnalysisError::InvalidInput(format!(
                    "composition: kind {k} requested twice"
                )));
            }
        }
        if self.chunk_bytes == 0 {
            return Err(AnalysisError::InvalidInput(
                "composition: chunk_bytes must be positive".into(),
            ));
        }
        if self.threads > MAX_THREADS {
            return Err(AnalysisError::InvalidInput(format!(
                "composition: {} worker threads requested, at most {MAX_THREADS}",
                self.threads
            )));
        }
        Ok(())
    }

    fn n_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    fn resolve_method(&self, dims: &AttnDims) -> CompositionMethod {
        match self.method {
            CompositionMethod::Auto => {
                let kl = dims.d_model.min(dims.d_v);
                let kr = dims.d_model.min(dims.d_qk.max(dims.d_v));
                if dims.d_model < 2 * kl * kr {
                    CompositionMethod::Gram
                } else {
                    CompositionMethod::Direct
                }
            }
            m => m,
        }
    }

    fn chunk_rows(&self, n_heads_total: usize, d_model: usize) -> usize {
        let row_bytes = n_heads_total * d_model * std::mem::size_of::<f64>();
        (self.chunk_bytes / row_bytes.max(1)).clamp(1, d_model)
    }
}

/// Composition scores of all head pairs.
///
/// # Shapes
/// Each present array is [L1, H1, L2, H2]: entry `[l1, h1, l2, h2]` scores head `L{l1}H{h1}` writing
/// into head `L{l2}H{h2}`; zero where `l1 >= l2`. In [0, 1].
#[derive(Debug, Clone, PartialEq)]
pub struct CompositionScores {
    /// Q-composition scores, if requested.
    pub q: Option<Array4<f64>>,
    /// K-composition scores, if requested.
    pub k: Option<Array4<f64>>,
    /// V-composition scores, if requested.
    pub v: Option<Array4<f64>>,
}

impl CompositionScores {
    /// The scores of one kind, if computed.
    pub fn get(&self, kind: CompositionKind) -> Option<&Array4<f64>> {
        match kind {
            CompositionKind::Q => self.q.as_ref(),
            CompositionKind::K => self.k.as_ref(),
            CompositionKind::V => self.v.as_ref(),
        }
    }
}

/// One head's reduced factors: left `L` [kl, D] (OV of the writer) and, per kind, right `R` [D, kr].
struct HeadFactors {
    left: Array2<f64>,
    right: [Option<Array2<f64>>; 3],
}

/// Reduces one head (f64 matrices `v` [D, dv], `o` [dv, D], `q`, `k` [D, dqk]) to the factors of the
/// module documentation.
fn head_factors(
    v: ArrayView2<f64>,
    o: ArrayView2<f64>,
    q: ArrayView2<f64>,
    k: ArrayView2<f64>,
    kinds: &[CompositionKind],
) -> HeadFactors {
    let left = qr_r(v).dot(&o);
    let mut right: [Option<Array2<f64>>; 3] = [None, None, None];
    for &kind in kinds {
        let r = match kind {
            CompositionKind::Q => q.dot(&qr_r(k).t()),
            CompositionKind::K => k.dot(&qr_r(q).t()),
            CompositionKind::V => v.dot(&qr_r(o.t()).t()),
        };
        right[kind.index()] = Some(r);
    }
    HeadFactors { left, right }
}

fn frob(a: ArrayView2<f64>) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// All heads' reduced factors, stacked: left [N kl, D] (row block per head), right per kind
/// [D, N kr] (column block per head); N = L H, head index n = l H + h.
struct Stacked {
    kl: usize,
    left: Array2<f64>,
    left_norm: Vec<f64>,
    rights: Vec<(CompositionKind, usize, Array2<f64>, Vec<f64>)>,
}

fn stack<A: Real>(w: &AttnWeights<A>, dims: &AttnDims, kinds: &[CompositionKind]) -> Stacked {
    let (nl, nh, d) = (dims.n_layers, dims.n_heads, dims.d_model);
    let n = nl * nh;
    let kl = d.min(dims.d_v);
    let mut left = Array2::zeros((n * kl, d));
    let mut left_norm = vec![0.0; n];
    let mut rights: Vec<(CompositionKind, usize, Array2<f64>, Vec<f64>)> = kinds
        .iter()
        .map(|&kind| {
            let kr = match kind {
                CompositionKind::Q | CompositionKind::K => d.min(dims.d_qk),
                CompositionKind::V => d.min(dims.d_v),
            };
            (kind, kr, Array2::zeros((d, n * kr)), vec![0.0; n])
        })
        .collect();
    for l in 0..nl {
        for h in 0..nh {
            let idx = l * nh + h;
            let v = AttnWeights::head_f64(&w.w_v, l, h);
            let o = AttnWeights::head_f64(&w.w_o, l, h);
            let q = AttnWeights::head_f64(&w.w_q, l, h);
            let k = AttnWeights::head_f64(&w.w_k, l, h);
            let f = head_factors(v.view(), o.view(), q.view(), k.view(), kinds);
            left.slice_mut(s![idx * kl..(idx + 1) * kl, ..])
                .assign(&f.left);
            left_norm[idx] = frob(f.left.view());
            for (kind, kr, mat, norms) in rights.iter_mut() {
                if let Some(r) = &f.right[kind.index()] {
                    mat.slice_mut(s![.., idx * *kr..(idx + 1) * *kr]).assign(r);
                    norms[idx] = frob(r.view());
                }
            }
        }
    }
    Stacked {
        kl,
        left,
        left_norm,
        rights,
    }
}

/// Estimated peak working memory in bytes of [`composition_scores`] beyond the caller's weights:
/// the reduced factors, the per-thread chunk buffers (Gram method) or product buffers (Direct
/// method), and the accumulators.
///
/// # Errors
/// As [`AttnWeights::check`] and [`CompositionParams::check`].
pub fn composition_memory_bytes<A: Real>(
    w: &AttnWeights<A>,
    params: &CompositionParams,
) -> Result<usize> {
    let dims = w.check()?;
    params.check()?;
    let f = std::mem::size_of::<f64>();
    let n = dims.n_layers * dims.n_heads;
    let d = dims.d_model;
    let kl = d.min(dims.d_v);
    let kq = d.min(dims.d_qk);
    let kr_sum: usize = params
        .kinds
        .iter()
        .map(|k| match k {
            CompositionKind::V => kl,
            _ => kq,
        })
        .sum();
    let factors = n * d * (kl + kr_sum) * f;
    let threads = params.n_threads();
    let sides = 1 + params.kinds.len();
    let per_thread = match params.resolve_method(&dims) {
        CompositionMethod::Direct => kl * n * kl.max(kq) * f,
        _ => sides * n * params.chunk_rows(n, d) * d * f,
    };
    let acc = (threads + 1) * params.kinds.len() * n * n * f;
    let out = params.kinds.len() * n * n * f;
    Ok(factors + threads * per_thread + acc + out)
}

/// Composition scores of every ordered head pair, for the requested kinds.
///
/// # Shapes
/// Weights as in [`AttnWeights`]; each output [L, H, L, H] (see [`CompositionScores`]).
/// A head whose OV (or `M`) is zero gets score 0 (TransformerLens would give NaN).
///
/// # Errors
/// As [`AttnWeights::check`] and [`CompositionParams::check`]; [`AnalysisError::Shape`] if an
/// internal buffer cannot be shaped (not expected).
pub fn composition_scores<A: Real>(
    w: &AttnWeights<A>,
    params: &CompositionParams,
) -> Result<CompositionScores> {
    let dims = w.check()?;
    params.check()?;
    let st = stack(w, &dims, &params.kinds);
    let n = dims.n_layers * dims.n_heads;
    let threads = params.n_threads().max(1);
    let sq = match params.resolve_method(&dims) {
        CompositionMethod::Direct => direct_numerators(&st, &dims, threads)?,
        _ => gram_numerators(&st, &dims, threads, params.chunk_rows(n, dims.d_model))?,
    };
    let (nl, nh) = (dims.n_layers, dims.n_heads);
    let mut out = CompositionScores {
        q: None,
        k: None,
        v: None,
    };
    for ((kind, _, _, rnorm), num2) in st.rights.iter().zip(sq) {
        let scores = Array4::from_shape_fn((nl, nh, nl, nh), |(l1, h1, l2, h2)| {
            if l1 >= l2 {
                return 0.0;
            }
            let (a, b) = (l1 * nh + h1, l2 * nh + h2);
            let den = st.left_norm[a] * rnorm[b];
            if den > 0.0 {
                num2[[a, b]].max(0.0).sqrt() / den
            } else {
                0.0
            }
        });
        match kind {
            CompositionKind::Q => out.q = Some(scores),
            CompositionKind::K => out.k = Some(scores),
            CompositionKind::V => out.v = Some(scores),
        }
    }
    Ok(out)
}

/// Squared numerators `||L(a) R_t(b)||_F^2` [N, N] per kind (only `layer(a) < layer(b)` filled),
/// with the small products per pair.
fn direct_numerators(st: &Stacked, dims: &AttnDims, threads: usize) -> Result<Vec<Array2<f64>>> {
    let nh = dims.n_heads;
    let n = dims.n_layers * nh;
    let kl = st.kl;
    // Source heads that have any later layer.
    let sources: Vec<usize> = (0..n.saturating_sub(nh)).collect();
    let work = |tid: usize| -> Result<Vec<Array2<f64>>> {
        let mut acc: Vec<Array2<f64>> = st.rights.iter().map(|_| Array2::zeros((n, n))).collect();
        for &a in sources.iter().skip(tid).step_by(threads) {
            let first = (a / nh + 1) * nh;
            let la = st.left.slice(s![a * kl..(a + 1) * kl, ..]);
            for ((_, kr, right, _), acc_t) in st.rights.iter().zip(acc.iter_mut()) {
                let prod = la.dot(&right.slice(s![.., first * kr..]));
                for b in first..n {
                    let blk = prod.slice(s![.., (b - first) * kr..(b - first + 1) * kr]);
                    acc_t[[a, b]] = blk.iter().map(|x| x * x).sum();
                }
            }
        }
        Ok(acc)
    };
    run_threads(threads, st.rights.len(), n, work)
}

/// Number of target-layer groups of the Gram accumulation: more groups skip more masked pairs but
/// re-pack the source slices more often.
const GRAM_LAYER_GROUPS: usize = 8;

/// Squared numerators through chunked Gram inner products (see the module documentation).
fn gram_numerators(
    st: &Stacked,
    dims: &AttnDims,
    threads: usize,
    chunk: usize,
) -> Result<Vec<Array2<f64>>> {
    let (nl, nh, d) = (dims.n_layers, dims.n_heads, dims.d_model);
    let n = nl * nh;
    let kl = st.kl;
    let chunks: Vec<(usize, usize)> = (0..d)
        .step_by(chunk)
        .map(|i0| (i0, (i0 + chunk).min(d)))
        .collect();
    // Target-layer groups [a, b) covering layers 1..nl.
    let n_groups = GRAM_LAYER_GROUPS.min(nl.saturating_sub(1)).max(1);
    let per = (nl.saturating_sub(1)).div_ceil(n_groups).max(1);
    let groups: Vec<(usize, usize)> = (1..nl)
        .step_by(per)
        .map(|a| (a, (a + per).min(nl)))
        .collect();
    let work = |tid: usize| -> Result<Vec<Array2<f64>>> {
        let mut acc: Vec<Array2<f64>> = st.rights.iter().map(|_| Array2::zeros((n, n))).collect();
        let cap = n * chunk * d;
        let mut buf_l = vec![0.0f64; cap];
        let mut buf_r = vec![0.0f64; cap];
        for &(i0, i1) in chunks.iter().skip(tid).step_by(threads) {
            let (c, width) = (i1 - i0, d - i0);
            let shape_err =
                |e: ndarray::ShapeError| AnalysisError::Shape(format!("gram chunk: {e}"));
            // Left Gram slices, weighted for the symmetric half: entries (i, j), i in the chunk,
            // j >= i0; weight 0 for j < i, 1 for j == i, 2 for j > i.
            let mut xl = ArrayViewMut2::from_shape((n, c * width), &mut buf_l[..n * c * width])
                .map_err(shape_err)?;
            for a in 0..n {
                let la = st.left.slice(s![a * kl..(a + 1) * kl, ..]);
                let mut g = xl
                    .row_mut(a)
                    .into_shape_with_order((c, width))
                    .map_err(shape_err)?;
                general_mat_mul(
                    1.0,
                    &la.slice(s![.., i0..i1]).t(),
                    &la.slice(s![.., i0..]),
                    0.0,
                    &mut g,
                );
                for r in 0..c {
                    // Column q holds j = i0 + q; the diagonal j == i sits at q == r.
                    let mut row = g.row_mut(r);
                    row.slice_mut(s![..r]).fill(0.0);
                    row.slice_mut(s![r + 1..]).mapv_inplace(|x| 2.0 * x);
                }
            }
            for ((_, kr, right, _), acc_t) in st.rights.iter().zip(acc.iter_mut()) {
                let kr = *kr;
                let mut xr = ArrayViewMut2::from_shape((n, c * width), &mut buf_r[..n * c * width])
                    .map_err(shape_err)?;
                for b in 0..n {
                    let rb = right.slice(s![.., b * kr..(b + 1) * kr]);
                    let mut g = xr
                        .row_mut(b)
                        .into_shape_with_order((c, width))
                        .map_err(shape_err)?;
                    general_mat_mul(
                        1.0,
                        &rb.slice(s![i0..i1, ..]),
                        &rb.slice(s![i0.., ..]).t(),
                        0.0,
                        &mut g,
                    );
                }
                // Earlier-layer sources only, in a few groups of target layers: each group's gemm
                // takes the sources of layers below the group's last layer (the few same- or
                // later-layer pairs this includes are masked out at the end). Few large gemms
                // keep the packing of the [N, c x width] slices cheap.
                for &(a, b) in &groups {
                    let (t0, t1) = (a * nh, b * nh);
                    let src = xl.slice(s![0..(b - 1) * nh, ..]);
                    let tgt = xr.slice(s![t0..t1, ..]);
                    let mut out = acc_t.slice_mut(s![0..(b - 1) * nh, t0..t1]);
                    general_mat_mul(1.0, &src, &tgt.t(), 1.0, &mut out);
                }
            }
        }
        Ok(acc)
    };
    run_threads(threads, st.rights.len(), n, work)
}

/// Runs `work(tid)` on `threads` scoped threads and sums the per-kind accumulators.
///
/// # Errors
/// The first error of a worker; [`AnalysisError::Numerical`] if a worker panicked.
fn run_threads<F>(threads: usize, kinds: usize, n: usize, work: F) -> Result<Vec<Array2<f64>>>
where
    F: Fn(usize) -> Result<Vec<Array2<f64>>> + Sync,
{
    let parts: Vec<Result<Vec<Array2<f64>>>> = if threads <= 1 {
        vec![work(0)]
    } else {
        std::thread::scope(|scope| {
            let work = &work;
            let handles: Vec<_> = (0..threads).map(|t| scope.spawn(move || work(t))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(AnalysisError::Numerical(
                            "a composition worker panicked".into(),
                        ))
                    })
                })
                .collect()
        })
    };
    let mut total: Vec<Array2<f64>> = (0..kinds).map(|_| Array2::zeros((n, n))).collect();
    for part in parts {
        for (t, a) in total.iter_mut().zip(part?) {
            *t += &a;
        }
    }
    Ok(total)
}

/// A standard normal sample (Box-Muller transform on two uniform draws).
fn gaussian<R: Rng>(rng: &mut R) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>(); // (0, 1]
    let u2: f64 = rng.gen::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn gaussian_matrix<R: Rng>(rng: &mut R, rows: usize, cols: usize) -> Array2<f64> {
    Array2::from_shape_simple_fn((rows, cols), || gaussian(rng))
}

/// Distribution of composition scores between random heads: the level to compare real scores with.
///
/// Every sample draws fresh i.i.d. standard Gaussian factors of the model's sizes (`W_V` [D, d_v],
/// `W_O` [d_v, D] for the writer; `W_Q`, `W_K` [D, d_qk] or `W_V`, `W_O` for the reader) and scores
/// them with the same formula. Scores are invariant to the scale of each factor, so the Gaussian's
/// variance does not matter.
#[derive(Debug, Clone, PartialEq)]
pub struct CompositionBaseline {
    /// Seed of the ChaCha8 generator that drew the samples.
    pub seed: u64,
    /// Sorted (ascending) sampled scores per kind, indexed Q, K, V.
    samples: [Vec<f64>; 3],
}

impl CompositionBaseline {
    /// The sorted samples of one kind (`[n_samples]`, ascending).
    pub fn samples(&self, kind: CompositionKind) -> &[f64] {
        &self.samples[kind.index()]
    }

    /// Percentile `p` in [0, 100] of the baseline of one kind, with linear interpolation between
    /// order statistics (numpy's default `percentile`).
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if `p` is outside [0, 100] or NaN.
    pub fn percentile(&self, kind: CompositionKind, p: f64) -> Result<f64> {
        if !(0.0..=100.0).contains(&p) {
            return Err(AnalysisError::InvalidInput(format!(
                "percentile {p} outside [0, 100]"
            )));
        }
        let xs = self.samples(kind);
        let pos = p / 100.0 * (xs.len() - 1) as f64;
        let lo = pos.floor() as usize;
        let hi = (lo + 1).min(xs.len() - 1);
        let frac = pos - lo as f64;
        Ok(xs[lo] + frac * (xs[hi] - xs[lo]))
    }

    /// Fraction of baseline samples of one kind strictly below `score` (its percentile rank / 100).
    pub fn fraction_below(&self, kind: CompositionKind, score: f64) -> f64 {
        let xs = self.samples(kind);
        xs.partition_point(|&x| x < score) as f64 / xs.len() as f64
    }

    /// Marks the scores above the baseline's percentile `p` (e.g. 99).
    ///
    /// # Shapes
    /// `scores` [L, H, L, H] -> same shape.
    ///
    /// # Errors
    /// As [`CompositionBaseline::percentile`].
    pub fn exceeds(
        &self,
        kind: CompositionKind,
        scores: &Array4<f64>,
        p: f64,
    ) -> Result<Array4<bool>> {
        let cut = self.percentile(kind, p)?;
        Ok(scores.mapv(|x| x > cut))
    }
}

/// Samples the random-matrix baseline of composition scores for heads of the given sizes.
///
/// # Shapes
/// Writer factors `W_V` [d_model, d_v], `W_O` [d_v, d_model]; reader `W_Q`, `W_K` [d_model, d_qk]
/// (Q, K) or `W_V`, `W_O` (V). Returns `n_samples` scores per kind.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] if a size or `n_samples` is 0.
pub fn composition_baseline(
    d_model: usize,
    d_qk: usize,
    d_v: usize,
    n_samples: usize,
    seed: u64,
) -> Result<CompositionBaseline> {
    if d_model == 0 || d_qk == 0 || d_v == 0 || n_samples == 0 {
        return Err(AnalysisError::InvalidInput(format!(
            "composition baseline needs positive sizes and samples, got d_model {d_model}, d_qk {d_qk}, d_v {d_v}, n_samples {n_samples}"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut samples: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for kind in CompositionKind::ALL {
        let mut xs = Vec::with_capacity(n_samples);
        for _ in 0..n_samples {
            let v1 = gaussian_matrix(&mut rng, d_model, d_v);
            let o1 = gaussian_matrix(&mut rng, d_v, d_model);
            let left = qr_r(v1.view()).dot(&o1);
            let right = match kind {
                CompositionKind::Q | CompositionKind::K => {
                    let q2 = gaussian_matrix(&mut rng, d_model, d_qk);
                    let k2 = gaussian_matrix(&mut rng, d_model, d_qk);
                    let (a, b) = if kind == CompositionKind::Q {
                        (q2, k2)
                    } else {
                        (k2, q2)
                    };
                    a.dot(&qr_r(b.view()).t())
                }
                CompositionKind::V => {
                    let v2 = gaussian_matrix(&mut rng, d_model, d_v);
                    let o2 = gaussian_matrix(&mut rng, d_v, d_model);
                    v2.dot(&qr_r(o2.t()).t())
                }
            };
            let num = frob(left.dot(&right).view());
            xs.push(num / (frob(left.view()) * frob(right.view())));
        }
        xs.sort_by(f64::total_cmp);
        samples[kind.index()] = xs;
    }
    Ok(CompositionBaseline { seed, samples })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_parses_and_prints() {
        for k in CompositionKind::ALL {
            assert_eq!(k.to_string().parse::<CompositionKind>().unwrap(), k);
        }
        assert_eq!("Q".parse::<CompositionKind>().unwrap(), CompositionKind::Q);
        assert!("x".parse::<CompositionKind>().is_err());
        for m in [
            CompositionMethod::Auto,
            CompositionMethod::Gram,
            CompositionMethod::Direct,
        ] {
            assert_eq!(m.to_string().parse::<CompositionMethod>().unwrap(), m);
        }
        assert!("dense".parse::<CompositionMethod>().is_err());
    }

    #[test]
    fn single_layer_has_no_pairs() {
        let w = AttnWeights::new(
            ndarray::Array4::<f64>::ones((1, 2, 5, 3)),
            ndarray::Array4::<f64>::ones((1, 2, 5, 3)),
            ndarray::Array4::<f64>::ones((1, 2, 5, 2)),
            ndarray::Array4::<f64>::ones((1, 2, 2, 5)),
        )
        .unwrap();
        for method in [CompositionMethod::Gram, CompositionMethod::Direct] {
            let p = CompositionParams {
                method,
                threads: 2,
                ..Default::default()
            };
            let sc = composition_scores(&w, &p).unwrap();
            for k in CompositionKind::ALL {
                let a = sc.get(k).unwrap();
                assert_eq!(a.dim(), (1, 2, 1, 2));
                assert!(a.iter().all(|&x| x == 0.0));
            }
        }
    }

    #[test]
    fn params_check_rejects_bad_input() {
        let mut p = CompositionParams::default();
        assert!(p.check().is_ok());
        p.kinds = vec![CompositionKind::K, CompositionKind::K];
        assert!(p.check().is_err());
        p.kinds.clear();
        assert!(p.check().is_err());
    }

    #[test]
    fn gaussian_has_unit_moments() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let xs: Vec<f64> = (0..200_000).map(|_| gaussian(&mut rng)).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var - 1.0).abs() < 0.01, "{var}");
    }

    #[test]
    fn baseline_percentiles_are_ordered_and_seeded() {
        let b = composition_baseline(13, 3, 4, 200, 7).unwrap();
        let b2 = composition_baseline(13, 3, 4, 200, 7).unwrap();
        assert_eq!(b, b2);
        for k in CompositionKind::ALL {
            let xs = b.samples(k);
            assert_eq!(xs.len(), 200);
            assert!(xs.windows(2).all(|w| w[0] <= w[1]));
            assert!(xs[0] > 0.0 && xs[199] <= 1.0);
            let p50 = b.percentile(k, 50.0).unwrap();
            let p99 = b.percentile(k, 99.0).unwrap();
            assert!(p50 <= p99);
            assert_eq!(b.percentile(k, 0.0).unwrap(), xs[0]);
            assert_eq!(b.percentile(k, 100.0).unwrap(), xs[199]);
            assert!((b.fraction_below(k, p50) - 0.5).abs() <= 0.01);
        }
        assert!(b.percentile(CompositionKind::Q, 101.0).is_err());
    }
}
