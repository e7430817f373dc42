//! The sweep spec: a TOML file with the `train` arguments every run shares (`[base]`), the swept
//! arguments with their values (`[axes]`), and how the axes combine (`[sweep]`).
//!
//! ```toml
//! [base]
//! task = "sraven"
//! layers = 1
//! steps = 40
//!
//! [axes]
//! mixer = ["hyla", "softmax"]
//! seed = [0, 1]
//! split = ["paper-seed0", "paper-seed1"]
//!
//! [sweep]
//! zip = [["seed", "split"]]   # seed and split vary together (the paper's coupling)
//! batch = true                # runs that differ only in seed, split, lr, weight decay share a process
//! ```
//!
//! Keys are `hyperlens train`'s long flag names with `_` for `-` (`weight_decay` for
//! `--weight-decay`). A `true` value stands for a flag without a value (`attn_only = true`), `false`
//! for its absence. Axes form a grid; the keys of one `zip` group vary together instead (their
//! lists must be equally long).

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Result, SweepError};

/// Keys a spec may not set: the sweep decides them (`out`, `resume`) or they would make one run
/// several (`seeds`, `splits`, `grid`), or stop it early (`stop_after`).
pub const RESERVED_KEYS: [&str; 7] = [
    "out",
    "resume",
    "seeds",
    "splits",
    "grid",
    "stop_after",
    "quiet",
];

/// Keys whose runs the batched training can train together in one process (Schug et al.'s seeds
/// and splits, and the optimiser's lr and weight decay; `hyperlens train --seeds ...`).
pub const BATCHABLE_KEYS: [&str; 4] = ["seed", "split", "lr", "weight_decay"];

/// One value of a `train` argument: a string, an integer, a float or a flag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    /// A flag without a value: `true` gives it, `false` leaves it out.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
}

impl Scalar {
    /// The value as a command-line argument (`None` for a flag: [`Scalar::Bool`]).
    pub fn arg(&self) -> Option<String> {
        match self {
            Scalar::Bool(_) => None,
            Scalar::Int(i) => Some(i.to_string()),
            Scalar::Float(f) => Some(float_text(*f)),
            Scalar::Str(s) => Some(s.clone()),
        }
    }

    /// The value in a run name: its argument text with every character other than letters,
    /// digits, `.`, `+` and `-` replaced by `-`; flags as `on` / `off`.
    pub fn label(&self) -> String {
        match self {
            Scalar::Bool(b) => if *b { "on" } else { "off" }.into(),
            other => other
                .arg()
                .unwrap_or_default()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-') {
                        c
                    } else {
                        '-'
                    }
                })
                .collect(),
        }
    }

    /// The value as a number, if it is one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Scalar::Int(i) => Some(*i as f64),
            Scalar::Float(f) => Some(*f),
            _ => None,
        }
    }

    fn from_toml(key: &str, v: &toml::Value, file: &str) -> Result<Scalar> {
        Ok(match v {
            toml::Value::String(s) => Scalar::Str(s.clone()),
            toml::Value::Integer(i) => Scalar::Int(*i),
            toml::Value::Float(f) if f.is_finite() => Scalar::Float(*f),
            toml::Value::Boolean(b) => Scalar::Bool(*b),
            other => {
                return Err(SweepError::Spec(format!(
                    "{file}: `{key}`: a value must be a string, integer, finite float or boolean, \
                     not {}",
                    other.type_str()
                )))
            }
        })
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            other => write!(f, "{}", other.arg().unwrap_or_default()),
        }
    }
}

/// The shorter of Rust's plain and exponent forms of `f`, both exact (`0.0003` -> `3e-4`,
/// `0.1` -> `0.1`).
pub fn float_text(f: f64) -> String {
    let plain = format!("{f}");
    let exp = format!("{f:e}");
    if exp.len() < plain.len() {
        exp
    } else {
        plain
    }
}

/// One swept argument and its values, in the spec's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Axis {
    /// The argument (a `train` long flag with `_` for `-`).
    pub key: String,
    /// Its values (at least one, no repeats).
    pub values: Vec<Scalar>,
}

/// A parsed and checked sweep spec (module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSpec {
    /// Arguments every run shares, in the spec's order.
    pub base: Vec<(String, Scalar)>,
    /// Swept arguments, in the spec's order.
    pub axes: Vec<Axis>,
    /// Groups of axes that vary together (zipped) instead of forming a grid.
    pub zip: Vec<Vec<String>>,
    /// Whether runs that differ only in [`BATCHABLE_KEYS`] share one batched process.
    pub batch: bool,
    /// The most runs one batched process trains.
    pub max_batch: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    #[serde(default)]
    base: toml::Table,
    #[serde(default)]
    axes: toml::Table,
    #[serde(default)]
    sweep: RawSweep,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSweep {
    #[serde(default)]
    zip: Vec<Vec<String>>,
    batch: Option<bool>,
    max_batch: Option<usize>,
}

