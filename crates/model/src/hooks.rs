//! Hook points of the SRAVEN / fuzzy-logic transformer: every activation of the forward pass by its
//! TransformerLens name, to read (a cache) or to replace (an intervention).
//!
//! [`Transformer::run_with_hooks`] runs the forward pass of [`Transformer::forward`] (the same body,
//! `crate::nn::Block::forward` with the hooks as its type parameter, `crate::nn::hook_point`) and
//! calls a [`HookFn`] at each hook point, in this order (TransformerLens 3.x names and meanings, on
//! this architecture; `docs/spec/models.md`):
//!
//! | hook | shape | value |
//! |---|---|---|
//! | `hook_embed` | `[B, T, D]` | `x W_E + b_E` |
//! | `blocks.{l}.hook_resid_pre` | `[B, T, D]` | the residual stream entering block `l` |
//! | `blocks.{l}.ln1.hook_scale` | `[B, T, 1]` | LayerNorm 1's divisor `sqrt(var + eps)` |
//! | `blocks.{l}.ln1.hook_normalized` | `[B, T, D]` | `(x - mean) / scale`, before LayerNorm 1's weight and bias (as TransformerLens 3.x) |
//! | `blocks.{l}.attn.hook_q`, `hook_k`, `hook_v` | `[B, T, H, d]` | the projections with their biases (`q` not yet divided by √d) |
//! | `blocks.{l}.attn.hook_attn_scores` | `[B, H, Q, K]` | `q·k / √d` plus the relative-position bias, before the normalisation |
//! | `blocks.{l}.attn.hook_pattern` | `[B, H, Q, K]` | the normalised scores (softmax over keys, RMSHead over heads, or none): the latent codes |
//! | `blocks.{l}.attn.hook_value_hidden` | `[B, Q, K, d]` | HYLA's value-network hidden units, `act(Σ_h a[h,q,k] v[k,h])` (`mlp_relu` / `mlp_linear` value networks only; hyperlens's own hook) |
//! | `blocks.{l}.attn.hook_z` | `[B, Q, H, d]` | each head's output before `W_O` |
//! | `blocks.{l}.hook_attn_out` | `[B, T, D]` | `z W_O + b_O` |
//! | `blocks.{l}.hook_resid_mid` | `[B, T, D]` | `resid_pre + attn_out` (blocks with an MLP) |
//! | `blocks.{l}.ln2.hook_scale`, `ln2.hook_normalized` | `[B, T, 1]`, `[B, T, D]` | the same for LayerNorm 2 |
//! | `blocks.{l}.mlp.hook_pre`, `hook_post` | `[B, T, d_mlp]` | before and after the GELU |
//! | `blocks.{l}.hook_mlp_out` | `[B, T, D]` | the MLP's output |
//! | `blocks.{l}.hook_resid_post` | `[B, T, D]` | the residual stream leaving block `l` |
//! | `ln_final.hook_scale`, `ln_final.hook_normalized` | `[B, T, 1]`, `[B, T, D]` | the same for the final LayerNorm, at every position (the logits read the last `F`) |
//!
//! The hooked pass uses the reference form of the attention's normalisation and value network
//! (`ops::reference`), so that the pattern, the hidden units and `z` exist as tensors that a hook
//! may replace; everything else runs in the model's [`crate::Ops`]. Its logits equal those of
//! [`Transformer::forward`] up to float32 rounding (tested to 1e-5), and exactly when no hook
//! replaces anything and the model runs [`crate::Ops::Reference`].

use candle_core::Tensor;

use crate::error::{ModelError, Result};
use crate::mixer::ValueNetwork;
use crate::ops::reference::normalise;
use crate::transformer::Transformer;
use crate::Config;

/// What runs at the hook points of [`Transformer::run_with_hooks`].
pub trait HookFn {
    /// Whether the hook wants the activation `name` (the pass skips the others at no cost).
    fn wants(&self, name: &str) -> bool;

