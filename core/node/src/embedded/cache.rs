//! The node cache: when to measure the tree's memory, and the CLOCK sweep
//! that evicts what a complete checkpoint holds once it is over budget.

use std::sync::PoisonError;

use super::error::DbError;
use super::stats::CacheStats;
use super::writer::Writer;
use crate::nodestore::evict_to;

impl Writer {
    /// Whether the node cache's memory should be measured now.
    pub(super) fn sweep_wanted(&self, after_checkpoint: bool) -> bool {
        let budget = self.plan.cache_bytes;
        if budget == 0 {
            return false;
        }
        let loaded = self.store.stats().loaded_bytes;
        // Intentions take about four times their encoded size as nodes.
        let grown = loaded.saturating_sub(self.cache_loaded_at)
            + 4 * (self.appended_total - self.cache_appended_at);
        // Measure again once the tree may have outgrown the budget, but
        // not at every step while it holds more than the budget that
        // cannot leave yet (not in a checkpoint): a measurement walks all
        // of memory. After a checkpoint, measure unless the estimate is
        // far below the budget (then nothing needs evicting).
        let estimate = self.cache_measured + grown;
        self.cache_poked
            || if after_checkpoint {
                estimate >= budget / 2
            } else {
                estimate >= budget && grown >= budget / 4
            }
    }

    /// Node cache: measures the tree's memory when enough was loaded or
    /// appended since the last measurement, and sweeps when it is over the
    /// budget. `after_checkpoint`: a checkpoint just completed, so stubs
    /// must move to it (a sweep without eviction if under budget).
    pub(super) fn sweep(&mut self, after_checkpoint: bool) -> Result<(), DbError> {
        let budget = self.plan.cache_bytes;
        if budget == 0 {
            return Ok(());
        }
        let loaded = self.store.stats().loaded_bytes;
        let measure = self.sweep_wanted(after_checkpoint);
        if !measure && !after_checkpoint {
            return Ok(());
        }
        // The complete checkpoints, looked up once rather than under the
        // store's lock at every node the sweep visits.
        let complete = self.store.complete_generations();
        let persisted = |g: u16| complete.contains(&g);
        if !measure {
            // Stubs (if any) move to the new checkpoint, so older ones can
            // be trimmed; the growth counted so far keeps counting.
            self.melder.promote(&persisted);
            return Ok(());
        }
        self.cache_poked = false;
        let mut measured = self.melder.lcs().approx_bytes();
        let before = measured;
        let mut st = CacheStats::default();
        if measured > budget {
            let swept = evict_to(&mut self.melder, &self.store, &persisted, budget)
                .map_err(DbError::Store)?;
            st.sweeps += swept.sweeps;
            st.stubbed += swept.stubbed;
            st.unloaded += swept.unloaded;
            measured = swept.measured;
            // Readers move to the swept tree (same state, same position),
            // so the old one can be freed.
            let at = self
                .shared
                .latest
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .snapshot()
                .pos();
            if let Some(state) = self.melder.snapshot_state(at).cloned() {
                self.publish(state);
            }
            // What is left is mostly what only memory holds: a checkpoint
            // makes it evictable.
            if measured > budget / 2 && self.ckpt.is_none() && !after_checkpoint {
                self.cache_pressure = true;
            }
        } else if after_checkpoint {
            self.melder.promote(&persisted);
        }
        self.cache_measured = measured;
        self.cache_loaded_at = loaded;
        self.store.arm();
        self.cache_appended_at = self.appended_total;
        let mut c = self.shared.cache_stats();
        c.in_memory_bytes = measured;
        c.peak_bytes = c.peak_bytes.max(before);
        c.sweeps += st.sweeps;
        c.stubbed += st.stubbed;
        c.unloaded += st.unloaded;
        Ok(())
    }
}
