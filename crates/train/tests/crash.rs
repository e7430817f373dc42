//! Fault injection: every checkpoint of a tiny run (the first one at step 0, one in the middle and
//! the final one) is stopped after each of its file operations in turn, as a kill there would stop
//! it (nothing after that point runs, nothing is cleaned up), and the run is then continued with
//! `resume`. It must end exactly as an uninterrupted run: the same weights and optimiser state bit
//! for bit, the same `metrics.csv` rows (none lost, none twice), a `train.json` with the same final
//! evaluation, and no leftover files. CPU; run with `CANDLE_NUM_THREADS=1`.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;

use candle_core::Device;
use hyperlens_train::checkpoint::CHECKPOINTS_DIR;
use hyperlens_train::metrics::{read_metrics, MetricsRow, METRICS_FILE};
use hyperlens_train::state::{OPTIMIZER_FILE, RECORD_FILE};
use hyperlens_train::{
    train, Evaluation, Event, ModelSize, RunOptions, Task, TrainError, TrainRecord, TrainSettings,
};

/// A tiny SRAVEN run: D 16, 2 heads of 4, 1 layer, batch 8; 6 updates, a checkpoint, a log row and
/// an evaluation every 3.
fn tiny() -> TrainSettings {
    let mut s = TrainSettings::for_task(Task::Sraven);
    s.size = Some(ModelSize {
        d_model: 16,
        n_heads: 2,
        d_head: 4,
        d_mlp: 16,
    });
    s.layers = 1;
    s.steps = 6;
    s.batch = 8;
    s.warmup = 2;
    s.eval_every = 3;
    s.eval_n = 16;
    s.checkpoint_every = 3;
    s.log_every = 3;
    s
}

fn options(resume: bool) -> RunOptions {
    RunOptions {
        resume,
        ..Default::default()
    }
}

/// Every tensor of a safetensors file as raw bits (the bytes of two files may differ in the order
/// of the header's metadata).
fn tensor_bits(path: &Path) -> BTreeMap<String, Vec<u64>> {
    candle_core::safetensors::load(path, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .map(|(k, t)| {
            let t = t.flatten_all().unwrap();
            let bits = match t.dtype() {
                candle_core::DType::F32 => t
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits() as u64)
                    .collect(),
                _ => t
                    .to_vec1::<i64>()
                    .unwrap()
                    .iter()
                    .map(|&x| x as u64)
                    .collect(),
            };
            (k, bits)
        })
        .collect()
}

/// The rows of `metrics.csv` without their times.
fn rows(dir: &Path) -> Vec<MetricsRow> {
    read_metrics(&dir.join(METRICS_FILE))
        .unwrap()
        .into_iter()
        .map(|r| MetricsRow {
            wall_time_s: 0.0,
            steps_per_s: None,
            ..r
        })
        .collect()
}

fn record(dir: &Path) -> TrainRecord {
    serde_json::from_str(&std::fs::read_to_string(dir.join(RECORD_FILE)).unwrap()).unwrap()
}

/// The entries of a directory whose names start with a dot (temporary files, staging directories).
fn hidden(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    v.sort();
    v
}

#[test]
fn a_kill_at_any_file_operation_of_any_checkpoint_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let s = tiny();
    let straight = tmp.path().join("straight");
    let mut points: Vec<(u64, String)> = Vec::new();
    train(&straight, &s, &options(false), |e| {
        if let Event::CheckpointWrite { step, op } = e {
            points.push((*step, op.to_string()));
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    let steps: Vec<u64> = {
        let mut v: Vec<u64> = points.iter().map(|p| p.0).collect();
        v.dedup();
        v
    };
    assert_eq!(steps, [0, 3, 6], "{points:?}");
    let want_rows = rows(&straight);
    let want_eval = record(&straight).final_eval;
    eprintln!("{} injection points: {points:?}", points.len());

    let mut failures = Vec::new();
    for (k, (step, op)) in points.iter().enumerate() {
        let what = format!("kill {k} (step {step}, after `{op}`)");
        let run = tmp.path().join(format!("killed-{k}"));
        let mut seen = 0;
        let r = train(&run, &s, &options(false), |e| match e {
            Event::CheckpointWrite { .. } => {
                seen += 1;
                if seen == k + 1 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            }
            _ => ControlFlow::Continue(()),
        });
        if !matches!(&r, Err(TrainError::Interrupted(m)) if m.contains(op.as_str())) {
            failures.push(format!("{what}: the writer did not stop there: {r:?}"));
            continue;
        }
        if let Err(e) = check_resume(&straight, &run, &s, &want_rows, &want_eval) {
            failures.push(format!("{what}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} injection points failed:\n{}",
        failures.len(),
        points.len(),
        failures.join("\n")
    );
}

/// Resumes the killed run in `run` and compares it with the uninterrupted one in `straight`.
fn check_resume(
    straight: &Path,
    run: &Path,
    s: &TrainSettings,
    want_rows: &[MetricsRow],
    want_eval: &Evaluation,
) -> Result<(), String> {
    let resumed = train(run, s, &options(true), |_| ControlFlow::Continue(()))
        .map_err(|e| format!("resume failed: {e}"))?;
    if !resumed.completed {
        return Err("the resumed run did not complete".into());
    }
    for f in ["model.safetensors", OPTIMIZER_FILE] {
        if tensor_bits(&straight.join(f)) != tensor_bits(&run.join(f)) {
            return Err(format!("{f} differs from the uninterrupted run's"));
        }
    }
    let got = rows(run);
    if got != want_rows {
        let steps = |r: &[MetricsRow]| r.iter().map(|r| r.step).collect::<Vec<_>>();
        return Err(format!(
            "metrics.csv rows at steps {:?}, uninterrupted {:?} (or values differ)",
            steps(&got),
            steps(want_rows)
        ));
    }
    if !run.join(RECORD_FILE).is_file() {
        return Err("no train.json".into());
    }
    if &record(run).final_eval != want_eval {
        return Err("train.json: another final evaluation".into());
    }
    let ckpts = run.join(CHECKPOINTS_DIR);
    let left = [hidden(run), hidden(&ckpts)].concat();
    if !left.is_empty() {
        return Err(format!("leftovers {left:?}"));
    }
    let steps: Vec<String> = std::fs::read_dir(&ckpts)
        .map_err(|e| format!("{}: {e}", ckpts.display()))?
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    if steps != ["step-00000006"] {
        return Err(format!("step directories {steps:?}"));
    }
    // The run directory is itself the final checkpoint.
    hyperlens_model::Transformer::load(run, &Device::Cpu).map_err(|e| e.to_string())?;
    Ok(())
}
