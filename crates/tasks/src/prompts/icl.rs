//! The `icl` generator: few-shot in-context operations on ordered domains, the language-model
//! analogue of SRAVEN (an operation is a rule, a domain its values), in the prompt format of the
//! function-vector papers (Todd et al. 2024, "Function vectors in large language models": `Q: x`
//! / `A: y` demonstrations separated by blank lines).

use std::fmt;

use rand::seq::SliceRandom;
use rand::Rng;

use super::format::{Prompt, PromptSet, Segment};
use super::holdout::{apply_hold_out, hold_out_combinations, DEFAULT_HOLD_OUT};
use super::sites::SiteSpec;
use crate::error::{Result, TasksError};
use crate::rng::{self, Domain};

/// The recommended sites of an `icl` set: the answer position (the final `A:`'s last token) as
/// the query, the demonstrations' outputs and the test input as the keys.
pub const ICL_SITES: &str = "query: last; keys: demo_output, query_input";

/// An operation: the answer is the input's value `offset` places further in its domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    /// The input itself (offset 0).
    Copy,
    /// The next value (+1).
    Next,
    /// The previous value (-1).
    Previous,
    /// Skip one forward (+2).
    SkipForward,
    /// Skip one back (-2).
    SkipBack,
}

impl Operation {
    /// The five operations.
    pub const ALL: [Operation; 5] = [
        Operation::Copy,
        Operation::Next,
        Operation::Previous,
        Operation::SkipForward,
        Operation::SkipBack,
    ];

    /// The label value: `copy`, `next`, `previous`, `skip_forward`, `skip_back`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Copy => "copy",
            Operation::Next => "next",
            Operation::Previous => "previous",
            Operation::SkipForward => "skip_forward",
            Operation::SkipBack => "skip_back",
        }
    }

    /// How many places the answer is from the input: 0, +1, -1, +2, -2.
    pub fn offset(self) -> i64 {
        match self {
            Operation::Copy => 0,
            Operation::Next => 1,
            Operation::Previous => -1,
            Operation::SkipForward => 2,
            Operation::SkipBack => -2,
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const LOWER: [&str; 26] = [
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s",
    "t", "u", "v", "w", "x", "y", "z",
];
const UPPER: [&str; 26] = [
    "A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P", "Q", "R", "S",
    "T", "U", "V", "W", "X", "Y", "Z",
];
const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
const NUMBER_WORDS: [&str; 20] = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// An ordered domain of values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IclDomain {
    /// `a` .. `z`.
    Lower,
    /// `A` .. `Z`.
    Upper,
    /// `0` .. `9`.
    Digits,
    /// `one` .. `twenty`.
    NumberWords,
    /// `Monday` .. `Sunday`.
    Weekdays,
    /// `January` .. `December`.
    Months,
}

impl IclDomain {
    /// The six domains.
    pub const ALL: [IclDomain; 6] = [
        IclDomain::Lower,
        IclDomain::Upper,
        IclDomain::Digits,
        IclDomain::NumberWords,
        IclDomain::Weekdays,
        IclDomain::Months,
    ];

    /// The label value: `lower`, `upper`, `digits`, `number_words`, `weekdays`, `months`.
    pub fn as_str(self) -> &'static str {
        match self {
            IclDomain::Lower => "lower",
            IclDomain::Upper => "upper",
            IclDomain::Digits => "digits",
            IclDomain::NumberWords => "number_words",
            IclDomain::Weekdays => "weekdays",
            IclDomain::Months => "months",
        }
    }

    /// The domain's values, in order.
    pub fn values(self) -> &'static [&'static str] {
        match self {
            IclDomain::Lower => &LOWER,
            IclDomain::Upper => &UPPER,
            IclDomain::Digits => &DIGITS,
            IclDomain::NumberWords => &NUMBER_WORDS,
            IclDomain::Weekdays => &WEEKDAYS,
            IclDomain::Months => &MONTHS,
        }
    }

    /// The indices of the inputs whose answer under `op` exists without wrapping.
    pub fn valid_inputs(self, op: Operation) -> Vec<usize> {
        let n = self.values().len() as i64;
        (0..n)
            .filter(|i| (0..n).contains(&(i + op.offset())))
            .map(|i| i as usize)
            .collect()
    }
}

