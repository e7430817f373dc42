//! Named float32 tensors read from one checkpoint, with checked look-ups whose errors name the file
//! and the tensor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};

/// The tensors of one checkpoint (a GGUF file, a safetensors file or a sharded safetensors
/// directory), kept on the host until a checked [`TensorStore::take`] moves one to the model device.
#[derive(Debug)]
pub(crate) struct TensorStore {
    /// The checkpoint (file or directory) named in errors about missing tensors.
    path: PathBuf,
    /// The file each tensor came from, for errors about a tensor that is present.
    sources: HashMap<String, PathBuf>,
    tensors: HashMap<String, Tensor>,
}

impl TensorStore {
    /// An empty store for the checkpoint at `path`.
    pub(crate) fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            sources: HashMap::new(),
            tensors: HashMap::new(),
        }
    }

    /// Adds a tensor read from `file`.
    pub(crate) fn insert(&mut self, name: String, tensor: Tensor, file: &Path) {
        self.sources.insert(name.clone(), file.to_path_buf());
        self.tensors.insert(name, tensor);
    }

    /// Reads every tensor of a safetensors file (any float dtype) into the store.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] naming `file` when it cannot be read or parsed or is larger than
    /// the memory budget; [`ModelError::Tensor`] for a tensor name that appears twice.
    pub(crate) fn read_safetensors(&mut self, file: &Path) -> Result<()> {
        if !file.is_file() {
            return Err(ModelError::Checkpoint {
                path: file.to_path_buf(),
                msg: "file not found".into(),
            });
        }
        let bytes = crate::st_header::read_weights_file(file)?;
        crate::st_header::tensor_names(file, &bytes)?;
        let map = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| {
            ModelError::Checkpoint {
                path: file.to_path_buf(),
                msg: format!("cannot read safetensors: {e}"),
            }
        })?;
        for (name, t) in map {
            self.insert(name, t, file);
        }
        Ok(())
    }

    /// The number of distinct layers `l` among the tensor names `{prefix}{l}.*` (e.g. `blocks.`,
    /// `h.`, `model.layers.`): what the weights say about the depth, to check a config's layer
    /// count against before anything is sized by it.
    pub(crate) fn layer_count(&self, prefix: &str) -> usize {
        self.tensors
            .keys()
            .filter_map(|n| n.strip_prefix(prefix))
            .filter_map(|rest| rest.split('.').next())
            .filter(|l| l.parse::<usize>().is_ok())
            .collect::<std::collections::HashSet<_>>()
            .len()
    }

    /// The checkpoint this store was read from.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a tensor called `name` is present.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The shape of tensor `name`.
    ///
    /// # Errors
    /// [`ModelError::Tensor`] when it is missing.
    pub(crate) fn dims(&self, name: &str) -> Result<Vec<usize>> {
        match self.tensors.get(name) {
            Some(t) => Ok(t.dims().to_vec()),
            None => Err(self.missing(name)),
        }
    }

    fn missing(&self, name: &str) -> ModelError {
        ModelError::Tensor {
            path: self.path.clone(),
            name: name.to_string(),
            msg: "missing".into(),
        }
    }

    fn source(&self, name: &str) -> PathBuf {
        self.sources
            .get(name)
            .cloned()
            .unwrap_or_else(|| self.path.clone())
    }

    /// Removes tensor `name`, checks that its shape is `dims` and that every value is finite, converts
    /// it to float32 and moves it to `device`.
    ///
    /// # Shapes
    /// The returned tensor has shape `dims`.
    ///
    /// # Errors
    /// [`ModelError::Tensor`] naming the file and tensor when it is missing, has another shape, a
    /// non-float dtype, or holds NaN / infinite values.
    pub(crate) fn take(&mut self, name: &str, dims: &[usize], device: &Device) -> Result<Tensor> {
        let t = self
            .tensors
            .remove(name)
            .ok_or_else(|| self.missing(name))?;
        let err = |msg: String| ModelError::Tensor {
            path: self.source(name),
            name: name.to_string(),
            msg,
        };
        if t.dims() != dims {
            return Err(err(format!("shape {:?}, expected {:?}", t.dims(), dims)));
        }
        match t.dtype() {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {}
            other => return Err(err(format!("dtype {other:?}, expected a float dtype"))),
        }
        let t = t.to_dtype(DType::F32).map_err(|e| err(e.to_string()))?;
        let values = t
            .flatten_all()
            .and_then(|f| f.to_vec1::<f32>())
            .map_err(|e| err(e.to_string()))?;
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(err(format!(
                "non-finite value {} at flat index {i}",
                values[i]
            )));
        }
        drop(values);
        t.to_device(device).map_err(|e| err(e.to_string()))
    }

    /// Like [`TensorStore::take`], but `Ok(None)` when the tensor is absent.
    ///
    /// # Errors
    /// As [`TensorStore::take`] for a tensor that is present.
    pub(crate) fn take_opt(
        &mut self,
        name: &str,
        dims: &[usize],
        device: &Device,
    ) -> Result<Option<Tensor>> {
        if self.contains(name) {
            self.take(name, dims, device).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Names of the tensors not taken yet, sorted.
    pub(crate) fn remaining(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tensors.keys().cloned().collect();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_checks_presence_shape_and_finiteness() {
        let mut s = TensorStore::new(Path::new("ckpt.safetensors"));
        let dev = Device::Cpu;
        s.insert(
            "a".into(),
            Tensor::zeros((2, 3), DType::F32, &dev).unwrap(),
            Path::new("f1"),
        );
        s.insert(
            "b".into(),
            Tensor::new(&[1.0f32, f32::NAN], &dev).unwrap(),
            Path::new("f2"),
        );
        s.insert(
            "c".into(),
            Tensor::new(&[1u32, 2], &dev).unwrap(),
            Path::new("f3"),
        );
        let e = s.take("a", &[3, 2], &dev).unwrap_err().to_string();
        assert!(
            e.contains("f1") && e.contains("`a`") && e.contains("[2, 3]"),
            "{e}"
        );
        let e = s.take("b", &[2], &dev).unwrap_err().to_string();
        assert!(e.contains("f2") && e.contains("non-finite"), "{e}");
        let e = s.take("c", &[2], &dev).unwrap_err().to_string();
        assert!(e.contains("dtype"), "{e}");
        let e = s.take("zz", &[2], &dev).unwrap_err().to_string();
        assert!(
            e.contains("ckpt.safetensors") && e.contains("`zz`") && e.contains("missing"),
            "{e}"
        );
        assert!(s.take_opt("zz", &[1], &dev).unwrap().is_none());
        assert!(s.remaining().is_empty());
    }
}
