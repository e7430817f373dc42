//! The tables of a [`CircuitReport`]: `copying.csv`, `eigenvalues.npz`, `composition_{q,k,v}.npz`,
//! `composition_top.csv`, `heads.csv`, and the findings part of `summary.json`. Array names are
//! those of `hyperlens_io::keys::{eigenvalues, composition}`; every file is written atomically.

use std::path::Path;

use hyperlens_io::keys::{composition as comp_keys, eigenvalues as eig_keys};
use hyperlens_io::{write_atomic, write_npz};
use ndarray::{Array2, ArrayView1};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::composition::CompositionKind;
use super::detect::{ErrorMeasure, HeadPattern};
use super::pipeline::{head_label, CircuitReport, HeadScores, InductionPair, NamedHead, TopPair};
use crate::error::{AnalysisError, Result};
use crate::table::{Column, Table};

/// What each file holds, for `summary.json`.
pub const FILES: [(&str, &str); 6] = [
    (
        "copying.csv",
        "per head: OV-circuit and full-OV-circuit (W_E W_V W_O W_U) copying score Re(sum λ)/sum|λ|",
    ),
    (
        "eigenvalues.npz",
        "ov_re, ov_im, full_ov_re, full_ov_im [L, H, d_head] (descending modulus); ov_copying, full_ov_copying [L, H]",
    ),
    (
        "composition_{q,k,v}.npz",
        "scores [L1, H1, L2, H2] (zero where l1 >= l2), baseline [samples] sorted",
    ),
    (
        "composition_top.csv",
        "top pairs per kind with their baseline percentile",
    ),
    (
        "heads.csv",
        "per head: previous-token / duplicate-token / induction scores (mul, abs) and repeated-random-tokens stripe scores",
    ),
    (
        "figures/",
        "eigenvalues.png, eigenvalues_full_ov.png, composition_{q,k,v}.png, composition.svg (Q/K/V with hover values), head_scores.png, induction_attention.png",
    ),
];

/// `copying.csv`: per head, the OV and full-OV copying scores.
fn copying_table(ov: &Array2<f64>, full: &Array2<f64>) -> Result<Table> {
    let heads: Vec<(usize, usize)> = ov.indexed_iter().map(|(i, _)| i).collect();
    let mut t = head_index_table(&heads)?;
    t.push("ov_copying", Column::float(ov.iter().copied().collect(), 6))?;
    t.push(
        "full_ov_copying",
        Column::float(heads.iter().map(|&i| full[i]).collect(), 6),
    )?;
    Ok(t)
}

/// The columns `layer`, `head`, `label` of a per-head table.
fn head_index_table(heads: &[(usize, usize)]) -> Result<Table> {
    let mut t = Table::new();
    t.push(
        "layer",
        Column::Int(heads.iter().map(|h| h.0 as i64).collect()),
    )?;
    t.push(
        "head",
        Column::Int(heads.iter().map(|h| h.1 as i64).collect()),
    )?;
    t.push(
        "label",
        Column::Text(heads.iter().map(|&(l, h)| head_label(l, h)).collect()),
    )?;
    Ok(t)
}

/// The columns of `heads.csv`, in order.
fn head_columns(hs: &HeadScores) -> Result<Vec<(String, &Array2<f64>)>> {
    let mut cols = Vec::new();
    for (pattern, name) in [
        (HeadPattern::PreviousToken, "previous_token"),
        (HeadPattern::DuplicateToken, "duplicate_token"),
        (HeadPattern::Induction, "induction"),
    ] {
        for (measure, m) in [(ErrorMeasure::Mul, "mul"), (ErrorMeasure::Abs, "abs")] {
            let a = hs.detector(&pattern, measure).ok_or_else(|| {
                AnalysisError::InvalidInput(format!("{name} ({m}) head scores are missing"))
            })?;
            cols.push((format!("{name}_{m}"), a));
        }
    }
    cols.push(("repeated_induction".into(), &hs.rep_induction));
    cols.push(("repeated_previous_token".into(), &hs.rep_previous));
    cols.push(("repeated_duplicate_token".into(), &hs.rep_duplicate));
    Ok(cols)
}

/// `heads.csv`: per head, every detector's score.
fn heads_table(hs: &HeadScores) -> Result<Table> {
    let heads: Vec<(usize, usize)> = hs.rep_induction.indexed_iter().map(|(i, _)| i).collect();
    let mut t = head_index_table(&heads)?;
    for (name, a) in head_columns(hs)? {
        t.push(
            name,
            Column::float(heads.iter().map(|&i| a[i]).collect(), 6),
        )?;
    }
    Ok(t)
}

