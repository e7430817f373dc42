//! The one helper module of the end-to-end tests: run the binary and check its exit code and
//! messages, build tiny checkpoints, and read the files it writes (CSV, JSON, npz, safetensors).
//!
//! Exit codes of `hyperlens`: 0 success, 1 the command failed (reported as one line
//! `error: ...` on stderr), 2 bad usage (reported by clap: `error: ...`, then a usage hint).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use hyperlens_model::candle_core::{Device, Tensor};
use hyperlens_model::lm::{TokenConfig, TokenModel};
use hyperlens_model::{Config, Mixer, Transformer};
use ndarray::ArrayD;
use ndarray_npy::NpzReader;
use serde_json::Value;

/// The package directory, read at run time: cargo sets `CARGO_MANIFEST_DIR` for the test binaries it
/// runs, so a test binary reused from a target directory that was built in a clone at another path
/// still finds its fixtures (the compile-time `env!` value would point into that other clone).
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from)
}

/// A file or directory shipped in the repository, by its path from the root.
pub fn repo_path(rel: &str) -> PathBuf {
    manifest_dir().join(rel)
}

/// A fresh temporary directory, removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// A path as `&str` for an argument list (the temporary directories are UTF-8).
pub fn s(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    /// The arguments, for messages.
    pub args: Vec<String>,
    /// The exit code (`None` if killed by a signal, e.g. a panic that aborts).
    pub code: Option<i32>,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
}

/// Runs `hyperlens args...` in the current directory (the tests pass absolute paths), on one
/// thread, with stdout and stderr captured: neither is a terminal, as in a redirected run.
pub fn hyperlens<S: AsRef<OsStr>>(args: &[S]) -> Run {
    hyperlens_in(&std::env::current_dir().expect("a current directory"), args)
}

