//! Labels of SRAVEN token positions, for tables and figures.

/// Token labels of a SRAVEN sequence of `n_tokens` tokens with `features` feature slots per panel:
/// `P{panel}s{slot}` for the context tokens, `Q{slot}` for the `features` query tokens
/// (docs/spec/sraven.md, "Tokens, targets, metrics"). The one label scheme of token positions:
/// the report's tables and figures, `hyperlens patch`'s figures.
///
/// # Shapes
/// Returns `[n_tokens]`.
pub fn token_labels(n_tokens: usize, features: usize) -> Vec<String> {
    let f = features.max(1);
    let n_ctx = n_tokens.saturating_sub(features);
    (0..n_tokens)
        .map(|t| {
            if t < n_ctx {
                format!("P{}s{}", t / f, t % f)
            } else {
                format!("Q{}", t - n_ctx)
            }
        })
        .collect()
}

/// Tick labels of a SRAVEN sequence, one per panel: `P{panel}` for the context panels, `Q` for
/// the query tokens, repeated over the panel's `features` slots (the figure labels each group
/// once).
///
/// # Shapes
/// Returns `[n_tokens]`.
pub fn panel_labels(n_tokens: usize, features: usize) -> Vec<String> {
    let f = features.max(1);
    let n_ctx = n_tokens.saturating_sub(features);
    (0..n_tokens)
        .map(|t| {
            if t < n_ctx {
                format!("P{}", t / f)
            } else {
                "Q".to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_panels_slots_and_queries() {
        let l = token_labels(36, 4);
        assert_eq!(l.len(), 36);
        assert_eq!((l[0].as_str(), l[27].as_str()), ("P0s0", "P6s3"));
        assert_eq!(
            (l[31].as_str(), l[32].as_str(), l[35].as_str()),
            ("P7s3", "Q0", "Q3")
        );
        let l = token_labels(10, 1);
        assert_eq!((l[8].as_str(), l[9].as_str()), ("P8s0", "Q0"));
        let p = panel_labels(36, 4);
        assert_eq!(
            (p[0].as_str(), p[5].as_str(), p[31].as_str()),
            ("P0", "P1", "P7")
        );
        assert!(p[32..].iter().all(|s| s == "Q"));
    }
}
