//! The chunks of one block registered on the destination (dynamic
//! registration): disjoint ranges of chunks, each holding its registration,
//! kept by first chunk. Every question is one B-tree lookup, however long
//! the ranges: a request naming chunks of a whole-block registration of a
//! 4 TiB block (4 Mi chunks) costs what one naming a lone chunk does, and
//! the bookkeeping grows with the registrations, not with the block.

use std::collections::BTreeMap;

/// A registered range: its last chunk and what keeps it registered.
pub(super) struct Span<G> {
    pub last: usize,
    pub registration: G,
}

pub(super) struct Registered<G> {
    /// By first chunk; the ranges never overlap.
    spans: BTreeMap<usize, Span<G>>,
    /// Lookups made: what a test counts to see that the work per request
    /// does not grow with the chunks a registration covers.
    #[cfg(test)]
    pub lookups: std::cell::Cell<u64>,
}

impl<G> Default for Registered<G> {
    fn default() -> Self {
        Registered {
            spans: BTreeMap::new(),
            #[cfg(test)]
            lookups: Default::default(),
        }
    }
}

impl<G> Registered<G> {
    fn looked_up(&self) {
        #[cfg(test)]
        self.lookups.set(self.lookups.get() + 1);
    }

    /// The range that holds `chunk`: its first chunk, and it.
    pub fn covering(&self, chunk: usize) -> Option<(usize, &Span<G>)> {
        self.looked_up();
        let (&first, span) = self.spans.range(..=chunk).next_back()?;
        (span.last >= chunk).then_some((first, span))
    }

    /// The first chunk of the first range that starts in `[first, last]`.
    pub fn first_start_in(&self, first: usize, last: usize) -> Option<usize> {
        self.looked_up();
        self.spans.range(first..=last).next().map(|(&start, _)| start)
    }

    /// Records chunks `[first, last]`, none of which is registered, as registered by `registration`.
    pub fn insert(&mut self, first: usize, last: usize, registration: G) {
        self.spans.insert(first, Span { last, registration });
    }

    /// Takes out the range that holds `chunk`: its first chunk, and it.
    pub fn remove_covering(&mut self, chunk: usize) -> Option<(usize, Span<G>)> {
        let (first, _) = self.covering(chunk)?;
        self.spans.remove(&first).map(|span| (first, span))
    }

    /// Takes out every registration.
    pub fn drain(&mut self) -> impl Iterator<Item = G> {
        std::mem::take(&mut self.spans).into_values().map(|span| span.registration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_answer_for_each_of_their_chunks() {
        let mut r = Registered::default();
        r.insert(2, 5, 'a');
        r.insert(6, 6, 'b');
        r.insert(10, 1 << 40, 'c');
        let owner = |r: &Registered<char>, c| r.covering(c).map(|(first, s)| (first, s.last, s.registration));
        assert_eq!(owner(&r, 1), None);
        assert_eq!(owner(&r, 2), Some((2, 5, 'a')));
        assert_eq!(owner(&r, 5), Some((2, 5, 'a')));
        assert_eq!(owner(&r, 6), Some((6, 6, 'b')));
        assert_eq!(owner(&r, 7), None);
        assert_eq!(owner(&r, 1 << 39), Some((10, 1 << 40, 'c')));
        assert_eq!(owner(&r, (1 << 40) + 1), None);
        assert_eq!(r.first_start_in(0, 1), None);
        assert_eq!(r.first_start_in(0, 2), Some(2));
        assert_eq!(r.first_start_in(3, 9), Some(6));
        assert_eq!(r.first_start_in(7, 9), None);
        assert_eq!(r.remove_covering(4).map(|(first, s)| (first, s.registration)), Some((2, 'a')));
        assert_eq!(owner(&r, 2), None);
        assert!(r.remove_covering(4).is_none());
        let mut left: Vec<char> = r.drain().collect();
        left.sort();
        assert_eq!(left, ['b', 'c']);
        assert_eq!(owner(&r, 6), None);
    }
}
