//! Peer authentication and the listener's allow-list, between real rdmamig
//! peers: keyed peers migrate; a source without the key, with another key,
//! or from an address not allowed is refused before the destination
//! registers or writes any guest memory (the destination's accept keeps
//! waiting, then says what it refused); the key needs the extensions. A
//! crafted source (`hostile::Peer`) shows that the destination admits the
//! proof as documented and refuses a replayed handshake, a wrong or
//! reflected proof, and a first message other than AUTH, before any memory
//! in or around its guest RAM is touched.

use std::thread;
use std::time::Duration;

use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use rdmamig::verbs::CmEventKind;
use rdmamig::wire::{
    self, AcceptData, AuthChallenge, AuthProof, Capabilities, CommandType, ConnectData, MessageWriter,
    CAP_RDMAMIG_AUTH, CAP_RDMAMIG_EXT, PROTOCOL_VERSION,
};
use rdmamig::{AuthKey, Config, Destination, ErrorKind, Source};
use sha2::{Digest, Sha256};

use crate::hostile::{GuardedRam, Peer};
use crate::migration::{connect, listen, live_mrs, migrate, one_block, rdma_ip, read_stream, GuestRam};

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

// ---- A crafted source (`hostile::Peer`) against a keyed destination ----

const KEY: &[u8] = b"hostile suite: pre-shared key 32";
/// The keyed destination's accept gives up this long after a refusal.
const CRAFTED_ACCEPT_WAIT: Duration = Duration::from_secs(3);
const OFFERED: u32 = CAP_RDMAMIG_EXT | CAP_RDMAMIG_AUTH;

/// The handshake's transcript as docs/security.md describes it, computed here
/// independently of the library: the version, the offered and granted
/// flags, both nonces, the announced pin budget, no recovery tag, and the
/// endpoints (the source's IPv4 address, the destination's and its port).
fn transcript(h: &Handshake, source_nonce: &[u8; 32]) -> Vec<u8> {
    let ip: std::net::Ipv4Addr = rdma_ip().parse().unwrap();
    [
        &PROTOCOL_VERSION.to_be_bytes()[..],
        &OFFERED.to_be_bytes(),
        &h.granted.to_be_bytes(),
        source_nonce,
        &h.challenge.nonce,
        &h.pin_budget.to_be_bytes(),
        &[0],
        &[4],
        &ip.octets(),
        &[4],
        &ip.octets(),
        &h.port.to_be_bytes(),
    ]
    .concat()
}

/// The source's proof: HMAC-SHA-256 under the key of the role label and the transcript.
fn source_proof(key: &[u8], transcript: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(b"rdmamig auth v2: source\0");
    mac.update(transcript);
    mac.finalize().into_bytes().into()
}

/// The session's control keys, source to destination and back: HKDF-SHA-256
/// with both nonces as salt, the key as input, and each direction's label
/// and the transcript's SHA-256 as info.
fn session_keys(key: &[u8], transcript: &[u8], h: &Handshake, source_nonce: &[u8; 32]) -> [[u8; 32]; 2] {
    let salt = [&source_nonce[..], &h.challenge.nonce].concat();
    let kdf = Hkdf::<Sha256>::new(Some(&salt), key);
    let digest = Sha256::digest(transcript);
    [&b"rdmamig v2: control, source to destination\0"[..], b"rdmamig v2: control, destination to source\0"].map(
        |label| {
            let mut out = [0u8; 32];
            kdf.expand_multi_info(&[label, &digest], &mut out).unwrap();
            out
        },
    )
}

/// A control message's tag: HMAC-SHA-256 under the direction's key of the
/// message's number in that direction (big-endian u64) and its bytes, the
/// first 16 bytes.
fn control_tag(key: &[u8; 32], number: u64, message: &[u8]) -> [u8; 16] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(&number.to_be_bytes());
    mac.update(message);
    mac.finalize().into_bytes()[..16].try_into().unwrap()
}

