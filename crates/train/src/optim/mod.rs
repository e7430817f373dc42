//! AdamW with decoupled weight decay on parameters of two or more dimensions, and a state that can be
//! saved and restored so that a resumed run continues exactly.
//!
//! candle-nn's `AdamW` applies one weight decay to every parameter and keeps its moments private, so a
//! run could be neither masked as the paper's recipe requires nor resumed exactly; this is the same
//! update with both.
//!
//! On a CUDA device (in a build with the feature `cuda`, with the opt-in `HYPERLENS_FUSED_CUDA=1`) the
//! update is one kernel, `hyperlens_model::ops::cuda::FusedAdamW`, with the same arithmetic; on
//! every other device it is the composed candle update below.

use std::collections::HashMap;

use candle_core::{DType, Tensor, Var};
use hyperlens_model::ops::cuda::{adamw_scalars, FusedAdamW};

use crate::error::{Result, TrainError};

/// AdamW hyper-parameters (optax.adamw semantics: `eps` outside the square root, decay scaled by the
/// learning rate). Paper: b1 0.9, b2 0.999, eps 1e-8, weight decay 0.1 (docs/spec/models.md).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWParams {
    /// Exponential decay of the first moment.
    pub beta1: f64,
    /// Exponential decay of the second moment.
    pub beta2: f64,
    /// Added to the square root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay, applied only to parameters with 2 or more dimensions.
    pub weight_decay: f64,
}

impl Default for AdamWParams {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

impl AdamWParams {
    /// Validates the parameters.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] if a beta is outside [0, 1), eps is not positive or the weight decay
    /// is negative.
    pub fn check(&self) -> Result<()> {
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(TrainError::InvalidParam(format!(
                    "{name} must be in [0, 1), got {b}"
                )));
            }
        }
        if self.eps.is_nan() || self.eps <= 0.0 {
            return Err(TrainError::InvalidParam(format!(
                "eps must be positive, got {}",
                self.eps
            )));
        }
        if self.weight_decay.is_nan() || self.weight_decay < 0.0 {
            return Err(TrainError::InvalidParam(format!(
                "weight decay must be non-negative, got {}",
                self.weight_decay
            )));
        }
        Ok(())
    }
}

/// One parameter tensor and its place in the flat optimiser state.
struct Slot {
    name: String,
    var: Var,
    /// The shape of one model's parameter (the variable's shape without the model axis of a
    /// stacked optimiser).
    shape: Vec<usize>,
    /// First element of this parameter in each model's row of the flat state.
    offset: usize,
    /// Number of elements per model.
    len: usize,
}

/// AdamW over named variables, updated as one flat vector.
///
/// The moments of all parameters live in two flat tensors, and each update concatenates the
/// gradients and parameters, applies the AdamW arithmetic once to the whole vector and copies the
/// slices back. The arithmetic per element is the same as a per-tensor update (weight decay is a
/// per-element coefficient, 0 on undecayed parameters), but one update costs about 3 operations per
/// parameter tensor plus 14 in all instead of 15 per tensor: on a GPU each candle operation is a
/// kernel launch, and the per-tensor update of the base model's 74 tensors was a third of the
/// operations of a training step (`benches/train_step.rs`, group `overhead`).
///
/// A **stacked** optimiser ([`AdamW::stacked`]) updates M models whose variables carry a leading
/// model axis (`hyperlens_model::StackedTransformer`) as the same one flat update: the state is
/// `[M, P]`, one row per model in the single model's order, with a learning rate and a weight
/// decay per model. Each model's row is updated exactly as its single run's vector is.
///
/// # Shapes
/// The state is `[M, P]` (`[P]` for one model, the layout of a single run), `P` the parameters
/// of one model; each model's moments are exported with the shapes of its parameters as `m.{name}`
/// and `v.{name}` (the format of `optimizer.safetensors`).
pub struct AdamW {
    slots: Vec<Slot>,
    /// Models M (rows of the state).
    models: usize,
    /// First moments, `[M, P]` (`[P]` for one model): each model's parameters concatenated in
    /// slot order.
    m: Tensor,
    /// Second moments, as `m`.
    v: Tensor,
    /// Weight-decay coefficient per element, as `m`: the model's weight decay on parameters of
    /// rank >= 2, 0 on the others; `None` when nothing is decayed.
    decay: Option<Tensor>,
    params: AdamWParams,
    step: u64,
    /// The fused CUDA update, when it runs ([`FusedAdamW::new`]); `m` and `v` are then views of
    /// its moments.
    fused: Option<Fused>,
}