/// [`hyperlens`] with `cwd` as the working directory.
pub fn hyperlens_in<S: AsRef<OsStr>>(cwd: &Path, args: &[S]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_hyperlens"))
        .args(args)
        .current_dir(cwd)
        .env("RAYON_NUM_THREADS", "1")
        .env("CANDLE_NUM_THREADS", "1")
        .output()
        .expect("the hyperlens binary runs");
    Run {
        args: args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl Run {
    fn context(&self) -> String {
        format!(
            "hyperlens {}\nexit code {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.args.join(" "),
            self.code,
            self.stdout,
            self.stderr
        )
    }

    /// Asserts exit code 0; returns stdout.
    #[track_caller]
    pub fn success(&self) -> &str {
        assert_eq!(self.code, Some(0), "expected success:\n{}", self.context());
        &self.stdout
    }

    /// Asserts exit code 1 with stderr exactly one line `error: ...` that contains every one of
    /// `needles` (the file, flag or value at fault); returns that line.
    #[track_caller]
    pub fn failure(&self, needles: &[&str]) -> &str {
        assert_eq!(
            self.code,
            Some(1),
            "expected exit code 1:\n{}",
            self.context()
        );
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert!(
            lines.len() == 1 && lines[0].starts_with("error: "),
            "expected one line `error: ...` on stderr:\n{}",
            self.context()
        );
        for n in needles {
            assert!(
                lines[0].contains(n),
                "the error does not name `{n}`:\n{}",
                self.context()
            );
        }
        lines[0]
    }

    /// [`Run::failure`] for a command that notes its progress on stderr: every line before the
    /// error starts with `note_prefix` (e.g. `report: `), and the last is the one `error: ...`.
    #[track_caller]
    pub fn failure_after_notes(&self, note_prefix: &str, needles: &[&str]) -> &str {
        let lines: Vec<&str> = self.stderr.lines().collect();
        let (last, notes) = lines.split_last().unwrap_or((&"", &[]));
        assert!(
            notes.iter().all(|l| l.starts_with(note_prefix)),
            "expected only `{note_prefix}` notes before the error:\n{}",
            self.context()
        );
        let error = Run {
            args: self.args.clone(),
            code: self.code,
            stdout: self.stdout.clone(),
            stderr: format!("{last}\n"),
        };
        error.failure(needles);
        last
    }

    /// Asserts exit code 2, clap's report of bad usage: nothing on stdout, stderr opening with a line
    /// `error: ...` and ending with the pointer to `--help`, and every one of `needles` in it;
    /// returns stderr.
    #[track_caller]
    pub fn usage_error(&self, needles: &[&str]) -> &str {
        assert_eq!(
            self.code,
            Some(2),
            "expected exit code 2:\n{}",
            self.context()
        );
        assert!(self.stdout.is_empty(), "{}", self.context());
        assert!(
            self.stderr.starts_with("error: ")
                && self
                    .stderr
                    .trim_end()
                    .ends_with("For more information, try '--help'."),
            "expected clap's usage error:\n{}",
            self.context()
        );
        for n in needles {
            assert!(
                self.stderr.contains(n),
                "the error does not name `{n}`:\n{}",
                self.context()
            );
        }
        &self.stderr
    }
}

/// Heads of the tiny SRAVEN models.
pub const TINY_HEADS: usize = 3;
/// Layers of the tiny SRAVEN models.
pub const TINY_LAYERS: usize = 2;

/// A tiny SRAVEN model: 36 tokens of 8 values, 4 outputs, D 12, 3 heads of width 4, 2 layers.
pub fn tiny_config(mixer: Mixer) -> Config {
    Config {
        d_in: 8,
        n_tokens: 36,
        n_outputs: 4,
        d_model: 12,
        n_heads: TINY_HEADS,
        d_head: 4,
        n_layers: TINY_LAYERS,
        d_mlp: 16,
        d_out: 8,
        n_buckets: 36,
        causal: false,
        mixer,
    }
}

/// Writes a seeded, untrained tiny SRAVEN checkpoint (`config.json` + `model.safetensors`) to `dir`.
pub fn sraven_checkpoint(dir: &Path, mixer: Mixer, seed: u64) {
    let (model, _vars) = Transformer::init(&tiny_config(mixer), seed, &Device::Cpu).unwrap();
    model.save(dir).unwrap();
}

/// Writes a seeded, untrained 2-layer attention-only token model (vocabulary 13, 24 positions,
/// 4 heads of width 16) to `dir`.
pub fn token_model(dir: &Path) {
    let cfg = TokenConfig::attn_only(2, 13, 24).unwrap();
    let (model, _) = TokenModel::init(&cfg, 7, &Device::Cpu).unwrap();
    model.save(dir).unwrap();
}

/// The tensors of a `.safetensors` file, by name.
pub fn safetensors(path: &Path) -> HashMap<String, Tensor> {
    hyperlens_model::candle_core::safetensors::load(path, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A tensor's values as f64, flattened in row-major order, and its shape.
pub fn values(t: &Tensor) -> (Vec<usize>, Vec<f64>) {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    (t.dims().to_vec(), v.into_iter().map(f64::from).collect())
}

/// A JSON file.
pub fn json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// An `.npz` file opened for reading.
pub fn npz(path: &Path) -> NpzReader<File> {
    NpzReader::new(File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One array of an `.npz` file, by name (without `.npy`), of any dimension.
pub fn array<T: ndarray_npy::ReadableElement>(path: &Path, name: &str) -> ArrayD<T> {
    npz(path)
        .by_name(&format!("{name}.npy"))
        .unwrap_or_else(|e| panic!("{}: array {name}: {e}", path.display()))
}

/// A CSV file as a header and rows of string fields; every row has as many fields as the header.
#[derive(Debug)]
pub struct Csv {
    /// The file, for messages.
    pub path: PathBuf,
    /// Column names.
    pub header: Vec<String>,
    /// Rows of fields.
    pub rows: Vec<Vec<String>>,
}

impl Csv {
    /// Reads and splits `path` (no quoting: hyperlens writes none).
    pub fn read(path: &Path) -> Csv {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut lines = text.lines().filter(|l| !l.is_empty());
        let header: Vec<String> = lines
            .next()
            .unwrap_or_else(|| panic!("{}: empty", path.display()))
            .split(',')
            .map(str::to_string)
            .collect();
        let rows: Vec<Vec<String>> = lines
            .map(|l| l.split(',').map(str::to_string).collect())
            .collect();
        for r in &rows {
            assert_eq!(r.len(), header.len(), "{}: row {r:?}", path.display());
        }
        Csv {
            path: path.to_path_buf(),
            header,
            rows,
        }
    }

    fn index(&self, name: &str) -> usize {
        self.header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| {
                panic!(
                    "{}: no column {name} in {:?}",
                    self.path.display(),
                    self.header
                )
            })
    }

    /// Column `name` as strings.
    pub fn strings(&self, name: &str) -> Vec<&str> {
        let i = self.index(name);
        self.rows.iter().map(|r| r[i].as_str()).collect()
    }

    /// Column `name` parsed as numbers (`NaN` allowed).
    pub fn column(&self, name: &str) -> Vec<f64> {
        let i = self.index(name);
        self.rows
            .iter()
            .map(|r| {
                r[i].parse()
                    .unwrap_or_else(|_| panic!("{}: {name} = {:?}", self.path.display(), r[i]))
            })
            .collect()
    }

    /// Column `name` parsed as finite numbers.
    pub fn finite(&self, name: &str) -> Vec<f64> {
        let v = self.column(name);
        for x in &v {
            assert!(x.is_finite(), "{}: {name} = {x}", self.path.display());
        }
        v
    }
}

/// Asserts every value lies in `[lo, hi]` (and is not NaN).
#[track_caller]
pub fn in_range(what: &str, values: &[f64], lo: f64, hi: f64) {
    for &v in values {
        assert!(v >= lo && v <= hi, "{what}: {v} not in [{lo}, {hi}]");
    }
}

/// Asserts `|a - b| <= tol`.
#[track_caller]
pub fn close(what: &str, a: f64, b: f64, tol: f64) {
    assert!((a - b).abs() <= tol, "{what}: {a} vs {b} (tolerance {tol})");
}

/// The names of the entries of a directory (no temporary file may be left behind by an atomic write).
pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The files under `dir`, at any depth, relative to it (none if `dir` does not exist).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(read) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in read {
            let path = e.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}
