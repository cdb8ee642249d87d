//! Layout assignment: the [`LinearLayout`] each operation is computed in, and a vector
//! width for every load, store and atomic.
//!
//! Layouts are chosen *backwards*, from the uses: an operation is computed in the layout
//! its users want (the default layout of its shape when they want several, or none), and
//! it asks its operands for layouts that make it free:
//!
//! - elementwise operations, loads and stores ask for their own layout;
//! - `broadcast` asks for its layout with the broadcast dimensions zeroed
//!   ([`LinearLayout::project`]), and `expand_dims` for its layout without the new
//!   dimension, so `offs_m.col() * stride + offs_n.row()` costs no data movement;
//! - a loop's carried values, its initial values, the body's new values and the loop's
//!   results share one layout (likewise a branch's results);
//! - reductions, `permute` and `reshape` take their operand in the operand's default
//!   layout. A reduction produces the *slice* of that layout (the reduced dimension
//!   removed), which is what a later `expand_dims` + `broadcast` back to the operand's
//!   shape asks for; `permute` produces the permuted layout.
//!
//! Where the layout an operation produces differs from the one its user asks for,
//! [`convert`](super::convert) inserts a `convert_layout`, which the lowering makes by
//! recomputation or through shared memory ([`lower`](crate::lower)). A transpose
//! (`load` → `trans` → `store`) converts exactly once, so that both global accesses are
//! coalesced and vectorized.
//!
//! The default layout of a shape is Triton's blocked layout
//! ([`LinearLayout::default_for`]) over the shape padded to powers of two. Its run of
//! contiguous elements per thread is the *narrowest* of the ideal runs of the memory ops
//! of that shape (16 bytes of each op's element type, capped by its proven contiguity),
//! so that every access is contiguous across the lanes of a warp; with mixed element
//! sizes the smaller type then moves fewer than 16 bytes per lane instead of the larger
//! type leaving gaps between lanes (25% slower stores on the H100, BENCHMARKS.md). Each
//! op's width is then limited by what the axis analysis proves (alignment, mask
//! constancy) and, for a dimension that is not a power of two, by the largest power of
//! two dividing it (so a vector never straddles the padding).
//!
//! Shared-memory buffers whose reads all feed tensor cores get a swizzled layout
//! ([`operand_swizzle`], in [`Plan::shared`]); a load that only goes to shared memory keeps
//! 16-byte vectors whatever its shape's default.
//!
//! What it cannot do yet: weigh the cost of a conversion against another choice (it
//! takes the first user's wish).

use super::axis_info::{max_access_width_along, AxisInfo};
use crate::ir::{memory::memory_ops, Function, Op, Value};
use crate::layout::LinearLayout;
use std::collections::HashMap;

/// What the lowering needs besides the IR.
#[derive(Clone, Debug)]
pub struct Plan {
    pub num_warps: usize,
    /// The layout each block value is computed in (region arguments included). Scalars
    /// use [`LinearLayout::scalar`]. For a `store` (no value), the layout of its access.
    pub layouts: HashMap<Value, LinearLayout>,
    /// Elements per vector instruction, per load/store.
    pub access_width: HashMap<Value, usize>,
    /// The default layout of each padded shape.
    pub defaults: HashMap<Vec<usize>, LinearLayout>,
    pub axis: Vec<AxisInfo>,
    /// Where each shared-memory buffer lives ([`alloc`](super::alloc)).
    pub smem: super::alloc::Allocation,
    /// The layout each block value is produced in, once [`convert`](super::convert) has
    /// made every conversion explicit: the layout part of the value's type. The lowering
    /// checks that it produces exactly these.
    pub produced: HashMap<Value, LinearLayout>,
    /// The shared layout (`Offset` → coordinates) of each buffer that is not stored
    /// row-major: the swizzle of tensor-core operands ([`operand_swizzle`]).
    pub shared: HashMap<Value, LinearLayout>,
    /// How each tensor-core `dot` runs ([`dot_plan`]).
    pub dots: HashMap<Value, DotPlan>,
    /// The `wgmma` dots whose pipelined loops keep a stage of slack
    /// ([`pipeline::run`](super::pipeline::run)): each may stay in flight into the next
    /// iteration (`wgmma.wait_group 1` at the end of the body).
    pub overlapped: std::collections::HashSet<Value>,
    /// The buffers the async proxy reads (a `wgmma`'s operands, a TMA store's source):
    /// placed at swizzle atoms by the allocator, and a thread's stores into them need a
    /// proxy fence ([`passes::plan`](super::plan)).
    pub async_buffers: std::collections::HashSet<Value>,
    /// The tensor maps of the kernel's TMA copies, in the order of their parameters
    /// ([`tma::maps`](super::tma::maps)).
    pub tma: Vec<super::tma::TensorMap>,
    /// Warps of a producer warpgroup beyond `num_warps` (4 where the kernel has an
    /// [`Op::WarpSpecialize`](crate::ir::Op::WarpSpecialize), else 0): the launch runs
    /// `num_warps + producer_warps` warps.
    pub producer_warps: usize,
    /// Programs an SM must fit at once (`minctasm`; [`LaunchConfig::min_programs_per_sm`](crate::launch::LaunchConfig::min_programs_per_sm)), set by the
    /// compile from its options; 1 by default.
    pub min_programs: usize,
}

impl Plan {
    /// The program with each block value's layout (`#L3`, defined in a header), as the
    /// `opt.ir` dump shows it.
    pub fn print(&self, f: &Function) -> String {
        let mut names: Vec<&LinearLayout> = vec![];
        let mut id: HashMap<&LinearLayout, usize> = HashMap::new();
        for v in f.walk() {
            if let Some(l) = self.produced.get(&v) {
                id.entry(l).or_insert_with(|| {
                    names.push(l);
                    names.len() - 1
                });
            }
        }
        let mut out = String::new();
        for (i, l) in names.iter().enumerate() {
            out += &format!("#L{i} = {l}\n");
        }
        for (v, l) in &self.shared {
            id.entry(l).or_insert_with(|| {
                out += &format!("#L{} = {l}\n", names.len());
                names.push(l);
                names.len() - 1
            });
            let _ = v;
        }
        // Which instruction each tensor-core `dot` takes, in program order.
        for v in f.walk() {
            if let Some(d) = self.dots.get(&v) {
                out += &format!("// %{}: {}\n", v.index(), d.instruction(f, v));
            }
        }
        let annotate = |v: Value| self.produced.get(&v).or_else(|| self.shared.get(&v)).map(|l| format!("#L{}", id[l]));
        out + &crate::ir::printer::print_annotated(f, true, &annotate)
    }
}

impl Plan {
    /// Whether some `dot` of the kernel takes `wgmma`.
    pub fn uses_wgmma(&self) -> bool {
        self.dots.values().any(|d| d.wgmma.is_some())
    }

    /// The layout `v` is computed in.
    pub fn layout(&self, f: &Function, v: Value) -> LinearLayout {
        match self.layouts.get(&v) {
            Some(l) => l.clone(),
            None => self.default_for(&f.ty(v).padded_shape()),
        }
    }

    /// The layouts of the values the loop or branch `owner` carries (`None` for scalars):
    /// a loop's are its region arguments', a branch's its results' (the default of the
    /// yielded shape where a result was removed as unused).
    pub fn carried(&self, f: &Function, owner: Value) -> Vec<Option<LinearLayout>> {
        let results = f.results_of(owner);
        let (samples, args): (&[Value], Option<&[Value]>) = match &f.inst(owner).op {
            Op::For { init, body, .. } => (init, Some(&body.args[1..])),
            Op::If { then, .. } => (&then.yields, None),
            _ => (&[], None),
        };
        samples
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                if f.ty(s).is_scalar() {
                    return None;
                }
                Some(match (args, results.get(i).copied().flatten()) {
                    (Some(args), _) => self.layout(f, args[i]),
                    (None, Some(r)) => self.layout(f, r),
                    (None, None) => self.default_for(&f.ty(s).padded_shape()),
                })
            })
            .collect()
    }

    /// The default layout of a padded shape.
    pub fn default_for(&self, padded: &[usize]) -> LinearLayout {
        if padded.is_empty() {
            return LinearLayout::scalar(self.num_warps);
        }
        self.defaults.get(padded).cloned().unwrap_or_else(|| LinearLayout::default_for(padded, 1, self.num_warps))
    }
}

