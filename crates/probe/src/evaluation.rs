//! `hyperlens eval` on a SRAVEN checkpoint: accuracy, per-feature accuracy and loss over a problem
//! file or a sampled stream ([`evaluate_problems`]), and the logits file of `--save-logits`
//! ([`write_logits`]).

use std::path::Path;

use hyperlens_io::budget::check_alloc;
use hyperlens_io::keys::logits as keys;
use hyperlens_model::eval::{evaluate_stream, evaluate_with, EvalOutput};
use hyperlens_model::{Config, Evaluator};

use crate::error::Result;
use crate::inputs::SravenProblems;

/// Checks that keeping the logits of `n` problems fits the memory budget: logits `[N, F, C]` f32
/// plus predictions and targets `[N, F]` i64, twice over while the batches are joined.
///
/// # Errors
/// The memory budget's error, naming `--save-logits` and the count.
pub fn check_logits_budget(n: usize, cfg: &Config) -> Result<()> {
    let per = 4 * cfg.d_out as u128 + 16;
    let bytes = 2 * (n as u128) * (cfg.n_outputs as u128) * per;
    Ok(check_alloc(format!("--save-logits for --n {n}"), bytes)?)
}

/// Evaluates `ev` on `problems` in batches of `batch` (memory bounded by the batch, plus the
/// logits when `keep_logits`, checked first against the memory budget); `progress(done)` after
/// each batch. A problem file's set is checked against the model first.
///
/// # Errors
/// The memory budget's error; problems that do not fit the model; the stream's and the model's
/// errors.
pub fn evaluate_problems(
    ev: &Evaluator,
    problems: SravenProblems,
    batch: usize,
    keep_logits: bool,
    progress: impl FnMut(usize),
) -> Result<EvalOutput> {
    if keep_logits {
        check_logits_budget(problems.len(), ev.config())?;
    }
    Ok(match problems {
        SravenProblems::Set(set) => evaluate_with(ev, &set, batch, keep_logits, progress)?,
        SravenProblems::Sampled { stream, n } => {
            evaluate_stream(ev, stream.batches(n, batch), keep_logits, progress)?
        }
    })
}

/// Writes `--save-logits`' file: `logits [N, F, M]` (f32), `pred [N, F]` and `y [N, F]` (i64)
/// of an evaluation that kept them (nothing is written otherwise).
///
/// # Errors
/// A failed write, naming the file.
pub fn write_logits(path: &Path, out: &EvalOutput) -> Result<()> {
    if let (Some(logits), Some(pred), Some(y)) = (&out.logits, &out.pred, &out.y) {
        hyperlens_io::write_npz(path, |npz| -> Result<()> {
            npz.add(keys::LOGITS, logits)?;
            npz.add(keys::PRED, pred)?;
            npz.add(keys::Y, y)?;
            Ok(())
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyperlens_model::Mixer;
    use hyperlens_tasks::sraven::{SampleStream, Set, Split};

    fn model() -> Evaluator {
        let cfg = Config {
            n_layers: 1,
            d_model: 16,
            n_heads: 2,
            d_head: 8,
            d_mlp: 16,
            ..Config::sraven_base(Mixer::Softmax)
        };
        let dev = candle_core::Device::Cpu;
        let (model, _) = hyperlens_model::Transformer::init(&cfg, 5, &dev).unwrap();
        Evaluator::new(model).unwrap()
    }

    #[test]
    fn a_held_set_and_its_stream_evaluate_alike_and_the_logits_are_written() {
        let ev = model();
        let split = Split::named("paper-seed0").unwrap();
        let stream = || SampleStream::new(&split, Set::Ood, 4, false).unwrap();
        let set = stream().batches(30, 30).next().unwrap().unwrap();
        let held =
            evaluate_problems(&ev, SravenProblems::Set(set.clone()), 7, true, |_| {}).unwrap();
        let mut done = Vec::new();
        let streamed = evaluate_problems(
            &ev,
            SravenProblems::Sampled {
                stream: stream(),
                n: 30,
            },
            7,
            true,
            |d| done.push(d),
        )
        .unwrap();
        assert_eq!(done.last(), Some(&30));
        assert_eq!(held.metrics.n, 30);
        assert_eq!(held.metrics.accuracy, streamed.metrics.accuracy);
        assert!((held.metrics.loss - streamed.metrics.loss).abs() < 1e-9);
        assert_eq!(held.logits, streamed.logits);
        // The targets kept are the problems' answers.
        assert_eq!(held.y.as_ref().unwrap(), &set.y);
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("logits.npz");
        write_logits(&path, &held).unwrap();
        let names = zip::ZipArchive::new(std::fs::File::open(&path).unwrap())
            .unwrap()
            .file_names()
            .map(str::to_string)
            .collect::<std::collections::BTreeSet<_>>();
        assert_eq!(names.len(), 3, "{names:?}");
        // Without kept logits nothing is written.
        let none = evaluate_problems(&ev, SravenProblems::Set(set), 7, false, |_| {}).unwrap();
        let other = tmp.path().join("none.npz");
        write_logits(&other, &none).unwrap();
        assert!(!other.exists());
    }
}
