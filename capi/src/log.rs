//! `rdmamig_set_log_callback`: the library's log, for C (the Rust API's
//! `set_log_hook`, with a C function and its `user_data` as the hook).

use std::ffi::CString;
use std::os::raw::{c_char, c_void};

use super::last_error::{record, Failure};
use super::status::rdmamig_status;
use rdmamig::{set_log_hook, LogLevel as Level};

/// The level of a log record (`rdmamig_set_log_callback`). The values are
/// fixed; a more verbose level has a larger value.
//
// Generated from the library's one list of the levels (`Level::ALL`,
// src/logging.rs; capi/src/generated.rs): the test `generated_log_levels`
// fails while they differ.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum rdmamig_log_level {
    // BEGIN generated from rdmamig::LogLevel::ALL (make generate)
    /// A connection failed: the error that ended it, or a failed connect or accept.
    RDMAMIG_LOG_ERROR = 1,
    /// Something went wrong and was worked around, or will make a later step
    /// fail: the kernel refused to pin memory (RLIMIT_MEMLOCK), pin-all not
    /// offered for the pin budget, a connection request refused, fork
    /// safety off.
    RDMAMIG_LOG_WARN = 2,
    /// A connection's milestones: connected or accepted, what the two sides
    /// negotiated, how the migration ended.
    RDMAMIG_LOG_INFO = 3,
    /// Per-window records: each completed iteration window. Never per page.
    RDMAMIG_LOG_DEBUG = 4,
    // END generated
}

impl rdmamig_log_level {
    /// Every value, least verbose first.
    const ALL: &'static [rdmamig_log_level] = {
        use rdmamig_log_level::*;
        &[
            // BEGIN generated from rdmamig::LogLevel::ALL, the values (make generate)
            RDMAMIG_LOG_ERROR,
            RDMAMIG_LOG_WARN,
            RDMAMIG_LOG_INFO,
            RDMAMIG_LOG_DEBUG,
            // END generated
        ]
    };
}

impl From<Level> for rdmamig_log_level {
    fn from(level: Level) -> Self {
        let same = |l: &&rdmamig_log_level| **l as u32 == level as u32;
        *Self::ALL.iter().find(same).expect("every Level has its rdmamig_log_level (test generated_log_levels)")
    }
}

/// A log callback: `level` and `message` of one record, with the
/// `user_data` given to `rdmamig_set_log_callback`. `message` is UTF-8,
/// NUL-terminated, without a trailing newline, and valid only during the
/// call (copy it to keep it).
pub type rdmamig_log_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, level: rdmamig_log_level, message: *const c_char)>;

/// The C callback and its pointer, called from any thread.
struct CCallback {
    callback: unsafe extern "C" fn(*mut c_void, rdmamig_log_level, *const c_char),
    user_data: *mut c_void,
}

// SAFETY: `rdmamig_set_log_callback` requires the callback to be callable
// from any thread, concurrently, with this `user_data`: the pointer is only
// handed back to it.
unsafe impl Send for CCallback {}
// SAFETY: as for Send.
unsafe impl Sync for CCallback {}

impl CCallback {
    fn call(&self, level: Level, message: &str) {
        // An interior NUL (none of rdmamig's messages has one) would cut
        // the text: it becomes a space instead.
        let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the caller of `rdmamig_set_log_callback` gave a function of
        // this signature that stays valid while installed; `text` outlives the call.
        unsafe { (self.callback)(self.user_data, level.into(), text.as_ptr()) }
    }
}

