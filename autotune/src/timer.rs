//! How candidates are timed: CUDA events on the launch stream (median after warm-up), or
//! a fake clock for tests.

use crate::config::Config;
use dsl_runtime::cudarc::driver::sys::CUevent_flags;
use dsl_runtime::driver::CudaRuntime;
use dsl_runtime::{Error, Result};

/// Times one candidate: `prepare` runs before every launch, outside the measurement
/// (restoring outputs of accumulating kernels); `run` is the launch.
pub trait Timer: Send + Sync {
    fn time(&self, cfg: &Config, prepare: &mut dyn FnMut() -> Result<()>, run: &mut dyn FnMut() -> Result<()>) -> Result<f64>;
}

/// CUDA events around each launch: `warmup` untimed launches, then the median of `reps`.
pub struct CudaTimer<'a> {
    pub rt: &'a CudaRuntime,
    pub warmup: usize,
    pub reps: usize,
}

fn driver(call: &'static str) -> impl Fn(dsl_runtime::cudarc::driver::DriverError) -> Error {
    move |source| Error::Driver { call, source }
}

impl Timer for CudaTimer<'_> {
    fn time(&self, _: &Config, prepare: &mut dyn FnMut() -> Result<()>, run: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        for _ in 0..self.warmup {
            prepare()?;
            run()?;
        }
        let s = self.rt.stream();
        let mut t = vec![];
        for _ in 0..self.reps.max(1) {
            prepare()?;
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

/// A clock for tests: every launch of `cfg` "takes" `f(cfg)` milliseconds. The launches
/// still run (so results are still checked).
pub struct FakeTimer<F: Fn(&Config) -> f64 + Send + Sync>(pub F);

impl<F: Fn(&Config) -> f64 + Send + Sync> Timer for FakeTimer<F> {
    fn time(&self, cfg: &Config, prepare: &mut dyn FnMut() -> Result<()>, run: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        prepare()?;
        run()?;
        Ok((self.0)(cfg))
    }
}
