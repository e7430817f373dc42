//! `hyperlens circuits`: the weights-based circuit analyses of one token language model
//! (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"; `docs/spec/circuits.md`),
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
//! The work is `hyperlens_probe::circuits::run` (the inputs' rules, the forward passes on the
//! sequences, then `hyperlens_analysis::circuits::analyze_circuits`); this module parses the flags,
//! reports progress, writes the report's tables, draws (`hyperlens_report::circuit_figures`) and writes the
//! `CircuitSummary`. Memory stays bounded on real models: circuits are factored (rank `d_head`),
//! no `[vocab, vocab]` product is formed, attention patterns are held for one sequence at a time,
//! and the model is dropped once its head weights are read.

mod summary;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use hyperlens_analysis::circuits::CircuitParams;
use hyperlens_model::{lm, Device};
use hyperlens_probe::circuits::{self, CircuitRunParams, CircuitStep, CircuitSummary};

use super::common::{progress_bar, Stage};

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
    /// Compute device of the forward passes: cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
}

impl CircuitsArgs {
    fn params(&self) -> CircuitRunParams {
        CircuitRunParams {
            seq_len: self.seq_len,
            n_seqs: self.n_seqs,
            bos: self.bos,
            fold_norm: !self.no_fold_norm,
            analysis: CircuitParams {
                threshold: self.threshold,
                baseline_samples: self.baseline_samples,
                seed: self.seed,
                top: self.top,
                threads: self.threads,
            },
        }
    }
}

/// The progress of a run: a bar over the sequences, then one timed stage per step.
struct Progress {
    timings: Vec<(&'static str, f64)>,
    bar: Option<indicatif::ProgressBar>,
    t_sequences: Instant,
    stage: Option<Stage>,
}

impl Progress {
    /// Reports `step`; `model` names the checkpoint, its kind and sizes (layers, heads, vocabulary).
    fn step(&mut self, step: CircuitStep<'_>, model: (&Path, &str, [usize; 3])) {
        match step {
            CircuitStep::Planned(plan) => {
                let (checkpoint, kind, [nl, nh, vocab]) = model;
                eprintln!(
                    "{} ({kind}): {nl} layers x {nh} heads, vocabulary {vocab}; {} sequences of {} + 2 x {} tokens",
                    checkpoint.display(),
                    plan.n_seqs,
                    plan.prefix.len(),
                    plan.seq_len
                );
                self.t_sequences = Instant::now();
            }
            CircuitStep::Sequences { done: 0, total } => {
                self.bar = Some(progress_bar(
                    total as u64,
                    "attention on repeated tokens",
                    "seqs",
                ));
            }
            CircuitStep::Sequences { .. } => {
                if let Some(b) = &self.bar {
                    b.inc(1);
                }
            }
            CircuitStep::HeadWeights => {
                if let Some(b) = self.bar.take() {
                    b.finish_and_clear();
                }
                let s = self.t_sequences.elapsed().as_secs_f64();
                eprintln!("  {:<28} {s:>8.2} s", "attention on repeated tokens");
                self.timings.push(("attention on repeated tokens", s));
                self.next(Stage::start("head weights"));
            }
            CircuitStep::Analysis(next) => self.next(Stage::start(next.name())),
        }
    }

    /// Ends the running stage, if any, and starts `stage`.
    fn next(&mut self, stage: Stage) {
        self.finish();
        self.stage = Some(stage);
    }

    fn finish(&mut self) {
        if let Some(s) = self.stage.take() {
            s.done(&mut self.timings);
        }
    }
}

/// Runs `hyperlens circuits`.
///
/// # Errors
/// Bad flags (named), an unknown or invalid checkpoint (named with the file and tensor), a
/// `--seq-len` the model's context cannot hold, token ids out of the vocabulary, numerical failure
/// of an eigen-solve, a failed write.
pub fn run(args: CircuitsArgs) -> anyhow::Result<()> {
    let params = args.params();
    params.check()?;
    let t_all = Instant::now();
    let kind = lm::detect(&args.checkpoint)?.to_string();
    let device = args.device.to_candle()?;
    let figures = args.out.join("figures");
    std::fs::create_dir_all(&figures).with_context(|| format!("creating {}", figures.display()))?;

    let mut progress = Progress {
        timings: Vec::new(),
        bar: None,
        t_sequences: Instant::now(),
        stage: Some(Stage::start("load checkpoint")),
    };
    let model = lm::load(&args.checkpoint, &device)?;
    progress.finish();
    let sizes = [model.n_layers(), model.n_heads(), model.vocab_size()];
    let run = circuits::run(model, &params, &mut |step| {
        progress.step(step, (&args.checkpoint, &kind, sizes));
        ControlFlow::Continue(())
    })?;
    progress.finish();

    let stage = Stage::start("write tables");
    run.report.write_tables(&args.out)?;
    stage.done(&mut progress.timings);
    let stage = Stage::start("figures");
    hyperlens_report::circuit_figures::draw_circuit_figures(&run.report, &figures)?;
    stage.done(&mut progress.timings);

    let summary = CircuitSummary::new(
        &run,
        &params,
        args.checkpoint.clone(),
        kind,
        &progress.timings,
        t_all.elapsed().as_secs_f64(),
    )?;
    hyperlens_io::write_json(&args.out.join("summary.json"), &summary.to_json()?)?;
    summary::print_findings(&run.report)?;
    outln!(
        "wrote {} in {:.1} s",
        args.out.display(),
        t_all.elapsed().as_secs_f64()
    )?;
    Ok(())
}
