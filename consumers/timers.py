"""The retry stage's timer store, as pure logic: key layout, due times, broker-time estimate.

A delayed job waits under a key that sorts by its due time, so a job due in 2 s is never
behind a job due in an hour. Due times are broker time (the retry tier record's
LogAppendTime plus the delay, in ms): payloads carry durations, never deadlines, and this
worker's wall clock is never asked.

Key: ``0x01 | due_ms (8 bytes BE) | tier index (1 byte) | source offset (8 bytes BE)``. The
leading byte keeps keys clear of the state store's reserved NUL prefix; (tier, offset) names
the input record within its partition, so the key is unique, and the same input replayed
after an aborted transaction gives the same key (and overwrites, never duplicates).

Stored value: ``len(fp) | writer-schema fingerprint | Avro payload`` of the CrawlJob, as it
travels on the changelog, so restore needs no re-encoding.
"""

from __future__ import annotations

from collections.abc import Iterable

KEY_PREFIX = b"\x01"
KEY_LEN = 1 + 8 + 1 + 8

#: Rate error allowed between this host's monotonic clock and the broker's clock, in parts
#: per million (NTP-disciplined clocks are within a few ppm). Charged against the estimate,
#: so it only makes a timer fire later, by at most this fraction of the time since the best
#: observation; fresh broker timestamps keep that small.
DRIFT_PPM = 100


def timer_key(due_ms: int, tier: int, offset: int) -> bytes:
    """The store and changelog key of a timer; keys sort by due time first."""
    if not 0 <= due_ms < 1 << 64 or not 0 <= tier < 256 or not 0 <= offset < 1 << 64:
        raise ValueError(f"timer key out of range: due={due_ms} tier={tier} offset={offset}")
    return KEY_PREFIX + due_ms.to_bytes(8, "big") + bytes((tier,)) + offset.to_bytes(8, "big")


def parse_key(key: bytes) -> tuple[int, int, int]:
    """(due_ms, tier, offset) of a timer key."""
    if len(key) != KEY_LEN or not key.startswith(KEY_PREFIX):
        raise ValueError(f"not a timer key: {key!r}")
    return int.from_bytes(key[1:9], "big"), key[9], int.from_bytes(key[10:], "big")


def due_of(key: bytes) -> int:
    return parse_key(key)[0]


def due_ms(append_ms: int, tier_delay_ms: int, job_delay_ms: int) -> int:
    """Broker time at which a job appended to a retry tier at ``append_ms`` is due.

    The job's own delay (Retry-After, back-off) when it carries one: the fetch stage writes
    the exact delay and picks the tier only as a carrier, so a 20 s Retry-After in the 120 s
    tier is due after 20 s. A job without one (``delay_ms`` 0, or a v1 record) waits its
    tier's delay.
    """
    return append_ms + (job_delay_ms if job_delay_ms > 0 else tier_delay_ms)


def schedule(append_ms: int, tier: int, tier_delay_ms: int, job_delay_ms: int, offset: int,
             now_ms: int | None) -> bytes | None:
    """The timer key to hold an input record under, or None if it is due already.

    ``now_ms`` is the broker-time estimate (None while unknown: then nothing is due).
    """
    due = due_ms(append_ms, tier_delay_ms, job_delay_ms)
    if now_ms is not None and due <= now_ms:
        return None
    return timer_key(due, tier, offset)


def due_keys(keys: Iterable[bytes], now_ms: int, limit: int) -> list[bytes]:
    """The leading keys (in store order) that are due at ``now_ms``, at most ``limit``."""
    out: list[bytes] = []
    for key in keys:
        if len(out) >= limit or due_of(key) > now_ms:
            break
        out.append(key)
    return out


def encode_value(fingerprint: bytes, payload: bytes) -> bytes:
    if not 0 < len(fingerprint) < 256:
        raise ValueError(f"bad schema fingerprint {fingerprint!r}")
    return bytes((len(fingerprint),)) + fingerprint + payload


def decode_value(raw: bytes) -> tuple[bytes, bytes]:
    """(fingerprint, payload) of a stored value."""
    n = raw[0] if raw else 0
    if n == 0 or len(raw) < 1 + n:
        raise ValueError(f"corrupt timer value {raw[:32]!r}")
    return raw[1:1 + n], raw[1 + n:]


class BrokerClock:
    """A lower bound on the broker's clock, from broker timestamps and the local monotonic clock.

    A record's LogAppendTime ``ts`` was <= broker-now when it was received at local time
    ``t``, so at any later local time ``now``, broker-now >= ts + (now - t) * (1 - drift).
    The bound is kept as its best constant, ``max(ts - t * (1 - drift))`` over every
    observation (with no drift: the min over observations of the receipt offset ``t - ts``).
    It can only be late, never early, so a timer never fires early; a record received
    promptly (or the delivery report of our own write) makes it tight. Integer nanoseconds,
    rounded towards "later", so no float rounding can make it early either.
    """

    def __init__(self, drift_ppm: int = DRIFT_PPM) -> None:
        self._ppm = drift_ppm
        self._best: int | None = None  # ns: max over observations of ts - t * (1 - drift)

    @property
    def known(self) -> bool:
        return self._best is not None

    def observe(self, broker_ms: int, local_ns: int) -> bool:
        """A broker timestamp (ms) seen at local monotonic time ``local_ns``; True if it
        tightened the bound."""
        bound = broker_ms * 1_000_000 - local_ns + local_ns * self._ppm // 1_000_000
        if self._best is None or bound > self._best:
            self._best = bound
            return True
        return False

    def now_ms(self, local_ns: int) -> int | None:
        """Broker time (ms) certainly reached at local time ``local_ns``; None if unknown."""
        if self._best is None:
            return None
        charged = -(-local_ns * self._ppm // 1_000_000)  # drift rounded up: estimate later
        return (self._best + local_ns - charged) // 1_000_000
