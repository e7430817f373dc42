//! `hyperlens report`: the main job. For every checkpoint it measures ID / OOD accuracy, extracts the
//! latent codes of the paper's site (spec/latent-codes.md) on unpermuted ID and OOD problems, runs the
//! latent-code analyses (PCA, rule decoding ID -> OOD, k-means, similarity), reads the training log
//! (`metrics.csv`) when the checkpoint has one, captures the attention of one OOD problem, and writes
//! tables, codes, figures and a Markdown + HTML page comparing the checkpoints side by side. Every
//! figure comes with one or two sentences generated from its numbers.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use hyperlens_analysis::codes::report::LayerSel;
use hyperlens_analysis::{analyze_pair, CodeSet, LatentAnalysisParams, LatentReport};
use hyperlens_model::eval::{batch_tensor, evaluate};
use hyperlens_model::{Device, EvalMetrics, Transformer};
use hyperlens_probe::{extract, ProbeMeta, ProbeParams, Site};
use hyperlens_tasks::sraven::{sample, Rule, SampleStream, Set, Split, SravenParams};
use hyperlens_train::metrics::{read_metrics, MetricsRow, METRICS_FILE};
use hyperlens_viz::{
    save_png, save_svg, AttentionGrid, BarSeries, ColorMap, Curve, GroupedBars, Heatmap,
    LayerAccuracy, PcaScatter, Reference, ScatterPanel, Series, TrainingCurves,
};
use ndarray::{Array1, Array4, Axis};

use super::common::progress_bar;

/// Arguments of `hyperlens report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Checkpoint directories to compare (default: every checkpoint under `data/checkpoints/`).
    #[arg(long)]
    pub checkpoint: Vec<PathBuf>,
    /// Output directory.
    #[arg(long, default_value = "reports/default")]
    pub out: PathBuf,
    /// Problems per set (ID and OOD, for accuracy and for the codes).
    #[arg(long, default_value_t = 2048)]
    pub n: usize,
    /// Split used for checkpoints that do not name theirs in `train.json`.
    #[arg(long, default_value = "paper-seed0")]
    pub split: String,
    /// Seed of the evaluation and probe problems.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Compute device: cpu, cuda[:N] or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Problems per forward pass.
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
}

/// Where a checkpoint's training curves come from.
enum Training {
    /// The rows of its `metrics.csv` (a hyperlens training run).
    Log(Vec<MetricsRow>),
    /// No `metrics.csv`; `trained_by` from `train.json` if it says.
    Missing { trained_by: Option<String> },
}

/// The attention of one OOD problem (the first of the OOD probe set, so row 0 of
/// `codes/{name}_ood.npz` is `pattern[.., .., query, keys]` of the paper's site).
struct AttentionSample {
    /// Normalised attention, `[L, H, T, T]` (`[layer, head, query, key]`).
    pattern: Array4<f32>,
    /// Value shown by each token, `[T]`; -1 for the query tokens.
    tokens: Vec<i64>,
    /// Answer values, `[F]` (column-2 slot order).
    target: Vec<i64>,
    /// The model's predicted answer values, `[F]`.
    prediction: Vec<i64>,
    /// Rule per feature slot, `[F]`.
    rules: Vec<i64>,
    /// The paper's site on this problem layout: query position and key positions.
    query: usize,
    /// Key positions of the paper's site.
    keys: Vec<usize>,
}

/// What the report found for one checkpoint.
struct Entry {
    name: String,
    dir: PathBuf,
    mixer: String,
    split: String,
    id: EvalMetrics,
    ood: EvalMetrics,
    latent: LatentReport,
    training: Training,
    /// Updates trained and, for a run stopped early, its planned schedule (`train.json`).
    steps: Option<Steps>,
    attention: AttentionSample,
}

/// How far a checkpoint was trained: `steps` and `planned_steps` of its `train.json`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Steps {
    /// Optimiser updates done.
    done: u64,
    /// The schedule's length when the run stopped before its end.
    planned: Option<u64>,
}

/// The paper's training budget (`spec/models.md`, "Training recipe"): 156,250 updates of batch 128.
const PAPER_STEPS: u64 = 156_250;

/// `steps` / `planned_steps` of a checkpoint's `train.json`; `None` when it records no steps.
fn steps_of(dir: &Path) -> Option<Steps> {
    let v = train_json(dir)?;
    let done = v.get("steps")?.as_u64()?;
    let planned = v
        .get("planned_steps")
        .and_then(serde_json::Value::as_u64)
        .filter(|&p| p > done);
    Some(Steps { done, planned })
}

/// `156,250`, or `30,000 of 48,000` for a run stopped early; `?` when not recorded.
fn steps_text(steps: Option<Steps>) -> String {
    match steps {
        None => "?".into(),
        Some(Steps {
            done,
            planned: None,
        }) => thousands(done),
        Some(Steps {
            done,
            planned: Some(p),
        }) => format!("{} of {}", thousands(done), thousands(p)),
    }
}

/// An integer with thousands separators (`156,250`).
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One figure of the report: caption, one or two sentences from its numbers, PNG path relative to
/// the report directory.
struct Fig {
    caption: String,
    text: String,
    rel: String,
}

/// The task a checkpoint was trained on, from `task` in its `train.json` (hyperlens runs); `None`
/// when not recorded (e.g. imported paper checkpoints, which are SRAVEN models).
fn task_of(dir: &Path) -> Option<String> {
    train_json(dir).and_then(|v| v.get("task").and_then(|t| t.as_str()).map(str::to_string))
}

