//! The recording file, version 1. Integers are little-endian.
//!
//! ```text
//! magic      8 bytes  "RDMAMREC"
//! version    u32      1
//! flags      u32      bit 0: pin-all; others 0
//! blocks     u32      B, then B times:
//!   name_len u16, name (UTF-8, 1..=255 bytes), offset u64, length u64
//! stream     u64      S, then S bytes: the stream (QEMU_FILE payloads) in order
//! windows    u32      W, then W times:
//!   stream_begin u64, stream_end u64, ranges u32 R, then R times:
//!     kind u8 (1 registered, 2 zeroed), block u32, offset u64, length u64
//! RAM        the B blocks' final contents, `length` bytes each, in order
//! checksum   32 bytes: SHA-256 of every byte before it
//! ```

use std::io::{self, Read, Write};

use sha2::{Digest, Sha256};

use super::{RangeKind, RecordedBlock, RecordedRange, RecordedWindow, Recording};
use crate::{Error, ErrorKind, Result};

const MAGIC: &[u8; 8] = b"RDMAMREC";
/// The version this library writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const FLAG_PIN_ALL: u32 = 1;
const CHECKSUM_LEN: usize = 32;

/// Passes writes through, hashing them.
struct Hashing<W: Write> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidArgument, format!("not a valid recording: {what}"))
}

fn io_error(e: io::Error) -> Error {
    Error::new(ErrorKind::InvalidArgument, format!("recording I/O: {e}"))
}

impl Recording {
    /// Writes the recording in the format above.
    pub fn write_to(&self, out: impl Write) -> Result<()> {
        self.check()?;
        let mut w = Hashing { inner: io::BufWriter::new(out), hash: Sha256::new() };
        let mut put = |bytes: &[u8]| w.write_all(bytes).map_err(io_error);
        put(MAGIC)?;
        put(&FORMAT_VERSION.to_le_bytes())?;
        put(&(if self.pin_all { FLAG_PIN_ALL } else { 0 }).to_le_bytes())?;
        put(&(self.blocks.len() as u32).to_le_bytes())?;
        for b in &self.blocks {
            if b.name.is_empty() || b.name.len() > 255 {
                return Err(bad(format!("block name {:?} is not 1 to 255 bytes", b.name)));
            }
            put(&(b.name.len() as u16).to_le_bytes())?;
            put(b.name.as_bytes())?;
            put(&b.offset.to_le_bytes())?;
            put(&(b.ram.len() as u64).to_le_bytes())?;
        }
        put(&(self.stream.len() as u64).to_le_bytes())?;
        put(&self.stream)?;
        put(&(self.windows.len() as u32).to_le_bytes())?;
        for win in &self.windows {
            put(&win.stream_begin.to_le_bytes())?;
            put(&win.stream_end.to_le_bytes())?;
            put(&(win.ranges.len() as u32).to_le_bytes())?;
            for r in &win.ranges {
                put(&[match r.kind {
                    RangeKind::Registered => 1,
                    RangeKind::Zeroed => 2,
                }])?;
                put(&r.block.to_le_bytes())?;
                put(&r.offset.to_le_bytes())?;
                put(&r.len.to_le_bytes())?;
            }
        }
        for b in &self.blocks {
            put(&b.ram)?;
        }
        let sum = w.hash.clone().finalize();
        w.inner.write_all(&sum).and_then(|()| w.inner.flush()).map_err(io_error)
    }

    /// Reads a recording written by [`write_to`](Self::write_to), field by
    /// field (no more memory than the recording itself), every field
    /// checked, then the checksum and the end of the input.
    pub fn read_from(input: impl Read) -> Result<Recording> {
        let mut r = Fields { input: io::BufReader::new(input), hash: Sha256::new() };
        if &r.array::<8>()? != MAGIC {
            return Err(bad("no RDMAMREC magic"));
        }
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(bad(format!("format version {version}, this library reads {FORMAT_VERSION}")));
        }
        let flags = r.u32()?;
        if flags & !FLAG_PIN_ALL != 0 {
            return Err(bad(format!("unknown flags {flags:#x}")));
        }
        let mut layout = Vec::new();
        for _ in 0..r.u32()? {
            let name_len = r.u16()?;
            let name =
                String::from_utf8(r.bytes(u64::from(name_len))?).map_err(|_| bad("a block name is not UTF-8"))?;
            if name.is_empty() || name.len() > 255 {
                return Err(bad(format!("block name {name:?} is not 1 to 255 bytes")));
            }
            layout.push((name, r.u64()?, r.u64()?));
        }
        let stream_len = r.u64()?;
        let stream = r.bytes(stream_len)?;
        let mut windows = Vec::new();
        for _ in 0..r.u32()? {
            let (stream_begin, stream_end) = (r.u64()?, r.u64()?);
            let mut ranges = Vec::new();
            for _ in 0..r.u32()? {
                let kind = match r.array::<1>()?[0] {
                    1 => RangeKind::Registered,
                    2 => RangeKind::Zeroed,
                    k => return Err(bad(format!("range kind {k}"))),
                };
                ranges.push(RecordedRange { kind, block: r.u32()?, offset: r.u64()?, len: r.u64()? });
            }
            windows.push(RecordedWindow { stream_begin, stream_end, ranges });
        }
        let mut blocks = Vec::new();
        for (name, offset, length) in layout {
            blocks.push(RecordedBlock { name, offset, ram: r.bytes(length)? });
        }
        let sum = r.hash.clone().finalize();
        let mut stored = [0u8; CHECKSUM_LEN];
        r.input.read_exact(&mut stored).map_err(|_| bad("ends before its checksum"))?;
        if sum.as_slice() != stored {
            return Err(bad("checksum mismatch (changed or cut)"));
        }
        if r.input.read(&mut [0u8; 1]).map_err(io_error)? != 0 {
            return Err(bad("bytes after the checksum"));
        }
        let recording = Recording { pin_all: flags & FLAG_PIN_ALL != 0, blocks, stream, windows };
        recording.check().map_err(|e| bad(e.message))?;
        Ok(recording)
    }
}

