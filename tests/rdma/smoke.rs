//! Smoke tests of the verbs layer on a real device: device listing, rdma_cm
//! connection set-up through a listener on port 0, RDMA WRITEs of a known
//! pattern with selective signalling followed by a SEND, byte-for-byte
//! verification on the receiver, send-queue-full (ENOMEM) reporting, and
//! rejection of connection requests.

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::verbs::{
    self, sys, Access, CmEvent, CmEventKind, CmId, CompletionChannel, CompletionQueue, ConnParam, Context,
    EventChannel, MemoryRegion, ProtectionDomain, QpCaps, QueuePair, WorkCompletion,
};

const MIB: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_DATA: &[u8] = b"rdmamig-smoke";
const RECV_WRID: u64 = 0x5ec0;
const SEND_WRID: u64 = 0x5e4d;

fn rdma_ip() -> IpAddr {
    std::env::var("RXE_VM_IP").unwrap_or_else(|_| "198.18.0.1".into()).parse().expect("RXE_VM_IP")
}

fn rdma_dev() -> String {
    std::env::var("RXE_VM_DEV").unwrap_or_else(|_| "rxe0".into())
}

fn pattern(i: usize) -> u8 {
    let x = (i as u64 ^ 0xa5a5).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (i >> 12) as u8
}

fn next_event(ch: &EventChannel, want: CmEventKind, deadline: Instant) -> CmEvent {
    let left = deadline.saturating_duration_since(Instant::now());
    let ev = ch.get_event(Some(left)).expect("get_event").unwrap_or_else(|| panic!("timed out waiting for {want:?}"));
    assert_eq!(ev.kind(), want, "unexpected event {ev:?}");
    ev
}

/// Next completion, via the poll → wait → poll loop. Panics on timeout.
fn next_wc(cq: &CompletionQueue, deadline: Instant) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        if cq.poll(&mut wc).expect("poll") == 1 {
            return wc[0];
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out waiting for a completion");
        cq.wait(left.min(Duration::from_secs(1))).expect("wait");
    }
}

fn ok_wc(cq: &CompletionQueue, deadline: Instant) -> WorkCompletion {
    let wc = next_wc(cq, deadline);
    assert!(wc.is_success(), "failed completion: {wc:?}");
    wc
}

/// PD, one CQ per direction (each with its own channel), and an RC QP on `id`.
struct Endpoint {
    qp: Arc<QueuePair>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
}

fn endpoint(id: &Arc<CmId>, max_send_wr: u32) -> Endpoint {
    let pd = ProtectionDomain::new(id).expect("pd");
    let send_cq = CompletionQueue::new(id, 256, &CompletionChannel::new(id).expect("cc")).expect("send cq");
    let recv_cq = CompletionQueue::new(id, 16, &CompletionChannel::new(id).expect("cc")).expect("recv cq");
    let caps = QpCaps { max_send_wr, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1 };
    let qp = QueuePair::new(id, &pd, &send_cq, &recv_cq, caps).expect("qp");
    assert!(qp.caps().max_send_wr >= max_send_wr, "{:?}", qp.caps());
    let again = QueuePair::new(id, &pd, &send_cq, &recv_cq, caps).expect_err("second QP on one id");
    assert_eq!(again.errno, libc::EEXIST);
    Endpoint { qp, send_cq, recv_cq, pd }
}

/// A listening id on `rdma_ip():0`; returns it with its port.
fn listener() -> (Arc<CmId>, u16) {
    let ch = EventChannel::new().expect("event channel");
    let id = CmId::new(&ch).expect("cm id");
    id.set_reuseaddr().expect("reuseaddr");
    id.bind_addr(&SocketAddr::new(rdma_ip(), 0)).expect("bind");
    id.listen(8).expect("listen");
    let port = id.local_port();
    assert_ne!(port, 0);
    (id, port)
}

/// What the receiving side saw.
struct Received {
    buffer: Vec<u8>,
    message: Vec<u8>,
}

