//! The autotuner: tunes a kernel once per (device, key) and launches the winner.

use crate::config::{Config, Space};
use crate::key::Key;
use crate::outputs::{default_tolerance, difference, Outputs, Saved};
use crate::store::{Entry, Store};
use crate::timer::{CudaTimer, Timer};
use dsl_runtime::compile::{kernel_fingerprint, num_stages_changes_code, COMPILER_FINGERPRINT};
use dsl_runtime::diag::{warn, Warning};
use dsl_runtime::ir::ParamSpec;
use dsl_runtime::{Kernel, Runtime};
use std::collections::HashMap;
use std::fmt;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Why tuning gave no configuration.
#[derive(Clone, Debug)]
pub enum TuneError {
    /// Every candidate failed; each one's reason.
    AllFailed { kernel: String, key: String, reasons: Vec<(Config, String)> },
    /// The runtime failed while saving or restoring the outputs or launching the winner;
    /// its error is the [`source`](std::error::Error::source) (shared, so that every
    /// thread waiting on the same tuning gets it).
    Runtime(Arc<dsl_runtime::Error>),
    /// A thread panicked while holding the tuner's state.
    Poisoned,
}

impl fmt::Display for TuneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TuneError::AllFailed { kernel, key, reasons } if reasons.is_empty() => {
                write!(f, "autotuning `{kernel}` for [{key}]: no candidate configuration is left after pruning")
            }
            TuneError::AllFailed { kernel, key, reasons } => {
                write!(f, "autotuning `{kernel}` for [{key}]: every configuration failed")?;
                for (c, r) in reasons {
                    write!(f, "\n  {c}: {r}")?;
                }
                Ok(())
            }
            TuneError::Runtime(e) => write!(f, "autotuning: {e}"),
            TuneError::Poisoned => write!(f, "autotuning: the tuner's state was poisoned by a panic in another thread"),
        }
    }
}

impl std::error::Error for TuneError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TuneError::Runtime(e) => Some(&**e),
            _ => None,
        }
    }
}

impl From<dsl_runtime::Error> for TuneError {
    fn from(e: dsl_runtime::Error) -> Self {
        TuneError::Runtime(Arc::new(e))
    }
}

type Pred = Box<dyn Fn(&Config, &Key) -> bool + Send + Sync>;
/// One tuning result per (device, key), computed once.
type Cell = Arc<OnceLock<Result<Config, TuneError>>>;
type Cost = Box<dyn Fn(&Config, &Key) -> f64 + Send + Sync>;

/// What happened to one candidate in one tuning session.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Median milliseconds.
    Timed(f64),
    /// Ran and checked, not timed (the CPU interpreter).
    Untimed,
    Failed(String),
    /// Not run: it compiles to the same code as this earlier candidate, which ran (or was
    /// known from the results file) without failing: candidates that build the same IR
    /// with the same `num_warps` and differ only in `num_stages`, where the kernel has no
    /// loop to pipeline ([`num_stages_changes_code`]).
    SameCodeAs(Config),
}

/// A record of one tuning session (what `RUTILE_TUNE_LOG=1` prints).
#[derive(Clone, Debug)]
pub struct Session {
    pub key: String,
    pub device: String,
    pub candidates: Vec<(Config, Outcome, bool)>, // outcome, from the disk cache
    pub winner: Config,
    pub seconds: f64,
}

/// Tunes one kernel. See the [crate docs](crate) for an example.
pub struct Autotuner {
    name: String,
    space: Space,
    prune: Vec<Pred>,
    top_k: Option<(usize, Cost)>,
    reset_each_run: bool,
    tolerance: Option<f64>,
    store: Store,
    timer: Option<Arc<dyn Timer>>,
    warmup: usize,
    reps: usize,
    cells: Mutex<HashMap<DeviceKey, HashMap<Key, Cell>>>,
    sessions: Mutex<Vec<Session>>,
}

/// Which device a runtime is, cheaply (no driver call): ordinal, compute capability and
/// driver version of a CUDA device; `None` for the interpreter.
type DeviceKey = Option<(usize, (u32, u32), i32)>;

