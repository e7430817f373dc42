//! hyperlens-io: the one place hyperlens writes files (and reads its own small state files).
//!
//! - [`write_atomic`], [`write_atomic_with`] and [`AtomicFile`]: a file appears complete or not at
//!   all (temporary file in the same directory, `fsync`, rename, `fsync` of the directory);
//!   [`sync_dir`] for writers that rename directories; [`sweep_stale`] and [`pid_alive`]: the
//!   temporary names carry the writer's pid, so the leftovers of killed writers can be told from a
//!   live one's and removed.
//! - [`write_npz`]: `.npz` archives (numpy's uncompressed layout), atomically.
//! - [`write_json`] ([`write_json_sorted`]: every object's keys in alphabetical order) and the
//!   provenance sidecars ([`write_sidecar`], [`sidecar_path`]: `codes.npz` -> `codes.json`),
//!   with [`read_sidecar`] also finding the older `<file>.npz.json` name.
//! - [`inspect_npz`]: checks an `.npz` archive's headers against the bytes present and the memory
//!   [`budget`] before anything is read ([`inspect_npz_arrays`]: only the arrays a reader reads).
//! - [`keys`]: the names of the arrays that writers and readers share.
//! - [`sidecars`]: the sidecars of the outputs that no crate of their own writes (`cache`,
//!   `attention`) and the `source` of every output computed over problems, as serde structs.
//! - [`read_regular`] and [`is_special`]: state files read only when they are regular files (a FIFO
//!   left in their place would block a reader for ever); [`real_dir_or_absent`] and
//!   [`regular_file_or_absent`]: the directories and logs written inside a sweep or group are
//!   never links.
//!
//! Depends on neither candle nor any other hyperlens crate, so that every crate can use it.

mod atomic;
pub mod budget;
mod error;
mod inspect;
mod json;
pub mod keys;
mod npz;
mod read;
pub mod sidecars;

pub use atomic::{pid_alive, sweep_stale, sync_dir, write_atomic, write_atomic_with, AtomicFile};
pub use error::{IoError, Result};
pub use inspect::{inspect_npz, inspect_npz_arrays, NpyMember};
pub use json::{
    json_bytes, json_bytes_sorted, legacy_sidecar_path, read_sidecar, sidecar_path, write_json,
    write_json_sorted, write_sidecar,
};
pub use npz::{write_npz, NpzArchive};
pub use read::{
    is_special, read_regular, read_regular_string, real_dir_or_absent, regular_file_or_absent,
};
