//! Benchmarks of the foundation slice, printed as JSON lines (one object per result).
//!
//! ```text
//! bench suite [N]            every workload of `examples::workloads` at N (default 2^26)
//!                            elements: checked, then median ms and GB/s; plus relu-mul-add
//!                            without bounds guards
//! bench smoke [N]            the same workloads on the CPU interpreter, checked, not timed
//! bench coldstart            first launch: runtime creation, then compile + load + run
//!                            (point RUTILE_CACHE_DIR at an empty directory for a cold
//!                            cache, at the same directory again for a warm one)
//! bench launch               host time per launch of a cached tiny kernel, no syncs
//! ```
//!
//! `bench/run_gpu.sh` runs all of them next to the Triton/PyTorch anchors.

use dsl_runtime::cudarc::driver::sys::CUevent_flags;
use dsl_runtime::driver::CudaRuntime;
use dsl_runtime::prelude::*;
use kernels_lib::{grid_for, relu_mul_add};
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let r = match mode.as_str() {
        "suite" => suite(),
        "smoke" => smoke(),
        "coldstart" => coldstart(),
        "launch" => launch(),
        _ => Err("usage: bench suite|smoke|coldstart|launch".into()),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn cuda() -> Res<CudaRuntime> {
    Ok(CudaRuntime::new(0)?)
}

fn median_ms(rt: &CudaRuntime, reps: usize, mut f: impl FnMut() -> dsl_runtime::Result<()>) -> Res<f64> {
    for _ in 0..10 {
        f()?;
    }
    let mut t = vec![];
    for _ in 0..reps {
        let a = rt.stream().record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        f()?;
        let b = rt.stream().record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        b.synchronize()?;
        t.push(a.elapsed_ms(&b)? as f64);
    }
    t.sort_by(|x, y| x.partial_cmp(y).unwrap());
    Ok(t[t.len() / 2])
}

fn size_arg(default: usize) -> Res<usize> {
    Ok(std::env::args().nth(2).map(|s| s.parse()).transpose()?.unwrap_or(default))
}

fn suite() -> Res<()> {
    let cuda = cuda()?;
    let rt = Runtime::Cuda(cuda);
    let Runtime::Cuda(c) = &rt else { unreachable!() };
    let n = size_arg(1 << 26)?;
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    for mut w in examples::workloads::suite(&rt, n, seed)? {
        let err = w.check(&rt)?;
        if err > w.tolerance {
            return Err(format!("{} {}: relative error {err:e} over {:e} (seed {seed})", w.name, w.dtype, w.tolerance).into());
        }
        let ms = median_ms(c, 100, || w.launch(&rt))?;
        println!(
            "{{\"bench\":\"{}\",\"impl\":\"ours\",\"dtype\":\"{}\",\"n\":{n},\"bytes\":{},\"ms\":{ms:.4},\"gbs\":{:.1},\"rel_err\":{err:e}}}",
            w.name,
            w.dtype,
            w.bytes,
            w.bytes as f64 / ms / 1e6
        );
    }
    // The cost of the bounds guard: relu-mul-add f32 through `launch_unchecked`.
    let s = c.stream();
    let host: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
    let (a, b, cc) = (s.clone_htod(&host)?, s.clone_htod(&host)?, s.clone_htod(&host)?);
    let mut out = s.alloc_zeros::<f32>(n)?;
    let ms = median_ms(c, 100, || unsafe { relu_mul_add::<1024>::launch_unchecked(c, grid_for(n, 1024), &a, &b, &cc, &mut out, n as i32) })?;
    println!("{{\"bench\":\"relu_mul_add_unchecked\",\"impl\":\"ours\",\"dtype\":\"f32\",\"n\":{n},\"bytes\":{},\"ms\":{ms:.4},\"gbs\":{:.1}}}", 16 * n, (16 * n) as f64 / ms / 1e6);
    Ok(())
}

fn smoke() -> Res<()> {
    let rt = Runtime::interpreter();
    let n = size_arg(5000)?;
    for mut w in examples::workloads::suite(&rt, n, 42)? {
        let err = w.check(&rt)?;
        let ok = err <= w.tolerance;
        println!("{{\"bench\":\"{}\",\"impl\":\"ours-interpreter\",\"dtype\":\"{}\",\"n\":{n},\"rel_err\":{err:e},\"ok\":{ok}}}", w.name, w.dtype);
        if !ok {
            return Err(format!("{} {}: relative error {err:e}", w.name, w.dtype).into());
        }
    }
    Ok(())
}

fn coldstart() -> Res<()> {
    let t0 = Instant::now();
    let rt = cuda()?;
    let t_rt = t0.elapsed().as_secs_f64() * 1e3;
    let n = 4096;
    let s = rt.stream();
    let host: Vec<f32> = (0..n).map(|i| i as f32 - 2000.0).collect();
    let (a, b, c) = (s.clone_htod(&host)?, s.clone_htod(&host)?, s.clone_htod(&host)?);
    let mut out = s.alloc_zeros::<f32>(n)?;
    s.synchronize()?;
    let t1 = Instant::now();
    relu_mul_add::<1024>::launch(&rt, grid_for(n, 1024), &a, &b, &c, &mut out, n as i32)?;
    rt.synchronize()?;
    let t_first = t1.elapsed().as_secs_f64() * 1e3;
    let got = s.clone_dtoh(&out)?;
    let ok = (0..n).all(|i| got[i] == host[i].max(0.0) * host[i] + host[i]);
    let st = rt.compiler().stats();
    println!(
        "{{\"bench\":\"coldstart\",\"runtime_ms\":{t_rt:.1},\"first_launch_ms\":{t_first:.2},\"compiled\":{},\"disk_hits\":{},\"correct\":{ok}}}",
        st.compiled, st.disk_hits
    );
    Ok(())
}

fn launch() -> Res<()> {
    let rt = cuda()?;
    let n = 1024;
    let s = rt.stream();
    let host = vec![1.0f32; n];
    let (a, b, c) = (s.clone_htod(&host)?, s.clone_htod(&host)?, s.clone_htod(&host)?);
    let mut out = s.alloc_zeros::<f32>(n)?;
    let cfg = grid_for(n, 1024);
    for _ in 0..1000 {
        relu_mul_add::<1024>::launch(&rt, cfg, &a, &b, &c, &mut out, n as i32)?;
    }
    rt.synchronize()?;
    let iters = 20000;
    let t = Instant::now();
    for _ in 0..iters {
        relu_mul_add::<1024>::launch(&rt, cfg, &a, &b, &c, &mut out, n as i32)?;
    }
    let host_us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    rt.synchronize()?;
    let total_us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!("{{\"bench\":\"launch\",\"host_us_per_launch\":{host_us:.2},\"wall_us_per_launch\":{total_us:.2},\"launches_per_s\":{:.0}}}", 1e6 / host_us);
    raw_driver_floor(&rt, iters)
}

/// The driver's own cost: `cuLaunchKernel` of an empty kernel with the same 9 parameters
/// as the guarded relu-mul-add, on the same stream.
fn raw_driver_floor(rt: &CudaRuntime, iters: usize) -> Res<()> {
    use dsl_runtime::cudarc::driver::{result, sys};
    use std::ffi::c_void;
    let ptx = c".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry empty(.param .u64 a, .param .u64 b, .param .u64 c, .param .u64 d, .param .u32 n, .param .u64 la, .param .u64 lb, .param .u64 lc, .param .u64 ld) { ret; }\n";
    rt.context().bind_to_thread()?;
    let (mut module, mut func) = (std::ptr::null_mut(), std::ptr::null_mut());
    unsafe {
        sys::cuModuleLoadData(&mut module, ptx.as_ptr() as *const c_void).result()?;
        sys::cuModuleGetFunction(&mut func, module, c"empty".as_ptr()).result()?;
    }
    let mut slots = [0u64; 9];
    let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
    let stream = rt.stream().cu_stream();
    let t = Instant::now();
    for _ in 0..iters {
        unsafe { result::launch_kernel(func, (1, 1, 1), (128, 1, 1), 0, stream, &mut params)? };
    }
    let host_us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    rt.synchronize()?;
    println!("{{\"bench\":\"launch_driver_floor\",\"host_us_per_launch\":{host_us:.2}}}");
    Ok(())
}
