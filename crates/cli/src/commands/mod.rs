//! One module per subcommand: each exposes its clap `Args` (or subcommand enum) and a `run` function.

pub mod analyze;
pub mod attention;
pub mod cache;
pub mod circuits;
pub mod common;
pub mod dispatch;
pub mod eval;
pub mod import;
pub mod info;
pub mod patch;
pub mod probe;
pub mod prompts;
pub mod report;
pub mod study;
pub mod sweep;
pub mod tasks;
pub mod train;
