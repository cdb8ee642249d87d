//! The library kernels on a CUDA device, against CPU references and the interpreter.
//! Built with `--features gpu` (ignored otherwise) and run on the GPU machine.

use crate::common::*;
use dsl_runtime::cache::DiskCache;
use dsl_runtime::driver::CudaRuntime;
use dsl_runtime::prelude::*;
use dsl_runtime::{Error, Runtime};
use kernels_lib::*;

fn cuda() -> CudaRuntime {
    let mut rt = CudaRuntime::new(0).expect("a CUDA device");
    // Each test compiles from scratch into its own cache directory.
    let dir = std::env::temp_dir().join(format!("rutile-gpu-test-{}", crate::common::unique()));
    rt.set_disk_cache(DiskCache::new(Some(dir)));
    rt
}

#[test]
fn no_cuda_is_a_clear_error() {
    // Runs everywhere: on a machine without a driver the error says so instead of panicking.
    match Runtime::cuda(0) {
        Ok(_) => {}
        Err(Error::NoCuda(msg)) => assert!(!msg.is_empty()),
        Err(other) => panic!("unexpected error without CUDA: {other}"),
    }
}

/// A capture: nothing runs until the replay, each replay runs every recorded launch; a
/// launch another thread makes on the runtime meanwhile runs at once and is not recorded;
/// a capture whose recording fails, or one inside another, is an `Err` that leaves the
/// runtime working; a checked launch cannot be recorded.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn captured_launches_replay() {
    let rt = cuda();
    let n = 5000;
    let x = random_f32(n, seed());
    let mut acc = rt.stream().clone_htod(&x).unwrap();
    let mut other = rt.stream().clone_htod(&x).unwrap();
    let ones = rt.stream().clone_htod(&vec![1.0f32; n]).unwrap();
    let add2 = |acc: &mut dsl_runtime::cudarc::driver::CudaSlice<f32>| axpy::<1024>::launch(&rt, grid_for(n, 1024), 2.0, &ones, acc, n as i64);
    let now = |acc: &dsl_runtime::cudarc::driver::CudaSlice<f32>| rt.stream().clone_dtoh(acc).unwrap();
    add2(&mut acc).unwrap(); // loads the kernel: x + 2
    let graph = rt
        .capture(|| {
            add2(&mut acc)?;
            // Another thread's launch on the same runtime, during the capture.
            std::thread::scope(|s| s.spawn(|| add2(&mut other)).join().expect("the other thread"))?;
            add2(&mut acc)
        })
        .unwrap();
    assert!(now(&acc).iter().zip(&x).all(|(g, x)| *g == x + 2.0), "the capture ran nothing");
    assert!(now(&other).iter().zip(&x).all(|(g, x)| *g == x + 2.0), "the other thread's launch ran");
    for k in 1..=3 {
        // SAFETY: `acc` and `ones`, the buffers of the recorded launches, are alive.
        unsafe { graph.replay() }.unwrap();
        assert!(now(&acc).iter().zip(&x).all(|(g, x)| *g == x + 2.0 + 4.0 * k as f32), "replay {k}");
    }
    assert!(now(&other).iter().zip(&x).all(|(g, x)| *g == x + 2.0), "the other thread's launch is not in the graph");
    let failed = rt.capture(|| Err(Error::Buffer("stop".into())));
    assert!(matches!(failed, Err(Error::Buffer(_))), "{failed:?}");
    let nested = rt.capture(|| rt.capture(|| add2(&mut acc)).map(drop));
    assert!(matches!(nested, Err(Error::Capture(_))), "{nested:?}");
    let mut spare = rt.stream().clone_htod(&x).unwrap();
    axpy::<1024>::launch(&rt, grid_for(n, 1024).debug(true), 2.0, &ones, &mut spare, n as i64).unwrap(); // loads the checked kernel
    let checked = rt.capture(|| axpy::<1024>::launch(&rt, grid_for(n, 1024).debug(true), 2.0, &ones, &mut acc, n as i64));
    assert!(matches!(checked, Err(Error::Capture(_))), "{checked:?}");
    add2(&mut acc).unwrap();
    assert!(now(&acc).iter().zip(&x).all(|(g, x)| *g == x + 16.0), "the runtime launches again after failed captures");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn relu_mul_add_matches_cpu_on_gpu() {
    let rt = cuda();
    let s = rt.stream();
    for &n in SIZES.iter().chain(&[1 << 22]) {
        let sd = seed();
        let (a, b, c) = (random_f32(n, sd), random_f32(n, sd + 1), random_f32(n, sd + 2));
        let (da, db, dc) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap(), s.clone_htod(&c).unwrap());
        let mut out = s.clone_htod(&vec![f32::NAN; n.max(1)]).unwrap();
        let mut view = out.slice_mut(0..n);
        relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024), &da, &db, &dc, &mut view, n as i32).unwrap();
        let got = s.clone_dtoh(&out).unwrap();
        for i in 0..n {
            assert_eq!(got[i], a[i].max(0.0) * b[i] + c[i], "n={n} i={i} seed={sd}");
        }
        let (ha, hb, hc) = (random_bf16(n, sd), random_bf16(n, sd + 1), random_bf16(n, sd + 2));
        let (da, db, dc) = (s.clone_htod(&ha).unwrap(), s.clone_htod(&hb).unwrap(), s.clone_htod(&hc).unwrap());
        let mut out = s.clone_htod(&vec![bf16::NAN; n.max(1)]).unwrap();
        let mut view = out.slice_mut(0..n);
        relu_mul_add::<bf16, 2048>::launch(&rt, grid_for(n, 2048), &da, &db, &dc, &mut view, n as i32).unwrap();
        let got = s.clone_dtoh(&out).unwrap();
        let r = |x: f32| bf16::from_f32(x).to_f32();
        for i in 0..n {
            let want = r(r(ha[i].to_f32().max(0.0) * hb[i].to_f32()) + hc[i].to_f32());
            assert_eq!(got[i].to_f32(), want, "bf16 n={n} i={i} seed={sd}");
        }
        // The same kernel in f16: each operation rounds to f16.
        let h = |v: Vec<f32>| -> Vec<f16> { v.into_iter().map(f16::from_f32).collect() };
        let (ha, hb, hc) = (h(random_f32(n, sd + 3)), h(random_f32(n, sd + 4)), h(random_f32(n, sd + 5)));
        let (da, db, dc) = (s.clone_htod(&ha).unwrap(), s.clone_htod(&hb).unwrap(), s.clone_htod(&hc).unwrap());
        let mut out = s.clone_htod(&vec![f16::NAN; n.max(1)]).unwrap();
        let mut view = out.slice_mut(0..n);
        relu_mul_add::<f16, 2048>::launch(&rt, grid_for(n, 2048), &da, &db, &dc, &mut view, n as i32).unwrap();
        let got = s.clone_dtoh(&out).unwrap();
        let r = |x: f32| f16::from_f32(x).to_f32();
        for i in 0..n {
            let want = r(r(ha[i].to_f32().max(0.0) * hb[i].to_f32()) + hc[i].to_f32());
            assert_eq!(got[i].to_f32(), want, "f16 n={n} i={i} seed={sd}");
        }
    }
}

/// Every library kernel on the GPU gives what the interpreter gives.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn library_kernels_agree_with_the_interpreter() {
    let gpu = Runtime::Cuda(cuda());
    let cpu = Runtime::interpreter();
    let n = 100_003;
    let sd = seed();
    let x = random_f32(n, sd);
    let y = random_f32(n, sd + 1);
    let run_both = |f: &dyn Fn(&Runtime) -> Vec<f64>| (f(&gpu), f(&cpu));

    let (g, c) = run_both(&|rt| {
        let (dx, mut dy) = (rt.upload(&x).unwrap(), rt.upload(&y).unwrap());
        axpy::<1024>::launch(rt, grid_for(n, 1024), 0.75, &dx, &mut dy, n as i64).unwrap();
        dy.to_vec().unwrap().into_iter().map(f64::from).collect()
    });
    assert_eq!(g, c, "axpy seed={sd}");

    let (g, c) = run_both(&|rt| {
        let (dx, mut o) = (rt.upload(&x).unwrap(), rt.upload(&vec![f32::NAN; n]).unwrap());
        gelu_tanh::<512>::launch(rt, grid_for(n, 512), &dx, &mut o, n as i32).unwrap();
        o.to_vec().unwrap().into_iter().map(f64::from).collect()
    });
    // The GPU's tanh.approx against the interpreter's exact tanh: off by TANH_APPROX_F32
    // relative to |t| <= 1, plus a few f32 roundings, relative to the terms 0.5 |v| (1 + |t|).
    use examples::workloads::{TANH_APPROX_F32, U_BF16, U_F32};
    let (_, scale) = examples::workloads::gelu_terms(&x);
    assert_close(&format!("gelu (tanh.approx) seed={sd}"), &g, &c, Some(&scale), TANH_APPROX_F32 + 8.0 * U_F32);

    let (gb, ub) = (random_bf16(n, sd + 2), random_bf16(n, sd + 3));
    let (g, c) = run_both(&|rt| {
        let (dg, du, mut o) = (rt.upload(&gb).unwrap(), rt.upload(&ub).unwrap(), rt.upload(&vec![bf16::NAN; n]).unwrap());
        silu_mul::<1024>::launch(rt, grid_for(n, 1024), &dg, &du, &mut o, n as i32).unwrap();
        o.to_vec().unwrap().into_iter().map(|v| v.to_f64()).collect()
    });
    // The same roundings on both sides except ex2.approx: the f32 results differ by a few
    // ulps, so a bf16 result is the same or one bf16 ulp (2u relative) away.
    assert_close(&format!("silu_mul seed={sd}"), &g, &c, None, 2.0 * U_BF16 * 1.01);

    let (g, c) = run_both(&|rt| {
        let (dx, mut o) = (rt.upload(&x).unwrap(), rt.upload(&vec![bf16::NAN; n]).unwrap());
        convert::<f32, bf16, 1024>::launch(rt, grid_for(n, 1024), &dx, &mut o, n as i32).unwrap();
        let h = o.to_vec().unwrap();
        let dh = rt.upload(&h).unwrap();
        let mut back = rt.upload(&vec![f32::NAN; n]).unwrap();
        convert::<bf16, f32, 1024>::launch(rt, grid_for(n, 1024), &dh, &mut back, n as i32).unwrap();
        back.to_vec().unwrap().into_iter().map(f64::from).collect()
    });
    assert_eq!(g, c, "conversions seed={sd}");

    let xi: Vec<i32> = x.iter().map(|v| (v * 100.0) as i32).collect();
    let (g, c) = run_both(&|rt| {
        let (dx, mut o, mut fl) = (rt.upload(&xi).unwrap(), rt.upload(&vec![0i32; n]).unwrap(), rt.upload(&vec![9u8; n]).unwrap());
        clamp_i32::<256>::launch(rt, grid_for(n, 256), &dx, &mut o, &mut fl, -150, 200, n as i32).unwrap();
        o.to_vec().unwrap().into_iter().map(f64::from).chain(fl.to_vec().unwrap().into_iter().map(f64::from)).collect()
    });
    assert_eq!(g, c, "clamp seed={sd}");

    let xs: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let (g, c) = run_both(&|rt| {
        let (dx, mut o) = (rt.upload(&xs).unwrap(), rt.upload(&vec![f16::NAN; n]).unwrap());
        scale_shift::<1024>::launch(rt, grid_for(n, 1024).warps(8), &dx, &mut o, 0.5, -1.25, n as i32).unwrap();
        o.to_vec().unwrap().into_iter().map(|v| v.to_f64()).collect()
    });
    assert_eq!(g, c, "scale_shift seed={sd}");
}

