//! Lowering: block IR + [`Plan`] → an LLVM module for the NVPTX backend.
//!
//! Every block value becomes, in each thread, one LLVM scalar per register of its layout
//! (`Cx::vals[v][r]` holds the element at coordinates `layout.apply(r, lane, warp)` of the
//! shape padded to powers of two; `Cx::lay[v]` is that layout). An operation takes its
//! operands in the layout it is computed in ([`Cx::get`]), which the program guarantees:
//! data moves between layouts only at `convert_layout` instructions
//! ([`passes::convert`](crate::passes::convert)), lowered by recomputing the value where
//! that is cheap (index arithmetic on `arange`), else through shared memory
//! ([`shape::convert`]). Padding elements exist in registers but are masked out of every
//! memory access and replaced by the identity in reductions.
//!
//! One [`Cx`] carries the LLVM context, module, builder and value map; the op families
//! are free functions in files mirroring the IR's ([`arith`], [`shape`], [`reduce`],
//! [`dot`], [`memory`], [`control`], [`debug`]).
//!
//! Shared memory is one dynamically sized array (`extern .shared`). Each use (layout
//! conversion, cross-warp reduction, scan step) gets scratch from [`Cx::scratch`], which
//! places it and inserts a barrier only where an earlier access conflicts ([`smem`]); the
//! kernel needs [`Lowered::shared_bytes`], which the launcher passes at launch (and opts in
//! above 48 KB).
//!
//! The kernel entry uses the `ptx_kernel` calling convention, takes pointer parameters in
//! the global address space (1) and is annotated with `maxntid = 32 * num_warps`. The
//! module is verified after it is built; a failure carries the IR and LLVM IR dumps.

pub mod arith;
pub mod control;
pub mod debug;
pub mod dot;
pub mod memory;
pub mod reduce;
pub mod shape;
pub mod smem;
pub mod tma;
pub mod wgmma;

use crate::error::StageError;
use crate::ir::{Function, Op, ParamKind, Type, Value};
use crate::layout::{InDim, LinearLayout};
use crate::passes::layout::Plan;
use crate::DType;
use inkwell::basic_block::BasicBlock;
use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::types::{AnyType, BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FunctionValue, GlobalValue, IntValue, PointerValue};
use inkwell::AddressSpace;
use std::collections::HashMap;

/// A lowering failure (an LLVM builder error or an unsupported construct): the stage
/// error of `lower`.
pub fn lower_error(message: impl Into<String>) -> StageError {
    StageError::new("lower", message)
}

impl From<BuilderError> for StageError {
    fn from(e: BuilderError) -> Self {
        lower_error(e.to_string())
    }
}

pub type LResult<T> = Result<T, StageError>;

pub type Regs<'ctx> = Vec<BasicValueEnum<'ctx>>;

/// The codegen context for one kernel.
pub struct Cx<'a, 'ctx> {
    pub ctx: &'ctx Context,
    pub module: Module<'ctx>,
    pub b: Builder<'ctx>,
    pub f: &'a Function,
    pub plan: &'a Plan,
    pub func: FunctionValue<'ctx>,
    /// Per IR value: its per-register LLVM values...
    pub vals: Vec<Regs<'ctx>>,
    /// ...in this layout (`None` for scalars and effects).
    pub lay: Vec<Option<LinearLayout>>,
    /// Conversions already made, per open region (innermost last).
    converted: Vec<HashMap<(Value, LinearLayout), Regs<'ctx>>>,
    pub lane: IntValue<'ctx>,
    pub warp: IntValue<'ctx>,
    smem: GlobalValue<'ctx>,
    /// The shared memory the kernel needs so far, in bytes.
    pub smem_bytes: u64,
    /// Where scratch starts (after the explicit allocations) and the largest scratch use.
    smem_base: u64,
    scratch_peak: u64,
    /// Shared-memory accesses since the last barrier ([`smem`]).
    pub hazards: smem::Hazards,
    /// Threads wrote shared memory that a `wgmma` or a TMA store may read (`st.shared` into
    /// the bytes of [`Cx::async_read`]) since the last `fence.proxy.async` ([`Cx::barrier`]).
    pub unfenced_writes: bool,
    /// The bytes of the buffers the async proxy reads (`wgmma` operands, TMA stores'
    /// sources): only a thread's stores there need a proxy fence before the tensor cores
    /// or TMA see them (a conversion's scratch elsewhere does not).
    pub async_read: Vec<std::ops::Range<u64>>,
    /// `local_load`s left to the `dot` that uses them ([`memory::defer`]).
    pub deferred: std::collections::HashSet<Value>,
    /// The accesses each open loop body makes before its first barrier, innermost last.
    pub heads: Vec<smem::Head>,
    /// How many regions are open around the instruction being lowered.
    pub depth: usize,
    /// The block that returns from the kernel.
    pub exit: BasicBlock<'ctx>,
    /// Values written by `wgmma`s that are issued and not yet waited for
    /// ([`wgmma::wait`]): a `dot`'s accumulator, or the results of a loop that leaves its
    /// last `wgmma` in flight.
    pub wgmma_in_flight: Vec<Value>,
    /// Inside a warp specialization's consumer region: the threads its barriers count
    /// (named barrier 1; the producer is not at them). `None` elsewhere: `bar.sync 0`.
    pub consumers: Option<u32>,
    /// Inside the producer region, which one thread runs: it issues TMA copies itself
    /// and may not meet a barrier.
    pub producer: bool,
    /// A consumer warpgroup's turn ([`tma::turn`]): `Some(false)` begun but not yet
    /// waited for (the wait goes right before the next `wgmma`, after any barrier its
    /// operands need), `Some(true)` taken: no barrier may come until it ends.
    pub turn: Option<bool>,
}