fn checkpoints(args: &ReportArgs) -> anyhow::Result<Vec<PathBuf>> {
    if !args.checkpoint.is_empty() {
        for dir in &args.checkpoint {
            if let Some(task) = task_of(dir).filter(|t| t != "sraven") {
                bail!(
                    "{} is a {task} checkpoint (train.json); the report analyses SRAVEN checkpoints",
                    dir.display()
                );
            }
        }
        return Ok(args.checkpoint.clone());
    }
    let root = Path::new("data/checkpoints");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .with_context(|| {
            format!(
                "reading {} (run from the repository root, or give --checkpoint)",
                root.display()
            )
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .filter(|p| match task_of(p) {
            Some(task) if task != "sraven" => {
                eprintln!(
                    "report: skipping {} (a {task} checkpoint; the report analyses SRAVEN)",
                    p.display()
                );
                false
            }
            _ => true,
        })
        .collect();
    dirs.sort();
    if dirs.is_empty() {
        bail!(
            "no checkpoint (a directory with config.json) under {}",
            root.display()
        );
    }
    Ok(dirs)
}

/// `train.json` of a checkpoint, if present and valid JSON.
fn train_json(dir: &Path) -> Option<serde_json::Value> {
    std::fs::read(dir.join("train.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
}

/// The split a checkpoint was trained on: `split` in its `train.json`, else the default.
fn split_of(dir: &Path, default: &str) -> String {
    train_json(dir)
        .and_then(|v| v.get("split").and_then(|s| s.as_str()).map(str::to_string))
        .unwrap_or_else(|| default.to_string())
}

/// The training log of a checkpoint: its `metrics.csv` read with the train crate's reader.
///
/// # Errors
/// A `metrics.csv` that exists but cannot be read or parsed (named).
fn training_of(dir: &Path) -> anyhow::Result<Training> {
    let path = dir.join(METRICS_FILE);
    if path.is_file() {
        let rows = read_metrics(&path).with_context(|| format!("reading {}", path.display()))?;
        return Ok(Training::Log(rows));
    }
    let trained_by = train_json(dir).and_then(|v| {
        v.get("trained_by")
            .and_then(|s| s.as_str())
            .map(str::to_string)
    });
    Ok(Training::Missing { trained_by })
}

fn name_of(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1} %", 100.0 * x)
    } else {
        "-".to_string()
    }
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    hyperlens_io::write_atomic(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Token labels of a SRAVEN sequence: `P{panel}s{slot}` for the context tokens, `Q{slot}` for the
/// `F` query tokens (spec/sraven.md, "Tokens, targets, metrics").
fn token_labels(n_tokens: usize, features: usize) -> Vec<String> {
    let n_ctx = n_tokens.saturating_sub(features);
    (0..n_tokens)
        .map(|t| {
            if t < n_ctx {
                format!("P{}s{}", t / features.max(1), t % features.max(1))
            } else {
                format!("Q{}", t - n_ctx)
            }
        })
        .collect()
}

/// Runs the model on the first problem of the unpermuted OOD set (the problem of row 0 of the OOD
/// codes) and keeps every layer's attention.
///
/// # Shapes
/// Returns `pattern [L, H, T, T]`.
///
/// # Errors
/// Split, model or candle errors.
fn attention_sample(
    model: &Transformer,
    split: &Split,
    seed: u64,
) -> anyhow::Result<AttentionSample> {
    let cfg = model.config();
    let problem = sample(split, Set::Ood, 1, seed, true)?;
    let x = batch_tensor(&problem.x, model.device())?;
    let out = model.forward(&x, true)?;
    let att = out
        .attention
        .context("the model returned no attention patterns")?;
    let (l, h, t) = (cfg.n_layers, cfg.n_heads, cfg.n_tokens);
    let mut data = Vec::with_capacity(l * h * t * t);
    for a in &att {
        data.extend(a.flatten_all()?.to_vec1::<f32>()?);
    }
    let pattern = Array4::from_shape_vec((l, h, t, t), data)
        .context("attention patterns do not have the shape [L, H, T, T]")?;
    let prediction: Vec<i64> = out
        .logits
        .argmax(2)?
        .flatten_all()?
        .to_vec1::<u32>()?
        .into_iter()
        .map(i64::from)
        .collect();
    let tokens = (0..t)
        .map(|i| {
            problem
                .x
                .slice(ndarray::s![0, i, ..])
                .iter()
                .position(|&v| v > 0.5)
                .map_or(-1, |p| p as i64)
        })
        .collect();
    let sel = Site::Paper
        .resolve(&split.params)?
        .into_iter()
        .next()
        .context("the paper site has no selection")?;
    Ok(AttentionSample {
        pattern,
        tokens,
        target: problem.y.row(0).to_vec(),
        prediction,
        rules: problem.rules.row(0).to_vec(),
        query: sel.query,
        keys: sel.keys,
    })
}

/// Writes the attention sample as `.npz`: `pattern` float32 `[L, H, T, T]`, `tokens` int64 `[T]`,
/// `target`, `prediction`, `rules` int64 `[F]` (temporary file, then rename).
fn write_attention_npz(path: &Path, a: &AttentionSample) -> anyhow::Result<()> {
    hyperlens_io::write_npz(path, |npz| -> hyperlens_io::Result<()> {
        npz.add("pattern", &a.pattern)?;
        for (name, v) in [
            ("tokens", &a.tokens),
            ("target", &a.target),
            ("prediction", &a.prediction),
            ("rules", &a.rules),
        ] {
            npz.add(name, &Array1::from(v.clone()))?;
        }
        Ok(())
    })?;
    Ok(())
}

fn analyse_checkpoint(args: &ReportArgs, dir: &Path, out: &Path) -> anyhow::Result<Entry> {
    let name = name_of(dir);
    let device = args.device.to_candle()?;
    let model = Transformer::load(dir, &device)?;
    let cfg = model.config().clone();
    let params = SravenParams {
        features: cfg.n_outputs,
        values: cfg.d_in,
        ..SravenParams::default()
    };
    let split_name = split_of(dir, &args.split);
    let split = Split::named_with(&split_name, params)?;
    let training = training_of(dir)?;
    let mut metrics = Vec::new();
    for set in [Set::Id, Set::Ood] {
        let problems = sample(&split, set, args.n, args.seed, false)?;
        metrics.push(evaluate(&model, &problems, args.batch)?);
    }
    let codes_dir = out.join("codes");
    let mut sets = Vec::new();
    for set in [Set::Id, Set::Ood] {
        let path = codes_dir.join(format!("{name}_{set}.npz"));
        let meta = ProbeMeta {
            checkpoint: dir.display().to_string(),
            problems: "generated".into(),
            split: Some(split_name.clone()),
            set: Some(set.to_string()),
            seed: Some(args.seed),
            unpermuted: Some(true),
            ..ProbeMeta::default()
        };
        let bar = progress_bar(args.n as u64, &format!("{name} codes {set}"), "problems");
        let batches = SampleStream::new(&split, set, args.seed, true)?
            .batches(args.n, args.batch)
            .map(|b| b.map_err(Into::into));
        let probe = ProbeParams {
            site: Site::Paper,
            layers: None,
        };
        extract(&model, batches, args.n, &probe, &path, meta, |d| {
            bar.set_position(d as u64)
        })?;
        bar.finish_and_clear();
        sets.push(CodeSet::read_npz(&path)?);
    }
    let attention = attention_sample(&model, &split, args.seed)?;
    write_attention_npz(&codes_dir.join(format!("{name}_attention.npz")), &attention)?;
    let bar = progress_bar(1, &format!("{name} analysis"), "stages");
    let latent = analyze_pair(
        &sets[0],
        &sets[1],
        &LatentAnalysisParams::default(),
        &mut |p| {
            bar.set_length(p.total as u64);
            bar.set_position(p.done as u64);
        },
    )?;
    bar.finish_and_clear();
    latent.write_tables(&out.join("tables").join(&name))?;
    let ood = metrics.pop().context("OOD metrics")?;
    let id = metrics.pop().context("ID metrics")?;
    Ok(Entry {
        name,
        dir: dir.to_path_buf(),
        mixer: cfg.mixer.to_string(),
        split: split_name,
        id,
        ood,
        latent,
        training,
        steps: steps_of(dir),
        attention,
    })
}

fn rule_names() -> Vec<String> {
    Rule::ALL.iter().map(|r| r.name().to_string()).collect()
}

fn rule_name(label: i64) -> String {
    usize::try_from(label)
        .ok()
        .and_then(|l| Rule::from_index(l).ok())
        .map_or_else(|| label.to_string(), |r| r.name().to_string())
}

/// The per-layer analyses (without the "all layers" entry).
fn per_layer(e: &Entry) -> Vec<&hyperlens_analysis::codes::report::LayerAnalysis> {
    e.latent
        .layers
        .iter()
        .filter(|a| a.layer != LayerSel::All)
        .collect()
}

/// Pearson correlation of two equally long series; NaN if either is constant.
fn pearson(a: impl Iterator<Item = f64> + Clone, b: impl Iterator<Item = f64> + Clone) -> f64 {
    let n = a.clone().count() as f64;
    if n < 2.0 {
        return f64::NAN;
    }
    let (ma, mb) = (a.clone().sum::<f64>() / n, b.clone().sum::<f64>() / n);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in a.zip(b) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    if saa <= 0.0 || sbb <= 0.0 {
        f64::NAN
    } else {
        sab / (saa * sbb).sqrt()
    }
}

/// Sentences for the PCA-by-rule figure: variance captured by two components, and the layer where
/// the rules separate best.
fn pca_rule_text(e: &Entry) -> String {
    let layers = per_layer(e);
    let two = |a: &&hyperlens_analysis::codes::report::LayerAnalysis| {
        a.pca.explained_variance_ratio().iter().take(2).sum::<f64>()
    };
    let mut s = String::new();
    if let (Some(first), Some(last)) = (layers.first(), layers.last()) {
        let _ = write!(
            s,
            "The first two principal components hold {} of the code variance at layer {} and {} at layer {}.",
            pct(two(first)),
            first.layer,
            pct(two(last)),
            last.layer
        );
    }
    let best = layers
        .iter()
        .filter_map(|a| a.clusters.as_ref().map(|c| (a.layer, c)))
        .filter(|(_, c)| c.silhouette.is_finite())
        .max_by(|x, y| x.1.silhouette.total_cmp(&y.1.silhouette));
    if let Some((layer, c)) = best {
        let _ = write!(
            s,
            " The rules separate best at layer {layer} (silhouette {:.2}, k-means ARI {:.2}){}.",
            c.silhouette,
            c.ari,
            if c.silhouette < 0.1 {
                ", i.e. the rule clusters overlap strongly in the full code space"
            } else {
                ""
            }
        );
    }
    s
}

/// Sentences for the PCA-by-target figure: the strongest correlation of the answer value with a
/// principal component.
fn pca_target_text(e: &Entry, target: &Array1<i64>) -> String {
    let mut best: Option<(LayerSel, usize, f64)> = None;
    for a in per_layer(e) {
        for c in 0..a.projection.ncols() {
            let r = pearson(
                a.projection.column(c).iter().copied(),
                target.iter().map(|&v| v as f64),
            );
            if r.is_finite() && best.is_none_or(|b| r.abs() > b.2.abs()) {
                best = Some((a.layer, c, r));
            }
        }
    }
    match best {
        Some((layer, c, r)) => format!(
            "The answer value correlates most with component {} at layer {layer} (Pearson r = {r:+.2}){}.",
            c + 1,
            if r.abs() < 0.3 {
                "; the leading components encode the answer only weakly"
            } else {
                ""
            }
        ),
        None => "The answer value is constant on these problems, so no correlation is reported."
            .to_string(),
    }
}

/// Sentences for the decoding figure.
fn decoding_text(e: &Entry) -> String {
    let layers = per_layer(e);
    let mut s = String::new();
    if let (Some(first), Some(last)) = (layers.first(), layers.last()) {
        let all = e
            .latent
            .layers
            .iter()
            .find(|a| a.layer == LayerSel::All)
            .map_or(f64::NAN, |a| a.decoding.accuracy);
        let _ = write!(
            s,
            "Decoding accuracy on OOD codes goes from {} at layer {} to {} at layer {} ({} with all layers concatenated), against a majority baseline of {}",
            pct(first.decoding.accuracy),
            first.layer,
            pct(last.decoding.accuracy),
            last.layer,
            pct(all),
            pct(first.decoding.majority_baseline)
        );
        let shuffled = e
            .latent
            .layers
            .iter()
            .filter_map(|a| a.decoding.shuffled_control)
            .fold(f64::NEG_INFINITY, f64::max);
        if shuffled.is_finite() {
            let _ = write!(
                s,
                " and a shuffled-label control of at most {}.",
                pct(shuffled)
            );
        } else {
            s.push('.');
        }
    }
    s
}

/// Sentences for the similarity figure: range of the off-diagonal cosine similarities.
fn similarity_text(
    sim: &hyperlens_analysis::similarity::MeanCodeSimilarity,
    layer: LayerSel,
) -> String {
    let n = sim.labels.len();
    let mut pairs = Vec::new();
    for i in 0..n {
        for j in (i + 1)..n {
            let v = sim.cosine[[i, j]];
            if v.is_finite() && sim.counts[i] > 0 && sim.counts[j] > 0 {
                pairs.push((v, i, j));
            }
        }
    }
    let missing: Vec<String> = (0..n)
        .filter(|&i| sim.counts[i] == 0)
        .map(|i| rule_name(sim.labels[i]))
        .collect();
    let mut s = match (
        pairs.iter().min_by(|a, b| a.0.total_cmp(&b.0)),
        pairs.iter().max_by(|a, b| a.0.total_cmp(&b.0)),
    ) {
        (Some(lo), Some(hi)) => {
            let mean = pairs.iter().map(|p| p.0).sum::<f64>() / pairs.len() as f64;
            format!(
                "At layer {layer} the mean codes of different rules have cosine similarity {:.2} on average, from {:.2} ({} / {}) to {:.2} ({} / {}){}.",
                mean,
                lo.0,
                rule_name(sim.labels[lo.1]),
                rule_name(sim.labels[lo.2]),
                hi.0,
                rule_name(sim.labels[hi.1]),
                rule_name(sim.labels[hi.2]),
                if mean > 0.9 {
                    ": the mean codes point almost the same way and differ mostly in small components"
                } else {
                    ""
                }
            )
        }
        _ => "Fewer than two rules have codes here, so no similarity is reported.".to_string(),
    };
    if !missing.is_empty() {
        let _ = write!(
            s,
            " No OOD problem has the rule{} {}, so {} left out.",
            if missing.len() > 1 { "s" } else { "" },
            missing.join(", "),
            if missing.len() > 1 {
                "they are"
            } else {
                "it is"
            }
        );
    }
    s
}

/// Sentences for the confusion-matrix figure: best and worst recalled rule and the most frequent
/// error.
fn confusion_text(d: &hyperlens_analysis::decode::DecodeResult, layer: LayerSel) -> String {
    let c = d.classes.len();
    let mut recall = Vec::new();
    let mut worst_err: Option<(u64, usize, usize, u64)> = None;
    for i in 0..c {
        let row: u64 = d.confusion.row(i).sum();
        if row == 0 {
            continue;
        }
        recall.push((d.confusion[[i, i]] as f64 / row as f64, i));
        for j in 0..c {
            let v = d.confusion[[i, j]];
            if i != j && v > 0 && worst_err.is_none_or(|w| v > w.0) {
                worst_err = Some((v, i, j, row));
            }
        }
    }
    let mut s = String::new();
    if let (Some(hi), Some(lo)) = (
        recall.iter().max_by(|a, b| a.0.total_cmp(&b.0)),
        recall.iter().min_by(|a, b| a.0.total_cmp(&b.0)),
    ) {
        let _ = write!(
            s,
            "With the probe of layer {layer}, {} is recalled best ({}) and {} worst ({}).",
            rule_name(d.classes[hi.1]),
            pct(hi.0),
            rule_name(d.classes[lo.1]),
            pct(lo.0)
        );
    }
    match worst_err {
        Some((v, i, j, row)) => {
            let _ = write!(
                s,
                " The most frequent error is {} decoded as {} ({v} of {row} problems).",
                rule_name(d.classes[i]),
                rule_name(d.classes[j])
            );
        }
        None => s.push_str(" The probe makes no error."),
    }
    let predicted_only: Vec<String> = (0..c)
        .filter(|&i| d.confusion.row(i).sum() == 0 && d.confusion.column(i).sum() > 0)
        .map(|i| rule_name(d.classes[i]))
        .collect();
    if !predicted_only.is_empty() {
        let _ = write!(
            s,
            " No OOD problem has the rule {}, so its row is empty.",
            predicted_only.join(", ")
        );
    }
    s
}

/// Sentences for the training curves, from the rows of `metrics.csv`.
fn training_text(rows: &[MetricsRow]) -> String {
    let mut s = String::new();
    let last_step = rows.iter().map(|r| r.step).max().unwrap_or(0);
    let train: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| r.train_loss.map(|v| (r.step, v)))
        .collect();
    let _ = write!(s, "The log covers {last_step} steps");
    if let (Some(a), Some(b)) = (train.first(), train.last()) {
        let _ = write!(
            s,
            "; the training loss went from {:.3} (step {}) to {:.3} (step {})",
            a.1, a.0, b.1, b.0
        );
    }
    s.push('.');
    let ood: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| r.ood_acc.map(|v| (r.step, v)))
        .collect();
    let id_last = rows
        .iter()
        .rev()
        .find_map(|r| r.id_acc.map(|v| (r.step, v)));
    if let (Some(last), Some(best)) = (ood.last(), ood.iter().max_by(|a, b| a.1.total_cmp(&b.1))) {
        let _ = write!(
            s,
            " At the last evaluation (step {}) the OOD accuracy is {}",
            last.0,
            pct(last.1)
        );
        if let Some((_, v)) = id_last {
            let _ = write!(s, " and the ID accuracy {}", pct(v));
        }
        if best.0 != last.0 && best.1 > last.1 {
            let _ = write!(
                s,
                "; the best OOD accuracy was {} at step {}",
                pct(best.1),
                best.0
            );
        }
        s.push('.');
    } else {
        s.push_str(" The log holds no evaluation, so only the loss is shown.");
    }
    s
}

/// Training curves of one checkpoint: figure and sentences, or `None` (with one sentence) if the
/// checkpoint has no usable log.
fn training_figure(e: &Entry, out: &Path) -> anyhow::Result<Result<Fig, String>> {
    let rows = match &e.training {
        Training::Log(rows) => rows,
        Training::Missing { trained_by } => {
            return Ok(Err(format!(
                "No training curves: the checkpoint has no `{METRICS_FILE}`{}.",
                trained_by
                    .as_ref()
                    .map(|t| format!(" (it was trained by {t})"))
                    .unwrap_or_default()
            )));
        }
    };
    let series = |f: fn(&MetricsRow) -> Option<f64>| -> (Vec<f64>, Vec<f64>) {
        rows.iter()
            .filter_map(|r| f(r).filter(|v| v.is_finite()).map(|v| (r.step as f64, v)))
            .unzip()
    };
    let train_loss = series(|r| r.train_loss);
    let id_loss = series(|r| r.id_loss);
    let ood_loss = series(|r| r.ood_loss);
    let id_acc = series(|r| r.id_acc.map(|v| v.clamp(0.0, 1.0)));
    let ood_acc = series(|r| r.ood_acc.map(|v| v.clamp(0.0, 1.0)));
    fn curve<'a>(name: &str, (s, v): &'a (Vec<f64>, Vec<f64>)) -> Option<Curve<'a>> {
        (!s.is_empty()).then(|| Curve {
            name: name.to_string(),
            steps: s.as_slice(),
            values: v.as_slice(),
        })
    }
    let loss: Vec<Curve> = [
        curve("train loss", &train_loss),
        curve("ID loss", &id_loss),
        curve("OOD loss", &ood_loss),
    ]
    .into_iter()
    .flatten()
    .collect();
    let accuracy: Vec<Curve> = [
        curve("ID accuracy", &id_acc),
        curve("OOD accuracy", &ood_acc),
    ]
    .into_iter()
    .flatten()
    .collect();
    if loss.is_empty() && accuracy.is_empty() {
        return Ok(Err(format!(
            "No training curves: `{METRICS_FILE}` holds no loss or accuracy value."
        )));
    }
    let mut fig = TrainingCurves::new(&format!("{}: training curves", e.name), loss, accuracy);
    let values: Vec<f64> = fig
        .loss
        .iter()
        .flat_map(|c| c.values.iter().copied())
        .collect();
    let (lo, hi) = values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    fig.log_loss = lo > 0.0 && hi / lo > 20.0;
    let rel = format!("figures/{}_training.png", e.name);
    save_png(out.join(&rel), &fig)?;
    Ok(Ok(Fig {
        caption:
            "Training curves: loss and ID / OOD accuracy (all features right) against the step"
                .into(),
        text: training_text(rows),
        rel,
    }))
}

