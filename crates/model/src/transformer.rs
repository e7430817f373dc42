//! The SRAVEN / fuzzy-logic transformer of "Attention as a Hypernetwork" on candle.
//!
//! `h0 = x W_E + b_E`; per layer `h += Attn(LN1(h))`, `h += MLP(LN2(h))` (pre-LayerNorm, eps 1e-6,
//! tanh-GELU MLP, T5 relative-position bias per layer, no absolute positions); `LN_final`; logits
//! `h W_U + b_U` at the last `F` positions. Source: `spec/models.md`, "The block"; the paper's
//! `hyla/models/transformer.py`.
//!
//! Style: candle's `candle-nn/src/linear.rs` and `candle-transformers/.../llama.rs` (plain structs,
//! constructors taking a `VarBuilder`).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Init, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::attention;
use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::fastpath;
use crate::mixer::Mixer;

/// LayerNorm epsilon of the reference (flax default).
pub const LN_EPS: f32 = 1e-6;

/// `x W + b` over the last axis.
///
/// # Shapes
/// `x [..., in]`, `w [in, out]`, `b [out]`; returns `[..., out]`.
fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let (n_in, n_out) = w.dims2()?;
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let y = fastpath::add_leading(&x.reshape((rows, n_in))?.matmul(w)?, b)?;
    let mut out_dims = dims;
    let last = out_dims.len() - 1;
    out_dims[last] = n_out;
    Ok(y.reshape(out_dims)?)
}

/// A LayerNorm with learned scale `w` and bias `b` (eps 1e-6): candle's fused kernel forward with a
/// hand-written gradient ([`crate::fused::layer_norm`]; candle's fused op alone has no gradient,
/// `TOOLCHAIN.md`).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// Scale `[D]`.
    pub w: Tensor,
    /// Bias `[D]`.
    pub b: Tensor,
}

impl LayerNorm {
    /// Normalises over the last axis.
    ///
    /// # Shapes
    /// `x [..., D]` -> `[..., D]`.
    ///
    /// # Errors
    /// Candle errors on a shape mismatch.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::fused::layer_norm(x, &self.w, &self.b, LN_EPS as f64)
    }
}

/// The attention sub-layer of one block: projections, relative-position table and mixer.
#[derive(Debug, Clone)]
pub struct Attention {
    /// Query kernel `[H, D, d]`.
    pub w_q: Tensor,
    /// Key kernel `[H, D, d]`.
    pub w_k: Tensor,
    /// Value kernel `[H, D, d]`.
    pub w_v: Tensor,
    /// Query bias `[H, d]`.
    pub b_q: Tensor,
    /// Key bias `[H, d]`.
    pub b_k: Tensor,
    /// Value bias `[H, d]`.
    pub b_v: Tensor,
    /// Output kernel `[H, d, D]`.
    pub w_o: Tensor,
    /// Output bias `[D]`.
    pub b_o: Tensor,
    /// T5 relative-position table `[H, n_buckets]`.
    pub rel_pos: Tensor,
    /// The sequence mixer.
    pub mixer: Mixer,
}

impl Attention {
    /// Projects `h` to heads: `y[b, h, t, :] = x[b, t] W[h] + bias[h]`.
    fn project(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        let (bsz, t, dm) = x.dims3()?;
        let (h, _, d) = w.dims3()?;
        let w2 = w.transpose(0, 1)?.reshape((dm, h * d))?;
        let b2 = b.reshape(h * d)?;
        let y = linear(x, &w2, &b2)?;
        Ok(y.reshape((bsz, t, h, d))?.transpose(1, 2)?.contiguous()?)
    }

    /// Runs the sub-layer on normalised input.
    ///
    /// # Shapes
    /// `x [B, T, D]`; `buckets` `u32 [T, T]` ([`attention::bucket_matrix`]); `mask` `u8 [T, T]`
    /// (1 = visible); `dropout` `f32 [1, 1, T, T]`. Returns `(out [B, T, D], attention [B, H, T, T])`.
    ///
    /// # Errors
    /// Candle errors on shape mismatches.
    pub fn forward(
        &self,
        x: &Tensor,
        buckets: &Tensor,
        mask: Option<&Tensor>,
        dropout: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let (bsz, t, _) = x.dims3()?;
        let (h, d, dm) = self.w_o.dims3()?;
        let q = Self::project(x, &self.w_q, &self.b_q)?;
        let k = Self::project(x, &self.w_k, &self.b_k)?;
        let v = Self::project(x, &self.w_v, &self.b_v)?;
        let bias = attention::relative_position_bias(&self.rel_pos, buckets)?;
        let (o, a) = attention::mix(&q, &k, &v, Some(&bias), mask, self.mixer, dropout)?;
        let out = linear(
            &o.reshape((bsz, t, h * d))?,
            &self.w_o.reshape((h * d, dm))?,
            &self.b_o,
        )?;
        Ok((out, a))
    }
}

