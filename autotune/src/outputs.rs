//! The buffers a tuned launch writes: saved before tuning, restored before every
//! candidate (so one that leaves elements unwritten cannot inherit another's values),
//! compared between candidates, and restored before the winner's launch, so a tuned
//! launch leaves exactly what one untuned launch leaves. For kernels that read their
//! outputs (accumulate, or work in place; [`Autotuner::reset_outputs`](crate::Autotuner::reset_outputs))
//! they are also restored before every timed run. Comparisons stream over the saved
//! elements in one pass (no copies), which matters for outputs of a gigabyte.

use dsl_runtime::{Buffer, DType, Element, Result};
use std::any::Any;

/// The saved contents of one buffer (its elements, as read back).
pub struct Saved {
    data: Box<dyn Any + Send>,
    /// Relative L2 difference to another save of the same buffer, in one pass.
    diff: fn(&Saved, &Saved) -> f64,
    pub dtype: DType,
}



/// One output buffer.
pub trait OutBuf {
    fn save(&self) -> Result<Saved>;
    fn load(&mut self, s: &Saved) -> Result<()>;
}

fn as_f64<T: Element>(x: T) -> f64 {
    if T::DTYPE.is_float() { x.to_f64() } else { x.to_i64() as f64 }
}

/// `|a - b| / |a|` over two saves of a `Vec<T>`; NaN in one but not the other is infinite.
fn diff_of<T: Element + 'static>(a: &Saved, b: &Saved) -> f64 {
    let (Some(x), Some(y)) = (a.data.downcast_ref::<Vec<T>>(), b.data.downcast_ref::<Vec<T>>()) else { return f64::INFINITY };
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&p, &q) in x.iter().zip(y) {
        let (p, q) = (as_f64(p), as_f64(q));
        if p.is_nan() != q.is_nan() {
            return f64::INFINITY;
        }
        if p != q && !p.is_nan() {
            num += (p - q) * (p - q);
        }
        if !p.is_nan() {
            den += p * p;
        }
    }
    if num == 0.0 { 0.0 } else { (num / den.max(f64::MIN_POSITIVE)).sqrt() }
}

impl<T: Element + Send + 'static> OutBuf for Buffer<T> {
    fn save(&self) -> Result<Saved> {
        Ok(Saved { data: Box::new(self.to_vec()?), diff: diff_of::<T>, dtype: T::DTYPE })
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
    (a.diff)(a, b)
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