/// Sentences for the attention figure: how much of the answer query's attention falls on the
/// paper's keys, and which head concentrates most.
fn attention_text(a: &AttentionSample, layer: usize, labels: &[String]) -> String {
    let pat = a.pattern.index_axis(Axis(0), layer);
    let (h, _, t) = pat.dim();
    let shares: Vec<f64> = (0..h)
        .map(|head| {
            let row = pat.slice(ndarray::s![head, a.query, ..]);
            let total: f64 = row.iter().map(|v| f64::from(v.abs())).sum();
            let on: f64 = a.keys.iter().map(|&k| f64::from(row[k].abs())).sum();
            if total > 0.0 {
                on / total
            } else {
                0.0
            }
        })
        .collect();
    let mean = shares.iter().sum::<f64>() / h.max(1) as f64;
    let (best_head, best) = shares
        .iter()
        .copied()
        .enumerate()
        .max_by(|x, y| x.1.total_cmp(&y.1))
        .unwrap_or((0, 0.0));
    let keys: Vec<&str> = a.keys.iter().map(|&k| labels[k].as_str()).collect();
    let right = a
        .target
        .iter()
        .zip(&a.prediction)
        .filter(|(t, p)| t == p)
        .count();
    let rules: Vec<String> = a.rules.iter().map(|&r| rule_name(r)).collect();
    format!(
        "On this problem (rules {}; the model gets {right} of {} answer features right), the answer query {} puts on average {} of its absolute attention weight on the paper's keys {} (uniform: {}); head {best_head} concentrates most ({}).",
        rules.join(", "),
        a.target.len(),
        labels[a.query],
        pct(mean),
        keys.join(" and "),
        pct(a.keys.len() as f64 / t as f64),
        pct(best)
    )
}

