//! Registration of the embedded DejaVu Sans font with plotters' `ab_glyph` text renderer.
//!
//! plotters built without its default features has no access to system fonts; every text
//! element looks its family up in a process-wide table filled by `plotters::style::register_font`.
//! We register DejaVu Sans (from the `dejavu` crate, which embeds the font files; the DejaVu
//! licence allows embedding with its notice) under the generic family name `sans-serif`, which is
//! the family every figure of this crate uses.

use std::sync::OnceLock;

use plotters::style::{register_font, FontStyle};

use crate::error::{Result, VizError};

/// The font family name all figures use; the embedded DejaVu Sans is registered under it.
pub const FONT_FAMILY: &str = "sans-serif";

static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Registers the embedded DejaVu Sans (regular, bold, oblique, bold oblique) as `sans-serif`.
///
/// Idempotent and thread-safe: the registration runs once per process (guarded by a
/// `OnceLock`); later calls return the first call's outcome. Every figure and every `save_*`
/// function calls it, so callers only need it when they draw their own text with plotters.
///
/// # Errors
/// [`VizError::Font`] if plotters rejects the embedded font data (which would mean a broken
/// `dejavu` crate).
pub fn ensure_fonts() -> Result<()> {
    REGISTERED
        .get_or_init(|| {
            let faces: [(FontStyle, &'static [u8]); 4] = [
                (FontStyle::Normal, dejavu::sans::regular()),
                (FontStyle::Bold, dejavu::sans::bold()),
                (FontStyle::Oblique, dejavu::sans::oblique()),
                (FontStyle::Italic, dejavu::sans::oblique()),
            ];
            for (style, bytes) in faces {
                register_font(FONT_FAMILY, style, bytes)
                    .map_err(|_| format!("DejaVu Sans ({}) is not a valid font", style.as_str()))?;
            }
            Ok(())
        })
        .clone()
        .map_err(VizError::Font)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_is_idempotent_and_thread_safe() {
        let handles: Vec<_> = (0..4).map(|_| std::thread::spawn(ensure_fonts)).collect();
        for h in handles {
            assert!(h.join().map(|r| r.is_ok()).unwrap_or(false));
        }
        assert!(ensure_fonts().is_ok());
        // The family now resolves to a real font that measures text.
        let font = plotters::style::FontDesc::new(
            plotters::style::FontFamily::SansSerif,
            20.0,
            FontStyle::Normal,
        );
        let (w, h) = font
            .box_size("hyperlens")
            .map_err(|e| e.to_string())
            .unwrap_or((0, 0));
        assert!(w > 50 && h > 10, "text box {w}x{h}");
    }
}
