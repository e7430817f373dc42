//! `.npz` archives (the uncompressed layout `numpy.savez` writes), written atomically.

use std::path::Path;

use ndarray::{ArrayBase, Data, Dimension};
use ndarray_npy::{NpzWriter, WritableElement};

use crate::atomic::AtomicFile;
use crate::error::{IoError, Result};

/// An `.npz` archive being filled by [`write_npz`].
pub struct NpzArchive<'a> {
    writer: NpzWriter<&'a mut AtomicFile>,
    path: &'a Path,
}

impl NpzArchive<'_> {
    /// Adds `array` as `name.npy` (C order, little-endian).
    ///
    /// # Shapes
    /// Any; the shape is stored in the member's header.
    ///
    /// # Errors
    /// [`IoError::Npz`] naming the archive and the array.
    pub fn add<A, S, D>(&mut self, name: &str, array: &ArrayBase<S, D>) -> Result<()>
    where
        A: WritableElement,
        S: Data<Elem = A>,
        D: Dimension,
    {
        self.writer
            .add_array(name, array)
            .map_err(|source| IoError::Npz {
                path: self.path.to_path_buf(),
                array: name.to_string(),
                source,
            })
    }
}

/// Writes an uncompressed `.npz` archive to `path` atomically: `fill` adds the arrays (with
/// [`NpzArchive::add`]); the archive is committed if it returns `Ok` and discarded otherwise.
/// `numpy.load` and ndarray-npy read the result.
///
/// # Errors
/// The closure's error, or an [`IoError`] (converted into `E`) from creating, finishing or
/// committing the archive.
pub fn write_npz<E, F>(path: &Path, fill: F) -> std::result::Result<(), E>
where
    E: From<IoError>,
    F: FnOnce(&mut NpzArchive<'_>) -> std::result::Result<(), E>,
{
    let mut file = AtomicFile::create(path)?;
    {
        let mut archive = NpzArchive {
            writer: NpzWriter::new(&mut file),
            path,
        };
        fill(&mut archive)?;
        archive.writer.finish().map_err(|source| IoError::Npz {
            path: path.to_path_buf(),
            array: "(archive)".into(),
            source,
        })?;
    }
    file.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, Array1, Array2};
    use ndarray_npy::NpzReader;

    #[test]
    fn arrays_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npz");
        let a = array![[1.0f32, 2.0], [3.0, 4.0]];
        let b = array![1i64, -2, 3];
        write_npz::<IoError, _>(&p, |npz| {
            npz.add("a", &a)?;
            npz.add("b", &b)
        })
        .unwrap();
        let mut r = NpzReader::new(std::fs::File::open(&p).unwrap()).unwrap();
        let a2: Array2<f32> = r.by_name("a").unwrap();
        let b2: Array1<i64> = r.by_name("b.npy").unwrap();
        assert_eq!(a, a2);
        assert_eq!(b, b2);
    }

    #[test]
    fn a_failed_fill_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npz");
        let r = write_npz::<IoError, _>(&p, |npz| {
            npz.add("a", &array![1u8])?;
            Err(IoError::Io {
                path: p.clone(),
                source: std::io::Error::other("stop"),
            })
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
