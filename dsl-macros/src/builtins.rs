//! The DSL's functions and operators, described once: [`BUILTINS`] and [`OPERATORS`].
//!
//! Each row of [`BUILTINS`] is one function a kernel can call: its name, its op family
//! (the runtime's `ir/<family>.rs` that holds its IR), how many arguments it takes
//! (`params` names them in messages), its generic argument ([`Generics`]), how the docs spell
//! it ([`Form`]), what each argument must be ([`Arg`]: which are compile-time, shapes, masks,
//! strings), its typing rule ([`Rule`]: the result's type and rank) and what it builds
//! ([`Build`]: the `dsl_runtime::ir::Builder` call). `validate.rs` checks generics and
//! arity from the row and then types the call by its rule, one arm per rule; `expand.rs`
//! turns the arguments into builder arguments by their [`Arg`]s and emits the row's
//! [`Build`], with no per-builtin code. The "unknown method" message, its "did you mean"
//! suggestion and the `cannot find` hint read the table too, and so does the one decision
//! between a builtin and a helper: a call `f(x)` of a name that is not in the table is a
//! call of a `#[kernel_fn]` (`Cx::helper_call` in `validate.rs`, `Gen::helper_call` in
//! `expand.rs`), which rustc resolves.
//!
//! Adding a builtin: a row here, and its op in the runtime (the IR family's op and builder
//! method, the interpreter, the lowering) and in `dsl_runtime::dsl`'s table (a unit test
//! below compares the names). A row whose typing no [`Rule`] describes needs a new rule
//! (an arm in `validate.rs`); a row whose builder arguments no [`Src`] describes, a new
//! `Src` (an arm in `expand.rs`).
//!
//! Every builtin can be called either way: `parse.rs` turns `x.f(a)` into `f(x, a)`, so a
//! method's receiver is its first argument (and arity messages count it out again).
//! [`Form`] is the spelling the docs use; `cast`'s method is spelt `to`.
//!
//! Rows are in the order the "not a DSL function" message lists them ([`builtin_list`]).
//!
//! Not in the table, because they are syntax rather than calls:
//! - the operators `+ - * / % & | ^ < <= > >= == !=` ([`Bin`]), unary `-` and `!`, and
//!   `as` (parse.rs gives them AST nodes of their own; expand.rs builds them directly);
//! - control flow, `if`, `for .. in (a..b).step_by(s)` (`step_by` is part of the loop's
//!   syntax) and `return`: they have regions, carried values and a compile-time/runtime
//!   decision, so parse.rs, validate.rs (`Expr::If`, `Expr::For`) and expand.rs
//!   (`runtime_if`, `for_loop`) handle them, and they are what the runtime's `control`
//!   family holds (no row has that family);
//! - literals, `f32::INFINITY` and friends, `[a, b]` shapes and string literals, which
//!   appear only as arguments;
//! - helpers: each `#[kernel_fn]` is its own macro invocation, which the kernel's cannot
//!   see, so they are not rows; rustc checks their calls.
//!
//! What stays special inside the rules, in `validate.rs`: which pointer parameter a
//! pointer derives from (`store` and atomics mark it written; `select` refuses to choose
//! between pointers, a runtime `if` or loop refuses to switch parameters), and checks of
//! one argument against another (`load`'s `other` and a store's value against the
//! pointee type, an axis against the block's rank).
//!
//! # One vocabulary, mirrored
//!
//! A proc-macro crate cannot depend on the runtime, so the macro names the runtime's ops
//! by path in the tokens it emits. Each side keeps one list: here, [`OPERATORS`] (whose
//! [`Bin`] variants are named as the runtime's `BinOp`/`CmpOp` variants they build, so
//! [`Bin::ir_path`] derives the path) and the [`Build`] column (`UnaryOp::Exp`,
//! `ReduceOp::Sum`, `AtomicOp::Cas`, ...); there, the enums of `dsl-runtime/src/ir/`.
//! `maximum`/`minimum` are the runtime's `BinOp::Max`/`Min`, functions rather than
//! operators here. The unit tests below read the runtime's sources and fail when the two
//! sides drift apart.

/// The runtime's op family (a file of `dsl-runtime/src/ir/`) that holds a builtin's IR.
/// The `control` family has no builtins: control flow is syntax (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Family {
    Arith,
    Shape,
    Reduce,
    Dot,
    Memory,
    Debug,
}

/// A builtin's generic argument.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Generics {
    /// None: `f::<..>` is an error.
    None,
    /// `arange::<N>()`: a compile-time length, standing for the arguments `(0, N)`; the
    /// call is then written with no arguments.
    Length,
    /// `cast::<T>(x)`: the element type converted to, required. [`Rule::Convert`] checks
    /// it, after the argument (only conversions take one).
    Dtype,
    /// `zeros::<T>(..)`: the element type, optional (else that of the value). Checked
    /// before the arguments.
    OptionalDtype,
}

