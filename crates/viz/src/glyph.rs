//! A backend wrapper that renders text itself with `ab_glyph`, placing every glyph at its
//! proper bearing and using the bold face for bold text.
//!
//! plotters 0.3.7's `ab_glyph` text path drops each glyph's left side bearing (letters drift
//! into each other: "by rule" renders as "byrule") and `FontDesc::style` keeps the regular face,
//! so bold titles come out regular. [`GlyphBackend`] wraps any pixel backend and draws text in
//! the embedded DejaVu Sans with correct metrics; everything else is passed through unchanged.
//! [`crate::render_png`] uses it; vector backends (SVG) keep text as text and need no wrapper.

use std::sync::OnceLock;

use ab_glyph::{point, Font, FontRef, PxScale, ScaleFont};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
    FontStyle,
};

use crate::font::FONT_FAMILY;

/// The DejaVu Sans faces: regular, bold, oblique.
fn face(style: FontStyle) -> Option<&'static FontRef<'static>> {
    static FACES: OnceLock<Option<[FontRef<'static>; 3]>> = OnceLock::new();
    let faces = FACES
        .get_or_init(|| {
            Some([
                FontRef::try_from_slice(dejavu::sans::regular()).ok()?,
                FontRef::try_from_slice(dejavu::sans::bold()).ok()?,
                FontRef::try_from_slice(dejavu::sans::oblique()).ok()?,
            ])
        })
        .as_ref()?;
    Some(match style {
        FontStyle::Bold => &faces[1],
        FontStyle::Oblique | FontStyle::Italic => &faces[2],
        FontStyle::Normal => &faces[0],
    })
}

/// Wraps a pixel backend so that text in the `sans-serif` family is rasterised with correct
/// glyph placement (see the module notes); other families go to the inner backend.
///
/// The text box follows plotters' measurement (width: sum of advances and kerning; height:
/// size / 1.24) so layouts measured with plotters fonts agree; the capital height is centred in
/// that box.
#[derive(Debug)]
pub struct GlyphBackend<DB> {
    inner: DB,
}

impl<DB: DrawingBackend> GlyphBackend<DB> {
    /// Wraps `inner`.
    pub fn new(inner: DB) -> Self {
        Self { inner }
    }

    /// The wrapped backend.
    pub fn into_inner(self) -> DB {
        self.inner
    }
}

impl<DB: DrawingBackend> DrawingBackend for GlyphBackend<DB> {
    type ErrorType = DB::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn draw_text<TStyle: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &TStyle,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let font = match face(style.style()) {
            Some(f) if style.family().as_str() == FONT_FAMILY => f,
            _ => return self.inner.draw_text(text, style, pos),
        };
        let color = style.color();
        if color.alpha == 0.0 || text.is_empty() {
            return Ok(());
        }
        let size = style.size() as f32;
        let scaled = font.as_scaled(PxScale::from(size));
        // Lay the glyphs out on a baseline at y = 0.
        let mut glyphs = Vec::with_capacity(text.len());
        let mut caret = 0.0f32;
        let mut prev = None;
        for c in text.chars() {
            let id = scaled.glyph_id(c);
            if let Some(p) = prev {
                caret += scaled.kern(p, id);
            }
            glyphs.push(id.with_scale_and_position(size, point(caret, 0.0)));
            caret += scaled.h_advance(id);
            prev = Some(id);
        }
        let width = caret;
        let height = size / 1.24;
        let cap = font
            .outline_glyph(
                scaled
                    .glyph_id('H')
                    .with_scale_and_position(size, point(0.0, 0.0)),
            )
            .map_or(0.63 * size, |o| -o.px_bounds().min.y);
        let baseline = (height + cap) / 2.0;
        let anchor = style.anchor();
        let dx = match anchor.h_pos {
            HPos::Left => 0.0,
            HPos::Center => -width / 2.0,
            HPos::Right => -width,
        };
        let dy = match anchor.v_pos {
            VPos::Top => 0.0,
            VPos::Center => -height / 2.0,
            VPos::Bottom => -height,
        };
        let trans = style.transform();
        let (w, h) = self.inner.get_size();
        let mut result = Ok(());
        for g in glyphs {
            let Some(outline) = font.outline_glyph(g) else {
                continue;
            };
            let b = outline.px_bounds();
            outline.draw(|x, y, coverage| {
                if coverage <= 0.0 || result.is_err() {
                    return;
                }
                let lx = (b.min.x + x as f32 + dx).round() as i32;
                let ly = (b.min.y + y as f32 + baseline + dy).round() as i32;
                let (tx, ty) = trans.transform(lx, ly);
                let (px, py) = (pos.0 + tx, pos.1 + ty);
                if px >= 0 && py >= 0 && (px as u32) < w && (py as u32) < h {
                    let c = BackendColor {
                        alpha: color.alpha * f64::from(coverage.min(1.0)),
                        rgb: color.rgb,
                    };
                    result = self.inner.draw_pixel((px, py), c);
                }
            });
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::prelude::*;
    use plotters::style::text_anchor::Pos;
    use plotters::style::FontTransform;

    /// Renders `s` through the wrapper and returns the ink bounding box and the amount of ink.
    fn ink(s: &str, style: TextStyle, pos: (i32, i32)) -> ((i32, i32, i32, i32), f64) {
        crate::font::ensure_fonts().unwrap_or(());
        let (w, h) = (240u32, 160u32);
        let mut buf = vec![255u8; (w * h * 3) as usize];
        {
            let root =
                GlyphBackend::new(BitMapBackend::with_buffer(&mut buf, (w, h))).into_drawing_area();
            root.draw_text(s, &style, pos).unwrap_or(());
        }
        let (mut x0, mut y0, mut x1, mut y1, mut total) =
            (i32::MAX, i32::MAX, i32::MIN, i32::MIN, 0.0);
        for (i, px) in buf.chunks(3).enumerate() {
            let darkness = 255.0 - px[0] as f64;
            if darkness > 60.0 {
                let (x, y) = ((i as u32 % w) as i32, (i as u32 / w) as i32);
                (x0, y0, x1, y1) = (x0.min(x), y0.min(y), x1.max(x), y1.max(y));
            }
            total += darkness;
        }
        ((x0, y0, x1, y1), total)
    }

    fn style(size: f64, fs: FontStyle) -> TextStyle<'static> {
        TextStyle::from(FontDesc::new(FontFamily::Name(FONT_FAMILY), size, fs)).color(&BLACK)
    }

    #[test]
    fn centred_capitals_are_centred() {
        let st = style(20.0, FontStyle::Normal).pos(Pos::new(HPos::Center, VPos::Center));
        let ((x0, y0, x1, y1), _) = ink("HHHH", st, (120, 80));
        assert!(((x0 + x1) / 2 - 120).abs() <= 2, "x {x0}..{x1}");
        assert!(((y0 + y1) / 2 - 80).abs() <= 2, "y {y0}..{y1}");
    }

    #[test]
    fn width_matches_plotters_measurement() {
        let st = style(14.0, FontStyle::Normal);
        let measured = st
            .font
            .box_size("progression +1")
            .map(|b| b.0 as i32)
            .unwrap_or(0);
        let ((x0, _, x1, _), _) = ink(
            "progression +1",
            st.pos(Pos::new(HPos::Left, VPos::Top)),
            (10, 10),
        );
        assert!(
            (x1 - x0 + 1 - measured).abs() <= 3,
            "ink {} vs measured {measured}",
            x1 - x0 + 1
        );
    }

    #[test]
    fn rotated_text_reads_upwards_and_bold_is_heavier() {
        let st = style(16.0, FontStyle::Normal)
            .pos(Pos::new(HPos::Right, VPos::Center))
            .transform(FontTransform::Rotate270);
        let ((x0, y0, x1, y1), _) = ink("rotated label", st, (120, 20));
        assert!(y1 - y0 > 3 * (x1 - x0), "box {x0},{y0} {x1},{y1}");
        assert!(
            y0 >= 19,
            "text hangs below its anchor (Right = end of text at the anchor)"
        );
        let (_, regular) = ink("Bold", style(20.0, FontStyle::Normal), (10, 10));
        let (_, bold) = ink("Bold", style(20.0, FontStyle::Bold), (10, 10));
        assert!(bold > 1.2 * regular, "bold {bold} vs regular {regular}");
    }
}
