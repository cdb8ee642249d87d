//! The on-disk compile cache.
//!
//! Entries live in one directory: `RUTILE_CACHE_DIR` if set, else the per-user cache
//! directory (`$XDG_CACHE_HOME/rutile` or `$HOME/.cache/rutile` on Linux);
//! `RUTILE_CACHE=off` disables it. With none of these set (no `HOME`, as in some
//! containers and services), compiles are not cached and one warning says so. An entry is
//! named by its key (a BLAKE3 hash of everything that can change its contents, see
//! [`compile::cache_key`](crate::compile::cache_key)) and an extension: `ptx`, its
//! `meta.json` ([`CompiledMeta`](crate::compile::CompiledMeta): shared memory, warps,
//! stages, target, parameter layout; PTX is only used with it), and
//! `sm90-drv13000.cubin` for machine code, which also depends on the device and driver.
//!
//! Each file holds a header, the BLAKE3 hash of the payload and the payload, so a torn or
//! corrupted file is detected on read; the caller then recompiles and overwrites it with
//! a warning ([`diag`](crate::diag): one stderr line per kind and process). Writes go to a
//! unique temporary file in the same directory that is then
//! renamed over the entry: atomic on POSIX, so concurrent writers (threads or processes)
//! each succeed and readers see a whole entry or none. A cache that cannot be written
//! (read-only disk, full disk) costs a warning, never a failed launch. A writer killed in
//! the middle leaves at most a `.tmp` file, which is never read as an entry.

use crate::diag::{warn, Warning};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: &[u8; 8] = b"RUTILE1\n";

/// The result of a cache read.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Hit(Vec<u8>),
    Miss,
    /// The entry exists but is unreadable or fails its checksum.
    Corrupt(String),
}

/// `<user cache dir>/rutile` (`$XDG_CACHE_HOME/rutile` or `$HOME/.cache/rutile` on Linux),
/// the default home of compiled kernels and tuning results; `None` when neither variable
/// is set: without them `dirs` would guess from the password database, a directory the
/// user did not choose, so callers run uncached and say so instead.
pub fn rutile_cache_dir() -> Option<PathBuf> {
    let set = |v: &str| std::env::var_os(v).is_some_and(|d| !d.is_empty());
    if cfg!(unix) && !set("HOME") && !set("XDG_CACHE_HOME") {
        return None;
    }
    dirs::cache_dir().map(|d| d.join("rutile"))
}

/// The directory an environment variable names, if it is set and not empty.
pub fn env_dir(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).filter(|d| !d.is_empty()).map(PathBuf::from)
}

#[derive(Clone, Debug)]
pub struct DiskCache {
    dir: Option<PathBuf>,
}

impl DiskCache {
    /// A cache in `dir` (`None`: disabled).
    pub fn new(dir: Option<PathBuf>) -> DiskCache {
        DiskCache { dir }
    }

    /// The cache the environment asks for (see the module docs).
    pub fn from_env() -> DiskCache {
        if std::env::var("RUTILE_CACHE").is_ok_and(|v| v == "off" || v == "0") {
            return DiskCache::new(None);
        }
        let dir = env_dir("RUTILE_CACHE_DIR").or_else(rutile_cache_dir);
        if dir.is_none() {
            warn(Warning::CacheNoDir, "no cache directory (HOME, XDG_CACHE_HOME and RUTILE_CACHE_DIR are unset): compiled kernels are not cached on disk");
        }
        DiskCache::new(dir)
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    pub fn path(&self, key: &str, ext: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{key}.{ext}")))
    }

    pub fn get(&self, key: &str, ext: &str) -> Lookup {
        let Some(path) = self.path(key, ext) else { return Lookup::Miss };
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            // A missing entry, or a cache directory that is not there (or not a directory):
            // nothing to read. The write that follows reports an unusable directory.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => return Lookup::Miss,
            Err(e) => return Lookup::Corrupt(format!("cannot read {}: {e}", path.display())),
        };
        if data.len() < MAGIC.len() + 32 || &data[..MAGIC.len()] != MAGIC {
            return Lookup::Corrupt(format!("{} is not a cache entry", path.display()));
        }
        let (hash, payload) = data[MAGIC.len()..].split_at(32);
        if blake3::hash(payload).as_bytes() != hash {
            return Lookup::Corrupt(format!("{} fails its checksum", path.display()));
        }
        Lookup::Hit(payload.to_vec())
    }

    /// Write an entry atomically.
    pub fn put(&self, key: &str, ext: &str, payload: &[u8]) -> std::io::Result<()> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let (Some(dir), Some(path)) = (self.dir.as_ref(), self.path(key, ext)) else { return Ok(()) };
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(
            ".{key}.{ext}.{}.{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(MAGIC)?;
            file.write_all(blake3::hash(payload).as_bytes())?;
            file.write_all(payload)?;
            drop(file);
            std::fs::rename(&tmp, &path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Remove an entry (one whose content turned out to be unusable).
    pub fn evict(&self, key: &str, ext: &str) {
        if let Some(p) = self.path(key, ext) {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Read an entry; a corrupt one is reported with a warning and treated as missing.
    pub fn load(&self, key: &str, ext: &str, what: &str) -> Option<Vec<u8>> {
        match self.get(key, ext) {
            Lookup::Hit(d) => Some(d),
            Lookup::Miss => None,
            Lookup::Corrupt(why) => {
                warn(Warning::CacheCorrupt, format!("ignoring corrupt cache entry for {what} ({why}); recompiling"));
                None
            }
        }
    }

    /// Write an entry; failure is a warning.
    pub fn store(&self, key: &str, ext: &str, payload: &[u8], what: &str) {
        if let Err(e) = self.put(key, ext, payload) {
            let dir = self.dir.as_deref().unwrap_or(Path::new("")).display();
            warn(Warning::CacheUnwritable, format!("cannot write the cache entry for {what} in {dir}: {e}; running uncached"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rutile-cache-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn round_trip_and_corruption() {
        let c = DiskCache::new(Some(tmpdir("rt")));
        assert_eq!(c.get("k", "ptx"), Lookup::Miss);
        c.put("k", "ptx", b"hello").unwrap();
        assert_eq!(c.get("k", "ptx"), Lookup::Hit(b"hello".to_vec()));
        let p = c.path("k", "ptx").unwrap();
        let mut bytes = std::fs::read(&p).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        assert!(matches!(c.get("k", "ptx"), Lookup::Corrupt(_)));
        std::fs::write(&p, b"junk").unwrap();
        assert!(matches!(c.get("k", "ptx"), Lookup::Corrupt(_)));
        assert_eq!(c.load("k", "ptx", "test"), None);
    }

    #[test]
    fn concurrent_writers_all_succeed() {
        let c = DiskCache::new(Some(tmpdir("conc")));
        let payload: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..20 {
                        c.put("same", "ptx", &payload).unwrap();
                        match c.get("same", "ptx") {
                            Lookup::Hit(d) => assert_eq!(d, payload),
                            other => panic!("reader saw {other:?}"),
                        }
                    }
                });
            }
        });
        let leftovers = std::fs::read_dir(c.dir().unwrap()).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp")).count();
        assert_eq!(leftovers, 0);
    }
}
