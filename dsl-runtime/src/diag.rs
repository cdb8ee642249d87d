//! Warnings that reach the user without any setup.
//!
//! Things that go wrong without failing a launch (a corrupt cache entry, an unwritable cache
//! directory, a tuning fall-back) are logged through `tracing` *and* printed as one line on
//! stderr, `rutile: warning: ...`, the first time each kind happens in a process: a
//! program that installs no `tracing` subscriber still learns of them, and a loop that
//! hits the same problem a thousand times prints it once. `RUTILE_WARNINGS=off` silences
//! the stderr line (the `tracing` event is still emitted); `RUTILE_WARNINGS=all` prints
//! every occurrence.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// The kinds of warning, each printed once per process on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Warning {
    /// A cache entry failed its checksum or was unreadable (damage: a torn or changed file).
    CacheCorrupt,
    /// A cache entry with a valid checksum was refused by the driver (PTX or a cubin that
    /// this driver or GPU does not take: a compiler or driver mismatch, worth knowing apart
    /// from damage).
    CacheRefused,
    /// The cache directory cannot be created or written; compiles are not cached.
    CacheUnwritable,
    /// No cache directory could be found (no `HOME`, no `RUTILE_CACHE_DIR`).
    CacheNoDir,
    /// A stage dump could not be written.
    Dump,
    /// A tuning results file was unreadable, of another schema, or could not be written.
    TuneStore,
    /// The autotuner fell back to something less than it was asked for.
    TuneFallback,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Once,
    All,
    Off,
}

fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("RUTILE_WARNINGS").as_deref() {
        Ok("off") | Ok("0") => Mode::Off,
        Ok("all") => Mode::All,
        _ => Mode::Once,
    })
}

/// Log `message` through `tracing`, and print it on stderr if it is the first warning of
/// its kind in this process. Returns whether it was printed.
pub fn warn(kind: Warning, message: impl std::fmt::Display) -> bool {
    static SEEN: Mutex<Option<HashSet<Warning>>> = Mutex::new(None);
    tracing::warn!(?kind, "{message}");
    let first = match SEEN.lock() {
        Ok(mut seen) => seen.get_or_insert_with(HashSet::new).insert(kind),
        Err(_) => false,
    };
    let print = match mode() {
        Mode::Off => false,
        Mode::All => true,
        Mode::Once => first,
    };
    if print {
        let more = if mode() == Mode::Once { " (further warnings of this kind are not printed; RUTILE_WARNINGS=all shows them)" } else { "" };
        eprintln!("rutile: warning: {message}{more}");
    }
    print
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_prints_once() {
        if mode() != Mode::Once {
            return;
        }
        assert!(warn(Warning::Dump, "first"));
        assert!(!warn(Warning::Dump, "second"));
        assert!(warn(Warning::TuneFallback, "another kind"));
    }
}
