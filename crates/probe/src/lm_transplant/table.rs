//! The tables and the JSON file of the language-model transplant ([`super::lm_transplant`]).

use std::path::Path;

use hyperlens_analysis::table::{write_tables, Column, Table};

use super::{LmTransplant, LmTransplantRow};
use crate::error::Result;

/// `transplant.csv` (one row per layer, or `all` for the layers at once, and kind) or `transplant_by_donor.csv` (with the donor
/// label value): `layer,kind[,donor_label],n,to_donor,elsewhere,unchanged,excluded,frac_to_donor,frac_changed,max_logit_change`
/// (fractions with 6 decimals, NaN where no pair was scored; the largest logit change in exponent
/// notation).
///
/// # Errors
/// None in practice (every column has one value per row).
pub fn lm_transplant_table(rows: &[LmTransplantRow]) -> Result<Table> {
    let ints = |f: &dyn Fn(&LmTransplantRow) -> usize| {
        Column::Int(rows.iter().map(|r| f(r) as i64).collect())
    };
    let mut t = Table::new();
    t.push(
        "layer",
        Column::Text(
            rows.iter()
                .map(|r| r.layer.map_or_else(|| "all".to_string(), |l| l.to_string()))
                .collect(),
        ),
    )?;
    t.push(
        "kind",
        Column::Text(rows.iter().map(|r| r.kind.to_string()).collect()),
    )?;
    if rows.iter().any(|r| r.donor_label.is_some()) {
        t.push(
            "donor_label",
            Column::Text(
                rows.iter()
                    .map(|r| r.donor_label.clone().unwrap_or_default())
                    .collect(),
            ),
        )?;
    }
    t.push("n", ints(&|r| r.n))?;
    t.push("to_donor", ints(&|r| r.to_donor))?;
    t.push("elsewhere", ints(&|r| r.elsewhere))?;
    t.push("unchanged", ints(&|r| r.unchanged))?;
    t.push("excluded", ints(&|r| r.excluded))?;
    t.push(
        "frac_to_donor",
        Column::float(rows.iter().map(|r| r.frac_to_donor).collect(), 6),
    )?;
    t.push(
        "frac_changed",
        Column::float(rows.iter().map(|r| r.frac_changed).collect(), 6),
    )?;
    t.push(
        "max_logit_change",
        Column::Exp(rows.iter().map(|r| r.max_logit_change).collect()),
    )?;
    Ok(t)
}

/// Writes `transplant.csv` and `transplant_by_donor.csv` ([`lm_transplant_table`]) and
/// `transplant.json` (the whole [`LmTransplant`]) into `dir` (created if missing), each
/// atomically.
///
/// # Errors
/// [`crate::ProbeError::File`] or an analysis error naming a file that could not be written.
pub fn write_lm_transplant(dir: &Path, result: &LmTransplant) -> Result<()> {
    write_tables(
        dir,
        vec![
            ("transplant.csv", lm_transplant_table(&result.rows)?),
            (
                "transplant_by_donor.csv",
                lm_transplant_table(&result.by_donor)?,
            ),
        ],
    )?;
    hyperlens_io::write_json(&dir.join("transplant.json"), result)?;
    Ok(())
}
