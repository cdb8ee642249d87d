//! The textual form of the IR, used for dumps (`RUTILE_DUMP`), snapshot tests and, without
//! source locations, as the part of the disk-cache key that describes the kernel.
//!
//! ```text
//! kernel @relu_mul_add(%a: ptr<f32> {div16}, %n: i32) [BLOCK = 1024]
//!   %0 = param 0 : ptr<f32>
//!   %5 = program_id 0 : i32                           @3:16
//!   %7 = arange 0..1024 : i32[1024]                   @3:40
//! ```

use super::{Function, HostInt, Op, ParamKind, Type, Value};
use std::fmt::{self, Write};

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unit {
            return f.write_str("()");
        }
        if self.shared {
            return write!(f, "smem<{}{:?}>", self.dtype, self.shape);
        }
        if self.ptr {
            write!(f, "ptr<{}>", self.dtype)?;
        } else {
            write!(f, "{}", self.dtype)?;
        }
        if !self.shape.is_empty() {
            write!(f, "{:?}", self.shape)?;
        }
        Ok(())
    }
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print(self, true))
    }
}

/// Print `f`, with or without source locations.
pub fn print(f: &Function, with_locs: bool) -> String {
    print_annotated(f, with_locs, &|_| None)
}

/// Print `f` with a note after the type of each value that `note` gives one for (the
/// compiler's layouts, in the `opt.ir` dump).
pub fn print_annotated(f: &Function, with_locs: bool, note: &dyn Fn(Value) -> Option<String>) -> String {
    let mut s = String::new();
    let params: Vec<String> = f
        .params
        .iter()
        .map(|p| {
            let ty = match p.kind {
                ParamKind::Ptr { elem, writable } => format!("ptr<{elem}>{}", if writable { " mut" } else { "" }),
                ParamKind::Scalar(d) => d.to_string(),
                ParamKind::Len { of } => format!("len(%{})", f.params[of as usize].name),
                ParamKind::Bytes { size, align } => format!("bytes[{size}] align {align}"),
            };
            let mut attrs = vec![];
            if p.spec.div16 {
                attrs.push(if matches!(p.kind, ParamKind::Ptr { .. }) { "align16" } else { "div16" });
            }
            if p.spec.eq_one {
                attrs.push("eq1");
            }
            let attrs = if attrs.is_empty() { String::new() } else { format!(" {{{}}}", attrs.join(", ")) };
            format!("%{}: {ty}{attrs}", p.name)
        })
        .collect();
    let _ = write!(s, "kernel @{}({})", f.name, params.join(", "));
    if !f.constants.is_empty() {
        let cs: Vec<String> = f.constants.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        let _ = write!(s, " [{}]", cs.join(", "));
    }
    s.push('\n');
    block(f, &f.body, 1, with_locs, note, &mut s);
    s
}

/// A TMA tile's tensor: `{ptr %argP, dims [N, M], strides [S, batch..], inner I}`.
fn tile_text(tile: &super::TmaTile) -> String {
    let host = |h: HostInt| match h {
        HostInt::Param(i) => format!("%arg{i}"),
        HostInt::Const(c) => c.to_string(),
    };
    let batch: String = tile.batch_strides().map(|b| format!(", {}", host(b))).collect();
    format!("{{ptr %arg{}, dims [{}, {}], strides [{}{batch}], inner {}}}", tile.ptr, host(tile.dims[0]), host(tile.dims[1]), host(tile.stride), tile.inner)
}

fn list(vs: &[Value]) -> String {
    vs.iter().map(|v| format!("%{}", v.0)).collect::<Vec<_>>().join(", ")
}

