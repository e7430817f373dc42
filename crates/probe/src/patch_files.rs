//! The data files of `hyperlens patch` (`docs/outputs.md`): each intervention's table (CSV), its
//! JSON summary and, for activation patching, its arrays (`activation_patching.npz`, named by
//! [`hyperlens_io::keys::activation_patching`]), each written atomically into an existing
//! directory; and the numbers of their figures that are not a report's field (the transplant's
//! fractions per layer, [`TransplantFractions`]). `hyperlens-viz` draws the figures
//! (`hyperlens_viz::interventions`).

use std::path::Path;

use hyperlens_io::keys::activation_patching as keys;
use hyperlens_io::sidecars::{
    ActivationPatchingSidecar, DlaSidecar, HeadAblationSidecar, ProblemsSource, TransplantSidecar,
};
use hyperlens_model::Mixer;
use ndarray::{Array1, Array2};

use crate::ablation::{ablation_table, AblationReport};
use crate::error::{ProbeError, Result};
use crate::patching::{dla_table, patching_table, DlaReport, PatchPairs, PatchingReport};
use crate::transplant::{TransplantKind, TransplantRow};
use hyperlens_analysis::table::{Column, Table};

/// What every `patch` JSON file says about the run that wrote it.
#[derive(Debug, Clone, Copy)]
pub struct PatchRun<'a> {
    /// `producer`: the program, its version and the subcommand (`hyperlens 0.1.0 patch acts`).
    pub producer: &'a str,
    /// `checkpoint`: the checkpoint directory, as given.
    pub checkpoint: &'a Path,
    /// `mixer`: the model's sequence mixer.
    pub mixer: Mixer,
}

/// The problems of a transplant run, as `transplant.json` records them.
#[derive(Debug, Clone, Copy)]
pub struct TransplantProblems<'a> {
    /// The split's name.
    pub split: &'a str,
    /// Unpermuted problems per set (ID donors, OOD receivers).
    pub n: usize,
    /// The seed of the problems and of the random codes.
    pub seed: u64,
    /// The answer slot whose site is transplanted.
    pub slot: usize,
}

/// Writes the sidecar `value` as JSON with every object's keys in alphabetical order, nested
/// ones included (the layout these files have always had; the structs of
/// `hyperlens_io::sidecars` define their fields and read them back).
///
/// # Errors
/// [`ProbeError::File`] naming a file that could not be written or a value that is not JSON.
fn write_sorted<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let sorted = serde_json::to_value(value).map_err(|source| {
        ProbeError::File(hyperlens_io::IoError::Json {
            path: path.to_path_buf(),
            source,
        })
    })?;
    hyperlens_io::write_json(path, &sorted)?;
    Ok(())
}

/// Writes `head_ablation.csv` ([`ablation_table`]) and `head_ablation.json` (the run, the hook,
/// `source` and the whole report) into the directory `out`.
///
/// # Errors
/// [`ProbeError::File`] naming a file that could not be written.
pub fn write_head_ablation(
    out: &Path,
    run: &PatchRun<'_>,
    source: &ProblemsSource,
    report: &AblationReport,
) -> Result<()> {
    hyperlens_io::write_atomic(
        &out.join("head_ablation.csv"),
        ablation_table(report)?.to_csv().as_bytes(),
    )?;
    let summary = HeadAblationSidecar {
        checkpoint: run.checkpoint.display().to_string(),
        hook: "blocks.{l}.attn.hook_z".into(),
        mixer: run.mixer,
        producer: run.producer.into(),
        report,
        source: source.clone(),
    };
    write_sorted(&out.join("head_ablation.json"), &summary)?;
    Ok(())
}

