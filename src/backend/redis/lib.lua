-- baton's Redis layout: the functions every script starts with (the Rust side prepends this
-- file to each script). ARGV[1] is the key prefix P; the other arguments are the script's.
--
-- Keys (all under P; see docs/redis.md):
--   P.."seq"          counter of tokens, lease ids and mailbox ids (never goes backwards)
--   P.."gen"          hash: the epoch (run: the server's run_id, start: the first counter
--                     value of the epoch, since: when the epoch began, server ms)
--   P.."leases"       sorted set: lease id -> deadline (server clock, ms)
--   P.."ttl"          hash: lease id -> TTL (ms) it was granted with
--   P.."lease:"..id   set of the entry keys of a lease
--   P.."st:"..id..":"..K  the stamp of lease id's last enqueue call for entry K, kept until
--                     that call's deadline (a request that arrives late creates nothing)
--   P.."e:"..K        hash of entry K: v (value), t (token), l (lease)
--   P.."q:"..Q        sorted set: entry key -> token, for every entry under Q (nested names too)
--   P.."w:"..K        set of mailboxes waiting for entry K to go
--   P.."k:"..key      a plain key's value
--   P.."kw:"..key     set of mailboxes waiting for a plain key to change
--   P.."mb:"..id      a mailbox (list of wake-ups); P.."mba:"..id says its reader is alive
--   P.."h:"..Q        stream of Q's heads, kept only while someone observes Q
--   P.."hl:"..Q       the head last logged to that stream (k, t, v, l, and its id)
-- A script only ever reads the clock once (TIME is frozen within a script anyway).

local P = ARGV[1]
local clock = redis.call('TIME')
local NOW_MS = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local NOW_US = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

-- Integers travel as decimal strings: Lua 5.1 numbers are doubles (exact below 2^53; the
-- microsecond clock is about 2^51), and Redis would format a bare number with %.17g.
local function num(x)
  return string.format('%.0f', x)
end

-- The epoch this script runs in: the first counter value of the epoch (every lease and entry
-- of the epoch has an id or token at least this) and when it began (server ms), both set by
-- `epoch` below, which every script calls first.
local EPOCH, SINCE
-- The server's run_id, read by `epoch`.
local RUN

-- The next value of the counter: one more than the last, never below the server's clock in
-- microseconds (so that a store that lost or rolled back its data still counts on from where
-- it was, as long as the clock has not gone back by more than the outage lasted), and above
-- `floor`, the highest value the calling client has seen (so that it also counts on when the
-- new server's clock is behind the old one's).
local function next_seq(floor)
  local n = math.max(tonumber(redis.call('GET', P .. 'seq') or '0') + 1, NOW_US,
    (tonumber(floor or '0') or 0) + 1)
  redis.call('SET', P .. 'seq', num(n))
  return n
