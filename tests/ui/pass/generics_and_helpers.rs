//! Compiles and runs on the interpreter: kernels generic over element types, and
//! `#[kernel_fn]` helpers (generic, with compile-time parameters, calling each other,
//! called by path, returning masks, reading through pointers).
use dsl_runtime::prelude::*;

mod act {
    use dsl_runtime::prelude::*;

    /// `max(x, 0)` in the type of `x`.
    #[kernel_fn]
    pub fn relu<T: Float>(x: T) -> T {
        maximum(x, 0.0)
    }

    /// `relu(x) * scale`: a helper calling a helper.
    #[kernel_fn]
    pub fn scaled_relu<T: Float>(x: T, scale: T) -> T {
        relu(x) * scale
    }
}

/// Lanes `0..N` that are below `n`: a helper with a compile-time parameter, returning a mask.
#[kernel_fn]
fn lanes<const N: usize>(start: i32, n: i32) -> bool {
    start + arange::<N>() < n
}

/// Reads through a pointer parameter; the element type comes from the pointer.
#[kernel_fn]
fn load_f32<T: Float>(p: Ptr<T>, m: bool) -> f32 {
    load(p, m, 0.0) as f32
}

/// Nothing to return: a helper may only check.
#[kernel_fn]
fn check_positive(x: f32) {
    device_assert(x >= 0.0, "negative");
}

#[kernel]
fn fused<T: Float, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let start = program_id(0) * BLOCK;
    let m = lanes::<BLOCK>(start, n);
    let offs = start + arange::<BLOCK>();
    let v = act::scaled_relu(load(x + offs, m, 0.0), 2.0);
    check_positive(v as f32);
    let w = load_f32(x + offs, m);
    store(out + offs, v + (w - w) as T, m);
}

/// An integer type parameter.
#[kernel]
fn add_one<T: Int, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(out + offs, load(x + offs, offs < n) + 1, offs < n);
}

/// Two element types, and `zeros::<T>` / `cast::<T>` with a type parameter.
#[kernel]
fn widen<S: Float, D: Float, const BLOCK: usize>(x: Ptr<S>, out: Ptr<D>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let zero = zeros::<D>([BLOCK]);
    store(out + offs, cast::<D>(load(x + offs, offs < n)) + zero, offs < n);
}

/// A kernel generic over a helper: `F` is any `#[kernel_fn]` of one `f32`, called as
/// `F(..)`; each helper given is an instantiation of its own, tuned on its own.
#[kernel(tune(BLOCK = [32, 64], key = [n], grid = (n as usize).div_ceil(BLOCK)))]
fn map<F: KernelFn, const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(out + offs, F(load(x + offs, offs < n)), offs < n);
}

/// Helper and element type parameters together: `<name>_tuned` takes them in the kernel's
/// order (`map_as::<halve, _>`).
#[kernel(tune(BLOCK = [32, 64], key = [n], grid = (n as usize).div_ceil(BLOCK)))]
fn map_as<F: KernelFn, T: Float, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(out + offs, F(load(x + offs, offs < n).to::<f32>()).to::<T>(), offs < n);
}

/// A constant without candidates is the caller's (`scale_rows_tuned::<2, _>`), the
/// others tuned; the grid is 2-D (a tuple).
#[kernel(tune(BLOCK = [32, 64], key = [n], grid = ((n as usize).div_ceil(BLOCK), ROWS)))]
fn scale_rows<const ROWS: usize, T: Float, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = program_id(1) * n + program_id(0) * BLOCK + arange::<BLOCK>();
    let inside = program_id(0) * BLOCK + arange::<BLOCK>() < n;
    store(out + offs, (load(x + offs, inside).to::<f32>() * (ROWS as f32)).to::<T>(), inside);
}

#[kernel_fn]
fn square(x: f32) -> f32 {
    x * x
}

#[kernel_fn]
fn halve<T: Float>(x: T) -> T {
    x * 0.5
}

fn main() {
    let rt = Runtime::interpreter();
    let v: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let (mut sq, mut hv) = (vec![f32::NAN; 100], vec![f32::NAN; 100]);
    map::<square, 64>::launch(&rt, LaunchConfig::grid(2), &v, &mut sq, 100).unwrap();
    let (dv, mut dh) = (rt.upload(&v).unwrap(), rt.zeros::<f32>(100).unwrap());
    map_tuned::<halve>(&rt, &dv, &mut dh, 100).unwrap();
    hv.copy_from_slice(&dh.to_vec().unwrap());
    let (dbf, mut dbo) = (rt.upload(&vec![bf16::from_f32(3.0); 100]).unwrap(), rt.zeros::<bf16>(100).unwrap());
    map_as_tuned::<halve, _>(&rt, &dbf, &mut dbo, 100).unwrap();
    assert!(dbo.to_vec().unwrap().iter().all(|&x| x == bf16::from_f32(1.5)));
    // Two rows of 100 with ROWS = 2 given, then ROWS = 3 (another tuner).
    let (dx, mut dy) = (rt.upload(&vec![1.0f32; 300]).unwrap(), rt.zeros::<f32>(300).unwrap());
    let cfg = scale_rows_tuned::<2, _>(&rt, &dx, &mut dy, 100).unwrap();
    assert!(cfg.get("BLOCK") == 32 || cfg.get("BLOCK") == 64);
    let y = dy.to_vec().unwrap();
    assert!(y[..200].iter().all(|&v| v == 2.0) && y[200..].iter().all(|&v| v == 0.0));
    scale_rows_tuned::<3, _>(&rt, &dx, &mut dy, 100).unwrap();
    assert!(dy.to_vec().unwrap().iter().all(|&v| v == 3.0));
    assert!((0..100).all(|i| sq[i] == v[i] * v[i] && hv[i] == v[i] * 0.5));
    use dsl_runtime::launch::Kernel;
    assert_ne!(map::<square, 64>::new().id(), map::<halve, 64>::new().id());
    assert!(map::<square, 64>::new().constants().contains(&("F", "square".to_string())));

    let n = 100usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 - 50.0).collect();
    let mut out = vec![f32::NAN; n];
    fused::<f32, 64>::launch(&rt, LaunchConfig::grid(2).debug(true), &x, &mut out, n as i32).unwrap();
    assert!((0..n).all(|i| out[i] == 2.0 * x[i].max(0.0)));
    let xh: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let mut outh = vec![f16::NAN; n];
    fused::<_, 64>::launch(&rt, LaunchConfig::grid(2), &xh, &mut outh, n as i32).unwrap();
    assert!((0..n).all(|i| outh[i].to_f32() == 2.0 * x[i].max(0.0)));

    let xi: Vec<u8> = (0..n as u8).collect();
    let mut oi = vec![0u8; n];
    add_one::<u8, 64>::launch(&rt, LaunchConfig::grid(2), &xi, &mut oi, n as i32).unwrap();
    assert!((0..n).all(|i| oi[i] == xi[i] + 1));

    let mut wide = vec![f32::NAN; n];
    widen::<bf16, f32, 64>::launch(&rt, LaunchConfig::grid(2), &vec![bf16::from_f32(1.5); n], &mut wide, n as i32).unwrap();
    assert!(wide.iter().all(|&v| v == 1.5));
}
