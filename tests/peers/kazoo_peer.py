#!/usr/bin/python3
"""The kazoo peer of baton's ZooKeeper interop tests and benchmark: kazoo's recipes (Debian's
python3-kazoo), driven by the line protocol the Curator peer
(tests/peers/curator_peer/CuratorPeer.java) speaks too. See tests/peers/README.md.

Run with Debian's /usr/bin/python3 (where python3-kazoo is installed), e.g. through the
launcher scripts/build-peers.sh writes: target/peers/kazoo-peer ARGS.
"""

import argparse
import json
import logging
import math
import os
import queue
import re
import sys
import threading
import time

from kazoo.client import KazooClient
from kazoo.exceptions import CancelledError, LockTimeout

_OUT_LOCK = threading.Lock()
EOF_GRACE_S = 10.0
RECIPES = re.compile(
    r"mutex|rwlock-read|rwlock-write|election|barrier|(semaphore|double-barrier):[1-9][0-9]*")


def say(line):
    """Prints one protocol line and flushes it. Every stdout line goes through here."""
    with _OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def one_line(exc):
    text = type(exc).__name__
    if str(exc):
        text += ": " + str(exc)
    return text.replace("\n", " ").replace("\r", " ")


class Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Usage(message)


def parse(argv):
    p = _Parser(prog="kazoo_peer.py", add_help=True)
    p.add_argument("--connect", required=True, help="HOST:PORT[,...][/chroot]")
    p.add_argument("--path", required=True)
    p.add_argument("--recipe", default="mutex",
                   help="mutex|rwlock-read|rwlock-write|semaphore:N|election|barrier|double-barrier:N")
    p.add_argument("--id", default="kazoo")
    p.add_argument("--session-timeout-ms", type=int, default=10000)
    p.add_argument("--connect-timeout-ms", type=int, default=10000)
    p.add_argument("--interop", action="store_true",
                   help="mutex only: also queue behind Curator's ...-lock-<seq> nodes")
    p.add_argument("--events", action="store_true")
    p.add_argument("--bench", type=int, default=0)
    p.add_argument("--seconds", type=float, default=5.0)
    opts = p.parse_args(argv)
    if not RECIPES.fullmatch(opts.recipe):
        raise Usage("unknown recipe " + opts.recipe)
    if opts.interop and opts.recipe != "mutex":
        raise Usage("--interop is for --recipe mutex only")
    if opts.bench > 0 and opts.recipe != "mutex":
        raise Usage("--bench runs --recipe mutex only")
    return opts


def new_client(opts):
    client = KazooClient(hosts=opts.connect, timeout=opts.session_timeout_ms / 1000.0)
    try:
        client.start(timeout=opts.connect_timeout_ms / 1000.0)
    except Exception as exc:  # kazoo.handlers.threading.KazooTimeoutError
        client.stop()
        client.close()
        say("error cannot connect to %s within %d ms: %s"
            % (opts.connect, opts.connect_timeout_ms, one_line(exc)))
        sys.exit(1)
    return client


def kazoo_version():
    from kazoo.version import __version__
    return __version__


def count(recipe):
    try:
        n = int(recipe.split(":", 1)[1])
    except ValueError:
        n = 0
    if n < 1:
        raise Usage("bad count in --recipe " + recipe)
    return n


def seconds(timeout_ms):
    return None if timeout_ms is None else timeout_ms / 1000.0


# ------------------------------------------------------------------ recipes
#
# acquire(timeout_ms) blocks until held and returns the full path of the node that stands for
# the hold, or None on timeout (timeout_ms None = forever); raises CancelledError on cancel().


class LockRecipe:
    """Lock, ReadLock, WriteLock, and Election (whose run() holds its Lock while the leader
    function runs: acquire here is election.lock.acquire(), what run() does)."""

    def __init__(self, lock):
        self.lock = lock

    def acquire(self, timeout_ms):
        try:
            got = self.lock.acquire(timeout=seconds(timeout_ms))
        except LockTimeout:
            return None
        if not got:
            return None
        return self.lock.path + "/" + self.lock.node

    def release(self):
        self.lock.release()

    def cancel(self):
        self.lock.cancel()

    def wait(self, timeout_ms):
        raise Usage("wait is for the barrier recipe")


