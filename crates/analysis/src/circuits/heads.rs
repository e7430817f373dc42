//! Per-head weights and circuits: OV circuit `W_V[h] W_O[h]`, QK circuit `W_Q[h] W_K[h]^T`, their
//! full versions through the embedding and unembedding, OV eigenvalues and copying scores, and the
//! expansion of grouped-query K/V heads.
//!
//! Source: Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits", sections on the
//! OV and QK circuits and their eigenvalues; TransformerLens `HookedTransformer.OV` / `.QK`
//! (`FactoredMatrix(W_V, W_O)`, `FactoredMatrix(W_Q, W_K^T)`) and the copying score of its main demo.

use ndarray::{s, Array2, Array3, Array4, ArrayBase, Axis, Data, Ix4};

use super::factored::{Eigenvalues, FactoredMatrix};
use super::linalg::{
    check_finite, dot_cols_f64, dot_rows_f64, eig_general, inner_blocks_f64, to_f64,
};
use super::Real;
use crate::error::{AnalysisError, Result};

/// Attention weights of every head, in TransformerLens layouts and the row-vector convention
/// (`q = x W_Q`, head output `z W_O`).
///
/// # Shapes
/// - `w_q`, `w_k`: [L, H, D, d_qk]; `w_v`: [L, H, D, d_v]; `w_o`: [L, H, d_v, D].
/// - `w_e`: [vocab, D]; `w_u`: [D, vocab]; `b_u`: `[vocab]` (all optional; needed for full circuits).
///
/// Grouped-query models: expand their K/V heads to one per query head first with
/// [`expand_kv_heads`].
#[derive(Debug, Clone)]
pub struct AttnWeights<A: Real = f64> {
    /// Query weights `blocks.{l}.attn.W_Q`, [L, H, D, d_qk].
    pub w_q: Array4<A>,
    /// Key weights `blocks.{l}.attn.W_K`, [L, H, D, d_qk].
    pub w_k: Array4<A>,
    /// Value weights `blocks.{l}.attn.W_V`, [L, H, D, d_v].
    pub w_v: Array4<A>,
    /// Output weights `blocks.{l}.attn.W_O`, [L, H, d_v, D].
    pub w_o: Array4<A>,
    /// Token embedding `embed.W_E`, [vocab, D].
    pub w_e: Option<Array2<A>>,
    /// Unembedding `unembed.W_U`, [D, vocab].
    pub w_u: Option<Array2<A>>,
    /// Unembedding bias `unembed.b_U`, `[vocab]`.
    pub b_u: Option<ndarray::Array1<A>>,
}

/// Sizes of an [`AttnWeights`], as validated by [`AttnWeights::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
    /// Number of layers L.
    pub n_layers: usize,
    /// Number of (query) heads per layer H.
    pub n_heads: usize,
    /// Residual width D.
    pub d_model: usize,
    /// Query/key head dimension.
    pub d_qk: usize,
    /// Value/output head dimension.
    pub d_v: usize,
    /// Vocabulary size, when `w_e` or `w_u` is present.
    pub d_vocab: Option<usize>,
}

/// Eigenvalues of one circuit per head.
///
/// # Shapes
/// `re`, `im`: [L, H, m], each head's eigenvalues sorted by descending modulus (see
/// [`Eigenvalues`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HeadEigenvalues {
    /// Real parts, [L, H, m].
    pub re: Array3<f64>,
    /// Imaginary parts, [L, H, m].
    pub im: Array3<f64>,
}

impl HeadEigenvalues {
    /// Copying score of each head, `Re(sum lambda) / sum |lambda|` ([`Eigenvalues::copying_score`]),
    /// [L, H].
    pub fn copying_scores(&self) -> Array2<f64> {
        let (l, h, _) = self.re.dim();
        Array2::from_shape_fn((l, h), |(i, j)| self.head_unchecked(i, j).copying_score())
    }

