//! The saved state of a run directory (`train_state.json`, `optimizer.safetensors`), the dropout
//! random stream, and the JSON writer of the run's files.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::optim::AdamW;
use crate::settings::TrainSettings;

/// File name of the optimiser state (moments `m.{name}`, `v.{name}` and the update count `step`).
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// File names of the run state and of the final training record, defined beside their reader
/// ([`hyperlens_model::RunRecord`]).
pub use hyperlens_model::task::{RECORD_FILE, STATE_FILE};

/// The version of hyperlens that wrote a file.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Writes a value as pretty JSON with a final newline, atomically (`hyperlens_io::write_json`).
///
/// # Errors
/// [`TrainError::File`] naming the path.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    Ok(hyperlens_io::write_json(path, value)?)
}

/// 64-bit FNV-1a of a byte string (to tie the weights file to the state that was saved with it).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The FNV-1a hash of a file, as 16 hex digits.
///
/// # Errors
/// [`TrainError::Io`] naming the file.
pub fn file_hash(path: &Path) -> Result<String> {
    let bytes = hyperlens_io::read_regular(path).map_err(|source| TrainError::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(format!("{:016x}", fnv1a64(&bytes)))
}

/// The random stream of the attention-dropout masks of update `step`: a ChaCha8 stream keyed by the
/// run seed (with a domain tag, so it never equals the initialisation stream) and numbered by the
/// step. The masks therefore depend only on `(seed, step)`, which makes resumed runs exact.
pub fn dropout_rng(seed: u64, step: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let tag = b"hyperlens/train/dropout\0";
    key[8..].copy_from_slice(tag);
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(step);
    rng
}

/// One session of a run (a fresh start or a resume).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// First update of the session.
    pub start_step: u64,
    /// Updates done when the session last saved.
    pub end_step: u64,
    /// The device it ran on.
    pub device: String,
    /// The CPU threads candle used, as [`crate::run`] records them (`"1"`, or
    /// `"matmul N, elementwise M"` when they differ); empty in runs before 2026-11-22.
    pub threads: String,
    /// Seconds this session spent in training steps, as of its last save (`None` in runs
    /// before 2026-11-23, which did not record it).
    #[serde(default)]
    pub train_time_s: Option<f64>,
    /// Wall-clock seconds of this session, as of its last save (evaluations and checkpoints
    /// included; `None` in runs before 2026-11-23).
    #[serde(default)]
    pub wall_time_s: Option<f64>,
    /// The number of runs trained in one batched graph in this session
    /// ([`crate::run::train_group`]), when more than one; `None` for a run trained alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batched: Option<usize>,
}

impl Session {
    /// Training updates per second of this session (`(end_step - start_step) / train_time_s`);
    /// `None` when the session did not record its time or did no steps.
    pub fn steps_per_s(&self) -> Option<f64> {
        let steps = self.end_step.saturating_sub(self.start_step);
        match self.train_time_s {
            Some(t) if t > 0.0 && steps > 0 => Some(steps as f64 / t),
            _ => None,
        }
    }
}

/// `train_state.json`: everything needed to continue a run exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// hyperlens version that wrote it.
    pub version: String,
    /// The run's settings.
    pub settings: TrainSettings,
    /// Updates done (the next update is number `step`, 0-based).
    pub step: u64,
    /// Position of the training data stream: batches drawn so far (batch `i` depends only on
    /// `(seed, i)`; equal to `step`).
    pub data_position: u64,
    /// How the dropout masks are drawn: `dropout_rng(seed, step)`, so only the seed is state.
    pub dropout_stream: String,
    /// Seconds spent in training steps so far (all sessions).
    pub train_time_s: f64,
    /// Wall-clock seconds so far (all sessions, including evaluation and checkpoints).
    pub wall_time_s: f64,
    /// FNV-1a hash of `model.safetensors` as saved with this state.
    pub weights_hash: String,
    /// Sessions so far.
    pub sessions: Vec<Session>,
}

impl TrainState {
    /// Reads `train_state.json` of a run directory.
    ///
    /// # Errors
    /// [`TrainError::Resume`] if the file is missing; [`TrainError::Json`] if malformed.
    pub fn read(dir: &Path) -> Result<TrainState> {
        let path = dir.join(STATE_FILE);
        let text = hyperlens_io::read_regular_string(&path).map_err(|e| {
            TrainError::Resume(format!(
                "{}: {e} (is this a run directory written by `hyperlens train`?)",
                path.display()
            ))
        })?;
        serde_json::from_str(&text).map_err(|source| TrainError::Json {
            path: path.display().to_string(),
            source,
        })
    }
}

