//! Model configuration (`config.json` in a checkpoint directory). Sizes follow `docs/spec/models.md`,
//! section "Sizes".

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::mixer::Mixer;

/// The architecture of a transformer of `docs/spec/models.md`: task dimensions, widths, depth and mixer.
///
/// Validate with [`Config::check`] before use; every constructor in this crate calls it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Input token dimension (`M = 8` one-hot values for SRAVEN).
    pub d_in: usize,
    /// Tokens per sequence `T` (36 for SRAVEN).
    pub n_tokens: usize,
    /// Number of output positions `F`, read at the last `F` positions (4 for SRAVEN, 1 for logic).
    pub n_outputs: usize,
    /// Model width `D` (128 at width 1).
    pub d_model: usize,
    /// Number of heads `H` (16 at width 1).
    pub n_heads: usize,
    /// Per-head dimension `d` of queries, keys and values (4).
    pub d_head: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Hidden width of the MLP `D_mlp` (256 at width 1).
    pub d_mlp: usize,
    /// Output classes per output position (8 for SRAVEN).
    pub d_out: usize,
    /// Relative-position buckets per layer; also the T5 `max_distance` (= `T` in the paper).
    pub n_buckets: usize,
    /// Attention is causally masked (key <= query). `false` for SRAVEN and fuzzy logic.
    #[serde(default)]
    pub causal: bool,
    /// The sequence mixer.
    pub mixer: Mixer,
}

impl Config {
    /// The paper's base SRAVEN model: width 1, 4 layers (D 128, H 16, d 4, D_mlp 256, T 36, F 4).
    pub fn sraven_base(mixer: Mixer) -> Config {
        Config {
            d_in: 8,
            n_tokens: 36,
            n_outputs: 4,
            d_model: 128,
            n_heads: 16,
            d_head: 4,
            n_layers: 4,
            d_mlp: 256,
            d_out: 8,
            n_buckets: 36,
            causal: false,
            mixer,
        }
    }

