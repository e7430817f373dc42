//! hyperlens tasks: the SRAVEN benchmark (rules, tasks, paper splits, problem sets, an ambiguity
//! checker, `.npz` files), the fuzzy-logic task, and token corpora for circuit analyses (an induction
//! corpus and repeated random tokens).
//!
//! Specs: `docs/spec/sraven.md` (SRAVEN and fuzzy logic), `docs/spec/circuits.md` (induction).

pub mod ambiguity;
pub mod error;
pub mod induction;
pub mod logic;
pub mod npz;
pub mod prompts;
mod rng;
pub mod sraven;

pub use error::{Result, TasksError};