/// `composition_top.csv`: the top pairs per kind with their baseline percentile.
fn top_table(pairs: &[TopPair]) -> Result<Table> {
    let ints =
        |f: &dyn Fn(&TopPair) -> usize| Column::Int(pairs.iter().map(|p| f(p) as i64).collect());
    let floats = |f: &dyn Fn(&TopPair) -> f64, d| Column::float(pairs.iter().map(f).collect(), d);
    let mut t = Table::new();
    t.push(
        "kind",
        Column::Text(pairs.iter().map(|p| p.kind.to_string()).collect()),
    )?;
    t.push("rank", ints(&|p| p.rank))?;
    let label = |f: &dyn Fn(&TopPair) -> (usize, usize)| {
        Column::Text(
            pairs
                .iter()
                .map(|p| {
                    let (l, h) = f(p);
                    head_label(l, h)
                })
                .collect(),
        )
    };
    t.push("writer", label(&|p| p.writer))?;
    t.push("reader", label(&|p| p.reader))?;
    t.push("writer_layer", ints(&|p| p.writer.0))?;
    t.push("writer_head", ints(&|p| p.writer.1))?;
    t.push("reader_layer", ints(&|p| p.reader.0))?;
    t.push("reader_head", ints(&|p| p.reader.1))?;
    t.push("score", floats(&|p| p.score, 6))?;
    t.push("baseline_percentile", floats(&|p| p.percentile, 2))?;
    t.push("baseline_p99", floats(&|p| p.p99, 6))?;
    t.push(
        "above_p99",
        Column::Bool(pairs.iter().map(|p| p.score > p.p99).collect()),
    )?;
    Ok(t)
}

/// A named head in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadFinding {
    /// `L{l}H{h}`.
    pub head: String,
    /// Head index within the layer.
    pub index: usize,
    /// Layer index.
    pub layer: usize,
    /// The score that named it.
    pub score: f64,
}

impl From<&NamedHead> for HeadFinding {
    fn from(h: &NamedHead) -> Self {
        Self {
            head: h.label(),
            index: h.head,
            layer: h.layer,
            score: h.score,
        }
    }
}

/// A (previous-token head, induction head) pair in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairFinding {
    /// Whether the K-composition exceeds the baseline's 99th percentile.
    pub above_baseline_p99: bool,
    /// Percentile (0-100) of the K-composition in the random baseline.
    pub baseline_percentile: f64,
    /// The reader, `L{l}H{h}`.
    pub induction_head: String,
    /// K-composition score of the pair.
    pub k_composition: f64,
    /// The writer, `L{l}H{h}`.
    pub previous_token_head: String,
}

impl From<&InductionPair> for PairFinding {
    fn from(p: &InductionPair) -> Self {
        Self {
            above_baseline_p99: p.above_baseline_p99,
            baseline_percentile: p.baseline_percentile,
            induction_head: p.induction.label(),
            k_composition: p.k_composition,
            previous_token_head: p.previous_token.label(),
        }
    }
}

/// The top induction head in `summary.json`, with its copying scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopInductionFinding {
    /// Its full-OV copying score.
    pub full_ov_copying: f64,
    /// `L{l}H{h}`.
    pub head: String,
    /// Its OV copying score.
    pub ov_copying: f64,
    /// Its repeated-tokens induction score.
    pub score: f64,
}

/// A cut-off and the score it applies to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cut {
    /// The cut-off.
    pub cut: f64,
    /// What the score is.
    pub score: String,
}

/// The cut-offs of `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    /// When a composition pair stands out.
    pub composition: String,
    /// The induction-head cut-off.
    pub induction: Cut,
    /// The previous-token-head cut-off.
    pub previous_token: Cut,
}

/// The composition baseline in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompositionFinding {
    /// 99th percentile of the baseline per kind (`q`, `k`, `v`).
    pub baseline_p99: BTreeMap<String, f64>,
    /// Random matrix pairs per kind.
    pub baseline_samples: usize,
    /// Seed of the baseline.
    pub baseline_seed: u64,
    /// Estimated working memory of the composition scores, bytes.
    pub estimated_working_memory_bytes: usize,
}

/// The options of the head detectors in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetectionOptions {
    /// Whether attention to the first token is left out.
    pub exclude_bos: bool,
    /// Whether attention to the query's own token is left out.
    pub exclude_current_token: bool,
}

/// The findings of a [`CircuitReport`], the part of `summary.json` that the analysis decides
/// (fields in the file's order, which is alphabetical).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CircuitFindings {
    /// The composition baseline.
    pub composition: CompositionFinding,
    /// The head detectors' options.
    pub detection_options: DetectionOptions,
    /// What each file holds.
    pub files: BTreeMap<String, String>,
    /// Every (previous-token head, later induction head) pair among the named heads.
    pub induction_circuits: Vec<PairFinding>,
    /// Heads named induction heads, strongest first.
    pub induction_heads: Vec<HeadFinding>,
    /// Heads named previous-token heads, strongest first.
    pub previous_token_heads: Vec<HeadFinding>,
    /// The strongest previous-token head below the top induction head, paired with it.
    pub strongest_pair: Option<PairFinding>,
    /// The cut-offs.
    pub thresholds: Thresholds,
    /// The strongest induction head.
    pub top_induction_head: Option<TopInductionFinding>,
    /// The strongest previous-token head.
    pub top_previous_token_head: Option<HeadFinding>,
}

