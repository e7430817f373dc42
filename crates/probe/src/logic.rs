//! Streaming extraction of the latent codes of a fuzzy-logic model with the task's terms as labels.
//!
//! The paper's site for this task is the last token's attention to itself: the query and the key
//! are both the last position, whose target the model predicts, so each problem gives an `[L, H]`
//! code (Schug et al. 2025, the fuzzy-logic experiments; `docs/spec/sraven.md`, "The fuzzy-logic
//! task"). Any query and keys may be chosen instead. The labels are the task's terms: the bits
//! `terms [K, L]` (1: the variable, 0: its negation) and the term indices `term_ids [K]`. As for
//! SRAVEN ([`crate::extract()`]), the model runs once per batch with attention capture, only the
//! selected codes travel to the host, and memory is bounded by the batch.

use std::ops::ControlFlow;
use std::path::Path;

use hyperlens_io::keys::codes as keys;
use hyperlens_model::{CodeSite, Config, Evaluator};
use hyperlens_tasks::logic::{
    logic_chunks, LogicBatch, LogicInputs, LogicSet, LogicSplit, LOGIC_SET_CHUNK,
};

use crate::error::{ProbeError, Result};
use crate::extract::{ProbeMeta, SelectionMeta};
use crate::logic_rows::{logic_code_rows, LogicRows};
use crate::npz_stream::{NpyDtype, NpzStream};

/// What [`extract_logic`] reports.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicProbeSummary {
    /// Rows written (one per problem).
    pub n_rows: usize,
    /// Mean squared error of the model's prediction of the last token's target.
    pub mse: f64,
}

/// A generated logic probe set: `n` sequences of `set` from the evaluation stream `seed` of
/// `split`, drawn in chunks of [`LOGIC_SET_CHUNK`] (the sequences `tasks sample --task logic`
/// writes), with part of every sequence held fixed as `inputs` says (the paper's fixed-query and
/// fixed-context sets; [`LogicInputs`]).
#[derive(Debug, Clone, Copy)]
pub struct GeneratedLogicSet<'a> {
    /// The split (its seed and the task's terms).
    pub split: &'a LogicSplit,
    /// Which tasks: the training tasks, held-out pairs of known terms, or pairs of unknown terms.
    pub set: LogicSet,
    /// Sequences.
    pub n: usize,
    /// Seed of the evaluation stream.
    pub seed: u64,
    /// The inputs: uniform, one query for every sequence, or one context.
    pub inputs: &'a LogicInputs,
}

/// [`extract_logic`] on a generated set: fills the sidecar's `problems`, `split`, `set` (`id`,
/// `ood`, `unknown`) and `seed`, and draws the set lazily (memory bounded by the chunk and the
/// batch).
///
/// # Errors
/// [`ProbeError::InvalidInput`] for `n = 0`, a set without tasks in the split, or a fixed query of
/// the wrong length; the errors of [`extract_logic`].
#[allow(clippy::too_many_arguments)]
pub fn extract_logic_set<P: FnMut(usize) -> ControlFlow<()>>(
    ev: &Evaluator,
    source: GeneratedLogicSet<'_>,
    batch: usize,
    layers: &[usize],
    site: &CodeSite,
    out: &Path,
    mut meta: ProbeMeta,
    progress: P,
) -> Result<LogicProbeSummary> {
    let GeneratedLogicSet {
        split,
        set,
        n,
        seed,
        inputs,
    } = source;
    let name = set.name();
    if n == 0 {
        return Err(ProbeError::InvalidInput("--n must be positive".into()));
    }
    if split.tasks(set).is_empty() {
        return Err(ProbeError::InvalidInput(format!(
            "--set {name}: the split has no tasks in this set"
        )));
    }
    meta.problems = describe_inputs("generated", inputs, seed);
    meta.split = Some(split.name());
    meta.set = Some(set);
    meta.seed = Some(seed);
    let chunks = logic_chunks(split, set, n, LOGIC_SET_CHUNK, seed).map(|c| {
        let mut c = c.map_err(|e| ProbeError::InvalidInput(format!("--set {name}: {e}")))?;
        inputs.apply(&mut c).map_err(|e| {
            ProbeError::InvalidInput(format!("--{}: {e}", inputs.name().replace('_', "-")))
        })?;
        Ok(c)
    });
    extract_logic(ev, chunks, n, batch, layers, site, out, meta, progress)
}

/// The sidecar's `problems` of a logic set from `source` (a file or `generated`) with `inputs` of
/// seed `seed`: the source, then the fixed query or context, if any.
pub fn describe_inputs(source: &str, inputs: &LogicInputs, seed: u64) -> String {
    match inputs {
        LogicInputs::Uniform => source.to_string(),
        LogicInputs::FixedQuery(q) => {
            format!("{source}, with the fixed query {q:?} of seed {seed}")
        }
        LogicInputs::FixedContext(c) => format!(
            "{source}, with the fixed context of seed {seed} ({} tokens)",
            c.nrows()
        ),
    }
}

