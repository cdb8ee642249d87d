//! The autotuner without a GPU: the interpreter runs (and checks) every candidate, a fake
//! clock stands in for CUDA events.

use autotune::{dispatch, Autotuner, Bucket, Config, FakeTimer, Key, Outcome, Space, Store, TuneError};
use dsl_runtime::prelude::*;
use dsl_runtime::Kernel;
use kernels_lib::{axpy, grid_for, relu_mul_add};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rutile-tune-{name}-{}", crate::common::unique()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// How a results file of this version starts.
fn schema_line() -> String {
    format!("\"schema\": {}", autotune::store::SCHEMA)
}

/// Fake times: larger blocks are faster, except BLOCK=2048 (slowest).
fn fake() -> Arc<FakeTimer<impl Fn(&Config) -> f64 + Send + Sync>> {
    Arc::new(FakeTimer(|c: &Config| if c.get("BLOCK") == 2048 { 9.0 } else { 1.0 / c.get("BLOCK") as f64 + c.num_warps as f64 * 1e-6 }))
}

struct Rma {
    rt: Runtime,
    n: usize,
    a: Buffer<f32>,
    b: Buffer<f32>,
    c: Buffer<f32>,
}

impl Rma {
    fn new(n: usize) -> Rma {
        let rt = Runtime::interpreter();
        let s = crate::common::seed();
        let (a, b, c) = (crate::common::random_f32(n, s), crate::common::random_f32(n, s + 1), crate::common::random_f32(n, s + 2));
        Rma { a: rt.upload(&a).unwrap(), b: rt.upload(&b).unwrap(), c: rt.upload(&c).unwrap(), rt, n }
    }
    /// Tune and launch; `bad` makes BLOCK=512 compute something else.
    fn run(&self, t: &Autotuner, out: &mut Buffer<f32>, bad: bool) -> Result<Config, TuneError> {
        let n = self.n;
        let key = Key::new().with("n", n as i64, Bucket::NextPow2);
        t.launch(
            &self.rt,
            &key,
            &mut (out,),
            &|cfg| dispatch!(cfg.get("BLOCK"), [256, 512, 1024, 2048, 2000000], |B| Box::new(relu_mul_add::<f32, B>::new()) as Box<dyn Kernel>),
            &mut |cfg, (out,)| {
                dispatch!(cfg.get("BLOCK"), [256, 512, 1024, 2048, 2000000], |B| {
                    let g = grid_for(n, B).warps(cfg.num_warps).stages(cfg.num_stages);
                    if bad && B == 512 {
                        relu_mul_add::<f32, B>::launch(&self.rt, g, &self.b, &self.a, &self.c, &mut **out, n as i32)
                    } else {
                        relu_mul_add::<f32, B>::launch(&self.rt, g, &self.a, &self.b, &self.c, &mut **out, n as i32)
                    }
                })
            },
        )
    }
    fn expected(&self) -> Vec<f32> {
        let (a, b, c) = (self.a.to_vec().unwrap(), self.b.to_vec().unwrap(), self.c.to_vec().unwrap());
        (0..self.n).map(|i| a[i].max(0.0) * b[i] + c[i]).collect()
    }
}

#[test]
fn keys_bucket_and_spaces_prune() {
    assert_eq!(Bucket::NextPow2.apply(1000), 1024);
    assert_eq!(Bucket::NextPow2.apply(1024), 1024);
    assert_eq!(Bucket::Multiple(128).apply(129), 256);
    assert_eq!(Key::new().with("n", 3000, Bucket::NextPow2), Key::new().with("n", 4096, Bucket::Exact));
    let space = Space::product().pow2("BLOCK", 128, 4096).warps(&[2, 4, 8]).stages(&[1, 2]);
    assert_eq!(space.configs().len(), 6 * 3 * 2);
    let t = Autotuner::new("prune", space)
        .prune(|c, k| c.get("BLOCK") <= k.value("n").unwrap() && c.num_stages == 1)
        .top_k(4, |c, _| (c.get("BLOCK") as f64 - 1024.0).abs() + c.num_warps as f64);
    let got = t.candidates(&Key::new().with("n", 1000, Bucket::NextPow2));
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|c| c.get("BLOCK") <= 1024 && c.num_stages == 1), "{got:?}");
    assert_eq!(got[0], Config::new(&[("BLOCK", 1024)], 2, 1));
}

