//! Lowering of the dot family: `mma.sync.aligned.m16n8k16` for bf16 and f16 inputs, and
//! `m16n8k8` on tf32 for f32 inputs at "tf32" precision (each operand's f32 register as
//! it is: the tensor cores ignore its low 13 bits, which is the interpreter's truncation);
//! sm_80 and later, the H100 included.
//!
//! The layout pass puts `a`, `b` and the accumulator in the instruction's fragments
//! ([`dot_layouts`](crate::passes::layout::dot_layouts), [`LinearLayout::mma_v2_operand`],
//! [`LinearLayout::mma_v2_accumulator`]), converting them there through shared memory
//! where they come from elsewhere (`convert_layout`). Then each thread's registers already
//! are its fragments: which register holds which fragment element of which 16 x 16 (`a`),
//! 16 x 8 (`b`) or 16 x 8 (accumulator) tile is read off the layouts at lane 0 of warp 0
//! (the lane and warp bits only shift every element together), and one instruction per
//! (accumulator tile, K step) multiplies them, accumulating in place.
//!
//! Operands read from swizzled shared memory (the usual case: [`passes::stage`](crate::passes::stage)
//! puts 16-bit operands there) are loaded with `ldmatrix` one K step at a time, next to the
//! `mma`s of that step ([`memory::Operand`]), so that one step's fragments are live at once.
//!
//! f32 operands are staged too: `a` (K contiguous) is read with `ldmatrix` as 32-bit
//! words, `b` (N contiguous; `ldmatrix.trans` moves 16-bit halves) with 32-bit loads from
//! a buffer swizzled for them, one K step at a time like the 16-bit ones.
//!
//! On sm_90a, dots whose operands both come from shared-memory buffers take `wgmma`
//! instead ([`wgmma`](super::wgmma), chosen by
//! [`dot_plan`](crate::passes::layout::dot_plan)), tf32 ones too where `a` is
//! K-contiguous.
//!
//! Not yet (issue 12): f32 at "tf32x3" or "ieee" (a build error names the line); 8-bit
//! inputs.

use super::{lower_error, memory, Cx, LResult, Regs};
use crate::ir::{Op, Value};
use crate::layout::LinearLayout;
use crate::DType;
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum};
use std::collections::BTreeMap;

/// Per tile (keyed by its first row and column at lane 0 of warp 0), the register holding
/// each of its `n` fragment elements: `slot(row, col)` gives the element's index within
/// the tile, `None` where `(row, col)` holds no element at lane 0 (the layout is not the
/// instruction's fragment: an error). Shared by `mma.sync` and `wgmma` (`d` fragments).
pub(super) fn tiles(l: &LinearLayout, rows: u32, cols: u32, slot: impl Fn(u32, u32) -> Option<usize>, n: usize) -> LResult<BTreeMap<(u32, u32), Vec<usize>>> {
    let mut out: BTreeMap<(u32, u32), Vec<Option<usize>>> = BTreeMap::new();
    for r in 0..l.num_regs() {
        let c = l.apply(r as u32, 0, 0);
        let (row, col) = (c[0], c[1]);
        let key = (row / rows * rows, col / cols * cols);
        let e = out.entry(key).or_insert_with(|| vec![None; n]);
        let at = slot(row % rows, col % cols).and_then(|i| e.get_mut(i)).ok_or_else(|| lower_error(format!("internal: register {r} of {l} is not a fragment element")))?;
        *at = Some(r);
    }
    out.into_iter()
        .map(|(k, v)| Ok((k, v.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| lower_error(format!("internal: an incomplete mma fragment at tile {k:?}")))?)))
        .collect()
}

/// Where fragment elements sit in their tiles, per instruction (PTX ISA, "Matrix
/// Fragments for mma.m16n8k16" and "for mma.m16n8k8"; lane 0: `g = t = 0`).
struct Shape {
    /// K per instruction, and elements per 32-bit register.
    k: u32,
    per_word: usize,
    /// A's tile (rows, K) and the slot of each of its elements; B's tile (K, columns).
    a: (u32, u32, fn(u32, u32) -> usize),
    b: (u32, u32, fn(u32, u32) -> usize),
}

/// bf16/f16, m16n8k16: a0..a7 = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1), (g, 2t+8), ..;
/// b0..b3 = (k, n) = (2t, g), (2t+1, g), (2t+8, g), (2t+9, g).
const M16N8K16: Shape = Shape {
    k: 16,
    per_word: 2,
    a: (16, 16, |r, c| (c & 1) as usize + 2 * (r >> 3) as usize + 4 * (c >> 3) as usize),
    b: (16, 8, |k, _| (k & 1) as usize + 2 * (k >> 3) as usize),
};

/// tf32, m16n8k8: a0..a3 = (g, t), (g+8, t), (g, t+4), (g+8, t+4); b0, b1 = (t, g), (t+4, g).
const M16N8K8: Shape = Shape { k: 8, per_word: 1, a: (16, 8, |r, c| (r >> 3) as usize + 2 * (c >> 2) as usize), b: (8, 8, |k, _| (k >> 2) as usize) };