/// The MLP sub-layer: `Linear(D, D_mlp) -> GELU (tanh) -> Linear(D_mlp, D)`.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// `[D, D_mlp]`.
    pub w_in: Tensor,
    /// `[D_mlp]`.
    pub b_in: Tensor,
    /// `[D_mlp, D]`.
    pub w_out: Tensor,
    /// `[D]`.
    pub b_out: Tensor,
}

impl Mlp {
    /// # Shapes
    /// `x [..., D]` -> `[..., D]`.
    ///
    /// # Errors
    /// Candle errors on shape mismatches.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = fastpath::gelu_tanh(&linear(x, &self.w_in, &self.b_in)?)?;
        linear(&h, &self.w_out, &self.b_out)
    }
}

/// One pre-LayerNorm transformer block.
#[derive(Debug, Clone)]
pub struct Block {
    /// LayerNorm before attention.
    pub ln1: LayerNorm,
    /// Attention sub-layer.
    pub attn: Attention,
    /// LayerNorm before the MLP.
    pub ln2: LayerNorm,
    /// MLP sub-layer.
    pub mlp: Mlp,
}

/// The output of [`Transformer::forward`].
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// Logits `[B, F, d_out]` at the last `F` positions.
    pub logits: Tensor,
    /// Per layer, the normalised attention `[B, H, Q, K]` (the latent codes; before dropout),
    /// present only when asked for (hook name `blocks.{l}.attn.hook_pattern`).
    pub attention: Option<Vec<Tensor>>,
}

/// The transformer of `spec/models.md` with one of the eight mixers.
#[derive(Debug, Clone)]
pub struct Transformer {
    config: Config,
    /// Embedding kernel `[d_in, D]`.
    pub w_e: Tensor,
    /// Embedding bias `[D]`.
    pub b_e: Tensor,
    /// The blocks, layer 0 first.
    pub blocks: Vec<Block>,
    /// Final LayerNorm.
    pub ln_final: LayerNorm,
    /// Unembedding kernel `[D, d_out]`.
    pub w_u: Tensor,
    /// Unembedding bias `[d_out]`.
    pub b_u: Tensor,
    params: Vec<(String, Tensor)>,
    buckets: Tensor,
    mask: Option<Tensor>,
    device: Device,
}

/// The paper's initialiser for one parameter (`spec/models.md`, "Training recipe"): kernels
/// LeCun-normal truncated at 2 standard deviations (`variance_scaling(1, fan_in, "normal")`),
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

/// How one parameter is initialised.
enum InitRule {
    /// Every entry equal to this value.
    Const(f64),
    /// Target standard deviation (before truncation).
    TruncatedNormal(f64),
}

/// A standard normal draw truncated to [-2, 2] (rejection; Box-Muller).
fn truncated_standard_normal<R: Rng>(rng: &mut R) -> f64 {
    loop {
        let u1: f64 = rng.gen::<f64>().max(f64::MIN_POSITIVE);
        let u2: f64 = rng.gen();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        if z.abs() <= 2.0 {
            return z;
        }
    }
}

/// Std of a standard normal truncated to [-2, 2] (the constant of `jax.nn.initializers`).
const TRUNC_STD: f64 = 0.879_625_661_034_239_8;

