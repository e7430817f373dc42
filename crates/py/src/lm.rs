//! `hyperlens.LanguageModel`'s engine: a token language model (a hyperlens token model, a Hugging
//! Face GPT-2 or Llama directory, a Llama-family `.gguf` file) with logits, attention patterns and
//! the hooked pass with TransformerLens 3.x names, on token ids; and its tokenizer
//! (`hyperlens_model::lm::LmTokenizer`, loaded on first use) for text in and out.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::OnceLock;

use candle_core::Tensor;
use hyperlens_model::lm::{load, load_tokenizer, LanguageModel, LmTokenizer};
use hyperlens_model::ModelError;
use ndarray::{ArrayView1, ArrayView2};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::arrays::{out, shape_error, In1, In2};
use crate::errors::{detached, raise, to_py, Kind};
use crate::model::{cache_arrays, cache_out, tensor_array, PyHooks};
use hyperlens_model::lm::{CodeForm, CodeRequest};

/// One loaded token language model.
#[pyclass(name = "LanguageModel", module = "hyperlens._core", frozen)]
pub struct PyLanguageModel {
    lm: LanguageModel,
    device: candle_core::Device,
    path: PathBuf,
    tokenizer: OnceLock<LmTokenizer>,
}

impl PyLanguageModel {
    /// The model.
    pub(crate) fn lm(&self) -> &LanguageModel {
        &self.lm
    }

    /// The token ids as a u32 tensor on the model's device, checked: `[B >= 1, 1..=n_ctx]`, ids
    /// below the vocabulary size.
    fn tokens(&self, t: &ArrayView2<'_, i64>) -> PyResult<Tensor> {
        let (b, n) = t.dim();
        let (v, ctx) = (self.lm.vocab_size(), self.lm.max_seq_len());
        if b == 0 || n == 0 || n > ctx {
            return Err(shape_error(
                "tokens",
                &format!("[B >= 1, 1..={ctx}] (integer ids)"),
                t.shape(),
            ));
        }
        if let Some(bad) = t.iter().find(|&&id| id < 0 || id >= v as i64) {
            return Err(raise(
                Kind::Input,
                format!(
                    "`tokens` holds the id {bad}, outside the vocabulary 0..{}",
                    v - 1
                ),
            ));
        }
        let data: Vec<u32> = t.iter().map(|&id| id as u32).collect();
        Tensor::from_vec(data, (b, n), &self.device).map_err(to_py)
    }

    /// The model's tokenizer, read on first use; `InputError` (one line) when it has none.
    fn tok(&self) -> PyResult<&LmTokenizer> {
        if let Some(t) = self.tokenizer.get() {
            return Ok(t);
        }
        let t = load_tokenizer(&self.path).map_err(to_py)?.ok_or_else(|| {
            to_py(hyperlens_model::lm::no_tokenizer_error(
                &hyperlens_model::lm::missing_tokenizer(&self.path),
            ))
        })?;
        Ok(self.tokenizer.get_or_init(|| t))
    }

    /// Token ids given by Python (int64) as u32, checked non-negative.
    fn ids(t: &ArrayView1<'_, i64>) -> PyResult<Vec<u32>> {
        t.iter()
            .map(|&id| {
                u32::try_from(id).map_err(|_| {
                    raise(
                        Kind::Input,
                        format!("`tokens` holds the id {id}, outside the vocabulary"),
                    )
                })
            })
            .collect()
    }

    /// `InputError` naming the first of `names` that is not a hook point.
    fn check_names<'a>(&self, names: impl IntoIterator<Item = &'a String>) -> PyResult<()> {
        let known = self.lm.hook_names();
        for n in names {
            if !known.contains(n) {
                return Err(raise(
                    Kind::Input,
                    format!("`{n}` is not a hook point of this model (see hook_names())"),
                ));
            }
        }
        Ok(())
    }
}

