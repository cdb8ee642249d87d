//! The compile cache: what changes the key, compile-once, corruption, concurrent writers
//! (threads and processes), and the stage dump. No GPU needed: these use the PTX level.

use dsl_runtime::cache::{DiskCache, Lookup};
use dsl_runtime::compile::{build_ir, cache_key, CodegenOptions, Compiler, LoadError};
use dsl_runtime::emit::Target;
use dsl_runtime::ir::ParamSpec;
use dsl_runtime::launch::{Kernel, Safety};
use dsl_runtime::prelude::*;
use kernels_lib::*;
use std::path::PathBuf;
use std::process::Command;

mod a {
    use dsl_runtime::prelude::*;
    #[kernel]
    pub fn twin<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
        let offs = program_id(0) * BLOCK + arange::<BLOCK>();
        store(out + offs, load(x + offs, offs < n, 0.0) * 2.0, offs < n);
    }
}
mod b {
    use dsl_runtime::prelude::*;
    // Same name and signature, one constant changed in the body.
    #[kernel]
    pub fn twin<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
        let offs = program_id(0) * BLOCK + arange::<BLOCK>();
        store(out + offs, load(x + offs, offs < n, 0.0) * 3.0, offs < n);
    }
}

mod c {
    use dsl_runtime::prelude::*;
    // `a::twin` again, on other lines of this file.

    #[kernel]
    pub fn twin<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {

        let offs = program_id(0) * BLOCK + arange::<BLOCK>();

        store(out + offs, load(x + offs, offs < n, 0.0) * 2.0, offs < n);
    }
}

