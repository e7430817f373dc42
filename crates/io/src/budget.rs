//! The memory budget: the most memory one allocation that a file or a flag asks for may take.
//!
//! Sizes read from files (an `.npy` header, a `config.json`) and sizes given as flags (`--n`,
//! `--d-model`, `--tokens`) are checked against the budget *before* anything is allocated, so that a
//! hostile or mistyped size gives a clear error instead of an abort ("memory allocation failed") or
//! a machine that swaps.
//!
//! The budget is, in order of precedence: the value set with [`set_memory_budget`] (the binary's
//! `--memory-budget` flag), the environment variable `HYPERLENS_MEMORY_BUDGET`, or half of the
//! memory this process may actually use: the least of the machine's physical memory (`MemTotal` of
//! `/proc/meminfo`), the address space left under the process's address-space limit
//! (`RLIMIT_AS`, as `ulimit -v` or a Slurm job sets it: the soft limit of `/proc/self/limits` less
//! `VmSize` of `/proc/self/status`, read when the budget is first asked for) and the memory limit
//! of the process's cgroup and its ancestors (cgroup v2 `memory.max`, v1
//! `memory.limit_in_bytes`; a container's or a Slurm job's limit). Where none of these can be read
//! the budget is 8 GiB.
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
    /// Half of the address space left under the process's `RLIMIT_AS`.
    AddressSpace,
    /// Half of the memory limit of the process's cgroup.
    Cgroup,
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

/// The value of a `Key:  N kB` line of a `/proc` text (`/proc/meminfo`, `/proc/self/status`), in
/// bytes.
fn kib_line(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    kib_line(meminfo, "MemTotal:")
}