/// The attention heatmap of one OOD problem: all heads of the last layer.
fn attention_figure(e: &Entry, out: &Path) -> anyhow::Result<Fig> {
    let a = &e.attention;
    let (l, _, t, _) = a.pattern.dim();
    let layer = l - 1;
    let features = a.target.len();
    let labels = token_labels(t, features);
    let pattern = a.pattern.index_axis(Axis(0), layer).mapv(f64::from);
    let (lo, hi) = pattern
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(x, y), &v| {
            (x.min(v), y.max(v))
        });
    let mut fig = AttentionGrid::new(
        &format!(
            "{}: attention of layer {layer} on one OOD problem ({} mixer)",
            e.name, e.mixer
        ),
        pattern.view(),
        &labels,
        &labels,
    );
    fig.separators = Some(features);
    fig.tick_stride = Some(features);
    if lo < 0.0 {
        let m = lo.abs().max(hi.abs()).max(f64::MIN_POSITIVE);
        fig.color_map = ColorMap::BlueWhiteRed;
        fig.range = Some((-m, m));
    }
    let rel = format!("figures/{}_attention.png", e.name);
    save_png(out.join(&rel), &fig)?;
    Ok(Fig {
        caption: format!(
            "Attention of every head of layer {layer} on the first OOD problem (rows: query, columns: key; P = panel, s = slot, Q = query token)"
        ),
        text: attention_text(a, layer, &labels),
        rel,
    })
}

