//! The code transplant of a language model: the next-token logits of a batch of sequences with
//! the attention pattern of one layer (TransformerLens's `blocks.{l}.attn.hook_pattern`) replaced
//! at one query row and its keys, `pattern[b, h, query_b, keys_b[j]] = codes[b, h, j]`, the rest
//! of the row left as it is (not renormalised: the SRAVEN transplant's intervention,
//! `crate::Evaluator::run_with_site_codes`).
//!
//! [`LanguageModel::last_logits_with_codes`] runs each model's one forward body with a writer of
//! its hook points that attaches no hook function, so every operation keeps its fused fast form:
//! Llama and GPT-2 compute the attention's output from the pattern their `attn.hook_pattern` point
//! returns (`super::super::layers::causal_softmax`), so writing there is the whole intervention,
//! and the pass gives the logits of [`LanguageModel::latent_codes`] bit for bit when it writes the
//! codes that pass read. A hyperlens token model mixes its values inside the fused mixer
//! (`crate::Ops::mix`), which makes no pattern it would read back; its pass runs the hooked,
//! decomposed mixer (`crate::hooks::mix_hooked`), whose roundings differ from the fused one's (about
//! 1e-6). The sequences are padded as the lens pads them (module docs of `super`), so the logits
//! do not depend on the batching.

use candle_core::{DType, Device, Tensor};
use ndarray::{Array2, ArrayView3, ArrayView4, Axis};

use super::{CodeForm, CodeRequest, Plan};
use crate::error::{ModelError, Result};
use crate::hooks::HookFn;
use crate::lm::LanguageModel;
use crate::nn::HookPoints;

#[cfg(test)]
mod tests;

/// Where [`LanguageModel::last_logits_with_codes`] writes: per sequence, its tokens, its one query
/// position and its key positions.
///
/// # Shapes
/// `tokens` N sequences of any lengths `T_i >= 1`; `query` `[N]`; `keys` `[N][K]` (the same `K`
/// for every sequence, distinct within a sequence).
#[derive(Debug, Clone, Copy)]
pub struct CodeSites<'a> {
    /// The token ids of each sequence.
    pub tokens: &'a [Vec<u32>],
    /// The query position of each sequence (the row of the pattern that is written).
    pub query: &'a [usize],
    /// The key positions of each sequence (the columns of that row that are written).
    pub keys: &'a [Vec<usize>],
    /// The index of sequence 0 in the caller's numbering (prompt numbers in error messages).
    pub first_index: usize,
}

/// The writer of one pass's hook points: at each written layer's `attn.hook_pattern` it sets the
/// sites to that layer's codes, everywhere else it leaves the activations as they are.
struct WriteSites {
    /// Per model layer, its slot among the written layers.
    slots: Vec<Option<usize>>,
    /// Per slot, `blocks.{l}.attn.hook_pattern` (for the hooked pass of a token model).
    names: Vec<String>,
    /// Whether the pass runs hooked (a token model: its fused mixer ignores the pattern's point).
    hooked: bool,
    /// `[N·H, K]` u32: per (sequence, head) row of the pattern viewed as `[N·H, T·T]`, the flat
    /// indices `query·T + key` of the sites.
    index: Tensor,
    /// Per slot, `[N·H, K]` float32: the codes to write there.
    codes: Vec<Tensor>,
    /// The flat rows of `[N·T, D]` at each sequence's last token.
    logit_rows: Tensor,
}

impl WriteSites {
    /// The pattern `[N, H, T, T]` of the layer in `slot` with the sites set to its codes.
    fn write(&self, slot: usize, pattern: &Tensor) -> Result<Tensor> {
        let (n, h, t, t2) = pattern.dims4()?;
        let rows = self.index.dims2()?.0;
        if rows != n * h || t != t2 {
            return Err(ModelError::Input(format!(
                "code transplant: the pattern at {} is {:?}, expected {rows} (sequence, head) \
                 rows of a square pattern",
                self.names[slot],
                pattern.dims()
            )));
        }
        let codes = self.codes[slot].to_dtype(pattern.dtype())?;
        let written = pattern
            .reshape((n * h, t * t))?
            .scatter(&self.index, &codes, 1)?;
        Ok(written.reshape((n, h, t, t))?)
    }
}

