//! The unregistration worker: one process-wide thread that deregisters
//! memory regions handed to it through a lock-free queue, so that neither a
//! write path, the final iteration nor `close` waits for `ibv_dereg_mr`
//! (about 400 ms per 64 GiB). It runs while anything holds an
//! [`Unregistration`] handle (every connection holds one) and is joined, its
//! queue drained, when the last handle is dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crossbeam_queue::SegQueue;
use parking_lot::{Condvar, Mutex};

use crate::verbs::MemoryRegion;
use crate::{Error, ErrorKind, Result};

/// One registration to drop, and what to do once it is gone (the owner's accounting).
struct Job {
    mr: MemoryRegion,
    done: Box<dyn FnOnce() + Send>,
}

#[derive(Default)]
struct Queue {
    jobs: SegQueue<Job>,
    /// Jobs ever queued and ever finished: a flush waits for `finished` to
    /// reach what `queued` was when it started.
    queued: AtomicU64,
    finished: Mutex<u64>,
    progressed: Condvar,
    stop: AtomicBool,
}

impl Queue {
    fn serve(&self) {
        loop {
            match self.jobs.pop() {
                Some(job) => {
                    drop(job.mr);
                    (job.done)();
                    *self.finished.lock() += 1;
                    self.progressed.notify_all();
                }
                // `stop` is only read with the queue empty: everything queued before it is done.
                None if self.stop.load(Ordering::Acquire) => return,
                None => thread::park_timeout(Duration::from_millis(100)),
            }
        }
    }
}

/// A handle on the process's unregistration worker; the worker runs while one exists.
pub struct Unregistration {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
}

static WORKER: Mutex<Weak<Unregistration>> = Mutex::new(Weak::new());

impl Unregistration {
    /// The running worker, or a new one.
    pub fn get() -> Result<Arc<Unregistration>> {
        let mut current = WORKER.lock();
        if let Some(w) = current.upgrade() {
            return Ok(w);
        }
        let queue = Arc::new(Queue::default());
        let serving = queue.clone();
        let thread = thread::Builder::new()
            .name("rdmamig-unreg".into())
            .spawn(move || serving.serve())
            .map_err(|e| Error::new(ErrorKind::State, format!("cannot start the unregistration worker: {e}")))?;
        let w = Arc::new(Unregistration { queue, thread: Some(thread) });
        *current = Arc::downgrade(&w);
        Ok(w)
    }

    /// The running worker, if there is one.
    pub fn running() -> Option<Arc<Unregistration>> {
        WORKER.lock().upgrade()
    }

    /// Queues `mr` for deregistration; `done` runs on the worker right after it.
    pub fn release(&self, mr: MemoryRegion, done: impl FnOnce() + Send + 'static) {
        self.queue.queued.fetch_add(1, Ordering::Relaxed);
        self.queue.jobs.push(Job { mr, done: Box::new(done) });
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    /// Waits until everything queued before this call is deregistered.
    pub fn flush(&self) {
        let target = self.queue.queued.load(Ordering::Relaxed);
        let mut finished = self.queue.finished.lock();
        while *finished < target {
            if let Some(t) = &self.thread {
                t.thread().unpark();
            }
            self.queue.progressed.wait_for(&mut finished, Duration::from_millis(10));
        }
    }
}

impl Drop for Unregistration {
    fn drop(&mut self) {
        self.queue.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
