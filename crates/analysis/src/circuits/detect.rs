//! Head detection from attention patterns: previous-token, duplicate-token and induction scores.
//!
//! Source: TransformerLens `head_detector` (`get_previous_token_head_detection_pattern`,
//! `get_duplicate_token_head_detection_pattern`, `get_induction_head_detection_pattern`,
//! `compute_head_attention_similarity_score`); Elhage et al. (2021) and Olsson et al. (2022) for the
//! repeated-random-tokens induction score; `docs/spec/circuits.md`.
//!
//! Differences from TransformerLens, on purpose:
//! - the caller's pattern is never modified (TransformerLens' "mul" mode zeroed the BOS column and
//!   the diagonal of the cached pattern in place);
//! - a list of prompts honours every option (TransformerLens dropped `exclude_bos`,
//!   `exclude_current_token` and `error_measure` for lists) and averages the per-prompt scores;
//! - "abs" scores are not rounded to 3 decimals;
//! - a zero attention mass in "mul" mode gives score 0 (TransformerLens: NaN).

use std::fmt;
use std::str::FromStr;

use ndarray::{s, Array2, ArrayBase, ArrayView2, Data, Ix2, Ix4, Ix5};

use super::Real;
use crate::error::{AnalysisError, Result};

/// The pattern a head is compared with.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadPattern {
    /// `P[i, i-1] = 1`: attend to the previous token.
    PreviousToken,
    /// `P[i, j] = 1` iff `token_i == token_j` and `j < i`: attend to earlier copies of the token.
    DuplicateToken,
    /// `P[i, j+1] = 1` iff `token_i == token_j` and `j < i`: attend to the token after an earlier copy.
    Induction,
    /// A caller-supplied pattern [seq, seq] (TransformerLens accepts a tensor too).
    Custom(Array2<f64>),
}

impl HeadPattern {
    /// CLI / file name: `previous-token`, `duplicate-token`, `induction` or `custom`.
    pub fn name(&self) -> &'static str {
        match self {
            HeadPattern::PreviousToken => "previous-token",
            HeadPattern::DuplicateToken => "duplicate-token",
            HeadPattern::Induction => "induction",
            HeadPattern::Custom(_) => "custom",
        }
    }
}

impl FromStr for HeadPattern {
    type Err = AnalysisError;

    /// Parses `previous-token`, `duplicate-token` or `induction` (underscores accepted).
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "previous-token" => Ok(HeadPattern::PreviousToken),
            "duplicate-token" => Ok(HeadPattern::DuplicateToken),
            "induction" => Ok(HeadPattern::Induction),
            other => Err(AnalysisError::InvalidInput(format!(
                "unknown head pattern {other:?} (expected previous-token, duplicate-token or induction)"
            ))),
        }
    }
}

/// How an attention pattern `A` [seq, seq] is compared with a detection pattern `P`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorMeasure {
    /// `sum(A * P) / sum(A)`: the share of attention mass on the pattern (TransformerLens default).
    #[default]
    Mul,
    /// `1 - sum|A - P| / seq_len`; requires a lower-triangular `P`.
    Abs,
}

impl fmt::Display for ErrorMeasure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorMeasure::Mul => "mul",
            ErrorMeasure::Abs => "abs",
        })
    }
}

impl FromStr for ErrorMeasure {
    type Err = AnalysisError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "mul" => Ok(ErrorMeasure::Mul),
            "abs" => Ok(ErrorMeasure::Abs),
            other => Err(AnalysisError::InvalidInput(format!(
                "unknown error measure {other:?} (expected mul or abs)"
            ))),
        }
    }
}

/// Options of the head scores (TransformerLens `detect_head` keyword arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DetectOptions {
    /// Comparison measure.
    pub measure: ErrorMeasure,
    /// Ignore attention to position 0 (the BOS token): column 0 is zeroed in a copy.
    pub exclude_bos: bool,
    /// Ignore attention of each token to itself: the diagonal is zeroed in a copy.
    pub exclude_current_token: bool,
}

