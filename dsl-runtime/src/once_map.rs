//! [`OnceMap`]: a map from keys to values computed once per key, outside the map's lock.
//!
//! The CUDA driver keeps its loaded kernels in one ([`driver`](crate::driver)): a launch
//! whose kernel is already loaded takes one uncontended lock and one hash lookup and
//! clones an `Arc`; a launch that must load its kernel (build the IR, run LLVM, JIT-link)
//! does that work without holding the lock, so launches of other kernels, loaded or not,
//! go on meanwhile, on other threads.
//!
//! - One computation per key: a thread asking for a key that another thread is computing
//!   waits for that computation instead of starting its own.
//! - Failures are not cached: a computation that returns `Err` (or panics) leaves no entry;
//!   the caller gets its error, and whoever asks next, including a thread that was waiting
//!   for it, computes again. (A kernel that failed to load is tried again on its next
//!   launch, as a kernel whose disk-cache entry was evicted is.)
//! - `compute` must not ask the same map for its own key: it would wait for itself.

use rustc_hash::FxHashMap;
use std::hash::Hash;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// See the [module docs](self).
pub(crate) struct OnceMap<K, V> {
    slots: Mutex<FxHashMap<K, Slot<V>>>,
}

enum Slot<V> {
    Ready(V),
    /// Being computed by one thread; the others wait on it.
    Pending(Arc<Pending>),
}

/// A computation in progress: `done` turns true when its outcome is in the map (a value,
/// or no entry after a failure).
#[derive(Default)]
struct Pending {
    done: Mutex<bool>,
    finished: Condvar,
}

impl Pending {
    fn wait(&self) {
        let mut done = lock(&self.done);
        while !*done {
            done = self.finished.wait(done).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn finish(&self) {
        *lock(&self.done) = true;
        self.finished.notify_all();
    }
}

/// The map's state stays consistent under panics (no user code runs while an entry is
/// half-written: `compute` runs unlocked, and a panicking `Hash`/`Eq`/`Clone` leaves the
/// table as it was), so a poisoned lock is taken over rather than propagated.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: Hash + Eq + Clone, V: Clone> OnceMap<K, V> {
    pub fn new() -> Self {
        OnceMap { slots: Mutex::new(FxHashMap::default()) }
    }

    /// The value for `key`: the stored one, or the one `compute` gives (stored if `Ok`).
    /// See the [module docs](self) for what concurrent callers see.
    ///
    /// With the value present this is one lock, one hash lookup and a clone of `V`: no
    /// allocation (the key is cloned only when an entry is created).
    pub fn get_or_try_insert_with<E>(&self, key: &K, compute: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        let pending = loop {
            let mut slots = lock(&self.slots);
            match slots.get(key) {
                Some(Slot::Ready(v)) => return Ok(v.clone()),
                Some(Slot::Pending(p)) => {
                    let p = p.clone();
                    drop(slots);
                    p.wait();
                    // Now a value, or nothing after a failure: look again.
                }
                None => {
                    let p = Arc::new(Pending::default());
                    slots.insert(key.clone(), Slot::Pending(p.clone()));
                    break p;
                }
            }
        };
        // This thread computes, unlocked. `publish` runs on every way out of `compute`,
        // an unwinding panic included, so waiters are never left waiting.
        let mut publish = Publish { map: self, key, pending, value: None };
        let result = compute();
        if let Ok(v) = &result {
            publish.value = Some(v.clone());
        }
        drop(publish);
        result
    }

    /// Number of values present (computations in progress are not counted).
    pub fn len(&self) -> usize {
        lock(&self.slots).values().filter(|s| matches!(s, Slot::Ready(_))).count()
    }

    /// The values present, cloned (computations in progress are not included).
    pub fn values(&self) -> Vec<V> {
        lock(&self.slots).values().filter_map(|s| if let Slot::Ready(v) = s { Some(v.clone()) } else { None }).collect()
    }
}

/// Puts the outcome of one computation in the map and wakes its waiters.
struct Publish<'a, K: Hash + Eq + Clone, V: Clone> {
    map: &'a OnceMap<K, V>,
    key: &'a K,
    pending: Arc<Pending>,
    /// `None` (a failure or a panic): the entry is removed.
    value: Option<V>,
}

