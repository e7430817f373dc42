//! Reading a pass: the latent codes at chosen sites and layers, the streams entering the blocks,
//! and whole attention patterns ([`Evaluator::read`], [`Evaluator::patterns`]).

use candle_core::{IndexOp, Tensor};
use ndarray::ArrayView3;

use super::Evaluator;
use crate::error::{ModelError, Result};
use crate::infer::InferenceHooks;

/// One site of latent codes: a query position and the key positions whose attention scores
/// (across all heads) are read, as in the paper's Fig. 3 (query 35, keys 27 and 31 of a SRAVEN
/// problem).
///
/// The one site type of hyperlens, in its resolved stage: positions of a sequence. Its parsed
/// stage is `hyperlens_probe::Site` (`paper`, `slot:F`, `all-slots`, `query:I;keys:J,K`), which
/// resolves to `CodeSite`s for a task's shape; extraction (SRAVEN and fuzzy logic), the
/// transplant test, the report's causal section and the Python front all hold this type.
/// Printed in the explicit CLI form `query:I;keys:J,K,...`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CodeSite {
    /// The query position, `0..T`.
    pub query: usize,
    /// The key positions, each `0..T`.
    pub keys: Vec<usize>,
}

impl CodeSite {
    /// The last token's attention to itself in a sequence of `n_tokens` (the paper's site of the
    /// fuzzy-logic task).
    pub fn last_token(n_tokens: usize) -> CodeSite {
        let last = n_tokens.saturating_sub(1);
        CodeSite {
            query: last,
            keys: vec![last],
        }
    }
}

impl std::fmt::Display for CodeSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        write!(f, "query:{};keys:{}", self.query, keys.join(","))
    }
}

/// What [`Evaluator::read`] keeps of a pass.
#[derive(Debug, Clone, Copy)]
pub struct Reads<'a> {
    /// The sites (`S` of them), all with the same number `K` of keys.
    pub sites: &'a [CodeSite],
    /// The layers whose codes are kept (`L'` of them, in this order; repeats allowed).
    pub layers: &'a [usize],
    /// Whether to keep the residual stream entering every block (`blocks.{l}.hook_resid_pre`).
    pub resid_pre: bool,
}

/// What [`Evaluator::read`] returns.
///
/// # Shapes
/// `logits [B, F, d_out]`; `codes [B, S, L', H, K]` (problem, site, kept layer, head, key);
/// `resid_pre`: one `[B, T, D]` per block when asked for, else empty. All row-major float32.
#[derive(Debug, Clone, PartialEq)]
pub struct Readings {
    /// The logits.
    pub logits: Vec<f32>,
    /// The latent codes at the sites and layers.
    pub codes: Vec<f32>,
    /// The streams entering the blocks.
    pub resid_pre: Vec<Vec<f32>>,
}

/// The host engine's hooks for [`Evaluator::read`]: each problem's row is `L` streams `[T, D]`
/// (when read) followed by the codes `[S, L', H, K]`.
struct ReadHooks<'a> {
    sites: &'a [CodeSite],
    /// Where each model layer goes among the kept ones (all of them, for repeats).
    slots_of: Vec<Vec<usize>>,
    n_kept: usize,
    n_heads: usize,
    n_tokens: usize,
    n_keys: usize,
    /// Floats per stream; 0 reads none.
    stream: usize,
    n_layers: usize,
    first_query: usize,
}

impl InferenceHooks for ReadHooks<'_> {
    fn resid_pre(&self, layer: usize, _: usize, resid: &mut [f32], row: &mut [f32]) {
        if self.stream > 0 {
            row[layer * self.stream..][..self.stream].copy_from_slice(resid);
        }
    }

    fn pattern(&self, layer: usize, _: usize, att: &mut [f32], row: &mut [f32]) {
        let (h, t, nk) = (self.n_heads, self.n_tokens, self.n_keys);
        let codes = &mut row[self.n_layers * self.stream..];
        for &li in &self.slots_of[layer] {
            for (si, site) in self.sites.iter().enumerate() {
                for hh in 0..h {
                    let dst = &mut codes[((si * self.n_kept + li) * h + hh) * nk..][..nk];
                    let src = &att[(hh * t + site.query) * t..][..t];
                    for (d, &k) in dst.iter_mut().zip(&site.keys) {
                        *d = src[k];
                    }
                }
            }
        }
    }

    fn last_block_from_query(&self) -> usize {
        self.first_query
    }
}

