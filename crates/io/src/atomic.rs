//! Atomic file writes: the data go to a temporary file in the target's directory, which is flushed,
//! synced to disk (`fsync`) and renamed over the target; the directory is then synced too, so that
//! the rename itself survives a crash. A reader sees the old file or the complete new one, never a
//! half-written one, and a failed write leaves no temporary file behind.
//!
//! This is the usual recipe for crash-safe replacement of a file on POSIX systems (write, `fsync`,
//! `rename`, `fsync` of the directory; e.g. the `atomicwrites` and `tempfile` documentation).

use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use crate::error::{IoError, Result};

/// A file being written atomically: create it with [`AtomicFile::create`], write through its
/// [`Write`] (and [`Seek`]) implementation, then [`AtomicFile::commit`]. Dropping it without a
/// commit removes the temporary file and leaves the target untouched.
///
/// The temporary file is `.<name>.<pid>.<random>.tmp` in the target's directory (so that the
/// rename does not cross file systems); it is created with the permissions an ordinary new file
/// gets (`0o666` less the umask on Unix). Creating one first removes the temporary files of the
/// same target left by writers that were killed ([`sweep_stale`]: pid no longer alive).
#[derive(Debug)]
pub struct AtomicFile {
    writer: BufWriter<NamedTempFile>,
    target: PathBuf,
}

impl AtomicFile {
    /// Starts writing `path`. Its directory must exist.
    ///
    /// # Errors
    /// [`IoError::Io`] naming `path` (and its directory) if the temporary file cannot be created.
    pub fn create(path: &Path) -> Result<Self> {
        let dir = parent_dir(path);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The writer's pid is part of the name, so that the next write of the same file can tell
        // the leftovers of a killed writer (pid gone) from a live one's, and remove them.
        let prefix = format!(".{name}.{}.", std::process::id());
        sweep_stale(&dir, &format!(".{name}."), ".tmp");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            builder.permissions(std::fs::Permissions::from_mode(0o666));
        }
        let shown = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &dir
        };
        // The error names the file asked for; the temporary name would only confuse.
        let file = builder.tempfile_in(&dir).map_err(|e| IoError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                e.kind(),
                format!("cannot create a file in {} ({})", shown.display(), e.kind()),
            ),
        })?;
        Ok(Self {
            writer: BufWriter::with_capacity(1 << 16, file),
            target: path.to_path_buf(),
        })
    }

    /// The final path of the file.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The temporary file's path, for writers that insist on opening a path themselves (e.g.
    /// candle's safetensors writer). Whatever they write there is what [`AtomicFile::commit`]
    /// renames into place; do not mix this with writes through `self`.
    pub fn temp_path(&self) -> &Path {
        self.writer.get_ref().path()
    }

    /// Flushes and syncs the data, renames the temporary file over the target and syncs the
    /// target's directory.
    ///
    /// # Errors
    /// [`IoError::Io`] naming the file (or directory) whose flush, sync or rename failed; the
    /// temporary file is removed and the target is untouched, except when only the final
    /// directory sync fails (the new file is then in place).
    pub fn commit(self) -> Result<()> {
        let Self { writer, target } = self;
        let tmp = writer.get_ref().path().to_path_buf();
        let file = writer.into_inner().map_err(|e| IoError::Io {
            path: tmp.clone(),
            source: e.into_error(),
        })?;
        file.as_file().sync_all().map_err(IoError::io(&tmp))?;
        file.persist(&target).map_err(|e| IoError::Io {
            path: target.clone(),
            source: e.error,
        })?;
        sync_dir(&parent_dir(&target))
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.writer.flush()
    }
}

impl Seek for AtomicFile {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.writer.seek(pos)
    }
}

