//! The study's files beside the page: `summary.json` ([`StudySummary`]), `timings.json`
//! ([`Timings`]), the analyses' tables under `tables/<name>/` (each analysis's `decoding.csv`,
//! `behaviour.csv`, `structure.csv` and `summary.json`, as `hyperlens analyze --lm-codes` writes
//! them), `tables/icl_layers.csv` (Experiment 2 per layer over the splits) and
//! `tables/transplant/` (`transplant.csv`, `transplant_by_donor.csv`, `transplant.json`).

use std::path::Path;

use hyperlens_analysis::lm::LmAnalysis;
use hyperlens_analysis::table::{Column, Table};
use hyperlens_probe::lm_transplant::{write_lm_transplant, LmTransplant, LmTransplantKind};
use serde::{Deserialize, Serialize};

use super::figures::StudyFigures;
use super::measure::Measured;
use super::verdict::{self, Finding, LayerOverSplits, Verdicts};
use super::LmStudyParams;
use crate::doc::Document;
use crate::error::Result;

/// File name of the timings, beside `index.html` (the only file that differs between runs).
pub const TIMINGS_FILE: &str = "timings.json";

/// Seconds of one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageTime {
    /// The stage.
    pub stage: String,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// `timings.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Wall-clock seconds of the whole run.
    pub elapsed_s: f64,
    /// Peak resident memory of the process, bytes (Linux `VmHWM`; `null` elsewhere).
    pub peak_rss_bytes: Option<u64>,
    /// Seconds per stage.
    pub stages: Vec<StageTime>,
}

/// The transplant as the study reports it: the layer, the prompts, and
/// [`hyperlens_probe::lm_transplant::lm_transplant`]'s result (rows per kind, and per kind and
/// donor operation), written as `tables/transplant/` by `write_lm_transplant`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TransplantResult {
    /// The layer whose code is replaced.
    pub layer: usize,
    /// Target prompts (held-out combinations of the first split, solved by the model).
    pub n_targets: usize,
    /// Donor prompts (seen combinations of the first split, solved by the model).
    pub n_donors: usize,
    /// The result.
    pub transplant: LmTransplant,
}

impl TransplantResult {
    /// The fraction of the counted pairs of `kind` whose answer became the donor's (0 without
    /// pairs).
    pub fn rate(&self, kind: LmTransplantKind) -> f64 {
        self.transplant
            .rows
            .iter()
            .find(|t| t.kind == kind)
            .filter(|t| t.n > 0)
            .map_or(0.0, |t| t.to_donor as f64 / t.n as f64)
    }

    /// The identity transplant's largest change of a logit (must be 0).
    pub fn identity_max_logit_change(&self) -> Option<f64> {
        self.transplant
            .rows
            .iter()
            .find(|r| r.kind == LmTransplantKind::Identity)
            .map(|r| r.max_logit_change)
    }
}

/// One split of Experiment 2 in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SplitSummary {
    /// The hold-out seed.
    pub seed: u64,
    /// The held-out `operation/domain` combinations.
    pub held_out: Vec<String>,
    /// The tables' directory of the seen -> held-out analysis (`None` when it could not run).
    pub tables: Option<String>,
    /// Why the split could not be decoded.
    pub not_decoded: Option<String>,
    /// Why the seen-halves analysis could not run.
    pub seen_not_decoded: Option<String>,
}

/// A figure in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FigureSummary {
    /// The PNG, relative to the page.
    pub file: String,
    /// Its caption.
    pub caption: String,
    /// The sentences under it.
    pub text: String,
}

