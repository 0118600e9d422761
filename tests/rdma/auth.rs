//! Peer authentication and the listener's allow-list, between real rdmamig
//! peers: keyed peers migrate; a source without the key, with another key,
//! or from an address not allowed is refused before the destination
//! registers or writes any guest memory (the destination's accept keeps
//! waiting, then says what it refused); the key needs the extensions.
//! The replay of a recorded handshake is in `hostile::` (it needs a crafted peer).

use std::thread;
use std::time::Duration;

use rdmamig::{AuthKey, Config, Destination, ErrorKind, Source};

use crate::migration::{listen, live_mrs, migrate, one_block, rdma_ip, GuestRam};

const RAM: u64 = 8 << 20;
const FILL: u8 = 0xA5;
/// How long the destination's accept waits: past the source's refusal.
const ACCEPT_WAIT: Duration = Duration::from_secs(4);

fn keyed(key: &[u8]) -> Config {
    Config { auth_key: Some(AuthKey::new(key).unwrap()), ..Config::default() }
}

/// A destination that allows pin-all (so pinning would start at once after
/// admission) tries to accept one source made with `source_config`. Returns
/// what the source's connect said and how the destination failed (its
/// accept, or the connection it admitted), after checking that the
/// destination's RAM is untouched and no memory region was left registered.
fn refused(dest_config: Config, source_config: Config) -> (rdmamig::Error, rdmamig::Error) {
    let dest_config = Config { pin_all: true, ..dest_config };
    let dst_ram = GuestRam::new(RAM, FILL);
    let src_ram = GuestRam::new(RAM, 0x11);
    let mrs_before = live_mrs();
    let (listener, port) = listen(&dest_config);
    let registry = one_block(&dst_ram, RAM);
    let accept = thread::spawn(move || {
        let dest = Destination::accept(&listener, &registry, Some(ACCEPT_WAIT))?;
        dest.wait_end(Some(ACCEPT_WAIT)).map(|_| ())
    });
    let source = Source::connect(&rdma_ip(), port, &source_config, &one_block(&src_ram, RAM)).map(|_| ());
    let dest = accept.join().unwrap();
    eprintln!("source: {source:?}\ndestination: {dest:?}");
    assert!(dst_ram.bytes().iter().all(|&b| b == FILL), "the destination's RAM was written");
    assert_eq!(live_mrs(), mrs_before, "memory regions left registered");
    (source.expect_err("the source must fail"), dest.expect_err("the destination must not migrate"))
}

#[test]
fn keyed_peers_migrate_and_report_the_authentication() {
    let key = b"0123456789abcdef0123456789abcdef";
    for pin_all in [false, true] {
        migrate(Config { pin_all, ..keyed(key) }, Config { pin_all, ..keyed(key) }, pin_all);
    }
}

#[test]
fn source_without_a_key_is_refused_before_any_memory_is_registered() {
    let (source, dest) = refused(keyed(b"the destination's key"), Config::default());
    assert_eq!(source.kind, ErrorKind::Auth, "{source}");
    assert!(source.message.contains("requires peer authentication"), "{source}");
    assert_eq!(dest.kind, ErrorKind::Auth, "{dest}");
    assert!(dest.message.contains("does not authenticate") && dest.message.contains("1 refused"), "{dest}");
}

#[test]
fn source_with_another_key_is_refused_before_any_memory_is_registered() {
    let (source, dest) = refused(keyed(b"the destination's key"), keyed(b"the source's other key"));
    // The source checks the destination's proof first: it cannot match.
    assert_eq!(source.kind, ErrorKind::Auth, "{source}");
    assert!(source.message.contains("failed to prove the pre-shared key"), "{source}");
    assert_eq!(dest.kind, ErrorKind::Auth, "{dest}");
    assert!(dest.message.contains("did not authenticate"), "{dest}");
}

#[test]
fn keyed_source_refuses_a_destination_without_a_key() {
    let (source, dest) = refused(Config::default(), keyed(b"the source's own key"));
    assert_eq!(source.kind, ErrorKind::Auth, "{source}");
    assert!(source.message.contains("does not authenticate"), "{source}");
    // The destination admitted the connection; the source left before any message.
    assert_eq!(dest.kind, ErrorKind::Disconnected, "{dest}");
}

#[test]
fn source_from_an_address_off_the_allow_list_is_refused() {
    let elsewhere = Config { allowed_sources: vec!["198.18.0.128/25".parse().unwrap()], ..Config::default() };
    let (source, dest) = refused(elsewhere, Config::default());
    assert_eq!(source.kind, ErrorKind::Connect, "{source}");
    assert_eq!(dest.kind, ErrorKind::Auth, "{dest}");
    assert!(dest.message.contains("not on the allow-list") && dest.message.contains(&rdma_ip()), "{dest}");
    // The source's own address (or its subnet) admits it.
    let here = Config { allowed_sources: vec![format!("{}/24", rdma_ip()).parse().unwrap()], ..Config::default() };
    migrate(Config::default(), here, false);
}

#[test]
fn a_key_needs_the_extensions() {
    let config = Config { extensions: false, ..keyed(b"0123456789abcdef") };
    let e = rdmamig::Listener::bind(&rdma_ip(), 0, &config).map(|_| ()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    let ram = GuestRam::new(RAM, 0);
    let e = Source::connect(&rdma_ip(), 1, &config, &one_block(&ram, RAM)).map(|_| ()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
}
