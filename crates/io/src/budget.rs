//! The memory budget: the most memory one allocation that a file or a flag asks for may take.
//!
//! Sizes read from files (an `.npy` header, a `config.json`) and sizes given as flags (`--n`,
//! `--d-model`, `--tokens`) are checked against the budget *before* anything is allocated, so that a
//! hostile or mistyped size gives a clear error instead of an abort ("memory allocation failed") or
//! a machine that swaps.
//!
//! The budget is, in order of precedence: the value set with [`set_memory_budget`] (the binary's
//! `--memory-budget` flag), the environment variable `HYPERLENS_MEMORY_BUDGET`, or half of the
//! machine's physical memory (`MemTotal` of `/proc/meminfo`; 8 GiB where that cannot be read).
//! Sizes are written as bytes or with a binary suffix: `512M`, `8G`, `1.5T` (`K`, `M`, `G`, `T`,
//! optionally followed by `iB` or `B`, all powers of 1024).

use std::sync::OnceLock;

use thiserror::Error;

/// The environment variable that sets the budget when no flag does.
pub const BUDGET_ENV: &str = "HYPERLENS_MEMORY_BUDGET";

/// The budget where the machine's memory cannot be read: 8 GiB.
const FALLBACK_BYTES: u64 = 8 << 30;

static BUDGET: OnceLock<Budget> = OnceLock::new();

/// A memory budget and where it came from (for the error message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The budget in bytes.
    pub bytes: u64,
    /// Where the value came from.
    pub source: BudgetSource,
}

/// Where a [`Budget`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSource {
    /// `--memory-budget` (set with [`set_memory_budget`]).
    Flag,
    /// The `HYPERLENS_MEMORY_BUDGET` environment variable.
    Env,
    /// Half of the machine's physical memory.
    Machine,
    /// The 8 GiB fallback where the physical memory is unknown.
    Fallback,
}

/// A size refused by the budget, or a budget that cannot be parsed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BudgetError {
    /// The allocation would exceed the budget.
    #[error(
        "{what} would need {} of memory, over the memory budget of {} ({}); \
         set --memory-budget (or {BUDGET_ENV}) to allow it",
        human_bytes(*.bytes), human_bytes(*.budget), .source_text
    )]
    TooLarge {
        /// What was asked for, naming the file, array or flag.
        what: String,
        /// The bytes it would take (saturated at `u128::MAX`).
        bytes: u128,
        /// The budget in bytes.
        budget: u64,
        /// Where the budget came from, in words.
        source_text: String,
    },
    /// A budget string that is not a size.
    #[error("{origin}: `{text}` is not a memory size (bytes, or a number with K, M, G or T)")]
    BadSize {
        /// The flag or variable the string came from.
        origin: String,
        /// The string.
        text: String,
    },
}

