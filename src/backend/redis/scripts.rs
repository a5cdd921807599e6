//! The Lua scripts of the Redis backend: each state change (and each read that may evict an
//! entry of a dead lease) is one script, so it is atomic. Every script starts with
//! `lib.lua` (the layout and its helpers); `ARGV[1]` is always the key prefix.

use std::sync::LazyLock;

use redis::Script;

const LIB: &str = include_str!("lib.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{LIB}\n{body}"))
}

/// The scripts, compiled (hashed) once per process.
pub(super) struct Scripts {
    pub(super) grant: Script,
    pub(super) keep_alive: Script,
    pub(super) revoke: Script,
    pub(super) lease_ttl: Script,
    pub(super) enqueue: Script,
    pub(super) find: Script,
    pub(super) abandon: Script,
    pub(super) ahead: Script,
    pub(super) oldest: Script,
    pub(super) delete: Script,
    pub(super) update: Script,
    pub(super) guarded: Script,
    pub(super) swap: Script,
    pub(super) watch_gone: Script,
    pub(super) watch_value: Script,
    pub(super) mailbox: Script,
    pub(super) observe: Script,
    pub(super) init: Script,
}

pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    // ARGV: floor. -> 1 if the state had no epoch and one began now without a grace (`baton
    // init`: the operator asserts that no holder from before exists), 0 if it had one (a
    // server restarted since still begins its epoch, with the grace, as every script does).
    init: script(
        r"
RUN = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
if redis.call('EXISTS', P .. 'gen') == 1 then
  epoch(ARGV[2])
  return 0
end
new_epoch(ARGV[2])
redis.call('HSET', P .. 'gen', 'since', '0')
return 1
",
    ),
    // ARGV: ttl (ms), floor. -> {lease id, since, now}: the lease, and the epoch it belongs
    // to (since: when it began; now: the server's clock, ms). Ends a few expired leases first
    // (crashed owners').
    grant: script(
        r"
epoch(ARGV[3])
reap_expired(16)
local id = num(next_seq(ARGV[3]))
redis.call('ZADD', P .. 'leases', num(NOW_MS + tonumber(ARGV[2])), id)
redis.call('HSET', P .. 'ttl', id, ARGV[2])
return { id, SINCE, num(NOW_MS) }
",
    ),
    // ARGV: lease. -> ttl (ms) after the renewal, or nil if the lease is gone.
    keep_alive: script(
        r"
epoch()
reap_expired(16)
local d = lease_deadline(ARGV[2])
if not d then
  return false
end
if d <= NOW_MS then
  reap(ARGV[2])
  return false
end
local ttl = redis.call('HGET', P .. 'ttl', ARGV[2]) or '0'
redis.call('ZADD', P .. 'leases', num(NOW_MS + tonumber(ttl)), ARGV[2])
return ttl
",
    ),
    // ARGV: lease.
    revoke: script(
        r"
epoch()
reap(ARGV[2])
return 1
",
    ),
    // ARGV: lease. -> ms left, or nil. Reads only.
    lease_ttl: script(
        r"
epoch()
local d = lease_deadline(ARGV[2])
if not d or d <= NOW_MS then
  return false
end
return num(d - NOW_MS)
",
    ),
    // ARGV: queue, tag, lease, value, stamp, deadline (server ms), floor. -> {0} if the lease
    // is gone; {2} if the entry is not there and this call is one its caller has given up on
    // (past its deadline, or a later call of the same lease for the same entry came first:
    // a request delivered late creates nothing); else {1, entry, predecessor, since, now}
    // (since: when the epoch began, see `epoch`; now: the server's clock, ms).
    enqueue: script(
        r"
epoch(ARGV[8])
local q, lease = ARGV[2], ARGV[4]
local k = q .. '/' .. ARGV[3]
local d = lease_deadline(lease)
if not d or d <= NOW_MS then
  if d then
    reap(lease)
  end
  return { 0 }
end
local mine = live(k)
if not mine then
  local deadline = tonumber(ARGV[7])
  local stamp = P .. 'st:' .. lease .. ':' .. k
  if NOW_MS > deadline or tonumber(ARGV[6]) <= tonumber(redis.call('GET', stamp) or '0') then
    return { 2 }
  end
  redis.call('SET', stamp, ARGV[6], 'PX', math.max(1, deadline - NOW_MS))
  local t = num(next_seq(ARGV[8]))
  redis.call('HSET', P .. 'e:' .. k, 'v', ARGV[5], 't', t, 'l', lease)
  redis.call('SADD', P .. 'lease:' .. lease, k)
  for _, qq in ipairs(queues_of(k)) do
    redis.call('ZADD', P .. 'q:' .. qq, t, k)
    log_head(qq)
  end
  mine = { k, ARGV[5], t, lease }
end
return { 1, mine, before(q, mine[3], 1)[1] or false, SINCE, num(NOW_MS) }
",
    ),
    // ARGV: key. -> the live entry or nil.
    find: script(
        r"
epoch()
return live(ARGV[2]) or false
",
    ),
    // ARGV: key, lease, stamp, deadline (server ms). -> the live entry or nil, after making
    // sure that no enqueue call of that lease for that key with a stamp up to `stamp` creates
    // it later (the cleanup of an abandoned acquisition).
    abandon: script(
        r"
epoch()
local stamp = P .. 'st:' .. ARGV[3] .. ':' .. ARGV[2]
if tonumber(ARGV[4]) > tonumber(redis.call('GET', stamp) or '0') then
  redis.call('SET', stamp, ARGV[4], 'PX', math.max(1, tonumber(ARGV[5]) - NOW_MS))
end
return live(ARGV[2]) or false
",
    ),
    // ARGV: queue, mine key, mine token, limit[, plain key]. -> {0} if mine is gone, else
    // {1, entries newest first, value of the plain key, since, now}.
    ahead: script(
        r"
epoch()
if not live(ARGV[3], ARGV[4]) then
  return { 0 }
end
local value = false
if ARGV[6] then
  value = redis.call('GET', P .. 'k:' .. ARGV[6])
end
return { 1, before(ARGV[2], ARGV[4], tonumber(ARGV[5])), value, SINCE, num(NOW_MS) }
",
    ),
    // ARGV: queue, limit. -> up to limit live entries, oldest first.
    oldest: script(
        r"
epoch()
return oldest(ARGV[2], tonumber(ARGV[3]))
",
    ),
    // ARGV: key, token. -> 1 if that incarnation was deleted now, else 0.
    delete: script(
        r"
epoch()
if not live(ARGV[2], ARGV[3]) then
  return 0
end
remove_entry(ARGV[2])
return 1
",
    ),
    // ARGV: key, token, value. -> 1 if updated, else 0.
    update: script(
        r"
epoch()
if not live(ARGV[2], ARGV[3]) then
  return 0
end
redis.call('HSET', P .. 'e:' .. ARGV[2], 'v', ARGV[4])
for _, q in ipairs(queues_of(ARGV[2])) do
  log_head(q)
end
return 1
",
    ),
    // ARGV: key, token, then ops: 'p', key, value | 'd', key. -> 1 if applied, else 0.
    guarded: script(
        r"
epoch()
if not live(ARGV[2], ARGV[3]) then
  return 0
end
local i = 4
while ARGV[i] do
  if ARGV[i] == 'p' then
    set_plain(ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  else
    set_plain(ARGV[i + 1], nil)
    i = i + 2
  end
end
return 1
",
    ),
    // ARGV: key, '1' (expected present) or '0', expected, new. -> 1 if set, else 0.
    swap: script(
        r"
epoch()
local cur = redis.call('GET', P .. 'k:' .. ARGV[2])
if ARGV[3] == '1' then
  if cur ~= ARGV[4] then
    return 0
  end
elseif cur then
  return 0
end
set_plain(ARGV[2], ARGV[5])
return 1
",
    ),
    // ARGV: key, token, mailbox. -> -1 if that incarnation is gone, else the ms its lease
    // has left (the mailbox is told when it goes).
    watch_gone: script(
        r"
epoch()
local e = live(ARGV[2], ARGV[3])
if not e then
  return -1
end
register(P .. 'w:' .. ARGV[2], ARGV[4])
return num(lease_deadline(e[4]) - NOW_MS)
",
    ),
    // ARGV: key, '1' (seen present) or '0', seen, mailbox. -> {1, value} if the value is not
    // the one seen, else {0} (the mailbox is told when it changes).
    watch_value: script(
        r"
epoch()
local cur = redis.call('GET', P .. 'k:' .. ARGV[2])
local same
if ARGV[3] == '1' then
  same = cur == ARGV[4]
else
  same = not cur
end
if not same then
  return { 1, cur }
end
register(P .. 'kw:' .. ARGV[2], ARGV[5])
return { 0 }
",
    ),
    // ARGV: mailbox id or '' (new), alive ms, floor. -> {mailbox id, epoch}, the mailbox
    // marked alive for that long. A reader that sees the epoch change wakes every waiter:
    // the registrations of the epoch before are gone.
    // A mailbox is not a grant: on a store without baton's state it begins no epoch (the
    // answer's epoch is 0), so that `baton init` still finds the store unmarked; the first
    // grant begins it.
    mailbox: script(
        r"
if redis.call('EXISTS', P .. 'gen') == 1 then
  epoch(ARGV[4])
else
  EPOCH = 0
end
local id = ARGV[2]
if id == '' then
  id = num(next_seq(ARGV[4]))
end
redis.call('SET', P .. 'mba:' .. id, '1', 'PX', ARGV[3])
return { id, num(EPOCH) }
",
    ),
    // ARGV: queue, '1' to start over (else only keep the log alive). -> {id, k, t, v, l, epoch}
    // of the head last logged (k '' when the queue is empty), or {} when not starting over and
    // the log is gone.
    observe: script(
        r"
epoch()
local q = ARGV[2]
local hl = P .. 'hl:' .. q
if ARGV[3] ~= '1' and redis.call('EXISTS', hl) == 0 then
  return {}
end
-- A head whose lease expired goes now (and its successor is logged): an observer learns of a
-- crashed leader without waiting for someone's renewal to end its lease.
oldest(q, 1)
if ARGV[3] == '1' then
  if redis.call('EXISTS', hl) == 0 then
    redis.call('HSET', hl, 'k', '\0')
  end
  log_head(q)
end
redis.call('PEXPIRE', hl, 3600000)
redis.call('PEXPIRE', P .. 'h:' .. q, 3600000)
local last = redis.call('HMGET', hl, 'id', 'k', 't', 'v', 'l')
return { last[1], last[2], last[3], last[4], last[5], num(EPOCH) }
",
    ),
});
