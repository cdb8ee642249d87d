//! Write every compile stage of library kernels (block IR, optimized IR, LLVM IR, PTX) for
//! a chosen GPU target, without a GPU:
//!
//! ```sh
//! cargo run -p examples --example stages -- relu_mul_add softmax --target sm_80 --warps 4 --out rutile-dump
//! cargo run -p examples --example stages -- all
//! cargo run -p examples --example stages -- --list
//! ```
//!
//! The specialization is a safe launch on aligned buffers ([`dsl_runtime::compile::stages`]).
//! For your own kernels call that function, or run them with `RUTILE_DUMP=<name>` on any
//! runtime, the CPU interpreter included (`RUTILE_DUMP_TARGET=sm_80` picks the target there).

use dsl_runtime::compile::{stages, write_stages};
use dsl_runtime::emit::Target;
use std::path::PathBuf;

fn main() {
    if let Err(e) = run() {
        eprintln!("stages: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let (mut names, mut target, mut warps, mut out) = (vec![], Target::SM90, 4u32, PathBuf::from("rutile-dump"));
    let mut args = std::env::args().skip(1);
    let catalog = kernels_lib::catalog();
    while let Some(a) = args.next() {
        let mut value = |flag: &str| args.next().ok_or(format!("{flag} needs a value"));
        match a.as_str() {
            "--target" => {
                let t = value("--target")?;
                target = Target::parse(&t).ok_or(format!("`{t}` is not a target: write sm_80, sm_90, ..."))?;
            }
            "--warps" => warps = value("--warps")?.parse().map_err(|e| format!("--warps: {e}"))?,
            "--out" => out = PathBuf::from(value("--out")?),
            "--list" => {
                catalog.iter().for_each(|(n, _)| println!("{n}"));
                return Ok(());
            }
            "all" => names.extend(catalog.iter().map(|(n, _)| n.to_string())),
            _ if a.starts_with("--") => return Err(format!("unknown flag {a}; see the doc at the top of examples/stages.rs")),
            _ => names.push(a),
        }
    }
    if names.is_empty() {
        return Err("name at least one kernel (or `all`; `--list` lists them)".into());
    }
    for name in &names {
        let (_, k) = catalog.iter().find(|(n, _)| n == name).ok_or(format!("no library kernel `{name}` (`--list` lists them)"))?;
        let art = stages(k.as_ref(), target.clone(), warps).map_err(|e| e.to_string())?;
        let paths = write_stages(&out, name, &art).map_err(|e| format!("cannot write to {}: {e}", out.display()))?;
        println!("{name} ({}, {warps} warps, {} B shared): {}", target.processor(), art.meta.shared_bytes, paths.last().map(|p| p.display().to_string()).unwrap_or_default());
    }
    Ok(())
}
