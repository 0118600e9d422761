//! A host in the middle: a relay that a keyed source connects to (as if a
//! spoofed name or a mis-pointed orchestrator sent it there) and that
//! connects on to the keyed destination with the source's own private
//! data, accepts the source with the destination's own accept data, and
//! then forwards every control message both ways, unchanged. It knows no
//! key. Before the proofs were bound to the connection's endpoints (0.11),
//! both sides took each other as authenticated through it and the relay
//! learnt the destination's rkeys from REGISTER_RESULT. Now both sides fail
//! with `ErrorKind::Auth`: the source on the destination's proof, before it
//! sends anything; the destination's accept refuses the relayed connection
//! (its handshake never gets the source's proof) and ends with the
//! refusal. No message carrying an rkey leaves the destination, and its RAM
//! is untouched. A relay that also rewrites the pin budget in the accept
//! data fails the same way.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::verbs::{
    CmEventKind, CmId, CompletionChannel, CompletionQueue, ConnParam, EventChannel, ProtectionDomain, QpCaps, QueuePair,
};
use rdmamig::wire::{self, AcceptData, CommandType, CONTROL_BUFFER_SIZE};
use rdmamig::{AuthKey, Config, Destination, ErrorKind, Source};

use crate::hostile::{next_event, next_wc, ControlBuffer, WRID_RECV, WRID_SEND};
use crate::migration::{listen, one_block, rdma_ip, GuestRam};

const RAM: u64 = 8 << 20;
const FILL: u8 = 0xA5;
/// How long the destination's accept waits (past its handshake timeout).
const ACCEPT_WAIT: Duration = Duration::from_secs(6);
/// How long the relay forwards before it gives up.
const RELAY_FOR: Duration = Duration::from_secs(8);
const RECVS: usize = 3;

fn keyed() -> Config {
    Config { auth_key: Some(AuthKey::new(b"relay test: the pre-shared key!!").unwrap()), ..Config::default() }
}

/// One side of the relay: a QP with receives always posted.
struct End {
    id: Arc<CmId>,
    channel: Arc<EventChannel>,
    qp: Arc<QueuePair>,
    cq: Arc<CompletionQueue>,
    recv: Vec<ControlBuffer>,
    posted: VecDeque<usize>,
    send: ControlBuffer,
}

impl End {
    fn new(id: Arc<CmId>, channel: Arc<EventChannel>) -> End {
        let pd = ProtectionDomain::new(&id).expect("pd");
        let cq = CompletionQueue::new(&id, 64, &CompletionChannel::new(&id).expect("channel")).expect("cq");
        let caps = QpCaps { max_send_wr: 16, max_recv_wr: RECVS as u32, max_send_sge: 1, max_recv_sge: 1 };
        let qp = QueuePair::new(&id, &pd, &cq, &cq, caps).expect("qp");
        let recv = (0..RECVS).map(|_| ControlBuffer::new(&pd, CONTROL_BUFFER_SIZE)).collect();
        let send = ControlBuffer::new(&pd, CONTROL_BUFFER_SIZE);
        let mut end = End { id, channel, qp, cq, recv, posted: VecDeque::new(), send };
        for _ in 0..RECVS {
            end.post_recv();
        }
        end
    }

    fn post_recv(&mut self) {
        let i = (0..RECVS).find(|i| !self.posted.contains(i)).expect("a free receive buffer");
        let sge = self.recv[i].mr.sge(0, CONTROL_BUFFER_SIZE as u32).unwrap();
        self.qp.post_recv(WRID_RECV + i as u64, sge).expect("post_recv");
        self.posted.push_back(i);
    }

