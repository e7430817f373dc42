//! The eight SRAVEN rules (docs/spec/sraven.md, "Rules").

use std::fmt;
use std::str::FromStr;

use rand::Rng;

use crate::error::{Result, TasksError};

/// One SRAVEN rule. The discriminant order is the index order of `docs/spec/sraven.md`; labels, splits and
/// plots use it, so never reorder.
///
/// Source: Schug et al. 2024 ("Attention as a Hypernetwork"), appendix on SRAVEN, and the authors'
/// released generator (`hyla/data/raven.py`), whose rule tuple has this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// Every row is `(c, c, c)`.
    Constant,
    /// Every row is `(s, s+1, s+2)` mod M.
    ProgressionPlus1,
    /// Every row is `(s, s+2, s+4)` mod M.
    ProgressionPlus2,
    /// Every row is `(s, s-1, s-2)` mod M.
    ProgressionMinus1,
    /// Every row is `(s, s-2, s-4)` mod M.
    ProgressionMinus2,
    /// Every row is `(a, b, a+b)` mod M.
    Addition,
    /// Every row is `(a, b, a-b)` mod M.
    Subtraction,
    /// Three distinct symbols drawn once per grid; every row is an independent permutation of them.
    DistributeThree,
}

impl Rule {
    /// The number of rules, R = 8.
    pub const COUNT: usize = 8;

    /// All rules in index order.
    pub const ALL: [Rule; 8] = [
        Rule::Constant,
        Rule::ProgressionPlus1,
        Rule::ProgressionPlus2,
        Rule::ProgressionMinus1,
        Rule::ProgressionMinus2,
        Rule::Addition,
        Rule::Subtraction,
        Rule::DistributeThree,
    ];

    /// The rule's index (0..8) in the order of `docs/spec/sraven.md`.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The rule with index `i`.
    ///
    /// # Errors
    /// [`TasksError::UnknownVariant`] if `i >= 8`.
    pub fn from_index(i: usize) -> Result<Rule> {
        Rule::ALL
            .get(i)
            .copied()
            .ok_or_else(|| TasksError::UnknownVariant {
                what: "rule index",
                value: i.to_string(),
                valid: "0..=7".to_string(),
            })
    }

