//! How many drafts speculative decoding ([`super::speculative`]) feeds its next verification
//! step, from how the last ones fared.
//!
//! Why: a verification step costs more than a plain step (H200, e4b, session 21: a five-row
//! step ~16 ms of host time plus ~4 ms of device wait, against ~8 ms for a pipelined one-row
//! step) and yields `1 + accepted` tokens. Drafts that keep missing make decoding slower than
//! without them: every draft wrong at four per step would run at about 0.4x plain. The schedule
//! follows the acceptance the way assisted generation's "heuristic" draft count does (more after
//! a step that accepted every draft, fewer after one that did not) and, where even one draft
//! per step is rejected, pauses drafting for a stretch of plain pipelined steps that doubles
//! while drafts keep missing. It chooses only how many drafts are fed: the tokens are the
//! serial ones whatever it chooses.

/// Plain steps of the first pause; each further pause in a row is twice as long, up to
/// [`MAX_PAUSE`]. A rejected one-draft step costs about half a plain step more than a plain
/// step: pauses of 4, 8, 16, ... steps bound what drafts that never match cost to ~10% and less.
pub const FIRST_PAUSE: usize = 4;

/// The longest pause: drafts are tried again at least every this many plain steps, so text
/// that starts to repeat itself (the extraction stages copy spans) is drafted again soon.
pub const MAX_PAUSE: usize = 64;

/// The draft count for the next verification step (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftSchedule {
    max: usize,
    adaptive: bool,
    cap: usize,
    pause: usize,
    next_pause: usize,
}

impl DraftSchedule {
    /// A schedule of at most `max` drafts per step; `adaptive` false feeds `max` every time
    /// (the fixed schedule: benchmarks that measure one draft count).
    pub fn new(max: usize, adaptive: bool) -> DraftSchedule {
        DraftSchedule {
            max,
            adaptive,
            cap: max,
            pause: 0,
            next_pause: FIRST_PAUSE,
        }
    }

    /// The most drafts the next step may verify: 0 while drafting is paused.
    pub fn allowed(&self) -> usize {
        if self.pause > 0 {
            0
        } else {
            self.cap
        }
    }

    /// Whether drafting is paused (the next step runs plain whatever the text drafts).
    pub fn paused(&self) -> bool {
        self.pause > 0
    }

    /// Counts one plain (draft-free) step queued.
    pub fn plain_step(&mut self) {
        self.pause = self.pause.saturating_sub(1);
    }

    /// Takes the outcome of a verification step that fed `drafted` (at least 1) drafts, of
    /// which the first `accepted` were the serial tokens.
    pub fn verified(&mut self, drafted: usize, accepted: usize) {
        if !self.adaptive || drafted == 0 {
            return;
        }
        if accepted >= drafted {
            self.cap = (self.cap + 1).min(self.max);
            self.next_pause = FIRST_PAUSE;
        } else if accepted == 0 && self.cap == 1 {
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
        } else {
            // One more than what would have sufficed: a step that accepted 2 of 4 tries 3.
            self.cap = (accepted + 1).clamp(1, self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_schedule_always_allows_the_most() {
        let mut s = DraftSchedule::new(4, false);
        for _ in 0..5 {
            s.verified(4, 0);
            assert_eq!(s.allowed(), 4);
        }
    }

    #[test]
    fn rejections_shrink_the_count_and_full_acceptance_grows_it() {
        let mut s = DraftSchedule::new(4, true);
        assert_eq!(s.allowed(), 4);
        s.verified(4, 2);
        assert_eq!(s.allowed(), 3);
        s.verified(3, 0);
        assert_eq!(s.allowed(), 1);
        s.verified(1, 1);
        assert_eq!(s.allowed(), 2);
        s.verified(2, 2);
        s.verified(3, 3);
        s.verified(4, 4);
        assert_eq!(s.allowed(), 4, "never past the most");
        // Fewer drafts than allowed (the lookup found fewer), all accepted: still grows.
        s.verified(4, 1);
        s.verified(1, 1);
        assert_eq!(s.allowed(), 3);
    }

    #[test]
    fn drafts_that_keep_missing_pause_for_doubling_stretches() {
        let mut s = DraftSchedule::new(4, true);
        s.verified(4, 0);
        assert_eq!(s.allowed(), 1);
        let mut pauses = Vec::new();
        for _ in 0..6 {
            s.verified(1, 0);
            let mut n = 0;
            while s.paused() {
                assert_eq!(s.allowed(), 0);
                s.plain_step();
                n += 1;
            }
            pauses.push(n);
            assert_eq!(s.allowed(), 1);
        }
        assert_eq!(pauses, [4, 8, 16, 32, 64, 64]);
        // An accepted draft ends the streak: the next miss pauses for the first length again.
        s.verified(1, 1);
        s.verified(2, 0);
        s.verified(1, 0);
        let mut n = 0;
        while s.paused() {
            s.plain_step();
            n += 1;
        }
        assert_eq!(n, FIRST_PAUSE);
    }
}
