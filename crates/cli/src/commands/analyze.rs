//! `hyperlens analyze`: the latent-code analyses of a pair of code sets written by the probe
//! (in-distribution codes to train the rule decoder on, OOD codes to test it on): per layer and on
//! all layers, PCA, rule decoding with its controls, k-means scores and mean-code similarity
//! (`docs/spec/latent-codes.md`). Writes `decoding.csv`, `pca.csv`, `pca.npz`, `clusters.csv`,
//! `similarity.csv`, `confusion.csv` and `summary.json` into `--out`.
//!
//! With `--lm-codes` (a language model's code file written by `probe` from a prompt file, with
//! its `codes.json` beside it) it decodes a factor trained on the seen combinations and tested
//! on the held-out ones, per layer and on all layers, with its controls and bootstrap intervals,
//! and runs PCA and k-means per layer (`hyperlens_analysis::lm`): `decoding.csv`,
//! `behaviour.csv`, `structure.csv`, `summary.json` and `explorer.html`, the latent-space explorer
//! with each prompt's text on hover (`hyperlens_report::lm_explorer`; `--no-explorer` skips it).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use hyperlens_analysis::codes::report::{CodeSplit, Progress};
use hyperlens_analysis::decode::LogisticParams;
use hyperlens_analysis::embed::CodeEmbedding;
use hyperlens_analysis::lm::{self, LmAnalysisParams, LmProgress};
use hyperlens_analysis::terms::{TermCodes, TermDecodingParams};
use hyperlens_analysis::{analyze_pair, CodeSet, LatentAnalysisParams};
use indicatif::{ProgressBar, ProgressStyle};

/// Arguments of `hyperlens analyze`.
#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// Codes to train the rule decoder on (in-distribution), a `.npz` written by the probe.
    #[arg(
        long,
        required_unless_present = "lm_codes",
        conflicts_with = "lm_codes"
    )]
    pub train: Option<PathBuf>,
    /// Codes to test the decoder on (OOD), a `.npz` written by the probe.
    #[arg(
        long,
        required_unless_present = "lm_codes",
        conflicts_with = "lm_codes"
    )]
    pub test: Option<PathBuf>,
    /// A language model's code file (`codes.npz` with its `codes.json`), instead of --train and
    /// --test: its split array says which prompts are seen (train) and held out (test).
    #[arg(long)]
    pub lm_codes: Option<PathBuf>,
    /// With --lm-codes: the factor to decode (default: the sidecar's label factor).
    #[arg(long, requires = "lm_codes")]
    pub factor: Option<String>,
    /// With --lm-codes: the codes of the same prompts from the model with its weights shuffled
    /// within each tensor (the control of the lens).
    #[arg(long, requires = "lm_codes")]
    pub shuffled_codes: Option<PathBuf>,
    /// With --lm-codes: keep only the factor combinations the model answers with at least this
    /// accuracy (from the file's `correct` array).
    #[arg(long, requires = "lm_codes")]
    pub min_accuracy: Option<f64>,
    /// With --lm-codes: the model layers to analyse, comma-separated (default: all in the file).
    #[arg(long, requires = "lm_codes", value_delimiter = ',')]
    pub layers: Option<Vec<usize>>,
    /// With --lm-codes: bootstrap resamples of the test prompts behind each 95% interval.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub bootstrap: u64,
    /// Output directory for the tables (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the shuffled-label control, k-means initialisation and silhouette subsample.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Set that PCA, clustering and similarity run on: `test` (OOD) or `train`.
    #[arg(long, default_value = "test", value_parser = parse_split)]
    pub unsupervised_on: CodeSplit,
    /// PCA components kept for the projections in pca.npz.
    #[arg(long, default_value_t = 2)]
    pub components: usize,
    /// Inverse L2 regularisation C of the logistic probe (scikit-learn's default 1.0).
    #[arg(long, default_value_t = 1.0)]
    pub c: f64,
    /// Maximum L-BFGS iterations of the logistic probe (scikit-learn's default 100).
    #[arg(long, default_value_t = 100)]
    pub max_iter: u64,
    /// Largest number of points the silhouette scores use (a seeded subsample above it).
    #[arg(long, default_value_t = 5_000)]
    pub silhouette_points: usize,
    /// k-means++ restarts per clustering; the run of lowest inertia is kept (scikit-learn's
    /// `n_init`, 10 by default there).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub kmeans_runs: u64,
    /// Skip the shuffled-label control (halves the decoding time).
    #[arg(long)]
    pub no_shuffled_control: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// The t-SNE embeddings use at most this many codes of the set they run on (the first ones;
    /// exact t-SNE seeded with --seed, perplexity 30 or the largest that fewer codes admit: the
    /// report's setting, the same embedding on every run).
    #[arg(long, default_value_t = 2_000)]
    pub tsne_points: usize,
    /// With --lm-codes: do not write explorer.html (the latent-space explorer, which re-reads the
    /// prompt file and the model's tokenizer named in codes.json).
    #[arg(long, requires = "lm_codes")]
    pub no_explorer: bool,
    /// SRAVEN codes: also write tsne.npz, a t-SNE embedding of the all-layer codes of the
    /// --unsupervised-on set with their rule labels (logic codes always get one).
    #[arg(long)]
    pub tsne: bool,
}

