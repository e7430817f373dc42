//! The compact encoding of an interactive figure's data: little-endian binary arrays in base64
//! inside one JSON object, quantised where the figure does not need full precision.

use serde_json::{json, Value};

use crate::error::{Result, VizError};

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 (RFC 4648, with `=` padding) of `bytes`.
pub fn base64(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                s.push(B64[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// 64-bit FNV-1a hash (the figure's element id: the same data give the same id).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The element type of a binary array: the one definition of the format that `interactive.js`
/// decodes (its `ARRAY_TYPES` and `dec`, the same table). An array is the JSON object
/// `{"t": name, "n": length, "b": base64}`, `b` the standard base64 of the `n` values in
/// little-endian byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayType {
    /// `u4`: values 0..=15, two per byte, the low nibble first (an odd count leaves the last high
    /// nibble 0).
    U4,
    /// `u8`: one byte per value.
    U8,
    /// `u16`: unsigned 16-bit.
    U16,
    /// `i32`: signed 32-bit, two's complement.
    I32,
    /// `f32`: IEEE 754 single precision (NaN and the infinities kept).
    F32,
}

impl ArrayType {
    /// The name in the data object (`u4`, `u8`, `u16`, `i32`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            ArrayType::U4 => "u4",
            ArrayType::U8 => "u8",
            ArrayType::U16 => "u16",
            ArrayType::I32 => "i32",
            ArrayType::F32 => "f32",
        }
    }

    /// The bytes of `n` values.
    pub fn byte_len(self, n: usize) -> usize {
        match self {
            ArrayType::U4 => n.div_ceil(2),
            ArrayType::U8 => n,
            ArrayType::U16 => 2 * n,
            ArrayType::I32 | ArrayType::F32 => 4 * n,
        }
    }
}

/// An encoded array of `n` values of type `t` from their bytes ([`ArrayType`]).
///
/// # Shapes
/// `bytes`: `[t.byte_len(n)]`.
///
/// # Panics
/// In debug builds, when `bytes` is not `t.byte_len(n)` long (a bug of this module's callers).
pub fn array(t: ArrayType, n: usize, bytes: &[u8]) -> Value {
    debug_assert_eq!(bytes.len(), t.byte_len(n), "{} array of {n}", t.name());
    json!({"t": t.name(), "n": n, "b": base64(bytes)})
}

/// Values as an `f32` array (rounded to single precision; NaN and the infinities kept).
pub fn floats(v: impl ExactSizeIterator<Item = f64>) -> Value {
    let n = v.len();
    let b: Vec<u8> = v.flat_map(|x| (x as f32).to_le_bytes()).collect();
    array(ArrayType::F32, n, &b)
}

/// Values 0..=15 packed two per byte, the low nibble first (an odd count leaves the last high
/// nibble 0).
fn nibbles(v: impl Iterator<Item = u8>) -> Vec<u8> {
    let v: Vec<u8> = v.collect();
    v.chunks(2)
        .map(|c| (c[0] & 15) | (c.get(1).copied().unwrap_or(0) & 15) << 4)
        .collect()
}

/// Integers in the smallest of `u4`, `u8`, `u16`, `i32` that holds them all.
///
/// # Errors
/// [`VizError::OutOfRange`] for a value outside the `i32` range.
pub fn ints(what: &str, v: impl ExactSizeIterator<Item = i64> + Clone) -> Result<Value> {
    let n = v.len();
    let (lo, hi) = v
        .clone()
        .fold((0i64, 0i64), |(a, b), x| (a.min(x), b.max(x)));
    if lo >= 0 && hi <= 15 {
        Ok(array(ArrayType::U4, n, &nibbles(v.map(|x| x as u8))))
    } else if lo >= 0 && hi <= i64::from(u8::MAX) {
        let b: Vec<u8> = v.map(|x| x as u8).collect();
        Ok(array(ArrayType::U8, n, &b))
    } else if lo >= 0 && hi <= i64::from(u16::MAX) {
        let b: Vec<u8> = v.flat_map(|x| (x as u16).to_le_bytes()).collect();
        Ok(array(ArrayType::U16, n, &b))
    } else if lo >= i64::from(i32::MIN) && hi <= i64::from(i32::MAX) {
        let b: Vec<u8> = v.flat_map(|x| (x as i32).to_le_bytes()).collect();
        Ok(array(ArrayType::I32, n, &b))
    } else {
        let bad = if lo < i64::from(i32::MIN) { lo } else { hi };
        Err(VizError::OutOfRange {
            what: what.to_string(),
            at: "(some element)".into(),
            value: bad as f64,
            lo: f64::from(i32::MIN),
            hi: f64::from(i32::MAX),
        })
    }
}

