//! Per-head weights of a token model in TransformerLens layout, as plain `ndarray` arrays for the
//! weights-based circuit analyses (`docs/spec/circuits.md`).

use candle_core::Tensor;
use ndarray::{Array1, Array2, Array3, Array4, ArrayView2};

use crate::error::{ModelError, Result};

/// The attention weights of every head, the embedding and the unembedding of a language model, in
/// the layout of TransformerLens (row-vector convention `x W`), as float32 host arrays.
///
/// Grouped-query models have their key/value heads expanded: query head `h` reads key/value head
/// `h / (H / H_kv)`, as in Hugging Face `repeat_kv` and llama.cpp, so `w_k`/`w_v` have one entry per
/// query head. Rotary position embeddings are not part of these matrices (the QK circuit read from
/// them is the position-free one). With `fold_norm` (see the exporters) the gain of the norm that
/// precedes attention is folded into the rows of `W_Q`, `W_K`, `W_V` (`diag(g) W`), a LayerNorm bias
/// into `b_Q`, `b_K`, `b_V` (`b + beta W`), and the final norm into `W_U`, `b_U`, as TransformerLens'
/// `fold_ln` does (its mean-centring of weights is not applied).
///
/// # Shapes
/// `L` layers, `H` heads, `D` model width, `d` head width, `V` vocabulary, `n_ctx` positions.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadWeights {
    /// Query weights `blocks.{l}.attn.W_Q`, [L, H, D, d].
    pub w_q: Array4<f32>,
    /// Key weights `W_K`, [L, H, D, d] (expanded for grouped-query attention).
    pub w_k: Array4<f32>,
    /// Value weights `W_V`, [L, H, D, d] (expanded for grouped-query attention).
    pub w_v: Array4<f32>,
    /// Output weights `W_O`, [L, H, d, D].
    pub w_o: Array4<f32>,
    /// Query biases `b_Q`, [L, H, d] (zero for bias-free models).
    pub b_q: Array3<f32>,
    /// Key biases `b_K`, [L, H, d].
    pub b_k: Array3<f32>,
    /// Value biases `b_V`, [L, H, d].
    pub b_v: Array3<f32>,
    /// Output biases `b_O`, [L, D].
    pub b_o: Array2<f32>,
    /// Token embedding `embed.W_E`, [V, D].
    pub w_e: Array2<f32>,
    /// Learned absolute positions `pos_embed.W_pos`, [n_ctx, D]; `None` for rotary models.
    pub w_pos: Option<Array2<f32>>,
    /// Unembedding `unembed.W_U`, [D, V].
    pub w_u: Array2<f32>,
    /// Unembedding bias `unembed.b_U`, `[V]` (zero when the model has none).
    pub b_u: Array1<f32>,
}

impl HeadWeights {
    /// Number of layers `L`.
    pub fn n_layers(&self) -> usize {
        self.w_q.shape()[0]
    }

    /// Number of (query) heads `H`.
    pub fn n_heads(&self) -> usize {
        self.w_q.shape()[1]
    }

    /// Model width `D`.
    pub fn d_model(&self) -> usize {
        self.w_q.shape()[2]
    }

    /// Head width `d`.
    pub fn d_head(&self) -> usize {
        self.w_q.shape()[3]
    }

    /// Vocabulary size `V`.
    pub fn vocab_size(&self) -> usize {
        self.w_e.shape()[0]
    }
}

/// Copies a rank-2 tensor to a host array.
///
/// # Shapes
/// `t` [r, c] -> [r, c].
///
/// # Errors
/// [`ModelError::Candle`] when `t` is not rank 2 or not float32.
pub(crate) fn to_array2(t: &Tensor) -> Result<Array2<f32>> {
    let (r, c) = t.dims2()?;
    let v = t.flatten_all()?.to_vec1::<f32>()?;
    Array2::from_shape_vec((r, c), v).map_err(|e| ModelError::Input(format!("array shape: {e}")))
}

/// Copies a rank-1 tensor to a host array.
///
/// # Errors
/// [`ModelError::Candle`] when `t` is not rank 1 or not float32.
pub(crate) fn to_array1(t: &Tensor) -> Result<Array1<f32>> {
    Ok(Array1::from_vec(t.to_vec1::<f32>()?))
}

/// Collects per-layer, per-head blocks into TransformerLens arrays, shared by every exporter.
///
/// Each layer is given as torch-layout matrices (`y = x W^T`): `q` [H*d, D], `k` and `v`
/// [H_kv*d, D], `o` [D, H*d], their biases (`None` = zero), and the gain and bias of the norm that
/// precedes the attention (folded in when given).
pub(crate) struct HeadCollector {
    n_heads: usize,
    d_head: usize,
    d_model: usize,
    layers: usize,
    w_q: Vec<f32>,
    w_k: Vec<f32>,
    w_v: Vec<f32>,
    w_o: Vec<f32>,
    b_q: Vec<f32>,
    b_k: Vec<f32>,
    b_v: Vec<f32>,
    b_o: Vec<f32>,
}