/// The fused CUDA update and the moments it writes in place.
struct Fused {
    kernel: FusedAdamW,
    /// `[2, M * P]`: the first moments, then the second; `AdamW::m` and `AdamW::v` are views.
    moments: Tensor,
}

/// The learning rates of one update ([`AdamW::rates`]).
#[derive(Debug, Clone)]
pub enum Rates {
    /// One rate for every model.
    Shared(f64),
    /// Rate of model `m` in row `m`. # Shapes: `[M, 1]`, on the parameters' device.
    PerModel(Tensor),
    /// Rate of model `m` at `m`, kept on the host: the fused CUDA update copies them with its bias
    /// corrections into its own device buffer, so nothing is uploaded for them.
    Host(Vec<f64>),
}

impl AdamW {
    /// An optimiser over one model's `vars` (name, variable), sorted by name for a reproducible
    /// order. Parameters with `rank >= 2` are decayed (the paper's mask `ndim != 1`).
    ///
    /// # Errors
    /// Parameter validation; [`TrainError::InvalidParam`] if a variable is not `f32` or the variables
    /// are not all on one device; a tensor allocation failure.
    pub fn new(vars: Vec<(String, Var)>, params: AdamWParams) -> Result<Self> {
        AdamW::build(vars, params, &[params.weight_decay], false)
    }

    /// An optimiser over the stacked variables of `weight_decays.len()` models (each variable
    /// `[M, ...]`): model `m` is decayed with `weight_decays[m]` (the `weight_decay` of `params` is
    /// not used), on parameters whose per-model rank is 2 or more.
    ///
    /// # Errors
    /// As [`AdamW::new`]; [`TrainError::InvalidParam`] for no models, a negative or NaN decay, or a
    /// variable whose leading axis is not M.
    pub fn stacked(
        vars: Vec<(String, Var)>,
        params: AdamWParams,
        weight_decays: &[f64],
    ) -> Result<Self> {
        AdamW::build(vars, params, weight_decays, true)
    }

    fn build(
        vars: Vec<(String, Var)>,
        params: AdamWParams,
        weight_decays: &[f64],
        stacked: bool,
    ) -> Result<Self> {
        params.check()?;
        for &wd in weight_decays {
            AdamWParams {
                weight_decay: wd,
                ..params
            }
            .check()?;
        }
        let models = weight_decays.len();
        if models == 0 {
            return Err(TrainError::InvalidParam(
                "an optimiser over zero models".into(),
            ));
        }
        let mut vars = vars;
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let device = vars
            .first()
            .map_or(candle_core::Device::Cpu, |(_, v)| v.device().clone());
        let mut slots = Vec::with_capacity(vars.len());
        let mut decayed = Vec::new();
        let mut offset = 0;
        for (name, var) in vars {
            if var.dtype() != DType::F32 {
                return Err(TrainError::InvalidParam(format!(
                    "parameter {name} is {:?}; the optimiser updates f32 parameters",
                    var.dtype()
                )));
            }
            if !var.device().same_device(&device) {
                return Err(TrainError::InvalidParam(format!(
                    "parameter {name} is on {:?}, the others on {device:?}",
                    var.device()
                )));
            }
            let shape = if stacked {
                match var.dims().split_first() {
                    Some((&m, rest)) if m == models => rest.to_vec(),
                    _ => {
                        return Err(TrainError::InvalidParam(format!(
                            "parameter {name} has shape {:?}; a stacked optimiser of {models} \
                             models needs a leading axis of {models}",
                            var.dims()
                        )))
                    }
                }
            } else {
                var.dims().to_vec()
            };
            let len = shape.iter().product::<usize>();
            decayed.push((shape.len() >= 2, len));
            slots.push(Slot {
                name,
                var,
                shape,
                offset,
                len,
            });
            offset += len;
        }
        // One model keeps the flat `[P]` layout of a single run (the same operations, so the same
        // tensors per update); M models a `[M, P]` matrix.
        let shape: Vec<usize> = if models == 1 {
            vec![offset]
        } else {
            vec![models, offset]
        };
        let m = Tensor::zeros(shape.as_slice(), DType::F32, &device)?;
        let v = m.clone();
        let mut decay = Vec::with_capacity(models * offset);
        for &wd in weight_decays {
            for &(on, len) in &decayed {
                decay.extend(std::iter::repeat_n(if on { wd as f32 } else { 0.0 }, len));
            }
        }
        let decay = if decay.iter().any(|&d| d != 0.0) {
            Some(Tensor::from_vec(decay, shape.as_slice(), &device)?)
        } else {
            None
        };
        let tensors: Vec<Tensor> = slots.iter().map(|s| s.var.as_tensor().clone()).collect();
        let lens: Vec<usize> = slots.iter().map(|s| s.len).collect();
        let kernel = FusedAdamW::new(
            &tensors,
            &lens,
            models,
            decay.as_ref(),
            (params.beta1, params.beta2, params.eps),
        )?;
        let mut opt = Self {
            slots,
            models,
            m,
            v,
            decay,
            params,
            step: 0,
            fused: None,
        };
        if let Some(kernel) = kernel {
            let moments = Tensor::zeros((2, models * offset), DType::F32, &device)?;
            opt.fused = Some(Fused { kernel, moments });
            opt.set_moments(opt.m.clone(), opt.v.clone())?;
        }
        Ok(opt)
    }

