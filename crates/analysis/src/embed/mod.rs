//! t-SNE embeddings of latent codes and their trustworthiness.
//!
//! The paper projects codes to two dimensions to show that they cluster by rule (Fig. 5; the
//! fuzzy-logic codes by term, Fig. 2D / A2); the projection may be t-SNE. [`tsne`] has three
//! forms:
//!
//! - the deterministic t-SNE (`theta = 0`, [`TsneParams::deterministic`], the one the report,
//!   `analyze` and Python's `viz` use), which picks by one rule, the number of points `N`:
//!   - `N <= EXACT_MAX_POINTS` (2,000): hyperlens's exact t-SNE (`exact`: O(N²) per step,
//!     bhtsne's exact mode and schedule with openTSNE's learning rate `N / exaggeration`);
//!   - above: hyperlens's large-N t-SNE ([`tsne_interpolated`]: exact nearest-neighbour
//!     affinities, FFT-interpolated repulsion as FIt-SNE / openTSNE, openTSNE 1.0's schedule);
//!
//!   both give the same embedding for a seed on any number of threads;
//! - `theta > 0`: the `linfa-tsne` crate (a wrapper of `bhtsne`: Barnes-Hut t-SNE, van der
//!   Maaten 2014), seeded but not deterministic.
//!
//! How faithful an embedding is gets measured by the trustworthiness of Venna and Kaski (2001), as
//! scikit-learn's `sklearn.manifold.trustworthiness` computes it: with `r(i, j)` the rank of `j`
//! among `i`'s neighbours in the input space (1 = nearest) and `U_k(i)` the points among `i`'s `k`
//! nearest neighbours in the embedding that are not among its `k` nearest in the input,
//! `T(k) = 1 - 2 / (n k (2n - 3k - 1)) * sum_i sum_{j in U_k(i)} (r(i, j) - k)`; 1 means every
//! embedded neighbourhood is a true one.

mod affinity;
mod exact;
mod interp;
mod interpolated;
mod knn;
mod trust;

use linfa::traits::Transformer;
use ndarray::{Array2, ArrayView2};
use rand::SeedableRng;
use serde::Serialize;

use crate::error::{AnalysisError, Result};

pub use interpolated::tsne_interpolated;
pub use trust::trustworthiness;

/// The deterministic t-SNE ([`tsne`] with `theta = 0`) is exact up to this many points and
/// FFT-interpolated ([`tsne_interpolated`]) above. The exact form costs O(N²) per step (about
/// half a second for 1,000 steps at 1,000 points on 2 cores, a minute at 10,000; the interpolated
/// form about 5 s at 5,000 and 23 s at 50,000 for 750 steps); at 2,000 points and below it keeps
/// every embedding hyperlens wrote before the large-N form existed (the report embeds 1,000
/// points, `analyze` at most `--tsne-points`, default 2,000).
pub const EXACT_MAX_POINTS: usize = 2_000;

/// Parameters of [`tsne`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TsneParams {
    /// Perplexity (scikit-learn's default 30); must be below `(N - 1) / 3`.
    pub perplexity: f64,
    /// Barnes-Hut threshold theta of linfa-tsne (scikit-learn's `angle`, default 0.5); 0: the
    /// deterministic t-SNE, exact up to [`EXACT_MAX_POINTS`] points and FFT-interpolated above.
    pub theta: f64,
    /// Gradient-descent iterations (scikit-learn's default 1000).
    pub max_iter: usize,
    /// Seed of the initial embedding.
    pub seed: u64,
}

impl Default for TsneParams {
    fn default() -> Self {
        TsneParams {
            perplexity: 30.0,
            theta: 0.5,
            max_iter: 1000,
            seed: 0,
        }
    }
}

impl TsneParams {
    /// The one deterministic setting of hyperlens's code embeddings (`analyze --tsne`, the logic
    /// `analyze` and the report's projections, Python's `viz` t-SNE figures): `theta` 0, the
    /// deterministic t-SNE (exact up to [`EXACT_MAX_POINTS`] points, FFT-interpolated above; the
    /// same embedding on every run, which bhtsne's Barnes-Hut, drawing its tree with an unseeded
    /// generator, does not give), `seed`, 1000 iterations, and perplexity 30
    /// (scikit-learn's default), or for fewer than 91 points the largest whole perplexity that
    /// `n_points` admits, `(n_points - 1) / 3`.
    pub fn deterministic(seed: u64, n_points: usize) -> Self {
        TsneParams {
            seed,
            perplexity: TsneParams::default()
                .perplexity
                .min(((n_points.max(4) - 1) / 3) as f64),
            theta: 0.0,
            ..TsneParams::default()
        }
    }
}

/// A t-SNE embedding of a code set's all-layer codes.
#[derive(Debug, Clone, PartialEq)]
pub struct CodeEmbedding {
    /// The embedding `[n, 2]` of the first `n` problems.
    pub embedding: Array2<f64>,
    /// Their labels `[n]`.
    pub label: ndarray::Array1<i64>,
    /// Trustworthiness (k = 5) of the embedding.
    pub trustworthiness: f64,
}

