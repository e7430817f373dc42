//! A typed table: named columns of integers, floats (each with the precision its CSV file prints),
//! booleans or text. The one definition of a table that hyperlens writes as CSV and hands to the
//! Python front as columns, so that the file and the columns hold the same values: a float column
//! hands over each value as its CSV text reads back ([`Table::column_f64`]), and the front parses
//! nothing.

use crate::error::{AnalysisError, Result};

/// The values of one column.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// Integers, printed in full.
    Int(Vec<i64>),
    /// Integers that may be missing (an empty cell); read as floats, a missing value as NaN.
    MaybeInt(Vec<Option<i64>>),
    /// Floats, printed with `decimals` digits after the point (`None`: Rust's shortest text that
    /// reads back to the same float).
    Float {
        /// The values.
        values: Vec<f64>,
        /// Digits after the point in the CSV text.
        decimals: Option<usize>,
    },
    /// Floats that may be missing, printed as Rust's shortest text that reads back to the same
    /// float, a missing value as an empty cell.
    MaybeFloat(Vec<Option<f64>>),
    /// Floats printed in Rust's shortest exponent notation (`{:e}`, e.g. `1.5e-7`).
    Exp(Vec<f64>),
    /// Booleans, printed `true` / `false`.
    Bool(Vec<bool>),
    /// Text, printed as is (no value holds a comma, a quote or a line break).
    Text(Vec<String>),
}

impl Column {
    /// Floats printed as Rust's shortest text that reads back to the same float.
    pub fn shortest(values: Vec<f64>) -> Self {
        Self::Float {
            values,
            decimals: None,
        }
    }

    /// Floats printed with `decimals` digits.
    pub fn float(values: Vec<f64>, decimals: usize) -> Self {
        Self::Float {
            values,
            decimals: Some(decimals),
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            Self::Int(v) => v.len(),
            Self::MaybeInt(v) => v.len(),
            Self::Float { values, .. } => values.len(),
            Self::MaybeFloat(v) => v.len(),
            Self::Exp(v) => v.len(),
            Self::Bool(v) => v.len(),
            Self::Text(v) => v.len(),
        }
    }

    /// Whether the column has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `i` as CSV text.
    fn cell(&self, i: usize) -> String {
        match self {
            Self::Int(v) => v[i].to_string(),
            Self::MaybeInt(v) => v[i].map(|x| x.to_string()).unwrap_or_default(),
            Self::Float {
                values,
                decimals: Some(d),
            } => format!("{:.*}", d, values[i]),
            Self::Float {
                values,
                decimals: None,
            } => values[i].to_string(),
            Self::MaybeFloat(v) => v[i].map(|x| x.to_string()).unwrap_or_default(),
            Self::Exp(v) => format!("{:e}", v[i]),
            Self::Bool(v) => v[i].to_string(),
            Self::Text(v) => v[i].clone(),
        }
    }
}

/// Named columns of equal length, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    columns: Vec<(String, Column)>,
}

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a column.
    ///
    /// # Errors
    /// [`AnalysisError::Shape`] when its length differs from the columns before it;
    /// [`AnalysisError::InvalidInput`] for a name already used or a text value that CSV would have
    /// to quote.
    pub fn push(&mut self, name: impl Into<String>, column: Column) -> Result<()> {
        let name = name.into();
        if let Some((first, c)) = self.columns.first() {
            if c.len() != column.len() {
                return Err(AnalysisError::Shape(format!(
                    "column {name} has {} rows, column {first} {}",
                    column.len(),
                    c.len()
                )));
            }
        }
        if self.columns.iter().any(|(n, _)| *n == name) {
            return Err(AnalysisError::InvalidInput(format!(
                "the table has two columns {name}"
            )));
        }
        if let Column::Text(v) = &column {
            if let Some(bad) = v.iter().find(|s| s.contains([',', '"', '\n', '\r'])) {
                return Err(AnalysisError::InvalidInput(format!(
                    "column {name}: {bad:?} would need quoting in CSV"
                )));
            }
        }
        self.columns.push((name, column));
        Ok(())
    }

    /// The columns, in order.
    pub fn columns(&self) -> &[(String, Column)] {
        &self.columns
    }

    /// The number of rows.
    pub fn n_rows(&self) -> usize {
        self.columns.first().map_or(0, |(_, c)| c.len())
    }

    /// The table as CSV text: a header line, then one line per row, each ending in `\n`.
    pub fn to_csv(&self) -> String {
        let mut s = self
            .columns
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(",");
        s.push('\n');
        for i in 0..self.n_rows() {
            let row: Vec<String> = self.columns.iter().map(|(_, c)| c.cell(i)).collect();
            s += &row.join(",");
            s.push('\n');
        }
        s
    }

    /// A float column's values as its CSV text reads them back (rounded to its printed digits; a
    /// missing value as NaN), so that a reader of the columns sees the file's numbers.
    ///
    /// # Errors
    /// [`AnalysisError::InvalidInput`] when `column` is not a float column (or integers that may
    /// be missing).
    pub fn column_f64(column: &Column) -> Result<Vec<f64>> {
        match column {
            Column::Float { .. } | Column::MaybeFloat(_) | Column::MaybeInt(_) | Column::Exp(_) => {
                Ok((0..column.len())
                    .map(|i| column.cell(i).parse::<f64>().unwrap_or(f64::NAN))
                    .collect())
            }
            _ => Err(AnalysisError::InvalidInput(
                "not a float column".to_string(),
            )),
        }
    }
}

