//! Source and destination state machines, control channel, RAM chunks.
