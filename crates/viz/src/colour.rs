//! Colour maps (sequential viridis, diverging blue-white-red) and a categorical palette.
//!
//! Small lookup tables with linear interpolation in RGB:
//! - viridis: the 10 evenly spaced stops of matplotlib's `viridis` (van der Walt & Smith, 2015),
//!   as printed by R's `viridisLite::viridis(10)`;
//! - blue-white-red: ColorBrewer `RdBu` (11 classes, Brewer 2002), reversed so that low values
//!   are blue and high values red, white in the middle;
//! - categorical: matplotlib's `tab10` palette.

use plotters::style::RGBColor;

/// A continuous colour map from a value range to colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColorMap {
    /// Perceptually uniform sequential map, dark purple (low) to yellow (high).
    #[default]
    Viridis,
    /// Diverging map: blue (low), white (middle), red (high). Use with a range symmetric
    /// around the neutral value, e.g. cosine similarity in [-1, 1].
    BlueWhiteRed,
}

const VIRIDIS: [(u8, u8, u8); 10] = [
    (0x44, 0x01, 0x54),
    (0x48, 0x28, 0x78),
    (0x3e, 0x4a, 0x89),
    (0x31, 0x68, 0x8e),
    (0x26, 0x82, 0x8e),
    (0x1f, 0x9e, 0x89),
    (0x35, 0xb7, 0x79),
    (0x6d, 0xcd, 0x59),
    (0xb4, 0xde, 0x2c),
    (0xfd, 0xe7, 0x25),
];

const BLUE_WHITE_RED: [(u8, u8, u8); 11] = [
    (0x05, 0x30, 0x61),
    (0x21, 0x66, 0xac),
    (0x43, 0x93, 0xc3),
    (0x92, 0xc5, 0xde),
    (0xd1, 0xe5, 0xf0),
    (0xf7, 0xf7, 0xf7),
    (0xfd, 0xdb, 0xc7),
    (0xf4, 0xa5, 0x82),
    (0xd6, 0x60, 0x4d),
    (0xb2, 0x18, 0x2b),
    (0x67, 0x00, 0x1f),
];

const TAB10: [(u8, u8, u8); 10] = [
    (0x1f, 0x77, 0xb4),
    (0xff, 0x7f, 0x0e),
    (0x2c, 0xa0, 0x2c),
    (0xd6, 0x27, 0x28),
    (0x94, 0x67, 0xbd),
    (0x8c, 0x56, 0x4b),
    (0xe3, 0x77, 0xc2),
    (0x7f, 0x7f, 0x7f),
    (0xbc, 0xbd, 0x22),
    (0x17, 0xbe, 0xcf),
];

fn interpolate(table: &[(u8, u8, u8)], t: f64) -> RGBColor {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    let pos = t * (table.len() - 1) as f64;
    let i = (pos.floor() as usize).min(table.len() - 2);
    let f = pos - i as f64;
    let (a, b) = (table[i], table[i + 1]);
    let mix = |x: u8, y: u8| (x as f64 + (y as f64 - x as f64) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

impl ColorMap {
    /// Colour at relative position `t` in [0, 1] (clamped; NaN maps to 0).
    pub fn at(&self, t: f64) -> RGBColor {
        match self {
            ColorMap::Viridis => interpolate(&VIRIDIS, t),
            ColorMap::BlueWhiteRed => interpolate(&BLUE_WHITE_RED, t),
        }
    }

    /// Colour of `value` on the range `[lo, hi]` (values outside are clamped to the ends).
    /// A degenerate range (`lo == hi`) maps everything to the middle colour.
    pub fn map(&self, value: f64, (lo, hi): (f64, f64)) -> RGBColor {
        if hi > lo {
            self.at((value - lo) / (hi - lo))
        } else {
            self.at(0.5)
        }
    }
}

/// The `i`-th colour of the categorical palette (matplotlib `tab10`, cycling after 10).
pub fn categorical(i: usize) -> RGBColor {
    let (r, g, b) = TAB10[i % TAB10.len()];
    RGBColor(r, g, b)
}

/// Black or white, whichever reads better on `background` (relative luminance, ITU-R BT.709).
pub fn text_on(background: RGBColor) -> RGBColor {
    let lum =
        0.2126 * background.0 as f64 + 0.7152 * background.1 as f64 + 0.0722 * background.2 as f64;
    if lum > 140.0 {
        RGBColor(0, 0, 0)
    } else {
        RGBColor(255, 255, 255)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_and_middle_match_the_tables() {
        assert_eq!(ColorMap::Viridis.at(0.0), RGBColor(0x44, 0x01, 0x54));
        assert_eq!(ColorMap::Viridis.at(1.0), RGBColor(0xfd, 0xe7, 0x25));
        assert_eq!(ColorMap::Viridis.at(-3.0), ColorMap::Viridis.at(0.0));
        assert_eq!(
            ColorMap::BlueWhiteRed.map(0.0, (-1.0, 1.0)),
            RGBColor(0xf7, 0xf7, 0xf7)
        );
        assert_eq!(
            ColorMap::BlueWhiteRed.map(-1.0, (-1.0, 1.0)),
            RGBColor(0x05, 0x30, 0x61)
        );
        assert_eq!(
            ColorMap::BlueWhiteRed.map(1.0, (-1.0, 1.0)),
            RGBColor(0x67, 0x00, 0x1f)
        );
        // Halfway between the first two viridis stops (t = 1/18).
        let c = ColorMap::Viridis.at(1.0 / 18.0);
        let close = |a: u8, b: f64| (a as f64 - b).abs() <= 0.5;
        assert!(
            close(c.0, 70.0) && close(c.1, 20.5) && close(c.2, 102.0),
            "{c:?}"
        );
    }

    #[test]
    fn viridis_brightens_monotonically() {
        let lum = |c: RGBColor| 0.2126 * c.0 as f64 + 0.7152 * c.1 as f64 + 0.0722 * c.2 as f64;
        let mut prev = -1.0;
        for k in 0..=100 {
            let l = lum(ColorMap::Viridis.at(k as f64 / 100.0));
            assert!(l >= prev - 1e-9, "luminance drops at {k}");
            prev = l;
        }
    }

    #[test]
    fn palette_cycles_and_text_contrasts() {
        assert_eq!(categorical(0), categorical(10));
        assert_ne!(categorical(0), categorical(1));
        assert_eq!(text_on(RGBColor(0x44, 0x01, 0x54)), RGBColor(255, 255, 255));
        assert_eq!(text_on(RGBColor(0xfd, 0xe7, 0x25)), RGBColor(0, 0, 0));
    }
}