/// How the warps of a CTA tile an `m x n` accumulator (`[along M, along N]`), Triton's
/// `warpsPerTileV2`: double the warps along M while a warp's share of M (in 16-row tiles)
/// is at least its share of N (in 16-column pairs of tiles) and M has tiles left, else
/// along N, until all warps are placed. Square-ish warp tiles read the fewest operand
/// bytes from shared memory per multiply (a 128 x 128 tile on 8 warps: 4 x 2 warps of
/// 32 x 64, not 8 x 1 of 16 x 128, which would read all of B in every warp). Warps past
/// the tiles replicate.
pub fn mma_warps(m: usize, n: usize, num_warps: usize) -> [usize; 2] {
    let mut w = [1usize, 1];
    while w[0] * w[1] < num_warps {
        if m / 16 / w[0] >= n / 16 / w[1] && w[0] < m / 16 {
            w[0] *= 2;
        } else {
            w[1] *= 2;
        }
    }
    w
}

/// Whether every warp gets a 16-row tile of an `m`-row accumulator: the placement chained
/// dots take, where one accumulator is the next `a`'s fragments in the same registers.
pub fn warps_fit_along_m(m: usize, num_warps: usize) -> bool {
    m / 16 >= num_warps
}

/// Whether `x` is computed from a `dot`'s accumulator by elementwise operations only
/// (layout conversions included, so that the answer is the same before and after
/// [`convert`](super::convert) inserts them).
pub fn from_dot_result(f: &Function, x: Value) -> bool {
    dot_behind(f, x, None)
}

/// Whether walking back from `x` through elementwise operations, layout conversions,
/// `if` results and loop-carried values reaches `dot` (any `dot` when `None`).
fn dot_behind(f: &Function, x: Value, dot: Option<Value>) -> bool {
    let mut stack = vec![x];
    let mut seen = std::collections::HashSet::new();
    while let Some(y) = stack.pop() {
        if !seen.insert(y) || y.index() < f.params.len() {
            continue;
        }
        match &f.inst(y).op {
            Op::Dot { .. } if dot.is_none_or(|d| d == y) => return true,
            Op::Binary(..) | Op::Unary(..) | Op::Cast(_) | Op::Select(..) | Op::Fma(..) | Op::ConvertLayout(_) => stack.extend(f.inst(y).op.operands()),
            // Through an `if`: both arms' values.
            Op::Result(owner, i) => stack.extend(if_yields(f, *owner, *i).into_iter().flatten()),
            // Through a loop's carried value: its initial value and what the body yields
            // (attention's probabilities carried into the next iteration's product).
            Op::Arg(owner, i) if *i > 0 => {
                if let Op::For { init, body, .. } = &f.inst(*owner).op {
                    stack.extend(init.get(*i as usize - 1).copied().into_iter().chain(body.yields.get(*i as usize - 1).copied()));
                }
            }
            _ => {}
        }
    }
    false
}

/// Whether `dot` `v` is chained to another: its `a` comes from a `dot`'s result through
/// elementwise operations, or its result reaches another `dot`'s `a` that way. Decided
/// from the instruction arena, not from walking the body, so that passes which hold a
/// block's instructions while they rewrite it see the same answer.
fn chained(f: &Function, v: Value) -> bool {
    let Op::Dot { a, .. } = f.inst(v).op else { return false };
    from_dot_result(f, a)
        || f.values.iter().enumerate().any(|(i, inst)| matches!(inst.op, Op::Dot { a: a2, .. } if i != v.index() && dot_behind(f, a2, Some(v))))
}

/// How a tensor-core `dot` runs: the instruction and the layouts of its operands and
/// accumulator. Chosen once per kernel ([`dot_plans`], in [`Plan::dots`]) and read from
/// there by the conversions, the shared layouts of the operand buffers and the lowering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DotPlan {
    /// `Some(n)`: sm_90a `wgmma.mma_async` m64nNk16 (m64nNk8 for tf32) with `N = n`, one
    /// warpgroup (4 warps) per 64-row tile, the operands read by the tensor cores from
    /// their buffers through shared-memory descriptors ([`wgmma_shape`]), or `a` from
    /// registers. `None`: `mma.sync` (m16n8k16 for 16-bit inputs, m16n8k8 for tf32) with
    /// fragments in registers.
    pub wgmma: Option<usize>,
    /// A tf32 `wgmma` computing `cᵀ = bᵀ aᵀ`: `bᵀ` is the instruction's `a`, read into
    /// registers (its `b` is N-contiguous, and the tensor cores read tf32 operands from
    /// shared memory only K-major), `aᵀ` its `b` (a K-major descriptor of `a`'s buffer),
    /// and the accumulator is the instruction's transposed (the layouts below are in the
    /// `dot`'s own coordinates).
    pub swapped: bool,
    /// The `a` and `b` fragments (`mma.sync`, and a `wgmma`'s operand in registers; a
    /// `wgmma` reads the others from shared memory, so nothing loads these) and the
    /// accumulator.
    pub layouts: [LinearLayout; 3],
}

impl DotPlan {
    /// The instruction, as the plan dump names it.
    pub fn instruction(&self, f: &Function, v: Value) -> String {
        let Op::Dot { a, .. } = f.inst(v).op else { return String::new() };
        match self.wgmma {
            Some(n) if f.ty(a).dtype == crate::DType::F32 => format!("wgmma.m64n{n}k8.tf32{}", if self.swapped { " (c^T = b^T a^T)" } else { "" }),
            Some(n) => format!("wgmma.m64n{n}k16"),
            None if f.ty(a).dtype == crate::DType::F32 => "mma.sync.m16n8k8.tf32".into(),
            None => "mma.sync.m16n8k16".into(),
        }
    }
}

/// Every tensor-core `dot` of `f` and how it runs ([`dot_plan`]).
pub fn dot_plans(f: &Function, num_warps: usize, wgmma: bool) -> HashMap<Value, DotPlan> {
    let on_wgmma = if wgmma { wgmma_dots(f, num_warps) } else { HashMap::new() };
    f.walk().into_iter().filter_map(|v| Some((v, dot_plan(f, v, num_warps, on_wgmma.get(&v).copied())?))).collect()
}