/// One layer's attention weights in torch layout (`y = x W^T + b`), host arrays.
pub(crate) struct TorchAttn<'a> {
    /// [H*d, D]
    pub q: ArrayView2<'a, f32>,
    /// [H_kv*d, D]
    pub k: ArrayView2<'a, f32>,
    /// [H_kv*d, D]
    pub v: ArrayView2<'a, f32>,
    /// [D, H*d]
    pub o: ArrayView2<'a, f32>,
    /// [H*d]
    pub b_q: Option<&'a [f32]>,
    /// [H_kv*d]
    pub b_k: Option<&'a [f32]>,
    /// [H_kv*d]
    pub b_v: Option<&'a [f32]>,
    /// [D]
    pub b_o: Option<&'a [f32]>,
    /// Norm gain [D] to fold into the input rows of Q, K, V.
    pub gain: Option<&'a [f32]>,
    /// Norm bias [D] to fold into b_Q, b_K, b_V.
    pub beta: Option<&'a [f32]>,
}

impl HeadCollector {
    /// An empty collector for heads of width `d_head` in a model of width `d_model`.
    pub(crate) fn new(n_heads: usize, d_head: usize, d_model: usize) -> Self {
        Self {
            n_heads,
            d_head,
            d_model,
            layers: 0,
            w_q: Vec::new(),
            w_k: Vec::new(),
            w_v: Vec::new(),
            w_o: Vec::new(),
            b_q: Vec::new(),
            b_k: Vec::new(),
            b_v: Vec::new(),
            b_o: Vec::new(),
        }
    }

    /// Appends one layer. `n_kv_heads` must divide `n_heads`.
    pub(crate) fn push(&mut self, a: &TorchAttn<'_>, n_kv_heads: usize) {
        let (hh, d, dm) = (self.n_heads, self.d_head, self.d_model);
        let n_rep = hh / n_kv_heads.max(1);
        let gain = |i: usize| a.gain.map_or(1.0, |g| g[i]);
        // (input-row matrix [rows, D], bias, output W [L,H,D,d], output b [L,H,d], head -> row block)
        let put = |w: &ArrayView2<'_, f32>,
                   b: Option<&[f32]>,
                   ow: &mut Vec<f32>,
                   ob: &mut Vec<f32>,
                   kv: bool| {
            for h in 0..hh {
                let blk = if kv { h / n_rep } else { h };
                for i in 0..dm {
                    for j in 0..d {
                        ow.push(w[[blk * d + j, i]] * gain(i));
                    }
                }
                for j in 0..d {
                    let mut bias = b.map_or(0.0, |b| b[blk * d + j]);
                    if let Some(beta) = a.beta {
                        bias += (0..dm).map(|i| beta[i] * w[[blk * d + j, i]]).sum::<f32>();
                    }
                    ob.push(bias);
                }
            }
        };
        put(&a.q, a.b_q, &mut self.w_q, &mut self.b_q, false);
        put(&a.k, a.b_k, &mut self.w_k, &mut self.b_k, true);
        put(&a.v, a.b_v, &mut self.w_v, &mut self.b_v, true);
        for h in 0..hh {
            for j in 0..d {
                for i in 0..dm {
                    self.w_o.push(a.o[[i, h * d + j]]);
                }
            }
        }
        for i in 0..dm {
            self.b_o.push(a.b_o.map_or(0.0, |b| b[i]));
        }
        self.layers += 1;
    }

    /// Finishes with the embedding, optional positions and the unembedding.
    ///
    /// # Shapes
    /// `w_e` [V, D], `w_pos` [n_ctx, D], `w_u` [D, V], `b_u` [V].
    pub(crate) fn finish(
        self,
        w_e: Array2<f32>,
        w_pos: Option<Array2<f32>>,
        w_u: Array2<f32>,
        b_u: Array1<f32>,
    ) -> Result<HeadWeights> {
        let (l, h, d, dm) = (self.layers, self.n_heads, self.d_head, self.d_model);
        let shape_err = |e: ndarray::ShapeError| ModelError::Input(format!("head weights: {e}"));
        Ok(HeadWeights {
            w_q: Array4::from_shape_vec((l, h, dm, d), self.w_q).map_err(shape_err)?,
            w_k: Array4::from_shape_vec((l, h, dm, d), self.w_k).map_err(shape_err)?,
            w_v: Array4::from_shape_vec((l, h, dm, d), self.w_v).map_err(shape_err)?,
            w_o: Array4::from_shape_vec((l, h, d, dm), self.w_o).map_err(shape_err)?,
            b_q: Array3::from_shape_vec((l, h, d), self.b_q).map_err(shape_err)?,
            b_k: Array3::from_shape_vec((l, h, d), self.b_k).map_err(shape_err)?,
            b_v: Array3::from_shape_vec((l, h, d), self.b_v).map_err(shape_err)?,
            b_o: Array2::from_shape_vec((l, dm), self.b_o).map_err(shape_err)?,
            w_e,
            w_pos,
            w_u,
            b_u,
        })
    }
}

/// Folds a final norm into the unembedding: `W_U' = diag(g) W_U`, `b_U' = b_U + beta W_U`.
///
/// # Shapes
/// `w_u` [D, V], `b_u` [V], `gain` and `beta` [D].
pub(crate) fn fold_final_norm(
    w_u: &mut Array2<f32>,
    b_u: &mut Array1<f32>,
    gain: &[f32],
    beta: Option<&[f32]>,
) {
    if let Some(beta) = beta {
        for (i, row) in w_u.outer_iter().enumerate() {
            b_u.scaled_add(beta[i], &row);
        }
    }
    for (i, mut row) in w_u.outer_iter_mut().enumerate() {
        row *= gain[i];
    }
}
