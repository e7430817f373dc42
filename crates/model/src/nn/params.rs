//! Named parameters and their initialisation, shared by every trainable model of the crate: one
//! path from a `VarBuilder` (a checkpoint, or fresh `Var`s) to the tensors the layers hold, and one
//! seeded initialisation.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Init, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};

/// How one parameter is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InitRule {
    /// Every entry equal to this value.
    Const(f64),
    /// Normal with this standard deviation (TransformerLens `init_weights`).
    Normal(f64),
    /// Normal truncated to two standard deviations, rescaled so that the truncated distribution has
    /// this standard deviation (`jax.nn.initializers.variance_scaling(..., "truncated_normal")`).
    TruncatedNormal(f64),
}

impl InitRule {
    /// The unseeded `candle_nn` hint for a `VarBuilder` over a fresh `VarMap` (untruncated).
    fn hint(self) -> Init {
        match self {
            InitRule::Const(c) => Init::Const(c),
            InitRule::Normal(stdev) | InitRule::TruncatedNormal(stdev) => {
                Init::Randn { mean: 0.0, stdev }
            }
        }
    }
}

/// Std of a standard normal truncated to [-2, 2] (the constant of `jax.nn.initializers`).
const TRUNC_STD: f64 = 0.879_625_661_034_239_8;

/// A standard normal draw (Box-Muller on two uniforms); with `truncate`, redrawn until it lies in
/// [-2, 2].
fn standard_normal<R: Rng>(rng: &mut R, truncate: bool) -> f64 {
    loop {
        let u1: f64 = rng.gen::<f64>().max(f64::MIN_POSITIVE);
        let u2: f64 = rng.gen();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        if !truncate || z.abs() <= 2.0 {
            return z;
        }
    }
}

/// Seeded parameters: every tensor of `shapes`, in order, drawn from one ChaCha8 stream seeded
/// with `seed` by `rule(name)`.
///
/// # Shapes
/// One `f32` tensor per entry of `shapes`, of that shape, on `device`.
///
/// # Errors
/// Candle errors (allocation on the device).
pub fn seeded_tensors(
    shapes: Vec<(String, Vec<usize>)>,
    seed: u64,
    rule: impl Fn(&str) -> InitRule,
    device: &Device,
) -> Result<Vec<(String, Tensor)>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    shapes
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = match rule(&name) {
                InitRule::Const(c) => vec![c as f32; n],
                InitRule::Normal(std) => (0..n)
                    .map(|_| (standard_normal(&mut rng, false) * std) as f32)
                    .collect(),
                InitRule::TruncatedNormal(std) => (0..n)
                    .map(|_| (standard_normal(&mut rng, true) * std / TRUNC_STD) as f32)
                    .collect(),
            };
            Ok((name.clone(), Tensor::from_vec(data, shape, device)?))
        })
        .collect()
}

/// A `VarMap` holding `tensors` as trainable `Var`s on `device` (float32).
///
/// # Errors
/// Candle errors (device transfer); a poisoned lock.
pub fn varmap_from(
    tensors: impl IntoIterator<Item = (String, Tensor)>,
    device: &Device,
) -> Result<VarMap> {
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
    Ok(varmap)
}

/// Every parameter of a model by name: fetched once from a `VarBuilder`, checked to be float32.
#[derive(Debug, Clone)]
pub struct Params {
    /// By name.
    map: HashMap<String, Tensor>,
    /// In canonical order.
    ordered: Vec<(String, Tensor)>,
}

impl Params {
    /// Fetches every tensor of `shapes` from `vb` by name; over a fresh `VarMap`, missing tensors
    /// are created as `Var`s with the unseeded analogue of `rule`.
    ///
    /// # Shapes
    /// Each tensor must have the shape given with its name.
    ///
    /// # Errors
    /// Candle errors for a missing tensor or a shape mismatch; [`ModelError::Input`] for a dtype
    /// other than float32.
    pub fn fetch(
        vb: &VarBuilder,
        shapes: Vec<(String, Vec<usize>)>,
        rule: impl Fn(&str) -> InitRule,
    ) -> Result<Params> {
        let mut map = HashMap::with_capacity(shapes.len());
        let mut ordered = Vec::with_capacity(shapes.len());
        for (name, shape) in shapes {
            let t = vb.get_with_hints(shape, &name, rule(&name).hint())?;
            if t.dtype() != DType::F32 {
                return Err(ModelError::Input(format!(
                    "tensor `{name}` has dtype {:?}, expected f32",
                    t.dtype()
                )));
            }
            map.insert(name.clone(), t.clone());
            ordered.push((name, t));
        }
        Ok(Params { map, ordered })
    }

    /// The tensor called `name`.
    ///
    /// # Errors
    /// [`ModelError::Input`] naming a missing tensor.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        self.map
            .get(name)
            .cloned()
            .ok_or_else(|| ModelError::Input(format!("missing tensor `{name}`")))
    }

    /// Every parameter in canonical order.
    pub fn ordered(&self) -> &[(String, Tensor)] {
        &self.ordered
    }
}

/// Checks that `varmap` holds exactly the model's `n_params` parameter tensors (no extra tensor
/// was given to a `trainable_from_tensors`).
///
/// # Errors
/// [`ModelError::Input`] when the counts differ.
pub fn check_var_count(varmap: &VarMap, n_params: usize) -> Result<()> {
    let n = varmap.all_vars().len();
    if n != n_params {
        return Err(ModelError::Input(format!(
            "{n} tensors given, the config has {n_params} parameters"
        )));
    }
    Ok(())
}