/// How the docs spell a builtin. The macro accepts both spellings for every builtin.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Form {
    /// `f(x, ..)`
    Function,
    /// `x.f(..)`
    Method,
    /// Either.
    Both,
    /// `f(x)`, and as a method under another name: `cast::<T>(x)` is `x.to::<T>()`.
    MethodNamed(&'static str),
}

/// What one argument must be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Arg {
    /// A value: a block or a scalar, runtime or constant.
    Value,
    /// A pointer (`ptr + offsets`).
    Ptr,
    /// A mask (`bool`).
    Mask,
    /// A condition (`bool`), checked with its own message (`device_assert`).
    Cond,
    /// A compile-time integer; the word names it in messages ("the axis of `sum`").
    Const(&'static str),
    /// `[a, b, ..]` of compile-time integers: a shape or a permutation.
    Shape,
    /// A string literal.
    Str,
    /// Values, this one and every later argument (`device_print`).
    Values,
}

/// What a shape function needs of its block's rank, and the rank it gives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RankRule {
    /// `expand_dims(x, axis)`: one more dimension, at a compile-time axis in
    /// `-rank-1..=rank`.
    NewAxis,
    /// A block of rank `rank` (`does` says why, after the name, in the message); gives
    /// rank `gives`, or the same rank.
    Requires { rank: usize, does: &'static str, gives: Option<usize> },
    /// `reshape(x, [..])`, `broadcast_to(x, [..])`: the rank of the shape argument.
    ToShape,
    /// `permute(x, [..])`: the same rank; the permutation has one entry per dimension.
    Permutation,
}

/// The element type of a reduction's result (the runtime's `ReduceOp::accumulator`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Acc {
    /// The operand's.
    Same,
    /// `i32` indices (`argmax`).
    Index,
    /// Sums: f16/bf16 accumulate in f32, u8/bool in i32, others in their own type.
    Sum,
}

/// How validation types a call (one arm of `validate.rs` each). Arity and generics are
/// checked from the row before the rule runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rule {
    /// An `i32` of this rank; every argument is compile-time (`program_id`, `arange`).
    Index { rank: usize },
    /// Reads through a pointer: the pointee type, the pointer's rank; `other` must fit
    /// the pointee.
    Load,
    /// Writes through a pointer (which parameter is then written); gives nothing.
    Store,
    /// `select(mask, a, b)`: `a` and `b` promoted and broadcast with the mask; never
    /// between pointers.
    Select,
    /// Numbers combined elementwise and promoted; never a compile-time value.
    Elementwise,
    /// A math function of a number: an integer gives `f32` when `int_to_f32` (the
    /// runtime's `UnaryOp::is_float_only`), else keeps its type.
    Math { int_to_f32: bool },
    /// Converts to the type argument.
    Convert,
    /// The operator spelt as a method: `a.lt(b)` is `a < b`, typed and built as it.
    Operator(Bin),
    /// A block of the shape argument filled with the value (zero without one); the
    /// element type is the type argument, else the value's.
    Fill,
    /// Rearranges one block.
    Shape(RankRule),
    /// Along a compile-time axis; without one, a reduction reduces everything (a scalar)
    /// and a scan (`scan`) runs along axis 0. A scan keeps the rank.
    Reduce { acc: Acc, scan: bool },
    /// Read-modify-write through a pointer (`i32`, `i64`, `f32` buffers): the old values.
    Atomic,
    /// Strings, conditions and values, checked in that order; gives nothing.
    Debug,
    /// `dot(a, b, acc, "precision")`: 2-D blocks of one float type (`f32` accumulator of
    /// rank 2; the precision a literal); gives an `f32` 2-D block. Dimensions are checked
    /// when the IR is built (the macro does not know block sizes).
    Dot,
}

impl Rule {
    /// The call gives nothing (it is emitted as a statement).
    pub fn gives_unit(self) -> bool {
        matches!(self, Rule::Store | Rule::Debug)
    }
}

/// One argument of the builder call a builtin emits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Src {
    /// `::dsl_runtime::__private::ir::<path>`, an op of the runtime (`UnaryOp::Exp`).
    Op(&'static str),
    /// The call's argument `i`, as its [`Arg`] makes it: an `Operand`, an `i64`, a shape
    /// `&[i64; N]`, a `&str`.
    Arg(usize),
    /// `Some(argument i)`, or `None` when the call has fewer arguments.
    Opt(usize),
    /// Argument `i` (compile-time), or this value when the call has fewer arguments.
    Or(usize, i64),
    /// The arguments from `i` on, as `&[Operand]`.
    Rest(usize),
    /// An `i64`.
    I64(i64),
    /// The operand `0`.
    Zero,
    /// `None`.
    None,
    /// The type argument as a `DType`; without one, the element type of builder argument
    /// `k` (an operand).
    Dtype(usize),
}