/// A crafted source connected to a keyed destination, whose accept (in its
/// thread) returns only once the source proved the key or was refused.
struct Handshake {
    accept: thread::JoinHandle<rdmamig::Result<Destination>>,
    peer: Peer,
    /// The destination's challenge and the flags it granted.
    challenge: AuthChallenge,
    granted: u32,
    pin_budget: u64,
    port: u16,
    ram: GuardedRam,
}

fn handshake(source_nonce: [u8; 32]) -> Handshake {
    let ram = GuardedRam::new();
    let registry = ram.registry();
    let (listener, port) = listen(&Config { pin_all: true, ..keyed(KEY) });
    let accept = thread::spawn(move || Destination::accept(&listener, &registry, Some(CRAFTED_ACCEPT_WAIT)));
    let hello = ConnectData { caps: Capabilities::v1(OFFERED), nonce: Some(source_nonce), recovery_tag: None };
    let peer = Peer::connect(port, &hello.encode()).expect("the keyed destination accepts the connection");
    let accepted = AcceptData::decode(&peer.accepted).expect("accept private data");
    let challenge = accepted.auth.expect("the destination's challenge");
    let pin_budget = accepted.pin_budget.unwrap_or(0);
    Handshake { accept, peer, challenge, granted: accepted.caps.flags, pin_budget, port, ram }
}

impl Handshake {
    /// Sends AUTH with `tag` on the destination's first READY.
    fn send_proof(&mut self, tag: [u8; 32]) {
        self.peer.take_ready();
        self.peer.send_with(CommandType::Auth, 0, |w| w.push(&AuthProof { tag }).unwrap());
    }

    /// The destination refused the source: the peer got ERROR and the
    /// disconnect, its accept ends with an Auth error holding `words`, and
    /// nothing in or around its RAM changed.
    fn refused(mut self, words: &[&str]) {
        let got = self.peer.recv_any(Duration::from_secs(5));
        assert!(matches!(&got, Some(Ok(m)) if m.kind == CommandType::Error), "the peer got {got:?}, not ERROR");
        assert!(self.peer.disconnected(Duration::from_secs(5)), "no DISCONNECTED after the ERROR");
        let e = self.accept.join().unwrap().map(|_| ()).expect_err("the destination admitted the source");
        eprintln!("destination: {e}");
        assert_eq!(e.kind, ErrorKind::Auth, "{e}");
        for w in words {
            assert!(e.message.contains(w), "{w:?} not in: {e}");
        }
        self.ram.check_untouched();
    }
}

#[test]
fn crafted_source_with_the_key_is_admitted() {
    let nonce = [0x5A; 32];
    let mut h = handshake(nonce);
    let tag = source_proof(KEY, &transcript(&h, &nonce));
    h.send_proof(tag);
    let dest = h.accept.join().unwrap().expect("a source that proved the key is admitted");
    assert!(dest.negotiated().authenticated);
    dest.close();
    h.ram.check_untouched();
}

#[test]
fn replayed_handshake_is_refused_before_any_memory_is_registered() {
    // A good handshake, recorded: the source's nonce and its proof.
    let nonce = [0x5A; 32];
    let mut first = handshake(nonce);
    let recorded = source_proof(KEY, &transcript(&first, &nonce));
    first.send_proof(recorded);
    first.accept.join().unwrap().expect("the recorded handshake was good").close();
    // Played again: the destination's nonce is new, so the proof is wrong.
    let mut replay = handshake(nonce);
    assert_ne!(replay.challenge.nonce, first.challenge.nonce, "the destination's nonce must be fresh");
    replay.send_proof(recorded);
    replay.refused(&["failed to prove the pre-shared key"]);
}

#[test]
fn wrong_proof_is_refused() {
    let mut h = handshake([1; 32]);
    h.send_proof([0; 32]);
    h.refused(&["failed to prove the pre-shared key"]);
}