/// The detection pattern of a token sequence, as in TransformerLens.
///
/// # Shapes
/// `tokens` `[seq]` -> [seq (query), seq (key)], entries 0/1 (or the custom pattern, checked to be
/// [seq, seq]).
///
/// # Errors
/// [`AnalysisError::Shape`] if a custom pattern is not [seq, seq].
pub fn detection_pattern<T: PartialEq>(kind: &HeadPattern, tokens: &[T]) -> Result<Array2<f64>> {
    let n = tokens.len();
    let p = match kind {
        HeadPattern::PreviousToken => {
            Array2::from_shape_fn(
                (n, n),
                |(i, j)| if i >= 1 && j == i - 1 { 1.0 } else { 0.0 },
            )
        }
        HeadPattern::DuplicateToken => Array2::from_shape_fn((n, n), |(i, j)| {
            if j < i && tokens[i] == tokens[j] {
                1.0
            } else {
                0.0
            }
        }),
        HeadPattern::Induction => Array2::from_shape_fn((n, n), |(i, k)| {
            // k = j + 1 with j < i and token_i == token_j.
            if k >= 1 && k <= i && tokens[i] == tokens[k - 1] {
                1.0
            } else {
                0.0
            }
        }),
        HeadPattern::Custom(p) => {
            if p.dim() != (n, n) {
                return Err(AnalysisError::Shape(format!(
                    "custom detection pattern is {:?}, expected [{n}, {n}] for {n} tokens",
                    p.dim()
                )));
            }
            p.clone()
        }
    };
    Ok(p)
}

/// Similarity of one head's attention pattern with a detection pattern
/// (TransformerLens `compute_head_attention_similarity_score`, without its in-place mutation).
///
/// # Shapes
/// `attn` [seq (query), seq (key)], `pattern` [seq, seq].
fn similarity<S: Data>(
    attn: &ArrayBase<S, Ix2>,
    pattern: ArrayView2<f64>,
    opts: &DetectOptions,
) -> f64
where
    S::Elem: Real,
{
    let n = pattern.nrows();
    let keep = |i: usize, j: usize| {
        !((opts.exclude_bos && j == 0) || (opts.exclude_current_token && i == j))
    };
    match opts.measure {
        ErrorMeasure::Mul => {
            let (mut num, mut mass) = (0.0, 0.0);
            for ((i, j), &a) in attn.indexed_iter() {
                if keep(i, j) {
                    let a: f64 = a.into();
                    num += a * pattern[[i, j]];
                    mass += a;
                }
            }
            if mass != 0.0 {
                num / mass
            } else {
                0.0
            }
        }
        ErrorMeasure::Abs => {
            let mut err = 0.0;
            for ((i, j), &a) in attn.indexed_iter() {
                if keep(i, j) {
                    let a: f64 = a.into();
                    err += (a - pattern[[i, j]]).abs();
                }
            }
            1.0 - err / n as f64
        }
    }
}

fn check_abs_pattern(pattern: ArrayView2<f64>, opts: &DetectOptions) -> Result<()> {
    if opts.measure == ErrorMeasure::Abs
        && pattern.indexed_iter().any(|((i, j), &p)| j > i && p != 0.0)
    {
        return Err(AnalysisError::InvalidInput(
            "the \"abs\" error measure needs a lower-triangular detection pattern".into(),
        ));
    }
    Ok(())
}

/// Scores of every head of one sequence against a detection pattern.
///
/// # Shapes
/// `patterns` [layer, head, query, key] (e.g. `blocks.{l}.attn.hook_pattern` of one sequence, query
/// and key over the same `seq` positions), `tokens` `[seq]` -> [layer, head].
///
/// # Errors
/// [`AnalysisError::Shape`] if the pattern is not square or disagrees with `tokens`;
/// [`AnalysisError::InvalidInput`] for an empty sequence or a non-lower-triangular pattern in "abs"
/// mode; [`AnalysisError::NonFinite`] on NaN/inf attention.
pub fn head_scores<S, T>(
    patterns: &ArrayBase<S, Ix4>,
    tokens: &[T],
    kind: &HeadPattern,
    opts: &DetectOptions,
) -> Result<Array2<f64>>
where
    S: Data,
    S::Elem: Real,
    T: PartialEq,
{
    let (nl, nh, q, k) = patterns.dim();
    if q != k || q != tokens.len() {
        return Err(AnalysisError::Shape(format!(
            "attention patterns are [layer, head, query, key] = {:?}, expected query = key = {} tokens",
            patterns.dim(),
            tokens.len()
        )));
    }
    if q == 0 {
        return Err(AnalysisError::InvalidInput("empty token sequence".into()));
    }
    super::linalg::check_finite(patterns, "attention patterns")?;
    let p = detection_pattern(kind, tokens)?;
    check_abs_pattern(p.view(), opts)?;
    Ok(Array2::from_shape_fn((nl, nh), |(l, h)| {
        similarity(&patterns.slice(s![l, h, .., ..]), p.view(), opts)
    }))
}