/// Whether `key` looks like a long flag name (`a-z`, digits, `_`).
/// A TOML parse error as one line: the file, the line and column (1-based) where the parser
/// stopped, and its message (which `toml` spreads over several lines with a caret).
fn toml_error(text: &str, file: &str, e: &toml::de::Error) -> SweepError {
    let message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            SweepError::Spec(format!(
                "{file}: TOML error at line {line}, column {column}: {message}"
            ))
        }
        None => SweepError::Spec(format!("{file}: TOML error: {message}")),
    }
}

pub(crate) fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && key.chars().next().is_some_and(|c| c.is_ascii_lowercase())
}

impl SweepSpec {
    /// Reads and checks the spec file at `path`.
    ///
    /// # Errors
    /// [`SweepError::Io`] if unreadable; as [`SweepSpec::parse`].
    pub fn read(path: &Path) -> Result<SweepSpec> {
        let text = std::fs::read_to_string(path).map_err(SweepError::io(path))?;
        SweepSpec::parse(&text, &path.display().to_string())
    }

    /// Parses and checks a spec; `file` names it in errors.
    ///
    /// # Errors
    /// [`SweepError::Spec`] naming the file and key for invalid TOML, an unknown table or key of
    /// `[sweep]`, a key that is not a flag name or is reserved ([`RESERVED_KEYS`]), a key both in
    /// `[base]` and `[axes]`, a list in `[base]`, an axis that is not a non-empty list of distinct
    /// scalars, or a `zip` group naming an unknown axis, an axis twice, or lists of different
    /// lengths.
    pub fn parse(text: &str, file: &str) -> Result<SweepSpec> {
        let raw: RawSpec = toml::from_str(text).map_err(|e| toml_error(text, file, &e))?;
        let check_key = |key: &str, table: &str| -> Result<()> {
            if !valid_key(key) {
                return Err(SweepError::Spec(format!(
                    "{file}: [{table}] `{key}` is not a train flag name (lower case, `_` for `-`)"
                )));
            }
            if RESERVED_KEYS.contains(&key) {
                return Err(SweepError::Spec(format!(
                    "{file}: [{table}] `{key}` is set by the sweep itself; leave it out"
                )));
            }
            Ok(())
        };
        let mut base = Vec::new();
        for (key, v) in &raw.base {
            check_key(key, "base")?;
            if v.is_array() {
                return Err(SweepError::Spec(format!(
                    "{file}: [base] `{key}` is a list; put swept values under [axes]"
                )));
            }
            base.push((key.clone(), Scalar::from_toml(key, v, file)?));
        }
        let mut axes = Vec::new();
        for (key, v) in &raw.axes {
            check_key(key, "axes")?;
            if raw.base.contains_key(key) {
                return Err(SweepError::Spec(format!(
                    "{file}: `{key}` is both in [base] and in [axes]"
                )));
            }
            let Some(list) = v.as_array().filter(|a| !a.is_empty()) else {
                return Err(SweepError::Spec(format!(
                    "{file}: [axes] `{key}` must be a non-empty list of values"
                )));
            };
            let values = list
                .iter()
                .map(|x| Scalar::from_toml(key, x, file))
                .collect::<Result<Vec<_>>>()?;
            let mut seen = std::collections::HashSet::with_capacity(values.len());
            if let Some(x) = values.iter().find(|x| !seen.insert(format!("{x:?}"))) {
                return Err(SweepError::Spec(format!(
                    "{file}: [axes] `{key}` lists {x} twice"
                )));
            }
            axes.push(Axis {
                key: key.clone(),
                values,
            });
        }
        let mut seen = BTreeSet::new();
        for group in &raw.sweep.zip {
            if group.len() < 2 {
                return Err(SweepError::Spec(format!(
                    "{file}: [sweep] zip groups need at least two axes, got {group:?}"
                )));
            }
            let mut len = None;
            for key in group {
                let Some(axis) = axes.iter().find(|a| &a.key == key) else {
                    return Err(SweepError::Spec(format!(
                        "{file}: [sweep] zip names `{key}`, which is not under [axes]"
                    )));
                };
                if !seen.insert(key.clone()) {
                    return Err(SweepError::Spec(format!(
                        "{file}: [sweep] zip names `{key}` twice"
                    )));
                }
                match len {
                    None => len = Some(axis.values.len()),
                    Some(n) if n != axis.values.len() => {
                        return Err(SweepError::Spec(format!(
                            "{file}: [sweep] zip {group:?}: `{key}` has {} values, `{}` {n}",
                            axis.values.len(),
                            group[0]
                        )))
                    }
                    Some(_) => {}
                }
            }
        }
        let max_batch = raw.sweep.max_batch.unwrap_or(16);
        if max_batch == 0 {
            return Err(SweepError::Spec(format!(
                "{file}: [sweep] max_batch must be at least 1"
            )));
        }
        Ok(SweepSpec {
            base,
            axes,
            zip: raw.sweep.zip,
            batch: raw.sweep.batch.unwrap_or(true),
            max_batch,
        })
    }