    /// Sets the moments (each of the state's shape): with the fused update, copied into its
    /// `[2, M * P]` tensor, of which `m` and `v` are then views.
    fn set_moments(&mut self, m: Tensor, v: Tensor) -> Result<()> {
        let Some(fused) = &mut self.fused else {
            (self.m, self.v) = (m, v);
            return Ok(());
        };
        let shape = m.shape().clone();
        fused.moments = Tensor::stack(&[m.flatten_all()?, v.flatten_all()?], 0)?.contiguous()?;
        self.m = fused.moments.get(0)?.reshape(&shape)?;
        self.v = fused.moments.get(1)?.reshape(&shape)?;
        Ok(())
    }

    /// Whether updates run as the fused CUDA kernel ([`FusedAdamW`]).
    pub fn is_fused(&self) -> bool {
        self.fused.is_some()
    }

    /// Number of updates applied so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Number of models M.
    pub fn models(&self) -> usize {
        self.models
    }

    /// Applies one update with learning rate `lr` for every model (optax.adamw: `eps` outside
    /// the square root, decay scaled by `lr`) and returns the names of the variables that had no
    /// gradient. If any variable lacks a gradient, nothing is updated and the update count does
    /// not advance: the training loop treats it as an error (fused candle ops silently drop
    /// gradients).
    ///
    /// # Errors
    /// A tensor operation failure.
    pub fn step(
        &mut self,
        grads: &candle_core::backprop::GradStore,
        lr: f64,
    ) -> Result<Vec<String>> {
        self.step_each(grads, &vec![lr; self.models])
    }

    /// [`AdamW::step`] with learning rate `lrs[m]` for model `m`.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] if `lrs` does not have one rate per model; a tensor operation
    /// failure.
    pub fn step_each(
        &mut self,
        grads: &candle_core::backprop::GradStore,
        lrs: &[f64],
    ) -> Result<Vec<String>> {
        let rates = self.rates(lrs)?;
        self.step_with(grads, &rates)
    }

