//! [`LmCodeSet`]: a language model's code file (`hyperlens_io::keys::lm_codes`) with its sidecar
//! `codes.json` ([`LmCodesSidecar`]), read and validated; the feature matrices the analyses fit.
//!
//! Unlike the SRAVEN [`crate::CodeSet`], the labels are value indices of the sidecar's factors,
//! not rule indices, so the set is its own type and never goes through the rule-range check. The
//! PCA, k-means and decoding routines take plain feature matrices, so no conversion to a
//! `CodeSet` is needed.

use std::path::Path;

use hyperlens_io::keys::lm_codes as keys;
use hyperlens_io::sidecars::LmCodesSidecar;
use ndarray::{Array1, Array2, Array4, Array5, ArrayD, Axis, Ix4, OwnedRepr};
use ndarray_npy::{ReadNpyError, ReadNpzError};

use crate::codes::{open_npz, read_bool, read_codes, read_int, to_1d, to_2d};
use crate::error::{AnalysisError, Result};

/// A language model's codes over N prompts with their labels, split, sites and the model's
/// behaviour, validated.
///
/// Invariants (checked by [`LmCodeSet::new`] and every `with_*` setter): `codes` has five
/// non-empty axes and finite values; every per-prompt array has N rows; `factors` has one column
/// per sidecar factor, each entry `-1` or an index into that factor's values; `label` is the
/// column of the sidecar's `label_factor`; `split` is 0 or 1; the sidecar's `layers` and
/// `n_heads` and `n_prompts` match the codes' L, H and N.
#[derive(Debug, Clone, PartialEq)]
pub struct LmCodeSet {
    codes: Array5<f32>,
    sidecar: LmCodesSidecar,
    label: Array1<i64>,
    factors: Array2<i64>,
    split: Array1<i64>,
    prompt: Array1<i64>,
    query_pos: Array2<i64>,
    key_pos: Array2<i64>,
    length: Option<Array1<i64>>,
    target: Option<Array1<i64>>,
    prediction: Option<Array1<i64>>,
    correct: Option<Array1<bool>>,
    resid: Option<Array4<f32>>,
    source: String,
}

fn invalid(msg: String) -> AnalysisError {
    AnalysisError::InvalidInput(msg)
}

fn check_rows(source: &str, name: &str, got: usize, n: usize) -> Result<()> {
    if got != n {
        return Err(AnalysisError::Shape(format!(
            "{source}: array `{name}` has {got} rows but `codes` has N = {n} prompts"
        )));
    }
    Ok(())
}