/// Installs `callback` as the process's log callback, called with
/// `user_data` for each record up to `max_level` (an `rdmamig_log_level`:
/// `RDMAMIG_LOG_INFO` gives errors, warnings and information, not debug
/// records). A NULL `callback` removes it (`user_data` and `max_level` are
/// then ignored). Without a callback, the default, the library is silent:
/// it never writes to stderr or stdout itself (only a panic's message is
/// printed, by Rust's panic hook, see `rdmamig_selftest_panic_boundary`).
///
/// There is one callback per process, shared by every connection; a later
/// call replaces it (as does the Rust API's `set_log_hook`). Records are
/// few and never per page: connect and accept with the negotiated
/// capabilities, each completed iteration window (debug), how a migration
/// ended, a failed connect or accept, the error that ended a connection,
/// pinning the kernel refused.
///
/// Threads: the callback runs on the thread that produced the record: the
/// caller's (inside `rdmamig_connect`, `rdmamig_listener_accept`,
/// `rdmamig_conn_iteration_end`, `rdmamig_conn_close`, ...) or one of the
/// library's own (a connection's transfer or service thread, the pin-all
/// registration thread). It may so be called
/// from several threads at once and must be thread-safe; it runs on the
/// data path, so it should be quick (queue the record, do not block).
/// Records produced by rdmamig calls made inside the callback are dropped,
/// and the callback cannot replace itself (`RDMAMIG_ERR_STATE`). When this
/// function returns, the callback it replaced is neither running nor called
/// again: its `user_data` may be freed.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_INVALID_ARGUMENT` for an unknown
/// `max_level` (nothing changes); `RDMAMIG_ERR_STATE` from inside the
/// callback.
///
/// Thread-safe: may be called from any thread at any time.
#[no_mangle]
pub extern "C" fn rdmamig_set_log_callback(
    callback: rdmamig_log_callback,
    user_data: *mut c_void,
    max_level: u32,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_set_log_callback";
        record(|| {
            let Some(callback) = callback else {
                return Ok(set_log_hook(None, Level::Error)?);
            };
            let Some(max) = Level::ALL.into_iter().find(|l| *l as u32 == max_level) else {
                return Err(Failure::invalid(format!("{F}: unknown max_level {max_level}")));
            };
            let c = CCallback { callback, user_data };
            Ok(set_log_hook(Some(Box::new(move |level, message| c.call(level, message))), max)?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated::{check_or_rewrite, doc_comment};
    use rdmamig::test_support;
    use std::ffi::CStr;
    use std::ptr::null_mut;
    use std::sync::Mutex;

    unsafe extern "C" fn collect(user_data: *mut c_void, level: rdmamig_log_level, message: *const c_char) {
        // SAFETY: the test passes its `seen` as `user_data`; the library a
        // NUL-terminated message.
        let (seen, message) =
            unsafe { (&*(user_data as *const Mutex<Vec<(rdmamig_log_level, String)>>), CStr::from_ptr(message)) };
        seen.lock().unwrap().push((level, message.to_str().unwrap().to_string()));
    }

    /// The enum and `ALL` between the markers are `Level::ALL`, each level
    /// with its doc and value; `RDMAMIG_REGENERATE=1` rewrites them (`make generate`).
    #[test]
    fn generated_log_levels() {
        let name = |l: Level| format!("RDMAMIG_LOG_{}", l.name().to_uppercase());
        let variants: String = Level::ALL
            .iter()
            .map(|&l| format!("{}    {} = {},\n", doc_comment("    ", l.doc()), name(l), l as u32))
            .collect();
        check_or_rewrite("log.rs", "rdmamig::LogLevel::ALL", &variants);
        let all: String = Level::ALL.iter().map(|&l| format!("            {},\n", name(l))).collect();
        check_or_rewrite("log.rs", "rdmamig::LogLevel::ALL, the values", &all);
    }

    #[test]
    fn every_level_has_its_c_value() {
        for level in Level::ALL {
            assert_eq!(rdmamig_log_level::from(level) as u32, level as u32, "{level:?}");
        }
    }

    #[test]
    fn the_callback_gets_records_up_to_its_level_until_removed() {
        let seen: Box<Mutex<Vec<(rdmamig_log_level, String)>>> = Box::default();
        let data = &*seen as *const Mutex<_> as *mut c_void;
        assert_eq!(rdmamig_set_log_callback(Some(collect), data, 0), rdmamig_status::RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_set_log_callback(Some(collect), data, 5), rdmamig_status::RDMAMIG_ERR_INVALID_ARGUMENT);
        test_support::log(Level::Error, format_args!("nobody listens"));
        assert_eq!(rdmamig_set_log_callback(Some(collect), data, 3), rdmamig_status::RDMAMIG_OK);
        test_support::log(Level::Info, format_args!("connected to {}", "x"));
        test_support::log(Level::Debug, format_args!("filtered"));
        test_support::log(Level::Warn, format_args!("a\0b"));
        assert_eq!(rdmamig_set_log_callback(None, null_mut(), 99), rdmamig_status::RDMAMIG_OK);
        test_support::log(Level::Error, format_args!("after removal"));
        assert_eq!(
            *seen.lock().unwrap(),
            [
                (rdmamig_log_level::RDMAMIG_LOG_INFO, "connected to x".to_string()),
                (rdmamig_log_level::RDMAMIG_LOG_WARN, "a b".to_string())
            ]
        );
    }
}