/// What a call builds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Build {
    /// `__b.<method>(<args>.., loc)?`: bound to a temporary, or a statement when the rule
    /// gives nothing.
    Call { method: &'static str, args: &'static [Src] },
    /// What the rule's operator builds ([`Rule::Operator`]).
    Operator,
}

/// One builtin's signature.
#[derive(Clone, Copy, Debug)]
pub struct Builtin {
    pub name: &'static str,
    pub family: Family,
    /// The fewest and most arguments (a method's receiver counts as the first).
    pub arity: (usize, usize),
    /// The arguments as messages name them: "`load` takes 1 to 3 arguments (ptr, mask, other)".
    pub params: &'static str,
    pub generics: Generics,
    pub form: Form,
    /// What each argument must be, by position.
    pub args: &'static [Arg],
    pub rule: Rule,
    pub build: Build,
}

impl Builtin {
    /// What argument `i` must be ([`Arg::Values`] covers every later one).
    pub fn arg(&self, i: usize) -> Arg {
        match self.args.get(i) {
            Some(a) => *a,
            None => match self.args.last() {
                Some(Arg::Values) => Arg::Values,
                _ => Arg::Value,
            },
        }
    }
}

use Arg::{Cond, Const, Mask, Ptr, Shape, Str, Value, Values};
use Family as F;
use Form::{Both, Function, Method};
use Src::{Arg as A, Opt, Or, Rest};

/// A row of [`BUILTINS`], its columns in order.
#[allow(clippy::too_many_arguments)]
const fn row(name: &'static str, family: Family, arity: (usize, usize), params: &'static str, generics: Generics, form: Form, args: &'static [Arg], rule: Rule, build: Build) -> Builtin {
    Builtin { name, family, arity, params, generics, form, args, rule, build }
}

const fn call(method: &'static str, args: &'static [Src]) -> Build {
    Build::Call { method, args }
}

const NONE: Generics = Generics::None;
const MATH: Rule = Rule::Math { int_to_f32: true };

