//! Emission: an LLVM module → optimized PTX text, through LLVM's NVPTX backend.
//!
//! Runs `default<O3>` through the new pass manager, then the NVPTX code generator for the
//! [`Target`]'s `sm_XY` processor. Rejects PTX that calls undeclared `llvm.nvvm.*`
//! functions: LLVM turns an intrinsic name it does not know into an external call
//! instead of failing, and such PTX would only fail at load time.

use crate::error::StageError;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target as LlvmTarget, TargetMachine, TargetTriple};
use inkwell::OptimizationLevel;
use std::sync::Once;

/// The GPU architecture code is generated for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Compute capability (major, minor).
    pub cc: (u32, u32),
}

impl Target {
    pub const SM90: Target = Target { cc: (9, 0) };
    pub const SM80: Target = Target { cc: (8, 0) };
    /// `sm_80`, `sm_90`, `sm_90a`, `80`, `9.0`: the compute capability they name.
    ///
    /// ```
    /// use dsl_runtime::emit::Target;
    /// assert_eq!(Target::parse("sm_90a"), Some(Target::SM90));
    /// assert_eq!(Target::parse("8.0"), Some(Target::SM80));
    /// assert_eq!(Target::parse("sm_70"), None); // before Ampere
    /// assert_eq!(Target::parse("sm_9ä"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Target> {
        let s = s.trim().trim_start_matches("sm_").trim_end_matches('a');
        if !s.is_ascii() {
            return None;
        }
        let (ma, mi) = match s.split_once('.') {
            Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
            None if s.len() >= 2 => (s[..s.len() - 1].parse().ok()?, s[s.len() - 1..].parse().ok()?),
            None => return None,
        };
        (ma >= 8).then_some(Target { cc: (ma, mi) })
    }

    /// Whether the target has Hopper's warpgroup `wgmma` (sm_90a: compute capability 9.0).
    pub fn has_wgmma(&self) -> bool {
        self.cc == (9, 0)
    }

    /// The LLVM target features: PTX ISA 7.8 below sm_90 (LLVM's default for sm_80 is
    /// 7.0, which lacks `cp.async`'s ignore-src operand, 7.5, that masked pipelined copies
    /// use; 7.8 is the first that names sm_89; CUDA 11.8 drivers and later load it).
    /// sm_90a gets PTX ISA 8.1 (LLVM's default is 8.0, the first that names it): 8.1 adds
    /// vector reductions (`red.global.add.v4.f32`, relaxed `atomic_add`s of `f32` blocks;
    /// CUDA 12.1 drivers and later load it).
    pub fn features(&self) -> &'static str {
        if self.cc < (9, 0) {
            "+ptx78"
        } else if self.cc == (9, 0) {
            "+ptx81"
        } else {
            ""
        }
    }

    /// The LLVM processor name: `sm_90a` for compute capability 9.0 (Hopper's
    /// architecture-specific features, as Triton does), `sm_XY` otherwise.
    pub fn processor(&self) -> String {
        let (ma, mi) = self.cc;
        if (ma, mi) == (9, 0) {
            "sm_90a".into()
        } else {
            format!("sm_{ma}{mi}")
        }
    }
}

/// The LLVM version linked into this build (part of the cache key).
pub fn llvm_version() -> String {
    let (a, b, c) = inkwell::support::get_llvm_version();
    format!("{a}.{b}.{c}")
}

fn machine(target: &Target) -> Result<TargetMachine, StageError> {
    static INIT: Once = Once::new();
    INIT.call_once(|| LlvmTarget::initialize_nvptx(&InitializationConfig::default()));
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let t = LlvmTarget::from_triple(&triple).map_err(|e| StageError::new("emit", e.to_string()))?;
    t.create_target_machine(&triple, &target.processor(), target.features(), OptimizationLevel::Aggressive, RelocMode::Default, CodeModel::Default)
        .ok_or_else(|| StageError::new("emit", format!("LLVM cannot create an NVPTX target machine for {}", target.processor())))
}

/// Optimize `module` in place and return `(optimized LLVM IR, PTX)`.
pub fn emit_ptx(module: &Module<'_>, target: &Target) -> Result<(String, String), StageError> {
    let fail = |m: String| StageError::new("emit", m);
    let tm = machine(target)?;
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    module.run_passes("default<O3>", &tm, PassBuilderOptions::create()).map_err(|e| fail(e.to_string()))?;
    let llir = module.print_to_string().to_string();
    let buf = tm.write_to_memory_buffer(module, FileType::Assembly).map_err(|e| fail(e.to_string()))?;
    let ptx = String::from_utf8_lossy(buf.as_slice()).trim_end_matches('\0').to_string();
    if let Some(line) = ptx.lines().find(|l| l.contains(".extern .func") && l.contains("llvm.")) {
        return Err(fail(format!("the PTX calls an intrinsic LLVM did not lower: {}", line.trim())));
    }
    Ok((llir, ptx))
}
