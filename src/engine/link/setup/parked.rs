//! What the accepts on one listener share.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::admit::Admit;
use super::request::Request;
use crate::engine::link::connection::Link;
use crate::engine::Config;
use crate::logging;

/// What the accepts running on one listener share: the requests one of
/// them read and left for another, the connections admitted and not taken
/// yet, and the QEMU sources whose return path is due.
#[derive(Default)]
pub(super) struct Parked {
    /// Requests left for another accept, with when they came; one nobody
    /// takes within the handshake timeout is rejected.
    requests: Vec<(Request, Instant)>,
    /// First connections whose handshake ended after the accept that began
    /// it had returned: the next accept takes them (as a kernel's backlog).
    admitted: VecDeque<Link>,
    /// QEMU sources admitted with `Config::return_path`, and until when
    /// their next request is their return path (which no other accept takes).
    return_paths: Vec<(Option<IpAddr>, Instant)>,
}

impl Parked {
    /// Whether the accept of `admit` takes `request`: a return path from
    /// the QEMU source it serves; a first connection unless it is a QEMU
    /// source's return path that is due.
    fn admits(&self, admit: &Admit, request: &Request) -> bool {
        let (from, qemu) = (request.source_ip(), request.of_qemu());
        match *admit {
            Admit::SameSource(source) => qemu && source == from,
            Admit::Any => !qemu || !self.return_paths.iter().any(|&(ip, until)| ip == from && Instant::now() < until),
            Admit::Resume(_) => true,
        }
    }

    /// A request left earlier that `admit` takes; rejects those that waited
    /// longer than `wait`, and forgets return paths no longer due.
    pub(super) fn claim(&mut self, admit: &Admit, wait: Duration) -> Option<Request> {
        let now = Instant::now();
        self.return_paths.retain(|&(_, until)| now < until);
        let (stale, waiting) =
            std::mem::take(&mut self.requests).into_iter().partition(|(_, since)| now.duration_since(*since) >= wait);
        self.requests = waiting;
        for (request, _) in stale {
            logging::warn(format_args!("{}", request.refuse(format_args!("no accept took it")).message));
        }
        let at = self.requests.iter().position(|(request, _)| self.admits(admit, request))?;
        let (request, _) = self.requests.remove(at);
        if let Admit::SameSource(source) = *admit {
            self.took_return_path(source);
        }
        Some(request)
    }

    /// `request` if `admit` takes it, else it is left for another accept.
    pub(super) fn keep_unless_admitted(&mut self, admit: &Admit, request: Request) -> Option<Request> {
        if self.admits(admit, &request) {
            if let Admit::SameSource(source) = *admit {
                self.took_return_path(source);
            }
            return Some(request);
        }
        logging::debug(format_args!("a connection request from {} is left for another accept", request.from()));
        self.requests.push((request, Instant::now()));
        None
    }

    /// A first connection whose handshake ended after its accept returned.
    pub(super) fn push_admitted(&mut self, link: Link) {
        self.admitted.push_back(link);
    }

    /// The first connection admitted and not taken yet.
    pub(super) fn pop_admitted(&mut self) -> Option<Link> {
        self.admitted.pop_front()
    }

    /// A QEMU source admitted as a first connection (`admit`) opens its
    /// return path right away: its next request is for the accept that
    /// takes `link` (`accept_return`), no other.
    pub(super) fn expect_return_path(&mut self, config: &Config, admit: &Admit, link: &Link) {
        if config.return_path && !link.negotiated.extensions && matches!(admit, Admit::Any) {
            let source = link.peer_addr().map(|a| a.ip().to_canonical());
            self.return_paths.push((source, Instant::now() + config.timeout));
        }
    }

    /// The return path of `source` is taken (or given up): no longer due.
    fn took_return_path(&mut self, source: Option<IpAddr>) {
        if let Some(at) = self.return_paths.iter().position(|&(ip, _)| ip == source) {
            self.return_paths.remove(at);
        }
    }
}
