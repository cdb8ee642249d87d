//! Lowering: block IR + [`Plan`] → an LLVM module for the NVPTX backend.
//!
//! Every block value becomes, in each thread, one LLVM scalar per register of its layout
//! (`Cx::vals[v][r]` holds the element at coordinates `layout.apply(r, lane, warp)`).
//! Elementwise operations are applied register by register; loads and stores group the
//! registers that hold contiguous elements into vector instructions (see [`memory`]).
//! One [`Cx`] carries the LLVM context, module, builder and value map; the op families
//! are free functions in files mirroring the IR's ([`arith`], [`memory`]).
//!
//! The kernel entry uses the `ptx_kernel` calling convention, takes pointer parameters in
//! the global address space (1) and is annotated with `maxntid = 32 * num_warps`. The
//! module is verified after it is built; a failure carries the IR and LLVM IR dumps.

pub mod arith;
pub mod memory;

use crate::ir::{Function, Op, Type, Value};
use crate::layout::{InDim, LinearLayout};
use crate::passes::layout::Plan;
use crate::DType;
use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FunctionValue, IntValue};
use inkwell::AddressSpace;

/// A lowering failure (an LLVM builder error or an unsupported construct).
#[derive(Debug)]
pub struct LowerError(pub String);

impl From<BuilderError> for LowerError {
    fn from(e: BuilderError) -> Self {
        LowerError(e.to_string())
    }
}

pub type LResult<T> = Result<T, LowerError>;

/// The codegen context for one kernel.
pub struct Cx<'a, 'ctx> {
    pub ctx: &'ctx Context,
    pub module: Module<'ctx>,
    pub b: Builder<'ctx>,
    pub f: &'a Function,
    pub plan: &'a Plan,
    pub func: FunctionValue<'ctx>,
    /// Per IR value: its per-register LLVM values.
    pub vals: Vec<Vec<BasicValueEnum<'ctx>>>,
    pub lane: IntValue<'ctx>,
    pub warp: IntValue<'ctx>,
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
pub fn lower<'ctx>(ctx: &'ctx Context, f: &Function, plan: &Plan) -> LResult<Module<'ctx>> {
    let module = ctx.create_module(&f.name);
    let b = ctx.create_builder();
    let param_types: Vec<BasicMetadataTypeEnum> = f.params.iter().map(|p| llvm_type(ctx, &p.ty()).into()).collect();
    let fn_type = ctx.void_type().fn_type(&param_types, false);
    let func = module.add_function(&f.name, fn_type, None);
    func.set_call_conventions(71); // ptx_kernel
    for (i, p) in f.params.iter().enumerate() {
        if let Some(v) = func.get_nth_param(i as u32) {
            v.set_name(&p.name);
        }
    }
    let entry = ctx.append_basic_block(func, "entry");
    b.position_at_end(entry);
    let i32t = ctx.i32_type();
    let tid = call_sreg(ctx, &module, &b, "tid.x")?;
    let lane = b.build_and(tid, i32t.const_int(31, false), "lane")?;
    let warp = b.build_right_shift(tid, i32t.const_int(5, false), false, "warp")?;
    let mut cx = Cx { ctx, module, b, f, plan, func, vals: vec![Vec::new(); f.values.len()], lane, warp };
    for &v in &f.body.insts {
        let regs = cx.lower_inst(v)?;
        cx.vals[v.index()] = regs;
    }
    cx.b.build_return(None)?;
    // maxntid: lets ptxas allocate registers for the real CTA size.
    let threads = (32 * plan.num_warps) as u64;
    let md = ctx.metadata_node(&[
        func.as_global_value().as_pointer_value().into(),
        ctx.metadata_string("maxntidx").into(),
        i32t.const_int(threads, false).into(),
    ]);
    cx.module.add_global_metadata("nvvm.annotations", &md).map_err(|e| LowerError(e.to_string()))?;
    Ok(cx.module)
}

fn call_sreg<'ctx>(ctx: &'ctx Context, m: &Module<'ctx>, b: &Builder<'ctx>, reg: &str) -> LResult<IntValue<'ctx>> {
    let name = format!("llvm.nvvm.read.ptx.sreg.{reg}");
    let f = m.get_function(&name).unwrap_or_else(|| m.add_function(&name, ctx.i32_type().fn_type(&[], false), None));
    Ok(b.build_call(f, &[], reg)?.try_as_basic_value().basic().expect("sreg returns i32").into_int_value())
}

impl<'a, 'ctx> Cx<'a, 'ctx> {
    pub fn layout_of(&self, v: Value) -> LinearLayout {
        self.plan.layout(&self.f.ty(v).shape)
    }

    pub fn num_regs(&self, v: Value) -> usize {
        self.layout_of(v).num_regs()
    }

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

    fn lower_inst(&mut self, v: Value) -> LResult<Vec<BasicValueEnum<'ctx>>> {
        let inst = self.f.inst(v);
        let ty = &inst.ty;
        let n = self.num_regs(v);
        Ok(match inst.op {
            Op::Param(i) => {
                let p = self.func.get_nth_param(i).ok_or_else(|| LowerError(format!("no parameter {i}")))?;
                vec![p]
            }
            Op::Const(c) => vec![arith::constant(self, c, ty.dtype)],
            Op::ProgramId(a) | Op::NumPrograms(a) => {
                let axis = ["x", "y", "z"][a as usize];
                let reg = if matches!(inst.op, Op::ProgramId(_)) { format!("ctaid.{axis}") } else { format!("nctaid.{axis}") };
                vec![call_sreg(self.ctx, &self.module, &self.b, &reg)?.into()]
            }
            Op::Arange { start, .. } => {
                let l = self.layout_of(v);
                let t = self.thread_coord(&l, 0)?;
                let i32t = self.ctx.i32_type();
                let t = self.b.build_int_add(t, i32t.const_int(start as u64, true), "")?;
                let disjoint = l.thread_and_register_bits_disjoint();
                let mut regs = Vec::with_capacity(n);
                for r in 0..n as u32 {
                    let c = i32t.const_int(l.apply(r, 0, 0)[0] as u64, false);
                    let x = if disjoint { self.b.build_int_add(t, c, "")? } else { self.b.build_xor(t, c, "")? };
                    regs.push(x.into());
                }
                regs
            }
            Op::Splat(x) => vec![self.vals[x.index()][0]; n],
            Op::Binary(op, a, b) => arith::binary(self, op, a, b)?,
            Op::Cmp(op, a, b) => arith::cmp(self, op, a, b)?,
            Op::Unary(op, a) => arith::unary(self, op, a)?,
            Op::Select(c, a, b) => {
                let mut regs = Vec::with_capacity(n);
                for r in 0..n {
                    let cond = self.vals[c.index()][r].into_int_value();
                    regs.push(self.b.build_select(cond, self.vals[a.index()][r], self.vals[b.index()][r], "")?);
                }
                regs
            }
            Op::Cast(a) => arith::cast(self, a, ty.dtype)?,
            Op::AddPtr(p, o) => memory::add_ptr(self, v, p, o)?,
            Op::Load { .. } => memory::load(self, v)?,
            Op::Store { .. } => {
                memory::store(self, v)?;
                vec![]
            }
        })
    }
}
