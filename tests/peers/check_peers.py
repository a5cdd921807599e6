#!/usr/bin/python3
"""Hand check of the interop peers against a running ZooKeeper (tests/peers/RESULTS.md).

    /usr/bin/python3 tests/peers/check_peers.py --connect 127.0.0.1:PORT [--bench] [--only NAME]
        [--reps R] [--seconds S] [--bench-n 1,8,64] [--bench-peers kazoo,curator]

KAZOO_PEER / CURATOR_PEER name other launchers (e.g. a script running Debian's kazoo 2.8.0).

Drives target/peers/curator-peer and target/peers/kazoo-peer (scripts/build-peers.sh) through
the line protocol, lists the nodes with kazoo, and prints what happened. Every scenario uses a
fresh path under /peers-check-<time>. Exits non-zero if an expectation fails.
"""

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

from kazoo.client import KazooClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = {
    "curator": os.environ.get("CURATOR_PEER", os.path.join(ROOT, "target", "peers", "curator-peer")),
    "kazoo": os.environ.get("KAZOO_PEER", os.path.join(ROOT, "target", "peers", "kazoo-peer")),
}
FAILURES = []


def log(msg=""):
    print(msg, flush=True)


def check(cond, what):
    log(("  ok: " if cond else "  FAIL: ") + what)
    if not cond:
        FAILURES.append(what)


