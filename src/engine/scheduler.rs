//! The batching decisions, free of MLX so they can be tested alone: which waiting rows join the
//! running set before a decode step (batch width and a KV-memory budget, first come first
//! served), and whether a row ends after a token (stop id, or `max_tokens` reached).
//!
//! Admission never reorders: a row that does not fit blocks the rows behind it, so a long
//! prompt is never starved by a stream of short ones.

/// What admission is bounded by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most rows decoding together (0 is treated as 1).
    pub width: usize,
    /// The most KV-cache bytes the running rows may hold together, estimated; `None`: no bound.
    pub kv_budget: Option<u64>,
}

/// How many rows at the front of `waiting` to admit now, given the KV bytes each running and
/// waiting row is estimated to need at its end.
///
/// At least one row is admitted when nothing runs and something waits, even over the budget:
/// the serial path would run that row too, and refusing it would stall the queue forever.
pub fn admit(limits: Limits, running: &[u64], waiting: &[u64]) -> usize {
    let width = limits.width.max(1);
    let mut bytes: u64 = running.iter().sum();
    let mut n = 0;
    for &need in waiting {
        let rows = running.len() + n;
        if rows >= width {
            break;
        }
        if let Some(budget) = limits.kv_budget {
            if rows > 0 && bytes.saturating_add(need) > budget {
                break;
            }
        }
        bytes = bytes.saturating_add(need);
        n += 1;
    }
    n
}

/// What shared KV buffers ([`crate::model::batch_kv`]) already hold, which admission has to
/// count: they keep every slot they were grown to (free ones included) and the positions of
/// their longest row until the last row leaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedBuffers {
    /// Slots along the buffers' first axis, held or free.
    pub slots: usize,
    /// Bytes each slot takes now, in every layer together.
    pub slot_bytes: u64,
}

/// [`admit`] for rows whose keys share one buffer per layer and tensor
/// ([`crate::model::batch_kv`]): every slot holds as many positions as the longest row, and the
/// buffers keep the slots and positions they have (`held`) while any row runs, so `n` running
/// rows are estimated at `max(n, held.slots)` slots of the largest need (or of
/// `held.slot_bytes`, where a row that left made the slots larger).
pub fn admit_shared(
    limits: Limits,
    running: &[u64],
    waiting: &[u64],
    held: SharedBuffers,
) -> usize {
    let width = limits.width.max(1);
    // With no row running the buffers are dropped before the next row joins.
    let held = if running.is_empty() {
        SharedBuffers::default()
    } else {
        held
    };
    let mut largest = running
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(held.slot_bytes);
    let mut n = 0;
    for &need in waiting {
        let rows = running.len() + n;
        if rows >= width {
            break;
        }
        let after = largest.max(need);
        if let Some(budget) = limits.kv_budget {
            let slots = (rows + 1).max(held.slots) as u64;
            if rows > 0 && after.saturating_mul(slots) > budget {
                break;
            }
        }
        largest = after;
        n += 1;
    }
    n
}

/// How many of `max` draft rows a row running alone may verify in one step over shared
/// buffers (`held`) under `kv_budget`: each draft row takes a slot as large as the row's
/// (estimated at `need` bytes), and the slots stay until the row ends. Free slots the buffers
/// already have cost nothing more.
pub fn drafts_within(kv_budget: Option<u64>, need: u64, held: SharedBuffers, max: usize) -> usize {
    let Some(budget) = kv_budget else {
        return max;
    };
    let slot = need.max(held.slot_bytes).max(1);
    let slots = usize::try_from(budget / slot).unwrap_or(usize::MAX);
    slots.max(held.slots).saturating_sub(1).min(max)
}

/// Estimated KV bytes of a row that will hold `prompt + max_tokens` positions, at
/// `bytes_per_token` (an upper bound: sliding-window layers stop growing at their window).
pub fn row_kv_bytes(prompt_tokens: usize, max_tokens: usize, bytes_per_token: u64) -> u64 {
    (prompt_tokens as u64)
        .saturating_add(max_tokens as u64)
        .saturating_mul(bytes_per_token)
}

/// What a row does after producing `token` (serial greedy's rule, SPEC §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `token` is a stop id: the row ends without it.
    Eos,
    /// `token` is kept and it was the last one allowed.
    MaxTokens,
    /// `token` is kept and the row decodes on.
    Continue,
}

