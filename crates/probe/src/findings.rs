//! The headline numbers of the interventions, as `hyperlens patch` prints them: the head that
//! restores most of the logit difference, the head that writes most of the answer logit, the head
//! whose ablation costs most accuracy, and the transplant's per-layer shares.

use crate::ablation::{AblationReport, HeadAblation};
use crate::patching::{DlaReport, PatchingReport};
use crate::transplant::{TransplantKind, TransplantRow};

/// One head and a value of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadValue {
    /// The layer.
    pub layer: usize,
    /// The head.
    pub head: usize,
    /// The value.
    pub value: f64,
}

/// The largest entry of a `[layer, head]` grid (the first of equal ones; `None` when empty).
///
/// # Shapes
/// `grid [L, H]`.
fn largest(grid: &ndarray::Array2<f64>) -> Option<HeadValue> {
    grid.indexed_iter()
        .max_by(|x, y| x.1.total_cmp(y.1))
        .map(|((layer, head), &value)| HeadValue { layer, head, value })
}

impl PatchingReport {
    /// The head whose output, patched in, restores the largest fraction of the logit difference.
    pub fn best_head(&self) -> Option<HeadValue> {
        largest(&self.head_out)
    }
}

impl DlaReport {
    /// The head that writes most of the answer logit above the mean logit (centred attribution).
    pub fn top_head(&self) -> Option<HeadValue> {
        largest(&self.heads_centred)
    }
}

impl AblationReport {
    /// The head whose ablation leaves the lowest accuracy.
    pub fn largest_drop(&self) -> Option<&HeadAblation> {
        self.heads
            .iter()
            .min_by(|x, y| x.accuracy.total_cmp(&y.accuracy))
    }
}

/// One line of the transplant's summary: a layer's transplant of the mean ID code or of a donor
/// problem's code.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransplantLine<'a> {
    /// The row.
    pub row: &'a TransplantRow,
    /// The share of the changed answers that are the donor rule's, in percent (`None` when no
    /// answer changed).
    pub donor_share: Option<f64>,
}

/// The transplant's summary: the rows of the two transplants (the mean ID code, a donor problem's
/// code) with their donor share, the share expected by chance (`100 / (values - 1)` percent:
/// a changed answer is one of the other values), and the identity transplant's largest logit
/// change (0 without one).
#[derive(Debug, Clone, PartialEq)]
pub struct TransplantSummary<'a> {
    /// The transplants' rows, in order.
    pub lines: Vec<TransplantLine<'a>>,
    /// The donor share by chance, in percent.
    pub chance: f64,
    /// The identity transplant's largest logit change.
    pub identity_max_change: f64,
}

impl<'a> TransplantSummary<'a> {
    /// The summary of `rows` for a model with `values` values per feature (its `d_in`).
    pub fn new(rows: &'a [TransplantRow], values: usize) -> TransplantSummary<'a> {
        let lines = rows
            .iter()
            .filter(|r| {
                matches!(
                    r.kind,
                    TransplantKind::MeanId | TransplantKind::DonorProblem
                )
            })
            .map(|row| {
                let changed = row.to_donor + row.elsewhere;
                TransplantLine {
                    row,
                    donor_share: (changed > 0)
                        .then(|| 100.0 * row.to_donor as f64 / changed as f64),
                }
            })
            .collect();
        let identity_max_change = rows
            .iter()
            .filter(|r| r.kind == TransplantKind::Identity)
            .fold(0.0f64, |m, r| m.max(r.max_logit_change));
        TransplantSummary {
            lines,
            chance: 100.0 / (values as f64 - 1.0),
            identity_max_change,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn the_largest_head_is_found_by_layer_and_head() {
        let v = largest(&array![[0.1, 0.5], [0.9, -2.0]]).unwrap();
        assert_eq!((v.layer, v.head, v.value), (1, 0, 0.9));
        assert!(largest(&ndarray::Array2::zeros((0, 3))).is_none());
    }

    fn row(layer: usize, kind: TransplantKind, to_donor: usize, elsewhere: usize) -> TransplantRow {
        TransplantRow {
            layer,
            kind,
            n: 10,
            to_donor,
            elsewhere,
            unchanged: 10 - to_donor - elsewhere,
            excluded: 0,
            max_logit_change: layer as f64 * 0.5,
        }
    }

    #[test]
    fn the_transplant_summary_keeps_the_two_transplants_and_the_identity_maximum() {
        let rows = vec![
            row(0, TransplantKind::MeanId, 3, 1),
            row(0, TransplantKind::Identity, 0, 0),
            row(1, TransplantKind::DonorProblem, 0, 0),
            row(2, TransplantKind::Identity, 0, 0),
        ];
        let s = TransplantSummary::new(&rows, 9);
        assert_eq!(s.lines.len(), 2);
        assert_eq!(s.lines[0].donor_share, Some(75.0));
        assert_eq!(s.lines[1].donor_share, None);
        assert_eq!(s.chance, 12.5);
        assert_eq!(s.identity_max_change, 1.0);
    }
}
