//! The `relations` generator: prompts of space-separated words in which the key word stands in
//! one structural relation to the query word (the last word): previous token, induction target,
//! duplicate token, matching bracket or quote, or none. The relations are those of the attention
//! heads that TransformerLens's head detector scores (previous-token, duplicate-token, induction;
//! Olsson et al. 2022, "In-context learning and induction heads") and of Clark et al. 2019 ("What
//! does BERT look at?": delimiters and brackets).

use std::fmt;

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::format::{Prompt, PromptSet, PromptSplit, Segment};
use super::sites::SiteSpec;
use super::words::{check_words, COMMON_WORDS};
use crate::error::{Result, TasksError};
use crate::rng::{self, Domain};

/// The sites of every `relations` prompt: the query word's last token and the key word's last
/// token.
pub const RELATIONS_SITES: &str = "query: query; keys: key";

/// The opening and closing symbols of the `bracket` relation.
pub const BRACKETS: [(&str, &str); 3] = [("(", ")"), ("[", "]"), ("\"", "\"")];

/// The relation of a prompt's key word to its query word (the label `relation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Relation {
    /// The key is the word just before the query.
    Previous,
    /// In a repeated random word sequence, the key is the word after the query's first
    /// occurrence (what an induction head attends to).
    Induction,
    /// The key is the query word's earlier occurrence.
    Duplicate,
    /// The key is the opening bracket or quote that the query closes.
    Bracket,
    /// The key is an earlier word in none of these relations to the query.
    None,
}

impl Relation {
    /// The five relations, in the order prompts cycle through them.
    pub const ALL: [Relation; 5] = [
        Relation::Previous,
        Relation::Induction,
        Relation::Duplicate,
        Relation::Bracket,
        Relation::None,
    ];

    /// The label value: `previous`, `induction`, `duplicate`, `bracket` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Relation::Previous => "previous",
            Relation::Induction => "induction",
            Relation::Duplicate => "duplicate",
            Relation::Bracket => "bracket",
            Relation::None => "none",
        }
    }
}

impl fmt::Display for Relation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parameters of [`relations`].
#[derive(Debug, Clone, PartialEq)]
pub struct RelationsParams {
    /// Number of prompts (the relations cycle, so each has `n / 5` or one more per split).
    pub n: usize,
    /// Seed of the vocabulary split and of the prompts.
    pub seed: u64,
    /// Fewest words in a prompt (at least 5, what an induction prompt needs).
    pub min_len: usize,
    /// Most words in a prompt (each vocabulary half needs at least this many words).
    pub max_len: usize,
    /// Fraction of the prompts in the test split (in `(0, 1)`).
    pub test_fraction: f64,
    /// The vocabulary; `None` = [`COMMON_WORDS`]. The coordinator passes a model's single-token
    /// words.
    pub words: Option<Vec<String>>,
}

impl Default for RelationsParams {
    fn default() -> Self {
        RelationsParams {
            n: 500,
            seed: 0,
            min_len: 8,
            max_len: 16,
            test_fraction: 0.5,
            words: None,
        }
    }
}

/// The vocabulary split into two disjoint halves by a seeded shuffle: `(a, b)`, `a` the first
/// `len / 2` words of the shuffled list (train), `b` the rest (test).
pub fn vocabulary_halves(words: &[String], seed: u64) -> (Vec<String>, Vec<String>) {
    let mut w = words.to_vec();
    w.shuffle(&mut rng::stream(seed, Domain::PromptRelations, 0, 0));
    let b = w.split_off(w.len() / 2);
    (w, b)
}

/// `count` distinct words of `half`, in random order.
fn distinct(rng: &mut ChaCha8Rng, half: &[String], count: usize) -> Vec<String> {
    half.choose_multiple(rng, count).cloned().collect()
}

/// One prompt's words, key position and query position (the last word) for `relation`, with
/// `len` words drawn from `half` (which has at least `len` words).
pub(crate) fn relation_words(
    rng: &mut ChaCha8Rng,
    relation: Relation,
    half: &[String],
    len: usize,
) -> (Vec<String>, usize) {
    match relation {
        Relation::Previous => (distinct(rng, half, len), len - 2),
        Relation::Induction => {
            // A sequence s of m distinct words, then s[0..=t] again: the query is s[t]'s second
            // occurrence (the last word) and the key s[t + 1] in the first; len = m + t + 1 and
            // 1 <= t <= m - 2.
            let t = rng.gen_range(1..=(len - 3) / 2);
            let m = len - 1 - t;
            let s = distinct(rng, half, m);
            let mut w = s.clone();
            w.extend_from_slice(&s[..=t]);
            (w, t + 1)
        }
        Relation::Duplicate => {
            // len - 1 distinct words; the query repeats word k (k <= len - 3, so that the key is
            // not also the previous word).
            let mut w = distinct(rng, half, len - 1);
            let k = rng.gen_range(0..=len - 3);
            w.push(w[k].clone());
            (w, k)
        }
        Relation::Bracket => {
            // Distinct words with an opening symbol at k (<= len - 3: at least one word inside)
            // and the closing one last.
            let (open, close) = BRACKETS[rng.gen_range(0..BRACKETS.len())];
            let mut w = distinct(rng, half, len - 2);
            let k = rng.gen_range(0..=len - 3);
            w.insert(k, open.to_string());
            w.push(close.to_string());
            (w, k)
        }
        Relation::None => {
            // len distinct words: the query has no earlier occurrence; the key is an earlier
            // word other than the previous one.
            let w = distinct(rng, half, len);
            let k = rng.gen_range(0..=len - 3);
            (w, k)
        }
    }
}

