//! With the feature `cuda`, compiles the fused CUDA kernels (`src/ops/cuda/kernels.cu`) to PTX
//! with nvcc, as candle-kernels 0.11 builds candle's own kernels (with `cudaforge`), and writes
//! `$OUT_DIR/ptx.rs`, which `src/ops/cuda/mod.rs` includes: the PTX text is compiled into the
//! library and loaded by the driver when a kernel first runs. The architecture is
//! `CUDA_COMPUTE_CAP` (`scripts/cuda-build-env.sh` sets 90) or that of the machine's GPU (asked
//! of `nvidia-smi`); nothing is fetched. Without the feature there is nothing to build, and
//! neither nvcc nor CUDA is needed.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(feature = "cuda")]
    cuda::build();
}

#[cfg(feature = "cuda")]
mod cuda {
    /// The kernels' source, relative to the package.
    const SOURCE: &str = "src/ops/cuda/kernels.cu";

    pub fn build() {
        println!("cargo::rerun-if-changed={SOURCE}");
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        let ptx = cudaforge::KernelBuilder::new()
            .source_files([SOURCE])
            .arg("-std=c++17")
            .arg("-O3")
            .build_ptx()
            .unwrap_or_else(|e| panic!("nvcc could not build {SOURCE}: {e}"));
        ptx.write(out.join("ptx.rs"))
            .unwrap_or_else(|e| panic!("writing {}: {e}", out.join("ptx.rs").display()));
    }
}
