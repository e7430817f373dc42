//! Latent code sets: reading the probe's `.npz` output, validating it, and flattening codes into
//! feature matrices for the analyses.
//!
//! The file format is the one of `docs/spec/latent-codes.md` ("Outputs users expect"): a NumPy `.npz`
//! archive (uncompressed, as `numpy.savez` writes it) holding
//!
//! | array          | dtype                           | shape                 | required   |
//! |----------------|---------------------------------|-----------------------|------------|
//! | `codes`        | float32 (float64 accepted)      | `[N, L, H, Q, K]`     | yes        |
//! | `label`        | any integer                     | `[N]`                 | yes        |
//! | `rules`        | any integer                     | `[N, F]`              | no         |
//! | `inputs`       | any integer                     | `[N, K]`              | no         |
//! | `target`       | any integer                     | `[N]`                 | no         |
//! | `prediction`   | any integer                     | `[N]`                 | no         |
//! | `correct`      | bool (or integer 0/1)           | `[N]`                 | no         |
//!
//! `codes[n, l, h, q, k]` is the normalised attention score of head `h` of layer `l` from the
//! `q`-th selected query to the `k`-th selected key for problem `n` (Schug et al. 2024, the latent
//! code `z_l(i, j) = a_l[:, i, j]`).

pub mod report;
mod tables;

pub use tables::{
    CodeDims, LatentSummary, LatentTimings, LayerSummary, LayerTimings, PcaSummary,
    SimilaritySummary, SourceSummary,
};

use std::fs::File;
use std::path::Path;

use hyperlens_io::keys::codes as keys;
use ndarray::{Array1, Array2, Array5, ArrayD, Axis, Ix5, IxDyn, OwnedRepr};
use ndarray_npy::{NpzReader, ReadNpyError, ReadNpzError};

use crate::error::{AnalysisError, Result};

/// One set of latent codes with their labels and per-problem side information, validated.
///
/// Invariants (checked by [`CodeSet::new`] and every `with_*` setter): `codes` has five non-empty
/// axes and only finite values, and every per-problem array has `N` rows.
#[derive(Debug, Clone, PartialEq)]
pub struct CodeSet {
    codes: Array5<f32>,
    label: Array1<i64>,
    rules: Option<Array2<i64>>,
    inputs: Option<Array2<i64>>,
    target: Option<Array1<i64>>,
    prediction: Option<Array1<i64>>,
    correct: Option<Array1<bool>>,
    source: String,
}

/// The number of SRAVEN rules: labels and rules of a code file are rule indices in `0..N_RULES`
/// (`docs/spec/sraven.md`, "Rules").
pub const N_RULES: i64 = 8;

/// Refuses a label or rule outside `0..N_RULES`, naming the file, the array and the first bad
/// entry (a stray value would otherwise become a class of its own).
fn check_rule_range<'a>(
    source: &str,
    array: &str,
    values: impl Iterator<Item = &'a i64>,
) -> Result<()> {
    for (i, &v) in values.enumerate() {
        if !(0..N_RULES).contains(&v) {
            return Err(AnalysisError::InvalidInput(format!(
                "{source}: array `{array}`: entry {i} is {v}, outside the rule indices 0..{}",
                N_RULES - 1
            )));
        }
    }
    Ok(())
}

impl CodeSet {
    /// Builds a code set from codes and labels.
    ///
    /// # Shapes
    /// `codes`: `[N, L, H, Q, K]` (problem, layer, head, query, key), finite; `label`: `[N]`.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if any axis of `codes` is empty,
    /// [`AnalysisError::NonFinite`] if `codes` holds NaN or infinity,
    /// [`AnalysisError::Shape`] if `label` does not have N entries,
    /// [`AnalysisError::InvalidInput`] for a label outside the rule indices `0..8`.
    ///
    /// This constructor and the `with_*` setters are the one validation of a code set: the file
    /// reader ([`CodeSet::read_npz`]) and every writer build a set through them.
    pub fn new(codes: Array5<f32>, label: Array1<i64>) -> Result<Self> {
        Self::with_source(codes, label, "codes")
    }

