//! The fusion pass: which nodes go into which kernel, and what each kernel loads and stores.
//!
//! Input: a [`Graph`] with outputs. Output: a [`Partition`], a list of [`Group`]s in launch
//! order (one kernel each) and the intermediate buffers the groups pass to each other.
//!
//! The rules:
//!
//! - **Spaces.** A group runs over one iteration space ([`Space`]): `Flat(shape)`, every
//!   element of a shape, or `Rows(shape)`, programs over the rows of the shape's last axis,
//!   which is where reductions (along the last axis) happen. A reduction's space is
//!   `Rows` of its input's shape; an elementwise node joins the `Rows` space of its
//!   operands when they have one (exactly one) and its shape broadcasts to it (softmax's
//!   `x - max`, `e / sum`; a norm's scale), and is `Flat` over its own shape otherwise.
//!   Pointwise nodes without reductions behind them are recomputed wherever they are
//!   needed (their inputs read through broadcast index maps, see
//!   [`codegen`](super::codegen)). Views and concatenations are pointwise in this sense (an index map, no
//!   data movement of their own) but never join a `Rows` space: a view reads its operand
//!   at other elements than its own, so a view of a rows value reads it from memory.
//! - **Matrix products.** Each is a group of its own ([`Space::Matmul`]) on the library's
//!   batched matmul, reading its operands from memory: a graph input or a stored value,
//!   through the permutations and expansions (and a reshape right above the stored
//!   value) between it and the operand (strides, [`strided_root`]); an operand computed otherwise (arithmetic, a reshape, a
//!   `repeat_interleave`) is stored by its group first. Its **epilogue** joins it: a
//!   pointwise node of the product's shape that reads the product (or its epilogue), with
//!   everything else it needs ready by the product's stage (`epilogue`), is computed on
//!   the product's tile in registers ([`codegen::matmul_kernel`](super::codegen::matmul_kernel):
//!   bias, activation, residual, casts; a linear layer is one kernel). The product and its
//!   epilogue values are stored only where something else reads them (a view, a
//!   reduction, another product). Without an epilogue the group runs the library's batched
//!   matmul ([`Fusion::NoEpilogues`] keeps every product alone, for comparisons).
//! - **Attention.** A product `softmax(q @ k^T * scale) @ v` that
//!   [`attention`](super::attention) recognises is a group of its own
//!   ([`Space::Attention`]): one flash-attention launch reading q, k and v through strides
//!   (stored first when computed), and the tensor of a mask or bias from data, which its
//!   step packs into the kernel's `ScoreBias` arguments first; the scores, the softmax and the repeated key/value
//!   heads are not computed unless something else reads them. A result only read as
//!   `.transpose(1, 2)` is written in that layout (the kernel takes output strides), so
//!   the `.reshape(B, T, H * D)` of the seed costs nothing. Near misses are listed in the
//!   dump with the reason. Its gradients ([`Op::AttentionGrad`], one flash-attention
//!   backward) read q, k, v and the output's gradient in the projections' `[B, T, H, D]`
//!   layout and write the gradients in it when that is how they are produced and read
//!   (`bthd_view`), and then read the forward's output and log-sum-exp instead of
//!   recomputing the forward. A gradient the backward would write to two buffers (a graph
//!   output also read by another kernel, or two outputs) goes to one intermediate buffer
//!   and a kernel of its own copies it to the outputs (`one_store_per_gradient`); so does
//!   a forward result, the copies computing the views between the stored values
//!   (`one_store_per_attention`).
//! - **Boundaries.** A value of a `Rows` space that a node of another space reads (a row
//!   sum scaling a tensor of another shape, a reduction of a reduction's result) is
//!   stored to an intermediate buffer by its group and loaded by the reader's. A node's
//!   stage counts the boundaries behind it; groups are one per (space, stage) that has
//!   something to store, launched by stage, so a group only reads what earlier groups
//!   wrote.
//! - **[`Fusion::On`]**: groups as above. A group computes every node its stores need
//!   (back to graph inputs and boundaries); a node used by several consumers is computed
//!   once (nodes are hash-consed, and each is emitted once per kernel); an output that is
//!   also an intermediate of another output of the same group is stored once and used
//!   from registers. Softmax, log-softmax, RMSNorm and LayerNorm (with their elementwise
//!   prologues and epilogues) are one kernel each.
//! - **Store or recompute** (the cost model): a pointwise value that
//!   several groups compute (each from the loads under it) is stored once by a group of
//!   its own and read by the others when that moves fewer bytes: recomputed, it costs the
//!   loads each group makes only for it; stored, its loads once, its write, a read per
//!   group and a launch ([`LAUNCH_BYTES`]). One value at a time, the largest saving first
//!   (ties to the value nearest its readers), the partition redone after each; the dump
//!   lists what was stored and the bytes it saves.
//! - **[`Fusion::Off`]**: one group per node (the comparison baseline): each reads its
//!   operands from the graph's inputs or from intermediate buffers and stores its result.
//!
//! What it cannot do yet: the cost model counts bytes, not arithmetic (a long pointwise
//! chain read through an `expand` or `repeat_interleave` is recomputed per read when its
//! loads are cheap: no "materialise under broadcast amplification" rule, see the fact
//! sheet's §2); a reduction along another axis than the last (a transpose
//! view, `Tensor::reduce`) stores its result to transpose it back; no cap on group size.
//! (Rows longer than one program holds, [`codegen::MAX_ROW`](super::codegen::MAX_ROW),
//! are one group like the others: its kernel loops over them.)

use super::{Graph, GraphError, Node, NodeId, Op};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// Whether to fuse.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum Fusion {
    /// One kernel per output shape (see the [module docs](self)).
    #[default]
    On,
    /// One kernel per node, intermediates through memory.
    Off,
    /// As [`Fusion::On`] without the cost model: a value several groups need is
    /// recomputed by each (for comparisons).
    Recompute,
    /// As [`Fusion::On`] with matrix products alone: the product is stored and its
    /// pointwise consumers are kernels of their own (for comparisons).
    NoEpilogues,
}

/// Where a group reads a value from.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Source {
    /// Graph input `i`.
    Input(usize),
    /// Intermediate buffer `i` of the plan.
    Intermediate(usize),
}

/// Where a group writes a value to.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Dest {
    /// Graph output `i`.
    Output(usize),
    /// Intermediate buffer `i` of the plan.
    Intermediate(usize),
}

