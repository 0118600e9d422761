//! The zero scan: whether a range of guest RAM is all zero, with the widest
//! vector loads the CPU has (chosen once, at the first scan).
//!
//! Guest RAM may change under us (the guest keeps running), so every byte is
//! read with a volatile load: the compiler may neither skip, repeat nor widen
//! a read past the range. The vector variants read a word-at-a-time head up
//! to the vector alignment, then aligned vectors, then a word-at-a-time tail:
//! an aligned vector never straddles a page, and no load touches a byte
//! outside the range. A vector load of bytes the guest is writing may see any
//! mix of old and new bytes; that is harmless, as with the word loop: a page
//! written after it was scanned is dirty again and goes in the next round.
//! (Volatile loads are what the word loop relied on before: each becomes
//! exactly one machine load of that width, which on x86 cannot fault inside
//! a mapped page and needs no atomicity here.)

use std::sync::OnceLock;

/// A zero scan. Safety: `ptr..ptr + len` must be mapped and readable.
pub type Scan = unsafe fn(*const u8, usize) -> bool;

/// One implementation, by name.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// Read by the tests and `examples/save_path.rs`.
    #[cfg_attr(not(any(test, feature = "bench-internals")), allow(dead_code))]
    pub name: &'static str,
    pub scan: Scan,
}

/// The variants this CPU runs, the preferred one last.
pub fn supported() -> Vec<Variant> {
    #[allow(unused_mut)] // Only x86_64 adds to it.
    let mut v = vec![Variant { name: "words", scan: words }];
    #[cfg(target_arch = "x86_64")]
    {
        v.push(Variant { name: "sse2", scan: x86::sse2 });
        if is_x86_feature_detected!("avx2") {
            v.push(Variant { name: "avx2", scan: x86::avx2 });
        }
        #[cfg(rdmamig_avx512)]
        if is_x86_feature_detected!("avx512f") {
            v.push(Variant { name: "avx512f", scan: x86::avx512f });
        }
    }
    v
}

/// Whether `len` bytes at `ptr` are all zero, by the best variant the CPU runs.
///
/// # Safety
/// `ptr..ptr + len` must be mapped and readable.
pub(crate) unsafe fn is_zero(ptr: *const u8, len: usize) -> bool {
    static CHOSEN: OnceLock<Scan> = OnceLock::new();
    let scan = CHOSEN.get_or_init(|| supported().last().expect("the word loop is always there").scan);
    // SAFETY: the caller's contract is the variant's.
    unsafe { scan(ptr, len) }
}

/// A word at a time, bytes up to word alignment and after the last whole word.
///
/// # Safety
/// `ptr..ptr + len` must be mapped and readable.
pub(crate) unsafe fn words(ptr: *const u8, len: usize) -> bool {
    let word = std::mem::size_of::<usize>();
    let head = head_len(ptr, word, len);
    // Every address read below lies in `ptr..ptr + len`; the word loads are
    // at word-aligned addresses.
    for i in 0..head {
        // SAFETY: as above.
        if unsafe { ptr.add(i).read_volatile() } != 0 {
            return false;
        }
    }
    let mut i = head;
    while i + word <= len {
        // SAFETY: as above.
        if unsafe { (ptr.add(i) as *const usize).read_volatile() } != 0 {
            return false;
        }
        i += word;
    }
    while i < len {
        // SAFETY: as above.
        if unsafe { ptr.add(i).read_volatile() } != 0 {
            return false;
        }
        i += 1;
    }
    true
}