class Peer:
    def __init__(self, kind, connect, path, recipe="mutex", ident=None, extra=()):
        self.kind = kind
        self.name = ident or kind
        args = [LAUNCHER[kind], "--connect", connect, "--path", path, "--recipe", recipe,
                "--id", self.name] + list(extra)
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=sys.stderr, text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.expect("ready", 30)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout):
        """The next line, or None if none comes within timeout seconds."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def expect(self, prefix, timeout=10):
        line = self.reply(timeout)
        if line is None or not line.startswith(prefix):
            raise AssertionError("%s: expected %r, got %r" % (self.name, prefix, line))
        return line

    def ask(self, command, prefix, timeout=10):
        self.send(command)
        return self.expect(prefix, timeout)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.expect("bye", 15)
            except (AssertionError, BrokenPipeError):
                pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def node_of(acquired_line):
    return acquired_line.split(" ", 1)[1].rsplit("/", 1)[1]


def children(zk, path):
    """Children sorted by their trailing 10-digit sequence (non-sequential ones last)."""
    def key(name):
        tail = name[-10:]
        return (0, tail) if tail.isdigit() else (1, name)
    return sorted(zk.get_children(path), key=key)


def base(zk):
    path = "/peers-check-%d" % int(time.time() * 1000)
    zk.ensure_path(path)
    return path


# ------------------------------------------------------------------ scenarios


def exclusion(zk, connect, interop):
    """A holder of one library and an acquirer of the other on one mutex path, both ways."""
    extra = ["--interop"] if interop else []
    mode = "--interop" if interop else "stock"
    for holder_kind, waiter_kind in (("curator", "kazoo"), ("kazoo", "curator")):
        path = base(zk) + "/mutex"
        log("%s holds, %s acquires (%s) on %s" % (holder_kind, waiter_kind, mode, path))
        holder = Peer(holder_kind, connect, path, ident=holder_kind + "-holder", extra=extra)
        waiter = Peer(waiter_kind, connect, path, ident=waiter_kind + "-waiter", extra=extra)
        try:
            h = holder.ask("acquire", "acquired")
            log("  %s: %s" % (holder.name, h))
            waiter.send("acquire 2000")
            w = waiter.reply(10)
            log("  %s: acquire 2000 -> %s" % (waiter.name, w))
            log("  children: %s" % children(zk, path))
            if interop:
                check(w == "timeout", "%s waits while %s holds" % (waiter_kind, holder_kind))
                waiter.send("acquire")
                check(waiter.reply(1.5) is None, "%s still waits 1.5 s later" % waiter_kind)
                t0 = time.monotonic()
                holder.ask("release", "released")
                w = waiter.expect("acquired", 10)
                log("  %s: %s (%.1f ms after the release reply)"
                    % (waiter.name, w, (time.monotonic() - t0) * 1000))
                check(True, "%s acquires once %s releases" % (waiter_kind, holder_kind))
            else:
                log("  -> stock %s %s exclude a %s holder"
                    % (waiter_kind, "DOES" if w == "timeout" else "does NOT", holder_kind))
        finally:
            holder.close()
            waiter.close()


def fifo(zk, connect):
    """--interop: a Curator holder, then waiters of both libraries queued in a known order;
    the holds must follow the queue order (by sequence) across the two libraries."""
    path = base(zk) + "/fifo"
    log("FIFO across curator and kazoo (--interop) on %s" % path)
    order = ["curator", "kazoo", "curator", "kazoo", "kazoo", "curator"]
    peers = []
    try:
        holder = Peer("curator", connect, path, ident="c0", extra=["--interop"])
        peers.append(holder)
        log("  c0: %s" % holder.ask("acquire", "acquired"))
        waiters = []
        for i, kind in enumerate(order, 1):
            p = Peer(kind, connect, path, ident="%s%d" % (kind[0], i), extra=["--interop"])
            peers.append(p)
            p.send("acquire")
            # Wait until its node is there, so that the queue order is the order above.
            deadline = time.monotonic() + 10
            while len(zk.get_children(path)) < i + 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            waiters.append(p)
        queue_order = children(zk, path)
        log("  queue: %s" % queue_order)
        granted = []
        current = holder
        for _ in waiters:
            current.ask("release", "released")
            # Exactly one waiter must answer, and it must be the next in the queue.
            got = None
            deadline = time.monotonic() + 10
            while got is None and time.monotonic() < deadline:
                for p in waiters:
                    if p in [g[0] for g in granted]:
                        continue
                    line = p.reply(0.01)
                    if line is not None:
                        got = (p, line)
                        break
            if got is None:
                check(False, "a waiter acquires after %s releases" % current.name)
                return
            granted.append(got)
            log("  %s: %s" % (got[0].name, got[1]))
            time.sleep(0.2)
            others = [p.name for p in waiters
                      if p not in [g[0] for g in granted] and not p.lines.empty()]
            check(not others, "only %s holds (other waiters silent 200 ms later)" % got[0].name)
            current = got[0]
        current.ask("release", "released")
        check([g[0] for g in granted] == waiters,
              "grant order == queue order: %s" % " ".join(g[0].name for g in granted))
        seqs = [node_of(g[1])[-10:] for g in granted]
        check(seqs == sorted(seqs), "sequence numbers increase along the grants: %s" % seqs)
    finally:
        for p in peers:
            p.close()


def same_library_recipes(zk, connect, kind):
    """Each recipe of one library, two or three instances: the behaviour the protocol maps."""
    log("%s recipes" % kind)
    b = base(zk)
    ps = []

    def peer(path, recipe, ident):
        p = Peer(kind, connect, path, recipe=recipe, ident=ident)
        ps.append(p)
        return p

    try:
        # mutex: second waits; FIFO between three of the same library.
        m = [peer(b + "/mutex", "mutex", "m%d" % i) for i in range(3)]
        log("  mutex m0: %s" % m[0].ask("acquire", "acquired"))
        m[1].send("acquire")
        time.sleep(0.3)
        m[2].send("acquire")
        check(m[1].reply(1) is None and m[2].reply(0.1) is None, "mutex: m1, m2 wait")
        m[0].ask("release", "released")
        log("  mutex m1: %s" % m[1].expect("acquired"))
        check(m[2].reply(0.5) is None, "mutex: m2 still waits (FIFO)")
        m[1].ask("release", "released")
        log("  mutex m2: %s" % m[2].expect("acquired"))
        m[2].ask("release", "released")
        log("  mutex m0 nodes: %s" % m[0].ask("nodes", "nodes"))
        check(m[0].ask("acquire 300", "acquired").startswith("acquired"), "mutex: acquire with timeout when free")
        m[1].send("acquire 300")
        check(m[1].reply(5) == "timeout", "mutex: acquire 300 times out while held")
        m[1].send("acquire")
        time.sleep(0.5)
        m[1].send("cancel")
        check(m[1].reply(5) == "cancelled", "mutex: cancel a waiting acquire")
        m[0].ask("release", "released")
        log("  after cancel: children %s" % zk.get_children(b + "/mutex"))

        # rwlock: two readers together, a writer waits for both, a reader queued behind a
        # writer waits for it.
        r1 = peer(b + "/rw", "rwlock-read", "r1")
        r2 = peer(b + "/rw", "rwlock-read", "r2")
        w1 = peer(b + "/rw", "rwlock-write", "w1")
        r3 = peer(b + "/rw", "rwlock-read", "r3")
        log("  rw r1: %s" % r1.ask("acquire", "acquired"))
        log("  rw r2: %s" % r2.ask("acquire", "acquired"))
        w1.send("acquire")
        check(w1.reply(1) is None, "rwlock: writer waits for the readers")
        r3.send("acquire")
        check(r3.reply(1) is None, "rwlock: a reader behind a waiting writer waits")
        log("  rw children: %s" % children(zk, b + "/rw"))
        r1.ask("release", "released")
        check(w1.reply(0.5) is None, "rwlock: writer still waits for r2")
        r2.ask("release", "released")
        log("  rw w1: %s" % w1.expect("acquired"))
        w1.ask("release", "released")
        log("  rw r3: %s" % r3.expect("acquired"))
        r3.ask("release", "released")

        # semaphore:2: two hold, the third waits until one releases.
        s = [peer(b + "/sem", "semaphore:2", "s%d" % i) for i in range(3)]
        log("  sem s0: %s" % s[0].ask("acquire", "acquired"))
        log("  sem s1: %s" % s[1].ask("acquire", "acquired"))
        s[2].send("acquire")
        check(s[2].reply(1) is None, "semaphore:2: third waits")
        log("  sem tree: %s" % tree(zk, b))
        s[0].ask("release", "released")
        log("  sem s2: %s" % s[2].expect("acquired"))
        s[1].ask("release", "released")
        s[2].ask("release", "released")

        # election: second becomes leader when the first leaves.
        e = [peer(b + "/election", "election", "e%d" % i) for i in range(2)]
        log("  election e0: %s" % e[0].ask("acquire", "acquired"))
        e[1].send("acquire")
        check(e[1].reply(1) is None, "election: e1 waits while e0 leads")
        e[0].ask("release", "released")
        log("  election e1: %s" % e[1].expect("acquired"))
        e[1].ask("release", "released")

        # barrier: set, a waiter blocks, removal lets it through.
        bs = [peer(b + "/barrier", "barrier", "b%d" % i) for i in range(2)]
        log("  barrier b0: %s" % bs[0].ask("acquire", "acquired"))
        check(bs[1].ask("wait 300", "timeout") == "timeout", "barrier: wait 300 times out while set")
        bs[1].send("wait")
        check(bs[1].reply(0.5) is None, "barrier: wait blocks while set")
        bs[0].ask("release", "released")
        check(bs[1].expect("passed") == "passed", "barrier: wait passes once removed")

        # double-barrier:2: enter blocks until both entered; leave blocks until both left.
        d = [peer(b + "/dbarrier", "double-barrier:2", "d%d" % i) for i in range(2)]
        d[0].send("acquire")
        check(d[0].reply(1) is None, "double-barrier:2: d0 waits alone")
        log("  double-barrier d1: %s" % d[1].ask("acquire", "acquired"))
        log("  double-barrier d0: %s" % d[0].expect("acquired"))
        log("  double-barrier children: %s" % zk.get_children(b + "/dbarrier"))
        d[0].send("release")
        check(d[0].reply(1) is None, "double-barrier:2: d0's leave waits for d1")
        d[1].ask("release", "released")
        d[0].expect("released")
        check(True, "double-barrier:2: both left")
    except AssertionError as exc:
        check(False, str(exc))
    finally:
        for p in ps:
            p.close()


def rw_writer_reader_writer(zk, connect, kind):
    """W1 holds, then R and W2 queue: once W1 releases, R must hold (W2 is behind it).
    kazoo before 2.9.0 deadlocks here (python-zk/kazoo#649, fixed by #650): its ReadLock
    waits for the newest writer, even one queued behind it, which waits for the reader."""
    path = base(zk) + "/rw"
    log("%s rwlock: writer holds, then reader, then writer queue on %s" % (kind, path))
    w1 = Peer(kind, connect, path, recipe="rwlock-write", ident="w1")
    r = Peer(kind, connect, path, recipe="rwlock-read", ident="r")
    w2 = Peer(kind, connect, path, recipe="rwlock-write", ident="w2")
    try:
        log("  w1: %s" % w1.ask("acquire", "acquired"))
        r.send("acquire")
        time.sleep(0.3)
        w2.send("acquire")
        time.sleep(0.3)
        log("  queue: %s" % children(zk, path))
        w1.ask("release", "released")
        line = r.reply(5)
        log("  r after w1's release: %s" % line)
        check(line is not None and line.startswith("acquired"),
              "%s rwlock: the reader holds once the writer ahead releases" % kind)
        if line is None:
            r.send("cancel")
            log("  r after cancel: %s" % r.reply(5))
        else:
            check(w2.reply(0.5) is None, "%s rwlock: w2 waits for the reader" % kind)
            r.ask("release", "released")
        log("  w2: %s" % w2.reply(5))
    finally:
        for p in (w1, r, w2):
            p.close()


def tree(zk, path, indent=""):
    out = []
    for c in sorted(zk.get_children(path)):
        full = path + "/" + c
        data, _ = zk.get(full)
        out.append("%s=%r" % (full[len(path) + 1:], data))
        sub = tree(zk, full)
        if sub:
            out.append("[%s]" % sub)
    return " ".join(out)


def benches(connect, n_list, secs, reps, kinds):
    """Each (peer, N) reps times, interleaved; prints each JSON line with the load average
    before the run (other work on the machine shows in the numbers), then the medians."""
    results = {}
    for rep in range(reps):
        for kind in kinds:
            for n in n_list:
                path = "/peers-bench-%s-%d-%d" % (kind, n, int(time.time() * 1000))
                args = [LAUNCHER[kind], "--connect", connect, "--path", path, "--bench", str(n),
                        "--seconds", str(secs)]
                with open("/proc/loadavg") as f:
                    load = f.read().split()[0]
                t0 = time.monotonic()
                out = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=True).stdout
                line = out.strip().splitlines()[-1]
                log("  %s (load %s, wall %.1f s)" % (line, load, time.monotonic() - t0))
                results.setdefault((kind, n), []).append(json.loads(line))
    if reps > 1:
        log("  medians of %d runs:" % reps)
        for (kind, n), runs in results.items():
            def med(key):
                return sorted(r[key] for r in runs)[len(runs) // 2]
            log("  %-7s n=%-3d cycles/s %8.1f  handoff p50 %6.3f ms  p99 %6.3f ms"
                % (kind, n, med("cycles_per_s"), med("handoff_p50_ms"), med("handoff_p99_ms")))
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connect", required=True)
    ap.add_argument("--bench", action="store_true", help="also run the benchmarks")
    ap.add_argument("--bench-n", default="1,8,64")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--reps", type=int, default=1, help="bench repetitions (medians if > 1)")
    ap.add_argument("--bench-peers", default="kazoo,curator")
    ap.add_argument("--only", choices=["exclusion", "fifo", "recipes", "rw", "bench"])
    a = ap.parse_args()
    zk = KazooClient(hosts=a.connect)
    zk.start(timeout=10)
    try:
        if a.only in (None, "exclusion"):
            exclusion(zk, a.connect, interop=False)
            exclusion(zk, a.connect, interop=True)
        if a.only in (None, "fifo"):
            fifo(zk, a.connect)
        if a.only in (None, "recipes"):
            same_library_recipes(zk, a.connect, "curator")
            same_library_recipes(zk, a.connect, "kazoo")
            rw_writer_reader_writer(zk, a.connect, "curator")
            rw_writer_reader_writer(zk, a.connect, "kazoo")
        if a.only == "rw":
            rw_writer_reader_writer(zk, a.connect, "curator")
            rw_writer_reader_writer(zk, a.connect, "kazoo")
        if a.bench or a.only == "bench":
            log("bench (%s s each)" % a.seconds)
            benches(a.connect, [int(n) for n in a.bench_n.split(",")], a.seconds, a.reps,
                    a.bench_peers.split(","))
    finally:
        zk.stop()
        zk.close()
    log("")
    log("FAILED: %s" % FAILURES if FAILURES else "all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
