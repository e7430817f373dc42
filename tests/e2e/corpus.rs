//! The bad-input corpus: broken checkpoints, problem files, code files, Hugging Face and GGUF
//! checkpoints and flags, generated here from valid tiny inputs (nothing large is committed). Every
//! case must end with exit code 1 or 2 and a one-line `error:` that names the file, tensor, array or
//! flag at fault, under an address-space limit of 2 GiB (`prlimit --as`), so that any case that
//! tried to allocate more would abort and fail. The memory budget is set to 1 GiB for every case.
//!
//! Outcomes are counted (clear errors, unclear errors, panics, aborts, hangs, silent successes) and the
//! test fails unless every case gave a clear error; run with `--nocapture` to see the counts.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use hyperlens_model::candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use hyperlens_model::candle_core::{DType, Device, Tensor};
use hyperlens_model::Mixer;

use crate::util::{s, sraven_checkpoint, tempdir, token_model};

/// The address-space limit of every case (bytes).
const AS_LIMIT: u64 = 2 << 30;
/// Seconds after which a case counts as a hang (every case is tiny: a clear error comes in well
/// under a second).
const HANG_SECS: u64 = 60;

/// One bad input: the arguments, and the words the error must contain.
pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) args: Vec<String>,
    pub(crate) needles: Vec<String>,
}

pub(crate) fn case(name: &str, args: &[&str], needles: &[&str]) -> Case {
    Case {
        name: name.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        needles: needles.iter().map(|n| n.to_string()).collect(),
    }
}

#[derive(Debug, Default)]
struct Tally {
    clear: usize,
    unclear: Vec<String>,
    panics: Vec<String>,
    aborts: Vec<String>,
    hangs: Vec<String>,
    silent: Vec<String>,
}

/// Runs one case under the address-space limit and classifies it.
fn run_case(c: &Case, tally: &mut Tally) {
    let out = Command::new("timeout")
        .args(["--kill-after=5", &HANG_SECS.to_string(), "prlimit"])
        .arg(format!("--as={AS_LIMIT}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_hyperlens"))
        .args(&c.args)
        .env("RAYON_NUM_THREADS", "1")
        .env("CANDLE_NUM_THREADS", "1")
        .env("HYPERLENS_MEMORY_BUDGET", "1G")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("prlimit runs (util-linux)");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let what = format!("{}: {:?}\n  stderr: {}", c.name, c.args, stderr.trim_end());
    match out.status.code() {
        Some(0) => tally.silent.push(what),
        Some(1) | Some(2) if stderr.contains("panicked") => tally.panics.push(what),
        Some(code @ (1 | 2)) => {
            let first = stderr.lines().next().unwrap_or("");
            let one_line = code == 2 || stderr.lines().count() == 1;
            let named = c.needles.iter().all(|n| first.contains(n.as_str()));
            if first.starts_with("error: ") && one_line && named {
                tally.clear += 1;
            } else {
                tally
                    .unclear
                    .push(format!("{what}\n  expected to name {:?}", c.needles));
            }
        }
        Some(101) => tally.panics.push(what),
        Some(124) | Some(137) => tally
            .hangs
            .push(format!("{what}\n  killed after {HANG_SECS} s")),
        _ => tally
            .aborts
            .push(format!("{what}\n  status {:?}", out.status)),
    }
}

/// An `.npz` file to write: its name, its members (name, header dict, data bytes) and the words
/// the error about it must contain.
type NpzCase<'a> = (&'a str, Vec<(&'a str, String, Vec<u8>)>, Vec<&'a str>);

/// A zip archive of raw `.npy` members, each given as (name, header dict, data bytes): headers may
/// lie about the data.
pub(crate) fn raw_npz(path: &Path, members: &[(&str, &str, Vec<u8>)]) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, header, data) in members {
        zip.start_file(format!("{name}.npy"), opts).unwrap();
        zip.write_all(&npy_bytes(header, data)).unwrap();
    }
    zip.finish().unwrap();
}

/// The bytes of one `.npy` member: the magic, version 1.0, the header dict padded to 64 bytes,
/// then `data` (the header may lie about it).
pub(crate) fn npy_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(b' ');
    }
    h.push(b'\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(h.len() as u16).to_le_bytes());
    bytes.extend_from_slice(&h);
    bytes.extend_from_slice(data);
    bytes
}

pub(crate) fn npy_header(descr: &str, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple}, }}")
}

pub(crate) fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Copies a checkpoint directory and applies `edit` to the copy.
pub(crate) fn mutant(base: &Path, root: &Path, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(base).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    edit(&dir);
    dir
}

pub(crate) fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

/// Replaces the header of a safetensors file with `header` (data kept).
fn set_st_header(path: &Path, header: &str) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let data = &bytes[8 + n..];
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

fn st_header(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[8..8 + n]).unwrap()
}

