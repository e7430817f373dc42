//! Streaming activation caches: the activations of selected hook points
//! ([`hyperlens_model::hooks`], TransformerLens names) over a problem set, written to one `.npz`
//! array per hook, batch axis first, with memory bounded by the batch (TransformerLens's
//! `run_with_cache`, for a whole data set).

use std::path::Path;

use candle_core::Tensor;
use hyperlens_io::keys::cache as keys;
use hyperlens_io::sidecars::{CacheSidecar, CacheSource, ProblemsSource};
use hyperlens_model::hooks::{select_hooks, Cache};
use hyperlens_model::{Evaluator, Mixer};
use ndarray::Array3;

use crate::error::{ProbeError, Result};
use crate::npz_stream::{ArrayId, NpyDtype, NpzStream};

/// What [`cache_activations`] caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheParams {
    /// Hook-name patterns (`blocks.*.hook_resid_post`; `*` matches one name part, `**` anything).
    pub hooks: Vec<String>,
    /// Positions kept along each hook's position axis (the query axis of the scores and the
    /// pattern), in this order; `None` keeps every position.
    pub positions: Option<Vec<usize>>,
}

/// What [`cache_activations`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSummary {
    /// Problems cached.
    pub n: usize,
    /// Each array written: the hook's name and its shape (`logits` last).
    pub arrays: Vec<(String, Vec<usize>)>,
}

impl CacheSummary {
    /// The sidecar of a cache of a SRAVEN or fuzzy-logic checkpoint's activations over problems
    /// (`hyperlens cache --out X.npz` writes `X.json`): the arrays written, the checkpoint's path
    /// and mixer, the hooks and positions of `params`, and where the problems came from.
    pub fn problems_sidecar(
        &self,
        checkpoint: &Path,
        params: &CacheParams,
        mixer: Mixer,
        source: ProblemsSource,
    ) -> CacheSidecar<Mixer> {
        self.sidecar(
            checkpoint,
            params,
            None,
            Some(mixer),
            CacheSource::Problems(source),
        )
    }

    /// The sidecar of a cache of a language model's activations on the token ids `tokens`
    /// (`hyperlens cache --tokens / --text`): as [`CacheSummary::problems_sidecar`], with the
    /// checkpoint's kind ([`hyperlens_model::lm::detect`]) instead of a mixer.
    ///
    /// # Errors
    /// [`ProbeError::Model`] when the checkpoint's kind cannot be detected.
    pub fn tokens_sidecar(
        &self,
        checkpoint: &Path,
        params: &CacheParams,
        tokens: &[u32],
    ) -> Result<CacheSidecar<Mixer>> {
        let kind = hyperlens_model::lm::detect(checkpoint)?.to_string();
        let source = CacheSource::Tokens {
            tokens: tokens.to_vec(),
        };
        Ok(self.sidecar(checkpoint, params, Some(kind), None, source))
    }

    /// The sidecar's fields common to both sources.
    fn sidecar(
        &self,
        checkpoint: &Path,
        params: &CacheParams,
        checkpoint_kind: Option<String>,
        mixer: Option<Mixer>,
        source: CacheSource,
    ) -> CacheSidecar<Mixer> {
        CacheSidecar {
            arrays: self.arrays.iter().cloned().collect(),
            checkpoint: checkpoint.display().to_string(),
            checkpoint_kind,
            hooks: params.hooks.clone(),
            mixer,
            positions: params.positions.clone(),
            producer: format!("hyperlens {} cache", env!("CARGO_PKG_VERSION")),
            source,
        }
    }
}

/// The axis of a hook's positions: the query axis (2) of `[B, H, Q, K]` scores and patterns, else
/// axis 1.
pub fn position_axis(hook: &str) -> usize {
    if hook.ends_with("hook_attn_scores") || hook.ends_with("hook_pattern") {
        2
    } else {
        1
    }
}

