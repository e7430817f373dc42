//! `hyperlens tasks`: list the SRAVEN splits and sample problem sets to `.npz` (SRAVEN problems, or
//! fuzzy-logic sequences of `f(x) = max over K terms of min over the L literals`,
//! `docs/spec/sraven.md`, "The fuzzy-logic task").

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

pub use super::common::SetArg;
use super::dispatch::{logic_set, split_seed};
use hyperlens_model::Task;
use hyperlens_tasks::logic::{
    sample_problem_set, InputsVariant, LogicSetSidecar, ProblemSetParams,
};
use hyperlens_tasks::npz::{save_logic, save_problems};
use hyperlens_tasks::sraven::{
    sample, ProblemSet, Rule, Set, Split, SravenParams, SravenSetSidecar,
};

/// Task generators: list splits, sample problem sets.
#[derive(Debug, Subcommand)]
pub enum TasksCommand {
    /// List the SRAVEN splits with their in-distribution / OOD task counts.
    Splits,
    /// Sample a problem set and write it as .npz (arrays x uint8 of shape (N, T, M), y, rules, perms int64).
    Sample(SampleArgs),
    /// Generate a JSONL prompt file for a language model (icl or relations) and print its
    /// factors, held-out part and recommended --sites.
    Prompts(super::prompts::PromptsArgs),
    /// Validate a JSONL prompt file: print its factors and its counts per split and per label
    /// combination; --sites checks a site spec against the prompts' roles.
    CheckPrompts(super::prompts::CheckPromptsArgs),
}

/// Arguments of `hyperlens tasks sample`.
#[derive(Debug, Args)]
pub struct SampleArgs {
    /// Task family.
    #[arg(long, value_parser = super::common::task_parser(), default_value_t = Task::Sraven)]
    pub task: Task,
    /// Split: sraven paper-seed0, paper-seed1, paper-seed2, paper-seed2024 or seed{N}
    /// [default: paper-seed0]; logic seed{N} [default: seed0].
    #[arg(long)]
    pub split: Option<String>,
    /// Task set.
    #[arg(long, value_enum, default_value_t = SetArg::Id)]
    pub set: SetArg,
    /// Number of problems.
    #[arg(long, default_value_t = 2048)]
    pub n: usize,
    /// Seed of the evaluation stream (separate from the training stream of the same seed).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Identity feature permutations (the latent-code analysis uses them).
    #[arg(long)]
    pub unpermuted: bool,
    /// Output .npz file; a JSON sidecar beside it (`p.npz` -> `p.json`) records what produced it.
    #[arg(long)]
    pub out: PathBuf,
    /// Logic: samples (tokens) per sequence [default: 32].
    #[arg(long)]
    pub logic_samples: Option<usize>,
    /// Logic: fraction of the known-term pairs held out as the OOD set [default: 0.7].
    #[arg(long)]
    pub logic_frac_test: Option<f64>,
    /// Logic: one query for every sequence (the last token's inputs, drawn from --seed; the
    /// paper's `fixed_query` sets).
    #[arg(long, conflicts_with = "fixed_context")]
    pub fixed_query: bool,
    /// Logic: one context for every sequence (the first T - 1 tokens' inputs, drawn from --seed;
    /// the paper's `fixed_context` sets).
    #[arg(long)]
    pub fixed_context: bool,
}

/// Runs a `tasks` subcommand.
///
/// # Errors
/// Unknown split, unsupported `--task`, `--n 0`, or a file that cannot be written.
pub fn run(c: TasksCommand) -> Result<()> {
    match c {
        TasksCommand::Splits => {
            out!("{}", splits_table()?)?;
            Ok(())
        }
        TasksCommand::Sample(args) => {
            let summary = match args.task {
                Task::Logic => sample_logic_to_file(&args)?,
                Task::Sraven | Task::Induction => sample_to_file(&args)?,
            };
            out!("{summary}")?;
            Ok(())
        }
        TasksCommand::Prompts(args) => {
            out!("{}", super::prompts::generate(&args)?)?;
            Ok(())
        }
        TasksCommand::CheckPrompts(args) => {
            out!("{}", super::prompts::check(&args)?)?;
            Ok(())
        }
    }
}

