//! The planner's errors.

/// The planner's one error: a topology, migration or plan it refuses.
pub(super) fn invalid(message: String) -> crate::Error {
    crate::Error::new(crate::ErrorKind::InvalidArgument, message)
}
