//! A logic problem set's arrays as views, and the one definition of their value checks (for problem
//! files and for arrays a caller gives).

use ndarray::{ArrayView1, ArrayView2};

use super::LogicParams;
use crate::error::{Result, TasksError};

/// A logic problem set's arrays as views, with the term indices as a file or a caller holds them
/// (int64, not yet checked).
///
/// # Shapes
/// As [`super::LogicBatch`]: `x [N, T, L + 1]`, `y [N]`, `targets [N, T]`, `terms [N, K, L]`,
/// `term_ids [N, K]`.
#[derive(Debug, Clone, Copy)]
pub struct LogicArrays<'a> {
    /// Inputs.
    pub x: ndarray::ArrayView3<'a, f32>,
    /// Targets of the last token.
    pub y: ArrayView1<'a, f32>,
    /// Targets of all tokens.
    pub targets: ArrayView2<'a, f32>,
    /// Term bits.
    pub terms: ndarray::ArrayView3<'a, u8>,
    /// Term indices.
    pub term_ids: ArrayView2<'a, i64>,
}

impl LogicArrays<'_> {
    /// Checks the values of a problem set whose shapes the caller has checked against `params`:
    /// `x`, `y` and `targets` truth values (finite, in [0, 1]), term bits 0 or 1, term indices
    /// below 2^L, and each term's bits those of its index (binary order, variable 0 most
    /// significant). The one definition of these checks, for problem files
    /// ([`crate::npz::load_logic`]) and for arrays given by a caller (the Python front).
    ///
    /// # Errors
    /// [`TasksError::InvalidInput`] naming the array and the first bad element.
    pub fn check_values(&self, params: &LogicParams) -> Result<()> {
        for (name, a) in [
            ("x", self.x.into_dyn()),
            ("y", self.y.into_dyn()),
            ("targets", self.targets.into_dyn()),
        ] {
            if let Some((i, v)) = a.indexed_iter().find(|(_, v)| !(0.0..=1.0).contains(*v)) {
                return Err(TasksError::input(
                    name,
                    format!(
                        "value {v} at {:?} is not a truth value (finite, in [0, 1])",
                        ndarray::Dimension::slice(&i)
                    ),
                ));
            }
        }
        if let Some((i, v)) = self.terms.indexed_iter().find(|(_, &b)| b > 1) {
            return Err(TasksError::input(
                "terms",
                format!(
                    "value {v} at {:?} is not a bit (0 or 1)",
                    <[usize; 3]>::from(i)
                ),
            ));
        }
        let (l, n_terms) = (params.variables, params.n_terms() as i64);
        if let Some(((b, j), v)) = self
            .term_ids
            .indexed_iter()
            .find(|(_, &i)| !(0..n_terms).contains(&i))
        {
            return Err(TasksError::input(
                "term_ids",
                format!("index {v} at [{b}, {j}] outside 0..{n_terms} (2^L, L = {l} variables)"),
            ));
        }
        for ((b, j), &id) in self.term_ids.indexed_iter() {
            let bits = params.term_bits(id as usize);
            let row = self.terms.slice(ndarray::s![b, j, ..]);
            if row.iter().ne(bits.iter()) {
                return Err(TasksError::input(
                    "terms",
                    format!(
                        "terms[{b}, {j}] = {:?} disagrees with term_ids[{b}, {j}] = {id}, whose \
                         bits are {bits:?}",
                        row.to_vec()
                    ),
                ));
            }
        }
        Ok(())
    }
}
