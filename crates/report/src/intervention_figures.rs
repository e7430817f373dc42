//! The figures of `hyperlens patch`, drawn from the probe crate's results with the
//! `hyperlens_viz::interventions` builders: `patching_*.png`, `dla.png`, `transplant.png`,
//! `head_ablation.png` and `head_ablation.svg`. Each is titled with the checkpoint's name
//! ([`checkpoint_name`]).

use std::path::Path;

use hyperlens_model::Config;
use hyperlens_probe::{
    AblationReport, DlaReport, PatchingReport, TransplantFractions, TransplantRow,
};
use hyperlens_tasks::sraven::token_labels;
use hyperlens_viz::{interventions, save_interactive_svg, save_png, HeatmapExplorer};
use ndarray::Array2;

use crate::error::Result;

/// The checkpoint directory's name, for figure titles (empty for a path without one).
pub fn checkpoint_name(checkpoint: &Path) -> String {
    checkpoint
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// `patching_{resid_pre,attn_out,mlp_out}.png` ([layer, position], positions labelled by the
/// SRAVEN tokens) and `patching_heads.png` ([layer, head]) of the checkpoint `name` into `out`.
///
/// # Errors
/// A failed drawing or write, naming the file.
pub fn draw_patching(out: &Path, name: &str, cfg: &Config, r: &PatchingReport) -> Result<()> {
    let positions = token_labels(cfg.n_tokens, cfg.n_outputs);
    let mut grids = vec![("resid_pre", &r.resid_pre), ("attn_out", &r.attn_out)];
    if let Some(m) = &r.mlp_out {
        grids.push(("mlp_out", m));
    }
    for (activation, grid) in grids {
        let fig = interventions::patching_positions(name, activation, r.slot, grid, &positions);
        save_png(out.join(format!("patching_{activation}.png")), &fig)?;
    }
    let fig = interventions::patching_heads(name, r.head_out.view())?;
    save_png(out.join("patching_heads.png"), &fig)?;
    Ok(())
}

/// `dla.png`: the centred attributions per [layer, head], the last column the layer's MLP.
///
/// # Errors
/// A failed drawing or write, naming the file.
pub fn draw_dla(out: &Path, name: &str, r: &DlaReport) -> Result<()> {
    let fig = interventions::dla_heads(name, r.heads_centred.view(), &r.mlp_centred)?;
    save_png(out.join("dla.png"), &fig)?;
    Ok(())
}

/// `transplant.png`: per layer, the fraction of problems whose answer becomes the donor rule's or
/// changes, for the transplant and its controls ([`TransplantFractions`]).
///
/// # Errors
/// A failed drawing or write, naming the file.
pub fn draw_transplant(
    out: &Path,
    name: &str,
    n_layers: usize,
    rows: &[TransplantRow],
) -> Result<()> {
    let f = TransplantFractions::new(rows, n_layers);
    let series = interventions::TransplantSeries {
        to_donor: &f.to_donor,
        changed: &f.changed,
        donor_problem: &f.donor_problem,
        off_row: &f.off_row,
        random: &f.random,
        zero: &f.zero,
    };
    let bars = interventions::TransplantBars::new(&series);
    save_png(out.join("transplant.png"), &bars.figure(name))?;
    Ok(())
}

/// `head_ablation.png`: the change in accuracy per [layer, head]; `head_ablation.svg`: the same
/// heatmap with the head and its change under the pointer.
///
/// # Errors
/// A report without one row per head of `cfg`; a failed drawing or write, naming the file.
pub fn draw_head_ablation(
    out: &Path,
    name: &str,
    cfg: &Config,
    report: &AblationReport,
) -> Result<()> {
    if report.heads.len() != cfg.n_layers * cfg.n_heads {
        return Err(crate::ReportError::InvalidInput(format!(
            "head ablation: {} rows for {} layers of {} heads",
            report.heads.len(),
            cfg.n_layers,
            cfg.n_heads
        )));
    }
    let deltas = Array2::from_shape_fn((cfg.n_layers, cfg.n_heads), |(l, h)| {
        report.heads[l * cfg.n_heads + h].accuracy - report.base.accuracy
    });
    let fig = interventions::head_ablation(name, &report.ablation.to_string(), deltas.view())?;
    save_png(out.join("head_ablation.png"), &fig)?;
    let mut hover = HeatmapExplorer::single(&fig);
    (hover.row_name, hover.col_name) = ("layer".into(), "head".into());
    save_interactive_svg(out.join("head_ablation.svg"), &hover)?;
    Ok(())
}