/// Buffers at odd offsets (unaligned views) and odd lengths take the scalar path and are
/// still right.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn unaligned_views_are_correct() {
    let rt = cuda();
    let s = rt.stream();
    let n = 10_001;
    let sd = seed();
    let (a, b, c) = (random_f32(n + 3, sd), random_f32(n + 3, sd + 1), random_f32(n + 3, sd + 2));
    let (da, db, dc) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap(), s.clone_htod(&c).unwrap());
    let mut out = s.clone_htod(&vec![f32::NAN; n + 3]).unwrap();
    let mut view = out.slice_mut(3..n + 3);
    relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024), &da.slice(1..n + 1), &db.slice(2..n + 2), &dc.slice(3..n + 3), &mut view, n as i32).unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    assert!(got[..3].iter().all(|v| v.is_nan()));
    for i in 0..n {
        assert_eq!(got[i + 3], a[i + 1].max(0.0) * b[i + 2] + c[i + 3], "i={i}");
    }
}

/// The safe launch cannot read or write past a buffer even when the kernel's mask says so.
/// Reads: `c` is a view of 4000 elements followed by NaNs in the same allocation; lanes past
/// the view must read `other` (0), so the output there is `relu(a) * b` and finite (without
/// the read guard they would read the NaNs). Writes: the output view is shorter than `n`
/// and the elements after it must stay untouched.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn guarded_launch_stays_inside_its_buffers() {
    let rt = cuda();
    let s = rt.stream();
    let n = 5000;
    let short = 4000;
    let sd = seed();
    let (a, b, mut c) = (random_f32(n, sd), random_f32(n, sd + 1), random_f32(n, sd + 2));
    c[short..].iter_mut().for_each(|v| *v = f32::NAN);
    let (da, db, dc) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap(), s.clone_htod(&c).unwrap());
    let mut out = s.clone_htod(&vec![f32::NAN; n]).unwrap();
    relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024), &da, &db, &dc.slice(0..short), &mut out, n as i32).unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    for i in 0..n {
        let ci = if i < short { c[i] } else { 0.0 };
        assert_eq!(got[i], a[i].max(0.0) * b[i] + ci, "i={i}: a guarded read past `c` must give 0");
    }

    let mut out = s.clone_htod(&vec![f32::NAN; n]).unwrap();
    let mut view = out.slice_mut(0..short);
    relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024), &da, &db, &dc, &mut view, n as i32).unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    for i in 0..short {
        assert_eq!(got[i], a[i].max(0.0) * b[i] + c[i], "i={i}");
    }
    assert!(got[short..].iter().all(|v| v.is_nan()), "a guarded launch wrote past its output view");
}

/// More than 2^31 elements with `i64` offsets: the elements past 2^31 are addressed
/// correctly (an `i32` offset would wrap and write the start of the buffer again), checked
/// at the tail and at the head.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn offsets_past_2_pow_31_address_the_right_elements() {
    let rt = cuda();
    let s = rt.stream();
    let n: usize = (1 << 31) + 4099;
    let pattern = |i: usize| ((i % 1021) as f32) * 0.5 - 100.0;
    let x: Vec<f32> = (0..n).map(pattern).collect();
    let dx = s.clone_htod(&x).unwrap();
    drop(x);
    let mut dy = s.alloc_zeros::<f32>(n).unwrap();
    let y0 = |i: usize| ((i % 997) as f32) - 7.0;
    let init: Vec<f32> = (0..n).map(y0).collect();
    s.memcpy_htod(&init, &mut dy).unwrap();
    drop(init);
    axpy::<1024>::launch(&rt, grid_for(n, 1024), 0.75, &dx, &mut dy, n as i64).unwrap();
    let tail = 1 << 20;
    let got_tail = s.clone_dtoh(&dy.slice(n - tail..n)).unwrap();
    let got_head = s.clone_dtoh(&dy.slice(0..tail)).unwrap();
    for k in 0..tail {
        let i = n - tail + k;
        assert_eq!(got_tail[k], 0.75 * pattern(i) + y0(i), "element {i}");
        assert_eq!(got_head[k], 0.75 * pattern(k) + y0(k), "element {k}");
    }
}

/// The CPU half is `cache::one_generic_function_runs_on_every_launcher`.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn one_generic_function_runs_on_every_launcher_on_gpu() {
    fn run<L: Launcher + ?Sized>(l: &L, rt: &CudaRuntime) -> Vec<f32> {
        let x: Vec<f32> = (0..100).map(|i| i as f32 - 50.5).collect();
        let dx = rt.stream().clone_htod(&x).unwrap();
        let mut out = rt.stream().clone_htod(&vec![f32::NAN; 100]).unwrap();
        relu_mul_add::<f32, 64>::launch(l, LaunchConfig::grid(2), &dx, &dx, &dx, &mut out, 100).unwrap();
        rt.stream().clone_dtoh(&out).unwrap()
    }
    let want: Vec<f32> = (0..100).map(|i| { let x = i as f32 - 50.5; x.max(0.0) * x + x }).collect();
    let rt = cuda();
    assert_eq!(run(&rt, &rt), want);
    let via_enum = Runtime::Cuda(cuda());
    let Runtime::Cuda(inner) = &via_enum else { unreachable!() };
    assert_eq!(run(&via_enum, inner), want);
}

/// Launch arguments that the device cannot take are `Err`s, and the context stays usable:
/// memory of another CUDA context, a grid over the device's limits, an allocation larger
/// than the device.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn bad_launches_and_allocations_are_errors_on_gpu() {
    use dsl_runtime::cudarc::driver::sys;
    let rt = cuda();
    let s = rt.stream();
    let n = 1024;
    let x = s.clone_htod(&random_f32(n, seed())).unwrap();
    let mut out = s.alloc_zeros::<f32>(n).unwrap();
    // Another context on the same device, with memory of its own.
    let foreign = unsafe {
        let mut ctx = std::ptr::null_mut();
        sys::cuCtxCreate_v2(&mut ctx, 0, rt.context().cu_device()).result().unwrap();
        let mut p = 0;
        sys::cuMemAlloc_v2(&mut p, n * 4).result().unwrap();
        rt.context().bind_to_thread().unwrap();
        (ctx, p)
    };
    let theirs = unsafe { s.upgrade_device_ptr::<f32>(foreign.1, n) };
    let err = relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024), &theirs.slice(0..n), &x, &x, &mut out, n as i32).unwrap_err();
    assert!(err.to_string().contains("another CUDA context"), "{err}");
    theirs.leak();
    unsafe {
        sys::cuCtxSetCurrent(foreign.0).result().unwrap();
        sys::cuMemFree_v2(foreign.1).result().unwrap();
        sys::cuCtxDestroy_v2(foreign.0).result().unwrap();
    }
    rt.context().bind_to_thread().unwrap();
    let err = relu_mul_add::<f32, 1024>::launch(&rt, LaunchConfig::grid3(1, 1 << 16, 1), &x, &x, &x, &mut out, n as i32).unwrap_err();
    assert!(err.to_string().contains("larger than the device allows"), "{err}");
    // A device that is not there.
    match Runtime::cuda(64) {
        Err(Error::NoCuda(m)) => assert!(m.contains("device 64 was requested"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("device 64 exists?"),
    }
    // Out of device memory: an error, not a panic.
    let err = Runtime::Cuda(cuda()).zeros::<f32>(1 << 38).err().expect("1 TiB does not fit");
    assert!(err.to_string().contains("cuMemAlloc"), "{err}");
    // And the context still works.
    relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024), &x, &x, &x, &mut out, n as i32).unwrap();
    rt.synchronize().unwrap();
}

/// 10,000 launches and 1,000 failed loads grow neither host nor device memory. The
/// failures go the whole way: a transpose tile that needs more shared memory than the
/// device allows is compiled (once; then from the disk cache), linked, loaded as a module,
/// refused, and unloaded, every time. In a process of its own: the other tests of this
/// binary allocate host and device memory concurrently.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn many_launches_and_failed_loads_do_not_grow_memory_on_gpu() {
    crate::common::run_in_processes("gpu::child_memory_growth_on_gpu", 1, &[("RUTILE_TEST_CHILD", "1".as_ref())]);
}

#[test]
#[ignore = "run by many_launches_and_failed_loads_do_not_grow_memory_on_gpu"]
fn child_memory_growth_on_gpu() {
    if std::env::var_os("RUTILE_TEST_CHILD").is_none() {
        return;
    }
    let rt = cuda();
    let s = rt.stream();
    let n = 1 << 16;
    let x = s.clone_htod(&random_f32(n, seed())).unwrap();
    let mut out = s.alloc_zeros::<f32>(n).unwrap();
    let free = || {
        let (mut f, mut t) = (0usize, 0usize);
        unsafe { dsl_runtime::cudarc::driver::sys::cuMemGetInfo_v2(&mut f, &mut t) }.result().unwrap();
        f
    };
    let round = |launches: usize, fails: usize, out: &mut dsl_runtime::cudarc::driver::CudaSlice<f32>| {
        for _ in 0..launches {
            relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024), &x, &x, &x, &mut *out, n as i32).unwrap();
        }
        for _ in 0..fails {
            let err = transpose::<256>::launch(&rt, LaunchConfig::grid3(1, 1, 1).warps(32), &x, &mut *out, 256, 256).unwrap_err();
            assert!(err.to_string().contains("KB of shared memory"), "{err}");
        }
        rt.synchronize().unwrap();
    };
    round(1000, 10, &mut out);
    let (host0, dev0) = (rss(), free());
    round(10_000, 1_000, &mut out);
    let (host1, dev1) = (rss(), free());
    eprintln!("host memory {} KB -> {} KB; free device memory {} MB -> {} MB", host0 >> 10, host1 >> 10, dev0 >> 20, dev1 >> 20);
    assert!(host1.saturating_sub(host0) < 16 << 20, "host memory grew by {} KB", (host1 - host0) >> 10);
    assert!(dev0.saturating_sub(dev1) < 4 << 20, "device memory shrank by {} KB", (dev0 - dev1) >> 10);
}

/// Identical launches compile once; a new runtime on the same disk cache compiles nothing
/// and loads the cached cubin; a corrupt entry is recompiled.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn caches_compile_once_and_survive_corruption() {
    let dir = std::env::temp_dir().join(format!("rutile-gpu-cache-{}", crate::common::unique()));
    let n = 3000;
    let launch_twice = |rt: &CudaRuntime| {
        let s = rt.stream();
        let x = random_f32(n, 5);
        let (a, b, c) = (s.clone_htod(&x).unwrap(), s.clone_htod(&x).unwrap(), s.clone_htod(&x).unwrap());
        let mut out = s.alloc_zeros::<f32>(n).unwrap();
        for _ in 0..2 {
            relu_mul_add::<f32, 1024>::launch(rt, grid_for(n, 1024), &a, &b, &c, &mut out, n as i32).unwrap();
        }
        let got = s.clone_dtoh(&out).unwrap();
        assert!((0..n).all(|i| got[i] == x[i].max(0.0) * x[i] + x[i]));
    };
    let mut rt = CudaRuntime::new(0).unwrap();
    rt.set_disk_cache(DiskCache::new(Some(dir.clone())));
    launch_twice(&rt);
    assert_eq!((rt.compiler().stats().compiled, rt.loaded_kernels()), (1, 1));

    let mut rt2 = CudaRuntime::new(0).unwrap();
    rt2.set_disk_cache(DiskCache::new(Some(dir.clone())));
    launch_twice(&rt2);
    assert_eq!((rt2.compiler().stats().compiled, rt2.compiler().stats().disk_hits), (0, 1));

    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x5a;
        std::fs::write(&p, bytes).unwrap();
    }
    let mut rt3 = CudaRuntime::new(0).unwrap();
    rt3.set_disk_cache(DiskCache::new(Some(dir)));
    launch_twice(&rt3);
    assert_eq!(rt3.compiler().stats().compiled, 1, "a corrupt entry is recompiled");
}