impl fmt::Display for IclDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parameters of [`icl`].
#[derive(Debug, Clone, PartialEq)]
pub struct IclParams {
    /// Number of prompts (they cycle through the operation x domain combinations).
    pub n: usize,
    /// Seed of the prompts and of the held-out combinations.
    pub seed: u64,
    /// Demonstrations per prompt.
    pub shots: usize,
    /// Fraction of the operation x domain combinations held out (in `[0, 1)`).
    pub hold_out: f64,
}

impl Default for IclParams {
    fn default() -> Self {
        IclParams {
            n: 300,
            seed: 0,
            shots: 5,
            hold_out: DEFAULT_HOLD_OUT,
        }
    }
}

/// `op` applied to value `i` of `domain` (`i + offset` is in range: the caller picked `i` among
/// [`IclDomain::valid_inputs`]).
fn apply(domain: IclDomain, op: Operation, i: usize) -> &'static str {
    domain.values()[(i as i64 + op.offset()) as usize]
}

/// The answer `prompt` would have under the operation named `operation` (an [`Operation::as_str`]
/// name): the value of its `query_input` segment (without its leading space) moved by that
/// operation's offset in the domain of its `domain` label, with the leading space of the
/// generator's answers (` y`). The transplant test's expected answer when another operation's
/// code is written (`hyperlens_probe::lm_transplant`).
///
/// `None` where it is not defined: an unknown operation or domain, a prompt without a `domain`
/// label or without exactly one `query_input` segment, a query value that is not in its domain,
/// or an answer outside the domain (no wrapping, as the generator).
pub fn icl_answer_under(prompt: &Prompt, operation: &str) -> Option<String> {
    let op = Operation::ALL
        .into_iter()
        .find(|o| o.as_str() == operation)?;
    let domain = prompt.labels.get("domain")?;
    let domain = IclDomain::ALL.into_iter().find(|d| d.as_str() == domain)?;
    let mut inputs = prompt.segments.iter().filter(|s| s.role == "query_input");
    let (query, None) = (inputs.next()?, inputs.next()) else {
        return None;
    };
    let value = query.text.strip_prefix(' ')?;
    let i = domain.values().iter().position(|v| *v == value)?;
    let j = usize::try_from(i as i64 + op.offset()).ok()?;
    domain.values().get(j).map(|v| format!(" {v}"))
}

/// The demonstration inputs of a prompt whose test input is `query`: distinct and other than the
/// query when the domain has enough valid inputs, otherwise drawn with replacement among the
/// valid inputs other than the query.
fn demo_inputs(
    rng: &mut rand_chacha::ChaCha8Rng,
    valid: &[usize],
    query: usize,
    shots: usize,
) -> Vec<usize> {
    let others: Vec<usize> = valid.iter().copied().filter(|&i| i != query).collect();
    if others.len() >= shots {
        others.choose_multiple(rng, shots).copied().collect()
    } else {
        (0..shots)
            .map(|_| others[rng.gen_range(0..others.len())])
            .collect()
    }
}

