//! Tuning results on disk: one readable JSON file per kernel (`<dir>/<kernel>.json`), with
//! a schema version. Every candidate's outcome is kept, keyed by the kernel's IR hash
//! (for that configuration), the configuration, the compiler's fingerprint
//! ([`COMPILER_FINGERPRINT`](dsl_runtime::compile::COMPILER_FINGERPRINT)), the device name
//! and compute capability, the driver version and the tuning key, so editing the candidate
//! list re-tunes only the new candidates, and editing the kernel or the compiler re-tunes
//! everything.
//!
//! A write holds a lock on `<dir>/<kernel>.lock` while it re-reads the file, merges, and
//! renames a temporary file over it, so processes (and threads) tuning different keys of
//! one kernel at once keep each other's results; readers need no lock, since the rename is
//! atomic. A lock that cannot be taken (a read-only directory, a file system without locks)
//! or is held for longer than [`LOCK_WAIT`] gives a warning, and the write goes ahead
//! without it. A file that does not parse, or has another schema, is ignored with a warning
//! and replaced on the next write. Warnings go through [`dsl_runtime::diag`]
//! ([`Warning::TuneStore`]).
//!
//! The directory is `RUTILE_TUNE_DIR`, else `<user cache dir>/rutile/tune`;
//! `RUTILE_TUNE_CACHE=off` keeps results in memory only.

use crate::config::Config;
use dsl_runtime::diag::{warn, Warning};
use serde::{Deserialize, Serialize};
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Version 2 added [`Entry::compiler`]; version 3 [`Config::programs_per_sm`] (a build
/// without it would read a candidate of 3 programs an SM as one of 1, and write it back
/// so).
pub const SCHEMA: u32 = 3;

/// How long a write waits for another process's write to finish before it goes ahead
/// without the lock (a write holds it for milliseconds; only a stopped process holds it
/// longer).
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

/// One candidate's outcome for one kernel, device and key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub kernel: String,
    pub ir_hash: String,
    /// The fingerprint of the compiler that built and timed the candidate.
    pub compiler: String,
    /// Timed in a debug build (`RUTILE_DEBUG=1`: checked launches, asserts kept), whose
    /// timings say nothing about release builds and the other way round.
    #[serde(default)]
    pub debug: bool,
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
            && self.compiler == o.compiler
            && self.debug == o.debug
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
    lock_wait: Duration,
}

impl Store {
    /// Results in `dir`, or in memory only (`None`).
    pub fn new(dir: Option<PathBuf>) -> Store {
        Store { dir, lock_wait: LOCK_WAIT }
    }

    pub fn from_env() -> Store {
        if std::env::var("RUTILE_TUNE_CACHE").is_ok_and(|v| v == "off" || v == "0") {
            return Store::new(None);
        }
        use dsl_runtime::cache::{env_dir, rutile_cache_dir};
        let dir = env_dir("RUTILE_TUNE_DIR").or_else(|| rutile_cache_dir().map(|d| d.join("tune")));
        if dir.is_none() {
            warn(Warning::TuneStore, "no directory for tuning results (no user cache directory; set RUTILE_TUNE_DIR): they are kept in memory only");
        }
        Store::new(dir)
    }

    pub fn path(&self, kernel: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{kernel}.json")))
    }

    /// The entries on disk for `kernel` (none when absent, unreadable or of another schema).
    pub fn load(&self, kernel: &str) -> Vec<Entry> {
        let Some(p) = self.path(kernel) else { return vec![] };
        read(&p)
    }

