//! Shared memory in the lowering: where each use's scratch goes, and which barriers the
//! program needs (Triton's allocation and `Membar` analyses, done while lowering).
//!
//! Every use of shared memory is an *access* to a byte range: a layout conversion, a
//! cross-warp reduction, a scan step across warps or an atomic's broadcast writes its
//! scratch, waits at a barrier, and reads it back. A barrier (`bar.sync`) is needed before
//! an access only where it conflicts with an access made since the last barrier by
//! possibly other threads: a write after a read or a write of overlapping bytes, or a read
//! after a write. [`Hazards`] is that set of pending accesses.
//!
//! Scratch lives only during its use, so the question is where to put it. [`Hazards::place`]
//! picks the lowest offset whose bytes no pending access touches, so that consecutive
//! uses (the two reductions of a softmax, the statistics of a norm) alternate between
//! ranges and skip the barrier that reusing offset 0 would need; it only does so within
//! twice the largest use (shared memory costs occupancy), and otherwise goes back to the
//! base after a barrier.
//!
//! Control flow: a branch's arms start from the state before it and join as the union of
//! their ends. A loop body is lowered from the state before the loop; the next iteration
//! starts from what the body leaves, which only matters to the body's [`Head`] (its
//! accesses before its first barrier): where one of those conflicts with what the body
//! leaves, a barrier at the end of the body (the latch) clears it. Accesses are not attributed to threads, so two
//! accesses of one thread to its own bytes count as a conflict (conservative).

use std::ops::Range;

/// What an access does to shared memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    Read,
    Write,
}

/// The shared-memory accesses made since the last barrier.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hazards {
    pending: Vec<(Range<u64>, Access)>,
}