/// One few-shot prompt: `Q: x\nA: y\n\n` per demonstration, then `Q: x\nA:`; segments
/// `separator` (`Q:`, `\nA:`, `\n\nQ:`), `demo_input` / `demo_output` / `query_input` (` x`, the
/// value with a leading space); answer ` y`.
fn icl_prompt(domain: IclDomain, op: Operation, demos: &[usize], query: usize) -> Prompt {
    let vals = domain.values();
    let mut segments = Vec::with_capacity(4 * demos.len() + 3);
    segments.push(Segment::new("Q:", "separator"));
    for &d in demos {
        segments.push(Segment::new(format!(" {}", vals[d]), "demo_input"));
        segments.push(Segment::new("\nA:", "separator"));
        segments.push(Segment::new(
            format!(" {}", apply(domain, op, d)),
            "demo_output",
        ));
        segments.push(Segment::new("\n\nQ:", "separator"));
    }
    segments.push(Segment::new(format!(" {}", vals[query]), "query_input"));
    segments.push(Segment::new("\nA:", "separator"));
    Prompt {
        segments,
        labels: [
            ("operation".to_string(), op.as_str().to_string()),
            ("domain".to_string(), domain.as_str().to_string()),
        ]
        .into_iter()
        .collect(),
        answer: Some(format!(" {}", apply(domain, op, query))),
        split: None,
    }
}

/// Generates the `icl` prompt set.
///
/// Prompt `i` has combination `i % 30` of the operations x domains (operation-major, so the
/// combinations are balanced), a test input drawn uniformly among the inputs whose answer exists
/// without wrapping, and `shots` demonstrations of the same operation and domain (distinct, and
/// other than the test input, whenever the domain allows: not for the skips on weekdays). Every
/// answer is correct by construction. Then [`hold_out_combinations`] holds out
/// `round(hold_out * 30)` operation x domain combinations (8 at the default quarter; seeded by
/// `seed`, every operation and every domain still seen in training) and [`apply_hold_out`] sets
/// the splits. The set's sites are [`ICL_SITES`].
///
/// Tokenizers that split digits (SmolLM2's, Llama's: their vocabularies have no ` 4`) make a
/// `digits` answer two tokens, the space and the digit, so a check of the answer's first token
/// should skip a token that is only whitespace; the other domains' values are single tokens with
/// their leading space in SmolLM2-135M's vocabulary.
///
/// # Errors
/// [`TasksError::InvalidParam`] for `n` smaller than the 30 combinations, `shots` 0, or a
/// `hold_out` outside `[0, 1)` or too large to keep every value seen.
pub fn icl(params: &IclParams) -> Result<PromptSet> {
    let p = params;
    let n_combos = Operation::ALL.len() * IclDomain::ALL.len();
    if p.n < n_combos {
        return Err(TasksError::param(
            "n",
            format!(
                "must be at least {n_combos} (one prompt per operation x domain), got {}",
                p.n
            ),
        ));
    }
    if p.shots == 0 {
        return Err(TasksError::param("shots", "must be at least 1"));
    }
    let prompts = (0..p.n)
        .map(|i| {
            let c = i % n_combos;
            let op = Operation::ALL[c / IclDomain::ALL.len()];
            let domain = IclDomain::ALL[c % IclDomain::ALL.len()];
            let mut rng = rng::stream(p.seed, Domain::PromptIcl, 0, i as u64);
            let valid = domain.valid_inputs(op);
            let query = valid[rng.gen_range(0..valid.len())];
            let demos = demo_inputs(&mut rng, &valid, query, p.shots);
            icl_prompt(domain, op, &demos, query)
        })
        .collect();
    let origin = format!(
        "icl(n={}, seed={}, shots={}, hold_out={})",
        p.n, p.seed, p.shots, p.hold_out
    );
    let mut set = PromptSet::new(prompts, origin)?;
    let held = hold_out_combinations(&set, "operation", "domain", p.hold_out, p.seed).map_err(
        |e| match e {
            TasksError::InvalidParam { reason, .. } | TasksError::InvalidInput { reason, .. } => {
                TasksError::param("hold_out", reason)
            }
            other => other,
        },
    )?;
    apply_hold_out(&mut set, "operation", "domain", &held);
    set.sites = Some(SiteSpec::parse(ICL_SITES)?);
    Ok(set)
}
