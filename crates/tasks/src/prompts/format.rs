//! The JSONL prompt file: one [`Prompt`] per line, read and written by [`PromptSet`] (the format's
//! reference is the module documentation of [`crate::prompts`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use hyperlens_io::sidecars::LmFactor;
use ndarray::Array2;
use serde::{Deserialize, Serialize};

use super::sites::SiteSpec;
use crate::error::{Result, TasksError};

/// One piece of a prompt's text with its role (`demo_input`, `separator`, any non-empty name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    /// The text, exactly as it is fed to the tokenizer (leading spaces included).
    pub text: String,
    /// The segment's role; sites name positions by role ([`SiteSpec`]).
    pub role: String,
}

impl Segment {
    /// A segment of `text` with `role`.
    pub fn new(text: impl Into<String>, role: impl Into<String>) -> Self {
        Segment {
            text: text.into(),
            role: role.into(),
        }
    }
}

/// The split a prompt belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptSplit {
    /// Seen in training (`"train"`).
    Train,
    /// Held out (`"test"`).
    Test,
}

impl PromptSplit {
    /// `train` or `test`.
    pub fn as_str(self) -> &'static str {
        match self {
            PromptSplit::Train => "train",
            PromptSplit::Test => "test",
        }
    }
}

impl fmt::Display for PromptSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One prompt: its segments in order, its labels (named factors), its answer and split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prompt {
    /// The text pieces, in order; the prompt's text is their concatenation.
    pub segments: Vec<Segment>,
    /// Factor name -> value (e.g. `operation` -> `next`); absent when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The expected continuation (e.g. `" c"`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// `train` or `test`; absent when a hold-out rule decides ([`super::apply_hold_out`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<PromptSplit>,
}

impl Prompt {
    /// The prompt's text: its segments' texts joined.
    pub fn text(&self) -> String {
        self.segments.iter().map(|s| s.text.as_str()).collect()
    }

    /// The distinct roles of the prompt's segments, in order of first appearance.
    pub fn roles(&self) -> Vec<&str> {
        let mut seen = BTreeSet::new();
        self.segments
            .iter()
            .map(|s| s.role.as_str())
            .filter(|r| seen.insert(*r))
            .collect()
    }

    /// Checks what serde cannot: at least one segment, no empty role, a non-empty text, no empty
    /// label name.
    ///
    /// # Errors
    /// The reason, as a sentence (the caller adds the file and line or the prompt index).
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.segments.is_empty() {
            return Err("the prompt has no segment (`segments` is empty)".into());
        }
        if let Some(i) = self.segments.iter().position(|s| s.role.trim().is_empty()) {
            return Err(format!("segment {i} has an empty role"));
        }
        if self.segments.iter().all(|s| s.text.is_empty()) {
            return Err("the prompt's text is empty (every segment's `text` is \"\")".into());
        }
        if self.labels.keys().any(|k| k.trim().is_empty()) {
            return Err("a label has an empty name".into());
        }
        Ok(())
    }
}

/// A list of prompts and where they came from (a file, a generator), with the sites recommended
/// for them when known.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSet {
    /// The prompts, in file order.
    pub prompts: Vec<Prompt>,
    /// Where they came from: the file path, or the generator call (e.g. `icl(n=300, seed=0,
    /// shots=5)`).
    pub origin: String,
    /// The recommended sites (the generators set them; a loaded file has none).
    pub sites: Option<SiteSpec>,
}

impl PromptSet {
    /// A set of `prompts` from `origin`, each checked ([`Prompt::check`]).
    ///
    /// # Errors
    /// [`TasksError::InvalidInput`] naming the first bad prompt (`prompt {i}`) and the reason, or
    /// an empty list.
    pub fn new(prompts: Vec<Prompt>, origin: impl Into<String>) -> Result<Self> {
        if prompts.is_empty() {
            return Err(TasksError::input("prompts", "the list of prompts is empty"));
        }
        for (i, p) in prompts.iter().enumerate() {
            p.check()
                .map_err(|r| TasksError::input(format!("prompt {i}"), r))?;
        }
        Ok(PromptSet {
            prompts,
            origin: origin.into(),
            sites: None,
        })
    }

