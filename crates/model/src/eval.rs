//! Batched evaluation of a model on a SRAVEN problem set: accuracy (all `F` features right, the
//! paper's SRAVEN accuracy), per-feature accuracy and cross-entropy loss (`docs/spec/sraven.md`,
//! "Tokens, targets, metrics"). Memory is bounded by the batch size (plus the logits if kept).

use candle_core::{Device, Tensor};
use hyperlens_tasks::sraven::{AsProblemSet, ProblemSet, ProblemSetView};
use ndarray::{s, Array2, Array3, ArrayView2, ArrayView3};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::evaluator::Evaluator;

/// Metrics of a model over a problem set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    /// Number of problems.
    pub n: usize,
    /// Fraction of problems with all `F` features right (the paper's SRAVEN accuracy), in [0, 1].
    pub accuracy: f64,
    /// Per output position `f`, the fraction of problems whose feature `f` is right.
    pub per_feature_accuracy: Vec<f64>,
    /// Softmax cross-entropy, mean over problems and features (nats).
    pub loss: f64,
}

/// Streaming accumulator of [`EvalMetrics`] over batches of logits and targets.
#[derive(Debug, Clone)]
pub struct MetricsAccumulator {
    n: usize,
    all_right: usize,
    right: Vec<usize>,
    loss_sum: f64,
}

impl MetricsAccumulator {
    /// An empty accumulator for `n_outputs` output positions.
    pub fn new(n_outputs: usize) -> MetricsAccumulator {
        MetricsAccumulator {
            n: 0,
            all_right: 0,
            right: vec![0; n_outputs],
            loss_sum: 0.0,
        }
    }

    /// Adds a batch; returns the predicted classes (argmax).
    ///
    /// # Shapes
    /// `logits [B, F, C]`, `y [B, F]` with values in `0..C`; returns `pred [B, F]`.
    ///
    /// # Errors
    /// [`ModelError::Input`] on mismatched shapes or a target out of range.
    pub fn add(&mut self, logits: ArrayView3<f32>, y: ArrayView2<i64>) -> Result<Array2<i64>> {
        let (b, f, c) = logits.dim();
        if y.dim() != (b, f) || f != self.right.len() {
            return Err(ModelError::Input(format!(
                "logits {:?} and targets {:?} disagree (expected {} output positions)",
                logits.shape(),
                y.shape(),
                self.right.len()
            )));
        }
        let mut pred = Array2::<i64>::zeros((b, f));
        for i in 0..b {
            let mut all = true;
            for j in 0..f {
                let target = y[[i, j]];
                if target < 0 || target as usize >= c {
                    return Err(ModelError::Input(format!(
                        "target y[{i}, {j}] = {target} outside 0..{c}"
                    )));
                }
                let row = logits.slice(s![i, j, ..]);
                let (mut best, mut best_v) = (0usize, f32::NEG_INFINITY);
                for (k, &v) in row.iter().enumerate() {
                    if v > best_v {
                        best = k;
                        best_v = v;
                    }
                }
                let max = best_v as f64;
                let lse = max
                    + row
                        .iter()
                        .map(|&v| (v as f64 - max).exp())
                        .sum::<f64>()
                        .ln();
                self.loss_sum += lse - row[target as usize] as f64;
                pred[[i, j]] = best as i64;
                if best as i64 == target {
                    self.right[j] += 1;
                } else {
                    all = false;
                }
            }
            if all {
                self.all_right += 1;
            }
        }
        self.n += b;
        Ok(pred)
    }

    /// The metrics so far (zeros for an empty accumulator).
    pub fn finish(&self) -> EvalMetrics {
        let n = self.n.max(1) as f64;
        EvalMetrics {
            n: self.n,
            accuracy: self.all_right as f64 / n,
            per_feature_accuracy: self.right.iter().map(|&r| r as f64 / n).collect(),
            loss: self.loss_sum / (n * self.right.len().max(1) as f64),
        }
    }
}

/// Moves a batch of inputs to the device.
///
/// # Shapes
/// `x [B, T, M]` -> tensor `[B, T, M]` f32.
///
/// # Errors
/// Candle errors.
pub fn batch_tensor(x: &Array3<f32>, device: &Device) -> Result<Tensor> {
    let (b, t, m) = x.dim();
    let data: Vec<f32> = x.as_standard_layout().iter().copied().collect();
    Ok(Tensor::from_vec(data, (b, t, m), device)?)
}

