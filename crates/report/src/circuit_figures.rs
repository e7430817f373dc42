//! Figures of `hyperlens circuits` (and `hl.circuits`' report), drawn from a [`CircuitReport`]: OV and full-OV eigenvalues per
//! head, Q/K/V composition heatmaps (PNGs, and `composition.svg` with hover values), head scores
//! on repeated random tokens, and the attention of the top induction head and its previous-token
//! head on the first sequence.

use std::path::Path;

use hyperlens_analysis::circuits::{CircuitReport, CompositionKind, HeadEigenvalues};
use hyperlens_viz::{
    save_interactive_svg, save_png, save_png_sized, AttentionGrid, ColorMap, EigenvalueGrid,
    FigureRow, Heatmap, HeatmapExplorer, ValueFormat,
};
use ndarray::{s, Array2, Array3};

use crate::error::Result;

/// Above this many heads, figures switch to compact layouts (small eigenvalue panels, composition
/// heatmaps without values at a fixed size).
const MANY_HEADS: usize = 48;

/// (re, im) pairs of every head, layer-major.
fn eig_pairs(e: &HeadEigenvalues) -> Vec<Vec<(f64, f64)>> {
    let (l, h, _) = e.re.dim();
    let mut out = Vec::with_capacity(l * h);
    for li in 0..l {
        for hi in 0..h {
            out.push(
                e.re.slice(s![li, hi, ..])
                    .iter()
                    .zip(e.im.slice(s![li, hi, ..]).iter())
                    .map(|(&r, &i)| (r, i))
                    .collect(),
            );
        }
    }
    out
}

/// One eigenvalue figure: a panel per head with its copying score in the label (compact panels
/// above [`MANY_HEADS`] heads).
fn eigen_figure(
    path: &Path,
    title: &str,
    e: &HeadEigenvalues,
    copying: &Array2<f64>,
) -> Result<()> {
    let (l, h, _) = e.re.dim();
    let pairs = eig_pairs(e);
    let mut grid = EigenvalueGrid::layers_by_heads(title, &pairs, l, h)?;
    let many = l * h > MANY_HEADS;
    for (i, p) in grid.panels.iter_mut().enumerate() {
        let c = copying[[i / h, i % h]];
        p.label = if many {
            format!("{} {c:.2}", p.label)
        } else {
            format!("{}  copy {c:.2}", p.label)
        };
    }
    if many {
        // Small panels keep a real model's figure (hundreds of heads) readable and small.
        let side = 120;
        save_png_sized(path, &grid, (h as u32 * side + 60, l as u32 * side + 110))?;
    } else {
        save_png(path, &grid)?;
    }
    Ok(())
}

/// `composition.svg`: the Q, K and V composition heatmaps of the PNGs as one interactive figure
/// (a panel switch; the pair and its score under the pointer; the pairs whose reading head is not
/// in a later layer masked), the figure `hl.viz.heatmap` draws of `hl.circuits.analyze`'s result.
///
/// # Errors
/// A failed write, naming the file.
fn composition_explorer(panels: &[(String, Heatmap)], path: &Path) -> Result<()> {
    if panels.is_empty() {
        return Ok(());
    }
    let mut fig = HeatmapExplorer::new(panels.iter().map(|(n, h)| (n.clone(), h)).collect());
    fig.masked = "not computed (the reading head is not in a later layer)".into();
    save_interactive_svg(path, &fig)?;
    Ok(())
}

/// Draws every figure of `report` into `dir` (which must exist): `eigenvalues.png`,
/// `eigenvalues_full_ov.png`, `composition_{q,k,v}.png`, `composition.svg`, `head_scores.png` and
/// `induction_attention.png` (the list of [`hyperlens_analysis::circuits`]' tables).
///
/// # Errors
/// A failed drawing or write, naming the file; a composition baseline without the percentile.
pub fn draw_circuit_figures(report: &CircuitReport, dir: &Path) -> Result<()> {
    let (nl, nh) = (report.dims.n_layers, report.dims.n_heads);
    eigen_figure(
        &dir.join("eigenvalues.png"),
        "OV circuit eigenvalues λ/|λ| per head (copying score)",
        &report.ov,
        &report.ov_copying,
    )?;
    eigen_figure(
        &dir.join("eigenvalues_full_ov.png"),
        "Full OV circuit W_E W_OV W_U: eigenvalues λ/|λ| per head",
        &report.full_ov,
        &report.full_ov_copying,
    )?;
    let mut composition: Vec<(String, Heatmap)> = Vec::new();
    for k in CompositionKind::ALL {
        if let Some(sc) = report.composition.get(k) {
            let title = crate::code_explorer::composition_title(
                k.name(),
                Some(report.baseline.percentile(k, 99.0)?),
            );
            let mut hm = Heatmap::composition(&title, sc.view())?;
            let path = dir.join(format!("composition_{k}.png"));
            if nl * nh > 24 {
                hm.options.value_format = ValueFormat::Hidden;
            }
            if nl * nh > MANY_HEADS {
                save_png_sized(path, &hm, (1500, 1450))?;
            } else {
                save_png(path, &hm)?;
            }
            composition.push((k.name().to_string(), hm));
        }
    }
    composition_explorer(&composition, &dir.join("composition.svg"))?;
    let hs = &report.heads;
    let panel = |title: &str, a: &Array2<f64>| {
        Heatmap::head_scores(
            title,
            a.view(),
            "score",
            ColorMap::Viridis,
            Some((0.0, 1.0)),
        )
    };
    let row = FigureRow::new(
        &format!(
            "Head scores on {} random sequences of {} tokens repeated twice",
            hs.sequences, hs.repeated
        ),
        vec![
            panel("induction", &hs.rep_induction)?,
            panel("previous token", &hs.rep_previous)?,
            panel("duplicate token", &hs.rep_duplicate)?,
        ],
    );
    save_png(dir.join("head_scores.png"), &row)?;

    let mut show: Vec<(usize, usize, String)> = Vec::new();
    if let Some(p) = report.shown_previous_token_head() {
        let text = format!("{}: previous token {:.2}", p.label(), p.score);
        show.push((p.layer, p.head, text));
    }
    if let Some(i) = report.top_induction_head {
        show.push((
            i.layer,
            i.head,
            format!("{}: induction {:.2}", i.label(), i.score),
        ));
    }
    let t = hs.first_tokens.len();
    let mut pats = Array3::<f64>::zeros((show.len(), t, t));
    for (i, (l, h, _)) in show.iter().enumerate() {
        pats.slice_mut(s![i, .., ..])
            .assign(&hs.first_pattern.slice(s![*l, *h, .., ..]).mapv(f64::from));
    }
    let tok_labels: Vec<String> = hs.first_tokens.iter().map(|t| t.to_string()).collect();
    let mut grid = AttentionGrid::new(
        "Attention on repeated random tokens",
        pats.view(),
        &tok_labels,
        &tok_labels,
    );
    grid.panel_titles = show.iter().map(|(_, _, s)| s.clone()).collect();
    grid.columns = show.len().max(1);
    grid.range = Some((0.0, 1.0));
    if hs.prefix == 0 {
        grid.separators = Some(hs.repeated);
    }
    save_png(dir.join("induction_attention.png"), &grid)?;
    Ok(())
}
