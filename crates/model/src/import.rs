//! Importer for the paper's JAX/Flax parameter exports (`np.savez` of the flax `params` tree, keys
//! joined with `/`, e.g. `transformer_block_0/sequence_mixer/query/kernel`), as in
//! `crates/model/tests/fixtures/paper-jax/` (`scripts/export_jax_checkpoint.py` writes one). Key list: `docs/spec/models.md`, "Parameter names in the
//! paper code". Flax kernels are `[in, out]` (row-vector convention), like ours.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::Path;

use candle_core::{Device, Tensor};
use ndarray::{ArrayD, IxDyn, OwnedRepr};
use ndarray_npy::NpzReader;

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::mixer::Mixer;

/// Where a tensor of ours comes from in the flax tree.
struct Source {
    key: String,
    /// Expected flax shape.
    shape: Vec<usize>,
    /// `[D, H, d] -> [H, D, d]` (q/k/v kernels).
    heads_first: bool,
}

fn source_of(cfg: &Config, name: &str) -> Option<Source> {
    let (dm, h, d) = (cfg.d_model, cfg.n_heads, cfg.d_head);
    let plain = |key: String, shape: Vec<usize>| {
        Some(Source {
            key,
            shape,
            heads_first: false,
        })
    };
    match name {
        "embed.W_E" => return plain("embedding/kernel".into(), vec![cfg.d_in, dm]),
        "embed.b_E" => return plain("embedding/bias".into(), vec![dm]),
        "ln_final.w" => return plain("decoder_norm/scale".into(), vec![dm]),
        "ln_final.b" => return plain("decoder_norm/bias".into(), vec![dm]),
        "unembed.W_U" => return plain("logitdense/kernel".into(), vec![dm, cfg.d_out]),
        "unembed.b_U" => return plain("logitdense/bias".into(), vec![cfg.d_out]),
        _ => {}
    }
    let rest = name.strip_prefix("blocks.")?;
    let (l, field) = rest.split_once('.')?;
    let b = format!("transformer_block_{l}");
    let sm = format!("{b}/sequence_mixer");
    let st = format!("{b}/state_mixer");
    match field {
        "ln1.w" => plain(format!("{b}/norm1/scale"), vec![dm]),
        "ln1.b" => plain(format!("{b}/norm1/bias"), vec![dm]),
        "ln2.w" => plain(format!("{b}/norm2/scale"), vec![dm]),
        "ln2.b" => plain(format!("{b}/norm2/bias"), vec![dm]),
        "attn.W_Q" | "attn.W_K" | "attn.W_V" => {
            let which = match field {
                "attn.W_Q" => "query",
                "attn.W_K" => "key",
                _ => "value",
            };
            Some(Source {
                key: format!("{sm}/{which}/kernel"),
                shape: vec![dm, h, d],
                heads_first: true,
            })
        }
        "attn.b_Q" => plain(format!("{sm}/query/bias"), vec![h, d]),
        "attn.b_K" => plain(format!("{sm}/key/bias"), vec![h, d]),
        "attn.b_V" => plain(format!("{sm}/value/bias"), vec![h, d]),
        "attn.W_O" => plain(format!("{sm}/out/kernel"), vec![h, d, dm]),
        "attn.b_O" => plain(format!("{sm}/out/bias"), vec![dm]),
        "attn.rel_pos" => plain(
            format!("{b}/relative_embedding/rel_embedding"),
            vec![h, cfg.n_buckets],
        ),
        "mlp.W_in" => plain(format!("{st}/Dense_0/kernel"), vec![dm, cfg.d_mlp]),
        "mlp.b_in" => plain(format!("{st}/Dense_0/bias"), vec![cfg.d_mlp]),
        "mlp.W_out" => plain(format!("{st}/Dense_1/kernel"), vec![cfg.d_mlp, dm]),
        "mlp.b_out" => plain(format!("{st}/Dense_1/bias"), vec![dm]),
        _ => None,
    }
}

struct Npz<'a> {
    path: &'a Path,
    reader: NpzReader<File>,
}

impl Npz<'_> {
    fn err(&self, key: &str, msg: impl Into<String>) -> ModelError {
        ModelError::Import {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            msg: msg.into(),
        }
    }

    /// Reads an array as f32 (f64 arrays are converted).
    fn read(&mut self, key: &str) -> Result<ArrayD<f32>> {
        match self.reader.by_name::<OwnedRepr<f32>, IxDyn>(key) {
            Ok(a) => Ok(a),
            Err(e32) => match self.reader.by_name::<OwnedRepr<f64>, IxDyn>(key) {
                Ok(a) => Ok(a.mapv(|x| x as f32)),
                Err(_) => Err(self.err(key, format!("cannot read as a float32 array: {e32}"))),
            },
        }
    }

    fn shape(&mut self, key: &str, rank: usize) -> Result<Vec<usize>> {
        let a = self.read(key)?;
        if a.ndim() != rank {
            return Err(self.err(
                key,
                format!("expected rank {rank}, got shape {:?}", a.shape()),
            ));
        }
        Ok(a.shape().to_vec())
    }
}