impl<K: Hash + Eq + Clone, V: Clone> Drop for Publish<'_, K, V> {
    fn drop(&mut self) {
        let mut slots = lock(&self.map.slots);
        match self.value.take() {
            Some(v) => match slots.get_mut(self.key) {
                Some(slot) => *slot = Slot::Ready(v),
                None => {
                    slots.insert(self.key.clone(), Slot::Ready(v));
                }
            },
            None => {
                slots.remove(self.key);
            }
        }
        drop(slots);
        self.pending.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::OnceMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc, Barrier, Condvar, Mutex};
    use std::time::Duration;

    /// Run `f` on a thread and fail (instead of hanging) if it takes longer than `secs`.
    fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(secs)).unwrap_or_else(|e| panic!("{what}: no answer after {secs} s ({e})"))
    }

    /// A barrier with a timeout: `arrive` says whether all `parties` arrived in time.
    struct Rendezvous {
        arrived: Mutex<usize>,
        all: Condvar,
        parties: usize,
    }

    impl Rendezvous {
        fn new(parties: usize) -> Rendezvous {
            Rendezvous { arrived: Mutex::new(0), all: Condvar::new(), parties }
        }
        fn arrive(&self, timeout: Duration) -> bool {
            let mut n = self.arrived.lock().unwrap();
            *n += 1;
            self.all.notify_all();
            let (_n, r) = self.all.wait_timeout_while(n, timeout, |n| *n < self.parties).unwrap();
            !r.timed_out()
        }
    }

    #[test]
    fn different_keys_compute_in_parallel() {
        // Each computation waits until the other one has started: with the map locked
        // while computing, the second could not start, and the first would time out.
        within(60, "two keys", || {
            let map = Arc::new(OnceMap::<u32, u32>::new());
            let meet = Arc::new(Rendezvous::new(2));
            let threads: Vec<_> = [1u32, 2]
                .into_iter()
                .map(|key| {
                    let (map, meet) = (map.clone(), meet.clone());
                    std::thread::spawn(move || {
                        map.get_or_try_insert_with(&key, || {
                            if meet.arrive(Duration::from_secs(10)) {
                                Ok(key * 10)
                            } else {
                                Err(format!("key {key}: the other key's computation never started while this one ran"))
                            }
                        })
                    })
                })
                .collect();
            let got: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            assert_eq!(got, vec![Ok(10), Ok(20)]);
            assert_eq!(map.len(), 2);
        });
    }

    #[test]
    fn one_key_asked_by_many_threads_is_computed_once() {
        within(60, "one key", || {
            let map = Arc::new(OnceMap::<&'static str, Arc<String>>::new());
            let computed = Arc::new(AtomicUsize::new(0));
            let start = Arc::new(Barrier::new(16));
            let threads: Vec<_> = (0..16)
                .map(|_| {
                    let (map, computed, start) = (map.clone(), computed.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        map.get_or_try_insert_with(&"k", || {
                            computed.fetch_add(1, Ordering::SeqCst);
                            // Long enough for every other thread to ask meanwhile.
                            std::thread::sleep(Duration::from_millis(200));
                            Ok::<_, ()>(Arc::new("value".to_string()))
                        })
                        .unwrap()
                    })
                })
                .collect();
            let got: Vec<Arc<String>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            assert_eq!(computed.load(Ordering::SeqCst), 1, "computations of one key");
            assert!(got.iter().all(|v| Arc::ptr_eq(v, &got[0])), "every thread got the one value");
            assert_eq!(map.len(), 1);
        });
    }

    #[test]
    fn failures_are_not_cached() {
        within(60, "retry", || {
            let map = OnceMap::<u32, u32>::new();
            let calls = AtomicUsize::new(0);
            let attempt = |ok: bool| {
                map.get_or_try_insert_with(&7, || {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if ok {
                        Ok(70)
                    } else {
                        Err("failed")
                    }
                })
            };
            assert_eq!(attempt(false), Err("failed"));
            assert_eq!(map.len(), 0);
            assert_eq!(attempt(false), Err("failed"), "a failure is computed again");
            assert_eq!(attempt(true), Ok(70));
            assert_eq!(attempt(false), Ok(70), "a value is kept");
            assert_eq!(calls.load(Ordering::SeqCst), 3);
            // A panic in `compute` leaves no entry either.
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| map.get_or_try_insert_with(&8, || -> Result<u32, ()> { panic!("in compute") })));
            assert!(panicked.is_err());
            assert_eq!(map.get_or_try_insert_with(&8, || Ok::<_, ()>(80)), Ok(80));
        });
    }

    #[test]
    fn a_thread_waiting_on_a_failed_computation_computes_again() {
        within(60, "waiter", || {
            let map = Arc::new(OnceMap::<u32, u32>::new());
            let (started_tx, started_rx) = mpsc::channel();
            let (fail_tx, fail_rx) = mpsc::channel::<()>();
            let first = {
                let map = map.clone();
                std::thread::spawn(move || {
                    map.get_or_try_insert_with(&1, || {
                        started_tx.send(()).unwrap();
                        fail_rx.recv().unwrap();
                        Err("first attempt")
                    })
                })
            };
            started_rx.recv().unwrap();
            let second = {
                let map = map.clone();
                std::thread::spawn(move || map.get_or_try_insert_with(&1, || Ok::<_, &str>(11)))
            };
            // Let the second thread find the computation in progress, then fail it.
            std::thread::sleep(Duration::from_millis(100));
            fail_tx.send(()).unwrap();
            assert_eq!(first.join().unwrap(), Err("first attempt"));
            assert_eq!(second.join().unwrap(), Ok(11));
        });
    }
}