/// The iteration space of a group (see the [module docs](self)).
#[derive(Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum Space {
    /// Every element of a shape.
    Flat(Vec<usize>),
    /// One program per row of a shape's last axis.
    Rows(Vec<usize>),
    /// A matrix product, on the library's batched matmul kernel.
    Matmul(NodeId),
    /// A recognised attention ([`attention`](super::attention)), one flash-attention launch.
    Attention(NodeId),
    /// The gradients of one attention ([`Op::AttentionGrad`] nodes of the same operands,
    /// keyed by its `dq` node): the library's flash-attention backward.
    AttentionGrad(NodeId),
}

/// One kernel's worth of nodes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Group {
    /// The iteration space's shape: of what the group stores (flat), or of the rows it
    /// reduces.
    pub shape: Vec<usize>,
    /// `Some(r)`: programs over rows of `r` elements (`shape`'s last axis), reductions
    /// along it; `None`: elementwise over `shape`.
    pub row: Option<usize>,
    /// Values read from memory, each once, in parameter order.
    pub loads: Vec<(NodeId, Source)>,
    /// Nodes computed in the kernel, in topological order, each once (constants included).
    pub nodes: Vec<NodeId>,
    /// Values written, in parameter order (after the loads).
    pub stores: Vec<(NodeId, Dest)>,
    /// `Some(id)`: the group is matrix product `id` on the library's batched matmul,
    /// its two loads the buffers its operands are read from (through the strides of
    /// the transposes and broadcasts between them, [`strided_root`]).
    pub matmul: Option<NodeId>,
    /// For a matrix product, per operand: computed in the kernel (its **prologue**: the
    /// pointwise nodes and views between the operand and the buffers under it, evaluated
    /// on each tile as it is loaded) rather than read from a buffer through strides (then
    /// `loads` starts with that buffer).
    pub prologue: [bool; 2],
    /// `Some(a)`: the group is attention `a` on the flash-attention kernel, its three
    /// loads the buffers `q`, `k` and `v` are read from.
    pub attention: Option<super::attention::Attention>,
    /// `Some(a)`: the group is the flash-attention backward of `a`'s operands, its loads
    /// `q`, `k`, `v` and `dout` (row-major `[B, H, T, D]`, stored first where computed;
    /// or, when they are transposes of `[B, T, H, D]` buffers and every gradient is only
    /// read transposed back, those buffers, the group then storing the gradients'
    /// transposes), and a fifth, the forward's output, when the same attention's forward
    /// is computed in that layout (its log-sum-exp is read too: the forward is not
    /// recomputed); its stores the gradients ([`Op::AttentionGrad`]) that are needed.
    pub attention_grad: Option<super::AttentionGrad>,
}

