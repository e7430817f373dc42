//! `hyperlens circuits`: the weights-based circuit analyses of one token language model
//! (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"; `spec/circuits.md`),
//! in one run:
//!
//! - OV copying scores (`Re(sum lambda) / sum |lambda|`) of every head, of the OV circuit and of the
//!   full OV circuit through `W_E` / `W_U`, with the raw eigenvalues;
//! - Q-, K- and V-composition scores of every head pair [L, H, L, H] with a seeded random-matrix
//!   baseline, and the top pairs with their baseline percentile;
//! - previous-token, duplicate-token and induction scores ("mul" and "abs", TransformerLens
//!   `head_detector`) and the repeated-random-tokens stripe scores (Olsson et al. 2022) of every
//!   head, on random token sequences repeated twice;
//! - a summary naming the induction and previous-token heads (cut-off 0.4 by default) and the
//!   K-composition between them;
//! - figures of all of these.
//!
//! Every analysis is a `hyperlens_analysis::circuits` function; this file only loads, schedules,
//! writes and draws. Memory stays bounded on real models: circuits are factored (rank `d_head`),
//! no `[vocab, vocab]` product is formed, and attention patterns are held for one sequence at a time.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use hyperlens_analysis::circuits::{
    composition_baseline, composition_memory_bytes, composition_scores, head_scores,
    repeated_token_scores, AttnWeights, CompositionBaseline, CompositionKind, CompositionParams,
    CompositionScores, DetectOptions, ErrorMeasure, HeadEigenvalues, HeadPattern,
};
use hyperlens_model::{lm, Device};
use hyperlens_tasks::induction::repeated_random_tokens;
use hyperlens_viz::{
    save_png, save_png_sized, AttentionGrid, ColorMap, EigenvalueGrid, FigureRow, Heatmap,
    ValueFormat,
};
use indicatif::{ProgressBar, ProgressStyle};
use ndarray::{s, Array2, Array3, Array4, Axis};
use serde_json::json;

use super::common::progress_bar;
use hyperlens_io::write_atomic;

/// Arguments of `hyperlens circuits`.
#[derive(Debug, Args)]
pub struct CircuitsArgs {
    /// The checkpoint: a token-model, Hugging Face Llama or GPT-2 directory, or a .gguf file.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Output directory (created): copying.csv, eigenvalues.npz, composition_{q,k,v}.npz,
    /// composition_top.csv, heads.csv, summary.json and figures/.
    #[arg(long)]
    pub out: PathBuf,
    /// Length n of the random token segment that is repeated once (2n tokens after the prefix)
    /// [default: 50, or half the model's context if that is shorter].
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Seed of the random token sequences and of the composition baseline.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Number of repeated random sequences the head scores are averaged over.
    #[arg(long, default_value_t = 8)]
    pub n_seqs: usize,
    /// A token id put before every sequence (e.g. the model's BOS token); none by default.
    #[arg(long)]
    pub bos: Option<u32>,
    /// Cut-off on the repeated-random-tokens induction and previous-token scores that names a head
    /// an induction / previous-token head.
    #[arg(long, default_value_t = 0.4)]
    pub threshold: f64,
    /// Random head pairs sampled per composition kind for the baseline.
    #[arg(long, default_value_t = 1000)]
    pub baseline_samples: usize,
    /// Head pairs per composition kind listed in composition_top.csv.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Do not fold the norm gains that precede attention (and the final norm) into the weights.
    #[arg(long)]
    pub no_fold_norm: bool,
    /// Worker threads of the composition scores (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Compute device of the forward passes: cpu, cuda[:N] or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
}

impl CircuitsArgs {
    fn check(&self) -> anyhow::Result<()> {
        if self.n_seqs == 0 {
            bail!("--n-seqs must be at least 1");
        }
        if !(self.threshold.is_finite() && (0.0..=1.0).contains(&self.threshold)) {
            bail!("--threshold {} must lie in [0, 1]", self.threshold);
        }
        if self.baseline_samples < 100 {
            bail!(
                "--baseline-samples {} is too few for a 99th percentile (at least 100)",
                self.baseline_samples
            );
        }
        if self.top == 0 {
            bail!("--top must be at least 1");
        }
        if self.seq_len == Some(0) || self.seq_len == Some(1) {
            bail!("--seq-len must be at least 2");
        }
        Ok(())
    }
}

