//! `hyperlens info`: describe a checkpoint (config, mixer, parameter count, tensor table).

use std::path::PathBuf;

use clap::Args;
use hyperlens_model::candle_core::Device;
use hyperlens_model::checkpoint;

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

/// One row of the tensor table.
#[derive(Debug, serde::Serialize)]
struct TensorRow {
    name: String,
    shape: Vec<usize>,
    numel: usize,
    mean: f64,
    std: f64,
    max_abs: f64,
}

/// Runs `hyperlens info`.
///
/// # Errors
/// A missing or invalid checkpoint (the error names the file and tensor).
pub fn run(args: InfoArgs) -> anyhow::Result<()> {
    let (config, tensors) = checkpoint::load(&args.checkpoint, &Device::Cpu)?;
    let mut rows = Vec::new();
    for (name, shape) in config.tensor_shapes() {
        let t = &tensors[&name];
        let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        let max_abs = v.iter().fold(0.0f64, |m, &x| m.max((x as f64).abs()));
        rows.push(TensorRow {
            numel: v.len(),
            name,
            shape,
            mean,
            std: var.sqrt(),
            max_abs,
        });
    }
    if args.json {
        let obj = serde_json::json!({
            "checkpoint": args.checkpoint,
            "config": config,
            "normalisation": config.mixer.normalisation().name(),
            "value_network": config.mixer.value_network().name(),
            "n_params": config.n_params(),
            "tensors": rows,
        });
        outln!("{}", serde_json::to_string_pretty(&obj)?)?;
        return Ok(());
    }
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
    for r in rows {
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