/// How `dot` `v` runs on tensor cores, `None` where it has no tensor-core lowering (f32 at
/// "tf32x3" or "ieee" precision). With `wgmma` (how it runs as one of [`wgmma_dots`] on
/// an sm_90a target that allows them) it takes `wgmma`; every other one `mma.sync`
/// (m16n8k16 for 16-bit inputs, m16n8k8 for f32 at tf32 precision) with fragments for
/// padded shapes `[M, K]` and `[K, N]`, the warps placed by [`mma_warps`].
fn dot_plan(f: &Function, v: Value, num_warps: usize, wgmma: Option<WgmmaShape>) -> Option<DotPlan> {
    let Op::Dot { a, b, precision, .. } = f.inst(v).op else { return None };
    let bits = match (f.ty(a).dtype, precision) {
        (crate::DType::BF16 | crate::DType::F16, _) => 16,
        (crate::DType::F32, crate::ir::DotPrecision::Tf32) => 32,
        _ => return None,
    };
    let (sa, sb) = (f.ty(a).padded_shape(), f.ty(b).padded_shape());
    let (m, n) = (sa[0], sb[1]);
    if let Some(WgmmaShape { warps, n: instr_n, swapped }) = wgmma {
        if swapped {
            // The instruction's product is [N, M] = bᵀ aᵀ, its `a` fragments bᵀ's.
            let t = |l: LinearLayout| l.permute(&[1, 0]);
            return Some(DotPlan {
                wgmma: Some(instr_n),
                swapped,
                layouts: [
                    t(LinearLayout::mma_v2_operand(1, &[sa[1], sa[0]], &warps, bits)),
                    t(LinearLayout::mma_v2_operand(0, &[sb[1], sb[0]], &warps, bits)),
                    t(LinearLayout::wgmma_accumulator(&[n, m], &warps, instr_n)),
                ],
            });
        }
        return Some(DotPlan {
            wgmma: Some(instr_n),
            swapped,
            layouts: [
                LinearLayout::mma_v2_operand(0, &sa, &warps, bits),
                LinearLayout::mma_v2_operand(1, &sb, &warps, bits),
                LinearLayout::wgmma_accumulator(&[m, n], &warps, instr_n),
            ],
        });
    }
    // Chained dots (attention's `p = softmax(q k^T)` feeding `p v`): all warps along M
    // where M has the tiles, as Triton does, so that the first accumulator is the second's
    // `a` fragments in the same threads and moves through registers only.
    let warps = if chained(f, v) && warps_fit_along_m(m, num_warps) { [num_warps, 1] } else { mma_warps(m, n, num_warps) };
    Some(DotPlan {
        wgmma: None,
        swapped: false,
        layouts: [
            LinearLayout::mma_v2_operand(0, &sa, &warps, bits),
            LinearLayout::mma_v2_operand(1, &sb, &warps, bits),
            LinearLayout::mma_v2_accumulator(&[m, n], &warps),
        ],
    })
}

/// The `mma.sync` layouts of `dot` `v` ([`dot_plan`] without `wgmma`).
#[cfg(test)]
pub fn dot_layouts(f: &Function, v: Value, num_warps: usize) -> Option<[LinearLayout; 3]> {
    dot_plan(f, v, num_warps, None).map(|p| p.layouts)
}

/// Where `dot` `v` can run as sm_90a `wgmma` ([`wgmma_dots`]): how.
pub fn wgmma_shape(f: &Function, v: Value, num_warps: usize) -> Option<WgmmaShape> {
    wgmma_dots(f, num_warps).remove(&v)
}

/// How a `dot` runs as `wgmma`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgmmaShape {
    /// The warps `[along M, along N]` of the instruction's product (`[N, M]` where
    /// `swapped`).
    pub warps: [usize; 2],
    /// The instruction's N.
    pub n: usize,
    /// `cᵀ = bᵀ aᵀ` ([`DotPlan::swapped`]).
    pub swapped: bool,
}

/// The `dot`s of `f` that can run as sm_90a `wgmma` with their operands in shared
/// memory (Triton's conditions for its MMA v3, `supportMMA`, plus what our lowering
/// needs), each with its warps `[along M, along N]` and the instruction's N.
///
/// - 16-bit inputs, or f32 at "tf32" precision in a `dot` that is not chained to another
///   ([`chained_through_buffers`]) whose `a` is K-contiguous: the tensor cores read tf32 operands from
///   shared memory only K-major. A `b` that is N-contiguous (`[K, N]` row-major, the
///   usual matmul) makes it [`swapped`](WgmmaShape::swapped): `cᵀ = bᵀ aᵀ`, `bᵀ` read
///   into registers as the instruction's `a`, the conditions below on the instruction's
///   `[N, M]` product.
/// - Whole warpgroups (`num_warps` a multiple of 4) and tiles they fill: M a multiple of
///   64, K of 16 (8 for tf32), N at least 16, no padding. Warps go along M first, 16 rows each, then
///   along N (Triton's `warpsPerTileV3`); the instruction's N is a warpgroup's share of
///   the tile, at most 256.
/// - Each operand is a `local_load` of a buffer (or a stage or transposed view of one)
///   in the `dot`'s block whose only user is the `dot`; each stage is a whole number of
///   1024-byte swizzle atoms.
/// - Every read of such a buffer feeds a `dot` that takes `wgmma` too: the tensor cores
///   read the buffer where each `dot` is, so the buffer is laid out for them alone
///   ([`operand_swizzle`]). Several may read it, directly or transposed (attention's
///   backward multiplies by its query and output-gradient tiles both ways). Of the dots
///   that meet the other conditions, one that shares a buffer with a read feeding none
///   of them is dropped, and so on until none does.
/// - Or `a` comes from another `dot`'s accumulator in registers (attention's
///   probabilities, [`from_dot_result`]): `wgmma`'s register form, whose `a` fragments
///   are `mma.sync`'s, per warp its 16 rows ([`LinearLayout::mma_v2_operand`]), so with
///   all warps along M. A `dot` whose result feeds another's `a` takes `wgmma` on the same
///   terms: its accumulator is those fragments in the same registers.
pub fn wgmma_dots(f: &Function, num_warps: usize) -> HashMap<Value, WgmmaShape> {
    let insts = f.walk();
    let users = f.users_in(&f.body.insts);
    // Per buffer, every read of it (through stages and transposed views).
    let mut reads: HashMap<Value, Vec<Value>> = HashMap::new();
    for &u in &insts {
        if let Op::LocalLoad(view) = f.inst(u).op {
            reads.entry(f.buffer_root(view)).or_default().push(u);
        }
    }
    // Which dimension of its buffer each operand read sees contiguous (tf32 only).
    let tf32 = insts.iter().any(|&v| matches!(f.inst(v).op, Op::Dot { a, precision: crate::ir::DotPrecision::Tf32, .. } if f.ty(a).dtype == crate::DType::F32));
    let axis = if tf32 { super::axis_info::analyze(f) } else { vec![] };
    let contiguous = |x: Value| read_contiguous(f, &axis, &insts, &users, x);
    let mut dots: HashMap<Value, (WgmmaShape, Vec<Value>)> = insts.iter().filter_map(|&v| Some((v, wgmma_fit(f, v, num_warps, &users, &contiguous)?))).collect();
    loop {
        let read_by_others = |root: &Value| reads[root].iter().any(|x| !matches!(users.get(x).map(|u| u.as_slice()), Some([d]) if dots.contains_key(d)));
        let dropped: Vec<Value> = dots.iter().filter(|(_, (_, roots))| roots.iter().any(read_by_others)).map(|(&v, _)| v).collect();
        if dropped.is_empty() {
            return dots.into_iter().map(|(v, (shape, _))| (v, shape)).collect();
        }
        for v in dropped {
            dots.remove(&v);
        }
    }
}