/// Moving a kernel in its file keeps its key (release code has no source lines in it), but
/// not in debug builds, whose asserts and out-of-bounds reports name lines.
#[test]
fn source_lines_are_in_the_key_of_debug_builds_only() {
    let s3 = vec![NICE; 3];
    assert_eq!(key(&a::twin::<1024>, &s3, &opts(2)), key(&c::twin::<1024>, &s3, &opts(2)));
    let debug = CodegenOptions { debug: true, ..opts(2) };
    assert_ne!(key(&a::twin::<1024>, &s3, &debug), key(&c::twin::<1024>, &s3, &debug));
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rutile-cache-test-{name}-{}", crate::common::unique()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const NICE: ParamSpec = ParamSpec { eq_one: false, div16: true };

fn opts(nptr: usize) -> CodegenOptions {
    CodegenOptions { num_warps: 4, num_stages: 1, safety: Safety::Guarded, len_specs: vec![NICE; nptr], target: Target::SM90, debug: false, wgmma: true, tma: true, tma_store: false, warp_specialize: false, min_programs_per_sm: 1, prefetch: true }
}

fn key(k: &dyn Kernel, specs: &[ParamSpec], o: &CodegenOptions) -> String {
    cache_key(&build_ir(k, specs).unwrap(), o)
}

#[test]
fn key_changes_with_everything_that_changes_the_code() {
    let s5 = vec![NICE; 5];
    let base = key(&relu_mul_add::<f32, 1024>::new(), &s5, &opts(4));
    assert_eq!(base, key(&relu_mul_add::<f32, 1024>::new(), &s5, &opts(4)), "identical launches share a key");
    let mut variants = vec![
        ("constant", key(&relu_mul_add::<f32, 2048>::new(), &s5, &opts(4))),
        ("dtype", key(&relu_mul_add::<bf16, 1024>::new(), &s5, &opts(4))),
        ("alignment", key(&relu_mul_add::<f32, 1024>::new(), &[ParamSpec::default(), NICE, NICE, NICE, NICE], &opts(4))),
        ("n == 1", key(&relu_mul_add::<f32, 1024>::new(), &[NICE, NICE, NICE, NICE, ParamSpec { eq_one: true, div16: false }], &opts(4))),
        ("num_warps", key(&relu_mul_add::<f32, 1024>::new(), &s5, &CodegenOptions { num_warps: 8, ..opts(4) })),
        ("num_stages", key(&relu_mul_add::<f32, 1024>::new(), &s5, &CodegenOptions { num_stages: 3, ..opts(4) })),
        ("debug", key(&relu_mul_add::<f32, 1024>::new(), &s5, &CodegenOptions { debug: true, ..opts(4) })),
        ("unchecked", key(&relu_mul_add::<f32, 1024>::new(), &s5, &CodegenOptions { safety: Safety::Unchecked, len_specs: vec![], ..opts(4) })),
        ("length spec", key(&relu_mul_add::<f32, 1024>::new(), &s5, &CodegenOptions { len_specs: vec![ParamSpec::default(); 4], ..opts(4) })),
        ("target", key(&relu_mul_add::<f32, 1024>::new(), &s5, &CodegenOptions { target: Target::SM80, ..opts(4) })),
        ("wgmma", key(&relu_mul_add::<f32, 1024>::new(), &s5, &CodegenOptions { wgmma: false, ..opts(4) })),
        ("warp specialization", key(&relu_mul_add::<f32, 1024>::new(), &s5, &CodegenOptions { warp_specialize: true, ..opts(4) })),
        ("TMA stores", key(&relu_mul_add::<f32, 1024>::new(), &s5, &CodegenOptions { tma_store: true, ..opts(4) })),
    ];
    let s3 = vec![NICE; 3];
    variants.push(("body", key(&a::twin::<1024>, &s3, &opts(2))));
    assert_ne!(key(&a::twin::<1024>, &s3, &opts(2)), key(&b::twin::<1024>, &s3, &opts(2)), "a changed body changes the key");
    for (what, k) in &variants {
        assert_ne!(*k, base, "changing the {what} must change the key");
    }
}

#[test]
fn identical_requests_compile_once_and_a_new_compiler_reuses_the_disk() {
    let dir = tmp("once");
    let c = Compiler::new(DiskCache::new(Some(dir.clone())));
    let (k1, p1) = c.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    let (k2, p2) = c.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    assert_eq!((k1.clone(), p1.clone()), (k2, p2));
    assert_eq!((c.stats().compiled, c.stats().disk_hits), (1, 1));
    let c2 = Compiler::new(DiskCache::new(Some(dir)));
    let (_, p3) = c2.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    assert_eq!(p3, p1);
    assert_eq!((c2.stats().compiled, c2.stats().disk_hits), (0, 1));
}

#[test]
fn a_corrupt_entry_is_recompiled_and_replaced() {
    let dir = tmp("corrupt");
    let disk = DiskCache::new(Some(dir.clone()));
    let c = Compiler::new(disk.clone());
    let (key, ptx) = c.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    let path = disk.path(&key, "ptx").unwrap();
    for damage in [b"garbage".to_vec(), { let mut v = std::fs::read(&path).unwrap(); v.truncate(v.len() / 2); v }] {
        std::fs::write(&path, damage).unwrap();
        assert!(matches!(disk.get(&key, "ptx"), Lookup::Corrupt(_)));
        let c = Compiler::new(disk.clone());
        let (_, again) = c.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
        assert_eq!(again, ptx);
        assert_eq!(c.stats().compiled, 1, "the corrupt entry was recompiled");
        assert_eq!(disk.get(&key, "ptx"), Lookup::Hit(ptx.clone().into_bytes()), "and replaced");
    }
}

/// PTX is only used with its metadata record (shared memory, parameter layout): PTX whose
/// record is missing (a writer killed between the two files) or of another version is
/// compiled again, and both are written.
#[test]
fn ptx_without_its_metadata_record_is_a_miss() {
    let dir = tmp("meta");
    let disk = DiskCache::new(Some(dir));
    let (key, _) = Compiler::new(disk.clone()).ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    let meta = disk.path(&key, dsl_runtime::compile::META_EXT).unwrap();
    let record = std::fs::read(&meta).unwrap();
    std::fs::remove_file(&meta).unwrap();
    let c = Compiler::new(disk.clone());
    c.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    assert_eq!((c.stats().compiled, c.stats().disk_hits), (1, 0));
    assert!(meta.exists());
    // A record of another version.
    let mut old: serde_json::Value = serde_json::from_slice(&disk_payload(&disk, &key)).unwrap();
    old["version"] = serde_json::json!(0);
    disk.put(&key, dsl_runtime::compile::META_EXT, &serde_json::to_vec(&old).unwrap()).unwrap();
    let c = Compiler::new(disk.clone());
    c.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    assert_eq!((c.stats().compiled, c.stats().disk_hits), (1, 0));
    assert!(!record.is_empty());
}

fn disk_payload(disk: &DiskCache, key: &str) -> Vec<u8> {
    match disk.get(key, dsl_runtime::compile::META_EXT) {
        Lookup::Hit(d) => d,
        other => panic!("{other:?}"),
    }
}

#[test]
fn concurrent_threads_fill_one_cache() {
    let dir = tmp("threads");
    let results: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let dir = dir.clone();
                s.spawn(move || Compiler::new(DiskCache::new(Some(dir))).ptx(&gelu_tanh::<512>, &[NICE; 3], &opts(2)).unwrap().1)
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.windows(2).all(|w| w[0] == w[1]));
}

