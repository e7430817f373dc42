//! Checking an `.npz` archive before reading it: every member's `.npy` header (numpy's format
//! specification, "NEP 1: A simple file format for NumPy arrays") is parsed and the size it claims
//! is compared with the bytes the archive really holds and with the memory budget, so that a file of
//! a few hundred bytes whose header claims 10^12 rows is refused instead of allocated.
//!
//! The readers of hyperlens (problem sets, code sets, imports) call [`inspect_npz`] first and only
//! then hand the archive to `ndarray-npy`.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::budget::{bytes_of, check_alloc};
use crate::error::{IoError, Result};

/// What the header of one `.npy` member of an archive says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyMember {
    /// The array name (the member name without `.npy`, as numpy reports it).
    pub name: String,
    /// numpy's type descriptor, e.g. `<f4`, `|u1`, `<i8`.
    pub descr: String,
    /// The array shape.
    ///
    /// # Shapes
    /// As stored; `[]` for a scalar.
    pub shape: Vec<usize>,
    /// Bytes of the data (element size times the number of elements).
    pub data_bytes: u128,
}

/// The bytes of one element of a simple numpy type descriptor (`<f4` -> 4).
fn item_size(descr: &str) -> Option<usize> {
    let body = descr.trim_start_matches(['<', '>', '|', '=']);
    let kind = body.chars().next()?;
    if !"biufcS".contains(kind) {
        return None;
    }
    body[1..].parse().ok().filter(|&n: &usize| n > 0)
}

fn invalid(path: &Path, array: &str, msg: String) -> IoError {
    IoError::Invalid {
        path: path.to_path_buf(),
        array: array.to_string(),
        msg,
    }
}

/// Parses an `.npy` header from `reader`; returns the descriptor, shape and header length.
fn read_header(
    path: &Path,
    name: &str,
    reader: &mut impl Read,
) -> Result<(String, Vec<usize>, u64)> {
    let err = |msg: &str| invalid(path, name, msg.to_string());
    let mut magic = [0u8; 8];
    reader
        .read_exact(&mut magic)
        .map_err(|_| err("not an .npy array (shorter than its header)"))?;
    if &magic[..6] != b"\x93NUMPY" {
        return Err(err("not an .npy array (no \\x93NUMPY magic)"));
    }
    let (len, prefix) = match magic[6] {
        1 => {
            let mut b = [0u8; 2];
            reader
                .read_exact(&mut b)
                .map_err(|_| err("truncated .npy header"))?;
            (u16::from_le_bytes(b) as u64, 10u64)
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            reader
                .read_exact(&mut b)
                .map_err(|_| err("truncated .npy header"))?;
            (u32::from_le_bytes(b) as u64, 12u64)
        }
        v => {
            return Err(invalid(
                path,
                name,
                format!("unknown .npy format version {v}"),
            ))
        }
    };
    // numpy itself refuses headers over 10,000 bytes unless asked; 1 MiB is generous.
    if len > 1 << 20 {
        return Err(invalid(
            path,
            name,
            format!("the .npy header claims {len} bytes"),
        ));
    }
    let mut text = vec![0u8; len as usize];
    reader
        .read_exact(&mut text)
        .map_err(|_| err("truncated .npy header"))?;
    let text = String::from_utf8_lossy(&text);
    let value: py_literal::Value = text
        .trim()
        .parse()
        .map_err(|e| invalid(path, name, format!("unreadable .npy header: {e}")))?;
    let py_literal::Value::Dict(entries) = value else {
        return Err(err("the .npy header is not a dictionary"));
    };
    let get = |key: &str| {
        entries.iter().find_map(|(k, v)| match k {
            py_literal::Value::String(s) if s == key => Some(v),
            _ => None,
        })
    };
    let descr = match get("descr") {
        Some(py_literal::Value::String(s)) => s.clone(),
        Some(_) => return Err(err("structured dtypes are not supported")),
        None => return Err(err("the .npy header has no `descr`")),
    };
    let shape = match get("shape") {
        Some(py_literal::Value::Tuple(dims)) => dims
            .iter()
            .map(|d| match d {
                py_literal::Value::Integer(i) => i.to_string().parse::<usize>().ok(),
                _ => None,
            })
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| err("the .npy shape is not a tuple of non-negative integers"))?,
        _ => return Err(err("the .npy header has no shape tuple")),
    };
    Ok((descr, shape, prefix + len))
}

/// Checks every member of the `.npz` at `path` and returns what their headers say.
///
/// For each member: the header parses; its element type is a simple numeric type; the data the
/// shape implies fit in the bytes the member holds (uncompressed size from the zip directory, and
/// for stored members the bytes present in the file); and the data fit the memory budget
/// ([`crate::budget`]).
///
/// # Errors
/// [`IoError::Io`] if the file cannot be read; [`IoError::Invalid`] naming the file and the array
/// for a broken archive or member, a size larger than the bytes present, or a size over the budget.
pub fn inspect_npz(path: &Path) -> Result<Vec<NpyMember>> {
    inspect_members(path, |_| true)
}

/// As [`inspect_npz`], but only for the members named in `arrays` (names without `.npy`): the
/// arrays a reader will read. The other members are not looked at, so an archive that also
/// carries arrays the reader ignores (a numpy unicode `<U5` or object array, notes, anything)
/// passes, as it does for `numpy.load`, which reads members only on access. Returns the checked
/// members, in archive order.
///
/// # Errors
/// As [`inspect_npz`], for the archive and the named members only.
pub fn inspect_npz_arrays(path: &Path, arrays: &[&str]) -> Result<Vec<NpyMember>> {
    inspect_members(path, |name| arrays.contains(&name))
}

