//! The multinomial logistic-regression fit behind [`crate::decode::LogisticProbe`]: scikit-learn's
//! `LogisticRegression(solver="lbfgs")` objective and stopping rules, minimised by argmin's L-BFGS
//! with a Moré–Thuente line search, with the loss and its gradient computed in one pass over the
//! data.
//!
//! Why not linfa-logistic, which the first build used: on 51,200 codes it was 1.2-3.4x slower than
//! scikit-learn (`CHANGELOG.md`, performance history). Two causes, both fixed here:
//! - its loss and its gradient are two separate passes over the data, each allocating `[N, K]`
//!   temporaries, and argmin asks for both at every trial step;
//! - it stops on the L2 norm of the gradient, while scikit-learn (through scipy's L-BFGS-B) stops
//!   on its largest component, or when the objective stops decreasing, so linfa ran many more
//!   iterations for the same `tol`.
//!
//! The objective (scikit-learn >= 1.1, `LinearModelLoss` with `l2_reg_strength = 1 / (C N)`):
//! `f(W, b) = (1/N) sum_i [logsumexp(z_i) - z_{i, y_i}] + 1 / (2 C N) ||W||^2`, `z_i = x_i W + b`,
//! with an unpenalised intercept `b`. It is strictly convex in `W`, so every solver that converges
//! reaches the same weights (up to a common shift of the intercepts).
//!
//! Stopping rules (scipy's L-BFGS-B with scikit-learn's options `gtol = tol`,
//! `ftol = 64 * f64::EPSILON`): converged when `max_j |g_j| <= tol`, or when
//! `(f_prev - f) / max(|f_prev|, |f|, 1) <= ftol`; not converged when `max_iterations` runs out.

use std::cell::RefCell;

use argmin::core::{
    CostFunction, Executor, Gradient, IterState, Problem, Solver, State, TerminationReason,
    TerminationStatus, KV,
};
use argmin::solver::linesearch::MoreThuenteLineSearch;
use argmin::solver::quasinewton::LBFGS;
use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2, Axis};
use rayon::prelude::*;

use crate::decode::LogisticParams;
use crate::error::{AnalysisError, Result};

/// Rows per block of the fused loss-and-gradient pass: the block's features stay in the cache
/// between the forward product and the gradient product.
const BLOCK: usize = 512;
/// L-BFGS history length (scikit-learn's and scipy's default, `maxcor = 10`).
const HISTORY: usize = 10;
/// scikit-learn's `ftol` for lbfgs: `64 * np.finfo(float).eps`.
const FTOL: f64 = 64.0 * f64::EPSILON;

/// A fitted multinomial model on standardised features.
#[derive(Debug, Clone)]
pub(crate) struct MultinomialFit {
    /// Weights, `[D, K]`.
    pub coef: Array2<f64>,
    /// Intercepts, `[K]`.
    pub intercept: Array1<f64>,
    /// L-BFGS iterations run.
    pub iterations: u64,
    /// Whether a stopping rule other than the iteration limit ended the fit.
    pub converged: bool,
}

/// Fits `P(y = k | x) = softmax(x W + b)_k` by minimising scikit-learn's objective (module docs).
///
/// # Shapes
/// `x`: `[N, D]` (already standardised); `y`: `[N]` with values in `0..k`; `k >= 2`.
///
/// # Errors
/// [`AnalysisError::Numerical`] if the optimiser fails or returns non-finite weights.
pub(crate) fn fit(
    x: ArrayView2<'_, f64>,
    y: ArrayView1<'_, usize>,
    k: usize,
    params: &LogisticParams,
) -> Result<MultinomialFit> {
    let (n, d) = x.dim();
    debug_assert!(y.len() == n && k >= 2 && y.iter().all(|&c| c < k));
    let x = x.as_standard_layout();
    let objective = Objective {
        x: x.view(),
        y: y.view(),
        k,
        lambda: 1.0 / (params.c * n as f64),
        cache: RefCell::new(None),
    };
    let linesearch = MoreThuenteLineSearch::new();
    let solver = ScipyStopping {
        lbfgs: LBFGS::new(linesearch, HISTORY),
        gtol: params.tol,
    };
    let init = Array1::<f64>::zeros((d + 1) * k);
    let result = Executor::new(objective, solver)
        .configure(|state| state.param(init).max_iters(params.max_iterations))
        .ctrlc(false)
        .run()
        .map_err(|e| AnalysisError::Numerical(format!("logistic regression: {e}")))?;
    let state = result.state();
    let iterations = state.get_iter();
    let converged = matches!(
        state.get_termination_reason(),
        Some(TerminationReason::SolverConverged)
    );
    let theta = state
        .get_best_param()
        .or(state.get_param())
        .ok_or_else(|| {
            AnalysisError::Numerical("logistic regression returned no weights".into())
        })?;
    if theta.iter().any(|v| !v.is_finite()) {
        return Err(AnalysisError::Numerical(
            "logistic regression diverged (non-finite weights)".into(),
        ));
    }
    let coef = theta
        .slice(s![..d * k])
        .to_owned()
        .into_shape_with_order((d, k))
        .map_err(|e| AnalysisError::Numerical(format!("logistic regression weights: {e}")))?;
    let intercept = theta.slice(s![d * k..]).to_owned();
    Ok(MultinomialFit {
        coef,
        intercept,
        iterations,
        converged,
    })
}