impl Group {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The fusion pass's result.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Partition {
    /// In launch order.
    pub groups: Vec<Group>,
    /// The node each intermediate buffer holds.
    pub intermediates: Vec<NodeId>,
    /// Products of a softmax that did not match attention, and why (for the dump).
    pub near_misses: Vec<(NodeId, &'static str)>,
    /// Pointwise values stored once instead of recomputed by each group that reads them,
    /// because that moves fewer bytes (the cost model, see the module docs), with the bytes it saves.
    pub stored_by_cost: Vec<(NodeId, usize)>,
    /// The graph's nodes, for printing.
    nodes: Vec<Node>,
    inputs: Vec<String>,
    outputs: Vec<String>,
}

/// Partition the nodes `graph`'s outputs need into groups. Errors: no outputs, or an
/// error recorded while building the graph.
pub fn partition(graph: &Graph, fusion: Fusion) -> Result<Partition, GraphError> {
    let outputs = graph.outputs();
    if outputs.is_empty() {
        return Err(GraphError::NoOutputs);
    }
    let nodes = graph.nodes();
    let input_of = |id: NodeId| match nodes[id.index()].op {
        Op::Input(i) => Some(i),
        _ => None,
    };
    let mut groups = vec![];
    let mut intermediates = vec![];
    let mut near_misses = vec![];
    let mut stored_by_cost = vec![];
    match fusion {
        Fusion::On | Fusion::Recompute | Fusion::NoEpilogues => {
            // Recompute or store: a pointwise value computed by several groups is stored
            // once when that moves fewer bytes ([`materialize`]), one value at a time,
            // the best saving first, until none saves anything.
            let (mut forced, mut unmatched) = (BTreeSet::new(), BTreeSet::new());
            loop {
                let (g, mut i, m) = fused(&nodes, &outputs, &forced, fusion != Fusion::NoEpilogues, &unmatched);
                // An attention whose result would be stored to two buffers (a graph output
                // also read by another kernel: its launch writes one) stores it once and a
                // copy follows ([`one_store_per_attention`]); where no stored value is a
                // view of the others', it runs as written.
                let (g, twice) = one_store_per_attention(&nodes, g, &mut i);
                if !twice.is_empty() {
                    unmatched.extend(twice);
                    continue;
                }
                match materialize(&nodes, &g).filter(|_| fusion != Fusion::Recompute) {
                    Some((id, saved)) if forced.len() < MAX_MATERIALIZED => {
                        forced.insert(id);
                        stored_by_cost.push((id, saved));
                    }
                    _ => {
                        (groups, intermediates, near_misses) = (g, i, m);
                        break;
                    }
                }
            }
        }
        Fusion::Off => {
            let live = ancestors(outputs.iter().map(|o| o.1), |id| nodes[id.index()].op.operands());
            // Nodes other computed nodes read: they go through intermediate buffers.
            let mut slot: HashMap<NodeId, usize> = HashMap::new();
            for &id in &live {
                // (The tensor of an attention gradient's mask or bias from data is read from
                // memory even when it is a tril.)
                let data = match nodes[id.index()].op {
                    Op::AttentionGrad(a) => a.data.map(|d| d.read.1),
                    _ => None,
                };
                for a in nodes[id.index()].op.operands() {
                    let computed_by_readers = matches!(nodes[a.index()].op, Op::Const(_) | Op::Tril(_)) && data != Some(a);
                    if input_of(a).is_none() && !computed_by_readers && !slot.contains_key(&a) {
                        slot.insert(a, intermediates.len());
                        intermediates.push(a);
                    }
                }
            }
            for &id in &live {
                let node = &nodes[id.index()];
                if matches!(node.op, Op::Const(_) | Op::Tril(_)) && !outputs.iter().any(|o| o.1 == id) && !slot.contains_key(&id) {
                    continue; // computed by the kernels that read it
                }
                let mut stores: Vec<(NodeId, Dest)> = slot.get(&id).map(|&j| (id, Dest::Intermediate(j))).into_iter().collect();
                stores.extend(outputs.iter().enumerate().filter(|(_, (_, o))| *o == id).map(|(k, _)| (id, Dest::Output(k))));
                if stores.is_empty() {
                    continue; // an input nobody stores: read by its consumers
                }
                let (mut loads, mut computed) = (vec![], vec![]);
                match input_of(id) {
                    Some(i) => loads.push((id, Source::Input(i))),
                    None => {
                        for a in node.op.operands() {
                            let src = match (input_of(a), slot.get(&a)) {
                                (Some(i), _) => Source::Input(i),
                                (None, Some(&j)) => Source::Intermediate(j),
                                (None, None) => {
                                    if !computed.contains(&a) {
                                        computed.push(a); // a constant
                                    }
                                    continue;
                                }
                            };
                            if !loads.iter().any(|l: &(NodeId, Source)| l.0 == a) {
                                loads.push((a, src));
                            }
                        }
                        computed.push(id);
                    }
                }
                let (shape, row) = match node.op {
                    Op::Reduce(_, x) => (nodes[x.index()].shape.clone(), nodes[x.index()].shape.last().copied()),
                    _ => (node.shape.clone(), None),
                };
                let matmul = matches!(node.op, Op::Matmul(..)).then_some(id);
                let attention_grad = match node.op {
                    Op::AttentionGrad(a) => Some(a),
                    _ => None,
                };
                if let Some(a) = attention_grad {
                    // The four operands, in order, even when two are one buffer, and the tensor
                    // of a mask or bias from data.
                    let src = |x: NodeId| input_of(x).map(Source::Input).unwrap_or_else(|| Source::Intermediate(slot[&x]));
                    loads = [a.q, a.k, a.v, a.dout].into_iter().chain(a.data.map(|d| d.read.1)).map(|x| (x, src(x))).collect();
                    computed = vec![id];
                }
                if let Some(m) = matmul {
                    // Both operands, in order, even when they are one buffer.
                    let Op::Matmul(a, b) = node.op else { unreachable!() };
                    let src = |x: NodeId| input_of(x).map(Source::Input).unwrap_or_else(|| Source::Intermediate(slot[&x]));
                    loads = vec![(a, src(a)), (b, src(b))];
                    computed = vec![m];
                }
                groups.push(Group { shape, row, loads, nodes: computed, stores, matmul, prologue: [false; 2], attention: None, attention_grad });
            }
        }
    }
    let groups = one_store_per_gradient(&nodes, groups, &mut intermediates);
    let inputs = graph.inputs().into_iter().map(|i| i.0).collect();
    Ok(Partition { groups, intermediates, near_misses, stored_by_cost, nodes, inputs, outputs: outputs.into_iter().map(|o| o.0).collect() })
}

/// The groups with each attention's group storing one value once, and the attentions
/// that cannot: the flash-attention forward writes its result to one buffer, so where its
/// group stores several values (the result, views of it: a graph output also read by
/// another kernel, or two outputs), the one the others are views of (through views
/// alone) goes to an intermediate buffer (the one it has, or a new one), and right after
/// it a group per stored value copies it from there to that value's other destinations,
/// computing the views on the way. (An attention's group stores its result and the views
/// `spaces` writes it as, all views of the result, so a root always exists; an attention
/// without one would be returned, to run as written.)
fn one_store_per_attention(nodes: &[Node], groups: Vec<Group>, intermediates: &mut Vec<NodeId>) -> (Vec<Group>, Vec<NodeId>) {
    // The views from `root` to `id` (in the order computed), if `id` is `root` through
    // views alone.
    let views_to = |root: NodeId, id: NodeId| -> Option<Vec<NodeId>> {
        let mut chain = vec![];
        let mut x = id;
        while x != root {
            let Op::View(_, a) = nodes[x.index()].op else { return None };
            chain.push(x);
            x = a;
        }
        chain.reverse();
        Some(chain)
    };
    let (mut out, mut refused) = (Vec::with_capacity(groups.len()), vec![]);
    for mut g in groups {
        let Some(a) = g.attention.filter(|_| g.stores.len() > 1) else {
            out.push(g);
            continue;
        };
        let ids: Vec<NodeId> = g.stores.iter().map(|s| s.0).collect();
        let Some(root) = ids.iter().copied().find(|&r| ids.iter().all(|&id| views_to(r, id).is_some())) else {
            refused.push(a.out);
            out.push(g);
            continue;
        };
        let k = intermediate_of(&g.stores, root, intermediates);
        // One copy a stored value, to each of its other destinations.
        let mut copies: Vec<Group> = vec![];
        for &(id, d) in g.stores.iter().filter(|&&s| s != (root, Dest::Intermediate(k))) {
            match copies.iter_mut().find(|c| c.stores[0].0 == id) {
                Some(c) => c.stores.push((id, d)),
                None => copies.push(copy_group(nodes, (root, k), views_to(root, id).expect("checked"), vec![(id, d)])),
            }
        }
        g.stores = vec![(root, Dest::Intermediate(k))];
        out.push(g);
        out.extend(copies);
    }
    (out, refused)
}

/// The intermediate buffer value `id` goes to among `stores`, or a new one.
fn intermediate_of(stores: &[(NodeId, Dest)], id: NodeId, intermediates: &mut Vec<NodeId>) -> usize {
    stores.iter().find_map(|&(x, d)| if let (true, Dest::Intermediate(k)) = (x == id, d) { Some(k) } else { None }).unwrap_or_else(|| {
        intermediates.push(id);
        intermediates.len() - 1
    })
}

/// A group that copies value `root` from intermediate buffer `k` to `stores` (of one
/// value: `root`, or the last of `views`, views of `root` computed on the way).
fn copy_group(nodes: &[Node], (root, k): (NodeId, usize), views: Vec<NodeId>, stores: Vec<(NodeId, Dest)>) -> Group {
    let id = stores[0].0;
    Group { shape: nodes[id.index()].shape.clone(), row: None, loads: vec![(root, Source::Intermediate(k))], nodes: views, stores, matmul: None, prologue: [false; 2], attention: None, attention_grad: None }
}

/// The groups with each value an attention backward's group stores stored once: the
/// flash-attention backward writes each gradient to one buffer, so one that is a graph
/// output also read by another kernel (or two outputs) goes to an intermediate buffer (the
/// one it has, or a new one), and a group of its own right after copies it from there to
/// the outputs.
fn one_store_per_gradient(nodes: &[Node], groups: Vec<Group>, intermediates: &mut Vec<NodeId>) -> Vec<Group> {
    let mut out = Vec::with_capacity(groups.len());
    for mut g in groups {
        if g.attention_grad.is_none() {
            out.push(g);
            continue;
        }
        let mut copies = vec![];
        let mut stores: Vec<(NodeId, Dest)> = vec![];
        for &(id, _) in &g.stores {
            if stores.iter().any(|s| s.0 == id) {
                continue;
            }
            let dests: Vec<Dest> = g.stores.iter().filter(|s| s.0 == id).map(|s| s.1).collect();
            if dests.len() == 1 {
                stores.push((id, dests[0]));
                continue;
            }
            let k = intermediate_of(&g.stores, id, intermediates);
            stores.push((id, Dest::Intermediate(k)));
            let outputs = dests.into_iter().filter(|d| matches!(d, Dest::Output(_))).map(|d| (id, d)).collect();
            copies.push(copy_group(nodes, (id, k), vec![], outputs));
        }
        g.stores = stores;
        out.push(g);
        out.extend(copies);
    }
    out
}

/// The groups of [`Fusion::On`], with the nodes of `forced` stored by their group (as
/// boundaries) instead of recomputed by their readers', and the products' pointwise
/// consumers in their kernels where `epilogues`; and the intermediates and the
/// attention near misses.
/// Attentions whose results are in `unmatched` run as written (a near miss).
#[allow(clippy::type_complexity)]
fn fused(nodes: &[Node], outputs: &[(String, NodeId)], forced: &BTreeSet<NodeId>, epilogues: bool, unmatched: &BTreeSet<NodeId>) -> (Vec<Group>, Vec<NodeId>, Vec<(NodeId, &'static str)>) {
    let input_of = |id: NodeId| match nodes[id.index()].op {
        Op::Input(i) => Some(i),
        _ => None,
    };
    let (mut groups, mut intermediates) = (vec![], vec![]);
    // Attention first: a match reads its q, k and v from memory, and nothing
    // between them and its result is computed (unless used elsewhere).
    let all = ancestors(outputs.iter().map(|o| o.1), |id| nodes[id.index()].op.operands());
    let attn: HashMap<NodeId, super::attention::Attention> = super::attention::find(nodes, &all).into_iter().filter(|a| !unmatched.contains(&a.out)).map(|a| (a.out, a)).collect();
    let mut near_misses = super::attention::near_misses(nodes, &all);
    near_misses.extend(unmatched.iter().map(|&id| (id, "an attention whose results would be stored to two buffers, neither a view of the other (its launch writes one, which a copy can only view): run as written")));
    let live = ancestors(outputs.iter().map(|o| o.1), |id| match attn.get(&id) {
        Some(a) => operand_roots(a),
        None => nodes[id.index()].op.operands(),
    });
    let outs: BTreeSet<NodeId> = outputs.iter().map(|o| o.1).collect();
    let (space, stage, boundary, saved_forward) = spaces(nodes, &live, &attn, &outs, forced, epilogues);
    let key = |id: NodeId| (stage[&id], space.get(&id).cloned().unwrap_or_else(|| Space::Flat(nodes[id.index()].shape.clone())));
    // What each (stage, space) stores: its outputs, and its values read elsewhere;
    // groups in the order of their first output, by stage.
    let mut stored: Vec<(GroupKey, Vec<(NodeId, Dest)>)> = vec![];
    let mut store = |k: (usize, Space), s: (NodeId, Dest)| match stored.iter_mut().find(|(x, _)| *x == k) {
        Some((_, v)) => v.push(s),
        None => stored.push((k, vec![s])),
    };
    for (k, (_, id)) in outputs.iter().enumerate() {
        store(key(*id), (*id, Dest::Output(k)));
    }
    for &b in &boundary {
        store(key(b), (b, Dest::Intermediate(intermediates.len())));
        intermediates.push(b);
    }
    // Flat values of a rows group's shape and stage go with it (its programs cover
    // the same elements): `y` beside `y.amax(-1)` is one kernel, not two.
    let rows: Vec<(usize, Space)> = stored.iter().filter(|((_, sp), _)| matches!(sp, Space::Rows(_))).map(|(k, _)| k.clone()).collect();
    for (stage, sp) in rows {
        let Space::Rows(shape) = &sp else { unreachable!() };
        if let Some(i) = stored.iter().position(|((st, x), _)| *st == stage && *x == Space::Flat(shape.clone())) {
            let (_, moved) = stored.remove(i);
            let j = stored.iter().position(|(k, _)| *k == (stage, sp.clone())).expect("the rows group");
            stored[j].1.extend(moved);
        }
    }
    stored.sort_by_key(|((stage, _), _)| *stage);
    let slot = |id: NodeId| intermediates.iter().position(|&b| b == id);
    for ((st, sp), stores) in stored {
        // A value another group stored at an earlier stage is read from memory; one stored
        // by a group of this stage (made a boundary by a reader processed after this
        // group's nodes) is recomputed here: that group may run after this one.
        let earlier = |id: NodeId| boundary.contains(&id) && stage[&id] < st;
        // A library kernel's operands, read from a graph input or a stored value.
        let from_memory = |root: NodeId| match input_of(root) {
            Some(i) => (root, Source::Input(i)),
            None => (root, Source::Intermediate(slot(root).expect("a library kernel's operand is stored"))),
        };
        if let Space::Attention(id) = sp {
            let a = attn[&id];
            let loads = operand_roots(&a).into_iter().map(from_memory).collect();
            groups.push(Group { shape: nodes[id.index()].shape.clone(), row: None, loads, nodes: vec![id], stores, matmul: None, prologue: [false; 2], attention: Some(a), attention_grad: None });
            continue;
        }
        if let Space::Matmul(id) = sp {
            // The operands' buffers, then what the epilogue loads (the product itself is
            // the main loop's).
            let Op::Matmul(a, b) = nodes[id.index()].op else { unreachable!("a matmul space holds its product") };
            let prologue = [a, b].map(|x| computed_operand(nodes, x, &earlier));
            let mut loads: Vec<(NodeId, Source)> = [a, b].into_iter().zip(prologue).filter(|(_, p)| !p).map(|(x, _)| from_memory(strided_root(nodes, x))).collect();
            let mut roots: Vec<NodeId> = stores.iter().map(|s| s.0).collect();
            roots.extend([a, b].into_iter().zip(prologue).filter(|(_, p)| *p).map(|(x, _)| x));
            let (more, computed) = walk(nodes, &roots, &earlier, Some(id), &slot);
            loads.extend(more);
            groups.push(Group { shape: nodes[id.index()].shape.clone(), row: None, loads, nodes: computed, stores, matmul: Some(id), prologue, attention: None, attention_grad: None });
            continue;
        }
        if let Space::AttentionGrad(key) = sp {
            let Op::AttentionGrad(a) = nodes[key.index()].op else { unreachable!("keyed by an attention gradient") };
            // In the [B, T, H, D] layout (its stores are the gradients' transposes): the
            // operands' buffers under their views.
            let bthd = stores.iter().any(|s| matches!(nodes[s.0.index()].op, Op::View(..)));
            let mut loads: Vec<(NodeId, Source)> = [a.q, a.k, a.v, a.dout].into_iter().map(|x| from_memory(if bthd { strided_root(nodes, x) } else { x })).collect();
            // The forward's output, when the backward reuses it (and its log-sum-exp); the
            // tensor a mask or bias from data is read from.
            loads.extend(saved_forward.get(&key).map(|&w| from_memory(w)));
            loads.extend(a.data.map(|d| from_memory(d.read.1)));
            // The gradients (and the transposes stored).
            let computed = stores
                .iter()
                .flat_map(|s| match nodes[s.0.index()].op {
                    Op::View(_, g) if bthd => vec![g, s.0],
                    _ => vec![s.0],
                })
                .collect();
            groups.push(Group { shape: nodes[a.q.index()].shape.clone(), row: None, loads, nodes: computed, stores, matmul: None, prologue: [false; 2], attention: None, attention_grad: Some(a) });
            continue;
        }
        let roots: Vec<NodeId> = stores.iter().map(|s| s.0).collect();
        let (loads, computed) = walk(nodes, &roots, &earlier, None, &slot);
        let (shape, row) = match sp {
            Space::Flat(s) => (s, None),
            Space::Rows(s) => (s.clone(), s.last().copied()),
            Space::Matmul(_) | Space::Attention(_) | Space::AttentionGrad(_) => unreachable!("handled above"),
        };
        groups.push(Group { shape, row, loads, nodes: computed, stores, matmul: None, prologue: [false; 2], attention: None, attention_grad: None });
    }

    (groups, intermediates, near_misses)
}

/// What a group loads and computes: back from `roots` (its stores, and a product's
/// computed operands) to graph inputs and values stored by groups of earlier stages
/// (`earlier`: loads, in node order), and the nodes between (computed, in topological
/// order). `product`: a matrix product the group computes in its main loop (its operands
/// are not walked from it).
fn walk(nodes: &[Node], roots: &[NodeId], earlier: &dyn Fn(NodeId) -> bool, product: Option<NodeId>, slot: &dyn Fn(NodeId) -> Option<usize>) -> (Vec<(NodeId, Source)>, Vec<NodeId>) {
    let (mut seen, mut stack) = (BTreeSet::new(), roots.to_vec());
    let mut loads = BTreeMap::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        if let Op::Input(i) = nodes[id.index()].op {
            loads.insert(id, Source::Input(i));
        } else if earlier(id) {
            loads.insert(id, Source::Intermediate(slot(id).expect("a boundary has a buffer")));
        } else if Some(id) != product {
            stack.extend(nodes[id.index()].op.operands());
        }
    }
    let computed = seen.into_iter().filter(|id| !loads.contains_key(id)).collect();
    (loads.into_iter().collect(), computed)
}

/// At most this many values are stored by the cost model (each costs a partition pass).
const MAX_MATERIALIZED: usize = 16;

/// What a launch costs, in bytes of memory traffic: about 3 µs of host and launch time at
/// an H100's 3 TB/s. A value is stored only when that saves more than the launch its
/// group may add.
pub const LAUNCH_BYTES: usize = 8 << 20;

/// The bytes a value occupies as stored ([`codegen::storage`](super::codegen::storage)).
fn stored_bytes(n: &Node) -> usize {
    super::codegen::storage(n.dtype).size() * n.numel()
}

/// The cost model: the pointwise value whose storing saves the most bytes, if any. A
/// value computed by `G > 1` groups (each recomputing it from the loads under it) costs,
/// recomputed, the bytes of the loads each of those groups makes only for it; stored, its
/// loads once, its write, its read by each group, and (conservatively) a launch
/// ([`LAUNCH_BYTES`]). Views, concatenations and constants are never stored this way
/// (they cost no arithmetic and are read through index maps).
fn materialize(nodes: &[Node], groups: &[Group]) -> Option<(NodeId, usize)> {
    let mut best: Option<(NodeId, usize)> = None;
    let mut counts: BTreeMap<NodeId, usize> = BTreeMap::new();
    for g in groups.iter().filter(|g| g.matmul.is_none() && g.attention.is_none() && g.attention_grad.is_none()) {
        for &id in &g.nodes {
            *counts.entry(id).or_default() += 1;
        }
    }
    for (&p, &count) in counts.iter().filter(|(_, &c)| c > 1) {
        if matches!(nodes[p.index()].op, Op::Const(_) | Op::Tril(_) | Op::Input(_) | Op::View(..) | Op::Concat(..) | Op::Reduce(..)) {
            continue;
        }
        // The loads under `p` in a group, and those the group's other values need too.
        let under = |g: &Group, roots: &[NodeId], cut: Option<NodeId>| {
            let loaded: BTreeSet<NodeId> = g.loads.iter().map(|l| l.0).collect();
            let (mut seen, mut found, mut stack) = (BTreeSet::new(), BTreeSet::new(), roots.to_vec());
            while let Some(id) = stack.pop() {
                if Some(id) == cut || !seen.insert(id) {
                    continue;
                }
                if loaded.contains(&id) {
                    found.insert(id);
                } else {
                    stack.extend(nodes[id.index()].op.operands());
                }
            }
            found
        };
        let (mut recompute, mut leaves) = (0usize, 0usize);
        for g in groups.iter().filter(|g| g.nodes.contains(&p)) {
            let mine = under(g, &[p], None);
            let stores: Vec<NodeId> = g.stores.iter().map(|s| s.0).filter(|&s| s != p).collect();
            let others = under(g, &stores, Some(p));
            let only_p: usize = mine.difference(&others).map(|&l| stored_bytes(&nodes[l.index()])).sum();
            recompute += only_p;
            leaves = leaves.max(mine.iter().map(|&l| stored_bytes(&nodes[l.index()])).sum());
        }
        let stored = leaves + stored_bytes(&nodes[p.index()]) * (1 + count) + LAUNCH_BYTES;
        // Ties go to the later node (ids are topological): the one nearest its readers,
        // so that storing it leaves the least arithmetic recomputed.
        if recompute > stored && best.is_none_or(|(_, b)| recompute - stored >= b) {
            best = Some((p, recompute - stored));
        }
    }
    best
}

/// A group's identity in the fusion pass: (stage, space).
type GroupKey = (usize, Space);

/// The space of every computed node of `live` (a topologically ordered set), its stage,
/// the boundary nodes (see the [module docs](self)), and the attention gradients (by
/// group key) that reuse their forward's output (the node stored, its transpose).
#[allow(clippy::type_complexity)]
fn spaces(nodes: &[Node], live: &[NodeId], attn: &HashMap<NodeId, super::attention::Attention>, outputs: &BTreeSet<NodeId>, forced: &BTreeSet<NodeId>, epilogues: bool) -> (HashMap<NodeId, Space>, HashMap<NodeId, usize>, BTreeSet<NodeId>, HashMap<NodeId, NodeId>) {
    let mut space: HashMap<NodeId, Space> = HashMap::new();
    let mut stage: HashMap<NodeId, usize> = HashMap::new();
    let mut boundary = BTreeSet::new();
    // An attention whose result is only read as `.transpose(1, 2)` (back to the
    // projections' [B, T, H, D]) writes that layout itself: the transpose is stored by the
    // attention's group, and the usual `.reshape(B, T, H * D)` after it reads it in place.
    let mut users: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for &id in live {
        for o in nodes[id.index()].op.operands() {
            users.entry(o).or_default().push(id);
        }
    }
    let mut written_as: HashMap<NodeId, NodeId> = HashMap::new();
    // The one reader of a value that is not an output.
    let only_reader = |x: NodeId| match (users.get(&x).map(Vec::as_slice), outputs.contains(&x)) {
        (Some(&[w]), false) => Some(w),
        _ => None,
    };
    let transposed = |x: NodeId| only_reader(x).filter(|w| matches!(nodes[w.index()].op, Op::View(super::View::Permute(p), _) if p.perm() == [0, 2, 1, 3]));
    // Likewise a result of grouped query heads (`[B, KV, G, T, D]`) only read as the
    // `[B, H, T, D]` it is in memory (a reshape, then possibly that transpose).
    let regrouped = |x: NodeId| {
        let &[b, kv, g, t, d] = &nodes[x.index()].shape[..] else { return None };
        only_reader(x).filter(|w| matches!(nodes[w.index()].op, Op::View(super::View::Reshape, _)) && nodes[w.index()].shape == [b, kv * g, t, d])
    };
    for a in attn.values() {
        let regroup = regrouped(a.out);
        if let Some(w) = regroup {
            written_as.insert(w, a.out);
        }
        if let Some(w) = transposed(regroup.unwrap_or(a.out)) {
            written_as.insert(w, a.out);
        }
    }
    // The same for the gradients of one attention, all of them or none (the backward
    // takes one layout), when its operands are read in that layout too: the projections'
    // [B, T, H, D] buffers, through strides, with no copy either way.
    let mut grads: BTreeMap<NodeId, Vec<NodeId>> = BTreeMap::new();
    for &id in live {
        if let Op::AttentionGrad(a) = nodes[id.index()].op {
            grads.entry(grad_key(nodes, id, a)).or_default().push(id);
        }
    }
    let (mut bthd_grads, mut saved_forward) = (BTreeSet::new(), HashMap::new());
    for (key, ids) in grads {
        let Op::AttentionGrad(a) = nodes[key.index()].op else { continue };
        let ws: Option<Vec<NodeId>> = ids.iter().map(|&g| transposed(g)).collect();
        if let (Some(ws), true) = (ws, [a.q, a.k, a.v, a.dout].iter().all(|&x| bthd_view(nodes, x))) {
            for (w, g) in ws.into_iter().zip(ids) {
                written_as.insert(w, g);
            }
            bthd_grads.insert(key);
            // The forward of the same attention, computed here and stored in that layout:
            // the backward reads its output and log-sum-exp instead of recomputing them.
            let same = |f: &&super::attention::Attention| (f.q.0, f.k.0, f.v.0, f.group as u32, f.scale_bits, f.causal, f.softcap_bits, f.window, f.data, f.score_ops) == (a.q, a.k, a.v, a.group, a.scale_bits, a.causal, a.softcap_bits, a.window, a.data, a.score_ops);
            if let Some(w) = attn.values().find(same).and_then(|f| transposed(f.out)) {
                saved_forward.insert(key, w);
            }
        }
    }
    for &id in live {
        let node = &nodes[id.index()];
        if let Some(&out) = written_as.get(&id) {
            space.insert(id, space[&out].clone());
            stage.insert(id, stage[&out]);
            continue;
        }
        // A product's operand is read from a buffer through strides, or computed in the
        // product's kernel from the buffers under it (its prologue).
        let product_roots = match node.op {
            Op::Matmul(a, b) => Some(
                [a, b]
                    .into_iter()
                    .flat_map(|x| match prologue_leaves(nodes, id, x, &space, &boundary).filter(|_| epilogues) {
                        Some(leaves) => leaves,
                        None => vec![strided_root(nodes, x)],
                    })
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        };
        // A library kernel's operands come from memory: the buffers under their strided
        // views, stored by their groups when computed; it runs after those groups.
        let mut from_memory = |roots: &[NodeId], sp: Space| {
            let mut s = 0;
            for &root in roots {
                if !matches!(nodes[root.index()].op, Op::Input(_)) {
                    boundary.insert(root);
                    s = s.max(stage[&root] + 1);
                }
            }
            space.insert(id, sp);
            stage.insert(id, s);
        };
        if let Some(a) = attn.get(&id) {
            from_memory(&operand_roots(a), Space::Attention(id));
            continue;
        }
        if let Some(roots) = &product_roots {
            from_memory(roots, Space::Matmul(id));
            continue;
        }
        // The flash-attention backward reads its operands row-major (each stored first
        // unless it is a graph input); the gradients of one attention are one group.
        if let Op::AttentionGrad(a) = node.op {
            let key = grad_key(nodes, id, a);
            let operands = [a.q, a.k, a.v, a.dout];
            let mut roots = if bthd_grads.contains(&key) { operands.map(|x| strided_root(nodes, x)).to_vec() } else { operands.to_vec() };
            roots.extend(saved_forward.get(&key));
            roots.extend(a.data.map(|d| d.read.1));
            from_memory(&roots, Space::AttentionGrad(key));
            continue;
        }
        let operands = node.op.operands();
        let rows_of = |o: &NodeId| match space.get(o) {
            Some(Space::Rows(s)) => Some(s.clone()),
            _ => None,
        };
        // A matrix product's result is read from memory by everything else.
        let product = |o: &NodeId| matches!(space.get(o), Some(Space::Matmul(_) | Space::Attention(_) | Space::AttentionGrad(_)));
        match node.op {
            Op::Input(_) | Op::Const(_) | Op::Tril(_) | Op::Matmul(..) | Op::AttentionGrad(..) => {}
            Op::Reduce(_, x) => {
                let s = nodes[x.index()].shape.clone();
                if rows_of(&x).is_some_and(|r| r != s) || product(&x) {
                    boundary.insert(x);
                }
                space.insert(id, Space::Rows(s));
            }
            _ if epilogues && epilogue(nodes, node, &space, &stage, &boundary).is_some() => {
                // An epilogue: computed on the product's tile in registers; its other
                // products and rows values are read from memory (stored by earlier stages).
                let (sp, m) = epilogue(nodes, node, &space, &stage, &boundary).expect("checked");
                boundary.extend(operands.iter().filter(|o| space.get(o) != Some(&sp) && (product(o) || rows_of(o).is_some())));
                space.insert(id, sp);
                stage.insert(id, stage[&m]);
                if forced.contains(&id) {
                    boundary.insert(id);
                }
                continue;
            }
            _ => {
                let rows: BTreeSet<Vec<usize>> = operands.iter().filter_map(rows_of).collect();
                let joined = match rows.iter().next() {
                    // A view reads its operand at other elements than its own: a value of a
                    // rows space it views is stored first.
                    _ if matches!(node.op, Op::View(..) | Op::Concat(..)) => None,
                    Some(s) if rows.len() == 1 && super::broadcast_shapes(&node.shape, s).as_ref() == Some(s) => Some(s.clone()),
                    _ => None,
                };
                if joined.is_none() {
                    boundary.extend(operands.iter().filter(|o| rows_of(o).is_some()));
                }
                boundary.extend(operands.iter().filter(|o| product(o)));
                space.insert(id, joined.map_or_else(|| Space::Flat(node.shape.clone()), Space::Rows));
            }
        }
        let s = operands.iter().map(|o| stage[o] + usize::from(boundary.contains(o))).max().unwrap_or(0);
        stage.insert(id, s);
        if forced.contains(&id) {
            boundary.insert(id);
        }
    }
    (space, stage, boundary, saved_forward)
}

/// Whether `node` is an epilogue of a matrix product: a pointwise node (not a view, a
/// concatenation or a reduction) of the product's shape, reading the product or another
/// of its epilogue nodes (so `Space::Matmul(m)`), whose other operands are all ready by
/// the product's stage (a rows value or another product counts as stored first, a stage
/// later). Then: its space and the product. Among several products it reads, the latest.
fn epilogue(nodes: &[Node], node: &Node, space: &HashMap<NodeId, Space>, stage: &HashMap<NodeId, usize>, boundary: &BTreeSet<NodeId>) -> Option<(Space, NodeId)> {
    if matches!(node.op, Op::View(..) | Op::Concat(..) | Op::Reduce(..) | Op::Matmul(..) | Op::AttentionGrad(..) | Op::Input(_) | Op::Const(_) | Op::Tril(_)) {
        return None;
    }
    let operands = node.op.operands();
    let (sp, m) = operands
        .iter()
        .filter_map(|o| match space.get(o) {
            Some(sp @ Space::Matmul(m)) if nodes[m.index()].shape == node.shape => Some((sp.clone(), *m)),
            _ => None,
        })
        .max_by_key(|(_, m)| stage[m])?;
    let ready = operands.iter().all(|o| {
        let stored = boundary.contains(o) || matches!(space.get(o), Some(Space::Rows(_) | Space::Matmul(_) | Space::Attention(_) | Space::AttentionGrad(_)));
        space.get(o) == Some(&sp) || stage[o] + usize::from(stored) <= stage[&m]
    });
    ready.then_some((sp, m))
}

/// Whether a matrix product's operand `x` is computed in the product's kernel (a
/// prologue): the node under its strided views is computed (not a graph input) and not
/// stored by a group of an earlier stage (`earlier`; [`spaces`] stores it first when it
/// is not a prologue, so only a prologue's root can be stored later, by another reader).
fn computed_operand(nodes: &[Node], x: NodeId, earlier: &dyn Fn(NodeId) -> bool) -> bool {
    let root = strided_root(nodes, x);
    !matches!(nodes[root.index()].op, Op::Input(_)) && !earlier(root)
}

/// The largest product (in flops, `2 m n k` over its batch) whose operands may be computed
/// in its kernel: about 10 us of an H100's tensor cores. A computed operand's tiles are
/// loaded and computed in registers each iteration, not copied ahead asynchronously, which
/// costs a compute-bound product more than storing the operand first saves (measured,
/// BENCHMARKS.md "Matrix products in graphs": an f32 -> bf16 cast before an 8192 x 4096 x
/// 1024 product, 0.36 ms as a prologue against 0.27 ms stored first; before a 4096 x 512 x
/// 512 one, 20 us against 30 us).
pub const MAX_PROLOGUE_FLOPS: usize = 1 << 32;

/// A matrix product's (`product`) operand `x` as a prologue (see [`computed_operand`]):
/// the buffers its tiles are computed from, graph inputs and values of other spaces or
/// stored (which become boundaries), through pointwise nodes, permutations and
/// expansions of its own space; `None` when `x` is read through strides, or is stored
/// first: behind a view that moves elements otherwise (a reshape, slice or
/// `repeat_interleave` of a computed value: divisions per element in the main loop), or
/// under a product larger than [`MAX_PROLOGUE_FLOPS`].
fn prologue_leaves(nodes: &[Node], product: NodeId, x: NodeId, space: &HashMap<NodeId, Space>, boundary: &BTreeSet<NodeId>) -> Option<Vec<NodeId>> {
    let elsewhere = |id: NodeId| boundary.contains(&id) || !matches!(space.get(&id), None | Some(Space::Flat(_)));
    let root = strided_root(nodes, x);
    let Op::Matmul(a, _) = nodes[product.index()].op else { return None };
    let k = nodes[a.index()].shape.last().copied().unwrap_or(1);
    if matches!(nodes[root.index()].op, Op::Input(_)) || elsewhere(root) || 2 * nodes[product.index()].numel() * k > MAX_PROLOGUE_FLOPS {
        return None;
    }
    let (mut leaves, mut seen, mut stack) = (vec![], BTreeSet::new(), vec![x]);
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        match nodes[id.index()].op {
            Op::Input(_) => leaves.push(id),
            _ if elsewhere(id) => leaves.push(id),
            Op::View(v, _) if !matches!(v, super::View::Permute(_) | super::View::Expand) => return None,
            Op::Concat(..) => return None,
            _ => stack.extend(nodes[id.index()].op.operands()),
        }
    }
    Some(leaves)
}

/// The buffers a recognised attention reads: those under q, k and v, and under the tensor a
/// mask or bias from data is read from (its packing step reads it).
fn operand_roots(a: &super::attention::Attention) -> Vec<NodeId> {
    [a.q.1, a.k.1, a.v.1].into_iter().chain(a.data.map(|d| d.read.1)).collect()
}

/// The group key of attention gradient `id` (of operands `a`): its `dq` node, or itself.
fn grad_key(nodes: &[Node], id: NodeId, a: super::AttentionGrad) -> NodeId {
    let dq = Op::AttentionGrad(super::AttentionGrad { which: 0, ..a });
    nodes.iter().position(|n| n.op == dq).map_or(id, |i| NodeId(i as u32))
}

/// Whether `x` (`[B, H, T, D]`) is `.transpose(1, 2)` of a `[B, T, H, D]` buffer, as
/// the flash-attention kernels' [B, T, H, D] layout reads it: a view of a stored value
/// (or input) whose strides are that layout's.
pub fn bthd_view(nodes: &[Node], x: NodeId) -> bool {
    let s = &nodes[x.index()].shape;
    let root = strided_root(nodes, x);
    let [_, h, t, d] = s[..] else { return false };
    root != x && super::plan::strides_through(nodes, x, root) == [(t * h * d) as isize, d as isize, (h * d) as isize, 1]
}

/// The node a matrix product's operand `x` is read from: `x` itself, or the node under
/// the chain of permutations and expansions that ends in `x`, and under one reshape at
/// its bottom (a stored value is row-major, so any shape of it is strided): read through
/// strides ([`plan`](super::plan) computes them).
pub fn strided_root(nodes: &[Node], mut x: NodeId) -> NodeId {
    while let Op::View(super::View::Permute(_) | super::View::Expand, y) = nodes[x.index()].op {
        x = y;
    }
    match nodes[x.index()].op {
        Op::View(super::View::Reshape, y) => y,
        _ => x,
    }
}

/// `roots` and every node they depend on, in topological (id) order.
pub(super) fn ancestors(roots: impl IntoIterator<Item = NodeId>, operands: impl Fn(NodeId) -> Vec<NodeId>) -> Vec<NodeId> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<NodeId> = roots.into_iter().collect();
    while let Some(id) = stack.pop() {
        if seen.insert(id) {
            stack.extend(operands(id));
        }
    }
    seen.into_iter().collect()
}

