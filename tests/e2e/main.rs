//! End-to-end tests of the `hyperlens` binary, one module per subcommand. Each runs the binary on
//! tiny inputs in a temporary directory and checks
//! - a success (exit 0) and the values of its outputs (shapes, ranges, agreement with a computation
//!   made here or with another subcommand);
//! - a failure of the command (exit 1: missing file, bad checkpoint, bad value, ...), reported as one
//!   line `error: ...` naming the file, flag or value;
//! - bad usage (exit 2, reported by clap: unknown flag, bad flag value, missing argument).
//!
//! One integration-test binary (`cargo test --release --test e2e`), so that the crate and its
//! dependencies are linked once; [`util`] is the one helper module.

mod util;

mod analyze;
mod analyze_lm;
mod attention;
mod cache;
mod circuits;
mod cli;
mod corpus;
mod corpus_sweeps;
mod corpus_values;
mod eval;
mod import;
mod info;
mod patch;
mod probe;
mod prompts;
mod report;
mod sweep;
mod tasks;
mod train;
