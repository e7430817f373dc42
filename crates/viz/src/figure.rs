//! The [`Figure`] trait (draw onto any plotters backend) and the PNG/SVG writers.

use std::path::{Path, PathBuf};

use image::ImageEncoder;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Result, VizError};
use crate::font::ensure_fonts;
use crate::glyph::GlyphBackend;
use crate::util::check_size;

/// A figure that can draw itself onto any plotters drawing area.
///
/// Every figure type of this crate implements it. `draw` first checks the data (so bad input is a
/// [`VizError`] before any pixel is drawn), fills the area white, and lays the figure out to the
/// area's size; [`Figure::size`] is only the default canvas size used by [`save_png`] and
/// [`save_svg`].
pub trait Figure {
    /// Default canvas size in pixels, `(width, height)`, chosen so that text is readable.
    fn size(&self) -> (u32, u32);

    /// Checks the data and draws the figure onto `area`.
    ///
    /// # Errors
    /// [`VizError`] for invalid data or options (named in the error), or a backend failure.
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()>;
}

/// Writes an encoded figure atomically (`hyperlens_io::write_atomic`).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    hyperlens_io::write_atomic(path, bytes).map_err(|e| VizError::Write {
        path: path.to_path_buf(),
        message: format!(
            "{e}: {}",
            std::error::Error::source(&e).map_or_else(String::new, ToString::to_string)
        ),
    })
}

/// Renders `fig` at `size` into an RGB buffer and encodes it as PNG bytes. Text is drawn
/// through [`GlyphBackend`] (correct glyph spacing and bold titles). The PNG is deflated at the
/// default compression with adaptive row filters: figures are flat colours and lines, and on the
/// committed report the filters make them about a third smaller than the `image` crate's default
/// encoder. The best level gave no smaller files (the report's figures) in about twice the encoding
/// time.
///
/// # Errors
/// [`VizError::InvalidOption`] for a size outside 16..=16384 pixels per side, the figure's own
/// input errors, or an encoding failure.
pub fn render_png<F: Figure>(fig: &F, size: (u32, u32)) -> Result<Vec<u8>> {
    check_size(size)?;
    ensure_fonts()?;
    let (w, h) = size;
    let mut buf = vec![0u8; w as usize * h as usize * 3];
    {
        let root =
            GlyphBackend::new(BitMapBackend::with_buffer(&mut buf, size)).into_drawing_area();
        fig.draw(&root)?;
        root.present()?;
    }
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new_with_quality(
        &mut png,
        image::codecs::png::CompressionType::Default,
        image::codecs::png::FilterType::Adaptive,
    )
    .write_image(&buf, w, h, image::ColorType::Rgb8)
    .map_err(|e| VizError::Write {
        path: PathBuf::from("<png buffer>"),
        message: e.to_string(),
    })?;
    Ok(png)
}

/// Renders `fig` at `size` as an SVG document. Text stays text (`<text>` elements with
/// `font-family="sans-serif"`), so titles and legends are searchable.
///
/// # Errors
/// As [`render_png`].
pub fn render_svg<F: Figure>(fig: &F, size: (u32, u32)) -> Result<String> {
    check_size(size)?;
    ensure_fonts()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        fig.draw(&root)?;
        root.present()?;
    }
    Ok(svg)
}

/// Saves `fig` as a PNG at its default [`Figure::size`], atomically (`hyperlens_io::write_atomic`).
///
/// Nothing is written when the figure's data are invalid.
///
/// # Errors
/// The figure's input errors, or [`VizError::Write`] naming the file that could not be written.
pub fn save_png<F: Figure>(path: impl AsRef<Path>, fig: &F) -> Result<()> {
    save_png_sized(path, fig, fig.size())
}

/// Saves `fig` as a PNG of `size` pixels, atomically.
///
/// # Errors
/// As [`save_png`], plus [`VizError::InvalidOption`] for a size outside 16..=16384 per side.
pub fn save_png_sized<F: Figure>(path: impl AsRef<Path>, fig: &F, size: (u32, u32)) -> Result<()> {
    let bytes = render_png(fig, size)?;
    write_atomic(path.as_ref(), &bytes)
}

/// Saves `fig` as an SVG at its default [`Figure::size`], atomically (`hyperlens_io::write_atomic`).
///
/// # Errors
/// As [`save_png`].
pub fn save_svg<F: Figure>(path: impl AsRef<Path>, fig: &F) -> Result<()> {
    save_svg_sized(path, fig, fig.size())
}

/// Saves `fig` as an SVG of `size` pixels, atomically.
///
/// # Errors
/// As [`save_png_sized`].
pub fn save_svg_sized<F: Figure>(path: impl AsRef<Path>, fig: &F, size: (u32, u32)) -> Result<()> {
    let svg = render_svg(fig, size)?;
    write_atomic(path.as_ref(), svg.as_bytes())
}