/// [`wgmma_dots`]'s conditions on `dot` `v` alone: how it runs, and the buffers its
/// operands read. `contiguous(x)`: the dimension of operand read `x` that is contiguous
/// in its buffer.
fn wgmma_fit(f: &Function, v: Value, num_warps: usize, users: &HashMap<Value, Vec<Value>>, contiguous: &dyn Fn(Value) -> Option<usize>) -> Option<(WgmmaShape, Vec<Value>)> {
    let Op::Dot { a, b, precision, .. } = f.inst(v).op else { return None };
    let (ta, tb) = (f.ty(a), f.ty(b));
    let tf32 = ta.dtype == crate::DType::F32 && precision == crate::ir::DotPrecision::Tf32;
    if !num_warps.is_multiple_of(4) || !(ta.dtype.size() == 2 || tf32) || ta.padded_shape() != ta.shape || tb.padded_shape() != tb.shape {
        return None;
    }
    let (m, k, n) = (ta.shape[0], ta.shape[1], tb.shape[1]);
    // tf32: `a` K-major; `b` K-major, or read into registers as the instruction's `a`.
    let swapped = tf32 && contiguous(b) != Some(0);
    if tf32 && (chained_through_buffers(f, v) || contiguous(a) != Some(1)) {
        return None;
    }
    let (m, n) = if swapped { (n, m) } else { (m, n) };
    let k_step = if tf32 { 8 } else { 16 };
    if m % 64 != 0 || k % k_step != 0 || n < 16 {
        return None;
    }
    let block = f.enclosing_block(v);
    let a_in_registers = swapped || !matches!(f.inst(a).op, Op::LocalLoad(_)) && from_dot_result(f, a);
    let mut roots = vec![];
    for x in [a, b] {
        if x == a && a_in_registers && !swapped {
            continue;
        }
        let Op::LocalLoad(view) = f.inst(x).op else { return None };
        let stage_bytes = f.ty(view).shape.iter().product::<usize>() * f.ty(view).dtype.size();
        if !block.contains(&x) || users.get(&x).map(|u| u.as_slice()) != Some(&[v]) || !stage_bytes.is_multiple_of(1024) {
            return None;
        }
        roots.push(f.buffer_root(view));
    }
    let mut w = [4, 1];
    while w[0] * w[1] < num_warps {
        if m > 16 * w[0] {
            w[0] *= 2;
        } else {
            w[1] *= 2;
        }
    }
    let instr_n = (n / w[1]).min(256);
    (instr_n >= 16 && instr_n.is_power_of_two() && (w[1] == 1 || !a_in_registers)).then_some((WgmmaShape { warps: w, n: instr_n, swapped }, roots))
}

/// [`chained`], also where the operands are staged in shared memory (f32 ones always are:
/// [`stage`](super::stage) keeps only 16-bit ones in registers): an operand of `v` read
/// from a buffer holding a value computed from a `dot`'s result, or `v`'s result reaching
/// another `dot`'s operand that way (attention's probabilities and its backward's `dS`).
/// Attention in f32 keeps `mma.sync`: its tiles and pipelines are planned for it.
fn chained_through_buffers(f: &Function, v: Value) -> bool {
    let held = |x: Value| match f.inst(x).op {
        Op::LocalLoad(view) => match f.inst(f.buffer_root(view)).op {
            Op::LocalAlloc(Some(y)) => y,
            _ => x,
        },
        _ => x,
    };
    let Op::Dot { a, b, .. } = f.inst(v).op else { return false };
    chained(f, v)
        || [a, b].into_iter().any(|x| from_dot_result(f, held(x)))
        || f.values.iter().enumerate().any(|(i, inst)| matches!(inst.op, Op::Dot { a: a2, b: b2, .. } if i != v.index() && [a2, b2].into_iter().any(|x| dot_behind(f, held(x), Some(v)))))
}

/// The dimension of operand read `x` (a `local_load` of a buffer, a stage of one or a
/// transposed view) that is contiguous in the buffer ([`operand_swizzle`] lays it out
/// so): that of the tensor a TMA copy into it reads, or of the block a load or
/// asynchronous copy writes into it ([`fast_dim`]).
/// (`insts`: every instruction of `f`; `users`: their users.)
fn read_contiguous(f: &Function, axis: &[AxisInfo], insts: &[Value], users: &HashMap<Value, Vec<Value>>, x: Value) -> Option<usize> {
    let Op::LocalLoad(view) = f.inst(x).op else { return None };
    let writer = buffer_writer(f, insts, f.buffer_root(view))?;
    let c = match f.inst(writer).op {
        Op::TmaCopy { tile, .. } => tile.inner,
        Op::AsyncCopy { ptr, .. } => fast_dim(f, axis, ptr),
        Op::Load { ptr, .. } if users.get(&writer).is_some_and(|us| us.iter().all(|u| only_to_shared(f, writer, u))) => fast_dim(f, axis, ptr),
        _ => f.ty(writer).shape.len() - 1,
    };
    Some(if matches!(f.inst(view).op, Op::LocalTrans(_)) { 1 - c } else { c })
}

/// What writes buffer `root` (among `insts`): the block it is allocated with, or the
/// first asynchronous or TMA copy into it or a stage of it.
fn buffer_writer(f: &Function, insts: &[Value], root: Value) -> Option<Value> {
    match f.inst(root).op {
        Op::LocalAlloc(Some(x)) => Some(x),
        _ => insts.iter().copied().find(|&u| matches!(f.inst(u).op, Op::AsyncCopy { dst, .. } | Op::TmaCopy { dst, .. } if f.buffer_root(dst) == root)),
    }
}

/// Whether user `u` of `v` only puts it in shared memory (a load with only such users has
/// a free layout: [`fast_dim`]).
fn only_to_shared(f: &Function, v: Value, u: &Value) -> bool {
    matches!(f.inst(*u).op, Op::LocalAlloc(Some(x)) | Op::LocalStore { value: x, .. } if x == v)
}

/// The dimension a block access through `ptr` whose layout is free (it only moves data
/// into shared memory) runs along: the one with the widest vectors (16 bytes at most),
/// the last on a tie.
fn fast_dim(f: &Function, axis: &[AxisInfo], ptr: Value) -> usize {
    let last = f.ty(ptr).shape.len() - 1;
    (0..=last).rev().max_by_key(|&d| (ideal_run(f, axis, ptr, d), d == last)).expect("a dimension")
}

/// The widest vector (elements, 16 bytes at most) an access through `ptr` could take
/// along dimension `d`: its contiguity there, and no vector straddling the padding.
fn ideal_run(f: &Function, axis: &[AxisInfo], ptr: Value, d: usize) -> usize {
    let t = f.ty(ptr);
    let tiling = t.shape[d] & t.shape[d].wrapping_neg();
    (16 / t.dtype.size()).min(axis[ptr.index()].contiguity[d] as usize).min(tiling)
}

