//! The buffers a tuned launch writes: saved before tuning, restored before every
//! candidate (and, for kernels that accumulate or work in place, before every timed run),
//! compared between candidates, and restored before the winner's launch, so a tuned launch
//! leaves exactly what one untuned launch leaves.

use dsl_runtime::{Buffer, DType, Element, Result};
use std::any::Any;

/// The saved contents of one buffer.
pub struct Saved {
    data: Box<dyn Any + Send>,
    /// The values as f64, for comparisons.
    pub values: Vec<f64>,
    pub dtype: DType,
}

/// One output buffer.
pub trait OutBuf {
    fn save(&self) -> Result<Saved>;
    fn load(&mut self, s: &Saved) -> Result<()>;
}

impl<T: Element + Send + 'static> OutBuf for Buffer<T> {
    fn save(&self) -> Result<Saved> {
        let v = self.to_vec()?;
        let values = v.iter().map(|x| if T::DTYPE.is_float() { x.to_f64() } else { x.to_i64() as f64 }).collect();
        Ok(Saved { data: Box::new(v), values, dtype: T::DTYPE })
    }
    fn load(&mut self, s: &Saved) -> Result<()> {
        let v = s.data.downcast_ref::<Vec<T>>().expect("a snapshot is restored into the buffer it came from");
        self.copy_from(v)
    }
}

/// All output buffers of a launch, as a tuple of `&mut Buffer<T>` (up to four; `()` for
/// none). The launch closure receives the same tuple.
pub trait Outputs {
    fn snapshot(&self) -> Result<Vec<Saved>>;
    fn restore(&mut self, s: &[Saved]) -> Result<()>;
}

impl Outputs for () {
    fn snapshot(&self) -> Result<Vec<Saved>> {
        Ok(vec![])
    }
    fn restore(&mut self, _: &[Saved]) -> Result<()> {
        Ok(())
    }
}

macro_rules! tuple_outputs {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: OutBuf),+> Outputs for ($(&mut $name,)+) {
            fn snapshot(&self) -> Result<Vec<Saved>> {
                Ok(vec![$(self.$idx.save()?),+])
            }
            fn restore(&mut self, s: &[Saved]) -> Result<()> {
                $(self.$idx.load(&s[$idx])?;)+
                Ok(())
            }
        }
    };
}
tuple_outputs!(A 0);
tuple_outputs!(A 0, B 1);
tuple_outputs!(A 0, B 1, C 2);
tuple_outputs!(A 0, B 1, C 2, D 3);

/// The relative L2 difference between two saves of one buffer.
pub fn difference(a: &Saved, b: &Saved) -> f64 {
    let num: f64 = a.values.iter().zip(&b.values).map(|(x, y)| if x == y { 0.0 } else { (x - y) * (x - y) }).sum();
    let den: f64 = a.values.iter().map(|x| x * x).sum();
    if a.values.iter().chain(&b.values).any(|x| x.is_nan()) && a.values.iter().zip(&b.values).any(|(x, y)| x.is_nan() != y.is_nan()) {
        return f64::INFINITY;
    }
    if num == 0.0 { 0.0 } else { (num / den.max(f64::MIN_POSITIVE)).sqrt() }
}

/// The default tolerance between candidates: exact for integers, rounding-level for floats
/// (block sizes change the order of reductions).
pub fn default_tolerance(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-5,
        DType::F16 | DType::BF16 => 1e-2,
        _ => 0.0,
    }
}