/// Mean head scores over a batch of equal-length sequences.
///
/// # Shapes
/// `patterns` [batch, layer, head, query, key], `tokens` [batch, seq] -> [layer, head].
///
/// # Errors
/// As [`head_scores`]; [`AnalysisError::Shape`] if the batch sizes disagree;
/// [`AnalysisError::InvalidInput`] for an empty batch.
pub fn head_scores_batch<S, S2, T>(
    patterns: &ArrayBase<S, Ix5>,
    tokens: &ArrayBase<S2, Ix2>,
    kind: &HeadPattern,
    opts: &DetectOptions,
) -> Result<Array2<f64>>
where
    S: Data,
    S::Elem: Real,
    S2: Data<Elem = T>,
    T: PartialEq + Clone,
{
    let b = patterns.dim().0;
    if tokens.nrows() != b {
        return Err(AnalysisError::Shape(format!(
            "patterns have batch {b} but tokens are {:?}",
            tokens.dim()
        )));
    }
    if b == 0 {
        return Err(AnalysisError::InvalidInput("empty batch".into()));
    }
    let mut total = Array2::<f64>::zeros((patterns.dim().1, patterns.dim().2));
    for i in 0..b {
        let toks: Vec<T> = tokens.row(i).to_vec();
        total += &head_scores(&patterns.slice(s![i, .., .., .., ..]), &toks, kind, opts)?;
    }
    Ok(total / b as f64)
}

/// Mean head scores over prompts of possibly different lengths, every option honoured for every
/// prompt (unlike TransformerLens, whose list path dropped them).
///
/// # Shapes
/// Each item: patterns [layer, head, seq_i, seq_i] and tokens `[seq_i]`; all with the same layer and
/// head counts. Returns [layer, head].
///
/// # Errors
/// As [`head_scores`]; [`AnalysisError::Shape`] if the prompts disagree in layers/heads;
/// [`AnalysisError::InvalidInput`] for an empty list.
pub fn head_scores_prompts<S, T>(
    prompts: &[(ArrayBase<S, Ix4>, Vec<T>)],
    kind: &HeadPattern,
    opts: &DetectOptions,
) -> Result<Array2<f64>>
where
    S: Data,
    S::Elem: Real,
    T: PartialEq,
{
    let first = prompts
        .first()
        .ok_or_else(|| AnalysisError::InvalidInput("empty list of prompts".into()))?;
    let (nl, nh, _, _) = first.0.dim();
    let mut total = Array2::<f64>::zeros((nl, nh));
    for (i, (pat, toks)) in prompts.iter().enumerate() {
        if (pat.dim().0, pat.dim().1) != (nl, nh) {
            return Err(AnalysisError::Shape(format!(
                "prompt {i}: patterns {:?} disagree with the first prompt's {nl} layers x {nh} heads",
                pat.dim()
            )));
        }
        total += &head_scores(pat, toks, kind, opts)?;
    }
    Ok(total / prompts.len() as f64)
}

/// Head scores on a random token sequence of length `n` repeated twice (after an optional prefix,
/// e.g. a BOS token), read from attention stripes.
///
/// # Shapes
/// Each array [layer, head]; means over the batch when several sequences are given.
#[derive(Debug, Clone, PartialEq)]
pub struct RepeatedTokenScores {
    /// Mean attention of each second-copy query `p + n + i` to key `p + i + 1` (the token after the
    /// earlier copy): the stripe at offset `-(n - 1)`, `n` entries.
    pub induction: Array2<f64>,
    /// Mean attention of each query `q >= 1` to key `q - 1`: the stripe at offset -1, over the whole
    /// sequence.
    pub previous_token: Array2<f64>,
    /// Mean attention of each second-copy query `p + n + i` to key `p + i` (the earlier copy of the
    /// same token): the stripe at offset `-n`, `n` entries.
    pub duplicate_token: Array2<f64>,
}