/// Runs the model of `ev` (its hooked pass, [`Evaluator::run_with_hooks`]) with a cache of the
/// hooks matching `params.hooks` on every batch of `batches` (which must hold `n_problems` inputs
/// in all) and streams the activations to `out` (`.npz`): one float32 array per hook, named by the
/// hook, `[N, ...]` with the positions of `params.positions` along [`position_axis`], plus
/// [`keys::LOGITS`] `[N, F, d_out]`. Empty batches are skipped. `progress(done)` counts the
/// problems cached.
///
/// # Shapes
/// Each batch `[B, T, d_in]` float32, as the model reads it.
///
/// # Errors
/// [`ProbeError::InvalidInput`] for a pattern that matches no hook, an empty or out-of-range
/// position list, batches that do not add up to `n_problems`; [`ProbeError::Model`] for a batch
/// of another shape than the model reads; model and I/O errors. On error no output file is left
/// behind.
pub fn cache_activations<I, P>(
    ev: &Evaluator,
    batches: I,
    n_problems: usize,
    params: &CacheParams,
    out: &Path,
    mut progress: P,
) -> Result<CacheSummary>
where
    I: IntoIterator<Item = Result<Array3<f32>>>,
    P: FnMut(usize),
{
    let cfg = ev.config().clone();
    let names = select_hooks(&cfg, &params.hooks)
        .map_err(|e| ProbeError::InvalidInput(format!("--hooks: {e}")))?;
    if let Some(pos) = &params.positions {
        if pos.is_empty() || pos.iter().any(|&p| p >= cfg.n_tokens) {
            return Err(ProbeError::InvalidInput(format!(
                "--positions {pos:?}: give at least one position below the model's {} tokens",
                cfg.n_tokens
            )));
        }
    }
    if n_problems == 0 {
        return Err(ProbeError::InvalidInput("no problem to cache".into()));
    }
    let index = position_index(params.positions.as_deref(), ev.device())?;
    let mut stream: Option<(NpzStream, Vec<ArrayId>)> = None;
    let mut arrays: Vec<(String, Vec<usize>)> = Vec::new();
    let mut done = 0usize;
    for batch in batches {
        let x = batch?;
        let b = x.dim().0;
        if b == 0 {
            continue;
        }
        if done + b > n_problems {
            return Err(ProbeError::InvalidInput(format!(
                "the batches hold more than the announced {n_problems} problems"
            )));
        }
        let values = cached_batch(ev, &x, &names, index.as_ref())?;
        let (s, ids) = match &mut stream {
            Some(open) => open,
            None => stream.insert(open_stream(out, &values, n_problems, &mut arrays)?),
        };
        for ((_, t), id) in values.iter().zip(ids.iter()) {
            let data: Vec<f32> = t.flatten_all()?.to_vec1()?;
            s.append_f32(*id, &data)?;
        }
        done += b;
        progress(done);
    }
    if done != n_problems {
        return Err(ProbeError::InvalidInput(format!(
            "the batches held {done} problems, not the announced {n_problems}"
        )));
    }
    let Some((s, _)) = stream else {
        return Err(ProbeError::InvalidInput("no problem to cache".into()));
    };
    s.finish()?;
    Ok(CacheSummary { n: done, arrays })
}

/// The positions `positions` as an index tensor on `device` (`None` keeps every position).
fn position_index(
    positions: Option<&[usize]>,
    device: &candle_core::Device,
) -> Result<Option<Tensor>> {
    Ok(positions
        .map(|p| {
            Tensor::from_vec(
                p.iter().map(|&i| i as u32).collect::<Vec<_>>(),
                p.len(),
                device,
            )
        })
        .transpose()?)
}

/// One batch's cached activations of the hooks `names` (in pass order), each cut to the positions
/// of `index` along [`position_axis`], then the logits under [`keys::LOGITS`].
///
/// # Shapes
/// `x [B, T, d_in]`; each activation `[B, ...]`, the logits `[B, F, d_out]`.
fn cached_batch(
    ev: &Evaluator,
    x: &Array3<f32>,
    names: &[String],
    index: Option<&Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let mut cache = Cache::new(names.to_vec());
    let logits = ev.run_with_hooks(&ev.input(x.view())?, &mut cache)?;
    let mut values: Vec<(String, Tensor)> = Vec::with_capacity(cache.values.len() + 1);
    for (name, t) in cache.values {
        let t = match index {
            Some(ix) => t.index_select(ix, position_axis(&name))?,
            None => t,
        };
        values.push((name, t));
    }
    values.push((keys::LOGITS.into(), logits));
    Ok(values)
}