/// The result of [`evaluate_with`] and [`evaluate_stream`].
#[derive(Debug, Clone)]
pub struct EvalOutput {
    /// The metrics.
    pub metrics: EvalMetrics,
    /// Logits `[N, F, C]` if asked for.
    pub logits: Option<Array3<f32>>,
    /// Predicted classes `[N, F]` if logits were asked for.
    pub pred: Option<Array2<i64>>,
    /// Targets `[N, F]` if logits were asked for.
    pub y: Option<Array2<i64>>,
}

fn check_problems(ev: &Evaluator, problems: &ProblemSetView<'_>) -> Result<()> {
    let cfg = ev.config();
    let (_, t, m) = problems.x.dim();
    let (n_y, f) = problems.y.dim();
    if t != cfg.n_tokens || m != cfg.d_in || f != cfg.n_outputs || n_y != problems.len() {
        return Err(ModelError::Input(format!(
            "problem set has x {:?} and y {:?}; the model expects x [N, {}, {}] and y [N, {}]",
            problems.x.shape(),
            problems.y.shape(),
            cfg.n_tokens,
            cfg.d_in,
            cfg.n_outputs
        )));
    }
    Ok(())
}

/// Evaluates the model of `ev` on `problems` in batches of `batch` ([`Evaluator::logits`]).
///
/// # Shapes
/// `problems.x [N, T, M]`, `problems.y [N, F]`, matching the model's config.
///
/// # Errors
/// [`ModelError::Input`] if `batch` is 0, the set is empty or the problems do not fit the model;
/// candle errors.
pub fn evaluate(ev: &Evaluator, problems: &ProblemSet, batch: usize) -> Result<EvalMetrics> {
    Ok(evaluate_with(ev, problems, batch, false, |_| {})?.metrics)
}

/// As [`evaluate`], optionally keeping the logits and predictions, calling `on_batch(done)` with
/// the number of problems done after each batch (for a progress bar).
///
/// # Shapes
/// Returns logits `[N, F, C]`, predictions and targets `[N, F]` when `keep_logits`.
///
/// # Errors
/// As [`evaluate`].
pub fn evaluate_with<P: FnMut(usize)>(
    ev: &Evaluator,
    problems: &ProblemSet,
    batch: usize,
    keep_logits: bool,
    on_batch: P,
) -> Result<EvalOutput> {
    if batch == 0 {
        return Err(ModelError::Input("batch size must be positive".into()));
    }
    let problems = problems.view();
    check_problems(ev, &problems)?;
    let n = problems.len();
    let batches = (0..n)
        .step_by(batch)
        .map(|start| Ok::<_, ModelError>(problems.slice(start, (start + batch).min(n))));
    evaluate_stream(ev, batches, keep_logits, on_batch)
}

