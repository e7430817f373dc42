//! End-to-end tests of the `hyperlens` binary: each module runs one subcommand on tiny inputs in a
//! temporary directory and checks every output file (exists, parses, values in range).
//!
//! One integration-test binary for the CLI (`cargo test -p hyperlens --test e2e`), so the crate and
//! its dependencies are linked once.

mod circuits;
mod report;

/// The package directory, read at run time: cargo sets `CARGO_MANIFEST_DIR` for the test binaries it
/// runs, so a test binary reused from a target directory that was built in a clone at another path
/// still finds its fixtures (the compile-time `env!` value would point into that other clone).
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || env!("CARGO_MANIFEST_DIR").into(),
        std::path::PathBuf::from,
    )
}