/// Above this many heads, figures switch to compact layouts (small eigenvalue panels, composition
/// heatmaps without values at a fixed size).
const MANY_HEADS: usize = 48;

/// Default length of the repeated random segment (TransformerLens / ARENA induction demo).
const DEFAULT_SEQ_LEN: usize = 50;

/// The random segment length `n`: `--seq-len` or the default, checked against the model's context.
fn resolve_seq_len(args: &CircuitsArgs, max_len: usize, prefix: usize) -> anyhow::Result<usize> {
    let room = max_len.saturating_sub(prefix) / 2;
    match args.seq_len {
        Some(n) if 2 * n + prefix > max_len => bail!(
            "--seq-len {n}: {prefix} + 2 x {n} tokens exceed the model's {max_len} positions \
             (at most --seq-len {room})"
        ),
        Some(n) => Ok(n),
        None if room < 2 => {
            bail!("the model's {max_len} positions leave no room for a repeated sequence")
        }
        None => Ok(DEFAULT_SEQ_LEN.min(room)),
    }
}

/// An `.npz` archive built in memory and written atomically.
struct Npz {
    path: PathBuf,
    writer: ndarray_npy::NpzWriter<Cursor<Vec<u8>>>,
}

impl Npz {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            writer: ndarray_npy::NpzWriter::new(Cursor::new(Vec::new())),
        }
    }

    fn add<A, S, D>(&mut self, name: &str, a: &ndarray::ArrayBase<S, D>) -> anyhow::Result<()>
    where
        A: ndarray_npy::WritableElement,
        S: ndarray::Data<Elem = A>,
        D: ndarray::Dimension,
    {
        self.writer
            .add_array(name, a)
            .with_context(|| format!("{}: array `{name}`", self.path.display()))?;
        Ok(())
    }

    fn finish(self) -> anyhow::Result<()> {
        let cursor = self
            .writer
            .finish()
            .with_context(|| format!("writing {}", self.path.display()))?;
        Ok(write_atomic(&self.path, &cursor.into_inner())?)
    }
}

/// A spinner for one stage; `done` prints the stage's time.
struct Stage {
    bar: ProgressBar,
    name: &'static str,
    t0: Instant,
}

impl Stage {
    fn start(name: &'static str) -> Self {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(name);
        bar.enable_steady_tick(Duration::from_millis(120));
        Self {
            bar,
            name,
            t0: Instant::now(),
        }
    }

