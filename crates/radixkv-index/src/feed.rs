//! One source's stream of batches, in sequence ([`Feed`]): which batch to
//! apply, which to drop, when a gap needs a replay, and when the source
//! restarted. The socket side (subscriber, replay requests) asks it; it
//! does no I/O, so every rule is tested here.
//!
//! | what arrives | what it means | [`Step`] |
//! | --- | --- | --- |
//! | a batch that begins with `AllBlocksCleared`, at any sequence | a start or a restart (vLLM and SGLang start at 0, radixkv at the wall clock): the source's old blocks are gone | apply it after clearing the source |
//! | the next sequence | the stream goes on | apply it |
//! | sequence 0 after a later one | a restart whose first batch is not a clearing | apply it after clearing the source |
//! | an earlier sequence | a duplicate or a late copy | drop it |
//! | a later sequence | batches are missing | a gap: replay them; with none to ask (or a replay that cannot give them all) the source is cleared and stale |
//! | anything but a clearing while stale | its blocks are unknown | drop it, until the next `AllBlocksCleared` |
//!
//! The first batch of a source seen at sequence 0 is applied; seen later,
//! the batches before it are a gap (a subscriber that joined late), as
//! Dynamo's listener treats it.

/// What to do with a batch offered to a [`Feed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Apply it, after clearing the source's blocks when `clear`.
    Apply {
        /// The source restarted (or started): clear what it held first.
        clear: bool,
    },
    /// Already applied (a duplicate, or a late copy): drop it.
    Drop,
    /// Batches from `from` up to this one are missing: replay them, then
    /// offer this one again; or, with no replay, [`Feed::lost`].
    Gap {
        /// The first missing sequence number.
        from: u64,
    },
    /// The source is stale (a gap was lost): dropped until it clears.
    Stale,
}

/// What a [`Feed`] counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedStats {
    /// Batches applied.
    pub applied: u64,
    /// Batches dropped as duplicates or late copies.
    pub duplicates: u64,
    /// Gaps found.
    pub gaps: u64,
    /// Gaps filled by a replay.
    pub recovered: u64,
    /// Gaps lost (the source cleared and made stale).
    pub lost: u64,
    /// Starts and restarts seen (the source cleared).
    pub restarts: u64,
    /// Batches dropped while stale.
    pub stale_dropped: u64,
}

/// The sequence state of one source.
#[derive(Clone, Debug, Default)]
pub struct Feed {
    next: Option<u64>,
    stale: bool,
    /// A gap was reported at this batch's sequence and is being replayed.
    replaying: Option<u64>,
    stats: FeedStats,
}

impl Feed {
    /// A source not heard from yet.
    pub fn new() -> Feed {
        Feed::default()
    }

    /// What it counted.
    pub fn stats(&self) -> FeedStats {
        self.stats
    }

    /// Whether the source is stale (its blocks cleared after a lost gap,
    /// until its next `AllBlocksCleared`).
    pub fn is_stale(&self) -> bool {
        self.stale
    }

    /// The sequence number expected next (`None` before the first batch).
    pub fn expected(&self) -> Option<u64> {
        self.next
    }

    /// What to do with the batch numbered `seq`, which begins with
    /// `AllBlocksCleared` if `clears`. A batch to apply is counted as
    /// applied (the caller applies it).
    pub fn offer(&mut self, seq: u64, clears: bool) -> Step {
        if clears {
            self.stale = false;
            self.replaying = None;
            return self.apply(seq, true);
        }
        if self.stale {
            self.stats.stale_dropped += 1;
            return Step::Stale;
        }
        match self.next {
            None if seq == 0 => self.apply(seq, false),
            None => self.gap(0, seq),
            Some(next) if seq == next => self.apply(seq, false),
            Some(_) if seq == 0 => self.apply(seq, true),
            Some(next) if seq < next => {
                self.stats.duplicates += 1;
                Step::Drop
            }
            Some(next) => self.gap(next, seq),
        }
    }

    fn apply(&mut self, seq: u64, clear: bool) -> Step {
        if clear {
            self.stats.restarts += 1;
        }
        if self.replaying.is_some_and(|at| seq >= at) {
            self.replaying = None;
            self.stats.recovered += 1;
        }
        self.stats.applied += 1;
        self.next = Some(seq.saturating_add(1));
        Step::Apply { clear }
    }

    fn gap(&mut self, from: u64, seq: u64) -> Step {
        if self.replaying != Some(seq) {
            self.stats.gaps += 1;
        }
        self.replaying = Some(seq);
        Step::Gap { from }
    }

    /// The gap could not be filled (no replay endpoint, or the replay
    /// lacked batches): the caller clears the source, which stays stale
    /// until its next `AllBlocksCleared`.
    pub fn lost(&mut self) {
        self.stats.lost += 1;
        self.stale = true;
        self.replaying = None;
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_in_order_is_applied_and_duplicates_dropped() {
        let mut f = Feed::new();
        assert_eq!(f.offer(0, true), Step::Apply { clear: true });
        assert_eq!(f.offer(1, false), Step::Apply { clear: false });
        assert_eq!(f.offer(1, false), Step::Drop);
        assert_eq!(f.offer(2, false), Step::Apply { clear: false });
        assert_eq!(f.expected(), Some(3));
        let s = f.stats();
        assert_eq!((s.applied, s.duplicates, s.restarts, s.gaps), (3, 1, 1, 0));
    }

    #[test]
    fn a_gap_asks_for_a_replay_and_the_replay_fills_it() {
        let mut f = Feed::new();
        f.offer(0, false);
        assert_eq!(f.offer(4, false), Step::Gap { from: 1 });
        // The replay, then the batch again.
        for s in 1..4 {
            assert_eq!(f.offer(s, false), Step::Apply { clear: false });
        }
        assert_eq!(f.offer(4, false), Step::Apply { clear: false });
        let s = f.stats();
        assert_eq!((s.gaps, s.recovered, s.lost, s.applied), (1, 1, 0, 5));
    }

    #[test]
    fn a_lost_gap_makes_the_source_stale_until_it_clears() {
        let mut f = Feed::new();
        f.offer(0, true);
        assert_eq!(f.offer(5, false), Step::Gap { from: 1 });
        f.lost();
        assert!(f.is_stale());
        assert_eq!(f.offer(6, false), Step::Stale);
        assert_eq!(f.offer(7, true), Step::Apply { clear: true });
        assert!(!f.is_stale());
        assert_eq!(f.offer(8, false), Step::Apply { clear: false });
        let s = f.stats();
        assert_eq!((s.lost, s.stale_dropped, s.restarts), (1, 1, 2));
    }

    #[test]
    fn restarts_clear_whether_or_not_they_begin_with_a_clearing() {
        let mut f = Feed::new();
        f.offer(0, false);
        f.offer(1, false);
        // SGLang or vLLM started again at 0.
        assert_eq!(f.offer(0, false), Step::Apply { clear: true });
        // radixkv started again: a later wall-clock sequence, cleared.
        assert_eq!(f.offer(1_000_000, true), Step::Apply { clear: true });
        assert_eq!(f.offer(1_000_001, false), Step::Apply { clear: false });
        assert_eq!(f.stats().restarts, 2);
    }

    #[test]
    fn a_late_joiner_replays_from_zero() {
        let mut f = Feed::new();
        assert_eq!(f.offer(9, false), Step::Gap { from: 0 });
        assert_eq!(f.offer(9, false), Step::Gap { from: 0 });
        assert_eq!(f.stats().gaps, 1, "the same gap offered again is one gap");
    }
}
