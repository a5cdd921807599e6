// The Curator peer of baton's ZooKeeper interop tests and benchmark: Apache Curator's recipes
// (Debian's 5.4.0 jars), driven by a line protocol on stdin/stdout that the kazoo peer
// (tests/peers/kazoo_peer.py) speaks too. See tests/peers/README.md for the protocol.
//
// Build: scripts/build-peers.sh (javac into target/peers/). Run: target/peers/curator-peer ARGS.

import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.barriers.DistributedBarrier;
import org.apache.curator.framework.recipes.barriers.DistributedDoubleBarrier;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.locks.StandardLockInternalsDriver;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.utils.ZKPaths;

public final class CuratorPeer {
    private static final PrintStream OUT =
            new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);

    /** Prints one protocol line and flushes it. Every stdout line goes through here. */
    static void say(String line) {
        synchronized (OUT) {
            OUT.print(line);
            OUT.print('\n');
            OUT.flush();
        }
    }

    static String oneLine(Throwable e) {
        String message = e.getClass().getSimpleName() + (e.getMessage() == null ? "" : ": " + e.getMessage());
        return message.replace('\n', ' ').replace('\r', ' ');
    }

    // ---------------------------------------------------------------- options

    static final class Options {
        String connect;
        String path;
        String recipe = "mutex";
        String id = "curator";
        int sessionMs = 10_000;
        int connectMs = 10_000;
        int bench = 0;
        double seconds = 5;
        boolean interop = false;
        boolean events = false;
    }

    static final String USAGE = "usage: CuratorPeer --connect HOST:PORT[,...][/chroot] --path /zk/path"
            + " [--recipe mutex|rwlock-read|rwlock-write|semaphore:N|election|barrier|double-barrier:N]"
            + " [--id NAME] [--session-timeout-ms MS] [--connect-timeout-ms MS] [--interop] [--events]"
            + " [--bench N [--seconds S]]";

    static final Pattern RECIPES = Pattern.compile(
            "mutex|rwlock-read|rwlock-write|election|barrier|(semaphore|double-barrier):[1-9][0-9]*");

    static Options parse(String[] args) {
        Options o = new Options();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (a.equals("--interop")) { o.interop = true; continue; }
            if (a.equals("--events")) { o.events = true; continue; }
            if (a.equals("-h") || a.equals("--help")) { System.err.println(USAGE); System.exit(0); }
            if (i + 1 >= args.length) usage("missing value for " + a);
            String v = args[++i];
            try {
                switch (a) {
                    case "--connect": o.connect = v; break;
                    case "--path": o.path = v; break;
                    case "--recipe": o.recipe = v; break;
                    case "--id": o.id = v; break;
                    case "--session-timeout-ms": o.sessionMs = Integer.parseInt(v); break;
                    case "--connect-timeout-ms": o.connectMs = Integer.parseInt(v); break;
                    case "--bench": o.bench = Integer.parseInt(v); break;
                    case "--seconds": o.seconds = Double.parseDouble(v); break;
                    default: usage("unknown option " + a);
                }
            } catch (NumberFormatException e) {
                usage("bad number for " + a + ": " + v);
            }
        }
        if (o.connect == null || o.path == null) usage("--connect and --path are required");
        if (!RECIPES.matcher(o.recipe).matches()) usage("unknown recipe " + o.recipe);
        if (o.interop && !o.recipe.equals("mutex")) usage("--interop is for --recipe mutex only");
        if (o.bench > 0 && !o.recipe.equals("mutex")) usage("--bench runs --recipe mutex only");
        return o;
    }

    static void usage(String why) {
        say("error " + why);
        System.err.println(USAGE);
        System.exit(2);
    }

    static CuratorFramework newClient(Options o) throws InterruptedException {
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(o.connect)
                .sessionTimeoutMs(o.sessionMs)
                .connectionTimeoutMs(o.connectMs)
                .retryPolicy(new ExponentialBackoffRetry(100, 10))
                .build();
        client.start();
        if (!client.blockUntilConnected(o.connectMs, TimeUnit.MILLISECONDS)) {
            client.close();
            say("error cannot connect to " + o.connect + " within " + o.connectMs + " ms");
            System.exit(1);
        }
        return client;
    }

    // ---------------------------------------------------------------- recipes

    /** Curator's version, from the recipes jar's Maven properties. */
    static String curatorVersion() {
        try (java.io.InputStream in = InterProcessMutex.class.getResourceAsStream(
                "/META-INF/maven/org.apache.curator/curator-recipes/pom.properties")) {
            java.util.Properties p = new java.util.Properties();
            p.load(in);
            return p.getProperty("version", "unknown");
        } catch (Exception e) {
            return "unknown";
        }
    }

    /** One recipe behind the protocol's acquire/release/wait. */
    interface Recipe {
        /** Blocks until held; returns the full path of the node that stands for the hold, or
         *  null if timeoutMs (>= 0) passed first. A negative timeout waits forever. */
        String acquire(long timeoutMs) throws Exception;

        void release() throws Exception;

        /** Barriers only: blocks until the barrier is down; false on timeout. */
        default boolean await(long timeoutMs) throws Exception {
            throw new UnsupportedOperationException("wait is for the barrier recipe");
        }
    }

    /** Sorts lock nodes by their trailing 10-digit sequence, whatever their prefix, so that
     *  Curator also queues behind kazoo's `<hex32>__lock__<seq>` (--interop). Curator's own
     *  driver sorts by what follows "lock-" and a name without it by the whole name. */
    static final class SequenceSortingDriver extends StandardLockInternalsDriver {
        // Not -?\d{10}: "-lock-0000000001" would yield "-0000000001", which sorts before every
        // kazoo suffix. (A suffix past 2^31 - 1 turns negative; no peer orders those right.)
        private static final Pattern SEQUENCE = Pattern.compile("(\\d{10})$");

        @Override
        public String fixForSorting(String str, String lockName) {
            Matcher m = SEQUENCE.matcher(str);
            return m.find() ? m.group(1) : str;
        }
    }

    static Object invokeHidden(Object target, Class<?> owner, String method) throws Exception {
        Method m = owner.getDeclaredMethod(method);
        m.setAccessible(true);
        try {
            return m.invoke(target);
        } catch (InvocationTargetException e) {
            throw (Exception) e.getCause();
        }
    }

    static Object readField(Object target, Class<?> owner, String field) throws Exception {
        Field f = owner.getDeclaredField(field);
        f.setAccessible(true);
        return f.get(target);
    }

    /** InterProcessMutex, and the read or write half of InterProcessReadWriteLock. */
    static final class MutexRecipe implements Recipe {
        private final InterProcessMutex mutex;

        MutexRecipe(InterProcessMutex mutex) { this.mutex = mutex; }

        @Override
        public String acquire(long timeoutMs) throws Exception {
            if (timeoutMs < 0) {
                mutex.acquire();
            } else if (!mutex.acquire(timeoutMs, TimeUnit.MILLISECONDS)) {
                return null;
            }
            // The node of the current hold: InterProcessMutex keeps it in protected getLockPath().
            return (String) invokeHidden(mutex, InterProcessMutex.class, "getLockPath");
        }

        @Override
        public void release() throws Exception { mutex.release(); }
    }

    static final class SemaphoreRecipe implements Recipe {
        private final InterProcessSemaphoreV2 semaphore;
        private final String path;
        private Lease lease;

        SemaphoreRecipe(InterProcessSemaphoreV2 semaphore, String path) {
            this.semaphore = semaphore;
            this.path = path;
        }

        @Override
        public String acquire(long timeoutMs) throws Exception {
            lease = timeoutMs < 0 ? semaphore.acquire() : semaphore.acquire(timeoutMs, TimeUnit.MILLISECONDS);
            // Lease.getNodeName() is the lease node's name alone; it lives in <path>/leases.
            return lease == null ? null : ZKPaths.makePath(path, "leases", lease.getNodeName());
        }

        @Override
        public void release() throws Exception {
            semaphore.returnLease(lease);
            lease = null;
        }
    }

    /** LeaderLatch: acquire = start() + await(); release = close(). A closed latch cannot
     *  start again, so every acquire makes a new one. */
    /**
     * LeaderSelector: leadership is an InterProcessMutex on the path (nodes
     * _c_<uuid>-lock-<seq>, the mutex layout): acquire = start() and wait until
     * takeLeadership runs; release = let takeLeadership return and close().
     */
    static final class SelectorRecipe implements Recipe {
        private final CuratorFramework client;
        private final String path;
        private final String id;
        private LeaderSelector selector;
        private java.util.concurrent.CountDownLatch done;

        SelectorRecipe(CuratorFramework client, String path, String id) {
            this.client = client;
            this.path = path;
            this.id = id;
        }

        @Override
        public String acquire(long timeoutMs) throws Exception {
            final java.util.concurrent.CountDownLatch leading = new java.util.concurrent.CountDownLatch(1);
            final java.util.concurrent.CountDownLatch release = new java.util.concurrent.CountDownLatch(1);
            done = release;
            selector = new LeaderSelector(client, path, new LeaderSelectorListenerAdapter() {
                @Override
                public void takeLeadership(CuratorFramework c) throws Exception {
                    leading.countDown();
                    release.await();
                }
            });
            selector.setId(id);
            selector.start();
            boolean leader;
            try {
                if (timeoutMs < 0) {
                    leading.await();
                    leader = true;
                } else {
                    leader = leading.await(timeoutMs, TimeUnit.MILLISECONDS);
                }
            } catch (Exception e) {
                close();
                throw e;
            }
            if (!leader) {
                close();
                return null;
            }
            return path + " (leader " + id + ")";
        }

        private void close() {
            LeaderSelector s = selector;
            selector = null;
            done.countDown();
            s.close();
        }

        @Override
        public void release() throws Exception { close(); }
    }

    static final class ElectionRecipe implements Recipe {
        private final CuratorFramework client;
        private final String path;
        private final String id;
        private LeaderLatch latch;

        ElectionRecipe(CuratorFramework client, String path, String id) {
            this.client = client;
            this.path = path;
            this.id = id;
        }

        @Override
        public String acquire(long timeoutMs) throws Exception {
            latch = new LeaderLatch(client, path, id);
            latch.start();
            boolean leader;
            try {
                if (timeoutMs < 0) {
                    latch.await();
                    leader = true;
                } else {
                    leader = latch.await(timeoutMs, TimeUnit.MILLISECONDS);
                }
            } catch (Exception e) {
                closeLatch();
                throw e;
            }
            if (!leader) {
                closeLatch();
                return null;
            }
            return latch.getOurPath();
        }

        private void closeLatch() throws Exception {
            LeaderLatch l = latch;
            latch = null;
            l.close();
        }

        @Override
        public void release() throws Exception { closeLatch(); }
    }

    /** DistributedBarrier: acquire = setBarrier(), release = removeBarrier(), wait = waitOnBarrier(). */
    static final class BarrierRecipe implements Recipe {
        private final DistributedBarrier barrier;
        private final String path;

        BarrierRecipe(DistributedBarrier barrier, String path) {
            this.barrier = barrier;
            this.path = path;
        }

        @Override
        public String acquire(long timeoutMs) throws Exception {
            barrier.setBarrier();
            return path;
        }

        @Override
        public void release() throws Exception { barrier.removeBarrier(); }

        @Override
        public boolean await(long timeoutMs) throws Exception {
            if (timeoutMs < 0) {
                barrier.waitOnBarrier();
                return true;
            }
            return barrier.waitOnBarrier(timeoutMs, TimeUnit.MILLISECONDS);
        }
    }

    /** DistributedDoubleBarrier: acquire = enter(), release = leave() (each blocks for the others). */
    static final class DoubleBarrierRecipe implements Recipe {
        private final DistributedDoubleBarrier barrier;

        DoubleBarrierRecipe(DistributedDoubleBarrier barrier) { this.barrier = barrier; }

        @Override
        public String acquire(long timeoutMs) throws Exception {
            if (timeoutMs < 0) {
                barrier.enter();
            } else if (!barrier.enter(timeoutMs, TimeUnit.MILLISECONDS)) {
                return null;
            }
            return (String) readField(barrier, DistributedDoubleBarrier.class, "ourPath");
        }

        @Override
        public void release() throws Exception { barrier.leave(); }
    }

    static int count(String recipe) {
        String n = recipe.substring(recipe.indexOf(':') + 1);
        try {
            int v = Integer.parseInt(n);
            if (v >= 1) return v;
        } catch (NumberFormatException e) {
            // fall through
        }
        usage("bad count in --recipe " + recipe);
        return 0;
    }

    static Recipe recipe(CuratorFramework client, Options o) {
        byte[] data = o.id.getBytes(StandardCharsets.UTF_8);
        String r = o.recipe;
        if (o.interop && !r.equals("mutex")) usage("--interop is for --recipe mutex only");
        if (r.equals("mutex")) {
            return new MutexRecipe(o.interop
                    ? new InterProcessMutex(client, o.path, new SequenceSortingDriver())
                    : new InterProcessMutex(client, o.path));
        }
        if (r.equals("rwlock-read")) return new MutexRecipe(new InterProcessReadWriteLock(client, o.path, data).readLock());
        if (r.equals("rwlock-write")) return new MutexRecipe(new InterProcessReadWriteLock(client, o.path, data).writeLock());
        if (r.startsWith("semaphore:")) {
            InterProcessSemaphoreV2 s = new InterProcessSemaphoreV2(client, o.path, count(r));
            s.setNodeData(data);
            return new SemaphoreRecipe(s, o.path);
        }
        if (r.equals("election")) return new SelectorRecipe(client, o.path, o.id);
        if (r.equals("leader-latch")) return new ElectionRecipe(client, o.path, o.id);
        if (r.equals("barrier")) return new BarrierRecipe(new DistributedBarrier(client, o.path), o.path);
        if (r.startsWith("double-barrier:")) return new DoubleBarrierRecipe(new DistributedDoubleBarrier(client, o.path, count(r)));
        usage("unknown recipe " + r);
        return null;
    }

    // ---------------------------------------------------------------- interactive mode

    static final class Peer {
        final CuratorFramework client;
        final Recipe recipe;
        final LinkedBlockingQueue<String> commands = new LinkedBlockingQueue<>();
        final List<String> history = new ArrayList<>();
        final Object state = new Object();
        /** The command the worker runs (null when idle); guarded by state. */
        String running;
        Thread worker;
        boolean held;

        Peer(CuratorFramework client, Recipe recipe) {
            this.client = client;
            this.recipe = recipe;
        }

        long timeout(String[] words) {
            if (words.length < 2) return -1;
            long t = Long.parseLong(words[1]);
            if (t < 0) throw new NumberFormatException("negative timeout " + t);
            return t;
        }

        void execute(String line) {
            String[] words = line.split("\\s+");
            try {
                switch (words[0]) {
                    case "acquire": {
                        if (held) { say("error already held"); return; }
                        String node = recipe.acquire(timeout(words));
                        if (node == null) {
                            say("timeout");
                        } else {
                            held = true;
                            history.add(node);
                            say("acquired " + node);
                        }
                        return;
                    }
                    case "release":
                        if (!held) { say("error not held"); return; }
                        recipe.release();
                        held = false;
                        say("released");
                        return;
                    case "wait":
                        say(recipe.await(timeout(words)) ? "passed" : "timeout");
                        return;
                    case "nodes":
                        say(history.isEmpty() ? "nodes" : "nodes " + String.join(" ", history));
                        return;
                    case "version":
                        say("version curator " + curatorVersion() + " zookeeper "
                                + org.apache.zookeeper.Version.getFullVersion().split("[-,]")[0]);
                        return;
                    case "session":
                        say("session 0x" + Long.toHexString(client.getZookeeperClient().getZooKeeper().getSessionId()));
                        return;
                    default:
                        say("error unknown command " + words[0]);
                }
            } catch (InterruptedException e) {
                say("cancelled");
            } catch (NumberFormatException e) {
                say("error bad timeout: " + e.getMessage());
            } catch (Exception e) {
                // Curator may wrap an interrupt (cancel) in its own exceptions.
                if (Thread.interrupted()) {
                    say("cancelled");
                } else {
                    say("error " + oneLine(e));
                }
            }
        }

        void workerLoop() {
            while (true) {
                String line;
                try {
                    line = commands.take();
                } catch (InterruptedException e) {
                    continue; // a cancel that came too late: the command had already answered
                }
                synchronized (state) {
                    running = line;
                }
                if (line.equals("quit")) {
                    quit();
                }
                execute(line);
                synchronized (state) {
                    running = null;
                    Thread.interrupted(); // a late cancel must not reach the next command
                }
            }
        }

        /** Closes the session (its ephemeral nodes go with it), prints "bye" and exits. */
        void quit() {
            client.close();
            say("bye");
            System.exit(0);
        }

        void run() throws Exception {
            worker = new Thread(this::workerLoop, "peer-worker");
            worker.setDaemon(true);
            worker.start();
            say("ready");
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                line = line.trim();
                if (line.isEmpty()) continue;
                if (line.split("\\s+")[0].equals("cancel")) {
                    // Out of band: interrupts the running acquire or wait, which answers.
                    synchronized (state) {
                        if (running != null && (running.startsWith("acquire") || running.startsWith("wait"))) {
                            worker.interrupt();
                        } else {
                            say("error nothing to cancel");
                        }
                    }
                    continue;
                }
                commands.put(line.split("\\s+")[0].equals("quit") ? "quit" : line);
            }
            // End of input: quit once the queued commands are done, but within EOF_GRACE_MS
            // even if one of them blocks, so that a peer whose driver died does not linger.
            commands.put("quit");
            Thread.sleep(EOF_GRACE_MS);
            quit();
        }
    }

    static final long EOF_GRACE_MS = 10_000;

    // ---------------------------------------------------------------- bench mode

    static double percentileMs(long[] sortedNs, double p) {
        if (sortedNs.length == 0) return 0;
        int rank = (int) Math.ceil(p * sortedNs.length);
        return sortedNs[Math.max(0, Math.min(sortedNs.length, rank) - 1)] / 1e6;
    }

    static String ms(double v) { return String.format(Locale.ROOT, "%.3f", v); }

    /** N contenders, each with its own client (session) and InterProcessMutex on one path,
     *  cycle acquire/release for S seconds; prints one JSON line. */
    static void bench(Options o) throws Exception {
        if (!o.recipe.equals("mutex")) usage("--bench runs --recipe mutex only");
        int n = o.bench;
        CuratorFramework[] clients = new CuratorFramework[n];
        InterProcessMutex[] mutexes = new InterProcessMutex[n];
        for (int i = 0; i < n; i++) {
            clients[i] = newClient(o);
            mutexes[i] = o.interop
                    ? new InterProcessMutex(clients[i], o.path, new SequenceSortingDriver())
                    : new InterProcessMutex(clients[i], o.path);
        }
        long[] cycles = new long[n];
        List<Long> handoffs = new ArrayList<>();
        // Written by the holder just before it releases, read by the next holder: the mutex
        // orders them.
        long[] lastRelease = {0};
        List<String> errors = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch go = new CountDownLatch(1);
        long[] window = new long[2];
        Thread[] threads = new Thread[n];
        for (int i = 0; i < n; i++) {
            final int me = i;
            threads[i] = new Thread(() -> {
                InterProcessMutex m = mutexes[me];
                try {
                    go.await();
                    long deadline = window[1];
                    while (true) {
                        m.acquire();
                        long now = System.nanoTime();
                        if (now >= deadline) {
                            m.release();
                            return;
                        }
                        synchronized (handoffs) {
                            if (lastRelease[0] != 0) handoffs.add(now - lastRelease[0]);
                            cycles[me]++;
                            lastRelease[0] = System.nanoTime();
                        }
                        m.release();
                    }
                } catch (Exception e) {
                    errors.add(oneLine(e));
                }
            }, "contender-" + i);
            threads[i].start();
        }
        window[0] = System.nanoTime();
        window[1] = window[0] + (long) (o.seconds * 1e9);
        go.countDown();
        for (Thread t : threads) t.join();
        long elapsed = window[1] - window[0];
        for (CuratorFramework c : clients) c.close();
        if (!errors.isEmpty()) {
            say("error " + errors.get(0));
            System.exit(1);
        }
        long total = 0, min = Long.MAX_VALUE, max = 0;
        for (long c : cycles) {
            total += c;
            min = Math.min(min, c);
            max = Math.max(max, c);
        }
        long[] h = handoffs.stream().mapToLong(Long::longValue).sorted().toArray();
        double seconds = elapsed / 1e9;
        say("{\"peer\":\"curator\",\"n\":" + n
                + ",\"cycles\":" + total
                + ",\"seconds\":" + ms(seconds)
                + ",\"cycles_per_s\":" + ms(total / seconds)
                + ",\"handoff_p50_ms\":" + ms(percentileMs(h, 0.50))
                + ",\"handoff_p99_ms\":" + ms(percentileMs(h, 0.99))
                + ",\"handoff_max_ms\":" + ms(h.length == 0 ? 0 : h[h.length - 1] / 1e6)
                + ",\"handoffs\":" + h.length
                + ",\"per_contender_min\":" + min
                + ",\"per_contender_max\":" + max + "}");
        System.exit(0);
    }

    // ---------------------------------------------------------------- main

    public static void main(String[] args) throws Exception {
        // Curator's and ZooKeeper's logs (slf4j-simple) go to stderr, warnings and up, unless
        // the caller sets the level.
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        // ZooKeeper warns at every close that the server closed the socket.
        if (System.getProperty("org.slf4j.simpleLogger.log.org.apache.zookeeper.ClientCnxn") == null) {
            System.setProperty("org.slf4j.simpleLogger.log.org.apache.zookeeper.ClientCnxn", "error");
        }
        Options o = parse(args);
        if (o.bench > 0) {
            bench(o);
            return;
        }
        CuratorFramework client = newClient(o);
        if (o.events) {
            client.getConnectionStateListenable().addListener(
                    (c, s) -> say("event " + s.name().toLowerCase(Locale.ROOT)));
        }
        new Peer(client, recipe(client, o)).run();
    }
}
