//! Tasks written down, not coded: the JSONL prompt format, sites named by role, the hold-out rule,
//! and two generators (`relations`, `icl`).
//!
//! This module works on text and on token ranges handed to it; it has no tokenizer and no model.
//! The probe extraction tokenizes each prompt's segments in order, so that each segment's token
//! range is known ([`segment_spans`]), resolves the sites on those ranges ([`SiteSpec::resolve_set`]), and reads the
//! lens there.
//!
//! # The prompt file (JSONL)
//!
//! One prompt per line, a JSON object with the fields
//!
//! | field      | type                         | required | meaning |
//! |------------|------------------------------|----------|---------|
//! | `segments` | list of `{"text", "role"}`   | yes      | the prompt's text in pieces; the text is their concatenation, exactly (spaces and newlines included) |
//! | `labels`   | object of string -> string   | no       | named factors of the prompt (`operation`, `domain`, `relation`, anything) |
//! | `answer`   | string                       | no       | the expected continuation (e.g. `" c"`) |
//! | `split`    | `"train"` or `"test"`        | no       | the prompt's split; without one a hold-out rule may decide ([`apply_hold_out`]) |
//!
//! A role is any non-empty name: the generators use `demo_input`, `demo_output`, `query_input`,
//! `separator` (`icl`) and `key`, `query`, `context` (`relations`). Unknown fields are refused so
//! that a typo (`"lables"`) is caught. Blank lines are skipped. A file is refused, naming it and
//! the line, for bad JSON, an unknown field, a split other than `train` / `test`, a prompt with no
//! segment, an empty role, an empty text (every segment `""`), an empty label name, or no prompt
//! at all. A complete three-line file:
//!
//! ```text
//! {"segments": [{"text": "Q:", "role": "separator"}, {"text": " a", "role": "demo_input"}, {"text": "\nA:", "role": "separator"}, {"text": " b", "role": "demo_output"}, {"text": "\n\nQ:", "role": "separator"}, {"text": " c", "role": "query_input"}, {"text": "\nA:", "role": "separator"}], "labels": {"operation": "next", "domain": "lower"}, "answer": " d", "split": "train"}
//! {"segments": [{"text": "Q:", "role": "separator"}, {"text": " 3", "role": "demo_input"}, {"text": "\nA:", "role": "separator"}, {"text": " 2", "role": "demo_output"}, {"text": "\n\nQ:", "role": "separator"}, {"text": " 8", "role": "query_input"}, {"text": "\nA:", "role": "separator"}], "labels": {"operation": "previous", "domain": "digits"}, "answer": " 7", "split": "test"}
//! {"segments": [{"text": "The cat sat on the", "role": "context"}, {"text": " mat", "role": "key"}, {"text": ". The", "role": "context"}, {"text": " cat", "role": "query"}], "labels": {"relation": "duplicate"}}
//! ```
//!
//! [`PromptSet::load`] reads it, [`PromptSet::save`] writes it (atomically; the round trip is
//! exact). [`PromptSet::factors`] lists each label name with its values sorted: a value's index is
//! its position there (the `factors` of `codes.json`, `hyperlens_io::sidecars::LmFactor`), and
//! [`PromptSet::factor_matrix`] gives every prompt's value indices (-1 for a missing label).
//!
//! # Sites
//!
//! A site spec names the query positions and the key positions of every prompt by role:
//!
//! ```text
//! spec    := section ";" section          (the two in either order; spaces are ignored)
//! section := "query:" items | "keys:" items
//! items   := item ("," item)*
//! item    := "last" | ROLE ["#" J] ["[" I "]"]
//! ```
//!
//! - `last`: the prompt's last token (where the next-token prediction is read).
//! - `ROLE`: the last token of each segment with that role, in prompt order.
//! - `ROLE[I]`: token `I` of each such segment (0 the first; negative counts from the end, -1 the
//!   last).
//! - `ROLE#J`: only the `J`-th segment of that role (0 the first; negative from the end).
//! - `ROLE#J[I]`: token `I` of that one segment.
//!
//! The positions are listed item by item, in the spec's order. A role is a name without spaces or
//! any of `#[]:;,`; `last` is reserved. Every prompt of a set must give the same numbers of query
//! positions Q and of key positions K ([`SiteSpec::resolve_set`]). Resolving fails, naming the
//! prompt (by index) and the item, for an unknown role (listing the prompt's roles), a segment
//! without tokens, a segment past the prompt's end, or a `#J` / `[I]` out of range.
//! `query: last; keys: demo_output, query_input` on an `icl` prompt with 5 shots gives Q = 1 and
//! K = 6.
//!
//! # The hold-out rule
//!
//! For prompts without a split, [`hold_out_combinations`] draws `round(fraction * n_a * n_b)`
//! combinations of two factors' values (a quarter by default, as SRAVEN's seeded splits), seeded,
//! keeping every value of both factors in at least one training combination; [`apply_hold_out`]
//! puts the prompts of those combinations in `test` and the others in `train`.
//!
//! # Generators
//!
//! - [`relations`]: words separated by spaces, one word per segment; the last word has role
//!   `query`, one earlier word role `key`, the others `context`; the key's relation to the query
//!   is the label `relation` (`previous`, `induction`, `duplicate`, `bracket`, `none`). The
//!   vocabulary is split in two disjoint halves by a seeded shuffle: training prompts use half `a`,
//!   test prompts half `b` (label `vocab`). Sites: `query: query; keys: key`.
//! - [`icl`]: few-shot operations (`copy`, `next`, `previous`, `skip_forward`, `skip_back`) on
//!   domains (`lower`, `upper`, `digits`, `number_words`, `weekdays`, `months`) in the format
//!   `Q: x\nA: y\n\n` ... `Q: x\nA:`, labels `operation` and `domain`, a quarter of the 30
//!   combinations held out. Sites: `query: last; keys: demo_output, query_input`.
//!
//! Word lists are the project's own ([`words::COMMON_WORDS`]) or the caller's (e.g. a model's
//! single-token words); nothing is downloaded.

mod format;
mod holdout;
mod icl;
mod relations;
mod sites;
pub mod words;

#[cfg(test)]
mod tests;

pub use format::{Prompt, PromptSet, PromptSplit, Segment};
pub use holdout::{apply_hold_out, hold_out_combinations, n_held_out, DEFAULT_HOLD_OUT};
pub use icl::{icl, icl_answer_under, IclDomain, IclParams, Operation, ICL_SITES};
pub use relations::{
    relations, vocabulary_halves, Relation, RelationsParams, BRACKETS, RELATIONS_SITES,
};
pub use sites::{segment_spans, ResolvedSites, SiteSpec};