/// The objective of [`fit`] over `theta = [W row-major ([D, K]), b ([K])]`.
///
/// argmin asks for the cost and then the gradient at the same point; both come from one pass,
/// and the gradient of the last cost evaluation is cached for the second call.
struct Objective<'a> {
    x: ArrayView2<'a, f64>,
    y: ArrayView1<'a, usize>,
    k: usize,
    /// `1 / (C N)`.
    lambda: f64,
    cache: RefCell<Option<Evaluated>>,
}

/// A point of the objective with its loss and gradient.
type Evaluated = (Array1<f64>, f64, Array1<f64>);

impl Objective<'_> {
    /// Loss and gradient at `theta`, from the cache when `theta` was the last point evaluated.
    fn evaluate(&self, theta: &Array1<f64>) -> (f64, Array1<f64>) {
        if let Some((at, f, g)) = self.cache.borrow().as_ref() {
            if at == theta {
                return (*f, g.clone());
            }
        }
        let (f, g) = self.loss_and_gradient(theta.view());
        *self.cache.borrow_mut() = Some((theta.clone(), f, g.clone()));
        (f, g)
    }

    /// One pass over the rows in blocks of [`BLOCK`]: `Z = X_b W + b`, the per-row log-sum-exp
    /// and softmax, then `X_b^T (P - Y)` added to the gradient while the block is in the cache.
    fn loss_and_gradient(&self, theta: ArrayView1<'_, f64>) -> (f64, Array1<f64>) {
        let (n, d) = self.x.dim();
        let k = self.k;
        let w = theta
            .slice(s![..d * k])
            .into_shape_with_order((d, k))
            .expect("theta holds [D, K] weights then K intercepts");
        let b = theta.slice(s![d * k..]);
        let mut grad = Array1::<f64>::zeros((d + 1) * k);
        let mut loss = 0.0;
        {
            let (gw, gb) = grad.view_mut().split_at(Axis(0), d * k);
            let mut gw = gw
                .into_shape_with_order((d, k))
                .expect("gradient holds [D, K] weights then K intercepts");
            let mut gb = gb;
            let mut z = Array2::<f64>::zeros((BLOCK.min(n), k));
            let mut start = 0;
            while start < n {
                let end = (start + BLOCK).min(n);
                let xb = self.x.slice(s![start..end, ..]);
                let mut zb = z.slice_mut(s![..end - start, ..]);
                zb.assign(&b);
                split_mat_mul(xb, w, zb.view_mut());
                loss += softmax_residuals(&mut zb, self.y.slice(s![start..end]));
                gb += &zb.sum_axis(Axis(0));
                split_mat_mul(xb.t(), zb.view(), gw.view_mut());
                start = end;
            }
        }
        let inv_n = 1.0 / n as f64;
        grad.mapv_inplace(|g| g * inv_n);
        let mut penalty = 0.0;
        for (g, &wi) in grad.iter_mut().zip(w.iter()) {
            *g += self.lambda * wi;
            penalty += wi * wi;
        }
        (loss * inv_n + 0.5 * self.lambda * penalty, grad)
    }
}

/// Rows of `c` per piece of [`split_mat_mul`] at the least: below this a piece's product is too
/// small to pay for handing it to another thread.
const MIN_SPLIT_ROWS: usize = 64;