class SemaphoreRecipe:
    def __init__(self, semaphore):
        self.semaphore = semaphore

    def acquire(self, timeout_ms):
        try:
            got = self.semaphore.acquire(timeout=seconds(timeout_ms))
        except LockTimeout:
            return None
        return self.semaphore.create_path if got else None

    def release(self):
        self.semaphore.release()

    def cancel(self):
        # Takes effect once this contender holds the semaphore's internal lock (kazoo does not
        # pass a cancel on to that lock).
        self.semaphore.cancel()

    def wait(self, timeout_ms):
        raise Usage("wait is for the barrier recipe")


class BarrierRecipe:
    """Barrier: acquire = create(), release = remove(), wait = wait()."""

    def __init__(self, barrier):
        self.barrier = barrier

    def acquire(self, timeout_ms):
        self.barrier.create()
        return self.barrier.path

    def release(self):
        self.barrier.remove()

    def cancel(self):
        raise Usage("kazoo's Barrier.wait cannot be cancelled")

    def wait(self, timeout_ms):
        return self.barrier.wait(timeout=seconds(timeout_ms))


class DoubleBarrierRecipe:
    """DoubleBarrier: acquire = enter(), release = leave(); kazoo gives neither a timeout."""

    def __init__(self, barrier):
        self.barrier = barrier

    def acquire(self, timeout_ms):
        if timeout_ms is not None:
            raise Usage("kazoo's DoubleBarrier.enter takes no timeout")
        self.barrier.enter()
        if not self.barrier.participating:
            # enter() swallows its errors (after a best-effort cleanup).
            raise RuntimeError("DoubleBarrier.enter failed")
        return self.barrier.create_path

    def release(self):
        self.barrier.leave()

    def cancel(self):
        raise Usage("kazoo's DoubleBarrier.enter cannot be cancelled")

    def wait(self, timeout_ms):
        raise Usage("wait is for the barrier recipe")


def make_recipe(client, opts):
    r, path, ident = opts.recipe, opts.path, opts.id
    if opts.interop and r != "mutex":
        raise Usage("--interop is for --recipe mutex only")
    if r == "mutex":
        if opts.interop:
            # kazoo's documented knob "for cross-implementation compatibility": also wait for
            # nodes matching -lock-<seq> (Curator's InterProcessMutex).
            return LockRecipe(client.Lock(path, ident, extra_lock_patterns=("-lock-",)))
        return LockRecipe(client.Lock(path, ident))
    if r == "rwlock-read":
        return LockRecipe(client.ReadLock(path, ident))
    if r == "rwlock-write":
        return LockRecipe(client.WriteLock(path, ident))
    if r.startswith("semaphore:"):
        return SemaphoreRecipe(client.Semaphore(path, ident, max_leases=count(r)))
    if r == "election":
        return LockRecipe(client.Election(path, ident).lock)
    if r == "barrier":
        return BarrierRecipe(client.Barrier(path))
    if r.startswith("double-barrier:"):
        return DoubleBarrierRecipe(client.DoubleBarrier(path, count(r), ident))
    raise Usage("unknown recipe " + r)


# ------------------------------------------------------------------ interactive mode


class Peer:
    def __init__(self, client, recipe):
        self.client = client
        self.recipe = recipe
        self.commands = queue.Queue()
        self.history = []
        self.held = False
        self.state = threading.Lock()
        self.running = None  # the command the worker runs; guarded by state

    @staticmethod
    def timeout(words):
        if len(words) < 2:
            return None
        t = int(words[1])
        if t < 0:
            raise ValueError("negative timeout %d" % t)
        return t

    def execute(self, line):
        words = line.split()
        cmd = words[0]
        try:
            if cmd == "acquire":
                if self.held:
                    say("error already held")
                    return
                node = self.recipe.acquire(self.timeout(words))
                if node is None:
                    say("timeout")
                else:
                    self.held = True
                    self.history.append(node)
                    say("acquired " + node)
            elif cmd == "release":
                if not self.held:
                    say("error not held")
                    return
                self.recipe.release()
                self.held = False
                say("released")
            elif cmd == "wait":
                say("passed" if self.recipe.wait(self.timeout(words)) else "timeout")
            elif cmd == "nodes":
                say(" ".join(["nodes"] + self.history))
            elif cmd == "version":
                say("version kazoo " + kazoo_version())
            elif cmd == "session":
                say("session 0x%x" % self.client.client_id[0])
            else:
                say("error unknown command " + cmd)
        except CancelledError:
            say("cancelled")
        except Usage as exc:
            say("error " + str(exc))
        except ValueError as exc:
            say("error " + one_line(exc))
        except Exception as exc:  # noqa: BLE001 -- every failure is one protocol line
            say("error " + one_line(exc))

    def quit(self):
        """Closes the session (its ephemeral nodes go with it), prints "bye" and exits."""
        try:
            self.client.stop()
            self.client.close()
        finally:
            say("bye")
            os._exit(0)

    def worker_loop(self):
        while True:
            line = self.commands.get()
            with self.state:
                self.running = line
            if line == "quit":
                self.quit()
            self.execute(line)
            with self.state:
                self.running = None

    def run(self):
        threading.Thread(target=self.worker_loop, name="peer-worker", daemon=True).start()
        say("ready")
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            word = line.split()[0]
            if word == "cancel":
                # Out of band: cancels the running acquire or wait, which answers.
                with self.state:
                    running = self.running
                if running is not None and running.split()[0] in ("acquire", "wait"):
                    try:
                        self.recipe.cancel()
                    except Usage as exc:
                        say("error " + str(exc))
                else:
                    say("error nothing to cancel")
                continue
            self.commands.put("quit" if word == "quit" else line)
        # End of input: quit once the queued commands are done, but within EOF_GRACE_S even if
        # one of them blocks, so that a peer whose driver died does not linger.
        self.commands.put("quit")
        time.sleep(EOF_GRACE_S)
        self.quit()


