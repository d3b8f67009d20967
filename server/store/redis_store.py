"""`RedisStore`: a Redis server shared by every replica (`redis.asyncio`).

Keys, under a prefix (default `dlr`, `?prefix=` in the URL):

    <p>:b:<id>   the blob (string), with PEXPIRE when it has a lifetime
    <p>:lru      sorted set id -> last use (us, Redis' clock; strictly increasing, so
                 no ties): the LRU order
    <p>:last     the latest last-use score
    <p>:exp      sorted set id -> expiry (ms): finds expired entries to sweep
    <p>:size     hash id -> blob bytes
    <p>:bytes    total blob bytes (counter)

LRU is the store's own, not Redis' `maxmemory-policy`: Redis' eviction is approximate, spans
the whole database and says nothing about what it removed, while a put here must report each
evicted session (so its client can be told) and the quotas are per store. Each operation is
one transaction, so a put, its sweep of expired entries and its evictions are atomic across
replicas, and times come from Redis' clock (`TIME`), one clock for all replicas. Blobs never
pass through Lua (large strings are slow there): a put is `SET` plus the index script, a get
`GET` plus a last-use script, each pair in one MULTI/EXEC; a batch is one MULTI (one round
trip). The blob keys also carry Redis' own expiry, so their memory is
freed even when no server runs; index entries left behind are removed by the next put's
sweep. Configure Redis with `maxmemory-policy noeviction` (or any `volatile-*` policy) so it
never removes keys behind the index. Plain Redis or a primary; not Redis Cluster (the scripts
touch keys they compute).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from .base import (
    Entry,
    EntryInfo,
    Evicted,
    EvictReason,
    PutItem,
    PutResult,
    StateStore,
    StoreLimits,
)

_PRELUDE = """
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function stamp()  -- last-use score: microseconds, strictly increasing (no ties)
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('GET', P .. ':last') or '0')
  if us <= last then us = last + 1 end
  local s = string.format('%d', us)
  redis.call('SET', P .. ':last', s)
  return s
end
local function unindex(k)
  local n = redis.call('HGET', P .. ':size', k)
  if n then
    redis.call('HDEL', P .. ':size', k)
    redis.call('DECRBY', P .. ':bytes', n)
  end
  redis.call('ZREM', P .. ':lru', k)
  redis.call('ZREM', P .. ':exp', k)
  return n or '0'
end
local function drop(k)
  redis.call('DEL', P .. ':b:' .. k)
  return unindex(k)
end
"""

# Runs in the same MULTI right after `SET <p>:b:<id> data [PX ttl]` (blobs never pass through
# Lua: large strings are much slower there than in plain commands).
# ARGV: prefix, id, nbytes, ttl_ms (0: none), max_entries (0: none), max_bytes (0: none)
# -> {last_use_us, {id, nbytes, reason, ...}}
_PUT = (
    _PRELUDE
    + """
local id, nbytes, ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local maxn, maxb = tonumber(ARGV[5]), tonumber(ARGV[6])
local out = {}
unindex(id)
for _, k in ipairs(redis.call('ZRANGEBYSCORE', P .. ':exp', '-inf', now)) do
  local n = drop(k)
  table.insert(out, k); table.insert(out, n); table.insert(out, 'expired')
end
if ttl > 0 then redis.call('ZADD', P .. ':exp', now + ttl, id) end
local used = stamp()
redis.call('ZADD', P .. ':lru', used, id)
redis.call('HSET', P .. ':size', id, nbytes)
redis.call('INCRBY', P .. ':bytes', nbytes)
while true do
  local n_over = maxn > 0 and redis.call('ZCARD', P .. ':lru') > maxn
  local b_over = maxb > 0 and tonumber(redis.call('GET', P .. ':bytes') or '0') > maxb
  if not (n_over or b_over) then break end
  local oldest = redis.call('ZRANGE', P .. ':lru', 0, 1)
  local victim = oldest[1]
  if victim == id then victim = oldest[2] end
  if not victim then break end
  local n = drop(victim)
  table.insert(out, victim); table.insert(out, n)
  table.insert(out, n_over and 'max_entries' or 'max_bytes')
end
return {used, out}
"""
)

# Runs in the same MULTI right after `GET <p>:b:<id>`.
# ARGV: prefix, id -> {last_use_us or '0', expires_ms or nil}
_USED = (
    _PRELUDE
    + """
local id = ARGV[2]
if redis.call('EXISTS', P .. ':b:' .. id) == 0 then return {'0', false} end
local used = stamp()
redis.call('ZADD', P .. ':lru', 'XX', used, id)
return {used, redis.call('ZSCORE', P .. ':exp', id)}
"""
)

# ARGV: prefix, id, ttl_ms (0: none) -> {now_ms, 1 | 0, expires_ms or nil}
_TOUCH = (
    _PRELUDE
    + """
local id, ttl = ARGV[2], tonumber(ARGV[3])
local key = P .. ':b:' .. id
if redis.call('EXISTS', key) == 0 then return {now, 0, false} end
redis.call('ZADD', P .. ':lru', stamp(), id)
if ttl > 0 then
  redis.call('PEXPIRE', key, ttl)
  redis.call('ZADD', P .. ':exp', now + ttl, id)
  return {now, 1, now + ttl}
end
redis.call('PERSIST', key)
redis.call('ZREM', P .. ':exp', id)
return {now, 1, false}
"""
)

# ARGV: prefix, id -> 1 if a live blob was there
_DELETE = (
    _PRELUDE
    + """
