//! How candidates are timed: CUDA events on the launch stream (median after warm-up, the
//! L2 cache flushed before every launch), or a fake clock for tests that launches just as
//! often.
//!
//! [`CudaTimer`] is also what `bench` times with, so the tuner's choices and the
//! benchmark tables come from one measurement, the same one as Triton's `do_bench`.

use crate::config::Config;
use dsl_runtime::cudarc::driver::sys::CUevent_flags;
use dsl_runtime::cudarc::driver::CudaSlice;
use dsl_runtime::diag::{warn, Warning};
use dsl_runtime::driver::CudaRuntime;
use dsl_runtime::{Error, Result};
use std::sync::Mutex;

/// Times one candidate in milliseconds: `warmup` untimed launches, then `reps` (at least
/// one) timed ones; `prepare` runs before every launch, outside the measurement (restoring
/// outputs of accumulating kernels); `run` is the launch.
pub trait Timer: Send + Sync {
    fn time(&self, cfg: &Config, warmup: usize, reps: usize, prepare: &mut dyn FnMut() -> Result<()>, run: &mut dyn FnMut() -> Result<()>) -> Result<f64>;
}

/// Evicts the L2 cache: a memset of [`L2Flush::BYTES`] on the stream. Without it a
/// problem that fits in L2 (50 MB on the H100) is timed with its inputs, or the previous
/// launch's dirty outputs, already there; the result can be faster or slower than a cold
/// launch (measured on RMSNorm 4096 x 4096 bf16 at 8 warps: 27.8 µs flushed, 31.8 µs not;
/// Triton's kernel 28.1 and 46.3 µs).
/// Triton's `do_bench` flushes the same way, so our tables compare with its numbers.
pub struct L2Flush(Mutex<CudaSlice<u8>>);

impl L2Flush {
    /// 256 MB, Triton's choice: five times the H100's L2.
    pub const BYTES: usize = 256 << 20;

    pub fn new(rt: &CudaRuntime) -> Result<L2Flush> {
        Ok(L2Flush(Mutex::new(rt.stream().alloc_zeros::<u8>(Self::BYTES).map_err(driver("cuMemAlloc"))?)))
    }

    pub fn run(&self, rt: &CudaRuntime) -> Result<()> {
        let mut buf = self.0.lock().unwrap_or_else(|p| p.into_inner());
        rt.stream().memset_zeros(&mut *buf).map_err(driver("cuMemsetD8Async"))
    }
}

/// CUDA events around each launch: `warmup` untimed launches, then the median of `reps`,
/// each after an [`L2Flush`] (outside the events) when `flush` is set.
pub struct CudaTimer<'a> {
    pub rt: &'a CudaRuntime,
    pub warmup: usize,
    pub reps: usize,
    pub flush: Option<L2Flush>,
}

impl<'a> CudaTimer<'a> {
    /// A timer that flushes L2 before every timed launch; when the 256 MB it needs cannot
    /// be allocated, one that does not (with a warning), since timing still works.
    pub fn new(rt: &'a CudaRuntime, warmup: usize, reps: usize) -> CudaTimer<'a> {
        let flush = L2Flush::new(rt)
            .map_err(|e| warn(Warning::TuneFallback, format!("timing without flushing L2 (the {} MB buffer could not be allocated: {e}): times of problems that fit in L2 are not those of a cold launch", L2Flush::BYTES >> 20)))
            .ok();
        CudaTimer { rt, warmup, reps, flush }
    }

    /// The median time of `run` in milliseconds; `prepare` runs before every launch,
    /// outside the measurement.
    pub fn median_ms(&self, prepare: &mut dyn FnMut() -> Result<()>, run: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        self.median_of(self.warmup, self.reps, prepare, run)
    }

    fn median_of(&self, warmup: usize, reps: usize, prepare: &mut dyn FnMut() -> Result<()>, run: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        for _ in 0..warmup {
            prepare()?;
            run()?;
        }
        let s = self.rt.stream();
        let mut t = vec![];
        for _ in 0..reps.max(1) {
            prepare()?;
            if let Some(f) = &self.flush {
                f.run(self.rt)?;
            }
            let a = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver("cuEventRecord"))?;
            run()?;
            let b = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver("cuEventRecord"))?;
            b.synchronize().map_err(driver("cuEventSynchronize"))?;
            t.push(a.elapsed_ms(&b).map_err(driver("cuEventElapsedTime"))? as f64);
        }
        t.sort_by(|x, y| x.total_cmp(y));
        Ok(t[t.len() / 2])
    }
}

fn driver(call: &'static str) -> impl Fn(dsl_runtime::cudarc::driver::DriverError) -> Error {
    move |source| Error::Driver { call, source }
}

impl Timer for CudaTimer<'_> {
    fn time(&self, _: &Config, warmup: usize, reps: usize, prepare: &mut dyn FnMut() -> Result<()>, run: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        self.median_of(warmup, reps, prepare, run)
    }
}

/// A clock for tests: every launch of `cfg` "takes" `f(cfg)` milliseconds (`f` is called
/// once per candidate). The launches still run, as many as [`CudaTimer`] makes, each after
/// `prepare`, so results are checked and accumulating kernels see what they would on a GPU.
pub struct FakeTimer<F: Fn(&Config) -> f64 + Send + Sync>(pub F);

impl<F: Fn(&Config) -> f64 + Send + Sync> Timer for FakeTimer<F> {
    fn time(&self, cfg: &Config, warmup: usize, reps: usize, prepare: &mut dyn FnMut() -> Result<()>, run: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        for _ in 0..warmup + reps.max(1) {
            prepare()?;
            run()?;
        }
        Ok((self.0)(cfg))
    }
}