/// Writes each `(file name, table)` as CSV into `dir` (created if missing), each atomically, and
/// returns the paths written, in order.
///
/// # Errors
/// [`AnalysisError::Io`] if `dir` cannot be created; [`AnalysisError::File`] naming the path if a
/// write fails.
pub fn write_tables(
    dir: &std::path::Path,
    tables: Vec<(&'static str, Table)>,
) -> Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|source| AnalysisError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut written = Vec::with_capacity(tables.len());
    for (name, table) in tables {
        let path = dir.join(name);
        hyperlens_io::write_atomic(&path, table.to_csv().as_bytes())?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let mut t = Table::new();
        t.push("layer", Column::Int(vec![0, 1])).unwrap();
        t.push("label", Column::Text(vec!["L0H0".into(), "L1H0".into()]))
            .unwrap();
        t.push("score", Column::float(vec![0.1234567, f64::NAN], 3))
            .unwrap();
        t.push(
            "raw",
            Column::Float {
                values: vec![0.5, 1.0 / 3.0],
                decimals: None,
            },
        )
        .unwrap();
        t.push("above", Column::Bool(vec![true, false])).unwrap();
        t.push("maybe", Column::MaybeFloat(vec![None, Some(0.25)]))
            .unwrap();
        t.push("index", Column::MaybeInt(vec![Some(3), None]))
            .unwrap();
        t.push("exp", Column::Exp(vec![1.5e-7, 0.0])).unwrap();
        t
    }

    #[test]
    fn csv_prints_each_column_at_its_precision() {
        assert_eq!(
            table().to_csv(),
            "layer,label,score,raw,above,maybe,index,exp\n0,L0H0,0.123,0.5,true,,3,1.5e-7\n1,L1H0,NaN,0.3333333333333333,false,0.25,,0e0\n"
        );
    }

    #[test]
    fn float_columns_read_back_as_printed() {
        let t = table();
        let v = Table::column_f64(&t.columns()[2].1).unwrap();
        assert_eq!(v[0], 0.123);
        assert!(v[1].is_nan());
        assert_eq!(
            Table::column_f64(&t.columns()[3].1).unwrap(),
            vec![0.5, 1.0 / 3.0]
        );
        assert!(Table::column_f64(&t.columns()[0].1).is_err());
        let m = Table::column_f64(&t.columns()[5].1).unwrap();
        assert!(m[0].is_nan() && m[1] == 0.25);
        let i = Table::column_f64(&t.columns()[6].1).unwrap();
        assert!(i[0] == 3.0 && i[1].is_nan());
    }

    #[test]
    fn bad_columns_are_refused() {
        let mut t = table();
        assert!(t.push("x", Column::Int(vec![1])).is_err());
        assert!(t.push("layer", Column::Int(vec![1, 2])).is_err());
        assert!(t
            .push("t", Column::Text(vec!["a,b".into(), "c".into()]))
            .is_err());
    }
}