/// The table printed by `tasks splits`.
fn splits_table() -> Result<String> {
    let mut out = format!(
        "{:<16} {:>9} {:>9}  source\n",
        "split", "id tasks", "ood tasks"
    );
    for name in Split::paper_names() {
        let s = Split::named(name)?;
        out += &format!(
            "{:<16} {:>9} {:>9}  paper's held-out list (reference JAX code)\n",
            s.name,
            s.id_tasks.len(),
            s.ood_tasks.len()
        );
    }
    let p = SravenParams::default();
    out += &format!(
        "{:<16} {:>9} {:>9}  our own seeded permutation of the {} tasks (any N)\n",
        "seed{N}",
        p.n_tasks() - p.n_ood_tasks(),
        p.n_ood_tasks(),
        p.n_tasks()
    );
    Ok(out)
}

/// Samples SRAVEN problems, writes the .npz and its sidecar, and returns the printed summary.
fn sample_to_file(args: &SampleArgs) -> Result<String> {
    if args.task != Task::Sraven {
        bail!(
            "--task {}: `tasks sample` writes sraven and logic problem sets",
            args.task
        );
    }
    if args.n == 0 {
        bail!("--n must be at least 1");
    }
    if args.logic_samples.is_some() || args.logic_frac_test.is_some() {
        bail!("--logic-samples and --logic-frac-test apply to --task logic");
    }
    if args.fixed_query || args.fixed_context {
        bail!("--fixed-query and --fixed-context apply to --task logic");
    }
    let split_name = args.split.as_deref().unwrap_or("paper-seed0");
    let split = Split::named(split_name).context("--split")?;
    let set = match args.set {
        SetArg::Id => Set::Id,
        SetArg::Ood => Set::Ood,
        SetArg::Unknown => bail!("--set unknown applies to --task logic (sraven has id and ood)"),
    };
    let problems = sample(&split, set, args.n, args.seed, args.unpermuted).map_err(n_flag)?;
    super::common::create_parent("--out", &args.out)?;
    let producer = format!("hyperlens {} tasks sample", env!("CARGO_PKG_VERSION"));
    let sidecar = SravenSetSidecar::new(
        &problems,
        split.name,
        set,
        args.seed,
        args.unpermuted,
        producer,
    )?;
    save_problems(&args.out, &problems)?;
    let side = hyperlens_io::write_sidecar(&args.out, &sidecar)?;
    Ok(summary(&problems, &split, &sidecar, &args.out, &side))
}

/// Samples a fuzzy-logic problem set to `--out` with its sidecar; returns the printed summary.
///
/// # Errors
/// A bad split or parameter, a size over the memory budget, a failed write.
fn sample_logic_to_file(args: &SampleArgs) -> Result<String> {
    if args.unpermuted {
        bail!("--unpermuted applies to --task sraven");
    }
    let name = args.split.as_deref().unwrap_or("seed0");
    // The training defaults (`train --task logic`): a set sampled with the same flags fits a
    // model trained with them.
    let p = ProblemSetParams {
        params: hyperlens_train::LogicSettings::default()
            .params()
            .with_overrides(args.logic_samples, args.logic_frac_test),
        split_seed: split_seed(name)?,
        set: logic_set(args.set),
        n: args.n,
        seed: args.seed,
        inputs: InputsVariant::from_flags(args.fixed_query, args.fixed_context)?,
    };
    let set = sample_problem_set(&p)
        .map_err(n_flag)
        .with_context(|| format!("--split {name} --set {}", p.set))?;
    super::common::create_parent("--out", &args.out)?;
    save_logic(&args.out, &set.problems)?;
    let producer = format!("hyperlens {} tasks sample", env!("CARGO_PKG_VERSION"));
    let sidecar = LogicSetSidecar::new(&set, &p, name, producer);
    let side = hyperlens_io::write_sidecar(&args.out, &sidecar)?;
    let tasks: BTreeSet<Vec<u32>> = set
        .problems
        .term_ids
        .outer_iter()
        .map(|r| r.to_vec())
        .collect();
    let q = &p.params;
    Ok(format!(
        "wrote {} logic problems ({name}, {} set, seed {}) to {} (+ {})\n\
         tasks covered: {} of {} in the set; L {} variables, K {} terms, T {} tokens\n",
        args.n,
        p.set,
        args.seed,
        args.out.display(),
        side.display(),
        tasks.len(),
        set.split.tasks(p.set).len(),
        q.variables,
        q.terms,
        q.samples,
    ))
}

/// Rule counts per unpermuted slot, indexed `[slot][rule]`.
fn rule_counts(problems: &ProblemSet) -> Vec<[usize; 8]> {
    let f = problems.params.features;
    let mut counts = vec![[0usize; 8]; f];
    for row in problems.rules.outer_iter() {
        for (slot, &r) in row.iter().enumerate() {
            if let Some(c) = counts.get_mut(slot).and_then(|c| c.get_mut(r as usize)) {
                *c += 1;
            }
        }
    }
    counts
}