    /// Called with the activation `name` (its shape in the module table); returns a tensor of the
    /// same shape, dtype and device to replace it, or `None` to leave it.
    ///
    /// # Errors
    /// Whatever the hook reports; the pass stops with it.
    fn call(&mut self, name: &str, value: &Tensor) -> Result<Option<Tensor>>;
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters without a `.`
/// (`blocks.*.hook_resid_post`, `blocks.0.attn.*`) and `**` for any run at all.
///
/// Stars pair from the left: `***` is `**` then `*`. Runs in time `O(len(pattern) * len(name))`
/// (a dynamic programme over the name's prefixes, so runs of stars cannot make it backtrack).
pub fn matches(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    // reach[j]: the pattern read so far matches `n[..j]`.
    let mut reach = vec![false; n.len() + 1];
    reach[0] = true;
    let mut next = vec![false; n.len() + 1];
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'*' => {
                let any = p.get(i + 1) == Some(&b'*');
                i += if any { 2 } else { 1 };
                next[0] = reach[0];
                for j in 1..=n.len() {
                    next[j] = reach[j] || (next[j - 1] && (any || n[j - 1] != b'.'));
                }
            }
            c => {
                i += 1;
                next[0] = false;
                for j in 1..=n.len() {
                    next[j] = reach[j - 1] && n[j - 1] == c;
                }
            }
        }
        std::mem::swap(&mut reach, &mut next);
        if !reach.contains(&true) {
            return false;
        }
    }
    reach[n.len()]
}

/// The hook points of a model with `config`, in the order the pass reaches them.
pub fn hook_names(config: &Config) -> Vec<String> {
    let mut v = vec!["hook_embed".to_string()];
    let kinds = BlockHooks {
        norm: true,
        rotary: false,
        value_hidden: config.mixer.value_network() != ValueNetwork::Default,
        mlp: true,
        gated: false,
    };
    for l in 0..config.n_layers {
        v.extend(kinds.names(l));
    }
    v.push("ln_final.hook_scale".into());
    v.push("ln_final.hook_normalized".into());
    v
}

/// Which optional hook points a block has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockHooks {
    /// Norms before attention and MLP (`ln1.*`, `ln2.*`).
    pub(crate) norm: bool,
    /// Rotary positions (`attn.hook_rot_q`, `attn.hook_rot_k`).
    pub(crate) rotary: bool,
    /// HYLA's value-network hidden units (`attn.hook_value_hidden`).
    pub(crate) value_hidden: bool,
    /// An MLP (`hook_resid_mid`, `mlp.*`, `hook_mlp_out`).
    pub(crate) mlp: bool,
    /// A gated MLP (`mlp.hook_pre_linear`).
    pub(crate) gated: bool,
}

impl BlockHooks {
    /// The hook points of block `l`, in pass order.
    pub(crate) fn names(&self, l: usize) -> Vec<String> {
        let b = format!("blocks.{l}.");
        let mut v = vec![format!("{b}hook_resid_pre")];
        if self.norm {
            v.push(format!("{b}ln1.hook_scale"));
            v.push(format!("{b}ln1.hook_normalized"));
        }
        for s in ["hook_q", "hook_k", "hook_v"] {
            v.push(format!("{b}attn.{s}"));
        }
        if self.rotary {
            v.push(format!("{b}attn.hook_rot_q"));
            v.push(format!("{b}attn.hook_rot_k"));
        }
        v.push(format!("{b}attn.hook_attn_scores"));
        v.push(format!("{b}attn.hook_pattern"));
        if self.value_hidden {
            v.push(format!("{b}attn.hook_value_hidden"));
        }
        v.push(format!("{b}attn.hook_z"));
        v.push(format!("{b}hook_attn_out"));
        if self.mlp {
            v.push(format!("{b}hook_resid_mid"));
            if self.norm {
                v.push(format!("{b}ln2.hook_scale"));
                v.push(format!("{b}ln2.hook_normalized"));
            }
            v.push(format!("{b}mlp.hook_pre"));
            if self.gated {
                v.push(format!("{b}mlp.hook_pre_linear"));
            }
            v.push(format!("{b}mlp.hook_post"));
            v.push(format!("{b}hook_mlp_out"));
        }
        v.push(format!("{b}hook_resid_post"));
        v
    }
}