/// Figures of one checkpoint, and the sentence said instead of a training-curve figure when there
/// is none.
fn figures(e: &Entry, out: &Path) -> anyhow::Result<(Vec<Fig>, Option<String>)> {
    let fig_dir = out.join("figures");
    let mut made = Vec::new();
    let layers = per_layer(e);
    // PCA by rule, one panel per layer (the unsupervised set: OOD codes).
    let labels: Vec<usize> = e
        .latent
        .unsupervised_label
        .iter()
        .map(|&l| l.max(0) as usize)
        .collect();
    let panels: Vec<ScatterPanel> = layers
        .iter()
        .map(|a| {
            let r = a.pca.explained_variance_ratio();
            ScatterPanel {
                title: format!("layer {}", a.layer),
                points: a.projection.view(),
                explained: [
                    r.get(0).copied().unwrap_or(0.0),
                    r.get(1).copied().unwrap_or(0.0),
                ],
            }
        })
        .collect();
    let title = format!(
        "{}: latent codes (query 35, keys 27 and 31) by rule, OOD",
        e.name
    );
    let fig = PcaScatter::by_category(&title, panels.clone(), &labels, &rule_names(), "rule");
    let rel = format!("figures/{}_pca_rule.png", e.name);
    save_png(out.join(&rel), &fig)?;
    save_svg(fig_dir.join(format!("{}_pca_rule.svg", e.name)), &fig)?;
    made.push(Fig {
        caption: "PCA of the OOD codes per layer, coloured by the rule of slot 3".to_string(),
        text: pca_rule_text(e),
        rel,
    });
    if let Some(t) = &e.latent.unsupervised_target {
        let values: Vec<f64> = t.iter().map(|&v| v as f64).collect();
        let fig = PcaScatter::by_value(
            &format!("{}: latent codes by target value, OOD", e.name),
            panels,
            &values,
            "target value",
        );
        let rel = format!("figures/{}_pca_target.png", e.name);
        save_png(out.join(&rel), &fig)?;
        made.push(Fig {
            caption: "PCA of the OOD codes per layer, coloured by the answer value".to_string(),
            text: pca_target_text(e, t),
            rel,
        });
    }
    // Decoding accuracy per layer with baselines.
    let acc: Vec<f64> = e
        .latent
        .layers
        .iter()
        .map(|a| a.decoding.accuracy)
        .collect();
    let bal: Vec<f64> = e
        .latent
        .layers
        .iter()
        .map(|a| a.decoding.balanced_accuracy)
        .collect();
    let majority = [e
        .latent
        .layers
        .first()
        .map_or(0.0, |a| a.decoding.majority_baseline)];
    let shuffled: Vec<f64> = e
        .latent
        .layers
        .iter()
        .map(|a| a.decoding.shuffled_control.unwrap_or(f64::NAN))
        .collect();
    let mut refs = vec![Reference {
        name: "majority class".into(),
        values: &majority,
    }];
    if shuffled.iter().all(|v| v.is_finite()) {
        refs.push(Reference {
            name: "shuffled labels".into(),
            values: &shuffled,
        });
    }
    let fig = LayerAccuracy::new(
        &format!("{}: rule decoding ID -> OOD", e.name),
        layers.len(),
        vec![
            Series {
                name: "accuracy".into(),
                values: &acc,
            },
            Series {
                name: "balanced accuracy".into(),
                values: &bal,
            },
        ],
        refs,
    );
    let rel = format!("figures/{}_decoding.png", e.name);
    save_png(out.join(&rel), &fig)?;
    made.push(Fig {
        caption: "Linear decoding of the rule from the codes, trained on ID, tested on OOD"
            .to_string(),
        text: decoding_text(e),
        rel,
    });
    // Confusion matrix of the best per-layer probe.
    if let Some(best) = layers
        .iter()
        .max_by(|a, b| a.decoding.accuracy.total_cmp(&b.decoding.accuracy))
    {
        let d = &best.decoding;
        // Rules that are neither true nor predicted on the OOD set (e.g. rules only in the ID
        // set) would be an empty row and column: leave them out.
        let keep: Vec<usize> = (0..d.classes.len())
            .filter(|&i| d.confusion.row(i).sum() > 0 || d.confusion.column(i).sum() > 0)
            .collect();
        let names: Vec<String> = keep.iter().map(|&i| rule_name(d.classes[i])).collect();
        let counts = d
            .confusion
            .select(Axis(0), &keep)
            .select(Axis(1), &keep)
            .mapv(|v| v as f64);
        let fig = Heatmap::confusion_matrix(
            &format!(
                "{}: rule decoding confusion, layer {} (OOD)",
                e.name, best.layer
            ),
            counts.view(),
            &names,
            true,
        )?;
        let rel = format!("figures/{}_confusion.png", e.name);
        save_png(out.join(&rel), &fig)?;
        made.push(Fig {
            caption: format!(
                "Confusion matrix of the best per-layer probe (layer {}), rows: true rule",
                best.layer
            ),
            text: confusion_text(d, best.layer),
            rel,
        });
    }
    // Rule similarity of the final layer.
    if let Some(last) = layers.last() {
        let sim = &last.similarity;
        // Rules without OOD codes have no mean code: leave their rows and columns out.
        let keep: Vec<usize> = (0..sim.labels.len())
            .filter(|&i| sim.counts[i] > 0)
            .collect();
        let names: Vec<String> = keep.iter().map(|&i| rule_name(sim.labels[i])).collect();
        let cos = sim
            .cosine
            .select(Axis(0), &keep)
            .select(Axis(1), &keep)
            .mapv(|v| if v.is_finite() { v } else { 0.0 });
        let fig = Heatmap::rule_similarity(
            &format!(
                "{}: cosine similarity of mean codes, layer {}",
                e.name, last.layer
            ),
            cos.view(),
            &names,
        )?;
        let rel = format!("figures/{}_similarity.png", e.name);
        save_png(out.join(&rel), &fig)?;
        made.push(Fig {
            caption: "Cosine similarity of the per-rule mean codes (final layer, OOD)".to_string(),
            text: similarity_text(sim, last.layer),
            rel,
        });
    }
    // Training curves (half a row) before the wide attention grid, so that they can pair up with
    // the similarity heatmap in the HTML page.
    let no_training = match training_figure(e, out)? {
        Ok(fig) => {
            made.push(fig);
            None
        }
        Err(sentence) => Some(sentence),
    };
    made.push(attention_figure(e, out)?);
    Ok((made, no_training))
}

fn best_layer(e: &Entry) -> (String, f64) {
    e.latent
        .layers
        .iter()
        .filter(|a| a.layer != LayerSel::All)
        .map(|a| (a.layer.to_string(), a.decoding.accuracy))
        .fold(("-".to_string(), f64::NEG_INFINITY), |b, x| {
            if x.1 > b.1 {
                x
            } else {
                b
            }
        })
}

/// One or two sentences generated from the numbers.
fn findings(e: &Entry) -> String {
    let mut s = String::new();
    let gap = e.ood.accuracy - e.id.accuracy;
    let _ = write!(
        s,
        "{} ({}) solves {} of in-distribution and {} of OOD problems ({}), ",
        e.name,
        e.mixer,
        pct(e.id.accuracy),
        pct(e.ood.accuracy),
        if gap.abs() < 0.02 {
            "no generalisation gap".to_string()
        } else {
            format!("a gap of {:+.1} points", 100.0 * gap)
        }
    );
    let (layer, acc) = best_layer(e);
    let majority = e
        .latent
        .layers
        .first()
        .map_or(0.0, |a| a.decoding.majority_baseline);
    let _ = write!(
        s,
        "and a linear probe trained on ID codes decodes the rule of OOD problems best at layer {layer} ({} against a majority baseline of {}).",
        pct(acc),
        pct(majority)
    );
    if let Some(c) = e
        .latent
        .layers
        .iter()
        .rev()
        .find(|a| a.layer != LayerSel::All)
        .and_then(|a| a.clusters.as_ref())
    {
        let _ = write!(
            s,
            " k-means on the final layer's codes recovers the rules with ARI {:.2} and NMI {:.2}.",
            c.ari, c.nmi
        );
    }
    s
}

