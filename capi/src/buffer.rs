//! Copying text out to caller-owned buffers.

use std::os::raw::c_char;

/// Copies `msg` into the caller's buffer `(buf, buf_len)` the way `snprintf`
/// does, and returns `msg.len()`: the number of bytes the full text needs, not
/// counting the terminating NUL.
///
/// - At most `buf_len - 1` bytes are copied, always followed by a NUL.
/// - Truncation backs off to a UTF-8 character boundary, so the buffer always
///   holds valid UTF-8.
/// - `buf == NULL` or `buf_len == 0` writes nothing (the size query
///   `f(obj, NULL, 0)`); whether NULL with `buf_len > 0` is an error is the
///   caller's decision (use `args::bytes_mut` to make it one).
///
/// So the caller's idiom is: `n = f(obj, buf, sizeof buf); if (n >= sizeof buf)
/// truncated, need n + 1 bytes`.
pub(crate) fn copy_to_c_buf(msg: &str, buf: *mut c_char, buf_len: usize) -> usize {
    if buf.is_null() || buf_len == 0 {
        return msg.len();
    }
    let mut n = msg.len().min(buf_len - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: the C caller passes a buffer of at least `buf_len` writable bytes;
    // `n + 1 <= buf_len`, and `msg` (Rust memory) cannot overlap it.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    msg.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(msg: &str, len: usize) -> (usize, Vec<u8>) {
        let mut buf = vec![0x55u8; len + 2];
        let n = copy_to_c_buf(msg, buf.as_mut_ptr().cast(), len);
        (n, buf)
    }

    #[test]
    fn fits() {
        let (n, buf) = run("hello", 16);
        assert_eq!(n, 5);
        assert_eq!(&buf[..6], b"hello\0");
        assert_eq!(buf[6], 0x55, "nothing written past the NUL");
    }

    #[test]
    fn exact_fit_and_truncation() {
        let (n, buf) = run("hello", 6);
        assert_eq!((n, &buf[..6]), (5, &b"hello\0"[..]));
        let (n, buf) = run("hello", 5);
        assert_eq!((n, &buf[..5]), (5, &b"hell\0"[..]));
        assert_eq!(buf[5], 0x55);
        let (n, buf) = run("hello", 1);
        assert_eq!((n, buf[0], buf[1]), (5, 0, 0x55));
    }

    #[test]
    fn zero_len_and_null_write_nothing() {
        let (n, buf) = run("hello", 0);
        assert_eq!((n, buf[0]), (5, 0x55));
        assert_eq!(copy_to_c_buf("hello", std::ptr::null_mut(), 100), 5);
    }

    #[test]
    fn truncates_on_char_boundary() {
        // "é" is two bytes; a 3-byte buffer has room for "a" + NUL only, not half of "é".
        let (n, buf) = run("aé", 3);
        assert_eq!(n, 3);
        assert_eq!(&buf[..2], b"a\0");
    }
}
