//! Induction training for the circuits work: a causal token model (the lm module's [`TokenModel`],
//! e.g. the attention-only 2-layer preset of Elhage et al. 2021) trained by next-token cross-entropy
//! on the tasks crate's induction corpus (bigram structure + repeated segments, `docs/spec/circuits.md`).

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{Device, Tensor, Var, D};
use candle_nn::VarMap;
use hyperlens_model::lm::ckpt::{load_dir, read_config_json};
use hyperlens_model::lm::{TokenConfig, TokenModel};
use hyperlens_tasks::induction::{repeated_random_tokens, Corpus};
use ndarray::{s, Array2};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::error::{Result, TrainError};
use crate::job::{varmap_vars, BatchLoss, Job};
use crate::loss::{count_correct, cross_entropy};
use crate::metrics::{Evaluation, SetMetrics};
use crate::settings::TrainSettings;

/// Residual width of the token models at width 1 (the circuits paper's toy models: D 64, 4 heads
/// of 16).
const D_MODEL: usize = 64;
const N_HEADS: usize = 4;
/// MLP width (4 D) of models that are not attention-only.
const D_MLP: usize = 256;

/// Index of the first evaluation batch of the corpus stream: far beyond any training step, so
/// evaluation never reuses a training sequence (training batch `i` is corpus batch `i`).
const EVAL_INDEX_BASE: u64 = 1 << 62;

/// The token model an induction run trains. `attn_only`: [`TokenConfig::attn_only`] (no MLP, no
/// LayerNorm); otherwise pre-LayerNorm blocks with a GELU MLP of width 4D. Width `w` multiplies D and
/// the number of heads (d stays 16); the mixer is the run's.
///
/// # Errors
/// [`TrainError::Model`] for an invalid config (e.g. more than 2 attention-only layers).
pub fn model_config(settings: &TrainSettings) -> Result<TokenConfig> {
    let c = &settings.induction;
    let base = if settings.attn_only {
        TokenConfig::attn_only(settings.layers, c.vocab, c.seq_len)?
    } else {
        TokenConfig {
            vocab_size: c.vocab,
            n_ctx: c.seq_len,
            d_model: D_MODEL,
            n_heads: N_HEADS,
            d_head: 16,
            n_layers: settings.layers,
            d_mlp: Some(D_MLP),
            layer_norm: true,
            mixer: settings.mixer,
        }
    };
    let cfg = match settings.size {
        Some(z) => TokenConfig {
            d_model: z.d_model,
            n_heads: z.n_heads,
            d_head: z.d_head,
            d_mlp: base.d_mlp.map(|_| z.d_mlp),
            mixer: settings.mixer,
            ..base
        },
        None => TokenConfig {
            d_model: base.d_model * settings.width,
            n_heads: base.n_heads * settings.width,
            d_mlp: base.d_mlp.map(|m| m * settings.width),
            mixer: settings.mixer,
            ..base
        },
    };
    cfg.check()?;
    Ok(cfg)
}

/// Inputs and next-token targets of a token batch.
///
/// # Shapes
/// `tokens [B, T]` -> (inputs `[B, T - 1]`, targets `[B, T - 1]`), u32 on `device`.
fn shift(tokens: &Array2<u32>, device: &Device) -> Result<(Tensor, Tensor)> {
    let (b, t) = tokens.dim();
    if t < 2 {
        return Err(TrainError::InvalidParam(format!(
            "token sequences need at least 2 tokens, got {t}"
        )));
    }
    let inp: Vec<u32> = tokens.slice(s![.., ..t - 1]).iter().copied().collect();
    let tgt: Vec<u32> = tokens.slice(s![.., 1..]).iter().copied().collect();
    Ok((
        Tensor::from_vec(inp, (b, t - 1), device)?,
        Tensor::from_vec(tgt, (b, t - 1), device)?,
    ))
}

