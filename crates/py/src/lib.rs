//! hyperlens's Python front: the `hyperlens._core` extension module that the `hyperlens` Python
//! package (`python/hyperlens/`) wraps.
//!
//! One Rust file per Python submodule: [`tasks`] (`hyperlens.tasks`), [`model`] (`hyperlens.Model`),
//! [`lm`] (`hyperlens.LanguageModel`),
//! [`codes`] (`hyperlens.CodeSet`'s files), [`analysis`] (`hyperlens.analysis`); [`errors`] maps
//! the crates' errors to one exception hierarchy and [`arrays`] moves numpy arrays in (borrowed
//! views) and out (owned arrays handed over without a copy). Later submodules (patching, circuits,
//! train, report) slot in the same way: a file here and a `register` call below.
//!
//! Every long call releases the GIL and checks for Ctrl-C between batches. A Rust panic never
//! reaches Python as `PanicException`: [`errors::detached`] turns it into a `HyperlensError`.

use pyo3::prelude::*;

pub mod analysis;
pub mod arrays;
pub mod circuits;
pub mod codes;
pub mod errors;
pub mod lm;
pub mod lm_analysis;
pub mod logic;
pub mod model;
pub mod patching;
pub mod prompts;
pub mod records;
pub mod report;
pub mod tasks;
pub mod train;
pub mod viz;

/// Fixes candle's CPU matmul thread count once, in `RAYON_NUM_THREADS`, unless the user set it:
/// what the `hyperlens` binary does at start-up (its `pin_matmul_threads`), so that the library
/// runs with the CLI's parallelism and does not re-read `/proc/cpuinfo` on every product.
fn pin_matmul_threads() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = candle_core::utils::get_num_threads();
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
}

/// Adds a submodule `name` filled by `fill`.
fn submodule(
    m: &Bound<'_, PyModule>,
    name: &str,
    fill: fn(&Bound<'_, PyModule>) -> PyResult<()>,
) -> PyResult<()> {
    let sub = PyModule::new(m.py(), name)?;
    fill(&sub)?;
    m.add_submodule(&sub)
}

/// The extension module `hyperlens._core`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    pin_matmul_threads();
    if let Err(e) = hyperlens_io::budget::check_env() {
        return Err(errors::to_py(e));
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(arrays::check_alloc_py, m)?)?;
    model::register(m)?;
    lm::register(m)?;
    submodule(m, "tasks", tasks::register)?;
    submodule(m, "prompts", prompts::register)?;
    submodule(m, "codes", codes::register)?;
    submodule(m, "analysis", analysis::register)?;
    submodule(m, "lm_analysis", lm_analysis::register)?;
    submodule(m, "patching", patching::register)?;
    submodule(m, "circuits", circuits::register)?;
    submodule(m, "train", train::register)?;
    submodule(m, "report", report::register)?;
    submodule(m, "viz", viz::register)?;
    Ok(())
}