/// Host buffers are refused by the CUDA launcher with an error, not a crash.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn host_buffers_are_refused_on_the_gpu() {
    let rt = cuda();
    let x = vec![1.0f32; 16];
    let mut out = vec![0.0f32; 16];
    let err = relu_mul_add::<f32, 1024>::launch(&rt, grid_for(16, 1024), &x, &x, &x, &mut out, 16).unwrap_err();
    assert!(err.to_string().contains("host memory"), "{err}");
}

/// Compare a GPU run with an interpreter run of the same launch: `f` launches on a
/// runtime with inputs uploaded there and returns the outputs as f64.
fn gpu_vs_interp(name: &str, tol: f64, f: impl Fn(&Runtime) -> Vec<Vec<f64>>) {
    let gpu = Runtime::Cuda(cuda());
    let (g, i) = (f(&gpu), f(&Runtime::interpreter()));
    for (k, (a, b)) in g.iter().zip(&i).enumerate() {
        assert!(!a.iter().any(|x| x.is_nan()), "{name} output {k}: NaN on the GPU");
        let err = rel_l2(a, b);
        assert!(err <= tol, "{name} output {k}: GPU vs interpreter relative error {err:e} > {tol:e}");
        // Elementwise too: a block of wrong values hides in the L2 norm of a large output.
        // Each element may differ by `tol` relative to its own size or the mean size.
        let mean = b.iter().map(|x| x.abs()).sum::<f64>() / b.len().max(1) as f64;
        if let Some((i, x, y)) = a.iter().zip(b).enumerate().map(|(i, (x, y))| (i, x, y)).find(|(_, x, y)| (*x - *y).abs() > tol * y.abs().max(mean)) {
            panic!("{name} output {k}: element {i} is {x} on the GPU and {y} on the interpreter");
        }
    }
}

