//! Native checkpoints: a directory with `config.json` ([`Config`]) and `model.safetensors` (every
//! parameter as `f32`, TransformerLens names and layouts, `docs/spec/models.md`, "Parameter names").
//!
//! Loading checks every tensor (present, shape, dtype f32, finite, no unexpected names) against the
//! config and reports the first problem naming the file and the tensor. Saving is atomic.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype as StDtype, SafeTensors};

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::transformer::Transformer;

/// File name of the configuration inside a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
/// File name of the weights inside a checkpoint directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The one safetensors writer of the crate: checks `tensors` against the `expected` names and
/// shapes (every one present, of its shape, finite; none extra) and serialises them as float32 with
/// the metadata `producer` plus `metadata`.
///
/// # Shapes
/// `tensors` must be exactly the `expected` names with the `expected` shapes (any order); they are
/// written in the `expected` order.
///
/// # Errors
/// [`ModelError::Tensor`] naming `path` and the tensor for a missing, misshapen or non-finite
/// tensor; [`ModelError::Checkpoint`] for an extra tensor or a serialisation failure.
pub(crate) fn weights_bytes(
    path: &Path,
    expected: &[(String, Vec<usize>)],
    tensors: &[(String, Tensor)],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>> {
    let given: HashMap<&str, &Tensor> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut host: Vec<(String, Tensor)> = Vec::with_capacity(expected.len());
    for (name, shape) in expected {
        let terr = |msg: String| ModelError::Tensor {
            path: path.to_path_buf(),
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
            path: path.to_path_buf(),
            msg: format!("unexpected tensors: {}", extra.join(", ")),
        });
    }
    let mut meta = HashMap::from([(
        "producer".to_string(),
        format!("hyperlens {}", env!("CARGO_PKG_VERSION")),
    )]);
    meta.extend(metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let bytes =
        safetensors::tensor::serialize(host.iter().map(|(n, t)| (n.as_str(), t)), Some(meta))
            .map_err(|e| ModelError::Checkpoint {
                path: path.to_path_buf(),
                msg: format!("cannot serialise: {e}"),
            })?;
    Ok(sorted_header(bytes))
}

/// The same safetensors bytes with the header's JSON keys in sorted order. safetensors writes the
/// `__metadata__` map in the iteration order of a `HashMap`, which changes from process to
/// process; sorted, two saves of the same weights are the same bytes. The header keeps its length
/// (the same entries, reordered; the padding is kept), so the data offsets are unchanged.
fn sorted_header(mut bytes: Vec<u8>) -> Vec<u8> {
    let Some(n) = bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(|b| u64::from_le_bytes(b) as usize)
        .filter(|&n| bytes.len() >= 8 + n)
    else {
        return bytes;
    };
    let header = &bytes[8..8 + n];
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(header) else {
        return bytes;
    };
    // serde_json's map is ordered by key, at every level.
    let Ok(sorted) = serde_json::to_vec(&value) else {
        return bytes;
    };
    if sorted.len() <= n {
        bytes[8..8 + sorted.len()].copy_from_slice(&sorted);
        bytes[8 + sorted.len()..8 + n].fill(b' ');
    }
    bytes
}

/// Saves a checkpoint directory. A new directory is written under a temporary name and renamed
/// into place; in an existing directory each file is written to `*.tmp` and renamed.
///
/// # Shapes
/// `tensors` must be exactly the tensors of [`Config::tensor_shapes`] (any order).
///
/// # Errors
/// [`ModelError::Config`] for an invalid config; [`ModelError::Tensor`] for a missing, misshapen
/// or non-finite tensor; [`ModelError::Io`] for file-system errors.
pub fn save(dir: &Path, config: &Config, tensors: &[(String, Tensor)]) -> Result<()> {
    config.check()?;
    let mixer = config.mixer.to_string();
    let weights = weights_bytes(
        &dir.join(WEIGHTS_FILE),
        &config.tensor_shapes(),
        tensors,
        &[("mixer", mixer.as_str())],
    )?;
    let mut config_json = serde_json::to_vec_pretty(config).map_err(|source| ModelError::Json {
        path: dir.join(CONFIG_FILE),
        source,
    })?;
    config_json.push(b'\n');
    write_checkpoint_dir(dir, &config_json, &weights)
}

/// Writes `config.json` and `model.safetensors` into `dir` atomically: a new directory is written
/// under a temporary name and renamed into place; in an existing directory each file is written to
/// `*.tmp` and renamed. Shared by the SRAVEN and token-model checkpoints.
///
/// # Errors
/// [`ModelError::Checkpoint`] for a path with no directory name; [`ModelError::Io`] for
/// file-system errors.
pub(crate) fn write_checkpoint_dir(dir: &Path, config_json: &[u8], weights: &[u8]) -> Result<()> {
    let write_atomic = |path: &Path, bytes: &[u8]| {
        hyperlens_io::write_atomic(path, bytes).map_err(|e| ModelError::Io {
            path: e.path().to_path_buf(),
            source: e.into(),
        })
    };
    let write_files = |d: &Path| {
        write_atomic(&d.join(WEIGHTS_FILE), weights)?;
        write_atomic(&d.join(CONFIG_FILE), config_json)
    };
    if dir.is_dir() {
        return write_files(dir);
    }
    let name = dir.file_name().ok_or_else(|| ModelError::Checkpoint {
        path: dir.to_path_buf(),
        msg: "not a valid directory name".into(),
    })?;
    let mut tmp_name = name.to_owned();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.with_file_name(tmp_name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    write_files(&tmp)?;
    std::fs::rename(&tmp, dir).map_err(io_err(dir))
}

/// Reads and validates `config.json` of a checkpoint directory.
///
/// # Errors
/// [`ModelError::Io`] if unreadable, [`ModelError::Json`] if malformed (e.g. an unknown mixer or
/// field), [`ModelError::Checkpoint`] if it fails [`Config::check`].
pub fn read_config(dir: &Path) -> Result<Config> {
    let path = dir.join(CONFIG_FILE);
    let text = hyperlens_io::read_regular_string(&path).map_err(io_err(&path))?;
    let config: Config = serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: path.clone(),
        source,
    })?;
    config.check().map_err(|e| ModelError::Checkpoint {
        path,
        msg: e.to_string(),
    })?;
    Ok(config)
}

