//! Candidate configurations and the spaces they come from.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One candidate: values of the kernel's compile-time parameters, `num_warps` and
/// `num_stages`, which a launch closure passes on with
/// `LaunchConfig::warps(cfg.num_warps).stages(cfg.num_stages)`. `num_stages` pipelines
/// loops that load tensor-core operands (`dsl_runtime::passes::pipeline`); where a
/// kernel has none, candidates that differ only in it compile to the same code (see
/// [`num_stages_changes_code`](dsl_runtime::compile::num_stages_changes_code)).
/// `warp_specialize` goes to `LaunchConfig::warp_specialize` (a TMA loop's producer
/// warpgroup; absent from results files where false), `programs_per_sm` to
/// `LaunchConfig::min_programs_per_sm` (the programs an SM the kernel's registers are
/// budgeted for; absent where 1).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Config {
    pub consts: BTreeMap<String, i64>,
    pub num_warps: u32,
    pub num_stages: u32,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warp_specialize: bool,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub programs_per_sm: u32,
}

fn one() -> u32 {
    1
}

fn is_one(x: &u32) -> bool {
    *x == 1
}

impl Config {
    pub fn new(consts: &[(&str, i64)], num_warps: u32, num_stages: u32) -> Config {
        Config { consts: consts.iter().map(|(k, v)| (k.to_string(), *v)).collect(), num_warps, num_stages, warp_specialize: false, programs_per_sm: 1 }
    }
    /// The value of compile-time parameter `name` (0 when the configuration has none).
    pub fn get(&self, name: &str) -> i64 {
        self.consts.get(name).copied().unwrap_or(0)
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in &self.consts {
            write!(f, "{k}={v} ")?;
        }
        write!(f, "warps={} stages={}", self.num_warps, self.num_stages)?;
        if self.warp_specialize {
            write!(f, " specialized")?;
        }
        if self.programs_per_sm != 1 {
            write!(f, " programs_per_sm={}", self.programs_per_sm)?;
        }
        Ok(())
    }
}

/// A set of candidates: listed, or the product of value ranges.
///
/// ```
/// use autotune::Space;
/// let s = Space::product().values("BLOCK", &[256, 512, 1024]).warps(&[4, 8]);
/// assert_eq!(s.configs().len(), 6);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Space {
    axes: Vec<(String, Vec<i64>)>,
    warps: Vec<u32>,
    stages: Vec<u32>,
    specialize: Vec<bool>,
    programs: Vec<u32>,
    listed: Vec<Config>,
}

