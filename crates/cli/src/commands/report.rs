//! `hyperlens report`: the main job. For every checkpoint it measures ID / OOD accuracy, extracts the
//! latent codes of the paper's site (spec/latent-codes.md) on unpermuted ID and OOD problems, runs the
//! latent-code analyses (PCA, rule decoding ID -> OOD, k-means, similarity) and writes tables, codes,
//! figures and a Markdown + HTML page comparing the checkpoints side by side.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use hyperlens_analysis::codes::report::LayerSel;
use hyperlens_analysis::{analyze_pair, CodeSet, LatentAnalysisParams, LatentReport};
use hyperlens_model::eval::evaluate;
use hyperlens_model::{Device, EvalMetrics, Transformer};
use hyperlens_probe::{extract, ProbeMeta, ProbeParams, Site};
use hyperlens_tasks::sraven::{sample, Rule, SampleStream, Set, Split, SravenParams};
use hyperlens_viz::{
    save_png, save_svg, BarSeries, GroupedBars, Heatmap, LayerAccuracy, PcaScatter, Reference,
    ScatterPanel, Series,
};

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

/// What the report found for one checkpoint.
struct Entry {
    name: String,
    dir: PathBuf,
    mixer: String,
    split: String,
    id: EvalMetrics,
    ood: EvalMetrics,
    latent: LatentReport,
}

