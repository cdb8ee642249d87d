//! Layout assignment: a [`LinearLayout`] for every block shape of the kernel, and a vector
//! width for every load and store.
//!
//! All blocks of one shape share one blocked layout, so elementwise code never converts
//! between layouts. Its run of contiguous elements per thread is the *narrowest* of the
//! ideal runs of the memory ops of that shape (16 bytes of each op's element type, capped
//! by its proven contiguity), so that every access is contiguous across the lanes of a
//! warp. With mixed element sizes the smaller type then moves fewer than 16 bytes per
//! lane (a bf16 → f32 cast loads 8 bytes and stores 16 bytes per lane) instead of the
//! larger type leaving gaps between lanes, which measured 25% slower for stores on the
//! H100 (BENCHMARKS.md). Each op's actual width is then limited by what the axis analysis
//! proves (alignment, mask constancy): an unaligned buffer only narrows its own accesses.
//! The 32 lanes and `num_warps` warps tile the block; blocks smaller than a CTA replicate
//! (only one copy stores), larger ones repeat in registers.
//!
//! What it cannot do yet: give different layouts to two blocks of one shape and convert
//! between them (through shared memory), or lay out 2-D blocks for transposed access.
//! Those come with reductions and `dot`, as new layouts of the same type.

use super::axis_info::{max_access_width, AxisInfo};
use crate::ir::{memory::memory_ops, Function, Op, Value};
use crate::layout::LinearLayout;
use std::collections::HashMap;

/// What the lowering needs besides the IR.
#[derive(Clone, Debug)]
pub struct Plan {
    pub num_warps: usize,
    /// Layout of each block shape (scalars use [`LinearLayout::scalar`]).
    pub layouts: HashMap<Vec<usize>, LinearLayout>,
    /// Elements per vector instruction, per load/store.
    pub access_width: HashMap<Value, usize>,
    pub axis: Vec<AxisInfo>,
}

impl Plan {
    pub fn layout(&self, shape: &[usize]) -> LinearLayout {
        if shape.is_empty() {
            return LinearLayout::scalar(self.num_warps);
        }
        self.layouts[shape].clone()
    }
}

pub fn assign(f: &Function, axis: &[AxisInfo], num_warps: usize) -> Plan {
    // Per shape: the narrowest ideal run among its contiguous memory ops.
    let mut run: HashMap<Vec<usize>, usize> = HashMap::new();
    let mut allowed: HashMap<Value, usize> = HashMap::new();
    for (v, ptr) in memory_ops(f) {
        let mask = match f.inst(v).op {
            Op::Load { mask, .. } | Op::Store { mask, .. } => mask,
            _ => None,
        };
        allowed.insert(v, max_access_width(f, axis, ptr, mask));
        let t = f.ty(ptr);
        let Some(&last) = t.shape.last() else { continue };
        let contiguity = axis[ptr.index()].contiguity[t.shape.len() - 1] as usize;
        let ideal = (16 / t.dtype.size()).min(contiguity).min(last);
        if ideal > 1 {
            let e = run.entry(t.shape.clone()).or_insert(ideal);
            *e = (*e).min(ideal);
        }
    }
    let mut layouts = HashMap::new();
    for &v in &f.body.insts {
        let shape = &f.ty(v).shape;
        if shape.is_empty() || layouts.contains_key(shape) {
            continue;
        }
        let vec = run.get(shape).copied().unwrap_or(1);
        let l = if shape.len() == 1 {
            LinearLayout::blocked_1d(shape[0], vec, num_warps)
        } else {
            // Rank > 1 (not produced by this slice's builder): row-major, vectors along
            // the last dimension, lanes then warps along it first.
            let r = shape.len();
            let order: Vec<usize> = (0..r).rev().collect();
            let mut spt = vec![1; r];
            spt[r - 1] = vec.min(shape[r - 1]);
            let mut tpw = vec![1; r];
            tpw[r - 1] = 32;
            let mut wpc = vec![1; r];
            wpc[r - 1] = num_warps;
            LinearLayout::blocked(shape, &spt, &tpw, &wpc, &order)
        };
        layouts.insert(shape.clone(), l);
    }
    let mut access_width = HashMap::new();
    for (v, ptr) in memory_ops(f) {
        let shape = &f.ty(ptr).shape;
        let w = if shape.is_empty() { 1 } else { allowed[&v].min(layouts[shape].contiguous_regs(shape.len() - 1)) };
        access_width.insert(v, w);
    }
    Plan { num_warps, layouts, access_width, axis: axis.to_vec() }
}
