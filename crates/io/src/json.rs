//! JSON outputs and provenance sidecars.
//!
//! A sidecar says what produced a data file (command, version, inputs, array shapes). The naming
//! rule is one for every writer: the data file's extension is replaced by `.json`, so `codes.npz`
//! has `codes.json` and `problems.npz` has `problems.json` ([`sidecar_path`]). Versions of
//! hyperlens before this rule wrote some sidecars as `<file>.npz.json`
//! ([`legacy_sidecar_path`]); [`read_sidecar`] still finds those.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::atomic::write_atomic;
use crate::error::{IoError, Result};

/// `value` as pretty-printed JSON with a final newline (the form every hyperlens JSON file has).
///
/// # Errors
/// [`IoError::Json`] naming `path` (the file the text is meant for) if `value` cannot be
/// serialised.
pub fn json_bytes<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| IoError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Writes `value` to `path` as pretty-printed JSON with a final newline, atomically.
///
/// # Errors
/// [`IoError::Json`] if `value` cannot be serialised, [`IoError::Io`] if the write fails.
pub fn write_json<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    write_atomic(path, &json_bytes(path, value)?)
}

/// `value` as [`json_bytes`] writes it, but with every object's keys in alphabetical order at
/// every depth, whatever the order in which its types declare their fields: the form of the files
/// that hyperlens first wrote as `serde_json` values (a report's and `analyze`'s `summary.json`),
/// kept byte for byte now that a typed struct describes them.
///
/// # Errors
/// [`IoError::Json`] naming `path` if `value` cannot be serialised.
pub fn json_bytes_sorted<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<Vec<u8>> {
    let value = serde_json::to_value(value).map_err(|source| IoError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    json_bytes(path, &value)
}

/// Writes `value` to `path` as [`json_bytes_sorted`] gives it, atomically.
///
/// # Errors
/// As [`json_bytes_sorted`] and [`write_atomic`].
pub fn write_json_sorted<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    write_atomic(path, &json_bytes_sorted(path, value)?)
}

/// The sidecar of a data file: its extension replaced by `.json` (`codes.npz` -> `codes.json`; a
/// name without extension gets `.json` appended).
pub fn sidecar_path(data: &Path) -> PathBuf {
    data.with_extension("json")
}

/// The sidecar name older versions wrote for some files: `.json` appended to the full name
/// (`problems.npz` -> `problems.npz.json`). Only readers use it.
pub fn legacy_sidecar_path(data: &Path) -> PathBuf {
    let mut s = data.as_os_str().to_owned();
    s.push(".json");
    PathBuf::from(s)
}

/// Writes the sidecar of `data` ([`sidecar_path`]) atomically and returns its path.
///
/// # Errors
/// As [`write_json`].
pub fn write_sidecar<T: Serialize + ?Sized>(data: &Path, value: &T) -> Result<PathBuf> {
    let path = sidecar_path(data);
    write_json(&path, value)?;
    Ok(path)
}

/// Reads the sidecar of `data` as `T` (its writer's type): [`sidecar_path`], else
/// [`legacy_sidecar_path`]; `None` if neither exists.
///
/// # Errors
/// [`IoError::Io`] if a sidecar exists but cannot be read, [`IoError::Json`] naming it if it is
/// not JSON or not a `T`.
pub fn read_sidecar<T: DeserializeOwned>(data: &Path) -> Result<Option<T>> {
    for path in [sidecar_path(data), legacy_sidecar_path(data)] {
        if path.is_file() {
            let bytes = std::fs::read(&path).map_err(IoError::io(&path))?;
            let value =
                serde_json::from_slice(&bytes).map_err(|source| IoError::Json { path, source })?;
            return Ok(Some(value));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_names_follow_one_rule() {
        assert_eq!(
            sidecar_path(Path::new("r/codes.npz")),
            Path::new("r/codes.json")
        );
        assert_eq!(sidecar_path(Path::new("p")), Path::new("p.json"));
        assert_eq!(
            legacy_sidecar_path(Path::new("r/p.npz")),
            Path::new("r/p.npz.json")
        );
    }

    #[test]
    fn sorted_json_orders_every_objects_keys() {
        #[derive(Serialize)]
        struct Inner {
            z: f64,
            a: Option<u8>,
        }
        #[derive(Serialize)]
        struct Outer {
            y: Vec<Inner>,
            b: &'static str,
        }
        let v = Outer {
            y: vec![Inner {
                z: f64::NAN,
                a: Some(1),
            }],
            b: "x",
        };
        let path = Path::new("s.json");
        let sorted = json_bytes_sorted(path, &v).unwrap();
        assert_eq!(
            String::from_utf8(sorted).unwrap(),
            "{\n  \"b\": \"x\",\n  \"y\": [\n    {\n      \"a\": 1,\n      \"z\": null\n    }\n  ]\n}\n"
        );
        let plain = String::from_utf8(json_bytes(path, &v).unwrap()).unwrap();
        assert!(plain.starts_with("{\n  \"y\""), "{plain}");
    }

    #[test]
    fn sidecars_are_read_under_both_names() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("p.npz");
        assert!(read_sidecar::<serde_json::Value>(&data).unwrap().is_none());
        std::fs::write(legacy_sidecar_path(&data), r#"{"old": 1}"#).unwrap();
        let old: serde_json::Value = read_sidecar(&data).unwrap().unwrap();
        assert_eq!(old["old"], 1);
        let written = write_sidecar(&data, &serde_json::json!({"new": 2})).unwrap();
        assert_eq!(written, dir.path().join("p.json"));
        let new: serde_json::Value = read_sidecar(&data).unwrap().unwrap();
        assert_eq!(new["new"], 2);
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Other {
            other: u8,
        }
        let e = read_sidecar::<Other>(&data).unwrap_err();
        assert!(
            matches!(&e, IoError::Json { path, .. } if *path == dir.path().join("p.json")),
            "{e}"
        );
        let text = std::fs::read_to_string(written).unwrap();
        assert!(text.ends_with("}\n"), "{text}");
    }
}
