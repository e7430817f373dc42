//! Probe sites: which query and key positions' latent codes are extracted, and which rule labels them.
//!
//! Source: docs/spec/latent-codes.md ("The paper's recipe"): query 35 (the query token of answer slot 3),
//! keys 27 and 31 (slot 3 of panels 6 and 7, the two given panels of the answer's row), label = rule
//! of slot 3. Generalised to any slot, all slots, or an explicit selection.

use std::fmt;
use std::str::FromStr;

use hyperlens_model::CodeSite;
use hyperlens_tasks::sraven::SravenParams;

use crate::error::{ProbeError, Result};

/// A probe site, parsed from and printed as its CLI form: the parsed stage of the one site type,
/// which [`Site::resolve`] (SRAVEN) or [`Site::logic`] (fuzzy logic) turns into resolved
/// [`CodeSite`]s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Site {
    /// `paper`: the paper's site, i.e. `slot:F-1` (query 35, keys 27 and 31 for SRAVEN defaults).
    Paper,
    /// `slot:F`: query `n_context + F`, keys slot `F` of the last two context panels, label = rule of
    /// the feature that answer slot `F` shows.
    Slot(usize),
    /// `all-slots`: the `F` slot sites stacked; row `F * problem + slot`.
    AllSlots,
    /// `query:I;keys:J,K,...`: one explicit query and any keys; the label is the rule of the feature
    /// shown by the query's slot (`I - n_context` for a query token, else `I mod F`).
    Explicit {
        /// Query position.
        query: usize,
        /// Key positions, in output order.
        keys: Vec<usize>,
    },
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Site::Paper => write!(f, "paper"),
            Site::Slot(s) => write!(f, "slot:{s}"),
            Site::AllSlots => write!(f, "all-slots"),
            Site::Explicit { query, keys } => CodeSite {
                query: *query,
                keys: keys.clone(),
            }
            .fmt(f),
        }
    }
}

impl FromStr for Site {
    type Err = ProbeError;

    fn from_str(s: &str) -> Result<Site> {
        let bad = || {
            ProbeError::InvalidInput(format!(
                "unknown site `{s}` (expected paper, slot:F, all-slots or query:I;keys:J,K,...)"
            ))
        };
        let num = |t: &str| t.trim().parse::<usize>().map_err(|_| bad());
        match s.trim() {
            "paper" => return Ok(Site::Paper),
            "all-slots" => return Ok(Site::AllSlots),
            _ => {}
        }
        if let Some(rest) = s.trim().strip_prefix("slot:") {
            return Ok(Site::Slot(num(rest)?));
        }
        if let Some(rest) = s.trim().strip_prefix("query:") {
            let (q, keys) = rest.split_once(';').ok_or_else(bad)?;
            let keys = keys.trim().strip_prefix("keys:").ok_or_else(bad)?;
            let keys = keys.split(',').map(num).collect::<Result<Vec<_>>>()?;
            return Ok(Site::Explicit {
                query: num(q)?,
                keys,
            });
        }
        Err(bad())
    }
}

/// One resolved SRAVEN site with the answer slot that labels its codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// Query and key positions.
    pub site: CodeSite,
    /// Answer slot (column-2 order) whose feature's rule labels the code, and whose target and
    /// prediction are saved.
    pub slot: usize,
}