fn parse_split(s: &str) -> Result<CodeSplit, String> {
    s.parse()
        .map_err(|e: hyperlens_analysis::AnalysisError| e.to_string())
}

/// Runs `hyperlens analyze`.
///
/// # Errors
/// Unreadable or inconsistent code files (naming the file and array), invalid flags, a training
/// set with a single label, or failing writes (naming the path).
pub fn run(args: AnalyzeArgs) -> anyhow::Result<()> {
    if let Some(codes) = &args.lm_codes {
        return run_lm(&args, codes);
    }
    let (Some(train_path), Some(test_path)) = (&args.train, &args.test) else {
        anyhow::bail!("give --train and --test (or --lm-codes)");
    };
    if TermCodes::is_logic_file(train_path) || TermCodes::is_logic_file(test_path) {
        return run_terms(&args, train_path, test_path);
    }
    let train = CodeSet::read_npz(train_path)
        .with_context(|| format!("reading --train {}", train_path.display()))?;
    let test = CodeSet::read_npz(test_path)
        .with_context(|| format!("reading --test {}", test_path.display()))?;
    let params = LatentAnalysisParams {
        seed: args.seed,
        n_components: args.components,
        logistic: LogisticParams {
            c: args.c,
            max_iterations: args.max_iter,
            ..LogisticParams::default()
        },
        shuffled_control: !args.no_shuffled_control,
        silhouette_max_points: args.silhouette_points,
        kmeans_runs: args.kmeans_runs as usize,
        unsupervised_on: args.unsupervised_on,
        ..LatentAnalysisParams::default()
    };
    let (l, h, q, k) = train.code_dims();
    if !args.quiet {
        eprintln!(
            "analyze: train {} problems, test {} problems, codes [L {l}, H {h}, Q {q}, K {k}]",
            train.n_samples(),
            test.n_samples()
        );
    }
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    };
    let mut on_progress = |p: &Progress| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        match p.next {
            Some((stage, layer)) => bar.set_message(format!("{stage}, layer {layer}")),
            None => bar.set_message("done"),
        }
        std::ops::ControlFlow::Continue(())
    };
    let report = analyze_pair(&train, &test, &params, &mut on_progress)?;
    bar.finish_and_clear();
    let written = report
        .write_tables(&args.out)
        .with_context(|| format!("writing tables to --out {}", args.out.display()))?;
    // Stage seconds, kept out of the tables because they change from run to run.
    let timings = args.out.join("timings.json");
    let mut text = serde_json::to_vec_pretty(&report.timings())?;
    text.push(b'\n');
    hyperlens_io::write_atomic(&timings, &text)
        .with_context(|| format!("writing {}", timings.display()))?;
    if args.tsne {
        let set = match args.unsupervised_on {
            CodeSplit::Train => &train,
            _ => &test,
        };
        let e = CodeEmbedding::of_codes(set, args.tsne_points, args.seed)?;
        e.write_npz(&args.out.join("tsne.npz"))?;
        let (n, trust) = (e.n(), e.trustworthiness);
        outln!(
            "t-SNE of {n} codes (all layers): trustworthiness (k = 5) {trust:.3}; wrote tsne.npz"
        )?;
    }

    outln!("layer  accuracy  balanced  majority  shuffled  ari    nmi    silhouette")?;
    for a in &report.layers {
        let d = &a.decoding;
        let (ari, nmi, sil) = a.clusters.map_or((f64::NAN, f64::NAN, f64::NAN), |c| {
            (c.ari, c.nmi, c.silhouette)
        });
        outln!(
            "{:<6} {:>8.3}  {:>8.3}  {:>8.3}  {:>8}  {:>5.3}  {:>5.3}  {:>6.3}",
            a.layer.to_string(),
            d.accuracy,
            d.balanced_accuracy,
            d.majority_baseline,
            d.shuffled_control
                .map_or_else(|| "-".to_string(), |s| format!("{s:.3}")),
            ari,
            nmi,
            sil
        )?;
    }
    outln!(
        "wrote {} files to {} in {:.1} s",
        written.len(),
        args.out.display(),
        report.elapsed_s
    )?;
    Ok(())
}