/// Reads a paper JAX `.npz` export and returns the config (sizes inferred from the shapes) and our
/// tensors in canonical order, on the CPU.
///
/// The mixer is not recorded in the export and must be given (`linear_hypatt` -> [`Mixer::Hyla`],
/// ...). `n_outputs` is the number of output positions (4 for SRAVEN); `n_tokens` is taken to be
/// the relative-position `max_distance` = number of buckets (36 for SRAVEN), as in the paper.
///
/// # Shapes
/// Flax q/k/v kernels `[D, H, d]` become `W_Q/W_K/W_V [H, D, d]`; every other array keeps its
/// layout (`out/kernel [H, d, D]` = `W_O`, dense kernels `[in, out]`).
///
/// # Errors
/// [`ModelError::Io`] if the file cannot be opened; [`ModelError::Import`] naming the key for a
/// missing, misshapen, non-float, non-finite or unexpected array; [`ModelError::Config`] if the
/// inferred sizes are invalid.
pub fn import_jax_npz(
    path: &Path,
    mixer: Mixer,
    n_outputs: usize,
) -> Result<(Config, Vec<(String, Tensor)>)> {
    // Sizes in the headers are checked against the bytes present and the memory budget before
    // ndarray-npy allocates anything.
    hyperlens_io::inspect_npz(path).map_err(|e| {
        let (key, msg) = match e {
            hyperlens_io::IoError::Invalid { array, msg, .. } => (array, msg),
            other => (String::new(), other.to_string()),
        };
        ModelError::Import {
            path: path.to_path_buf(),
            key,
            msg,
        }
    })?;
    let file = File::open(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let reader = NpzReader::new(file).map_err(|e| ModelError::Import {
        path: path.to_path_buf(),
        key: String::new(),
        msg: format!("not a readable .npz archive: {e}"),
    })?;
    let mut npz = Npz { path, reader };
    let names: BTreeSet<String> = npz
        .reader
        .names()
        .map_err(|e| npz.err("", format!("cannot list arrays: {e}")))?
        .into_iter()
        .collect();
    let need = |npz: &Npz, key: &str| -> Result<()> {
        if names.contains(key) {
            Ok(())
        } else {
            Err(npz.err(key, "missing"))
        }
    };
    for key in [
        "embedding/kernel",
        "transformer_block_0/sequence_mixer/query/kernel",
        "transformer_block_0/state_mixer/Dense_0/kernel",
        "transformer_block_0/relative_embedding/rel_embedding",
        "logitdense/kernel",
    ] {
        need(&npz, key)?;
    }
    let emb = npz.shape("embedding/kernel", 2)?;
    let qk = npz.shape("transformer_block_0/sequence_mixer/query/kernel", 3)?;
    let mlp = npz.shape("transformer_block_0/state_mixer/Dense_0/kernel", 2)?;
    let rel = npz.shape("transformer_block_0/relative_embedding/rel_embedding", 2)?;
    let out = npz.shape("logitdense/kernel", 2)?;
    let n_layers = (0..)
        .take_while(|l| {
            names
                .iter()
                .any(|n| n.starts_with(&format!("transformer_block_{l}/")))
        })
        .count();
    let config = Config {
        d_in: emb[0],
        n_tokens: rel[1],
        n_outputs,
        d_model: emb[1],
        n_heads: qk[1],
        d_head: qk[2],
        n_layers,
        d_mlp: mlp[1],
        d_out: out[1],
        n_buckets: rel[1],
        causal: false,
        mixer,
    };
    config.check()?;
    let mut used = BTreeSet::new();
    let mut tensors = Vec::new();
    for (name, shape) in config.tensor_shapes() {
        let src = source_of(&config, &name)
            .ok_or_else(|| ModelError::Input(format!("no flax key for tensor `{name}`")))?;
        need(&npz, &src.key)?;
        let a = npz.read(&src.key)?;
        if a.shape() != src.shape.as_slice() {
            return Err(npz.err(
                &src.key,
                format!(
                    "shape {:?}, expected {:?} (from the inferred sizes)",
                    a.shape(),
                    src.shape
                ),
            ));
        }
        if let Some(i) = a.iter().position(|x| !x.is_finite()) {
            return Err(npz.err(&src.key, format!("non-finite value at flat index {i}")));
        }
        let a = if src.heads_first {
            a.permuted_axes(IxDyn(&[1, 0, 2]))
        } else {
            a
        };
        let data: Vec<f32> = a.as_standard_layout().iter().copied().collect();
        tensors.push((name, Tensor::from_vec(data, shape, &Device::Cpu)?));
        used.insert(src.key);
    }
    if let Some(extra) = names.iter().find(|n| !used.contains(*n)) {
        return Err(npz.err(
            extra,
            "unexpected array: not a parameter of the paper's SRAVEN transformer".to_string(),
        ));
    }
    Ok((config, tensors))
}
