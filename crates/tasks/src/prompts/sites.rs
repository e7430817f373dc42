//! Sites by role: which token positions of a tokenized prompt are the query and the keys
//! (grammar in the module documentation of [`crate::prompts`]).

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use ndarray::Array2;

use super::format::{Prompt, PromptSet};
use crate::error::{Result, TasksError};

/// Which segment(s) of a role an item takes: all of them, or the j-th (negative from the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    All,
    Nth(i64),
}

/// One item of a site list: the prompt's last token, or token `index` of the picked segments of
/// `role`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Last,
    Role {
        role: String,
        pick: Pick,
        /// The token within the segment; `None` = the last (-1).
        index: Option<i64>,
    },
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Last => f.write_str("last"),
            Item::Role { role, pick, index } => {
                f.write_str(role)?;
                if let Pick::Nth(j) = pick {
                    write!(f, "#{j}")?;
                }
                if let Some(i) = index {
                    write!(f, "[{i}]")?;
                }
                Ok(())
            }
        }
    }
}

/// The query and key sites of a prompt set, named by role: `query: last; keys: demo_output,
/// query_input`.
///
/// Parse with [`SiteSpec::parse`] (or `str::parse`); [`fmt::Display`] gives the canonical text
/// back (items separated by `, `, sections by `; `). Resolve on a tokenized prompt with
/// [`SiteSpec::resolve`], on a whole set with [`SiteSpec::resolve_set`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteSpec {
    query: Vec<Item>,
    keys: Vec<Item>,
}

/// The resolved sites of a set: the query and key positions of every prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSites {
    /// Query positions.
    ///
    /// # Shapes
    /// int64 `[N, Q]`.
    pub query: Array2<i64>,
    /// Key positions.
    ///
    /// # Shapes
    /// int64 `[N, K]`.
    pub keys: Array2<i64>,
}

fn spec_err(spec: &str, reason: impl Into<String>) -> TasksError {
    TasksError::input(format!("sites `{spec}`"), reason)
}

/// Parses an optional signed integer suffix such as `#-1` or `[2]`.
fn parse_int(spec: &str, item: &str, what: &str, s: &str) -> Result<i64> {
    s.trim().parse::<i64>().map_err(|_| {
        spec_err(
            spec,
            format!("item `{item}`: {what} `{s}` is not an integer"),
        )
    })
}

fn parse_item(spec: &str, raw: &str) -> Result<Item> {
    let item = raw.trim();
    if item.is_empty() {
        return Err(spec_err(
            spec,
            "an empty item (two commas, or a trailing one)",
        ));
    }
    if item == "last" {
        return Ok(Item::Last);
    }
    let (head, index) = match item.find('[') {
        Some(open) => {
            let Some(inner) = item[open + 1..].strip_suffix(']') else {
                return Err(spec_err(
                    spec,
                    format!("item `{item}`: `[` without a closing `]` at the end"),
                ));
            };
            (
                &item[..open],
                Some(parse_int(spec, item, "token index", inner)?),
            )
        }
        None => (item, None),
    };
    let (role, pick) = match head.split_once('#') {
        Some((role, j)) => (role, Pick::Nth(parse_int(spec, item, "segment number", j)?)),
        None => (head, Pick::All),
    };
    let role = role.trim();
    if role.is_empty() {
        return Err(spec_err(spec, format!("item `{item}` names no role")));
    }
    if let Some(c) = role
        .chars()
        .find(|c| c.is_whitespace() || "#[]:;,".contains(*c))
    {
        return Err(spec_err(
            spec,
            format!("item `{item}`: the role `{role}` contains `{c}`"),
        ));
    }
    Ok(Item::Role {
        role: role.to_string(),
        pick,
        index,
    })
}

/// `i` counted from the start (>= 0) or from the end (< 0) of `len` things, if in range.
fn signed_index(i: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let k = if i < 0 { len + i } else { i };
    (0..len).contains(&k).then_some(k as usize)
}

