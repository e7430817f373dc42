//! `hyperlens info`: describe a checkpoint (config, mixer, parameter count, tensor table).

use std::path::PathBuf;

use clap::Args;

/// Arguments of `hyperlens info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The checkpoint directory (config.json + model.safetensors).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hyperlens info` ([`hyperlens_probe::checkpoint_info`]).
///
/// # Errors
/// A missing or invalid checkpoint (the error names the file and tensor).
pub fn run(args: InfoArgs) -> anyhow::Result<()> {
    let info = hyperlens_probe::checkpoint_info(&args.checkpoint)?;
    if args.json {
        // Through a `Value`: its keys sorted, as this output has always been.
        let value = serde_json::to_value(&info)?;
        outln!("{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(());
    }
    let config = &info.config;
    outln!("checkpoint   {}", args.checkpoint.display())?;
    outln!(
        "mixer        {} (paper: {}; normalisation {}, value network {})",
        config.mixer,
        config.mixer.paper_name(),
        config.mixer.normalisation(),
        config.mixer.value_network()
    )?;
    outln!(
        "sizes        d_in {}, T {}, F {}, D {}, H {}, d {}, layers {}, D_mlp {}, d_out {}, buckets {}, causal {}",
        config.d_in,
        config.n_tokens,
        config.n_outputs,
        config.d_model,
        config.n_heads,
        config.d_head,
        config.n_layers,
        config.d_mlp,
        config.d_out,
        config.n_buckets,
        config.causal
    )?;
    outln!("parameters   {}", config.n_params())?;
    outln!()?;
    outln!(
        "{:<26} {:<16} {:>8} {:>10} {:>10} {:>10}",
        "tensor",
        "shape",
        "numel",
        "mean",
        "std",
        "max|x|"
    )?;
    for r in &info.tensors {
        outln!(
            "{:<26} {:<16} {:>8} {:>10.4} {:>10.4} {:>10.4}",
            r.name,
            format!("{:?}", r.shape),
            r.numel,
            r.mean,
            r.std,
            r.max_abs
        )?;
    }
    Ok(())
}