/// SRAVEN checkpoints broken in every way a file can be, each tried with info, eval and probe.
fn checkpoint_cases(root: &Path, cases: &mut Vec<Case>) {
    let base = root.join("base");
    sraven_checkpoint(&base, Mixer::Hyla, 0);
    let weights_len = std::fs::metadata(base.join("model.safetensors"))
        .unwrap()
        .len();
    let mut mutants: Vec<(String, PathBuf, Vec<String>)> = Vec::new();
    let mut add = |name: &str, needles: &[&str], edit: &dyn Fn(&Path)| {
        let dir = mutant(&base, root, name, edit);
        mutants.push((
            name.to_string(),
            dir,
            needles.iter().map(|n| n.to_string()).collect(),
        ));
    };
    let cfg = |d: &Path| d.join("config.json");
    let w = |d: &Path| d.join("model.safetensors");
    add("no-config", &["config.json"], &|d| {
        std::fs::remove_file(cfg(d)).unwrap()
    });
    add("empty-config", &["config.json"], &|d| {
        std::fs::write(cfg(d), "").unwrap()
    });
    add("garbage-config", &["config.json"], &|d| {
        std::fs::write(cfg(d), "{not json").unwrap()
    });
    add("config-array", &["config.json"], &|d| {
        std::fs::write(cfg(d), "[1, 2]").unwrap()
    });
    add("unknown-field", &["config.json", "d_inn"], &|d| {
        edit_json(&cfg(d), |v| {
            v["d_inn"] = 3.into();
        })
    });
    add("unknown-mixer", &["config.json", "nope"], &|d| {
        edit_json(&cfg(d), |v| v["mixer"] = "nope".into())
    });
    for field in [
        "d_in",
        "n_tokens",
        "n_outputs",
        "d_model",
        "n_heads",
        "d_head",
        "n_layers",
        "d_mlp",
        "d_out",
    ] {
        add(&format!("zero-{field}"), &["config.json", field], &|d| {
            edit_json(&cfg(d), |v| v[field] = 0.into())
        });
    }
    for (name, value) in [("1e7", 10_000_000u64), ("u64max", u64::MAX)] {
        add(
            &format!("layers-{name}"),
            &["config.json", "n_layers"],
            &|d| edit_json(&cfg(d), |v| v["n_layers"] = value.into()),
        );
    }
    add("layers-3", &["config.json", "n_layers"], &|d| {
        edit_json(&cfg(d), |v| v["n_layers"] = 3.into())
    });
    add("tokens-1e9", &["config.json", "n_tokens"], &|d| {
        edit_json(&cfg(d), |v| v["n_tokens"] = 1_000_000_000u64.into())
    });
    add("d-model-1e9", &["config.json", "d_model"], &|d| {
        edit_json(&cfg(d), |v| v["d_model"] = 1_000_000_000u64.into())
    });
    add("d-model-13", &["model.safetensors", "embed.W_E"], &|d| {
        edit_json(&cfg(d), |v| v["d_model"] = 13.into())
    });
    add("buckets-1", &["config.json", "n_buckets"], &|d| {
        edit_json(&cfg(d), |v| v["n_buckets"] = 1.into())
    });
    add(
        "mixer-contradicts-weights",
        &["config.json", "mixer", "hyla"],
        &|d| edit_json(&cfg(d), |v| v["mixer"] = "softmax".into()),
    );
    add("outputs-3", &["config.json", "n_outputs"], &|d| {
        edit_json(&cfg(d), |v| v["n_outputs"] = 3.into())
    });
    add("no-weights", &["model.safetensors"], &|d| {
        std::fs::remove_file(w(d)).unwrap()
    });
    add("empty-weights", &["model.safetensors"], &|d| {
        std::fs::write(w(d), b"").unwrap()
    });
    for frac in [0.001, 0.01, 0.1, 0.5, 0.9, 0.999] {
        let at = ((weights_len as f64) * frac) as usize;
        add(&format!("truncated-{at}"), &["model.safetensors"], &|d| {
            let b = std::fs::read(w(d)).unwrap();
            std::fs::write(w(d), &b[..at]).unwrap();
        });
    }
    add("huge-header-length", &["model.safetensors"], &|d| {
        let mut b = std::fs::read(w(d)).unwrap();
        b[..8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        std::fs::write(w(d), b).unwrap();
    });
    add("header-not-json", &["model.safetensors"], &|d| {
        let mut b = std::fs::read(w(d)).unwrap();
        b[8] = b'x';
        std::fs::write(w(d), b).unwrap();
    });
    add(
        "duplicate-key",
        &["model.safetensors", "embed.b_E", "twice"],
        &|d| {
            let h = st_header(&w(d));
            let mut text = h.to_string();
            let entry = format!("\"embed.b_E\":{}", h["embed.b_E"]);
            text.insert_str(text.len() - 1, &format!(",{entry}"));
            set_st_header(&w(d), &text);
        },
    );
    add(
        "missing-tensor",
        &["model.safetensors", "blocks.1.ln2.b"],
        &|d| {
            let mut t: HashMap<String, Tensor> =
                hyperlens_model::candle_core::safetensors::load(w(d), &Device::Cpu).unwrap();
            t.remove("blocks.1.ln2.b");
            hyperlens_model::candle_core::safetensors::save(&t, w(d)).unwrap();
        },
    );
    add("extra-tensor", &["model.safetensors", "stray"], &|d| {
        let mut t: HashMap<String, Tensor> =
            hyperlens_model::candle_core::safetensors::load(w(d), &Device::Cpu).unwrap();
        t.insert(
            "stray".into(),
            Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
        );
        hyperlens_model::candle_core::safetensors::save(&t, w(d)).unwrap();
    });
    add(
        "f64-tensor",
        &["model.safetensors", "embed.b_E", "dtype"],
        &|d| {
            let mut t: HashMap<String, Tensor> =
                hyperlens_model::candle_core::safetensors::load(w(d), &Device::Cpu).unwrap();
            let b = t["embed.b_E"].to_dtype(DType::F64).unwrap();
            t.insert("embed.b_E".into(), b);
            hyperlens_model::candle_core::safetensors::save(&t, w(d)).unwrap();
        },
    );
    add(
        "nan-tensor",
        &["model.safetensors", "ln_final.w", "non-finite"],
        &|d| {
            let mut t: HashMap<String, Tensor> =
                hyperlens_model::candle_core::safetensors::load(w(d), &Device::Cpu).unwrap();
            let n = t["ln_final.w"].dims1().unwrap();
            let mut v = vec![1f32; n];
            v[2] = f32::NAN;
            t.insert(
                "ln_final.w".into(),
                Tensor::from_vec(v, n, &Device::Cpu).unwrap(),
            );
            hyperlens_model::candle_core::safetensors::save(&t, w(d)).unwrap();
        },
    );
    add("offsets-beyond-file", &["model.safetensors"], &|d| {
        let mut h = st_header(&w(d));
        h["embed.b_E"]["data_offsets"] = serde_json::json!([0, 1u64 << 50]);
        set_st_header(&w(d), &h.to_string());
    });
    add("shape-lies", &["model.safetensors"], &|d| {
        let mut h = st_header(&w(d));
        h["embed.b_E"]["shape"] = serde_json::json!([1u64 << 40]);
        set_st_header(&w(d), &h.to_string());
    });
    let out = root.join("out");
    for (name, dir, needles) in mutants {
        let n: Vec<&str> = needles.iter().map(String::as_str).collect();
        let d = s(&dir).to_string();
        // `info` describes any valid model config; F = 3 outputs is one (only SRAVEN use refuses it).
        if name != "outputs-3" {
            cases.push(case(
                &format!("info/{name}"),
                &["info", "--checkpoint", &d],
                &n,
            ));
        }
        cases.push(case(
            &format!("eval/{name}"),
            &[
                "eval",
                "--checkpoint",
                &d,
                "--split",
                "paper-seed0",
                "--n",
                "4",
            ],
            &n,
        ));
        let o = out.join(format!("{name}.npz"));
        cases.push(case(
            &format!("probe/{name}"),
            &[
                "probe",
                "--checkpoint",
                &d,
                "--split",
                "paper-seed0",
                "--n",
                "4",
                "--out",
                s(&o),
            ],
            &n,
        ));
    }
}

/// Problem files broken in every way, each tried with eval and probe on a valid checkpoint.
fn problem_cases(root: &Path, cases: &mut Vec<Case>) {
    let ckpt = root.join("base");
    let dir = root.join("problems");
    std::fs::create_dir_all(&dir).unwrap();
    let (n, t, m, f) = (4usize, 36usize, 8usize, 4usize);
    // Valid arrays from the task generator; each file below breaks one thing.
    let split = hyperlens_tasks::sraven::Split::named("paper-seed0").unwrap();
    let valid =
        hyperlens_tasks::sraven::sample(&split, hyperlens_tasks::sraven::Set::Id, n, 0, false)
            .unwrap();
    let x: Vec<u8> = valid.x.iter().map(|&v| v as u8).collect();
    let y: Vec<i64> = valid.y.iter().copied().collect();
    let rules: Vec<i64> = valid.rules.iter().copied().collect();
    let xh = npy_header("|u1", &[n, t, m]);
    let yh = npy_header("<i8", &[n, f]);
    let files: Vec<NpzCase> = vec![
        (
            "x-claims-1e12",
            vec![
                (
                    "x",
                    npy_header("|u1", &[1_000_000_000_000, t, m]),
                    x.clone(),
                ),
                ("y", yh.clone(), i64_bytes(&y)),
                ("rules", yh.clone(), i64_bytes(&rules)),
            ],
            vec!["array `x`"],
        ),
        (
            "y-claims-1e12",
            vec![
                ("x", xh.clone(), x.clone()),
                (
                    "y",
                    npy_header("<i8", &[1_000_000_000_000, f]),
                    i64_bytes(&y),
                ),
                ("rules", yh.clone(), i64_bytes(&rules)),
            ],
            vec!["array `y`"],
        ),
        (
            "rules-claims-1e12",
            vec![
                ("x", xh.clone(), x.clone()),
                ("y", yh.clone(), i64_bytes(&y)),
                (
                    "rules",
                    npy_header("<i8", &[1_000_000_000_000, f]),
                    i64_bytes(&rules),
                ),
            ],
            vec!["array `rules`"],
        ),
        (
            "x-missing",
            vec![
                ("y", yh.clone(), i64_bytes(&y)),
                ("rules", yh.clone(), i64_bytes(&rules)),
            ],
            vec!["`x`"],
        ),
        (
            "y-missing",
            vec![
                ("x", xh.clone(), x.clone()),
                ("rules", yh.clone(), i64_bytes(&rules)),
            ],
            vec!["`y`"],
        ),
        (
            "x-unicode",
            vec![
                ("x", npy_header("<U4", &[n]), vec![0u8; 16 * n]),
                ("y", yh.clone(), i64_bytes(&y)),
                ("rules", yh.clone(), i64_bytes(&rules)),
            ],
            vec!["array `x`"],
        ),
        (
            "x-rank-2",
            vec![
                ("x", npy_header("|u1", &[n, t * m]), x.clone()),
                ("y", yh.clone(), i64_bytes(&y)),
                ("rules", yh.clone(), i64_bytes(&rules)),
            ],
            vec!["`x`"],
        ),
        (
            "empty-set",
            vec![
                ("x", npy_header("|u1", &[0, t, m]), vec![]),
                ("y", npy_header("<i8", &[0, f]), vec![]),
                ("rules", npy_header("<i8", &[0, f]), vec![]),
            ],
            vec!["empty"],
        ),
        (
            "y-out-of-range",
            vec![
                ("x", xh.clone(), x.clone()),
                ("y", yh.clone(), i64_bytes(&vec![99; n * f])),
                ("rules", yh.clone(), i64_bytes(&rules)),
            ],
            vec!["`y`"],
        ),
        (
            "rules-out-of-range",
            vec![
                ("x", xh.clone(), x.clone()),
                ("y", yh.clone(), i64_bytes(&y)),
                ("rules", yh.clone(), i64_bytes(&vec![100; n * f])),
            ],
            vec!["`rules`"],
        ),
        (
            "n-disagrees",
            vec![
                ("x", xh.clone(), x.clone()),
                (
                    "y",
                    npy_header("<i8", &[n - 1, f]),
                    i64_bytes(&y[..(n - 1) * f]),
                ),
                ("rules", yh.clone(), i64_bytes(&rules)),
            ],
            vec!["`y`"],
        ),
        (
            "y-truncated",
            vec![
                ("x", xh.clone(), x.clone()),
                ("y", yh.clone(), i64_bytes(&y[..3])),
                ("rules", yh.clone(), i64_bytes(&rules)),
            ],
            vec!["array `y`"],
        ),
        (
            "wrong-tokens",
            vec![
                ("x", npy_header("|u1", &[n, 9, m]), vec![0u8; n * 9 * m]),
                ("y", yh.clone(), i64_bytes(&y)),
                ("rules", yh.clone(), i64_bytes(&rules)),
            ],
            vec!["`x`"],
        ),
    ];
    let mut paths: Vec<(String, PathBuf, Vec<&str>)> = Vec::new();
    for (name, members, needles) in files {
        let p = dir.join(format!("{name}.npz"));
        let m: Vec<(&str, &str, Vec<u8>)> = members
            .iter()
            .map(|(a, h, d)| (*a, h.as_str(), d.clone()))
            .collect();
        raw_npz(&p, &m);
        paths.push((name.to_string(), p, needles));
    }
    for (name, bytes) in [
        ("not-a-zip", b"hello, world".to_vec()),
        ("empty-file", Vec::new()),
        ("zip-magic-only", b"PK\x03\x04".to_vec()),
    ] {
        let p = dir.join(format!("{name}.npz"));
        std::fs::write(&p, bytes).unwrap();
        paths.push((name.to_string(), p, vec![]));
    }
    paths.push(("missing-file".into(), dir.join("no-such.npz"), vec![]));
    for (name, p, needles) in paths {
        let mut n: Vec<&str> = needles.clone();
        let file_name = p.file_name().unwrap().to_str().unwrap().to_string();
        n.push(&file_name);
        let o = root.join("out").join(format!("problems-{name}.npz"));
        cases.push(case(
            &format!("eval-problems/{name}"),
            &["eval", "--checkpoint", s(&ckpt), "--problems", s(&p)],
            &n,
        ));
        cases.push(case(
            &format!("probe-problems/{name}"),
            &[
                "probe",
                "--checkpoint",
                s(&ckpt),
                "--problems",
                s(&p),
                "--out",
                s(&o),
            ],
            &n,
        ));
    }
}

/// Code files broken in every way, each tried as the train and as the test set of analyze.
fn code_cases(root: &Path, cases: &mut Vec<Case>) {
    let dir = root.join("codes");
    std::fs::create_dir_all(&dir).unwrap();
    let (n, l, h, q, k) = (24usize, 2usize, 3usize, 1usize, 2usize);
    let codes: Vec<f32> = (0..n * l * h * q * k)
        .map(|i| (i % 7) as f32 * 0.1)
        .collect();
    let label: Vec<i64> = (0..n as i64).map(|i| i % 8).collect();
    let ch = npy_header("<f4", &[n, l, h, q, k]);
    let lh = npy_header("<i8", &[n]);
    let good = dir.join("good.npz");
    raw_npz(
        &good,
        &[
            ("codes", &ch, f32_bytes(&codes)),
            ("label", &lh, i64_bytes(&label)),
        ],
    );
    let mut bad_label = label.clone();
    bad_label[5] = 100;
    let mut neg_label = label.clone();
    neg_label[0] = -1;
    let mut nan_codes = codes.clone();
    nan_codes[3] = f32::NAN;
    let files: Vec<NpzCase> = vec![
        (
            "codes-claims-1e12",
            vec![
                (
                    "codes",
                    npy_header("<f4", &[1_000_000_000_000, l, h, q, k]),
                    f32_bytes(&codes),
                ),
                ("label", lh.clone(), i64_bytes(&label)),
            ],
            vec!["array `codes`"],
        ),
        (
            "label-claims-1e12",
            vec![
                ("codes", ch.clone(), f32_bytes(&codes)),
                (
                    "label",
                    npy_header("<i8", &[1_000_000_000_000]),
                    i64_bytes(&label),
                ),
            ],
            vec!["array `label`"],
        ),
        (
            "label-100",
            vec![
                ("codes", ch.clone(), f32_bytes(&codes)),
                ("label", lh.clone(), i64_bytes(&bad_label)),
            ],
            vec!["`label`", "100"],
        ),
        (
            "label-negative",
            vec![
                ("codes", ch.clone(), f32_bytes(&codes)),
                ("label", lh.clone(), i64_bytes(&neg_label)),
            ],
            vec!["`label`", "-1"],
        ),
        (
            "rules-out-of-range",
            vec![
                ("codes", ch.clone(), f32_bytes(&codes)),
                ("label", lh.clone(), i64_bytes(&label)),
                (
                    "rules",
                    npy_header("<i8", &[n, 4]),
                    i64_bytes(&vec![9; n * 4]),
                ),
            ],
            vec!["`rules`"],
        ),
        (
            "nan-codes",
            vec![
                ("codes", ch.clone(), f32_bytes(&nan_codes)),
                ("label", lh.clone(), i64_bytes(&label)),
            ],
            vec!["`codes`"],
        ),
        (
            "label-short",
            vec![
                ("codes", ch.clone(), f32_bytes(&codes)),
                (
                    "label",
                    npy_header("<i8", &[n - 2]),
                    i64_bytes(&label[..n - 2]),
                ),
            ],
            vec!["label"],
        ),
        (
            "codes-missing",
            vec![("label", lh.clone(), i64_bytes(&label))],
            vec!["`codes`"],
        ),
        (
            "label-missing",
            vec![("codes", ch.clone(), f32_bytes(&codes))],
            vec!["`label`"],
        ),
        (
            "empty-set",
            vec![
                ("codes", npy_header("<f4", &[0, l, h, q, k]), vec![]),
                ("label", npy_header("<i8", &[0]), vec![]),
            ],
            vec!["codes"],
        ),
        (
            "codes-rank-3",
            vec![
                (
                    "codes",
                    npy_header("<f4", &[n, l, h * q * k]),
                    f32_bytes(&codes),
                ),
                ("label", lh.clone(), i64_bytes(&label)),
            ],
            vec!["codes"],
        ),
        (
            "codes-truncated",
            vec![
                ("codes", ch.clone(), f32_bytes(&codes[..10])),
                ("label", lh.clone(), i64_bytes(&label)),
            ],
            vec!["array `codes`"],
        ),
    ];
    let mut paths: Vec<(String, PathBuf, Vec<&str>)> = Vec::new();
    for (name, members, needles) in files {
        let p = dir.join(format!("{name}.npz"));
        let m: Vec<(&str, &str, Vec<u8>)> = members
            .iter()
            .map(|(a, h, d)| (*a, h.as_str(), d.clone()))
            .collect();
        raw_npz(&p, &m);
        paths.push((name.to_string(), p, needles));
    }
    let garbage = dir.join("garbage.npz");
    std::fs::write(&garbage, b"\x00\x01 not a zip").unwrap();
    paths.push(("garbage".into(), garbage, vec![]));
    paths.push(("missing".into(), dir.join("absent.npz"), vec![]));
    for (name, p, needles) in paths {
        let file_name = p.file_name().unwrap().to_str().unwrap().to_string();
        let mut n = needles.clone();
        n.push(&file_name);
        for (role, train, test) in [("train", &p, &good), ("test", &good, &p)] {
            let o = root.join("out").join(format!("analyze-{name}-{role}"));
            cases.push(case(
                &format!("analyze-{role}/{name}"),
                &[
                    "analyze",
                    "--train",
                    s(train),
                    "--test",
                    s(test),
                    "--out",
                    s(&o),
                ],
                &n,
            ));
        }
    }
}

/// A tiny GPT-2 in Hugging Face layout (D 8, 2 heads, 1 layer, vocabulary 11, 16 positions).
fn gpt2_dir(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let (d, v, t) = (8usize, 11usize, 16usize);
    let mut map: HashMap<String, Tensor> = HashMap::new();
    let mut put = |n: &str, shape: &[usize]| {
        let len: usize = shape.iter().product();
        let vals: Vec<f32> = (0..len)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.05)
            .collect();
        map.insert(
            n.to_string(),
            Tensor::from_vec(vals, shape, &Device::Cpu).unwrap(),
        );
    };
    put("wte.weight", &[v, d]);
    put("wpe.weight", &[t, d]);
    for (n, shape) in [
        ("ln_1.weight", vec![d]),
        ("ln_1.bias", vec![d]),
        ("attn.c_attn.weight", vec![d, 3 * d]),
        ("attn.c_attn.bias", vec![3 * d]),
        ("attn.c_proj.weight", vec![d, d]),
        ("attn.c_proj.bias", vec![d]),
        ("ln_2.weight", vec![d]),
        ("ln_2.bias", vec![d]),
        ("mlp.c_fc.weight", vec![d, 4 * d]),
        ("mlp.c_fc.bias", vec![4 * d]),
        ("mlp.c_proj.weight", vec![4 * d, d]),
        ("mlp.c_proj.bias", vec![d]),
    ] {
        put(&format!("h.0.{n}"), &shape);
    }
    put("ln_f.weight", &[d]);
    put("ln_f.bias", &[d]);
    hyperlens_model::candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
    let cfg = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": d, "n_head": 2,
        "n_layer": 1, "n_positions": t, "vocab_size": v, "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new"
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

/// A tiny Llama GGUF (D 8, 2 heads, 1 layer, vocabulary 11), float32 tensors.
fn llama_gguf(path: &Path) {
    let (d, v, ff) = (8usize, 11usize, 16usize);
    let q = |shape: &[usize]| {
        let len: usize = shape.iter().product();
        let vals: Vec<f32> = (0..len)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.05)
            .collect();
        let t = Tensor::from_vec(vals, shape, &Device::Cpu).unwrap();
        QTensor::quantize(&t, GgmlDType::F32).unwrap()
    };
    let tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), q(&[v, d])),
        ("blk.0.attn_norm.weight".into(), q(&[d])),
        ("blk.0.attn_q.weight".into(), q(&[d, d])),
        ("blk.0.attn_k.weight".into(), q(&[d, d])),
        ("blk.0.attn_v.weight".into(), q(&[d, d])),
        ("blk.0.attn_output.weight".into(), q(&[d, d])),
        ("blk.0.ffn_norm.weight".into(), q(&[d])),
        ("blk.0.ffn_gate.weight".into(), q(&[ff, d])),
        ("blk.0.ffn_up.weight".into(), q(&[ff, d])),
        ("blk.0.ffn_down.weight".into(), q(&[d, ff])),
        ("output_norm.weight".into(), q(&[d])),
    ];
    use gguf_file::Value;
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(1)),
        ("llama.context_length", Value::U64(32)),
        ("llama.embedding_length", Value::U32(d as u32)),
        ("llama.feed_forward_length", Value::U32(ff as u32)),
        ("llama.attention.head_count", Value::U32(2)),
        ("llama.attention.head_count_kv", Value::U32(2)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.rope.dimension_count", Value::U32(4)),
    ];
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta_refs, &t_refs).unwrap();
}

