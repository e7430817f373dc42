//! The eight sequence mixers of "Attention as a Hypernetwork" (Schug et al. 2024): an attention
//! normalisation combined with a value network. See `docs/spec/models.md`, section "Mixers".

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ModelError;

/// How the scaled scores `s[h, i, j]` are normalised into the latent code `a[:, i, j]`
/// (`docs/spec/models.md`, "Scores and the three normalisations"). Its serde form is its
/// [`name`](Normalisation::name), as a codes file's sidecar records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalisation {
    /// `a[h, i, :] = softmax_j s[h, i, :]` (over keys).
    Softmax,
    /// `a = s`: raw scores, no feature map, no normalisation (linear attention).
    None,
    /// RMSHead: `a[h, i, j] = s[h, i, j] / sqrt(mean_h' s[h', i, j]^2 + 1e-6)`, normalised across the
    /// head axis for each (query, key) pair; no parameters.
    RmsHead,
}

impl Normalisation {
    /// The name used in the paper's code (`softmax`, `none`, `rms_head`).
    pub fn name(self) -> &'static str {
        match self {
            Normalisation::Softmax => "softmax",
            Normalisation::None => "none",
            Normalisation::RmsHead => "rms_head",
        }
    }
}

impl fmt::Display for Normalisation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The value network that the latent code parameterises (`docs/spec/models.md`, "Value networks").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueNetwork {
    /// Standard multi-head attention: `o[i, h] = sum_j a[h,i,j] v[j,h]`.
    Default,
    /// HYLA: `hidden[i, j] = ReLU(sum_h a[h,i,j] v[j,h])`, `o[i, h] = sum_j a[h,i,j] hidden[i, j]`.
    MlpRelu,
    /// The HYLA value network without the ReLU (an ablation).
    MlpLinear,
}

impl ValueNetwork {
    /// Whether this is one of HYLA's MLP value networks (`mlp_relu`, `mlp_linear`).
    pub fn is_mlp(self) -> bool {
        matches!(self, ValueNetwork::MlpRelu | ValueNetwork::MlpLinear)
    }

    /// The name used in the paper's code (`default`, `mlp_relu`, `mlp_linear`).
    pub fn name(self) -> &'static str {
        match self {
            ValueNetwork::Default => "default",
            ValueNetwork::MlpRelu => "mlp_relu",
            ValueNetwork::MlpLinear => "mlp_linear",
        }
    }
}

impl fmt::Display for ValueNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A sequence mixer: normalisation + value network. Parsed from and printed as its CLI name;
/// `FromStr` also accepts the paper's method strings (e.g. `linear_hypatt` for [`Mixer::Hyla`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mixer {
    /// `softmax` (paper: `transformer` / `softmax_attention`): softmax, default value network.
    Softmax,
    /// `linear` (paper: `linear_transformer` / `linear_attention`): no normalisation, default value network.
    Linear,
    /// `hyla` (paper: `linear_hypatt`): RMSHead, `mlp_relu` value network.
    Hyla,
    /// `linear-rmshead` (paper: `linear_attention_rms_head`): RMSHead, default value network.
    LinearRmsHead,
    /// `hyla-no-rmshead` (paper: `linear_hypatt_no_rms_head`): no normalisation, `mlp_relu`.
    HylaNoRmsHead,
    /// `hyla-linear-value` (paper: `linear_hypatt_mlp_linear`): RMSHead, `mlp_linear`.
    HylaLinearValue,
    /// `hyla-linear-value-no-rmshead` (paper: `linear_hypatt_mlp_linear_no_rms_head`): none, `mlp_linear`.
    HylaLinearValueNoRmsHead,
    /// `softmax-hypatt` (paper: `softmax_hypatt`): softmax, `mlp_relu`.
    SoftmaxHypatt,
}

impl Mixer {
    /// Every mixer, in the order of the table in `docs/spec/models.md`.
    pub const ALL: [Mixer; 8] = [
        Mixer::Softmax,
        Mixer::Linear,
        Mixer::Hyla,
        Mixer::LinearRmsHead,
        Mixer::HylaNoRmsHead,
        Mixer::HylaLinearValue,
        Mixer::HylaLinearValueNoRmsHead,
        Mixer::SoftmaxHypatt,
    ];