impl LmCodeSet {
    /// Builds a set from its required arrays and sidecar; `label` is taken from the column of
    /// `sidecar.label_factor` in `factors`.
    ///
    /// # Shapes
    /// `codes`: `[N, L, H, Q, K]`, finite; `factors`: `[N, F]` (F = `sidecar.factors.len()`);
    /// `split`, `prompt`: `[N]`; `query_pos`: `[N, Q]`; `key_pos`: `[N, K]`.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] for an empty axis, a factor index outside its values, a
    /// split other than 0/1, a `label_factor` not among the factors;
    /// [`AnalysisError::NonFinite`] for NaN/infinite codes;
    /// [`AnalysisError::Shape`] for arrays of the wrong length or a sidecar whose `layers`,
    /// `n_heads` or `n_prompts` disagree with the codes. Each names the set and the array.
    pub fn new(
        codes: Array5<f32>,
        sidecar: LmCodesSidecar,
        factors: Array2<i64>,
        split: Array1<i64>,
        prompt: Array1<i64>,
        query_pos: Array2<i64>,
        key_pos: Array2<i64>,
    ) -> Result<Self> {
        let source = "codes".to_string();
        let col = label_column(&source, &sidecar)?;
        if factors.ncols() != sidecar.factors.len() {
            return Err(AnalysisError::Shape(format!(
                "{source}: array `factors` has {} columns but the sidecar names {} factors",
                factors.ncols(),
                sidecar.factors.len()
            )));
        }
        let label = factors.column(col).to_owned();
        Self::from_parts(
            source, codes, sidecar, label, factors, split, prompt, query_pos, key_pos,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        source: String,
        codes: Array5<f32>,
        sidecar: LmCodesSidecar,
        label: Array1<i64>,
        factors: Array2<i64>,
        split: Array1<i64>,
        prompt: Array1<i64>,
        query_pos: Array2<i64>,
        key_pos: Array2<i64>,
    ) -> Result<Self> {
        let (n, l, h, q, k) = codes.dim();
        if n == 0 || l == 0 || h == 0 || q == 0 || k == 0 {
            return Err(invalid(format!(
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
        if sidecar.layers.len() != l {
            return Err(AnalysisError::Shape(format!(
                "{source}: the sidecar lists {} layers {:?} but `codes` has L = {l}",
                sidecar.layers.len(),
                sidecar.layers
            )));
        }
        if sidecar.n_prompts != n {
            return Err(AnalysisError::Shape(format!(
                "{source}: the sidecar says n_prompts = {} but `codes` has N = {n}",
                sidecar.n_prompts
            )));
        }
        if sidecar.n_heads != h {
            return Err(AnalysisError::Shape(format!(
                "{source}: the sidecar says n_heads = {} but `codes` has H = {h}",
                sidecar.n_heads
            )));
        }
        check_rows(&source, keys::LABEL, label.len(), n)?;
        check_rows(&source, keys::FACTORS, factors.nrows(), n)?;
        check_rows(&source, keys::SPLIT, split.len(), n)?;
        check_rows(&source, keys::PROMPT, prompt.len(), n)?;
        check_rows(&source, keys::QUERY_POS, query_pos.nrows(), n)?;
        check_rows(&source, keys::KEY_POS, key_pos.nrows(), n)?;
        if query_pos.ncols() != q {
            return Err(AnalysisError::Shape(format!(
                "{source}: array `query_pos` has {} columns but `codes` has Q = {q}",
                query_pos.ncols()
            )));
        }
        if key_pos.ncols() != k {
            return Err(AnalysisError::Shape(format!(
                "{source}: array `key_pos` has {} columns but `codes` has K = {k}",
                key_pos.ncols()
            )));
        }
        if factors.ncols() != sidecar.factors.len() {
            return Err(AnalysisError::Shape(format!(
                "{source}: array `factors` has {} columns but the sidecar names {} factors",
                factors.ncols(),
                sidecar.factors.len()
            )));
        }
        for (j, f) in sidecar.factors.iter().enumerate() {
            let nv = f.values.len() as i64;
            if let Some((i, &v)) = factors
                .column(j)
                .iter()
                .enumerate()
                .find(|(_, &v)| v < -1 || v >= nv)
            {
                return Err(invalid(format!(
                    "{source}: array `factors`: prompt row {i}, factor `{}` has index {v}, \
                     outside -1..{} (its {nv} values)",
                    f.name,
                    nv - 1
                )));
            }
        }
        let col = label_column(&source, &sidecar)?;
        if let Some(i) = (0..n).find(|&i| label[i] != factors[[i, col]]) {
            return Err(invalid(format!(
                "{source}: array `label` row {i} is {} but `factors` gives {} for the label \
                 factor `{}`",
                label[i],
                factors[[i, col]],
                sidecar.label_factor
            )));
        }
        if let Some((i, &v)) = split.iter().enumerate().find(|(_, &v)| v != 0 && v != 1) {
            return Err(invalid(format!(
                "{source}: array `split` row {i} is {v}; a split is 0 (train) or 1 (test)"
            )));
        }
        Ok(Self {
            codes,
            sidecar,
            label,
            factors,
            split,
            prompt,
            query_pos,
            key_pos,
            length: None,
            target: None,
            prediction: None,
            correct: None,
            resid: None,
            source,
        })
    }

    /// Renames the set: `source` is the name errors and summaries use (by default the file).
    pub fn with_source_name(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// Attaches each prompt's length in tokens. # Shapes: `length` `[N]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if it does not have N entries.
    pub fn with_length(mut self, length: Array1<i64>) -> Result<Self> {
        check_rows(&self.source, keys::LENGTH, length.len(), self.n_prompts())?;
        self.length = Some(length);
        Ok(self)
    }

    /// Attaches each prompt's answer token. # Shapes: `target` `[N]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if it does not have N entries.
    pub fn with_target(mut self, target: Array1<i64>) -> Result<Self> {
        check_rows(&self.source, keys::TARGET, target.len(), self.n_prompts())?;
        self.target = Some(target);
        Ok(self)
    }

    /// Attaches the model's next-token prediction. # Shapes: `prediction` `[N]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if it does not have N entries.
    pub fn with_prediction(mut self, prediction: Array1<i64>) -> Result<Self> {
        check_rows(
            &self.source,
            keys::PREDICTION,
            prediction.len(),
            self.n_prompts(),
        )?;
        self.prediction = Some(prediction);
        Ok(self)
    }

    /// Attaches whether the model's prediction was the answer. # Shapes: `correct` `[N]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if it does not have N entries.
    pub fn with_correct(mut self, correct: Array1<bool>) -> Result<Self> {
        check_rows(&self.source, keys::CORRECT, correct.len(), self.n_prompts())?;
        self.correct = Some(correct);
        Ok(self)
    }

    /// Attaches the residual stream at the query sites (and sets the sidecar's `has_resid`).
    ///
    /// # Shapes
    /// `resid`: `[N, L, Q, D]`, finite, L and Q those of the codes.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] for other N, L or Q, or D = 0; [`AnalysisError::NonFinite`] for
    /// NaN/infinite values.
    pub fn with_resid(mut self, resid: Array4<f32>) -> Result<Self> {
        let (n, l, _, q, _) = self.codes.dim();
        let (rn, rl, rq, rd) = resid.dim();
        if rn != n || rl != l || rq != q || rd == 0 {
            return Err(AnalysisError::Shape(format!(
                "{}: array `resid` has shape {:?}; expected [N {n}, L {l}, Q {q}, D >= 1]",
                self.source,
                resid.shape()
            )));
        }
        if let Some(pos) = resid.iter().position(|v| !v.is_finite()) {
            return Err(AnalysisError::NonFinite(format!(
                "{}: array `resid` (first at flat index {pos})",
                self.source
            )));
        }
        self.resid = Some(resid);
        self.sidecar.has_resid = true;
        Ok(self)
    }

    /// Replaces each prompt's split (0 train, 1 test): another hold-out of the same codes, such as
    /// the SmolLM2 study's second and third splits of the operation x domain combinations.
    ///
    /// # Shapes
    /// `split`: `[N]`.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] if it does not have N entries; [`AnalysisError::InvalidInput`] for
    /// a value other than 0 and 1 (naming the row).
    pub fn with_split(mut self, split: Array1<i64>) -> Result<Self> {
        check_rows(&self.source, keys::SPLIT, split.len(), self.n_prompts())?;
        if let Some((i, &v)) = split.iter().enumerate().find(|(_, &v)| v != 0 && v != 1) {
            return Err(invalid(format!(
                "{}: array `split` row {i} is {v}; a split is 0 (train) or 1 (test)",
                self.source
            )));
        }
        self.split = split;
        Ok(self)
    }

    /// The set of the prompt rows `rows` (in that order; a row may repeat), with every per-prompt
    /// array and the sidecar's `n_prompts` cut to them. The `prompt` array keeps each row's
    /// prompt index in the original file.
    ///
    /// # Shapes
    /// `rows`: `[M]` indices into `0..N` -> a set of M prompts.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] for no row or a row outside `0..N`.
    pub fn select(&self, rows: &[usize]) -> Result<Self> {
        let n = self.n_prompts();
        if rows.is_empty() {
            return Err(invalid(format!("{}: no prompt row selected", self.source)));
        }
        if let Some(&r) = rows.iter().find(|&&r| r >= n) {
            return Err(invalid(format!(
                "{}: prompt row {r} is outside the {n} prompts",
                self.source
            )));
        }
        let mut sidecar = self.sidecar.clone();
        sidecar.n_prompts = rows.len();
        let opt1 = |a: &Option<Array1<i64>>| a.as_ref().map(|a| a.select(Axis(0), rows));
        Ok(Self {
            codes: self.codes.select(Axis(0), rows),
            sidecar,
            label: self.label.select(Axis(0), rows),
            factors: self.factors.select(Axis(0), rows),
            split: self.split.select(Axis(0), rows),
            prompt: self.prompt.select(Axis(0), rows),
            query_pos: self.query_pos.select(Axis(0), rows),
            key_pos: self.key_pos.select(Axis(0), rows),
            length: opt1(&self.length),
            target: opt1(&self.target),
            prediction: opt1(&self.prediction),
            correct: self.correct.as_ref().map(|a| a.select(Axis(0), rows)),
            resid: self.resid.as_ref().map(|a| a.select(Axis(0), rows)),
            source: self.source.clone(),
        })
    }

    /// Reads a code file and the sidecar beside it ([`hyperlens_io::sidecar_path`]:
    /// `codes.npz` -> `codes.json`).
    ///
    /// # Shapes
    /// As the arrays of [`hyperlens_io::keys::lm_codes`]: `codes` `[N, L, H, Q, K]` (float32 or
    /// float64), `label`, `split`, `prompt` `[N]`, `factors` `[N, F]`, `query_pos` `[N, Q]`,
    /// `key_pos` `[N, K]` (all required); `length`, `target`, `prediction`, `correct` `[N]` and
    /// `resid` `[N, L, Q, D]` optional.
    ///
    /// # Errors
    /// [`AnalysisError::Io`] if the file or its sidecar cannot be read (a missing sidecar names
    /// the path it was looked for at); [`AnalysisError::InvalidInput`] for a sidecar that is not
    /// an LM code sidecar, a sidecar that says `has_resid` without a `resid` array, and the
    /// checks of [`LmCodeSet::new`]; [`AnalysisError::Npz`] for a missing required array, a
    /// wrong dtype or number of axes. Every message names the file and the array.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let side_path = hyperlens_io::sidecar_path(path);
        let side_shown = side_path.display().to_string();
        if !path.is_file() {
            return Err(AnalysisError::Io {
                path: shown,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            });
        }
        let bytes = std::fs::read(&side_path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                invalid(format!(
                    "{shown}: its sidecar {side_shown} is missing (an LM code file is read with \
                     the codes.json written beside it)"
                ))
            } else {
                AnalysisError::Io {
                    path: side_shown.clone(),
                    source,
                }
            }
        })?;
        let sidecar: LmCodesSidecar = serde_json::from_slice(&bytes).map_err(|e| {
            invalid(format!(
                "{side_shown}: not the sidecar of a language model's code file: {e}"
            ))
        })?;
        let (mut npz, names, _) = open_npz(
            path,
            &[
                keys::CODES,
                keys::LABEL,
                keys::FACTORS,
                keys::SPLIT,
                keys::PROMPT,
                keys::LENGTH,
                keys::QUERY_POS,
                keys::KEY_POS,
                keys::TARGET,
                keys::PREDICTION,
                keys::CORRECT,
                keys::RESID,
            ],
        )?;
        let has = |name: &str| names.iter().any(|n| n == name);
        for required in [
            keys::CODES,
            keys::LABEL,
            keys::FACTORS,
            keys::SPLIT,
            keys::PROMPT,
            keys::QUERY_POS,
            keys::KEY_POS,
        ] {
            if !has(required) {
                return Err(AnalysisError::Npz(format!(
                    "{shown}: required array `{required}` is missing (found: {})",
                    names.join(", ")
                )));
            }
        }
        let codes = read_codes(&mut npz, &shown)?;
        let mut int1 = |name: &str| -> Result<Array1<i64>> {
            to_1d(read_int(&mut npz, &shown, name)?, &shown, name)
        };
        let label = int1(keys::LABEL)?;
        let split = int1(keys::SPLIT)?;
        let prompt = int1(keys::PROMPT)?;
        let mut int2 = |name: &str| -> Result<Array2<i64>> {
            to_2d(read_int(&mut npz, &shown, name)?, &shown, name)
        };
        let factors = int2(keys::FACTORS)?;
        let query_pos = int2(keys::QUERY_POS)?;
        let key_pos = int2(keys::KEY_POS)?;
        let has_resid = sidecar.has_resid;
        let mut set = Self::from_parts(
            shown.clone(),
            codes,
            sidecar,
            label,
            factors,
            split,
            prompt,
            query_pos,
            key_pos,
        )?;
        let mut opt1 = |name: &str| -> Result<Option<Array1<i64>>> {
            if has(name) {
                Ok(Some(to_1d(
                    read_int(&mut npz, &shown, name)?,
                    &shown,
                    name,
                )?))
            } else {
                Ok(None)
            }
        };
        if let Some(a) = opt1(keys::LENGTH)? {
            set = set.with_length(a)?;
        }
        if let Some(a) = opt1(keys::TARGET)? {
            set = set.with_target(a)?;
        }
        if let Some(a) = opt1(keys::PREDICTION)? {
            set = set.with_prediction(a)?;
        }
        if has(keys::CORRECT) {
            let c = to_1d(
                read_bool(&mut npz, &shown, keys::CORRECT)?,
                &shown,
                keys::CORRECT,
            )?;
            set = set.with_correct(c)?;
        }
        if has(keys::RESID) {
            let r = read_resid(&mut npz, &shown)?;
            set = set.with_resid(r)?;
        } else if has_resid {
            return Err(invalid(format!(
                "{shown}: the sidecar says has_resid but the file has no array `resid`"
            )));
        }
        Ok(set)
    }

    /// Writes the set as an uncompressed `.npz` with the arrays of
    /// [`hyperlens_io::keys::lm_codes`] (codes and resid float32, integers int64, `correct`
    /// bool) and its sidecar beside it, both atomically.
    ///
    /// # Errors
    /// [`AnalysisError::File`] naming the path (and array) if writing fails.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        hyperlens_io::write_npz(path, |npz| -> Result<()> {
            npz.add(keys::CODES, &self.codes)?;
            npz.add(keys::LABEL, &self.label)?;
            npz.add(keys::FACTORS, &self.factors)?;
            npz.add(keys::SPLIT, &self.split)?;
            npz.add(keys::PROMPT, &self.prompt)?;
            npz.add(keys::QUERY_POS, &self.query_pos)?;
            npz.add(keys::KEY_POS, &self.key_pos)?;
            if let Some(a) = &self.length {
                npz.add(keys::LENGTH, a)?;
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
            if let Some(a) = &self.resid {
                npz.add(keys::RESID, a)?;
            }
            Ok(())
        })?;
        hyperlens_io::write_sidecar(path, &self.sidecar)?;
        Ok(())
    }

    /// The codes. # Shapes: `[N, L, H, Q, K]`.
    pub fn codes(&self) -> &Array5<f32> {
        &self.codes
    }
    /// The sidecar (factors, layers, form, provenance).
    pub fn sidecar(&self) -> &LmCodesSidecar {
        &self.sidecar
    }
    /// The value index of the sidecar's label factor per prompt. # Shapes: `[N]`.
    pub fn label(&self) -> &Array1<i64> {
        &self.label
    }
    /// The value index of every factor per prompt (-1: no such label). # Shapes: `[N, F]`.
    pub fn factors(&self) -> &Array2<i64> {
        &self.factors
    }
    /// The split per prompt: 0 train (seen combinations), 1 test (held out). # Shapes: `[N]`.
    pub fn split(&self) -> &Array1<i64> {
        &self.split
    }
    /// The prompt's index in the prompt file. # Shapes: `[N]`.
    pub fn prompt(&self) -> &Array1<i64> {
        &self.prompt
    }
    /// The token position of each query site. # Shapes: `[N, Q]`.
    pub fn query_pos(&self) -> &Array2<i64> {
        &self.query_pos
    }
    /// The token position of each key site. # Shapes: `[N, K]`.
    pub fn key_pos(&self) -> &Array2<i64> {
        &self.key_pos
    }
    /// The prompt lengths in tokens, if stored. # Shapes: `[N]`.
    pub fn length(&self) -> Option<&Array1<i64>> {
        self.length.as_ref()
    }
    /// The answers' first tokens, if stored. # Shapes: `[N]`.
    pub fn target(&self) -> Option<&Array1<i64>> {
        self.target.as_ref()
    }
    /// The model's predictions, if stored. # Shapes: `[N]`.
    pub fn prediction(&self) -> Option<&Array1<i64>> {
        self.prediction.as_ref()
    }
    /// Whether the model was right, if stored. # Shapes: `[N]`.
    pub fn correct(&self) -> Option<&Array1<bool>> {
        self.correct.as_ref()
    }
    /// The residual stream at the query sites, if stored. # Shapes: `[N, L, Q, D]`.
    pub fn resid(&self) -> Option<&Array4<f32>> {
        self.resid.as_ref()
    }
    /// The set's name in messages (the file path, or `"codes"` when built in memory).
    pub fn source(&self) -> &str {
        &self.source
    }
    /// Number of prompts N.
    pub fn n_prompts(&self) -> usize {
        self.codes.dim().0
    }
    /// Number of layers L of the file.
    pub fn n_layers(&self) -> usize {
        self.codes.dim().1
    }

    /// The column of factor `name` in `factors`.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] naming the factor and listing the file's factors.
    pub fn factor_index(&self, name: &str) -> Result<usize> {
        self.sidecar
            .factors
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| {
                invalid(format!(
                    "{}: no factor `{name}`; the file's factors are: {}",
                    self.source,
                    self.sidecar
                        .factors
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// The codes of the given layer axes (indices into the file's layer axis) at the given
    /// rows, flattened row-major over `[layers, H, Q, K]` (layer slowest).
    ///
    /// # Shapes
    /// Returns `[rows.len(), layers.len() * H * Q * K]`, float64.
    pub fn code_features(&self, rows: &[usize], layers: &[usize]) -> Array2<f64> {
        let (_, _, h, q, k) = self.codes.dim();
        let width = layers.len() * h * q * k;
        let mut out = Array2::<f64>::zeros((rows.len(), width));
        for (r, &i) in rows.iter().enumerate() {
            let mut j = 0;
            for &l in layers {
                for &v in self.codes.index_axis(Axis(0), i).index_axis(Axis(0), l) {
                    out[[r, j]] = f64::from(v);
                    j += 1;
                }
            }
        }
        out
    }

    /// The residual stream of the given layer axes at the given rows, flattened over
    /// `[layers, Q, D]`; `None` when the file has no `resid`.
    ///
    /// # Shapes
    /// Returns `[rows.len(), layers.len() * Q * D]`, float64.
    pub fn resid_features(&self, rows: &[usize], layers: &[usize]) -> Option<Array2<f64>> {
        let resid = self.resid.as_ref()?;
        let (_, _, q, d) = resid.dim();
        let mut out = Array2::<f64>::zeros((rows.len(), layers.len() * q * d));
        for (r, &i) in rows.iter().enumerate() {
            let mut j = 0;
            for &l in layers {
                for &v in resid.index_axis(Axis(0), i).index_axis(Axis(0), l) {
                    out[[r, j]] = f64::from(v);
                    j += 1;
                }
            }
        }
        Some(out)
    }

    /// The query-key position distances `query_pos[n, q] - key_pos[n, k]` of the given rows,
    /// the features of the distance baseline (no code).
    ///
    /// # Shapes
    /// Returns `[rows.len(), Q * K]` (q slowest), float64.
    pub fn distance_features(&self, rows: &[usize]) -> Array2<f64> {
        let (q, k) = (self.query_pos.ncols(), self.key_pos.ncols());
        Array2::from_shape_fn((rows.len(), q * k), |(r, j)| {
            let i = rows[r];
            (self.query_pos[[i, j / k]] - self.key_pos[[i, j % k]]) as f64
        })
    }

    /// Checks that `other` holds the codes of the same prompts at the same sites (the
    /// shuffled-weights control): equal `prompt`, `query_pos` and `key_pos` arrays and equal
    /// code axes, and a sidecar that records the weight shuffle's seed.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] naming both files and the first array that differs.
    pub fn check_same_prompts(&self, other: &LmCodeSet) -> Result<()> {
        let (a, b) = (&self.source, &other.source);
        if other.n_prompts() != self.n_prompts() {
            return Err(invalid(format!(
                "{b} has {} prompts but {a} has {}: the shuffled-weights codes must be of the \
                 same prompts",
                other.n_prompts(),
                self.n_prompts()
            )));
        }
        for (name, x, y) in [
            (keys::PROMPT, self.prompt.view(), other.prompt.view()),
            (keys::SPLIT, self.split.view(), other.split.view()),
        ] {
            if let Some(i) = (0..x.len()).find(|&i| x[i] != y[i]) {
                return Err(invalid(format!(
                    "{b}: array `{name}` differs from {a}'s at row {i} ({} vs {}): the \
                     shuffled-weights codes must be of the same prompts, in the same order",
                    y[i], x[i]
                )));
            }
        }
        for (name, x, y) in [
            (keys::QUERY_POS, &self.query_pos, &other.query_pos),
            (keys::KEY_POS, &self.key_pos, &other.key_pos),
        ] {
            if x != y {
                return Err(invalid(format!(
                    "{b}: array `{name}` differs from {a}'s: the shuffled-weights codes must \
                     be read at the same sites"
                )));
            }
        }
        if other.codes.shape()[1..] != self.codes.shape()[1..] {
            return Err(invalid(format!(
                "{b}: codes of shape {:?} but {a} has {:?}",
                other.codes.shape(),
                self.codes.shape()
            )));
        }
        if other.sidecar.shuffled_weights_seed.is_none() {
            return Err(invalid(format!(
                "{b}: its sidecar has no shuffled_weights_seed, so these are not the codes of \
                 the model with its weights shuffled"
            )));
        }
        Ok(())
    }
}

fn label_column(source: &str, sidecar: &LmCodesSidecar) -> Result<usize> {
    sidecar
        .factors
        .iter()
        .position(|f| f.name == sidecar.label_factor)
        .ok_or_else(|| {
            invalid(format!(
                "{source}: the sidecar's label_factor `{}` is not among its factors ({})",
                sidecar.label_factor,
                sidecar
                    .factors
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// Reads `resid` as float32 (float64 accepted) `[N, L, Q, D]`.
fn read_resid(npz: &mut ndarray_npy::NpzReader<std::fs::File>, path: &str) -> Result<Array4<f32>> {
    let wrong = |e: ReadNpzError| AnalysisError::Npz(format!("{path}: reading array `resid`: {e}"));
    match npz.by_name::<OwnedRepr<f32>, Ix4>(keys::RESID) {
        Ok(a) => return Ok(a),
        Err(ReadNpzError::Npy(ReadNpyError::WrongDescriptor(_))) => {}
        Err(ReadNpzError::Npy(ReadNpyError::WrongNdim(_, got))) => {
            return Err(AnalysisError::Npz(format!(
                "{path}: array `resid` must have 4 axes [N, L, Q, D], found {got}"
            )))
        }
        Err(e) => return Err(wrong(e)),
    }
    let a: ArrayD<f64> = npz
        .by_name::<OwnedRepr<f64>, ndarray::IxDyn>(keys::RESID)
        .map_err(wrong)?;
    let nd = a.ndim();
    a.mapv(|v| v as f32)
        .into_dimensionality::<Ix4>()
        .map_err(|_| {
            AnalysisError::Npz(format!(
                "{path}: array `resid` must have 4 axes [N, L, Q, D], found {nd}"
            ))
        })
}