/// Evaluates the model of `ev` on a stream of problem batches (e.g. `SampleStream::batches`), so that memory
/// is bounded by the batch (plus the logits, predictions and targets if `keep_logits`). Calls
/// `on_batch(done)` with the number of problems done after each batch. A batch is a set held
/// ([`ProblemSet`]) or borrowed ([`ProblemSetView`], e.g. views of numpy arrays): it is read
/// without a copy.
///
/// # Shapes
/// Each batch: `x [B, T, M]`, `y [B, F]`, matching the model's config. Returns logits `[N, F, C]`,
/// predictions and targets `[N, F]` when `keep_logits`.
///
/// # Errors
/// The first error of the stream; [`ModelError::Input`] for a batch that does not fit the model or
/// an empty stream (no problems: the metrics would be meaningless); candle errors.
pub fn evaluate_stream<I, B, E, P>(
    ev: &Evaluator,
    batches: I,
    keep_logits: bool,
    mut on_batch: P,
) -> Result<EvalOutput>
where
    I: IntoIterator<Item = std::result::Result<B, E>>,
    B: AsProblemSet,
    ModelError: From<E>,
    P: FnMut(usize),
{
    let cfg = ev.config();
    let mut acc = MetricsAccumulator::new(cfg.n_outputs);
    let mut kept: Vec<(Array3<f32>, Array2<i64>, Array2<i64>)> = Vec::new();
    let mut done = 0;
    for b in batches {
        let b = b?;
        let b = b.problems();
        if b.is_empty() {
            continue;
        }
        check_problems(ev, &b)?;
        let v = ev.logits(b.x.view())?;
        let logits = Array3::from_shape_vec((b.len(), cfg.n_outputs, cfg.d_out), v)
            .map_err(|e| ModelError::Input(format!("logits shape: {e}")))?;
        let pred = acc.add(logits.view(), b.y.view())?;
        if keep_logits {
            kept.push((logits, pred, b.y.to_owned()));
        }
        done += b.len();
        on_batch(done);
    }
    if done == 0 {
        return Err(ModelError::Input(
            "the problem set is empty: no problems to evaluate".into(),
        ));
    }
    let (logits, pred, y) = if keep_logits {
        let cat3 = |v: Vec<ArrayView3<f32>>| ndarray::concatenate(ndarray::Axis(0), &v);
        let cat2 = |v: Vec<ArrayView2<i64>>| ndarray::concatenate(ndarray::Axis(0), &v);
        let shape_err = |e: ndarray::ShapeError| ModelError::Input(format!("logits: {e}"));
        (
            Some(cat3(kept.iter().map(|k| k.0.view()).collect()).map_err(shape_err)?),
            Some(cat2(kept.iter().map(|k| k.1.view()).collect()).map_err(shape_err)?),
            Some(cat2(kept.iter().map(|k| k.2.view()).collect()).map_err(shape_err)?),
        )
    } else {
        (None, None, None)
    };
    Ok(EvalOutput {
        metrics: acc.finish(),
        logits,
        pred,
        y,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    /// Batches borrowed as views of one set (as the Python binding passes numpy's arrays) evaluate
    /// exactly as copies of the same rows made by hand.
    #[test]
    fn borrowed_batches_evaluate_as_owned_copies() {
        use crate::{Config, Mixer, Transformer};
        use hyperlens_tasks::sraven::{sample, Set, Split};
        let split = Split::named("paper-seed0").unwrap();
        let set = sample(&split, Set::Id, 10, 2, false).unwrap();
        let cfg = Config::sraven_base(Mixer::Hyla);
        let (model, _) = Transformer::init(&cfg, 3, &Device::Cpu).unwrap();
        let ev = Evaluator::new(model).unwrap();
        let starts = || (0..10).step_by(4).map(|a| (a, (a + 4).min(10)));
        let view = set.view();
        let views = starts().map(|(a, b)| Ok::<_, ModelError>(view.slice(a, b)));
        let copies = starts().map(|(a, b)| {
            Ok::<_, ModelError>(ProblemSet {
                x: set.x.slice(s![a..b, .., ..]).to_owned(),
                y: set.y.slice(s![a..b, ..]).to_owned(),
                rules: set.rules.slice(s![a..b, ..]).to_owned(),
                perms: None,
                params: set.params,
            })
        });
        let got = evaluate_stream(&ev, views, true, |_| {}).unwrap();
        let want = evaluate_stream(&ev, copies, true, |_| {}).unwrap();
        assert_eq!(got.metrics.n, 10);
        assert_eq!(got.metrics, want.metrics);
        assert_eq!(got.logits, want.logits);
        assert_eq!(got.y.unwrap(), set.y);
    }

    #[test]
    fn accumulator_counts_and_loss() {
        let mut a = MetricsAccumulator::new(2);
        // problem 0: both right; problem 1: feature 1 wrong
        let logits = array![
            [[2.0f32, 0.0, 0.0], [0.0, 1.0, 0.0]],
            [[0.0, 0.0, 3.0], [1.0, 0.0, 0.0]]
        ];
        let y = array![[0i64, 1], [2, 2]];
        let pred = a.add(logits.view(), y.view()).unwrap();
        assert_eq!(pred, array![[0i64, 1], [2, 0]]);
        let m = a.finish();
        assert_eq!(m.n, 2);
        assert!((m.accuracy - 0.5).abs() < 1e-12);
        assert_eq!(m.per_feature_accuracy, vec![1.0, 0.5]);
        let ce = |row: [f64; 3], t: usize| row.iter().map(|v| v.exp()).sum::<f64>().ln() - row[t];
        let expect = (ce([2.0, 0.0, 0.0], 0)
            + ce([0.0, 1.0, 0.0], 1)
            + ce([0.0, 0.0, 3.0], 2)
            + ce([1.0, 0.0, 0.0], 2))
            / 4.0;
        assert!((m.loss - expect).abs() < 1e-9);
        assert!(a
            .add(logits.view(), array![[0i64, 3], [0, 0]].view())
            .is_err());
    }
}
