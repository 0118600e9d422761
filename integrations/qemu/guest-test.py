#!/usr/bin/python3
"""guest-test.py BUILD_DIR -- a running Linux guest migrated on through QEMU
10.2 stock and patched (librdmamig), over rdma in an rxe guest.

Runs inside scripts/rxe-vm.sh's guest (integrations/qemu/test.sh's pair
"guest").  One Linux guest (the harness's kernel, guest/memcheck-init.c as
init, a virtio-serial device) boots once under the patched QEMU and is
migrated from QEMU to QEMU, each time to a new destination process:

  patched -> patched  dynamic          patched -> stock    pin-all
  stock   -> patched  dynamic          patched -> patched  pin-all, keyed
  patched -> stock    dynamic          stock   -> patched  pin-all

After each migration query-migrate must say completed (its total time and
downtime are printed), the destination must run, and the guest's own check
must report its memory intact twice on the destination (the second pass
verified every page written before and during the migration); the
destination's virtio-serial and serial files hold only what the guest
printed there.  Then post-copy, patched -> patched, dynamic and pin-all:
each switches to post-copy with migrate-start-postcopy once the first round
through RAM is done (a 1 ms downtime limit keeps pre-copy from converging
first); the destination's guest must pass its check twice, the source must
report the pages the destination pulled (postcopy-bytes), and the total
time and the destination's post-copy figures (postcopy-blocktime on) are
printed.  Then what post-copy with rdma refuses (postcopy-preempt,
release-ram, return-path on the source; postcopy-ram set after
migrate-incoming on the destination), each with its message.  Then the
failures:

  - a source with another key than the destination's: refused before any
    RAM moves (query-migrate failed, with the library's message in its
    error-desc, no RAM transferred); the source guest goes on running;
  - the source killed mid-transfer (patched -> patched): the destination
    fails the migration and exits without ever running the guest;
  - the destination killed in post-copy once it runs the guest (a new
    guest, switched to post-copy as soon as the migration is active, so
    that most of its RAM is still on the source): the source fails the
    migration and does not run its guest again;
  - the source killed in post-copy the same way: the destination fails the
    migration saying how many pages are missing, stays up, and its guest
    never runs on a missing page (its check never reports corruption);
  - the link cut in post-copy the same way (over a second rxe link in this
    guest, a veth pair, see Wire): both sides go postcopy-paused, and
    migrate-recover and migrate resume=true recover it once it is back.

Exits 0 only if every step held.  RDMAMIG_LIBDIR must name the directory of
librdmamig.so.0 for the patched QEMU.

guest-test.py --bench BUILD_DIR -- the same guest, booted under stock QEMU,
migrated on through BENCH_CHAIN: stock over TCP, stock over rdma and patched
over rdma, dynamic and pin-all, with no bandwidth cap (max-bandwidth 0);
each measured migration prints one "guest-bench:" line with QEMU's total
time and downtime and its throughput (RAM sent ÷ total time) ÷ ib_write_bw's
(1 MiB messages, measured first in the same rxe guest boot).

guest-test.py --median LOG... -- the median of each figure over the
"guest-bench:" lines of several runs (scripts/bench-qemu.sh: three boots).

guest-test.py --bench-postcopy BUILD_DIR -- post-copy, stock against
patched, in one rxe guest boot: ib_read_lat (4 KiB, the anchor), then the
guest booted under stock QEMU migrated on through BENCH_POSTCOPY_CHAIN:
stock -> stock over TCP with postcopy-preempt off and on, and patched ->
patched over rdma, dynamic and pin-all, each switching to post-copy after
the first round through RAM (as the post-copy step above).  Each prints one
"guest-postcopy:" line of key=value figures:

  - the guest's: the slow reads of its first-touch probe
    (guest/memcheck-init.c) that began while the destination ran with pages
    missing (from the last poll that saw it not yet running to the first
    that saw it completed): of the "recent" reads, which sweep the pages
    stale at the switch, the count, p50, p99 and max; of the "old" reads,
    which meet present pages with the same exposure to interrupts and
    scheduling, the count, p50 and max (the noise in the recent figures);
    and the probe's recent line of the pass during which post-copy ran;
  - QEMU's, the destination's query-migrate with postcopy-blocktime on:
    blocktime and per-vCPU blocktime (ms), mean fault latency (us), the
    number of faults and the buckets of their p50 and p99 (from
    postcopy-latency-dist); the source's postcopy-bytes and
    postcopy-requests;
  - the phase: from the source's stop for the switch (its status leaves
    "active") to the destination's completed, and the part of it the
    destination ran; before it, from migrate-start-postcopy to the stop
    (the source ends the iteration in progress first).  All polled every
    20 ms.

guest-test.py --median-postcopy LOG... -- the median of each figure over
the "guest-postcopy:" lines of several runs (each run's in brackets) and
the patched ones against stock's best (scripts/bench-qemu-postcopy.sh).
"""
import json
import os
import re
import statistics
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GUEST_MIB = 256
CHAIN = [  # (source, destination, pin_all, keyed)
    ("patched", "patched", False, False),
    ("patched", "stock", True, False),
    ("stock", "patched", False, False),
    ("patched", "patched", True, True),
    ("patched", "stock", False, False),
    ("stock", "patched", True, False),
]
BENCH_CHAIN = [  # (label or None: not measured, source, destination, transport, pin_all)
    ("stock tcp", "stock", "stock", "tcp", False),
    ("stock rdma dynamic", "stock", "stock", "rdma", False),
    ("stock rdma pin-all", "stock", "stock", "rdma", True),
    (None, "stock", "patched", "rdma", False),
    ("patched rdma dynamic", "patched", "patched", "rdma", False),
    ("patched rdma pin-all", "patched", "patched", "rdma", True),
]
BENCH_POSTCOPY_CHAIN = [  # (label or None: pre-copy, not measured, source, destination,
    #                         transport, postcopy-preempt, pin_all)
    ("stock tcp", "stock", "stock", "tcp", False, False),
    ("stock tcp preempt", "stock", "stock", "tcp", True, False),
    (None, "stock", "patched", "rdma", False, False),
    ("patched rdma dynamic", "patched", "patched", "rdma", False, False),
    ("patched rdma pin-all", "patched", "patched", "rdma", False, True),
]
POSTCOPY_CAPS = ("postcopy-ram", "postcopy-preempt", "postcopy-blocktime")
PHASE_POLL_S = 0.02
MIGRATE_TIMEOUT = 300
QMP_TIMEOUT = 60
PASS_TIMEOUT = 300
POSTCOPY_PIN_ALL = (False, True)


