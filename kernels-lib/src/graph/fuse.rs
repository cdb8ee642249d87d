//! The fusion pass: which nodes go into which kernel, and what each kernel loads and stores.
//!
//! Input: a [`Graph`] with outputs. Output: a [`Partition`], a list of [`Group`]s in launch
//! order (one kernel each) and the intermediate buffers the groups pass to each other.
//!
//! The rules, for the elementwise and broadcast nodes of this slice:
//!
//! - **Legality.** A group is one iteration space: the shape of the outputs it stores.
//!   Every node an output needs has a shape that broadcasts to the output's, so it can be
//!   computed at the output's index (its inputs read through broadcast index maps, see
//!   [`codegen`](super::codegen)): pointwise producers always fuse into their consumers.
//! - **[`Fusion::On`]**: one group per distinct output shape. A group computes every node
//!   its outputs need, reading only graph inputs; a node used by several consumers is
//!   computed once (nodes are hash-consed, and each is emitted once per kernel); an output
//!   that is also an intermediate of another output of the same shape is stored once and
//!   used from registers. Nothing crosses groups, so groups are independent.
//! - **[`Fusion::Off`]**: one group per node (the comparison baseline): each reads its
//!   operands from the graph's inputs or from intermediate buffers and stores its result.
//!
//! What it cannot do yet: a node needed by groups of several shapes is recomputed in each
//! (no cost model, no "materialise under broadcast amplification" rule, see the fact sheet's
//! §2); no reductions, so no reduction iteration spaces; no cap on group size.

use super::{Graph, GraphError, Node, NodeId, Op};
use std::collections::{BTreeSet, HashMap};
use std::fmt;

/// Whether to fuse.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum Fusion {
    /// One kernel per output shape (see the [module docs](self)).
    #[default]
    On,
    /// One kernel per node, intermediates through memory.
    Off,
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

/// One kernel's worth of nodes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Group {
    /// The iteration space: the shape of what the group stores.
    pub shape: Vec<usize>,
    /// Values read from memory, each once, in parameter order.
    pub loads: Vec<(NodeId, Source)>,
    /// Nodes computed in the kernel, in topological order, each once (constants included).
    pub nodes: Vec<NodeId>,
    /// Values written, in parameter order (after the loads).
    pub stores: Vec<(NodeId, Dest)>,
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
    match fusion {
        Fusion::On => {
            let mut shapes: Vec<&Vec<usize>> = vec![];
            for (_, id) in &outputs {
                let s = &nodes[id.index()].shape;
                if !shapes.contains(&s) {
                    shapes.push(s);
                }
            }
            for shape in shapes {
                let stores: Vec<(NodeId, Dest)> =
                    outputs.iter().enumerate().filter(|(_, (_, id))| &nodes[id.index()].shape == shape).map(|(k, (_, id))| (*id, Dest::Output(k))).collect();
                let needed = ancestors(&nodes, stores.iter().map(|s| s.0));
                let loads = needed.iter().filter_map(|&id| input_of(id).map(|i| (id, Source::Input(i)))).collect();
                let computed = needed.into_iter().filter(|&id| input_of(id).is_none()).collect();
                groups.push(Group { shape: shape.clone(), loads, nodes: computed, stores });
            }
        }
        Fusion::Off => {
            let live = ancestors(&nodes, outputs.iter().map(|o| o.1));
            // Nodes other computed nodes read: they go through intermediate buffers.
            let mut slot: HashMap<NodeId, usize> = HashMap::new();
            for &id in &live {
                for a in nodes[id.index()].op.operands() {
                    if input_of(a).is_none() && !matches!(nodes[a.index()].op, Op::Const(_)) && !slot.contains_key(&a) {
                        slot.insert(a, intermediates.len());
                        intermediates.push(a);
                    }
                }
            }
            for &id in &live {
                let node = &nodes[id.index()];
                if matches!(node.op, Op::Const(_)) {
                    continue;
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
                groups.push(Group { shape: node.shape.clone(), loads, nodes: computed, stores });
            }
        }
    }
    let inputs = graph.inputs().into_iter().map(|i| i.0).collect();
    Ok(Partition { groups, intermediates, nodes, inputs, outputs: outputs.into_iter().map(|o| o.0).collect() })
}

/// `roots` and every node they depend on, in topological (id) order.
fn ancestors(nodes: &[Node], roots: impl IntoIterator<Item = NodeId>) -> Vec<NodeId> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<NodeId> = roots.into_iter().collect();
    while let Some(id) = stack.pop() {
        if seen.insert(id) {
            stack.extend(nodes[id.index()].op.operands());
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
            writeln!(f, "kernel {i} over {:?}: loads {}", g.shape, loads.join(", "))?;
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