end
-- The queues containing key K: the names before each '/', longest first.
local function queues_of(k)
  local out = {}
  local q = k
  while true do
    local slash = string.find(q, '/[^/]*$')
    if not slash then
      return out
    end
    q = string.sub(q, 1, slash - 1)
    out[#out + 1] = q
  end
end

-- Registers mailbox `m` in the waiters' set `set`, first dropping the mailboxes of processes
-- that are gone (no alive mark) once the set has grown, so that sets of long-lived keys (a
-- semaphore's limit, a long leadership) do not collect every process that ever waited.
local function register(set, m)
  if redis.call('SCARD', set) >= 16 then
    for _, other in ipairs(redis.call('SMEMBERS', set)) do
      if redis.call('EXISTS', P .. 'mba:' .. other) == 0 then
        redis.call('SREM', set, other)
      end
    end
  end
  redis.call('SADD', set, m)
end

-- Pushes `msg` to every live mailbox in `set`, then forgets the set.
local function wake(set, msg)
  for _, m in ipairs(redis.call('SMEMBERS', set)) do
    if redis.call('EXISTS', P .. 'mba:' .. m) == 1 then
      redis.call('RPUSH', P .. 'mb:' .. m, msg)
      redis.call('PEXPIRE', P .. 'mb:' .. m, 120000)
    end
  end
  redis.call('DEL', set)
end

-- The deadline of lease `id` (server ms), or nil if it is gone. A lease of an earlier epoch
-- is gone whatever the state says (epoch() removed those it found).
local function lease_deadline(id)
  if not id or (tonumber(id) or 0) < EPOCH then
    return nil
  end
  local d = redis.call('ZSCORE', P .. 'leases', id)
  if d then
    return tonumber(d)
  end
  return nil
end

-- Logs the head of Q to its stream if Q is observed and the head changed (key, token or value).
-- The stream keeps about the last 10,000 heads: an observer further behind is told it skipped.
local function log_head(q)
  local hl = P .. 'hl:' .. q
  if redis.call('EXISTS', hl) == 0 then
    return
  end
  -- The oldest entry whose lease is alive (dead ones are skipped, not removed here: their
  -- removal logs again once it happens).
  local k, t, v, l = '', '', '', ''
  local offset = 0
  while k == '' do
    local batch = redis.call('ZRANGE', P .. 'q:' .. q, offset, offset + 15)
    if #batch == 0 then
      break
    end
    for _, member in ipairs(batch) do
      local e = redis.call('HMGET', P .. 'e:' .. member, 't', 'v', 'l')
      local d = lease_deadline(e[3])
      if d and d > NOW_MS then
        k, t, v, l = member, e[1] or '', e[2] or '', e[3]
        break
      end
    end
    offset = offset + #batch
  end
  local last = redis.call('HMGET', hl, 'k', 't', 'v', 'id')
  if last[1] == k and last[2] == t and last[3] == v then
    return
  end
  local id = redis.call('XADD', P .. 'h:' .. q, 'MAXLEN', '~', '10000', '*',
    'k', k, 't', t, 'v', v, 'l', l, 'p', last[4] or '')
  redis.call('HSET', hl, 'k', k, 't', t, 'v', v, 'l', l, 'id', id)
end

-- Removes entry K (whatever its incarnation): from its hash, from every queue containing it
-- and from its lease's set; wakes its waiters; logs the new heads, unless `changed` is given:
-- then the queues are added to it, for the caller to log once it is done (a lease's entries
-- go together: the heads between them never existed).
local function remove_entry(k, changed)
  local e = redis.call('HMGET', P .. 'e:' .. k, 'l', 't')
  local lease = e[1]
  redis.call('DEL', P .. 'e:' .. k)
  if lease then
    redis.call('SREM', P .. 'lease:' .. lease, k)
  end
  for _, q in ipairs(queues_of(k)) do
    redis.call('ZREM', P .. 'q:' .. q, k)
    if changed then
      changed[q] = true
    else
      log_head(q)
    end
  end
  -- The wake-up names the incarnation (see mailbox.rs, gone_topic).
  wake(P .. 'w:' .. k, 'g' .. (e[2] or '') .. ' ' .. k)
end

-- Ends lease `id`: every entry bound to it goes. The queues whose head may have changed are
-- logged, or added to `changed` when given (for the caller to log once it is done).
local function reap(id, changed)
  local mine = changed or {}
  for _, k in ipairs(redis.call('SMEMBERS', P .. 'lease:' .. id)) do
    remove_entry(k, mine)
  end
  if not changed then
    for q in pairs(mine) do
      log_head(q)
    end
  end
  redis.call('DEL', P .. 'lease:' .. id)
  redis.call('ZREM', P .. 'leases', id)
  redis.call('HDEL', P .. 'ttl', id)
end

-- Makes sure the state this script is about to read is the one every earlier grant was made
-- on. baton's state can go back in time without anything in it saying so: a Redis restarted
-- from a snapshot (or an AOF that lost its last writes), a replica promoted after missing
-- writes, a full resync, a flush or deletion of baton's keys. Each of these either changes
-- the server's run_id (a new process, or another server) or loses P.."gen"; a client that
-- has seen a counter value the state has not reached (`floor`) proves a rollback too. Then
-- a new epoch starts: every lease from before is void (its entries go, their waiters are
-- woken, their owners' next renewal fails, so the owners learn they lost), the counter jumps
-- above everything handed out before, and `since` starts the restart grace that clients wait
-- out before they grant anything (RedisOptions::with_restart_grace): a holder from before
-- may not have heard yet, and believes it holds until its lease would have expired.
local function new_epoch(floor)
  EPOCH, SINCE = next_seq(floor), num(NOW_MS)
  -- Every lease of the state as it is now is from before.
  local changed = {}
  for _, id in ipairs(redis.call('ZRANGE', P .. 'leases', 0, -1)) do
    reap(id, changed)
  end
  for q in pairs(changed) do
    log_head(q)
  end
  redis.call('HSET', P .. 'gen', 'run', RUN, 'start', num(EPOCH), 'since', SINCE)
end

local function epoch(floor)
  RUN = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
  local gen = redis.call('HMGET', P .. 'gen', 'run', 'start', 'since')
  local seq = tonumber(redis.call('GET', P .. 'seq') or '0')
  if gen[1] == RUN and gen[2] and gen[3] and seq >= (tonumber(floor or '0') or 0) then
    EPOCH, SINCE = tonumber(gen[2]), gen[3]
    return
  end
  new_epoch(floor)
end

-- Part of baton's state was deleted behind its back (scripts change an entry, its queues and
-- its lease together, so one without the others is never left by them): an owner may still
-- hold, and more may be missing. Start over as after any loss, and have the client send its
-- request again (TRYAGAIN is retried), now on the new epoch.
local function tampered(what)
  new_epoch(nil)
  error({ err = 'TRYAGAIN baton: part of its state was deleted (' .. what .. '); a new epoch began' })
end

-- Ends up to `n` leases whose deadline passed (those of crashed owners).
local function reap_expired(n)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', NOW_MS, 'LIMIT', 0, n)) do
    reap(id)
  end
end

-- Entry K as {k, v, t, l} if it exists with a live lease (and token `t`, when given);
-- otherwise nil. An entry whose lease expired is removed with its lease on the way.
local function live(k, t)
  local e = redis.call('HMGET', P .. 'e:' .. k, 'v', 't', 'l')
  if not e[2] then
    return nil
  end
  local d = lease_deadline(e[3])
  if not d and (tonumber(e[3]) or 0) >= EPOCH then
    -- A lease of this epoch ends with its entries, in one script.
    tampered('an entry without its lease')
  end
  if not d or d <= NOW_MS then
    reap(e[3])
    return nil
  end
  if t and e[2] ~= t then
    return nil
  end
  return { k, e[1], e[2], e[3] }
end

-- Up to `limit` live entries of Q, walking from `from` (an exclusive score bound, or '-inf' /
-- '+inf') towards `to` with the sorted-set command `range` (ZRANGEBYSCORE: oldest first;
-- ZREVRANGEBYSCORE: newest first). Entries of dead leases met on the way are removed (with
-- their leases) and skipped.
local function walk(q, range, from, to, limit)
  local out = {}
  local bound = from
  while #out < limit do
    local batch = redis.call(range, P .. 'q:' .. q, bound, to, 'WITHSCORES', 'LIMIT', 0,
      limit - #out)
    if #batch == 0 then
      return out
    end
    for i = 1, #batch, 2 do
      if redis.call('EXISTS', P .. 'e:' .. batch[i]) == 0 then
        -- An entry leaves its queues in the script that deletes it.
        tampered('a queued entry without its hash')
      end
      local e = live(batch[i])
      if e then
        out[#out + 1] = e
      else
        -- Gone with its lease (live() removed it from its queues).
        redis.call('ZREM', P .. 'q:' .. q, batch[i])
      end
      bound = '(' .. batch[i + 1]
    end
  end
  return out
end

-- Up to `limit` live entries of Q with a token below `below`, newest first.
local function before(q, below, limit)
  return walk(q, 'ZREVRANGEBYSCORE', '(' .. below, '-inf', limit)
end

-- Up to `limit` live entries of Q, oldest first.
local function oldest(q, limit)
  return walk(q, 'ZRANGEBYSCORE', '-inf', '+inf', limit)
end

-- Sets plain key `key` (nil: deletes it) and wakes whoever waits for it to change.
local function set_plain(key, value)
  if value then
    redis.call('SET', P .. 'k:' .. key, value)
  else
    redis.call('DEL', P .. 'k:' .. key)
  end
  wake(P .. 'kw:' .. key, 'v' .. key)
end