    /// The eigenvalues of head `(layer, head)`.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if the head is out of range.
    pub fn head(&self, layer: usize, head: usize) -> Result<Eigenvalues> {
        let (l, h, _) = self.re.dim();
        if layer >= l || head >= h {
            return Err(AnalysisError::InvalidInput(format!(
                "head L{layer}H{head} outside eigenvalues of {l} layers x {h} heads"
            )));
        }
        Ok(self.head_unchecked(layer, head))
    }

    fn head_unchecked(&self, layer: usize, head: usize) -> Eigenvalues {
        Eigenvalues {
            re: self.re.slice(s![layer, head, ..]).to_owned(),
            im: self.im.slice(s![layer, head, ..]).to_owned(),
        }
    }
}

fn dims4<A>(a: &Array4<A>) -> (usize, usize, usize, usize) {
    a.dim()
}

impl<A: Real> AttnWeights<A> {
    /// Builds the weights of an attention-only stack without (un)embedding.
    ///
    /// # Shapes
    /// See [`AttnWeights`].
    ///
    /// # Errors
    /// As [`AttnWeights::check`].
    pub fn new(w_q: Array4<A>, w_k: Array4<A>, w_v: Array4<A>, w_o: Array4<A>) -> Result<Self> {
        let w = AttnWeights {
            w_q,
            w_k,
            w_v,
            w_o,
            w_e: None,
            w_u: None,
            b_u: None,
        };
        w.check()?;
        Ok(w)
    }

    /// Adds the embedding, unembedding and unembedding bias.
    ///
    /// # Shapes
    /// `w_e` [vocab, D], `w_u` [D, vocab], `b_u` `[vocab]`.
    ///
    /// # Errors
    /// As [`AttnWeights::check`].
    pub fn with_embeddings(
        mut self,
        w_e: Option<Array2<A>>,
        w_u: Option<Array2<A>>,
        b_u: Option<ndarray::Array1<A>>,
    ) -> Result<Self> {
        self.w_e = w_e;
        self.w_u = w_u;
        self.b_u = b_u;
        self.check()?;
        Ok(self)
    }

    /// Validates shapes and finiteness and returns the sizes.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] naming the first inconsistent array (`W_Q`, `W_K`, `W_V`, `W_O`,
    /// `W_E`, `W_U`, `b_U`); [`AnalysisError::InvalidInput`] for an empty dimension;
    /// [`AnalysisError::NonFinite`] naming an array with NaN/inf.
    pub fn check(&self) -> Result<AttnDims> {
        let (l, h, d, dqk) = dims4(&self.w_q);
        if l == 0 || h == 0 || d == 0 || dqk == 0 {
            return Err(AnalysisError::InvalidInput(format!(
                "W_Q has an empty dimension: {:?}",
                self.w_q.dim()
            )));
        }
        if self.w_k.dim() != (l, h, d, dqk) {
            return Err(AnalysisError::Shape(format!(
                "W_K is {:?}, expected {:?} like W_Q (expand grouped K/V heads with expand_kv_heads)",
                self.w_k.dim(),
                (l, h, d, dqk)
            )));
        }
        let (lv, hv, dv_model, dv) = dims4(&self.w_v);
        if (lv, hv, dv_model) != (l, h, d) || dv == 0 {
            return Err(AnalysisError::Shape(format!(
                "W_V is {:?}, expected [{l}, {h}, {d}, d_v] (expand grouped K/V heads with expand_kv_heads)",
                self.w_v.dim()
            )));
        }
        if self.w_o.dim() != (l, h, dv, d) {
            return Err(AnalysisError::Shape(format!(
                "W_O is {:?}, expected {:?}",
                self.w_o.dim(),
                (l, h, dv, d)
            )));
        }
        let mut vocab = None;
        if let Some(w_e) = &self.w_e {
            if w_e.ncols() != d || w_e.nrows() == 0 {
                return Err(AnalysisError::Shape(format!(
                    "W_E is {:?}, expected [vocab, {d}]",
                    w_e.dim()
                )));
            }
            vocab = Some(w_e.nrows());
        }
        if let Some(w_u) = &self.w_u {
            if w_u.nrows() != d || w_u.ncols() == 0 {
                return Err(AnalysisError::Shape(format!(
                    "W_U is {:?}, expected [{d}, vocab]",
                    w_u.dim()
                )));
            }
            if let Some(v) = vocab {
                if w_u.ncols() != v {
                    return Err(AnalysisError::Shape(format!(
                        "W_U is {:?} but W_E has vocab {v}",
                        w_u.dim()
                    )));
                }
            }
            vocab = Some(w_u.ncols());
        }
        if let Some(b_u) = &self.b_u {
            let expect = self.w_u.as_ref().map(|w| w.ncols());
            if expect != Some(b_u.len()) {
                return Err(AnalysisError::Shape(format!(
                    "b_U has length {} but W_U is {:?}",
                    b_u.len(),
                    self.w_u.as_ref().map(|w| w.dim())
                )));
            }
            check_finite(b_u, "b_U")?;
        }
        check_finite(&self.w_q, "W_Q")?;
        check_finite(&self.w_k, "W_K")?;
        check_finite(&self.w_v, "W_V")?;
        check_finite(&self.w_o, "W_O")?;
        if let Some(w_e) = &self.w_e {
            check_finite(w_e, "W_E")?;
        }
        if let Some(w_u) = &self.w_u {
            check_finite(w_u, "W_U")?;
        }
        Ok(AttnDims {
            n_layers: l,
            n_heads: h,
            d_model: d,
            d_qk: dqk,
            d_v: dv,
            d_vocab: vocab,
        })
    }