/// [`inspect_npz`] on the members whose name `wanted` accepts.
fn inspect_members(path: &Path, wanted: impl Fn(&str) -> bool) -> Result<Vec<NpyMember>> {
    let file = File::open(path).map_err(IoError::io(path))?;
    let file_len = file.metadata().map_err(IoError::io(path))?.len();
    let mut zip = zip::ZipArchive::new(file).map_err(|e| {
        invalid(
            path,
            "(archive)",
            format!("not a readable .npz (zip) archive: {e}"),
        )
    })?;
    let mut out = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let mut entry = zip
            .by_index(i)
            .map_err(|e| invalid(path, "(archive)", format!("member {i}: {e}")))?;
        let raw = entry.name().to_string();
        let name = raw.strip_suffix(".npy").unwrap_or(&raw).to_string();
        if !wanted(&name) {
            continue;
        }
        let stored = entry.compression() == zip::CompressionMethod::Stored;
        let (size, compressed) = (entry.size(), entry.compressed_size());
        if compressed > file_len || (stored && size > file_len) {
            return Err(invalid(
                path,
                &name,
                format!(
                    "the archive says the member holds {size} bytes, but the file has only \
                     {file_len} (truncated or corrupt)"
                ),
            ));
        }
        let (descr, shape, header_len) = read_header(path, &name, &mut entry)?;
        let item = item_size(&descr)
            .ok_or_else(|| invalid(path, &name, format!("unsupported dtype `{descr}`")))?;
        let data_bytes = bytes_of(item, &shape);
        let needed = data_bytes.saturating_add(header_len as u128);
        if needed > size as u128 {
            return Err(invalid(
                path,
                &name,
                format!(
                    "the header claims shape {shape:?} of `{descr}` ({} bytes), but the member \
                     holds only {size} bytes (truncated or corrupt)",
                    data_bytes
                ),
            ));
        }
        check_alloc(format!("array `{name}` {shape:?} `{descr}`"), data_bytes)
            .map_err(|e| invalid(path, &name, e.to_string()))?;
        out.push(NpyMember {
            name,
            descr,
            shape,
            data_bytes,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn npz_with(
        header: &str,
        data: &[u8],
        compress: bool,
    ) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npz");
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        let method = if compress {
            zip::CompressionMethod::Deflated
        } else {
            zip::CompressionMethod::Stored
        };
        let opts = zip::write::SimpleFileOptions::default().compression_method(method);
        zip.start_file("x.npy", opts).unwrap();
        let mut h = header.as_bytes().to_vec();
        while !(10 + h.len() + 1).is_multiple_of(64) {
            h.push(b' ');
        }
        h.push(b'\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(h.len() as u16).to_le_bytes());
        bytes.extend_from_slice(&h);
        bytes.extend_from_slice(data);
        zip.write_all(&bytes).unwrap();
        zip.finish().unwrap();
        (dir, path)
    }

    #[test]
    fn an_honest_member_is_described() {
        let (_d, p) = npz_with(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            &[0u8; 24],
            false,
        );
        let m = inspect_npz(&p).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].name, "x");
        assert_eq!(m[0].shape, vec![2, 3]);
        assert_eq!(m[0].data_bytes, 24);
    }

    #[test]
    fn a_header_claiming_more_than_the_bytes_present_is_refused() {
        for compress in [false, true] {
            let (_d, p) = npz_with(
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 36, 8), }",
                &[0u8; 24],
                compress,
            );
            let e = inspect_npz(&p).unwrap_err().to_string();
            assert!(e.contains("array `x`") && e.contains("holds only"), "{e}");
            assert!(e.contains("a.npz"), "{e}");
        }
    }

    #[test]
    fn garbage_headers_are_errors() {
        for header in [
            "{'descr': '<f4', 'shape': (2, -3), }",
            "{'descr': [('a', '<f4')], 'shape': (2,), }",
            "{'descr': '<U4', 'shape': (2,), }",
            "not a dict",
            "{'descr': '<f4'}",
        ] {
            let (_d, p) = npz_with(header, &[0u8; 64], false);
            let e = inspect_npz(&p).unwrap_err().to_string();
            assert!(e.contains("array `x`"), "{header}: {e}");
        }
    }

    #[test]
    fn members_a_reader_does_not_read_are_not_looked_at() {
        // A unicode array: refused when read, ignored when not.
        let (_d, p) = npz_with(
            "{'descr': '<U5', 'fortran_order': False, 'shape': (2,), }",
            &[0u8; 40],
            false,
        );
        assert!(inspect_npz(&p).is_err());
        assert!(inspect_npz_arrays(&p, &["x"]).is_err());
        assert_eq!(inspect_npz_arrays(&p, &["y", "codes"]).unwrap(), vec![]);
        // A header claiming 10^12 rows: the same.
        let (_d, p) = npz_with(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }",
            &[0u8; 8],
            false,
        );
        assert!(inspect_npz_arrays(&p, &["x"]).is_err());
        assert!(inspect_npz_arrays(&p, &["notes"]).unwrap().is_empty());
    }
}