    fn done(self, timings: &mut Vec<(&'static str, f64)>) {
        let s = self.t0.elapsed().as_secs_f64();
        self.bar.finish_and_clear();
        eprintln!("  {:<28} {s:>8.2} s", self.name);
        timings.push((self.name, s));
    }
}

/// Head label `L{l}H{h}`.
fn label(l: usize, h: usize) -> String {
    format!("L{l}H{h}")
}

/// Scores of every head on the repeated random sequences, averaged over the sequences.
struct HeadScores {
    /// (pattern, measure) -> [L, H]: previous-token, duplicate-token, induction x mul, abs.
    detect: Vec<(HeadPattern, ErrorMeasure, Array2<f64>)>,
    /// Repeated-random-tokens stripe scores [L, H].
    rep_induction: Array2<f64>,
    rep_previous: Array2<f64>,
    rep_duplicate: Array2<f64>,
    /// Attention of the first sequence, [L, H, T, T].
    first_pattern: Array4<f32>,
    /// Tokens of the first sequence (prefix included).
    first_tokens: Vec<u32>,
}

fn detect_kinds() -> Vec<(HeadPattern, ErrorMeasure)> {
    let mut v = Vec::new();
    for p in [
        HeadPattern::PreviousToken,
        HeadPattern::DuplicateToken,
        HeadPattern::Induction,
    ] {
        for m in [ErrorMeasure::Mul, ErrorMeasure::Abs] {
            v.push((p.clone(), m));
        }
    }
    v
}

/// Runs the model on `n_seqs` repeated random sequences, one at a time, and scores every head.
fn score_heads(
    model: &lm::LanguageModel,
    n: usize,
    prefix: &[u32],
    n_seqs: usize,
    seed: u64,
) -> anyhow::Result<HeadScores> {
    let (nl, nh) = (model.n_layers(), model.n_heads());
    let toks = repeated_random_tokens(model.vocab_size(), n, n_seqs, seed)
        .context("sampling repeated random tokens")?;
    let kinds = detect_kinds();
    let mut detect: Vec<(HeadPattern, ErrorMeasure, Array2<f64>)> = kinds
        .into_iter()
        .map(|(p, m)| (p, m, Array2::zeros((nl, nh))))
        .collect();
    let (mut ri, mut rp, mut rd) = (
        Array2::<f64>::zeros((nl, nh)),
        Array2::<f64>::zeros((nl, nh)),
        Array2::<f64>::zeros((nl, nh)),
    );
    let mut first: Option<(Array4<f32>, Vec<u32>)> = None;
    let bar = progress_bar(n_seqs as u64, "attention on repeated tokens", "seqs");
    for row in toks.rows() {
        let seq: Vec<u32> = prefix.iter().copied().chain(row.iter().copied()).collect();
        let pat = model
            .attention_patterns(&seq)
            .context("forward pass on repeated random tokens")?;
        let rep = repeated_token_scores(&pat.view().insert_axis(Axis(0)), n, prefix.len())?;
        ri += &rep.induction;
        rp += &rep.previous_token;
        rd += &rep.duplicate_token;
        for (p, m, acc) in detect.iter_mut() {
            let opts = DetectOptions {
                measure: *m,
                ..DetectOptions::default()
            };
            *acc += &head_scores(&pat, &seq, p, &opts)?;
        }
        if first.is_none() {
            first = Some((pat, seq));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let k = n_seqs as f64;
    for (_, _, acc) in detect.iter_mut() {
        *acc /= k;
    }
    let (first_pattern, first_tokens) =
        first.context("no sequence was scored (--n-seqs must be at least 1)")?;
    Ok(HeadScores {
        detect,
        rep_induction: ri / k,
        rep_previous: rp / k,
        rep_duplicate: rd / k,
        first_pattern,
        first_tokens,
    })
}

impl HeadScores {
    fn get(&self, p: &HeadPattern, m: ErrorMeasure) -> &Array2<f64> {
        self.detect
            .iter()
            .find(|(pp, mm, _)| pp == p && *mm == m)
            .map(|(_, _, a)| a)
            .expect("every pattern and measure is scored")
    }
}

/// Heads whose score is at least `cut`, strongest first.
fn heads_above(scores: &Array2<f64>, cut: f64) -> Vec<(usize, usize, f64)> {
    let mut v: Vec<(usize, usize, f64)> = scores
        .indexed_iter()
        .filter(|(_, &x)| x >= cut)
        .map(|((l, h), &x)| (l, h, x))
        .collect();
    v.sort_by(|a, b| b.2.total_cmp(&a.2));
    v
}

/// The strongest head, optionally only among layers in `layers`.
fn top_head(scores: &Array2<f64>, layers: std::ops::Range<usize>) -> Option<(usize, usize, f64)> {
    scores
        .indexed_iter()
        .filter(|((l, _), _)| layers.contains(l))
        .map(|((l, h), &x)| (l, h, x))
        .max_by(|a, b| a.2.total_cmp(&b.2))
}

fn copying_csv(ov: &Array2<f64>, full: &Array2<f64>) -> String {
    let mut s = String::from("layer,head,label,ov_copying,full_ov_copying\n");
    for ((l, h), x) in ov.indexed_iter() {
        s += &format!("{l},{h},{},{x:.6},{:.6}\n", label(l, h), full[[l, h]]);
    }
    s
}

fn heads_csv(hs: &HeadScores) -> String {
    let cols: Vec<(&str, &Array2<f64>)> = vec![
        (
            "previous_token_mul",
            hs.get(&HeadPattern::PreviousToken, ErrorMeasure::Mul),
        ),
        (
            "previous_token_abs",
            hs.get(&HeadPattern::PreviousToken, ErrorMeasure::Abs),
        ),
        (
            "duplicate_token_mul",
            hs.get(&HeadPattern::DuplicateToken, ErrorMeasure::Mul),
        ),
        (
            "duplicate_token_abs",
            hs.get(&HeadPattern::DuplicateToken, ErrorMeasure::Abs),
        ),
        (
            "induction_mul",
            hs.get(&HeadPattern::Induction, ErrorMeasure::Mul),
        ),
        (
            "induction_abs",
            hs.get(&HeadPattern::Induction, ErrorMeasure::Abs),
        ),
        ("repeated_induction", &hs.rep_induction),
        ("repeated_previous_token", &hs.rep_previous),
        ("repeated_duplicate_token", &hs.rep_duplicate),
    ];
    let mut s = String::from("layer,head,label");
    for (name, _) in &cols {
        s += ",";
        s += name;
    }
    s += "\n";
    for ((l, h), _) in hs.rep_induction.indexed_iter() {
        s += &format!("{l},{h},{}", label(l, h));
        for (_, a) in &cols {
            s += &format!(",{:.6}", a[[l, h]]);
        }
        s += "\n";
    }
    s
}

/// One row of composition_top.csv.
struct TopPair {
    kind: CompositionKind,
    rank: usize,
    from: (usize, usize),
    to: (usize, usize),
    score: f64,
    percentile: f64,
    p99: f64,
}

fn top_pairs(
    scores: &CompositionScores,
    baseline: &CompositionBaseline,
    top: usize,
) -> anyhow::Result<Vec<TopPair>> {
    let mut out = Vec::new();
    for kind in CompositionKind::ALL {
        let Some(a) = scores.get(kind) else { continue };
        let p99 = baseline.percentile(kind, 99.0)?;
        let mut pairs: Vec<((usize, usize, usize, usize), f64)> = a
            .indexed_iter()
            .filter(|((l1, _, l2, _), _)| l1 < l2)
            .map(|(i, &x)| (i, x))
            .collect();
        pairs.sort_by(|x, y| y.1.total_cmp(&x.1));
        for (rank, ((l1, h1, l2, h2), x)) in pairs.into_iter().take(top).enumerate() {
            out.push(TopPair {
                kind,
                rank: rank + 1,
                from: (l1, h1),
                to: (l2, h2),
                score: x,
                percentile: 100.0 * baseline.fraction_below(kind, x),
                p99,
            });
        }
    }
    Ok(out)
}

fn top_csv(pairs: &[TopPair]) -> String {
    let mut s = String::from(
        "kind,rank,writer,reader,writer_layer,writer_head,reader_layer,reader_head,score,baseline_percentile,baseline_p99,above_p99\n",
    );
    for p in pairs {
        s += &format!(
            "{},{},{},{},{},{},{},{},{:.6},{:.2},{:.6},{}\n",
            p.kind,
            p.rank,
            label(p.from.0, p.from.1),
            label(p.to.0, p.to.1),
            p.from.0,
            p.from.1,
            p.to.0,
            p.to.1,
            p.score,
            p.percentile,
            p.p99,
            p.score > p.p99
        );
    }
    s
}

/// (re, im) pairs of every head, layer-major.
fn eig_pairs(e: &HeadEigenvalues) -> Vec<Vec<(f64, f64)>> {
    let (l, h, _) = e.re.dim();
    let mut out = Vec::with_capacity(l * h);
    for li in 0..l {
        for hi in 0..h {
            out.push(
                e.re.slice(s![li, hi, ..])
                    .iter()
                    .zip(e.im.slice(s![li, hi, ..]).iter())
                    .map(|(&r, &i)| (r, i))
                    .collect(),
            );
        }
    }
    out
}

fn eigen_figure(
    path: &Path,
    title: &str,
    e: &HeadEigenvalues,
    copying: &Array2<f64>,
) -> anyhow::Result<()> {
    let (l, h, _) = e.re.dim();
    let pairs = eig_pairs(e);
    let mut grid = EigenvalueGrid::layers_by_heads(title, &pairs, l, h)?;
    let many = l * h > MANY_HEADS;
    for (i, p) in grid.panels.iter_mut().enumerate() {
        let c = copying[[i / h, i % h]];
        p.label = if many {
            format!("{} {c:.2}", p.label)
        } else {
            format!("{}  copy {c:.2}", p.label)
        };
    }
    if many {
        // Small panels keep a real model's figure (hundreds of heads) readable and small.
        let side = 120;
        save_png_sized(path, &grid, (h as u32 * side + 60, l as u32 * side + 110))?;
    } else {
        save_png(path, &grid)?;
    }
    Ok(())
}

/// Everything the summary says about one head.
fn head_json(l: usize, h: usize, score: f64) -> serde_json::Value {
    json!({"head": label(l, h), "layer": l, "index": h, "score": score})
}

/// Runs `hyperlens circuits`.
///
/// # Errors
/// Bad flags (named), an unknown or invalid checkpoint (named with the file and tensor), a
/// `--seq-len` the model's context cannot hold, token ids out of the vocabulary, numerical failure
/// of an eigen-solve, a failed write.
pub fn run(args: CircuitsArgs) -> anyhow::Result<()> {
    args.check()?;
    let t_all = Instant::now();
    let mut timings: Vec<(&'static str, f64)> = Vec::new();
    let kind = lm::detect(&args.checkpoint)?;
    let device = args.device.to_candle()?;
    let figures = args.out.join("figures");
    std::fs::create_dir_all(&figures).with_context(|| format!("creating {}", figures.display()))?;

    let stage = Stage::start("load checkpoint");
    let model = lm::load(&args.checkpoint, &device)?;
    stage.done(&mut timings);
    let (nl, nh, vocab) = (model.n_layers(), model.n_heads(), model.vocab_size());
    if nl == 0 {
        bail!(
            "{}: a model without attention layers has no heads to analyse",
            args.checkpoint.display()
        );
    }
    if let Some(b) = args.bos {
        if b as usize >= vocab {
            bail!("--bos {b} is outside the vocabulary of {vocab} tokens");
        }
    }
    let prefix: Vec<u32> = args.bos.into_iter().collect();
    let n = resolve_seq_len(&args, model.max_seq_len(), prefix.len())?;
    eprintln!(
        "{} ({kind}): {nl} layers x {nh} heads, vocabulary {vocab}; {} sequences of {} + 2 x {n} tokens",
        args.checkpoint.display(),
        args.n_seqs,
        prefix.len()
    );

    let t0 = Instant::now();
    let hs = score_heads(&model, n, &prefix, args.n_seqs, args.seed)?;
    let s = t0.elapsed().as_secs_f64();
    eprintln!("  {:<28} {s:>8.2} s", "attention on repeated tokens");
    timings.push(("attention on repeated tokens", s));

    let stage = Stage::start("head weights");
    let fold = !args.no_fold_norm;
    let hw = model.head_weights(fold)?;
    drop(model);
    let w = AttnWeights::new(hw.w_q, hw.w_k, hw.w_v, hw.w_o)?.with_embeddings(
        Some(hw.w_e),
        Some(hw.w_u),
        Some(hw.b_u),
    )?;
    let dims = w.check()?;
    stage.done(&mut timings);

    let stage = Stage::start("OV eigenvalues");
    let ov = w.ov_eigenvalues()?;
    let full = w.full_ov_eigenvalues()?;
    let ov_copy = ov.copying_scores();
    let full_copy = full.copying_scores();
    stage.done(&mut timings);

    let stage = Stage::start("composition scores");
    let params = CompositionParams {
        threads: args.threads,
        ..CompositionParams::default()
    };
    let comp_mem = composition_memory_bytes(&w, &params)?;
    let comp = composition_scores(&w, &params)?;
    stage.done(&mut timings);

    let stage = Stage::start("composition baseline");
    let baseline = composition_baseline(
        dims.d_model,
        dims.d_qk,
        dims.d_v,
        args.baseline_samples,
        args.seed,
    )?;
    stage.done(&mut timings);

    let stage = Stage::start("write tables");
    write_atomic(
        &args.out.join("copying.csv"),
        copying_csv(&ov_copy, &full_copy).as_bytes(),
    )?;
    let mut npz = Npz::new(args.out.join("eigenvalues.npz"));
    npz.add("ov_re", &ov.re)?;
    npz.add("ov_im", &ov.im)?;
    npz.add("full_ov_re", &full.re)?;
    npz.add("full_ov_im", &full.im)?;
    npz.add("ov_copying", &ov_copy)?;
    npz.add("full_ov_copying", &full_copy)?;
    npz.finish()?;
    let mut p99 = serde_json::Map::new();
    for k in CompositionKind::ALL {
        let scores = comp
            .get(k)
            .with_context(|| format!("{k}-composition scores were not computed"))?;
        let mut npz = Npz::new(args.out.join(format!("composition_{k}.npz")));
        npz.add("scores", scores)?;
        npz.add("baseline", &ndarray::ArrayView1::from(baseline.samples(k)))?;
        npz.finish()?;
        p99.insert(k.to_string(), json!(baseline.percentile(k, 99.0)?));
    }
    let top = top_pairs(&comp, &baseline, args.top)?;
    write_atomic(
        &args.out.join("composition_top.csv"),
        top_csv(&top).as_bytes(),
    )?;
    write_atomic(&args.out.join("heads.csv"), heads_csv(&hs).as_bytes())?;
    stage.done(&mut timings);

    // Named heads and the circuit between them.
    let cut = args.threshold;
    let induction = heads_above(&hs.rep_induction, cut);
    let previous = heads_above(&hs.rep_previous, cut);
    let k_scores = comp.k.as_ref().context("K-composition scores")?;
    let k_p99 = baseline.percentile(CompositionKind::K, 99.0)?;
    let pair_json = |(l1, h1): (usize, usize), (l2, h2): (usize, usize)| {
        let x = k_scores[[l1, h1, l2, h2]];
        json!({
            "previous_token_head": label(l1, h1),
            "induction_head": label(l2, h2),
            "k_composition": x,
            "baseline_percentile": 100.0 * baseline.fraction_below(CompositionKind::K, x),
            "above_baseline_p99": x > k_p99,
        })
    };
    let mut circuits = Vec::new();
    for &(l2, h2, _) in &induction {
        for &(l1, h1, _) in &previous {
            if l1 < l2 {
                circuits.push(pair_json((l1, h1), (l2, h2)));
            }
        }
    }
    let top_ind = top_head(&hs.rep_induction, 1.min(nl - 1)..nl);
    let strongest = top_ind.and_then(|(l2, h2, _)| {
        top_head(&hs.rep_previous, 0..l2).map(|(l1, h1, _)| pair_json((l1, h1), (l2, h2)))
    });
    let top_prev = top_head(&hs.rep_previous, 0..nl);

    let stage = Stage::start("figures");
    eigen_figure(
        &figures.join("eigenvalues.png"),
        "OV circuit eigenvalues λ/|λ| per head (copying score)",
        &ov,
        &ov_copy,
    )?;
    eigen_figure(
        &figures.join("eigenvalues_full_ov.png"),
        "Full OV circuit W_E W_OV W_U: eigenvalues λ/|λ| per head",
        &full,
        &full_copy,
    )?;
    for k in CompositionKind::ALL {
        if let Some(sc) = comp.get(k) {
            let title = format!(
                "{}-composition scores (random baseline p99 = {:.3})",
                k.name().to_uppercase(),
                baseline.percentile(k, 99.0)?
            );
            let mut hm = Heatmap::composition(&title, sc.view())?;
            let path = figures.join(format!("composition_{k}.png"));
            if nl * nh > 24 {
                hm.options.value_format = ValueFormat::Hidden;
            }
            if nl * nh > MANY_HEADS {
                save_png_sized(path, &hm, (1500, 1450))?;
            } else {
                save_png(path, &hm)?;
            }
        }
    }
    let panel = |title: &str, a: &Array2<f64>| {
        Heatmap::head_scores(
            title,
            a.view(),
            "score",
            ColorMap::Viridis,
            Some((0.0, 1.0)),
        )
    };
    let row = FigureRow::new(
        &format!(
            "Head scores on {} random sequences of {n} tokens repeated twice",
            args.n_seqs
        ),
        vec![
            panel("induction", &hs.rep_induction)?,
            panel("previous token", &hs.rep_previous)?,
            panel("duplicate token", &hs.rep_duplicate)?,
        ],
    );
    save_png(figures.join("head_scores.png"), &row)?;
    // The previous-token head shown is the strongest one below the top induction head's layer
    // (the pair of the induction circuit), or the strongest overall in a one-layer model.
    let shown_prev = top_ind
        .and_then(|(l2, _, _)| top_head(&hs.rep_previous, 0..l2))
        .or(top_prev);
    let mut show: Vec<(usize, usize, String)> = Vec::new();
    if let Some((l, h, x)) = shown_prev {
        show.push((l, h, format!("{}: previous token {x:.2}", label(l, h))));
    }
    if let Some((l, h, x)) = top_ind {
        show.push((l, h, format!("{}: induction {x:.2}", label(l, h))));
    }
    let t = hs.first_tokens.len();
    let mut pats = Array3::<f64>::zeros((show.len(), t, t));
    for (i, (l, h, _)) in show.iter().enumerate() {
        pats.slice_mut(s![i, .., ..])
            .assign(&hs.first_pattern.slice(s![*l, *h, .., ..]).mapv(f64::from));
    }
    let tok_labels: Vec<String> = hs.first_tokens.iter().map(|t| t.to_string()).collect();
    let mut grid = AttentionGrid::new(
        "Attention on repeated random tokens",
        pats.view(),
        &tok_labels,
        &tok_labels,
    );
    grid.panel_titles = show.iter().map(|(_, _, s)| s.clone()).collect();
    grid.columns = show.len().max(1);
    grid.range = Some((0.0, 1.0));
    if prefix.is_empty() {
        grid.separators = Some(n);
    }
    save_png(figures.join("induction_attention.png"), &grid)?;
    stage.done(&mut timings);

    let summary = json!({
        "producer": format!("hyperlens {} circuits", env!("CARGO_PKG_VERSION")),
        "checkpoint": args.checkpoint,
        "checkpoint_kind": kind.to_string(),
        "model": {
            "n_layers": nl, "n_heads": nh, "d_model": dims.d_model, "d_head": dims.d_qk,
            "d_vocab": vocab, "norms_folded": fold,
        },
        "inputs": {
            "sequences": args.n_seqs, "repeated_segment": n, "prefix": prefix,
            "tokens_per_sequence": prefix.len() + 2 * n, "seed": args.seed,
            "sampler": "hyperlens_tasks::induction::repeated_random_tokens (uniform over the vocabulary)",
        },
        "thresholds": {
            "induction": {"cut": cut, "score": "repeated_induction (heads.csv): mean attention of \
                second-copy query n+i to key i+1, the stripe at offset -(n-1)"},
            "previous_token": {"cut": cut, "score": "repeated_previous_token (heads.csv): mean \
                attention of query i to key i-1 over the whole sequence"},
            "composition": "a pair stands out when its score exceeds the 99th percentile of the \
                random baseline of its kind",
        },
        "induction_heads": induction.iter().map(|&(l, h, x)| head_json(l, h, x)).collect::<Vec<_>>(),
        "previous_token_heads": previous.iter().map(|&(l, h, x)| head_json(l, h, x)).collect::<Vec<_>>(),
        "induction_circuits": circuits,
        "top_induction_head": top_ind.map(|(l, h, x)| json!({
            "head": label(l, h), "score": x,
            "ov_copying": ov_copy[[l, h]], "full_ov_copying": full_copy[[l, h]],
        })),
        "top_previous_token_head": top_prev.map(|(l, h, x)| head_json(l, h, x)),
        "strongest_pair": strongest,
        "composition": {
            "baseline_samples": args.baseline_samples,
            "baseline_seed": args.seed,
            "baseline_p99": p99,
            "estimated_working_memory_bytes": comp_mem,
        },
        "detection_options": {"exclude_bos": false, "exclude_current_token": false},
        "files": {
            "copying.csv": "per head: OV-circuit and full-OV-circuit (W_E W_V W_O W_U) copying score Re(sum λ)/sum|λ|",
            "eigenvalues.npz": "ov_re, ov_im, full_ov_re, full_ov_im [L, H, d_head] (descending modulus); ov_copying, full_ov_copying [L, H]",
            "composition_{q,k,v}.npz": "scores [L1, H1, L2, H2] (zero where l1 >= l2), baseline [samples] sorted",
            "composition_top.csv": "top pairs per kind with their baseline percentile",
            "heads.csv": "per head: previous-token / duplicate-token / induction scores (mul, abs) and repeated-random-tokens stripe scores",
            "figures/": "eigenvalues.png, eigenvalues_full_ov.png, composition_{q,k,v}.png, head_scores.png, induction_attention.png",
        },
        "timings_s": timings.iter().map(|(k, v)| json!({"stage": k, "seconds": v})).collect::<Vec<_>>(),
        "wall_time_s": t_all.elapsed().as_secs_f64(),
    });
    write_atomic(
        &args.out.join("summary.json"),
        (serde_json::to_string_pretty(&summary)? + "\n").as_bytes(),
    )?;

    let names = |v: &[(usize, usize, f64)]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.iter()
                .map(|&(l, h, x)| format!("{} ({x:.2})", label(l, h)))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    println!("induction heads (>= {cut}): {}", names(&induction));
    println!("previous-token heads (>= {cut}): {}", names(&previous));
    if let Some(p) = &strongest {
        println!(
            "strongest pair: {} -> {}: K-composition {:.3} (baseline percentile {:.1}, p99 {k_p99:.3})",
            p["previous_token_head"].as_str().unwrap_or("?"),
            p["induction_head"].as_str().unwrap_or("?"),
            p["k_composition"].as_f64().unwrap_or(f64::NAN),
            p["baseline_percentile"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!(
        "wrote {} in {:.1} s",
        args.out.display(),
        t_all.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn args(seq_len: Option<usize>) -> CircuitsArgs {
        CircuitsArgs {
            checkpoint: PathBuf::from("x"),
            out: PathBuf::from("y"),
            seq_len,
            seed: 0,
            n_seqs: 1,
            bos: None,
            threshold: 0.4,
            baseline_samples: 100,
            top: 5,
            no_fold_norm: false,
            threads: 1,
            device: Device::Cpu,
        }
    }

    #[test]
    fn seq_len_fits_the_context() {
        assert_eq!(resolve_seq_len(&args(None), 64, 0).unwrap(), 32);
        assert_eq!(resolve_seq_len(&args(None), 64, 1).unwrap(), 31);
        assert_eq!(resolve_seq_len(&args(None), 8192, 1).unwrap(), 50);
        assert_eq!(resolve_seq_len(&args(Some(10)), 64, 1).unwrap(), 10);
        let e = resolve_seq_len(&args(Some(32)), 64, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most --seq-len 31"), "{e}");
        assert!(resolve_seq_len(&args(None), 3, 0).is_err());
        assert!(args(Some(1)).check().is_err());
        let mut a = args(None);
        a.threshold = 1.5;
        assert!(a.check().is_err());
    }

    #[test]
    fn heads_are_named_strongest_first() {
        let s = array![[0.1, 0.5, 0.45], [0.9, 0.39, 0.4]];
        let v = heads_above(&s, 0.4);
        let names: Vec<String> = v.iter().map(|&(l, h, _)| label(l, h)).collect();
        assert_eq!(names, ["L1H0", "L0H1", "L0H2", "L1H2"]);
        assert_eq!(top_head(&s, 0..1).map(|t| (t.0, t.1)), Some((0, 1)));
        assert_eq!(top_head(&s, 1..2).map(|t| (t.0, t.1)), Some((1, 0)));
        assert_eq!(top_head(&s, 2..2), None);
    }
}