/// Finite values quantised to `u4` (`bits == 4`), `u8` (`bits == 8`) or `u16` (`bits == 16`) over
/// `[lo, hi]`: the
/// value of code `q` is `lo + q * (hi - lo) / (2^bits - 1)`, so the error is at most half a step.
/// Returns the encoded array and `[lo, hi]` (the data's range, widened when it is a point).
pub fn quantised(v: &[f64], bits: u32) -> (Value, [f64; 2]) {
    let (mut lo, mut hi) = v
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    if !(lo.is_finite() && hi.is_finite()) {
        (lo, hi) = (0.0, 1.0);
    }
    if hi <= lo {
        (lo, hi) = (lo - 0.5, lo + 0.5);
    }
    let top = f64::from((1u32 << bits) - 1);
    let q = |x: f64| ((x - lo) / (hi - lo) * top).round().clamp(0.0, top);
    let value = if bits == 4 {
        array(
            ArrayType::U4,
            v.len(),
            &nibbles(v.iter().map(|&x| q(x) as u8)),
        )
    } else if bits == 8 {
        let b: Vec<u8> = v.iter().map(|&x| q(x) as u8).collect();
        array(ArrayType::U8, v.len(), &b)
    } else {
        let b: Vec<u8> = v
            .iter()
            .flat_map(|&x| (q(x) as u16).to_le_bytes())
            .collect();
        array(ArrayType::U16, v.len(), &b)
    };
    (value, [lo, hi])
}