/// The passive side: accepts one connection, exposes a `len`-byte buffer
/// (addr, rkey, len in the accept's private data), and returns the buffer
/// once the peer's SEND has arrived, after the peer disconnected. With a
/// `gate`, the receive for that SEND is only posted once the gate opens
/// (the peer's SEND meanwhile gets RNR NAKs and blocks its send queue).
fn serve_one(listen: Arc<CmId>, len: usize, gate: Option<mpsc::Receiver<()>>) -> Received {
    let deadline = Instant::now() + TIMEOUT;
    let req = next_event(listen.channel(), CmEventKind::ConnectRequest, deadline);
    // rdma_cm on IB/RoCE pads the connect private data to 56 bytes.
    assert!(req.private_data().starts_with(CONNECT_DATA), "{:?}", req.private_data());
    assert!(Arc::ptr_eq(req.cm_id().expect("listener alive"), &listen));
    // Move the connection to its own channel (exercises rdma_migrate_id).
    let conn_ch = EventChannel::new().expect("event channel");
    let id = req.take_request_id(&conn_ch).expect("request id");
    assert!(req.take_request_id(&conn_ch).is_none(), "taken twice");
    assert_eq!(id.raw(), req.id_ptr());
    drop(req);

    let ep = endpoint(&id, 16);
    let mut buffer = vec![0u8; len];
    let mut message = vec![0u8; 64];
    // SAFETY: both buffers outlive their MRs (dropped below before the Vecs are used).
    let mr =
        unsafe { ep.pd.register(buffer.as_mut_ptr(), len, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }.expect("reg");
    let msg_mr = unsafe { ep.pd.register(message.as_mut_ptr(), message.len(), Access::LOCAL_WRITE) }.expect("reg");
    if gate.is_none() {
        ep.qp.post_recv(RECV_WRID, msg_mr.sge(0, 64).unwrap()).expect("post_recv");
    }

    let mut private = Vec::new();
    private.extend_from_slice(&mr.addr().to_le_bytes());
    private.extend_from_slice(&mr.rkey().to_le_bytes());
    private.extend_from_slice(&(len as u32).to_le_bytes());
    let param = ConnParam {
        private_data: &private,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
    };
    id.accept(&param).expect("accept");
    let ev = next_event(&conn_ch, CmEventKind::Established, deadline);
    assert_eq!(ev.id_ptr(), id.raw());
    assert!(Arc::ptr_eq(ev.cm_id().expect("id alive"), &id));
    drop(ev);
    if let Some(gate) = gate {
        gate.recv_timeout(TIMEOUT).expect("gate");
        ep.qp.post_recv(RECV_WRID, msg_mr.sge(0, 64).unwrap()).expect("post_recv");
    }

    let wc = ok_wc(&ep.recv_cq, deadline);
    assert_eq!(wc.wr_id(), RECV_WRID);
    assert_eq!(wc.opcode(), sys::IBV_WC_RECV);
    let n = wc.byte_len() as usize;
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    let message = message[..n].to_vec();

    next_event(&conn_ch, CmEventKind::Disconnected, deadline);
    drop((mr, msg_mr, ep, id));
    Received { buffer, message }
}

/// The active side's connection: endpoint plus the peer's buffer.
struct Client {
    id: Arc<CmId>,
    ep: Endpoint,
    remote_addr: u64,
    rkey: u32,
    remote_len: usize,
}

fn connect(port: u16, max_send_wr: u32) -> Client {
    let deadline = Instant::now() + TIMEOUT;
    let ch = EventChannel::new().expect("event channel");
    let id = CmId::new(&ch).expect("cm id");
    id.set_tos(0).expect("tos");
    id.resolve_addr(&SocketAddr::new(rdma_ip(), port), 5000).expect("resolve_addr");
    next_event(&ch, CmEventKind::AddrResolved, deadline);
    id.resolve_route(5000).expect("resolve_route");
    next_event(&ch, CmEventKind::RouteResolved, deadline);
    let ep = endpoint(&id, max_send_wr);
    let param = ConnParam {
        private_data: CONNECT_DATA,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
    };
    id.connect(&param).expect("connect");
    let ev = next_event(&ch, CmEventKind::Established, deadline);
    let p = ev.private_data();
    assert!(p.len() >= 16, "accept private data: {p:?}");
    let remote_addr = u64::from_le_bytes(p[0..8].try_into().unwrap());
    let rkey = u32::from_le_bytes(p[8..12].try_into().unwrap());
    let remote_len = u32::from_le_bytes(p[12..16].try_into().unwrap()) as usize;
    assert_eq!(id.peer_port(), port);
    drop(ev);
    Client { id, ep, remote_addr, rkey, remote_len }
}

impl Client {
    /// Sends `msg` (signalled) and waits for its completion, which on an RC
    /// QP also means every earlier work request has completed. Checks any
    /// signalled completions before it.
    fn send_and_drain(&self, msg: &[u8], mut pending_signaled: usize) {
        let deadline = Instant::now() + TIMEOUT;
        let mut buf = msg.to_vec();
        let mr = unsafe { self.ep.pd.register(buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE) }.expect("reg");
        self.ep.qp.post_send(SEND_WRID, mr.sge(0, buf.len() as u32).unwrap(), true).expect("post_send");
        loop {
            let wc = ok_wc(&self.ep.send_cq, deadline);
            if wc.wr_id() == SEND_WRID {
                assert_eq!(wc.opcode(), sys::IBV_WC_SEND);
                break;
            }
            assert_eq!(wc.opcode(), sys::IBV_WC_RDMA_WRITE, "{wc:?}");
            pending_signaled = pending_signaled.checked_sub(1).expect("more write completions than signalled");
        }
        assert_eq!(pending_signaled, 0, "signalled writes completed after the SEND");
        drop(mr);
    }

    fn disconnect(self) {
        let deadline = Instant::now() + TIMEOUT;
        self.id.disconnect().expect("disconnect");
        next_event(self.id.channel(), CmEventKind::Disconnected, deadline);
    }
}

#[test]
fn device_is_listed_and_opens() {
    let names = verbs::device_names().expect("device_names");
    eprintln!("devices: {names:?}");
    let dev = rdma_dev();
    assert!(names.contains(&dev), "{dev} not in {names:?}");
    let ctx = Context::open(Some(&dev)).expect("open");
    assert_eq!(ctx.name(), dev);
    let first = Context::open(None).expect("open first");
    assert_eq!(first.name(), names[0]);
    let e = Context::open(Some("no-such-dev")).expect_err("bogus device");
    assert!(e.is_no_device(), "{e}");
}

#[test]
fn rdma_write_pattern_then_send() {
    const LEN: usize = 4 * MIB;
    const GUARD: usize = 4096;
    const CHUNK: usize = 128 * 1024;
    const SIGNAL_EVERY: usize = 8;
    // At most this many signalled batches in flight: 2 x 8 x 128 KiB = 2 MiB.
    const MAX_BATCHES: usize = 2;

    let (listen, port) = listener();
    let server = thread::spawn(move || serve_one(listen, LEN + GUARD, None));
    let client = connect(port, 64);
    assert_eq!(client.remote_len, LEN + GUARD);

    let mut src: Vec<u8> = (0..LEN).map(pattern).collect();
    let mr: MemoryRegion = unsafe { client.ep.pd.register(src.as_mut_ptr(), LEN, Access::LOCAL_WRITE) }.expect("reg");
    assert_eq!(mr.len(), LEN);
    assert!(mr.sge(LEN - 1, 2).is_none());

    let deadline = Instant::now() + TIMEOUT;
    let start = Instant::now();
    let writes = LEN / CHUNK;
    let mut in_flight = 0; // signalled batches not yet completed
    let mut completed = 0;
    let mut queue_full = 0;
    for i in 0..writes {
        let signaled = (i + 1) % SIGNAL_EVERY == 0;
        let sge = mr.sge(i * CHUNK, CHUNK as u32).unwrap();
        let remote = client.remote_addr + (i * CHUNK) as u64;
        loop {
            match client.ep.qp.post_write(i as u64, sge, remote, client.rkey, signaled) {
                Ok(()) => break,
                Err(e) if e.is_queue_full() && in_flight > 0 => {
                    queue_full += 1;
                    let wc = ok_wc(&client.ep.send_cq, deadline);
                    assert_eq!(wc.opcode(), sys::IBV_WC_RDMA_WRITE);
                    in_flight -= 1;
                    completed += 1;
                }
                Err(e) => panic!("post_write {i}: {e}"),
            }
        }
        if signaled {
            in_flight += 1;
            if in_flight >= MAX_BATCHES {
                let wc = ok_wc(&client.ep.send_cq, deadline);
                assert_eq!(wc.opcode(), sys::IBV_WC_RDMA_WRITE);
                assert_eq!(wc.wr_id() as usize % SIGNAL_EVERY, SIGNAL_EVERY - 1, "only signalled writes complete");
                in_flight -= 1;
                completed += 1;
            }
        }
    }
    // The SEND goes after the writes on the same QP: when it arrives, all
    // the written data is in the receiver's memory.
    let mut msg = b"DONE".to_vec();
    msg.extend_from_slice(&(writes as u32).to_le_bytes());
    client.send_and_drain(&msg, in_flight);
    let elapsed = start.elapsed();
    eprintln!(
        "wrote {} MiB in {writes} RDMA WRITEs of {} KiB ({} signalled completions waited for, {queue_full} queue-full retries) + SEND in {:.3} s = {:.1} MiB/s",
        LEN / MIB,
        CHUNK / 1024,
        completed + in_flight,
        elapsed.as_secs_f64(),
        (LEN as f64 / MIB as f64) / elapsed.as_secs_f64()
    );
    drop(mr);
    client.disconnect();

    let got = server.join().expect("server thread");
    assert_eq!(got.message, msg);
    assert_eq!(got.buffer.len(), LEN + GUARD);
    if let Some(i) = (0..LEN).find(|&i| got.buffer[i] != pattern(i)) {
        panic!("byte {i}: got {:#04x}, want {:#04x}", got.buffer[i], pattern(i));
    }
    assert!(got.buffer[LEN..].iter().all(|&b| b == 0), "write past the end");
    eprintln!("receiver verified {} bytes + {GUARD}-byte guard", LEN);
}

#[test]
fn full_send_queue_is_enomem() {
    const WRITE: usize = 64 * 1024;
    const DEPTH: u32 = 8;
    let (listen, port) = listener();
    let (open_gate, gate) = mpsc::channel();
    let server = thread::spawn(move || serve_one(listen, WRITE, Some(gate)));
    let client = connect(port, DEPTH);
    let depth = client.ep.qp.caps().max_send_wr as usize;
    let deadline = Instant::now() + TIMEOUT;

    // rxe runs a loopback post to completion inside ibv_post_send, so to fill
    // the queue, block it: the first SEND finds no receive posted and is
    // retried after RNR NAKs (rnr_retry 7 = forever) until the gate opens.
    let mut msg = b"FULL".to_vec();
    let msg_mr = unsafe { client.ep.pd.register(msg.as_mut_ptr(), msg.len(), Access::LOCAL_WRITE) }.expect("reg");
    client.ep.qp.post_send(SEND_WRID, msg_mr.sge(0, 4).unwrap(), true).expect("post_send");

    let mut src = vec![0x5au8; WRITE];
    let mr = unsafe { client.ep.pd.register(src.as_mut_ptr(), WRITE, Access::LOCAL_WRITE) }.expect("reg");
    let sge = mr.sge(0, WRITE as u32).unwrap();
    let mut posted = 1; // the SEND
    let err = loop {
        match client.ep.qp.post_write(posted, sge, client.remote_addr, client.rkey, false) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted < 10_000, "send queue never filled up");
    };
    eprintln!("send queue (max_send_wr {depth}) full after {posted} posts: {err}");
    assert!(err.is_queue_full(), "{err}");
    assert_eq!(err.errno, libc::ENOMEM);
    assert_eq!(err.op, "ibv_post_send");
    assert!(posted as usize >= depth, "full after {posted} < {depth} posts");
    assert_eq!(err.to_string(), "ibv_post_send: Cannot allocate memory (errno 12)");

    // Unblock: the SEND completes, then the writes; a last signalled write
    // (retried while the queue is still full) completes after all of them.
    open_gate.send(()).unwrap();
    let wc = ok_wc(&client.ep.send_cq, deadline);
    assert_eq!((wc.wr_id(), wc.opcode()), (SEND_WRID, sys::IBV_WC_SEND));
    let mut retries = 0;
    loop {
        match client.ep.qp.post_write(u64::MAX, sge, client.remote_addr, client.rkey, true) {
            Ok(()) => break,
            Err(e) if e.is_queue_full() && Instant::now() < deadline => {
                retries += 1;
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("post_write: {e}"),
        }
    }
    let wc = ok_wc(&client.ep.send_cq, deadline);
    assert_eq!((wc.wr_id(), wc.opcode()), (u64::MAX, sys::IBV_WC_RDMA_WRITE));
    eprintln!("queue drained; last write posted after {retries} queue-full retries");
    drop((mr, msg_mr));
    client.disconnect();
    let got = server.join().expect("server");
    assert_eq!(got.message, b"FULL");
    assert!(got.buffer.iter().all(|&b| b == 0x5a));
}

#[test]
fn requests_are_rejected_explicitly_or_when_dropped() {
    let (listen, port) = listener();
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        let deadline = Instant::now() + TIMEOUT;
        let ch = listen.channel().clone();
        // 1: take the id and reject it with private data.
        let req = next_event(&ch, CmEventKind::ConnectRequest, deadline);
        let id = req.take_request_id(&ch).expect("request id");
        id.reject(b"go away").expect("reject");
        drop(req);
        drop(id);
        tx.send(()).unwrap();
        // 2: drop the request without taking it: rejected automatically.
        let req = next_event(&ch, CmEventKind::ConnectRequest, deadline);
        drop(req);
        assert!(ch.get_event(Some(Duration::from_millis(100))).expect("get_event").is_none());
    });
    for round in 0..2 {
        let deadline = Instant::now() + TIMEOUT;
        let ch = EventChannel::new().expect("event channel");
        let id = CmId::new(&ch).expect("cm id");
        id.resolve_addr(&SocketAddr::new(rdma_ip(), port), 5000).expect("resolve_addr");
        let ev = next_event(&ch, CmEventKind::AddrResolved, deadline);
        assert!(ev.take_request_id(&ch).is_none());
        drop(ev);
        id.resolve_route(5000).expect("resolve_route");
        next_event(&ch, CmEventKind::RouteResolved, deadline);
        let ep = endpoint(&id, 4);
        id.connect(&ConnParam { private_data: CONNECT_DATA, ..ConnParam::default() }).expect("connect");
        let ev = next_event(&ch, CmEventKind::Rejected, deadline);
        eprintln!("round {round}: {ev:?}");
        if round == 0 {
            assert!(ev.private_data().starts_with(b"go away"), "{:?}", ev.private_data());
            rx.recv_timeout(TIMEOUT).unwrap();
        }
        drop(ev);
        drop(ep);
    }
    server.join().expect("server");
}