/// The hook points of a token language model, in pass order: `hook_embed`, `hook_pos_embed`
/// (learned positions), the blocks' points (`kinds`), the final norm's (`final_norm`),
/// `unembed.hook_in` and `unembed.hook_out`.
pub(crate) fn lm_hook_names(
    n_layers: usize,
    kinds: BlockHooks,
    pos_embed: bool,
    final_norm: bool,
) -> Vec<String> {
    let mut v = vec!["hook_embed".to_string()];
    if pos_embed {
        v.push("hook_pos_embed".into());
    }
    for l in 0..n_layers {
        v.extend(kinds.names(l));
    }
    if final_norm {
        v.push("ln_final.hook_scale".into());
        v.push("ln_final.hook_normalized".into());
    }
    v.push("unembed.hook_in".into());
    v.push("unembed.hook_out".into());
    v
}

/// The names of `names` that match any of `patterns`, in their order.
///
/// # Errors
/// [`ModelError::Input`] naming a pattern that matches no name (with the first names).
pub(crate) fn select_from(names: Vec<String>, patterns: &[String]) -> Result<Vec<String>> {
    for p in patterns {
        if !names.iter().any(|n| matches(p, n)) {
            return Err(ModelError::Input(format!(
                "hook pattern `{p}` matches no hook point of this model (`*` matches one name \
                 part): {} ...",
                names[..names.len().min(16)].join(", ")
            )));
        }
    }
    Ok(names
        .into_iter()
        .filter(|n| patterns.iter().any(|p| matches(p, n)))
        .collect())
}

/// The hook points of `config` that match any of `patterns`, in pass order.
///
/// # Errors
/// [`ModelError::Input`] naming a pattern that matches no hook point (with the list of names).
pub fn select_hooks(config: &Config, patterns: &[String]) -> Result<Vec<String>> {
    select_from(hook_names(config), patterns)
}

/// A [`HookFn`] that keeps a copy of every activation whose name is in `names` (a cache).
#[derive(Debug, Clone, Default)]
pub struct Cache {
    names: Vec<String>,
    /// The captured activations, in pass order.
    pub values: Vec<(String, Tensor)>,
}

impl Cache {
    /// A cache of the hook points `names` (e.g. from [`select_hooks`]).
    pub fn new(names: Vec<String>) -> Cache {
        Cache {
            names,
            values: Vec::new(),
        }
    }