/// The summary `tasks sample` prints for the SRAVEN problems written to `out` with the sidecar
/// `side` (`sidecar` its content).
fn summary(
    problems: &ProblemSet,
    split: &Split,
    sidecar: &SravenSetSidecar,
    out: &Path,
    side: &Path,
) -> String {
    let tasks: BTreeSet<Vec<i64>> = problems.rules.outer_iter().map(|r| r.to_vec()).collect();
    let mut text = format!(
        "wrote {} sraven problems ({}, {}, seed {}, {}) to {} (+ {})\n",
        problems.len(),
        split.name,
        sidecar.set,
        sidecar.seed,
        if sidecar.unpermuted {
            "unpermuted"
        } else {
            "permuted"
        },
        out.display(),
        side.display()
    );
    text += &format!(
        "tasks covered: {} of {}\n",
        tasks.len(),
        split.tasks(sidecar.set).len()
    );
    text += "rule counts per unpermuted slot (rules 0..7):\n";
    for (slot, c) in rule_counts(problems).iter().enumerate() {
        let cells: Vec<String> = c.iter().map(|v| format!("{v:>6}")).collect();
        text += &format!("  slot {slot}: {}\n", cells.join(""));
    }
    let names: Vec<String> = Rule::ALL
        .iter()
        .map(|r| format!("{}={}", r.index(), r.name()))
        .collect();
    text += &format!("  ({})\n", names.join(", "));
    text += &format!(
        "ambiguity: {:.2} % answer-differs (another consistent rule assignment changes the answer), \
         {:.2} % every-feature-differs (the reference code's count)\n",
        100.0 * sidecar.ambiguity.answer_differs,
        100.0 * sidecar.ambiguity.every_feature_differs
    );
    text
}

/// A sampling error, with a refusal of the memory budget attributed to `--n`.
fn n_flag(e: hyperlens_tasks::TasksError) -> anyhow::Error {
    match e {
        hyperlens_tasks::TasksError::Budget(b) => anyhow::Error::new(b).context("--n"),
        e => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh scratch directory under the system temp dir (removed by the caller).
    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("hyperlens-cli-tasks-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn args(out: PathBuf) -> SampleArgs {
        SampleArgs {
            task: Task::Sraven,
            split: Some("paper-seed2024".to_string()),
            set: SetArg::Ood,
            n: 300,
            seed: 3,
            unpermuted: true,
            out,
            logic_samples: None,
            logic_frac_test: None,
            fixed_query: false,
            fixed_context: false,
        }
    }

    #[test]
    fn sample_writes_npz_sidecar_and_summary() {
        let dir = scratch("sample");
        let out = dir.join("p.npz");
        let text = sample_to_file(&args(out.clone())).unwrap();
        let loaded = hyperlens_tasks::npz::load_problems(&out, &SravenParams::default()).unwrap();
        assert_eq!(loaded.len(), 300);
        let side: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("p.json")).unwrap()).unwrap();
        assert!(!dir.join("p.npz.json").exists());
        assert_eq!(side["split"], "paper-seed2024");
        assert_eq!(side["set"], "ood");
        // Counts in the summary add up to N per slot; the OOD list has 82 tasks.
        assert!(text.contains("of 82"), "{text}");
        let counts = rule_counts(&loaded);
        assert!(counts.iter().all(|c| c.iter().sum::<usize>() == 300));
        // Unpermuted: all perms identity.
        let p = loaded.perms.unwrap();
        assert!(p.indexed_iter().all(|((_, _, k), &v)| v == k as i64));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        let dir = scratch("flags");
        let mut a = args(dir.join("p.npz"));
        a.split = Some("paper-seed7".to_string());
        let e = format!("{:#}", sample_to_file(&a).unwrap_err());
        assert!(e.contains("paper-seed0") && e.contains("seed{N}"), "{e}");
        let mut a = args(dir.join("p.npz"));
        a.task = Task::Induction;
        assert!(format!("{:#}", sample_to_file(&a).unwrap_err()).contains("--task induction"));
        let mut a = args(dir.join("p.npz"));
        a.set = SetArg::Unknown;
        assert!(format!("{:#}", sample_to_file(&a).unwrap_err()).contains("--set unknown"));
        let mut a = args(dir.join("p.npz"));
        a.n = 0;
        assert!(sample_to_file(&a).is_err());
        let table = splits_table().unwrap();
        let rows = table
            .lines()
            .filter(|l| l.split_whitespace().skip(1).take(2).eq(["248", "82"]))
            .count();
        assert_eq!(rows, 5, "{table}");
        assert!(!dir.join("p.npz").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
