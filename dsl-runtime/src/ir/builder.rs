//! The IR builder: the API that `#[kernel]`'s expansion calls, once per specialization.
//!
//! It does what the macro cannot: it knows every type and shape, so it resolves literals
//! against the other operand's element type (Triton's "weak" constants), promotes mixed
//! element types, splats scalars over blocks, and rejects what does not fit, with the
//! source location of the offending expression. The resulting IR never broadcasts or
//! converts implicitly (see the [verifier](super::verify)).

use super::arith::{eval_binary, eval_cast, eval_cmp, eval_unary, BinOp, CmpOp, ConstVal, UnaryOp};
use super::{Block, Function, Loc, Op, Param, ParamKind, ParamSpec, Type, Value};
use super::BuildError;
use crate::DType;

/// An operand of a builder call: an SSA value, or a literal whose type is taken from the
/// other operands (an integer literal next to an `f32` block is an `f32`).
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Operand {
    V(Value),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl From<Value> for Operand {
    fn from(v: Value) -> Operand {
        Operand::V(v)
    }
}

impl Operand {
    /// A compile-time constant of the kernel (`const BLOCK: usize`, `const FLAG: bool`).
    pub fn from_const(c: impl ConstArg) -> Operand {
        c.operand()
    }
}

/// Types of `#[kernel]` compile-time parameters.
pub trait ConstArg {
    fn operand(self) -> Operand;
}
macro_rules! const_arg {
    ($($t:ty),*) => {$(
        impl ConstArg for $t {
            fn operand(self) -> Operand {
                Operand::Int(self as i64)
            }
        }
    )*};
}
const_arg!(usize, u32, i32, i64);
impl ConstArg for bool {
    fn operand(self) -> Operand {
        Operand::Bool(self)
    }
}

pub(super) type R<T> = Result<T, BuildError>;

/// The body of a [`Hook`](crate::dsl::Hook) call, given to a builder at run time
/// ([`Builder::set_hook`]): emits the helper's code for the call's arguments, at the call's
/// location, and returns its value, of the first argument's type. It must be a pure
/// function of its arguments (no state that changes what it emits): a kernel built with
/// it is identified by the code of one build.
pub type HookFn = dyn Fn(&mut Builder, &[Operand], Loc) -> Result<Operand, BuildError> + Send + Sync;

/// Builds one [`Function`]. See the [module docs](super) for an example.
pub struct Builder {
    pub(super) f: Function,
    /// The value each parameter was bound to (a `param` or, for `== 1` specializations, a constant).
    param_values: Vec<Value>,
    /// Regions being built, innermost last ([`control`](super::control)).
    pub(super) open: Vec<OpenRegion>,
    /// What a [`Hook`](crate::dsl::Hook) call emits, if set.
    hook: Option<std::sync::Arc<HookFn>>,
}

pub(super) fn err<T>(loc: Loc, msg: impl Into<String>) -> R<T> {
    Err(BuildError::new(loc, msg))
}

pub(super) fn fmt_shape(s: &[usize]) -> String {
    format!("{s:?}")
}

pub use super::MAX_BLOCK_ELEMENTS;

/// A region being built (by the control family's `begin_for`/`begin_if`).
pub(crate) struct OpenRegion {
    /// The instruction that will own it (in the arena, placed when the region closes).
    pub owner: Value,
    pub block: Block,
    pub args: Vec<Value>,
    /// For an `if`: the finished `then` region while `else` is built.
    pub then: Option<super::Region>,
}

impl Builder {
    /// Start a kernel with these parameters and no specialization.
    pub fn new(name: &str, params: &[(&str, ParamKind)]) -> Builder {
        let specs = vec![ParamSpec::default(); params.len()];
        Builder::specialized(name, params, &specs)
    }

    /// Start a kernel whose arguments are known to have the properties in `specs`. Integer
    /// parameters known to be 1 become the constant 1.
    pub fn specialized(name: &str, params: &[(&str, ParamKind)], specs: &[ParamSpec]) -> Builder {
        let mut f = Function {
            name: name.to_string(),
            params: Vec::new(),
            constants: Vec::new(),
            values: Vec::new(),
            body: Block::default(),
        };
        let mut param_values = Vec::new();
        for (i, ((pname, kind), spec)) in params.iter().zip(specs).enumerate() {
            let p = Param { name: pname.to_string(), kind: *kind, spec: *spec };
            let ty = p.ty();
            f.params.push(p);
            let v = match kind {
                ParamKind::Scalar(d) if d.is_int() && spec.eq_one => f.push(Op::Const(ConstVal::Int(1)), ty, Loc::default()),
                _ => f.push(Op::Param(i as u32), ty, Loc::default()),
            };
            f.body.insts.push(v);
            param_values.push(v);
        }
        Builder { f, param_values, open: Vec::new(), hook: None }
    }

    /// Set what a [`Hook`](crate::dsl::Hook) call emits from now on (`None`: nothing, the
    /// call fails to build); the previous one. What
    /// [`IrKernel::hooked`](crate::built::IrKernel::hooked) does around a kernel's build.
    pub fn set_hook(&mut self, hook: Option<std::sync::Arc<HookFn>>) -> Option<std::sync::Arc<HookFn>> {
        std::mem::replace(&mut self.hook, hook)
    }

    /// What a [`Hook`](crate::dsl::Hook) call emits, if set.
    pub fn hook(&self) -> Option<std::sync::Arc<HookFn>> {
        self.hook.clone()
    }

    /// Record a compile-time constant of the specialization (shown by the printer).
    pub fn constant_value(&mut self, name: &str, value: impl ToString) {
        self.f.constants.push((name.to_string(), value.to_string()));
    }

    /// The value of parameter `i`.
    pub fn param(&self, i: usize) -> Value {
        self.param_values[i]
    }

    pub fn ty(&self, v: Value) -> &Type {
        self.f.ty(v)
    }

    /// Append an instruction to the block being built.
    pub(super) fn emit(&mut self, op: Op, ty: Type, loc: Loc) -> Value {
        let v = self.f.push(op, ty, loc);
        self.place(v);
        v
    }

    /// Put an instruction already in the arena at the end of the block being built.
    pub(super) fn place(&mut self, v: Value) {
        match self.open.last_mut() {
            Some(r) => r.block.insts.push(v),
            None => self.f.body.insts.push(v),
        }
    }

    /// A scalar constant of type `d`; checks that integer literals fit.
    pub fn constant(&mut self, c: ConstVal, d: DType, loc: Loc) -> R<Value> {
        let c = match (c, d) {
            (ConstVal::Bool(b), DType::Bool) => ConstVal::Bool(b),
            (ConstVal::Bool(_), _) | (_, DType::Bool) => return err(loc, format!("a `bool` and a `{d}` do not mix; compare to get a mask")),
            (ConstVal::Int(i), d) if d.is_int() => {
                if super::arith::wrap(d, i) != i {
                    return err(loc, format!("literal {i} does not fit in {d}"));
                }
                ConstVal::Int(i)
            }
            (ConstVal::Int(i), d) => ConstVal::Float(d.round(i as f64)),
            (ConstVal::Float(x), d) if d.is_float() => ConstVal::Float(d.round(x)),
            (ConstVal::Float(x), d) => return err(loc, format!("float literal {x:?} used where a {d} is expected; convert with `as`")),
        };
        Ok(self.emit(Op::Const(c), Type::scalar(d), loc))
    }

    /// The element type of an operand (a literal's default type).
    pub fn dtype_of_operand(&self, o: Operand) -> DType {
        match o {
            Operand::V(v) => self.ty(v).dtype,
            c => Self::default_dtype(c),
        }
    }

    /// The type a literal takes when it stands alone.
    pub(super) fn default_dtype(c: Operand) -> DType {
        match c {
            Operand::Int(i) if i32::try_from(i).is_ok() => DType::I32,
            Operand::Int(_) => DType::I64,
            Operand::Float(_) => DType::F32,
            Operand::Bool(_) => DType::Bool,
            Operand::V(_) => unreachable!(),
        }
    }

    fn lit(c: Operand) -> ConstVal {
        match c {
            Operand::Int(i) => ConstVal::Int(i),
            Operand::Float(x) => ConstVal::Float(x),
            Operand::Bool(b) => ConstVal::Bool(b),
            Operand::V(_) => unreachable!(),
        }
    }

    /// Turn an operand into a value; a literal takes its default type (`i32`, `f32`, `bool`).
    pub(super) fn value(&mut self, o: Operand, loc: Loc) -> R<Value> {
        match o {
            Operand::V(v) => Ok(v),
            c => {
                let d = Self::default_dtype(c);
                self.materialize(c, d, loc)
            }
        }
    }

    /// Turn an operand into a value, a literal taking type `d`.
    pub(super) fn materialize(&mut self, o: Operand, d: DType, loc: Loc) -> R<Value> {
        match o {
            Operand::V(v) => Ok(v),
            c => self.constant(Self::lit(c), d, loc),
        }
    }

    /// Convert `v` to element type `d` (no-op when it already is).
    fn convert(&mut self, v: Value, d: DType, loc: Loc) -> R<Value> {
        if self.ty(v).dtype == d {
            return Ok(v);
        }
        self.cast(v, d, loc)
    }

    /// Broadcast `v` to `shape` with NumPy's rules: missing leading dimensions are added,
    /// dimensions of size 1 repeat. A no-op when the shapes already agree.
    pub fn broadcast_value(&mut self, v: Value, shape: &[usize], loc: Loc) -> R<Value> {
        let ty = self.ty(v).clone();
        if ty.shape == shape {
            return Ok(v);
        }
        if ty.is_scalar() {
            return Ok(self.emit(Op::Splat(v), ty.with_shape(shape.to_vec()), loc));
        }
        let fits = ty.shape.len() <= shape.len()
            && ty.shape.iter().rev().zip(shape.iter().rev()).all(|(&a, &b)| a == b || a == 1);
        if !fits {
            return err(loc, format!("shape mismatch: a block of shape {} cannot broadcast to {}", fmt_shape(&ty.shape), fmt_shape(shape)));
        }
        let mut x = v;
        while self.ty(x).shape.len() < shape.len() {
            let s = self.ty(x).shape.clone();
            x = self.emit(Op::ExpandDims(x, 0), ty.with_shape([vec![1], s].concat()), loc);
        }
        if self.ty(x).shape == shape {
            return Ok(x);
        }
        Ok(self.emit(Op::Broadcast(x), ty.with_shape(shape.to_vec()), loc))
    }

    /// The shape that operands of these shapes broadcast to (NumPy's rules).
    pub(super) fn common_shape(&self, vals: &[Value], loc: Loc) -> R<Vec<usize>> {
        let mut shape: Vec<usize> = vec![];
        for &v in vals {
            let s = &self.ty(v).shape;
            let r = shape.len().max(s.len());
            let pad = |x: &[usize]| [vec![1; r - x.len()], x.to_vec()].concat();
            let (a, b) = (pad(&shape), pad(s));
            let mut out = Vec::with_capacity(r);
            for (&x, &y) in a.iter().zip(&b) {
                out.push(match (x, y) {
                    _ if x == y => x,
                    (1, y) => y,
                    (x, 1) => x,
                    _ => return err(loc, format!("shape mismatch: {} and {} do not broadcast (dimensions must be equal or 1)", fmt_shape(&shape), fmt_shape(s))),
                });
            }
            shape = out;
        }
        Ok(shape)
    }

    /// Resolve two numeric operands to values of one element type and one shape.
    fn unify(&mut self, a: Operand, b: Operand, loc: Loc) -> R<(Value, Value)> {
        let dtype = match (a, b) {
            (Operand::V(x), Operand::V(y)) => {
                let (dx, dy) = (self.ty(x).dtype, self.ty(y).dtype);
                if self.ty(x).ptr || self.ty(y).ptr {
                    return err(loc, "pointers only support `ptr + offsets`");
                }
                match DType::promote(dx, dy) {
                    Some(d) => d,
                    None => return err(loc, format!("cannot combine {dx} and {dy}")),
                }
            }
            (Operand::V(x), c) | (c, Operand::V(x)) => {
                let t = self.ty(x);
                if t.ptr {
                    return err(loc, "pointers only support `ptr + offsets`");
                }
                match (t.dtype, c) {
                    (d, Operand::Float(_)) if d.is_int() => DType::F32,
                    (DType::Bool, Operand::Int(_) | Operand::Float(_)) => {
                        return err(loc, "a mask (bool) cannot be combined with a number")
                    }
                    (d, _) => d,
                }
            }
            (x, y) => {
                let (dx, dy) = (Self::default_dtype(x), Self::default_dtype(y));
                DType::promote(dx, dy).ok_or_else(|| BuildError::new(loc, format!("cannot combine {dx} and {dy}")))?
            }
        };
        let x = self.materialize(a, dtype, loc)?;
        let y = self.materialize(b, dtype, loc)?;
        let x = self.convert(x, dtype, loc)?;
        let y = self.convert(y, dtype, loc)?;
        let shape = self.common_shape(&[x, y], loc)?;
        Ok((self.broadcast_value(x, &shape, loc)?, self.broadcast_value(y, &shape, loc)?))
    }

    /// Fold an operation on constants, when both operands are constants.
    fn const_of(&self, v: Value) -> Option<ConstVal> {
        match self.f.inst(v).op {
            Op::Const(c) => Some(c),
            _ => None,
        }
    }

    /// `a op b`, with literal typing, promotion and splatting. `ptr + int` is `add_ptr`.
    pub fn binary(&mut self, op: BinOp, a: impl Into<Operand>, b: impl Into<Operand>, loc: Loc) -> R<Value> {
        let (a, b) = (a.into(), b.into());
        // Pointer arithmetic.
        let is_ptr = |s: &Self, o: Operand| matches!(o, Operand::V(v) if s.ty(v).ptr);
        match (op, is_ptr(self, a), is_ptr(self, b)) {
            (BinOp::Add, true, false) => return self.add_ptr(a, b, loc),
            (BinOp::Add, false, true) => return self.add_ptr(b, a, loc),
            (BinOp::Sub, true, false) => {
                let neg = self.binary(BinOp::Sub, Operand::Int(0), b, loc)?;
                return self.add_ptr(a, neg, loc);
            }
            (_, false, false) => {}
            _ => return err(loc, format!("`{}` is not defined on pointers; only `ptr + offsets` and `ptr - offsets` are", op.name())),
        }
        let (x, y) = self.unify(a, b, loc)?;
        let ty = self.ty(x).clone();
        if op.is_bitwise() && ty.dtype.is_float() {
            return err(loc, format!("`{}` needs integers or masks, found {}", op.name(), ty.dtype));
        }
        if !op.is_bitwise() && ty.dtype == DType::Bool && !matches!(op, BinOp::Max | BinOp::Min) {
            return err(loc, format!("`{}` is not defined on masks (bool); use `&`, `|`, `^` or `select`", op.name()));
        }
        if let (Some(p), Some(q), true) = (self.const_of(x), self.const_of(y), ty.is_scalar()) {
            let c = eval_binary(op, ty.dtype, p, q).map_err(|m| BuildError::new(loc, m))?;
            return Ok(self.emit(Op::Const(c), ty, loc));
        }
        Ok(self.emit(Op::Binary(op, x, y), ty, loc))
    }

    /// `a op b` as a mask.
    pub fn cmp(&mut self, op: CmpOp, a: impl Into<Operand>, b: impl Into<Operand>, loc: Loc) -> R<Value> {
        let (x, y) = self.unify(a.into(), b.into(), loc)?;
        let ty = self.ty(x).clone();
        if ty.dtype == DType::Bool && !matches!(op, CmpOp::Eq | CmpOp::Ne) {
            return err(loc, format!("`{}` compares numbers, not masks", op.name()));
        }
        if let (Some(p), Some(q), true) = (self.const_of(x), self.const_of(y), ty.is_scalar()) {
            return self.constant(ConstVal::Bool(eval_cmp(op, ty.dtype, p, q)), DType::Bool, loc);
        }
        Ok(self.emit(Op::Cmp(op, x, y), Type::block(DType::Bool, ty.shape), loc))
    }

    /// `op a`. Transcendental functions convert integer operands to `f32`.
    pub fn unary(&mut self, op: UnaryOp, a: impl Into<Operand>, loc: Loc) -> R<Value> {
        let a = a.into();
        let v = match a {
            Operand::V(v) => v,
            c => {
                let d = if op.is_float_only() { DType::F32 } else { Self::default_dtype(c) };
                self.materialize(c, d, loc)?
            }
        };
        let ty = self.ty(v).clone();
        if ty.ptr {
            return err(loc, format!("`{}` is not defined on pointers", op.name()));
        }
        let v = match ty.dtype {
            DType::Bool if op != UnaryOp::Not => return err(loc, format!("`{}` is not defined on masks (bool)", op.name())),
            d if d.is_int() && op.is_float_only() => self.cast(v, DType::F32, loc)?,
            d if d.is_float() && op == UnaryOp::Not => return err(loc, format!("`!` is not defined on {d}")),
            _ => v,
        };
        let ty = self.ty(v).clone();
        if let (Some(c), true) = (self.const_of(v), ty.is_scalar()) {
            let r = eval_unary(op, ty.dtype, c).map_err(|m| BuildError::new(loc, m))?;
            return Ok(self.emit(Op::Const(r), ty, loc));
        }
        Ok(self.emit(Op::Unary(op, v), ty, loc))
    }

    /// `select(cond, a, b)`.
    pub fn select(&mut self, c: impl Into<Operand>, a: impl Into<Operand>, b: impl Into<Operand>, loc: Loc) -> R<Value> {
        let c = self.materialize(c.into(), DType::Bool, loc)?;
        if self.ty(c).dtype != DType::Bool || self.ty(c).ptr {
            return err(loc, format!("the condition of `select` must be a mask (bool), found {}", self.ty(c).dtype));
        }
        let (x, y) = self.unify(a.into(), b.into(), loc)?;
        let shape = self.common_shape(&[c, x, y], loc)?;
        let c = self.broadcast_value(c, &shape, loc)?;
        let x = self.broadcast_value(x, &shape, loc)?;
        let y = self.broadcast_value(y, &shape, loc)?;
        let ty = self.ty(x).clone();
        Ok(self.emit(Op::Select(c, x, y), ty, loc))
    }

    /// `a * b + c` rounded once (`tl.fma`; `fma` in kernels): float operands, promoted and
    /// broadcast as `a * b + c` would be.
    pub fn fma(&mut self, a: impl Into<Operand>, b: impl Into<Operand>, c: impl Into<Operand>, loc: Loc) -> R<Value> {
        let (x, y) = self.unify(a.into(), b.into(), loc)?;
        let (x, z) = self.unify(Operand::V(x), c.into(), loc)?;
        let (y, z) = self.unify(Operand::V(y), Operand::V(z), loc)?;
        let (x, z) = self.unify(Operand::V(x), Operand::V(z), loc)?;
        let ty = self.ty(z).clone();
        if !ty.dtype.is_float() {
            return err(loc, format!("`fma` needs floats, found {}", ty.dtype));
        }
        Ok(self.emit(Op::Fma(x, y, z), ty, loc))
    }

    /// Convert to element type `to` (`x as bf16`).
    pub fn cast(&mut self, a: impl Into<Operand>, to: DType, loc: Loc) -> R<Value> {
        let v = match a.into() {
            Operand::V(v) => v,
            c => {
                let d = Self::default_dtype(c);
                self.materialize(c, d, loc)?
            }
        };
        let ty = self.ty(v).clone();
        if ty.ptr {
            return err(loc, "pointers cannot be cast");
        }
        if ty.dtype == to {
            return Ok(v);
        }
        if let (Some(c), true) = (self.const_of(v), ty.is_scalar()) {
            return Ok(self.emit(Op::Const(eval_cast(ty.dtype, to, c)), Type::scalar(to), loc));
        }
        Ok(self.emit(Op::Cast(v), Type::block(to, ty.shape), loc))
    }

    /// `program_id(axis)`.
    pub fn program_id(&mut self, axis: i64, loc: Loc) -> R<Value> {
        if !(0..3).contains(&axis) {
            return err(loc, format!("program_id axis must be 0, 1 or 2, found {axis}"));
        }
        Ok(self.emit(Op::ProgramId(axis as u8), Type::scalar(DType::I32), loc))
    }

    /// `num_programs(axis)`.
    pub fn num_programs(&mut self, axis: i64, loc: Loc) -> R<Value> {
        if !(0..3).contains(&axis) {
            return err(loc, format!("num_programs axis must be 0, 1 or 2, found {axis}"));
        }
        Ok(self.emit(Op::NumPrograms(axis as u8), Type::scalar(DType::I32), loc))
    }

    /// `arange(start, end)`: a 1-D `i32` block.
    pub fn arange(&mut self, start: i64, end: i64, loc: Loc) -> R<Value> {
        let n = end - start;
        if n <= 0 {
            return err(loc, format!("arange({start}, {end}) is empty"));
        }
        if (n as usize).next_power_of_two() > MAX_BLOCK_ELEMENTS {
            return err(loc, format!("arange length {n} is larger than the limit of 2^20 elements per block"));
        }
        if i32::try_from(start).is_err() || i32::try_from(end).is_err() {
            return err(loc, format!("arange({start}, {end}) does not fit in i32"));
        }
        Ok(self.emit(Op::Arange { start, end }, Type::block(DType::I32, vec![n as usize]), loc))
    }

    /// `ptr + offsets` (offsets in elements).
    pub fn add_ptr(&mut self, p: impl Into<Operand>, off: impl Into<Operand>, loc: Loc) -> R<Value> {
        let Operand::V(p) = p.into() else { return err(loc, "`add_ptr` needs a pointer") };
        if !self.ty(p).ptr {
            return err(loc, format!("expected a pointer, found {}", self.ty(p).dtype));
        }
        let off = self.materialize(off.into(), DType::I32, loc)?;
        let ot = self.ty(off).clone();
        if ot.ptr || !ot.dtype.is_int() {
            return err(loc, format!("pointer offsets must be integers, found {}", if ot.ptr { "a pointer".to_string() } else { ot.dtype.to_string() }));
        }
        let shape = self.common_shape(&[p, off], loc)?;
        let p = self.broadcast_value(p, &shape, loc)?;
        let off = self.broadcast_value(off, &shape, loc)?;
        let ty = self.ty(p).clone();
        Ok(self.emit(Op::AddPtr(p, off), ty, loc))
    }

    fn mask_value(&mut self, m: Operand, loc: Loc) -> R<Value> {
        let m = self.materialize(m, DType::Bool, loc)?;
        let t = self.ty(m);
        if t.dtype != DType::Bool || t.ptr {
            return err(loc, format!("a mask must be bool (a comparison), found {}", if t.ptr { "a pointer".into() } else { t.dtype.to_string() }));
        }
        Ok(m)
    }

    /// `load(ptr, mask, other)`.
    pub fn load(&mut self, p: impl Into<Operand>, mask: Option<Operand>, other: Option<Operand>, loc: Loc) -> R<Value> {
        let Operand::V(p) = p.into() else { return err(loc, "`load` needs a pointer, found a literal") };
        let pt = self.ty(p).clone();
        if !pt.ptr {
            return err(loc, format!("`load` needs a pointer, found {}", pt.dtype));
        }
        let elem = pt.dtype;
        let mask = mask.map(|m| self.mask_value(m, loc)).transpose()?;
        let other = match (other, mask) {
            (Some(o), _) => Some(o),
            (None, Some(_)) => Some(if elem.is_float() { Operand::Float(0.0) } else { Operand::Int(0) }),
            (None, None) => None,
        };
        let other = match other {
            None => None,
            Some(o) => {
                let v = self.materialize(o, elem, loc)?;
                let ot = self.ty(v);
                if ot.ptr || ot.dtype != elem {
                    return err(loc, format!("`other` is {} but the pointer loads {elem}; convert it with `as {elem}`", ot.dtype));
                }
                Some(v)
            }
        };
        let vals: Vec<Value> = [Some(p), mask, other].into_iter().flatten().collect();
        let shape = self.common_shape(&vals, loc)?;
        let p = self.broadcast_value(p, &shape, loc)?;
        let mask = mask.map(|m| self.broadcast_value(m, &shape, loc)).transpose()?;
        let other = other.map(|o| self.broadcast_value(o, &shape, loc)).transpose()?;
        Ok(self.emit(Op::Load { ptr: p, mask, other }, Type::block(elem, shape), loc))
    }

    /// `store(ptr, value, mask)`.
    pub fn store(&mut self, p: impl Into<Operand>, value: impl Into<Operand>, mask: Option<Operand>, loc: Loc) -> R<Value> {
        let Operand::V(p) = p.into() else { return err(loc, "`store` needs a pointer, found a literal") };
        let pt = self.ty(p).clone();
        if !pt.ptr {
            return err(loc, format!("`store` needs a pointer, found {}", pt.dtype));
        }
        let elem = pt.dtype;
        self.writable_root(p, "store", loc)?;
        let v = self.materialize(value.into(), elem, loc)?;
        let vt = self.ty(v).clone();
        if vt.ptr || vt.dtype != elem {
            let found = if vt.ptr { "a pointer".to_string() } else { format!("a {} value", vt.dtype) };
            return err(loc, format!("store of {found} through a pointer to {elem}; convert it with `as {elem}`"));
        }
        let mask = mask.map(|m| self.mask_value(m, loc)).transpose()?;
        let vals: Vec<Value> = [Some(p), Some(v), mask].into_iter().flatten().collect();
        let shape = self.common_shape(&vals, loc)?;
        if shape != pt.shape {
            let s = &self.ty(v).shape;
            return err(loc, format!("shape mismatch: storing a block of shape {} through pointers of shape {}", fmt_shape(s), fmt_shape(&pt.shape)));
        }
        let p = self.broadcast_value(p, &shape, loc)?;
        let v = self.broadcast_value(v, &shape, loc)?;
        let mask = mask.map(|m| self.broadcast_value(m, &shape, loc)).transpose()?;
        Ok(self.emit(Op::Store { ptr: p, value: v, mask }, Type::unit(), loc))
    }

    /// Finish and verify.
    pub fn finish(self) -> R<Function> {
        if let Some(r) = self.open.last() {
            return err(self.f.inst(r.owner).loc, "a loop or branch was opened but not closed");
        }
        super::verify::verify(&self.f)?;
        Ok(self.f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> Builder {
        Builder::new(
            "t",
            &[
                ("x", ParamKind::Ptr { elem: DType::BF16, writable: false }),
                ("y", ParamKind::Ptr { elem: DType::F32, writable: true }),
                ("n", ParamKind::Scalar(DType::I32)),
            ],
        )
    }
    const L: Loc = Loc::new(7, 3);

    #[test]
    fn literals_take_the_other_operands_type() {
        let mut b = kernel();
        let offs = b.arange(0, 64, L).unwrap();
        let f = b.binary(BinOp::Add, offs, Operand::Float(0.5), L).unwrap();
        assert_eq!(b.ty(f).dtype, DType::F32); // int block + float literal promotes
        let i = b.binary(BinOp::Mul, offs, Operand::Int(4), L).unwrap();
        assert_eq!(b.ty(i).dtype, DType::I32);
        assert_eq!(b.ty(i).shape, vec![64]);
    }

    #[test]
    fn constants_fold_at_build_time() {
        let mut b = kernel();
        let c = b.binary(BinOp::Mul, Operand::Int(6), Operand::Int(7), L).unwrap();
        assert_eq!(b.f.inst(c).op, Op::Const(ConstVal::Int(42)));
    }

    #[test]
    fn errors_name_the_location() {
        let mut b = kernel();
        let x = b.param(0);
        let offs = b.arange(0, 64, L).unwrap();
        let p = b.add_ptr(x, offs, L).unwrap();
        let v = b.load(p, None, None, L).unwrap();
        let y = b.param(1);
        let q = b.add_ptr(y, offs, L).unwrap();
        let e = b.store(q, v, None, Loc::new(9, 5)).unwrap_err();
        assert_eq!(e.loc, Loc::new(9, 5));
        assert!(e.message.contains("store of a bf16 value through a pointer to f32"), "{e}");
        let e = b.store(p, v, None, L).unwrap_err();
        assert!(e.message.contains("read-only"), "{e}");
        let o2 = b.arange(0, 128, L).unwrap();
        let e = b.binary(BinOp::Add, offs, o2, L).unwrap_err();
        assert!(e.message.contains("shape mismatch"));
        let m = b.cmp(CmpOp::Lt, offs, Operand::Int(3), L).unwrap();
        let e = b.binary(BinOp::Add, m, Operand::Int(1), L).unwrap_err();
        assert!(e.message.contains("mask"), "{e}");
        let e = b.load(q, Some(Operand::V(v)), None, L).unwrap_err();
        assert!(e.message.contains("a mask must be bool"), "{e}");
    }

    #[test]
    fn eq_one_parameters_become_constants() {
        let params = [("s", ParamKind::Scalar(DType::I32))];
        let b = Builder::specialized("t", &params, &[ParamSpec { eq_one: true, div16: false }]);
        assert_eq!(b.f.inst(b.param(0)).op, Op::Const(ConstVal::Int(1)));
    }
}
