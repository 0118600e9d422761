//! Replaying: a source that sends a recording again.

use super::Recording;
use crate::engine::{Config, Ending, RamBlocks, SaveRange, Source};
use crate::Result;

impl Recording {
    /// Connects to a destination on `host:port` as a source (with `config`,
    /// its `pin_all` replaced by the recording's) and sends the recording:
    /// the stream in order, each window at its recorded position, writing
    /// the final RAM of its ranges.
    /// Returns how the source's `close` judged the end.
    pub fn replay(&mut self, host: &str, port: u16, config: &Config) -> Result<Ending> {
        self.check()?;
        let config = Config { pin_all: self.pin_all, ..config.clone() };
        let mut registry = RamBlocks::new();
        for b in &mut self.blocks {
            // SAFETY: the source only reads the blocks, and is closed or dropped
            // below before `self` (borrowed mutably meanwhile) can change them.
            unsafe { registry.add(&b.name, b.ram.as_mut_ptr(), b.offset, b.ram.len() as u64)? };
        }
        let mut source = Source::connect(host, port, &config, &registry)?;
        match self.send(&mut source) {
            Ok(()) => source.close(),
            Err(e) => {
                source.abort();
                Err(e)
            }
        }
    }

    fn send(&self, source: &mut Source) -> Result<()> {
        let mut sent = 0;
        for w in &self.windows {
            source.put(&self.stream[sent..w.stream_begin as usize])?;
            source.iteration_begin()?;
            source.save_ranges(w.ranges.iter().map(|r| SaveRange { block: r.block, offset: r.offset, len: r.len }))?;
            // Held back by the source until the window is closed, as they were sent.
            source.put(&self.stream[w.stream_begin as usize..w.stream_end as usize])?;
            source.iteration_end()?;
            sent = w.stream_end as usize;
        }
        source.put(&self.stream[sent..])
    }
}