/// The training loss of one token batch: next-token cross-entropy (causal), mean over batch and
/// positions, with attention dropout `dropout`. `metric_sum` counts tokens predicted right.
///
/// # Shapes
/// `tokens [B, T]` u32 ids below the vocabulary, `T <= n_ctx + 1`.
///
/// # Errors
/// Model errors for bad ids or lengths; candle errors.
pub fn batch_loss<R: Rng + ?Sized>(
    model: &TokenModel,
    tokens: &Array2<u32>,
    dropout: f64,
    rng: &mut R,
) -> Result<BatchLoss> {
    let (inp, tgt) = shift(tokens, model.device())?;
    let out = model.forward_train(&inp, dropout, rng, false)?;
    let loss = cross_entropy(&out.logits, &tgt)?;
    let metric_sum = count_correct(&out.logits, &tgt, false)?;
    Ok(BatchLoss {
        loss,
        metric_sum,
        metric_count: tgt.elem_count() as f64,
    })
}

/// Per-position next-token log-loss and correctness of a batch (evaluation mode).
///
/// # Shapes
/// `tokens [B, T]` -> (`nll [B, T - 1]`, `right [B, T - 1]`); entry `[b, i]` is the prediction of
/// token `i + 1` from tokens `0..=i`.
fn per_position(model: &TokenModel, tokens: &Array2<u32>) -> Result<(Array2<f32>, Array2<bool>)> {
    let (b, t) = tokens.dim();
    let (inp, tgt) = shift(tokens, model.device())?;
    let logits = model.forward(&inp, false)?.logits;
    let max = logits.max_keepdim(D::Minus1)?;
    let lse = (logits
        .broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        + &max)?;
    let picked = logits.gather(&tgt.unsqueeze(2)?, 2)?;
    let nll: Vec<f32> = (lse - picked)?.flatten_all()?.to_vec1()?;
    let pred: Vec<u32> = logits.argmax(D::Minus1)?.flatten_all()?.to_vec1()?;
    let tgt: Vec<u32> = tgt.flatten_all()?.to_vec1()?;
    let right: Vec<bool> = pred.iter().zip(&tgt).map(|(p, y)| p == y).collect();
    let shape = (b, t - 1);
    let err =
        |e: ndarray::ShapeError| TrainError::InvalidParam(format!("per-position metrics: {e}"));
    Ok((
        Array2::from_shape_vec(shape, nll).map_err(err)?,
        Array2::from_shape_vec(shape, right).map_err(err)?,
    ))
}

/// Running sums for one evaluation set.
#[derive(Default)]
struct Acc {
    nll: f64,
    right: usize,
    n: usize,
}

impl Acc {
    fn add(&mut self, nll: f32, right: bool) {
        self.nll += nll as f64;
        self.right += usize::from(right);
        self.n += 1;
    }

    fn finish(&self, sequences: usize) -> SetMetrics {
        let n = self.n.max(1) as f64;
        SetMetrics {
            n: sequences,
            metric: self.right as f64 / n,
            loss: self.nll / n,
            per_feature: Vec::new(),
        }
    }
}

/// An induction run.
pub(crate) struct InductionJob {
    model: TokenModel,
    varmap: VarMap,
    corpus: Corpus,
    seed: u64,
    batch: usize,
    dropout: f64,
    eval_n: usize,
    eval_seed: u64,
}

impl InductionJob {
    fn new(settings: &TrainSettings, model: TokenModel, varmap: VarMap) -> Result<InductionJob> {
        let corpus = Corpus::new(corpus_params(settings)?)?;
        Ok(InductionJob {
            model,
            varmap,
            corpus,
            seed: settings.seed,
            batch: settings.batch,
            dropout: settings.dropout,
            eval_n: settings.eval_n,
            eval_seed: settings.eval_seed,
        })
    }

    /// A freshly initialised job (TransformerLens initialisation, seeded by the run seed).
    pub(crate) fn fresh(settings: &TrainSettings, device: &Device) -> Result<InductionJob> {
        let (model, varmap) = TokenModel::init(&model_config(settings)?, settings.seed, device)?;
        InductionJob::new(settings, model, varmap)
    }

