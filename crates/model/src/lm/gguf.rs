//! Reading GGUF files (llama.cpp's format) into float32 tensors, and undoing the row permutation that
//! llama.cpp's converter applies to the query and key projections.
//!
//! Source: GGUF spec (<https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>), candle's
//! `quantized::gguf_file` reader, and `permute` in llama.cpp's `convert_hf_to_gguf.py`.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Tensor};

use super::store::TensorStore;
use crate::error::{ModelError, Result};

/// The metadata key-value table of a GGUF file, with the file's path for error messages.
#[derive(Debug)]
pub(crate) struct GgufMeta<'a> {
    pub(crate) path: &'a Path,
    pub(crate) map: HashMap<String, Value>,
}

impl<'a> GgufMeta<'a> {
    /// The metadata of the GGUF file at `path` (its tensors are not read).
    ///
    /// # Errors
    /// [`ModelError::Io`] / [`ModelError::Checkpoint`] naming the file when it cannot be opened or
    /// parsed.
    pub(crate) fn read(path: &'a Path) -> Result<GgufMeta<'a>> {
        let content = read_content(path, &mut open(path)?)?;
        Ok(GgufMeta {
            path,
            map: content.metadata,
        })
    }

    /// An error in the metadata entry `key`, naming the file.
    pub(crate) fn err(&self, key: &str, msg: &str) -> ModelError {
        ModelError::Checkpoint {
            path: self.path.to_path_buf(),
            msg: format!("metadata `{key}`: {msg}"),
        }
    }

    /// An integer value, whatever its stored width; `None` when absent.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when present but not a non-negative integer.
    pub(crate) fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        let v = match self.map.get(key) {
            None => return Ok(None),
            Some(v) => v,
        };
        let n: i128 = match v {
            Value::U8(x) => (*x).into(),
            Value::I8(x) => (*x).into(),
            Value::U16(x) => (*x).into(),
            Value::I16(x) => (*x).into(),
            Value::U32(x) => (*x).into(),
            Value::I32(x) => (*x).into(),
            Value::U64(x) => (*x).into(),
            Value::I64(x) => (*x).into(),
            _ => return Err(self.err(key, "expected an integer")),
        };
        usize::try_from(n)
            .map(Some)
            .map_err(|_| self.err(key, &format!("value {n} out of range")))
    }

    /// A required integer value.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when absent or not a non-negative integer.
    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    /// A float value; `None` when absent.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when present but not a float.
    pub(crate) fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(f64::from(*x))),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(_) => Err(self.err(key, "expected a float")),
        }
    }

    /// A string value; `None` when absent.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when present but not a string.
    pub(crate) fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(self.err(key, "expected a string")),
        }
    }

    /// A boolean value; `None` when absent.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when present but not a boolean.
    pub(crate) fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.err(key, "expected a boolean")),
        }
    }

    /// An array value, each item converted by `item` (`None` for an item of another type, named
    /// `what` in the error); `None` when absent.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when present but not an array, or an item is not `what`.
    fn array_opt<T>(
        &self,
        key: &str,
        what: &str,
        item: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<Vec<T>>> {
        let v = match self.map.get(key) {
            None => return Ok(None),
            Some(Value::Array(v)) => v,
            Some(_) => return Err(self.err(key, "expected an array")),
        };
        v.iter()
            .enumerate()
            .map(|(i, x)| item(x).ok_or_else(|| self.err(key, &format!("item {i} is not {what}"))))
            .collect::<Result<Vec<T>>>()
            .map(Some)
    }

    /// An array of strings; `None` when absent.
    ///
    /// # Errors
    /// As [`GgufMeta::array_opt`].
    pub(crate) fn strings_opt(&self, key: &str) -> Result<Option<Vec<String>>> {
        self.array_opt(key, "a string", |x| match x {
            Value::String(s) => Some(s.clone()),
            _ => None,
        })
    }

    /// An array of floats (float32 or float64); `None` when absent.
    ///
    /// # Errors
    /// As [`GgufMeta::array_opt`].
    pub(crate) fn floats_opt(&self, key: &str) -> Result<Option<Vec<f64>>> {
        self.array_opt(key, "a float", |x| match x {
            Value::F32(f) => Some(f64::from(*f)),
            Value::F64(f) => Some(*f),
            _ => None,
        })
    }

    /// An array of integers of any width up to 32 bits, or int64; `None` when absent.
    ///
    /// # Errors
    /// As [`GgufMeta::array_opt`].
    pub(crate) fn ints_opt(&self, key: &str) -> Result<Option<Vec<i64>>> {
        self.array_opt(key, "an integer", |x| match x {
            Value::I32(n) => Some(i64::from(*n)),
            Value::U32(n) => Some(i64::from(*n)),
            Value::I8(n) => Some(i64::from(*n)),
            Value::U8(n) => Some(i64::from(*n)),
            Value::I16(n) => Some(i64::from(*n)),
            Value::U16(n) => Some(i64::from(*n)),
            Value::I64(n) => Some(*n),
            _ => None,
        })
    }
}

