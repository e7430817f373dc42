//! What `hyperlens probe` asks of a fuzzy-logic checkpoint, resolved against the model and the
//! task: the site (SRAVEN's slot sites refused), the layers (default: all), and the inputs held
//! fixed in every sequence (`--fixed-query` / `--fixed-context`, drawn from the seed), applied to
//! a problem file as to a sampled set.

use std::path::Path;

use hyperlens_model::{CodeSite, Config};
use hyperlens_tasks::logic::{fixed_context, fixed_query, LogicBatch, LogicInputs, LogicParams};

use crate::error::{ProbeError, Result};
use crate::extract::ProbeMeta;
use crate::logic::describe_inputs;
use crate::site::Site;

/// A logic probe's request, as the command line gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicProbeParams {
    /// The site: `paper` (the last token's attention to itself) or an explicit query and keys.
    pub site: Site,
    /// Layers to keep (`None`: all).
    pub layers: Option<Vec<usize>>,
    /// Give every sequence one query (the last token's inputs, drawn from `seed`).
    pub fixed_query: bool,
    /// Give every sequence one context (the first `T - 1` tokens' inputs, drawn from `seed`).
    pub fixed_context: bool,
    /// The problems' seed (and the fixed query's or context's).
    pub seed: u64,
}

/// A [`LogicProbeParams`] resolved against a model and its task.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicProbe {
    /// The site's query and keys.
    pub site: CodeSite,
    /// The layers kept (checked against the model by the extraction).
    pub layers: Vec<usize>,
    /// The inputs: uniform, or one query or one context for every sequence.
    pub inputs: LogicInputs,
}

impl LogicProbeParams {
    /// Resolves the site for the model's `n_tokens`, the layers (default: all of the model's)
    /// and the fixed inputs of the task `params` (`fixed_query` wins over `fixed_context`).
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] naming `--site` for a SRAVEN site (`slot:F`, `all-slots`).
    pub fn resolve(&self, cfg: &Config, params: &LogicParams) -> Result<LogicProbe> {
        let Some(site) = self.site.logic(cfg.n_tokens) else {
            return Err(ProbeError::InvalidInput(format!(
                "--site {} is a SRAVEN site; a logic checkpoint takes `paper` (the last token's \
                 attention to itself) or `query:I;keys:J,K,...`",
                self.site
            )));
        };
        let layers = self
            .layers
            .clone()
            .unwrap_or_else(|| (0..cfg.n_layers).collect());
        let inputs = if self.fixed_query {
            LogicInputs::FixedQuery(fixed_query(params, self.seed))
        } else if self.fixed_context {
            LogicInputs::FixedContext(fixed_context(params, self.seed))
        } else {
            LogicInputs::Uniform
        };
        Ok(LogicProbe {
            site,
            layers,
            inputs,
        })
    }
}

impl LogicProbe {
    /// The logic problem file `path` (of the task `params`) with the fixed inputs applied, and
    /// the codes' sidecar start naming the file and the inputs ([`describe_inputs`]).
    ///
    /// # Errors
    /// The file's errors ([`ProbeError::Tasks`]); [`ProbeError::InvalidInput`] naming
    /// `--fixed-query` / `--fixed-context` when the fixed inputs do not fit the file's sequences.
    pub fn load_file(
        &self,
        checkpoint: &Path,
        path: &Path,
        params: &LogicParams,
        seed: u64,
    ) -> Result<(LogicBatch, ProbeMeta)> {
        let mut set = hyperlens_tasks::npz::load_logic(path, params)?;
        self.inputs.apply(&mut set).map_err(|e| {
            ProbeError::InvalidInput(format!("--{}: {e}", self.inputs.name().replace('_', "-")))
        })?;
        let meta = ProbeMeta {
            problems: describe_inputs(&path.display().to_string(), &self.inputs, seed),
            ..ProbeMeta::for_checkpoint(checkpoint)
        };
        Ok((set, meta))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(n_tokens: usize, n_layers: usize) -> Config {
        Config {
            n_tokens,
            n_layers,
            ..Config::logic(hyperlens_model::Mixer::Softmax, 3, n_tokens)
        }
    }

    fn request(site: Site) -> LogicProbeParams {
        LogicProbeParams {
            site,
            layers: None,
            fixed_query: false,
            fixed_context: false,
            seed: 3,
        }
    }

    #[test]
    fn paper_site_is_the_last_token_and_layers_default_to_all() {
        let params = LogicParams::default();
        let r = request(Site::Paper).resolve(&cfg(9, 3), &params).unwrap();
        assert_eq!(r.site, CodeSite::last_token(9));
        assert_eq!(r.site.query, 8);
        assert_eq!(r.site.keys, vec![8]);
        assert_eq!(r.layers, vec![0, 1, 2]);
        assert_eq!(r.inputs, LogicInputs::Uniform);
        let mut q = request(Site::Paper);
        q.layers = Some(vec![2, 0]);
        assert_eq!(q.resolve(&cfg(9, 3), &params).unwrap().layers, vec![2, 0]);
    }

    #[test]
    fn slot_sites_are_refused_naming_the_site() {
        let e = request(Site::Slot(1))
            .resolve(&cfg(9, 1), &LogicParams::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--site slot:1 is a SRAVEN site"), "{e}");
    }

    #[test]
    fn fixed_inputs_are_drawn_from_the_seed() {
        let params = LogicParams::default();
        let mut q = request(Site::Paper);
        q.fixed_query = true;
        q.fixed_context = true;
        let r = q.resolve(&cfg(9, 1), &params).unwrap();
        assert_eq!(r.inputs, LogicInputs::FixedQuery(fixed_query(&params, 3)));
        q.fixed_query = false;
        let r = q.resolve(&cfg(9, 1), &params).unwrap();
        assert_eq!(
            r.inputs,
            LogicInputs::FixedContext(fixed_context(&params, 3))
        );
        assert_ne!(
            r.inputs,
            LogicInputs::FixedContext(fixed_context(&params, 4))
        );
    }
}