/// A lowered kernel.
pub struct Lowered<'ctx> {
    pub module: Module<'ctx>,
    /// Dynamic shared memory the kernel needs per program.
    pub shared_bytes: u64,
}

/// The LLVM type of a scalar element.
pub fn llvm_type<'ctx>(ctx: &'ctx Context, t: &Type) -> BasicTypeEnum<'ctx> {
    if t.ptr {
        return ctx.ptr_type(AddressSpace::from(1)).into();
    }
    match t.dtype {
        DType::Bool => ctx.bool_type().into(),
        DType::U8 => ctx.i8_type().into(),
        DType::I32 => ctx.i32_type().into(),
        DType::I64 => ctx.i64_type().into(),
        DType::F16 => ctx.f16_type().into(),
        DType::BF16 => ctx.bf16_type().into(),
        DType::F32 => ctx.f32_type().into(),
    }
}

/// Build the LLVM module of `f`. The kernel's symbol is `f.name`.
pub fn lower<'ctx>(ctx: &'ctx Context, f: &Function, plan: &Plan) -> LResult<Lowered<'ctx>> {
    let module = ctx.create_module(&f.name);
    let b = ctx.create_builder();
    let param_types: Vec<BasicMetadataTypeEnum> = f
        .params
        .iter()
        .map(|p| match p.kind {
            ParamKind::Bytes { .. } => ctx.ptr_type(AddressSpace::default()).into(),
            _ => llvm_type(ctx, &p.ty()).into(),
        })
        .collect();
    let fn_type = ctx.void_type().fn_type(&param_types, false);
    let func = module.add_function(&f.name, fn_type, None);
    func.set_call_conventions(71); // ptx_kernel
    for (i, p) in f.params.iter().enumerate() {
        if let Some(v) = func.get_nth_param(i as u32) {
            v.set_name(&p.name);
        }
        // Bytes by value: `byval([size x i8]) align A`, which the NVPTX backend makes a
        // `.param .align A .b8 name[size]` kernel parameter.
        if let ParamKind::Bytes { size, align } = p.kind {
            let byval = ctx.create_type_attribute(Attribute::get_named_enum_kind_id("byval"), ctx.i8_type().array_type(size).as_any_type_enum());
            let align = ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("align"), align as u64);
            func.add_attribute(AttributeLoc::Param(i as u32), byval);
            func.add_attribute(AttributeLoc::Param(i as u32), align);
        }
    }
    let entry = ctx.append_basic_block(func, "entry");
    let exit = ctx.append_basic_block(func, "exit");
    b.position_at_end(exit);
    b.build_return(None)?;
    b.position_at_end(entry);
    let i32t = ctx.i32_type();
    let tid = call_sreg(ctx, &module, &b, "tid.x")?;
    let lane = b.build_and(tid, i32t.const_int(31, false), "lane")?;
    let warp = b.build_right_shift(tid, i32t.const_int(5, false), false, "warp")?;
    let smem = module.add_global(ctx.i8_type().array_type(0), Some(AddressSpace::from(3)), "__rutile_smem");
    smem.set_linkage(Linkage::External);
    // `wgmma` applies its swizzle to absolute addresses: its buffers (placed at multiples
    // of 1024 bytes) must be so in shared memory too.
    smem.set_alignment(if plan.uses_wgmma() { crate::passes::alloc::ATOM_ALIGN as u32 } else { 16 });
    let n = f.values.len();
    let mut cx = Cx {
        ctx,
        module,
        b,
        f,
        plan,
        func,
        vals: vec![Vec::new(); n],
        lay: vec![None; n],
        converted: vec![HashMap::new()],
        lane,
        warp,
        smem,
        smem_bytes: plan.smem.bytes,
        smem_base: plan.smem.bytes,
        scratch_peak: 0,
        hazards: smem::Hazards::default(),
        unfenced_writes: false,
        async_read: plan.async_buffers.iter().map(|&v| plan.smem.range(f, v)).collect(),
        deferred: Default::default(),
        heads: vec![],
        depth: 0,
        exit,
        wgmma_in_flight: vec![],
        consumers: None,
        producer: false,
        turn: None,
    };
    cx.block(&f.body)?;
    cx.b.build_unconditional_branch(exit)?;
    // maxntid: lets ptxas allocate registers for the real CTA size.
    let threads = (32 * (plan.num_warps + plan.producer_warps)) as u64;
    let md = ctx.metadata_node(&[
        func.as_global_value().as_pointer_value().into(),
        ctx.metadata_string("maxntidx").into(),
        i32t.const_int(threads, false).into(),
    ]);
    cx.module.add_global_metadata("nvvm.annotations", &md).map_err(|e| lower_error(e.to_string()))?;
    // Compiled for the programs an SM is to run: those the launch asks for, and for a
    // warp-specialized kernel at least those whose registers `setmaxnreg` moves
    // ([`tma::register_split`]).
    let programs = if plan.producer_warps > 0 { tma::register_split(plan.num_warps as u32, plan.min_programs as u32).2 as usize } else { plan.min_programs };
    if programs > 1 {
        let md = ctx.metadata_node(&[func.as_global_value().as_pointer_value().into(), ctx.metadata_string("minctasm").into(), i32t.const_int(programs as u64, false).into()]);
        cx.module.add_global_metadata("nvvm.annotations", &md).map_err(|e| lower_error(e.to_string()))?;
    }
    // Bytes by value are `grid_constant`: the kernel reads them in the parameter space
    // where the launch put them (a TMA copy takes the tensor map's address there); without
    // it LLVM copies them to local memory, which TMA cannot read (notes §5).
    let by_value: Vec<_> = f.params.iter().enumerate().filter(|(_, p)| matches!(p.kind, ParamKind::Bytes { .. })).map(|(i, _)| i32t.const_int(i as u64 + 1, false).into()).collect();
    if !by_value.is_empty() {
        let md = ctx.metadata_node(&[func.as_global_value().as_pointer_value().into(), ctx.metadata_string("grid_constant").into(), ctx.metadata_node(&by_value).into()]);
        cx.module.add_global_metadata("nvvm.annotations", &md).map_err(|e| lower_error(e.to_string()))?;
    }
    if cx.smem_bytes == 0 {
        // SAFETY: deleting a global leaves dangling any LLVM value that refers to it. Nothing
        // does: only `smem_ptr` refers to `smem`, and its offsets come from `scratch`, which
        // raises `smem_bytes` to at least the (nonzero) bytes of its use, so at 0 it was
        // never called. The handle itself is not used after this (`cx` ends here).
        unsafe { cx.smem.delete() };
    }
    Ok(Lowered { shared_bytes: cx.smem_bytes, module: cx.module })
}