impl Site {
    /// Resolves the site into one selection per stacked row (one, or `F` for `all-slots`).
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] if a slot is `>= F`, a position is `>= T`, or the key list is empty.
    pub fn resolve(&self, params: &SravenParams) -> Result<Vec<Selection>> {
        let f = params.features;
        let n_ctx = params.n_context_tokens();
        let t = params.n_tokens();
        let panels = params.n_context_panels();
        let slot_site = |s: usize| -> Result<Selection> {
            if s >= f {
                return Err(ProbeError::InvalidInput(format!(
                    "slot {s} out of range: the task has {f} feature slots"
                )));
            }
            if panels < 2 {
                return Err(ProbeError::InvalidInput(
                    "the grid has fewer than 2 context panels".into(),
                ));
            }
            Ok(Selection {
                site: CodeSite {
                    query: n_ctx + s,
                    keys: vec![(panels - 2) * f + s, (panels - 1) * f + s],
                },
                slot: s,
            })
        };
        match self {
            Site::Paper => Ok(vec![slot_site(f.saturating_sub(1))?]),
            Site::Slot(s) => Ok(vec![slot_site(*s)?]),
            Site::AllSlots => (0..f).map(slot_site).collect(),
            Site::Explicit { query, keys } => {
                if keys.is_empty() {
                    return Err(ProbeError::InvalidInput(
                        "an explicit site needs at least one key".into(),
                    ));
                }
                if let Some(p) = std::iter::once(query).chain(keys.iter()).find(|&&p| p >= t) {
                    return Err(ProbeError::InvalidInput(format!(
                        "position {p} out of range: problems have {t} tokens"
                    )));
                }
                let slot = if *query >= n_ctx {
                    query - n_ctx
                } else {
                    query % f
                };
                Ok(vec![Selection {
                    site: CodeSite {
                        query: *query,
                        keys: keys.clone(),
                    },
                    slot,
                }])
            }
        }
    }
}

impl Site {
    /// The site of a fuzzy-logic sequence of `n_tokens`: `paper` is the last token's attention to
    /// itself ([`CodeSite::last_token`]), an explicit site is itself; `None` for the SRAVEN sites
    /// (`slot:F`, `all-slots`). Positions are checked where the codes are read.
    pub fn logic(&self, n_tokens: usize) -> Option<CodeSite> {
        match self {
            Site::Paper => Some(CodeSite::last_token(n_tokens)),
            Site::Explicit { query, keys } => Some(CodeSite {
                query: *query,
                keys: keys.clone(),
            }),
            Site::Slot(_) | Site::AllSlots => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_site_is_query_35_keys_27_31() -> Result<()> {
        let p = SravenParams::default();
        let sel = Site::Paper.resolve(&p)?;
        assert_eq!(
            sel,
            vec![Selection {
                site: CodeSite {
                    query: 35,
                    keys: vec![27, 31],
                },
                slot: 3,
            }]
        );
        // Positions by hand: panel 6 slot 3 = 6*4+3, panel 7 slot 3 = 7*4+3, query 32+3.
        let s1 = Site::Slot(1).resolve(&p)?;
        assert_eq!(
            s1,
            vec![Selection {
                site: CodeSite {
                    query: 33,
                    keys: vec![25, 29],
                },
                slot: 1,
            }]
        );
        let all = Site::AllSlots.resolve(&p)?;
        assert_eq!(all.len(), 4);
        assert_eq!(
            all[0],
            Selection {
                site: CodeSite {
                    query: 32,
                    keys: vec![24, 28],
                },
                slot: 0,
            }
        );
        assert_eq!(
            all[2],
            Selection {
                site: CodeSite {
                    query: 34,
                    keys: vec![26, 30],
                },
                slot: 2,
            }
        );
        Ok(())
    }

    #[test]
    fn parse_and_print_round_trip() -> Result<()> {
        for s in ["paper", "slot:2", "all-slots", "query:35;keys:27,31,3"] {
            assert_eq!(s.parse::<Site>()?.to_string(), s);
        }
        for bad in ["", "slot:x", "query:3", "query:3;keys:", "keys:1", "papers"] {
            assert!(bad.parse::<Site>().is_err(), "{bad}");
        }
        let p = SravenParams::default();
        assert!(Site::Slot(4).resolve(&p).is_err());
        assert!("query:36;keys:1".parse::<Site>()?.resolve(&p).is_err());
        let e = "query:6;keys:1,2".parse::<Site>()?.resolve(&p)?;
        assert_eq!(e[0].slot, 2);
        assert_eq!(
            Site::Paper.logic(7),
            Some(CodeSite {
                query: 6,
                keys: vec![6]
            })
        );
        assert_eq!(
            "query:3;keys:1,2".parse::<Site>()?.logic(7),
            Some(CodeSite {
                query: 3,
                keys: vec![1, 2]
            })
        );
        assert_eq!(Site::AllSlots.logic(7), None);
        Ok(())
    }
}
