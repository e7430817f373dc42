//! One module per subcommand: each exposes its clap `Args` (or subcommand enum) and a `run` function.

pub mod analyze;
pub mod attention;
pub mod eval;
pub mod import;
pub mod info;
pub mod tasks;