/// Bytes from `ptr` to the next multiple of `align` (a power of two), at most `len`.
fn head_len(ptr: *const u8, align: usize, len: usize) -> usize {
    ((align - (ptr as usize & (align - 1))) & (align - 1)).min(len)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::words;

    /// Vectors OR-ed together between two tests: the scan stops within this
    /// many vectors of a non-zero byte, and keeps several loads in flight
    /// (8 rather than 4: faster over cached data in `examples/save_path.rs`,
    /// docs/benchmarks.md).
    const UNROLL: usize = 8;

    /// Splits `ptr..ptr + len` into a head of bytes up to `align`, a body of
    /// aligned `align`-byte vectors, and a tail: returns (head bytes, vectors).
    fn split(ptr: *const u8, len: usize, align: usize) -> (usize, usize) {
        let head = super::head_len(ptr, align, len);
        (head, (len - head) / align)
    }

    /// Scans head and tail with the word loop and the aligned body with `body`
    /// (given its first vector's address and the vector count).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be mapped and readable; `body` must read only
    /// the vectors it is given.
    #[inline(always)]
    unsafe fn around(ptr: *const u8, len: usize, align: usize, body: impl FnOnce(*const u8, usize) -> bool) -> bool {
        let (head, vectors) = split(ptr, len, align);
        let body_len = vectors * align;
        // SAFETY: head, body and tail partition `ptr..ptr + len`.
        unsafe {
            words(ptr, head) && body(ptr.add(head), vectors) && words(ptr.add(head + body_len), len - head - body_len)
        }
    }

    /// 16-byte vectors (SSE2 is part of x86_64).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be mapped and readable.
    pub(crate) unsafe fn sse2(ptr: *const u8, len: usize) -> bool {
        // SAFETY: `around` passes 16-byte aligned vectors inside the range.
        unsafe {
            around(ptr, len, 16, |p, n| {
                let p = p as *const __m128i;
                let zero = |v: __m128i| _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128())) == 0xFFFF;
                let mut i = 0;
                while i + UNROLL <= n {
                    let a = _mm_or_si128(p.add(i).read_volatile(), p.add(i + 1).read_volatile());
                    let b = _mm_or_si128(p.add(i + 2).read_volatile(), p.add(i + 3).read_volatile());
                    let c = _mm_or_si128(p.add(i + 4).read_volatile(), p.add(i + 5).read_volatile());
                    let d = _mm_or_si128(p.add(i + 6).read_volatile(), p.add(i + 7).read_volatile());
                    let (a, b) = (_mm_or_si128(a, c), _mm_or_si128(b, d));
                    if !zero(_mm_or_si128(a, b)) {
                        return false;
                    }
                    i += UNROLL;
                }
                (i..n).all(|i| zero(p.add(i).read_volatile()))
            })
        }
    }

    /// 32-byte vectors.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be mapped and readable, and the CPU must have AVX2.
    pub(crate) unsafe fn avx2(ptr: *const u8, len: usize) -> bool {
        /// # Safety
        /// `n` 32-byte aligned vectors from `p` are readable; the CPU has AVX2.
        #[target_feature(enable = "avx2")]
        unsafe fn body(p: *const u8, n: usize) -> bool {
            let p = p as *const __m256i;
            let mut i = 0;
            // SAFETY: vectors `i..n` are aligned and in the range.
            unsafe {
                while i + UNROLL <= n {
                    let a = _mm256_or_si256(p.add(i).read_volatile(), p.add(i + 1).read_volatile());
                    let b = _mm256_or_si256(p.add(i + 2).read_volatile(), p.add(i + 3).read_volatile());
                    let c = _mm256_or_si256(p.add(i + 4).read_volatile(), p.add(i + 5).read_volatile());
                    let d = _mm256_or_si256(p.add(i + 6).read_volatile(), p.add(i + 7).read_volatile());
                    let (a, b) = (_mm256_or_si256(a, c), _mm256_or_si256(b, d));
                    let v = _mm256_or_si256(a, b);
                    if _mm256_testz_si256(v, v) == 0 {
                        return false;
                    }
                    i += UNROLL;
                }
                while i < n {
                    let v = p.add(i).read_volatile();
                    if _mm256_testz_si256(v, v) == 0 {
                        return false;
                    }
                    i += 1;
                }
            }
            true
        }
        // SAFETY: the caller checked for AVX2; `around` passes aligned vectors inside the range.
        unsafe { around(ptr, len, 32, |p, n| body(p, n)) }
    }

    /// 64-byte vectors (needs a compiler with stable AVX-512: Rust 1.89).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be mapped and readable, and the CPU must have AVX-512F.
    #[cfg(rdmamig_avx512)]
    #[clippy::msrv = "1.89"] // build.rs sets the cfg from 1.89 on
    pub(crate) unsafe fn avx512f(ptr: *const u8, len: usize) -> bool {
        /// # Safety
        /// `n` 64-byte aligned vectors from `p` are readable; the CPU has AVX-512F.
        #[target_feature(enable = "avx512f")]
        unsafe fn body(p: *const u8, n: usize) -> bool {
            let p = p as *const __m512i;
            let mut i = 0;
            // SAFETY: vectors `i..n` are aligned and in the range.
            unsafe {
                while i + UNROLL <= n {
                    let a = _mm512_or_si512(p.add(i).read_volatile(), p.add(i + 1).read_volatile());
                    let b = _mm512_or_si512(p.add(i + 2).read_volatile(), p.add(i + 3).read_volatile());
                    let c = _mm512_or_si512(p.add(i + 4).read_volatile(), p.add(i + 5).read_volatile());
                    let d = _mm512_or_si512(p.add(i + 6).read_volatile(), p.add(i + 7).read_volatile());
                    let (a, b) = (_mm512_or_si512(a, c), _mm512_or_si512(b, d));
                    let v = _mm512_or_si512(a, b);
                    if _mm512_test_epi64_mask(v, v) != 0 {
                        return false;
                    }
                    i += UNROLL;
                }
                while i < n {
                    let v = p.add(i).read_volatile();
                    if _mm512_test_epi64_mask(v, v) != 0 {
                        return false;
                    }
                    i += 1;
                }
            }
            true
        }
        // SAFETY: the caller checked for AVX-512F; `around` passes aligned vectors inside the range.
        unsafe { around(ptr, len, 64, |p, n| body(p, n)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zeroed buffer whose byte `PAD` is 64-byte aligned, with `PAD` bytes around any range tested.
    const PAD: usize = 128;

    struct Buf(Vec<u8>, usize);

    impl Buf {
        fn new(len: usize) -> Buf {
            let v = vec![0u8; len + 3 * PAD];
            let at = PAD + v.as_ptr().wrapping_add(PAD).align_offset(64);
            Buf(v, at)
        }
        fn ptr(&self, start: usize) -> *const u8 {
            self.0[self.1 + start..].as_ptr()
        }
    }

    #[test]
    fn every_variant_checks_every_byte_at_every_alignment() {
        // Past the unrolled loop of each variant (8 vectors of up to 64 bytes) plus head and tail.
        const MAX: usize = 700;
        let lens = (0..=300).chain((301..=MAX).step_by(11)).chain([511, 512, 513, 575, 576, 577, MAX]);
        let variants = supported();
        eprintln!("zero scan variants: {:?}", variants.iter().map(|v| v.name).collect::<Vec<_>>());
        for v in &variants {
            let mut buf = Buf::new(MAX + 64);
            for start in 0..64 {
                for len in lens.clone() {
                    // Non-zero bytes right around the range must not count.
                    buf.0[buf.1 + start - 1] = 0xFF;
                    buf.0[buf.1 + start + len] = 0xFF;
                    // SAFETY: inside `buf`.
                    assert!(unsafe { (v.scan)(buf.ptr(start), len) }, "{}: zero {start}+{len}", v.name);
                    for pos in 0..len {
                        for byte in [1, 0x80] {
                            buf.0[buf.1 + start + pos] = byte;
                            // SAFETY: inside `buf`.
                            assert!(!unsafe { (v.scan)(buf.ptr(start), len) }, "{}: {start}+{len} at {pos}", v.name);
                        }
                        buf.0[buf.1 + start + pos] = 0;
                    }
                    buf.0[buf.1 + start - 1] = 0;
                    buf.0[buf.1 + start + len] = 0;
                }
            }
        }
    }

    #[test]
    fn every_variant_finds_one_byte_in_a_mebibyte() {
        const LEN: usize = 1 << 20;
        for v in supported() {
            let mut buf = Buf::new(LEN + 64);
            for start in [0, 1, 31, 32, 63] {
                // SAFETY: inside `buf`.
                assert!(unsafe { (v.scan)(buf.ptr(start), LEN) }, "{}", v.name);
                for pos in [0, 1, 255, 256, 4095, 4096, LEN / 2 + 17, LEN - 65, LEN - 64, LEN - 1] {
                    buf.0[buf.1 + start + pos] = 1;
                    // SAFETY: inside `buf`.
                    assert!(!unsafe { (v.scan)(buf.ptr(start), LEN) }, "{}: {start} {pos}", v.name);
                    // SAFETY: inside `buf`.
                    assert!(unsafe { (v.scan)(buf.ptr(start), pos) }, "{}: {start} {pos}", v.name);
                    buf.0[buf.1 + start + pos] = 0;
                }
            }
        }
    }

    #[test]
    fn the_dispatched_scan_is_the_last_supported_one() {
        let buf = Buf::new(4096);
        // SAFETY: inside `buf`.
        assert!(unsafe { is_zero(buf.ptr(3), 4000) });
        #[cfg(target_arch = "x86_64")]
        {
            let names: Vec<_> = supported().iter().map(|v| v.name).collect();
            assert!(names.contains(&"sse2"), "{names:?}");
            assert_eq!(names.contains(&"avx2"), is_x86_feature_detected!("avx2"));
        }
    }
}