/// Child half of `concurrent_processes_fill_one_cache`.
#[test]
#[ignore = "run by concurrent_processes_fill_one_cache"]
fn child_writer() {
    let Some(dir) = std::env::var_os("RUTILE_TEST_CACHE_DIR") else { return };
    for _ in 0..3 {
        let disk = DiskCache::new(Some(PathBuf::from(&dir)));
        let c = Compiler::new(disk);
        c.ptx(&silu_mul::<1024>, &[NICE; 4], &opts(3)).unwrap();
        // Force a rewrite each round: write while the others read.
        let (key, ptx) = c.ptx(&silu_mul::<1024>, &[NICE; 4], &opts(3)).unwrap();
        c.disk.put(&key, "ptx", ptx.as_bytes()).unwrap();
    }
}

#[test]
fn sixteen_processes_compiling_one_kernel_all_succeed_and_leave_one_entry() {
    let dir = tmp("procs");
    crate::common::run_in_processes("cache::child_writer", 16, &[("RUTILE_TEST_CACHE_DIR", dir.as_os_str())]);
    let c = Compiler::new(DiskCache::new(Some(dir.clone())));
    c.ptx(&silu_mul::<1024>, &[NICE; 4], &opts(3)).unwrap();
    assert_eq!(c.stats().disk_hits, 1, "the entry left behind is whole");
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), 2, "one entry (PTX and its metadata record) and no temporary files: {names:?}");
    assert!(names.iter().any(|n| n.ends_with(".ptx")) && names.iter().any(|n| n.ends_with(".meta.json")), "{names:?}");
}

/// Child half of `a_writer_killed_in_the_middle_leaves_no_entry_that_is_used`: rewrites one
/// large entry for ever, until it is killed.
#[test]
#[ignore = "run by a_writer_killed_in_the_middle_leaves_no_entry_that_is_used"]
fn child_endless_writer() {
    let Some(dir) = std::env::var_os("RUTILE_TEST_CACHE_DIR") else { return };
    let disk = DiskCache::new(Some(PathBuf::from(dir)));
    let payload = big_payload();
    // Tell the parent the writes start now (the line goes out before the test harness's
    // own output, which is buffered until the test ends, and never comes).
    use std::io::Write;
    let mut fd = std::io::stdout().lock();
    writeln!(fd, "rutile-writing").unwrap();
    fd.flush().unwrap();
    loop {
        disk.put("victim", "ptx", &payload).unwrap();
    }
}