impl fmt::Display for Partition {
    /// The fusion decisions, one group a paragraph:
    ///
    /// ```text
    /// kernel 0 over [3, 1000]: loads n0 (input `x`), n1 (input `b`)
    ///   n2 = add(n0, n1): f32[3, 1000]
    ///   ...
    ///   stores n5 -> output `y`
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.groups.iter().enumerate() {
            let loads: Vec<String> = g
                .loads
                .iter()
                .map(|(id, s)| match s {
                    Source::Input(k) => format!("{id} (input `{}`)", self.inputs[*k]),
                    Source::Intermediate(k) => format!("{id} (intermediate {k})"),
                })
                .collect();
            let over = match (g.row, g.matmul) {
                _ if g.attention_grad.is_some() => {
                    let a = g.attention_grad.expect("checked");
                    let mut data = a.data.map(|d| format!(", {d}")).unwrap_or_default();
                    if let Some(o) = a.score_ops {
                        data.push_str(&format!(", scores f(s) = {}", o.steps(&self.nodes)));
                    }
                    format!("{:?} (flash-attention backward, {} query heads per key/value head, scale {}{data})", g.shape, a.group, a.scale())
                }
                _ if g.attention.is_some() => {
                    let a = g.attention.expect("checked");
                    let mut extra = String::new();
                    if a.causal {
                        extra.push_str(", causal");
                    }
                    if let Some(w) = a.window {
                        extra.push_str(&format!(", sliding window of {w}"));
                    }
                    if let Some(c) = a.softcap() {
                        extra.push_str(&format!(", soft-cap {c}"));
                    }
                    if let Some(d) = a.data {
                        extra.push_str(&format!(", {d}"));
                    }
                    if let Some(o) = a.score_ops {
                        extra.push_str(&format!(", scores f(s) = {}", o.steps(&self.nodes)));
                    }
                    format!("{:?} (flash attention, {} query heads per key/value head, scale {}{extra})", g.shape, a.group, a.scale())
                }
                (_, Some(m)) => {
                    let epilogue = g.stores.iter().any(|s| s.0 != m);
                    let what = match (g.prologue.contains(&true), epilogue) {
                        (true, true) => "matmul, prologue and epilogue fused",
                        (true, false) => "matmul, prologue fused",
                        (false, true) => "matmul, epilogue fused",
                        (false, false) if g.stores.len() > 1 => "matmul, stored to several buffers",
                        (false, false) => "batched matmul",
                    };
                    format!("{:?} ({what})", g.shape)
                }
                (Some(r), _) => format!("rows of {r} of {:?}", g.shape),
                _ => format!("{:?}", g.shape),
            };
            writeln!(f, "kernel {i} over {over}: loads {}", loads.join(", "))?;
            for id in &g.nodes {
                writeln!(f, "  {id} = {}", self.nodes[id.index()])?;
            }
            for (id, d) in &g.stores {
                match d {
                    Dest::Output(k) => writeln!(f, "  stores {id} -> output `{}`", self.outputs[*k])?,
                    Dest::Intermediate(k) => writeln!(f, "  stores {id} -> intermediate {k}")?,
                }
            }
        }
        for (id, why) in &self.near_misses {
            writeln!(f, "not attention: {id} = {}: {why}", self.nodes[id.index()])?;
        }
        for (id, saved) in &self.stored_by_cost {
            writeln!(f, "stored, not recomputed: {id} = {} (saves {saved} bytes a run)", self.nodes[id.index()])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsl_runtime::DType;

    #[test]
    fn one_group_per_output_shape_and_one_per_node_unfused() {
        let g = Graph::new();
        let (x, b) = (g.input("x", DType::F32, &[3, 8]), g.input("b", DType::F32, &[8]));
        let r = (x + b).relu();
        g.output("r", r).unwrap();
        g.output("y", r * 2.0 + r).unwrap();
        g.output("bb", b.exp()).unwrap();
        let p = partition(&g, Fusion::On).unwrap();
        assert_eq!(p.groups.len(), 2, "{p}");
        // r is stored once, as an output, and used in registers by y.
        assert_eq!(p.groups[0].stores.len(), 2);
        assert_eq!(p.groups[0].loads.len(), 2);
        assert!(p.intermediates.is_empty());
        let q = partition(&g, Fusion::Off).unwrap();
        // add, relu, mul, add, exp (the constant is computed inside mul's kernel).
        assert_eq!(q.groups.len(), 5, "{q}");
        assert_eq!(q.intermediates.len(), 3, "{q}"); // x + b, r, r * 2
    }
}