    /// The captured activation `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.values.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

impl HookFn for Cache {
    fn wants(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    fn call(&mut self, name: &str, value: &Tensor) -> Result<Option<Tensor>> {
        self.values.push((name.to_string(), value.clone()));
        Ok(None)
    }
}

/// Runs `hooks` at `name` on `value` when it wants it; a replacement must keep the shape.
pub(crate) fn at(hooks: &mut dyn HookFn, name: &str, value: Tensor) -> Result<Tensor> {
    if !hooks.wants(name) {
        return Ok(value);
    }
    match hooks.call(name, &value)? {
        None => Ok(value),
        Some(new) if new.dims() == value.dims() && new.dtype() == value.dtype() => Ok(new),
        Some(new) => Err(ModelError::Input(format!(
            "the hook at {name} returned {:?} {:?} for an activation of {:?} {:?}",
            new.dims(),
            new.dtype(),
            value.dims(),
            value.dtype()
        ))),
    }
}

/// A LayerNorm with TransformerLens's two hook points: `{prefix}.hook_scale` `[B, T, 1]` (the
/// divisor `sqrt(var + eps)`) and `{prefix}.hook_normalized` `[B, T, D]` (`(x - mean) / scale`,
/// before the weight and the bias), then `normalized * w + b`: the reference LayerNorm's operations
/// in its order, so in [`crate::Ops::Reference`] the model's own LayerNorm gives the same bits.
pub(crate) fn layer_norm_hooked(
    ops: crate::Ops,
    ln: &crate::nn::layer_norm::LayerNorm,
    x: &Tensor,
    hooks: &mut dyn HookFn,
    prefix: &str,
) -> Result<Tensor> {
    let (scale_name, norm_name) = (
        format!("{prefix}.hook_scale"),
        format!("{prefix}.hook_normalized"),
    );
    let n = x.dim(candle_core::D::Minus1)? as f64;
    let xc = x.broadcast_sub(&(x.sum_keepdim(candle_core::D::Minus1)? / n)?)?;
    let var = (xc.sqr()?.sum_keepdim(candle_core::D::Minus1)? / n)?;
    let scale = at(hooks, &scale_name, (var + ln.eps)?.sqrt()?)?;
    let normalized = at(hooks, &norm_name, xc.broadcast_div(&scale)?)?;
    ops.add_leading(&ops.mul_leading(&normalized, &ln.w)?, &ln.b)
}

/// A LayerNorm (`rms == false`: centred, with an optional bias) or an RMSNorm (`rms == true`) of a
/// language model with TransformerLens's hook points `{prefix}.hook_scale` `[B, T, 1]` (the divisor:
/// `sqrt(var + eps)`, or `sqrt(mean(x²) + eps)`) and `{prefix}.hook_normalized` `[B, T, D]` (the
/// input centred or not, divided by the scale, before the weight and the bias), then
/// `normalized * w (+ b)`.
///
/// # Errors
/// Candle errors; a hook's error or a replacement of another shape.
pub(crate) fn norm_hooked(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    eps: f64,
    rms: bool,
    hooks: &mut dyn HookFn,
    prefix: &str,
) -> Result<Tensor> {
    let n = x.dim(candle_core::D::Minus1)? as f64;
    let xc = if rms {
        x.clone()
    } else {
        x.broadcast_sub(&(x.sum_keepdim(candle_core::D::Minus1)? / n)?)?
    };
    let ms = (xc.sqr()?.sum_keepdim(candle_core::D::Minus1)? / n)?;
    let scale = at(hooks, &format!("{prefix}.hook_scale"), (ms + eps)?.sqrt()?)?;
    let normalized = at(
        hooks,
        &format!("{prefix}.hook_normalized"),
        xc.broadcast_div(&scale)?,
    )?;
    let y = normalized.broadcast_mul(w)?;
    Ok(match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    })
}

/// [`at`] for a tensor held as `[B, H, T, d]` whose hook shape is `[B, T, H, d]`.
pub(crate) fn at_heads(hooks: &mut dyn HookFn, name: &str, value: Tensor) -> Result<Tensor> {
    if !hooks.wants(name) {
        return Ok(value);
    }
    let seen = value.transpose(1, 2)?.contiguous()?;
    let out = at(hooks, name, seen)?;
    Ok(out.transpose(1, 2)?.contiguous()?)
}

/// The mix of block `l`'s attention (normalisation and value network, `ops::Mixer`) in its
/// decomposed reference form, with the hook points `blocks.{l}.attn.hook_pattern`,
/// `attn.hook_value_hidden` (value networks `mlp_relu` / `mlp_linear`) and `attn.hook_z`: what
/// [`crate::nn::Attention::forward`] runs when a hook is attached, so that the pattern, the hidden
/// units and `z` exist as tensors a hook may replace. Returns `(z, pattern)` as
/// [`crate::Ops::mix`] returns `(o, pattern)`.
///
/// # Shapes
/// `scores [B, H, Q, K]`, `v [B, H, K, d]`, `mask` broadcastable to `[B, H, Q, K]` -> `z [B, Q, H,
/// d]`, `pattern [B, H, Q, K]`.
///
/// # Errors
/// Candle errors; a hook's error or a replacement of another shape.
pub(crate) fn mix_hooked(
    ops: crate::Ops,
    scores: &Tensor,
    v: &Tensor,
    mixer: crate::Mixer,
    mask: Option<&Tensor>,
    hooks: &mut dyn HookFn,
    l: usize,
) -> Result<(Tensor, Tensor)> {
    let b = format!("blocks.{l}.");
    let pattern = normalise(ops, scores, mixer.normalisation(), mask)?;
    let pattern = at(hooks, &format!("{b}attn.hook_pattern"), pattern)?;
    let z = match mixer.value_network() {
        ValueNetwork::Default => pattern
            .matmul(&v.contiguous()?)?
            .transpose(1, 2)?
            .contiguous()?,
        net => {
            // hidden[b, q, k, :] = act(sum_h a[b, h, q, k] v[b, h, k, :])
            let a_kqh = pattern.permute((0, 3, 2, 1))?.contiguous()?;
            let v_khd = v.transpose(1, 2)?.contiguous()?;
            let hidden = a_kqh.matmul(&v_khd)?; // [B, K, Q, d]
            let hidden = if net == ValueNetwork::MlpRelu {
                hidden.relu()?
            } else {
                hidden
            };
            let hidden = at(
                hooks,
                &format!("{b}attn.hook_value_hidden"),
                hidden.transpose(1, 2)?.contiguous()?,
            )?; // [B, Q, K, d]
                // z[b, q, h, :] = sum_k a[b, h, q, k] hidden[b, q, k, :]
            let a_qhk = pattern.transpose(1, 2)?.contiguous()?;
            a_qhk.matmul(&hidden)?
        }
    };
    let z = at(hooks, &format!("{b}attn.hook_z"), z)?;
    Ok((z, pattern))
}

impl Transformer {
    /// The forward pass with a hook at every hook point (module docs): returns the logits
    /// `[B, F, d_out]` computed from whatever the hooks left or put in place.
    ///
    /// # Shapes
    /// `x [B, T, d_in]` as [`Transformer::forward`].
    ///
    /// # Errors
    /// As [`Transformer::forward`]; a hook's error; [`ModelError::Input`] for a replacement of
    /// another shape or dtype (naming the hook).
    pub fn run_with_hooks(&self, x: &Tensor, hooks: &mut dyn HookFn) -> Result<Tensor> {
        let cfg = self.config().clone();
        // The input check of the ordinary pass.
        let (bsz, t, _) = x.dims3().map_err(|_| {
            ModelError::Input(format!(
                "input must be [batch >= 1, {}, {}] f32, got {:?}",
                cfg.n_tokens,
                cfg.d_in,
                x.dims()
            ))
        })?;
        if t != cfg.n_tokens || x.dims()[2] != cfg.d_in || bsz == 0 {
            return Err(ModelError::Input(format!(
                "input must be [batch >= 1, {}, {}] f32, got {:?}",
                cfg.n_tokens,
                cfg.d_in,
                x.dims()
            )));
        }
        let h = at(hooks, "hook_embed", self.embed.forward(self.ops(), x)?)?;
        Ok(self.blocks_from(h, 0, None, false, hooks)?.logits)
    }

