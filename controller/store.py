"""SQLite store of the controller: runs, decisions, probes, audits, step metrics, idempotent answers.

One connection guarded by the controller's lock (``check_same_thread=False``): SQLite serializes
writers anyway, and a single connection keeps ``":memory:"`` databases (embedded use) coherent across
threads. File databases use WAL so that a reader (e.g. ``sqlite3`` on the side) never blocks the
service, and ``synchronous=NORMAL``: a committed transaction survives a killed process (only a power
loss may drop the last commits), which is the durability the service acknowledges.

The schema is versioned in ``meta``; a database written by a newer adwin is refused rather than
silently misread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

from adwin.controller.api import InvalidInput
from adwin.controller.json_guard import json_problem

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at REAL NOT NULL,
    spec TEXT NOT NULL,            -- RunIn as JSON (run_id filled in)
    policy_state TEXT NOT NULL,    -- WindowPolicy.state_dict() after the latest decision
    declined INTEGER NOT NULL DEFAULT 0,
    next_seq INTEGER NOT NULL DEFAULT 0,
    next_audit_id INTEGER NOT NULL DEFAULT 1,
    last_step INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS decisions (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    step INTEGER NOT NULL,
    window INTEGER NOT NULL,
    reason TEXT NOT NULL,
    audit_id INTEGER,
    cosines TEXT,                  -- {candidate: cosine} JSON or NULL
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS offers (
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    selection TEXT NOT NULL,
    rng_seed TEXT NOT NULL,        -- the seed material the selection used, for replay
    offered INTEGER NOT NULL,
    accepted TEXT NOT NULL,        -- probe ids JSON
    declined INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS probes (
    run_id TEXT NOT NULL,
    probe_id TEXT NOT NULL,
    seq INTEGER NOT NULL,          -- submission order
    prompt_id TEXT NOT NULL,
    state TEXT NOT NULL,           -- active | complete | batched | audited | dropped | expired
    tokens INTEGER NOT NULL,       -- prefix length at offer + tokens added by extensions
    tokens_added INTEGER NOT NULL DEFAULT 0,
    oldest_version INTEGER NOT NULL,
    newest_version INTEGER NOT NULL,
    submitted_step INTEGER NOT NULL,
    forced INTEGER NOT NULL DEFAULT 0,
    audit_id INTEGER,
    PRIMARY KEY (run_id, probe_id)
);
CREATE INDEX IF NOT EXISTS probes_by_state ON probes (run_id, state, seq);
CREATE TABLE IF NOT EXISTS audits (
    run_id TEXT NOT NULL,
    audit_id INTEGER NOT NULL,
    step INTEGER NOT NULL,
    probe_ids TEXT NOT NULL,
    state TEXT NOT NULL,           -- pending | decided
    kind TEXT,                     -- cosines | gram | sketch, fixed by the first submission
    ranks TEXT NOT NULL DEFAULT '[]',
    sketch_shape TEXT,
    cosines TEXT,
    macro_cosines TEXT,
    gram TEXT,
    stats TEXT NOT NULL DEFAULT '{}',
    decision TEXT,                 -- WindowOut JSON once decided
    created_at REAL NOT NULL,
    decided_at REAL,
    PRIMARY KEY (run_id, audit_id)
);
CREATE TABLE IF NOT EXISTS audit_parts (
    run_id TEXT NOT NULL,
    audit_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    macro_cosines TEXT,            -- small columns first: reading them skips the blob's overflow pages
    stats TEXT NOT NULL DEFAULT '{}',
    payload BLOB NOT NULL,         -- a pending rank sketch, raw float32 (empty when it lives in a file, see sketch_files.py)
    PRIMARY KEY (run_id, audit_id, rank)
);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    metrics TEXT NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE IF NOT EXISTS idempotency (
    scope TEXT NOT NULL,           -- run id, or '' for register_run
    key TEXT NOT NULL,
    op TEXT NOT NULL,
    response TEXT NOT NULL,
    PRIMARY KEY (scope, key)
);
"""


class SchemaVersionError(ValueError):
    """The database was written by a newer adwin. A ValueError so that the CLI prints one line and exits 2."""


class Store:
    """Thin SQLite wrapper. Not locked itself: the ``Controller`` serializes every call."""

    def __init__(self, path: str = ":memory:") -> None:
        self.path = path
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self._checkpointer: _Checkpointer | None = None
        if path != ":memory:":
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA busy_timeout=5000")
        self._migrate()
        if path != ":memory:":
            # Checkpoints copy WAL pages (megabytes per sketch audit) into the database file; inside a
            # committing request they cost tens of ms on the decision path. A side connection does them.
            self.conn.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = _Checkpointer(path)

    def _migrate(self) -> None:
        has_meta = self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        if has_meta:
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row["value"]) if row else 0
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"controller database {self.path!r} has schema version {version}, newer than this adwin "
                    f"supports ({SCHEMA_VERSION}); upgrade adwin or use another --db"
                )
        with self.transaction():
            # executescript() would COMMIT on its own; run statement by statement inside the transaction.
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self.conn.execute(stmt)
            self.conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(SCHEMA_VERSION),),
            )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: everything inside commits together or not at all."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        else:
            self.conn.execute("COMMIT")

    def execute(self, sql: str, params: tuple | list = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def one(self, sql: str, params: tuple | list = ()) -> sqlite3.Row | None:
        return self.conn.execute(sql, params).fetchone()

    def all(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]:
        return self.conn.execute(sql, params).fetchall()

    # --- idempotency -----------------------------------------------------------------------------

    def idem_get(self, scope: str, key: str) -> tuple[str, Any] | None:
        row = self.one("SELECT op, response FROM idempotency WHERE scope=? AND key=?", (scope, key))
        return None if row is None else (row["op"], json.loads(row["response"]))

    def idem_put(self, scope: str, key: str, op: str, response: Any) -> None:
        self.execute(
            "INSERT INTO idempotency (scope, key, op, response) VALUES (?, ?, ?, ?)",
            (scope, key, op, dumps(response)),
        )

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self.conn.close()


class _Checkpointer:
    """Background WAL checkpoints (PASSIVE: never blocks the writer) on a connection of its own."""

    def __init__(self, path: str, interval_s: float = 0.5) -> None:
        self._stop = threading.Event()
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="adwin-sqlite-checkpoint", daemon=True)
        self._thread.start()

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error as e:  # e.g. the database is being closed; the next round retries
                logger.debug("controller store: checkpoint skipped (%s)", e)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._conn.close()


def dumps(obj: Any) -> str:
    """Strict JSON: a value that could not be read back (NaN/Inf, lone surrogate, deep nesting) is refused
    inside the write's transaction, so it rolls back instead of committing a row every later read fails on."""
    bad = json_problem(obj, "value")
    if bad:
        raise InvalidInput(f"cannot store {bad}")
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