    /// A job continuing from the checkpoint in `dir`.
    pub(crate) fn resume(
        settings: &TrainSettings,
        dir: &Path,
        device: &Device,
    ) -> Result<InductionJob> {
        let path = dir.join(hyperlens_model::checkpoint::CONFIG_FILE);
        let config = TokenConfig::from_json(read_config_json(dir)?, &path)?;
        if config != model_config(settings)? {
            return Err(TrainError::Resume(format!(
                "{}: the checkpoint's model config differs from the run's settings",
                path.display()
            )));
        }
        let tensors = load_dir(dir, config.n_layers, || config.tensor_shapes(), device)?;
        let (model, varmap) = TokenModel::trainable_from_tensors(&config, tensors, device)?;
        InductionJob::new(settings, model, varmap)
    }
}

/// The corpus of a run: the settings' corpus with the bigram-table seed taken from the split.
///
/// # Errors
/// [`TrainError::InvalidParam`] if the split is not `seed{N}`.
pub fn corpus_params(settings: &TrainSettings) -> Result<hyperlens_tasks::induction::CorpusParams> {
    Ok(hyperlens_tasks::induction::CorpusParams {
        seed: settings.split_seed()?,
        ..settings.induction
    })
}

impl Job for InductionJob {
    fn members(&self) -> usize {
        1
    }

    fn vars(&self) -> Result<Vec<(String, Var)>> {
        varmap_vars(&self.varmap)
    }

    fn stacked(&self) -> bool {
        false
    }

    fn batch_loss(&mut self, step: u64, rngs: &mut [ChaCha8Rng]) -> Result<Vec<BatchLoss>> {
        let [rng] = rngs else {
            return Err(TrainError::InvalidParam(
                "the induction task trains one model per run".into(),
            ));
        };
        let tokens = self.corpus.batch(self.seed, step, self.batch);
        Ok(vec![batch_loss(&self.model, &tokens, self.dropout, rng)?])
    }

    fn evaluate(&mut self, _member: usize, step: u64) -> Result<Evaluation> {
        let (mut id, mut ind, mut ood) = (Acc::default(), Acc::default(), Acc::default());
        let p = *self.corpus.params();
        let half = p.seq_len / 2;
        let mut done = 0usize;
        let mut index = 0u64;
        while done < self.eval_n {
            let b = self.batch.min(self.eval_n - done);
            let cb = self
                .corpus
                .batch_with_copies(self.eval_seed, EVAL_INDEX_BASE + index, b);
            let (nll, right) = per_position(&self.model, &cb.tokens)?;
            for ((bi, i), &l) in nll.indexed_iter() {
                let r = right[[bi, i]];
                id.add(l, r);
                // Token i + 1 continues a copy whose previous token was copied from just before its
                // source: predictable by induction only.
                let (c0, c1) = (cb.copied[[bi, i]], cb.copied[[bi, i + 1]]);
                if c0 && c1 && cb.source[[bi, i + 1]] == cb.source[[bi, i]].wrapping_add(1) {
                    ind.add(l, r);
                }
            }
            if half >= 2 {
                let seed = self.eval_seed.wrapping_add(index);
                let rep = repeated_random_tokens(p.vocab, half, b, seed)?;
                let (nll, right) = per_position(&self.model, &rep)?;
                // Position i predicts token i + 1; from i = half on, the token is a repeat of one
                // whose predecessor has appeared (the first repeated token, at i = half - 1, is not
                // predictable).
                for bi in 0..b {
                    for i in half..2 * half - 1 {
                        ood.add(nll[[bi, i]], right[[bi, i]]);
                    }
                }
            }
            done += b;
            index += 1;
        }
        let mut extra = BTreeMap::new();
        extra.insert("induction_positions".to_string(), ind.finish(self.eval_n));
        Ok(Evaluation {
            step,
            id: id.finish(self.eval_n),
            ood: ood.finish(self.eval_n),
            extra,
        })
    }

    fn save(&self, _member: usize, dir: &Path) -> Result<()> {
        Ok(self.model.save(dir)?)
    }

    fn model_config(&self) -> Result<serde_json::Value> {
        Ok(self.model.config().to_json()?)
    }

    fn n_params(&self) -> usize {
        self.model.config().n_params()
    }
}