    /// A SRAVEN model of the paper's scaling grid: width multiplier `width` in {1, 2, 4} multiplies
    /// D, H and D_mlp (d stays 4); `layers` in {4, 8, 16}.
    ///
    /// # Errors
    /// [`ModelError::Config`] if `width` is not 1, 2 or 4, or `layers` is 0.
    pub fn sraven(mixer: Mixer, width: usize, layers: usize) -> Result<Config> {
        if ![1, 2, 4].contains(&width) {
            return Err(ModelError::Config(format!(
                "width multiplier must be 1, 2 or 4, got {width}"
            )));
        }
        let base = Config::sraven_base(mixer);
        let cfg = Config {
            d_model: base.d_model * width,
            n_heads: base.n_heads * width,
            d_mlp: base.d_mlp * width,
            n_layers: layers,
            ..base
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// The fuzzy-logic model of the paper: D 128, H 8, d 2, 2 layers, D_mlp 256, one output,
    /// tokens of dimension `n_vars + 1`, `n_tokens` tokens (`docs/spec/models.md`, "Sizes").
    pub fn logic(mixer: Mixer, n_vars: usize, n_tokens: usize) -> Config {
        Config {
            d_in: n_vars + 1,
            n_tokens,
            n_outputs: 1,
            d_model: 128,
            n_heads: 8,
            d_head: 2,
            n_layers: 2,
            d_mlp: 256,
            d_out: 1,
            n_buckets: n_tokens,
            causal: false,
            mixer,
        }
    }

    /// Width of the concatenated heads, `H * d`.
    pub fn d_attn(&self) -> usize {
        self.n_heads * self.d_head
    }

    /// Validates every field once.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the field: a zero size, `n_outputs > n_tokens`, an `n_tokens`
    /// whose [T, T] tables exceed the memory budget, or fewer than
    /// 2 relative-position buckets (the T5 bucketing needs `n_buckets / 2 >= 1`).
    pub fn check(&self) -> Result<()> {
        let sizes = [
            ("d_in", self.d_in),
            ("n_tokens", self.n_tokens),
            ("n_outputs", self.n_outputs),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("d_head", self.d_head),
            ("n_layers", self.n_layers),
            ("d_mlp", self.d_mlp),
            ("d_out", self.d_out),
        ];
        for (name, v) in sizes {
            if v == 0 {
                return Err(ModelError::Config(format!(
                    "`{name}` must be positive, got 0"
                )));
            }
        }
        if self.n_outputs > self.n_tokens {
            return Err(ModelError::Config(format!(
                "`n_outputs` ({}) must not exceed `n_tokens` ({})",
                self.n_outputs, self.n_tokens
            )));
        }
        // Sizes come from a file or a flag: refuse a model whose weights alone exceed the budget
        // before anything (even the table of tensor names) is built from them.
        hyperlens_io::budget::check_alloc(
            format!(
                "a model with d_model = {}, n_layers = {}, n_heads = {}, d_head = {}, d_mlp = {}",
                self.d_model, self.n_layers, self.n_heads, self.d_head, self.d_mlp
            ),
            self.n_params_saturating().saturating_mul(4),
        )
        .map_err(|e| ModelError::Config(e.to_string()))?;
        // The model builds [T, T] tables (position buckets, causal mask) from `n_tokens`, which
        // comes from a file or a flag: refuse what the memory budget does not allow.
        let t = self.n_tokens as u128;
        hyperlens_io::budget::check_alloc(
            format!("`n_tokens` = {} ([T, T] position tables)", self.n_tokens),
            t.saturating_mul(t).saturating_mul(12),
        )
        .map_err(|e| ModelError::Config(e.to_string()))?;
        if self.n_buckets < 2 {
            return Err(ModelError::Config(format!(
                "`n_buckets` must be at least 2, got {}",
                self.n_buckets
            )));
        }
        Ok(())
    }

    /// The name and shape of every parameter tensor in canonical order (TransformerLens names,
    /// `docs/spec/models.md`, "Parameter names").
    ///
    /// # Shapes
    /// `embed.W_E [d_in, D]`, `embed.b_E [D]`; per layer `l`: `blocks.{l}.ln1.w/.b [D]`,
    /// `attn.W_Q/W_K/W_V [H, D, d]`, `attn.b_Q/b_K/b_V [H, d]`, `attn.W_O [H, d, D]`,
    /// `attn.b_O [D]`, `attn.rel_pos [H, n_buckets]`, `ln2.w/.b [D]`, `mlp.W_in [D, D_mlp]`,
    /// `mlp.b_in [D_mlp]`, `mlp.W_out [D_mlp, D]`, `mlp.b_out [D]`; `ln_final.w/.b [D]`,
    /// `unembed.W_U [D, d_out]`, `unembed.b_U [d_out]`.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (dm, h, d) = (self.d_model, self.n_heads, self.d_head);
        let mut v: Vec<(String, Vec<usize>)> = vec![
            ("embed.W_E".into(), vec![self.d_in, dm]),
            ("embed.b_E".into(), vec![dm]),
        ];
        for l in 0..self.n_layers {
            let p = |s: &str| format!("blocks.{l}.{s}");
            v.push((p("ln1.w"), vec![dm]));
            v.push((p("ln1.b"), vec![dm]));
            for w in ["W_Q", "W_K", "W_V"] {
                v.push((p(&format!("attn.{w}")), vec![h, dm, d]));
            }
            for b in ["b_Q", "b_K", "b_V"] {
                v.push((p(&format!("attn.{b}")), vec![h, d]));
            }
            v.push((p("attn.W_O"), vec![h, d, dm]));
            v.push((p("attn.b_O"), vec![dm]));
            v.push((p("attn.rel_pos"), vec![h, self.n_buckets]));
            v.push((p("ln2.w"), vec![dm]));
            v.push((p("ln2.b"), vec![dm]));
            v.push((p("mlp.W_in"), vec![dm, self.d_mlp]));
            v.push((p("mlp.b_in"), vec![self.d_mlp]));
            v.push((p("mlp.W_out"), vec![self.d_mlp, dm]));
            v.push((p("mlp.b_out"), vec![dm]));
        }
        v.push(("ln_final.w".into(), vec![dm]));
        v.push(("ln_final.b".into(), vec![dm]));
        v.push(("unembed.W_U".into(), vec![dm, self.d_out]));
        v.push(("unembed.b_U".into(), vec![self.d_out]));
        v
    }

    /// Total number of parameters in closed form, saturating instead of overflowing (so that sizes
    /// read from a file or a flag can be checked before [`Config::tensor_shapes`] is built). Equal
    /// to [`Config::n_params`] whenever that fits in `usize`.
    pub fn n_params_saturating(&self) -> u128 {
        let [din, dm, h, d, l, dmlp, dout, nb] = [
            self.d_in,
            self.d_model,
            self.n_heads,
            self.d_head,
            self.n_layers,
            self.d_mlp,
            self.d_out,
            self.n_buckets,
        ]
        .map(|v| v as u128);
        let m = |a: u128, b: u128| a.saturating_mul(b);
        let sum = |v: &[u128]| v.iter().fold(0u128, |acc, &x| acc.saturating_add(x));
        let hd = m(h, d);
        let per_layer = sum(&[
            m(2, dm),
            m(m(3, hd), dm),
            m(3, hd),
            m(hd, dm),
            dm,
            m(h, nb),
            m(2, dm),
            m(m(2, dm), dmlp),
            dmlp,
            dm,
        ]);
        sum(&[m(din, dm), dm, m(l, per_layer), m(2, dm), m(dm, dout), dout])
    }

    /// Total number of parameters (402,824 for the base SRAVEN model, for every mixer).
    pub fn n_params(&self) -> usize {
        self.tensor_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_form_parameter_count_matches_the_tensor_table() {
        for c in [
            Config::sraven_base(Mixer::Hyla),
            Config::sraven(Mixer::Softmax, 2, 8).unwrap(),
            Config::logic(Mixer::Linear, 3, 32),
        ] {
            assert_eq!(c.n_params_saturating(), c.n_params() as u128);
        }
        let mut c = Config::sraven_base(Mixer::Hyla);
        c.n_layers = usize::MAX;
        c.d_model = usize::MAX;
        assert_eq!(c.n_params_saturating(), u128::MAX);
        assert!(c.check().unwrap_err().to_string().contains("memory budget"));
    }

    #[test]
    fn check_rejects_bad_fields() {
        let mut c = Config::sraven_base(Mixer::Hyla);
        c.check().unwrap();
        c.d_head = 0;
        assert!(c.check().unwrap_err().to_string().contains("d_head"));
        let mut c = Config::sraven_base(Mixer::Hyla);
        c.n_outputs = 37;
        assert!(c.check().unwrap_err().to_string().contains("n_outputs"));
        let mut c = Config::sraven_base(Mixer::Hyla);
        c.n_buckets = 1;
        assert!(c.check().unwrap_err().to_string().contains("n_buckets"));
        assert!(Config::sraven(Mixer::Hyla, 3, 4).is_err());
    }

    #[test]
    fn json_round_trip_and_unknown_fields() {
        let c = Config::sraven(Mixer::LinearRmsHead, 2, 8).unwrap();
        let s = serde_json::to_string(&c).unwrap();
        assert!(s.contains("\"mixer\":\"linear-rmshead\""));
        assert_eq!(serde_json::from_str::<Config>(&s).unwrap(), c);
        let bad = s.replace("\"d_in\"", "\"d_inn\"");
        assert!(serde_json::from_str::<Config>(&bad).is_err());
    }
}