fn f64s<T: Element>(b: &Buffer<T>) -> Vec<f64> {
    b.to_vec().unwrap().into_iter().map(|x| if T::DTYPE.is_float() { x.to_f64() } else { x.to_i64() as f64 }).collect()
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn row_kernels_match_the_interpreter_on_gpu() {
    let s = seed();
    for (rows, cols) in [(7usize, 1000usize), (3, 4096), (5, 48)] {
        let x = random_f32(rows * cols, s);
        // Each side is within `softmax_bound` of the exact softmax (the GPU's `ex2.approx`
        // and tree sums, the interpreter's libm `exp` and its own order), so of each other
        // within twice that (one element was 1.05e-6 apart on the H100: ex2.approx).
        gpu_vs_interp("softmax", 2.0 * examples::workloads::softmax_bound(cols, false), |rt| {
            let dx = rt.upload(&x).unwrap();
            let mut o1 = rt.upload(&vec![f32::NAN; rows * cols]).unwrap();
            let mut o2 = rt.upload(&vec![f32::NAN; rows * cols]).unwrap();
            let (nr, nc) = (rows as i32, cols as i32);
            softmax::<f32, 1, 1024>::launch(rt, rows_grid(rows, 8), &dx, &mut o1, nr, nc, nc).unwrap();
            softmax::<f32, 4, 256>::launch(rt, rows_grid(rows.div_ceil(4), 4), &dx, &mut o2, nr, nc, nc).unwrap();
            vec![f64s(&o1), f64s(&o2)]
        });
        let xb = random_bf16(rows * cols, s + 1);
        let w = random_bf16(cols, s + 2);
        // Same rounding on both sides: a bf16 result is the same or one ulp (2u) away.
        gpu_vs_interp("softmax_bf16/rmsnorm_bf16", 2.0 * examples::workloads::U_BF16 * 1.01, |rt| {
            let (dx, dw) = (rt.upload(&xb).unwrap(), rt.upload(&w).unwrap());
            let mut o1 = rt.upload(&vec![bf16::NAN; rows * cols]).unwrap();
            let mut o2 = rt.upload(&vec![bf16::NAN; rows * cols]).unwrap();
            let mut o3 = rt.upload(&vec![bf16::NAN; rows * cols]).unwrap();
            let (nr, nc) = (rows as i32, cols as i32);
            softmax::<bf16, 1, 4096>::launch(rt, rows_grid(rows, 16), &dx, &mut o1, nr, nc, nc).unwrap();
            // One pass, two rows per program; and two passes, four rows per program.
            rmsnorm_bf16::<2, 4096>::launch(rt, rows_grid(rows.div_ceil(2), 8), &dx, &dw, &mut o2, nr, nc, nc, 1e-6).unwrap();
            rmsnorm_bf16::<4, 256>::launch(rt, rows_grid(rows.div_ceil(4), 4), &dx, &dw, &mut o3, nr, nc, nc, 1e-6).unwrap();
            vec![f64s(&o1), f64s(&o2), f64s(&o3)]
        });
        // The same softmax in f16 (written once for every float type): one block per row,
        // and four rows per program looping over 256-wide chunks. A result is the same or
        // one f16 ulp away (tiny outputs are subnormal in f16; the elementwise check is
        // relative to the mean output there).
        let xh: Vec<f16> = random_f32(rows * cols, s + 6).into_iter().map(f16::from_f32).collect();
        gpu_vs_interp("softmax f16", 2.0 * examples::workloads::U_F16 * 1.01, |rt| {
            let dx = rt.upload(&xh).unwrap();
            let mut o1 = rt.upload(&vec![f16::NAN; rows * cols]).unwrap();
            let mut o2 = rt.upload(&vec![f16::NAN; rows * cols]).unwrap();
            let (nr, nc) = (rows as i32, cols as i32);
            softmax::<f16, 1, 4096>::launch(rt, rows_grid(rows, 16), &dx, &mut o1, nr, nc, nc).unwrap();
            softmax::<f16, 4, 256>::launch(rt, rows_grid(rows.div_ceil(4), 4), &dx, &mut o2, nr, nc, nc).unwrap();
            vec![f64s(&o1), f64s(&o2)]
        });
        let (wf, bf) = (random_f32(cols, s + 3), random_f32(cols, s + 4));
        gpu_vs_interp("layernorm/row_sum_mean", 1e-5, |rt| {
            let (dx, dw, db) = (rt.upload(&x).unwrap(), rt.upload(&wf).unwrap(), rt.upload(&bf).unwrap());
            let mut o = rt.upload(&vec![f32::NAN; rows * cols]).unwrap();
            layernorm::<512>::launch(rt, rows_grid(rows, 4), &dx, &dw, &db, &mut o, cols as i32, cols as i32, 1e-5).unwrap();
            let (mut sums, mut means) = (rt.upload(&vec![f32::NAN; rows]).unwrap(), rt.upload(&vec![f32::NAN; rows]).unwrap());
            let grid = LaunchConfig::grid(rows.div_ceil(16) as u32);
            row_sum_mean::<16, 128>::launch(rt, grid, &dx, &mut sums, &mut means, rows as i32, cols as i32, cols as i32).unwrap();
            vec![f64s(&o), f64s(&sums), f64s(&means)]
        });
    }
    for (rows, cols, tile, warps) in [(70usize, 45usize, 32usize, 4u32), (256, 192, 64, 4), (130, 257, 64, 8)] {
        let x = random_f32(rows * cols, s + 5);
        gpu_vs_interp("transpose", 0.0, |rt| {
            let dx = rt.upload(&x).unwrap();
            let mut o = rt.upload(&vec![f32::NAN; rows * cols]).unwrap();
            let grid = LaunchConfig::grid3(cols.div_ceil(tile) as u32, rows.div_ceil(tile) as u32, 1).warps(warps);
            if tile == 32 {
                transpose::<32>::launch(rt, grid, &dx, &mut o, rows as i32, cols as i32).unwrap();
            } else {
                transpose::<64>::launch(rt, grid, &dx, &mut o, rows as i32, cols as i32).unwrap();
            }
            vec![f64s(&o)]
        });
    }
}

/// Relaxed atomic sums on the GPU (`red.relaxed.gpu.global.add`, `f32` in vectors on
/// sm_90) from 8 programs at once match the interpreter, on 1 and 4 warps.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn relaxed_atomic_sums_on_gpu() {
    let x = random_f32(8 * 1024, seed());
    for warps in [1u32, 4] {
        gpu_vs_interp("relaxed_sums", 1e-5, |rt| {
            let dx = rt.upload(&x).unwrap();
            let (mut out, mut counts) = (rt.upload(&vec![0.0f32; 1024]).unwrap(), rt.upload(&[0i32; 16]).unwrap());
            crate::rows::relaxed_sums::launch(rt, LaunchConfig::grid(8).warps(warps), &dx, &mut out, &mut counts, 11).unwrap();
            vec![f64s(&out), f64s(&counts)]
        });
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn reductions_scans_atomics_loops_and_branches_on_gpu() {
    use crate::rows::features;
    let s = seed();
    for n in [45usize, 2000] {
        let x = random_f32(n, s);
        for warps in [1u32, 4] {
            gpu_vs_interp("features", 1e-6, |rt| {
                let dx = rt.upload(&x).unwrap();
                let mut idx = rt.upload(&[-1i32; 2]).unwrap();
                let mut scan = rt.upload(&vec![f32::NAN; 96]).unwrap();
                let mut counts = rt.upload(&[0i32; 3]).unwrap();
                let mut hmax = rt.upload(&[f32::NEG_INFINITY; 4]).unwrap();
                features::launch(rt, LaunchConfig::grid(1).warps(warps), &dx, &mut idx, &mut scan, &mut counts, &mut hmax, n as i32).unwrap();
                let mut sc = f64s(&scan);
                sc.truncate(n.min(48));
                vec![f64s(&idx), sc, f64s(&counts), f64s(&hmax)]
            });
        }
        // A pointer carried around a loop, loaded with 128-bit vectors (the last
        // iteration masked).
        // Reductions across warps inside a loop: barriers between iterations.
        let rows = 7;
        let xr = random_f32(rows * 1024, s);
        for warps in [4u32, 8] {
            gpu_vs_interp("warp_sum_loop", 1e-5, |rt| {
                let dx = rt.upload(&xr).unwrap();
                let (mut m, mut sm) = (rt.upload(&vec![f32::NAN; rows]).unwrap(), rt.upload(&vec![f32::NAN; rows]).unwrap());
                crate::rows::warp_sum_loop::launch(rt, LaunchConfig::grid(1).warps(warps), &dx, &mut m, &mut sm, rows as i32).unwrap();
                vec![f64s(&m), f64s(&sm)]
            });
        }
        // Positive terms (`x + 5`, in [1, 9)): the GPU's tree and the interpreter's fold
        // add in other orders, and a sum that cancels to near zero would miss a relative
        // bound in f32 whatever its order (about one run in a hundred with `x`).
        let positive: Vec<f32> = x.iter().map(|v| v + 5.0).collect();
        gpu_vs_interp("strided_sum", 1e-5, |rt| {
            let dx = rt.upload(&positive).unwrap();
            let mut out = rt.upload(&[f32::NAN]).unwrap();
            crate::rows::strided_sum::<256>::launch(rt, LaunchConfig::grid(1), &dx, &mut out, n as i32).unwrap();
            vec![f64s(&out)]
        });
    }
}

/// Shared-memory buffers (`local_alloc`/`local_store`/`local_load`) with the barriers
/// the hazards need, and none more (`built::buffers`): bit for bit the interpreter's.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn shared_memory_buffers_on_gpu() {
    let x = random_f32(256, seed());
    for warps in [1u32, 4, 8] {
        for rounds in [1, 5] {
            gpu_vs_interp(&format!("buffers warps={warps} rounds={rounds}"), 0.0, |rt| {
                let (hi, lo) = crate::built::run_buffers(rt, &x, rounds, warps);
                vec![hi.iter().map(|&v| v as f64).collect(), lo.iter().map(|&v| v as f64).collect()]
            });
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn exchanges_and_compare_and_swap_on_gpu() {
    use crate::rows::swaps;
    let rt = cuda();
    let mut xh: Vec<i32> = (0..19).map(|i| 100 + i).collect();
    xh[16] = 5;
    let fh = vec![-3.0f32, 1.0, -7.5, 2.0, 0.0, -0.5, 4.0, 8.0, 0.0];
    let s = rt.stream();
    let (mut x, mut f) = (s.clone_htod(&xh).unwrap(), s.clone_htod(&fh).unwrap());
    swaps::launch(&rt, LaunchConfig::grid(1), &mut x, &mut f).unwrap();
    let (x, f) = (s.clone_dtoh(&x).unwrap(), s.clone_dtoh(&f).unwrap());
    assert_eq!(&x[..8], &[0, 2, 4, 6, 8, 10, 12, 14]);
    assert_eq!(&x[8..16], &[100, 101, 102, 103, 104, 105, 106, 107]);
    assert_eq!((x[16], x[17], x[18]), (9, 117, 617));
    assert_eq!(f[..8], [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5]);
    assert_eq!(f[8], -7.5);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn shared_memory_above_48kb_opts_in_and_above_the_device_limit_is_an_error() {
    let rt = Runtime::Cuda(cuda());
    // A 128 x 128 f32 tile converts through 128 x 129 x 4 = 66 KB of shared memory.
    let (rows, cols) = (300usize, 200usize);
    let x = random_f32(rows * cols, seed());
    let dx = rt.upload(&x).unwrap();
    let mut out = rt.upload(&vec![f32::NAN; rows * cols]).unwrap();
    let grid = LaunchConfig::grid3(cols.div_ceil(128) as u32, rows.div_ceil(128) as u32, 1).warps(16);
    transpose::<128>::launch(&rt, grid, &dx, &mut out, rows as i32, cols as i32).unwrap();
    let got = out.to_vec().unwrap();
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(got[c * rows + r], x[r * cols + c]);
        }
    }
    // 256 x 257 x 4 = 263 KB: more than any device allows per program.
    let grid = LaunchConfig::grid3(1, 2, 1).warps(32);
    let err = transpose::<256>::launch(&rt, grid, &dx, &mut out, rows as i32, cols as i32).unwrap_err().to_string();
    assert!(err.contains("KB of shared memory") && err.contains("use smaller blocks"), "{err}");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn tuned_launches_time_check_and_leave_one_launchs_result_on_gpu() {
    let rt = Runtime::Cuda(cuda());
    let n = 1 << 20;
    let s = seed();
    let (x, y0) = (random_f32(n, s), random_f32(n, s + 1));
    let dx = rt.upload(&x).unwrap();
    let mut y = rt.upload(&y0).unwrap();
    let cfg = axpy_tuned(&rt, 0.5, &dx, &mut y, n as i64).unwrap();
    assert!(cfg.get("BLOCK") >= 32 * cfg.num_warps as i64, "{cfg}");
    let want: Vec<f32> = (0..n).map(|i| 0.5 * x[i] + y0[i]).collect();
    assert_eq!(y.to_vec().unwrap(), want, "in place: one application");
    // The same key again goes straight to the winner.
    let again = axpy_tuned(&rt, 0.5, &dx, &mut y, n as i64).unwrap();
    assert_eq!(again, cfg);
    let mut total = rt.zeros::<f32>(1).unwrap();
    let pos: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    let dp = rt.upload(&pos).unwrap();
    kernels_lib::sum_f32_tuned(&rt, &dp, &mut total, n as i32).unwrap();
    let want: f64 = pos.iter().map(|&v| v as f64).sum();
    let got = total.to_vec().unwrap()[0] as f64;
    assert!((got - want).abs() / want < 1e-5, "{got} vs {want}: the sum accumulated once");
    // A row kernel with two tuned compile-time parameters (ROWS; BLOCK fixed by pruning).
    let (rows, cols) = (300, 1000);
    let (xb, w) = (random_bf16(rows * cols, s + 2), random_bf16(cols, s + 3));
    let (dx, dw) = (rt.upload(&xb).unwrap(), rt.upload(&w).unwrap());
    let mut out = rt.upload(&vec![bf16::NAN; rows * cols]).unwrap();
    let cfg = rmsnorm_bf16_tuned(&rt, &dx, &dw, &mut out, rows as i32, cols as i32, cols as i32, 1e-6).unwrap();
    assert_eq!(cfg.get("BLOCK"), 1024, "{cfg}");
    let f = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    assert_close(&format!("{cfg}"), &f(&out.to_vec().unwrap()), &examples::workloads::rmsnorm_rows(&f(&xb), &f(&w), 1e-6), None, examples::workloads::rmsnorm_bound(1000));
    // Short rows: the tuner may put several in one program.
    let (rows, cols) = (3000, 100);
    let x = random_f32(rows * cols, s + 4);
    let dx = rt.upload(&x).unwrap();
    let mut out = rt.upload(&vec![f32::NAN; rows * cols]).unwrap();
    let cfg = softmax_tuned(&rt, &dx, &mut out, rows as i32, cols as i32, cols as i32).unwrap();
    assert_eq!(cfg.get("BLOCK"), 128, "{cfg}");
    let want = examples::workloads::softmax_rows(&x.iter().map(|&v| v as f64).collect::<Vec<_>>(), cols);
    let err = rel_l2(&out.to_vec().unwrap().into_iter().map(|v| v as f64).collect::<Vec<_>>(), &want);
    assert!(err < 1e-6, "{cfg}: {err:e}");
}

/// A failing device assert stops the kernel and poisons the CUDA context for the rest of
/// the process, so the launches run in a child process (`device_debug_child`); this test
/// reads what it printed.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn device_assert_and_print_on_gpu() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["gpu::device_debug_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("RUTILE_TEST_DEBUG_CHILD", "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed:\n{text}");
    // `device_print` of the passing debug launch: one line per element, by its owner.
    assert!(text.contains("idx (2) v =  3.000000") && text.contains("idx (15) v =  1.000000"), "{text}");
    // `__assertfail`'s report names the message, the kernel and the line.
    assert!(text.contains("inputs must be positive (kernel `checked`, line"), "{text}");
}

#[test]
#[ignore = "run by device_assert_and_print_on_gpu in a child process"]
fn device_debug_child() {
    if std::env::var_os("RUTILE_TEST_DEBUG_CHILD").is_none() {
        return;
    }
    use crate::rows::checked;
    let rt = Runtime::Cuda(cuda());
    let good = rt.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let bad = rt.upload(&[1.0f32, 2.0, -3.0, 4.0]).unwrap();
    // Without the debug flag the assert is compiled away: the bad input passes.
    checked::launch(&rt, LaunchConfig::grid(1).debug(false), &bad, 4).unwrap();
    rt.synchronize().unwrap();
    checked::launch(&rt, LaunchConfig::grid(1).debug(true), &good, 4).unwrap();
    rt.synchronize().unwrap();
    let err = checked::launch(&rt, LaunchConfig::grid(1).debug(true), &bad, 4).and_then(|_| rt.synchronize()).unwrap_err().to_string();
    eprintln!("launch error: {err}");
    assert!(err.to_lowercase().contains("assert"), "{err}");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn rank_3_blocks_on_gpu() {
    use crate::rows::{cube, cube_ref};
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    let x = random_f32(512, s);
    let [rs, rc, rm] = cube_ref(&x);
    let dx = rt.upload(&x).unwrap();
    for warps in [1u32, 2, 4, 8] {
        let (mut sums, mut scans, mut moved) = (rt.upload(&[f32::NAN; 64]).unwrap(), rt.upload(&[f32::NAN; 512]).unwrap(), rt.upload(&[f32::NAN; 512]).unwrap());
        cube::launch(&rt, LaunchConfig::grid(1).warps(warps), &dx, &mut sums, &mut scans, &mut moved).unwrap();
        assert!(rel_l2(&f64s(&sums), &rs) < 1e-6, "seed {s}, {warps} warps");
        assert!(rel_l2(&f64s(&scans), &rc) < 1e-6, "seed {s}, {warps} warps");
        assert_eq!(f64s(&moved), rm, "seed {s}, {warps} warps");
    }
}

/// The GPU and the interpreter agree on out-of-bounds lanes in checked launches
/// (`LaunchConfig::debug(true)` or `RUTILE_DEBUG=1`): the same `Err`, naming the kernel,
/// line, buffer, index and length. Without the check the guarded launch masks the lane and
/// returns `Ok`. The record is cleared after a report, and the context stays usable.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn checked_launches_report_out_of_bounds_lanes_like_the_interpreter() {
    let rt = cuda();
    let s = rt.stream();
    let n = 100;
    let (a, b, c) = (random_f32(n, 1), random_f32(n, 2), random_f32(n, 3));
    let (da, db, dc) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap(), s.clone_htod(&c).unwrap());
    let mut out = s.alloc_zeros::<f32>(n - 1).unwrap();
    let cfg = grid_for(n, 64).debug(true);
    let gpu = relu_mul_add::<f32, 64>::launch(&rt, cfg, &da, &db, &dc, &mut out, n as i32).unwrap_err();
    let mut host_out = vec![0.0f32; n - 1];
    let interp = relu_mul_add::<f32, 64>::launch(&Runtime::interpreter(), cfg, &a, &b, &c, &mut host_out, n as i32).unwrap_err();
    let (g, i) = (gpu.to_string(), interp.to_string());
    assert!(matches!(gpu, Error::Interpret { .. }), "{g}");
    let core = |m: &str| m[m.find("out-of-bounds").unwrap()..].split(" (the lane").next().unwrap().to_string();
    assert_eq!(core(&g), core(&i), "GPU: {g}\ninterpreter: {i}");
    assert!(g.contains("`out[99]` with `out` of length 99") && g.contains("program (1, 0, 0)"), "{g}");
    let at = |m: &str| m.split(" at ").nth(1).unwrap().split(':').take(3).collect::<Vec<_>>().join(":");
    assert_eq!(at(&g), at(&i), "the same source line:\n{g}\n{i}");
    // Unchecked by the debug flag: masked silently.
    relu_mul_add::<f32, 64>::launch(&rt, grid_for(n, 64).debug(false), &da, &db, &dc, &mut out, n as i32).unwrap();
    // After a report the record is clear: a correct checked launch is Ok.
    let mut full = s.alloc_zeros::<f32>(n).unwrap();
    relu_mul_add::<f32, 64>::launch(&rt, cfg, &da, &db, &dc, &mut full, n as i32).unwrap();
    let got = s.clone_dtoh(&full).unwrap();
    assert!((0..n).all(|i| got[i] == a[i].max(0.0) * b[i] + c[i]));
    // A read past a shorter input, in a looping kernel.
    let x = s.clone_htod(&random_f32(3 * 1000 - 5, 4)).unwrap();
    let mut o = s.alloc_zeros::<f32>(3 * 1000).unwrap();
    let err = softmax::<f32, 1, 256>::launch(&rt, rows_grid(3, 4).debug(true), &x, &mut o, 3, 1000, 1000).unwrap_err();
    // Which of the five lanes past the end claims the record first is up to the GPU.
    let m = err.to_string();
    assert!(m.contains("out-of-bounds load: `x[299") && m.contains("with `x` of length 2995") && m.contains("program (2, 0, 0)"), "{m}");
}

/// `matmul_split_k` on the GPU: the interpreter test's cases (`dot::check_split_k`).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn matmul_split_k_on_gpu() {
    crate::dot::check_split_k(&Runtime::Cuda(cuda()));
}

/// `dot` on tensor cores (`mma.sync`): a tiled matmul in bf16 and f16 on shapes that are
/// not multiples of the tiles, every element within the f32-accumulation bound of the f64
/// product (the inputs' products are exact), at several tile shapes and warp counts. The
/// bound is `gamma_k` with twice the unit roundoff: tensor cores are reported to align and
/// add with truncation rather than rounding to nearest inside an instruction (Fasi et al.,
/// "Numerical behavior of NVIDIA tensor cores", 2021), which at most doubles each add's
/// relative error.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn matmul_on_gpu() {
    use crate::dot::{bf16_product, gamma, reference, tiles, worst};
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    for (m, n, k) in [(50, 37, 40), (256, 192, 128), (130, 70, 300)] {
        let (xa, xb) = (random_f32(m * k, s), random_f32(k * n, s + 1));
        let (a, b): (Vec<bf16>, Vec<bf16>) = (xa.iter().map(|&v| bf16::from_f32(v)).collect(), xb.iter().map(|&v| bf16::from_f32(v)).collect());
        let (want, scale) = reference(&a.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &b.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), m, n, k);
        let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap());
        for warps in [1u32, 4] {
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            matmul::<bf16, f32, 16, 32, 16, 8>::launch(&rt, tiles(m, n, 16, 32).warps(warps), &da, &db, &mut dc, m as i32, n as i32, k as i32, k as i32, 1, n as i32, 1, n as i32, 1).unwrap();
            let e = worst(&dc.to_vec().unwrap(), &want, &scale);
            assert!(e <= 2.0 * gamma(k), "bf16 {m}x{n}x{k} warps {warps} seed {s}: {e:e}");
        }
        let (a, b): (Vec<f16>, Vec<f16>) = (xa.iter().map(|&v| f16::from_f32(v)).collect(), xb.iter().map(|&v| f16::from_f32(v)).collect());
        let (want, scale) = reference(&a.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &b.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), m, n, k);
        let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap());
        // The library kernel (row-major operands, grouped order).
        {
            let (mi, ni, ki) = (m as i32, n as i32, k as i32);
            let (a, b): (Vec<bf16>, Vec<bf16>) = (xa.iter().map(|&v| bf16::from_f32(v)).collect(), xb.iter().map(|&v| bf16::from_f32(v)).collect());
            let (want, scale) = reference(&a.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &b.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), m, n, k);
            let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap());
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            let grid = LaunchConfig::grid((m.div_ceil(64) * n.div_ceil(64)) as u32).warps(4);
            matmul::<bf16, f32, 64, 64, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1).unwrap();
            let e = worst(&dc.to_vec().unwrap(), &want, &scale);
            assert!(e <= 2.0 * gamma(k), "library bf16 {m}x{n}x{k} seed {s}: {e:e}");
        }
        for warps in [4u32, 8] {
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            matmul::<f16, f32, 64, 64, 32, 8>::launch(&rt, tiles(m, n, 64, 64).warps(warps), &da, &db, &mut dc, m as i32, n as i32, k as i32, k as i32, 1, n as i32, 1, n as i32, 1).unwrap();
            let e = worst(&dc.to_vec().unwrap(), &want, &scale);
            assert!(e <= 2.0 * gamma(k), "f16 {m}x{n}x{k} warps {warps} seed {s}: {e:e}");
        }
    }
    // f32 inputs at tf32 precision (m16n8k8 on inputs truncated to 10 mantissa bits, as
    // the interpreter truncates them): within 2^-9 + 2^-20 per product plus the sum's bound.
    for (m, n, k) in [(130, 70, 300), (64, 64, 64)] {
        let (xa, xb) = (random_f32(m * k, s + 4), random_f32(k * n, s + 5));
        let (want, scale) = reference(&xa.iter().map(|&v| v as f64).collect::<Vec<_>>(), &xb.iter().map(|&v| v as f64).collect::<Vec<_>>(), m, n, k);
        let (da, db) = (rt.upload(&xa).unwrap(), rt.upload(&xb).unwrap());
        let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
        let grid = LaunchConfig::grid((m.div_ceil(64) * n.div_ceil(64)) as u32).warps(4);
        matmul::<f32, f32, 64, 64, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, m as i32, n as i32, k as i32, k as i32, 1, n as i32, 1, n as i32, 1).unwrap();
        let e = worst(&dc.to_vec().unwrap(), &want, &scale);
        assert!(e <= 2f64.powi(-9) + 2f64.powi(-20) + 2.0 * gamma(k) * (1.0 + 2f64.powi(-8)), "tf32 {m}x{n}x{k} seed {s}: {e:e}");
    }
    // tf32 on sm_90a `wgmma` (b N-contiguous: `cᵀ = bᵀ aᵀ`, bᵀ read into registers), by
    // TMA where pipelined, and forced `mma.sync`: ragged M with a K tail, a loop shorter
    // than the ring, several tiles over several iterations.
    let bound = |k: usize| 2f64.powi(-9) + 2f64.powi(-20) + 2.0 * gamma(k) * (1.0 + 2f64.powi(-8));
    for (m, n, k) in [(130, 80, 304), (64, 48, 32), (256, 512, 512)] {
        let (xa, xb) = (random_f32(m * k, s + 6), random_f32(k * n, s + 7));
        let (want, scale) = reference(&xa.iter().map(|&v| v as f64).collect::<Vec<_>>(), &xb.iter().map(|&v| v as f64).collect::<Vec<_>>(), m, n, k);
        let (da, db) = (rt.upload(&xa).unwrap(), rt.upload(&xb).unwrap());
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        for (stages, wgmma) in [(1u32, true), (3, true), (4, true), (3, false)] {
            let check = |dc: &Buffer<f32>, what: &str| {
                let e = worst(&dc.to_vec().unwrap(), &want, &scale);
                assert!(e <= bound(k), "tf32 {what} {m}x{n}x{k} stages {stages} wgmma {wgmma} seed {s}: {e:e}");
            };
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            let grid = LaunchConfig::grid((m.div_ceil(128) * n.div_ceil(128)) as u32).warps(8).stages(stages).wgmma(wgmma);
            matmul::<f32, f32, 128, 128, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1).unwrap();
            check(&dc, "128x128x32 w8");
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            let grid = LaunchConfig::grid((m.div_ceil(128) * n.div_ceil(256)) as u32).warps(8).stages(stages).wgmma(wgmma);
            matmul::<f32, f32, 128, 256, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1).unwrap();
            check(&dc, "128x256x32 w8");
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            let grid = LaunchConfig::grid((m.div_ceil(64) * n.div_ceil(128)) as u32).warps(4).stages(stages).wgmma(wgmma);
            matmul::<f32, f32, 64, 128, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1).unwrap();
            check(&dc, "64x128x32 w4");
        }
    }
    // Pipelined (`stages` > 1: cp.async into a ring of operand buffers, which needs rows
    // aligned to 16 bytes, so K and N are multiples of 8 here): ragged M with a K tail
    // that is not a multiple of BK (masked, zero-filled copies), a loop shorter than the
    // ring (copies past the end masked off), and larger tiles over several iterations.
    for (m, n, k) in [(130, 80, 304), (64, 48, 32), (256, 256, 512)] {
        let ([a, b], (want, scale)) = bf16_product(m, n, k, s + 2);
        let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap());
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        // On an sm_90 device these dots take wgmma by default; `wgmma(false)` keeps mma.sync.
        for (stages, wgmma) in [2u32, 3, 4].into_iter().flat_map(|s| [(s, true), (s, false)]) {
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            let grid = LaunchConfig::grid((m.div_ceil(64) * n.div_ceil(64)) as u32).warps(4).stages(stages).wgmma(wgmma);
            matmul::<bf16, f32, 64, 64, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1).unwrap();
            let e = worst(&dc.to_vec().unwrap(), &want, &scale);
            assert!(e <= 2.0 * gamma(k), "pipelined 64x64x32 {m}x{n}x{k} stages {stages} wgmma {wgmma} seed {s}: {e:e}");
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            let grid = LaunchConfig::grid((m.div_ceil(128) * n.div_ceil(128)) as u32).warps(8).stages(stages).wgmma(wgmma);
            matmul::<bf16, f32, 128, 128, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1).unwrap();
            let e = worst(&dc.to_vec().unwrap(), &want, &scale);
            assert!(e <= 2.0 * gamma(k), "pipelined 128x128x32 {m}x{n}x{k} stages {stages} wgmma {wgmma} seed {s}: {e:e}");
            // Output in the input type: one more rounding, at most 2^-8 of the result.
            let mut d16 = rt.upload(&vec![bf16::NAN; m * n]).unwrap();
            let grid = LaunchConfig::grid((m.div_ceil(64) * n.div_ceil(64)) as u32).warps(4).stages(stages).wgmma(wgmma);
            matmul::<bf16, bf16, 64, 64, 32, 8>::launch(&rt, grid, &da, &db, &mut d16, mi, ni, ki, ki, 1, ni, 1, ni, 1).unwrap();
            let got: Vec<f32> = d16.to_vec().unwrap().iter().map(|v| v.to_f32()).collect();
            let e = worst(&got, &want, &scale);
            assert!(e <= 2.0 * gamma(k) + 1.0 / 256.0, "bf16 out {m}x{n}x{k} stages {stages} wgmma {wgmma} seed {s}: {e:e}");
            // Carried pointers (Triton's tutorial style), pipelined the same way.
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            let grid = LaunchConfig::grid3(m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1).warps(4).stages(stages).wgmma(wgmma);
            crate::dot::matmul_carried::<64, 64, 32>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki).unwrap();
            let e = worst(&dc.to_vec().unwrap(), &want, &scale);
            assert!(e <= 2.0 * gamma(k), "carried pointers {m}x{n}x{k} stages {stages} wgmma {wgmma} seed {s}: {e:e}");
        }
    }
}

