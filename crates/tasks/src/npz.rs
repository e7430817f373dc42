//! SRAVEN problem sets as `.npz` files, readable by `numpy.load`.
//!
//! Arrays (names are fixed):
//! - `x`: [N, T, M] one-hot inputs. Written as `uint8` (4x smaller than float32; `x.astype("float32")`
//!   in numpy restores the model input). `uint8`, `float32` or `float64` are accepted on load.
//! - `y`: [N, F] answers in column 2's order; `rules`: [N, F] rule index per unpermuted slot;
//!   `perms`: [N, 3, F] per-column permutations (optional). Written as `int64`; `int64` or `int32`
//!   accepted on load.
//!
//! Files are written uncompressed (like `np.savez`); files written by `np.savez_compressed` load as
//! well. Writing is atomic (`hyperlens_io::write_npz`); the array names are
//! `hyperlens_io::keys::problems`.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use hyperlens_io::keys::problems as keys;
use ndarray::{Array3, ArrayD, Ix2, Ix3};
use ndarray_npy::{NpzReader, ReadNpyError, ReadNpzError};

use crate::error::{Result, TasksError};
use crate::logic::LogicBatch;
use crate::sraven::{ProblemSet, SravenParams};

/// Writes a problem set to `path` atomically (`hyperlens_io::write_npz`).
///
/// # Shapes
/// `x` [N, T, M] is stored as `uint8`; `y`, `rules` [N, F] and `perms` [N, 3, F] (if present) as
/// `int64`.
///
/// # Errors
/// [`TasksError::InvalidInput`] if the set fails [`ProblemSet::validate`] (nothing is written);
/// [`TasksError::File`] naming the file (and array) if writing fails.
pub fn save_problems(path: &Path, set: &ProblemSet) -> Result<()> {
    set.validate()?;
    hyperlens_io::write_npz(path, |npz| -> Result<()> {
        npz.add(keys::X, &set.x.mapv(|v| v as u8))?;
        npz.add(keys::Y, &set.y)?;
        npz.add(keys::RULES, &set.rules)?;
        if let Some(p) = &set.perms {
            npz.add(keys::PERMS, p)?;
        }
        Ok(())
    })
}

