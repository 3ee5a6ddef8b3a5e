//! The per-process lower-bound cache of marks. Marks only grow, so the highest mark this process
//! has seen for a key is a safe lower bound of the store's: a token below it can be refused
//! without a round trip. Acceptance always goes to the store. Bounded by a capacity.

use dashmap::DashMap;

use crate::config::Compare;

/// Once full, the cache drops this share of its capacity at a time.
const EVICTED_SHARE: usize = 16;

/// Highest mark seen per key, for at most `capacity` keys.
pub struct MarkCache {
    marks: DashMap<Box<str>, u64>,
    capacity: usize,
}

impl MarkCache {
    pub fn new(capacity: usize) -> MarkCache {
        MarkCache {
            marks: DashMap::new(),
            capacity,
        }
    }

    /// The cached lower bound of `key`'s mark.
    pub fn get(&self, key: &str) -> Option<u64> {
        self.marks.get(key).map(|mark| *mark)
    }

    /// The mark that already refuses `token`, if the cache knows one.
    pub fn refuses(&self, key: &str, token: u64, compare: Compare) -> Option<u64> {
        let mark = self.get(key)?;
        let stale = match compare {
            Compare::Monotonic => token < mark,
            Compare::Strict => token <= mark,
        };
        stale.then_some(mark)
    }

    /// Records that `key`'s mark is at least `mark`.
    pub fn raise(&self, key: &str, mark: u64) {
        if self.capacity == 0 {
            return;
        }
        if let Some(mut cached) = self.marks.get_mut(key) {
            *cached = (*cached).max(mark);
            return;
        }
        if self.marks.len() >= self.capacity {
            self.evict_some();
        }
        self.marks
            .entry(key.into())
            .and_modify(|cached| *cached = (*cached).max(mark))
            .or_insert(mark);
    }

    /// Forgets every key (after an operator adopted a different store).
    pub fn clear(&self) {
        self.marks.clear();
    }

    pub fn len(&self) -> usize {
        self.marks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }

    /// Drops arbitrary entries, a sixteenth of the capacity (at least one). Losing a lower bound
    /// only costs a round trip later. One pass over the map per sixteenth of new keys, instead of
    /// a search for one entry per new key: that search scanned the map's emptied front again
    /// every time, and showed up in profiles of writes to new keys.
    fn evict_some(&self) {
        let mut left = (self.capacity / EVICTED_SHARE).max(1);
        self.marks.retain(|_, _| {
            if left == 0 {
                return true;
            }
            left -= 1;
            false
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_below_the_cached_mark_by_compare_mode() {
        let cache = MarkCache::new(10);
        assert_eq!(cache.refuses("k", 1, Compare::Monotonic), None);
        cache.raise("k", 5);
        cache.raise("k", 3);
        assert_eq!(cache.get("k"), Some(5));
        assert_eq!(cache.refuses("k", 4, Compare::Monotonic), Some(5));
        assert_eq!(cache.refuses("k", 5, Compare::Monotonic), None);
        assert_eq!(cache.refuses("k", 5, Compare::Strict), Some(5));
        assert_eq!(cache.refuses("k", 6, Compare::Strict), None);
    }

    #[test]
    fn stays_within_its_capacity() {
        let cache = MarkCache::new(100);
        for key in 0..1000 {
            cache.raise(&key.to_string(), key);
        }
        assert!(cache.len() <= 100, "{}", cache.len());
        let off = MarkCache::new(0);
        off.raise("k", 1);
        assert!(off.is_empty());
    }
}
