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
//! bench tune                 relu-mul-add and a whole-array sum, 2^12..2^28 elements: the
//!                            autotuner's choice per size against the default configuration
//!                            (BLOCK=1024, 4 warps), and the time a sweep takes
//! bench rows                 softmax f32/bf16 and RMSNorm bf16 on 4096 x 4096, softmax f32
//!                            on 32768 x 128, transpose f32 8192 x 8192: checked, then
//!                            median ms and GB/s for a few num_warps / rows-per-program /
//!                            tile choices, and the autotuned softmax and RMSNorm launches
//! ```
//!
//! Every time is the median of CUDA-event timings with the L2 cache flushed before each
//! launch (`autotune::CudaTimer`), as Triton's `do_bench` times the anchors.
//!
//! `bench/run_gpu.sh` runs all of them next to the Triton/PyTorch anchors.

use autotune::CudaTimer;
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
        "rows" => rows(),
        "tune" => tune(),
        _ => Err("usage: bench suite|smoke|coldstart|launch|rows|tune".into()),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn cuda() -> Res<CudaRuntime> {
    Ok(CudaRuntime::new(0)?)
}

/// The timer of every mode: CUDA events around each launch, 10 warm-ups, the median of
/// `reps`, the L2 cache flushed before each timed launch. This is the autotuner's timer,
/// and the same measurement as Triton's `do_bench`, which times the anchors.
fn timer(rt: &CudaRuntime, reps: usize) -> CudaTimer<'_> {
    CudaTimer::new(rt, 10, reps)
}

fn median_ms(t: &CudaTimer, mut f: impl FnMut() -> dsl_runtime::Result<()>) -> Res<f64> {
    Ok(t.median_ms(&mut || Ok(()), &mut f)?)
}

fn size_arg(default: usize) -> Res<usize> {
    Ok(std::env::args().nth(2).map(|s| s.parse()).transpose()?.unwrap_or(default))
}