/// Stripe scores of repeated random tokens (Olsson et al. 2022, "In-context Learning and Induction
/// Heads"; the ARENA / TransformerLens induction demo). A common cut-off is 0.4 for induction and
/// previous-token heads (`docs/spec/circuits.md`).
///
/// # Shapes
/// `patterns` [batch, layer, head, seq, seq] with `seq = prefix + 2 n`; returns [layer, head] arrays
/// averaged over the batch (pass a single sequence with `insert_axis(Axis(0))`).
///
/// # Errors
/// [`AnalysisError::Shape`] if `seq != prefix + 2 n` or the pattern is not square;
/// [`AnalysisError::InvalidInput`] if `n == 0` or the batch is empty;
/// [`AnalysisError::NonFinite`] on NaN/inf attention.
pub fn repeated_token_scores<S>(
    patterns: &ArrayBase<S, Ix5>,
    n: usize,
    prefix: usize,
) -> Result<RepeatedTokenScores>
where
    S: Data,
    S::Elem: Real,
{
    let (b, nl, nh, q, k) = patterns.dim();
    if n == 0 || b == 0 {
        return Err(AnalysisError::InvalidInput(format!(
            "repeated-token scores need n >= 1 and a non-empty batch (n {n}, batch {b})"
        )));
    }
    if q != k || q != prefix + 2 * n {
        return Err(AnalysisError::Shape(format!(
            "patterns {:?}: expected [batch, layer, head, {s}, {s}] for prefix {prefix} + 2 x {n} tokens",
            patterns.dim(),
            s = prefix + 2 * n
        )));
    }
    super::linalg::check_finite(patterns, "attention patterns")?;
    let stripe = |offset: usize, queries: std::ops::Range<usize>| {
        let count = (queries.len() * b) as f64;
        Array2::from_shape_fn((nl, nh), |(l, h)| {
            let mut sum = 0.0;
            for bi in 0..b {
                for qi in queries.clone() {
                    sum += Into::<f64>::into(patterns[[bi, l, h, qi, qi - offset]]);
                }
            }
            sum / count
        })
    };
    let second = prefix + n..prefix + 2 * n;
    Ok(RepeatedTokenScores {
        induction: stripe(n - 1, second.clone()),
        previous_token: stripe(1, 1..q),
        duplicate_token: stripe(n, second),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn patterns_match_definitions() {
        let toks = [5u32, 7, 5, 7, 9];
        let prev = detection_pattern(&HeadPattern::PreviousToken, &toks).unwrap();
        assert_eq!(prev.sum(), 4.0);
        assert_eq!(prev[[3, 2]], 1.0);
        let dup = detection_pattern(&HeadPattern::DuplicateToken, &toks).unwrap();
        assert_eq!(dup, {
            let mut d = Array2::zeros((5, 5));
            d[[2, 0]] = 1.0;
            d[[3, 1]] = 1.0;
            d
        });
        let ind = detection_pattern(&HeadPattern::Induction, &toks).unwrap();
        let mut e = Array2::zeros((5, 5));
        e[[2, 1]] = 1.0;
        e[[3, 2]] = 1.0;
        assert_eq!(ind, e);
    }

    #[test]
    fn options_and_measures() {
        // One layer, one head, 3 tokens, uniform causal attention.
        let a = array![[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]];
        let pats = a.clone().into_shape_with_order((1, 1, 3, 3)).unwrap();
        let toks = [1, 2, 3];
        let mul = head_scores(
            &pats,
            &toks,
            &HeadPattern::PreviousToken,
            &DetectOptions::default(),
        )
        .unwrap();
        assert!((mul[[0, 0]] - 0.75 / 3.0).abs() < 1e-15);
        let opts = DetectOptions {
            exclude_bos: true,
            exclude_current_token: true,
            ..Default::default()
        };
        let s = head_scores(&pats, &toks, &HeadPattern::PreviousToken, &opts).unwrap();
        // Only entry [2, 1] = 0.25 survives, and it is on the pattern.
        assert!((s[[0, 0]] - 1.0).abs() < 1e-15);
        let abs = DetectOptions {
            measure: ErrorMeasure::Abs,
            ..Default::default()
        };
        let s = head_scores(&pats, &toks, &HeadPattern::PreviousToken, &abs).unwrap();
        // |A - P| sums to 1 + (0.5 + 0.5) + (0.25 + 0.75 + 0.5) = 3.5.
        assert!((s[[0, 0]] - (1.0 - 3.5 / 3.0)).abs() < 1e-15);
        let upper = HeadPattern::Custom(array![[0.0, 1.0, 0.0], [0.0; 3], [0.0; 3]]);
        assert!(head_scores(&pats, &toks, &upper, &abs).is_err());
        assert!(head_scores(&pats, &toks[..2], &HeadPattern::Induction, &abs).is_err());
    }

    #[test]
    fn parse_names() {
        assert_eq!(
            "induction".parse::<HeadPattern>().unwrap(),
            HeadPattern::Induction
        );
        assert_eq!(
            "previous_token".parse::<HeadPattern>().unwrap(),
            HeadPattern::PreviousToken
        );
        assert_eq!("abs".parse::<ErrorMeasure>().unwrap(), ErrorMeasure::Abs);
        assert!("l1".parse::<ErrorMeasure>().is_err());
    }
}
