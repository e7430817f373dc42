//! The latent-code lens of a language model: the code of any (query, key) pair of token positions,
//! over the query heads of chosen layers, for a batch of token sequences of unequal lengths.
//!
//! The code of a pair is what the paper's lens reads on its synthetic tasks (the attention of one
//! query to one key across the heads of a layer; Schug et al. 2024, "Attention as a hypernetwork"),
//! in one of three forms ([`CodeForm`]): the attention probabilities (TransformerLens's
//! `blocks.{l}.attn.hook_pattern`), the pre-softmax scores (`hook_attn_scores`), or the
//! probabilities renormalised without position 0, the attention sink (Xiao et al. 2024,
//! "Efficient streaming language models with attention sinks").
//!
//! [`LanguageModel::latent_codes`] runs each model's one forward body with a reader of its hook
//! points ([`crate::nn::HookPoints`]) that attaches no hook function, so every operation keeps its
//! fused fast form, and that:
//! - gathers the query rows and key columns of each selected layer's attention as the layer
//!   computes it (the `[B, H, T, T]` tensor is never handed out nor kept beyond its layer);
//! - gathers `hook_resid_post` at the queries when asked;
//! - stops after the last selected layer when no logits are wanted (in that layer after its
//!   attention pattern, unless the residual stream is asked for:
//!   [`HookPoints::needs_block_output`]), and otherwise computes the final norm and the
//!   unembedding only at each sequence's last token.
//!
//! The sequences are padded on the right, with token 0, to the longest *needed* length of the batch
//! (the largest query, key or, with logits, last position, plus one): in a causal model the
//! positions after a site cannot change it, so the codes do not depend on the batching.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device, Tensor};
use ndarray::{Array2, Array4, Array5};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::LanguageModel;
use crate::error::{ModelError, Result};
use crate::hooks::HookFn;
use crate::mixer::Normalisation;
use crate::nn::HookPoints;

#[cfg(test)]
mod tests;
mod transplant;

pub use transplant::CodeSites;

/// The form of a latent code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CodeForm {
    /// The attention probabilities `p[q, k]` (`blocks.{l}.attn.hook_pattern`; for a token model
    /// whose mixer has no softmax, its normalised attention).
    #[default]
    Pattern,
    /// The pre-softmax scores `q·k / sqrt(d)` (`blocks.{l}.attn.hook_attn_scores`).
    Scores,
    /// The probabilities renormalised without position 0 (the attention sink):
    /// `p[q, k] / (1 - p[q, 0])` for `1 <= k <= q`, computed as the softmax of the scores over the
    /// keys `1..=q` (the same value, without the cancellation of `1 - p[q, 0]` when the sink takes
    /// almost all the attention). Softmax attention only; a key at position 0 has no such code.
    NoSink,
}

impl CodeForm {
    /// The hook point (within `blocks.{l}.`) the form is read from.
    pub fn point(self) -> &'static str {
        match self {
            Self::Pattern => "attn.hook_pattern",
            Self::Scores | Self::NoSink => "attn.hook_attn_scores",
        }
    }
}

impl fmt::Display for CodeForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pattern => "pattern",
            Self::Scores => "scores",
            Self::NoSink => "no-sink",
        })
    }
}

impl FromStr for CodeForm {
    type Err = ModelError;

    /// Parses `pattern`, `scores` or `no-sink`.
    ///
    /// # Errors
    /// [`ModelError::Input`] naming the string and the accepted ones.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "pattern" => Ok(Self::Pattern),
            "scores" => Ok(Self::Scores),
            "no-sink" => Ok(Self::NoSink),
            _ => Err(ModelError::Input(format!(
                "unknown code form `{s}` (expected pattern, scores or no-sink)"
            ))),
        }
    }
}

