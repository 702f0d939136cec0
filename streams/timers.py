"""Timers on broker time, as pure logic: key layout, due times, the broker-clock estimate.

A timer store (:class:`streams.timer_store.TimerStore`, declared by a stage as a
``TimerDecl``) holds records until they are due. A record waits under a key that sorts by its
due time, so one due in 2 s is never behind one due in an hour. Due times are broker time
(ms): payloads carry durations, never deadlines, and this worker's wall clock is never asked;
the stage computes a due time from a broker timestamp (a record's LogAppendTime) plus a
duration, and the runtime fires it once :class:`BrokerClock` says the broker reached it.

Key: ``0x01 | due_ms (8 bytes BE) | id``. The leading byte keeps keys clear of the state
store's reserved NUL prefix; ``id`` (the stage's, non-empty) makes the key unique, and a
stage that derives it from its input (the retry stage: tier index and source offset) gets the
same key when the input is replayed after an aborted transaction, so a replay overwrites and
never duplicates.

Stored value: ``len(fp) | writer-schema fingerprint | Avro payload`` of the record, as it
travels on the changelog, so a restore needs no re-encoding.

A *keyed* timer store holds at most one timer per id: scheduling an id again moves its timer.
It keeps an index beside the timers, ``0x02 | id`` → the id's due time (8 bytes BE), on the
same changelog (raw bytes, not a record), so a restore rebuilds both.
"""

from __future__ import annotations

from collections.abc import Iterable

KEY_PREFIX = b"\x01"
INDEX_PREFIX = b"\x02"
MIN_KEY_LEN = 1 + 8 + 1
MAX_ID_LEN = 255

#: Rate error allowed between this host's monotonic clock and the broker's clock, in parts
#: per million (NTP-disciplined clocks are within a few ppm). Charged against the estimate,
#: so it only makes a timer fire later, by at most this fraction of the time since the best
#: observation; fresh broker timestamps keep that small.
DRIFT_PPM = 100


def timer_key(due_ms: int, ident: bytes) -> bytes:
    """The store and changelog key of a timer; keys sort by due time first."""
    if not 0 <= due_ms < 1 << 64 or not 0 < len(ident) <= MAX_ID_LEN:
        raise ValueError(f"timer key out of range: due={due_ms} id={ident!r}")
    return KEY_PREFIX + due_ms.to_bytes(8, "big") + ident


def parse_key(key: bytes) -> tuple[int, bytes]:
    """(due_ms, id) of a timer key."""
    if not MIN_KEY_LEN <= len(key) <= 9 + MAX_ID_LEN or not key.startswith(KEY_PREFIX):
        raise ValueError(f"not a timer key: {key!r}")
    return int.from_bytes(key[1:9], "big"), key[9:]


def due_of(key: bytes) -> int:
    return parse_key(key)[0]


def index_key(ident: bytes) -> bytes:
    """The key of a keyed store's index entry for ``ident``."""
    if not 0 < len(ident) <= MAX_ID_LEN:
        raise ValueError(f"timer id out of range: {ident!r}")
    return INDEX_PREFIX + ident


def encode_due(due_ms: int) -> bytes:
    return due_ms.to_bytes(8, "big")


def decode_due(raw: bytes) -> int:
    if len(raw) != 8:
        raise ValueError(f"corrupt timer index value {raw!r}")
    return int.from_bytes(raw, "big")


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