/// Every builtin. See the module doc.
#[rustfmt::skip]
pub const BUILTINS: &[Builtin] = &[
    //  name            family     arity    params                   generics                 form                     args                               rule                     build
    row("program_id",   F::Arith,  (1, 1),  "axis",                  NONE,                    Function,                &[Const("axis")],                  Rule::Index { rank: 0 }, call("program_id", &[A(0)])),
    row("num_programs", F::Arith,  (1, 1),  "axis",                  NONE,                    Function,                &[Const("axis")],                  Rule::Index { rank: 0 }, call("num_programs", &[A(0)])),
    row("arange",       F::Arith,  (2, 2),  "START, END",            Generics::Length,        Function,                &[Const("start"), Const("end")],   Rule::Index { rank: 1 }, call("arange", &[A(0), A(1)])),
    row("zeros",        F::Shape,  (1, 1),  "[shape]",               Generics::OptionalDtype, Function,                &[Shape],                          Rule::Fill, call("full", &[A(0), Src::Zero, Src::Dtype(1)])),
    row("full",         F::Shape,  (2, 2),  "[shape], value",        Generics::OptionalDtype, Function,                &[Shape, Value],                   Rule::Fill, call("full", &[A(0), A(1), Src::Dtype(1)])),
    row("load",         F::Memory, (1, 3),  "ptr, mask, other",      NONE,                    Function,                &[Ptr, Mask, Value],               Rule::Load, call("load", &[A(0), Opt(1), Opt(2)])),
    row("store",        F::Memory, (2, 3),  "ptr, value, mask",      NONE,                    Function,                &[Ptr, Value, Mask],               Rule::Store, call("store", &[A(0), A(1), Opt(2)])),
    row("select",       F::Arith,  (3, 3),  "mask, a, b",            NONE,                    Function,                &[Mask, Value, Value],             Rule::Select, call("select", &[A(0), A(1), A(2)])),
    row("fma",          F::Arith,  (3, 3),  "a, b, c",               NONE,                    Function,                &[Value, Value, Value],            Rule::Elementwise, call("fma", &[A(0), A(1), A(2)])),
    row("maximum",      F::Arith,  (2, 2),  "a, b",                  NONE,                    Function,                &[Value, Value],                   Rule::Elementwise, call("binary", &[Src::Op("BinOp::Max"), A(0), A(1)])),
    row("minimum",      F::Arith,  (2, 2),  "a, b",                  NONE,                    Function,                &[Value, Value],                   Rule::Elementwise, call("binary", &[Src::Op("BinOp::Min"), A(0), A(1)])),
    row("exp",          F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          MATH, call("unary", &[Src::Op("UnaryOp::Exp"), A(0)])),
    row("exp2",         F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          MATH, call("unary", &[Src::Op("UnaryOp::Exp2"), A(0)])),
    row("log",          F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          MATH, call("unary", &[Src::Op("UnaryOp::Log"), A(0)])),
    row("log2",         F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          MATH, call("unary", &[Src::Op("UnaryOp::Log2"), A(0)])),
    row("sqrt",         F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          MATH, call("unary", &[Src::Op("UnaryOp::Sqrt"), A(0)])),
    row("rsqrt",        F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          MATH, call("unary", &[Src::Op("UnaryOp::Rsqrt"), A(0)])),
    row("abs",          F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          Rule::Math { int_to_f32: false }, call("unary", &[Src::Op("UnaryOp::Abs"), A(0)])),
    row("sin",          F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          MATH, call("unary", &[Src::Op("UnaryOp::Sin"), A(0)])),
    row("cos",          F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          MATH, call("unary", &[Src::Op("UnaryOp::Cos"), A(0)])),
    row("tanh",         F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          MATH, call("unary", &[Src::Op("UnaryOp::Tanh"), A(0)])),
    row("sigmoid",      F::Arith,  (1, 1),  "x",                     NONE,                    Both,                    &[Value],                          MATH, call("unary", &[Src::Op("UnaryOp::Sigmoid"), A(0)])),
    row("cast",         F::Arith,  (1, 1),  "x",                     Generics::Dtype,         Form::MethodNamed("to"), &[Value],                          Rule::Convert, call("cast", &[A(0), Src::Dtype(0)])),
    row("lt",           F::Arith,  (2, 2),  "other",                 NONE,                    Method,                  &[Value, Value],                   Rule::Operator(Bin::Lt), Build::Operator),
    row("le",           F::Arith,  (2, 2),  "other",                 NONE,                    Method,                  &[Value, Value],                   Rule::Operator(Bin::Le), Build::Operator),
    row("gt",           F::Arith,  (2, 2),  "other",                 NONE,                    Method,                  &[Value, Value],                   Rule::Operator(Bin::Gt), Build::Operator),
    row("ge",           F::Arith,  (2, 2),  "other",                 NONE,                    Method,                  &[Value, Value],                   Rule::Operator(Bin::Ge), Build::Operator),
    row("eq",           F::Arith,  (2, 2),  "other",                 NONE,                    Method,                  &[Value, Value],                   Rule::Operator(Bin::Eq), Build::Operator),
    row("ne",           F::Arith,  (2, 2),  "other",                 NONE,                    Method,                  &[Value, Value],                   Rule::Operator(Bin::Ne), Build::Operator),
    row("col",          F::Shape,  (1, 1),  "x",                     NONE,                    Method,                  &[Value],                          Rule::Shape(RankRule::Requires { rank: 1, does: "turns a 1-D block into a column [N, 1]", gives: Some(2) }), call("expand_dims", &[A(0), Src::I64(-1)])),
    row("row",          F::Shape,  (1, 1),  "x",                     NONE,                    Method,                  &[Value],                          Rule::Shape(RankRule::Requires { rank: 1, does: "turns a 1-D block into a row [1, N]", gives: Some(2) }), call("expand_dims", &[A(0), Src::I64(0)])),
    row("expand_dims",  F::Shape,  (2, 2),  "x, axis",               NONE,                    Function,                &[Value, Const("axis")],           Rule::Shape(RankRule::NewAxis), call("expand_dims", &[A(0), A(1)])),
    row("broadcast_to", F::Shape,  (2, 2),  "x, [..]",               NONE,                    Function,                &[Value, Shape],                   Rule::Shape(RankRule::ToShape), call("broadcast_to", &[A(0), A(1)])),
    row("reshape",      F::Shape,  (2, 2),  "x, [..]",               NONE,                    Function,                &[Value, Shape],                   Rule::Shape(RankRule::ToShape), call("reshape", &[A(0), A(1)])),
    row("trans",        F::Shape,  (1, 1),  "x",                     NONE,                    Function,                &[Value],                          Rule::Shape(RankRule::Requires { rank: 2, does: "swaps the dimensions of a 2-D block", gives: None }), call("trans", &[A(0)])),
    row("permute",      F::Shape,  (2, 2),  "x, [..]",               NONE,                    Function,                &[Value, Shape],                   Rule::Shape(RankRule::Permutation), call("permute", &[A(0), A(1)])),
    row("sum",          F::Reduce, (1, 2),  "x, axis",               NONE,                    Method,                  &[Value, Const("axis")],           Rule::Reduce { acc: Acc::Sum, scan: false }, call("reduce", &[Src::Op("ReduceOp::Sum"), A(0), Opt(1)])),
    row("max",          F::Reduce, (1, 2),  "x, axis",               NONE,                    Method,                  &[Value, Const("axis")],           Rule::Reduce { acc: Acc::Same, scan: false }, call("reduce", &[Src::Op("ReduceOp::Max"), A(0), Opt(1)])),
    row("min",          F::Reduce, (1, 2),  "x, axis",               NONE,                    Method,                  &[Value, Const("axis")],           Rule::Reduce { acc: Acc::Same, scan: false }, call("reduce", &[Src::Op("ReduceOp::Min"), A(0), Opt(1)])),
    row("argmax",       F::Reduce, (1, 2),  "x, axis",               NONE,                    Method,                  &[Value, Const("axis")],           Rule::Reduce { acc: Acc::Index, scan: false }, call("reduce", &[Src::Op("ReduceOp::ArgMax"), A(0), Opt(1)])),
    row("argmin",       F::Reduce, (1, 2),  "x, axis",               NONE,                    Method,                  &[Value, Const("axis")],           Rule::Reduce { acc: Acc::Index, scan: false }, call("reduce", &[Src::Op("ReduceOp::ArgMin"), A(0), Opt(1)])),
    row("dot",          F::Dot,    (2, 4),  r#"a, b, acc, "precision""#, NONE,              Function,                &[Value, Value, Value, Str],       Rule::Dot, call("dot_call", &[A(0), A(1), Opt(2), Opt(3)])),
    row("cumsum",       F::Reduce, (1, 2),  "x, axis",               NONE,                    Method,                  &[Value, Const("axis")],           Rule::Reduce { acc: Acc::Sum, scan: true }, call("scan", &[Src::Op("ScanOp::Sum"), A(0), Or(1, 0)])),
    row("atomic_add",   F::Memory, (2, 4),  r#"ptr, value, mask, "sem""#, NONE,             Function,                &[Ptr, Value, Mask, Str],          Rule::Atomic, call("atomic", &[Src::Op("AtomicOp::Add"), A(0), A(1), Src::None, Opt(2), Opt(3)])),
    row("atomic_max",   F::Memory, (2, 4),  r#"ptr, value, mask, "sem""#, NONE,             Function,                &[Ptr, Value, Mask, Str],          Rule::Atomic, call("atomic", &[Src::Op("AtomicOp::Max"), A(0), A(1), Src::None, Opt(2), Opt(3)])),
    row("atomic_min",   F::Memory, (2, 4),  r#"ptr, value, mask, "sem""#, NONE,             Function,                &[Ptr, Value, Mask, Str],          Rule::Atomic, call("atomic", &[Src::Op("AtomicOp::Min"), A(0), A(1), Src::None, Opt(2), Opt(3)])),
    row("atomic_xchg",  F::Memory, (2, 4),  r#"ptr, value, mask, "sem""#, NONE,             Function,                &[Ptr, Value, Mask, Str],          Rule::Atomic, call("atomic", &[Src::Op("AtomicOp::Xchg"), A(0), A(1), Src::None, Opt(2), Opt(3)])),
    row("atomic_cas",   F::Memory, (3, 3),  "ptr, cmp, value",       NONE,                    Function,                &[Ptr, Value, Value],              Rule::Atomic, call("atomic", &[Src::Op("AtomicOp::Cas"), A(0), A(2), Opt(1), Src::None, Src::None])),
    row("device_assert", F::Debug,  (2, 2),  r#"cond, "message""#,    NONE,                    Function,                &[Cond, Str],                      Rule::Debug, call("assert", &[A(0), A(1)])),
    row("device_print", F::Debug,  (1, 16), r#""prefix", values.."#, NONE,                    Function,                &[Str, Values],                    Rule::Debug, call("print", &[A(0), Rest(1)])),
];

/// The builtin called `name`, as a function or as a method.
pub fn lookup(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name || matches!(b.form, Form::MethodNamed(m) if m == name))
}

/// The binary operators of the DSL (Rust's, on blocks). Each variant is named as the
/// runtime's `BinOp` or `CmpOp` variant it builds (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    And,
    Or,
    Xor,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

/// What an operator does, for typing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OpClass {
    /// `+ - * / %`: numbers.
    Arith,
    /// `& | ^`: integers or masks.
    Bitwise,
    /// `< <= > >= == !=`: gives masks.
    Compare,
}

/// The operators: each with its Rust symbol and class, once.
pub const OPERATORS: &[(Bin, &str, OpClass)] = &[
    (Bin::Add, "+", OpClass::Arith),
    (Bin::Sub, "-", OpClass::Arith),
    (Bin::Mul, "*", OpClass::Arith),
    (Bin::Div, "/", OpClass::Arith),
    (Bin::Rem, "%", OpClass::Arith),
    (Bin::And, "&", OpClass::Bitwise),
    (Bin::Or, "|", OpClass::Bitwise),
    (Bin::Xor, "^", OpClass::Bitwise),
    (Bin::Lt, "<", OpClass::Compare),
    (Bin::Le, "<=", OpClass::Compare),
    (Bin::Gt, ">", OpClass::Compare),
    (Bin::Ge, ">=", OpClass::Compare),
    (Bin::Eq, "==", OpClass::Compare),
    (Bin::Ne, "!=", OpClass::Compare),
];

impl Bin {
    fn row(self) -> (&'static str, OpClass) {
        let (_, symbol, class) = OPERATORS.iter().find(|o| o.0 == self).expect("every operator is in OPERATORS");
        (symbol, *class)
    }
    /// The Rust symbol, as messages quote it.
    pub fn symbol(self) -> &'static str {
        self.row().0
    }
    pub fn is_cmp(self) -> bool {
        self.row().1 == OpClass::Compare
    }
    pub fn is_bitwise(self) -> bool {
        self.row().1 == OpClass::Bitwise
    }
    /// The runtime op it builds, under `dsl_runtime::ir` (`BinOp::Add`, `CmpOp::Lt`), and
    /// the builder method that takes it.
    pub fn ir_path(self) -> (String, &'static str) {
        if self.is_cmp() {
            (format!("CmpOp::{self:?}"), "cmp")
        } else {
            (format!("BinOp::{self:?}"), "binary")
        }
    }
}

/// The error for a call that is neither one of the DSL's functions nor a `#[kernel_fn]`: a
/// method that is not a builtin (a typo of one, or a Rust method), or a call of something
/// other than a function by name (a closure, `<T as Trait>::f`). A call `f(x)` of a name
/// that is not a builtin is a helper's, which rustc resolves.
pub fn not_a_builtin(name: &str, method: bool) -> String {
    let what = if method { "method" } else { "function" };
    let close = BUILTINS.iter().map(|b| (edit_distance(name, b.name), b.name)).min();
    if let Some((d, b)) = close {
        if d > 0 && d <= if name.len() <= 4 { 1 } else { 2 } {
            return format!("unknown {what} `{name}` in a kernel: did you mean `{b}`? (the DSL's functions are listed in `dsl_runtime::dsl`)");
        }
    }
    let rust = if method { format!("Rust methods (a `#[kernel_fn]` is called as a function, `{name}(x, ..)`)") } else { "closures or Rust functions".to_string() };
    format!(
        "`{name}` is not a DSL {what}: a kernel calls the DSL's functions and `#[kernel_fn]` helpers, not {rust}; the DSL's functions are {} (see `dsl_runtime::dsl`)",
        builtin_list()
    )
}

/// The DSL's functions, grouped as in its documentation: one by one in table order, then
/// the comparisons, the shape functions, the reductions and scans, the atomics, and the
/// debug functions.
pub fn builtin_list() -> String {
    let names = |keep: &dyn Fn(&Builtin) -> bool| BUILTINS.iter().filter(|b| keep(b)).map(|b| b.name).collect::<Vec<_>>();
    let compares = |b: &Builtin| matches!(b.rule, Rule::Operator(op) if op.is_cmp());
    let grouped = |b: &Builtin| compares(b) || matches!(b.rule, Rule::Shape(_) | Rule::Reduce { .. } | Rule::Atomic) || b.family == Family::Debug;
    let mut parts: Vec<String> = names(&|b| !grouped(b)).into_iter().map(String::from).collect();
    parts.push(format!("the comparisons {}", names(&compares).join("/")));
    parts.push(format!("the shape functions {}", names(&|b| matches!(b.rule, Rule::Shape(_))).join("/")));
    parts.push(format!(
        "the reductions {} and {}",
        names(&|b| matches!(b.rule, Rule::Reduce { scan: false, .. })).join("/"),
        names(&|b| matches!(b.rule, Rule::Reduce { scan: true, .. })).join("/")
    ));
    parts.push(format!("the atomics {}", names(&|b| b.rule == Rule::Atomic).join("/")));
    parts.extend(names(&|b| b.family == Family::Debug).into_iter().map(String::from));
    let last = parts.pop().unwrap_or_default();
    format!("{} and {last}", parts.join(", "))
}

/// Edit distance with adjacent transpositions (`laod` is one edit from `load`).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::TokenStream;
    use std::collections::BTreeSet;

    /// A kernel around `stmt`, with a pointer `p`, offsets `offs`, a mask `m`, a 1-D block
    /// `x` and a 2-D block `t` in scope; its expansion as text.
    fn expand(stmt: &str) -> String {
        let src = format!(
            "fn k<const B: usize>(p: Ptr<f32>, n: i32) {{
                let offs = arange::<B>();
                let m = offs < n;
                let x = load(p + offs, m, 0.0);
                let t = zeros::<f32>([B, B]);
                {stmt}
            }}"
        );
        let item: TokenStream = src.parse().expect("a kernel");
        let out = crate::expand::kernel(TokenStream::new(), item).to_string();
        syn::parse_file(&out).unwrap_or_else(|e| panic!("`{stmt}` expands to code that does not parse ({e}): {out}"));
        out
    }

    /// The messages of the `compile_error!`s in an expansion.
    fn errors(out: &str) -> Vec<String> {
        let file = syn::parse_file(out).expect("an expansion");
        file.items
            .iter()
            .filter_map(|i| match i {
                syn::Item::Macro(m) if m.mac.path.segments.last().is_some_and(|s| s.ident == "compile_error") => Some(m.mac.parse_body::<syn::LitStr>().expect("a message").value()),
                _ => None,
            })
            .collect()
    }

    /// Well-typed calls of `b`, in each spelling its form has: argument by argument, from
    /// the row's `args`, `generics` and `rule`.
    fn calls(b: &Builtin) -> Vec<String> {
        let value = match b.rule {
            Rule::Fill => "1.0",
            Rule::Shape(RankRule::Requires { rank: 2, .. }) | Rule::Dot => "t",
            _ => "x",
        };
        let args: Vec<&str> = match b.generics {
            Generics::Length => vec![],
            _ => b
                .args
                .iter()
                .map(|a| match a {
                    Arg::Ptr => "p + offs",
                    Arg::Mask | Arg::Cond => "m",
                    Arg::Value | Arg::Values => value,
                    Arg::Const(_) => "0",
                    Arg::Shape => "[B]",
                    Arg::Str if b.rule == Rule::Dot => "\"ieee\"",
                    Arg::Str if b.rule == Rule::Atomic => "\"relaxed\"",
                    Arg::Str => "\"s\"",
                })
                .collect(),
        };
        let generics = match b.generics {
            Generics::None => "",
            Generics::Length => "::<B>",
            Generics::Dtype | Generics::OptionalDtype => "::<bf16>",
        };
        let function = format!("{}{generics}({})", b.name, args.join(", "));
        let method = |name: &str| format!("({}).{name}{generics}({})", args[0], args[1..].join(", "));
        match b.form {
            Form::Function => vec![function],
            Form::Method => vec![method(b.name)],
            Form::Both => vec![function, method(b.name)],
            Form::MethodNamed(m) => vec![function, method(m)],
        }
    }

    #[test]
    fn every_builtin_validates_and_expands() {
        for b in BUILTINS {
            for call in calls(b) {
                let stmt = if b.rule.gives_unit() || b.rule == Rule::Atomic { format!("{call};") } else { format!("let r = {call};") };
                let out = expand(&stmt);
                assert_eq!(errors(&out), Vec::<String>::new(), "`{stmt}` does not validate");
                let built = match b.build {
                    Build::Call { method, .. } => method,
                    Build::Operator => match b.rule {
                        Rule::Operator(op) => op.ir_path().1,
                        _ => panic!("`{}`: `Build::Operator` goes with `Rule::Operator`", b.name),
                    },
                };
                // The kernel's own `load`, `arange` and `full` come before the call's.
                let before = expand("").matches(&format!("__b . {built} (")).count();
                let after = out.matches(&format!("__b . {built} (")).count();
                assert_eq!(after, before + 1, "`{stmt}` does not build `{built}`: {out}");
            }
        }
    }

    #[test]
    fn arity_errors_come_from_the_table() {
        for b in BUILTINS {
            let args = vec!["x"; b.arity.1 + 1].join(", ");
            let out = expand(&format!("{}({args});", b.name));
            let expected = match b.generics {
                Generics::Length => format!("`{0}` is `{0}::<N>()` or `{0}({1})`", b.name, b.params),
                _ => format!("`{}` takes {}", b.name, if b.arity.0 == b.arity.1 { b.arity.0.to_string() } else { format!("{} to {}", b.arity.0, b.arity.1) }),
            };
            assert!(errors(&out).iter().any(|e| e.contains(&expected) && e.contains(b.params)), "`{}` with too many arguments: {:?}", b.name, errors(&out));
        }
    }

    #[test]
    fn unknown_names_read_the_table() {
        let list = builtin_list();
        for b in BUILTINS {
            assert!(list.split([' ', ',', '/']).any(|w| w == b.name), "`{}` is missing from the list of builtins: {list}", b.name);
            let typo = format!("{}x", b.name);
            let msg = not_a_builtin(&typo, false);
            assert!(msg.contains(&format!("did you mean `{}`?", b.name)), "`{typo}`: {msg}");
        }
        assert!(not_a_builtin("softplus", false).contains(&list));
        // A method spelling is not a name of its own.
        assert!(!list.split([' ', ',', '/']).any(|w| w == "to"));
        assert_eq!(lookup("to").map(|b| b.name), Some("cast"));
    }

    /// Function names shown in `dsl_runtime::dsl`'s table that are syntax, not builtins:
    /// `for i in (a..b).step_by(s)` (parse.rs).
    const SYNTAX: &[&str] = &["step_by"];

    /// The functions and methods called in the "here" column of `dsl_runtime::dsl`'s table:
    /// the names in code spans followed by `(` or `::<`.
    fn documented_names(src: &str) -> BTreeSet<String> {
        let rows = src.lines().skip_while(|l| !l.starts_with("//! | Triton | here |")).skip(2).take_while(|l| l.starts_with("//! |"));
        let mut names = BTreeSet::new();
        for row in rows {
            let here = row.split('|').nth(2).unwrap_or_default();
            for code in here.split('`').skip(1).step_by(2) {
                let mut rest = code;
                while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
                    let word = &rest[start..];
                    let end = word.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(word.len());
                    let (name, after) = word.split_at(end);
                    if after.starts_with('(') || after.starts_with("::<") {
                        names.insert(name.to_string());
                    }
                    rest = after;
                }
            }
        }
        names.retain(|n| !SYNTAX.contains(&n.as_str()));
        names
    }

    fn table_names() -> BTreeSet<String> {
        let methods = BUILTINS.iter().filter_map(|b| match b.form {
            Form::MethodNamed(m) => Some(m),
            _ => None,
        });
        BUILTINS.iter().map(|b| b.name).chain(methods).map(String::from).collect()
    }

    #[test]
    fn table_matches_the_documented_names() {
        let documented = documented_names(include_str!("../../dsl-runtime/src/dsl.rs"));
        assert!(documented.contains("load") && documented.contains("to"), "the table of dsl.rs was not found: {documented:?}");
        let table = table_names();
        let undocumented: Vec<_> = table.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&table).collect();
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "builtins missing from the table of dsl-runtime/src/dsl.rs: {undocumented:?}; names there that are not builtins: {unknown:?} (syntax goes in SYNTAX)"
        );
    }

    #[test]
    fn table_mirrors_the_runtime() {
        let files = [
            (Family::Arith, include_str!("../../dsl-runtime/src/ir/arith.rs")),
            (Family::Shape, include_str!("../../dsl-runtime/src/ir/shape.rs")),
            (Family::Reduce, include_str!("../../dsl-runtime/src/ir/reduce.rs")),
            (Family::Memory, include_str!("../../dsl-runtime/src/ir/memory.rs")),
            (Family::Dot, include_str!("../../dsl-runtime/src/ir/dot.rs")),
            (Family::Debug, include_str!("../../dsl-runtime/src/ir/debug.rs")),
        ];
        let builder = include_str!("../../dsl-runtime/src/ir/builder.rs");
        let file = |f: Family| files.iter().find(|(g, _)| *g == f).map(|(_, s)| *s).unwrap_or_default();
        let name = |f: Family| format!("ir/{}.rs", format!("{f:?}").to_lowercase());
        // `Enum::Variant` is a variant of `pub enum Enum` in `src`.
        let has_variant = |src: &str, path: &str| {
            let (ty, variant) = path.split_once("::").expect("Enum::Variant");
            let body = src.split(&format!("pub enum {ty} {{")).nth(1).and_then(|s| s.split('}').next()).unwrap_or_default();
            body.lines().any(|l| l.trim().trim_end_matches(',') == variant)
        };
        let has_method = |f: Family, m: &str| [builder, file(f)].iter().any(|s| s.contains(&format!("pub fn {m}(")));
        for b in BUILTINS {
            let (method, ops) = match (b.build, b.rule) {
                (Build::Call { method, args }, _) => (method, args.iter().filter_map(|s| if let Src::Op(p) = s { Some(p.to_string()) } else { None }).collect()),
                (Build::Operator, Rule::Operator(op)) => (op.ir_path().1, vec![op.ir_path().0]),
                _ => panic!("`{}`: `Build::Operator` goes with `Rule::Operator`", b.name),
            };
            assert!(has_method(b.family, method), "`{}` builds `Builder::{method}`, which is not in ir/builder.rs or {}", b.name, name(b.family));
            for op in ops {
                assert!(has_variant(file(b.family), &op), "`{}` builds `{op}`, which the runtime's {} does not have", b.name, name(b.family));
            }
        }
        for (op, ..) in OPERATORS {
            assert!(has_variant(file(Family::Arith), &op.ir_path().0), "`{}` builds `{}`, which ir/arith.rs does not have", op.symbol(), op.ir_path().0);
        }
    }
}