/// The verdict for `token` when the row already holds `generated` tokens.
pub fn after_token(token: u32, generated: usize, max_tokens: usize, stop_ids: &[u32]) -> Verdict {
    if stop_ids.contains(&token) {
        Verdict::Eos
    } else if generated + 1 >= max_tokens {
        Verdict::MaxTokens
    } else {
        Verdict::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(width: usize, kv_budget: Option<u64>) -> Limits {
        Limits { width, kv_budget }
    }

    #[test]
    fn width_bounds_admission() {
        assert_eq!(admit(lim(4, None), &[], &[1; 10]), 4);
        assert_eq!(admit(lim(4, None), &[1, 1, 1], &[1; 10]), 1);
        assert_eq!(admit(lim(4, None), &[1; 4], &[1; 10]), 0);
        assert_eq!(admit(lim(4, None), &[], &[1, 1]), 2);
        assert_eq!(admit(lim(0, None), &[], &[1, 1]), 1);
    }

    #[test]
    fn shared_buffers_cost_every_row_the_largest_need() {
        let none = SharedBuffers::default();
        // Per row these fit (10 + 10 + 40 <= 70); shared, three rows cost 3 x 40.
        assert_eq!(admit(lim(8, Some(70)), &[10], &[10, 40]), 2);
        assert_eq!(admit_shared(lim(8, Some(70)), &[10], &[10, 40], none), 1);
        assert_eq!(admit_shared(lim(8, Some(120)), &[10], &[10, 40], none), 2);
        // A running long row makes a short one cost as much.
        assert_eq!(admit_shared(lim(8, Some(70)), &[40], &[1], none), 0);
        // Width, no budget, and the first row always admitted, as in `admit`.
        assert_eq!(admit_shared(lim(2, None), &[], &[5, 5, 5], none), 2);
        assert_eq!(admit_shared(lim(8, Some(1)), &[], &[5, 5], none), 1);
    }

    #[test]
    fn shared_buffers_count_the_slots_and_positions_they_kept() {
        // Two rows of 10 in fresh buffers fit 20; in buffers that kept 4 slots they cost 40.
        let kept = SharedBuffers {
            slots: 4,
            slot_bytes: 10,
        };
        assert_eq!(admit_shared(lim(8, Some(20)), &[10], &[10], kept), 0);
        assert_eq!(
            admit_shared(lim(8, Some(40)), &[10], &[10, 10, 10, 10], kept),
            3
        );
        // Slots made larger by a row that left cost their size, not the running rows' need.
        let large = SharedBuffers {
            slots: 2,
            slot_bytes: 50,
        };
        assert_eq!(admit_shared(lim(8, Some(90)), &[10], &[10], large), 0);
        assert_eq!(admit_shared(lim(8, Some(100)), &[10], &[10], large), 1);
        // With nothing running the buffers are dropped before the next row joins.
        assert_eq!(admit_shared(lim(8, Some(20)), &[], &[10, 10], kept), 2);
    }

    #[test]
    fn drafts_fit_the_budget_in_slots_of_the_row() {
        let none = SharedBuffers::default();
        assert_eq!(drafts_within(None, 100, none, 4), 4);
        // Room for the row and two draft slots.
        assert_eq!(drafts_within(Some(300), 100, none, 4), 2);
        assert_eq!(drafts_within(Some(1000), 100, none, 4), 4);
        // A row over the budget alone verifies no drafts.
        assert_eq!(drafts_within(Some(50), 100, none, 4), 0);
        // Free slots the buffers kept are used first, at no cost.
        let kept = SharedBuffers {
            slots: 5,
            slot_bytes: 100,
        };
        assert_eq!(drafts_within(Some(100), 100, kept, 4), 4);
        assert_eq!(drafts_within(Some(100), 100, kept, 2), 2);
        // Slots larger than the row's need cost their size.
        let large = SharedBuffers {
            slots: 1,
            slot_bytes: 200,
        };
        assert_eq!(drafts_within(Some(400), 100, large, 4), 1);
    }

    #[test]
    fn budget_bounds_admission_in_order() {
        // 60 running + 30 fits 100; the next 30 would not, and the 5 behind it must wait too.
        assert_eq!(admit(lim(8, Some(100)), &[60], &[30, 30, 5]), 1);
        assert_eq!(admit(lim(8, Some(100)), &[], &[50, 50, 1]), 2);
    }

    #[test]
    fn an_oversized_row_runs_alone() {
        assert_eq!(admit(lim(8, Some(100)), &[], &[500, 1]), 1);
        assert_eq!(admit(lim(8, Some(100)), &[1], &[500]), 0);
    }

    #[test]
    fn nothing_waiting_admits_nothing() {
        assert_eq!(admit(lim(8, Some(1)), &[], &[]), 0);
    }

    #[test]
    fn verdicts_follow_the_serial_rule() {
        assert_eq!(after_token(1, 0, 5, &[1, 106]), Verdict::Eos);
        // A stop id ends the row even when it would be the last allowed token.
        assert_eq!(after_token(106, 4, 5, &[1, 106]), Verdict::Eos);
        assert_eq!(after_token(7, 4, 5, &[1]), Verdict::MaxTokens);
        assert_eq!(after_token(7, 0, 1, &[1]), Verdict::MaxTokens);
        assert_eq!(after_token(7, 3, 5, &[1]), Verdict::Continue);
    }

    #[test]
    fn kv_estimate_saturates() {
        assert_eq!(row_kv_bytes(10, 6, 100), 1600);
        assert_eq!(row_kv_bytes(usize::MAX, 1, u64::MAX), u64::MAX);
    }
}
