//! What the two sides of a connection agreed on.

use crate::engine::pin;
use crate::engine::Config;
use crate::logging;
use crate::wire::{CAP_PIN_ALL, CAP_RDMAMIG_AUTH, CAP_RDMAMIG_EXT, CAP_RDMAMIG_RECOVERY};

/// What the two sides agreed on in the connection private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub pin_all: bool,
    /// Both sides speak rdmamig's extensions (the peer is not QEMU).
    pub extensions: bool,
    /// Each side proved the pre-shared key to the other (`Config::auth_key`).
    pub authenticated: bool,
    /// Both sides have post-copy recovery on (`Config::postcopy_recovery`).
    pub postcopy_recovery: bool,
}

/// For the log: "pin-all on, rdmamig extensions on, authenticated".
impl std::fmt::Display for Negotiated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = |b: bool| if b { "on" } else { "off" };
        write!(f, "pin-all {}, rdmamig extensions {}", on(self.pin_all), on(self.extensions))?;
        if !self.extensions {
            f.write_str(" (a QEMU peer)")?;
        }
        f.write_str(if self.authenticated { ", authenticated" } else { ", not authenticated" })?;
        if self.postcopy_recovery {
            f.write_str(", post-copy recovery on")?;
        }
        Ok(())
    }
}

impl Negotiated {
    /// What `config` offers (source) or allows (destination): pin-all only
    /// if the pin budget holds all `ram_bytes` of guest RAM (else this side
    /// registers dynamically, as QEMU does when its peer refuses pin-all).
    pub(super) fn offered(config: &Config, ram_bytes: u64) -> Self {
        let budget = pin::budget_for(config);
        let fits = budget.is_none_or(|b| ram_bytes <= b);
        if config.pin_all && !fits {
            logging::warn(format_args!(
                "pin-all not offered: {ram_bytes} bytes of RAM do not fit the pin budget of {} bytes \
                 (registering dynamically)",
                budget.unwrap_or(u64::MAX)
            ));
        }
        let authenticated = config.auth_key.is_some() && config.extensions;
        let postcopy_recovery = config.postcopy_recovery.is_some() && config.extensions;
        Negotiated { pin_all: config.pin_all && fits, extensions: config.extensions, authenticated, postcopy_recovery }
    }

    /// Keeps what both this and the peer's capability flags have.
    pub(super) fn masked(self, flags: u32) -> Self {
        let extensions = self.extensions && flags & CAP_RDMAMIG_EXT != 0;
        Negotiated {
            pin_all: self.pin_all && flags & CAP_PIN_ALL != 0,
            extensions,
            authenticated: self.authenticated && extensions && flags & CAP_RDMAMIG_AUTH != 0,
            postcopy_recovery: self.postcopy_recovery && extensions && flags & CAP_RDMAMIG_RECOVERY != 0,
        }
    }

    pub(super) fn flags(self) -> u32 {
        let bit = |on: bool, flag: u32| if on { flag } else { 0 };
        bit(self.pin_all, CAP_PIN_ALL)
            | bit(self.extensions, CAP_RDMAMIG_EXT)
            | bit(self.authenticated, CAP_RDMAMIG_AUTH)
            | bit(self.postcopy_recovery, CAP_RDMAMIG_RECOVERY)
    }
}
