//! The IP ToS byte of the connection's RoCEv2 packets (`Config::tos`), seen
//! on a wire: two guests (`scripts/rxe-vm.sh --pair`, run by
//! scripts/rdma-suite.sh; in one guest rxe loops packets back internally and
//! a capture sees none). Guest 1 is the destination, guest 2 the source; each
//! captures UDP 4791 on its own NIC while a few MiB migrate, then checks the
//! ToS byte of every packet of the connection's QPs: the source's RDMA WRITEs
//! and SENDs, the destination's SENDs, and the ACKs both ways. The CM's MADs
//! (QP1) come from the kernel's MAD layer and are only reported.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rdmamig::{Config, Destination, Ending, Listener, Source};

use crate::liveness::{barrier, netdev, peer_ip, ping_peer, role, Role};
use crate::migration::{one_block, rdma_ip, read_stream, GuestRam};

const MIB: u64 = 1 << 20;
const RAM: u64 = 8 * MIB;
/// The first case's port; the liveness tests use 18515 and 18516.
const PORT: u16 = 18_520;
const STREAM: &[u8] = b"device state after the RAM";

/// RoCEv2's UDP destination port.
const ROCE_PORT: u16 = 4791;
/// The BTH destination QP of the CM's MADs.
const QP1: u32 = 1;

/// One migration: the ToS each side configures and the one every packet of
/// the connection must carry.
struct Case {
    name: &'static str,
    source: u8,
    destination: u8,
    expected: u8,
}

const CASES: [Case; 3] = [
    // DSCP 26 (a common lossless class), ECN 10: ECN-capable.
    Case { name: "both", source: 0x6a, destination: 0x6a, expected: 0x6a },
    // DSCP 46, ECN 01: the connecting side's value marks both directions.
    Case { name: "source-only", source: 0xb9, destination: 0, expected: 0xb9 },
    // The passive side takes the traffic class of the connection request.
    Case { name: "destination-only", source: 0, destination: 0x6a, expected: 0 },
];

