//! What a training run does: the task, the model size, the paper's optimiser recipe and the
//! evaluation / checkpoint cadence. Saved verbatim in `train_state.json` and `train.json`, so a run
//! can be resumed exactly and its provenance read back.

use hyperlens_model::{Mixer, Task};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// Sizes of the SRAVEN task used for training (`hyperlens_tasks::sraven::SravenParams`; the paper
/// sweeps the number of features and the held-out fraction). Defaults: F 4, M 8, 25 % held out.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SravenSettings {
    /// F, features per panel.
    pub features: usize,
    /// M, values per feature.
    pub values: usize,
    /// Fraction of the tasks held out (OOD).
    pub holdout_fraction: f64,
}

impl Default for SravenSettings {
    fn default() -> Self {
        let p = hyperlens_tasks::sraven::SravenParams::default();
        SravenSettings {
            features: p.features,
            values: p.values,
            holdout_fraction: p.holdout_fraction,
        }
    }
}

impl SravenSettings {
    /// The tasks crate's parameters (3 x 3 grid).
    pub fn params(&self) -> hyperlens_tasks::sraven::SravenParams {
        hyperlens_tasks::sraven::SravenParams {
            features: self.features,
            values: self.values,
            holdout_fraction: self.holdout_fraction,
            ..Default::default()
        }
    }
}

/// Sizes of the fuzzy-logic task used for training (`hyperlens_tasks::logic::LogicParams`).
/// Defaults are the setting of the paper's headline table: L 4, K 2, 25 % unknown terms, 70 % of
/// the known-term pairs held out, 32 samples per sequence (`docs/spec/models.md`, Table A1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LogicSettings {
    /// L, number of variables.
    pub variables: usize,
    /// K, terms per task.
    pub terms: usize,
    /// Fraction of the 2^L terms never trained.
    pub unknown_fraction: f64,
    /// Fraction of the known-term pairs held out (the OOD set).
    pub frac_test: f64,
    /// N, samples (tokens) per sequence.
    pub samples: usize,
}

impl Default for LogicSettings {
    fn default() -> Self {
        LogicSettings {
            variables: 4,
            terms: 2,
            unknown_fraction: 0.25,
            frac_test: 0.7,
            samples: 32,
        }
    }
}

impl LogicSettings {
    /// The tasks crate's parameters.
    pub fn params(&self) -> hyperlens_tasks::logic::LogicParams {
        hyperlens_tasks::logic::LogicParams {
            variables: self.variables,
            terms: self.terms,
            unknown_fraction: self.unknown_fraction,
            frac_test: self.frac_test,
            samples: self.samples,
        }
    }
}

/// The induction corpus used for training (`hyperlens_tasks::induction::CorpusParams`, whose
/// defaults these are: V 64, T 64, bigram strength 3, repeat probability 0.05, copies of 4..=12).
pub type InductionSettings = hyperlens_tasks::induction::CorpusParams;

/// Explicit model sizes, overriding the ones derived from `width` (for small experiments and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSize {
    /// Residual width D.
    pub d_model: usize,
    /// Heads per layer H.
    pub n_heads: usize,
    /// Per-head width d of queries, keys and values.
    pub d_head: usize,
    /// MLP hidden width (ignored by attention-only models).
    pub d_mlp: usize,
}

/// Everything that defines a training run. Construct with [`TrainSettings::for_task`] and adjust.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSettings {
    /// The task.
    pub task: Task,
    /// The sequence mixer of every layer.
    pub mixer: Mixer,
    /// The split: SRAVEN `paper-seed0|1|2|2024` or `seed{N}`; logic `seed{N}` (seed of the task
    /// shuffle); induction `seed{N}` (seed of the bigram table).
    pub split: String,
    /// Seed of the initialisation, the training stream and the dropout masks.
    pub seed: u64,
    /// Total number of optimiser updates.
    pub steps: u64,
    /// Problems (sequences) per update.
    pub batch: usize,
    /// Peak learning rate (paper grid: 1e-3, 3e-4).
    pub lr: f64,
    /// Decoupled weight decay on parameters with 2 or more dimensions (paper grid: 0.1, 0.3).
    pub weight_decay: f64,
    /// Linear warm-up steps (paper grid: 1000, 3000; logic 100).
    pub warmup: u64,
    /// Attention dropout rate on the normalised scores (0.1 in the paper).
    pub dropout: f64,
    /// Number of layers.
    pub layers: usize,
    /// Width multiplier (SRAVEN: 1, 2 or 4; logic and induction: multiplies D, H and D_mlp).
    pub width: usize,
    /// Induction only: an attention-only model (no MLP, no LayerNorm; 0, 1 or 2 layers).
    pub attn_only: bool,
    /// Explicit sizes instead of the paper's sizes at `width` (`width` must then be 1).
    #[serde(default)]
    pub size: Option<ModelSize>,
    /// Evaluate every this many steps (and at the end); 0 = only at the end.
    pub eval_every: u64,
    /// Problems (sequences) per evaluation set.
    pub eval_n: usize,
    /// Seed of the evaluation sets (domain-separated from the training stream in the tasks crate,
    /// so evaluation never reuses training problems).
    pub eval_seed: u64,
    /// Write a checkpoint every this many steps (and at the end); 0 = only at the end.
    pub checkpoint_every: u64,
    /// Write a training row to `metrics.csv` every this many steps.
    pub log_every: u64,
    /// SRAVEN task sizes (used when `task` is sraven).
    #[serde(default)]
    pub sraven: SravenSettings,
    /// Logic task sizes (used when `task` is logic).
    pub logic: LogicSettings,
    /// Induction corpus (used when `task` is induction; its `seed` is set from `split`).
    pub induction: InductionSettings,
}