/// The persistent matmul on the GPU (TMA and `wgmma` inside a loop over tiles: its
/// barriers initialised again, its ring refilled, at each tile) equals `matmul` bit for
/// bit on any grid, one program through more programs than tiles, at the 128 x 256 tile
/// (3 and 4 stages) and the 64 x 64 one, ragged shapes with a K tail; and `matmul` is
/// within the f64 product's bound.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn persistent_matmul_on_gpu() {
    use crate::dot::{bf16_product, gamma, worst};
    use kernels_lib::matmul_persistent;
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    for (m, n, k) in [(300, 600, 520), (130, 88, 304)] {
        let ([a, b], (want, scale)) = bf16_product(m, n, k, s + 8);
        let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap());
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        for (wide, stages) in [(true, 3u32), (true, 4), (false, 3)] {
            let (bm, bn, warps) = if wide { (128, 256, 8) } else { (64, 64, 4) };
            let tiles = (m.div_ceil(bm) * n.div_ceil(bn)) as u32;
            let run = |programs: u32, persistent: bool| {
                let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
                let grid = LaunchConfig::grid(programs).warps(warps).stages(stages);
                match (wide, persistent) {
                    (true, false) => matmul::<bf16, f32, 128, 256, 64, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1),
                    (true, true) => matmul_persistent::<bf16, f32, 128, 256, 64, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1),
                    (false, false) => matmul::<bf16, f32, 64, 64, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1),
                    (false, true) => matmul_persistent::<bf16, f32, 64, 64, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1),
                }
                .unwrap();
                dc.to_vec().unwrap()
            };
            let what = format!("{m}x{n}x{k} {bm}x{bn} stages {stages} seed {s}");
            let base = run(tiles, false);
            let e = worst(&base, &want, &scale);
            assert!(e <= 2.0 * gamma(k), "matmul {what}: {e:e}");
            for programs in [1, 2, tiles, tiles + 5] {
                let got = run(programs, true);
                let differ = got.iter().zip(&base).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                assert_eq!(differ, 0, "persistent on {programs} programs differs from matmul in {differ} elements: {what}");
            }
        }
    }
}

