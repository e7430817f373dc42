//! Bad-input corpus cases (see [`crate::corpus`]): hostile values on the surfaces of the fuzzy-logic
//! task (problem files read by `eval` / `probe`, code files read by `analyze`) and hook patterns
//! (`cache --hooks`).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use ndarray::ArrayD;

use crate::corpus::{case, npy_header, Case};
use crate::util::{array, hyperlens, s, sraven_checkpoint, token_model};
use hyperlens_model::Mixer;

/// One array of an `.npz` to write.
#[derive(Clone)]
pub(crate) enum Arr {
    F32(ArrayD<f32>),
    U8(ArrayD<u8>),
    I64(ArrayD<i64>),
}

/// Writes `arrays` as an uncompressed `.npz` at `path`.
pub(crate) fn write_arrays(path: &Path, arrays: &[(&str, Arr)]) {
    let mut npz = ndarray_npy::NpzWriter::new(std::fs::File::create(path).unwrap());
    for (name, a) in arrays {
        match a {
            Arr::F32(a) => npz.add_array(*name, a).unwrap(),
            Arr::U8(a) => npz.add_array(*name, a).unwrap(),
            Arr::I64(a) => npz.add_array(*name, a).unwrap(),
        }
    }
    npz.finish().unwrap();
}

/// Appends a raw `.npy` member `name` (header dict and data bytes, as numpy would write them) to
/// the archive at `path`.
pub(crate) fn append_member(path: &Path, name: &str, header: &str, data: &[u8]) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut zip = zip::ZipWriter::new_append(file).unwrap();
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file(format!("{name}.npy"), opts).unwrap();
    zip.write_all(&crate::corpus::npy_bytes(header, data))
        .unwrap();
    zip.finish().unwrap();
}

/// Adds two arrays numpy users carry and hyperlens never reads: a unicode `<U5` array `notes` and
/// an object array `meta` (its pickle never unpickled).
pub(crate) fn append_unread_arrays(path: &Path) {
    let notes: Vec<u8> = "hello"
        .chars()
        .chain("world".chars())
        .flat_map(|c| (c as u32).to_le_bytes())
        .collect();
    append_member(path, "notes", &npy_header("<U5", &[2]), &notes);
    append_member(
        path,
        "meta",
        &npy_header("|O", &[1]),
        b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00]\x94K\x01a.",
    );
}

/// Trains a tiny fuzzy-logic checkpoint (2 steps) at `out`.
pub(crate) fn logic_checkpoint(out: &Path) {
    hyperlens(&[
        "train",
        "--task",
        "logic",
        "--layers",
        "1",
        "--d-model",
        "16",
        "--heads",
        "4",
        "--d-head",
        "2",
        "--d-mlp",
        "32",
        "--steps",
        "2",
        "--batch",
        "8",
        "--warmup",
        "1",
        "--eval-every",
        "0",
        "--eval-n",
        "16",
        "--out",
        s(out),
    ])
    .success();
}

/// The arrays of a logic problem file, to edit.
struct LogicFile {
    x: ArrayD<f32>,
    y: ArrayD<f32>,
    targets: ArrayD<f32>,
    terms: ArrayD<u8>,
    term_ids: ArrayD<i64>,
}

impl LogicFile {
    fn read(path: &Path) -> LogicFile {
        LogicFile {
            x: array(path, "x"),
            y: array(path, "y"),
            targets: array(path, "targets"),
            terms: array(path, "terms"),
            term_ids: array(path, "term_ids"),
        }
    }

    fn write(&self, path: &Path) {
        write_arrays(
            path,
            &[
                ("x", Arr::F32(self.x.clone())),
                ("y", Arr::F32(self.y.clone())),
                ("targets", Arr::F32(self.targets.clone())),
                ("terms", Arr::U8(self.terms.clone())),
                ("term_ids", Arr::I64(self.term_ids.clone())),
            ],
        );
    }
}

/// The arrays of a logic code file (`probe` on a logic checkpoint), to edit.
struct LogicCodes {
    codes: ArrayD<f32>,
    terms: ArrayD<i64>,
    term_ids: ArrayD<i64>,
    target: ArrayD<f32>,
}

impl LogicCodes {
    fn read(path: &Path) -> LogicCodes {
        LogicCodes {
            codes: array(path, "codes"),
            terms: array(path, "terms"),
            term_ids: array(path, "term_ids"),
            target: array(path, "target"),
        }
    }

    fn write(&self, path: &Path) {
        write_arrays(
            path,
            &[
                ("codes", Arr::F32(self.codes.clone())),
                ("terms", Arr::I64(self.terms.clone())),
                ("term_ids", Arr::I64(self.term_ids.clone())),
                ("target", Arr::F32(self.target.clone())),
            ],
        );
    }
}

