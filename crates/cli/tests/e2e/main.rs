//! End-to-end tests of the `hyperlens` binary: each module runs one subcommand on tiny inputs in a
//! temporary directory and checks every output file (exists, parses, values in range).
//!
//! One integration-test binary for the CLI (`cargo test -p hyperlens --test e2e`), so the crate and
//! its dependencies are linked once.

mod circuits;
mod report;