impl SiteSpec {
    /// Parses a site spec: `query: ITEMS; keys: ITEMS` (grammar in [`crate::prompts`]).
    ///
    /// # Errors
    /// [`TasksError::InvalidInput`] naming the spec and the reason: a section other than `query`
    /// or `keys`, a missing or repeated section, an empty item, a malformed `#j` or `[i]`.
    pub fn parse(spec: &str) -> Result<Self> {
        let mut query = None;
        let mut keys = None;
        for section in spec.split(';') {
            if section.trim().is_empty() {
                continue;
            }
            let Some((name, items)) = section.split_once(':') else {
                return Err(spec_err(
                    spec,
                    format!("section `{}` lacks `query:` or `keys:`", section.trim()),
                ));
            };
            let items = items
                .split(',')
                .map(|it| parse_item(spec, it))
                .collect::<Result<Vec<_>>>()?;
            let slot = match name.trim() {
                "query" => &mut query,
                "keys" => &mut keys,
                other => {
                    return Err(spec_err(
                        spec,
                        format!("unknown section `{other}` (valid: query, keys)"),
                    ))
                }
            };
            if slot.replace(items).is_some() {
                return Err(spec_err(
                    spec,
                    format!("section `{}` given twice", name.trim()),
                ));
            }
        }
        match (query, keys) {
            (Some(query), Some(keys)) => Ok(SiteSpec { query, keys }),
            (None, _) => Err(spec_err(spec, "no `query:` section")),
            (_, None) => Err(spec_err(spec, "no `keys:` section")),
        }
    }

    /// Resolves one item on a prompt, appending its positions to `out`.
    fn resolve_item(
        item: &Item,
        prompt_index: usize,
        prompt: &Prompt,
        spans: &[Range<usize>],
        n_tokens: usize,
        out: &mut Vec<usize>,
    ) -> Result<()> {
        let err = |reason: String| {
            TasksError::input(format!("prompt {prompt_index}, site `{item}`"), reason)
        };
        let (role, pick, index) = match item {
            Item::Last => {
                out.push(n_tokens - 1);
                return Ok(());
            }
            Item::Role { role, pick, index } => (role, *pick, index.unwrap_or(-1)),
        };
        let of_role: Vec<usize> = (0..prompt.segments.len())
            .filter(|&s| prompt.segments[s].role == *role)
            .collect();
        if of_role.is_empty() {
            return Err(err(format!(
                "unknown role `{role}`; the prompt's roles: {}",
                prompt.roles().join(", ")
            )));
        }
        let picked: Vec<usize> = match pick {
            Pick::All => of_role,
            Pick::Nth(j) => match signed_index(j, of_role.len()) {
                Some(k) => vec![of_role[k]],
                None => {
                    return Err(err(format!(
                        "segment number {j} is out of range: the prompt has {} `{role}` segment(s)",
                        of_role.len()
                    )))
                }
            },
        };
        for s in picked {
            let span = &spans[s];
            if span.is_empty() {
                return Err(err(format!(
                    "segment {s} (`{role}`, text {:?}) has no tokens",
                    prompt.segments[s].text
                )));
            }
            if span.end > n_tokens {
                return Err(err(format!(
                    "segment {s}'s tokens {}..{} run past the end of the prompt's {n_tokens} tokens",
                    span.start, span.end
                )));
            }
            let Some(k) = signed_index(index, span.len()) else {
                return Err(err(format!(
                    "token index {index} is out of range: segment {s} (`{role}`) has {} token(s)",
                    span.len()
                )));
            };
            out.push(span.start + k);
        }
        Ok(())
    }

    /// The query and key positions of one tokenized prompt, in the spec's item order (an item
    /// naming a role gives one position per picked segment, in prompt order).
    ///
    /// `spans[s]` is the token range of segment `s` (from the tokenizer: segments are tokenized
    /// in order, so they tile `0..n_tokens` after any prepended token); `n_tokens` is the
    /// prompt's length in tokens.
    ///
    /// # Errors
    /// [`TasksError::InvalidInput`] naming the prompt (`prompt {prompt_index}`) and the item: an
    /// unknown role (listing the prompt's roles), a segment with no tokens, a segment past
    /// `n_tokens`, a `#j` or `[i]` out of range; or `spans` not one per segment, `n_tokens` 0.
    pub fn resolve(
        &self,
        prompt_index: usize,
        prompt: &Prompt,
        spans: &[Range<usize>],
        n_tokens: usize,
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        let name = || format!("prompt {prompt_index}");
        if spans.len() != prompt.segments.len() {
            return Err(TasksError::input(
                name(),
                format!(
                    "{} token spans for {} segments",
                    spans.len(),
                    prompt.segments.len()
                ),
            ));
        }
        if n_tokens == 0 {
            return Err(TasksError::input(name(), "the prompt has no tokens"));
        }
        let mut query = Vec::new();
        for item in &self.query {
            Self::resolve_item(item, prompt_index, prompt, spans, n_tokens, &mut query)?;
        }
        let mut keys = Vec::new();
        for item in &self.keys {
            Self::resolve_item(item, prompt_index, prompt, spans, n_tokens, &mut keys)?;
        }
        Ok((query, keys))
    }