/// Sentences for the accuracy bar chart comparing the checkpoints.
fn accuracy_text(entries: &[Entry]) -> String {
    let by = |f: fn(&Entry) -> f64| {
        let hi = entries.iter().max_by(|a, b| f(a).total_cmp(&f(b)));
        let lo = entries.iter().min_by(|a, b| f(a).total_cmp(&f(b)));
        (hi, lo)
    };
    match entries {
        [] => String::new(),
        [e] => format!(
            "{} solves {} of in-distribution and {} of OOD problems.",
            e.name,
            pct(e.id.accuracy),
            pct(e.ood.accuracy)
        ),
        _ => {
            let (hi, lo) = by(|e| e.ood.accuracy);
            let (gap, _) = by(|e| (e.id.accuracy - e.ood.accuracy).abs());
            let mut s = String::new();
            if let (Some(hi), Some(lo)) = (hi, lo) {
                let _ = write!(
                    s,
                    "OOD accuracy ranges from {} ({}) to {} ({}).",
                    pct(lo.ood.accuracy),
                    lo.name,
                    pct(hi.ood.accuracy),
                    hi.name
                );
            }
            if let Some(g) = gap {
                let d = g.ood.accuracy - g.id.accuracy;
                let _ = write!(
                    s,
                    " The largest difference between OOD and ID accuracy is {:+.1} points ({}).",
                    100.0 * d,
                    g.name
                );
            }
            let short: Vec<&str> = entries
                .iter()
                .filter(|e| e.steps.is_some_and(|st| st.done < PAPER_STEPS))
                .map(|e| e.name.as_str())
                .collect();
            if !short.is_empty() {
                let _ = write!(
                    s,
                    " {} trained for fewer updates than the paper's {} (column \"updates trained\"), so {} accuracies are not the paper's comparison.",
                    short.join(", "),
                    thousands(PAPER_STEPS),
                    if short.len() == 1 { "its" } else { "their" }
                );
            }
            s
        }
    }
}

/// Decoding accuracy per layer of every checkpoint in one figure (when there are several and they
/// have the same number of layers), with the largest majority-class baseline as reference.
fn comparison_figure(entries: &[Entry], out: &Path) -> anyhow::Result<Option<Fig>> {
    let n_sel = entries.first().map_or(0, |e| e.latent.layers.len());
    if entries.len() < 2 || n_sel < 2 || entries.iter().any(|e| e.latent.layers.len() != n_sel) {
        return Ok(None);
    }
    let acc: Vec<Vec<f64>> = entries
        .iter()
        .map(|e| {
            e.latent
                .layers
                .iter()
                .map(|a| a.decoding.accuracy)
                .collect()
        })
        .collect();
    let majority = [entries
        .iter()
        .filter_map(|e| e.latent.layers.first())
        .map(|a| a.decoding.majority_baseline)
        .fold(0.0, f64::max)];
    let series = entries
        .iter()
        .zip(&acc)
        .map(|(e, v)| Series {
            name: e.name.clone(),
            values: v,
        })
        .collect();
    let fig = LayerAccuracy::new(
        "Rule decoding ID -> OOD per layer, all checkpoints",
        n_sel - 1,
        series,
        vec![Reference {
            name: "majority class (largest)".into(),
            values: &majority,
        }],
    );
    let rel = "figures/decoding_comparison.png".to_string();
    save_png(out.join(&rel), &fig)?;
    let at = |k: usize| {
        let hi = entries
            .iter()
            .zip(&acc)
            .max_by(|a, b| a.1[k].total_cmp(&b.1[k]));
        let lo = entries
            .iter()
            .zip(&acc)
            .min_by(|a, b| a.1[k].total_cmp(&b.1[k]));
        (hi, lo)
    };
    let mut text = String::new();
    let last = n_sel - 2;
    if let (Some(hi), Some(lo)) = at(last) {
        let _ = write!(
            text,
            "At layer {last} the rule decodes best from {} ({}) and worst from {} ({})",
            hi.0.name,
            pct(hi.1[last]),
            lo.0.name,
            pct(lo.1[last])
        );
    }
    if let (Some(hi), Some(lo)) = at(n_sel - 1) {
        let _ = write!(
            text,
            "; with all layers concatenated accuracies range from {} to {}",
            pct(lo.1[n_sel - 1]),
            pct(hi.1[n_sel - 1])
        );
    }
    let _ = write!(
        text,
        ", against a majority baseline of at most {}.",
        pct(majority[0])
    );
    Ok(Some(Fig {
        caption: "Rule decoding per layer, all checkpoints".into(),
        text,
        rel,
    }))
}

fn markdown(
    entries: &[Entry],
    figs: &[(Vec<Fig>, Option<String>)],
    comparison: Option<&Fig>,
    args: &ReportArgs,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# hyperlens report\n");
    let _ = writeln!(
        md,
        "Checkpoints compared on SRAVEN: accuracy (all 4 answer features right) on {} permuted problems per set; latent codes of the paper's site (query 35, keys 27 and 31, label = rule of slot 3) on {} unpermuted ID and OOD problems (seed {}); the attention of the first OOD problem; training curves where the checkpoint has a training log.\n",
        args.n, args.n, args.seed
    );
    let _ = writeln!(
        md,
        "**ID and OOD accuracy per checkpoint.** {}\n",
        accuracy_text(entries)
    );
    let _ = writeln!(
        md,
        "![ID and OOD accuracy per checkpoint](figures/accuracy.png)\n"
    );
    let _ = writeln!(md, "| checkpoint | mixer | split | updates trained | ID acc | OOD acc | OOD per-feature | best decoding layer (OOD acc) | decoding, all layers | majority baseline |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    for e in entries {
        let (layer, acc) = best_layer(e);
        let all = e
            .latent
            .layers
            .iter()
            .find(|a| a.layer == LayerSel::All)
            .map_or(f64::NAN, |a| a.decoding.accuracy);
        let maj = e
            .latent
            .layers
            .first()
            .map_or(f64::NAN, |a| a.decoding.majority_baseline);
        let per: f64 = e.ood.per_feature_accuracy.iter().sum::<f64>()
            / e.ood.per_feature_accuracy.len().max(1) as f64;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} |",
            e.name,
            e.mixer,
            e.split,
            steps_text(e.steps),
            pct(e.id.accuracy),
            pct(e.ood.accuracy),
            pct(per),
            layer,
            pct(acc),
            pct(all),
            pct(maj)
        );
    }
    if let Some(fig) = comparison {
        let _ = writeln!(
            md,
            "\n**{}.** {}\n\n![{}]({})",
            fig.caption, fig.text, fig.caption, fig.rel
        );
    }
    for (e, (f, no_training)) in entries.iter().zip(figs) {
        let _ = writeln!(md, "\n## {}\n", e.name);
        let _ = writeln!(md, "Checkpoint `{}`.\n", e.dir.display());
        let _ = writeln!(md, "{}\n", findings(e));
        let _ = writeln!(md, "| layer | decoding acc | balanced acc | majority | shuffled control | ARI | NMI | silhouette |");
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for a in &e.latent.layers {
            let (ari, nmi, sil) = a
                .clusters
                .as_ref()
                .map_or((f64::NAN, f64::NAN, f64::NAN), |c| {
                    (c.ari, c.nmi, c.silhouette)
                });
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} |",
                a.layer,
                pct(a.decoding.accuracy),
                pct(a.decoding.balanced_accuracy),
                pct(a.decoding.majority_baseline),
                a.decoding.shuffled_control.map_or("-".into(), pct),
                ari,
                nmi,
                sil
            );
        }
        for fig in f {
            let _ = writeln!(
                md,
                "\n**{}.** {}\n\n![{}]({})",
                fig.caption, fig.text, fig.caption, fig.rel
            );
        }
        if let Some(s) = no_training {
            let _ = writeln!(md, "\n{s}");
        }
        let _ = writeln!(
            md,
            "\nTables: `tables/{0}/`; codes: `codes/{0}_id.npz`, `codes/{0}_ood.npz`; attention: `codes/{0}_attention.npz`.",
            e.name
        );
    }
    md
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Inline Markdown of the report (already HTML-escaped text): `**bold**` and `` `code` ``.
fn inline(s: &str) -> String {
    let mut out = String::new();
    for (i, part) in s.split("**").enumerate() {
        if i % 2 == 1 {
            let _ = write!(out, "<strong>{part}</strong>");
        } else {
            out.push_str(part);
        }
    }
    let mut res = String::new();
    for (i, part) in out.split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(res, "<code>{part}</code>");
        } else {
            res.push_str(part);
        }
    }
    res
}

