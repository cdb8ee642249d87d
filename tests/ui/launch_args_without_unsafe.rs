// `Launcher::launch_args` trusts its arguments (raw pointers, lengths, no bounds guard with
// `Safety::Unchecked`): safe code cannot call it; it calls the typed `launch`.
use dsl_runtime::launch::{Arg, Safety};
use dsl_runtime::prelude::*;

#[kernel]
fn scale<const BLOCK: usize>(x: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(x + offs, load(x + offs, offs < n, 0.0) * 2.0, offs < n);
}

fn main() {
    let rt = Runtime::interpreter();
    let args = [Arg::I32(1), Arg::I32(4)];
    let _ = rt.launch_args(&scale::<64>, &LaunchConfig::grid(1), &args, Safety::Unchecked);
}