/// The prompt of `words` with the key at `key` and the query last: one segment per word (the
/// first without a leading space, the others with one), roles `key`, `query` and `context`.
fn prompt_of(
    words: &[String],
    key: usize,
    relation: Relation,
    vocab: &str,
    split: PromptSplit,
) -> Prompt {
    let last = words.len() - 1;
    let segments = words
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let text = if i == 0 { w.clone() } else { format!(" {w}") };
            let role = if i == last {
                "query"
            } else if i == key {
                "key"
            } else {
                "context"
            };
            Segment::new(text, role)
        })
        .collect();
    Prompt {
        segments,
        labels: [
            ("relation".to_string(), relation.as_str().to_string()),
            ("vocab".to_string(), vocab.to_string()),
        ]
        .into_iter()
        .collect(),
        answer: None,
        split: Some(split),
    }
}

/// Generates the `relations` prompt set.
///
/// Prompt `i` has relation `Relation::ALL[i % 5]` within its split (balanced); the first
/// `n - round(n * test_fraction)` prompts are `train` and use vocabulary half `a`, the rest
/// `test` and half `b` ([`vocabulary_halves`]; labels `relation` and `vocab`). Each prompt has a
/// length drawn uniformly in `min_len..=max_len` words and its own random stream (`seed`, `i`).
/// The set's sites are [`RELATIONS_SITES`].
///
/// # Errors
/// [`TasksError::InvalidParam`] for `n` 0, `min_len` < 5, `max_len` < `min_len`, a
/// `test_fraction` outside `(0, 1)`, a bad word list, or a vocabulary half smaller than
/// `max_len`.
pub fn relations(params: &RelationsParams) -> Result<PromptSet> {
    let p = params;
    if p.n == 0 {
        return Err(TasksError::param("n", "must be at least 1"));
    }
    if p.min_len < 5 {
        return Err(TasksError::param(
            "min_len",
            format!(
                "must be at least 5 (an induction prompt's length), got {}",
                p.min_len
            ),
        ));
    }
    if p.max_len < p.min_len {
        return Err(TasksError::param(
            "max_len",
            format!(
                "must be at least min_len ({}), got {}",
                p.min_len, p.max_len
            ),
        ));
    }
    if !(p.test_fraction > 0.0 && p.test_fraction < 1.0) {
        return Err(TasksError::param(
            "test_fraction",
            format!("must be in (0, 1), got {}", p.test_fraction),
        ));
    }
    let words: Vec<String> = match &p.words {
        Some(w) => w.clone(),
        None => COMMON_WORDS.iter().map(|s| s.to_string()).collect(),
    };
    check_words(&words).map_err(|r| TasksError::param("words", r))?;
    let (half_a, half_b) = vocabulary_halves(&words, p.seed);
    if half_a.len() < p.max_len {
        return Err(TasksError::param(
            "words",
            format!(
                "{} words give halves of {} and {}; prompts of up to {} distinct words need at \
                 least {} words",
                words.len(),
                half_a.len(),
                half_b.len(),
                p.max_len,
                2 * p.max_len
            ),
        ));
    }
    let n_test = ((p.n as f64) * p.test_fraction).round() as usize;
    let n_train = p.n - n_test;
    let prompts = (0..p.n)
        .map(|i| {
            let (split, half, vocab, j) = if i < n_train {
                (PromptSplit::Train, &half_a, "a", i)
            } else {
                (PromptSplit::Test, &half_b, "b", i - n_train)
            };
            let relation = Relation::ALL[j % Relation::ALL.len()];
            let mut rng = rng::stream(p.seed, Domain::PromptRelations, 1, i as u64);
            let len = rng.gen_range(p.min_len..=p.max_len);
            let (w, key) = relation_words(&mut rng, relation, half, len);
            prompt_of(&w, key, relation, vocab, split)
        })
        .collect();
    let origin = format!(
        "relations(n={}, seed={}, min_len={}, max_len={}, test_fraction={}, words={})",
        p.n,
        p.seed,
        p.min_len,
        p.max_len,
        p.test_fraction,
        words.len()
    );
    let mut set = PromptSet::new(prompts, origin)?;
    set.sites = Some(SiteSpec::parse(RELATIONS_SITES)?);
    Ok(set)
}
