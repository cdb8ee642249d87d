//! Errors. Every error that concerns a kernel names it, and where it can, the
//! specialization and the line of the kernel's source that caused it.

use std::fmt;

pub use crate::ir::BuildError;

/// A compile stage's failure, before the driver of the pipeline ([`crate::compile`])
/// names the kernel and specialization it happened in ([`Error::Compile`]). Every stage
/// after IR building (lowering, emission) returns this one type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{stage} failed: {message}")]
pub struct StageError {
    pub stage: &'static str,
    pub message: String,
}

impl StageError {
    pub fn new(stage: &'static str, message: impl Into<String>) -> StageError {
        StageError { stage, message: message.into() }
    }
}

/// Which kernel, with which specialization, and where in its source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSite {
    pub kernel: String,
    /// The compile-time constants and argument properties, e.g. `BLOCK=1024, n%16==0`.
    pub spec: String,
    /// `file:line` of the kernel source, when known.
    pub at: Option<String>,
}

impl fmt::Display for KernelSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel `{}`", self.kernel)?;
        if !self.spec.is_empty() {
            write!(f, " [{}]", self.spec)?;
        }
        if let Some(at) = &self.at {
            write!(f, " at {at}")?;
        }
        Ok(())
    }
}

/// The error type of the whole runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel's IR could not be built or verified for this specialization.
    #[error("{site}: {message}")]
    Build { site: KernelSite, message: String },
    /// A compile stage (passes, LLVM lowering, PTX emission, module load) failed.
    #[error("{site}: {stage} failed: {message}")]
    Compile { site: KernelSite, stage: &'static str, message: String },
    /// The arguments of a launch do not fit the kernel or the launcher.
    #[error("kernel `{kernel}`: bad launch: {message}")]
    Launch { kernel: String, message: String },
    /// A running kernel failed a check: an out-of-bounds access or a failed
    /// `device_assert` found by the interpreter, or an out-of-bounds access found by a
    /// checked GPU launch (the same message for the same access).
    #[error("{site}: {message}")]
    Interpret { site: KernelSite, message: String },
    /// No usable CUDA driver or device.
    #[error("CUDA is not available: {0}")]
    NoCuda(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {call}: {source}")]
    Driver {
        call: &'static str,
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// A buffer operation failed (size mismatch, wrong device).
    #[error("buffer: {0}")]
    Buffer(String),
    /// Launches could not be recorded into a CUDA graph (a checked launch, a capture inside
    /// a capture; see [`CudaRuntime::capture`](crate::driver::CudaRuntime::capture)).
    #[error("CUDA graph capture: {0}")]
    Capture(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The message for a lane that accessed `buffer[offset]` outside its `len` elements while
/// its mask was true: one text for the interpreter and for checked GPU launches, so the same
/// mistake reads the same on both.
pub fn out_of_bounds(what: &str, buffer: &str, offset: i64, len: u64) -> String {
    format!("out-of-bounds {what}: `{buffer}[{offset}]` with `{buffer}` of length {len} (the lane's mask was true)")
}

/// Attach the driver call's name to a cudarc error.
pub(crate) fn driver(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |source| Error::Driver { call, source }
}
