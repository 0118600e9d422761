//! Bitmaps of `u64` words, bit `i` in `words[i / 64]` at `i % 64` (the
//! layout of KVM's dirty log and QEMU's RAMBlock bitmaps, which the save
//! path takes, and of post-copy's stale sets): the walks the save path,
//! the post-copy table check and the destination's post-copy share, each
//! a word at a time.

pub(crate) fn test(words: &[u64], i: u64) -> bool {
    words[(i / 64) as usize] >> (i % 64) & 1 != 0
}

/// Clears bits `from..end`; returns how many of them were set.
pub(crate) fn take_range(words: &mut [u64], from: u64, end: u64) -> u64 {
    debug_assert!(from <= end, "{from}..{end}");
    let mut taken = 0;
    let mut i = from;
    while i < end {
        let word = (i / 64) as usize;
        let upto = end.min((i / 64 + 1) * 64);
        let bits = upto - i;
        let mask = if bits == 64 { !0 } else { ((1u64 << bits) - 1) << (i % 64) };
        taken += u64::from((words[word] & mask).count_ones());
        words[word] &= !mask;
        i = upto;
    }
    taken
}

/// The set bits.
pub(crate) fn count(words: &[u64]) -> u64 {
    words.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// The set bits among the first `n` (`words` holds at least that many).
pub(crate) fn count_first(words: &[u64], n: u64) -> u64 {
    let (full, tail) = ((n / 64) as usize, n % 64);
    let last = if tail > 0 { u64::from((words[full] & ((1 << tail) - 1)).count_ones()) } else { 0 };
    count(&words[..full]) + last
}

/// The first set bit at or after `from`, below `end`.
pub(crate) fn next_set(words: &[u64], from: u64, end: u64) -> Option<u64> {
    next(words, from, end, |w| w)
}

/// The first clear bit at or after `from`, or `end` if there is none below it.
pub(crate) fn next_clear(words: &[u64], from: u64, end: u64) -> u64 {
    next(words, from, end, |w| !w).unwrap_or(end)
}

/// The first bit at or after `from`, below `end`, that `look` makes a one.
fn next(words: &[u64], from: u64, end: u64, look: impl Fn(u64) -> u64) -> Option<u64> {
    debug_assert!(from <= end, "{from}..{end}");
    let mut i = from;
    while i < end {
        let w = look(words[(i / 64) as usize]) >> (i % 64);
        if w != 0 {
            let at = i + u64::from(w.trailing_zeros());
            return (at < end).then_some(at);
        }
        i = (i / 64 + 1) * 64;
    }
    None
}

/// Calls `f(first bit, length)` for each run of set bits among the first
/// `count` bits of `bitmap` (which holds at least that many), in order,
/// stopping at the first error. A word at a time: a run is found with two
/// bit counts, a word of clear bits skipped with one test.
#[inline(always)]
pub(crate) fn for_each_run<E>(
    bitmap: &[u64],
    count: u64,
    mut f: impl FnMut(u64, u64) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let full = (count / 64) as usize;
    let tail = count % 64;
    let last = (tail > 0).then(|| bitmap[full] & ((1 << tail) - 1));
    // Where the run reaching into the current word started, if one does.
    let mut open: Option<u64> = None;
    for (i, mut w) in bitmap[..full].iter().copied().chain(last).enumerate() {
        let base = i as u64 * 64;
        if let Some(start) = open {
            if w == !0 {
                continue;
            }
            let end = u64::from(w.trailing_ones());
            f(start, base + end - start)?;
            open = None;
            w &= !0 << end; // end < 64: w has a clear bit
        }
        while w != 0 {
            let first = u64::from(w.trailing_zeros());
            let ones = u64::from((w >> first).trailing_ones());
            if first + ones == 64 {
                open = Some(base + first);
                break;
            }
            f(base + first, ones)?;
            w &= !0 << (first + ones);
        }
    }
    match open {
        Some(start) => f(start, count - start),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitmap_runs(bitmap: &[u64], count: u64) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        for_each_run(bitmap, count, |first, len| {
            runs.push((first, len));
            Ok::<(), ()>(())
        })
        .unwrap();
        runs
    }

    /// The runs a bit-by-bit walk finds.
    fn slow_runs(bitmap: &[u64], count: u64) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for i in (0..count).filter(|&i| test(bitmap, i)) {
            match runs.last_mut() {
                Some((first, len)) if *first + *len == i => *len += 1,
                _ => runs.push((i, 1)),
            }
        }
        runs
    }

    #[test]
    fn bitmap_runs_match_a_bit_by_bit_walk() {
        let words = [
            vec![0, 0, 0],
            vec![!0, !0, !0],
            vec![1, 1 << 63, 1],
            vec![1 << 63, 1, 0],
            vec![0xF0F0_0000_0000_00FF, !0, 0x8000_0000_0000_0001],
            vec![!0 - 1, !0 >> 1, 0x5555_5555_5555_5555],
            vec![1 << 63, !0, !0, !0, 1],
            vec![!0, !0, !0, !0, !0],
        ];
        for bitmap in &words {
            for count in [0, 1, 63, 64, 65, 100, 127, 128, 129, 191, 192, 255, 256, 319, 320] {
                if count > 64 * bitmap.len() as u64 {
                    continue;
                }
                assert_eq!(bitmap_runs(bitmap, count), slow_runs(bitmap, count), "{bitmap:x?} {count}");
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let bitmap: Vec<u64> = (0..5)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Sparse, dense, or whole words of ones or zeros.
                    match x % 4 {
                        0 => x & (x >> 3),
                        1 => x | (x >> 3),
                        2 => !0,
                        _ => 0,
                    }
                })
                .collect();
            let count = x % 321;
            assert_eq!(bitmap_runs(&bitmap, count), slow_runs(&bitmap, count));
        }
    }

    #[test]
    fn next_set_and_next_clear_match_a_bit_by_bit_walk() {
        let words = [0xF0F0_0000_0000_00FFu64, !0, 0, 0x8000_0000_0000_0001];
        for from in 0..256 {
            for end in from..=256 {
                let set = (from..end).find(|&i| test(&words, i));
                let clear = (from..end).find(|&i| !test(&words, i)).unwrap_or(end);
                assert_eq!(next_set(&words, from, end), set, "{from}..{end}");
                assert_eq!(next_clear(&words, from, end), clear, "{from}..{end}");
            }
        }
        assert_eq!(count(&words), 16 + 64 + 2);
    }

    #[test]
    fn count_first_counts_like_a_bit_by_bit_walk() {
        let words = [0xF0F0_0000_0000_00FFu64, !0, 0, 0x8000_0000_0000_0001];
        for n in 0..=256 {
            assert_eq!(count_first(&words, n), (0..n).filter(|&i| test(&words, i)).count() as u64, "{n}");
        }
    }

    #[test]
    fn take_range_clears_and_counts_like_a_bit_by_bit_walk() {
        let words = [0xF0F0_0000_0000_00FFu64, !0, 0, 0x8000_0000_0000_0001];
        for from in 0..256 {
            for end in from..=256 {
                let mut taken = words;
                let n = take_range(&mut taken, from, end);
                assert_eq!(n, (from..end).filter(|&i| test(&words, i)).count() as u64, "{from}..{end}");
                for i in 0..256 {
                    assert_eq!(test(&taken, i), test(&words, i) && !(from..end).contains(&i), "{from}..{end} bit {i}");
                }
            }
        }
    }
}
