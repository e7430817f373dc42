//! `hyperlens analyze` on logic code files: the term decoding of a pair of code sets, the
//! projections of the test set with their figures, and the `summary.json` that records them
//! ([`TermSummary`]).

use std::path::{Path, PathBuf};

use hyperlens_analysis::embed::TsneParams;
use hyperlens_analysis::terms::{
    term_decoding, term_decoding_csv, TermCodes, TermDecodingParams, TermDecodingRow,
};
use hyperlens_io::keys;
use serde::Serialize;

use super::figures::write_projection_figures;
use crate::error::{ReportError, Result};

/// The projections part of a [`TermSummary`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TermProjections {
    /// What the PCA covers, in words.
    pub pca: String,
    /// Codes embedded with t-SNE (the first ones of the test set).
    pub tsne_points: usize,
    /// The t-SNE embedding's trustworthiness (k = 5).
    pub tsne_trustworthiness_k5: f64,
}

/// `summary.json` of `hyperlens analyze` on logic code files (written with every object's keys
/// in alphabetical order, [`hyperlens_io::write_json_sorted`], as the file has always had them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TermSummary {
    /// Codes in the test file.
    pub n_test: usize,
    /// Codes in the train file.
    pub n_train: usize,
    /// The decoding's settings.
    pub params: TermDecodingParams,
    /// The projections of the test codes.
    pub projections: TermProjections,
    /// The task, `logic`.
    pub task: String,
    /// The decoding per layer and on all layers.
    pub term_decoding: Vec<TermDecodingRow>,
    /// The test file's path.
    pub test: String,
    /// The train file's path.
    pub train: String,
}

/// What [`analyze_terms_to_dir`] found and wrote.
#[derive(Debug, Clone)]
pub struct TermAnalysis {
    /// The record written as `summary.json`.
    pub summary: TermSummary,
    /// The projection figures written (file names in `out`): by term, then by target when the
    /// test codes carry it.
    pub figures: Vec<&'static str>,
    /// The files written, in order.
    pub written: Vec<PathBuf>,
}

/// The files of [`analyze_terms_to_dir`] in `out`.
const TERM_DECODING_CSV: &str = "term_decoding.csv";
const TERM_PNG: &str = "projections_term.png";
const TARGET_PNG: &str = "projections_target.png";
const PROJECTIONS_NPZ: &str = "projections.npz";
const SUMMARY_JSON: &str = "summary.json";

/// The term decoding of `train` (read from `train_path`) to `test` (from `test_path`) with
/// `params` ([`term_decoding`]), written into `out` (created if missing) as `term_decoding.csv`;
/// the PCA of every test code and the t-SNE of the first `tsne_points` of them (the one
/// deterministic setting, [`TsneParams::deterministic`] with `params.seed`) as `projections.npz`
/// and the figures `projections_term.png` (and `projections_target.png` when the codes carry
/// the target, [`write_projection_figures`]); and `summary.json` ([`TermSummary`]).
///
/// # Shapes
/// `projections.npz` holds `pca_layer{l}` and `pca_all` `[N_test, 2]`, `tsne_all`
/// `[min(N_test, tsne_points), 2]` and `term_ids` `[N_test, K]`.
///
/// # Errors
/// [`term_decoding`]'s (sets of other shapes, no term to score); a projection's; a failed
/// write, naming the file.
pub fn analyze_terms_to_dir(
    train: &TermCodes,
    train_path: &Path,
    test: &TermCodes,
    test_path: &Path,
    params: &TermDecodingParams,
    tsne_points: usize,
    out: &Path,
) -> Result<TermAnalysis> {
    let rows = term_decoding(train, test, params)?;
    std::fs::create_dir_all(out).map_err(|source| ReportError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let mut written = vec![out.join(TERM_DECODING_CSV)];
    hyperlens_io::write_atomic(&written[0], term_decoding_csv(&rows)?.as_bytes())?;
    let n_tsne = tsne_points.min(test.n_samples());
    let (projections, trust) =
        test.projections(n_tsne, &TsneParams::deterministic(params.seed, n_tsne))?;
    let with_target = write_projection_figures(
        test,
        &projections,
        n_tsne,
        "--test codes",
        &out.join(TERM_PNG),
        &out.join(TARGET_PNG),
    )?;
    let figures = if with_target {
        vec![TERM_PNG, TARGET_PNG]
    } else {
        vec![TERM_PNG]
    };
    written.extend(figures.iter().map(|f| out.join(f)));
    let npz_path = out.join(PROJECTIONS_NPZ);
    hyperlens_io::write_npz::<hyperlens_io::IoError, _>(&npz_path, |z| {
        for (name, a) in &projections {
            z.add(name, a)?;
        }
        z.add(keys::projections::TERM_IDS, test.term_ids())
    })?;
    written.push(npz_path);
    let summary = TermSummary {
        n_test: test.n_samples(),
        n_train: train.n_samples(),
        params: *params,
        projections: TermProjections {
            pca: "2 components per layer and for all layers, over every --test code".into(),
            tsne_points: n_tsne,
            tsne_trustworthiness_k5: trust,
        },
        task: "logic".into(),
        term_decoding: rows,
        test: test_path.display().to_string(),
        train: train_path.display().to_string(),
    };
    let path = out.join(SUMMARY_JSON);
    hyperlens_io::write_json_sorted(&path, &summary)?;
    written.push(path);
    Ok(TermAnalysis {
        summary,
        figures,
        written,
    })
}
