//! Formatting shared by every section's sentences: percentages, counts, thousands separators,
//! Markdown escaping and the number of updates trained.

use crate::discover::Steps;

/// A fraction as a percentage with one decimal (`37.3 %`); `-` for NaN.
pub fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1} %", 100.0 * x)
    } else {
        "-".to_string()
    }
}

/// An integer with thousands separators (`156,250`).
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `n` and the noun, plural unless `n` is 1 (`1 checkpoint`, `6 checkpoints`).
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Escapes the characters that Markdown would read as markup in text the report did not write
/// (checkpoint names): `\ ` `` ` `` `*` `_` `[` `]` `<` `>` `|` `#`.
pub fn md_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(
            c,
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `45,000 of 50,000` for a run stopped before the end of its schedule, or `50,000`; `?` when not
/// recorded.
pub(crate) fn steps_text(steps: Option<Steps>) -> String {
    match steps {
        None => "?".into(),
        Some(s) => match s.planned.filter(|&p| p > s.done) {
            Some(p) => format!("{} of {}", thousands(s.done), thousands(p)),
            None => thousands(s.done),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(156_250), "156,250");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
        assert_eq!(count(1, "checkpoint"), "1 checkpoint");
        assert_eq!(count(6, "checkpoint"), "6 checkpoints");
        assert_eq!(pct(0.3733), "37.3 %");
        assert_eq!(pct(f64::NAN), "-");
        assert_eq!(md_escape("a_b*[c]|d"), "a\\_b\\*\\[c\\]\\|d");
        assert_eq!(md_escape("paper-jax-hyla-seed2"), "paper-jax-hyla-seed2");
    }
}
