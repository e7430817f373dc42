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

use candle_core::{DType, Device, Tensor};

use super::store::TensorStore;
use crate::checkpoint::{write_checkpoint_dir, CONFIG_FILE, WEIGHTS_FILE};
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
    let wpath = dir.join(WEIGHTS_FILE);
    let given: HashMap<&str, &Tensor> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut host: Vec<(String, Tensor)> = Vec::with_capacity(expected.len());
    for (name, shape) in expected {
        let terr = |msg: String| ModelError::Tensor {
            path: wpath.clone(),
            name: name.clone(),
            msg,
        };
        let t = given
            .get(name.as_str())
            .ok_or_else(|| terr("missing".into()))?;
        if t.dims() != shape.as_slice() {
            return Err(terr(format!("shape {:?}, expected {:?}", t.dims(), shape)));
        }
        let t = t
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .contiguous()?;
        let v = t.flatten_all()?.to_vec1::<f32>()?;
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(terr(format!(
                "refusing to save a non-finite value (flat index {i})"
            )));
        }
        host.push((name.clone(), t));
    }
    if given.len() != expected.len() {
        let known: std::collections::HashSet<&str> =
            expected.iter().map(|(n, _)| n.as_str()).collect();
        let extra: Vec<&str> = given
            .keys()
            .copied()
            .filter(|n| !known.contains(n))
            .collect();
        return Err(ModelError::Checkpoint {
            path: wpath,
            msg: format!("unexpected tensors: {}", extra.join(", ")),
        });
    }
    let weights = safetensors::tensor::serialize(
        host.iter().map(|(n, t)| (n.as_str(), t)),
        Some(HashMap::from([(
            "producer".to_string(),
            format!("hyperlens {}", env!("CARGO_PKG_VERSION")),
        )])),
    )
    .map_err(|e| ModelError::Checkpoint {
        path: wpath.clone(),
        msg: format!("cannot serialise: {e}"),
    })?;
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

/// Loads the weights of a checkpoint directory, checked against `expected`.
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
    expected: &[(String, Vec<usize>)],
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let wpath = dir.join(WEIGHTS_FILE);
    let mut store = TensorStore::new(&wpath);
    store.read_safetensors(&wpath)?;
    let mut out = HashMap::with_capacity(expected.len());
    for (name, shape) in expected {
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
