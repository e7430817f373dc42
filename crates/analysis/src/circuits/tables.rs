//! The tables of a [`CircuitReport`]: `copying.csv`, `eigenvalues.npz`, `composition_{q,k,v}.npz`,
//! `composition_top.csv`, `heads.csv`, and the findings part of `summary.json`. Array names are
//! those of `hyperlens_io::keys::{eigenvalues, composition}`; every file is written atomically.

use std::path::Path;

use hyperlens_io::keys::{composition as comp_keys, eigenvalues as eig_keys};
use hyperlens_io::{write_atomic, write_npz};
use ndarray::{Array2, ArrayView1};
use serde_json::{json, Value};

use super::composition::CompositionKind;
use super::detect::{ErrorMeasure, HeadPattern};
use super::pipeline::{head_label, CircuitReport, HeadScores, InductionPair, NamedHead, TopPair};
use crate::error::{AnalysisError, Result};

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

fn copying_csv(ov: &Array2<f64>, full: &Array2<f64>) -> String {
    let mut s = String::from("layer,head,label,ov_copying,full_ov_copying\n");
    for ((l, h), x) in ov.indexed_iter() {
        s += &format!("{l},{h},{},{x:.6},{:.6}\n", head_label(l, h), full[[l, h]]);
    }
    s
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

fn heads_csv(hs: &HeadScores) -> Result<String> {
    let cols = head_columns(hs)?;
    let mut s = String::from("layer,head,label");
    for (name, _) in &cols {
        s += ",";
        s += name;
    }
    s += "\n";
    for ((l, h), _) in hs.rep_induction.indexed_iter() {
        s += &format!("{l},{h},{}", head_label(l, h));
        for (_, a) in &cols {
            s += &format!(",{:.6}", a[[l, h]]);
        }
        s += "\n";
    }
    Ok(s)
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
            head_label(p.writer.0, p.writer.1),
            head_label(p.reader.0, p.reader.1),
            p.writer.0,
            p.writer.1,
            p.reader.0,
            p.reader.1,
            p.score,
            p.percentile,
            p.p99,
            p.score > p.p99
        );
    }
    s
}

fn head_json(h: &NamedHead) -> Value {
    json!({"head": h.label(), "layer": h.layer, "index": h.head, "score": h.score})
}

fn pair_json(p: &InductionPair) -> Value {
    json!({
        "previous_token_head": p.previous_token.label(),
        "induction_head": p.induction.label(),
        "k_composition": p.k_composition,
        "baseline_percentile": p.baseline_percentile,
        "above_baseline_p99": p.above_baseline_p99,
    })
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
            copying_csv(&self.ov_copying, &self.full_ov_copying).as_bytes(),
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
            top_csv(&self.top_pairs).as_bytes(),
        )?;
        write_atomic(&dir.join("heads.csv"), heads_csv(&self.heads)?.as_bytes())?;
        Ok(())
    }

    /// The findings for `summary.json`: thresholds, named heads, induction circuits, the top
    /// heads, the composition baseline and what each file holds.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] from an empty baseline.
    pub fn summary(&self) -> Result<Value> {
        let cut = self.params.threshold;
        let mut p99 = serde_json::Map::new();
        for k in CompositionKind::ALL {
            p99.insert(k.to_string(), json!(self.baseline.percentile(k, 99.0)?));
        }
        let files: serde_json::Map<String, Value> = FILES
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        Ok(json!({
            "thresholds": {
                "induction": {"cut": cut, "score": "repeated_induction (heads.csv): mean attention of \
                    second-copy query n+i to key i+1, the stripe at offset -(n-1)"},
                "previous_token": {"cut": cut, "score": "repeated_previous_token (heads.csv): mean \
                    attention of query i to key i-1 over the whole sequence"},
                "composition": "a pair stands out when its score exceeds the 99th percentile of the \
                    random baseline of its kind",
            },
            "induction_heads": self.induction_heads.iter().map(head_json).collect::<Vec<_>>(),
            "previous_token_heads": self.previous_token_heads.iter().map(head_json).collect::<Vec<_>>(),
            "induction_circuits": self.induction_circuits.iter().map(pair_json).collect::<Vec<_>>(),
            "top_induction_head": self.top_induction_head.map(|h| json!({
                "head": h.label(), "score": h.score,
                "ov_copying": self.ov_copying[[h.layer, h.head]],
                "full_ov_copying": self.full_ov_copying[[h.layer, h.head]],
            })),
            "top_previous_token_head": self.top_previous_token_head.as_ref().map(head_json),
            "strongest_pair": self.strongest_pair.as_ref().map(pair_json),
            "composition": {
                "baseline_samples": self.params.baseline_samples,
                "baseline_seed": self.params.seed,
                "baseline_p99": p99,
                "estimated_working_memory_bytes": self.composition_memory_bytes,
            },
            "detection_options": {"exclude_bos": false, "exclude_current_token": false},
            "files": files,
        }))
    }
}

impl CircuitReport {
    /// The report's CSV tables as text, by file name, as [`CircuitReport::write_tables`] writes
    /// them: `copying.csv`, `composition_top.csv` and `heads.csv` (for callers that keep them in
    /// memory, such as the Python front).
    ///
    /// # Errors
    /// As [`CircuitReport::write_tables`] for the head scores.
    pub fn csv_tables(&self) -> Result<Vec<(&'static str, String)>> {
        Ok(vec![
            (
                "copying.csv",
                copying_csv(&self.ov_copying, &self.full_ov_copying),
            ),
            ("composition_top.csv", top_csv(&self.top_pairs)),
            ("heads.csv", heads_csv(&self.heads)?),
        ])
    }
}
