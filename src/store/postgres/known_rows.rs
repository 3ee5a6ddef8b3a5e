//! The keys a holder task knows to have a `fence_marks` row: a take of a known key need not ask
//! the store to create one. Rows of marks are never deleted, so a key stays known; the set is
//! bounded, and forgets everything when it fills (a key forgotten costs one lookup more).

use std::collections::HashSet;

/// Most keys remembered by one holder task.
const MAX_KNOWN: usize = 65_536;

#[derive(Default)]
pub(super) struct KnownRows {
    keys: HashSet<String>,
}

impl KnownRows {
    /// Whether every key in `keys` is known to have a row.
    pub(super) fn all_known<'a>(&self, mut keys: impl Iterator<Item = &'a String>) -> bool {
        keys.all(|key| self.keys.contains(key))
    }

    /// Remembers that `keys` have rows.
    pub(super) fn learn<'a>(&mut self, keys: impl Iterator<Item = &'a String>) {
        for key in keys {
            if self.keys.contains(key) {
                continue;
            }
            if self.keys.len() >= MAX_KNOWN {
                self.keys.clear();
            }
            self.keys.insert(key.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_learned_are_known_until_the_set_fills() {
        let mut known = KnownRows::default();
        let a = "a".to_owned();
        let b = "b".to_owned();
        assert!(!known.all_known([&a].into_iter()));
        known.learn([&a].into_iter());
        assert!(known.all_known([&a].into_iter()));
        assert!(!known.all_known([&a, &b].into_iter()));
        let many: Vec<String> = (0..MAX_KNOWN).map(|i| format!("k{i}")).collect();
        known.learn(many.iter());
        assert!(!known.all_known([&a].into_iter()), "a full set forgets");
        assert!(known.keys.len() <= MAX_KNOWN);
    }
}