    /// [`CodeSet::new`] with `source` as the set's name in errors and records (an argument's
    /// name, say).
    ///
    /// # Errors
    /// As [`CodeSet::new`], naming `source`.
    pub fn named(source: &str, codes: Array5<f32>, label: Array1<i64>) -> Result<Self> {
        Self::with_source(codes, label, source)
    }

    fn with_source(codes: Array5<f32>, label: Array1<i64>, source: &str) -> Result<Self> {
        let dims = codes.dim();
        let (n, l, h, q, k) = dims;
        if n == 0 || l == 0 || h == 0 || q == 0 || k == 0 {
            return Err(AnalysisError::InvalidInput(format!(
                "{source}: array `codes` has shape {:?}; every axis of [N, L, H, Q, K] must be \
                 non-empty",
                codes.shape()
            )));
        }
        if let Some(pos) = codes.iter().position(|v| !v.is_finite()) {
            return Err(AnalysisError::NonFinite(format!(
                "{source}: array `codes` (first at flat index {pos})"
            )));
        }
        check_len(source, "label", label.len(), n)?;
        check_rule_range(source, keys::LABEL, label.iter())?;
        Ok(Self {
            codes,
            label,
            rules: None,
            inputs: None,
            target: None,
            prediction: None,
            correct: None,
            source: source.to_string(),
        })
    }