fn big_payload() -> Vec<u8> {
    (0..(8u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()
}

/// SIGKILL a writer at random moments, many times: the entry is then either absent or
/// whole, never a torn file that is read back (writes go to a temporary file that is
/// renamed over the entry). Without the rename, the kill lands mid-write and `get` sees a
/// short file.
#[test]
fn a_writer_killed_in_the_middle_leaves_no_entry_that_is_used() {
    let dir = tmp("killed");
    let disk = DiskCache::new(Some(dir.clone()));
    let payload = big_payload();
    let exe = std::env::current_exe().unwrap();
    let mut rng = crate::common::seed();
    let (mut whole, mut absent) = (0, 0);
    for round in 0..24 {
        let mut child = Command::new(&exe)
            .args(["cache::child_endless_writer", "--exact", "--ignored", "--test-threads=1", "--nocapture"])
            .env("RUTILE_TEST_CACHE_DIR", &dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Once the writer is writing, kill it 0-50 ms later: mostly in the middle of one of
        // its 8 MB writes.
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        assert!(lines.any(|l| l.unwrap().contains("rutile-writing")), "the writer did not start");
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        std::thread::sleep(std::time::Duration::from_micros((rng >> 33) % 50_000));
        child.kill().unwrap();
        child.wait().unwrap();
        match disk.get("victim", "ptx") {
            Lookup::Hit(d) => {
                assert!(d == payload, "round {round}: a different payload was read back");
                whole += 1;
            }
            Lookup::Miss => absent += 1,
            Lookup::Corrupt(why) => panic!("round {round}: a killed writer left an entry that is read: {why}"),
        }
    }
    assert!(whole > 0, "the writer never finished a write: the test tested nothing");
    println!("{whole} whole entries, {absent} absent after 24 kills");
    // Leftover temporary files (one per kill mid-write) are never entries.
    let entries = std::fs::read_dir(&dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".ptx")).count();
    assert!(entries <= 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Child half of the warning tests: compiles three kernels through the cache the
/// environment asks for, and checks whether it has a directory.
#[test]
#[ignore = "run by the tests of cache warnings"]
fn child_compile_three() {
    let Ok(want) = std::env::var("RUTILE_TEST_EXPECT_DIR") else { return };
    let disk = DiskCache::from_env();
    assert_eq!(disk.dir().is_some(), want == "yes", "cache dir: {:?}", disk.dir());
    let c = Compiler::new(disk);
    c.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    c.ptx(&gelu_tanh::<512>, &[NICE; 3], &opts(2)).unwrap();
    c.ptx(&silu_mul::<1024>, &[NICE; 4], &opts(3)).unwrap();
    assert_eq!(c.stats().compiled, 3);
}

/// Run `child_compile_three` with `env` (and `unset` removed); its stderr.
fn child_stderr(env: &[(&str, &std::ffi::OsStr)], unset: &[&str]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["cache::child_compile_three", "--exact", "--ignored", "--test-threads=1", "--nocapture"]);
    for u in unset {
        cmd.env_remove(u);
    }
    cmd.env_remove("RUTILE_WARNINGS").envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the child failed:\n{}\n{stderr}", String::from_utf8_lossy(&out.stdout));
    stderr
}

fn warnings(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("rutile: warning:")).collect()
}

/// A cache directory that cannot be written (here: its parent is a file, which fails for
/// root too, unlike a read-only mode) runs uncached, and the user reads one warning on
/// stderr for three failed writes, without installing a `tracing` subscriber.
#[test]
fn an_unwritable_cache_directory_runs_uncached_with_one_warning() {
    let base = tmp("unwritable");
    std::fs::create_dir_all(&base).unwrap();
    let file = base.join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let dir = file.join("cache");
    let err = child_stderr(&[("RUTILE_CACHE_DIR", dir.as_os_str()), ("RUTILE_TEST_EXPECT_DIR", "yes".as_ref())], &["RUTILE_CACHE"]);
    let w = warnings(&err);
    assert_eq!(w.len(), 1, "one warning for three failed writes:\n{err}");
    assert!(w[0].contains("cannot write the cache entry") && w[0].contains("uncached"), "{}", w[0]);
}

/// Without HOME (and without XDG_CACHE_HOME or RUTILE_CACHE_DIR) nothing is cached, and
/// one warning says so.
#[test]
fn no_home_runs_uncached_with_one_warning() {
    let err = child_stderr(&[("RUTILE_TEST_EXPECT_DIR", "no".as_ref())], &["HOME", "XDG_CACHE_HOME", "RUTILE_CACHE_DIR", "RUTILE_CACHE"]);
    let w = warnings(&err);
    assert_eq!(w.len(), 1, "{err}");
    assert!(w[0].contains("no cache directory"), "{}", w[0]);
}

/// A compiler whose sources changed (another fingerprint) compiles again instead of
/// reading PTX that the old one wrote.
#[test]
fn a_changed_compiler_misses_the_cache() {
    let dir = tmp("fingerprint");
    let old = Compiler::new(DiskCache::new(Some(dir.clone()))).with_fingerprint("compiler-before-a-change");
    let (k_old, _) = old.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    let new = Compiler::new(DiskCache::new(Some(dir.clone())));
    assert_eq!(new.fingerprint(), dsl_runtime::compile::COMPILER_FINGERPRINT);
    let (k_new, _) = new.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    assert_ne!(k_old, k_new);
    assert_eq!((new.stats().compiled, new.stats().disk_hits), (1, 0), "the old compiler's entry was not used");
    // The build's fingerprint is a real hash, and the same compiler hits its own entry.
    assert_eq!(dsl_runtime::compile::COMPILER_FINGERPRINT.len(), 32);
    let again = Compiler::new(DiskCache::new(Some(dir)));
    again.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    assert_eq!(again.stats().disk_hits, 1);
}

/// Machine code depends on the device and the driver: the cubin's cache name covers both.
#[test]
fn the_cubin_key_covers_device_capability_and_driver_version() {
    use dsl_runtime::driver::cubin_ext;
    let base = cubin_ext((9, 0), 13000);
    assert_ne!(base, cubin_ext((8, 0), 13000));
    assert_ne!(base, cubin_ext((8, 9), 13000));
    assert_ne!(base, cubin_ext((9, 0), 12080));
    assert_eq!(base, cubin_ext((9, 0), 13000));
}

/// An entry with a valid checksum but content the loader refuses (the driver, on a GPU) is
/// evicted and compiled once more, with a warning; refused fresh PTX is an error.
#[test]
fn a_cached_entry_the_loader_refuses_is_evicted_and_compiled_again() {
    let dir = tmp("refused");
    let disk = DiskCache::new(Some(dir));
    let c = Compiler::new(disk.clone());
    let (key, good) = c.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
    // Well-formed on disk, rejected by the loader.
    disk.put(&key, "ptx", b".version 1.0 not really ptx").unwrap();
    let driver = |_: &str, ptx: &str| if ptx.contains(".entry relu_mul_add") { Ok(ptx.len()) } else { Err(LoadError::Refused("CUDA_ERROR_INVALID_PTX".to_string())) };
    let c2 = Compiler::new(disk.clone());
    let l = c2.load_with(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4), driver).unwrap();
    let (ptx, len) = (l.ptx, l.value);
    assert_eq!((ptx.as_str(), len), (good.as_str(), good.len()));
    assert_eq!((c2.stats().compiled, c2.stats().disk_hits), (1, 0));
    assert_eq!(disk.get(&key, "ptx"), Lookup::Hit(good.into_bytes()), "the bad entry was replaced");
    // A loader that refuses everything: one compile, then the error (no loop).
    let c3 = Compiler::new(DiskCache::new(None));
    let err = c3.load_with(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4), |_, _| Err::<(), _>(LoadError::Refused("no".to_string()))).unwrap_err();
    assert!(err.to_string().contains("load failed: no"), "{err}");
    assert_eq!(c3.stats().compiled, 1);
    // A failure that is not the program's (out of memory, a broken context) leaves the
    // good entry alone and is returned as it is.
    let c4 = Compiler::new(disk.clone());
    let oom = |_: &str, _: &str| Err::<(), _>(LoadError::Other(dsl_runtime::Error::Buffer("out of memory".into())));
    let err = c4.load_with(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4), oom).unwrap_err();
    assert!(matches!(err, dsl_runtime::Error::Buffer(_)), "{err}");
    assert_eq!(c4.stats().compiled, 0);
    assert!(matches!(disk.get(&key, "ptx"), Lookup::Hit(_)), "the entry stays");
}