/// Writes `activation_patching.csv` ([`patching_table`]), `activation_patching.npz` (the scores and
/// the pairs, under the names of [`hyperlens_io::keys::activation_patching`]) and
/// `activation_patching.json` (the run, `source`, the method and the mean logit differences) into
/// the directory `out`.
///
/// # Shapes
/// `report`'s grids `[L, T]` and `[L, H]`; `pairs` of N problems.
///
/// # Errors
/// [`ProbeError::InvalidInput`] if `pairs` holds lists of different lengths;
/// [`ProbeError::File`] naming a file that could not be written.
pub fn write_activation_patching(
    out: &Path,
    run: &PatchRun<'_>,
    source: &ProblemsSource,
    pairs: &PatchPairs,
    report: &PatchingReport,
) -> Result<()> {
    hyperlens_io::write_atomic(
        &out.join("activation_patching.csv"),
        patching_table(report)?.to_csv().as_bytes(),
    )?;
    write_patching_arrays(&out.join("activation_patching.npz"), pairs, report)?;
    write_sorted(
        &out.join("activation_patching.json"),
        &ActivationPatchingSidecar {
            arrays: [
                (keys::RESID_PRE, "[L, T] blocks.{l}.hook_resid_pre patched at one position"),
                (keys::ATTN_OUT, "[L, T] blocks.{l}.hook_attn_out patched at one position"),
                (keys::MLP_OUT, "[L, T] blocks.{l}.hook_mlp_out patched at one position (models with MLPs)"),
                (keys::HEAD_OUT, "[L, H] blocks.{l}.attn.hook_z of one head patched at every position"),
                (keys::SOURCE, "[N, 2] (clean, donor) problem indices"),
                (keys::CLEAN_ANSWER, "[N] the clean answer value at the slot"),
                (keys::CORRUPTED_ANSWER, "[N] the corrupted answer value at the slot"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            checkpoint: run.checkpoint.display().to_string(),
            clean_logit_diff: report.clean_logit_diff,
            corrupted_logit_diff: report.corrupted_logit_diff,
            corruption: "feature swap: the slot's tokens in the eight context panels from another problem whose answer at the slot differs".into(),
            metric: "(LD_patched - LD_corrupted) / (LD_clean - LD_corrupted), LD = logit[clean answer] - logit[corrupted answer] at the slot, means over the pairs".into(),
            mixer: run.mixer,
            n_pairs: report.n,
            producer: run.producer.into(),
            slot: report.slot,
            source: source.clone(),
        },
    )?;
    Ok(())
}

/// `activation_patching.npz`: the score grids (float64), then the pairs' sources and answers
/// (int64).
///
/// # Shapes
/// `source` `[N, 2]`, `clean_answer` and `corrupted_answer` `[N]`.
fn write_patching_arrays(path: &Path, pairs: &PatchPairs, report: &PatchingReport) -> Result<()> {
    let src: Vec<i64> = pairs
        .source
        .iter()
        .flat_map(|&(i, j)| [i as i64, j as i64])
        .collect();
    let src = Array2::from_shape_vec((pairs.len(), 2), src)
        .map_err(|e| ProbeError::InvalidInput(format!("{}: {e}", keys::SOURCE)))?;
    let ans = |v: &[usize]| Array1::from_iter(v.iter().map(|&x| x as i64));
    hyperlens_io::write_npz(path, |z| -> Result<()> {
        z.add(keys::RESID_PRE, &report.resid_pre)?;
        z.add(keys::ATTN_OUT, &report.attn_out)?;
        if let Some(m) = &report.mlp_out {
            z.add(keys::MLP_OUT, m)?;
        }
        z.add(keys::HEAD_OUT, &report.head_out)?;
        z.add(keys::SOURCE, &src)?;
        z.add(keys::CLEAN_ANSWER, &ans(&pairs.clean_answer))?;
        z.add(keys::CORRUPTED_ANSWER, &ans(&pairs.corrupted_answer))?;
        Ok(())
    })
}

/// Writes `dla.csv` ([`dla_table`]) and `dla.json` (the run, `source`, the method and every
/// attribution) into the directory `out`.
///
/// # Shapes
/// `report.heads` and `heads_centred` `[L, H]`, written as `[L][H]` lists.
///
/// # Errors
/// [`ProbeError::File`] naming a file that could not be written.
pub fn write_dla(
    out: &Path,
    run: &PatchRun<'_>,
    source: &ProblemsSource,
    report: &DlaReport,
) -> Result<()> {
    let r = report;
    hyperlens_io::write_atomic(&out.join("dla.csv"), dla_table(r)?.to_csv().as_bytes())?;
    let grid = |m: &Array2<f64>| -> Vec<Vec<f64>> { m.outer_iter().map(|r| r.to_vec()).collect() };
    write_sorted(
        &out.join("dla.json"),
        &DlaSidecar {
            attn_bias: r.attn_bias.clone(),
            attn_bias_centred: r.attn_bias_centred.clone(),
            checkpoint: run.checkpoint.display().to_string(),
            constant: [r.constant, r.constant_centred],
            embed: [r.embed, r.embed_centred],
            heads: grid(&r.heads),
            heads_centred: grid(&r.heads_centred),
            logit: r.logit,
            logit_centred: r.logit_centred,
            max_error: r.max_error,
            method: "each part of the final residual stream centred, divided by the final LayerNorm's scale of the whole stream (frozen), times its weight, projected on W_U[:, answer] (TransformerLens apply_ln_to_stack)".into(),
            mixer: run.mixer,
            mlp: r.mlp.clone(),
            mlp_centred: r.mlp_centred.clone(),
            n: r.n,
            producer: run.producer.into(),
            slots: r.slots.clone(),
            source: source.clone(),
            units: "nats (logits), means over problems and slots".into(),
        },
    )?;
    Ok(())
}

/// Writes `transplant.csv` ([`transplant_table`]) and `transplant.json` (the run, the problems and
/// the rows) into the directory `out`.
///
/// # Errors
/// [`ProbeError::File`] naming a file that could not be written.
pub fn write_transplant(
    out: &Path,
    run: &PatchRun<'_>,
    problems: &TransplantProblems<'_>,
    rows: &[TransplantRow],
) -> Result<()> {
    hyperlens_io::write_atomic(
        &out.join("transplant.csv"),
        transplant_table(rows)?.to_csv().as_bytes(),
    )?;
    write_sorted(
        &out.join("transplant.json"),
        &TransplantSidecar {
            checkpoint: run.checkpoint.display().to_string(),
            mixer: run.mixer,
            n: problems.n,
            producer: run.producer.into(),
            rows,
            seed: problems.seed,
            slot: problems.slot,
            split: problems.split.into(),
        },
    )?;
    Ok(())
}

/// `transplant.csv`: `layer,kind,n,to_donor,elsewhere,unchanged,excluded,frac_to_donor,frac_changed,max_logit_change`,
/// one row per layer and kind (the fractions of the `n` counted problems, with 6 decimals, NaN
/// where none was counted; the largest logit change in exponent notation).
///
/// # Errors
/// None in practice (every column has one value per row).
pub fn transplant_table(rows: &[TransplantRow]) -> Result<Table> {
    let ints = |f: &dyn Fn(&TransplantRow) -> usize| {
        Column::Int(rows.iter().map(|r| f(r) as i64).collect())
    };
    let frac = |f: &dyn Fn(&TransplantRow) -> usize| {
        let v = rows.iter().map(|r| {
            if r.n > 0 {
                f(r) as f64 / r.n as f64
            } else {
                f64::NAN
            }
        });
        Column::float(v.collect(), 6)
    };
    let mut t = Table::new();
    t.push("layer", ints(&|r| r.layer))?;
    t.push(
        "kind",
        Column::Text(rows.iter().map(|r| r.kind.to_string()).collect()),
    )?;
    t.push("n", ints(&|r| r.n))?;
    t.push("to_donor", ints(&|r| r.to_donor))?;
    t.push("elsewhere", ints(&|r| r.elsewhere))?;
    t.push("unchanged", ints(&|r| r.unchanged))?;
    t.push("excluded", ints(&|r| r.excluded))?;
    t.push("frac_to_donor", frac(&|r| r.to_donor))?;
    t.push("frac_changed", frac(&|r| r.to_donor + r.elsewhere))?;
    t.push(
        "max_logit_change",
        Column::Exp(rows.iter().map(|r| r.max_logit_change).collect()),
    )?;
    Ok(t)
}

/// The fraction of `kind`'s counted problems at `layer` whose answer became the donor rule's, or
/// with `changed` whose answer changed at all: NaN without the row or without a counted problem
/// (as the report's causal section counts).
pub fn transplant_fraction(
    rows: &[TransplantRow],
    layer: usize,
    kind: TransplantKind,
    changed: bool,
) -> f64 {
    rows.iter()
        .find(|r| r.layer == layer && r.kind == kind)
        .map_or(f64::NAN, |r| {
            let k = if changed {
                r.to_donor + r.elsewhere
            } else {
                r.to_donor
            };
            if r.n > 0 {
                k as f64 / r.n as f64
            } else {
                f64::NAN
            }
        })
}

/// The series of `hyperlens patch transplant`'s figure, one fraction per layer
/// ([`transplant_fraction`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TransplantFractions {
    /// `mean_id`: answers that become the donor rule's.
    pub to_donor: Vec<f64>,
    /// `mean_id`: answers that change.
    pub changed: Vec<f64>,
    /// `donor_problem`: answers that become the donor rule's.
    pub donor_problem: Vec<f64>,
    /// `off_row`: answers that change.
    pub off_row: Vec<f64>,
    /// `random`: answers that change.
    pub random: Vec<f64>,
    /// `zero_ablation`: answers that change.
    pub zero: Vec<f64>,
}

impl TransplantFractions {
    /// The series of `rows` over layers `0..n_layers`.
    pub fn new(rows: &[TransplantRow], n_layers: usize) -> Self {
        let f = |kind: TransplantKind, changed: bool| -> Vec<f64> {
            (0..n_layers)
                .map(|l| transplant_fraction(rows, l, kind, changed))
                .collect()
        };
        Self {
            to_donor: f(TransplantKind::MeanId, false),
            changed: f(TransplantKind::MeanId, true),
            donor_problem: f(TransplantKind::DonorProblem, false),
            off_row: f(TransplantKind::OffRow, true),
            random: f(TransplantKind::Random, true),
            zero: f(TransplantKind::ZeroAblation, true),
        }
    }
}