#[test]
fn picks_the_fastest_valid_candidate_and_records_failures() {
    let p = Rma::new(3000);
    let space = Space::list(vec![
        Config::new(&[("BLOCK", 256)], 4, 1),
        Config::new(&[("BLOCK", 512)], 4, 1),  // wrong result (fastest by the clock)
        Config::new(&[("BLOCK", 1024)], 4, 1), // the winner
        Config::new(&[("BLOCK", 2000000)], 4, 1), // does not build
        Config::new(&[("BLOCK", 4096)], 4, 1), // not in the dispatch list
        Config::new(&[("BLOCK", 2048)], 3, 1), // bad num_warps: the launch fails
    ]);
    let t = Autotuner::new("rma_pick", space).store(Store::new(None)).timer(Arc::new(FakeTimer(|c: &Config| if c.get("BLOCK") == 512 { 0.1 } else { 1.0 / c.get("BLOCK") as f64 })));
    let mut out = p.rt.upload(&vec![f32::NAN; p.n]).unwrap();
    let cfg = p.run(&t, &mut out, true).unwrap();
    assert_eq!(cfg.get("BLOCK"), 1024);
    assert_eq!(out.to_vec().unwrap(), p.expected());
    let s = &t.sessions()[0];
    let reason = |b: i64| match &s.candidates.iter().find(|(c, _, _)| c.get("BLOCK") == b).unwrap().1 {
        Outcome::Failed(f) => f.clone(),
        o => panic!("BLOCK={b}: {o:?}"),
    };
    assert!(reason(512).contains("wrong result"), "{}", reason(512));
    assert!(reason(2000000).contains("does not build") && reason(2000000).contains("larger than the limit"), "{}", reason(2000000));
    assert!(reason(4096).contains("dispatch list"), "{}", reason(4096));
    assert!(reason(2048).contains("num_warps"), "{}", reason(2048));
    assert!(t.describe(s).contains("<- winner"));
    // Later launches with the same (bucketed) key do not tune again.
    let mut out2 = p.rt.zeros::<f32>(p.n).unwrap();
    assert_eq!(p.run(&t, &mut out2, true).unwrap().get("BLOCK"), 1024);
    assert_eq!(t.sessions().len(), 1);
}

#[test]
fn candidates_that_differ_only_in_num_stages_run_once() {
    // relu-mul-add has no loop to pipeline, so BLOCK x stages compiles to two kernels: the
    // first candidate of each BLOCK runs and is timed, the others say whose code they share.
    let p = Rma::new(1000);
    let timed = Arc::new(std::sync::Mutex::new(vec![]));
    let clock = |timed: Arc<std::sync::Mutex<Vec<Config>>>| {
        Arc::new(FakeTimer(move |c: &Config| {
            timed.lock().unwrap().push(c.clone());
            1.0 / c.get("BLOCK") as f64
        }))
    };
    let space = Space::product().values("BLOCK", &[256, 1024]).warps(&[4]).stages(&[1, 2, 3]);
    let t = Autotuner::new("rma_stages", space).store(Store::new(None)).timer(clock(timed.clone()));
    let mut out = p.rt.zeros::<f32>(p.n).unwrap();
    let cfg = p.run(&t, &mut out, false).unwrap();
    assert_eq!(cfg, Config::new(&[("BLOCK", 1024)], 4, 1));
    assert_eq!(out.to_vec().unwrap(), p.expected());
    let first = |b: i64| Config::new(&[("BLOCK", b)], 4, 1);
    assert_eq!(*timed.lock().unwrap(), vec![first(256), first(1024)], "timed");
    let s = &t.sessions()[0];
    for (c, o, _) in &s.candidates {
        let want = if c.num_stages == 1 { o.clone() } else { Outcome::SameCodeAs(first(c.get("BLOCK"))) };
        assert_eq!(*o, want, "{c}");
    }
    let log = t.describe(s);
    assert!(log.contains("BLOCK=1024 warps=4 stages=3: same code as BLOCK=1024 warps=4 stages=1, not run"), "{log}");
    // A candidate that fails (here: the launch refuses num_stages=9) does not stand for
    // its group: the next one runs.
    timed.lock().unwrap().clear();
    let space = Space::list([9, 2, 1].iter().map(|&s| Config::new(&[("BLOCK", 256)], 4, s)).collect());
    let t = Autotuner::new("rma_stages_fail", space).store(Store::new(None)).timer(clock(timed.clone()));
    assert_eq!(p.run(&t, &mut out, false).unwrap(), Config::new(&[("BLOCK", 256)], 4, 2));
    let outcomes: Vec<Outcome> = t.sessions()[0].candidates.iter().map(|(_, o, _)| o.clone()).collect();
    assert!(matches!(&outcomes[0], Outcome::Failed(f) if f.contains("num_stages must be from 1 to 8, got 9")), "{outcomes:?}");
    assert!(matches!(outcomes[1], Outcome::Timed(_)), "{outcomes:?}");
    assert_eq!(outcomes[2], Outcome::SameCodeAs(Config::new(&[("BLOCK", 256)], 4, 2)));
    // Warp specialization changes nothing without a loop to pipeline (nor on the
    // interpreter): its candidates share the unspecialized one's code.
    let space = Space::product().values("BLOCK", &[256]).warps(&[4]).stages(&[2]).specialize(&[false, true]);
    let t = Autotuner::new("rma_specialize", space).store(Store::new(None)).timer(clock(timed.clone()));
    assert_eq!(p.run(&t, &mut out, false).unwrap(), Config::new(&[("BLOCK", 256)], 4, 2));
    let outcomes: Vec<Outcome> = t.sessions()[0].candidates.iter().map(|(_, o, _)| o.clone()).collect();
    assert_eq!(outcomes[1], Outcome::SameCodeAs(Config::new(&[("BLOCK", 256)], 4, 2)), "{outcomes:?}");
}

