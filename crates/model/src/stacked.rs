//! M transformers of one architecture in one graph: every weight has a leading model axis, the
//! affine maps run as batched matrix products over it, and the operations without weights (scores,
//! the normalisations, the value network, dropout) fold the model axis into the batch.
//!
//! The pass is the single model's own: [`Transformer`]'s layers ([`crate::nn::Block::forward`],
//! `Transformer::blocks_from`) built over the stacked weights, which run each model on its own
//! slice of `[M, B, T, D]` (`crate::nn`). This file holds only the stacking: the parameters with
//! their model axis, the members in and out, and the checks of the stacked input.
//!
//! This is how `hyperlens train --seeds 0,1,2` trains several runs at once: on a GPU one launch
//! then does the work of M, and a step of M small models costs little more than a step of one.
//! The function of model `m` is exactly [`Transformer`]'s with model `m`'s weights; with one model
//! every operation is the single model's own (the model axis is squeezed away), so `M = 1` is
//! bitwise the single model, values and gradients (tests below and in `tests/model.rs`).
//!
//! Source: the model of `docs/spec/models.md` ("The block"); the batching is ours (the paper's
//! code trains one model per process).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::nn::params::{check_var_count, varmap_from};
use crate::nn::{NoHooks, Params};
use crate::ops::Ops;
use crate::transformer::{paper_init, Transformer};

/// M models of one [`Config`] with stacked weights (module docs).
#[derive(Debug, Clone)]
pub struct StackedTransformer {
    config: Config,
    models: usize,
    /// Every parameter by TransformerLens name with the model axis first, `[M, ...]`.
    params: Vec<(String, Tensor)>,
    /// The single model's layers over the stacked weights. With one model, over views of them with
    /// the model axis squeezed away (they share the variables' storage and pass gradients to
    /// them), so that the graph is the single model's own.
    layers: Transformer,
}

/// The parameter shapes of `config` with a leading model axis of `models`.
fn stacked_shapes(config: &Config, models: usize) -> Vec<(String, Vec<usize>)> {
    config
        .tensor_shapes()
        .into_iter()
        .map(|(n, s)| {
            let mut shape = Vec::with_capacity(s.len() + 1);
            shape.push(models);
            shape.extend(s);
            (n, shape)
        })
        .collect()
}

impl StackedTransformer {
    /// Builds the models from a `VarBuilder` holding every tensor of [`Config::tensor_shapes`]
    /// with a leading model axis of `models`, by TransformerLens name.
    ///
    /// # Errors
    /// [`ModelError::Config`] for an invalid config; [`ModelError::Input`] for zero models; candle
    /// errors for a missing tensor or a shape mismatch.
    pub fn new(config: &Config, models: usize, vb: VarBuilder) -> Result<StackedTransformer> {
        config.check()?;
        if models == 0 {
            return Err(ModelError::Input("a stack of zero models".into()));
        }
        let device = vb.device().clone();
        let p = Params::fetch(&vb, stacked_shapes(config, models), |_| {
            crate::nn::InitRule::Const(0.0)
        })?;
        let params = p.ordered().to_vec();
        let layers = if models == 1 {
            let views = params
                .iter()
                .map(|(n, t)| Ok((n.clone(), t.squeeze(0)?)))
                .collect::<Result<HashMap<_, _>>>()?;
            Transformer::from_tensors(config, views, &device)?
        } else {
            Transformer::from_params(config, &p, &device)?
        };
        Ok(StackedTransformer {
            config: config.clone(),
            models,
            params,
            layers,
        })
    }