/// What [`LanguageModel::latent_codes`] reads: per sequence, its tokens and the positions of its
/// query and key sites.
///
/// # Shapes
/// `tokens` N sequences of any lengths `T_i >= 1`; `query` `[N][Q]`, `keys` `[N][K]` positions
/// (the same `Q` and `K` for every sequence).
#[derive(Debug, Clone, Copy)]
pub struct CodeRequest<'a> {
    /// The token ids of each sequence.
    pub tokens: &'a [Vec<u32>],
    /// The query positions of each sequence.
    pub query: &'a [Vec<usize>],
    /// The key positions of each sequence.
    pub keys: &'a [Vec<usize>],
    /// The layers to read, in the order of the codes' layer axis (distinct); `None` for all.
    pub layers: Option<&'a [usize]>,
    /// The form of the code.
    pub form: CodeForm,
    /// Whether to return the next-token logits after each sequence's last token.
    pub last_logits: bool,
    /// Whether to return the residual stream after each selected layer at the queries.
    pub resid: bool,
    /// The index of sequence 0 in the caller's numbering (prompt numbers in error messages).
    pub first_index: usize,
}

/// What [`LanguageModel::latent_codes`] returns.
#[derive(Debug, Clone)]
pub struct CodeBatch {
    /// The codes `[N, L, H, Q, K]` float32 (`L` the selected layers in the request's order, `H`
    /// the query heads): the layout of `codes.npz` (`hyperlens_io::keys::lm_codes::CODES`).
    pub codes: Array5<f32>,
    /// With `last_logits`: the next-token logits after each sequence's last token, `[N, V]`.
    pub last_logits: Option<Array2<f32>>,
    /// With `resid`: `blocks.{l}.hook_resid_post` of each selected layer at each query,
    /// `[N, L, Q, D]`.
    pub resid: Option<Array4<f32>>,
}

/// A checked request: the padded batch and the sizes of the result.
#[derive(Debug)]
struct Plan {
    /// Token ids `[N, T]`, each sequence cut to `T` or padded with 0.
    tokens: Vec<u32>,
    n: usize,
    t: usize,
    q: usize,
    k: usize,
    /// The selected layers, in the order of the codes' layer axis.
    layers: Vec<usize>,
    /// How many blocks the pass runs.
    ran: usize,
    /// Each sequence's length.
    lengths: Vec<usize>,
}

/// The reader of one pass's hook points ([`HookPoints`] with no hook function): it gathers the
/// sites of the selected layers as the pass goes and leaves every activation unchanged.
struct Sites<'a> {
    form: CodeForm,
    plan: &'a Plan,
    h: usize,
    /// Per model layer, its slot on the codes' layer axis.
    slots: Vec<Option<usize>>,
    /// The flat indices into `[N, H, T, T]` of the sites, in `[N, H, Q, K]` order (`Pattern`,
    /// `Scores`), or of the query rows, `[N, H, Q, T]` (`NoSink`).
    site_index: Tensor,
    /// The flat rows of `[N·T, D]` at the queries, `[N·Q]`, when `resid` is asked.
    resid_rows: Option<Tensor>,
    /// The flat rows of `[N·T, D]` at each sequence's last token (empty without logits).
    logit_rows: Tensor,
    queries: &'a [Vec<usize>],
    keys: &'a [Vec<usize>],
    codes: Vec<f32>,
    resid: Vec<f32>,
    d: usize,
}