fn call_sreg<'ctx>(ctx: &'ctx Context, m: &Module<'ctx>, b: &Builder<'ctx>, reg: &str) -> LResult<IntValue<'ctx>> {
    let name = format!("llvm.nvvm.read.ptx.sreg.{reg}");
    let f = m.get_function(&name).unwrap_or_else(|| m.add_function(&name, ctx.i32_type().fn_type(&[], false), None));
    Ok(b.build_call(f, &[], reg)?.try_as_basic_value().basic().expect("sreg returns i32").into_int_value())
}

impl<'a, 'ctx> Cx<'a, 'ctx> {
    /// Get or declare a function by its exact (mangled) LLVM name.
    pub fn intrinsic(&self, name: &str, ret: BasicTypeEnum<'ctx>, args: &[BasicTypeEnum<'ctx>]) -> FunctionValue<'ctx> {
        self.module.get_function(name).unwrap_or_else(|| {
            let a: Vec<BasicMetadataTypeEnum> = args.iter().map(|&t| t.into()).collect();
            self.module.add_function(name, ret.fn_type(&a, false), None)
        })
    }

    pub fn call(&self, f: FunctionValue<'ctx>, args: &[BasicValueEnum<'ctx>]) -> LResult<BasicValueEnum<'ctx>> {
        let a: Vec<BasicMetadataValueEnum> = args.iter().map(|&v| v.into()).collect();
        Ok(self.b.build_call(f, &a, "")?.try_as_basic_value().basic().expect("intrinsic returns a value"))
    }

    /// A call to a function returning nothing.
    pub fn call_void(&self, name: &str, args: &[BasicValueEnum<'ctx>]) -> LResult<()> {
        let types: Vec<BasicTypeEnum> = args.iter().map(|a| a.get_type()).collect();
        let meta: Vec<BasicMetadataTypeEnum> = types.iter().map(|&t| t.into()).collect();
        let f = self.module.get_function(name).unwrap_or_else(|| self.module.add_function(name, self.ctx.void_type().fn_type(&meta, false), None));
        let a: Vec<BasicMetadataValueEnum> = args.iter().map(|&v| v.into()).collect();
        self.b.build_call(f, &a, "")?;
        Ok(())
    }

    /// `bar.sync 0`: every thread of the program waits here; every shared-memory access
    /// before it is complete and visible after it.
    ///
    /// In a kernel with a `wgmma`, after stores of threads to shared memory,
    /// `fence.proxy.async.shared::cta` first ([`Cx::proxy_fence`]).
    pub fn barrier(&mut self) -> LResult<()> {
        if self.producer {
            return Err(lower_error("internal: a barrier in a warp specialization's producer"));
        }
        if self.turn == Some(true) {
            return Err(lower_error("internal: a barrier during a consumer warpgroup's turn"));
        }
        wgmma::wait(self)?;
        self.hazards.sync();
        let depth = self.depth;
        for h in &mut self.heads {
            h.barrier_at(depth);
        }
        self.proxy_fence()?;
        match self.consumers {
            Some(n) => {
                let i32t = self.ctx.i32_type();
                self.call_void("llvm.nvvm.barrier.sync.cnt", &[i32t.const_int(1, false).into(), i32t.const_int(n as u64, false).into()])
            }
            None => self.call_void("llvm.nvvm.barrier0", &[]),
        }
    }

    /// `fence.proxy.async.shared::cta` where threads stored to shared memory that a `wgmma`
    /// reads since the last one: the tensor cores read shared memory through the
    /// async proxy, and a thread's `st.shared`s become visible to it only through that
    /// fence (followed by the barrier that publishes them). `cp.async` copies are not
    /// fenced: they are made visible by `cp.async.wait_group` and the barrier, as in
    /// Triton (whose fence insertion fences only copies from registers to shared memory);
    /// the GPU tests run the pipelined wgmma loop this way under compute-sanitizer.
    pub fn proxy_fence(&mut self) -> LResult<()> {
        if self.unfenced_writes {
            self.asm_statement("fence.proxy.async.shared::cta;")?;
        }
        self.unfenced_writes = false;
        Ok(())
    }

    /// One PTX statement with no operands as inline assembly with side effects, ordered
    /// against memory accesses (a `memory` clobber): fences and waits.
    pub fn asm_statement(&self, text: &str) -> LResult<()> {
        let void = self.ctx.void_type().fn_type(&[], false);
        let asm = self.ctx.create_inline_asm(void, text.into(), "~{memory}".into(), true, false, None, false);
        self.b.build_indirect_call(void, asm, &[], "")?;
        Ok(())
    }

    /// Begin a shared-memory use that writes `size` bytes of scratch, then (after
    /// [`Cx::scratch_written`]) reads them: the byte offset of its scratch, placed by
    /// [`smem::Hazards::place`] and preceded by a barrier only where an earlier access
    /// conflicts.
    pub fn scratch(&mut self, size: u64) -> LResult<u64> {
        let size = size.max(1);
        self.scratch_peak = self.scratch_peak.max(size);
        // Alternating ranges may at most double the scratch, and never push the kernel
        // past the 48 KB a launch gets without opting in.
        let limit = (self.smem_base + 2 * self.scratch_peak).min(48 * 1024);
        let (off, wait) = self.hazards.place(self.smem_base, size, 16, limit);
        if wait {
            self.barrier()?;
        }
        self.note(off..off + size, smem::Access::Write);
        self.smem_bytes = self.smem_bytes.max(off + size);
        Ok(off)
    }

    /// An access to bytes `r` of shared memory, after a barrier where an earlier access
    /// conflicts ([`smem::Hazards`]).
    pub fn smem_access(&mut self, r: std::ops::Range<u64>, a: smem::Access) -> LResult<()> {
        if self.hazards.conflicts(&r, a) {
            self.barrier()?;
        }
        self.note(r, a);
        Ok(())
    }

    /// Record an access: pending until the next barrier, and in the heads of open loops.
    fn note(&mut self, r: std::ops::Range<u64>, a: smem::Access) {
        self.unfenced_writes |= a == smem::Access::Write && self.async_read.iter().any(|w| w.start < r.end && r.start < w.end);
        for h in &mut self.heads {
            h.record(&r, a);
        }
        self.hazards.record(r, a);
    }

    /// The barrier between a use's writes of its scratch and its reads of it.
    pub fn scratch_written(&mut self, off: u64, size: u64) -> LResult<()> {
        self.barrier()?;
        self.note(off..off + size, smem::Access::Read);
        Ok(())
    }

    /// A pointer `bytes` past offset `base` of shared memory (`base` from [`Cx::scratch`]).
    pub fn smem_ptr(&self, base: u64, bytes: IntValue<'ctx>) -> LResult<PointerValue<'ctx>> {
        let bytes = self.b.build_int_add(bytes, self.ctx.i32_type().const_int(base, false), "")?;
        let smem = self.smem.as_pointer_value();
        // SAFETY: this builds an instruction; no memory is touched while compiling. inkwell
        // marks GEPs unsafe for the code they generate: without `inbounds` an address past
        // the object is a well-defined value (not poison), and the callers' offsets stay
        // inside the range `scratch` gave them, below `smem_bytes`, which the launch
        // provides as dynamic shared memory.
        Ok(unsafe { self.b.build_gep(self.ctx.i8_type(), smem, &[bytes], "")? })
    }

    /// The coordinate along `dim` contributed by this thread's lane and warp bits.
    pub fn thread_coord(&self, l: &LinearLayout, dim: usize) -> LResult<IntValue<'ctx>> {
        let i32t = self.ctx.i32_type();
        let mut acc = i32t.const_zero();
        for (src, d) in [(self.lane, InDim::Lane), (self.warp, InDim::Warp)] {
            let bases = l.bases(d);
            let mut i = 0;
            while i < bases.len() {
                let basis = bases[i][dim];
                if basis == 0 {
                    i += 1;
                    continue;
                }
                // A run of bits whose bases double: one shift-and-mask for all of them.
                let mut k = 1;
                while i + k < bases.len() && bases[i + k][dim] == basis << k {
                    k += 1;
                }
                let bits = self.b.build_right_shift(src, i32t.const_int(i as u64, false), false, "")?;
                let bits = self.b.build_and(bits, i32t.const_int((1 << k) - 1, false), "")?;
                let term = if basis.is_power_of_two() {
                    self.b.build_left_shift(bits, i32t.const_int(basis.trailing_zeros() as u64, false), "")?
                } else {
                    self.b.build_int_mul(bits, i32t.const_int(basis as u64, false), "")?
                };
                acc = self.b.build_xor(acc, term, "")?;
                i += k;
            }
        }
        Ok(acc)
    }

    /// The coordinates (in the padded shape) of register `r` of layout `l` in this thread.
    pub fn coords(&self, l: &LinearLayout, r: u32) -> LResult<Vec<IntValue<'ctx>>> {
        let i32t = self.ctx.i32_type();
        let c = l.apply(r, 0, 0);
        let disjoint = l.thread_and_register_bits_disjoint();
        (0..l.rank())
            .map(|d| {
                let t = self.thread_coord(l, d)?;
                let k = i32t.const_int(c[d] as u64, false);
                Ok(if disjoint { self.b.build_int_add(t, k, "")? } else { self.b.build_xor(t, k, "")? })
            })
            .collect()
    }

    /// True where register `r` of `l` holds an element of the logical `shape` rather than
    /// padding; `None` when nothing is padded.
    pub fn valid(&self, l: &LinearLayout, shape: &[usize], r: u32) -> LResult<Option<IntValue<'ctx>>> {
        let padded: Vec<usize> = shape.iter().map(|d| d.next_power_of_two()).collect();
        if padded == shape {
            return Ok(None);
        }
        let i32t = self.ctx.i32_type();
        let c = self.coords(l, r)?;
        let mut pred: Option<IntValue<'ctx>> = None;
        for d in 0..shape.len() {
            if shape[d] != padded[d] {
                let ok = self.b.build_int_compare(inkwell::IntPredicate::ULT, c[d], i32t.const_int(shape[d] as u64, false), "valid")?;
                pred = Some(match pred {
                    None => ok,
                    Some(p) => self.b.build_and(p, ok, "")?,
                });
            }
        }
        Ok(pred)
    }

    /// Predicate that is true in exactly one of the threads holding each element (threads
    /// that differ only in replicated lane/warp bits hold copies).
    pub fn owner_predicate(&self, l: &LinearLayout) -> LResult<Option<IntValue<'ctx>>> {
        let i32t = self.ctx.i32_type();
        let mut pred: Option<IntValue<'ctx>> = None;
        for (src, d) in [(self.lane, InDim::Lane), (self.warp, InDim::Warp)] {
            let mask = l.replicated_bits(d);
            if mask == 0 {
                continue;
            }
            let bits = self.b.build_and(src, i32t.const_int(mask as u64, false), "")?;
            let zero = self.b.build_int_compare(inkwell::IntPredicate::EQ, bits, i32t.const_zero(), "owner")?;
            pred = Some(match pred {
                None => zero,
                Some(p) => self.b.build_and(p, zero, "")?,
            });
        }
        Ok(pred)
    }

    pub fn and_pred(&self, a: Option<IntValue<'ctx>>, b: Option<IntValue<'ctx>>) -> LResult<Option<IntValue<'ctx>>> {
        Ok(match (a, b) {
            (Some(x), Some(y)) => Some(self.b.build_and(x, y, "")?),
            (x, None) => x,
            (None, y) => y,
        })
    }

    /// Record `regs` as the value of `v`, in layout `l` (`None` for scalars).
    pub fn define(&mut self, v: Value, regs: Regs<'ctx>, l: Option<LinearLayout>) {
        self.vals[v.index()] = regs;
        self.lay[v.index()] = l;
    }

    /// The registers of `v`, which must be in layout `l`: where an operation needs another
    /// layout than its operand's, the program has a `convert_layout` for it
    /// ([`passes::convert`](crate::passes::convert)). Scalars are the same in every layout.
    pub fn get(&mut self, v: Value, l: &LinearLayout) -> LResult<Regs<'ctx>> {
        match &self.lay[v.index()] {
            Some(from) if from != l => Err(lower_error(format!(
                "internal: %{} is in layout {from} where layout {l} is needed, and no convert_layout was inserted",
                v.0
            ))),
            _ => Ok(self.vals[v.index()].clone()),
        }
    }

    /// `convert_layout`: `v`'s registers in layout `l`, recomputed where that is cheap, else
    /// through shared memory; once per region (nested regions see it).
    fn convert(&mut self, v: Value, l: &LinearLayout) -> LResult<Regs<'ctx>> {
        let Some(from) = self.lay[v.index()].clone() else { return Ok(self.vals[v.index()].clone()) };
        if from == *l {
            return Ok(self.vals[v.index()].clone());
        }
        let key = (v, l.clone());
        if let Some(r) = self.converted.iter().rev().find_map(|m| m.get(&key)) {
            return Ok(r.clone());
        }
        let regs = if let Some(map) = from.register_permutation(l) {
            // The same threads hold the same elements: only registers are renamed.
            map.into_iter().map(|r| self.vals[v.index()][r]).collect()
        } else {
            match self.remat(v, l, 6)? {
                Some(r) => r,
                None => shape::convert(self, v, &from, l)?,
            }
        };
        self.converted.last_mut().expect("a scope is open").insert(key, regs.clone());
        Ok(regs)
    }

    /// Recompute `v` in layout `l` when it is cheap: `arange`, splats, arithmetic on such
    /// values and dimensions of 1 inserted into them (index expressions like
    /// `(pid * BLOCK + arange).col()`), up to `depth` levels.
    /// Cheaper than a round trip through shared memory and its barriers.
    fn remat(&mut self, v: Value, l: &LinearLayout, depth: u32) -> LResult<Option<Regs<'ctx>>> {
        let f = self.f;
        let inst = f.inst(v);
        if inst.ty.is_scalar() {
            return Ok(Some(self.vals[v.index()].clone()));
        }
        if depth == 0 || inst.ty.ptr {
            return Ok(None);
        }
        let n = l.num_regs();
        match &inst.op {
            Op::Arange { start, .. } => Ok(Some(self.arange(l, *start)?)),
            Op::Splat(x) => Ok(Some(vec![self.vals[x.index()][0]; n])),
            Op::ConvertLayout(x) => self.remat(*x, l, depth),
            // `x` with a dimension of 1 inserted (`rm.col()`): `x` in the layout without
            // it, where that layout holds each element in the same registers (as the
            // lowering of `expand_dims` takes it).
            Op::ExpandDims(x, axis) => match l.expand_source(*axis as usize) {
                Some(want) if want.insert_dim(*axis as usize) == *l => self.remat(*x, &want, depth),
                _ => Ok(None),
            },
            Op::Binary(..) | Op::Cmp(..) | Op::Cast(_) | Op::Unary(..) => {
                let mut ops = vec![];
                for o in inst.op.operands() {
                    match self.remat(o, l, depth - 1)? {
                        Some(r) => ops.push(r),
                        None => return Ok(None),
                    }
                }
                Ok(Some(self.elementwise(v, &ops)?))
            }
            _ => Ok(None),
        }
    }

    /// `arange(start, ..)` in layout `l`: each register's coordinate plus `start`.
    fn arange(&self, l: &LinearLayout, start: i64) -> LResult<Regs<'ctx>> {
        let i32t = self.ctx.i32_type();
        (0..l.num_regs() as u32)
            .map(|r| {
                let c = self.coords(l, r)?[0];
                Ok(self.b.build_int_add(c, i32t.const_int(start as u64, true), "")?.into())
            })
            .collect()
    }

    /// A binary, comparison, unary or cast instruction `v` on operand registers `ops`
    /// (all in one layout).
    fn elementwise(&self, v: Value, ops: &[Regs<'ctx>]) -> LResult<Regs<'ctx>> {
        let inst = self.f.inst(v);
        let d = self.f.ty(inst.op.operands()[0]).dtype;
        match &inst.op {
            Op::Binary(op, ..) => arith::binary(self, *op, d, &ops[0], &ops[1]),
            Op::Cmp(op, ..) => arith::cmp(self, *op, d, &ops[0], &ops[1]),
            Op::Cast(_) => arith::cast(self, d, inst.ty.dtype, &ops[0]),
            Op::Unary(op, _) => arith::unary(self, *op, d, &ops[0]),
            Op::Fma(..) => arith::fma(self, d, &ops[0], &ops[1], &ops[2]),
            other => Err(lower_error(format!("not an elementwise operation: {other:?}"))),
        }
    }

    /// The registers of `v` in the layout it was produced in.
    pub fn get_any(&self, v: Value) -> (Regs<'ctx>, Option<LinearLayout>) {
        (self.vals[v.index()].clone(), self.lay[v.index()].clone())
    }

    /// Lower a block; conversions made inside it stay inside it.
    pub fn block(&mut self, b: &crate::ir::Block) -> LResult<()> {
        self.converted.push(HashMap::new());
        self.depth += 1;
        let outer = self.wgmma_in_flight.len();
        for &v in &b.insts {
            // Wait for the youngest `wgmma` in flight `v` may not pass, and those before it.
            if let Some(i) = self.wgmma_in_flight.iter().rposition(|&d| !wgmma::may_pass(self, v, d)) {
                wgmma::wait_through(self, i)?;
            }
            self.lower_inst(v)?;
            // The layout a value comes out in is part of its type, fixed by the plan.
            if let (Some(got), Some(want)) = (&self.lay[v.index()], self.plan.produced.get(&v)) {
                if got != want {
                    return Err(lower_error(format!("internal: %{} was produced in layout {got}, but its type says {want}", v.0)));
                }
            }
        }
        wgmma::end_of_block(self, outer)?;
        self.depth -= 1;
        self.converted.pop();
        Ok(())
    }

    fn lower_inst(&mut self, v: Value) -> LResult<()> {
        let f = self.f;
        let inst = f.inst(v);
        // Scratch goes above the buffers live here ([`Allocation::top_at`]).
        self.smem_base = self.plan.smem.top_at(v);
        let ty = &inst.ty;
        // Effects (store, atomics, assert) have a layout for their access too.
        let l = match self.plan.layouts.get(&v) {
            Some(l) => l.clone(),
            None => self.plan.default_for(&ty.padded_shape()),
        };
        let block_layout = if ty.is_scalar() || ty.unit { None } else { Some(l.clone()) };
        let n = l.num_regs();
        let regs: Regs<'ctx> = match &inst.op {
            Op::Param(i) => vec![self.func.get_nth_param(*i).ok_or_else(|| lower_error(format!("no parameter {i}")))?],
            Op::Const(c) => vec![arith::constant(self, *c, ty.dtype)],
            Op::ProgramId(a) | Op::NumPrograms(a) => {
                let axis = ["x", "y", "z"][*a as usize];
                let reg = if matches!(inst.op, Op::ProgramId(_)) { format!("ctaid.{axis}") } else { format!("nctaid.{axis}") };
                vec![call_sreg(self.ctx, &self.module, &self.b, &reg)?.into()]
            }
            Op::Arange { start, .. } => self.arange(&l, *start)?,
            Op::Splat(x) => vec![self.vals[x.index()][0]; n],
            Op::Binary(..) | Op::Cmp(..) | Op::Unary(..) | Op::Cast(_) | Op::Fma(..) => {
                let mut ops = vec![];
                for o in inst.op.operands() {
                    ops.push(self.get(o, &l)?);
                }
                self.elementwise(v, &ops)?
            }
            Op::Select(c, a, b) => {
                let (xc, xa, xb) = (self.get(*c, &l)?, self.get(*a, &l)?, self.get(*b, &l)?);
                let mut regs = Vec::with_capacity(n);
                for r in 0..xa.len() {
                    regs.push(self.b.build_select(xc[r].into_int_value(), xa[r], xb[r], "")?);
                }
                regs
            }
            Op::ExpandDims(x, axis) => {
                // The operand in this layout without the new dimension (free when it can
                // be recomputed there, as index expressions can).
                let a = *axis as usize;
                if let Some(want) = l.expand_source(a) {
                    let regs = self.get(*x, &want)?;
                    self.define(v, regs, Some(want.insert_dim(a)));
                } else {
                    let (regs, lx) = self.get_any(*x);
                    let lx = lx.ok_or_else(|| lower_error("expand_dims of a scalar"))?;
                    self.define(v, regs, Some(lx.insert_dim(a)));
                }
                return Ok(());
            }
            Op::Broadcast(x) => shape::broadcast(self, v, *x, &l)?,
            Op::Permute(x, perm) => {
                let (regs, lx) = self.get_any(*x);
                let lx = lx.ok_or_else(|| lower_error("permute of a scalar"))?;
                let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
                self.define(v, regs, Some(lx.permute(&perm)));
                return Ok(());
            }
            Op::Reshape(x) => shape::reshape(self, *x, &l)?,
            Op::ConvertLayout(x) => self.convert(*x, &l)?,
            Op::Dot { .. } => dot::dot(self, v)?,
            Op::Reduce { op, x, axis } => {
                let (regs, lay) = reduce::reduce(self, *op, *x, *axis as usize)?;
                self.define(v, regs, lay);
                return Ok(());
            }
            Op::Scan { x, axis, .. } => {
                let (regs, lay) = reduce::scan(self, *x, *axis as usize)?;
                self.define(v, regs, Some(lay));
                return Ok(());
            }
            Op::AddPtr(p, o) => {
                let (xp, xo) = (self.get(*p, &l)?, self.get(*o, &l)?);
                memory::add_ptr(self, ty.dtype, f.ty(*o).dtype, &xp, &xo)?
            }
            Op::PtrOffset(p) => {
                let xp = self.get(*p, &l)?;
                let root = f.pointer_root(*p).ok_or_else(|| lower_error("pointer without a root"))?;
                let base = self.func.get_nth_param(root).ok_or_else(|| lower_error("no root parameter"))?;
                memory::ptr_offset(self, f.ty(*p).dtype, base.into_pointer_value(), &xp)?
            }
            Op::LocalAlloc(init) => {
                if let Some(x) = init {
                    memory::local_store(self, v, *x)?;
                } else if self.plan.smem.is_ring(v) {
                    // The pipeliner's prologue copies into the ring right after this, with
                    // no hazard record of their own: the ring's bytes are written from here.
                    // Written by `cp.async`, which needs no proxy fence.
                    let (r, unfenced) = (self.plan.smem.range(f, v), self.unfenced_writes);
                    self.smem_access(r, smem::Access::Write)?;
                    self.unfenced_writes = unfenced;
                }
                self.define(v, vec![], None);
                return Ok(());
            }
            Op::LocalStore { buf, value } => {
                memory::local_store(self, *buf, *value)?;
                vec![]
            }
            Op::LocalLoad(buf) => {
                let block = f.enclosing_block(v);
                if memory::defer(self, v, *buf, &block)? {
                    let undef = llvm_type(self.ctx, ty).const_zero();
                    vec![undef; n]
                } else {
                    memory::local_load(self, *buf, &l)?
                }
            }
            Op::LocalSlot { .. } | Op::LocalTrans(_) => {
                self.define(v, vec![], None);
                return Ok(());
            }
            Op::AsyncCopy { .. } => {
                memory::async_copy(self, v, &l)?;
                vec![]
            }
            Op::AsyncCommit => {
                self.call_void("llvm.nvvm.cp.async.commit.group", &[])?;
                vec![]
            }
            Op::AsyncWait(n) => {
                self.call_void("llvm.nvvm.cp.async.wait.group", &[self.ctx.i32_type().const_int(*n as u64, false).into()])?;
                self.barrier()?;
                vec![]
            }
            Op::TmaCopy { .. } => {
                tma::tma_copy(self, v)?;
                vec![]
            }
            Op::TmaStore { .. } => {
                tma::tma_store(self, v)?;
                vec![]
            }
            Op::MbarInit { .. } => {
                tma::mbar_init(self, v)?;
                vec![]
            }
            Op::MbarWait { .. } => {
                tma::mbar_wait(self, v)?;
                vec![]
            }
            Op::MbarArrive { .. } => {
                tma::mbar_arrive(self, v)?;
                vec![]
            }
            Op::WarpSpecialize { .. } => return tma::warp_specialize(self, v),
            Op::Turn { begin } => {
                tma::turn(self, *begin)?;
                vec![]
            }
            Op::Load { .. } => memory::load(self, v, &l)?,
            Op::Store { .. } => {
                memory::store(self, v, &l)?;
                vec![]
            }
            Op::Atomic { .. } => memory::atomic(self, v, &l)?,
            Op::For { .. } => return control::for_loop(self, v),
            Op::If { .. } => return control::branch(self, v),
            Op::Result(..) => return Ok(()), // defined by the owner
            Op::Arg(..) => return Err(lower_error("a region argument placed as an instruction")),
            Op::Return => return control::ret(self),
            Op::Assert { .. } => {
                debug::assert(self, v, &l)?;
                vec![]
            }
            Op::Print { .. } => {
                debug::print(self, v)?;
                vec![]
            }
            Op::BoundsCheck { .. } => {
                debug::bounds_check(self, v, &l)?;
                vec![]
            }
        };
        self.define(v, regs, block_layout);
        Ok(())
    }
}
