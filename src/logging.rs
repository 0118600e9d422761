//! The library's log: one optional, process-wide hook with a level filter.
//! Silent by default; rdmamig never writes to stderr itself (only Rust's
//! panic hook does, for a panic).
//!
//! Records are few and never per page: connect and accept, the negotiated
//! capabilities, each completed iteration window, how a connection ended,
//! a failed connect or accept, the failure that ended a connection,
//! pinning the kernel refused.
//!
//! Threads: a record is handed to the hook on the thread that produced it —
//! the caller's (in `Source::connect`, `Destination::accept`, `iteration_end`,
//! ...) or one of the library's (a connection's transfer or service thread,
//! the pin-all registration thread). The hook may
//! so run on several threads at once; it runs on the data path, so it should
//! be quick. Once [`set_log_hook`] returns, the hook it replaced is neither
//! running nor called again. Records produced inside the hook (by rdmamig
//! calls it makes) are dropped, and the hook cannot replace itself
//! ([`set_log_hook`] from inside it fails with `ErrorKind::State`).

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::RwLock;

use crate::{Error, ErrorKind, Result};

/// `define_levels!` below is the one list of the levels, each with its doc
/// and value: it makes [`Level`] and [`Level::ALL`], from which the C ABI
/// (capi/) generates its `rdmamig_log_level`. The values are fixed (the C
/// ABI's); a new level takes the next value.
macro_rules! define_levels {
    ($($(#[doc = $doc:literal])* $level:ident = $value:literal,)*) => {
        /// How much a record matters. Ordered: `Error < Warn < Info < Debug`, so a
        /// hook installed with maximum level `Info` gets errors, warnings and
        /// information, not debug records.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(u8)]
        pub enum Level {
            $($(#[doc = $doc])* $level = $value,)*
        }

        impl Level {
            /// Every level, least verbose first.
            pub const ALL: [Level; [$($value),*].len()] = [$(Level::$level),*];

            /// The level's name (`Error`, ...), for interfaces that mirror
            /// [`Level`], such as the C ABI's `rdmamig_log_level`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Level::$level => stringify!($level),)*
                }
            }

            /// The level's doc, one line per line (as [`Level::name`]).
            pub fn doc(self) -> &'static str {
                match self {
                    $(Level::$level => concat!($($doc, "\n"),*),)*
                }
            }
        }
    };
}

define_levels! {
    /// A connection failed: the error that ended it, or a failed connect or accept.
    Error = 1,
    /// Something went wrong and was worked around, or will make a later step
    /// fail: the kernel refused to pin memory (RLIMIT_MEMLOCK), pin-all not
    /// offered for the pin budget, a connection request refused, fork
    /// safety off.
    Warn = 2,
    /// A connection's milestones: connected or accepted, what the two sides
    /// negotiated, how the migration ended.
    Info = 3,
    /// Per-window records: each completed iteration window. Never per page.
    Debug = 4,
}

/// The hook's type: called with each record's level and message.
pub type LogHook = Box<dyn Fn(Level, &str) + Send + Sync>;

static HOOK: RwLock<Option<LogHook>> = RwLock::new(None);
/// The most verbose level the hook takes (0: no hook): read before anything
/// is formatted, so a silent library costs one atomic load per record.
static MAX_LEVEL: AtomicU8 = AtomicU8::new(0);

thread_local! {
    /// Whether this thread is inside the hook.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Installs `hook` as the process's log hook, taking records up to
/// `max_level` (`None` removes the hook: silence). Replaces any hook set
/// before, including one the C API set (`rdmamig_set_log_callback`): there
/// is one per process. Returns once the replaced hook is no longer running.
///
/// Fails with `ErrorKind::State` when called from inside the hook.
///
/// ```
/// use rdmamig::{set_log_hook, LogLevel};
/// set_log_hook(Some(Box::new(|level, message| eprintln!("rdmamig {level:?}: {message}"))), LogLevel::Info).unwrap();
/// # set_log_hook(None, LogLevel::Info).unwrap();
/// ```
pub fn set_log_hook(hook: Option<LogHook>, max_level: Level) -> Result<()> {
    if IN_HOOK.with(Cell::get) {
        return Err(Error::new(ErrorKind::State, "the log hook cannot be replaced from inside the log hook"));
    }
    // The write lock waits for every record being delivered to the old hook.
    let mut slot = HOOK.write();
    MAX_LEVEL.store(if hook.is_some() { max_level as u8 } else { 0 }, Ordering::Relaxed);
    let old = std::mem::replace(&mut *slot, hook);
    // Dropped after the lock: what the old hook owns may log as it goes.
    drop(slot);
    drop(old);
    Ok(())
}

/// Whether a record of `level` would reach a hook now.
pub(crate) fn enabled(level: Level) -> bool {
    level as u8 <= MAX_LEVEL.load(Ordering::Relaxed)
}

/// Hands a record to the hook, if one takes `level`. `message` is only
/// formatted then.
pub(crate) fn log(level: Level, message: fmt::Arguments<'_>) {
    if !enabled(level) || IN_HOOK.with(Cell::get) {
        return;
    }
    // Recursive: a hook running on this thread never holds the lock here
    // (IN_HOOK), but a writer waiting must not block other readers' records
    // mid-delivery either way.
    let slot = HOOK.read_recursive();
    // Checked again under the lock: the hook may have changed since.
    let (Some(hook), true) = (slot.as_ref(), enabled(level)) else { return };
    let text = message.to_string();
    IN_HOOK.with(|h| h.set(true));
    // A panicking hook must not take down the engine thread it runs on.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(level, &text)));
    IN_HOOK.with(|h| h.set(false));
}

pub(crate) fn error(message: fmt::Arguments<'_>) {
    log(Level::Error, message);
}

pub(crate) fn warn(message: fmt::Arguments<'_>) {
    log(Level::Warn, message);
}

pub(crate) fn info(message: fmt::Arguments<'_>) {
    log(Level::Info, message);
}

pub(crate) fn debug(message: fmt::Arguments<'_>) {
    log(Level::Debug, message);
}

/// Serialises the tests that install a hook: there is one per process.
#[cfg(test)]
pub(crate) static TEST_LOCK: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    type Seen = Arc<Mutex<Vec<(Level, String)>>>;

    fn collect(max: Level) -> Seen {
        let seen: Seen = Arc::default();
        let s = seen.clone();
        set_log_hook(Some(Box::new(move |l, m| s.lock().unwrap().push((l, m.to_string())))), max).unwrap();
        seen
    }

    #[test]
    fn silent_by_default_and_filtered_by_level() {
        let _serial = TEST_LOCK.lock();
        set_log_hook(None, Level::Debug).unwrap();
        assert!(!enabled(Level::Error));
        let seen = collect(Level::Warn);
        error(format_args!("e {}", 1));
        warn(format_args!("w"));
        info(format_args!("i"));
        debug(format_args!("d"));
        assert_eq!(*seen.lock().unwrap(), [(Level::Error, "e 1".to_string()), (Level::Warn, "w".to_string())]);
        set_log_hook(None, Level::Debug).unwrap();
        error(format_args!("after"));
        assert_eq!(seen.lock().unwrap().len(), 2, "no record after the hook is removed");
        assert!(!enabled(Level::Error));
    }

    #[test]
    fn what_a_replaced_hook_owns_may_log_as_it_is_dropped() {
        let _serial = TEST_LOCK.lock();
        struct LogsOnDrop;
        impl Drop for LogsOnDrop {
            fn drop(&mut self) {
                warn(format_args!("dropped"));
            }
        }
        let owned = LogsOnDrop;
        set_log_hook(
            Some(Box::new(move |_, _| {
                let _ = &owned;
            })),
            Level::Debug,
        )
        .unwrap();
        // Under the hook's lock this drop would wait for that same lock for ever.
        let seen = collect(Level::Debug);
        set_log_hook(None, Level::Debug).unwrap();
        assert_eq!(*seen.lock().unwrap(), [(Level::Warn, "dropped".to_string())]);
    }

    #[test]
    fn the_hook_cannot_replace_itself_and_its_own_records_are_dropped() {
        let _serial = TEST_LOCK.lock();
        let seen: Seen = Arc::default();
        let s = seen.clone();
        let hook: LogHook = Box::new(move |l, m| {
            let replaced = set_log_hook(None, Level::Debug);
            info(format_args!("nested"));
            s.lock().unwrap().push((l, format!("{m} {:?}", replaced.map_err(|e| e.kind))));
        });
        set_log_hook(Some(hook), Level::Debug).unwrap();
        info(format_args!("outer"));
        assert_eq!(*seen.lock().unwrap(), [(Level::Info, "outer Err(State)".to_string())]);
        set_log_hook(None, Level::Debug).unwrap();
    }

    #[test]
    fn a_panicking_hook_is_contained() {
        let _serial = TEST_LOCK.lock();
        set_log_hook(Some(Box::new(|_, _| panic!("hook panics on purpose"))), Level::Info).unwrap();
        info(format_args!("x"));
        info(format_args!("y"));
        set_log_hook(None, Level::Info).unwrap();
    }
}