    fn head_index(&self, layer: usize, head: usize) -> Result<()> {
        let (l, h, _, _) = self.w_q.dim();
        if layer >= l || head >= h {
            return Err(AnalysisError::InvalidInput(format!(
                "head L{layer}H{head} outside a model of {l} layers x {h} heads"
            )));
        }
        Ok(())
    }

    /// One head's matrix of a per-head weight array, in `f64`.
    pub(crate) fn head_f64(w: &Array4<A>, layer: usize, head: usize) -> Array2<f64> {
        to_f64(&w.slice(s![layer, head, .., ..]))
    }

    fn embed(&self) -> Result<&Array2<A>> {
        self.w_e.as_ref().ok_or_else(|| {
            AnalysisError::InvalidInput("this analysis needs W_E (embedding)".into())
        })
    }

    fn unembed(&self) -> Result<&Array2<A>> {
        self.w_u.as_ref().ok_or_else(|| {
            AnalysisError::InvalidInput("this analysis needs W_U (unembedding)".into())
        })
    }

    /// OV circuit of head `(layer, head)`: `W_V[h] W_O[h]` [D, D], factored with inner dimension
    /// `d_v`.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if the head is out of range.
    pub fn ov_circuit(&self, layer: usize, head: usize) -> Result<FactoredMatrix> {
        self.head_index(layer, head)?;
        FactoredMatrix::from_owned(
            Self::head_f64(&self.w_v, layer, head),
            Self::head_f64(&self.w_o, layer, head),
        )
    }

    /// QK circuit of head `(layer, head)`: `W_Q[h] W_K[h]^T` [D, D] (rows: query/destination side,
    /// columns: key/source side), factored with inner dimension `d_qk`.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if the head is out of range.
    pub fn qk_circuit(&self, layer: usize, head: usize) -> Result<FactoredMatrix> {
        self.head_index(layer, head)?;
        FactoredMatrix::from_owned(
            Self::head_f64(&self.w_q, layer, head),
            Self::head_f64(&self.w_k, layer, head).reversed_axes(),
        )
    }