/// Operand tiles loaded by the tensor memory accelerator (TMA, the default for pipelined
/// `wgmma` loops whose tiles are matrix tiles with 16-byte-aligned rows): the same bits as
/// the `cp.async` path (`LaunchConfig::tma(false)`), which reads the same elements into the
/// same layout, and within the f32-accumulation bound of the f64 product, for row- and
/// column-major operands, both swizzles (64-element strips at BK = 64, 32 at BK = 32), a
/// K tail and ragged M and N (the tensor maps' edges zero-filled), a loop shorter than the
/// ring, and K = 0 (no copy issued: zeros). A buffer shorter than the matrix its maps
/// describe is refused at launch, naming the argument.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn matmul_tiles_by_tma_on_gpu() {
    use crate::dot::{gamma, reference, worst};
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    for (m, n, k, a_cols) in [(130, 88, 304, false), (144, 80, 304, true), (64, 48, 32, false), (300, 272, 1024, false)] {
        let (xa, xb) = (random_f32(m * k, s + 6), random_f32(k * n, s + 7));
        // a[i, p] at i * k + p, or p * m + i (column-major).
        let (sam, sak) = if a_cols { (1, m) } else { (k, 1) };
        let mut a_mem = vec![0.0f32; m * k];
        for i in 0..m {
            for p in 0..k {
                a_mem[i * sam + p * sak] = xa[i * k + p];
            }
        }
        let (a, b): (Vec<bf16>, Vec<bf16>) = (a_mem.iter().map(|&v| bf16::from_f32(v)).collect(), xb.iter().map(|&v| bf16::from_f32(v)).collect());
        let ra: Vec<f64> = xa.iter().map(|&v| bf16::from_f32(v).to_f64()).collect();
        let (want, scale) = reference(&ra, &b.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), m, n, k);
        let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap());
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let what = format!("{m}x{n}x{k} a {} seed {s}", if a_cols { "col" } else { "row" });
        for stages in [2u32, 3, 4] {
            let run = |tma: bool, wide: bool, ws: bool| {
                let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
                if wide {
                    let grid = LaunchConfig::grid((m.div_ceil(128) * n.div_ceil(256)) as u32).warps(8).stages(stages.min(3)).tma(tma).warp_specialize(ws);
                    matmul::<bf16, f32, 128, 256, 64, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, sam as i32, sak as i32, ni, 1, ni, 1).unwrap();
                } else {
                    let grid = LaunchConfig::grid((m.div_ceil(64) * n.div_ceil(64)) as u32).warps(4).stages(stages).tma(tma).warp_specialize(ws);
                    matmul::<bf16, f32, 64, 64, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, mi, ni, ki, sam as i32, sak as i32, ni, 1, ni, 1).unwrap();
                }
                dc.to_vec().unwrap()
            };
            for wide in [false, true] {
                let (by_tma, by_copies) = (run(true, wide, false), run(false, wide, false));
                let e = worst(&by_tma, &want, &scale);
                assert!(e <= 2.0 * gamma(k), "TMA {what} stages {stages} wide {wide}: {e:e}");
                let differ = by_tma.iter().zip(&by_copies).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                assert_eq!(differ, 0, "TMA and cp.async differ in {differ} elements: {what} stages {stages} wide {wide}");
                // Warp-specialized: the same products in the same order.
                let by_ws = run(true, wide, true);
                let differ = by_ws.iter().zip(&by_copies).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                assert_eq!(differ, 0, "warp-specialized and cp.async differ in {differ} elements: {what} stages {stages} wide {wide}");
            }
        }
    }
    // K = 0: every copy is off (the barriers still complete), the product is zero.
    let (da, db) = (rt.upload(&[bf16::ONE; 64]).unwrap(), rt.upload(&[bf16::ONE; 64]).unwrap());
    let mut dc = rt.upload(&vec![f32::NAN; 64 * 64]).unwrap();
    for ws in [false, true] {
        dc.copy_from(&vec![f32::NAN; 64 * 64]).unwrap();
        matmul::<bf16, f32, 64, 64, 32, 8>::launch(&rt, LaunchConfig::grid(1).warps(4).stages(3).warp_specialize(ws), &da, &db, &mut dc, 64, 64, 0, 16, 1, 64, 1, 64, 1).unwrap();
        assert!(dc.to_vec().unwrap().iter().all(|&x| x == 0.0), "K = 0, warp-specialized {ws}");
    }
    // A buffer 16 elements short of the 64 x 64 matrix `a`'s map describes (its length
    // still a multiple of 16, so the loop keeps its 16-byte copies and TMA).
    let (da, db) = (rt.upload(&vec![bf16::ONE; 64 * 64 - 16]).unwrap(), rt.upload(&vec![bf16::ONE; 64 * 64]).unwrap());
    let e = matmul::<bf16, f32, 64, 64, 32, 8>::launch(&rt, LaunchConfig::grid(1).warps(4).stages(3), &da, &db, &mut dc, 64, 64, 64, 64, 1, 64, 1, 64, 1).unwrap_err().to_string();
    assert!(e.contains("argument `a`") && e.contains("does not lie inside it"), "{e}");
}

/// Output tiles stored by the tensor memory accelerator (`LaunchConfig::tma_store`): the
/// same bits as the plain store, for f32 and bf16 outputs, row- and column-major `c`
/// (the box strips along either dimension), ragged M and N (TMA clips at the tensor's
/// edges: the poisoned elements past the matrix in `c`'s buffer stay NaN), the 64 x 64
/// tile on 4 warps and the 128 x 256 one on 8, warp-specialized and not; and a plain
/// tile copy with an empty matrix.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn matmul_tiles_stored_by_tma_on_gpu() {
    use crate::dot::{bf16_product, gamma, worst};
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    for (m, n, k) in [(130, 88, 304), (300, 272, 1024), (64, 48, 32)] {
        let ([a, b], (want, scale)) = bf16_product(m, n, k, s + 10);
        let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap());
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        // 64 poisoned elements past the matrix.
        let len = m * n + 64;
        for c_cols in [false, true] {
            let (scm, scn) = if c_cols { (1, mi) } else { (ni, 1) };
            for (wide, ws) in [(false, false), (true, false), (true, true)] {
                let grid = if wide { LaunchConfig::grid((m.div_ceil(128) * n.div_ceil(256)) as u32).warps(8) } else { LaunchConfig::grid((m.div_ceil(64) * n.div_ceil(64)) as u32).warps(4) }.stages(3).warp_specialize(ws);
                let f32_out = |tma: bool| {
                    let mut dc = rt.upload(&vec![f32::NAN; len]).unwrap();
                    let g = grid.tma_store(tma);
                    if wide {
                        matmul::<bf16, f32, 128, 256, 64, 8>::launch(&rt, g, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, scm, scn).unwrap();
                    } else {
                        matmul::<bf16, f32, 64, 64, 32, 8>::launch(&rt, g, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, scm, scn).unwrap();
                    }
                    dc.to_vec().unwrap()
                };
                let bf16_out = |tma: bool| {
                    let mut dc = rt.upload(&vec![bf16::NAN; len]).unwrap();
                    let g = grid.tma_store(tma);
                    if wide {
                        matmul::<bf16, bf16, 128, 256, 64, 8>::launch(&rt, g, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, scm, scn).unwrap();
                    } else {
                        matmul::<bf16, bf16, 64, 64, 32, 8>::launch(&rt, g, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, scm, scn).unwrap();
                    }
                    dc.to_vec().unwrap().iter().map(|x| x.to_f32()).collect::<Vec<f32>>()
                };
                let what = format!("{m}x{n}x{k} c {} wide {wide} ws {ws} seed {s}", if c_cols { "col" } else { "row" });
                for (out, run) in [("f32", &f32_out as &dyn Fn(bool) -> Vec<f32>), ("bf16", &bf16_out)] {
                    let (by_tma, plain) = (run(true), run(false));
                    assert!(by_tma[m * n..].iter().all(|x| x.is_nan()), "{out} {what}: written past the matrix");
                    let row_major: Vec<f32> = (0..m * n).map(|e| by_tma[if c_cols { (e % n) * m + e / n } else { e }]).collect();
                    let bound = 2.0 * gamma(k) + if out == "bf16" { 2f64.powi(-8) } else { 0.0 };
                    let err = worst(&row_major, &want, &scale);
                    assert!(err <= bound, "{out} {what}: {err:e}");
                    let differ = by_tma.iter().zip(&plain).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                    assert_eq!(differ, 0, "{out} {what}: TMA stores and plain stores differ in {differ} elements");
                }
            }
        }
    }
    // A kernel whose grid does not follow `m` (the library matmul's grouped order divides
    // by the number of tile rows, so M = 0 is not a launch it defines): two programs of
    // 64 rows, m = 100 (clipped at the matrix's edge) and m = 0 (an empty matrix: its
    // store map points at a scratch nothing reads, not at the zeros empty loads read), by
    // TMA and plain stores; `y` poisoned.
    let x = random_f32(128 * 64, s + 20);
    let dx = rt.upload(&x).unwrap();
    for m in [100usize, 0] {
        let run = |tma: bool| {
            let mut dy = rt.upload(&vec![f32::NAN; 128 * 64]).unwrap();
            crate::dot::tile_copy::launch(&rt, LaunchConfig::grid(2).warps(4).tma_store(tma), &dx, &mut dy, m as i32).unwrap();
            dy.to_vec().unwrap()
        };
        let (by_tma, plain) = (run(true), run(false));
        assert!(by_tma[..m * 64].iter().zip(&x).all(|(y, x)| *y == 2.0 * x), "tile_copy m = {m}: the rows inside");
        assert!(by_tma[m * 64..].iter().all(|y| y.is_nan()), "tile_copy m = {m}: written past the matrix");
        assert!(by_tma.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits()), "tile_copy m = {m}: TMA and plain stores differ");
    }
}