/// The shared layout of buffer `buf` when every read of it feeds a tensor-core `dot`
/// operand: rows (the last dimension contiguous) cut into chunks of `vec` elements, chunk
/// `c` of row `r` stored at chunk `c ^ ((r / per_phase) % max_phase)`, with `per_phase`
/// the rows that share 128 bytes (the 32 banks) and `max_phase` the distinct chunks within
/// them (Triton's swizzle for mma v2 operands; notes `tensor-cores.md` §2).
///
/// - 16-bit operands, and f32 `a` operands (K contiguous): 16-byte chunks. The eight rows
///   one `ldmatrix` phase reads fall in eight different bank groups, and so do the
///   16-byte row-wise writes of eight consecutive lanes.
/// - f32 `b` operands ([K, N], N contiguous; as seen by the reads, which may go through
///   a transposed view): a tf32 `b` fragment read is 4 rows (`t`) by
///   8 consecutive columns (`g`), so chunks of 8 elements (32 bytes) over 4 phases put
///   the 4 rows in 4 different quarters of the banks (Triton: `vec = n = 8`,
///   `maxPhase = k = 4` for tf32 with N-major B).
///
/// A buffer read by a `wgmma` ([`DotPlan::wgmma`]) gets the layout its descriptors
/// describe instead ([`LinearLayout::nvmma_shared`]): strips of at most 64 elements (128
/// bytes) along its contiguous dimension, each holding its rows one after the other with
/// the 128-, 64- or 32-byte swizzle of its width. Where the contiguous dimension is M or
/// N (an "MN-major" operand) a strip is at most one instruction wide (64 rows of `a`,
/// N columns of `b`), so that each instruction starts at a strip.
///
/// The source of a TMA store gets the same layout with strips as wide as the widest
/// swizzle allows: one box each.
///
/// `None` for any other buffer (stored row-major).
pub fn operand_swizzle(f: &Function, buf: Value, fast: &HashMap<Value, usize>, dots: &HashMap<Value, DotPlan>) -> Option<LinearLayout> {
    if !matches!(f.inst(buf).op, Op::LocalAlloc(_)) {
        return None;
    }
    let insts = f.walk();
    // A ring of stages (the pipeliner's) is read through views of one stage each: the
    // layout is a stage's, and the stage's offset is added at run time.
    let mut views = vec![buf];
    views.extend(insts.iter().copied().filter(|&u| matches!(f.inst(u).op, Op::LocalSlot { buf: b, .. } if b == buf)));
    let t = f.ty(*views.last().expect("buf itself"));
    let size = t.dtype.size();
    if !t.shared || !matches!(size, 2 | 4) || t.shape.len() != 2 || t.padded_shape() != t.shape {
        return None;
    }
    // Transposed views of the buffer or of its stages: their reads see K where the
    // others see M or N.
    let transposed: Vec<Value> = insts.iter().copied().filter(|&u| matches!(f.inst(u).op, Op::LocalTrans(b) if views.contains(&b))).collect();
    let loads: Vec<(Value, bool)> = insts
        .iter()
        .filter_map(|&u| match f.inst(u).op {
            Op::LocalLoad(b) if views.contains(&b) => Some((u, false)),
            Op::LocalLoad(b) if transposed.contains(&b) => Some((u, true)),
            _ => None,
        })
        .collect();
    // The source of a TMA store: the strips of its boxes, each as wide as the widest
    // swizzle allows ([`tma::stores`](super::tma::stores)).
    let tma_store = insts.iter().find_map(|&u| match f.inst(u).op {
        Op::TmaStore { src, tile, .. } if src == buf => Some(tile.inner),
        _ => None,
    });
    if let Some(c) = tma_store {
        let w = (128 / size).min(t.shape[c]);
        return Some(LinearLayout::nvmma_shared(&t.shape, 8 * size as u32, w * size, c == 0));
    }
    if loads.is_empty() {
        return None;
    }
    // The buffer's contiguous dimension: that of the block written into it (a column-major
    // tile is stored column-major, its reads use `ldmatrix.trans`), or of the tensor a TMA
    // copy reads.
    let writer = buffer_writer(f, &insts, buf);
    let c = match writer.map(|w| &f.inst(w).op) {
        Some(Op::TmaCopy { tile, .. }) => tile.inner,
        _ => writer.and_then(|w| fast.get(&w)).copied().unwrap_or(1),
    };
    // Every use of a load is a tensor-core `dot` operand; `k_contiguous` says, per use,
    // whether K is the buffer's contiguous dimension (K is the read's dimension 1 for an
    // `a` operand and 0 for a `b`, swapped when read through a transposed view).
    let mut k_contiguous = vec![];
    let mut strip = None;
    for &u in &insts {
        for &(x, trans) in &loads {
            if f.inst(u).op.operands().contains(&x) {
                match (&f.inst(u).op, dots.get(&u)) {
                    (&Op::Dot { a, b, acc, .. }, Some(plan)) if acc != x && (a == x || b == x) => {
                        let k_dim = usize::from((a == x) != trans);
                        k_contiguous.push(k_dim == c);
                        if let Some(n) = plan.wgmma {
                            // One instruction's extent along the contiguous dimension
                            // when it is M or N; the narrowest of the readers'.
                            let mn = if k_dim == c { usize::MAX } else if a == x { 64 } else { n };
                            let w = (128 / size).min(t.shape[c]).min(mn);
                            strip = Some(strip.map_or(w, |s: usize| s.min(w)));
                        }
                    }
                    _ => return None,
                }
            }
        }
    }
    if let Some(w) = strip {
        // [`wgmma_dots`] lets only `wgmma`s read a buffer one of them reads.
        return Some(LinearLayout::nvmma_shared(&t.shape, 8 * size as u32, w * size, c == 0));
    }
    let cols = t.shape[c];
    let per_phase = (128 / (size * cols)).max(1);
    let f32_b = size == 4 && !k_contiguous.is_empty() && k_contiguous.iter().all(|&x| !x);
    let (vec, phases) = if f32_b { (8, 4) } else { (16 / size, 8) };
    let vec = vec.min(cols);
    let max_phase = (phases / per_phase).min(cols / vec).max(1);
    Some(LinearLayout::swizzled_shared(&t.shape, &[c, 1 - c], vec, per_phase, max_phase))
}

/// The two arms' yields of result `i` of `owner` when it is an `if`.
fn if_yields(f: &Function, owner: Value, i: u32) -> Option<[Value; 2]> {
    match &f.inst(owner).op {
        Op::If { then, els, .. } => Some([*then.yields.get(i as usize)?, *els.yields.get(i as usize)?]),
        _ => None,
    }
}

