//! Tuning results on disk: one readable JSON file per kernel (`<dir>/<kernel>.json`), with
//! a schema version. Every candidate's outcome is kept, keyed by the kernel's IR hash
//! (for that configuration), the configuration, the device name and compute capability,
//! the driver version and the tuning key, so editing the candidate list re-tunes only the
//! new candidates and editing the kernel re-tunes everything.
//!
//! Writes re-read the file, merge, and rename a temporary file over it: two processes
//! tuning at once both succeed (the later rename keeps the entries it merged). A file that
//! does not parse, or has another schema, is ignored with a warning and replaced on the
//! next write.
//!
//! The directory is `RUTILE_TUNE_DIR`, else `<user cache dir>/rutile/tune`;
//! `RUTILE_TUNE_CACHE=off` keeps results in memory only.

use crate::config::Config;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const SCHEMA: u32 = 1;

/// One candidate's outcome for one kernel, device and key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub kernel: String,
    pub ir_hash: String,
    pub config: Config,
    pub device: String,
    pub cc: (u32, u32),
    pub driver: i32,
    pub key: String,
    /// Median time in milliseconds (absent when the candidate failed, or was not timed).
    pub ms: Option<f64>,
    /// Why the candidate cannot run (compile error, shared memory, launch failure, wrong result).
    pub failure: Option<String>,
}

impl Entry {
    /// The same candidate in the same situation (what an entry is looked up by).
    pub fn same_slot(&self, o: &Entry) -> bool {
        self.kernel == o.kernel
            && self.ir_hash == o.ir_hash
            && self.config == o.config
            && self.device == o.device
            && self.cc == o.cc
            && self.driver == o.driver
            && self.key == o.key
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TuneFile {
    pub schema: u32,
    pub entries: Vec<Entry>,
}

/// Where tuning results live.
#[derive(Clone, Debug)]
pub struct Store {
    dir: Option<PathBuf>,
}

impl Store {
    pub fn new(dir: Option<PathBuf>) -> Store {
        Store { dir }
    }

    pub fn from_env() -> Store {
        if std::env::var("RUTILE_TUNE_CACHE").is_ok_and(|v| v == "off" || v == "0") {
            return Store { dir: None };
        }
        let dir = std::env::var_os("RUTILE_TUNE_DIR").map(PathBuf::from).or_else(|| dirs::cache_dir().map(|d| d.join("rutile").join("tune")));
        Store { dir }
    }

    pub fn path(&self, kernel: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{kernel}.json")))
    }

    /// The entries on disk for `kernel` (none when absent, unreadable or of another schema).
    pub fn load(&self, kernel: &str) -> Vec<Entry> {
        let Some(p) = self.path(kernel) else { return vec![] };
        read(&p)
    }

    /// Merge `new` into the file (replacing entries for the same slots), atomically.
    pub fn save(&self, kernel: &str, new: &[Entry]) {
        let Some(p) = self.path(kernel) else { return };
        if new.is_empty() {
            return;
        }
        let mut entries = read(&p);
        entries.retain(|e| !new.iter().any(|n| n.same_slot(e)));
        entries.extend(new.iter().cloned());
        let file = TuneFile { schema: SCHEMA, entries };
        let res = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(p.parent().expect("a file in a directory"))?;
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
            let tmp = p.with_extension(format!("json.tmp.{}.{:?}.{nanos}", std::process::id(), std::thread::current().id()));
            std::fs::write(&tmp, serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?)?;
            std::fs::rename(&tmp, &p)
        })();
        if let Err(e) = res {
            tracing::warn!("cannot write tuning results to {}: {e}", p.display());
        }
    }
}

fn read(p: &Path) -> Vec<Entry> {
    let Ok(bytes) = std::fs::read(p) else { return vec![] };
    match serde_json::from_slice::<TuneFile>(&bytes) {
        Ok(f) if f.schema == SCHEMA => f.entries,
        Ok(f) => {
            tracing::warn!("ignoring tuning results in {}: schema {} (this version reads {SCHEMA})", p.display(), f.schema);
            eprintln!("rutile: ignoring tuning results in {}: schema {} (this version reads {SCHEMA})", p.display(), f.schema);
            vec![]
        }
        Err(e) => {
            tracing::warn!("ignoring corrupt tuning results in {}: {e}", p.display());
            eprintln!("rutile: ignoring corrupt tuning results in {}: {e}", p.display());
            vec![]
        }
    }
}
