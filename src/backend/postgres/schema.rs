//! baton's schema on PostgreSQL: versioned migrations, run on connect under an advisory lock.
//!
//! Every state change is one call of a PL/pgSQL function (one statement, one implicit
//! transaction), so that requests from many tasks can share one pipelined connection and a
//! transaction-pooling proxy in front of the request connection would see nothing but
//! self-contained transactions. `{s}` stands for the schema name (checked to be a plain
//! identifier before it is put into SQL).

/// The advisory-lock class (`pg_advisory_xact_lock(int4, int4)`'s first key) of every lock
/// baton takes: `"bato"` in ASCII. The second key is `hashtext` of the schema and the queue.
pub(super) const LOCK_CLASS: i32 = 0x6261_746f;

/// How many migrations there are: the newest schema version.
pub(super) const MIGRATIONS: usize = 10;

/// The SQL of migration `version` (which brings the schema from `version - 1` to `version`)
/// for `schema`; `None` past the last.
pub(super) fn migration(version: usize, schema: &str) -> Option<String> {
    let sql = match version {
        1 => V1.to_owned(),
        2 => format!(
            "{V2}{}DROP TRIGGER entries_inserted ON {{s}}.entries;\n\n{}",
            ENTRIES_CHANGED.replace("{head_suffix}", ""),
            enqueue(
                "enqueue",
                "nextval('{s}.tokens')",
                Tail::Nothing,
                Sweep::TheQueue
            )
        ),
        3 => format!(
            "{V3}{}",
            enqueue("enqueue", TIMELINE_TOKEN, Tail::Nothing, Sweep::TheQueue)
        ),
        4 => format!(
            "{V4}{}{}",
            ENTRIES_CHANGED.replace("{head_suffix}", " || ' ' || {s}.timeline()"),
            enqueue(
                "enqueue_v4",
                TIMELINE_TOKEN,
                Tail::Timeline,
                Sweep::TheQueue
            )
        ),
        5 => enqueue(
            "enqueue_v4",
            TIMELINE_TOKEN,
            Tail::Timeline,
            Sweep::AsTheHead,
        ),
        6 => V6.to_owned(),
        7 => V7.to_owned(),
        8 => format!(
            "{V8}{}{}{}{}",
            ENTRIES_CHANGED.replace("{head_suffix}", NOTICE_POSITION),
            enqueue("enqueue", NEXT_TOKEN, Tail::Nothing, Sweep::TheQueue),
            enqueue("enqueue_v4", NEXT_TOKEN, Tail::Timeline, Sweep::AsTheHead),
            enqueue("enqueue_v8", NEXT_TOKEN, Tail::Epoch, Sweep::AsTheHead)
        ),
        9 => format!(
            "{V9}{}{}{}{}",
            ENTRIES_CHANGED.replace("{head_suffix}", NOTICE_POSITION),
            enqueue("enqueue", NEXT_TOKEN, Tail::Nothing, Sweep::TheQueue),
            enqueue("enqueue_v4", NEXT_TOKEN, Tail::Timeline, Sweep::AsTheHead),
            enqueue("enqueue_v8", NEXT_TOKEN, Tail::Epoch, Sweep::AsTheHead)
        )
        .replace(KEY_RANGE_PREDECESSOR, PARENT_PREDECESSOR)
        .replace(KEY_RANGE_HEAD_SWEEP, PARENT_HEAD_SWEEP)
        .replace(KEY_RANGE_HEAD, PARENT_HEAD)
        .replace(PLAIN_PLPGSQL, INDEXED_PLPGSQL),
        10 => V10.to_owned(),
        _ => return None,
    };
    Some(render(&sql, schema))
}

/// Version 1.
///
/// Tokens come from the sequence `tokens`. An entry's token is drawn only after its
/// transaction holds the advisory lock of every queue the entry is in (the prefixes of its key
/// at each `/`), and that lock is held until commit: within one queue, token order is commit
/// order, so a read that sees an entry sees every older one of the queue.
const V1: &str = r#"
CREATE SEQUENCE {s}.tokens AS bigint;
CREATE SEQUENCE {s}.lease_ids AS bigint;

CREATE TABLE {s}.leases (
    id        bigint PRIMARY KEY,
    ttl_ms    bigint NOT NULL CHECK (ttl_ms > 0),
    deadline  timestamptz NOT NULL,
    -- The highest stamp an abandon sent for this lease: an enqueue with a stamp at or below
    -- it was given up by its caller and creates nothing.
    abandoned bigint NOT NULL DEFAULT 0
);
CREATE INDEX leases_deadline ON {s}.leases (deadline);

CREATE TABLE {s}.entries (
    key   text COLLATE "C" PRIMARY KEY,
    token bigint NOT NULL UNIQUE,
    lease bigint NOT NULL REFERENCES {s}.leases (id) ON DELETE CASCADE,
    value bytea NOT NULL
);
CREATE INDEX entries_lease ON {s}.entries (lease);

CREATE TABLE {s}.kv (
    key   text COLLATE "C" PRIMARY KEY,
    value bytea NOT NULL
);

-- PgFence: per resource, the highest token accepted, the lock it is bound to, the data.
CREATE TABLE {s}.fences (
    resource  text PRIMARY KEY,
    token     bigint NOT NULL CHECK (token > 0),
    lock_name text,
    data      bytea
);

-- Milliseconds left until `d` on the server's clock (0 if passed).
CREATE FUNCTION {s}.ms_left(d timestamptz) RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT greatest(0, ceil(extract(epoch FROM (d - clock_timestamp())) * 1000))::bigint
$$;

-- The queues a key is in: its prefixes before each '/'.
CREATE FUNCTION {s}.queues_of(k text) RETURNS SETOF text LANGUAGE sql IMMUTABLE AS $$
    SELECT left(k, p - 1) FROM generate_series(1, length(k)) AS p
    WHERE substr(k, p, 1) = '/' AND p > 1
$$;