/// Creates the streaming archive `out` with one float32 array per activation of the first batch
/// `values`, its batch axis `n_problems` long, and records each name and shape in `arrays`.
fn open_stream(
    out: &Path,
    values: &[(String, Tensor)],
    n_problems: usize,
    arrays: &mut Vec<(String, Vec<usize>)>,
) -> Result<(NpzStream, Vec<ArrayId>)> {
    let mut s = NpzStream::create(out)?;
    let mut ids = Vec::with_capacity(values.len());
    for (name, t) in values {
        let mut shape = t.dims().to_vec();
        shape[0] = n_problems;
        ids.push(s.add_array(name, NpyDtype::F32, &shape)?);
        arrays.push((name.clone(), shape));
    }
    Ok((s, ids))
}

/// The activations of the hook points matching `params.hooks` of a token language model (GPT-2,
/// Llama or a hyperlens token model; `hyperlens_model::lm`) on one token sequence, written to
/// `out` (`.npz`): one float32 array per hook named by the hook, batch axis first (`[1, ...]`),
/// with the positions of `params.positions` along [`position_axis`], plus [`keys::LOGITS`]
/// `[1, T, V]` and [`keys::TOKENS`] int64 `[T]` (TransformerLens `run_with_cache` on one prompt).
///
/// # Errors
/// [`ProbeError::InvalidInput`] for a pattern that matches no hook, an empty or out-of-range
/// position list; model errors (bad token ids, a sequence longer than the model's context); I/O
/// errors. On error no output file is left behind.
pub fn cache_lm_activations(
    model: &hyperlens_model::lm::LanguageModel,
    tokens: &[u32],
    params: &CacheParams,
    out: &Path,
) -> Result<CacheSummary> {
    let names = model
        .select_hooks(&params.hooks)
        .map_err(|e| ProbeError::InvalidInput(format!("--hooks: {e}")))?;
    let t = tokens.len();
    if let Some(pos) = &params.positions {
        if pos.is_empty() || pos.iter().any(|&p| p >= t) {
            return Err(ProbeError::InvalidInput(format!(
                "--positions {pos:?}: give at least one position below the {t} tokens"
            )));
        }
    }
    let device = model.device().clone();
    let x = Tensor::from_vec(tokens.to_vec(), (1, t), &device)?;
    let mut cache = Cache::new(names);
    let logits = model.run_with_hooks(&x, &mut cache)?;
    let mut values = cache.values;
    values.push((keys::LOGITS.into(), logits));
    let index = position_index(params.positions.as_deref(), &device)?;
    let mut arrays = Vec::with_capacity(values.len() + 1);
    let mut host = Vec::with_capacity(values.len());
    for (name, v) in values {
        let v = match &index {
            Some(ix) if name != keys::LOGITS => v.index_select(ix, position_axis(&name))?,
            _ => v,
        };
        let shape = v.dims().to_vec();
        let data: Vec<f32> = v.flatten_all()?.to_vec1()?;
        let a = ndarray::ArrayD::from_shape_vec(shape.clone(), data)
            .map_err(|e| ProbeError::InvalidInput(format!("{name}: {e}")))?;
        arrays.push((name.clone(), shape));
        host.push((name, a));
    }
    let ids = ndarray::Array1::from_iter(tokens.iter().map(|&v| i64::from(v)));
    arrays.push((keys::TOKENS.into(), vec![t]));
    hyperlens_io::write_npz(out, |z| -> Result<()> {
        for (name, a) in &host {
            z.add(name, a)?;
        }
        z.add(keys::TOKENS, &ids)?;
        Ok(())
    })?;
    Ok(CacheSummary { n: 1, arrays })
}