    /// Resolves every prompt of `set` and checks that all give the same numbers of query (Q) and
    /// key (K) positions.
    ///
    /// `spans[n]` and `n_tokens[n]` are prompt `n`'s segment token ranges and length, as in
    /// [`SiteSpec::resolve`].
    ///
    /// # Shapes
    /// Returns int64 `[N, Q]` and `[N, K]` ([`ResolvedSites`]).
    ///
    /// # Errors
    /// [`SiteSpec::resolve`]'s; [`TasksError::InvalidInput`] naming the first prompt whose Q or K
    /// differs from prompt 0's, or `spans` / `n_tokens` not one per prompt.
    pub fn resolve_set(
        &self,
        set: &PromptSet,
        spans: &[Vec<Range<usize>>],
        n_tokens: &[usize],
    ) -> Result<ResolvedSites> {
        let n = set.prompts.len();
        if spans.len() != n || n_tokens.len() != n {
            return Err(TasksError::input(
                "spans",
                format!(
                    "{} span lists and {} lengths for {n} prompts",
                    spans.len(),
                    n_tokens.len()
                ),
            ));
        }
        let mut qs: Vec<Vec<usize>> = Vec::with_capacity(n);
        let mut ks: Vec<Vec<usize>> = Vec::with_capacity(n);
        for (i, p) in set.prompts.iter().enumerate() {
            let (q, k) = self.resolve(i, p, &spans[i], n_tokens[i])?;
            if i > 0 && (q.len() != qs[0usize].len() || k.len() != ks[0usize].len()) {
                return Err(TasksError::input(
                    format!("prompt {i}"),
                    format!(
                        "sites `{self}` give {} query and {} key positions, prompt 0 gives {} and {}; \
                         every prompt must give the same numbers",
                        q.len(),
                        k.len(),
                        qs[0].len(),
                        ks[0].len()
                    ),
                ));
            }
            qs.push(q);
            ks.push(k);
        }
        let to_array = |rows: Vec<Vec<usize>>| {
            let width = rows.first().map_or(0, Vec::len);
            Array2::from_shape_fn((rows.len(), width), |(i, j)| rows[i][j] as i64)
        };
        Ok(ResolvedSites {
            query: to_array(qs),
            keys: to_array(ks),
        })
    }
}

impl SiteSpec {
    /// Checks the spec on a set before tokenization: every role it names exists in every prompt,
    /// every `#J` is in range, and every prompt gives the same numbers of positions. Token
    /// indices (`[I]`) need the tokens and are not checked. Returns `(Q, K)`.
    ///
    /// # Errors
    /// [`SiteSpec::resolve_set`]'s, naming the first bad prompt and item.
    pub fn check_segments(&self, set: &PromptSet) -> Result<(usize, usize)> {
        let strip = |items: &[Item]| {
            items
                .iter()
                .map(|it| match it {
                    Item::Role { role, pick, .. } => Item::Role {
                        role: role.clone(),
                        pick: *pick,
                        index: None,
                    },
                    Item::Last => Item::Last,
                })
                .collect()
        };
        let segments_only = SiteSpec {
            query: strip(&self.query),
            keys: strip(&self.keys),
        };
        // One token per segment.
        let spans: Vec<Vec<Range<usize>>> = set
            .prompts
            .iter()
            .map(|p| (0..p.segments.len()).map(|s| s..s + 1).collect())
            .collect();
        let n_tokens: Vec<usize> = set.prompts.iter().map(|p| p.segments.len()).collect();
        let r = segments_only.resolve_set(set, &spans, &n_tokens)?;
        Ok((r.query.ncols(), r.keys.ncols()))
    }
}

/// The token ranges of a prompt's segments tokenized in order: segment `s` covers `counts[s]`
/// tokens, after the `offset` tokens before the first segment (1 for a prepended
/// beginning-of-sequence token, 0 otherwise). The prompt then has `offset + sum(counts)` tokens.
pub fn segment_spans(counts: &[usize], offset: usize) -> Vec<Range<usize>> {
    let mut at = offset;
    counts
        .iter()
        .map(|&c| {
            let r = at..at + c;
            at += c;
            r
        })
        .collect()
}

impl FromStr for SiteSpec {
    type Err = TasksError;

    fn from_str(s: &str) -> Result<Self> {
        SiteSpec::parse(s)
    }
}

impl fmt::Display for SiteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |items: &[Item]| {
            items
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        write!(
            f,
            "query: {}; keys: {}",
            list(&self.query),
            list(&self.keys)
        )
    }
}