    /// Renames the set: `source` is the name that errors and analysis records use for it (by
    /// default the file it was read from).
    pub fn with_source_name(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// Attaches the rules of every feature slot.
    ///
    /// # Shapes
    /// `rules`: `[N, F]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if `rules` does not have N rows, [`AnalysisError::InvalidInput`]
    /// for a rule outside `0..8`.
    pub fn with_rules(mut self, rules: Array2<i64>) -> Result<Self> {
        check_len(&self.source, "rules", rules.nrows(), self.n_samples())?;
        check_rule_range(&self.source, keys::RULES, rules.iter())?;
        self.rules = Some(rules);
        Ok(self)
    }

    /// Attaches the context values at the selected keys.
    ///
    /// # Shapes
    /// `inputs`: `[N, K']` (K' is normally the number of selected keys).
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if `inputs` does not have N rows.
    pub fn with_inputs(mut self, inputs: Array2<i64>) -> Result<Self> {
        check_len(&self.source, "inputs", inputs.nrows(), self.n_samples())?;
        self.inputs = Some(inputs);
        Ok(self)
    }

    /// Attaches the target value of every problem.
    ///
    /// # Shapes
    /// `target`: `[N]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if `target` does not have N entries.
    pub fn with_target(mut self, target: Array1<i64>) -> Result<Self> {
        check_len(&self.source, "target", target.len(), self.n_samples())?;
        self.target = Some(target);
        Ok(self)
    }

    /// Attaches the model's prediction for every problem.
    ///
    /// # Shapes
    /// `prediction`: `[N]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if `prediction` does not have N entries.
    pub fn with_prediction(mut self, prediction: Array1<i64>) -> Result<Self> {
        check_len(
            &self.source,
            "prediction",
            prediction.len(),
            self.n_samples(),
        )?;
        self.prediction = Some(prediction);
        Ok(self)
    }

    /// Attaches whether the model answered every problem correctly.
    ///
    /// # Shapes
    /// `correct`: `[N]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if `correct` does not have N entries.
    pub fn with_correct(mut self, correct: Array1<bool>) -> Result<Self> {
        check_len(&self.source, "correct", correct.len(), self.n_samples())?;
        self.correct = Some(correct);
        Ok(self)
    }

    /// The codes. # Shapes: `[N, L, H, Q, K]`.
    pub fn codes(&self) -> &Array5<f32> {
        &self.codes
    }
    /// The label of every problem (the rule of the probed slot). # Shapes: `[N]`.
    pub fn label(&self) -> &Array1<i64> {
        &self.label
    }
    /// The rules of every feature slot, if stored. # Shapes: `[N, F]`.
    pub fn rules(&self) -> Option<&Array2<i64>> {
        self.rules.as_ref()
    }
    /// The context values at the selected keys, if stored. # Shapes: `[N, K]`.
    pub fn inputs(&self) -> Option<&Array2<i64>> {
        self.inputs.as_ref()
    }
    /// The target value of every problem, if stored. # Shapes: `[N]`.
    pub fn target(&self) -> Option<&Array1<i64>> {
        self.target.as_ref()
    }
    /// The model's prediction for every problem, if stored. # Shapes: `[N]`.
    pub fn prediction(&self) -> Option<&Array1<i64>> {
        self.prediction.as_ref()
    }
    /// Whether the model was correct on every problem, if stored. # Shapes: `[N]`.
    pub fn correct(&self) -> Option<&Array1<bool>> {
        self.correct.as_ref()
    }
    /// Where the set came from (the file path, or `"codes"` when built in memory).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Number of problems N.
    pub fn n_samples(&self) -> usize {
        self.codes.dim().0
    }
    /// Number of layers L.
    pub fn n_layers(&self) -> usize {
        self.codes.dim().1
    }
    /// The code axes after the problem axis: (L, H, Q, K).
    pub fn code_dims(&self) -> (usize, usize, usize, usize) {
        let (_, l, h, q, k) = self.codes.dim();
        (l, h, q, k)
    }

    /// Fraction of problems the model answered correctly (from `correct`), if stored.
    pub fn model_accuracy(&self) -> Option<f64> {
        self.correct
            .as_ref()
            .map(|c| c.iter().filter(|&&b| b).count() as f64 / c.len().max(1) as f64)
    }

    /// Flattens the codes into a feature matrix: one layer (`Some(l)`) or all layers (`None`).
    ///
    /// Features are ordered as the row-major flattening of `[H, Q, K]` (head slowest), and for all
    /// layers of `[L, H, Q, K]` (layer slowest), so feature `h*Q*K + q*K + k` of layer `l` is
    /// `codes[n, l, h, q, k]`.
    ///
    /// # Shapes
    /// Returns `[N, H*Q*K]` for one layer, `[N, L*H*Q*K]` for all layers; float64.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] if `layer` is not below L.
    pub fn features(&self, layer: Option<usize>) -> Result<Array2<f64>> {
        let (n, l, h, q, k) = self.codes.dim();
        match layer {
            Some(layer) if layer >= l => Err(AnalysisError::InvalidInput(format!(
                "{}: layer {layer} requested but the codes have {l} layers",
                self.source
            ))),
            Some(layer) => {
                let view = self.codes.index_axis(Axis(1), layer);
                let data: Vec<f64> = view.iter().map(|&v| f64::from(v)).collect();
                Array2::from_shape_vec((n, h * q * k), data)
                    .map_err(|e| AnalysisError::Shape(format!("flattening layer {layer}: {e}")))
            }
            None => {
                let data: Vec<f64> = self.codes.iter().map(|&v| f64::from(v)).collect();
                Array2::from_shape_vec((n, l * h * q * k), data)
                    .map_err(|e| AnalysisError::Shape(format!("flattening all layers: {e}")))
            }
        }
    }

    /// Reads a code set from the probe's `.npz` output (see the module docs for the arrays).
    ///
    /// # Shapes
    /// `codes` `[N, L, H, Q, K]`; `label`, `target`, `prediction`, `correct` `[N]`; `rules` `[N, F]`;
    /// `inputs` `[N, K]`.
    ///
    /// # Errors
    /// [`AnalysisError::Io`] if the file cannot be opened; [`AnalysisError::Npz`] naming the file
    /// and array if the archive is unreadable, a required array is missing or an array has the
    /// wrong dtype or number of axes; the errors of [`CodeSet::new`] and the `with_*` setters
    /// (naming the file) for inconsistent shapes or non-finite codes;
    /// [`AnalysisError::InvalidInput`] naming the file and array for a label or rule outside
    /// `0..8`; [`AnalysisError::File`] for a header that claims more data than the file holds or
    /// the memory budget allows.
    pub fn read_npz(path: impl AsRef<Path>) -> Result<Self> {
        let (mut npz, names, shown) = open_npz(
            path.as_ref(),
            &[
                keys::CODES,
                keys::LABEL,
                keys::RULES,
                keys::INPUTS,
                keys::TARGET,
                keys::PREDICTION,
                keys::CORRECT,
            ],
        )?;
        let has = |name: &str| names.iter().any(|n| n == name);
        for required in [keys::CODES, keys::LABEL] {
            if !has(required) {
                return Err(AnalysisError::Npz(format!(
                    "{shown}: required array `{required}` is missing (found: {})",
                    names.join(", ")
                )));
            }
        }
        let codes = read_codes(&mut npz, &shown)?;
        let label = to_1d(
            read_int(&mut npz, &shown, keys::LABEL)?,
            &shown,
            keys::LABEL,
        )?;
        let mut set = Self::with_source(codes, label, &shown)?;
        if has(keys::RULES) {
            let a = to_2d(
                read_int(&mut npz, &shown, keys::RULES)?,
                &shown,
                keys::RULES,
            )?;
            set = set.with_rules(a)?;
        }
        if has(keys::INPUTS) {
            let a = to_2d(
                read_int(&mut npz, &shown, keys::INPUTS)?,
                &shown,
                keys::INPUTS,
            )?;
            set = set.with_inputs(a)?;
        }
        if has(keys::TARGET) {
            let a = to_1d(
                read_int(&mut npz, &shown, keys::TARGET)?,
                &shown,
                keys::TARGET,
            )?;
            set = set.with_target(a)?;
        }
        if has(keys::PREDICTION) {
            let a = to_1d(
                read_int(&mut npz, &shown, keys::PREDICTION)?,
                &shown,
                keys::PREDICTION,
            )?;
            set = set.with_prediction(a)?;
        }
        if has(keys::CORRECT) {
            let a = to_1d(
                read_bool(&mut npz, &shown, keys::CORRECT)?,
                &shown,
                keys::CORRECT,
            )?;
            set = set.with_correct(a)?;
        }
        Ok(set)
    }

    /// Writes the set as an uncompressed `.npz` in the probe's format (codes float32, integer
    /// arrays int64, `correct` bool; names in [`hyperlens_io::keys::codes`]), atomically.
    ///
    /// # Errors
    /// [`AnalysisError::File`] naming the path and array if writing fails.
    pub fn write_npz(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        hyperlens_io::write_npz(path, |npz| -> Result<()> {
            npz.add(keys::CODES, &self.codes)?;
            npz.add(keys::LABEL, &self.label)?;
            if let Some(a) = &self.rules {
                npz.add(keys::RULES, a)?;
            }
            if let Some(a) = &self.inputs {
                npz.add(keys::INPUTS, a)?;
            }
            if let Some(a) = &self.target {
                npz.add(keys::TARGET, a)?;
            }
            if let Some(a) = &self.prediction {
                npz.add(keys::PREDICTION, a)?;
            }
            if let Some(a) = &self.correct {
                npz.add(keys::CORRECT, a)?;
            }
            Ok(())
        })
    }
}

fn check_len(source: &str, name: &str, got: usize, n: usize) -> Result<()> {
    if got != n {
        return Err(AnalysisError::Shape(format!(
            "{source}: array `{name}` has {got} rows but `codes` has N = {n} problems"
        )));
    }
    Ok(())
}

/// Opens a code file for reading: the sizes in its headers are checked against the bytes present
/// and the memory budget before ndarray-npy allocates anything; only the members named in `arrays`
/// (those the caller may read) are checked, the others are ignored as `numpy.load` ignores them.
/// Returns the reader, the names of all its arrays and the path as shown in messages.
///
/// # Errors
/// [`AnalysisError::Io`] naming the file if it cannot be read; [`AnalysisError::Npz`] for a file
/// that is not an `.npz` archive or whose headers do not fit its bytes or the budget.
pub(crate) fn open_npz(
    path: &Path,
    arrays: &[&str],
) -> Result<(NpzReader<File>, Vec<String>, String)> {
    let shown = path.display().to_string();
    hyperlens_io::inspect_npz_arrays(path, arrays).map_err(|e| match e {
        hyperlens_io::IoError::Io { source, .. } => AnalysisError::Io {
            path: shown.clone(),
            source,
        },
        other => AnalysisError::Npz(other.to_string()),
    })?;
    let file = File::open(path).map_err(|source| AnalysisError::Io {
        path: shown.clone(),
        source,
    })?;
    let mut npz = NpzReader::new(file)
        .map_err(|e| AnalysisError::Npz(format!("{shown}: not a readable .npz archive: {e}")))?;
    let names = npz
        .names()
        .map_err(|e| AnalysisError::Npz(format!("{shown}: cannot list arrays: {e}")))?;
    Ok((npz, names, shown))
}

fn npz_err(path: &str, name: &str, e: ReadNpzError) -> AnalysisError {
    AnalysisError::Npz(format!("{path}: reading array `{name}`: {e}"))
}

pub(crate) fn read_codes(npz: &mut NpzReader<File>, path: &str) -> Result<Array5<f32>> {
    let wrong_ndim = |got: Option<usize>| {
        AnalysisError::Npz(format!(
            "{path}: array `codes` must have 5 axes [N, L, H, Q, K], found {}",
            got.map_or_else(|| "another number".to_string(), |g| g.to_string())
        ))
    };
    match npz.by_name::<OwnedRepr<f32>, Ix5>(keys::CODES) {
        Ok(a) => return Ok(a),
        Err(ReadNpzError::Npy(ReadNpyError::WrongNdim(_, got))) => {
            return Err(wrong_ndim(Some(got)))
        }
        Err(ReadNpzError::Npy(ReadNpyError::WrongDescriptor(_))) => {}
        Err(e) => return Err(npz_err(path, keys::CODES, e)),
    }
    match npz.by_name::<OwnedRepr<f64>, Ix5>(keys::CODES) {
        Ok(a) => Ok(a.mapv(|v| v as f32)),
        Err(ReadNpzError::Npy(ReadNpyError::WrongNdim(_, got))) => Err(wrong_ndim(Some(got))),
        Err(ReadNpzError::Npy(ReadNpyError::WrongDescriptor(d))) => Err(AnalysisError::Npz(
            format!("{path}: array `codes` has dtype {d}; expected float32 or float64"),
        )),
        Err(e) => Err(npz_err(path, keys::CODES, e)),
    }
}

/// Reads an integer array of any NumPy integer dtype as i64.
pub(crate) fn read_int(npz: &mut NpzReader<File>, path: &str, name: &str) -> Result<ArrayD<i64>> {
    let mut descr: Option<String> = None;
    macro_rules! attempt {
        ($t:ty) => {
            match npz.by_name::<OwnedRepr<$t>, IxDyn>(name) {
                Ok(a) => {
                    let mut out = ArrayD::<i64>::zeros(a.raw_dim());
                    for (o, &v) in out.iter_mut().zip(a.iter()) {
                        *o = i64::try_from(v).map_err(|_| {
                            AnalysisError::Npz(format!(
                                "{path}: array `{name}` holds value {v}, too large for int64"
                            ))
                        })?;
                    }
                    return Ok(out);
                }
                Err(ReadNpzError::Npy(ReadNpyError::WrongDescriptor(d))) => {
                    descr.get_or_insert_with(|| d.to_string());
                }
                Err(e) => return Err(npz_err(path, name, e)),
            }
        };
    }
    attempt!(i64);
    attempt!(i32);
    attempt!(i16);
    attempt!(i8);
    attempt!(u8);
    attempt!(u16);
    attempt!(u32);
    attempt!(u64);
    Err(AnalysisError::Npz(format!(
        "{path}: array `{name}` has dtype {}; expected an integer array (int32 or int64)",
        descr.unwrap_or_default()
    )))
}

/// Reads a boolean array stored as bool or as 0/1 integers.
pub(crate) fn read_bool(npz: &mut NpzReader<File>, path: &str, name: &str) -> Result<ArrayD<bool>> {
    match npz.by_name::<OwnedRepr<bool>, IxDyn>(name) {
        Ok(a) => return Ok(a),
        Err(ReadNpzError::Npy(ReadNpyError::WrongDescriptor(_))) => {}
        // numpy bool arrays holding a byte other than 0/1 fail in parsing; report it
        Err(e) => return Err(npz_err(path, name, e)),
    }
    let ints = read_int(npz, path, name)?;
    if let Some(bad) = ints.iter().find(|&&v| v != 0 && v != 1) {
        return Err(AnalysisError::Npz(format!(
            "{path}: array `{name}` must be boolean (or 0/1 integers), found value {bad}"
        )));
    }
    Ok(ints.mapv(|v| v == 1))
}

pub(crate) fn to_1d<T>(a: ArrayD<T>, path: &str, name: &str) -> Result<Array1<T>> {
    let ndim = a.ndim();
    a.into_dimensionality().map_err(|_| {
        AnalysisError::Npz(format!(
            "{path}: array `{name}` must have 1 axis [N], found {ndim}"
        ))
    })
}

pub(crate) fn to_2d<T>(a: ArrayD<T>, path: &str, name: &str) -> Result<Array2<T>> {
    let ndim = a.ndim();
    a.into_dimensionality().map_err(|_| {
        AnalysisError::Npz(format!(
            "{path}: array `{name}` must have 2 axes [N, *], found {ndim}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array;
    use ndarray_npy::NpzWriter;

    fn sample(n: usize) -> CodeSet {
        // distinct sizes L=3, H=5, Q=2, K=7 so a swapped axis fails
        let codes = Array::from_shape_fn((n, 3, 5, 2, 7), |(a, l, h, q, k)| {
            (a * 10000 + l * 1000 + h * 100 + q * 10 + k) as f32
        });
        let label = Array1::from_iter((0..n as i64).map(|i| i % 4));
        CodeSet::new(codes, label).unwrap()
    }

    #[test]
    fn features_flatten_in_documented_order() {
        let set = sample(11);
        let f = set.features(Some(2)).unwrap();
        assert_eq!(f.dim(), (11, 5 * 2 * 7));
        for n in 0..11 {
            for h in 0..5 {
                for q in 0..2 {
                    for k in 0..7 {
                        let want = (n * 10000 + 2 * 1000 + h * 100 + q * 10 + k) as f64;
                        assert_eq!(f[[n, h * 14 + q * 7 + k]], want);
                    }
                }
            }
        }
        let all = set.features(None).unwrap();
        assert_eq!(all.dim(), (11, 3 * 70));
        assert_eq!(all[[4, 2 * 70 + 3 * 14 + 7 + 5]], f[[4, 3 * 14 + 7 + 5]]);
        assert!(matches!(
            set.features(Some(3)),
            Err(AnalysisError::InvalidInput(_))
        ));
    }

    #[test]
    fn validation_names_the_array() {
        let codes = Array5::<f32>::zeros((4, 1, 2, 1, 2));
        let err = CodeSet::new(codes.clone(), Array1::zeros(3)).unwrap_err();
        assert!(err.to_string().contains("`label`"), "{err}");
        let mut bad = codes.clone();
        bad[[2, 0, 1, 0, 0]] = f32::NAN;
        let err = CodeSet::new(bad, Array1::zeros(4)).unwrap_err();
        assert!(matches!(err, AnalysisError::NonFinite(ref m) if m.contains("codes")));
        let empty = Array5::<f32>::zeros((0, 1, 2, 1, 2));
        assert!(CodeSet::new(empty, Array1::zeros(0)).is_err());
        let set = CodeSet::new(codes, Array1::zeros(4)).unwrap();
        let err = set.with_target(Array1::zeros(5)).unwrap_err();
        assert!(err.to_string().contains("`target`"), "{err}");
    }

    #[test]
    fn npz_round_trip_and_dtypes() {
        let dir = std::env::temp_dir().join(format!("hyperlens-codes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let set = sample(9)
            .with_target(Array1::from_iter(0..9))
            .unwrap()
            .with_correct(Array1::from_iter((0..9).map(|i| i % 3 == 0)))
            .unwrap()
            .with_rules(Array2::from_shape_fn((9, 4), |(i, j)| ((i + j) % 8) as i64))
            .unwrap();
        let path = dir.join("set.npz");
        set.write_npz(&path).unwrap();
        assert!(!dir.join("set.npz.tmp").exists());
        let back = CodeSet::read_npz(&path).unwrap();
        assert_eq!(back.codes(), set.codes());
        assert_eq!(back.label(), set.label());
        assert_eq!(back.rules(), set.rules());
        assert_eq!(back.correct(), set.correct());
        assert_eq!(back.model_accuracy(), Some(3.0 / 9.0));

        // int32 labels, uint8 `correct`, float64 codes are accepted
        let path2 = dir.join("alt.npz");
        {
            let mut npz = NpzWriter::new(File::create(&path2).unwrap());
            npz.add_array("codes", &set.codes().mapv(f64::from))
                .unwrap();
            npz.add_array("label", &set.label().mapv(|v| v as i32))
                .unwrap();
            npz.add_array("correct", &Array1::from_iter((0..9u8).map(|i| i % 2)))
                .unwrap();
            npz.finish().unwrap();
        }
        let alt = CodeSet::read_npz(&path2).unwrap();
        assert_eq!(alt.label(), set.label());
        assert!(alt.correct().unwrap()[1]);
        assert!(!alt.correct().unwrap()[2]);

        // missing `label`, float labels, wrong ndim: errors naming the array
        let path3 = dir.join("bad.npz");
        {
            let mut npz = NpzWriter::new(File::create(&path3).unwrap());
            npz.add_array("codes", set.codes()).unwrap();
            npz.finish().unwrap();
        }
        let err = CodeSet::read_npz(&path3).unwrap_err();
        assert!(err.to_string().contains("`label`"), "{err}");
        {
            let mut npz = NpzWriter::new(File::create(&path3).unwrap());
            npz.add_array("codes", set.codes()).unwrap();
            npz.add_array("label", &Array1::<f32>::zeros(9)).unwrap();
            npz.finish().unwrap();
        }
        let err = CodeSet::read_npz(&path3).unwrap_err();
        assert!(
            err.to_string().contains("`label`") && err.to_string().contains("integer"),
            "{err}"
        );
        {
            let mut npz = NpzWriter::new(File::create(&path3).unwrap());
            npz.add_array("codes", &Array2::<f32>::zeros((9, 3)))
                .unwrap();
            npz.add_array("label", set.label()).unwrap();
            npz.finish().unwrap();
        }
        let err = CodeSet::read_npz(&path3).unwrap_err();
        assert!(
            err.to_string().contains("`codes`") && err.to_string().contains("5 axes"),
            "{err}"
        );
        let err = CodeSet::read_npz(dir.join("absent.npz")).unwrap_err();
        assert!(matches!(err, AnalysisError::Io { .. }));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
