//! `hyperlens`: one binary from training to report. A thin `main`: parse the arguments, run the
//! subcommand, report any error once, and exit with 0 (success), 1 (the command failed) or 2 (bad usage,
//! reported by clap).

use clap::{Parser, Subcommand};

/// `println!` that returns the write error instead of panicking on it, so that a closed pipe
/// (`hyperlens info ... | head -1`) ends the program quietly (see [`main`]).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `print!` that returns the write error instead of panicking on it (see [`outln!`]).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod commands;

/// hyperlens: transformer interpretability from training to report. Latent codes of attention as
/// a hypernetwork (Schug et al., ICLR 2025) and circuits from the weights (Elhage et al. 2021).
#[derive(Debug, Parser)]
#[command(name = "hyperlens", version, about, long_about = None)]
struct Cli {
    /// The most memory one allocation asked for by a file or a flag may take, e.g. 8G or 512M
    /// (default: HYPERLENS_MEMORY_BUDGET, else half of the least of this machine's memory, the
    /// address space left under `ulimit -v` and the cgroup's memory limit). Larger sizes are
    /// refused up front with what they would have cost.
    #[arg(long, global = true, value_name = "SIZE", value_parser = parse_budget)]
    memory_budget: Option<u64>,
    #[command(subcommand)]
    command: Command,
}

/// Parses `--memory-budget` (clap reports a bad value with exit code 2).
fn parse_budget(s: &str) -> Result<u64, String> {
    hyperlens_io::budget::parse_size("--memory-budget", s).map_err(|e| e.to_string())
}

/// The subcommands; each lives in its own file under `commands/`.
#[derive(Debug, Subcommand)]
enum Command {
    /// Task generators: list splits, sample problem sets.
    #[command(subcommand)]
    Tasks(commands::tasks::TasksCommand),
    /// Import foreign parameter files (the paper's JAX export) as a native checkpoint.
    #[command(subcommand)]
    Import(commands::import::ImportCommand),
    /// Describe a checkpoint: config, mixer, parameter count, tensor table.
    Info(commands::info::InfoArgs),
    /// Accuracy, per-feature accuracy and loss of a checkpoint on SRAVEN problems.
    Eval(commands::eval::EvalArgs),
    /// Train a model (SRAVEN, fuzzy logic, induction) with the paper's recipe; --resume continues a run.
    Train(Box<commands::train::TrainArgs>),
    /// Extract latent codes (attention across heads at a query/key site) with labels to a .npz file.
    Probe(commands::probe::ProbeArgs),
    /// The main job: accuracy, latent codes and their analyses for every shipped checkpoint, as a report.
    Report(commands::report::ReportArgs),
    /// The latent-code study of a language model: structural relations (the positive control),
    /// in-context operations on held-out combinations, the transplant, and a verdict, as a report.
    Study(commands::study::StudyArgs),
    /// Latent-code analyses of an ID / OOD pair of code sets: PCA, rule decoding, k-means, similarity.
    Analyze(commands::analyze::AnalyzeArgs),
    /// Attention patterns [layer, head, query, key] of a token language model (token model, Hugging
    /// Face Llama / GPT-2 directory, or .gguf file) on one token sequence, to a .npz file.
    Attention(commands::attention::AttentionArgs),
    /// Circuits from the weights and patterns of a token language model: OV copying scores,
    /// Q/K/V composition with a random baseline, induction and previous-token heads, figures.
    Circuits(Box<commands::circuits::CircuitsArgs>),
    /// Activations of hook points (TransformerLens names, e.g. `blocks.*.hook_resid_post`) over a
    /// problem set, one array per hook, to a .npz file.
    Cache(Box<commands::cache::CacheArgs>),
    /// Interventions through the hook points: `heads` ablates each attention head in turn,
    /// `transplant` moves another rule's latent code into the answer's site, `acts` patches clean
    /// activations into corrupted problems, `dla` attributes the answer logit to each component.
    #[command(subcommand)]
    Patch(commands::patch::PatchCommand),
    /// Many training runs from one spec: plan them, run them here or on Slurm, follow them.
    #[command(subcommand)]
    Sweep(commands::sweep::SweepCommand),
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Tasks(c) => commands::tasks::run(c),
        Command::Import(c) => commands::import::run(c),
        Command::Info(a) => commands::info::run(a),
        Command::Eval(a) => commands::eval::run(a),
        Command::Train(a) => commands::train::run(*a),
        Command::Probe(a) => commands::probe::run(a),
        Command::Report(a) => commands::report::run(a),
        Command::Study(a) => commands::study::run(a),
        Command::Analyze(a) => commands::analyze::run(a),
        Command::Attention(a) => commands::attention::run(a),
        Command::Circuits(a) => commands::circuits::run(*a),
        Command::Sweep(c) => commands::sweep::run(c),
        Command::Cache(a) => commands::cache::run(*a),
        Command::Patch(c) => commands::patch::run(c),
    }
}

fn main() {
    pin_matmul_threads();
    let cli = Cli::parse();
    if let Some(bytes) = cli.memory_budget {
        hyperlens_io::budget::set_memory_budget(bytes);
    } else if let Err(e) = hyperlens_io::budget::check_env() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    if let Err(err) = run(cli) {
        if is_broken_pipe(&err) {
            // The reader went away (`| head`): nothing left to say to it, and not a failure.
            std::process::exit(0);
        }
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}

/// Whether an error comes from writing to a closed pipe (ripgrep's rule: exit quietly with 0).
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Fixes candle's CPU matmul thread count once, in `RAYON_NUM_THREADS`, unless the user set it.
///
/// candle 0.11's CPU matmul asks `candle_core::utils::get_num_threads()` for its thread count on
/// every call, and without `RAYON_NUM_THREADS` that reads and parses `/proc/cpuinfo`
/// (`num_cpus::get_physical`) each time: a large share of a small model's training step
/// (`benches/train_step.rs`, group `overhead`; figures in `CHANGELOG.md`), and more on
/// many-core machines whose `/proc/cpuinfo` is longer. The value set is the one candle would
/// have computed, so the parallelism is unchanged. Runs first in `main`, before any thread starts.
fn pin_matmul_threads() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = candle_core::utils::get_num_threads();
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
}