    /// The rule's name as written in the spec: "constant", "progression +1", "progression +2",
    /// "progression -1", "progression -2", "addition", "subtraction", "distribute-three".
    pub fn name(self) -> &'static str {
        match self {
            Rule::Constant => "constant",
            Rule::ProgressionPlus1 => "progression +1",
            Rule::ProgressionPlus2 => "progression +2",
            Rule::ProgressionMinus1 => "progression -1",
            Rule::ProgressionMinus2 => "progression -2",
            Rule::Addition => "addition",
            Rule::Subtraction => "subtraction",
            Rule::DistributeThree => "distribute-three",
        }
    }

    /// The step of a progression rule (+1, +2, -1, -2), `None` for the other rules.
    pub fn progression_step(self) -> Option<i64> {
        match self {
            Rule::ProgressionPlus1 => Some(1),
            Rule::ProgressionPlus2 => Some(2),
            Rule::ProgressionMinus1 => Some(-1),
            Rule::ProgressionMinus2 => Some(-2),
            _ => None,
        }
    }

    /// The third value of a row whose first two values are `a`, `b`, for the row-wise deterministic
    /// rules (constant, progressions, addition, subtraction), values mod `m`.
    ///
    /// Returns `None` when `(a, b)` cannot start a row of this rule (e.g. `a != b` for constant, or
    /// `b != a + step` for a progression), and always `None` for distribute-three, whose completion
    /// depends on the other rows.
    pub fn complete_row(self, a: u8, b: u8, m: usize) -> Option<u8> {
        let m = m as i64;
        let (a, b) = (a as i64, b as i64);
        let third = match self {
            Rule::Constant => (a == b).then_some(a)?,
            Rule::Addition => a + b,
            Rule::Subtraction => a - b,
            Rule::DistributeThree => return None,
            _ => {
                let d = self.progression_step()?;
                if (b - a - d).rem_euclid(m) != 0 {
                    return None;
                }
                a + 2 * d
            }
        };
        Some(third.rem_euclid(m) as u8)
    }

    /// Samples one feature's 3x3 grid for this rule into `out` (row-major: `out[3 * row + col]`),
    /// values in `0..m`. Rows are independent draws; distribute-three draws 3 distinct symbols once
    /// per grid and permutes them independently in every row (docs/spec/sraven.md, "Rules").
    ///
    /// `m` must be at least 3 (checked by `SravenParams::check`).
    pub(crate) fn sample_grid<R: Rng + ?Sized>(self, m: usize, rng: &mut R, out: &mut [u8; 9]) {
        let mm = m as i64;
        match self {
            Rule::DistributeThree => {
                let a = rng.gen_range(0..m);
                let mut b = rng.gen_range(0..m - 1);
                if b >= a {
                    b += 1;
                }
                let (lo, hi) = if a < b { (a, b) } else { (b, a) };
                let mut c = rng.gen_range(0..m - 2);
                if c >= lo {
                    c += 1;
                }
                if c >= hi {
                    c += 1;
                }
                let sym = [a as u8, b as u8, c as u8];
                const PERMS: [[usize; 3]; 6] = [
                    [0, 1, 2],
                    [0, 2, 1],
                    [1, 0, 2],
                    [1, 2, 0],
                    [2, 0, 1],
                    [2, 1, 0],
                ];
                for row in 0..3 {
                    let p = PERMS[rng.gen_range(0..6)];
                    for col in 0..3 {
                        out[3 * row + col] = sym[p[col]];
                    }
                }
            }
            Rule::Addition | Rule::Subtraction => {
                for row in 0..3 {
                    let a = rng.gen_range(0..m) as i64;
                    let b = rng.gen_range(0..m) as i64;
                    let c = if self == Rule::Addition { a + b } else { a - b };
                    out[3 * row] = a as u8;
                    out[3 * row + 1] = b as u8;
                    out[3 * row + 2] = c.rem_euclid(mm) as u8;
                }
            }
            _ => {
                let d = self.progression_step().unwrap_or(0);
                for row in 0..3 {
                    let s = rng.gen_range(0..m) as i64;
                    for col in 0..3 {
                        out[3 * row + col] = (s + d * col as i64).rem_euclid(mm) as u8;
                    }
                }
            }
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Rule {
    type Err = TasksError;

    /// Parses a rule name ("constant", "progression +1", ..., as printed by [`Rule::name`]) or an
    /// index "0".."7".
    fn from_str(s: &str) -> Result<Rule> {
        let t = s.trim();
        if let Ok(i) = t.parse::<usize>() {
            return Rule::from_index(i);
        }
        Rule::ALL
            .iter()
            .copied()
            .find(|r| r.name() == t)
            .ok_or_else(|| TasksError::UnknownVariant {
                what: "rule",
                value: s.to_string(),
                valid: Rule::ALL
                    .iter()
                    .map(|r| r.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn index_roundtrip_and_names() {
        for (i, r) in Rule::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
            assert_eq!(Rule::from_index(i).unwrap(), *r);
            assert_eq!(r.name().parse::<Rule>().unwrap(), *r);
        }
        assert!(Rule::from_index(8).is_err());
        assert_eq!(Rule::ALL[7].name(), "distribute-three");
        assert_eq!(Rule::ALL[2].name(), "progression +2");
    }

    #[test]
    fn spec_example_rows_complete() {
        // docs/spec/sraven.md examples: addition [3,2,5] [4,7,3]; subtraction [7,6,1] [3,5,6].
        assert_eq!(Rule::Addition.complete_row(3, 2, 8), Some(5));
        assert_eq!(Rule::Addition.complete_row(4, 7, 8), Some(3));
        assert_eq!(Rule::Subtraction.complete_row(7, 6, 8), Some(1));
        assert_eq!(Rule::Subtraction.complete_row(3, 5, 8), Some(6));
        assert_eq!(Rule::ProgressionMinus2.complete_row(1, 7, 8), Some(5));
        assert_eq!(Rule::ProgressionPlus1.complete_row(1, 3, 8), None);
        assert_eq!(Rule::Constant.complete_row(2, 2, 8), Some(2));
        assert_eq!(Rule::Constant.complete_row(2, 3, 8), None);
    }

    #[test]
    fn sampled_grids_follow_their_rule() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let m = 13;
        let mut g = [0u8; 9];
        for _ in 0..200 {
            for r in Rule::ALL {
                r.sample_grid(m, &mut rng, &mut g);
                assert!(g.iter().all(|&v| (v as usize) < m));
                if r == Rule::DistributeThree {
                    let mut first: Vec<u8> = g[0..3].to_vec();
                    first.sort_unstable();
                    assert!(first[0] < first[1] && first[1] < first[2]);
                    for row in 1..3 {
                        let mut s: Vec<u8> = g[3 * row..3 * row + 3].to_vec();
                        s.sort_unstable();
                        assert_eq!(s, first);
                    }
                } else {
                    for row in 0..3 {
                        assert_eq!(
                            r.complete_row(g[3 * row], g[3 * row + 1], m),
                            Some(g[3 * row + 2])
                        );
                    }
                }
            }
        }
    }
}