/// Formats bytes with a binary unit (`1.5 GiB`).
pub fn human_bytes(bytes: impl Into<u128>) -> String {
    let b = bytes.into();
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Parses a size: bytes, or a number with a suffix `K`, `M`, `G`, `T` (powers of 1024, optionally
/// followed by `iB` or `B`).
///
/// # Errors
/// [`BudgetError::BadSize`] naming `origin` for anything else, including zero.
pub fn parse_size(origin: &str, text: &str) -> Result<u64, BudgetError> {
    let bad = || BudgetError::BadSize {
        origin: origin.to_string(),
        text: text.to_string(),
    };
    let t = text.trim();
    let upper = t.to_ascii_uppercase();
    let stripped = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (number, shift) = match stripped.chars().last() {
        Some('K') => (&stripped[..stripped.len() - 1], 10),
        Some('M') => (&stripped[..stripped.len() - 1], 20),
        Some('G') => (&stripped[..stripped.len() - 1], 30),
        Some('T') => (&stripped[..stripped.len() - 1], 40),
        _ => (stripped, 0),
    };
    let v: f64 = number.trim().parse().map_err(|_| bad())?;
    let bytes = v * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Sets the budget for the rest of the process (the binary's `--memory-budget`). The first call
/// wins; later calls, and any call after the budget was first read, are ignored and return `false`.
pub fn set_memory_budget(bytes: u64) -> bool {
    BUDGET
        .set(Budget {
            bytes,
            source: BudgetSource::Flag,
        })
        .is_ok()
}

/// Half of the machine's physical memory, from `/proc/meminfo` (`None` where unreadable).
fn machine_half() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024) / 2)
}

/// The budget of this process (see the module documentation for where it comes from). An
/// unparsable `HYPERLENS_MEMORY_BUDGET` is reported by [`check_env`]; here it falls back to the
/// machine's memory.
pub fn memory_budget() -> Budget {
    *BUDGET.get_or_init(|| {
        if let Some(Ok(bytes)) = std::env::var(BUDGET_ENV)
            .ok()
            .map(|t| parse_size(BUDGET_ENV, &t))
        {
            return Budget {
                bytes,
                source: BudgetSource::Env,
            };
        }
        match machine_half() {
            Some(bytes) if bytes > 0 => Budget {
                bytes,
                source: BudgetSource::Machine,
            },
            _ => Budget {
                bytes: FALLBACK_BYTES,
                source: BudgetSource::Fallback,
            },
        }
    })
}

/// Checks that `HYPERLENS_MEMORY_BUDGET`, if set, is a size.
///
/// # Errors
/// [`BudgetError::BadSize`] naming the variable.
pub fn check_env() -> Result<(), BudgetError> {
    match std::env::var(BUDGET_ENV) {
        Ok(t) => parse_size(BUDGET_ENV, &t).map(|_| ()),
        Err(_) => Ok(()),
    }
}

/// Checks that an allocation of `bytes` (as computed by the caller with saturating arithmetic) fits
/// the budget.
///
/// # Errors
/// [`BudgetError::TooLarge`] naming `what` and both sizes.
pub fn check_alloc(what: impl Into<String>, bytes: u128) -> Result<(), BudgetError> {
    let budget = memory_budget();
    if bytes <= budget.bytes as u128 {
        return Ok(());
    }
    let source_text = match budget.source {
        BudgetSource::Flag => "from --memory-budget".to_string(),
        BudgetSource::Env => format!("from {BUDGET_ENV}"),
        BudgetSource::Machine => "half of this machine's memory".to_string(),
        BudgetSource::Fallback => "the default where the machine's memory is unknown".to_string(),
    };
    Err(BudgetError::TooLarge {
        what: what.into(),
        bytes,
        budget: budget.bytes,
        source_text,
    })
}

/// The bytes of `count` elements of `elem_bytes` each, times the product of `dims`, saturating at
/// `u128::MAX` (so that a hostile size cannot wrap around into a small one).
///
/// # Units
/// Bytes.
pub fn bytes_of(elem_bytes: usize, dims: &[usize]) -> u128 {
    dims.iter()
        .fold(elem_bytes as u128, |acc, &d| acc.saturating_mul(d as u128))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("x", "1024").unwrap(), 1024);
        assert_eq!(parse_size("x", "2K").unwrap(), 2048);
        assert_eq!(parse_size("x", "512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("x", "8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("x", "1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("x", "1T").unwrap(), 1 << 40);
        for bad in ["", "0", "-1G", "lots", "1Q", "nan"] {
            let e = parse_size("--memory-budget", bad).unwrap_err();
            assert!(e.to_string().starts_with("--memory-budget: "), "{e}");
        }
    }

    #[test]
    fn bytes_saturate_instead_of_wrapping() {
        assert_eq!(bytes_of(4, &[2, 3]), 24);
        assert_eq!(bytes_of(4, &[]), 4);
        assert_eq!(
            bytes_of(8, &[usize::MAX, usize::MAX, usize::MAX]),
            u128::MAX
        );
    }

    #[test]
    fn refusals_name_the_request_and_both_sizes() {
        let e = check_alloc("--n 10^12", u128::MAX).unwrap_err();
        let s = e.to_string();
        assert!(s.starts_with("--n 10^12 would need "), "{s}");
        assert!(s.contains("memory budget"), "{s}");
        check_alloc("one byte", 1).unwrap();
        assert_eq!(human_bytes(1536u64), "1.5 KiB");
        assert_eq!(human_bytes(3u64), "3 B");
    }
}