/// Extracts the codes of the logic model of `ev` at `site` for the layers `layers` over `batches` (which
/// must yield `n_problems` sequences in total), running the model on at most `batch` sequences at
/// a time, and writes them to `out` (`.npz`) with the sidecar `meta` completed beside it.
///
/// Arrays written (one row per sequence): `codes` f32 `[N, L, H, 1, K]` (layers selected, heads,
/// the query, the keys), `terms` i64 `[N, Kt, Lv]` (the task's terms as bits), `term_ids` i64
/// `[N, Kt]`, `target` f32 `[N]` (the last token's target), `prediction` f32 `[N]` (the model's),
/// `problem` i64 `[N]`. `progress(done)` after each chunk of `batches`; its `ControlFlow::Break`
/// stops the extraction.
///
/// # Shapes
/// Each batch: `x [B, T, Lv + 1]`, `y [B]`, `terms [B, Kt, Lv]`, `term_ids [B, Kt]`.
///
/// # Errors
/// [`ProbeError::InvalidInput`] for an empty, repeated or out-of-range layer list, a site outside
/// the sequence, a zero `batch`, batches that do not fit the model or do not add up to
/// `n_problems`; candle and I/O errors; [`ProbeError::Interrupted`] when `progress` breaks. On
/// error no output file is left behind.
#[allow(clippy::too_many_arguments)]
pub fn extract_logic<I, P>(
    ev: &Evaluator,
    batches: I,
    n_problems: usize,
    batch: usize,
    layers: &[usize],
    site: &CodeSite,
    out: &Path,
    mut meta: ProbeMeta,
    mut progress: P,
) -> Result<LogicProbeSummary>
where
    I: IntoIterator<Item = Result<LogicBatch>>,
    P: FnMut(usize) -> ControlFlow<()>,
{
    let cfg = ev.config().clone();
    let layers = crate::ProbeParams {
        site: crate::Site::Paper,
        layers: Some(layers.to_vec()),
    }
    .check(cfg.n_layers)?;
    if batch == 0 {
        return Err(ProbeError::InvalidInput("--batch must be positive".into()));
    }
    check_site(site, cfg.n_tokens)?;
    let mut writer: Option<LogicCodeWriter> = None;
    let mut done = 0usize;
    let mut se = 0f64;
    for chunk in batches {
        let chunk = chunk?;
        let b = chunk.x.dim().0;
        if b == 0 {
            continue;
        }
        check_fits(&chunk, &cfg)?;
        if done + b > n_problems {
            return Err(ProbeError::InvalidInput(format!(
                "the batches hold more than the announced {n_problems} sequences"
            )));
        }
        let w = match &mut writer {
            Some(w) => w,
            None => writer.insert(LogicCodeWriter::create(
                out,
                n_problems,
                [layers.len(), cfg.n_heads, site.keys.len()],
                &chunk,
            )?),
        };
        let mut start = 0;
        while start < b {
            let end = (start + batch).min(b);
            let rows = logic_code_rows(ev, &chunk, start..end, &layers, site, done)?;
            se += w.append(&rows, chunk.terms.dim())?;
            start = end;
        }
        done += b;
        if progress(done).is_break() {
            return Err(ProbeError::Interrupted);
        }
    }
    let Some(writer) = writer else {
        return Err(ProbeError::InvalidInput(
            "no sequences to probe (an empty set)".into(),
        ));
    };
    if done != n_problems {
        return Err(ProbeError::InvalidInput(format!(
            "the batches held {done} sequences, {n_problems} were announced"
        )));
    }
    complete_meta(&mut meta, site, layers, &cfg, writer.shapes());
    writer.stream.finish()?;
    hyperlens_io::write_sidecar(out, &meta)?;
    Ok(LogicProbeSummary {
        n_rows: n_problems,
        mse: se / n_problems.max(1) as f64,
    })
}

/// Checks that `site` lies inside a sequence of `t` tokens and has a key.
///
/// # Errors
/// [`ProbeError::InvalidInput`] naming the positions.
pub(crate) fn check_site(site: &CodeSite, t: usize) -> Result<()> {
    if site.keys.is_empty() || site.query >= t || site.keys.iter().any(|&k| k >= t) {
        return Err(ProbeError::InvalidInput(format!(
            "site query {} keys {:?}: positions must be below the model's {t} tokens, with at \
             least one key",
            site.query, site.keys
        )));
    }
    Ok(())
}