/// `summary.json` of the study: its settings, thresholds, verdicts and figures. No timings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StudySummary {
    /// hyperlens's version.
    pub version: String,
    /// The model's file or directory name and kind.
    pub model: String,
    /// Its kind.
    pub model_kind: String,
    /// Layers and heads.
    pub n_layers: usize,
    /// Query heads per layer.
    pub n_heads: usize,
    /// Settings.
    pub n_relations: usize,
    /// Settings.
    pub n_icl: usize,
    /// Settings.
    pub shots: usize,
    /// Settings.
    pub seed: u64,
    /// Settings.
    pub n_bootstrap: usize,
    /// The thresholds of [`verdict`], by name.
    pub thresholds: Vec<(String, f64)>,
    /// Experiment 1: passed, all-layers accuracy, best layer and its accuracy.
    pub relations_passed: bool,
    /// Experiment 1.
    pub relations_all_layers: f64,
    /// Experiment 1.
    pub relations_best_layer: usize,
    /// Experiment 1.
    pub relations_best_accuracy: f64,
    /// Experiment 1's sentence.
    pub relations_sentence: String,
    /// Experiment 2's finding (`None` when it did not run).
    pub icl_finding: Option<Finding>,
    /// The model's accuracy on the icl prompts.
    pub icl_model_accuracy: Option<f64>,
    /// Combinations kept / in all.
    pub icl_kept_combinations: Option<(usize, usize)>,
    /// Per layer over the splits.
    pub icl_layers: Vec<LayerOverSplits>,
    /// The splits.
    pub icl_splits: Vec<SplitSummary>,
    /// Experiment 2's sentence.
    pub icl_sentence: Option<String>,
    /// The secondary analysis without the behaviour filter, per layer over the splits.
    pub icl_unfiltered_layers: Vec<LayerOverSplits>,
    /// Its sentence.
    pub icl_unfiltered_sentence: Option<String>,
    /// The transplant.
    pub transplant: Option<TransplantResult>,
    /// Whether it moved the answer.
    pub transplant_moved: Option<bool>,
    /// The verdict sentence.
    pub verdict: String,
    /// The figures.
    pub figures: Vec<FigureSummary>,
}

/// The directory (under `tables/`) of an analysis.
pub fn tables_dir(name: &str) -> String {
    format!("tables/{name}")
}

/// `tables/icl_layers.csv`: per layer (then `all`), the seen accuracy, the held-out accuracy
/// with its interval and each control, per split.
///
/// # Errors
/// A column of another length (never, by construction).
fn icl_layers_table(m: &Measured) -> Result<Option<Table>> {
    let Some(icl) = &m.icl else { return Ok(None) };
    let mut t = Table::new();
    let mut layer = Vec::new();
    let mut split = Vec::new();
    let mut cols: Vec<Vec<Option<f64>>> = vec![Vec::new(); 9];
    for (j, s) in icl.splits.iter().enumerate() {
        let Ok(a) = &s.ood else { continue };
        let seen = s.seen.as_ref().ok();
        for r in &a.decoding.rows {
            layer.push(r.layer.map_or_else(|| "all".to_string(), |l| l.to_string()));
            split.push((j + 1) as i64);
            let seen_acc = seen
                .and_then(|sa| sa.decoding.rows.iter().find(|x| x.layer == r.layer))
                .map_or(f64::NAN, |x| x.codes.accuracy);
            let vals = [
                seen_acc,
                r.codes.accuracy,
                r.codes.ci_low,
                r.codes.ci_high,
                r.shuffled_labels.accuracy,
                a.decoding.distance.accuracy,
                r.shuffled_weights.map_or(f64::NAN, |x| x.accuracy),
                r.resid.map_or(f64::NAN, |x| x.accuracy),
                a.decoding.chance_max,
            ];
            for (c, v) in cols.iter_mut().zip(vals) {
                c.push(v.is_finite().then(|| (v * 1e4).round() / 1e4));
            }
        }
    }
    t.push("split", Column::Int(split))?;
    t.push("layer", Column::Text(layer))?;
    let names = [
        "seen_accuracy",
        "held_out_accuracy",
        "ci_low",
        "ci_high",
        "shuffled_labels",
        "distance",
        "shuffled_weights",
        "resid",
        "chance_max",
    ];
    for (name, c) in names.iter().zip(cols) {
        t.push(*name, Column::MaybeFloat(c))?;
    }
    Ok(Some(t))
}

/// Writes an analysis's tables into `dir/tables/<name>/`.
fn write_analysis(dir: &Path, name: &str, a: &LmAnalysis) -> Result<()> {
    a.write(&dir.join(tables_dir(name)))?;
    Ok(())
}

/// The name of split `j`'s analyses under `tables/`.
pub fn split_name(j: usize, seen: bool) -> String {
    format!("icl_split{}{}", j + 1, if seen { "_seen" } else { "" })
}