pub fn assign(f: &Function, axis: &[AxisInfo], num_warps: usize, wgmma: bool) -> Plan {
    let dots = dot_plans(f, num_warps, wgmma);
    // Per padded shape: the narrowest ideal run among its contiguous memory ops.
    let mut run: HashMap<Vec<usize>, usize> = HashMap::new();
    let mut allowed: HashMap<Value, usize> = HashMap::new();
    let mut own_run: HashMap<Value, usize> = HashMap::new();
    // The contiguous dimension of each memory op that only moves data into shared memory
    // (a staged `dot` operand's load, an async copy): its layout is free, so a column-major
    // tile is read along its columns, in vectors, rather than element by element.
    let mut fast: HashMap<Value, usize> = HashMap::new();
    let users = f.users_in(&f.body.insts);
    for (v, ptr) in memory_ops(f) {
        let mask = match f.inst(v).op {
            Op::Load { mask, .. } | Op::Store { mask, .. } | Op::Atomic { mask, .. } | Op::AsyncCopy { mask, .. } => mask,
            _ => None,
        };
        let t = f.ty(ptr);
        if t.shape.is_empty() {
            allowed.insert(v, 1);
            continue;
        }
        let last = t.shape.len() - 1;
        let free = match f.inst(v).op {
            Op::AsyncCopy { .. } => true,
            Op::Load { .. } => users.get(&v).is_some_and(|us| us.iter().all(|u| only_to_shared(f, v, u))),
            _ => false,
        };
        let d = if free { fast_dim(f, axis, ptr) } else { last };
        if d != last {
            fast.insert(v, d);
        }
        let tiling = t.shape[d] & t.shape[d].wrapping_neg();
        // Atomics one element at a time, but a relaxed `f32` sum nobody reads on sm_90
        // (`wgmma`: `red...v2/v4.f32`, [`lower::memory::atomic`](crate::lower::memory::atomic)).
        let w = match f.inst(v).op {
            Op::Atomic { op: crate::ir::AtomicOp::Add, relaxed: true, .. } if wgmma && t.dtype == crate::DType::F32 && !f.has_users(v) => max_access_width_along(f, axis, ptr, mask, d).min(tiling).min(4),
            Op::Atomic { .. } => 1,
            _ => max_access_width_along(f, axis, ptr, mask, d).min(tiling),
        };
        allowed.insert(v, w);
        let ideal = ideal_run(f, axis, ptr, d);
        own_run.insert(v, ideal);
        if ideal > 1 && d == last {
            let e = run.entry(t.padded_shape()).or_insert(ideal);
            *e = (*e).min(ideal);
        }
    }
    let mut defaults: HashMap<Vec<usize>, LinearLayout> = HashMap::new();
    let mut default = |shape: &[usize]| -> LinearLayout {
        if shape.is_empty() {
            return LinearLayout::scalar(num_warps);
        }
        defaults
            .entry(shape.to_vec())
            .or_insert_with(|| LinearLayout::default_for(shape, run.get(shape).copied().unwrap_or(1), num_warps))
            .clone()
    };
    // The layouts some values come out in whatever their users want: a reduction's slice
    // of its operand's default layout, and elementwise results of such values. A loop
    // that accumulates a reduction carries it in that layout, converting once after the
    // loop instead of once per iteration.
    let mut natural: HashMap<Value, LinearLayout> = HashMap::new();
    // Values computed from a tensor-core accumulator elementwise (attention's scores and
    // probabilities, a loop's accumulator after it): computed where the accumulator is,
    // whatever their users want, so that the softmax between two `dot`s moves no data
    // (the users convert if they must).
    let mut from_dot: std::collections::HashSet<Value> = Default::default();
    // Blocks read from memory and elementwise results of them; and a loop's accumulator
    // after the loop with what is computed from it in its fragments (the epilogue).
    let mut from_load: std::collections::HashSet<Value> = Default::default();
    let mut epilogue: std::collections::HashSet<Value> = Default::default();
    for v in f.walk() {
        let inst = f.inst(v);
        let elementwise = matches!(inst.op, Op::Binary(..) | Op::Unary(..) | Op::Cast(_) | Op::Select(..) | Op::Fma(..) | Op::Cmp(..));
        if !inst.ty.is_scalar() && (matches!(inst.op, Op::Load { .. }) || elementwise && inst.op.operands().iter().any(|o| from_load.contains(o))) {
            from_load.insert(v);
        }
        let nat = match &inst.op {
            // A reduction of a value that comes out in a layout of its own (a tensor-core
            // accumulator: attention's scores) reduces it there, without a conversion.
            Op::Reduce { x, axis, .. } if !inst.ty.is_scalar() => {
                let lx = natural.get(x).cloned().unwrap_or_else(|| default(&f.ty(*x).padded_shape()));
                Some(lx.remove_dim(*axis as usize).0)
            }
            // A loop accumulating a `dot` carries it in the accumulator's fragments.
            Op::Dot { .. } => dots.get(&v).map(|p| p.layouts[2].clone()),
            _ if elementwise => {
                let known: Vec<&LinearLayout> = inst.op.operands().iter().filter_map(|o| natural.get(o)).collect();
                match known.first() {
                    Some(&l) if known.iter().all(|&k| k == l) => Some(l.clone()),
                    _ => None,
                }
            }
            // A branch whose arms both compute a value in the same layout of its own (an
            // accumulator masked on some iterations only) yields it there.
            // A loop carrying a value in a layout of its own (an accumulator) gives it out
            // there, so an enclosing loop carries it there too (attention's backward sums
            // over query heads around the loop over query tiles).
            Op::Result(owner, i) => match (if_yields(f, *owner, *i), &f.inst(*owner).op) {
                (Some([a, b]), _) => match (natural.get(&a), natural.get(&b)) {
                    (Some(la), Some(lb)) if la == lb => Some(la.clone()),
                    _ => None,
                },
                (None, Op::For { body, .. }) => natural.get(&body.yields[*i as usize]).cloned(),
                _ => None,
            },
            _ => None,
        };
        if let Some(l) = nat {
            let dotted = match &inst.op {
                Op::Dot { .. } => true,
                // After the loop, combined with a block read from memory (a matmul
                // epilogue's residual), the accumulator converts instead, so that the read
                // stays coalesced. (In the loop, scores combined with such a block keep
                // their fragments: converting them every iteration would cost more.)
                _ if elementwise || matches!(inst.op, Op::Reduce { .. }) => {
                    let ops = inst.op.operands();
                    let any_in = |set: &std::collections::HashSet<Value>| ops.iter().any(|o| set.contains(o));
                    let (dotted, after, loaded) = (any_in(&from_dot), any_in(&epilogue), any_in(&from_load));
                    if dotted && after && !loaded {
                        epilogue.insert(v);
                    }
                    dotted && !(after && loaded)
                }
                // A loop's accumulator leaves it in its fragments: the epilogue's scaling
                // and cast happen there, and the store converts the narrower result
                // (attention's `acc / l` in bf16: half the bytes through shared memory).
                Op::Result(owner, i) => match (if_yields(f, *owner, *i), &f.inst(*owner).op) {
                    (Some(ys), _) => ys.iter().any(|y| from_dot.contains(y)),
                    (None, Op::For { body, .. }) => {
                        let dotted = from_dot.contains(&body.yields[*i as usize]);
                        if dotted {
                            epilogue.insert(v);
                        }
                        dotted
                    }
                    _ => false,
                },
                _ => false,
            };
            if dotted {
                from_dot.insert(v);
            }
            natural.insert(v, l);
        }
    }
    let want = |wants: &mut HashMap<Value, Vec<LinearLayout>>, x: Value, l: LinearLayout| {
        if !f.ty(x).is_scalar() {
            wants.entry(x).or_default().push(l);
        }
    };
    // Carried values decided before the walk: see the end of the loop below.
    let mut seeds: Vec<(Value, usize, LinearLayout)> = vec![];
    let layouts = loop {
        let mut layouts: HashMap<Value, LinearLayout> = HashMap::new();
        let mut wants: HashMap<Value, Vec<LinearLayout>> = HashMap::new();
        for (owner, i, l) in &seeds {
            carried(f, *owner, *i, l, &mut wants, &mut layouts);
        }
        // A load that only goes to shared memory (a staged `dot` operand) is not bound to its
        // shape's default layout, which may be narrower for the sake of another op of that
        // shape (an f32 store next to bf16 loads): it moves 16 bytes per lane.
        for (&v, &ideal) in &own_run {
            let padded = f.ty(v).padded_shape();
            if !matches!(f.inst(v).op, Op::Load { .. }) || !users.get(&v).is_some_and(|us| us.iter().all(|u| only_to_shared(f, v, u))) {
                continue;
            }
            if let Some(&d) = fast.get(&v) {
                want(&mut wants, v, LinearLayout::blocked_along(&padded, d, ideal, num_warps));
            } else if ideal > run.get(&padded).copied().unwrap_or(1) {
                want(&mut wants, v, LinearLayout::default_for(&padded, ideal, num_warps));
            }
        }
        for v in f.walk().into_iter().rev() {
            let inst = f.inst(v);
            let padded = inst.ty.padded_shape();
            let d = default(&padded);
            let mine = |wants: &HashMap<Value, Vec<LinearLayout>>, v: Value| -> LinearLayout {
                if from_dot.contains(&v) && !matches!(inst.op, Op::Reduce { .. }) {
                    return natural[&v].clone();
                }
                match wants.get(&v) {
                    Some(ws) if !ws.is_empty() && !ws.contains(&d) => ws[0].clone(),
                    _ => d.clone(),
                }
            };
            match &inst.op {
                // A bounds check comes before its access and the guard's compare: by now its
                // offset is wanted in the access's layout, so the check adds no conversion.
                Op::BoundsCheck { offset, .. } => {
                    let l = match wants.get(offset) {
                        Some(ws) if !ws.is_empty() => ws[0].clone(),
                        _ => default(&f.ty(*offset).padded_shape()),
                    };
                    for o in inst.op.operands() {
                        want(&mut wants, o, l.clone());
                    }
                    layouts.insert(v, l);
                }
                // An async copy goes to shared memory, like a staged load: 16 bytes per lane.
                Op::AsyncCopy { ptr, .. } => {
                    let padded = f.ty(*ptr).padded_shape();
                    let along = fast.get(&v).copied().unwrap_or(padded.len() - 1);
                    let l = LinearLayout::blocked_along(&padded, along, own_run.get(&v).copied().unwrap_or(1), num_warps);
                    for o in inst.op.operands().into_iter().filter(|&o| !f.ty(o).shared) {
                        want(&mut wants, o, l.clone());
                    }
                    layouts.insert(v, l);
                }
                Op::LocalSlot { .. } | Op::LocalTrans(_) => {}
                Op::Store { ptr, .. } | Op::Atomic { ptr, .. } | Op::Assert { cond: ptr, .. } => {
                    // (An atomic sum of a `dot`'s accumulator, attention's `dQ` shares, is
                    // converted too: `red...v4.f32` from the default layout measured
                    // 1.05-1.2x faster than `v2` in the accumulator's, with no conversion;
                    // H200, BENCHMARKS.md, "The atomic backward".)
                    let l = if matches!(inst.op, Op::Atomic { .. }) { mine(&wants, v) } else { default(&f.ty(*ptr).padded_shape()) };
                    for o in inst.op.operands() {
                        want(&mut wants, o, l.clone());
                    }
                    layouts.insert(v, l);
                }
                Op::Print { args, .. } => {
                    if let Some(&a) = args.first() {
                        let l = default(&f.ty(a).padded_shape());
                        for &o in args {
                            want(&mut wants, o, l.clone());
                        }
                    }
                }
                Op::Result(owner, i) => {
                    let yield_natural = match &f.inst(*owner).op {
                        Op::For { body, .. } => natural.get(&body.yields[*i as usize]).cloned(),
                        _ => None,
                    };
                    let l = if inst.ty.is_scalar() { d.clone() } else { yield_natural.unwrap_or_else(|| mine(&wants, v)) };
                    carried(f, *owner, *i as usize, &l, &mut wants, &mut layouts);
                    layouts.insert(v, l);
                }
                Op::For { body, .. } => {
                    // Carried values whose results are unused: take the body's wish.
                    for (i, &a) in body.args.iter().enumerate().skip(1) {
                        if !layouts.contains_key(&a) && !f.ty(a).is_scalar() {
                            let l = match wants.get(&a) {
                                Some(ws) if !ws.is_empty() => ws[0].clone(),
                                _ => default(&f.ty(a).padded_shape()),
                            };
                            carried(f, v, i - 1, &l, &mut wants, &mut layouts);
                        }
                    }
                    layouts.insert(body.args[0], LinearLayout::scalar(num_warps));
                }
                // Shared memory takes a block in whatever layout it was computed in, and gives
                // it back in whatever layout its users want: no wishes for operands.
                Op::LocalAlloc(_) => {}
                // Tensor cores take their operands in fragments and give the accumulator's.
                Op::Dot { a, b, acc, .. } if dots.contains_key(&v) => {
                    let [la, lb, lc] = dots[&v].layouts.clone();
                    want(&mut wants, *a, la);
                    want(&mut wants, *b, lb);
                    want(&mut wants, *acc, lc.clone());
                    layouts.insert(v, lc);
                }
                Op::LocalLoad(_) => {
                    layouts.insert(v, mine(&wants, v));
                }
                _ if inst.ty.unit || inst.ty.is_scalar() => {}
                op => {
                    let l = mine(&wants, v);
                    match op {
                        Op::Broadcast(x) => {
                            let src = &f.ty(*x).shape;
                            let dims: Vec<usize> = (0..src.len()).filter(|&k| src[k] == 1 && inst.ty.shape[k] != 1).collect();
                            want(&mut wants, *x, l.project(&dims).0);
                        }
                        Op::ExpandDims(x, a) => want(&mut wants, *x, l.remove_dim(*a as usize).0),
                        Op::Reduce { x, .. } if natural.contains_key(x) => {
                            let lx = natural[x].clone();
                            want(&mut wants, *x, lx);
                        }
                        Op::Reduce { x, .. } | Op::Permute(x, _) | Op::Reshape(x) => {
                            let dx = default(&f.ty(*x).padded_shape());
                            want(&mut wants, *x, dx);
                        }
                        _ => {
                            for o in op.operands() {
                                if f.ty(o).shape == inst.ty.shape {
                                    want(&mut wants, o, l.clone());
                                }
                            }
                        }
                    }
                    layouts.insert(v, l);
                }
            }
        }
        // A carried value whose result nothing reads gets its layout at the loop, after the
        // body's walk, where its new value already has one (a prefetched tile,
        // [`prefetch`](super::prefetch), loaded after its last use): a conversion every
        // iteration. Such values are decided up front, in the layout the body wants them in,
        // and the walk runs again (once more at most per carried value).
        let late: Vec<(Value, usize, LinearLayout)> = f
            .walk()
            .into_iter()
            .filter_map(|v| match &f.inst(v).op {
                Op::For { body, .. } => Some((v, body)),
                _ => None,
            })
            .flat_map(|(v, body)| body.args.iter().skip(1).zip(&body.yields).enumerate().map(move |(i, (a, y))| (v, i, *a, *y)))
            .filter(|&(v, i, a, y)| !seeds.iter().any(|s| (s.0, s.1) == (v, i)) && layouts.contains_key(&y) && layouts.get(&a) != layouts.get(&y))
            .filter_map(|(v, i, a, _)| Some((v, i, layouts.get(&a)?.clone())))
            .collect();
        if late.is_empty() {
            break layouts;
        }
        seeds.extend(late);
    };
    let mut access_width = HashMap::new();
    for (v, ptr) in memory_ops(f) {
        let shape = &f.ty(ptr).shape;
        let w = if shape.is_empty() { 1 } else { allowed[&v].min(layouts[&v].contiguous_regs(fast.get(&v).copied().unwrap_or(shape.len() - 1))) };
        access_width.insert(v, w);
    }
    let shared = f.walk().into_iter().filter_map(|v| Some((v, operand_swizzle(f, v, &fast, &dots)?))).collect();
    Plan { num_warps, layouts, access_width, defaults, axis: axis.to_vec(), smem: Default::default(), produced: HashMap::new(), shared, dots, overlapped: Default::default(), async_buffers: Default::default(), tma: vec![], producer_warps: 0, min_programs: 1 }
}