/// Adds this file's cases to `cases`; inputs are written under `root`.
pub(crate) fn value_cases(root: &Path, cases: &mut Vec<Case>) {
    let dir = root.join("values");
    std::fs::create_dir_all(&dir).unwrap();
    let run = dir.join("logic-run");
    logic_checkpoint(&run);
    hook_cases(&dir, &run, cases);
    logic_problem_cases(&dir, &run, cases);
    logic_code_cases(&dir, &run, cases);
    group_cases(&dir, cases);
}

/// Copies the directory tree `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A batched group (`train --seeds 0,1`) stopped after its checkpoint at step 4 (no `train.json`
/// yet), with a file of one member's checkpoint deleted: `train --resume` names that file.
fn group_cases(dir: &Path, cases: &mut Vec<Case>) {
    let base = dir.join("group-base");
    hyperlens(&[
        "train",
        "--task",
        "logic",
        "--seeds",
        "0,1",
        "--layers",
        "1",
        "--d-model",
        "16",
        "--heads",
        "4",
        "--d-head",
        "2",
        "--d-mlp",
        "32",
        "--steps",
        "4",
        "--batch",
        "8",
        "--warmup",
        "1",
        "--eval-every",
        "0",
        "--eval-n",
        "16",
        "--checkpoint-every",
        "2",
        "--out",
        s(&base),
    ])
    .success();
    for member in ["seed-0", "seed-1"] {
        std::fs::remove_file(base.join(member).join("train.json")).unwrap();
    }
    for file in [
        "optimizer.safetensors",
        "model.safetensors",
        "train_state.json",
    ] {
        let group = dir.join(format!("group-no-{file}"));
        copy_tree(&base, &group);
        std::fs::remove_file(group.join("seed-1/checkpoints/step-00000004").join(file)).unwrap();
        cases.push(case(
            &format!("values-group/resume-without-{file}"),
            &["train", "--out", s(&group), "--resume"],
            &["seed-1", "step-00000004", file],
        ));
    }
}

/// Hook patterns that would backtrack exponentially, on every kind of model: each matches nothing,
/// and the error must come at once.
fn hook_cases(dir: &Path, logic_run: &Path, cases: &mut Vec<Case>) {
    let sraven = dir.join("sraven-ck");
    sraven_checkpoint(&sraven, Mixer::Hyla, 5);
    let token = dir.join("token-ck");
    token_model(&token);
    let out = dir.join("acts.npz");
    let o = s(&out).to_string();
    let stars10 = format!("{}zzz", "**".repeat(10));
    let stars30 = format!("{}x", "**".repeat(30));
    let single41 = format!("{}#", "*".repeat(41));
    let dots = "*.".repeat(30);
    let interleaved = format!("{}hook_patternX", "**b".repeat(20));
    let huge = format!("{}!", "*".repeat(20_000));
    let mixed = format!("hook_embed,{stars30}");
    let patterns: [(&str, &str); 8] = [
        ("20-stars", stars10.as_str()),
        ("60-stars", stars30.as_str()),
        ("41-single-stars", single41.as_str()),
        ("30-dotted-stars", dots.as_str()),
        ("interleaved", interleaved.as_str()),
        ("20000-stars", huge.as_str()),
        ("valid-then-blowup", mixed.as_str()),
        ("empty", ""),
    ];
    let sraven_base = [
        "cache",
        "--checkpoint",
        s(&sraven),
        "--split",
        "paper-seed0",
        "--n",
        "2",
    ];
    for (name, p) in patterns {
        let needle = if name == "valid-then-blowup" {
            stars30.as_str()
        } else {
            p
        };
        // The message quotes the pattern; a 20,000-character one is checked by its tail.
        let needle = if needle.len() > 100 {
            &needle[needle.len() - 40..]
        } else {
            needle
        };
        let mut a = sraven_base.to_vec();
        a.extend(["--hooks", p, "--out", &o]);
        cases.push(case(
            &format!("values-hooks/sraven-{name}"),
            &a,
            &["matches no hook point", needle],
        ));
    }
    for (name, p) in [
        ("60-stars", stars30.as_str()),
        ("41-single-stars", single41.as_str()),
    ] {
        cases.push(case(
            &format!("values-hooks/token-{name}"),
            &[
                "cache",
                "--checkpoint",
                s(&token),
                "--tokens",
                "1,2,3",
                "--hooks",
                p,
                "--out",
                &o,
            ],
            &["matches no hook point", p],
        ));
        cases.push(case(
            &format!("values-hooks/logic-{name}"),
            &[
                "cache",
                "--checkpoint",
                s(logic_run),
                "--n",
                "2",
                "--hooks",
                p,
                "--out",
                &o,
            ],
            &["matches no hook point", p],
        ));
    }
}