fn suite() -> Res<()> {
    let cuda = cuda()?;
    let rt = Runtime::Cuda(cuda);
    let Runtime::Cuda(c) = &rt else { unreachable!() };
    let n = size_arg(1 << 26)?;
    let t = timer(c, 100);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    for mut w in examples::workloads::suite(&rt, n, seed)? {
        let err = w.check(&rt)?;
        if err > w.tolerance {
            return Err(format!("{} {}: relative error {err:e} over {:e} (seed {seed})", w.name, w.dtype, w.tolerance).into());
        }
        let ms = median_ms(&t, || w.launch(&rt))?;
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
    let ms = median_ms(&t, || unsafe { relu_mul_add::<1024>::launch_unchecked(c, grid_for(n, 1024), &a, &b, &cc, &mut out, n as i32) })?;
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

fn emit_row(name: &str, dtype: &str, cfg: &str, bytes: usize, ms: f64, err: f64) {
    println!(
        "{{\"bench\":\"{name}\",\"impl\":\"ours\",\"dtype\":\"{dtype}\",\"config\":\"{cfg}\",\"bytes\":{bytes},\"ms\":{ms:.4},\"gbs\":{:.1},\"rel_err\":{err:e}}}",
        bytes as f64 / ms / 1e6
    );
}

fn rows() -> Res<()> {
    use half::bf16;
    use kernels_lib::{rmsnorm_bf16, rmsnorm_bf16_tuned, rows_grid, softmax, softmax_bf16, softmax_tuned, transpose};
    let rt = Runtime::Cuda(cuda()?);
    let Runtime::Cuda(c) = &rt else { unreachable!() };
    let s = c.stream().clone();
    let t = timer(c, 100);
    let (r, n) = (4096usize, 4096usize);
    let mut rng = 0x2545F4914F6CDD1Du64 ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
    };
    let x: Vec<f32> = (0..r * n).map(|_| next()).collect();
    // Softmax f32: 4096 x 4096, and short rows (32768 x 128) where several rows per program
    // keep threads busy; each with the tuned launch.
    for (rows, cols) in [(r, n), (32768usize, 128usize)] {
        let name = if cols == n { "softmax" } else { "softmax_short_rows" };
        let x: Vec<f32> = if cols == n { x.clone() } else { (0..rows * cols).map(|_| next()).collect() };
        let reference = examples::workloads::softmax_rows(&x.iter().map(|&v| v as f64).collect::<Vec<_>>(), cols);
        let (dx, mut dout) = (rt.upload(&x)?, rt.upload(&vec![f32::NAN; rows * cols])?);
        let (nr, nc) = (rows as i32, cols as i32);
        let bytes = 2 * rows * cols * 4;
        macro_rules! sm {
            ($rows:literal, $block:literal, $warps:expr) => {
                for warps in $warps {
                    let grid = rows_grid(rows.div_ceil($rows), warps);
                    dout.copy_from(&vec![f32::NAN; rows * cols])?;
                    softmax::<$rows, $block>::launch(&rt, grid, &dx, &mut dout, nr, nc, nc)?;
                    let got: Vec<f64> = dout.to_vec()?.into_iter().map(|v| v as f64).collect();
                    let err = examples::workloads::rel_l2(&got, &reference);
                    if err > 1e-5 {
                        return Err(format!("{name} (ROWS {} warps {warps}): relative error {err:e}", $rows).into());
                    }
                    let ms = median_ms(&t, || softmax::<$rows, $block>::launch(&rt, grid, &dx, &mut dout, nr, nc, nc))?;
                    emit_row(name, "f32", &format!("ROWS={} BLOCK={} warps={warps}", $rows, $block), bytes, ms, err);
                }
            };
        }
        if cols == n {
            sm!(1, 4096, [4u32, 8, 16]);
        } else {
            sm!(1, 128, [1u32, 2, 4]);
            sm!(4, 128, [1u32, 2, 4]);
            sm!(8, 128, [1u32, 2, 4]);
        }
        let cfg = softmax_tuned(&rt, &dx, &mut dout, nr, nc, nc)?;
        let got: Vec<f64> = dout.to_vec()?.into_iter().map(|v| v as f64).collect();
        let err = examples::workloads::rel_l2(&got, &reference);
        if err > 1e-5 {
            return Err(format!("{name} tuned ({cfg}): relative error {err:e}").into());
        }
        let ms = median_ms(&t, || softmax_tuned(&rt, &dx, &mut dout, nr, nc, nc).map(drop).map_err(|e| dsl_runtime::Error::Launch { kernel: "softmax_tuned".into(), message: e.to_string() }))?;
        emit_row(&format!("{name}_tuned"), "f32", &cfg.to_string(), bytes, ms, err);
    }
    // Softmax bf16 (f32 math).
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let reference = examples::workloads::softmax_rows(&xb.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), n);
    let dx = s.clone_htod(&xb)?;
    let mut dout = s.clone_htod(&vec![bf16::NAN; r * n])?;
    for warps in [4u32, 8, 16] {
        s.memcpy_htod(&vec![bf16::NAN; r * n], &mut dout)?;
        softmax_bf16::<4096>::launch(c, rows_grid(r, warps), &dx, &mut dout, n as i32, n as i32)?;
        let got: Vec<f64> = s.clone_dtoh(&dout)?.into_iter().map(|v| v.to_f64()).collect();
        let err = examples::workloads::rel_l2(&got, &reference);
        if err > 1e-2 {
            return Err(format!("softmax bf16 (warps {warps}): relative error {err:e}").into());
        }
        let ms = median_ms(&t, || softmax_bf16::<4096>::launch(c, rows_grid(r, warps), &dx, &mut dout, n as i32, n as i32))?;
        emit_row("softmax", "bf16", &format!("BLOCK=4096 warps={warps}"), 2 * r * n * 2, ms, err);
        let ms = median_ms(&t, || unsafe { softmax_bf16::<4096>::launch_unchecked(c, rows_grid(r, warps), &dx, &mut dout, n as i32, n as i32) })?;
        emit_row("softmax_unchecked", "bf16", &format!("BLOCK=4096 warps={warps}"), 2 * r * n * 2, ms, err);
    }
    // RMSNorm bf16: one, two or four rows per program, and the tuned launch.
    let w: Vec<bf16> = (0..n).map(|_| bf16::from_f32(next())).collect();
    let dw = s.clone_htod(&w)?;
    let reference = examples::workloads::rmsnorm_rows(&xb.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &w.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), 1e-6);
    let (nr, nc) = (r as i32, n as i32);
    let bytes = 2 * r * n * 2 + n * 2;
    macro_rules! rms {
        ($rows:literal) => {
            for warps in [4u32, 8, 16] {
                let grid = rows_grid(r.div_ceil($rows), warps);
                s.memcpy_htod(&vec![bf16::NAN; r * n], &mut dout)?;
                rmsnorm_bf16::<$rows, 4096>::launch(c, grid, &dx, &dw, &mut dout, nr, nc, nc, 1e-6)?;
                let got: Vec<f64> = s.clone_dtoh(&dout)?.into_iter().map(|v| v.to_f64()).collect();
                let err = examples::workloads::rel_l2(&got, &reference);
                if err > 1e-2 {
                    return Err(format!("rmsnorm bf16 (ROWS {} warps {warps}): relative error {err:e}", $rows).into());
                }
                let cfg = format!("ROWS={} BLOCK=4096 warps={warps}", $rows);
                let ms = median_ms(&t, || rmsnorm_bf16::<$rows, 4096>::launch(c, grid, &dx, &dw, &mut dout, nr, nc, nc, 1e-6))?;
                emit_row("rmsnorm", "bf16", &cfg, bytes, ms, err);
                // The cost of the bounds guard.
                let ms = median_ms(&t, || unsafe { rmsnorm_bf16::<$rows, 4096>::launch_unchecked(c, grid, &dx, &dw, &mut dout, nr, nc, nc, 1e-6) })?;
                emit_row("rmsnorm_unchecked", "bf16", &cfg, bytes, ms, err);
            }
        };
    }
    rms!(1);
    rms!(2);
    rms!(4);
    // The autotuner's choice among those (and 2 warps), timed like the others.
    let (bx, bw) = (rt.upload(&xb)?, rt.upload(&w)?);
    let mut bout = rt.upload(&vec![bf16::NAN; r * n])?;
    let cfg = rmsnorm_bf16_tuned(&rt, &bx, &bw, &mut bout, nr, nc, nc, 1e-6)?;
    let err = examples::workloads::rel_l2(&bout.to_vec()?.into_iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &reference);
    if err > 1e-2 {
        return Err(format!("rmsnorm bf16 tuned ({cfg}): relative error {err:e}").into());
    }
    let ms = median_ms(&t, || rmsnorm_bf16_tuned(&rt, &bx, &bw, &mut bout, nr, nc, nc, 1e-6).map(drop).map_err(|e| dsl_runtime::Error::Launch { kernel: "rmsnorm_bf16_tuned".into(), message: e.to_string() }))?;
    emit_row("rmsnorm_tuned", "bf16", &cfg.to_string(), bytes, ms, err);
    drop((dx, dout, dw));
    // Transpose f32 8192 x 8192.
    let timer50 = timer(c, 50);
    let t = 8192usize;
    let xt: Vec<f32> = (0..t * t).map(|_| next()).collect();
    let dx = s.clone_htod(&xt)?;
    let mut dout = s.clone_htod(&vec![f32::NAN; t * t])?;
    macro_rules! tr {
        ($tile:literal, $warps:expr) => {{
            let grid = LaunchConfig::grid3((t / $tile) as u32, (t / $tile) as u32, 1).warps($warps);
            s.memcpy_htod(&vec![f32::NAN; t * t], &mut dout)?;
            transpose::<$tile>::launch(c, grid, &dx, &mut dout, t as i32, t as i32)?;
            let got = s.clone_dtoh(&dout)?;
            let bad = (0..t * t).step_by(997).filter(|&k| got[(k % t) * t + k / t] != xt[k]).count();
            if bad > 0 {
                return Err(format!("transpose (tile {}): {bad} sampled elements wrong", $tile).into());
            }
            let ms = median_ms(&timer50, || transpose::<$tile>::launch(c, grid, &dx, &mut dout, t as i32, t as i32))?;
            emit_row("transpose", "f32", &format!("TILE={} warps={}", $tile, $warps), 2 * t * t * 4, ms, 0.0);
        }};
    }
    tr!(32, 4);
    tr!(64, 4);
    tr!(64, 8);
    Ok(())
}