/// The soft address-space limit (`Max address space`) of a `/proc/self/limits` text, in bytes;
/// `None` when unlimited or unreadable.
fn address_space_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    line["Max address space".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `VmSize` (the address space mapped now) of a `/proc/self/status` text, in bytes.
fn vm_size(status: &str) -> Option<u64> {
    kib_line(status, "VmSize:")
}

/// A cgroup limit file's value: bytes, or `None` for `max` (v2) or v1's "no limit" (a value of
/// 2^62 or more, the page-rounded `LONG_MAX` that v1 writes).
fn limit_value(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// The memory limit of the cgroup that `proc_cgroup` (the text of `/proc/self/cgroup`) names under
/// the cgroup mount `root` (`/sys/fs/cgroup`): the least `memory.max` (v2) or
/// `memory.limit_in_bytes` (v1, under `root/memory`) of the cgroup and its ancestors up to the
/// mount, in bytes; `None` where no limit is set or none can be read.
pub fn cgroup_limit(root: &std::path::Path, proc_cgroup: &str) -> Option<u64> {
    let mut least: Option<u64> = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        let (base, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut dir = base.join(path.trim_start_matches('/'));
        loop {
            if let Some(v) = std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|t| limit_value(&t))
            {
                least = Some(least.map_or(v, |l| l.min(v)));
            }
            if dir == base || !dir.pop() || !dir.starts_with(&base) {
                break;
            }
        }
    }
    least
}

/// The budget where no flag or variable sets one: half of the least of the machine's memory, the
/// address space left under `RLIMIT_AS` and the cgroup's memory limit.
fn machine_budget() -> Budget {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let machine = read("/proc/meminfo").and_then(|t| mem_total(&t));
    let address = read("/proc/self/limits")
        .and_then(|t| address_space_limit(&t))
        .map(|limit| {
            let used = read("/proc/self/status")
                .and_then(|t| vm_size(&t))
                .unwrap_or(0);
            limit.saturating_sub(used)
        });
    let cgroup = read("/proc/self/cgroup")
        .and_then(|t| cgroup_limit(std::path::Path::new("/sys/fs/cgroup"), &t));
    least_budget(machine, address, cgroup)
}

/// Half of the least of the three limits (see [`machine_budget`]), and where it came from; the
/// 8 GiB fallback when none is known.
fn least_budget(machine: Option<u64>, address: Option<u64>, cgroup: Option<u64>) -> Budget {
    [
        (machine, BudgetSource::Machine),
        (address, BudgetSource::AddressSpace),
        (cgroup, BudgetSource::Cgroup),
    ]
    .into_iter()
    .filter_map(|(v, source)| v.map(|v| (v, source)))
    .min_by_key(|(v, _)| *v)
    .map_or(
        Budget {
            bytes: FALLBACK_BYTES,
            source: BudgetSource::Fallback,
        },
        |(v, source)| Budget {
            bytes: (v / 2).max(1),
            source,
        },
    )
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
        machine_budget()
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
        BudgetSource::AddressSpace => {
            "half of the address space left under this process's limit (ulimit -v)".to_string()
        }
        BudgetSource::Cgroup => "half of the memory limit of this process's cgroup".to_string(),
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
    fn the_proc_files_are_read_as_the_kernel_writes_them() {
        assert_eq!(
            mem_total("MemTotal:       24583916 kB\nMemFree: 1 kB\n"),
            Some(24583916 * 1024)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max stack size            8388608              unlimited            bytes     \n\
                      Max address space         4294967296           unlimited            bytes     \n";
        assert_eq!(address_space_limit(limits), Some(4 << 30));
        let unlimited = limits.replace("4294967296", "unlimited ");
        assert_eq!(address_space_limit(&unlimited), None);
        assert_eq!(
            vm_size("Name:\tpython3\nVmPeak:\t  900 kB\nVmSize:\t  812 kB\n"),
            Some(812 * 1024)
        );
    }

    #[test]
    fn the_least_limit_wins_and_is_halved() {
        let b = least_budget(Some(24 << 30), Some(3 << 30), Some(16 << 30));
        assert_eq!((b.bytes, b.source), (3 << 29, BudgetSource::AddressSpace));
        let b = least_budget(Some(24 << 30), None, Some(2 << 30));
        assert_eq!((b.bytes, b.source), (1 << 30, BudgetSource::Cgroup));
        let b = least_budget(Some(24 << 30), None, None);
        assert_eq!((b.bytes, b.source), (12 << 30, BudgetSource::Machine));
        let b = least_budget(None, None, None);
        assert_eq!(
            (b.bytes, b.source),
            (FALLBACK_BYTES, BudgetSource::Fallback)
        );
    }

    /// A fake cgroup tree: the least limit of the cgroup and its ancestors, v2 and v1, with
    /// `max` and v1's "unlimited" value ignored.
    #[test]
    fn cgroup_limits_are_read_from_the_cgroup_and_its_ancestors() {
        let root = std::env::temp_dir().join(format!("hl-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let job = root.join("system.slice/slurmstepd.scope/job_7");
        std::fs::create_dir_all(&job).unwrap();
        std::fs::write(root.join("system.slice/memory.max"), "max\n").unwrap();
        std::fs::write(
            root.join("system.slice/slurmstepd.scope/memory.max"),
            "8589934592\n",
        )
        .unwrap();
        std::fs::write(job.join("memory.max"), "2147483648\n").unwrap();
        let v2 = "0::/system.slice/slurmstepd.scope/job_7\n";
        assert_eq!(cgroup_limit(&root, v2), Some(2 << 30));
        std::fs::write(job.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit(&root, v2), Some(8 << 30));
        assert_eq!(cgroup_limit(&root, "0::/\n"), None);
        // cgroup v1: the memory controller's hierarchy under root/memory.
        let v1 = root.join("memory/docker/abc");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "1073741824\n").unwrap();
        std::fs::write(
            root.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        let text = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n";
        assert_eq!(cgroup_limit(&root, text), Some(1 << 30));
        assert_eq!(cgroup_limit(&root, "4:memory:/\n"), None);
        assert_eq!(cgroup_limit(&root.join("absent"), v2), None);
        std::fs::remove_dir_all(&root).unwrap();
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