    /// The CLI name (`softmax`, `linear`, `hyla`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Mixer::Softmax => "softmax",
            Mixer::Linear => "linear",
            Mixer::Hyla => "hyla",
            Mixer::LinearRmsHead => "linear-rmshead",
            Mixer::HylaNoRmsHead => "hyla-no-rmshead",
            Mixer::HylaLinearValue => "hyla-linear-value",
            Mixer::HylaLinearValueNoRmsHead => "hyla-linear-value-no-rmshead",
            Mixer::SoftmaxHypatt => "softmax-hypatt",
        }
    }

    /// The paper code's `sequence_mixer` string (e.g. `linear_hypatt`).
    pub fn paper_name(self) -> &'static str {
        match self {
            Mixer::Softmax => "softmax_attention",
            Mixer::Linear => "linear_attention",
            Mixer::Hyla => "linear_hypatt",
            Mixer::LinearRmsHead => "linear_attention_rms_head",
            Mixer::HylaNoRmsHead => "linear_hypatt_no_rms_head",
            Mixer::HylaLinearValue => "linear_hypatt_mlp_linear",
            Mixer::HylaLinearValueNoRmsHead => "linear_hypatt_mlp_linear_no_rms_head",
            Mixer::SoftmaxHypatt => "softmax_hypatt",
        }
    }

    /// The attention normalisation of this mixer.
    pub fn normalisation(self) -> Normalisation {
        match self {
            Mixer::Softmax | Mixer::SoftmaxHypatt => Normalisation::Softmax,
            Mixer::Linear | Mixer::HylaNoRmsHead | Mixer::HylaLinearValueNoRmsHead => {
                Normalisation::None
            }
            Mixer::Hyla | Mixer::LinearRmsHead | Mixer::HylaLinearValue => Normalisation::RmsHead,
        }
    }

    /// The value network of this mixer.
    pub fn value_network(self) -> ValueNetwork {
        match self {
            Mixer::Softmax | Mixer::Linear | Mixer::LinearRmsHead => ValueNetwork::Default,
            Mixer::Hyla | Mixer::HylaNoRmsHead | Mixer::SoftmaxHypatt => ValueNetwork::MlpRelu,
            Mixer::HylaLinearValue | Mixer::HylaLinearValueNoRmsHead => ValueNetwork::MlpLinear,
        }
    }
}

impl fmt::Display for Mixer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mixer {
    type Err = ModelError;

    /// Parses a CLI name or one of the paper's method / `sequence_mixer` strings.
    ///
    /// # Errors
    /// [`ModelError::UnknownMixer`] for any other string.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let m = match s {
            "softmax" | "transformer" | "softmax_attention" => Mixer::Softmax,
            "linear" | "linear_transformer" | "linear_attention" => Mixer::Linear,
            "hyla" | "linear_hypatt" => Mixer::Hyla,
            "linear-rmshead" | "linear_attention_rms_head" => Mixer::LinearRmsHead,
            "hyla-no-rmshead" | "linear_hypatt_no_rms_head" => Mixer::HylaNoRmsHead,
            "hyla-linear-value" | "linear_hypatt_mlp_linear" => Mixer::HylaLinearValue,
            "hyla-linear-value-no-rmshead" | "linear_hypatt_mlp_linear_no_rms_head" => {
                Mixer::HylaLinearValueNoRmsHead
            }
            "softmax-hypatt" | "softmax_hypatt" => Mixer::SoftmaxHypatt,
            other => return Err(ModelError::UnknownMixer(other.to_string())),
        };
        Ok(m)
    }
}

impl Serialize for Mixer {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Mixer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_paper_names_parse() {
        for m in Mixer::ALL {
            assert_eq!(m.to_string().parse::<Mixer>().unwrap(), m);
            assert_eq!(m.paper_name().parse::<Mixer>().unwrap(), m);
            let json = serde_json::to_string(&m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.name()));
            assert_eq!(serde_json::from_str::<Mixer>(&json).unwrap(), m);
        }
        assert_eq!("transformer".parse::<Mixer>().unwrap(), Mixer::Softmax);
        assert_eq!(
            "linear_transformer".parse::<Mixer>().unwrap(),
            Mixer::Linear
        );
        assert!(matches!("lstm".parse::<Mixer>(), Err(ModelError::UnknownMixer(s)) if s == "lstm"));
        assert!(serde_json::from_str::<Mixer>("\"lstm\"").is_err());
    }

    #[test]
    fn table_of_the_spec() {
        use Normalisation as N;
        use ValueNetwork as V;
        let expect = [
            (Mixer::Softmax, N::Softmax, V::Default),
            (Mixer::Linear, N::None, V::Default),
            (Mixer::Hyla, N::RmsHead, V::MlpRelu),
            (Mixer::LinearRmsHead, N::RmsHead, V::Default),
            (Mixer::HylaNoRmsHead, N::None, V::MlpRelu),
            (Mixer::HylaLinearValue, N::RmsHead, V::MlpLinear),
            (Mixer::HylaLinearValueNoRmsHead, N::None, V::MlpLinear),
            (Mixer::SoftmaxHypatt, N::Softmax, V::MlpRelu),
        ];
        for (m, n, v) in expect {
            assert_eq!(m.normalisation(), n, "{m}");
            assert_eq!(m.value_network(), v, "{m}");
        }
        for n in [N::Softmax, N::None, N::RmsHead] {
            let json = serde_json::to_string(&n).unwrap();
            assert_eq!(json, format!("\"{}\"", n.name()));
            assert_eq!(serde_json::from_str::<N>(&json).unwrap(), n);
        }
    }
}
