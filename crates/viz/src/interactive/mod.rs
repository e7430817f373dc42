//! Interactive figures: self-contained SVG documents with a small inline script, for the report
//! page and for notebooks (GitHub issue 36).
//!
//! Each interactive figure ([`CodeExplorer`], [`PatternExplorer`], [`HeatmapExplorer`]) is
//! written as one `<svg>` element that holds
//! - its data once, compactly: one JSON object whose arrays are little-endian binary blobs in
//!   base64 (positions quantised to 16 bits, codes and patterns to 8 bits over a stated range,
//!   labels as the smallest integer type that holds them);
//! - the crate's hand-written script (`interactive.js`, included with `include_str!`), which
//!   draws the points or cells from the data and handles hover, click, zoom and the legend.
//!
//! The same element is the standalone `.svg` file ([`InteractiveFigure::svg_document`]) and the
//! HTML fragment of a report page or a notebook's `_repr_html_` ([`InteractiveFigure::html`]).
//! Nothing is fetched: no CDN, no network, and it works from `file://`. The output depends only
//! on the inputs (no clock, no random id): the element's id is a hash of its data.

mod attention;
mod encode;
mod explorer;
mod heatmap;

pub use attention::PatternExplorer;
pub use explorer::{CodeExplorer, Coloring, ExplorerSet, Field, FieldValues, SravenProblems};
pub use heatmap::HeatmapExplorer;

use std::path::Path;

use crate::error::{Result, VizError};

/// At most this many cells of a pattern or heatmap figure are stored as `f32`; more are quantised
/// to 8 bits over the colour range (hover values then carry `≈`).
const EXACT_CELLS: usize = 20_000;

/// The script shared by every interactive figure (plain ES2017, no dependency).
pub const SCRIPT: &str = include_str!("interactive.js");

/// A figure that renders itself as an interactive SVG element.
pub trait InteractiveFigure {
    /// The figure's kind, read by the script: `"explorer"`, `"patterns"` or `"heatmap"`.
    fn kind(&self) -> &'static str;

    /// Canvas size in CSS pixels, `(width, height)`.
    fn canvas(&self) -> (u32, u32);

    /// Checks the data and returns the figure's JSON data object (binary arrays in base64).
    ///
    /// # Errors
    /// [`VizError`] naming the array or option at fault.
    fn data_json(&self) -> Result<String>;

    /// The `<svg>` element: style, data and script, with an id derived from the data.
    ///
    /// # Errors
    /// As [`InteractiveFigure::data_json`].
    fn svg_element(&self) -> Result<String> {
        let data = self.data_json()?;
        let id = format!("hl-{:016x}", encode::fnv1a(data.as_bytes()));
        let (w, h) = self.canvas();
        Ok(format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"{id}\" class=\"hl-fig\" data-hl-kind=\"{kind}\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\
<style>{STYLE}</style>\
<rect class=\"hl-bg\" width=\"{w}\" height=\"{h}\" fill=\"#fff\"/>\
<text class=\"hl-noscript\" x=\"12\" y=\"24\">Interactive figure: needs JavaScript.</text>\
<script type=\"application/json\" class=\"hl-data\">{data}</script>\
<script><![CDATA[{SCRIPT}]]></script></svg>",
            kind = self.kind(),
        ))
    }

    /// The standalone SVG document (`.svg` file): opens in a browser with its interactions.
    ///
    /// # Errors
    /// As [`InteractiveFigure::data_json`].
    fn svg_document(&self) -> Result<String> {
        Ok(format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{}\n",
            self.svg_element()?
        ))
    }

    /// The HTML fragment (a notebook's `_repr_html_`, a report page): the SVG element in a `div`.
    ///
    /// # Errors
    /// As [`InteractiveFigure::data_json`].
    fn html(&self) -> Result<String> {
        Ok(format!(
            "<div class=\"hl-fig-wrap\" style=\"overflow-x:auto;max-width:100%\">{}</div>",
            self.svg_element()?
        ))
    }
}

/// Writes `fig` as a standalone interactive SVG document, atomically.
///
/// # Errors
/// The figure's input errors, or [`VizError::Write`] naming the file.
pub fn save_interactive_svg<F: InteractiveFigure + ?Sized>(
    path: impl AsRef<Path>,
    fig: &F,
) -> Result<()> {
    write(path.as_ref(), fig.svg_document()?.as_bytes())
}

/// Writes `fig` as a standalone HTML page (the fragment of [`InteractiveFigure::html`] in a
/// minimal document), atomically.
///
/// # Errors
/// As [`save_interactive_svg`].
pub fn save_interactive_html<F: InteractiveFigure + ?Sized>(
    path: impl AsRef<Path>,
    fig: &F,
) -> Result<()> {
    let page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>hyperlens figure</title></head><body>\n{}\n</body></html>\n",
        fig.html()?
    );
    write(path.as_ref(), page.as_bytes())
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    hyperlens_io::write_atomic(path, bytes).map_err(|e| VizError::Write {
        path: path.to_path_buf(),
        message: format!(
            "{e}: {}",
            std::error::Error::source(&e).map_or_else(String::new, ToString::to_string)
        ),
    })
}

/// Style of the interactive figures (scoped to their class).
const STYLE: &str = ".hl-fig text{font-size:12px;fill:#222}\
.hl-fig .hl-title{font-size:15px;font-weight:bold}\
.hl-fig .hl-small{font-size:10.5px;fill:#444}\
.hl-fig .hl-btn{cursor:pointer}\
.hl-fig .hl-btn rect{fill:#f3f3f3;stroke:#bbb}\
.hl-fig .hl-btn.on rect{fill:#245;stroke:#245}\
.hl-fig .hl-btn.on text{fill:#fff}\
.hl-fig .hl-leg{cursor:pointer}\
.hl-fig .hl-leg.off{opacity:.3}\
.hl-fig .hl-pt{cursor:pointer}\
.hl-fig .hl-pt.sel{stroke:#000;stroke-width:2}\
.hl-fig .hl-tip rect{fill:#fff;stroke:#555;opacity:.95}\
.hl-fig .hl-frame{fill:none;stroke:#999}\
.hl-fig .hl-grid{stroke:#e6e6e6}\
.hl-fig .hl-mark{fill:none;stroke:#d62728;stroke-width:2.5}";
