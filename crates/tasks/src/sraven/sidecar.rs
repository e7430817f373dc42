//! The JSON sidecar of a SRAVEN problem file (`hyperlens tasks sample --out p.npz` writes
//! `p.json`): what produced the problems, how to sample them again, and their ambiguity rates.
//!
//! The fields are declared in alphabetical order, the order in which the file has always had its
//! keys, so that it stays byte for byte what it was.

use serde::{Deserialize, Serialize};

use super::{ProblemSet, Set, SplitName, SravenParams};
use crate::ambiguity::{ambiguity_rate, Criterion};
use crate::error::Result;

/// The ambiguity rates of a sampled set ([`ambiguity_rate`]), as fractions of its problems.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SidecarAmbiguity {
    /// [`Criterion::AnswerDiffers`]: another consistent rule assignment changes the answer.
    pub answer_differs: f64,
    /// [`Criterion::EveryFeatureDiffers`]: the reference code's count.
    pub every_feature_differs: f64,
}

/// The arrays of a SRAVEN problem file, with their dtypes and shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SravenSidecarArrays {
    /// `perms`.
    pub perms: String,
    /// `rules`.
    pub rules: String,
    /// `x`.
    pub x: String,
    /// `y`.
    pub y: String,
}

/// The sizes of the problems ([`SravenParams`]) with the sidecar's key order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SravenSidecarParams {
    /// F: features per panel.
    pub features: usize,
    /// Grid side.
    pub grid: usize,
    /// Fraction of the tasks held out.
    pub holdout_fraction: f64,
    /// M: values per feature.
    pub values: usize,
}

impl From<SravenParams> for SravenSidecarParams {
    fn from(p: SravenParams) -> Self {
        Self {
            features: p.features,
            grid: p.grid,
            holdout_fraction: p.holdout_fraction,
            values: p.values,
        }
    }
}

impl From<SravenSidecarParams> for SravenParams {
    fn from(p: SravenSidecarParams) -> Self {
        Self {
            features: p.features,
            values: p.values,
            grid: p.grid,
            holdout_fraction: p.holdout_fraction,
        }
    }
}

/// The JSON sidecar of a SRAVEN problem file written by `hyperlens tasks sample`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SravenSetSidecar {
    /// The set's ambiguity rates.
    pub ambiguity: SidecarAmbiguity,
    /// What each array holds.
    pub arrays: SravenSidecarArrays,
    /// Problems.
    pub n: usize,
    /// The problems' sizes.
    pub params: SravenSidecarParams,
    /// `hyperlens {version} tasks sample`.
    pub producer: String,
    /// Seed of the evaluation stream.
    pub seed: u64,
    /// The set sampled.
    pub set: Set,
    /// The split.
    pub split: SplitName,
    /// The task's name, `sraven`.
    pub task: String,
    /// Whether the features were left unpermuted.
    pub unpermuted: bool,
}

impl SravenSetSidecar {
    /// The sidecar of `problems`, sampled from set `set` of split `split` with seed `seed`
    /// (`unpermuted`: identity feature permutations) by `producer`; its ambiguity rates are
    /// measured here ([`ambiguity_rate`] under both criteria).
    ///
    /// # Errors
    /// As [`ambiguity_rate`] (problems inconsistent with their sizes).
    pub fn new(
        problems: &ProblemSet,
        split: SplitName,
        set: Set,
        seed: u64,
        unpermuted: bool,
        producer: String,
    ) -> Result<Self> {
        let s = |t: &str| t.to_string();
        Ok(Self {
            ambiguity: SidecarAmbiguity {
                answer_differs: ambiguity_rate(problems, Criterion::AnswerDiffers)?,
                every_feature_differs: ambiguity_rate(problems, Criterion::EveryFeatureDiffers)?,
            },
            arrays: SravenSidecarArrays {
                perms: s("int64 [N, 3, F]"),
                rules: s("int64 [N, F]"),
                x: s("uint8 [N, T, M]"),
                y: s("int64 [N, F]"),
            },
            n: problems.len(),
            params: problems.params.into(),
            producer,
            seed,
            set,
            split,
            task: s("sraven"),
            unpermuted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sraven::{sample, Split};

    #[test]
    fn the_sidecar_has_the_files_keys_in_order_and_reads_back() {
        let split = Split::named("paper-seed2").unwrap();
        let problems = sample(&split, Set::Ood, 40, 5, true).unwrap();
        let side =
            SravenSetSidecar::new(&problems, split.name, Set::Ood, 5, true, "x".into()).unwrap();
        let text = serde_json::to_string(&side).unwrap();
        // The file as the former `json!` wrote it: every object's keys sorted.
        let sorted = serde_json::to_string(&serde_json::to_value(&side).unwrap()).unwrap();
        assert_eq!(text, sorted);
        assert!(
            text.contains(r#""set":"ood","split":"paper-seed2","task":"sraven""#),
            "{text}"
        );
        assert!(
            text.contains(r#""params":{"features":4,"grid":3,"holdout_fraction":0.25,"values":8}"#)
        );
        let rate = ambiguity_rate(&problems, Criterion::AnswerDiffers).unwrap();
        assert_eq!(side.ambiguity.answer_differs, rate);
        assert_eq!(side.n, 40);
        let back: SravenSetSidecar = serde_json::from_str(&text).unwrap();
        assert_eq!(back, side);
        assert_eq!(SravenParams::from(back.params), problems.params);
    }
}