/// The checks of `config.json` against the weights file that come before anything is built from
/// the config's sizes: the number of layers the weights hold (so that a config claiming 10^7
/// layers is refused before a table of 10^8 tensor names is made), and the mixer the weights were
/// saved with (their `mixer` metadata, written by [`save`]), which decides how they are read.
fn check_against_header(
    path: &Path,
    names: &[String],
    bytes: &[u8],
    config: &Config,
) -> Result<()> {
    let config_file = path.with_file_name(CONFIG_FILE);
    let layers: std::collections::BTreeSet<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix("blocks."))
        .filter_map(|rest| rest.split('.').next())
        .collect();
    if layers.len() != config.n_layers {
        return Err(ModelError::Checkpoint {
            path: config_file,
            msg: format!(
                "n_layers = {}, but {} holds the tensors of {} layer(s) (config and weights \
                 disagree)",
                config.n_layers,
                path.display(),
                layers.len()
            ),
        });
    }
    let saved_mixer = SafeTensors::read_metadata(bytes)
        .ok()
        .and_then(|(_, m)| m.metadata().as_ref()?.get("mixer").cloned());
    if let Some(saved) = saved_mixer {
        if saved != config.mixer.to_string() {
            return Err(ModelError::Checkpoint {
                path: config_file,
                msg: format!(
                    "mixer = {}, but {} was saved with mixer {saved} (its metadata); the weights \
                     would be run as the wrong model",
                    config.mixer,
                    path.display()
                ),
            });
        }
    }
    Ok(())
}

