//! The SRAVEN / fuzzy-logic transformer of "Attention as a Hypernetwork" on candle.
//!
//! `h0 = x W_E + b_E`; per layer `h += Attn(LN1(h))`, `h += MLP(LN2(h))` (pre-LayerNorm, eps 1e-6,
//! tanh-GELU MLP, T5 relative-position bias per layer, no absolute positions); `LN_final`; logits
//! `h W_U + b_U` at the last `F` positions. Source: `docs/spec/models.md`, "The block"; the paper's
//! `hyla/models/transformer.py`. The layers are those of [`crate::nn`].

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use rand::Rng;

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::nn::params::{check_var_count, seeded_tensors, varmap_from};
use crate::nn::position::{bucket_matrix, causal_mask, dropout_mask};
use crate::nn::{
    AttentionInputs, Block, BlockSpec, HookPoints, InitRule, LayerNorm, Linear, NoHooks, Params,
};
use crate::ops::Ops;

/// LayerNorm epsilon of the reference (flax default).
pub const LN_EPS: f32 = 1e-6;

/// The output of [`Transformer::forward`].
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// Logits `[B, F, d_out]` at the last `F` positions.
    pub logits: Tensor,
    /// Per layer, the normalised attention `[B, H, Q, K]` (the latent codes; before dropout),
    /// present only when asked for (hook name `blocks.{l}.attn.hook_pattern`).
    pub attention: Option<Vec<Tensor>>,
}

/// The transformer of `docs/spec/models.md` with one of the eight mixers.
#[derive(Debug, Clone)]
pub struct Transformer {
    config: Config,
    /// Embedding `embed.W_E [d_in, D]`, `embed.b_E [D]`.
    pub embed: Linear,
    /// The blocks, layer 0 first.
    pub blocks: Vec<Block>,
    /// Final LayerNorm `ln_final`.
    pub ln_final: LayerNorm,
    /// Unembedding `unembed.W_U [D, d_out]`, `unembed.b_U [d_out]`.
    pub unembed: Linear,
    params: Vec<(String, Tensor)>,
    buckets: Tensor,
    mask: Option<Tensor>,
    device: Device,
    ops: Ops,
}

/// The paper's initialiser for one parameter (`docs/spec/models.md`, "Training recipe"): kernels
/// LeCun-normal truncated at 2 standard deviations (`variance_scaling(1, fan_in, "truncated_normal")`),
/// biases 0, LayerNorm scales 1, relative-position tables truncated normal of variance
/// `1 / n_buckets` (flax `default_embed_init`, whose fan-in is `n_buckets` for `[H, n_buckets]`).
fn init_rule(cfg: &Config, name: &str) -> InitRule {
    let last = name.rsplit('.').next().unwrap_or(name);
    let fan_in = match last {
        "W_E" => cfg.d_in,
        "W_Q" | "W_K" | "W_V" | "W_in" | "W_U" => cfg.d_model,
        "W_O" => cfg.d_attn(),
        "W_out" => cfg.d_mlp,
        "rel_pos" => cfg.n_buckets,
        "w" => return InitRule::Const(1.0),
        _ => return InitRule::Const(0.0),
    };
    InitRule::TruncatedNormal((1.0 / fan_in as f64).sqrt())
}

/// Seeded parameters with the paper's initialisation, in canonical order
/// ([`Config::tensor_shapes`]), as `f32` tensors on `device`.
///
/// # Errors
/// [`ModelError::Config`] if the config is invalid; candle errors.
pub fn paper_init(cfg: &Config, seed: u64, device: &Device) -> Result<Vec<(String, Tensor)>> {
    cfg.check()?;
    seeded_tensors(cfg.tensor_shapes(), seed, |n| init_rule(cfg, n), device)
}

impl Transformer {
    /// Builds the model from a `VarBuilder`, fetching every tensor of [`Config::tensor_shapes`]
    /// by its TransformerLens name. With a `VarBuilder` over a fresh `VarMap`, missing tensors are
    /// created as trainable `Var`s with untruncated analogues of the paper's initialisation (use
    /// [`Transformer::init`] for the exact, seeded paper initialisation).
    ///
    /// # Errors
    /// [`ModelError::Config`] for an invalid config; candle errors for a missing tensor or a shape
    /// mismatch.
    pub fn new(config: &Config, vb: VarBuilder) -> Result<Transformer> {
        config.check()?;
        let p = Params::fetch(&vb, config.tensor_shapes(), |n| init_rule(config, n))?;
        Transformer::from_params(config, &p, vb.device())
    }