-- The channel of a key, queue or plain key: what the client computes too (md5 of the
-- schema and the name).
CREATE FUNCTION {s}.chan(kind text, name text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'b' || kind || md5('{s}|' || name)
$$;

-- Every change of entries is announced: a deleted entry on its own channel (the one waiter
-- of that entry wakes), and every change on the channel of each queue the entry is in (for
-- observers), one notification per statement and queue, rows in token order.
CREATE FUNCTION {s}.entries_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify({s}.chan('e', key), token::text) FROM gone;
        FOR r IN
            SELECT q, string_agg('D ' || token || ' ' || encode(convert_to(key, 'UTF8'), 'hex'),
                                 E'\n' ORDER BY token) AS body
            FROM gone, LATERAL {s}.queues_of(key) AS q GROUP BY q
        LOOP
            PERFORM pg_notify({s}.chan('q', r.q),
                              CASE WHEN length(r.body) > 7000 THEN 'R' ELSE r.body END);
        END LOOP;
    ELSE
        FOR r IN
            SELECT q, string_agg('P ' || token || ' ' || lease || ' '
                                 || encode(convert_to(key, 'UTF8'), 'hex') || ' '
                                 || encode(value, 'hex'), E'\n' ORDER BY token) AS body
            FROM fresh, LATERAL {s}.queues_of(key) AS q GROUP BY q
        LOOP
            PERFORM pg_notify({s}.chan('q', r.q),
                              CASE WHEN length(r.body) > 7000 THEN 'R' ELSE r.body END);
        END LOOP;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER entries_deleted AFTER DELETE ON {s}.entries
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {s}.entries_changed();
CREATE TRIGGER entries_inserted AFTER INSERT ON {s}.entries
    REFERENCING NEW TABLE AS fresh FOR EACH STATEMENT EXECUTE FUNCTION {s}.entries_changed();
CREATE TRIGGER entries_updated AFTER UPDATE ON {s}.entries
    REFERENCING NEW TABLE AS fresh FOR EACH STATEMENT EXECUTE FUNCTION {s}.entries_changed();

CREATE FUNCTION {s}.kv_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({s}.chan('k', CASE WHEN TG_OP = 'DELETE' THEN OLD.key ELSE NEW.key END), '');
    RETURN NULL;
END $$;
CREATE TRIGGER kv_changed AFTER INSERT OR UPDATE OR DELETE ON {s}.kv
    FOR EACH ROW EXECUTE FUNCTION {s}.kv_changed();

-- Ends every expired lease among those of the entries of queue `q` (their entries go with
-- them, and their waiters are woken). Returns how many leases it ended.
CREATE FUNCTION {s}.end_expired(q text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM {s}.leases WHERE id IN (
        SELECT e.lease FROM {s}.entries e JOIN {s}.leases l ON l.id = e.lease
        WHERE e.key >= (q || '/') COLLATE "C" AND e.key < (q || '0') COLLATE "C" AND l.deadline <= clock_timestamp())
      AND deadline <= clock_timestamp();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE FUNCTION {s}.grant_lease(ttl bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    lid bigint;
BEGIN
    -- Leases of owners that vanished without entries are ended here, a few at a time: no
    -- reaper process.
    DELETE FROM {s}.leases WHERE id IN (
        SELECT id FROM {s}.leases WHERE deadline <= clock_timestamp()
        ORDER BY deadline LIMIT 8 FOR UPDATE SKIP LOCKED)
      AND deadline <= clock_timestamp();
    INSERT INTO {s}.leases (id, ttl_ms, deadline)
        VALUES (nextval('{s}.lease_ids'), ttl, clock_timestamp() + ttl * interval '1 millisecond')
        RETURNING id INTO lid;
    RETURN lid;
END $$;

-- Renews a lease that has not expired; its TTL, or NULL if it is gone (expired leases are
-- never renewed, whether or not someone ended them yet).
CREATE FUNCTION {s}.renew(lid bigint) RETURNS bigint LANGUAGE sql AS $$
    UPDATE {s}.leases SET deadline = clock_timestamp() + ttl_ms * interval '1 millisecond'
    WHERE id = lid AND deadline > clock_timestamp()
    RETURNING ttl_ms
$$;

-- Creates `q/t` for lease `l` unless it exists, and reads the newest live entry before it.
-- status: 'ok', 'lost' (the lease is gone or expired), 'abandoned' (the caller gave up on
-- this request before it arrived).
CREATE FUNCTION {s}.enqueue(q text, t text, l bigint, v bytea, stamp bigint,
    OUT status text, OUT e_token bigint, OUT e_lease bigint, OUT e_value bytea,
    OUT p_key text, OUT p_token bigint, OUT p_lease bigint, OUT p_value bytea)
LANGUAGE plpgsql AS $$
DECLARE
    k text := q || '/' || t;
    qn text;
BEGIN
    FOR qn IN SELECT x FROM {s}.queues_of(k) AS x ORDER BY length(x) LOOP
        PERFORM pg_advisory_xact_lock({class}, hashtext('{s}|' || qn));
    END LOOP;
    -- Whoever finds a lease expired ends it, in the transaction that decides the head.
    PERFORM {s}.end_expired(q);
    SELECT e.token, e.lease, e.value INTO e_token, e_lease, e_value
        FROM {s}.entries e WHERE e.key = k;
    IF NOT FOUND THEN
        PERFORM 1 FROM {s}.leases WHERE id = l AND deadline > clock_timestamp() FOR SHARE;
        IF NOT FOUND THEN
            status := 'lost';
            RETURN;
        END IF;
        PERFORM 1 FROM {s}.leases WHERE id = l AND abandoned < stamp;
        IF NOT FOUND THEN
            status := 'abandoned';
            RETURN;
        END IF;
        e_token := nextval('{s}.tokens');
        INSERT INTO {s}.entries (key, token, lease, value) VALUES (k, e_token, l, v);
        e_lease := l;
        e_value := v;
    END IF;
    SELECT e.key, e.token, e.lease, e.value INTO p_key, p_token, p_lease, p_value
        FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.key >= (q || '/') COLLATE "C" AND e.key < (q || '0') COLLATE "C" AND e.token < e_token
          AND ls.deadline > clock_timestamp()
        ORDER BY e.token DESC LIMIT 1;
    status := 'ok';
END $$;

-- Makes every enqueue of lease `l` sent with a stamp at or below `stamp` create nothing from
-- now on (the lease row is locked by both), then reads the entry.
CREATE FUNCTION {s}.abandon(k text, l bigint, stamp bigint,
    OUT e_token bigint, OUT e_lease bigint, OUT e_value bytea)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {s}.leases SET abandoned = greatest(abandoned, stamp) WHERE id = l;
    SELECT e.token, e.lease, e.value INTO e_token, e_lease, e_value
        FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.key = k AND ls.deadline > clock_timestamp();
END $$;

-- Milliseconds until the lease of entry (k, t) could expire, or NULL if the entry is gone;
-- ends its lease first if that has expired.
CREATE FUNCTION {s}.alive(k text, t bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    left_ms bigint;
BEGIN
    DELETE FROM {s}.leases WHERE id = (SELECT lease FROM {s}.entries WHERE key = k AND token = t)
        AND deadline <= clock_timestamp();
    SELECT {s}.ms_left(ls.deadline) INTO left_ms
        FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.key = k AND e.token = t;
    RETURN left_ms;
END $$;

-- Applies puts (kind 'p') and deletes ('d') of plain keys, in order, if entry (k, t) exists
-- with a live lease; the entry's row is locked meanwhile, so it cannot go in between.
CREATE FUNCTION {s}.guarded(k text, t bigint, kinds text[], keys text[], vals bytea[])
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.key = k AND e.token = t AND ls.deadline > clock_timestamp()
        FOR SHARE OF e;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    FOR i IN 1 .. coalesce(array_length(kinds, 1), 0) LOOP
        IF kinds[i] = 'p' THEN
            INSERT INTO {s}.kv (key, value) VALUES (keys[i], vals[i])
                ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
        ELSE
            DELETE FROM {s}.kv WHERE key = keys[i];
        END IF;
    END LOOP;
    RETURN true;
END $$;

-- Compare-and-set of a plain key (`expected` NULL: absent).
CREATE FUNCTION {s}.swap(k text, expected bytea, v bytea) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF expected IS NULL THEN
        INSERT INTO {s}.kv (key, value) VALUES (k, v) ON CONFLICT (key) DO NOTHING;
    ELSE
        UPDATE {s}.kv SET value = v WHERE key = k AND value = expected;
    END IF;
    RETURN FOUND;
END $$;

-- The live entries of `q` for an observer: taken while no write to entries can commit, and
-- followed by a marker on the queue's channel in the same transaction, so that every
-- notification before the marker is in the snapshot and every one after it is not.
CREATE FUNCTION {s}.snapshot(q text, marker text)
RETURNS TABLE (key text, token bigint, lease bigint, value bytea) LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE {s}.entries IN SHARE MODE;
    RETURN QUERY SELECT e.key::text, e.token, e.lease, e.value
        FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.key >= (q || '/') COLLATE "C" AND e.key < (q || '0') COLLATE "C" AND ls.deadline > clock_timestamp()
        ORDER BY e.token;
    PERFORM pg_notify({s}.chan('q', q), 'M ' || marker);
END $$;

-- For an observer about to report a head (the entry of lease `cand`): ends the expired leases
-- of the queue, and says how many it ended, which entry is the head now, how long its lease
-- has left, and whether lease `cand` is still live.
CREATE FUNCTION {s}.reap(q text, cand bigint, OUT ended integer, OUT head_token bigint,
    OUT head_ms bigint, OUT cand_live boolean)
LANGUAGE plpgsql AS $$
BEGIN
    ended := {s}.end_expired(q);
    SELECT e.token, {s}.ms_left(ls.deadline) INTO head_token, head_ms
        FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.key >= (q || '/') COLLATE "C" AND e.key < (q || '0') COLLATE "C"
        ORDER BY e.token LIMIT 1;
    cand_live := EXISTS (SELECT 1 FROM {s}.leases WHERE id = cand AND deadline > clock_timestamp());
END $$;
"#;

/// Version 2: the hot path made cheaper (docs/design.md, 2026-11-26). A deletion's
/// notification names the head its queue has then; queue notifications only for observed
/// queues (`observed`); the enqueue announces its entry itself (no insert trigger) and builds
/// its queue prefixes without a planned set-returning function.
const V2: &str = r#"
-- The queue channels someone LISTENs on (an observer's listening connection, by its backend
-- pid): the triggers announce a queue's changes only while it has a row here. Each listening
-- connection adds its row before its observer reads the queue, and removes it when it stops
-- listening; rows of connections that are gone are removed by the next one that adds.
CREATE TABLE {s}.observed (
    channel text NOT NULL,
    pid     integer NOT NULL,
    PRIMARY KEY (channel, pid)
);
"#;

/// The entries' trigger function of versions 2 and 4, which differ in what a deletion's
/// notification says after the head (`{head_suffix}`): version 4 adds the timeline the
/// deleting transaction ran on.
const ENTRIES_CHANGED: &str = r#"
-- Every change of entries is announced: a deleted entry on its own channel (the one waiter
-- of that entry wakes; the payload is its token and the head its queue has now), and every
-- change on the channel of each observed queue the entry is in (for observers: see
-- `observed`), one notification per statement and queue, rows in token order.
CREATE OR REPLACE FUNCTION {s}.entries_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP = 'DELETE' THEN
        -- With the token: the head of the entry's queue now, which spares its waiter a read.
        PERFORM pg_notify({s}.chan('e', g.key), g.token::text || coalesce(' ' || (
                SELECT n.token FROM {s}.entries n JOIN {s}.leases ls ON ls.id = n.lease
                WHERE n.key >= (g.q || '/') COLLATE "C" AND n.key < (g.q || '0') COLLATE "C"
                  AND ls.deadline > clock_timestamp()
                ORDER BY n.token LIMIT 1){head_suffix}, ''))
            FROM (SELECT key, token, left(key, length(key) - strpos(reverse(key), '/')) AS q
                  FROM gone) AS g;
        IF NOT EXISTS (SELECT 1 FROM {s}.observed) THEN
            RETURN NULL;
        END IF;
        FOR r IN
            SELECT q, string_agg('D ' || token || ' ' || encode(convert_to(key, 'UTF8'), 'hex'),
                                 E'\n' ORDER BY token) AS body
            FROM gone, LATERAL {s}.queues_of(key) AS q
            WHERE {s}.chan('q', q) IN (SELECT channel FROM {s}.observed) GROUP BY q
        LOOP
            PERFORM pg_notify({s}.chan('q', r.q),
                              CASE WHEN length(r.body) > 7000 THEN 'R' ELSE r.body END);
        END LOOP;
    ELSIF EXISTS (SELECT 1 FROM {s}.observed) THEN
        FOR r IN
            SELECT q, string_agg('P ' || token || ' ' || lease || ' '
                                 || encode(convert_to(key, 'UTF8'), 'hex') || ' '
                                 || encode(value, 'hex'), E'\n' ORDER BY token) AS body
            FROM fresh, LATERAL {s}.queues_of(key) AS q
            WHERE {s}.chan('q', q) IN (SELECT channel FROM {s}.observed) GROUP BY q
        LOOP
            PERFORM pg_notify({s}.chan('q', r.q),
                              CASE WHEN length(r.body) > 7000 THEN 'R' ELSE r.body END);
        END LOOP;
    END IF;
    RETURN NULL;
END $$;
"#;

/// Which expired leases an enqueue ends, in the transaction that decides the head.
#[derive(Clone, Copy)]
enum Sweep {
    /// Versions 2 to 4: those of its whole queue, a read of every entry at every enqueue
    /// (0.7 ms an enqueue at 12,000 entries; 10,000 waiters took 87 s to queue).
    TheQueue,
    /// Version 5: only an entry that finds itself the head ends them, and only those of the
    /// entries before it (all of expired leases, or it would not be the head). The grant
    /// decision is the same: every read counts live leases only.
    AsTheHead,
}

/// What an enqueue answers besides the entry and its predecessor.
#[derive(Clone, Copy)]
enum Tail {
    /// Versions 2 and 3: nothing.
    Nothing,
    /// Versions 4 to 7 (`enqueue_v4`): when the entry is the head, the timeline and how long
    /// baton has known it (`timeline_age`, version 4).
    Timeline,
    /// Version 8 (`enqueue_v8`): always, the store's epoch and position (`epoch_state`).
    Epoch,
}

/// The enqueue function `name` of versions 2 to 8: `new_token` makes the new entry's token;
/// `tail` says what else it answers; `sweep` says which expired leases it ends. Version 4's
/// is a new function beside version 3's rather than a new result type for it: a client of
/// version 3 still running keeps its prepared statement (and version 8's beside version 4's,
/// for the same reason). Versions 5 and 8 replace the earlier ones in place (the same
/// arguments and results): clients still running keep their prepared statements and get the
/// new body.
fn enqueue(name: &str, new_token: &str, tail: Tail, sweep: Sweep) -> String {
    let (outs, tail) = match tail {
        Tail::Nothing => ("", ""),
        Tail::Timeline => (
            ",\n    OUT tl integer, OUT age_ms bigint",
            "    -- The head: how long baton has known this timeline (the restart grace).\n    \
             IF p_key IS NULL THEN\n        \
             SELECT a.tl, a.age_ms INTO tl, age_ms FROM {s}.timeline_age() a;\n    \
             END IF;\n",
        ),
        Tail::Epoch => (
            ",\n    OUT marker text, OUT age_ms bigint, OUT incarnation text, OUT tl integer, \
             OUT lsn bigint, OUT started bigint",
            "    -- The store's epoch and position, read after the grant was decided.\n    \
             SELECT a.marker, a.age_ms, a.incarnation, a.tl, a.lsn, a.started\n        \
             INTO marker, age_ms, incarnation, tl, lsn, started FROM {s}.epoch_state() a;\n",
        ),
    };
    ENQUEUE
        .replace("{name}", name)
        .replace("{new_token}", new_token)
        .replace("{grace_outs}", outs)
        .replace(
            "{sweep}",
            match sweep {
                Sweep::TheQueue => SWEEP,
                Sweep::AsTheHead => "",
            },
        )
        .replace(
            "{head_sweep}",
            match sweep {
                Sweep::TheQueue => "",
                Sweep::AsTheHead => HEAD_SWEEP,
            },
        )
        .replace("{grace_tail}", tail)
}

/// [`Sweep::TheQueue`]'s statement.
const SWEEP: &str = r#"    -- Whoever finds a lease expired ends it, in the transaction that decides the head
    -- (end_expired's statement, inline: a nested function call costs more than the statement).
    DELETE FROM {s}.leases WHERE id IN (
        SELECT e.lease FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.key >= (q || '/') COLLATE "C" AND e.key < (q || '0') COLLATE "C"
          AND ls.deadline <= clock_timestamp())
      AND deadline <= clock_timestamp();
"#;

/// [`Sweep::AsTheHead`]'s statement.
const HEAD_SWEEP: &str = r#"    IF p_key IS NULL THEN
        -- Whatever is before the head is of expired leases: end them, in the
        -- transaction that decides the head.
        DELETE FROM {s}.leases WHERE id IN (
            SELECT e.lease FROM {s}.entries e
            WHERE e.key >= (q || '/') COLLATE "C" AND e.key < (q || '0') COLLATE "C"
              AND e.token < e_token)
          AND deadline <= clock_timestamp();
    END IF;
"#;

/// See [`enqueue`].
const ENQUEUE: &str = r#"
-- Creates `q/t` for lease `l` unless it exists, and reads the newest live entry before it.
-- status: 'ok', 'lost' (the lease is gone or expired), 'abandoned' (the caller gave up on
-- this request before it arrived).
CREATE OR REPLACE FUNCTION {s}.{name}(q text, t text, l bigint, v bytea, stamp bigint,
    OUT status text, OUT e_token bigint, OUT e_lease bigint, OUT e_value bytea,
    OUT p_key text, OUT p_token bigint, OUT p_lease bigint, OUT p_value bytea{grace_outs})
LANGUAGE plpgsql AS $$
DECLARE
    k text := q || '/' || t;
    part text;
    qn text;
    qs text[] := '{}';
    body text;
BEGIN
    -- The queues `k` is in (what queues_of(k) says, shortest first), built here in a loop:
    -- that set-returning SQL function was planned again at every call.
    FOREACH part IN ARRAY string_to_array(q, '/') LOOP
        qn := CASE WHEN qn IS NULL THEN part ELSE qn || '/' || part END;
        IF qn <> '' THEN
            PERFORM pg_advisory_xact_lock({class}, hashtext('{s}|' || qn));
            qs := qs || qn;
        END IF;
    END LOOP;
{sweep}    SELECT e.token, e.lease, e.value INTO e_token, e_lease, e_value
        FROM {s}.entries e WHERE e.key = k;
    IF NOT FOUND THEN
        PERFORM 1 FROM {s}.leases WHERE id = l AND deadline > clock_timestamp() FOR SHARE;
        IF NOT FOUND THEN
            status := 'lost';
            RETURN;
        END IF;
        PERFORM 1 FROM {s}.leases WHERE id = l AND abandoned < stamp;
        IF NOT FOUND THEN
            status := 'abandoned';
            RETURN;
        END IF;
        e_token := {new_token};
        INSERT INTO {s}.entries (key, token, lease, value) VALUES (k, e_token, l, v);
        -- Announced here rather than by a trigger (enqueue is the only insert; a statement
        -- trigger's transition table cost every enqueue more than this test).
        IF EXISTS (SELECT 1 FROM {s}.observed) THEN
            body := 'P ' || e_token || ' ' || l || ' ' || encode(convert_to(k, 'UTF8'), 'hex')
                || ' ' || encode(v, 'hex');
            IF length(body) > 7000 THEN
                body := 'R';
            END IF;
            FOR qn IN SELECT x FROM unnest(qs) AS x
                      WHERE {s}.chan('q', x) IN (SELECT channel FROM {s}.observed)
            LOOP
                PERFORM pg_notify({s}.chan('q', qn), body);
            END LOOP;
        END IF;
        e_lease := l;
        e_value := v;
    END IF;
    SELECT e.key, e.token, e.lease, e.value INTO p_key, p_token, p_lease, p_value
        FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.key >= (q || '/') COLLATE "C" AND e.key < (q || '0') COLLATE "C" AND e.token < e_token
          AND ls.deadline > clock_timestamp()
        ORDER BY e.token DESC LIMIT 1;
{head_sweep}{grace_tail}    status := 'ok';
END $$;
"#;

/// A new token in version 3: the timeline of the server's WAL in the top bits, the sequence
/// below (2^40 values per timeline). See `V3`.
const TIMELINE_TOKEN: &str = "({s}.timeline()::bigint << 40) + nextval('{s}.tokens')";

/// Version 3: tokens and leases carry the WAL timeline (docs/design.md, 2026-11-26). A
/// promoted standby or a recovery to a point in time starts a new, higher timeline; an
/// asynchronous standby may lack the primary's last commits: the last advances of the
/// sequence, so that the sequence alone would hand out tokens again, and the last releases,
/// whose entries come back. With the timeline above the sequence, every token of the new
/// timeline is above every token of the old one (tokens made before this version, timeline
/// bits 0, are below every token made after it). A lease is renewed only on the timeline it
/// was granted on: after a promotion every session is told lost at its next renewal and its
/// lease runs out, and with it whatever the old primary's lost commits left behind.
const V3: &str = r#"
-- The timeline the server writes its WAL on now (the first 8 hex digits of the current WAL
-- segment's name).
CREATE FUNCTION {s}.timeline() RETURNS integer LANGUAGE sql VOLATILE AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
$$;

-- The timeline each lease was granted on (the leases of before this version: the current).
ALTER TABLE {s}.leases ADD COLUMN timeline integer NOT NULL DEFAULT 0;
UPDATE {s}.leases SET timeline = {s}.timeline();
ALTER TABLE {s}.leases ALTER COLUMN timeline SET DEFAULT {s}.timeline();

-- Renews a lease that has not expired and was granted on the current timeline; its TTL, or
-- NULL (expired leases are never renewed, nor those of a timeline before a promotion).
CREATE OR REPLACE FUNCTION {s}.renew(lid bigint) RETURNS bigint LANGUAGE sql AS $$
    UPDATE {s}.leases SET deadline = clock_timestamp() + ttl_ms * interval '1 millisecond'
    WHERE id = lid AND deadline > clock_timestamp() AND timeline = {s}.timeline()
    RETURNING ttl_ms
$$;
"#;

/// Version 4: the restart grace after a new timeline (docs/design.md, 2026-11-26). A standby
/// promoted by a failover may lack the old primary's last grants and renewals, so a lock may
/// look free, or a lease older than it is, while its holder still believes it holds. Every
/// grant decision reads how long baton has known the current timeline (`timeline_age`), and
/// the client grants nothing until its restart grace has passed on it
/// (`PgOptions::with_restart_grace`). A deletion's notification names the timeline it was
/// sent on, so that a waiter woken on a timeline still in its grace reads again instead of
/// taking the notification's word.
const V4: &str = r#"
-- The timelines baton has run on, and when it first saw each (`-infinity`: the timeline it
-- was created on, or timeline 1, which was never promoted nor recovered: nothing was lost).
CREATE TABLE {s}.timelines (
    timeline integer PRIMARY KEY,
    began    timestamptz NOT NULL
);
INSERT INTO {s}.timelines (timeline, began) VALUES ({s}.timeline(),
    CASE WHEN {s}.timeline() = 1 THEN '-infinity'::timestamptz ELSE clock_timestamp() END);

-- The current timeline, and how many milliseconds ago baton first saw it (recorded at the
-- first call on it); NULL: since before anything could have been lost.
CREATE FUNCTION {s}.timeline_age(OUT tl integer, OUT age_ms bigint) LANGUAGE plpgsql AS $$
DECLARE
    b timestamptz;
BEGIN
    tl := {s}.timeline();
    SELECT t.began INTO b FROM {s}.timelines t WHERE t.timeline = tl;
    IF NOT FOUND THEN
        INSERT INTO {s}.timelines (timeline, began) VALUES (tl, clock_timestamp())
            ON CONFLICT (timeline) DO NOTHING;
        b := clock_timestamp();
    END IF;
    IF b <> '-infinity' THEN
        age_ms := floor(extract(epoch FROM (clock_timestamp() - b)) * 1000)::bigint;
    END IF;
END $$;
"#;

/// Version 6: a new lease's sweep of expired ones reads only those (docs/design.md,
/// 2026-11-26). It compared each lease's deadline with `clock_timestamp()`, which is volatile
/// and so cannot bound an index scan: the scan of `leases_deadline` went through every lease
/// to find none expired (1.3 ms at 10,000 leases; 3.1 s of the server's time to open 10,000
/// sessions); and without statistics on a table that grew fast the planner sorted the whole
/// table instead. Now the time is read once, and the sweep runs only if the earliest deadline
/// (`min`, one entry of the index) has passed. Same signature: clients of earlier versions
/// still running keep their prepared statement.
const V6: &str = r#"
CREATE OR REPLACE FUNCTION {s}.grant_lease(ttl bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    lid bigint;
    now_ts timestamptz := clock_timestamp();
BEGIN
    -- Leases of owners that vanished without entries are ended here, a few at a time: no
    -- reaper process. Only if one has expired: min() reads one entry of the deadline index,
    -- whatever the planner's statistics say (with none yet, it sorted the whole table).
    IF (SELECT min(deadline) FROM {s}.leases) <= now_ts THEN
        DELETE FROM {s}.leases WHERE id IN (
            SELECT id FROM {s}.leases WHERE deadline <= now_ts
            ORDER BY deadline LIMIT 8 FOR UPDATE SKIP LOCKED)
          AND deadline <= clock_timestamp();
    END IF;
    INSERT INTO {s}.leases (id, ttl_ms, deadline)
        VALUES (nextval('{s}.lease_ids'), ttl, clock_timestamp() + ttl * interval '1 millisecond')
        RETURNING id INTO lid;
    RETURN lid;
END $$;
"#;

/// Version 7: lease ids never repeat across incarnations of the schema (docs/design.md,
/// 2026-11-26). The sequence started at 1, so a schema dropped and created again (or a server
/// created anew at the same address) handed the first newcomer the id of a lease that a
/// running holder still renewed: the holder's renewals renewed the newcomer's lease, and it
/// was never told that its own had gone. The sequence now starts at the server clock's
/// microseconds since 1970 when the schema is created or migrated: an incarnation created
/// later starts above every id an earlier one handed out (one lease a microsecond would be
/// needed to catch up), unless the server's clock is set back across the two.
const V7: &str = r#"
SELECT setval('{s}.lease_ids', greatest(last_value,
    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)) FROM {s}.lease_ids;
"#;

/// A deletion's notice from version 8 on: after the head, the timeline and the start of the
/// postmaster that sent it (µs), so that a waiter takes its word only from a server it has
/// had an answer from (every way back in time is a new postmaster or a new timeline), and
/// reads otherwise; clients of versions 4 to 7 read the timeline and ignore the rest.
const NOTICE_POSITION: &str = " || ' ' || {s}.timeline() || ' ' || {s}.started_us()";

/// A new token from version 8 on: as in version 3, after the sequences were floored on this
/// postmaster's start (`next_token`).
const NEXT_TOKEN: &str = "{s}.next_token()";

/// Version 8: store epochs (issue #36; docs/design.md, 2026-11-28).
///
/// - Ids and tokens never repeat. A server restored from an earlier base backup, a standby
///   promoted after it missed commits, and a crash all bring sequences back to an earlier
///   value (a sequence is WAL-logged 32 ahead, and a backup holds what it held then): lease
///   ids, entry keys (made of lease ids) and tokens were handed out again. Every one of them
///   means a new postmaster, so before its first draw on each postmaster both sequences jump
///   to at least the server clock's microseconds (`floor_once`, checked once per session):
///   above every value drawn before, which grew by one a draw, far slower than the clock.
///   Tokens start at the clock too (they started at 1: a schema created again handed out
///   tokens below the old ones).
/// - The store's epoch (`store`): an incarnation drawn when the schema is created, and the
///   marker of the epoch in force (`crate::epoch`), which every grant decision, grant of a
///   lease and renewal answers with the timeline and the flush LSN (`epoch_state`). A new
///   timeline (a promotion, a recovery to a point in time) begins an epoch on the server at
///   its first call there; a client that sees the LSN go back (a restore, a standby that
///   missed commits) begins one (`begin_epoch`); a schema without a marker (created anew)
///   is a new epoch too, unless an operator marks it new (`PgBackend::init_store`). Every
///   client compares the marker it is answered with: a new one ends its sessions from before
///   and holds its grants back for the restart grace.
/// - The functions of earlier versions keep their signatures and draw through the floor:
///   clients of versions 3 to 7 still running keep their prepared statements.
const V8: &str = r#"
CREATE FUNCTION {s}.clock_us() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;

-- The WAL flushed so far, in bytes: what a client compares (never the insert position, which
-- a crash may legitimately lose).
CREATE FUNCTION {s}.flush_lsn() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint
$$;

-- When this postmaster started, in µs: a restore, a crash and a re-created server all mean a
-- new one.
CREATE FUNCTION {s}.started_us() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint
$$;

-- One row: the incarnation of this schema (drawn when it is created), the marker of the
-- store epoch in force (NULL: none yet, first use begins one), when it began ('-infinity':
-- marked new, nothing to wait), the timeline it is of, and the postmaster start the
-- sequences were last floored on.
CREATE TABLE {s}.store (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    incarnation text NOT NULL,
    epoch       text,
    began       timestamptz NOT NULL,
    timeline    integer NOT NULL,
    floored     timestamptz
);

-- A new epoch's marker (crate::epoch::Epoch::encode): a random id, and its base, the
-- server clock's microseconds (later epochs have higher ones).
CREATE FUNCTION {s}.new_marker() RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT 'baton-epoch/1 ' || md5(random()::text || clock_timestamp()::text
        || pg_backend_pid()::text) || ' ' || {s}.clock_us() || ' 0'
$$;

-- Moves both sequences to at least the clock's microseconds, and tokens above `floor` (the
-- highest token a client saw).
CREATE FUNCTION {s}.floor_sequences(floor bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := {s}.clock_us();
BEGIN
    PERFORM setval('{s}.lease_ids', greatest(last_value, now_us)) FROM {s}.lease_ids;
    PERFORM setval('{s}.tokens', greatest(last_value, now_us,
        floor - ({s}.timeline()::bigint << 40))) FROM {s}.tokens;
END $$;

-- Floors the sequences once per postmaster start, before its first draw (a restore, a
-- promotion or a crash brought them back). Checked once per session: the setting is
-- rolled back with a transaction that fails.
CREATE FUNCTION {s}.floor_once() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT floored FROM {s}.store) IS DISTINCT FROM pg_postmaster_start_time() THEN
        PERFORM pg_advisory_xact_lock({class}, hashtext('{s}|floor'));
        IF (SELECT floored FROM {s}.store) IS DISTINCT FROM pg_postmaster_start_time() THEN
            PERFORM {s}.floor_sequences(0);
            UPDATE {s}.store SET floored = pg_postmaster_start_time();
        END IF;
    END IF;
    PERFORM set_config('baton_floor.{s}', 'y', false);
END $$;

CREATE FUNCTION {s}.next_token() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('baton_floor.{s}', true) IS DISTINCT FROM 'y' THEN
        PERFORM {s}.floor_once();
    END IF;
    RETURN ({s}.timeline()::bigint << 40) + nextval('{s}.tokens');
END $$;

CREATE FUNCTION {s}.next_lease_id() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('baton_floor.{s}', true) IS DISTINCT FROM 'y' THEN
        PERFORM {s}.floor_once();
    END IF;
    RETURN nextval('{s}.lease_ids');
END $$;

-- The store's epoch and position: its marker (NULL: none yet), how long ago it began (NULL:
-- marked new), the incarnation, the timeline, the flush LSN and when the postmaster started.
-- The first call on a new timeline begins an epoch there: the new primary may lack the old
-- one's last commits.
CREATE FUNCTION {s}.epoch_state(OUT marker text, OUT age_ms bigint, OUT incarnation text,
    OUT tl integer, OUT lsn bigint, OUT started bigint)
LANGUAGE plpgsql AS $$
DECLARE
    st {s}.store;
BEGIN
    tl := {s}.timeline();
    SELECT * INTO st FROM {s}.store;
    IF st.timeline <> tl THEN
        UPDATE {s}.store SET timeline = tl, began = clock_timestamp(),
            epoch = CASE WHEN epoch IS NULL THEN NULL ELSE {s}.new_marker() END
            WHERE timeline <> tl;
        IF FOUND THEN
            PERFORM {s}.floor_sequences(0);
        END IF;
        SELECT * INTO st FROM {s}.store;
    END IF;
    marker := st.epoch;
    incarnation := st.incarnation;
    IF st.began <> '-infinity' THEN
        age_ms := floor(extract(epoch FROM (clock_timestamp() - st.began)) * 1000)::bigint;
    END IF;
    lsn := {s}.flush_lsn();
    started := {s}.started_us();
END $$;

-- Begins a new epoch in place of `expected` (NULL: none), unless another client changed the
-- marker meanwhile; with no grace if `marked_new` (an operator's init). Floors the tokens
-- above `floor`, the highest token the client saw. Answers the epoch in force.
CREATE FUNCTION {s}.begin_epoch(expected text, marked_new boolean, floor bigint,
    OUT begun boolean, OUT marker text, OUT age_ms bigint, OUT incarnation text,
    OUT tl integer, OUT lsn bigint, OUT started bigint)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {s}.store SET epoch = {s}.new_marker(), timeline = {s}.timeline(),
        began = CASE WHEN marked_new THEN '-infinity'::timestamptz ELSE clock_timestamp() END
        WHERE epoch IS NOT DISTINCT FROM expected;
    begun := FOUND;
    IF begun THEN
        PERFORM {s}.floor_sequences(floor);
    END IF;
    SELECT * INTO marker, age_ms, incarnation, tl, lsn, started FROM {s}.epoch_state();
END $$;

INSERT INTO {s}.store (incarnation, epoch, began, timeline, floored)
    SELECT md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text),
           {s}.new_marker(), coalesce(t.began, '-infinity'), {s}.timeline(),
           pg_postmaster_start_time()
    FROM (SELECT NULL) AS one LEFT JOIN {s}.timelines t ON t.timeline = {s}.timeline();
SELECT {s}.floor_sequences(0);

-- Version 6's grant, its id drawn through the floor (same signature: clients of earlier
-- versions still running keep their prepared statement).
CREATE OR REPLACE FUNCTION {s}.grant_lease(ttl bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    lid bigint;
    now_ts timestamptz := clock_timestamp();
BEGIN
    IF (SELECT min(deadline) FROM {s}.leases) <= now_ts THEN
        DELETE FROM {s}.leases WHERE id IN (
            SELECT id FROM {s}.leases WHERE deadline <= now_ts
            ORDER BY deadline LIMIT 8 FOR UPDATE SKIP LOCKED)
          AND deadline <= clock_timestamp();
    END IF;
    INSERT INTO {s}.leases (id, ttl_ms, deadline)
        VALUES ({s}.next_lease_id(), ttl, clock_timestamp() + ttl * interval '1 millisecond')
        RETURNING id INTO lid;
    RETURN lid;
END $$;

-- A new lease, and the epoch it was granted in (the session registers there).
CREATE FUNCTION {s}.grant_lease_v8(ttl bigint, OUT id bigint, OUT marker text,
    OUT age_ms bigint, OUT incarnation text, OUT tl integer, OUT lsn bigint,
    OUT started bigint)
LANGUAGE plpgsql AS $$
BEGIN
    id := {s}.grant_lease(ttl);
    SELECT * INTO marker, age_ms, incarnation, tl, lsn, started FROM {s}.epoch_state();
END $$;

-- Version 3's renewal, and the epoch it was renewed in: a lease that a restore brought back
-- renews like any other, and only the epoch and the position tell its holder.
CREATE FUNCTION {s}.renew_v8(lid bigint, OUT ttl_ms bigint, OUT marker text,
    OUT age_ms bigint, OUT incarnation text, OUT tl integer, OUT lsn bigint,
    OUT started bigint)
LANGUAGE plpgsql AS $$
BEGIN
    ttl_ms := {s}.renew(lid);
    SELECT * INTO marker, age_ms, incarnation, tl, lsn, started FROM {s}.epoch_state();
END $$;
"#;

/// Version 9: queues read through an index on each entry's queue (issue #39; docs/design.md,
/// 2026-11-28). The reads of "the newest live entry before mine" (every enqueue, every
/// waiter's look) and of "the head" (every deletion's notice) selected a key range ordered
/// by token: no index serves both, so the plan depended on the planner's statistics, and a
/// plan cached while the table was small (PL/pgSQL caches one per connection) scanned and
/// sorted the whole queue at every call: 10,000 waiters took 56 s to queue on a fresh server.
/// Now an entry carries its queue (`parent`: its key up to the last `/`, a stored generated
/// column) and `(parent, token)` is indexed: "newest before mine" is a backward scan of that
/// index that stops at the first live row, whatever the statistics; the functions that read
/// it turn sequential and bitmap scans off (`SET`, in force at every planning of their
/// statements), so that no estimate picks a scan of the table. Names nested under a queue's
/// share it (as on etcd); their entries are found by a second probe, a range of `parent`
/// that holds only nested entries (usually none), sorted on an expression (`token + 0`) so
/// that the token's own index is never walked instead.
///
/// The enqueue functions keep their signatures (clients of earlier versions keep their
/// prepared statements and get the new body); `ahead_v9` is the waiter's look, which clients
/// of this version call instead of their own statement.
const V9: &str = r#"
ALTER TABLE {s}.entries ADD COLUMN parent text COLLATE "C"
    GENERATED ALWAYS AS (left(key, length(key) - strpos(reverse(key), '/'))) STORED;
CREATE INDEX entries_parent_token ON {s}.entries (parent, token);

-- The token of the head of queue `q` (its oldest live entry), or NULL.
CREATE FUNCTION {s}.head_token(q text) RETURNS bigint LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off AS $$
DECLARE
    own bigint;
    nested bigint;
BEGIN
    SELECT e.token INTO own FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.parent = q COLLATE "C" AND ls.deadline > clock_timestamp()
        ORDER BY e.parent, e.token LIMIT 1;
    SELECT e.token INTO nested FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.parent >= (q || '/') COLLATE "C" AND e.parent < (q || '0') COLLATE "C"
          AND ls.deadline > clock_timestamp()
        ORDER BY e.token + 0 LIMIT 1;
    RETURN least(own, nested);
END $$;

-- A waiter's look: whether entry (k, t) is live, the `n` newest live entries of queue `q`
-- before it (newest first; one row of NULLs if none, none at all if (k, t) is not live), and
-- the store's epoch and position on every row.
CREATE FUNCTION {s}.ahead_v9(q text, k text, t bigint, n bigint)
RETURNS TABLE (ok boolean, key text, token bigint, lease bigint, value bytea, marker text,
    age_ms bigint, incarnation text, tl integer, lsn bigint, started bigint)
LANGUAGE plpgsql SET enable_seqscan = off SET enable_bitmapscan = off AS $$
#variable_conflict use_column
DECLARE
    a record;
    live boolean;
BEGIN
    live := EXISTS (SELECT 1 FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.key = k AND e.token = t AND ls.deadline > clock_timestamp());
    SELECT * INTO a FROM {s}.epoch_state();
    IF live THEN
        RETURN QUERY SELECT true, x.key::text, x.token, x.lease, x.value, a.marker, a.age_ms,
                a.incarnation, a.tl, a.lsn, a.started
            FROM ((SELECT e.key, e.token, e.lease, e.value
                   FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
                   WHERE e.parent = q COLLATE "C" AND e.token < t
                     AND ls.deadline > clock_timestamp()
                   ORDER BY e.parent DESC, e.token DESC LIMIT n)
                  UNION ALL
                  (SELECT e.key, e.token, e.lease, e.value
                   FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
                   WHERE e.parent >= (q || '/') COLLATE "C" AND e.parent < (q || '0') COLLATE "C"
                     AND e.token < t AND ls.deadline > clock_timestamp()
                   ORDER BY e.token + 0 DESC LIMIT n)) x
            ORDER BY x.token DESC LIMIT n;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT live, NULL::text, NULL::bigint, NULL::bigint, NULL::bytea, a.marker,
        a.age_ms, a.incarnation, a.tl, a.lsn, a.started;
END $$;
"#;

/// Version 10: a burst of enqueues in one call (issue #39; docs/design.md, 2026-11-28). Every
/// enqueue is a transaction of its own, and with durable commits each waits for its WAL flush:
/// one backend queueing 10,000 waiters spent most of its time in those flushes, one after
/// another on its one request connection. Enqueues that arrive while one is in flight are sent
/// together, as one call: each is `enqueue_v8`'s, in the order given, and the burst commits
/// once. Tokens are still drawn under every queue's advisory lock, held to the commit, so
/// token order within a queue is still commit order. The locks of every queue the burst
/// names are taken first, in increasing (C collation) order: so does a single enqueue (a
/// queue's prefixes come before it), and two bursts never wait on each other in a cycle.
/// Rows come in the order given, each with its index last (`enqueue_v8`'s columns first).
const V10: &str = r#"
CREATE FUNCTION {s}.enqueue_burst_v10(qs text[], ts text[], ls bigint[], vs bytea[],
    stamps bigint[])
RETURNS TABLE (status text, e_token bigint, e_lease bigint, e_value bytea, p_key text,
    p_token bigint, p_lease bigint, p_value bytea, marker text, age_ms bigint,
    incarnation text, tl integer, lsn bigint, started bigint, i integer)
LANGUAGE plpgsql AS $$
DECLARE
    qn text;
BEGIN
    FOR qn IN SELECT DISTINCT array_to_string(p.parts[1:j], '/') COLLATE "C" AS x
              FROM (SELECT string_to_array(q, '/') AS parts FROM unnest(qs) AS q) p,
                   generate_series(1, cardinality(p.parts)) AS j
              ORDER BY 1 LOOP
        IF qn <> '' THEN
            PERFORM pg_advisory_xact_lock({class}, hashtext('{s}|' || qn));
        END IF;
    END LOOP;
    FOR n IN 1 .. coalesce(cardinality(qs), 0) LOOP
        RETURN QUERY SELECT a.*, n FROM {s}.enqueue_v8(qs[n], ts[n], ls[n], vs[n], stamps[n]) a;
    END LOOP;
END $$;
"#;

/// The enqueue's read of its predecessor up to version 8: a key range ordered by token.
const KEY_RANGE_PREDECESSOR: &str = r#"    SELECT e.key, e.token, e.lease, e.value INTO p_key, p_token, p_lease, p_value
        FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.key >= (q || '/') COLLATE "C" AND e.key < (q || '0') COLLATE "C" AND e.token < e_token
          AND ls.deadline > clock_timestamp()
        ORDER BY e.token DESC LIMIT 1;
"#;

/// The same from version 9: the `(parent, token)` index backwards, then nested names.
const PARENT_PREDECESSOR: &str = r#"    SELECT e.key, e.token, e.lease, e.value INTO p_key, p_token, p_lease, p_value
        FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.parent = q COLLATE "C" AND e.token < e_token AND ls.deadline > clock_timestamp()
        ORDER BY e.parent DESC, e.token DESC LIMIT 1;
    -- Names nested under `q` share its queue (rare): their newest, if newer.
    SELECT e.token INTO nested FROM {s}.entries e JOIN {s}.leases ls ON ls.id = e.lease
        WHERE e.parent >= (q || '/') COLLATE "C" AND e.parent < (q || '0') COLLATE "C"
          AND e.token < e_token AND ls.deadline > clock_timestamp()
        ORDER BY e.token + 0 DESC LIMIT 1;
    IF nested > coalesce(p_token, 0) THEN
        SELECT e.key, e.token, e.lease, e.value INTO p_key, p_token, p_lease, p_value
            FROM {s}.entries e WHERE e.token = nested;
    END IF;
"#;

/// Version 5's sweep of what is before the head, up to version 8: a key range.
const KEY_RANGE_HEAD_SWEEP: &str = r#"            SELECT e.lease FROM {s}.entries e
            WHERE e.key >= (q || '/') COLLATE "C" AND e.key < (q || '0') COLLATE "C"
              AND e.token < e_token)"#;

/// The same from version 9: the queue's own entries, then the nested names'.
const PARENT_HEAD_SWEEP: &str = r#"            SELECT e.lease FROM {s}.entries e
            WHERE e.parent = q COLLATE "C" AND e.token < e_token
            UNION ALL
            SELECT e.lease FROM {s}.entries e
            WHERE e.parent >= (q || '/') COLLATE "C" AND e.parent < (q || '0') COLLATE "C"
              AND e.token < e_token)"#;

/// The deletion notice's head up to version 8: a key range ordered by token.
const KEY_RANGE_HEAD: &str = r#"(
                SELECT n.token FROM {s}.entries n JOIN {s}.leases ls ON ls.id = n.lease
                WHERE n.key >= (g.q || '/') COLLATE "C" AND n.key < (g.q || '0') COLLATE "C"
                  AND ls.deadline > clock_timestamp()
                ORDER BY n.token LIMIT 1)"#;

/// The same from version 9.
const PARENT_HEAD: &str = "{s}.head_token(g.q)";

/// How the enqueue functions begin, up to version 8.
const PLAIN_PLPGSQL: &str = "LANGUAGE plpgsql AS $$\nDECLARE\n    k text := q || '/' || t;\n";

/// The same from version 9: no plan of theirs scans the table, and a variable for the probe of
/// nested names.
const INDEXED_PLPGSQL: &str = "LANGUAGE plpgsql\nSET enable_seqscan = off SET enable_bitmapscan = off AS $$\nDECLARE\n    nested bigint;\n    k text := q || '/' || t;\n";

/// The SQL of migration `sql` for schema `schema`.
pub(crate) fn render(sql: &str, schema: &str) -> String {
    sql.replace("{s}", schema)
        .replace("{class}", &LOCK_CLASS.to_string())
}

/// Whether `name` can be put into SQL as an unquoted identifier, exactly as written.
pub(super) fn plain_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 40
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_differ_only_where_they_say() {
        let v2 = migration(2, "baton").unwrap_or_default();
        let v3 = migration(3, "baton").unwrap_or_default();
        assert!(v2.contains("e_token := nextval('baton.tokens');"), "{v2}");
        assert!(
            v3.contains("e_token := (baton.timeline()::bigint << 40) + nextval('baton.tokens');"),
            "{v3}"
        );
        assert!(!v2.contains("{new_token}") && !v3.contains("{new_token}"));
        for v in [&v2, &v3] {
            assert!(v.contains("FUNCTION baton.enqueue(") && !v.contains("timeline_age"));
        }
        // Version 4's deletion notices add the timeline after the head; version 2's do not.
        let v4 = migration(4, "baton").unwrap_or_default();
        let suffix = "ORDER BY n.token LIMIT 1) || ' ' || baton.timeline(), ''))";
        assert!(v4.contains(suffix), "{v4}");
        assert!(v2.contains("ORDER BY n.token LIMIT 1), ''))") && !v2.contains(suffix));
        assert!(!v2.contains("{head_suffix}") && !v4.contains("{head_suffix}"));
        // Version 5 sweeps only as the head; versions 2 to 4 as every enqueue.
        let v5 = migration(5, "baton").unwrap_or_default();
        let sweep = render(SWEEP, "baton");
        assert!(v2.contains(&sweep) && v3.contains(&sweep) && v4.contains(&sweep));
        assert!(!v5.contains(&sweep), "{v5}");
        assert!(v5.contains("FUNCTION baton.enqueue_v4("), "{v5}");
        assert!(
            v5.contains(
                "IF p_key IS NULL THEN\n        -- Whatever is before the head is of expired"
            ),
            "{v5}"
        );
        assert_eq!(v5.matches("DELETE FROM baton.leases").count(), 1, "{v5}");
        // Version 6 replaces grant_lease alone, its sweep bounded by a value read once.
        let v6 = migration(6, "baton").unwrap_or_default();
        assert!(
            v6.contains("FUNCTION baton.grant_lease(ttl bigint)"),
            "{v6}"
        );
        assert!(v6.contains("WHERE deadline <= now_ts"), "{v6}");
        assert!(v6.contains("IF (SELECT min(deadline) FROM baton.leases) <= now_ts"));
        assert_eq!(v6.matches("CREATE OR REPLACE FUNCTION").count(), 1, "{v6}");
        // Version 7 moves the lease ids' sequence to the clock, and changes nothing else.
        let v7 = migration(7, "baton").unwrap_or_default();
        assert!(
            v7.contains("setval('baton.lease_ids', greatest(last_value"),
            "{v7}"
        );
        assert!(!v7.contains("FUNCTION") && !v7.contains("TABLE"), "{v7}");
        // Version 8: the store's epoch, and every draw through the floor, in the functions of
        // earlier versions too (same signatures).
        let v8 = migration(8, "baton").unwrap_or_default();
        assert!(v8.contains("CREATE TABLE baton.store ("), "{v8}");
        assert_eq!(
            v8.matches("e_token := baton.next_token();").count(),
            3,
            "{v8}"
        );
        assert!(v8.contains("FUNCTION baton.enqueue_v8(") && v8.contains("OUT lsn bigint"));
        assert!(v8.contains("VALUES (baton.next_lease_id(), ttl"), "{v8}");
        assert!(v8.contains("|| ' ' || baton.timeline() || ' ' || baton.started_us()"));
        assert!(!v8.contains("{head_suffix}") && !v8.contains("{grace_outs}"));
        // Version 9: every read of a queue through the (parent, token) index, in all three
        // enqueue bodies and the deletion notice.
        let v9 = migration(9, "baton").unwrap_or_default();
        assert!(v9.contains("CREATE INDEX entries_parent_token"), "{v9}");
        assert_eq!(
            v9.matches(&render(PARENT_PREDECESSOR, "baton")).count(),
            3,
            "{v9}"
        );
        assert!(
            !v9.contains(&render(KEY_RANGE_PREDECESSOR, "baton")),
            "{v9}"
        );
        assert_eq!(
            v9.matches(&render(PARENT_HEAD_SWEEP, "baton")).count(),
            2,
            "{v9}"
        );
        assert!(!v9.contains(&render(KEY_RANGE_HEAD_SWEEP, "baton")), "{v9}");
        assert!(v9.contains("coalesce(' ' || baton.head_token(g.q) || ' ' || baton.timeline()"));
        assert_eq!(v9.matches("SET enable_seqscan = off").count(), 5, "{v9}");
        assert!(v8.contains(&render(KEY_RANGE_PREDECESSOR, "baton")), "{v8}");
        assert_eq!(migration(MIGRATIONS + 1, "baton"), None);
        assert!((1..=MIGRATIONS).all(|v| migration(v, "baton").is_some()));
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert!(plain_identifier("baton"));
        assert!(plain_identifier("baton_2"));
        assert!(!plain_identifier("Baton"));
        assert!(!plain_identifier("2baton"));
        assert!(!plain_identifier("a;drop"));
        assert!(!plain_identifier(""));
    }
}