    /// Full OV circuit `W_E W_V[h] W_O[h] W_U` [vocab, vocab] (rows: attended/source token, columns:
    /// output logit), factored as `(W_E W_V) (W_O W_U)` with inner dimension `d_v`. The bias `b_U`
    /// is not included (as in TransformerLens).
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if `W_E`/`W_U` is missing or the head is out of range.
    pub fn full_ov_circuit(&self, layer: usize, head: usize) -> Result<FactoredMatrix> {
        self.head_index(layer, head)?;
        let a = dot_rows_f64(self.embed()?, Self::head_f64(&self.w_v, layer, head).view());
        let b = dot_cols_f64(
            Self::head_f64(&self.w_o, layer, head).view(),
            self.unembed()?,
        );
        FactoredMatrix::from_owned(a, b)
    }

    /// Full QK circuit `W_E W_Q[h] W_K[h]^T W_E^T` [vocab, vocab] (rows: destination token, columns:
    /// source token), factored as `(W_E W_Q) (W_E W_K)^T` with inner dimension `d_qk`.
    /// Positional embeddings are not included.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if `W_E` is missing or the head is out of range.
    pub fn full_qk_circuit(&self, layer: usize, head: usize) -> Result<FactoredMatrix> {
        self.head_index(layer, head)?;
        let w_e = self.embed()?;
        let a = dot_rows_f64(w_e, Self::head_f64(&self.w_q, layer, head).view());
        let b = dot_rows_f64(w_e, Self::head_f64(&self.w_k, layer, head).view()).reversed_axes();
        FactoredMatrix::from_owned(a, b)
    }

    /// Eigenvalues of every head's OV circuit, through `W_O[h] W_V[h]` [d_v, d_v]
    /// (TransformerLens `model.OV.eigenvalues`).
    ///
    /// # Shapes
    /// Returns [L, H, d_v].
    ///
    /// # Errors
    /// As [`AttnWeights::check`]; [`AnalysisError::Numerical`] if an eigen-solve fails.
    pub fn ov_eigenvalues(&self) -> Result<HeadEigenvalues> {
        let dims = self.check()?;
        self.per_head_eigenvalues(dims, |l, h| {
            Ok(Self::head_f64(&self.w_o, l, h).dot(&Self::head_f64(&self.w_v, l, h)))
        })
    }

    /// Eigenvalues of every head's full OV circuit `W_E W_V W_O W_U`, through
    /// `W_O (W_U W_E) W_V` [d_v, d_v]; `W_U W_E` [D, D] is formed once (TransformerLens main demo:
    /// `(W_E @ model.OV @ W_U).eigenvalues`).
    ///
    /// # Shapes
    /// Returns [L, H, d_v].
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if `W_E` or `W_U` is missing; as
    /// [`AttnWeights::ov_eigenvalues`].
    pub fn full_ov_eigenvalues(&self) -> Result<HeadEigenvalues> {
        let dims = self.check()?;
        let ue = inner_blocks_f64(self.unembed()?, self.embed()?); // [D, D]
        self.per_head_eigenvalues(dims, |l, h| {
            Ok(Self::head_f64(&self.w_o, l, h)
                .dot(&ue)
                .dot(&Self::head_f64(&self.w_v, l, h)))
        })
    }

    fn per_head_eigenvalues<F>(&self, dims: AttnDims, small: F) -> Result<HeadEigenvalues>
    where
        F: Fn(usize, usize) -> Result<Array2<f64>>,
    {
        let (l, h, m) = (dims.n_layers, dims.n_heads, dims.d_v);
        let mut re = Array3::zeros((l, h, m));
        let mut im = Array3::zeros((l, h, m));
        for li in 0..l {
            for hi in 0..h {
                let mat = small(li, hi)?;
                let (r, i) = eig_general(mat.view())?;
                let e = Eigenvalues::from_parts(r, i);
                re.slice_mut(s![li, hi, ..]).assign(&e.re);
                im.slice_mut(s![li, hi, ..]).assign(&e.im);
            }
        }
        Ok(HeadEigenvalues { re, im })
    }