/// `summary.json` of the study.
pub fn summary(
    m: &Measured,
    v: &Verdicts,
    figs: &StudyFigures,
    params: &LmStudyParams,
) -> StudySummary {
    let icl = m.icl.as_ref();
    let fv = v.icl.as_ref();
    StudySummary {
        version: env!("CARGO_PKG_VERSION").into(),
        model: m.model.name.clone(),
        model_kind: m.model.kind.clone(),
        n_layers: m.model.n_layers,
        n_heads: m.model.n_heads,
        n_relations: params.n_relations,
        n_icl: params.n_icl,
        shots: params.shots,
        seed: params.seed,
        n_bootstrap: params.n_bootstrap,
        thresholds: vec![
            (
                "relations_all_layers_min".into(),
                verdict::RELATIONS_ALL_LAYERS_MIN,
            ),
            ("relations_layer_min".into(), verdict::RELATIONS_LAYER_MIN),
            (
                "min_combination_accuracy".into(),
                verdict::MIN_COMBINATION_ACCURACY,
            ),
            ("transfer_margin".into(), verdict::TRANSFER_MARGIN),
            ("transplant_min_rate".into(), verdict::TRANSPLANT_MIN_RATE),
            (
                "transplant_control_factor".into(),
                verdict::TRANSPLANT_CONTROL_FACTOR,
            ),
        ],
        relations_passed: v.relations.passed,
        relations_all_layers: v.relations.all_layers,
        relations_best_layer: v.relations.best_layer.0,
        relations_best_accuracy: v.relations.best_layer.1,
        relations_sentence: v.relations.sentence.clone(),
        icl_finding: fv.map(|f| f.finding),
        icl_model_accuracy: icl.map(|i| i.accuracy),
        icl_kept_combinations: icl.map(|i| {
            (
                i.behaviour.combinations.iter().filter(|c| c.kept).count(),
                i.behaviour.combinations.len(),
            )
        }),
        icl_layers: fv.map(|f| f.layers.clone()).unwrap_or_default(),
        icl_splits: icl
            .map(|i| {
                i.splits
                    .iter()
                    .enumerate()
                    .map(|(j, s)| SplitSummary {
                        seed: s.seed,
                        held_out: s.held_out.iter().map(|(o, d)| format!("{o}/{d}")).collect(),
                        tables: s
                            .ood
                            .as_ref()
                            .ok()
                            .map(|_| tables_dir(&split_name(j, false))),
                        not_decoded: s.ood.as_ref().err().cloned(),
                        seen_not_decoded: s.seen.as_ref().err().cloned(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        icl_sentence: fv.map(|f| f.sentence.clone()),
        icl_unfiltered_layers: fv.map(|f| f.unfiltered.clone()).unwrap_or_default(),
        icl_unfiltered_sentence: fv.map(|f| f.unfiltered_sentence.clone()),
        transplant: m.transplant.clone(),
        transplant_moved: v.transplant.as_ref().map(|(moved, _)| *moved),
        verdict: v.sentence.clone(),
        figures: figs
            .all()
            .map(|f| FigureSummary {
                file: f.src.clone(),
                caption: f.caption.clone(),
                text: f.text.clone(),
            })
            .collect(),
    }
}

/// Writes the tables, `summary.json`, `index.md` and `index.html` into `dir`.
///
/// # Errors
/// A failed write.
pub fn write(
    m: &Measured,
    v: &Verdicts,
    figs: &StudyFigures,
    doc: &Document,
    params: &LmStudyParams,
    dir: &Path,
) -> Result<()> {
    write_analysis(dir, "relations", &m.relations.analysis)?;
    if let Some(icl) = &m.icl {
        for (j, s) in icl.splits.iter().enumerate() {
            if let Ok(a) = &s.ood {
                write_analysis(dir, &split_name(j, false), a)?;
            }
            if let Ok(a) = &s.seen {
                write_analysis(dir, &split_name(j, true), a)?;
            }
            if let Ok(a) = &s.unfiltered {
                write_analysis(dir, &format!("{}_all", split_name(j, false)), a)?;
            }
        }
    }
    if let Some(t) = icl_layers_table(m)? {
        crate::files::write_text(&dir.join("tables/icl_layers.csv"), &t.to_csv())?;
    }
    if let Some(t) = &m.transplant {
        write_lm_transplant(&dir.join("tables/transplant"), &t.transplant)?;
    }
    hyperlens_io::write_json(&dir.join("summary.json"), &summary(m, v, figs, params))?;
    crate::files::write_text(&dir.join("index.md"), &doc.to_markdown())?;
    crate::files::write_text(
        &dir.join("index.html"),
        &crate::html::to_html(doc, &format!("hyperlens study: {}", m.model.name)),
    )?;
    Ok(())
}