impl TrainSettings {
    /// Settings from their JSON (the form of the run files' `settings`), checked ([`Self::check`]).
    ///
    /// # Errors
    /// [`TrainError::SettingsJson`] for text that is not JSON (NaN and infinity are not JSON
    /// numbers), or whose fields are not the settings', naming the first field that fails on its
    /// own; the errors of [`Self::check`].
    pub fn from_json(text: &str) -> Result<TrainSettings> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            TrainError::SettingsJson(format!(
                "training settings are not JSON (NaN and infinity are not JSON numbers): {e}"
            ))
        })?;
        let s: TrainSettings = serde_json::from_value(value.clone()).map_err(|e| {
            TrainError::SettingsJson(format!(
                "training settings: {}",
                Self::field_error(&value, e)
            ))
        })?;
        s.check()?;
        Ok(s)
    }

    /// serde's error for the settings `value`, prefixed with the first field that fails on its
    /// own: each field of `value` is put in turn into the task's default settings and parsed (a
    /// struct's error names no field).
    fn field_error(value: &serde_json::Value, e: serde_json::Error) -> String {
        let task = value
            .get("task")
            .and_then(|t| t.as_str())
            .and_then(|t| t.parse::<Task>().ok())
            .unwrap_or(Task::Sraven);
        let (Ok(base), Some(fields)) = (
            serde_json::to_value(TrainSettings::for_task(task)),
            value.as_object(),
        ) else {
            return e.to_string();
        };
        for (key, v) in fields {
            let mut one = base.clone();
            one[key.as_str()] = v.clone();
            if let Err(e) = serde_json::from_value::<TrainSettings>(one) {
                return format!("`{key}`: {e}");
            }
        }
        e.to_string()
    }

    /// The paper's recipe for `task` (`docs/spec/models.md`, "Training recipe"): SRAVEN HYLA, 4 layers,
    /// width 1, 156,250 steps of batch 128, lr 1e-3, wd 0.1, warm-up 1000, dropout 0.1; logic 2 layers,
    /// 50,000 steps, warm-up 100; induction a 2-layer softmax token model, 3,000 steps of batch 32,
    /// warm-up 100, no dropout.
    pub fn for_task(task: Task) -> TrainSettings {
        let base = TrainSettings {
            task,
            mixer: Mixer::Hyla,
            split: "paper-seed0".into(),
            seed: 0,
            steps: 156_250,
            batch: 128,
            lr: 1e-3,
            weight_decay: 0.1,
            warmup: 1000,
            dropout: 0.1,
            layers: 4,
            width: 1,
            attn_only: false,
            size: None,
            eval_every: 2500,
            eval_n: 4096,
            eval_seed: 0,
            checkpoint_every: 5000,
            log_every: 100,
            sraven: SravenSettings::default(),
            logic: LogicSettings::default(),
            induction: InductionSettings::default(),
        };
        match task {
            Task::Sraven => base,
            Task::Logic => TrainSettings {
                split: "seed0".into(),
                steps: 50_000,
                warmup: 100,
                layers: 2,
                ..base
            },
            Task::Induction => TrainSettings {
                mixer: Mixer::Softmax,
                split: "seed0".into(),
                steps: 3000,
                batch: 32,
                warmup: 100,
                dropout: 0.0,
                layers: 2,
                eval_every: 500,
                eval_n: 256,
                checkpoint_every: 1000,
                log_every: 50,
                ..base
            },
        }
    }

    /// The seed `N` of a `seed{N}` split name.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] naming `--split` if the name is not `seed{N}`.
    pub fn split_seed(&self) -> Result<u64> {
        self.split
            .parse::<hyperlens_tasks::sraven::SplitName>()
            .ok()
            .and_then(hyperlens_tasks::sraven::SplitName::seed)
            .ok_or_else(|| {
                TrainError::InvalidParam(format!(
                    "--split `{}`: the {} task takes a split `seed{{N}}`",
                    self.split, self.task
                ))
            })
    }

    /// Validates every field once.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] naming the flag: zero steps / batch / layers / log interval /
    /// evaluation size, a learning rate that is not positive, a negative weight decay, a dropout rate
    /// outside [0, 1), a bad width, `attn_only` outside the induction task, or bad task sizes.
    pub fn check(&self) -> Result<()> {
        let bad = |msg: String| Err(TrainError::InvalidParam(msg));
        if self.steps == 0 {
            return bad("--steps must be at least 1".into());
        }
        if self.batch == 0 {
            return bad("--batch must be at least 1".into());
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr must be positive, got {}", self.lr));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(format!(
                "--weight-decay must be non-negative, got {}",
                self.weight_decay
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("--dropout must be in [0, 1), got {}", self.dropout));
        }
        if self.log_every == 0 {
            return bad("--log-every must be at least 1".into());
        }
        if self.eval_n == 0 {
            return bad("--eval-n must be at least 1".into());
        }
        if self.width == 0 {
            return bad("--width must be at least 1".into());
        }
        if let Some(z) = self.size {
            if self.width != 1 {
                return bad(format!(
                    "--width must be 1 with explicit model sizes, got {}",
                    self.width
                ));
            }
            for (flag, v) in [
                ("--d-model", z.d_model),
                ("--heads", z.n_heads),
                ("--d-head", z.d_head),
                ("--d-mlp", z.d_mlp),
            ] {
                if v == 0 {
                    return bad(format!("{flag} must be at least 1, got 0"));
                }
            }
        }
        if self.attn_only && self.task != Task::Induction {
            return bad(format!(
                "--attn-only applies to the induction task, not {}",
                self.task
            ));
        }
        match self.task {
            Task::Sraven => {
                if self.layers == 0 {
                    return bad("--layers must be at least 1".into());
                }
                if ![1, 2, 4].contains(&self.width) {
                    return bad(format!(
                        "--width must be 1, 2 or 4 for sraven, got {}",
                        self.width
                    ));
                }
                hyperlens_tasks::sraven::Split::named_with(&self.split, self.sraven.params())
                    .map_err(name_the_flag)?;
            }
            Task::Logic => {
                if self.layers == 0 {
                    return bad("--layers must be at least 1".into());
                }
                self.split_seed()?;
                self.logic.params().check().map_err(name_the_flag)?;
            }
            Task::Induction => {
                if self.attn_only && self.layers > 2 {
                    return bad(format!(
                        "--attn-only models have 0, 1 or 2 layers (the circuits paper's presets), got {}",
                        self.layers
                    ));
                }
                self.split_seed()?;
                self.induction.check().map_err(name_the_flag)?;
            }
        }
        Ok(())
    }

    /// Settings that are valid but probably not what the user meant, one sentence each (without a
    /// `warning:` prefix): today a run shorter than its warm-up, whose learning rate never reaches
    /// its peak (`--steps 300` with the default warm-up of 1000 trains at chance).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.steps < self.warmup {
            out.push(format!(
                "--steps {} is shorter than the warm-up ({} steps): the learning rate never reaches its peak",
                self.steps, self.warmup
            ));
        }
        out
    }
}