/// `hyperlens analyze` on logic code files (they hold the task's `terms`):
/// [`hyperlens_report::logic::analyze_terms_to_dir`] (term decoding per layer and on all layers,
/// the projections and `summary.json`), then the decoding table printed.
///
/// # Errors
/// Unreadable or inconsistent code files (naming the file and array), no scorable term, failing
/// writes.
fn run_terms(
    args: &AnalyzeArgs,
    train_path: &std::path::Path,
    test_path: &std::path::Path,
) -> anyhow::Result<()> {
    let train = TermCodes::read_npz(train_path)
        .with_context(|| format!("reading --train {}", train_path.display()))?;
    let test = TermCodes::read_npz(test_path)
        .with_context(|| format!("reading --test {}", test_path.display()))?;
    let params = TermDecodingParams {
        seed: args.seed,
        logistic: LogisticParams {
            c: args.c,
            max_iterations: args.max_iter,
            ..LogisticParams::default()
        },
        ..TermDecodingParams::default()
    };
    let start = std::time::Instant::now();
    let analysis = hyperlens_report::logic::analyze_terms_to_dir(
        &train,
        train_path,
        &test,
        test_path,
        &params,
        args.tsne_points,
        &args.out,
    )?;
    let (rows, projections) = (
        &analysis.summary.term_decoding,
        &analysis.summary.projections,
    );
    outln!("layer  ridge_r2  f1_mean  f1_base_rate  f1_shuffled  terms")?;
    for r in rows {
        outln!(
            "{:<6} {:>8.3}  {:>7.3}  {:>12.3}  {:>11.3}  {:>5}",
            r.layer.map_or_else(|| "all".to_string(), |l| l.to_string()),
            r.ridge_r2,
            r.f1_mean,
            r.f1_base_rate,
            r.f1_shuffled,
            r.n_terms
        )?;
    }
    outln!(
        "t-SNE of {} codes: trustworthiness (k = 5) {:.3}; figures {}",
        projections.tsne_points,
        projections.tsne_trustworthiness_k5,
        analysis.figures.join(", ")
    )?;
    outln!(
        "wrote term_decoding.csv, projections.npz and summary.json to {} in {:.1} s",
        args.out.display(),
        start.elapsed().as_secs_f64()
    )?;
    Ok(())
}

/// `hyperlens analyze --lm-codes`: [`hyperlens_report::lm_explorer::analyze_lm_to_dir`] (the
/// analysis of a language model's code file, its tables and, unless `--no-explorer`,
/// `explorer.html` written into `--out`), then the decoding table printed.
///
/// # Errors
/// Unreadable or inconsistent code files (naming the file and array), an unknown factor or
/// layer, no kept train or test rows, a shuffled-weights file of other prompts, a prompt file
/// that changed since the probe or a model without a tokenizer (for the explorer), failing
/// writes.
fn run_lm(args: &AnalyzeArgs, codes: &std::path::Path) -> anyhow::Result<()> {
    let params = LmAnalysisParams {
        shuffled_codes: args.shuffled_codes.clone(),
        factor: args.factor.clone(),
        min_accuracy: args.min_accuracy,
        layers: args.layers.clone(),
        seed: args.seed,
        n_bootstrap: args.bootstrap as usize,
        logistic: LogisticParams {
            c: args.c,
            max_iterations: args.max_iter,
            ..LogisticParams::default()
        },
        n_components: args.components,
        kmeans_runs: args.kmeans_runs as usize,
        unsupervised_on: args.unsupervised_on,
        ..LmAnalysisParams::new(codes)
    };
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    let start = std::time::Instant::now();
    let files = hyperlens_report::lm_explorer::analyze_lm_to_dir(
        &params,
        &args.out,
        !args.no_explorer,
        &mut |p: &LmProgress| {
            bar.set_length(p.total as u64);
            bar.set_position(p.done as u64);
            bar.set_message(p.stage);
            std::ops::ControlFlow::Continue(())
        },
    )?;
    bar.finish_and_clear();
    let (a, written) = (&files.analysis, &files.written);
    let d = &a.decoding;
    outln!(
        "decoding `{}` seen -> held-out: {} train, {} test prompts; chance {:.3} (largest test \
         class {:.3}); {}",
        d.factor,
        d.n_train,
        d.n_test,
        d.chance,
        d.chance_max,
        a.behaviour.note
    )?;
    if d.n_unseen_test > 0 {
        outln!(
            "{} test prompts have a value never seen in training ({}): counted as errors",
            d.n_unseen_test,
            d.unseen_classes.join(", ")
        )?;
    }
    let ci = |s: Option<lm::ProbeScore>| {
        s.map_or_else(
            || "-".to_string(),
            |s| format!("{:.3} [{:.3}, {:.3}]", s.accuracy, s.ci_low, s.ci_high),
        )
    };
    outln!(
        "{:<6} {:<21} {:<21} {:<21} {:<21} {:<21}",
        "layer",
        "codes",
        "shuffled_labels",
        "distance",
        "shuffled_weights",
        "resid"
    )?;
    for r in &d.rows {
        outln!(
            "{:<6} {:<21} {:<21} {:<21} {:<21} {:<21}",
            r.layer.map_or_else(|| "all".to_string(), |l| l.to_string()),
            ci(Some(r.codes)),
            ci(Some(r.shuffled_labels)),
            ci(Some(d.distance)),
            ci(r.shuffled_weights),
            ci(r.resid)
        )?;
    }
    outln!(
        "wrote {} files to {} in {:.1} s",
        written.len(),
        args.out.display(),
        start.elapsed().as_secs_f64()
    )?;
    Ok(())
}