/// Logic problem files whose values are not what the task defines, each read by `eval` and by
/// `probe`.
fn logic_problem_cases(dir: &Path, run: &Path, cases: &mut Vec<Case>) {
    let good = dir.join("logic-id.npz");
    hyperlens(&[
        "tasks",
        "sample",
        "--task",
        "logic",
        "--set",
        "id",
        "--n",
        "12",
        "--out",
        s(&good),
    ])
    .success();
    let base = LogicFile::read(&good);
    type Edit = Box<dyn Fn(&mut LogicFile)>;
    let edits: Vec<(&str, Edit, Vec<&str>)> = vec![
        (
            "y-nan",
            Box::new(|f| f.y[[3]] = f32::NAN),
            vec!["`y`", "[3]", "NaN"],
        ),
        (
            "y-inf",
            Box::new(|f| f.y[[0]] = f32::INFINITY),
            vec!["`y`", "[0]", "inf"],
        ),
        (
            "y-above-1",
            Box::new(|f| f.y[[5]] = 1.5),
            vec!["`y`", "[5]", "1.5"],
        ),
        (
            "y-negative",
            Box::new(|f| f.y[[11]] = -0.25),
            vec!["`y`", "[11]", "-0.25"],
        ),
        (
            "targets-nan",
            Box::new(|f| f.targets[[2, 7]] = f32::NAN),
            vec!["`targets`", "[2, 7]", "NaN"],
        ),
        (
            "targets-neg-inf",
            Box::new(|f| f.targets[[0, 0]] = f32::NEG_INFINITY),
            vec!["`targets`", "[0, 0]", "-inf"],
        ),
        (
            "targets-1e30",
            Box::new(|f| f.targets[[4, 1]] = 1e30),
            vec!["`targets`", "[4, 1]"],
        ),
        (
            "x-nan",
            Box::new(|f| f.x[[1, 2, 3]] = f32::NAN),
            vec!["`x`", "[1, 2, 3]", "NaN"],
        ),
        (
            "terms-not-bits",
            Box::new(|f| f.terms[[6, 1, 0]] = 9),
            vec!["`terms`", "[6, 1, 0]", "9"],
        ),
        (
            "term-ids-1e12",
            Box::new(|f| f.term_ids[[0, 0]] = 1_000_000_000_000),
            vec!["`term_ids`", "1000000000000"],
        ),
        (
            "term-ids-negative",
            Box::new(|f| f.term_ids[[2, 1]] = -3),
            vec!["`term_ids`", "-3"],
        ),
        (
            "term-ids-2-to-the-l",
            Box::new(|f| f.term_ids[[1, 0]] = 16),
            vec!["`term_ids`", "16", "0..16"],
        ),
        (
            "terms-disagree-with-ids",
            Box::new(|f| {
                let id = f.term_ids[[3, 0]];
                f.term_ids[[3, 0]] = id ^ 1;
            }),
            vec!["`terms`", "term_ids[3, 0]"],
        ),
    ];
    for (name, edit, needles) in edits {
        let path = dir.join(format!("logic-{name}.npz"));
        let mut f = LogicFile {
            x: base.x.clone(),
            y: base.y.clone(),
            targets: base.targets.clone(),
            terms: base.terms.clone(),
            term_ids: base.term_ids.clone(),
        };
        edit(&mut f);
        f.write(&path);
        let file = format!("logic-{name}.npz");
        let mut n: Vec<&str> = vec![&file];
        n.extend(&needles);
        cases.push(case(
            &format!("values-logic-problems/eval-{name}"),
            &["eval", "--checkpoint", s(run), "--problems", s(&path)],
            &n,
        ));
        let out = dir.join("probe-out.npz");
        cases.push(case(
            &format!("values-logic-problems/probe-{name}"),
            &[
                "probe",
                "--checkpoint",
                s(run),
                "--problems",
                s(&path),
                "--out",
                s(&out),
            ],
            &n,
        ));
    }
    // An array that is read keeps its dtype check: `y` as unicode.
    let path = dir.join("logic-y-unicode.npz");
    let mut members: Vec<(&str, Arr)> = vec![
        ("x", Arr::F32(base.x.clone())),
        ("targets", Arr::F32(base.targets.clone())),
        ("terms", Arr::U8(base.terms.clone())),
        ("term_ids", Arr::I64(base.term_ids.clone())),
    ];
    write_arrays(&path, &members);
    append_member(
        &path,
        "y",
        &npy_header("<U1", &[12]),
        &"abcdefghijkl"
            .chars()
            .flat_map(|c| (c as u32).to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    cases.push(case(
        "values-logic-problems/eval-y-unicode",
        &["eval", "--checkpoint", s(run), "--problems", s(&path)],
        &["logic-y-unicode.npz", "`y`"],
    ));
    // `y` of the wrong length beside an unread unicode array: the read array is still checked.
    members.push(("y", Arr::F32(ArrayD::from_elem(vec![5], 0.5))));
    let path = dir.join("logic-y-short.npz");
    write_arrays(&path, &members);
    append_unread_arrays(&path);
    cases.push(case(
        "values-logic-problems/eval-y-short-with-notes",
        &["eval", "--checkpoint", s(run), "--problems", s(&path)],
        &["logic-y-short.npz", "`y`"],
    ));
}

/// Logic code files (`probe` output) with term indices, bits and targets that are not what the
/// task defines, read by `analyze` as the training or the test set.
fn logic_code_cases(dir: &Path, run: &Path, cases: &mut Vec<Case>) {
    let good = dir.join("codes-good.npz");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(run),
        "--set",
        "id",
        "--n",
        "40",
        "--out",
        s(&good),
    ])
    .success();
    let base = LogicCodes::read(&good);
    type Edit = Box<dyn Fn(&mut LogicCodes)>;
    let edits: Vec<(&str, Edit, Vec<&str>)> = vec![
        (
            "term-ids-1e12",
            Box::new(|c| c.term_ids[[0, 1]] = 1_000_000_000_000),
            vec!["`term_ids`", "1000000000000", "[0, 1]"],
        ),
        (
            "term-ids-1e7",
            Box::new(|c| c.term_ids[[5, 0]] = 10_000_000),
            vec!["`term_ids`", "10000000"],
        ),
        (
            "term-ids-i64-max",
            Box::new(|c| c.term_ids[[1, 1]] = i64::MAX),
            vec!["`term_ids`", "9223372036854775807"],
        ),
        (
            "term-ids-negative",
            Box::new(|c| c.term_ids[[2, 0]] = -1),
            vec!["`term_ids`", "-1"],
        ),
        (
            "term-ids-16",
            Box::new(|c| c.term_ids[[3, 0]] = 16),
            vec!["`term_ids`", "16"],
        ),
        (
            "terms-not-bits",
            Box::new(|c| c.terms[[4, 0, 2]] = 5),
            vec!["`terms`", "[4, 0, 2]"],
        ),
        (
            "terms-negative",
            Box::new(|c| c.terms[[0, 0, 0]] = -1),
            vec!["`terms`", "-1"],
        ),
        (
            "terms-disagree-with-ids",
            Box::new(|c| {
                let id = c.term_ids[[7, 1]];
                c.term_ids[[7, 1]] = id ^ 2;
            }),
            vec!["`terms`", "term_ids[7, 1]"],
        ),
        (
            "target-nan",
            Box::new(|c| c.target[[9]] = f32::NAN),
            vec!["`target`", "[9]", "NaN"],
        ),
        (
            "target-above-1",
            Box::new(|c| c.target[[0]] = 7.0),
            vec!["`target`", "[0]", "7"],
        ),
        (
            "codes-nan",
            Box::new(|c| c.codes[[3, 0, 1, 0, 0]] = f32::NAN),
            vec!["`codes`", "NaN"],
        ),
    ];
    let out = dir.join("analysis");
    for (i, (name, edit, needles)) in edits.into_iter().enumerate() {
        let path = dir.join(format!("codes-{name}.npz"));
        let mut c = LogicCodes {
            codes: base.codes.clone(),
            terms: base.terms.clone(),
            term_ids: base.term_ids.clone(),
            target: base.target.clone(),
        };
        edit(&mut c);
        c.write(&path);
        let file = format!("codes-{name}.npz");
        let mut n: Vec<&str> = vec![&file];
        n.extend(&needles);
        // Alternately the training and the test set.
        let (train, test): (PathBuf, PathBuf) = if i % 2 == 0 {
            (path.clone(), good.clone())
        } else {
            (good.clone(), path.clone())
        };
        cases.push(case(
            &format!("values-logic-codes/analyze-{name}"),
            &[
                "analyze",
                "--train",
                s(&train),
                "--test",
                s(&test),
                "--out",
                s(&out),
            ],
            &n,
        ));
    }
}
