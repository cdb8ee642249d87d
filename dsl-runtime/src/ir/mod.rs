//! The block IR: the specification.
//!
//! A kernel is a [`Function`]: parameters, an arena of instructions ([`Inst`]) and a
//! [`Block`] listing them in program order. Every instruction defines one SSA value
//! ([`Value`]) of a [`Type`]: an element type ([`DType`]), whether it is a pointer to that
//! element type, and a block shape (`[]` is a scalar, `[1024]` a 1-D block). Instructions
//! that only have effects (`store`) define a value of the unit type, which nothing uses.
//!
//! The semantics are those of one *program* (Triton's word; one CUDA thread block)
//! operating on whole blocks: `a + b` on two `[1024]` blocks adds 1024 pairs of elements.
//! How elements are spread over threads is not part of the IR; layouts are chosen by
//! [`passes::layout`](crate::passes::layout) and only exist during lowering.
//!
//! Op families, one file each:
//! - [`arith`]: constants, `program_id`, `arange`, splat, binary and unary arithmetic,
//!   comparisons, `select`, casts, math functions.
//! - [`memory`]: pointer arithmetic, masked `load` and `store`.
//!
//! Rules that the [verifier](verify) enforces:
//! - operands are defined before use (the block is in program order);
//! - binary operands, `select` operands and `load`/`store` operands have equal shapes
//!   (the [`Builder`] inserts splats, so the IR never broadcasts implicitly);
//! - arithmetic operands have equal element types (the builder inserts casts);
//! - masks are `bool`; loads and stores go through pointers, and a store's value has the
//!   pointee type;
//! - block dimensions are powers of two (non-power-of-two blocks will be padded and
//!   masked by the builder in a later version).
//!
//! Every instruction carries the source location ([`Loc`]) of the kernel code it came
//! from, so that errors from any later stage name a line of the user's kernel.
//!
//! ```
//! use dsl_runtime::ir::{Builder, Operand, BinOp, Loc, ParamKind};
//! use dsl_runtime::DType;
//! let mut b = Builder::new("double", &[("x", ParamKind::Ptr { elem: DType::F32, writable: true })]);
//! let loc = Loc::new(1, 1);
//! let offs = b.arange(0, 128, loc).unwrap();
//! let x = b.param(0);
//! let ptrs = b.add_ptr(x, offs, loc).unwrap();
//! let v = b.load(ptrs, None, None, loc).unwrap();
//! let v2 = b.binary(BinOp::Mul, v, Operand::Float(2.0), loc).unwrap();
//! b.store(ptrs, v2, None, loc).unwrap();
//! let f = b.finish().unwrap();
//! assert!(f.to_string().contains("load"));
//! ```

pub mod arith;
pub mod builder;
pub mod memory;
pub mod printer;
pub mod verify;

pub use arith::{BinOp, CmpOp, ConstVal, UnaryOp};
pub use builder::{Builder, Operand};

use crate::DType;

/// An SSA value: the index of the instruction that defines it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct Value(pub u32);

impl Value {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A position in the kernel's Rust source (1-based line, 1-based column).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Loc {
    pub line: u32,
    pub col: u32,
}

impl Loc {
    pub const fn new(line: u32, col: u32) -> Loc {
        Loc { line, col }
    }
}

/// The type of an SSA value.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Type {
    /// The element type, or the pointee type when `ptr` is set.
    pub dtype: DType,
    pub ptr: bool,
    /// Block shape; empty for scalars.
    pub shape: Vec<usize>,
    /// Set only for the unit type of effect-only instructions.
    pub unit: bool,
}

impl Type {
    pub fn scalar(dtype: DType) -> Type {
        Type { dtype, ptr: false, shape: vec![], unit: false }
    }
    pub fn block(dtype: DType, shape: Vec<usize>) -> Type {
        Type { dtype, ptr: false, shape, unit: false }
    }
    pub fn pointer(pointee: DType, shape: Vec<usize>) -> Type {
        Type { dtype: pointee, ptr: true, shape, unit: false }
    }
    pub fn unit() -> Type {
        Type { dtype: DType::Bool, ptr: false, shape: vec![], unit: true }
    }
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Same element type and pointer-ness, other shape.
    pub fn with_shape(&self, shape: Vec<usize>) -> Type {
        Type { shape, ..self.clone() }
    }
}

/// What a kernel parameter is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ParamKind {
    /// A pointer to device memory holding `elem`s. `writable` when the kernel stores
    /// through it (the typed launcher then asks for a mutable buffer).
    Ptr { elem: DType, writable: bool },
    /// A scalar passed by value (`i32`, `i64`, `f32`).
    Scalar(DType),
    /// The element count of pointer parameter `of`, added by the bounds guard
    /// ([`passes::guard`](crate::passes::guard)); never written by users.
    Len { of: u32 },
}

/// What the launcher knows about an argument's value, Triton-style. It selects the
/// specialization and lets the axis analysis prove alignment and contiguity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct ParamSpec {
    /// Integer arguments: the value is 1 (the parameter is then replaced by a constant).
    pub eq_one: bool,
    /// Integer arguments: divisible by 16. Pointers: 16-byte aligned.
    pub div16: bool,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Param {
    pub name: String,
    pub kind: ParamKind,
    pub spec: ParamSpec,
}

impl Param {
    /// The IR type of the value this parameter defines.
    pub fn ty(&self) -> Type {
        match self.kind {
            ParamKind::Ptr { elem, .. } => Type::pointer(elem, vec![]),
            ParamKind::Scalar(d) => Type::scalar(d),
            ParamKind::Len { .. } => Type::scalar(DType::I64),
        }
    }
}