/// Carried value `i` of the loop or branch `owner` is in layout `l`: its argument, initial
/// value and new values (or the branches' values) are asked for `l`.
fn carried(f: &Function, owner: Value, i: usize, l: &LinearLayout, wants: &mut HashMap<Value, Vec<LinearLayout>>, layouts: &mut HashMap<Value, LinearLayout>) {
    let mut ask = |x: Value| {
        if !f.ty(x).is_scalar() {
            wants.entry(x).or_default().insert(0, l.clone());
        }
    };
    match &f.inst(owner).op {
        Op::For { init, body, .. } => {
            ask(init[i]);
            ask(body.yields[i]);
            layouts.insert(body.args[i + 1], l.clone());
        }
        Op::If { then, els, .. } => {
            ask(then.yields[i]);
            ask(els.yields[i]);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinOp, Builder, DotPrecision, Loc, Operand, ParamKind};
    use crate::layout::InDim;
    use crate::DType;

    /// `x[rows, cols]` loaded row-major from parameter `p` of `b`.
    fn tile(b: &mut Builder, p: usize, rows: i64, cols: i64) -> Value {
        let l = Loc::new(1, 1);
        let (r, c) = (b.arange(0, rows, l).unwrap(), b.arange(0, cols, l).unwrap());
        let (r, c) = (b.expand_dims(r, 1, l).unwrap(), b.expand_dims(c, 0, l).unwrap());
        let r = b.binary(BinOp::Mul, r, Operand::Int(cols), l).unwrap();
        let off = b.binary(BinOp::Add, r, c, l).unwrap();
        let ptr = b.add_ptr(b.param(p), off, l).unwrap();
        b.load(ptr, None, None, l).unwrap()
    }

    /// An accumulator carried by a loop nested in another (attention's backward sums over
    /// query heads around its loop over query tiles) stays in the accumulator's fragments
    /// through both loops: no conversion in either, one after them for the store.
    #[test]
    fn nested_loops_carry_an_accumulator_in_its_fragments() {
        let l = Loc::new(1, 1);
        let ptr = |e, w| ParamKind::Ptr { elem: e, writable: w };
        let mut b = Builder::new("k", &[("a", ptr(DType::BF16, false)), ("c", ptr(DType::F32, true)), ("n", ParamKind::Scalar(DType::I32))]);
        let (x, y) = (tile(&mut b, 0, 64, 32), tile(&mut b, 0, 32, 64));
        let acc0 = b.full(&[64, 64], Operand::Float(0.0), DType::F32, l).unwrap();
        let (_, outer) = b.begin_for(Operand::Int(0), b.param(2), Operand::Int(1), &[Operand::V(acc0)], l).unwrap();
        let (_, inner) = b.begin_for(Operand::Int(0), b.param(2), Operand::Int(1), &[outer[0]], l).unwrap();
        let Operand::V(acc) = inner[0] else { unreachable!() };
        let d = b.dot(x, y, Some(acc), DotPrecision::Ieee, l).unwrap();
        let got = b.end_for(&[Operand::V(d)], &["acc"], l).unwrap();
        let res = b.end_for(&got, &["acc"], l).unwrap();
        let Operand::V(res) = res[0] else { unreachable!() };
        let (r, c) = (b.arange(0, 64, l).unwrap(), b.arange(0, 64, l).unwrap());
        let (r, c) = (b.expand_dims(r, 1, l).unwrap(), b.expand_dims(c, 0, l).unwrap());
        let r = b.binary(BinOp::Mul, r, Operand::Int(64), l).unwrap();
        let off = b.binary(BinOp::Add, r, c, l).unwrap();
        let py = b.add_ptr(b.param(1), off, l).unwrap();
        b.store(py, res, None, l).unwrap();
        let mut f = b.finish().unwrap();
        crate::passes::plan(&mut f, 4, 1, false, false, false, false, false);
        let text = f.to_string();
        let outer_loop = f.body.insts.iter().copied().find(|&v| matches!(f.inst(v).op, Op::For { .. })).unwrap();
        let Op::For { body, .. } = &f.inst(outer_loop).op else { unreachable!() };
        let converts = f.walk_from(&body.body.insts).into_iter().filter(|&v| matches!(f.inst(v).op, Op::ConvertLayout(_))).count();
        assert_eq!(converts, 0, "{text}");
        let after = f.body.insts.iter().filter(|&&v| matches!(f.inst(v).op, Op::ConvertLayout(_))).count();
        assert_eq!(after, 1, "{text}");
    }

    /// After the loop, the accumulator's epilogue (`acc * scale`, cast to bf16) happens in
    /// the accumulator's fragments and the store converts the bf16 result (half the bytes
    /// of converting the f32 accumulator first); with a block loaded from memory added in
    /// (a residual) the accumulator converts instead, and the load stays in the store's
    /// coalesced layout.
    #[test]
    fn an_epilogue_runs_in_the_accumulator_fragments_unless_it_reads_a_block() {
        let l = Loc::new(1, 1);
        let ptr = |e, w| ParamKind::Ptr { elem: e, writable: w };
        for residual in [false, true] {
            let mut b = Builder::new("k", &[("a", ptr(DType::BF16, false)), ("c", ptr(DType::BF16, true)), ("n", ParamKind::Scalar(DType::I32))]);
            let (x, y) = (tile(&mut b, 0, 64, 32), tile(&mut b, 0, 32, 64));
            let acc0 = b.full(&[64, 64], Operand::Float(0.0), DType::F32, l).unwrap();
            let (_, carried) = b.begin_for(Operand::Int(0), b.param(2), Operand::Int(1), &[Operand::V(acc0)], l).unwrap();
            let Operand::V(acc) = carried[0] else { unreachable!() };
            let d = b.dot(x, y, Some(acc), DotPrecision::Ieee, l).unwrap();
            let res = b.end_for(&[Operand::V(d)], &["acc"], l).unwrap();
            let Operand::V(res) = res[0] else { unreachable!() };
            let mut y = b.binary(BinOp::Mul, res, Operand::Float(0.5), l).unwrap();
            if residual {
                let r = tile(&mut b, 1, 64, 64);
                let r = b.cast(r, DType::F32, l).unwrap();
                y = b.binary(BinOp::Add, y, r, l).unwrap();
            }
            let out = b.cast(y, DType::BF16, l).unwrap();
            let (r, c) = (b.arange(0, 64, l).unwrap(), b.arange(0, 64, l).unwrap());
            let (r, c) = (b.expand_dims(r, 1, l).unwrap(), b.expand_dims(c, 0, l).unwrap());
            let r = b.binary(BinOp::Mul, r, Operand::Int(64), l).unwrap();
            let off = b.binary(BinOp::Add, r, c, l).unwrap();
            let po = b.add_ptr(b.param(1), off, l).unwrap();
            b.store(po, out, None, l).unwrap();
            let mut f = b.finish().unwrap();
            crate::passes::plan(&mut f, 4, 1, false, false, false, false, false);
            let text = f.to_string();
            let converted: Vec<DType> = f.body.insts.iter().filter(|&&v| matches!(f.inst(v).op, Op::ConvertLayout(_))).map(|&v| f.ty(v).dtype).collect();
            let expect = if residual { DType::F32 } else { DType::BF16 };
            assert_eq!(converted, vec![expect], "residual {residual}:\n{text}");
        }
    }

    /// The staged buffers of a tf32 `a[64, 32] @ b[32, 64]` get swizzles under which every
    /// 32-bit read of a `b` fragment (4 rows `t` by 8 columns `g`) and every `ldmatrix`
    /// phase of `a` hits 32 distinct banks; row-major storage would not.
    #[test]
    fn tf32_operand_buffers_are_read_without_bank_conflicts() {
        let l = Loc::new(1, 1);
        let ptr = |w| ParamKind::Ptr { elem: DType::F32, writable: w };
        let mut b = Builder::new("k", &[("a", ptr(false)), ("b", ptr(false)), ("c", ptr(true))]);
        let (x, y) = (tile(&mut b, 0, 64, 32), tile(&mut b, 1, 32, 64));
        let acc = b.full(&[64, 64], Operand::Float(0.0), DType::F32, l).unwrap();
        b.dot(x, y, Some(acc), DotPrecision::Tf32, l).unwrap();
        let mut f = b.finish().unwrap();
        crate::passes::stage::run(&mut f, 4);
        let dot = f.walk().into_iter().find(|&v| matches!(f.inst(v).op, Op::Dot { .. })).unwrap();
        let Op::Dot { a, b: bb, .. } = f.inst(dot).op else { unreachable!() };
        let buf = |x: Value| match f.inst(x).op {
            Op::LocalLoad(buf) => buf,
            _ => panic!("not staged"),
        };
        let [la, lb, _] = dot_layouts(&f, dot, 4).unwrap();
        // Banks of every 32-bit fragment read, one register of all 32 lanes of warp 0.
        let conflict_free = |frag: &LinearLayout, shared: &LinearLayout| {
            let inv = shared.invert().unwrap();
            (0..frag.num_regs() as u32).all(|r| {
                let mut banks: Vec<u32> = (0..32)
                    .map(|lane| {
                        let c = frag.apply(r, lane, 0);
                        inv.apply_in(&[(InDim::Coord(0), c[0]), (InDim::Coord(1), c[1])])[0] % 32
                    })
                    .collect();
                banks.sort();
                banks.dedup();
                banks.len() == 32
            })
        };
        let dots = dot_plans(&f, 4, false);
        let sb = operand_swizzle(&f, buf(bb), &HashMap::new(), &dots).expect("b is swizzled");
        assert!(conflict_free(&lb, &sb), "b reads conflict");
        assert!(!conflict_free(&lb, &LinearLayout::swizzled_shared(&[32, 64], &[1, 0], 8, 1, 1)), "row-major b reads would not conflict: the test shows nothing");
        let sa = operand_swizzle(&f, buf(a), &HashMap::new(), &dots).expect("a is swizzled");
        let addr = LinearLayout::ldmatrix_x4(&la, &sa, false, 32).expect("a loads with ldmatrix");
        for phase in 0..4 {
            let mut g: Vec<u32> = (0..8).map(|j| addr.apply_in(&[(InDim::Lane, 8 * phase + j)])[0] / 4 % 8).collect();
            g.sort();
            g.dedup();
            assert_eq!(g.len(), 8, "a ldmatrix phase {phase}");
        }
    }
}