fn checkpoints(args: &ReportArgs) -> anyhow::Result<Vec<PathBuf>> {
    if !args.checkpoint.is_empty() {
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

/// The split a checkpoint was trained on: `split` in its `train.json`, else the default.
fn split_of(dir: &Path, default: &str) -> String {
    std::fs::read(dir.join("train.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("split").and_then(|s| s.as_str()).map(str::to_string))
        .unwrap_or_else(|| default.to_string())
}

fn name_of(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn pct(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    hyperlens_model::checkpoint::write_atomic(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
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
    })
}

fn rule_names() -> Vec<String> {
    Rule::ALL.iter().map(|r| r.name().to_string()).collect()
}

/// Figures of one checkpoint; returns (caption, relative path) pairs.
fn figures(e: &Entry, out: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let fig_dir = out.join("figures");
    let mut made = Vec::new();
    let layers: Vec<_> = e
        .latent
        .layers
        .iter()
        .filter(|a| a.layer != LayerSel::All)
        .collect();
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
    made.push((
        "PCA of the codes per layer, coloured by the rule of slot 3".to_string(),
        rel,
    ));
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
        made.push((
            "PCA of the codes per layer, coloured by the answer value".to_string(),
            rel,
        ));
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
    made.push((
        "Linear decoding of the rule from the codes, trained on ID, tested on OOD".to_string(),
        rel,
    ));
    // Rule similarity of the final layer.
    if let Some(last) = layers.last() {
        let sim = &last.similarity;
        let names: Vec<String> = sim
            .labels
            .iter()
            .map(|&l| {
                Rule::from_index(l as usize)
                    .map_or_else(|_| l.to_string(), |r| r.name().to_string())
            })
            .collect();
        let cos = sim.cosine.mapv(|v| if v.is_finite() { v } else { 0.0 });
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
        made.push((
            "Cosine similarity of the per-rule mean codes (final layer)".to_string(),
            rel,
        ));
    }
    Ok(made)
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

fn markdown(entries: &[Entry], figs: &[Vec<(String, String)>], args: &ReportArgs) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# hyperlens report\n");
    let _ = writeln!(
        md,
        "Checkpoints compared on SRAVEN: accuracy (all 4 answer features right) on {} permuted problems per set; latent codes of the paper's site (query 35, keys 27 and 31, label = rule of slot 3) on {} unpermuted ID and OOD problems (seed {}).\n",
        args.n, args.n, args.seed
    );
    let _ = writeln!(md, "![OOD accuracy](figures/accuracy.png)\n");
    let _ = writeln!(md, "| checkpoint | mixer | split | ID acc | OOD acc | OOD per-feature | best decoding layer (OOD acc) | decoding, all layers | majority baseline |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
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
            "| {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} |",
            e.name,
            e.mixer,
            e.split,
            pct(e.id.accuracy),
            pct(e.ood.accuracy),
            pct(per),
            layer,
            pct(acc),
            pct(all),
            pct(maj)
        );
    }
    for (e, f) in entries.iter().zip(figs) {
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
        for (caption, rel) in f {
            let _ = writeln!(md, "\n{caption}:\n\n![{caption}]({rel})");
        }
        let _ = writeln!(
            md,
            "\nTables: `tables/{0}/`; codes: `codes/{0}_id.npz`, `codes/{0}_ood.npz`.",
            e.name
        );
    }
    md
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A self-contained rendering of the Markdown subset the report uses (headings, paragraphs, tables,
/// images beside the page).
fn html(md: &str) -> String {
    let mut body = String::new();
    let mut in_table = false;
    for line in md.lines() {
        let t = line.trim();
        if t.starts_with('|') {
            let cells: Vec<&str> = t.trim_matches('|').split('|').map(str::trim).collect();
            if cells.iter().all(|c| c.chars().all(|ch| ch == '-')) {
                continue;
            }
            let tag = if in_table { "td" } else { "th" };
            if !in_table {
                body.push_str("<table>\n");
                in_table = true;
            }
            body.push_str("<tr>");
            for c in cells {
                let _ = write!(body, "<{tag}>{}</{tag}>", html_escape(c));
            }
            body.push_str("</tr>\n");
            continue;
        }
        if in_table {
            body.push_str("</table>\n");
            in_table = false;
        }
        if let Some(h) = t.strip_prefix("## ") {
            let _ = writeln!(body, "<h2>{}</h2>", html_escape(h));
        } else if let Some(h) = t.strip_prefix("# ") {
            let _ = writeln!(body, "<h1>{}</h1>", html_escape(h));
        } else if let Some(rest) = t.strip_prefix("![") {
            if let Some((alt, src)) = rest.split_once("](") {
                let _ = writeln!(
                    body,
                    "<figure><img src=\"{}\" alt=\"{}\"></figure>",
                    html_escape(src.trim_end_matches(')')),
                    html_escape(alt)
                );
            }
        } else if !t.is_empty() {
            let _ = writeln!(body, "<p>{}</p>", html_escape(t).replace('`', ""));
        }
    }
    if in_table {
        body.push_str("</table>\n");
    }
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>hyperlens report</title><style>body{{font-family:sans-serif;max-width:1800px;margin:2em auto;padding:0 1em}}table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f3f3f3}}img{{max-width:100%}}</style></head><body>\n{body}</body></html>\n"
    )
}

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
    for e in &entries {
        figs.push(figures(e, &args.out)?);
    }
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
    let md = markdown(&entries, &figs, &args);
    write_file(&args.out.join("index.md"), &md)?;
    write_file(&args.out.join("index.html"), &html(&md))?;
    let mut acc_csv =
        String::from("checkpoint,mixer,split,id_accuracy,ood_accuracy,id_loss,ood_loss,n\n");
    for e in &entries {
        let _ = writeln!(
            acc_csv,
            "{},{},{},{:.6},{:.6},{:.6},{:.6},{}",
            e.name, e.mixer, e.split, e.id.accuracy, e.ood.accuracy, e.id.loss, e.ood.loss, e.id.n
        );
    }
    write_file(&args.out.join("tables/accuracy.csv"), &acc_csv)?;
    let summary = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "n": args.n,
        "seed": args.seed,
        "device": args.device.to_string(),
        "elapsed_s": start.elapsed().as_secs_f64(),
        "checkpoints": entries.iter().map(|e| serde_json::json!({
            "name": e.name,
            "dir": e.dir.display().to_string(),
            "mixer": e.mixer,
            "split": e.split,
            "id": {"accuracy": e.id.accuracy, "per_feature_accuracy": e.id.per_feature_accuracy, "loss": e.id.loss},
            "ood": {"accuracy": e.ood.accuracy, "per_feature_accuracy": e.ood.per_feature_accuracy, "loss": e.ood.loss},
            "latent": e.latent.summary(),
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