# ------------------------------------------------------------------ bench mode


def percentile_ms(sorted_ns, p):
    if not sorted_ns:
        return 0.0
    rank = int(math.ceil(p * len(sorted_ns)))
    return sorted_ns[max(0, min(len(sorted_ns), rank) - 1)] / 1e6


def bench(opts):
    """N contenders, each with its own KazooClient (session) and Lock on one path, cycle
    acquire/release for S seconds; prints one JSON line."""
    if opts.recipe != "mutex":
        raise Usage("--bench runs --recipe mutex only")
    n = opts.bench
    clients = [new_client(opts) for _ in range(n)]
    patterns = ("-lock-",) if opts.interop else ()
    locks = [c.Lock(opts.path, "%s-%d" % (opts.id, i), extra_lock_patterns=patterns)
             for i, c in enumerate(clients)]
    cycles = [0] * n
    handoffs = []
    # Written by the holder just before it releases, read by the next holder: the ZooKeeper
    # lock orders them; the Python lock only makes the list appends safe.
    shared = {"last_release": None}
    guard = threading.Lock()
    errors = []
    go = threading.Event()
    window = {}

    def contender(me):
        lock = locks[me]
        try:
            go.wait()
            deadline = window["deadline"]
            while True:
                lock.acquire()
                now = time.monotonic_ns()
                if now >= deadline:
                    lock.release()
                    return
                with guard:
                    if shared["last_release"] is not None:
                        handoffs.append(now - shared["last_release"])
                    cycles[me] += 1
                    shared["last_release"] = time.monotonic_ns()
                lock.release()
        except Exception as exc:  # noqa: BLE001
            errors.append(one_line(exc))

    threads = [threading.Thread(target=contender, args=(i,), name="contender-%d" % i)
               for i in range(n)]
    for t in threads:
        t.start()
    window["start"] = time.monotonic_ns()
    window["deadline"] = window["start"] + int(opts.seconds * 1e9)
    go.set()
    for t in threads:
        t.join()
    elapsed = (window["deadline"] - window["start"]) / 1e9
    for c in clients:
        c.stop()
        c.close()
    if errors:
        say("error " + errors[0])
        sys.exit(1)
    h = sorted(handoffs)
    total = sum(cycles)
    say(json.dumps({
        "peer": "kazoo",
        "n": n,
        "cycles": total,
        "seconds": round(elapsed, 3),
        "cycles_per_s": round(total / elapsed, 3),
        "handoff_p50_ms": round(percentile_ms(h, 0.50), 3),
        "handoff_p99_ms": round(percentile_ms(h, 0.99), 3),
        "handoff_max_ms": round(h[-1] / 1e6 if h else 0.0, 3),
        "handoffs": len(h),
        "per_contender_min": min(cycles),
        "per_contender_max": max(cycles),
    }, separators=(",", ":")))


def main(argv):
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        opts = parse(argv)
        if opts.bench > 0:
            bench(opts)
            return 0
        client = new_client(opts)
        if opts.events:
            seen = {"suspended": False}

            def listener(state):
                name = str(state).lower()
                if name == "suspended":
                    seen["suspended"] = True
                elif name == "connected" and seen["suspended"]:
                    name = "reconnected"
                    seen["suspended"] = False
                say("event " + name)

            client.add_listener(listener)
        recipe = make_recipe(client, opts)
    except Usage as exc:
        say("error " + str(exc))
        return 2
    Peer(client, recipe).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