/// Opens `path` for reading.
///
/// # Errors
/// [`ModelError::Io`] naming the file.
fn open(path: &Path) -> Result<BufReader<File>> {
    let file = File::open(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(BufReader::new(file))
}

/// The header (metadata and tensor table) of the GGUF file `path`, read from `reader`.
///
/// # Errors
/// [`ModelError::Checkpoint`] naming the file when it is not a readable GGUF file.
fn read_content(path: &Path, reader: &mut BufReader<File>) -> Result<Content> {
    Content::read(reader).map_err(|e| ModelError::Checkpoint {
        path: path.to_path_buf(),
        msg: format!("not a readable GGUF file: {e}"),
    })
}

/// Reads a GGUF file: its metadata and every tensor dequantised to float32 on the host.
///
/// Tensor shapes are given in the row-major (PyTorch) order: GGUF stores dimensions fastest-first
/// (`ne0` = input width), candle's reader reverses them, so a projection reads as [out, in].
///
/// # Errors
/// [`ModelError::Checkpoint`] naming the file when it cannot be opened or parsed;
/// [`ModelError::Tensor`] naming the file and tensor when a tensor cannot be read or dequantised.
pub(crate) fn read_gguf(path: &Path) -> Result<(GgufMeta<'_>, TensorStore)> {
    let mut reader = open(path)?;
    let content = read_content(path, &mut reader)?;
    let mut store = TensorStore::new(path);
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    for name in names {
        let terr = |e: candle_core::Error| ModelError::Tensor {
            path: path.to_path_buf(),
            name: name.clone(),
            msg: format!("cannot read or dequantise: {e}"),
        };
        let q = content
            .tensor(&mut reader, name, &Device::Cpu)
            .map_err(terr)?;
        let t = q.dequantize(&Device::Cpu).map_err(terr)?;
        store.insert(name.clone(), t, path);
    }
    Ok((
        GgufMeta {
            path,
            map: content.metadata,
        },
        store,
    ))
}

/// Undoes llama.cpp's permutation of query/key projection rows (GGUF layout -> Hugging Face layout).
///
/// `convert_hf_to_gguf.py` stores `W.reshape(n_heads, 2, d/2, D).swapaxes(1, 2).reshape(n_heads*d, D)`
/// so that llama.cpp can rotate adjacent pairs (GGML "normal" RoPE) where Hugging Face rotates the
/// two halves of each head (`rotate_half`). Element-wise, for head `h`, `i < d/2` and `j` in {0, 1}:
///
/// `gguf[h*d + 2*i + j, :] = hf[h*d + j*d/2 + i, :]`
///
/// This function applies the inverse: reshape to [n_heads, d/2, 2, D], swap axes 1 and 2, reshape.
/// For K, `n_heads` is the number of key/value heads.
///
/// # Shapes
/// `w` [n_heads * d, D] -> [n_heads * d, D]; `d` must be even.
///
/// # Errors
/// [`ModelError::Input`] when the row count is not `n_heads` times an even head width.
pub fn unpermute_qk_rows(w: &Tensor, n_heads: usize) -> Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    if n_heads == 0 || rows % n_heads != 0 || !(rows / n_heads).is_multiple_of(2) {
        return Err(ModelError::Input(format!(
            "cannot un-permute {rows} rows into {n_heads} heads of even width"
        )));
    }
    let half = rows / n_heads / 2;
    Ok(w.reshape((n_heads, half, 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))?)
}

/// Applies llama.cpp's permutation (Hugging Face layout -> GGUF layout), the inverse of
/// [`unpermute_qk_rows`]: reshape to [n_heads, 2, d/2, D], swap axes 1 and 2, reshape.
///
/// # Shapes
/// `w` [n_heads * d, D] -> [n_heads * d, D].
///
/// # Errors
/// [`ModelError::Input`] when the row count is not `n_heads` times an even head width.
pub fn permute_qk_rows(w: &Tensor, n_heads: usize) -> Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    if n_heads == 0 || rows % n_heads != 0 || !(rows / n_heads).is_multiple_of(2) {
        return Err(ModelError::Input(format!(
            "cannot permute {rows} rows into {n_heads} heads of even width"
        )));
    }
    let half = rows / n_heads / 2;
    Ok(w.reshape((n_heads, 2, half, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The element-wise statement of the permutation, on 3 heads of width 6 and 5 columns.
    #[test]
    fn unpermute_matches_the_index_formula_and_inverts_permute() {
        let (nh, d, cols) = (3usize, 6usize, 5usize);
        let hf: Vec<f32> = (0..nh * d * cols).map(|x| x as f32).collect();
        let hf_t = Tensor::from_vec(hf.clone(), (nh * d, cols), &Device::Cpu).unwrap();
        let g = permute_qk_rows(&hf_t, nh)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for h in 0..nh {
            for i in 0..d / 2 {
                for j in 0..2 {
                    for c in 0..cols {
                        assert_eq!(
                            g[h * d + 2 * i + j][c],
                            hf[(h * d + j * d / 2 + i) * cols + c]
                        );
                    }
                }
            }
        }
        let gt = Tensor::new(g, &Device::Cpu).unwrap();
        let back = unpermute_qk_rows(&gt, nh)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(back, hf);
        assert!(unpermute_qk_rows(&hf_t, 4).is_err());
    }
}
