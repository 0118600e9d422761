//! Small synchronisation helpers shared by the source and destination.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::{Error, Result};

/// A one-shot result that a caller waits for and the engine thread fills.
#[derive(Default)]
pub(crate) struct Done {
    result: Mutex<Option<Result<()>>>,
    cv: Condvar,
}

impl Done {
    pub fn set(&self, r: Result<()>) {
        let mut slot = self.result.lock();
        if slot.is_none() {
            *slot = Some(r);
        }
        self.cv.notify_all();
    }

    /// Waits for the result, giving up with the engine's stored error if the
    /// engine stops without filling it (`failed` returns that error).
    pub fn wait(&self, failed: impl Fn() -> Option<Error>) -> Result<()> {
        let mut slot = self.result.lock();
        loop {
            if let Some(r) = slot.take() {
                return r;
            }
            if let Some(e) = failed() {
                return Err(e);
            }
            self.cv.wait_for(&mut slot, Duration::from_millis(50));
        }
    }
}

/// The first error of a connection, kept so every later call returns it.
#[derive(Default)]
pub(crate) struct StickyError {
    slot: Mutex<Option<Error>>,
    /// Whether `slot` holds an error: the per-page `save` checks without the lock.
    failed: AtomicBool,
}

impl StickyError {
    /// Keeps `e` unless an error is stored already; returns the stored one.
    pub fn set(&self, e: Error) -> Error {
        let mut slot = self.slot.lock();
        let stored = slot.get_or_insert(e).clone();
        self.failed.store(true, Ordering::Release);
        stored
    }

    pub fn get(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.slot.lock().clone()
    }

    pub fn check(&self) -> Result<()> {
        self.get().map_or(Ok(()), Err)
    }
}