/// `wait` returns false after the timeout when nothing completes, and
/// promptly once a completion is there.
#[test]
fn cq_wait_times_out_and_wakes() {
    let (listen, port) = listener();
    let server = thread::spawn(move || serve_one(listen, 4096, None));
    let client = connect(port, 8);
    let t = Instant::now();
    assert!(!client.ep.send_cq.wait(Duration::from_millis(200)).expect("wait"));
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(5), "{waited:?}");
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(client.ep.send_cq.poll(&mut wc).unwrap(), 0);
    client.send_and_drain(b"WAKE", 0);
    client.disconnect();
    assert_eq!(server.join().unwrap().message, b"WAKE");
}

/// This process's verbs objects as the kernel lists them (`rdma resource show KIND`).
fn kernel_objects(kind: &str) -> usize {
    let out =
        std::process::Command::new("rdma").args(["resource", "show", kind]).output().expect("rdma tool (iproute2)");
    assert!(out.status.success(), "rdma resource show {kind}: {}", String::from_utf8_lossy(&out.stderr));
    let pid = format!("pid {} ", std::process::id());
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(&pid)).count()
}

fn resource_snapshot() -> Vec<(&'static str, usize)> {
    let mut v = vec![("fds", crate::migration::open_fds())];
    for kind in ["cm_id", "qp", "cq", "pd", "mr"] {
        v.push((kind, kernel_objects(kind)));
    }
    v
}

/// Dropping everything releases every kernel object and fd. (librdmacm opens
/// each device it uses once, on first use, and keeps it open for the life
/// of the process: two fds, uverbs command + async event. So measure after a
/// warm-up connection.)
#[test]
fn nothing_leaks_after_a_connection() {
    let cycle = || {
        let (listen, port) = listener();
        let server = thread::spawn(move || serve_one(listen, 64 * 1024, None));
        let client = connect(port, 8);
        client.send_and_drain(b"LEAK", 0);
        client.disconnect();
        assert_eq!(server.join().unwrap().message, b"LEAK");
    };
    cycle();
    let before = resource_snapshot();
    eprintln!("after warm-up: {before:?}");
    for _ in 0..3 {
        cycle();
    }
    let after = resource_snapshot();
    assert_eq!(after, before, "resources leaked");
}
