//! Interventions on one site's latent codes: the state a block's passes start from
//! ([`Evaluator::block_start`]) and the passes with the codes of one query replaced there
//! ([`Evaluator::run_with_site_codes`]), which the transplant test runs several times per problem
//! and layer.

use candle_core::Tensor;

use super::{CodeSite, Evaluator};
use crate::error::{ModelError, Result};
use crate::hooks::HookFn;
use crate::infer::{BlockState, InferenceHooks, Start};

/// Where the passes of [`Evaluator::run_with_site_codes`] start: one block's state for a batch of
/// problems. On the CPU the host engine's [`BlockState`] (the block's Q, K and V and the streams
/// entering and leaving it, so that a pass computes the block for the site's query alone);
/// elsewhere the stream entering the block.
///
/// # Shapes
/// Streams `[B, T, D]`.
#[derive(Debug, Clone)]
pub struct BlockStart {
    layer: usize,
    batch: usize,
    inner: Inner,
}

#[derive(Debug, Clone)]
enum Inner {
    Host(BlockState),
    Stream(Vec<f32>),
}

impl BlockStart {
    /// The block.
    pub fn layer(&self) -> usize {
        self.layer
    }

    /// Problems in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    pub(super) fn host_state(&self) -> Option<&BlockState> {
        match &self.inner {
            Inner::Host(s) => Some(s),
            Inner::Stream(_) => None,
        }
    }
}

/// Replaces `pattern[b, :, query, keys[j]]` by `codes[b, :, j]` at one block (the hooked pass).
struct WriteCodes<'a> {
    name: String,
    site: &'a CodeSite,
    /// `[B, H, K]`.
    codes: &'a Tensor,
}

impl HookFn for WriteCodes<'_> {
    fn wants(&self, name: &str) -> bool {
        name == self.name
    }

    fn call(&mut self, _: &str, p: &Tensor) -> Result<Option<Tensor>> {
        let (b, h, t, _) = p.dims4()?;
        let dev = p.device();
        let (q, keys) = (self.site.query, &self.site.keys);
        // mask [1, 1, T, T]: 1 at (q, k) for the site's keys; fill [B, H, T, T]: the codes there.
        let mut m = vec![0f32; t * t];
        for &k in keys {
            m[q * t + k] = 1.0;
        }
        let mask = Tensor::from_vec(m, (1, 1, t, t), dev)?;
        let codes: Vec<f32> = self.codes.flatten_all()?.to_vec1()?;
        let nk = keys.len();
        let mut fill = vec![0f32; b * h * t * t];
        for bi in 0..b {
            for hi in 0..h {
                for (j, &k) in keys.iter().enumerate() {
                    fill[((bi * h + hi) * t + q) * t + k] = codes[(bi * h + hi) * nk + j];
                }
            }
        }
        let fill = Tensor::from_vec(fill, (b, h, t, t), dev)?;
        let keep = (1.0 - &mask)?;
        Ok(Some((p.broadcast_mul(&keep)? + fill)?))
    }
}

/// The host engine's hook of [`Evaluator::run_with_site_codes`]: writes `codes [P, H, K]` at the
/// site of block `layer`.
struct WriteSite<'a> {
    layer: usize,
    site: &'a CodeSite,
    n_heads: usize,
    n_tokens: usize,
    codes: &'a [f32],
}

impl InferenceHooks for WriteSite<'_> {
    fn pattern(&self, layer: usize, problem: usize, codes: &mut [f32], _: &mut [f32]) {
        if layer != self.layer {
            return;
        }
        let (h, t, nk) = (self.n_heads, self.n_tokens, self.site.keys.len());
        for hh in 0..h {
            for (j, &k) in self.site.keys.iter().enumerate() {
                codes[(hh * t + self.site.query) * t + k] = self.codes[(problem * h + hh) * nk + j];
            }
        }
    }

    fn last_block_from_query(&self) -> usize {
        self.site.query
    }
}