#[test]
#[ignore = "needs two guests: scripts/rxe-vm.sh --pair (see scripts/rdma-suite.sh)"]
fn pair_every_packet_carries_the_connecting_sides_tos() {
    let Some(role) = role("pair_every_packet_carries_the_connecting_sides_tos") else { return };
    ping_peer();
    let (source_ip, destination_ip) = match role {
        Role::Destination => (peer_ip(), rdma_ip()),
        Role::Source => (rdma_ip(), peer_ip()),
    };
    let source_ip: Ipv4Addr = source_ip.parse().expect("source address");
    let destination_ip: Ipv4Addr = destination_ip.parse().expect("destination address");
    let mut failures = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let capture = Capture::start(&format!("/tmp/tos-{}.pcap", case.name));
        barrier(&format!("tos-{}-capturing", case.name));
        let port = PORT + i as u16;
        match role {
            Role::Destination => receive(case, port),
            Role::Source => send(case, port),
        }
        // Both connections are gone: nothing of this case is still on the wire.
        barrier(&format!("tos-{}-done", case.name));
        let packets = capture.stop();
        let seen = Seen::count(&packets, source_ip, destination_ip);
        eprintln!(
            "tos case {}: source {:#04x}, destination {:#04x}, captured on {role:?}'s NIC:\n{seen}",
            case.name, case.source, case.destination
        );
        if let Err(e) = seen.check(case.expected) {
            failures.push(format!("case {}: {e}", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Guest 1: accepts one source and checks that its RAM and stream arrived.
fn receive(case: &Case, port: u16) {
    let config = Config { tos: case.destination, ..Config::default() };
    let ram = GuestRam::new(RAM, 0);
    let listener = Listener::bind(&rdma_ip(), port, &config).expect("listen");
    barrier(&format!("tos-{}-listening", case.name));
    let dest = Destination::accept(&listener, &one_block(&ram, RAM), Some(Duration::from_secs(60))).expect("accept");
    drop(listener);
    assert_eq!(read_stream(&dest, STREAM.len()), STREAM);
    assert_eq!(dest.wait_end(Some(Duration::from_secs(60))).expect("wait_end"), Ending::Completed);
    assert!(ram.bytes().iter().all(|&b| b == 0x5A), "the RAM differs after the migration");
}

/// Guest 2: migrates `RAM` bytes and a few stream bytes.
fn send(case: &Case, port: u16) {
    let config = Config { tos: case.source, ..Config::default() };
    let ram = GuestRam::new(RAM, 0x5A);
    barrier(&format!("tos-{}-listening", case.name));
    let source = Source::connect(&peer_ip(), port, &config, &one_block(&ram, RAM)).expect("connect");
    source.iteration_begin().unwrap();
    for off in (0..RAM).step_by(MIB as usize) {
        source.save(0, off, MIB).unwrap();
    }
    source.iteration_end().unwrap();
    source.put(STREAM).unwrap();
    assert_eq!(source.close().expect("close"), Ending::Completed);
}

/// tcpdump writing RoCEv2 packets on this guest's NIC into a pcap file.
struct Capture {
    child: Child,
    path: String,
    stderr: mpsc::Receiver<String>,
}

impl Capture {
    /// Returns once tcpdump captures.
    fn start(path: &str) -> Capture {
        let netdev = netdev();
        let mut child = Command::new("tcpdump")
            // -Z root: tcpdump would otherwise drop to its own user before opening the file.
            // Immediate mode: without it, packets still in the kernel's ring buffer
            // block when tcpdump stops are counted but never written.
            .args(["-Z", "root", "-i", &netdev, "-nn", "-s", "128", "--immediate-mode", "-U", "-w", path])
            .arg(format!("udp port {ROCE_PORT}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump");
        let (tx, stderr) = mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let capture = Capture { child, path: path.to_string(), stderr };
        loop {
            match capture.stderr.recv_timeout(Duration::from_secs(30)) {
                Ok(line) if line.contains("listening on") => return capture,
                Ok(line) => eprintln!("tcpdump: {line}"),
                Err(e) => panic!("tcpdump on {netdev} did not start capturing: {e}"),
            }
        }
    }

    /// Stops tcpdump and returns the packets it wrote.
    fn stop(mut self) -> Vec<Vec<u8>> {
        // SIGINT: tcpdump flushes the file and prints its counts.
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let status = self.child.wait().expect("waiting for tcpdump");
        for line in self.stderr.iter() {
            eprintln!("tcpdump: {line}");
        }
        assert!(status.success() || status.code() == Some(2), "tcpdump: {status}");
        let file = std::fs::read(&self.path).unwrap_or_else(|e| panic!("{}: {e}", self.path));
        pcap_packets(&file)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // Not stopped (a panic): leave no tcpdump behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The packets of a classic pcap file (either byte order, µs or ns stamps),
/// each as captured (at most the snap length).
fn pcap_packets(file: &[u8]) -> Vec<Vec<u8>> {
    assert!(file.len() >= 24, "pcap file of {} bytes", file.len());
    let magic = u32::from_le_bytes(file[0..4].try_into().unwrap());
    let little = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        m => panic!("not a classic pcap file (magic {m:#010x})"),
    };
    let u32_at = |at: usize| {
        let b: [u8; 4] = file[at..at + 4].try_into().unwrap();
        if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    assert_eq!(u32_at(20), 1, "link type: expected Ethernet");
    let mut packets = Vec::new();
    let mut at = 24;
    while at + 16 <= file.len() {
        let len = u32_at(at + 8) as usize;
        let start = at + 16;
        // tcpdump killed mid-write leaves a partial record: ignore it.
        let Some(data) = file.get(start..start + len) else { break };
        packets.push(data.to_vec());
        at = start + len;
    }
    packets
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    /// BTH opcodes 0x06-0x0B (RC RDMA WRITE first/middle/last/only, with immediate).
    Write,
    /// 0x00-0x05 (RC SEND).
    Send,
    /// 0x11 (RC ACK).
    Ack,
    /// Any other opcode on the connection's QPs.
    Other(u8),
    /// Destination QP 1: the CM's MADs.
    Mad,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Direction {
    ToDestination,
    ToSource,
    /// Neither pair of this migration's addresses.
    Elsewhere,
}

/// RoCEv2 packets counted by direction, kind and ToS.
struct Seen {
    counts: BTreeMap<(Direction, Kind, u8), usize>,
    not_roce: usize,
}

impl Seen {
    fn count(packets: &[Vec<u8>], source: Ipv4Addr, destination: Ipv4Addr) -> Seen {
        let mut seen = Seen { counts: BTreeMap::new(), not_roce: 0 };
        for p in packets {
            let Some(r) = RocePacket::parse(p) else {
                seen.not_roce += 1;
                continue;
            };
            let direction = match (r.src, r.dst) {
                (s, d) if s == source && d == destination => Direction::ToDestination,
                (s, d) if s == destination && d == source => Direction::ToSource,
                _ => Direction::Elsewhere,
            };
            let kind = match (r.dest_qp, r.opcode) {
                (QP1, _) => Kind::Mad,
                (_, 0x00..=0x05) => Kind::Send,
                (_, 0x06..=0x0b) => Kind::Write,
                (_, 0x11) => Kind::Ack,
                (_, op) => Kind::Other(op),
            };
            *seen.counts.entry((direction, kind, r.tos)).or_default() += 1;
        }
        seen
    }

    /// Packets of `kind` going `direction`, whatever their ToS.
    fn of(&self, direction: Direction, kind: Kind) -> usize {
        self.counts.iter().filter(|((d, k, _), _)| *d == direction && *k == kind).map(|(_, n)| n).sum()
    }

    /// Every packet on the connection's QPs carries `tos`, and there are
    /// enough of each kind to mean something.
    fn check(&self, tos: u8) -> Result<(), String> {
        let mut wrong: Vec<String> = self
            .counts
            .iter()
            .filter(|((_, kind, t), _)| *kind != Kind::Mad && *t != tos)
            .map(|((d, k, t), n)| format!("{n} {k:?} packets {d:?} with ToS {t:#04x}"))
            .collect();
        let least = [
            // Half the RAM's 4 KiB packets: tcpdump drops little (it reports how many).
            (Direction::ToDestination, Kind::Write, RAM as usize / 4096 / 2),
            (Direction::ToDestination, Kind::Send, 2),
            (Direction::ToSource, Kind::Send, 2),
            (Direction::ToSource, Kind::Ack, 10),
            (Direction::ToDestination, Kind::Ack, 2),
        ];
        for (direction, kind, at_least) in least {
            let n = self.of(direction, kind);
            if n < at_least {
                wrong.push(format!("{n} {kind:?} packets {direction:?} (expected at least {at_least})"));
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!("expected ToS {tos:#04x} on every packet of the connection: {}", wrong.join("; ")))
        }
    }
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for ((direction, kind, tos), n) in &self.counts {
            writeln!(f, "  {n:6} {direction:?} {kind:?} tos {tos:#04x}")?;
        }
        write!(f, "  {:6} other packets (not IPv4/UDP {ROCE_PORT})", self.not_roce)
    }
}

/// What the checks need from an Ethernet frame carrying RoCEv2 over IPv4.
struct RocePacket {
    tos: u8,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    opcode: u8,
    dest_qp: u32,
}

impl RocePacket {
    fn parse(frame: &[u8]) -> Option<RocePacket> {
        let mut at = 12;
        let mut ethertype = u16::from_be_bytes(frame.get(at..at + 2)?.try_into().ok()?);
        if ethertype == 0x8100 {
            // 802.1Q tag: the priority travels there too, but the type follows it.
            at += 4;
            ethertype = u16::from_be_bytes(frame.get(at..at + 2)?.try_into().ok()?);
        }
        if ethertype != 0x0800 {
            return None;
        }
        let ip = frame.get(at + 2..)?;
        let header_len = usize::from(ip.first()? & 0x0f) * 4;
        if ip.first()? >> 4 != 4 || header_len < 20 || *ip.get(9)? != 17 {
            return None;
        }
        let udp = ip.get(header_len..)?;
        if u16::from_be_bytes(udp.get(2..4)?.try_into().ok()?) != ROCE_PORT {
            return None;
        }
        let bth = udp.get(8..20)?;
        Some(RocePacket {
            tos: ip[1],
            src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            dst: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
            opcode: bth[0],
            dest_qp: u32::from_be_bytes([0, bth[5], bth[6], bth[7]]),
        })
    }
}

/// The parser, on hand-made frames (no RDMA needed).
mod parse_tests {
    use super::*;

    /// An Ethernet + IPv4 + UDP + BTH frame.
    fn frame(tos: u8, src: [u8; 4], dst: [u8; 4], opcode: u8, dest_qp: u32) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend([0x08, 0x00]);
        f.extend([0x45, tos, 0, 60, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        f.extend(src);
        f.extend(dst);
        f.extend([0xc0, 0x00, (ROCE_PORT >> 8) as u8, ROCE_PORT as u8, 0, 40, 0, 0]);
        let qp = dest_qp.to_be_bytes();
        f.extend([opcode, 0, 0xff, 0xff, 0, qp[1], qp[2], qp[3], 0, 0, 0, 1]);
        f
    }

    fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut file = Vec::new();
        // Magic, version 2.4 (two u16), zone, accuracy, snap length, Ethernet.
        for v in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 128, 1] {
            file.extend(v.to_le_bytes());
        }
        for f in frames {
            for v in [0u32, 0, f.len() as u32, f.len() as u32] {
                file.extend(v.to_le_bytes());
            }
            file.extend(f);
        }
        file
    }

    #[test]
    fn counts_kinds_directions_and_tos() {
        let (s, d) = ([198, 18, 0, 2], [198, 18, 0, 1]);
        let frames = [
            frame(0x6a, s, d, 0x06, 0x11),
            frame(0x6a, s, d, 0x07, 0x11),
            frame(0x6a, s, d, 0x04, 0x11),
            frame(0x6a, d, s, 0x11, 0x12),
            frame(0x6a, d, s, 0x04, 0x12),
            frame(0x00, s, d, 0x04, QP1),
        ];
        let packets = pcap_packets(&pcap(&frames));
        assert_eq!(packets.len(), 6);
        let seen = Seen::count(&packets, Ipv4Addr::from(s), Ipv4Addr::from(d));
        assert_eq!(seen.of(Direction::ToDestination, Kind::Write), 2);
        assert_eq!(seen.of(Direction::ToDestination, Kind::Send), 1);
        assert_eq!(seen.of(Direction::ToSource, Kind::Ack), 1);
        assert_eq!(seen.of(Direction::ToSource, Kind::Send), 1);
        assert_eq!(seen.of(Direction::ToDestination, Kind::Mad), 1);
        let err = seen.check(0x6a).unwrap_err();
        assert!(!err.contains("ToS 0x00"), "MADs are not checked: {err}");
        assert!(err.contains("expected at least"), "{err}");
        let wrong = Seen::count(&pcap_packets(&pcap(&[frame(0x00, s, d, 0x06, 0x11)])), s.into(), d.into());
        assert!(wrong.check(0x6a).unwrap_err().contains("1 Write packets ToDestination with ToS 0x00"));
    }
}