/// `stages = [9, 2]`: the first candidate is refused by the launch when its `num_stages`
/// reaches the `LaunchConfig`.
#[kernel(tune(BLOCK = [64], stages = [9, 2], key = [n], grid = (n as usize).div_ceil(BLOCK)))]
fn fill_ones<const BLOCK: usize>(out: Ptr<i32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(out + offs, full([BLOCK], 1), offs < n);
}

#[test]
fn tuned_kernels_launch_with_the_candidates_num_stages() {
    // In a child process, with tuning results in memory only (the generated tuner reads
    // its store from the environment).
    crate::common::run_in_processes("tune::child_tuned_stages", 1, &[("RUTILE_TUNE_CACHE", std::ffi::OsStr::new("off"))]);
}

/// Child half of `tuned_kernels_launch_with_the_candidates_num_stages`.
#[test]
#[ignore = "run by tuned_kernels_launch_with_the_candidates_num_stages"]
fn child_tuned_stages() {
    if std::env::var("RUTILE_TUNE_CACHE").as_deref() != Ok("off") {
        return;
    }
    let rt = Runtime::interpreter();
    let mut out = rt.zeros::<i32>(100).unwrap();
    // The interpreter takes the first valid candidate: stages=9 is not one.
    let cfg = fill_ones_tuned(&rt, &mut out, 100).unwrap();
    assert_eq!(cfg, Config::new(&[("BLOCK", 64)], 4, 2));
    assert_eq!(out.to_vec().unwrap(), vec![1; 100]);
}

#[test]
fn all_failing_candidates_are_listed_in_the_error() {
    let p = Rma::new(100);
    let space = Space::list(vec![Config::new(&[("BLOCK", 2000000)], 4, 1), Config::new(&[("BLOCK", 4096)], 4, 1)]);
    let t = Autotuner::new("rma_fail", space).store(Store::new(None)).timer(fake());
    let mut out = p.rt.zeros::<f32>(p.n).unwrap();
    let err = p.run(&t, &mut out, false).unwrap_err().to_string();
    assert!(err.contains("every configuration failed"), "{err}");
    assert!(err.contains("BLOCK=2000000 warps=4 stages=1: does not build"), "{err}");
    assert!(err.contains("BLOCK=4096 warps=4 stages=1: no kernel"), "{err}");
    // Pruning that leaves nothing says so.
    let t = Autotuner::new("rma_pruned", Space::product().values("BLOCK", &[256]).warps(&[4])).store(Store::new(None)).timer(fake()).prune(|_, _| false);
    let err = p.run(&t, &mut out, false).unwrap_err().to_string();
    assert!(err.contains("no candidate configuration is left after pruning"), "{err}");
}