#[test]
fn destination_proof_reflected_as_the_source_proof_is_refused() {
    let mut h = handshake([2; 32]);
    let reflected = h.challenge.proof;
    h.send_proof(reflected);
    h.refused(&["failed to prove the pre-shared key"]);
}

#[test]
fn first_message_other_than_auth_is_refused() {
    let mut h = handshake([3; 32]);
    h.peer.take_ready();
    h.peer.send_with(CommandType::RamBlocksRequest, 1, |_| {});
    h.refused(&["did not authenticate", "expected AUTH"]);
}

/// After the handshake every control message carries its tag, as
/// docs/security.md describes it: the destination's next READY and its answer to a
/// tagged RAM_BLOCKS_REQUEST carry theirs (numbers 0 and 1 from the
/// destination), and the same request played again (its number is past) is
/// refused with an authentication error, before anything in the RAM moved.
#[test]
fn control_messages_after_the_handshake_are_tagged() {
    let nonce = [0x6B; 32];
    let mut h = handshake(nonce);
    let t = transcript(&h, &nonce);
    h.send_proof(source_proof(KEY, &t));
    let [to_destination, to_source] = session_keys(KEY, &t, &h, &nonce);
    let dest = h.accept.join().unwrap().expect("a source that proved the key is admitted");
    let tagged = |key: &[u8; 32], number: u64, message: &[u8]| [message, &control_tag(key, number, message)].concat();

    let ready = h.peer.recv_bytes(Duration::from_secs(10)).expect("READY").expect("READY");
    assert_eq!(ready, tagged(&to_source, 0, &ready[..16]), "READY and its tag");
    let mut buf = [0u8; 64];
    let len = MessageWriter::new(&mut buf, CommandType::RamBlocksRequest).finish();
    let request = tagged(&to_destination, 0, &buf[..len]);
    h.peer.send_raw(1, &request);
    let result = h.peer.recv_bytes(Duration::from_secs(10)).expect("RAM_BLOCKS_RESULT").expect("RAM_BLOCKS_RESULT");
    let (message, _) = result.split_at(result.len() - 16);
    assert_eq!(wire::decode_message(message).map(|m| m.kind), Ok(CommandType::RamBlocksResult));
    assert_eq!(result, tagged(&to_source, 1, message), "RAM_BLOCKS_RESULT and its tag");

    let ready = h.peer.recv_bytes(Duration::from_secs(10)).expect("READY").expect("READY");
    assert_eq!(ready, tagged(&to_source, 2, &ready[..16]));
    h.peer.send_raw(1, &request);
    let e = dest.wait_end(Some(Duration::from_secs(10))).map(|_| ()).expect_err("a replayed message was taken");
    eprintln!("destination: {e}");
    assert_eq!(e.kind, ErrorKind::Auth, "{e}");
    assert!(e.message.contains("authentication tag"), "{e}");
    dest.close();
    h.ram.check_untouched();
}

// ---- A pending keyed accept and the requests that must not end it ----

/// A destination listening with `config` over `ram`, accepting one source
/// in a thread (up to a minute) and waiting for its migration's end.
fn accept_one(config: &Config, ram: &GuestRam) -> (u16, thread::JoinHandle<rdmamig::Result<rdmamig::Ending>>) {
    let (listener, port) = listen(config);
    let registry = one_block(ram, RAM);
    let accept = thread::spawn(move || {
        let dest = Destination::accept(&listener, &registry, Some(Duration::from_secs(60)))?;
        let ending = dest.wait_end(Some(Duration::from_secs(60)));
        dest.close();
        ending
    });
    (port, accept)
}