    /// The learning rates of one update, `lrs[m]` for model `m`, as [`AdamW::step_with`] takes
    /// them: one number when all models share it, else a `[M, 1]` tensor uploaded here, so that a
    /// caller can upload it before an [`hyperlens_model::device::UploadCache`] scope, inside which
    /// every upload would be kept for the thread's life on CUDA; with the fused update
    /// ([`AdamW::is_fused`]) the numbers themselves ([`Rates::Host`]), uploaded by nothing.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] if `lrs` does not have one rate per model; a failed upload.
    pub fn rates(&self, lrs: &[f64]) -> Result<Rates> {
        if lrs.len() != self.models {
            return Err(TrainError::InvalidParam(format!(
                "{} learning rates for {} models",
                lrs.len(),
                self.models
            )));
        }
        if self.fused.is_some() {
            return Ok(Rates::Host(lrs.to_vec()));
        }
        if lrs.iter().all(|&lr| lr == lrs[0]) {
            return Ok(Rates::Shared(lrs[0]));
        }
        let device = match self.slots.first() {
            Some(s) => s.var.device().clone(),
            None => return Ok(Rates::Shared(lrs[0])),
        };
        let lr: Vec<f32> = lrs.iter().map(|&lr| lr as f32).collect();
        Ok(Rates::PerModel(hyperlens_model::device::upload(
            lr,
            (self.models, 1),
            &device,
        )?))
    }

    /// [`AdamW::step_each`] with the rates already made ([`AdamW::rates`]); uploads nothing.
    ///
    /// # Errors
    /// A tensor operation failure.
    pub fn step_with(
        &mut self,
        grads: &candle_core::backprop::GradStore,
        rates: &Rates,
    ) -> Result<Vec<String>> {
        // Each parameter as its rows of the state: `[len]` for one model, `[M, len]` for M.
        let one = self.models == 1;
        let axis = usize::from(!one);
        let rows = |t: &Tensor, s: &Slot| {
            if one {
                t.flatten_all()
            } else {
                t.reshape((self.models, s.len))
            }
        };
        let mut flat_grads = Vec::with_capacity(self.slots.len());
        let mut missing = Vec::new();
        for slot in &self.slots {
            match grads.get(slot.var.as_tensor()) {
                // Gradients carry the backward graph (which references the forward pass);
                // detached, the moments hold plain values and no step's graph outlives the step.
                Some(g) => flat_grads.push(rows(&g.detach(), slot)?),
                None => missing.push(slot.name.clone()),
            }
        }
        if !missing.is_empty() {
            return Ok(missing);
        }
        self.step += 1;
        if self.slots.is_empty() {
            return Ok(missing);
        }
        if let Some(fused) = &mut self.fused {
            let lrs = match rates {
                Rates::Shared(lr) => vec![*lr; self.models],
                Rates::Host(lrs) if lrs.len() == self.models => lrs.clone(),
                _ => {
                    self.step -= 1;
                    return Err(TrainError::InvalidParam(
                        "the fused update takes the rates of AdamW::rates".into(),
                    ));
                }
            };
            let scalars = adamw_scalars(self.params.beta1, self.params.beta2, self.step, &lrs);
            let g = Tensor::cat(&flat_grads, axis)?.contiguous()?;
            fused.kernel.step(&fused.moments, &g, &scalars)?;
            return Ok(missing);
        }
        let t = self.step as f64;
        let AdamWParams {
            beta1, beta2, eps, ..
        } = self.params;
        let scale_m = 1.0 / (1.0 - beta1.powf(t));
        let scale_v = 1.0 / (1.0 - beta2.powf(t));
        let g = Tensor::cat(&flat_grads, axis)?;
        let theta = Tensor::cat(
            &self
                .slots
                .iter()
                .map(|s| rows(&s.var.as_tensor().detach(), s))
                .collect::<candle_core::Result<Vec<_>>>()?,
            axis,
        )?;
        let m = ((&self.m * beta1)? + (&g * (1.0 - beta1))?)?;
        let v = ((&self.v * beta2)? + (g.sqr()? * (1.0 - beta2))?)?;
        let update = ((&m * scale_m)? / ((&v * scale_v)?.sqrt()? + eps)?)?;
        let update = match &self.decay {
            Some(d) => (update + (&theta * d)?)?,
            None => update,
        };
        // Host rates (made for a fused update) as the composed update takes them.
        let made;
        let rates = match rates {
            Rates::Host(lrs) => {
                made = self.rates(lrs)?;
                &made
            }
            r => r,
        };
        let step = match rates {
            Rates::Shared(lr) => (update * *lr)?,
            Rates::PerModel(lr) => update.broadcast_mul(lr)?,
            Rates::Host(_) => unreachable!("AdamW::rates gives host rates to a fused update only"),
        };
        let theta = (theta - step)?;
        for s in &self.slots {
            s.var.set(
                &theta
                    .narrow(axis, s.offset, s.len)?
                    .reshape(s.var.shape())?,
            )?;
        }
        self.m = m;
        self.v = v;
        Ok(missing)
    }

