//! Fingerprints the compiler: a BLAKE3 hash of every source file of this crate, exposed as
//! `RUTILE_COMPILER_FINGERPRINT`. Every compile-cache key and every tuning result is keyed
//! by it (Triton hashes its own sources into its cache keys the same way), so a change to a
//! pass or to the lowering never serves machine code built by the compiler before it.

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let mut all = vec![root.join("Cargo.toml"), root.join("build.rs")];
    files(&root.join("src"), &mut all);
    all.sort();
    let mut h = blake3::Hasher::new();
    for p in &all {
        // The path relative to the crate, then the contents: renaming a file changes it too.
        h.update(p.strip_prefix(&root).unwrap_or(p).to_string_lossy().as_bytes());
        h.update(b"\0");
        h.update(&std::fs::read(p).unwrap_or_default());
        h.update(b"\0");
    }
    println!("cargo:rustc-env=RUTILE_COMPILER_FINGERPRINT={}", &h.finalize().to_hex()[..32]);
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=Cargo.toml");
}
