//! Streaming `.npz` writer: arrays whose shapes are known up front are filled batch by batch, so that
//! memory is bounded by the batch, not by the number of rows.
//!
//! ndarray-npy writes whole arrays only. Here each array's data go to a temporary file beside the
//! output while batches arrive; `finish` then assembles an uncompressed zip (what `numpy.savez` writes)
//! with one `.npy` member per array (NPY format 1.0, little-endian, C order) through
//! `hyperlens_io::AtomicFile`, so the output appears atomically and `numpy.load` / ndarray-npy read
//! it.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::{ProbeError, Result};

/// Element types the writer supports, with their NPY descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpyDtype {
    /// `<f4`
    F32,
    /// `<i8`
    I64,
    /// `|b1`
    Bool,
}

impl NpyDtype {
    fn descr(self) -> &'static str {
        match self {
            NpyDtype::F32 => "<f4",
            NpyDtype::I64 => "<i8",
            NpyDtype::Bool => "|b1",
        }
    }
    fn size(self) -> u64 {
        match self {
            NpyDtype::F32 => 4,
            NpyDtype::I64 => 8,
            NpyDtype::Bool => 1,
        }
    }
}

struct Member {
    name: String,
    dtype: NpyDtype,
    shape: Vec<usize>,
    path: PathBuf,
    file: BufWriter<File>,
    written: u64,
}

/// An `.npz` file being written; see the module documentation.
pub struct NpzStream {
    out: PathBuf,
    dir: tempfile::TempDir,
    members: Vec<Member>,
}

/// Handle of one array of an [`NpzStream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayId(usize);

fn io_err(path: &Path, source: std::io::Error) -> ProbeError {
    ProbeError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl NpzStream {
    /// Starts an `.npz` at `out`; temporary data live in a directory beside it until [`finish`].
    ///
    /// # Errors
    /// [`ProbeError::Io`] if the directory of `out` is not writable.
    ///
    /// [`finish`]: NpzStream::finish
    pub fn create(out: &Path) -> Result<Self> {
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // The pid in the name lets the next run remove the staging folders of killed ones.
        hyperlens_io::sweep_stale(&parent, ".hyperlens-npz-", "");
        let dir = tempfile::Builder::new()
            .prefix(&format!(".hyperlens-npz-{}-", std::process::id()))
            .tempdir_in(&parent)
            .map_err(|e| io_err(&parent, e))?;
        Ok(Self {
            out: out.to_path_buf(),
            dir,
            members: Vec::new(),
        })
    }

    /// Declares an array `name` of element type `dtype` and final `shape`.
    ///
    /// # Errors
    /// [`ProbeError::Io`] if its temporary file cannot be created; [`ProbeError::InvalidInput`] for a
    /// duplicate name.
    pub fn add_array(&mut self, name: &str, dtype: NpyDtype, shape: &[usize]) -> Result<ArrayId> {
        if self.members.iter().any(|m| m.name == name) {
            return Err(ProbeError::InvalidInput(format!(
                "array {name} declared twice"
            )));
        }
        let path = self.dir.path().join(format!("{}.bin", self.members.len()));
        let file = File::create(&path).map_err(|e| io_err(&path, e))?;
        self.members.push(Member {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
            path,
            file: BufWriter::with_capacity(1 << 20, file),
            written: 0,
        });
        Ok(ArrayId(self.members.len() - 1))
    }

    fn write_bytes(&mut self, id: ArrayId, dtype: NpyDtype, n: usize, bytes: &[u8]) -> Result<()> {
        let m = self
            .members
            .get_mut(id.0)
            .ok_or_else(|| ProbeError::InvalidInput(format!("unknown array id {}", id.0)))?;
        if m.dtype != dtype {
            return Err(ProbeError::InvalidInput(format!(
                "array {} holds {:?}, got {:?} data",
                m.name, m.dtype, dtype
            )));
        }
        let capacity: u64 = m.shape.iter().map(|&d| d as u64).product();
        if m.written + n as u64 > capacity {
            return Err(ProbeError::InvalidInput(format!(
                "array {} of shape {:?} overfilled ({} + {} elements)",
                m.name, m.shape, m.written, n
            )));
        }
        m.file.write_all(bytes).map_err(|e| io_err(&m.path, e))?;
        m.written += n as u64;
        Ok(())
    }

    /// Appends `f32` elements (C order) to array `id`.
    ///
    /// # Errors
    /// Wrong element type, more elements than the declared shape holds, or an I/O failure.
    pub fn append_f32(&mut self, id: ArrayId, data: &[f32]) -> Result<()> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write_bytes(id, NpyDtype::F32, data.len(), &bytes)
    }

    /// Appends `i64` elements (C order) to array `id`.
    ///
    /// # Errors
    /// As [`NpzStream::append_f32`].
    pub fn append_i64(&mut self, id: ArrayId, data: &[i64]) -> Result<()> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write_bytes(id, NpyDtype::I64, data.len(), &bytes)
    }

    /// Appends booleans to array `id`.
    ///
    /// # Errors
    /// As [`NpzStream::append_f32`].
    pub fn append_bool(&mut self, id: ArrayId, data: &[bool]) -> Result<()> {
        let bytes: Vec<u8> = data.iter().map(|&b| b as u8).collect();
        self.write_bytes(id, NpyDtype::Bool, data.len(), &bytes)
    }

    /// Checks that every array is full, writes the zip to a temporary file and renames it to the
    /// output path.
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] if an array is not completely filled; I/O or zip failures.
    pub fn finish(mut self) -> Result<()> {
        for m in &mut self.members {
            let capacity: u64 = m.shape.iter().map(|&d| d as u64).product();
            if m.written != capacity {
                return Err(ProbeError::InvalidInput(format!(
                    "array {} of shape {:?} got {} of {} elements",
                    m.name, m.shape, m.written, capacity
                )));
            }
            m.file.flush().map_err(|e| io_err(&m.path, e))?;
        }
        let mut file = hyperlens_io::AtomicFile::create(&self.out)?;
        let tmp = file.temp_path().to_path_buf();
        {
            let mut zip = zip::ZipWriter::new(&mut file);
            for m in &self.members {
                let header = npy_header(m.dtype, &m.shape);
                let total = header.len() as u64 + m.written * m.dtype.size();
                let options = zip::write::SimpleFileOptions::default()
                    .compression_method(zip::CompressionMethod::Stored)
                    .large_file(total >= u32::MAX as u64);
                zip.start_file(format!("{}.npy", m.name), options)
                    .map_err(|e| ProbeError::Npz(format!("{}: {e}", self.out.display())))?;
                zip.write_all(&header).map_err(|e| io_err(&tmp, e))?;
                let mut src = File::open(&m.path).map_err(|e| io_err(&m.path, e))?;
                src.rewind().map_err(|e| io_err(&m.path, e))?;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = src.read(&mut buf).map_err(|e| io_err(&m.path, e))?;
                    if n == 0 {
                        break;
                    }
                    zip.write_all(&buf[..n]).map_err(|e| io_err(&tmp, e))?;
                }
            }
            zip.finish()
                .map_err(|e| ProbeError::Npz(format!("{}: {e}", self.out.display())))?;
        }
        file.commit()?;
        Ok(())
    }
}