    /// The layers over fetched parameters: the model's own (`Params` at [`Config::tensor_shapes`])
    /// or a stack's, every weight with a leading model axis (`crate::StackedTransformer`, whose
    /// layers then run each model on its own slice, `crate::nn`).
    ///
    /// # Errors
    /// [`ModelError::Input`] naming a missing tensor; candle errors.
    pub(crate) fn from_params(config: &Config, p: &Params, device: &Device) -> Result<Transformer> {
        let spec = BlockSpec {
            ln_eps: Some(LN_EPS as f64),
            mlp: true,
            rel_pos: true,
            mixer: config.mixer,
        };
        let blocks = (0..config.n_layers)
            .map(|l| Block::from_params(p, l, spec))
            .collect::<Result<Vec<_>>>()?;
        let buckets = bucket_matrix(config.n_tokens, config.n_tokens, config.n_buckets, device)?;
        let mask = if config.causal {
            Some(causal_mask(config.n_tokens, device)?)
        } else {
            None
        };
        Ok(Transformer {
            config: config.clone(),
            embed: Linear::new(p.get("embed.W_E")?, p.get("embed.b_E")?),
            blocks,
            ln_final: LayerNorm {
                w: p.get("ln_final.w")?,
                b: p.get("ln_final.b")?,
                eps: LN_EPS as f64,
            },
            unembed: Linear::new(p.get("unembed.W_U")?, p.get("unembed.b_U")?),
            params: p.ordered().to_vec(),
            buckets,
            mask,
            device: device.clone(),
            ops: Ops::default(),
        })
    }

    /// A frozen (non-trainable) model from named tensors, e.g. a loaded checkpoint. The tensors
    /// are moved to `device`.
    ///
    /// # Errors
    /// As [`Transformer::new`]: a missing tensor or a shape mismatch.
    pub fn from_tensors(
        config: &Config,
        tensors: HashMap<String, Tensor>,
        device: &Device,
    ) -> Result<Transformer> {
        let vb = VarBuilder::from_tensors(tensors, DType::F32, device);
        Transformer::new(config, vb)
    }