    /// A message that arrived, if one did within `wait`; `Err` once the QP failed.
    fn received(&mut self, wait: Duration) -> Result<Option<Vec<u8>>, String> {
        loop {
            let Some(wc) = next_wc(&self.cq, Instant::now() + wait) else { return Ok(None) };
            if !wc.is_success() {
                return Err(format!("{} ({})", wc.status_str(), wc.status()));
            }
            if wc.wr_id() == WRID_SEND {
                continue;
            }
            let i = self.posted.pop_front().expect("a receive completed that was never posted");
            let bytes = self.recv[i].mem[..wc.byte_len() as usize].to_vec();
            self.post_recv();
            return Ok(Some(bytes));
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.send.mem[..bytes.len()].copy_from_slice(bytes);
        let sge = self.send.mr.sge(0, bytes.len() as u32).unwrap();
        self.qp.post_send(WRID_SEND, sge, true).map_err(|e| e.to_string())
    }
}

/// What went through the relay: the control message types each way.
#[derive(Debug, Default)]
struct Relayed {
    from_source: Vec<CommandType>,
    from_destination: Vec<CommandType>,
}

/// Relays one connection from `listener` to the destination on `port`,
/// `rewrite` applied to the destination's accept data, until either side
/// fails or `RELAY_FOR` passed.
fn relay(listener: (Arc<CmId>, Arc<EventChannel>), port: u16, rewrite: fn(&mut Vec<u8>)) -> Relayed {
    let deadline = Instant::now() + RELAY_FOR;
    let (_listen_id, listen_channel) = listener;
    let request = next_event(&listen_channel, CmEventKind::ConnectRequest, deadline);
    let private = request.private_data().to_vec();
    let source_channel = EventChannel::new().expect("event channel");
    let source_id = request.take_request_id(&source_channel).expect("the request's id");
    drop(request);
    let source = End::new(source_id, source_channel);

    let destination_channel = EventChannel::new().expect("event channel");
    let destination_id = CmId::new(&destination_channel).expect("cm id");
    let ip: IpAddr = rdma_ip().parse().unwrap();
    destination_id.resolve_addr(&SocketAddr::new(ip, port), 5000).expect("resolve_addr");
    next_event(&destination_channel, CmEventKind::AddrResolved, deadline);
    destination_id.resolve_route(5000).expect("resolve_route");
    next_event(&destination_channel, CmEventKind::RouteResolved, deadline);
    let destination = End::new(destination_id, destination_channel);
    let param = |private_data| ConnParam {
        private_data,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 5,
        rnr_retry_count: 0,
    };
    destination.id.connect(&param(&private)).expect("connect to the destination");
    let established = next_event(&destination.channel, CmEventKind::Established, deadline);
    let mut accepted = established.private_data().to_vec();
    drop(established);
    let decoded = AcceptData::decode(&accepted).expect("the destination's accept data");
    eprintln!("relay: the destination accepted, granting {:#x}", decoded.caps.flags);
    rewrite(&mut accepted);
    source.id.accept(&param(&accepted)).expect("accept the source");
    next_event(&source.channel, CmEventKind::Established, deadline);
    eprintln!("relay: the source is connected through the relay");

    let mut relayed = Relayed::default();
    let mut ends = [source, destination];
    while Instant::now() < deadline {
        for from in 0..2 {
            let bytes = match ends[from].received(Duration::from_millis(20)) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("relay: a side failed ({e}); relayed {relayed:?}");
                    return relayed;
                }
            };
            let kind = wire::decode_header(&bytes).map(|h| h.kind).unwrap_or(CommandType::None);
            let log = if from == 0 { &mut relayed.from_source } else { &mut relayed.from_destination };
            log.push(kind);
            if let Err(e) = ends[1 - from].send(&bytes) {
                eprintln!("relay: forwarding {kind:?} failed: {e}");
                return relayed;
            }
        }
    }
    relayed
}

/// A keyed source connects to the relay, the relay to the keyed destination.
fn relayed_migration(rewrite: fn(&mut Vec<u8>)) {
    let config = keyed();
    let src_ram = GuestRam::new(RAM, 0x11);
    let dst_ram = GuestRam::new(RAM, FILL);
    let (dest_listener, dest_port) = listen(&config);
    let registry = one_block(&dst_ram, RAM);
    let accept = thread::spawn(move || {
        let dest = Destination::accept(&dest_listener, &registry, Some(ACCEPT_WAIT))?;
        eprintln!("destination: admitted a source, {}", dest.negotiated());
        dest.wait_end(Some(ACCEPT_WAIT)).map(|_| ())
    });
    let relay_channel = EventChannel::new().expect("event channel");
    let relay_id = CmId::new(&relay_channel).expect("cm id");
    relay_id.bind_addr(&SocketAddr::new(rdma_ip().parse().unwrap(), 0)).expect("bind");
    relay_id.listen(5).expect("listen");
    let relay_port = relay_id.local_port();
    let relay = thread::spawn(move || relay((relay_id, relay_channel), dest_port, rewrite));

    let source = Source::connect(&rdma_ip(), relay_port, &config, &one_block(&src_ram, RAM)).and_then(|source| {
        eprintln!("source: connected, {}", source.negotiated());
        source.iteration_begin()?;
        source.save(0, 0, RAM)?;
        source.iteration_end()?;
        source.close().map(|_| ())
    });
    let dest = accept.join().unwrap();
    let relayed = relay.join().unwrap();
    eprintln!("source: {source:?}\ndestination: {dest:?}\nrelayed: {relayed:?}");

    let source = source.expect_err("the source migrated through a relay");
    assert_eq!(source.kind, ErrorKind::Auth, "{source}");
    assert!(source.message.contains("relays the connection"), "{source}");
    let dest = dest.expect_err("the destination admitted a relayed source");
    assert_eq!(dest.kind, ErrorKind::Auth, "{dest}");
    assert!(dest.message.contains("did not authenticate"), "{dest}");
    assert!(
        !relayed.from_source.contains(&CommandType::Auth),
        "the source sent its proof through the relay: {relayed:?}"
    );
    let rkeys = [CommandType::RegisterResult, CommandType::RamBlocksResult];
    assert!(
        !relayed.from_destination.iter().any(|k| rkeys.contains(k)),
        "an rkey left the destination through the relay: {relayed:?}"
    );
    assert!(dst_ram.bytes().iter().all(|&b| b == FILL), "the destination's RAM was written");
}

#[test]
fn relayed_handshake_fails_on_both_sides() {
    relayed_migration(|_| {});
}

#[test]
fn relay_that_rewrites_the_pin_budget_fails_on_both_sides() {
    relayed_migration(|accepted| accepted[8..16].copy_from_slice(&(64u64 << 20).to_be_bytes()));
}