/// Validates safetensors bytes against `config` and returns the tensors on `device`.
///
/// Checks, in order: no tensor name appears twice in the header; the weights hold as many layers
/// as the config says and were saved with the config's mixer (their `mixer` metadata, if any);
/// then, in canonical order, every expected tensor is present, f32, of the shape the config
/// implies, and finite; then that no other tensor is present.
///
/// # Errors
/// [`ModelError::Checkpoint`] (not a safetensors file, e.g. truncated; naming `config.json` for a
/// layer count or mixer that contradicts the weights) or [`ModelError::Tensor`] naming `path` and
/// the tensor (also for a duplicate name).
pub fn validate_weights(
    path: &Path,
    bytes: &[u8],
    config: &Config,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let names = crate::st_header::tensor_names(path, bytes)?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| ModelError::Checkpoint {
        path: path.to_path_buf(),
        msg: format!("not a valid safetensors file: {e}"),
    })?;
    check_against_header(path, &names, bytes, config)?;
    let expected = config.tensor_shapes();
    let mut out = HashMap::with_capacity(expected.len());
    for (name, shape) in &expected {
        let terr = |msg: String| ModelError::Tensor {
            path: path.to_path_buf(),
            name: name.clone(),
            msg,
        };
        let view = st
            .tensor(name)
            .map_err(|_| terr(format!("missing (config.json implies shape {shape:?})")))?;
        if view.dtype() != StDtype::F32 {
            return Err(terr(format!("dtype {:?}, expected F32", view.dtype())));
        }
        if view.shape() != shape.as_slice() {
            return Err(terr(format!(
                "shape {:?}, but config.json implies {:?} (config and weights disagree)",
                view.shape(),
                shape
            )));
        }
        let data: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            let n_bad = data.iter().filter(|x| !x.is_finite()).count();
            return Err(terr(format!(
                "{n_bad} non-finite value(s), first {} at flat index {i}",
                data[i]
            )));
        }
        out.insert(
            name.clone(),
            Tensor::from_vec(data, shape.as_slice(), device)?,
        );
    }
    let mut extra: Vec<&str> = st
        .names()
        .into_iter()
        .filter(|n| !out.contains_key(*n))
        .collect();
    extra.sort_unstable();
    if let Some(name) = extra.first() {
        return Err(ModelError::Tensor {
            path: path.to_path_buf(),
            name: name.to_string(),
            msg: format!(
                "unexpected tensor ({} in all), not part of the model described by config.json \
                 ({} layers, mixer {})",
                extra.len(),
                config.n_layers,
                config.mixer
            ),
        });
    }
    Ok(out)
}

/// Loads and validates a checkpoint directory.
///
/// # Errors
/// As [`read_config`] and [`validate_weights`]; [`ModelError::Io`] if the weights are unreadable.
pub fn load(dir: &Path, device: &Device) -> Result<(Config, HashMap<String, Tensor>)> {
    let config = read_config(dir)?;
    let path = dir.join(WEIGHTS_FILE);
    let bytes = crate::st_header::read_weights_file(&path)?;
    let tensors = validate_weights(&path, &bytes, &config, device)?;
    Ok((config, tensors))
}

impl Transformer {
    /// Loads a checkpoint directory as a frozen model on `device`.
    ///
    /// # Errors
    /// As [`load`].
    pub fn load(dir: &Path, device: &Device) -> Result<Transformer> {
        let (config, tensors) = load(dir, device)?;
        Transformer::from_tensors(&config, tensors, device)
    }

    /// Saves the model as a checkpoint directory ([`save`]).
    ///
    /// # Errors
    /// As [`save`].
    pub fn save(&self, dir: &Path) -> Result<()> {
        save(dir, self.config(), self.named_tensors())
    }
}