#[test]
fn in_place_kernels_start_every_launch_from_the_original_outputs() {
    // axpy accumulates in place: y = alpha * x + y. With `reset_outputs`, every launch the
    // tuner makes (the check of each candidate, its warm-up and timed launches, the
    // winner's) starts from the original y, so the timed launches see real inputs and y
    // ends as one launch leaves it.
    let rt = Runtime::interpreter();
    let n = 2000;
    let x = crate::common::random_f32(n, 1);
    let y0 = crate::common::random_f32(n, 2);
    let dx = rt.upload(&x).unwrap();
    let mut y = rt.upload(&y0).unwrap();
    let (warmup, reps) = (2, 3);
    let t = Autotuner::new("axpy_tune", Space::product().values("BLOCK", &[256, 512, 1024]).warps(&[4, 8]))
        .store(Store::new(None))
        .reset_outputs()
        .reps(warmup, reps)
        .timer(fake());
    let (mut launches, mut from_accumulated) = (0, 0);
    let cfg = t
        .launch(
            &rt,
            &Key::new().with("n", n as i64, Bucket::NextPow2),
            &mut (&mut y,),
            &|cfg| dispatch!(cfg.get("BLOCK"), [256, 512, 1024], |B| Box::new(axpy::<B>) as Box<dyn Kernel>),
            &mut |cfg, (y,)| {
                launches += 1;
                if y.to_vec().unwrap() != y0 {
                    from_accumulated += 1;
                }
                dispatch!(cfg.get("BLOCK"), [256, 512, 1024], |B| axpy::<B>::launch(&rt, grid_for(n, B).warps(cfg.num_warps), 0.5, &dx, &mut **y, n as i64))
            },
        )
        .unwrap();
    assert_eq!(cfg, Config::new(&[("BLOCK", 1024)], 4, 1));
    assert_eq!(launches, 6 * (1 + warmup + reps) + 1, "each candidate checked once, then warmed up and timed; the winner launched");
    assert_eq!(from_accumulated, 0, "{from_accumulated} of {launches} launches started from an already accumulated y");
    let want: Vec<f32> = (0..n).map(|i| 0.5 * x[i] + y0[i]).collect();
    assert_eq!(y.to_vec().unwrap(), want);
}

#[test]
fn without_a_clock_the_interpreter_picks_the_first_valid_candidate() {
    let p = Rma::new(500);
    let t = Autotuner::new("rma_interp", Space::product().values("BLOCK", &[2000000, 1024, 256])).store(Store::new(None));
    let mut out = p.rt.zeros::<f32>(p.n).unwrap();
    assert_eq!(p.run(&t, &mut out, false).unwrap().get("BLOCK"), 1024);
    assert!(t.sessions()[0].candidates.iter().any(|(_, o, _)| *o == Outcome::Untimed));
}

#[test]
fn results_persist_and_new_candidates_alone_are_tuned() {
    let dir = tmp("persist");
    let p = Rma::new(1000);
    let space = || Space::product().values("BLOCK", &[256, 1024]).warps(&[4]);
    let t = Autotuner::new("rma_persist", space()).store(Store::new(Some(dir.clone()))).timer(fake());
    let mut out = p.rt.zeros::<f32>(p.n).unwrap();
    assert_eq!(p.run(&t, &mut out, false).unwrap().get("BLOCK"), 1024);
    let text = std::fs::read_to_string(dir.join("rma_persist.json")).unwrap();
    assert!(text.contains(&schema_line()) && text.contains("\"BLOCK\": 1024") && text.contains("\"key\": \"n=1024\""), "{text}");
    // A new tuner (a new process) reuses both measurements...
    let t2 = Autotuner::new("rma_persist", space()).store(Store::new(Some(dir.clone()))).timer(fake());
    assert_eq!(p.run(&t2, &mut out, false).unwrap().get("BLOCK"), 1024);
    assert!(t2.sessions()[0].candidates.iter().all(|(_, _, cached)| *cached));
    // ...and with one candidate added, only that one runs.
    let t3 = Autotuner::new("rma_persist", Space::list([256, 1024, 512].iter().map(|&b| Config::new(&[("BLOCK", b)], 4, 1)).collect()))
        .store(Store::new(Some(dir.clone())))
        .timer(Arc::new(FakeTimer(|c: &Config| if c.get("BLOCK") == 512 { 1e-9 } else { 1.0 })));
    assert_eq!(p.run(&t3, &mut out, false).unwrap().get("BLOCK"), 512);
    let fresh: Vec<i64> = t3.sessions()[0].candidates.iter().filter(|(_, _, c)| !c).map(|(c, _, _)| c.get("BLOCK")).collect();
    assert_eq!(fresh, vec![512]);
    // Another key is tuned apart.
    let q = Rma::new(5000);
    let mut out = q.rt.zeros::<f32>(q.n).unwrap();
    q.run(&t2, &mut out, false).unwrap();
    assert!(t2.sessions()[1].candidates.iter().all(|(_, _, cached)| !cached));
}