    /// A trainable model whose parameters are the `Var`s of the returned `VarMap`, starting from
    /// the given named tensors (e.g. a checkpoint to fine-tune or resume).
    ///
    /// # Errors
    /// As [`Transformer::new`]; [`ModelError::Input`] when tensors beyond the config's are given.
    pub fn trainable_from_tensors(
        config: &Config,
        tensors: impl IntoIterator<Item = (String, Tensor)>,
        device: &Device,
    ) -> Result<(Transformer, VarMap)> {
        let varmap = varmap_from(tensors, device)?;
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, device);
        let model = Transformer::new(config, vb)?;
        check_var_count(&varmap, model.params.len())?;
        Ok((model, varmap))
    }

    /// A trainable model with the paper's seeded initialisation ([`paper_init`]).
    ///
    /// # Errors
    /// [`ModelError::Config`] for an invalid config; candle errors.
    pub fn init(config: &Config, seed: u64, device: &Device) -> Result<(Transformer, VarMap)> {
        let tensors = paper_init(config, seed, device)?;
        Transformer::trainable_from_tensors(config, tensors, device)
    }

    /// The same model computing with the given forms of the operations ([`Ops`]; the default is
    /// [`Ops::Fast`]). The function is the same to float32 rounding.
    pub fn with_ops(mut self, ops: Ops) -> Transformer {
        self.ops = ops;
        self
    }

    /// The forms of the operations this model computes with.
    pub fn ops(&self) -> Ops {
        self.ops
    }

    /// The model's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The device holding the parameters.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Every parameter by TransformerLens name, in canonical order ([`Config::tensor_shapes`]).
    pub fn named_tensors(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// Total number of parameters.
    pub fn n_params(&self) -> usize {
        self.params.iter().map(|(_, t)| t.elem_count()).sum()
    }

    /// Evaluation-mode forward pass (no dropout).
    ///
    /// # Shapes
    /// `x [B, T, d_in]` `f32` on the model's device (for SRAVEN one-hot tokens `[B, 36, 8]`).
    /// Returns logits `[B, F, d_out]` and, if `capture_attention`, per layer the attention
    /// `[B, H, T, T]` after normalisation (the latent codes); otherwise none is kept.
    ///
    /// # Errors
    /// [`ModelError::Input`] if `x` has the wrong rank, sizes or dtype; candle errors.
    pub fn forward(&self, x: &Tensor, capture_attention: bool) -> Result<ForwardOutput> {
        self.forward_with(x, capture_attention, None)
    }

    /// Training-mode forward pass with attention dropout at rate `p` (0.1 in the paper): one mask
    /// per layer drawn from `rng`, shared over batch and heads ([`dropout_mask`]).
    ///
    /// # Shapes
    /// As [`Transformer::forward`].
    ///
    /// # Errors
    /// As [`Transformer::forward`]; [`ModelError::Input`] if `p` is not in `[0, 1)`.
    pub fn forward_train<R: Rng + ?Sized>(
        &self,
        x: &Tensor,
        p: f64,
        rng: &mut R,
        capture_attention: bool,
    ) -> Result<ForwardOutput> {
        let t = self.config.n_tokens;
        let masks = (0..self.config.n_layers)
            .map(|_| dropout_mask(t, t, p, rng, &self.device))
            .collect::<Result<Vec<_>>>()?;
        self.forward_with(x, capture_attention, Some(&masks))
    }

    /// Forward pass with explicit per-layer dropout multipliers (`None` = evaluation mode).
    ///
    /// # Shapes
    /// `x [B, T, d_in]`; `dropout` one `f32` tensor per layer broadcastable to `[B, H, T, T]`
    /// (e.g. `[1, 1, T, T]` from [`dropout_mask`]). Returns as [`Transformer::forward`].
    ///
    /// # Errors
    /// [`ModelError::Input`] for a bad `x` or a wrong number of masks; candle errors.
    pub fn forward_with(
        &self,
        x: &Tensor,
        capture_attention: bool,
        dropout: Option<&[Tensor]>,
    ) -> Result<ForwardOutput> {
        let cfg = &self.config;
        let bad = || {
            ModelError::Input(format!(
                "input must be [batch >= 1, {}, {}] f32, got {:?} {:?}",
                cfg.n_tokens,
                cfg.d_in,
                x.dims(),
                x.dtype()
            ))
        };
        let (bsz, t, d_in) = x.dims3().map_err(|_| bad())?;
        if t != cfg.n_tokens || d_in != cfg.d_in || bsz == 0 || x.dtype() != DType::F32 {
            return Err(bad());
        }
        if let Some(m) = dropout {
            if m.len() != cfg.n_layers {
                return Err(ModelError::Input(format!(
                    "{} dropout masks for {} layers",
                    m.len(),
                    cfg.n_layers
                )));
            }
        }
        let h = self.embed.forward(self.ops, x)?;
        self.blocks_from(h, 0, dropout, capture_attention, &mut NoHooks)
    }

    /// Blocks `start..L`, the final LayerNorm and the unembedding from the stream `h` `[B, T, D]`
    /// entering block `start`, with the hook points of those blocks and of the final LayerNorm:
    /// the one body of the plain pass ([`NoHooks`]) and of the hooked pass (`crate::hooks`). With a
    /// hook attached the final LayerNorm runs at every position (its hook points are `[B, T, ..]`)
    /// before the last `F` are kept; without, on the last `F` only.
    ///
    /// # Shapes
    /// `h [B, T, D]`; `dropout` one mask per layer (indexed by layer, from 0). Returns as
    /// [`Transformer::forward`]. For the layers of a stack (`crate::StackedTransformer`)
    /// `h [M, B, T, D]`, the masks `[M, 1, T, T]` and the logits `[M, B, F, d_out]`.
    ///
    /// # Errors
    /// Candle errors; a hook's error or a replacement of another shape.
    pub(crate) fn blocks_from<P: HookPoints + ?Sized>(
        &self,
        mut h: Tensor,
        start: usize,
        dropout: Option<&[Tensor]>,
        capture_attention: bool,
        hooks: &mut P,
    ) -> Result<ForwardOutput> {
        let (cfg, ops) = (&self.config, self.ops);
        // The token axis: 1, or 2 under a stack's leading model axis.
        let axis = h.rank().saturating_sub(2);
        let t = h.dim(axis)?;
        let mut captured = capture_attention.then(|| Vec::with_capacity(cfg.n_layers));
        for (l, block) in self.blocks.iter().enumerate().skip(start) {
            let inputs = AttentionInputs {
                buckets: Some(&self.buckets),
                mask: self.mask.as_ref(),
                dropout: dropout.map(|m| &m[l]),
            };
            let out = block.forward(ops, &h, l, inputs, hooks)?;
            h = out.resid;
            if let Some(c) = captured.as_mut() {
                c.push(out.pattern);
            }
        }
        let last = |h: &Tensor| h.narrow(axis, t - cfg.n_outputs, cfg.n_outputs);
        let normed = match hooks.hooks() {
            None => self.ln_final.forward(ops, &last(&h)?)?,
            Some(_) => last(&self.ln_final.forward_hooked(
                ops,
                &h,
                || "ln_final".into(),
                hooks,
            )?)?,
        };
        Ok(ForwardOutput {
            logits: self.unembed.forward(ops, &normed)?,
            attention: captured,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mixer;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// Std of a standard normal truncated to [-2, 2].
    const TRUNC_STD: f64 = 0.879_625_661_034_239_8;

    fn tiny(mixer: Mixer) -> Config {
        Config {
            d_in: 5,
            n_tokens: 7,
            n_outputs: 3,
            d_model: 15,
            n_heads: 3,
            d_head: 5,
            n_layers: 2,
            d_mlp: 11,
            d_out: 6,
            n_buckets: 7,
            causal: false,
            mixer,
        }
    }

    use crate::ops::test_util::random_input as input;

    #[test]
    fn init_statistics_follow_the_paper() {
        let cfg = Config::sraven_base(Mixer::Hyla);
        let p = paper_init(&cfg, 7, &Device::Cpu).unwrap();
        let get = |n: &str| -> Vec<f32> {
            p.iter()
                .find(|(k, _)| k == n)
                .unwrap()
                .1
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let w = get("blocks.1.mlp.W_in");
        let std = (w.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
        assert!((std - (1.0f64 / 128.0).sqrt()).abs() < 0.003, "{std}");
        let bound = 2.0 * (1.0f64 / 128.0).sqrt() / TRUNC_STD + 1e-6;
        assert!(w.iter().all(|x| (*x as f64).abs() <= bound));
        assert!(get("blocks.0.ln1.w").iter().all(|&x| x == 1.0));
        assert!(get("blocks.0.attn.b_Q").iter().all(|&x| x == 0.0));
        let r = get("blocks.2.attn.rel_pos");
        let rstd = (r.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / r.len() as f64).sqrt();
        assert!((rstd - (1.0f64 / 36.0).sqrt()).abs() < 0.02, "{rstd}");
        // seeded: same seed, same weights; other seed, other weights
        let p2 = paper_init(&cfg, 7, &Device::Cpu).unwrap();
        let p3 = paper_init(&cfg, 8, &Device::Cpu).unwrap();
        let first = |p: &[(String, Tensor)]| -> Vec<f32> {
            p[0].1.flatten_all().unwrap().to_vec1().unwrap()
        };
        assert_eq!(first(&p), first(&p2));
        assert_ne!(first(&p), first(&p3));
    }

    #[test]
    fn forward_shapes_capture_and_input_errors() {
        let cfg = tiny(Mixer::Hyla);
        let (m, _) = Transformer::init(&cfg, 1, &Device::Cpu).unwrap();
        let x = input(&cfg, 2, 0);
        let out = m.forward(&x, true).unwrap();
        assert_eq!(out.logits.dims(), &[2, 3, 6]);
        let att = out.attention.unwrap();
        assert_eq!(att.len(), 2);
        assert_eq!(att[1].dims(), &[2, 3, 7, 7]);
        assert!(m.forward(&x, false).unwrap().attention.is_none());
        let bad = Tensor::zeros((2, 8, 5), DType::F32, &Device::Cpu).unwrap();
        assert!(matches!(m.forward(&bad, false), Err(ModelError::Input(_))));
        let bad = Tensor::zeros((2, 7, 5), DType::F64, &Device::Cpu).unwrap();
        assert!(matches!(m.forward(&bad, false), Err(ModelError::Input(_))));
    }

    #[test]
    fn dropout_is_seeded_and_changes_the_output() {
        let cfg = tiny(Mixer::Softmax);
        let (m, _) = Transformer::init(&cfg, 1, &Device::Cpu).unwrap();
        let x = input(&cfg, 3, 1);
        let run = |seed: u64| -> Vec<f32> {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            m.forward_train(&x, 0.1, &mut rng, false)
                .unwrap()
                .logits
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let eval: Vec<f32> = m
            .forward(&x, false)
            .unwrap()
            .logits
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
        assert_ne!(run(5), eval);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let zero: Vec<f32> = m
            .forward_train(&x, 0.0, &mut rng, false)
            .unwrap()
            .logits
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(zero, eval);
    }
}