    /// Parses prompts from JSON texts (one prompt per item, as the lines of a file), naming bad
    /// ones `prompt {i}` (the Python front's `hl.tasks.prompts`).
    ///
    /// # Errors
    /// [`TasksError::InvalidInput`] naming the first bad prompt: bad JSON, an unknown field, a
    /// split other than `train` / `test`, or what [`Prompt::check`] refuses; an empty list.
    pub fn from_json_items<S: AsRef<str>>(items: &[S], origin: impl Into<String>) -> Result<Self> {
        let prompts = items
            .iter()
            .enumerate()
            .map(|(i, s)| {
                serde_json::from_str::<Prompt>(s.as_ref())
                    .map_err(|e| TasksError::input(format!("prompt {i}"), e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(prompts, origin)
    }

    /// Reads a JSONL prompt file: one prompt per line; blank lines are skipped.
    ///
    /// # Errors
    /// [`TasksError::Io`] if the file cannot be read; [`TasksError::PromptLine`] naming the file
    /// and the 1-based line: bad JSON, an unknown field, a split other than `train` / `test`, no
    /// segment, an empty role, an empty prompt text, an empty label name; or line 0 when the file
    /// holds no prompt.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| TasksError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let line_err = |line: usize, reason: String| TasksError::PromptLine {
            path: path.to_path_buf(),
            line,
            reason,
        };
        let mut prompts = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let p: Prompt =
                serde_json::from_str(line).map_err(|e| line_err(i + 1, e.to_string()))?;
            p.check().map_err(|r| line_err(i + 1, r))?;
            prompts.push(p);
        }
        if prompts.is_empty() {
            return Err(line_err(
                0,
                "the file holds no prompt (one JSON object per line expected)".into(),
            ));
        }
        Ok(PromptSet {
            prompts,
            origin: path.display().to_string(),
            sites: None,
        })
    }

    /// The JSONL text of the set: one compact JSON object per line, each line ending in `\n`.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for p in &self.prompts {
            // A `Prompt` of strings and maps always serializes.
            out += &serde_json::to_string(p).unwrap_or_default();
            out.push('\n');
        }
        out
    }

    /// Writes the set to `path` as JSONL, atomically (`hyperlens_io::atomic`); [`PromptSet::load`]
    /// gives the same prompts back.
    ///
    /// # Errors
    /// [`TasksError::File`] naming the path if it cannot be written.
    pub fn save(&self, path: &Path) -> Result<()> {
        hyperlens_io::write_atomic(path, self.to_jsonl().as_bytes())?;
        Ok(())
    }

    /// The number of prompts.
    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    /// Whether the set has no prompt (never, for a set built by [`PromptSet::new`] or loaded).
    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty()
    }

    /// Each label name of the set (sorted) with its values (sorted); a value's index is its
    /// position in that order (the `factors` of `codes.json`, [`LmFactor`]).
    pub fn factors(&self) -> Vec<LmFactor> {
        let mut map: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for p in &self.prompts {
            for (k, v) in &p.labels {
                map.entry(k).or_default().insert(v);
            }
        }
        map.into_iter()
            .map(|(name, values)| LmFactor {
                name: name.to_string(),
                values: values.into_iter().map(str::to_string).collect(),
            })
            .collect()
    }

    /// The value index of every prompt's label for every factor of [`PromptSet::factors`], -1
    /// where a prompt lacks the label.
    ///
    /// # Shapes
    /// int64 `[N, F]`: N prompts, F factors (in the order of [`PromptSet::factors`]).
    pub fn factor_matrix(&self) -> Array2<i64> {
        let factors = self.factors();
        Array2::from_shape_fn((self.prompts.len(), factors.len()), |(i, f)| {
            let fac = &factors[f];
            self.prompts[i]
                .labels
                .get(&fac.name)
                .and_then(|v| fac.values.binary_search(v).ok())
                .map_or(-1, |j| j as i64)
        })
    }

    /// Every prompt's split (None where the prompt has none).
    pub fn splits(&self) -> Vec<Option<PromptSplit>> {
        self.prompts.iter().map(|p| p.split).collect()
    }

    /// Every prompt's text (its segments joined), for display.
    pub fn texts(&self) -> Vec<String> {
        self.prompts.iter().map(Prompt::text).collect()
    }

    /// What the training prompts never show: for each factor, the values found only in test
    /// prompts (`vocab=b`), then each pair of factors' value pairs found in test prompts and in no
    /// training prompt, both values being seen in training (`domain=digits,operation=next`).
    /// Empty when no prompt has a split.
    pub fn unseen_in_training(&self) -> Vec<String> {
        let of = |split: PromptSplit| {
            self.prompts
                .iter()
                .filter(move |p| p.split == Some(split))
                .map(|p| &p.labels)
        };
        let mut train_values: BTreeSet<(&str, &str)> = BTreeSet::new();
        let mut train_pairs: BTreeSet<[(&str, &str); 2]> = BTreeSet::new();
        for labels in of(PromptSplit::Train) {
            let kv: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            train_values.extend(kv.iter().copied());
            for (i, a) in kv.iter().enumerate() {
                for b in &kv[i + 1..] {
                    train_pairs.insert([*a, *b]);
                }
            }
        }
        let mut only_values: BTreeSet<(&str, &str)> = BTreeSet::new();
        let mut only_pairs: BTreeSet<[(&str, &str); 2]> = BTreeSet::new();
        for labels in of(PromptSplit::Test) {
            let kv: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            only_values.extend(kv.iter().filter(|x| !train_values.contains(*x)));
            for (i, a) in kv.iter().enumerate() {
                for b in &kv[i + 1..] {
                    let pair = [*a, *b];
                    if train_values.contains(a)
                        && train_values.contains(b)
                        && !train_pairs.contains(&pair)
                    {
                        only_pairs.insert(pair);
                    }
                }
            }
        }
        only_values
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .chain(
                only_pairs
                    .into_iter()
                    .map(|[(k1, v1), (k2, v2)]| format!("{k1}={v1},{k2}={v2}")),
            )
            .collect()
    }

    /// The number of prompts per split (`train`, `test`, `none`) and per combination of all their
    /// labels (`k=v,k=v`, sorted), for a summary.
    pub fn counts(&self) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
        let mut per_split = BTreeMap::new();
        let mut per_combo = BTreeMap::new();
        for p in &self.prompts {
            let s = p.split.map_or("none", PromptSplit::as_str);
            *per_split.entry(s.to_string()).or_insert(0) += 1;
            let combo = p
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            *per_combo.entry(combo).or_insert(0) += 1;
        }
        (per_split, per_combo)
    }
}