impl HookFn for WriteSites {
    fn wants(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    fn call(&mut self, name: &str, value: &Tensor) -> Result<Option<Tensor>> {
        match self.names.iter().position(|n| n == name) {
            Some(slot) => Ok(Some(self.write(slot, value)?)),
            None => Ok(None),
        }
    }
}

impl HookPoints for WriteSites {
    fn hooks(&mut self) -> Option<&mut dyn HookFn> {
        if self.hooked {
            Some(self)
        } else {
            None
        }
    }

    fn at_block(&mut self, l: usize, point: &str, value: Tensor) -> Result<Tensor> {
        match self.slots.get(l).copied().flatten() {
            Some(slot) if point == "attn.hook_pattern" => self.write(slot, &value),
            _ => Ok(value),
        }
    }

    fn logit_rows(&self) -> Option<&Tensor> {
        Some(&self.logit_rows)
    }
}

impl LanguageModel {
    /// The next-token logits after each sequence's last token with the attention pattern of
    /// `layer` (`blocks.{layer}.attn.hook_pattern`) replaced at each sequence's query row and keys
    /// by `codes`, the rest of the row unchanged (not renormalised), in the fast forward pass
    /// (module docs: Llama and GPT-2 give [`LanguageModel::latent_codes`]'s logits bit for bit when
    /// the codes are the pass's own). The logits do not depend on how the sequences are batched.
    /// [`LanguageModel::last_logits_with_layer_codes`] with one layer.
    ///
    /// # Shapes
    /// `sites.tokens` N sequences, `sites.query` `[N]`, `sites.keys` `[N][K]`, `codes`
    /// `[N, H, K]` (`H` the query heads) -> logits `[N, V]` float32.
    ///
    /// # Errors
    /// As [`LanguageModel::last_logits_with_layer_codes`].
    pub fn last_logits_with_codes(
        &self,
        sites: &CodeSites<'_>,
        layer: usize,
        codes: ArrayView3<'_, f32>,
    ) -> Result<Array2<f32>> {
        self.last_logits_with_layer_codes(sites, &[layer], codes.insert_axis(Axis(1)))
    }