    /// Merge `new` into the file (replacing entries for the same slots), atomically, under
    /// the kernel's lock.
    pub fn save(&self, kernel: &str, new: &[Entry]) {
        let Some(p) = self.path(kernel) else { return };
        if new.is_empty() {
            return;
        }
        if let Err(e) = std::fs::create_dir_all(p.parent().expect("a file in a directory")) {
            warn(Warning::TuneStore, format!("cannot write tuning results to {}: {e}", p.display()));
            return;
        }
        let lock = p.with_extension("lock");
        let _held = match self.lock(&lock) {
            Ok(f) => Some(f),
            Err(e) => {
                warn(Warning::TuneStore, format!("writing tuning results to {} without a lock: cannot lock {}: {e}", p.display(), lock.display()));
                None
            }
        };
        let mut entries = read(&p);
        entries.retain(|e| !new.iter().any(|n| n.same_slot(e)));
        entries.extend(new.iter().cloned());
        let file = TuneFile { schema: SCHEMA, entries };
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let tmp = p.with_extension(format!("json.tmp.{}.{:?}.{nanos}", std::process::id(), std::thread::current().id()));
        let res = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other).and_then(|bytes| std::fs::write(&tmp, bytes)).and_then(|()| std::fs::rename(&tmp, &p));
        if let Err(e) = res {
            let _ = std::fs::remove_file(&tmp);
            warn(Warning::TuneStore, format!("cannot write tuning results to {}: {e}", p.display()));
        }
        // The lock is released when `_held` is dropped, after the rename.
    }

    /// An exclusive lock on `path` (created if absent; never deleted, so that every
    /// process locks the same file), released when the returned file is dropped.
    fn lock(&self, path: &Path) -> std::io::Result<File> {
        let f = File::options().create(true).truncate(false).write(true).open(path)?;
        let until = Instant::now() + self.lock_wait;
        loop {
            match f.try_lock() {
                Ok(()) => return Ok(f),
                Err(TryLockError::Error(e)) => return Err(e),
                Err(TryLockError::WouldBlock) if Instant::now() >= until => {
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("still held by another writer after {:?}", self.lock_wait)))
                }
                Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }
}

fn read(p: &Path) -> Vec<Entry> {
    let bytes = match std::fs::read(p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return vec![],
        Err(e) => {
            warn(Warning::TuneStore, format!("cannot read tuning results in {}: {e}", p.display()));
            return vec![];
        }
    };
    match serde_json::from_slice::<TuneFile>(&bytes) {
        Ok(f) if f.schema == SCHEMA => f.entries,
        Ok(f) => {
            warn(Warning::TuneStore, format!("ignoring tuning results in {}: schema {} (this version reads {SCHEMA}); they are replaced on the next write", p.display(), f.schema));
            vec![]
        }
        Err(e) => {
            warn(Warning::TuneStore, format!("ignoring corrupt tuning results in {}: {e}; they are replaced on the next write", p.display()));
            vec![]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        std::env::temp_dir().join(format!("rutile-store-{name}-{}-{nanos}", std::process::id()))
    }

    /// A debug build's timings (checked launches synchronize) and a release build's are
    /// different slots, and so are two compilers'; entries written before the `debug`
    /// field existed read as release builds.
    #[test]
    fn debug_builds_and_compilers_are_slots_of_their_own() {
        let release = entry("n=1".into());
        assert!(!release.same_slot(&Entry { debug: true, ..release.clone() }));
        assert!(!release.same_slot(&Entry { compiler: "other".into(), ..release.clone() }));
        assert!(release.same_slot(&Entry { ms: Some(2.0), ..release.clone() }));
        let mut json = serde_json::to_value(&release).unwrap();
        json.as_object_mut().unwrap().remove("debug");
        let old: Entry = serde_json::from_value(json).unwrap();
        assert!(old.same_slot(&release));
    }

    fn entry(key: String) -> Entry {
        Entry {
            kernel: "k".into(),
            ir_hash: "h".into(),
            compiler: "c".into(),
            debug: false,
            config: Config::new(&[("BLOCK", 256)], 4, 1),
            device: "d".into(),
            cc: (9, 0),
            driver: 13000,
            key,
            ms: Some(1.0),
            failure: None,
        }
    }

    #[test]
    fn threads_saving_other_keys_keep_each_others_entries() {
        let store = Store::new(Some(dir("threads")));
        std::thread::scope(|s| {
            for t in 0..4 {
                let store = &store;
                s.spawn(move || (0..25).for_each(|i| store.save("k", &[entry(format!("t={t} i={i}"))])));
            }
        });
        assert_eq!(store.load("k").len(), 100);
    }

    #[test]
    fn a_lock_held_too_long_or_not_available_is_skipped() {
        let d = dir("held");
        std::fs::create_dir_all(&d).unwrap();
        // Held by someone else (another open file, as another process would): the write
        // waits `lock_wait`, then goes ahead.
        let held = File::options().create(true).truncate(false).write(true).open(d.join("k.lock")).unwrap();
        held.lock().unwrap();
        let store = Store { dir: Some(d.clone()), lock_wait: Duration::from_millis(50) };
        let t0 = Instant::now();
        store.save("k", &[entry("n=1".into())]);
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(store.load("k").len(), 1);
        // A lock file that cannot be opened (here a directory in its place).
        let d = dir("nolock");
        std::fs::create_dir_all(d.join("k.lock")).unwrap();
        let store = Store::new(Some(d));
        store.save("k", &[entry("n=1".into())]);
        assert_eq!(store.load("k").len(), 1);
    }
}
