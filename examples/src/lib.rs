//! Benchmark workloads shared by the `bench` example (timed on the GPU) and the test
//! suite (smoke mode on the interpreter), so every benchmark is also a correctness check.
//!
//! A later capability adds a row by adding a [`Workload`](workloads::Workload) to [`suite`](workloads::suite) and, for its
//! anchors, a function to `bench/anchors.py`.

pub mod gqa;
pub mod reference;
pub mod workloads;

use dsl_runtime::Runtime;

/// The runtime an example runs on: CUDA device 0 when there is one, else the CPU
/// interpreter; prints which (and why the GPU is not used).
pub fn runtime() -> Runtime {
    let (rt, fallback) = Runtime::auto();
    match &fallback {
        None => println!("running on {}", rt.describe()),
        Some(why) => println!("running on the CPU interpreter ({why})"),
    }
    rt
}

/// The seed of an example's or a test's random inputs: `RUTILE_TEST_SEED` where it is set
/// (to rerun a failure with the seed its message printed), else a fresh one from the clock.
///
/// ```
/// std::env::set_var("RUTILE_TEST_SEED", "42");
/// assert_eq!(examples::seed().unwrap(), 42);
/// ```
pub fn seed() -> Result<u64, String> {
    match std::env::var("RUTILE_TEST_SEED") {
        Ok(s) => s.trim().parse().map_err(|e| format!("RUTILE_TEST_SEED={s:?}: {e}")),
        Err(_) => Ok(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(|e| e.to_string())?.as_nanos() as u64),
    }
}

/// Median time of `f` over 50 runs after 10 warm-ups, in ms, timed with CUDA events on
/// the runtime's stream.
pub fn time_ms<E: std::error::Error + 'static>(cuda: &dsl_runtime::driver::CudaRuntime, mut f: impl FnMut() -> Result<(), E>) -> Result<f64, Box<dyn std::error::Error>> {
    const TIMING: dsl_runtime::cudarc::driver::sys::CUevent_flags = dsl_runtime::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    for _ in 0..10 {
        f()?;
    }
    let stream = cuda.stream();
    let mut times = vec![];
    for _ in 0..50 {
        let start = stream.record_event(Some(TIMING))?;
        f()?;
        let end = stream.record_event(Some(TIMING))?;
        end.synchronize()?;
        times.push(start.elapsed_ms(&end)? as f64);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// The repository README: its Rust snippets compile and run as this crate's doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