/// Whether process `pid` is alive on this machine (Linux: `/proc/<pid>` exists); `true` where that
/// cannot be told (no `/proc`: other systems, or a container without it), so that sweeps based on
/// it never remove anything of a live writer.
pub fn pid_alive(pid: u32) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the leftovers of killed writers in `dir`: entries named `{prefix}{pid}{rest}{suffix}`
/// (files or directories) whose `pid` is no longer alive on this machine. Entries of live
/// processes, and names that do not carry a pid, are left alone; failures are ignored (a sweep is
/// housekeeping, never a reason to fail a write).
pub fn sweep_stale(dir: &Path, prefix: &str, suffix: &str) {
    let shown = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(shown) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        if !name.ends_with(suffix) {
            continue;
        }
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = digits.parse::<u32>() else {
            continue;
        };
        if pid != std::process::id() && !pid_alive(pid) {
            let p = e.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}

/// The directory a relative or absolute file path lives in (`""` for a bare file name).
fn parent_dir(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Syncs a directory (`fsync`) so that the creations, renames and removals of entries inside it
/// are durable. A no-op where directories cannot be opened (Windows) or where the file system does
/// not support syncing them (`EINVAL`). `""` means the current directory.
///
/// # Errors
/// [`IoError::Io`] naming the directory if it cannot be opened or synced.
pub fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let handle = std::fs::File::open(dir).map_err(IoError::io(dir))?;
        match handle.sync_all() {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
            other => other.map_err(IoError::io(dir)),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Writes `bytes` to `path` atomically (see the module documentation).
///
/// # Errors
/// [`IoError::Io`] naming the file or directory that failed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes).map_err(IoError::io(path))?;
    file.commit()
}

/// Writes `path` atomically through a closure: `write` fills the (buffered) temporary file, which
/// is committed if it returns `Ok`, and removed otherwise.
///
/// # Errors
/// The closure's error, or an [`IoError`] (converted into `E`) from creating or committing the
/// file.
pub fn write_atomic_with<E, F>(path: &Path, write: F) -> std::result::Result<(), E>
where
    E: From<IoError>,
    F: FnOnce(&mut AtomicFile) -> std::result::Result<(), E>,
{
    let mut file = AtomicFile::create(path)?;
    write(&mut file)?;
    file.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_and_replaces_without_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.txt");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(names(dir.path()), ["a.txt"]);
    }

    #[cfg(unix)]
    #[test]
    fn new_files_get_ordinary_permissions() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.txt");
        write_atomic(&p, b"x").unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        // 0o666 less some umask: readable by the group at least unless the umask forbids it.
        assert_ne!(mode & 0o600, 0, "{mode:o}");
        assert_eq!(mode & 0o111, 0, "{mode:o}");
    }

    #[test]
    fn a_failed_closure_leaves_the_target_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.txt");
        write_atomic(&p, b"old").unwrap();
        let r: std::result::Result<(), IoError> = write_atomic_with(&p, |f| {
            f.write_all(b"half").map_err(IoError::io(&p))?;
            Err(IoError::io(&p)(std::io::Error::other("boom")))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["a.txt"]);
    }

    #[test]
    fn a_missing_directory_is_named_with_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("no/such/a.txt");
        let e = write_atomic(&p, b"x").unwrap_err();
        assert!(e.path().ends_with("no/such/a.txt"), "{e}");
        let cause = std::error::Error::source(&e).map(|c| c.to_string());
        assert!(
            cause.as_deref().is_some_and(|c| c.contains("no/such (")),
            "{cause:?}"
        );
    }

    #[test]
    fn leftovers_of_dead_writers_are_swept_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npz");
        // 4194304 is above Linux's largest pid (2^22), so no process has it.
        let dead = dir.path().join(".a.npz.4194304.x1y2.tmp");
        let live = dir
            .path()
            .join(format!(".a.npz.{}.keep.tmp", std::process::id()));
        let other = dir.path().join(".b.npz.4194304.zz.tmp");
        for f in [&dead, &live, &other] {
            std::fs::write(f, b"partial").unwrap();
        }
        write_atomic(&p, b"x").unwrap();
        if Path::new("/proc/self").exists() {
            assert!(!dead.exists());
        }
        assert!(live.exists() && other.exists());
    }

    #[test]
    fn temp_path_writers_are_committed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.bin");
        let f = AtomicFile::create(&p).unwrap();
        std::fs::write(f.temp_path(), b"by path").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"by path");
        assert_eq!(names(dir.path()), ["w.bin"]);
    }
}