    /// The hooked pass from the residual stream entering block `start` (the value of
    /// `blocks.{start}.hook_resid_pre`, before its hook runs): blocks `start..L`, the final
    /// LayerNorm and the unembedding, with the hook points of those blocks. Given the stream that
    /// [`Transformer::run_with_hooks`] computed there, it returns the same logits bit for bit
    /// (same operations on the same tensor), at the cost of the remaining blocks only: an
    /// intervention at layer `start` need not recompute the layers before it.
    ///
    /// # Shapes
    /// `resid [B, T, D]` -> logits `[B, F, d_out]`.
    ///
    /// # Errors
    /// [`ModelError::Input`] for a stream of another shape or a `start` past the last block; as
    /// [`Transformer::run_with_hooks`] otherwise.
    pub fn run_with_hooks_from(
        &self,
        resid: &Tensor,
        start: usize,
        hooks: &mut dyn HookFn,
    ) -> Result<Tensor> {
        let cfg = self.config();
        let ok = matches!(resid.dims3(), Ok((b, t, d)) if b > 0 && t == cfg.n_tokens && d == cfg.d_model);
        if !ok || start >= cfg.n_layers {
            return Err(ModelError::Input(format!(
                "the stream entering block {start} must be [batch >= 1, {}, {}] of a model with {} blocks, got {:?}",
                cfg.n_tokens,
                cfg.d_model,
                cfg.n_layers,
                resid.dims()
            )));
        }
        Ok(self
            .blocks_from(resid.clone(), start, None, false, hooks)?
            .logits)
    }