    /// The values of `key` in `[base]` or `[axes]` (one run's value per combination).
    pub fn axis(&self, key: &str) -> Option<&Axis> {
        self.axes.iter().find(|a| a.key == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_errors_are_one_line_with_the_line_and_column() {
        let e = SweepSpec::parse("[base]\ntask = \"sraven\"\nsteps = = 3\n", "s.toml")
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n'), "{e}");
        assert!(
            e.starts_with("s.toml: TOML error at line 3, column 9: "),
            "{e}"
        );
        let e = SweepSpec::parse("[sweep]\nbatch = \"yes\"\n", "s.toml")
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n') && e.contains("line 2"), "{e}");
    }

    #[test]
    fn a_spec_parses_in_order_and_bad_keys_are_named() {
        let s = SweepSpec::parse(
            "[base]\ntask = \"sraven\"\nlayers = 1\nattn_only = false\n\
             [axes]\nmixer = [\"hyla\", \"softmax\"]\nseed = [0, 1]\nsplit = [\"a\", \"b\"]\n\
             lr = [1e-3, 3e-4]\n[sweep]\nzip = [[\"seed\", \"split\"]]\n",
            "s.toml",
        )
        .unwrap();
        assert_eq!(s.base[1], ("layers".to_string(), Scalar::Int(1)));
        let keys: Vec<&str> = s.axes.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(keys, ["mixer", "seed", "split", "lr"]);
        assert_eq!(s.axis("lr").unwrap().values[1].label(), "3e-4");
        assert!(s.batch);
        for (text, needle) in [
            ("[axes]\nout = [\"x\"]\n", "`out` is set by the sweep"),
            ("[base]\nseed = [1, 2]\n", "put swept values under [axes]"),
            (
                "[base]\nseed = 1\n[axes]\nseed = [1]\n",
                "both in [base] and in [axes]",
            ),
            ("[axes]\nseed = []\n", "non-empty list"),
            ("[axes]\nseed = [1, 1]\n", "lists 1 twice"),
            (
                "[axes]\nseed = [1, 2]\n[sweep]\nzip = [[\"seed\", \"split\"]]\n",
                "`split`",
            ),
            (
                "[axes]\nseed = [1, 2]\nsplit = [\"a\"]\n[sweep]\nzip = [[\"seed\", \"split\"]]\n",
                "has 1 values",
            ),
            ("[axes]\nWeight-Decay = [1]\n", "not a train flag name"),
            ("[axis]\nseed = [1]\n", "unknown field `axis`"),
            ("[base]\nlayers = [[1]]\n", "put swept values"),
            ("[axes]\nseed = [{a = 1}]\n", "must be a string"),
        ] {
            let e = SweepSpec::parse(text, "s.toml").unwrap_err().to_string();
            assert!(e.contains(needle) && e.starts_with("s.toml"), "{text}: {e}");
        }
    }

    #[test]
    fn values_print_as_arguments_and_labels() {
        assert_eq!(Scalar::Float(0.0003).arg().unwrap(), "3e-4");
        assert_eq!(Scalar::Float(0.1).arg().unwrap(), "0.1");
        assert_eq!(Scalar::Float(2.0).arg().unwrap(), "2");
        assert_eq!(Scalar::Str("paper seed/0".into()).label(), "paper-seed-0");
        assert_eq!(Scalar::Bool(true).arg(), None);
        // The text parses back to the same float.
        for f in [0.0003, 1e-3, 0.25, 123456.0, 1.5e-7] {
            assert_eq!(float_text(f).parse::<f64>().unwrap(), f);
        }
    }
}
