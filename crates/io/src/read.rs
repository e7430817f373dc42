//! Reading the small state files that hyperlens keeps beside its outputs (a sweep's `plan.json`
//! and job records, a group's `group.json`) only when they are regular files, so that a FIFO or a
//! device left in their place gives an error instead of a read that waits for ever.

use std::path::Path;

/// Reads the whole of `path`, which must be a regular file (after following symbolic links).
///
/// # Errors
/// The operating system's error ([`std::io::ErrorKind::NotFound`] for a missing file, so that
/// callers can tell "absent" from "damaged"); [`std::io::ErrorKind::InvalidInput`] for a path that
/// is a directory, a FIFO, a socket or a device, checked before the file is opened.
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    std::fs::read(path)
}

/// Reads the whole of `path` as UTF-8 text, which must be a regular file (as [`read_regular`]).
///
/// # Errors
/// As [`read_regular`]; [`std::io::ErrorKind::InvalidData`] for bytes that are not UTF-8.
pub fn read_regular_string(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read_regular(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Whether `path` exists and is anything but a regular file (a directory, a FIFO, a socket, a
/// device); a missing path is not.
pub fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file())
}

/// Checks that `path`, if it exists, is a real directory and not a symbolic link (a run directory
/// that is a link could lead out of the sweep or group that holds it).
///
/// # Errors
/// [`std::io::ErrorKind::InvalidInput`] for a link or anything but a directory, naming the path.
pub fn real_dir_or_absent(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => refuse(
            path,
            "is a symbolic link; it must be a directory inside the sweep or group",
        ),
        Ok(m) if !m.is_dir() => refuse(path, "is not a directory"),
        _ => Ok(()),
    }
}

/// Checks that `path`, if it exists, is a regular file and not a symbolic link (appending to a
/// link could write outside the directory hyperlens was given; opening a FIFO would wait).
///
/// # Errors
/// [`std::io::ErrorKind::InvalidInput`] for a link or anything but a regular file, naming the
/// path.
pub fn regular_file_or_absent(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            refuse(path, "is a symbolic link; it must be a regular file")
        }
        Ok(m) if !m.is_file() => refuse(path, "is not a regular file"),
        _ => Ok(()),
    }
}

/// The error of [`real_dir_or_absent`] and [`regular_file_or_absent`]: `path` and what is wrong with
/// it, as [`std::io::ErrorKind::InvalidInput`].
fn refuse(path: &Path, what: &str) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{} {what}", path.display()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_other_kinds_are_refused_where_a_directory_or_file_is_expected() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let file = d.join("f");
        std::fs::write(&file, b"x").unwrap();
        let link = d.join("l");
        std::os::unix::fs::symlink(d, &link).unwrap();
        assert!(real_dir_or_absent(d).is_ok());
        assert!(real_dir_or_absent(&d.join("none")).is_ok());
        let e = real_dir_or_absent(&link).unwrap_err().to_string();
        assert!(
            e.ends_with("l is a symbolic link; it must be a directory inside the sweep or group"),
            "{e}"
        );
        let e = real_dir_or_absent(&file).unwrap_err().to_string();
        assert!(e.ends_with("f is not a directory"), "{e}");
        assert!(regular_file_or_absent(&file).is_ok());
        assert!(regular_file_or_absent(&d.join("none")).is_ok());
        let e = regular_file_or_absent(&link).unwrap_err().to_string();
        assert!(
            e.ends_with("l is a symbolic link; it must be a regular file"),
            "{e}"
        );
        let e = regular_file_or_absent(d).unwrap_err().to_string();
        assert!(e.ends_with(" is not a regular file"), "{e}");
    }

    #[test]
    fn only_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.json");
        std::fs::write(&file, b"{}").unwrap();
        assert_eq!(read_regular(&file).unwrap(), b"{}");
        assert!(!is_special(&file));
        let missing = dir.path().join("none");
        assert_eq!(
            read_regular(&missing).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        assert!(!is_special(&missing));
        assert_eq!(
            read_regular(dir.path()).unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
        assert!(is_special(dir.path()));
        // A FIFO: reading it would wait for a writer for ever.
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            assert_eq!(
                read_regular(&fifo).unwrap_err().kind(),
                std::io::ErrorKind::InvalidInput
            );
            assert!(is_special(&fifo));
        }
    }
}