/// `value` as JSON text that is safe inside a `<script>` element of HTML and of XML (SVG): `<`,
/// `>` and `&` only occur inside JSON strings, where they are written as `\u003c`, `\u003e`,
/// `\u0026`.
pub fn safe_json(value: &Value) -> String {
    value
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// Checks that every value of `what` is finite.
///
/// # Errors
/// [`VizError::NonFinite`] naming the first one that is not.
pub fn check_finite(what: &str, v: impl Iterator<Item = f64>) -> Result<()> {
    for (i, x) in v.enumerate() {
        if !x.is_finite() {
            return Err(VizError::NonFinite {
                what: what.to_string(),
                at: format!("[{i}] (flat index)"),
                value: x,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        // RFC 4648 section 10.
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (i, o) in cases {
            assert_eq!(base64(i.as_bytes()), o, "{i}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn ints_pick_the_smallest_type() {
        let v = ints("a", [3i64, 15, 7].into_iter()).unwrap();
        assert_eq!(v["t"], "u4");
        assert_eq!(v["b"], base64(&[0xf3, 0x07]));
        assert_eq!(ints("a", [0i64, 255].into_iter()).unwrap()["t"], "u8");
        assert_eq!(ints("a", [0i64, 256].into_iter()).unwrap()["t"], "u16");
        let v = ints("a", [-1i64, 7].into_iter()).unwrap();
        assert_eq!(v["t"], "i32");
        // -1 as little-endian i32, then 7.
        assert_eq!(v["b"], base64(&[0xff, 0xff, 0xff, 0xff, 7, 0, 0, 0]));
        assert!(ints("a", [i64::MAX].into_iter()).is_err());
    }

    #[test]
    fn quantisation_is_within_half_a_step() {
        let v = [-1.5, 0.0, 0.3, 2.5];
        let (enc, [lo, hi]) = quantised(&v, 8);
        assert_eq!((lo, hi), (-1.5, 2.5));
        assert_eq!(enc["t"], "u8");
        // 0.3 -> (1.8 / 4) * 255 = 114.75 -> 115.
        assert_eq!(enc["b"], base64(&[0, 96, 115, 255]));
        let (_, r) = quantised(&[2.0, 2.0], 16);
        assert_eq!(r, [1.5, 2.5]);
    }

    #[test]
    fn json_is_safe_in_script_elements() {
        let s = safe_json(&json!({"a": "</script><![CDATA[ & ]]>"}));
        assert!(
            !s.contains('<') && !s.contains('>') && !s.contains('&'),
            "{s}"
        );
        let back: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(back["a"], "</script><![CDATA[ & ]]>");
    }

    /// A value as the browser test compares it: a number, or `"NaN"`, `"Infinity"`,
    /// `"-Infinity"`, `"-0"` (JSON has none of these).
    fn plain(x: f64) -> Value {
        if x.is_nan() {
            json!("NaN")
        } else if x.is_infinite() {
            json!(if x > 0.0 { "Infinity" } else { "-Infinity" })
        } else if x == 0.0 && x.is_sign_negative() {
            json!("-0")
        } else {
            json!(x)
        }
    }

    /// The round-trip cases of the binary array format: every type, odd and empty lengths, the
    /// extremes of each type, negative values, NaN, the infinities, -0 and a subnormal; each with
    /// the values the browser's decoder must give back.
    fn round_trip_cases() -> Value {
        let mut cases = Vec::new();
        let mut int_case = |name: &str, v: &[i64], t: &str| {
            let enc = ints(name, v.iter().copied()).unwrap();
            assert_eq!(enc["t"], t, "{name}");
            cases.push(json!({"name": name, "encoded": enc, "values": v}));
        };
        int_case("u4, odd length", &[0, 15, 7, 1, 9], "u4");
        int_case("u4, empty", &[], "u4");
        int_case("u8", &[0, 255, 16, 128], "u8");
        int_case("u16", &[0, 65_535, 256, 1], "u16");
        int_case(
            "i32, negative and extremes",
            &[-1, i64::from(i32::MIN), i64::from(i32::MAX), 0, -300],
            "i32",
        );
        let f = [
            1.5,
            -2.25,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            1e-40,
            f64::from(f32::MAX),
            0.1,
        ];
        // Each value as f32 gives it back (0.1 as the f32 nearest it).
        let back: Vec<Value> = f.iter().map(|&x| plain(f64::from(x as f32))).collect();
        cases.push(json!({"name": "f32, non-finite, -0, subnormal", "encoded": floats(f.iter().copied()), "values": back}));
        cases.push(json!({"name": "f32, empty", "encoded": floats([].into_iter()), "values": []}));
        for bits in [4u32, 8, 16] {
            let (enc, r) = quantised(&[-1.5, 0.0, 0.3, 2.5, 1.0], bits);
            let top = f64::from((1u32 << bits) - 1);
            let codes: Vec<f64> = [-1.5, 0.0, 0.3, 2.5, 1.0]
                .iter()
                .map(|x| ((x - r[0]) / (r[1] - r[0]) * top).round())
                .collect();
            cases.push(
                json!({"name": format!("quantised, {bits} bits"), "encoded": enc, "values": codes}),
            );
        }
        json!({
            "about": "Binary arrays encoded by crates/viz/src/interactive/encode.rs, with the values interactive.js must decode (python/tests/test_viz.py checks them in chromium; this file is checked by encode.rs's test `the_round_trip_fixture_is_the_encoders_output`, HYPERLENS_BLESS=1 rewrites it).",
            "cases": cases,
        })
    }

    #[test]
    fn the_round_trip_fixture_is_the_encoders_output() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/binary_arrays.json");
        let text = serde_json::to_string_pretty(&round_trip_cases()).unwrap() + "\n";
        if std::env::var_os("HYPERLENS_BLESS").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            committed,
            text,
            "{} is stale: HYPERLENS_BLESS=1 rewrites it",
            path.display()
        );
    }

    #[test]
    fn array_types_name_their_bytes() {
        let all = [
            ArrayType::U4,
            ArrayType::U8,
            ArrayType::U16,
            ArrayType::I32,
            ArrayType::F32,
        ];
        let lens: Vec<usize> = all.iter().map(|t| t.byte_len(3)).collect();
        assert_eq!(lens, [2, 3, 6, 12, 12]);
        let names: Vec<&str> = all.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["u4", "u8", "u16", "i32", "f32"]);
        let v = floats([1.0, f64::NAN].into_iter());
        assert_eq!(v["t"], "f32");
        let mut b = 1f32.to_le_bytes().to_vec();
        b.extend(f32::NAN.to_le_bytes());
        assert_eq!(v["b"], base64(&b));
    }
}
