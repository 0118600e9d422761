//! Which registration to drop first when the pin budget is full: least
//! recently used, ordered by the hypervisor's hints (cold before normal
//! before hot).

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

/// What the hypervisor says about a range of guest RAM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hint {
    /// Not sent again soon (balloon-inflated, read-only, discarded): unpin first.
    Cold = 0,
    /// No hint: least recently used first.
    #[default]
    Normal = 1,
    /// Sent again soon: keep pinned while anything else can be unpinned.
    Hot = 2,
}

/// Pinned keys in eviction order, and the hints given for any key.
#[derive(Debug)]
pub struct Lru<K> {
    tick: u64,
    /// The key touched last: touching it again changes nothing (the common
    /// case: consecutive writes to one chunk), so it costs no map update.
    last: Option<K>,
    /// Each pinned key's last use.
    used: HashMap<K, u64>,
    /// (hint, last use, key): the first is unpinned first.
    order: BTreeSet<(Hint, u64, K)>,
    /// Hints given, pinned or not (a key pinned later keeps its hint).
    hints: HashMap<K, Hint>,
}

impl<K: Copy + Ord + Hash> Default for Lru<K> {
    fn default() -> Self {
        Lru { tick: 0, last: None, used: HashMap::new(), order: BTreeSet::new(), hints: HashMap::new() }
    }
}

impl<K: Copy + Ord + Hash> Lru<K> {
    fn hint_of(&self, key: K) -> Hint {
        self.hints.get(&key).copied().unwrap_or_default()
    }

    /// `key` is pinned and was just used: it becomes the last of its hint class to go.
    pub fn touch(&mut self, key: K) {
        if self.last == Some(key) {
            return;
        }
        self.last = Some(key);
        self.tick += 1;
        let hint = self.hint_of(key);
        if let Some(old) = self.used.insert(key, self.tick) {
            self.order.remove(&(hint, old, key));
        }
        self.order.insert((hint, self.tick, key));
    }

    /// `key` is no longer pinned.
    pub fn remove(&mut self, key: K) {
        if self.last == Some(key) {
            self.last = None;
        }
        if let Some(old) = self.used.remove(&key) {
            self.order.remove(&(self.hint_of(key), old, key));
        }
    }

    /// Records a hint for `key`; a pinned key moves to its new class, keeping its last use.
    pub fn hint(&mut self, key: K, hint: Hint) {
        let old = self.hint_of(key);
        if hint == Hint::Normal {
            self.hints.remove(&key);
        } else {
            self.hints.insert(key, hint);
        }
        if let Some(&used) = self.used.get(&key) {
            self.order.remove(&(old, used, key));
            self.order.insert((hint, used, key));
        }
    }

    /// The first pinned key, in eviction order, that `can_unpin` accepts, and its hint.
    pub fn victim(&self, mut can_unpin: impl FnMut(K) -> bool) -> Option<(K, Hint)> {
        self.order.iter().find(|&&(_, _, k)| can_unpin(k)).map(|&(h, _, k)| (k, h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(lru: &Lru<u32>) -> Vec<u32> {
        let mut lru_copy = Lru {
            tick: lru.tick,
            last: None,
            used: lru.used.clone(),
            order: lru.order.clone(),
            hints: lru.hints.clone(),
        };
        let mut out = Vec::new();
        while let Some((k, _)) = lru_copy.victim(|_| true) {
            lru_copy.remove(k);
            out.push(k);
        }
        out
    }

    #[test]
    fn least_recently_used_goes_first() {
        let mut lru = Lru::default();
        for k in 0..4 {
            lru.touch(k);
        }
        assert_eq!(order(&lru), [0, 1, 2, 3]);
        lru.touch(0);
        assert_eq!(order(&lru), [1, 2, 3, 0]);
        lru.touch(0);
        assert_eq!(order(&lru), [1, 2, 3, 0], "touched twice in a row");
        lru.remove(2);
        assert_eq!(order(&lru), [1, 3, 0]);
        lru.remove(0);
        lru.touch(0);
        assert_eq!(order(&lru), [1, 3, 0], "removed, then pinned again");
        assert!(!lru.used.contains_key(&2));
    }

    #[test]
    fn hints_order_the_classes() {
        let mut lru = Lru::default();
        for k in 0..5 {
            lru.touch(k);
        }
        lru.hint(3, Hint::Cold);
        lru.hint(0, Hint::Hot);
        assert_eq!(order(&lru), [3, 1, 2, 4, 0]);
        assert_eq!(lru.victim(|_| true), Some((3, Hint::Cold)));
        // Use within a class still counts; the hint stays.
        lru.touch(3);
        lru.hint(1, Hint::Cold);
        assert_eq!(order(&lru), [1, 3, 2, 4, 0]);
        // Back to normal: by last use again.
        lru.hint(0, Hint::Normal);
        assert_eq!(order(&lru), [1, 3, 0, 2, 4]);
    }

    #[test]
    fn a_hint_given_before_pinning_applies_when_pinned() {
        let mut lru = Lru::default();
        lru.hint(7, Hint::Hot);
        lru.hint(8, Hint::Cold);
        assert!(lru.used.is_empty());
        for k in [7, 1, 8] {
            lru.touch(k);
        }
        assert_eq!(order(&lru), [8, 1, 7]);
    }

    #[test]
    fn victims_skip_what_cannot_be_unpinned() {
        let mut lru = Lru::default();
        for k in 0..3 {
            lru.touch(k);
        }
        assert_eq!(lru.victim(|k| k != 0), Some((1, Hint::Normal)));
        assert_eq!(lru.victim(|_| false), None);
    }
}
