//! `hyperlens info`'s description of a checkpoint: its config, its mixer's parts, its parameter
//! count and the statistics of every tensor.

use std::path::Path;

use candle_core::Device;
use hyperlens_model::{checkpoint, Config};
use serde::Serialize;

use crate::error::Result;

/// The statistics of one tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorStats {
    /// The tensor's name in `model.safetensors`.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its number of elements.
    pub numel: usize,
    /// The mean of its elements (in f64).
    pub mean: f64,
    /// Their population standard deviation (divided by `numel`).
    pub std: f64,
    /// The largest absolute value.
    pub max_abs: f64,
}

impl TensorStats {
    /// The statistics of the values `v` of the tensor `name` of shape `shape` (a tensor without
    /// elements has NaN mean and std, and `max_abs` 0).
    pub fn of(name: String, shape: Vec<usize>, v: &[f32]) -> TensorStats {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        let max_abs = v.iter().fold(0.0f64, |m, &x| m.max((x as f64).abs()));
        TensorStats {
            name,
            shape,
            numel: v.len(),
            mean,
            std: var.sqrt(),
            max_abs,
        }
    }
}

/// A checkpoint described (`hyperlens info`; its `--json` form is this record's).
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointInfo {
    /// The checkpoint directory, as given.
    pub checkpoint: std::path::PathBuf,
    /// Its config.
    pub config: Config,
    /// The CLI name of the mixer's normalisation.
    pub normalisation: &'static str,
    /// The CLI name of the mixer's value network.
    pub value_network: &'static str,
    /// The number of parameters.
    pub n_params: usize,
    /// Every tensor, in the config's order ([`Config::tensor_shapes`]).
    pub tensors: Vec<TensorStats>,
}

/// Describes the checkpoint in `dir` (`config.json` + `model.safetensors`), read on the CPU.
///
/// # Errors
/// A missing or invalid checkpoint (naming the file and tensor); a tensor that cannot be read as
/// f32.
pub fn checkpoint_info(dir: &Path) -> Result<CheckpointInfo> {
    let (config, tensors) = checkpoint::load(dir, &Device::Cpu)?;
    let mut rows = Vec::new();
    for (name, shape) in config.tensor_shapes() {
        let v: Vec<f32> = tensors[&name].flatten_all()?.to_vec1()?;
        rows.push(TensorStats::of(name, shape, &v));
    }
    Ok(CheckpointInfo {
        checkpoint: dir.to_path_buf(),
        normalisation: config.mixer.normalisation().name(),
        value_network: config.mixer.value_network().name(),
        n_params: config.n_params(),
        config,
        tensors: rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_match_their_definitions() {
        let s = TensorStats::of("w".into(), vec![2, 2], &[1.0, -3.0, 2.0, 4.0]);
        assert_eq!(s.numel, 4);
        assert_eq!(s.mean, 1.0);
        // Deviations 0, -4, 1, 3: squares 0, 16, 1, 9 -> variance 26 / 4.
        assert!((s.std - (26.0f64 / 4.0).sqrt()).abs() < 1e-12);
        assert_eq!(s.max_abs, 4.0);
    }
}
