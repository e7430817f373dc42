//! Generic checked checkpoint directories: `config.json` plus `model.safetensors` holding exactly a
//! given list of named float32 tensors. Any model whose parameters can be listed as
//! `(name, shape)` pairs can use these two functions.
//!
//! Loading checks, in the listed order, that every tensor is present, of the listed shape, a float
//! dtype (converted to f32) and finite, then that no other tensor is present; the first problem is
//! reported naming the file and tensor. Saving checks the same and writes atomically (a new
//! directory under a temporary name then renamed; in an existing directory, each file via `*.tmp`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::store::TensorStore;
use crate::checkpoint::{weights_bytes, write_checkpoint_dir, CONFIG_FILE, WEIGHTS_FILE};
use crate::error::{ModelError, Result};

/// Saves `tensors` and `config` as a checkpoint directory.
///
/// # Shapes
/// `tensors` must be exactly the `expected` names with the `expected` shapes (any order).
///
/// # Errors
/// [`ModelError::Tensor`] naming the weights file and tensor for a missing, misshapen or
/// non-finite tensor; [`ModelError::Checkpoint`] for an extra tensor; [`ModelError::Io`] for
/// file-system errors.
pub fn save_dir(
    dir: &Path,
    config: &serde_json::Value,
    expected: &[(String, Vec<usize>)],
    tensors: &[(String, Tensor)],
) -> Result<()> {
    let weights = weights_bytes(&dir.join(WEIGHTS_FILE), expected, tensors, &[])?;
    let mut cfg = serde_json::to_vec_pretty(config).map_err(|source| ModelError::Json {
        path: dir.join(CONFIG_FILE),
        source,
    })?;
    cfg.push(b'\n');
    write_checkpoint_dir(dir, &cfg, &weights)
}

/// Reads `config.json` of a checkpoint directory as JSON.
///
/// # Errors
/// [`ModelError::Io`] / [`ModelError::Json`] naming the file.
pub fn read_config_json(dir: &Path) -> Result<serde_json::Value> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ModelError::Json { path, source })
}

/// Loads the weights of a checkpoint directory, checked against `expected` (called only once the
/// weights are known to hold `n_layers` layers, so that a config's layer count is never trusted
/// before it is checked).
///
/// # Shapes
/// Returns exactly the `expected` tensors, as float32 on `device`.
///
/// # Errors
/// [`ModelError::Checkpoint`] when the weights file is missing or not safetensors, or holds an
/// unexpected tensor; [`ModelError::Tensor`] naming the file and tensor when one is missing, of
/// another shape, not a float dtype or not finite.
pub fn load_dir(
    dir: &Path,
    n_layers: usize,
    expected: impl FnOnce() -> Vec<(String, Vec<usize>)>,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let wpath = dir.join(WEIGHTS_FILE);
    let mut store = TensorStore::new(&wpath);
    store.read_safetensors(&wpath)?;
    let held = store.layer_count("blocks.");
    if held != n_layers {
        return Err(ModelError::Checkpoint {
            path: dir.join(CONFIG_FILE),
            msg: format!(
                "n_layers = {n_layers}, but {} holds the tensors of {held} layer(s) (config and \
                 weights disagree)",
                wpath.display()
            ),
        });
    }
    let expected = expected();
    let mut out = HashMap::with_capacity(expected.len());
    for (name, shape) in &expected {
        out.insert(name.clone(), store.take(name, shape, device)?);
    }
    let extra = store.remaining();
    if let Some(first) = extra.first() {
        return Err(ModelError::Tensor {
            path: wpath,
            name: first.clone(),
            msg: format!(
                "unexpected tensor ({} in all) not described by config.json",
                extra.len()
            ),
        });
    }
    Ok(out)
}