impl Evaluator {
    /// [`ModelError::Input`] unless every site and layer is inside the model and the sites have
    /// the same, non-zero number of keys.
    fn check_reads(&self, reads: &Reads<'_>) -> Result<usize> {
        let cfg = self.config();
        let t = cfg.n_tokens;
        let n_keys = reads.sites.first().map_or(0, |s| s.keys.len());
        let bad_site = reads
            .sites
            .iter()
            .find(|s| s.query >= t || s.keys.len() != n_keys || s.keys.iter().any(|&k| k >= t));
        if n_keys == 0 || bad_site.is_some() {
            let shown = reads
                .sites
                .iter()
                .map(|s| format!("query {} keys {:?}", s.query, s.keys))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(ModelError::Input(format!(
                "code sites [{shown}]: give one or more sites, each a query and the same number (1 or more) of keys, all below the model's {t} tokens"
            )));
        }
        if let Some(l) = reads.layers.iter().find(|&&l| l >= cfg.n_layers) {
            return Err(ModelError::Input(format!(
                "layer {l} of a model with {} layers",
                cfg.n_layers
            )));
        }
        Ok(n_keys)
    }

    /// One pass over a problem batch that keeps its logits, the latent codes at `reads.sites` of
    /// the layers `reads.layers` and, with `reads.resid_pre`, the stream entering every block.
    /// On the CPU the host engine computes the last block only for the queries read there and the
    /// logits' positions (the same bits as the full pass).
    ///
    /// # Shapes
    /// `x [B, T, d_in]`; see [`Readings`].
    ///
    /// # Errors
    /// [`ModelError::Input`] for a batch of another shape, no site, sites of different key counts
    /// or positions outside the sequence, a layer outside the model; candle errors.
    pub fn read(&self, x: ArrayView3<'_, f32>, reads: &Reads<'_>) -> Result<Readings> {
        self.check_input(x)?;
        let n_keys = self.check_reads(reads)?;
        let cfg = self.config();
        let (t, h, nl, dm) = (cfg.n_tokens, cfg.n_heads, cfg.n_layers, cfg.d_model);
        let Some(inf) = self.host() else {
            return self.read_candle(x, reads, n_keys);
        };
        let mut slots_of = vec![Vec::new(); nl];
        for (li, &l) in reads.layers.iter().enumerate() {
            slots_of[l].push(li);
        }
        // At the last block the pass computes only the queries read there (and the logits' rows).
        let first_query = if slots_of[nl - 1].is_empty() {
            usize::MAX
        } else {
            reads
                .sites
                .iter()
                .map(|s| s.query)
                .min()
                .unwrap_or(usize::MAX)
        };
        let hooks = ReadHooks {
            sites: reads.sites,
            slots_of,
            n_kept: reads.layers.len(),
            n_heads: h,
            n_tokens: t,
            n_keys,
            stream: if reads.resid_pre { t * dm } else { 0 },
            n_layers: nl,
            first_query,
        };
        let n_codes = reads.sites.len() * reads.layers.len() * h * n_keys;
        let streams = nl * hooks.stream;
        let width = streams + n_codes;
        let out = inf.run_problems(x, width, &hooks)?;
        if !reads.resid_pre {
            return Ok(Readings {
                logits: out.logits,
                codes: out.taken,
                resid_pre: Vec::new(),
            });
        }
        let rows = || out.taken.chunks_exact(width);
        let codes = rows().flat_map(|r| &r[streams..]).copied().collect();
        let resid_pre = (0..nl)
            .map(|l| {
                rows()
                    .flat_map(|r| &r[l * hooks.stream..][..hooks.stream])
                    .copied()
                    .collect()
            })
            .collect();
        Ok(Readings {
            logits: out.logits,
            codes,
            resid_pre,
        })
    }