/// Checks that a batch fits the model: `x [B, T, d_in]`, `y [B]`, terms `[B, Kt, Lv]` and
/// `term_ids [B, Kt]`, and a model with a scalar output.
///
/// # Errors
/// [`ProbeError::InvalidInput`] naming the shapes.
pub(crate) fn check_fits(chunk: &LogicBatch, cfg: &Config) -> Result<()> {
    let (b, ct, d) = chunk.x.dim();
    let kt = chunk.terms.dim().1;
    if ct != cfg.n_tokens
        || d != cfg.d_in
        || chunk.y.len() != b
        || chunk.terms.dim().0 != b
        || chunk.term_ids.dim() != (b, kt)
        || cfg.d_out != 1
    {
        return Err(ProbeError::InvalidInput(format!(
            "logic batch x {:?}, y [{}], terms {:?} does not fit the model (T {}, input {}, \
             output {})",
            chunk.x.shape(),
            chunk.y.len(),
            chunk.terms.shape(),
            cfg.n_tokens,
            cfg.d_in,
            cfg.d_out
        )));
    }
    Ok(())
}

/// The streamed `.npz` of logic codes: its arrays in the order `codes`, `terms`, `term_ids`,
/// `target`, `prediction`, `problem`, sized from the first batch's terms `[Kt, Lv]`.
struct LogicCodeWriter {
    stream: NpzStream,
    ids: [crate::npz_stream::ArrayId; 6],
    n: usize,
    terms: (usize, usize),
    codes_shape: Vec<usize>,
}

impl LogicCodeWriter {
    /// Creates `out` for `n` sequences with codes `[N, L', H, 1, K]` from `[L', H, K]`.
    ///
    /// # Errors
    /// I/O errors.
    fn create(out: &Path, n: usize, [l, h, k]: [usize; 3], first: &LogicBatch) -> Result<Self> {
        let (_, kt, lv) = first.terms.dim();
        let mut stream = NpzStream::create(out)?;
        let codes_shape = vec![n, l, h, 1, k];
        let ids = [
            stream.add_array(keys::CODES, NpyDtype::F32, &codes_shape)?,
            stream.add_array(keys::TERMS, NpyDtype::I64, &[n, kt, lv])?,
            stream.add_array(keys::TERM_IDS, NpyDtype::I64, &[n, kt])?,
            stream.add_array(keys::TARGET, NpyDtype::F32, &[n])?,
            stream.add_array(keys::PREDICTION, NpyDtype::F32, &[n])?,
            stream.add_array(keys::PROBLEM, NpyDtype::I64, &[n])?,
        ];
        Ok(LogicCodeWriter {
            stream,
            ids,
            n,
            terms: (kt, lv),
            codes_shape,
        })
    }

    /// Appends `rows` (of a batch whose terms are `[_, Kt, Lv]`) and returns their squared error.
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] for terms shaped unlike the first batch's; I/O errors.
    fn append(&mut self, rows: &LogicRows, (_, kt, lv): (usize, usize, usize)) -> Result<f64> {
        if (kt, lv) != self.terms {
            let (skt, slv) = self.terms;
            return Err(ProbeError::InvalidInput(format!(
                "a batch has terms [{kt}, {lv}], an earlier one [{skt}, {slv}]"
            )));
        }
        let se = rows
            .prediction
            .iter()
            .zip(&rows.target)
            .map(|(&p, &y)| (p as f64 - y as f64).powi(2))
            .sum::<f64>();
        let ids = self.ids;
        self.stream.append_f32(ids[0], &rows.codes)?;
        self.stream.append_i64(ids[1], &rows.terms)?;
        self.stream.append_i64(ids[2], &rows.term_ids)?;
        self.stream.append_f32(ids[3], &rows.target)?;
        self.stream.append_f32(ids[4], &rows.prediction)?;
        self.stream.append_i64(ids[5], &rows.problem)?;
        Ok(se)
    }

    /// The arrays' names and shapes, for the sidecar.
    fn shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (n, (kt, lv)) = (self.n, self.terms);
        [
            (keys::CODES, self.codes_shape.clone()),
            (keys::TERMS, vec![n, kt, lv]),
            (keys::TERM_IDS, vec![n, kt]),
            (keys::TARGET, vec![n]),
            (keys::PREDICTION, vec![n]),
            (keys::PROBLEM, vec![n]),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Completes the sidecar of the logic codes: the site, layers, heads, sizes, mixer and shapes.
fn complete_meta(
    meta: &mut ProbeMeta,
    site: &CodeSite,
    layers: Vec<usize>,
    cfg: &Config,
    shapes: Vec<(String, Vec<usize>)>,
) {
    let n = shapes[0].1[0];
    meta.site = site.to_string();
    meta.selections = vec![SelectionMeta {
        query: site.query,
        keys: site.keys.clone(),
        slot: 0,
    }];
    meta.layers = layers;
    meta.heads = cfg.n_heads;
    meta.n_problems = n;
    meta.n_rows = n;
    meta.mixer = Some(cfg.mixer);
    meta.normalisation = Some(cfg.mixer.normalisation());
    meta.shapes = shapes.into_iter().collect();
    meta.version = env!("CARGO_PKG_VERSION").to_string();
}