    /// Trainable models starting from each member's named tensors (checkpoints to resume, or
    /// initialisations): the parameters are the `Var`s of the returned `VarMap`, stacked.
    ///
    /// # Shapes
    /// Each member holds every tensor of [`Config::tensor_shapes`] at its shape.
    ///
    /// # Errors
    /// [`ModelError::Input`] for no members, or a member that lacks a tensor, has it at another
    /// shape or holds extra ones; candle errors.
    pub fn trainable_from_members(
        config: &Config,
        members: Vec<HashMap<String, Tensor>>,
        device: &Device,
    ) -> Result<(StackedTransformer, VarMap)> {
        config.check()?;
        if members.is_empty() {
            return Err(ModelError::Input("a stack of zero models".into()));
        }
        let shapes = config.tensor_shapes();
        for (i, member) in members.iter().enumerate() {
            if member.len() != shapes.len() {
                return Err(ModelError::Input(format!(
                    "model {i} of the stack has {} tensors, the config {}",
                    member.len(),
                    shapes.len()
                )));
            }
        }
        let mut stacked = Vec::with_capacity(shapes.len());
        for (name, shape) in &shapes {
            let parts = members
                .iter()
                .enumerate()
                .map(|(i, member)| {
                    let t = member.get(name).ok_or_else(|| {
                        ModelError::Input(format!("model {i} of the stack lacks `{name}`"))
                    })?;
                    if t.dims() != shape.as_slice() {
                        return Err(ModelError::Input(format!(
                            "model {i} of the stack has `{name}` of shape {:?}, expected {shape:?}",
                            t.dims()
                        )));
                    }
                    Ok(t.to_device(device)?.to_dtype(DType::F32)?)
                })
                .collect::<Result<Vec<_>>>()?;
            stacked.push((name.clone(), Tensor::stack(&parts, 0)?));
        }
        let varmap = varmap_from(stacked, device)?;
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, device);
        let model = StackedTransformer::new(config, members.len(), vb)?;
        check_var_count(&varmap, model.params.len())?;
        Ok((model, varmap))
    }

    /// Trainable models with the paper's seeded initialisation ([`paper_init`]), model `m` seeded
    /// with `seeds[m]`: each equal to `Transformer::init(config, seeds[m])`.
    ///
    /// # Errors
    /// As [`StackedTransformer::trainable_from_members`].
    pub fn init(
        config: &Config,
        seeds: &[u64],
        device: &Device,
    ) -> Result<(StackedTransformer, VarMap)> {
        let members = seeds
            .iter()
            .map(|&s| Ok(paper_init(config, s, device)?.into_iter().collect()))
            .collect::<Result<Vec<_>>>()?;
        StackedTransformer::trainable_from_members(config, members, device)
    }

    /// The same models computing with the given forms of the operations ([`Ops`]).
    pub fn with_ops(mut self, ops: Ops) -> StackedTransformer {
        self.layers = self.layers.with_ops(ops);
        self
    }

    /// The configuration every model shares.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The number of models M.
    pub fn models(&self) -> usize {
        self.models
    }

    /// The device holding the parameters.
    pub fn device(&self) -> &Device {
        self.layers.device()
    }

    /// Every stacked parameter by TransformerLens name, `[M, ...]`, in canonical order.
    pub fn named_tensors(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// Parameters of one model.
    pub fn n_params(&self) -> usize {
        self.params
            .iter()
            .map(|(_, t)| t.elem_count() / self.models)
            .sum()
    }

    /// Model `m`'s weights as named tensors of their own shapes (copies, detached).
    ///
    /// # Errors
    /// [`ModelError::Input`] for `m` out of range; candle errors.
    pub fn member_tensors(&self, m: usize) -> Result<Vec<(String, Tensor)>> {
        if m >= self.models {
            return Err(ModelError::Input(format!(
                "model {m} of a stack of {}",
                self.models
            )));
        }
        self.params
            .iter()
            .map(|(n, t)| Ok((n.clone(), t.detach().get(m)?.contiguous()?.copy()?)))
            .collect()
    }

    /// Model `m` as a frozen [`Transformer`] (for evaluation and saving).
    ///
    /// # Errors
    /// As [`StackedTransformer::member_tensors`].
    pub fn member(&self, m: usize) -> Result<Transformer> {
        let tensors = self.member_tensors(m)?.into_iter().collect();
        Ok(
            Transformer::from_tensors(&self.config, tensors, self.device())?
                .with_ops(self.layers.ops()),
        )
    }

    /// The forward pass of every model on its own batch, with per-model attention dropout.
    ///
    /// # Shapes
    /// `x [M, B, T, d_in]` `f32` (model `m` reads `x[m]`); `dropout` one tensor per layer of
    /// per-model multipliers `[M, 1, T, T]` (model `m`'s mask at `[m]`, e.g. stacked
    /// [`crate::nn::position::dropout_mask`]s), or `None` for evaluation mode. Returns the logits
    /// `[M, B, F, d_out]` at the last `F` positions.
    ///
    /// # Errors
    /// [`ModelError::Input`] for a bad `x` or a wrong number or shape of masks; candle errors.
    pub fn forward_with(&self, x: &Tensor, dropout: Option<&[Tensor]>) -> Result<Tensor> {
        let cfg = &self.config;
        let (m, t) = (self.models, cfg.n_tokens);
        let bad = || {
            ModelError::Input(format!(
                "input must be [{m}, batch >= 1, {t}, {}] f32, got {:?} {:?}",
                cfg.d_in,
                x.dims(),
                x.dtype()
            ))
        };
        let (xm, bsz, xt, d_in) = x.dims4().map_err(|_| bad())?;
        if xm != m || xt != t || d_in != cfg.d_in || bsz == 0 || x.dtype() != DType::F32 {
            return Err(bad());
        }
        if let Some(masks) = dropout {
            if masks.len() != cfg.n_layers || masks.iter().any(|d| d.dims() != [m, 1, t, t]) {
                return Err(ModelError::Input(format!(
                    "dropout must be {} masks of [{m}, 1, {t}, {t}]",
                    cfg.n_layers
                )));
            }
        }
        if self.models == 1 {
            let out = self.layers.forward_with(&x.squeeze(0)?, false, dropout)?;
            return Ok(out.logits.unsqueeze(0)?);
        }
        let h = self.layers.embed.forward(self.layers.ops(), x)?;
        let out = self
            .layers
            .blocks_from(h, 0, dropout, false, &mut NoHooks)?;
        Ok(out.logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mixer;
    use candle_core::Var;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn tiny(mixer: Mixer) -> Config {
        Config {
            d_in: 5,
            n_tokens: 7,
            n_outputs: 3,
            d_model: 12,
            n_heads: 3,
            d_head: 4,
            n_layers: 2,
            d_mlp: 10,
            d_out: 6,
            n_buckets: 7,
            causal: false,
            mixer,
        }
    }

    use crate::ops::test_util::random_input as input;

    fn masks(cfg: &Config, seed: u64) -> Vec<Tensor> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..cfg.n_layers)
            .map(|_| {
                crate::nn::position::dropout_mask(
                    cfg.n_tokens,
                    cfg.n_tokens,
                    0.2,
                    &mut rng,
                    &Device::Cpu,
                )
                .unwrap()
            })
            .collect()
    }

    fn flat(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// A loss with a different weight on every logit, so that every gradient entry matters.
    fn weighted(logits: &Tensor) -> Tensor {
        let n = logits.elem_count();
        let w: Vec<f32> = (0..n).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
        let w = Tensor::from_vec(w, logits.dims(), logits.device()).unwrap();
        (logits * w).unwrap().sum_all().unwrap()
    }

    /// Model `m` of a stack computes what the single model with its weights computes: bitwise
    /// for one model (values and gradients), to float32 rounding for three, under every form of
    /// the operations, with per-model dropout masks.
    #[test]
    fn each_model_of_the_stack_is_the_single_model() {
        for mixer in [Mixer::Hyla, Mixer::Softmax, Mixer::Linear] {
            for ops in [Ops::Reference, Ops::Fused, Ops::Fast] {
                let cfg = tiny(mixer);
                for seeds in [vec![4u64], vec![4, 9, 2]] {
                    let m = seeds.len();
                    let (stack, svars) =
                        StackedTransformer::init(&cfg, &seeds, &Device::Cpu).unwrap();
                    let stack = stack.with_ops(ops);
                    let xs: Vec<Tensor> = (0..m).map(|i| input(&cfg, 3, 10 + i as u64)).collect();
                    let ms: Vec<Vec<Tensor>> = (0..m).map(|i| masks(&cfg, 20 + i as u64)).collect();
                    let x = Tensor::stack(&xs, 0).unwrap();
                    let stacked_masks: Vec<Tensor> = (0..cfg.n_layers)
                        .map(|l| {
                            Tensor::cat(&ms.iter().map(|v| v[l].clone()).collect::<Vec<_>>(), 0)
                                .unwrap()
                        })
                        .collect();
                    let logits = stack.forward_with(&x, Some(&stacked_masks)).unwrap();
                    assert_eq!(logits.dims(), &[m, 3, 3, 6]);
                    let total = (0..m)
                        .map(|i| weighted(&logits.get(i).unwrap()))
                        .reduce(|a, b| (a + b).unwrap())
                        .unwrap();
                    let grads = total.backward().unwrap();
                    let sdata = svars.data().lock().unwrap();
                    for (i, &seed) in seeds.iter().enumerate() {
                        let (single, vars) = Transformer::init(&cfg, seed, &Device::Cpu).unwrap();
                        let single = single.with_ops(ops);
                        let out = single.forward_with(&xs[i], false, Some(&ms[i])).unwrap();
                        let want = flat(&out.logits);
                        let got = flat(&logits.get(i).unwrap());
                        let g1 = weighted(&out.logits).backward().unwrap();
                        let vdata = vars.data().lock().unwrap();
                        let close = |a: &[f32], b: &[f32], what: &str| {
                            if m == 1 {
                                assert_eq!(a, b, "{mixer} {ops:?} {what}: not bitwise");
                            } else {
                                let scale = b.iter().fold(0f32, |s, x| s.max(x.abs())).max(1e-6);
                                for (x, y) in a.iter().zip(b) {
                                    assert!(
                                        (x - y).abs() <= 2e-5 * scale,
                                        "{mixer} {ops:?} {what}: {x} vs {y}"
                                    );
                                }
                            }
                        };
                        close(&got, &want, "logits");
                        for (name, var) in vdata.iter() {
                            let sv: &Var = &sdata[name];
                            let gs = grads.get(sv.as_tensor()).unwrap().get(i).unwrap();
                            let g = g1.get(var.as_tensor()).unwrap();
                            close(&flat(&gs), &flat(g), name);
                        }
                        // The member is the single model's weights.
                        let member = stack.member_tensors(i).unwrap();
                        for (name, t) in member {
                            assert_eq!(flat(&t), flat(vdata[&name].as_tensor()));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let cfg = tiny(Mixer::Hyla);
        let (stack, _) = StackedTransformer::init(&cfg, &[1, 2], &Device::Cpu).unwrap();
        let x = Tensor::stack(&[input(&cfg, 2, 0), input(&cfg, 2, 1)], 0).unwrap();
        assert!(stack.forward_with(&x, None).is_ok());
        let one = input(&cfg, 2, 0).unsqueeze(0).unwrap();
        assert!(matches!(
            stack.forward_with(&one, None),
            Err(ModelError::Input(_))
        ));
        let m = masks(&cfg, 0);
        assert!(matches!(
            stack.forward_with(&x, Some(&m)),
            Err(ModelError::Input(_))
        ));
        assert!(stack.member_tensors(2).is_err());
        assert!(StackedTransformer::init(&cfg, &[], &Device::Cpu).is_err());
    }
}