/// Width in pixels of a PNG file, from its IHDR header; `None` if it is not a readable PNG.
fn png_width(path: &Path) -> Option<u32> {
    use std::io::Read as _;
    let mut head = [0u8; 24];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    (&head[..8] == b"\x89PNG\r\n\x1a\n" && &head[12..16] == b"IHDR")
        .then(|| u32::from_be_bytes([head[16], head[17], head[18], head[19]]))
}

/// Figures at most this wide (pixels) take half a row of the HTML page, so that two sit side by
/// side; wider ones take the whole row.
const HALF_ROW_MAX_WIDTH: u32 = 1000;

/// A self-contained rendering of the Markdown subset the report uses (headings, paragraphs, tables,
/// images beside the page). A paragraph starting with a bold caption directly followed by an image
/// becomes a `<figure>` with that paragraph as `<figcaption>`; consecutive figures share one
/// wrapping row, so that narrow figures (`width_of(src)` at most [`HALF_ROW_MAX_WIDTH`]) sit side
/// by side.
fn html(md: &str, width_of: impl Fn(&str) -> Option<u32>) -> String {
    let mut body = String::new();
    let mut in_table = false;
    let mut in_figs = false;
    let mut caption: Option<String> = None;
    for line in md.lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let is_image = t.starts_with("![");
        // A bold caption may open the next figure of the same row: keep the row open for it.
        let is_caption = t.starts_with("**") && caption.is_none();
        if !is_image && !is_caption {
            if in_figs {
                body.push_str("</div>\n");
                in_figs = false;
            }
            if let Some(c) = caption.take() {
                let _ = writeln!(body, "<p>{c}</p>");
            }
        }
        if t.starts_with('|') {
            let cells: Vec<&str> = t.trim_matches('|').split('|').map(str::trim).collect();
            if cells.iter().all(|c| c.chars().all(|ch| ch == '-')) {
                continue;
            }
            let tag = if in_table { "td" } else { "th" };
            if !in_table {
                body.push_str("<div class=\"scroll\"><table>\n");
                in_table = true;
            }
            body.push_str("<tr>");
            for c in cells {
                let _ = write!(body, "<{tag}>{}</{tag}>", inline(&html_escape(c)));
            }
            body.push_str("</tr>\n");
            continue;
        }
        if in_table {
            body.push_str("</table></div>\n");
            in_table = false;
        }
        if let Some(h) = t.strip_prefix("## ") {
            let _ = writeln!(
                body,
                "<h2 id=\"{}\">{}</h2>",
                html_escape(h),
                html_escape(h)
            );
        } else if let Some(h) = t.strip_prefix("# ") {
            let _ = writeln!(body, "<h1>{}</h1>", html_escape(h));
        } else if let Some(rest) = t.strip_prefix("![") {
            if let Some((alt, src)) = rest.split_once("](") {
                if !in_figs {
                    body.push_str("<div class=\"figs\">\n");
                    in_figs = true;
                }
                let cap = caption
                    .take()
                    .map(|c| format!("<figcaption>{c}</figcaption>"))
                    .unwrap_or_default();
                let src = src.trim_end_matches(')');
                let class = if width_of(src).is_some_and(|w| w <= HALF_ROW_MAX_WIDTH) {
                    " class=\"half\""
                } else {
                    ""
                };
                let _ = writeln!(
                    body,
                    "<figure{class}>{cap}<a href=\"{0}\"><img src=\"{0}\" alt=\"{1}\"></a></figure>",
                    html_escape(src),
                    html_escape(alt)
                );
            }
        } else if is_caption {
            caption = Some(inline(&html_escape(t)));
        } else {
            let _ = writeln!(body, "<p>{}</p>", inline(&html_escape(t)));
        }
    }
    if in_table {
        body.push_str("</table></div>\n");
    }
    if in_figs {
        body.push_str("</div>\n");
    }
    if let Some(c) = caption.take() {
        let _ = writeln!(body, "<p>{c}</p>");
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>hyperlens report</title><style>{CSS}</style></head><body>\n{body}</body></html>\n"
    )
}

/// Style of the HTML report: a readable text column, tables that scroll sideways on narrow
/// windows, figures at their natural size up to the page width.
const CSS: &str = "body{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;line-height:1.45;color:#222;max-width:1400px;margin:2em auto;padding:0 1.5em}\
h1{border-bottom:2px solid #ddd;padding-bottom:.3em}\
h2{margin-top:2.2em;border-bottom:1px solid #ddd;padding-bottom:.2em}\
p{max-width:60em}\
code{background:#f3f3f3;padding:0 .25em;border-radius:3px;font-size:90%}\
.scroll{overflow-x:auto}\
table{border-collapse:collapse;margin:1em 0;font-size:92%}\
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right;white-space:nowrap}\
td:first-child,th:first-child{text-align:left}\
th{background:#f3f3f3}\
tr:nth-child(even) td{background:#fafafa}\
.figs{display:flex;flex-wrap:wrap;gap:1.5em 2em;align-items:flex-start;margin:1em 0}\
figure{margin:0;flex:0 1 auto;max-width:100%}\
figure.half{flex:0 1 auto;max-width:calc(50% - 1em)}\
figcaption{max-width:46em;margin-bottom:.5em;font-size:95%}\
img{display:block;max-width:100%;height:auto;border:1px solid #eee}";

