//! Lowering of the dot family: `mma.sync.aligned.m16n8k16` for bf16 and f16 inputs
//! (sm_80 and later, the H100 included).
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
//! Not yet (issue 12): wgmma on sm_90a, tf32 for f32 inputs (a build error names the line),
//! 8-bit inputs.

use super::{lower_error, memory, Cx, LResult, Regs};
use crate::ir::{Op, Value};
use crate::layout::LinearLayout;
use crate::DType;
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum};
use std::collections::BTreeMap;

/// Per tile (keyed by its first row and column at lane 0 of warp 0), the register holding
/// each fragment element: `slot(row, col)` gives the element's index within the tile.
fn tiles(l: &LinearLayout, rows: u32, cols: u32, slot: impl Fn(u32, u32) -> usize, n: usize) -> LResult<BTreeMap<(u32, u32), Vec<usize>>> {
    let mut out: BTreeMap<(u32, u32), Vec<Option<usize>>> = BTreeMap::new();
    for r in 0..l.num_regs() {
        let c = l.apply(r as u32, 0, 0);
        let (row, col) = (c[0], c[1]);
        let key = (row / rows * rows, col / cols * cols);
        let e = out.entry(key).or_insert_with(|| vec![None; n]);
        e[slot(row % rows, col % cols)] = Some(r);
    }
    out.into_iter()
        .map(|(k, v)| Ok((k, v.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| lower_error(format!("internal: an incomplete mma fragment at tile {k:?}")))?)))
        .collect()
}

pub fn dot<'ctx>(cx: &mut Cx<'_, 'ctx>, v: Value) -> LResult<Regs<'ctx>> {
    let f = cx.f;
    let inst = f.inst(v);
    let Op::Dot { a, b, acc, .. } = inst.op else { unreachable!() };
    let d = f.ty(a).dtype;
    let Some([la, lb, lc]) = crate::passes::layout::dot_layouts(f, v, cx.plan.num_warps) else {
        return Err(lower_error(format!(
            "`dot` of {d} inputs at line {}:{} has no GPU lowering yet (tf32 tensor cores: issue 12); the CPU interpreter runs it",
            inst.loc.line, inst.loc.col
        )));
    };
    let (mut ra, mut rb, mut rc) = (memory::Operand::new(cx, a, &la)?, memory::Operand::new(cx, b, &lb)?, cx.get(acc, &lc)?);
    // a0..a7: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1), (g, 2t+8), .. (lane 0: g = t = 0).
    let ta = tiles(&la, 16, 16, |r, c| (c & 1) as usize + 2 * (r >> 3) as usize + 4 * (c >> 3) as usize, 8)?;
    // b0..b3: (k, n) = (2t, g), (2t+1, g), (2t+8, g), (2t+9, g).
    let tb = tiles(&lb, 16, 8, |k, _| (k & 1) as usize + 2 * (k >> 3) as usize, 4)?;
    // c0..c3: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
    let tc = tiles(&lc, 16, 8, |r, c| (c & 1) as usize + 2 * (r >> 3) as usize, 4)?;
    let k = f.ty(a).padded_shape()[1] as u32;
    let (i32t, f32t) = (cx.ctx.i32_type(), cx.ctx.f32_type());
    let half = match d {
        DType::BF16 => cx.ctx.bf16_type(),
        _ => cx.ctx.f16_type(),
    };
    let pair = half.vec_type(2);
    // Two 16-bit elements in one 32-bit register, the first in the low half.
    let pack = |cx: &Cx<'_, 'ctx>, x: BasicValueEnum<'ctx>, y: BasicValueEnum<'ctx>| -> LResult<BasicValueEnum<'ctx>> {
        let p = pair.get_undef();
        let p = cx.b.build_insert_element(p, x, i32t.const_zero(), "")?;
        let p = cx.b.build_insert_element(p, y, i32t.const_int(1, false), "")?;
        Ok(cx.b.build_bit_cast(p, i32t, "")?)
    };
    let ty = if d == DType::BF16 { "bf16" } else { "f16" };
    let ret = cx.ctx.struct_type(&[f32t.into(); 4], false);
    let params: Vec<BasicMetadataTypeEnum> = [[i32t.into(); 6].as_slice(), [f32t.into(); 4].as_slice()].concat();
    let fty = ret.fn_type(&params, false);
    let text = format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};");
    let asm = cx.ctx.create_inline_asm(fty, text, "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3".into(), false, false, None, false);
    // K steps outermost: an operand read from shared memory on first use ([`memory::Operand`])
    // has only one step's fragments live.
    for k0 in (0..k).step_by(16) {
        for (&(m0, n0), c) in &tc {
            let fa = ta.get(&(m0, k0)).ok_or_else(|| lower_error(format!("internal: no a fragment for rows {m0}, k {k0}")))?;
            let fb = tb.get(&(k0, n0)).ok_or_else(|| lower_error(format!("internal: no b fragment for k {k0}, columns {n0}")))?;
            let mut args: Vec<BasicMetadataValueEnum> = vec![];
            for p in 0..4 {
                let (x, y) = (ra.get(cx, fa[2 * p])?, ra.get(cx, fa[2 * p + 1])?);
                args.push(pack(cx, x, y)?.into());
            }
            for p in 0..2 {
                let (x, y) = (rb.get(cx, fb[2 * p])?, rb.get(cx, fb[2 * p + 1])?);
                args.push(pack(cx, x, y)?.into());
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
            let ta = tiles(&la, 16, 16, |r, c| (c & 1) as usize + 2 * (r >> 3) as usize + 4 * (c >> 3) as usize, 8).unwrap();
            let tb = tiles(&lb, 16, 8, |k, _| (k & 1) as usize + 2 * (k >> 3) as usize, 4).unwrap();
            let tc = tiles(&lc, 16, 8, |r, c| (c & 1) as usize + 2 * (r >> 3) as usize, 4).unwrap();
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