impl CodeEmbedding {
    /// The embedding of the all-layer codes of the first `min(N, max_points)` problems of `set`
    /// ([`TsneParams::deterministic`] with `seed`), with their labels and its trustworthiness
    /// (k = 5).
    ///
    /// # Shapes
    /// Codes `[N, L, H, Q, K]` -> features `[n, L * H * Q * K]` -> embedding `[n, 2]`.
    ///
    /// # Errors
    /// As [`tsne`] and [`trustworthiness`] (too few problems, fewer than 2 features).
    pub fn of_codes(set: &crate::CodeSet, max_points: usize, seed: u64) -> Result<Self> {
        let codes = set.codes();
        let n = codes.dim().0.min(max_points);
        let width = codes.len() / codes.dim().0.max(1);
        let x = codes
            .slice(ndarray::s![..n, .., .., .., ..])
            .mapv(f64::from)
            .into_shape_with_order((n, width))
            .map_err(|e| AnalysisError::Shape(format!("t-SNE features: {e}")))?;
        let embedding = tsne(x.view(), &TsneParams::deterministic(seed, n))?;
        let trustworthiness = trustworthiness(x.view(), embedding.view(), 5)?;
        Ok(Self {
            embedding,
            label: set.label().slice(ndarray::s![..n]).to_owned(),
            trustworthiness,
        })
    }

    /// The number of embedded problems.
    pub fn n(&self) -> usize {
        self.embedding.nrows()
    }

    /// Writes `tsne.npz` (`hyperlens_io::keys::tsne`: `tsne_all`, `label`).
    ///
    /// # Errors
    /// [`AnalysisError::File`] naming the file.
    pub fn write_npz(&self, path: &std::path::Path) -> Result<()> {
        use hyperlens_io::keys::tsne as keys;
        hyperlens_io::write_npz::<hyperlens_io::IoError, _>(path, |z| {
            z.add(keys::TSNE_ALL, &self.embedding)?;
            z.add(keys::LABEL, &self.label)
        })?;
        Ok(())
    }
}

/// A two-dimensional t-SNE embedding of the rows of `x` (module docs).
///
/// With `theta = 0` this is the deterministic t-SNE: for `N <= EXACT_MAX_POINTS` hyperlens's
/// exact t-SNE (bhtsne's exact mode and schedule with openTSNE's learning rate, several times faster),
/// above it [`tsne_interpolated`]; either gives the same embedding for a seed on any number of
/// threads.
///
/// With `theta > 0` this is linfa-tsne's Barnes-Hut t-SNE. The seed fixes the initial embedding,
/// but not the result: bhtsne 0.4.1 builds its nearest-neighbour tree from vantage points drawn
/// with `rand::thread_rng`, and the different summation orders that follow move the embedding from
/// run to run (its trustworthiness stays within about 0.01).
///
/// # Shapes
/// `x [N, D]` with `D >= 2` -> `[N, 2]`.
///
/// # Errors
/// [`AnalysisError::InvalidInput`] for non-finite values, fewer than 2 features, or a perplexity
/// that is not positive or not below `(N - 1) / 3`; [`AnalysisError::Numerical`] if the library
/// fails or returns non-finite coordinates.
pub fn tsne(x: ArrayView2<'_, f64>, params: &TsneParams) -> Result<Array2<f64>> {
    check(x, params)?;
    let n = x.nrows();
    if params.theta == 0.0 {
        return if n <= EXACT_MAX_POINTS {
            exact::exact_tsne(x, params)
        } else {
            tsne_interpolated(x, params)
        };
    }
    let data = x.as_standard_layout().to_owned();
    let rng = rand_chacha::ChaCha8Rng::seed_from_u64(params.seed);
    let p = *params;
    // The library asserts on some inputs; a failure there is an error of this call, not a crash.
    let out = std::panic::catch_unwind(move || {
        linfa_tsne::TSneParams::embedding_size_with_rng(2, rng)
            .perplexity(p.perplexity)
            .approx_threshold(p.theta)
            .max_iter(p.max_iter)
            .transform(data)
    })
    .map_err(|_| AnalysisError::Numerical("t-SNE failed inside linfa-tsne".into()))?
    .map_err(|e| AnalysisError::Numerical(format!("t-SNE: {e}")))?;
    if out.dim() != (n, 2) || out.iter().any(|v| !v.is_finite()) {
        return Err(AnalysisError::Numerical(
            "t-SNE returned non-finite coordinates".into(),
        ));
    }
    Ok(out)
}

/// The checks of [`tsne`]'s input and parameters (its `# Errors`).
/// The seeded start of both t-SNE forms: `n` points drawn from `N(0, 1e-4^2)` per coordinate
/// (bhtsne's start), in the order point 0's x, y, then point 1's, ... from ChaCha8 seeded with `seed`.
fn initial_embedding(n: usize, seed: u64) -> Vec<[f64; 2]> {
    use rand::Rng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let normal = rand_distr::Normal::new(0.0, 1e-4).expect("a valid normal distribution");
    (0..n)
        .map(|_| [rng.sample(normal), rng.sample(normal)])
        .collect()
}

fn check(x: ArrayView2<'_, f64>, params: &TsneParams) -> Result<()> {
    let (n, d) = x.dim();
    if d < 2 {
        return Err(AnalysisError::InvalidInput(format!(
            "t-SNE to 2 dimensions needs at least 2 features, got {d}"
        )));
    }
    if !(params.perplexity.is_finite() && params.perplexity > 0.0) {
        return Err(AnalysisError::InvalidInput(format!(
            "t-SNE: perplexity must be a positive number, got {}",
            params.perplexity
        )));
    }
    if 3.0 * params.perplexity > n as f64 - 1.0 {
        return Err(AnalysisError::InvalidInput(format!(
            "t-SNE: perplexity {} is too large for {n} points: it must be at most (N - 1) / 3 = {:.3}",
            params.perplexity,
            (n as f64 - 1.0).max(0.0) / 3.0
        )));
    }
    if !(params.theta.is_finite() && params.theta >= 0.0) {
        return Err(AnalysisError::InvalidInput(format!(
            "t-SNE: theta must be a number at least 0, got {}",
            params.theta
        )));
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(AnalysisError::InvalidInput(
            "t-SNE: the codes hold NaN or infinite values".into(),
        ));
    }
    Ok(())
}
