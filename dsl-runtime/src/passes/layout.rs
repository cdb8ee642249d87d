//! Layout assignment: a [`LinearLayout`] for every block shape of the kernel, and a vector
//! width for every load and store.
//!
//! All blocks of one shape share one blocked layout, so elementwise code never converts
//! between layouts. Its elements per thread are the widest access any memory op of that
//! shape allows ([`axis_info::max_access_width`]), so the widest access gets 128-bit
//! instructions; narrower element types then use several vector instructions per thread.
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
    let mut widest: HashMap<Vec<usize>, usize> = HashMap::new();
    let mut allowed: HashMap<Value, usize> = HashMap::new();
    for (v, ptr) in memory_ops(f) {
        let mask = match f.inst(v).op {
            Op::Load { mask, .. } | Op::Store { mask, .. } => mask,
            _ => None,
        };
        let w = max_access_width(f, axis, ptr, mask);
        allowed.insert(v, w);
        let shape = f.ty(ptr).shape.clone();
        let e = widest.entry(shape).or_insert(1);
        *e = (*e).max(w);
    }
    let mut layouts = HashMap::new();
    for &v in &f.body.insts {
        let shape = &f.ty(v).shape;
        if shape.is_empty() || layouts.contains_key(shape) {
            continue;
        }
        let vec = widest.get(shape).copied().unwrap_or(1);
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
