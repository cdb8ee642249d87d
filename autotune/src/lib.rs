//! Autotuning for `#[kernel]` launches.
//!
//! A kernel author declares candidate configurations once (values of compile-time
//! parameters, `num_warps`, `num_stages`; listed or as a product of ranges), the launch
//! arguments that form the tuning key (bucketed, e.g. to the next power of two), and
//! optionally a pruning predicate and a cost-model top-k. Then every launch goes through
//! [`Autotuner::launch`]:
//!
//! 1. the first launch for a new (device, key) compiles and launches every candidate on
//!    the same inputs, each from the saved original outputs; a candidate that fails to
//!    build, compile, load (shared memory, registers) or launch is recorded with its reason
//!    and skipped; a candidate whose outputs differ from the first valid candidate's is
//!    rejected (it can never win); a candidate that would compile to the same code as an
//!    earlier one that did not fail (the same kernel and `num_warps`, another
//!    `num_stages`, where the kernel has no loop to pipeline) is not run, and recorded as
//!    [`Outcome::SameCodeAs`] that one;
//! 2. the valid candidates are timed with CUDA events ([`CudaTimer`]: median after
//!    warm-up, L2 flushed before every timed run as Triton's `do_bench` does; outputs
//!    restored before every launch for kernels marked [`reset_outputs`](Autotuner::reset_outputs));
//! 3. the outputs are restored and the fastest candidate is launched, so a tuned launch
//!    leaves the same result as one untuned launch;
//! 4. every outcome is persisted ([`store`]), under a lock, keyed by the kernel's IR and the
//!    compiler's fingerprint among others; later launches with that key go straight to the
//!    winner, and a new process built from the same compiler reuses the measurements.
//!
//! Several threads launching an untuned key tune it once (the others wait, then launch
//! the winner); several processes tuning one kernel keep each other's results. On the CPU
//! interpreter tuning checks the candidates but does not time them: it picks the first
//! valid one, deterministically, and says so in a warning.
//!
//! Problems that do not stop a launch (an unreadable, corrupt or other-schema results file,
//! an unwritable directory, a lock that cannot be taken, timing without an L2 flush, the
//! interpreter's untimed pick) are warnings through [`dsl_runtime::diag`]: logged with
//! `tracing` and printed once per kind per process on stderr (`RUTILE_WARNINGS`).
//!
//! Environment: `RUTILE_TUNE_LOG=1` prints each session (candidates, times, the winner) to
//! stderr; `RUTILE_TUNE=off` skips tuning and launches the first candidate;
//! `RUTILE_TUNE_DIR` / `RUTILE_TUNE_CACHE=off` place or disable the results file. A
//! progress bar appears on stderr when a sweep takes longer than a second and stderr is a
//! terminal.
//!
//! Compile-time parameters are types in Rust, so a configuration is turned into a kernel
//! by a match over the candidate values: [`dispatch!`].
//!
//! ```
//! use autotune::{dispatch, Autotuner, Bucket, Key, Space};
//! use dsl_runtime::prelude::*;
//! use dsl_runtime::Kernel;
//! use kernels_lib::{grid_for, relu_mul_add};
//!
//! let tuner = Autotuner::new("relu_mul_add_doc", Space::product().values("BLOCK", &[256, 1024]).warps(&[4]))
//!     .store(autotune::Store::new(None));
//! let rt = Runtime::interpreter();
//! let n = 3000;
//! let (a, b, c) = (rt.upload(&vec![1.0f32; n]).unwrap(), rt.upload(&vec![2.0f32; n]).unwrap(), rt.upload(&vec![0.5f32; n]).unwrap());
//! let mut out = rt.zeros::<f32>(n).unwrap();
//! let key = Key::new().with("n", n as i64, Bucket::NextPow2);
//! let cfg = tuner
//!     .launch(&rt, &key, &mut (&mut out,),
//!         &|cfg| dispatch!(cfg.get("BLOCK"), [256, 1024], |B| Box::new(relu_mul_add::<f32, B>::new()) as Box<dyn Kernel>),
//!         &mut |cfg, (out,)| dispatch!(cfg.get("BLOCK"), [256, 1024], |B| {
//!             let launch = grid_for(n, B).warps(cfg.num_warps).stages(cfg.num_stages);
//!             relu_mul_add::<f32, B>::launch(&rt, launch, &a, &b, &c, &mut **out, n as i32)
//!         }))
//!     .unwrap();
//! assert_eq!(cfg.get("BLOCK"), 256); // the interpreter takes the first valid candidate
//! assert_eq!(out.to_vec().unwrap()[0], 2.5);
//! ```

pub mod config;
pub mod key;
pub mod outputs;
pub mod store;
pub mod timer;
pub mod tuner;

pub use config::{Config, Space};
pub use key::{Bucket, Key};
pub use outputs::{OutBuf, Outputs};
pub use store::{Entry, Store};
pub use timer::{CudaTimer, FakeTimer, L2Flush, Timer};
pub use tuner::{Autotuner, Outcome, Session, TuneError};

/// Turn a runtime value into a compile-time constant: `dispatch!(v, [256, 512], |B| expr)`
/// evaluates `expr` with `const B: usize` equal to `v` when `v` is one of the listed
/// values, giving `Some(expr)`, else `None`.
#[macro_export]
macro_rules! dispatch {
    ($value:expr, [$($c:literal),+ $(,)?], |$name:ident| $body:expr) => {
        match $value {
            $( $c => {
                #[allow(non_upper_case_globals)]
                const $name: usize = $c;
                ::core::option::Option::Some($body)
            } )+
            _ => ::core::option::Option::None,
        }
    };
}