impl Evaluator {
    /// The start of interventions at block `layer` for a batch whose streams entering it are
    /// `resid_pre` (`blocks.{layer}.hook_resid_pre` of a plain pass, [`Evaluator::read`]).
    ///
    /// # Shapes
    /// `resid_pre [B, T, D]` row-major, `B = batch`.
    ///
    /// # Errors
    /// [`ModelError::Input`] if `resid_pre` does not hold `batch` streams of the model's shape,
    /// `batch` is 0 or `layer` is past the last block.
    pub fn block_start(&self, resid_pre: &[f32], batch: usize, layer: usize) -> Result<BlockStart> {
        let cfg = self.config();
        let per = cfg.n_tokens * cfg.d_model;
        let inner = match self.host() {
            Some(inf) => Inner::Host(inf.block_state(resid_pre, batch, layer)?),
            None => {
                if batch == 0 || resid_pre.len() != batch * per || layer >= cfg.n_layers {
                    return Err(ModelError::Input(format!(
                        "a block start of {} floats for {batch} problems at block {layer}: give 1 or more streams [T {}, D {}] and a block below {}",
                        resid_pre.len(),
                        cfg.n_tokens,
                        cfg.d_model,
                        cfg.n_layers
                    )));
                }
                Inner::Stream(resid_pre.to_vec())
            }
        };
        Ok(BlockStart {
            layer,
            batch,
            inner,
        })
    }

    /// The logits of the passes of `problems` (indices into the start's batch, repeats allowed)
    /// from `start`, with the latent codes of `site` at the start's block replaced by `codes`
    /// (TransformerLens's `hook_pattern` replaced at one query and its keys). Without a change
    /// (`codes` equal to the pass's own) the logits are the plain pass's, bit for bit.
    ///
    /// # Shapes
    /// `problems [P]`, `codes [P, H, K]` for the site's `K` keys -> logits `[P, F, d_out]`.
    ///
    /// # Errors
    /// [`ModelError::Input`] for no problem, a problem outside the batch, a site outside the
    /// sequence, `codes` of another length, or a start made by another evaluator; candle errors.
    pub fn run_with_site_codes(
        &self,
        start: &BlockStart,
        problems: &[usize],
        site: &CodeSite,
        codes: &[f32],
    ) -> Result<Vec<f32>> {
        let cfg = self.config();
        let (t, h, dm) = (cfg.n_tokens, cfg.n_heads, cfg.d_model);
        let p = problems.len();
        if p == 0
            || problems.iter().any(|&i| i >= start.batch)
            || site.query >= t
            || site.keys.is_empty()
            || site.keys.iter().any(|&k| k >= t)
            || codes.len() != p * h * site.keys.len()
        {
            return Err(ModelError::Input(format!(
                "{p} problems (of a batch of {}) with {} codes at query {} keys {:?}: give problems in the batch, positions below {t} and [P, H {h}, K] codes",
                start.batch,
                codes.len(),
                site.query,
                site.keys
            )));
        }
        if let Some((inf, state)) = self.host_state(start) {
            let hooks = WriteSite {
                layer: start.layer,
                site,
                n_heads: h,
                n_tokens: t,
                codes,
            };
            let from = Start::Query {
                state,
                problems,
                query: site.query,
            };
            return Ok(inf.run_hooked(from, p, 0, &hooks)?.logits);
        }
        let Inner::Stream(stream) = &start.inner else {
            return Err(ModelError::Input(
                "a block start made by an evaluator on another device".into(),
            ));
        };
        let per = t * dm;
        let rows: Vec<f32> = problems
            .iter()
            .flat_map(|&i| stream[i * per..][..per].iter().copied())
            .collect();
        let dev = self.device();
        let resid = Tensor::from_vec(rows, (p, t, dm), dev)?;
        let codes = Tensor::from_vec(codes.to_vec(), (p, h, site.keys.len()), dev)?;
        let mut hook = WriteCodes {
            name: format!("blocks.{}.attn.hook_pattern", start.layer),
            site,
            codes: &codes,
        };
        let logits = self
            .model
            .run_with_hooks_from(&resid, start.layer, &mut hook)?;
        Ok(logits.flatten_all()?.to_vec1()?)
    }
}
