//! The zero ranges waiting for the next COMPRESS messages: merged while
//! adjacent (toward an rdmamig peer; QEMU takes one range inside one chunk),
//! and cut into messages of at most a batch of ranges and
//! `MAX_COMPRESS_BYTES` (the destination's bound).

use crate::engine::validate::MAX_COMPRESS_BYTES;
use crate::wire::Compress;

/// Zero ranges per COMPRESS message toward an rdmamig peer (QEMU applies one).
const ZERO_BATCH: usize = 1024;

pub(super) struct ZeroQueue {
    zeros: Vec<Compress>,
    /// An rdmamig peer: ranges merge, and a message carries `ZERO_BATCH`.
    extensions: bool,
}

impl ZeroQueue {
    pub fn new(extensions: bool) -> ZeroQueue {
        ZeroQueue { zeros: Vec::new(), extensions }
    }

    pub fn len(&self) -> usize {
        self.zeros.len()
    }

    pub fn is_empty(&self) -> bool {
        self.zeros.is_empty()
    }

    /// Ranges per COMPRESS message: QEMU applies only the first.
    pub fn batch(&self) -> usize {
        if self.extensions {
            ZERO_BATCH
        } else {
            1
        }
    }

    /// Adds `len` zero bytes at `offset` (the destination's RAM address
    /// space) of `block`.
    pub fn push(&mut self, block: u32, offset: u64, len: u64) {
        let entry = Compress { value: 0, block_index: block, offset, length: len };
        match self.zeros.last_mut() {
            Some(z)
                if self.extensions
                    && z.block_index == entry.block_index
                    && z.offset + z.length == entry.offset
                    && z.length + entry.length <= MAX_COMPRESS_BYTES =>
            {
                z.length += entry.length
            }
            _ => self.zeros.push(entry),
        }
    }

    /// Takes every range, as the COMPRESS messages that carry them.
    pub fn take_messages(&mut self) -> Vec<Vec<Compress>> {
        let zeros = std::mem::take(&mut self.zeros);
        let mut messages = Vec::new();
        let mut rest = &zeros[..];
        while !rest.is_empty() {
            let mut bytes = 0;
            let n = rest
                .iter()
                .take(self.batch())
                .take_while(|z| {
                    bytes += z.length;
                    bytes <= MAX_COMPRESS_BYTES
                })
                .count()
                .max(1);
            let (message, later) = rest.split_at(n);
            messages.push(message.to_vec());
            rest = later;
        }
        messages
    }
}