    /// Model `member`'s optimiser state as named tensors (`m.{name}`, `v.{name}`, each the shape
    /// of its parameter) plus the step count, for saving beside its checkpoint.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] for a model out of range; a tensor operation failure.
    pub fn state_of(&self, member: usize) -> Result<(HashMap<String, Tensor>, u64)> {
        if member >= self.models {
            return Err(TrainError::InvalidParam(format!(
                "model {member} of an optimiser over {}",
                self.models
            )));
        }
        let mut map = HashMap::new();
        for s in &self.slots {
            for (prefix, flat) in [("m", &self.m), ("v", &self.v)] {
                let row = if self.models == 1 {
                    flat.clone()
                } else {
                    flat.get(member)?
                };
                let t = row
                    .narrow(0, s.offset, s.len)?
                    .reshape(s.shape.as_slice())?;
                // The fused update writes its moments in place: hand out a copy, which the next
                // update leaves alone (the composed update's moments are new tensors each step).
                let t = if self.fused.is_some() { t.copy()? } else { t };
                map.insert(format!("{prefix}.{}", s.name), t);
            }
        }
        Ok((map, self.step))
    }

    /// The state of a one-model optimiser ([`AdamW::state_of`] model 0).
    ///
    /// # Errors
    /// As [`AdamW::state_of`].
    pub fn state(&self) -> Result<(HashMap<String, Tensor>, u64)> {
        self.state_of(0)
    }

    /// Restores the states saved by [`AdamW::state_of`], one per model, all at update `step`.
    ///
    /// # Errors
    /// [`TrainError::Resume`] for a number of states other than M, a moment that is missing or has
    /// the wrong shape, or a state holding tensors for parameters this optimiser does not have.
    pub fn load_states(&mut self, states: &[&HashMap<String, Tensor>], step: u64) -> Result<()> {
        if states.len() != self.models {
            return Err(TrainError::Resume(format!(
                "{} optimizer states for {} models",
                states.len(),
                self.models
            )));
        }
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for state in states {
            let (mut mr, mut vr) = (Vec::new(), Vec::new());
            for s in &self.slots {
                for (prefix, dst) in [("m", &mut mr), ("v", &mut vr)] {
                    let key = format!("{prefix}.{}", s.name);
                    let t = state.get(&key).ok_or_else(|| {
                        TrainError::Resume(format!("optimizer state lacks {key}"))
                    })?;
                    if t.dims() != s.shape.as_slice() {
                        return Err(TrainError::Resume(format!(
                            "optimizer state {key} has shape {:?}, the parameter {:?}",
                            t.dims(),
                            s.shape
                        )));
                    }
                    dst.push(
                        t.to_dtype(DType::F32)?
                            .to_device(self.m.device())?
                            .reshape(s.len)?,
                    );
                }
            }
            if state.len() != 2 * self.slots.len() {
                return Err(TrainError::Resume(format!(
                    "optimizer state has {} tensors, expected {}",
                    state.len(),
                    2 * self.slots.len()
                )));
            }
            if !self.slots.is_empty() {
                m.push(Tensor::cat(&mr, 0)?);
                v.push(Tensor::cat(&vr, 0)?);
            }
        }
        if !self.slots.is_empty() {
            let stack = |rows: &[Tensor]| -> Result<Tensor> {
                Ok(if self.models == 1 {
                    rows[0].clone()
                } else {
                    Tensor::stack(rows, 0)?
                })
            };
            let (m, v) = (stack(&m)?, stack(&v)?);
            self.set_moments(m, v)?;
        }
        self.step = step;
        Ok(())
    }

    /// Restores the state of a one-model optimiser ([`AdamW::load_states`] with one state).
    ///
    /// # Errors
    /// As [`AdamW::load_states`].
    pub fn load_state(&mut self, state: &HashMap<String, Tensor>, step: u64) -> Result<()> {
        self.load_states(&[state], step)
    }
}

#[cfg(test)]
mod tests;