    /// [`LanguageModel::last_logits_with_codes`] writing several layers in one pass: layer
    /// `layers[i]`'s pattern takes `codes[:, i]` at the sites.
    ///
    /// # Shapes
    /// `sites` as [`LanguageModel::last_logits_with_codes`], `codes` `[N, L, H, K]` (`L` the
    /// layers, in `layers`' order) -> logits `[N, V]` float32.
    ///
    /// # Errors
    /// [`ModelError::Input`] naming the sequence (`first_index + i`) for what
    /// [`LanguageModel::latent_codes`] rejects (an empty or too long sequence, a token id out of
    /// range, no key, a position past the end, a key after the query, another number of keys than
    /// sequence 0's), for a key given twice, and for a code that is not finite; naming the layer
    /// for one out of range or given twice, or no layer; for `codes` of another shape than
    /// `[N, L, H, K]`. [`ModelError::Budget`] as [`LanguageModel::latent_codes`].
    pub fn last_logits_with_layer_codes(
        &self,
        sites: &CodeSites<'_>,
        layers: &[usize],
        codes: ArrayView4<'_, f32>,
    ) -> Result<Array2<f32>> {
        let n = sites.tokens.len();
        if sites.query.len() != n {
            return Err(ModelError::Input(format!(
                "code transplant: {n} sequences but {} query positions",
                sites.query.len()
            )));
        }
        let query: Vec<Vec<usize>> = sites.query.iter().map(|&q| vec![q]).collect();
        let req = CodeRequest {
            tokens: sites.tokens,
            query: &query,
            keys: sites.keys,
            layers: Some(layers),
            form: CodeForm::Pattern,
            last_logits: true,
            resid: false,
            first_index: sites.first_index,
        };
        let plan = self.plan(&req)?;
        let h = self.n_heads();
        check_codes(&plan, sites, h, codes)?;
        let per_layer = hyperlens_io::budget::bytes_of(4, &[plan.n, h, plan.t, plan.t]);
        hyperlens_io::budget::check_alloc(
            format!(
                "the attention of one layer for {} sequences of {} tokens ({h} heads)",
                plan.n, plan.t
            ),
            per_layer.saturating_mul(3),
        )?;
        let dev = self.device();
        let mut slots = vec![None; self.n_layers()];
        for (s, &l) in plan.layers.iter().enumerate() {
            slots[l] = Some(s);
        }
        let layer_codes = (0..plan.layers.len())
            .map(|s| {
                let c = codes.index_axis(Axis(1), s);
                Ok(Tensor::from_iter(c.iter().copied(), dev)?.reshape((n * h, plan.k))?)
            })
            .collect::<Result<Vec<Tensor>>>()?;
        let mut writer = WriteSites {
            slots,
            names: plan
                .layers
                .iter()
                .map(|l| format!("blocks.{l}.attn.hook_pattern"))
                .collect(),
            hooked: matches!(self, Self::Token(_)),
            index: site_rows(&plan, sites, h, dev)?,
            codes: layer_codes,
            logit_rows: Tensor::from_vec(
                (0..n)
                    .map(|b| (b * plan.t + plan.lengths[b] - 1) as u32)
                    .collect::<Vec<u32>>(),
                n,
                dev,
            )?,
        };
        let tokens = Tensor::from_slice(&plan.tokens, (n, plan.t), dev)?;
        let logits = match self {
            Self::Token(m) => m.pass_with(&tokens, &mut writer)?,
            Self::Llama(m) => m.pass_with(&tokens, &mut writer)?,
            Self::Gpt2(m) => m.pass_with(&tokens, &mut writer)?,
        };
        let data = logits
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Array2::from_shape_vec((n, self.vocab_size()), data)
            .map_err(|e| ModelError::Input(format!("code transplant: {e}")))
    }
}

/// Checks the codes against the checked request `plan`: their shape `[N, L, H, K]`, finite
/// values, and distinct keys per sequence (two codes for one entry would be ambiguous).
///
/// # Errors
/// [`ModelError::Input`] naming the sequence or the shape.
fn check_codes(
    plan: &Plan,
    sites: &CodeSites<'_>,
    h: usize,
    codes: ArrayView4<'_, f32>,
) -> Result<()> {
    let want = (plan.n, plan.layers.len(), h, plan.k);
    if codes.dim() != want {
        return Err(ModelError::Input(format!(
            "code transplant: the codes are {:?}, expected [sequences, layers, heads, keys] = {:?}",
            codes.dim(),
            want
        )));
    }
    for (b, ks) in sites.keys.iter().enumerate() {
        let name = sites.first_index + b;
        if let Some((j, &kp)) = ks.iter().enumerate().find(|(j, kp)| ks[..*j].contains(kp)) {
            return Err(ModelError::Input(format!(
                "sequence {name}: key position {kp} is given twice (key {j}): each entry of the \
                 pattern takes one code"
            )));
        }
        let row = codes.index_axis(Axis(0), b);
        if let Some(((s, hh, j), v)) = row.indexed_iter().find(|(_, v)| !v.is_finite()) {
            return Err(ModelError::Input(format!(
                "sequence {name}: the code of layer {} head {hh} at key {j} is {v}, not a finite \
                 number",
                plan.layers[s]
            )));
        }
    }
    Ok(())
}

/// Per (sequence, head) row of one layer's pattern viewed as `[N·H, T·T]`, the flat indices
/// `query·T + key` of the sites, `[N·H, K]` u32.
///
/// # Errors
/// Candle errors.
fn site_rows(plan: &Plan, sites: &CodeSites<'_>, h: usize, dev: &Device) -> Result<Tensor> {
    let (n, t, k) = (plan.n, plan.t, plan.k);
    let mut idx: Vec<u32> = Vec::with_capacity(n * h * k);
    for b in 0..n {
        let row = sites.query[b] * t;
        for _ in 0..h {
            idx.extend(sites.keys[b].iter().map(|&kp| (row + kp) as u32));
        }
    }
    Ok(Tensor::from_vec(idx, (n * h, k), dev)?)
}