def log(msg):
    print(msg, flush=True)


class Qmp:
    """A QMP client that keeps the MIGRATION events it reads.  Out-of-band
    execution is enabled when QEMU offers it: a command with oob=True runs
    even while the main loop waits (e.g. on a vCPU that holds the BQL and
    waits for a page post-copy has not brought yet), and events come then
    too."""
    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX)
        for _ in range(300):
            try:
                self.sock.connect(path)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"no QMP socket {path}")
        self.buf = b""
        self.ids = 0
        self.statuses = []  # the MIGRATION events' statuses, in order
        greeting = json.loads(self.line(QMP_TIMEOUT, "greeting"))
        oob = "oob" in greeting["QMP"].get("capabilities", [])
        self.ok("qmp_capabilities", **({"enable": ["oob"]} if oob else {}))

    def line(self, timeout, what):
        """The next line QEMU sent, waiting up to TIMEOUT: a QEMU whose main
        loop hangs fails the step rather than the run."""
        deadline = time.time() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.time()
            if left <= 0:
                raise QmpTimeout(f"{self.path}: no {what} within {timeout:.0f} s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise RuntimeError(f"{self.path}: QMP closed, waiting for {what}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def read(self, what, timeout=QMP_TIMEOUT):
        """The next message that is not an event (events are kept)."""
        while True:
            message = json.loads(self.line(timeout, what))
            if message.get("event") == "MIGRATION":
                self.statuses.append(message["data"]["status"])
            if "event" not in message:
                return message

    def send(self, name, oob=False, **args):
        """Sends a command; its id."""
        self.ids += 1
        request = {"exec-oob" if oob else "execute": name, "arguments": args, "id": self.ids}
        self.sock.sendall((json.dumps(request) + "\n").encode())
        return self.ids

    def cmd(self, name, oob=False, _timeout=QMP_TIMEOUT, **args):
        sent = self.send(name, oob, **args)
        while True:
            reply = self.read(f"answer to {name}", _timeout)
            if reply.get("id") == sent:
                return reply

    def ok(self, name, oob=False, **args):
        reply = self.cmd(name, oob, **args)
        if "error" in reply:
            raise RuntimeError(f"{name}: {reply['error']['desc']}")
        return reply["return"]

    def set_capabilities(self, states, check=True):
        """migrate-set-capabilities with STATES (name: on); with CHECK off
        the reply, a refusal too."""
        capabilities = [{"capability": c, "state": on} for c, on in states.items()]
        if check:
            return self.ok("migrate-set-capabilities", capabilities=capabilities)
        return self.cmd("migrate-set-capabilities", capabilities=capabilities)

    def status_now(self):
        """query-migrate's status; None when the main loop gives no answer
        within 5 s (it waits on a blocked vCPU)."""
        try:
            return self.cmd("query-migrate", _timeout=5).get("return", {}).get("status")
        except QmpTimeout:
            return None

    def wait_status(self, status, timeout=QMP_TIMEOUT):
        """Waits until the migration's status is STATUS, as query-migrate or a
        MIGRATION event (with the 'events' capability) says. One query at a
        time: while the main loop waits on a blocked vCPU the query waits
        with it and events still count; QEMU stops reading a monitor with 8
        in-band commands queued, out-of-band ones too. Fails on completed or
        failed instead."""
        deadline = time.time() + timeout
        query = None
        while status not in self.statuses:
            ended = {"completed", "failed"} & set(self.statuses)
            if ended or time.time() > deadline:
                raise RuntimeError(f"{self.path}: migration {self.statuses}, not {status}")
            if query is None:
                query = self.send("query-migrate")
            try:
                reply = self.read("answer to query-migrate", max(0.1, min(1, deadline - time.time())))
            except QmpTimeout:
                continue
            if reply.get("id") != query:
                continue
            query = None
            now = reply.get("return", {}).get("status")
            if now == status:
                return status
            if now in ("completed", "failed"):
                self.statuses.append(now)
            time.sleep(0.2)
        return status


class QmpTimeout(RuntimeError):
    """No message from QEMU in time."""


class Vm:
    """One QEMU process running (or about to receive) the test guest."""
    count = 0

    def __init__(self, env, variant, incoming=False):
        Vm.count += 1
        self.name = f"{Vm.count}-{variant}"
        self.variant = variant
        self.env = env
        d = env.dir
        self.vport = os.path.join(d, self.name + ".vport")
        self.serial = os.path.join(d, self.name + ".serial")
        args = [os.path.join(env.build, variant, "qemu-system-x86_64"),
                "-M", "q35", "-m", str(GUEST_MIB), "-accel", "tcg", "-display", "none",
                "-nodefaults", "-kernel", env.kernel, "-initrd", env.initrd,
                "-append", "console=ttyS0 quiet " + env.append,
                "-serial", "file:" + self.serial,
                "-device", "virtio-serial-pci",
                "-chardev", f"file,id=vport,path={self.vport}",
                "-device", "virtserialport,chardev=vport,name=memcheck",
                "-qmp", f"unix:{d}/{self.name}.qmp,server=on,wait=off"]
        for key, path in env.keys.items():
            args += ["-object", f"secret,id={key},file={path},format=raw"]
        if incoming:
            args += ["-incoming", "defer"]
        self.stderr = open(os.path.join(d, self.name + ".log"), "w")
        self.proc = subprocess.Popen(args, stdout=self.stderr, stderr=subprocess.STDOUT)
        self.qmp = Qmp(f"{d}/{self.name}.qmp")

    def prepare(self, pin_all, key):
        self.qmp.set_capabilities({"rdma-pin-all": pin_all})
        if key is not None:
            self.qmp.ok("migrate-set-parameters", **{"x-rdma-auth-secret": key})

    def passes(self):
        """The guest's check lines printed by this process: (ok count, corrupt lines)."""
        try:
            text = open(self.vport, errors="replace").read()
        except FileNotFoundError:
            return 0, []
        return len(re.findall(r"^memcheck: pass \d+ ok$", text, re.M)), \
            re.findall(r"^memcheck: pass .* CORRUPT.*$", text, re.M)

    def wait_passes(self, n, timeout=PASS_TIMEOUT):
        t0 = time.time()
        while True:
            ok, corrupt = self.passes()
            if corrupt:
                raise RuntimeError(f"{self.name}: the guest found its memory corrupt: {corrupt[0]}")
            if ok >= n:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: QEMU exited ({self.proc.returncode}) before {n} passes")
            if time.time() - t0 > timeout:
                raise RuntimeError(f"{self.name}: {ok} of {n} passes after {timeout} s")
            time.sleep(0.5)

    def quit(self):
        if self.proc.poll() is None:
            try:
                self.qmp.cmd("quit")
            except OSError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Env:
    def __init__(self, build):
        self.build = build
        self.dir = tempfile.mkdtemp(prefix="qemu-guest-test-")
        self.ip = os.environ.get("RXE_VM_IP") or "198.18.0.1"
        self.port = 4444
        cache = os.environ.get("RXE_VM_CACHE", "/var/cache/rxe-vm")
        kernels = sorted(os.listdir(os.path.join(cache, "kernel")))
        boot = os.path.join(cache, "kernel", kernels[-1], "boot")
        self.kernel = os.path.join(boot, [f for f in os.listdir(boot) if f.startswith("vmlinuz")][0])
        self.initrd = os.path.join(self.dir, "memcheck.cpio")
        self.append = subprocess.run([os.path.join(HERE, "guest", "build-initramfs.sh"), self.initrd],
                                     check=True, capture_output=True, text=True).stdout.strip()
        self.keys = {}
        for key in ("key-a", "key-b"):
            path = os.path.join(self.dir, key)
            with open(path, "wb") as f:
                f.write(os.urandom(32))
            self.keys[key] = path

    def uri(self, transport="rdma"):
        self.port += 1
        return f"{transport}:{self.ip}:{self.port}"


def wait_migration(vm, timeout=MIGRATE_TIMEOUT):
    t0 = time.time()
    while True:
        info = vm.qmp.ok("query-migrate")
        if info.get("status") in ("completed", "failed", "cancelled"):
            return info
        if time.time() - t0 > timeout:
            raise RuntimeError(f"migration not finished after {timeout} s: {info}")
        time.sleep(0.2)


def migrate(env, src, dst_variant, pin_all, key, transport="rdma", quiet=False):
    """Migrates SRC's guest to a new DST_VARIANT QEMU; returns (it, query-migrate)."""
    mode = "pin-all" if pin_all else "dynamic"
    what = f"{src.variant} -> {dst_variant}, {transport} {mode}{', keyed' if key else ''}"
    dst = Vm(env, dst_variant, incoming=True)
    for vm in (src, dst):
        vm.prepare(pin_all, key)
    uri = env.uri(transport)
    dst.qmp.ok("migrate-incoming", uri=uri)
    src.qmp.ok("migrate", uri=uri)
    info = wait_migration(src)
    if info["status"] != "completed":
        raise RuntimeError(f"{what}: {info['status']}: {info.get('error-desc')}")
    for _ in range(100):
        if dst.qmp.ok("query-status")["status"] == "running":
            break
        time.sleep(0.1)
    else:
        raise RuntimeError(f"{what}: the destination does not run: {dst.qmp.ok('query-status')}")
    src.quit()
    dst.wait_passes(2)
    ram = info.get("ram", {})
    if not quiet:
        log(f"guest-test: PASS {what}: completed, total {info['total-time']} ms, "
            f"downtime {info['downtime']} ms, {ram.get('transferred', 0) >> 20} MiB transferred; "
            f"the guest checked its memory twice on the destination")
    return dst, info


def postcopy(env, src, pin_all):
    """Migrates SRC's guest to a new patched QEMU, switching to post-copy
    after the first round through RAM; returns the destination."""
    what = f"{src.variant} -> patched, rdma {'pin-all' if pin_all else 'dynamic'}, post-copy"
    dst = Vm(env, "patched", incoming=True)
    for vm in (src, dst):
        vm.prepare(pin_all, None)
        vm.qmp.set_capabilities({"postcopy-ram": True})
    dst.qmp.set_capabilities({"postcopy-blocktime": True})
    # Pre-copy must not converge before the switch.
    src.qmp.ok("migrate-set-parameters", **{"downtime-limit": 1})
    uri = env.uri()
    dst.qmp.ok("migrate-incoming", uri=uri)
    src.qmp.ok("migrate", uri=uri)
    t0 = time.time()
    while True:
        info = src.qmp.ok("query-migrate")
        if info.get("status") not in ("setup", "active"):
            raise RuntimeError(f"{what}: {info.get('status')} before the switch: {info.get('error-desc')}")
        if info.get("ram", {}).get("dirty-sync-count", 0) >= 2:
            break
        if time.time() - t0 > MIGRATE_TIMEOUT:
            raise RuntimeError(f"{what}: the first round did not end: {info}")
        time.sleep(0.1)
    src.qmp.ok("migrate-start-postcopy")
    info = wait_migration(src)
    if info["status"] != "completed":
        raise RuntimeError(f"{what}: {info['status']}: {info.get('error-desc')}")
    ram = info.get("ram", {})
    if not ram.get("postcopy-bytes"):
        raise RuntimeError(f"{what}: completed without post-copy: {info}")
    if src.qmp.ok("query-status")["status"] == "running":
        raise RuntimeError(f"{what}: the source runs after post-copy")
    dst_info = wait_migration(dst)
    if dst_info["status"] != "completed" or dst.qmp.ok("query-status")["status"] != "running":
        raise RuntimeError(f"{what}: the destination: {dst_info}, {dst.qmp.ok('query-status')}")
    src.quit()
    dst.wait_passes(2)
    figures = {k: v for k, v in dst_info.items() if k.startswith("postcopy-")}
    log(f"guest-test: PASS {what}: completed, total {info['total-time']} ms, "
        f"{ram.get('transferred', 0) >> 20} MiB transferred, of which the destination pulled "
        f"{ram['postcopy-bytes'] >> 20} MiB in post-copy ({ram.get('postcopy-requests', 0)} faults "
        f"served on their own); the guest checked its memory twice on the destination; "
        f"the destination's query-migrate: {json.dumps(figures)}")
    return dst


def refusals(env, vm):
    """What post-copy with rdma refuses, each with its message, on VM (a
    running patched source, left as it was) and on a patched destination.
    A source that migrated over rdma before refuses the capabilities
    themselves; a fresh one refuses the migrate command."""
    def refused(reply, expected, what):
        error = reply.get("error", {}).get("desc", "")
        if not any(e in error for e in expected):
            raise RuntimeError(f"{what}: expected a refusal with one of {expected}, got {reply}")
        return error

    seen = []
    # postcopy-preempt: QEMU's own refusal of it on a one-channel URI may come first.
    for extra, expected in ((["postcopy-preempt"], ("RDMA and postcopy-preempt can't be used together",
                                                    "Migration requires multi-channel URIs")),
                            (["release-ram"], ("RDMA and release-ram can't be used together",)),
                            (["return-path"], ("RDMA: a librdmamig source opens no return path",))):
        names = ["postcopy-ram"] + extra
        reply = vm.qmp.set_capabilities(dict.fromkeys(names, True), check=False)
        if "error" not in reply:
            reply = vm.qmp.cmd("migrate", uri=env.uri())
        seen.append(refused(reply, expected, f"{names} with rdma"))
        vm.qmp.set_capabilities(dict.fromkeys(names, False))
    dst = Vm(env, "patched", incoming=True)
    dst.qmp.ok("migrate-incoming", uri=env.uri())
    seen.append(refused(dst.qmp.set_capabilities({"postcopy-ram": True}, check=False),
                        ("RDMA: postcopy-ram must be set before migrate-incoming",),
                        "postcopy-ram after migrate-incoming"))
    dst.proc.kill()
    dst.proc.wait()
    if vm.qmp.ok("query-status")["status"] != "running":
        raise RuntimeError("the source's guest stopped after the refusals")
    log("guest-test: PASS refusals of post-copy with rdma: " + " | ".join(seen))


def wrong_key(env, src):
    what = f"{src.variant} -> patched with another key"
    dst = Vm(env, "patched", incoming=True)
    src.prepare(False, "key-a")
    dst.prepare(False, "key-b")
    uri = env.uri()
    dst.qmp.ok("migrate-incoming", uri=uri)
    # The patched source connects within the migrate command: the refusal
    # is its error (and query-migrate's).
    error = src.qmp.cmd("migrate", uri=uri).get("error", {}).get("desc", "")
    info = wait_migration(src)
    transferred = info.get("ram", {}).get("transferred", 0)
    error = error or info.get("error-desc", "")
    if info["status"] != "failed" or "auth" not in error.lower() or transferred:
        raise RuntimeError(f"{what}: expected a failure on authentication before any RAM moved: {info}")
    if src.qmp.ok("query-status")["status"] != "running":
        raise RuntimeError(f"{what}: the source guest stopped")
    before = src.passes()[0]
    src.wait_passes(before + 1)
    dst.proc.kill()
    dst.proc.wait()
    log(f"guest-test: PASS {what}: refused ({error!r}), no RAM transferred, the source goes on")
    src.prepare(False, "")


def killed_source(env, src):
    what = f"{src.variant} -> patched, source killed mid-transfer"
    dst = Vm(env, "patched", incoming=True)
    uri = env.uri()
    dst.qmp.ok("migrate-incoming", uri=uri)
    # Slow enough to be killed in the middle.
    src.qmp.ok("migrate-set-parameters", **{"max-bandwidth": 8 << 20})
    src.qmp.ok("migrate", uri=uri)
    t0 = time.time()
    while src.qmp.ok("query-migrate").get("ram", {}).get("transferred", 0) < 16 << 20:
        if time.time() - t0 > MIGRATE_TIMEOUT:
            raise RuntimeError(f"{what}: the migration does not start")
        time.sleep(0.1)
    src.proc.send_signal(signal.SIGKILL)
    src.proc.wait()
    try:
        rc = dst.proc.wait(120)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: the destination did not end the migration within 120 s")
    if rc == 0:
        raise RuntimeError(f"{what}: the destination exited with status 0")
    ok, corrupt = dst.passes()
    if ok or corrupt or os.path.getsize(dst.serial):
        raise RuntimeError(f"{what}: the destination ran the half-migrated guest")
    tail = open(dst.stderr.name).read().strip().splitlines()[-3:]
    log(f"guest-test: PASS {what}: the destination failed (exit {rc}) without running the guest: "
        + " | ".join(tail))


def start_postcopy_at_once(env, what, uri=None):
    """A new guest migrated patched -> patched, switched to post-copy as soon
    as the migration is active (most of its RAM still on the source);
    returns (source, destination) once the destination runs it."""
    src = Vm(env, "patched")
    dst = Vm(env, "patched", incoming=True)
    for vm in (src, dst):
        vm.qmp.set_capabilities({"postcopy-ram": True, "events": True})
    uri = uri or env.uri()
    # The destination stays up after a failure, to answer query-migrate.
    dst.qmp.ok("migrate-incoming", uri=uri, **{"exit-on-error": False})
    src.qmp.ok("migrate", uri=uri)
    src.qmp.ok("migrate-start-postcopy")
    # Running, the destination has the guest: the source must never again.
    t0 = time.time()
    while dst.qmp.ok("query-status")["status"] != "running":
        status = src.qmp.ok("query-migrate").get("status")
        if status not in ("setup", "active", "device", "postcopy-active") or time.time() - t0 > MIGRATE_TIMEOUT:
            raise RuntimeError(f"{what}: the destination does not run (source {status})")
        time.sleep(0.05)
    return src, dst


def killed_postcopy_destination(env):
    what = "patched -> patched, destination killed in post-copy"
    src, dst = start_postcopy_at_once(env, what)
    dst.proc.kill()
    dst.proc.wait()
    info = wait_migration(src)
    if info["status"] != "failed":
        raise RuntimeError(f"{what}: expected the source to fail: {info}")
    time.sleep(2)
    state = src.qmp.ok("query-status")["status"]
    if state == "running":
        raise RuntimeError(f"{what}: the source runs its guest again")
    src.quit()
    log(f"guest-test: PASS {what}: the source failed ({info.get('error-desc')!r}) "
        f"and its guest stays stopped ({state})")


def killed_postcopy_source(env):
    """The source dies while the destination's guest runs on pages still
    missing: the destination fails the migration, says how many pages are
    missing, stays up, and its guest never runs on a missing page (its
    vCPUs wait on them: its check never reports corrupt memory)."""
    what = "patched -> patched, source killed in post-copy"
    src, dst = start_postcopy_at_once(env, what)
    src.proc.kill()
    src.proc.wait()
    # By query-migrate, or by the event if the main loop waits on a vCPU
    # that holds the BQL and waits on a missing page (no answer then).
    dst.qmp.wait_status("failed", 60)
    time.sleep(1)
    missing = re.search(r"(\d+) pages missing, vCPUs touching one stay blocked", open(dst.stderr.name).read())
    if not missing or int(missing.group(1)) == 0:
        raise RuntimeError(f"{what}: expected the destination to report pages missing")
    try:
        info = dst.qmp.ok("query-migrate")
        if info["status"] != "failed" or missing.group(0) not in info.get("error-desc", ""):
            raise RuntimeError(f"{what}: query-migrate: {info}")
        reported = f"query-migrate: failed, {info['error-desc']!r}"
    except QmpTimeout:
        reported = "query-migrate had no answer (the main loop waits on a vCPU blocked on a missing page)"
    before = dst.passes()
    time.sleep(10)
    ok, corrupt = dst.passes()
    if corrupt or dst.proc.poll() is not None:
        raise RuntimeError(f"{what}: the destination's guest ran on missing pages ({corrupt}) "
                           f"or QEMU ended ({dst.proc.poll()})")
    dst.proc.kill()
    dst.proc.wait()
    log(f"guest-test: PASS {what}: the destination failed, {missing.group(1)} pages missing "
        f"in its log; {reported}; it stays up; its guest checked its memory {before[0]} times before the "
        f"failure was reported and {ok} after 10 s more, never corrupt (vCPUs on a missing page wait)")


class Wire:
    """A second rxe link in this guest that can be cut: a veth pair, rxe
    devices rxea (198.18.1.1, vetha) and rxeb (198.18.1.2, vethb), and
    routing rules so that traffic between the two addresses crosses the
    pair instead of the local loopback (rdma_cm checks the route back to
    the peer through the device a request came in on)."""
    SOURCE, DESTINATION = "198.18.1.1", "198.18.1.2"

    def __init__(self, env):
        self.env = env
        a, b = self.SOURCE, self.DESTINATION
        cmds = ["ip link add vetha type veth peer name vethb",
                f"ip addr add {a}/32 dev vetha", f"ip addr add {b}/32 dev vethb"]
        cmds += [f"sysctl -qw net.ipv4.conf.{d}.accept_local=1 net.ipv4.conf.{d}.rp_filter=0"
                 for d in ("vetha", "vethb", "all", "default")]
        cmds += ["ip link set vetha up", "ip link set vethb up",
                 f"ip route add {b} dev vetha src {a} table 100",
                 f"ip route add {a} dev vethb src {b} table 101",
                 f"ip rule add pref 10 from {a} to {b} oif vetha lookup 100",
                 f"ip rule add pref 11 from {b} to {a} oif vethb lookup 101",
                 f"ip rule add pref 12 to {b} iif lo lookup 100",
                 f"ip rule add pref 13 to {a} iif lo lookup 101",
                 "ip rule del pref 0 lookup local", "ip rule add pref 100 lookup local",
                 "rdma link add rxea type rxe netdev vetha", "rdma link add rxeb type rxe netdev vethb"]
        for c in cmds:
            subprocess.run(c.split(), check=True)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        """Leaves the guest as it was: later steps of the same boot (the
        doctor compares every device with ibv_devinfo) see rxe0 alone. A
        QEMU left by a failed step goes first: an rxe device in use cannot
        be deleted."""
        kill_all(self.env)
        cmds = ["rdma link delete rxea", "rdma link delete rxeb", "ip link delete vetha",
                *(f"ip rule del pref {p}" for p in (10, 11, 12, 13)),
                "ip rule add pref 0 lookup local", "ip rule del pref 100"]
        for c in cmds:
            subprocess.run(c.split(), check=False, timeout=30)

    def cut(self, lost):
        """Drops every packet both ways (lost), or none."""
        for d in ("vetha", "vethb"):
            op = "add dev {} root netem loss 100%" if lost else "del dev {} root"
            subprocess.run(["tc", "qdisc", *op.format(d).split()], check=True)


def postcopy_link_loss_recovered(env):
    """The link is cut while the destination's guest runs in post-copy: both
    sides go postcopy-paused; with the link back, QEMU's own commands
    (migrate-recover on the destination, out-of-band as QEMU provides it for
    a main loop that may wait on a blocked vCPU, then migrate resume=true on
    the source) recover it: postcopy-recover, postcopy-active, completed,
    and the guest checks its memory on the destination."""
    what = "patched -> patched, link lost in post-copy, recovered"
    with Wire(env) as wire:
        uri = f"rdma:{wire.DESTINATION}:{env.port + 100}"
        src, dst = start_postcopy_at_once(env, what, uri)
        wire.cut(True)
        log(f"guest-test: {what}: the destination runs; link cut")
        t0 = time.time()
        # The library's liveness check notices (10 s; much longer under a loaded TCG).
        for vm in (dst, src):
            vm.qmp.wait_status("postcopy-paused", MIGRATE_TIMEOUT)
        paused = time.time() - t0
        # Recovery waits for QEMU's commands, not for the link.
        wire.cut(False)
        time.sleep(2)
        for vm in (dst, src):
            now = vm.qmp.status_now()
            if now not in (None, "postcopy-paused") or vm.qmp.statuses[-1:] not in ([], ["postcopy-paused"]):
                raise RuntimeError(f"{what}: {vm.name} went on without migrate-recover: {now}, {vm.qmp.statuses}")
        log(f"guest-test: {what}: both paused after {paused:.1f} s; link back, recovering")
        dst.qmp.ok("migrate-recover", oob=True, uri=uri)
        dst.qmp.wait_status("postcopy-recover")
        src.qmp.ok("migrate", uri=uri, resume=True)
        for vm in (src, dst):
            vm.qmp.wait_status("completed", MIGRATE_TIMEOUT)
        src.quit()
        dst.wait_passes(dst.passes()[0] + 2)
        dst.quit()
    log(f"guest-test: PASS {what}: both sides postcopy-paused {paused:.1f} s after the cut, stayed so with the "
        f"link back, recovered by migrate-recover (out-of-band) and migrate resume=true (the destination's MIGRATION "
        f"events: {' -> '.join(dst.qmp.statuses)}); the guest checked its memory twice on the destination")


def perftest(env, args):
    """Runs perftest's ARGS over rxe as server and client (three tries: the
    client may come before the server listens); the client's header line
    and the line of figures under it."""
    for _ in range(3):
        server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
        client = subprocess.run(args + [env.ip], capture_output=True, text=True)
        server.wait(30)
        lines = client.stdout.splitlines()
        for i, line in enumerate(lines[:-1]):
            if line.strip().startswith("#bytes"):
                return line, lines[i + 1]
    raise RuntimeError(f"{args[0]} gave no figures: {client.stdout} {client.stderr}")


def ib_write_bw(env):
    """ib_write_bw's average at 1 MiB messages over rxe, Gbit/s."""
    dev = os.environ.get("RXE_VM_DEV", "rxe0")
    _, figures = perftest(env, ["ib_write_bw", "-R", "-F", "-d", dev, "-s", "1048576", "-t", "16", "-D", "5",
                                "--report_gbits"])
    return float(figures.split()[3])


def ib_read_lat(env):
    """ib_read_lat's t_typical and 99th percentile at 4 KiB over rxe, us."""
    dev = os.environ.get("RXE_VM_DEV", "rxe0")
    header, figures = perftest(env, ["ib_read_lat", "-R", "-F", "-d", dev, "-s", "4096", "-n", "10000"])
    # "... t_typical[usec] ... 99% percentile[usec] 99.9% percentile[usec]"
    values = dict(zip(header.replace(" percentile[usec]", "").split(), figures.split()))
    return float(values["t_typical[usec]"]), float(values["99%"])


class LineTimes(threading.Thread):
    """When each line of a growing file (a guest's virtio port) appeared:
    (time.monotonic(), line), polled every 10 ms."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.lines = []
        self.done = threading.Event()
        self.start()

    def run(self):
        pending, offset = "", 0
        while not self.done.is_set():
            try:
                with open(self.path, errors="replace") as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
            except FileNotFoundError:
                chunk = ""
            now = time.monotonic()
            *complete, pending = (pending + chunk).split("\n")
            self.lines += [(now, line) for line in complete]
            time.sleep(0.01)

    def slow_touches(self, kind):
        """Every slow read of KIND (recent, old) the guest reported: [(when it began, us)]."""
        touches = []
        for seen, line in list(self.lines):
            m = re.match(rf"memcheck: pass \d+ slow {kind} touches \(us before this line:us\):(.*)$", line)
            for age, us in (t.split(":") for t in (m.group(1).split() if m else [])):
                touches.append((seen - float(age) / 1e6, float(us)))
        return touches

    def passes(self, kind):
        """[(when its line appeared, pass, the figures of its KIND probe line)]."""
        return [(seen, int(m.group(1)), m.group(2)) for seen, line in list(self.lines)
                for m in [re.match(rf"memcheck: pass (\d+) {kind} touches: (.*)$", line)] if m]


def percentile(values, percent):
    """The nearest-rank PERCENT percentile of VALUES (None if empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * percent // 100) - 1)]


def dist_percentile_us(dist, percent):
    """The lower bound, us, of the bucket of postcopy-latency-dist
    (bucket N: [2^N, 2^(N+1)) us) that holds the PERCENT percentile."""
    total = sum(dist)
    if not total:
        return None
    rank, seen = -(-total * percent // 100), 0
    for n, count in enumerate(dist):
        seen += count
        if seen >= rank:
            return 1 << n


def postcopy_measured(env, src, dst_variant, transport, preempt, pin_all):
    """Migrates SRC's guest to a new DST_VARIANT QEMU, switching to
    post-copy after the first round; returns (it, its figures)."""
    what = f"{src.variant} -> {dst_variant}, {transport} post-copy"
    dst = Vm(env, dst_variant, incoming=True)
    lines = LineTimes(dst.vport)
    caps = {"postcopy-ram": True, "postcopy-preempt": preempt}
    for vm in (src, dst):
        vm.prepare(pin_all, None)
        vm.qmp.set_capabilities(caps)
    dst.qmp.set_capabilities({"postcopy-blocktime": True})
    # Pre-copy must not converge before the switch.
    src.qmp.ok("migrate-set-parameters", **{"downtime-limit": 1, "max-bandwidth": 0})
    uri = env.uri(transport)
    dst.qmp.ok("migrate-incoming", uri=uri)
    src.qmp.ok("migrate", uri=uri)
    t0 = time.time()
    while src.qmp.ok("query-migrate").get("ram", {}).get("dirty-sync-count", 0) < 2:
        if time.time() - t0 > MIGRATE_TIMEOUT:
            raise RuntimeError(f"{what}: the first round did not end")
        time.sleep(0.1)
    command = time.monotonic()
    src.qmp.ok("migrate-start-postcopy")
    # A status is read after its query is sent: when a reply says "not
    # running", the guest did not run on the destination when it was sent;
    # the source stopped (left "active" for the switch) before the reply.
    not_running, stopped = command, None
    while True:
        asked = time.monotonic()
        if stopped is None and src.qmp.ok("query-migrate").get("status") not in ("setup", "active"):
            stopped = asked
        asked = time.monotonic()
        if dst.qmp.ok("query-status")["status"] == "running":
            break
        not_running = asked
        if not_running - command > MIGRATE_TIMEOUT:
            raise RuntimeError(f"{what}: the destination does not run")
        time.sleep(PHASE_POLL_S)
    running = time.monotonic()
    while True:
        dst_info = dst.qmp.ok("query-migrate")
        done = time.monotonic()
        if dst_info.get("status") in ("completed", "failed", "cancelled"):
            break
        if done - command > MIGRATE_TIMEOUT:
            raise RuntimeError(f"{what}: the destination did not complete: {dst_info}")
        time.sleep(PHASE_POLL_S)
    info = wait_migration(src)
    if info["status"] != "completed" or dst_info["status"] != "completed":
        raise RuntimeError(f"{what}: source {info['status']} ({info.get('error-desc')}), "
                           f"destination {dst_info['status']}")
    if not info.get("ram", {}).get("postcopy-bytes"):
        raise RuntimeError(f"{what}: completed without post-copy: {info}")
    src.quit()
    # Once a pass ended after post-copy, every read of the window is reported.
    t0 = time.time()
    while not [p for p in lines.passes("old") if p[0] > done]:
        if time.time() - t0 > PASS_TIMEOUT:
            raise RuntimeError(f"{what}: the guest reports no pass after post-copy")
        time.sleep(0.5)
    lines.done.set()
    lines.join()
    dst.wait_passes(2)

    recent = [us for began, us in lines.slow_touches("recent") if not_running <= began <= done]
    old = [us for began, us in lines.slow_touches("old") if not_running <= began <= done]
    passes = lines.passes("recent")
    dist = dst_info.get("postcopy-latency-dist", [])
    ram = info.get("ram", {})
    figures = {
        "window_ms": round((done - not_running) * 1000),
        "recent": len(recent),
        "p50_us": percentile(recent, 50),
        "p99_us": percentile(recent, 99),
        "max_us": percentile(recent, 100),
        "old": len(old),
        "old_p50_us": percentile(old, 50),
        "old_max_us": percentile(old, 100),
        "blocktime_ms": dst_info.get("postcopy-blocktime"),
        "vcpu_blocktime_ms": dst_info.get("postcopy-vcpu-blocktime"),
        "qemu_faults": sum(dist),
        "qemu_latency_us": round(dst_info["postcopy-latency"] / 1000, 1) if sum(dist) else None,
        "qemu_p50_bucket_us": dist_percentile_us(dist, 50),
        "qemu_p99_bucket_us": dist_percentile_us(dist, 99),
        "postcopy_requests": ram.get("postcopy-requests"),
        "postcopy_mib": round(ram.get("postcopy-bytes", 0) / 2**20, 1),
        "react_ms": round((stopped - command) * 1000),
        "phase_ms": round((done - stopped) * 1000),
        "run_ms": round((done - running) * 1000),
        "pass": f"'pass {passes[0][1]}: {passes[0][2]}'" if passes else None,
    }
    return dst, figures


def bench_postcopy(env):
    typical, p99 = ib_read_lat(env)
    log(f"guest-postcopy: ib_read_lat: t_typical_us={typical} p99_us={p99}")
    vm = Vm(env, BENCH_POSTCOPY_CHAIN[0][1])
    vm.wait_passes(2)
    for label, src_variant, dst_variant, transport, preempt, pin_all in BENCH_POSTCOPY_CHAIN:
        assert vm.variant == src_variant
        if label is None:
            vm.qmp.ok("migrate-set-parameters", **{"max-bandwidth": 0})
            vm, _ = migrate(env, vm, dst_variant, pin_all, None, transport, quiet=True)
            continue
        vm, figures = postcopy_measured(env, vm, dst_variant, transport, preempt, pin_all)
        vm.qmp.set_capabilities(dict.fromkeys(POSTCOPY_CAPS, False))
        log(f"guest-postcopy: {label}: " + " ".join(
            f"{k}={json.dumps(v, separators=(',', ':')) if isinstance(v, list) else v}" for k, v in figures.items()))
    vm.quit()


def median_postcopy(logs):
    """The median of each figure of each configuration over LOGS'
    guest-postcopy lines, each run's in brackets; then the patched
    configurations against stock's best (the lower of its medians)."""
    runs = {}
    line = re.compile(r"^guest-postcopy: (.+?): (.*)$", re.M)
    for path in logs:
        for m in line.finditer(open(path, errors="replace").read()):
            for k, v in re.findall(r"(\w+)=([^\s']+|'[^']*')", m.group(2)):
                runs.setdefault(m.group(1), {}).setdefault(k, []).append(v)
    medians = {}
    for label, figures in runs.items():
        print(f"{label}:")
        for key, values in figures.items():
            numbers = [float(v) for v in values if re.fullmatch(r"-?[\d.]+", v)]
            med = statistics.median(numbers) if numbers else None
            medians.setdefault(label, {})[key] = med
            shown = f"{med:g}" if med is not None else "-"
            print(f"  {key:20} {shown:>10}  [{', '.join(values)}]")
    stock = [f for label, f in medians.items() if label.startswith("stock")]
    for label, f in medians.items():
        if not label.startswith("patched"):
            continue
        for key, target in (("p50_us", 0.1), ("qemu_latency_us", 0.1), ("blocktime_ms", 0.2),
                            ("phase_ms", 1.0)):
            best = min((s[key] for s in stock if s.get(key)), default=None)
            if f.get(key) is not None and best:
                print(f"{label}: {key} {f[key]:g} / stock's best {best:g} = {f[key] / best:.3f} "
                      f"(target <= {target})")
    return 0 if runs else 1


def bench(env):
    anchor = ib_write_bw(env)
    log(f"guest-bench: ib_write_bw {anchor:.3f} Gbit/s")
    vm = Vm(env, BENCH_CHAIN[0][1])
    vm.wait_passes(2)
    for label, src_variant, dst_variant, transport, pin_all in BENCH_CHAIN:
        assert vm.variant == src_variant
        vm.qmp.ok("migrate-set-parameters", **{"max-bandwidth": 0})
        vm, info = migrate(env, vm, dst_variant, pin_all, None, transport, quiet=True)
        if label:
            sent = info["ram"]["transferred"]
            gbits = sent * 8 / info["total-time"] / 1e6
            log(f"guest-bench: {label}: total {info['total-time']} ms, downtime {info['downtime']} ms, "
                f"{sent >> 20} MiB, {gbits:.3f} Gbit/s, {gbits / anchor:.3f} of ib_write_bw")
    vm.quit()


def median(logs):
    """The median of each figure of each configuration over LOGS' guest-bench lines."""
    figures = {}
    line = re.compile(r"guest-bench: (.+?): total (\d+) ms, downtime (\d+) ms, (\d+) MiB, "
                      r"([\d.]+) Gbit/s, ([\d.]+) of ib_write_bw")
    for path in logs:
        for m in line.finditer(open(path, errors="replace").read()):
            figures.setdefault(m.group(1), []).append([float(v) for v in m.groups()[1:]])
    print(f"{'configuration':24} {'runs':>4} {'total ms':>9} {'downtime ms':>11} {'MiB':>5} "
          f"{'Gbit/s':>7} {'÷ib_write_bw':>12}")
    for label, runs in figures.items():
        med = [statistics.median(col) for col in zip(*runs)]
        print(f"{label:24} {len(runs):>4} {med[0]:>9.0f} {med[1]:>11.0f} {med[2]:>5.0f} "
              f"{med[3]:>7.3f} {med[4]:>12.3f}")
    return 0 if figures else 1


def main():
    if sys.argv[1] == "--median":
        return median(sys.argv[2:])
    if sys.argv[1] == "--median-postcopy":
        return median_postcopy(sys.argv[2:])
    if sys.argv[1] in ("--bench", "--bench-postcopy"):
        env = Env(sys.argv[2])
        try:
            (bench if sys.argv[1] == "--bench" else bench_postcopy)(env)
        finally:
            kill_all(env)
        return 0
    env = Env(sys.argv[1])
    log(f"guest-test: {env.dir}: booting the guest ({GUEST_MIB} MiB) under the patched QEMU")
    try:
        vm = Vm(env, "patched")
        vm.wait_passes(2)
        log("guest-test: the guest runs")
        for src_variant, dst_variant, pin_all, keyed in CHAIN:
            assert vm.variant == src_variant
            vm, _ = migrate(env, vm, dst_variant, pin_all, "key-a" if keyed else None)
            if keyed:
                vm.prepare(pin_all, "")
        for pin_all in POSTCOPY_PIN_ALL:
            vm = postcopy(env, vm, pin_all)
        vm.qmp.set_capabilities({"postcopy-ram": False, "postcopy-blocktime": False})
        refusals(env, vm)
        wrong_key(env, vm)
        killed_source(env, vm)
        killed_postcopy_destination(env)
        killed_postcopy_source(env)
        postcopy_link_loss_recovered(env)
    except Exception as e:  # noqa: BLE001 -- reported, then the logs
        log(f"guest-test: FAIL {e}")
        for name in sorted(os.listdir(env.dir)):
            if name.endswith((".log", ".serial")):
                log(f"--- {name}:\n" + open(os.path.join(env.dir, name), errors="replace").read()[-2000:])
        return 1
    finally:
        kill_all(env)
    log("guest-test: all steps passed")
    return 0


def kill_all(env):
    for p in subprocess.run(["pgrep", "-f", env.dir], capture_output=True, text=True).stdout.split():
        os.kill(int(p), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
