//! Every library kernel lowered to PTX for sm_90a and sm_80 and assembled by `ptxas -v`:
//! no spills, no stack, and the vector widths the specialization promises.
//!
//! `ptxas` comes from PyPI's `nvidia-cuda-nvcc-cu12` (installed by `.ci/run`); set
//! `PTXAS` to use another. Without any ptxas these tests fail, on purpose: CI must
//! validate PTX.

use dsl_runtime::compile::{build_ir, compile_function, site, CodegenOptions};
use dsl_runtime::emit::Target;
use dsl_runtime::ir::ParamSpec;
use dsl_runtime::launch::{Kernel, Safety};
use dsl_runtime::half::bf16;
use kernels_lib::*;
use std::path::PathBuf;
use std::process::Command;

pub fn ptxas() -> PathBuf {
    if let Some(p) = std::env::var_os("PTXAS") {
        return PathBuf::from(p);
    }
    let out = Command::new("python3")
        .args(["-c", "import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], 'bin', 'ptxas'))"])
        .output()
        .expect("python3 runs");
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(p.exists(), "ptxas not found: pip install nvidia-cuda-nvcc-cu12==12.9.86, or set PTXAS");
    p
}

/// Compile `k` with every argument "nice" (aligned, divisible by 16) and return the PTX.
pub fn ptx_for(k: &dyn Kernel, target: Target, safety: Safety, num_warps: u32) -> String {
    artifacts_for(k, target, safety, num_warps).ptx
}

/// Every artifact of [`ptx_for`]'s compile.
pub fn artifacts_for(k: &dyn Kernel, target: Target, safety: Safety, num_warps: u32) -> dsl_runtime::compile::Artifacts {
    compile_nice(k, target, safety, num_warps, false)
}

/// [`artifacts_for`], as a release or a debug build.
fn compile_nice(k: &dyn Kernel, target: Target, safety: Safety, num_warps: u32, debug: bool) -> dsl_runtime::compile::Artifacts {
    let nice = ParamSpec { eq_one: false, div16: true };
    let specs = vec![nice; k.meta().params.len()];
    let f = build_ir(k, &specs).unwrap();
    let opts = CodegenOptions { num_warps, num_stages: 1, safety, len_specs: vec![nice; k.meta().pointer_params()], target, debug, wgmma: true, tma: true, tma_store: false, warp_specialize: false, min_programs_per_sm: 1, prefetch: true };
    compile_function(f, &opts, &site(k, &specs, None)).unwrap_or_else(|e| panic!("{}: {e}", k.meta().name))
}

/// Assemble with ptxas -v; return its report.
pub fn assemble(ptx: &str, arch: &str, name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("rutile-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}-{arch}.ptx"));
    std::fs::write(&file, ptx).unwrap();
    let out = Command::new(ptxas()).args([&format!("-arch={arch}"), "-v", "-o", "/dev/null"]).arg(&file).output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "ptxas rejected {name} for {arch}:\n{report}\n{ptx}");
    report
}

/// The machine code (SASS) ptxas makes of `ptx` for `arch`, as nvdisasm prints it (from
/// PyPI's nvidia-cuda-nvdisasm, installed by scripts/install-deps.sh; or `NVDISASM`).
pub fn sass(ptx: &str, arch: &str, name: &str) -> String {
    assemble_to_sass(ptx, arch, name).1
}