/// Child half of `dump_writes_every_stage`.
#[test]
#[ignore = "run by dump_writes_every_stage"]
fn child_dump() {
    if std::env::var_os("RUTILE_DUMP").is_none() {
        return;
    }
    let c = Compiler::new(DiskCache::new(None));
    c.ptx(&relu_mul_add::<f32, 1024>::new(), &[NICE; 5], &opts(4)).unwrap();
}

/// Run the ignored test `child` with `RUTILE_DUMP=kernel` (and `env`) into a new directory;
/// check that every stage of `kernel` was written there and return the directory and the
/// names of its files.
fn dump_in_child(child: &str, kernel: &str, env: &[(&str, &str)]) -> (PathBuf, Vec<String>) {
    let dir = tmp(child);
    let ok = Command::new(std::env::current_exe().unwrap())
        .args([child, "--exact", "--ignored", "--test-threads=1"])
        .env("RUTILE_DUMP", kernel)
        .env("RUTILE_DUMP_DIR", &dir)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    for ext in [".ir", ".opt.ir", ".ll", ".ptx", ".meta.json"] {
        assert!(names.iter().any(|n| n.starts_with(&format!("{kernel}-")) && n.ends_with(ext)), "no {ext} in {names:?}");
    }
    (dir, names)
}

#[test]
fn dump_writes_every_stage() {
    let (dir, names) = dump_in_child("cache::child_dump", "relu_mul_add", &[]);
    let ir = std::fs::read_to_string(dir.join(names.iter().find(|n| n.ends_with(".opt.ir")).unwrap())).unwrap();
    assert!(ir.contains("cmp ult") && ir.contains("len(%out)"), "the optimized IR shows the bounds guard:\n{ir}");
}