/// The `hyperlens train` flag that sets a task parameter of the tasks crate, by the parameter's
/// field name (`None` for parameters without a flag).
fn flag_of(param: &str) -> Option<&'static str> {
    Some(match param {
        "features" => "--features",
        "values" => "--values",
        "holdout_fraction" => "--holdout",
        "samples" => "--logic-samples",
        "frac_test" => "--logic-frac-test",
        "vocab" => "--vocab",
        "seq_len" => "--seq-len",
        "bigram_strength" => "--bigram-strength",
        "repeat_prob" => "--repeat-prob",
        _ => return None,
    })
}

/// A task-parameter error of the tasks crate, reworded to name the flag that sets the parameter
/// (`--holdout: 1.5 is not in [0, 1)` rather than the field name `holdout_fraction`).
fn name_the_flag(e: hyperlens_tasks::error::TasksError) -> TrainError {
    match e {
        hyperlens_tasks::error::TasksError::InvalidParam { name, reason } => match flag_of(name) {
            Some(flag) => TrainError::InvalidParam(format!("{flag}: {reason}")),
            None => hyperlens_tasks::error::TasksError::InvalidParam { name, reason }.into(),
        },
        other => other.into(),
    }
}

/// A model config with the explicit sizes of `size`, if any, then checked.
///
/// # Errors
/// [`TrainError::Model`] if the resulting config is invalid.
pub fn apply_size(
    cfg: hyperlens_model::Config,
    size: Option<ModelSize>,
) -> Result<hyperlens_model::Config> {
    let cfg = match size {
        Some(z) => hyperlens_model::Config {
            d_model: z.d_model,
            n_heads: z.n_heads,
            d_head: z.d_head,
            d_mlp: z.d_mlp,
            ..cfg
        },
        None => cfg,
    };
    cfg.check()?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_paper_and_check() {
        let s = TrainSettings::for_task(Task::Sraven);
        assert_eq!(
            (s.steps, s.batch, s.warmup, s.layers),
            (156_250, 128, 1000, 4)
        );
        assert_eq!((s.lr, s.weight_decay, s.dropout), (1e-3, 0.1, 0.1));
        s.check().unwrap();
        let l = TrainSettings::for_task(Task::Logic);
        assert_eq!((l.steps, l.warmup, l.layers), (50_000, 100, 2));
        l.check().unwrap();
        assert_eq!(l.split_seed().unwrap(), 0);
        TrainSettings::for_task(Task::Induction).check().unwrap();
    }

    #[test]
    fn check_names_the_flag() {
        let mut s = TrainSettings::for_task(Task::Sraven);
        s.width = 3;
        assert!(s.check().unwrap_err().to_string().contains("--width"));
        let mut s = TrainSettings::for_task(Task::Sraven);
        s.attn_only = true;
        assert!(s.check().unwrap_err().to_string().contains("--attn-only"));
        let mut s = TrainSettings::for_task(Task::Sraven);
        s.dropout = 1.0;
        assert!(s.check().unwrap_err().to_string().contains("--dropout"));
        let mut s = TrainSettings::for_task(Task::Sraven);
        s.split = "nope".into();
        assert!(s.check().is_err());
        let mut s = TrainSettings::for_task(Task::Logic);
        s.split = "paper-seed0".into();
        assert!(s.check().unwrap_err().to_string().contains("--split"));
        let mut s = TrainSettings::for_task(Task::Induction);
        s.attn_only = true;
        s.layers = 3;
        assert!(s.check().unwrap_err().to_string().contains("--attn-only"));
        // Task parameters of the tasks crate are named by their flag, not their field.
        let mut s = TrainSettings::for_task(Task::Sraven);
        s.split = "seed3".into();
        s.sraven.holdout_fraction = 1.5;
        let e = s.check().unwrap_err().to_string();
        assert!(e.contains("--holdout: 1.5"), "{e}");
        let mut s = TrainSettings::for_task(Task::Induction);
        s.induction.seq_len = 1;
        let e = s.check().unwrap_err().to_string();
        assert!(e.contains("--seq-len: 1"), "{e}");
        let mut s = TrainSettings::for_task(Task::Logic);
        s.logic.samples = 0;
        let e = s.check().unwrap_err().to_string();
        assert!(e.contains("--logic-samples"), "{e}");
        assert_eq!("logic".parse::<Task>().unwrap(), Task::Logic);
        assert!("raven".parse::<Task>().is_err());
    }

    #[test]
    fn a_run_shorter_than_its_warm_up_is_warned_about() {
        let mut s = TrainSettings::for_task(Task::Sraven);
        assert!(s.warnings().is_empty());
        s.steps = 300;
        assert_eq!(
            s.warnings(),
            ["--steps 300 is shorter than the warm-up (1000 steps): the learning rate never reaches its peak"]
        );
        // A run exactly as long as its warm-up ends at (W - 1) / W of the peak: no warning.
        s.steps = 1000;
        assert!(s.warnings().is_empty());
    }

    #[test]
    fn json_round_trip() {
        let s = TrainSettings::for_task(Task::Logic);
        let j = serde_json::to_string(&s).unwrap();
        assert!(j.contains("\"task\":\"logic\""));
        assert_eq!(serde_json::from_str::<TrainSettings>(&j).unwrap(), s);
    }
}