/// Seeded parameters with the paper's initialisation, in canonical order
/// ([`Config::tensor_shapes`]), as `f32` tensors on `device`.
///
/// # Errors
/// [`ModelError::Config`] if the config is invalid; candle errors.
pub fn paper_init(cfg: &Config, seed: u64, device: &Device) -> Result<Vec<(String, Tensor)>> {
    cfg.check()?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    cfg.tensor_shapes()
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = match init_rule(cfg, &name) {
                InitRule::Const(c) => vec![c as f32; n],
                InitRule::TruncatedNormal(std) => (0..n)
                    .map(|_| (truncated_standard_normal(&mut rng) * std / TRUNC_STD) as f32)
                    .collect(),
            };
            let t = Tensor::from_vec(data, shape, device)?;
            Ok((name, t))
        })
        .collect()
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
        let device = vb.device().clone();
        let mut params: HashMap<String, Tensor> = HashMap::new();
        let mut ordered = Vec::new();
        for (name, shape) in config.tensor_shapes() {
            let hint = match init_rule(config, &name) {
                InitRule::Const(c) => Init::Const(c),
                InitRule::TruncatedNormal(std) => Init::Randn {
                    mean: 0.0,
                    stdev: std,
                },
            };
            let t = vb.get_with_hints(shape, &name, hint)?;
            if t.dtype() != DType::F32 {
                return Err(ModelError::Input(format!(
                    "tensor `{name}` has dtype {:?}, expected f32",
                    t.dtype()
                )));
            }
            params.insert(name.clone(), t.clone());
            ordered.push((name, t));
        }
        let p = |name: String| -> Result<Tensor> {
            params
                .get(&name)
                .cloned()
                .ok_or_else(|| ModelError::Input(format!("missing tensor `{name}`")))
        };
        let ln = |prefix: &str| -> Result<LayerNorm> {
            Ok(LayerNorm {
                w: p(format!("{prefix}.w"))?,
                b: p(format!("{prefix}.b"))?,
            })
        };
        let mut blocks = Vec::with_capacity(config.n_layers);
        for l in 0..config.n_layers {
            let a = |s: &str| p(format!("blocks.{l}.attn.{s}"));
            let m = |s: &str| p(format!("blocks.{l}.mlp.{s}"));
            blocks.push(Block {
                ln1: ln(&format!("blocks.{l}.ln1"))?,
                attn: Attention {
                    w_q: a("W_Q")?,
                    w_k: a("W_K")?,
                    w_v: a("W_V")?,
                    b_q: a("b_Q")?,
                    b_k: a("b_K")?,
                    b_v: a("b_V")?,
                    w_o: a("W_O")?,
                    b_o: a("b_O")?,
                    rel_pos: a("rel_pos")?,
                    mixer: config.mixer,
                },
                ln2: ln(&format!("blocks.{l}.ln2"))?,
                mlp: Mlp {
                    w_in: m("W_in")?,
                    b_in: m("b_in")?,
                    w_out: m("W_out")?,
                    b_out: m("b_out")?,
                },
            });
        }
        let buckets =
            attention::bucket_matrix(config.n_tokens, config.n_tokens, config.n_buckets, &device)?;
        let mask = if config.causal {
            Some(attention::causal_mask(config.n_tokens, &device)?)
        } else {
            None
        };
        Ok(Transformer {
            config: config.clone(),
            w_e: p("embed.W_E".into())?,
            b_e: p("embed.b_E".into())?,
            blocks,
            ln_final: ln("ln_final")?,
            w_u: p("unembed.W_U".into())?,
            b_u: p("unembed.b_U".into())?,
            params: ordered,
            buckets,
            mask,
            device,
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
    /// As [`Transformer::new`].
    pub fn trainable_from_tensors(
        config: &Config,
        tensors: impl IntoIterator<Item = (String, Tensor)>,
        device: &Device,
    ) -> Result<(Transformer, VarMap)> {
        let varmap = VarMap::new();
        {
            let mut data = varmap
                .data()
                .lock()
                .map_err(|_| ModelError::Input("VarMap lock poisoned".into()))?;
            for (name, t) in tensors {
                let t = t.to_device(device)?.to_dtype(DType::F32)?;
                data.insert(name, Var::from_tensor(&t)?);
            }
        }
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, device);
        let model = Transformer::new(config, vb)?;
        let n_vars = varmap.all_vars().len();
        if n_vars != model.params.len() {
            return Err(ModelError::Input(format!(
                "{n_vars} tensors given, the config has {} parameters",
                model.params.len()
            )));
        }
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

    /// The configuration.
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
    /// per layer drawn from `rng`, shared over batch and heads ([`attention::dropout_mask`]).
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
            .map(|_| attention::dropout_mask(t, t, p, rng, &self.device))
            .collect::<Result<Vec<_>>>()?;
        self.forward_with(x, capture_attention, Some(&masks))
    }

    /// Forward pass with explicit per-layer dropout multipliers (`None` = evaluation mode).
    ///
    /// # Shapes
    /// `x [B, T, d_in]`; `dropout` one `f32` tensor per layer broadcastable to `[B, H, T, T]`
    /// (e.g. `[1, 1, T, T]` from [`attention::dropout_mask`]). Returns as [`Transformer::forward`].
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
        let (bsz, t, d_in) = x.dims3().map_err(|_| {
            ModelError::Input(format!(
                "input must be [batch, {}, {}], got {:?}",
                cfg.n_tokens,
                cfg.d_in,
                x.dims()
            ))
        })?;
        if t != cfg.n_tokens || d_in != cfg.d_in || bsz == 0 {
            return Err(ModelError::Input(format!(
                "input must be [batch >= 1, {}, {}], got {:?}",
                cfg.n_tokens,
                cfg.d_in,
                x.dims()
            )));
        }
        if x.dtype() != DType::F32 {
            return Err(ModelError::Input(format!(
                "input must be f32, got {:?}",
                x.dtype()
            )));
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
        let mut h = linear(x, &self.w_e, &self.b_e)?;
        let mut captured = capture_attention.then(|| Vec::with_capacity(cfg.n_layers));
        for (l, block) in self.blocks.iter().enumerate() {
            let drop = dropout.map(|m| &m[l]);
            let (a_out, a) = block.attn.forward(
                &block.ln1.forward(&h)?,
                &self.buckets,
                self.mask.as_ref(),
                drop,
            )?;
            h = (h + a_out)?;
            h = (&h + block.mlp.forward(&block.ln2.forward(&h)?)?)?;
            if let Some(c) = captured.as_mut() {
                c.push(a);
            }
        }
        let h = h.narrow(1, t - cfg.n_outputs, cfg.n_outputs)?;
        let logits = linear(&self.ln_final.forward(&h)?, &self.w_u, &self.b_u)?;
        Ok(ForwardOutput {
            logits,
            attention: captured,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn input(cfg: &Config, b: usize, seed: u64) -> Tensor {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let v: Vec<f32> = (0..b * cfg.n_tokens * cfg.d_in)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        Tensor::from_vec(v, (b, cfg.n_tokens, cfg.d_in), &Device::Cpu).unwrap()
    }

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
