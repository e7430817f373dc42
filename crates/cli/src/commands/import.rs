//! `hyperlens import`: convert foreign parameter files into a native checkpoint directory.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hyperlens_model::import::import_jax_npz;
use hyperlens_model::{checkpoint, Mixer};

/// What to import.
#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// Import a `.npz` export of the paper's JAX/Flax code (flax paths joined with '/').
    Jax(JaxArgs),
}

/// Arguments of `hyperlens import jax`.
#[derive(Debug, Args)]
pub struct JaxArgs {
    /// The `.npz` parameter file (e.g. crates/model/tests/fixtures/paper-jax/hyla_params.npz).
    #[arg(long)]
    pub params: PathBuf,
    /// The mixer the model was trained with (the export does not record it): a CLI name such as
    /// `hyla`, `softmax`, `linear`, or the paper's method string (`linear_hypatt`, `transformer`, ...).
    #[arg(long)]
    pub mixer: Mixer,
    /// Output positions read at the end of the sequence (4 for SRAVEN).
    #[arg(long, default_value_t = 4)]
    pub n_outputs: usize,
    /// The checkpoint directory to write (config.json + model.safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Overwrite an existing checkpoint directory.
    #[arg(long)]
    pub force: bool,
}

/// Runs `hyperlens import`.
///
/// # Errors
/// Unreadable or malformed input (naming the key), an existing output without `--force`, or a
/// failed write.
pub fn run(cmd: ImportCommand) -> anyhow::Result<()> {
    match cmd {
        ImportCommand::Jax(args) => {
            if args.out.exists() && !args.force {
                bail!(
                    "{} already exists (use --force to overwrite)",
                    args.out.display()
                );
            }
            let (config, tensors) = import_jax_npz(&args.params, args.mixer, args.n_outputs)?;
            super::common::create_parent("--out", &args.out)?;
            checkpoint::save(&args.out, &config, &tensors)
                .with_context(|| format!("writing checkpoint {}", args.out.display()))?;
            outln!(
                "imported {} -> {}: mixer {}, {} layers, D {}, H {}, d {}, D_mlp {}, {} parameters",
                args.params.display(),
                args.out.display(),
                config.mixer,
                config.n_layers,
                config.d_model,
                config.n_heads,
                config.d_head,
                config.d_mlp,
                config.n_params()
            )?;
            Ok(())
        }
    }
}