/// One tile read by two products, directly and transposed (`x y` and `z x^T`): on `wgmma`
/// by both (64 rows of `z`, the buffer laid out for two descriptors, K-major and
/// MN-major) and on `mma.sync` by both (32 rows), each within the f32-accumulation bound.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn one_tile_read_by_two_products_on_gpu() {
    use crate::dot::{gamma, reference, shared_tile_products, worst};
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    let bf = |v: Vec<f32>| -> Vec<bf16> { v.into_iter().map(bf16::from_f32).collect() };
    let wide = |v: &[bf16]| -> Vec<f64> { v.iter().map(|x| x.to_f64()).collect() };
    let (x, y, z) = (bf(random_f32(64 * 64, s)), bf(random_f32(64 * 64, s + 1)), bf(random_f32(64 * 64, s + 2)));
    let xt: Vec<f64> = (0..64 * 64).map(|i| x[(i % 64) * 64 + i / 64].to_f64()).collect();
    let (dx, dy, dz) = (rt.upload(&x).unwrap(), rt.upload(&y).unwrap(), rt.upload(&z).unwrap());
    let (want_xy, scale_xy) = reference(&wide(&x), &wide(&y), 64, 64, 64);
    let check = |rows: usize, xy: Vec<f32>, zx: Vec<f32>| {
        let (want_zx, scale_zx) = reference(&wide(&z[..rows * 64]), &xt, rows, 64, 64);
        let (e1, e2) = (worst(&xy, &want_xy, &scale_xy), worst(&zx, &want_zx, &scale_zx));
        assert!(e1 <= 2.0 * gamma(64) && e2 <= 2.0 * gamma(64), "{rows} rows of z, seed {s}: x y {e1:e}, z x^T {e2:e}");
    };
    let (mut xy, mut zx) = (rt.upload(&vec![f32::NAN; 64 * 64]).unwrap(), rt.upload(&vec![f32::NAN; 64 * 64]).unwrap());
    shared_tile_products::<64>::launch(&rt, LaunchConfig::grid(1).warps(4), &dx, &dy, &dz, &mut xy, &mut zx).unwrap();
    check(64, xy.to_vec().unwrap(), zx.to_vec().unwrap());
    let (mut xy, mut zx) = (rt.upload(&vec![f32::NAN; 64 * 64]).unwrap(), rt.upload(&vec![f32::NAN; 32 * 64]).unwrap());
    shared_tile_products::<32>::launch(&rt, LaunchConfig::grid(1).warps(4), &dx, &dy, &dz, &mut xy, &mut zx).unwrap();
    check(32, xy.to_vec().unwrap(), zx.to_vec().unwrap());
}

/// The library matmul with every mix of row- and column-major operands (transposes passed
/// as strides; column-major tiles are loaded along their columns and read with
/// `ldmatrix.trans`), unpipelined and pipelined, bf16 and f32 (tf32), on ragged shapes:
/// every element within the bound of its precision.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn matmul_with_column_major_operands_on_gpu() {
    use crate::dot::{gamma, reference, worst};
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    // (m, n, k) with m, n, k multiples of 8 (16-byte rows and columns, for the pipelined
    // copies) and one ragged shape run unpipelined.
    for ((m, n, k), stages) in [((136, 80, 304), 3), ((136, 80, 304), 1), ((130, 70, 90), 1)] {
        let (xa, xb) = (random_f32(m * k, s), random_f32(k * n, s + 1));
        for (a_cols, b_cols) in [(false, false), (true, false), (false, true), (true, true)] {
            // a[i, p] at i * k + p (row-major) or p * m + i; b[p, j] at p * n + j or j * k + p.
            let (sam, sak) = if a_cols { (1, m) } else { (k, 1) };
            let (sbk, sbn) = if b_cols { (1, k) } else { (n, 1) };
            let mut a_mem = vec![0.0f32; m * k];
            let mut b_mem = vec![0.0f32; k * n];
            for i in 0..m {
                for p in 0..k {
                    a_mem[i * sam + p * sak] = xa[i * k + p];
                }
            }
            for p in 0..k {
                for j in 0..n {
                    b_mem[p * sbk + j * sbn] = xb[p * n + j];
                }
            }
            let i = |x: usize| x as i32;
            let grid = LaunchConfig::grid((m.div_ceil(64) * n.div_ceil(64)) as u32).warps(4).stages(stages);
            let what = format!("{m}x{n}x{k} a {} b {} stages {stages} seed {s}", if a_cols { "col" } else { "row" }, if b_cols { "col" } else { "row" });
            // bf16
            let (a, b): (Vec<bf16>, Vec<bf16>) = (a_mem.iter().map(|&v| bf16::from_f32(v)).collect(), b_mem.iter().map(|&v| bf16::from_f32(v)).collect());
            let ra: Vec<f64> = xa.iter().map(|&v| bf16::from_f32(v).to_f64()).collect();
            let rb: Vec<f64> = xb.iter().map(|&v| bf16::from_f32(v).to_f64()).collect();
            let (want, scale) = reference(&ra, &rb, m, n, k);
            let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap());
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            matmul::<bf16, f32, 64, 64, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, i(m), i(n), i(k), i(sam), i(sak), i(sbk), i(sbn), i(n), 1).unwrap();
            let e = worst(&dc.to_vec().unwrap(), &want, &scale);
            assert!(e <= 2.0 * gamma(k), "bf16 {what}: {e:e}");
            // f32 at tf32 precision
            let (want, scale) = reference(&xa.iter().map(|&v| v as f64).collect::<Vec<_>>(), &xb.iter().map(|&v| v as f64).collect::<Vec<_>>(), m, n, k);
            let (da, db) = (rt.upload(&a_mem).unwrap(), rt.upload(&b_mem).unwrap());
            let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            matmul::<f32, f32, 64, 64, 32, 8>::launch(&rt, grid, &da, &db, &mut dc, i(m), i(n), i(k), i(sam), i(sak), i(sbk), i(sbn), i(n), 1).unwrap();
            let e = worst(&dc.to_vec().unwrap(), &want, &scale);
            assert!(e <= 2f64.powi(-9) + 2f64.powi(-20) + 2.0 * gamma(k) * (1.0 + 2f64.powi(-8)), "tf32 {what}: {e:e}");
        }
    }
}

/// `matmul_batched` on the GPU, unpipelined and pipelined (the interpreter test's check).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn matmul_batched_on_gpu() {
    let rt = Runtime::Cuda(cuda());
    for stages in [1, 3] {
        crate::dot::check_batched(&rt, stages);
    }
}

/// Flash attention on the GPU (on an H100: wgmma for both products of the forward, the
/// probabilities from registers; mma.sync elsewhere and when `wgmma` is off), forward and
/// backward, unpipelined and with the loads two and three stages ahead (the pipelined path
/// exists on the GPU only), the forward also with 128-query tiles on 8 warps, on 4 (32 rows
/// a warp) and 128-key tiles: the interpreter test's cases against the f64 reference, with
/// its bounds.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn flash_attention_on_gpu() {
    use kernels_lib::flash_attention::Options;
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    // (stages, query tile, key tile, wgmma, warps)
    for (stages, forward_block_m, forward_block_n, wgmma, warps) in [
        (1, 64, 64, true, 4),
        (2, 64, 64, true, 4),
        (3, 64, 64, true, 4),
        (3, 64, 64, false, 4),
        (2, 128, 64, true, 8),
        (3, 128, 64, true, 8),
        (2, 128, 128, true, 8),
        (2, 64, 128, true, 4),
        (3, 128, 64, true, 4),
        (3, 128, 64, false, 4),
    ] {
        let opts = Options { stages, forward_block_m: Some(forward_block_m), forward_block_n: Some(forward_block_n), wgmma, forward_warps: Some(warps), forward_stages: Some(stages), ..Options::default() };
        for (i, c) in crate::attention::cases().into_iter().enumerate() {
            crate::attention::run_case(&rt, c, s + 10 * i as u64, opts);
            // Warp-specialized (a producer warpgroup besides the tile's; registers moved by
            // `setmaxnreg` with two consumer warpgroups).
            if wgmma && stages > 1 {
                crate::attention::run_case(&rt, c, s + 10 * i as u64 + 3, Options { warp_specialize: Some(true), ..opts });
            }
            // The second product a tile behind (`attention_overlapped`), plain and
            // warp-specialized.
            if warps == 8 || !wgmma {
                crate::attention::run_case(&rt, c, s + 10 * i as u64 + 4, Options { overlap: true, ..opts });
                if wgmma && stages > 1 {
                    crate::attention::run_case(&rt, c, s + 10 * i as u64 + 8, Options { overlap: true, warp_specialize: Some(true), ..opts });
                }
            }
            if forward_block_m == 64 && forward_block_n == 64 {
                crate::attention::run_backward_case(&rt, c, s + 10 * i as u64 + 5, opts);
                // The other backward tiles, built at head dims 64 and 128.
                if stages == 3 {
                    for other in crate::attention::other_backward_tiles(c.head_dim) {
                        crate::attention::run_backward_case(&rt, c, s + 10 * i as u64 + 6, Options { backward_dkdv: other.backward_dkdv, backward_dq: other.backward_dq, ..opts });
                    }
                }
                if stages == 3 {
                    crate::attention::run_backward_case_of::<half::f16>(&rt, c, s + 10 * i as u64 + 7, opts, 1.0 / 2048.0);
                }
            }
        }
    }
}

/// The atomic backward on the GPU (relaxed adds into the `dQ` scratch from every key
/// tile's program, at once: TMA reductions on 64-key tiles with `wgmma`, vector `red`s
/// otherwise): the interpreter test's cases at head dims up to 64 against f64,
/// unpipelined and three stages ahead, on `wgmma` and on `mma.sync`, and on 128-key tiles.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn atomic_flash_attention_backward_on_gpu() {
    use kernels_lib::flash_attention::Options;
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    for (j, (stages, wgmma, tile)) in [(1, true, (64, 64)), (3, true, (64, 64)), (3, false, (64, 64)), (3, true, (64, 128))].into_iter().enumerate() {
        for (i, c) in crate::attention::cases().into_iter().enumerate().filter(|(_, c)| c.head_dim <= 64) {
            crate::attention::run_backward_case_atomic(&rt, c, s + 10 * i as u64 + j as u64, Options { stages, wgmma, backward_dkdv: Some(tile), ..Options::default() });
        }
    }
}

/// The autotuned forward and backward (`Options::tune`: every candidate of each kernel's
/// `tune(..)` compiled, checked against the others and timed on the first call of a
/// shape) match f64 on every case, as the fixed tiles do.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn flash_attention_tuned_on_gpu() {
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    for (i, c) in crate::attention::cases().into_iter().enumerate() {
        let tuned = flash_attention::Options { tune: true, ..flash_attention::Options::default() };
        crate::attention::run_case(&rt, c, s + 10 * i as u64 + 9, tuned);
        crate::attention::run_backward_case(&rt, c, s + 10 * i as u64 + 9, tuned);
    }
}

