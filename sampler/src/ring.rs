//! The ring file of one GPU: a header and `capacity` fixed-size readings, overwritten oldest
//! first, so it never grows. One writer (kace-sampler) and any number of readers (epilogs).
//!
//! Layout (little-endian): header `KACESMP2`, capacity u32, 4 reserved bytes, readings written
//! so far u64, 8 reserved bytes; then `capacity` slots of 48 bytes: sequence number u64 (1-based,
//! 0 = never written), Unix time f64, SM % f32, memory-bandwidth % f32 (NaN = no value), memory
//! in use u64 bytes (`u64::MAX` = no value), the GPU's energy counter u64 mJ (`u64::MAX` = no
//! value), power f32 W (NaN = no value), 4 reserved bytes. Each slot is written with one
//! `pwrite`, and a reader keeps only slots whose sequence number fits their position, so a
//! reading is never mixed from two writes.
//!
//! Version 1 (`KACESMP1`, 32-byte slots without energy and power) is still read, so that an
//! epilog after an upgrade reads the ring an older sampler left; a writer replaces it.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"KACESMP2";
const MAGIC_V1: &[u8; 8] = b"KACESMP1";
const HEADER: u64 = 32;
const SLOT: u64 = 48;
const SLOT_V1: u64 = 32;
/// Most slots a ring may have (a year at 1 Hz is 31.5 M; this bounds a reader's memory).
pub const MAX_CAPACITY: u32 = 10_000_000;

/// One reading of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Reading {
    /// Unix seconds.
    pub time: f64,
    /// SM utilization, %, when NVML had a value.
    pub sm_pct: Option<f64>,
    /// Memory-bandwidth utilization, %.
    pub mem_pct: Option<f64>,
    /// Device memory in use, bytes.
    pub used_bytes: Option<u64>,
    /// The GPU's energy counter, mJ since the driver was loaded.
    pub energy_mj: Option<u64>,
    /// The GPU's power draw, W.
    pub power_w: Option<f64>,
}

/// Why a ring could not be used.
#[derive(Debug)]
#[non_exhaustive]
pub enum RingError {
    /// The file could not be opened, read or written.
    Io {
        /// The ring file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The file is not a ring, or its header does not fit its size.
    Corrupt {
        /// The ring file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            RingError::Corrupt { path, why } => {
                write!(f, "{} is not a kace-sampler ring: {why}", path.display())
            }
        }
    }
}

impl std::error::Error for RingError {}

/// The ring file of GPU `gpu` under `dir`.
pub fn ring_path(dir: &Path, gpu: u32) -> PathBuf {
    dir.join(format!("gpu{gpu}.ring"))
}

/// An open ring file.
#[derive(Debug)]
pub struct Ring {
    path: PathBuf,
    file: File,
    capacity: u32,
    written: u64,
    /// Bytes per slot: [`SLOT`], or [`SLOT_V1`] for a version-1 ring (read only).
    slot: u64,
}

impl Ring {
    /// Opens the ring for writing, creating it (mode 0644) with `capacity` slots, or keeping an
    /// existing ring of the same capacity (a restarted sampler continues it). A ring of another
    /// capacity is started anew: its old readings would not fit the new positions.
    pub fn create(path: &Path, capacity: u32) -> Result<Ring, RingError> {
        let io = |source| RingError::Io { path: path.to_path_buf(), source };
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(RingError::Corrupt {
                path: path.to_path_buf(),
                why: format!("capacity {capacity} is not in 1..={MAX_CAPACITY}"),
            });
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(io)?;
        if let Ok(existing) = Ring::from_file(path, file.try_clone().map_err(io)?) {
            if existing.capacity == capacity && existing.slot == SLOT {
                return Ok(existing);
            }
        }
        file.set_len(0).map_err(io)?;
        file.set_len(HEADER + SLOT * u64::from(capacity)).map_err(io)?;
        let mut header = [0u8; HEADER as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&capacity.to_le_bytes());
        file.write_all_at(&header, 0).map_err(io)?;
        Ok(Ring { path: path.to_path_buf(), file, capacity, written: 0, slot: SLOT })
    }

