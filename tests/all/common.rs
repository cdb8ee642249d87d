//! Shared helpers: random inputs, references, comparisons.

pub use half::bf16;
use rand::{Rng, SeedableRng};

/// Fresh random values in [-4, 4), never all zeros; the seed comes from the time so every
/// run checks new inputs (it is printed on failure; `RUTILE_TEST_SEED` gives it back,
/// [`seed`]).
pub fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.random_range(-4.0f32..4.0)).collect()
}

pub fn random_bf16(n: usize, seed: u64) -> Vec<bf16> {
    random_f32(n, seed).into_iter().map(bf16::from_f32).collect()
}

/// A fresh seed from the clock, or `RUTILE_TEST_SEED` when it is set ([`examples::seed`]).
pub fn seed() -> u64 {
    examples::seed().unwrap()
}

/// A name no other call in this process gives (the clock and a count; not [`seed`], which
/// `RUTILE_TEST_SEED` fixes): for temporary directories.
pub fn unique() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{}-{nanos}-{}", std::process::id(), COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Relative L2 error `|out - ref| / |ref|` (the benchmarks' definition).
pub use examples::workloads::rel_l2;

/// Every element of `out` within `bound` of `reference`, relative to `scale` (the size of
/// the terms each element adds up; `None`: the reference's magnitude), and the relative L2
/// error too: the bounds come from the arithmetic (`examples::workloads`), and the
/// elementwise check catches a wrong block that an L2 norm over many elements hides.
pub fn assert_close(what: &str, out: &[f64], reference: &[f64], scale: Option<&[f64]>, bound: f64) {
    let c = match scale {
        Some(s) => examples::workloads::check(out, reference, s, bound),
        None => examples::workloads::check_relative(out, reference, bound),
    };
    assert!(c.passed(), "{what}: {c}; got {} where the reference is {}", out[c.worst], reference[c.worst]);
}

/// Resident memory of this process, in bytes (Linux).
pub fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 4096
}

pub const SIZES: &[usize] = &[0, 1, 1023, 1025, 4096, 100_003];

/// Run the `#[ignore]`d test `name` of this binary in `n` processes at once, with `env`
/// set in each, and assert that every one succeeds (the multi-process halves of the cache
/// and tuning tests).
pub fn run_in_processes(name: &str, n: usize, env: &[(&str, &std::ffi::OsStr)]) {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..n)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([name, "--exact", "--ignored", "--test-threads=1"])
                .envs(env.iter().copied())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a concurrent `{name}` failed");
    }
}
