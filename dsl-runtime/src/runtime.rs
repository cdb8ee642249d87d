//! [`Runtime`]: the CUDA runtime or the interpreter, chosen by API or by environment, and
//! [`Buffer`]: memory that belongs to one of them.

use crate::driver::CudaRuntime;
use crate::error::{driver, Error, Result};
use crate::interp::Interpreter;
use crate::launch::{host, host_mut, slice_ctx, Arg, Bindings, InPtr, Kernel, LaunchConfig, Launcher, OutPtr, Safety};
use crate::Element;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

/// Where kernels run.
pub enum Runtime {
    Cuda(CudaRuntime),
    Interpreter(Interpreter),
}

impl Runtime {
    /// CUDA device `ordinal`.
    pub fn cuda(ordinal: usize) -> Result<Runtime> {
        Ok(Runtime::Cuda(CudaRuntime::new(ordinal)?))
    }

    /// The CPU interpreter.
    pub fn interpreter() -> Runtime {
        Runtime::Interpreter(Interpreter)
    }

    /// `RUTILE_INTERPRET=1`: the interpreter; otherwise CUDA device 0 (an error if there is
    /// none).
    pub fn from_env() -> Result<Runtime> {
        if std::env::var("RUTILE_INTERPRET").is_ok_and(|v| !v.is_empty() && v != "0") {
            return Ok(Runtime::interpreter());
        }
        Runtime::cuda(0)
    }

    /// Like [`from_env`](Runtime::from_env), but falls back to the interpreter when CUDA
    /// is not available, returning why.
    pub fn auto() -> (Runtime, Option<Error>) {
        match Runtime::from_env() {
            Ok(rt) => (rt, None),
            Err(e) => (Runtime::interpreter(), Some(e)),
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self, Runtime::Cuda(_))
    }

    /// The GPU's streaming multiprocessors; `None` on the interpreter.
    pub fn sm_count(&self) -> Option<u32> {
        match self {
            Runtime::Cuda(c) => Some(c.sm_count()),
            Runtime::Interpreter(_) => None,
        }
    }

    /// The GPU target kernels are compiled for; `None` on the interpreter.
    pub fn target(&self) -> Option<&crate::emit::Target> {
        match self {
            Runtime::Cuda(c) => Some(c.target()),
            Runtime::Interpreter(_) => None,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Runtime::Cuda(c) => c.describe(),
            Runtime::Interpreter(_) => "CPU interpreter".into(),
        }
    }

    /// Copy host data into a new buffer of this runtime.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer<T>> {
        match self {
            Runtime::Cuda(c) => Ok(Buffer::Device(c.stream().clone_htod(data).map_err(driver("cuMemcpyHtoD"))?)),
            Runtime::Interpreter(_) => Ok(Buffer::Host(data.to_vec())),
        }
    }

    /// A zero-filled buffer of `len` elements.
    pub fn zeros<T: Element>(&self, len: usize) -> Result<Buffer<T>> {
        match self {
            Runtime::Cuda(c) => Ok(Buffer::Device(c.stream().alloc_zeros(len).map_err(driver("cuMemAlloc"))?)),
            Runtime::Interpreter(_) => Ok(Buffer::Host(vec![T::from_f64(0.0); len])),
        }
    }

    /// Wait for all launched work.
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Runtime::Cuda(c) => c.synchronize(),
            Runtime::Interpreter(_) => Ok(()),
        }
    }
}

impl Launcher for Runtime {
    fn cuda_stream(&self) -> Option<&CudaStream> {
        match self {
            Runtime::Cuda(c) => c.cuda_stream(),
            Runtime::Interpreter(i) => i.cuda_stream(),
        }
    }
    unsafe fn launch_args(&self, kernel: &dyn Kernel, cfg: &LaunchConfig, args: &[Arg<'_>], safety: Safety) -> Result<()> {
        match self {
            // SAFETY: the caller upholds `launch_args`'s contract, which is the same for both.
            Runtime::Cuda(c) => unsafe { c.launch_args(kernel, cfg, args, safety) },
            Runtime::Interpreter(i) => unsafe { i.launch_args(kernel, cfg, args, safety) },
        }
    }
}

/// A buffer on the device of a [`Runtime`], or in host memory for the interpreter.
pub enum Buffer<T> {
    Host(Vec<T>),
    Device(CudaSlice<T>),
}

impl<T: Element> Buffer<T> {
    pub fn len(&self) -> usize {
        match self {
            Buffer::Host(v) => v.len(),
            Buffer::Device(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy the contents to the host (waits for the buffer's stream).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        match self {
            Buffer::Host(v) => Ok(v.clone()),
            Buffer::Device(s) => s.stream().clone_dtoh(s).map_err(driver("cuMemcpyDtoH")),
        }
    }
    /// Overwrite the contents from host data of the same length.
    pub fn copy_from(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len() {
            return Err(Error::Buffer(format!("copy of {} elements into a buffer of {}", data.len(), self.len())));
        }
        match self {
            Buffer::Host(v) => v.copy_from_slice(data),
            Buffer::Device(s) => {
                let stream = s.stream().clone();
                stream.memcpy_htod(data, s).map_err(driver("cuMemcpyHtoD"))?
            }
        }
        Ok(())
    }
}

impl<T: Element> InPtr<T> for &Buffer<T> {
    fn bind<'a>(&'a self, stream: Option<&'a CudaStream>, b: &mut Bindings<'a>) -> Arg<'a> {
        match self {
            Buffer::Host(v) => host(v),
            Buffer::Device(s) => bind_device(s, stream, b),
        }
    }
}

impl<T: Element> OutPtr<T> for &mut Buffer<T> {
    fn bind<'a>(&'a mut self, stream: Option<&'a CudaStream>, b: &mut Bindings<'a>) -> Arg<'a> {
        match self {
            Buffer::Host(v) => host_mut(v),
            Buffer::Device(s) => bind_device_mut(s, stream, b),
        }
    }
}

pub(crate) fn bind_device<'a, T: Element>(s: &'a CudaSlice<T>, stream: Option<&'a CudaStream>, b: &mut Bindings<'a>) -> Arg<'a> {
    match stream {
        Some(st) => {
            let (addr, g) = s.device_ptr(st);
            b.keep(g, st);
            Arg::Device { addr, len: s.len(), elem: T::DTYPE, writable: false, ctx: slice_ctx(s) }
        }
        None => Arg::Device { addr: 0, len: s.len(), elem: T::DTYPE, writable: false, ctx: slice_ctx(s) },
    }
}

pub(crate) fn bind_device_mut<'a, T: Element>(s: &'a mut CudaSlice<T>, stream: Option<&'a CudaStream>, b: &mut Bindings<'a>) -> Arg<'a> {
    let (len, ctx) = (s.len(), slice_ctx(s));
    match stream {
        Some(st) => {
            let (addr, g) = s.device_ptr_mut(st);
            b.keep(g, st);
            Arg::Device { addr, len, elem: T::DTYPE, writable: true, ctx }
        }
        None => Arg::Device { addr: 0, len, elem: T::DTYPE, writable: true, ctx },
    }
}