/// c0..c3: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1), for both.
fn c_slot(r: u32, c: u32) -> usize {
    (c & 1) as usize + 2 * (r >> 3) as usize
}

/// One 32-bit register of a tensor-core operand of `d` elements: two 16-bit elements, the
/// first in the low half, or an f32 as it is (tf32: the tensor cores drop its low 13
/// bits, the interpreter's truncation). Shared by `mma.sync` and `wgmma`'s register form.
pub(super) fn word<'ctx>(cx: &Cx<'_, 'ctx>, d: DType, xs: &[BasicValueEnum<'ctx>]) -> LResult<BasicValueEnum<'ctx>> {
    let i32t = cx.ctx.i32_type();
    if let [x] = xs {
        return Ok(cx.b.build_bit_cast(*x, i32t, "tf32")?);
    }
    let half = if d == DType::BF16 { cx.ctx.bf16_type() } else { cx.ctx.f16_type() };
    let p = cx.b.build_insert_element(half.vec_type(2).get_undef(), xs[0], i32t.const_zero(), "")?;
    let p = cx.b.build_insert_element(p, xs[1], i32t.const_int(1, false), "")?;
    Ok(cx.b.build_bit_cast(p, i32t, "")?)
}

pub fn dot<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<Regs<'ctx>> {
    let f = cx.f;
    let inst = f.inst(v);
    let Op::Dot { a, b, acc, precision } = inst.op else { unreachable!() };
    let d = f.ty(a).dtype;
    let Some(plan) = cx.plan.dots.get(&v) else {
        return Err(lower_error(format!(
            "`dot` of {d} inputs at \"{}\" precision at line {}:{} has no GPU lowering yet (tensor cores take f32 at \"tf32\", the default; issue 12); the CPU interpreter runs it",
            precision.name(),
            inst.loc.line,
            inst.loc.col
        )));
    };
    if let Some(n) = plan.wgmma {
        let (layouts, swapped) = (plan.layouts.clone(), plan.swapped);
        return super::wgmma::dot(cx, v, n, &layouts, swapped);
    }
    let [la, lb, lc] = plan.layouts.clone();
    let (mut ra, mut rb, mut rc) = (memory::Operand::new(cx, a, &la)?, memory::Operand::new(cx, b, &lb)?, cx.get(acc, &lc)?);
    let sh = if d == DType::F32 { M16N8K8 } else { M16N8K16 };
    let ta = tiles(&la, sh.a.0, sh.a.1, |r, c| Some((sh.a.2)(r, c)), (sh.a.0 * sh.a.1 / 32) as usize)?;
    let tb = tiles(&lb, sh.b.0, sh.b.1, |r, c| Some((sh.b.2)(r, c)), (sh.b.0 * sh.b.1 / 32) as usize)?;
    let tc = tiles(&lc, 16, 8, |r, c| Some(c_slot(r, c)), 4)?;
    let k = f.ty(a).padded_shape()[1] as u32;
    let (i32t, f32t) = (cx.ctx.i32_type(), cx.ctx.f32_type());

    let text = match d {
        DType::F32 => "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32".to_string(),
        _ => {
            let ty = if d == DType::BF16 { "bf16" } else { "f16" };
            format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32")
        }
    };
    let ret = cx.ctx.struct_type(&[f32t.into(); 4], false);
    let params: Vec<BasicMetadataTypeEnum> = [[i32t.into(); 6].as_slice(), [f32t.into(); 4].as_slice()].concat();
    let fty = ret.fn_type(&params, false);
    let text = format!("{text} {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};");
    let asm = cx.ctx.create_inline_asm(fty, text, "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3".into(), false, false, None, false);
    // K steps outermost: an operand read from shared memory on first use ([`memory::Operand`])
    // has only one step's fragments live.
    let mut words = std::collections::HashMap::new();
    for k0 in (0..k).step_by(sh.k as usize) {
        for (&(m0, n0), c) in &tc {
            let fa = ta.get(&(m0, k0)).ok_or_else(|| lower_error(format!("internal: no a fragment for rows {m0}, k {k0}")))?;
            let fb = tb.get(&(k0, n0)).ok_or_else(|| lower_error(format!("internal: no b fragment for k {k0}, columns {n0}")))?;
            let mut args: Vec<BasicMetadataValueEnum> = vec![];
            for w in fa.chunks(sh.per_word).chain(fb.chunks(sh.per_word)) {
                let is_a = args.len() < 4;
                // A register feeds every mma of its K step along the other dimension:
                // its word is made once.
                let key = (is_a, w[0]);
                let x = match words.get(&key) {
                    Some(&x) => x,
                    None => {
                        let xs = w.iter().map(|&r| if is_a { ra.get(cx, r) } else { rb.get(cx, r) }).collect::<LResult<Vec<_>>>()?;
                        let x = word(cx, d, &xs)?;
                        words.insert(key, x);
                        x
                    }
                };
                args.push(x.into());
            }
            for &r in c {
                args.push(rc[r].into());
            }
            let out = cx.b.build_indirect_call(fty, asm, &args, "mma")?.try_as_basic_value().basic().expect("mma returns four floats").into_struct_value();
            for (i, &r) in c.iter().enumerate() {
                rc[r] = cx.b.build_extract_value(out, i as u32, "")?;
            }
        }
    }
    Ok(rc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tf32 (m16n8k8): the registers read off the layouts are, in every lane, the elements
    /// the PTX ISA's m16n8k8 fragment tables give.
    #[test]
    fn tf32_fragments_match_the_ptx_tables_in_every_lane() {
        for (m, n, k, warps) in [(16, 8, 8, [1, 1]), (64, 64, 32, [2, 2]), (32, 64, 16, [2, 4])] {
            let la = LinearLayout::mma_v2_operand(0, &[m, k], &warps, 32);
            let lb = LinearLayout::mma_v2_operand(1, &[k, n], &warps, 32);
            let ta = tiles(&la, M16N8K8.a.0, M16N8K8.a.1, |r, c| Some((M16N8K8.a.2)(r, c)), 4).unwrap();
            let tb = tiles(&lb, M16N8K8.b.0, M16N8K8.b.1, |r, c| Some((M16N8K8.b.2)(r, c)), 2).unwrap();
            for lane in 0..32u32 {
                let (g, t) = (lane >> 2, lane & 3);
                for (&(m0, k0), regs) in &ta {
                    for (e, &r) in regs.iter().enumerate() {
                        let e = e as u32;
                        assert_eq!(la.apply(r as u32, lane, 0), vec![m0 + g + 8 * (e & 1), k0 + t + 4 * (e >> 1)], "a{e} lane {lane}");
                    }
                }
                for (&(k0, n0), regs) in &tb {
                    for (e, &r) in regs.iter().enumerate() {
                        assert_eq!(lb.apply(r as u32, lane, 0), vec![k0 + t + 4 * e as u32, n0 + g], "b{e} lane {lane}");
                    }
                }
            }
        }
    }

    /// The registers `tiles` picks are, in every lane, the elements the PTX ISA's fragment
    /// tables give for m16n8k16: a wrong slot or tile would multiply the wrong numbers.
    #[test]
    fn fragments_read_off_the_layouts_match_the_ptx_tables_in_every_lane() {
        for (m, n, k, warps) in [(16, 32, 16, 1), (64, 64, 32, 4), (32, 16, 64, 2), (128, 64, 32, 8)] {
            let wm = warps.min(m / 16);
            let wn = (warps / wm).min(n / 8).max(1);
            let w = [wm, wn];
            let la = LinearLayout::mma_v2_operand(0, &[m, k], &w, 16);
            let lb = LinearLayout::mma_v2_operand(1, &[k, n], &w, 16);
            let lc = LinearLayout::mma_v2_accumulator(&[m, n], &w);
            let ta = tiles(&la, 16, 16, |r, c| Some((c & 1) as usize + 2 * (r >> 3) as usize + 4 * (c >> 3) as usize), 8).unwrap();
            let tb = tiles(&lb, 16, 8, |k, _| Some((k & 1) as usize + 2 * (k >> 3) as usize), 4).unwrap();
            let tc = tiles(&lc, 16, 8, |r, c| Some((c & 1) as usize + 2 * (r >> 3) as usize), 4).unwrap();
            for lane in 0..32u32 {
                let (g, t) = (lane >> 2, lane & 3);
                for (&(m0, k0), regs) in &ta {
                    for (e, &r) in regs.iter().enumerate() {
                        let e = e as u32;
                        let want = vec![m0 + g + 8 * ((e >> 1) & 1), k0 + 2 * t + (e & 1) + 8 * (e >> 2)];
                        assert_eq!(la.apply(r as u32, lane, 0), want, "a{e} lane {lane} {m}x{n}x{k}/{warps}");
                    }
                }
                for (&(k0, n0), regs) in &tb {
                    for (e, &r) in regs.iter().enumerate() {
                        let e = e as u32;
                        assert_eq!(lb.apply(r as u32, lane, 0), vec![k0 + 2 * t + (e & 1) + 8 * (e >> 1), n0 + g], "b{e} lane {lane}");
                    }
                }
                for (&(m0, n0), regs) in &tc {
                    for (e, &r) in regs.iter().enumerate() {
                        let e = e as u32;
                        assert_eq!(lc.apply(r as u32, lane, 0), vec![m0 + g + 8 * (e >> 1), n0 + 2 * t + (e & 1)], "c{e} lane {lane}");
                    }
                }
            }
            // Every accumulator tile finds its a and b tiles at every K step.
            for &(m0, n0) in tc.keys() {
                for k0 in (0..k as u32).step_by(16) {
                    assert!(ta.contains_key(&(m0, k0)) && tb.contains_key(&(k0, n0)), "tile ({m0}, {n0}) k {k0} in {m}x{n}x{k}/{warps}");
                }
            }
        }
    }
}
