"""The schema: each entry migrates the store from version i to i+1 (``PRAGMA user_version``).

What each table holds is said where it is created below; ``Store.tables()`` lists them from the
database itself. A test upgrades a store holding data from the first version to the last.
"""

from __future__ import annotations

# Each entry migrates from version i to i+1. Append only; never edit a released migration.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        id            TEXT PRIMARY KEY,
        source        TEXT NOT NULL,          -- header | prompt_cache_key | x-session-id | runtime | prefix | new
        session_key   TEXT,                   -- OpenClaw's sessionKey (agent:main:main) when known
        agent         TEXT,
        compaction    INTEGER,                -- last seen :<compactionCount>
        first_seen    REAL NOT NULL,
        last_seen     REAL NOT NULL,
        finalized_at  REAL                    -- set when idle longer than sessions.idle_timeout_s
    );
    CREATE TABLE turns (
        id                    INTEGER PRIMARY KEY AUTOINCREMENT,
        request_id            TEXT UNIQUE NOT NULL,
        session_id            TEXT REFERENCES sessions(id) ON DELETE CASCADE,
        turn_index            INTEGER,        -- order within the session
        created_at            REAL NOT NULL,
        path                  TEXT NOT NULL,
        kind                  TEXT NOT NULL,  -- main | side | retry
        side_kind             TEXT,           -- compaction | heartbeat | memory_flush | title | recall | probe | ...
        status                TEXT NOT NULL,  -- ok | error | aborted
        http_status           INTEGER,
        error                 TEXT,
        compaction            INTEGER,
        model                 TEXT,
        stream                INTEGER NOT NULL DEFAULT 0,
        request_messages      TEXT,           -- JSON, exactly as sent (incl. transient context)
        request_tools         TEXT,           -- JSON
        request_params        TEXT,           -- JSON: sampling params and other body fields
        body_hash             TEXT,           -- for retry detection
        response_text         TEXT,
        response_reasoning    TEXT,
        response_tool_calls   TEXT,           -- JSON, reassembled from deltas
        finish_reason         TEXT,
        usage                 TEXT,           -- JSON
        prompt_token_ids      TEXT,           -- JSON list[int], from the engine
        completion_token_ids  TEXT,           -- JSON list[int], what was sampled
        completion_logprobs   TEXT,           -- JSON list[float], behaviour log-probs
        weight_version        INTEGER,        -- version at the first token
        weight_versions       TEXT,           -- JSON list of versions seen during generation
        ttft_ms               REAL,
        total_ms              REAL,
        next_state            TEXT,           -- JSON list of messages after this turn
        next_state_role       TEXT,           -- user | tool
        next_turn_id          INTEGER,
        trainable             INTEGER NOT NULL DEFAULT 0,
        reason                TEXT            -- why (not) trainable
    );
    CREATE INDEX turns_session ON turns(session_id, turn_index);
    CREATE INDEX turns_trainable ON turns(trainable, kind);
    CREATE TABLE judgments (
        turn_id     INTEGER PRIMARY KEY REFERENCES turns(id) ON DELETE CASCADE,
        score       INTEGER NOT NULL,        -- +1 / 0 / -1
        hint        TEXT,
        voter       TEXT NOT NULL,
        created_at  REAL NOT NULL
    );
    CREATE TABLE votes (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        turn_id     INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
        idx         INTEGER NOT NULL,
        voter       TEXT NOT NULL,
        raw         TEXT,
        score       INTEGER,                 -- NULL: failed vote
        hint        TEXT,
        error       TEXT,
        created_at  REAL NOT NULL,
        UNIQUE(turn_id, idx)
    );
    CREATE TABLE train_steps (
        id              INTEGER PRIMARY KEY AUTOINCREMENT,
        created_at      REAL NOT NULL,
        method          TEXT NOT NULL,
        base_version    INTEGER,
        new_version     INTEGER,             -- NULL if not published
        status          TEXT NOT NULL,       -- published | gate_failed | error
        metrics         TEXT                 -- JSON: loss, adv, clip frac, kl, grad norm, tok/s, skipped...
    );
    CREATE TABLE trained_samples (
        turn_id   INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
        step_id   INTEGER NOT NULL REFERENCES train_steps(id) ON DELETE CASCADE,
        PRIMARY KEY (turn_id, step_id)
    );
    CREATE TABLE checkpoints (
        version       INTEGER PRIMARY KEY,
        path          TEXT NOT NULL,
        kind          TEXT NOT NULL,         -- full | lora
        created_at    REAL NOT NULL,
        step_id       INTEGER,
        status        TEXT NOT NULL,         -- published | refused | deleted
        gate          TEXT                   -- JSON gate report
    );
    CREATE TABLE events (
        id     INTEGER PRIMARY KEY AUTOINCREMENT,
        ts     REAL NOT NULL,
        kind   TEXT NOT NULL,                -- gate_failed | rollback | reload | trainer_error | ...
        data   TEXT
    );
    """,
    # v2 (trainer): turns the trainer looked at and will never train on, with the reason, so each is
    # counted once in the skipped-by-reason metrics and not re-examined on every poll.
    """
    CREATE TABLE skipped_samples (
        turn_id     INTEGER PRIMARY KEY REFERENCES turns(id) ON DELETE CASCADE,
        reason      TEXT NOT NULL,           -- stale | score_0 | no_hint | truncated | degenerate | empty | missing_token_ids | too_long
        created_at  REAL NOT NULL
    );
    """,
    # v3 (proxy): turns the recorder could not store (a field of a type no column takes, a body
    # nested too deep...), kept alone with the reason instead of blocking the turns behind them.
    """
    CREATE TABLE quarantine (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        request_id  TEXT,
        created_at  REAL NOT NULL,
        reason      TEXT NOT NULL,
        record      TEXT                     -- the record as JSON (redacted), or the raw turn as text
    );
    """,
    # v4 (trainer): which loss terms each trained turn got (rl | rl_opd | opd), so a run can count
    # its distillation-only samples and keep their scores out of the RL baseline.
    """
    ALTER TABLE trained_samples ADD COLUMN kind TEXT;
    """,
    # v5 (store): ``reason`` holds the turn's state (clawproxy/store/lifecycle.py), and a turn is
    # trainable exactly in ``ok``. A cut-off answer that got its next state kept ``truncated``.
    """
    UPDATE turns SET reason = 'ok' WHERE trainable = 1 AND reason IS NOT 'ok';
    """,
    # v6 (users): many people on one server, each with their own adapter (clawproxy/users.py).
    # ``user`` NULL everywhere is the one user of a proxy with no users; a checkpoint with user NULL
    # is the shared adapter (the only one when there are no users).
    """
    CREATE TABLE users (
        name        TEXT PRIMARY KEY,
        key_hash    TEXT UNIQUE,             -- HMAC-SHA256(data dir secret, API key) in hex, never the key
        shared      INTEGER NOT NULL DEFAULT 0,  -- 1: their samples also train the shared adapter
        created_at  REAL NOT NULL
    );
    ALTER TABLE sessions ADD COLUMN user TEXT;
    ALTER TABLE turns ADD COLUMN user TEXT;
    ALTER TABLE train_steps ADD COLUMN user TEXT;   -- whose adapter the step trained (NULL: shared)
    ALTER TABLE checkpoints ADD COLUMN user TEXT;   -- whose adapter this is (NULL: shared)
    CREATE INDEX turns_user ON turns(user, trainable, kind);
    """,
    # v7 (judge): a verdict keeps its majority and confidence beside the score, so an abstention
    # (majority +1/-1, too unsure, score 0) is told from a neutral verdict. ``reactions`` is each
    # user's memory: their own words about the answers, one row per judged turn, deleted with it.
    """
    ALTER TABLE judgments ADD COLUMN majority INTEGER;   -- the votes' majority before the threshold
    ALTER TABLE judgments ADD COLUMN confidence REAL;    -- the votes' mean probability of it
    CREATE TABLE reactions (
        turn_id     INTEGER PRIMARY KEY REFERENCES turns(id) ON DELETE CASCADE,
        user        TEXT,                    -- whose (NULL: the one user of a proxy with no users)
        score       INTEGER NOT NULL,        -- the judgment: +1 praised, -1 complained about
        text        TEXT NOT NULL,           -- the user's reaction, as recorded (redacted)
        created_at  REAL NOT NULL
    );
    CREATE INDEX reactions_user ON reactions(user, turn_id);
    """,
    # v8 (learning by trying): each user's candidate instructions with their evidence, and which
    # instruction a turn was served under (the client never sees it; the trainer must know it).
    """
    CREATE TABLE preferences (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        user          TEXT,                  -- whose (NULL: the one user of a proxy with no users)
        text          TEXT NOT NULL,         -- the instruction, as served
        source        TEXT NOT NULL,         -- bank | said (the user's own words) | manual
        status        TEXT NOT NULL,         -- candidate | active | demoted | removed
        prior         REAL NOT NULL DEFAULT 0,   -- the shortlist's similarity to the user's reactions
        shortlisted   INTEGER NOT NULL DEFAULT 0, -- 1: the bandit may try it now
        tries         INTEGER NOT NULL DEFAULT 0, -- replies served under it and judged
        good          INTEGER NOT NULL DEFAULT 0, -- of those, judged +1
        bad           INTEGER NOT NULL DEFAULT 0, -- of those, judged -1
        leaned_good   INTEGER NOT NULL DEFAULT 0, -- of those, abstained (0) with a +1 majority
        leaned_bad    INTEGER NOT NULL DEFAULT 0, -- of those, abstained (0) with a -1 majority
        absorbed      INTEGER NOT NULL DEFAULT 0, -- 1: the adapter follows it without the prompt
        gap           REAL,                  -- the student's last gap to the instructed teacher (nats/token)
        created_at    REAL NOT NULL,
        updated_at    REAL NOT NULL,
        activated_at  REAL,
        UNIQUE(user, text)
    );
    CREATE INDEX preferences_user ON preferences(user, status);
    ALTER TABLE turns ADD COLUMN instruction TEXT;          -- what was added to the upstream's prompt
    ALTER TABLE turns ADD COLUMN instruction_id INTEGER;    -- the candidate tried (role try)
    ALTER TABLE turns ADD COLUMN applied_ids TEXT;          -- JSON list: the active preferences applied
    ALTER TABLE turns ADD COLUMN instruction_role TEXT;     -- try | apply
    ALTER TABLE users ADD COLUMN trying INTEGER NOT NULL DEFAULT 1;  -- 0: never tried (`users trying NAME off`)
    """,
]
