//! hyperlens viz: the figures of the latent-code and circuits analyses, drawn with plotters.
//!
//! Every figure is a plain struct holding borrowed or small owned data (slices, ndarray views,
//! label strings); none of them depends on candle or on other hyperlens crates. Each implements
//! [`Figure`], which draws onto any plotters backend (`DrawingArea<DB, Shift>`), and can be
//! written with [`save_png`] / [`save_svg`] (atomically: `path.tmp`, then rename).
//!
//! Text is rendered with the embedded DejaVu Sans font (registered once by [`ensure_fonts`]),
//! so no system font or fontconfig is needed. DejaVu fonts: Copyright (c) 2003 by Bitstream,
//! Inc.; DejaVu changes are in the public domain (Bitstream Vera licence, embedding allowed).
//!
//! Figures (docs/spec/latent-codes.md, docs/spec/circuits.md; GitHub issues 6 and 7):
//! - [`PcaScatter`]: PCA projection of latent codes per layer, coloured by rule or target value;
//! - [`LayerAccuracy`]: rule-decoding accuracy per layer with baselines;
//! - [`Heatmap`]: generic heatmap; rule similarity, confusion matrix, composition and head scores;
//! - [`AttentionGrid`]: attention patterns [query, key] of several heads (or one);
//! - [`TrainingCurves`]: loss and ID/OOD accuracy against the training step;
//! - [`GroupedBars`]: ID/OOD accuracy per checkpoint;
//! - [`EigenvalueGrid`]: OV-circuit eigenvalues lambda/|lambda| on the unit circle, per head;
//! - [`FigureRow`]: several figures side by side under one title.
//!
//! Interactive figures (module [`interactive`], GitHub issue 36): [`CodeExplorer`], the
//! latent-space explorer (hover, click for the problem and its code, legend, zoom), and
//! [`PatternExplorer`], attention patterns with hover values and a head selector, and
//! [`HeatmapExplorer`], heatmaps (head ablation, composition scores, similarity) with hover values
//! and a panel switch; self-contained SVG with a small inline script, no network.

mod attention;
mod bars;
mod cells;
mod colour;
mod eigen;
mod error;
mod figure;
mod font;
mod glyph;
mod heatmap;
pub mod interactive;
pub mod interventions;
mod lines;
mod panels;
mod scatter;
mod sweep;
mod util;

pub use attention::AttentionGrid;
pub use bars::{BarSeries, GroupedBars};
pub use eigen::{EigenPanel, EigenvalueGrid};
pub use lines::{layer_categories, Curve, LayerAccuracy, Reference, Series, TrainingCurves};
pub use panels::FigureRow;
pub use scatter::{PcaScatter, PointColors, ScatterPanel};
pub use sweep::{SweepCurves, SweepSeries};

pub use colour::{categorical, ColorMap};
pub use error::{Result, VizError};
pub use figure::{
    render_png, render_svg, save_png, save_png_sized, save_svg, save_svg_sized, Figure,
};
pub use font::{ensure_fonts, FONT_FAMILY};
pub use glyph::GlyphBackend;
pub use heatmap::{head_labels, Heatmap, HeatmapOptions, ValueFormat};
pub use interactive::{
    save_interactive_html, save_interactive_svg, CodeExplorer, Coloring, ExplorerSet, Field,
    FieldValues, HeatmapExplorer, InteractiveFigure, PatternExplorer, SravenProblems,
};
