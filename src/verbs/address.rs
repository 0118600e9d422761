//! Socket addresses: resolving host names, and converting to and from the
//! C `sockaddr_storage` rdma_cm's calls take and give.

use std::net::{SocketAddr, ToSocketAddrs};

/// Resolve a host name or IPv4/IPv6 literal (brackets allowed) and a port
/// to socket addresses, in resolver order, waiting at most `timeout`
/// (`TimedOut` after it). A literal is parsed at once; a name is looked up
/// by the system resolver on a helper thread, which cannot be interrupted and
/// is left to finish on its own when the wait gives up.
pub fn resolve(host: &str, port: u16, timeout: std::time::Duration) -> std::io::Result<Vec<SocketAddr>> {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_owned();
    std::thread::Builder::new().name("rdmamig-resolve".into()).spawn(move || {
        let _ = tx.send((name.as_str(), port).to_socket_addrs().map(|a| a.collect()));
    })?;
    rx.recv_timeout(timeout).unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer from the resolver within {timeout:?}"),
        ))
    })
}

/// A `SocketAddr` as a C `sockaddr_storage` (what rdma_cm's calls take).
pub(crate) fn to_sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above.
            let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            sin6.sin6_scope_id = a.scope_id();
        }
    }
    storage
}

/// A C `sockaddr_storage` as a `SocketAddr`, if it holds IPv4 or IPv6.
pub(crate) fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::from((ip, u16::from_be(sin6.sin6_port))))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

    #[test]
    fn sockaddr_v4() {
        let a = SocketAddr::from((Ipv4Addr::new(198, 18, 0, 1), 4444));
        let s = to_sockaddr(&a);
        // SAFETY: `to_sockaddr` wrote a sockaddr_in for an IPv4 address.
        let sin = unsafe { &*(&s as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_family, libc::AF_INET as libc::sa_family_t);
        assert_eq!(u16::from_be(sin.sin_port), 4444);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [198, 18, 0, 1]);
    }

    #[test]
    fn sockaddr_v6() {
        let a = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 7, 0, 3));
        let s = to_sockaddr(&a);
        // SAFETY: `to_sockaddr` wrote a sockaddr_in6 for an IPv6 address.
        let sin6 = unsafe { &*(&s as *const _ as *const libc::sockaddr_in6) };
        assert_eq!(sin6.sin6_family, libc::AF_INET6 as libc::sa_family_t);
        assert_eq!(u16::from_be(sin6.sin6_port), 7);
        assert_eq!(sin6.sin6_addr.s6_addr, Ipv6Addr::LOCALHOST.octets());
        assert_eq!(sin6.sin6_scope_id, 3);
    }

    #[test]
    fn resolve_literals() {
        let t = std::time::Duration::from_secs(5);
        // Literals need no resolver: they resolve even with no time at all.
        let zero = std::time::Duration::ZERO;
        assert_eq!(resolve("198.18.0.1", 5, zero).unwrap(), vec![SocketAddr::from(([198, 18, 0, 1], 5))]);
        assert_eq!(resolve("::1", 6, zero).unwrap(), vec![SocketAddr::from((Ipv6Addr::LOCALHOST, 6))]);
        assert_eq!(resolve("[::1]", 6, zero).unwrap(), vec![SocketAddr::from((Ipv6Addr::LOCALHOST, 6))]);
        assert!(!resolve("localhost", 7, t).unwrap().is_empty());
        assert!(resolve("no-such-host.invalid", 7, t).is_err());
    }
}