#[test]
fn results_of_another_compiler_are_not_used() {
    let dir = tmp("compiler");
    let p = Rma::new(1000);
    let space = || Space::product().values("BLOCK", &[256, 1024]).warps(&[4]);
    let tuner = || Autotuner::new("rma_compiler", space()).store(Store::new(Some(dir.clone()))).timer(fake());
    let mut out = p.rt.zeros::<f32>(p.n).unwrap();
    p.run(&tuner(), &mut out, false).unwrap();
    let store = Store::new(Some(dir.clone()));
    let mine = store.load("rma_compiler");
    assert_eq!(mine.len(), 2);
    assert!(mine.iter().all(|e| e.compiler == dsl_runtime::compile::COMPILER_FINGERPRINT), "{mine:?}");
    // The same measurements, as an older compiler would have left them.
    std::fs::remove_file(store.path("rma_compiler").unwrap()).unwrap();
    let older: Vec<_> = mine.into_iter().map(|e| autotune::Entry { compiler: "an-older-compiler".into(), ..e }).collect();
    store.save("rma_compiler", &older);
    let t = tuner();
    assert_eq!(p.run(&t, &mut out, false).unwrap().get("BLOCK"), 1024);
    assert!(t.sessions()[0].candidates.iter().all(|(_, _, cached)| !cached), "re-tuned: {}", t.describe(&t.sessions()[0]));
    assert_eq!(out.to_vec().unwrap(), p.expected());
    // Both compilers' results are kept; this compiler's are used from now on.
    assert_eq!(store.load("rma_compiler").len(), 4);
    let t = tuner();
    p.run(&t, &mut out, false).unwrap();
    assert!(t.sessions()[0].candidates.iter().all(|(_, _, cached)| *cached));
}

#[test]
fn corrupt_or_foreign_files_are_ignored_with_a_warning() {
    for (name, text) in [("corrupt", "{ not json"), ("foreign", "{\"schema\": 999, \"entries\": []}")] {
        let dir = tmp(name);
        std::fs::write(dir.join("rma_file.json"), text).unwrap();
        let p = Rma::new(300);
        let t = Autotuner::new("rma_file", Space::product().values("BLOCK", &[256, 1024])).store(Store::new(Some(dir.clone()))).timer(fake());
        let mut out = p.rt.zeros::<f32>(p.n).unwrap();
        assert_eq!(p.run(&t, &mut out, false).unwrap().get("BLOCK"), 1024);
        assert_eq!(out.to_vec().unwrap(), p.expected());
        // The file was replaced by a valid one that a new tuner reads back.
        let text = std::fs::read_to_string(dir.join("rma_file.json")).unwrap();
        assert!(text.contains(&schema_line()), "{name}: {text}");
        assert_eq!(Store::new(Some(dir.clone())).load("rma_file").len(), 2, "{name}");
    }
}