/// Reads a problem set written by [`save_problems`] or by numpy (`np.savez` / `np.savez_compressed`
/// with the arrays described in the module docs) and validates it against `params`. Other arrays in
/// the archive are ignored (not even their headers are read), as `numpy.load` ignores them.
///
/// # Shapes
/// Returns `x` [N, T, M] as `f32`, `y`, `rules` [N, F] and `perms` [N, 3, F] as `i64`, with
/// T = `params.n_tokens()`, M = `params.values`, F = `params.features`.
///
/// # Errors
/// [`TasksError::Io`] if the file cannot be opened; [`TasksError::NpzFile`] if it is not a zip
/// archive; [`TasksError::NpzArray`] naming the array if one is missing, has an unsupported dtype,
/// the wrong rank or shape, a different N from `x`, non-one-hot context tokens or non-zero query
/// tokens (`x`), values outside 0..M (`y`), outside 0..8 (`rules`) or rows that are not permutations
/// (`perms`).
pub fn load_problems(path: &Path, params: &SravenParams) -> Result<ProblemSet> {
    params.check()?;
    // Sizes in the headers are checked against the bytes present and the memory budget before
    // ndarray-npy allocates anything.
    let members = inspect(path, &[keys::X, keys::Y, keys::RULES, keys::PERMS])?;
    if let Some(x) = members.iter().find(|m| m.name == keys::X) {
        if x.shape.first() == Some(&0) {
            return Err(TasksError::NpzArray {
                path: path.to_path_buf(),
                array: keys::X.into(),
                reason: "the problem set is empty (N = 0)".into(),
            });
        }
    }
    let file = File::open(path).map_err(|source| TasksError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut npz = NpzReader::new(BufReader::new(file)).map_err(|e| TasksError::NpzFile {
        path: path.to_path_buf(),
        reason: format!("not a readable .npz (zip) archive: {e}"),
    })?;
    let names = npz.names().map_err(|e| TasksError::NpzFile {
        path: path.to_path_buf(),
        reason: format!("cannot list the archive: {e}"),
    })?;
    let ctx = Ctx {
        path: path.to_path_buf(),
    };
    for required in [keys::X, keys::Y, keys::RULES] {
        if !names.iter().any(|n| n == required) {
            return Err(ctx.err(
                required,
                format!("missing (the archive holds: {})", names.join(", ")),
            ));
        }
    }
    let (f, m, t) = (params.features, params.values, params.n_tokens());

    let x = read_x(&mut npz, &ctx)?;
    let x: Array3<f32> = x
        .into_dimensionality::<Ix3>()
        .map_err(|_| ctx.err(keys::X, "expected rank 3 [N, T, M]".to_string()))?;
    let n = x.shape()[0];
    if x.shape()[1..] != [t, m] {
        return Err(ctx.err(
            keys::X,
            format!("shape {:?}, expected [N, {t}, {m}]", x.shape()),
        ));
    }
    let y = read_int(&mut npz, &ctx, keys::Y)?
        .into_dimensionality::<Ix2>()
        .map_err(|_| ctx.err(keys::Y, "expected rank 2 [N, F]".to_string()))?;
    let rules = read_int(&mut npz, &ctx, keys::RULES)?
        .into_dimensionality::<Ix2>()
        .map_err(|_| ctx.err(keys::RULES, "expected rank 2 [N, F]".to_string()))?;
    let perms = if names.iter().any(|n| n == keys::PERMS) {
        Some(
            read_int(&mut npz, &ctx, keys::PERMS)?
                .into_dimensionality::<Ix3>()
                .map_err(|_| ctx.err(keys::PERMS, "expected rank 3 [N, 3, F]".to_string()))?,
        )
    } else {
        None
    };
    check_shape(&ctx, keys::Y, y.shape(), &[n, f], keys::X)?;
    check_shape(&ctx, keys::RULES, rules.shape(), &[n, f], keys::X)?;
    if let Some(p) = &perms {
        check_shape(&ctx, keys::PERMS, p.shape(), &[n, 3, f], keys::X)?;
    }
    let set = ProblemSet {
        x,
        y,
        rules,
        perms,
        params: *params,
    };
    set.validate().map_err(|e| match e {
        TasksError::InvalidInput { name, reason } => ctx.err(&name, reason),
        other => other,
    })?;
    Ok(set)
}

/// `hyperlens_io::inspect_npz_arrays` on the arrays a reader reads (`arrays`; the others are
/// ignored, as numpy ignores them) with its errors as this crate's: the archive as a whole
/// ([`TasksError::NpzFile`]), one array ([`TasksError::NpzArray`]) or the file system.
fn inspect(path: &Path, arrays: &[&str]) -> Result<Vec<hyperlens_io::NpyMember>> {
    hyperlens_io::inspect_npz_arrays(path, arrays).map_err(|e| match e {
        hyperlens_io::IoError::Invalid { array, msg, .. } if array == "(archive)" => {
            TasksError::NpzFile {
                path: path.to_path_buf(),
                reason: msg,
            }
        }
        hyperlens_io::IoError::Invalid { array, msg, .. } => TasksError::NpzArray {
            path: path.to_path_buf(),
            array,
            reason: msg,
        },
        hyperlens_io::IoError::Io { source, .. } => TasksError::Io {
            path: path.to_path_buf(),
            source,
        },
        other => other.into(),
    })
}

struct Ctx {
    path: PathBuf,
}

impl Ctx {
    fn err(&self, array: &str, reason: String) -> TasksError {
        TasksError::NpzArray {
            path: self.path.clone(),
            array: array.to_string(),
            reason,
        }
    }
}

fn check_shape(ctx: &Ctx, name: &str, got: &[usize], want: &[usize], n_from: &str) -> Result<()> {
    if got.first() != want.first() {
        return Err(ctx.err(
            name,
            format!(
                "has {} problems but `{n_from}` has {}",
                got.first().copied().unwrap_or(0),
                want[0]
            ),
        ));
    }
    if got != want {
        return Err(ctx.err(name, format!("shape {got:?}, expected {want:?}")));
    }
    Ok(())
}

fn is_wrong_dtype(e: &ReadNpzError) -> bool {
    matches!(e, ReadNpzError::Npy(ReadNpyError::WrongDescriptor(_)))
}

/// Reads `x` as f32, accepting f32, u8 and f64 files.
fn read_x<R: Read + Seek>(npz: &mut NpzReader<R>, ctx: &Ctx) -> Result<ArrayD<f32>> {
    match npz.by_name::<_, _>(keys::X) {
        Ok(a) => return Ok(a),
        Err(e) if !is_wrong_dtype(&e) => return Err(ctx.err(keys::X, e.to_string())),
        Err(_) => {}
    }
    match npz.by_name::<ndarray::OwnedRepr<u8>, _>(keys::X) {
        Ok(a) => return Ok(a.mapv(f32::from)),
        Err(e) if !is_wrong_dtype(&e) => return Err(ctx.err(keys::X, e.to_string())),
        Err(_) => {}
    }
    match npz.by_name::<ndarray::OwnedRepr<f64>, _>(keys::X) {
        Ok(a) => Ok(a.mapv(|v| v as f32)),
        Err(e) if !is_wrong_dtype(&e) => Err(ctx.err(keys::X, e.to_string())),
        Err(e) => Err(ctx.err(
            keys::X,
            format!("unsupported dtype ({e}); expected uint8 or float32"),
        )),
    }
}

/// Reads an integer array as i64, accepting int64 and int32 files.
fn read_int<R: Read + Seek>(npz: &mut NpzReader<R>, ctx: &Ctx, name: &str) -> Result<ArrayD<i64>> {
    match npz.by_name::<ndarray::OwnedRepr<i64>, _>(name) {
        Ok(a) => return Ok(a),
        Err(e) if !is_wrong_dtype(&e) => return Err(ctx.err(name, e.to_string())),
        Err(_) => {}
    }
    match npz.by_name::<ndarray::OwnedRepr<i32>, _>(name) {
        Ok(a) => Ok(a.mapv(i64::from)),
        Err(e) if !is_wrong_dtype(&e) => Err(ctx.err(name, e.to_string())),
        Err(e) => Err(ctx.err(
            name,
            format!("unsupported dtype ({e}); expected int64 or int32"),
        )),
    }
}

/// Writes a fuzzy-logic problem set to `path` atomically (`hyperlens_io::write_npz`; array names
/// `hyperlens_io::keys::logic_problems`).
///
/// # Shapes
/// `x` [N, T, L + 1] and `targets` [N, T] float32, `y` `[N]` float32, `terms` [N, K, L] uint8,
/// `term_ids` [N, K] stored as int64.
///
/// # Errors
/// [`TasksError::InvalidInput`] for an empty set; [`TasksError::File`] naming the file and array.
pub fn save_logic(path: &Path, set: &LogicBatch) -> Result<()> {
    use hyperlens_io::keys::logic_problems as lk;
    if set.y.is_empty() {
        return Err(TasksError::input("x", "the problem set is empty (N = 0)"));
    }
    hyperlens_io::write_npz(path, |npz| -> Result<()> {
        npz.add(lk::X, &set.x)?;
        npz.add(lk::Y, &set.y)?;
        npz.add(lk::TARGETS, &set.targets)?;
        npz.add(lk::TERMS, &set.terms)?;
        npz.add(lk::TERM_IDS, &set.term_ids.mapv(i64::from))?;
        Ok(())
    })
}

/// Reads a fuzzy-logic problem set written by [`save_logic`] (or numpy with the same arrays) and
/// checks it against `params`: T = `params.samples` tokens of L + 1 = `params.variables` + 1
/// values, K = `params.terms` terms, every array with the same N, inputs `x`, answers `y` and
/// `targets` truth values (finite, in [0, 1]), term bits 0 or 1, term indices below 2^L, and each
/// term's bits those of its index. Arrays other than these five are ignored (not even their
/// headers are read).
///
/// # Shapes
/// As [`save_logic`].
///
/// # Errors
/// [`TasksError::Io`] / [`TasksError::NpzFile`] for an unreadable file; [`TasksError::NpzArray`]
/// naming the array that is missing, of another dtype or shape, empty, or out of range (with the
/// index and the value), or `terms` that disagree with `term_ids`.
pub fn load_logic(path: &Path, params: &crate::logic::LogicParams) -> Result<LogicBatch> {
    use hyperlens_io::keys::logic_problems as lk;
    use ndarray::{Array1, Array2, Ix1};
    params.check()?;
    inspect(path, &[lk::X, lk::Y, lk::TARGETS, lk::TERMS, lk::TERM_IDS])?;
    let file = File::open(path).map_err(|source| TasksError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut npz = NpzReader::new(BufReader::new(file)).map_err(|e| TasksError::NpzFile {
        path: path.to_path_buf(),
        reason: format!("not a readable .npz (zip) archive: {e}"),
    })?;
    let ctx = Ctx {
        path: path.to_path_buf(),
    };
    let (l, k, t) = (params.variables, params.terms, params.samples);
    let x: Array3<f32> = npz
        .by_name(lk::X)
        .map_err(|e| ctx.err(lk::X, format!("{e} (expected float32 [N, {t}, {}])", l + 1)))?;
    let n = x.shape()[0];
    if n == 0 {
        return Err(ctx.err(lk::X, "the problem set is empty (N = 0)".into()));
    }
    if x.shape()[1..] != [t, l + 1] {
        return Err(ctx.err(
            lk::X,
            format!("shape {:?}, expected [N, {t}, {}]", x.shape(), l + 1),
        ));
    }
    let y: Array1<f32> = npz
        .by_name::<ndarray::OwnedRepr<f32>, Ix1>(lk::Y)
        .map_err(|e| ctx.err(lk::Y, format!("{e} (expected float32 [N])")))?;
    let targets: Array2<f32> = npz
        .by_name(lk::TARGETS)
        .map_err(|e| ctx.err(lk::TARGETS, format!("{e} (expected float32 [N, {t}])")))?;
    let terms: Array3<u8> = npz
        .by_name(lk::TERMS)
        .map_err(|e| ctx.err(lk::TERMS, format!("{e} (expected uint8 [N, {k}, {l}])")))?;
    let term_ids = read_int(&mut npz, &ctx, lk::TERM_IDS)?
        .into_dimensionality::<Ix2>()
        .map_err(|_| ctx.err(lk::TERM_IDS, "expected rank 2 [N, K]".to_string()))?;
    check_shape(&ctx, lk::Y, y.shape(), &[n], lk::X)?;
    check_shape(&ctx, lk::TARGETS, targets.shape(), &[n, t], lk::X)?;
    check_shape(&ctx, lk::TERMS, terms.shape(), &[n, k, l], lk::X)?;
    check_shape(&ctx, lk::TERM_IDS, term_ids.shape(), &[n, k], lk::X)?;
    let arrays = crate::logic::LogicArrays {
        x: x.view(),
        y: y.view(),
        targets: targets.view(),
        terms: terms.view(),
        term_ids: term_ids.view(),
    };
    arrays.check_values(params).map_err(|e| match e {
        TasksError::InvalidInput { name, reason } => ctx.err(&name, reason),
        other => other,
    })?;
    Ok(LogicBatch {
        x,
        y,
        targets,
        terms,
        term_ids: term_ids.mapv(|i| i as u32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logic::{sample_logic_set, LogicParams, LogicSet, LogicSplit};

    /// A small logic set written, edited by `edit`, and read back; the error's text.
    fn load_edited(edit: impl FnOnce(&mut LogicBatch)) -> String {
        let params = LogicParams::default();
        let split = LogicSplit::new(params, 0).unwrap();
        let mut set = sample_logic_set(&split, LogicSet::Id, 8, 1).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logic.npz");
        save_logic(&path, &set).unwrap();
        assert_eq!(load_logic(&path, &params).unwrap(), set);
        edit(&mut set);
        save_logic(&path, &set).unwrap();
        match load_logic(&path, &params) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn answers_and_targets_must_be_truth_values() {
        for (array, v) in [
            ("y", f32::NAN),
            ("y", 1.5),
            ("y", -0.25),
            ("targets", f32::NAN),
            ("targets", f32::INFINITY),
            ("targets", 3.0),
        ] {
            let e = load_edited(|s| {
                if array == "y" {
                    s.y[3] = v;
                } else {
                    s.targets[[2, 5]] = v;
                }
            });
            let at = if array == "y" { "[3]" } else { "[2, 5]" };
            assert!(
                e.contains(&format!("`{array}`")) && e.contains(at) && e.contains(&v.to_string()),
                "{array} = {v}: {e}"
            );
            assert!(e.contains("logic.npz"), "{e}");
        }
        let e = load_edited(|s| s.x[[1, 2, 0]] = f32::NAN);
        assert!(
            e.contains("`x`") && e.contains("[1, 2, 0]") && e.contains("NaN"),
            "{e}"
        );
    }

    #[test]
    fn terms_must_be_the_bits_of_their_indices() {
        let e = load_edited(|s| s.term_ids[[0, 1]] = 1 << 20);
        assert!(e.contains("`term_ids`") && e.contains("1048576"), "{e}");
        let e = load_edited(|s| s.terms[[4, 0, 2]] = 7);
        assert!(e.contains("`terms`") && e.contains("[4, 0, 2]"), "{e}");
        // A valid index with other bits: both arrays valid alone, inconsistent together.
        let e = load_edited(|s| {
            let id = s.term_ids[[2, 0]];
            s.term_ids[[2, 0]] = id ^ 1;
        });
        assert!(e.contains("`terms`") && e.contains("term_ids[2, 0]"), "{e}");
    }
}
