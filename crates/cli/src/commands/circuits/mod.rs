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
//! The analyses are `hyperlens_analysis::circuits::pipeline` ([`analyze_circuits`] and the tables
//! of its [`CircuitReport`](hyperlens_analysis::circuits::CircuitReport)); this module loads the
//! model, runs it on the sequences, and draws (`figures.rs`). Memory stays bounded on real models:
//! circuits are factored (rank `d_head`),
//! no `[vocab, vocab]` product is formed, and attention patterns are held for one sequence at a time.

mod figures;
mod summary;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use hyperlens_analysis::circuits::{analyze_circuits, AttnWeights, CircuitParams, HeadScorer};
use hyperlens_model::{lm, Device};
use hyperlens_tasks::induction::repeated_random_tokens;

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
    fn params(&self) -> CircuitParams {
        CircuitParams {
            threshold: self.threshold,
            baseline_samples: self.baseline_samples,
            seed: self.seed,
            top: self.top,
            threads: self.threads,
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.n_seqs == 0 {
            bail!("--n-seqs must be at least 1");
        }
        if self.seq_len == Some(0) || self.seq_len == Some(1) {
            bail!("--seq-len must be at least 2");
        }
        Ok(self.params().check()?)
    }
}

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

/// Runs the model on `n_seqs` repeated random sequences, one at a time, and scores every head.
fn score_heads(
    model: &lm::LanguageModel,
    n: usize,
    prefix: &[u32],
    n_seqs: usize,
    seed: u64,
) -> anyhow::Result<hyperlens_analysis::circuits::HeadScores> {
    let toks = repeated_random_tokens(model.vocab_size(), n, n_seqs, seed)
        .context("sampling repeated random tokens")?;
    let mut scorer = HeadScorer::new(model.n_layers(), model.n_heads(), n, prefix.len())?;
    let bar = progress_bar(n_seqs as u64, "attention on repeated tokens", "seqs");
    for row in toks.rows() {
        let seq: Vec<u32> = prefix.iter().copied().chain(row.iter().copied()).collect();
        let pattern = model
            .attention_patterns(&seq)
            .context("forward pass on repeated random tokens")?;
        scorer.add(pattern, &seq)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(scorer.finish()?)
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
    let heads = score_heads(&model, n, &prefix, args.n_seqs, args.seed)?;
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
    let mut stage = Some(stage);
    let report = analyze_circuits(&w, heads, &args.params(), &mut |next| {
        if let Some(s) = stage.take() {
            s.done(&mut timings);
        }
        stage = Some(Stage::start(next.name()));
    })?;
    if let Some(s) = stage.take() {
        s.done(&mut timings);
    }

    let stage = Stage::start("write tables");
    report.write_tables(&args.out)?;
    stage.done(&mut timings);
    let stage = Stage::start("figures");
    figures::draw(&report, &figures)?;
    stage.done(&mut timings);

    let inputs = summary::Inputs {
        args: &args,
        kind: kind.to_string(),
        vocab,
        repeated: n,
        prefix: &prefix,
        fold,
    };
    let summary = summary::summary(&inputs, &report, &timings, t_all.elapsed().as_secs_f64())?;
    hyperlens_io::write_json(&args.out.join("summary.json"), &summary)?;
    summary::print_findings(&report)?;
    outln!(
        "wrote {} in {:.1} s",
        args.out.display(),
        t_all.elapsed().as_secs_f64()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(a.check().unwrap_err().to_string().contains("--threshold"));
    }
}
