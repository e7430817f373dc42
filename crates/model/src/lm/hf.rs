//! Hugging Face checkpoint directories: `config.json` plus `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::store::TensorStore;
use crate::error::{ModelError, Result};

/// A parsed Hugging Face `config.json`, with typed look-ups whose errors name the file and key.
#[derive(Debug)]
pub(crate) struct HfConfig {
    pub(crate) path: PathBuf,
    pub(crate) json: serde_json::Map<String, Value>,
}

impl HfConfig {
    /// Reads `dir/config.json`.
    ///
    /// # Errors
    /// [`ModelError::Io`] / [`ModelError::Json`] naming the file, or [`ModelError::Checkpoint`] when
    /// it is not a JSON object.
    pub(crate) fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        match v {
            Value::Object(json) => Ok(Self { path, json }),
            _ => Err(ModelError::Checkpoint {
                path,
                msg: "expected a JSON object".into(),
            }),
        }
    }

    fn err(&self, key: &str, msg: &str) -> ModelError {
        ModelError::Checkpoint {
            path: self.path.clone(),
            msg: format!("key `{key}`: {msg}"),
        }
    }

    /// A non-negative integer; `None` when absent or null.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when present with another type.
    pub(crate) fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.err(key, "expected a non-negative integer")),
        }
    }

    /// A required non-negative integer.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when absent or of another type.
    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    /// A number; `None` when absent or null.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when present with another type.
    pub(crate) fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(key, "expected a number")),
        }
    }

    /// A boolean; `None` when absent or null.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when present with another type.
    pub(crate) fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(key, "expected a boolean")),
        }
    }

    /// A string; `None` when absent or null.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when present with another type.
    pub(crate) fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, "expected a string")),
        }
    }

    /// `model_type` and the `architectures` list, lower-cased, for kind detection.
    pub(crate) fn kind_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(Value::String(s)) = self.json.get("model_type") {
            out.push(s.to_lowercase());
        }
        if let Some(Value::Array(a)) = self.json.get("architectures") {
            out.extend(a.iter().filter_map(|v| v.as_str()).map(str::to_lowercase));
        }
        out
    }

    /// An unsupported-feature error naming the file.
    pub(crate) fn unsupported(&self, what: &str) -> ModelError {
        ModelError::Checkpoint {
            path: self.path.clone(),
            msg: format!("unsupported: {what}"),
        }
    }
}

/// Reads the weights of a Hugging Face directory: `model.safetensors`, or every shard named in
/// `model.safetensors.index.json` (`weight_map`).
///
/// # Errors
/// [`ModelError::Checkpoint`] naming the directory or file when no weights file is found or a file
/// cannot be parsed.
pub(crate) fn read_weights(dir: &Path) -> Result<TensorStore> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if single.is_file() {
        let mut store = TensorStore::new(&single);
        store.read_safetensors(&single)?;
        return Ok(store);
    }
    if !index.is_file() {
        return Err(ModelError::Checkpoint {
            path: dir.to_path_buf(),
            msg: "no model.safetensors or model.safetensors.index.json".into(),
        });
    }
    let text = std::fs::read_to_string(&index).map_err(|source| ModelError::Io {
        path: index.clone(),
        source,
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: index.clone(),
        source,
    })?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| ModelError::Checkpoint {
            path: index.clone(),
            msg: "no `weight_map` object".into(),
        })?;
    let mut files = BTreeSet::new();
    for (name, f) in map {
        let f = f.as_str().ok_or_else(|| ModelError::Checkpoint {
            path: index.clone(),
            msg: format!("weight_map entry `{name}` is not a file name"),
        })?;
        if f.contains('/') || f.contains('\\') || f.contains("..") {
            return Err(ModelError::Checkpoint {
                path: index.clone(),
                msg: format!("shard name `{f}` is not a plain file name"),
            });
        }
        files.insert(f.to_string());
    }
    let mut store = TensorStore::new(&index);
    for f in files {
        store.read_safetensors(&dir.join(f))?;
    }
    Ok(store)
}