/// A keyed destination's accept is pending. A request with version 2, a
/// connection that never sends its proof, and a source with another key
/// each come first; the accept goes on listening through all three (the
/// silent one's handshake still running when the real source connects),
/// and the real source then migrates byte-identical.
#[test]
fn pending_keyed_accept_outlasts_bad_requests_and_admits_the_real_source() {
    let config = Config { handshake_timeout: Duration::from_secs(3), ..keyed(KEY) };
    let src_ram = GuestRam::new(RAM, 0);
    for page in 0..RAM / 4096 {
        src_ram.write_u64(page * 4096, page.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
    let dst_ram = GuestRam::new(RAM, FILL);
    let (port, accept) = accept_one(&config, &dst_ram);

    let refusal = Peer::connect(port, &Capabilities { version: 2, flags: OFFERED }.encode()).map(|_| ());
    let refusal = refusal.expect_err("a version-2 request was accepted");
    eprintln!("version 2: {refusal:?}");
    let hello = ConnectData { caps: Capabilities::v1(OFFERED), nonce: Some([9; 32]), recovery_tag: None };
    let _silent = Peer::connect(port, &hello.encode()).expect("the silent peer's connection is accepted");
    let silent_since = std::time::Instant::now();
    eprintln!("a silent peer is connected; its handshake waits for its proof");
    let other_key =
        Source::connect(&rdma_ip(), port, &keyed(b"another key, not the destination's"), &one_block(&src_ram, RAM));
    let other_key = other_key.map(|_| ()).expect_err("a source with another key was admitted");
    eprintln!("another key: {other_key}");
    assert_eq!(other_key.kind, ErrorKind::Auth, "{other_key}");

    let started = std::time::Instant::now();
    let source = Source::connect(&rdma_ip(), port, &config, &one_block(&src_ram, RAM)).expect("the real source");
    assert!(started.elapsed() < Duration::from_secs(2), "the real source waited {:?}", started.elapsed());
    // The silent peer's handshake was still running: the two ran side by side.
    assert!(silent_since.elapsed() < config.handshake_timeout, "the silent peer's handshake was over already");
    assert!(source.negotiated().authenticated);
    source.iteration_begin().unwrap();
    source.save(0, 0, RAM).unwrap();
    source.iteration_end().unwrap();
    assert_eq!(source.close().unwrap(), rdmamig::Ending::Completed);
    let ending = accept.join().unwrap().expect("the destination's accept and migration");
    assert_eq!(ending, rdmamig::Ending::Completed);
    assert!(src_ram.bytes() == dst_ram.bytes(), "the destination's RAM differs from the source's");
}

// ---- Two accepts on one listener, a QEMU source's return path among the requests ----

/// Two accepts wait on one listener with `return_path` on. A QEMU source
/// (a crafted peer connecting as QEMU does: its migration, then its return
/// path from the same address) and an rdmamig source connect, the rdmamig
/// source in between. Each request reaches the accept it belongs to,
/// whichever accept happened to read it: one accept returns the QEMU
/// source with its return path, the other the rdmamig source; nobody is
/// refused. Three rounds, since which accept reads which request varies.
#[test]
fn concurrent_accepts_match_return_paths_to_their_migration() {
    let config = Config { return_path: true, ..Config::default() };
    for round in 0..3 {
        let (listener, port) = listen(&config);
        let (a, b) = (GuestRam::new(RAM, FILL), GuestRam::new(RAM, FILL));
        let src_ram = GuestRam::new(RAM, 0x11);
        thread::scope(|scope| {
            let accepts: Vec<_> = [&a, &b]
                .map(|ram| {
                    let (listener, registry) = (&listener, one_block(ram, RAM));
                    scope.spawn(move || Destination::accept(listener, &registry, Some(Duration::from_secs(20))))
                })
                .into();
            let qemu = Capabilities::v1(0).encode();
            let forward = Peer::connect(port, &qemu).expect("the QEMU source's connection");
            let source = Source::connect(&rdma_ip(), port, &Config::default(), &one_block(&src_ram, RAM))
                .expect("the rdmamig source's connection");
            let return_path = Peer::connect(port, &qemu).expect("the QEMU source's return path");
            let mut got: Vec<_> = accepts.into_iter().map(|a| a.join().unwrap().expect("an accept")).collect();
            got.sort_by_key(|d| d.negotiated().extensions);
            assert!(!got[0].negotiated().extensions && got[0].has_return_path(), "round {round}: the QEMU source");
            assert!(got[1].negotiated().extensions && !got[1].has_return_path(), "round {round}: the rdmamig source");
            drop((forward, return_path));
            source.abort();
            got.into_iter().for_each(|d| d.close());
        });
    }
}

/// A keyed accept runs at most 8 handshakes at once: with 8 silent peers
/// connected, a ninth request is rejected at once; the real source, trying
/// again, is admitted once their handshakes timed out, and migrates.
#[test]
fn handshakes_in_progress_are_capped() {
    let config = Config { handshake_timeout: Duration::from_secs(3), ..keyed(KEY) };
    let src_ram = GuestRam::new(RAM, 0x5A);
    let dst_ram = GuestRam::new(RAM, FILL);
    let (port, accept) = accept_one(&config, &dst_ram);
    let hello = ConnectData { caps: Capabilities::v1(OFFERED), nonce: Some([7; 32]), recovery_tag: None };
    let silent: Vec<Peer> = (0..8)
        .map(|i| Peer::connect(port, &hello.encode()).unwrap_or_else(|r| panic!("silent peer {i}: {r:?}")))
        .collect();
    let ninth = Peer::connect(port, &hello.encode()).map(|_| ()).expect_err("a ninth handshake was accepted");
    eprintln!("the ninth request: {:?} after {:?}", ninth.kind, ninth.took);
    assert_eq!(ninth.kind, CmEventKind::Rejected);
    let ninth_at = std::time::Instant::now();
    // Once the silent peers' handshakes timed out, the real source gets in.
    let source = loop {
        match Source::connect(&rdma_ip(), port, &config, &one_block(&src_ram, RAM)) {
            Ok(source) => break source,
            Err(e) if ninth_at.elapsed() < config.handshake_timeout * 3 => {
                eprintln!("the real source, {:?} after the ninth: {e}", ninth_at.elapsed());
                thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("the real source was not admitted: {e}"),
        }
    };
    assert!(ninth_at.elapsed() >= config.handshake_timeout / 2, "admitted while 8 handshakes ran");
    source.iteration_begin().unwrap();
    source.save(0, 0, RAM).unwrap();
    source.iteration_end().unwrap();
    assert_eq!(source.close().unwrap(), rdmamig::Ending::Completed);
    assert_eq!(accept.join().unwrap().expect("the destination's migration"), rdmamig::Ending::Completed);
    assert!(src_ram.bytes() == dst_ram.bytes(), "the destination's RAM differs from the source's");
    drop(silent);
}

/// Keyed peers carry a device state larger than one control message
/// (2 MiB and a bit: whole messages, each with its tag) byte-identical.
#[test]
fn keyed_peers_carry_a_stream_of_many_full_messages() {
    let config = keyed(KEY);
    let src_ram = GuestRam::new(RAM, 0x11);
    let dst_ram = GuestRam::new(RAM, FILL);
    let (source, dest) = connect(&one_block(&src_ram, RAM), &config, one_block(&dst_ram, RAM), &config);
    assert!(source.negotiated().authenticated);
    let stream: Vec<u8> = (0..(2 << 20) + 4321u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    source.put(&stream).unwrap();
    source.flush().unwrap();
    assert!(read_stream(&dest, stream.len()) == stream, "the stream differs");
    assert_eq!(source.close().unwrap(), rdmamig::Ending::Completed);
    assert_eq!(dest.wait_end(Some(Duration::from_secs(30))).unwrap(), rdmamig::Ending::Completed);
    dest.close();
}