/// `c += a b`, with the rows of `c` (and of `a`) split into one piece per rayon thread and the
/// pieces multiplied in parallel.
///
/// Every element of `c` comes out with the same bits as one `general_mat_mul(1.0, a, b, 1.0, c)`:
/// matrixmultiply accumulates each element over the inner dimension in the same order whatever
/// block of rows it sits in, so splitting the rows changes which thread computes an element, never
/// how (test `split_products_equal_one_product_bit_for_bit`). The fit therefore gives the same
/// weights on any number of threads.
///
/// # Shapes
/// `a`: `[M, P]`; `b`: `[P, K]`; `c`: `[M, K]`.
fn split_mat_mul(a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>, c: ArrayViewMut2<'_, f64>) {
    let rows = c.nrows();
    let pieces = rayon::current_num_threads()
        .min(rows / MIN_SPLIT_ROWS)
        .max(1);
    let per = rows.div_ceil(pieces);
    let mut work = Vec::with_capacity(pieces);
    let (mut a, mut c) = (a, c);
    while c.nrows() > per {
        let (a_head, a_tail) = a.split_at(Axis(0), per);
        let (c_head, c_tail) = c.split_at(Axis(0), per);
        work.push((a_head, c_head));
        (a, c) = (a_tail, c_tail);
    }
    work.push((a, c));
    work.into_par_iter()
        .for_each(|(a, mut c)| general_mat_mul(1.0, &a, &b, 1.0, &mut c));
}

/// Replaces each row of logits `z_i` by `softmax(z_i) - onehot(y_i)` and returns
/// `sum_i [logsumexp(z_i) - z_{i, y_i}]`.
fn softmax_residuals(z: &mut ArrayViewMut2<'_, f64>, y: ArrayView1<'_, usize>) -> f64 {
    let mut loss = 0.0;
    for (mut row, &label) in z.rows_mut().into_iter().zip(y.iter()) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut sum = 0.0;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        // logsumexp(z) - z_y = ln(sum) - (z_y - max), and z_y - max = ln(e_y)
        let e_y = row[label];
        loss += sum.ln() - e_y.ln();
        let inv = 1.0 / sum;
        row.mapv_inplace(|v| v * inv);
        row[label] -= 1.0;
    }
    loss
}

impl CostFunction for Objective<'_> {
    type Param = Array1<f64>;
    type Output = f64;

    fn cost(&self, theta: &Self::Param) -> std::result::Result<f64, argmin::core::Error> {
        Ok(self.evaluate(theta).0)
    }
}

impl Gradient for Objective<'_> {
    type Param = Array1<f64>;
    type Gradient = Array1<f64>;

    fn gradient(
        &self,
        theta: &Self::Param,
    ) -> std::result::Result<Array1<f64>, argmin::core::Error> {
        Ok(self.evaluate(theta).1)
    }
}

type Lbfgs =
    LBFGS<MoreThuenteLineSearch<Array1<f64>, Array1<f64>, f64>, Array1<f64>, Array1<f64>, f64>;
type LbfgsState = IterState<Array1<f64>, Array1<f64>, (), (), (), f64>;

/// argmin's L-BFGS with scipy's L-BFGS-B stopping rules in place of argmin's (module docs).
struct ScipyStopping {
    lbfgs: Lbfgs,
    gtol: f64,
}

impl<'a> Solver<Objective<'a>, LbfgsState> for ScipyStopping {
    fn name(&self) -> &str {
        "L-BFGS (scipy's stopping rules)"
    }

    fn init(
        &mut self,
        problem: &mut Problem<Objective<'a>>,
        state: LbfgsState,
    ) -> std::result::Result<(LbfgsState, Option<KV>), argmin::core::Error> {
        self.lbfgs.init(problem, state)
    }

    fn next_iter(
        &mut self,
        problem: &mut Problem<Objective<'a>>,
        state: LbfgsState,
    ) -> std::result::Result<(LbfgsState, Option<KV>), argmin::core::Error> {
        self.lbfgs.next_iter(problem, state)
    }