/// Token models, Hugging Face GPT-2 directories and GGUF files, broken, with attention and circuits.
fn lm_cases(root: &Path, cases: &mut Vec<Case>) {
    let lm = root.join("lm");
    let token = lm.join("token");
    token_model(&token);
    let gpt2 = lm.join("gpt2");
    gpt2_dir(&gpt2);
    let gguf = lm.join("tiny.gguf");
    llama_gguf(&gguf);
    let out = root.join("out");
    let mut targets: Vec<(String, PathBuf, Vec<String>)> = Vec::new();
    let mut dir_mutant = |base: &Path, name: &str, needles: &[&str], edit: &dyn Fn(&Path)| {
        let d = mutant(base, &lm, name, edit);
        targets.push((
            name.into(),
            d,
            needles.iter().map(|n| n.to_string()).collect(),
        ));
    };
    let cfg = |d: &Path| d.join("config.json");
    dir_mutant(
        &token,
        "token-layers-1e7",
        &["config.json", "n_layers"],
        &|d| edit_json(&cfg(d), |v| v["n_layers"] = 10_000_000u64.into()),
    );
    dir_mutant(&token, "token-vocab-1e12", &["config.json"], &|d| {
        edit_json(&cfg(d), |v| v["vocab_size"] = 1_000_000_000_000u64.into())
    });
    dir_mutant(&token, "token-truncated", &["model.safetensors"], &|d| {
        let b = std::fs::read(d.join("model.safetensors")).unwrap();
        std::fs::write(d.join("model.safetensors"), &b[..b.len() / 2]).unwrap();
    });
    dir_mutant(&token, "token-no-config", &["config.json"], &|d| {
        std::fs::remove_file(cfg(d)).unwrap()
    });
    for (name, key, value) in [
        ("gpt2-layers-2e62", "n_layer", serde_json::json!(1u64 << 62)),
        ("gpt2-layers-u64max", "n_layer", serde_json::json!(u64::MAX)),
        (
            "gpt2-embd-1e12",
            "n_embd",
            serde_json::json!(1_000_000_000_000u64),
        ),
        ("gpt2-heads-0", "n_head", serde_json::json!(0)),
        ("gpt2-heads-3", "n_head", serde_json::json!(3)),
        (
            "gpt2-positions-string",
            "n_positions",
            serde_json::json!("many"),
        ),
        ("gpt2-vocab-negative", "vocab_size", serde_json::json!(-5)),
    ] {
        dir_mutant(&gpt2, name, &["config.json"], &|d| {
            edit_json(&cfg(d), |v| v[key] = value.clone())
        });
    }
    dir_mutant(&gpt2, "gpt2-layers-2", &["config.json", "n_layer"], &|d| {
        edit_json(&cfg(d), |v| v["n_layer"] = 2.into())
    });
    dir_mutant(&gpt2, "gpt2-no-weights", &["model.safetensors"], &|d| {
        std::fs::remove_file(d.join("model.safetensors")).unwrap()
    });
    dir_mutant(
        &gpt2,
        "gpt2-duplicate-key",
        &["wte.weight", "twice"],
        &|d| {
            let p = d.join("model.safetensors");
            let h = st_header(&p);
            let mut text = h.to_string();
            text.insert_str(
                text.len() - 1,
                &format!(",\"wte.weight\":{}", h["wte.weight"]),
            );
            set_st_header(&p, &text);
        },
    );
    let gguf_bytes = std::fs::read(&gguf).unwrap();
    let gdir = lm.join("gguf");
    std::fs::create_dir_all(&gdir).unwrap();
    let mut gguf_file_case = |name: &str, bytes: Vec<u8>| {
        let p = gdir.join(format!("{name}.gguf"));
        std::fs::write(&p, bytes).unwrap();
        targets.push((name.into(), p, vec![format!("{name}.gguf")]));
    };
    for frac in [0.0, 0.01, 0.05, 0.2, 0.5, 0.95] {
        let at = ((gguf_bytes.len() as f64) * frac) as usize;
        gguf_file_case(&format!("gguf-truncated-{at}"), gguf_bytes[..at].to_vec());
    }
    let mut b = gguf_bytes.clone();
    b[0] = b'X';
    gguf_file_case("gguf-bad-magic", b);
    // The tensor count (u64 at offset 8) and the metadata count (u64 at 16).
    for (name, off) in [("gguf-tensor-count", 8usize), ("gguf-kv-count", 16)] {
        let mut b = gguf_bytes.clone();
        b[off..off + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        gguf_file_case(name, b);
    }
    // The length of the first metadata key (u64 at 24).
    let mut b = gguf_bytes.clone();
    b[24..32].copy_from_slice(&(1u64 << 50).to_le_bytes());
    gguf_file_case("gguf-key-length", b);
    for (name, target, needles) in targets {
        let n: Vec<&str> = needles.iter().map(String::as_str).collect();
        cases.push(case(
            &format!("attention/{name}"),
            &[
                "attention",
                "--checkpoint",
                s(&target),
                "--tokens",
                "1,2,3",
                "--out",
                s(&out.join(format!("att-{name}.npz"))),
            ],
            &n,
        ));
        cases.push(case(
            &format!("circuits/{name}"),
            &[
                "circuits",
                "--checkpoint",
                s(&target),
                "--out",
                s(&out.join(format!("circ-{name}"))),
            ],
            &n,
        ));
    }
}

/// Flags: sizes over the budget, values out of range, unknown values.
fn flag_cases(root: &Path, cases: &mut Vec<Case>) {
    let ckpt = root.join("base");
    let c = s(&ckpt).to_string();
    let token = root.join("lm").join("token");
    let t = s(&token).to_string();
    let out = root.join("out");
    let o = |n: &str| s(&out.join(n)).to_string();
    let long_tokens: String = (0..5000)
        .map(|i| (i % 13).to_string())
        .collect::<Vec<_>>()
        .join(",");
    let flag_list: Vec<(&str, Vec<String>, Vec<&str>)> = vec![
        (
            "sample-n-1e12",
            vec![
                "tasks".into(),
                "sample".into(),
                "--split".into(),
                "paper-seed0".into(),
                "--n".into(),
                "1000000000000".into(),
                "--out".into(),
                o("s.npz"),
            ],
            vec!["--n"],
        ),
        (
            "sample-n-0",
            vec![
                "tasks".into(),
                "sample".into(),
                "--split".into(),
                "paper-seed0".into(),
                "--n".into(),
                "0".into(),
                "--out".into(),
                o("s.npz"),
            ],
            vec!["--n"],
        ),
        (
            "sample-split-unknown",
            vec![
                "tasks".into(),
                "sample".into(),
                "--split".into(),
                "paper-seed9".into(),
                "--out".into(),
                o("s.npz"),
            ],
            vec!["paper-seed9"],
        ),
        (
            "sample-set-bad",
            vec![
                "tasks".into(),
                "sample".into(),
                "--split".into(),
                "paper-seed0".into(),
                "--set".into(),
                "middle".into(),
                "--out".into(),
                o("s.npz"),
            ],
            vec!["--set"],
        ),
        (
            "eval-logits-n-1e12",
            vec![
                "eval".into(),
                "--checkpoint".into(),
                c.clone(),
                "--split".into(),
                "paper-seed0".into(),
                "--n".into(),
                "1000000000000".into(),
                "--save-logits".into(),
                o("l.npz"),
            ],
            vec!["--save-logits", "--n"],
        ),
        (
            "report-n-1e10",
            vec![
                "report".into(),
                "--checkpoint".into(),
                c.clone(),
                "--n".into(),
                "10000000000".into(),
                "--out".into(),
                o("report"),
            ],
            vec!["n = 10000000000", "memory budget"],
        ),
        (
            "report-split-unknown",
            vec![
                "report".into(),
                "--checkpoint".into(),
                c.clone(),
                "--split".into(),
                "paper-seed9".into(),
                "--out".into(),
                o("report"),
            ],
            vec!["paper-seed9"],
        ),
        (
            "eval-n-0",
            vec![
                "eval".into(),
                "--checkpoint".into(),
                c.clone(),
                "--split".into(),
                "paper-seed0".into(),
                "--n".into(),
                "0".into(),
            ],
            vec!["--n"],
        ),
        (
            "eval-batch-0",
            vec![
                "eval".into(),
                "--checkpoint".into(),
                c.clone(),
                "--split".into(),
                "paper-seed0".into(),
                "--batch".into(),
                "0".into(),
            ],
            vec!["--batch"],
        ),
        (
            "eval-no-split",
            vec!["eval".into(), "--checkpoint".into(), c.clone()],
            vec!["--split", "records no training split"],
        ),
        (
            "eval-split-garbage",
            vec![
                "eval".into(),
                "--checkpoint".into(),
                c.clone(),
                "--split".into(),
                "seedling".into(),
            ],
            vec!["seedling"],
        ),
        (
            "eval-n-negative",
            vec![
                "eval".into(),
                "--checkpoint".into(),
                c.clone(),
                "--split".into(),
                "paper-seed0".into(),
                "--n".into(),
                "-3".into(),
            ],
            vec!["-3"],
        ),
        (
            "eval-device-bad",
            vec![
                "eval".into(),
                "--checkpoint".into(),
                c.clone(),
                "--split".into(),
                "paper-seed0".into(),
                "--device".into(),
                "tpu".into(),
            ],
            vec!["tpu"],
        ),
        (
            "probe-batch-0",
            vec![
                "probe".into(),
                "--checkpoint".into(),
                c.clone(),
                "--split".into(),
                "paper-seed0".into(),
                "--batch".into(),
                "0".into(),
                "--out".into(),
                o("p.npz"),
            ],
            vec!["--batch"],
        ),
        (
            "probe-layers-99",
            vec![
                "probe".into(),
                "--checkpoint".into(),
                c.clone(),
                "--split".into(),
                "paper-seed0".into(),
                "--n".into(),
                "4".into(),
                "--layers".into(),
                "99".into(),
                "--out".into(),
                o("p.npz"),
            ],
            vec!["99"],
        ),
        (
            "probe-site-bad",
            vec![
                "probe".into(),
                "--checkpoint".into(),
                c.clone(),
                "--split".into(),
                "paper-seed0".into(),
                "--site".into(),
                "query:99;keys:1".into(),
                "--out".into(),
                o("p.npz"),
            ],
            vec!["99"],
        ),
        (
            "train-d-model-1e9",
            vec![
                "train".into(),
                "--task".into(),
                "sraven".into(),
                "--d-model".into(),
                "1000000000".into(),
                "--heads".into(),
                "4".into(),
                "--d-head".into(),
                "8".into(),
                "--d-mlp".into(),
                "16".into(),
                "--steps".into(),
                "2".into(),
                "--out".into(),
                o("run-big"),
            ],
            vec!["memory budget"],
        ),
        (
            "train-batch-1e9",
            vec![
                "train".into(),
                "--task".into(),
                "sraven".into(),
                "--steps".into(),
                "2".into(),
                "--batch".into(),
                "1000000000".into(),
                "--out".into(),
                o("run-b"),
            ],
            vec!["--batch", "memory budget"],
        ),
        (
            "train-eval-n-1e9",
            vec![
                "train".into(),
                "--task".into(),
                "sraven".into(),
                "--steps".into(),
                "2".into(),
                "--eval-n".into(),
                "1000000000".into(),
                "--out".into(),
                o("run-e"),
            ],
            vec!["--eval-n", "memory budget"],
        ),
        (
            "train-induction-batch-1e8",
            vec![
                "train".into(),
                "--task".into(),
                "induction".into(),
                "--steps".into(),
                "2".into(),
                "--batch".into(),
                "100000000".into(),
                "--out".into(),
                o("run-i"),
            ],
            vec!["--batch", "memory budget"],
        ),
        (
            "train-steps-0",
            vec![
                "train".into(),
                "--task".into(),
                "sraven".into(),
                "--steps".into(),
                "0".into(),
                "--out".into(),
                o("run0"),
            ],
            vec!["--steps"],
        ),
        (
            "train-mixer-bad",
            vec![
                "train".into(),
                "--task".into(),
                "sraven".into(),
                "--mixer".into(),
                "magic".into(),
                "--out".into(),
                o("run1"),
            ],
            vec!["magic"],
        ),
        (
            "attention-5000-tokens",
            vec![
                "attention".into(),
                "--checkpoint".into(),
                t.clone(),
                "--tokens".into(),
                long_tokens.clone(),
                "--out".into(),
                o("a.npz"),
            ],
            vec!["--tokens"],
        ),
        (
            "attention-token-out-of-vocab",
            vec![
                "attention".into(),
                "--checkpoint".into(),
                t.clone(),
                "--tokens".into(),
                "1,2,99".into(),
                "--out".into(),
                o("a.npz"),
            ],
            vec!["--tokens"],
        ),
        (
            "attention-tokens-empty",
            vec![
                "attention".into(),
                "--checkpoint".into(),
                t.clone(),
                "--tokens".into(),
                "".into(),
                "--out".into(),
                o("a.npz"),
            ],
            vec!["--tokens"],
        ),
        (
            "circuits-threads-1e5",
            vec![
                "circuits".into(),
                "--checkpoint".into(),
                t.clone(),
                "--threads".into(),
                "100000".into(),
                "--out".into(),
                o("c"),
            ],
            vec!["--threads"],
        ),
        (
            "budget-flag-garbage",
            vec![
                "--memory-budget".into(),
                "lots".into(),
                "info".into(),
                "--checkpoint".into(),
                c.clone(),
            ],
            vec!["--memory-budget"],
        ),
        (
            "budget-flag-zero",
            vec![
                "--memory-budget".into(),
                "0".into(),
                "info".into(),
                "--checkpoint".into(),
                c.clone(),
            ],
            vec!["--memory-budget"],
        ),
        (
            "budget-tiny",
            vec![
                "--memory-budget".into(),
                "1K".into(),
                "info".into(),
                "--checkpoint".into(),
                c.clone(),
            ],
            vec!["memory budget"],
        ),
        (
            "unknown-subcommand",
            vec!["frobnicate".into()],
            vec!["frobnicate"],
        ),
        (
            "unknown-flag",
            vec![
                "info".into(),
                "--checkpoint".into(),
                c.clone(),
                "--colour".into(),
            ],
            vec!["--colour"],
        ),
        (
            "out-is-a-file",
            vec![
                "tasks".into(),
                "sample".into(),
                "--split".into(),
                "paper-seed0".into(),
                "--n".into(),
                "4".into(),
                "--out".into(),
                format!("{}/sub.npz", c.clone() + "/config.json"),
            ],
            vec!["--out"],
        ),
    ];
    for (name, args, needles) in flag_list {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        cases.push(case(&format!("flags/{name}"), &a, &needles));
    }
}

#[test]
fn every_bad_input_gets_a_clear_error_within_bounded_memory() {
    let root = tempdir();
    let root = root.path();
    std::fs::create_dir_all(root.join("out")).unwrap();
    let mut cases = Vec::new();
    checkpoint_cases(root, &mut cases);
    problem_cases(root, &mut cases);
    code_cases(root, &mut cases);
    lm_cases(root, &mut cases);
    flag_cases(root, &mut cases);
    crate::corpus_sweeps::sweep_cases(root, &mut cases);
    crate::corpus_values::value_cases(root, &mut cases);
    assert!(cases.len() >= 150, "only {} cases", cases.len());
    let mut tally = Tally::default();
    let mut kinds: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for c in &cases {
        run_case(c, &mut tally);
        *kinds
            .entry(c.name.split('/').next().unwrap_or(""))
            .or_default() += 1;
    }
    println!("cases per command and input kind: {kinds:?}");
    println!(
        "bad-input corpus: {} cases, {} clear errors, {} unclear errors, {} panics, {} aborts, \
         {} hangs, {} silent successes (each under RLIMIT_AS {} GiB, killed after {} s)",
        cases.len(),
        tally.clear,
        tally.unclear.len(),
        tally.panics.len(),
        tally.aborts.len(),
        tally.hangs.len(),
        tally.silent.len(),
        AS_LIMIT >> 30,
        HANG_SECS
    );
    let bad: Vec<&String> = tally
        .unclear
        .iter()
        .chain(&tally.panics)
        .chain(&tally.aborts)
        .chain(&tally.hangs)
        .chain(&tally.silent)
        .collect();
    assert!(
        bad.is_empty(),
        "{} of {} cases did not give a clear error:\n{}",
        bad.len(),
        cases.len(),
        bad.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