/// Reads fields off the input, hashing every byte read.
struct Fields<R: Read> {
    input: R,
    hash: Sha256,
}

impl<R: Read> Fields<R> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.input.read_exact(&mut b).map_err(|_| bad("ends early"))?;
        self.hash.update(b);
        Ok(b)
    }

    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// `n` bytes. The buffer is reserved up front (a false length reserves
    /// address space, never touched, and fails once the input ends).
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        let len = usize::try_from(n).map_err(|_| bad(format!("a length of {n} bytes")))?;
        v.try_reserve_exact(len).map_err(|_| bad(format!("a length of {n} bytes")))?;
        (&mut self.input).take(n).read_to_end(&mut v).map_err(io_error)?;
        if v.len() != len {
            return Err(bad(format!("ends early: {len} bytes wanted, {} there", v.len())));
        }
        self.hash.update(&v);
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Recording {
        Recording {
            pin_all: true,
            blocks: vec![
                RecordedBlock { name: "pc.ram".into(), offset: 0, ram: (0..3 << 20).map(|i| i as u8).collect() },
                RecordedBlock { name: "pc.bios".into(), offset: 0xfffc_0000, ram: vec![7; 4096] },
            ],
            stream: b"QEVM\0\0\0\x03 stream bytes".to_vec(),
            windows: vec![
                RecordedWindow { stream_begin: 8, stream_end: 8, ranges: vec![] },
                RecordedWindow {
                    stream_begin: 10,
                    stream_end: 12,
                    ranges: vec![
                        RecordedRange { kind: RangeKind::Registered, block: 0, offset: 1 << 20, len: 1 << 20 },
                        RecordedRange { kind: RangeKind::Zeroed, block: 1, offset: 0, len: 4096 },
                    ],
                },
            ],
        }
    }

    fn bytes(r: &Recording) -> Vec<u8> {
        let mut out = Vec::new();
        r.write_to(&mut out).unwrap();
        out
    }

    #[test]
    fn round_trip() {
        let r = sample();
        let data = bytes(&r);
        assert_eq!(&data[..8], MAGIC);
        assert_eq!(Recording::read_from(&data[..]).unwrap(), r);
    }

    #[test]
    fn any_changed_or_missing_byte_is_refused() {
        let data = bytes(&sample());
        for at in [0, 8, 12, 20, 100, data.len() / 2, data.len() - 1] {
            let mut bad = data.clone();
            bad[at] ^= 1;
            let e = Recording::read_from(&bad[..]).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        }
        let e = Recording::read_from(&data[..data.len() - 1]).unwrap_err();
        assert!(e.message.contains("checksum"), "{e}");
        let mut longer = data.clone();
        longer.push(0);
        assert!(Recording::read_from(&longer[..]).unwrap_err().message.contains("after the checksum"));
    }

    #[test]
    fn windows_must_fit_the_stream_and_the_blocks() {
        let mut r = sample();
        r.windows[1].stream_end = 100;
        assert!(r.write_to(Vec::new()).unwrap_err().message.contains("window 1"));
        let mut r = sample();
        r.windows[1].stream_begin = 7;
        assert!(r.check().unwrap_err().message.contains("window 1"));
        let mut r = sample();
        r.windows[1].ranges[1].len = 4097;
        assert!(r.check().unwrap_err().message.contains("outside the blocks"));
        let mut r = sample();
        r.windows[1].ranges[0].block = 2;
        assert!(r.check().unwrap_err().message.contains("outside the blocks"));
    }

    /// Every byte of a small recording changed (and the checksum made to
    /// match again, so the fields behind it are read): refused or read as a
    /// recording that passes its checks, never a panic.
    #[test]
    fn changed_fields_behind_a_valid_checksum_are_checked() {
        let mut r = sample();
        r.blocks[0].ram.truncate(2 << 20);
        r.blocks[1].ram.truncate(4096);
        let data = bytes(&r);
        let body = data.len() - CHECKSUM_LEN;
        let ram_start = body - (2 << 20) - 4096;
        for at in (0..ram_start).chain([ram_start, body - 1]) {
            for flip in [0x01, 0x80, 0xff] {
                let mut bad = data[..body].to_vec();
                bad[at] ^= flip;
                bad.extend_from_slice(&Sha256::digest(&bad));
                if let Ok(read) = Recording::read_from(&bad[..]) {
                    read.check().unwrap();
                }
            }
        }
        for len in 0..ram_start {
            assert!(Recording::read_from(&data[..len]).is_err(), "{len} bytes");
        }
    }
}