fn block(f: &Function, b: &super::Block, depth: usize, with_locs: bool, note: &dyn Fn(Value) -> Option<String>, s: &mut String) {
    let pad = "  ".repeat(depth);
    for &v in &b.insts {
        let inst = f.inst(v);
        let opt = |o: Option<Value>, name: &str| o.map(|x| format!(", {name} %{}", x.0)).unwrap_or_default();
        let body = match &inst.op {
            Op::Param(i) => format!("param {i}"),
            Op::Const(c) => format!("const {c}"),
            Op::ProgramId(a) => format!("program_id {a}"),
            Op::NumPrograms(a) => format!("num_programs {a}"),
            Op::Arange { start, end } => format!("arange {start}..{end}"),
            Op::Splat(x) => format!("splat %{}", x.0),
            Op::Binary(op, a, b) => format!("{} %{}, %{}", op.name(), a.0, b.0),
            Op::Cmp(op, a, b) => format!("cmp {} %{}, %{}", op.name(), a.0, b.0),
            Op::Unary(op, a) => format!("{} %{}", op.name(), a.0),
            Op::Select(c, a, b) => format!("select %{}, %{}, %{}", c.0, a.0, b.0),
            Op::Fma(a, b, c) => format!("fma %{}, %{}, %{}", a.0, b.0, c.0),
            Op::Cast(a) => format!("cast %{}", a.0),
            Op::ExpandDims(a, axis) => format!("expand_dims %{}, {axis}", a.0),
            Op::Broadcast(a) => format!("broadcast %{}", a.0),
            Op::Permute(a, p) => format!("permute %{}, {p:?}", a.0),
            Op::Reshape(a) => format!("reshape %{}", a.0),
            Op::Reduce { op, x, axis } => format!("reduce {} %{}, axis {axis}", op.name(), x.0),
            Op::Scan { op, x, axis } => format!("scan {} %{}, axis {axis}", op.name(), x.0),
            Op::AddPtr(p, o) => format!("add_ptr %{}, %{}", p.0, o.0),
            Op::PtrOffset(p) => format!("ptr_offset %{}", p.0),
            Op::ConvertLayout(x) => format!("convert_layout %{}", x.0),
            Op::Dot { a, b, acc, precision } => format!("dot %{}, %{}, acc %{}, {}", a.0, b.0, acc.0, precision.name()),
            Op::LocalAlloc(init) => format!("local_alloc{}", init.map(|i| format!(" %{}", i.0)).unwrap_or_default()),
            Op::LocalStore { buf, value } => format!("local_store %{}, %{}", buf.0, value.0),
            Op::LocalLoad(buf) => format!("local_load %{}", buf.0),
            Op::LocalSlot { buf, slot } => format!("local_slot %{}, %{}", buf.0, slot.0),
            Op::LocalTrans(buf) => format!("local_trans %{}", buf.0),
            Op::AsyncCopy { dst, ptr, mask } => format!("async_copy %{}, %{}{}", dst.0, ptr.0, opt(*mask, "mask")),
            Op::AsyncCommit => "async_commit".to_string(),
            Op::AsyncWait(n) => format!("async_wait {n}"),
            Op::TmaCopy { dst, map, coords, bars, slot, on, tile } => {
                format!("tma_copy %{}, %{}[{}], bar %{}[%{}], on %{} {}", dst.0, map.0, list(coords), bars.0, slot.0, on.0, tile_text(tile))
            }
            Op::TmaStore { src, map, coords, tile, add } => format!("{} %{}, %{}[{}] {}", if *add { "tma_reduce_add" } else { "tma_store" }, src.0, map.0, list(coords), tile_text(tile)),
            Op::MbarInit { bars, count } => format!("mbar_init %{}, {count}", bars.0),
            Op::MbarWait { bars, slot, phase, sync } => format!("mbar_wait %{}[%{}], phase %{}{}", bars.0, slot.0, phase.0, if *sync { ", sync" } else { "" }),
            Op::Load { ptr, mask, other } => format!("load %{}{}{}", ptr.0, opt(*mask, "mask"), opt(*other, "other")),
            Op::Store { ptr, value, mask } => format!("store %{}, %{}{}", ptr.0, value.0, opt(*mask, "mask")),
            Op::Atomic { op, ptr, value, cmp, mask, relaxed } => format!("{}{} %{}, %{}{}{}", op.name(), if *relaxed { " relaxed" } else { "" }, ptr.0, value.0, opt(*cmp, "cmp"), opt(*mask, "mask")),
            Op::For { start, end, step, init, body } => format!(
                "for ({}) = %{}..%{} step %{} init ({}) {{",
                list(&body.args),
                start.0,
                end.0,
                step.0,
                list(init)
            ),
            Op::If { cond, .. } => format!("if %{} {{", cond.0),
            Op::MbarArrive { bars, slot, on } => format!("mbar_arrive %{}[%{}], on %{}", bars.0, slot.0, on.0),
            Op::WarpSpecialize { .. } => "warp_specialize producer {".into(),
            Op::Turn { begin } => (if *begin { "turn_begin" } else { "turn_end" }).into(),
            Op::Result(of, i) => format!("result %{}#{i}", of.0),
            Op::Arg(of, i) => format!("arg %{}#{i}", of.0),
            Op::Return => "return".into(),
            Op::Assert { cond, msg } => format!("assert %{}, {msg:?}", cond.0),
            Op::Print { prefix, args } => format!("print {prefix:?}, {}", list(args)),
            Op::BoundsCheck { access, param, offset, len, mask } => {
                format!("bounds_check {} %{}, %{} < %{}{}", access.name(), f.params[*param as usize].name, offset.0, len.0, opt(*mask, "mask"))
            }
        };
        let noted = note(v).map(|n| format!(" {n}")).unwrap_or_default();
        let line = if inst.ty.unit { format!("{pad}{body}") } else { format!("{pad}%{} = {body} : {}{noted}", v.0, inst.ty) };
        if with_locs && inst.loc.line > 0 {
            let _ = writeln!(s, "{line:<52} @{}:{}", inst.loc.line, inst.loc.col);
        } else {
            let _ = writeln!(s, "{line}");
        }
        let regions = inst.op.regions();
        for (k, r) in regions.iter().enumerate() {
            if k == 1 {
                let other = if matches!(inst.op, Op::WarpSpecialize { .. }) { "consumer" } else { "else" };
                let _ = writeln!(s, "{pad}}} {other} {{");
            }
            block(f, &r.body, depth + 1, with_locs, note, s);
            let _ = writeln!(s, "{pad}  yield ({})", list(&r.yields));
        }
        if !regions.is_empty() {
            let _ = writeln!(s, "{pad}}}");
        }
    }
}
