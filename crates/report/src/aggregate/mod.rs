//! Statistics over seeds: the report's checkpoints grouped by everything that defines a run
//! except its seed (and split, which the paper couples with the seed), with the mean, standard
//! error and n of each metric per group (Schug et al. 2025 report mean ± s.e. over three seeds,
//! Table A1). A group's key is read from the run's training settings (`train_state.json` or
//! `train.json`); a checkpoint without them (an imported one) forms its group with the
//! checkpoints of the same mixer and origin (`trained_by`).
//!
//! Written as `aggregate.csv` beside the report, shown as a Table A1-style table with each run's
//! own row beneath, and drawn against every setting that varies between groups (the shapes of the
//! paper's Fig. 4 and A5).
//!
//! Split like every section: [`measure`], then [`mod@figures`], [`text`], [`page`]; the data types are
//! in [`crate::data`] ([`crate::data::Aggregate`], [`crate::data::Group`], [`crate::data::RunPoint`]).

pub mod figures;
pub mod measure;
pub mod page;
pub mod text;

pub use figures::figures;
pub use measure::{key_fields, mean_se, metric_names, points};
pub use page::section;

/// File name of the aggregate table, beside `index.html`.
pub const AGGREGATE_FILE: &str = "aggregate.csv";