/// [`assemble`]'s report and [`sass`]'s machine code from one run of ptxas.
pub fn assemble_to_sass(ptx: &str, arch: &str, name: &str) -> (String, String) {
    let nvdisasm = std::env::var_os("NVDISASM").map(PathBuf::from).unwrap_or_else(|| {
        let out = Command::new("python3")
            .args(["-c", "import nvidia, os, glob; print((glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'bin', 'nvdisasm')) + [''])[0])"])
            .output()
            .expect("python3 runs");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    });
    assert!(nvdisasm.is_file(), "nvdisasm not found: pip install nvidia-cuda-nvdisasm==13.5.37, or set NVDISASM");
    let dir = std::env::temp_dir().join(format!("rutile-sass-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (file, cubin) = (dir.join(format!("{name}-{arch}.ptx")), dir.join(format!("{name}-{arch}.cubin")));
    std::fs::write(&file, ptx).unwrap();
    let out = Command::new(ptxas()).args([&format!("-arch={arch}"), "-v", "-o"]).arg(&cubin).arg(&file).output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "ptxas rejected {name} for {arch}: {report}");
    let out = Command::new(nvdisasm).arg(&cubin).output().unwrap();
    assert!(out.status.success(), "nvdisasm failed on {name} for {arch}: {}", String::from_utf8_lossy(&out.stderr));
    (report, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The instructions of every loop of `sass` (from a label to a branch back to it), one
/// string per loop, outer loops holding their inner ones.
pub fn loop_bodies(sass: &str) -> Vec<String> {
    let lines: Vec<&str> = sass.lines().collect();
    let mut labels = std::collections::HashMap::new();
    let mut loops = vec![];
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim();
        if let Some(name) = t.strip_suffix(':').filter(|n| n.starts_with(".L_x_")) {
            labels.insert(name.to_string(), i);
        } else if let Some(target) = t.split("`(").nth(1).and_then(|r| r.split(')').next()) {
            if t.contains("BRA") {
                if let Some(&start) = labels.get(target) {
                    loops.push(lines[start..=i].join("\n"));
                }
            }
        }
    }
    loops
}

/// The longest chain of `opcode` instructions in `code` (SASS, in program order) each
/// reading the previous one's result: 1 for independent ones.
pub fn longest_chain(code: &str, opcode: &str) -> usize {
    let mut depth: std::collections::HashMap<String, usize> = Default::default();
    let mut longest = 0;
    for line in code.lines() {
        let ins = line.split("*/").nth(1).unwrap_or("").trim().trim_end_matches(';');
        let ins = ins.strip_prefix('@').map_or(ins, |r| r.split_once(' ').map_or("", |x| x.1)).trim();
        let Some((op, args)) = ins.split_once(' ') else { continue };
        let regs: Vec<String> = args.split(',').map(|a| a.trim().trim_start_matches('-').split(['.', ' ']).next().unwrap_or("").to_string()).collect();
        let Some((dst, srcs)) = regs.split_first() else { continue };
        if op.split('.').next() == Some(opcode) {
            let d = 1 + srcs.iter().filter_map(|r| depth.get(r)).max().copied().unwrap_or(0);
            longest = longest.max(d);
            depth.insert(dst.clone(), d);
        } else {
            depth.remove(dst);
        }
    }
    longest
}

/// The library's catalog and the test kernels of `rows`.
fn kernels() -> Vec<(&'static str, Box<dyn Kernel>)> {
    let mut all = catalog();
    all.push(("strided_sum", Box::new(crate::rows::strided_sum::<256>)));
    all.push(("features", Box::new(crate::rows::features)));
    all.push(("swaps", Box::new(crate::rows::swaps)));
    all.push(("cube", Box::new(crate::rows::cube)));
    all
}

#[test]
fn row_kernels_use_shared_memory_only_where_needed() {
    for (name, k, warps, expect_smem) in [
        ("softmax", Box::new(softmax::<f32, 1, 4096>::new()) as Box<dyn Kernel>, 8, true), // reductions across 8 warps
        ("rmsnorm_bf16", Box::new(rmsnorm_bf16::<2, 4096>), 8, true),
        ("row_sum_mean", Box::new(row_sum_mean::<16, 64>), 4, true), // one conversion after the loop
        ("transpose", Box::new(transpose::<64>), 4, true),           // one conversion
    ] {
        // Dynamic shared memory (which `ptxas -v` does not see) is in the compiled kernel's
        // metadata record.
        let smem = artifacts_for(k.as_ref(), Target::SM90, Safety::Guarded, warps).meta.shared_bytes;
        eprintln!("{name}: {smem} bytes of shared memory");
        assert_eq!(smem > 0, expect_smem, "{name}: {smem} bytes");
        assert!(smem <= 48 * 1024, "{name}: {smem}");
    }
    // Row sums: lanes reduce with shuffles inside the loop, and the only barrier is the
    // one inside the conversion after it (between its writes and its reads).
    let ptx = ptx_for(&row_sum_mean::<16, 64>, Target::SM90, Safety::Guarded, 4);
    assert_eq!(ptx.matches("bar.sync").count(), 1, "{ptx}");
    // The transpose loads and stores 128-bit vectors on both sides.
    let ptx = ptx_for(&transpose::<64>, Target::SM90, Safety::Guarded, 4);
    assert!(ptx.contains("ld.global.v4.b32") && ptx.contains("st.global.v4.b32"), "{ptx}");
    // Softmax over a 4096-element row loads it with 128-bit vectors.
    let ptx = ptx_for(&softmax::<f32, 1, 4096>::new(), Target::SM90, Safety::Guarded, 8);
    assert!(ptx.contains("ld.global.v4.b32") && ptx.contains("shfl.sync.bfly"), "{ptx}");
}

/// Barriers where a shared-memory hazard exists and nowhere else (`lower::smem`): each
/// use of shared memory needs one barrier between its writes and its reads; one before
/// its writes only where they could overwrite what other threads still read.
#[test]
fn barriers_only_where_a_hazard_exists() {
    let count = |k: &dyn Kernel, warps| ptx_for(k, Target::SM90, Safety::Guarded, warps).matches("bar.sync").count();
    // With a barrier before every use, these were 8, 4 and 4.
    // Softmax, 8 warps: the one-block path's max and sum across warps (the sum's scratch
    // goes beside the max's: 2 barriers, not 4) and the looping path's two loops, each
    // reducing across warps once per iteration (a barrier inside, one at the latch).
    assert_eq!(count(&softmax::<f32, 1, 4096>::new(), 8), 6);
    // RMSNorm: the one-block and the looping path's sums of squares, one barrier each.
    assert_eq!(count(&rmsnorm_bf16::<2, 4096>, 8), 2);
    // A loop whose body makes two reductions across warps: the second's scratch goes beside
    // the first's (no barrier before its writes), and the next iteration's first writes
    // (the max's scratch) do not touch what this one leaves pending (reads of the sum's),
    // so the latch needs no barrier: 2 (3 when any pending access forced one at the latch).
    assert_eq!(count(&crate::rows::warp_sum_loop, 4), 2);
}

/// `fma` is one `fma.rn.f32` (one FFMA), and `a * b + c` written out stays two roundings
/// (`mul.rn` and `add.rn`, which ptxas does not contract).
#[test]
fn fma_is_one_instruction_and_written_out_stays_two() {
    let ptx = ptx_for(&crate::interp::fma_and_written_out::<256>, Target::SM90, Safety::Guarded, 4);
    assert!(ptx.contains("fma.rn.f32") && ptx.contains("mul.rn.f32") && ptx.contains("add.rn.f32"), "{ptx}");
    let code = sass(&ptx, "sm_90a", "fma");
    assert!(code.contains("FFMA") && code.contains("FMUL"), "{code}");
}

#[test]
fn loops_keep_128_bit_accesses() {
    // A counter stepping by BLOCK (RMSNorm's two-pass path, softmax over long rows) and a
    // pointer carried around the loop (`p = p + BLOCK`): every access is a vector.
    for (name, k, scalar) in [
        ("rmsnorm_bf16", Box::new(rmsnorm_bf16::<2, 256>) as Box<dyn Kernel>, "ld.global.b16"),
        ("softmax_looping", Box::new(softmax::<f32, 2, 1024>::new()), "ld.global.b32"),
        ("strided_sum", Box::new(crate::rows::strided_sum::<256>), "ld.global.b32"),
    ] {
        let ptx = ptx_for(k.as_ref(), Target::SM90, Safety::Guarded, 4);
        assert!(ptx.contains("ld.global.v4.b32") && !ptx.contains(scalar), "{name}:\n{ptx}");
    }
}

#[test]
fn every_kernel_assembles_without_spills() {
    for (name, k) in kernels() {
        for (target, arch) in [(Target::SM90, "sm_90a"), (Target::SM80, "sm_80")] {
            for safety in [Safety::Guarded, Safety::Unchecked] {
                let ptx = ptx_for(k.as_ref(), target.clone(), safety, 4);
                let report = assemble(&ptx, arch, name);
                assert!(report.contains("0 bytes spill stores") && report.contains("0 bytes spill loads"), "{name} {arch} spills:\n{report}");
                assert!(report.contains("0 bytes stack frame"), "{name} {arch} uses a stack frame:\n{report}");
            }
        }
    }
}

#[test]
fn aligned_launches_use_128_bit_accesses() {
    let ptx = ptx_for(&relu_mul_add::<f32, 1024>::new(), Target::SM90, Safety::Guarded, 4);
    assert_eq!(ptx.matches("ld.global.v4.b32").count(), 6, "3 loads x 2 vectors per thread:\n{ptx}");
    assert_eq!(ptx.matches("st.global.v4.b32").count(), 2, "{ptx}");
    let ptx = ptx_for(&relu_mul_add::<bf16, 2048>::new(), Target::SM90, Safety::Guarded, 4);
    assert!(ptx.contains("ld.global.v4.b32") && ptx.contains("st.global.v4.b32"), "bf16 moves 8 elements per access:\n{ptx}");
}

/// The bounds guard compares the offset the kernel added with the length: one 32-bit
/// unsigned compare per vector for an `i32` offset (`min(len, 2^31)` computed once), not
/// the address's distance from the buffer in 64 bits; two offsets added one after the
/// other (`p + x + y`) are summed in 64 bits, as the address is.
#[test]
fn the_guard_compares_the_offset_the_kernel_added() {
    let ptx = ptx_for(&relu_mul_add::<f32, 1024>::new(), Target::SM90, Safety::Guarded, 4);
    let body = ptx.split_once('{').map(|(_, b)| b).unwrap_or(&ptx);
    assert!(body.matches("setp.lt.u32").count() >= 4 && body.contains("min.s64"), "{ptx}");
    assert!(!body.contains("sub.s64") && !body.contains("shr.s64") && !body.contains("setp.lt.u64"), "the guard recomputes offsets from addresses:\n{ptx}");
    // `rmsnorm_bf16` reads `x + base + cols`: the 64-bit form.
    let ptx = ptx_for(&rmsnorm_bf16::<1, 4096>::new(), Target::SM90, Safety::Guarded, 4);
    assert!(ptx.contains("setp.lt.u64") && !ptx.contains("shr.s64"), "{ptx}");
}

#[test]
fn mixed_element_sizes_keep_every_access_contiguous() {
    // bf16 -> f32: 4 elements per thread, so the bf16 loads move 8 bytes and the f32
    // stores 16 bytes per lane, both without gaps between lanes.
    let ptx = ptx_for(&convert::<bf16, f32, 1024>::new(), Target::SM90, Safety::Guarded, 4);
    assert!(ptx.contains("ld.global.v2.b32") && ptx.contains("st.global.v4.b32"), "{ptx}");
    assert!(!ptx.contains("ld.global.v4.b32"), "{ptx}");
    // i32 in, i32 and u8 out: the u8 stores move 4 bytes per lane.
    let ptx = ptx_for(&clamp_i32::<1024>, Target::SM90, Safety::Guarded, 4);
    assert!(ptx.contains("ld.global.v4.b32") && ptx.contains("st.global.v4.b32") && ptx.contains("st.global.b32"), "{ptx}");
}

#[test]
fn unaligned_launches_fall_back_to_scalar_accesses() {
    let k = relu_mul_add::<f32, 1024>::new();
    let specs = vec![ParamSpec::default(); 5];
    let f = build_ir(&k, &specs).unwrap();
    let opts = CodegenOptions { num_warps: 4, num_stages: 1, safety: Safety::Guarded, len_specs: vec![ParamSpec::default(); 4], target: Target::SM90, debug: false, wgmma: true, tma: true, tma_store: false, warp_specialize: false, min_programs_per_sm: 1, prefetch: true };
    let ptx = compile_function(f, &opts, &site(&k, &specs, None)).unwrap().ptx;
    assert!(!ptx.contains(".v4."), "{ptx}");
    assert!(ptx.contains("ld.global.b32"), "{ptx}");
}

#[test]
fn num_warps_is_honoured() {
    for w in [1u32, 2, 4, 8, 16] {
        let ptx = ptx_for(&relu_mul_add::<f32, 4096>::new(), Target::SM90, Safety::Guarded, w);
        assert!(ptx.contains(&format!(".maxntid {}, 1, 1", 32 * w)), "{ptx}");
        assemble(&ptx, "sm_90a", &format!("warps{w}"));
    }
}



/// Checked launches (debug builds of guarded launches) record the first out-of-bounds lane
/// in the `rutile_oob` device global: a bounds check before every access in the IR, a
/// compare-and-swap claim in the PTX, still assembled by ptxas; other builds carry none of
/// it. (The GPU test `gpu::checked_launches_report_out_of_bounds_lanes_like_the_interpreter`
/// runs it.)
#[test]
fn checked_launches_carry_the_out_of_bounds_record_and_others_do_not() {
    let compile_for = |target: Target, safety: Safety, debug: bool| compile_nice(&relu_mul_add::<f32, 1024>::new(), target, safety, 4, debug);
    let compile = |safety: Safety, debug: bool| compile_for(Target::SM90, safety, debug);
    let checked = compile(Safety::Guarded, true);
    assert_eq!(checked.opt_ir.matches("bounds_check").count(), 4, "three loads and a store:\n{}", checked.opt_ir);
    assert!(checked.opt_ir.contains("bounds_check store %out"), "{}", checked.opt_ir);
    assert!(checked.ptx.contains("rutile_oob") && checked.ptx.contains("atom.global.cas.b64"), "{}", checked.ptx);
    assemble(&checked.ptx, "sm_90a", "checked");
    assemble(&compile_for(Target::SM80, Safety::Guarded, true).ptx, "sm_80", "checked");
    // Every kernel's checked build (loops, branches, atomics, scalar accesses) assembles.
    for (name, k) in kernels() {
        let art = compile_nice(k.as_ref(), Target::SM90, Safety::Guarded, 4, true);
        assert!(art.ptx.contains("rutile_oob"), "{name}");
        assemble(&art.ptx, "sm_90a", &format!("{name}-checked"));
    }
    for (safety, debug) in [(Safety::Guarded, false), (Safety::Unchecked, true)] {
        let art = compile(safety, debug);
        assert!(!art.opt_ir.contains("bounds_check") && !art.ptx.contains("rutile_oob"), "{safety:?} debug={debug}:\n{}", art.ptx);
    }
}

/// The metadata record beside every compiled kernel: its symbol, shared memory, warps,
/// stages, target and parameter layout (the arguments, then a length per pointer in a
/// guarded launch); what the driver checks a launch against.
#[test]
fn compiled_kernels_carry_their_launch_metadata() {
    let guarded = artifacts_for(&relu_mul_add::<f32, 1024>::new(), Target::SM80, Safety::Guarded, 8).meta;
    assert_eq!((guarded.name.as_str(), guarded.num_warps, guarded.num_stages, guarded.target), ("relu_mul_add", 8, 1, (8, 0)));
    let layout: Vec<(&str, u32)> = guarded.params.iter().map(|p| (p.name.as_str(), p.bytes)).collect();
    assert_eq!(layout, [("a", 8), ("b", 8), ("c", 8), ("out", 8), ("n", 4), ("a.len", 8), ("b.len", 8), ("c.len", 8), ("out.len", 8)]);
    assert_eq!(guarded.shared_bytes, 0);
    let unchecked = artifacts_for(&relu_mul_add::<f32, 1024>::new(), Target::SM90, Safety::Unchecked, 4).meta;
    assert_eq!(unchecked.params.len(), 5);
    assert!(artifacts_for(&softmax::<f32, 1, 4096>::new(), Target::SM90, Safety::Guarded, 8).meta.shared_bytes > 0);
    assert_eq!(guarded.version, dsl_runtime::compile::META_VERSION);
}

/// Layout conversions are instructions of the program the lowering sees
/// (`passes::convert`), and the lowering converts nowhere else.
#[test]
fn conversions_are_explicit_in_the_lowered_program() {
    let conversions = |k: &dyn Kernel| artifacts_for(k, Target::SM90, Safety::Guarded, 4).opt_ir.matches("convert_layout").count();
    // Elementwise: every value in one layout.
    assert_eq!(conversions(&relu_mul_add::<f32, 1024>::new()), 0);
    // The transpose: the loaded tile and the mask (both transposed) move to the layout of
    // the store, through shared memory; the index expressions are recomputed.
    let t = conversions(&transpose::<64>::new());
    assert!(t >= 2, "{t}");
    // The dump gives every block value its layout (`#L<n>`, defined at the top), as the
    // lowering must produce it.
    let ir = artifacts_for(&transpose::<64>::new(), Target::SM90, Safety::Guarded, 4).opt_ir;
    assert!(ir.starts_with("#L0 = linear[64]"), "{ir}");
    for line in ir.lines().filter(|l| l.contains("convert_layout") || l.contains(" = load ")) {
        assert!(line.contains(" #L"), "no layout: {line}");
    }
}