impl Sites<'_> {
    /// Gathers the codes of the layer in `slot` from its activation `value` ([`CodeForm::point`]).
    ///
    /// # Shapes
    /// `value [N, H, T, T]`.
    fn gather_codes(&mut self, slot: usize, value: &Tensor) -> Result<()> {
        let p = self.plan;
        let (n, h, t, q, k) = (p.n, self.h, p.t, p.q, p.k);
        if value.dims() != [n, h, t, t] {
            return Err(ModelError::Input(format!(
                "latent codes: the attention of a layer is {:?}, expected {:?}",
                value.dims(),
                [n, h, t, t]
            )));
        }
        let vals = value
            .flatten_all()?
            .index_select(&self.site_index, 0)?
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .to_vec1::<f32>()?;
        let n_layers = p.layers.len();
        for b in 0..n {
            for hh in 0..h {
                let out = ((b * n_layers + slot) * h + hh) * q * k;
                let dst = &mut self.codes[out..out + q * k];
                match self.form {
                    CodeForm::Pattern | CodeForm::Scores => {
                        let src = (b * h + hh) * q * k;
                        dst.copy_from_slice(&vals[src..src + q * k]);
                    }
                    CodeForm::NoSink => {
                        for (qi, &qpos) in self.queries[b].iter().enumerate() {
                            let row = &vals[((b * h + hh) * q + qi) * t..][..t];
                            let probs = softmax_without_sink(&row[..=qpos]);
                            for (ki, &kpos) in self.keys[b].iter().enumerate() {
                                dst[qi * k + ki] = probs[kpos - 1];
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Gathers `hook_resid_post` of the layer in `slot` at the queries.
    ///
    /// # Shapes
    /// `value [N, T, D]`.
    fn gather_resid(&mut self, slot: usize, value: &Tensor, rows: &Tensor) -> Result<()> {
        let p = self.plan;
        let (n, t, q, d) = (p.n, p.t, p.q, self.d);
        let vals = value
            .reshape((n * t, d))?
            .index_select(rows, 0)?
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let n_layers = p.layers.len();
        for b in 0..n {
            let out = (b * n_layers + slot) * q * d;
            self.resid[out..out + q * d].copy_from_slice(&vals[b * q * d..(b + 1) * q * d]);
        }
        Ok(())
    }
}

impl HookPoints for Sites<'_> {
    fn hooks(&mut self) -> Option<&mut dyn HookFn> {
        None
    }

    fn at_block(&mut self, l: usize, point: &str, value: Tensor) -> Result<Tensor> {
        let Some(slot) = self.slots.get(l).copied().flatten() else {
            return Ok(value);
        };
        if point == self.form.point() {
            self.gather_codes(slot, &value)?;
        } else if point == "hook_resid_post" {
            if let Some(rows) = self.resid_rows.clone() {
                self.gather_resid(slot, &value, &rows)?;
            }
        }
        Ok(value)
    }

    fn blocks_to_run(&self, n_layers: usize) -> usize {
        self.plan.ran.min(n_layers)
    }

    fn logit_rows(&self) -> Option<&Tensor> {
        Some(&self.logit_rows)
    }

    fn needs_block_output(&self, l: usize) -> bool {
        // After the last block run, only the logits or the residual stream would need more.
        l + 1 < self.plan.ran || self.resid_rows.is_some() || self.logit_rows.elem_count() > 0
    }
}

/// The softmax of `scores[1..]` (the keys after position 0), in float64.
///
/// # Shapes
/// `scores [q + 1]` (`q >= 1`) -> `[q]`.
fn softmax_without_sink(scores: &[f32]) -> Vec<f32> {
    let rest = &scores[1..];
    let m = rest
        .iter()
        .fold(f64::NEG_INFINITY, |m, &s| m.max(f64::from(s)));
    let e: Vec<f64> = rest.iter().map(|&s| (f64::from(s) - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|&x| (x / z) as f32).collect()
}

impl LanguageModel {
    /// Residual width `D`.
    pub fn d_model(&self) -> usize {
        match self {
            Self::Token(m) => m.config().d_model,
            Self::Llama(m) => m.config().d_model,
            Self::Gpt2(m) => m.config().d_model,
        }
    }

    /// Per query head, the key/value head it reads: `h / (H / H_kv)` for grouped-query attention
    /// (Hugging Face `repeat_kv`), `h` for GPT-2 and the token models.
    ///
    /// # Shapes
    /// `[H]`.
    pub fn kv_groups(&self) -> Vec<usize> {
        let h = self.n_heads();
        let per_kv = match self {
            Self::Llama(m) => h / m.config().n_kv_heads.max(1),
            Self::Token(_) | Self::Gpt2(_) => 1,
        };
        (0..h).map(|i| i / per_kv.max(1)).collect()
    }

    /// The same model with every weight tensor's entries permuted within the tensor (a uniform
    /// random permutation per tensor, Fisher–Yates from one ChaCha8 stream seeded with `seed`,
    /// the tensors in the model's fixed order, as `crate::nn::params::seeded_tensors` draws its
    /// initialisations): the control of the lens, the codes of a model with the same weight
    /// statistics per tensor and no learned structure. A tied unembedding stays tied.
    ///
    /// # Errors
    /// Candle errors (copying the weights to the host and back).
    pub fn with_shuffled_weights(&self, seed: u64) -> Result<LanguageModel> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut shuffle = |t: &Tensor| -> Result<Tensor> {
            let mut data = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            data.shuffle(&mut rng);
            Ok(Tensor::from_vec(data, t.shape(), t.device())?.to_dtype(t.dtype())?)
        };
        Ok(match self {
            Self::Token(m) => Self::Token(m.map_weights(&mut shuffle)?),
            Self::Llama(m) => Self::Llama(m.map_weights(&mut shuffle)?),
            Self::Gpt2(m) => Self::Gpt2(m.map_weights(&mut shuffle)?),
        })
    }

    /// The latent codes of the request's (query, key) pairs ([`CodeForm`]) over the query heads of
    /// the selected layers, with, on request, the next-token logits after each sequence's last
    /// token and the residual stream at the queries (module docs: what is and is not computed).
    /// The codes do not depend on how the sequences are batched.
    ///
    /// # Shapes
    /// `req.tokens` N sequences, `req.query` `[N][Q]`, `req.keys` `[N][K]` -> codes
    /// `[N, L, H, Q, K]` float32, logits `[N, V]`, resid `[N, L, Q, D]` ([`CodeBatch`]).
    ///
    /// # Errors
    /// [`ModelError::Input`] naming the sequence (`first_index + i`) for an empty sequence, one
    /// longer than the model's context, a token id out of range, no query or no key, a position past
    /// the sequence's end, a key after its query (every model here is causal), a key at position 0
    /// in the `no-sink` form, or another number of queries or keys than sequence 0's; naming the
    /// layer for one out of range or repeated; `no-sink` on a token model without softmax
    /// attention. [`ModelError::Budget`] for a batch whose attention of one layer (three
    /// `[N, H, T, T]` float32 tensors at most) exceeds the memory budget (`hyperlens_io::budget`).
    pub fn latent_codes(&self, req: &CodeRequest<'_>) -> Result<CodeBatch> {
        let plan = self.plan(req)?;
        let (n, t, q, k, h, d) = (
            plan.n,
            plan.t,
            plan.q,
            plan.k,
            self.n_heads(),
            self.d_model(),
        );
        // The transient attention of one layer: the scores, the pattern, and a masked or
        // exponentiated copy inside the softmax.
        let per_layer = hyperlens_io::budget::bytes_of(4, &[n, h, t, t]);
        hyperlens_io::budget::check_alloc(
            format!("the attention of one layer for {n} sequences of {t} tokens ({h} heads)"),
            per_layer.saturating_mul(3),
        )?;
        let dev = self.device();
        let site_index = site_index(&plan, req, h, dev)?;
        let resid_rows = req
            .resid
            .then(|| {
                let rows: Vec<u32> = req
                    .query
                    .iter()
                    .enumerate()
                    .flat_map(|(b, qs)| qs.iter().map(move |&p| (b * t + p) as u32))
                    .collect();
                Tensor::from_vec(rows, n * q, dev)
            })
            .transpose()?;
        let last: Vec<u32> = if req.last_logits {
            (0..n)
                .map(|b| (b * t + plan.lengths[b] - 1) as u32)
                .collect()
        } else {
            Vec::new()
        };
        let n_rows = last.len();
        let logit_rows = Tensor::from_vec(last, n_rows, dev)?;
        let n_layers = plan.layers.len();
        let mut slots = vec![None; self.n_layers()];
        for (s, &l) in plan.layers.iter().enumerate() {
            slots[l] = Some(s);
        }
        let mut sites = Sites {
            form: req.form,
            plan: &plan,
            h,
            slots,
            site_index,
            resid_rows,
            logit_rows,
            queries: req.query,
            keys: req.keys,
            codes: vec![0f32; n * n_layers * h * q * k],
            resid: if req.resid {
                vec![0f32; n * n_layers * q * d]
            } else {
                Vec::new()
            },
            d,
        };
        let tokens = Tensor::from_slice(&plan.tokens, (n, t), dev)?;
        let logits = self.pass_with(&tokens, &mut sites)?;
        let shape_err = |e: ndarray::ShapeError| ModelError::Input(format!("latent codes: {e}"));
        let last_logits = if req.last_logits {
            let v = self.vocab_size();
            let data = logits
                .to_dtype(DType::F32)?
                .to_device(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            Some(Array2::from_shape_vec((n, v), data).map_err(shape_err)?)
        } else {
            None
        };
        let resid = if req.resid {
            let data = std::mem::take(&mut sites.resid);
            Some(Array4::from_shape_vec((n, n_layers, q, d), data).map_err(shape_err)?)
        } else {
            None
        };
        let codes =
            Array5::from_shape_vec((n, n_layers, h, q, k), std::mem::take(&mut sites.codes))
                .map_err(shape_err)?;
        Ok(CodeBatch {
            codes,
            last_logits,
            resid,
        })
    }

    /// The model's forward body with the reader `sites`; returns its logits.
    fn pass_with(&self, tokens: &Tensor, sites: &mut Sites<'_>) -> Result<Tensor> {
        Ok(match self {
            Self::Token(m) => m.pass_with(tokens, sites)?,
            Self::Llama(m) => m.pass_with(tokens, sites)?,
            Self::Gpt2(m) => m.pass_with(tokens, sites)?,
        })
    }

    /// Checks a request and pads its batch ([`Plan`]).
    ///
    /// # Errors
    /// As [`LanguageModel::latent_codes`].
    fn plan(&self, req: &CodeRequest<'_>) -> Result<Plan> {
        let err = |msg: String| Err(ModelError::Input(msg));
        let n = req.tokens.len();
        if n == 0 {
            return err("latent codes: no sequences".into());
        }
        if req.query.len() != n || req.keys.len() != n {
            return err(format!(
                "latent codes: {n} sequences but {} query lists and {} key lists",
                req.query.len(),
                req.keys.len()
            ));
        }
        let n_layers = self.n_layers();
        let layers: Vec<usize> = match req.layers {
            Some(ls) => ls.to_vec(),
            None => (0..n_layers).collect(),
        };
        if layers.is_empty() {
            return err(if n_layers == 0 {
                "latent codes: the model has no layers (no attention to read)".into()
            } else {
                "latent codes: no layer selected".into()
            });
        }
        for (i, &l) in layers.iter().enumerate() {
            if l >= n_layers {
                return err(format!(
                    "latent codes: layer {l} is out of range for a model of {n_layers} layers"
                ));
            }
            if layers[..i].contains(&l) {
                return err(format!("latent codes: layer {l} is selected twice"));
            }
        }
        if req.form == CodeForm::NoSink {
            if let Self::Token(m) = self {
                let norm = m.config().mixer.normalisation();
                if norm != Normalisation::Softmax {
                    return err(format!(
                        "latent codes: the no-sink form renormalises softmax attention, but this \
                         token model's mixer `{}` normalises with `{}`",
                        m.config().mixer,
                        norm.name()
                    ));
                }
            }
        }
        let (vocab, ctx) = (self.vocab_size(), self.max_seq_len());
        let (q, k) = (req.query[0].len(), req.keys[0].len());
        let mut needed_t = 0;
        let mut lengths = Vec::with_capacity(n);
        for (i, toks) in req.tokens.iter().enumerate() {
            let name = req.first_index + i;
            let len = toks.len();
            if len == 0 {
                return err(format!("sequence {name} is empty"));
            }
            if len > ctx {
                return err(format!(
                    "sequence {name} has {len} tokens, more than the model's context of {ctx}"
                ));
            }
            if let Some((p, &id)) = toks
                .iter()
                .enumerate()
                .find(|(_, &id)| id as usize >= vocab)
            {
                return err(format!(
                    "sequence {name}: token id {id} at position {p} is out of range for a \
                     vocabulary of {vocab}"
                ));
            }
            let (qs, ks) = (&req.query[i], &req.keys[i]);
            if qs.is_empty() {
                return err(format!("sequence {name} has no query position"));
            }
            if ks.is_empty() {
                return err(format!("sequence {name} has no key position"));
            }
            if qs.len() != q || ks.len() != k {
                return err(format!(
                    "sequence {name} has {} query and {} key positions, but sequence {} has {q} \
                     and {k}: every sequence of a batch needs as many",
                    qs.len(),
                    ks.len(),
                    req.first_index
                ));
            }
            for (what, ps) in [("query", qs), ("key", ks)] {
                if let Some(&p) = ps.iter().find(|&&p| p >= len) {
                    return err(format!(
                        "sequence {name}: {what} position {p} is past its end (length {len})"
                    ));
                }
            }
            let first_query = qs.iter().copied().min().unwrap_or(0);
            if let Some(&kp) = ks.iter().find(|&&kp| kp > first_query) {
                return err(format!(
                    "sequence {name}: key position {kp} is after query position {first_query} \
                     (the model is causal: a query attends only to itself and earlier positions)"
                ));
            }
            if req.form == CodeForm::NoSink && ks.contains(&0) {
                return err(format!(
                    "sequence {name}: key position 0 has no code in the no-sink form (position 0 \
                     is the one renormalised away)"
                ));
            }
            let mut need = qs.iter().chain(ks).copied().max().unwrap_or(0) + 1;
            if req.last_logits {
                need = need.max(len);
            }
            needed_t = needed_t.max(need);
            lengths.push(len);
        }
        let t = needed_t;
        let mut tokens = vec![0u32; n * t];
        for (b, toks) in req.tokens.iter().enumerate() {
            let m = toks.len().min(t);
            tokens[b * t..b * t + m].copy_from_slice(&toks[..m]);
        }
        let ran = if req.last_logits {
            n_layers
        } else {
            layers.iter().copied().max().unwrap_or(0) + 1
        };
        Ok(Plan {
            tokens,
            n,
            t,
            q,
            k,
            layers,
            ran,
            lengths,
        })
    }
}

/// The flat indices into one layer's attention `[N, H, T, T]` of the request's sites, in
/// `[N, H, Q, K]` order, or for [`CodeForm::NoSink`] of its query rows, in `[N, H, Q, T]` order.
///
/// # Errors
/// Candle errors.
fn site_index(plan: &Plan, req: &CodeRequest<'_>, h: usize, dev: &Device) -> Result<Tensor> {
    let (n, t, q, k) = (plan.n, plan.t, plan.q, plan.k);
    let width = if req.form == CodeForm::NoSink { t } else { k };
    let mut idx: Vec<i64> = Vec::with_capacity(n * h * q * width);
    for b in 0..n {
        for hh in 0..h {
            for &qp in &req.query[b] {
                let row = ((b * h + hh) * t + qp) * t;
                if req.form == CodeForm::NoSink {
                    idx.extend((0..t).map(|j| (row + j) as i64));
                } else {
                    idx.extend(req.keys[b].iter().map(|&kp| (row + kp) as i64));
                }
            }
        }
    }
    let len = idx.len();
    Ok(Tensor::from_vec(idx, len, dev)?)
}