impl Space {
    /// The product of the value lists given next.
    pub fn product() -> Space {
        Space::default()
    }
    /// Exactly these configurations, in this order.
    pub fn list(configs: Vec<Config>) -> Space {
        Space { listed: configs, ..Space::default() }
    }
    pub fn values(mut self, name: &str, values: &[i64]) -> Space {
        self.axes.push((name.to_string(), values.to_vec()));
        self
    }
    /// Powers of two from `lo` to `hi` inclusive.
    pub fn pow2(self, name: &str, lo: i64, hi: i64) -> Space {
        let v: Vec<i64> = (0..63).map(|k| 1i64 << k).filter(|&x| x >= lo && x <= hi).collect();
        self.values(name, &v)
    }
    pub fn warps(mut self, w: &[u32]) -> Space {
        self.warps = w.to_vec();
        self
    }
    pub fn stages(mut self, s: &[u32]) -> Space {
        self.stages = s.to_vec();
        self
    }
    /// Warp specialization off, on, or both (`[false]` where not given).
    pub fn specialize(mut self, s: &[bool]) -> Space {
        self.specialize = s.to_vec();
        self
    }
    /// Programs an SM the registers are budgeted for (`[1]` where not given).
    pub fn programs(mut self, p: &[u32]) -> Space {
        self.programs = p.to_vec();
        self
    }
    /// Every candidate, in order: listed ones, or the product (last axis fastest, then
    /// warps, then stages, then warp specialization, then programs an SM).
    pub fn configs(&self) -> Vec<Config> {
        if !self.listed.is_empty() {
            return self.listed.clone();
        }
        let warps = if self.warps.is_empty() { vec![4] } else { self.warps.clone() };
        let stages = if self.stages.is_empty() { vec![1] } else { self.stages.clone() };
        let specialize = if self.specialize.is_empty() { vec![false] } else { self.specialize.clone() };
        let programs = if self.programs.is_empty() { vec![1] } else { self.programs.clone() };
        let mut out = vec![BTreeMap::new()];
        for (name, vals) in &self.axes {
            out = out
                .into_iter()
                .flat_map(|m| {
                    vals.iter().map(move |&v| {
                        let mut m2 = m.clone();
                        m2.insert(name.clone(), v);
                        m2
                    })
                })
                .collect();
        }
        let mut configs = vec![];
        for consts in out {
            for &w in &warps {
                for &s in &stages {
                    for &warp_specialize in &specialize {
                        for &programs_per_sm in &programs {
                            configs.push(Config { consts: consts.clone(), num_warps: w, num_stages: s, warp_specialize, programs_per_sm });
                        }
                    }
                }
            }
        }
        configs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Warp specialization is an axis of the product like warps and stages, and a results
    /// file written before it existed (no field) reads back as off; off is not written.
    #[test]
    fn warp_specialization_is_a_tuned_choice_that_old_files_read_as_off() {
        let s = Space::product().values("BM", &[64, 128]).warps(&[4, 8]).specialize(&[false, true]);
        let cs = s.configs();
        assert_eq!(cs.len(), 8);
        assert_eq!(cs.iter().filter(|c| c.warp_specialize).count(), 4);
        assert_eq!(Space::product().warps(&[4]).configs().iter().filter(|c| c.warp_specialize).count(), 0);
        let on = cs.iter().find(|c| c.warp_specialize).unwrap();
        assert!(on.to_string().ends_with("specialized"), "{on}");
        let off = Config::new(&[("BM", 64)], 4, 2);
        let text = serde_json::to_string(&off).unwrap();
        assert!(!text.contains("warp_specialize"), "{text}");
        assert_eq!(serde_json::from_str::<Config>(r#"{"consts":{"BM":64},"num_warps":4,"num_stages":2}"#).unwrap(), off);
        let back: Config = serde_json::from_str(&serde_json::to_string(on).unwrap()).unwrap();
        assert_eq!(&back, on);
    }

    /// Programs an SM are an axis too (innermost), 1 where not given; a results file
    /// without the field reads back as 1, and 1 is not written.
    #[test]
    fn programs_an_sm_are_a_tuned_choice_that_old_files_read_as_one() {
        let cs = Space::product().values("BM", &[64, 128]).specialize(&[false, true]).programs(&[1, 3]).configs();
        assert_eq!(cs.len(), 8);
        assert_eq!(cs.iter().filter(|c| c.programs_per_sm == 3).count(), 4);
        assert_eq!((cs[0].programs_per_sm, cs[1].programs_per_sm, cs[1].warp_specialize), (1, 3, false));
        assert!(Space::product().warps(&[4]).configs().iter().all(|c| c.programs_per_sm == 1));
        assert!(cs[1].to_string().ends_with("programs_per_sm=3"), "{}", cs[1]);
        let text = serde_json::to_string(&cs[0]).unwrap();
        assert!(!text.contains("programs_per_sm") && !cs[0].to_string().contains("programs"), "{text}");
        assert_eq!(serde_json::from_str::<Config>(r#"{"consts":{"BM":64},"num_warps":4,"num_stages":1}"#).unwrap(), cs[0]);
        let back: Config = serde_json::from_str(&serde_json::to_string(&cs[1]).unwrap()).unwrap();
        assert_eq!(back, cs[1]);
    }
}