/// Uniform values in [lo, hi) from a xorshift generator (fast enough for 2^28 elements).
fn xorshift_fill(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut r = seed | 1;
    (0..n)
        .map(|_| {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            lo + (hi - lo) * ((r >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

fn tune() -> Res<()> {
    use kernels_lib::tuned;
    let c = cuda()?;
    let rt = Runtime::Cuda(c);
    let Runtime::Cuda(cu) = &rt else { unreachable!() };
    let t = timer(cu, 50);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let default = tuned::default_config();
    for kernel in ["relu_mul_add", "sum_f32"] {
        for log2 in (12..=28).step_by(2) {
            let n = 1usize << log2;
            let (lo, hi) = if kernel == "sum_f32" { (0.0, 1.0) } else { (-4.0, 4.0) };
            let ha = xorshift_fill(n, seed + log2 as u64, lo, hi);
            let a = rt.upload(&ha)?;
            let (b, cc) = if kernel == "sum_f32" { (rt.zeros::<f32>(1)?, rt.zeros::<f32>(1)?) } else { (rt.upload(&xorshift_fill(n, seed + 100, -4.0, 4.0))?, rt.upload(&xorshift_fill(n, seed + 200, -4.0, 4.0))?) };
            let mut out = rt.zeros::<f32>(if kernel == "sum_f32" { 1 } else { n })?;
            // First launch for this size: tunes (compiles, checks and times every candidate).
            let t0 = Instant::now();
            let cfg = if kernel == "sum_f32" {
                kernels_lib::sum_f32_tuned(&rt, &a, &mut out, n as i32)?
            } else {
                kernels_lib::relu_mul_add_tuned(&rt, &a, &b, &cc, &mut out, n as i32)?
            };
            rt.synchronize()?;
            let sweep_s = t0.elapsed().as_secs_f64();
            // The tuned launch left one launch's result.
            let got = out.to_vec()?;
            let err = if kernel == "sum_f32" {
                let want: f64 = ha.iter().map(|&v| v as f64).sum();
                (got[0] as f64 - want).abs() / want
            } else {
                let (hb, hc) = (b.to_vec()?, cc.to_vec()?);
                let bad = (0..n).step_by(4099).filter(|&i| got[i] != ha[i].max(0.0) * hb[i] + hc[i]).count();
                bad as f64
            };
            if err > 1e-4 {
                return Err(format!("{kernel} n={n}: tuned result wrong ({err:e})").into());
            }
            let mut time = |cfg: &autotune::Config| -> Res<f64> {
                median_ms(&t, || tuned::with_config(&rt, cfg, kernel, &a, &b, &cc, &mut out).expect("a listed block"))
            };
            let (d_ms, t_ms) = (time(&default)?, time(&cfg)?);
            let bytes = if kernel == "sum_f32" { 4 * n } else { 16 * n };
            println!(
                "{{\"bench\":\"tune\",\"kernel\":\"{kernel}\",\"n\":{n},\"default\":\"{default}\",\"default_ms\":{d_ms:.5},\"tuned\":\"{cfg}\",\"tuned_ms\":{t_ms:.5},\"speedup\":{:.3},\"tuned_gbs\":{:.1},\"sweep_s\":{sweep_s:.3},\"rel_err\":{err:e}}}",
                d_ms / t_ms,
                bytes as f64 / t_ms / 1e6
            );
        }
    }
    Ok(())
}