    /// Opens an existing ring for reading.
    pub fn open(path: &Path) -> Result<Ring, RingError> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(|source| RingError::Io { path: path.to_path_buf(), source })?;
        Ring::from_file(path, file)
    }

    fn from_file(path: &Path, file: File) -> Result<Ring, RingError> {
        let corrupt = |why: String| RingError::Corrupt { path: path.to_path_buf(), why };
        let meta =
            file.metadata().map_err(|source| RingError::Io { path: path.to_path_buf(), source })?;
        if !meta.is_file() {
            return Err(corrupt("not a regular file".into()));
        }
        let mut header = [0u8; HEADER as usize];
        file.read_exact_at(&mut header, 0).map_err(|_| corrupt("too short".into()))?;
        let slot = match &header[..8] {
            m if m == MAGIC => SLOT,
            m if m == MAGIC_V1 => SLOT_V1,
            _ => return Err(corrupt("wrong magic".into())),
        };
        let capacity = u32::from_le_bytes(header[8..12].try_into().unwrap_or_default());
        let written = u64::from_le_bytes(header[16..24].try_into().unwrap_or_default());
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(corrupt(format!("capacity {capacity}")));
        }
        if meta.len() != HEADER + slot * u64::from(capacity) {
            return Err(corrupt(format!("size {} for capacity {capacity}", meta.len())));
        }
        Ok(Ring { path: path.to_path_buf(), file, capacity, written, slot })
    }

    /// Slots in this ring.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Appends one reading, overwriting the oldest when full.
    pub fn push(&mut self, r: &Reading) -> Result<(), RingError> {
        if self.slot != SLOT {
            return Err(RingError::Corrupt {
                path: self.path.clone(),
                why: "a version-1 ring is read, never written".into(),
            });
        }
        let seq = self.written + 1;
        let slot = (seq - 1) % u64::from(self.capacity);
        let mut buf = [0u8; SLOT as usize];
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        buf[8..16].copy_from_slice(&r.time.to_le_bytes());
        buf[16..20].copy_from_slice(&(r.sm_pct.map_or(f32::NAN, |v| v as f32)).to_le_bytes());
        buf[20..24].copy_from_slice(&(r.mem_pct.map_or(f32::NAN, |v| v as f32)).to_le_bytes());
        buf[24..32].copy_from_slice(&r.used_bytes.unwrap_or(u64::MAX).to_le_bytes());
        buf[32..40].copy_from_slice(&r.energy_mj.unwrap_or(u64::MAX).to_le_bytes());
        buf[40..44].copy_from_slice(&(r.power_w.map_or(f32::NAN, |v| v as f32)).to_le_bytes());
        let io = |source| RingError::Io { path: self.path.clone(), source };
        self.file.write_all_at(&buf, HEADER + slot * SLOT).map_err(io)?;
        self.file.write_all_at(&seq.to_le_bytes(), 16).map_err(io)?;
        self.written = seq;
        Ok(())
    }

    /// Every valid reading with `from <= time <= to`, oldest first.
    pub fn readings(&self, from: f64, to: f64) -> Result<Vec<Reading>, RingError> {
        let mut bytes = vec![0u8; (self.slot * u64::from(self.capacity)) as usize];
        self.file
            .read_exact_at(&mut bytes, HEADER)
            .map_err(|source| RingError::Io { path: self.path.clone(), source })?;
        let cap = u64::from(self.capacity);
        let mut out: Vec<(u64, Reading)> = bytes
            .chunks_exact(self.slot as usize)
            .enumerate()
            .filter_map(|(i, s)| {
                let seq = u64::from_le_bytes(s[..8].try_into().ok()?);
                if seq == 0 || (seq - 1) % cap != i as u64 {
                    return None;
                }
                let time = f64::from_le_bytes(s[8..16].try_into().ok()?);
                let pct = |b: &[u8]| {
                    let v = f32::from_le_bytes(b.try_into().ok()?);
                    (v.is_finite() && (0.0..=10_000.0).contains(&v)).then_some(f64::from(v))
                };
                let used = u64::from_le_bytes(s[24..32].try_into().ok()?);
                let (energy_mj, power_w) = if s.len() >= SLOT as usize {
                    let mj = u64::from_le_bytes(s[32..40].try_into().ok()?);
                    let w = f32::from_le_bytes(s[40..44].try_into().ok()?);
                    (
                        (mj != u64::MAX).then_some(mj),
                        (w.is_finite() && (0.0..=100_000.0).contains(&w)).then_some(f64::from(w)),
                    )
                } else {
                    (None, None)
                };
                let r = Reading {
                    time,
                    sm_pct: pct(&s[16..20]),
                    mem_pct: pct(&s[20..24]),
                    used_bytes: (used != u64::MAX).then_some(used),
                    energy_mj,
                    power_w,
                };
                (time.is_finite() && time >= from && time <= to).then_some((seq, r))
            })
            .collect();
        out.sort_by_key(|(seq, _)| *seq);
        Ok(out.into_iter().map(|(_, r)| r).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> (kace_test_support::TempDir, PathBuf) {
        let d = kace_test_support::TempDir::new(&format!("ring-{name}"));
        let p = d.join("gpu0.ring");
        (d, p)
    }

    fn reading(t: f64) -> Reading {
        Reading {
            time: t,
            sm_pct: Some(t),
            mem_pct: None,
            used_bytes: Some(t as u64),
            energy_mj: Some(1_000 * t as u64),
            power_w: Some(100.0 + t),
        }
    }

    #[test]
    fn keeps_the_newest_capacity_readings_in_order() {
        let (_d, p) = tmp("wrap");
        let mut ring = Ring::create(&p, 4).unwrap();
        for t in 1..=10 {
            ring.push(&reading(t as f64)).unwrap();
        }
        let times: Vec<f64> =
            Ring::open(&p).unwrap().readings(0.0, 100.0).unwrap().iter().map(|r| r.time).collect();
        assert_eq!(times, vec![7.0, 8.0, 9.0, 10.0]);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), HEADER + 4 * SLOT);
        let window = Ring::open(&p).unwrap().readings(8.0, 9.5).unwrap();
        assert_eq!(window, vec![reading(8.0), reading(9.0)]);
        assert_eq!(window[0].mem_pct, None);
    }

    #[test]
    fn a_restarted_writer_continues_and_a_new_capacity_starts_anew() {
        let (_d, p) = tmp("restart");
        let mut ring = Ring::create(&p, 8).unwrap();
        ring.push(&reading(1.0)).unwrap();
        drop(ring);
        let mut ring = Ring::create(&p, 8).unwrap();
        ring.push(&reading(2.0)).unwrap();
        assert_eq!(Ring::open(&p).unwrap().readings(0.0, 9.0).unwrap().len(), 2);
        let ring = Ring::create(&p, 16).unwrap();
        assert_eq!(ring.capacity(), 16);
        assert!(Ring::open(&p).unwrap().readings(0.0, 9.0).unwrap().is_empty());
    }

    #[test]
    fn a_version_1_ring_is_read_without_energy_and_replaced_by_the_writer() {
        let (_d, p) = tmp("v1");
        // What a kace-sampler before energy left: KACESMP1, 32-byte slots.
        let mut bytes = vec![0u8; (HEADER + 2 * SLOT_V1) as usize];
        bytes[..8].copy_from_slice(MAGIC_V1);
        bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
        bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
        let s = HEADER as usize;
        bytes[s..s + 8].copy_from_slice(&1u64.to_le_bytes());
        bytes[s + 8..s + 16].copy_from_slice(&5.0f64.to_le_bytes());
        bytes[s + 16..s + 20].copy_from_slice(&40.0f32.to_le_bytes());
        bytes[s + 20..s + 24].copy_from_slice(&f32::NAN.to_le_bytes());
        bytes[s + 24..s + 32].copy_from_slice(&(7u64 << 20).to_le_bytes());
        std::fs::write(&p, &bytes).unwrap();
        let got = Ring::open(&p).unwrap().readings(0.0, 9.0).unwrap();
        let want = Reading {
            time: 5.0,
            sm_pct: Some(40.0),
            used_bytes: Some(7 << 20),
            ..Reading::default()
        };
        assert_eq!(got, vec![want]);
        assert!(Ring::open(&p).unwrap().push(&reading(6.0)).is_err());
        let mut ring = Ring::create(&p, 2).unwrap();
        ring.push(&reading(6.0)).unwrap();
        assert_eq!(Ring::open(&p).unwrap().readings(0.0, 9.0).unwrap(), vec![reading(6.0)]);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), HEADER + 2 * SLOT);
    }

    #[test]
    fn garbage_is_refused_not_trusted() {
        let (_d, p) = tmp("garbage");
        std::fs::write(&p, b"not a ring at all, just text that a user might have put here")
            .unwrap();
        assert!(matches!(Ring::open(&p), Err(RingError::Corrupt { .. })));
        let mut ring = Ring::create(&p, 4).unwrap(); // the writer replaces it
        ring.push(&reading(5.0)).unwrap();
        // A slot whose sequence number does not fit its position is skipped.
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&99u64.to_le_bytes(), HEADER).unwrap();
        assert!(Ring::open(&p).unwrap().readings(0.0, 9.0).unwrap().is_empty());
    }
}
