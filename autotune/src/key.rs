//! Tuning keys: the launch arguments whose values decide which configuration is best,
//! bucketed so that a server does not re-tune for every length.

use std::fmt;

/// How a key value is bucketed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bucket {
    /// The value itself.
    Exact,
    /// The next power of two (`1000` → `1024`; `0` → `0`).
    NextPow2,
    /// Rounded up to a multiple of `m`.
    Multiple(i64),
}

impl Bucket {
    pub fn apply(self, v: i64) -> i64 {
        match self {
            Bucket::Exact => v,
            Bucket::NextPow2 if v <= 0 => v,
            Bucket::NextPow2 => (v as u64).next_power_of_two() as i64,
            Bucket::Multiple(m) if m > 0 => v.div_euclid(m) * m + if v.rem_euclid(m) == 0 { 0 } else { m },
            Bucket::Multiple(_) => v,
        }
    }
}

/// A bucketed tuning key.
///
/// ```
/// use autotune::{Bucket, Key};
/// let k = Key::new().with("n", 1000, Bucket::NextPow2).with("dtype", 2, Bucket::Exact);
/// assert_eq!(k.to_string(), "n=1024 dtype=2");
/// assert_eq!(k.value("n"), Some(1024));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Vec<(String, i64)>);

impl Key {
    pub fn new() -> Key {
        Key::default()
    }
    pub fn with(mut self, name: &str, value: i64, bucket: Bucket) -> Key {
        self.0.push((name.to_string(), bucket.apply(value)));
        self
    }
    /// A bucketed value by name.
    pub fn value(&self, name: &str) -> Option<i64> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(" "))
    }
}