/// One instruction.
#[derive(Clone, PartialEq, Debug)]
pub enum Op {
    /// The value of parameter `i` (uniform over the program).
    Param(u32),
    Const(ConstVal),
    /// `program_id(axis)`, `axis` in 0..3.
    ProgramId(u8),
    /// `num_programs(axis)`.
    NumPrograms(u8),
    /// `start, start+1, ..., end-1` as a 1-D `i32` block.
    Arange { start: i64, end: i64 },
    /// A scalar repeated over the result's shape.
    Splat(Value),
    Binary(BinOp, Value, Value),
    Cmp(CmpOp, Value, Value),
    Unary(UnaryOp, Value),
    /// `select(cond, a, b)`: `a` where `cond` is true, else `b`.
    Select(Value, Value, Value),
    /// Conversion to the instruction's result type.
    Cast(Value),
    /// `ptr + offsets`, in elements of the pointee type.
    AddPtr(Value, Value),
    /// Masked-off lanes give `other` (or an unspecified value when `other` is absent).
    Load { ptr: Value, mask: Option<Value>, other: Option<Value> },
    /// Masked-off lanes store nothing.
    Store { ptr: Value, value: Value, mask: Option<Value> },
}

impl Op {
    /// The SSA operands, in order.
    pub fn operands(&self) -> Vec<Value> {
        match *self {
            Op::Param(_) | Op::Const(_) | Op::ProgramId(_) | Op::NumPrograms(_) | Op::Arange { .. } => vec![],
            Op::Splat(v) | Op::Unary(_, v) | Op::Cast(v) => vec![v],
            Op::Binary(_, a, b) | Op::Cmp(_, a, b) | Op::AddPtr(a, b) => vec![a, b],
            Op::Select(c, a, b) => vec![c, a, b],
            Op::Load { ptr, mask, other } => [Some(ptr), mask, other].into_iter().flatten().collect(),
            Op::Store { ptr, value, mask } => [Some(ptr), Some(value), mask].into_iter().flatten().collect(),
        }
    }

    /// Rewrite every operand through `f`.
    pub fn map_operands(&mut self, mut f: impl FnMut(Value) -> Value) {
        match self {
            Op::Param(_) | Op::Const(_) | Op::ProgramId(_) | Op::NumPrograms(_) | Op::Arange { .. } => {}
            Op::Splat(v) | Op::Unary(_, v) | Op::Cast(v) => *v = f(*v),
            Op::Binary(_, a, b) | Op::Cmp(_, a, b) | Op::AddPtr(a, b) => {
                *a = f(*a);
                *b = f(*b);
            }
            Op::Select(c, a, b) => {
                *c = f(*c);
                *a = f(*a);
                *b = f(*b);
            }
            Op::Load { ptr, mask, other } => {
                *ptr = f(*ptr);
                if let Some(m) = mask {
                    *m = f(*m);
                }
                if let Some(o) = other {
                    *o = f(*o);
                }
            }
            Op::Store { ptr, value, mask } => {
                *ptr = f(*ptr);
                *value = f(*value);
                if let Some(m) = mask {
                    *m = f(*m);
                }
            }
        }
    }

    /// Instructions with effects are never removed or merged.
    pub fn has_effects(&self) -> bool {
        matches!(self, Op::Store { .. })
    }
}

/// An instruction: what it computes, its result type, and where it came from.
#[derive(Clone, PartialEq, Debug)]
pub struct Inst {
    pub op: Op,
    pub ty: Type,
    pub loc: Loc,
}

/// A straight-line sequence of instructions in program order. Loops and branches
/// (a later issue) will own nested blocks.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct Block {
    pub insts: Vec<Value>,
}

/// A kernel in block IR.
#[derive(Clone, PartialEq, Debug)]
pub struct Function {
    pub name: String,
    pub params: Vec<Param>,
    /// Compile-time constants the kernel was specialized with (for printing and keys).
    pub constants: Vec<(String, String)>,
    /// The arena: `values[v.index()]` defines `v`.
    pub values: Vec<Inst>,
    pub body: Block,
}

impl Function {
    pub fn inst(&self, v: Value) -> &Inst {
        &self.values[v.index()]
    }
    pub fn ty(&self, v: Value) -> &Type {
        &self.values[v.index()].ty
    }
    /// Append an instruction to the arena (not to the body) and return its value.
    pub fn push(&mut self, op: Op, ty: Type, loc: Loc) -> Value {
        self.values.push(Inst { op, ty, loc });
        Value(self.values.len() as u32 - 1)
    }
    /// Follow `AddPtr` chains back to the pointer parameter a pointer value derives from.
    pub fn pointer_root(&self, v: Value) -> Option<u32> {
        self.walk_pointer(v, |_| {})
    }

    /// The pointer parameter `v` derives from and the offsets added to it along the way
    /// (outermost first).
    pub fn pointer_offsets(&self, v: Value) -> Option<(u32, Vec<Value>)> {
        let mut offsets = vec![];
        let root = self.walk_pointer(v, |o| offsets.push(o))?;
        Some((root, offsets))
    }

    fn walk_pointer(&self, mut v: Value, mut offset: impl FnMut(Value)) -> Option<u32> {
        loop {
            match self.inst(v).op {
                Op::AddPtr(p, o) => {
                    offset(o);
                    v = p;
                }
                Op::Splat(p) => v = p,
                Op::Param(i) => return Some(i),
                _ => return None,
            }
        }
    }
}
