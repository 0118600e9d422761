//! Source and destination state machines, control channel, RAM chunks.

pub mod config;

pub use config::Config;