/// `fma` on the GPU is exactly the interpreter's (one rounding, in f32; bf16 from it), and
/// `a * b + c` written out is exactly the interpreter's two roundings.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn fma_on_gpu_matches_the_interpreter() {
    let gpu = Runtime::Cuda(cuda());
    let cpu = Runtime::interpreter();
    let (s, n) = (seed(), 100_003);
    let (a, b, c) = (random_f32(n, s), random_f32(n, s + 1), random_f32(n, s + 2));
    let run = |rt: &Runtime| {
        let (da, db, dc) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap(), rt.upload(&c).unwrap());
        let (mut f, mut t, mut h) = (rt.upload(&vec![f32::NAN; n]).unwrap(), rt.upload(&vec![f32::NAN; n]).unwrap(), rt.upload(&vec![bf16::NAN; n]).unwrap());
        crate::interp::fma_and_written_out::<256>::launch(rt, grid_for(n, 256), &da, &db, &dc, &mut f, &mut t, &mut h, n as i32).unwrap();
        (f.to_vec().unwrap(), t.to_vec().unwrap(), h.to_vec().unwrap())
    };
    assert!(run(&gpu) == run(&cpu), "seed {s}");
}

/// Score modifications on the GPU (soft-capping with `tanh.approx`, ALiBi, a sliding
/// window, every score of some queries masked, a bias from data with padded keys),
/// forward and backward, on `wgmma` and on
/// `mma.sync`: the interpreter test's cases and bounds (`attention::check_score_mods`).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn flash_attention_with_score_modifications_on_gpu() {
    use kernels_lib::flash_attention::Options;
    let rt = Runtime::Cuda(cuda());
    for wgmma in [true, false] {
        crate::attention::check_score_mods(&rt, seed(), Options { wgmma, ..Options::default() });
    }
}

/// Bytes by value and clusters on the device (issue 11): after a 128-byte parameter
/// (a TMA descriptor's size and alignment), the pointer and the scalar arrive where the
/// kernel reads them; a launch in clusters of 2 programs (`cuLaunchKernelEx`) computes
/// exactly what a plain launch does; a cluster that does not tile the grid is an `Err`.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn bytes_parameters_and_clusters_on_gpu() {
    use dsl_runtime::built::LaunchArgs;
    let rt = Runtime::Cuda(cuda());
    let k = crate::built::after_bytes();
    let desc: Vec<u8> = (0..128u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut out = rt.upload(&[0i32]).unwrap();
    LaunchArgs::new(&rt).bytes(&desc).output(&mut out).scalar(-123_456i32).launch(&k, LaunchConfig::grid(1)).unwrap();
    assert_eq!(out.to_vec().unwrap(), [-123_456]);
    let n = 1 << 20;
    let sd = seed();
    let (a, b, c) = (random_f32(n, sd), random_f32(n, sd + 1), random_f32(n, sd + 2));
    let (da, db, dc) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap(), rt.upload(&c).unwrap());
    let mut plain = rt.upload(&vec![f32::NAN; n]).unwrap();
    let mut clustered = rt.upload(&vec![f32::NAN; n]).unwrap();
    relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024), &da, &db, &dc, &mut plain, n as i32).unwrap();
    relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024).cluster(2, 1, 1), &da, &db, &dc, &mut clustered, n as i32).unwrap();
    let (p, q) = (plain.to_vec().unwrap(), clustered.to_vec().unwrap());
    assert!((0..n).all(|i| p[i].to_bits() == q[i].to_bits() && p[i] == a[i].max(0.0) * b[i] + c[i]), "seed={sd}");
    let e = relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024).cluster(3, 1, 1), &da, &db, &dc, &mut clustered, n as i32).unwrap_err();
    assert!(e.to_string().contains("not a whole number"), "{e}");
}

/// `matmul_epilogue_tuned` on the device (every candidate the tuner keeps is checked by it
/// against the first): `gelu(a @ b * s + bias) + residual` and `silu(..)`, bf16 in, f32
/// out, against the f64 product with the steps in f64, within the accumulation bound plus
/// the error of `tanh.approx`/`ex2.approx` (about 2^-10 of the activation's input).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn matmul_epilogue_on_gpu() {
    use kernels_lib::activation;
    let rt = Runtime::Cuda(cuda());
    let s = seed();
    let (m, n, k) = (300, 260, 520);
    let (a, b, bias) = (random_bf16(m * k, s), random_bf16(k * n, s + 1), random_bf16(n, s + 2));
    let res = random_f32(m * n, s + 3);
    let f = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let (fa, fb) = (f(&a), f(&b));
    let (da, db, dbias, dres) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap(), rt.upload(&bias).unwrap(), rt.upload(&res).unwrap());
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let sc = 0.5f32;
    for act in [activation::GELU, activation::SILU] {
        let mut c = rt.upload(&vec![f32::NAN; m * n]).unwrap();
        kernels_lib::matmul_epilogue_tuned(&rt, &da, &db, &mut c, &dbias, &dres, mi, ni, ki, ki, 1, ni, 1, ni, 1, ni, 1, sc, act, 1, 1).unwrap();
        let got = c.to_vec().unwrap();
        for i in 0..m {
            for j in 0..n {
                let (mut p, mut sabs) = (0.0, 0.0);
                for t in 0..k {
                    p += fa[i * k + t] * fb[t * n + j];
                    sabs += (fa[i * k + t] * fb[t * n + j]).abs();
                }
                let x = p * sc as f64 + bias[j].to_f64();
                let y = if act == activation::GELU { 0.5 * x * (1.0 + (0.7978845608 * (x + 0.044715 * x * x * x)).tanh()) } else { x / (1.0 + (-x).exp()) };
                let want = y + res[i * n + j] as f64;
                let tol = 2.0 * 1.13 * k as f64 * 2f64.powi(-24) * sc as f64 * sabs + 2f64.powi(-9) * (1.0 + x.abs()) + 2f64.powi(-20) * want.abs();
                assert!((got[i * n + j] as f64 - want).abs() <= tol, "act {act} [{i}, {j}]: {} vs {want} (seed {s})", got[i * n + j]);
            }
        }
    }
}

/// The backward's `dQ` kernel warp-specialized (a producer warpgroup loads its key and
/// value tiles by TMA; the tuner offers it) computes exactly what the unspecialized kernel
/// does, at one and two consumer warpgroups (64 and 128 queries), full and causal, on a
/// ragged length, from the `lse` and `delta` of a real forward and backward; and that is
/// the library backward's `dQ`.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn warp_specialized_dq_equals_unspecialized_on_gpu() {
    use half::bf16;
    use kernels_lib::flash_attention::{all_keys, attention_backward_with, attention_bwd_dq, attention_forward_with, no_score_mod, unit_score_grad, Grads, Layout, Options, Shape};
    let rt = Runtime::Cuda(cuda());
    let (b, t, h, kv, d) = (2usize, 328usize, 4usize, 2usize, 64usize);
    let (nq, nk) = (b * h * t * d, b * kv * t * d);
    let x = |n: usize, seed: u64| rt.upload(&random_f32(n, seed).into_iter().map(|v| bf16::from_f32(v / 4.0)).collect::<Vec<_>>()).unwrap();
    let s0 = seed();
    let (q, k, v, dout) = (x(nq, s0), x(nk, s0 + 1), x(nk, s0 + 2), x(nq, s0 + 3));
    let scale = 0.125;
    for causal in [false, true] {
        let s = Shape { batch: b, seq: t, heads: h, kv_heads: kv, head_dim: d, causal, layout: Layout::Bhtd };
        let (mut o, mut lse, mut delta) = (rt.zeros::<bf16>(nq).unwrap(), rt.zeros::<f32>(b * h * t).unwrap(), rt.zeros::<f32>(b * h * t).unwrap());
        let (mut dq, mut dk, mut dv) = (rt.zeros::<bf16>(nq).unwrap(), rt.zeros::<bf16>(nk).unwrap(), rt.zeros::<bf16>(nk).unwrap());
        attention_forward_with(&rt, &s, &q, &k, &v, &mut o, &mut lse, scale, Options::default()).unwrap();
        let opts = Options { backward_dq: Some((64, 32)), ..Options::default() };
        attention_backward_with(&rt, &s, Grads { q: &q, k: &k, v: &v, o: &o, lse: &lse, dout: &dout, dq: &mut dq, dk: &mut dk, dv: &mut dv }, &mut delta, scale, opts).unwrap();
        let library = dq.to_vec().unwrap();
        let (qb, qh, qt, kb, kh, kt) = ((h * t * d) as i32, (t * d) as i32, d as i32, (kv * t * d) as i32, (t * d) as i32, d as i32);
        let (ti, hi, kvi, c) = (t as i32, h as i32, kv as i32, causal as i32);
        let no_args: &[f32] = &[];
        // (The kernel stores `delta` again: the same row sums.)
        let mut run = |bm: usize, ws: bool| -> Vec<bf16> {
            let mut out = rt.upload(&vec![bf16::NAN; nq]).unwrap();
            let cfg = LaunchConfig::grid3(t.div_ceil(bm) as u32, (b * h) as u32, 1).warps(bm as u32 / 16).stages(2).warp_specialize(ws);
            if bm == 64 {
                attention_bwd_dq::<bf16, no_score_mod, unit_score_grad, all_keys, false, 64, 32, 64>::launch(&rt, cfg, &q, &k, &v, &o, &dout, &lse, &mut delta, no_args, &mut out, ti, hi, kvi, scale, c, qb, qh, qt, kb, kh, kt).unwrap();
            } else {
                attention_bwd_dq::<bf16, no_score_mod, unit_score_grad, all_keys, false, 128, 32, 64>::launch(&rt, cfg, &q, &k, &v, &o, &dout, &lse, &mut delta, no_args, &mut out, ti, hi, kvi, scale, c, qb, qh, qt, kb, kh, kt).unwrap();
            }
            out.to_vec().unwrap()
        };
        let plain = run(64, false);
        assert!(plain == library, "causal {causal}: the direct launch is not the library's dQ");
        assert!(run(64, true) == plain, "64 queries, causal {causal}: warp-specialized dQ differs");
        assert!(run(128, true) == run(128, false), "128 queries, causal {causal}: warp-specialized dQ differs");
    }
}

/// A warp-specialized kernel loads with the registers `setmaxnreg` gives its consumers:
/// the driver's JIT linker ignores `setmaxnreg` ("to maintain compatibility across
/// compilation units"), which left the attention forward's consumers at the entry's 168
/// registers, spilling 180 bytes a thread in their loop; such kernels are loaded from their
/// PTX as a whole program instead. The unspecialized kernels keep the linker's cubin.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn warp_specialized_kernels_load_without_spills() {
    use kernels_lib::flash_attention::{attention_forward_with, Layout, Options, Shape};
    let rt = Runtime::Cuda(cuda());
    let Runtime::Cuda(c) = &rt else { unreachable!() };
    let s = Shape { batch: 1, seq: 256, heads: 2, kv_heads: 1, head_dim: 128, causal: false, layout: Layout::Bhtd };
    let (nq, nk) = (256 * 2 * 128, 256 * 128);
    let x = |n: usize, seed: u64| rt.upload(&random_f32(n, seed).into_iter().map(|v| half::bf16::from_f32(v / 4.0)).collect::<Vec<_>>()).unwrap();
    let (q, k, v) = (x(nq, 1), x(nk, 2), x(nk, 3));
    let (mut o, mut lse) = (rt.zeros::<half::bf16>(nq).unwrap(), rt.zeros::<f32>(2 * 256).unwrap());
    let opts = Options { forward_block_m: Some(128), forward_block_n: Some(128), forward_warps: Some(8), forward_stages: Some(2), warp_specialize: Some(true), ..Options::default() };
    attention_forward_with(&rt, &s, &q, &k, &v, &mut o, &mut lse, 0.088, opts).unwrap();
    assert_eq!(c.local_bytes("attention"), vec![0], "the warp-specialized forward spills");
}
