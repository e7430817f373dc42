//! hyperlens train: the paper's training recipe on candle (`docs/spec/models.md`, "Training recipe").
//!
//! - [`optim::AdamW`]: AdamW with decoupled weight decay on parameters of 2 or more dimensions and a
//!   saveable state; [`schedule::WarmupCosine`]: linear warm-up, cosine decay to 0.1 x peak, then flat.
//! - [`run::train`]: the loop over a run directory: a fresh, seeded batch every update, attention
//!   dropout whose masks depend only on (seed, step), evaluation on ID / OOD sets, `metrics.csv`,
//!   atomic checkpoints (`config.json` + `model.safetensors` + `optimizer.safetensors` +
//!   `train_state.json`) from which a run resumes exactly, and `train.json` at the end.
//! - Tasks: [`sraven`] (cross-entropy over the 4 answer positions), [`logic`] (MSE at the last
//!   position, R²), [`induction`] (next-token cross-entropy of a causal token model).
//! - [`progress::ProgressText`]: the lines a front end prints while a run trains (one per evaluation).
//!
//! ```no_run
//! use hyperlens_train::{train, RunOptions, Task, TrainSettings};
//! # fn main() -> hyperlens_train::Result<()> {
//! let mut settings = TrainSettings::for_task(Task::Sraven);
//! settings.steps = 2000;
//! let outcome = train(std::path::Path::new("runs/demo"), &settings, &RunOptions::default(), |_| {
//!     std::ops::ControlFlow::Continue(())
//! })?;
//! println!("OOD accuracy {:?}", outcome.last_eval.map(|e| e.ood.metric));
//! # Ok(()) }
//! ```

pub mod checkpoint;
pub mod error;
pub mod group;
pub mod induction;
mod job;
pub mod launch;
pub mod logic;
pub mod logic_eval;
pub mod loss;
pub mod metrics;
pub mod optim;
pub mod progress;
pub mod run;
pub mod schedule;
pub mod settings;
pub mod sraven;
mod stacked;
pub mod state;

pub use error::{Result, TrainError};
pub use group::{
    check_run_name, shown_name, Combine, GroupFile, Variation, GROUP_FILE, MAX_RUN_NAME,
};
pub use hyperlens_model::Task;
pub use job::BatchLoss;
pub use launch::{new_group, resume_group, EndedRun, OutProblem};
pub use metrics::{Evaluation, MetricsRow, SetMetrics};
pub use optim::{AdamW, AdamWParams, Rates};
pub use progress::ProgressText;
pub use run::{
    check_group, check_memory, read_settings, run_settings, train, train_group, Event, GroupRun,
    RunOptions, TrainOutcome, TrainRecord, Updates, BATCHED_SETTINGS, FAILED_FILE,
};
pub use schedule::WarmupCosine;
pub use settings::{LogicSettings, ModelSize, SravenSettings, TrainSettings};
pub use state::{FailedRecord, TrainState};