/// `failed.json` ([`crate::FAILED_FILE`]): why a run of a group stopped alone (its loss stopped
/// being finite) and where it can resume. `train` writes it; `train --resume` removes it; the
/// sweep's status reads it. The fields are in the order of the file (alphabetical, as earlier
/// versions wrote it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedRecord {
    /// The reason, as the error reads ([`TrainError::Diverged`]).
    pub error: String,
    /// The step of the run's last committed checkpoint, from which it resumes.
    pub last_checkpoint_step: u64,
    /// The update at which the run was found diverged.
    pub step: u64,
}

impl FailedRecord {
    /// Writes the record into the run directory `dir` (pretty JSON, atomically).
    ///
    /// # Errors
    /// [`TrainError::File`] naming the path.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_json(&dir.join(crate::FAILED_FILE), self)
    }

    /// Reads the record of the run directory `dir`; `None` when it has none.
    ///
    /// # Errors
    /// [`TrainError::Io`] when the file exists but cannot be read (or is not a regular file);
    /// [`TrainError::Json`] when it is malformed.
    pub fn read(dir: &Path) -> Result<Option<FailedRecord>> {
        let path = dir.join(crate::FAILED_FILE);
        if std::fs::symlink_metadata(&path).is_err() {
            return Ok(None);
        }
        let bytes = hyperlens_io::read_regular(&path).map_err(|source| TrainError::Io {
            path: path.display().to_string(),
            source,
        })?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| TrainError::Json {
                path: path.display().to_string(),
                source,
            })
    }
}

/// Saves model `member`'s optimiser state atomically (moments plus the update count as an i64
/// tensor `step`).
///
/// # Errors
/// Candle or I/O errors naming the file.
pub(crate) fn save_optimizer(dir: &Path, opt: &AdamW, member: usize) -> Result<()> {
    let (mut map, step) = opt.state_of(member)?;
    let dev = Device::Cpu;
    for t in map.values_mut() {
        *t = t.to_device(&dev)?;
    }
    map.insert("step".into(), Tensor::new(&[step as i64], &dev)?);
    // candle writes to a path of its own choosing: the temporary file of an atomic write.
    let file = hyperlens_io::AtomicFile::create(&dir.join(OPTIMIZER_FILE))?;
    candle_core::safetensors::save(&map, file.temp_path())?;
    Ok(file.commit()?)
}

/// Reads the optimiser state saved by [`save_optimizer`]: the moments and the update count.
///
/// # Errors
/// [`TrainError::Resume`] naming the file if it is missing or malformed.
pub(crate) fn read_optimizer(
    dir: &Path,
    device: &Device,
) -> Result<(HashMap<String, Tensor>, u64)> {
    let path = dir.join(OPTIMIZER_FILE);
    let mut map: HashMap<String, Tensor> = candle_core::safetensors::load(&path, device)
        .map_err(|e| TrainError::Resume(format!("{}: {e}", path.display())))?;
    let step = map
        .remove("step")
        .ok_or_else(|| TrainError::Resume(format!("{}: no `step` tensor", path.display())))?
        .to_device(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<i64>()
        .map_err(|e| TrainError::Resume(format!("{}: tensor `step`: {e}", path.display())))?;
    let step = match step.as_slice() {
        [s] if *s >= 0 => *s as u64,
        _ => {
            return Err(TrainError::Resume(format!(
                "{}: bad `step` tensor {step:?}",
                path.display()
            )))
        }
    };
    Ok((map, step))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn dropout_stream_depends_only_on_seed_and_step() {
        let draw = |seed, step| -> Vec<u32> {
            let mut r = dropout_rng(seed, step);
            (0..8).map(|_| r.gen()).collect()
        };
        assert_eq!(draw(3, 17), draw(3, 17));
        assert_ne!(draw(3, 17), draw(3, 18));
        assert_ne!(draw(3, 17), draw(4, 17));
        // Not the initialisation stream of the model crate (ChaCha8 seeded from the plain seed).
        let mut init = ChaCha8Rng::seed_from_u64(3);
        let v: Vec<u32> = (0..8).map(|_| init.gen()).collect();
        assert_ne!(draw(3, 0), v);
    }

    #[test]
    fn the_failed_record_round_trips_in_the_files_layout() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(FailedRecord::read(dir.path()).unwrap(), None);
        let r = FailedRecord {
            error: "diverged at step 7".into(),
            last_checkpoint_step: 5,
            step: 7,
        };
        r.write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(crate::FAILED_FILE)).unwrap();
        assert_eq!(
            text,
            "{\n  \"error\": \"diverged at step 7\",\n  \"last_checkpoint_step\": 5,\n  \"step\": 7\n}\n"
        );
        assert_eq!(FailedRecord::read(dir.path()).unwrap(), Some(r));
        std::fs::write(dir.path().join(crate::FAILED_FILE), "{\"error\": 3}").unwrap();
        let e = FailedRecord::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("failed.json"), "{e}");
    }

    #[test]
    fn fnv_reference_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
