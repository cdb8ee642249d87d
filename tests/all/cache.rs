//! The compile cache: what changes the key, compile-once, corruption, concurrent writers
//! (threads and processes), and the stage dump. No GPU needed: these use the PTX level.

use dsl_runtime::cache::{DiskCache, Lookup};
use dsl_runtime::compile::{build_ir, cache_key, CodegenOptions, Compiler};
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

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rutile-cache-test-{name}-{}-{}", std::process::id(), crate::common::seed()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const NICE: ParamSpec = ParamSpec { eq_one: false, div16: true };

fn opts(nptr: usize) -> CodegenOptions {
    CodegenOptions { num_warps: 4, safety: Safety::Guarded, len_specs: vec![NICE; nptr], target: Target::SM90, debug: false }
}

fn key(k: &dyn Kernel, specs: &[ParamSpec], o: &CodegenOptions) -> String {
    cache_key(&build_ir(k, specs).unwrap(), o)
}

#[test]
fn key_changes_with_everything_that_changes_the_code() {
    let s5 = vec![NICE; 5];
    let base = key(&relu_mul_add::<1024>, &s5, &opts(4));
    assert_eq!(base, key(&relu_mul_add::<1024>, &s5, &opts(4)), "identical launches share a key");
    let mut variants = vec![
        ("constant", key(&relu_mul_add::<2048>, &s5, &opts(4))),
        ("dtype", key(&relu_mul_add_bf16::<1024>, &s5, &opts(4))),
        ("alignment", key(&relu_mul_add::<1024>, &[ParamSpec::default(), NICE, NICE, NICE, NICE], &opts(4))),
        ("n == 1", key(&relu_mul_add::<1024>, &[NICE, NICE, NICE, NICE, ParamSpec { eq_one: true, div16: false }], &opts(4))),
        ("num_warps", key(&relu_mul_add::<1024>, &s5, &CodegenOptions { num_warps: 8, ..opts(4) })),
        ("unchecked", key(&relu_mul_add::<1024>, &s5, &CodegenOptions { safety: Safety::Unchecked, len_specs: vec![], ..opts(4) })),
        ("length spec", key(&relu_mul_add::<1024>, &s5, &CodegenOptions { len_specs: vec![ParamSpec::default(); 4], ..opts(4) })),
        ("target", key(&relu_mul_add::<1024>, &s5, &CodegenOptions { target: Target::SM80, ..opts(4) })),
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
    let (k1, p1) = c.ptx(&relu_mul_add::<1024>, &[NICE; 5], &opts(4)).unwrap();
    let (k2, p2) = c.ptx(&relu_mul_add::<1024>, &[NICE; 5], &opts(4)).unwrap();
    assert_eq!((k1.clone(), p1.clone()), (k2, p2));
    assert_eq!((c.stats().compiled, c.stats().disk_hits), (1, 1));
    let c2 = Compiler::new(DiskCache::new(Some(dir)));
    let (_, p3) = c2.ptx(&relu_mul_add::<1024>, &[NICE; 5], &opts(4)).unwrap();
    assert_eq!(p3, p1);
    assert_eq!((c2.stats().compiled, c2.stats().disk_hits), (0, 1));
}

#[test]
fn a_corrupt_entry_is_recompiled_and_replaced() {
    let dir = tmp("corrupt");
    let disk = DiskCache::new(Some(dir.clone()));
    let c = Compiler::new(disk.clone());
    let (key, ptx) = c.ptx(&relu_mul_add::<1024>, &[NICE; 5], &opts(4)).unwrap();
    let path = disk.path(&key, "ptx").unwrap();
    for damage in [b"garbage".to_vec(), { let mut v = std::fs::read(&path).unwrap(); v.truncate(v.len() / 2); v }] {
        std::fs::write(&path, damage).unwrap();
        assert!(matches!(disk.get(&key, "ptx"), Lookup::Corrupt(_)));
        let c = Compiler::new(disk.clone());
        let (_, again) = c.ptx(&relu_mul_add::<1024>, &[NICE; 5], &opts(4)).unwrap();
        assert_eq!(again, ptx);
        assert_eq!(c.stats().compiled, 1, "the corrupt entry was recompiled");
        assert_eq!(disk.get(&key, "ptx"), Lookup::Hit(ptx.clone().into_bytes()), "and replaced");
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
fn concurrent_processes_fill_one_cache() {
    let dir = tmp("procs");
    crate::common::run_in_processes("cache::child_writer", 4, &[("RUTILE_TEST_CACHE_DIR", dir.as_os_str())]);
    let c = Compiler::new(DiskCache::new(Some(dir.clone())));
    c.ptx(&silu_mul::<1024>, &[NICE; 4], &opts(3)).unwrap();
    assert_eq!(c.stats().disk_hits, 1, "the entry left behind is whole");
    let tmp_left = std::fs::read_dir(&dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp")).count();
    assert_eq!(tmp_left, 0);
}

/// Child half of `dump_writes_every_stage`.
#[test]
#[ignore = "run by dump_writes_every_stage"]
fn child_dump() {
    if std::env::var_os("RUTILE_DUMP").is_none() {
        return;
    }
    let c = Compiler::new(DiskCache::new(None));
    c.ptx(&relu_mul_add::<1024>, &[NICE; 5], &opts(4)).unwrap();
}

#[test]
fn dump_writes_every_stage() {
    let dir = tmp("dump");
    let ok = Command::new(std::env::current_exe().unwrap())
        .args(["cache::child_dump", "--exact", "--ignored", "--test-threads=1"])
        .env("RUTILE_DUMP", "relu_mul_add")
        .env("RUTILE_DUMP_DIR", &dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    for ext in [".ir", ".opt.ir", ".ll", ".ptx"] {
        assert!(names.iter().any(|n| n.starts_with("relu_mul_add-") && n.ends_with(ext)), "no {ext} in {names:?}");
    }
    let ir = std::fs::read_to_string(dir.join(names.iter().find(|n| n.ends_with(".opt.ir")).unwrap())).unwrap();
    assert!(ir.contains("cmp ult") && ir.contains("len(%out)"), "the optimized IR shows the bounds guard:\n{ir}");
}

#[test]
fn interpreter_and_compiler_agree_on_the_launcher_interface() {
    // One generic function runs a kernel on any Launcher.
    fn run<L: Launcher + ?Sized>(l: &L) -> Vec<f32> {
        let x: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let mut out = vec![0.0f32; 100];
        a::twin::<64>::launch(l, LaunchConfig::grid(2), &x, &mut out, 100).unwrap();
        out
    }
    let via_enum = run(&Runtime::interpreter());
    let direct = run(&dsl_runtime::interp::Interpreter);
    assert_eq!(via_enum, direct);
    assert_eq!(direct[99], 198.0);
}