    fn terminate(&mut self, state: &LbfgsState) -> TerminationStatus {
        let Some(g) = state.get_gradient() else {
            return TerminationStatus::NotTerminated;
        };
        let largest = g.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        if largest <= self.gtol {
            return TerminationStatus::Terminated(TerminationReason::SolverConverged);
        }
        let (prev, cur) = (state.get_prev_cost(), state.get_cost());
        if state.get_iter() > 0
            && prev.is_finite()
            && (prev - cur) <= FTOL * prev.abs().max(cur.abs()).max(1.0)
        {
            return TerminationStatus::Terminated(TerminationReason::SolverConverged);
        }
        TerminationStatus::NotTerminated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem() -> (Array2<f64>, Array1<usize>) {
        // 1,100 rows (three blocks, the last one partial), 3 features, 4 classes
        let n = 1_100;
        let x = Array2::from_shape_fn((n, 3), |(i, j)| {
            (((i * 31 + j * 17) % 97) as f64 / 48.5 - 1.0) * (j + 1) as f64
        });
        let y = (0..n)
            .map(|i| {
                ((x[[i, 0]] + 0.5 * x[[i, 2]] + (i % 5) as f64 * 0.3).floor() as i64).rem_euclid(4)
                    as usize
            })
            .collect();
        (x, y)
    }

    #[test]
    fn split_products_equal_one_product_bit_for_bit() {
        // odd sizes: partial microkernel tiles and inner blocks of matrixmultiply
        let (m, p, k) = (301, 517, 7);
        let a = Array2::from_shape_fn((m, p), |(i, j)| {
            ((i * 7919 + j * 104_729) % 1_009) as f64 / 97.0 - 5.1
        });
        let b = Array2::from_shape_fn((p, k), |(i, j)| {
            ((i * 31 + j * 1_013) % 211) as f64 / 13.0 - 8.3
        });
        let c0 = Array2::from_shape_fn((m, k), |(i, j)| (i + j) as f64 * 0.37);
        let mut one = c0.clone();
        general_mat_mul(1.0, &a, &b, 1.0, &mut one);
        for threads in [1, 2, 3, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut split = c0.clone();
            pool.install(|| split_mat_mul(a.view(), b.view(), split.view_mut()));
            let same = one
                .iter()
                .zip(split.iter())
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{threads} threads");
            // and transposed operands, as the gradient product uses them
            let mut one_t = Array2::<f64>::zeros((p, k));
            let bt = Array2::from_shape_fn((m, k), |(i, j)| b[[i % p, j]]);
            general_mat_mul(1.0, &a.t(), &bt, 1.0, &mut one_t);
            let mut split_t = Array2::<f64>::zeros((p, k));
            pool.install(|| split_mat_mul(a.t(), bt.view(), split_t.view_mut()));
            assert!(one_t
                .iter()
                .zip(split_t.iter())
                .all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    #[test]
    fn gradient_matches_central_differences() {
        let (x, y) = problem();
        let objective = Objective {
            x: x.view(),
            y: y.view(),
            k: 4,
            lambda: 0.3,
            cache: RefCell::new(None),
        };
        let theta = Array1::from_shape_fn(16, |i| ((i * 7) % 5) as f64 * 0.2 - 0.4);
        let (f, g) = objective.loss_and_gradient(theta.view());
        // the loss by its definition, row by row
        let mut want = 0.0;
        for (row, &label) in x.rows().into_iter().zip(y.iter()) {
            let z: Vec<f64> = (0..4)
                .map(|c| (0..3).map(|j| row[j] * theta[j * 4 + c]).sum::<f64>() + theta[12 + c])
                .collect();
            let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
            want += lse - z[label];
        }
        want = want / 1_100.0 + 0.15 * theta.slice(s![..12]).iter().map(|w| w * w).sum::<f64>();
        assert!((f - want).abs() < 1e-12, "{f} vs {want}");
        for j in 0..16 {
            let h = 1e-5;
            let mut up = theta.clone();
            up[j] += h;
            let mut down = theta.clone();
            down[j] -= h;
            let numeric = (objective.loss_and_gradient(up.view()).0
                - objective.loss_and_gradient(down.view()).0)
                / (2.0 * h);
            assert!(
                (g[j] - numeric).abs() < 1e-8,
                "component {j}: {} vs {numeric}",
                g[j]
            );
        }
    }

    #[test]
    fn the_fit_stops_at_scikit_learns_gradient_tolerance() {
        let (x, y) = problem();
        let params = LogisticParams {
            c: 1.0,
            max_iterations: 500,
            tol: 1e-6,
        };
        let fit = fit(x.view(), y.view(), 4, &params).unwrap();
        assert!(fit.converged && fit.iterations > 1);
        let objective = Objective {
            x: x.view(),
            y: y.view(),
            k: 4,
            lambda: 1.0 / 1_100.0,
            cache: RefCell::new(None),
        };
        let mut theta = fit.coef.iter().copied().collect::<Vec<_>>();
        theta.extend(fit.intercept.iter());
        let (_, g) = objective.loss_and_gradient(Array1::from(theta).view());
        let largest = g.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        // stopped by the gradient rule, or by the relative-decrease rule even closer to it
        assert!(largest <= 1e-5, "largest gradient component {largest}");
        // one iteration is not enough, and the limit is reported
        let short = fit_with_limit(&x, &y, 1);
        assert!(!short.converged && short.iterations == 1);
    }

    fn fit_with_limit(x: &Array2<f64>, y: &Array1<usize>, max_iterations: u64) -> MultinomialFit {
        let params = LogisticParams {
            c: 1.0,
            max_iterations,
            tol: 1e-6,
        };
        fit(x.view(), y.view(), 4, &params).unwrap()
    }
}