/// One generic function runs a kernel on any [`Launcher`]: the [`Runtime`] enum and the
/// interpreter itself here, a CUDA runtime in `gpu::one_generic_function_runs_on_every_launcher_on_gpu`.
/// Each result is checked against the CPU, not against another launcher.
#[test]
fn one_generic_function_runs_on_every_launcher() {
    fn run<L: Launcher + ?Sized>(l: &L) -> Vec<f32> {
        let x: Vec<f32> = (0..100).map(|i| i as f32 - 50.5).collect();
        let mut out = vec![f32::NAN; 100];
        a::twin::<64>::launch(l, LaunchConfig::grid(2), &x, &mut out, 100).unwrap();
        out
    }
    let want: Vec<f32> = (0..100).map(|i| (i as f32 - 50.5) * 2.0).collect();
    assert_eq!(run(&Runtime::interpreter()), want);
    assert_eq!(run(&dsl_runtime::interp::Interpreter), want);
}

/// Child half of `dumps_without_a_gpu`.
#[test]
#[ignore = "run by dumps_without_a_gpu"]
fn child_interpreter_dump() {
    if std::env::var_os("RUTILE_DUMP").is_none() {
        return;
    }
    let x = vec![1.0f32; 100];
    let mut out = vec![0.0f32; 100];
    a::twin::<64>::launch(&Runtime::interpreter(), LaunchConfig::grid(2), &x, &mut out, 100).unwrap();
    assert_eq!(out[99], 2.0);
}

/// `RUTILE_DUMP` works on the interpreter (for `RUTILE_DUMP_TARGET`), and
/// `compile::stages` gives the same stages from a plain call.
#[test]
fn dumps_without_a_gpu() {
    let (dir, names) = dump_in_child("cache::child_interpreter_dump", "twin", &[("RUTILE_DUMP_TARGET", "sm_80")]);
    let ptx = std::fs::read_to_string(dir.join(names.iter().find(|n| n.ends_with(".ptx")).unwrap())).unwrap();
    assert!(ptx.contains(".target sm_80") && ptx.contains(".entry twin"), "{ptx}");

    let art = dsl_runtime::compile::stages(&a::twin::<64>, Target::SM90, 2).unwrap();
    assert!(art.ptx.contains(".target sm_90a") && art.opt_ir.contains("len(%out)"), "{}", art.opt_ir);
    let paths = dsl_runtime::compile::write_stages(&dir.join("api"), "twin", &art).unwrap();
    assert_eq!(paths.len(), 5, "ir, opt.ir, ll, ptx and the metadata record");
    assert!(paths.iter().all(|p| p.exists()));
}
