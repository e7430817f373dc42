//! SRAVEN, symbolic Raven progressive matrices: rules, tasks, splits and problem generation
//! (docs/spec/sraven.md; Schug et al. 2024, "Attention as a Hypernetwork", arXiv 2406.05816).

mod labels;
mod params;
mod problems;
mod rule;
mod sidecar;
mod split;

pub use labels::{panel_labels, token_labels};
pub use params::SravenParams;
pub use problems::{sample, AsProblemSet, ProblemSet, ProblemSetView, SampleStream, TrainStream};
pub use rule::Rule;
pub use sidecar::{SidecarAmbiguity, SravenSetSidecar, SravenSidecarArrays, SravenSidecarParams};
pub use split::{all_tasks, Set, Split, SplitName, Task};