    /// Copying score of every head's OV circuit, [L, H] (see [`Eigenvalues::copying_score`]).
    ///
    /// # Errors
    /// As [`AttnWeights::ov_eigenvalues`].
    pub fn ov_copying_scores(&self) -> Result<Array2<f64>> {
        Ok(self.ov_eigenvalues()?.copying_scores())
    }

    /// Copying score of every head's full OV circuit, [L, H].
    ///
    /// # Errors
    /// As [`AttnWeights::full_ov_eigenvalues`].
    pub fn full_ov_copying_scores(&self) -> Result<Array2<f64>> {
        Ok(self.full_ov_eigenvalues()?.copying_scores())
    }
}

/// Expands grouped-query K or V weights to one head per query head: query head `h` uses K/V head
/// `h / (n_q_heads / n_kv_heads)`, the grouping of Hugging Face `repeat_kv` (Llama, SmolLM2).
///
/// # Shapes
/// `w` [L, H_kv, a, b] -> [L, n_q_heads, a, b] (works for `W_K`, `W_V` [L, H_kv, D, d] and for any
/// per-head array).
///
/// # Errors
/// [`AnalysisError::InvalidInput`] if `n_q_heads` is not a positive multiple of `H_kv`.
pub fn expand_kv_heads<S>(w: &ArrayBase<S, Ix4>, n_q_heads: usize) -> Result<Array4<S::Elem>>
where
    S: Data,
    S::Elem: Clone,
{
    let (l, hkv, a, b) = w.dim();
    if hkv == 0 || n_q_heads == 0 || !n_q_heads.is_multiple_of(hkv) {
        return Err(AnalysisError::InvalidInput(format!(
            "cannot expand {hkv} K/V heads to {n_q_heads} query heads (need a positive multiple)"
        )));
    }
    let group = n_q_heads / hkv;
    let views: Vec<_> = (0..n_q_heads)
        .map(|h| w.slice(s![.., h / group..h / group + 1, .., ..]))
        .collect();
    let out = ndarray::concatenate(Axis(1), &views)
        .map_err(|e| AnalysisError::Shape(format!("expanding K/V heads: {e}")))?;
    debug_assert_eq!(out.dim(), (l, n_q_heads, a, b));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_kv_heads_groups_consecutively() {
        let w = Array4::from_shape_fn((2, 3, 2, 1), |(l, h, i, _)| (100 * l + 10 * h + i) as f64);
        let e = expand_kv_heads(&w, 6).unwrap();
        assert_eq!(e.dim(), (2, 6, 2, 1));
        for l in 0..2 {
            for h in 0..6 {
                assert_eq!(e[[l, h, 1, 0]], (100 * l + 10 * (h / 2) + 1) as f64);
            }
        }
        assert!(expand_kv_heads(&w, 4).is_err());
        assert!(expand_kv_heads(&w, 0).is_err());
    }

    #[test]
    fn check_names_the_bad_array() {
        let q = Array4::<f32>::zeros((2, 3, 5, 4));
        let o = Array4::<f32>::zeros((2, 3, 4, 5));
        let err = AttnWeights::new(q.clone(), q.clone(), q.clone(), q.clone()).unwrap_err();
        assert!(err.to_string().contains("W_O"), "{err}");
        let w = AttnWeights::new(q.clone(), q.clone(), q.clone(), o.clone()).unwrap();
        let err = w
            .clone()
            .with_embeddings(
                Some(Array2::zeros((7, 5))),
                Some(Array2::zeros((5, 8))),
                None,
            )
            .unwrap_err();
        assert!(err.to_string().contains("W_U"), "{err}");
        let mut bad = q.clone();
        bad[[1, 2, 0, 0]] = f32::INFINITY;
        let err = AttnWeights::new(q.clone(), bad, q.clone(), o).unwrap_err();
        assert!(
            matches!(err, AnalysisError::NonFinite(ref n) if n == "W_K"),
            "{err}"
        );
        assert!(w.ov_circuit(2, 0).is_err());
        assert!(w.full_ov_circuit(0, 0).is_err());
    }
}