/// Runs `hyperlens report`.
///
/// # Errors
/// No checkpoint, a bad checkpoint, an unavailable device, a failed analysis or write.
pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    if args.n < 16 || args.batch == 0 {
        bail!("--n must be at least 16 and --batch positive");
    }
    let dirs = checkpoints(&args)?;
    for sub in ["figures", "tables", "codes"] {
        std::fs::create_dir_all(args.out.join(sub))
            .with_context(|| format!("creating {}", args.out.join(sub).display()))?;
    }
    let start = std::time::Instant::now();
    let mut entries = Vec::new();
    for dir in &dirs {
        eprintln!("report: {}", dir.display());
        entries.push(
            analyse_checkpoint(&args, dir, &args.out)
                .with_context(|| format!("analysing {}", dir.display()))?,
        );
    }
    let mut figs = Vec::new();
    let bar = progress_bar(entries.len() as u64, "figures", "checkpoints");
    for e in &entries {
        figs.push(figures(e, &args.out).with_context(|| format!("figures of {}", e.name))?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    let id: Vec<f64> = entries.iter().map(|e| e.id.accuracy).collect();
    let ood: Vec<f64> = entries.iter().map(|e| e.ood.accuracy).collect();
    let bars = GroupedBars::accuracy(
        "SRAVEN accuracy per checkpoint (all 4 features right)",
        &names,
        vec![
            BarSeries {
                name: "in-distribution".into(),
                values: &id,
            },
            BarSeries {
                name: "OOD".into(),
                values: &ood,
            },
        ],
    );
    save_png(args.out.join("figures/accuracy.png"), &bars)?;
    save_svg(args.out.join("figures/accuracy.svg"), &bars)?;
    let comparison = comparison_figure(&entries, &args.out)?;
    let md = markdown(&entries, &figs, comparison.as_ref(), &args);
    write_file(&args.out.join("index.md"), &md)?;
    write_file(
        &args.out.join("index.html"),
        &html(&md, |src| png_width(&args.out.join(src))),
    )?;
    let mut acc_csv = String::from(
        "checkpoint,mixer,split,id_accuracy,ood_accuracy,id_loss,ood_loss,n,steps,planned_steps\n",
    );
    for e in &entries {
        let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        let _ = writeln!(
            acc_csv,
            "{},{},{},{:.6},{:.6},{:.6},{:.6},{},{},{}",
            e.name,
            e.mixer,
            e.split,
            e.id.accuracy,
            e.ood.accuracy,
            e.id.loss,
            e.ood.loss,
            e.id.n,
            opt(e.steps.map(|s| s.done)),
            opt(e.steps.and_then(|s| s.planned))
        );
    }
    write_file(&args.out.join("tables/accuracy.csv"), &acc_csv)?;
    let summary = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "n": args.n,
        "seed": args.seed,
        "device": args.device.to_string(),
        "elapsed_s": start.elapsed().as_secs_f64(),
        "comparison_figures": comparison.iter().map(|g| serde_json::json!({"file": g.rel, "caption": g.caption, "text": g.text})).collect::<Vec<_>>(),
        "checkpoints": entries.iter().zip(&figs).map(|(e, (f, _))| serde_json::json!({
            "name": e.name,
            "dir": e.dir.display().to_string(),
            "mixer": e.mixer,
            "split": e.split,
            "id": {"accuracy": e.id.accuracy, "per_feature_accuracy": e.id.per_feature_accuracy, "loss": e.id.loss},
            "ood": {"accuracy": e.ood.accuracy, "per_feature_accuracy": e.ood.per_feature_accuracy, "loss": e.ood.loss},
            "latent": e.latent.summary(),
            "training_log": matches!(e.training, Training::Log(_)),
            "attention": {
                "file": format!("codes/{}_attention.npz", e.name),
                "shape": e.attention.pattern.shape(),
                "target": e.attention.target,
                "prediction": e.attention.prediction,
                "rules": e.attention.rules,
            },
            "figures": f.iter().map(|g| serde_json::json!({"file": g.rel, "caption": g.caption, "text": g.text})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    write_file(
        &args.out.join("summary.json"),
        &serde_json::to_string_pretty(&summary)?,
    )?;
    println!(
        "wrote {} ({} checkpoints, {:.0} s)",
        args.out.join("index.html").display(),
        entries.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_labels_name_panels_slots_and_queries() {
        let l = token_labels(36, 4);
        assert_eq!(l.len(), 36);
        assert_eq!(l[0], "P0s0");
        assert_eq!(l[27], "P6s3");
        assert_eq!(l[31], "P7s3");
        assert_eq!(l[32], "Q0");
        assert_eq!(l[35], "Q3");
        let l = token_labels(10, 1);
        assert_eq!(l[8], "P8s0");
        assert_eq!(l[9], "Q0");
    }

    #[test]
    fn pearson_matches_hand_values() {
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [2.0, 4.0, 6.0, 8.0];
        assert!((pearson(a.iter().copied(), b.iter().copied()) - 1.0).abs() < 1e-12);
        let c = [4.0, 3.0, 2.0, 1.0];
        assert!((pearson(a.iter().copied(), c.iter().copied()) + 1.0).abs() < 1e-12);
        // x = [1, 2, 3], y = [1, 3, 2]: r = 0.5
        let r = pearson([1.0, 2.0, 3.0].into_iter(), [1.0, 3.0, 2.0].into_iter());
        assert!((r - 0.5).abs() < 1e-12, "{r}");
        assert!(pearson([1.0, 1.0].into_iter(), [1.0, 2.0].into_iter()).is_nan());
    }

    #[test]
    fn training_text_reports_last_and_best_ood() {
        let row = |step, tl, ood: Option<f64>| MetricsRow {
            step,
            lr: 1e-3,
            train_loss: tl,
            train_acc: None,
            id_loss: None,
            id_acc: ood.map(|v| v + 0.1),
            ood_loss: None,
            ood_acc: ood,
            wall_time_s: 0.0,
            steps_per_s: None,
        };
        let rows = vec![
            row(0, None, Some(0.1)),
            row(100, Some(2.0), None),
            row(200, Some(1.0), Some(0.6)),
            row(300, Some(0.5), Some(0.4)),
        ];
        let s = training_text(&rows);
        assert!(s.contains("300 steps"), "{s}");
        assert!(
            s.contains("from 2.000 (step 100) to 0.500 (step 300)"),
            "{s}"
        );
        assert!(s.contains("(step 300) the OOD accuracy is 40.0 %"), "{s}");
        assert!(s.contains("ID accuracy 50.0 %"), "{s}");
        assert!(
            s.contains("best OOD accuracy was 60.0 % at step 200"),
            "{s}"
        );
    }

    fn html_fixed(md: &str) -> String {
        html(md, |src| {
            Some(if src.contains("wide") { 1500 } else { 700 })
        })
    }

    #[test]
    fn trained_updates_read_from_train_json() {
        assert_eq!(thousands(156_250), "156,250");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(steps_of(dir.path()), None);
        assert_eq!(steps_text(None), "?");
        std::fs::write(
            dir.path().join("train.json"),
            r#"{"steps": 30000, "planned_steps": 48000}"#,
        )
        .unwrap();
        let st = steps_of(dir.path());
        assert_eq!(
            st,
            Some(Steps {
                done: 30_000,
                planned: Some(48_000)
            })
        );
        assert_eq!(steps_text(st), "30,000 of 48,000");
        std::fs::write(
            dir.path().join("train.json"),
            r#"{"steps": 156250, "planned_steps": 156250}"#,
        )
        .unwrap();
        assert_eq!(steps_text(steps_of(dir.path())), "156,250");
    }

    #[test]
    fn html_renders_inline_markup_and_tables() {
        let h = html_fixed("# t\n\n**Cap.** text `x` & y\n\n| a | b |\n|---|---|\n| 1 | 2 |\n");
        assert!(
            h.contains("<p><strong>Cap.</strong> text <code>x</code> &amp; y</p>"),
            "{h}"
        );
        let g = html_fixed(
            "**Fig.** says 3\n\n![Fig](figures/a.png)\n\n**B.** b\n\n![B](wide.png)\n\ntext\n",
        );
        assert!(g.contains("<div class=\"figs\">\n<figure class=\"half\"><figcaption><strong>Fig.</strong> says 3</figcaption><a href=\"figures/a.png\"><img src=\"figures/a.png\" alt=\"Fig\"></a></figure>\n<figure><figcaption><strong>B.</strong> b</figcaption><a href=\"wide.png\">"), "{g}");
        assert!(g.contains("</figure>\n</div>\n<p>text</p>"), "{g}");
        assert!(h.contains("<tr><th>a</th><th>b</th></tr>"), "{h}");
        assert!(h.contains("<tr><td>1</td><td>2</td></tr>"), "{h}");
    }
}