fn device_key(rt: &Runtime) -> DeviceKey {
    match rt {
        Runtime::Cuda(c) => Some((c.context().ordinal(), c.target().cc, c.driver_version())),
        _ => None,
    }
}

/// `RUTILE_TUNE=off` (or `0`), read once per process.
fn tuning_off() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var("RUTILE_TUNE").is_ok_and(|v| v == "off" || v == "0"))
}

/// Which device a runtime is, for the results file: name, compute capability, driver version.
pub fn device_of(rt: &Runtime) -> (String, (u32, u32), i32) {
    match rt {
        Runtime::Cuda(c) => (c.context().name().unwrap_or_else(|_| "cuda".into()), c.target().cc, c.driver_version()),
        _ => ("cpu-interpreter".into(), (0, 0), 0),
    }
}

/// The compiler's fingerprint of the kernel of one configuration, for unspecialized
/// arguments ([`kernel_fingerprint`]): editing the kernel changes it.
pub fn ir_hash(k: &dyn Kernel) -> dsl_runtime::Result<String> {
    let specs = vec![ParamSpec::default(); k.meta().params.len()];
    kernel_fingerprint(k, &specs)
}

impl Autotuner {
    /// A tuner for `name` (the file name of its results) over `space`.
    pub fn new(name: &str, space: Space) -> Autotuner {
        Autotuner {
            name: name.to_string(),
            space,
            prune: vec![],
            top_k: None,
            reset_each_run: false,
            tolerance: None,
            store: Store::from_env(),
            timer: None,
            warmup: 3,
            reps: 20,
            cells: Mutex::new(HashMap::new()),
            sessions: Mutex::new(vec![]),
        }
    }
    /// Keep only candidates for which `keep(config, key)` holds.
    pub fn prune(mut self, keep: impl Fn(&Config, &Key) -> bool + Send + Sync + 'static) -> Self {
        self.prune.push(Box::new(keep));
        self
    }
    /// Time only the `k` candidates with the lowest `cost(config, key)` (a cost model).
    pub fn top_k(mut self, k: usize, cost: impl Fn(&Config, &Key) -> f64 + Send + Sync + 'static) -> Self {
        self.top_k = Some((k, Box::new(cost)));
        self
    }
    /// The kernel accumulates into (or works in place on) its outputs: restore them before
    /// every timed run too.
    pub fn reset_outputs(mut self) -> Self {
        self.reset_each_run = true;
        self
    }
    /// The largest relative L2 difference allowed between a candidate's outputs and the
    /// first valid candidate's (default: exact for integers, 1e-5 for f32, 1e-2 for 16-bit floats).
    pub fn tolerance(mut self, t: f64) -> Self {
        self.tolerance = Some(t);
        self
    }
    pub fn store(mut self, store: Store) -> Self {
        self.store = store;
        self
    }
    /// Time with this clock instead of CUDA events (tests).
    pub fn timer(mut self, t: Arc<dyn Timer>) -> Self {
        self.timer = Some(t);
        self
    }
    /// Launch each candidate `warmup` times untimed, then take the median of `reps` timed
    /// launches (default 3 and 20), with any timer.
    pub fn reps(mut self, warmup: usize, reps: usize) -> Self {
        self.warmup = warmup;
        self.reps = reps;
        self
    }
    /// The tuning sessions run so far.
    pub fn sessions(&self) -> Vec<Session> {
        self.sessions.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The candidates for `key`, pruned and cut to the top k.
    pub fn candidates(&self, key: &Key) -> Vec<Config> {
        let mut c: Vec<Config> = self.space.configs().into_iter().filter(|cfg| self.prune.iter().all(|p| p(cfg, key))).collect();
        if let Some((k, cost)) = &self.top_k {
            c.sort_by(|a, b| cost(a, key).total_cmp(&cost(b, key)));
            c.truncate(*k);
        }
        c
    }

    /// Launch with the best configuration for `key`, tuning first if this (device, key) has
    /// not been tuned in this process. `kernel(cfg)` gives the kernel of a configuration (for
    /// its IR hash) and `launch(cfg, outs)` launches it; both return `None` for a
    /// configuration they do not know (see [`dispatch!`](crate::dispatch)). Returns the
    /// configuration launched.
    pub fn launch<O: Outputs>(
        &self,
        rt: &Runtime,
        key: &Key,
        outs: &mut O,
        kernel: &dyn Fn(&Config) -> Option<Box<dyn Kernel>>,
        launch: &mut dyn FnMut(&Config, &mut O) -> Option<dsl_runtime::Result<()>>,
    ) -> Result<Config, TuneError> {
        let mut run = |cfg: &Config, outs: &mut O| -> dsl_runtime::Result<()> {
            launch(cfg, outs).unwrap_or_else(|| Err(dsl_runtime::Error::Launch { kernel: self.name.clone(), message: format!("no kernel for configuration {cfg}: add it to the dispatch list") }))
        };
        if tuning_off() {
            let cfg = self.candidates(key).into_iter().next().ok_or_else(|| TuneError::AllFailed { kernel: self.name.clone(), key: key.to_string(), reasons: vec![] })?;
            run(&cfg, outs)?;
            return Ok(cfg);
        }
        // The hot path: a lookup without allocating (the key is cloned on a miss only).
        let cell = {
            let mut cells = self.cells.lock().map_err(|_| TuneError::Poisoned)?;
            let per_key = cells.entry(device_key(rt)).or_default();
            match per_key.get(key) {
                Some(c) => c.clone(),
                None => per_key.entry(key.clone()).or_default().clone(),
            }
        };
        let mut tuned_here = false;
        let result = cell
            .get_or_init(|| {
                tuned_here = true;
                self.tune(rt, key, &device_of(rt), outs, kernel, &mut run)
            })
            .clone();
        let cfg = result?;
        if !tuned_here {
            run(&cfg, outs)?;
        }
        Ok(cfg)
    }

    fn tune<O: Outputs>(
        &self,
        rt: &Runtime,
        key: &Key,
        device: &(String, (u32, u32), i32),
        outs: &mut O,
        kernel: &dyn Fn(&Config) -> Option<Box<dyn Kernel>>,
        run: &mut dyn FnMut(&Config, &mut O) -> dsl_runtime::Result<()>,
    ) -> Result<Config, TuneError> {
        let t0 = Instant::now();
        let candidates = self.candidates(key);
        let on_disk = self.store.load(&self.name);
        // Saved when the first candidate has to run (not when every outcome is known).
        let mut saved: Option<Vec<Saved>> = None;
        let cuda_timer;
        let timer: Option<&dyn Timer> = match (&self.timer, rt) {
            (Some(t), _) => Some(t.as_ref()),
            (None, Runtime::Cuda(c)) => {
                cuda_timer = CudaTimer::new(c, self.warmup, self.reps);
                Some(&cuda_timer)
            }
            _ => None,
        };
        let mut reference: Option<Vec<Saved>> = None;
        let mut log: Vec<(Config, Outcome, bool)> = vec![];
        let mut new_entries = vec![];
        let mut bar: Option<indicatif::ProgressBar> = None;
        // The first candidate of each group that compiles to the same code, once it has
        // not failed: the others of its group are not run.
        let mut same_code: HashMap<(Config, String), Config> = HashMap::new();
        for (i, cfg) in candidates.iter().enumerate() {
            if bar.is_none() && t0.elapsed().as_secs_f64() > 1.0 && std::io::stderr().is_terminal() {
                let b = indicatif::ProgressBar::new(candidates.len() as u64).with_message(format!("autotuning {} [{key}]", self.name));
                b.set_position(i as u64);
                bar = Some(b);
            }
            if let Some(b) = &bar {
                b.set_position(i as u64);
            }
            let entry = |hash: &str, ms: Option<f64>, failure: Option<String>| Entry {
                kernel: self.name.clone(),
                ir_hash: hash.to_string(),
                compiler: COMPILER_FINGERPRINT.to_string(),
                debug: dsl_runtime::launch::debug_from_env(),
                config: cfg.clone(),
                device: device.0.clone(),
                cc: device.1,
                driver: device.2,
                key: key.to_string(),
                ms,
                failure,
            };
            let hash = match kernel(cfg) {
                None => {
                    log.push((cfg.clone(), Outcome::Failed("no kernel for this configuration: add it to the dispatch list".into()), false));
                    continue;
                }
                Some(k) => match ir_hash(k.as_ref()).and_then(|h| Ok((h, num_stages_changes_code(k.as_ref())?))) {
                    Ok(h) => h,
                    Err(e) => {
                        log.push((cfg.clone(), Outcome::Failed(format!("does not build: {e}")), false));
                        continue;
                    }
                },
            };
            let (hash, stages_matter) = hash;
            // The same kernel IR and options, up to what does not change the code: the
            // stages of a kernel with no loop to pipeline, warp specialization without
            // one or off Hopper (compute capability 9.0: TMA and `wgmma`), the interpreter
            // included, and the programs an SM on the interpreter (a register budget).
            let specialized = cfg.warp_specialize && stages_matter && cfg.num_stages >= 2 && device.1 == (9, 0);
            let programs_per_sm = if device.1 == (0, 0) { 1 } else { cfg.programs_per_sm };
            let code = (Config { num_stages: if stages_matter { cfg.num_stages } else { 0 }, warp_specialize: specialized, programs_per_sm, ..cfg.clone() }, hash.clone());
            if let Some(first) = same_code.get(&code) {
                log.push((cfg.clone(), Outcome::SameCodeAs(first.clone()), false));
                continue;
            }
            // Known from an earlier session (this process or another)?
            let probe = entry(&hash, None, None);
            if let Some(e) = on_disk.iter().find(|e| e.same_slot(&probe)) {
                let o = match (&e.failure, e.ms) {
                    (Some(f), _) => Outcome::Failed(f.clone()),
                    (None, Some(ms)) => Outcome::Timed(ms),
                    (None, None) => Outcome::Untimed,
                };
                if !matches!(o, Outcome::Failed(_)) {
                    same_code.insert(code, cfg.clone());
                }
                log.push((cfg.clone(), o, true));
                continue;
            }
            if saved.is_none() {
                saved = Some(outs.snapshot()?);
            }
            let outcome = self.try_candidate(rt, cfg, outs, saved.as_deref().expect("saved above"), &mut reference, timer, run);
            if !matches!(outcome, Outcome::Failed(_)) {
                same_code.insert(code, cfg.clone());
            }
            new_entries.push(match &outcome {
                Outcome::Timed(ms) => entry(&hash, Some(*ms), None),
                Outcome::Untimed => entry(&hash, None, None),
                Outcome::Failed(f) => entry(&hash, None, Some(f.clone())),
                Outcome::SameCodeAs(_) => unreachable!("a candidate that ran has its own outcome"),
            });
            log.push((cfg.clone(), outcome, false));
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        // The fastest timed candidate; without timing (the interpreter), the first valid one.
        let timed = log.iter().filter_map(|(c, o, _)| if let Outcome::Timed(ms) = o { Some((c, *ms)) } else { None }).min_by(|a, b| a.1.total_cmp(&b.1));
        let winner = match timed {
            Some((c, _)) => c.clone(),
            None => match log.iter().find(|(_, o, _)| *o == Outcome::Untimed) {
                Some((c, _, _)) => {
                    warn(Warning::TuneFallback, format!("autotuning `{}` [{key}] without a clock (the CPU interpreter): the first valid configuration ({c}) is used, not the fastest", self.name));
                    c.clone()
                }
                None => {
                    if let Some(s) = &saved {
                        outs.restore(s)?;
                    }
                    self.store.save(&self.name, &new_entries);
                    let reasons = log.into_iter().map(|(c, o, _)| (c, if let Outcome::Failed(f) = o { f } else { "not run".into() })).collect();
                    return Err(TuneError::AllFailed { kernel: self.name.clone(), key: key.to_string(), reasons });
                }
            },
        };
        // Leave exactly what one launch of the winner leaves.
        if let Some(s) = &saved {
            outs.restore(s)?;
        }
        run(&winner, outs)?;
        self.store.save(&self.name, &new_entries);
        let session = Session { key: key.to_string(), device: device.0.clone(), candidates: log, winner: winner.clone(), seconds: t0.elapsed().as_secs_f64() };
        if std::env::var("RUTILE_TUNE_LOG").is_ok_and(|v| v == "1") {
            eprintln!("{}", self.describe(&session));
        }
        if let Ok(mut s) = self.sessions.lock() {
            s.push(session);
        }
        Ok(winner)
    }

    /// Compile, launch, check and time one candidate.
    #[allow(clippy::too_many_arguments)]
    fn try_candidate<O: Outputs>(
        &self,
        rt: &Runtime,
        cfg: &Config,
        outs: &mut O,
        saved: &[Saved],
        reference: &mut Option<Vec<Saved>>,
        timer: Option<&dyn Timer>,
        run: &mut dyn FnMut(&Config, &mut O) -> dsl_runtime::Result<()>,
    ) -> Outcome {
        let attempt = (|| -> Result<Outcome, String> {
            // Always from the original outputs: a candidate that leaves elements unwritten
            // must not inherit a previous candidate's (correct) values.
            outs.restore(saved).map_err(|e| format!("cannot restore outputs: {e}"))?;
            run(cfg, outs).map_err(|e| e.to_string())?;
            rt.synchronize().map_err(|e| e.to_string())?;
            let got = outs.snapshot().map_err(|e| format!("cannot read outputs: {e}"))?;
            match reference {
                None => *reference = Some(got),
                Some(r) => {
                    for (k, (a, b)) in r.iter().zip(&got).enumerate() {
                        let d = difference(a, b);
                        let tol = self.tolerance.unwrap_or_else(|| default_tolerance(a.dtype));
                        if d > tol {
                            return Err(format!("wrong result: output {k} differs from the first valid configuration's by {d:.3e} (relative L2, tolerance {tol:.0e})"));
                        }
                    }
                }
            }
            let Some(timer) = timer else { return Ok(Outcome::Untimed) };
            let reset = self.reset_each_run;
            // Two closures share `outs`; take it through a cell for the duration.
            let cell = std::cell::RefCell::new(&mut *outs);
            let mut prepare = || if reset { cell.borrow_mut().restore(saved) } else { Ok(()) };
            let mut go = || run(cfg, &mut cell.borrow_mut());
            let ms = timer.time(cfg, self.warmup, self.reps, &mut prepare, &mut go).map_err(|e| e.to_string())?;
            Ok(Outcome::Timed(ms))
        })();
        attempt.unwrap_or_else(Outcome::Failed)
    }

    /// A readable account of a session.
    pub fn describe(&self, s: &Session) -> String {
        let mut out = format!("rutile autotune `{}` [{}] on {} ({:.2} s):", self.name, s.key, s.device, s.seconds);
        for (c, o, cached) in &s.candidates {
            let what = match o {
                Outcome::Timed(ms) => format!("{ms:.4} ms"),
                Outcome::Untimed => "valid (not timed)".into(),
                Outcome::Failed(f) => format!("failed: {f}"),
                Outcome::SameCodeAs(first) => format!("same code as {first}, not run"),
            };
            let mark = if *c == s.winner { " <- winner" } else { "" };
            let from = if *cached { " (cached)" } else { "" };
            out += &format!("\n  {c}: {what}{from}{mark}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::TuneError;

    #[test]
    fn a_runtime_failure_stays_the_runtime_error() {
        let e: TuneError = dsl_runtime::Error::Buffer("size mismatch".into()).into();
        let source = std::error::Error::source(&e).expect("the runtime error is the source");
        assert!(matches!(source.downcast_ref::<dsl_runtime::Error>(), Some(dsl_runtime::Error::Buffer(m)) if m == "size mismatch"));
        assert_eq!(e.to_string(), "autotuning: buffer: size mismatch");
    }
}