#[pymethods]
impl PyLanguageModel {
    /// Loads a token model directory, a Hugging Face GPT-2 / Llama directory or a `.gguf` file.
    #[staticmethod]
    #[pyo3(signature = (path, device = "cpu"))]
    fn load(py: Python<'_>, path: PathBuf, device: &str) -> PyResult<PyLanguageModel> {
        let device = hyperlens_model::Device::from_str(device).map_err(to_py)?;
        if !path.exists() {
            return Err(raise(
                Kind::NotFound,
                format!("{}: no such file or directory", path.display()),
            ));
        }
        detached(py, || {
            let dev = device.to_candle().map_err(to_py)?;
            let lm = load(&path, &dev).map_err(to_py)?;
            Ok(PyLanguageModel {
                lm,
                device: dev,
                path: path.clone(),
                tokenizer: OnceLock::new(),
            })
        })
    }

    /// The model's kind and sizes.
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let kind = match &self.lm {
            LanguageModel::Token(_) => "token",
            LanguageModel::Llama(_) => "llama",
            LanguageModel::Gpt2(_) => "gpt2",
        };
        d.set_item("kind", kind)?;
        d.set_item("n_layers", self.lm.n_layers())?;
        d.set_item("n_heads", self.lm.n_heads())?;
        d.set_item("d_vocab", self.lm.vocab_size())?;
        d.set_item("n_ctx", self.lm.max_seq_len())?;
        Ok(d)
    }

    /// The texts as token ids int64 [N, T], right-padded with the pad id, and the lengths int64
    /// [N] (`LmTokenizer::encode_batch`; `prepend_bos` None = Hugging Face's default).
    #[pyo3(signature = (texts, prepend_bos = None))]
    fn to_tokens<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        prepend_bos: Option<bool>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let tok = self.tok()?;
        let (ids, lengths) = detached(py, || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            tok.encode_batch(&refs, prepend_bos).map_err(to_py)
        })?;
        let lengths = ndarray::Array1::from_iter(lengths.into_iter().map(|n| n as i64));
        Ok((out(py, ids.mapv(i64::from)), out(py, lengths)))
    }

    /// Each id decoded alone (`LmTokenizer::str_tokens`, TransformerLens's `to_str_tokens`).
    fn to_str_tokens(&self, tokens: In1<'_, i64>) -> PyResult<Vec<String>> {
        let ids = Self::ids(&tokens.as_array())?;
        self.tok()?.str_tokens(&ids).map_err(to_py)
    }

    /// The ids decoded to one text (`LmTokenizer::decode`).
    fn to_string(&self, tokens: In1<'_, i64>) -> PyResult<String> {
        let ids = Self::ids(&tokens.as_array())?;
        self.tok()?.decode(&ids).map_err(to_py)
    }

    /// Where the tokenizer came from; `None` when the model has none.
    fn tokenizer_source(&self) -> PyResult<Option<String>> {
        if let Some(t) = self.tokenizer.get() {
            return Ok(Some(t.source()));
        }
        Ok(load_tokenizer(&self.path)
            .map_err(to_py)?
            .map(|t| self.tokenizer.get_or_init(|| t).source()))
    }

    /// The tokenizer's BOS id (None if it has none), the pad id, and whether Hugging Face's
    /// default adds the BOS.
    fn special_ids(&self) -> PyResult<(Option<u32>, u32, bool)> {
        let t = self.tok()?;
        Ok((t.bos_id(), t.pad_id(), t.adds_bos_by_default()))
    }

    /// The single-token words of the vocabulary (`LmTokenizer::single_token_words`).
    #[pyo3(signature = (min_len = 1))]
    fn single_token_words(&self, py: Python<'_>, min_len: usize) -> PyResult<Vec<String>> {
        let t = self.tok()?;
        detached(py, || Ok(t.single_token_words(min_len)))
    }

    /// Every hook point's TransformerLens name, in pass order.
    fn hook_names(&self) -> Vec<String> {
        self.lm.hook_names()
    }

    /// The hook points matching any of `patterns`.
    fn select_hooks(&self, patterns: Vec<String>) -> PyResult<Vec<String>> {
        self.lm.select_hooks(&patterns).map_err(to_py)
    }

    /// The next-token logits, float32 [B, T, V].
    fn logits<'py>(&self, py: Python<'py>, tokens: In2<'py, i64>) -> PyResult<Bound<'py, PyAny>> {
        let t = self.tokens(&tokens.as_array())?;
        let l = detached(py, || {
            let o = self.lm.forward(&t, false).map_err(to_py)?;
            tensor_array(&o.logits).map_err(to_py)
        })?;
        Ok(out(py, l))
    }

    /// The logits [B, T, V] and every head's attention pattern float32 [B, L, H, T, T].
    fn patterns<'py>(
        &self,
        py: Python<'py>,
        tokens: In2<'py, i64>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let t = self.tokens(&tokens.as_array())?;
        let (l, p) = detached(py, || {
            let run = || -> Result<_, ModelError> {
                let o = self.lm.forward(&t, true)?;
                let pats = o
                    .patterns
                    .ok_or_else(|| ModelError::Input("the model returned no patterns".into()))?;
                let stacked = Tensor::stack(&pats, 1)?;
                Ok((tensor_array(&o.logits)?, tensor_array(&stacked)?))
            };
            run().map_err(to_py)
        })?;
        Ok((out(py, l), out(py, p)))
    }

    /// The hooked pass keeping the activations `names` (exact hook names).
    fn run_with_cache<'py>(
        &self,
        py: Python<'py>,
        tokens: In2<'py, i64>,
        names: Vec<String>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyList>)> {
        let t = self.tokens(&tokens.as_array())?;
        self.check_names(&names)?;
        let (logits, acts) = detached(py, || {
            let run = || -> Result<_, ModelError> {
                let (logits, cache) = self.lm.run_with_cache(&t, &names)?;
                cache_arrays(&logits, &cache)
            };
            run().map_err(to_py)
        })?;
        cache_out(py, logits, acts)
    }

    /// The hooked pass with Python hooks (as `Evaluator.run_with_hooks`); returns the logits.
    fn run_with_hooks<'py>(
        &self,
        py: Python<'py>,
        tokens: In2<'py, i64>,
        hooks: Vec<(String, Py<PyAny>)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = self.tokens(&tokens.as_array())?;
        self.check_names(hooks.iter().map(|(n, _)| n))?;
        let logits = detached(py, || {
            let mut ph = PyHooks {
                hooks: &hooks,
                error: None,
            };
            let res = self.lm.run_with_hooks(&t, &mut ph);
            if let Some(e) = ph.error {
                return Err(e);
            }
            tensor_array(&res.map_err(to_py)?).map_err(to_py)
        })?;
        Ok(out(py, logits))
    }

    // ---- issue 47: the latent-code lens (`LanguageModel::latent_codes`) ----

    /// The codes float32 `[N, L, H, Q, K]` of the (query, key) pairs of each row, with the logits
    /// after each row's last token `[N, V]` and the residual stream at the queries
    /// `[N, L, Q, D]` when asked (`hyperlens_model::lm::LanguageModel::latent_codes`); `tokens`
    /// int `[N, T]` of which row `i` is `lengths[i]` long (all `T` without `lengths`), `query`
    /// int `[N, Q]`, `keys` int `[N, K]`.
    #[pyo3(signature = (tokens, query, keys, form, layers, lengths, return_logits, return_resid))]
    #[allow(clippy::too_many_arguments)]
    fn latent_codes<'py>(
        &self,
        py: Python<'py>,
        tokens: In2<'py, i64>,
        query: In2<'py, i64>,
        keys: In2<'py, i64>,
        form: &str,
        layers: Option<Vec<usize>>,
        lengths: Option<In1<'py, i64>>,
        return_logits: bool,
        return_resid: bool,
    ) -> LensOut<'py> {
        let form = CodeForm::from_str(form).map_err(to_py)?;
        let t = tokens.as_array();
        let (n, width) = t.dim();
        let lens: Vec<i64> = match &lengths {
            Some(l) => l.as_array().to_vec(),
            None => vec![width as i64; n],
        };
        if lens.len() != n {
            return Err(shape_error("lengths", &format!("[{n}]"), &[lens.len()]));
        }
        let mut seqs = Vec::with_capacity(n);
        for (i, (row, &len)) in t.outer_iter().zip(&lens).enumerate() {
            if len < 0 || len as usize > width {
                return Err(raise(
                    Kind::Input,
                    format!("`lengths[{i}]` is {len}, outside 0..={width} (the tokens' width)"),
                ));
            }
            let row = row.slice(ndarray::s![..len as usize]);
            if let Some(&bad) = row.iter().find(|&&id| id < 0 || id > i64::from(u32::MAX)) {
                return Err(raise(
                    Kind::Input,
                    format!("`tokens` row {i} holds the id {bad}, not a token id"),
                ));
            }
            seqs.push(row.iter().map(|&id| id as u32).collect::<Vec<u32>>());
        }
        let positions = |a: &ArrayView2<'_, i64>, name: &str| -> PyResult<Vec<Vec<usize>>> {
            if a.nrows() != n {
                return Err(shape_error(name, &format!("[{n}, _]"), a.shape()));
            }
            if let Some(&bad) = a.iter().find(|&&p| p < 0) {
                return Err(raise(
                    Kind::Input,
                    format!("`{name}` holds the position {bad}; positions are >= 0"),
                ));
            }
            Ok(a.outer_iter()
                .map(|r| r.iter().map(|&p| p as usize).collect())
                .collect())
        };
        let query = positions(&query.as_array(), "query")?;
        let keys = positions(&keys.as_array(), "keys")?;
        let batch = detached(py, || {
            let req = CodeRequest {
                tokens: &seqs,
                query: &query,
                keys: &keys,
                layers: layers.as_deref(),
                form,
                last_logits: return_logits,
                resid: return_resid,
                first_index: 0,
            };
            self.lm.latent_codes(&req).map_err(to_py)
        })?;
        Ok((
            out(py, batch.codes),
            batch.last_logits.map(|a| out(py, a)),
            batch.resid.map(|a| out(py, a)),
        ))
    }

    /// Streams the codes of every prompt of `prompts` at `sites` to `out` (`.npz` + `codes.json`;
    /// `hyperlens_probe::extract_prompts`); returns `(n_prompts, n_answered, accuracy)`.
    /// `on_progress(done, total)` after each batch; Ctrl-C stops it and leaves no file.
    #[pyo3(signature = (prompts, sites, out, layers, form, batch, prepend_bos, label, resid, shuffle_weights, on_progress))]
    #[allow(clippy::too_many_arguments)]
    fn probe(
        &self,
        py: Python<'_>,
        prompts: &crate::prompts::PyPromptSet,
        sites: &str,
        out: PathBuf,
        layers: Option<Vec<usize>>,
        form: &str,
        batch: usize,
        prepend_bos: Option<bool>,
        label: Option<String>,
        resid: bool,
        shuffle_weights: Option<u64>,
        on_progress: Option<Py<PyAny>>,
    ) -> PyResult<(usize, usize, Option<f64>)> {
        let params = hyperlens_probe::PromptProbeParams {
            sites: sites.parse().map_err(to_py)?,
            layers,
            form: form.parse().map_err(to_py)?,
            batch,
            prepend_bos,
            label_factor: label,
            resid,
            shuffle_weights,
        };
        let tok = self.tok()?;
        let sources = hyperlens_probe::PromptProbeSources {
            model: self.path.display().to_string(),
            model_kind: hyperlens_model::lm::detect(&self.path)
                .map_err(to_py)?
                .to_string(),
            prompts: prompts.set().origin.clone(),
        };
        let s = detached(py, || {
            let mut on = crate::errors::Callback::new(on_progress.as_ref());
            let r = hyperlens_probe::extract_prompts(
                &self.lm,
                tok,
                prompts.set(),
                &params,
                &sources,
                &out,
                |done, total| on.step(|py, f| f.call1(py, (done, total)).map(drop)),
            );
            on.finish(r)
        })?;
        Ok((s.n_prompts, s.n_answered, s.accuracy))
    }
}

/// What `latent_codes` returns to Python: the codes, the logits and the residual stream (`None`
/// when not asked).
type LensOut<'py> = PyResult<(
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
)>;

/// Registers the class.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLanguageModel>()?;
    m.add_function(wrap_pyfunction!(language_model_kind, m)?)
}

/// The kind of the token language model at `path` (`hyperlens-token`, `gpt2`, `llama`, `gguf`),
/// as `hyperlens_model::lm::detect` tells it; `None` when `path` is not one (a SRAVEN or
/// fuzzy-logic checkpoint, or nothing that loads): what `hyperlens.load` dispatches on.
#[pyfunction]
fn language_model_kind(path: PathBuf) -> Option<String> {
    hyperlens_model::lm::detect(&path)
        .ok()
        .map(|k| k.to_string())
}