    /// [`Evaluator::read`] by candle: the forward pass with attention, or the hooked pass when the
    /// streams are read; the codes are gathered on the device, so only they leave it.
    fn read_candle(
        &self,
        x: ArrayView3<'_, f32>,
        reads: &Reads<'_>,
        n_keys: usize,
    ) -> Result<Readings> {
        let cfg = self.config();
        let xt = self.input(x)?;
        let (logits, attention, streams) = if reads.resid_pre {
            let mut names: Vec<String> = (0..cfg.n_layers)
                .map(|l| format!("blocks.{l}.attn.hook_pattern"))
                .collect();
            names.extend((0..cfg.n_layers).map(|l| format!("blocks.{l}.hook_resid_pre")));
            let (logits, cache) = self.model.run_with_cache(&xt, &names)?;
            let get = |n: &str| {
                cache
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, t)| t.clone())
                    .ok_or_else(|| ModelError::Input(format!("no {n} in the cache")))
            };
            let mut attention = Vec::with_capacity(cfg.n_layers);
            let mut streams = Vec::with_capacity(cfg.n_layers);
            for l in 0..cfg.n_layers {
                attention.push(get(&format!("blocks.{l}.attn.hook_pattern"))?);
                streams.push(
                    get(&format!("blocks.{l}.hook_resid_pre"))?
                        .flatten_all()?
                        .to_vec1()?,
                );
            }
            (logits, attention, streams)
        } else {
            let fwd = self.model.forward(&xt, true)?;
            let attention = fwd
                .attention
                .ok_or_else(|| ModelError::Input("the model returned no attention".into()))?;
            (fwd.logits, attention, Vec::new())
        };
        // Per site and layer: [B, 1, H, K] on the device, stacked to [B, S, L', H, K].
        let mut parts = Vec::with_capacity(reads.sites.len() * reads.layers.len());
        for site in reads.sites {
            let keys: Vec<u32> = site.keys.iter().map(|&k| k as u32).collect();
            let keys = Tensor::from_vec(keys, n_keys, self.device())?;
            for &l in reads.layers {
                let a = attention[l].i((.., .., site.query, ..))?.contiguous()?; // [B, H, T]
                parts.push(a.index_select(&keys, 2)?.unsqueeze(1)?);
            }
        }
        let codes = if parts.is_empty() {
            Vec::new()
        } else {
            Tensor::cat(&parts, 1)?.flatten_all()?.to_vec1::<f32>()?
        };
        Ok(Readings {
            logits: logits.flatten_all()?.to_vec1()?,
            codes,
            resid_pre: streams,
        })
    }

    /// The logits and every head's attention pattern (the latent codes of every query-key pair,
    /// `blocks.{l}.attn.hook_pattern`) of every layer.
    ///
    /// # Shapes
    /// `x [B, T, d_in]` -> logits `[B, F, d_out]` and patterns `[B, L, H, T, T]`, row-major.
    ///
    /// # Errors
    /// [`ModelError::Input`] for a batch of another shape; candle errors.
    pub fn patterns(&self, x: ArrayView3<'_, f32>) -> Result<(Vec<f32>, Vec<f32>)> {
        self.check_input(x)?;
        let cfg = self.config();
        let per_layer = cfg.n_heads * cfg.n_tokens * cfg.n_tokens;
        match self.host() {
            Some(inf) => {
                let take = crate::infer::TakeCodes(|l: usize, att: &[f32], row: &mut [f32]| {
                    row[l * per_layer..][..per_layer].copy_from_slice(att);
                });
                let out = inf.run_problems(x, cfg.n_layers * per_layer, &take)?;
                Ok((out.logits, out.taken))
            }
            None => {
                let fwd = self.model.forward(&self.input(x)?, true)?;
                let attention = fwd
                    .attention
                    .ok_or_else(|| ModelError::Input("the model returned no attention".into()))?;
                let layers: Vec<Tensor> = attention
                    .iter()
                    .map(|a| a.unsqueeze(1))
                    .collect::<candle_core::Result<_>>()?;
                let all = Tensor::cat(&layers, 1)?.flatten_all()?.to_vec1()?;
                Ok((fwd.logits.flatten_all()?.to_vec1()?, all))
            }
        }
    }
}