    /// [`Transformer::run_with_hooks`] with a [`Cache`] of the hook points matching `patterns`:
    /// the logits and the activations by name, in pass order.
    ///
    /// # Errors
    /// As [`select_hooks`] and [`Transformer::run_with_hooks`].
    pub fn run_with_cache(
        &self,
        x: &Tensor,
        patterns: &[String],
    ) -> Result<(Tensor, Vec<(String, Tensor)>)> {
        let mut cache = Cache::new(select_hooks(self.config(), patterns)?);
        let logits = self.run_with_hooks(x, &mut cache)?;
        Ok((logits, cache.values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_name_parts() {
        assert!(matches(
            "blocks.*.hook_resid_post",
            "blocks.3.hook_resid_post"
        ));
        assert!(!matches(
            "blocks.*.hook_resid_post",
            "blocks.3.attn.hook_resid_post"
        ));
        assert!(matches("blocks.0.attn.*", "blocks.0.attn.hook_q"));
        assert!(!matches("blocks.0.attn.*", "blocks.0.hook_attn_out"));
        assert!(matches("**hook_pattern", "blocks.12.attn.hook_pattern"));
        assert!(matches("hook_embed", "hook_embed"));
        assert!(!matches("hook_embed", "hook_embed2"));
        assert!(matches("*", "hook_embed") && !matches("*", "blocks.0.hook_resid_pre"));
        assert!(matches("***", "a.b") && !matches("*.*.*", "a.b"));
        assert!(matches("", "") && !matches("", "a") && !matches("a", ""));
    }

    /// The matcher before the dynamic programme: a backtracking glob, exponential in runs of stars.
    /// Kept as the reference of the semantics.
    fn backtracking(pattern: &str, name: &str) -> bool {
        fn go(p: &[u8], n: &[u8]) -> bool {
            match p.split_first() {
                None => n.is_empty(),
                Some((b'*', rest)) => {
                    let (any, rest) = match rest.split_first() {
                        Some((b'*', r)) => (true, r),
                        _ => (false, rest),
                    };
                    (0..=n.len())
                        .take_while(|&i| any || !n[..i].contains(&b'.'))
                        .any(|i| go(rest, &n[i..]))
                }
                Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
            }
        }
        go(pattern.as_bytes(), name.as_bytes())
    }

    #[test]
    fn runs_of_stars_do_not_backtrack() {
        // 40 stars then a character the name lacks: the backtracking matcher tries ~200^20 splits.
        let name = "ab.".repeat(67)[..200].to_string();
        let pattern = format!("{}z", "*".repeat(40));
        assert!(!matches(&pattern, &name));
        let pattern = format!("{}b", "*".repeat(40));
        assert!(matches(&pattern, &name) && !matches(&pattern, &name[..199]));
        let odd = format!("{}z", "*".repeat(41));
        assert!(!matches(&odd, &name));
        assert!(!matches(&"*.".repeat(30), &name));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4000))]
        #[test]
        fn matches_as_the_backtracking_glob(
            pattern in "[a.*]{0,9}",
            name in "[ab.]{0,9}",
        ) {
            proptest::prop_assert_eq!(matches(&pattern, &name), backtracking(&pattern, &name));
        }
    }
}
