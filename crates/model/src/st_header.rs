//! Checks of a safetensors header that the `safetensors` crate does not make: a tensor name given
//! twice (the crate parses the header into a map, so the last entry silently wins), and the size of
//! a weights file against the memory budget before it is read.
//!
//! Format: 8 bytes little-endian header length `n`, then `n` bytes of JSON mapping tensor names
//! (and `__metadata__`) to their dtype, shape and offsets (the safetensors specification,
//! huggingface/safetensors README, "Format").

use std::fmt;
use std::path::Path;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::error::{ModelError, Result};

/// Collects the keys of a JSON object and refuses a repeated one.
struct UniqueKeys;

impl<'de> Visitor<'de> for UniqueKeys {
    type Value = std::result::Result<Vec<String>, String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object of tensors")
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut seen = std::collections::HashSet::new();
        let mut keys = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            map.next_value::<IgnoredAny>()?;
            if !seen.insert(key.clone()) {
                return Ok(Err(key));
            }
            keys.push(key);
        }
        Ok(Ok(keys))
    }
}

/// The tensor names of a safetensors file's header, in file order (without `__metadata__`).
///
/// # Errors
/// [`ModelError::Checkpoint`] naming `path` for a header that is not there or not JSON (the
/// `safetensors` crate reports the details later); [`ModelError::Tensor`] naming `path` and the
/// tensor for a name that appears twice.
pub fn tensor_names(path: &Path, bytes: &[u8]) -> Result<Vec<String>> {
    let bad = |msg: &str| ModelError::Checkpoint {
        path: path.to_path_buf(),
        msg: format!("not a valid safetensors file: {msg}"),
    };
    let len: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| bad("shorter than its 8-byte header length"))?;
    let n = u64::from_le_bytes(len);
    let end = 8u64
        .checked_add(n)
        .filter(|&e| e <= bytes.len() as u64)
        .ok_or_else(|| {
            bad(&format!(
                "the header claims {n} bytes, the file has {}",
                bytes.len()
            ))
        })?;
    let header = &bytes[8..end as usize];
    let mut de = serde_json::Deserializer::from_slice(header);
    let keys = (&mut de)
        .deserialize_map(UniqueKeys)
        .map_err(|e| bad(&format!("header: {e}")))?;
    match keys {
        Ok(mut keys) => {
            keys.retain(|k| k != "__metadata__");
            Ok(keys)
        }
        Err(dup) => Err(ModelError::Tensor {
            path: path.to_path_buf(),
            name: dup,
            msg: "appears twice in the header (duplicate tensor name)".into(),
        }),
    }
}

/// Reads a weights file after checking its size against the memory budget.
///
/// # Errors
/// [`ModelError::Io`] naming the file; [`ModelError::Checkpoint`] naming it when it is larger than
/// the memory budget allows.
pub fn read_weights_file(path: &Path) -> Result<Vec<u8>> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    hyperlens_io::budget::check_alloc("reading the weights", len as u128).map_err(|e| {
        ModelError::Checkpoint {
            path: path.to_path_buf(),
            msg: e.to_string(),
        }
    })?;
    std::fs::read(path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(&[0u8; 16]);
        b
    }

    #[test]
    fn names_in_order_and_duplicates_refused() {
        let p = Path::new("w.safetensors");
        let ok = file(
            r#"{"__metadata__":{"m":"x"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
        );
        assert_eq!(tensor_names(p, &ok).unwrap(), vec!["b", "a"]);
        let dup = file(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        );
        let e = tensor_names(p, &dup).unwrap_err().to_string();
        assert!(e.contains("`a`") && e.contains("twice"), "{e}");
        let mut short = ok.clone();
        short.truncate(20);
        assert!(tensor_names(p, &short).is_err());
        assert!(tensor_names(p, &[1, 2, 3]).is_err());
    }
}
