//! Symbolic dimensions: a graph whose batch or sequence sizes are named, bound at run time.
//!
//! A [`Symbolic`] holds the names of its dimensions and a function that builds the graph
//! for given values of them (the way the math is written, with `d["B"]` where a size is
//! symbolic). [`Symbolic::run`] takes the values with the buffers: the first run with a
//! binding builds the graph for it and compiles a [`Plan`] (the fusion pass, kernels with
//! constant shapes, intermediates); later runs with that binding reuse the plan, so a
//! serving loop with a few batch sizes compiles each once (and a new process finds the
//! kernels in the disk cache). This is specialization, as JAX's `jit` retraces and
//! `torch.compile` recompiles for new sizes: the kernels index with constants, as fast as
//! those of a graph written with those sizes.
//!
//! ```
//! use dsl_runtime::{DType, Runtime};
//! use kernels_lib::graph::{Symbolic, TensorMut};
//!
//! // Softmax over rows of 64, any number of rows `B`.
//! let mut f = Symbolic::new(&["B"], |g, d| {
//!     let x = g.input("x", DType::F32, &[d["B"], 64]);
//!     g.output("y", (x * 0.5).softmax(-1))
//! });
//! let rt = Runtime::interpreter();
//! for b in [3, 5, 3] {
//!     let x = rt.upload(&vec![1.0f32; b * 64]).unwrap();
//!     let mut y = rt.zeros::<f32>(b * 64).unwrap();
//!     f.run(&rt, &[("B", b)], &[(&x).into()], &mut [TensorMut::from(&mut y)]).unwrap();
//!     assert!(y.to_vec().unwrap().iter().all(|&v| v == 1.0 / 64.0));
//! }
//! assert_eq!(f.specializations(), 2); // B = 3 and B = 5, each compiled once
//! assert!(f.run(&rt, &[], &[], &mut []).is_err()); // B not bound: a clear error
//! ```

use super::{Graph, GraphError, Options, Plan, PlanError, TensorMut, TensorRef};
use std::collections::HashMap;

/// The values of a [`Symbolic`]'s dimensions for one build: `d["B"]`, or [`Dims::get`].
pub struct Dims<'a> {
    names: &'a [String],
    values: &'a [usize],
}

impl Dims<'_> {
    /// The value of dimension `name`, `None` if the graph does not declare it.
    pub fn get(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name).map(|i| self.values[i])
    }
}

impl std::ops::Index<&str> for Dims<'_> {
    type Output = usize;
    /// The value of dimension `name`. Panics when the graph does not declare `name` (a
    /// mistake in the build function itself; [`get`](Dims::get) returns an `Option`).
    fn index(&self, name: &str) -> &usize {
        match self.names.iter().position(|n| n == name) {
            Some(i) => &self.values[i],
            None => panic!("the build function asks for dimension `{name}`, which `Symbolic::new` does not declare (declared: {})", self.names.join(", ")),
        }
    }
}

type Build = dyn Fn(&Graph, &Dims<'_>) -> Result<(), GraphError>;

/// A graph over named dimensions, compiled once per binding of them. See the
/// [module docs](self).
pub struct Symbolic {
    names: Vec<String>,
    build: Box<Build>,
    options: Options,
    /// One plan per binding (values in the order of `names`) and placement (on a GPU or
    /// not: a plan runs where it was compiled).
    plans: HashMap<(Vec<usize>, bool), Plan>,
}

impl Symbolic {
    /// Dimensions `names` and the function that builds the graph (its inputs, operations
    /// and outputs) for values of them.
    pub fn new(names: &[&str], build: impl Fn(&Graph, &Dims<'_>) -> Result<(), GraphError> + 'static) -> Symbolic {
        Symbolic { names: names.iter().map(|n| n.to_string()).collect(), build: Box::new(build), options: Options::default(), plans: HashMap::new() }
    }

    /// Compile with `options` instead of the defaults (plans compiled already are kept).
    pub fn with_options(mut self, options: Options) -> Symbolic {
        self.options = options;
        self
    }

    /// The plan for `binding` (every declared dimension, once, with its value), built and
    /// compiled on `rt` at its first use: to inspect its partition or kernels.
    pub fn plan(&mut self, rt: &dsl_runtime::Runtime, binding: &[(&str, usize)]) -> Result<&mut Plan, PlanError> {
        let key = (self.values(binding)?, rt.is_gpu());
        if !self.plans.contains_key(&key) {
            let g = Graph::new();
            (self.build)(&g, &Dims { names: &self.names, values: &key.0 })?;
            let plan = g.compile_with(rt, &self.options)?;
            self.plans.insert(key.clone(), plan);
        }
        Ok(self.plans.get_mut(&key).expect("inserted above"))
    }

    /// [`Plan::run`] of the plan for `binding` (compiled at its first use): the buffers are
    /// checked against the shapes the binding gives.
    pub fn run(&mut self, rt: &dsl_runtime::Runtime, binding: &[(&str, usize)], inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<(), PlanError> {
        self.plan(rt, binding)?.run(rt, inputs, outputs)
    }

    /// [`Plan::run_graph`] of the plan for `binding`: each binding's plan keeps the graph of
    /// its last buffers.
    pub fn run_graph(&mut self, rt: &dsl_runtime::Runtime, binding: &[(&str, usize)], inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<(), PlanError> {
        self.plan(rt, binding)?.run_graph(rt, inputs, outputs)
    }

    /// How many (binding, placement) pairs have a compiled plan.
    pub fn specializations(&self) -> usize {
        self.plans.len()
    }

    /// The binding's values in declaration order: every declared dimension bound once,
    /// nothing else.
    fn values(&self, binding: &[(&str, usize)]) -> Result<Vec<usize>, PlanError> {
        let declared = || self.names.join(", ");
        if let Some((i, n)) = self.names.iter().enumerate().find(|(i, n)| self.names[..*i].contains(n)) {
            return Err(PlanError::Dim(format!("dimension `{n}` is declared twice (position {i} of {})", declared())));
        }
        if let Some((name, _)) = binding.iter().find(|(n, _)| !self.names.iter().any(|m| m == n)) {
            return Err(PlanError::Dim(format!("`{name}` is not a dimension of this graph (declared: {})", declared())));
        }
        self.names
            .iter()
            .map(|n| match binding.iter().filter(|(m, _)| m == n).map(|&(_, v)| v).collect::<Vec<_>>()[..] {
                [v] => Ok(v),
                [] => Err(PlanError::Dim(format!("dimension `{n}` is not bound (declared: {}; bind each as (\"{n}\", size))", declared()))),
                _ => Err(PlanError::Dim(format!("dimension `{n}` is bound twice"))),
            })
            .collect()
    }
}