local existed = redis.call('EXISTS', P .. ':b:' .. ARGV[2])
drop(ARGV[2])
return existed
"""
)

# ARGV: prefix, limit (0: all) -> {id, last_use_us, nbytes, expires_ms or '', ...} (LRU first)
_LIST = (
    _PRELUDE
    + """
local limit = tonumber(ARGV[2])
local out, n = {}, 0
local all = redis.call('ZRANGE', P .. ':lru', 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  local k = all[i]
  local e = redis.call('ZSCORE', P .. ':exp', k)
  if not e or tonumber(e) > now then
    table.insert(out, k); table.insert(out, all[i + 1])
    table.insert(out, redis.call('HGET', P .. ':size', k) or '0'); table.insert(out, e or '')
    n = n + 1
    if limit > 0 and n >= limit then break end
  end
end
return out
"""
)

# ARGV: prefix -> {entries, bytes} of the live entries
_USAGE = (
    _PRELUDE
    + """
local n = redis.call('ZCARD', P .. ':lru')
local b = tonumber(redis.call('GET', P .. ':bytes') or '0')
for _, k in ipairs(redis.call('ZRANGEBYSCORE', P .. ':exp', '-inf', now)) do
  n = n - 1
  b = b - tonumber(redis.call('HGET', P .. ':size', k) or '0')
end
return {n, b}
"""
)


def _ms(ttl_s: float | None) -> int:
    return 0 if ttl_s is None else max(1, round(ttl_s * 1000))


def _s(ms) -> float | None:
    return None if ms in (None, b"", "", False) else float(ms) / 1000


class RedisStore(StateStore):
    kind = "redis"
    backend_errors = (OSError, TimeoutError, RedisError)

    def __init__(
        self,
        url: str,
        limits: StoreLimits | None = None,
        prefix: str = "dlr",
        timeout_s: float = 2.0,
    ) -> None:
        """`url`: redis://HOST:PORT/DB (rediss:// for TLS). No client-side retries: a failed
        call raises `StoreUnavailable` at once and the checkpoint writer does the backoff."""
        super().__init__(limits)
        self.prefix = prefix
        self.url = url
        self.r = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            decode_responses=False,
        )
        self._put_s = self.r.register_script(_PUT)
        self._used_s = self.r.register_script(_USED)
        self._touch_s = self.r.register_script(_TOUCH)
        self._delete_s = self.r.register_script(_DELETE)
        self._list_s = self.r.register_script(_LIST)
        self._usage_s = self.r.register_script(_USAGE)

    @classmethod
    def from_url(cls, url: str, limits: StoreLimits | None = None) -> RedisStore:
        """Accepts `?prefix=NAME` besides what the redis client understands."""
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        prefix = query.pop("prefix", ["dlr"])[-1]
        if not prefix or ":" in prefix:
            raise ValueError(
                f"redis key prefix must be a non-empty name without ':', got {prefix!r}"
            )
        rest = urlunsplit(parts._replace(query=urlencode(query, doseq=True)))
        return cls(rest, limits, prefix=prefix)

    async def ping(self) -> None:
        await self._call(self.r.ping())

    async def close(self) -> None:
        await self.r.aclose()

    # ---- StateStore
    async def _put_many(self, items: list[PutItem]) -> list[PutResult]:
        lim = self.limits
        async with self.r.pipeline(transaction=True) as pipe:  # one MULTI, one round trip
            for it in items:
                ms = _ms(it.ttl_s)
                pipe.set(self._blob(it.key), it.data, px=ms or None)
                args = [
                    self.prefix,
                    it.key,
                    len(it.data),
                    ms,
                    lim.max_entries or 0,
                    lim.max_bytes or 0,
                ]
                await self._put_s(args=args, client=pipe)
            raw = (await pipe.execute())[1::2]
        out = []
        for it, (used, ev) in zip(items, raw, strict=True):
            t = float(used) / 1e6
            exp = None if it.ttl_s is None else t + _ms(it.ttl_s) / 1000
            evicted = tuple(
                Evicted(ev[i].decode(), int(ev[i + 1]), EvictReason(ev[i + 2].decode()))
                for i in range(0, len(ev), 3)
            )
            out.append(PutResult(EntryInfo(it.key, len(it.data), t, exp), evicted))
        return out

    async def _get(self, key: str) -> Entry | None:
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.get(self._blob(key))
            await self._used_s(args=[self.prefix, key], client=pipe)
            data, (used, exp) = await pipe.execute()
        if data is None:
            return None
        return Entry(EntryInfo(key, len(data), float(used) / 1e6, _s(exp)), data)

    def _blob(self, key: str) -> str:
        return f"{self.prefix}:b:{key}"

    async def _delete(self, key: str) -> bool:
        return bool(await self._delete_s(args=[self.prefix, key]))

    async def _touch(self, key: str, ttl_s: float | None) -> bool:
        _, ok, _ = await self._touch_s(args=[self.prefix, key, _ms(ttl_s)])
        return bool(ok)

    async def _list(self, limit: int | None) -> list[EntryInfo]:
        raw = await self._list_s(args=[self.prefix, limit or 0])
        return [
            EntryInfo(raw[i].decode(), int(raw[i + 2]), float(raw[i + 1]) / 1e6, _s(raw[i + 3]))
            for i in range(0, len(raw), 4)
        ]

    async def _usage(self) -> tuple[int, int]:
        n, b = await self._usage_s(args=[self.prefix])
        return int(n), int(b)