/// NPY format 1.0 header for a C-order array, padded so that the data start at a multiple of 64 bytes.
fn npy_header(dtype: NpyDtype, shape: &[usize]) -> Vec<u8> {
    let shape_str = match shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        dtype.descr(),
        shape_str
    );
    // magic (6) + version (2) + length (2) + dict + '\n' must be a multiple of 64.
    let unpadded = 10 + dict.len() + 1;
    let pad = (64 - unpadded % 64) % 64;
    dict.push_str(&" ".repeat(pad));
    dict.push('\n');
    let mut out = Vec::with_capacity(10 + dict.len());
    out.extend_from_slice(b"\x93NUMPY");
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array1, Array3};
    use ndarray_npy::NpzReader;

    #[test]
    fn streamed_arrays_read_back_with_ndarray_npy() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| io_err(Path::new("tmp"), e))?;
        let out = dir.path().join("codes.npz");
        let mut w = NpzStream::create(&out)?;
        let a = w.add_array("codes", NpyDtype::F32, &[7, 3, 5])?;
        let b = w.add_array("label", NpyDtype::I64, &[7])?;
        let c = w.add_array("correct", NpyDtype::Bool, &[7])?;
        let full: Vec<f32> = (0..105).map(|i| i as f32 * 0.5 - 3.0).collect();
        // Three uneven batches.
        for (lo, hi) in [(0, 2), (2, 6), (6, 7)] {
            w.append_f32(a, &full[lo * 15..hi * 15])?;
            let labels: Vec<i64> = (lo..hi).map(|i| i as i64 - 2).collect();
            w.append_i64(b, &labels)?;
            let flags: Vec<bool> = (lo..hi).map(|i| i % 2 == 0).collect();
            w.append_bool(c, &flags)?;
        }
        w.finish()?;
        let mut r = NpzReader::new(File::open(&out).map_err(|e| io_err(&out, e))?)
            .map_err(|e| ProbeError::Npz(e.to_string()))?;
        let codes: Array3<f32> = r
            .by_name("codes.npy")
            .map_err(|e| ProbeError::Npz(e.to_string()))?;
        assert_eq!(codes.shape(), &[7, 3, 5]);
        assert_eq!(codes[[4, 2, 1]], full[4 * 15 + 2 * 5 + 1]);
        let label: Array1<i64> = r
            .by_name("label.npy")
            .map_err(|e| ProbeError::Npz(e.to_string()))?;
        assert_eq!(label.to_vec(), vec![-2, -1, 0, 1, 2, 3, 4]);
        let correct: Array1<bool> = r
            .by_name("correct.npy")
            .map_err(|e| ProbeError::Npz(e.to_string()))?;
        assert_eq!(
            correct.to_vec(),
            vec![true, false, true, false, true, false, true]
        );
        Ok(())
    }

    #[test]
    fn incomplete_or_overfilled_arrays_are_errors() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| io_err(Path::new("tmp"), e))?;
        let out = dir.path().join("x.npz");
        let mut w = NpzStream::create(&out)?;
        let a = w.add_array("a", NpyDtype::F32, &[2, 2])?;
        assert!(w.append_f32(a, &[0.0; 5]).is_err());
        assert!(w.append_i64(a, &[1]).is_err());
        w.append_f32(a, &[1.0; 3])?;
        assert!(w.finish().is_err());
        assert!(!out.exists());
        Ok(())
    }

    #[test]
    fn header_is_aligned() {
        for shape in [vec![], vec![3], vec![51200, 4, 16, 1, 2]] {
            let h = npy_header(NpyDtype::F32, &shape);
            assert_eq!(h.len() % 64, 0);
            assert_eq!(*h.last().unwrap_or(&0), b'\n');
        }
    }
}