fn overlap(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

impl Hazards {
    /// Whether `a` on `r` must wait for a barrier: it overlaps a pending write, or it
    /// writes over a pending read.
    pub fn conflicts(&self, r: &Range<u64>, a: Access) -> bool {
        self.pending.iter().any(|(p, k)| overlap(p, r) && (a == Access::Write || *k == Access::Write))
    }

    pub fn record(&mut self, r: Range<u64>, a: Access) {
        if !r.is_empty() && !self.pending.contains(&(r.clone(), a)) {
            self.pending.push((r, a));
        }
    }

    /// A barrier: every pending access is complete and visible.
    pub fn sync(&mut self) {
        self.pending.clear();
    }

    /// The state where control flow from `self` and from `other` meets.
    pub fn join(&mut self, other: &Hazards) {
        for (r, a) in &other.pending {
            self.record(r.clone(), *a);
        }
    }

    /// Where a use of `size` bytes that writes its range first can go, at or above `base`
    /// and `align`-aligned: the lowest offset whose range conflicts with nothing pending
    /// and ends by `limit`, with no barrier; else `base` (rounded up to `align`), after a
    /// barrier (`true`). (`base` is where the buffers live at that point end, which need
    /// not be aligned: a ring of 8-byte mbarriers.)
    pub fn place(&self, base: u64, size: u64, align: u64, limit: u64) -> (u64, bool) {
        let up = |x: u64| x.div_ceil(align) * align;
        let base = up(base);
        let mut candidates: Vec<u64> = std::iter::once(base).chain(self.pending.iter().map(|(r, _)| up(r.end)).filter(|&e| e >= base)).collect();
        candidates.sort_unstable();
        for off in candidates {
            if off + size <= limit.max(base + size) && !self.conflicts(&(off..off + size), Access::Write) {
                return (off, false);
            }
        }
        // `base` itself was a candidate: it conflicts.
        (base, true)
    }
}

/// The accesses a loop body makes before its first barrier (its *head*): the only ones
/// that see the state the previous iteration left. A barrier in a nested branch or loop
/// may not be reached, so only one at the body's own level (or in its yields, lowered just
/// after it) ends the head.
#[derive(Clone, Debug)]
pub struct Head {
    /// Regions open around the loop.
    depth: usize,
    open: bool,
    accesses: Vec<(Range<u64>, Access)>,
}

impl Head {
    pub fn new(depth: usize) -> Head {
        Head { depth, open: true, accesses: vec![] }
    }

    pub fn record(&mut self, r: &Range<u64>, a: Access) {
        if self.open {
            self.accesses.push((r.clone(), a));
        }
    }

    /// A barrier at region depth `depth`.
    pub fn barrier_at(&mut self, depth: usize) {
        if depth <= self.depth + 1 {
            self.open = false;
        }
    }

    /// Whether an iteration starting with `pending` (what the last one left) needs a
    /// barrier first: some access of the head conflicts with it.
    pub fn conflicts_with(&self, pending: &Hazards) -> bool {
        self.accesses.iter().any(|(r, a)| pending.conflicts(r, *a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_after_a_read_or_write_conflicts_and_reads_share() {
        let mut h = Hazards::default();
        h.record(0..64, Access::Read);
        assert!(h.conflicts(&(32..96), Access::Write), "write after read");
        assert!(!h.conflicts(&(32..96), Access::Read), "two reads need no barrier");
        assert!(!h.conflicts(&(64..128), Access::Write), "disjoint bytes");
        h.record(64..128, Access::Write);
        assert!(h.conflicts(&(100..101), Access::Read), "read after write");
        h.sync();
        assert!(!h.conflicts(&(0..128), Access::Write));
    }

    #[test]
    fn consecutive_uses_alternate_instead_of_waiting() {
        let mut h = Hazards::default();
        // First reduction: nothing pending, offset 0, no barrier.
        assert_eq!(h.place(0, 512, 16, 1024), (0, false));
        h.record(0..512, Access::Write);
        h.sync(); // its own barrier between writing and reading
        h.record(0..512, Access::Read);
        // Second one: 0 would overwrite what others may still read; 512 is free.
        assert_eq!(h.place(0, 512, 16, 1024), (512, false));
        // Without room for it, back to 0 after a barrier.
        assert_eq!(h.place(0, 512, 16, 512), (0, true));
        // A larger use that fits nowhere free also waits.
        assert_eq!(h.place(0, 2048, 16, 1024), (0, true));
    }

    #[test]
    fn placement_respects_base_and_alignment() {
        let mut h = Hazards::default();
        h.record(256..300, Access::Read);
        // Below the explicit buffers' end (256) is never used for scratch; 300 rounds to 304.
        assert_eq!(h.place(256, 64, 16, 1024), (304, false));
        // An end that is not aligned (three 8-byte barriers) rounds up too, with or
        // without a barrier.
        assert_eq!(Hazards::default().place(24, 64, 16, 1024), (32, false));
        let mut w = Hazards::default();
        w.record(24..88, Access::Read);
        assert_eq!(w.place(24, 64, 16, 88), (32, true));
    }

    #[test]
    fn join_is_the_union() {
        let (mut a, mut b) = (Hazards::default(), Hazards::default());
        a.record(0..8, Access::Read);
        b.record(8..16, Access::Write);
        a.join(&b);
        assert!(a.conflicts(&(12..13), Access::Read) && a.conflicts(&(0..1), Access::Write));
        assert!(!a.conflicts(&(0..8), Access::Read));
    }

    #[test]
    fn a_loop_head_ends_at_its_first_barrier_at_its_own_level() {
        let mut h = Head::new(1); // a loop inside one region: its body is at depth 2
        h.record(&(0..64), Access::Write);
        h.barrier_at(3); // inside a branch of the body: may not run
        h.record(&(64..128), Access::Write);
        h.barrier_at(2); // the body's own barrier
        h.record(&(128..192), Access::Write); // after it: not in the head
        let mut left = Hazards::default();
        left.record(128..192, Access::Read);
        assert!(!h.conflicts_with(&left), "the body's barrier separates them");
        left.record(64..65, Access::Read);
        assert!(h.conflicts_with(&left), "write after read before the first barrier");
    }
}