#[test]
fn threads_launching_one_untuned_key_tune_it_once() {
    let p = Arc::new(Rma::new(2000));
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let t = Arc::new(
        Autotuner::new("rma_threads", Space::product().values("BLOCK", &[256, 1024]).warps(&[4]))
            .store(Store::new(None))
            .timer(Arc::new(FakeTimer(move |c: &Config| {
                counted.fetch_add(1, Ordering::SeqCst);
                1.0 / c.get("BLOCK") as f64
            }))),
    );
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let (p, t) = (p.clone(), t.clone());
            std::thread::spawn(move || {
                let mut out = p.rt.zeros::<f32>(p.n).unwrap();
                let cfg = p.run(&t, &mut out, false).unwrap();
                assert_eq!(out.to_vec().unwrap(), p.expected());
                cfg
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap().get("BLOCK"), 1024);
    }
    assert_eq!(t.sessions().len(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each candidate timed once");
}

#[test]
fn two_processes_tuning_at_once_both_succeed() {
    let dir = tmp("procs");
    crate::common::run_in_processes("tune::child_tuner", 3, &[("RUTILE_TEST_TUNE_DIR", dir.as_os_str())]);
    let text = std::fs::read_to_string(dir.join("rma_procs.json")).unwrap();
    assert!(text.contains(&schema_line()), "{text}");
    let left = std::fs::read_dir(&dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".tmp")).count();
    assert_eq!(left, 0);
}

/// Child half of `two_processes_tuning_at_once_both_succeed`.
#[test]
#[ignore = "run by two_processes_tuning_at_once_both_succeed"]
fn child_tuner() {
    let Some(dir) = std::env::var_os("RUTILE_TEST_TUNE_DIR") else { return };
    let p = Rma::new(1500);
    let t = Autotuner::new("rma_procs", Space::product().values("BLOCK", &[256, 512, 1024]).warps(&[4, 8])).store(Store::new(Some(dir.into()))).timer(fake());
    let mut out = p.rt.zeros::<f32>(p.n).unwrap();
    assert_eq!(p.run(&t, &mut out, false).unwrap().get("BLOCK"), 1024);
}

/// Keys each `child_tunes_many_keys` process tunes (one save each).
const KEYS_PER_PROCESS: i64 = 40;

#[test]
fn processes_tuning_other_keys_keep_each_others_results() {
    // Each process tunes (and saves) its own keys of one kernel into one directory, many
    // times over: the saves interleave, and without the store's lock one process's rename
    // drops what another merged in the meantime.
    let dir = tmp("keys");
    let procs = 4;
    crate::common::run_in_processes("tune::child_tunes_many_keys", procs, &[("RUTILE_TEST_TUNE_DIR", dir.as_os_str())]);
    let mut by_process: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for e in Store::new(Some(dir.clone())).load("rma_keys") {
        let (process, i) = e.key.split_once(' ').unwrap();
        by_process.entry(process.to_string()).or_default().push(i.to_string());
    }
    assert_eq!(by_process.len(), procs, "processes with results: {:?}", by_process.keys());
    for (process, mut keys) in by_process {
        keys.sort_by_key(|k| k["i=".len()..].parse::<i64>().unwrap());
        let want: Vec<String> = (0..KEYS_PER_PROCESS).map(|i| format!("i={i}")).collect();
        assert_eq!(keys, want, "{process}: keys lost");
    }
}

/// Child half of `processes_tuning_other_keys_keep_each_others_results`.
#[test]
#[ignore = "run by processes_tuning_other_keys_keep_each_others_results"]
fn child_tunes_many_keys() {
    let Some(dir) = std::env::var_os("RUTILE_TEST_TUNE_DIR") else { return };
    let p = Rma::new(64);
    let n = p.n;
    let t = Autotuner::new("rma_keys", Space::product().values("BLOCK", &[256]).warps(&[4])).store(Store::new(Some(dir.into()))).reps(0, 1).timer(fake());
    let mut out = p.rt.zeros::<f32>(n).unwrap();
    for i in 0..KEYS_PER_PROCESS {
        let key = Key::new().with("process", std::process::id() as i64, Bucket::Exact).with("i", i, Bucket::Exact);
        t.launch(
            &p.rt,
            &key,
            &mut (&mut out,),
            &|cfg| dispatch!(cfg.get("BLOCK"), [256], |B| Box::new(relu_mul_add::<f32, B>::new()) as Box<dyn Kernel>),
            &mut |cfg, (out,)| dispatch!(cfg.get("BLOCK"), [256], |B| relu_mul_add::<f32, B>::launch(&p.rt, grid_for(n, B).warps(cfg.num_warps), &p.a, &p.b, &p.c, &mut **out, n as i32)),
        )
        .unwrap();
        assert_eq!(t.sessions().len() as i64, i + 1);
    }
}

#[test]
fn store_problems_print_one_warning_line() {
    // In a child process, as a user would run it: a corrupt results file, and a lock that
    // cannot be taken (a directory where the lock file goes). Tuning still works, the
    // results are still written, and stderr says what happened.
    let dir = tmp("warn");
    std::fs::write(dir.join("rma_warn.json"), "{ not json").unwrap();
    std::fs::create_dir_all(dir.join("rma_warn.lock")).unwrap();
    let run = |warnings: Option<&str>| {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child.args(["tune::child_warns", "--exact", "--ignored", "--nocapture", "--test-threads=1"]).env("RUTILE_TEST_TUNE_DIR", &dir).env_remove("RUTILE_WARNINGS");
        if let Some(w) = warnings {
            child.env("RUTILE_WARNINGS", w);
        }
        let out = child.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        std::fs::write(dir.join("rma_warn.json"), "{ not json").unwrap();
        stderr.lines().filter(|l| l.starts_with("rutile: warning:")).map(str::to_string).collect::<Vec<_>>()
    };
    let once = run(None);
    assert_eq!(once.len(), 1, "one line per kind: {once:?}");
    assert!(once[0].contains("ignoring corrupt tuning results") && once[0].contains("rma_warn.json"), "{once:?}");
    let all = run(Some("all"));
    assert!(all.iter().any(|l| l.contains("without a lock") && l.contains("rma_warn.lock")), "{all:?}");
}

/// Child half of `store_problems_print_one_warning_line`.
#[test]
#[ignore = "run by store_problems_print_one_warning_line"]
fn child_warns() {
    let Some(dir) = std::env::var_os("RUTILE_TEST_TUNE_DIR") else { return };
    let p = Rma::new(300);
    let store = Store::new(Some(dir.into()));
    let t = Autotuner::new("rma_warn", Space::product().values("BLOCK", &[256, 1024])).store(store.clone()).timer(fake());
    let mut out = p.rt.zeros::<f32>(p.n).unwrap();
    assert_eq!(p.run(&t, &mut out, false).unwrap().get("BLOCK"), 1024);
    assert_eq!(store.load("rma_warn").len(), 2, "written without the lock");
}

#[test]
fn kernels_declare_their_candidates_in_the_attribute() {
    // `#[kernel(tune(..))]` on `axpy` (in place) and `gelu_tanh` generates `*_tuned`.
    let rt = Runtime::interpreter();
    let n = 3000;
    let s = crate::common::seed();
    let (x, y0) = (crate::common::random_f32(n, s), crate::common::random_f32(n, s + 1));
    let dx = rt.upload(&x).unwrap();
    let mut y = rt.upload(&y0).unwrap();
    let cfg = kernels_lib::axpy_tuned(&rt, 0.5, &dx, &mut y, n as i64).unwrap();
    // The interpreter takes the first candidate left by `prune` (BLOCK >= 32 * warps);
    // all of them ran, y was updated once.
    assert_eq!(cfg, Config::new(&[("BLOCK", 256)], 2, 1));
    let want: Vec<f32> = (0..n).map(|i| 0.5 * x[i] + y0[i]).collect();
    assert_eq!(y.to_vec().unwrap(), want);
    let mut tuned = rt.zeros::<f32>(n).unwrap();
    kernels_lib::gelu_tanh_tuned(&rt, &dx, &mut tuned, n as i32).unwrap();
    let mut plain = rt.zeros::<f32>(n).unwrap();
    kernels_lib::gelu_tanh::<1024>::launch(&rt, grid_for(n, 1024), &dx, &mut plain, n as i32).unwrap();
    assert_eq!(tuned.to_vec().unwrap(), plain.to_vec().unwrap());
}

#[test]
fn rutile_tune_off_launches_the_first_candidate() {
    crate::common::run_in_processes("tune::child_tune_off", 1, &[("RUTILE_TUNE", std::ffi::OsStr::new("off"))]);
}

/// Child half of `rutile_tune_off_launches_the_first_candidate`.
#[test]
#[ignore = "run by rutile_tune_off_launches_the_first_candidate"]
fn child_tune_off() {
    if std::env::var("RUTILE_TUNE").as_deref() != Ok("off") {
        return;
    }
    let p = Rma::new(700);
    let t = Autotuner::new("rma_off", Space::product().values("BLOCK", &[1024, 256])).store(Store::new(None)).timer(fake());
    let mut out = p.rt.zeros::<f32>(p.n).unwrap();
    assert_eq!(p.run(&t, &mut out, false).unwrap().get("BLOCK"), 1024);
    assert_eq!(out.to_vec().unwrap(), p.expected());
    assert!(t.sessions().is_empty(), "no tuning session");
}