impl CircuitReport {
    /// Writes the tables into `dir` (which must exist).
    ///
    /// # Errors
    /// [`AnalysisError::File`] naming the file; [`AnalysisError::InvalidInput`] for a report
    /// without K-, Q- or V-composition scores.
    pub fn write_tables(&self, dir: &Path) -> Result<()> {
        write_atomic(
            &dir.join("copying.csv"),
            copying_table(&self.ov_copying, &self.full_ov_copying)?
                .to_csv()
                .as_bytes(),
        )?;
        write_npz(&dir.join("eigenvalues.npz"), |npz| -> Result<()> {
            npz.add(eig_keys::OV_RE, &self.ov.re)?;
            npz.add(eig_keys::OV_IM, &self.ov.im)?;
            npz.add(eig_keys::FULL_OV_RE, &self.full_ov.re)?;
            npz.add(eig_keys::FULL_OV_IM, &self.full_ov.im)?;
            npz.add(eig_keys::OV_COPYING, &self.ov_copying)?;
            npz.add(eig_keys::FULL_OV_COPYING, &self.full_ov_copying)?;
            Ok(())
        })?;
        for k in CompositionKind::ALL {
            let scores = self.composition.get(k).ok_or_else(|| {
                AnalysisError::InvalidInput(format!("{k}-composition scores were not computed"))
            })?;
            write_npz(
                &dir.join(format!("composition_{k}.npz")),
                |npz| -> Result<()> {
                    npz.add(comp_keys::SCORES, scores)?;
                    npz.add(
                        comp_keys::BASELINE,
                        &ArrayView1::from(self.baseline.samples(k)),
                    )?;
                    Ok(())
                },
            )?;
        }
        write_atomic(
            &dir.join("composition_top.csv"),
            top_table(&self.top_pairs)?.to_csv().as_bytes(),
        )?;
        write_atomic(
            &dir.join("heads.csv"),
            heads_table(&self.heads)?.to_csv().as_bytes(),
        )?;
        Ok(())
    }

    /// The findings for `summary.json`: thresholds, named heads, induction circuits, the top
    /// heads, the composition baseline and what each file holds.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] from an empty baseline.
    pub fn summary(&self) -> Result<CircuitFindings> {
        let cut = self.params.threshold;
        let mut baseline_p99 = BTreeMap::new();
        for k in CompositionKind::ALL {
            baseline_p99.insert(k.to_string(), self.baseline.percentile(k, 99.0)?);
        }
        let files = FILES
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok(CircuitFindings {
            thresholds: Thresholds {
                induction: Cut {
                    cut,
                    score: "repeated_induction (heads.csv): mean attention of \
                    second-copy query n+i to key i+1, the stripe at offset -(n-1)"
                        .into(),
                },
                previous_token: Cut {
                    cut,
                    score: "repeated_previous_token (heads.csv): mean \
                    attention of query i to key i-1 over the whole sequence"
                        .into(),
                },
                composition: "a pair stands out when its score exceeds the 99th percentile of the \
                    random baseline of its kind"
                    .into(),
            },
            induction_heads: self.induction_heads.iter().map(HeadFinding::from).collect(),
            previous_token_heads: self
                .previous_token_heads
                .iter()
                .map(HeadFinding::from)
                .collect(),
            induction_circuits: self
                .induction_circuits
                .iter()
                .map(PairFinding::from)
                .collect(),
            top_induction_head: self.top_induction_head.map(|h| TopInductionFinding {
                head: h.label(),
                score: h.score,
                ov_copying: self.ov_copying[[h.layer, h.head]],
                full_ov_copying: self.full_ov_copying[[h.layer, h.head]],
            }),
            top_previous_token_head: self.top_previous_token_head.as_ref().map(HeadFinding::from),
            strongest_pair: self.strongest_pair.as_ref().map(PairFinding::from),
            composition: CompositionFinding {
                baseline_samples: self.params.baseline_samples,
                baseline_seed: self.params.seed,
                baseline_p99,
                estimated_working_memory_bytes: self.composition_memory_bytes,
            },
            detection_options: DetectionOptions {
                exclude_bos: false,
                exclude_current_token: false,
            },
            files,
        })
    }
}

impl CircuitReport {
    /// The report's tables by file name, as [`CircuitReport::write_tables`] writes them:
    /// `copying.csv`, `composition_top.csv` and `heads.csv` (for callers that keep them in
    /// memory, such as the Python front).
    ///
    /// # Errors
    /// As [`CircuitReport::write_tables`] for the head scores.
    pub fn tables(&self) -> Result<Vec<(&'static str, Table)>> {
        Ok(vec![
            (
                "copying.csv",
                copying_table(&self.ov_copying, &self.full_ov_copying)?,
            ),
            ("composition_top.csv", top_table(&self.top_pairs)?),
            ("heads.csv", heads_table(&self.heads)?),
        ])
    }
}
